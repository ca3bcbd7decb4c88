//! A client's tool call: one of the gateway's own, or routed to its server and run
//! through the recovery engine (`Upstreams` is the engine's way upstream: one attempt on
//! the session's instance of a server), then reported, logged, counted; whatever happens
//! on its way, it is answered.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use rmcp::model::{CallToolRequestParams, CallToolResponse, CallToolResult, JsonObject, ResultType, ToolAnnotations};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use tokio_util::sync::CancellationToken;

use super::call::{Attempt, Resume, attempt};
use super::downstreams::Front;
use super::hub::Hub;
use super::server::Gateway;
use super::session_servers::{Recovery, SessionServers};
use super::status;
use crate::lasting::Locked;
use crate::recovery::Failure;
use crate::recovery::breaker::{Blame, Culprit};
use crate::recovery::classify::Classification;
use crate::recovery::engine::{Ending, Record, Role, Unoffered, Upstream};
use crate::recovery::plan::{Advice, Advisor, ArgumentsBy, Completed, FailureContext};
use crate::recovery::report;
use crate::telemetry::{CallTrace, TracedAdvisor};
use crate::transport::ServerHandle;

impl Gateway {
    /// A tool call, the catalogue's or one of the gateway's own, answered whatever
    /// happens on its way.
    pub(super) async fn answer_call(
        &self,
        request: CallToolRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        use futures::FutureExt as _;
        let name = request.name.clone();
        let cancelled = cx.ct.clone();
        // The engine catches a panic inside a call; this catches one anywhere else on the
        // call's path (reporting, logging, metrics), so that no call goes unanswered.
        let answer = std::panic::AssertUnwindSafe(self.call_tool_inner(request, cx)).catch_unwind();
        let logged = |log: fn(&crate::errors_log::ErrorsLog, &str, &str, &str, std::time::SystemTime)| {
            if let Some((route, _)) = self.own.catalogue().tool(&name) {
                log(&self.hub.errors, &self.own.client, &route.server, &route.name, std::time::SystemTime::now());
            }
        };
        let answer = tokio::select! {
            answer = answer => answer,
            () = self.hub.stopping().cancelled() => {
                // A call its client cancelled was not cut short: no one waits for it.
                if !cancelled.is_cancelled() {
                    logged(crate::errors_log::ErrorsLog::cut_short);
                }
                let text = format!(
                    "rebound: the gateway shut down while `{name}` was running; check whether the call took effect, then call it again (the gateway is restarting or gone)"
                );
                return Ok(CallToolResult::error(vec![rmcp::model::ContentBlock::text(text)]).into());
            }
        };
        match answer {
            Ok(answer) => answer,
            Err(_) => {
                tracing::error!(tool = %name, "Rebound failed while answering a call (a bug); the client is told so");
                logged(crate::errors_log::ErrorsLog::failed_internally);
                let text = format!(
                    "rebound: Rebound failed while answering this call of `{name}` (a bug, in its log); check whether the call took effect, then call it again"
                );
                Ok(CallToolResult::error(vec![rmcp::model::ContentBlock::text(text)]).into())
            }
        }
    }

