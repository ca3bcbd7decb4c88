//! End to end: the adapter runtime. Misbehaving plugins (built by `cargo xtask test`
//! into target/test-plugins) are contained while the gateway keeps answering; broken ones
//! are rejected with the file and the reason.

use std::path::{Path, PathBuf};
use std::process::Command;

use rebound_tests::{Gateway, HttpGateway, bin, faulty, rewrite_config, root, text, until_offered};
use serde_json::{Value, json};

fn test_plugins() -> PathBuf {
    let dir = root().join("target/test-plugins");
    assert!(
        dir.join("misbehave.wasm").is_file(),
        "run `cargo xtask test`, which builds the test plugins into {}",
        dir.display()
    );
    dir
}

/// A gateway whose server `a` uses the `misbehave` plugin in `mode`.
async fn misbehaving(mode: &str) -> Gateway {
    misbehaving_within(mode, 100).await
}

/// [`misbehaving`], each adapter call given `timeout_ms`: where the deadline is not what
/// a test is about, room for a machine loaded by the other tests.
async fn misbehaving_within(mode: &str, timeout_ms: u64) -> Gateway {
    let plugins = test_plugins();
    let mode = mode.to_owned();
    Gateway::start(move |dir| {
        let mut a = faulty("a", dir, &[]);
        a["adapter"] = json!("misbehave");
        a["adapter_config"] = json!({"mode": mode});
        json!({
            "mcpServers": {"a": a},
            "rebound": {"plugins_dir": plugins, "plugin_timeout_ms": timeout_ms, "plugin_memory_mb": 16, "plugin_cache_dir": dir.join("cache")},
        })
    })
    .await
}

async fn adapter_status(gw: &Gateway) -> Value {
    let s = gw.call("rebound_status", json!({})).await.structured_content.unwrap();
    s["servers"][0]["adapter"].clone()
}

#[tokio::test]
async fn a_looping_plugin_is_stopped_at_its_deadline_and_quarantined() {
    let gw = misbehaving("loop").await;
    for i in 0..4 {
        // `fail` makes the adapter classify, which loops; the tool's own error still
        // comes back, from the built-in classifier.
        let r = gw.call("fail", json!({"message": format!("disk full {i}")})).await;
        assert_eq!(text(&r), format!("disk full {i}"));
    }
    let status = adapter_status(&gw).await;
    assert_eq!(status["faults"], 3, "{status}");
    assert!(status["quarantined_for_ms"].as_u64().unwrap() > 0, "{status}");
    assert!(status["last_fault"].as_str().unwrap().contains("deadline"), "{status}");
    assert_eq!(text(&gw.call("echo", json!({"message": "alive"})).await), "a: alive");
    gw.close().await;
}

/// Adapters that spin up to their deadline, as many at once as the pool lets one adapter
/// hold, keep the gateway's own threads for one epoch tick each at most: meanwhile
/// another server's call is answered (over stdio the gateway has one thread; a guest
/// that kept it would hold every server's traffic until the guests gave up).
#[tokio::test]
async fn spinning_adapters_do_not_hold_other_servers_calls() {
    let plugins = test_plugins();
    let gw = Gateway::start(move |dir| {
        let mut a = faulty("a", dir, &[]);
        a["adapter"] = json!("misbehave");
        a["adapter_config"] = json!({"mode": "loop"});
        json!({
            "mcpServers": {"a": a, "b": faulty("b", dir, &[])},
            // Long enough for the three calls below on a loaded machine.
            "rebound": {"plugins_dir": plugins, "plugin_timeout_ms": 4000, "plugin_cache_dir": dir.join("cache")},
        })
    })
    .await;
    let order = std::sync::Mutex::new(Vec::new());
    let (gw, order) = (&gw, &order);
    let spinning = (0..16).map(|i| async move {
        gw.call("a__fail", json!({"message": format!("spin {i}")})).await;
        order.lock().unwrap().push("a");
    });
    let other = async {
        // Once the guests spin: every failed call reached the server, and is consulting them.
        rebound_tests::eventually("the failed calls", || gw.state("a", "calls").len() >= 16).await;
        // Three in a row: each took over a second while the guests held the thread.
        for i in 0..3 {
            assert_eq!(text(&gw.call("b__echo", json!({"message": format!("m{i}")})).await), format!("b: m{i}"));
        }
        order.lock().unwrap().push("b");
    };
    futures::future::join(futures::future::join_all(spinning), other).await;
    let order = order.lock().unwrap().clone();
    assert_eq!(order.first(), Some(&"b"), "{order:?}");
    // Each waited for the plugins' threads behind its own adapter's other calls: that is
    // no excuse, and the spinning adapter is quarantined.
    let status = gw.call("rebound_status", json!({})).await.structured_content.unwrap();
    let a = status["servers"].as_array().unwrap().iter().find(|s| s["name"] == "a").unwrap().clone();
    assert!(a["adapter"]["quarantined_for_ms"].as_u64().is_some(), "{a}");
}

