//! Running adapters: every call in a fresh instance, under the runtime's limits (on the
//! caller's task until the guest first yields, then on the plugins' own thread); faults contained and counted, and a plugin that keeps faulting
//! quarantined. [`Adapters`] is the recovery engine's [`Advisor`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::bindings::v0_1::rebound::adapter::types as wit;
use super::kv::Kv;
use super::load::{Info, Loaded, Needs};
use super::runtime::{Fault, Pre, Reply, Request, Room, Runtime};
use super::state::{CappedPipe, LogBudget, State};
use crate::config::AdapterGrant;
use crate::lasting::{Locked, ReadWrite};
use crate::text::capped;

mod lane;
use crate::recovery::Failure;
use crate::recovery::classify::{Category, Classification, Kind, Severity};
use crate::recovery::engine::{Denial, Denied};
use crate::recovery::plan::{Advice, Advisor, Completed, FailureContext, Step};
use crate::redact::Secrets;
use futures::future::BoxFuture;
use lane::{Admission, Lane};
use rmcp::model::{CallToolResult, JsonObject};

/// Faults within [`FAULT_WINDOW`] that quarantine a plugin.
const FAULT_LIMIT: usize = 3;
const FAULT_WINDOW: Duration = Duration::from_secs(60);
const QUARANTINE: Duration = Duration::from_secs(300);
/// Output kept from one call, for the log.
const OUTPUT_CAP: usize = 4 << 10;

/// One adapter serving one server.
pub struct Adapter {
    runtime: Arc<Runtime>,
    pre: Pre,
    pub info: Info,
    pub name: Arc<str>,
    /// SHA-256 of the component's bytes: a reload keeps an adapter whose code is the same.
    pub digest: [u8; 32],
    server: Arc<str>,
    /// Whether its server answers one client or many: an adapter of one shared by many
    /// may only read its store while it classifies and plans ([`super::Clients`]).
    clients: super::Clients,
    config: Arc<str>,
    kv: Kv,
    /// Removed from everything the adapter is shown; shared with its forks, and replaced
    /// by a reload that keeps the adapter (`hide`).
    secrets: Arc<std::sync::RwLock<Secrets>>,
    log: Arc<LogBudget>,
    /// Shared with its forks: a session's own copy runs the same code, and its faults
    /// count (and quarantine) for them all.
    health: Arc<Mutex<Health>>,
    /// Successful calls waiting to be observed, in order.
    lane: Lane,
    /// Instances and plugins' threads this adapter may hold at once. Shared with its
    /// forks, as is its log budget: many client sessions do not make one adapter many.
    room: Room,
}

/// Refused steps of one kind are logged at most this often per adapter.
const DENIAL_LOG_EVERY: Duration = Duration::from_secs(60);

#[derive(Debug, Default, Clone)]
struct Health {
    faults: crate::pace::Recent,
    total_faults: u64,
    quarantined_until: Option<Instant>,
    last_fault: Option<String>,
    /// What the adapter printed during its last fault.
    last_output: Option<String>,
    /// Calls not made because no instance was free in time.
    busy: u64,
    /// Calls not shown because they weigh too much for its memory ([`SHOWN_OF_MEMORY`]).
    too_heavy: u64,
    /// When each kind of refused step was last logged.
    denials_logged: HashMap<Denial, Instant>,
}

/// An adapter's health, for `rebound_status`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct HealthReport {
    pub name: String,
    pub version: String,
    pub faults: u64,
    pub quarantined_for_ms: Option<u64>,
    /// The host's words only: what failed and how.
    pub last_fault: Option<String>,
    /// What the adapter printed then, which may quote any client's call: for the
    /// operator (`GET /status`), never in `rebound_status`.
    pub last_output: Option<String>,
    /// `host.log` lines dropped past the rate limit.
    pub log_lines_dropped: u64,
    /// Successful calls not shown to it because its queue was full.
    pub observe_dropped: u64,
    /// Calls it was not asked, or was stopped in, because every instance it may hold
    /// was busy past its deadline or most of it (no fault: the built-in classification
    /// answered).
    pub busy: u64,
    /// Calls it was not shown because, read as JSON, they would weigh more than a quarter
    /// of its memory, and plans not taken because the plans its calls in flight run
    /// weighed [`MAX_PLANS_HELD`] already (no fault: the built-in answer stood).
    pub too_heavy: u64,
}

/// An adapter is shown a call (its arguments, messages, result) that weighs, read as
/// JSON ([`crate::weight::json`]), at most this fraction of its memory.
pub const SHOWN_OF_MEMORY: usize = 4;

