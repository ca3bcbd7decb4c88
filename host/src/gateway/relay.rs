//! What a server instance says on its own, relayed to the client sessions it concerns:
//! its notifications (`on_event`) and its requests (`on_request`, to the one client
//! `routing` names). One `HubRelay` per server instance, shared or a session's own.

// Logging is deprecated by 2026-07-28 (SEP-2577) but lives in every revision the gateway
// speaks; it is relayed faithfully.
#![allow(deprecated)]

use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::future::BoxFuture;
use rmcp::model::{ClientResult, CustomRequest, CustomResult, Notification, ServerNotification, ServerRequest};
use rmcp::{ErrorData, Peer, RoleServer};
use serde_json::{Value, json};

use super::asked_tasks::ABOUT_ONE;
use super::downstreams::send;
use super::hub::Hub;
use super::routing::{Caller, ask, to_client};
use crate::transport::tasks::CLIENT_TASK_REQUESTS;
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
        let owner = self.owner.as_ref();
        match event {
            UpstreamEvent::Progress(p) => hub.routing.progress(session, p),
            UpstreamEvent::Log(mut log) => {
                log.logger = Some(match log.logger.take() {
                    Some(l) => format!("{server}/{l}"),
                    None => server.to_owned(),
                });
                match owner {
                    Some(o) if hub.downstreams.wants_log(&o.client, log.level) => {
                        let n = ServerNotification::LoggingMessageNotification(Notification::new(log));
                        send(o.peer.clone(), n);
                    }
                    Some(_) => {}
                    None => hub.downstreams.log(log),
                }
            }
            UpstreamEvent::ResourceUpdated(update) => hub.downstreams.resource_updated(self.instance, update),
            UpstreamEvent::Custom(n) => {
                // A task's status goes to the client that started it.
                let task = (n.method == "notifications/tasks/status")
                    .then(|| hub.routing.task_status(session, n.params.as_ref()?))
                    .flatten();
                match task.or_else(|| owner.map(|o| o.peer.clone())).or_else(|| hub.downstreams.only_stdio_client()) {
                    Some(peer) => send(peer, ServerNotification::CustomNotification(n)),
                    None => tracing::debug!(
                        server,
                        "a custom notification of a shared server concerns no one client; not passed on"
                    ),
                }
            }
            UpstreamEvent::Cancelled(c) => {
                // rmcp has already cancelled the request the server gave up on.
                tracing::debug!(server, "server cancelled its request {:?}", c.request_id);
            }
            UpstreamEvent::ToolsChanged | UpstreamEvent::PromptsChanged | UpstreamEvent::ResourcesChanged => {
                let owner = owner.cloned();
                let server = server.to_owned();
                tokio::spawn(async move {
                    let handle = match owner.as_ref().and_then(|o| o.servers.upgrade()) {
                        Some(servers) => servers.instance(&server),
                        None => hub.setup().servers.get(server.as_str()).cloned(),
                    };
                    let Some(session) = handle.and_then(|h| h.state().session) else { return };
                    session.refresh(Duration::from_millis(hub.setup().config.settings.init_timeout_ms)).await;
                    hub.rebuild_for(owner.as_ref(), false);
                });
            }
        }
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
        let kind = Kind::of(&request);
        let caller = match &kind {
            Kind::AboutTask(id) => match hub.routing.asked.runner(asker.session, id) {
                Some((peer, during)) => Caller::Client { peer, during },
                None => Caller::Nobody("the task it names is no task a client of the gateway runs for this server"),
            },
            _ => {
                let otherwise = match &self.owner {
                    Some(owner) => Some(owner.peer.clone()),
                    None => hub.downstreams.only_stdio_client(),
                };
                hub.routing.caller(self.instance, &asker, otherwise)
            }
        };
        let (server, routing) = (server.to_owned(), hub.routing.clone());
        Box::pin(async move {
            let (peer, originating) = match caller {
                Caller::Client { peer, during } => (peer, during),
                Caller::Held(bridge) => return bridge.ask(&server, request, asker.cancel).await,
                Caller::Nobody(why) => {
                    tracing::info!(server, "a request of the server was not passed to any client: {why}");
                    return Err(ErrorData::internal_error(format!("Rebound asked no client: {why}"), None));
                }
            };
            let session = asker.session;
            let request = to_client(request, &peer, &server)?;
            let answer = ask(peer.clone(), request, originating.clone(), asker).await?;
            let ClientResult::CustomResult(CustomResult(value)) = answer else { return Ok(answer) };
            let value = match kind {
                Kind::ToRun => {
                    if let Err(why) = routing.asked.created(session, &value, &peer, originating) {
                        tracing::warn!(server, "a task the client created for the server is not kept: {why}");
                        cancel_on_client(peer, &value);
                        return Err(ErrorData::internal_error(
                            format!("Rebound: the client's task was refused: {why}"),
                            None,
                        ));
                    }
                    value
                }
                Kind::List => routing.asked.only_theirs(session, &peer, value),
                Kind::AboutTask(_) | Kind::Other => value,
            };
            Ok(ClientResult::CustomResult(CustomResult(value)))
        })
    }
}

/// What a server's request is, for the tasks clients run for servers.
enum Kind {
    /// A request the client may run as a task (it asks for one).
    ToRun,
    /// `tasks/get`, `tasks/result` or `tasks/cancel` about this task.
    AboutTask(String),
    /// `tasks/list`.
    List,
    Other,
}

impl Kind {
    fn of(request: &UpstreamRequest) -> Self {
        let UpstreamRequest::Custom(custom) = request else { return Self::Other };
        let method = custom.method.as_str();
        if CLIENT_TASK_REQUESTS.iter().any(|(m, ..)| *m == method) {
            return Self::ToRun;
        }
        if method == "tasks/list" {
            return Self::List;
        }
        match custom.params.as_ref().and_then(|p| p["taskId"].as_str()) {
            Some(id) if ABOUT_ONE.contains(&method) => Self::AboutTask(id.to_owned()),
            _ => Self::Other,
        }
    }
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
}
