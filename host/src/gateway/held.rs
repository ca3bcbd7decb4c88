//! A server on a revision before 2026-07-28 asks its client for input (sampling,
//! elicitation, roots) with a request of its own, while the call it serves waits. A
//! client on 2026-07-28 takes no requests from servers: there a server asks by answering
//! the call with questions (`InputRequiredResult`), and the client calls again with its
//! answers and the server's `requestState`. The gateway plays that server's part for an
//! older one: the server's request becomes a question in the answer to the client's call,
//! the call stays open upstream (held here), and the client's next call, carrying its
//! answer and the gateway's `requestState`, answers the server's request and takes the
//! call up where it was. (`super::input` is the same bridge the other way round.)
//!
//! Only the call's own client is asked (`routing` finds the call as for any client, and
//! its [`Bridge`] stands in for the client's session), only what its capabilities allow.
//! Bounds: at most [`MAX_QUESTIONS`] questions waiting in one call, [`MAX_HELD_PER_CLIENT`]
//! calls held for one client and [`MAX_HELD`] in all; a held call ends at its deadline as
//! every call does, and is kept for its client [`KEPT_AFTER`] more, then ended (`sweep`).
//! The `requestState` is 128 random bits after a prefix of this process's, and only the
//! client it was given to (its session, or over HTTP its address) can take the call up
//! with it.

// Sampling and roots are deprecated by 2026-07-28 (SEP-2577) but live in every revision
// the gateway speaks; they are relayed faithfully.
#![allow(deprecated)]

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt as _;
use futures::future::BoxFuture;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ClientCapabilities, ClientResult, CreateMessageResult, ElicitResult,
    GetPromptRequestParams, GetPromptResponse, InputRequest, InputRequests, InputRequiredResult, InputResponses,
    ListRootsResult, ReadResourceRequestParams, ReadResourceResponse, ServerRequest, ServerResult,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::routing::{Waiting, as_request};
use crate::lasting::Locked;
use crate::transport::UpstreamRequest;

/// The start of every `requestState` the gateway makes itself (a server's own passes on
/// as it is).
const STATE_PREFIX: &str = "rebound-held:";

/// At most this many of a server's questions wait for one call's client at once.
pub const MAX_QUESTIONS: usize = 16;

/// At most this many calls wait for one client's answers (a session over stdio, an
/// address over HTTP), for one IPv6 site's (its /48, whose /64s are its addresses), and
/// for all clients together.
pub const MAX_HELD_PER_CLIENT: usize = 32;
pub const MAX_HELD_PER_NETWORK: usize = 2 * MAX_HELD_PER_CLIENT;
pub const MAX_HELD: usize = 1024;

/// How long a held call's answer is kept, past its deadline, for its client to come back.
pub const KEPT_AFTER: Duration = Duration::from_secs(60);

/// How long the progress a request was given may take to reach its client before the
/// questions are its answer.
const PROGRESS_DELIVERED: Duration = Duration::from_secs(1);

/// Which request a held call answers, so that only the same request picks it up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct What {
    pub method: &'static str,
    /// The tool's or prompt's name, or the resource's URI, as the client sent it.
    pub name: String,
}

/// A server's request while it serves a call of a 2026-07-28 client.
struct Question {
    server: String,
    request: UpstreamRequest,
    reply: oneshot::Sender<Result<ClientResult, ErrorData>>,
}

/// Where a server's requests during one call of a 2026-07-28 client go: in the call's
/// request context, where `Routing::track_call` finds it; and why the call was cancelled.
#[derive(Clone)]
pub struct Bridge(mpsc::Sender<Question>, Why);

/// What the server is told of a client's request the client cancelled.
pub const BY_THE_CLIENT: &str = "cancelled by the client";

/// What the server is told of a held call the gateway gave up on: its client did not
/// come back for it in time, or the gateway is stopping.
const GIVEN_UP: &str =
    "the gateway gave up on it (its client did not come back for it in time, or the gateway is stopping)";

/// What the server is told of a call the gateway had no room to hold for its client's
/// answers (refused to the client with a JSON-RPC error, and not an errors-log entry).
const NO_ROOM: &str = "the gateway had no room left to hold it for its client's answers";

