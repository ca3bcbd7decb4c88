//! The HTTP front's limit on requests in flight per client, its refusal of duplicate ids
//! and malformed bodies, and the count that lets a shutdown drain what is in flight.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use axum::Extension;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use serde::de::IgnoredAny;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::parsed::{self, Past};
use super::{ClientIp, Front, refuse};
use crate::lasting::Locked;
use crate::transport::malformed::Unreadable;
use crate::transport::tasks::ClientTasks;

/// Requests in flight per client. A client is its MCP session once it has one, and its
/// address before (the `initialize` request). Only JSON-RPC requests count, not the
/// client's answers to the server's requests or its notifications (a client must always
/// be able to answer an elicitation or cancel). The permit is held until the response
/// body ends and the request's handler is done, so a tool call answered over SSE counts
/// while its answer streams, and one whose client disconnected while it goes on.
///
/// A request whose JSON-RPC id is already in flight for the same client is refused at
/// once with a JSON-RPC error: two answers with one id could not be told apart, and rmcp
/// would answer only one of them.
#[derive(Debug, Default)]
pub(super) struct ClientLimits {
    per_client: usize,
    clients: Mutex<HashMap<String, InFlight>>,
    /// Requests in flight from every client, and a wake-up when it drops to none.
    total: std::sync::atomic::AtomicUsize,
    idle: tokio::sync::Notify,
    /// Set on shutdown: new requests are refused, those in flight finish.
    pub(super) draining: std::sync::atomic::AtomicBool,
    /// What every POST in flight weighs once read (`parsed`), notifications and answers too.
    parsed: Arc<parsed::Budget>,
}

/// One client's requests in flight: the permits (of `most`), and the ids they carry.
#[derive(Debug)]
struct InFlight {
    permits: Arc<Semaphore>,
    most: usize,
    ids: std::collections::HashSet<String>,
}

/// How many times a client's share one address has in flight in all its sessions (and
/// without one): opening sessions gives no more than this.
pub(super) const SESSIONS_OF_ADDRESS: usize = 8;

/// Why a request may not go on.
enum Refusal {
    TooMany,
    DuplicateId,
}

impl ClientLimits {
    /// At most `per_client` requests in flight per client.
    pub(super) fn new(per_client: usize) -> Self {
        Self { per_client, ..Default::default() }
    }

    /// What all of `address`'s requests count against together besides their clients:
    /// the address's [`SESSIONS_OF_ADDRESS`] shares, and an IPv6 address's site's (its
    /// /48, whose /64s are its addresses) twice that.
    fn in_all(&self, address: IpAddr) -> Vec<(String, usize)> {
        let address = super::address_client(address);
        let most = self.per_client.saturating_mul(SESSIONS_OF_ADDRESS);
        let site = super::network_of(&address).map(|site| (format!("{site} in all"), most.saturating_mul(2)));
        std::iter::once((format!("{address} in all"), most)).chain(site).collect()
    }

    /// A permit for `client`'s request `id`, within its share and within each of
    /// `in_all` (a key and its most: see [`Self::in_all`]).
    fn try_acquire(
        self: &Arc<Self>,
        client: String,
        id: Option<String>,
        in_all: Vec<(String, usize)>,
    ) -> Result<ClientPermit, Refusal> {
        // Under the lock, so that a permit dropped meanwhile cannot remove the entry.
        let mut clients = self.clients.locked();
        let mut permits = Vec::with_capacity(in_all.len() + 1);
        let shares = std::iter::once((client, self.per_client)).chain(in_all);
        for (key, most) in shares {
            let entry = clients.entry(key.clone()).or_insert_with(|| InFlight {
                permits: Arc::new(Semaphore::new(most)),
                most,
                ids: Default::default(),
            });
            let taken = match &id {
                Some(id) if permits.is_empty() && entry.ids.contains(id) => Err(Refusal::DuplicateId),
                _ => entry.permits.clone().try_acquire_owned().map_err(|_| Refusal::TooMany),
            };
            match taken {
                Ok(permit) => permits.push((key, permit)),
                Err(refusal) => {
                    // The permits taken go back, and their entries with them when idle.
                    give_back(&mut clients, permits, None);
                    if clients.get(&key).is_some_and(|e| e.permits.available_permits() == e.most) {
                        clients.remove(&key);
                    }
                    return Err(refusal);
                }
            }
        }
        if let Some(id) = &id {
            clients.get_mut(&permits[0].0).expect("just taken").ids.insert(id.clone());
        }
        self.total.fetch_add(1, Ordering::SeqCst);
        Ok(ClientPermit { limits: self.clone(), id, permits })
    }

