//! The recovery engine: runs one client call to completion, in named steps.
//!
//! - [`Engine::attempt`]: one upstream call through the server's breaker and the tool's,
//!   with a per-attempt timeout inside the call's deadline, classified when it fails.
//! - `consult`: the server's adapter may refine the classification and propose a plan.
//! - [`plan::compose`]: the one rule that makes the plan (the adapter's steps, then the
//!   configured fallbacks not yet named, then the adapter's give-up advice).
//! - `run_plan`: retries (safe ones only, full-jitter backoff, retry-after, the retry
//!   budget), side calls, alternatives and restarts, each admitted by [`Limits`] when an
//!   adapter asked for it.
//!
//! When nothing works the [`Record`] becomes the report. A panic anywhere in a call is
//! caught and ends the call like any other failure, so a client is always answered.
//!
//! Breakers have two levels. A failure that says the server is unhealthy counts for the
//! failing tool's breaker, and for the server's unless it is confined to the tool: while
//! another tool of the server answered within the breaker window, the server is up and
//! only the tool is shed (as Envoy's outlier detection ejects one host, not the cluster).
//! Without that evidence, the server's breaker counts it too and sheds the server as a
//! whole. A failure that proves the call never reached the server counts for the server
//! alone. On a server many clients share, a failure is blamed on the client whose call it
//! was ([`Upstream::blame`]): it counts on that client's own breakers, and on the shared
//! ones without the client that failed most (see [`breaker::levels`](super::breaker::levels)).
//!
//! Architecture invariant: the engine does no I/O. Upstream calls go through the
//! [`Upstream`] it is handed; time and randomness through [`Clock`] and [`Rng`].

use std::collections::{HashMap, HashSet};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::FutureExt as _;
use futures::future::BoxFuture;
use rmcp::model::{CallToolResponse, CallToolResult, JsonObject, ToolAnnotations};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::backoff;
use super::breaker::levels::Failed;
use super::breaker::{Blame, Outcome, Permits, ServerBreakers};
use super::budget::Budgets;
use super::classify::{Category, Classification, classify, classify_sent};
use super::clock::{Clock, Rng};
use super::failure::Failure;
use super::plan::{self, Advice, Advisor, ArgumentsBy, Completed, FailureContext, Origin, Plan, Step};
use super::retry_after;
use crate::config::{AdapterGrant, Alternative, RecoveryConfig, ServerConfig};
use crate::lasting::Locked;
use crate::transport::Status;

/// Why a call the client cancelled stopped where it did.
const CANCELLED: &str = "the client cancelled the call";

/// The I/O the engine needs; the gateway provides it.
pub trait Upstream: Send + Sync {
    /// One attempt of `tool` on `server`, as `role` in the client's call, answered within
    /// `timeout` (restarted by progress where configured) and never later than
    /// `max_total`. An answer that is not a result (questions for the client, a task)
    /// ends the call as it is; only the primary's may be one.
    #[allow(clippy::too_many_arguments, reason = "one attempt's worth of context")]
    fn call(
        &self,
        server: &str,
        tool: &str,
        role: Role,
        arguments: Option<JsonObject>,
        timeout: Duration,
        max_total: Duration,
    ) -> BoxFuture<'_, Result<CallToolResponse, Failure>>;
    /// The annotations of a tool as its server publishes it, or why the server does not
    /// offer it right now.
    fn annotations(&self, server: &str, tool: &str) -> Result<Option<ToolAnnotations>, Unoffered>;
    /// Restarts `server` and waits (up to `within`) until it is ready again. What is
    /// restarted is the session the call's primary last failed on: a session the server
    /// started since is only waited for, and nothing is done when a reload replaced or
    /// removed that instance (its successor has done nothing wrong).
    fn restart(&self, server: &str, within: Duration) -> BoxFuture<'_, ()>;
    /// Whether only the tool called may answer: a call resumed with the client's answers
    /// to its server's questions, which no other tool asked. No alternative runs for it,
    /// configured or planned.
    fn alone(&self) -> bool {
        false
    }
    /// Cancelled once the client no longer wants the call: nothing more starts for it (no
    /// retry, no step of a plan), and a wait in progress ends.
    fn cancellation(&self) -> &CancellationToken;
    /// Whom a failure of this call on `server` is blamed on: the server, unless the server
    /// serves many clients (then the client, by a key of its own).
    fn blame(&self, _server: &str) -> Blame {
        Blame::Server
    }
}

/// Why a server does not offer a tool right now, so that a step naming it is not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unoffered {
    /// No such server is configured.
    Unknown,
    /// The server has no session to call: starting, restarting, down or stopped.
    NotRunning(Status),
    /// The server is running and does not list the tool.
    NoSuchTool,
}

impl std::fmt::Display for Unoffered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unknown => f.write_str("no such server is configured"),
            Self::NotRunning(status) => write!(f, "the server is {}", status.as_str()),
            Self::NoSuchTool => f.write_str("the server does not offer it"),
        }
    }
}

/// A step of a plan that named a tool its server does not offer now, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotTried {
    pub server: Arc<str>,
    pub tool: String,
    pub why: Unoffered,
}

impl std::fmt::Display for NotTried {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`{}` on `{}` ({})", self.tool, self.server, self.why)
    }
}

/// A server's counters, for `rebound_status` and the metrics.
#[derive(Debug, Default)]
pub struct Counters {
    pub calls: AtomicU64,
    pub attempts: AtomicU64,
    pub failures: AtomicU64,
    pub retries: AtomicU64,
    pub recovered: AtomicU64,
    pub fallbacks: AtomicU64,
    pub shed: AtomicU64,
    /// Steps of this server's adapter's plans that were refused, by [`Denial`].
    pub denied: [AtomicU64; Denial::ALL.len()],
    /// For one session's own instance, the server's: every count adds to both.
    total: Option<Arc<Counters>>,
}

impl Counters {
    /// The counters of one session's own instance of a server whose counters are `total`.
    pub fn within(total: Arc<Counters>) -> Self {
        Self { total: Some(total), ..Self::default() }
    }

    fn add(&self, counter: impl Fn(&Self) -> &AtomicU64) {
        counter(self).fetch_add(1, Ordering::Relaxed);
        if let Some(total) = &self.total {
            total.add(counter);
        }
    }

    fn deny(&self, denial: Denial) {
        self.add(|c| &c.denied[denial as usize]);
    }
}

/// Everything the engine keeps for one server.
#[derive(Debug, Clone)]
pub struct ServerPolicy {
    pub recovery: RecoveryConfig,
    /// The server's, one per tool (for failures confined to one tool), and each client's
    /// own when many share the server.
    pub breakers: Arc<ServerBreakers>,
    pub budget: Arc<Budgets>,
    /// The server's; a session's own instance's count for it and for the server
    /// ([`Counters::within`], [`Engine::fresh_policies`]).
    pub counters: Arc<Counters>,
    /// What this server's adapter may make the gateway do (the configuration's grant).
    pub grant: AdapterGrant,
    /// What the adapter declared it needs; a step must be in both.
    pub declared: AdapterGrant,
}

