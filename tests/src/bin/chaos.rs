//! `cargo xtask chaos [SECONDS]`: the gateway on an operator's worst day. Real child
//! processes that fail every way at once — transient aborts, crashes every few calls, an
//! outage that comes and goes, a server that stops reading its input, one that ignores
//! SIGTERM — while several concurrent clients call them, then a burst of large calls.
//! It reports what a user feels (answered, recovered, failed, latency) and what an
//! operator fears (calls never answered, protocol errors, memory, orphans), and exits
//! non-zero if any call went unanswered, any answer broke the protocol, or a child
//! outlived the gateway.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rebound_tests::{Gateway, alive, faulty, text};
use rmcp::model::CallToolRequestParams;
use serde_json::{Value, json};
use tokio::sync::Mutex;

const WORKERS: usize = 4;
/// How long the gateway rests after the burst before its memory is read again.
const REST: u64 = 15;

#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    recovered: AtomicU64,
    failed: AtomicU64,
    protocol_errors: AtomicU64,
    unanswered: AtomicU64,
    latencies: Mutex<Vec<Duration>>,
}

fn config(dir: &Path) -> Value {
    let with = |mut server: Value, recovery: Value| {
        server["recovery"] = recovery;
        server
    };
    let quick = json!({"timeout_ms": 2000, "retry": {"initial_delay_ms": 20, "max_delay_ms": 200},
                       "breaker": {"open_ms": 1000, "max_open_ms": 4000}});
    json!({
        "mcpServers": {
            "flaky": with(faulty("flaky", dir, &[]), quick.clone()),
            "crashy": with(faulty("crashy", dir, &["--crash-after", "40"]), quick.clone()),
            "deaf": with(faulty("deaf", dir, &["--deaf-after-calls", "30"]), quick.clone()),
            "stubborn": with(faulty("stubborn", dir, &["--stubborn"]), quick),
        },
        "rebound": {"errors_log": dir.join("errors.jsonl"), "restart": {"initial_delay_ms": 50, "crash_loop_limit": 1000}},
    })
}

/// What a worker calls, round robin: every server, the outage-prone tool included.
const CALLS: &[(&str, &str)] = &[
    ("flaky__flaky", "{\"q\": \"x\"}"),
    ("crashy__echo", "{\"message\": \"hi\"}"),
    ("deaf__echo", "{\"message\": \"hi\"}"),
    ("stubborn__echo", "{\"message\": \"hi\"}"),
    ("flaky__outage", "{}"),
    ("crashy__flaky", "{\"q\": \"y\"}"),
];

async fn worker(gw: Arc<Gateway>, tally: Arc<Tally>, until: Instant, offset: usize) {
    let mut i = offset;
    while Instant::now() < until {
        let (tool, args) = CALLS[i % CALLS.len()];
        i += 1;
        let mut params = CallToolRequestParams::new(tool);
        params.arguments = serde_json::from_str(args).ok();
        let started = Instant::now();
        let answer = tokio::time::timeout(Duration::from_secs(60), gw.client.peer().call_tool(params)).await;
        let took = started.elapsed();
        match answer {
            Err(_) => {
                tally.unanswered.fetch_add(1, Ordering::Relaxed);
            }
            Ok(Err(e)) => {
                eprintln!("protocol error from {tool}: {e}");
                tally.protocol_errors.fetch_add(1, Ordering::Relaxed);
            }
            Ok(Ok(r)) if r.is_error == Some(true) => {
                tally.failed.fetch_add(1, Ordering::Relaxed);
            }
            Ok(Ok(r)) => {
                let recovered = r.meta.as_ref().is_some_and(|m| m.0["rebound"]["status"] == "recovered");
                let counter = if recovered { &tally.recovered } else { &tally.ok };
                counter.fetch_add(1, Ordering::Relaxed);
            }
        }
        tally.latencies.lock().await.push(took);
    }
}

/// (resident, peak) memory of `pid`, in MiB.
fn memory(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
            >> 10
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted.get(((sorted.len().max(1) - 1) as f64 * p).round() as usize).copied().unwrap_or_default()
}

