//! Running adapters: every call in a fresh instance on a blocking thread, under the
//! runtime's limits; faults contained and counted, and a plugin that keeps faulting
//! quarantined. [`Adapters`] is the recovery engine's [`Advisor`].

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use rmcp::model::{CallToolResult, JsonObject};
use wasmtime::Store;

use super::bindings::v0_1::{self, exports::rebound::adapter::adapter::Guest, rebound::adapter::types as wit};
use super::load::{Info, Loaded};
use super::runtime::Runtime;
use super::state::{CappedPipe, Kv, State};
use crate::recovery::Failure;
use crate::recovery::classify::{Category, Classification, Severity};
use crate::recovery::engine::{Denial, Denied};
use crate::recovery::plan::{Advisor, FailureContext, Step};

/// Faults within [`FAULT_WINDOW`] that quarantine a plugin.
const FAULT_LIMIT: usize = 3;
const FAULT_WINDOW: Duration = Duration::from_secs(60);
const QUARANTINE: Duration = Duration::from_secs(300);
/// Output kept from one call, for the log.
const OUTPUT_CAP: usize = 4 << 10;

/// One adapter serving one server.
pub struct Adapter {
    runtime: Arc<Runtime>,
    pre: v0_1::PluginPre<State>,
    pub info: Info,
    pub name: Arc<str>,
    server: Arc<str>,
    config: Arc<str>,
    kv: Kv,
    health: Mutex<Health>,
    /// When each kind of refused step was last logged.
    denials_logged: Mutex<HashMap<Denial, Instant>>,
}

/// Refused steps of one kind are logged at most this often per adapter.
const DENIAL_LOG_EVERY: Duration = Duration::from_secs(60);

#[derive(Debug, Default)]
struct Health {
    faults: VecDeque<Instant>,
    total_faults: u64,
    quarantined_until: Option<Instant>,
    last_fault: Option<String>,
}

/// An adapter's health, for `rebound_status`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct HealthReport {
    pub name: String,
    pub version: String,
    pub faults: u64,
    pub quarantined_for_ms: Option<u64>,
    pub last_fault: Option<String>,
}

impl Adapter {
    pub fn new(
        runtime: Arc<Runtime>,
        loaded: &Loaded,
        name: &str,
        server: &str,
        config: &serde_json::Value,
    ) -> Arc<Self> {
        Arc::new(Self {
            runtime,
            pre: loaded.pre.clone(),
            info: loaded.info.clone(),
            name: name.into(),
            server: server.into(),
            config: config.to_string().into(),
            kv: Kv::default(),
            health: Mutex::default(),
            denials_logged: Mutex::default(),
        })
    }

    /// Logs steps of this adapter's plans that the gateway refused, each kind at most
    /// once a minute (they are counted in full in the metrics).
    pub fn report_denied(&self, denied: &[Denied]) {
        let now = Instant::now();
        let mut logged = self.denials_logged.lock().expect("not poisoned");
        for d in denied {
            let due = logged.get(&d.denial).is_none_or(|at| now.duration_since(*at) >= DENIAL_LOG_EVERY);
            if due {
                logged.insert(d.denial, now);
                let target = cap_text(&d.target, 200);
                tracing::warn!(adapter = %self.name, server = %self.server, denial = d.denial.as_str(), "refused a step of the adapter's plan ({target}): {}", d.denial.explain());
            }
        }
    }

    pub fn health(&self) -> HealthReport {
        let h = self.health.lock().expect("not poisoned");
        HealthReport {
            name: self.name.to_string(),
            version: self.info.version.clone(),
            faults: h.total_faults,
            quarantined_for_ms: h
                .quarantined_until
                .and_then(|u| u.checked_duration_since(Instant::now()))
                .map(|d| d.as_millis() as u64),
            last_fault: h.last_fault.clone(),
        }
    }

