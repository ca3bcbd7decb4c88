//! The hub: every supervised server, the catalogue built from them, and the downstream
//! clients that hear about them. Shared by all downstream sessions (one over stdio, many
//! over HTTP).

// Logging, sampling and roots are deprecated by 2026-07-28 (SEP-2577) but live in every
// revision the gateway speaks; they are relayed faithfully.
#![allow(deprecated)]

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use futures::future::BoxFuture;
use indexmap::IndexMap;
use rmcp::model::{
    CancelledNotificationParam, ClientResult, CreateMessageRequest, ElicitRequest, GetExtensions, LoggingLevel,
    ProgressNotificationParam, ProgressToken, RequestId, ServerNotification, ServerRequest, SetLevelRequestParams,
    SubscribeRequestParams,
};
use rmcp::service::{OriginatingRequestId, PeerRequestOptions};
use rmcp::{ErrorData, Peer, RoleServer};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::catalogue::Catalogue;
use super::metrics::Metrics;
use crate::config::Config;
use crate::errors_log::ErrorsLog;
use crate::plugins::Prepared;
use crate::recovery::clock::{Rng, TokioClock};
use crate::recovery::engine::Engine;
use crate::redact::Secrets;
use crate::transport::supervisor::{ServerHandle, Status, spawn_supervisor};
use crate::transport::{Asker, Relay, UpstreamEvent, UpstreamRequest};

/// How long, and how much, progress without a call is kept for a call about to be mapped.
const EARLY_PROGRESS_KEPT: Duration = Duration::from_secs(2);
const EARLY_PROGRESS_MAX: usize = 256;

/// A client's tool call in flight on a server.
struct InFlight {
    id: u64,
    peer: Peer<RoleServer>,
    /// The client's id for the call.
    request: RequestId,
    /// The upstream session and our request id there, once the attempt is sent.
    upstream: Option<(u64, RequestId)>,
}

pub struct Hub {
    pub config: Config,
    pub servers: IndexMap<Arc<str>, ServerHandle>,
    pub engine: Engine,
    pub errors: Arc<ErrorsLog>,
    pub plugins: Prepared,
    /// Values from the configuration that must never leave the gateway.
    pub secrets: Secrets,
    pub metrics: Metrics,
    catalogue: RwLock<Arc<Catalogue>>,
    downstreams: Mutex<Vec<Peer<RoleServer>>>,
    /// (upstream session, upstream token) → downstream.
    progress: Mutex<HashMap<(u64, ProgressToken), ProgressRoute>>,
    /// Progress that came before its call was mapped (a server may report before the
    /// send returns here), briefly: (arrived, upstream session, notification). Locked
    /// after `progress`, never before.
    early_progress: Mutex<VecDeque<(Instant, u64, ProgressNotificationParam)>>,
    /// Calls in flight per server, newest last, for routing server-to-client requests.
    in_flight: Mutex<HashMap<Arc<str>, Vec<InFlight>>>,
    next_call: std::sync::atomic::AtomicU64,
    /// Re-applied to a server after it restarts.
    log_level: Mutex<Option<LoggingLevel>>,
    subscriptions: Mutex<HashSet<(Arc<str>, String)>>,
    started_at: Instant,
    settled: std::sync::atomic::AtomicBool,
}

/// Forwards upstream traffic to the hub without keeping it alive.
struct HubRelay(Weak<Hub>);

