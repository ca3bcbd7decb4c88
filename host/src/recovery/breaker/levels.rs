//! The breakers one server's calls go through ([`ServerBreakers`]): the server's, one per
//! tool, and, when many clients share the server, each client's own pair of them.
//!
//! A failure of one client's call counts on its own breakers and, blamed on it, on the
//! shared ones, whose thresholds must be met without the failures of the client that
//! failed most. So a client whose calls fail sheds its own calls, and no one else's; a
//! server that fails for everyone is shed for everyone once the others' failures say so.
//! A failure that proves the request never reached the server is the server's, whoever
//! sent it.
//!
//! Which level a failure counts at is decided here too ([`Failed`]): a tool that hangs
//! or reports an outage while another tool of the server answered within the window is
//! the tool's failure alone; for a client's own breakers, so is one while the same tool
//! answered within the window (mostly other clients' calls): the server and the tool are
//! up, and this client's calls of it fail.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, RandomState};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::{Blame, Blamed, Breaker, Culprit, Outcome, Permit, Snapshot};
use crate::config::BreakerConfig;
use crate::lasting::Locked;
use crate::recovery::clock::{Clock, Rng};

/// The most tools of one server that have a breaker of their own at once; past them, idle
/// ones make room, and calls of a tool that finds none are guarded by the server's breaker
/// alone, where its failures count in full. Tool names come from the server's listing and
/// from adapters' plans, so their number needs a bound.
pub const MAX_TOOL_BREAKERS: usize = 1024;

/// The most breakers of their own that clients of one server hold (one for the server
/// and one per tool, each, made on their first failure there); past it, idle ones make
/// room, and a client that finds none goes through the shared breakers alone.
pub const MAX_CLIENT_BREAKERS: usize = 4096;

/// Breakers by key, each made on its key's first call with the server's settings, at
/// most `max` of them: when they are all taken, none more is made, or (`evicts`) idle
/// ones ([`Breaker::idle`]) make room, looked for at most once a tenth of the window.
pub struct Keyed<K> {
    config: BreakerConfig,
    clock: Arc<dyn Clock>,
    rng: Arc<Rng>,
    by_key: Mutex<HashMap<K, Arc<Breaker>>>,
    /// When idle ones were last looked for, and none found.
    full_at: Mutex<Option<Instant>>,
    /// Whether it has ever held one: until then, looking one up takes no lock.
    any: std::sync::atomic::AtomicBool,
    max: usize,
    /// Whether idle ones make room past `max` (else none is made past it).
    evicts: bool,
}

/// The breakers of one server's tools, by tool name.
pub type ToolBreakers = Keyed<String>;

impl<K> std::fmt::Debug for Keyed<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keyed").field("breakers", &self.by_key.locked().len()).finish()
    }
}

impl<K: Eq + Hash> Keyed<K> {
    pub fn new(config: BreakerConfig, clock: Arc<dyn Clock>, rng: Arc<Rng>, (max, evicts): (usize, bool)) -> Self {
        let (by_key, full_at, any) = Default::default();
        Self { config, clock, rng, by_key, full_at, any, max, evicts }
    }

