//! What a server instance says on its own, relayed to the client sessions it concerns:
//! its notifications (`on_event`) and its requests (`on_request`, to the one client
//! `routing` names). One `HubRelay` per server instance, shared or a session's own.

// Logging is deprecated by 2026-07-28 (SEP-2577) but lives in every revision the gateway
// speaks; it is relayed faithfully.
#![allow(deprecated)]

use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::future::BoxFuture;
use rmcp::model::{
    ClientResult, CustomNotification, CustomRequest, CustomResult, LoggingMessageNotificationParam, Notification,
    ServerNotification, ServerRequest,
};
use rmcp::{ErrorData, Peer, RoleServer};
use serde_json::{Value, json};

use super::asked_tasks::{ABOUT_ONE, AskedTasks, Refused};
use super::downstreams::Front;
use super::hub::Hub;
use super::routing::{Caller, ClientPeer, MAX_ASKED, Routing, Serves, ask, to_client};
use crate::transport::supervisor::Trouble;
use crate::transport::tasks::ClientTaskRequest;
use crate::transport::upstream::RELATED_TASK;
use crate::transport::{Asker, Relay, UpstreamEvent, UpstreamRequest};

/// Forwards one server instance's traffic to the hub without keeping it alive.
pub struct HubRelay {
    pub hub: Weak<Hub>,
    pub instance: u64,
    /// The session a `session`-scoped instance belongs to; none for a shared server.
    pub owner: Option<Owner>,
}

/// The client session that owns a `session`-scoped server instance.
#[derive(Clone)]
pub struct Owner {
    pub client: Arc<str>,
    pub peer: Peer<RoleServer>,
    /// Told when the instance's listing changes.
    pub servers: Weak<super::session_servers::SessionServers>,
}

impl HubRelay {
    /// What a server said on its own (a notification): passed to the sessions it concerns.
    fn on_event(&self, hub: Arc<Hub>, server: &str, session: u64, event: UpstreamEvent) {
        match event {
            UpstreamEvent::Progress(p) => hub.routing.progress(session, p),
            UpstreamEvent::Log(log) => self.log(&hub, server, session, log),
            UpstreamEvent::ResourceUpdated(update) => hub.downstreams.resource_updated(self.instance, update),
            UpstreamEvent::Custom(n) => self.custom(&hub, server, session, n),
            UpstreamEvent::Cancelled(c) => {
                // rmcp has already cancelled the request the server gave up on.
                tracing::debug!(server, "server cancelled its request {:?}", c.request_id);
            }
            UpstreamEvent::ToolsChanged | UpstreamEvent::PromptsChanged | UpstreamEvent::ResourcesChanged => {
                self.relist(hub, server);
            }
        }
    }

    /// A server's log line, its logger prefixed with the server's name, to the client it
    /// concerns if that client's level takes it.
    fn log(&self, hub: &Hub, server: &str, session: u64, mut log: LoggingMessageNotificationParam) {
        log.logger = Some(match log.logger.take() {
            Some(l) => format!("{server}/{l}"),
            None => server.to_owned(),
        });
        let (to, wants) = match self.owner.as_ref() {
            Some(o) => {
                let wants = hub.downstreams.wants_log(&o.client, log.level);
                (Some(ClientPeer { client: o.client.clone(), peer: o.peer.clone() }), wants)
            }
            // Over HTTP a shared server serves many clients: only the one its line
            // may concern (`Routing::log_reader`), if it set a level that takes it
            // (the server's level may be another client's).
            None if hub.downstreams.front() == Front::Http => {
                let task = log.meta.as_ref().and_then(|m| m.0.get(RELATED_TASK)?["taskId"].as_str());
                let to = hub.routing.log_reader((server, self.instance), session, task.map(str::to_owned));
                let wants = to.as_ref().is_some_and(|to| hub.downstreams.asked_for(&to.client, log.level));
                (to, wants)
            }
            None => return hub.downstreams.log(log),
        };
        match to.filter(|_| wants) {
            Some(to) => hub
                .downstreams
                .sending
                .send(&to, ServerNotification::LoggingMessageNotification(Notification::new(log))),
            None => tracing::debug!(server, "a log message for no client: {}", log.data),
        }
    }

