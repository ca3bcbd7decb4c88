//! The hub: the current setup (shared servers, engine, adapters), the catalogue built
//! from them, and the downstream clients that hear about them. Shared by all downstream
//! sessions (one over stdio, many over HTTP).

// Logging, sampling and roots are deprecated by 2026-07-28 (SEP-2577) but live in every
// revision the gateway speaks; they are relayed faithfully.
#![allow(deprecated)]

use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use rmcp::model::ClientCapabilities;
use tokio::sync::watch;
use tokio::time::Instant;

use super::catalogue::Catalogue;
use super::downstreams::{Downstreams, Front};
use super::held::Held;
use super::metrics::Metrics;
use super::relay::{HubRelay, Owner};
use super::reload::LastReload;
use super::routing::Routing;
use super::session_servers::SessionServers;
use super::setup::{Changes, Setup, Touched};
use crate::config::{Config, ServerConfig};
use crate::errors_log::ErrorsLog;
use crate::lasting::{Locked, ReadWrite};
use crate::plugins::Prepared;
use crate::redact::Secrets;
use crate::transport::process::{Withheld, withheld};
use crate::transport::supervisor::{Revisions, ServerHandle, ServerState, Status, Supervision, spawn_supervisor};
use crate::transport::tasks::ClientTasks;
use crate::transport::{Offered, Relay};

mod follows;

pub struct Hub {
    /// The configuration's shared servers, engine and adapters; replaced by a reload.
    setup: RwLock<Arc<Setup>>,
    pub errors: Arc<ErrorsLog>,
    pub metrics: Metrics,
    pub downstreams: Downstreams,
    pub routing: Arc<Routing>,
    /// Calls of 2026-07-28 clients held open while they answer their server's questions.
    pub held: Held,
    catalogue: RwLock<Arc<Catalogue>>,
    /// What the shared servers are told the client can do: over stdio the client's own
    /// capabilities (they start once it has said), over HTTP nothing (see [`Hub::start`]).
    offer: watch::Sender<Option<Offered>>,
    /// Every per-session server instance still running, and every shared one a reload
    /// retired that still finishes its calls, to stop on shutdown.
    instances: Mutex<Vec<(Weak<ServerHandle>, Kept)>>,
    life: Life,
}

/// Why [`Hub`] keeps an instance that is not in its setup.
#[derive(Debug, Clone)]
enum Kept {
    /// A `scope: session` server's, for this session.
    Session(Weak<SessionServers>),
    /// A shared server's, replaced or removed by a reload, finishing its calls.
    Retired,
    /// A shared server's, started by a reload not yet in place (which shutdown may
    /// interrupt): stopped at shutdown like the rest.
    Starting,
}

/// The gateway's start and end.
struct Life {
    /// When the shared servers were told what their client can do, and so started: at
    /// once over HTTP, at the client's `initialize` over stdio.
    started: std::sync::OnceLock<Instant>,
    /// Every shared server finished its first start (or failed it).
    settled: std::sync::atomic::AtomicBool,
    /// Cancelled when the calls still in flight are to be ended (shutdown).
    stopping: tokio_util::sync::CancellationToken,
    /// Every tool call's handler, until it returns: a call its client cancelled, or
    /// left, is still working until then.
    answering: tokio_util::task::TaskTracker,
    /// Cancelled when shutdown begins: open `subscriptions/listen` requests end then,
    /// rather than hold the drain for its whole grace period.
    closing: tokio_util::sync::CancellationToken,
    /// What each server's starts showed of the revisions it speaks, for all its instances.
    revisions: Revisions,
    /// The variables no server process inherits, as the configuration applied last has them.
    withheld: Withheld,
    /// Over HTTP with an operator token (as the gateway started): the clients are not its
    /// operators, and what is every client's is not theirs to change.
    operated: bool,
    /// The last reload's outcome, for the status: over stdio the client hides the
    /// gateway's log, so an edit refused would otherwise go unseen.
    last_reload: LastReload,
}

