//! Hot reload of a running gateway: its configuration file edited (a server added, a
//! timeout changed, the file broken and fixed, a launch changed) and an adapter replaced
//! while calls run, with one client session connected throughout.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use rebound_tests::{Gateway, HttpGateway, alive, eventually, faulty, rewrite_config, text, until_offered};
use rmcp::model::CallToolRequestParams;
use serde_json::{Value, json};

/// A streamable HTTP client of the gateway.
type Client = rmcp::service::RunningService<rmcp::RoleClient, rebound_tests::TestClient>;

fn pid(dir: &Path, server: &str) -> u32 {
    let starts = std::fs::read_to_string(dir.join(server).join("starts")).unwrap_or_default();
    starts.lines().last().and_then(|l| l.trim().parse().ok()).unwrap_or(0)
}

fn config(dir: &Path, a_timeout: u64, extra: &[(&str, Value)]) -> Value {
    let mut a = faulty("a", dir, &[]);
    a["recovery"] = json!({"timeout_ms": a_timeout, "retry": {"max_attempts": 1}});
    let mut b = faulty("b", dir, &[]);
    // Timeouts of two clients open b's breaker, for a long time.
    b["recovery"] = json!({"timeout_ms": 200, "retry": {"max_attempts": 1},
        "breaker": {"failure_threshold": 1, "open_ms": 600000}});
    let mut servers = serde_json::Map::new();
    servers.insert("a".into(), a);
    servers.insert("b".into(), b);
    for (name, server) in extra {
        servers.insert((*name).into(), server.clone());
    }
    json!({"mcpServers": servers, "rebound": {"tool_names": "always"}})
}

async fn call(client: &Client, tool: &str, args: Value) -> rmcp::model::CallToolResult {
    let mut params = CallToolRequestParams::new(tool.to_owned());
    params.arguments = args.as_object().cloned();
    tokio::time::timeout(Duration::from_secs(30), client.peer().call_tool(params)).await.unwrap().unwrap()
}

async fn status(client: &Client) -> Value {
    call(client, "rebound_status", json!({})).await.structured_content.unwrap()
}

/// `rebound serve --http` on servers `a` and `b`, its folder, and a client whose first
/// call of `a__echo` answered.
async fn serving_a_and_b() -> (HttpGateway, std::path::PathBuf, Client) {
    let gw = HttpGateway::start(|dir| config(dir, 60000, &[]), &[]).await;
    let dir = gw.dir.path().to_owned();
    let client = gw.client(None).await.unwrap();
    assert_eq!(text(&call(&client, "a__echo", json!({"message": "1"})).await), "a: 1");
    (gw, dir, client)
}

/// Faulty server `name`, each start of it held until the file `gate` exists, if given.
fn gated(dir: &Path, name: &str, gate: Option<&Path>) -> Value {
    let gate = gate.map(|g| g.display().to_string());
    let extra: Vec<&str> = gate.iter().flat_map(|g| ["--start-gate", g.as_str()]).collect();
    faulty(name, dir, &extra)
}

/// Opens b's breaker with the timeouts of two clients (one client's alone would open only
/// breakers of its own); returns the second client and the status with it open.
async fn with_b_open(gw: &HttpGateway, client: &Client) -> (Client, Value) {
    let other = gw.client(None).await.unwrap();
    assert_eq!(call(client, "b__hang", json!({})).await.is_error, Some(true));
    assert_eq!(call(&other, "b__hang", json!({})).await.is_error, Some(true));
    let open = status(client).await;
    assert_eq!(server(&open, "b")["breaker"]["state"], "open", "{open}");
    (other, open)
}

fn server<'a>(status: &'a Value, name: &str) -> &'a Value {
    status["servers"].as_array().unwrap().iter().find(|s| s["name"] == name).unwrap_or(&Value::Null)
}