    /// A notification Rebound does not know: a task's status to the client that started
    /// the task; anything else to the instance's own client, or over stdio the client.
    fn custom(&self, hub: &Hub, server: &str, session: u64, n: CustomNotification) {
        let task = (n.method == "notifications/tasks/status")
            .then(|| hub.routing.task_status(session, n.params.as_ref()?))
            .flatten();
        let otherwise = || {
            let own = self.owner.as_ref().map(|o| ClientPeer { client: o.client.clone(), peer: o.peer.clone() });
            own.or_else(|| hub.downstreams.only_stdio_client())
        };
        match task.or_else(otherwise) {
            Some(to) => hub.downstreams.sending.send(&to, ServerNotification::CustomNotification(n)),
            None => tracing::debug!(
                server,
                "a custom notification of a shared server concerns no one client; not passed on"
            ),
        }
    }

    /// A server's list changed: its instance lists again, off the event's path, and the
    /// catalogue it is in is rebuilt.
    fn relist(&self, hub: Arc<Hub>, server: &str) {
        let owner = self.owner.clone();
        let server = server.to_owned();
        tokio::spawn(async move {
            let handle = match owner.as_ref().and_then(|o| o.servers.upgrade()) {
                Some(servers) => servers.instance(&server),
                None => hub.setup().servers.get(server.as_str()).cloned(),
            };
            let Some(session) = handle.and_then(|h| h.state().session) else { return };
            let within = Duration::from_millis(hub.setup().config.settings.init_timeout_ms);
            // One re-listing at a time; the one under way lists again for this.
            session.refresh(within, || hub.rebuild_for(owner.as_ref(), false)).await;
        });
    }

    /// What a server asked a client: passed to the one client `routing` names (about a
    /// task a client runs for it, that client: `super::asked_tasks`), or refused.
    fn on_request(
        &self,
        hub: &Hub,
        server: &str,
        asker: Asker,
        request: UpstreamRequest,
    ) -> BoxFuture<'static, Result<ClientResult, ErrorData>> {
        let mut kind = Kind::of(&request);
        // A shared server over HTTP was told of no client's tasks (`Hub::offer`): what it
        // asks to be run as one is asked plainly, so no client fills the tasks kept for it.
        let plain = matches!(kind, Kind::AsksForTask) && self.owner.is_none() && hub.downstreams.front() == Front::Http;
        if plain {
            kind = Kind::Other;
        }
        let caller = self.caller(hub, server, &asker, &kind);
        let (server, routing) = (server.to_owned(), hub.routing.clone());
        Box::pin(async move {
            let request = if plain { untasked(request)? } else { request };
            let (to, originating) = match settled(caller, &routing, &asker).await {
                Caller::Client { to, during } => (to, during),
                // That client takes no tasks: it is asked the question itself.
                Caller::Held(bridge) => return bridge.ask(&server, untasked(request)?, asker.cancel).await,
                Caller::Nobody(why) => {
                    tracing::info!(server, "a request of the server was not passed to any client: {why}");
                    return Err(ErrorData::internal_error(format!("Rebound asked no client: {why}"), None));
                }
            };
            let session = asker.session;
            let Some(_asked) = routing.asked_by(session, &to.client) else {
                tracing::warn!(
                    server,
                    "{MAX_ASKED} of the server's requests wait for one client's answers; refused another"
                );
                let why =
                    format!("Rebound: {MAX_ASKED} of this server's requests wait for this client's answers already");
                return Err(ErrorData::internal_error(why, None));
            };
            let request = to_client(request, &to.peer, &server)?;
            let asking = matches!(kind, Kind::AsksForTask);
            let _question = asking.then(|| routing.run_by_clients.asking(&to.client));
            let answer = ask(to.peer.clone(), request, originating.clone(), asker).await?;
            note_answer(&routing.run_by_clients, kind, session, &to, originating, answer).map_err(|refused| {
                tracing::warn!(server, "a task the client created for the server is not kept: {}", refused.why);
                ErrorData::internal_error(format!("Rebound: the client's task was refused: {}", refused.why), None)
            })
        })
    }

    /// Who is asked a server's request of `kind`, as far as can be told at once: about a
    /// task, the client that runs it; else the client `routing` finds for it.
    fn caller(&self, hub: &Hub, server: &str, asker: &Asker, kind: &Kind) -> Caller {
        match kind {
            Kind::AboutTask { id: Some(id), .. } => match hub.routing.run_by_clients.runner(asker.session, id) {
                // Over HTTP on the stream of the call it was asked during, while that lasts.
                Some((to, during)) => {
                    let during = during.filter(|d| hub.routing.is_in_flight(self.instance, &to.client, d));
                    Caller::Client { to, during }
                }
                None => Caller::Nobody("the task it names is no task a client of the gateway runs for this server"),
            },
            Kind::AboutTask { id: None, .. } => Caller::Nobody("it names no task (`taskId`, a string, is required)"),
            _ => {
                let serves = match &self.owner {
                    Some(owner) => {
                        Serves::One(Some(ClientPeer { client: owner.client.clone(), peer: owner.peer.clone() }))
                    }
                    None if hub.downstreams.front() == Front::Http => Serves::Many,
                    None => Serves::One(hub.downstreams.only_stdio_client()),
                };
                hub.routing.caller((server, self.instance), asker, serves)
            }
        }
    }
}

