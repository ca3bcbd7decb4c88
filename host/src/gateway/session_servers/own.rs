//! A session's own instances, with the recovery state that is theirs alone, and what of
//! it a reload keeps: an instance whose launch is unchanged goes on, with its breakers,
//! budget and adapter state while its whole entry is unchanged too (its breakers and
//! budget alone when only its adapter changed, as for a shared server).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use indexmap::IndexMap;
use tokio::time::Instant;

use crate::config::{Scope, ServerConfig};
use crate::gateway::setup::Setup;
use crate::plugins::{Adapter, Adapters};
use crate::recovery::engine::{Engine, PolicyKept, ServerPolicy};
use crate::transport::supervisor::ServerHandle;

/// The session's own server instances, with the recovery state that is theirs alone.
pub(super) struct Own {
    /// The setup whose `scope: session` servers these are.
    pub(super) on: Arc<Setup>,
    pub(super) servers: IndexMap<Arc<str>, Arc<ServerHandle>>,
    /// Their breakers and budgets, and their adapters' state.
    pub(super) policies: Policies,
    pub(super) forks: Forks,
    /// The engine and adapters of this session's calls, and the setup they extend.
    pub(super) recovery: Mutex<Option<(Arc<Setup>, Arc<OwnRecovery>)>>,
    pub(super) started: Instant,
    pub(super) settled: AtomicBool,
}

/// By server, its instance's breakers and budget, and its adapter's state.
pub(super) type Policies = HashMap<Arc<str>, Arc<ServerPolicy>>;
pub(super) type Forks = HashMap<Arc<str>, Arc<Adapter>>;

/// The setup's engine and adapters with a session's own instances' in place of theirs.
pub(super) type OwnRecovery = (Engine, Adapters);

/// What a session keeps of its instance of a server across a reload.
#[derive(Clone, Copy)]
pub(super) struct Kept<'a> {
    pub(super) handle: &'a Arc<ServerHandle>,
    pub(super) state: Carried<'a>,
}

/// What of an instance's recovery state goes on, as for a shared server (`PolicyKept`).
#[derive(Clone, Copy)]
pub(super) enum Carried<'a> {
    /// Its policy and adapter fork (if it has an adapter): its entry and adapter are
    /// unchanged.
    Whole(&'a Arc<ServerPolicy>, Option<&'a Arc<Adapter>>),
    /// This policy's breakers and budget: its entry is unchanged, its adapter is new
    /// (new code, new limits, or added or removed), and starts afresh.
    Health(&'a Arc<ServerPolicy>),
    Nothing,
}

