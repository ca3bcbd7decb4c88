//! The stdio client's side of the wire: its lines in, the gateway's messages out.
//!
//! - **Framing with a bound.** A line longer than `max_line` bytes is never buffered: it
//!   is skipped as it is read and answered with -32600.
//! - **The protocol's answer to what cannot be read** ([`Unreadable`]): -32700 for a line
//!   that is not JSON, -32600 with the request's id for JSON that is not a valid message.
//!   (rmcp's own transport ignores the first and answers the second without the id.)
//! - **Ids unique in flight.** A second request with the id of one still in flight would
//!   make rmcp drop the first (its answer would never come): it is refused at once with a
//!   JSON-RPC error naming the id, and the first goes on.
//! - **A cap on requests in flight.** Past `max` requests, the next gets an error at once,
//!   not a queue that grows with the client's input. (The HTTP front does the same per
//!   session, in `http::limits`.)
//!
//! Refusals are written on tasks of their own, at most
//! [`REFUSALS_PENDING`](crate::transport::lines::REFUSALS_PENDING) at once: a
//! client that floods the gateway and never reads its output cannot make them pile up.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rmcp::ErrorData;
use rmcp::RoleServer;
use rmcp::model::{
    ClientJsonRpcMessage, ClientNotification, ClientRequest, CustomResult, ErrorCode, GetExtensions, JsonRpcMessage,
    ProtocolVersion, RequestId, ServerJsonRpcMessage, ServerResult,
};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use tokio::io::{AsyncRead, AsyncWrite, BufReader};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::lasting::Locked;
use crate::transport::id_scan::Scanned;
use crate::transport::lines::{Line, Lines, Out, Past, Queued, Refusals, Unsent};
use crate::transport::malformed::{INVALID_REQUEST, Unreadable};
use crate::transport::tasks::ClientTasks;
use crate::transport::typed;

/// The JSON-RPC error code for "too many requests in flight" (server-defined range).
pub const BUSY: i32 = -32000;

/// How long the last refusals get to be written once the client's input has ended.
const FLUSH: Duration = Duration::from_millis(200);

/// The longest message a stdio client may send: 16 MiB, as rmcp's own stdio transport
/// (and its bound on an SSE event).
pub const MAX_LINE: usize = 16 << 20;

/// The most a stdio client's message may weigh once read (`crate::weight`), as much as
/// one HTTP client's requests in flight together: 16 MiB of `0,0,0…` would take 1 GiB.
pub const MAX_WEIGHT: usize = 256 << 20;

/// Past this many bytes of notifications waiting to be written to the client, more are
/// dropped: the client has stopped reading its output.
pub const NOTIFICATIONS_QUEUED: usize = 8 << 20;

/// The client on the gateway's stdin and stdout, as an rmcp transport.
pub struct StdioClient<R, W> {
    lines: Lines<BufReader<R>>,
    out: Out<W>,
    refusals: Refusals<W>,
    admission: Admission,
    /// Cancelled when the client's input ends.
    ended: CancellationToken,
    /// Whether the gateway has sent the client a request yet: until then, no answer of
    /// the client's answers anything (and rmcp, before `initialize`, would take one for
    /// a broken handshake and end the session).
    asked: bool,
    /// When the input ended, the last refusals have until then to be written. (rmcp
    /// starts a new `receive` whenever it sends something: the wait must not restart.)
    flush_until: Option<tokio::time::Instant>,
    /// Notifications on their way to the client.
    notifications: Queued,
    /// Notifications dropped because the client was not reading.
    unread: Unsent,
}