    /// A tool call, routed and run through the recovery engine.
    async fn call_tool_inner(
        &self,
        mut request: CallToolRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        self.attach(&cx);
        if self.hub.setup().config.settings.gateway_tools
            && let Some(result) = status::call(&self.hub, &self.own, &request.name, request.arguments.as_ref())
        {
            return Ok(result.into());
        }
        super::answered::until_cancelled(&cx.ct, self.own.settled()).await?;
        let catalogue = self.own.catalogue();
        let Some((route, tool)) = catalogue.tool(&request.name) else {
            // The one failure that is a protocol error: there is nothing to route to.
            return Err(ErrorData::invalid_params(
                format!("unknown tool `{}`; call tools/list for the tools this gateway offers", request.name),
                None,
            ));
        };
        let recovery = self.own.recovery();
        let trace = start_trace(&cx, &route.name, &self.hub.errors);
        let (mut traced, mut shown) = (None, None);
        let advisor = traced_by(recovery.advisor(), trace.as_ref(), &mut traced);
        let advisor = match advisor {
            Some(inner) if self.hub.downstreams.front() == Front::Http => {
                Some(&*shown.insert(ObservedAsGranted { inner, config: &recovery.setup.config }) as &dyn Advisor)
            }
            advisor => advisor,
        };
        // A 2026-07-28 client calling again with its answers to the server's questions (or
        // the server's state alone): they go to that server's tool, never to an alternative.
        let resume = (request.input_responses.is_some() || request.request_state.is_some())
            .then(|| Resume { answers: request.input_responses.take(), state: request.request_state.take() });
        let upstreams = Upstreams {
            hub: &self.hub,
            own: &self.own,
            recovery: &recovery,
            cx: &cx,
            trace: trace.as_deref(),
            resume: resume.as_ref(),
            failed_on: std::sync::Mutex::default(),
        };
        let started = std::time::Instant::now();
        let (server, name) = (route.server.clone(), route.name.clone());
        let (ending, record) = recovery
            .engine()
            .run(&upstreams, advisor, server, name, tool.annotations.as_ref(), request.arguments)
            .await;
        if let Some(trace) = &trace {
            trace.finish(&record, &ending);
        }
        // A call refused for want of room to hold it was its client's JSON-RPC error: its
        // last attempt, cancelled for it, is no failure to write.
        let refused = cx.extensions.get::<super::held::Bridge>().is_some_and(|b| b.refused_for_room());
        self.account(&recovery, &record, &ending, started.elapsed(), refused);
        Ok(response(ending, &record, &self.hub.errors))
    }

    /// A call ended: the errors log (but for its last failure, when `refused`: see
    /// [`super::held`]), the log, the adapter's refused steps, the metrics.
    fn account(&self, recovery: &Recovery, record: &Record, ending: &Ending, took: Duration, refused: bool) {
        if record.failures().next().is_some() {
            let written = to_write(record, refused);
            self.hub.errors.record_first(record, &self.own.client, recovery.engine().clock().wall(), written);
            if let Some((failure, class)) = record.last_failure() {
                let level = if record.answered_by().is_some() { tracing::Level::INFO } else { class.kind.log_level() };
                // Redacted as it is cut, so that the cut leaves no start of a secret for
                // the log's own redaction to miss.
                let message = self.hub.errors.secrets().redact_capped(&failure.message(), LOGGED_MESSAGE);
                log_at(level, &record.server, &record.tool, class.category.as_str(), &message, record.attempts.len());
            }
        }
        if !record.denied.is_empty()
            && let Some(adapter) = recovery.setup.plugins.adapters.get(&record.server)
        {
            adapter.report_denied(&record.denied);
        }
        self.hub.metrics.observe(record, ending, took);
    }
}

/// `advisor`, its calls recorded in `trace` (the wrapper kept in `slot`) when there is one.
fn traced_by<'a>(
    advisor: Option<&'a dyn Advisor>,
    trace: Option<&Arc<CallTrace>>,
    slot: &'a mut Option<TracedAdvisor<'a>>,
) -> Option<&'a dyn Advisor> {
    match (advisor, trace) {
        (Some(inner), Some(trace)) => Some(&*slot.insert(TracedAdvisor { inner, trace: trace.clone() })),
        (advisor, _) => advisor,
    }
}