    /// The breaker of `key`, made on first use; none when all `max` are taken and busy.
    pub fn get<Q>(&self, key: &Q) -> Option<Arc<Breaker>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.get_or_make(key).map(|(b, _)| b)
    }

    /// The breaker of `key`, and whether it was made just now.
    fn get_or_make<Q>(&self, key: &Q) -> Option<(Arc<Breaker>, bool)>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let mut map = self.by_key.locked();
        if let Some(b) = map.get(key) {
            return Some((b.clone(), false));
        }
        if map.len() >= self.max && !self.evicts {
            return None;
        }
        if map.len() >= self.max {
            let now = self.clock.now();
            let mut full_at = self.full_at.locked();
            let pause = Duration::from_millis(self.config.window_ms / 10);
            if full_at.is_some_and(|at| now.saturating_duration_since(at) < pause) {
                return None;
            }
            map.retain(|_, b| !b.idle());
            if map.len() >= self.max {
                *full_at = Some(now);
                return None;
            }
        }
        let b = Breaker::new(self.config, self.clock.clone(), self.rng.clone());
        map.insert(key.to_owned(), b.clone());
        self.any.store(true, std::sync::atomic::Ordering::Relaxed);
        Some((b, true))
    }

    /// The breaker of `key` if it has one already.
    pub fn existing<Q>(&self, key: &Q) -> Option<Arc<Breaker>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if !self.any.load(std::sync::atomic::Ordering::Relaxed) {
            return None;
        }
        self.by_key.locked().get(key).cloned()
    }

    /// Whether it has ever held a breaker.
    pub fn ever_held(&self) -> bool {
        self.any.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Closes every breaker.
    pub fn reset_all(&self) {
        for b in self.by_key.locked().values() {
            b.reset();
        }
    }
}

impl ToolBreakers {
    /// Every tool's breaker that is not closed and clean, by name.
    pub fn troubled(&self) -> Vec<(String, Snapshot)> {
        let map = self.by_key.locked();
        let mut out: Vec<(String, Snapshot)> =
            map.iter().map(|(t, b)| (t.clone(), b.snapshot())).filter(|(_, s)| troubled(s)).collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Whether a tool other than `tool` answered at `since` or later: evidence that the
    /// server is up and a failure of `tool` is confined to it.
    pub fn others_answered(&self, tool: &str, since: Instant) -> bool {
        let map = self.by_key.locked();
        map.iter().any(|(t, b)| t != tool && b.answered_since(since))
    }
}

/// Whether a breaker's snapshot says anything beyond "closed, nothing failed".
pub fn troubled(s: &Snapshot) -> bool {
    s.state != "closed" || s.consecutive_failures > 0 || s.window_failures > 0
}

/// A client's own breaker: for the server (`tool` none) or one of its tools (by a hash
/// of the name: a collision merely shares a breaker).
type ClientKey = (u64, Option<u64>);

/// Every breaker one server's calls go through.
#[derive(Debug)]
pub struct ServerBreakers {
    pub server: Arc<Breaker>,
    pub tools: ToolBreakers,
    /// Each client's own, for a server many clients share.
    clients: Keyed<ClientKey>,
    tool_hash: RandomState,
}

/// A failed call, as the breakers read it.
#[derive(Debug, Clone, Copy)]
pub struct Failed {
    /// What it says of the server's health.
    pub outcome: Outcome,
    /// It may be the tool's alone (a timeout, an error or outage the tool reported, an
    /// HTTP server error for its request), not the connection's.
    pub tool_level: bool,
    /// The request never reached the server.
    pub undelivered: bool,
    /// The connection (upstream session) it was lost with, if it was: every call that
    /// went down with one connection is one failure.
    pub lost: Option<u64>,
    /// The start of the window its evidence is read in.
    pub since: Instant,
}

/// Why a call was not let through: which breaker is open, and until when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shed {
    pub retry_in: Duration,
    /// The tool's breaker, not the server's.
    pub tool: bool,
    /// The client's own: only its calls failed.
    pub own: bool,
}

/// The permits of one call, one per breaker it went through.
#[derive(Debug)]
pub struct Permits {
    server: Permit,
    tool: Option<Permit>,
    own: Option<Own>,
}

/// A client's own breakers for one call: the permits of those it had.
#[derive(Debug)]
struct Own {
    client: Culprit,
    server: Option<Permit>,
    tool: Option<Permit>,
}

