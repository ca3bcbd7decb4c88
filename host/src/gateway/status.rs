//! The gateway's own surface for agents and operators: the tools `rebound_status` and
//! `rebound_reset_breaker`, and the resources `rebound://status` and `rebound://errors`.
//! `rebound.gateway_tools: false` switches them off.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use rmcp::model::{CallToolResult, ContentBlock, JsonObject, Resource, ResourceContents, Tool, ToolAnnotations};
use serde_json::{Value, json};

use super::downstreams::Front;
use super::hub::Hub;
use super::recent::quantile;
use super::reload::{ReloadOutcome, Reloaded};
use super::session_servers::SessionServers;
use super::setup::Setup;
use super::snapshot::{AdapterSnapshot, Counts, ServerSnapshot, Snapshot};
use crate::config::Scope;
use crate::plugins::Adapters;
use crate::recovery::breaker::levels::troubled;
use crate::recovery::breaker::{Blame, Snapshot as BreakerSnapshot};
use crate::recovery::engine::{Counters, Engine};
use crate::transport::Status;
use crate::transport::supervisor::ServerHandle;

pub const STATUS_TOOL: &str = "rebound_status";
pub const RESET_TOOL: &str = "rebound_reset_breaker";
pub const STATUS_URI: &str = "rebound://status";
pub const ERRORS_URI: &str = "rebound://errors";

fn schema(value: Value) -> Arc<JsonObject> {
    Arc::new(value.as_object().cloned().unwrap_or_default())
}

pub fn tools() -> Vec<Tool> {
    vec![
        Tool::new(STATUS_TOOL, "Rebound gateway: the state of every MCP server behind it (running, restarting, down), its circuit breaker and its call counters. Use it when a tool keeps failing.", schema(json!({"type": "object", "properties": {}})))
            .with_annotations(ToolAnnotations::new().read_only(true).idempotent(true).open_world(false)),
        Tool::new(RESET_TOOL, "Rebound gateway: close a circuit breaker now, so that calls get through again before its open time is up (after you fixed the cause): a server's (and its tools'), or with `tool` one tool's.", schema(json!({"type": "object", "properties": {"server": {"type": "string", "description": "The server's name, as in rebound_status"}, "tool": {"type": "string", "description": "A tool of that server, as the server names it, to reset only that tool's breaker"}}, "required": ["server"]})))
            .with_annotations(ToolAnnotations::new().read_only(false).idempotent(true).destructive(false).open_world(false)),
    ]
}

pub fn resources() -> Vec<Resource> {
    let mut status = Resource::new(STATUS_URI, "rebound-status").with_mime_type("application/json");
    status.description = Some("The state of every server behind the gateway, as JSON".into());
    let mut errors = Resource::new(ERRORS_URI, "rebound-errors").with_mime_type("application/x-ndjson");
    errors.description = Some("The newest entries of the gateway's errors log, as JSON lines".into());
    vec![status, errors]
}

/// Who reads the status.
pub enum Reader<'a> {
    /// A client, through `rebound_status` or `rebound://status`: a `scope: session`
    /// server is its own instance of it (how other sessions' fare is theirs alone), and
    /// over HTTP the gateway's files are not shown.
    Client(&'a SessionServers),
    /// The operator (`GET /status`): a `scope: session` server as all its instances.
    Operator,
}

/// Everything `rebound_status` reports to the client of `own`. Server `env` and
/// `headers` never appear here, not even inside a server's own error text; nor does what
/// an adapter printed, which may quote any client's call (the operator's `GET /status`
/// has it).
pub fn status(hub: &Hub, own: &SessionServers) -> Value {
    let mut status = full_status(hub, &Reader::Client(own));
    without_adapter_output(&mut status);
    if hub.downstreams.front() != Front::Stdio {
        without_plugins_dir(&mut status, &hub.setup().config.settings.plugins_dir);
    }
    hub.errors.secrets().redact_json(&mut status);
    status
}

