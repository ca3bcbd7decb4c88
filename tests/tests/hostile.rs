//! End to end: a third-party adapter written to attack the gateway (`tests/plugins/hostile`,
//! built by `cargo xtask test` into target/test-plugins), one attack per mode. Each is
//! contained: the client's call is answered, other servers keep serving, and the adapter
//! reaches only what its grant names. Each grant has a positive control.

use std::path::PathBuf;

use rebound_tests::{Gateway, HttpGateway, eventually, faulty, rewrite_config, root, text, until_offered};
use serde_json::{Value, json};

fn test_plugins() -> PathBuf {
    let dir = root().join("target/test-plugins");
    assert!(
        dir.join("hostile.wasm").is_file(),
        "run `cargo xtask test`, which builds the test plugins into {}",
        dir.display()
    );
    dir
}

/// Servers `a` (with the hostile adapter in `mode`, and `extra` keys) and `b` (with an
/// adapter that has no opinion), and the `rebound` settings `settings`.
fn config(dir: &std::path::Path, mode: &str, extra: Value, settings: Value) -> Value {
    let mut a = faulty("a", dir, &[]);
    a["adapter"] = json!("hostile");
    a["adapter_config"] = json!({"mode": mode});
    for (k, v) in extra.as_object().cloned().unwrap_or_default() {
        a[k] = v;
    }
    let mut b = faulty("b", dir, &[]);
    b["adapter"] = json!("misbehave");
    b["adapter_config"] = json!({"mode": "none"});
    let mut rebound = json!({
        "plugins_dir": test_plugins(),
        "plugin_cache_dir": dir.join("cache"),
        "errors_log": dir.join("errors.jsonl"),
        "restart": {"initial_delay_ms": 50},
    });
    for (k, v) in settings.as_object().cloned().unwrap_or_default() {
        rebound[k] = v;
    }
    json!({"mcpServers": {"a": a, "b": b}, "rebound": rebound})
}

async fn hostile(mode: &str, extra: Value, settings: Value) -> Gateway {
    let mode = mode.to_owned();
    Gateway::start(move |dir| config(dir, &mode, extra, settings)).await
}

fn calls_of(gw: &Gateway, server: &str, tool: &str) -> usize {
    gw.state(server, "calls").iter().filter(|c| *c == tool).count()
}

async fn server_status(gw: &Gateway, server: &str) -> Value {
    let s = gw.call("rebound_status", json!({})).await.structured_content.unwrap();
    s["servers"].as_array().unwrap().iter().find(|e| e["name"] == server).unwrap().clone()
}

/// What an adapter's `declare` makes the gateway say (here: patterns of 348 bytes and
/// 928 KiB of line breaks, forged log lines and terminal escapes) is shown bounded and on
/// one line: in
/// the status, the gateway's log and `rebound check`, whose load passes since the
/// adapter behaves until it sees its configuration. Its server serves on without it.
#[tokio::test]
async fn what_an_adapters_declare_says_is_shown_bounded_and_on_one_line() {
    let gw = hostile("declare-junk", json!({}), json!({})).await;
    assert!(text(&gw.call("a__echo", json!({"message": "hi"})).await).contains("hi"));
    let error = server_status(&gw, "a").await["adapter_error"].as_str().unwrap().to_owned();
    assert!(error.contains("has no `/` between server and tool"), "{error}");
    assert!(error.len() <= 5 << 10, "{} bytes", error.len());
    assert!(!error.chars().any(char::is_control), "{error}");
    let log = gw.log.lock().unwrap().clone();
    assert!(!log.contains("forged") || !log.lines().any(|l| l.starts_with("2026-01-01")), "a forged line: {log}");
    assert!(!log.contains('\u{1b}'), "a terminal escape in the log");
    gw.close().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rebound.json");
    std::fs::write(&path, config(dir.path(), "declare-junk", json!({}), json!({})).to_string()).unwrap();
    let out = std::process::Command::new(rebound_tests::bin("rebound")).args(["check", "--config"]).arg(&path).output();
    let out = out.unwrap();
    let printed = [out.stdout, out.stderr].concat();
    assert!(!printed.contains(&0x1b), "a terminal escape: {}", String::from_utf8_lossy(&printed));
    assert!(printed.len() < 64 << 10, "{} bytes", printed.len());
}