/// The trace of a call of `tool` when tracing is on, continuing the client's trace: its
/// HTTP request's `traceparent` header, else its `_meta.traceparent`; its texts without
/// the secrets `errors` hides, as they change.
fn start_trace(
    cx: &RequestContext<RoleServer>,
    tool: &str,
    errors: &crate::errors_log::ErrorsLog,
) -> Option<Arc<CallTrace>> {
    if !crate::telemetry::enabled() {
        return None;
    }
    let header = |name: &str| {
        cx.extensions
            .get::<axum::http::request::Parts>()
            .and_then(|p| p.headers.get(name))
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let meta = |name: &str| cx.meta.get(name).and_then(|v| v.as_str()).map(str::to_owned);
    // Both from the same place: the header's pair, else `_meta`'s.
    let (traceparent, tracestate) = match header("traceparent") {
        Some(tp) => (Some(tp), header("tracestate")),
        None => (meta("traceparent"), meta("tracestate")),
    };
    CallTrace::start(tool, traceparent.as_deref(), tracestate.as_deref(), errors.current_secrets())
}

/// The engine's way upstream for one client request.
struct Upstreams<'a> {
    hub: &'a Arc<Hub>,
    own: &'a Arc<SessionServers>,
    /// The setup and policies the call started with (its engine, its adapters).
    recovery: &'a Recovery,
    cx: &'a RequestContext<RoleServer>,
    trace: Option<&'a CallTrace>,
    /// A 2026-07-28 client's answers, for the tool it called (the primary) alone: only its
    /// answers may be questions for the client (or a task), since a question from an
    /// alternative would come back, answered, to the tool called, which did not ask it.
    resume: Option<&'a Resume>,
    /// The instance and session each server's last failed attempt as the primary ran on:
    /// what a restart its adapter plans is for. Written on failures only (a successful call allocates
    /// nothing here).
    failed_on: std::sync::Mutex<Vec<(Arc<ServerHandle>, u64)>>,
}

impl Upstreams<'_> {
    /// The instance of `server` an attempt goes to now: the current setup's, else (a
    /// server a reload removed, finishing its calls) the one the call started with. A
    /// reload that relaunched the server stops the instance the call started on once
    /// nothing is in flight on it, which is so between two attempts: the next goes to
    /// its successor.
    fn handle(&self, server: &str) -> Option<Arc<ServerHandle>> {
        let current = self.own.server_in(&self.hub.setup(), server);
        current.or_else(|| self.own.server_in(&self.recovery.setup, server))
    }

    /// One attempt of `tool` on `server`'s instance for this session.
    #[allow(clippy::too_many_arguments, reason = "one attempt's worth of context")]
    async fn attempt(
        &self,
        server: &str,
        tool: &str,
        role: Role,
        arguments: Option<JsonObject>,
        timeout: Duration,
        max_total: Duration,
        traceparent: Option<&str>,
    ) -> Result<CallToolResponse, Failure> {
        let started = tokio::time::Instant::now();
        // Waiting for a restart in progress counts against the call's deadline, and ends
        // when the client cancels. An instance a reload replaced meanwhile is not started
        // again: its successor is waited for.
        // Counted as in flight on the instance from the start.
        let track = |instance| self.hub.routing.track_call(instance, &self.own.client, self.cx);
        let ready = tokio::select! {
            ready = self.own.ready(server, || self.handle(server), track, timeout) => ready,
            () = self.cx.ct.cancelled() => return Err(Failure::Cancelled),
        };
        let (handle, call, session) = ready.map_err(|nr| match nr {
            Some(nr) => Failure::Unavailable { status: nr.status, reason: nr.last_error },
            None => Failure::Unavailable {
                status: crate::transport::Status::Stopped,
                reason: Some(format!("no server `{server}`")),
            },
        })?;
        let spent = started.elapsed();
        // The wait for the server took the time the call had left: nothing is sent, so
        // that nothing starts past the call's deadline (and a call that may not be
        // repeated is not reported as one that may have taken effect).
        if spent >= max_total {
            return Err(Failure::Unavailable {
                status: handle.state().status,
                reason: Some("the call's deadline passed while it waited for the server; it was not sent".into()),
            });
        }
        // From the call's policy (a session's own server keeps the configuration its
        // session started with): a reload may have changed it, not the process.
        let recovery = self.recovery.engine().policy(server).map(|p| &p.recovery);
        let how = Attempt {
            traceparent,
            timeout,
            max_total: max_total.saturating_sub(spent).max(Duration::from_millis(1)),
            progress_extends_timeout: recovery.is_none_or(|r| r.progress_extends_timeout),
            ping_within: Duration::from_millis(recovery.map_or(0, |r| r.ping_timeout_ms)),
            called: role == Role::Primary,
            resume: self.resume.filter(|_| role == Role::Primary),
        };
        let outcome = attempt(&self.hub.routing, &handle, &session, tool, arguments, how, self.cx, &call).await;
        // A plan's restart is for the primary's failure (the engine asks for plans on
        // those alone): an alternative's or side call's on the same server is not it.
        if outcome.is_err() && role == Role::Primary {
            self.failed(handle, session.id);
        }
        outcome
    }

    /// Notes that an attempt on `handle` failed in `session`.
    fn failed(&self, handle: Arc<ServerHandle>, session: u64) {
        let mut failed_on = self.failed_on.locked();
        failed_on.retain(|(h, _)| h.name != handle.name);
        failed_on.push((handle, session));
    }

    /// The instance and session `server`'s last failed attempt ran on.
    fn failed_on(&self, server: &str) -> Option<(Arc<ServerHandle>, u64)> {
        let failed_on = self.failed_on.locked();
        failed_on.iter().find(|(h, _)| &*h.name == server).cloned()
    }
}

