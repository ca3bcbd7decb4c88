//! One attempt at a tool call on an upstream session: the request with its timeout,
//! progress remapped to the client's token, and cancellation passed on in both cases.

use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResponse, CancelledNotificationParam, ClientRequest,
    InputRequiredResult, InputResponses, JsonObject, RequestId, RequestMetaObject, ServerResult,
};
use rmcp::service::{PeerRequestOptions, RequestContext, RequestHandle};
use rmcp::{RoleClient, RoleServer, ServiceError};

use super::hub::offered;
use super::input;
use super::routing::{CallGuard, ProgressTo, Routing};
use super::server::task_owner;
use super::tasks::Relayed;
use super::tasks::relayed::{Origin, cancel_upstream as cancel_task_upstream};
use crate::recovery::Failure;
use crate::transport::ServerHandle;
use crate::transport::Session;
use crate::transport::http_client::SendError;
use crate::transport::lines::CANCEL_WRITE;

/// How to make one attempt.
#[derive(Debug, Clone, Copy)]
pub struct Attempt<'a> {
    /// Passed on in `_meta.traceparent` when the call is traced (`crate::telemetry`).
    pub traceparent: Option<&'a str>,
    pub timeout: Duration,
    /// The most the attempt may take, progress or not: what is left of the call's deadline.
    pub max_total: Duration,
    pub progress_extends_timeout: bool,
    /// How long the server has to answer a `ping` once the attempt timed out, before it is
    /// restarted (`Session::probe`); zero: it is not asked.
    pub ping_within: Duration,
    /// Whether this is the tool the client called (not an alternative or a side call):
    /// only its questions may go to a 2026-07-28 client as they are.
    pub called: bool,
    /// A 2026-07-28 client's answers to the server's questions, and the server's state,
    /// when it calls again.
    pub resume: Option<&'a Resume>,
}

/// What a 2026-07-28 client sends back with a call the server answered with questions.
#[derive(Debug, Clone)]
pub struct Resume {
    pub answers: Option<InputResponses>,
    pub state: Option<String>,
}

/// Calls `tool` on `session` once. A successful answer with `isError: true` is a
/// [`Failure::ToolError`]. A server on 2026-07-28 may answer with questions for the
/// client instead: a client on that revision gets them as they are (and calls again with
/// its answers, which `how.resume` passes on); an older client is asked them as requests
/// it knows (`super::input`) and the server is called again, within the same deadline.
#[allow(clippy::too_many_arguments)]
pub async fn attempt(
    routing: &Routing,
    server: &Arc<ServerHandle>,
    session: &Arc<Session>,
    tool: &str,
    arguments: Option<JsonObject>,
    how: Attempt<'_>,
    cx: &RequestContext<RoleServer>,
    call: &CallGuard,
) -> Result<CallToolResponse, Failure> {
    let mut params = CallToolRequestParams::new(tool.to_owned());
    params.arguments = arguments;
    if let Some(resume) = how.resume {
        params.input_responses = resume.answers.clone();
        params.request_state = resume.state.clone();
    }
    let modern_client = input::client_is_asked(cx);
    // Only a server on 2026-07-28 asks questions, and then is called again with the same
    // arguments: only for it are they kept (copied) past the first request.
    let asks = input::server_asks(session);
    let deadline = tokio::time::Instant::now() + how.max_total;
    let (mut round, mut served) = (0, Duration::ZERO);
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let this = Attempt { timeout: how.timeout.min(left), max_total: left, ..how };
        // (A server that does not ask is called once: its request takes the params.)
        let sent = if asks { params.clone() } else { std::mem::replace(&mut params, CallToolRequestParams::new("")) };
        let began = tokio::time::Instant::now();
        let exchanged = match exchange(routing, session, sent, this, cx, call).await {
            // The server had the call in the rounds before this one too.
            Err(Failure::Timeout { after }) => Err(Failure::Timeout { after: after + served }),
            other => other,
        };
        served += began.elapsed();
        let answer = match exchanged? {
            // A task of the tool called, for a client that can take it (see `tasks::relayed`).
            ServerResult::CreateTaskResult(created) if declares_tasks(cx, how.called) => {
                let owner = task_owner(cx);
                let origin =
                    Origin { server: &session.server, tool, instance: server.instance, session, owner, legacy: false };
                return routing.relayed.keep(created, origin).map(CallToolResponse::Task);
            }
            // Made without being asked: nobody could follow it.
            ServerResult::CreateTaskResult(created) => {
                cancel_task_upstream(session, &created.task.task_id);
                let reason = "tools/call was answered with a task the request did not declare it could take".into();
                return Err(Failure::Protocol { reason });
            }
            answer => answer,
        };
        let asked = match read_round(answer, asks, modern_client, how.called)? {
            Round::Done(response) => return Ok(response),
            Round::Asked(asked) => asked,
        };
        if round == input::MAX_ROUNDS {
            let reason = format!("the server still asked for input after {} rounds", input::MAX_ROUNDS);
            return Err(Failure::Protocol { reason });
        }
        let answers = client_answers(&asked, &server.name, session, cx, deadline, how.max_total).await?;
        params.input_responses = Some(answers);
        params.request_state = asked.request_state;
        round += 1;
    }
}