/// An adapter replaced by a reload (here its server's entry changed) takes up the old
/// one's counts: its faults go on from there, and `/metrics` never counts them down.
#[tokio::test]
async fn an_adapter_replaced_by_a_reload_keeps_counting_its_faults() {
    let plugins = test_plugins();
    let config = move |dir: &Path, changed: bool| {
        let mut a = faulty("a", dir, &[]);
        a["adapter"] = json!("misbehave");
        a["adapter_config"] = json!({"mode": "loop"});
        let mut servers = json!({"a": a});
        if changed {
            servers["a"]["recovery"] = json!({"timeout_ms": 12345});
            servers["b"] = faulty("b", dir, &[]); // its tools say the reload is applied
        }
        json!({
            "mcpServers": servers,
            "rebound": {"plugins_dir": plugins, "plugin_timeout_ms": 100, "tool_names": "always",
                        "plugin_cache_dir": dir.join("cache")},
        })
    };
    let first = config.clone();
    let gw = Gateway::start(move |dir| first(dir, false)).await;
    assert_eq!(fault(&gw).await["faults"], 1);
    rewrite_config(gw.dir.path(), &config(gw.dir.path(), true));
    assert!(until_offered(gw.client.peer(), "b__echo", true).await, "the reload is applied");
    let status = fault(&gw).await;
    assert_eq!(status["faults"], 2, "the replaced adapter's fault, and its own: {status}");
    // Two more faults within the minute quarantine it (its window of faults is its
    // own); a reload that changes its server again, but neither its code nor its
    // `adapter_config`, keeps the quarantine on: nothing that could have mended it changed.
    fault(&gw).await;
    assert!(fault(&gw).await["quarantined_for_ms"].as_u64().is_some());
    let mut again = config(gw.dir.path(), true);
    again["mcpServers"]["a"]["recovery"]["timeout_ms"] = json!(23456);
    again["mcpServers"]["c"] = faulty("c", gw.dir.path(), &[]);
    rewrite_config(gw.dir.path(), &again);
    assert!(until_offered(gw.client.peer(), "c__echo", true).await, "the reload is applied");
    let status = adapter_status(&gw).await;
    assert!(status["quarantined_for_ms"].as_u64().is_some(), "{status}");
    gw.close().await;
}