impl Upstream for Upstreams<'_> {
    fn call(
        &self,
        server: &str,
        tool: &str,
        role: Role,
        arguments: Option<JsonObject>,
        timeout: Duration,
        max_total: Duration,
    ) -> BoxFuture<'_, Result<CallToolResponse, Failure>> {
        let server = server.to_owned();
        let tool = tool.to_owned();
        Box::pin(async move {
            // Every way out of an attempt ends its span, so that the spans match the
            // engine's record of attempts one to one.
            let span = self.trace.and_then(|t| t.attempt(&server, &tool));
            let traceparent = span.as_ref().map(|s| s.traceparent());
            let outcome = self.attempt(&server, &tool, role, arguments, timeout, max_total, traceparent).await;
            if let (Some(trace), Some(span)) = (self.trace, span) {
                trace.attempt_ended(span, outcome.as_ref().err());
            }
            outcome
        })
    }

    fn restart(&self, server: &str, within: Duration) -> BoxFuture<'_, ()> {
        let server = server.to_owned();
        Box::pin(async move {
            let Some(handle) = self.handle(&server) else { return };
            let session = match self.failed_on(&server) {
                // A reload replaced (or removed) the instance the call failed on: the
                // next attempt goes to its successor, which has done nothing wrong, and
                // the old one stops once its calls are done (other clients' calls too).
                Some((failed, _)) if failed.instance != handle.instance || handle.is_retired() => {
                    tracing::info!(
                        server,
                        "not restarted: the instance the call failed on was replaced or removed by a reload"
                    );
                    return;
                }
                Some((_, session)) => session,
                // No attempt of the call reached a process (a breaker shed them, or none
                // was ready): there is none it ran on to restart. (A breaker is open to let
                // the server rest, and the supervisor starts what is not up.)
                None => {
                    tracing::info!(server, "not restarted: the call never reached a process of it");
                    return;
                }
            };
            if let Err(nr) = handle.restart(Some(session), within).await {
                tracing::warn!(server, "restart asked by the adapter did not complete: {:?}", nr.status);
            }
        })
    }

    fn cancellation(&self) -> &CancellationToken {
        &self.cx.ct
    }

    fn alone(&self) -> bool {
        self.resume.is_some()
    }

    /// A shared server over HTTP serves many clients: a failure there is blamed on this
    /// one ([`blame_of`]). A session's own instance serves it alone, as does every server
    /// over stdio.
    fn blame(&self, server: &str) -> Blame {
        let http = self.hub.downstreams.front() == Front::Http;
        if !http || self.own.instance(server).is_some() || self.handle(server).is_none() {
            return Blame::Server;
        }
        let blamed = self.own.blamed.get().copied();
        // A 2026-07-28 client has no session: by the address of its request.
        blamed.unwrap_or_else(|| blame_of(None, super::server::http_address(self.cx)))
    }

    fn annotations(&self, server: &str, tool: &str) -> Result<Option<ToolAnnotations>, Unoffered> {
        let state = self.handle(server).ok_or(Unoffered::Unknown)?.state();
        let session = state.session.ok_or(Unoffered::NotRunning(state.status))?;
        let listing = session.listing();
        let found = listing.tools.iter().find(|t| t.name == tool);
        found.map(|t| t.annotations.clone()).ok_or(Unoffered::NoSuchTool)
    }
}

