//! MCP 2025-11-25's tasks through the gateway: a client's task-augmented `tools/call`
//! goes to the tool's server as it is, and the task it creates is remembered as this
//! client session's, with the server instance that holds it. `tasks/get`, `tasks/result`
//! and `tasks/cancel` go to that instance; `tasks/list` answers with this session's tasks
//! only, whatever else the server holds. Task ids are the server's own.
//!
//! A task whose server instance is lost (a crash, a restart) cannot be finished by the
//! next instance, which never heard of it: from then on the gateway answers for it as
//! `failed`, tells the client with `notifications/tasks/status`, and writes the errors
//! log, unless the client had already seen it end.
//!
//! rmcp's types do not carry these messages (it models the later tasks extension), so
//! they travel as custom requests with their params as sent; see `transport::tasks`.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rmcp::model::{
    ClientRequest, CustomNotification, CustomRequest, CustomResult, ListToolsResult, RequestMetaObject,
    ServerNotification, ServerResult,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, Peer, RoleServer};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use self::kept::{Origin, Started};
use super::call::PROTOCOL_KEYS;
use super::catalogue::Catalogue;
use super::forward::{Fault, Instance, Out};
use super::routing::{CallGuard, ClientPeer};
use super::server::Gateway;
use crate::recovery::engine::{AttemptRecord, Record, Role};
use crate::recovery::{Failure, classify::classify};
use crate::transport::Session;
use crate::transport::tasks::TaskSupport;
use crate::transport::upstream::RELATED_TASK;

/// The methods of tasks (MCP 2025-11-25).
pub use crate::transport::tasks::METHODS;
pub use kept::{MAX_TASKS, Tasks};
pub use relayed::Relayed;

mod bridged;
mod kept;
pub(super) mod relayed;

/// The prefix of a method renamed on the HTTP front so that rmcp passes the request on
/// as it was sent (`http::tasks`).
pub const AS_SENT: &str = "rebound/as-sent/";

/// The longest task id the gateway keeps (a server's ids are opaque strings).
const MAX_ID_BYTES: usize = 1024;

/// `list` with each tool's `execution.taskSupport` as its server listed it, which rmcp's
/// `Tool` cannot carry: as it is when no tool has one.
pub fn with_task_support(list: ListToolsResult, catalogue: &Catalogue) -> ServerResult {
    if !catalogue.has_task_support() {
        return ServerResult::ListToolsResult(list);
    }
    let Ok(mut value) = serde_json::to_value(&list) else { return ServerResult::ListToolsResult(list) };
    for tool in value["tools"].as_array_mut().into_iter().flatten() {
        if let Some(support) = tool["name"].as_str().and_then(|name| catalogue.task_support(name)) {
            tool["execution"] = json!({"taskSupport": support});
        }
    }
    ServerResult::CustomResult(CustomResult(value))
}

