//! OpenTelemetry traces, exported over OTLP with the official crates. Off unless
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set; the
//! other standard variables (`OTEL_EXPORTER_OTLP_PROTOCOL`, `…_HEADERS`, `…_TIMEOUT`,
//! `OTEL_SERVICE_NAME`, `OTEL_SDK_DISABLED`) apply as usual. When off, a call costs one
//! load of a `OnceLock`.
//!
//! Every client tool call is a span (`tools/call TOOL`), continuing the client's
//! `traceparent` (its HTTP header, or `_meta.traceparent`). Inside it, one child span per
//! attempt, side call and alternative (`attempt SERVER/TOOL`, whose `traceparent` goes to
//! the server in `_meta`) and per adapter call (`adapter classify` and `adapter plan`),
//! with the server, tool, role, failure category, outcome and the wait before a retry as
//! attributes. The children are started at the gateway's edges as things happen and ended
//! when the call ends, with what the engine's record says of them: the recovery engine
//! stays free of I/O.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::SystemTime;

use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry::trace::{Span as _, SpanKind, Status, TraceContextExt as _, Tracer as _, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider, Span};

use futures::future::BoxFuture;

use crate::lasting::Locked;
use crate::recovery::Failure;
use crate::recovery::classify::Classification;
use crate::recovery::classify::classify;
use crate::recovery::engine::{Ending, Record, Role};
use crate::recovery::plan::{Advice, Advisor, Completed, FailureContext};
use crate::redact::Current;

static TRACING: OnceLock<(SdkTracerProvider, SdkTracer)> = OnceLock::new();

/// Starts exporting if the environment asks for it; says whether it does. Call it
/// outside the async runtime (the exporter's HTTP client blocks, on its own thread).
pub fn init() -> Result<bool, String> {
    let set = |k: &str| std::env::var(k).is_ok_and(|v| !v.trim().is_empty());
    if std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.eq_ignore_ascii_case("true"))
        || !(set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
    {
        return Ok(false);
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
        .map_err(|e| format!("the OTLP exporter could not start: {e}"))?;
    // `OTEL_SERVICE_NAME` (read by the builder) wins; "rebound" otherwise.
    let mut resource = opentelemetry_sdk::Resource::builder();
    if !set("OTEL_SERVICE_NAME") {
        resource = resource.with_service_name("rebound");
    }
    let resource = resource.build();
    let provider = SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build();
    let tracer = provider.tracer("rebound");
    let _ = TRACING.set((provider, tracer));
    Ok(true)
}

/// Sends the spans not yet exported, waiting a second at most (the servers are stopped
/// already; a slow collector must not hold the exit). Call it outside the async runtime.
pub fn shutdown() {
    if let Some((provider, _)) = TRACING.get()
        && let Err(e) = provider.shutdown_with_timeout(std::time::Duration::from_secs(1))
    {
        eprintln!("rebound: exporting the last traces failed: {e}");
    }
}

fn tracer() -> Option<&'static SdkTracer> {
    TRACING.get().map(|(_, t)| t)
}

/// The context a client's `traceparent` (and `tracestate`) continue.
fn parent(traceparent: Option<&str>, tracestate: Option<&str>) -> Context {
    let mut carrier = HashMap::new();
    if let Some(tp) = traceparent {
        carrier.insert("traceparent".to_owned(), tp.to_owned());
    }
    if let Some(ts) = tracestate {
        carrier.insert("tracestate".to_owned(), ts.to_owned());
    }
    TraceContextPropagator::new().extract(&carrier)
}

/// A text attribute at most this long (error texts come from servers).
const TEXT_MAX: usize = 1 << 10;

/// One child of a call's span: started live (an attempt's id goes to the server in its
/// `traceparent`), ended when the call ends, with what the record says of it.
struct Child {
    span: Span,
    end: SystemTime,
    /// An upstream attempt (matched to the record's attempts at the end).
    upstream: bool,
}

/// An upstream attempt's span while it runs.
pub struct Attempt {
    span: Span,
    traceparent: String,
}

impl Attempt {
    /// The `traceparent` that makes the server's spans children of this attempt's.
    pub fn traceparent(&self) -> &str {
        &self.traceparent
    }
}

/// One client call's trace.
pub struct CallTrace {
    context: Context,
    /// Removed from every text the spans carry: the secrets hidden when the text is
    /// recorded (a reload during the call adds its own).
    secrets: Current,
    children: Mutex<Vec<Child>>,
}

/// Whether traces are exported: the cost of tracing when off is this one load.
pub fn enabled() -> bool {
    TRACING.get().is_some()
}

impl CallTrace {
    /// The span of a call of `tool`, continuing the client's trace; `None` when tracing
    /// is off.
    pub fn start(
        tool: &str,
        traceparent: Option<&str>,
        tracestate: Option<&str>,
        secrets: Current,
    ) -> Option<Arc<Self>> {
        let tracer = tracer()?;
        let parent = parent(traceparent, tracestate);
        // A server names its tools, at any length: each span carries at most `TEXT_MAX`.
        let tool = crate::text::capped(tool, TEXT_MAX);
        let span = tracer
            .span_builder(format!("tools/call {tool}"))
            .with_kind(SpanKind::Server)
            .with_attributes([KeyValue::new("mcp.method.name", "tools/call"), KeyValue::new("gen_ai.tool.name", tool)])
            .start_with_context(tracer, &parent);
        Some(Arc::new(Self { context: parent.with_span(span), secrets, children: Mutex::default() }))
    }

