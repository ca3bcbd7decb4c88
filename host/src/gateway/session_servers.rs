//! One client session's view of the servers: the shared ones, and its own instance of
//! each `"scope": "session"` server. Its instances start on the session's first request
//! after it initialised, offered exactly its capabilities, and stop when the session ends
//! (closed by the client, idle past `rebound.http.session_idle_ms`, or closed to make room
//! past `rebound.http.max_sessions`, `super::sessions`). Each has its own supervision, breakers, retry
//! budget and adapter state (such as the HOL cursor); counters and metrics add up under
//! the server's name. What an instance says reaches its session only. A reload brings a
//! running session's instances in line with the new configuration, as it does the shared
//! servers: an unchanged launch keeps its process, a changed one gets a new process, a
//! removed server's instance stops, an added one starts; the instances replaced finish
//! their calls first.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use indexmap::IndexMap;
use rmcp::model::ClientCapabilities;
use rmcp::{Peer, RoleServer};
use tokio::time::Instant;

mod own;

use self::own::{Carried, Own, OwnRecovery, recovery_of, runs};
use super::catalogue::Catalogue;
use super::hub::{Hub, keeps_old, offered, settle};
use super::relay::{HubRelay, Owner};
use super::setup::Setup;
use super::tasks::Tasks;
use crate::config::{Launch, SESSION_VAR, Scope, ServerConfig};
use crate::lasting::Locked;
use crate::plugins::Adapters;
use crate::recovery::breaker::Blame;
use crate::recovery::engine::Engine;
use crate::recovery::plan::Advisor;
use crate::transport::Session;
use crate::transport::supervisor::{NotReady, ServerHandle, Supervision, spawn_supervisor};
use crate::transport::tasks::ClientTasks;
use crate::transport::{Offered, Relay};

/// The servers one client session reaches.
pub struct SessionServers {
    hub: Arc<Hub>,
    /// The session's name (in the errors log and the routing of calls).
    pub client: Arc<str>,
    /// The session's peer, and what its own instances are offered of its capabilities,
    /// once it initialised.
    peer: OnceLock<(Peer<RoleServer>, Offered)>,
    /// Its own instances, as the setup they were last brought in line with configures
    /// them ([`Self::own`]), and the relaunches coming up to replace some of them.
    own: Mutex<Instances>,
    /// The catalogue with this session's instances, and what it was built from.
    catalogue: Mutex<Option<Built>>,
    /// The tasks the session started (MCP 2025-11-25), and where each lives.
    pub tasks: Tasks,
    /// Whom its failures on a shared server are blamed on, over HTTP, from its
    /// `initialize` (see `tool_call::blame_of`).
    pub blamed: OnceLock<Blame>,
}

/// A session's own instances, and the relaunches of some of them still coming up.
#[derive(Default)]
struct Instances {
    serving: Option<Arc<Own>>,
    /// By server: the new instance of a changed launch, until it takes over or is given
    /// up ([`SessionServers::settle_relaunch`]). A later reload asking for the same launch
    /// waits for it rather than starting another; one asking for another stops it.
    coming: Coming,
}

/// By server, its relaunch coming up.
type Coming = HashMap<Arc<str>, Arc<ServerHandle>>;

/// Relaunches started: the old instance, serving until the new one takes over.
type Relaunched = Vec<(Arc<ServerHandle>, Arc<ServerHandle>)>;

/// How a relaunch coming up settled.
enum Relaunch {
    /// It serves from now on.
    TookOver,
    /// It did not come up: the old instance serves on.
    Failed,
    /// A later reload wants another launch, or none.
    Superseded,
}

/// A session's catalogue, and the shared catalogue and own instances it was built from.
struct Built {
    shared: Arc<Catalogue>,
    own: Arc<Own>,
    catalogue: Arc<Catalogue>,
}

/// The recovery engine and adapters one call runs with: the setup's, with this session's
/// own instances' in place of theirs.
pub struct Recovery {
    pub setup: Arc<Setup>,
    own: Option<Arc<OwnRecovery>>,
}