/// MCP 2025-11-25's `tasks` capability, which rmcp's `ServerCapabilities` cannot carry:
/// task-augmented `tools/call`, `tasks/list` and `tasks/cancel` (the rest is implied).
pub fn capability() -> Value {
    json!({"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}})
}

fn object(params: Option<Value>) -> Result<Value, ErrorData> {
    match params {
        Some(p @ Value::Object(_)) => Ok(p),
        None => Ok(json!({})),
        Some(_) => Err(ErrorData::invalid_params("params must be an object", None)),
    }
}

/// Whether a request read as a custom one (its `_meta` left in `params` over stdio) comes
/// from a client on 2026-07-28, which has its own tasks (`relayed`).
fn from_modern_client(params: Option<&Value>, cx: &RequestContext<RoleServer>) -> bool {
    let sent = params.and_then(|p| p["_meta"].get("io.modelcontextprotocol/protocolVersion"));
    let sent = sent.and_then(|v| serde_json::from_value::<rmcp::model::ProtocolVersion>(v.clone()).ok());
    super::input::client_is_asked(cx) || sent.is_some_and(|v| !v.has_initialize())
}

fn task_id(params: &Value) -> Result<String, ErrorData> {
    params["taskId"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| ErrorData::invalid_params("`taskId` (a string) is required", None))
}

/// Sends `method` with `params` as they are to `to` (`super::forward`: while it is out it
/// counts as the client's request in flight there), answered within the server's
/// `recovery.timeout_ms`, or, when `runs`, as long as the task runs.
async fn forward(
    gateway: &Gateway,
    to: &Instance,
    method: &str,
    params: Value,
    runs: bool,
    cx: &RequestContext<RoleServer>,
) -> Result<Value, Fault> {
    Ok(as_value(gateway.forward(to, as_sent(gateway, to, method, params, runs, cx), cx).await?)?)
}

/// `method` with `params`, to be sent as they are, with the client's `_meta`: wherever
/// it came (left in the params over stdio, taken out of them by rmcp over HTTP), but for
/// the keys that describe the client's revision, not this connection's (see
/// `call::request_meta`); the related task is the task's.
fn as_sent<'a>(
    gateway: &Gateway,
    to: &Instance,
    method: &'a str,
    mut params: Value,
    runs: bool,
    cx: &RequestContext<RoleServer>,
) -> Out<'a> {
    let timeout = gateway.limits(&to.session.server).timeout;
    let sent = params.as_object_mut().and_then(|p| p.remove("_meta"));
    let sent = sent.as_ref().and_then(Value::as_object).into_iter().flatten();
    let mut meta = RequestMetaObject::default();
    for (key, value) in cx.meta.iter().chain(sent) {
        if !key.starts_with(PROTOCOL_KEYS) || key == RELATED_TASK {
            meta.insert(key.clone(), value.clone());
        }
    }
    Out {
        method,
        request: ClientRequest::CustomRequest(CustomRequest::new(method, Some(params))),
        meta: Some(meta),
        hand_over: timeout,
        answer_within: (!runs).then_some(timeout),
        logged: false,
    }
}

/// An answer to a request sent as it was, as it came.
fn as_value(answer: ServerResult) -> Result<Value, ErrorData> {
    match answer {
        ServerResult::CustomResult(CustomResult(value)) => Ok(value),
        other => serde_json::to_value(other).map_err(|e| ErrorData::internal_error(e.to_string(), None)),
    }
}

/// Asks `session`'s server to cancel task `id`, which the gateway will not keep: nobody
/// could reach it. Off the caller's path, bounded; not at all once the runtime is gone.
/// `aside` keeps what the server says meanwhile from any client
/// ([`super::routing::Routing::aside`]).
fn cancel_upstream(session: &Session, id: &str, aside: Option<CallGuard>) {
    let request = CustomRequest::new("tasks/cancel", Some(json!({"taskId": id})));
    send_apart(session, ClientRequest::CustomRequest(request), aside);
}

/// Sends `request` to `session`'s server on a task of its own, its answer waited for at
/// most 5 s and not read; not at all once the runtime is gone. `aside` is held as long.
fn send_apart(session: &Session, request: ClientRequest, aside: Option<CallGuard>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
    let peer = session.peer.clone();
    runtime.spawn(async move {
        let sent = tokio::time::timeout(Duration::from_secs(5), peer.send_request(request)).await;
        if let (Ok(_), Some(aside)) = (sent, aside) {
            aside.answered();
        }
    });
}