impl<R: AsyncRead + Unpin, W: AsyncWrite + Unpin + Send + 'static> StdioClient<R, W> {
    /// Reads lines of at most `max_line` bytes and [`MAX_WEIGHT`] once read, and admits
    /// at most `max` requests in flight.
    pub fn new(read: R, write: W, max_line: usize, max: usize) -> Self {
        let out = Out::new(write);
        Self {
            // Large reads: where stdin is not a pipe (a socket under Node clients) each
            // read is a hop to tokio's blocking pool.
            lines: Lines::new(BufReader::with_capacity(64 << 10, read), max_line, MAX_WEIGHT),
            refusals: Refusals::new(out.clone()),
            out,
            admission: Admission::new(max),
            ended: CancellationToken::new(),
            asked: false,
            flush_until: None,
            notifications: Queued::default(),
            unread: Unsent::new("notifications"),
        }
    }

    /// Cancelled the moment the client's input ends, before rmcp has finished with the
    /// requests in flight: the gateway can start stopping its servers at once.
    pub fn ended(&self) -> CancellationToken {
        self.ended.clone()
    }

    /// Ends once none of the client's requests is in flight (read, not yet answered or
    /// cancelled), as the transport goes on counting once it is rmcp's.
    pub fn all_answered(&self) -> impl Future<Output = ()> + Send + 'static {
        let admission = self.admission.clone();
        async move {
            loop {
                let idle = admission.idle.notified();
                if admission.in_flight.locked().is_empty() {
                    return;
                }
                idle.await;
            }
        }
    }

    /// A message of the client's too long to read, named by its id, read as the line went
    /// by: a request is refused (the client waits on it); an answer to a request of the
    /// gateway's (a server's question relayed) fails that request now, for the server that
    /// asked, and is never answered back (its id is the gateway's, not one of the
    /// client's requests); one before the gateway asked anything is skipped.
    fn too_long(&mut self, scanned: Scanned, past: Past) -> Option<ClientJsonRpcMessage> {
        if let Some(id) = scanned.answers() {
            let id = id.filter(|_| self.asked)?;
            let why = format!("the client's answer is {past}, past what one message over stdio may be");
            return Some(JsonRpcMessage::error(ErrorData::invalid_request(why, None), Some(id)));
        }
        let why = format!("Invalid Request: the message is {past}, past what one message over stdio may be");
        let id = scanned.id.unwrap_or(serde_json::Value::Null);
        self.refusals.send(Unreadable::answered(INVALID_REQUEST, why, id).to_json());
        None
    }

    /// The message on the line just read; `None` after answering it (or for an empty line).
    /// An `initialize` carries the requests the client runs as tasks in its extensions.
    fn decode(&mut self) -> Option<ClientJsonRpcMessage> {
        match self.lines.message(typed::client_request) {
            Ok(Some(JsonRpcMessage::Request(mut request)))
                if matches!(request.request, ClientRequest::InitializeRequest(_)) =>
            {
                if let Some(tasks) = ClientTasks::read_initialize(self.lines.line()) {
                    request.request.extensions_mut().insert(tasks);
                }
                Some(JsonRpcMessage::Request(request))
            }
            Ok(message) => message,
            Err(unreadable) => {
                tracing::debug!(code = unreadable.code, "unreadable message from the client: {}", unreadable.message);
                if unreadable.wants_answer {
                    self.refusals.send(unreadable.to_json());
                }
                None
            }
        }
    }
}

impl<R, W> Transport<RoleServer> for StdioClient<R, W>
where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send + 'static,
{
    type Error = std::io::Error;

    fn name() -> std::borrow::Cow<'static, str> {
        "client".into()
    }

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send + 'static {
        let answered = match &item {
            ServerJsonRpcMessage::Response(r) => Some(r.id.clone()),
            ServerJsonRpcMessage::Error(e) => e.id.clone(),
            ServerJsonRpcMessage::Request(_) => {
                self.asked = true;
                None
            }
            _ => None,
        };
        // A notification waits for nobody: with the client not reading its output, it is
        // dropped rather than held (with each before it) for as long as the client stops.
        let notification = matches!(item, ServerJsonRpcMessage::Notification(_));
        if notification && self.notifications.bytes() > NOTIFICATIONS_QUEUED {
            self.unread.one();
            return futures::future::Either::Left(std::future::ready(Err(std::io::Error::other(
                "the client is not reading its output; the notification was dropped",
            ))));
        }
        let answered = answered.and_then(|id| Some((self.admission.holder(&id)?, id)));
        let encoded = serde_json::to_vec(&with_tasks(item)).map_err(std::io::Error::from);
        let (out, admission) = (self.out.clone(), self.admission.clone());
        let held = encoded.as_ref().ok().filter(|_| notification).map(|line| self.notifications.hold(line.len()));
        futures::future::Either::Right(async move {
            let _held = held;
            let written = match encoded {
                Ok(line) => out.write(line).await,
                Err(e) => Err(e),
            };
            // Only once written: a client that does not read its answers keeps its
            // requests counted, so the answers waiting for it are bounded by the cap.
            if let Some((holder, id)) = answered {
                admission.done(&id, holder);
            }
            written
        })
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        loop {
            // Everything after this await is synchronous: a `receive` dropped by rmcp's
            // `select!` loses no line (`Lines` keeps a partial one).
            match self.lines.next().await {
                Ok(Line::Complete) => {}
                Ok(Line::TooLong(scanned, past)) => match self.too_long(scanned, past) {
                    Some(failed) => return Some(failed),
                    None => continue,
                },
                Ok(Line::End) | Err(_) => {
                    // The refusals of the last lines go out before the gateway stops.
                    let until = *self.flush_until.get_or_insert_with(|| tokio::time::Instant::now() + FLUSH);
                    let _ = tokio::time::timeout_at(until, self.refusals.all_sent()).await;
                    self.ended.cancel();
                    return None;
                }
            }
            let message = self.decode();
            self.lines.clear();
            let Some(message) = message else { continue };
            match self.admission.admit(&message) {
                Ok(()) => return Some(message),
                Err((error, id)) => self.refusals.send(
                    serde_json::to_value(ServerJsonRpcMessage::error(error, Some(id))).expect("an error serialises"),
                ),
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.out.close().await
    }
}