impl Hub {
    /// Starts supervising every shared server and returns at once; servers come up in
    /// parallel and join the catalogue as they do. Over stdio they start once the client
    /// has initialised (see [`Hub::offer`]), to be offered exactly its capabilities. Over
    /// HTTP a shared server serves many clients, and is offered none of the capabilities
    /// a server uses to ask the client something (sampling, elicitation, roots): which of
    /// several clients it means cannot always be known, so it is never led to expect an
    /// answer. Servers that need them get `"scope": "session"`.
    pub fn start(config: Config, plugins: Prepared, front: Front) -> Arc<Self> {
        let offer = watch::Sender::new(None);
        let operated = front == Front::Http && config.settings.http.operator_token.is_some();
        let hub = Arc::new_cyclic(|weak: &Weak<Hub>| {
            let secrets = Secrets::of(&config);
            let (revisions, withheld) = (Revisions::default(), Withheld::default());
            withhold(&config, &withheld);
            let how = supervision(&config, &secrets, (&revisions, &withheld));
            let errors = ErrorsLog::start(
                config.settings.errors_log.clone(),
                config.settings.errors_log_max_bytes,
                secrets.clone(),
            );
            let setup = Setup::first(config, plugins, &spawner(weak, &offer, &how));
            let routing = Arc::new(Routing::default());
            Hub {
                setup: RwLock::new(Arc::new(setup)),
                errors,
                metrics: Metrics::default(),
                downstreams: Downstreams::new(front, routing.sending.clone()),
                routing,
                held: Held::default(),
                catalogue: RwLock::default(),
                offer,
                instances: Mutex::default(),
                life: Life {
                    started: Default::default(),
                    settled: Default::default(),
                    stopping: Default::default(),
                    answering: Default::default(),
                    closing: Default::default(),
                    revisions,
                    withheld,
                    operated,
                    last_reload: LastReload::default(),
                },
            }
        });
        let setup = hub.setup();
        setup.served_by(setup.servers.values());
        for handle in setup.servers.values() {
            hub.watch(handle, None);
        }
        if front == Front::Http {
            hub.offer(&ClientCapabilities::default(), None);
            for unseen in super::setup::unobserved(&setup.config, &setup.plugins.adapters) {
                tracing::warn!("{unseen}");
            }
        }
        hub
    }

    /// The configuration's shared servers, engine and adapters, as they are now. A call
    /// keeps the one it started with.
    pub fn setup(&self) -> Arc<Setup> {
        self.setup.reading().clone()
    }

    /// Applies `config` (validated, its adapters loaded into `plugins`) as a diff: see
    /// [`Setup::next`]. New instances of servers relaunched come up (each step of a start
    /// within `init_timeout_ms`) before they replace anything, so that a relaunched
    /// server's tools never leave the catalogue (an added server's come once it is ready);
    /// the instances replaced or removed finish their calls in flight (each within its
    /// call deadline), then stop. Clients hear what changed. Reloads are serial.
    /// Nothing is applied once shutdown has begun (`None`): what this would start, nothing
    /// would stop.
    pub async fn apply(self: &Arc<Self>, config: Config, plugins: Prepared) -> Option<Changes> {
        let current = self.setup();
        if self.life.closing.is_cancelled() {
            return None;
        }
        let (mut next, mut changes, init_timeout) = self.next_setup(&current, config, plugins);
        // (Over stdio before the client's `initialize`, nothing starts yet: nothing to wait for.)
        if self.offer.borrow().is_some() {
            // A start's steps each have `init_timeout`: the handshake (twice, when the
            // server answers `server/discover` with an error and is initialised instead),
            // then the first listing. Only the instances of servers the running
            // configuration has are waited for (relaunched, or made shared): a server the
            // reload adds comes when it is ready, as at the gateway's start, and one slow
            // to start holds up nothing else the reload changes.
            let known = |h: &&Arc<ServerHandle>| current.config.servers.contains_key(&*h.name);
            settle(changes.started.iter().filter(known), Instant::now() + init_timeout * 3).await;
            self.keep_what_did_not_relaunch(&current, &mut next, &mut changes).await;
        }
        // Shutdown began while the new instances started: they are kept, and stopped with
        // the rest; nothing is put in place.
        if self.life.closing.is_cancelled() {
            return None;
        }
        self.put_in_place(next, &mut changes);
        self.tell_clients(&changes);
        Some(changes)
    }