/// A reload while other adapters' calls hold every instance of the pool (two spinning
/// adapters, sixteen calls each) still loads the adapters it asks for: loading waits for
/// an instance (up to 10 s while the pool stays busy), and gets one as the spinning calls
/// end. (Their permits once went back before their instances did: the load then found
/// every instance taken, and the reload was refused.)
#[tokio::test]
async fn a_reload_while_the_pool_is_full_still_loads_its_adapters() {
    let plugins = test_plugins();
    let config = move |dir: &Path, with_d: bool| {
        let mut servers = serde_json::Map::new();
        for name in ["a", "c"] {
            let mut s = faulty(name, dir, &[]);
            s["adapter"] = json!("misbehave");
            s["adapter_config"] = json!({"mode": "loop"});
            servers.insert(name.into(), s);
        }
        if with_d {
            let mut d = faulty("d", dir, &[]);
            d["adapter"] = json!("misbehave");
            d["adapter_config"] = json!({"mode": "none"});
            servers.insert("d".into(), d);
        }
        json!({
            "mcpServers": servers,
            "rebound": {"plugins_dir": plugins, "plugin_timeout_ms": 3000, "plugin_cache_dir": dir.join("cache"),
                        "http": {"max_concurrent_per_client": 64}},
        })
    };
    let first = config.clone();
    let gw = Gateway::start(move |dir| first(dir, false)).await;
    let spinning = ["a__fail", "c__fail"].into_iter().flat_map(|tool| (0..16).map(move |_| tool));
    let spinning = futures::future::join_all(spinning.map(|tool| gw.call(tool, json!({"message": "spin"}))));
    let reload = async {
        rebound_tests::eventually("the failed calls", || {
            gw.state("a", "calls").len() + gw.state("c", "calls").len() >= 32
        })
        .await;
        rewrite_config(gw.dir.path(), &config(gw.dir.path(), true));
        until_offered(gw.client.peer(), "d__echo", true).await
    };
    let (_, reloaded) = futures::future::join(spinning, reload).await;
    assert!(reloaded, "the reload is applied");
    let status = gw.call("rebound_status", json!({})).await.structured_content.unwrap();
    let d = status["servers"].as_array().unwrap().iter().find(|s| s["name"] == "d").unwrap().clone();
    assert!(d.get("adapter_error").is_none(), "{d}");
    assert_eq!(d["adapter"]["name"], "misbehave", "{d}");
}

/// The copies of an adapter that a `scope: session` server's sessions run share its
/// health: faults in three sessions quarantine it for every session, and the status
/// says so (each copy counted alone, a hostile adapter faulted without end, one new
/// session after another, and nobody saw it).
#[tokio::test]
async fn a_session_servers_adapter_faults_count_across_sessions() {
    let plugins = test_plugins();
    let gw = HttpGateway::start(
        move |dir| {
            let mut a = faulty("a", dir, &[]);
            a["scope"] = json!("session");
            a["adapter"] = json!("misbehave");
            a["adapter_config"] = json!({"mode": "panic"});
            json!({"mcpServers": {"a": a}, "rebound": {"plugins_dir": plugins, "plugin_cache_dir": dir.join("cache")}})
        },
        &[],
    )
    .await;
    for _ in 0..3 {
        let client = gw.client(None).await.unwrap();
        let mut params = rmcp::model::CallToolRequestParams::new("fail");
        params.arguments = json!({"message": "boom"}).as_object().cloned();
        assert_eq!(text(&client.peer().call_tool(params).await.unwrap()), "boom");
        let _ = client.cancel().await;
    }
    let doc: Value = reqwest::get(format!("{}/status", gw.base)).await.unwrap().json().await.unwrap();
    let adapter = &doc["servers"][0]["adapter"];
    assert_eq!(adapter["faults"], 3, "{doc}");
    assert!(adapter["quarantined_for_ms"].as_u64().is_some(), "{doc}");
    let metrics = reqwest::get(format!("{}/metrics", gw.base)).await.unwrap().text().await.unwrap();
    for line in [
        r#"rebound_plugin_quarantined{server="a",adapter="misbehave"} 1"#,
        r#"rebound_plugin_faults_total{server="a",adapter="misbehave"} 3"#,
    ] {
        assert!(metrics.lines().any(|l| l == line), "no `{line}` in:\n{metrics}");
    }
}