/// What one round of a call came to: its answer, or the server's questions for the client.
enum Round {
    Done(CallToolResponse),
    Asked(InputRequiredResult),
}

/// Reads the server's answer to one round. Questions belong to 2026-07-28: from a server
/// on an older revision (`asks` false) they are a broken answer, like any other that is
/// not a tool result; a 2026-07-28 client gets the called tool's questions as they are.
fn read_round(answer: ServerResult, asks: bool, modern_client: bool, called: bool) -> Result<Round, Failure> {
    match answer {
        ServerResult::CallToolResult(result) if result.is_error == Some(true) => {
            Err(Failure::ToolError { result: Box::new(result) })
        }
        ServerResult::CallToolResult(result) => Ok(Round::Done(result.into())),
        ServerResult::InputRequiredResult(_) if !asks => Err(Failure::Protocol {
            reason: "tools/call was answered with questions (InputRequiredResult) by a server on a revision before 2026-07-28".into(),
        }),
        ServerResult::InputRequiredResult(asked) if modern_client && called => {
            Ok(Round::Done(CallToolResponse::InputRequired(asked)))
        }
        ServerResult::InputRequiredResult(_) if modern_client => {
            let reason = "a tool other than the one called asked for input; only the called tool's questions are passed on";
            Err(Failure::Unanswered { reason: reason.to_owned() })
        }
        ServerResult::InputRequiredResult(asked) => Ok(Round::Asked(asked)),
        other => Err(Failure::Protocol { reason: format!("tools/call was answered with {}", variant_name(&other)) }),
    }
}

/// Asks an older client the server's questions (`super::input`) and returns its answers.
/// The client's answers and the server's next round both come out of what is left of the
/// call's `deadline`; the time the client took is not the server's, so an answer that
/// leaves nothing is as good as none.
async fn client_answers(
    asked: &InputRequiredResult,
    server: &str,
    session: &Session,
    cx: &RequestContext<RoleServer>,
    deadline: tokio::time::Instant,
    max_total: Duration,
) -> Result<InputResponses, Failure> {
    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
    let answers = match tokio::time::timeout(left, input::answers(asked, server, session.id, cx)).await {
        Ok(Ok(answers)) => answers,
        _ if cx.ct.is_cancelled() => return Err(Failure::Cancelled),
        Ok(Err(e)) => return Err(Failure::Unanswered { reason: e.message.into_owned() }),
        Err(_) => {
            let reason = format!("the call's deadline ({} ms) passed first", max_total.as_millis());
            return Err(Failure::Unanswered { reason });
        }
    };
    if deadline <= tokio::time::Instant::now() {
        let reason = format!("the answers took the rest of the call's deadline ({} ms)", max_total.as_millis());
        return Err(Failure::Unanswered { reason });
    }
    Ok(answers)
}