/// `status` without where the gateway keeps its plugins: over HTTP the clients are not
/// the operator (see `errors_log`), and an adapter that failed to load is named by its
/// file's name alone.
fn without_plugins_dir(status: &mut Value, plugins_dir: &std::path::Path) {
    let dir = format!("{}/", plugins_dir.display().to_string().trim_end_matches('/'));
    for server in status["servers"].as_array_mut().into_iter().flatten() {
        if let Some(Value::String(error)) = server.get_mut("adapter_error") {
            *error = error.replace(&dir, "");
        }
    }
}

/// `status` without what adapters printed.
fn without_adapter_output(status: &mut Value) {
    for server in status["servers"].as_array_mut().into_iter().flatten() {
        if let Some(adapter) = server["adapter"].as_object_mut() {
            adapter.remove("last_output");
        }
    }
}

/// [`status`] as `reader` sees it, and what adapters printed, not yet redacted (what is
/// looked up by a server's name must be looked up before its name may read `[redacted]`).
fn full_status(hub: &Hub, reader: &Reader<'_>) -> Value {
    let setup = hub.setup();
    let own = match reader {
        Reader::Client(own) => Some((*own, own.recovery())),
        Reader::Operator => None,
    };
    let servers: Vec<Value> = setup
        .config
        .servers
        .values()
        .filter_map(|server| {
            let name = server.name.as_str();
            // A client's own instance first, as its calls go (a reload may have made the
            // server shared since its session started).
            if let Some((own, recovery)) = &own
                && let Some(handle) = own.instance(name)
            {
                let mut entry = instance_status(&setup, recovery.engine(), recovery.adapters(), &handle);
                only_its_name_and_quarantine(&mut entry["adapter"]);
                return Some(entry);
            }
            match (setup.servers.get(name), &own) {
                (Some(handle), Some((own, _))) => {
                    let mut entry = instance_status(&setup, &setup.engine, &setup.plugins.adapters, handle);
                    own_breakers(&mut entry, &setup, name, own);
                    if hub.downstreams.front() == Front::Http {
                        only_its_name_and_quarantine(&mut entry["adapter"]);
                    }
                    Some(entry)
                }
                (Some(handle), None) => {
                    let mut entry = instance_status(&setup, &setup.engine, &setup.plugins.adapters, handle);
                    if let Some(policy) = setup.engine.policy(name) {
                        entry["clients_shed"] = json!(policy.breakers.clients_shed());
                    }
                    Some(entry)
                }
                (None, _) if server.scope != Scope::Session => None,
                (None, Some(_)) => Some(json!({"name": name, "scope": "session", "status": "not started"})),
                (None, None) => Some(session_status(hub, &setup, name)),
            }
        })
        .collect();
    let mut gateway = json!({"version": env!("CARGO_PKG_VERSION")});
    // Over HTTP the clients are not the operator: where the gateway writes its errors
    // log, and how many entries it dropped, are the operator's to know.
    if own.is_none() || hub.downstreams.front() == Front::Stdio {
        gateway["errors_log"] = json!(hub.errors.path());
        gateway["errors_dropped"] = json!(hub.errors.dropped());
        if let Some(reloaded) = hub.last_reload().get() {
            gateway["last_reload"] = reload_json(&reloaded);
        }
    }
    json!({"gateway": gateway, "servers": servers})
}

/// A reload's outcome: when, and what changed or why it was refused.
fn reload_json(reloaded: &Reloaded) -> Value {
    let at = humantime::format_rfc3339_millis(reloaded.at).to_string();
    match &reloaded.outcome {
        ReloadOutcome::Applied { changes, warnings } if warnings.is_empty() => json!({"at": at, "applied": changes}),
        ReloadOutcome::Applied { changes, warnings } => json!({"at": at, "applied": changes, "warnings": warnings}),
        ReloadOutcome::Refused(why) => json!({"at": at, "refused": why}),
    }
}

/// The breakers of one client's own calls to a shared server (made on its first failure
/// there) that are not closed and clean: of the server (`own_breaker`) and of its tools
/// (`own_tool_breakers`, by name), in `entry`.
fn own_breakers(entry: &mut Value, setup: &Setup, server: &str, own: &SessionServers) {
    let (Some(Blame::Client(culprit)), Some(policy)) = (own.blamed.get(), setup.engine.policy(server)) else { return };
    let key = culprit.own;
    if let Some(snapshot) = policy.breakers.own(key).map(|b| b.snapshot()).filter(troubled) {
        entry["own_breaker"] = breaker_json(&snapshot);
    }
    let tools = policy.breakers.own_tools(key);
    if !tools.is_empty() {
        let tools = tools.iter().map(|(t, s)| (t.clone(), breaker_json(s))).collect();
        entry["own_tool_breakers"] = Value::Object(tools);
    }
}