/// An adapter that keeps each failed call's arguments in its store, to show them with
/// the next: over stdio, and for a session's own instance over HTTP, its store is its
/// one client's; over HTTP a shared server's adapter classifies and plans with a store
/// it may read but not write, so no client's call reaches another's.
#[tokio::test]
async fn a_shared_servers_adapter_over_http_keeps_nothing_of_a_clients_failed_call() {
    // What the adapter says it found its classify and its plan kept of the call before.
    let found = |answer: String| answer.rsplit_once("[rebound: seen ").map_or(answer.clone(), |(_, f)| f.to_owned());
    let one = r#"{"message":"one"}"#;
    let stdio = misbehaving_within("keep", 2000).await;
    assert_eq!(
        found(text(&stdio.call("fail", json!({"message": "one"})).await)),
        "nothing; planned nothing; kept=true]"
    );
    assert_eq!(
        found(text(&stdio.call("fail", json!({"message": "two"})).await)),
        format!("{one}; planned {one}; kept=true]")
    );
    stdio.close().await;
    for scope in ["shared", "session"] {
        let plugins = test_plugins();
        let gw = HttpGateway::start(
            move |dir| {
                let mut a = faulty("a", dir, &[]);
                a["scope"] = json!(scope);
                a["adapter"] = json!("misbehave");
                a["adapter_config"] = json!({"mode": "keep"});
                json!({"mcpServers": {"a": a}, "rebound": {"plugins_dir": plugins, "plugin_timeout_ms": 2000, "plugin_cache_dir": dir.join("cache")}})
            },
            &[],
        )
        .await;
        let (first, second) = (gw.client(None).await.unwrap(), gw.client(None).await.unwrap());
        let fail = |message: &str| {
            let mut params = rmcp::model::CallToolRequestParams::new("fail");
            params.arguments = json!({"message": message}).as_object().cloned();
            params
        };
        let seen = [
            found(text(&first.peer().call_tool(fail("one")).await.unwrap())),
            found(text(&second.peer().call_tool(fail("two")).await.unwrap())),
            found(text(&first.peer().call_tool(fail("one again")).await.unwrap())),
        ];
        let expected = if scope == "session" {
            let nothing = "nothing; planned nothing; kept=true]".to_owned();
            [nothing.clone(), nothing, format!("{one}; planned {one}; kept=true]")]
        } else {
            std::array::from_fn(|_| "nothing; planned nothing; kept=false]".to_owned())
        };
        assert_eq!(seen, expected, "{scope}");
        // Nor does its health, which it could write in as counts, reach a client: its
        // name, its version and whether it is quarantined; the operator sees the rest.
        let status = first.peer().call_tool(rmcp::model::CallToolRequestParams::new("rebound_status")).await.unwrap();
        let adapter = status.structured_content.unwrap()["servers"][0]["adapter"].clone();
        let shown: Vec<_> = adapter.as_object().unwrap().keys().cloned().collect();
        assert_eq!(shown, ["name", "version", "quarantined_for_ms"], "{scope}: {adapter}");
        let operator: Value = reqwest::get(format!("{}/status", gw.base)).await.unwrap().json().await.unwrap();
        assert_eq!(operator["servers"][0]["adapter"]["busy"], 0, "{scope}: {operator}");
        let _ = (first.cancel().await, second.cancel().await);
    }
}

/// Makes `a`'s adapter classify (it loops), and says how it is.
async fn fault(gw: &Gateway) -> Value {
    gw.call("a__fail", json!({"message": "x"})).await;
    adapter_status(gw).await
}

