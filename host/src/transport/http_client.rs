//! The client side of a `url` server: rmcp's streamable HTTP transport over reqwest, with
//! the server's answers also read as they came, where rmcp's types drop what they say, as
//! [`super::lines`] reads a stdio server's lines: the tasks capability in `initialize`'s
//! answer, each tool's task support in `tools/list`'s (MCP 2025-11-25, see
//! [`super::tasks`]), and the answer to a custom request (a task-augmented call,
//! `tasks/*`) as it is, not as rmcp's types would change it.
//!
//! Those requests are posted here ([`Tapped`]), so that their answer is read from the
//! JSON body or the SSE events that carry it before rmcp reads it; every other message
//! goes through rmcp's own reqwest client. The transport ([`super::upstream::InOrder`])
//! then puts what was read here in place of rmcp's reading of the same answer. Every SSE
//! event, whoever reads it, is weighed first ([`weighed`]): rmcp bounds its bytes alone.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::{Stream, StreamExt, TryStreamExt};
use reqwest::StatusCode;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderName, HeaderValue, RETRY_AFTER, WWW_AUTHENTICATE};
use rmcp::model::{
    ClientJsonRpcMessage, ClientNotification, ClientRequest, JsonRpcError, JsonRpcMessage, RequestId,
    ServerJsonRpcMessage,
};
use rmcp::transport::common::http_header::{EVENT_STREAM_MIME_TYPE, HEADER_SESSION_ID, JSON_MIME_TYPE};
use rmcp::transport::streamable_http_client::{
    AuthRequiredError, HttpStatusError, InsufficientScopeError, SseError, StreamableHttpClient, StreamableHttpError,
    StreamableHttpPostResponse,
};
use sse_stream::{Sse, SseStream};

use super::supervisor::{MAX_MESSAGE_BYTES, MAX_MESSAGE_WEIGHT};
use super::tasks::{ClientTasks, Dropped};
use super::typed::Awaited;
use crate::lasting::Locked;

/// The most answers awaited here (past it, rmcp's reading of a new one stands), and the
/// most read here and not yet taken by the transport (each is taken as soon as rmcp has
/// read the same message, so more means rmcp refused some; they are forgotten).
const MAX_READ: usize = 1024;

/// The most of an error's body read, for its JSON-RPC error.
const MAX_ERROR_BODY: usize = 64 << 10;

/// What one upstream session's answers said, shared by its HTTP client and its transport.
pub struct Tap {
    awaited: Mutex<Awaited>,
    dropped: Arc<Dropped>,
    /// Answers read here from SSE events, by id, until rmcp's reading of them passes
    /// the transport.
    read: Mutex<HashMap<RequestId, ServerJsonRpcMessage>>,
    /// What the server is told, in `initialize`, that its client runs as tasks; when
    /// anything, its requests to run one are read here, as they came (rmcp drops their
    /// `task`), from every stream they can come on.
    tasks: Option<ClientTasks>,
    /// Those requests, by id, until rmcp's reading of them passes the transport.
    asked: Mutex<HashMap<RequestId, ServerJsonRpcMessage>>,
}

impl Tap {
    pub fn new(dropped: Arc<Dropped>, tasks: Option<ClientTasks>) -> Arc<Self> {
        Arc::new(Self { awaited: Mutex::default(), dropped, read: Mutex::default(), tasks, asked: Mutex::default() })
    }

    /// Notes a message being sent: whether its answer is read here. A tool call's is not
    /// (rmcp reads it whole; nothing is dropped), nor is any other request's; past
    /// [`MAX_READ`] awaited, none is (rmcp's reading then stands).
    fn sent(&self, message: &ClientJsonRpcMessage) -> bool {
        let reads = matches!(message, JsonRpcMessage::Request(r) if matches!(r.request,
            ClientRequest::InitializeRequest(_) | ClientRequest::ListToolsRequest(_) | ClientRequest::CustomRequest(_)));
        if let JsonRpcMessage::Request(r) = message
            && matches!(r.request, ClientRequest::InitializeRequest(_))
        {
            // A session begun again (one expired) numbers its requests afresh: what was
            // read in the last one answers nothing in this one.
            self.read.locked().clear();
            self.asked.locked().clear();
        }
        let mut awaited = self.awaited.locked();
        let reads = reads && awaited.len() < MAX_READ;
        if reads {
            awaited.sent(message);
        }
        reads
    }

    /// The answer in one message from the server as it came (a JSON body, an SSE event's
    /// data), when it answers a request read here and rmcp's types would change it.
    fn answer(&self, raw: &[u8]) -> Option<ServerJsonRpcMessage> {
        let mut awaited = self.awaited.locked();
        if awaited.is_empty() && self.tasks.is_none() {
            return None;
        }
        awaited.answer(raw, &self.dropped)
    }

    /// An SSE event's data: an answer, or a request to run as a task, read here waits
    /// for rmcp's reading of it.
    fn saw(&self, raw: &[u8]) {
        let Some(message) = self.answer(raw) else { return };
        let (kept, id) = match &message {
            JsonRpcMessage::Response(response) => (&self.read, response.id.clone()),
            JsonRpcMessage::Request(request) => (&self.asked, request.id.clone()),
            _ => return,
        };
        let mut kept = kept.locked();
        if kept.len() >= MAX_READ {
            kept.clear(); // messages rmcp never passed on
        }
        kept.insert(id, message);
    }

    /// Request `id` will have no answer read here: it failed, was given up, or was answered.
    fn forget(&self, id: &RequestId) {
        self.awaited.locked().forget(id);
    }