/// Of an adapter that serves other clients too, what a client may be shown: a session's
/// own instance's adapter shares one health with its copies in other sessions, and over
/// HTTP a shared server's adapter is every client's. Its health (faults, the last of them
/// with the figures the adapter chose, lines and calls dropped, how busy it was) tells
/// of other clients' calls, and an adapter could write in it, as counts, what it was
/// shown of them, for another client to read. Its name and version, and whether it is
/// quarantined (which holds for this client's calls too), are kept; the operator's
/// `GET /status` has the rest.
fn only_its_name_and_quarantine(adapter: &mut Value) {
    if let Some(health) = adapter.as_object_mut() {
        health.retain(|k, _| matches!(k.as_str(), "name" | "version" | "quarantined_for_ms"));
    }
}

/// One server instance (a shared server's, or a session's own), with the breakers,
/// budget, counters and adapter of `engine` and `adapters`.
fn instance_status(setup: &Setup, engine: &Engine, adapters: &Adapters, handle: &ServerHandle) -> Value {
    let state = handle.state();
    let tools = state.session.as_ref().map_or(0, |s| s.listing().tools.len());
    let scope = if handle.config.scope == Scope::Session { "session" } else { "shared" };
    let mut entry = json!({
        "name": &*handle.name,
        "scope": scope,
        "status": state.status.as_str(),
        "restarts": state.restarts,
        "last_error": state.last_error.as_deref().map(capped),
        "tools": tools,
        // The revision its current connection negotiated (2026-07-28, 2025-11-25, ...).
        "protocol": state.session.as_ref().and_then(|s| s.info.as_ref()).map(|i| i.protocol_version.to_string()),
        "adapter": adapters.get(&handle.name).map(|a| serde_json::to_value(a.health()).unwrap_or_default()),
    });
    if let Some((_, name, e)) = setup.plugins.failures.iter().find(|(s, _, _)| s.as_str() == &*handle.name) {
        entry["adapter_error"] = json!(format!("{name}: {e}"));
    }
    if let Some(policy) = engine.policy(&handle.name) {
        entry["breaker"] = breaker_json(&policy.breakers.server.snapshot());
        let tools: serde_json::Map<String, Value> =
            policy.breakers.tools.troubled().iter().map(|(t, s)| (t.clone(), breaker_json(s))).collect();
        entry["tool_breakers"] = Value::Object(tools);
        entry["counters"] = counters_json(&policy.counters);
        entry["retry_budget"] = json!(policy.budget.tokens());
    }
    entry
}

/// A `scope: session` server, for the operator: how many sessions run an instance of
/// it, how many of those are ready, their restarts, and the counters all of them add to.
fn session_status(hub: &Hub, setup: &Setup, name: &str) -> Value {
    let instances = hub.instances_of(name);
    let states: Vec<_> = instances.iter().map(|h| h.state()).collect();
    let ready = states.iter().filter(|s| s.status == Status::Ready).count();
    let failing = states.iter().filter(|s| matches!(s.status, Status::Restarting | Status::Down)).count();
    let mut entry = json!({
        "name": name,
        "scope": "session",
        "status": "per-session",
        "instances": instances.len(),
        "instances_ready": ready,
        // Crashed and restarting, or down after a crash loop.
        "instances_failing": failing,
        // Not their errors: each is one session's (its own calls' are in its errors log).
        "restarts": states.iter().map(|s| s.restarts).sum::<u32>(),
        "tools": states.iter().find_map(|s| s.session.as_ref()).map_or(0, |s| s.listing().tools.len()),
    });
    if let Some(policy) = setup.engine.policy(name) {
        entry["counters"] = counters_json(&policy.counters);
    }
    // Every session's copy shares its health.
    if let Some(adapter) = setup.plugins.adapters.get(name) {
        entry["adapter"] = serde_json::to_value(adapter.health()).unwrap_or_default();
    }
    entry
}