/// What a reload keeps of a server's policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyKept {
    /// All of it: the server's entry and its adapter are unchanged.
    Whole,
    /// Its breakers and retry budget, which tell how the server fares: its entry is
    /// unchanged, but its adapter's code (and so what it declares it needs) is new.
    Health,
    /// Nothing: its entry changed (its breaker and budget settings may have), or it is new.
    Nothing,
}

impl PolicyKept {
    /// What a reload keeps of a server's policy, with its entry (`same_entry`) and its
    /// adapter (`same_adapter`) unchanged or not: a shared server's and a session's own
    /// instance's alike.
    pub fn of(same_entry: bool, same_adapter: bool) -> Self {
        match (same_entry, same_adapter) {
            (true, true) => PolicyKept::Whole,
            (true, false) => PolicyKept::Health,
            (false, _) => PolicyKept::Nothing,
        }
    }
}

impl ServerPolicy {
    /// Goes on with `old`'s breakers and retry budget, which tell how the server fares
    /// ([`PolicyKept::Health`]).
    fn keep_health_of(&mut self, old: &ServerPolicy) {
        self.breakers = old.breakers.clone();
        self.budget = old.budget.clone();
    }

    fn fresh(
        recovery: &RecoveryConfig,
        grant: AdapterGrant,
        declared: AdapterGrant,
        clock: &Arc<dyn Clock>,
        rng: &Arc<Rng>,
    ) -> Self {
        Self {
            recovery: recovery.clone(),
            breakers: Arc::new(ServerBreakers::new(recovery.breaker, clock.clone(), rng.clone())),
            budget: Arc::new(Budgets::new(recovery.retry.budget_ratio, recovery.retry.budget_reserve)),
            counters: Arc::default(),
            grant,
            declared,
        }
    }
}

/// Why a tool was called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The tool the client asked for.
    Primary,
    /// An alternative that answers the same question.
    Alternative,
    /// A call for its effect, from a plan (`hol_interrupt`).
    SideCall,
}

/// One attempt, as it went.
#[derive(Debug, Clone)]
pub struct AttemptRecord {
    pub server: Arc<str>,
    pub tool: String,
    pub role: Role,
    pub failure: Option<Failure>,
    pub classification: Option<Classification>,
    /// How long the engine waited before this attempt.
    pub waited: Duration,
}

/// How a call went.
#[derive(Debug)]
pub struct Record {
    pub server: Arc<str>,
    pub tool: String,
    pub attempts: Vec<AttemptRecord>,
    /// Whether the tool was safe to replay.
    pub safe: bool,
    /// Why the engine stopped trying, when it did.
    pub stopped: Option<String>,
    /// The suggested action an adapter gave when it gave up.
    pub action: Option<String>,
    /// Steps of the adapter's plans that were refused, in order.
    pub denied: Vec<Denied>,
    /// Alternatives and side calls not made because their server does not offer them
    /// now (a fallback's server with no session yet: never started, or still starting;
    /// one restarting after a crash is tried, and waited for), in order.
    pub not_tried: Vec<NotTried>,
    /// How many notes of Rebound's (`[rebound: …]`) the answer, a tool's own error, ends
    /// with: words of an adapter's among them, redacted where they are shown
    /// (`report::noted`).
    pub notes: usize,
}

/// Why a step an adapter asked for was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Denial {
    /// The tool is outside the adapter's grant (`adapter_allow.tools`).
    Grant,
    /// A restart was not granted (`adapter_allow.restart`), or one already ran in this
    /// client call.
    Restart,
    /// The plans of this call already made `rebound.plugin_max_calls` calls.
    Calls,
    /// The tool is not safe to replay and already ran in this client call.
    Replay,
    /// The adapter did not declare that it needs this (0.2.0's `declare`), whatever the
    /// configuration grants.
    Undeclared,
    /// The server marks the tool destructive (`destructiveHint: true`), and the grant
    /// does not name it: a pattern with `*`, the default grant of the server's own tools
    /// among them, does not grant a destructive tool.
    Destructive,
}

impl Denial {
    pub const ALL: [Denial; 6] =
        [Denial::Grant, Denial::Restart, Denial::Calls, Denial::Replay, Denial::Undeclared, Denial::Destructive];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Grant => "grant",
            Self::Restart => "restart",
            Self::Calls => "max-calls",
            Self::Replay => "replay",
            Self::Undeclared => "undeclared",
            Self::Destructive => "destructive",
        }
    }

    /// What it means, for the log.
    pub fn explain(self) -> &'static str {
        match self {
            Self::Grant => "the tool is outside the adapter's grant (`adapter_allow.tools`)",
            Self::Restart => "restarts are not granted (`adapter_allow.restart`), or one already ran for this call",
            Self::Calls => "the call's plans already made `rebound.plugin_max_calls` calls",
            Self::Replay => "the tool is not safe to replay and already ran for this call",
            Self::Undeclared => "the adapter did not declare that it needs this (its `declare`), whatever is granted",
            Self::Destructive => {
                "the server marks the tool destructive, and `adapter_allow.tools` does not name it (a pattern with `*` grants no destructive tool)"
            }
        }
    }
}

/// A refused step: why, and what it would have called (`server/tool`, or `server` for a
/// restart).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denied {
    pub denial: Denial,
    pub target: String,
}

/// The end of a call.
#[derive(Debug)]
#[allow(clippy::large_enum_variant, reason = "one per call, moved a few times: boxing would allocate on every call")]
pub enum Ending {
    /// An answer to pass on as it is: a success, the tool's own error, or (from a server
    /// on 2026-07-28) questions for the client or a task.
    Answered(CallToolResponse),
    /// Nothing worked.
    GaveUp,
}

impl Ending {
    /// Whether the call ended in the tool's own error result.
    pub fn is_tool_error(&self) -> bool {
        matches!(self, Ending::Answered(CallToolResponse::Complete(r)) if r.is_error == Some(true))
    }
}

impl Record {
    /// Whether the call ended in a panic inside the gateway (a bug), caught.
    pub fn panicked(&self) -> bool {
        self.attempts.last().is_some_and(|a| matches!(a.failure, Some(Failure::Internal { .. })))
    }

    /// The last failure on record.
    pub fn last_failure(&self) -> Option<(&Failure, &Classification)> {
        self.attempts.iter().rev().find_map(|a| Some((a.failure.as_ref()?, a.classification.as_ref()?)))
    }

    pub fn failures(&self) -> impl Iterator<Item = (&AttemptRecord, &Failure, &Classification)> {
        self.attempts.iter().filter_map(|a| Some((a, a.failure.as_ref()?, a.classification.as_ref()?)))
    }