impl Gateway {
    /// A request the HTTP front passed on as it was sent (see [`AS_SENT`]): a tool list
    /// with each tool's task support, or a request about tasks.
    pub(super) async fn as_sent(
        &self,
        method: &str,
        params: Option<Value>,
        cx: RequestContext<RoleServer>,
    ) -> Result<CustomResult, ErrorData> {
        if method == "tools/list" {
            let params = params.map(serde_json::from_value).transpose().map_err(|e| {
                ErrorData::invalid_params(
                    format!("Invalid params: the `params` of `tools/list` are not what it takes: {e}"),
                    None,
                )
            })?;
            let list = rmcp::ServerHandler::list_tools(self, params, cx).await?;
            return Ok(match with_task_support(list, &self.own.catalogue()) {
                ServerResult::CustomResult(r) => r,
                other => CustomResult(
                    serde_json::to_value(other).map_err(|e| ErrorData::internal_error(e.to_string(), None))?,
                ),
            });
        }
        self.task_request(method, params, &cx).await.unwrap_or_else(|| {
            Err(ErrorData::new(
                rmcp::model::ErrorCode::METHOD_NOT_FOUND,
                format!("Method not found: `{method}` is not a method this gateway serves"),
                None,
            ))
        })
    }

    /// A request about tasks (or a task-augmented `tools/call`), or `None` for a method
    /// that is not one.
    pub(super) async fn task_request(
        &self,
        method: &str,
        params: Option<Value>,
        cx: &RequestContext<RoleServer>,
    ) -> Option<Result<CustomResult, ErrorData>> {
        // A client on 2026-07-28 has tasks of its own (`relayed`), whose `tasks/get` and
        // `tasks/cancel` rmcp reads (`transport::typed` leaves them to it); 2025-11-25's
        // `tasks/result` and `tasks/list` are gone from that revision.
        if from_modern_client(params.as_ref(), cx) {
            return matches!(method, "tasks/result" | "tasks/list").then(|| {
                Err(ErrorData::new(
                    rmcp::model::ErrorCode::METHOD_NOT_FOUND,
                    format!("Method not found: `{method}` is not a method of MCP 2026-07-28"),
                    None,
                ))
            });
        }
        let answer = match method {
            "tools/call" => {
                let params = object(params).ok().filter(|p| !p["task"].is_null())?;
                self.start_task(params, cx).await
            }
            "tasks/get" | "tasks/cancel" => match object(params) {
                Ok(params) => self.about_task(method, params, cx).await,
                Err(e) => Err(e),
            },
            "tasks/result" => match object(params) {
                Ok(params) => self.task_result(params, cx).await,
                Err(e) => Err(e),
            },
            "tasks/list" => Ok(self.list_tasks(cx).await),
            _ => return None,
        };
        Some(answer.map(CustomResult))
    }

    /// A task-augmented call: to the tool's server as it is, the task it creates noted.
    async fn start_task(&self, mut params: Value, cx: &RequestContext<RoleServer>) -> Result<Value, ErrorData> {
        self.ready(cx).await?;
        let name = params["name"]
            .as_str()
            .ok_or_else(|| ErrorData::invalid_params("`name` (a string) is required", None))?
            .to_owned();
        if !self.own.catalogue().task_support(&name).is_some_and(TaskSupport::allows_tasks) {
            return Err(ErrorData::new(
                rmcp::model::ErrorCode::METHOD_NOT_FOUND,
                format!("tool `{name}` cannot run as a task: its server does not list it with task support"),
                None,
            ));
        }
        let (server, upstream_name, to) = self.task_upstream(&name, cx).await?;
        params["name"] = Value::String(upstream_name);
        self.own.tasks.room()?;
        // The task's progress comes as long as it runs: its route is kept with the task.
        let out = as_sent(self, &to, "tools/call", params, false, cx);
        let (answer, progress) = match self.forward_keeping_progress(&to, out, cx).await {
            Ok((answer, progress)) => (as_value(answer)?, progress),
            Err(Fault::Lost) => {
                return Err(ErrorData::internal_error(
                    format!("server `{server}`: the connection was lost; the task may or may not have been created"),
                    None,
                ));
            }
            Err(Fault::Error(e)) => return Err(e),
        };
        let Some(id) = answer["task"]["taskId"].as_str() else {
            // Answered at once, with no task: its progress came before this.
            if let Some(progress) = progress {
                progress.end().await;
            }
            return Ok(answer);
        };
        if id.len() > MAX_ID_BYTES {
            cancel_upstream(&to.session, id, Some(self.hub.routing.aside(to.instance)));
            return Err(ErrorData::internal_error(
                format!(
                    "server `{server}` created a task whose id is longer than {MAX_ID_BYTES} bytes, which the gateway does not keep"
                ),
                None,
            ));
        }
        self.given_again(&server, &to, id)?;
        let origin = Origin { server, instance: to.instance, session: to.session.clone(), tool: name, progress };
        if let Err(refused) = self.note_task(id, &answer["task"], origin, cx.peer.clone()) {
            cancel_upstream(&to.session, id, Some(self.hub.routing.aside(to.instance)));
            return Err(refused);
        }
        Ok(answer)
    }