fn counters_json(c: &Counters) -> Value {
    json!({
        "calls": c.calls.load(Ordering::Relaxed),
        "attempts": c.attempts.load(Ordering::Relaxed),
        "failures": c.failures.load(Ordering::Relaxed),
        "retries": c.retries.load(Ordering::Relaxed),
        "recovered": c.recovered.load(Ordering::Relaxed),
        "fallbacks": c.fallbacks.load(Ordering::Relaxed),
        "shed_by_breaker": c.shed.load(Ordering::Relaxed),
        "adapter_steps_denied": c.denied.iter().map(|d| d.load(Ordering::Relaxed)).sum::<u64>(),
    })
}

/// The version of `GET /status`'s document: raised when a field changes meaning or goes
/// away (new fields may appear within a version).
pub const STATUS_SCHEMA: u32 = 1;

/// Errors-log entries in the status document.
const RECENT_ERRORS: usize = 20;

/// `GET /status`: everything `rebound_status` reports, and for the status page and
/// `rebound status --url` each server's health (`green`, `amber`, `red`), its last
/// calls and their latency, and the newest errors-log entries; for `operators` alone
/// (no client may read it), what adapters printed when they faulted.
pub fn document(hub: &Hub, operators: bool) -> Value {
    let setup = hub.setup();
    let mut doc = full_status(hub, &Reader::Operator);
    if !operators {
        without_adapter_output(&mut doc);
    }
    doc["schema"] = json!(STATUS_SCHEMA);
    // Draining for a shutdown: not ready, as `/readyz` says.
    let shutting_down = hub.closing().is_cancelled();
    doc["gateway"]["ready"] = json!(hub.starting(&setup).is_empty() && !shutting_down);
    if shutting_down {
        doc["gateway"]["shutting_down"] = json!(true);
    }
    // Read before a name or a state may read `[redacted]`; cut after redaction, so that
    // no cut leaves the start of a secret.
    for server in doc["servers"].as_array_mut().into_iter().flatten() {
        let calls = hub.metrics.recent.of(server["name"].as_str().unwrap_or_default());
        server["health"] = json!(health(server));
        server["latency_ms"] = json!({"p50": quantile(&calls, 0.5), "p99": quantile(&calls, 0.99)});
        server["recent_calls"] = json!(calls);
    }
    let errors = hub.errors.recent();
    let mut recent = json!(errors[errors.len().saturating_sub(RECENT_ERRORS)..]);
    let secrets = hub.errors.secrets();
    secrets.redact_json(&mut doc);
    secrets.redact_json(&mut recent);
    for server in doc["servers"].as_array_mut().into_iter().flatten() {
        cap(&mut server["last_error"]);
    }
    if let Some(refused) = doc.pointer_mut("/gateway/last_reload/refused") {
        cap(refused);
    }
    for entry in recent.as_array_mut().into_iter().flatten() {
        cap(&mut entry["message"]);
    }
    doc["recent_errors"] = recent;
    doc
}

/// The most bytes of one cell of `rebound status`'s table shown.
const MAX_CELL: usize = 1024;