impl Recovery {
    pub fn engine(&self) -> &Engine {
        self.own.as_ref().map_or(&*self.setup.engine, |o| &o.0)
    }

    pub fn adapters(&self) -> &Adapters {
        self.own.as_ref().map_or(&self.setup.plugins.adapters, |o| &o.1)
    }

    pub fn advisor(&self) -> Option<&dyn Advisor> {
        let adapters = self.adapters();
        (!adapters.is_empty()).then_some(adapters as _)
    }
}

impl SessionServers {
    pub fn new(hub: Arc<Hub>, client: Arc<str>) -> Arc<Self> {
        Arc::new(Self {
            hub,
            client,
            peer: OnceLock::new(),
            own: Mutex::default(),
            catalogue: Mutex::default(),
            tasks: Tasks::default(),
            blamed: OnceLock::new(),
        })
    }

    /// The session initialised (or, on 2026-07-28, made its first request): its
    /// instances may start from now on, offered `caps` (and `tasks`). Whether this was
    /// the first time: a session initialises once.
    pub fn initialised(&self, peer: Peer<RoleServer>, caps: ClientCapabilities, tasks: Option<ClientTasks>) -> bool {
        self.peer.set((peer, offered(&caps, tasks))).is_ok()
    }

    /// Whether the session has introduced itself (see [`Self::initialised`]).
    pub fn is_initialised(&self) -> bool {
        self.peer.get().is_some()
    }

    /// The session's own instances, started on first use and brought in line with the
    /// configuration after a reload (the instances it gives up stop once their calls are
    /// done); none before it initialised or when no server is `session`-scoped.
    fn own(self: &Arc<Self>) -> Option<Arc<Own>> {
        let mut own = self.own.locked();
        // Read under the lock: a request that read an older setup cannot bring the
        // session back to it after a newer one was applied.
        let setup = self.hub.setup();
        if let Some(current) = own.serving.as_ref().filter(|o| Arc::ptr_eq(&o.on, &setup)) {
            return Some(current.clone());
        }
        // Nothing more starts once shutdown has begun.
        if self.hub.is_closing() {
            return own.serving.clone();
        }
        let scoped: Vec<&ServerConfig> = setup.config.servers.values().filter(|s| s.scope == Scope::Session).collect();
        if own.serving.is_none() && scoped.is_empty() {
            return None;
        }
        let (peer, caps) = self.peer.get()?;
        let before = own.serving.take();
        let superseded = self.superseded(&mut own.coming, &setup, &scoped, before.as_deref());
        let mut relaunched = Vec::new();
        let next = (!scoped.is_empty()).then(|| {
            let relaunches = (&mut own.coming, &mut relaunched);
            Arc::new(self.start(&setup, &scoped, (peer, caps), before.as_deref(), relaunches))
        });
        if let Some(next) = &next {
            setup.served_by(next.servers.values());
        }
        own.serving.clone_from(&next);
        // Under the lock, like a relaunch's: a reload that removes the new instance next
        // ends them after.
        for handle in next.iter().flat_map(|n| n.servers.values()) {
            if !before.as_ref().is_some_and(|b| b.has(handle)) {
                self.hub.claim_parked(&self.client, handle);
            }
        }
        drop(own);
        for handle in superseded {
            tracing::info!(session = %self.client, server = %handle.name, "a later reload changed the session's relaunch still coming up: it stops");
            tokio::spawn(async move { handle.shutdown().await });
        }
        for handle in before.iter().flat_map(|b| b.servers.values()) {
            if !next.as_ref().is_some_and(|n| n.has(handle)) {
                // Made shared: the session's subscriptions move to the shared instance.
                if let Some(shared) = setup.servers.get(&handle.name) {
                    tracing::info!(session = %self.client, server = %handle.name, "a reload made the server shared: the session's own instance stops once its calls are done, and its subscriptions move to the shared one");
                    self.hub.move_subscriptions_to(handle.instance, shared.clone());
                } else {
                    tracing::info!(session = %self.client, server = %handle.name, "a reload removed the session's own instance: it stops once its calls are done");
                }
                self.hub.retire(handle.clone(), true);
            }
        }
        for (old, new) in relaunched {
            self.take_over_when_up(old, new);
        }
        next
    }

