//! `cargo xtask bench`: the stdio round trip through the gateway against the same client
//! talking to the same server directly (target: ≤ 1.10×).

use std::process::Stdio;
use std::time::{Duration, Instant};

use rebound_tests::{TestClient, bin};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use serde_json::json;

const CALLS: usize = 3_000;

async fn measure(mut cmd: tokio::process::Command) -> Duration {
    let mut child =
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null()).kill_on_drop(true).spawn().unwrap();
    let (stdin, stdout) = (child.stdin.take().unwrap(), child.stdout.take().unwrap());
    let client = TestClient::default().serve((stdout, stdin)).await.unwrap();
    let mut params = CallToolRequestParams::new("echo");
    params.arguments = json!({"message": "ping"}).as_object().cloned();
    for _ in 0..200 {
        client.peer().call_tool(params.clone()).await.unwrap();
    }
    let start = Instant::now();
    for _ in 0..CALLS {
        client.peer().call_tool(params.clone()).await.unwrap();
    }
    let per_call = start.elapsed() / CALLS as u32;
    drop(client);
    let _ = child.kill().await;
    per_call
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
    let direct = {
        let mut c = tokio::process::Command::new(&server);
        c.args(["--name", "s"]);
        measure(c).await
    };
    let gateway = {
        let mut c = tokio::process::Command::new(bin("rebound"));
        c.args(["serve", "--config"]).arg(&config).env("REBOUND_LOG", "error");
        measure(c).await
    };
    let ratio = gateway.as_secs_f64() / direct.as_secs_f64();
    println!(
        "stdio round trip ({CALLS} sequential echo calls): direct {:.1} µs, through rebound {:.1} µs: {ratio:.2}× ({} ≤ 1.10×)",
        direct.as_secs_f64() * 1e6,
        gateway.as_secs_f64() * 1e6,
        if ratio <= 1.10 { "meets" } else { "MISSES" }
    );
}