    /// The setup of `config` after `current`, its new instances starting (watched, and
    /// kept to be stopped at shutdown), the secrets of both hidden; and how long each
    /// step of a start may take.
    fn next_setup(self: &Arc<Self>, current: &Setup, config: Config, plugins: Prepared) -> (Setup, Changes, Duration) {
        // A server launched anew (added, or its launch or protocol changed) is asked what
        // it speaks.
        for (name, server) in &config.servers {
            let was = current.config.servers.get(name);
            if was.is_none_or(|was| was.launch != server.launch || was.protocol != server.protocol) {
                self.life.revisions.forget(name);
            }
        }
        withhold(&config, &self.life.withheld);
        let how = supervision(&config, &Secrets::of(&config), (&self.life.revisions, &self.life.withheld));
        let (mut next, changes) = current.next(config, plugins, &spawner(&Arc::downgrade(self), &self.offer, &how));
        // What was secret stays hidden: it may be in text written before the reload.
        let secrets = current.secrets.union(&next.secrets);
        crate::redact::redact_logs(secrets.clone());
        self.errors.set_secrets(secrets.clone());
        next.secrets = secrets;
        for handle in &changes.started {
            self.watch(handle, None);
            self.keep(handle, Kept::Starting);
        }
        (next, changes, how.init_timeout)
    }

    /// Puts `next` in place of the current setup: the catalogue rebuilt, subscriptions
    /// moved to the new instances, the replaced ones retired, sessions brought in line.
    fn put_in_place(self: &Arc<Self>, next: Setup, changes: &mut Changes) {
        // Before the new setup is seen: a session that starts its own instance of such a
        // server at once finds its subscriptions parked.
        self.park_made_session(&next, changes);
        changes.count_on();
        next.served_by(next.servers.values());
        let next = Arc::new(next);
        *self.setup.writing() = next.clone();
        self.rebuild(false);
        self.move_subscriptions(changes);
        for handle in changes.retired.iter().cloned() {
            // Still running its calls: stopped at shutdown like the rest, and not started
            // again with its old launch if it ends meanwhile.
            self.keep(&handle, Kept::Retired);
            let removed = !changes.relaunched(handle.instance);
            self.retire(handle, removed);
        }
        self.unpark(&next);
        // Their servers' entries, their adapters or the plugin limits may have changed.
        for session in self.live_sessions() {
            session.reloaded();
        }
    }

    /// Tells every client what a reload's `changes` changed of the gateway's own tools
    /// and resources, or of the sessions' servers.
    fn tell_clients(&self, changes: &Changes) {
        // The gateway's own tools and resources came or went.
        if changes.settings.contains(&"gateway_tools") {
            self.downstreams
                .broadcast(rmcp::model::ServerNotification::ToolListChangedNotification(Default::default()));
            self.downstreams
                .broadcast(rmcp::model::ServerNotification::ResourceListChangedNotification(Default::default()));
        }
        if changes.sessions == Touched::Added {
            // Sessions without instances of their own yet start them when they next ask.
            let changed = rmcp::model::ToolListChangedNotification::default();
            self.downstreams.broadcast(rmcp::model::ServerNotification::ToolListChangedNotification(changed));
        }
    }

    /// Stops `handle`, which a reload replaced (or, `removed`, took out): once the calls
    /// in flight on it are done, within the longest deadline of its tools in any setup it
    /// served under ([`ServerHandle::longest_call`]: its calls may have begun under any
    /// of them). Meanwhile it is not started again if it ends.
    pub fn retire(self: &Arc<Self>, handle: Arc<ServerHandle>, removed: bool) {
        handle.retire();
        let within = handle.longest_call().unwrap_or(Duration::from_secs(60));
        let hub = self.clone();
        tokio::spawn(async move {
            let deadline = Instant::now() + within;
            while hub.routing.in_flight_on(handle.instance) > 0 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            if removed {
                hub.downstreams.reinstance(handle.instance, None);
            }
            handle.shutdown().await;
        });
    }

