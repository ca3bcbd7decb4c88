//! `cargo xtask bench`: the adapter runtime against its targets: an adapter call
//! on a fresh instance from a pre-instantiated component (p50 ≤ 15 µs, p99 ≤ 40 µs),
//! what a failed attempt asks of its adapter (`classify` then `plan`, each on a fresh
//! instance, as the engine asks them: p50 ≤ 30 µs), loading from the compiled-component
//! cache, and a cold compile.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use rebound::plugins::runtime::Limits;
use rebound::plugins::{Adapter, Adapters, Clients, Runtime, load};
use rebound::recovery::Failure;
use rebound::recovery::classify::classify;
use rebound::recovery::plan::Advisor;
use rebound::recovery::plan::FailureContext;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    let plugin = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/plugins/thanos-classify.wasm");
    assert!(plugin.is_file(), "{} is missing: cargo xtask build-plugins --release", plugin.display());
    let cache = tempfile::tempdir().unwrap();
    let runtime = Runtime::new(Limits::default(), Some(cache.path().to_owned())).unwrap();
    println!("plugin runtime: pooling allocator {}", if runtime.pooling { "on" } else { "off (reservation failed)" });

    let t = Instant::now();
    let loaded = load::load(&runtime, &plugin).unwrap();
    let cold = t.elapsed();
    assert!(!loaded.from_cache);
    let mut cached = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        let l = load::load(&runtime, &plugin).unwrap();
        cached.push(t.elapsed());
        assert!(l.from_cache);
    }
    cached.sort();
    println!("cold compile and load of thanos-classify: {:.1} ms", cold.as_secs_f64() * 1e3);
    println!("load from the cache: p50 {:.2} ms", percentile(&cached, 0.5).as_secs_f64() * 1e3);

    let secrets = rebound::redact::Secrets::default();
    let adapter = Adapter::new(
        runtime.clone(),
        &loaded,
        "thanos-classify",
        ("s", Clients::One),
        &serde_json::Value::Null,
        secrets,
    )
    .unwrap();
    let mut adapters = Adapters::default();
    adapters.insert("s", adapter.clone());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let failure = Failure::Timeout { after: Duration::from_secs(1) };
    let builtin = classify(&failure, SystemTime::UNIX_EPOCH);
    let ctx = FailureContext {
        server: "s",
        tool: "t",
        arguments: None,
        attempt: 1,
        elapsed: Duration::ZERO,
        failure: &failure,
    };
    for _ in 0..1000 {
        rt.block_on(adapter.classify(&ctx, &builtin));
    }
    let mut times = Vec::with_capacity(20_000);
    for _ in 0..20_000 {
        let t = Instant::now();
        let c = rt.block_on(adapter.classify(&ctx, &builtin));
        times.push(t.elapsed());
        assert!(c.is_some());
    }
    times.sort();
    let (p50, p99) = (percentile(&times, 0.5), percentile(&times, 0.99));
    let verdict = |ok: bool| if ok { "meets" } else { "MISSES" };
    println!(
        "adapter call (fresh instance + classify): p50 {:.1} µs ({} ≤ 15 µs), p99 {:.1} µs ({} ≤ 40 µs)",
        p50.as_secs_f64() * 1e6,
        verdict(p50 <= Duration::from_micros(15)),
        p99.as_secs_f64() * 1e6,
        verdict(p99 <= Duration::from_micros(40)),
    );

    // What the engine asks an adapter on a failed attempt: its classification, then its
    // plan for that classification, each in a fresh instance.
    let mut times = Vec::with_capacity(20_000);
    for i in 0..21_000 {
        let t = Instant::now();
        let class = rt.block_on(adapters.classify(&ctx, &builtin)).unwrap_or_else(|| builtin.clone());
        let _plan = rt.block_on(adapters.plan(&ctx, &class));
        if i >= 1000 {
            times.push(t.elapsed());
        }
    }
    times.sort();
    let p50 = percentile(&times, 0.5);
    println!(
        "a failed attempt's adapter calls (fresh instance + classify, fresh instance + plan): p50 {:.1} µs ({} ≤ 30 µs), p99 {:.1} µs",
        p50.as_secs_f64() * 1e6,
        verdict(p50 <= Duration::from_micros(30)),
        percentile(&times, 0.99).as_secs_f64() * 1e6,
    );
}