    /// The relaunches in `coming` that `setup` no longer wants (another launch of their
    /// server, the old launch again, or no such server), taken out of it to be stopped.
    fn superseded(
        &self,
        coming: &mut Coming,
        setup: &Setup,
        scoped: &[&ServerConfig],
        before: Option<&Own>,
    ) -> Vec<Arc<ServerHandle>> {
        let mut superseded = Vec::new();
        coming.retain(|name, new| {
            let template = scoped.iter().find(|t| t.name.as_str() == &**name);
            let wanted = template.is_some_and(|t| {
                runs(new, t, &self.client) && before.is_none_or(|b| b.keeps(setup, t, &self.client).is_none())
            });
            if !wanted {
                superseded.push(new.clone());
            }
            wanted
        });
        superseded
    }

    /// `new`, the relaunch of `old`, takes its place once it is up, as a shared server's
    /// does: `old` finishes its calls (under the deadlines they began with) and stops, the
    /// subscriptions move. One that does not come up is stopped, and `old` keeps serving
    /// with its launch (tried again at the next reload); one a later reload superseded
    /// was stopped there.
    fn take_over_when_up(self: &Arc<Self>, old: Arc<ServerHandle>, new: Arc<ServerHandle>) {
        let (session, within) = (Arc::downgrade(self), self.hub.supervision().init_timeout * 3);
        tokio::spawn(async move {
            settle(std::iter::once(&new), Instant::now() + within).await;
            let Some(session) = session.upgrade() else { return new.shutdown().await };
            match session.settle_relaunch(&old, &new) {
                Relaunch::TookOver => {
                    session.hub.retire(old, false);
                    session.rebuild(false);
                }
                Relaunch::Failed => {
                    let state = new.state();
                    tracing::error!(session = %session.client, server = %new.name, "reload: the session's new launch did not start ({}); its running instance keeps serving with its old launch: fix `mcpServers.{}` and save again", state.last_error.as_deref().unwrap_or("not ready in time"), new.name);
                    new.shutdown().await;
                }
                Relaunch::Superseded => new.shutdown().await,
            }
        });
    }

    /// `new`, the relaunch of `old` coming up, its start settled, serves in place of
    /// `old` from now on if it is up and still wanted (see [`Own::taken_over`]); else it
    /// failed (as [`keeps_old`] says for a shared server) or was superseded.
    fn settle_relaunch(&self, old: &Arc<ServerHandle>, new: &Arc<ServerHandle>) -> Relaunch {
        let mut own = self.own.locked();
        if !own.coming.get(&new.name).is_some_and(|c| Arc::ptr_eq(c, new)) {
            return Relaunch::Superseded;
        }
        own.coming.remove(&new.name);
        if keeps_old(&old.state(), &new.state()) {
            return Relaunch::Failed;
        }
        let Some(next) = own.serving.as_ref().and_then(|o| o.taken_over(old, new, &self.client)) else {
            return Relaunch::Superseded;
        };
        own.serving = Some(Arc::new(next));
        // Moved under the lock: a reload that removes `new` next retires it only after.
        self.hub.move_subscriptions_to(old.instance, new.clone());
        Relaunch::TookOver
    }