    /// A relaunched server whose new process did not come up while its old one serves, or
    /// is starting again after a crash, keeps the old one (its subscriptions, and its
    /// breakers and budget unless their settings changed), which a
    /// typo in `command` would otherwise take down with its tools; the new one is stopped.
    /// (An old process that is down, crash-looping, gives way to the new launch.)
    async fn keep_what_did_not_relaunch(&self, current: &Setup, next: &mut Setup, changes: &mut Changes) {
        let find = |list: &[Arc<ServerHandle>], instance: u64| list.iter().find(|h| h.instance == instance).cloned();
        for (old, new) in changes.moved.clone() {
            let (Some(running), Some(failed)) = (find(&changes.retired, old), find(&changes.started, new)) else {
                continue;
            };
            let (was, is) = (running.state(), failed.state());
            if !keeps_old(&was, &is) {
                continue;
            }
            tracing::error!(
                server = %running.name,
                "reload: the new launch did not start ({}); the old launch keeps serving ({}): fix `mcpServers.{}` and save again (a server that cannot run twice at once, holding a fixed port or an exclusive lock, takes a new launch only when the gateway restarts)",
                is.last_error.as_deref().unwrap_or("not ready in time"),
                was.status.as_str(),
                running.name
            );
            next.keep_running(current, &running.name, running.clone());
            // Its breakers and budget tell how that process fares.
            next.engine = Arc::new(next.engine.with_health_of(&current.engine, &running.name));
            changes.moved.retain(|m| *m != (old, new));
            changes.retired.retain(|h| h.instance != old);
            changes.restarted.retain(|n| **n != *running.name);
            changes.kept_running.push(running.name.to_string());
            failed.shutdown().await;
            // What the running process speaks, which the failed launch made forgotten (one
            // starting again learns it when it is up).
            if was.status == Status::Ready {
                let spoken = was.session.as_ref().and_then(|s| s.info.as_ref()).map(|i| i.protocol_version.clone());
                self.life.revisions.learn(&running.name, spoken.as_ref());
            }
        }
    }

    /// How every server of this gateway is supervised.
    pub fn supervision(&self) -> Supervision {
        let setup = self.setup();
        supervision(&setup.config, &setup.secrets, (&self.life.revisions, &self.life.withheld))
    }

    /// The stdio client initialised with `caps` (and runs `tasks` as tasks): the shared
    /// servers start, offered them. (Over HTTP the offer was made at start; this changes
    /// nothing.)
    pub fn offer(&self, caps: &ClientCapabilities, tasks: Option<ClientTasks>) {
        self.offer.send_if_modified(|offer| {
            if offer.is_some() {
                return false;
            }
            let _ = self.life.started.set(Instant::now());
            *offer = Some(offered(caps, tasks));
            true
        });
    }

    /// Follows `handle`'s state: re-applies what clients set when it is ready, rebuilds
    /// the catalogue (the shared one, or its owner's), and forgets the tasks clients ran
    /// for a connection that ended.
    pub fn watch(self: &Arc<Self>, handle: &Arc<ServerHandle>, owner: Option<Owner>) {
        let mut rx = handle.subscribe();
        let weak = Arc::downgrade(self);
        let name = handle.name.clone();
        self.metrics.restarted(&name, 0); // every server has its series, from zero
        let instance = handle.instance;
        let handle = Arc::downgrade(handle);
        let connection = |state: &ServerState| state.session.as_ref().map(|s| s.id);
        tokio::spawn(async move {
            let mut restarts = 0;
            let (mut last, mut connected) = {
                let state = rx.borrow(); // one read lock: a second, taken while a writer waits, could deadlock
                (state.status, connection(&state))
            };
            let forget = |id: Option<u64>| {
                if let (Some(id), Some(hub)) = (id, weak.upgrade()) {
                    hub.routing.run_by_clients.forget_connection(id);
                    hub.routing.relayed.connection_lost(instance);
                }
            };
            while rx.changed().await.is_ok() {
                let (status, now, restarted_now) = {
                    let state = rx.borrow_and_update();
                    (state.status, connection(&state), state.restarts)
                };
                if now != connected {
                    forget(std::mem::replace(&mut connected, now));
                }
                let (Some(hub), Some(handle)) = (weak.upgrade(), handle.upgrade()) else { break };
                if restarted_now > restarts {
                    hub.metrics.restarted(&name, restarted_now - std::mem::replace(&mut restarts, restarted_now));
                }
                // Ready from anything but its first start: a restart.
                let restarted = status == Status::Ready && last != Status::Starting;
                if status == Status::Ready && status != last {
                    hub.on_ready(&handle, owner.as_ref(), restarted);
                }
                if status != last {
                    hub.rebuild_for(owner.as_ref(), restarted);
                }
                last = status;
            }
            forget(connected);
        });
    }

    /// The running instances of `scope: session` server `name`, one per session using it.
    pub fn instances_of(&self, name: &str) -> Vec<Arc<ServerHandle>> {
        let list = self.instances.locked();
        let sessions =
            list.iter().filter(|(_, kept)| matches!(kept, Kept::Session(_))).filter_map(|(h, _)| h.upgrade());
        sessions.filter(|h| &*h.name == name && !h.is_stopped() && !h.is_retired()).collect()
    }