/// The status document as a table for a terminal (`rebound status --url`).
pub fn table(doc: &Value) -> String {
    let ms = |v: &Value| v.as_f64().map_or_else(|| "-".to_owned(), |v| format!("{v:.1}ms"));
    let mut rows = vec![
        ["SERVER", "HEALTH", "STATUS", "BREAKER", "RESTARTS", "CALLS", "FAILED", "RECOVERED", "P50", "P99", "ADAPTER"]
            .map(str::to_owned),
    ];
    for s in doc["servers"].as_array().into_iter().flatten() {
        let c = &s["counters"];
        let adapter = match &s["adapter"] {
            Value::Null => "built-in".to_owned(),
            a if a["quarantined_for_ms"].is_u64() => format!("{} (quarantined)", a["name"].as_str().unwrap_or("?")),
            a => format!("{} ({} faults)", a["name"].as_str().unwrap_or("?"), a["faults"]),
        };
        let text = |v: &Value| match v {
            Value::Null => "-".to_owned(),
            v => v.as_str().map_or_else(|| v.to_string(), str::to_owned),
        };
        rows.push([
            text(&s["name"]),
            text(&s["health"]),
            text(&s["status"]),
            text(&s["breaker"]["state"]),
            text(&s["restarts"]),
            text(&c["calls"]),
            text(&c["failures"]),
            text(&c["recovered"]),
            ms(&s["latency_ms"]["p50"]),
            ms(&s["latency_ms"]["p99"]),
            adapter,
        ]);
    }
    // The document is a server's (names, adapter names): no escape sequence, nor a
    // character that reorders text, reaches the operator's terminal.
    for cell in rows.iter_mut().flatten() {
        *cell = crate::text::shown(cell, MAX_CELL);
    }
    let widths: Vec<usize> =
        (0..rows[0].len()).map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for row in &rows {
        let cells: Vec<String> = row.iter().zip(&widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    let errors = doc["recent_errors"].as_array().map_or(0, Vec::len);
    let g = &doc["gateway"];
    let safe = |text: &str| crate::text::shown(text, MAX_CELL);
    let state = match (g["ready"].as_bool(), g["shutting_down"].as_bool()) {
        (_, Some(true)) => "shutting down",
        (Some(true), _) => "ready",
        _ => "starting",
    };
    out.push_str(&format!(
        "rebound {} ({state}), status schema {}; {errors} recent errors-log entries (--json shows them)\n",
        safe(g["version"].as_str().unwrap_or("?")),
        doc["schema"],
    ));
    if let Some(dropped) = g["errors_dropped"].as_u64().filter(|d| *d > 0) {
        out.push_str(&format!("{dropped} errors-log entries dropped\n"));
    }
    let reload = &g["last_reload"];
    let at = safe(reload["at"].as_str().unwrap_or("?"));
    if let Some(why) = reload["refused"].as_str() {
        out.push_str(&format!(
            "last reload, at {at}: REFUSED, the running configuration keeps serving: {}\n",
            safe(why)
        ));
    } else if let Some(changes) = reload["applied"].as_str() {
        out.push_str(&format!("last reload, at {at}: {}\n", safe(changes)));
        for warning in reload["warnings"].as_array().into_iter().flatten().filter_map(Value::as_str) {
            out.push_str(&format!("  warning: {}\n", safe(warning)));
        }
    }
    out
}

/// A text of the status cut to 2 KiB: a server's error text can be as long as any
/// message it sends, and the page reads the document every second.
const TEXT_MAX: usize = 2 << 10;

fn cap(value: &mut Value) {
    if let Value::String(s) = value {
        *s = capped(s);
    }
}

fn capped(text: &str) -> String {
    crate::text::capped(text, TEXT_MAX)
}

/// A server's health at a glance: `red` when it cannot serve now (crashed and restarting,
/// down, stopped, its breaker open); `amber` when it serves with trouble, or not yet
/// (its first start, its breaker probing, a tool's breaker not closed, its adapter
/// quarantined); else `green`. How its calls went is in its chart, not its color.
fn health(server: &Value) -> &'static str {
    let status = server["status"].as_str().unwrap_or_default();
    let breaker = server["breaker"]["state"].as_str().unwrap_or("closed");
    // A `scope: session` server: red when every instance is failing, amber when one is
    // or one is not ready yet.
    let count = |key: &str| server[key].as_u64().unwrap_or(0);
    let (instances, ready, failing) = (count("instances"), count("instances_ready"), count("instances_failing"));
    if matches!(status, "restarting" | "down" | "stopped") || breaker == "open" || (failing > 0 && failing == instances)
    {
        return "red";
    }
    if status == "per-session" && (failing > 0 || ready < instances) {
        return "amber";
    }
    let tools_troubled = server["tool_breakers"]
        .as_object()
        .is_some_and(|t| t.values().any(|b| b["state"].as_str().is_some_and(|s| s != "closed")));
    let quarantined = server["adapter"]["quarantined_for_ms"].is_u64();
    if !matches!(status, "ready" | "per-session") || breaker != "closed" || tools_troubled || quarantined {
        return "amber";
    }
    "green"
}

fn breaker_json(b: &BreakerSnapshot) -> Value {
    json!({
        "state": b.state,
        "consecutive_failures": b.consecutive_failures,
        "openings": b.openings,
        "retry_in_ms": b.retry_in.map(|d| d.as_millis() as u64),
        "window_calls": b.window_calls,
        "window_failures": b.window_failures,
    })
}

/// Answers a call of one of the gateway's own tools, or `None` if `name` is not one.
/// `recovery` is the calling session's: a breaker reset closes the breakers its calls
/// meet, its own for a server of its own (`scope: session`).
pub fn call(hub: &Hub, own: &SessionServers, name: &str, arguments: Option<&JsonObject>) -> Option<CallToolResult> {
    let setup = hub.setup();
    match name {
        STATUS_TOOL => {
            let s = status(hub, own);
            let text = serde_json::to_string_pretty(&s).unwrap_or_default();
            let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
            r.structured_content = Some(s);
            Some(r)
        }
        RESET_TOOL => {
            let arg = |k: &str| arguments.and_then(|a| a.get(k)).and_then(Value::as_str);
            let server = arg("server").unwrap_or_default();
            let recovery = own.recovery();
            let by = Resetter::Client { engine: recovery.engine(), operated: hub.operated() };
            Some(match reset_breakers(&setup, by, server, arg("tool")) {
                Ok(done) => {
                    tracing::info!(server, tool = arg("tool"), "circuit breakers reset by a client");
                    CallToolResult::success(vec![ContentBlock::text(done)])
                }
                Err(why) => CallToolResult::error(vec![ContentBlock::text(why.explain(&setup, server, arg("tool")))]),
            })
        }
        _ => None,
    }
}

/// Why a breaker reset did nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unreset {
    /// No such server is configured.
    NoServer,
    /// The tool has no breaker yet: it has not been called.
    NoBreaker,
    /// Over HTTP, a client asked to reset a shared server's breakers.
    Shared,
    /// The operator asked to reset a `scope: session` server's, which are each session's.
    PerSession,
}

