//! End to end: the first-party adapters through the gateway, against servers that
//! publish lean-lsp-mcp's and hol4-mcp's real tools and fail the way those servers do:
//! lean searches abort with -32001, a hung `hol_send` needs `hol_interrupt`.

use rebound_tests::{Gateway, HttpGateway, eventually, faulty, root, text};
use serde_json::{Value, json};

fn fixture(name: &str) -> String {
    root().join("tests/fixtures/tool-schemas").join(name).display().to_string()
}

/// A gateway in front of one emulated server `name` with its adapter.
async fn emulated(
    name: &'static str,
    emulate: &'static str,
    fixture_file: &'static str,
    adapter: &'static str,
    recovery: Value,
) -> Gateway {
    Gateway::start(move |dir| {
        let mut server = faulty(name, dir, &["--emulate", emulate, "--tools", &fixture(fixture_file)]);
        server["adapter"] = json!(adapter);
        server["adapter_config"] = json!({"retry_delay_ms": 50});
        server["recovery"] = recovery;
        json!({
            "mcpServers": {name: server},
            "rebound": {"plugins_dir": root().join("target/plugins"), "plugin_cache_dir": dir.join("cache"), "restart": {"initial_delay_ms": 50}},
        })
    })
    .await
}

fn calls(gw: &Gateway, server: &str, tool: &str) -> usize {
    gw.state(server, "calls").iter().filter(|c| *c == tool).count()
}

#[tokio::test]
async fn an_aborting_lean_search_is_answered_by_its_alternative() {
    for version in ["lean-lsp-mcp-0.30.0.json", "lean-lsp-mcp-0.31.0.json"] {
        let gw = emulated("lean", "lean", version, "lean-fallback", json!({})).await;
        let r = gw.call("lean_leansearch", json!({"query": "Nat.add_comm", "num_results": 3})).await;
        assert_ne!(r.is_error, Some(true), "{version}: {r:?}");
        let t = text(&r);
        assert!(t.starts_with("lean_loogle: results for \"Nat.add_comm\" (at most 3)"), "{version}: {t}");
        assert!(t.contains("[rebound: answered by `lean_loogle` on `lean` because `lean_leansearch` failed"), "{t}");
        assert_eq!(r.meta.as_ref().unwrap().0["rebound"]["answered_by"]["tool"], "lean_loogle");
        // Retried once, then the first alternative.
        assert_eq!(calls(&gw, "lean", "lean_leansearch"), 2, "{version}");
        assert_eq!(calls(&gw, "lean", "lean_loogle"), 1, "{version}");

        let d = gw.call("lean_diagnostic_messages", json!({"file_path": "A.lean", "start_line": 7})).await;
        assert!(text(&d).starts_with("lean_goal: at \"A.lean\":7:null"), "{version}: {}", text(&d));
        let l = gw.call("lean_local_search", json!({"query": "add_comm"})).await;
        assert_eq!(l.is_error, Some(true));
        assert!(text(&l).contains("continue with the partial results"), "{}", text(&l));
        gw.close().await;
    }
}

#[tokio::test]
async fn state_search_falls_back_to_hammer_premise_where_it_exists() {
    let gw = emulated("lean", "lean", "lean-lsp-mcp-0.30.0.json", "lean-fallback", json!({})).await;
    let r = gw.call("lean_state_search", json!({"file_path": "B.lean", "line": 4, "column": 2})).await;
    assert!(text(&r).starts_with("lean_hammer_premise: at \"B.lean\":4:2"), "{}", text(&r));
    gw.close().await;
}

#[tokio::test]
async fn a_hung_hol_send_is_interrupted_and_not_replayed() {
    let gw = emulated(
        "hol",
        "hol",
        "hol4-mcp-0.1.0.json",
        "hol-cursor",
        json!({"tools": {"hol_send": {"timeout_ms": 300}}}),
    )
    .await;
    gw.call("hol_start", json!({"workdir": "/proj", "name": "main"})).await;
    let r = gw.call("hol_send", json!({"session": "main", "command": "e(loop_tac)"})).await;
    assert_eq!(r.is_error, Some(true));
    let t = text(&r);
    assert!(t.contains("no answer within 300 ms") || t.contains("did not finish in time"), "{t}");
    assert!(t.contains("interrupted (hol_interrupt) and not replayed"), "{t}");
    assert_eq!(calls(&gw, "hol", "hol_send"), 1, "never replayed");
    eventually("hol_interrupt for the session", || gw.state("hol", "interrupted") == ["main"]).await;
    gw.close().await;
}

