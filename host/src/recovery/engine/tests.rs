//! The engine against a scripted upstream, on tokio's paused clock with a seeded RNG.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use rmcp::model::ContentBlock;
use serde_json::json;
use tokio::time::Instant;

use super::*;
use crate::config::{Launch, StdioLaunch, ToolRecovery};
use crate::recovery::classify::classify;
use crate::recovery::clock::TokioClock;
use crate::recovery::report;

/// One upstream call: tool, when, its timeout, its arguments.
type Call = (String, Instant, Duration, Option<JsonObject>);

/// Answers from a script per tool; an exhausted script answers `ok`. Records every call.
#[derive(Default)]
struct Script {
    answers: Mutex<HashMap<String, VecDeque<Result<CallToolResponse, Failure>>>>,
    calls: Mutex<Vec<Call>>,
    /// Each call's tool, with what it was to the client's call.
    roles: Mutex<Vec<(String, Role)>>,
    tools: HashMap<String, Option<ToolAnnotations>>,
    /// The client's cancellation of the call.
    cancelled: CancellationToken,
    /// Whom the calls are from, when the server serves many clients (by default it
    /// serves one).
    client: Mutex<Option<u64>>,
    /// A resumed call, which only the tool called may answer.
    alone: bool,
    /// How long each call first waits for its server (a restart under way), within the
    /// time it was given.
    waits: Duration,
}

fn ok(text: &str) -> Result<CallToolResponse, Failure> {
    Ok(CallToolResult::success(vec![ContentBlock::text(text)]).into())
}

fn tool_error(text: &str) -> Result<CallToolResponse, Failure> {
    Err(Failure::ToolError { result: Box::new(CallToolResult::error(vec![ContentBlock::text(text)])) })
}

fn timeout() -> Result<CallToolResponse, Failure> {
    Err(Failure::Timeout { after: Duration::from_secs(1) })
}

impl Script {
    fn new(tools: &[(&str, bool)]) -> Self {
        let read_only = ToolAnnotations::new().read_only(true);
        let tools = tools.iter().map(|(t, ro)| (t.to_string(), ro.then(|| read_only.clone()))).collect();
        Self { tools, ..Self::default() }
    }

    fn then(self, tool: &str, answers: Vec<Result<CallToolResponse, Failure>>) -> Self {
        self.answers.lock().unwrap().entry(tool.into()).or_default().extend(answers);
        self
    }

    fn calls(&self, tool: &str) -> Vec<(Instant, Duration, Option<JsonObject>)> {
        self.calls.lock().unwrap().iter().filter(|c| c.0 == tool).map(|c| (c.1, c.2, c.3.clone())).collect()
    }
}

impl Upstream for Script {
    fn call(
        &self,
        server: &str,
        tool: &str,
        role: Role,
        arguments: Option<JsonObject>,
        timeout: Duration,
        max_total: Duration,
    ) -> BoxFuture<'_, Result<CallToolResponse, Failure>> {
        let key = format!("{server}/{tool}");
        self.roles.lock().unwrap().push((key.clone(), role));
        self.calls.lock().unwrap().push((key.clone(), Instant::now(), timeout, arguments));
        let answer =
            self.answers.lock().unwrap().get_mut(&key).and_then(VecDeque::pop_front).unwrap_or_else(|| ok("ok"));
        let waits = self.waits.min(max_total);
        Box::pin(async move {
            tokio::time::sleep(waits).await;
            // A timeout takes what time is left, of which the server was given all.
            if let Err(Failure::Timeout { .. }) = &answer {
                let after = timeout.min(max_total - waits);
                tokio::time::sleep(after).await;
                return Err(Failure::Timeout { after });
            }
            answer
        })
    }

    fn restart(&self, server: &str, within: Duration) -> BoxFuture<'_, ()> {
        // Its "timeout": how long it may wait for the server to come back.
        self.calls.lock().unwrap().push((format!("{server}/<restart>"), Instant::now(), within, None));
        Box::pin(async {})
    }

    fn annotations(&self, server: &str, tool: &str) -> Result<Option<ToolAnnotations>, Unoffered> {
        self.tools.get(&format!("{server}/{tool}")).cloned().ok_or(Unoffered::NoSuchTool)
    }

    fn cancellation(&self) -> &CancellationToken {
        &self.cancelled
    }

    fn alone(&self) -> bool {
        self.alone
    }

    fn blame(&self, _server: &str) -> Blame {
        self.client.lock().unwrap().map_or(Blame::Server, Blame::client)
    }
}

fn server(name: &str, recovery: RecoveryConfig) -> ServerConfig {
    ServerConfig {
        name: name.into(),
        launch: Launch::Stdio(StdioLaunch { command: "x".into(), args: vec![], env: Default::default(), cwd: None }),
        adapter: None,
        recovery,
        adapter_config: Value::Null,
        adapter_allow: crate::config::AdapterGrant::own(name),
        scope: Default::default(),
        protocol: Default::default(),
    }
}

/// An engine whose adapters declare exactly what their servers grant them, so that the
/// grant alone decides (the two-sided test below narrows the declaration).
fn engine(servers: &[ServerConfig]) -> Engine {
    let mut e = Engine::new(servers, Arc::new(TokioClock), Arc::new(Rng::seeded(42)));
    for s in servers {
        e.declare(&s.name, s.adapter_allow.clone());
    }
    e
}

fn defaults() -> RecoveryConfig {
    RecoveryConfig { timeout_ms: 1_000, ..RecoveryConfig::default() }
}

async fn run(e: &Engine, up: &Script, tool: &str) -> (Ending, Record) {
    let annotations = up.annotations("s", tool).ok().flatten();
    e.run(
        up,
        None,
        "s".into(),
        tool.into(),
        annotations.as_ref(),
        Some(json!({"q": "x", "n": 3}).as_object().unwrap().clone()),
    )
    .await
}

fn answered(ending: &Ending) -> String {
    match ending {
        Ending::Answered(CallToolResponse::Complete(r)) => r.content[0].as_text().unwrap().text.clone(),
        Ending::Answered(_) => "not a result".into(),
        Ending::GaveUp => "gave up".into(),
    }
}

#[tokio::test(start_paused = true)]
async fn a_transient_failure_of_a_read_only_tool_is_retried_within_the_backoff_bound() {
    let up = Script::new(&[("s/read", true)]).then(
        "s/read",
        vec![timeout(), Err(Failure::ConnectionLost { reason: "eof".into(), session: None }), ok("third time")],
    );
    let e = engine(&[server("s", defaults())]);
    let (ending, record) = run(&e, &up, "read").await;
    assert_eq!(answered(&ending), "third time");
    assert!(record.recovered());
    let calls = up.calls("s/read");
    assert_eq!(calls.len(), 3);
    // Waits are U(0, 1 s) then U(0, 2 s), after the 1 s timeout of the first attempt.
    let first_wait = calls[1].0 - calls[0].0 - Duration::from_secs(1);
    let second_wait = calls[2].0 - calls[1].0;
    assert!(first_wait <= Duration::from_secs(1), "{first_wait:?}");
    assert!(second_wait <= Duration::from_secs(2), "{second_wait:?}");
}

/// Full jitter: each wait is drawn over the whole of its bound, from nothing up, and the
/// bound grows with each retry; not a fixed wait, nor one always at its bound.
#[tokio::test(start_paused = true)]
async fn retry_waits_spread_over_their_whole_growing_bound() {
    const CALLS: usize = 50;
    let lost = || Err(Failure::ConnectionLost { reason: "eof".into(), session: None });
    let answers = (0..CALLS).flat_map(|_| [lost(), lost(), ok("third time")]).collect();
    let up = Script::new(&[("s/read", true)]).then("s/read", answers);
    let mut recovery = defaults();
    recovery.retry.budget_reserve = 1_000;
    recovery.breaker.min_calls = u32::MAX;
    let e = engine(&[server("s", recovery)]);
    for _ in 0..CALLS {
        assert_eq!(answered(&run(&e, &up, "read").await.0), "third time");
    }
    let at: Vec<Instant> = up.calls("s/read").into_iter().map(|c| c.0).collect();
    let waits = |retry: usize| -> Vec<Duration> { at.chunks(3).map(|call| call[retry + 1] - call[retry]).collect() };
    let (first, second) = (waits(0), waits(1));
    let min_max = |w: &[Duration]| (*w.iter().min().unwrap(), *w.iter().max().unwrap());
    let ((min1, max1), (_, max2)) = (min_max(&first), min_max(&second));
    assert!(max1 <= Duration::from_secs(1) && max2 <= Duration::from_secs(2), "within U(0, 1 s), U(0, 2 s)");
    assert!(min1 < Duration::from_millis(200) && max1 > Duration::from_millis(800), "{first:?}");
    assert!(max2 > Duration::from_millis(1200), "the second bound is twice the first: {second:?}");
}

#[tokio::test(start_paused = true)]
async fn a_tool_without_hints_is_not_replayed_after_it_may_have_run() {
    let up = Script::new(&[("s/write", false)]).then("s/write", vec![timeout()]);
    let e = engine(&[server("s", defaults())]);
    let (ending, record) = run(&e, &up, "write").await;
    assert!(matches!(ending, Ending::GaveUp));
    assert_eq!(up.calls("s/write").len(), 1);
    assert!(record.stopped.unwrap().contains("not marked read-only or idempotent"));
}

/// A tool its server marks idempotent (and not read-only) is replayed after it may have
/// run, as a read-only one is.
#[tokio::test(start_paused = true)]
async fn a_tool_its_server_marks_idempotent_is_replayed() {
    let mut up = Script::new(&[]).then("s/put", vec![timeout()]);
    up.tools.insert("s/put".into(), Some(ToolAnnotations::new().read_only(false).idempotent(true)));
    let e = engine(&[server("s", defaults())]);
    let (ending, record) = run(&e, &up, "put").await;
    assert_eq!(answered(&ending), "ok");
    assert_eq!(up.calls("s/put").len(), 2);
    assert!(record.recovered());
}

#[tokio::test(start_paused = true)]
async fn config_can_mark_a_tool_idempotent_or_not() {
    let mut r = defaults();
    r.tools.insert("write".into(), ToolRecovery { idempotent: Some(true), ..Default::default() });
    r.tools.insert("read".into(), ToolRecovery { idempotent: Some(false), ..Default::default() });
    let up = Script::new(&[("s/write", false), ("s/read", true)])
        .then("s/write", vec![timeout()])
        .then("s/read", vec![timeout()]);
    let e = engine(&[server("s", r)]);
    assert_eq!(answered(&run(&e, &up, "write").await.0), "ok");
    assert!(matches!(run(&e, &up, "read").await.0, Ending::GaveUp));
}

#[tokio::test(start_paused = true)]
async fn proof_of_non_delivery_makes_any_tool_safe_to_retry() {
    let up = Script::new(&[("s/write", false)])
        .then("s/write", vec![Err(Failure::SendFailed { reason: "broken pipe".into() })]);
    let e = engine(&[server("s", defaults())]);
    assert_eq!(answered(&run(&e, &up, "write").await.0), "ok");
    assert_eq!(up.calls("s/write").len(), 2);
}