/// Why a held call was cancelled, set once, before its cancellation.
#[derive(Clone, Default)]
struct Why(Arc<std::sync::OnceLock<&'static str>>);

impl Why {
    fn set(&self, why: &'static str) {
        let _ = self.0.set(why);
    }
}

impl Bridge {
    /// Why the call it serves was cancelled, as its server is told.
    pub fn why_cancelled(&self) -> &'static str {
        self.1.0.get().copied().unwrap_or(BY_THE_CLIENT)
    }

    /// Whether the call was refused, there being no room to hold it: its client was told
    /// so with a JSON-RPC error, which is the whole of what it failed.
    pub fn refused_for_room(&self) -> bool {
        self.1.0.get().is_some_and(|why| *why == NO_ROOM)
    }

    /// Puts `server`'s `request` to the call's client as a question, and waits for its
    /// answer, or until the server gives up on it (`cancel`).
    pub async fn ask(
        &self,
        server: &str,
        request: UpstreamRequest,
        cancel: CancellationToken,
    ) -> Result<ClientResult, ErrorData> {
        let (reply, answer) = oneshot::channel();
        let question = Question { server: server.to_owned(), request, reply };
        if self.0.try_send(question).is_err() {
            return Err(ErrorData::internal_error(
                format!(
                    "Rebound asked no client: the call this request belongs to has ended, or has {MAX_QUESTIONS} questions waiting already"
                ),
                None,
            ));
        }
        tokio::select! {
            answer = answer => answer.unwrap_or_else(|_| Err(ErrorData::internal_error(
                "the client's call ended before it answered (its deadline passed, or the client did not call again)",
                None,
            ))),
            () = cancel.cancelled() => Err(ErrorData::internal_error("the server cancelled its request", None)),
        }
    }
}

/// What a client may be asked, and so how its answer reads.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Sampling,
    Elicitation,
    Roots,
}

impl Kind {
    fn read(self, answer: serde_json::Value) -> Result<ClientResult, ErrorData> {
        let (read, what) = match self {
            Self::Sampling => (serde_json::from_value::<CreateMessageResult>(answer).map(Into::into), "sampling"),
            Self::Elicitation => (serde_json::from_value::<ElicitResult>(answer).map(Into::into), "elicitation"),
            Self::Roots => (serde_json::from_value::<ListRootsResult>(answer).map(Into::into), "roots"),
        };
        read.map_err(|e| {
            ErrorData::invalid_params(
                format!("the client's answer to the {what} request does not read as one: {e}"),
                None,
            )
        })
    }
}

/// A question put to the client, and where its answer goes.
struct Pending {
    kind: Kind,
    question: InputRequest,
    reply: oneshot::Sender<Result<ClientResult, ErrorData>>,
}

/// The call's answer: a future of the client's request, or running on a task of its own
/// once the call is held between two requests, until it is in.
enum Outcome {
    Running(BoxFuture<'static, Result<ServerResult, ErrorData>>),
    Detached(tokio::task::JoinHandle<Result<ServerResult, ErrorData>>),
    Done,
}

impl Outcome {
    /// The answer (cancel-safe: the call goes on where it was). Asked again once in, it
    /// is an error.
    async fn wait(&mut self) -> Result<ServerResult, ErrorData> {
        let answer = match self {
            Self::Running(call) => call.await,
            Self::Detached(task) => (&mut *task).await.unwrap_or_else(|e| {
                Err(ErrorData::internal_error(format!("the call ended without an answer: {e}"), None))
            }),
            Self::Done => Err(ErrorData::internal_error("the call's answer was given already", None)),
        };
        *self = Self::Done;
        answer
    }

    /// Runs on when no request is waiting for it: the call, if still running, goes on (or,
    /// cancelled, winds down: cancels upstream, ends its progress) on a task of its own.
    fn detach(&mut self) {
        if let Self::Running(call) = self
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let call = std::mem::replace(call, Box::pin(std::future::pending()));
            *self = Self::Detached(runtime.spawn(call));
        }
    }
}

/// One call of a 2026-07-28 client whose server may ask it questions.
pub struct Call {
    what: What,
    /// Whom it counts against ([`MAX_HELD_PER_CLIENT`]).
    client: Arc<str>,
    outcome: Outcome,
    questions: mpsc::Receiver<Question>,
    pending: BTreeMap<String, Pending>,
    asked: u64,
    /// The call's own cancellation: the client's request ends with each round.
    ct: CancellationToken,
    /// Why it was cancelled, for its server.
    why: Why,
    /// The client's request waiting for the call's answer now, where its progress goes.
    waiting: Waiting,
    /// Until when it is kept for its client: its deadline (which ends it upstream, as it
    /// ends every call) and [`KEPT_AFTER`], from its start.
    until: Instant,
}