    /// The server of `to` has given the id `id` to a new task. A task the gateway keeps
    /// under it (a 2025-11-25 session's, or one bridged for a 2026-07-28 client) is no
    /// longer reachable by its client: the id is the new task's now. A session's task
    /// still running (a server restarted that numbers its tasks afresh, or one that
    /// gives an id twice) cannot be told from the new one, whose statuses and questions
    /// would reach its client, so neither is kept: the new one is cancelled on the
    /// server, and refused. (A bridged task's client only polls: it is forgotten.)
    pub(super) fn given_again(&self, server: &str, to: &Instance, id: &str) -> Result<(), ErrorData> {
        let routing = &self.hub.routing;
        routing.relayed.forget_upstream(server, &to.session, id);
        if !routing.disown_task(to.session.id, id) {
            return Ok(());
        }
        cancel_upstream(&to.session, id, Some(routing.aside(to.instance)));
        Err(ErrorData::internal_error(
            format!(
                "server `{server}` created task `{id}` under the id of a task it was running already (restarted, or giving one id twice): the gateway cannot tell them apart, so it cancelled the new one and keeps neither; call again"
            ),
            None,
        ))
    }

    /// The server of the tool the client calls `name`, the tool's name there, and the
    /// server's instance, for a task-augmented call: refused for a server that takes none.
    /// The wait for a server restarting ends with the client's cancellation.
    pub(super) async fn task_upstream(
        &self,
        name: &str,
        cx: &RequestContext<RoleServer>,
    ) -> Result<(Arc<str>, String, Instance), ErrorData> {
        let catalogue = self.own.catalogue();
        let (route, _) =
            catalogue.tool(name).ok_or_else(|| ErrorData::invalid_params(format!("unknown tool `{name}`"), None))?;
        let server = route.server.clone();
        let within = self.limits(&server).timeout;
        let to = super::answered::until_cancelled(&cx.ct, self.upstream(&server, within)).await??;
        if !to.session.dropped.task_calls() {
            return Err(ErrorData::new(
                rmcp::model::ErrorCode::METHOD_NOT_FOUND,
                format!("server `{server}` does not take task-augmented calls (no `tasks.requests.tools.call`)"),
                None,
            ));
        }
        Ok((server, route.name.clone(), to))
    }

    /// Remembers task `id` (`created`, from `origin`) as this session's (see
    /// [`Tasks::keep`]), and watches its instance.
    fn note_task(&self, id: &str, created: &Value, origin: Origin, peer: Peer<RoleServer>) -> Result<(), ErrorData> {
        let closed = origin.session.closed.clone();
        let routing = &self.hub.routing;
        let owner = ClientPeer { client: self.own.client.clone(), peer: peer.clone() };
        let own = |o: &Origin, ended: &CancellationToken| routing.own_task(o.session.id, id, owner, ended.clone());
        let task = self.own.tasks.keep(id, created, origin, own)?;
        // The session, not kept alive by its tasks: its going forgets them (`Tasks::drop`).
        let (hub, own, id) = (self.hub.clone(), Arc::downgrade(&self.own), id.to_owned());
        tokio::spawn(async move {
            tokio::select! {
                () = closed.cancelled() => {
                    if let Some(own) = own.upgrade() {
                        Gateway { hub, own }.task_lost(&id, &task, peer);
                    }
                }
                () = task.settled.cancelled() => {}
            }
            task.stop_progress();
        });
        Ok(())
    }

