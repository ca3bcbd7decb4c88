//! A server on MCP 2026-07-28 asks its client for input (sampling, elicitation, roots)
//! not with a request of its own but by answering the call with an `InputRequiredResult`;
//! the client answers each question and calls again with the answers and the server's
//! `requestState`. For a client on an older revision, the gateway plays that part: it
//! asks the client each question as the request its revision knows, under the same rules
//! as any server-to-client request (`routing::to_client`), and calls the server again.

use std::time::Duration;

use rmcp::model::{
    ClientRequest, GetPromptRequest, GetPromptRequestParams, GetPromptResult, InputRequest, InputRequiredResult,
    InputResponses, ReadResourceRequest, ReadResourceRequestParams, ReadResourceResult, ServerResult,
};
use rmcp::service::{PeerRequestOptions, RequestContext};
use rmcp::{ErrorData, RoleServer, ServiceError};

use super::call::request_meta;
use super::routing::{ask, to_client};
use crate::transport::Session;
use crate::transport::upstream::{Asker, UpstreamRequest};

/// At most this many rounds of questions in one call (as the SDKs allow), so that a
/// server cannot keep a call open by asking forever.
pub const MAX_ROUNDS: usize = 10;

/// At most this many questions in one round: each is put to the client in turn.
pub const MAX_QUESTIONS: usize = 16;

/// Whether the server of `session` speaks 2026-07-28, and so may answer with questions.
pub fn server_asks(session: &Session) -> bool {
    session.info.as_ref().is_some_and(|i| !i.protocol_version.has_initialize())
}

/// Whether the client of `cx` speaks 2026-07-28, and so takes a server's questions as
/// they are and calls again with its answers.
pub fn client_is_asked(cx: &RequestContext<RoleServer>) -> bool {
    cx.protocol_version().is_some_and(|v| !v.has_initialize())
}

/// What a server answered to one request that it may answer with questions.
#[derive(Debug)]
pub enum Answer<R> {
    Done(R),
    Asked(InputRequiredResult),
}

/// A request other than `tools/call` that a server on 2026-07-28 may answer with
/// questions: `prompts/get` and `resources/read`. (`tools/call` has its own loop in
/// `super::call`, which recovery drives.)
pub trait Asking: Clone {
    type Done;
    const METHOD: &'static str;
    fn into_request(self) -> ClientRequest;
    fn answer(result: ServerResult) -> Option<Answer<Self::Done>>;
    /// The same request again, with the client's answers and the server's state.
    fn resume(&mut self, answers: InputResponses, state: Option<String>);
}

impl Asking for GetPromptRequestParams {
    type Done = GetPromptResult;
    const METHOD: &'static str = "prompts/get";
    fn into_request(self) -> ClientRequest {
        ClientRequest::GetPromptRequest(GetPromptRequest::new(self))
    }
    fn answer(result: ServerResult) -> Option<Answer<GetPromptResult>> {
        match result {
            ServerResult::GetPromptResult(r) => Some(Answer::Done(r)),
            ServerResult::InputRequiredResult(asked) => Some(Answer::Asked(asked)),
            _ => None,
        }
    }
    fn resume(&mut self, answers: InputResponses, state: Option<String>) {
        (self.input_responses, self.request_state) = (Some(answers), state);
    }
}

impl Asking for ReadResourceRequestParams {
    type Done = ReadResourceResult;
    const METHOD: &'static str = "resources/read";
    fn into_request(self) -> ClientRequest {
        ClientRequest::ReadResourceRequest(ReadResourceRequest::new(self))
    }
    fn answer(result: ServerResult) -> Option<Answer<ReadResourceResult>> {
        match result {
            ServerResult::ReadResourceResult(r) => Some(Answer::Done(r)),
            ServerResult::InputRequiredResult(asked) => Some(Answer::Asked(asked)),
            _ => None,
        }
    }
    fn resume(&mut self, answers: InputResponses, state: Option<String>) {
        (self.input_responses, self.request_state) = (Some(answers), state);
    }
}

/// How long one request may take: each round with the server at most `timeout`, the
/// whole exchange (the wait for the server and the client's answers included) at most
/// `deadline`, which ends at `until`.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub timeout: Duration,
    pub deadline: Duration,
    pub until: tokio::time::Instant,
}

/// Sends `params` to `server` on `session` for the client of `cx`, and settles the
/// server's questions as `super::call::attempt` does for a tool: a client on 2026-07-28
/// gets them as they are (and sends its answers back itself); an older client is asked
/// them as requests it knows, and the server is asked again, at most [`MAX_ROUNDS`]
/// times, all within `limits`. A server on an older revision that answers with
/// questions gives a broken answer.
pub async fn settle<P: Asking>(
    mut params: P,
    server: &str,
    session: &Session,
    cx: &RequestContext<RoleServer>,
    limits: Limits,
) -> Result<Answer<P::Done>, ErrorData> {
    let late = || {
        let ms = limits.deadline.as_millis();
        ErrorData::internal_error(format!("server `{server}`: `{}` took longer than its {ms} ms", P::METHOD), None)
    };
    let lost = || ErrorData::internal_error(format!("server `{server}`: the connection was lost"), None);
    // Dropping a round's request (the deadline, the client's cancellation, the connection
    // lost) cancels it upstream.
    let mut round = 0;
    loop {
        let left = limits.until.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return Err(late());
        }
        let answer = tokio::select! {
            r = tokio::time::timeout(left, send(params.clone(), session, cx, limits.timeout.min(left))) => r.map_err(|_| late())?,
            () = cx.ct.cancelled() => return Err(ErrorData::internal_error("cancelled by the client", None)),
            () = session.closed.cancelled() => return Err(lost()),
        };
        let answer = answer.map_err(|e| match e {
            ServiceError::Timeout { timeout } => ErrorData::internal_error(
                format!("server `{server}` did not answer `{}` within {} ms", P::METHOD, timeout.as_millis()),
                None,
            ),
            other => upstream_error(server, other),
        })?;
        let asked = match answer {
            Answer::Asked(_) if !server_asks(session) => {
                return Err(broken(server, P::METHOD, "questions, which only a server on 2026-07-28 may ask"));
            }
            Answer::Asked(asked) if client_is_asked(cx) => return Ok(Answer::Asked(asked)),
            Answer::Asked(_) if round == MAX_ROUNDS => {
                return Err(broken(server, P::METHOD, &format!("questions still after {MAX_ROUNDS} rounds")));
            }
            Answer::Asked(asked) => asked,
            done => return Ok(done),
        };
        let left = limits.until.saturating_duration_since(tokio::time::Instant::now());
        // The server's connection lost meanwhile: its questions are moot.
        let answers = tokio::select! {
            r = tokio::time::timeout(left, answers(&asked, server, session.id, cx)) => r.map_err(|_| late())??,
            () = session.closed.cancelled() => return Err(lost()),
        };
        params.resume(answers, asked.request_state);
        round += 1;
    }
}