    /// Server instance `instance`, shared or a session's own, while it runs.
    fn instance(&self, instance: u64) -> Option<Arc<ServerHandle>> {
        let shared = self.setup().servers.values().find(|h| h.instance == instance).cloned();
        shared.or_else(|| {
            let own = self.instances.locked();
            own.iter().filter_map(|(h, _)| h.upgrade()).find(|h| h.instance == instance)
        })
    }

    /// The shared servers' instances a client's log level reaches: the current setup's,
    /// and those a reload is starting to put in place, which may be ready before they are
    /// (a level set in between would otherwise reach only the instances they replace).
    pub fn shared_instances(&self) -> Vec<Arc<ServerHandle>> {
        let mut all: Vec<Arc<ServerHandle>> = self.setup().servers.values().cloned().collect();
        let list = self.instances.locked();
        let starting = list.iter().filter(|(_, kept)| matches!(kept, Kept::Starting)).filter_map(|(h, _)| h.upgrade());
        for handle in starting {
            // (Still tagged once in place, and when a later reload retires it.)
            let gone = handle.is_stopped() || handle.is_retired();
            if !gone && !all.iter().any(|h| h.instance == handle.instance) {
                all.push(handle);
            }
        }
        all
    }

    /// Keeps `handle` (an instance of `session`'s own) to be stopped on shutdown, and
    /// `session` to be told of reloads while it runs.
    pub fn keep_instance(&self, handle: &Arc<ServerHandle>, session: Weak<SessionServers>) {
        self.keep(handle, Kept::Session(session));
    }

    /// Every session with instances of its own running, once each.
    fn live_sessions(&self) -> Vec<Arc<SessionServers>> {
        let mut sessions: Vec<Weak<SessionServers>> = Vec::new();
        for (handle, kept) in self.instances.locked().iter() {
            if let Kept::Session(session) = kept
                && handle.strong_count() > 0
                && !sessions.iter().any(|s| Weak::ptr_eq(s, session))
            {
                sessions.push(session.clone());
            }
        }
        // Upgraded outside the lock: a session that ends as its last strong reference
        // here goes stops its instances, which takes the lock.
        sessions.iter().filter_map(Weak::upgrade).collect()
    }

    /// Whether shutdown has begun: nothing more is started.
    pub fn is_closing(&self) -> bool {
        self.life.closing.is_cancelled()
    }

    fn keep(&self, handle: &Arc<ServerHandle>, why: Kept) {
        let mut list = self.instances.locked();
        list.retain(|(w, _)| w.strong_count() > 0);
        list.push((Arc::downgrade(handle), why));
    }

    pub fn catalogue(&self) -> Arc<Catalogue> {
        self.catalogue.reading().clone()
    }

    /// `server`'s `recovery.timeout_ms` (30 s for one no longer configured).
    fn timeout_of(&self, server: &str) -> Duration {
        let setup = self.setup();
        Duration::from_millis(setup.config.servers.get(server).map_or(30_000, |s| s.recovery.timeout_ms))
    }

    fn startup_timeout(&self) -> Duration {
        Duration::from_millis(self.setup().config.settings.startup_timeout_ms)
    }

    /// The shared servers still in their first start, within the start-up wait: while
    /// there are any, the gateway is not ready.
    pub fn starting(&self, setup: &Setup) -> Vec<Arc<str>> {
        let over = self.startup_over();
        setup
            .servers
            .values()
            .filter(|h| {
                let state = h.state();
                !over && state.status == Status::Starting && state.last_error.is_none()
            })
            .map(|h| h.name.clone())
            .collect()
    }

    /// Ends every tool call still in flight with an error result (shutdown).
    pub fn stop_calls(&self) {
        self.life.stopping.cancel();
    }

    /// Cancelled when the calls in flight are to end.
    pub fn stopping(&self) -> &tokio_util::sync::CancellationToken {
        &self.life.stopping
    }

    /// Tracks a tool call's handler until it returns (see [`Hub::all_answered`]).
    pub(super) fn answering<F: Future>(&self, handler: F) -> tokio_util::task::task_tracker::TrackedFuture<F> {
        self.life.answering.track_future(handler)
    }

    /// The tool calls being answered, with a request or without (their client gone).
    pub fn calls_answering(&self) -> usize {
        self.life.answering.len()
    }