/// The ids of the client's requests not answered (or cancelled) yet, and their cap.
#[derive(Clone)]
struct Admission {
    /// Each id with the number of the request that holds it: an answer frees only the
    /// request it answers, not a later one that reused a cancelled request's id.
    in_flight: Arc<std::sync::Mutex<HashMap<RequestId, u64>>>,
    /// Told whenever the last request in flight is answered or cancelled.
    idle: Arc<Notify>,
    admitted: Arc<AtomicU64>,
    max: usize,
}

impl Admission {
    fn new(max: usize) -> Self {
        Self { in_flight: Arc::default(), idle: Arc::default(), admitted: Arc::default(), max: max.max(1) }
    }

    /// Lets `message` through, or the error to refuse it with and its id.
    fn admit(&self, message: &ClientJsonRpcMessage) -> Result<(), (ErrorData, RequestId)> {
        // rmcp answers nothing for a request the client cancelled: its id is free.
        if let ClientJsonRpcMessage::Notification(n) = message
            && let ClientNotification::CancelledNotification(c) = &n.notification
            && let Some(id) = &c.params.request_id
        {
            self.free(&mut self.in_flight.locked(), id);
        }
        let ClientJsonRpcMessage::Request(request) = message else { return Ok(()) };
        let mut in_flight = self.in_flight.locked();
        let error = if in_flight.contains_key(&request.id) {
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
            in_flight.insert(request.id.clone(), self.admitted.fetch_add(1, Ordering::Relaxed));
            return Ok(());
        };
        Err((error, request.id.clone()))
    }

    /// The request now holding `id`, to free once its answer is written.
    fn holder(&self, id: &RequestId) -> Option<u64> {
        self.in_flight.locked().get(id).copied()
    }

    /// Frees `id` if request `holder` still holds it.
    fn done(&self, id: &RequestId, holder: u64) {
        let mut in_flight = self.in_flight.locked();
        if in_flight.get(id) == Some(&holder) {
            self.free(&mut in_flight, id);
        }
    }

    fn free(&self, in_flight: &mut HashMap<RequestId, u64>, id: &RequestId) {
        if in_flight.remove(id).is_some() && in_flight.is_empty() {
            self.idle.notify_waiters();
        }
    }
}