#[tokio::test(start_paused = true)]
async fn retry_after_is_honoured() {
    let up = Script::new(&[("s/search", true)])
        .then("s/search", vec![tool_error("429 Too Many Requests; retry after 5 seconds")]);
    let e = engine(&[server("s", defaults())]);
    assert_eq!(answered(&run(&e, &up, "search").await.0), "ok");
    let calls = up.calls("s/search");
    assert!(calls[1].0 - calls[0].0 >= Duration::from_secs(5));
}

/// An adapter may lengthen the wait a server asked for before a retry, never shorten it:
/// with a reclassification that drops the server's `retry after 5 seconds`, a retry (at
/// the default wait, or at once) still waits the 5 s.
#[tokio::test(start_paused = true)]
async fn an_adapter_cannot_shorten_the_wait_a_server_asked_for() {
    let limited = || tool_error("429 Too Many Requests; retry after 5 seconds");
    let mut hasty = classify(&limited().unwrap_err(), std::time::SystemTime::UNIX_EPOCH);
    assert_eq!(hasty.retry_after, Some(Duration::from_secs(5)), "the built-in reading");
    hasty.retry_after = None;
    for plan in [vec![Step::Retry(None)], vec![Step::Retry(Some(Duration::ZERO))]] {
        let up = Script::new(&[("s/search", true)]).then("s/search", vec![limited()]);
        let a = Planner {
            plan,
            reclassify: Some(hasty.clone()),
            observed: Mutex::default(),
            consulted: Default::default(),
        };
        let (_, record) = advised(&engine(&[server("s", defaults())]), &up, &a, "search").await;
        let calls = up.calls("s/search");
        assert_eq!(calls.len(), 2, "{record:?}");
        assert!(calls[1].0 - calls[0].0 >= Duration::from_secs(5), "{:?}", calls[1].0 - calls[0].0);
    }
}

#[tokio::test(start_paused = true)]
async fn a_call_the_client_cancels_while_it_waits_to_retry_is_not_tried_again() {
    let up = Script::new(&[("s/search", true)])
        .then("s/search", vec![tool_error("429 Too Many Requests; retry after 5 seconds")]);
    let e = engine(&[server("s", defaults())]);
    let start = Instant::now();
    let cancel = async {
        tokio::time::sleep(Duration::from_secs(2)).await;
        up.cancelled.cancel();
    };
    let ((ending, record), ()) = tokio::join!(run(&e, &up, "search"), cancel);
    assert!(matches!(ending, Ending::GaveUp));
    assert_eq!(Instant::now() - start, Duration::from_secs(2), "the wait ended with the cancel");
    assert_eq!(up.calls("s/search").len(), 1);
    assert_eq!(record.stopped.as_deref(), Some(CANCELLED));
}

#[tokio::test(start_paused = true)]
async fn a_call_the_client_cancels_during_an_alternative_tries_no_other() {
    let mut r = defaults();
    let alt = |tool: &str| Alternative { tool: tool.into(), server: None, arguments: None };
    r.fallbacks.insert("a".into(), vec![alt("b"), alt("c")]);
    let boom = Err(Failure::Rpc { code: -32603, message: "boom".into(), data: None });
    let up = Script::new(&[("s/a", false), ("s/b", true), ("s/c", true)])
        .then("s/a", vec![boom])
        .then("s/b", vec![timeout()]);
    let e = engine(&[server("s", r)]);
    let cancel = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        up.cancelled.cancel();
    };
    let ((ending, record), ()) = tokio::join!(run(&e, &up, "a"), cancel);
    assert!(matches!(ending, Ending::GaveUp));
    assert_eq!((up.calls("s/b").len(), up.calls("s/c").len()), (1, 0));
    assert_eq!(record.stopped.as_deref(), Some(CANCELLED));
}

#[tokio::test(start_paused = true)]
async fn nothing_is_attempted_for_a_call_cancelled_before_it_starts() {
    let up = Script::new(&[("s/read", true)]);
    up.cancelled.cancel();
    let e = engine(&[server("s", defaults())]);
    let (ending, record) = run(&e, &up, "read").await;
    assert!(matches!(ending, Ending::GaveUp));
    assert!(up.calls("s/read").is_empty());
    assert_eq!(e.policy("s").unwrap().counters.attempts.load(Ordering::Relaxed), 0);
    assert_eq!(record.stopped.as_deref(), Some(CANCELLED));
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_past_the_deadline_is_not_waited_for() {
    let up =
        Script::new(&[("s/search", true)]).then("s/search", vec![tool_error("rate limited, retry after 600 seconds")]);
    let e = engine(&[server("s", RecoveryConfig { deadline_ms: Some(10_000), ..defaults() })]);
    let start = Instant::now();
    let (ending, record) = run(&e, &up, "search").await;
    assert!(matches!(ending, Ending::GaveUp));
    assert_eq!(Instant::now(), start, "gave up without waiting");
    assert!(record.stopped.unwrap().contains("past the call's deadline"));
}

#[tokio::test(start_paused = true)]
async fn no_attempt_outlives_the_deadline() {
    let mut r = defaults();
    r.deadline_ms = Some(2_500);
    r.retry.max_attempts = 10;
    r.retry.initial_delay_ms = 10;
    let up = Script::new(&[("s/read", true)]).then("s/read", (0..10).map(|_| timeout()).collect());
    let e = engine(&[server("s", r)]);
    let start = Instant::now();
    let (ending, _) = run(&e, &up, "read").await;
    assert!(matches!(ending, Ending::GaveUp));
    let deadline = start + Duration::from_millis(2_500);
    for (at, timeout, _) in up.calls("s/read") {
        assert!(at + timeout <= deadline, "an attempt at {:?} with {timeout:?} ran past the deadline", at - start);
    }
    assert!(Instant::now() <= deadline);
}

#[tokio::test(start_paused = true)]
async fn a_tools_own_error_is_passed_through_untouched() {
    let up = Script::new(&[("s/read", true)]).then("s/read", vec![tool_error("no such file: a.lean")]);
    let e = engine(&[server("s", defaults())]);
    let (ending, record) = run(&e, &up, "read").await;
    assert_eq!(answered(&ending), "no such file: a.lean");
    assert_eq!(record.attempts.len(), 1);
    assert_eq!(e.policy("s").unwrap().breakers.server.snapshot().consecutive_failures, 0);
}

/// A call resumed with the client's answers to its server's questions goes to the tool
/// called alone: it is retried as any call is, but no fallback, configured or planned,
/// answers it (none asked those questions).
#[tokio::test(start_paused = true)]
async fn a_resumed_call_is_answered_by_its_own_tool_alone() {
    let mut r = defaults();
    r.fallbacks.insert("leansearch".into(), vec![Alternative { tool: "loogle".into(), server: None, arguments: None }]);
    let script = || {
        Script { alone: true, ..Script::new(&[("s/leansearch", true), ("s/loogle", true)]) }
            .then("s/leansearch", vec![timeout(), timeout(), timeout(), tool_error("API error 500")])
    };
    let e = engine(&[server("s", r.clone())]);
    let up = script();
    let (ending, record) = run(&e, &up, "leansearch").await;
    assert!(up.calls("s/loogle").is_empty(), "a fallback answered a resumed call: {record:?}");
    assert!(up.calls("s/leansearch").len() > 1, "a resumed call is retried as any is");
    assert!(record.answered_by().is_none(), "{ending:?}");
    let up = script();
    let (_, record) = advised(
        &e,
        &up,
        &planner(vec![Step::Alternative { server: None, tool: "loogle".into(), arguments: None }]),
        "leansearch",
    )
    .await;
    assert!(up.calls("s/loogle").is_empty(), "an adapter's alternative answered a resumed call: {record:?}");
    // Nor is time kept for the fallbacks that will not run: with 70 s left after the
    // first timeout, a retry (60 s) fits, where the fallback's 60 s would not fit too.
    let mut tight = r.clone();
    (tight.timeout_ms, tight.deadline_ms, tight.retry.initial_delay_ms, tight.retry.max_delay_ms) =
        (60_000, Some(130_000), 1, 1);
    let e = engine(&[server("s", tight)]);
    let up = script();
    run(&e, &up, "leansearch").await;
    assert!(up.calls("s/leansearch").len() > 1, "the retry is not refused for a fallback's sake");
    // The same call, not resumed, goes on to its fallback.
    let up = Script { alone: false, ..script() };
    let e = engine(&[server("s", r.clone())]);
    let (_, record) = run(&e, &up, "leansearch").await;
    assert_eq!(up.calls("s/loogle").len(), 1, "{record:?}");
}

/// A tool's own error is a failure of the tool: its configured fallbacks run, with no
/// adapter or one that plans nothing, and the first that answers is the answer.
#[tokio::test(start_paused = true)]
async fn a_tools_own_error_goes_to_its_configured_fallbacks() {
    let mut r = defaults();
    r.fallbacks.insert("leansearch".into(), vec![Alternative { tool: "loogle".into(), server: None, arguments: None }]);
    let up = Script::new(&[("s/leansearch", true), ("s/loogle", true)])
        .then("s/leansearch", vec![tool_error("API error 500")])
        .then("s/loogle", vec![ok("found it")]);
    let e = engine(&[server("s", r.clone())]);
    let (ending, record) = run(&e, &up, "leansearch").await;
    assert_eq!(answered(&ending), "found it", "{record:?}");
    assert_eq!(record.answered_by().unwrap().tool, "loogle");
    assert_eq!(up.calls("s/leansearch").len(), 1, "a tool's own error is not retried");

    // With every fallback failing too (or none to be tried), the agent gets the tool's
    // own answer, structured content and all, and is told what was tried.
    let mut own = CallToolResult::error(vec![ContentBlock::text("API error 500")]);
    own.structured_content = Some(json!({"status": 500}));
    let up = Script::new(&[("s/leansearch", true), ("s/loogle", true)])
        .then("s/leansearch", vec![Err(Failure::ToolError { result: Box::new(own) })])
        .then("s/loogle", vec![tool_error("loogle is down")]);
    let e = engine(&[server("s", r.clone())]);
    let (ending, _) = advised(&e, &up, &planner(vec![]), "leansearch").await;
    let Ending::Answered(CallToolResponse::Complete(told)) = ending else { panic!("{ending:?}") };
    assert_eq!(up.calls("s/loogle").len(), 1);
    assert_eq!(told.structured_content, Some(json!({"status": 500})));
    let text = format!("{:?}", told.content);
    assert!(text.contains("API error 500"), "{text}");
    assert!(text.contains("tried too, and failed: `loogle` on `s` (tool_error: tool-execution)"), "{text}");
    // The SDKs' refusals of the arguments are the agent's to fix: no fallback gets them.
    for refusal in [
        "Input validation error: Invalid arguments for tool leansearch: expected string",
        "Error executing tool leansearch: 1 validation error for leansearchArguments",
        "Error executing tool leansearch: 2 validation errors for leansearchArguments",
    ] {
        let up =
            Script::new(&[("s/leansearch", true), ("s/loogle", true)]).then("s/leansearch", vec![tool_error(refusal)]);
        let (ending, _) = run(&e, &up, "leansearch").await;
        assert_eq!(answered(&ending), refusal);
        assert!(up.calls("s/loogle").is_empty(), "{refusal}");
    }
    // A tool's own words about validation are not an SDK's refusal of the arguments.
    let own_words = "Schema validation error: the `arguments` field of the proof is malformed";
    let up =
        Script::new(&[("s/leansearch", true), ("s/loogle", true)]).then("s/leansearch", vec![tool_error(own_words)]);
    let (_, record) = run(&e, &up, "leansearch").await;
    assert_eq!(up.calls("s/loogle").len(), 1, "{record:?}");
}

/// The report's `status` is `partial` when any attempt may have run, not only the last:
/// a read that timed out, then failed outright, may have been read.
#[tokio::test(start_paused = true)]
async fn the_report_says_partial_when_any_attempt_may_have_run() {
    let boom = || Err(Failure::Rpc { code: -32603, message: "boom".into(), data: None });
    let status = |record: &Record| {
        let told = report::gave_up(record, &crate::redact::Secrets::default());
        told.meta.unwrap().0["rebound"]["status"].as_str().unwrap().to_owned()
    };
    let e = engine(&[server("s", defaults())]);
    let up = Script::new(&[("s/read", true)]).then("s/read", vec![boom()]);
    assert_eq!(status(&run(&e, &up, "read").await.1), "failed", "refused outright");
    let up = Script::new(&[("s/read", true)]).then("s/read", vec![timeout(), boom()]);
    let (ending, record) = run(&e, &up, "read").await;
    assert!(matches!(ending, Ending::GaveUp));
    assert_eq!(status(&record), "partial", "{record:?}");
    // An answer dropped for its size: the tool ran.
    let dropped = Some(json!({ crate::transport::lines::DROPPED_ANSWER: 64 }));
    let up = Script::new(&[("s/read", true)])
        .then("s/read", vec![Err(Failure::Rpc { code: -32603, message: "too long".into(), data: dropped })]);
    assert_eq!(status(&run(&e, &up, "read").await.1), "partial");
    // Answered with what is not a tool's result: the server had the request.
    let odd = Err(Failure::Protocol { reason: "answered with a task nobody asked for".into() });
    let up = Script::new(&[("s/read", true)]).then("s/read", vec![odd]);
    assert_eq!(status(&run(&e, &up, "read").await.1), "partial");
}

/// A tool's own error answered after an earlier attempt failed carries the report too:
/// what was tried, and that the timed-out attempt may have run.
#[tokio::test(start_paused = true)]
async fn a_tools_own_error_after_a_failed_attempt_says_what_was_tried() {
    let e = engine(&[server("s", defaults())]);
    let up = Script::new(&[("s/read", true)]).then("s/read", vec![timeout(), tool_error("no such page")]);
    let (ending, record) = run(&e, &up, "read").await;
    let Ending::Answered(CallToolResponse::Complete(own)) = ending else { panic!("the tool's own answer") };
    let told = report::recovered(own, &record, &crate::redact::Secrets::default());
    assert_eq!(told.is_error, Some(true));
    let meta = &told.meta.unwrap().0["rebound"];
    assert_eq!((meta["status"].as_str(), meta["retries"].as_u64()), (Some("partial"), Some(1)), "{meta}");
    assert_eq!(meta["attempts"].as_array().map(Vec::len), Some(2), "{meta}");
}

/// An adapter that calls a timeout a tool's own failure (to stop its retries) cannot make
/// the report say the call did not run: the gateway's own classification says it may have.
#[tokio::test(start_paused = true)]
async fn an_adapter_cannot_report_a_call_that_may_have_run_as_failed() {
    let up = Script::new(&[("s/send", false)]).then("s/send", vec![timeout()]);
    let e = engine(&[server("s", defaults())]);
    let mut reclassify =
        classify(&Failure::Timeout { after: Duration::from_secs(1) }, std::time::SystemTime::UNIX_EPOCH);
    (reclassify.category, reclassify.retryable) = (Category::ToolExecution, false);
    let a = Planner { reclassify: Some(reclassify), ..planner(vec![]) };
    let (ending, record) = advised(&e, &up, &a, "send").await;
    assert!(matches!(ending, Ending::GaveUp));
    assert_eq!(record.attempts[0].classification.as_ref().unwrap().category, Category::ToolExecution, "it was asked");
    let told = report::gave_up(&record, &crate::redact::Secrets::default());
    assert_eq!(told.meta.unwrap().0["rebound"]["status"], "partial", "{record:?}");
}

/// A call the client cancels while its fallback runs ends cancelled, not answered with
/// the tool's own error.
#[tokio::test(start_paused = true)]
async fn a_call_cancelled_during_its_fallback_is_not_answered_with_the_tools_error() {
    let mut r = defaults();
    r.fallbacks.insert("a".into(), vec![Alternative { tool: "b".into(), server: None, arguments: None }]);
    let up =
        Script::new(&[("s/a", true), ("s/b", true)]).then("s/a", vec![tool_error("no")]).then("s/b", vec![timeout()]);
    let e = engine(&[server("s", r)]);
    let cancel = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        up.cancelled.cancel();
    };
    let ((ending, _), ()) = tokio::join!(run(&e, &up, "a"), cancel);
    assert!(matches!(ending, Ending::GaveUp), "{ending:?}");
}