    /// The attempt whose result is the answer, if one succeeded.
    pub fn answered_by(&self) -> Option<&AttemptRecord> {
        self.attempts.last().filter(|a| a.failure.is_none() && a.role != Role::SideCall)
    }

    /// Whether the answer came after a failure.
    pub fn recovered(&self) -> bool {
        self.answered_by().is_some() && self.attempts.len() > 1
    }

    pub(crate) fn new(server: Arc<str>, tool: String, safe: bool) -> Self {
        Self {
            server,
            tool,
            attempts: Vec::new(),
            safe,
            stopped: None,
            action: None,
            denied: Vec::new(),
            not_tried: Vec::new(),
            notes: 0,
        }
    }

    fn push(
        &mut self,
        server: &Arc<str>,
        tool: &str,
        role: Role,
        failed: Option<(Failure, Classification)>,
        waited: Duration,
    ) {
        let (failure, classification) = failed.unzip();
        self.attempts.push(AttemptRecord {
            server: server.clone(),
            tool: tool.to_owned(),
            role,
            failure,
            classification,
            waited,
        });
    }
}

pub struct Engine {
    servers: HashMap<Arc<str>, Arc<ServerPolicy>>,
    /// Every server's counters by name, for the gateway's life: a server removed by a
    /// reload and added again counts on where it was, and so do the sessions' own
    /// instances started before.
    tallies: Arc<std::sync::Mutex<HashMap<Arc<str>, Arc<Counters>>>>,
    clock: Arc<dyn Clock>,
    rng: Arc<Rng>,
    /// `rebound.plugin_max_calls`.
    max_plan_calls: u32,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("servers", &self.servers.keys().collect::<Vec<_>>()).finish()
    }
}

/// `name`'s counters in `tallies`, made on first use.
fn tally(tallies: &std::sync::Mutex<HashMap<Arc<str>, Arc<Counters>>>, name: &Arc<str>) -> Arc<Counters> {
    tallies.locked().entry(name.clone()).or_default().clone()
}

/// Whether `tool` may be replayed: config says so, or its annotations do.
pub fn is_idempotent(recovery: &RecoveryConfig, tool: &str, annotations: Option<&ToolAnnotations>) -> bool {
    if let Some(explicit) = recovery.tools.get(tool).and_then(|t| t.idempotent) {
        return explicit;
    }
    annotations.is_some_and(|a| a.read_only_hint == Some(true) || a.idempotent_hint == Some(true))
}

/// The default for `rebound.plugin_max_calls`.
pub const DEFAULT_PLAN_CALLS: u32 = 8;

/// Whether its server marks a tool destructive (and not read-only).
fn marks_destructive(a: &ToolAnnotations) -> bool {
    a.destructive_hint == Some(true) && a.read_only_hint != Some(true)
}

/// Whether an adapter's word that `call` never reached its server (the transport knowing
/// nothing of it) may buy a replay: not of a tool the configuration marks
/// `idempotent: false`, nor of one its server marks destructive unless the grant names
/// it, as for the adapter's own steps.
fn believes_not_delivered(call: &Call<'_>) -> bool {
    let configured_unsafe = call.policy.recovery.tools.get(&call.tool).and_then(|t| t.idempotent) == Some(false);
    let destructive = call.destructive && !call.policy.grant.names_tool(&call.server, &call.tool);
    !configured_unsafe && !destructive
}

/// One client call, as the engine runs it.
struct Call<'a> {
    upstream: &'a dyn Upstream,
    advisor: Option<&'a dyn Advisor>,
    policy: &'a ServerPolicy,
    server: Arc<str>,
    tool: String,
    arguments: Option<JsonObject>,
    safe: bool,
    /// Its server marks the tool destructive (as listed when the call began).
    destructive: bool,
    /// Whom a failure of the tool called is blamed on ([`Upstream::blame`]).
    blame: Blame,
    started: tokio::time::Instant,
    deadline: tokio::time::Instant,
}

/// What a call has done so far, for the limits on what plans may do next.
#[derive(Default)]
struct Spent {
    /// Attempts of the requested tool.
    primary: u32,
    /// The wait before the next attempt of the requested tool.
    waited: Duration,
    /// Side calls and alternatives an adapter's plans made.
    plan_calls: u32,
    restarted: bool,
    /// Every `server/tool` a plan called (it may have run); the requested tool is not
    /// listed: it has always been called.
    called: HashSet<(Arc<str>, String)>,
    /// Alternatives already tried, whoever named them.
    alternatives: HashSet<(Arc<str>, String)>,
    /// Replays of the requested tool made on an adapter's word that it did not run.
    replays_on_adapters_word: u32,
}

/// What a plan's run leads to.
#[allow(clippy::large_enum_variant, reason = "as `Ending`")]
enum Next {
    Retry,
    Done(Ending),
}