impl Hub {
    /// Starts supervising every configured server and returns at once; servers come up in
    /// parallel and join the catalogue as they do.
    pub fn start(config: Config, plugins: Prepared) -> Arc<Self> {
        let hub = Arc::new_cyclic(|weak: &Weak<Hub>| {
            let relay: Arc<dyn Relay> = Arc::new(HubRelay(weak.clone()));
            let init_timeout = Duration::from_millis(config.settings.init_timeout_ms);
            let secrets = Secrets::of(&config);
            let servers = config
                .servers
                .values()
                .map(|s| {
                    let handle = spawn_supervisor(
                        s.clone(),
                        relay.clone(),
                        config.settings.restart,
                        init_timeout,
                        secrets.clone(),
                    );
                    (handle.name.clone(), handle)
                })
                .collect();
            let mut engine = Engine::new(config.servers.values(), Arc::new(TokioClock), Arc::new(Rng::from_entropy()))
                .with_plan_calls(config.settings.plugin_max_calls);
            for (server, adapter) in plugins.adapters.iter() {
                engine.declare(server, adapter.declared());
            }
            let errors = ErrorsLog::start(
                config.settings.errors_log.clone(),
                config.settings.errors_log_max_bytes,
                secrets.clone(),
            );
            Hub {
                config,
                servers,
                engine,
                errors,
                plugins,
                secrets,
                metrics: Metrics::default(),
                catalogue: RwLock::default(),
                downstreams: Mutex::default(),
                progress: Mutex::default(),
                early_progress: Mutex::default(),
                in_flight: Mutex::default(),
                next_call: Default::default(),
                log_level: Mutex::default(),
                subscriptions: Mutex::default(),
                started_at: Instant::now(),
                settled: Default::default(),
            }
        });
        for handle in hub.servers.values() {
            let mut rx = handle.subscribe();
            let weak = Arc::downgrade(&hub);
            let name = handle.name.clone();
            tokio::spawn(async move {
                let mut last = rx.borrow().status;
                while rx.changed().await.is_ok() {
                    let status = rx.borrow_and_update().status;
                    let Some(hub) = weak.upgrade() else { break };
                    if status == Status::Ready && status != last {
                        hub.on_ready(&name, last != Status::Starting).await;
                    } else if status != last {
                        hub.rebuild(false);
                    }
                    last = status;
                }
            });
        }
        hub
    }

    /// The servers' adapters, as one advisor for the recovery engine.
    pub fn advisor(&self) -> Option<&dyn crate::recovery::plan::Advisor> {
        (!self.plugins.adapters.is_empty()).then_some(&self.plugins.adapters as _)
    }

    pub fn catalogue(&self) -> Arc<Catalogue> {
        self.catalogue.read().expect("not poisoned").clone()
    }

    /// Waits until every server has finished its first start (or failed it), at most
    /// until the start-up deadline, so that the first `tools/list` is complete.
    pub async fn settled(&self) {
        // On the call path: once settled, this is one atomic load.
        if self.settled.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        let deadline = self.started_at + Duration::from_millis(self.config.settings.startup_timeout_ms);
        for handle in self.servers.values() {
            let mut rx = handle.subscribe();
            let _ = tokio::time::timeout_at(
                deadline,
                rx.wait_for(|s| s.status != Status::Starting || s.last_error.is_some()),
            )
            .await;
        }
        // The state watchers rebuild too, but asynchronously: make sure the first answer
        // already has every server that is up. Set only afterwards, so that a caller who
        // skips the wait finds the catalogue built (two first callers may both rebuild;
        // rebuilds are serialised and announce only differences).
        self.rebuild(false);
        self.settled.store(true, std::sync::atomic::Ordering::Release);
    }

    /// A downstream client finished initialising: it hears notifications from now on.
    pub fn add_downstream(&self, peer: Peer<RoleServer>) {
        let mut list = self.downstreams.lock().expect("not poisoned");
        list.retain(|p| !p.is_transport_closed());
        list.push(peer);
    }

    fn downstreams(&self) -> Vec<Peer<RoleServer>> {
        let mut list = self.downstreams.lock().expect("not poisoned");
        list.retain(|p| !p.is_transport_closed());
        list.clone()
    }

    /// Sends `notification` to every downstream client, without waiting on any of them.
    fn broadcast(&self, notification: ServerNotification) {
        for peer in self.downstreams() {
            let n = notification.clone();
            tokio::spawn(async move {
                if let Err(e) = peer.send_notification(n).await {
                    tracing::debug!("a downstream notification was not delivered: {e}");
                }
            });
        }
    }

    /// A server became ready: re-apply what the client set, rebuild, and tell clients.
    async fn on_ready(&self, server: &str, restarted: bool) {
        let Some(handle) = self.servers.get(server) else {
            return;
        };
        if let Some(session) = handle.state().session {
            let level = *self.log_level.lock().expect("not poisoned");
            if let (Some(level), true) =
                (level, session.info.as_ref().is_some_and(|i| i.capabilities.logging.is_some()))
            {
                let _ = session.peer.set_level(SetLevelRequestParams::new(level)).await;
            }
            let uris: Vec<String> = self
                .subscriptions
                .lock()
                .expect("not poisoned")
                .iter()
                .filter(|(s, _)| &**s == server)
                .map(|(_, u)| u.clone())
                .collect();
            for uri in uris {
                let _ = session.peer.subscribe(SubscribeRequestParams::new(uri)).await;
            }
        }
        // After a restart the client is told even if nothing changed: its view of the
        // server's tools may have been invalidated by errors it saw meanwhile.
        self.rebuild(restarted);
    }