    /// An upstream call of `tool` on `server` begins.
    pub fn attempt(&self, server: &str, tool: &str) -> Option<Attempt> {
        let tracer = tracer()?;
        let tool = crate::text::capped(tool, TEXT_MAX);
        let span = tracer
            .span_builder(format!("attempt {server}/{tool}"))
            .with_kind(SpanKind::Client)
            .with_attributes([
                KeyValue::new("rebound.server", server.to_owned()),
                KeyValue::new("gen_ai.tool.name", tool),
            ])
            .start_with_context(tracer, &self.context);
        let sc = span.span_context();
        let traceparent = format!("00-{}-{}-{:02x}", sc.trace_id(), sc.span_id(), sc.trace_flags().to_u8());
        Some(Attempt { span, traceparent })
    }

    /// `attempt` ended, with `failure` or not.
    pub fn attempt_ended(&self, attempt: Attempt, failure: Option<&Failure>) {
        let mut span = attempt.span;
        match failure {
            None => span.set_attribute(KeyValue::new("rebound.outcome", "ok")),
            Some(f) => {
                span.set_attribute(KeyValue::new("rebound.outcome", "failed"));
                span.set_attribute(KeyValue::new("error.type", classify(f, SystemTime::now()).category.label()));
                span.set_attribute(KeyValue::new("rebound.failure", self.text(&f.message())));
            }
        }
        self.push(Child { span, end: SystemTime::now(), upstream: true });
    }

    /// An adapter call (`classify` or `plan`) of `server`'s adapter, begun at `start`.
    pub fn adapter(&self, what: &'static str, server: &str, start: SystemTime, answered: bool) {
        let Some(tracer) = tracer() else { return };
        let span = tracer
            .span_builder(format!("adapter {what}"))
            .with_kind(SpanKind::Internal)
            .with_start_time(start)
            .with_attributes([
                KeyValue::new("rebound.server", server.to_owned()),
                KeyValue::new("rebound.adapter.answered", answered),
            ])
            .start_with_context(tracer, &self.context);
        self.push(Child { span, end: SystemTime::now(), upstream: false });
    }

    fn push(&self, child: Child) {
        self.children.locked().push(child);
    }

    /// `text` without secrets, at most `TEXT_MAX` bytes.
    fn text(&self, text: &str) -> String {
        let mut text = self.secrets.get().redact(text).into_owned();
        crate::text::cap(&mut text, TEXT_MAX);
        text
    }

    /// The call ended: its children end, with what the engine's record says of each
    /// attempt (role, the wait before it), then its own span.
    pub fn finish(&self, record: &Record, ending: &Ending) {
        let children = std::mem::take(&mut *self.children.locked());
        // The record's attempts that reached a server, in order, are the upstream children
        // (every call of the gateway's `Upstream` is one, whether it got through or not).
        let sent = record.attempts.iter().filter(|a| {
            !matches!(
                a.failure,
                Some(Failure::CircuitOpen { .. }) | Some(Failure::Timeout { after: std::time::Duration::ZERO })
            )
        });
        let mut sent = sent.peekable();
        for mut child in children {
            if child.upstream
                && let Some(attempt) = sent.next()
            {
                let role = match attempt.role {
                    Role::Primary => "primary",
                    Role::Alternative => "alternative",
                    Role::SideCall => "side-call",
                };
                child.span.set_attribute(KeyValue::new("rebound.role", role));
                child.span.set_attribute(KeyValue::new("rebound.retry.waited_ms", attempt.waited.as_millis() as i64));
            }
            child.span.end_with_timestamp(child.end);
        }
        let span = self.context.span();
        let outcome = match ending {
            Ending::GaveUp => "gave_up",
            _ if ending.is_tool_error() => "tool_error",
            Ending::Answered(_) if record.recovered() => "recovered",
            Ending::Answered(_) => "ok",
        };
        span.set_attribute(KeyValue::new("rebound.server", record.server.to_string()));
        span.set_attribute(KeyValue::new("rebound.outcome", outcome));
        span.set_attribute(KeyValue::new("rebound.attempts", record.attempts.len() as i64));
        if let Some((failure, class)) = record.last_failure() {
            span.set_attribute(KeyValue::new("error.type", class.category.label()));
            if matches!(ending, Ending::GaveUp) {
                span.set_status(Status::error(self.text(&failure.message())));
            }
        }
        span.end();
    }
}

/// An adapter whose calls are recorded in a call's trace.
pub struct TracedAdvisor<'a> {
    pub inner: &'a dyn Advisor,
    pub trace: Arc<CallTrace>,
}

impl TracedAdvisor<'_> {
    /// `asked`, recorded as an adapter call `what` of `server`'s adapter when it ends.
    fn timed<T: Send + 'static>(
        &self,
        what: &'static str,
        server: &str,
        asked: BoxFuture<'static, Option<T>>,
    ) -> BoxFuture<'static, Option<T>> {
        let (start, trace, server) = (SystemTime::now(), self.trace.clone(), server.to_owned());
        Box::pin(async move {
            let answer = asked.await;
            trace.adapter(what, &server, start, answer.is_some());
            answer
        })
    }
}

impl Advisor for TracedAdvisor<'_> {
    fn classify(
        &self,
        failure: &FailureContext<'_>,
        builtin: &Classification,
    ) -> BoxFuture<'static, Option<Classification>> {
        self.timed("classify", failure.server, self.inner.classify(failure, builtin))
    }

    fn plan(
        &self,
        failure: &FailureContext<'_>,
        classification: &Classification,
    ) -> BoxFuture<'static, Option<Advice>> {
        self.timed("plan", failure.server, self.inner.plan(failure, classification))
    }

    fn observe(&self, call: &Completed<'_>) -> BoxFuture<'static, ()> {
        // Off the call's path: not part of its trace.
        self.inner.observe(call)
    }
}