impl Drop for Call {
    /// A call nobody will come back for is cancelled, and winds down as any call does
    /// (cancelled upstream); the server's questions are answered with an error.
    fn drop(&mut self) {
        self.why.set(GIVEN_UP);
        self.ct.cancel();
        self.waiting.set(None);
        self.outcome.detach();
    }
}

impl Call {
    /// The call `make` makes of `cx`'s request, with a [`Bridge`] in its context and a
    /// cancellation of its own.
    pub fn new(
        what: What,
        client: Arc<str>,
        deadline: Duration,
        cx: &RequestContext<RoleServer>,
        make: impl FnOnce(RequestContext<RoleServer>) -> BoxFuture<'static, Result<ServerResult, ErrorData>>,
    ) -> Self {
        let waiting = Waiting::default();
        let mut call = Self::of(what, client, deadline, |bridge, ct| {
            let mut inner = cx.clone();
            super::http::without_place(&mut inner.extensions);
            inner.ct = ct;
            inner.extensions.insert(bridge);
            inner.extensions.insert(waiting.clone());
            make(inner)
        });
        call.waiting = waiting;
        call
    }

    /// The call `make` makes, given where its server's questions go and its cancellation.
    fn of(
        what: What,
        client: Arc<str>,
        deadline: Duration,
        make: impl FnOnce(Bridge, CancellationToken) -> BoxFuture<'static, Result<ServerResult, ErrorData>>,
    ) -> Self {
        let (tx, questions) = mpsc::channel(MAX_QUESTIONS);
        let (ct, why) = (CancellationToken::new(), Why::default());
        let outcome = Outcome::Running(make(Bridge(tx, why.clone()), ct.clone()));
        let until = Instant::now() + deadline.saturating_add(KEPT_AFTER);
        let (pending, waiting) = (BTreeMap::new(), Waiting::default());
        Self { what, client, outcome, questions, pending, asked: 0, ct, why, waiting, until }
    }

    /// Queues a server's question for the client whose capabilities are `caps`, or
    /// answers it with the reason it cannot be asked.
    fn queue(&mut self, question: Question, caps: &ClientCapabilities) {
        let Question { server, request, reply } = question;
        let asked = as_request(request, caps, &server).and_then(|request| as_question(request, &server));
        let (kind, question) = match asked {
            Ok(asked) if self.pending.len() < MAX_QUESTIONS => asked,
            Ok(_) => {
                let message = format!("the client has {MAX_QUESTIONS} of this call's questions to answer already");
                let _ = reply.send(Err(ErrorData::internal_error(message, None)));
                return;
            }
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        self.asked += 1;
        self.pending.insert(format!("rebound-{}", self.asked), Pending { kind, question, reply });
    }

    /// Passes the client's `answers` to the questions they answer; those it did not
    /// answer are asked again.
    fn answered(&mut self, mut answers: InputResponses) {
        let keys: Vec<String> = self.pending.keys().filter(|k| answers.contains_key(*k)).cloned().collect();
        for key in keys {
            let (Some(pending), Some(answer)) = (self.pending.remove(&key), answers.remove(&key)) else { continue };
            let _ = pending.reply.send(pending.kind.read(answer));
        }
    }
}

/// `request` as a question in a call's answer, and what its answer reads as.
fn as_question(request: ServerRequest, server: &str) -> Result<(Kind, InputRequest), ErrorData> {
    match request {
        ServerRequest::CreateMessageRequest(r) => Ok((Kind::Sampling, InputRequest::CreateMessage(r))),
        ServerRequest::ElicitRequest(r) => Ok((Kind::Elicitation, InputRequest::Elicitation(r))),
        ServerRequest::ListRootsRequest(r) => Ok((Kind::Roots, InputRequest::ListRoots(r))),
        other => {
            let method = serde_json::to_value(&other).ok().and_then(|v| v["method"].as_str().map(str::to_owned));
            Err(ErrorData::new(
                rmcp::model::ErrorCode::METHOD_NOT_FOUND,
                format!(
                    "the client behind the gateway speaks MCP 2026-07-28, which can be asked only for sampling, elicitation and roots (server `{server}` sent `{}`)",
                    method.unwrap_or_default()
                ),
                None,
            ))
        }
    }
}

/// The calls held between a 2026-07-28 client's requests, by their `requestState`.
#[derive(Default)]
pub struct Held {
    calls: Arc<Mutex<HashMap<String, Call>>>,
    /// Whether the task that ends calls kept past their time runs.
    sweeping: std::sync::OnceLock<()>,
}

/// The start of every `requestState` this gateway makes: one of another gateway in front
/// of a server (a Rebound behind this one) is that server's, and passes on as it is.
fn prefix() -> &'static str {
    static PREFIX: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PREFIX.get_or_init(|| format!("{STATE_PREFIX}{:08x}:", rand::random::<u32>()))
}