    pub(super) fn in_flight(&self) -> usize {
        self.total.load(Ordering::SeqCst)
    }

    /// Returns once no request is in flight.
    pub(super) async fn drained(&self) {
        loop {
            let idle = self.idle.notified();
            if self.in_flight() == 0 {
                return;
            }
            idle.await;
        }
    }
}

struct ClientPermit {
    limits: Arc<ClientLimits>,
    id: Option<String>,
    /// The client's permit, then its address's and its site's.
    permits: Vec<(String, OwnedSemaphorePermit)>,
}

impl Drop for ClientPermit {
    fn drop(&mut self) {
        if self.limits.total.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.limits.idle.notify_waiters();
        }
        let mut clients = self.limits.clients.locked();
        give_back(&mut clients, std::mem::take(&mut self.permits), self.id.as_deref());
    }
}

/// Gives `permits` back (the first one's with request `id`), forgetting the keys that
/// hold none any more: a map that kept every session ever seen would grow without bound.
fn give_back(clients: &mut HashMap<String, InFlight>, permits: Vec<(String, OwnedSemaphorePermit)>, id: Option<&str>) {
    for (n, (key, permit)) in permits.into_iter().enumerate() {
        drop(permit);
        let Some(entry) = clients.get_mut(&key) else { continue };
        if let Some(id) = id.filter(|_| n == 0) {
            entry.ids.remove(id);
        }
        if entry.permits.available_permits() == entry.most {
            clients.remove(&key);
        }
    }
}

/// What decides whether a POST counts: a JSON-RPC request has a method and an id. Read
/// in the same pass: what `http::tasks` needs of a single request.
#[derive(serde::Deserialize)]
#[serde(untagged)]
pub(super) enum Probe {
    One {
        method: Option<serde_json::Value>,
        id: Option<serde_json::Value>,
        #[serde(default)]
        params: ParamsProbe,
    },
    Batch(Vec<Probe>),
}

/// Of a request's `params`: whether it has a `task` (not `null`), its `protocolVersion`,
/// the requests its `capabilities` say it runs as tasks (an `initialize`'s, which
/// rmcp's types drop), and whether its `requestState` is one the gateway made (a
/// 2026-07-28 client's answer to the questions of a call the gateway holds). Whatever
/// `params` is, it reads (what is not an object, as nothing).
#[derive(Default)]
pub(super) struct ParamsProbe {
    pub task: bool,
    pub protocol_version: Option<String>,
    pub client_tasks: Option<Box<ClientTasks>>,
    pub resumes_held: bool,
}