    /// A message rmcp is about to send, whether it posts it or not: a request cancelled
    /// is no longer awaited (on 2026-07-28, rmcp ends its stream without posting the
    /// cancellation, and makes up no answer).
    pub(super) fn sending(&self, message: &ClientJsonRpcMessage) {
        if let JsonRpcMessage::Notification(n) = message
            && let ClientNotification::CancelledNotification(c) = &n.notification
            && let Some(id) = &c.params.request_id
        {
            self.forget(id);
            self.read.locked().remove(id);
        }
    }

    /// `message` as rmcp read it, or what was read here of the same answer (or request
    /// to run as a task). Any answer passing ends the wait for it, one rmcp made up itself
    /// (a lost stream) too.
    pub(super) fn replace(&self, message: ServerJsonRpcMessage) -> ServerJsonRpcMessage {
        if let JsonRpcMessage::Request(request) = &message {
            if self.tasks.is_none() {
                return message;
            }
            // The same request only if it has the same method too: one rmcp could not read
            // leaves its reading here behind, and a session begun again reuses ids.
            let Some(ours) = self.asked.locked().remove(&request.id) else { return message };
            let method = |m: &ServerJsonRpcMessage| serde_json::to_value(m).ok().map(|v| v["method"].clone());
            return if method(&ours) == method(&message) { ours } else { message };
        }
        let id = match &message {
            JsonRpcMessage::Response(response) => &response.id,
            JsonRpcMessage::Error(JsonRpcError { id: Some(id), .. }) => id,
            _ => return message,
        };
        self.forget(id);
        let mut read = self.read.locked();
        match read.remove(id) {
            Some(ours) if matches!(message, JsonRpcMessage::Response(_)) => ours,
            _ => message,
        }
    }

    /// Every message event's data seen on its way to rmcp (which reads only those: an
    /// event of another type is no answer).
    fn events(
        self: &Arc<Self>,
        events: impl Stream<Item = Result<Sse, SseError>> + Send + 'static,
    ) -> futures::stream::BoxStream<'static, Result<Sse, SseError>> {
        let tap = self.clone();
        weighed(events)
            .inspect_ok(move |event| {
                if event.event.as_deref().is_none_or(|kind| kind.is_empty() || kind == "message") {
                    tap.saw(event.data.as_deref().unwrap_or_default().as_bytes());
                }
            })
            .boxed()
    }
}

/// Forgets a request's wait when dropped: its post failed, or rmcp gave it up midway.
struct Waiting<'a> {
    tap: &'a Tap,
    id: Option<RequestId>,
}

impl Waiting<'_> {
    /// The answer will come where the tap reads it (an SSE stream): it waits on.
    fn keep(mut self) {
        self.id = None;
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Some(id) = &self.id {
            self.tap.forget(id);
        }
    }
}

type Error = StreamableHttpError<reqwest::Error>;

/// rmcp's reqwest client, posting the requests whose answers are read here itself.
#[derive(Clone)]
pub struct Tapped {
    client: reqwest::Client,
    tap: Arc<Tap>,
}

impl Tapped {
    /// Fails only when the HTTP client cannot be built at all (its TLS set-up).
    pub fn new(tap: Arc<Tap>) -> Result<Self, reqwest::Error> {
        // As rmcp's own: no idle connections kept (a half-read body left in one stalls
        // the next request on delayed ACKs), and only redirects that keep the request
        // and stay on the server's origin followed (any other would lose the message, or
        // hand its session and headers to another host).
        let redirects = reqwest::redirect::Policy::custom(|attempt| {
            let keeps_request =
                matches!(attempt.status(), StatusCode::TEMPORARY_REDIRECT | StatusCode::PERMANENT_REDIRECT);
            let same_origin = attempt.previous().first().is_some_and(|first| first.origin() == attempt.url().origin());
            if !keeps_request || !same_origin {
                attempt.stop()
            } else if attempt.previous().len() > 10 {
                attempt.error("more than 10 redirects")
            } else {
                attempt.follow()
            }
        });
        let client = reqwest::Client::builder().pool_max_idle_per_host(0).redirect(redirects).build()?;
        Ok(Self { client, tap })
    }

    /// Posts a request whose answer is read here.
    async fn post_read(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session: Option<Arc<str>>,
        auth: Option<String>,
        headers: HashMap<HeaderName, HeaderValue>,
        max_event: usize,
    ) -> Result<StreamableHttpPostResponse, Error> {
        let mut request =
            self.client.post(uri.as_ref()).header(ACCEPT, format!("{EVENT_STREAM_MIME_TYPE}, {JSON_MIME_TYPE}"));
        if let Some(token) = auth {
            request = request.bearer_auth(token);
        }
        // Reserved names (`Accept`, the session's) are refused by the configuration.
        for (name, value) in headers {
            request = request.header(name, value);
        }
        let had_session = session.is_some();
        if let Some(session) = session {
            request = request.header(HEADER_SESSION_ID, session.as_ref());
        }
        let request = match ClientTasks::in_initialize(self.tap.tasks.as_ref(), &message) {
            Ok(Some(initialize)) => request.json(&initialize),
            _ => request.json(&message),
        };
        let response = request.send().await?;
        let status = response.status();
        match status {
            StatusCode::ACCEPTED | StatusCode::NO_CONTENT => return Ok(StreamableHttpPostResponse::Accepted),
            StatusCode::NOT_FOUND if had_session => return Err(StreamableHttpError::SessionExpired),
            status if !status.is_success() => return refused(response).await,
            _ => {}
        }
        let session = session_of(&response);
        match Kind::of(&response) {
            Kind::Events => {
                let events = SseStream::from_bytes_stream(bounded_events(response.bytes_stream(), max_event));
                Ok(StreamableHttpPostResponse::Sse(self.tap.events(events), session))
            }
            Kind::Json => {
                let body = read_at_most(response, max_event).await?;
                if crate::weight::json(&body) > MAX_MESSAGE_WEIGHT {
                    return Err(StreamableHttpError::UnexpectedServerResponse(too_heavy().into()));
                }
                // Read once: as it came when it is read here, else as rmcp reads it.
                let answer = match self.tap.answer(&body) {
                    Some(answer) => answer,
                    None => serde_json::from_slice(&body).map_err(|e| {
                        let said = String::from_utf8_lossy(&body[..body.len().min(256)]).into_owned();
                        StreamableHttpError::UnexpectedServerResponse(
                            format!("the answer is not a JSON-RPC message ({e}): {said}").into(),
                        )
                    })?,
                };
                Ok(StreamableHttpPostResponse::Json(answer, session))
            }
            Kind::Other(kind) => Err(StreamableHttpError::UnexpectedContentType(kind)),
        }
    }
}