/// Whom a client's failures on a shared server are blamed on: its address (an IPv6 one by
/// its /64, as every share per address), so that a client cannot open a shared breaker
/// for everyone by opening a second session; a session on this machine (loopback) by the
/// session, since local clients all share one address. (A client with no session, on
/// 2026-07-28, by its address wherever it is.) The shared breakers tell an IPv6 client
/// apart by its site (its /48), so that two /64s of one site cannot open them for everyone;
/// its own breakers stay its /64's, so that its failures shed no neighbour's calls.
pub fn blame_of(session: Option<&str>, address: Option<std::net::IpAddr>) -> Blame {
    static KEYS: std::sync::LazyLock<std::hash::RandomState> = std::sync::LazyLock::new(Default::default);
    use std::hash::BuildHasher as _;
    let by_session = session.filter(|_| address.is_none_or(|ip| ip.to_canonical().is_loopback()));
    let (own, shared) = match (by_session, address) {
        (Some(session), _) => {
            let key = KEYS.hash_one(("session", session));
            (key, key)
        }
        (None, Some(ip)) => {
            let address = super::http::address_client(ip);
            let site = super::http::network_of(&address);
            let own = KEYS.hash_one(("address", &address));
            (own, site.map_or(own, |site| KEYS.hash_one(("site", site))))
        }
        (None, None) => return Blame::Server,
    };
    Blame::Client(Culprit { own, shared })
}

/// How much of a failure's text the gateway's log shows: a server's error can be 64 MiB,
/// and a line break in it would forge a line of the log.
const LOGGED_MESSAGE: usize = 4096;

fn log_at(level: tracing::Level, server: &str, tool: &str, category: &str, message: &str, attempts: usize) {
    let message = crate::text::shown(message, LOGGED_MESSAGE);
    match level {
        tracing::Level::ERROR => tracing::error!(server, tool, category, attempts, "call failed: {message}"),
        tracing::Level::WARN => tracing::warn!(server, tool, category, attempts, "call failed: {message}"),
        _ => tracing::info!(server, tool, category, attempts, "call recovered after: {message}"),
    }
}

/// What the client is answered once a call ended: the result, with what recovery did in
/// its `_meta`, or an `isError` result saying why nothing worked. An answer that is not a
/// complete result (a 2026-07-28 server's questions) goes as it is.
/// The client's answer to the call `record` tells of. What Rebound adds to it hides the
/// secrets `errors` hides: those of every setup applied, one a reload applied during the
/// call included (its attempts may have met the new launch); read only when there is
/// something to add, not on every success.
fn response(ending: Ending, record: &Record, errors: &crate::errors_log::ErrorsLog) -> CallToolResponse {
    let mut result = match ending {
        Ending::Answered(CallToolResponse::Complete(result)) if report::as_answered(record) && record.notes == 0 => {
            result
        }
        Ending::Answered(CallToolResponse::Complete(result)) => {
            let secrets = errors.secrets();
            report::recovered(report::noted(result, record, &secrets), record, &secrets)
        }
        Ending::Answered(other) => return other,
        Ending::GaveUp => report::gave_up(record, &errors.secrets()),
    };
    result.result_type = Some(ResultType::COMPLETE);
    result.into()
}