    /// Returns once every tool call's handler has returned (shutdown: no new one comes).
    pub async fn all_answered(&self) {
        self.life.answering.close();
        self.life.answering.wait().await;
    }

    /// Shutdown begins: requests that would stay open until their client leaves (a
    /// `subscriptions/listen`) end now.
    pub fn close(&self) {
        self.life.closing.cancel();
    }

    /// Cancelled when shutdown begins.
    pub fn closing(&self) -> &tokio_util::sync::CancellationToken {
        &self.life.closing
    }

    /// Whether the gateway has an operator apart from its clients: over HTTP, with an
    /// operator token. Without one, whoever holds the clients' token is the operator
    /// (`/status`, `/metrics`, `POST /reset-breaker`).
    pub fn operated(&self) -> bool {
        self.life.operated
    }

    /// The last reload's outcome, for the status.
    pub fn last_reload(&self) -> &LastReload {
        &self.life.last_reload
    }

    /// Whether the start-up wait is over: every shared server finished its first start
    /// (or failed it), or `startup_timeout_ms` passed.
    pub fn startup_over(&self) -> bool {
        self.life.settled.load(std::sync::atomic::Ordering::Acquire)
            || self.life.started.get().is_some_and(|at| at.elapsed() >= self.startup_timeout())
    }

    /// Waits until every shared server has finished its first start (or failed it), at
    /// most until the start-up deadline, so that the first answer is complete.
    pub async fn settled(&self) {
        // On the call path: once settled, this is one atomic load.
        if self.life.settled.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        // Over stdio the servers start at the client's `initialize`, which precedes every
        // request that waits here.
        let started = self.life.started.get().copied().unwrap_or_else(Instant::now);
        settle(self.setup().servers.values(), started + self.startup_timeout()).await;
        // The state watchers rebuild too, but asynchronously: make sure the first answer
        // already has every server that is up. Set only afterwards, so that a caller who
        // skips the wait finds the catalogue built (two first callers may both rebuild;
        // rebuilds are serialised and announce only differences).
        self.rebuild(false);
        self.life.settled.store(true, std::sync::atomic::Ordering::Release);
    }

    /// `request`, one the gateway makes to `instance` about what several clients share
    /// ([`super::routing::Routing::aside`]), answered within `within`.
    pub(super) async fn aside<T>(
        &self,
        instance: u64,
        within: Duration,
        request: impl Future<Output = T>,
    ) -> Result<T, tokio::time::error::Elapsed> {
        let aside = self.routing.aside(instance);
        let done = tokio::time::timeout(within, request).await;
        if done.is_ok() {
            aside.answered();
        }
        done
    }

    /// Rebuilds the catalogue `owner` sees (the shared one when none); after a restart
    /// (`force`) its clients are told the tools changed even if nothing did: their view
    /// may have been invalidated by errors they saw meanwhile.
    pub(super) fn rebuild_for(&self, owner: Option<&Owner>, force: bool) {
        match owner {
            None => self.rebuild(force),
            Some(owner) => {
                if let Some(servers) = owner.servers.upgrade() {
                    servers.rebuild(force);
                }
            }
        }
    }

    /// Rebuilds the shared catalogue from the servers' latest listings and tells clients
    /// what changed (tools always, with `force`).
    pub fn rebuild(&self, force: bool) {
        // Held while reading the servers' states, so that two rebuilds racing cannot
        // store a catalogue older than the one before it.
        let mut current = self.catalogue.writing();
        let next = Arc::new(self.build_catalogue(&|_| None));
        tracing::debug!(tools = next.tools.len(), "catalogue rebuilt");
        let prev = std::mem::replace(&mut *current, next.clone());
        drop(current);
        for change in prev.changes(&next, force) {
            self.downstreams.broadcast(change);
        }
    }

    /// The catalogue of every configured server's latest listing, in configuration
    /// order: `own`'s instance where it has one, else the shared server.
    pub fn build_catalogue(&self, own: &dyn Fn(&str) -> Option<Arc<ServerHandle>>) -> Catalogue {
        let setup = self.setup();
        let listings: Vec<_> = setup
            .config
            .servers
            .keys()
            .filter_map(|name| {
                let handle = own(name).or_else(|| setup.servers.get(name.as_str()).cloned())?;
                Some((handle.name.clone(), handle.state().session?.listing()))
            })
            .collect();
        Catalogue::build(&listings, setup.config.settings.tool_names)
    }