/// Sends `params` as a `tools/call` on `session` and waits for its answer, within `how`.
async fn exchange(
    routing: &Routing,
    session: &Session,
    params: CallToolRequestParams,
    how: Attempt<'_>,
    cx: &RequestContext<RoleServer>,
    call: &CallGuard,
) -> Result<ServerResult, Failure> {
    let options = request_options(routing, session, how, cx);
    let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
    // A server that stops reading its input stops rmcp's writer, and then sending can wait
    // forever: handing the request over is bounded by the attempt's timeout. A request
    // that could not be handed over was never sent, so it may be retried; the server is
    // restarted.
    let handle = tokio::select! {
        biased;
        // Cancelled before it was sent: it never will be.
        () = cx.ct.cancelled() => return Err(Failure::Cancelled),
        r = hand_over(session, request, options, how.timeout) => match r {
            // rmcp's loop is gone: the request was never queued.
            Some(Err(ServiceError::TransportClosed)) => return Err(lost_before_sent()),
            Some(sent) => sent.map_err(from_service_error)?,
            None => return Err(Failure::SendFailed { reason: unread(how.timeout) }),
        },
        () = session.closed.cancelled() => return Err(lost_before_sent()),
    };
    let token = handle.progress_token.clone();
    call.sent(session.id, handle.id.clone());
    let to = ProgressTo::of(cx, cx.meta.get_progress_token()).zip(call.client.as_ref());
    let mapped = to.is_some_and(|to| {
        routing.map_progress(session.id, token.clone(), to);
        true
    });
    let outcome = answer(session, handle, how, cx, call).await;
    if mapped && let Some(progress) = routing.unmap_progress(session.id, &token) {
        progress.flush().await;
    }
    outcome
}

/// The options of a request made upstream within `how`: its timeouts and its `_meta`.
fn request_options(
    routing: &Routing,
    session: &Session,
    how: Attempt<'_>,
    cx: &RequestContext<RoleServer>,
) -> PeerRequestOptions {
    let tasks = if how.called { Tasks::IfRoom(&routing.relayed) } else { Tasks::No };
    let mut meta = request_meta(session, cx, tasks);
    if let Some(tp) = how.traceparent {
        meta.insert("traceparent".to_owned(), tp.into());
    }
    let options = PeerRequestOptions::with_timeout(how.timeout).with_meta(meta).with_max_total_timeout(how.max_total);
    if how.progress_extends_timeout { options.reset_timeout_on_progress() } else { options }
}

/// Waits for the answer to the request `handle` within `how.max_total`, passing the
/// client's cancellation on.
async fn answer(
    session: &Session,
    handle: RequestHandle<RoleClient>,
    how: Attempt<'_>,
    cx: &RequestContext<RoleServer>,
    call: &CallGuard,
) -> Result<ServerResult, Failure> {
    // rmcp sends `notifications/cancelled` when its timeout fires, and waits until it is
    // written. A server process's transport writes it on a task of its own, and ends the
    // session of a server that has not taken it within a second (`ServerLines`), so the
    // attempt ends at its timeout even behind a server that stopped reading; a `url`
    // server's is a request of its own. The call ends at its deadline regardless; past it
    // the cancel is left a moment more, off the call's path, and a server that has not
    // taken it by then is restarted.
    let id = handle.id.clone();
    let mut response = Box::pin(handle.await_response());
    // An answer in hand is the outcome, whatever else is ready at the same moment (a
    // server that answers and exits: its answer, not a lost connection).
    let outcome = tokio::select! {
        biased;
        r = tokio::time::timeout(how.max_total, &mut response) => match r {
            Ok(answered) => {
                if matches!(answered, Ok(_) | Err(ServiceError::McpError(_))) {
                    call.answered();
                }
                answered.map_err(from_service_error)
            }
            Err(_) => {
                let kicker = session.kicker();
                tokio::spawn(async move {
                    if tokio::time::timeout(CANCEL_WRITE, response).await.is_err() {
                        kicker.kick(&unread(CANCEL_WRITE));
                    }
                });
                Err(Failure::Timeout { after: how.max_total })
            }
        },
        () = cx.ct.cancelled() => {
            cancel_upstream(session, id, why_cancelled(cx));
            Err(Failure::Cancelled)
        }
        () = session.closed.cancelled() => Err(Failure::ConnectionLost {
            reason: "the server stopped while the call was in flight".into(),
            session: Some(session.id),
        }),
    };
    // Lost in flight: if the session ended too, it is named, so that the breakers count
    // every call lost with it as one failure; otherwise (a `url` server's response stream
    // cut short) the call fails alone.
    let outcome = match outcome {
        Err(Failure::ConnectionLost { reason, session: None }) if lost_with(session).await => {
            Err(Failure::ConnectionLost { reason, session: Some(session.id) })
        }
        other => other,
    };
    // Timed out, by rmcp's timer of the attempt or ours of the call: does it still answer?
    if matches!(outcome, Err(Failure::Timeout { .. })) {
        session.probe(how.ping_within, call.others_in_flight(session.id));
    }
    outcome
}

