//! `cargo xtask bench`: the stdio round trip of a Rust client calling a minimal Rust server,
//! directly, through `line-relay` (two more pipe hops and nothing else: the floor of any
//! stdio gateway), through `rmcp-relay` (the floor of a gateway built on rmcp: every
//! message read into rmcp's types and written from them, on both sides) and through
//! Rebound, in interleaved rounds. Rebound's own cost is what it adds beyond the floor
//! (target: p50 ≤ 50 µs, p99 ≤ 200 µs), of which rmcp's two endpoints are the first part;
//! the ratio to direct is the one the issue sets (≤ 1.10×), which the floor alone may
//! already miss.

use std::process::Stdio;
use std::time::{Duration, Instant};

use rebound_tests::{TestClient, bin};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use serde_json::json;

const ROUNDS: usize = 3;
const CALLS: usize = 2_000;
const WARM_UP: usize = 200;

/// Each call's round trip, one call at a time on one connection.
async fn round_trips(mut cmd: tokio::process::Command, into: &mut Vec<Duration>) {
    let mut child =
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null()).kill_on_drop(true).spawn().unwrap();
    let (stdin, stdout) = (child.stdin.take().unwrap(), child.stdout.take().unwrap());
    let client = TestClient::default().serve((stdout, stdin)).await.unwrap();
    let mut params = CallToolRequestParams::new("echo");
    params.arguments = json!({"message": "ping"}).as_object().cloned();
    for _ in 0..WARM_UP {
        client.peer().call_tool(params.clone()).await.unwrap();
    }
    for _ in 0..CALLS {
        let start = Instant::now();
        client.peer().call_tool(params.clone()).await.unwrap();
        into.push(start.elapsed());
    }
    drop(client);
    let _ = child.kill().await;
}

/// The `p`th percentile of sorted samples, in µs.
fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let at = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[at].as_secs_f64() * 1e6
}

struct Path {
    name: &'static str,
    command: Box<dyn Fn() -> tokio::process::Command>,
    samples: Vec<Duration>,
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let server = bin("faulty-server");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rebound.json");
    std::fs::write(
        &config,
        json!({"mcpServers": {"s": {"command": server, "args": ["--name", "s"]}}, "rebound": {"gateway_tools": false}})
            .to_string(),
    )
    .unwrap();
    let direct = server.clone();
    // The server behind a relay binary, which starts it.
    let relayed = |name: &'static str, relay: &'static str| Path {
        name,
        command: Box::new({
            let server = server.clone();
            move || {
                let mut c = tokio::process::Command::new(bin(relay));
                c.arg(&server).args(["--name", "s"]);
                c
            }
        }),
        samples: Vec::new(),
    };
    let mut paths = [
        Path {
            name: "direct",
            command: Box::new(move || {
                let mut c = tokio::process::Command::new(&direct);
                c.args(["--name", "s"]);
                c
            }),
            samples: Vec::new(),
        },
        relayed("line relay (the floor)", "line-relay"),
        relayed("rmcp relay", "rmcp-relay"),
        Path {
            name: "through rebound",
            command: Box::new(move || {
                let mut c = tokio::process::Command::new(bin("rebound"));
                c.args(["serve", "--config"]).arg(&config).env("REBOUND_LOG", "error");
                c
            }),
            samples: Vec::new(),
        },
    ];
    for _ in 0..ROUNDS {
        for path in &mut paths {
            round_trips((path.command)(), &mut path.samples).await;
        }
    }
    println!("stdio round trip, Rust client -> minimal Rust server, {ROUNDS} interleaved rounds of {CALLS} calls:");
    let mut p50 = Vec::new();
    let mut p99 = Vec::new();
    for path in &mut paths {
        path.samples.sort();
        p50.push(percentile(&path.samples, 0.50));
        p99.push(percentile(&path.samples, 0.99));
        println!("  {:<24} p50 {:>6.1} µs   p99 {:>6.1} µs", path.name, p50[p50.len() - 1], p99[p99.len() - 1]);
    }
    let verdict = |ok: bool| if ok { "meets" } else { "MISSES" };
    let (floor, typed, rebound) = (1, 2, 3);
    let ratio = p50[rebound] / p50[0];
    println!(
        "  through rebound / direct: {ratio:.2}× at p50 ({} ≤ 1.10×); the floor alone: {:.2}×",
        verdict(ratio <= 1.10),
        p50[floor] / p50[0]
    );
    let (own50, own99) = (p50[rebound] - p50[floor], p99[rebound] - p99[floor]);
    println!(
        "  rebound's own added latency (through rebound - the floor): p50 {own50:.1} µs ({} ≤ 50), p99 {own99:.1} µs ({} ≤ 200)",
        verdict(own50 <= 50.0),
        verdict(own99 <= 200.0)
    );
    println!(
        "    of which rmcp's two endpoints (rmcp relay - the floor): p50 {:.1} µs, p99 {:.1} µs; the rest, Rebound's own code: p50 {:.1} µs",
        p50[typed] - p50[floor],
        p99[typed] - p99[floor],
        p50[rebound] - p50[typed]
    );
}
