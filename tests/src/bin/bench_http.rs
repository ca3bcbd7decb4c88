//! `cargo xtask bench`: streamable HTTP tool calls through Rebound, through the two
//! gateways people use for the same job today, supergateway (npm) and mcp-proxy (PyPI),
//! each in front of the same stdio server, and directly to that server's own streamable
//! HTTP transport, driven by the same client in the same run: one session calling one
//! call at a time (what one agent feels: p50 and p99 latency; target: p50 ≤ 1.15× direct
//! and below the peers), and 16 sessions at once (throughput; target: ≥ 2× the faster
//! peer). Two upstreams: a minimal Rust server (`echo-server`), where the gateway, not the
//! server, is the bottleneck, and `@modelcontextprotocol/server-everything`, the server
//! people run. Each row also gives the peak resident memory of the process measured
//! under that load (the gateway's own process; the servers behind it are not counted).
//!
//! `bench-http [--everything PATH] --peer NAME ARGV... --peer NAME ARGV...`: xtask
//! installs the peers and gives their command lines, with `{port}`, `{server}` (the stdio
//! server's command line as one word) and `{server-argv}` (as separate words) to fill in.

use std::net::TcpListener;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rebound_tests::{bin, http_client};
use rmcp::model::CallToolRequestParams;
use serde_json::json;

/// Client sessions calling at once, each in a loop, in the two rounds.
const CONCURRENCY: [usize; 2] = [1, 16];
const WARM_UP: Duration = Duration::from_secs(1);
const MEASURE: Duration = Duration::from_secs(5);

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// What one round measured.
#[derive(Debug, Clone, Copy)]
struct Round {
    per_second: f64,
    p50_ms: f64,
    p99_ms: f64,
    /// The peak resident memory of the process started (the gateway itself: the servers
    /// behind it are processes of their own), in MB.
    peak_mb: Option<f64>,
}

/// A field of `/proc/PID/status` that is a size (`VmRSS`, `VmHWM`), in MB.
fn status_mb(pid: u32, field: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let value = status.lines().find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?;
    let kib: u64 = value.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib as f64 * 1024.0 / 1e6)
}

/// Starts `argv` and measures calls/s and latency against `url` once it answers, with
/// `sessions` sessions calling at once.
async fn measure(name: &str, argv: &[String], url: &str, sessions: usize) -> Option<Round> {
    let mut child = tokio::process::Command::new(&argv[0])
        .args(&argv[1..])
        .env("REBOUND_LOG", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .process_group(0)
        .spawn()
        .map_err(|e| eprintln!("{name}: cannot start {}: {e}", argv[0]))
        .ok()?;
    let started = Instant::now();
    let mut clients = Vec::new();
    while clients.len() < sessions {
        match http_client(url, None).await {
            Ok(c) => clients.push(c),
            Err(_) if started.elapsed() < Duration::from_secs(30) => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => {
                eprintln!("{name}: no MCP session at {url}: {e}");
                return None;
            }
        }
    }
    let mut params = CallToolRequestParams::new("echo");
    params.arguments = json!({"message": "ping"}).as_object().cloned();
    let done = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let latencies = Arc::new(std::sync::Mutex::new(Vec::<Duration>::new()));
    let counting = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let end = Instant::now() + WARM_UP + MEASURE;
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|client| {
            let (params, done, failed, counting) = (params.clone(), done.clone(), failed.clone(), counting.clone());
            let latencies = latencies.clone();
            tokio::spawn(async move {
                while Instant::now() < end {
                    let sent = Instant::now();
                    let ok = client.peer().call_tool(params.clone()).await.is_ok_and(|r| r.is_error != Some(true));
                    if counting.load(Ordering::Relaxed) {
                        if ok { &done } else { &failed }.fetch_add(1, Ordering::Relaxed);
                        // A failed call's time says nothing of the path measured.
                        if ok {
                            latencies.lock().unwrap().push(sent.elapsed());
                        }
                    }
                }
                let _ = client.cancel().await;
            })
        })
        .collect();
    tokio::time::sleep(WARM_UP).await;
    counting.store(true, Ordering::Relaxed);
    let from = Instant::now();
    for task in tasks {
        let _ = task.await;
    }
    let seconds = from.elapsed().as_secs_f64();
    let peak_mb = child.id().and_then(|pid| status_mb(pid, "VmHWM"));
    if let Some(pid) = child.id() {
        // The whole group: the peers start the stdio server as their own child.
        let _ = std::process::Command::new("kill").args(["--", &format!("-{pid}")]).status();
    }
    let _ = child.wait().await;
    let failed = failed.load(Ordering::Relaxed);
    if failed > 0 {
        eprintln!("{name}: {failed} calls failed");
    }
    let mut latencies = std::mem::take(&mut *latencies.lock().unwrap());
    latencies.sort();
    let at = |q: f64| latencies.get(((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1)));
    let ms = |d: Option<&Duration>| d.map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0);
    let per_second = done.load(Ordering::Relaxed) as f64 / seconds;
    Some(Round { per_second, p50_ms: ms(at(0.5)), p99_ms: ms(at(0.99)), peak_mb })
}

