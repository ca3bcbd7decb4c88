//! OpenTelemetry traces, exported over OTLP with the official crates. Off unless
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set; the
//! other standard variables (`OTEL_EXPORTER_OTLP_PROTOCOL`, `…_HEADERS`, `…_TIMEOUT`,
//! `OTEL_SERVICE_NAME`, `OTEL_SDK_DISABLED`) apply as usual. When off, a call costs one
//! load of a `OnceLock`.
//!
//! Every client tool call is a span (`tools/call TOOL`), continuing the client's
//! `traceparent` (its HTTP header, or `_meta.traceparent`), and passing its own on to the
//! servers in `_meta.traceparent`. Inside it, one child span per attempt, side call and
//! alternative (`attempt SERVER/TOOL`) and per adapter call (`adapter classify` and
//! `adapter plan`), with the server, tool, role, failure category, outcome and the wait
//! before a retry as attributes. The children are recorded as they happen and emitted,
//! with their own times, when the call ends: the recovery engine stays free of I/O.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::SystemTime;

use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry::trace::{Span as _, SpanKind, Status, TraceContextExt as _, Tracer as _, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};

use futures::future::BoxFuture;
use rmcp::model::{CallToolResult, JsonObject};

use crate::recovery::Failure;
use crate::recovery::classify::Classification;
use crate::recovery::classify::classify;
use crate::recovery::engine::{Ending, Record, Role};
use crate::recovery::plan::{Advisor, FailureContext, Step};

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
    let resource = opentelemetry_sdk::Resource::builder().with_service_name("rebound").build();
    let provider = SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build();
    let tracer = provider.tracer("rebound");
    let _ = TRACING.set((provider, tracer));
    Ok(true)
}

/// Sends the spans not yet exported. Call it outside the async runtime, before exiting.
pub fn shutdown() {
    if let Some((provider, _)) = TRACING.get()
        && let Err(e) = provider.shutdown()
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

/// One child of a call's span, as it happened.
struct Child {
    name: String,
    start: SystemTime,
    end: SystemTime,
    attributes: Vec<KeyValue>,
    /// An upstream attempt (matched to the record's attempts at the end).
    upstream: bool,
}

/// One client call's trace.
pub struct CallTrace {
    context: Context,
    children: Mutex<Vec<Child>>,
}

impl CallTrace {
    /// The span of a call of `tool`, continuing the client's trace; `None` when tracing
    /// is off.
    pub fn start(tool: &str, traceparent: Option<&str>, tracestate: Option<&str>) -> Option<Arc<Self>> {
        let tracer = tracer()?;
        let parent = parent(traceparent, tracestate);
        let span = tracer
            .span_builder(format!("tools/call {tool}"))
            .with_kind(SpanKind::Server)
            .with_attributes([
                KeyValue::new("mcp.method.name", "tools/call"),
                KeyValue::new("gen_ai.tool.name", tool.to_owned()),
            ])
            .start_with_context(tracer, &parent);
        Some(Arc::new(Self { context: parent.with_span(span), children: Mutex::default() }))
    }

    /// The `traceparent` that makes a server's spans children of this call's.
    pub fn traceparent(&self) -> String {
        let sc = self.context.span().span_context().clone();
        format!("00-{}-{}-{:02x}", sc.trace_id(), sc.span_id(), sc.trace_flags().to_u8())
    }

    /// An upstream call of `tool` on `server`, begun at `start`, just ended.
    pub fn upstream(&self, server: &str, tool: &str, start: SystemTime, failure: Option<&Failure>) {
        let mut attributes = vec![
            KeyValue::new("rebound.server", server.to_owned()),
            KeyValue::new("gen_ai.tool.name", tool.to_owned()),
        ];
        match failure {
            None => attributes.push(KeyValue::new("rebound.outcome", "ok")),
            Some(f) => {
                attributes.push(KeyValue::new("rebound.outcome", "failed"));
                attributes.push(KeyValue::new("error.type", classify(f, SystemTime::now()).category.label()));
                attributes.push(KeyValue::new("rebound.failure", f.message()));
            }
        }
        self.push(Child {
            name: format!("attempt {server}/{tool}"),
            start,
            end: SystemTime::now(),
            attributes,
            upstream: true,
        });
    }

    /// An adapter call (`classify` or `plan`) of `server`'s adapter, begun at `start`.
    pub fn adapter(&self, what: &'static str, server: &str, start: SystemTime, answered: bool) {
        let attributes = vec![
            KeyValue::new("rebound.server", server.to_owned()),
            KeyValue::new("rebound.adapter.answered", answered),
        ];
        self.push(Child {
            name: format!("adapter {what}"),
            start,
            end: SystemTime::now(),
            attributes,
            upstream: false,
        });
    }

    fn push(&self, child: Child) {
        self.children.lock().expect("not poisoned").push(child);
    }

    /// The call ended: its children are emitted, then its own span, with what the
    /// engine's record says of each attempt (role, category, the wait before it).
    pub fn finish(&self, record: &Record, ending: &Ending) {
        let Some(tracer) = tracer() else { return };
        let mut children = std::mem::take(&mut *self.children.lock().expect("not poisoned"));
        // The record's attempts that reached a server, in order, are the upstream children.
        let sent = record.attempts.iter().filter(|a| {
            !matches!(
                a.failure,
                Some(Failure::CircuitOpen { .. }) | Some(Failure::Timeout { after: std::time::Duration::ZERO })
            )
        });
        for (child, attempt) in children.iter_mut().filter(|c| c.upstream).zip(sent) {
            let role = match attempt.role {
                Role::Primary => "primary",
                Role::Alternative => "alternative",
                Role::SideCall => "side-call",
            };
            child.attributes.push(KeyValue::new("rebound.role", role));
            child.attributes.push(KeyValue::new("rebound.retry.waited_ms", attempt.waited.as_millis() as i64));
        }
        for child in children {
            let mut span = tracer
                .span_builder(child.name)
                .with_kind(SpanKind::Client)
                .with_start_time(child.start)
                .with_attributes(child.attributes)
                .start_with_context(tracer, &self.context);
            span.end_with_timestamp(child.end);
        }
        let span = self.context.span();
        let outcome = match ending {
            Ending::GaveUp => "gave_up",
            Ending::Answered(r) if r.is_error == Some(true) => "tool_error",
            Ending::Answered(_) if record.recovered() => "recovered",
            Ending::Answered(_) => "ok",
        };
        span.set_attribute(KeyValue::new("rebound.server", record.server.to_string()));
        span.set_attribute(KeyValue::new("rebound.outcome", outcome));
        span.set_attribute(KeyValue::new("rebound.attempts", record.attempts.len() as i64));
        if let Some((failure, class)) = record.last_failure() {
            span.set_attribute(KeyValue::new("error.type", class.category.label()));
            if matches!(ending, Ending::GaveUp) {
                span.set_status(Status::error(failure.message()));
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
    ) -> BoxFuture<'static, Option<Vec<Step>>> {
        self.timed("plan", failure.server, self.inner.plan(failure, classification))
    }

    fn observe(
        &self,
        server: &str,
        tool: &str,
        arguments: Option<&JsonObject>,
        result: &CallToolResult,
    ) -> BoxFuture<'static, ()> {
        // Off the call's path: not part of its trace.
        self.inner.observe(server, tool, arguments, result)
    }
}