#[tokio::test(start_paused = true)]
async fn invalid_arguments_are_neither_retried_nor_sent_elsewhere() {
    let mut r = defaults();
    r.fallbacks.insert("read".into(), vec![Alternative { tool: "other".into(), server: None, arguments: None }]);
    let up = Script::new(&[("s/read", true), ("s/other", true)])
        .then("s/read", vec![Err(Failure::Rpc { code: -32602, message: "bad".into(), data: None })]);
    let e = engine(&[server("s", r)]);
    assert!(matches!(run(&e, &up, "read").await.0, Ending::GaveUp));
    assert_eq!(up.calls("s/read").len() + up.calls("s/other").len(), 1);
}

#[tokio::test(start_paused = true)]
async fn alternatives_are_tried_in_order_with_mapped_arguments() {
    let mut r = defaults();
    r.fallbacks.insert(
        "leansearch".into(),
        vec![
            Alternative { tool: "gone".into(), server: None, arguments: None },
            Alternative {
                tool: "loogle".into(),
                server: None,
                arguments: Some(json!({"query": "$q", "num_results": "$n"}).as_object().unwrap().clone()),
            },
            Alternative { tool: "finder".into(), server: Some("t".into()), arguments: None },
        ],
    );
    let up = Script::new(&[("s/leansearch", true), ("s/loogle", true), ("t/finder", true)])
        .then("s/leansearch", vec![timeout(), timeout(), timeout()])
        .then("s/loogle", vec![Err(Failure::Rpc { code: -32001, message: "AbortError".into(), data: None })]);
    let e = engine(&[server("s", r), server("t", defaults())]);
    let (ending, record) = run(&e, &up, "leansearch").await;
    assert_eq!(answered(&ending), "ok");
    let by = record.answered_by().unwrap();
    assert_eq!((&*by.server, by.tool.as_str(), by.role), ("t", "finder", Role::Alternative));
    assert_eq!(up.calls("s/loogle")[0].2, Some(json!({"query": "x", "num_results": 3}).as_object().unwrap().clone()));
    assert_eq!(up.calls("t/finder")[0].2, Some(json!({"q": "x", "n": 3}).as_object().unwrap().clone()));
}

#[tokio::test(start_paused = true)]
async fn an_open_breaker_sheds_calls_without_upstream_traffic_and_closes_when_the_server_is_back() {
    let mut r = defaults();
    r.breaker.open_ms = 5_000;
    r.retry.max_attempts = 1;
    let up = Script::new(&[("s/read", true)]).then(
        "s/read",
        (0..5).map(|_| Err(Failure::ConnectionLost { reason: "down".into(), session: None })).collect(),
    );
    let e = engine(&[server("s", r)]);
    for _ in 0..100 {
        run(&e, &up, "read").await;
    }
    assert_eq!(up.calls("s/read").len(), 5, "only the failures that opened it reached the server");
    assert_eq!(e.policy("s").unwrap().counters.shed.load(Ordering::Relaxed), 95);
    tokio::time::advance(Duration::from_secs(5)).await;
    assert_eq!(answered(&run(&e, &up, "read").await.0), "ok");
    assert_eq!(answered(&run(&e, &up, "read").await.0), "ok");
    assert_eq!(e.policy("s").unwrap().breakers.server.snapshot().state, "closed");
}

#[tokio::test(start_paused = true)]
async fn the_budget_keeps_an_outage_from_multiplying_load() {
    let mut r = defaults();
    r.breaker.failure_threshold = u32::MAX; // isolate the budget from the breaker
    r.breaker.min_calls = u32::MAX;
    r.retry.initial_delay_ms = 1;
    let up = Script::new(&[("s/read", true)]).then(
        "s/read",
        (0..1000).map(|_| Err(Failure::ConnectionLost { reason: "down".into(), session: None })).collect(),
    );
    let e = engine(&[server("s", r)]);
    for _ in 0..100 {
        run(&e, &up, "read").await;
    }
    let calls = up.calls("s/read").len();
    assert!(calls <= 100 + 10 + 30, "{calls} upstream calls for 100 client calls");
}

/// A failure that opens the server's breaker ends the call's retries there: the next
/// attempt would be shed, and no retry budget is spent on it.
#[tokio::test(start_paused = true)]
async fn no_retry_is_spent_on_an_attempt_a_breaker_would_refuse() {
    let mut r = defaults();
    r.breaker.failure_threshold = 1;
    let up = Script::new(&[("s/read", true)]).then("s/read", vec![timeout(), ok("second time")]);
    let e = engine(&[server("s", r)]);
    let (ending, record) = run(&e, &up, "read").await;
    assert_eq!(answered(&ending), "gave up");
    assert_eq!(up.calls("s/read").len(), 1);
    let policy = e.policy("s").unwrap();
    assert_eq!(policy.budget.tokens(), f64::from(RecoveryConfig::default().retry.budget_reserve.max(1)));
    assert_eq!(policy.counters.shed.load(Ordering::Relaxed), 0, "no attempt was shed");
    assert_eq!(policy.counters.retries.load(Ordering::Relaxed), 0);
    let stopped = record.stopped.unwrap();
    assert!(stopped.contains("the server's circuit breaker is open"), "{stopped}");
    // An adapter's step on the server is skipped as well, before it takes a token.
    let mut r = defaults();
    r.breaker.failure_threshold = 1;
    let up = Script::new(&[("s/read", true), ("s/b", true)]).then("s/read", vec![timeout()]);
    let e = engine(&[server("s", r)]);
    let side = Step::SideCall { tool: "b".into(), arguments: JsonObject::new() };
    let (_, record) = advised(&e, &up, &planner(vec![side]), "read").await;
    assert!(up.calls("s/b").is_empty());
    let policy = e.policy("s").unwrap();
    assert_eq!(policy.budget.tokens(), f64::from(RecoveryConfig::default().retry.budget_reserve.max(1)));
    let stopped = record.stopped.unwrap();
    assert!(stopped.contains("`s/b` was skipped: the server's circuit breaker is open"), "{stopped}");
}