impl Engine {
    pub fn new<'a>(servers: impl IntoIterator<Item = &'a ServerConfig>, clock: Arc<dyn Clock>, rng: Arc<Rng>) -> Self {
        let tallies = Arc::default();
        let servers = servers
            .into_iter()
            .map(|s| {
                let name: Arc<str> = s.name.as_str().into();
                let mut policy =
                    ServerPolicy::fresh(&s.recovery, s.adapter_allow.clone(), AdapterGrant::own(&s.name), &clock, &rng);
                policy.counters = tally(&tallies, &name);
                (name, Arc::new(policy))
            })
            .collect();
        Self { servers, tallies, clock, rng, max_plan_calls: DEFAULT_PLAN_CALLS }
    }

    /// Policies for server instances of their own (one client session's): fresh
    /// breakers, retry budgets and counters for `servers`, whose counts add to this
    /// engine's counters too.
    pub fn fresh_policies<'a>(
        &self,
        servers: impl IntoIterator<Item = &'a str>,
    ) -> HashMap<Arc<str>, Arc<ServerPolicy>> {
        servers.into_iter().filter_map(|name| Some((Arc::from(name), Arc::new(self.own_policy(name)?)))).collect()
    }

    /// A policy for a server instance of its own, as [`Self::fresh_policies`] makes,
    /// with the breakers, retry budget and counters of `old`, its policy until now: as a
    /// reload keeps a shared server's ([`PolicyKept::Health`]) when only its adapter changed.
    pub fn policy_keeping_health(&self, name: &str, old: &ServerPolicy) -> Option<Arc<ServerPolicy>> {
        let mut own = self.own_policy(name)?;
        own.keep_health_of(old);
        own.counters = old.counters.clone();
        Some(Arc::new(own))
    }

    fn own_policy(&self, name: &str) -> Option<ServerPolicy> {
        let shared = self.servers.get(name)?;
        let mut own = ServerPolicy::fresh(
            &shared.recovery,
            shared.grant.clone(),
            shared.declared.clone(),
            &self.clock,
            &self.rng,
        );
        own.counters = Arc::new(Counters::within(shared.counters.clone()));
        Some(own)
    }

    /// This engine with `policies` in place of its own for those servers.
    pub fn overlay(&self, policies: &HashMap<Arc<str>, Arc<ServerPolicy>>) -> Self {
        let mut servers = self.servers.clone();
        servers.extend(policies.iter().map(|(k, v)| (k.clone(), v.clone())));
        let (tallies, clock, rng) = (self.tallies.clone(), self.clock.clone(), self.rng.clone());
        Self { servers, tallies, clock, rng, max_plan_calls: self.max_plan_calls }
    }

    /// This engine with `server`'s breakers and retry budget those of `from`'s policy for
    /// it, when its recovery settings are the same in both: a reload whose relaunch of the
    /// server did not come up keeps its process serving, which they tell of.
    pub fn with_health_of(&self, from: &Engine, server: &str) -> Self {
        let mut kept = HashMap::new();
        if let (Some(now), Some(was)) = (self.servers.get(server), from.servers.get(server))
            && now.recovery == was.recovery
        {
            let mut policy = (**now).clone();
            policy.keep_health_of(was);
            kept.insert(Arc::from(server), Arc::new(policy));
        }
        self.overlay(&kept)
    }

    /// The engine of a new configuration: each server keeps of its policy what `keep`
    /// says; what is not kept is made afresh, with the adapter needs `declared` gives,
    /// counters carried over by name.
    pub fn reconfigure<'a>(
        &self,
        servers: impl IntoIterator<Item = &'a ServerConfig>,
        keep: &dyn Fn(&str) -> PolicyKept,
        declared: &dyn Fn(&str) -> Option<AdapterGrant>,
        max_plan_calls: u32,
    ) -> Self {
        let servers = servers
            .into_iter()
            .map(|s| {
                let name: Arc<str> = s.name.as_str().into();
                let old = self.servers.get(&name);
                let policy = match (old, keep(&s.name)) {
                    (Some(p), PolicyKept::Whole) => p.clone(),
                    (old, kept) => {
                        let declared = declared(&s.name).unwrap_or_else(|| AdapterGrant::own(&s.name));
                        let mut fresh =
                            ServerPolicy::fresh(&s.recovery, s.adapter_allow.clone(), declared, &self.clock, &self.rng);
                        fresh.counters = tally(&self.tallies, &name);
                        if let (Some(p), PolicyKept::Health) = (old, kept) {
                            fresh.keep_health_of(p);
                        }
                        Arc::new(fresh)
                    }
                };
                (name, policy)
            })
            .collect();
        Self {
            servers,
            tallies: self.tallies.clone(),
            clock: self.clock.clone(),
            rng: self.rng.clone(),
            max_plan_calls,
        }
    }

    pub fn declare(&mut self, server: &str, declared: AdapterGrant) {
        if let Some(policy) = self.servers.get_mut(server).and_then(Arc::get_mut) {
            policy.declared = declared;
        }
    }

    /// Limits the side calls and alternatives adapters' plans make per client call.
    pub fn with_plan_calls(mut self, max: u32) -> Self {
        self.max_plan_calls = max;
        self
    }

    pub fn policy(&self, server: &str) -> Option<&ServerPolicy> {
        self.servers.get(server).map(|p| &**p)
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Runs `tool` on `server` until it succeeds, fails for good, or runs out of time.
    /// `annotations` are the tool's as its server published them (the caller found the
    /// tool in the catalogue already); `advisor` (the server's adapter) may refine
    /// classifications and propose plans. Never panics: a panic inside is caught and the
    /// call gives up with an internal failure on record.
    pub async fn run(
        &self,
        upstream: &dyn Upstream,
        advisor: Option<&dyn Advisor>,
        server: Arc<str>,
        tool: String,
        annotations: Option<&ToolAnnotations>,
        arguments: Option<JsonObject>,
    ) -> (Ending, Record) {
        let Some(policy) = self.servers.get(&server) else {
            // A reload removed the server between the catalogue's reading and this one.
            let mut record = Record::new(server.clone(), tool.clone(), false);
            let failure = Failure::Unavailable { status: Status::Stopped, reason: Some("removed by a reload".into()) };
            let class = classify(&failure, self.clock.wall());
            record.push(&server, &tool, Role::Primary, Some((failure, class)), Duration::ZERO);
            return (Ending::GaveUp, record);
        };
        let safe = is_idempotent(&policy.recovery, &tool, annotations);
        let started = self.clock.now();
        let elsewhere = |server: &str, tool: &str| Some(self.servers.get(server)?.recovery.timeout_for(tool));
        let deadline = policy.recovery.deadline_for(&tool, elsewhere);
        let deadline = super::clock::later(started, Duration::from_millis(deadline));
        let mut record = Record::new(server.clone(), tool.clone(), safe);
        policy.counters.add(|c| &c.calls);
        // Asked once: every attempt of the tool called, its retries and its budget's.
        let blame = upstream.blame(&server);
        policy.budget.deposit(blame);
        let destructive = annotations.is_some_and(marks_destructive);
        let call =
            Call { upstream, advisor, policy, server, tool, arguments, safe, destructive, blame, started, deadline };
        let driven = AssertUnwindSafe(self.drive(&call, &mut record)).catch_unwind().await;
        match driven {
            Ok(ending) => (ending, record),
            Err(panic) => {
                let reason = crate::text::of_panic(&*panic).to_owned();
                let failure = Failure::Internal { reason };
                let class = classify(&failure, self.clock.wall());
                record.push(&call.server, &call.tool, Role::Primary, Some((failure, class)), Duration::ZERO);
                record.stopped = Some("Rebound failed while handling the call (a bug, logged)".into());
                (Ending::GaveUp, record)
            }
        }
    }

    /// Attempts the requested tool, and after each failure consults the adapter and runs
    /// the plan, until an answer, a give-up, or a plan that asks for another attempt.
    async fn drive(&self, call: &Call<'_>, record: &mut Record) -> Ending {
        let mut spent = Spent::default();
        loop {
            spent.primary += 1;
            let (failure, builtin) = match self.attempt_primary(call).await {
                Ok(result) => return self.answered(call, record, &spent, result).await,
                Err(failed) => failed,
            };
            // What only the gateway can know is decided on its own classification, so that
            // no adapter can end a call early or keep the configured fallbacks from running.
            // A call the client cancelled ends here, without asking its adapter anything.
            if builtin.category == Category::Cancelled || call.upstream.cancellation().is_cancelled() {
                record.push(&call.server, &call.tool, Role::Primary, Some((failure, builtin)), spent.waited);
                record.stopped = Some(CANCELLED.into());
                return Ending::GaveUp;
            }
            let (class, advised) = self.consult(call, spent.primary, &failure, &builtin).await;
            // What the plan holds of its adapter's room, until it has run.
            let (advised, _held) = advised.map_or((None, None), |a| (Some(a.steps), a.held));
            record.push(&call.server, &call.tool, Role::Primary, Some((failure.clone(), class.clone())), spent.waited);
            // A healthy server said no and nobody knows better: unless a configured
            // fallback answers, the agent gets the tool's own answer (its structured
            // content and all), with the adapter's word on it (which log to read).
            let own = match failure {
                Failure::ToolError { result }
                    if advised.as_ref().is_none_or(Vec::is_empty) && !class.retryable && !builtin.retryable =>
                {
                    Some(with_note(*result, class.message.as_deref()))
                }
                _ => None,
            };
            let mut plan = plan::compose(advised, &call.policy.recovery, (&call.server, &call.tool), &class, &builtin);
            if call.upstream.alone() {
                plan.steps.retain(|(step, _)| !matches!(step, Step::Alternative { .. }));
            }
            if let Some(own) = own.clone().filter(|_| plan.steps.is_empty()) {
                record.notes = usize::from(class.message.is_some());
                return Ending::Answered(own.into());
            }
            let ending = match self.run_plan(call, record, &mut spent, plan, (&class, &builtin)).await {
                Next::Retry => continue,
                Next::Done(ending) => ending,
            };
            return match (ending, own) {
                (Ending::GaveUp, Some(own)) if !call.upstream.cancellation().is_cancelled() => {
                    let note = tried_instead(record);
                    record.notes = usize::from(class.message.is_some()) + usize::from(note.is_some());
                    Ending::Answered(with_note(own, note.as_deref()).into())
                }
                (ending, _) => ending,
            };
        }
    }

    /// One attempt of the tool the client called.
    async fn attempt_primary(&self, call: &Call<'_>) -> Result<CallToolResponse, (Failure, Classification)> {
        let timeout = Duration::from_millis(call.policy.recovery.timeout_for(&call.tool));
        let what = (&*call.server, &*call.tool, Role::Primary, call.blame);
        self.attempt(call.upstream, call.policy, what, &call.arguments, timeout, call.deadline).await
    }

    /// The tool the client called answered: on record, counted, shown to the adapter.
    async fn answered(&self, call: &Call<'_>, record: &mut Record, spent: &Spent, result: CallToolResponse) -> Ending {
        record.push(&call.server, &call.tool, Role::Primary, None, spent.waited);
        if spent.primary > 1 {
            call.policy.counters.add(|c| &c.recovered);
        }
        observe(call.advisor, (&call.server, &call.tool, call.arguments.as_ref(), ArgumentsBy::Client), &result).await;
        Ending::Answered(result)
    }

    /// Asks the adapter, if any, to refine the built-in classification and to propose a
    /// plan. What it says is bounded: waits are clamped, and its claim that a call was
    /// never delivered stands only where [`believes_not_delivered`] allows it.
    async fn consult(
        &self,
        call: &Call<'_>,
        attempt: u32,
        failure: &Failure,
        builtin: &Classification,
    ) -> (Classification, Option<Advice>) {
        // Past the call's deadline nothing more starts, an adapter call included.
        let Some(advisor) = call.advisor.filter(|_| self.clock.now() < call.deadline) else {
            return (builtin.clone(), None);
        };
        let ctx = FailureContext {
            server: &call.server,
            tool: &call.tool,
            arguments: call.arguments.as_ref(),
            attempt,
            elapsed: self.clock.now().saturating_duration_since(call.started),
            failure,
        };
        // Each is stopped at the call's deadline, the built-in answer standing.
        let mut class = match self.by_deadline(call, advisor.classify(&ctx, builtin)).await.flatten() {
            Some(refined) => refined,
            None => builtin.clone(),
        };
        // An adapter may lengthen the wait the server asked for, never shorten it.
        class.retry_after = class.retry_after.max(builtin.retry_after).map(|d| d.min(retry_after::MAX));
        if class.not_delivered && !builtin.not_delivered && !believes_not_delivered(call) {
            class.not_delivered = false;
        }
        let advised = self.by_deadline(call, advisor.plan(&ctx, &class)).await.flatten();
        (class, advised)
    }

    /// What `asked` ends with, unless `call`'s deadline comes first (or has passed).
    async fn by_deadline<T>(&self, call: &Call<'_>, asked: impl Future<Output = T>) -> Option<T> {
        let left = call.deadline.saturating_duration_since(self.clock.now());
        if left.is_zero() {
            return None;
        }
        tokio::select! {
            biased;
            answer = asked => Some(answer),
            () = self.clock.sleep(left) => None,
        }
    }

    /// Runs `plan`'s steps in order until one answers or asks for another attempt.
    /// `classes` are the failure's classification as the adapter refined it, and the
    /// gateway's own.
    async fn run_plan(
        &self,
        call: &Call<'_>,
        record: &mut Record,
        spent: &mut Spent,
        plan: Plan,
        (class, builtin): (&Classification, &Classification),
    ) -> Next {
        if plan.steps.is_empty() && record.stopped.is_none() {
            record.stopped = Some(format!("a {} failure has no recovery", class.category));
        }
        let cancelled = call.upstream.cancellation();
        for (step, origin) in plan.steps {
            if cancelled.is_cancelled() {
                record.stopped = Some(CANCELLED.into());
                return Next::Done(Ending::GaveUp);
            }
            match step {
                Step::Retry(asked) => {
                    if let Some(next) = self.retry(call, record, spent, asked, (class, builtin)).await {
                        return next;
                    }
                }
                Step::SideCall { tool, arguments } => {
                    self.side_call(call, record, spent, origin, tool, arguments).await;
                }
                Step::Alternative { server, tool, arguments } => {
                    if self.clock.now() >= call.deadline {
                        record.stopped = Some("the call's deadline passed".into());
                        break;
                    }
                    let server: Arc<str> = server.as_deref().map(Arc::from).unwrap_or_else(|| call.server.clone());
                    if let Some(result) = self.alternative(call, record, spent, origin, server, tool, arguments).await {
                        return Next::Done(Ending::Answered(result));
                    }
                }
                Step::Restart => self.restart(call, record, spent, origin).await,
                Step::GiveUp(action) => {
                    record.action = Some(action);
                    return Next::Done(Ending::GaveUp);
                }
            }
        }
        if plan.give_up.is_some() {
            record.action = plan.give_up;
        }
        Next::Done(Ending::GaveUp)
    }

    /// A retry step, `asked` after a delay or not: after its wait, the next attempt, or the
    /// end of a call cancelled meanwhile; `None` when no retry is allowed (the record says
    /// why) and the plan goes on.
    async fn retry(
        &self,
        call: &Call<'_>,
        record: &mut Record,
        spent: &mut Spent,
        asked: Option<Duration>,
        (class, builtin): (&Classification, &Classification),
    ) -> Option<Next> {
        let asked = asked.map(|d| d.min(retry_after::MAX));
        // An adapter's word that the call never ran (not the transport's) buys a tool
        // that is unsafe to replay one replay, no more.
        let on_adapters_word = !call.safe && !builtin.not_delivered && class.not_delivered;
        let replayable =
            call.safe || builtin.not_delivered || (class.not_delivered && spent.replays_on_adapters_word == 0);
        let delay = match self.retry_delay(call, spent, class, replayable, asked) {
            Ok(delay) => delay,
            Err(why) => {
                record.stopped = Some(why);
                return None;
            }
        };
        if on_adapters_word {
            spent.replays_on_adapters_word += 1;
        }
        call.policy.counters.add(|c| &c.retries);
        tokio::select! {
            () = self.clock.sleep(delay) => {}
            () = call.upstream.cancellation().cancelled() => {
                record.stopped = Some(CANCELLED.into());
                return Some(Next::Done(Ending::GaveUp));
            }
        }
        spent.waited = delay;
        Some(Next::Retry)
    }

    /// Whether a step an adapter asked for may call `server/tool`: inside its grant and its
    /// declaration (a tool its server marks destructive named in the grant itself, not
    /// matched by a `*`), within the call's plan limit, not a second run of a tool that is
    /// unsafe to replay (one of the call's configured fallbacks, which always run, counts
    /// as run), and with retry budget left on the adapter's own server (so that an
    /// adapter can never spend another server's). Steps from the configuration always may.
    /// `annotations` are the target tool's, as its server lists it.
    fn admit_call(
        &self,
        call: &Call<'_>,
        record: &mut Record,
        spent: &mut Spent,
        origin: Origin,
        (server, tool, annotations): (&Arc<str>, &str, Option<&ToolAnnotations>),
    ) -> bool {
        if origin != Origin::Adapter {
            return true;
        }
        let Some(target) = self.servers.get(server) else { return false };
        if !self.permitted(call, record, origin, (server, tool)) {
            return false;
        }
        if annotations.is_some_and(marks_destructive) && !call.policy.grant.names_tool(server, tool) {
            return deny(call, record, Denial::Destructive, (server, tool));
        }
        if spent.plan_calls >= self.max_plan_calls {
            return deny(call, record, Denial::Calls, (server, tool));
        }
        let a_fallback = |alt: &crate::config::Alternative| {
            alt.tool == tool && alt.server.as_deref().unwrap_or(&call.server) == &**server
        };
        let is_fallback = call.policy.recovery.fallbacks.get(&call.tool).into_iter().flatten().any(a_fallback);
        let ran = (**server == *call.server && tool == call.tool)
            || spent.called.contains(&(server.clone(), tool.to_owned()))
            || is_fallback;
        if ran && !is_idempotent(&target.recovery, tool, annotations) {
            return deny(call, record, Denial::Replay, (server, tool));
        }
        // Configured fallbacks have their time, whatever an adapter plans: a step of its
        // own (its whole timeout) must leave the next one its timeout before the deadline.
        if !is_fallback && let Some((fallback, needs)) = self.fallback_reserve(call, spent) {
            let step = Duration::from_millis(target.recovery.timeout_for(tool));
            let remaining = call.deadline.saturating_duration_since(self.clock.now());
            if step.saturating_add(needs) > remaining {
                record.stopped = Some(format!(
                    "the plan's call of `{server}/{tool}` was skipped: it could take the time the fallback `{fallback}` needs before the call's deadline"
                ));
                return false;
            }
        }
        if let Some(open) = target.breakers.refused_at(tool, call.upstream.blame(server), self.clock.now()) {
            record.stopped = Some(format!("the plan's call of `{server}/{tool}` was skipped: {open}"));
            return false;
        }
        if let Err(spent) = call.policy.budget.withdraw(call.blame) {
            record.stopped =
                Some(format!("the plan's call of `{server}/{tool}` was skipped: `{}`: {spent}", call.server));
            return false;
        }
        spent.plan_calls += 1;
        true
    }

    /// Whether `server/tool` is inside the grant and the declaration of the adapter whose
    /// step names it (else the denial is recorded); a configured step always is.
    fn permitted(&self, call: &Call<'_>, record: &mut Record, origin: Origin, (server, tool): (&str, &str)) -> bool {
        if origin != Origin::Adapter {
            return true;
        }
        let denial = if !call.policy.grant.allows_tool(server, tool) {
            Denial::Grant
        } else if !call.policy.declared.allows_tool(server, tool) {
            Denial::Undeclared
        } else {
            return true;
        };
        deny(call, record, denial, (server, tool))
    }

    /// A step naming `server/tool`, which its server does not offer now: noted once as not
    /// tried, and why; an adapter's step outside its grant is denied as such instead.
    fn not_offered(&self, call: &Call<'_>, record: &mut Record, origin: Origin, step: NotTried) {
        if self.permitted(call, record, origin, (&step.server, &step.tool)) && !record.not_tried.contains(&step) {
            record.not_tried.push(step);
        }
    }

    /// A call for its effect on the failed tool's server; its result is not the answer.
    async fn side_call(
        &self,
        call: &Call<'_>,
        record: &mut Record,
        spent: &mut Spent,
        origin: Origin,
        tool: String,
        arguments: JsonObject,
    ) {
        if self.clock.now() >= call.deadline {
            return;
        }
        let server = call.server.clone();
        let annotations = match call.upstream.annotations(&server, &tool) {
            Ok(annotations) => annotations,
            Err(why) => return self.not_offered(call, record, origin, NotTried { server, tool, why }),
        };
        if !self.admit_call(call, record, spent, origin, (&server, &tool, annotations.as_ref())) {
            return;
        }
        spent.called.insert((server.clone(), tool.clone()));
        let timeout = Duration::from_millis(call.policy.recovery.timeout_for(&tool));
        let args = Some(arguments);
        let outcome = self
            .attempt(
                call.upstream,
                call.policy,
                (&server, &tool, Role::SideCall, call.upstream.blame(&server)),
                &args,
                timeout,
                call.deadline,
            )
            .await;
        match outcome {
            Ok(result) => {
                let by = if origin == Origin::Adapter { ArgumentsBy::Adapter } else { ArgumentsBy::Client };
                observe(call.advisor, (&server, &tool, args.as_ref(), by), &result).await;
                record.push(&server, &tool, Role::SideCall, None, Duration::ZERO);
            }
            Err(f) => record.push(&server, &tool, Role::SideCall, Some(f), Duration::ZERO),
        }
    }

    /// Another tool that answers the same question; its success is the answer.
    #[allow(clippy::too_many_arguments, reason = "one step's worth of context, used once")]
    async fn alternative(
        &self,
        call: &Call<'_>,
        record: &mut Record,
        spent: &mut Spent,
        origin: Origin,
        server: Arc<str>,
        tool: String,
        arguments: Option<JsonObject>,
    ) -> Option<CallToolResponse> {
        let (policy, annotations) = match self.untried_alternative(call, spent, &server, &tool) {
            Ok(untried) => untried?,
            Err(why) => {
                self.not_offered(call, record, origin, NotTried { server, tool, why });
                return None;
            }
        };
        if !self.admit_call(call, record, spent, origin, (&server, &tool, annotations.as_ref())) {
            return None;
        }
        spent.alternatives.insert((server.clone(), tool.clone()));
        spent.called.insert((server.clone(), tool.clone()));
        policy.counters.add(|c| &c.fallbacks);
        let by = match (origin, &arguments) {
            (Origin::Adapter, Some(_)) => ArgumentsBy::Adapter,
            _ => ArgumentsBy::Client,
        };
        let args = arguments
            .or_else(|| {
                let configured = plan::configured(&call.policy.recovery, (&call.server, &call.tool), (&server, &tool))?;
                map_arguments(configured, call.arguments.as_ref())
            })
            .or_else(|| call.arguments.clone());
        let timeout = Duration::from_millis(policy.recovery.timeout_for(&tool));
        let target = (&*server, tool.as_str(), Role::Alternative, call.upstream.blame(&server));
        match self.attempt(call.upstream, policy, target, &args, timeout, call.deadline).await {
            Ok(result) => {
                record.push(&server, &tool, Role::Alternative, None, Duration::ZERO);
                call.policy.counters.add(|c| &c.recovered);
                observe(call.advisor, (&server, &tool, args.as_ref(), by), &result).await;
                Some(result)
            }
            Err(f) => {
                record.push(&server, &tool, Role::Alternative, Some(f), Duration::ZERO);
                None
            }
        }
    }

    /// Restarts the failed tool's server, once per client call and only when granted.
    async fn restart(&self, call: &Call<'_>, record: &mut Record, spent: &mut Spent, origin: Origin) {
        let denial = match origin {
            Origin::Adapter if !call.policy.grant.restart || spent.restarted => Some(Denial::Restart),
            Origin::Adapter if !call.policy.declared.restart => Some(Denial::Undeclared),
            _ => None,
        };
        if let Some(denial) = denial {
            call.policy.counters.deny(denial);
            record.denied.push(Denied { denial, target: call.server.to_string() });
            return;
        }
        // Configured fallbacks have their time, whatever an adapter plans: the wait for the
        // server to come back leaves the next one its timeout before the deadline.
        let remaining = call.deadline.saturating_duration_since(self.clock.now());
        let reserved = self.fallback_reserve(call, spent);
        let within = remaining.saturating_sub(reserved.as_ref().map_or(Duration::ZERO, |(_, needs)| *needs));
        if within.is_zero() {
            if let Some((fallback, _)) = reserved {
                record.stopped = Some(format!(
                    "the plan's restart was skipped: it could take the time the fallback `{fallback}` needs before the call's deadline"
                ));
            }
            return;
        }
        spent.restarted = true;
        tokio::select! {
            () = call.upstream.restart(&call.server, within) => {}
            () = call.upstream.cancellation().cancelled() => {}
        }
    }

    /// One attempt (of a tool on a server, as a role in the client's call) through the
    /// client's own breakers (if it has any there), the server's and the tool's,
    /// classified when it fails.
    async fn attempt(
        &self,
        upstream: &dyn Upstream,
        policy: &ServerPolicy,
        (server, tool, role, blame): (&str, &str, Role, Blame),
        arguments: &Option<JsonObject>,
        timeout: Duration,
        deadline: tokio::time::Instant,
    ) -> Result<CallToolResponse, (Failure, Classification)> {
        let classified = |f: Failure| {
            let c = classify_sent(&f, arguments.as_ref(), self.clock.wall());
            (f, c)
        };
        // (Counted among the server's failures only once it was asked: not when no time
        // was left, nor when a breaker shed it, which `shed` counts.)
        let failed = |f: Failure| {
            policy.counters.add(|c| &c.failures);
            classified(f)
        };
        if upstream.cancellation().is_cancelled() {
            return Err((Failure::Cancelled, classify(&Failure::Cancelled, self.clock.wall())));
        }
        let remaining = deadline.saturating_duration_since(self.clock.now());
        if remaining.is_zero() {
            return Err(classified(Failure::Timeout { after: Duration::ZERO }));
        }
        let permits = match policy.breakers.admit(tool, blame) {
            Ok(permits) => permits,
            Err(shed) => {
                policy.counters.add(|c| &c.shed);
                let tool = shed.tool.then(|| tool.to_owned());
                return Err(classified(Failure::CircuitOpen { retry_in: shed.retry_in, tool, own: shed.own }));
            }
        };
        policy.counters.add(|c| &c.attempts);
        let started = self.clock.now();
        match upstream.call(server, tool, role, arguments.clone(), timeout.min(remaining), remaining).await {
            Ok(result) => {
                policy.breakers.succeeded(permits);
                Ok(result)
            }
            Err(failure) => {
                let (failure, class) = failed(failure);
                // Out of time with less than half the time its configuration allows it
                // (its timeout, or a shorter configured deadline) to run in, the rest
                // spent before it (earlier attempts) or within it before it was sent (a
                // restart waited for: `after` is how long the server had it), an attempt
                // says nothing of the server.
                let allowed = policy.recovery.deadline_ms.map_or(timeout, |d| timeout.min(Duration::from_millis(d)));
                let cut_short = match failure {
                    Failure::Timeout { after } => after.min(remaining) < allowed / 2,
                    _ => false,
                };
                self.record_failure(policy, (tool, started), permits, (&failure, &class), cut_short);
                Err((failure, class))
            }
        }
    }

    /// Records a failed attempt of `tool`, `started` then, on the breakers it was let
    /// through; one `cut_short` of its timeout by the call's deadline counts for nothing.
    fn record_failure(
        &self,
        policy: &ServerPolicy,
        (tool, started): (&str, tokio::time::Instant),
        permits: Permits,
        (failure, class): (&Failure, &Classification),
        cut_short: bool,
    ) {
        let outcome = if class.counts_for_breaker && !cut_short {
            Outcome::Failure
        } else if matches!(failure, Failure::ToolError { .. }) && !class.retryable {
            Outcome::Success
        } else {
            Outcome::Ignored
        };
        // A broken connection is never the tool's alone; which level the others count
        // at, the breakers decide (`ServerBreakers::failed`).
        let tool_level = matches!(
            failure,
            Failure::Timeout { .. }
                | Failure::Rpc { .. }
                | Failure::ToolError { .. }
                | Failure::HttpStatus { status: 500..=599, .. }
        );
        let window = Duration::from_millis(policy.recovery.breaker.window_ms);
        let now = self.clock.now();
        let since = now.checked_sub(window).unwrap_or(started.min(now));
        let lost = match failure {
            Failure::ConnectionLost { session, .. } => *session,
            _ => None,
        };
        let failed = Failed { outcome, tool_level, undelivered: class.not_delivered, lost, since };
        policy.breakers.failed(permits, tool, failed);
    }

    /// An alternative `server/tool` that would be tried now, with its server's policy and
    /// the tool's annotations: its server configured, the tool offered there now (else
    /// why not), and not tried already in this call (else `None`).
    fn untried_alternative(
        &self,
        call: &Call<'_>,
        spent: &Spent,
        server: &str,
        tool: &str,
    ) -> Result<Option<(&ServerPolicy, Option<ToolAnnotations>)>, Unoffered> {
        if spent.alternatives.iter().any(|(s, t)| **s == *server && t == tool) {
            return Ok(None);
        }
        let policy = self.servers.get(server).ok_or(Unoffered::Unknown)?;
        let annotations = call.upstream.annotations(server, tool)?;
        Ok(Some((policy, annotations)))
    }

    /// The time a retry must leave before the call's deadline: what the next configured
    /// fallback that will run may take (its timeout), so that the fallbacks, which always
    /// run, are never left without time by the retries before them.
    fn fallback_reserve(&self, call: &Call<'_>, spent: &Spent) -> Option<(String, Duration)> {
        // A call only its own tool may answer runs no fallback to keep time for.
        if call.upstream.alone() {
            return None;
        }
        let fallbacks = call.policy.recovery.fallbacks.get(&call.tool)?;
        fallbacks.iter().find_map(|alt| {
            let server = alt.server.as_deref().unwrap_or(&call.server);
            let (policy, _) = self.untried_alternative(call, spent, server, &alt.tool).ok().flatten()?;
            Some((alt.tool.clone(), Duration::from_millis(policy.recovery.timeout_for(&alt.tool))))
        })
    }

    /// How long to wait before the next attempt of the requested tool, or why not to
    /// retry. `replayable`: the tool is safe to replay, or the call provably never ran.
    /// The retry (its wait and its whole timeout) must leave the next fallback its time.
    fn retry_delay(
        &self,
        call: &Call<'_>,
        spent: &Spent,
        class: &Classification,
        replayable: bool,
        asked: Option<Duration>,
    ) -> Result<Duration, String> {
        let (policy, deadline, n) = (call.policy, call.deadline, spent.primary - 1);
        let retry = &policy.recovery.retry;
        if !class.retryable {
            return Err(format!("a {} failure is not worth retrying", class.category));
        }
        if class.category == Category::CircuitOpen {
            return Err("the circuit breaker is open".into());
        }
        if !replayable {
            return Err("the tool is not marked read-only or idempotent, so it is not replayed automatically".into());
        }
        if n + 1 >= retry.max_attempts {
            return Err(format!("all {} attempts were used", retry.max_attempts));
        }
        let base = asked.unwrap_or_else(|| backoff::full_jitter(retry, n, self.rng.unit()));
        let delay = class.retry_after.map_or(base, |after| after.max(base));
        let remaining = deadline.saturating_duration_since(self.clock.now());
        if delay >= remaining {
            return Err(match class.retry_after {
                Some(after) => format!("the server asked to wait {} ms, past the call's deadline", after.as_millis()),
                None => "no time was left before the call's deadline".into(),
            });
        }
        if let Some((fallback, needs)) = self.fallback_reserve(call, spent) {
            let attempt = Duration::from_millis(policy.recovery.timeout_for(&call.tool));
            if delay + attempt + needs > remaining {
                return Err(format!(
                    "another attempt could take the time the fallback `{fallback}` needs before the call's deadline"
                ));
            }
        }
        // A breaker the last attempt opened would shed the next one: no budget for it.
        if let Some(open) = policy.breakers.refused_at(&call.tool, call.blame, self.clock.now() + delay) {
            return Err(format!("{open}, so another attempt would be refused"));
        }
        policy.budget.withdraw(call.blame).map_err(|spent| spent.to_string())?;
        Ok(delay)
    }
}