impl ServerBreakers {
    pub fn new(config: BreakerConfig, clock: Arc<dyn Clock>, rng: Arc<Rng>) -> Self {
        Self {
            server: Breaker::new(config, clock.clone(), rng.clone()),
            // Past the most kept, a tool's idle breaker makes room for another tool's, as a
            // client's does for another client's.
            tools: Keyed::new(config, clock.clone(), rng.clone(), (MAX_TOOL_BREAKERS, true)),
            clients: Keyed::new(config, clock, rng, (MAX_CLIENT_BREAKERS, true)),
            tool_hash: RandomState::new(),
        }
    }

    fn own_keys(&self, client: u64, tool: &str) -> (ClientKey, ClientKey) {
        ((client, None), (client, Some(self.tool_hash.hash_one(tool))))
    }

    /// Lets a call of `tool`, blamed on `blame` if it fails, through the client's own
    /// breakers (when it is one client of many, and has any) and then the shared ones:
    /// the server's, then the tool's. Or says which of them is open; a breaker after an
    /// open one is not asked (a probe it would admit is not taken).
    pub fn admit(&self, tool: &str, blame: Blame) -> Result<Permits, Shed> {
        let shed = |retry_in, tool, own| Shed { retry_in, tool, own };
        let own = match blame {
            // (Until some client has failed here, none has breakers of its own to ask.)
            Blame::Client(client) if !self.clients.ever_held() => Some(Own { client, server: None, tool: None }),
            Blame::Client(client) => {
                let keys = self.own_keys(client.own, tool);
                let admit = |key: &ClientKey, tool| {
                    self.clients.existing(key).map(|b| b.admit().map_err(|r| shed(r, tool, true))).transpose()
                };
                let server = admit(&keys.0, false)?;
                let tool = admit(&keys.1, true)?;
                Some(Own { client, server, tool })
            }
            Blame::Server => None,
        };
        let server = self.server.admit_for(blame).map_err(|r| shed(r, false, false))?;
        let tool_permit = match self.tools.get(tool).map(|b| b.admit_for(blame)) {
            Some(Err(r)) => return Err(shed(r, true, false)),
            Some(Ok(p)) => Some(p),
            None => None,
        };
        Ok(Permits { server, tool: tool_permit, own })
    }

    /// A call let through by `permits` answered.
    pub fn succeeded(&self, permits: Permits) {
        let Permits { server, tool, own } = permits;
        let own = own.map(|o| [o.server, o.tool]).into_iter().flatten();
        for p in [Some(server), tool].into_iter().chain(own).flatten() {
            p.record(Outcome::Success);
        }
    }

    /// A call of `tool_name` let through by `permits` failed: at the server's level unless
    /// confined to the tool (see the module's doc), at the tool's unless undelivered (then
    /// it is the server's, whoever sent it). A client's own breakers are made on its first
    /// failure that counts.
    pub fn failed(&self, permits: Permits, tool_name: &str, failed: Failed) {
        let Failed { outcome, tool_level, undelivered, lost, since } = failed;
        let Permits { server, tool, own } = permits;
        // (A tool with no breaker of its own has nowhere else to count its failures.)
        let may_be_confined = outcome == Outcome::Failure && tool_level && tool.is_some();
        let confined = may_be_confined && self.tools.others_answered(tool_name, since);
        let at = |confined: bool| if confined { Outcome::Ignored } else { outcome };
        let tool_outcome = if undelivered { Outcome::Ignored } else { outcome };
        let on = match &own {
            Some(own) if !undelivered => Blame::Client(own.client),
            _ => Blame::Server,
        };
        let blame = Blamed { on, lost };
        server.record_blaming(at(confined), blame);
        if let Some(p) = tool {
            p.record_blaming(tool_outcome, blame);
        }
        let Some(own) = own.filter(|_| !undelivered) else { return };
        // Its own breakers count its failures as they come: they serve it alone.
        let tool_answered = || self.tools.existing(tool_name).is_some_and(|b| b.answered_since(since));
        let own_confined = confined || (may_be_confined && tool_answered());
        let keys = self.own_keys(own.client.own, tool_name);
        // Of a tool only when the tool has a breaker of its own by name (all but tools
        // past the most kept), by which the client's status finds it.
        let named = own.tool.is_some() || self.tools.existing(tool_name).is_some();
        let levels = [(own.server, keys.0, at(own_confined), true), (own.tool, keys.1, tool_outcome, named)];
        for (permit, key, outcome, may_make) in levels {
            let permit = match permit {
                Some(p) => Some(p),
                // Made now, on this failure: one that was made since this call was let
                // through (by another of the client's calls) has moved on without it.
                None if outcome == Outcome::Failure && may_make => match self.clients.get_or_make(&key) {
                    Some((b, true)) => b.admit().ok(),
                    _ => None,
                },
                None => None,
            };
            if let Some(p) = permit {
                p.record_blaming(outcome, Blamed { on: Blame::Server, lost });
            }
        }
    }