    /// This session's instances of `scoped`, as `setup` configures them: those of
    /// `before` (as an earlier setup configured them) whose launch is unchanged are
    /// kept, with their breakers, budget and adapter state while their entry and adapter
    /// are unchanged too; the rest start.
    /// A relaunched server's new instance goes to `coming`, and to `relaunched` with the
    /// old one, which serves until it is up ([`Self::take_over_when_up`]); one already
    /// coming up with that launch is waited for, not started again.
    fn start(
        self: &Arc<Self>,
        setup: &Arc<Setup>,
        scoped: &[&ServerConfig],
        (peer, caps): (&Peer<RoleServer>, &Offered),
        before: Option<&Own>,
        (coming, relaunched): (&mut Coming, &mut Relaunched),
    ) -> Own {
        let (_, offer) = tokio::sync::watch::channel(Some(caps.clone()));
        let how = self.hub.supervision();
        let owner = Owner { client: self.client.clone(), peer: peer.clone(), servers: Arc::downgrade(self) };
        let (mut servers, mut carried, mut new) = (IndexMap::new(), Vec::new(), 0);
        for template in scoped {
            let kept = before.and_then(|b| b.keeps(setup, template, &self.client));
            let handle = match (kept, before.and_then(|b| b.servers.get(template.name.as_str()))) {
                (Some(kept), _) => kept.handle.clone(),
                // Its relaunch with this launch is coming up already (`superseded` left
                // only such ones).
                (None, Some(old)) if coming.contains_key(template.name.as_str()) => old.clone(),
                (None, Some(old)) => {
                    let handle = self.spawn(template, &owner, &offer, &how);
                    new += 1;
                    coming.insert(handle.name.clone(), handle.clone());
                    relaunched.push((old.clone(), handle));
                    old.clone()
                }
                (None, None) => {
                    new += 1;
                    self.spawn(template, &owner, &offer, &how)
                }
            };
            let serving_on = || before.map_or(Carried::Nothing, |b| b.serving_on(setup, template, &handle));
            carried.push((template.name.as_str(), kept.map_or_else(serving_on, |kept| kept.state)));
            servers.insert(handle.name.clone(), handle);
        }
        let (policies, forks) = recovery_of(setup, carried);
        if new > 0 {
            tracing::info!(session = %self.client, servers = new, "started the session's own servers");
        }
        // Brought in line after a reload, the session does not wait for the instances
        // that starts (its calls to them wait for them): they join its catalogue when up.
        let (started, settled) = match before {
            Some(b) => (b.started, b.settled.load(Ordering::Acquire)),
            None => (Instant::now(), false),
        };
        let (on, recovery, settled) = (setup.clone(), Mutex::default(), AtomicBool::new(settled));
        Own { on, servers, policies, forks, recovery, started, settled }
    }

    /// Starts this session's instance of `template`'s server, its requests to the
    /// client going to `owner`.
    fn spawn(
        self: &Arc<Self>,
        template: &ServerConfig,
        owner: &Owner,
        offer: &tokio::sync::watch::Receiver<Option<Offered>>,
        how: &Supervision,
    ) -> Arc<ServerHandle> {
        let hub = Arc::downgrade(&self.hub);
        let relay = |instance| -> Arc<dyn Relay> {
            Arc::new(HubRelay { hub: hub.clone(), instance, owner: Some(owner.clone()) })
        };
        let config = template.for_session(&self.client);
        make_session_folder(template, &config);
        let handle = Arc::new(spawn_supervisor(config, relay, offer.clone(), how));
        self.hub.keep_instance(&handle, Arc::downgrade(self));
        self.hub.watch(&handle, Some(owner.clone()));
        handle
    }

    /// A reload changed the `scope: session` servers: this session's instances are
    /// brought in line now, not at its next request, and it hears what that changed.
    pub fn reloaded(self: &Arc<Self>) {
        self.rebuild(false);
    }

    /// Waits for the first start of every server this session reaches (bounded by
    /// `startup_timeout_ms`), like the first `tools/list` does.
    pub async fn settled(self: &Arc<Self>) {
        self.hub.settled().await;
        let Some(own) = self.own() else { return };
        if own.settled.load(Ordering::Acquire) {
            return;
        }
        let deadline = own.started + Duration::from_millis(self.hub.setup().config.settings.startup_timeout_ms);
        settle(own.servers.values(), deadline).await;
        self.rebuild(false);
        own.settled.store(true, Ordering::Release);
    }