impl Adapter {
    /// The adapter `loaded` serving `server` with its `config`. Asks the adapter what it
    /// needs given that configuration (`declare`); one that cannot say, or says something
    /// malformed, is not used. Call it outside the async runtime, like [`super::load::load`].
    pub fn new(
        runtime: Arc<Runtime>,
        loaded: &Loaded,
        name: &str,
        (server, clients): (&str, super::Clients),
        config: &serde_json::Value,
        secrets: Secrets,
    ) -> Result<Arc<Self>, String> {
        let mut adapter = Self::unasked(runtime, loaded, name, (server, clients), config.to_string().into(), secrets);
        // Asked as loading asks (`load::LOAD_ATTEMPTS` times before a failure is taken for
        // its own): a sound adapter kept from its deadline once by a loaded machine must
        // not refuse a reload, a token's rotation among them.
        let mut declared = (None, false);
        for _ in 0..super::load::LOAD_ATTEMPTS {
            let adapter = &adapter;
            let asked = || async move {
                let busy = adapter.health().busy;
                (adapter.call("declare", Request::Declare).await, adapter.health().busy > busy)
            };
            declared = super::load::block_on(super::load::while_busy(asked, |(_, busy)| *busy))
                .map_err(|e| format!("could not be asked what it needs: {e}"))?;
            if matches!(declared.0, Some(Reply::Declared(_))) {
                // Misses before an answer are not faults to enter service with.
                *adapter.health.locked() = Health::default();
                break;
            }
        }
        let (Some(Reply::Declared(manifest)), _) = declared else {
            let why = adapter.health().last_fault.unwrap_or_default();
            return Err(format!("failed when asked what it needs for `{server}`: {why}"));
        };
        adapter.info.needs = Needs::from_manifest(&manifest).map_err(|e| format!("declares {e}"))?;
        Ok(Arc::new(adapter))
    }

    /// The adapter `loaded` serving `server`, not yet asked what it needs, with state of
    /// its own: an empty store and observe queue, no faults, a log budget of its own and
    /// `secrets` hidden.
    fn unasked(
        runtime: Arc<Runtime>,
        loaded: &Loaded,
        name: &str,
        (server, clients): (&str, super::Clients),
        config: Arc<str>,
        secrets: Secrets,
    ) -> Self {
        let room = runtime.room(name);
        Self {
            kv: Kv::counted_in(room.stored.clone()),
            lane: Lane::within(room.observing.clone()),
            room,
            runtime,
            pre: loaded.pre.clone(),
            info: loaded.info.clone(),
            name: name.into(),
            digest: loaded.digest,
            server: server.into(),
            clients,
            config,
            secrets: Arc::new(std::sync::RwLock::new(secrets)),
            log: Arc::new(super::state::log_budget()),
            health: Arc::default(),
        }
    }

    /// Whether this adapter was introduced (its `declare` asked) as `loaded`, under
    /// `name`, would be for `serving` with `config`: the same adapter, code and runtime,
    /// the same configuration and the same clients, so that it would declare the same
    /// needs.
    pub fn introduced_as(
        &self,
        (runtime, loaded, name): (&Arc<Runtime>, &Loaded, &str),
        serving: (&str, super::Clients),
        config: &serde_json::Value,
    ) -> bool {
        Arc::ptr_eq(&self.runtime, runtime)
            && *self.name == *name
            && self.digest == loaded.digest
            && (&*self.server, self.clients) == serving
            && *self.config == *config.to_string()
    }

    /// A new adapter of `loaded` (the same code, on the same runtime, as
    /// [`Self::introduced_as`] found) with this one's configuration and declared needs,
    /// state of its own (an empty store and observe queue, no faults counted) and
    /// `secrets` hidden: what a reload gives a server whose entry changed but not its
    /// adapter, as [`Self::new`] would, without asking the adapter again. A quarantine
    /// goes on: nothing that could have mended the adapter changed.
    pub fn renewed(&self, loaded: &Loaded, secrets: Secrets) -> Arc<Self> {
        let serving = (&*self.server, self.clients);
        let mut renewed =
            Self::unasked(self.runtime.clone(), loaded, &self.name, serving, self.config.clone(), secrets);
        renewed.info.needs = self.info.needs.clone();
        renewed.health.locked().quarantined_until = self.health.locked().quarantined_until;
        Arc::new(renewed)
    }

    /// The same adapter for another instance of its server (a client session's own): the
    /// same code, configuration and declared needs, with state of its own (its key-value
    /// store, such as the HOL cursor, and its observe queue); its health (faults,
    /// quarantine), its share of the instance pool, its log budget, the secrets hidden
    /// from it and its observe queue's bytes stay the original's.
    pub fn fork(&self) -> Arc<Self> {
        Self::with_state(self, self, (self.kv.sibling(), super::Clients::One))
    }

    /// `code`'s adapter (its code, runtime and share of the pool) with `kv` for its store,
    /// serving `clients`, and what `state` holds for all its copies (health, log budget,
    /// secrets hidden, the bytes its observe queues may hold), and a queue of its own.
    fn with_state(code: &Adapter, state: &Adapter, (kv, clients): (Kv, super::Clients)) -> Arc<Self> {
        Arc::new(Self {
            runtime: code.runtime.clone(),
            pre: code.pre.clone(),
            info: code.info.clone(),
            name: code.name.clone(),
            digest: code.digest,
            server: code.server.clone(),
            clients,
            config: code.config.clone(),
            kv,
            secrets: state.secrets.clone(),
            log: state.log.clone(),
            health: state.health.clone(),
            lane: state.lane.sharing(),
            room: code.room.clone(),
        })
    }