impl Unreset {
    /// What to tell whoever asked.
    pub fn explain(self, setup: &Setup, server: &str, tool: Option<&str>) -> String {
        match self {
            Self::NoServer => {
                let known: Vec<&str> = setup.config.servers.keys().map(|k| &**k).collect();
                format!("no server `{server}`; the servers are: {}", known.join(", "))
            }
            Self::NoBreaker => format!(
                "`{}` on `{server}` has no circuit breaker yet (it has not been called); nothing to reset",
                tool.unwrap_or_default()
            ),
            Self::Shared => format!(
                "`{server}` is shared by every client of this gateway, and so are its circuit breakers: the gateway's operator resets them (POST /reset-breaker?server={server}, with the operator token)"
            ),
            Self::PerSession => format!(
                "`{server}` has an instance per client session, each with its own breakers: a client resets its own with the `{RESET_TOOL}` tool"
            ),
        }
    }
}

/// Who asks for a breaker reset.
pub enum Resetter<'a> {
    /// A client, through `rebound_reset_breaker`: its session's view of the servers
    /// (`engine`), and whether the gateway has an operator apart from its clients
    /// ([`Hub::operated`]).
    Client { engine: &'a crate::recovery::engine::Engine, operated: bool },
    /// The operator, through `POST /reset-breaker`: the shared servers.
    Operator,
}

/// Closes `server`'s breakers as `by` sees them: the server's and its tools', or with
/// `tool` that tool's alone. Says what it did. A shared server's breakers are every
/// client's: one client closing them would send everyone's calls at a server still
/// recovering, so where the gateway has an operator, the operator closes them (without
/// one, whoever holds the clients' token is it). A `scope: session` server's are each
/// session's own, for its client to close.
pub fn reset_breakers(setup: &Setup, by: Resetter<'_>, server: &str, tool: Option<&str>) -> Result<String, Unreset> {
    let shared = setup.servers.contains_key(server);
    let engine = match by {
        Resetter::Client { operated: true, .. } if shared => return Err(Unreset::Shared),
        Resetter::Client { engine, .. } => engine,
        Resetter::Operator if !shared && setup.config.servers.contains_key(server) => {
            return Err(Unreset::PerSession);
        }
        Resetter::Operator => &setup.engine,
    };
    let policy =
        engine.policy(server).filter(|_| setup.config.servers.contains_key(server)).ok_or(Unreset::NoServer)?;
    let Some(tool) = tool else {
        policy.breakers.reset_all();
        return Ok(format!("the circuit breaker of `{server}` is closed, and those of its tools"));
    };
    if !policy.breakers.reset_tool(tool) {
        return Err(Unreset::NoBreaker);
    }
    Ok(format!("the circuit breaker of `{tool}` on `{server}` is closed"))
}