    /// Which of the breakers a call of `tool` by `blame` goes through will still be open
    /// `at`, if one will, in words. A half-open breaker whose probes are out may admit by
    /// then, and is not counted.
    pub fn refused_at(&self, tool: &str, blame: Blame, at: Instant) -> Option<&'static str> {
        if let Blame::Client(client) = blame {
            let (server_key, tool_key) = self.own_keys(client.own, tool);
            if self.clients.existing(&server_key).is_some_and(|b| b.open_at(at)) {
                return Some("the circuit breaker of this client's calls to the server is open");
            }
            if self.clients.existing(&tool_key).is_some_and(|b| b.open_at(at)) {
                return Some("the circuit breaker of this client's calls to the tool is open");
            }
        }
        if self.server.refuses_at(blame, at) {
            return Some("the server's circuit breaker is open");
        }
        let tool_refuses = self.tools.existing(tool).is_some_and(|b| b.refuses_at(blame, at));
        tool_refuses.then_some("the tool's circuit breaker is open")
    }

    /// The breaker of `client`'s own calls to the server, when it has one.
    pub fn own(&self, client: u64) -> Option<Arc<Breaker>> {
        self.clients.existing(&(client, None))
    }

    /// `client`'s own breakers of single tools that are not closed and clean, by tool
    /// name. (They are kept by a hash of the name: each tool called has a breaker here
    /// by name, whose hash finds the client's own. Names that share a hash share one.)
    pub fn own_tools(&self, client: u64) -> Vec<(String, Snapshot)> {
        if !self.clients.ever_held() {
            return Vec::new();
        }
        let names: Vec<String> = self.tools.by_key.locked().keys().cloned().collect();
        let mut out: Vec<(String, Snapshot)> = names
            .into_iter()
            .filter_map(|name| {
                let own = self.clients.existing(&self.own_keys(client, &name).1)?;
                Some((name, own.snapshot()))
            })
            .filter(|(_, s)| troubled(s))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// How many clients a breaker of their own (for the server, or for one of its tools)
    /// sheds now: clients whose calls alone fail.
    pub fn clients_shed(&self) -> usize {
        let now = self.clients.clock.now();
        let map = self.clients.by_key.locked();
        let shed = map.iter().filter(|(_, b)| b.refuses_at(Blame::Server, now)).map(|((client, _), _)| *client);
        shed.collect::<std::collections::HashSet<u64>>().len()
    }

    /// Closes every breaker, the clients' own included.
    pub fn reset_all(&self) {
        self.server.reset();
        self.tools.reset_all();
        self.clients.reset_all();
    }

    /// Closes the breaker of `tool`, and the clients' own for it; false if it has none.
    pub fn reset_tool(&self, tool: &str) -> bool {
        let hash = Some(self.tool_hash.hash_one(tool));
        for (_, b) in self.clients.by_key.locked().iter().filter(|((_, t), _)| *t == hash) {
            b.reset();
        }
        self.tools.existing(tool).map(|b| b.reset()).is_some()
    }
}