/// Limits changed by a reload hold for an adapter whose code and server did not change
/// (a limit is lowered to contain it, say), at once, its health carried over.
#[tokio::test]
async fn a_reload_applies_new_plugin_limits_to_an_adapter_it_keeps() {
    let plugins = test_plugins();
    let config = move |dir: &Path, timeout: u64, b: bool| {
        let mut a = faulty("a", dir, &[]);
        a["adapter"] = json!("misbehave");
        a["adapter_config"] = json!({"mode": "loop"});
        let mut servers = json!({"a": a});
        if b {
            // Added with the new limits: its tools, announced, say the reload is applied.
            servers["b"] = faulty("b", dir, &[]);
        }
        json!({
            "mcpServers": servers,
            "rebound": {"plugins_dir": plugins, "plugin_timeout_ms": timeout, "tool_names": "always",
                        "plugin_cache_dir": dir.join("cache")},
        })
    };
    let first = config.clone();
    let gw = Gateway::start(move |dir| first(dir, 100, false)).await;
    let status = fault(&gw).await;
    assert!(status["last_fault"].as_str().unwrap().contains("past its 100 ms deadline"), "{status}");
    rewrite_config(gw.dir.path(), &config(gw.dir.path(), 150, true));
    assert!(until_offered(gw.client.peer(), "b__echo", true).await, "the reload is applied");
    let status = fault(&gw).await;
    assert!(status["last_fault"].as_str().unwrap().contains("past its 150 ms deadline"), "{status}");
    assert_eq!(status["faults"], 2, "its faults carried over: {status}");
    gw.close().await;
}

/// A reload that relaunches a session server and changes its adapter's limits: the
/// session's running instance, serving on while its relaunch comes up (here it never
/// does), runs under the new limits at once, not those it was started under.
#[tokio::test]
async fn a_session_instance_serving_on_through_its_relaunch_takes_the_new_plugin_limits() {
    let plugins = test_plugins();
    let config = move |dir: &Path, timeout: u64, gate: Option<&Path>| {
        let gate = gate.map(|g| g.display().to_string());
        let extra: Vec<&str> = gate.iter().flat_map(|g| ["--start-gate", g.as_str()]).collect();
        let mut a = faulty("a", dir, &extra);
        a["scope"] = json!("session");
        a["adapter"] = json!("misbehave");
        a["adapter_config"] = json!({"mode": "loop"});
        json!({
            "mcpServers": {"a": a},
            "rebound": {"plugins_dir": plugins, "plugin_timeout_ms": timeout, "tool_names": "always",
                        "plugin_cache_dir": dir.join("cache")},
        })
    };
    let first = config.clone();
    let gw = HttpGateway::start(move |dir| first(dir, 100, None), &[]).await;
    let client = gw.client(None).await.unwrap();
    let fail = || async {
        let mut params = rmcp::model::CallToolRequestParams::new("a__fail");
        params.arguments = json!({"message": "x"}).as_object().cloned();
        client.peer().call_tool(params).await.unwrap()
    };
    fail().await;
    gw.logged("past its 100 ms deadline").await;
    // Relaunched (its new process waits for a gate that never opens), limits changed.
    let never = gw.dir.path().join("never");
    rewrite_config(gw.dir.path(), &config(gw.dir.path(), 150, Some(&never)));
    gw.logged("relaunching in each running session").await;
    fail().await;
    gw.logged("past its 150 ms deadline").await;
    let _ = client.cancel().await;
}

#[tokio::test]
async fn memory_bombs_panics_and_floods_are_contained() {
    // A flood of output is cut at the cap; writing it all takes longer than the deadline.
    for (mode, fault) in
        [("memory", "trapped"), ("panic", "trapped"), ("huge-output", "deadline"), ("huge-answer", "trapped")]
    {
        let gw = misbehaving(mode).await;
        let r = gw.call("fail", json!({"message": "boom"})).await;
        assert_eq!(text(&r), "boom", "{mode}");
        let status = adapter_status(&gw).await;
        let last = status["last_fault"].as_str().unwrap_or_default();
        assert!(last.contains(fault) && last.len() < 1024, "{mode}: {}", &last[..last.len().min(300)]);
        assert_eq!(text(&gw.call("echo", json!({"message": "alive"})).await), "a: alive", "{mode}");
        gw.close().await;
    }
}