impl Own {
    /// What of this session's (`client`'s) instance of `template`'s server `setup` keeps:
    /// the instance, if it runs the launch (and protocol) `template` gives the session,
    /// with what [`Self::carried`] says.
    pub(super) fn keeps(&self, setup: &Setup, template: &ServerConfig, client: &str) -> Option<Kept<'_>> {
        let name = template.name.as_str();
        self.on.config.servers.get(name).filter(|t| t.scope == Scope::Session)?;
        let handle = self.servers.get(name)?;
        if !runs(handle, template, client) {
            return None;
        }
        Some(Kept { handle, state: self.carried(setup, template) })
    }

    /// What `handle`, the instance of a server relaunched, carries on with while it
    /// serves on until its new one takes over with fresh ones ([`Self::taken_over`]), or
    /// after that one failed, if it is one of these instances: what [`Self::carried`]
    /// says (a limit or grant taken away holds for it at once).
    pub(super) fn serving_on(&self, setup: &Setup, template: &ServerConfig, handle: &Arc<ServerHandle>) -> Carried<'_> {
        if !self.servers.get(&*handle.name).is_some_and(|o| Arc::ptr_eq(o, handle)) {
            return Carried::Nothing;
        }
        self.carried(setup, template)
    }

    /// What of the recovery state of this session's instance of `template`'s server goes
    /// on under `setup`, as for a shared server: all of it while its entry and adapter
    /// are unchanged, its health with a new adapter, nothing with a changed entry (its
    /// breaker and budget settings may have changed). The launch apart: the state was
    /// made under these instances' setup's settings for it, whatever it ran (an
    /// instance serving on through its relaunch, or going back to its launch).
    fn carried(&self, setup: &Setup, template: &ServerConfig) -> Carried<'_> {
        let name = template.name.as_str();
        let Some(policy) = self.policies.get(name) else { return Carried::Nothing };
        let same_entry = self.on.config.servers.get(name).is_some_and(|was| {
            let mut was = was.clone();
            (was.launch, was.protocol) = (template.launch.clone(), template.protocol);
            was == *template
        });
        let same_adapter = match (self.on.plugins.adapters.get(name), setup.plugins.adapters.get(name)) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        match PolicyKept::of(same_entry, same_adapter) {
            PolicyKept::Whole => Carried::Whole(policy, self.forks.get(name)),
            PolicyKept::Health => Carried::Health(policy),
            PolicyKept::Nothing => Carried::Nothing,
        }
    }

    /// Whether `handle` is one of these instances.
    pub(super) fn has(&self, handle: &Arc<ServerHandle>) -> bool {
        self.servers.values().any(|h| Arc::ptr_eq(h, handle))
    }

    /// These instances with `new` serving in place of `old` (its relaunch, now up), if
    /// `old` still serves here and `new` runs the launch these instances' setup gives it.
    pub(super) fn taken_over(&self, old: &Arc<ServerHandle>, new: &Arc<ServerHandle>, client: &str) -> Option<Own> {
        let serving = self.servers.get(&old.name).is_some_and(|h| Arc::ptr_eq(h, old));
        let template = self.on.config.servers.get(&*old.name).filter(|t| t.scope == Scope::Session)?;
        if !serving || !runs(new, template, client) {
            return None;
        }
        let mut servers = self.servers.clone();
        servers.insert(old.name.clone(), new.clone());
        // The new process starts with breakers, a budget and adapter state of its own.
        let (mut policies, mut forks) = (self.policies.clone(), self.forks.clone());
        policies.extend(self.on.engine.fresh_policies([&*old.name]));
        forks.remove(&old.name);
        forks.extend(self.on.plugins.adapters.forks([&*old.name]));
        let (settled, recovery) = (AtomicBool::new(self.settled.load(Ordering::Acquire)), Mutex::default());
        Some(Own { on: self.on.clone(), servers, policies, forks, recovery, started: self.started, settled })
    }
}

/// The policies and adapter forks of a session's instances (by server), each carried on
/// as it says or made afresh from `setup`.
pub(super) fn recovery_of<'a>(setup: &Setup, carried: Vec<(&'a str, Carried<'a>)>) -> (Policies, Forks) {
    let (mut policies, mut forks) = (HashMap::new(), HashMap::new());
    // Servers whose policy and adapter fork start afresh, and whose fork alone does.
    let (mut fresh, mut new_forks) = (Vec::new(), Vec::new());
    for (name, carried) in carried {
        match carried {
            Carried::Whole(policy, fork) => {
                policies.insert(Arc::from(name), policy.clone());
                forks.extend(fork.map(|f| (Arc::from(name), f.clone())));
            }
            Carried::Health(policy) => match setup.engine.policy_keeping_health(name, policy) {
                Some(policy) => {
                    policies.insert(Arc::from(name), policy);
                    new_forks.push(name);
                }
                None => fresh.push(name),
            },
            Carried::Nothing => fresh.push(name),
        }
    }
    policies.extend(setup.engine.fresh_policies(fresh.iter().copied()));
    forks.extend(setup.plugins.adapters.forks(fresh.iter().chain(&new_forks).copied()));
    (policies, forks)
}

/// Whether `handle` runs the launch (and protocol) `template` gives session `client`.
pub(super) fn runs(handle: &ServerHandle, template: &ServerConfig, client: &str) -> bool {
    let wanted = template.for_session(client);
    handle.config.launch == wanted.launch && handle.config.protocol == wanted.protocol
}