    /// Whether `other` runs on this adapter's runtime (the same limits, pool and cache).
    pub fn same_runtime(&self, other: &Adapter) -> bool {
        Arc::ptr_eq(&self.runtime, &other.runtime)
    }

    /// What is hidden from the adapter now.
    fn secrets(&self) -> Secrets {
        self.secrets.reading().clone()
    }

    /// From now on hides `more` too, from this adapter and its forks: a reload may bring
    /// new secrets (another server's, the gateway's token), and what was secret stays
    /// hidden.
    pub fn hide(&self, more: &Secrets) {
        let mut secrets = self.secrets.writing();
        *secrets = secrets.union(more);
    }

    /// This adapter on `fresh`'s runtime (the same code, on the new limits of a reload):
    /// its store, such as the HOL cursor, is this one's, shared, so that what its calls
    /// still running write is kept too; its health (faults, quarantine), the secrets
    /// hidden from it (shared with the forks sessions keep) and the rest carry over.
    pub fn moved_to(&self, fresh: &Adapter) -> Arc<Self> {
        Self::with_state(fresh, self, (self.kv.clone(), fresh.clients))
    }

    /// Takes up the counts (faults, busy and too heavy calls, dropped log lines and
    /// observed calls) of `old`, the adapter this one replaces for its server; its
    /// quarantine only when this is the same code with the same `adapter_config` and
    /// limits (a [`Self::renewed`] one, taken up as the reload is put in place, so that a
    /// quarantine begun since it was made is not lost): new code or settings may be what
    /// fixed it.
    pub fn count_on_from(&self, old: &Adapter) {
        let (faults, busy, too_heavy, quarantined_until) = {
            let h = old.health.locked();
            (h.total_faults, h.busy, h.too_heavy, h.quarantined_until)
        };
        {
            let mut h = self.health.locked();
            h.total_faults += faults;
            h.busy += busy;
            h.too_heavy += too_heavy;
            if self.digest == old.digest && self.config == old.config && self.same_runtime(old) {
                h.quarantined_until = h.quarantined_until.max(quarantined_until);
            }
        }
        let relaxed = std::sync::atomic::Ordering::Relaxed;
        self.lane.dropped.fetch_add(old.lane.dropped.load(relaxed), relaxed);
        self.log.dropped.fetch_add(old.log.dropped.load(relaxed), relaxed);
    }

    /// Logs steps of this adapter's plans that the gateway refused, each kind at most
    /// once a minute (they are counted in full in the metrics).
    pub fn report_denied(&self, denied: &[Denied]) {
        let now = Instant::now();
        let mut health = self.health.locked();
        let logged = &mut health.denials_logged;
        for d in denied {
            let due = logged.get(&d.denial).is_none_or(|at| now.duration_since(*at) >= DENIAL_LOG_EVERY);
            if due {
                logged.insert(d.denial, now);
                let target = crate::text::shown(&d.target, 200);
                tracing::warn!(adapter = %self.name, server = %self.server, denial = d.denial.as_str(), "refused a step of the adapter's plan ({target}): {}", d.denial.explain());
            }
        }
    }

    /// What the adapter may ask the engine for, as it declared: its own server's tools,
    /// and the tools and restarts it named; and the tools it observes.
    pub fn declared(&self) -> AdapterGrant {
        let mut grant = AdapterGrant::own(&self.server);
        grant.tools.extend(self.info.needs.tools.iter().cloned());
        grant.restart = self.info.needs.restart;
        grant.observes.clone_from(&self.info.needs.observes);
        grant
    }

    pub fn health(&self) -> HealthReport {
        let h = self.health.locked();
        HealthReport {
            name: self.name.to_string(),
            version: self.info.version.clone(),
            faults: h.total_faults,
            quarantined_for_ms: h
                .quarantined_until
                .and_then(|u| u.checked_duration_since(Instant::now()))
                .map(|d| d.as_millis() as u64),
            last_fault: h.last_fault.clone(),
            last_output: h.last_output.clone(),
            log_lines_dropped: self.log.dropped.load(std::sync::atomic::Ordering::Relaxed),
            observe_dropped: self.lane.dropped.load(std::sync::atomic::Ordering::Relaxed),
            busy: h.busy,
            too_heavy: h.too_heavy,
        }
    }

    fn quarantined(&self) -> bool {
        let mut h = self.health.locked();
        match h.quarantined_until {
            Some(until) if Instant::now() < until => true,
            Some(_) => {
                tracing::info!(adapter = %self.name, server = %self.server, "quarantine over; the adapter is used again");
                h.quarantined_until = None;
                h.faults.clear();
                false
            }
            None => false,
        }
    }