/// The `_meta` of a request made upstream for the request of `cx`: the client's own, but
/// for the protocol's keys, which describe the client's revision, not this connection's
/// (rmcp puts its own progress token in). A server on 2026-07-28 is told, on each
/// request, what the client that made it can answer: exactly that client's capabilities
/// (over stdio and HTTP alike), but for the tasks extension, declared as `tasks` says.
pub(super) fn request_meta(session: &Session, cx: &RequestContext<RoleServer>, tasks: Tasks<'_>) -> RequestMetaObject {
    let mut meta = RequestMetaObject::default();
    for (key, value) in cx.meta.iter().filter(|(k, _)| !k.starts_with(PROTOCOL_KEYS)) {
        meta.insert(key.clone(), value.clone());
    }
    if input::server_asks(session) {
        let caps = cx.client_capabilities().unwrap_or_default();
        let mut told = offered(&caps, None).caps;
        let declared = caps.supports_tasks()
            && input::client_is_asked(cx)
            && match tasks {
                Tasks::No => false,
                Tasks::Yes => true,
                Tasks::IfRoom(relayed) => relayed.has_room(task_owner(cx).as_deref()),
            };
        if declared {
            told.extensions.clone_from(&caps.extensions);
        }
        meta.set_client_capabilities(told);
    }
    meta
}

/// Whether a request made upstream declares the tasks extension, for a client on
/// 2026-07-28 that declared it (see `tasks::relayed`).
#[derive(Clone, Copy)]
pub(super) enum Tasks<'a> {
    /// Never: a task made for it would reach nobody.
    No,
    /// A request about a task the client has (`tasks/*`).
    Yes,
    /// A call of the tool called, while `relayed` has room for one more of the client's.
    IfRoom(&'a Relayed),
}

/// Whether a request of the client of `cx`, made `for_client` (see [`request_meta`]),
/// declares the tasks extension upstream: the client is on 2026-07-28 and declared it.
pub(super) fn declares_tasks(cx: &RequestContext<RoleServer>, for_client: bool) -> bool {
    for_client && input::client_is_asked(cx) && cx.client_capabilities().is_some_and(|c| c.supports_tasks())
}

/// The prefix of the `_meta` keys MCP reserves for itself (revision, client, capabilities,
/// log level): the gateway's connection to the server sets its own.
pub(super) const PROTOCOL_KEYS: &str = "io.modelcontextprotocol/";

/// Why the client's request of `cx` was cancelled, as its server is told: by the client,
/// unless it is a held call the gateway gave up on (`super::held`).
pub(super) fn why_cancelled(cx: &RequestContext<RoleServer>) -> &'static str {
    cx.extensions.get::<super::held::Bridge>().map_or(super::held::BY_THE_CLIENT, |b| b.why_cancelled())
}