/// What an adapter printed when it faulted may quote any client's call (here its panic
/// message, `std::panic` printing it): the operator sees it in `GET /status` behind the
/// operator token, no client in `rebound_status`, nor in `GET /status` without one (the
/// clients' token opens it then).
#[tokio::test]
async fn what_a_faulty_adapter_printed_is_the_operators_alone() {
    const OPERATOR: &str = "operator-token-0123456789";
    for operator in [true, false] {
        let plugins = test_plugins();
        let gw = HttpGateway::start(
            move |dir| {
                let mut a = faulty("a", dir, &[]);
                a["adapter"] = json!("misbehave");
                a["adapter_config"] = json!({"mode": "panic"});
                let http = if operator { json!({"operator_token": OPERATOR}) } else { json!({}) };
                json!({"mcpServers": {"a": a}, "rebound": {"plugins_dir": plugins, "plugin_cache_dir": dir.join("cache"), "http": http}})
            },
            &[],
        )
        .await;
        let client = gw.client(None).await.unwrap();
        let call = |name: &str, args: Value| {
            let mut params = rmcp::model::CallToolRequestParams::new(name.to_owned());
            params.arguments = args.as_object().cloned();
            client.peer().call_tool(params)
        };
        assert_eq!(text(&call("fail", json!({"message": "boom"})).await.unwrap()), "boom");
        let theirs = call("rebound_status", json!({})).await.unwrap().structured_content.unwrap();
        let adapter = &theirs["servers"][0]["adapter"];
        assert!(adapter.get("last_fault").is_none() && adapter["name"] == "misbehave", "{adapter}");
        assert!(!theirs.to_string().contains("panicked on purpose"), "{theirs}");
        let status = reqwest::Client::new().get(format!("{}/status", gw.base)).bearer_auth(OPERATOR).send();
        let doc: Value = status.await.unwrap().json().await.unwrap();
        let fault = doc["servers"][0]["adapter"]["last_fault"].as_str().unwrap_or_default();
        assert!(fault.contains("trapped"), "{doc}");
        let printed = doc["servers"][0]["adapter"]["last_output"].as_str().unwrap_or_default();
        assert_eq!(printed.contains("panicked on purpose"), operator, "{doc}");
        let _ = client.cancel().await;
    }
}

#[tokio::test]
async fn a_plugin_gets_no_files_no_environment_and_no_clock() {
    let gw = misbehaving_within("open-file", 2000).await;
    let r = gw.call("fail", json!({"message": "nope"})).await;
    // The plugin's classification (its message) travels with the tool's own error.
    assert_eq!(text(&r), "nope\n[rebound: file=false env=0 clock=0]");
    gw.close().await;
}

/// Every call runs in a fresh instance, and a pooled slot's memory is reset between
/// them (only the pages the last one wrote, with a `memset`, where the kernel can say
/// which): nothing one call leaves in its data, its zeroed statics or its heap reaches
/// the next, however many calls reuse the slot.
#[tokio::test]
async fn nothing_a_call_leaves_in_memory_reaches_the_next() {
    let gw = misbehaving_within("remember", 2000).await;
    for i in 0..20 {
        let r = gw.call("fail", json!({"message": format!("again {i}")})).await;
        assert_eq!(text(&r), format!("again {i}\n[rebound: calls=1 found=false]"));
    }
    gw.close().await;
}

fn check(plugins: &Path, adapter: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    check_in(dir.path(), plugins, adapter)
}

