//! A client that sends a second request with the id of one still in flight would make
//! rmcp drop the first (its answer never comes). Over stdio, `UniqueIds` refuses the
//! second at once with a JSON-RPC error naming the id; the first goes on. (The HTTP front
//! does the same per session, in `http::limit`.)

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use rmcp::ErrorData;
use rmcp::RoleServer;
use rmcp::model::{ClientJsonRpcMessage, RequestId, ServerJsonRpcMessage};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;

/// Wraps the client's transport; see the module's documentation.
pub struct UniqueIds<T> {
    inner: T,
    /// Ids of the client's requests not answered yet.
    in_flight: Arc<Mutex<HashSet<RequestId>>>,
}

impl<T> UniqueIds<T> {
    pub fn new(inner: T) -> Self {
        Self { inner, in_flight: Arc::default() }
    }
}

impl<T: Transport<RoleServer>> Transport<RoleServer> for UniqueIds<T> {
    type Error = T::Error;

    fn name() -> std::borrow::Cow<'static, str> {
        "client".into()
    }

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send + 'static {
        let answered = match &item {
            ServerJsonRpcMessage::Response(r) => Some(&r.id),
            ServerJsonRpcMessage::Error(e) => e.id.as_ref(),
            _ => None,
        };
        if let Some(id) = answered {
            self.in_flight.lock().expect("not poisoned").remove(id);
        }
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        loop {
            let message = self.inner.receive().await?;
            let ClientJsonRpcMessage::Request(request) = &message else { return Some(message) };
            if self.in_flight.lock().expect("not poisoned").insert(request.id.clone()) {
                return Some(message);
            }
            let error = ErrorData::invalid_request(
                format!("a request with id {} is already in flight; give each request its own id", request.id),
                None,
            );
            // Sent on its own task: `receive` may be dropped at any await, and the refusal
            // must not be lost with it.
            tokio::spawn(self.inner.send(ServerJsonRpcMessage::error(error, Some(request.id.clone()))));
        }
    }

    fn close(&mut self) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}