    /// Rebuilds the catalogue from the servers' latest listings and tells clients what
    /// changed (tools always, with `force`).
    pub fn rebuild(&self, force: bool) {
        // Held while reading the servers' states, so that two rebuilds racing cannot
        // store a catalogue older than the one before it.
        let mut current = self.catalogue.write().expect("not poisoned");
        let mut listings = Vec::new();
        for (name, handle) in &self.servers {
            if let Some(session) = handle.state().session {
                listings.push((name.clone(), session.listing()));
            }
        }
        let next = Arc::new(Catalogue::build(&listings, self.config.settings.tool_names));
        tracing::debug!(servers = listings.len(), tools = next.tools.len(), "catalogue rebuilt");
        let prev = std::mem::replace(&mut *current, next.clone());
        drop(current);
        if force || next.tools_differ(&prev) {
            self.broadcast(ServerNotification::ToolListChangedNotification(Default::default()));
        }
        if next.prompts_differ(&prev) {
            self.broadcast(ServerNotification::PromptListChangedNotification(Default::default()));
        }
        if next.resources_differ(&prev) {
            self.broadcast(ServerNotification::ResourceListChangedNotification(Default::default()));
        }
    }

    /// Registers a call in flight on `server` from `peer`; dropped when the guard is.
    /// `request` is the client's request id: over HTTP, requests the server sends while
    /// the call runs travel on that request's response stream.
    pub fn track_call(self: &Arc<Self>, server: &Arc<str>, peer: &Peer<RoleServer>, request: RequestId) -> CallGuard {
        let id = self.next_call.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let call = InFlight { id, peer: peer.clone(), request, upstream: None };
        self.in_flight.lock().expect("not poisoned").entry(server.clone()).or_default().push(call);
        CallGuard { hub: self.clone(), server: server.clone(), id }
    }

    /// Sends progress of `session`'s `upstream` token to `peer` as the client's `token`,
    /// in the order it arrives, until [`Hub::unmap_progress`].
    pub fn map_progress(&self, session: u64, upstream: ProgressToken, peer: Peer<RoleServer>, token: ProgressToken) {
        let mut route = ProgressRoute { peer, token, forwarder: None };
        let mut routes = self.progress.lock().expect("not poisoned");
        let mut early = self.early_progress.lock().expect("not poisoned");
        early.retain(|(_, s, p)| {
            let ours = *s == session && p.progress_token == upstream;
            if ours {
                route.forward(p.clone());
            }
            !ours
        });
        routes.insert((session, upstream), route);
    }

    /// Ends the mapping; the forwarder, if progress came, is to be flushed before the
    /// answer is sent.
    pub fn unmap_progress(&self, session: u64, upstream: &ProgressToken) -> Option<ProgressForwarder> {
        let route = self.progress.lock().expect("not poisoned").remove(&(session, upstream.clone()))?;
        route.forwarder.map(|(_, task)| ProgressForwarder(task))
    }

    pub fn set_log_level(&self, level: LoggingLevel) {
        *self.log_level.lock().expect("not poisoned") = Some(level);
    }

    pub fn subscribed(&self, server: Arc<str>, uri: String, on: bool) {
        let mut subs = self.subscriptions.lock().expect("not poisoned");
        if on {
            subs.insert((server, uri));
        } else {
            subs.remove(&(server, uri));
        }
    }

