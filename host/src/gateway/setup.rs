//! What one configuration makes of the gateway: its shared servers, the recovery engine's
//! policies, the adapters. A reload builds the next `Setup` from the previous one, as a
//! diff: a server whose launch is unchanged keeps its process (and its sessions); one
//! whose whole entry is unchanged keeps its breakers, retry budget and adapter state too;
//! counters carry over by name. Calls in flight keep the engine and adapters of the
//! `Setup` they started with; each attempt goes to its server's current instance.

use std::collections::HashMap;
use std::sync::Arc;

use indexmap::IndexMap;

use crate::config::{Config, Scope, ServerConfig};
use crate::plugins::{Adapter, Adapters, Prepared};
use crate::recovery::clock::{Rng, TokioClock};
use crate::recovery::engine::{Engine, PolicyKept};
use crate::redact::Secrets;
use crate::transport::supervisor::ServerHandle;

pub struct Setup {
    pub config: Config,
    /// The shared servers (`scope: shared`); per-session instances live with their
    /// session ([`super::session_servers`]).
    pub servers: IndexMap<Arc<str>, Arc<ServerHandle>>,
    pub engine: Arc<Engine>,
    pub plugins: Prepared,
    /// Values from the configuration that must never leave the gateway.
    pub secrets: Secrets,
}

/// What a reload changed.
#[derive(Debug, Default)]
pub struct Changes {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    /// Launched anew: their launch (command, arguments, environment, URL…) changed.
    pub restarted: Vec<String>,
    /// Same process, new recovery settings or adapter settings.
    pub reconfigured: Vec<String>,
    /// Same configuration, new adapter code (its `.wasm` changed).
    pub new_adapter_code: Vec<String>,
    /// Instances to stop once the new setup is in place.
    pub retired: Vec<Arc<ServerHandle>>,
    /// Instances to follow (new ones).
    pub started: Vec<Arc<ServerHandle>>,
    /// (old instance, new instance) of each relaunched server.
    pub moved: Vec<(u64, u64)>,
    /// Relaunched servers whose new process did not come up: the old one keeps serving.
    pub kept_running: Vec<String>,
    /// `scope: session` servers whose launch changed: each running session's instance is
    /// relaunched after the reload, taking over once up (one that does not start is
    /// logged for its session, and the running instance kept).
    pub relaunching: Vec<String>,
    /// What changed among the `scope: session` servers, whose instances the running
    /// sessions bring in line.
    pub sessions: Touched,
    /// The gateway-wide settings applied that changed (`rebound.KEY`).
    pub settings: Vec<&'static str>,
    /// Adapters replaced, and their replacements, which take up their counts.
    counted_on: CountedOn,
}

/// Replaced adapters and their replacements.
#[derive(Default)]
struct CountedOn(Vec<(Arc<Adapter>, Arc<Adapter>)>);

impl std::fmt::Debug for CountedOn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} adapters replaced", self.0.len())
    }
}

impl Changes {
    /// The replaced adapters' counts taken up by their replacements: just before the new
    /// setup is put in place, so that what the old ones count while it comes up is kept.
    pub fn count_on(&mut self) {
        for (old, fresh) in self.counted_on.0.drain(..) {
            fresh.count_on_from(&old);
        }
    }

    /// Whether instance `instance`, retired, gives way to a relaunch (not removed).
    pub fn relaunched(&self, instance: u64) -> bool {
        self.moved.iter().any(|(old, _)| *old == instance)
    }
}

/// How a reload touched the `scope: session` servers.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Touched {
    #[default]
    Not,
    /// Removed or changed ones only.
    Changed,
    /// Added ones too: every session may have new tools.
    Added,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.added.is_empty()
            && self.removed.is_empty()
            && self.restarted.is_empty()
            && self.relaunching.is_empty()
            && self.reconfigured.is_empty()
            && self.new_adapter_code.is_empty()
    }

    /// One line for the log.
    pub fn summary(&self) -> String {
        let part = |what: &str, names: &[String]| (!names.is_empty()).then(|| format!("{what} {}", names.join(", ")));
        let parts: Vec<String> = [
            part("added", &self.added),
            part("removed", &self.removed),
            part("restarted", &self.restarted),
            part("reconfigured", &self.reconfigured),
            part("new adapter code for", &self.new_adapter_code),
            part("kept running (the new launch did not start)", &self.kept_running),
            part("relaunching in each running session (taking over once up)", &self.relaunching),
            part("changed", &self.settings.iter().map(|key| format!("rebound.{key}")).collect::<Vec<_>>()),
        ]
        .into_iter()
        .flatten()
        .collect();
        if parts.is_empty() { "nothing changed".to_owned() } else { parts.join("; ") }
    }
}

