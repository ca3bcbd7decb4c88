//! `cargo xtask bench`: the recovery engine's hot paths, against their targets
//! (breaker admit + record ≤ 1 µs uncontended; an answer while the breaker is open
//! ≤ 1 ms with no upstream traffic).

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use futures::future::BoxFuture;
use rebound::config::{BreakerConfig, Launch, RecoveryConfig, ServerConfig, StdioLaunch};
use rebound::recovery::Failure;
use rebound::recovery::breaker::{Breaker, Outcome};
use rebound::recovery::clock::{Rng, TokioClock};
use rebound::recovery::engine::{Engine, Role, Unoffered, Upstream};
use rmcp::model::{CallToolResponse, JsonObject, ToolAnnotations};
use tokio_util::sync::CancellationToken;

fn breaker(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    let _guard = rt.enter();
    let b = Breaker::new(BreakerConfig::default(), Arc::new(TokioClock), Arc::new(Rng::seeded(1)));
    c.bench_function("breaker admit + record (closed)", |bench| {
        bench.iter(|| black_box(b.admit()).expect("closed").record(Outcome::Success))
    });
}

/// An upstream that always fails, counting the calls that reach it; its client never
/// cancels.
struct Down(std::sync::atomic::AtomicU64, CancellationToken);

impl Upstream for Down {
    fn call(
        &self,
        _: &str,
        _: &str,
        _: Role,
        _: Option<JsonObject>,
        _: Duration,
        _: Duration,
    ) -> BoxFuture<'_, Result<CallToolResponse, Failure>> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Box::pin(async { Err(Failure::ConnectionLost { reason: "down".into(), session: None }) })
    }

    fn restart(&self, _: &str, _: Duration) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }

    fn annotations(&self, _: &str, _: &str) -> Result<Option<ToolAnnotations>, Unoffered> {
        Ok(Some(ToolAnnotations::new().read_only(true)))
    }

    fn cancellation(&self) -> &CancellationToken {
        &self.1
    }
}

fn open_breaker_answer(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    let server = ServerConfig {
        name: "s".into(),
        launch: Launch::Stdio(StdioLaunch { command: "x".into(), args: vec![], env: Default::default(), cwd: None }),
        adapter: None,
        recovery: RecoveryConfig {
            breaker: BreakerConfig { open_ms: 3_600_000, ..BreakerConfig::default() },
            ..RecoveryConfig::default()
        },
        adapter_config: serde_json::Value::Null,
        adapter_allow: rebound::config::AdapterGrant::own("s"),
        scope: Default::default(),
        protocol: Default::default(),
    };
    let engine = rt.block_on(async { Engine::new([&server], Arc::new(TokioClock), Arc::new(Rng::seeded(1))) });
    let down = Down(Default::default(), CancellationToken::new());
    // Open it: five failures (with retries disabled by the open breaker thereafter).
    let policy = engine.policy("s").unwrap();
    for _ in 0..5 {
        policy.breakers.server.admit().unwrap().record(Outcome::Failure);
    }
    c.bench_function("engine answer while the breaker is open", |bench| {
        bench.iter(|| rt.block_on(engine.run(&down, None, "s".into(), "t".into(), None, None)))
    });
    assert_eq!(down.0.load(std::sync::atomic::Ordering::Relaxed), 0, "no upstream traffic while open");
}

criterion_group!(benches, breaker, open_breaker_answer);
criterion_main!(benches);