    /// A fault in `what`, `message` in the host's words, with what the adapter printed.
    fn fault(&self, what: &str, message: String, printed: Option<String>) {
        let mut h = self.health.locked();
        let now = Instant::now();
        h.total_faults += 1;
        let quarantine = h.faults.reached(now.into(), FAULT_WINDOW, FAULT_LIMIT);
        let output = printed.as_deref().unwrap_or("(none)");
        tracing::error!(adapter = %self.name, server = %self.server, "adapter fault in {what}: {message}; its output: {output}; the built-in classifier is used instead");
        h.last_fault = Some(capped(&format!("{what}: {message}"), 500));
        h.last_output = printed.map(|p| capped(&p, 500));
        if quarantine {
            h.quarantined_until = Some(now + QUARANTINE);
            tracing::error!(adapter = %self.name, server = %self.server, "adapter quarantined for {} s after {} faults", QUARANTINE.as_secs(), h.faults.len());
        }
    }

    /// The most a call may weigh once read ([`crate::weight`]) to be shown to the adapter.
    fn heaviest(&self) -> usize {
        self.runtime.limits.memory / SHOWN_OF_MEMORY
    }

    /// Counts a call not shown to the adapter because it weighs more than [`Self::heaviest`].
    fn not_shown(&self, what: &str, weight: Option<usize>) {
        self.health.locked().too_heavy += 1;
        let weight = weight.map_or_else(String::new, |w| format!(" {w} bytes"));
        tracing::debug!(adapter = %self.name, server = %self.server, "{what}: not asked: the call would weigh{weight} once read, more than a quarter of the adapter's memory");
    }

    /// Runs `request` in a fresh instance, within the runtime's limits. Any fault (trap,
    /// deadline, limit, panic, a broken contract) is logged with the plugin's output,
    /// counted, and answered with `None`.
    async fn call(&self, what: &'static str, request: Request) -> Option<Reply> {
        self.call_by(what, request, std::time::Instant::now() + self.runtime.limits.timeout).await
    }

    /// [`Self::call`], everything (its share of the pool, an instance, the run) by `end`.
    async fn call_by(&self, what: &'static str, request: Request, end: std::time::Instant) -> Option<Reply> {
        if self.quarantined() {
            return None;
        }
        // What a client or a server sent may take more than the adapter's memory once the
        // adapter reads it: a call it could not hold is not its fault, nor shown to it.
        // (An observed call was weighed before it was copied; redacting a secret can make
        // it heavier since.)
        let weight = request.weight();
        if weight > self.heaviest() {
            self.not_shown(what, Some(weight));
            return None;
        }
        let output = CappedPipe::new(OUTPUT_CAP);
        let state = State::new(
            self.name.clone(),
            self.server.clone(),
            self.config.clone(),
            self.kv_for(&request),
            self.log.clone(),
            output.clone(),
            self.runtime.limits.memory,
        );
        let Ok(Ok(mine)) = tokio::time::timeout_at(end.into(), self.room.share.clone().acquire_owned()).await else {
            self.health.locked().busy += 1;
            tracing::debug!(adapter = %self.name, server = %self.server, "{what}: every instance it may hold is busy");
            return None;
        };
        // What it waited for its share was for its own calls (and its copies'): not an excuse.
        let result = self.runtime.invoke_by(&self.pre, state, request, (end, Duration::ZERO), (mine, &self.room)).await;
        let printed = output.text();
        match result {
            Ok(reply) => {
                // Within the adapter's log budget, as its `host.log` lines are.
                if !printed.is_empty() && tracing::enabled!(tracing::Level::DEBUG) && self.log.take() {
                    tracing::debug!(adapter = %self.name, server = %self.server, "adapter output: {printed}");
                }
                Some(reply)
            }
            Err(Fault::Busy) => {
                self.health.locked().busy += 1;
                tracing::debug!(adapter = %self.name, server = %self.server, "{what}: the instance pool was busy past most of its deadline");
                None
            }
            Err(Fault::Failed(why)) => {
                self.fault(what, why, Some(printed).filter(|p| !p.is_empty()));
                None
            }
        }
    }

    /// The store as `request` may use it: an adapter of a server that answers many
    /// clients classifies and plans one client's failed call with a store it can read
    /// (what `observe` kept of the calls it was granted, and `declare`) but not write, so
    /// that nothing of that call outlives it to reach another client.
    fn kv_for(&self, request: &Request) -> Kv {
        match (self.clients, request) {
            (super::Clients::Many, Request::Classify(..) | Request::Plan(..)) => self.kv.read_only(),
            _ => self.kv.clone(),
        }
    }

    /// Asks the adapter to refine `builtin`, as the engine does through [`Advisor`].
    pub async fn classify(&self, failure: &FailureContext<'_>, builtin: &Classification) -> Option<Classification> {
        let request = Request::Classify(to_failure(failure, &self.secrets()), to_class(builtin));
        self.classified(request, builtin.kind).await
    }

    async fn classified(&self, request: Request, kind: Kind) -> Option<Classification> {
        let end = self.after_what_came_before().await;
        let Some(Reply::Classify(refined)) = self.call_by("classify", request, end).await else { return None };
        match check_class(refined?) {
            // Its words may reach the client as they are (a note on the tool's own error):
            // redacted here, once, whoever shows them, as everything it is shown was.
            Ok(c) => Some(self.redacted(from_class(c, kind))),
            Err(why) => {
                self.fault("classify", why, None);
                None
            }
        }
    }