impl Setup {
    /// Records on each of `handles`, which serve under this setup, how long a call begun
    /// under it may take ([`ServerHandle::may_take`]): a retired one then finishes the
    /// calls of every setup it served under (`Hub::retire`).
    pub fn served_by<'a>(&self, handles: impl IntoIterator<Item = &'a Arc<ServerHandle>>) {
        for handle in handles {
            if let Some(ms) = self.config.longest_deadline(&handle.name) {
                handle.may_take(std::time::Duration::from_millis(ms));
            }
        }
    }

    /// `name` keeps `running`, the instance `current` has: its new launch did not come
    /// up. Its entry keeps the new file's settings (its policy and adapter were made
    /// from them) but `current`'s launch and protocol, which `running` was started with:
    /// the next reload compares against those, so the same new launch is tried again then.
    pub fn keep_running(&mut self, current: &Setup, name: &str, running: Arc<ServerHandle>) {
        if let (Some(entry), Some(was)) = (self.config.servers.get_mut(name), current.config.servers.get(name)) {
            entry.launch = was.launch.clone();
            entry.protocol = was.protocol;
        }
        self.servers.insert(name.into(), running);
    }

    /// The first setup: every shared server started with `spawn`.
    pub fn first(config: Config, plugins: Prepared, spawn: &dyn Fn(&ServerConfig) -> Arc<ServerHandle>) -> Self {
        let servers = shared(&config).map(|s| (Arc::from(s.name.as_str()), spawn(s))).collect();
        let mut engine = Engine::new(config.servers.values(), Arc::new(TokioClock), Arc::new(Rng::from_entropy()))
            .with_plan_calls(config.settings.plugin_max_calls);
        for (server, adapter) in plugins.adapters.iter() {
            engine.declare(server, adapter.declared());
        }
        let secrets = Secrets::of(&config);
        Setup { config, servers, engine: Arc::new(engine), plugins, secrets }
    }

    /// The setup of `config` (with its freshly loaded `plugins`), keeping from this one
    /// what did not change.
    pub fn next(
        &self,
        config: Config,
        mut plugins: Prepared,
        spawn: &dyn Fn(&ServerConfig) -> Arc<ServerHandle>,
    ) -> (Self, Changes) {
        let mut changes =
            Changes { settings: self.config.settings.applied_changes(&config.settings), ..Default::default() };
        let kept_adapters = self.keep_adapters(&config, &mut plugins, &mut changes);
        let servers = self.next_servers(&config, spawn, &mut changes);
        self.session_changes(&config, &mut changes);
        // A server keeps its policy when its entry is unchanged and so is its adapter
        // (whose declared needs the policy holds); with new adapter code, its breakers and
        // budget, which say how the server fares, not what the adapter may do.
        let keep_policy = |name: &str| {
            let (had, has) = (self.plugins.adapters.get(name).is_some(), plugins.adapters.get(name).is_some());
            // None before and none now, or the same one kept: what it declared holds.
            let adapter_kept = (!had && !has) || kept_adapters.iter().any(|k| &**k == name);
            PolicyKept::of(self.unchanged(&config, name), adapter_kept)
        };
        let declared: HashMap<&str, _> = plugins.adapters.iter().map(|(s, a)| (&**s, a.declared())).collect();
        let engine = self.engine.reconfigure(
            config.servers.values(),
            &keep_policy,
            &|name| declared.get(name).cloned(),
            config.settings.plugin_max_calls,
        );
        let secrets = Secrets::of(&config);
        (Setup { config, servers, engine: Arc::new(engine), plugins, secrets }, changes)
    }

    /// Whether `name`'s entry is the same in `config` as in this setup's.
    fn unchanged(&self, config: &Config, name: &str) -> bool {
        self.config.servers.get(name).is_some_and(|b| Some(b) == config.servers.get(name))
    }

    /// In `plugins`, an unchanged server whose adapter's code is unchanged keeps its
    /// running adapter (its state), hiding the new configuration's secrets; returns those
    /// servers. Under new limits (a new runtime) it moves to the new one, its stored
    /// state with it, and counts as kept
    /// (its declared needs are the same): a limit lowered to contain an adapter holds at
    /// once for shared servers (a session's own instances get fresh copies of the new
    /// one when their session is brought in line, `SessionServers::own`).
    fn keep_adapters(&self, config: &Config, plugins: &mut Prepared, changes: &mut Changes) -> Vec<Arc<str>> {
        let mut adapters = Adapters::default();
        let mut kept = Vec::new();
        // Every adapter before, kept or not (replaced, gone, failing to load), hides the
        // new configuration's secrets too: sessions keep their copies of it.
        let hidden = Secrets::of(config);
        for (_, old) in self.plugins.adapters.iter() {
            old.hide(&hidden);
        }
        for (server, fresh) in plugins.adapters.iter() {
            match self.plugins.adapters.get(server).filter(|_| self.unchanged(config, server)) {
                Some(old) if same_code(old, fresh) && old.same_runtime(fresh) => {
                    kept.push(server.clone());
                    adapters.insert(server, old.clone());
                }
                Some(old) if same_code(old, fresh) => {
                    kept.push(server.clone());
                    adapters.insert(server, old.moved_to(fresh));
                }
                // New code for its unchanged server, or an adapter where that server had
                // none (its file dropped in); else a changed server's adapter.
                _ => {
                    if self.unchanged(config, server) {
                        changes.new_adapter_code.push(server.to_string());
                    }
                    // It may see what a process still running an earlier launch
                    // says (a relaunch not yet up, or one that failed).
                    fresh.hide(&self.secrets);
                    adapters.insert(server, fresh.clone());
                }
            }
            // Replaced (new code, or its server's entry changed): its counts go on, so
            // that `/metrics` never counts an adapter's faults back down. Taken up as the
            // new setup is put in place (`Changes::count_on`): until then the old one
            // serves, and its counts go on.
            if let Some(old) = self.plugins.adapters.get(server).filter(|_| !kept.contains(server)) {
                changes.counted_on.0.push((old.clone(), fresh.clone()));
            }
        }
        plugins.adapters = adapters;
        kept
    }

    /// `config`'s shared servers: an unchanged launch (and protocol, which its connection
    /// was made with) keeps its instance, a changed one gets a new one (the old retired),
    /// a new server starts; the ones gone are retired.
    fn next_servers(
        &self,
        config: &Config,
        spawn: &dyn Fn(&ServerConfig) -> Arc<ServerHandle>,
        changes: &mut Changes,
    ) -> IndexMap<Arc<str>, Arc<ServerHandle>> {
        let mut servers = IndexMap::new();
        for s in shared(config) {
            let name: Arc<str> = s.name.as_str().into();
            let before = self.config.servers.get(&s.name).filter(|b| b.scope == Scope::Shared);
            let old = self.servers.get(&name).filter(|_| before.is_some());
            let handle = match old {
                Some(handle) if before.is_some_and(|b| b.launch == s.launch && b.protocol == s.protocol) => {
                    if !self.unchanged(config, &s.name) {
                        changes.reconfigured.push(s.name.clone());
                    }
                    handle.clone()
                }
                Some(handle) => {
                    changes.restarted.push(s.name.clone());
                    changes.retired.push(handle.clone());
                    let fresh = spawn(s);
                    changes.moved.push((handle.instance, fresh.instance));
                    changes.started.push(fresh.clone());
                    fresh
                }
                None => {
                    changes.added.push(s.name.clone());
                    let fresh = spawn(s);
                    changes.started.push(fresh.clone());
                    fresh
                }
            };
            servers.insert(name, handle);
        }
        for (name, handle) in &self.servers {
            if !servers.contains_key(name) {
                changes.removed.push(name.to_string());
                changes.retired.push(handle.clone());
            }
        }
        servers
    }

    /// What changed among the `scope: session` servers (their instances are their
    /// sessions' own, which each running session brings in line:
    /// [`super::session_servers::SessionServers::reloaded`]).
    fn session_changes(&self, config: &Config, changes: &mut Changes) {
        let mut touched = Touched::Not;
        for old in self.config.servers.values().filter(|s| s.scope == Scope::Session) {
            match config.servers.get(&old.name) {
                None => changes.removed.push(old.name.clone()),
                // Now shared: counted as added with the shared ones.
                Some(now) if now.scope != Scope::Session => {}
                Some(_) => continue,
            }
            touched = touched.max(Touched::Changed);
        }
        for s in config.servers.values().filter(|s| s.scope == Scope::Session) {
            let how = match self.config.servers.get(&s.name) {
                None => {
                    changes.added.push(s.name.clone());
                    Touched::Added
                }
                // Shared until now: each session gets its own.
                Some(b) if b.scope != Scope::Session => {
                    changes.reconfigured.push(s.name.clone());
                    Touched::Added
                }
                Some(b) if b.launch != s.launch || b.protocol != s.protocol => {
                    changes.relaunching.push(s.name.clone());
                    Touched::Changed
                }
                Some(b) if b != s => {
                    changes.reconfigured.push(s.name.clone());
                    Touched::Changed
                }
                Some(_) => continue,
            };
            touched = touched.max(how);
        }
        changes.sessions = touched;
    }
}

/// `config`'s shared servers, in file order.
fn shared(config: &Config) -> impl Iterator<Item = &ServerConfig> {
    config.servers.values().filter(|s| s.scope == Scope::Shared)
}

/// Whether two loads of an adapter are the same code.
fn same_code(a: &Adapter, b: &Adapter) -> bool {
    a.digest == b.digest && a.name == b.name
}

/// Over HTTP, a warning for each shared server whose adapter observes calls it is not
/// shown (no `adapter_allow.observes` grants any): a gateway once showed it every
/// client's, and an adapter that learns from them (hol-cursor) now learns nothing there.
pub fn unobserved(config: &Config, adapters: &Adapters) -> Vec<String> {
    adapters
        .iter()
        .filter(|(server, adapter)| {
            config.servers.get(&***server).is_some_and(|s| {
                s.scope == Scope::Shared && s.adapter_allow.observes.is_empty() && !adapter.declared().observes.is_empty()
            })
        })
        .map(|(server, adapter)| {
            format!(
                "adapter {} of shared server `{server}` observes its calls, but over HTTP it is shown none: grant the tools in mcpServers.{server}.adapter_allow.observes (every client's calls), or give the server \"scope\": \"session\"",
                adapter.name
            )
        })
        .collect()
}