/// Reads one of the gateway's own resources for client session `client`, or `None` if
/// `uri` is not one. The errors log shows a client its own calls' entries only.
pub fn read(hub: &Hub, uri: &str, own: &SessionServers) -> Option<ResourceContents> {
    let text = match uri {
        STATUS_URI => serde_json::to_string_pretty(&status(hub, own)).unwrap_or_default(),
        ERRORS_URI => hub.errors.recent_of(&own.client).iter().map(|e| format!("{e}\n")).collect(),
        _ => return None,
    };
    let mime = if uri == STATUS_URI { "application/json" } else { "application/x-ndjson" };
    Some(ResourceContents::text(text, uri).with_mime_type(mime))
}

/// The gateway's state now, for `/metrics`: every server, shared or `scope: session`.
pub fn snapshot(hub: &Hub) -> Snapshot {
    let setup = hub.setup();
    let servers = setup
        .config
        .servers
        .values()
        .filter_map(|server| {
            let name = server.name.as_str();
            let (instances, shared) = match setup.servers.get(name) {
                Some(handle) => (vec![handle.clone()], true),
                None if server.scope == Scope::Session => (hub.instances_of(name), false),
                None => return None,
            };
            let states: Vec<_> = instances.iter().map(|h| h.state()).collect();
            let policy = setup.engine.policy(name);
            // A session's own server has its own breakers and adapter; the counters of
            // all of its instances add up under its name.
            let own = policy.filter(|_| shared);
            Some(ServerSnapshot {
                name: name.to_owned(),
                statuses: states.iter().map(|s| s.status).collect(),
                breaker: own.map(|p| p.breakers.server.snapshot().state),
                tool_breakers: own
                    .map(|p| p.breakers.tools.troubled().into_iter().map(|(t, s)| (t, s.state)).collect())
                    .unwrap_or_default(),
                clients_shed: own.map(|p| p.breakers.clients_shed()),
                counters: policy.map(|p| counts(&p.counters)).unwrap_or_default(),
                denied: policy
                    .map(|p| std::array::from_fn(|i| p.counters.denied[i].load(Ordering::Relaxed)))
                    .unwrap_or_default(),
                adapter: setup.plugins.adapters.get(name).map(|a| {
                    let h = a.health();
                    AdapterSnapshot { name: h.name, faults: h.faults, quarantined: h.quarantined_for_ms.is_some() }
                }),
            })
        })
        .collect();
    Snapshot { servers, errors_dropped: hub.errors.dropped() }
}