/// `caller`, or for a request about a task whose creation the gateway has not read yet,
/// the client that task turns out to be of (while the server still wants an answer).
async fn settled(caller: Caller, routing: &Routing, asker: &Asker) -> Caller {
    match (caller, &asker.task) {
        (Caller::Nobody(why), Some(task)) => {
            let owner = tokio::select! {
                owner = routing.task_owner_soon(asker.session, task) => owner,
                () = asker.cancel.cancelled() => None,
            };
            owner.map_or(Caller::Nobody(why), |to| Caller::Client { to, during: None })
        }
        (caller, _) => caller,
    }
}

/// What a server's request is, for the tasks clients run for servers.
enum Kind {
    /// A request the client is asked to run as a task (`transport::typed`).
    AsksForTask,
    /// `tasks/get`, `tasks/result` (`result`) or `tasks/cancel` about task `id` (none
    /// named: none).
    AboutTask {
        id: Option<String>,
        result: bool,
    },
    /// `tasks/list`.
    List,
    Other,
}

impl Kind {
    fn of(request: &UpstreamRequest) -> Self {
        let UpstreamRequest::Custom(custom) = request else { return Self::Other };
        let method = custom.method.as_str();
        if ClientTaskRequest::of(method).is_some() {
            return Self::AsksForTask;
        }
        if method == "tasks/list" {
            return Self::List;
        }
        if ABOUT_ONE.contains(&method) {
            let id = custom.params.as_ref().and_then(|p| p["taskId"].as_str()).map(str::to_owned);
            return Self::AboutTask { id, result: method == "tasks/result" };
        }
        Self::Other
    }
}