    /// The client that should answer a request from `server`, and the client's request it
    /// belongs to. Exactly the call it came during, when the server says (HTTP); else the
    /// newest call in flight there (a stdio server cannot say which of several it means);
    /// else, with no call in flight, the one client if there is only one. Never a client
    /// picked at random among several: it would see another client's question.
    fn client_for(&self, server: &str, asker: &Asker) -> Option<(Peer<RoleServer>, Option<RequestId>)> {
        let in_flight = self.in_flight.lock().expect("not poisoned");
        let calls = in_flight.get(server).map(Vec::as_slice).unwrap_or_default();
        let live = || calls.iter().rev().filter(|c| !c.peer.is_transport_closed());
        let exact = asker.during.as_ref().and_then(|during| {
            live().find(|c| c.upstream.as_ref().is_some_and(|(s, id)| *s == asker.session && id == during))
        });
        if let Some(call) = exact.or_else(|| live().next()) {
            return Some((call.peer.clone(), Some(call.request.clone())));
        }
        drop(in_flight);
        match self.downstreams().as_slice() {
            [only] => Some((only.clone(), None)),
            _ => None,
        }
    }

    /// Stops every server in parallel and waits until their processes are gone.
    pub async fn shutdown(&self) {
        futures::future::join_all(self.servers.values().map(ServerHandle::shutdown)).await;
        self.errors.flush();
    }

    fn on_event(self: Arc<Self>, server: &str, session: u64, event: UpstreamEvent) {
        match event {
            UpstreamEvent::Progress(p) => {
                let mut routes = self.progress.lock().expect("not poisoned");
                if let Some(route) = routes.get_mut(&(session, p.progress_token.clone())) {
                    route.forward(p);
                    return;
                }
                // Early, or for a call that already finished (or never was ours): kept a
                // moment in case its call is about to be mapped.
                let mut early = self.early_progress.lock().expect("not poisoned");
                let now = Instant::now();
                while early.front().is_some_and(|(t, _, _)| now.duration_since(*t) > EARLY_PROGRESS_KEPT)
                    || early.len() >= EARLY_PROGRESS_MAX
                {
                    early.pop_front();
                }
                early.push_back((now, session, p));
            }
            UpstreamEvent::Log(mut log) => {
                log.logger = Some(match log.logger.take() {
                    Some(l) => format!("{server}/{l}"),
                    None => server.to_owned(),
                });
                self.broadcast(ServerNotification::LoggingMessageNotification(rmcp::model::Notification::new(log)));
            }
            UpstreamEvent::ResourceUpdated(u) => {
                self.broadcast(ServerNotification::ResourceUpdatedNotification(rmcp::model::Notification::new(u)));
            }
            UpstreamEvent::Custom(n) => self.broadcast(ServerNotification::CustomNotification(n)),
            UpstreamEvent::Cancelled(c) => {
                // rmcp has already cancelled the request the server gave up on.
                tracing::debug!(server, "server cancelled its request {:?}", c.request_id);
            }
            UpstreamEvent::ToolsChanged | UpstreamEvent::PromptsChanged | UpstreamEvent::ResourcesChanged => {
                let server = server.to_owned();
                tokio::spawn(async move {
                    let Some(session) = self.servers.get(server.as_str()).and_then(|h| h.state().session) else {
                        return;
                    };
                    session.refresh(Duration::from_millis(self.config.settings.init_timeout_ms)).await;
                    self.rebuild(false);
                });
            }
        }
    }