    fn quarantined(&self) -> bool {
        let mut h = self.health.lock().expect("not poisoned");
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

    fn fault(&self, what: &str, message: String) {
        let mut h = self.health.lock().expect("not poisoned");
        let now = Instant::now();
        h.total_faults += 1;
        h.faults.push_back(now);
        while h.faults.front().is_some_and(|t| now.duration_since(*t) > FAULT_WINDOW) {
            h.faults.pop_front();
        }
        tracing::error!(adapter = %self.name, server = %self.server, "adapter fault in {what}: {message}; the built-in classifier is used instead");
        h.last_fault = Some(cap_text(&format!("{what}: {message}"), 500));
        if h.faults.len() >= FAULT_LIMIT {
            h.quarantined_until = Some(now + QUARANTINE);
            tracing::error!(adapter = %self.name, server = %self.server, "adapter quarantined for {} s after {} faults", QUARANTINE.as_secs(), h.faults.len());
        }
    }

    /// Runs `f` in a fresh instance on a blocking thread. Any fault (trap, deadline,
    /// limit, panic) is logged with the plugin's output and answered with `None`.
    async fn call<R: Send + 'static>(
        self: &Arc<Self>,
        what: &'static str,
        f: impl FnOnce(&Guest, &mut Store<State>) -> wasmtime::Result<R> + Send + 'static,
    ) -> Option<R> {
        if self.quarantined() {
            return None;
        }
        let me = self.clone();
        match tokio::task::spawn_blocking(move || me.call_blocking(f)).await {
            Ok(Ok(r)) => Some(r),
            Ok(Err(message)) => {
                self.fault(what, message);
                None
            }
            Err(e) => {
                self.fault(what, format!("the host thread failed: {e}"));
                None
            }
        }
    }

    fn call_blocking<R>(&self, f: impl FnOnce(&Guest, &mut Store<State>) -> wasmtime::Result<R>) -> Result<R, String> {
        let output = CappedPipe::new(OUTPUT_CAP);
        let state = State::new(
            self.name.clone(),
            self.server.clone(),
            self.config.clone(),
            self.kv.clone(),
            output.clone(),
            self.runtime.limits.memory,
        );
        let mut store = Store::new(&self.runtime.engine, state);
        store.limiter(|s| &mut s.limits);
        let _running = self.runtime.running();
        store.set_epoch_deadline(self.runtime.deadline_ticks());
        let result =
            self.pre.instantiate(&mut store).and_then(|plugin| f(plugin.rebound_adapter_adapter(), &mut store));
        let printed = output.text();
        match result {
            Ok(r) => {
                if !printed.is_empty() {
                    tracing::debug!(adapter = %self.name, server = %self.server, "adapter output: {printed}");
                }
                Ok(r)
            }
            Err(e) => {
                let why = match e.downcast_ref::<wasmtime::Trap>() {
                    Some(wasmtime::Trap::Interrupt) => {
                        format!("it ran past its {} ms deadline", self.runtime.limits.timeout.as_millis())
                    }
                    Some(trap) => format!("it trapped ({trap})"),
                    None => format!("{e:#}"),
                };
                let printed = if printed.is_empty() { "(none)".to_owned() } else { printed };
                Err(format!("{why}; its output: {printed}"))
            }
        }
    }
}

/// The adapters of all servers: the engine's [`Advisor`].
#[derive(Default)]
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
}

impl Adapter {
    /// Asks the adapter to classify, on the calling thread (never a runtime worker: WASI
    /// blocks). Faults are counted as for any call. For benchmarks and tools; the
    /// gateway goes through [`Advisor`].
    pub fn classify_now(&self, failure: &FailureContext<'_>, builtin: &Classification) -> Option<Classification> {
        let (f, b, kind) = (to_failure(failure), to_class(builtin), builtin.kind);
        match self.call_blocking(move |g, s| g.call_classify(s, &f, &b)) {
            Ok(c) => c.map(|c| from_class(c, kind)),
            Err(message) => {
                self.fault("classify", message);
                None
            }
        }
    }
}