fn counts(c: &Counters) -> Counts {
    let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    Counts {
        attempts: load(&c.attempts),
        retries: load(&c.retries),
        fallbacks: load(&c.fallbacks),
        recovered: load(&c.recovered),
        shed: load(&c.shed),
        failures: load(&c.failures),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An HTTP client's status names a plugin that failed to load by its file's name, not
    /// where the gateway keeps it.
    #[test]
    fn a_clients_status_does_not_say_where_the_plugins_are() {
        let mut status = json!({"servers": [
            {"name": "a", "adapter_error": "x: /srv/rebound/plugins/x.wasm: speaks rebound:adapter@9.0.0"},
            {"name": "b"},
        ]});
        let named = status.clone();
        without_plugins_dir(&mut status, std::path::Path::new("/srv/rebound/plugins"));
        assert_eq!(status["servers"][0]["adapter_error"], "x: x.wasm: speaks rebound:adapter@9.0.0");
        let mut status = named;
        without_plugins_dir(&mut status, std::path::Path::new("/srv/rebound/plugins/"));
        assert_eq!(
            status["servers"][0]["adapter_error"], "x: x.wasm: speaks rebound:adapter@9.0.0",
            "written with a /"
        );
        assert!(status["servers"][1].get("adapter_error").is_none());
    }

    /// Names in the document are a server's and an adapter's words: no escape sequence
    /// in them reaches the operator's terminal.
    #[test]
    fn the_table_prints_no_control_character() {
        let doc = json!({
            "schema": 1,
            "gateway": {"version": "1\u{1b}]0;owned\u{7}", "ready": true},
            "servers": [{"name": "a\u{1b}[2J\u{202e}", "adapter": {"name": "x\u{1b}[31m\u{9b}2J", "faults": 0}, "counters": {}}],
        });
        let table = table(&doc);
        let obeyed = |c: char| (c.is_control() && c != '\n') || ('\u{2028}'..='\u{202e}').contains(&c);
        assert!(!table.chars().any(obeyed), "{table:?}");
        assert!(table.contains(r"a\u{1b}[2J\u{202e}") && table.contains(r"x\u{1b}[31m\u{9b}2J"), "{table}");
    }

    /// Below the servers, the table says what else the operator must know: a drain, dropped
    /// errors-log entries, and the last reload, a refused one loudly (with the reason,
    /// control characters and all neutralised), an applied one with its warnings.
    #[test]
    fn the_table_says_how_the_last_reload_went() {
        let doc = |gateway: Value| {
            let mut doc = json!({"schema": 1, "servers": [{"name": "s", "health": "green", "status": "per-session", "breaker": null, "counters": {}}]});
            doc["gateway"] = gateway;
            table(&doc)
        };
        let refused = doc(json!({"version": "1", "ready": false, "shutting_down": true, "errors_dropped": 3,
            "last_reload": {"at": "2026-11-27T17:00:00.000Z", "refused": "`mcpServers.a`: bad\u{1b}[2J"}}));
        assert!(refused.contains("(shutting down)") && refused.contains("3 errors-log entries dropped"), "{refused}");
        assert!(
            refused.contains("last reload, at 2026-11-27T17:00:00.000Z: REFUSED, the running configuration keeps serving: `mcpServers.a`: bad\\u{1b}[2J"),
            "{refused}"
        );
        let row: Vec<&str> = refused.lines().nth(1).unwrap_or_default().split_whitespace().collect();
        assert_eq!(row[..4], ["s", "green", "per-session", "-"], "{refused}");
        let applied = doc(json!({"version": "1", "ready": true,
            "last_reload": {"at": "t", "applied": "added b", "warnings": ["`x` is ignored"]}}));
        assert!(
            applied.contains("(ready)") && applied.contains("last reload, at t: added b\n  warning: `x` is ignored"),
            "{applied}"
        );
        assert!(!applied.contains("dropped"), "{applied}");
        let starting = doc(json!({"version": "1", "ready": false, "errors_dropped": 0}));
        assert!(
            starting.contains("(starting)") && !starting.contains("dropped") && !starting.contains("reload"),
            "{starting}"
        );
    }

    /// A client is shown of its own instance's adapter nothing its copies in other
    /// sessions share: how they fared tells of those sessions' calls.
    #[test]
    fn a_sessions_adapter_shows_its_client_only_its_name_and_quarantine() {
        let health = crate::plugins::adapter::HealthReport {
            name: "hol4".into(),
            version: "0.1.0".into(),
            faults: 3,
            quarantined_for_ms: Some(500),
            last_fault: Some("trap".into()),
            last_output: Some("another session's call".into()),
            log_lines_dropped: 1,
            observe_dropped: 2,
            busy: 4,
            too_heavy: 5,
        };
        let mut adapter = serde_json::to_value(health).unwrap();
        only_its_name_and_quarantine(&mut adapter);
        assert_eq!(adapter, json!({"name": "hol4", "version": "0.1.0", "quarantined_for_ms": 500}));
        let mut none = Value::Null;
        only_its_name_and_quarantine(&mut none);
        assert_eq!(none, Value::Null);
    }
}