/// The gateway's answer to `initialize` for a client on 2025-11-25 says it takes tasks
/// (`gateway::tasks`), which rmcp's `ServerCapabilities` cannot say; anything else is
/// sent as it is.
fn with_tasks(mut item: ServerJsonRpcMessage) -> ServerJsonRpcMessage {
    if let ServerJsonRpcMessage::Response(response) = &mut item
        && let ServerResult::InitializeResult(init) = &response.result
        && init.protocol_version == ProtocolVersion::V_2025_11_25
        && let Ok(mut value) = serde_json::to_value(init)
    {
        value["capabilities"]["tasks"] = super::tasks::capability();
        response.result = ServerResult::CustomResult(CustomResult(value));
    }
    item
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
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
                let mut transport = StdioClient::new(read, write, 1 << 16, 1000);
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
                // Refusals go back as JSON-RPC errors, one JSON line each.
                transport.close().await.unwrap();
                let mut back = tokio::io::BufReader::new(their_read).lines();
                while let Ok(Some(line)) = back.next_line().await {
                    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
                    assert!(v["error"]["code"].is_i64(), "{line}");
                }
            });
        }
    }

    /// A client that stops reading its output has notifications dropped once a bound of
    /// them waits, not held for as long as it does not read; answers still wait to be
    /// written, and notifications flow again once it reads.
    #[tokio::test(start_paused = true)]
    async fn notifications_to_a_client_not_reading_are_dropped_past_a_bound() {
        use rmcp::model::{CustomNotification, ServerNotification};
        let (ours, theirs) = tokio::io::duplex(1 << 10);
        let (read, write) = tokio::io::split(ours);
        let mut transport = StdioClient::new(read, write, MAX_LINE, 10);
        let note = || {
            let data = serde_json::json!({"text": "n".repeat(256 << 10)});
            let note = CustomNotification::new("notifications/message", Some(data));
            ServerJsonRpcMessage::notification(ServerNotification::CustomNotification(note))
        };
        let mut waiting = Vec::new();
        while transport.notifications.bytes() <= NOTIFICATIONS_QUEUED {
            waiting.push(tokio::spawn(transport.send(note())));
            tokio::task::yield_now().await;
        }
        assert!(waiting.len() <= 40, "{} notifications of 256 KiB held", waiting.len());
        // (On a paused clock: were it held, the wait would end at once, and fail.)
        let refused = tokio::time::timeout(Duration::from_secs(10), transport.send(note()));
        let refused = refused.await.expect("not held").expect_err("dropped");
        assert!(refused.to_string().contains("not reading"), "{refused}");
        let answer = ServerJsonRpcMessage::response(rmcp::model::ServerResult::empty(()), RequestId::Number(1));
        let answered = tokio::spawn(transport.send(answer));
        tokio::task::yield_now().await;
        assert!(!answered.is_finished(), "an answer waits for the client instead");
        // The client reads again: everything held is written, and notifications flow.
        let (their_read, _their_write) = tokio::io::split(theirs);
        let reading = tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(their_read).lines();
            while lines.next_line().await.unwrap().is_some() {}
        });
        for sent in waiting {
            sent.await.unwrap().unwrap();
        }
        answered.await.unwrap().unwrap();
        assert_eq!(transport.notifications.bytes(), 0);
        transport.send(note()).await.unwrap();
        reading.abort();
    }

    /// A client on one end of a pipe, the transport on the other.
    fn pair(
        max_line: usize,
        max: usize,
    ) -> (StdioClient<impl AsyncRead + Unpin + Send, impl AsyncWrite + Unpin + Send + 'static>, tokio::io::DuplexStream)
    {
        let (ours, theirs) = tokio::io::duplex(1 << 20);
        let (read, write) = tokio::io::split(ours);
        (StdioClient::new(read, write, max_line, max), theirs)
    }

    async fn answer(
        back: &mut tokio::io::Lines<tokio::io::BufReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>>,
    ) -> serde_json::Value {
        let line =
            tokio::time::timeout(std::time::Duration::from_secs(5), back.next_line()).await.unwrap().unwrap().unwrap();
        serde_json::from_str(&line).unwrap()
    }

    /// The client's answer to a server's question, too long to read: the question fails
    /// now, for the server that asked, and nothing goes back to the client, whose own
    /// requests may carry the same id.
    #[tokio::test]
    async fn an_answer_too_long_fails_the_question_and_is_not_answered_back() {
        let (mut transport, theirs) = pair(100, 10);
        let (their_read, mut their_write) = tokio::io::split(theirs);
        let mut back = tokio::io::BufReader::new(their_read).lines();
        let answer = format!(r#"{{"jsonrpc":"2.0","id":3,"result":{{"pad":"{}"}}}}"#, "x".repeat(500));
        // Before the gateway asked anything, it answers nothing: skipped, and the
        // handshake that follows is read as usual.
        their_write.write_all(format!("{answer}\n").as_bytes()).await.unwrap();
        their_write.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n").await.unwrap();
        let Some(ClientJsonRpcMessage::Request(ping)) = transport.receive().await else { panic!("no request") };
        assert_eq!(ping.id, RequestId::Number(1));
        let question = ServerJsonRpcMessage::request(
            rmcp::model::ServerRequest::PingRequest(Default::default()),
            RequestId::Number(3),
        );
        transport.send(question).await.unwrap();
        back.next_line().await.unwrap().expect("the question");
        their_write.write_all(format!("{answer}\n").as_bytes()).await.unwrap();
        let Some(ClientJsonRpcMessage::Error(error)) = transport.receive().await else { panic!("no error") };
        assert_eq!(error.id, Some(RequestId::Number(3)));
        assert!(error.error.message.contains("answer is longer than 100 bytes"), "{:?}", error.error);
        transport.close().await.unwrap();
        assert!(back.next_line().await.unwrap().is_none(), "the client was answered");
    }

    #[tokio::test]
    async fn what_cannot_be_read_gets_the_protocols_error_and_the_next_line_still_counts() {
        let (mut transport, theirs) = pair(100, 10);
        let (their_read, mut their_write) = tokio::io::split(theirs);
        let mut back = tokio::io::BufReader::new(their_read).lines();
        let input = [
            "not json".to_owned(),
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":"x"}"#.to_owned(),
            r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":7}"#.to_owned(),
            format!(r#"{{"jsonrpc":"2.0","id":8,"method":"ping","params":{{"pad":"{}"}}}}"#, "x".repeat(500)),
            "\r".to_owned(),
            "\u{feff}{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"ping\"}\r".to_owned(),
        ];
        for line in input {
            their_write.write_all(format!("{line}\n").as_bytes()).await.unwrap();
        }
        let Some(ClientJsonRpcMessage::Request(ping)) = transport.receive().await else { panic!("the ping was lost") };
        assert_eq!(ping.id, RequestId::Number(9));
        let mut answers: Vec<_> = Vec::new();
        for _ in 0..3 {
            let a = answer(&mut back).await;
            answers.push((a["id"].clone(), a["error"]["code"].as_i64().unwrap()));
        }
        answers.sort_by_key(|(_, code)| *code);
        // The notification got nothing; the long line got -32600 with its id, found as the
        // line went by unread (a client waits on it).
        assert_eq!(
            answers,
            [(serde_json::Value::Null, -32700), (serde_json::json!(7), -32600), (serde_json::json!(8), -32600)]
        );
    }

    #[tokio::test]
    async fn a_duplicate_id_and_a_request_past_the_cap_are_refused_until_an_answer_frees_them() {
        let (mut transport, theirs) = pair(1 << 10, 2);
        let (their_read, mut their_write) = tokio::io::split(theirs);
        let mut back = tokio::io::BufReader::new(their_read).lines();
        for id in [1, 1, 2, 3] {
            their_write
                .write_all(format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"ping\"}}\n").as_bytes())
                .await
                .unwrap();
        }
        their_write.write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n").await.unwrap();
        for id in [1, 2] {
            let Some(ClientJsonRpcMessage::Request(r)) = transport.receive().await else { panic!() };
            assert_eq!(r.id, RequestId::Number(id));
        }
        assert!(matches!(transport.receive().await, Some(ClientJsonRpcMessage::Notification(_))));
        let mut refused = [answer(&mut back).await, answer(&mut back).await];
        refused.sort_by_key(|a| a["id"].as_u64());
        assert_eq!((refused[0]["id"].as_u64(), refused[0]["error"]["code"].as_i64()), (Some(1), Some(-32600)));
        assert_eq!((refused[1]["id"].as_u64(), refused[1]["error"]["code"].as_i64()), (Some(3), Some(i64::from(BUSY))));
        // Answering 1 makes room for 3.
        let all_answered = tokio::spawn(transport.all_answered());
        transport
            .send(ServerJsonRpcMessage::response(rmcp::model::ServerResult::empty(()), RequestId::Number(1)))
            .await
            .unwrap();
        assert_eq!(answer(&mut back).await["id"], 1);
        their_write.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"ping\"}\n").await.unwrap();
        let Some(ClientJsonRpcMessage::Request(r)) = transport.receive().await else { panic!() };
        assert_eq!(r.id, RequestId::Number(3));
        // Until the last of them is answered (2) or cancelled (3), some are in flight.
        their_write
            .write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/cancelled\",\"params\":{\"requestId\":3}}\n")
            .await
            .unwrap();
        assert!(matches!(transport.receive().await, Some(ClientJsonRpcMessage::Notification(_))));
        tokio::task::yield_now().await;
        assert!(!all_answered.is_finished(), "2 is in flight");
        transport
            .send(ServerJsonRpcMessage::response(rmcp::model::ServerResult::empty(()), RequestId::Number(2)))
            .await
            .unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(5), all_answered).await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn a_line_read_in_pieces_survives_a_dropped_receive() {
        let (mut transport, mut theirs) = pair(1 << 10, 2);
        theirs.write_all(br#"{"jsonrpc":"2.0","id":1,"#).await.unwrap();
        // rmcp's loop drops `receive` whenever another branch is ready first.
        assert!(tokio::time::timeout(std::time::Duration::from_millis(50), transport.receive()).await.is_err());
        theirs.write_all(b"\"method\":\"ping\"}\n").await.unwrap();
        let Some(ClientJsonRpcMessage::Request(r)) = transport.receive().await else { panic!("the line was lost") };
        assert_eq!(r.id, RequestId::Number(1));
        drop(theirs);
        assert!(transport.receive().await.is_none());
        assert!(transport.ended().is_cancelled());
    }
}