#[tokio::test]
async fn an_adapter_reaches_nothing_its_grant_does_not_name() {
    let gw = hostile("reach", json!({}), json!({})).await;
    let r = gw.call("a__fail", json!({"message": "boom"})).await;
    assert_eq!(r.is_error, Some(true));
    assert_eq!(calls_of(&gw, "b", "fail"), 0, "another server's tool was called");
    assert_eq!(calls_of(&gw, "a", "fail"), 1, "a tool unsafe to replay ran again");
    let a = server_status(&gw, "a").await;
    assert_eq!(a["restarts"], 0, "{a}");
    // The alternative on b, two restarts and two replays.
    assert_eq!(a["counters"]["adapter_steps_denied"], 5, "{a}");
    assert_eq!(text(&gw.call("b__echo", json!({"message": "fine"})).await), "b: fine");
    gw.close().await;
}

/// The operator counts what adapters were refused, by kind of step, in the metrics.
#[tokio::test]
async fn refused_plan_steps_are_counted_by_kind_in_the_metrics() {
    let gw = HttpGateway::start(|dir| config(dir, "reach", json!({}), json!({})), &[]).await;
    let client = gw.client(None).await.unwrap();
    let mut params = rmcp::model::CallToolRequestParams::new("a__fail");
    params.arguments = json!({"message": "boom"}).as_object().cloned();
    assert_eq!(client.peer().call_tool(params).await.unwrap().is_error, Some(true));
    let metrics = reqwest::get(format!("{}/metrics", gw.base)).await.unwrap().text().await.unwrap();
    // The alternative on b (a grant names none), two restarts and two replays.
    for (kind, n) in [("grant", 1), ("restart", 2), ("replay", 2), ("max-calls", 0), ("undeclared", 0)] {
        let line = format!(r#"rebound_plugin_denied_total{{server="a",kind="{kind}"}} {n}"#);
        assert!(metrics.lines().any(|l| l == line), "no `{line}` in:\n{metrics}");
    }
    let _ = client.cancel().await;
}

#[tokio::test]
async fn what_the_grant_names_does_run_once() {
    let grant = json!({"adapter_allow": {"tools": ["a/*", "b/fail"], "restart": true}});
    let gw = hostile("reach", grant, json!({})).await;
    let r = gw.call("a__fail", json!({"message": "boom"})).await;
    assert_eq!(r.is_error, Some(true));
    assert_eq!(calls_of(&gw, "b", "fail"), 1, "the granted alternative ran");
    let a = server_status(&gw, "a").await;
    assert_eq!(a["restarts"], 1, "one restart per call: {a}");
    // The second restart and the two replays of `fail`.
    assert_eq!(a["counters"]["adapter_steps_denied"], 3, "{a}");
    gw.close().await;
}

/// A call whose instance a reload replaced, and which then fails there (its process
/// killed), plans a restart: its successor, which did nothing wrong, is not restarted.
#[tokio::test]
async fn a_restart_planned_on_a_replaced_instance_leaves_its_successor_running() {
    let grant = json!({"adapter_allow": {"tools": ["a/*", "b/fail"], "restart": true}});
    let gw = hostile("reach", grant.clone(), json!({})).await;
    let dir = gw.dir.path().to_owned();
    // In flight on the first process for as long as it runs.
    let failing = gw.call("a__fail", json!({"message": "late", "ms": 600_000}));
    let relaunch = async {
        eventually("the call reached a", || calls_of(&gw, "a", "fail") == 1).await;
        let old = gw.state("a", "starts")[0].parse::<i32>().unwrap();
        let mut anew = config(&dir, "reach", grant.clone(), json!({}));
        anew["mcpServers"]["a"]["env"] = json!({"RELAUNCHED": "1"});
        rewrite_config(&dir, &anew);
        gw.logged(": restarted a").await;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(old), nix::sys::signal::Signal::SIGKILL).unwrap();
    };
    let (failed, ()) = tokio::join!(failing, relaunch);
    assert_eq!(failed.is_error, Some(true), "{failed:?}");
    assert_eq!(calls_of(&gw, "b", "fail"), 1, "the plan ran: its alternative first");
    assert_eq!(gw.state("a", "starts").len(), 2, "the first launch and the relaunch only");
    assert_eq!(server_status(&gw, "a").await["restarts"], 0);
    gw.logged("not restarted: the instance the call failed on was replaced or removed by a reload").await;
    assert_eq!(text(&gw.call("a__echo", json!({"message": "still"})).await), "a: still");
    gw.close().await;
}

