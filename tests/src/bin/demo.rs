//! `cargo xtask demo`: the gateway in front of a real server (server-everything) and the
//! fault-injecting one, driven by a scripted MCP client, recovering real failures.

use std::time::Instant;

use rebound_tests::{Gateway, root, text};
use serde_json::{Value, json};

fn step(title: &str) {
    println!("\n\x1b[1m== {title}\x1b[0m");
}

fn show(label: &str, result: &rmcp::model::CallToolResult, took: std::time::Duration) {
    let status = if result.is_error == Some(true) { "\x1b[33misError\x1b[0m" } else { "\x1b[32mok\x1b[0m" };
    let how =
        result.meta.as_ref().and_then(|m| m.0.get("rebound")).and_then(|r| r["status"].as_str()).unwrap_or("direct");
    println!("{label} -> {status} ({how}) in {} ms", took.as_millis());
    for line in text(result).lines().take(6) {
        println!("   | {line}");
    }
}

async fn call(gw: &Gateway, label: &str, tool: &str, args: Value) -> rmcp::model::CallToolResult {
    let t = Instant::now();
    let r = gw.call(tool, args).await;
    show(label, &r, t.elapsed());
    r
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let root = root();
    let config = root.join("tests/demo/rebound.json");
    let state = root.join("target/demo-state");
    let errors = root.join("target/demo-errors.jsonl");
    let _ = std::fs::remove_dir_all(&state);
    let _ = std::fs::remove_file(&errors);
    std::fs::create_dir_all(&state)?;
    println!("Rebound demo: `rebound serve --config {}`", config.display());
    println!("(the gateway's own log goes to stderr, interleaved below)");
    let gw = Gateway::serve(&config, tempfile::tempdir()?).await;

    step("1. One catalogue from four servers");
    let names = gw.tool_names().await;
    println!(
        "{} tools; colliding names are prefixed: {:?}",
        names.len(),
        names.iter().filter(|n| n.contains("__")).collect::<Vec<_>>()
    );

    step("2. A real third-party server answers through the gateway");
    call(&gw, "everything.get-sum(2, 40)", "get-sum", json!({"a": 2, "b": 40})).await;

    step("3. A server crashes mid-call: the call fails at once, with a report, not a hang");
    call(&gw, "flaky.crash()", "flaky__crash", json!({})).await;

    step("4. The supervisor restarted it: the next call just works");
    call(&gw, "flaky.echo()", "flaky__echo", json!({"message": "I am back"})).await;

    step("5. Every fifth call of a read-only tool aborts with -32001: retried, nobody notices");
    let t = Instant::now();
    let ok = futures_count(&gw, "flaky", 20).await;
    println!("flaky() x20 -> {ok}/20 ok in {} ms", t.elapsed().as_millis());

    step("6. The same failure on a tool without read-only/idempotent hints is not replayed");
    for i in 0..5 {
        let r = gw.call("flaky_write", json!({"q": i})).await;
        if r.is_error == Some(true) {
            show("flaky_write()", &r, std::time::Duration::ZERO);
        }
    }

    step("7. A search that keeps aborting is answered by its alternative (config `fallbacks`)");
    call(&gw, "flaky.search(\"Nat.add_comm\")", "search", json!({"query": "Nat.add_comm", "num_results": 5})).await;

    step("8. A call hangs: timed out after 1 s, cancelled upstream, reported");
    let r = gw.call("hang", json!({})).await;
    show("flaky.hang() (3 attempts)", &r, std::time::Duration::ZERO);

    step("9. A rate-limited tool: Rebound waits the server's retry-after, then succeeds");
    call(&gw, "flaky.rate_limited()", "rate_limited", json!({})).await;

    step("10. One tool's outage: its breaker opens and answers at once; the server's other tools keep serving");
    std::fs::write(state.join("outage"), "")?;
    for i in 0..6 {
        let t = Instant::now();
        let r = gw.call("outage", json!({})).await;
        let first = text(&r).lines().next().unwrap_or_default().to_owned();
        println!(
            "outage() #{i} -> {} in {} ms: {first}",
            if r.is_error == Some(true) { "isError" } else { "ok" },
            t.elapsed().as_millis()
        );
    }
    call(&gw, "flaky.echo(\"still here\")", "flaky__echo", json!({"message": "still here"})).await;
    let status = gw.call("rebound_status", json!({})).await.structured_content.unwrap_or_default();
    let flaky =
        status["servers"].as_array().and_then(|s| s.iter().find(|s| s["name"] == "flaky")).cloned().unwrap_or_default();
    println!(
        "rebound_status: server breaker {}, `outage`'s breaker {}, counters {}",
        flaky["breaker"]["state"], flaky["tool_breakers"]["outage"]["state"], flaky["counters"]
    );
    std::fs::remove_file(state.join("outage"))?;
    println!("(server back; waiting for the breaker's probe)");
    tokio::time::sleep(std::time::Duration::from_millis(2100)).await;
    call(&gw, "outage() after recovery", "outage", json!({})).await;

    step("11. lean-fallback: a search that aborts is retried once, then answered by its alternative");
    call(
        &gw,
        "lean.lean_leansearch(\"Nat.add_comm\")",
        "lean_leansearch",
        json!({"query": "Nat.add_comm", "num_results": 3}),
    )
    .await;
    call(
        &gw,
        "lean.lean_diagnostic_messages(A.lean:7)",
        "lean_diagnostic_messages",
        json!({"file_path": "A.lean", "start_line": 7}),
    )
    .await;

    step("12. hol-cursor: a hung hol_send is interrupted, never replayed");
    call(&gw, "hol.hol_start(/proj, main)", "hol_start", json!({"workdir": "/proj", "name": "main"})).await;
    call(&gw, "hol.hol_send(main, loop)", "hol_send", json!({"session": "main", "command": "e(loop_tac)"})).await;

    step("13. hol-cursor: the HOL server crashes; the next hol_send works on the restored session");
    call(&gw, "hol.crash()", "hol__crash", json!({})).await;
    call(&gw, "hol.hol_send(main, simp)", "hol_send", json!({"session": "main", "command": "e(simp[])"})).await;

    step("14. thanos-classify, the default adapter: advice for a validation error");
    call(&gw, "flaky.rpc_error(-32602)", "rpc_error", json!({"code": -32602, "message": "missing `path`"})).await;

    step("15. Every failure is in the errors log, one JSON line each");
    let log = std::fs::read_to_string(&errors).unwrap_or_default();
    println!("{}: {} entries; the first:", errors.display(), log.lines().count());
    if let Some(first) = log.lines().next() {
        let v: Value = serde_json::from_str(first)?;
        println!("{}", serde_json::to_string_pretty(&v)?);
    }

    step("16. Shutdown: children get stdin closed, SIGTERM, SIGKILL; nothing is left behind");
    let status = gw.close().await;
    println!("gateway exited: {status}");
    Ok(())
}

async fn futures_count(gw: &Gateway, tool: &str, n: usize) -> usize {
    let mut ok = 0;
    for i in 0..n {
        ok += usize::from(gw.call(tool, json!({"q": i})).await.is_error != Some(true));
    }
    ok
}