    /// The catalogue this session sees: built on first use; built again, and the session
    /// told what changed, once the shared catalogue or its own instances (a reload) changed.
    pub fn catalogue(self: &Arc<Self>) -> Arc<Catalogue> {
        let shared = self.hub.catalogue();
        let own = self.own();
        match (&*self.catalogue.locked(), &own) {
            (None, None) => return shared,
            (Some(b), Some(own)) if Arc::ptr_eq(&b.shared, &shared) && Arc::ptr_eq(&b.own, own) => {
                return b.catalogue.clone();
            }
            _ => {}
        }
        self.built(false, false)
    }

    /// One of this session's instances changed: rebuild its catalogue and tell it what
    /// changed (tools always, with `force`). A session left with no instances of its own
    /// (a reload removed them) sees the shared catalogue again.
    pub fn rebuild(self: &Arc<Self>, force: bool) {
        self.built(force, true);
    }

    /// Builds the session's catalogue and tells it what changed since the last one (with
    /// `first`, also when there was none).
    fn built(self: &Arc<Self>, force: bool, first: bool) -> Arc<Catalogue> {
        // Its instances are read under the catalogue's lock: two builds racing store the
        // newer last.
        let mut cached = self.catalogue.locked();
        let own = self.own();
        let shared = self.hub.catalogue();
        let (prev, next) = match own {
            Some(own) => {
                let catalogue = Arc::new(self.hub.build_catalogue(&|name| own.servers.get(name).cloned()));
                (cached.replace(Built { shared, own, catalogue: catalogue.clone() }), catalogue)
            }
            None => (cached.take(), shared),
        };
        drop(cached);
        let prev = match prev {
            Some(built) => built.catalogue,
            None if first => Arc::default(),
            None => return next,
        };
        for change in prev.changes(&next, force) {
            self.hub.downstreams.tell(&self.client, change);
        }
        next
    }

    /// This session's own instance of `server`, if it has one.
    pub fn instance(&self, server: &str) -> Option<Arc<ServerHandle>> {
        self.current()?.servers.get(server).cloned()
    }

    /// The instance of `server` this session's calls go to.
    pub fn server(&self, server: &str) -> Option<Arc<ServerHandle>> {
        self.server_in(&self.hub.setup(), server)
    }

    /// `find()`'s instance of `server` with `hold` (the request's count on it) taken on
    /// it, and its live session, waiting up to `within` for a start in progress. A reload
    /// that swapped the setup between the find and the hold may have found nothing in
    /// flight on that instance, and be stopping it; one that replaced it while the request
    /// waited does not start it again: either way the current one is taken. `Err(None)`:
    /// no such server.
    pub async fn ready<H>(
        &self,
        server: &str,
        find: impl Fn() -> Option<Arc<ServerHandle>>,
        hold: impl Fn(u64) -> H,
        within: Duration,
    ) -> Result<(Arc<ServerHandle>, H, Arc<Session>), Option<NotReady>> {
        let until = Instant::now() + within;
        loop {
            let handle = find().ok_or(None)?;
            let held = hold(handle.instance);
            if self.replaced(server, handle.instance) {
                continue;
            }
            let left = until.saturating_duration_since(Instant::now());
            match handle.ready_session(left).await {
                Ok(session) => return Ok((handle, held, session)),
                Err(_) if self.replaced(server, handle.instance) && !left.is_zero() => continue,
                Err(nr) => return Err(Some(nr)),
            }
        }
    }

    /// Whether a reload replaced `instance` of `server` with another.
    pub fn replaced(&self, server: &str, instance: u64) -> bool {
        self.server(server).is_some_and(|now| now.instance != instance)
    }

    /// The instance of `server` a call that started on `setup` goes to: this session's
    /// own, else `setup`'s shared one.
    pub fn server_in(&self, setup: &Setup, server: &str) -> Option<Arc<ServerHandle>> {
        self.instance(server).or_else(|| setup.servers.get(server).cloned())
    }

