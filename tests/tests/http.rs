//! `rebound serve --http`: a real rmcp client over streamable HTTP, raw HTTP for what
//! clients should never get past (no token, a foreign Host or Origin, an oversized body,
//! too many requests at once), the operator endpoints, and HTTP upstreams whose session
//! expires under the gateway.

#![allow(deprecated)] // sampling and elicitation live in the revisions we speak

use std::time::Duration;

use rebound_tests::{Gateway, HttpGateway, eventually, faulty, http_client, memory_kib, text};
use reqwest::StatusCode;
use rmcp::RoleClient;
use rmcp::model::{CallToolRequestParams, CallToolResult, ProgressNotificationParam};
use rmcp::service::RunningService;
use serde_json::{Value, json};

const TOKEN: &str = "e2e-token-0123456789abcdef";
const OPERATOR: &str = "operator-token-0123456789";

async fn call(
    client: &RunningService<RoleClient, rebound_tests::TestClient>,
    tool: &str,
    args: Value,
) -> CallToolResult {
    let mut params = CallToolRequestParams::new(tool.to_owned());
    params.arguments = args.as_object().cloned();
    tokio::time::timeout(Duration::from_secs(60), client.peer().call_tool(params))
        .await
        .expect("answers in time")
        .unwrap_or_else(|e| panic!("{tool}: {e}"))
}

/// The first server's entry in `client`'s `rebound_status`.
async fn server_status(client: &RunningService<RoleClient, rebound_tests::TestClient>) -> Value {
    let status = call(client, "rebound_status", json!({})).await.structured_content.unwrap();
    status["servers"][0].clone()
}

/// The state of a server's shared breaker and of the client's own, in its status entry.
fn breakers(server: &Value) -> (Option<&str>, Option<&str>) {
    (server["breaker"]["state"].as_str(), server["own_breaker"]["state"].as_str())
}

/// A raw JSON-RPC POST to `/mcp`.
fn post(gw: &HttpGateway, body: &Value) -> reqwest::RequestBuilder {
    reqwest::Client::new()
        .post(gw.url())
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(body.to_string())
}

/// The `_meta` a raw MCP 2026-07-28 client sends with each request.
fn modern_meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
        "io.modelcontextprotocol/clientCapabilities": {},
    })
}

/// A raw 2026-07-28 client's `subscriptions/listen` (request `id`) following `resource`.
fn listen(gw: &HttpGateway, id: u32, resource: &str) -> reqwest::RequestBuilder {
    let listen = json!({"jsonrpc": "2.0", "id": id, "method": "subscriptions/listen", "params": {
        "notifications": {"resourceSubscriptions": [resource]}, "_meta": modern_meta()}});
    post(gw, &listen).header("mcp-protocol-version", "2026-07-28").header("mcp-method", "subscriptions/listen")
}

/// A raw 2026-07-28 client's `tools/call` (request `id`) of `tool`, its `params` with
/// `extra` added (a `_meta` of its own, a `requestState` sent back).
fn modern_call(gw: &HttpGateway, id: u64, tool: &str, extra: Value) -> reqwest::RequestBuilder {
    let mut params = json!({"name": tool, "arguments": {}, "_meta": modern_meta()});
    params.as_object_mut().unwrap().extend(extra.as_object().cloned().unwrap_or_default());
    let request = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params});
    post(gw, &request)
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", tool)
}

/// `GET /readyz`, with `token` as the bearer token: its status and its body.
async fn readyz(gw: &HttpGateway, token: Option<&str>) -> (StatusCode, Value) {
    let mut get = reqwest::Client::new().get(format!("{}/readyz", gw.base));
    if let Some(token) = token {
        get = get.bearer_auth(token);
    }
    let ready = get.send().await.expect("answered");
    (ready.status(), ready.json().await.expect("JSON"))
}

/// Polls `/readyz` as the operator until `until` holds of its status and body, each
/// answer first checked by `every`; the last answer.
async fn readyz_until(
    gw: &HttpGateway,
    mut every: impl FnMut(StatusCode, &Value),
    until: impl Fn(StatusCode, &Value) -> bool,
) -> Value {
    for _ in 0..200 {
        let (status, body) = readyz(gw, Some(OPERATOR)).await;
        every(status, &body);
        if until(status, &body) {
            return body;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("/readyz never got there: {:?}", readyz(gw, Some(OPERATOR)).await);
}

fn initialize() -> Value {
    json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}})
}