    /// `class` with the adapter's own words (its message, a category of its own)
    /// redacted: it may know a secret (a key in its configuration, one it stored before
    /// a reload made it secret).
    fn redacted(&self, mut class: Classification) -> Classification {
        let secrets = self.secrets();
        if let Some(message) = &mut class.message {
            *message = secrets.redact(message).into_owned();
        }
        if let Category::Other(name) = &mut class.category {
            *name = secrets.redact(name).into_owned();
        }
        class
    }

    /// Asks the adapter for a plan; one over the size limits is a fault (the built-in
    /// plan applies).
    async fn planned(&self, request: Request) -> Option<Advice> {
        let end = self.after_what_came_before().await;
        let Some(Reply::Plan(steps)) = self.call_by("plan", request, end).await else { return None };
        let steps = steps?;
        let checked = check_plan(&steps)
            .and_then(|weight| Ok((weight, steps.into_iter().map(from_step).collect::<Result<_, _>>()?)));
        let (weight, steps) = match checked {
            Ok(checked) => checked,
            Err(why) => {
                self.fault("plan", why, None);
                return None;
            }
        };
        let Some(held) = HeldPlan::take(&self.room.planned, weight) else {
            self.health.locked().too_heavy += 1;
            tracing::debug!(adapter = %self.name, server = %self.server, "plan: not taken: the plans its calls in flight run weigh {MAX_PLANS_HELD} bytes or more already");
            return None;
        };
        Some(Advice { steps, held: Some(Box::new(held)) })
    }

    /// Waits until the successful calls before this moment have been observed, and
    /// returns the deadline of the adapter call that follows: one adapter deadline for
    /// the wait and the call together.
    async fn after_what_came_before(&self) -> std::time::Instant {
        let end = std::time::Instant::now() + self.runtime.limits.timeout;
        self.lane.flush_until(end.into()).await;
        end
    }

    /// A successful call, as the adapter is shown it: redacted.
    fn completed(&self, tool: &str, arguments: Option<&JsonObject>, result: &CallToolResult) -> wit::CompletedCall {
        let secrets = self.secrets();
        wit::CompletedCall {
            server: self.server.to_string(),
            tool: tool.to_owned(),
            arguments: clean_json(&secrets, arguments.map(|a| serde_json::Value::Object(a.clone()))),
            call_result: clean_json(&secrets, serde_json::to_value(result).ok()),
        }
    }
}

/// The adapters of all servers: the engine's [`Advisor`].
#[derive(Default, Clone)]
pub struct Adapters {
    by_server: HashMap<Arc<str>, Arc<Adapter>>,
}

impl Adapters {
    pub fn insert(&mut self, server: &str, adapter: Arc<Adapter>) {
        self.by_server.insert(server.into(), adapter);
    }

    pub fn get(&self, server: &str) -> Option<&Arc<Adapter>> {
        self.by_server.get(server)
    }

    pub fn is_empty(&self) -> bool {
        self.by_server.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&Arc<str>, &Arc<Adapter>)> {
        self.by_server.iter()
    }

    /// Forks of `servers`' adapters, for server instances of their own (state of their
    /// own).
    pub fn forks<'a>(&self, servers: impl IntoIterator<Item = &'a str>) -> HashMap<Arc<str>, Arc<Adapter>> {
        servers.into_iter().filter_map(|name| Some((Arc::from(name), self.by_server.get(name)?.fork()))).collect()
    }

    /// These adapters with `forks` in place of theirs for those servers.
    pub fn overlay(&self, forks: &HashMap<Arc<str>, Arc<Adapter>>) -> Self {
        let mut by_server = self.by_server.clone();
        by_server.extend(forks.iter().map(|(k, v)| (k.clone(), v.clone())));
        Self { by_server }
    }
}

