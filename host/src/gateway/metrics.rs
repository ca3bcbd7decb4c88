//! `/metrics`, in Prometheus' text format. Calls are counted as they end (outcome,
//! latency, failures by category); everything that is state — server status, breakers,
//! the engine's counters, plugin faults — is read from the hub at scrape time, so the two
//! can never disagree with `rebound_status`.

use std::time::Duration;

use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::snapshot::Snapshot;
use crate::lasting::Locked;
use crate::recovery::engine::{Denial, Ending, Record};
use crate::transport::Status;

#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
enum Outcome {
    /// Answered on the first attempt.
    ok,
    /// Answered after a failure: a retry or an alternative worked.
    recovered,
    /// The tool's own error (`isError`), passed on.
    tool_error,
    /// Nothing worked; the client got Rebound's report.
    gave_up,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Self::ok => "ok",
            Self::recovered => "recovered",
            Self::tool_error => "tool_error",
            Self::gave_up => "gave_up",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    server: String,
    tool: String,
    outcome: Outcome,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServerLabel {
    server: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FailureLabels {
    server: String,
    category: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabels {
    server: String,
    status: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AdapterLabels {
    server: String,
    adapter: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabels {
    server: String,
    tool: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeniedLabels {
    server: String,
    kind: String,
}

type Histograms = Family<ServerLabel, Histogram, fn() -> Histogram>;

/// What is counted as calls end.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    calls: Family<CallLabels, Counter>,
    failures: Family<FailureLabels, Counter>,
    latency: Histograms,
    http_rejected: Family<RejectLabels, Counter>,
    reloads: Family<ReloadLabels, Counter>,
    /// Counted as they happen, not read from the instances: a relaunched server, or a
    /// session's own that ended, takes its restarts with it.
    restarts: Family<ServerLabel, Counter>,
    /// The tool names each server's calls are counted under.
    tools: ToolNames,
    /// The last calls of each server, for the status page.
    pub recent: super::recent::RecentCalls,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RejectLabels {
    reason: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabels {
    result: String,
}

impl Default for Metrics {
    fn default() -> Self {
        let calls = Family::<CallLabels, Counter>::default();
        let failures = Family::<FailureLabels, Counter>::default();
        // 1 ms to about 35 min: past the default deadline of a tool given minutes.
        let latency: Histograms = Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.001, 2.0, 22)));
        let http_rejected = Family::<RejectLabels, Counter>::default();
        let mut registry = Registry::with_prefix("rebound");
        registry.register("calls", "Tool calls by how they ended", calls.clone());
        registry.register("attempt_failures", "Failed attempts by failure category", failures.clone());
        registry.register("call_duration_seconds", "Time from a client's tool call to its answer", latency.clone());
        registry.register("http_rejected", "HTTP requests refused before reaching MCP", http_rejected.clone());
        let reloads = Family::<ReloadLabels, Counter>::default();
        registry.register("config_reloads", "Configuration reloads, applied or refused", reloads.clone());
        let restarts = Family::<ServerLabel, Counter>::default();
        registry.register("server_restarts", "Restarts after a crash or on request", restarts.clone());
        let (tools, recent) = Default::default();
        Self { registry, calls, failures, latency, http_rejected, reloads, restarts, tools, recent }
    }
}

impl Metrics {
    /// Counts one client call, as the engine recorded it.
    pub fn observe(&self, record: &Record, ending: &Ending, took: Duration) {
        let outcome = match ending {
            Ending::GaveUp => Outcome::gave_up,
            _ if ending.is_tool_error() => Outcome::tool_error,
            Ending::Answered(_) if record.recovered() => Outcome::recovered,
            Ending::Answered(_) => Outcome::ok,
        };
        let server = record.server.to_string();
        let tool = self.tools.label(&server, &record.tool);
        self.calls.get_or_create(&CallLabels { server: server.clone(), tool, outcome }).inc();
        for (attempt, _, class) in record.failures() {
            let labels = FailureLabels { server: attempt.server.to_string(), category: class.category.label().into() };
            self.failures.get_or_create(&labels).inc();
        }
        self.recent.push(&server, took, outcome.as_str());
        self.latency.get_or_create(&ServerLabel { server }).observe(took.as_secs_f64());
    }

    /// Counts an HTTP request refused for `reason` (`unauthorized`, `host`, `origin`,
    /// `too_many_requests`, `malformed`, `duplicate_id`, and for what a body weighs once
    /// read: `too_many_values`, `too_much_in_flight`, `gateway_full`).
    pub fn rejected(&self, reason: &str) {
        self.http_rejected.get_or_create(&RejectLabels { reason: reason.to_owned() }).inc();
    }

    /// Counts a configuration reload (`applied` or `refused`).
    pub fn reloaded(&self, result: &str) {
        self.reloads.get_or_create(&ReloadLabels { result: result.to_owned() }).inc();
    }

    /// Counts `count` restarts of an instance of `server`.
    pub fn restarted(&self, server: &str, count: u32) {
        self.restarts.get_or_create(&ServerLabel { server: server.to_owned() }).inc_by(u64::from(count));
    }

    /// The whole exposition: the counted metrics, then the gateway's state as it is now.
    pub fn render(&self, now: &Snapshot) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = encode_registry(&mut out, &self.registry);
        let _ = encode_registry(&mut out, &state_registry(now));
        let _ = encode_eof(&mut out);
        out
    }
}

/// The most tool names one server's calls are counted under; the calls of any other
/// are counted as tool [`OTHER_TOOLS`]. A server's names come from it (and change with
/// its `list_changed`): a server that renames its tools does not grow `/metrics` for ever.
pub const MAX_TOOL_LABELS: usize = 256;

/// The label of the tools past [`MAX_TOOL_LABELS`]: parenthesised, which no tool name is
/// (MCP names are letters, digits, `_`, `-`, `.` and `/`), so that a tool called `other`
/// keeps its own count.
pub const OTHER_TOOLS: &str = "(other)";

/// Each server's tool names seen so far, as label values.
#[derive(Debug, Default)]
struct ToolNames {
    seen: std::sync::Mutex<std::collections::HashMap<String, std::collections::HashSet<String>>>,
}

impl ToolNames {
    /// `tool`'s label among `server`'s: its own name, or [`OTHER_TOOLS`] past [`MAX_TOOL_LABELS`].
    fn label(&self, server: &str, tool: &str) -> String {
        let name = label(tool);
        let mut seen = self.seen.locked();
        let names = seen.entry(server.to_owned()).or_default();
        if names.contains(&name) || names.len() < MAX_TOOL_LABELS && names.insert(name.clone()) {
            name
        } else {
            OTHER_TOOLS.to_owned()
        }
    }
}

/// The longest tool name a label shows whole; a longer one is cut, and told apart from
/// the others cut there by a hash of it all.
const MAX_LABEL: usize = 128;

/// A tool name as a label value. prometheus-client writes label values as they are, and
/// tool names come from the servers: a quote or a line break would break the exposition.
/// Parentheses go too, so that no server's tool is labelled [`OTHER_TOOLS`]. A server's
/// name can be of any length, and its labels are kept for good and written on every
/// scrape: past [`MAX_LABEL`] bytes, it is cut.
fn label(name: &str) -> String {
    use std::hash::{Hash, Hasher};
    let kept = |c: char| !matches!(c, '"' | '\\' | '(' | ')') && !c.is_control();
    let head = &name[..name.floor_char_boundary(MAX_LABEL)];
    let mut label: String = head.chars().map(|c| if kept(c) { c } else { '_' }).collect();
    if head.len() < name.len() {
        // Fixed keys: the same name has the same label for as long as the gateway runs.
        let mut hash = std::hash::DefaultHasher::new();
        name.hash(&mut hash);
        label.push_str(&format!("…{:016x}", hash.finish()));
    }
    label
}

fn breaker_value(state: &str) -> i64 {
    match state {
        "closed" => 0,
        "half-open" => 1,
        _ => 2,
    }
}

/// A registry filled from the gateway's state at one moment.
fn state_registry(now: &Snapshot) -> Registry {
    let mut registry = Registry::with_prefix("rebound");
    let status = Family::<StatusLabels, Gauge>::default();
    let (breaker, clients_shed) = (Family::<ServerLabel, Gauge>::default(), Family::<ServerLabel, Gauge>::default());
    let tool_breaker = Family::<ToolLabels, Gauge>::default();
    let denied = Family::<DeniedLabels, Counter>::default();
    let engine: [(&str, &str, Family<ServerLabel, Counter>); 6] = [
        ("attempts", "Upstream attempts, retries and alternatives included", Family::default()),
        ("retries", "Retries of a failed attempt", Family::default()),
        ("fallbacks", "Alternative tools tried, counted on the alternative's server", Family::default()),
        ("recovered_calls", "Calls answered after a failure", Family::default()),
        ("shed_by_breaker", "Attempts refused by an open circuit breaker", Family::default()),
        ("upstream_failures", "Failed upstream attempts", Family::default()),
    ];
    let faults = Family::<AdapterLabels, Counter>::default();
    let quarantined = Family::<AdapterLabels, Gauge>::default();
    for s in &now.servers {
        let server = ServerLabel { server: s.name.clone() };
        for each in [Status::Starting, Status::Ready, Status::Restarting, Status::Down, Status::Stopped] {
            let labels = StatusLabels { server: s.name.clone(), status: each.as_str().into() };
            let instances = s.statuses.iter().filter(|st| **st == each).count();
            status.get_or_create(&labels).set(i64::try_from(instances).unwrap_or(i64::MAX));
        }
        if let Some(state) = s.breaker {
            breaker.get_or_create(&server).set(breaker_value(state));
        }
        if let Some(n) = s.clients_shed {
            clients_shed.get_or_create(&server).set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        for (tool, state) in &s.tool_breakers {
            let labels = ToolLabels { server: s.name.clone(), tool: label(tool) };
            tool_breaker.get_or_create(&labels).set(breaker_value(state));
        }
        for (denial, count) in Denial::ALL.iter().zip(s.denied) {
            let labels = DeniedLabels { server: s.name.clone(), kind: denial.as_str().into() };
            denied.get_or_create(&labels).inc_by(count);
        }
        let c = s.counters;
        let values = [c.attempts, c.retries, c.fallbacks, c.recovered, c.shed, c.failures];
        for ((_, _, family), value) in engine.iter().zip(values) {
            family.get_or_create(&server).inc_by(value);
        }
        if let Some(a) = &s.adapter {
            let labels = AdapterLabels { server: s.name.clone(), adapter: label(&a.name) };
            faults.get_or_create(&labels).inc_by(a.faults);
            quarantined.get_or_create(&labels).set(i64::from(a.quarantined));
        }
    }
    registry.register(
        "server_status",
        "1 for the status each server is in now (a scope: session server: its instances in each)",
        status,
    );
    registry.register("breaker_state", "Circuit breaker per server: 0 closed, 1 half-open, 2 open", breaker);
    registry.register(
        "clients_shed",
        "Clients of a shared server whose calls breakers of their own shed now (only their calls failed)",
        clients_shed,
    );
    registry.register(
        "tool_breaker_state",
        "Circuit breaker per tool, for tools with recent failures: 0 closed, 1 half-open, 2 open",
        tool_breaker,
    );
    registry.register("plugin_denied", "Steps of adapters' plans refused, by reason", denied);
    for (name, help, family) in engine {
        registry.register(name, help, family);
    }
    registry.register("plugin_faults", "Adapter calls that trapped, looped or broke the contract", faults);
    registry.register("plugin_quarantined", "1 while an adapter is quarantined", quarantined);
    let dropped = Counter::<u64>::default();
    dropped.inc_by(now.errors_dropped);
    registry.register("errors_log_dropped", "Errors log entries not written", dropped);
    registry
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_servers_tool_names_are_labels_up_to_a_bound() {
        let tools = super::ToolNames::default();
        for i in 0..super::MAX_TOOL_LABELS {
            assert_eq!(tools.label("a", &format!("t{i}")), format!("t{i}"));
        }
        assert_eq!(tools.label("a", "renamed"), super::OTHER_TOOLS);
        assert_eq!(tools.label("a", "(other)"), super::OTHER_TOOLS, "a server naming one so gets no label of its own");
        assert_eq!(tools.label("a", "t7"), "t7", "a name seen keeps its label");
        assert_eq!(tools.label("b", "renamed"), "renamed", "each server has its own");
        assert_eq!(tools.label("b", "other"), "other", "a tool called `other` is not the rest");
        assert_eq!(tools.label("b", "(other)"), "_other_");
    }

    #[test]
    fn label_values_cannot_break_the_exposition() {
        assert_eq!(super::label("lean_goal"), "lean_goal");
        assert_eq!(super::label("evil\"} 1\nfake{x=\"1"), "evil_} 1_fake{x=_1");
    }

    /// A server's 256 KiB tool names would be kept as labels for good, and written on
    /// every scrape: cut, each still its own.
    #[test]
    fn long_tool_names_are_cut_and_told_apart() {
        let (a, b) = (format!("{}a", "x".repeat(256 << 10)), format!("{}b", "x".repeat(256 << 10)));
        let (la, lb) = (super::label(&a), super::label(&b));
        assert!(la.len() <= super::MAX_LABEL + 24, "{} bytes", la.len());
        assert!(la.starts_with(&"x".repeat(super::MAX_LABEL)));
        assert_ne!(la, lb, "two names cut at the same place keep labels of their own");
        assert_eq!(la, super::label(&a), "the same name, the same label");
        let exactly = "y".repeat(super::MAX_LABEL);
        assert_eq!(super::label(&exactly), exactly, "a name up to the bound is shown whole");
    }
}