/// A configured fallback its server does not offer now (its server has had no session
/// yet) is not tried, and the report says so and why.
#[tokio::test(start_paused = true)]
async fn a_fallback_its_server_does_not_offer_is_reported_not_tried() {
    let mut r = one_attempt();
    r.fallbacks.insert("a".into(), vec![Alternative { tool: "b".into(), server: Some("t".into()), arguments: None }]);
    let up = Script::new(&[("s/a", true)]).then("s/a", vec![timeout()]);
    let e = engine(&[server("s", r), server("t", defaults())]);
    let (ending, record) = run(&e, &up, "a").await;
    assert_eq!(answered(&ending), "gave up");
    let expected = NotTried { server: "t".into(), tool: "b".into(), why: Unoffered::NoSuchTool };
    assert_eq!(record.not_tried, vec![expected]);
    let result = report::gave_up(&record, &crate::redact::Secrets::default());
    let text = &result.content[0].as_text().unwrap().text;
    assert!(text.contains("Not tried: `b` on `t` (the server does not offer it)."), "{text}");
    let data = &result.meta.unwrap()["rebound"];
    assert_eq!(data["not_tried"], json!([{"server": "t", "tool": "b", "why": "no_such_tool"}]));
    // The next fallback answers: the report of the recovered call names the one skipped.
    let mut r = one_attempt();
    let skipped = Alternative { tool: "b".into(), server: Some("t".into()), arguments: None };
    r.fallbacks.insert("a".into(), vec![skipped, Alternative { tool: "c".into(), server: None, arguments: None }]);
    let up = Script::new(&[("s/a", true), ("s/c", true)]).then("s/a", vec![timeout()]);
    let e = engine(&[server("s", r), server("t", defaults())]);
    let (ending, record) = run(&e, &up, "a").await;
    let Ending::Answered(CallToolResponse::Complete(result)) = ending else { panic!("answered") };
    let told = report::recovered(result, &record, &crate::redact::Secrets::default());
    assert_eq!(told.meta.unwrap()["rebound"]["not_tried"][0]["tool"], "b");
    // A tool's own error, its fallback not offered: the note on it says so.
    let mut r = one_attempt();
    r.fallbacks.insert("a".into(), vec![Alternative { tool: "b".into(), server: Some("t".into()), arguments: None }]);
    let up = Script::new(&[("s/a", true)]).then("s/a", vec![tool_error("no such file")]);
    let e = engine(&[server("s", r), server("t", defaults())]);
    let (ending, record) = run(&e, &up, "a").await;
    let Ending::Answered(CallToolResponse::Complete(own)) = ending else { panic!("answered") };
    let note = own.content.iter().filter_map(|c| c.as_text()).map(|t| t.text.as_str()).collect::<Vec<_>>().join("\n");
    assert!(note.contains("not tried: `b` on `t` (the server does not offer it)"), "{note}");
    let told = report::recovered(own, &record, &crate::redact::Secrets::default());
    assert_eq!(told.meta.unwrap()["rebound"]["not_tried"][0]["server"], "t");
}

/// An adapter's step naming a tool outside its grant is denied as such, whether or not
/// the tool is offered now; one it may take but that is not offered is noted once,
/// however many times a plan names it.
#[tokio::test(start_paused = true)]
async fn an_adapters_step_not_offered_is_denied_first_and_noted_once() {
    let up = Script::new(&[("s/read", true)]).then("s/read", vec![timeout(); 3]);
    let e = engine(&[server("s", defaults()), server("t", defaults())]);
    let outside = Step::Alternative { server: Some("t".into()), tool: "x".into(), arguments: None };
    let gone = Step::Alternative { server: None, tool: "gone".into(), arguments: None };
    let plan = vec![outside, gone.clone(), gone, Step::Retry(None)];
    let a = Planner { plan, reclassify: None, observed: Mutex::default(), consulted: Default::default() };
    let (_, record) = advised(&e, &up, &a, "read").await;
    assert_eq!(record.denied, [Denied { denial: Denial::Grant, target: "t/x".into() }]);
    let expected = NotTried { server: "s".into(), tool: "gone".into(), why: Unoffered::NoSuchTool };
    assert_eq!(record.not_tried, [expected]);
}

/// An advisor with a fixed plan, recording what it observed.
struct Planner {
    plan: Vec<Step>,
    reclassify: Option<Classification>,
    observed: Mutex<Vec<String>>,
    /// How many failures it was asked to classify.
    consulted: std::sync::atomic::AtomicU32,
}