/// Why a message of a `url` server's was not read.
fn too_heavy() -> String {
    format!("the server's message would weigh more than {} MiB once read; it was not read", MAX_MESSAGE_WEIGHT >> 20)
}

/// `events`, each weighed before anything reads it, as a stdio server's line is (64 MiB of
/// `[0,0,…]` is gigabytes once read): one past [`MAX_MESSAGE_WEIGHT`] becomes, in its
/// place (its event id kept, for a resumed stream), found by its `id` as it goes by, the
/// error answer to the request it answered, an [`UNREAD_REQUEST`] in place of a request
/// of the server's, or nothing for a message that answers nothing. (An error would end
/// the stream, and rmcp would resume it, to be sent the same event again.)
fn weighed<E>(events: impl Stream<Item = Result<Sse, E>>) -> impl Stream<Item = Result<Sse, E>> {
    events.map_ok(|mut event| {
        let data = event.data.as_deref().unwrap_or_default().as_bytes();
        if crate::weight::json(data) <= MAX_MESSAGE_WEIGHT {
            return event;
        }
        let mut scan = super::id_scan::IdScan::default();
        scan.feed(data);
        event.data = in_place_of_too_heavy(&scan.finish());
        event
    })
}

/// The method of the request that stands in for a request of a `url` server's too heavy
/// to read: the gateway's handler of the server's requests refuses it (`-32600`), as a
/// stdio server's too long a line is refused, so that the server is not left waiting. A
/// server that sends a request of this method itself has it refused too.
pub const UNREAD_REQUEST: &str = "rebound/unreadRequest";

/// What a message too heavy to read, `scanned` as it went by, is read as instead.
fn in_place_of_too_heavy(scanned: &super::id_scan::Scanned) -> Option<String> {
    let message = match scanned.answers() {
        Some(answered) => {
            // As a stdio server's answer too long to read: the request ran.
            let data = serde_json::json!({ super::lines::DROPPED_ANSWER: MAX_MESSAGE_WEIGHT });
            let error = rmcp::ErrorData::internal_error(too_heavy(), Some(data));
            serde_json::to_value(ServerJsonRpcMessage::error(error, Some(answered?))).ok()?
        }
        None => serde_json::json!({"jsonrpc": "2.0", "id": scanned.id.clone()?, "method": UNREAD_REQUEST}),
    };
    Some(message.to_string())
}

/// The error a `url` server's request too heavy to read is answered with.
pub fn unread_request() -> rmcp::ErrorData {
    rmcp::ErrorData::invalid_request(format!("Invalid Request: {}", too_heavy().replace("message", "request")), None)
}

/// What a response's body is, by its `Content-Type`.
enum Kind {
    Events,
    Json,
    Other(Option<String>),
}

impl Kind {
    fn of(response: &reqwest::Response) -> Self {
        let kind = response.headers().get(CONTENT_TYPE).map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        match kind.as_deref() {
            Some(kind) if kind.starts_with(EVENT_STREAM_MIME_TYPE) => Self::Events,
            Some(kind) if kind.starts_with(JSON_MIME_TYPE) => Self::Json,
            _ => Self::Other(kind),
        }
    }
}

/// What a request to a `url` server that rmcp reports as not sent says about it: rmcp
/// reports every failed POST so, whether or not the request reached the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendError {
    /// No connection was made: nothing reached the server.
    NotConnected(String),
    /// The server's endpoint (or a proxy before it) refused it with an error status and
    /// no MCP answer, its `Retry-After` as it came.
    Refused { status: u16, retry_after: Option<String> },
    /// The exchange broke once the request may have gone out.
    Interrupted(String),
    /// The server answered with something that is not an MCP answer.
    Unreadable(String),
}