#[tokio::main]
async fn main() {
    let seconds: u64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(30);
    let gw = Arc::new(Gateway::start(config).await);
    let pid = gw.child.id().expect("the gateway runs");
    let (idle, _) = memory(pid);
    let outage = gw.dir.path().join("flaky/outage");
    let tally = Arc::new(Tally::default());
    let until = Instant::now() + Duration::from_secs(seconds);
    println!("chaos: {WORKERS} clients for {seconds} s against servers that abort, crash, go deaf and ignore SIGTERM");

    // The outage comes and goes every 3 s.
    let flapping = tokio::spawn(async move {
        let mut down = false;
        while Instant::now() < until {
            if down {
                let _ = std::fs::remove_file(&outage);
            } else {
                let _ = std::fs::write(&outage, "");
            }
            down = !down;
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        let _ = std::fs::remove_file(&outage);
    });
    let workers: Vec<_> = (0..WORKERS).map(|w| tokio::spawn(worker(gw.clone(), tally.clone(), until, w * 2))).collect();
    for w in workers {
        let _ = w.await;
    }
    let _ = flapping.await;

    // A burst of large calls, then a rest: does memory come back?
    let big = "x".repeat(4 << 20);
    let burst = (0..32).map(|_| {
        let gw = gw.clone();
        let big = big.clone();
        async move {
            let mut p = CallToolRequestParams::new("flaky__echo");
            p.arguments = json!({"message": big}).as_object().cloned();
            match tokio::time::timeout(Duration::from_secs(60), gw.client.peer().call_tool(p)).await {
                Ok(Ok(r)) if r.is_error != Some(true) => Ok(text(&r).len()),
                _ => Err(()),
            }
        }
    });
    let burst_ok = futures::future::join_all(burst).await.iter().filter(|r| r.is_ok()).count();
    let (_, peak) = memory(pid);
    tokio::time::sleep(Duration::from_secs(REST)).await;
    let (after, _) = memory(pid);

    let errors_log = std::fs::read_to_string(gw.dir.path().join("errors.jsonl")).unwrap_or_default();
    let status = gw.call("rebound_status", json!({})).await.structured_content.unwrap_or_default();
    let dropped = status["gateway"]["errors_dropped"].as_u64().unwrap_or(0);
    let children: Vec<u32> = ["flaky", "crashy", "deaf", "stubborn"]
        .iter()
        .flat_map(|s| gw.state(s, "starts"))
        .filter_map(|p| p.parse().ok())
        .collect();
    let restarts: u64 = status["servers"].as_array().into_iter().flatten().filter_map(|s| s["restarts"].as_u64()).sum();

    let mut latencies = tally.latencies.lock().await.clone();
    latencies.sort();
    let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let total = latencies.len() as u64;
    let pct = |n: u64| 100.0 * n as f64 / total.max(1) as f64;
    println!("calls: {total}");
    println!("  answered ok:          {} ({:.1}%)", load(&tally.ok), pct(load(&tally.ok)));
    println!("  answered, recovered:  {} ({:.1}%)", load(&tally.recovered), pct(load(&tally.recovered)));
    println!("  answered with isError: {} ({:.1}%)", load(&tally.failed), pct(load(&tally.failed)));
    println!("  protocol errors:      {}", load(&tally.protocol_errors));
    println!("  never answered:       {}", load(&tally.unanswered));
    println!(
        "latency: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        percentile(&latencies, 0.5).as_secs_f64() * 1e3,
        percentile(&latencies, 0.99).as_secs_f64() * 1e3,
        latencies.last().copied().unwrap_or_default().as_secs_f64() * 1e3
    );
    println!("server restarts: {restarts}; errors log: {} lines, {dropped} dropped", errors_log.lines().count());
    println!("burst of 32 calls of 4 MiB: {burst_ok} answered");
    println!("gateway memory: idle {idle} MiB, peak {peak} MiB, {REST} s after the burst {after} MiB");

    let gw = Arc::into_inner(gw).expect("every worker is done");
    let exit = gw.close().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let orphans: Vec<u32> = children.into_iter().filter(|p| alive(*p)).collect();
    println!("gateway exit: {exit}; orphaned children: {}", orphans.len());
    let burst_lost = 32 - burst_ok as u64;
    let broken = load(&tally.unanswered)
        + load(&tally.protocol_errors)
        + orphans.len() as u64
        + burst_lost
        + u64::from(!exit.success());
    if broken > 0 {
        eprintln!(
            "chaos: FAILED ({broken} unanswered calls, protocol errors, lost burst calls, orphans or a failed exit)"
        );
        std::process::exit(1);
    }
    println!("chaos: every call answered, nothing orphaned");
}