impl<'de> serde::Deserialize<'de> for ParamsProbe {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = ParamsProbe;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<ParamsProbe, A::Error> {
                let mut probe = ParamsProbe::default();
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    match &*key {
                        "task" => probe.task = map.next_value::<Option<IgnoredAny>>()?.is_some(),
                        "protocolVersion" => {
                            probe.protocol_version = map.next_value::<serde_json::Value>()?.as_str().map(str::to_owned);
                        }
                        "capabilities" => {
                            probe.client_tasks =
                                ClientTasks::of(&map.next_value::<serde_json::Value>()?["tasks"]).map(Box::new);
                        }
                        "requestState" => {
                            let state = map.next_value::<serde_json::Value>()?;
                            probe.resumes_held = super::super::held::Held::is_ours(state.as_str());
                        }
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(probe)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<ParamsProbe, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(ParamsProbe::default())
            }
            fn visit_bool<E>(self, _: bool) -> Result<ParamsProbe, E> {
                Ok(ParamsProbe::default())
            }
            fn visit_i64<E>(self, _: i64) -> Result<ParamsProbe, E> {
                Ok(ParamsProbe::default())
            }
            fn visit_u64<E>(self, _: u64) -> Result<ParamsProbe, E> {
                Ok(ParamsProbe::default())
            }
            fn visit_f64<E>(self, _: f64) -> Result<ParamsProbe, E> {
                Ok(ParamsProbe::default())
            }
            fn visit_str<E>(self, _: &str) -> Result<ParamsProbe, E> {
                Ok(ParamsProbe::default())
            }
            fn visit_unit<E>(self) -> Result<ParamsProbe, E> {
                Ok(ParamsProbe::default())
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

impl Probe {
    fn is_request(&self) -> bool {
        match self {
            Probe::One { method, id, .. } => method.is_some() && id.is_some(),
            Probe::Batch(items) => items.iter().any(Probe::is_request),
        }
    }

    /// The id of a single request, as JSON text (`1` and `"1"` differ, as in JSON-RPC).
    fn id(&self) -> Option<serde_json::Value> {
        match self {
            Probe::One { method: Some(_), id, .. } => id.clone(),
            _ => None,
        }
    }

    /// A single request's method and params, as far as they were read.
    pub(super) fn request(&self) -> Option<(&str, &ParamsProbe)> {
        match self {
            Probe::One { method: Some(method), id: Some(_), params } => Some((method.as_str()?, params)),
            _ => None,
        }
    }
}

/// Marks a POST whose body is one `subscriptions/listen` request (`http::settle_listen`).
#[derive(Clone, Copy)]
pub(super) struct Listen;

/// Whether `body` carries a request, and the id of a single one; `None` for what rmcp
/// cannot read as a message (not JSON, or not objects).
#[cfg(test)]
fn carries_request(body: &[u8]) -> Option<(bool, Option<serde_json::Value>)> {
    probe(body).map(|p| (p.is_request(), p.id()))
}

fn probe(body: &[u8]) -> Option<Probe> {
    serde_json::from_slice::<Probe>(body).ok()
}

/// The protocol's error for a body that is not a client message, as JSON (rmcp would
/// answer 415 and plain text): -32700, or -32600 with the request's id when it has one.
fn unreadable(body: &[u8]) -> Response {
    let error = Unreadable::of(body).to_json();
    (StatusCode::BAD_REQUEST, [(header::CONTENT_TYPE, "application/json")], error.to_string()).into_response()
}

/// Every POST: its body read within `max_body_bytes` ([`read_body`]), a body that is no
/// client message answered with the protocol's error, a request counted against its
/// client's `max_concurrent_per_client` (and refused while the gateway drains) until its
/// response has been sent (a tool call: and its handler is done). A new event stream
/// (`GET /mcp`) is refused while the gateway drains too; what the operator reads
/// (`/status`, `/metrics`) is not.
pub(super) async fn limit(
    State(front): State<Front>,
    Extension(ClientIp(client)): Extension<ClientIp>,
    request: Request,
    next: Next,
) -> Response {
    if opens_a_stream_while_draining(&front, &request) {
        return shutting_down();
    }
    if request.method() != Method::POST {
        return next.run(request).await;
    }
    let (mut parts, body) = request.into_parts();
    let body = match read_body(&front, client, &parts.headers, body).await {
        Ok(body) => body,
        Err(refused) => return refused,
    };
    // Weighed before anything reads it, the probe included.
    let weight = parsed::weight(&body);
    let held = match front.limits.parsed.hold(|| super::address_client(client), weight) {
        Ok(held) => held.map(Arc::new),
        Err(past) => return too_heavy(&front, past, weight),
    };
    // Held as long as the request is handled, too: a call goes on when its client
    // disconnects, and so does what it read (rmcp keeps the request's parts with it).
    if let Some(held) = &held {
        parts.extensions.insert(held.clone());
    }
    let Some(probe) = probe(&body) else {
        front.hub.metrics.rejected("malformed");
        return unreadable(&body);
    };
    let (counts, id) = (probe.is_request(), probe.id());
    let opens_session = matches!(probe.request(), Some(("initialize", _)));
    let resumes_held = matches!(probe.request(), Some(("tools/call", params)) if params.resumes_held);
    let calls_a_tool = matches!(probe.request(), Some(("tools/call", _)));
    mark(&mut parts, &probe);
    let (body, initialize) = super::tasks::as_sent(&mut parts.headers, body, &probe);
    // rmcp refuses a JSON body it cannot read with 415; the client gets the protocol's error.
    let kept = is_json(&parts.headers).then(|| body.clone());
    let mut request = Request::from_parts(parts, Body::from(body));
    if !counts {
        return sent_holding(answer_unreadable(next.run(request).await, kept.as_deref(), &front), held);
    }
    let permit = match admit(&front, &request, (client, opens_session, resumes_held), id) {
        Ok(permit) => Arc::new(permit),
        Err(refused) => return *refused,
    };
    // A tool call's place is held as long as it is handled too, as its weight is: one
    // whose client disconnected still counts against it until it ends, so that leaving
    // its calls gives a client no more at once. (Not a long poll, `tasks/result`, which
    // would hold it for as long as its task runs, once its client gave up on it.)
    if calls_a_tool {
        request.extensions_mut().insert(permit.clone());
    }
    let mut response = answer_unreadable(next.run(request).await, kept.as_deref(), &front);
    if opens_session && let Some(session) = response.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()) {
        front.sessions.made_by(session, client);
    }
    if initialize {
        response = super::tasks::announce(response);
    }
    sent_holding(response, (permit, held))
}

/// `response`, with `held` (a permit, a weight) kept until its body has been sent or the
/// client is gone.
fn sent_holding(response: Response, held: impl Send + Sync + 'static) -> Response {
    let (parts, body) = response.into_parts();
    let body = body.map_frame(move |frame| {
        let _held = &held;
        frame
    });
    Response::from_parts(parts, Body::new(body))
}

/// The answer to a body whose weight once read (`parsed`) could not be held.
fn too_heavy(front: &Front, past: Past, weight: usize) -> Response {
    let mib = |bytes: usize| bytes.div_ceil(1 << 20);
    let (status, reason, message) = match past {
        Past::Alone => (
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_many_values",
            format!(
                "the request's JSON holds too many values: about {} MiB once read, past the {} MiB one client may have in flight; send fewer, larger values (a string rather than an array of numbers)",
                mib(weight),
                mib(parsed::ADDRESS_SHARE)
            ),
        ),
        Past::Address => (
            StatusCode::TOO_MANY_REQUESTS,
            "too_much_in_flight",
            format!(
                "this client's requests in flight are too large together (past {} MiB once read, or {} MiB from its IPv6 site); wait for one to finish",
                mib(parsed::ADDRESS_SHARE),
                mib(parsed::NETWORK_SHARE)
            ),
        ),
        Past::Gateway => (
            StatusCode::SERVICE_UNAVAILABLE,
            "gateway_full",
            "the gateway holds as many large requests as it may; try again shortly".to_owned(),
        ),
    };
    front.hub.metrics.rejected(reason);
    let mut response = refuse(status, &message);
    if status != StatusCode::PAYLOAD_TOO_LARGE {
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}

/// How long a request's body may take to arrive once its headers have: 30 s, or for a
/// larger `max_body_bytes` than 7.5 MiB, as long as that takes at 256 KiB/s.
fn body_within(max: usize) -> std::time::Duration {
    std::time::Duration::from_secs(30).max(std::time::Duration::from_secs((max >> 18) as u64))
}

/// The length a request's headers say its body has.
fn declared_length(headers: &axum::http::HeaderMap) -> Option<usize> {
    headers.get(header::CONTENT_LENGTH)?.to_str().ok()?.parse().ok()
}

/// A request's body, read within `max_body_bytes` and `body_within`. While it arrives it
/// holds, as its weight, what it says it will take: bodies sent slowly hold no memory
/// outside the budget. One that says nothing, sent in chunks, holds nothing while it
/// weighs little ([`parsed::LIGHT`]: a cancellation, an answer to the server), then
/// `max_body_bytes`; its chunks are copied together as they come.
async fn read_body(front: &Front, client: IpAddr, headers: &HeaderMap, body: Body) -> Result<Bytes, Response> {
    let max = front.settings.max_body_bytes;
    let hold =
        |weight: usize| front.limits.parsed.hold(|| super::address_client(client), weight).map_err(|p| (p, weight));
    let within = body_within(max);
    let read = match declared_length(headers) {
        Some(length) => {
            let reading = length.min(max).min(parsed::ADDRESS_SHARE);
            let _reading = hold(reading).map_err(|(past, weight)| too_heavy(front, past, weight))?;
            tokio::time::timeout(within, axum::body::to_bytes(body, max)).await.map(|r| r.map_err(Unread::Failed))
        }
        None => tokio::time::timeout(within, collect(body, max, || hold(max.min(parsed::ADDRESS_SHARE)))).await,
    };
    let Ok(read) = read else {
        let message = format!("the request body did not arrive within {} s", within.as_secs());
        return Err(refuse(StatusCode::REQUEST_TIMEOUT, &message));
    };
    read.map_err(|unread| match unread {
        Unread::Refused((past, weight)) => too_heavy(front, past, weight),
        Unread::Failed(e)
            if std::error::Error::source(&e).is_some_and(|s| s.is::<http_body_util::LengthLimitError>()) =>
        {
            refuse(StatusCode::PAYLOAD_TOO_LARGE, "the request body is larger than rebound.http.max_body_bytes")
        }
        Unread::Failed(_) => refuse(StatusCode::BAD_REQUEST, "the request body could not be read"),
    })
}

/// Why a body was not read.
enum Unread {
    /// Its weight could not be held: why, and what it was.
    Refused((Past, usize)),
    Failed(axum::Error),
}

/// `body`'s bytes, at most `max`, copied together as they come (kept one buffer each,
/// each would hold on to the connection's read buffer it was cut from), with `past_light`
/// held from when they weigh more than [`parsed::LIGHT`] until all have come.
async fn collect<H>(
    body: Body,
    max: usize,
    past_light: impl FnOnce() -> Result<H, (Past, usize)>,
) -> Result<Bytes, Unread> {
    let mut body = http_body_util::Limited::new(body, max);
    let mut bytes = bytes::BytesMut::new();
    let (mut past_light, mut held) = (Some(past_light), None);
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.map_err(|e| Unread::Failed(axum::Error::new(e)))?.into_data() {
            bytes.extend_from_slice(&data);
        }
        if bytes.len() > parsed::LIGHT
            && let Some(hold) = past_light.take()
        {
            held = Some(hold().map_err(Unread::Refused)?);
        }
    }
    drop(held);
    // Exactly its length: what grew by doubling is not kept with the request.
    Ok(Bytes::copy_from_slice(&bytes))
}

/// `extensions` (of a request's context, a copy kept beyond its handler) without the
/// request's place among its client's requests in flight: a call held for a 2026-07-28
/// client's answers, say, which its next request (with those answers) must find room for.
pub fn without_place(extensions: &mut rmcp::model::Extensions) {
    if let Some(parts) = extensions.get_mut::<axum::http::request::Parts>() {
        parts.extensions.remove::<Arc<ClientPermit>>();
    }
}

/// A request id as rmcp tells ids apart: `1`, `1.0` and `1e0` are one id (which a
/// client sending both would have answered once), `1` and `"1"` two.
fn id_key(id: &serde_json::Value) -> String {
    match serde_json::from_value::<rmcp::model::RequestId>(id.clone()) {
        Ok(id) => format!("{id:?}"),
        Err(_) => id.to_string(),
    }
}

/// Counts `request` (whose JSON-RPC id is `id`) against its client, an MCP session of the
/// gateway's or, without one, its client's `address`: refused past `max_concurrent_per_client`, for an id
/// already in flight in its session, and while the gateway drains, except a 2026-07-28
/// client's answer to a call the gateway holds (`resumes_held`): that call is in flight,
/// and has the grace to finish as any other. An `initialize`
/// (`opening` a session) counts apart from the address's other requests: a 2026-07-28
/// client's listen requests there, held open, must not keep its neighbours behind one
/// address from opening sessions.
fn admit(
    front: &Front,
    request: &Request,
    (address, opening, resumes_held): (IpAddr, bool, bool),
    id: Option<serde_json::Value>,
) -> Result<ClientPermit, Box<Response>> {
    // Only a session of the gateway's: rmcp serves a 2026-07-28 request without one,
    // whatever session it names, so a made-up id would otherwise be a fresh client.
    let session = request.headers().get("mcp-session-id").and_then(|v| v.to_str().ok());
    let session = session.filter(|id| front.sessions.knows(id));
    let client = match session {
        Some(session) => format!("session {session}"),
        None if opening => format!("{} opening sessions", super::address_client(address)),
        None => super::address_client(address),
    };
    // All of an address's requests but its `initialize`s count together too, and all of
    // its IPv6 site's.
    let in_all = if opening { Vec::new() } else { front.limits.in_all(address) };
    // Ids are a session's own; before it has one (`initialize`), there is nothing to match.
    let key = id.as_ref().filter(|_| session.is_some()).map(id_key);
    let permit = match front.limits.try_acquire(client, key, in_all) {
        Ok(permit) => permit,
        Err(Refusal::TooMany) => {
            front.hub.metrics.rejected("too_many_requests");
            let mut response = refuse(
                StatusCode::TOO_MANY_REQUESTS,
                "too many requests in flight from this client; wait for one to finish (rebound.http.max_concurrent_per_client)",
            );
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            return Err(Box::new(response));
        }
        Err(Refusal::DuplicateId) => {
            front.hub.metrics.rejected("duplicate_id");
            let id = id.unwrap_or(serde_json::Value::Null);
            let error = serde_json::json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32600,
                "message": format!("a request with id {id} is already in flight in this session; give each request its own id")}});
            return Err(Box::new(([(header::CONTENT_TYPE, "application/json")], error.to_string()).into_response()));
        }
    };
    // After the permit is counted, so that a drain that has begun either sees it or
    // has already refused it.
    if front.limits.draining.load(Ordering::SeqCst) && !resumes_held {
        drop(permit);
        return Err(Box::new(shutting_down()));
    }
    Ok(permit)
}