    /// Every instance this session reaches: its own, then the shared ones.
    pub fn all(&self) -> Vec<Arc<ServerHandle>> {
        let own = self.current().into_iter().flat_map(|o| o.servers.values().cloned().collect::<Vec<_>>());
        own.chain(self.hub.setup().servers.values().cloned()).collect()
    }

    /// Its own instances as last brought in line with the configuration.
    fn current(&self) -> Option<Arc<Own>> {
        self.own.locked().serving.clone()
    }

    /// Its own instances only.
    pub fn own_instances(&self) -> Vec<Arc<ServerHandle>> {
        self.current().into_iter().flat_map(|o| o.servers.values().cloned().collect::<Vec<_>>()).collect()
    }

    /// The recovery engine and adapters of this session's next call.
    pub fn recovery(&self) -> Recovery {
        let setup = self.hub.setup();
        let Some(own) = self.current() else { return Recovery { setup, own: None } };
        let mut cached = own.recovery.locked();
        let built = match &*cached {
            Some((on, built)) if Arc::ptr_eq(on, &setup) => built.clone(),
            _ => {
                let built = Arc::new((setup.engine.overlay(&own.policies), setup.plugins.adapters.overlay(&own.forks)));
                *cached = Some((setup.clone(), built.clone()));
                built
            }
        };
        Recovery { setup, own: Some(built) }
    }
}

impl Drop for SessionServers {
    fn drop(&mut self) {
        if tokio::runtime::Handle::try_current().is_ok() {
            self.hub.session_ended(&self.client);
        }
        self.hub.errors.close_view(&self.client);
        let own = std::mem::take(self.own.locked_mut());
        let Some(serving) = own.serving else { return };
        tracing::info!(session = %self.client, "the session ended; stopping its own servers");
        let servers: Vec<_> = serving.servers.values().chain(own.coming.values()).cloned().collect();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                futures::future::join_all(servers.iter().map(|h| h.shutdown())).await;
            });
        }
    }
}

/// A `cwd` that names the session (`${REBOUND_SESSION}`) is the session's own folder,
/// made when its instance starts: a server keeping its state there expects it to exist.
/// It is kept when the session ends (it holds that state), and is its user's alone (as
/// are any folders made above it), whatever the umask: another user of the machine
/// reads neither the session's state nor, from the folders' names, its id.
fn make_session_folder(template: &ServerConfig, config: &ServerConfig) {
    use std::os::unix::fs::DirBuilderExt as _;
    if let (Launch::Stdio(template), Launch::Stdio(launch)) = (&template.launch, &config.launch)
        && let (Some(named), Some(cwd)) = (&template.cwd, &launch.cwd)
        && named.to_string_lossy().contains(SESSION_VAR)
        && let Err(e) = std::fs::DirBuilder::new().recursive(true).mode(0o700).create(cwd)
    {
        tracing::warn!(server = %config.name, cwd = %cwd.display(), "cannot make the session's folder: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cwd_naming_the_session_is_made_when_its_instance_starts() {
        let root = tempfile::tempdir().unwrap();
        let text = serde_json::json!({"mcpServers": {
            "own": {"command": "x", "scope": "session", "cwd": format!("{}/${{REBOUND_SESSION}}", root.path().display())},
            "fixed": {"command": "x", "scope": "session", "cwd": root.path()},
        }})
        .to_string();
        let config = crate::config::parse(&text, &root.path().join("rebound.json"), &|_| None).unwrap();
        for name in ["own", "fixed"] {
            let template = &config.servers[name];
            make_session_folder(template, &template.for_session("sess_1_2"));
        }
        use std::os::unix::fs::PermissionsExt as _;
        let made = std::fs::metadata(root.path().join("sess_1_2")).unwrap();
        assert!(made.is_dir());
        assert_eq!(made.permissions().mode() & 0o777, 0o700);
        assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 1, "no other folder made");
    }
}