#[tokio::test]
async fn an_edited_configuration_is_applied_as_a_diff_and_a_broken_one_is_refused() {
    let (gw, dir, client) = serving_a_and_b().await;
    let (_other, before) = with_b_open(&gw, &client).await;
    let (a_pid, b_pid) = (pid(&dir, "a"), pid(&dir, "b"));

    // Add a server and change a's timeouts.
    let mut edited = config(&dir, 30000, &[("c", faulty("c", &dir, &[]))]);
    edited["mcpServers"]["a"]["recovery"]["tools"] = json!({"hang": {"timeout_ms": 300}});
    rewrite_config(&dir, &edited);
    let tools = || async { client.peer().list_all_tools().await.unwrap() };
    until_offered(client.peer(), "c__echo", true).await;
    assert_eq!(text(&call(&client, "c__echo", json!({"message": "new"})).await), "c: new");
    // a was reconfigured, not relaunched; b was untouched: same processes, b's breaker
    // still open.
    assert_eq!((pid(&dir, "a"), pid(&dir, "b")), (a_pid, b_pid));
    // Its calls have the new recovery settings.
    let hung = call(&client, "a__hang", json!({})).await;
    assert!(text(&hung).contains("no answer within 300 ms"), "{}", text(&hung));
    let after = status(&client).await;
    assert_eq!(server(&after, "b")["breaker"]["state"], "open", "{after}");
    assert_eq!(server(&after, "b")["counters"]["calls"], server(&before, "b")["counters"]["calls"]);

    // A broken file is refused with the check's message; everything keeps serving.
    std::fs::write(dir.join("rebound.json"), r#"{"mcpServers": {"a": {"args": []}}}"#).unwrap();
    gw.logged("reload refused").await;
    assert!(gw.log.lock().unwrap().contains("neither `command` nor `url`"));
    assert_eq!(text(&call(&client, "c__echo", json!({"message": "still"})).await), "c: still");
    // The operator's status says so too; a client's does not (the file is the operator's).
    let operators =
        || async { reqwest::get(format!("{}/status", gw.base)).await.unwrap().json::<Value>().await.unwrap() };
    let refused = operators().await["gateway"]["last_reload"].clone();
    assert!(refused["refused"].as_str().is_some_and(|r| r.contains("neither `command` nor `url`")), "{refused}");
    assert!(refused["at"].is_string(), "{refused}");
    assert!(status(&client).await["gateway"].get("last_reload").is_none());

    // Fixed, with a's launch changed: a is relaunched (a new process), c removed. A call
    // in flight on the old process finishes there; calls meanwhile never miss a's tools.
    let mut fixed = config(&dir, 30000, &[]);
    fixed["mcpServers"]["a"]["args"].as_array_mut().unwrap().extend([json!("--start-delay"), json!("300")]);
    let in_flight = call(&client, "a__slow", json!({"ms": 1500}));
    let meanwhile = async {
        let calls = || std::fs::read_to_string(dir.join("a/calls")).unwrap_or_default();
        eventually("the call in flight", || calls().lines().any(|t| t == "slow")).await;
        rewrite_config(&dir, &fixed);
        for i in 0..20 {
            let r = call(&client, "a__echo", json!({"message": i.to_string()})).await;
            assert_eq!(text(&r), format!("a: {i}"), "a call during the relaunch");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let (slow, ()) = tokio::join!(in_flight, meanwhile);
    assert!(text(&slow).contains("slept 1500 ms"), "{}", text(&slow));
    let old_a = a_pid;
    eventually("a relaunched", move || !alive(old_a)).await;
    until_offered(client.peer(), "c__echo", false).await;
    assert!(!tools().await.iter().any(|t| t.name == "c__echo"), "c is gone");
    assert_eq!(text(&call(&client, "a__echo", json!({"message": "2"})).await), "a: 2");
    assert_ne!(pid(&dir, "a"), a_pid);
    assert_eq!(pid(&dir, "b"), b_pid);
    let applied = operators().await["gateway"]["last_reload"].clone();
    assert_eq!(applied["applied"], "removed c; restarted a", "{applied}");

    // A new `protocol` is a new connection: a is relaunched to speak it.
    let (a_pid, b_pid) = (pid(&dir, "a"), pid(&dir, "b"));
    fixed["mcpServers"]["a"]["protocol"] = json!("2025-11-25");
    rewrite_config(&dir, &fixed);
    eventually("a relaunched for its protocol", move || !alive(a_pid)).await;
    assert_eq!(text(&call(&client, "a__echo", json!({"message": "3"})).await), "a: 3");
    assert_eq!(pid(&dir, "b"), b_pid);

    let metrics = reqwest::get(format!("{}/metrics", gw.base)).await.unwrap().text().await.unwrap();
    assert!(metrics.contains(r#"rebound_config_reloads_total{result="refused"} 1"#), "{metrics}");
    assert!(metrics.lines().any(|l| l.starts_with(r#"rebound_config_reloads_total{result="applied"}"#)), "{metrics}");
    let _ = client.cancel().await;
}

#[tokio::test]
async fn an_adapter_replaced_while_calls_run_loses_none() {
    let plugins = rebound_tests::root().join("target/plugins");
    let gw = HttpGateway::start(
        |dir| {
            let own = dir.join("plugins");
            std::fs::create_dir_all(&own).unwrap();
            std::fs::copy(plugins.join("thanos-classify.wasm"), own.join("thanos-classify.wasm")).unwrap();
            let mut a = faulty("a", dir, &[]);
            a["adapter"] = json!("thanos-classify");
            a["recovery"] = json!({"retry": {"initial_delay_ms": 10}});
            json!({"mcpServers": {"a": a}, "rebound": {"plugins_dir": own}})
        },
        &[],
    )
    .await;
    let dir = gw.dir.path().to_owned();
    let client = Arc::new(gw.client(None).await.unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicU32::new(0));
    let callers: Vec<_> = (0..4)
        .map(|i| {
            let (client, stop, answered) = (client.clone(), stop.clone(), answered.clone());
            tokio::spawn(async move {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    // `flaky` aborts every fifth call (the adapter is consulted on those);
                    // one caller makes them, so that a retry never meets the next abort.
                    let tool = if i == 0 { "flaky" } else { "echo" };
                    let r = call(&client, tool, json!({"q": format!("{i}-{n}"), "message": "m"})).await;
                    assert_ne!(r.is_error, Some(true), "{}", text(&r));
                    answered.fetch_add(1, Ordering::Relaxed);
                    n += 1;
                }
            })
        })
        .collect();
    // Calls going, some of them consulting the adapter (every fifth `flaky` call).
    let calls = || answered.load(Ordering::Relaxed);
    eventually("calls before the change", || calls() >= 20).await;
    // A new build of the adapter: other bytes (the file's tail padded with a custom
    // section would do; another first-party adapter's code is simpler to come by).
    let replacement = plugins.join("lean-fallback.wasm");
    let target = dir.join("plugins/thanos-classify.wasm");
    std::fs::copy(&replacement, dir.join("plugins/next.tmp")).unwrap();
    std::fs::rename(dir.join("plugins/next.tmp"), &target).unwrap();
    gw.logged("new adapter code for a").await;
    let reloaded = calls();
    eventually("calls after the change", || calls() >= reloaded + 20).await;
    stop.store(true, Ordering::Relaxed);
    for caller in callers {
        caller.await.expect("every call answered, and well");
    }
    // The new code serves: its faults (none) are its own (shown to the operator: over
    // HTTP a shared adapter's health is no client's), and `flaky` still recovers.
    let status: Value = reqwest::get(format!("{}/status", gw.base)).await.unwrap().json().await.unwrap();
    assert_eq!(status["servers"][0]["adapter"]["faults"], 0, "{status}");
    let loads = gw.log.lock().unwrap().matches("plugins/thanos-classify.wasm (").count();
    assert_eq!(loads, 2, "loaded at start and again on the change");
}

/// A reload that relaunches a running server with a launch that cannot start (a typo in
/// its `command`) leaves the running process serving, with the file's other settings,
/// says so, and tries the new launch again when the file is saved again.
#[tokio::test]
async fn a_relaunch_that_cannot_start_leaves_the_running_server_serving() {
    let (gw, dir, client) = serving_a_and_b().await;
    let old = pid(&dir, "a");
    let mut broken = config(&dir, 60000, &[]);
    broken["mcpServers"]["a"]["command"] = json!("/nonexistent/faulty-server");
    broken["mcpServers"]["a"]["recovery"]["tools"] = json!({"hang": {"timeout_ms": 300}});
    rewrite_config(&dir, &broken);
    let log = gw.log.clone();
    let said = move |what: &'static str| {
        let log = log.clone();
        move || log.lock().unwrap().contains(what)
    };
    eventually("the reload applied", said("kept running (the new launch did not start) a")).await;
    assert!(gw.log.lock().unwrap().contains("fix `mcpServers.a` and save again"));
    assert_eq!(text(&call(&client, "a__echo", json!({"message": "still"})).await), "a: still");
    assert!(client.peer().list_all_tools().await.unwrap().iter().any(|t| t.name == "a__echo"));
    assert_eq!(pid(&dir, "a"), old);
    assert!(alive(old));
    // The file's other settings hold for it.
    let hung = call(&client, "a__hang", json!({})).await;
    assert!(text(&hung).contains("no answer within 300 ms"), "{}", text(&hung));
    // The file as it was: the running launch, the old settings back.
    rewrite_config(&dir, &config(&dir, 60000, &[]));
    eventually("the settings reverted", said("reconfigured a")).await;
    // Fixed: the file differs from what runs, so a's new launch is tried, and holds.
    let mut fixed = config(&dir, 60000, &[]);
    fixed["mcpServers"]["a"]["args"].as_array_mut().unwrap().extend([json!("--start-delay"), json!("10")]);
    rewrite_config(&dir, &fixed);
    eventually("a relaunched", move || !alive(old)).await;
    assert_eq!(text(&call(&client, "a__echo", json!({"message": "new"})).await), "a: new");
    let _ = client.cancel().await;
}

/// A reload that adds a server slow to start applies the rest of what it changes at
/// once: a server it removes is gone while the new one starts, whose tools come once it
/// is ready.
#[tokio::test]
async fn a_server_a_reload_adds_holds_up_nothing_else_it_changes() {
    let (_gw, dir, client) = serving_a_and_b().await;
    let gate = dir.join("c-gate");
    let c = faulty("c", &dir, &["--start-gate", gate.to_str().unwrap()]);
    let mut next = config(&dir, 60000, &[("c", c)]);
    next["mcpServers"].as_object_mut().unwrap().remove("b");
    rewrite_config(&dir, &next);
    assert!(until_offered(client.peer(), "b__echo", false).await, "b is still offered while c starts");
    assert!(!client.peer().list_all_tools().await.unwrap().iter().any(|t| t.name == "c__echo"));
    std::fs::write(&gate, "").unwrap();
    assert!(until_offered(client.peer(), "c__echo", true).await, "c is ready");
    assert_eq!(text(&call(&client, "c__echo", json!({"message": "up"})).await), "c: up");
}

/// A server a reload makes shared (it was `scope: session`) is waited for as a relaunch
/// is: its tools stay offered while its shared instance comes up.
#[tokio::test]
async fn a_server_a_reload_makes_shared_keeps_its_tools_while_it_starts() {
    let servers = |dir: &Path, gate: Option<&Path>| {
        let mut s = gated(dir, "s", gate);
        if gate.is_none() {
            s["scope"] = json!("session");
        }
        json!({"mcpServers": {"a": faulty("a", dir, &[]), "s": s}, "rebound": {"tool_names": "always"}})
    };
    let gw = HttpGateway::start(|dir| servers(dir, None), &[]).await;
    let dir = gw.dir.path().to_owned();
    let client = gw.client(None).await.unwrap();
    assert_eq!(text(&call(&client, "s__echo", json!({"message": "own"})).await), "s: own");
    let gate = dir.join("gate");
    rewrite_config(&dir, &servers(&dir, Some(&gate)));
    eventually("the shared instance starting", || rebound_tests::state_in(&dir, "s", "starts").len() == 2).await;
    for _ in 0..10 {
        let tools = client.peer().list_all_tools().await.unwrap();
        assert!(tools.iter().any(|t| t.name == "s__echo"), "s's tools left while it starts");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    std::fs::write(&gate, "").unwrap();
    gw.logged("configuration reloaded").await;
    assert_eq!(text(&call(&client, "s__echo", json!({"message": "shared"})).await), "s: shared");
}

/// With the running process, a relaunch that cannot start keeps its breakers and retry
/// budget: they tell how that process fares.
#[tokio::test]
async fn a_relaunch_that_cannot_start_keeps_the_running_servers_breakers() {
    let (gw, dir, client) = serving_a_and_b().await;
    let (other, _) = with_b_open(&gw, &client).await;
    let mut broken = config(&dir, 60000, &[]);
    broken["mcpServers"]["b"]["command"] = json!("/nonexistent/faulty-server");
    rewrite_config(&dir, &broken);
    gw.logged("kept running (the new launch did not start) b").await;
    let after = status(&client).await;
    assert_eq!(server(&after, "b")["breaker"]["state"], "open", "{after}");
    let _ = other.cancel().await;
    let _ = client.cancel().await;
}

/// The same, while the running server is starting again after a crash: its old launch,
/// which worked, is kept and comes back; the new one, which cannot start, is stopped.
#[tokio::test]
async fn a_relaunch_that_cannot_start_keeps_a_restarting_server_and_its_old_launch() {
    let slow_restart = |mut c: Value| {
        c["rebound"]["restart"] = json!({"initial_delay_ms": 4000, "max_delay_ms": 4000});
        c
    };
    let gw = HttpGateway::start(|dir| slow_restart(config(dir, 60000, &[])), &[]).await;
    let dir = gw.dir.path().to_owned();
    let client = gw.client(None).await.unwrap();
    let old = pid(&dir, "a");
    assert_eq!(call(&client, "a__crash", json!({})).await.is_error, Some(true));
    let log = gw.log.clone();
    let said = move |what: &'static str| {
        let log = log.clone();
        move || log.lock().unwrap().contains(what)
    };
    eventually("a restarting", said("connection lost")).await;
    let mut broken = slow_restart(config(&dir, 60000, &[]));
    broken["mcpServers"]["a"]["command"] = json!("/nonexistent/faulty-server");
    rewrite_config(&dir, &broken);
    eventually("the reload applied", said("kept running (the new launch did not start) a")).await;
    assert!(gw.log.lock().unwrap().contains("the old launch keeps serving (restarting)"));
    // The old launch, started again, serves.
    assert_eq!(text(&call(&client, "a__echo", json!({"message": "back"})).await), "a: back");
    let again = pid(&dir, "a");
    assert!(again != old && alive(again), "a new process of the old launch");
    let _ = client.cancel().await;
}

/// A reload brings a running session's own (`scope: session`) instances in line, as it
/// does the shared servers: an added server starts for it (it hears `list_changed`), a
/// changed launch gets a new process once it is up (one that cannot start leaves the
/// running one serving), an unchanged one keeps its own, and a removed server's instance
/// stops, without the session asking anything.
#[tokio::test]
#[allow(deprecated, reason = "resources/subscribe lives in the revisions the gateway speaks")]
async fn a_reload_brings_a_running_sessions_own_servers_in_line() {
    let servers = |dir: &Path, own: &[(&str, &[&str])]| {
        let mut servers = serde_json::Map::new();
        servers.insert("a".into(), faulty("a", dir, &[]));
        for (name, extra) in own {
            let mut server = faulty(name, dir, extra);
            server["scope"] = json!("session");
            servers.insert((*name).into(), server);
        }
        json!({"mcpServers": servers, "rebound": {"tool_names": "always"}})
    };
    let gw = HttpGateway::start(|dir| servers(dir, &[("s", &[])]), &[]).await;
    let dir = gw.dir.path().to_owned();
    let client = gw.client(None).await.unwrap();
    assert_eq!(text(&call(&client, "s__echo", json!({"message": "1"})).await), "s: 1");
    let s = pid(&dir, "s");
    let heard = client.service().heard.clone();
    let told = || heard.lock().unwrap().tools_changed;

    // Added: the session hears of it, and its instance serves.
    let before = told();
    rewrite_config(&dir, &servers(&dir, &[("s", &[]), ("t", &[])]));
    eventually("list_changed for the added server", || told() > before).await;
    assert!(until_offered(client.peer(), "t__echo", true).await, "t offered to the running session");
    assert_eq!(text(&call(&client, "t__echo", json!({"message": "2"})).await), "t: 2");
    let t = pid(&dir, "t");
    assert_eq!(pid(&dir, "s"), s, "s untouched");

    // s's launch changed: a new process for the session, which its subscription moves
    // to; t keeps its own.
    let subscribed = || std::fs::read_to_string(dir.join("s/subscribes")).unwrap_or_default().lines().count();
    client.peer().subscribe(rmcp::model::SubscribeRequestParams::new("faulty://s/readme")).await.unwrap();
    assert_eq!(subscribed(), 1);
    rewrite_config(&dir, &servers(&dir, &[("s", &["--start-delay", "10"]), ("t", &[])]));
    eventually("the old instance of s stopped", move || !alive(s)).await;
    eventually("the subscription made again on the new process", || subscribed() == 2).await;
    assert_eq!(text(&call(&client, "s__echo", json!({"message": "3"})).await), "s: 3");
    assert!(pid(&dir, "s") != s && alive(pid(&dir, "s")), "a new process of s");
    assert_eq!(pid(&dir, "t"), t, "t keeps its process");

    // A launch that cannot start (a typo): the session's running instance keeps serving.
    let running = pid(&dir, "s");
    let mut typo = servers(&dir, &[("s", &["--start-delay", "10"]), ("t", &[])]);
    typo["mcpServers"]["s"]["command"] = json!("/nonexistent/faulty-server");
    rewrite_config(&dir, &typo);
    gw.logged("the session's new launch did not start").await;
    assert_eq!(text(&call(&client, "s__echo", json!({"message": "still"})).await), "s: still");
    assert!(pid(&dir, "s") == running && alive(running), "the running instance");

    // Removed: its instance stops with no request of the session's.
    let before = told();
    rewrite_config(&dir, &servers(&dir, &[("s", &["--start-delay", "10"])]));
    eventually("t's instance stopped", move || !alive(t)).await;
    eventually("list_changed for the removed server", || told() > before).await;
    assert!(until_offered(client.peer(), "t__echo", false).await, "t no longer offered");
    let _ = client.cancel().await;
}

/// A reload that makes a session server shared moves the session's resource
/// subscriptions to the shared instance (made again there); its own instance stops.
#[tokio::test]
#[allow(deprecated, reason = "resources/subscribe lives in the revisions the gateway speaks")]
async fn a_server_made_shared_keeps_the_sessions_subscriptions() {
    let servers = |dir: &Path, scope: &str| {
        let mut s = faulty("s", dir, &[]);
        s["scope"] = json!(scope);
        json!({"mcpServers": {"s": s}, "rebound": {"tool_names": "always"}})
    };
    let gw = HttpGateway::start(|dir| servers(dir, "session"), &[]).await;
    let dir = gw.dir.path().to_owned();
    let client = gw.client(None).await.unwrap();
    assert_eq!(text(&call(&client, "s__echo", json!({"message": "1"})).await), "s: 1");
    let own = pid(&dir, "s");
    let subscribed = || std::fs::read_to_string(dir.join("s/subscribes")).unwrap_or_default().lines().count();
    client.peer().subscribe(rmcp::model::SubscribeRequestParams::new("faulty://s/readme")).await.unwrap();
    assert_eq!(subscribed(), 1);
    rewrite_config(&dir, &servers(&dir, "shared"));
    eventually("the session's own instance stopped", move || !alive(own)).await;
    eventually("the subscription made again on the shared instance", || subscribed() == 2).await;
    let shared = pid(&dir, "s");
    assert!(shared != own && alive(shared));
    assert_eq!(text(&call(&client, "s__echo", json!({"message": "2"})).await), "s: 2");
    let _ = client.cancel().await;
}

/// A reload that makes a shared server `session`-scoped keeps its clients' resource
/// subscriptions: each moves to its session's own instance, made when the session next
/// asks (here, the listing the reload's `list_changed` prompts), and is followed there.
/// A session that never asks again holds its subscription until it does; made shared
/// once more, the shared instance takes it.
#[tokio::test]
#[allow(deprecated, reason = "resources/subscribe lives in the revisions the gateway speaks")]
async fn a_server_made_session_scoped_keeps_its_clients_subscriptions() {
    let servers = |dir: &Path, scope: &str| {
        let mut s = faulty("s", dir, &[]);
        s["scope"] = json!(scope);
        json!({"mcpServers": {"s": s}, "rebound": {"tool_names": "always"}})
    };
    let gw = HttpGateway::start(|dir| servers(dir, "shared"), &[]).await;
    let dir = gw.dir.path().to_owned();
    let subscribed = || std::fs::read_to_string(dir.join("s/subscribes")).unwrap_or_default().lines().count();
    let (first, second) = (gw.client(None).await.unwrap(), gw.client(None).await.unwrap());
    assert_eq!(text(&call(&first, "s__echo", json!({"message": "1"})).await), "s: 1");
    let shared = pid(&dir, "s");
    for client in [&first, &second] {
        client.peer().subscribe(rmcp::model::SubscribeRequestParams::new("faulty://s/readme")).await.unwrap();
    }
    assert_eq!(subscribed(), 1, "one subscription upstream for both");

    rewrite_config(&dir, &servers(&dir, "session"));
    eventually("the shared instance stopped", move || !alive(shared)).await;
    // The first client asks: its own instance starts and follows its subscription.
    assert_eq!(text(&call(&first, "s__echo", json!({"message": "2"})).await), "s: 2");
    eventually("the first session's subscription made on its own instance", || subscribed() == 2).await;
    let uri = "faulty://s/readme";
    let (heard_first, heard_second) = (first.service().heard.clone(), second.service().heard.clone());
    eventually("announced to the first", || heard_first.lock().unwrap().updated == [uri]).await;
    let own = pid(&dir, "s");
    assert!(own != shared && alive(own));

    // The second has not asked since: made shared again, its subscription is followed on
    // the new shared instance, as the first's is (moved there from its own instance).
    rewrite_config(&dir, &servers(&dir, "shared"));
    eventually("the first session's own instance stopped", move || !alive(own)).await;
    eventually("followed on the new shared instance", || subscribed() == 3).await;
    eventually("announced to the second", || heard_second.lock().unwrap().updated == [uri]).await;
    eventually("announced to the first again", || heard_first.lock().unwrap().updated == [uri, uri]).await;
    let _ = (first.cancel().await, second.cancel().await);
}

/// A session server's relaunch still coming up (its new process waits for a gate file)
/// when another reload lands: one that asks for the same launch waits for it rather than
/// starting another process; one that asks for another launch stops it at once and starts
/// that one. Each takes over once up.
#[tokio::test]
async fn a_reload_while_a_sessions_relaunch_comes_up_starts_no_second_copy() {
    let servers = |dir: &Path, gate: Option<&str>, b: bool| {
        let mut s = gated(dir, "s", gate.map(|g| dir.join(g)).as_deref());
        s["scope"] = json!("session");
        let mut servers = json!({"a": faulty("a", dir, &[]), "s": s});
        if b {
            servers["b"] = faulty("b", dir, &[]);
        }
        json!({"mcpServers": servers, "rebound": {"tool_names": "always"}})
    };
    let gw = HttpGateway::start(|dir| servers(dir, None, false), &[]).await;
    let dir = gw.dir.path().to_owned();
    let client = gw.client(None).await.unwrap();
    assert_eq!(text(&call(&client, "s__echo", json!({"message": "1"})).await), "s: 1");
    let starts = || std::fs::read_to_string(dir.join("s/starts")).unwrap_or_default().lines().count();
    let first = pid(&dir, "s");

    // A new launch, held at its gate: the running instance serves meanwhile.
    rewrite_config(&dir, &servers(&dir, Some("gate-1"), false));
    eventually("the relaunch started", || starts() == 2).await;
    gw.logged("relaunching in each running session (taking over once up) s").await;
    assert_eq!(text(&call(&client, "s__echo", json!({"message": "2"})).await), "s: 2");
    // Another reload, the same launch for s: no second copy of it.
    rewrite_config(&dir, &servers(&dir, Some("gate-1"), true));
    assert!(until_offered(client.peer(), "b__echo", true).await, "the second reload applied");
    assert_eq!(text(&call(&client, "s__echo", json!({"message": "3"})).await), "s: 3");
    assert_eq!(starts(), 2, "the relaunch coming up is waited for, not started again");
    std::fs::write(dir.join("gate-1"), "").unwrap();
    eventually("the relaunch took over", move || !alive(first)).await;
    let second = pid(&dir, "s");
    assert!(alive(second));

    // A relaunch coming up that a later reload changes again is stopped at once.
    rewrite_config(&dir, &servers(&dir, Some("gate-2"), true));
    eventually("the next relaunch started", || starts() == 3).await;
    let superseded = pid(&dir, "s");
    rewrite_config(&dir, &servers(&dir, Some("gate-3"), true));
    eventually("the superseded relaunch stopped", move || !alive(superseded)).await;
    eventually("the last launch started", || starts() == 4).await;
    assert!(alive(second), "the running instance serves meanwhile");
    std::fs::write(dir.join("gate-3"), "").unwrap();
    eventually("the last launch took over", move || !alive(second)).await;
    assert_eq!(text(&call(&client, "s__echo", json!({"message": "4"})).await), "s: 4");
    assert_eq!(starts(), 4);
    assert!(!gw.log.lock().unwrap().contains("the session's new launch did not start"), "nothing failed");
    let _ = client.cancel().await;
}

/// A server a reload keeps, started again after that reload read the token from another
/// variable, does not inherit that one: what its servers do not inherit follows the
/// configuration applied last.
#[tokio::test]
async fn a_token_a_reload_reads_from_another_variable_stays_out_of_servers_started_later() {
    let config = |dir: &Path, variable: &str| {
        // Writes its environment, then its pid, at each start.
        let script = r#"env > "$1.$$"; echo $$ >> "$1.pids"; shift; exec "$@""#;
        let a = rebound_tests::after_script(script, &dir.join("env"), &faulty("a", dir, &[]));
        let http = json!({"auth_token": format!("${{{variable}}}")});
        json!({"mcpServers": {"a": a}, "rebound": {"http": http}})
    };
    let (first, second) = ("first-token-0123456789", "second-token-0123456789");
    let gw = HttpGateway::start(|dir| config(dir, "TOKEN_A"), &[("TOKEN_A", first), ("TOKEN_B", second)]).await;
    let dir = gw.dir.path().to_owned();
    let pids = || {
        let pids = std::fs::read_to_string(dir.join("env.pids")).unwrap_or_default();
        pids.lines().map(|l| l.parse::<i32>().unwrap()).collect::<Vec<_>>()
    };
    eventually("a started", || pids().len() == 1).await;
    rewrite_config(&dir, &config(&dir, "TOKEN_B"));
    gw.logged("rebound.http.auth_token rotated").await;
    gw.logged("configuration reloaded").await;
    let killed = nix::unistd::Pid::from_raw(pids()[0]);
    nix::sys::signal::kill(killed, nix::sys::signal::Signal::SIGKILL).unwrap();
    eventually("a started again", || pids().len() == 2).await;
    let env = std::fs::read_to_string(dir.join(format!("env.{}", pids()[1]))).unwrap();
    // (The first token, rotated away, opens nothing any more.)
    for withheld in ["TOKEN_B", second] {
        assert!(!env.contains(withheld), "{withheld} in the restarted server's environment");
    }
}

/// A reload rotates the HTTP front's token: the new one opens it from then on, the old
/// one no longer does, even on a session it opened. Removing the token does not open the
/// gateway while it serves: that waits for the next start, and the token holds meanwhile.
#[tokio::test]
async fn a_reload_rotates_the_token_but_never_opens_the_gateway() {
    let with_token = |dir: &Path, token: Option<&str>| {
        let mut c = json!({"mcpServers": {"a": faulty("a", dir, &[])}, "rebound": {"tool_names": "always"}});
        if let Some(token) = token {
            c["rebound"]["http"] = json!({"auth_token": token});
        }
        c
    };
    let gw = HttpGateway::start(|dir| with_token(dir, Some("first-token-0123456789")), &[]).await;
    let dir = gw.dir.path().to_owned();
    let old = gw.client(Some("first-token-0123456789")).await.unwrap();
    assert_eq!(text(&call(&old, "a__echo", json!({"message": "1"})).await), "a: 1");
    let said = |what: &'static str| {
        let log = gw.log.clone();
        move || log.lock().unwrap().contains(what)
    };

    // Rotated with a relaunch of `a` that waits at a gate: the token rotates at once,
    // not once the new process is up.
    let mut rotated = with_token(&dir, Some("second-token-0123456789"));
    let gate = dir.join("gate");
    rotated["mcpServers"]["a"] = faulty("a", &dir, &["--start-gate", gate.to_str().unwrap()]);
    rewrite_config(&dir, &rotated);
    eventually("the token rotated", said("rebound.http.auth_token rotated")).await;
    let new = gw.client(Some("second-token-0123456789")).await.unwrap();
    assert_eq!(text(&call(&new, "a__echo", json!({"message": "2"})).await), "a: 2");
    assert!(gw.client(Some("first-token-0123456789")).await.is_err(), "the old token opens no session");
    let mut params = CallToolRequestParams::new("a__echo");
    params.arguments = json!({"message": "3"}).as_object().cloned();
    assert!(old.peer().call_tool(params).await.is_err(), "nor a request on a session it opened");
    assert!(!said("configuration reloaded")(), "all of that while the relaunch is still coming up");
    std::fs::write(&gate, "").unwrap();
    eventually("the reload applied", said("configuration reloaded")).await;

    // Removed from the file: still required until the next start.
    let mut removed = with_token(&dir, None);
    removed["mcpServers"]["a"] = rotated["mcpServers"]["a"].clone();
    rewrite_config(&dir, &removed);
    eventually("the removal deferred", said("rebound.http.auth_token is removed by the file")).await;
    assert!(gw.client(None).await.is_err(), "no client without the token");
    assert_eq!(text(&call(&new, "a__echo", json!({"message": "4"})).await), "a: 4");
    let _ = new.cancel().await;
}

/// A stream a client holds open, its session's `GET` stream and a 2026-07-28 client's
/// `subscriptions/listen`, outlives the request that opened it: a reload that rotates the
/// token ends those opened with the old one, and one that keeps it does not (each stream
/// hears the list change of the first reload, then ends at the second).
#[tokio::test]
async fn a_rotated_token_ends_the_streams_it_opened() {
    let (first, second) = ("first-token-0123456789", "second-token-0123456789");
    let with = |dir: &Path, token: &str, b: bool| {
        let mut servers = json!({"a": faulty("a", dir, &[])});
        if b {
            servers["b"] = faulty("b", dir, &[]);
        }
        json!({"mcpServers": servers, "rebound": {"tool_names": "always", "http": {"auth_token": token}}})
    };
    let gw = HttpGateway::start(|dir| with(dir, first, false), &[]).await;
    let dir = gw.dir.path().to_owned();
    let http = reqwest::Client::new();
    let post = |body: Value| {
        http.post(gw.url())
            .bearer_auth(first)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(body.to_string())
    };
    let initialize = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}});
    let opened = post(initialize).send().await.unwrap();
    let session = opened.headers()["mcp-session-id"].to_str().unwrap().to_owned();
    opened.bytes().await.unwrap();
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let sent = post(initialized).header("mcp-session-id", &session).header("mcp-protocol-version", "2025-11-25");
    assert!(sent.send().await.unwrap().status().is_success());
    let get = http
        .get(gw.url())
        .bearer_auth(first)
        .header("accept", "text/event-stream")
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", "2025-11-25");
    let mut standalone = get.send().await.unwrap();
    assert_eq!(standalone.status(), 200, "the session's GET stream");
    let meta = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
        "io.modelcontextprotocol/clientCapabilities": {}});
    let listen = json!({"jsonrpc": "2.0", "id": 1, "method": "subscriptions/listen",
        "params": {"notifications": {"toolsListChanged": true}, "_meta": meta}});
    let listen = post(listen).header("mcp-protocol-version", "2026-07-28").header("mcp-method", "subscriptions/listen");
    let mut listening = listen.send().await.unwrap();
    assert_eq!(listening.status(), 200, "the listen stream");

    // Everything a stream says until `until` holds of it, or it ends (`None`).
    async fn read_until(stream: &mut reqwest::Response, until: impl Fn(&str) -> bool) -> Option<String> {
        let mut said = String::new();
        let reading = async {
            while let Some(chunk) = stream.chunk().await.ok().flatten() {
                said.push_str(&String::from_utf8_lossy(&chunk));
                if until(&said) {
                    return Some(said.clone());
                }
            }
            None
        };
        tokio::time::timeout(Duration::from_secs(60), reading).await.expect("the stream neither ended nor said it")
    }
    let changed = |said: &str| said.contains("notifications/tools/list_changed");
    rewrite_config(&dir, &with(&dir, first, true));
    assert!(read_until(&mut standalone, changed).await.is_some(), "the GET stream stays open through a reload");
    assert!(read_until(&mut listening, changed).await.is_some(), "so does the listen stream");

    // A request let in before the rotation (the reload waits 300 ms for the file to
    // settle) whose body, but for its first bytes, comes after it.
    let (release, body) = tokio::sync::oneshot::channel::<()>();
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "a__echo", "arguments": {"message": "late"}}});
    let text = call.to_string();
    let (head, rest) = (text[..1].to_owned(), text[1..].to_owned());
    let rest = async move {
        let _ = body.await;
        Ok::<_, std::io::Error>(rest)
    };
    let body = futures::StreamExt::chain(futures::stream::once(async move { Ok(head) }), futures::stream::once(rest));
    let late = http
        .post(gw.url())
        .bearer_auth(first)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", "2025-11-25")
        .body(reqwest::Body::wrap_stream(body))
        .send();
    let late = tokio::spawn(late);

    rewrite_config(&dir, &with(&dir, second, true));
    assert_eq!(read_until(&mut standalone, |_| false).await, None, "the GET stream ends once the token rotated");
    assert_eq!(read_until(&mut listening, |_| false).await, None, "and so does the listen stream");
    gw.logged("a stream opened with a token a reload rotated away was closed").await;
    // (Refused before its body was read, it may have been dropped unsent.)
    let _ = release.send(());
    let late = late.await.unwrap().unwrap();
    assert_eq!(late.status(), 401, "a body that came after the rotation is refused: {:?}", late.text().await);
    assert!(gw.state("a", "calls").iter().all(|c| c != "echo"), "it never reached the server");
}