/// `rebound check` of a server with `adapter`, its configuration and cache in `dir`,
/// under a permissive umask (002, as for many desktop users): what it caches must be
/// this user's alone all the same.
fn check_in(dir: &Path, plugins: &Path, adapter: &str) -> (bool, String) {
    let config = dir.join("rebound.json");
    let json = json!({"mcpServers": {"a": {"command": "x", "adapter": adapter}}, "rebound": {"plugins_dir": plugins, "plugin_cache_dir": dir.join("cache")}});
    std::fs::write(&config, json.to_string()).unwrap();
    let out = Command::new("sh")
        .args(["-c", "umask 002 && exec \"$0\" check --config \"$1\""])
        .arg(bin("rebound"))
        .arg(&config)
        .output()
        .unwrap();
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[test]
fn check_rejects_broken_plugins_naming_the_file_and_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(test_plugins().join("wrong-version.wasm"), dir.path().join("future.wasm")).unwrap();
    std::fs::copy(test_plugins().join("sockets.wasm"), dir.path().join("sockets.wasm")).unwrap();
    std::fs::write(dir.path().join("garbage.wasm"), b"#!/bin/sh\necho hi\n").unwrap();
    std::fs::write(dir.path().join("core.wasm"), b"\0asm\x01\0\0\0").unwrap();
    // A component's header and a body that is not one: refused by the compiler process.
    std::fs::write(dir.path().join("broken.wasm"), b"\0asm\x0d\0\x01\0\x07\xff\xff\xff\xff\x0f").unwrap();
    // Past the size bound (sparse: nothing is written but the header).
    let huge = std::fs::File::create(dir.path().join("huge.wasm")).unwrap();
    std::io::Write::write_all(&mut &huge, b"\0asm\x0d\0\x01\0").unwrap();
    huge.set_len(33 << 20).unwrap();
    // Compiles (the compiler process allocates on demand), but past the instance pool's
    // memory: refused once compiled, and never compiled again in the gateway itself, out
    // of the compiler process's time and memory bounds.
    let pooled = "(component (core module $m (memory 1025)) (core instance (instantiate $m)))";
    std::fs::write(dir.path().join("pooled.wasm"), wat::parse_str(pooled).unwrap()).unwrap();
    for (adapter, needles) in [
        (
            "future",
            &["future.wasm", "speaks rebound:adapter@9.0.0", "this gateway speaks rebound:adapter@0.2.0 and @0.1.0"][..],
        ),
        ("sockets", &["sockets.wasm", "imports `wasi:sockets/"]),
        ("garbage", &["garbage.wasm", "not a WebAssembly component", "magic number"]),
        ("core", &["core.wasm", "core WebAssembly module"]),
        ("broken", &["broken.wasm", "does not compile"]),
        ("huge", &["huge.wasm", "larger than 32 MiB"]),
        ("pooled", &["pooled.wasm", "past what the plugin runtime allows", "memory"]),
    ] {
        let (ok, out) = check(dir.path(), adapter);
        assert!(!ok, "{adapter} accepted: {out}");
        for n in needles {
            assert!(out.contains(n), "{n:?} not in: {out}");
        }
        assert!(!out.contains("compiling in the gateway instead"), "{out}");
    }
    // So too through the cache, where a first start puts what it compiled.
    let cached = tempfile::tempdir().unwrap();
    let (ok, out) = check_in(cached.path(), dir.path(), "pooled");
    assert!(!ok && out.contains("past what the plugin runtime allows"), "{out}");
    assert!(!out.contains("compiling in the gateway instead"), "{out}");
    let entries = std::fs::read_dir(cached.path().join("cache")).unwrap().count();
    assert_eq!(entries, 0, "nothing refused is kept: {out}");
    let (ok, out) = check(&root().join("target/plugins"), "lean-fallback");
    assert!(ok, "{out}");
    assert!(out.contains("plugin lean-fallback: lean-fallback 0.1.0"), "{out}");
}