/// An advisor over HTTP: a shared server's adapter (every client's) is shown only the
/// successful calls of the tools its `adapter_allow.observes` grants; one serving a
/// session's own instance, what it declares.
struct ObservedAsGranted<'a> {
    inner: &'a dyn Advisor,
    config: &'a crate::config::Config,
}

impl Advisor for ObservedAsGranted<'_> {
    fn classify(
        &self,
        failure: &FailureContext<'_>,
        builtin: &Classification,
    ) -> BoxFuture<'static, Option<Classification>> {
        self.inner.classify(failure, builtin)
    }

    fn plan(&self, failure: &FailureContext<'_>, class: &Classification) -> BoxFuture<'static, Option<Advice>> {
        self.inner.plan(failure, class)
    }

    fn observe(&self, call: &Completed<'_>) -> BoxFuture<'static, ()> {
        // A call whose arguments an adapter's plan wrote may carry what it was shown of
        // another client's failed call: what it observes it may keep. (A server the
        // configuration no longer has, after a reload, is shown nothing.)
        let shown = self.config.servers.get(call.server).is_some_and(|s| {
            s.scope == crate::config::Scope::Session
                || (call.arguments_by == ArgumentsBy::Client && s.adapter_allow.observes_shared(call.server, call.tool))
        });
        if !shown {
            return Box::pin(async {});
        }
        self.inner.observe(call)
    }
}

/// How many of `record`'s failures go to the errors log: all of them, but for a call
/// `refused` for want of room to hold it, whose last attempt, cancelled for that, is
/// left out. Only a cancellation is: an attempt that timed out meanwhile (its answer
/// waited for while the client's progress was delivered) may have run, and is written.
fn to_write(record: &Record, refused: bool) -> usize {
    let cancelled_last = record.last_failure().is_some_and(|(f, _)| matches!(f, Failure::Cancelled));
    if refused && cancelled_last { record.failures().count() - 1 } else { usize::MAX }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_refused_for_room_leaves_out_its_cancellation_alone() {
        let attempt = |failure| crate::recovery::engine::AttemptRecord {
            server: "s".into(),
            tool: "t".into(),
            role: Role::Primary,
            failure: Some(failure),
            classification: Some(crate::recovery::classify::classify(
                &Failure::Cancelled,
                std::time::SystemTime::UNIX_EPOCH,
            )),
            waited: Duration::ZERO,
        };
        let record = |failures: Vec<Failure>| Record {
            server: "s".into(),
            tool: "t".into(),
            attempts: failures.into_iter().map(attempt).collect(),
            safe: true,
            stopped: None,
            action: None,
            denied: vec![],
            not_tried: vec![],
            notes: 0,
        };
        let timeout = || Failure::Timeout { after: Duration::from_secs(1) };
        assert_eq!(to_write(&record(vec![timeout(), Failure::Cancelled]), true), 1);
        assert_eq!(to_write(&record(vec![timeout(), timeout()]), true), usize::MAX, "a timeout may have run");
        assert_eq!(to_write(&record(vec![timeout(), Failure::Cancelled]), false), usize::MAX);
    }

    /// Over HTTP, a shared server's adapter is shown a granted tool's successful call
    /// only when the client wrote its arguments; a session's own instance's adapter, any.
    #[test]
    fn a_shared_adapter_over_http_observes_only_granted_calls_with_the_clients_arguments() {
        struct Seen(std::sync::Mutex<Vec<String>>);
        impl Advisor for Seen {
            fn classify(
                &self,
                _: &FailureContext<'_>,
                _: &Classification,
            ) -> BoxFuture<'static, Option<Classification>> {
                Box::pin(async { None })
            }
            fn plan(&self, _: &FailureContext<'_>, _: &Classification) -> BoxFuture<'static, Option<Advice>> {
                Box::pin(async { None })
            }
            fn observe(&self, call: &Completed<'_>) -> BoxFuture<'static, ()> {
                self.0.lock().unwrap().push(format!("{}/{}", call.server, call.tool));
                Box::pin(async {})
            }
        }
        let text = serde_json::json!({"mcpServers": {
            "shared": {"command": "x", "adapter_allow": {"observes": ["look"]}},
            "own": {"command": "x", "scope": "session"},
        }});
        let config = crate::config::parse(&text.to_string(), std::path::Path::new("/r.json"), &|_| None).unwrap();
        let seen = Seen(std::sync::Mutex::default());
        let shown = ObservedAsGranted { inner: &seen, config: &config };
        let result = CallToolResult::success(vec![]);
        for (server, tool) in [("shared", "look"), ("shared", "other"), ("own", "any"), ("gone", "look")] {
            for arguments_by in [ArgumentsBy::Client, ArgumentsBy::Adapter] {
                let call = Completed { server, tool, arguments: None, result: &result, arguments_by };
                futures::executor::block_on(shown.observe(&call));
            }
        }
        assert_eq!(*seen.0.lock().unwrap(), ["shared/look", "own/any", "own/any"]);
    }

    fn ip(s: &str) -> Option<std::net::IpAddr> {
        Some(s.parse().unwrap())
    }

    /// A client is its address, an IPv6 one by its /64, however many sessions it opens;
    /// on this machine, where every client has the same address, its session.
    #[test]
    fn whom_a_clients_failures_are_blamed_on() {
        let (one, two) = (Some("session one"), Some("session two"));
        assert_eq!(blame_of(one, ip("203.0.113.7")), blame_of(two, ip("203.0.113.7")));
        assert_ne!(blame_of(one, ip("203.0.113.7")), blame_of(one, ip("203.0.113.8")));
        assert_eq!(blame_of(one, ip("2001:db8:1:2::1")), blame_of(two, ip("2001:db8:1:2:ffff::9")));
        assert_ne!(blame_of(one, ip("2001:db8:1:2::1")), blame_of(one, ip("2001:db8:1:3::1")));
        assert_eq!(blame_of(one, ip("::ffff:203.0.113.7")), blame_of(two, ip("203.0.113.7")));
        for local in ["127.0.0.1", "::1", "::ffff:127.0.0.1"] {
            assert_ne!(blame_of(one, ip(local)), blame_of(two, ip(local)), "{local}");
            assert_eq!(blame_of(one, ip(local)), blame_of(one, ip("127.0.0.1")), "{local}");
        }
        // With no session (2026-07-28), by the address wherever it is.
        assert_eq!(blame_of(None, ip("127.0.0.1")), blame_of(None, ip("127.0.0.1")));
        assert_ne!(blame_of(None, ip("127.0.0.1")), blame_of(one, ip("127.0.0.1")));
        assert!(matches!(blame_of(one, ip("::1")), Blame::Client(_)));
        assert_eq!(blame_of(None, None), Blame::Server);
    }

    /// The /64s of one IPv6 site are each a client of its own breakers, and one client of
    /// the shared ones; an IPv4 address and a local session are one client of both.
    #[test]
    fn the_shared_breakers_tell_an_ipv6_site_apart_as_one_client() {
        let culprit = |session, address| match blame_of(session, ip(address)) {
            Blame::Client(culprit) => culprit,
            Blame::Server => panic!("a client"),
        };
        let (a, b) = (culprit(None, "2001:db8:1:2::1"), culprit(None, "2001:db8:1:3::1"));
        assert_ne!(a.own, b.own);
        assert_eq!(a.shared, b.shared);
        assert_ne!(a.shared, culprit(None, "2001:db8:2:2::1").shared, "another site");
        for c in [culprit(None, "203.0.113.7"), culprit(Some("session one"), "127.0.0.1")] {
            assert_eq!(c.own, c.shared);
        }
    }
}