/// Tells `session`'s server its request `id` is no longer wanted, off the caller's path.
/// The write may wait behind a server that stopped reading its input: a server process
/// that has not taken it within [`CANCEL_WRITE`] is restarted (`Session::kicker`).
pub(super) fn cancel_upstream(session: &Session, id: RequestId, reason: &str) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
    let (peer, kicker, reason) = (session.peer.clone(), session.kicker(), Some(reason.to_owned()));
    runtime.spawn(async move {
        let cancel = peer.notify_cancelled(CancelledNotificationParam::new(Some(id), reason));
        if tokio::time::timeout(CANCEL_WRITE, cancel).await.is_err() {
            kicker.kick(&unread(CANCEL_WRITE));
        }
    });
}

/// Hands `request` to `session`'s writer, waiting at most `within`: `None` when the server
/// has not read its input for that long. The request was then never sent (a retry is
/// safe), and a server process is restarted (`Session::kicker`).
pub(super) async fn hand_over(
    session: &Session,
    request: ClientRequest,
    options: PeerRequestOptions,
    within: Duration,
) -> Option<Result<RequestHandle<RoleClient>, ServiceError>> {
    let sent = tokio::time::timeout(within, session.peer.send_cancellable_request(request, options)).await;
    if sent.is_err() {
        session.kicker().kick(&unread(within));
    }
    sent.ok()
}

/// Why a server that did not take what it was sent within `waited` is restarted. A
/// request not handed over in time was never sent, so a retry is safe.
pub(super) fn unread(waited: Duration) -> String {
    format!("the server did not read its input for {} ms", waited.as_millis())
}

/// How long a call whose connection was lost waits to hear whether its session was
/// lost with it: the supervisor says so the moment it sees the connection end.
const SESSION_LOSS_HEARD: Duration = Duration::from_millis(50);

/// Whether `session` is lost: rmcp's loop has ended, or its supervisor says so within a
/// moment.
async fn lost_with(session: &Session) -> bool {
    session.peer.is_transport_closed()
        || tokio::time::timeout(SESSION_LOSS_HEARD, session.closed.cancelled()).await.is_ok()
}

/// A call whose session was lost before its request was handed over: never sent, and
/// the server is restarting.
fn lost_before_sent() -> Failure {
    let reason = Some("the connection was lost before the call was sent".into());
    Failure::Unavailable { status: crate::transport::Status::Restarting, reason }
}

pub(super) fn from_service_error(e: ServiceError) -> Failure {
    match e {
        ServiceError::McpError(e) => Failure::Rpc { code: e.code.0, message: e.message.into_owned(), data: e.data },
        ServiceError::Timeout { timeout: after } => Failure::Timeout { after },
        ServiceError::TransportClosed => {
            Failure::ConnectionLost { reason: "the connection closed".into(), session: None }
        }
        // A `url` server's POST may fail after the request reached it: only a connection
        // never made proves it was not.
        ServiceError::TransportSend(e) => match SendError::of(&*e.error) {
            None => Failure::SendFailed { reason: e.to_string() },
            Some(SendError::NotConnected(reason)) => Failure::SendFailed { reason },
            Some(SendError::Refused { status, retry_after }) => Failure::HttpStatus { status, retry_after },
            Some(SendError::Interrupted(reason)) => Failure::ConnectionLost { reason, session: None },
            Some(SendError::Unreadable(reason)) => Failure::Protocol { reason },
        },
        ServiceError::Cancelled { .. } => Failure::Cancelled,
        other => Failure::Protocol { reason: other.to_string() },
    }
}

fn variant_name(result: &ServerResult) -> String {
    serde_json::to_value(result)
        .ok()
        .and_then(|v| v.as_object().map(|o| o.keys().cloned().collect::<Vec<_>>().join(",")))
        .map(|keys| format!("a result with keys [{keys}]"))
        .unwrap_or_else(|| "an unexpected result".to_owned())
}