/// A call waiting to try again (here, a rate limit's `Retry-After`) when a reload
/// relaunches its server: nothing is in flight on the old process then, which stops; the
/// next attempt goes to the new one (named `anew`, with no rate limit), and the call is
/// answered.
#[tokio::test]
async fn a_call_waiting_to_retry_through_a_relaunch_is_answered_by_the_new_process() {
    let launch = |dir: &Path, anew: bool| {
        let mut a = faulty("a", dir, if anew { &["--name", "anew"] } else { &[] });
        a["recovery"] = json!({"retry": {"max_attempts": 3}});
        if anew {
            a["env"] = json!({"FAULTY_NO_LIMITS": "1"});
        }
        json!({"mcpServers": {"a": a}})
    };
    let gw = HttpGateway::start(|dir| launch(dir, false), &[]).await;
    let dir = gw.dir.path().to_owned();
    let client = gw.client(None).await.unwrap();
    let old = pid(&dir, "a");
    let calls = || std::fs::read_to_string(dir.join("a/calls")).unwrap_or_default().lines().count();
    // Ten seconds to wait: time for the reload on a loaded machine.
    let waiting = call(&client, "rate_limited", json!({"retry_after": 10}));
    let relaunch = async {
        eventually("the first attempt refused", || calls() >= 1).await;
        rewrite_config(&dir, &launch(&dir, true));
        eventually("the old process stopped", move || !alive(old)).await;
    };
    let (answered, ()) = tokio::join!(waiting, relaunch);
    assert_eq!(text(&answered), "anew: not limited", "{answered:?}");
    let report = &answered.meta.as_ref().unwrap().0["rebound"];
    let attempts = report["attempts"].as_array().map(Vec::len);
    assert_eq!(attempts, Some(2), "one on the old process, one on the new: {report}");
    let _ = client.cancel().await;
}

