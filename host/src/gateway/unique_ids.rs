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
use rmcp::model::{ClientJsonRpcMessage, ClientNotification, RequestId, ServerJsonRpcMessage};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;

/// The JSON-RPC error code for "too many requests in flight" (server-defined range).
pub const BUSY: i32 = -32000;

/// Wraps the client's transport; see the module's documentation.
pub struct UniqueIds<T> {
    inner: T,
    /// Ids of the client's requests not answered (or cancelled) yet.
    in_flight: Arc<Mutex<HashSet<RequestId>>>,
    max: usize,
    /// Cancelled when the client's input ends.
    ended: tokio_util::sync::CancellationToken,
}

impl<T> UniqueIds<T> {
    /// `inner`, allowing at most `max` requests in flight.
    pub fn new(inner: T, max: usize) -> Self {
        Self { inner, in_flight: Arc::default(), max: max.max(1), ended: Default::default() }
    }

    /// Cancelled the moment the client's input ends, before rmcp has finished with the
    /// requests in flight: the gateway can start stopping its servers at once.
    pub fn ended(&self) -> tokio_util::sync::CancellationToken {
        self.ended.clone()
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
            let Some(message) = self.inner.receive().await else {
                self.ended.cancel();
                return None;
            };
            // rmcp answers nothing for a request the client cancelled: its id is free.
            if let ClientJsonRpcMessage::Notification(n) = &message
                && let ClientNotification::CancelledNotification(c) = &n.notification
                && let Some(id) = &c.params.request_id
            {
                self.in_flight.lock().expect("not poisoned").remove(id);
            }
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use rmcp::transport::async_rw::AsyncRwTransport;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

    use super::*;

    /// Lines a hostile or broken client might send: bytes, JSON of every shape, and
    /// JSON-RPC messages with odd ids and methods.
    fn line() -> impl Strategy<Value = Vec<u8>> {
        let id = prop_oneof![
            Just(serde_json::json!(1)),
            Just(serde_json::json!("1")),
            Just(serde_json::json!(null)),
            Just(serde_json::json!(-1e308)),
            Just(serde_json::json!(u64::MAX)),
            Just(serde_json::json!([1])),
            "[a-z]{0,4}".prop_map(serde_json::Value::String),
        ];
        let method = prop_oneof![
            Just("tools/call"),
            Just("ping"),
            Just("initialize"),
            Just("notifications/cancelled"),
            Just(""),
            Just("x/y")
        ];
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..200).prop_map(|mut b| {
                b.retain(|c| *c != b'\n');
                b
            }),
            (id.clone(), method).prop_map(|(id, m)| {
                serde_json::json!({"jsonrpc": "2.0", "id": id, "method": m, "params": {}}).to_string().into_bytes()
            }),
            id.prop_map(|id| serde_json::json!({"jsonrpc": "2.0", "id": id, "result": {}}).to_string().into_bytes()),
            (1usize..2000).prop_map(|depth| "[".repeat(depth).into_bytes()),
            Just(b"[]".to_vec()),
            Just(b"42".to_vec()),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// Whatever a client sends, decoding never panics, every message that reaches the
        /// gateway is one rmcp parsed, and no request id is in flight twice.
        #[test]
        fn client_input_never_breaks_the_decoder(lines in proptest::collection::vec(line(), 1..40)) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let (ours, theirs) = tokio::io::duplex(1 << 20);
                let (read, write) = tokio::io::split(ours);
                let mut transport = UniqueIds::new(AsyncRwTransport::<RoleServer, _, _>::new_server(read, write), 1000);
                let (their_read, mut their_write) = tokio::io::split(theirs);
                for l in &lines {
                    their_write.write_all(l).await.unwrap();
                    their_write.write_all(b"\n").await.unwrap();
                }
                // After whatever came before, a good request still gets through.
                their_write.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":\"final\",\"method\":\"ping\"}\n").await.unwrap();
                their_write.shutdown().await.unwrap();
                let mut seen = std::collections::HashSet::new();
                while let Some(message) = transport.receive().await {
                    if let ClientJsonRpcMessage::Request(r) = message {
                        assert!(seen.insert(r.id.clone()), "{} delivered twice", r.id);
                    }
                }
                assert!(seen.contains(&RequestId::String("final".into())), "the decoder gave up early");
                // Refusals go back as JSON-RPC errors with their ids, one JSON line each.
                drop(transport);
                let mut back = tokio::io::BufReader::new(their_read).lines();
                while let Ok(Some(line)) = back.next_line().await {
                    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
                    assert!(v["error"]["code"].is_i64(), "{line}");
                }
            });
        }
    }
}