impl Advisor for Adapters {
    fn classify(
        &self,
        failure: &FailureContext<'_>,
        builtin: &Classification,
    ) -> BoxFuture<'static, Option<Classification>> {
        let Some(a) = self.by_server.get(failure.server).cloned() else { return Box::pin(async { None }) };
        let (f, b, kind) = (to_failure(failure), to_class(builtin), builtin.kind);
        Box::pin(async move {
            let refined = a.call("classify", move |g, s| g.call_classify(s, &f, &b)).await.flatten()?;
            Some(from_class(refined, kind))
        })
    }

    fn plan(&self, failure: &FailureContext<'_>, class: &Classification) -> BoxFuture<'static, Option<Vec<Step>>> {
        let Some(a) = self.by_server.get(failure.server).cloned() else { return Box::pin(async { None }) };
        let (f, c) = (to_failure(failure), to_class(class));
        Box::pin(async move {
            let steps = a.call("plan", move |g, s| g.call_plan(s, &f, &c)).await.flatten()?;
            Some(steps.into_iter().filter_map(|s| from_step(&a, s)).collect())
        })
    }

    fn observe(
        &self,
        server: &str,
        tool: &str,
        arguments: Option<&JsonObject>,
        result: &CallToolResult,
    ) -> BoxFuture<'static, ()> {
        let Some(a) = self.by_server.get(server).cloned() else { return Box::pin(async {}) };
        let call = wit::CompletedCall {
            server: server.to_owned(),
            tool: tool.to_owned(),
            arguments: json_text(arguments),
            call_result: serde_json::to_string(result).unwrap_or_default(),
        };
        Box::pin(async move {
            a.call("observe", move |g, s| g.call_observe(s, &call)).await;
        })
    }
}

/// `text` cut to at most `max` characters, with an ellipsis when cut.
pub(crate) fn cap_text(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

fn json_text(arguments: Option<&JsonObject>) -> String {
    arguments.map_or_else(|| "{}".to_owned(), |a| serde_json::Value::Object(a.clone()).to_string())
}

fn to_failure(f: &FailureContext<'_>) -> wit::Failure {
    let outcome = match f.failure {
        Failure::Rpc { code, message, data } => wit::Outcome::Rpc(wit::RpcError {
            code: *code,
            message: message.clone(),
            data: data.as_ref().map(|d| d.to_string()),
        }),
        Failure::ToolError { .. } => wit::Outcome::ToolError(f.failure.message()),
        Failure::Timeout { .. } => wit::Outcome::Timeout,
        Failure::ConnectionLost { reason } => wit::Outcome::ConnectionLost(reason.clone()),
        Failure::Unavailable { .. } | Failure::SendFailed { .. } | Failure::CircuitOpen { .. } => {
            wit::Outcome::NotDelivered(f.failure.message())
        }
        Failure::Protocol { .. } | Failure::Cancelled | Failure::Internal { .. } => {
            wit::Outcome::Other(f.failure.message())
        }
    };
    wit::Failure {
        server: f.server.to_owned(),
        tool: f.tool.to_owned(),
        arguments: json_text(f.arguments),
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

/// A plan step from the plugin; one whose arguments are not a JSON object is dropped
/// (and logged): the rest of the plan still runs.
fn from_step(a: &Adapter, step: wit::Step) -> Option<Step> {
    let object = |text: &str, what: &str| -> Option<JsonObject> {
        match serde_json::from_str::<serde_json::Value>(text) {
            Ok(serde_json::Value::Object(o)) => Some(o),
            _ => {
                tracing::warn!(adapter = %a.name, "the plan's {what} arguments are not a JSON object; step skipped");
                None
            }
        }
    };
    Some(match step {
        wit::Step::Retry(ms) => Step::Retry(ms.map(Duration::from_millis)),
        wit::Step::SideCall(c) => Step::SideCall { arguments: object(&c.arguments, &c.tool)?, tool: c.tool },
        wit::Step::Alternative(alt) => Step::Alternative {
            arguments: Some(object(&alt.arguments, &alt.tool)?),
            server: alt.server,
            tool: alt.tool,
        },
        wit::Step::Restart => Step::Restart,
        wit::Step::GiveUp(action) => Step::GiveUp(action),
    })
}