    fn on_request(
        self: Arc<Self>,
        server: &str,
        asker: Asker,
        request: UpstreamRequest,
    ) -> BoxFuture<'static, Result<ClientResult, ErrorData>> {
        let peer = self.client_for(server, &asker);
        let server = server.to_owned();
        Box::pin(async move {
            let Some((peer, originating)) = peer else {
                return Err(ErrorData::internal_error(
                    "no client of the gateway is waiting on this server, so none can answer this request",
                    None,
                ));
            };
            let caps = peer.peer_info().map(|i| i.capabilities.clone()).unwrap_or_default();
            let (mut request, supported, what) = match request {
                UpstreamRequest::Sampling(p) => (
                    ServerRequest::CreateMessageRequest(CreateMessageRequest::new(p)),
                    caps.sampling.is_some(),
                    "sampling",
                ),
                UpstreamRequest::Roots => {
                    (ServerRequest::ListRootsRequest(Default::default()), caps.roots.is_some(), "roots")
                }
                UpstreamRequest::Elicitation(p) => {
                    (ServerRequest::ElicitRequest(ElicitRequest::new(p)), caps.elicitation.is_some(), "elicitation")
                }
                UpstreamRequest::Custom(c) => (ServerRequest::CustomRequest(c), true, "custom requests"),
            };
            if !supported {
                return Err(ErrorData::new(
                    rmcp::model::ErrorCode::METHOD_NOT_FOUND,
                    format!("the client behind the gateway does not support {what} (server `{server}` asked for it)"),
                    None,
                ));
            }
            if let Some(id) = originating {
                request.extensions_mut().insert(OriginatingRequestId(id));
            }
            // On a task of its own: rmcp marks requests sent from inside a request handler
            // with that request's id (a task-local), and here that would be the upstream
            // server's id, which means nothing to the client's session.
            let sent = tokio::spawn(async move {
                let handle = peer.send_cancellable_request(request, PeerRequestOptions::no_options()).await?;
                let id = handle.id.clone();
                tokio::select! {
                    answer = handle.await_response() => answer,
                    () = asker.cancel.cancelled() => {
                        // The server gave up: close the client's dialog too.
                        let reason = Some("the server cancelled its request".to_owned());
                        let _ = peer.notify_cancelled(CancelledNotificationParam::new(Some(id), reason.clone())).await;
                        Err(rmcp::ServiceError::Cancelled { reason })
                    }
                }
            });
            match sent.await {
                Ok(answer) => answer.map_err(|e| match e {
                    rmcp::ServiceError::McpError(e) => e,
                    other => ErrorData::internal_error(format!("the client did not answer: {other}"), None),
                }),
                Err(e) => Err(ErrorData::internal_error(format!("forwarding the request failed: {e}"), None)),
            }
        })
    }
}

impl Relay for HubRelay {
    fn notify(&self, server: &str, session: u64, event: UpstreamEvent) {
        if let Some(hub) = self.0.upgrade() {
            hub.on_event(server, session, event);
        }
    }

    fn request(
        &self,
        server: &str,
        asker: Asker,
        request: UpstreamRequest,
    ) -> BoxFuture<'static, Result<ClientResult, ErrorData>> {
        match self.0.upgrade() {
            Some(hub) => hub.on_request(server, asker, request),
            None => Box::pin(async { Err(ErrorData::internal_error("the gateway is shutting down", None)) }),
        }
    }
}

/// Where one call's progress goes. The forwarding task starts with the first progress:
/// most calls have none, and a task per call would cost every call.
struct ProgressRoute {
    peer: Peer<RoleServer>,
    token: ProgressToken,
    forwarder: Option<(mpsc::UnboundedSender<ProgressNotificationParam>, tokio::task::JoinHandle<()>)>,
}

impl ProgressRoute {
    /// Queues `p` for the client, in order.
    fn forward(&mut self, p: ProgressNotificationParam) {
        let (tx, _) = self.forwarder.get_or_insert_with(|| {
            let (tx, mut rx) = mpsc::unbounded_channel::<ProgressNotificationParam>();
            let (peer, token) = (self.peer.clone(), self.token.clone());
            let task = tokio::spawn(async move {
                while let Some(mut p) = rx.recv().await {
                    p.progress_token = token.clone();
                    let _ = peer.notify_progress(p).await;
                }
            });
            (tx, task)
        });
        let _ = tx.send(p);
    }
}

/// The task passing one call's progress on.
pub struct ProgressForwarder(tokio::task::JoinHandle<()>);

impl ProgressForwarder {
    /// Waits until the progress relayed so far has been handed to the client's session,
    /// so that the answer, sent next, comes after it. A
    /// client that does not read is given a second, not the call.
    pub async fn flush(self) {
        let _ = tokio::time::timeout(Duration::from_secs(1), self.0).await;
    }
}

/// Keeps a call registered as in flight until dropped.
pub struct CallGuard {
    hub: Arc<Hub>,
    server: Arc<str>,
    id: u64,
}

impl CallGuard {
    /// The attempt went out as request `request` on upstream session `session`.
    pub fn sent(&self, session: u64, request: RequestId) {
        let mut in_flight = self.hub.in_flight.lock().expect("not poisoned");
        if let Some(call) = in_flight.get_mut(&self.server).and_then(|c| c.iter_mut().find(|c| c.id == self.id)) {
            call.upstream = Some((session, request));
        }
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        if let Some(calls) = self.hub.in_flight.lock().expect("not poisoned").get_mut(&self.server) {
            calls.retain(|c| c.id != self.id);
        }
    }
}