impl Advisor for Planner {
    fn classify(&self, _: &FailureContext<'_>, _: &Classification) -> BoxFuture<'static, Option<Classification>> {
        self.consulted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let c = self.reclassify.clone();
        Box::pin(async move { c })
    }

    fn plan(&self, f: &FailureContext<'_>, _: &Classification) -> BoxFuture<'static, Option<Advice>> {
        // Plans only for the first failure, like lean-fallback's "retry once".
        let p = Some((if f.attempt == 1 { self.plan.clone() } else { vec![] }).into());
        Box::pin(async move { p })
    }

    fn observe(&self, call: &Completed<'_>) -> BoxFuture<'static, ()> {
        let by = if call.arguments_by == ArgumentsBy::Adapter { " (the adapter's arguments)" } else { "" };
        self.observed.lock().unwrap().push(format!("{}/{}{by}", call.server, call.tool));
        Box::pin(async {})
    }
}

fn planner(plan: Vec<Step>) -> Planner {
    Planner { plan, reclassify: None, observed: Mutex::default(), consulted: Default::default() }
}

/// A call the client cancelled ends without its adapter being asked anything: no
/// classification, no plan, however the attempt failed.
#[tokio::test(start_paused = true)]
async fn a_call_the_client_cancelled_does_not_consult_its_adapter() {
    let up = Script::new(&[("s/read", true)]).then("s/read", vec![timeout()]);
    let e = engine(&[server("s", defaults())]);
    let advisor = planner(vec![Step::Retry(None)]);
    let cancel = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        up.cancelled.cancel();
    };
    let ((ending, record), ()) = tokio::join!(advised(&e, &up, &advisor, "read"), cancel);
    assert!(matches!(ending, Ending::GaveUp));
    assert_eq!(record.stopped.as_deref(), Some(CANCELLED));
    assert_eq!(advisor.consulted.load(std::sync::atomic::Ordering::Relaxed), 0);
    assert_eq!(up.calls("s/read").len(), 1);
}

/// An adapter that says each failure never reached the server (and worth retrying), and
/// plans `plan`.
fn never_delivered(plan: Vec<Step>) -> Planner {
    let mut lost = classify(&tool_error("x").unwrap_err(), std::time::SystemTime::UNIX_EPOCH);
    lost.retryable = true;
    lost.not_delivered = true;
    Planner { plan, reclassify: Some(lost), observed: Mutex::default(), consulted: Default::default() }
}

async fn advised(e: &Engine, up: &Script, advisor: &Planner, tool: &str) -> (Ending, Record) {
    let annotations = up.annotations("s", tool).ok().flatten();
    e.run(
        up,
        Some(advisor),
        "s".into(),
        tool.into(),
        annotations.as_ref(),
        Some(json!({"session": "main"}).as_object().unwrap().clone()),
    )
    .await
}

#[tokio::test(start_paused = true)]
async fn a_plan_can_interrupt_and_give_up_without_replaying() {
    let up = Script::new(&[("s/hol_send", false), ("s/hol_interrupt", false)]).then("s/hol_send", vec![timeout()]);
    let e = engine(&[server("s", defaults())]);
    let a = planner(vec![
        Step::Retry(None), // not safe: the engine skips it
        Step::SideCall {
            tool: "hol_interrupt".into(),
            arguments: json!({"session": "main"}).as_object().unwrap().clone(),
        },
        Step::GiveUp("the tactic was interrupted; try a smaller step".into()),
    ]);
    let (ending, record) = advised(&e, &up, &a, "hol_send").await;
    assert!(matches!(ending, Ending::GaveUp));
    assert_eq!(up.calls("s/hol_send").len(), 1, "never replayed");
    assert_eq!(up.calls("s/hol_interrupt")[0].2, Some(json!({"session": "main"}).as_object().unwrap().clone()));
    assert_eq!(record.action.as_deref(), Some("the tactic was interrupted; try a smaller step"));
    assert_eq!(record.attempts.iter().map(|a| a.role).collect::<Vec<_>>(), [Role::Primary, Role::SideCall]);
    assert_eq!(*a.observed.lock().unwrap(), ["s/hol_interrupt (the adapter's arguments)"]);
}

/// The upstream is told what each attempt is to the client's call: only the primary may
/// answer with what goes to the client as it is (a question, a task), so an adapter's
/// side call of the very tool called is still a side call.
#[tokio::test(start_paused = true)]
async fn each_attempt_says_what_it_is_to_the_clients_call() {
    let up = Script::new(&[("s/look", true), ("s/b", true)]).then("s/look", vec![timeout(), timeout(), timeout()]);
    let mut recovery = defaults();
    recovery.retry.max_attempts = 1;
    let e = engine(&[server("s", recovery)]);
    let a = planner(vec![
        Step::SideCall { tool: "look".into(), arguments: JsonObject::new() },
        Step::Alternative { server: None, tool: "b".into(), arguments: None },
    ]);
    let (ending, _) = advised(&e, &up, &a, "look").await;
    assert_eq!(answered(&ending), "ok");
    let roles = up.roles.lock().unwrap().clone();
    let expected = [("s/look", Role::Primary), ("s/look", Role::SideCall), ("s/b", Role::Alternative)];
    assert_eq!(roles, expected.map(|(t, r)| (t.to_owned(), r)));
    // The advisor is told whose arguments each successful call carried: an alternative
    // without arguments of the plan's own carries the client's.
    assert_eq!(*a.observed.lock().unwrap(), ["s/b"]);
    let up = Script::new(&[("s/look", true), ("s/b", true)]).then("s/look", vec![timeout()]);
    let a = planner(vec![Step::Alternative { server: None, tool: "b".into(), arguments: Some(JsonObject::new()) }]);
    assert_eq!(answered(&advised(&e, &up, &a, "look").await.0), "ok");
    assert_eq!(*a.observed.lock().unwrap(), ["s/b (the adapter's arguments)"]);
}

#[tokio::test(start_paused = true)]
async fn an_adapter_that_proves_non_delivery_makes_a_replay_safe() {
    let up = Script::new(&[("s/hol_send", false), ("s/hol_start", false)])
        .then("s/hol_send", vec![tool_error("Session 'main' not found")]);
    let e = engine(&[server("s", defaults())]);
    let a = never_delivered(vec![
        Step::SideCall {
            tool: "hol_start".into(),
            arguments: json!({"workdir": "/w", "name": "main"}).as_object().unwrap().clone(),
        },
        Step::Retry(Some(Duration::ZERO)),
    ]);
    let (ending, record) = advised(&e, &up, &a, "hol_send").await;
    assert_eq!(answered(&ending), "ok");
    assert_eq!(up.calls("s/hol_send").len(), 2);
    assert!(record.recovered());
    assert_eq!(*a.observed.lock().unwrap(), ["s/hol_start (the adapter's arguments)", "s/hol_send"]);
}

#[tokio::test(start_paused = true)]
async fn a_plan_can_restart_the_server_and_name_alternatives_with_their_arguments() {
    let up = Script::new(&[("s/a", true), ("s/b", true)]).then("s/a", vec![timeout(), timeout()]);
    let mut s = server("s", defaults());
    s.adapter_allow.restart = true;
    let e = engine(&[s]);
    let a = planner(vec![
        Step::Restart,
        Step::Alternative {
            server: None,
            tool: "b".into(),
            arguments: Some(json!({"x": 1}).as_object().unwrap().clone()),
        },
    ]);
    let (ending, record) = advised(&e, &up, &a, "a").await;
    assert_eq!(answered(&ending), "ok");
    assert_eq!(up.calls("s/<restart>").len(), 1);
    assert_eq!(up.calls("s/b")[0].2, Some(json!({"x": 1}).as_object().unwrap().clone()));
    assert_eq!(record.answered_by().unwrap().role, Role::Alternative);
}

#[tokio::test(start_paused = true)]
async fn a_plan_can_turn_a_tool_error_into_an_alternative() {
    let up =
        Script::new(&[("s/diag", true), ("s/goal", true)]).then("s/diag", vec![tool_error("diagnostics are blocked")]);
    let e = engine(&[server("s", defaults())]);
    let a = planner(vec![Step::Alternative { server: None, tool: "goal".into(), arguments: None }]);
    let (ending, _) = advised(&e, &up, &a, "diag").await;
    assert_eq!(answered(&ending), "ok");
    assert_eq!(up.calls("s/goal").len(), 1);
}

fn unavailable() -> Result<CallToolResponse, Failure> {
    tool_error("upstream answered 503 Service Unavailable")
}

/// An attempt the call's deadline left less than half the time its configuration allows
/// it, which then ran out of time, says nothing of the server: it does not count for the
/// breakers. One given at least half does.
#[tokio::test(start_paused = true)]
async fn a_timeout_the_deadline_cut_short_does_not_count_against_the_server() {
    // (A deadline configured shorter than the timeout is all an attempt is allowed: one
    // given the whole of it counts.)
    for (deadline_ms, spent_ms, counts) in [(1000, 0, true), (1000, 300, true), (1000, 800, false), (200, 0, true)] {
        let mut r = one_attempt();
        (r.timeout_ms, r.deadline_ms, r.breaker.failure_threshold) = (500, Some(deadline_ms), 1);
        let up = Script::new(&[("s/read", true)]).then("s/read", vec![timeout(), ok("up")]);
        let e = engine(&[server("s", r)]);
        let policy = e.policy("s").unwrap();
        let call = (&up, policy, ("s", "read", Role::Primary, Blame::Server));
        let deadline = tokio::time::Instant::now() + Duration::from_millis(deadline_ms - spent_ms);
        let _ = e.attempt(call.0, call.1, call.2, &None, Duration::from_millis(500), deadline).await;
        let (ending, _) = run(&e, &up, "read").await;
        let open = up.calls("s/read").len() == 1;
        assert_eq!(open, counts, "{spent_ms} ms of {deadline_ms} spent: {}", answered(&ending));
    }
}

/// The same when the time went waiting for the server within the attempt (a restart under
/// way): the server had only what was left of it.
#[tokio::test(start_paused = true)]
async fn a_timeout_cut_short_by_a_wait_for_the_server_does_not_count_against_it() {
    for (waits_ms, counts) in [(59_000, false), (0, true), (20_000, true)] {
        let mut r = one_attempt();
        (r.timeout_ms, r.deadline_ms, r.breaker.failure_threshold) = (60_000, Some(80_000), 1);
        let mut up = Script::new(&[("s/read", true)]).then("s/read", vec![timeout()]);
        up.waits = Duration::from_millis(waits_ms);
        let e = engine(&[server("s", r)]);
        let _ = run(&e, &up, "read").await;
        let state = e.policy("s").unwrap().breakers.server.snapshot().state;
        assert_eq!(state == "open", counts, "after a wait of {waits_ms} ms: {state}");
    }
}

fn one_attempt() -> RecoveryConfig {
    let mut r = defaults();
    r.retry.max_attempts = 1;
    r.breaker.open_ms = 5_000;
    r.breaker.max_open_ms = 5_000;
    r
}

#[tokio::test(start_paused = true)]
async fn an_outage_reported_as_tool_errors_opens_the_servers_breaker() {
    let up = Script::new(&[("s/a", true), ("s/b", true)]).then("s/a", (0..100).map(|_| unavailable()).collect());
    let e = engine(&[server("s", one_attempt())]);
    for _ in 0..100 {
        let (ending, _) = run(&e, &up, "a").await;
        assert!(matches!(ending, Ending::GaveUp));
    }
    assert_eq!(up.calls("s/a").len(), 5, "shed after the threshold");
    let policy = e.policy("s").unwrap();
    assert_eq!(policy.breakers.server.snapshot().state, "open", "nothing showed the server was up");
    // The attempts made failed; the calls shed are counted as shed, not as failures.
    let count = |counter: &std::sync::atomic::AtomicU64| counter.load(std::sync::atomic::Ordering::Relaxed);
    let counters = &policy.counters;
    assert_eq!((count(&counters.attempts), count(&counters.failures), count(&counters.shed)), (5, 5, 95));
    // Shed at once, without a call, for every tool of the server.
    let (_, record) = run(&e, &up, "b").await;
    assert!(matches!(record.last_failure(), Some((Failure::CircuitOpen { tool: None, .. }, _))));
    assert!(up.calls("s/b").is_empty());
    // Closed again once the server answers, within the open time.
    tokio::time::advance(Duration::from_secs(5)).await;
    up.answers.lock().unwrap().clear();
    assert_eq!(answered(&run(&e, &up, "a").await.0), "ok");
    assert_eq!(answered(&run(&e, &up, "a").await.0), "ok");
    assert_eq!(policy.breakers.server.snapshot().state, "closed");
}

/// On a server many clients share, one client whose calls fail as an outage (its
/// arguments make the server report one, say) is shed alone; the others' calls go on.
#[tokio::test(start_paused = true)]
async fn one_clients_outage_sheds_its_own_calls_alone() {
    let up = Script::new(&[("s/a", true)]).then("s/a", (0..100).map(|_| unavailable()).collect());
    let e = engine(&[server("s", one_attempt())]);
    *up.client.lock().unwrap() = Some(1);
    for _ in 0..20 {
        run(&e, &up, "a").await;
    }
    assert_eq!(up.calls("s/a").len(), 5, "shed after the threshold");
    let (_, record) = run(&e, &up, "a").await;
    let (failure, class) = record.last_failure().unwrap();
    assert!(matches!(failure, Failure::CircuitOpen { own: true, .. }), "{failure:?}");
    let advice = report::suggested_action(&record.server, &record.tool, failure, class);
    assert!(advice.contains("this client's own calls of `a`"), "{advice}");
    let policy = e.policy("s").unwrap();
    assert_eq!(policy.breakers.server.snapshot().state, "closed");
    assert_eq!(policy.breakers.own(1).unwrap().snapshot().state, "open");
    // Another client's call is made, and answered.
    up.answers.lock().unwrap().clear();
    *up.client.lock().unwrap() = Some(2);
    assert_eq!(answered(&run(&e, &up, "a").await.0), "ok");
    assert_eq!(up.calls("s/a").len(), 6);
}

/// On a server many clients share, one client whose calls keep failing spends its own
/// retry budget and half the reserve: another client's failure is still retried.
#[tokio::test(start_paused = true)]
async fn one_clients_failures_leave_the_others_their_retries() {
    let mut r = defaults();
    (r.retry.budget_reserve, r.retry.budget_ratio, r.retry.max_attempts) = (4, 0.0, 3);
    (r.breaker.failure_threshold, r.breaker.min_calls) = (u32::MAX, u32::MAX);
    let up = Script::new(&[("s/read", true)]).then("s/read", (0..100).map(|_| timeout()).collect());
    let e = engine(&[server("s", r)]);
    *up.client.lock().unwrap() = Some(1);
    for _ in 0..5 {
        run(&e, &up, "read").await;
    }
    assert_eq!(up.calls("s/read").len(), 5 + 2, "two retries, on its own budget");
    let (_, record) = run(&e, &up, "read").await;
    assert!(record.stopped.unwrap().contains("this client's retry budget"));
    up.answers.lock().unwrap().clear();
    *up.client.lock().unwrap() = Some(2);
    up.answers.lock().unwrap().entry("s/read".into()).or_default().push_back(timeout());
    let (ending, record) = run(&e, &up, "read").await;
    assert_eq!(answered(&ending), "ok", "{record:?}");
    assert_eq!(record.attempts.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_failure_confined_to_one_tool_trips_only_that_tools_breaker() {
    let up = Script::new(&[("s/a", true), ("s/b", true)]).then("s/a", (0..100).map(|_| timeout()).collect());
    let e = engine(&[server("s", one_attempt())]);
    assert_eq!(answered(&run(&e, &up, "b").await.0), "ok");
    for _ in 0..20 {
        run(&e, &up, "a").await;
        // The rest of the server keeps answering.
        assert_eq!(answered(&run(&e, &up, "b").await.0), "ok");
    }
    assert_eq!(up.calls("s/a").len(), 5);
    assert_eq!(up.calls("s/b").len(), 21);
    let policy = e.policy("s").unwrap();
    assert_eq!(policy.breakers.server.snapshot().state, "closed");
    let troubled = policy.breakers.tools.troubled();
    assert_eq!((troubled[0].0.as_str(), troubled[0].1.state), ("a", "open"));
    let (_, record) = run(&e, &up, "a").await;
    assert!(
        matches!(record.last_failure(), Some((Failure::CircuitOpen { tool: Some(t), .. }, _)) if t == "a"),
        "{record:?}"
    );
}

/// The evidence that the server is up is another tool's answer within the breaker's
/// window (`window_ms`), however long or short the failing tool's timeout.
#[tokio::test(start_paused = true)]
async fn another_tools_answer_within_the_window_confines_a_failure() {
    let mut r = one_attempt();
    r.timeout_ms = 5_000;
    r.breaker.window_ms = 60_000;
    let up = Script::new(&[("s/a", true), ("s/b", true)]).then("s/a", (0..100).map(|_| timeout()).collect());
    let e = engine(&[server("s", r.clone())]);
    assert_eq!(answered(&run(&e, &up, "b").await.0), "ok");
    tokio::time::advance(Duration::from_secs(10)).await;
    for _ in 0..5 {
        run(&e, &up, "a").await; // 5 s each: the last ends 35 s after `b` answered
    }
    assert_eq!(e.policy("s").unwrap().breakers.server.snapshot().state, "closed", "`b` answered within the window");
    // Past the window, nothing shows the server is up: the failures count for it.
    let e = engine(&[server("s", r)]);
    assert_eq!(answered(&run(&e, &up, "b").await.0), "ok");
    tokio::time::advance(Duration::from_secs(61)).await;
    for _ in 0..5 {
        run(&e, &up, "a").await;
    }
    assert_eq!(e.policy("s").unwrap().breakers.server.snapshot().state, "open");
}

#[tokio::test(start_paused = true)]
async fn failures_across_tools_shed_the_server() {
    let up = Script::new(&[("s/a", true), ("s/b", true), ("s/c", true)])
        .then("s/a", (0..100).map(|_| timeout()).collect())
        .then("s/b", (0..100).map(|_| timeout()).collect());
    let e = engine(&[server("s", one_attempt())]);
    for tool in ["a", "b", "a", "b", "a"] {
        run(&e, &up, tool).await;
    }
    assert_eq!(e.policy("s").unwrap().breakers.server.snapshot().state, "open");
    run(&e, &up, "c").await;
    assert!(up.calls("s/c").is_empty());
}

#[tokio::test(start_paused = true)]
async fn undelivered_calls_count_for_the_server_not_the_tool() {
    let up = Script::new(&[("s/a", true)])
        .then("s/a", (0..5).map(|_| Err(Failure::SendFailed { reason: "pipe".into() })).collect());
    let mut r = one_attempt();
    r.breaker.failure_threshold = 3;
    let e = engine(&[server("s", r)]);
    for _ in 0..3 {
        run(&e, &up, "a").await;
    }
    let policy = e.policy("s").unwrap();
    assert_eq!(policy.breakers.server.snapshot().state, "open");
    assert!(policy.breakers.tools.troubled().is_empty(), "{:?}", policy.breakers.tools.troubled());
}

/// Retries that could use up the deadline give way to the fallback, which always runs:
/// with 1 s attempts and a 2.5 s deadline, a second attempt of the tool would leave the
/// fallback 0.5 s of the 1 s it may take.
#[tokio::test(start_paused = true)]
async fn retries_leave_the_configured_fallback_its_time() {
    let mut r = RecoveryConfig { deadline_ms: Some(2_500), ..defaults() };
    r.fallbacks.insert("a".into(), vec![Alternative { tool: "b".into(), server: None, arguments: None }]);
    let up = Script::new(&[("s/a", true), ("s/b", true)])
        .then("s/a", vec![timeout(); 3])
        .then("s/b", vec![timeout(), ok("b answered")]);
    let e = engine(&[server("s", r.clone())]);
    let (ending, record) = run(&e, &up, "a").await;
    assert_eq!(answered(&ending), "gave up");
    assert_eq!(up.calls("s/a").len(), 1);
    let b = up.calls("s/b");
    assert_eq!(b.len(), 1);
    assert_eq!(b[0].1, Duration::from_secs(1), "the fallback had its whole timeout");
    assert!(record.attempts.iter().any(|a| a.tool == "b"));
    // With room for both, the tool is retried first, and the fallback still has its time.
    let r = RecoveryConfig { deadline_ms: Some(4_000), ..r };
    let up = Script::new(&[("s/a", true), ("s/b", true)]).then("s/a", vec![timeout(); 3]);
    let e = engine(&[server("s", r)]);
    let (ending, _) = run(&e, &up, "a").await;
    assert_eq!(answered(&ending), "ok");
    assert_eq!((up.calls("s/a").len(), up.calls("s/b").len()), (2, 1));
    // A fallback the server does not offer is skipped, and reserves nothing.
    let mut r = RecoveryConfig { deadline_ms: Some(2_500), ..defaults() };
    r.fallbacks.insert("a".into(), vec![Alternative { tool: "gone".into(), server: None, arguments: None }]);
    let up = Script::new(&[("s/a", true)]).then("s/a", vec![timeout(), ok("second time")]);
    let (ending, _) = run(&engine(&[server("s", r)]), &up, "a").await;
    assert_eq!(answered(&ending), "second time");
    // By default the deadline holds every attempt and the fallbacks' time besides.
    let mut r = defaults();
    r.fallbacks.insert("a".into(), vec![Alternative { tool: "b".into(), server: None, arguments: None }]);
    let up = Script::new(&[("s/a", true), ("s/b", true)]).then("s/a", vec![timeout(); 3]);
    let (ending, _) = run(&engine(&[server("s", r)]), &up, "a").await;
    assert_eq!(answered(&ending), "ok");
    assert_eq!(up.calls("s/a").len(), 3, "every attempt was made");
    assert_eq!(up.calls("s/b")[0].1, Duration::from_secs(1), "and the fallback had its whole timeout");
    // A fallback on another server is given that server's timeout, in the deadline too.
    let mut r = defaults();
    r.fallbacks
        .insert("a".into(), vec![Alternative { tool: "slow".into(), server: Some("t".into()), arguments: None }]);
    let up = Script::new(&[("s/a", true), ("t/slow", true)]).then("s/a", vec![timeout(); 3]);
    let slow = RecoveryConfig { timeout_ms: 120_000, ..defaults() };
    let (ending, _) = run(&engine(&[server("s", r), server("t", slow)]), &up, "a").await;
    assert_eq!(answered(&ending), "ok");
    assert_eq!(up.calls("s/a").len(), 3, "every attempt was made");
    assert_eq!(up.calls("t/slow")[0].1, Duration::from_secs(120), "and the fallback had its whole timeout");
}

#[tokio::test(start_paused = true)]
async fn configured_fallbacks_run_after_an_adapters_plan_and_before_its_give_up() {
    let mut r = defaults();
    r.fallbacks.insert("a".into(), vec![Alternative { tool: "b".into(), server: None, arguments: None }]);
    let up = Script::new(&[("s/a", true), ("s/b", true)]).then("s/a", vec![timeout(); 3]);
    let e = engine(&[server("s", r.clone())]);
    // The default adapter's kind of plan: retry, then give up with advice.
    let a = Planner {
        plan: vec![Step::Retry(None)],
        reclassify: None,
        observed: Mutex::default(),
        consulted: Default::default(),
    };
    let (ending, record) = advised(&e, &up, &a, "a").await;
    assert_eq!(answered(&ending), "ok", "{record:?}");
    assert_eq!(record.answered_by().unwrap().tool, "b");

    let up = Script::new(&[("s/a", true), ("s/b", true)])
        .then("s/a", vec![timeout()])
        .then("s/b", vec![Err(Failure::Rpc { code: -32603, message: "boom".into(), data: None })]);
    let e = engine(&[server("s", r)]);
    let a = planner(vec![Step::GiveUp("check the server's log".into())]);
    let (ending, record) = advised(&e, &up, &a, "a").await;
    assert!(matches!(ending, Ending::GaveUp));
    assert_eq!(up.calls("s/b").len(), 1, "the fallback ran before the give-up");
    assert_eq!(record.action.as_deref(), Some("check the server's log"));
}

/// A step of an adapter's own (here a side call of its whole timeout) is skipped when it
/// could take the time the configured fallback needs before the call's deadline: the
/// fallback still runs and answers.
#[tokio::test(start_paused = true)]
async fn an_adapters_step_leaves_the_configured_fallback_its_time() {
    let mut r = defaults();
    (r.timeout_ms, r.deadline_ms, r.retry.max_attempts) = (60_000, Some(100_000), 1);
    r.fallbacks.insert("a".into(), vec![Alternative { tool: "b".into(), server: None, arguments: None }]);
    let up = Script::new(&[("s/a", true), ("s/b", true), ("s/poke", true)]).then("s/a", vec![timeout()]);
    let e = engine(&[server("s", r)]);
    let a = planner(vec![Step::SideCall { tool: "poke".into(), arguments: JsonObject::new() }]);
    let (ending, record) = advised(&e, &up, &a, "a").await;
    assert_eq!(answered(&ending), "ok", "{record:?}");
    assert_eq!(record.answered_by().unwrap().tool, "b");
    assert_eq!(up.calls("s/poke").len(), 0, "60 s for it and 60 s for the fallback do not fit in 100 s");
}

/// An adapter's restart waits for the server to come back only as long as leaves the
/// configured fallback its time; with no time to spare, it is not made.
#[tokio::test(start_paused = true)]
async fn an_adapters_restart_leaves_the_configured_fallback_its_time() {
    for (deadline, waits) in [(150_000, Some(Duration::from_secs(30))), (100_000, None)] {
        let mut r = defaults();
        (r.timeout_ms, r.deadline_ms, r.retry.max_attempts) = (60_000, Some(deadline), 1);
        r.fallbacks.insert("a".into(), vec![Alternative { tool: "b".into(), server: None, arguments: None }]);
        let mut s = server("s", r);
        s.adapter_allow.restart = true;
        let e = engine(&[s]);
        let up = Script::new(&[("s/a", true), ("s/b", true)]).then("s/a", vec![timeout()]);
        let (ending, record) = advised(&e, &up, &planner(vec![Step::Restart]), "a").await;
        assert_eq!(record.answered_by().unwrap().tool, "b", "{ending:?} {record:?}");
        let restarts: Vec<Duration> = up.calls("s/<restart>").into_iter().map(|(_, within, _)| within).collect();
        assert_eq!(restarts, Vec::from_iter(waits), "deadline {deadline} ms");
    }
}

/// An upstream whose every call panics.
struct Panics;

impl Upstream for Panics {
    fn call(
        &self,
        _: &str,
        _: &str,
        _: Role,
        _: Option<JsonObject>,
        _: Duration,
        _: Duration,
    ) -> BoxFuture<'_, Result<CallToolResponse, Failure>> {
        Box::pin(async { panic!("a bug in the call path") })
    }

    fn annotations(&self, _: &str, _: &str) -> Result<Option<ToolAnnotations>, Unoffered> {
        Ok(None)
    }

    fn restart(&self, _: &str, _: Duration) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }

    fn cancellation(&self) -> &CancellationToken {
        static NEVER: std::sync::LazyLock<CancellationToken> = std::sync::LazyLock::new(CancellationToken::new);
        &NEVER
    }
}

#[tokio::test(start_paused = true)]
async fn a_panic_in_a_call_ends_the_call_with_an_internal_failure() {
    let e = engine(&[server("s", defaults())]);
    let (ending, record) = e.run(&Panics, None, "s".into(), "t".into(), None, None).await;
    assert!(matches!(ending, Ending::GaveUp));
    assert!(record.panicked());
    let (failure, class) = record.last_failure().unwrap();
    assert!(failure.message().contains("a bug in the call path"), "{}", failure.message());
    assert!(!class.retryable);
}

#[tokio::test(start_paused = true)]
async fn an_adapter_reaches_only_what_its_grant_names() {
    let up = Script::new(&[("s/a", true), ("s/b", true), ("t/x", false)]).then("s/a", vec![timeout()]);
    let e = engine(&[server("s", one_attempt()), server("t", defaults())]);
    let plan = vec![
        Step::Alternative { server: Some("t".into()), tool: "x".into(), arguments: None },
        Step::Restart,
        Step::Alternative { server: None, tool: "b".into(), arguments: None },
    ];
    let (ending, record) = advised(&e, &up, &planner(plan.clone()), "a").await;
    assert_eq!(answered(&ending), "ok");
    assert!(up.calls("t/x").is_empty(), "another server's tool is not granted");
    assert!(up.calls("s/<restart>").is_empty(), "restarts are not granted");
    let denied: Vec<_> = record.denied.iter().map(|d| (d.denial, d.target.as_str())).collect();
    assert_eq!(denied, [(Denial::Grant, "t/x"), (Denial::Restart, "s")]);
    assert_eq!(e.policy("s").unwrap().counters.denied[Denial::Grant as usize].load(Ordering::Relaxed), 1);

    // The positive control: granted, both run.
    let mut s = server("s", one_attempt());
    s.adapter_allow.tools.push(crate::config::ToolPattern::parse("t/*").unwrap());
    s.adapter_allow.restart = true;
    let e = engine(&[s, server("t", defaults())]);
    let up = Script::new(&[("s/a", true), ("s/b", true), ("t/x", false)])
        .then("s/a", vec![timeout()])
        .then("t/x", vec![timeout()]);
    let (ending, record) = advised(&e, &up, &planner(plan), "a").await;
    assert_eq!(answered(&ending), "ok", "{record:?}");
    assert_eq!(up.calls("t/x").len(), 1);
    assert_eq!(up.calls("s/<restart>").len(), 1);
    assert!(record.denied.is_empty());
}

#[tokio::test(start_paused = true)]
async fn plans_are_bounded_per_client_call() {
    let up = Script::new(&[("s/a", true), ("s/poke", false), ("s/look", true)]).then("s/a", vec![timeout()]);
    let mut s = server("s", one_attempt());
    s.adapter_allow.restart = true;
    let e = engine(&[s]);
    let side = |tool: &str| Step::SideCall { tool: tool.into(), arguments: JsonObject::new() };
    let mut plan = vec![side("poke"), side("poke"), Step::Restart, Step::Restart];
    plan.extend((0..20).map(|_| side("look")));
    let (_, record) = advised(&e, &up, &planner(plan), "a").await;
    assert_eq!(up.calls("s/poke").len(), 1, "a tool unsafe to replay runs once");
    assert_eq!(up.calls("s/<restart>").len(), 1, "one restart per call");
    assert_eq!(up.calls("s/look").len(), DEFAULT_PLAN_CALLS as usize - 1, "side calls and alternatives are capped");
    let kinds: HashSet<Denial> = record.denied.iter().map(|d| d.denial).collect();
    assert_eq!(kinds, HashSet::from([Denial::Replay, Denial::Restart, Denial::Calls]));
}

/// A tool its server marks destructive is no adapter's to call unless the grant names it:
/// the default grant of the server's own tools (`s/*`) does not, nor does any `*`.
#[tokio::test(start_paused = true)]
async fn an_adapter_calls_a_destructive_tool_only_where_the_grant_names_it() {
    let destructive = ToolAnnotations::new().read_only(false).destructive(true).idempotent(true);
    let script = || {
        let mut up = Script::new(&[("s/a", true), ("s/look", true)]).then("s/a", vec![timeout()]);
        up.tools.insert("s/wipe".into(), Some(destructive.clone()));
        up
    };
    let side = |tool: &str| Step::SideCall { tool: tool.into(), arguments: JsonObject::new() };
    let plan = || planner(vec![side("wipe"), side("look")]);
    let up = script();
    let e = engine(&[server("s", one_attempt())]);
    let (_, record) = advised(&e, &up, &plan(), "a").await;
    assert_eq!(up.calls("s/wipe").len(), 0, "not under the default grant");
    assert_eq!(up.calls("s/look").len(), 1, "what is not destructive still runs");
    assert_eq!(record.denied, [Denied { denial: Denial::Destructive, target: "s/wipe".into() }]);
    assert_eq!(e.policy("s").unwrap().counters.denied[Denial::Destructive as usize].load(Ordering::Relaxed), 1);
    // Named in the grant, it runs.
    let up = script();
    let mut s = server("s", one_attempt());
    s.adapter_allow.tools = ["s/*", "s/wipe"].map(|p| crate::config::ToolPattern::parse(p).unwrap()).to_vec();
    let (_, record) = advised(&engine(&[s]), &up, &plan(), "a").await;
    assert_eq!(up.calls("s/wipe").len(), 1, "{record:?}");
    assert!(record.denied.is_empty(), "{record:?}");
}

/// A tool unsafe to replay that is one of the call's configured fallbacks, which always
/// run, is not the adapter's to call first: it would run twice in one client call.
#[tokio::test(start_paused = true)]
async fn an_adapter_cannot_run_a_configured_fallback_before_it_runs() {
    let mut r = one_attempt();
    r.fallbacks.insert("a".into(), vec![Alternative { tool: "poke".into(), server: None, arguments: None }]);
    let up = Script::new(&[("s/a", true), ("s/poke", false), ("s/look", true)])
        .then("s/a", vec![timeout()])
        .then("s/look", vec![ok("looked")]);
    let e = engine(&[server("s", r)]);
    let side = |tool: &str| Step::SideCall { tool: tool.into(), arguments: JsonObject::new() };
    let (_, record) = advised(&e, &up, &planner(vec![side("poke"), side("look")]), "a").await;
    assert_eq!(up.calls("s/poke").len(), 1, "the fallback ran, once");
    assert_eq!(up.calls("s/look").len(), 1, "a tool safe to replay may still be called");
    assert_eq!(record.denied.iter().map(|d| d.denial).collect::<Vec<_>>(), vec![Denial::Replay]);
}

#[tokio::test(start_paused = true)]
async fn an_adapters_steps_spend_its_own_servers_retry_budget() {
    let mut r = one_attempt();
    r.retry.budget_reserve = 2;
    r.retry.budget_ratio = 0.0;
    let mut s = server("s", r);
    s.adapter_allow.tools.push(crate::config::ToolPattern::parse("t/*").unwrap());
    let up = Script::new(&[("s/a", true), ("s/look", true), ("t/x", true), ("t/y", true)])
        .then("s/a", vec![timeout()])
        .then("t/x", vec![timeout()])
        .then("t/y", vec![timeout()]);
    let e = engine(&[s, server("t", defaults())]);
    let t_before = e.policy("t").unwrap().budget.tokens();
    let alt = |tool: &str| Step::Alternative { server: Some("t".into()), tool: tool.into(), arguments: None };
    let side = Step::SideCall { tool: "look".into(), arguments: JsonObject::new() };
    let (_, record) = advised(&e, &up, &planner(vec![alt("x"), alt("y"), side]), "a").await;
    assert_eq!(up.calls("t/x").len() + up.calls("t/y").len(), 2, "two tokens, two calls");
    assert!(up.calls("s/look").is_empty());
    assert!(record.stopped.unwrap().contains("retry budget"));
    assert_eq!(e.policy("t").unwrap().budget.tokens(), t_before, "another server's budget is untouched");
}

#[tokio::test(start_paused = true)]
async fn config_that_forbids_a_replay_wins_over_an_adapter() {
    let mut r = defaults();
    r.tools.insert("hol_send".into(), ToolRecovery { idempotent: Some(false), ..Default::default() });
    let up = Script::new(&[("s/hol_send", false)]).then("s/hol_send", vec![tool_error("Session 'main' not found")]);
    let e = engine(&[server("s", r)]);
    let a = never_delivered(vec![Step::Retry(Some(Duration::ZERO))]);
    let (ending, _) = advised(&e, &up, &a, "hol_send").await;
    assert!(matches!(ending, Ending::GaveUp));
    assert_eq!(up.calls("s/hol_send").len(), 1);
}

/// An adapter's word that a call never ran buys no replay of a tool its server marks
/// destructive, unless the grant names the tool (as for its own steps).
#[tokio::test(start_paused = true)]
async fn an_adapters_word_buys_no_replay_of_a_destructive_tool_the_grant_does_not_name() {
    let destructive = ToolAnnotations::new().read_only(false).destructive(true);
    let script = || {
        let mut up = Script::new(&[]).then("s/wipe", vec![tool_error("Session 'main' not found"); 2]);
        up.tools.insert("s/wipe".into(), Some(destructive.clone()));
        up
    };
    let a = never_delivered(vec![Step::Retry(Some(Duration::ZERO))]);
    let up = script();
    let (ending, _) = advised(&engine(&[server("s", defaults())]), &up, &a, "wipe").await;
    assert!(matches!(ending, Ending::GaveUp));
    assert_eq!(up.calls("s/wipe").len(), 1, "not replayed under the default grant");
    // Named in the grant, the adapter's word is taken.
    let up = script();
    let mut s = server("s", defaults());
    s.adapter_allow.tools = ["s/*", "s/wipe"].map(|p| crate::config::ToolPattern::parse(p).unwrap()).to_vec();
    let (_, record) = advised(&engine(&[s]), &up, &a, "wipe").await;
    assert_eq!(up.calls("s/wipe").len(), 2, "{record:?}");
}

#[tokio::test(start_paused = true)]
async fn an_adapters_absurd_waits_are_clamped() {
    let up = Script::new(&[("s/a", true)]).then("s/a", vec![timeout()]);
    let e = engine(&[server("s", defaults())]);
    let mut c = classify(&Failure::Timeout { after: Duration::ZERO }, std::time::SystemTime::UNIX_EPOCH);
    c.retry_after = Some(Duration::MAX);
    let a = Planner {
        plan: vec![Step::Retry(Some(Duration::MAX))],
        reclassify: Some(c),
        observed: Mutex::default(),
        consulted: Default::default(),
    };
    let start = Instant::now();
    let (ending, record) = advised(&e, &up, &a, "a").await;
    assert!(matches!(ending, Ending::GaveUp));
    assert!(record.stopped.unwrap().contains("past the call's deadline"));
    assert_eq!(Instant::now() - start, Duration::from_secs(1), "only the attempt's own timeout");
}

#[tokio::test(start_paused = true)]
async fn a_step_the_adapter_did_not_declare_is_refused_even_when_granted() {
    let mut s = server("s", one_attempt());
    s.adapter_allow.tools.push(crate::config::ToolPattern::parse("t/*").unwrap());
    s.adapter_allow.restart = true;
    let mut e = engine(&[s, server("t", defaults())]);
    // It declared nothing beyond its own server: a 0.1.0 adapter, say.
    e.declare("s", crate::config::AdapterGrant::own("s"));
    let up = Script::new(&[("s/a", true), ("t/x", true)]).then("s/a", vec![timeout()]);
    let plan = vec![Step::Alternative { server: Some("t".into()), tool: "x".into(), arguments: None }, Step::Restart];
    let (ending, record) = advised(&e, &up, &planner(plan), "a").await;
    assert!(matches!(ending, Ending::GaveUp));
    assert!(up.calls("t/x").is_empty());
    assert!(up.calls("s/<restart>").is_empty());
    let denied: Vec<_> = record.denied.iter().map(|d| d.denial).collect();
    assert_eq!(denied, [Denial::Undeclared, Denial::Undeclared]);
}

#[tokio::test(start_paused = true)]
async fn an_adapters_word_that_a_call_never_ran_buys_one_replay() {
    let up = Script::new(&[("s/write", false)]).then("s/write", vec![tool_error("lost"); 5]);
    let e = engine(&[server("s", defaults())]);
    // Claims non-delivery on every failure, and asks for a retry every time.
    let a = never_delivered(vec![Step::Retry(Some(Duration::ZERO))]);
    struct Always(Planner);
    impl Advisor for Always {
        fn classify(&self, f: &FailureContext<'_>, c: &Classification) -> BoxFuture<'static, Option<Classification>> {
            self.0.classify(f, c)
        }
        fn plan(&self, _: &FailureContext<'_>, _: &Classification) -> BoxFuture<'static, Option<Advice>> {
            let p = Some(self.0.plan.clone().into());
            Box::pin(async move { p })
        }
        fn observe(&self, _: &Completed<'_>) -> BoxFuture<'static, ()> {
            Box::pin(async {})
        }
    }
    let annotations = up.annotations("s", "write").ok().flatten();
    let (ending, _) = e.run(&up, Some(&Always(a)), "s".into(), "write".into(), annotations.as_ref(), None).await;
    assert!(matches!(ending, Ending::GaveUp));
    assert_eq!(up.calls("s/write").len(), 2, "one replay on the adapter's word, not max_attempts");
}

#[tokio::test(start_paused = true)]
async fn an_adapter_cannot_keep_the_configured_fallbacks_from_running() {
    let mut r = defaults();
    r.fallbacks.insert("a".into(), vec![Alternative { tool: "b".into(), server: None, arguments: None }]);
    let up = Script::new(&[("s/a", true), ("s/b", true), ("s/look", true)]).then("s/a", vec![timeout()]);
    let e = engine(&[server("s", r)]);
    // Spends every plan call, then names the configured fallback, and calls the failure
    // a cancellation.
    let side = Step::SideCall { tool: "look".into(), arguments: JsonObject::new() };
    let mut plan = vec![side; 8];
    plan.push(Step::Alternative { server: None, tool: "b".into(), arguments: Some(JsonObject::new()) });
    let mut cancelled = classify(&Failure::Cancelled, std::time::SystemTime::UNIX_EPOCH);
    cancelled.retryable = false;
    let a = Planner { plan, reclassify: Some(cancelled), observed: Mutex::default(), consulted: Default::default() };
    let (ending, record) = advised(&e, &up, &a, "a").await;
    assert_eq!(answered(&ending), "ok", "{record:?}");
    assert_eq!(record.answered_by().unwrap().tool, "b");
    assert_eq!(
        up.calls("s/b")[0].2,
        Some(json!({"session": "main"}).as_object().unwrap().clone()),
        "the configured arguments"
    );
}

/// A `url` server's HTTP error for one tool's requests (a proxy's 504 for a slow tool, a
/// 502) is that tool's failure alone while another tool answers, as a timeout is.
#[tokio::test(start_paused = true)]
async fn an_http_server_error_for_one_tool_is_confined_to_it() {
    for status in [502, 504] {
        let failure = || Err(Failure::HttpStatus { status, retry_after: None });
        let up = Script::new(&[("s/a", true), ("s/b", true)]).then("s/a", (0..10).map(|_| failure()).collect());
        let e = engine(&[server("s", one_attempt())]);
        for _ in 0..5 {
            assert_eq!(answered(&run(&e, &up, "b").await.0), "ok");
            run(&e, &up, "a").await;
        }
        let policy = e.policy("s").unwrap();
        let server = policy.breakers.server.snapshot();
        assert_eq!((server.state, server.window_failures), ("closed", 0), "HTTP {status}: none counted for the server");
        assert_eq!(policy.breakers.tools.troubled()[0].1.state, "open", "HTTP {status}");
        assert_eq!(answered(&run(&e, &up, "b").await.0), "ok", "HTTP {status}: the server's other tools serve");
    }
}

#[tokio::test(start_paused = true)]
async fn a_broken_connection_is_never_confined_to_one_tool() {
    let up = Script::new(&[("s/a", true), ("s/b", true)])
        .then("s/a", (0..10).map(|_| Err(Failure::ConnectionLost { reason: "eof".into(), session: None })).collect());
    let e = engine(&[server("s", one_attempt())]);
    for _ in 0..5 {
        assert_eq!(answered(&run(&e, &up, "b").await.0), "ok");
        run(&e, &up, "a").await;
    }
    // Every one counted for the server although b had just answered (a timeout would
    // have been confined to `a`, as in the test above).
    let server = e.policy("s").unwrap().breakers.server.snapshot();
    assert_eq!((server.consecutive_failures, server.window_failures), (1, 5));
}

/// A call routed to a server a reload has just removed gives up with the server's
/// absence on record; it does not panic.
#[tokio::test(start_paused = true)]
async fn a_server_removed_under_a_call_is_answered_not_panicked_on() {
    let up = Script::new(&[("gone/read", true)]);
    let e = engine(&[server("s", defaults())]);
    let (ending, record) = e.run(&up, None, "gone".into(), "read".into(), None, None).await;
    assert!(matches!(ending, Ending::GaveUp));
    assert!(matches!(record.last_failure(), Some((Failure::Unavailable { status: Status::Stopped, .. }, _))));
    assert!(up.calls("gone/read").is_empty());
}

/// An adapter that is slow to answer is stopped at the call's deadline: its classify or
/// its plan (each within its own deadline, at most) cannot hold the call past it.
#[tokio::test(start_paused = true)]
async fn an_adapter_cannot_hold_a_call_past_its_deadline() {
    struct Slow {
        in_plan: bool,
    }
    impl Advisor for Slow {
        fn classify(&self, _: &FailureContext<'_>, _: &Classification) -> BoxFuture<'static, Option<Classification>> {
            let slow = !self.in_plan;
            Box::pin(async move {
                if slow {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                }
                None
            })
        }
        fn plan(&self, _: &FailureContext<'_>, _: &Classification) -> BoxFuture<'static, Option<Advice>> {
            let slow = self.in_plan;
            Box::pin(async move {
                if slow {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                }
                None
            })
        }
        fn observe(&self, _: &Completed<'_>) -> BoxFuture<'static, ()> {
            Box::pin(async {})
        }
    }
    for in_plan in [false, true] {
        let up = Script::new(&[("s/read", true)]).then("s/read", vec![timeout(); 10]);
        let e = engine(&[server("s", defaults())]);
        let started = tokio::time::Instant::now();
        let annotations = up.annotations("s", "read").ok().flatten();
        let (ending, _) =
            e.run(&up, Some(&Slow { in_plan }), "s".into(), "read".into(), annotations.as_ref(), None).await;
        assert!(!matches!(ending, Ending::Answered(..)));
        let deadline = Duration::from_millis(defaults().deadline_for("read", |_, _| None));
        assert!(started.elapsed() <= deadline, "in_plan {in_plan}: {:?} past {deadline:?}", started.elapsed());
    }
}

/// What a reload keeps of a server's policy: all of it; with new adapter code, the
/// breakers and retry budget (how the server fares) under the new code's declared needs;
/// or nothing.
#[test]
fn a_reload_keeps_of_a_policy_what_it_is_told() {
    let e = engine(&[server("s", defaults())]);
    let before = e.policy("s").unwrap();
    let declared = AdapterGrant { restart: true, ..AdapterGrant::own("s") };
    let next = |kept: PolicyKept| e.reconfigure(&[server("s", defaults())], &|_| kept, &|_| Some(declared.clone()), 8);
    let same = |a: &ServerPolicy, b: &ServerPolicy| {
        (Arc::ptr_eq(&a.breakers, &b.breakers), Arc::ptr_eq(&a.budget, &b.budget), a.declared == b.declared)
    };
    assert_eq!(same(before, next(PolicyKept::Whole).policy("s").unwrap()), (true, true, true));
    let health = next(PolicyKept::Health);
    let health = health.policy("s").unwrap();
    assert_eq!(same(before, health), (true, true, false));
    assert_eq!(health.declared, declared, "what the new code declares");
    assert!(Arc::ptr_eq(&before.counters, &health.counters), "counters carry over by name");
    assert_eq!(same(before, next(PolicyKept::Nothing).policy("s").unwrap()), (false, false, false));
}

/// A relaunch that did not come up keeps its server's breakers and budget, unless their
/// settings changed.
#[test]
fn a_failed_relaunch_keeps_the_health_of_the_process_still_serving() {
    let e = engine(&[server("s", defaults())]);
    let relaunched = |r: RecoveryConfig| e.reconfigure(&[server("s", r)], &|_| PolicyKept::Nothing, &|_| None, 8);
    let health = |e: &Engine| (e.policy("s").unwrap().breakers.clone(), e.policy("s").unwrap().budget.clone());
    let kept = relaunched(defaults()).with_health_of(&e, "s");
    assert!(Arc::ptr_eq(&health(&kept).0, &health(&e).0) && Arc::ptr_eq(&health(&kept).1, &health(&e).1));
    let other = RecoveryConfig {
        breaker: crate::config::BreakerConfig { failure_threshold: 9, ..Default::default() },
        ..defaults()
    };
    let fresh = relaunched(other).with_health_of(&e, "s");
    assert!(!Arc::ptr_eq(&health(&fresh).0, &health(&e).0), "new breaker settings: new breakers");
}

/// A server's counters are its name's for the gateway's life: carried over a reload, kept
/// while it is removed and found again when it is added back; a session's own instance
/// counts for itself and for the server.
#[tokio::test(start_paused = true)]
async fn counters_carry_over_by_name_and_a_sessions_add_to_the_servers() {
    let up = Script::new(&[("s/read", true)]);
    let e = engine(&[server("s", defaults())]);
    run(&e, &up, "read").await;
    let calls = |e: &Engine| e.policy("s").map(|p| p.counters.calls.load(Ordering::Relaxed));
    let reconfigure =
        |e: &Engine, servers: &[ServerConfig]| e.reconfigure(servers, &|_| PolicyKept::Nothing, &|_| None, 8);
    let changed = reconfigure(&e, &[server("s", RecoveryConfig { timeout_ms: 2_000, ..defaults() })]);
    assert_eq!(calls(&changed), Some(1), "a changed policy keeps its counts");
    let removed = reconfigure(&changed, &[server("t", defaults())]);
    assert_eq!(calls(&removed), None);
    let back = reconfigure(&removed, &[server("s", defaults())]);
    assert_eq!(calls(&back), Some(1), "added back, it counts on");
    let own = back.overlay(&back.fresh_policies(["s"]));
    run(&own, &up, "read").await;
    assert_eq!((calls(&own), calls(&back)), (Some(1), Some(2)), "the session's own, and the server's");
}