/// What a client's `initialize` says is kept for its session's life, so it is bounded by
/// what it weighs once read: capabilities of thousands of values are refused, and the
/// session is not kept.
#[tokio::test]
async fn an_initialize_too_heavy_to_keep_is_refused() {
    let gw = HttpGateway::start(|dir| json!({"mcpServers": {"a": faulty("a", dir, &[])}}), &[]).await;
    let mut heavy = initialize();
    heavy["params"]["capabilities"]["experimental"] = json!({"x": {"values": vec![0; 4000]}});
    let answer = post(&gw, &heavy).send().await.unwrap();
    let session = answer.headers().get("mcp-session-id").map(|s| s.to_str().unwrap().to_owned());
    let body = answer.text().await.unwrap();
    assert!(body.contains("past the 262144 the gateway keeps for a session"), "{body}");
    // The session the handshake began is not kept.
    if let Some(session) = session {
        let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
        let mut gone = false;
        for _ in 0..100 {
            let answer = post(&gw, &list).header("mcp-session-id", &session).send().await.unwrap();
            if answer.status() == StatusCode::NOT_FOUND {
                gone = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(gone, "the refused session still answers");
    }
    // One of an ordinary weight opens a session.
    let answer = post(&gw, &initialize()).send().await.unwrap();
    assert!(answer.headers().get("mcp-session-id").is_some(), "{answer:?}");
}

#[tokio::test]
async fn rust_sdk_client_over_http_gets_recovery_progress_and_server_requests() {
    let gw = HttpGateway::start(
        |dir| {
            let mut a = faulty("a", dir, &[]);
            a["recovery"] = json!({"retry": {"initial_delay_ms": 10}});
            json!({"mcpServers": {"a": a}, "rebound": {"http": {"auth_token": TOKEN}}})
        },
        &[],
    )
    .await;
    let client = gw.client(Some(TOKEN)).await.expect("connects with the token");
    let tools = client.peer().list_all_tools().await.unwrap();
    assert!(tools.iter().any(|t| t.name == "echo") && tools.iter().any(|t| t.name == "rebound_status"));
    assert_eq!(text(&call(&client, "echo", json!({"message": "hi"})).await), "a: hi");

    // Recovery works the same behind HTTP: every fifth `flaky` aborts and is retried.
    for i in 0..5 {
        let r = call(&client, "flaky", json!({"q": i.to_string()})).await;
        assert_ne!(r.is_error, Some(true), "{}", text(&r));
    }

    // Progress arrives, all of it, before the answer.
    let mut params = CallToolRequestParams::new("slow");
    params.arguments = json!({"ms": 200, "steps": 3}).as_object().cloned();
    let heard = {
        let handle = client
            .peer()
            .send_cancellable_request(
                rmcp::model::ClientRequest::CallToolRequest(rmcp::model::CallToolRequest::new(params)),
                rmcp::service::PeerRequestOptions::no_options(),
            )
            .await
            .unwrap();
        let token = handle.progress_token.clone();
        handle.await_response().await.unwrap();
        // rmcp hands each notification to the handler on a task of its own: wait for them.
        // (That they precede the answer on the wire, the Python SDK test and the
        // conformance suite check: both drop progress that comes after it.)
        let heard = client.service().heard.clone();
        let ours = move || -> Vec<f64> {
            let progress: Vec<ProgressNotificationParam> = heard.lock().unwrap().progress.clone();
            progress.into_iter().filter(|p| p.progress_token == token).map(|p| p.progress).collect()
        };
        let check = ours.clone();
        eventually("three progress notifications", move || check().len() == 3).await;
        let mut heard = ours();
        heard.sort_by(f64::total_cmp);
        heard
    };
    assert_eq!(heard, [1.0, 2.0, 3.0]);

    // Requests from the server reach this client over its HTTP session and come back.
    let sampled = call(&client, "sample", json!({"prompt": "over http"})).await;
    assert!(text(&sampled).contains("the client read") && text(&sampled).contains("over http"), "{}", text(&sampled));
    let elicited = call(&client, "elicit", json!({})).await;
    assert!(text(&elicited).contains("Ada"), "{}", text(&elicited));

    // Without the token, or with another one, the gateway does not speak MCP at all.
    assert!(gw.client(None).await.is_err());
    assert!(gw.client(Some("another-token-0123456789")).await.is_err());
    let _ = client.cancel().await;
}

/// One thread is the default on two cores (half the cores); more, on larger machines,
/// make a multi-threaded runtime: on either, a hung call holds up no other client.
#[tokio::test]
async fn on_one_worker_thread_every_client_is_still_served_at_once() {
    every_client_is_served_at_once_on(1).await;
}

#[tokio::test]
async fn on_several_worker_threads_every_client_is_still_served_at_once() {
    every_client_is_served_at_once_on(4).await;
}

async fn every_client_is_served_at_once_on(threads: usize) {
    let gw = HttpGateway::start(
        |dir| {
            let mut a = faulty("a", dir, &[]);
            a["recovery"] = json!({"timeout_ms": 60_000, "retry": {"max_attempts": 1}});
            json!({"mcpServers": {"a": a}, "rebound": {"http": {"worker_threads": threads}}})
        },
        &[],
    )
    .await;
    // One client's call hangs upstream; four others call while it does.
    let stuck = gw.client(None).await.expect("connects");
    let mut hang = CallToolRequestParams::new("hang");
    hang.arguments = json!({}).as_object().cloned();
    let hung = tokio::spawn(async move { stuck.peer().call_tool(hang).await });
    let mut others = Vec::new();
    for i in 0..4 {
        let client = gw.client(None).await.expect("connects");
        others.push(tokio::spawn(async move {
            let answer = text(&call(&client, "echo", json!({"message": format!("client {i}")})).await);
            let _ = client.cancel().await;
            answer
        }));
    }
    for (i, other) in others.into_iter().enumerate() {
        assert_eq!(other.await.unwrap(), format!("a: client {i}"));
    }
    assert!(!hung.is_finished(), "the hung call is still in flight (its timeout is a minute)");
    hung.abort();
    // And it was that many threads, as the log says at start.
    let log = gw.log.lock().unwrap().clone();
    assert!(log.contains(&format!("/mcp on {threads} thread(s)")), "{log}");
}

/// A body within `max_body_bytes` that would take hundreds of MiB once read (4 MiB of
/// `0,0,0…`, two million values) is refused before anything reads it, and counted; the
/// gateway goes on serving, and a body as long made of one string is read.
#[tokio::test]
async fn a_body_too_heavy_to_read_is_refused_unread() {
    let gw = HttpGateway::start(
        |dir| json!({"mcpServers": {"a": faulty("a", dir, &[])}, "rebound": {"http": {"auth_token": TOKEN}}}),
        &[],
    )
    .await;
    let zeros = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"echo","arguments":{{"a":[{}0]}}}}}}"#,
        "0,".repeat(2_090_000)
    );
    let heavy = reqwest::Client::new()
        .post(gw.url())
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(zeros)
        .send()
        .await
        .unwrap();
    assert_eq!(heavy.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let said = heavy.text().await.unwrap();
    assert!(said.contains("too many values") && said.contains("MiB once read"), "{said}");
    // As long in one string, it is read (and then answered as any initialize is).
    let mut long = initialize();
    long["params"]["padding"] = json!("0,".repeat(1_500_000));
    assert_eq!(post(&gw, &long).bearer_auth(TOKEN).send().await.unwrap().status(), StatusCode::OK);
    let metrics = reqwest::Client::new().get(format!("{}/metrics", gw.base)).bearer_auth(TOKEN).send().await;
    let metrics = metrics.unwrap().text().await.unwrap();
    assert!(metrics.contains(r#"reason="too_many_values"} 1"#), "{metrics}");
}

#[tokio::test]
async fn what_a_client_must_not_get_past() {
    let gw = HttpGateway::start(
        |dir| {
            json!({
                "mcpServers": {"a": faulty("a", dir, &[])},
                "rebound": {"http": {"auth_token": TOKEN, "max_body_bytes": 65536, "max_concurrent_per_client": 2}},
            })
        },
        &[],
    )
    .await;

    let refused = post(&gw, &initialize()).send().await.unwrap();
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    assert!(refused.headers()["www-authenticate"].to_str().unwrap().starts_with("Bearer"));
    let wrong = post(&gw, &initialize()).bearer_auth("not-it").send().await.unwrap();
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    // /metrics is for whoever holds the token too; /healthz is not.
    let metrics = reqwest::get(format!("{}/metrics", gw.base)).await.unwrap();
    assert_eq!(metrics.status(), StatusCode::UNAUTHORIZED);

    // DNS rebinding: a page on another domain, resolved to 127.0.0.1.
    let rebinding =
        post(&gw, &initialize()).bearer_auth(TOKEN).header("host", "evil.example.com").send().await.unwrap();
    assert_eq!(rebinding.status(), StatusCode::FORBIDDEN);
    let foreign =
        post(&gw, &initialize()).bearer_auth(TOKEN).header("origin", "http://evil.example.com").send().await.unwrap();
    assert_eq!(foreign.status(), StatusCode::FORBIDDEN);
    let local_page = post(&gw, &initialize()).bearer_auth(TOKEN).header("origin", "http://localhost:5173").send();
    let local_page = local_page.await.unwrap();
    assert_eq!(local_page.status(), StatusCode::OK);
    assert_eq!(local_page.headers()["access-control-allow-origin"], "http://localhost:5173");
    // A page's preflight is answered without the token (it cannot carry one).
    let preflight = reqwest::Client::new()
        .request(reqwest::Method::OPTIONS, gw.url())
        .header("origin", "http://localhost:5173")
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", "authorization, content-type, mcp-session-id")
        .send()
        .await
        .unwrap();
    assert!(preflight.status().is_success(), "{}", preflight.status());
    let allowed = preflight.headers()["access-control-allow-headers"].to_str().unwrap().to_owned();
    assert!(allowed.contains("authorization") && allowed.contains("mcp-session-id"), "{allowed}");

    // A body past the limit is refused.
    let mut big = initialize();
    big["params"]["padding"] = json!("x".repeat(100_000));
    assert_eq!(post(&gw, &big).bearer_auth(TOKEN).send().await.unwrap().status(), StatusCode::PAYLOAD_TOO_LARGE);

    // Two requests at once per client; the third is told to wait.
    let init = post(&gw, &initialize()).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(init.status(), StatusCode::OK);
    let session = init.headers()["mcp-session-id"].to_str().unwrap().to_owned();
    drop(init);
    let in_session = |body: Value| {
        post(&gw, &body)
            .bearer_auth(TOKEN)
            .header("mcp-session-id", &session)
            .header("mcp-protocol-version", "2025-11-25")
    };
    let initialized = in_session(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).send().await;
    assert_eq!(initialized.unwrap().status(), StatusCode::ACCEPTED);
    let slow = |id: u32| {
        in_session(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "slow", "arguments": {"ms": 1500}}}))
            .send()
    };
    let (first, second) = tokio::join!(slow(1), slow(2));
    let (first, second) = (first.unwrap(), second.unwrap());
    assert_eq!((first.status(), second.status()), (StatusCode::OK, StatusCode::OK));
    // Both answers are still streaming: their permits are held.
    let third = slow(3).await.unwrap();
    assert_eq!(third.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(third.headers()["retry-after"], "1");
    // What is not a request (an answer, a notification) always gets through: a client at
    // its limit can still cancel, or answer the server.
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 99}});
    assert_eq!(in_session(cancel).send().await.unwrap().status(), StatusCode::ACCEPTED);
    let (a, b) = (first.text().await.unwrap(), second.text().await.unwrap());
    assert!(a.contains("slept 1500 ms") && b.contains("slept 1500 ms"), "{a}\n{b}");
    // Finished answers give the permits back.
    let fourth = slow(4).await.unwrap();
    assert_eq!(fourth.status(), StatusCode::OK);
    assert!(fourth.text().await.unwrap().contains("slept 1500 ms"));

    // A client on 2026-07-28 has no session, and counts by its address: naming a session
    // of its own making does not make each request a new client.
    let modern = |id: u32| {
        let call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "slow", "arguments": {"ms": 1500}, "_meta": modern_meta()}});
        post(&gw, &call)
            .bearer_auth(TOKEN)
            .header("mcp-session-id", format!("made-up-{id}"))
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "tools/call")
            .header("mcp-name", "slow")
            .send()
    };
    let slow_calls = || gw.state("a", "calls").iter().filter(|t| *t == "slow").count();
    let before = slow_calls();
    let (first, second, third) = tokio::join!(modern(11), modern(12), async {
        eventually("two calls in flight", || slow_calls() == before + 2).await;
        modern(13).await
    });
    let statuses = [first.unwrap(), second.unwrap(), third.unwrap()].map(|r| r.status());
    assert_eq!(statuses, [StatusCode::OK, StatusCode::OK, StatusCode::TOO_MANY_REQUESTS]);

    // What is not a JSON-RPC message gets the protocol's error, as JSON, with the id when
    // the request has one.
    for (body, code, id) in [
        ("not json".to_owned(), -32700, Value::Null),
        (r#"{"jsonrpc":"2.0","id":3,"method":"tools/list""#.to_owned(), -32700, Value::Null),
        ("[".repeat(10_000), -32700, Value::Null),
        ("42".to_owned(), -32600, Value::Null),
        (r#"[{"jsonrpc":"2.0","id":4,"method":"ping"}]"#.to_owned(), -32600, Value::Null),
        (r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":"not an object"}"#.to_owned(), -32600, json!(6)),
    ] {
        let response = post(&gw, &json!(null))
            .body(body.clone())
            .bearer_auth(TOKEN)
            .header("mcp-session-id", &session)
            .header("mcp-protocol-version", "2025-11-25")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{}", &body[..body.len().min(40)]);
        assert_eq!(response.headers()["content-type"], "application/json");
        let error: Value = response.json().await.unwrap();
        assert_eq!((&error["error"]["code"], &error["id"]), (&json!(code), &id), "{error}");
    }

    // A second request with an id still in flight is refused at once, as JSON-RPC, and
    // the first is answered as usual.
    let before = slow_calls();
    let (first, again) = tokio::join!(slow(5), async {
        eventually("the first in flight", || slow_calls() == before + 1).await;
        slow(5).await
    });
    let again = again.unwrap();
    assert_eq!(again.headers()["content-type"], "application/json");
    let refused: Value = again.json().await.unwrap();
    assert_eq!((refused["id"].as_u64(), refused["error"]["code"].as_i64()), (Some(5), Some(-32600)), "{refused}");
    assert!(first.unwrap().text().await.unwrap().contains("slept 1500 ms"));
    // Once answered, the id may be used again.
    assert!(slow(5).await.unwrap().text().await.unwrap().contains("slept 1500 ms"));
}

/// Over HTTP a shared server's log line goes only to the client it may tell of: the one
/// whose calls alone are in flight there; with another client's call in flight too, to
/// neither (nor, for a moment, with one answered during hers: `routing.rs`); a call made
/// after another's answer is not held back. A session's own instance's lines reach its
/// own client.
#[tokio::test]
async fn over_http_a_shared_servers_log_reaches_only_the_client_it_concerns() {
    let gw = HttpGateway::start(
        |dir| {
            let mut own = faulty("s", dir, &[]);
            own["scope"] = json!("session");
            json!({"mcpServers": {"a": faulty("a", dir, &[]), "s": own}})
        },
        &[],
    )
    .await;
    let connect = || async {
        let client = rebound_tests::TestClient::default();
        let heard = client.heard.clone();
        (rebound_tests::http_client_as(client, &gw.url(), None).await.unwrap(), heard)
    };
    let ((alice, alice_heard), (bob, bob_heard)) = (connect().await, connect().await);
    for client in [&alice, &bob] {
        let debug = rmcp::model::SetLevelRequestParams::new(rmcp::model::LoggingLevel::Debug);
        client.peer().set_level(debug).await.unwrap();
    }
    let said = |heard: &std::sync::Arc<std::sync::Mutex<rebound_tests::Heard>>, what: &str| {
        heard.lock().unwrap().logs.iter().any(|l| l.data.to_string().contains(what))
    };
    call(&alice, "a__log", json!({"level": "warning", "message": "reading /home/alice/plan.txt"})).await;
    let heard = alice_heard.clone();
    eventually("her call's log line", move || said(&heard, "plan.txt")).await;
    // With Bob's call in flight on the same server, a line could be his or hers: neither.
    let (_, ()) = tokio::join!(call(&bob, "a__slow", json!({"ms": 4000})), async {
        eventually("his call in flight", || gw.state("a", "calls").contains(&"slow".to_owned())).await;
        call(&alice, "a__log", json!({"level": "warning", "message": "reading /home/alice/diary.txt"})).await;
    });
    // A call of hers made after his was answered is hers: its line is shown to her.
    call(&alice, "a__log", json!({"level": "warning", "message": "reading /home/alice/after.txt"})).await;
    call(&alice, "s__log", json!({"level": "warning", "message": "alice's own"})).await;
    let heard = alice_heard.clone();
    eventually("her own instance's line", move || said(&heard, "alice's own")).await;
    assert!(!said(&alice_heard, "diary.txt") && !said(&bob_heard, "diary.txt"), "a line of either's");
    let heard = alice_heard.clone();
    eventually("her line after his answer", move || said(&heard, "after.txt")).await;
    assert!(!said(&bob_heard, "after.txt"), "hers, to him");
    assert!(!said(&bob_heard, "plan.txt") && !said(&bob_heard, "alice's own"), "hers, to him");
    // A client that set no level is sent no shared server's line (the server's level is
    // another client's choice).
    let (carol, carol_heard) = connect().await;
    call(&carol, "a__log", json!({"level": "warning", "message": "carol's line"})).await;
    call(&alice, "s__log", json!({"level": "warning", "message": "after carol's"})).await;
    let heard = alice_heard.clone();
    eventually("a later line", move || said(&heard, "after carol's")).await;
    assert!(!said(&carol_heard, "carol's line"));
    let _ = carol.cancel().await;
    let _ = (alice.cancel().await, bob.cancel().await);
}

/// Over HTTP a shared server logs at the most verbose level any open session has asked
/// for: a client that sets levels again and again, or alternates two, has the gateway
/// set the shared server's level once (and once more where the server refused it), and
/// hears only what its own level lets through.
#[tokio::test]
async fn over_http_a_clients_changing_levels_set_a_shared_servers_once() {
    use rmcp::model::LoggingLevel::{Debug, Error};
    let gw =
        HttpGateway::start(|dir| json!({"mcpServers": {"a": faulty("a", dir, &["--refuse-first-level"])}}), &[]).await;
    let client = rebound_tests::TestClient::default();
    let heard = client.heard.clone();
    let alice = rebound_tests::http_client_as(client, &gw.url(), None).await.unwrap();
    // The server ready, and its readiness handled (which asks it for any level a session
    // set: here none yet) before the levels are set, so that only they ask.
    call(&alice, "echo", json!({"message": "up"})).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    for level in [Debug, Error, Debug, Error, Error, Debug, Error] {
        alice.peer().set_level(rmcp::model::SetLevelRequestParams::new(level)).await.unwrap();
    }
    eventually("the level set upstream", || !gw.state("a", "levels").is_empty()).await;
    // Refused the first time (the server's `--refuse-first-level`), asked again once.
    assert_eq!(gw.state("a", "levels"), ["debug", "debug"]);
    let said = |what: &str| heard.lock().unwrap().logs.iter().any(|l| l.data.to_string().contains(what));
    call(&alice, "log", json!({"level": "warning", "message": "a quiet line"})).await;
    call(&alice, "log", json!({"level": "error", "message": "a loud line"})).await;
    eventually("the line her level takes", || said("a loud line")).await;
    assert!(!said("a quiet line"), "below the level she set last");
    let _ = alice.cancel().await;
}

/// The gateway's own tokens stay out of its servers' environment, and the gateway's own
/// environment out of their reach (`/proc`): a tool that shows either (a shell, a code
/// runner) would give any client the operator's token. The rest of the environment is
/// inherited as before, and a server's own `env` is its own.
#[tokio::test]
async fn no_server_process_inherits_the_gateways_tokens() {
    let gw = HttpGateway::start_unprivileged(
        |dir| {
            // Its own environment, and what it can read of the gateway's.
            let script = r#"env > "$1"; tr '\0' '\n' < /proc/$PPID/environ > "$1.gateway"; shift; exec "$@""#;
            let mut server = rebound_tests::after_script(script, &dir.join("env.txt"), &faulty("a", dir, &[]));
            server["env"] = json!({"OWN": "its own"});
            // Another server's credential, which the file reads for it alone.
            let mut other = faulty("b", dir, &[]);
            other["env"] = json!({"GH_TOKEN": "${GITHUB_TOKEN}"});
            let http = json!({"auth_token": "${CLIENTS_TOKEN}"});
            json!({"mcpServers": {"a": server, "b": other}, "rebound": {"http": http}})
        },
        &[
            ("CLIENTS_TOKEN", TOKEN),
            ("REBOUND_OPERATOR_TOKEN", OPERATOR),
            ("GITHUB_TOKEN", "ghp-0123456789abcdef"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "authorization=otel-backend-key"),
            ("KEPT", "inherited"),
        ],
    )
    .await;
    let path = gw.dir.path().join("env.txt");
    eventually("the server started", || std::fs::read_to_string(&path).is_ok_and(|env| env.contains("OWN="))).await;
    let env = std::fs::read_to_string(&path).unwrap();
    assert!(env.contains("KEPT=inherited") && env.contains("OWN=its own"), "{env}");
    let gateways = std::fs::read_to_string(gw.dir.path().join("env.txt.gateway")).unwrap_or_default();
    assert!(!env.contains("ghp-0123456789abcdef"), "another server's credential: {env}");
    assert!(!env.contains("otel-backend-key"), "the telemetry exporter's headers: {env}");
    for withheld in ["CLIENTS_TOKEN", "REBOUND_OPERATOR_TOKEN", TOKEN, OPERATOR] {
        assert!(!env.contains(withheld), "{withheld} in the server's environment");
        assert!(!gateways.contains(withheld), "{withheld} read from the gateway's environment");
    }
}

/// With an operator token, what every client did (`/status`, `/metrics`) is the
/// operator's: the clients' token no longer opens it, nor does the operator's open `/mcp`.
#[tokio::test]
async fn an_operator_token_keeps_every_clients_errors_from_the_clients() {
    let gw = HttpGateway::start(
        |dir| {
            json!({
                "mcpServers": {"a": faulty("a", dir, &[])},
                "rebound": {"http": {"auth_token": TOKEN, "operator_token": OPERATOR}},
            })
        },
        &[],
    )
    .await;
    let client = gw.client(Some(TOKEN)).await.unwrap();
    call(&client, "fail", json!({"message": "alice's private error"})).await;
    let get =
        |path: &str, token: &str| reqwest::Client::new().get(format!("{}{path}", gw.base)).bearer_auth(token).send();
    for path in ["/status", "/metrics"] {
        let refused = get(path, TOKEN).await.unwrap();
        assert_eq!(refused.status(), StatusCode::UNAUTHORIZED, "{path}");
        assert!(refused.text().await.unwrap().contains("REBOUND_OPERATOR_TOKEN"));
        assert_eq!(get(path, OPERATOR).await.unwrap().status(), StatusCode::OK, "{path}");
    }
    let status: Value = get("/status", OPERATOR).await.unwrap().json().await.unwrap();
    assert!(status["recent_errors"].to_string().contains("alice's private error"), "{status}");
    assert!(gw.client(Some(OPERATOR)).await.is_err(), "the operator's token is not a client's");
    let _ = client.cancel().await;
}

/// A shared server's breakers are every client's: a client cannot close them (it would
/// send everyone's calls at a server still recovering); the operator can.
#[tokio::test]
async fn only_the_operator_resets_a_shared_servers_breakers() {
    let gw = HttpGateway::start(
        |dir| {
            let mut a = faulty("a", dir, &[]);
            a["recovery"] = json!({"tools": {"outage": {"timeout_ms": 100}}, "retry": {"max_attempts": 1}, "breaker": {"failure_threshold": 2}});
            json!({
                "mcpServers": {"a": a},
                "rebound": {"http": {"auth_token": TOKEN, "operator_token": OPERATOR}},
            })
        },
        &[],
    )
    .await;
    std::fs::create_dir_all(gw.dir.path().join("a")).unwrap();
    std::fs::write(gw.dir.path().join("a/outage"), "").unwrap();
    let client = gw.client(Some(TOKEN)).await.unwrap();
    // Two clients' failures: one client's alone would open only breakers of its own.
    let other = gw.client(Some(TOKEN)).await.unwrap();
    for _ in 0..2 {
        call(&client, "outage", json!({})).await;
        call(&other, "outage", json!({})).await;
    }
    let breaker = |status: CallToolResult| status.structured_content.unwrap()["servers"][0]["breaker"]["state"].clone();
    assert_eq!(breaker(call(&client, "rebound_status", json!({})).await), "open");
    let refused = call(&client, "rebound_reset_breaker", json!({"server": "a"})).await;
    assert_eq!(refused.is_error, Some(true));
    assert!(text(&refused).contains("shared by every client of this gateway"), "{}", text(&refused));
    assert_eq!(breaker(call(&client, "rebound_status", json!({})).await), "open");
    let post = |query: &str, token: &str| {
        reqwest::Client::new().post(format!("{}/reset-breaker?{query}", gw.base)).bearer_auth(token).send()
    };
    assert_eq!(post("server=a", TOKEN).await.unwrap().status(), StatusCode::UNAUTHORIZED);
    let unknown = post("server=zz", OPERATOR).await.unwrap();
    assert_eq!(unknown.status(), StatusCode::NOT_FOUND);
    assert!(unknown.text().await.unwrap().contains("the servers are: a"));
    let reset = post("server=a", OPERATOR).await.unwrap();
    assert_eq!(reset.status(), StatusCode::OK);
    let said: Value = reset.json().await.unwrap();
    assert_eq!(said["reset"], "the circuit breaker of `a` is closed, and those of its tools");
    assert_eq!(breaker(call(&client, "rebound_status", json!({})).await), "closed");
    let _ = client.cancel().await;
}

/// One client whose calls fail as an outage (its arguments make the tool hang, say) is
/// shed alone, by breakers of its own; the other clients' calls go on. A shared breaker
/// opens on failures of two clients.
#[tokio::test]
async fn one_clients_failures_shed_its_own_calls_alone() {
    let gw = HttpGateway::start(
        |dir| {
            let mut a = faulty("a", dir, &[]);
            a["recovery"] = json!({"tools": {"outage": {"timeout_ms": 100}}, "retry": {"max_attempts": 1}, "breaker": {"failure_threshold": 2}});
            json!({"mcpServers": {"a": a}})
        },
        &[],
    )
    .await;
    std::fs::create_dir_all(gw.dir.path().join("a")).unwrap();
    std::fs::write(gw.dir.path().join("a/outage"), "").unwrap();
    let (alice, bob, carol) =
        (gw.client(None).await.unwrap(), gw.client(None).await.unwrap(), gw.client(None).await.unwrap());
    call(&alice, "outage", json!({})).await;
    call(&alice, "outage", json!({})).await;
    let shed = call(&alice, "outage", json!({})).await;
    assert_eq!(shed.is_error, Some(true));
    assert!(text(&shed).contains("this client's calls to the server failed repeatedly"), "{}", text(&shed));
    let of_alice = server_status(&alice).await;
    assert_eq!(breakers(&of_alice), (Some("closed"), Some("open")), "{of_alice}");
    assert_eq!(of_alice["own_tool_breakers"]["outage"]["state"], "open", "{of_alice}");
    assert_eq!(text(&call(&bob, "echo", json!({"message": "m"})).await), "a: m");
    let of_bob = server_status(&bob).await;
    assert!(of_bob.get("own_breaker").is_none() && of_bob.get("own_tool_breakers").is_none(), "{of_bob}");
    // The operator sees how many clients are shed so, in the status and the metrics.
    let doc: Value = reqwest::get(format!("{}/status", gw.base)).await.unwrap().json().await.unwrap();
    assert_eq!(doc["servers"][0]["clients_shed"], 1, "{doc}");
    let metrics = reqwest::get(format!("{}/metrics", gw.base)).await.unwrap().text().await.unwrap();
    assert!(metrics.lines().any(|l| l == r#"rebound_clients_shed{server="a"} 1"#), "{metrics}");
    // Bob's failure and Carol's: two failures of the tool without Alice's, the client that
    // failed most. It is shed for everyone (the server's other tool answered, so the
    // tool's breaker).
    call(&bob, "outage", json!({})).await;
    call(&carol, "outage", json!({})).await;
    let of_bob = server_status(&bob).await;
    assert_eq!(of_bob["tool_breakers"]["outage"]["state"], "open", "{of_bob}");
    let shed = call(&bob, "outage", json!({})).await;
    assert!(text(&shed).contains("the circuit breaker of tool `outage` is open"), "{}", text(&shed));
    // The operator sees the tool's breaker open in the metrics, and closes it alone.
    let metrics = || async { reqwest::get(format!("{}/metrics", gw.base)).await.unwrap().text().await.unwrap() };
    let text_now = metrics().await;
    assert!(text_now.lines().any(|l| l == r#"rebound_tool_breaker_state{server="a",tool="outage"} 2"#), "{text_now}");
    let reset = |query: &str| reqwest::Client::new().post(format!("{}/reset-breaker?{query}", gw.base)).send();
    let closed = reset("server=a&tool=outage").await.unwrap();
    assert_eq!(closed.status(), StatusCode::OK);
    assert_eq!(closed.json::<Value>().await.unwrap()["reset"], "the circuit breaker of `outage` on `a` is closed");
    let text_now = metrics().await;
    assert!(!text_now.contains(r#"rebound_tool_breaker_state{server="a",tool="outage"}"#), "{text_now}");
    let of_bob = server_status(&bob).await;
    assert!(of_bob.pointer("/tool_breakers/outage").is_none(), "a closed and clean breaker is not listed: {of_bob}");
    let never_called = reset("server=a&tool=slow").await.unwrap();
    assert_eq!(never_called.status(), StatusCode::NOT_FOUND);
    let said = never_called.text().await.unwrap();
    assert!(said.contains("`slow` on `a` has no circuit breaker yet"), "{said}");
    assert_eq!(reset("tool=outage").await.unwrap().status(), StatusCode::BAD_REQUEST, "no server named");
    let _ = (alice.cancel().await, bob.cancel().await, carol.cancel().await);
}

/// A client whose calls crash a shared server takes the others' calls in flight down with
/// its own. Each crash is one failure, blamed on every client that lost a call in it: a
/// client in every crash is shed by its own breaker, and the shared breaker, which does
/// without the client that failed most, stays closed for a client that never failed.
#[tokio::test]
async fn the_calls_a_crash_takes_down_open_no_breaker_the_others_share() {
    let gw = HttpGateway::start(
        |dir| {
            let mut a = faulty("a", dir, &[]);
            a["recovery"] = json!({"retry": {"max_attempts": 1}, "breaker": {"failure_threshold": 2}});
            json!({"mcpServers": {"a": a}, "rebound": {"restart": {"initial_delay_ms": 10}}})
        },
        &[],
    )
    .await;
    let (alice, bob, carol) =
        (gw.client(None).await.unwrap(), gw.client(None).await.unwrap(), gw.client(None).await.unwrap());
    let hangs = || {
        let calls = std::fs::read_to_string(gw.dir.path().join("a/calls")).unwrap_or_default();
        calls.lines().filter(|l| *l == "hang").count()
    };
    for crash in 1..=2 {
        // Bob's call is in flight on the server when Alice's crashes it.
        let peer = bob.peer().clone();
        let hung = tokio::spawn(async move { peer.call_tool(CallToolRequestParams::new("hang")).await });
        eventually("bob's call reached the server", || hangs() == crash).await;
        let crashed = call(&alice, "crash", json!({})).await;
        assert_eq!(crashed.is_error, Some(true), "{}", text(&crashed));
        let lost = tokio::time::timeout(Duration::from_secs(30), hung).await.unwrap().unwrap().unwrap();
        assert!(text(&lost).contains("connection lost"), "{}", text(&lost));
    }
    let of_alice = server_status(&alice).await;
    assert_eq!(breakers(&of_alice), (Some("closed"), Some("open")), "{of_alice}");
    assert_eq!(text(&call(&carol, "echo", json!({"message": "m"})).await), "a: m");
    // Bob lost a call in every crash as well: by what the gateway sees, he cannot be told
    // from Alice, and is shed with her by his own breaker.
    let of_bob = server_status(&bob).await;
    assert_eq!(of_bob["own_breaker"]["state"], "open", "{of_bob}");
    let _ = (alice.cancel().await, bob.cancel().await, carol.cancel().await);
}

/// A client's `rebound_status` shows a `scope: session` server as its own instance of it:
/// its breaker and its counters, nothing of how the other sessions' instances fare, and
/// over HTTP not where the gateway writes its errors log. The operator sees them all.
#[tokio::test]
async fn a_clients_status_shows_its_own_instance_of_a_session_server_only() {
    let gw = HttpGateway::start(
        |dir| {
            let mut a = faulty("a", dir, &[]);
            a["scope"] = json!("session");
            a["recovery"] = json!({"tools": {"outage": {"timeout_ms": 100}}, "retry": {"max_attempts": 1}, "breaker": {"failure_threshold": 2}});
            json!({"mcpServers": {"a": a}, "rebound": {"errors_log": dir.join("errors.jsonl")}})
        },
        &[],
    )
    .await;
    std::fs::create_dir_all(gw.dir.path().join("a")).unwrap();
    std::fs::write(gw.dir.path().join("a/outage"), "").unwrap();
    let (alice, bob) = (gw.client(None).await.unwrap(), gw.client(None).await.unwrap());
    call(&alice, "outage", json!({})).await;
    call(&alice, "outage", json!({})).await;
    call(&bob, "echo", json!({"message": "m"})).await;
    let status = |client| async move { call(client, "rebound_status", json!({})).await.structured_content.unwrap() };
    let (of_alice, of_bob) = (status(&alice).await, status(&bob).await);
    let a = |doc: &Value| doc["servers"][0].clone();
    for (doc, breaker, calls) in [(&of_alice, "open", 2), (&of_bob, "closed", 1)] {
        let a = a(doc);
        assert_eq!(
            (
                a["scope"].as_str(),
                a["status"].as_str(),
                a["breaker"]["state"].as_str(),
                a["counters"]["calls"].as_u64()
            ),
            (Some("session"), Some("ready"), Some(breaker), Some(calls)),
            "{a}"
        );
        assert!(a.get("instances").is_none(), "{a}");
        assert!(doc["gateway"].get("errors_log").is_none(), "{doc}");
        assert!(!doc.to_string().contains("errors.jsonl"), "{doc}");
    }
    let doc: Value = reqwest::get(format!("{}/status", gw.base)).await.unwrap().json().await.unwrap();
    let every = &doc["servers"][0];
    assert_eq!((every["instances"].as_u64(), every["counters"]["calls"].as_u64()), (Some(2), Some(3)), "{every}");
    assert!(doc["gateway"]["errors_log"].as_str().is_some_and(|p| p.ends_with("errors.jsonl")), "{doc}");
    // Its breakers are each session's: the operator has none of them to reset.
    for query in ["server=a", "server=a&tool=outage"] {
        let refused = reqwest::Client::new().post(format!("{}/reset-breaker?{query}", gw.base)).send().await.unwrap();
        assert_eq!(refused.status(), StatusCode::CONFLICT, "{query}");
        let said = refused.text().await.unwrap();
        assert!(said.contains("an instance per client session"), "{said}");
    }
    let _ = (alice.cancel().await, bob.cancel().await);
}

#[tokio::test]
async fn health_readiness_and_metrics() {
    let gw = HttpGateway::start(
        |dir| {
            json!({
                "mcpServers": {
                    "a": faulty("a", dir, &[]),
                    "missing": {"command": "/nonexistent/mcp-server"},
                },
                "rebound": {"restart": {"initial_delay_ms": 50}},
            })
        },
        &[],
    )
    .await;
    let health = reqwest::get(format!("{}/healthz", gw.base)).await.unwrap();
    assert_eq!(health.status(), StatusCode::OK);
    // Ready once the good server is up (it starts in parallel with the gateway's
    // listener) and the one that cannot start has been given up on: the gateway serves
    // what it has and says which server it is without.
    let mut body = Value::Null;
    for _ in 0..100 {
        let ready = reqwest::get(format!("{}/readyz", gw.base)).await.unwrap();
        let status = ready.status();
        body = ready.json().await.unwrap();
        if status == StatusCode::OK {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(body["ready"], true, "{body}");
    assert_eq!((body["servers"].as_u64(), body["servers_ready"].as_u64()), (Some(2), Some(1)), "{body}");
    assert_eq!(body["given_up"][0]["server"], "missing", "{body}");
    assert!(body["given_up"][0]["last_error"].as_str().unwrap().contains("nonexistent"), "{body}");
    // A cluster's probe names the pod's address as its Host: the probes answer it, and
    // /readyz names no server to a Host not allowed (a page rebinding its name to us).
    let probe = |path: &str| reqwest::Client::new().get(format!("{}{path}", gw.base)).header("host", "10.1.2.3:8080");
    assert_eq!(probe("/healthz").send().await.unwrap().status(), StatusCode::OK);
    let ready = probe("/readyz").send().await.unwrap();
    assert_eq!(ready.status(), StatusCode::OK);
    let probed: Value = ready.json().await.unwrap();
    assert_eq!((probed["servers_given_up"].as_u64(), probed.get("given_up")), (Some(1), None), "{probed}");
    assert_eq!(probe("/metrics").send().await.unwrap().status(), StatusCode::FORBIDDEN);

    let client = gw.client(None).await.unwrap();
    call(&client, "echo", json!({"message": "m"})).await;
    call(&client, "fail", json!({"message": "no"})).await;
    let malformed = post(&gw, &json!(null)).body("not json").send().await.unwrap();
    assert_eq!(malformed.status(), StatusCode::BAD_REQUEST);
    let metrics = reqwest::get(format!("{}/metrics", gw.base)).await.unwrap();
    assert_eq!(metrics.status(), StatusCode::OK);
    assert!(metrics.headers()["content-type"].to_str().unwrap().starts_with("application/openmetrics-text"));
    let text = metrics.text().await.unwrap();
    for line in [
        r#"rebound_calls_total{server="a",tool="echo",outcome="ok"} 1"#,
        r#"rebound_calls_total{server="a",tool="fail",outcome="tool_error"} 1"#,
        r#"rebound_attempt_failures_total{server="a",category="tool-execution"} 1"#,
        r#"rebound_call_duration_seconds_count{server="a"} 2"#,
        r#"rebound_breaker_state{server="a"} 0"#,
        r#"rebound_server_status{server="a",status="ready"} 1"#,
        r#"rebound_server_status{server="missing",status="ready"} 0"#,
        // Every series the README documents, under the names and labels it gives.
        r#"rebound_attempts_total{server="a"} 2"#,
        r#"rebound_retries_total{server="a"} 0"#,
        r#"rebound_fallbacks_total{server="a"} 0"#,
        r#"rebound_recovered_calls_total{server="a"} 0"#,
        r#"rebound_shed_by_breaker_total{server="a"} 0"#,
        r#"rebound_upstream_failures_total{server="a"} 1"#,
        r#"rebound_http_rejected_total{reason="malformed"} 1"#,
        "rebound_errors_log_dropped_total 0",
        "# EOF",
    ] {
        assert!(text.lines().any(|l| l == line), "no `{line}` in:\n{text}");
    }
    let _ = client.cancel().await;
}

/// An errors log the gateway cannot write (its folder is a file) loses its entries,
/// counted in the metrics and the operator's status; the call is answered all the same.
#[tokio::test]
async fn entries_the_errors_log_cannot_write_are_counted_as_dropped() {
    let gw = HttpGateway::start(
        |dir| {
            std::fs::write(dir.join("a-file"), "").unwrap();
            let mut a = faulty("a", dir, &[]);
            a["recovery"] = json!({"retry": {"max_attempts": 1}});
            json!({"mcpServers": {"a": a}, "rebound": {"errors_log": dir.join("a-file/errors.jsonl")}})
        },
        &[],
    )
    .await;
    let client = gw.client(None).await.unwrap();
    for _ in 0..2 {
        let failed = call(&client, "fail", json!({"message": "no"})).await;
        assert_eq!(failed.is_error, Some(true));
    }
    let mut metrics = String::new();
    for _ in 0..200 {
        metrics = reqwest::get(format!("{}/metrics", gw.base)).await.unwrap().text().await.unwrap();
        if metrics.lines().any(|l| l == "rebound_errors_log_dropped_total 2") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(metrics.lines().any(|l| l == "rebound_errors_log_dropped_total 2"), "{metrics}");
    let doc: Value = reqwest::get(format!("{}/status", gw.base)).await.unwrap().json().await.unwrap();
    assert_eq!(doc["gateway"]["errors_dropped"], 2, "{doc}");
    gw.logged("cannot write the errors log").await;
    let _ = client.cancel().await;
}

/// Ready once every server's first start is over (up, or given up on): a server that
/// crashes later does not take readiness away (the gateway serves the others, and its
/// calls get a clear error). Which servers it is waiting for or without, only the
/// operator is told.
#[tokio::test]
async fn readiness_waits_for_first_starts_alone_and_names_servers_to_the_operator() {
    let gw = HttpGateway::start(
        |dir| {
            let gate = dir.join("a-may-start");
            let mut a = faulty("a", dir, &["--start-gate", gate.to_str().unwrap()]);
            a["recovery"] = json!({"retry": {"max_attempts": 1}});
            json!({
                "mcpServers": {"a": a, "missing": {"command": "/nonexistent/mcp-server"}},
                "rebound": {"restart": {"initial_delay_ms": 50}, "http": {"auth_token": TOKEN, "operator_token": OPERATOR}},
            })
        },
        &[],
    )
    .await;
    let gate = gw.dir.path().join("a-may-start");
    let (status, body) = readyz(&gw, Some(OPERATOR)).await;
    assert_eq!((status, body["ready"].as_bool()), (StatusCode::SERVICE_UNAVAILABLE, Some(false)), "{body}");
    assert!(body["starting"].as_array().unwrap().contains(&json!("a")), "{body}");
    // Neither an anonymous probe nor a client is told which servers there are.
    for token in [None, Some(TOKEN)] {
        let (status, body) = readyz(&gw, token).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.get("starting").is_none() && body.get("given_up").is_none(), "{token:?}: {body}");
        assert!(body["servers_starting"].as_u64() >= Some(1), "{body}");
    }
    std::fs::write(&gate, "").unwrap();
    let body = readyz_until(&gw, |_, _| {}, |status, _| status == StatusCode::OK).await;
    assert_eq!((body["servers_ready"].as_u64(), body["servers_given_up"].as_u64()), (Some(1), Some(1)), "{body}");
    assert_eq!(body["given_up"][0]["server"], "missing", "{body}");
    assert!(body["given_up"][0]["last_error"].as_str().unwrap().contains("nonexistent"), "{body}");
    for token in [None, Some(TOKEN)] {
        let (status, body) = readyz(&gw, token).await;
        assert_eq!((status, body["servers_given_up"].as_u64()), (StatusCode::OK, Some(1)), "{body}");
        assert!(body.get("given_up").is_none(), "{token:?}: {body}");
    }
    // `a` crashes, and its restart waits at the gate: ready all along, `a` named as one
    // the gateway is without, until it is back.
    std::fs::remove_file(&gate).unwrap();
    let client = gw.client(Some(TOKEN)).await.unwrap();
    assert_eq!(call(&client, "crash", json!({})).await.is_error, Some(true));
    let always_ready = |status: StatusCode, body: &Value| assert_eq!(status, StatusCode::OK, "{body}");
    let without_a = |_: StatusCode, body: &Value| body["given_up"].to_string().contains(r#""server":"a""#);
    let body = readyz_until(&gw, always_ready, without_a).await;
    assert_eq!(body["servers_ready"], 0, "{body}");
    std::fs::write(&gate, "").unwrap();
    let back = |_: StatusCode, body: &Value| body["servers_ready"] == 1;
    let body = readyz_until(&gw, always_ready, back).await;
    assert_eq!(body["given_up"].as_array().map(Vec::len), Some(1), "only `missing`: {body}");
    let _ = client.cancel().await;
}

#[tokio::test]
async fn secrets_from_the_config_never_leave_the_gateway() {
    const SECRET: &str = "sk-live-do-not-print-4242";
    const TOOL_SECRET: &str = "tok-for-a-0987654321";
    let gw = HttpGateway::start(
        |dir| {
            let mut a = faulty("a", dir, &[]);
            a["env"] = json!({"SERVICE_TOKEN": TOOL_SECRET});
            json!({
                "mcpServers": {
                    "a": a,
                    // Prints its key on stderr as it dies: the tail is kept as its last error.
                    "leaky": {"command": "sh", "args": ["-c", "echo \"bad key $API_KEY\" >&2; exit 3"], "env": {"API_KEY": SECRET}},
                    "remote": {"url": "http://127.0.0.1:9/mcp?key=url-secret-77", "headers": {"Authorization": format!("Bearer {SECRET}-2")}},
                },
                "rebound": {"restart": {"initial_delay_ms": 50}, "errors_log": dir.join("errors.jsonl")},
            })
        },
        &[],
    )
    .await;
    let client = gw.client(None).await.unwrap();
    let mut status = String::new();
    for _ in 0..100 {
        status = text(&call(&client, "rebound_status", json!({})).await);
        // Its stderr is quoted whether its exit or its closed output is noticed first.
        if status.contains("bad key") && status.contains("127.0.0.1:9") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(status.contains("bad key [redacted]"), "{status}");
    // A server that puts its own token into an error: the client asked, so it sees its
    // answer, but the errors log and the gateway's log do not keep it.
    let failed = call(&client, "fail", json!({"message": format!("rejected {TOOL_SECRET}")})).await;
    assert_eq!(failed.is_error, Some(true));
    let errors_log = gw.dir.path().join("errors.jsonl");
    eventually("the errors log entry", || std::fs::read_to_string(&errors_log).is_ok_and(|t| t.contains("rejected")))
        .await;
    let errors = std::fs::read_to_string(&errors_log).unwrap();
    assert!(errors.contains("rejected [redacted]"), "{errors}");
    let metrics = reqwest::get(format!("{}/metrics", gw.base)).await.unwrap().text().await.unwrap();
    let log = gw.log.lock().unwrap().clone();
    for secret in [SECRET, TOOL_SECRET, "url-secret-77"] {
        assert!(!status.contains(secret), "{secret} in status: {status}");
        assert!(!errors.contains(secret), "{secret} in the errors log: {errors}");
        assert!(!metrics.contains(secret), "{secret} in metrics");
        assert!(!log.contains(secret), "{secret} in the gateway's log:\n{log}");
    }
    let _ = client.cancel().await;
}

#[tokio::test]
async fn listening_beyond_loopback_needs_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rebound.json");
    std::fs::write(&config, json!({"mcpServers": {"a": faulty("a", dir.path(), &[])}}).to_string()).unwrap();
    let out = tokio::process::Command::from(rebound_tests::rebound())
        .args(["serve", "--http", "0.0.0.0:0", "--config"])
        .arg(&config)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(30), out).await.expect("exits at once").unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no token is set") && stderr.contains("REBOUND_AUTH_TOKEN"), "{stderr}");
}

/// Beyond loopback with only the clients' token, the operator is warned that every client
/// may read what every other did (`/status`, `/metrics`), and that no Host name but
/// loopback's is allowed; with an operator token, not the first.
#[tokio::test]
async fn beyond_loopback_without_an_operator_token_the_operator_is_warned() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rebound.json");
    std::fs::write(&path, json!({"mcpServers": {"a": faulty("a", dir.path(), &[])}}).to_string()).unwrap();
    let spawn = |operator: &'static str| {
        let (path, log) = (path.clone(), std::sync::Arc::new(std::sync::Mutex::new(String::new())));
        async move {
            let env = [("REBOUND_AUTH_TOKEN", TOKEN), ("REBOUND_OPERATOR_TOKEN", operator)];
            (HttpGateway::spawn(&path, "0.0.0.0:0", &env, log.clone()).await, log)
        }
    };
    let warning = "no operator token set: every client with the gateway's token may read /status and /metrics";
    let (_gw, log) = spawn("").await;
    rebound_tests::logged(&log, warning).await;
    rebound_tests::logged(&log, "only loopback Host names are allowed").await;
    let (_gw, log) = spawn(OPERATOR).await;
    rebound_tests::logged(&log, "only loopback Host names are allowed").await;
    // Logged after the checks, through the same writer.
    rebound_tests::logged(&log, "serving streamable HTTP at").await;
    assert!(!log.lock().unwrap().contains("no operator token set"), "{}", log.lock().unwrap());
}

/// An HTTP upstream that restarts forgets its sessions (404); the gateway opens a new
/// one and replays the call, and its client sees an ordinary answer.
#[tokio::test]
async fn an_expired_upstream_session_is_reinitialised_without_the_client_noticing() {
    let inner_dir = tempfile::tempdir().unwrap();
    let inner_config = inner_dir.path().join("inner.json");
    std::fs::write(&inner_config, json!({"mcpServers": {"f": faulty("f", inner_dir.path(), &[])}}).to_string())
        .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let (mut inner, base) = HttpGateway::spawn(&inner_config, &addr, &[], log.clone()).await;

    let gw = Gateway::start(
        |_| json!({"mcpServers": {"remote": {"url": format!("{base}/mcp"), "headers": {"X-Client": "rebound-tests"}}}}),
    )
    .await;
    assert_eq!(text(&gw.call("echo", json!({"message": "one"})).await), "f: one");

    inner.kill().await.unwrap();
    inner.wait().await.unwrap();
    let (_inner, _) = HttpGateway::spawn(&inner_config, &addr, &[], log).await;

    let again = gw.call("echo", json!({"message": "two"})).await;
    assert_ne!(again.is_error, Some(true), "{}", text(&again));
    assert_eq!(text(&again), "f: two");
    let status: Value = serde_json::from_str(&text(&gw.call("rebound_status", json!({})).await)).unwrap();
    // Not a restart, not a failure: the transport re-initialised and replayed the request.
    let remote = &status["servers"][0];
    assert_eq!((&remote["status"], &remote["restarts"]), (&json!("ready"), &json!(0)), "{remote}");
    assert_eq!(remote["counters"]["failures"], 0, "{remote}");

    // And the upstream is a real rmcp server: the same client code reaches it directly.
    let direct = http_client(&format!("{base}/mcp"), None).await.unwrap();
    assert!(direct.peer().list_all_tools().await.unwrap().iter().any(|t| t.name == "echo"));
    let _ = direct.cancel().await;
}

#[tokio::test]
async fn sessions_are_capped_and_the_least_recently_used_goes_first() {
    let gw = HttpGateway::start(
        |dir| json!({"mcpServers": {"a": faulty("a", dir, &[])}, "rebound": {"http": {"max_sessions": 3}}}),
        &[],
    )
    .await;
    let open = || async {
        let init = post(&gw, &initialize()).send().await.unwrap();
        assert_eq!(init.status(), StatusCode::OK);
        init.headers()["mcp-session-id"].to_str().unwrap().to_owned()
    };
    let ping = |session: String| {
        post(&gw, &json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}))
            .header("mcp-session-id", session)
            .header("mcp-protocol-version", "2025-11-25")
            .send()
    };
    let mut sessions = Vec::new();
    for _ in 0..3 {
        sessions.push(open().await);
    }
    // The first is used again, so the second is now the least recently used.
    assert_eq!(ping(sessions[0].clone()).await.unwrap().status(), StatusCode::OK);
    sessions.push(open().await);
    sessions.push(open().await);
    let status = |i: usize| {
        let s = sessions[i].clone();
        async move { ping(s).await.unwrap().status() }
    };
    assert_eq!(status(1).await, StatusCode::NOT_FOUND, "evicted first");
    assert_eq!(status(2).await, StatusCode::NOT_FOUND, "evicted second");
    for i in [0, 3, 4] {
        assert_eq!(status(i).await, StatusCode::OK, "session {i} kept");
    }
}

/// A client that opens session after session closes its own, not another client's:
/// the sessions closed for room are those of the address holding the most. (Two
/// addresses, as a proxy on this machine names them: every loopback address is one.)
#[tokio::test]
async fn a_client_opening_sessions_cannot_close_another_clients() {
    let gw = HttpGateway::start(
        |dir| {
            let http = json!({"max_sessions": 3, "trusted_proxies": ["127.0.0.1"]});
            json!({"mcpServers": {"a": faulty("a", dir, &[])}, "rebound": {"http": http}})
        },
        &[],
    )
    .await;
    let from = |ip: &str| {
        let headers =
            reqwest::header::HeaderMap::from_iter([("x-forwarded-for".parse().unwrap(), ip.parse().unwrap())]);
        reqwest::Client::builder().default_headers(headers).build().unwrap()
    };
    let (alice, bob) = (from("198.51.100.1"), from("198.51.100.2"));
    let open = |client: &reqwest::Client| {
        let init =
            client.post(gw.url()).header("accept", "application/json, text/event-stream").json(&initialize()).send();
        async move {
            let init = init.await.unwrap();
            assert_eq!(init.status(), StatusCode::OK);
            init.headers()["mcp-session-id"].to_str().unwrap().to_owned()
        }
    };
    let ping = |client: &reqwest::Client, session: &str| {
        let ping = client
            .post(gw.url())
            .header("accept", "application/json, text/event-stream")
            .header("mcp-session-id", session)
            .header("mcp-protocol-version", "2025-11-25")
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}))
            .send();
        async move { ping.await.unwrap().status() }
    };
    let hers = open(&alice).await;
    let mut his = Vec::new();
    for _ in 0..4 {
        his.push(open(&bob).await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Hers is the least recently used, and still open: his first two went for his third
    // and fourth.
    assert_eq!(ping(&alice, &hers).await, StatusCode::OK);
    for (i, session) in his.iter().enumerate() {
        let expected = if i < 2 { StatusCode::NOT_FOUND } else { StatusCode::OK };
        assert_eq!(ping(&bob, session).await, expected, "his session {i}");
    }
}

#[tokio::test]
async fn a_flood_of_abandoned_sessions_gives_its_memory_back_once_they_idle_out() {
    let gw = HttpGateway::start(
        |dir| {
            json!({"mcpServers": {"a": faulty("a", dir, &[])},
                   "rebound": {"http": {"max_sessions": 200, "session_idle_ms": 1000}}})
        },
        &[],
    )
    .await;
    let pid = gw.child.id().unwrap();
    let open = || async { post(&gw, &initialize()).send().await.unwrap().bytes().await.unwrap() };
    open().await;
    let idle = memory_kib(pid, "VmRSS:");
    for _ in 0..8 {
        futures::future::join_all((0..50).map(|_| open())).await;
    }
    let flooded = memory_kib(pid, "VmRSS:");
    assert!(flooded > idle + (8 << 10), "the flood never showed in the gateway's memory ({idle} → {flooded} KiB)");
    // Sessions past `max_sessions` were evicted; the rest idle out, and what they held goes
    // back to the system, not just to the allocator.
    eventually(&format!("memory back near its idle {} MiB from {} MiB", idle >> 10, flooded >> 10), || {
        memory_kib(pid, "VmRSS:") < idle + (6 << 10)
    })
    .await;
}

#[tokio::test]
async fn on_sigterm_calls_in_flight_are_answered_before_the_gateway_exits() {
    let gw = HttpGateway::start(
        |dir| {
            let mut a = faulty("a", dir, &[]);
            a["recovery"] = json!({"timeout_ms": 60000, "retry": {"max_attempts": 1}});
            json!({"mcpServers": {"a": a}, "rebound": {"http": {"shutdown_grace_ms": 4000}}})
        },
        &[],
    )
    .await;
    let client = gw.client(None).await.unwrap();
    let late = gw.client(None).await.unwrap();
    assert_eq!(text(&call(&client, "echo", json!({"message": "up"})).await), "a: up");
    // One call that finishes within the grace period, one that never would, and a read
    // that never would either.
    let slow = call(&client, "slow", json!({"ms": 800}));
    let hang = call(&client, "hang", json!({}));
    let read = client.peer().read_resource(rmcp::model::ReadResourceRequestParams::new("faulty://a/items/hang"));
    let read = tokio::time::timeout(Duration::from_secs(30), read);
    let term = async {
        let in_flight = || ["slow", "hang"].iter().all(|t| gw.state("a", "calls").contains(&t.to_string()));
        eventually("both calls in flight", in_flight).await;
        eventually("the read in flight", || !gw.state("a", "reads").is_empty()).await;
        gw.sigterm();
        gw.logged("shutting down: waiting up to").await;
        // Nor a new event stream.
        let stream = reqwest::Client::new().get(gw.url()).header("accept", "text/event-stream").send().await.unwrap();
        assert_eq!(stream.status(), StatusCode::SERVICE_UNAVAILABLE);
        // Taken no more: a new call is refused, not left hanging; a new connection is
        // still answered, 503, and so is a readiness probe.
        let mut params = CallToolRequestParams::new("echo");
        params.arguments = json!({"message": "too late"}).as_object().cloned();
        let refused = tokio::time::timeout(Duration::from_secs(10), late.peer().call_tool(params)).await;
        let fresh = post(&gw, &initialize()).send().await.expect("a new connection is answered");
        assert_eq!(fresh.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(fresh.headers()["retry-after"], "1");
        let ready = reqwest::get(format!("{}/readyz", gw.base)).await.expect("answered");
        assert_eq!(ready.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(ready.json::<Value>().await.unwrap()["shutting_down"], true);
        // The operator still reads the status, which says the same.
        let status = reqwest::get(format!("{}/status", gw.base)).await.expect("answered");
        let gateway = status.json::<Value>().await.unwrap()["gateway"].clone();
        assert_eq!((gateway["ready"].as_bool(), gateway["shutting_down"].as_bool()), (Some(false), Some(true)));
        let metrics = reqwest::get(format!("{}/metrics", gw.base)).await.expect("answered");
        assert_eq!(metrics.status(), StatusCode::OK, "the metrics are still read");
        let metrics = metrics.text().await.unwrap();
        assert!(metrics.lines().any(|l| l == r#"rebound_server_status{server="a",status="ready"} 1"#), "{metrics}");
        refused
    };
    let (slow, hang, read, refused) = tokio::join!(slow, hang, read, term);
    assert!(text(&slow).contains("slept 800 ms"), "{}", text(&slow));
    assert_eq!(hang.is_error, Some(true));
    assert!(text(&hang).contains("shut down while `hang` was running"), "{}", text(&hang));
    let read = read.expect("the read is answered before the gateway exits").expect_err("with an error");
    assert!(read.to_string().contains("the gateway shut down while `resources/read`"), "{read}");
    assert!(refused.expect("refused at once").is_err(), "a call was taken after SIGTERM");
    let mut gw = gw;
    let status = tokio::time::timeout(Duration::from_secs(10), gw.child.wait()).await.unwrap().unwrap();
    assert!(status.success(), "{status}");
}

/// While the gateway drains, a client may still cancel a call it has in flight (a
/// notification, not a new request): the call ends, and no longer holds the shutdown.
#[tokio::test]
async fn while_the_gateway_drains_a_client_can_still_cancel_its_call() {
    let gw = draining_with_a_hang_upstream().await;
    let client = gw.client(None).await.unwrap();
    let request = rmcp::model::CallToolRequest::new(CallToolRequestParams::new("hang"));
    let handle = client
        .peer()
        .send_cancellable_request(
            rmcp::model::ClientRequest::CallToolRequest(request),
            rmcp::service::PeerRequestOptions::no_options(),
        )
        .await
        .unwrap();
    eventually("the call upstream", || gw.state("a", "calls").contains(&"hang".to_owned())).await;
    gw.sigterm();
    gw.logged("shutting down: waiting up to").await;
    handle.cancel(Some("changed my mind".into())).await.unwrap();
    // Nothing is in flight any more: the gateway exits without waiting out its grace.
    // The cancel closes the call's stream before the call has ended: the drain waits for
    // the call, not only for its stream, so the shutdown does not end it first.
    exits_with_the_call_cancelled(gw).await;
}

/// A client on 2026-07-28 has no session to send a cancellation on: it leaves. Its call is
/// cancelled then, and wound down while the gateway drains: logged as cancelled, not as
/// cut short by the shutdown, and the gateway exits without waiting out its grace.
#[tokio::test]
async fn while_the_gateway_drains_a_2026_client_that_leaves_has_its_call_cancelled() {
    let gw = draining_with_a_hang_upstream().await;
    let waiting = hanging_as_it_drains(&gw).await;
    waiting.abort(); // its connection closes
    exits_with_the_call_cancelled(gw).await;
}

/// A client on 2026-07-28 whose call the gateway holds on a server's question may still
/// answer it while the gateway drains: the call is in flight, and has the grace to finish
/// as any other. A new call is refused, and the gateway exits once it is done.
#[tokio::test]
async fn while_the_gateway_drains_a_2026_client_may_still_answer_its_held_call() {
    let mut gw = HttpGateway::start(
        |dir| json!({"mcpServers": {"a": faulty("a", dir, &[])}, "rebound": {"http": {"shutdown_grace_ms": 600_000}}}),
        &[],
    )
    .await;
    let call = |id: u64, back: Value| {
        let mut meta = modern_meta();
        meta["io.modelcontextprotocol/clientCapabilities"] = json!({"elicitation": {}});
        let mut extra = json!({"_meta": meta});
        extra.as_object_mut().unwrap().extend(back.as_object().cloned().unwrap_or_default());
        let sent = modern_call(&gw, id, "elicit", extra).send();
        async move {
            let answer = sent.await.unwrap();
            let status = answer.status();
            let body = answer.text().await.unwrap();
            let json =
                body.lines().find_map(|l| l.strip_prefix("data: ").filter(|d| d.starts_with('{'))).unwrap_or(&body);
            (status, serde_json::from_str::<Value>(json).unwrap_or(Value::Null))
        }
    };
    let (_, asked) = call(1, json!({})).await;
    let result = &asked["result"];
    assert_eq!(result["resultType"], "input_required", "{asked}");
    let key = result["inputRequests"].as_object().unwrap().keys().next().unwrap().clone();
    let state = result["requestState"].as_str().unwrap().to_owned();
    gw.sigterm();
    gw.logged("shutting down: waiting up to").await;
    let (refused, _) = call(2, json!({})).await;
    assert_eq!(refused, StatusCode::SERVICE_UNAVAILABLE, "a new call while it drains");
    let answer = json!({key: {"action": "accept", "content": {"name": "Ada"}}});
    let (status, done) = call(3, json!({"requestState": state, "inputResponses": answer})).await;
    assert_eq!(status, StatusCode::OK, "{done}");
    let text = done["result"]["content"][0]["text"].as_str().unwrap_or_default();
    assert!(text.starts_with("elicited: ") && text.contains("Ada"), "{done}");
    let exited = tokio::time::timeout(Duration::from_secs(60), gw.child.wait()).await;
    assert!(exited.expect("exits long before its grace is over").unwrap().success());
}

/// A second SIGTERM while the gateway drains (here for ten minutes, a call hanging) ends
/// the wait: the gateway exits at once, saying so.
#[tokio::test]
async fn a_second_sigterm_ends_the_drain_at_once() {
    let mut gw = draining_with_a_hang_upstream().await;
    let _waiting = hanging_as_it_drains(&gw).await;
    gw.sigterm();
    let exited = tokio::time::timeout(Duration::from_secs(30), gw.child.wait()).await;
    let status = exited.expect("exits at once, not after its ten minutes of grace").unwrap();
    assert!(!status.success(), "{status}");
    gw.logged("a second SIGTERM: exiting without waiting").await;
}

/// A 2026-07-28 client's call of `hang` on `gw`, its answer read on a task of its own
/// (returned), and `gw` sent SIGTERM once the call is upstream: it drains.
async fn hanging_as_it_drains(gw: &HttpGateway) -> tokio::task::JoinHandle<reqwest::Result<String>> {
    let call = modern_call(gw, 1, "hang", json!({}));
    let waiting = tokio::spawn(async move { call.send().await?.text().await });
    eventually("the call upstream", || gw.state("a", "calls").contains(&"hang".to_owned())).await;
    gw.sigterm();
    gw.logged("shutting down: waiting up to").await;
    waiting
}

/// A gateway whose `hang` runs for as long as it drains (ten minutes), with an errors log.
async fn draining_with_a_hang_upstream() -> HttpGateway {
    HttpGateway::start(
        |dir| {
            let mut a = faulty("a", dir, &[]);
            a["recovery"] = json!({"timeout_ms": 600_000, "retry": {"max_attempts": 1}});
            let log = dir.join("errors.jsonl");
            json!({"mcpServers": {"a": a}, "rebound": {"errors_log": log, "http": {"shutdown_grace_ms": 600_000}}})
        },
        &[],
    )
    .await
}

/// The gateway exits long before its grace is over, its call logged as cancelled by the
/// client and not as cut short by the shutdown.
async fn exits_with_the_call_cancelled(mut gw: HttpGateway) {
    let exited = tokio::time::timeout(Duration::from_secs(60), gw.child.wait()).await;
    let status = exited.expect("exits long before its grace is over").unwrap();
    assert!(status.success(), "{status}");
    gw.logged("call failed: cancelled by the client").await;
    let errors = std::fs::read_to_string(gw.dir.path().join("errors.jsonl")).expect("the errors log");
    assert!(errors.contains("cancelled by the client") && !errors.contains("mcp_shutdown"), "{errors}");
}

/// An open `subscriptions/listen` (held by its client for as long as it likes) ends at
/// SIGTERM: it does not hold the shutdown for its whole grace period.
#[tokio::test]
async fn on_sigterm_open_listens_end_and_do_not_hold_the_shutdown() {
    let gw = HttpGateway::start(
        |dir| json!({"mcpServers": {"a": faulty("a", dir, &[])}, "rebound": {"http": {"shutdown_grace_ms": 600000}}}),
        &[],
    )
    .await;
    let mut open = listen(&gw, 1, "faulty://a/readme").send().await.unwrap();
    assert_eq!(open.status(), StatusCode::OK);
    gw.sigterm();
    let mut gw = gw;
    let status =
        tokio::time::timeout(Duration::from_secs(60), gw.child.wait()).await.expect("exits, not after ten minutes");
    assert!(status.unwrap().success());
    while let Ok(Some(_)) = open.chunk().await {} // the stream ended
}

/// A call whose client went away goes on; SIGTERM ends it as shut down once the grace is
/// over, in the errors log, though no request is left in flight.
#[tokio::test]
async fn on_sigterm_a_call_its_client_left_is_ended_and_logged() {
    let gw = HttpGateway::start(
        |dir| {
            let mut a = faulty("a", dir, &[]);
            a["recovery"] = json!({"timeout_ms": 60000, "retry": {"max_attempts": 1}});
            let http = json!({"shutdown_grace_ms": 500});
            json!({"mcpServers": {"a": a}, "rebound": {"errors_log": dir.join("errors.jsonl"), "http": http}})
        },
        &[],
    )
    .await;
    let client = gw.client(None).await.unwrap();
    let calls = || std::fs::read_to_string(gw.dir.path().join("a/calls")).unwrap_or_default();
    let hang = call(&client, "hang", json!({}));
    let left = tokio::time::timeout(Duration::from_secs(30), async {
        tokio::select! {
            _ = hang => panic!("`hang` answered"),
            () = eventually("the call reached the server", || calls().contains("hang")) => {}
        }
    });
    left.await.unwrap();
    drop(client); // its connection closes; the call goes on
    gw.sigterm();
    let mut gw = gw;
    let status = tokio::time::timeout(Duration::from_secs(10), gw.child.wait()).await.unwrap().unwrap();
    assert!(status.success(), "{status}");
    let log = std::fs::read_to_string(gw.dir.path().join("errors.jsonl")).unwrap_or_default();
    let ended = log.lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()).find(|e| e["type"] == "mcp_shutdown");
    let ended = ended.unwrap_or_else(|| panic!("no mcp_shutdown entry: {log}"));
    assert_eq!(ended["context"]["tool_name"], "hang", "{ended}");
}

#[tokio::test]
async fn a_session_its_client_walked_away_from_is_closed_with_its_own_servers() {
    let gw = HttpGateway::start(
        |dir| {
            // It keeps talking to its session, which must not keep the session alive.
            let mut a = faulty("a", dir, &["--log-every-ms", "100"]);
            // Each session's instance keeps its state (its pid) apart.
            a["args"][3] = json!(format!("{}/a-${{REBOUND_SESSION}}", dir.display()));
            a["scope"] = json!("session");
            // Long enough for the reads of its status below on a loaded machine.
            json!({"mcpServers": {"a": a}, "rebound": {"http": {"session_idle_ms": 3000}}})
        },
        &[],
    )
    .await;
    // A raw client: no GET stream, no DELETE; it makes one call and goes silent.
    let init = post(&gw, &initialize()).send().await.unwrap();
    let session = init.headers()["mcp-session-id"].to_str().unwrap().to_owned();
    drop(init);
    let in_session =
        |body: Value| post(&gw, &body).header("mcp-session-id", &session).header("mcp-protocol-version", "2025-11-25");
    in_session(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).send().await.unwrap();
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "echo", "arguments": {"message": "mine"}}});
    let answer = in_session(call.clone()).send().await.unwrap().text().await.unwrap();
    assert!(answer.contains("a: mine"), "{answer}");
    let own: Vec<_> = std::fs::read_dir(gw.dir.path())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("a-sess_"))
        .collect();
    assert_eq!(own.len(), 1, "one instance, for the one session");
    let pid: u32 = std::fs::read_to_string(own[0].path().join("starts")).unwrap().trim().parse().unwrap();
    assert!(rebound_tests::alive(pid));
    let status = || async {
        let doc: Value = reqwest::get(format!("{}/status", gw.base)).await.unwrap().json().await.unwrap();
        doc["servers"][0].clone()
    };
    let a = status().await;
    assert_eq!(
        (a["scope"].as_str(), a["instances"].as_u64(), a["health"].as_str()),
        (Some("session"), Some(1), Some("green")),
        "{a}"
    );
    assert_eq!(a["counters"]["calls"], 1, "{a}");
    let metrics = || async { reqwest::get(format!("{}/metrics", gw.base)).await.unwrap().text().await.unwrap() };
    let text = metrics().await;
    for line in [r#"rebound_server_status{server="a",status="ready"} 1"#, r#"rebound_attempts_total{server="a"} 1"#] {
        assert!(text.contains(line), "{line} in {text}");
    }
    // Silent past `session_idle_ms`: the session is closed and its server stopped.
    eventually("the idle session's own server stops", move || !rebound_tests::alive(pid)).await;
    assert_eq!(status().await["instances"], 0);
    assert!(metrics().await.contains(r#"rebound_server_status{server="a",status="ready"} 0"#));
    let gone = in_session(call).send().await.unwrap();
    assert_eq!(gone.status(), StatusCode::NOT_FOUND, "the session is gone");
}

/// A server's restarts stay counted once the instance that made them is gone (here a
/// session's own, stopped with its session): `/metrics` never counts one back down.
#[tokio::test]
async fn restarts_stay_counted_once_their_instance_is_gone() {
    let gw = HttpGateway::start(
        |dir| {
            let mut a = faulty("a", dir, &[]);
            a["scope"] = json!("session");
            json!({"mcpServers": {"a": a}, "rebound": {"restart": {"initial_delay_ms": 10}}})
        },
        &[],
    )
    .await;
    let metrics = || async { reqwest::get(format!("{}/metrics", gw.base)).await.unwrap().text().await.unwrap() };
    let until = |line: &'static str| async move {
        for _ in 0..200 {
            if metrics().await.contains(line) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{line} never in {}", metrics().await);
    };
    let client = gw.client(None).await.unwrap();
    call(&client, "echo", json!({"message": "m"})).await;
    until(r#"rebound_server_restarts_total{server="a"} 0"#).await;
    assert!(call(&client, "crash", json!({})).await.is_error == Some(true));
    until(r#"rebound_server_restarts_total{server="a"} 1"#).await;
    let _ = client.cancel().await;
    until(r#"rebound_server_status{server="a",status="ready"} 0"#).await;
    let text = metrics().await;
    assert!(text.contains(r#"rebound_server_restarts_total{server="a"} 1"#), "{text}");
}

/// A `scope: session` server whose instances all keep crashing is red, not green, and
/// its instances are counted by status in `/metrics`.
#[tokio::test]
async fn a_session_servers_failing_instances_show_in_its_health_and_metrics() {
    let gw = HttpGateway::start(
        |dir| {
            let mut a = faulty("a", dir, &["--exit-after-ms", "300"]);
            a["scope"] = json!("session");
            let restart = json!({"initial_delay_ms": 10, "crash_loop_limit": 2, "down_retry_ms": 600000});
            json!({"mcpServers": {"a": a}, "rebound": {"restart": restart}})
        },
        &[],
    )
    .await;
    let client = gw.client(None).await.unwrap();
    call(&client, "echo", json!({"message": "m"})).await;
    // Wait for the end of the crash loop (down, and it stays down for ten minutes): red
    // also shows while the instance restarts between its two crashes.
    let down = r#"rebound_server_status{server="a",status="down"} 1"#;
    let mut text = String::new();
    for _ in 0..100 {
        text = reqwest::get(format!("{}/metrics", gw.base)).await.unwrap().text().await.unwrap();
        if text.contains(down) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(text.contains(down), "{text}");
    let doc: Value = reqwest::get(format!("{}/status", gw.base)).await.unwrap().json().await.unwrap();
    let a = &doc["servers"][0];
    assert_eq!((a["health"].as_str(), a["instances_failing"].as_u64()), (Some("red"), Some(1)), "{a}");
    let _ = client.cancel().await;
}

#[tokio::test]
async fn the_status_document_and_rebound_status_in_a_terminal() {
    let gw = HttpGateway::start(
        |dir| json!({"mcpServers": {"a": faulty("a", dir, &[])}, "rebound": {"http": {"auth_token": TOKEN}}}),
        &[],
    )
    .await;
    let client = gw.client(Some(TOKEN)).await.unwrap();
    call(&client, "echo", json!({"message": "m"})).await;
    call(&client, "fail", json!({"message": "no"})).await;

    let doc: Value = reqwest::Client::new()
        .get(format!("{}/status", gw.base))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(doc["schema"], 1);
    let a = &doc["servers"][0];
    assert_eq!((a["name"].as_str(), a["health"].as_str()), (Some("a"), Some("green")), "{doc}");
    let outcomes: Vec<&str> =
        a["recent_calls"].as_array().unwrap().iter().map(|c| c["outcome"].as_str().unwrap()).collect();
    assert_eq!(outcomes, ["ok", "tool_error"]);
    assert!(a["latency_ms"]["p50"].as_f64().is_some(), "{doc}");
    // The data needs the token; the page that shows it does not (it holds none).
    let refused = reqwest::get(format!("{}/status", gw.base)).await.unwrap();
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    let page = reqwest::get(format!("{}/", gw.base)).await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    assert!(page.headers()["content-security-policy"].to_str().unwrap().contains("default-src 'none'"));
    assert!(page.text().await.unwrap().contains("<title>Rebound status</title>"));

    let status = |token: Option<&str>| {
        let mut cmd = rebound_tests::rebound();
        cmd.args(["status", "--url", &format!("{}/mcp", gw.base)]);
        if let Some(token) = token {
            cmd.args(["--token", token]);
        }
        let out = cmd.output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (ok, table) = status(Some(TOKEN));
    assert!(ok, "{table}");
    let row = table.lines().find(|l| l.starts_with("a ")).unwrap_or_else(|| panic!("no row for a:\n{table}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(&cells[..6], ["a", "green", "ready", "closed", "0", "2"], "{table}");
    let (ok, refused) = status(None);
    assert!(!ok && refused.contains("the gateway wants its token"), "{refused}");
}

/// `rebound status` takes its token from `--token`, else `REBOUND_OPERATOR_TOKEN`, else
/// `REBOUND_AUTH_TOKEN` (an empty one is no token), and prints the document with `--json`.
#[tokio::test]
async fn rebound_status_finds_its_token_in_the_environment_and_prints_json() {
    let gw = HttpGateway::start(
        |dir| {
            let http = json!({"auth_token": TOKEN, "operator_token": OPERATOR});
            json!({"mcpServers": {"a": faulty("a", dir, &[])}, "rebound": {"http": http}})
        },
        &[],
    )
    .await;
    let status = |url: &str, args: &[&str], env: &[(&str, &str)]| {
        let out = rebound_tests::rebound()
            .args(["status", "--url", url])
            .args(args)
            .envs(env.iter().copied())
            .output()
            .unwrap();
        let said = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
        (out.status.success(), said(&out.stdout), said(&out.stderr))
    };
    let url = format!("{}/", gw.base);
    let (ok, out, err) =
        status(&url, &["--json"], &[("REBOUND_OPERATOR_TOKEN", OPERATOR), ("REBOUND_AUTH_TOKEN", TOKEN)]);
    assert!(ok, "{err}");
    let doc: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("--json prints JSON ({e}): {out}"));
    assert_eq!((doc["schema"].as_u64(), doc["servers"][0]["name"].as_str()), (Some(1), Some("a")), "{doc}");
    let (ok, _, err) = status(&url, &["--json"], &[("REBOUND_OPERATOR_TOKEN", ""), ("REBOUND_AUTH_TOKEN", OPERATOR)]);
    assert!(ok, "an empty REBOUND_OPERATOR_TOKEN falls back to REBOUND_AUTH_TOKEN: {err}");
    let (ok, _, err) = status(&url, &[], &[("REBOUND_OPERATOR_TOKEN", TOKEN)]);
    assert!(!ok && err.contains("the gateway wants its token"), "the clients' token is not the operator's: {err}");
    let (ok, _, err) = status(&url, &["--token", TOKEN], &[("REBOUND_OPERATOR_TOKEN", OPERATOR)]);
    assert!(!ok && err.contains("the gateway wants its token"), "--token comes first: {err}");
    // A port nothing listens on: bound, and so kept from anyone else, but not listening.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let closed = socket.local_addr().unwrap();
    let (ok, _, err) = status(&format!("http://{closed}"), &[], &[("REBOUND_OPERATOR_TOKEN", OPERATOR)]);
    assert!(!ok && err.contains("cannot reach the gateway at"), "{err}");
    // A wedged gateway: its connection made (by the kernel, the socket listening), its
    // request never answered. The command gives up and says so.
    let wedged = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", wedged.local_addr().unwrap());
    let (ok, _, err) = status(&url, &[], &[("REBOUND_OPERATOR_TOKEN", OPERATOR)]);
    assert!(!ok && err.contains("did not answer within 10 s"), "{err}");
}

/// A client on 2026-07-28 that listens the moment the gateway starts, before its server's
/// first start is over: the acknowledgement waits for that start, and follows the
/// resource asked for. (rmcp decides it in a synchronous hook; without the wait it would
/// see no server and follow nothing.)
#[tokio::test]
async fn a_listen_request_on_a_cold_gateway_follows_the_resources_of_servers_still_starting() {
    let gw =
        HttpGateway::start(|dir| json!({"mcpServers": {"a": faulty("a", dir, &["--start-delay", "1500"])}}), &[]).await;
    let mut response = listen(&gw, 1, "faulty://a/readme").send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut stream = String::new();
    let acknowledged = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(chunk) = response.chunk().await.unwrap() {
            stream.push_str(&String::from_utf8_lossy(&chunk));
            if let Some(at) = stream.find("notifications/subscriptions/acknowledged") {
                return stream[at..].lines().next().unwrap_or_default().to_owned();
            }
        }
        panic!("the listen ended unacknowledged: {stream}");
    })
    .await
    .expect("acknowledged in time");
    assert!(acknowledged.contains("faulty://a/readme"), "{acknowledged}");
}

/// A 2026-07-28 client's listen requests, held open, count against its address; they
/// do not keep another client behind the same address from opening a session.
#[tokio::test]
async fn listens_held_open_by_one_client_leave_its_neighbours_room_to_connect() {
    let gw = HttpGateway::start(
        |dir| json!({"mcpServers": {"a": faulty("a", dir, &[])}, "rebound": {"http": {"max_concurrent_per_client": 2}}}),
        &[],
    )
    .await;
    let mut held = Vec::new();
    for id in 1..=2 {
        let response = listen(&gw, id, "faulty://a/readme").send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        held.push(response);
    }
    let refused = listen(&gw, 3, "faulty://a/readme").send().await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS, "the listening client's own room is full");
    let opened = post(&gw, &initialize()).send().await.unwrap();
    assert_eq!(opened.status(), StatusCode::OK, "{}", opened.text().await.unwrap());
    assert!(opened.headers().contains_key("mcp-session-id"));
    drop(held);
}

/// Behind a proxy the operator trusts (`rebound.http.trusted_proxies`), each client its
/// `X-Forwarded-For` (or, with `proxy_header: "forwarded"`, its `Forwarded`) names has a
/// share of its own; from anyone else the header is only the client's word, and changes
/// nothing.
#[tokio::test]
async fn the_clients_a_trusted_proxy_names_each_have_their_own_share() {
    for (trusted, header) in [(true, "x-forwarded-for"), (false, "x-forwarded-for"), (true, "forwarded")] {
        let gw = HttpGateway::start(
            |dir| {
                let mut http = json!({"max_concurrent_per_client": 2, "proxy_header": header});
                if trusted {
                    http["trusted_proxies"] = json!(["127.0.0.1", "::1"]);
                }
                json!({"mcpServers": {"a": faulty("a", dir, &[])}, "rebound": {"http": http}})
            },
            &[],
        )
        .await;
        let from = |client: &str, id| {
            let named = if header == "forwarded" { format!("for={client};proto=http") } else { client.to_owned() };
            listen(&gw, id, "faulty://a/readme").header(header, named)
        };
        let mut held = Vec::new();
        for id in 1..=2 {
            let response = from("198.51.100.4", id).send().await.unwrap();
            assert_eq!(response.status(), StatusCode::OK);
            held.push(response);
        }
        let refused = from("198.51.100.4", 3).send().await.unwrap();
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS, "the first client's room is full");
        let other = from("203.0.113.9", 4).send().await.unwrap();
        let expected = if trusted { StatusCode::OK } else { StatusCode::TOO_MANY_REQUESTS };
        assert_eq!(other.status(), expected, "trusted: {trusted}, {header}");
        drop(held);
    }
}

/// Two clients of one shared stdio server, which cannot say which request it is serving:
/// a question it asks while answering one client's `prompts/get` goes to that client,
/// and, while another client's call is in flight too, to neither.
#[tokio::test]
async fn a_question_asked_while_serving_a_prompt_goes_to_the_client_that_asked_for_it() {
    use rebound_tests::{TestClient, http_client_as};
    use rmcp::model::GetPromptRequestParams;
    let gw = HttpGateway::start(
        |dir| json!({"mcpServers": {"a": faulty("a", dir, &[])}, "rebound": {"http": {"auth_token": TOKEN}}}),
        &[],
    )
    .await;
    let named = |name: &str| TestClient { name: name.to_owned(), ..TestClient::default() };
    let ada = http_client_as(named("ada"), &gw.url(), Some(TOKEN)).await.unwrap();
    let bob = http_client_as(named("bob"), &gw.url(), Some(TOKEN)).await.unwrap();
    let greet = || {
        let mut get = GetPromptRequestParams::new("greet");
        get.arguments = json!({"who": "you", "ask": "roots"}).as_object().cloned();
        get
    };
    let prompt = |result: rmcp::model::GetPromptResult| serde_json::to_string(&result.messages).unwrap();

    // Only Ada's request is out: the question is hers.
    let got = prompt(ada.peer().get_prompt(greet()).await.unwrap());
    assert!(got.contains("file:///work/ada"), "{got}");

    // Bob's call is out as well: which one the server means cannot be known, and Bob is
    // never shown what Ada's prompt asks.
    let bob_peer = bob.peer().clone();
    let hanging = tokio::spawn(async move {
        let mut params = CallToolRequestParams::new("hang");
        params.arguments = json!({}).as_object().cloned();
        let _ = bob_peer.call_tool(params).await;
    });
    let calls = gw.dir.path().join("a").join("calls");
    eventually("bob's call in flight", || std::fs::read_to_string(&calls).is_ok_and(|c| c.contains("hang"))).await;
    let got = prompt(ada.peer().get_prompt(greet()).await.unwrap());
    assert!(!got.contains("file:///work/"), "{got}");
    hanging.abort();
    let _ = ada.cancel().await;
    let _ = bob.cancel().await;
}

/// One client of a shared server cannot take all the resources the gateway follows on it:
/// past its half, it is refused, however many sessions it opens; another client (another
/// address) still follows what it asks for. A server of the client's own (`scope:
/// session`) is all its own.
#[tokio::test]
async fn one_client_cannot_take_all_the_room_for_subscriptions_from_the_others() {
    use rmcp::model::SubscribeRequestParams;
    let gw = HttpGateway::start(
        |dir| {
            let mut own = faulty("own", dir, &[]);
            own["scope"] = json!("session");
            let http = json!({"auth_token": TOKEN, "trusted_proxies": ["127.0.0.1"]});
            json!({"mcpServers": {"a": faulty("a", dir, &[]), "own": own}, "rebound": {"http": http}})
        },
        &[],
    )
    .await;
    // Another address, as a proxy on this machine names it (every loopback address is
    // one); Ada's, with no header, is the proxy's own.
    let bob = rebound_tests::http_client_forwarded("198.51.100.2", &gw.url(), Some(TOKEN)).await.unwrap();
    let (ada, ada_again) = (gw.client(Some(TOKEN)).await.unwrap(), gw.client(Some(TOKEN)).await.unwrap());
    let item = |i: &str| SubscribeRequestParams::new(format!("faulty://a/items/{i}"));
    for i in 0..128 {
        ada.peer().subscribe(item(&i.to_string())).await.unwrap_or_else(|e| panic!("subscription {i}: {e}"));
    }
    let refused = format!("{:?}", ada.peer().subscribe(item("more")).await.expect_err("past the client's half"));
    assert!(refused.contains("at most 128 resources of server `a`"), "{refused}");
    let refused = ada_again.peer().subscribe(item("again")).await.expect_err("another session of that address");
    assert!(format!("{refused:?}").contains("at most 128 resources of server `a`"), "{refused:?}");
    for i in 0..200 {
        let own = SubscribeRequestParams::new(format!("faulty://own/items/{i}"));
        ada.peer().subscribe(own).await.unwrap_or_else(|e| panic!("subscription {i} to its own server: {e}"));
    }
    bob.peer().subscribe(item("bob")).await.unwrap();
    bob.peer().subscribe(item("0")).await.unwrap();
    // Letting one go makes room again.
    ada.peer().unsubscribe(rmcp::model::UnsubscribeRequestParams::new("faulty://a/items/1")).await.unwrap();
    ada.peer().subscribe(item("more")).await.unwrap();
    let _ = ada.cancel().await;
    let _ = ada_again.cancel().await;
    let _ = bob.cancel().await;
}

/// The /64s of one IPv6 site (its /48) share one client's room for a shared server's
/// subscriptions, as they share one address's (and still once the server restarted and
/// they were made again): a client cannot take all the room by using more of its site's
/// addresses. Another site's room is its own.
#[tokio::test]
async fn the_addresses_of_one_ipv6_site_share_one_clients_room_for_subscriptions() {
    use rebound_tests::http_client_forwarded;
    use rmcp::model::SubscribeRequestParams;
    let gw = HttpGateway::start(
        |dir| {
            let http = json!({"auth_token": TOKEN, "trusted_proxies": ["127.0.0.1", "::1"]});
            json!({"mcpServers": {"a": faulty("a", dir, &[])}, "rebound": {"http": http}})
        },
        &[],
    )
    .await;
    let url = gw.url();
    let one = http_client_forwarded("2001:db8:1:1::1", &url, Some(TOKEN)).await.unwrap();
    let two = http_client_forwarded("2001:db8:1:2::1", &url, Some(TOKEN)).await.unwrap();
    let elsewhere = http_client_forwarded("2001:db8:2:1::1", &url, Some(TOKEN)).await.unwrap();
    let item = |i: &str| SubscribeRequestParams::new(format!("faulty://a/items/{i}"));
    for i in 0..128 {
        one.peer().subscribe(item(&i.to_string())).await.unwrap_or_else(|e| panic!("subscription {i}: {e}"));
    }
    let refused = two.peer().subscribe(item("more")).await.expect_err("another /64 of the site");
    assert!(format!("{refused:?}").contains("at most 128 resources of server `a`"), "{refused:?}");
    // Made again after the server restarts, they still count against the site.
    let mut crash = CallToolRequestParams::new("crash");
    crash.arguments = Some(serde_json::Map::new());
    let _ = one.peer().call_tool(crash).await;
    eventually("the subscriptions made again", || gw.state("a", "subscribes").len() == 2 * 128).await;
    let refused = two.peer().subscribe(item("more")).await.expect_err("another /64 of the site, after the restart");
    assert!(format!("{refused:?}").contains("at most 128 resources of server `a`"), "{refused:?}");
    elsewhere.peer().subscribe(item("more")).await.unwrap();
    for client in [one, two, elsewhere] {
        let _ = client.cancel().await;
    }
}

/// A proxy before an HTTP upstream, refusing some tool calls with an HTTP error of its
/// own: `flaky_write` with a 502 once the upstream has run it (a proxy that lost the
/// answer), every other `echo` (the first, the third…) with a 429 and `Retry-After: 1`
/// (a rate limiter), and every `hang` with a response stream that ends at once.
/// Everything else passes through, streams and all.
struct Proxy {
    upstream: String,
    client: reqwest::Client,
    echoes: std::sync::atomic::AtomicU64,
}

impl Proxy {
    async fn start(upstream: String) -> String {
        let proxy = std::sync::Arc::new(Proxy { upstream, client: reqwest::Client::new(), echoes: Default::default() });
        let app = axum::Router::new().fallback(Self::handle).with_state(proxy);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/mcp", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        url
    }

    async fn handle(
        axum::extract::State(proxy): axum::extract::State<std::sync::Arc<Proxy>>,
        method: axum::http::Method,
        headers: axum::http::HeaderMap,
        body: axum::body::Bytes,
    ) -> axum::response::Response {
        use axum::response::IntoResponse;
        let message: Value = serde_json::from_slice(&body).unwrap_or_default();
        let tool = (message["method"] == "tools/call").then(|| message["params"]["name"].as_str()).flatten();
        if tool == Some("hang") {
            // A response stream that ends before its answer.
            return (StatusCode::OK, [("content-type", "text/event-stream")], "").into_response();
        }
        if tool == Some("echo") && proxy.echoes.fetch_add(1, std::sync::atomic::Ordering::SeqCst) % 2 == 0 {
            return (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "1")], "slow down").into_response();
        }
        let mut request = proxy.client.request(method, &proxy.upstream).body(body.clone());
        for (name, value) in headers.iter().filter(|(n, _)| !matches!(n.as_str(), "host" | "content-length")) {
            request = request.header(name, value);
        }
        let answer = request.send().await.unwrap();
        if tool == Some("flaky_write") {
            let _ran = answer.bytes().await;
            return (StatusCode::BAD_GATEWAY, "<html>502 Bad Gateway</html>").into_response();
        }
        let mut response = axum::http::Response::builder().status(answer.status());
        for (name, value) in
            answer.headers().iter().filter(|(n, _)| !matches!(n.as_str(), "content-length" | "transfer-encoding"))
        {
            response = response.header(name, value);
        }
        response.body(axum::body::Body::from_stream(answer.bytes_stream())).unwrap()
    }
}

/// A `url` server's response stream that ends before its answer fails that call alone:
/// the session goes on, and each such failure counts for the breaker (none is taken for
/// another's, as the calls one lost session took down are).
#[tokio::test]
async fn an_http_upstreams_streams_cut_short_each_count_for_the_breaker() {
    let upstream = HttpGateway::start(|d| json!({"mcpServers": {"f": faulty("f", d, &[])}}), &[]).await;
    let proxy = Proxy::start(upstream.url()).await;
    let gw = Gateway::start(|_| {
        let recovery = json!({"retry": {"max_attempts": 1}, "breaker": {"failure_threshold": 3}});
        json!({"mcpServers": {"remote": {"url": proxy, "recovery": recovery}}})
    })
    .await;
    for _ in 0..3 {
        let r = gw.call("hang", json!({})).await;
        assert!(text(&r).contains("connection lost"), "{}", text(&r));
    }
    let status = gw.call("rebound_status", json!({})).await.structured_content.unwrap();
    assert_eq!(status["servers"][0]["restarts"], 0, "one session throughout: {status}");
    let shed = gw.call("hang", json!({})).await;
    assert!(text(&shed).contains("circuit breaker"), "{}", text(&shed));
    gw.close().await;
}

/// rmcp reports every failed POST to a `url` server as a request not sent. Only a
/// connection never made proves that: a 502 that came after the upstream ran a call with
/// side effects is not a reason to run it again, and a 429's `Retry-After` is waited.
#[tokio::test]
async fn an_http_upstreams_error_status_is_read_for_what_it_says() {
    let upstream = HttpGateway::start(|d| json!({"mcpServers": {"f": faulty("f", d, &[])}}), &[]).await;
    let proxy = Proxy::start(upstream.url()).await;
    let gw = Gateway::start(|d| {
        json!({
            "mcpServers": {"remote": {"url": proxy, "recovery": {"retry": {"initial_delay_ms": 1, "max_delay_ms": 2}}}},
            "rebound": {"errors_log": d.join("errors.jsonl")},
        })
    })
    .await;

    let r = gw.call("flaky_write", json!({"q": "order 1"})).await;
    assert_eq!(r.is_error, Some(true), "{r:?}");
    let report = &r.meta.as_ref().unwrap().0["rebound"];
    assert_eq!(report["status"], "partial", "it may have run: {report}");
    assert_eq!(report["attempts"].as_array().unwrap().len(), 1, "not replayed: {report}");
    assert!(text(&r).contains("HTTP 502"), "{}", text(&r));
    let ran = std::fs::read_to_string(upstream.dir.path().join("f/calls")).unwrap();
    assert_eq!(ran.lines().filter(|c| *c == "flaky_write").count(), 1, "{ran}");

    let r = gw.call("echo", json!({"message": "hi"})).await;
    assert_eq!(text(&r), "f: hi", "{r:?}");
    let report = &r.meta.as_ref().unwrap().0["rebound"];
    assert_eq!(report["attempts"][0]["category"], "rate-limit", "{report}");
    assert!(report["attempts"][1]["waited_ms"].as_u64().unwrap() >= 1000, "the Retry-After was waited: {report}");
    gw.close().await;
}

/// A raw 2026-07-28 client's request that declares the tasks extension, and its answer
/// (sent as JSON or as one event).
async fn modern_with_tasks(gw: &HttpGateway, id: u32, method: &str, name: &str, params: Value) -> Value {
    let mut meta = modern_meta();
    meta["io.modelcontextprotocol/clientCapabilities"] = json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
    let mut params = params;
    params["_meta"] = meta;
    let request = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    let response = post(gw, &request)
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", method)
        .header("mcp-name", name)
        .send()
        .await
        .unwrap();
    let body = response.text().await.unwrap();
    let json = body.lines().find_map(|l| l.strip_prefix("data: ").filter(|d| d.starts_with('{'))).unwrap_or(&body);
    serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// Over HTTP, where a client on 2026-07-28 has no session: the task a server on that
/// revision made for the called tool is followed by `tasks/get` in later requests, under
/// the gateway's id, to its result; `tasks/cancel` reaches it too.
#[tokio::test]
async fn over_http_a_2026_clients_task_is_followed_across_its_requests() {
    let gw =
        HttpGateway::start(|_| json!({"mcpServers": {"e": {"command": rebound_tests::bin("echo-server")}}}), &[]).await;
    let later = |ms: u64| json!({"name": "later", "arguments": {"message": "over http", "ms": ms}});
    let created = modern_with_tasks(&gw, 1, "tools/call", "later", later(50)).await;
    assert_eq!(created["result"]["resultType"], "task", "{created}");
    let id = created["result"]["taskId"].as_str().unwrap().to_owned();
    let mut n = 2;
    let done = loop {
        let got = modern_with_tasks(&gw, n, "tasks/get", &id, json!({"taskId": id})).await;
        n += 1;
        if got["result"]["status"] != "working" {
            break got;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(done["result"]["result"]["content"][0]["text"], "Later: over http", "{done}");
    assert_eq!(done["result"]["taskId"], id.as_str());

    let long = modern_with_tasks(&gw, 100, "tools/call", "later", later(600_000)).await;
    let long = long["result"]["taskId"].as_str().unwrap().to_owned();
    let cancelled = modern_with_tasks(&gw, 101, "tasks/cancel", &long, json!({"taskId": long})).await;
    assert!(cancelled.get("error").is_none(), "{cancelled}");
    let got = modern_with_tasks(&gw, 102, "tasks/get", &long, json!({"taskId": long})).await;
    assert_eq!(got["result"]["status"], "cancelled", "{got}");
}

/// Opens a session as a raw client on 2025-11-25 (`initialize`, then `initialized`).
async fn open_session(gw: &HttpGateway) -> String {
    let init = post(gw, &initialize()).send().await.unwrap();
    let session = init.headers()["mcp-session-id"].to_str().unwrap().to_owned();
    drop(init);
    let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    post(gw, &note).header("mcp-session-id", &session).send().await.unwrap();
    session
}

/// `method` with `params` in `session` (of [`open_session`]): the answer's body.
async fn in_session(gw: &HttpGateway, session: &str, method: &str, params: Value) -> String {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let sent = post(gw, &body).header("mcp-session-id", session).header("mcp-protocol-version", "2025-11-25");
    sent.send().await.unwrap().text().await.unwrap()
}

/// A client's session that ends (here by `DELETE`) takes its tasks with it: nobody can
/// reach them through the gateway any more, so those still running are cancelled on their
/// (shared) server; another session's run on.
#[tokio::test]
async fn a_sessions_running_tasks_are_cancelled_upstream_when_it_ends() {
    let gw = HttpGateway::start(|dir| json!({"mcpServers": {"a": faulty("a", dir, &["--tasks"])}}), &[]).await;
    let slow = json!({"name": "slow", "arguments": {"ms": 60000}, "task": {"ttl": 600000}});
    let (leaving, staying) = (open_session(&gw).await, open_session(&gw).await);
    let first = in_session(&gw, &leaving, "tools/call", slow.clone()).await;
    assert!(first.contains(r#""taskId":"task-1""#), "{first}");
    let second = in_session(&gw, &staying, "tools/call", slow).await;
    assert!(second.contains(r#""taskId":"task-2""#), "{second}");
    let cancelled = || std::fs::read_to_string(gw.dir.path().join("a/tasks_cancelled")).unwrap_or_default();
    assert_eq!(cancelled(), "", "nothing cancelled while both sessions last");
    let deleted = reqwest::Client::new().delete(gw.url()).header("mcp-session-id", &leaving).send().await.unwrap();
    assert!(deleted.status().is_success(), "{}", deleted.status());
    eventually("the ended session's task is cancelled upstream", || !cancelled().is_empty()).await;
    assert_eq!(cancelled(), "task-1\n", "only the ended session's");
}

/// A `url` server that restarts numbers its tasks afresh: the task id one session's
/// running task had is given to another session's new task. Neither session reaches the
/// other's task through it: the older task is unknown to its session from then on, and
/// the new one, which the gateway cannot tell from it, is cancelled and refused.
#[tokio::test]
async fn a_task_id_a_restarted_server_gives_again_reaches_neither_sessions_task() {
    let inner_dir = tempfile::tempdir().unwrap();
    let inner_config = inner_dir.path().join("inner.json");
    let inner = json!({"mcpServers": {"f": faulty("f", inner_dir.path(), &["--tasks"])}});
    std::fs::write(&inner_config, inner.to_string()).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let (mut first, base) = HttpGateway::spawn(&inner_config, &addr, &[], log.clone()).await;
    let remote = json!({"url": format!("{base}/mcp"), "protocol": "2025-11-25"});
    let gw = HttpGateway::start(|_| json!({"mcpServers": {"remote": remote}}), &[]).await;
    let (a, b) = (open_session(&gw).await, open_session(&gw).await);
    let slow = json!({"name": "slow", "arguments": {"ms": 600000}, "task": {"ttl": 600000}});
    let started = in_session(&gw, &a, "tools/call", slow).await;
    assert!(started.contains(r#""taskId":"task-1""#), "{started}");

    first.kill().await.unwrap();
    first.wait().await.unwrap();
    let (_second, _) = HttpGateway::spawn(&inner_config, &addr, &[], log).await;
    // B's answer, which A must not see: "slept 7 ms".
    let secret = json!({"name": "slow", "arguments": {"ms": 7}, "task": {"ttl": 600000}});
    let refused = in_session(&gw, &b, "tools/call", secret).await;
    assert!(refused.contains("keeps neither"), "{refused}");
    let cancelled = || std::fs::read_to_string(inner_dir.path().join("f/tasks_cancelled")).unwrap_or_default();
    eventually("the new task cancelled on the server", || cancelled() == "task-1\n").await;
    let asked = in_session(&gw, &a, "tasks/result", json!({"taskId": "task-1"})).await;
    assert!(!asked.contains("slept 7 ms") && asked.contains("unknown task"), "{asked}");
    // B calls again: a task of its own.
    let again = json!({"name": "slow", "arguments": {"ms": 9}, "task": {"ttl": 600000}});
    let made = in_session(&gw, &b, "tools/call", again).await;
    assert!(made.contains(r#""taskId":"task-2""#), "{made}");
    let result = in_session(&gw, &b, "tasks/result", json!({"taskId": "task-2"})).await;
    assert!(result.contains("f: slept 9 ms"), "{result}");
}

/// A body sent slowly holds, while it is read, what it says it will take, against its
/// client's share: one client's stalled uploads cannot hold memory outside the budget,
/// and what they held is let go of when they end.
#[tokio::test]
async fn bodies_still_arriving_count_against_their_clients_share() {
    uploads_count_while_they_arrive(&format!("Content-Length: {}\r\n\r\n{{", 4 << 20)).await;
}

/// So does a body that says no length, sent in chunks, once past 64 KiB: it holds
/// `max_body_bytes`.
#[tokio::test]
async fn chunked_bodies_still_arriving_count_against_their_clients_share() {
    let chunk = format!("{{{}", "x".repeat(64 << 10));
    uploads_count_while_they_arrive(&format!("Transfer-Encoding: chunked\r\n\r\n{:x}\r\n{chunk}\r\n", chunk.len()))
        .await;
}

/// Stalled uploads to `/mcp` from one client, their head ending with `rest` (and the
/// body's first byte): past its share, the next is refused, and once they end it is not.
async fn uploads_count_while_they_arrive(rest: &str) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let gw = HttpGateway::start(
        |dir| {
            let http = json!({"trusted_proxies": ["127.0.0.1", "::1"]});
            json!({"mcpServers": {"a": faulty("a", dir, &[])}, "rebound": {"http": http}})
        },
        &[],
    )
    .await;
    let authority = gw.base.trim_start_matches("http://").to_owned();
    let stalled = || async {
        let mut socket = tokio::net::TcpStream::connect(&authority).await.unwrap();
        let head = format!(
            "POST /mcp HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nX-Forwarded-For: 198.51.100.4\r\n{rest}"
        );
        socket.write_all(head.as_bytes()).await.unwrap();
        socket
    };
    // A quarter of the 1 GiB budget, 256 MiB, is one address's: 64 uploads of 4 MiB.
    let mut uploads = Vec::new();
    for _ in 0..64 {
        uploads.push(stalled().await);
    }
    // Once they are all being read, the next is refused at once.
    let mut refused = String::new();
    for _ in 0..20 {
        let mut next = stalled().await;
        let mut answer = vec![0u8; 1024];
        match tokio::time::timeout(Duration::from_secs(2), next.read(&mut answer)).await {
            Ok(Ok(n)) => {
                refused = String::from_utf8_lossy(&answer[..n]).into_owned();
                break;
            }
            _ => uploads.push(next),
        }
    }
    assert!(refused.starts_with("HTTP/1.1 429"), "{refused}");
    // Ended, they hold nothing: a large body of the same client's is read.
    drop(uploads);
    let padding = "x".repeat((4 << 20) - 100);
    let notification = json!({"jsonrpc": "2.0", "method": "notifications/padding", "params": {"p": padding}});
    let mut last = StatusCode::TOO_MANY_REQUESTS;
    for _ in 0..100 {
        last = post(&gw, &notification).header("x-forwarded-for", "198.51.100.4").send().await.unwrap().status();
        if last != StatusCode::TOO_MANY_REQUESTS {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_ne!(last, StatusCode::TOO_MANY_REQUESTS, "what the ended uploads held was let go of");
}

/// A call whose client went away runs on (`on_sigterm_a_call_its_client_left_is_ended_and_logged`),
/// and counts against the client's `max_concurrent_per_client` until it ends: leaving its
/// calls does not let a client run more of them at once on the servers everyone shares.
#[tokio::test]
async fn a_call_whose_client_left_still_counts_against_it_while_it_runs() {
    let gw = HttpGateway::start(
        |dir| json!({"mcpServers": {"a": faulty("a", dir, &[])}, "rebound": {"http": {"max_concurrent_per_client": 2}}}),
        &[],
    )
    .await;
    let session = open_session(&gw).await;
    let mut statuses = Vec::new();
    for id in 1..=6 {
        let call =
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "hang", "arguments": {}}});
        let sent = post(&gw, &call).header("mcp-session-id", &session).header("mcp-protocol-version", "2025-11-25");
        let answer = sent.send().await.unwrap();
        statuses.push(answer.status().as_u16());
        if answer.status() == 200 {
            let hung = id;
            eventually("the call reached the server", || {
                gw.state("a", "calls").len() >= usize::try_from(hung).unwrap().min(2)
            })
            .await;
        }
        drop(answer); // the client leaves; its call runs on
    }
    assert_eq!(statuses, [200, 200, 429, 429, 429, 429], "two calls at once, however the client left them");
    assert_eq!(gw.state("a", "calls"), ["hang", "hang"]);
}

/// A session initialises once: a second `initialize` on it is refused, and the session
/// goes on as it was, its subscriptions on a shared server ended when it ends (a second
/// one taken would have left them held there for good, against the client's address).
#[tokio::test]
async fn a_second_initialize_in_a_session_is_refused_and_loses_nothing() {
    let gw = HttpGateway::start(|dir| json!({"mcpServers": {"a": faulty("a", dir, &[])}}), &[]).await;
    let session = open_session(&gw).await;
    let uri = "faulty://a/readme";
    let subscribed = in_session(&gw, &session, "resources/subscribe", json!({"uri": uri})).await;
    assert!(subscribed.contains(r#""result":{}"#), "{subscribed}");
    let again = post(&gw, &initialize()).header("mcp-session-id", &session).send().await.unwrap().text().await.unwrap();
    assert!(again.contains("initialised already"), "{again}");
    let listed = in_session(&gw, &session, "tools/list", json!({})).await;
    assert!(listed.contains(r#""name":"echo""#), "the session goes on: {listed}");
    let deleted = reqwest::Client::new().delete(gw.url()).header("mcp-session-id", &session).send().await.unwrap();
    assert!(deleted.status().is_success(), "{}", deleted.status());
    eventually("its subscription ended upstream", || gw.state("a", "unsubscribes") == [uri]).await;
}