impl Held {
    /// Whether `state` is one this gateway made (a server's own passes on as it is).
    pub fn is_ours(state: Option<&str>) -> bool {
        state.is_some_and(|s| s.starts_with(prefix()))
    }

    /// Answers `call` for the client of `cx`: its answer, or the questions its server
    /// asked meanwhile (the call then held until the client calls again).
    pub async fn answer(&self, call: Call, cx: &RequestContext<RoleServer>) -> Result<ServerResult, ErrorData> {
        // The call's progress goes to this request, under its own token.
        call.waiting.set(cx.meta.get_progress_token().map(|token| (cx.peer.clone(), token)));
        self.answer_for(call, &cx.client_capabilities().unwrap_or_default(), &cx.ct).await
    }

    /// [`Held::answer`] for a client with `caps`, whose request ends with `cancelled`.
    async fn answer_for(
        &self,
        mut call: Call,
        caps: &ClientCapabilities,
        cancelled: &CancellationToken,
    ) -> Result<ServerResult, ErrorData> {
        loop {
            while let Ok(question) = call.questions.try_recv() {
                call.queue(question, caps);
            }
            // Questions the server gave up on are not asked.
            call.pending.retain(|_, p| !p.reply.is_closed());
            if !call.pending.is_empty() {
                // A call answered meanwhile needs no answers any more.
                if let Some(answer) = call.outcome.wait().now_or_never() {
                    return answer;
                }
                // Until its client comes back, nobody hears its progress; what this
                // request was given reaches it before the questions.
                call.waiting.set(None);
                call.waiting.delivered(PROGRESS_DELIVERED).await;
                if let Some(answer) = call.outcome.wait().now_or_never() {
                    return answer;
                }
                return self.hold(call, cancelled);
            }
            tokio::select! {
                answer = call.outcome.wait() => return answer,
                Some(question) = call.questions.recv() => call.queue(question, caps),
                () = cancelled.cancelled() => {
                    // Wound down here (cancelled upstream, in the errors log), on this
                    // request's handler, which a shutdown waits for; past WIND_DOWN, on a
                    // task of its own as the call is dropped.
                    call.why.set(BY_THE_CLIENT);
                    call.ct.cancel();
                    let _ = tokio::time::timeout(WIND_DOWN, call.outcome.wait()).await;
                    return Err(ErrorData::internal_error(BY_THE_CLIENT, None));
                }
            }
        }
    }

    /// How many calls wait for their clients' answers.
    pub fn waiting(&self) -> usize {
        self.calls.locked().len()
    }