/// A session's own instance that a reload relaunches with shorter timeouts finishes the
/// call it runs under its old ones: it stops once that call is done, not at the new
/// configuration's deadline; the next call goes to the new process.
#[tokio::test]
async fn a_session_instance_relaunched_with_shorter_timeouts_finishes_its_longer_call() {
    let launch = |dir: &Path, anew: bool| {
        let mut s = faulty("s", dir, if anew { &["--name", "anew"] } else { &[] });
        s["scope"] = json!("session");
        let timeout_ms = if anew { 200 } else { 30000 };
        s["recovery"] =
            json!({"timeout_ms": timeout_ms, "retry": {"max_attempts": 1, "initial_delay_ms": 1, "max_delay_ms": 1}});
        json!({"mcpServers": {"s": s}, "rebound": {"tool_names": "always"}})
    };
    let gw = HttpGateway::start(|dir| launch(dir, false), &[]).await;
    let dir = gw.dir.path().to_owned();
    let client = gw.client(None).await.unwrap();
    let lines = |file: &str| std::fs::read_to_string(dir.join("s").join(file)).unwrap_or_default().lines().count();
    let slow = call(&client, "s__slow", json!({"ms": 6000}));
    let relaunch = async {
        eventually("the slow call in flight", || lines("calls") >= 1).await;
        rewrite_config(&dir, &launch(&dir, true));
        eventually("the new process started", || lines("starts") >= 2).await;
    };
    let (answered, ()) = tokio::join!(slow, relaunch);
    assert_eq!(text(&answered), "s: slept 6000 ms", "{answered:?}");
    assert_eq!(text(&call(&client, "s__echo", json!({"message": "next"})).await), "anew: next");
    let _ = client.cancel().await;
}