/// `argv` with `{port}` filled in, `{server}` as one word (a command line) and
/// `{server-argv}` as several.
fn fill(argv: &[String], port: u16, server: &[String]) -> Vec<String> {
    argv.iter()
        .flat_map(|a| match a.as_str() {
            "{server-argv}" => server.to_vec(),
            _ => vec![a.replace("{port}", &port.to_string()).replace("{server}", &server.join(" "))],
        })
        .collect()
}

/// Resident memory of an idle `rebound serve --http` with the three first-party adapters
/// and three upstreams, once every server is ready, in MB (target: ≤ 30 MB), its
/// compiled-code cache in `cache` (empty: it compiles the adapters, as on a first start).
async fn idle_memory(dir: &std::path::Path, cache: &std::path::Path) -> Option<f64> {
    let faulty = bin("faulty-server");
    let plugins = rebound_tests::root().join("target/plugins");
    let servers: serde_json::Map<String, serde_json::Value> = ["lean-fallback", "hol-cursor", "thanos-classify"]
        .iter()
        .enumerate()
        .map(|(i, adapter)| {
            (format!("s{i}"), json!({"command": faulty, "args": ["--name", format!("s{i}")], "adapter": adapter}))
        })
        .collect();
    let config = dir.join("idle.json");
    let text = json!({"mcpServers": servers, "rebound": {"plugins_dir": plugins}}).to_string();
    std::fs::write(&config, text).unwrap();
    let port = free_port();
    let mut command = tokio::process::Command::new(bin("rebound"));
    command.args(["serve", "--http", &format!("127.0.0.1:{port}"), "--config"]).arg(&config);
    let mut child = command
        .env("XDG_CACHE_HOME", cache)
        .env("REBOUND_LOG", "error")
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .ok()?;
    let ready = format!("http://127.0.0.1:{port}/readyz");
    for _ in 0..300 {
        if reqwest::get(&ready).await.is_ok_and(|r| r.status().is_success()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Let start-up allocations settle.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mb = status_mb(child.id()?, "VmRSS");
    let _ = child.kill().await;
    mb
}

/// An upstream server, run over stdio behind each gateway and over its own streamable
/// HTTP transport as the direct reference (`{port}` filled in).
struct Upstream {
    name: &'static str,
    stdio: Vec<String>,
    http: Vec<String>,
}

/// Rebound in front of `upstream` (on `threads` worker threads, or half the cores),
/// measured with `sessions` sessions calling at once.
async fn rebound(dir: &std::path::Path, upstream: &Upstream, sessions: usize, threads: Option<usize>) -> Option<Round> {
    let config = dir.join(format!("{}-{threads:?}.json", upstream.name));
    let (command, args) = upstream.stdio.split_first().expect("an upstream command");
    let http = json!({"worker_threads": threads});
    let text = json!({"mcpServers": {"s": {"command": command, "args": args}}, "rebound": {"gateway_tools": false, "http": http}});
    std::fs::write(&config, text.to_string()).unwrap();
    let port = free_port();
    let argv = vec![
        bin("rebound").display().to_string(),
        "serve".into(),
        "--config".into(),
        config.display().to_string(),
        "--http".into(),
        format!("127.0.0.1:{port}"),
    ];
    measure("rebound", &argv, &format!("http://127.0.0.1:{port}/mcp"), sessions).await
}

/// One round: Rebound, the upstream directly, then each peer, with `sessions` sessions
/// calling at once, and Rebound's ratios to them.
async fn compare(dir: &std::path::Path, upstream: &Upstream, peers: &[(String, Vec<String>)], sessions: usize) {
    let Some(ours) = rebound(dir, upstream, sessions, None).await else {
        std::process::exit(1);
    };
    // The other choice of threads: one per core (the default takes half).
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let every_core = rebound(dir, upstream, sessions, Some(cores)).await;
    let line = |name: &str, r: &Round| {
        let peak = r.peak_mb.map_or_else(|| "?".to_string(), |mb| format!("{mb:.1}"));
        format!(
            "  {name:<13} {:>8.0} calls/s   p50 {:>7.2} ms   p99 {:>7.2} ms   peak RSS {peak:>5} MB",
            r.per_second, r.p50_ms, r.p99_ms
        )
    };
    println!("streamable HTTP, {sessions} session(s) calling {}'s `echo` for {} s:", upstream.name, MEASURE.as_secs());
    println!("{}", line("rebound", &ours));
    if let Some(r) = every_core {
        println!("{}   (`rebound.http.worker_threads`: {cores}, one per core)", line("rebound cores", &r));
    }
    let port = free_port();
    let (argv, url) = (fill(&upstream.http, port, &[]), format!("http://127.0.0.1:{port}/mcp"));
    match measure("direct", &argv, &url, sessions).await {
        Some(r) => {
            let ratio = ours.p50_ms / r.p50_ms;
            let verdict = if ratio <= 1.15 { "meets" } else { "MISSES" };
            println!("{}   (rebound: {ratio:.2}× its p50; {verdict} ≤ 1.15×)", line("direct", &r));
        }
        None => println!("  {:<13} did not run", "direct"),
    }
    let mut best: Option<(String, f64)> = None;
    for (name, argv) in peers {
        let port = free_port();
        let argv = fill(argv, port, &upstream.stdio);
        match measure(name, &argv, &format!("http://127.0.0.1:{port}/mcp"), sessions).await {
            Some(r) => {
                let (rate, p50) = (ours.per_second / r.per_second, ours.p50_ms / r.p50_ms);
                println!("{}   (rebound: {rate:.2}× the calls/s, {p50:.2}× the p50)", line(name, &r));
                if best.as_ref().is_none_or(|(_, b)| r.per_second > *b) {
                    best = Some((name.clone(), r.per_second));
                }
            }
            None => println!("  {name:<13} did not run"),
        }
    }
    if let Some((name, rate)) = best {
        let ratio = ours.per_second / rate;
        println!(
            "  rebound vs the faster peer ({name}): {ratio:.2}× the calls/s ({} ≥ 2×)",
            if ratio >= 2.0 { "meets" } else { "MISSES" }
        );
    }
}

#[tokio::main]
async fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let everything = match args.first().map(String::as_str) {
        Some("--everything") if args.len() > 1 => Some(args.drain(..2).nth(1).unwrap_or_default()),
        _ => None,
    };
    let peers: Vec<(String, Vec<String>)> = args
        .split(|a| a == "--peer")
        .filter_map(|group| {
            let (name, argv) = group.split_first()?;
            Some((name.clone(), argv.to_vec()))
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let echo = bin("echo-server").display().to_string();
    let rust = Upstream {
        name: "echo-server",
        stdio: vec![echo.clone()],
        http: vec![echo, "--http".into(), "127.0.0.1:{port}".into()],
    };
    for sessions in CONCURRENCY {
        compare(dir.path(), &rust, &peers, sessions).await;
    }
    // The server people run: its own HTTP transport listens on `PORT`.
    if let Some(path) = everything {
        let http = vec!["env".into(), "PORT={port}".into(), path.clone(), "streamableHttp".into()];
        let everything = Upstream { name: "server-everything", stdio: vec![path], http };
        compare(dir.path(), &everything, &peers, 1).await;
    }
    // A cache of its own: empty on the first start, filled by it for the second.
    let cache = dir.path().join("cache");
    for when in ["on a first start, compiling the adapters", "their compiled code from the cache"] {
        match idle_memory(dir.path(), &cache).await {
            Some(mb) => println!(
                "idle resident memory, 3 adapters and 3 upstreams, {when}: {mb:.1} MB ({} ≤ 30 MB)",
                if mb <= 30.0 { "meets" } else { "MISSES" }
            ),
            None => println!("idle resident memory ({when}): could not be measured"),
        }
    }
}
