//! `cargo xtask demo`: the gateway in front of a real server (server-everything) and the
//! fault-injecting one, driven by a scripted MCP client, recovering real failures.

use std::time::Instant;

use rebound_tests::{Gateway, root, text};
use serde_json::json;

fn step(title: &str) {
    println!("\n\x1b[1m== {title}\x1b[0m");
}

fn show(label: &str, result: &rmcp::model::CallToolResult, took: std::time::Duration) {
    let status = if result.is_error == Some(true) { "\x1b[33misError\x1b[0m" } else { "\x1b[32mok\x1b[0m" };
    println!("{label} -> {status} in {} ms", took.as_millis());
    for line in text(result).lines().take(6) {
        println!("   | {line}");
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = root().join("tests/demo/rebound.json");
    println!("Rebound demo: `rebound serve --config {}`", config.display());
    println!("(the gateway's own log goes to stderr, interleaved below)");
    let gw = Gateway::serve(&config, tempfile::tempdir()?).await;

    step("1. One catalogue from two servers");
    let names = gw.tool_names().await;
    println!(
        "{} tools; colliding names are prefixed: {:?}",
        names.len(),
        names.iter().filter(|n| n.contains("__")).collect::<Vec<_>>()
    );

    step("2. A real third-party server answers through the gateway");
    let t = Instant::now();
    let r = gw.call("get-sum", json!({"a": 2, "b": 40})).await;
    show("everything.get-sum(2, 40)", &r, t.elapsed());

    step("3. A server crashes mid-call: the call fails at once, with a report, not a hang");
    let t = Instant::now();
    let r = gw.call("crash", json!({})).await;
    show("flaky.crash()", &r, t.elapsed());

    step("4. The supervisor restarted it: the next call just works");
    let t = Instant::now();
    let r = gw.call("flaky__echo", json!({"message": "I am back"})).await;
    show("flaky.echo()", &r, t.elapsed());

    step("5. A call hangs: timed out after 2 s, cancelled upstream, reported");
    let t = Instant::now();
    let r = gw.call("hang", json!({})).await;
    show("flaky.hang()", &r, t.elapsed());

    step("6. Garbage on the server's stdout does not break the session");
    let t = Instant::now();
    let r = gw.call("garbage", json!({})).await;
    show("flaky.garbage()", &r, t.elapsed());

    step("7. Unknown tools are the only protocol errors");
    let err = gw.client.peer().call_tool(rmcp::model::CallToolRequestParams::new("no_such_tool")).await;
    println!("no_such_tool -> {}", err.map(|_| "answered?".to_owned()).unwrap_or_else(|e| e.to_string()));

    step("8. Shutdown: children get stdin closed, SIGTERM, SIGKILL; nothing is left behind");
    let status = gw.close().await;
    println!("gateway exited: {status}");
    Ok(())
}