    /// `task`'s instance is gone. The first time, the client is told and the errors log
    /// says so; a task the client had seen end is forgotten instead. The task as the
    /// gateway reports it from now on, unless forgotten.
    fn task_lost(&self, id: &str, task: &Started, peer: Peer<RoleServer>) -> Option<Value> {
        if task.lose() {
            if task.settled.is_cancelled() {
                self.own.tasks.forget(id);
            } else {
                self.report_lost(id, task, peer);
            }
        }
        if task.settled.is_cancelled() { None } else { task.lost_task(id) }
    }

    fn report_lost(&self, id: &str, task: &Started, peer: Peer<RoleServer>) {
        // Its id given to another task since, the loss may be of that one.
        if !task.owner.owns() {
            return;
        }
        let Some(status) = task.lost_task(id) else { return };
        let why = status["statusMessage"].as_str().unwrap_or_default().to_owned();
        tracing::warn!(server = %task.server, tool = %task.tool, task = id, "{why}");
        let record = lost_record(&task.server, &task.tool, id, &why);
        self.hub.errors.record(&record, &self.own.client, SystemTime::now());
        let note = CustomNotification::new("notifications/tasks/status", Some(status));
        let to = ClientPeer { client: self.own.client.clone(), peer };
        self.hub.downstreams.sending.send(&to, ServerNotification::CustomNotification(note));
    }

    /// `tasks/get` or `tasks/cancel`: to the task's instance, or answered for a lost task.
    async fn about_task(
        &self,
        method: &str,
        params: Value,
        cx: &RequestContext<RoleServer>,
    ) -> Result<Value, ErrorData> {
        let id = task_id(&params)?;
        let task = self.own.tasks.get(&id)?;
        if let Some(session) = task.live_session() {
            let to = Instance { instance: task.instance, session, held: None };
            match forward(self, &to, method, params, false, cx).await {
                Ok(answer) => {
                    task.saw(&answer["status"]);
                    return Ok(answer);
                }
                Err(Fault::Lost) => {}
                Err(Fault::Error(e)) => {
                    // The server no longer knows it (its time to live ran out): neither do we.
                    if method == "tasks/get" && e.code == rmcp::model::ErrorCode::INVALID_PARAMS {
                        self.own.tasks.forget(&id);
                    }
                    return Err(e);
                }
            }
        }
        match (method, self.task_lost(&id, &task, cx.peer.clone())) {
            ("tasks/get", Some(status)) => Ok(status),
            ("tasks/get", None) => Err(ended_then_stopped(&id)),
            _ => Err(ErrorData::invalid_params(
                format!("task `{id}` has already ended or failed: it cannot be cancelled"),
                None,
            )),
        }
    }

    /// `tasks/result`: waits on the task's instance for as long as the task runs (the
    /// client may cancel), or answers for a lost task with an error result.
    async fn task_result(&self, params: Value, cx: &RequestContext<RoleServer>) -> Result<Value, ErrorData> {
        let id = task_id(&params)?;
        let task = self.own.tasks.get(&id)?;
        if let Some(session) = task.live_session() {
            let to = Instance { instance: task.instance, session, held: None };
            match forward(self, &to, "tasks/result", params, true, cx).await {
                Ok(answer) => {
                    task.settled.cancel();
                    return Ok(answer);
                }
                Err(Fault::Lost) => {}
                Err(Fault::Error(e)) => return Err(e),
            }
        }
        // One the client saw end before its server stopped is unknown now, as `tasks/get`
        // says: its result went with the server.
        if self.task_lost(&id, &task, cx.peer.clone()).is_none() {
            return Err(ended_then_stopped(&id));
        }
        let why = task.lost().map(|(why, _)| why).unwrap_or_default();
        Ok(json!({
            "content": [{"type": "text", "text": format!("rebound: {why}")}],
            "isError": true,
            "_meta": {RELATED_TASK: {"taskId": id}},
        }))
    }