impl SendError {
    /// How the failed send `error` of a `url` server's transport reads; `None` for any
    /// other transport's (a stdio server's write that failed was never delivered).
    pub fn of(error: &(dyn std::error::Error + Send + Sync + 'static)) -> Option<Self> {
        let error = error.downcast_ref::<Error>()?;
        let said = error.to_string();
        Some(match error {
            StreamableHttpError::Client(e) if e.is_connect() => Self::NotConnected(said),
            StreamableHttpError::HttpStatus(e) => {
                Self::Refused { status: e.status, retry_after: e.retry_after.clone() }
            }
            StreamableHttpError::AuthRequired(_) => Self::Refused { status: 401, retry_after: None },
            StreamableHttpError::InsufficientScope(_) => Self::Refused { status: 403, retry_after: None },
            // rmcp's own client says a refusal without a challenge this way (`HTTP 401
            // Unauthorized: …`): its status is kept.
            StreamableHttpError::UnexpectedServerResponse(said) if let Some(status) = refused_status(said) => {
                Self::Refused { status, retry_after: None }
            }
            StreamableHttpError::UnexpectedServerResponse(_)
            | StreamableHttpError::UnexpectedContentType(_)
            | StreamableHttpError::Deserialize(_)
            | StreamableHttpError::ResponseBodyTooLarge { .. }
            | StreamableHttpError::MissingSessionIdInResponse => Self::Unreadable(said),
            // Whatever else: the request may have reached the server.
            _ => Self::Interrupted(said),
        })
    }
}

/// The 4xx status at the start of rmcp's message for a refused POST (`HTTP 403
/// Forbidden: …`), if that is what it is.
fn refused_status(said: &str) -> Option<u16> {
    let status: u16 = said.strip_prefix("HTTP ")?.get(..3)?.parse().ok()?;
    (400..500).contains(&status).then_some(status)
}

fn session_of(response: &reqwest::Response) -> Option<String> {
    response.headers().get(HEADER_SESSION_ID).and_then(|v| v.to_str().ok()).map(str::to_owned)
}

/// A request refused with an HTTP error status, in rmcp's order: an authentication
/// challenge as one; 429, and a 5xx that is not JSON, as the status alone (with its
/// `Retry-After`, for recovery to wait as told), the body unread; otherwise the JSON-RPC
/// error a JSON body carries (the server's own word), else the status with the body's start.
async fn refused(response: reqwest::Response) -> Result<StreamableHttpPostResponse, Error> {
    let status = response.status();
    let challenge =
        response.headers().get(WWW_AUTHENTICATE).map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    match (status, challenge) {
        (StatusCode::UNAUTHORIZED, Some(challenge)) => {
            return Err(StreamableHttpError::AuthRequired(AuthRequiredError::new(challenge)));
        }
        (StatusCode::FORBIDDEN, Some(challenge)) => {
            return Err(StreamableHttpError::InsufficientScope(InsufficientScopeError::new(challenge, None)));
        }
        _ => {}
    }
    let is_json = matches!(Kind::of(&response), Kind::Json);
    let retry_after = response.headers().get(RETRY_AFTER).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let as_status = || HttpStatusError::new(status.as_u16(), retry_after.clone()).into();
    if status == StatusCode::TOO_MANY_REQUESTS || (status.is_server_error() && !is_json) {
        return Err(as_status());
    }
    let session = session_of(&response);
    let body = read_at_most(response, MAX_ERROR_BODY).await.unwrap_or_default();
    // A 401 or 403 keeps its status, never passing as an ordinary error.
    let auth = matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN);
    if is_json
        && !auth
        && let Ok(error @ JsonRpcMessage::Error(_)) = serde_json::from_slice::<ServerJsonRpcMessage>(&body)
    {
        return Ok(StreamableHttpPostResponse::Json(error, session));
    }
    if status.is_server_error() {
        return Err(as_status());
    }
    let said = String::from_utf8_lossy(&body[..body.len().min(256)]).into_owned();
    Err(StreamableHttpError::UnexpectedServerResponse(format!("HTTP {status}: {said}").into()))
}

/// A response's whole body, refused past `max` bytes.
async fn read_at_most(response: reqwest::Response, max: usize) -> Result<Vec<u8>, Error> {
    let declared = response.content_length().and_then(|n| usize::try_from(n).ok());
    if declared.is_some_and(|n| n > max) {
        return Err(StreamableHttpError::ResponseBodyTooLarge { max_size: max });
    }
    let mut body = Vec::with_capacity(declared.unwrap_or(0));
    let mut chunks = response.bytes_stream();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk?;
        if body.len() + chunk.len() > max {
            return Err(StreamableHttpError::ResponseBodyTooLarge { max_size: max });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// An SSE body whose events are each at most `max` bytes: past it, the stream ends with
/// an error before the parser has buffered more (it keeps a whole event in memory).
fn bounded_events<E: std::error::Error + Send + Sync + 'static>(
    body: impl Stream<Item = Result<Bytes, E>> + Send + 'static,
    max: usize,
) -> impl Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
    let mut event = EventBytes::default();
    body.map(move |chunk| {
        let chunk = chunk.map_err(std::io::Error::other)?;
        if event.take(&chunk) > max {
            return Err(std::io::Error::other(format!("an SSE event is longer than {max} bytes")));
        }
        Ok(chunk)
    })
}

/// Counts the bytes of the SSE event being read. An event ends at an empty line; a line
/// ends at `\n`, `\r\n` or `\r`.
#[derive(Default)]
struct EventBytes {
    /// Bytes of the event so far.
    len: usize,
    /// Whether the line being read is empty so far.
    line_empty: bool,
    /// The last byte was `\r` (a `\n` right after it ends no further line).
    after_cr: bool,
}

impl EventBytes {
    /// Takes `chunk`; the most bytes any event in it reached (line ends not counted).
    fn take(&mut self, chunk: &[u8]) -> usize {
        let mut most = self.len;
        for &byte in chunk {
            let after_cr = std::mem::replace(&mut self.after_cr, byte == b'\r');
            match byte {
                b'\n' if after_cr => {}                           // the `\n` of a `\r\n`
                b'\r' | b'\n' if self.line_empty => self.len = 0, // an empty line: the event ended
                b'\r' | b'\n' => self.line_empty = true,
                _ => {
                    self.line_empty = false;
                    self.len += 1;
                    most = most.max(self.len);
                }
            }
        }
        most
    }
}