    /// Returns once no call waits for its client's answers (answered, or past its time):
    /// while the gateway drains, a call held is a call in flight, with the grace to
    /// finish as any other.
    pub async fn none_waiting(&self) {
        while self.waiting() > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    /// Takes out the call `state` names, for the same request (`what`) of the same
    /// `client`, with the client's `answers` passed to its server; [`Held::answer`] goes
    /// on with it.
    pub fn resume(
        &self,
        state: &str,
        what: &What,
        client: &str,
        answers: Option<InputResponses>,
    ) -> Result<Call, ErrorData> {
        let mut calls = self.calls.locked();
        let mut call = match calls.remove(state) {
            Some(call) if *call.client != *client || call.until <= Instant::now() => {
                // Another client's is not named to this one.
                if *call.client != *client {
                    calls.insert(state.to_owned(), call);
                }
                None
            }
            Some(call) if call.what != *what => {
                let message = format!(
                    "`requestState` names a call of `{}` `{}`, not this one: send it with the request it came with",
                    call.what.method, call.what.name
                );
                calls.insert(state.to_owned(), call);
                return Err(ErrorData::invalid_params(message, None));
            }
            found => found,
        }
        .ok_or_else(|| {
            let message = format!(
                "`requestState` names no call the gateway still holds for this client: it ended (its deadline passed and {} s more), was answered already, or the gateway restarted; call again without it",
                KEPT_AFTER.as_secs()
            );
            ErrorData::invalid_params(message, None)
        })?;
        drop(calls);
        call.answered(answers.unwrap_or_default());
        Ok(call)
    }

    /// Keeps `call` until its client calls again, and says what to answer meanwhile.
    fn hold(&self, mut call: Call, cancelled: &CancellationToken) -> Result<ServerResult, ErrorData> {
        let questions: InputRequests = call.pending.iter().map(|(k, p)| (k.clone(), p.question.clone())).collect();
        let state = format!("{}{:032x}", prefix(), rand::random::<u128>());
        let mut calls = self.calls.locked();
        let of_client = calls.values().filter(|c| c.client == call.client).count();
        let network = crate::gateway::http::network_of(&call.client);
        let of_network = |network: &str| {
            calls.values().filter(|c| crate::gateway::http::network_of(&c.client).as_deref() == Some(network)).count()
        };
        let refused = if of_client >= MAX_HELD_PER_CLIENT {
            Some(format!(
                "the server asked for input, and {of_client} of this client's calls wait for its answers already (at most {MAX_HELD_PER_CLIENT}): answer those first"
            ))
        } else if network.as_deref().is_some_and(|n| of_network(n) >= MAX_HELD_PER_NETWORK) {
            Some(format!(
                "the server asked for input, and {MAX_HELD_PER_NETWORK} calls of this client's IPv6 site (its /48) wait for their answers already: answer those first"
            ))
        } else if calls.len() >= MAX_HELD {
            Some(format!(
                "the server asked for input, and the gateway holds {MAX_HELD} calls for their clients' answers already: call again shortly"
            ))
        } else {
            None
        };
        if let Some(message) = refused {
            // Dropped, the call is cancelled upstream.
            call.why.set(NO_ROOM);
            return Err(ErrorData::internal_error(message, None));
        }
        // A request cancelled as it is answered: rmcp drops its answer, and nobody would
        // come back for the call.
        if cancelled.is_cancelled() {
            call.why.set(BY_THE_CLIENT);
            return Err(ErrorData::internal_error(BY_THE_CLIENT, None));
        }
        call.outcome.detach();
        calls.insert(state.clone(), call);
        drop(calls);
        self.sweeping.get_or_init(|| {
            let calls = Arc::downgrade(&self.calls);
            drop(crate::lasting::spawn("sweep of held calls", move || sweep(calls.clone())));
        });
        Ok(ServerResult::InputRequiredResult(InputRequiredResult::new(Some(questions), Some(state))))
    }
}

/// How long a call its client cancelled gets to wind down before its request's handler
/// returns: it ends at once when cancelled, unless still waiting for the servers' start.
const WIND_DOWN: Duration = Duration::from_secs(1);

/// How often calls kept past their time are looked for.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Ends the calls of `calls` kept past their time (each cancelled, upstream too, and its
/// server's questions answered with an error), for as long as the gateway holds any.
async fn sweep(calls: std::sync::Weak<Mutex<HashMap<String, Call>>>) {
    let mut every = tokio::time::interval(SWEEP_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let Some(calls) = calls.upgrade() else { return };
        let now = Instant::now();
        let ended: Vec<Call> = {
            let mut calls = calls.locked();
            let expired: Vec<String> = calls.iter().filter(|(_, c)| c.until <= now).map(|(k, _)| k.clone()).collect();
            expired.iter().filter_map(|k| calls.remove(k)).collect()
        };
        if !ended.is_empty() {
            tracing::info!(calls = ended.len(), "calls whose 2026-07-28 client did not come back for them ended");
        }
    }
}

/// The state and answers of a request that takes up a call the gateway holds (the
/// `requestState` is one it made), taken out of the request.
pub fn take_ours(
    state: &mut Option<String>,
    answers: &mut Option<InputResponses>,
) -> Option<(String, Option<InputResponses>)> {
    if !Held::is_ours(state.as_deref()) {
        return None;
    }
    Some((state.take()?, answers.take()))
}

/// An answer of a request that may be answered with questions, read back from a held
/// call's result.
pub trait Response: Into<ServerResult> + Send + 'static {
    fn read(result: ServerResult) -> Option<Self>;
}

impl Response for CallToolResponse {
    fn read(result: ServerResult) -> Option<Self> {
        match result {
            ServerResult::CallToolResult(r) => Some(r.into()),
            ServerResult::InputRequiredResult(r) => Some(r.into()),
            ServerResult::CreateTaskResult(r) => Some(r.into()),
            _ => None,
        }
    }
}