impl Advisor for Adapters {
    fn classify(
        &self,
        failure: &FailureContext<'_>,
        builtin: &Classification,
    ) -> BoxFuture<'static, Option<Classification>> {
        let Some(a) = self.by_server.get(failure.server).cloned() else { return Box::pin(async { None }) };
        let request = Request::Classify(to_failure(failure, &a.secrets()), to_class(builtin));
        let kind = builtin.kind;
        Box::pin(async move { a.classified(request, kind).await })
    }

    fn plan(&self, failure: &FailureContext<'_>, class: &Classification) -> BoxFuture<'static, Option<Advice>> {
        let Some(a) = self.by_server.get(failure.server).cloned() else { return Box::pin(async { None }) };
        let request = Request::Plan(to_failure(failure, &a.secrets()), to_class(class));
        Box::pin(async move { a.planned(request).await })
    }

    fn observe(&self, call: &Completed<'_>) -> BoxFuture<'static, ()> {
        let Completed { server, tool, arguments, result, .. } = *call;
        // An adapter that does not observe this tool costs a successful call nothing; one
        // that does sees it after the client has its answer.
        // Nor does one quarantined, one whose queue has no room for it, or one that could
        // not hold it: all found before the call is copied for it.
        let Some(a) = self.by_server.get(server).filter(|a| a.info.needs.observes(tool) && !a.quarantined()) else {
            return Box::pin(async {});
        };
        match a.lane.admits(arguments, result, a.heaviest()) {
            Admission::Fits => a.lane.push(a, a.completed(tool, arguments, result)),
            Admission::TooHeavy => a.not_shown("observe", None),
            Admission::NoRoom => {}
        }
        Box::pin(async {})
    }
}

/// The most steps a plan may have.
pub const MAX_PLAN_STEPS: usize = 64;
/// The most bytes of text a plan may carry in all.
pub const MAX_PLAN_BYTES: usize = 1 << 20;
/// The most bytes in one string of a plan or classification.
pub const MAX_STRING_BYTES: usize = 64 << 10;
/// The most a plan's arguments may weigh once read ([`crate::weight`]): 1 MiB of text
/// may be half a million values, some 64 MiB once read, kept while the plan runs.
pub const MAX_PLAN_WEIGHT: usize = 4 << 20;
/// The most bytes in an adapter's own category name (`other(...)`).
pub const MAX_CATEGORY_BYTES: usize = 256;

/// The most the plans of one adapter's calls in flight may weigh together, for all the
/// servers it serves: a plan weighs up to [`MAX_PLAN_WEIGHT`], and is kept while its call
/// runs it; without a bound, thousands of failing calls at once would hold gigabytes.
pub const MAX_PLANS_HELD: usize = 64 << 20;

/// A plan's weight against its adapter's [`MAX_PLANS_HELD`], until the plan has run.
struct HeldPlan {
    planned: Arc<std::sync::atomic::AtomicUsize>,
    weight: usize,
}

impl HeldPlan {
    /// `weight` more held in `planned`, if that stays within [`MAX_PLANS_HELD`].
    fn take(planned: &Arc<std::sync::atomic::AtomicUsize>, weight: usize) -> Option<Self> {
        use std::sync::atomic::Ordering::AcqRel;
        let room = |held: usize| held.checked_add(weight).filter(|&total| total <= MAX_PLANS_HELD);
        planned.fetch_update(AcqRel, std::sync::atomic::Ordering::Acquire, room).ok()?;
        Some(Self { planned: planned.clone(), weight })
    }
}

impl Drop for HeldPlan {
    fn drop(&mut self) {
        self.planned.fetch_sub(self.weight, std::sync::atomic::Ordering::AcqRel);
    }
}

/// Whether a plan is within the size limits, and what it weighs once read (its texts, and
/// its arguments as JSON values), or why not.
fn check_plan(steps: &[wit::Step]) -> Result<usize, String> {
    if steps.len() > MAX_PLAN_STEPS {
        return Err(format!("its plan has {} steps, more than {MAX_PLAN_STEPS}", steps.len()));
    }
    let (mut total, mut weight) = (0usize, 0usize);
    for step in steps {
        if let wit::Step::SideCall(wit::ToolCall { arguments, .. })
        | wit::Step::Alternative(wit::Alternative { arguments, .. }) = step
        {
            weight = weight.saturating_add(crate::weight::json(arguments.as_bytes()));
        }
        let texts: Vec<&str> = match step {
            wit::Step::Retry(_) | wit::Step::Restart => vec![],
            wit::Step::SideCall(c) => vec![&c.tool, &c.arguments],
            wit::Step::Alternative(a) => vec![a.server.as_deref().unwrap_or(""), &a.tool, &a.arguments],
            wit::Step::GiveUp(text) => vec![text],
        };
        for t in texts {
            if t.len() > MAX_STRING_BYTES {
                return Err(format!("its plan has a string of {} bytes, more than {MAX_STRING_BYTES}", t.len()));
            }
            total += t.len();
        }
    }
    if total > MAX_PLAN_BYTES {
        return Err(format!("its plan carries {total} bytes of text, more than {MAX_PLAN_BYTES}"));
    }
    if weight > MAX_PLAN_WEIGHT {
        return Err(format!("its plan's arguments weigh {weight} bytes once read, more than {MAX_PLAN_WEIGHT}"));
    }
    Ok(weight.saturating_add(total))
}

/// Whether a classification is within the size limits, or why not.
fn check_class(c: wit::Classification) -> Result<wit::Classification, String> {
    let message = c.message.as_deref().map_or(0, str::len);
    let category = match &c.category {
        wit::Category::Other(s) => s.len(),
        _ => 0,
    };
    if message > MAX_STRING_BYTES || category > MAX_CATEGORY_BYTES {
        return Err(format!(
            "its classification's text is too long ({message} bytes of message, {category} of category name; at most {MAX_STRING_BYTES} and {MAX_CATEGORY_BYTES})"
        ));
    }
    Ok(c)
}

/// `value` as JSON text, redacted value by value before it is written, so that a secret
/// with a quote or a backslash in it cannot slip through as its escaped form. `{}` for
/// none.
fn clean_json(secrets: &Secrets, value: Option<serde_json::Value>) -> String {
    let Some(mut value) = value else { return "{}".to_owned() };
    secrets.redact_json(&mut value);
    // Redacting text can still join pieces around a secret: redact the text as well.
    secrets.redact(&value.to_string()).into_owned()
}

/// The failure as an adapter sees it: every text redacted first.
fn to_failure(f: &FailureContext<'_>, secrets: &Secrets) -> wit::Failure {
    let clean = |t: &str| secrets.redact(t).into_owned();
    let outcome = match f.failure {
        Failure::Rpc { code, message, data } => wit::Outcome::Rpc(wit::RpcError {
            code: *code,
            message: clean(message),
            data: data.as_ref().map(|d| clean_json(secrets, Some(d.clone()))),
        }),
        Failure::ToolError { .. } => wit::Outcome::ToolError(clean(&f.failure.message())),
        Failure::Timeout { .. } => wit::Outcome::Timeout,
        Failure::ConnectionLost { reason, .. } => wit::Outcome::ConnectionLost(clean(reason)),
        Failure::Unavailable { .. } | Failure::SendFailed { .. } | Failure::CircuitOpen { .. } => {
            wit::Outcome::NotDelivered(clean(&f.failure.message()))
        }
        Failure::HttpStatus { .. }
        | Failure::Protocol { .. }
        | Failure::Cancelled
        | Failure::Unanswered { .. }
        | Failure::Internal { .. }
        | Failure::GatewayLimit { .. } => wit::Outcome::Other(clean(&f.failure.message())),
    };
    wit::Failure {
        server: f.server.to_owned(),
        tool: f.tool.to_owned(),
        arguments: clean_json(secrets, f.arguments.map(|a| serde_json::Value::Object(a.clone()))),
        attempt: f.attempt,
        elapsed_ms: f.elapsed.as_millis() as u64,
        outcome,
    }
}

fn to_class(c: &Classification) -> wit::Classification {
    use wit::Category as W;
    let category = match &c.category {
        Category::Connection => W::Connection,
        Category::Transport => W::Transport,
        Category::Timeout => W::Timeout,
        Category::Protocol => W::Protocol,
        Category::Initialization => W::Initialization,
        Category::Capability => W::Capability,
        Category::ToolNotFound => W::ToolNotFound,
        Category::ToolExecution => W::ToolExecution,
        Category::ToolValidation => W::ToolValidation,
        Category::Configuration => W::Configuration,
        Category::Discovery => W::Discovery,
        Category::ServerUnavailable => W::ServerUnavailable,
        Category::CircuitOpen => W::CircuitOpen,
        Category::RateLimit => W::RateLimit,
        Category::Cancelled => W::Cancelled,
        Category::Other(s) => W::Other(s.clone()),
    };
    wit::Classification {
        category,
        retryable: c.retryable,
        retry_after_ms: c.retry_after.map(|d| d.as_millis() as u64),
        counts_for_breaker: c.counts_for_breaker,
        not_delivered: c.not_delivered,
        severity: match c.severity {
            Severity::Low => wit::Severity::Low,
            Severity::Medium => wit::Severity::Medium,
            Severity::High => wit::Severity::High,
            Severity::Critical => wit::Severity::Critical,
        },
        message: c.message.clone(),
    }
}

fn from_class(c: wit::Classification, kind: crate::recovery::classify::Kind) -> Classification {
    use wit::Category as W;
    let category = match c.category {
        W::Connection => Category::Connection,
        W::Transport => Category::Transport,
        W::Timeout => Category::Timeout,
        W::Protocol => Category::Protocol,
        W::Initialization => Category::Initialization,
        W::Capability => Category::Capability,
        W::ToolNotFound => Category::ToolNotFound,
        W::ToolExecution => Category::ToolExecution,
        W::ToolValidation => Category::ToolValidation,
        W::Configuration => Category::Configuration,
        W::Discovery => Category::Discovery,
        W::ServerUnavailable => Category::ServerUnavailable,
        W::CircuitOpen => Category::CircuitOpen,
        W::RateLimit => Category::RateLimit,
        W::Cancelled => Category::Cancelled,
        W::Other(s) => Category::Other(s),
    };
    Classification {
        category,
        retryable: c.retryable,
        retry_after: c.retry_after_ms.map(Duration::from_millis),
        counts_for_breaker: c.counts_for_breaker,
        severity: match c.severity {
            wit::Severity::Low => Severity::Low,
            wit::Severity::Medium => Severity::Medium,
            wit::Severity::High => Severity::High,
            wit::Severity::Critical => Severity::Critical,
        },
        kind,
        not_delivered: c.not_delivered,
        message: c.message,
    }
}

/// A plan step from the plugin; one whose arguments are not a JSON object breaks the
/// contract (the whole plan is a fault, so that a plan of such steps on every call is
/// quarantined like any other fault, not logged without end).
fn from_step(step: wit::Step) -> Result<Step, String> {
    let object = |text: &str, what: &str| -> Result<JsonObject, String> {
        match serde_json::from_str::<serde_json::Value>(text) {
            Ok(serde_json::Value::Object(o)) => Ok(o),
            // Not naming the tool: the name is the adapter's, which may quote a client's
            // call, and a fault's words reach every client (`rebound_status`).
            _ => Err(format!("its plan's arguments for a {what} are not a JSON object")),
        }
    };
    Ok(match step {
        wit::Step::Retry(ms) => Step::Retry(ms.map(Duration::from_millis)),
        wit::Step::SideCall(c) => Step::SideCall { arguments: object(&c.arguments, "side call")?, tool: c.tool },
        wit::Step::Alternative(alt) => Step::Alternative {
            arguments: Some(object(&alt.arguments, "alternative")?),
            server: alt.server,
            tool: alt.tool,
        },
        wit::Step::Restart => Step::Restart,
        wit::Step::GiveUp(action) => Step::GiveUp(action),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plans one adapter's calls in flight run weigh at most [`MAX_PLANS_HELD`]
    /// together: one past it is not taken, and a plan that has run gives its weight back.
    #[test]
    fn plans_held_at_once_are_bounded_and_given_back_once_run() {
        let planned = Arc::default();
        let big = HeldPlan::take(&planned, MAX_PLANS_HELD - 10).unwrap();
        assert!(HeldPlan::take(&planned, 11).is_none(), "past the bound");
        let small = HeldPlan::take(&planned, 10).unwrap();
        drop(big);
        assert!(HeldPlan::take(&planned, MAX_PLANS_HELD - 10).is_some(), "room again once the big one ran");
        drop(small);
        assert_eq!(planned.load(std::sync::atomic::Ordering::Acquire), 0);
        assert!(HeldPlan::take(&planned, usize::MAX).is_none(), "no overflow");
    }

    fn give_up(bytes: usize) -> wit::Step {
        wit::Step::GiveUp("x".repeat(bytes))
    }

    #[test]
    fn plans_past_their_limits_are_refused() {
        assert!(check_plan(&vec![wit::Step::Restart; MAX_PLAN_STEPS]).is_ok());
        assert!(check_plan(&vec![wit::Step::Restart; MAX_PLAN_STEPS + 1]).unwrap_err().contains("65 steps"));
        assert!(check_plan(&[give_up(MAX_STRING_BYTES)]).is_ok());
        assert!(check_plan(&[give_up(MAX_STRING_BYTES + 1)]).unwrap_err().contains("a string of"));
        let heavy: Vec<_> = (0..17).map(|_| give_up(MAX_STRING_BYTES - 1)).collect();
        assert!(check_plan(&heavy).unwrap_err().contains("bytes of text"));
        let side = wit::Step::SideCall(wit::ToolCall { tool: "t".into(), arguments: "a".repeat(MAX_STRING_BYTES + 1) });
        assert!(check_plan(&[side]).is_err(), "arguments count too");
        // Within the text's bounds, but half a million values once read.
        let zeros = |n: usize| format!("{{\"a\":[{}0]}}", "0,".repeat(n));
        let side = |arguments: String| wit::Step::SideCall(wit::ToolCall { tool: "t".into(), arguments });
        let many: Vec<_> = (0..16).map(|_| side(zeros(30_000))).collect();
        assert!(check_plan(&many).unwrap_err().contains("weigh"), "many values");
        assert!(check_plan(&[side(zeros(1000))]).is_ok());
    }

    #[test]
    fn a_step_whose_arguments_are_no_json_object_breaks_the_contract() {
        let side =
            |arguments: &str| wit::Step::SideCall(wit::ToolCall { tool: "t".into(), arguments: arguments.into() });
        assert!(matches!(from_step(side(r#"{"q": 1}"#)), Ok(Step::SideCall { .. })));
        for bad in ["[1]", "not json", "\"text\""] {
            assert!(from_step(side(bad)).unwrap_err().contains("not a JSON object"), "{bad}");
        }
        let alternative = wit::Alternative { server: None, tool: "u".into(), arguments: "7".into() };
        assert!(from_step(wit::Step::Alternative(alternative)).is_err());
    }

    #[test]
    fn classifications_past_their_limits_are_refused() {
        let class = |category, message: Option<String>| wit::Classification {
            category,
            retryable: false,
            retry_after_ms: None,
            counts_for_breaker: false,
            not_delivered: false,
            severity: wit::Severity::Low,
            message,
        };
        assert!(check_class(class(wit::Category::Timeout, Some("m".repeat(MAX_STRING_BYTES)))).is_ok());
        assert!(check_class(class(wit::Category::Timeout, Some("m".repeat(MAX_STRING_BYTES + 1)))).is_err());
        assert!(check_class(class(wit::Category::Other("c".repeat(MAX_CATEGORY_BYTES)), None)).is_ok());
        assert!(check_class(class(wit::Category::Other("c".repeat(MAX_CATEGORY_BYTES + 1)), None)).is_err());
    }
}