    /// `tasks/list`: this session's tasks, each as its instance reports it now (one page),
    /// asked a few at a time, each kept to a `Task`'s fields, all within [`LIST_WITHIN`]
    /// (one server that answers slowly would otherwise hold the list for 256 of its
    /// timeouts, 8 at a time): those not known by then are left out, and said to be.
    async fn list_tasks(&self, cx: &RequestContext<RoleServer>) -> Value {
        use futures::StreamExt as _;
        let ids: Vec<String> = self.own.tasks.all().into_iter().map(|(id, _)| id).collect();
        let asked = ids.len();
        // As they come (one slow server does not hold back the others'), in order after.
        let mut answers: Vec<(usize, Option<Value>)> = futures::stream::iter(ids.into_iter().enumerate())
            .map(|(n, id)| async move {
                let answer = self.about_task("tasks/get", json!({"taskId": id}), cx).await;
                (n, answer.ok().and_then(|t| task_fields(&t)))
            })
            .buffer_unordered(LIST_AT_ONCE)
            .take_until(tokio::time::sleep(LIST_WITHIN))
            .collect()
            .await;
        answers.sort_unstable_by_key(|(n, _)| *n);
        if answers.len() < asked {
            tracing::warn!(
                "tasks/list: {} of the session's {asked} tasks left out, their servers not answering within {} s",
                asked - answers.len(),
                LIST_WITHIN.as_secs()
            );
        }
        json!({"tasks": answers.into_iter().filter_map(|(_, task)| task).collect::<Vec<_>>()})
    }
}

/// The answer about task `id`, which the client saw end before its server stopped: its
/// status and result went with the server.
fn ended_then_stopped(id: &str) -> ErrorData {
    ErrorData::invalid_params(format!("unknown task `{id}`: it ended, and then its server stopped"), None)
}

/// The errors log's record of task `id` (a call of `tool` on `server`), lost with its
/// server instance: `why`.
fn lost_record(server: &Arc<str>, tool: &str, id: &str, why: &str) -> Record {
    let failure = Failure::ConnectionLost { reason: format!("task `{id}`: {why}"), session: None };
    Record {
        server: server.clone(),
        tool: tool.to_owned(),
        attempts: vec![AttemptRecord {
            server: server.clone(),
            tool: tool.to_owned(),
            role: Role::Primary,
            classification: Some(classify(&failure, SystemTime::now())),
            failure: Some(failure),
            waited: Duration::ZERO,
        }],
        safe: false,
        stopped: Some(format!("task `{id}` was lost with its server instance")),
        action: None,
        denied: Vec::new(),
        not_tried: Vec::new(),
        notes: 0,
    }
}

/// How many `tasks/get` one `tasks/list` has out at once.
const LIST_AT_ONCE: usize = 8;
/// How long one `tasks/list` asks its tasks' servers.
const LIST_WITHIN: Duration = Duration::from_secs(30);

/// A `Task`'s fields of `answer` (a `tasks/get` answer), its status message cut at
/// 4 KiB; `None` if it is not a task.
fn task_fields(answer: &Value) -> Option<Value> {
    const FIELDS: [&str; 7] =
        ["taskId", "status", "statusMessage", "createdAt", "lastUpdatedAt", "ttl", "pollInterval"];
    let answer = answer.as_object()?;
    answer.get("taskId")?.as_str()?;
    let mut task: serde_json::Map<String, Value> =
        FIELDS.iter().filter_map(|k| Some(((*k).to_owned(), answer.get(*k)?.clone()))).collect();
    if let Some(Value::String(message)) = task.get_mut("statusMessage") {
        crate::text::cap(message, 4096);
    }
    Some(Value::Object(task))
}