impl StreamableHttpClient for Tapped {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, Error> {
        self.post_message_with_max_sse_event_size(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            MAX_MESSAGE_BYTES,
        )
        .await
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, Error> {
        if let JsonRpcMessage::Request(request) = &message
            && self.tap.sent(&message)
        {
            // However the post ends, the answer is no longer awaited here unless it is
            // to come on an SSE stream (a JSON answer is read already).
            let waiting = Waiting { tap: &self.tap, id: Some(request.id.clone()) };
            let posted =
                self.post_read(uri, message, session_id, auth_header, custom_headers, max_sse_event_size).await;
            // rmcp awaits the answer on a stream after both (after a 202, the GET stream).
            if matches!(posted, Ok(StreamableHttpPostResponse::Sse(..) | StreamableHttpPostResponse::Accepted)) {
                waiting.keep();
            }
            return posted;
        }
        let posted = self
            .client
            .post_message_with_max_sse_event_size(
                uri,
                message,
                session_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await;
        match posted {
            // A request to run as a task comes on the stream of the call it serves.
            Ok(StreamableHttpPostResponse::Sse(events, session)) if self.tap.tasks.is_some() => {
                Ok(StreamableHttpPostResponse::Sse(self.tap.events(events), session))
            }
            // rmcp bounds an event by its bytes alone (a JSON body's 16 MiB are within the
            // weight): a tool call's answer, say, is weighed here.
            Ok(StreamableHttpPostResponse::Sse(events, session)) => {
                Ok(StreamableHttpPostResponse::Sse(weighed(events).boxed(), session))
            }
            posted => posted,
        }
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), Error> {
        self.client.delete_session(uri, session_id, auth_header, custom_headers).await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<futures::stream::BoxStream<'static, Result<Sse, SseError>>, Error> {
        self.get_stream_with_max_sse_event_size(
            uri,
            session_id,
            last_event_id,
            auth_header,
            custom_headers,
            MAX_MESSAGE_BYTES,
        )
        .await
    }

    /// A stream resumed after its POST's ended early may carry the answer read here.
    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<futures::stream::BoxStream<'static, Result<Sse, SseError>>, Error> {
        let events = self
            .client
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await?;
        Ok(self.tap.events(events))
    }
}

#[cfg(test)]
mod tests {
    use axum::http::StatusCode as Status;
    use axum::response::IntoResponse;
    use serde_json::{Value, json};

    use super::*;

    /// What rmcp reports as a failed send reads for whether the request may have run.
    #[test]
    fn a_failed_send_is_read_for_what_it_says() {
        let of = |e: Error| SendError::of(&e);
        let refused = |status| Some(SendError::Refused { status, retry_after: None });
        assert_eq!(of(HttpStatusError::new(502, None).into()), refused(502));
        let unauthorised = StreamableHttpError::UnexpectedServerResponse("HTTP 401 Unauthorized: no key".into());
        assert_eq!(of(unauthorised), refused(401));
        let odd = StreamableHttpError::UnexpectedServerResponse("HTTP 200 OK: <html>".into());
        assert!(matches!(of(odd), Some(SendError::Unreadable(_))));
        assert!(matches!(of(StreamableHttpError::SessionRecoveryTimeout), Some(SendError::Interrupted(_))));
        assert!(matches!(of(StreamableHttpError::TransportChannelClosed), Some(SendError::Interrupted(_))));
        let io: Box<dyn std::error::Error + Send + Sync> = Box::new(std::io::Error::other("broken pipe"));
        assert_eq!(SendError::of(&*io), None, "a stdio server's write");
    }

    #[tokio::test]
    async fn only_a_connection_never_made_proves_a_request_undelivered() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let refused = reqwest::Client::new().post(format!("http://{closed}/mcp")).send().await.unwrap_err();
        assert!(matches!(SendError::of(&StreamableHttpError::Client(refused)), Some(SendError::NotConnected(_))));
    }

    fn message<T: serde::de::DeserializeOwned>(value: Value) -> T {
        serde_json::from_value(value).unwrap()
    }