/// A shared server's process finishes a call under the deadline it began with, though a
/// later reload shortened its timeouts (the process kept) before another relaunched it.
#[tokio::test]
async fn a_relaunched_process_finishes_a_call_begun_two_reloads_before() {
    let launch = |dir: &Path, timeout_ms: u64, anew: bool| {
        let mut a = faulty("a", dir, if anew { &["--name", "anew"] } else { &[] });
        a["recovery"] =
            json!({"timeout_ms": timeout_ms, "retry": {"max_attempts": 1, "initial_delay_ms": 1, "max_delay_ms": 1}});
        json!({"mcpServers": {"a": a}})
    };
    let gw = HttpGateway::start(|dir| launch(dir, 30000, false), &[]).await;
    let dir = gw.dir.path().to_owned();
    let client = gw.client(None).await.unwrap();
    let lines = |file: &str| std::fs::read_to_string(dir.join("a").join(file)).unwrap_or_default().lines().count();
    let slow = call(&client, "slow", json!({"ms": 6000}));
    let reloads = async {
        eventually("the slow call in flight", || lines("calls") >= 1).await;
        let applied = |n: usize| {
            let log = gw.log.clone();
            move || log.lock().unwrap().matches("configuration reloaded from").count() >= n
        };
        rewrite_config(&dir, &launch(&dir, 200, false));
        eventually("the shorter timeout applied", applied(1)).await;
        rewrite_config(&dir, &launch(&dir, 200, true));
        eventually("the new process started", || lines("starts") >= 2).await;
    };
    let (answered, ()) = tokio::join!(slow, reloads);
    assert_eq!(text(&answered), "a: slept 6000 ms", "{answered:?}");
    let _ = client.cancel().await;
}

/// A process a reload replaced, still finishing a call, that crashes meanwhile is not
/// started again with its old launch: its call fails, and the new process serves.
#[tokio::test]
async fn a_replaced_process_that_crashes_while_finishing_its_calls_is_not_started_again() {
    let (gw, dir, client) = serving_a_and_b().await;
    let old = pid(&dir, "a");
    let lines = |file: &str| std::fs::read_to_string(dir.join("a").join(file)).unwrap_or_default().lines().count();
    let (starts, calls) = (|| lines("starts"), || lines("calls"));
    // In flight on the old process for as long as it runs (a's timeout is a minute).
    let hanging = call(&client, "a__hang", json!({}));
    let relaunch = async {
        eventually("the call reached a", || calls() >= 2).await;
        let mut anew = config(&dir, 60000, &[]);
        anew["mcpServers"]["a"]["args"].as_array_mut().unwrap().extend([json!("--start-delay"), json!("10")]);
        rewrite_config(&dir, &anew);
        let log = gw.log.clone();
        eventually("a relaunched", move || log.lock().unwrap().contains("restarted a")).await;
        assert!(alive(old), "the old process finishes its call");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(old as i32), nix::sys::signal::Signal::SIGKILL).unwrap();
        let log = gw.log.clone();
        eventually("the old instance given up", move || log.lock().unwrap().contains("not started again")).await;
    };
    let (hung, ()) = tokio::join!(hanging, relaunch);
    assert_eq!(hung.is_error, Some(true), "{hung:?}");
    assert_eq!(starts(), 2, "the first launch and the new one, no restart of the old");
    assert_eq!(text(&call(&client, "a__echo", json!({"message": "new"})).await), "a: new");
    let _ = client.cancel().await;
}

/// Requests waiting for a server that is restarting (after a long backoff) when a reload
/// relaunches it: the old instance is not started again, and the requests, a prompt and
/// a tool call, are answered by the new process.
#[tokio::test]
async fn requests_waiting_for_a_restart_are_answered_by_the_process_a_reload_launches() {
    let launch = |dir: &Path, anew: bool| {
        let mut c = config(dir, 60000, &[]);
        c["rebound"]["restart"] = json!({"initial_delay_ms": 600000, "max_delay_ms": 600000});
        if anew {
            // Slow to start: the requests below are sent while it starts.
            let args = ["--name", "anew", "--start-delay", "1500"].map(|a| json!(a));
            c["mcpServers"]["a"]["args"].as_array_mut().unwrap().extend(args);
        }
        c
    };
    let gw = HttpGateway::start(|dir| launch(dir, false), &[]).await;
    let dir = gw.dir.path().to_owned();
    let client = gw.client(None).await.unwrap();
    assert_eq!(text(&call(&client, "a__echo", json!({"message": "1"})).await), "a: 1");
    let old = pid(&dir, "a");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(old as i32), nix::sys::signal::Signal::SIGKILL).unwrap();
    gw.logged("connection lost").await;
    let mut greet = rmcp::model::GetPromptRequestParams::new("a__greet");
    greet.arguments = json!({"who": "ada"}).as_object().cloned();
    rewrite_config(&dir, &launch(&dir, true));
    let prompt = tokio::time::timeout(Duration::from_secs(30), client.peer().get_prompt(greet));
    let echo = call(&client, "a__echo", json!({"message": "2"}));
    let (prompt, echo) = tokio::join!(prompt, echo);
    let prompt = serde_json::to_string(&prompt.unwrap().unwrap()).unwrap();
    assert!(prompt.contains("hello ada from anew"), "{prompt}");
    assert_eq!(text(&echo), "anew: 2", "{echo:?}");
    gw.logged("not started again").await;
    let _ = client.cancel().await;
}

/// A subscription waiting for a restarting server that a reload relaunches is made on,
/// and kept as, the new process's: when that one restarts in turn, it is made again there
/// and announced.
#[tokio::test]
#[allow(deprecated, reason = "resources/subscribe lives in the revisions the gateway speaks")]
async fn a_subscription_waiting_for_a_restart_through_a_relaunch_belongs_to_the_new_process() {
    let launch = |dir: &Path, anew: bool| {
        let mut c = config(dir, 60000, &[]);
        // The old process restarts only after a long backoff; the new one at once.
        let delay = if anew { 50 } else { 600000 };
        c["rebound"]["restart"] = json!({"initial_delay_ms": delay, "max_delay_ms": 600000});
        if anew {
            let args = ["--start-delay", "1500"].map(|a| json!(a));
            c["mcpServers"]["a"]["args"].as_array_mut().unwrap().extend(args);
        }
        c
    };
    let gw = HttpGateway::start(|dir| launch(dir, false), &[]).await;
    let dir = gw.dir.path().to_owned();
    let client = gw.client(None).await.unwrap();
    let uri = "faulty://a/readme";
    let subscribed = || std::fs::read_to_string(dir.join("a/subscribes")).unwrap_or_default().lines().count();
    assert_eq!(text(&call(&client, "a__echo", json!({"message": "1"})).await), "a: 1");
    let old = pid(&dir, "a");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(old as i32), nix::sys::signal::Signal::SIGKILL).unwrap();
    gw.logged("connection lost").await;
    rewrite_config(&dir, &launch(&dir, true));
    client.peer().subscribe(rmcp::model::SubscribeRequestParams::new(uri)).await.unwrap();
    assert_eq!(subscribed(), 1, "made on the new process");
    assert!(call(&client, "a__crash", json!({})).await.is_error == Some(true));
    eventually("made again after the new process restarted", || subscribed() == 2).await;
    let heard = client.service().heard.clone();
    eventually("announced", move || heard.lock().unwrap().updated == [uri]).await;
    let _ = client.cancel().await;
}