#[tokio::test]
async fn after_the_hol_server_crashes_the_next_send_works_on_the_restored_session() {
    let gw = emulated("hol", "hol", "hol4-mcp-0.1.0.json", "hol-cursor", json!({})).await;
    assert!(text(&gw.call("hol_start", json!({"workdir": "/proj", "name": "main"})).await).contains("started"));
    let crashed = gw.call("crash", json!({})).await;
    assert_eq!(crashed.is_error, Some(true));
    let r = gw.call("hol_send", json!({"session": "main", "command": "e(simp[])"})).await;
    assert_eq!(text(&r), "ok: e(simp[]) in main", "{r:?}");
    assert_eq!(gw.state("hol", "starts").len(), 2, "the server was restarted once");
    assert_eq!(calls(&gw, "hol", "hol_start"), 2, "the adapter replayed hol_start");
    assert_eq!(r.meta.as_ref().unwrap().0["rebound"]["status"], "recovered");
    gw.close().await;
}

#[tokio::test]
async fn a_failed_holmake_points_to_the_theory_log() {
    let gw = emulated("hol", "hol", "hol4-mcp-0.1.0.json", "hol-cursor", json!({})).await;
    let r = gw.call("holmake", json!({"workdir": "/proj"})).await;
    assert_eq!(r.is_error, Some(true));
    assert_eq!(
        text(&r),
        "Holmake failed:\nFailed to build fooTheory\n\n[rebound: Holmake failed building `foo`; read its log with hol_log(workdir=\"/proj\", theory=\"foo\")]"
    );
    gw.close().await;
}

#[tokio::test]
async fn thanos_classify_is_the_default_adapter_and_advises_fixing_rejected_arguments() {
    let gw = Gateway::start(|dir| {
        json!({
            "mcpServers": {"a": faulty("a", dir, &[])},
            "rebound": {"plugins_dir": root().join("target/plugins"), "plugin_cache_dir": dir.join("cache")},
        })
    })
    .await;
    let s = gw.call("rebound_status", json!({})).await.structured_content.unwrap();
    assert_eq!(s["servers"][0]["adapter"]["name"], "thanos-classify", "{s}");
    // A validation error: no retry, and advice to fix the arguments.
    let r = gw.call("rpc_error", json!({"code": -32602, "message": "missing `path`"})).await;
    let t = text(&r);
    assert!(t.contains("the arguments were rejected; fix them against the tool's schema"), "{t}");
    assert!(t.contains("Tried: 1 attempt"), "{t}");
    gw.close().await;
}

/// Over HTTP a shared server's adapter would see every client's calls: it is shown only
/// the tools `adapter_allow.observes` grants. hol-cursor, not granted them, never learns
/// of the HOL session a client started, and so cannot restore it after a crash; granted
/// them, it does.
#[tokio::test]
async fn over_http_a_shared_servers_adapter_observes_only_what_is_granted() {
    for granted in [false, true] {
        let gw = HttpGateway::start(
            |dir| {
                let mut server = faulty("hol", dir, &["--emulate", "hol", "--tools", &fixture("hol4-mcp-0.1.0.json")]);
                server["adapter"] = json!("hol-cursor");
                server["adapter_config"] = json!({"retry_delay_ms": 50});
                if granted {
                    server["adapter_allow"] = json!({"observes": ["hol_*"]});
                }
                json!({
                    "mcpServers": {"hol": server},
                    "rebound": {"plugins_dir": root().join("target/plugins"), "plugin_cache_dir": dir.join("cache"), "restart": {"initial_delay_ms": 50}},
                })
            },
            &[],
        )
        .await;
        if !granted {
            gw.logged("observes its calls, but over HTTP it is shown none").await;
        }
        let client = gw.client(None).await.unwrap();
        let call = |tool: &'static str, args: Value| {
            let mut params = rmcp::model::CallToolRequestParams::new(tool);
            params.arguments = args.as_object().cloned();
            client.peer().call_tool(params)
        };
        let started = call("hol_start", json!({"workdir": "/proj", "name": "main"})).await.unwrap();
        assert!(text(&started).contains("started"), "{started:?}");
        assert_eq!(call("crash", json!({})).await.unwrap().is_error, Some(true));
        let sent = call("hol_send", json!({"session": "main", "command": "e(simp[])"})).await.unwrap();
        let replayed = gw.state("hol", "calls").iter().filter(|c| *c == "hol_start").count();
        assert_eq!(
            (text(&sent) == "ok: e(simp[]) in main", replayed),
            (granted, if granted { 2 } else { 1 }),
            "{sent:?}"
        );
        let _ = client.cancel().await;
    }
}