impl Response for GetPromptResponse {
    fn read(result: ServerResult) -> Option<Self> {
        match result {
            ServerResult::GetPromptResult(r) => Some(r.into()),
            ServerResult::InputRequiredResult(r) => Some(r.into()),
            _ => None,
        }
    }
}

impl Response for ReadResourceResponse {
    fn read(result: ServerResult) -> Option<Self> {
        match result {
            ServerResult::ReadResourceResult(r) => Some(r.into()),
            ServerResult::InputRequiredResult(r) => Some(r.into()),
            _ => None,
        }
    }
}

/// `result` as the answer of request `R`.
pub fn read<R: Response>(result: ServerResult) -> Result<R, ErrorData> {
    R::read(result)
        .ok_or_else(|| ErrorData::internal_error("a held call was answered with another request's result", None))
}

/// A request a server may answer with questions, as it names its call.
pub trait Resumable: Send + 'static {
    fn what(&self) -> What;
    /// Its `requestState` and `inputResponses`.
    fn resumed(&mut self) -> (&mut Option<String>, &mut Option<InputResponses>);
}

impl Resumable for CallToolRequestParams {
    fn what(&self) -> What {
        What { method: "tools/call", name: self.name.to_string() }
    }
    fn resumed(&mut self) -> (&mut Option<String>, &mut Option<InputResponses>) {
        (&mut self.request_state, &mut self.input_responses)
    }
}

impl Resumable for GetPromptRequestParams {
    fn what(&self) -> What {
        What { method: "prompts/get", name: self.name.clone() }
    }
    fn resumed(&mut self) -> (&mut Option<String>, &mut Option<InputResponses>) {
        (&mut self.request_state, &mut self.input_responses)
    }
}