/// A plugins folder that is not there when the gateway starts, nor the folder holding it
/// (`target/plugins` before the first build), or is removed and made again (`cargo
/// clean`), is watched once it is there: an adapter copied into it is loaded without a
/// SIGHUP.
#[tokio::test]
async fn a_plugins_folder_made_after_the_start_is_watched() {
    let gw = HttpGateway::start(
        |dir| {
            // The default adapter, where the folder has it.
            let plugins = dir.join("target/plugins");
            json!({"mcpServers": {"a": faulty("a", dir, &[])}, "rebound": {"plugins_dir": plugins}})
        },
        &[],
    )
    .await;
    let (dir, client) = (gw.dir.path().to_owned(), gw.client(None).await.unwrap());
    let adapter = || async {
        let status = call(&client, "rebound_status", json!({})).await.structured_content.unwrap();
        status["servers"][0]["adapter"]["name"].as_str().map(str::to_owned)
    };
    let until = |loaded: bool| async move {
        for _ in 0..100 {
            if adapter().await.is_some() == loaded {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    };
    assert_eq!(adapter().await, None, "no adapter at first");
    let built = rebound_tests::root().join("target/plugins/thanos-classify.wasm");
    // Each folder filled once the gateway watches it.
    let watching = |folder: &str, times: usize| {
        let line = format!("watching {} for plugins", dir.join(folder).display());
        let log = gw.log.clone();
        eventually("the folder watched", move || log.lock().unwrap().matches(&line).count() == times)
    };
    for (times, round) in [(1, "made"), (2, "made again")] {
        std::fs::create_dir(dir.join("target")).unwrap();
        watching("target", times).await;
        std::fs::create_dir(dir.join("target/plugins")).unwrap();
        watching("target/plugins", times).await;
        std::fs::copy(&built, dir.join("target/plugins/thanos-classify.wasm")).unwrap();
        assert!(until(true).await, "the adapter loaded from the folder {round}");
        // Where the server had none: new adapter code for it (what it may do is the new
        // adapter's to declare). Logged as the reload is applied, and read from the
        // gateway's stderr a moment after the status shows it.
        let log = gw.log.clone();
        let said = move || log.lock().unwrap().matches("new adapter code for a").count() >= times;
        eventually(&format!("the reload logged ({round})"), said).await;
        std::fs::remove_dir_all(dir.join("target")).unwrap();
        assert!(until(false).await, "the adapter gone with the folder");
    }
    let _ = client.cancel().await;
}

/// A relaunched server's subscriptions move to its new process once it serves, those
/// made while it was starting (which went to the old one) included, and each resource is
/// announced as updated, since what changed meanwhile was not heard. The client's log
/// level is set on the new process once.
#[tokio::test]
#[allow(deprecated, reason = "resources/subscribe and logging/setLevel live in the revisions the gateway speaks")]
async fn subscriptions_made_while_a_relaunch_starts_move_to_the_new_process() {
    let gw = Gateway::start(|dir| json!({"mcpServers": {"a": faulty("a", dir, &[])}})).await;
    let dir = gw.dir.path().to_owned();
    let subscribe = |uri: &'static str| gw.client.peer().subscribe(rmcp::model::SubscribeRequestParams::new(uri));
    let (readme, item) = ("faulty://a/readme", "faulty://a/items/2");
    let level = rmcp::model::SetLevelRequestParams::new(rmcp::model::LoggingLevel::Warning);
    gw.client.peer().set_level(level).await.unwrap();
    eventually("the level set upstream", || gw.state("a", "levels") == ["warning"]).await;
    subscribe(readme).await.unwrap();
    let gate = dir.join("gate");
    let anew = json!({"mcpServers": {"a": faulty("a", &dir, &["--start-gate", gate.to_str().unwrap()])}});
    rewrite_config(&dir, &anew);
    eventually("the new process started", || {
        std::fs::read_to_string(dir.join("a/starts")).unwrap().lines().count() == 2
    })
    .await;
    // The new process does not answer until its gate opens: this goes to the old one.
    subscribe(item).await.unwrap();
    assert_eq!(gw.state("a", "subscribes"), [readme, item]);
    std::fs::write(&gate, "").unwrap();
    eventually("both followed on the new process", || gw.state("a", "subscribes").len() == 4).await;
    let mut followed = gw.state("a", "subscribes").split_off(2);
    followed.sort();
    assert_eq!(followed, [item, readme]);
    eventually("both announced", || gw.heard.lock().unwrap().updated.len() == 2).await;
    assert_eq!(gw.state("a", "levels"), ["warning", "warning"], "set once on each process");
    gw.close().await;
}

/// A client's log level set while a reload starts new processes reaches each of them,
/// the one already ready but not yet serving (its reload waits for another, slow one) too.
#[tokio::test]
#[allow(deprecated, reason = "logging/setLevel lives in the revisions the gateway speaks")]
async fn a_level_set_while_a_reload_starts_reaches_the_new_processes() {
    let gw =
        Gateway::start(|dir| json!({"mcpServers": {"a": faulty("a", dir, &[]), "b": faulty("b", dir, &[])}})).await;
    let dir = gw.dir.path().to_owned();
    let set = |level| gw.client.peer().set_level(rmcp::model::SetLevelRequestParams::new(level));
    set(rmcp::model::LoggingLevel::Warning).await.unwrap();
    eventually("the level set upstream", || gw.state("a", "levels") == ["warning"]).await;
    // Both relaunched; b's new process waits for its gate, which opens once the level is set.
    let gate = dir.join("gate");
    let anew = json!({"mcpServers": {
        "a": faulty("a", &dir, &["--list-delay", "1"]),
        "b": faulty("b", &dir, &["--start-gate", gate.to_str().unwrap()]),
    }});
    rewrite_config(&dir, &anew);
    eventually("a's new process ready", || gw.state("a", "levels").len() == 2).await;
    set(rmcp::model::LoggingLevel::Error).await.unwrap();
    std::fs::write(&gate, "").unwrap();
    gw.logged("restarted a, b").await;
    let levels = gw.state("a", "levels");
    assert_eq!(levels.iter().filter(|l| *l == "error").count(), 2, "on the old process and the new: {levels:?}");
    gw.close().await;
}

/// A plugins folder in `dir` holding the default adapter, as built.
fn with_default_adapter(dir: &Path) -> std::path::PathBuf {
    let own = dir.join("plugins");
    std::fs::create_dir_all(&own).unwrap();
    let built = rebound_tests::root().join("target/plugins/thanos-classify.wasm");
    std::fs::copy(built, own.join("thanos-classify.wasm")).unwrap();
    own
}

/// A rebuild of the default adapter in `dir`'s plugins folder: the same adapter in other
/// bytes (a custom section appended), swapped in whole.
fn rebuild_default_adapter(dir: &Path) {
    let file = dir.join("plugins/thanos-classify.wasm");
    let mut bytes = std::fs::read(&file).unwrap();
    bytes.extend([0u8, 14, 12]);
    bytes.extend(b"rebound-testx");
    std::fs::write(file.with_extension("tmp"), &bytes).unwrap();
    std::fs::rename(file.with_extension("tmp"), &file).unwrap();
}

/// New code for a server's adapter (a rebuild of the plugins) changes what the adapter
/// does, not what the gateway knows of how the server fares: its open breaker stays open.
#[tokio::test]
async fn new_adapter_code_leaves_the_servers_breaker_as_it_was() {
    let gw = Gateway::start(|dir| {
        let own = with_default_adapter(dir);
        let mut a = faulty("a", dir, &[]);
        a["recovery"] = json!({"timeout_ms": 200, "retry": {"max_attempts": 1},
            "breaker": {"failure_threshold": 1, "open_ms": 600000}});
        json!({"mcpServers": {"a": a}, "rebound": {"plugins_dir": own}})
    })
    .await;
    let breaker = || async {
        let status = gw.call("rebound_status", json!({})).await.structured_content.unwrap();
        status["servers"][0]["breaker"]["state"].clone()
    };
    assert_eq!(gw.call("hang", json!({})).await.is_error, Some(true));
    assert_eq!(breaker().await, "open");
    rebuild_default_adapter(gw.dir.path());
    gw.logged("new adapter code for a").await;
    assert_eq!(breaker().await, "open", "the breaker is the server's, not the adapter's");
    gw.close().await;
}

/// The same for a session's own instance (`scope: session`), which a reload brings in line
/// with the new adapter: its breaker stays open too, and its process is the same.
#[tokio::test]
async fn new_adapter_code_leaves_a_session_servers_breaker_as_it_was() {
    let gw = HttpGateway::start(
        |dir| {
            let own = with_default_adapter(dir);
            let mut s = faulty("s", dir, &[]);
            s["scope"] = json!("session");
            s["recovery"] = json!({"timeout_ms": 200, "retry": {"max_attempts": 1},
                "breaker": {"failure_threshold": 1, "open_ms": 600000}});
            json!({"mcpServers": {"s": s}, "rebound": {"plugins_dir": own, "tool_names": "always"}})
        },
        &[],
    )
    .await;
    let client = gw.client(None).await.unwrap();
    let breaker = || async { server(&status(&client).await, "s")["breaker"]["state"].clone() };
    assert_eq!(call(&client, "s__hang", json!({})).await.is_error, Some(true));
    assert_eq!(breaker().await, "open");
    let running = pid(gw.dir.path(), "s");
    rebuild_default_adapter(gw.dir.path());
    gw.logged("new adapter code for s").await;
    assert_eq!(breaker().await, "open", "the breaker is the instance's, not the adapter's");
    assert_eq!(pid(gw.dir.path(), "s"), running, "the same process");
    let _ = client.cancel().await;
}

/// A session's instance whose relaunch a reload starts (its new process held at a gate
/// that never opens) serves on with its breaker as it was, and keeps it when a later
/// reload goes back to its launch: only the launch changed, each time.
#[tokio::test]
async fn a_session_instance_serving_on_through_its_relaunch_keeps_its_breaker() {
    let servers = |dir: &Path, gate: Option<&Path>| {
        let mut s = gated(dir, "s", gate);
        s["scope"] = json!("session");
        s["recovery"] = json!({"timeout_ms": 200, "retry": {"max_attempts": 1},
            "breaker": {"failure_threshold": 1, "open_ms": 600000}});
        // b, added or removed, says when each reload is applied.
        let mut servers = json!({"s": s});
        if gate.is_some() {
            servers["b"] = faulty("b", dir, &[]);
        }
        json!({"mcpServers": servers, "rebound": {"tool_names": "always"}})
    };
    let gw = HttpGateway::start(|dir| servers(dir, None), &[]).await;
    let dir = gw.dir.path().to_owned();
    let client = gw.client(None).await.unwrap();
    let breaker = || async { server(&status(&client).await, "s")["breaker"]["state"].clone() };
    assert_eq!(call(&client, "s__hang", json!({})).await.is_error, Some(true));
    assert_eq!(breaker().await, "open");
    let running = pid(&dir, "s");
    rewrite_config(&dir, &servers(&dir, Some(&dir.join("never"))));
    assert!(until_offered(client.peer(), "b__echo", true).await, "the relaunch's reload applied");
    assert_eq!(breaker().await, "open", "serving on through its relaunch");
    rewrite_config(&dir, &servers(&dir, None));
    assert!(until_offered(client.peer(), "b__echo", false).await, "the reload back applied");
    assert_eq!(breaker().await, "open", "back to its launch");
    assert!(alive(running));
    let _ = client.cancel().await;
}

#[tokio::test]
async fn over_stdio_too_a_server_added_to_the_file_joins_the_running_session() {
    let gw = Gateway::start(|dir| json!({"mcpServers": {"a": faulty("a", dir, &[])}})).await;
    let dir = gw.dir.path().to_owned();
    assert_eq!(text(&gw.call("echo", json!({"message": "1"})).await), "a: 1");
    let a_pid = pid(&dir, "a");
    rewrite_config(&dir, &json!({"mcpServers": {"a": faulty("a", &dir, &[]), "b": faulty("b", &dir, &[])}}));
    let heard = gw.heard.clone();
    eventually("tools/list_changed", move || heard.lock().unwrap().tools_changed > 0).await;
    until_offered(gw.client.peer(), "b__echo", true).await;
    assert_eq!(text(&gw.call("b__echo", json!({"message": "2"})).await), "b: 2");
    assert_eq!(pid(&dir, "a"), a_pid, "the untouched server kept its process");
    // Its client hides the gateway's log: the status says how the last reload went, a
    // refused one too, and what the file has that is not used.
    let reload = || async {
        gw.call("rebound_status", json!({})).await.structured_content.unwrap()["gateway"]["last_reload"].clone()
    };
    assert_eq!(reload().await["applied"], "added b");
    std::fs::write(dir.join("rebound.json"), r#"{"mcpServers": {"a": {"args": []}}}"#).unwrap();
    eventually("the broken file refused", || gw.log.lock().unwrap().contains("reload refused")).await;
    let refused = reload().await;
    assert!(refused["refused"].as_str().is_some_and(|r| r.contains("neither `command` nor `url`")), "{refused}");
    let mut typo = json!({"mcpServers": {"a": faulty("a", &dir, &[]), "b": faulty("b", &dir, &[])}});
    typo["mcpServer"] = json!({"c": faulty("c", &dir, &[])});
    rewrite_config(&dir, &typo);
    let applied_twice = || gw.log.lock().unwrap().matches("configuration reloaded from").count() >= 2;
    eventually("the file with a typo applied", applied_twice).await;
    let applied = reload().await;
    assert_eq!(applied["applied"], "nothing changed", "{applied}");
    let warnings = applied["warnings"].as_array().cloned().unwrap_or_default();
    assert!(
        warnings.iter().any(|w| w.as_str().is_some_and(|w| w.contains("`mcpServer` is not a key Rebound reads"))),
        "{applied}"
    );
    // A setting the reload applies is said to have changed; one it holds back until the
    // next start is said to be held back, not "nothing changed".
    let mut settings = json!({"mcpServers": {"a": faulty("a", &dir, &[]), "b": faulty("b", &dir, &[])}});
    settings["rebound"] = json!({"errors_log": dir.join("elsewhere.jsonl"), "plugin_timeout_ms": 1500});
    rewrite_config(&dir, &settings);
    let applied_thrice = || gw.log.lock().unwrap().matches("configuration reloaded from").count() >= 3;
    eventually("the file with new settings applied", applied_thrice).await;
    let applied = reload().await;
    assert_eq!(applied["applied"], "changed rebound.plugin_timeout_ms", "{applied}");
    let warnings = applied["warnings"].as_array().cloned().unwrap_or_default();
    let held = "rebound.errors_log changed: that takes effect at the next start";
    assert!(warnings.iter().any(|w| w.as_str().is_some_and(|w| w.contains(held))), "{applied}");
}

/// A reload loads no adapter file again whose bytes it loaded before, and asks no
/// adapter again what it needs when its code and configuration are the same: an
/// unchanged server keeps its adapter (its store), a server whose entry changed gets a
/// fresh one (an empty store) without the file being loaded again, and only new bytes
/// are loaded. The adapter here keeps each failed call's arguments in its store.
#[tokio::test]
async fn a_reload_loads_again_only_what_changed_and_keeps_an_unchanged_servers_adapter() {
    let plugins = rebound_tests::root().join("target/test-plugins");
    let file = move |dir: &Path, a_timeout: u64, b: bool| {
        let mut a = faulty("a", dir, &[]);
        a["adapter"] = json!("misbehave");
        a["adapter_config"] = json!({"mode": "keep"});
        a["recovery"] = json!({"timeout_ms": a_timeout});
        let mut servers = json!({"a": a});
        if b {
            servers["b"] = faulty("b", dir, &[]);
        }
        json!({"mcpServers": servers, "rebound": {"plugins_dir": plugins, "plugin_timeout_ms": 2000, "plugin_cache_dir": dir.join("cache")}})
    };
    let (first, again) = (file.clone(), file.clone());
    let gw = Gateway::start(move |dir| first(dir, 5000, false)).await;
    let dir = gw.dir.path().to_owned();
    let owned = gw;
    let gw = &owned;
    let seen = |tool: &'static str, message: &'static str| async move {
        let answer = text(&gw.call(tool, json!({"message": message})).await);
        answer.rsplit_once("[rebound: seen ").map(|(_, seen)| seen.trim_end_matches(']').to_owned()).unwrap_or(answer)
    };
    assert_eq!(seen("fail", "one").await, "nothing; planned nothing; kept=true");
    let reloads = |n: usize| move || gw.log.lock().unwrap().matches("configuration reloaded from").count() >= n;
    rewrite_config(&dir, &again(&dir, 5000, true));
    eventually("b added", reloads(1)).await;
    assert!(until_offered(gw.client.peer(), "b__echo", true).await);
    let one = r#"{"message":"one"}"#;
    assert_eq!(
        seen("a__fail", "two").await,
        format!("{one}; planned {one}; kept=true"),
        "a unchanged keeps its adapter"
    );
    rewrite_config(&dir, &again(&dir, 6000, true));
    eventually("a's timeout changed", reloads(2)).await;
    assert_eq!(seen("a__fail", "three").await, "nothing; planned nothing; kept=true", "a changed: a fresh adapter");
    let loads = || gw.log.lock().unwrap().matches("misbehave.wasm (").count();
    assert_eq!(loads(), 1, "loaded again:\n{}", gw.log.lock().unwrap());
    // New bytes (a custom section appended) are loaded.
    let wasm = dir.join("plugins-copy");
    std::fs::create_dir(&wasm).unwrap();
    let mut bytes = std::fs::read(rebound_tests::root().join("target/test-plugins/misbehave.wasm")).unwrap();
    bytes.extend([0u8, 14, 12]);
    bytes.extend(b"rebound-testx");
    std::fs::write(wasm.join("misbehave.wasm"), &bytes).unwrap();
    let mut moved = again(&dir, 6000, true);
    moved["rebound"]["plugins_dir"] = json!(wasm);
    rewrite_config(&dir, &moved);
    eventually("new bytes loaded", || loads() == 2).await;
    eventually("the new plugins folder applied", reloads(3)).await;
    assert_eq!(seen("a__fail", "four").await, "nothing; planned nothing; kept=true");
    owned.close().await;
}

/// A reload asks a server's adapter what it needs (`declare`, which this one logs) only
/// when its code or `adapter_config` changed: not when another server changed, nor when
/// its own entry did otherwise. The same bytes under another adapter name are that
/// adapter, named as the configuration names it.
#[tokio::test]
async fn a_reload_asks_declare_again_only_of_what_it_changes() {
    let plugins = rebound_tests::root().join("target/test-plugins");
    let file = |dir: &Path, (a_timeout, config, b): (u64, Value, bool), adapter: &str| {
        let mut a = faulty("a", dir, &[]);
        (a["adapter"], a["adapter_config"]) = (json!(adapter), config);
        a["recovery"] = json!({"timeout_ms": a_timeout});
        let mut servers = json!({"a": a});
        if b {
            servers["b"] = faulty("b", dir, &[]);
        }
        json!({"mcpServers": servers, "rebound": {"plugins_dir": dir.join("plugins"), "plugin_timeout_ms": 2000, "plugin_cache_dir": dir.join("cache")}})
    };
    let counting = || json!({"mode": "count-declare"});
    let first = file;
    let gw = Gateway::start(move |dir| {
        std::fs::create_dir(dir.join("plugins")).unwrap();
        std::fs::copy(plugins.join("hostile.wasm"), dir.join("plugins/hostile.wasm")).unwrap();
        first(dir, (5000, counting(), false), "hostile")
    })
    .await;
    let (dir, log) = (gw.dir.path().to_owned(), gw.log.clone());
    let asked = || log.lock().unwrap().matches("declare asked").count();
    let reloads = |n: usize| {
        let log = log.clone();
        move || log.lock().unwrap().matches("configuration reloaded from").count() >= n
    };
    gw.logged("declare asked").await;
    for (n, (entry, what)) in
        [((5000, counting(), true), "another server added"), ((6000, counting(), true), "its own timeout changed")]
            .into_iter()
            .enumerate()
    {
        rewrite_config(&dir, &file(&dir, entry, "hostile"));
        eventually(what, reloads(n + 1)).await;
        assert_eq!(asked(), 1, "{what}: asked again");
    }
    let mut config = counting();
    config["more"] = json!(1);
    rewrite_config(&dir, &file(&dir, (6000, config.clone(), true), "hostile"));
    eventually("its adapter_config changed", reloads(3)).await;
    assert_eq!(asked(), 2, "a new adapter_config is asked about");
    // The same bytes under another name: not loaded again, but that adapter, asked what
    // it needs and named as the configuration names it.
    std::fs::copy(dir.join("plugins/hostile.wasm"), dir.join("plugins/renamed.wasm")).unwrap();
    rewrite_config(&dir, &file(&dir, (6000, config, true), "renamed"));
    eventually("the adapter renamed", reloads(4)).await;
    assert_eq!(asked(), 3, "the renamed adapter is asked");
    let status = gw.call("rebound_status", json!({})).await.structured_content.unwrap();
    assert_eq!(status["servers"][0]["adapter"]["name"], "renamed", "{status}");
    gw.close().await;
}

#[tokio::test]
async fn sighup_reloads_and_an_unchanged_file_changes_nothing() {
    let (gw, dir, client) = serving_a_and_b().await;
    let pids = (pid(&dir, "a"), pid(&dir, "b"));
    let gateway = gw.child.id().unwrap().to_string();
    std::process::Command::new("kill").args(["-HUP", &gateway]).status().unwrap();
    let log = gw.log.clone();
    eventually("the reload on SIGHUP", move || {
        let log = log.lock().unwrap();
        log.contains("SIGHUP: reloading") && log.contains(": nothing changed")
    })
    .await;
    assert_eq!((pid(&dir, "a"), pid(&dir, "b")), pids);
    assert_eq!(text(&call(&client, "a__echo", json!({"message": "2"})).await), "a: 2");
    let _ = client.cancel().await;
}

/// A SIGHUP while a server's first start is still under way: the gateway lives, the
/// reload finds nothing changed, and the start goes on, the same process, to serve.
#[tokio::test]
async fn sighup_while_a_first_start_is_under_way_changes_nothing() {
    let gw = HttpGateway::start(
        |dir| {
            let gate = dir.join("a-may-start");
            json!({"mcpServers": {"a": faulty("a", dir, &["--start-gate", gate.to_str().unwrap()])}})
        },
        &[],
    )
    .await;
    let dir = gw.dir.path().to_owned();
    eventually("a's process started", || pid(&dir, "a") != 0).await;
    let started = pid(&dir, "a");
    let gateway = gw.child.id().unwrap().to_string();
    std::process::Command::new("kill").args(["-HUP", &gateway]).status().unwrap();
    gw.logged("SIGHUP: reloading").await;
    gw.logged(": nothing changed").await;
    std::fs::write(dir.join("a-may-start"), "").unwrap();
    let client = gw.client(None).await.unwrap();
    assert_eq!(text(&call(&client, "echo", json!({"message": "m"})).await), "a: m");
    assert_eq!(pid(&dir, "a"), started, "the process whose start was under way");
    let _ = client.cancel().await;
}

#[tokio::test]
async fn a_configuration_mounted_as_a_kubernetes_configmap_is_reloaded_when_it_is_swapped() {
    let (gw, dir, client) = serving_a_and_b().await;
    // The layout the kubelet makes: rebound.json -> ..data/rebound.json, ..data -> ..v1.
    let version = |name: &str, config: &Value| {
        std::fs::create_dir(dir.join(name)).unwrap();
        std::fs::write(dir.join(name).join("rebound.json"), serde_json::to_vec_pretty(config).unwrap()).unwrap();
    };
    version("..v1", &config(&dir, 60000, &[]));
    std::os::unix::fs::symlink("..v1", dir.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/rebound.json", dir.join("rebound.json.link")).unwrap();
    std::fs::rename(dir.join("rebound.json.link"), dir.join("rebound.json")).unwrap();
    let target = std::fs::canonicalize(&dir).unwrap().join("..v1/rebound.json");
    gw.logged(&format!("links to {}", target.display())).await;
    // An update: a new version, and `..data` swapped to it by a rename. No event names
    // rebound.json.
    version("..v2", &config(&dir, 60000, &[("c", faulty("c", &dir, &[]))]));
    std::os::unix::fs::symlink("..v2", dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    std::fs::remove_dir_all(dir.join("..v1")).unwrap();
    let found = until_offered(client.peer(), "c__echo", true).await;
    assert!(found, "the swapped configuration was not applied: {}", gw.log.lock().unwrap());
    assert_eq!(text(&call(&client, "c__echo", json!({"message": "swapped"})).await), "c: swapped");
}

/// A configuration linked from elsewhere (a dotfiles checkout) is edited there, where
/// the link's own folder sees nothing: that folder is watched too.
#[tokio::test]
async fn a_configuration_linked_from_elsewhere_reloads_when_edited_there() {
    let dir = tempfile::tempdir().unwrap();
    let dotfiles = dir.path().join("dotfiles");
    std::fs::create_dir(&dotfiles).unwrap();
    let first = json!({"mcpServers": {"a": faulty("a", dir.path(), &[])}});
    std::fs::write(dotfiles.join("rebound.json"), serde_json::to_vec(&first).unwrap()).unwrap();
    let link = dir.path().join("rebound.json");
    std::os::unix::fs::symlink(dotfiles.join("rebound.json"), &link).unwrap();
    let log = Arc::new(std::sync::Mutex::new(String::new()));
    let (_child, base) = HttpGateway::spawn(&link, "127.0.0.1:0", &[], log).await;
    let client = rebound_tests::http_client(&format!("{base}/mcp"), None).await.unwrap();
    assert!(until_offered(client.peer(), "echo", true).await);
    let second = json!({"mcpServers": {"a": faulty("a", dir.path(), &[]), "b": faulty("b", dir.path(), &[])}});
    rewrite_config(&dotfiles, &second);
    assert!(until_offered(client.peer(), "b__echo", true).await, "the edit was seen");
    // The link pointed elsewhere (`ln -sfn`): read, and edits there seen from then on.
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let servers = |names: &[&str]| {
        let servers: serde_json::Map<_, _> =
            names.iter().map(|n| (n.to_string(), faulty(n, dir.path(), &[]))).collect();
        json!({"mcpServers": servers})
    };
    std::fs::write(elsewhere.join("rebound.json"), serde_json::to_vec(&servers(&["a", "c"])).unwrap()).unwrap();
    std::os::unix::fs::symlink(elsewhere.join("rebound.json"), dir.path().join("link.new")).unwrap();
    std::fs::rename(dir.path().join("link.new"), &link).unwrap();
    assert!(until_offered(client.peer(), "c__echo", true).await, "the link's new target was read");
    rewrite_config(&elsewhere, &servers(&["a", "c", "d"]));
    assert!(until_offered(client.peer(), "d__echo", true).await, "an edit at the new target was seen");
    let _ = client.cancel().await;
}

/// A relaunch whose start takes longer than `init_timeout_ms` in all, each of its steps
/// within it (the handshake, then the first listing), is applied: the new process takes
/// over.
#[tokio::test]
async fn a_slow_relaunch_whose_every_step_is_in_time_takes_over() {
    let with_init = |mut config: Value| {
        config["rebound"]["init_timeout_ms"] = json!(3000);
        config
    };
    let gw = HttpGateway::start(|dir| with_init(config(dir, 60000, &[])), &[]).await;
    let dir = gw.dir.path().to_owned();
    let client = gw.client(None).await.unwrap();
    assert_eq!(text(&call(&client, "a__echo", json!({"message": "old"})).await), "a: old");
    let old = pid(&dir, "a");
    let mut slow = with_init(config(&dir, 60000, &[]));
    let args = ["--start-delay", "2000", "--list-delay", "2000"];
    slow["mcpServers"]["a"]["args"].as_array_mut().unwrap().extend(args.map(|a| json!(a)));
    rewrite_config(&dir, &slow);
    eventually("a relaunched", move || !alive(old)).await;
    assert!(!gw.log.lock().unwrap().contains("the new launch did not start"));
    assert_eq!(text(&call(&client, "a__echo", json!({"message": "new"})).await), "a: new");
    assert_ne!(pid(&dir, "a"), old);
    let _ = client.cancel().await;
}

/// `rebound.restart` applies to the servers started after the reload: one that keeps its
/// process keeps its own. After a reload that makes restarts slow, a crashed server that
/// kept its process comes back as fast as before.
#[tokio::test]
async fn restart_settings_apply_to_servers_started_after_the_reload() {
    let restarts = |mut config: Value, delay_ms: u64| {
        config["rebound"]["restart"] = json!({"initial_delay_ms": delay_ms, "max_delay_ms": delay_ms.max(30000)});
        config
    };
    let gw = HttpGateway::start(|dir| restarts(config(dir, 60000, &[]), 50), &[]).await;
    let dir = gw.dir.path().to_owned();
    let client = gw.client(None).await.unwrap();
    assert_eq!(text(&call(&client, "a__echo", json!({"message": "1"})).await), "a: 1");
    let old = pid(&dir, "a");
    rewrite_config(&dir, &restarts(config(&dir, 60000, &[]), 600_000));
    gw.logged("rebound.restart or init_timeout_ms changed: they apply to servers started from now on").await;
    // Applied (not only read): then a keeps its process, and crashes.
    gw.logged("configuration reloaded from").await;
    assert_eq!(pid(&dir, "a"), old, "a kept its process");
    call(&client, "a__crash", json!({})).await;
    eventually("a restarted with its own settings", move || pid(&dir, "a") != old).await;
    assert_eq!(text(&call(&client, "a__echo", json!({"message": "2"})).await), "a: 2");
    let _ = client.cancel().await;
}
