//! OpenTelemetry: a test OTLP receiver (OTLP/HTTP with JSON) gets the spans of a recovered
//! call, the call's and its attempts', continuing the client's `traceparent`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use rebound_tests::{HttpGateway, faulty};
use serde_json::{Value, json};

const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

/// Receives OTLP/HTTP JSON exports; returns its address and every span received.
async fn receiver() -> (String, Arc<Mutex<Vec<Value>>>) {
    let spans = Arc::new(Mutex::new(Vec::new()));
    let kept = spans.clone();
    let app = Router::new().route(
        "/v1/traces",
        post(move |body: String| {
            let kept = kept.clone();
            async move {
                let doc: Value = serde_json::from_str(&body).unwrap_or_default();
                for rs in doc["resourceSpans"].as_array().into_iter().flatten() {
                    for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
                        kept.lock().unwrap().extend(ss["spans"].as_array().into_iter().flatten().cloned());
                    }
                }
                "{}"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), spans)
}

fn attribute<'a>(span: &'a Value, key: &str) -> Option<&'a Value> {
    let value = &span["attributes"].as_array()?.iter().find(|a| a["key"] == key)?["value"];
    value.get("stringValue").or_else(|| value.get("intValue"))
}

#[tokio::test]
async fn a_recovered_call_is_one_span_with_a_child_per_attempt_continuing_the_clients_trace() {
    let (endpoint, spans) = receiver().await;
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
    ];
    let gw = HttpGateway::start(
        |dir| {
            let mut a = faulty("a", dir, &[]);
            a["recovery"] = json!({"retry": {"initial_delay_ms": 10}});
            json!({"mcpServers": {"a": a}})
        },
        &env,
    )
    .await;
    let http = reqwest::Client::new();
    let post = |body: Value, session: Option<&str>| {
        let mut r = http
            .post(gw.url())
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(body.to_string());
        if let Some(s) = session {
            r = r.header("mcp-session-id", s).header("mcp-protocol-version", "2025-11-25");
        }
        r
    };
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "traced", "version": "0"}}});
    let response = post(init, None).send().await.unwrap();
    let session = response.headers()["mcp-session-id"].to_str().unwrap().to_owned();
    drop(response);
    post(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}), Some(&session)).send().await.unwrap();
    // `flaky` aborts every fifth call: the fifth is retried and recovers. Only that one
    // carries the client's trace, in the HTTP header.
    for i in 1..=5 {
        let call = json!({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {"name": "flaky", "arguments": {"q": i.to_string()}}});
        let mut request = post(call, Some(&session));
        if i == 5 {
            request = request.header("traceparent", format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"));
        }
        let answer = request.send().await.unwrap().text().await.unwrap();
        assert!(answer.contains("flaky"), "{answer}");
    }

    let mut ours = Vec::new();
    for _ in 0..100 {
        ours = spans.lock().unwrap().iter().filter(|s| s["traceId"] == CLIENT_TRACE).cloned().collect();
        if ours.len() >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let call =
        ours.iter().find(|s| s["name"] == "tools/call flaky").unwrap_or_else(|| panic!("no call span: {ours:#?}"));
    assert_eq!(call["parentSpanId"], CLIENT_SPAN, "the client's trace continues");
    assert_eq!(attribute(call, "rebound.outcome").unwrap(), "recovered");
    let attempts: Vec<&Value> = ours.iter().filter(|s| s["name"] == "attempt a/flaky").collect();
    assert_eq!(attempts.len(), 2, "{ours:#?}");
    for attempt in &attempts {
        assert_eq!(attempt["parentSpanId"], call["spanId"]);
        assert_eq!(attribute(attempt, "rebound.role").unwrap(), "primary");
    }
    assert_eq!(attribute(attempts[0], "error.type").unwrap(), "timeout");
    assert_eq!(attribute(attempts[1], "rebound.outcome").unwrap(), "ok");
    assert!(attribute(attempts[1], "rebound.retry.waited_ms").is_some());
    // The calls without a traceparent are traces of their own.
    let others = spans
        .lock()
        .unwrap()
        .iter()
        .filter(|s| s["name"] == "tools/call flaky" && s["traceId"] != CLIENT_TRACE)
        .count();
    assert_eq!(others, 4);
}