/// Marks what later layers need to know of the request from its body: a listen request
/// (the `Mcp-Method` header is optional), an `initialize`'s tasks (for the gateway's
/// `initialize`, `server::client_tasks`: rmcp's types drop them).
fn mark(parts: &mut axum::http::request::Parts, probe: &Probe) {
    if matches!(probe.request(), Some(("subscriptions/listen", _))) {
        parts.extensions.insert(Listen);
    }
    if let Some(("initialize", params)) = probe.request()
        && let Some(tasks) = &params.client_tasks
    {
        parts.extensions.insert(ClientTasks::clone(tasks));
    }
}

/// Whether a request's body is said to be JSON.
fn is_json(headers: &axum::http::HeaderMap) -> bool {
    headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|v| {
        v.split(';').next().is_some_and(|essence| essence.trim().eq_ignore_ascii_case("application/json"))
    })
}

/// A new event stream (`GET /mcp`, or under it) asked for while the gateway drains.
fn opens_a_stream_while_draining(front: &Front, request: &Request) -> bool {
    let path = request.uri().path();
    request.method() == Method::GET
        && (path == "/mcp" || path.starts_with("/mcp/"))
        && front.limits.draining.load(Ordering::SeqCst)
}

fn shutting_down() -> Response {
    let mut response = refuse(StatusCode::SERVICE_UNAVAILABLE, "the gateway is shutting down; try again shortly");
    response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// `response`, or the protocol's error in its place when rmcp could not read the JSON body.
fn answer_unreadable(response: Response, json_body: Option<&[u8]>, front: &Front) -> Response {
    match json_body {
        Some(body) if response.status() == StatusCode::UNSUPPORTED_MEDIA_TYPE => {
            front.hub.metrics.rejected("malformed");
            unreadable(body)
        }
        _ => response,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body in many small chunks is read into one buffer, and refused past the bound.
    #[tokio::test]
    async fn a_body_in_chunks_is_read_whole_within_its_bound() {
        let chunks = || {
            let bytes = (0..1000).map(|_| Ok::<_, std::io::Error>(axum::body::Bytes::from_static(b"x")));
            Body::from_stream(futures::stream::iter(bytes))
        };
        let whole = || Ok::<_, (Past, usize)>(());
        assert_eq!(collect(chunks(), 1000, whole).await.ok().unwrap(), "x".repeat(1000).as_bytes());
        let Err(Unread::Failed(past)) = collect(chunks(), 999, whole).await else { panic!("read past its bound") };
        assert!(std::error::Error::source(&past).is_some_and(|s| s.is::<http_body_util::LengthLimitError>()));
        // Past `LIGHT`, and only then, its weight is held, or the body refused.
        let held = std::cell::Cell::new(false);
        let light = collect(chunks(), 1000, || {
            held.set(true);
            Ok(())
        });
        assert!(light.await.is_ok() && !held.get(), "a light body holds nothing");
        let heavy = || {
            let bytes = (0..parsed::LIGHT + 1).map(|_| Ok::<_, std::io::Error>(axum::body::Bytes::from_static(b"x")));
            Body::from_stream(futures::stream::iter(bytes))
        };
        let refused = collect(heavy(), 1 << 20, || Err::<(), _>((Past::Address, 1 << 20)));
        assert!(matches!(refused.await, Err(Unread::Refused((Past::Address, _)))));
    }

    /// Ids are told apart as rmcp tells them: `1` written as `1.0` or `1e0` is one id
    /// already in flight (rmcp would answer one of the two), `"1"` another.
    #[test]
    fn one_id_however_its_number_is_written() {
        let key = |id: serde_json::Value| id_key(&id);
        assert_eq!(key(serde_json::json!(1)), key(serde_json::json!(1.0)));
        assert_eq!(key(serde_json::json!(1)), key(serde_json::json!(1e0)));
        assert_ne!(key(serde_json::json!(1)), key(serde_json::json!("1")));
        assert_ne!(key(serde_json::json!(1.5)), key(serde_json::json!(1)));
    }

    /// Each session has its share of requests in flight, and all the sessions of one
    /// address (and its requests without one) have eight shares together: opening more
    /// sessions gives no more. Permits given back leave nothing behind.
    #[test]
    fn an_address_has_so_many_shares_in_flight_whatever_its_sessions() {
        let limits = Arc::new(ClientLimits::new(2));
        let all = || limits.in_all("10.0.0.1".parse().unwrap());
        let mut held = Vec::new();
        for session in 0..SESSIONS_OF_ADDRESS {
            for n in 0..2 {
                held.push(limits.try_acquire(format!("session {session}"), Some(n.to_string()), all()).ok().unwrap());
            }
        }
        assert!(matches!(limits.try_acquire("session 0".into(), None, all()), Err(Refusal::TooMany)), "its own share");
        let more = limits.try_acquire("session new".into(), None, all());
        assert!(matches!(more, Err(Refusal::TooMany)), "the address's shares are taken");
        assert!(limits.try_acquire("session other".into(), None, limits.in_all("10.0.0.2".parse().unwrap())).is_ok());
        assert!(matches!(limits.try_acquire("session 1".into(), Some("1".into()), vec![]), Err(Refusal::DuplicateId)));
        held.pop();
        assert!(limits.try_acquire("session new".into(), None, all()).is_ok(), "one given back is room");
        drop(held);
        assert!(limits.clients.lock().unwrap().is_empty(), "{:?}", limits.clients.lock().unwrap().keys());
    }

    /// The /64s of one IPv6 site have twice one address's shares in flight together;
    /// another site's are its own.
    #[test]
    fn the_addresses_of_one_ipv6_site_have_twice_an_addresss_shares_in_flight() {
        let limits = Arc::new(ClientLimits::new(2));
        let of = |block: u32| limits.in_all(format!("2001:db8:1:{block:x}::1").parse().unwrap());
        let mut held = Vec::new();
        for block in 0..2 {
            for session in 0..SESSIONS_OF_ADDRESS {
                for _ in 0..2 {
                    held.push(limits.try_acquire(format!("session {block} {session}"), None, of(block)).ok().unwrap());
                }
            }
        }
        let third = limits.try_acquire("session new".into(), None, of(2));
        assert!(matches!(third, Err(Refusal::TooMany)), "the site's shares are taken");
        let elsewhere = limits.in_all("2001:db8:2:1::1".parse().unwrap());
        assert!(limits.try_acquire("session elsewhere".into(), None, elsewhere).is_ok(), "another site's are its own");
        held.pop();
        assert!(limits.try_acquire("session new".into(), None, of(2)).is_ok(), "one given back is room");
        drop(held);
        assert!(limits.clients.lock().unwrap().is_empty(), "{:?}", limits.clients.lock().unwrap().keys());
    }

    #[test]
    fn an_initializes_tasks_capability_is_read_and_odd_capabilities_are_no_harm() {
        let tasks = |capabilities: &str| {
            let body = format!(
                r#"{{"jsonrpc":"2.0","id":0,"method":"initialize","params":{{"capabilities":{capabilities}}}}}"#
            );
            let probe = probe(body.as_bytes()).expect("read");
            probe.request().expect("a request").1.client_tasks.clone()
        };
        let runs = tasks(r#"{"sampling":{},"tasks":{"requests":{"elicitation":{"create":{}}}}}"#).expect("read");
        assert_eq!(runs.value(), &serde_json::json!({"requests": {"elicitation": {"create": {}}}}));
        for odd in ["null", "7", "[1]", r#"{"tasks":"all"}"#, r#"{"tasks":{"requests":[]}}"#] {
            assert_eq!(tasks(odd), None, "{odd}");
        }
    }

    #[test]
    fn only_json_rpc_requests_count_against_the_limit() {
        let counts = |body: &[u8]| carries_request(body).is_none_or(|(counts, _)| counts);
        assert!(counts(br#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}"#));
        assert!(counts(
            br#"[{"jsonrpc":"2.0","method":"notifications/initialized"},{"jsonrpc":"2.0","id":"x","method":"ping"}]"#
        ));
        assert!(counts(b"not json"));
        // Whatever `params` is, the request is read (and left to rmcp to judge).
        for params in ["[1,2]", "\"x\"", "null", "7", "{\"task\":null}"] {
            let body = format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{params}}}"#);
            assert_eq!(carries_request(body.as_bytes()).map(|(counts, _)| counts), Some(true), "{body}");
        }
        assert!(!counts(br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}"#));
        assert!(!counts(br#"{"jsonrpc":"2.0","id":7,"result":{"action":"accept"}}"#));
        // The id of a single request, to refuse a second one in flight; `1` is not `"1"`.
        assert_eq!(
            carries_request(br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#).unwrap().1,
            Some(serde_json::json!(1))
        );
        assert_eq!(
            carries_request(br#"{"jsonrpc":"2.0","id":"1","method":"ping"}"#).unwrap().1,
            Some(serde_json::json!("1"))
        );
        assert_eq!(
            carries_request(br#"{"jsonrpc":"2.0","id":1,"result":{}}"#).unwrap().1,
            None,
            "an answer has no request id"
        );
    }

    proptest::proptest! {
        /// Whatever a client posts, reading it never panics, and what the probe cannot read
        /// gets an answer with a null id.
        #[test]
        fn any_body_is_read_without_panic(body in proptest::collection::vec(proptest::arbitrary::any::<u8>(), 0..300)) {
            if carries_request(&body).is_none() {
                proptest::prop_assert!(Unreadable::of(&body).id.is_null());
            }
        }

        #[test]
        fn any_json_body_is_read_without_panic(text in "[\\[\\]{}\":,0-9a-z ]{0,200}") {
            if let Some((counts, id)) = carries_request(text.as_bytes()) {
                proptest::prop_assert!(counts || id.is_none());
            }
            let _ = Unreadable::of(text.as_bytes());
        }
    }
}