/// Refuses an adapter's step naming `server/tool` for `denial`: counted, and on record.
/// Always `false`, the step's admission.
fn deny(call: &Call<'_>, record: &mut Record, denial: Denial, (server, tool): (&str, &str)) -> bool {
    call.policy.counters.deny(denial);
    record.denied.push(Denied { denial, target: format!("{server}/{tool}") });
    false
}

/// Shows the advisor a successful call's result (an answer that is not one, it never sees).
async fn observe(
    advisor: Option<&dyn Advisor>,
    (server, tool, arguments, arguments_by): (&str, &str, Option<&JsonObject>, ArgumentsBy),
    answer: &CallToolResponse,
) {
    if let (Some(a), CallToolResponse::Complete(result)) = (advisor, answer) {
        a.observe(&Completed { server, tool, arguments, result, arguments_by }).await;
    }
}

/// What `record` tried in place of the tool called, none of which answered, in words:
/// each with how it failed (its kind and category, not its text, which the errors log
/// has: it may quote a server's configuration).
fn tried_instead(record: &Record) -> Option<String> {
    let tried: Vec<String> = record
        .attempts
        .iter()
        .filter(|a| a.role == Role::Alternative)
        .map(|a| match (&a.failure, &a.classification) {
            (Some(f), Some(c)) => format!("`{}` on `{}` ({}: {})", a.tool, a.server, f.kind(), c.category),
            _ => format!("`{}` on `{}`", a.tool, a.server),
        })
        .collect();
    let untried: Vec<String> = record.not_tried.iter().map(NotTried::to_string).collect();
    let said = [
        (!tried.is_empty())
            .then(|| format!("the configured fallbacks were tried too, and failed: {}", tried.join(", "))),
        (!untried.is_empty()).then(|| format!("not tried: {}", untried.join(", "))),
    ];
    let said: Vec<String> = said.into_iter().flatten().collect();
    (!said.is_empty()).then(|| said.join("; "))
}

/// A tool's own error result, with the adapter's note on it when it has one.
fn with_note(mut result: CallToolResult, note: Option<&str>) -> CallToolResult {
    if let Some(note) = note {
        result.content.push(rmcp::model::ContentBlock::text(format!("[rebound: {note}]")));
    }
    result
}

/// The alternative's arguments: `"$name"` copies the original argument `name`.
pub fn map_arguments(alt: &Alternative, original: Option<&JsonObject>) -> Option<JsonObject> {
    let Some(template) = &alt.arguments else {
        return original.cloned();
    };
    let mut out = JsonObject::new();
    for (key, value) in template {
        match value {
            Value::String(s) if s.starts_with('$') => {
                if let Some(v) = original.and_then(|o| o.get(&s[1..])) {
                    out.insert(key.clone(), v.clone());
                }
            }
            literal => {
                out.insert(key.clone(), literal.clone());
            }
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests;