#[tokio::test]
async fn a_grant_the_adapter_did_not_declare_is_refused_and_check_says_so() {
    let grant = json!({"adapter_allow": {"tools": ["a/*", "b/fail"], "restart": true}});
    let gw = hostile("reach-undeclared", grant, json!({})).await;
    gw.call("a__fail", json!({"message": "boom"})).await;
    assert_eq!(calls_of(&gw, "b", "fail"), 0);
    assert_eq!(server_status(&gw, "a").await["restarts"], 0);
    gw.close().await;

    // `rebound check` names both sides of the mismatch.
    let check = |config: fn(&std::path::Path) -> Value| {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rebound.json");
        std::fs::write(&path, config(dir.path()).to_string()).unwrap();
        let out = std::process::Command::new(rebound_tests::bin("rebound"))
            .args(["check", "--config"])
            .arg(&path)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let out = check(|d| {
        let grant = json!({"adapter_allow": {"tools": ["a/*", "b/fail"], "restart": true}});
        config(d, "reach-undeclared", grant, json!({}))
    });
    assert!(
        out.contains(r#"mcpServers.a.adapter_allow.tools[1] grants "b/fail", which adapter hostile does not ask for"#),
        "{out}"
    );
    assert!(
        out.contains("mcpServers.a.adapter_allow.restart grants restarts, which adapter hostile does not ask for"),
        "{out}"
    );

    let out = check(|d| config(d, "reach", json!({}), json!({})));
    assert!(
        out.contains(r#"adapter hostile asks for "b/fail", which mcpServers.a.adapter_allow.tools does not grant"#),
        "{out}"
    );
    assert!(out.contains("adapter hostile asks to restart `a`"), "{out}");
}

#[tokio::test]
async fn a_plan_makes_at_most_plugin_max_calls_calls() {
    let gw = hostile("flood-calls", json!({}), json!({"plugin_max_calls": 3})).await;
    gw.call("a__fail", json!({"message": "boom"})).await;
    assert_eq!(calls_of(&gw, "a", "echo"), 3);
    gw.close().await;
}

#[tokio::test]
async fn an_adapter_that_sleeps_in_wasi_is_stopped_at_its_deadline_and_the_pool_never_runs_dry() {
    let settings = json!({"plugin_timeout_ms": 100, "http": {"max_concurrent_per_client": 64}});
    let gw = hostile("sleep", json!({}), settings).await;
    // More calls at once than the instance pool holds (32), each sleeping an hour.
    let calls = (0..40).map(|i| {
        let peer = gw.client.peer().clone();
        async move {
            let mut p = rmcp::model::CallToolRequestParams::new("a__fail");
            p.arguments = json!({"message": format!("boom {i}")}).as_object().cloned();
            peer.call_tool(p).await
        }
    });
    // Meanwhile, an innocent adapter is asked about a failure of its own server.
    let innocent = async {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        gw.call("b__fail", json!({"message": "b fails"})).await
    };
    let (answers, b_answer) = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        futures::future::join(futures::future::join_all(calls), innocent),
    )
    .await
    .expect("every call answered");
    for (i, r) in answers.into_iter().enumerate() {
        assert_eq!(text(&r.unwrap()), format!("boom {i}"), "the built-in classification answered");
    }
    assert_eq!(text(&b_answer), "b fails");
    let a = server_status(&gw, "a").await;
    assert!(a["adapter"]["last_fault"].as_str().unwrap().contains("deadline"), "{a}");
    assert!(a["adapter"]["quarantined_for_ms"].as_u64().is_some(), "{a}");
    let b = server_status(&gw, "b").await;
    assert_eq!((&b["adapter"]["faults"], &b["adapter"]["busy"]), (&json!(0), &json!(0)), "{b}");
    gw.close().await;
}

/// A call that would weigh more than a quarter of the adapter's memory once read (its
/// bytes, and about 128 for each JSON value: here a client's million zeros) is not shown
/// to it: the built-in classification answers, and the adapter, which could not have
/// held it, is not at fault, nor quarantined for what a client sent. A lighter one is
/// shown.
#[tokio::test]
async fn a_call_too_heavy_for_the_adapters_memory_is_not_shown_to_it() {
    let gw = hostile("parse", json!({}), json!({})).await;
    let zeros = vec![0; 1 << 20];
    for _ in 0..3 {
        let r = gw.call("a__fail", json!({"message": "boom", "values": zeros})).await;
        assert_eq!(r.is_error, Some(true));
    }
    let a = server_status(&gw, "a").await;
    assert_eq!(a["adapter"]["faults"], 0, "{}", a["adapter"]);
    assert_eq!(a["adapter"]["quarantined_for_ms"], Value::Null, "{}", a["adapter"]);
    assert_eq!(a["adapter"]["too_heavy"], 6, "neither its classify nor its plan: {}", a["adapter"]);
    // Nor is it shown a successful call as heavy (found so before the call is copied).
    let r = gw.call("a__echo", json!({"message": "heavy", "values": zeros})).await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    let mut a = server_status(&gw, "a").await;
    for _ in 0..100 {
        if a["adapter"]["too_heavy"] != 6 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        a = server_status(&gw, "a").await;
    }
    assert_eq!((&a["adapter"]["too_heavy"], &a["adapter"]["faults"]), (&json!(7), &json!(0)), "{}", a["adapter"]);
    // 40,000 zeros weigh about 5 MiB read: shown (and read within its 32 MiB).
    let r = gw.call("a__fail", json!({"message": "boom", "values": vec![0; 40_000]})).await;
    assert_eq!(r.is_error, Some(true));
    let a = server_status(&gw, "a").await;
    assert_eq!((&a["adapter"]["too_heavy"], &a["adapter"]["faults"]), (&json!(7), &json!(0)), "{}", a["adapter"]);
    gw.close().await;
}

#[tokio::test]
async fn a_log_flood_is_capped_and_counted() {
    let gw = hostile("log-flood", json!({}), json!({"plugin_timeout_ms": 500})).await;
    let r = gw.call("a__fail", json!({"message": "boom"})).await;
    assert_eq!(text(&r), "boom");
    let a = server_status(&gw, "a").await;
    assert!(a["adapter"]["log_lines_dropped"].as_u64().unwrap() > 0, "{a}");
    gw.close().await;
}

/// What the gateway logs of a plan's step it refused (here its target, a server outside
/// the grant) is shown on one line: the adapter cannot forge the gateway's log lines.
#[tokio::test]
async fn a_refused_step_cannot_forge_a_line_of_the_gateways_log() {
    let gw = hostile("forge-denied", json!({}), json!({})).await;
    let r = gw.call("a__fail", json!({"message": "boom"})).await;
    assert_eq!(r.is_error, Some(true));
    gw.logged("refused a step of the adapter's plan").await;
    let log = gw.log.lock().unwrap().clone();
    assert!(!log.lines().any(|l| l.starts_with("2026-01-01")), "a forged line: {log}");
    assert!(!log.contains('\u{2028}'), "a line separator in the log: {log}");
    gw.close().await;
}

#[tokio::test]
async fn a_plan_past_its_size_limits_is_a_fault_and_the_built_in_plan_answers() {
    for (mode, why) in [
        ("many-steps", "its plan has 65 steps, more than 64"),
        ("long-string", "its plan has a string of 66560 bytes"),
        ("heavy-plan", "bytes of text, more than 1048576"),
        ("fuel", "too much data is being copied between the host and the guest"),
    ] {
        let gw = hostile(mode, json!({}), json!({})).await;
        let r = gw.call("a__fail", json!({"message": "boom"})).await;
        assert_eq!(r.is_error, Some(true), "{mode}");
        assert!(text(&r).contains("boom"), "{mode}: {}", text(&r));
        let a = server_status(&gw, "a").await;
        assert_eq!(a["adapter"]["faults"], 1, "{mode}: {a}");
        assert!(a["adapter"]["last_fault"].as_str().unwrap().contains(why), "{mode}: {a}");
        assert_eq!(text(&gw.call("a__echo", json!({"message": "alive"})).await), "a: alive");
        gw.close().await;
    }
}

#[tokio::test]
async fn an_adapter_never_sees_a_secret_so_it_cannot_launder_one() {
    // A quote and a backslash: escaped in JSON text, where a text-only redaction misses them.
    const KEY: &str = r#"sk-live-01"23\4567-89ab"#;
    let env = json!({"env": {"API_KEY": KEY}});
    let gw = hostile("launder", env, json!({})).await;
    let r = gw.call("a__fail", json!({"message": format!("auth failed for key {KEY}")})).await;
    let answer = text(&r);
    assert!(answer.contains("laundered: "), "{answer}");
    let escaped = serde_json::to_string(KEY).unwrap();
    let escaped = escaped.trim_matches('"');
    for form in [KEY, escaped] {
        let reversed: String = form.chars().rev().collect();
        let laundered = reversed.replace('-', "_");
        for f in [form, &reversed, &laundered] {
            assert!(!answer.contains(f), "{f} in {answer}");
        }
    }
    gw.close().await;
}

/// What an adapter says of a failure is redacted before anyone is shown it, the agent
/// reading its note on the tool's own error included: it may know a secret it was never
/// shown (here one the operator put in its configuration too).
#[tokio::test]
async fn an_adapters_own_words_are_redacted_where_the_agent_reads_them() {
    const KEY: &str = "sk-live-13579bdf02468ace";
    let extra = json!({"env": {"API_KEY": KEY}, "adapter_config": {"mode": "tell-config", "key": KEY}});
    let gw = hostile("tell-config", extra, json!({})).await;
    let r = gw.call("a__fail", json!({"message": "no such file"})).await;
    let answer = text(&r);
    assert!(answer.contains("[rebound: {") && answer.contains("tell-config"), "{answer}");
    assert!(!answer.contains(KEY), "{answer}");
    gw.close().await;
}

/// A secret a reload brings (here another server's) is hidden at once from an adapter the
/// reload keeps running.
#[tokio::test]
async fn a_secret_a_reload_brings_is_hidden_from_the_adapters_it_keeps() {
    const KEY: &str = "sk-live-0123456789abcdef";
    let gw = hostile("launder", json!({}), json!({})).await;
    let dir = gw.dir.path().to_owned();
    let mut next = config(&dir, "launder", json!({}), json!({}));
    next["mcpServers"]["b"]["env"] = json!({"API_KEY": KEY});
    reloaded_with(&gw, next, "c").await;
    launders_without(&gw, KEY).await;
    gw.close().await;
}

/// `config`, with a server `marker` added, applied by a reload.
async fn reloaded_with(gw: &Gateway, mut config: Value, marker: &str) {
    config["mcpServers"][marker] = faulty(marker, gw.dir.path(), &[]);
    rewrite_config(gw.dir.path(), &config);
    let tool = format!("{marker}__echo");
    assert!(until_offered(gw.client.peer(), &tool, true).await, "the reload adding {marker} was not applied");
}

/// The `launder` adapter's answer to a failure that quotes `key`: laundered, without it.
async fn launders_without(gw: &Gateway, key: &str) {
    let r = gw.call("a__fail", json!({"message": format!("auth failed for key {key}")})).await;
    let answer = text(&r);
    assert!(answer.contains("laundered: "), "{answer}");
    let reversed: String = key.chars().rev().map(|c| if c == '-' { '_' } else { c }).collect();
    assert!(!answer.contains(&reversed), "{answer}");
}

/// A secret of an earlier configuration (here one a reload took out) is hidden from an
/// adapter a reload brings in as well: it may see what a process still running an
/// earlier launch says.
#[tokio::test]
async fn a_secret_an_earlier_configuration_had_is_hidden_from_an_adapter_a_reload_brings() {
    const KEY: &str = "sk-live-0246813579abcdef";
    let gw = hostile("launder", json!({}), json!({})).await;
    let dir = gw.dir.path().to_owned();
    let mut first = config(&dir, "launder", json!({}), json!({}));
    first["mcpServers"]["b"]["env"] = json!({"API_KEY": KEY});
    reloaded_with(&gw, first, "c").await;
    // The key gone, and `a`'s adapter a new one (its configuration changed).
    let next = config(&dir, "launder", json!({"adapter_config": {"mode": "launder", "anew": true}}), json!({}));
    reloaded_with(&gw, next, "d").await;
    launders_without(&gw, KEY).await;
    gw.close().await;
}

/// A session keeps its copy of the adapter across reloads; a secret that a later reload
/// brings is hidden from that copy too, even after an earlier reload moved the adapter
/// to new limits.
#[tokio::test]
async fn a_secret_a_reload_brings_is_hidden_from_the_copies_sessions_keep() {
    const KEY: &str = "sk-live-fedcba9876543210";
    let session_scoped = |dir: &std::path::Path, settings: Value| {
        let mut c = config(dir, "launder", json!({}), settings);
        c["mcpServers"]["a"]["scope"] = json!("session");
        c
    };
    let gw = HttpGateway::start(|dir| session_scoped(dir, json!({})), &[]).await;
    let client = gw.client(None).await.unwrap();
    let call = |tool: &str, message: String| {
        let mut p = rmcp::model::CallToolRequestParams::new(tool.to_owned());
        p.arguments = json!({"message": message}).as_object().cloned();
        client.peer().call_tool(p)
    };
    assert!(text(&call("a__fail", "first".into()).await.unwrap()).contains("laundered: "));
    let dir = gw.dir.path().to_owned();
    let reload = |config: Value, marker: &'static str| {
        let (dir, peer) = (dir.clone(), client.peer().clone());
        async move {
            rewrite_config(&dir, &config);
            assert!(until_offered(&peer, marker, true).await, "the reload adding {marker} was not applied");
        }
    };
    // New limits: the adapter moves to a new runtime.
    let mut moved = session_scoped(&dir, json!({"plugin_timeout_ms": 250}));
    moved["mcpServers"]["c"] = faulty("c", &dir, &[]);
    reload(moved.clone(), "c__echo").await;
    // Then another server's secret.
    let mut secret = moved;
    secret["mcpServers"]["b"]["env"] = json!({"API_KEY": KEY});
    secret["mcpServers"]["d"] = faulty("d", &dir, &[]);
    reload(secret, "d__echo").await;
    let answer = text(&call("a__fail", format!("auth failed for key {KEY}")).await.unwrap());
    assert!(answer.contains("laundered: "), "{answer}");
    let reversed: String = KEY.chars().rev().map(|c| if c == '-' { '_' } else { c }).collect();
    assert!(!answer.contains(&reversed), "{answer}");
    let _ = client.cancel().await;
}

#[tokio::test]
async fn an_adapters_own_category_never_becomes_a_metric_label() {
    let gw = HttpGateway::start(|dir| config(dir, "label", json!({}), json!({})), &[]).await;
    let client = gw.client(None).await.unwrap();
    let mut p = rmcp::model::CallToolRequestParams::new("a__fail");
    p.arguments = json!({"message": "boom"}).as_object().cloned();
    client.peer().call_tool(p).await.unwrap();
    let metrics = reqwest::get(format!("{}/metrics", gw.base)).await.unwrap().text().await.unwrap();
    assert!(!metrics.contains("forged"), "{metrics}");
    assert!(metrics.contains(r#"rebound_attempt_failures_total{server="a",category="other"} 1"#), "{metrics}");
    assert_eq!(metrics.matches("# EOF").count(), 1, "one end of the exposition");
    let _ = client.cancel().await;
}

/// A granted restart restarts the process the failed call ran on: a call an open breaker
/// shed never reached one, and restarts nothing.
#[tokio::test]
async fn a_call_a_breaker_shed_restarts_nothing() {
    let grant = json!({"adapter_allow": {"tools": ["a/*", "b/fail"], "restart": true},
        "recovery": {"timeout_ms": 300, "retry": {"max_attempts": 1},
            "breaker": {"failure_threshold": 1, "open_ms": 600000}}});
    let gw = hostile("reach", grant, json!({})).await;
    gw.call("a__hang", json!({})).await;
    eventually("restarted once", || gw.state("a", "starts").len() == 2).await;
    let shed = gw.call("a__hang", json!({})).await;
    assert!(text(&shed).contains("circuit"), "{}", text(&shed));
    gw.logged("not restarted: the call never reached a process of it").await;
    assert_eq!(gw.state("a", "starts").len(), 2, "the healthy process is left running");
    gw.close().await;
}

#[tokio::test]
async fn granted_restarts_count_towards_the_crash_loop() {
    let grant = json!({"adapter_allow": {"tools": ["a/*", "b/fail"], "restart": true}});
    let settings = json!({"restart": {"initial_delay_ms": 50, "crash_loop_limit": 2, "down_retry_ms": 600000}});
    let gw = hostile("reach", grant, settings).await;
    for i in 0..2 {
        gw.call("a__fail", json!({"message": format!("boom {i}")})).await;
    }
    let a = server_status(&gw, "a").await;
    assert_eq!(a["status"], "down", "an adapter that restarts on every call ends a crash loop: {a}");
    gw.close().await;
}