/// What the client's `answer` to a request of `kind` says about the tasks it runs for
/// upstream `session`, noted; the answer as the server gets it. A task that cannot be
/// kept is refused, and the client asked to cancel it. (A task, a task's status and a
/// task list come as they were sent, custom results; a task's result as rmcp read it.)
fn note_answer(
    asked: &AskedTasks,
    kind: Kind,
    session: u64,
    to: &ClientPeer,
    originating: Option<rmcp::model::RequestId>,
    answer: ClientResult,
) -> Result<ClientResult, Refused> {
    let ClientResult::CustomResult(CustomResult(value)) = answer else {
        if let Kind::AboutTask { id: Some(id), result: true } = kind {
            asked.answered(session, &id, true, &Value::Null);
        }
        return Ok(answer);
    };
    let value = match kind {
        Kind::AsksForTask => {
            if let Err(refused) = asked.created(session, &value, to, originating) {
                if refused.cancel {
                    cancel_on_client(to.peer.clone(), &value);
                }
                return Err(refused);
            }
            value
        }
        Kind::AboutTask { id: Some(id), result } => {
            asked.answered(session, &id, result, &value);
            value
        }
        Kind::List => asked.only_theirs(session, &to.client, value),
        Kind::AboutTask { id: None, .. } | Kind::Other => value,
    };
    Ok(ClientResult::CustomResult(CustomResult(value)))
}

/// A request the client was to run as a task, as a plain request: for a client that takes
/// no tasks (a 2026-07-28 client's call, asked in its answer).
fn untasked(request: UpstreamRequest) -> Result<UpstreamRequest, ErrorData> {
    let UpstreamRequest::Custom(custom) = request else { return Ok(request) };
    let Some(kind) = ClientTaskRequest::of(&custom.method) else { return Ok(UpstreamRequest::Custom(custom)) };
    let mut params = custom.params.unwrap_or_default();
    if let Some(params) = params.as_object_mut() {
        params.remove("task");
    }
    let unreadable = |e: serde_json::Error| ErrorData::invalid_params(format!("`{}`: {e}", custom.method), None);
    Ok(match kind {
        ClientTaskRequest::Sampling => UpstreamRequest::Sampling(serde_json::from_value(params).map_err(unreadable)?),
        ClientTaskRequest::Elicitation => {
            UpstreamRequest::Elicitation(serde_json::from_value(params).map_err(unreadable)?)
        }
    })
}

/// Asks `peer` to cancel the task it created in `answer`, which the gateway does not keep.
/// Off the caller's path, bounded.
fn cancel_on_client(peer: Peer<RoleServer>, answer: &Value) {
    let Some(id) = answer["task"]["taskId"].as_str() else { return };
    let request = CustomRequest::new("tasks/cancel", Some(json!({"taskId": id})));
    tokio::spawn(async move {
        let sent = peer.send_request(ServerRequest::CustomRequest(request));
        let _ = tokio::time::timeout(Duration::from_secs(5), sent).await;
    });
}

impl Relay for HubRelay {
    fn notify(&self, server: &str, session: u64, event: UpstreamEvent) {
        if let Some(hub) = self.hub.upgrade() {
            self.on_event(hub, server, session, event);
        }
    }