/// One round: `params` sent upstream with the client's `_meta` (and, to a server on
/// 2026-07-28, the client's capabilities), answered within `timeout`.
async fn send<P: Asking>(
    params: P,
    session: &Session,
    cx: &RequestContext<RoleServer>,
    timeout: Duration,
) -> Result<Answer<P::Done>, ServiceError> {
    let options = PeerRequestOptions::with_timeout(timeout).with_meta(request_meta(session, cx));
    let handle = session.peer.send_cancellable_request(params.into_request(), options).await?;
    // rmcp cancels the request at its own timeout; the guard, when this future is dropped.
    let mut abandoned = Abandoned::new(session.peer.clone(), handle.id.clone());
    let answer = handle.await_response().await;
    abandoned.answered();
    P::answer(answer?).ok_or(ServiceError::UnexpectedResponse)
}

/// Tells the server its request `id` is no longer wanted, when dropped before the answer.
pub struct Abandoned {
    peer: rmcp::Peer<rmcp::RoleClient>,
    id: Option<rmcp::model::RequestId>,
}

impl Abandoned {
    pub fn new(peer: rmcp::Peer<rmcp::RoleClient>, id: rmcp::model::RequestId) -> Self {
        Self { peer, id: Some(id) }
    }

    /// The answer came: nothing to cancel.
    pub fn answered(&mut self) {
        self.id = None;
    }
}

impl Drop for Abandoned {
    fn drop(&mut self) {
        let (Some(id), Ok(runtime)) = (self.id.take(), tokio::runtime::Handle::try_current()) else { return };
        let peer = self.peer.clone();
        let reason = Some("the gateway no longer waits for it".to_owned());
        // Off the dropping path, and bounded: a server that stopped reading its input
        // would hold the write forever.
        runtime.spawn(async move {
            let cancel = peer.notify_cancelled(rmcp::model::CancelledNotificationParam::new(Some(id), reason));
            let _ = tokio::time::timeout(Duration::from_secs(1), cancel).await;
        });
    }
}

fn broken(server: &str, method: &str, what: &str) -> ErrorData {
    ErrorData::internal_error(format!("server `{server}` answered `{method}` with {what}"), None)
}

/// An error from a server's session, as the client is told it: the server's own error
/// as it is, anything else (a timeout, a lost connection) naming the server.
pub fn upstream_error(server: &str, e: ServiceError) -> ErrorData {
    match e {
        ServiceError::McpError(e) => e,
        other => ErrorData::internal_error(format!("server `{server}`: {other}"), None),
    }
}
/// The client's answers to every question of `asked`, put to the client of `cx` one by
/// one, for server `server`'s upstream session `session`.
pub async fn answers(
    asked: &InputRequiredResult,
    server: &str,
    session: u64,
    cx: &RequestContext<RoleServer>,
) -> Result<InputResponses, ErrorData> {
    let count = asked.input_requests.as_ref().map_or(0, |q| q.len());
    if count > MAX_QUESTIONS {
        return Err(ErrorData::invalid_params(
            format!(
                "server `{server}` asked {count} questions at once; the gateway puts at most {MAX_QUESTIONS} to a client"
            ),
            None,
        ));
    }
    let mut answers = InputResponses::new();
    for (key, question) in asked.input_requests.iter().flatten() {
        let request = match question.clone() {
            InputRequest::CreateMessage(r) => UpstreamRequest::Sampling(r.params),
            InputRequest::Elicitation(r) => UpstreamRequest::Elicitation(r.params),
            InputRequest::ListRoots(_) => UpstreamRequest::Roots,
            other => {
                let what = serde_json::to_value(&other).ok().and_then(|v| v["method"].as_str().map(str::to_owned));
                return Err(ErrorData::invalid_params(
                    format!(
                        "server `{server}` asked its client `{}`, which no revision lets it ask",
                        what.unwrap_or_default()
                    ),
                    None,
                ));
            }
        };
        let request = to_client(request, &cx.peer, server)?;
        let asker = Asker { session, during: None, cancel: cx.ct.clone(), task: None };
        let answer = ask(cx.peer.clone(), request, Some(cx.id.clone()), asker).await?;
        let answer = serde_json::to_value(answer)
            .map_err(|e| ErrorData::internal_error(format!("the client's answer cannot be passed on: {e}"), None))?;
        answers.insert(key.clone(), answer);
    }
    Ok(answers)
}