impl Resumable for ReadResourceRequestParams {
    fn what(&self) -> What {
        What { method: "resources/read", name: self.uri.clone() }
    }
    fn resumed(&mut self) -> (&mut Option<String>, &mut Option<InputResponses>) {
        (&mut self.request_state, &mut self.input_responses)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use rmcp::model::{CallToolResult, ContentBlock};
    use serde_json::json;

    use super::*;

    fn what() -> What {
        What { method: "tools/call", name: "look".into() }
    }

    fn caps(caps: serde_json::Value) -> ClientCapabilities {
        serde_json::from_value(caps).unwrap()
    }

    /// Why a call was cancelled, as its server would be told, once it is.
    type Told = Arc<Mutex<Option<&'static str>>>;

    /// A call whose server asks its client for its roots, and answers with what it heard;
    /// `cancelled` is given why, if the call is cancelled meanwhile.
    fn asking_roots(client: &str, cancelled: Told) -> Call {
        Call::of(what(), client.into(), Duration::from_secs(10), move |bridge, ct| {
            Box::pin(async move {
                let heard = tokio::select! {
                    biased;
                    () = ct.cancelled() => {
                        *cancelled.lock().unwrap() = Some(bridge.why_cancelled());
                        return Err(ErrorData::internal_error("cancelled", None));
                    }
                    heard = bridge.ask("files", UpstreamRequest::Roots, CancellationToken::new()) => heard,
                };
                let text = match heard {
                    Ok(answer) => serde_json::to_string(&answer).unwrap(),
                    Err(e) => format!("error: {}", e.message),
                };
                Ok(ServerResult::CallToolResult(CallToolResult::success(vec![ContentBlock::text(text)])))
            })
        })
    }

    fn text(result: &ServerResult) -> String {
        let ServerResult::CallToolResult(result) = result else { panic!("not a tool result: {result:?}") };
        result.content.iter().filter_map(|c| c.as_text()).map(|t| t.text.clone()).collect()
    }

    /// The questions and state of an answer that asks.
    fn asked(result: ServerResult) -> (InputRequests, String) {
        let ServerResult::InputRequiredResult(asked) = result else { panic!("no questions: {result:?}") };
        (asked.input_requests.unwrap(), asked.request_state.unwrap())
    }

    #[tokio::test(start_paused = true)]
    async fn a_servers_request_comes_back_as_a_question_and_its_answer_goes_on_to_the_server() {
        let held = Held::default();
        let (roots, request) = (caps(json!({"roots": {}})), CancellationToken::new());
        let first = held.answer_for(asking_roots("a", Arc::default()), &roots, &request).await.unwrap();
        let (questions, state) = asked(first);
        assert!(Held::is_ours(Some(&state)), "{state}");
        let (key, question) = questions.into_iter().next().unwrap();
        assert!(matches!(question, InputRequest::ListRoots(_)));

        let answers = InputResponses::from([(key, json!({"roots": [{"uri": "file:///work"}]}))]);
        let call = held.resume(&state, &what(), "a", Some(answers)).unwrap();
        let done = held.answer_for(call, &roots, &request).await.unwrap();
        assert!(text(&done).contains("file:///work"), "{}", text(&done));
        // Answered, the call is no longer held.
        assert!(held.resume(&state, &what(), "a", None).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_without_the_capability_is_not_asked() {
        let held = Held::default();
        let done =
            held.answer_for(asking_roots("a", Arc::default()), &caps(json!({})), &CancellationToken::new()).await;
        assert!(text(&done.unwrap()).contains("does not support roots"));
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_that_does_not_read_goes_to_the_server_as_an_error() {
        let held = Held::default();
        let (roots, request) = (caps(json!({"roots": {}})), CancellationToken::new());
        let (questions, state) =
            asked(held.answer_for(asking_roots("a", Arc::default()), &roots, &request).await.unwrap());
        let key = questions.into_keys().next().unwrap();
        let call = held.resume(&state, &what(), "a", Some(InputResponses::from([(key, json!({"roots": 5}))]))).unwrap();
        let done = held.answer_for(call, &roots, &request).await.unwrap();
        assert!(text(&done).contains("does not read as one"), "{}", text(&done));
    }

    #[tokio::test(start_paused = true)]
    async fn an_unanswered_question_is_asked_again_and_another_request_cannot_take_the_call() {
        let held = Held::default();
        let (roots, request) = (caps(json!({"roots": {}})), CancellationToken::new());
        let (questions, state) =
            asked(held.answer_for(asking_roots("a", Arc::default()), &roots, &request).await.unwrap());
        let other = What { method: "prompts/get", name: "look".into() };
        let refused = held.resume(&state, &other, "a", None).err().unwrap();
        assert!(refused.message.contains("not this one"), "{}", refused.message);
        let call = held.resume(&state, &what(), "a", Some(InputResponses::new())).unwrap();
        let (again, state_again) = asked(held.answer_for(call, &roots, &request).await.unwrap());
        assert_eq!(again.into_keys().collect::<Vec<_>>(), questions.into_keys().collect::<Vec<_>>());
        assert_ne!(state, state_again, "a new state for each round");
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_its_client_does_not_come_back_for_ends_and_is_cancelled() {
        let held = Held::default();
        let (roots, request) = (caps(json!({"roots": {}})), CancellationToken::new());
        let cancelled = Told::default();
        let (_, state) = asked(held.answer_for(asking_roots("a", cancelled.clone()), &roots, &request).await.unwrap());
        tokio::time::sleep(Duration::from_secs(9) + KEPT_AFTER).await;
        assert_eq!(*cancelled.lock().unwrap(), None, "kept until its deadline and 60 s more");
        // Past that, it is ended even though nothing else happens: cancelled, so that the
        // attempt cancels upstream too.
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(*cancelled.lock().unwrap(), Some(GIVEN_UP), "the server is not told the client cancelled it");
        let late = held.resume(&state, &what(), "a", None).err().unwrap();
        assert!(late.message.contains("no call the gateway still holds"), "{}", late.message);
    }

    /// A call its client cancels is cancelled as the client's doing; one the gateway gives
    /// up on (above) says so instead.
    #[tokio::test(start_paused = true)]
    async fn a_call_its_client_cancels_is_cancelled_by_the_client() {
        let held = Held::default();
        let (roots, request) = (caps(json!({"roots": {}})), CancellationToken::new());
        let cancelled = Told::default();
        request.cancel();
        assert!(held.answer_for(asking_roots("a", cancelled.clone()), &roots, &request).await.is_err());
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(*cancelled.lock().unwrap(), Some(BY_THE_CLIENT));
    }

    #[tokio::test(start_paused = true)]
    async fn only_the_client_a_call_was_held_for_takes_it_up() {
        let held = Held::default();
        let (roots, request) = (caps(json!({"roots": {}})), CancellationToken::new());
        let (questions, state) =
            asked(held.answer_for(asking_roots("a", Arc::default()), &roots, &request).await.unwrap());
        let key = questions.into_keys().next().unwrap();
        let answers = || Some(InputResponses::from([(key.clone(), json!({"roots": []}))]));
        let refused = held.resume(&state, &what(), "b", answers()).err().unwrap();
        assert!(refused.message.contains("no call the gateway still holds"), "{}", refused.message);
        let call = held.resume(&state, &what(), "a", answers()).unwrap();
        assert!(text(&held.answer_for(call, &roots, &request).await.unwrap()).contains("roots"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_its_client_cancels_before_any_question_winds_down_as_cancelled() {
        let held = Held::default();
        let wound_down = Arc::new(AtomicBool::new(false));
        let seen = wound_down.clone();
        let call = Call::of(what(), "a".into(), Duration::from_secs(10), move |_, ct| {
            Box::pin(async move {
                // As an attempt does: on its cancellation it tells the server, then ends.
                ct.cancelled().await;
                tokio::task::yield_now().await;
                seen.store(true, Ordering::SeqCst);
                Err(ErrorData::internal_error("cancelled", None))
            })
        });
        let (none, request) = (caps(json!({})), CancellationToken::new());
        let answering = held.answer_for(call, &none, &request);
        request.cancel();
        assert!(answering.await.is_err());
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(wound_down.load(Ordering::SeqCst), "the call was dropped halfway, not wound down");
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_answered_as_its_server_asks_is_answered_not_held() {
        let held = Held::default();
        let call = Call::of(what(), "a".into(), Duration::from_secs(10), |bridge, _| {
            Box::pin(async move {
                let (reply, _answer) = oneshot::channel();
                let question = Question { server: "files".into(), request: UpstreamRequest::Roots, reply };
                bridge.0.try_send(question).ok().unwrap();
                // Answered a moment after it asked, before the client was told.
                tokio::task::yield_now().await;
                Ok(ServerResult::CallToolResult(CallToolResult::success(vec![ContentBlock::text("done")])))
            })
        });
        let done = held.answer_for(call, &caps(json!({"roots": {}})), &CancellationToken::new()).await.unwrap();
        assert_eq!(text(&done), "done");
        assert!(held.calls.lock().unwrap().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn one_client_may_hold_only_so_many_calls() {
        let held = Held::default();
        let (roots, request) = (caps(json!({"roots": {}})), CancellationToken::new());
        for _ in 0..MAX_HELD_PER_CLIENT {
            asked(held.answer_for(asking_roots("a", Arc::default()), &roots, &request).await.unwrap());
        }
        let cancelled = Told::default();
        let refused = held.answer_for(asking_roots("a", cancelled.clone()), &roots, &request).await.err().unwrap();
        assert!(refused.message.contains("answer those first"), "{}", refused.message);
        tokio::task::yield_now().await;
        assert_eq!(*cancelled.lock().unwrap(), Some(NO_ROOM), "refused, it is cancelled for want of room");
        // Another client is not held back.
        asked(held.answer_for(asking_roots("b", Arc::default()), &roots, &request).await.unwrap());
    }

    /// The /64s of one IPv6 site hold twice one address's calls at most; another site's
    /// room is its own.
    #[tokio::test(start_paused = true)]
    async fn the_addresses_of_one_ipv6_site_hold_twice_an_addresss_calls() {
        let held = Held::default();
        let (roots, request) = (caps(json!({"roots": {}})), CancellationToken::new());
        let of = |block: u32| format!("address 2001:db8:1:{block:x}::/64");
        for block in 0..2 {
            for _ in 0..MAX_HELD_PER_CLIENT {
                asked(held.answer_for(asking_roots(&of(block), Arc::default()), &roots, &request).await.unwrap());
            }
        }
        let refused = held.answer_for(asking_roots(&of(2), Arc::default()), &roots, &request).await.err().unwrap();
        assert!(refused.message.contains("IPv6 site"), "{}", refused.message);
        let elsewhere = asking_roots("address 2001:db8:2:1::/64", Arc::default());
        asked(held.answer_for(elsewhere, &roots, &request).await.unwrap());
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_answered_without_questions_is_not_held() {
        let held = Held::default();
        let call = Call::of(what(), "a".into(), Duration::from_secs(1), |_, _| {
            Box::pin(async {
                Ok(ServerResult::CallToolResult(CallToolResult::success(vec![ContentBlock::text("done")])))
            })
        });
        let done = held.answer_for(call, &caps(json!({})), &CancellationToken::new()).await.unwrap();
        assert_eq!(text(&done), "done");
        assert!(held.calls.lock().unwrap().is_empty());
    }
}