    fn request(
        &self,
        server: &str,
        asker: Asker,
        request: UpstreamRequest,
    ) -> BoxFuture<'static, Result<ClientResult, ErrorData>> {
        match self.hub.upgrade() {
            Some(hub) => self.on_request(&hub, server, asker, request),
            None => Box::pin(async { Err(ErrorData::internal_error("the gateway is shutting down", None)) }),
        }
    }

    /// Goes to the errors log, as the owning session's for a `session`-scoped instance.
    fn trouble(&self, server: &str, trouble: Trouble) {
        if let Some(hub) = self.hub.upgrade() {
            let session = self.owner.as_ref().map(|o| &*o.client);
            hub.errors.server_trouble(server, session, &trouble, std::time::SystemTime::now());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn custom(method: &str, params: Value) -> UpstreamRequest {
        UpstreamRequest::Custom(CustomRequest::new(method, Some(params)))
    }

    #[test]
    fn what_a_server_asks_about_client_tasks_is_told_apart() {
        let kind = |method: &str, params: Value| Kind::of(&custom(method, params));
        assert!(matches!(kind("sampling/createMessage", json!({"task": {}})), Kind::AsksForTask));
        assert!(matches!(kind("elicitation/create", json!({"task": {}})), Kind::AsksForTask));
        assert!(matches!(kind("tasks/list", json!({})), Kind::List));
        assert!(matches!(
            kind("tasks/result", json!({"taskId": "t"})),
            Kind::AboutTask { id: Some(id), result: true } if id == "t"
        ));
        assert!(matches!(kind("tasks/get", json!({"taskId": 7})), Kind::AboutTask { id: None, result: false }));
        assert!(matches!(kind("tasks/cancel", json!({})), Kind::AboutTask { id: None, .. }));
        assert!(matches!(kind("other/thing", json!({"taskId": "t"})), Kind::Other));
        assert!(matches!(Kind::of(&UpstreamRequest::Roots), Kind::Other));
    }

    #[test]
    fn a_request_to_be_run_as_a_task_is_asked_plainly_of_a_client_that_runs_none() {
        let sampling = json!({"task": {"ttl": 1}, "messages": [], "maxTokens": 5});
        let UpstreamRequest::Sampling(params) = untasked(custom("sampling/createMessage", sampling)).unwrap() else {
            panic!("sampling")
        };
        assert_eq!(params.max_tokens, 5);
        let elicitation = json!({"task": {}, "message": "m", "requestedSchema": {"type": "object", "properties": {}}});
        assert!(matches!(
            untasked(custom("elicitation/create", elicitation)).unwrap(),
            UpstreamRequest::Elicitation(_)
        ));
        let refused = untasked(custom("sampling/createMessage", json!({"task": {}}))).unwrap_err();
        assert!(refused.message.contains("sampling/createMessage"), "{refused:?}");
        assert!(matches!(untasked(custom("tasks/get", json!({}))).unwrap(), UpstreamRequest::Custom(_)));
        assert!(matches!(untasked(UpstreamRequest::Roots).unwrap(), UpstreamRequest::Roots));
    }

    #[tokio::test]
    async fn a_clients_answers_keep_its_tasks_whatever_shape_rmcp_read_them_in() {
        let ((alice, _a, _ac), (bob, _b, _bc)) = (
            super::super::asked_tasks::tests::session("alice").await,
            super::super::asked_tasks::tests::session("bob").await,
        );
        tokio::time::pause();
        let asked = AskedTasks::default();
        let task =
            |id: &str| ClientResult::CustomResult(CustomResult(json!({"task": {"taskId": id, "ttl": 3_600_000}})));
        note_answer(&asked, Kind::AsksForTask, 1, &alice, None, task("t")).unwrap();
        note_answer(&asked, Kind::AsksForTask, 1, &bob, None, task("b")).unwrap();
        assert!(note_answer(&asked, Kind::AsksForTask, 1, &bob, None, task("t")).is_err(), "alice's id");
        // A task's result, read by rmcp as a sampling result: the task ended all the same.
        let result: ClientResult = serde_json::from_value(
            json!({"role": "assistant", "content": {"type": "text", "text": "x"}, "model": "m"}),
        )
        .unwrap();
        assert!(matches!(result, ClientResult::CreateMessageResult(_)));
        let about = Kind::AboutTask { id: Some("t".into()), result: true };
        assert!(matches!(
            note_answer(&asked, about, 1, &alice, None, result).unwrap(),
            ClientResult::CreateMessageResult(_)
        ));
        // A server's task list, answered by bob: only bob's.
        let list = ClientResult::CustomResult(CustomResult(json!({"tasks": [{"taskId": "t"}, {"taskId": "b"}]})));
        let ClientResult::CustomResult(CustomResult(listed)) =
            note_answer(&asked, Kind::List, 1, &bob, None, list).unwrap()
        else {
            panic!("a custom result")
        };
        assert_eq!(listed["tasks"], json!([{"taskId": "b"}]));
        tokio::time::advance(Duration::from_secs(61)).await;
        assert!(asked.runner(1, "t").is_none(), "its result was fetched a minute ago");
        assert!(asked.runner(1, "b").is_some());
    }
}