    fn initialize(id: u64) -> ClientJsonRpcMessage {
        message(json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": {"protocolVersion": "2025-11-25",
            "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}))
    }

    /// As the gateway sends it: a custom request (rmcp's own `tasks/*` have other shapes).
    fn task_result(id: u64) -> ClientJsonRpcMessage {
        let request = ClientRequest::CustomRequest(rmcp::model::CustomRequest::new(
            "tasks/result",
            Some(json!({"taskId": "t1"})),
        ));
        JsonRpcMessage::request(request, RequestId::Number(id.try_into().unwrap()))
    }

    /// A task's result, with a field rmcp's reading (a `CallToolResult`) drops.
    const TASK: &str =
        r#"{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"done"}],"vendor":{"kept":true}}}"#;

    /// `message` as it reads after `tap`: the server's own answer, `vendor` and all.
    fn as_sent(tap: &Tap, message: ServerJsonRpcMessage) {
        let rmcps = serde_json::to_value(&message).unwrap();
        assert!(rmcps["result"]["vendor"].is_null(), "rmcp's reading drops it: {rmcps}");
        let replaced = serde_json::to_value(tap.replace(message)).unwrap();
        assert_eq!(replaced, serde_json::from_str::<Value>(TASK).unwrap(), "the answer as the server sent it");
    }

    #[test]
    fn what_rmcp_drops_is_read_and_a_custom_answer_replaces_rmcps_reading_of_it() {
        let tap = Tap::new(Arc::default(), None);
        assert!(tap.sent(&initialize(0)));
        tap.saw(br#"{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":"2025-11-25","capabilities":{"tasks":{"requests":{"tools":{"call":{}}}}},"serverInfo":{"name":"s","version":"1"}}}"#);
        assert!(tap.dropped.task_calls());
        let call: ClientJsonRpcMessage =
            message(json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "echo"}}));
        assert!(!tap.sent(&call), "rmcp reads a tool call's answer whole");
        assert!(tap.sent(&task_result(7)));
        tap.saw(TASK.as_bytes());
        let other: ServerJsonRpcMessage = message(json!({"jsonrpc": "2.0", "id": 8, "result": {}}));
        assert_eq!(serde_json::to_value(tap.replace(other.clone())).unwrap(), serde_json::to_value(&other).unwrap());
        as_sent(&tap, serde_json::from_str(TASK).unwrap());
        assert!(tap.read.lock().unwrap().is_empty() && tap.awaited.lock().unwrap().is_empty());
    }

    #[test]
    fn an_event_is_counted_from_its_first_byte_to_the_empty_line_that_ends_it() {
        let mut event = EventBytes::default();
        assert_eq!(event.take(b"data: abc\n"), 9);
        assert_eq!(event.take(b"data: de"), 17, "one event across chunks");
        assert_eq!(event.take(b"\n\ndata: x\r\n\r\ndata: y\r\rdata"), 17, "ended by \\n\\n, \\r\\n\\r\\n, \\r\\r");
        assert_eq!(event.len, 4);
        assert_eq!(event.take(b"\r"), 4);
        assert_eq!(event.take(b"\n\r\n"), 4, "a \\r\\n split across chunks ends one line");
        assert_eq!(event.len, 0);
    }

    #[tokio::test]
    async fn an_event_past_the_bound_ends_the_stream_with_an_error() {
        let chunks = ["data: 1234", "5678\n\n", "data: ", "12345678", "9\n\n"];
        let body = futures::stream::iter(chunks.map(|c| Ok::<_, std::io::Error>(Bytes::from(c))));
        let read: Vec<_> = bounded_events(body, 14).collect().await;
        assert!(read[..4].iter().all(Result::is_ok), "14 bytes pass");
        assert!(read[4].as_ref().unwrap_err().to_string().contains("longer than 14"));
    }

    /// A server answering every POST with `answer`.
    async fn server(answer: fn() -> axum::response::Response) -> Arc<str> {
        let app = axum::Router::new().route("/mcp", axum::routing::post(move || async move { answer() }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let uri = format!("http://{}/mcp", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        uri.into()
    }

    async fn post(uri: Arc<str>, session: Option<&str>) -> (Result<StreamableHttpPostResponse, Error>, Arc<Tap>) {
        let tap = Tap::new(Arc::default(), None);
        let client = Tapped::new(tap.clone()).unwrap();
        let posted = client.post_message(uri, task_result(7), session.map(Into::into), None, HashMap::new()).await;
        (posted, tap)
    }

    #[tokio::test]
    async fn a_json_answer_is_read_as_it_came_and_its_session_kept() {
        let uri = server(|| {
            ([(CONTENT_TYPE, "application/json"), (HEADER_SESSION_ID.parse().unwrap(), "s-1")], TASK).into_response()
        })
        .await;
        let (posted, tap) = post(uri, None).await;
        let Ok(StreamableHttpPostResponse::Json(answer, session)) = posted else { panic!("{posted:?}") };
        assert_eq!(session.as_deref(), Some("s-1"));
        let answer = serde_json::to_value(tap.replace(answer)).unwrap();
        assert_eq!(answer, serde_json::from_str::<Value>(TASK).unwrap(), "read once, as it came");
    }

    #[tokio::test]
    async fn an_sse_answer_is_read_from_its_event() {
        let uri =
            server(|| ([(CONTENT_TYPE, "text/event-stream")], format!("id: 1\ndata: {TASK}\n\n")).into_response())
                .await;
        let (posted, tap) = post(uri, None).await;
        let Ok(StreamableHttpPostResponse::Sse(events, _)) = posted else { panic!("{posted:?}") };
        let events: Vec<_> = events.collect().await;
        assert_eq!(events.len(), 1);
        as_sent(&tap, serde_json::from_str(events[0].as_ref().unwrap().data.as_ref().unwrap()).unwrap());
    }

    /// An answer that would weigh more than a GiB once read is not read: a tool call's
    /// SSE event (read by rmcp, past its byte bound alone) becomes the error answer to
    /// the call, the stream going on; a JSON body read here fails its post.
    #[tokio::test]
    async fn an_answer_too_heavy_to_read_is_refused_unread() {
        fn heavy(id: u64) -> String {
            let zeros = vec!["0"; 9 << 20].join(",");
            format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[],"v":[{zeros}]}}}}"#)
        }
        let call: ClientJsonRpcMessage =
            message(json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "echo"}}));
        let client = Tapped::new(Tap::new(Arc::default(), None)).unwrap();
        let uri = server(|| {
            let zeros = vec!["0"; 9 << 20].join(",");
            let asked =
                format!(r#"{{"jsonrpc":"2.0","id":"s1","method":"sampling/createMessage","params":[{zeros}]}}"#);
            let events = format!("id: 9\ndata: {}\n\ndata: {asked}\n\ndata: {{}}\n\n", heavy(3));
            ([(CONTENT_TYPE, "text/event-stream")], events).into_response()
        })
        .await;
        let posted = client.post_message(uri, call, None, None, HashMap::new()).await;
        let Ok(StreamableHttpPostResponse::Sse(events, _)) = posted else { panic!("{posted:?}") };
        let events: Vec<_> = events.collect().await;
        assert_eq!(events.len(), 3, "the stream goes on");
        // The server's own request too heavy to read is one the gateway's handler refuses.
        let asked: ServerJsonRpcMessage =
            serde_json::from_str(events[1].as_ref().unwrap().data.as_deref().unwrap()).expect("read as a request");
        let JsonRpcMessage::Request(asked) = asked else { panic!("{asked:?}") };
        assert_eq!(asked.id, rmcp::model::RequestId::String("s1".into()));
        assert!(matches!(&asked.request, rmcp::model::ServerRequest::CustomRequest(c) if c.method == UNREAD_REQUEST));
        let first = events[0].as_ref().unwrap();
        assert_eq!(first.id.as_deref(), Some("9"), "its event id kept, for a resumed stream");
        let answer: Value = serde_json::from_str(first.data.as_deref().unwrap()).unwrap();
        assert_eq!(answer["id"], 3, "{answer}");
        assert!(answer["error"]["message"].as_str().unwrap().contains("weigh more than 1024 MiB"), "{answer}");
        assert_eq!(answer["error"]["data"][super::super::lines::DROPPED_ANSWER], MAX_MESSAGE_WEIGHT, "the call ran");
        let uri = server(|| ([(CONTENT_TYPE, "application/json")], heavy(7)).into_response()).await;
        let (posted, _) = post(uri, None).await;
        assert!(format!("{:?}", posted.unwrap_err()).contains("weigh more than 1024 MiB"));
    }

    /// What a post answered with `answer` comes to; nothing is left waiting after it.
    async fn refused_with(answer: fn() -> axum::response::Response) -> Result<StreamableHttpPostResponse, Error> {
        let (posted, tap) = post(server(answer).await, None).await;
        assert!(tap.awaited.lock().unwrap().is_empty(), "nothing left waiting for an answer");
        posted
    }

    const ERROR: &str = r#"{"jsonrpc":"2.0","id":7,"error":{"code":-32602,"message":"no such task"}}"#;

    #[tokio::test]
    async fn a_refusal_says_what_the_server_said_in_rmcps_order_and_leaves_nothing_waiting() {
        let status = |posted| match posted {
            Err(StreamableHttpError::HttpStatus(e)) => (e.status, e.retry_after),
            other => panic!("{other:?}"),
        };
        let down = refused_with(|| (Status::SERVICE_UNAVAILABLE, [(RETRY_AFTER, "3")], "down").into_response());
        assert_eq!(status(down.await), (503, Some("3".into())));
        // A 429 is the status and its wait, whatever its body says.
        let busy = || {
            (Status::TOO_MANY_REQUESTS, [(RETRY_AFTER, "9"), (CONTENT_TYPE, "application/json")], ERROR).into_response()
        };
        assert_eq!(status(refused_with(busy).await), (429, Some("9".into())));
        // The server's own error, from a 4xx or a 5xx with a JSON body.
        for answer in [
            (|| (Status::BAD_REQUEST, [(CONTENT_TYPE, "application/json")], ERROR).into_response()) as fn() -> _,
            || (Status::INTERNAL_SERVER_ERROR, [(CONTENT_TYPE, "application/json")], ERROR).into_response(),
        ] {
            let Ok(StreamableHttpPostResponse::Json(JsonRpcMessage::Error(e), _)) = refused_with(answer).await else {
                panic!("the server's own error")
            };
            assert_eq!(e.error.message, "no such task");
        }
        // An authentication failure stays one: a challenge as such, a 403's JSON-RPC
        // error body as the status.
        let challenged = || (Status::UNAUTHORIZED, [("www-authenticate", "Bearer realm=\"x\"")], "no").into_response();
        assert!(matches!(refused_with(challenged).await, Err(StreamableHttpError::AuthRequired(_))));
        let scoped = || (Status::FORBIDDEN, [("www-authenticate", "Bearer scope=\"x\"")], "no").into_response();
        assert!(matches!(refused_with(scoped).await, Err(StreamableHttpError::InsufficientScope(_))));
        let forbidden = || (Status::FORBIDDEN, [(CONTENT_TYPE, "application/json")], ERROR).into_response();
        let Err(StreamableHttpError::UnexpectedServerResponse(said)) = refused_with(forbidden).await else { panic!() };
        assert!(said.contains("403") && said.contains("no such task"), "{said}");
        let page = || (Status::FORBIDDEN, "<html>no</html>").into_response();
        let Err(StreamableHttpError::UnexpectedServerResponse(said)) = refused_with(page).await else { panic!() };
        assert!(said.contains("403") && said.contains("<html>no</html>"), "{said}");
        let uri = server(|| Status::NOT_FOUND.into_response()).await;
        assert!(matches!(post(uri, Some("gone")).await.0, Err(StreamableHttpError::SessionExpired)));
    }

    #[tokio::test]
    async fn a_server_is_told_in_initialize_what_the_client_runs_as_tasks() {
        let (told, mut heard) = tokio::sync::mpsc::unbounded_channel::<Value>();
        let app = axum::Router::new().route(
            "/mcp",
            axum::routing::post(move |axum::Json(body): axum::Json<Value>| async move {
                let _ = told.send(body["params"]["capabilities"].clone());
                Status::ACCEPTED
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let uri: Arc<str> = format!("http://{}/mcp", listener.local_addr().unwrap()).into();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let tasks = ClientTasks::of(&json!({"requests": {"elicitation": {"create": {}}}, "list": {}})).unwrap();
        for (relayed, expected) in [(Some(tasks.clone()), json!({"tasks": tasks.value()})), (None, json!({}))] {
            let client = Tapped::new(Tap::new(Arc::default(), relayed)).unwrap();
            client.post_message(uri.clone(), initialize(0), None, None, HashMap::new()).await.unwrap();
            assert_eq!(heard.recv().await.unwrap(), expected);
        }
        let client = Tapped::new(Tap::new(Arc::default(), Some(tasks))).unwrap();
        client.post_message(uri, task_result(1), None, None, HashMap::new()).await.unwrap();
        assert_eq!(heard.recv().await.unwrap(), Value::Null, "only `initialize` carries it");
    }

    #[tokio::test]
    async fn a_post_given_up_midway_leaves_nothing_waiting() {
        let app = axum::Router::new().route("/mcp", axum::routing::post(std::future::pending::<String>));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let uri: Arc<str> = format!("http://{}/mcp", listener.local_addr().unwrap()).into();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let tap = Tap::new(Arc::default(), None);
        let client = Tapped::new(tap.clone()).unwrap();
        let post = client.post_message(uri, task_result(7), None, None, HashMap::new());
        assert!(tokio::time::timeout(std::time::Duration::from_millis(200), post).await.is_err());
        assert!(tap.awaited.lock().unwrap().is_empty());
    }

    #[test]
    fn an_event_of_another_type_is_no_answer_and_an_error_passing_ends_the_wait() {
        let tap = Tap::new(Arc::default(), None);
        assert!(tap.sent(&task_result(7)));
        let event =
            |kind: Option<&str>| Sse { event: kind.map(Into::into), data: Some(TASK.into()), id: None, retry: None };
        let events = tap.events(futures::stream::iter([Ok(event(Some("decoy")))]));
        futures::executor::block_on(events.collect::<Vec<_>>());
        assert!(tap.read.lock().unwrap().is_empty(), "rmcp reads message events only");
        assert_eq!(tap.awaited.lock().unwrap().len(), 1, "still waiting");
        let error: ServerJsonRpcMessage = serde_json::from_str(ERROR).unwrap();
        assert!(matches!(tap.replace(error), JsonRpcMessage::Error(_)));
        assert!(tap.awaited.lock().unwrap().is_empty(), "rmcp's answer (here an error) ends the wait");
    }

    #[test]
    fn a_request_to_run_as_a_task_is_read_as_it_came_when_the_client_runs_tasks() {
        let asked = json!({"jsonrpc": "2.0", "id": 3, "method": "sampling/createMessage", "params": {
            "messages": [], "maxTokens": 5, "task": {"ttl": 1000}}});
        let tasks = ClientTasks::of(&json!({"requests": {"sampling": {"createMessage": {}}}}));
        for (tasks, kept) in [(tasks, true), (None, false)] {
            let tap = Tap::new(Arc::default(), tasks);
            let event = Sse { event: None, data: Some(asked.to_string()), id: None, retry: None };
            futures::executor::block_on(tap.events(futures::stream::iter([Ok(event)])).collect::<Vec<_>>());
            let by_rmcp: ServerJsonRpcMessage = serde_json::from_value(asked.clone()).unwrap();
            let passed = serde_json::to_value(tap.replace(by_rmcp)).unwrap();
            assert_eq!(passed["params"].get("task").is_some(), kept, "{passed}");
            assert!(tap.asked.locked().is_empty());
        }
        // What was read here for a request rmcp never passed on does not stand in for
        // another request with its id.
        let tap = Tap::new(Arc::default(), ClientTasks::of(&json!({"requests": {"sampling": {"createMessage": {}}}})));
        let event = Sse { event: None, data: Some(asked.to_string()), id: None, retry: None };
        futures::executor::block_on(tap.events(futures::stream::iter([Ok(event)])).collect::<Vec<_>>());
        let other: ServerJsonRpcMessage =
            serde_json::from_value(json!({"jsonrpc": "2.0", "id": 3, "method": "roots/list"})).unwrap();
        assert_eq!(serde_json::to_value(tap.replace(other)).unwrap()["method"], "roots/list");
    }

    #[tokio::test]
    async fn a_request_accepted_for_later_waits_until_cancelled() {
        let (posted, tap) = post(server(|| Status::ACCEPTED.into_response()).await, None).await;
        assert!(matches!(posted, Ok(StreamableHttpPostResponse::Accepted)));
        assert_eq!(tap.awaited.locked().len(), 1, "its answer is to come on the GET stream");
        // Cancelled: whether rmcp posts the cancellation or not (on 2026-07-28 it does
        // not), nothing is kept for it, awaited or read and not yet passed on.
        let cancel: ClientJsonRpcMessage = message(json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": 7}}));
        tap.sending(&cancel);
        assert!(tap.awaited.locked().is_empty());
        assert!(tap.sent(&task_result(7)));
        tap.saw(TASK.as_bytes());
        assert_eq!(tap.read.locked().len(), 1);
        tap.sending(&cancel);
        assert!(tap.awaited.locked().is_empty() && tap.read.locked().is_empty());
    }
}
