//! What the stdio client may have in flight. A client that sends a second request with
//! the id of one still in flight would make rmcp drop the first (its answer never comes):
//! `UniqueIds` refuses the second at once with a JSON-RPC error naming the id, and the
//! first goes on. A client with `max` requests in flight gets an error for the next one
//! at once, not a queue that grows with its input. (The HTTP front does the same per
//! session, in `http::limit`.)

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use rmcp::ErrorData;
use rmcp::RoleServer;
use rmcp::model::ErrorCode;
use rmcp::model::{ClientJsonRpcMessage, RequestId, ServerJsonRpcMessage};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;

/// The JSON-RPC error code for "too many requests in flight" (server-defined range).
pub const BUSY: i32 = -32000;

/// Wraps the client's transport; see the module's documentation.
pub struct UniqueIds<T> {
    inner: T,
    /// Ids of the client's requests not answered yet.
    in_flight: Arc<Mutex<HashSet<RequestId>>>,
    max: usize,
}

impl<T> UniqueIds<T> {
    /// `inner`, allowing at most `max` requests in flight.
    pub fn new(inner: T, max: usize) -> Self {
        Self { inner, in_flight: Arc::default(), max: max.max(1) }
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
            let error = {
                let mut in_flight = self.in_flight.lock().expect("not poisoned");
                if in_flight.contains(&request.id) {
                    ErrorData::invalid_request(
                        format!("a request with id {} is already in flight; give each request its own id", request.id),
                        None,
                    )
                } else if in_flight.len() >= self.max {
                    ErrorData::new(
                        ErrorCode(BUSY),
                        format!(
                            "{} requests are in flight, the most this gateway takes from one client (rebound.http.max_concurrent_per_client); wait for one to finish",
                            in_flight.len()
                        ),
                        None,
                    )
                } else {
                    in_flight.insert(request.id.clone());
                    return Some(message);
                }
            };
            // Sent on its own task: `receive` may be dropped at any await, and the refusal
            // must not be lost with it.
            tokio::spawn(self.inner.send(ServerJsonRpcMessage::error(error, Some(request.id.clone()))));
        }
    }

    fn close(&mut self) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}