    /// Begins shutdown ([`Self::close`]: nothing new starts) and stops every server in
    /// parallel, the sessions' own instances and those a reload retired (still finishing
    /// calls) too, and waits until their processes are gone. Instances a reload under way
    /// started meanwhile (it checked before shutdown began) are stopped in a pass after.
    pub async fn shutdown(&self) {
        self.close();
        let mut stopped = std::collections::HashSet::new();
        loop {
            let setup = self.setup();
            let kept = self.instances.locked().iter().filter_map(|(h, _)| h.upgrade()).collect();
            let all: Vec<Arc<ServerHandle>> = setup.servers.values().cloned().chain::<Vec<_>>(kept).collect();
            let left: Vec<_> = all.into_iter().filter(|h| stopped.insert(h.instance)).collect();
            if left.is_empty() {
                break;
            }
            futures::future::join_all(left.iter().map(|h| h.shutdown())).await;
        }
        self.errors.flush(std::time::Duration::from_secs(1)).await;
    }
}

/// Starts a shared server's supervisor, its traffic relayed to `hub`.
fn spawner<'a>(
    hub: &'a Weak<Hub>,
    offer: &'a watch::Sender<Option<Offered>>,
    how: &'a Supervision,
) -> impl Fn(&ServerConfig) -> Arc<ServerHandle> + 'a {
    move |s| {
        let relay = |instance| -> Arc<dyn Relay> { Arc::new(HubRelay { hub: hub.clone(), instance, owner: None }) };
        Arc::new(spawn_supervisor(s.clone(), relay, offer.subscribe(), how))
    }
}

/// Withholds from the server processes started from now on what `config` has them
/// withheld (`process::withheld`).
fn withhold(config: &Config, held: &Withheld) {
    held.set(withheld(config.settings.http.tokens(), crate::redact::secret_variables(config)));
}

/// What `config`'s servers are supervised with.
fn supervision(config: &Config, secrets: &Secrets, (revisions, held): (&Revisions, &Withheld)) -> Supervision {
    Supervision {
        policy: config.settings.restart,
        init_timeout: Duration::from_millis(config.settings.init_timeout_ms),
        secrets: secrets.clone(),
        withheld: held.clone(),
        revisions: revisions.clone(),
    }
}

/// What a server is told of a client's capabilities: all of them but the 2026-07-28 tasks
/// extension, declared only for the tool a client called (`call::request_meta`); and the
/// requests the client runs as tasks (MCP 2025-11-25), which reach stdio servers (see
/// `transport::tasks`).
pub fn offered(caps: &ClientCapabilities, tasks: Option<ClientTasks>) -> Offered {
    let mut caps = caps.clone();
    if let Some(ext) = caps.extensions.as_mut() {
        ext.remove(rmcp::model::TASKS_EXTENSION_ID);
    }
    Offered { caps, tasks }
}

/// A 2026-07-28 client's capabilities as offered to servers on older revisions, before
/// [`offered`] applies: without roots. That client takes no requests from servers; what
/// a server asks while serving one of its calls (sampling, elicitation, roots) reaches it
/// as questions in the call's answer (`super::held`), but servers ask for roots mostly on
/// their own (at start, on a change), outside any call, where the client cannot be asked,
/// and a server that was told the client has roots may take the refusal for none.
pub fn offered_modern(caps: &ClientCapabilities) -> ClientCapabilities {
    let mut caps = caps.clone();
    caps.roots = None;
    caps
}

/// Whether a relaunched server keeps its old instance (in state `was`) over its new one
/// (in state `is`, its start settled): while the new one is not up and the old one serves,
/// or is starting again after it served, in which case the new one must have failed, not
/// merely be slower to come up. An old one that is down, or never served, gives way.
pub fn keeps_old(was: &ServerState, is: &ServerState) -> bool {
    let again = matches!(was.status, Status::Starting | Status::Restarting) && was.session.is_some();
    let serves = was.status == Status::Ready || (again && is.last_error.is_some());
    is.status != Status::Ready && serves
}

/// Waits until each of `handles` has finished its first start (or failed it), at most
/// until `deadline`.
pub async fn settle<'a>(handles: impl Iterator<Item = &'a Arc<ServerHandle>>, deadline: Instant) {
    for handle in handles {
        let mut rx = handle.subscribe();
        let _ =
            tokio::time::timeout_at(deadline, rx.wait_for(|s| s.status != Status::Starting || s.last_error.is_some()))
                .await;
    }
}