#[tokio::test]
async fn serve_keeps_serving_with_a_broken_plugin() {
    let plugins = test_plugins();
    let gw = Gateway::start(move |dir| {
        let mut a = faulty("a", dir, &[]);
        a["adapter"] = json!("wrong-version");
        json!({"mcpServers": {"a": a}, "rebound": {"plugins_dir": plugins, "plugin_cache_dir": dir.join("cache")}})
    })
    .await;
    assert_eq!(text(&gw.call("echo", json!({"message": "fine"})).await), "a: fine");
    let s = gw.call("rebound_status", json!({})).await.structured_content.unwrap();
    assert!(s["servers"][0]["adapter_error"].as_str().unwrap().contains("rebound:adapter@9.0.0"), "{s}");
    gw.close().await;
}

/// Compiling is work an adapter chooses, so it happens in a process of its own that the
/// gateway stops at `plugin_compile_timeout_ms`: the adapter is reported, its server
/// served with the built-in classifier, and nothing half-compiled is left in the cache.
#[tokio::test]
async fn an_adapter_that_compiles_too_long_is_stopped_and_reported_and_the_gateway_serves() {
    compiles_too_long(0o700).await;
}

/// Without a cache (its folder is refused: others can write it), an adapter is still
/// compiled in a process of its own, within its deadline, not in the gateway unbounded.
#[tokio::test]
async fn an_adapter_compiled_without_a_cache_is_still_stopped_when_it_compiles_too_long() {
    compiles_too_long(0o777).await;
}

/// A gateway whose one adapter cannot compile within a millisecond, its cache folder of
/// `mode`: the adapter is reported, nothing is left in the folder, and the server serves.
async fn compiles_too_long(mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    let plugins = root().join("target/plugins");
    let gw = Gateway::start(move |dir| {
        let cache = dir.join("cache");
        std::fs::create_dir(&cache).unwrap();
        std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(mode)).unwrap();
        let mut a = faulty("a", dir, &[]);
        a["adapter"] = json!("lean-fallback");
        let rebound = json!({"plugins_dir": plugins, "plugin_cache_dir": cache, "plugin_compile_timeout_ms": 1});
        json!({"mcpServers": {"a": a}, "rebound": rebound})
    })
    .await;
    assert_eq!(text(&gw.call("echo", json!({"message": "fine"})).await), "a: fine");
    let s = gw.call("rebound_status", json!({})).await.structured_content.unwrap();
    let error = s["servers"][0]["adapter_error"].as_str().unwrap_or_default();
    assert!(error.contains("lean-fallback.wasm") && error.contains("plugin_compile_timeout_ms"), "{s}");
    let cache: Vec<_> = std::fs::read_dir(gw.dir.path().join("cache")).unwrap().collect();
    assert!(cache.is_empty(), "left in the cache folder: {cache:?}");
    gw.close().await;
}

/// A first start compiles each adapter in a compiler process into the cache, and the
/// next start takes it from there. Cache entries are this user's alone whatever the
/// umask (a group-writable one would be refused, and compiled again on every start).
#[test]
fn a_compiled_adapter_is_cached_for_the_next_start() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let plugins = root().join("target/plugins");
    let (ok, out) = check_in(dir.path(), &plugins, "lean-fallback");
    assert!(ok && !out.contains("cached"), "{out}");
    let entries: Vec<_> = std::fs::read_dir(dir.path().join("cache")).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(entries.len(), 1, "{out}");
    let mode = std::fs::metadata(&entries[0]).unwrap().permissions().mode();
    assert_eq!(mode & 0o077, 0, "{mode:o}");
    let (ok, out) = check_in(dir.path(), &plugins, "lean-fallback");
    assert!(ok && out.contains(", cached) ok"), "{out}");
}

#[test]
fn first_party_plugins_are_small_components() {
    for name in ["lean-fallback", "hol-cursor", "thanos-classify"] {
        let path = root().join("target/plugins").join(format!("{name}.wasm"));
        let bytes = std::fs::read(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (cargo xtask build-plugins --release)", path.display()));
        assert_eq!(&bytes[..8], b"\0asm\x0d\0\x01\0", "{name} is a component");
        assert!(bytes.len() <= 256 << 10, "{name} is {} KiB", bytes.len() >> 10);
    }
}
