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
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};

use super::call::{Tasks, request_meta};
use super::forward::{Fault, Instance, Out};
use super::routing::{ask, to_client};
use super::server::Gateway;
use crate::recovery::Failure;
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

/// Sends `params` to `to` for the client of `cx`, and settles the server's questions as
/// `super::call::attempt` does for a tool: a client on 2026-07-28 gets them as they are
/// (and sends its answers back itself); an older client is asked them as requests it
/// knows, and the server is asked again, at most [`MAX_ROUNDS`] times, all within
/// `limits`. A server on an older revision that answers with questions gives a broken
/// answer. Each round is forwarded as `super::forward` says: given up on, it is cancelled
/// upstream.
pub async fn settle<P: Asking>(
    gateway: &Gateway,
    mut params: P,
    to: &Instance,
    cx: &RequestContext<RoleServer>,
    limits: Limits,
) -> Result<Answer<P::Done>, ErrorData> {
    let (session, server) = (&to.session, &*to.session.server);
    let late = || {
        let ms = limits.deadline.as_millis();
        ErrorData::internal_error(format!("server `{server}`: `{}` took longer than its {ms} ms", P::METHOD), None)
    };
    let broken = |what: &str| {
        let reason = format!("server `{server}` answered `{}` with {what}", P::METHOD);
        gateway.request_failed(server, P::METHOD, &Failure::Protocol { reason: reason.clone() });
        ErrorData::internal_error(reason, None)
    };
    let mut round = 0;
    loop {
        let left = limits.until.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return Err(late());
        }
        let timeout = limits.timeout.min(left);
        let out = Out {
            method: P::METHOD,
            request: params.clone().into_request(),
            meta: Some(request_meta(session, cx, Tasks::No)),
            hand_over: timeout,
            answer_within: Some(timeout),
            logged: true,
        };
        // The round ends at the deadline, however its time was spent: the server's, when
        // the deadline came while it had the request. (The time a client takes to answer
        // the server's questions is not the server's failure.)
        let answer = tokio::time::timeout(left, gateway.forward(to, out, cx)).await.map_err(|_| {
            gateway.request_failed(server, P::METHOD, &Failure::Timeout { after: left });
            late()
        })?;
        let answer = answer.map_err(|f| f.into_error(server))?;
        let asked = match P::answer(answer) {
            None => return Err(broken("something else")),
            Some(Answer::Asked(_)) if !server_asks(session) => {
                return Err(broken("questions, which only a server on 2026-07-28 may ask"));
            }
            Some(Answer::Asked(asked)) if client_is_asked(cx) => return Ok(Answer::Asked(asked)),
            Some(Answer::Asked(_)) if round == MAX_ROUNDS => {
                return Err(broken(&format!("questions still after {MAX_ROUNDS} rounds")));
            }
            Some(Answer::Asked(asked)) => asked,
            Some(done) => return Ok(done),
        };
        let left = limits.until.saturating_duration_since(tokio::time::Instant::now());
        // The server's connection lost meanwhile: its questions are moot.
        let answers = tokio::select! {
            r = tokio::time::timeout(left, answers(&asked, server, session.id, cx)) => r.map_err(|_| late())??,
            () = session.closed.cancelled() => return Err(Fault::Lost.into_error(server)),
        };
        params.resume(answers, asked.request_state);
        round += 1;
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
