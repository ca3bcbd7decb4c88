//! MCP 2025-11-25's tasks over streamable HTTP, where rmcp reads every request and writes
//! every answer itself (see `gateway::tasks`). A client on 2025-11-25 (its
//! `MCP-Protocol-Version` header) that lists tools, makes a task-augmented call or asks
//! about a task has that request's method renamed to one rmcp does not model
//! ([`AS_SENT`]), so that it reaches the gateway as it was sent, and is answered as the
//! revision says, not in rmcp's shape. The answer to an `initialize` on 2025-11-25 gets the
//! `tasks` capability, which rmcp's types cannot carry.

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, header};
use axum::response::Response;
use http_body_util::BodyExt as _;
use serde_json::Value;

use super::limits::Probe;
use crate::gateway::tasks::{AS_SENT, METHODS, capability};

const REVISION: &str = "2025-11-25";

/// `body` with its method renamed, when it is one of the requests above; and whether it
/// is an `initialize` on 2025-11-25, whose answer is to be [`announce`]d. `probe` is what
/// `limit` read of the body: only a renamed body is read again.
pub(super) fn as_sent(headers: &mut HeaderMap, body: Bytes, probe: &Probe) -> (Bytes, bool) {
    let Some((method, params)) = probe.request() else { return (body, false) };
    if method == "initialize" {
        return (body, params.protocol_version.as_deref() == Some(REVISION));
    }
    let on_revision = headers.get("mcp-protocol-version").is_some_and(|v| v.as_bytes() == REVISION.as_bytes());
    let renamed = match method {
        "tools/list" => true,
        "tools/call" => params.task,
        other => METHODS.contains(&other),
    };
    if !on_revision || !renamed {
        return (body, false);
    }
    let Ok(mut message) = serde_json::from_slice::<Value>(&body) else { return (body, false) };
    message["method"] = Value::String(format!("{AS_SENT}{method}"));
    let Ok(renamed) = serde_json::to_vec(&message) else { return (body, false) };
    headers.remove(header::CONTENT_LENGTH);
    (renamed.into(), false)
}

/// `response` (to an `initialize` on 2025-11-25) with the `tasks` capability in its
/// answer, whether the answer is an SSE event or the whole JSON body.
pub(super) fn announce(response: Response) -> Response {
    let (mut parts, body) = response.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    let body = body.map_frame(|frame| frame.map_data(with_capability));
    Response::from_parts(parts, Body::new(body))
}

fn with_capability(data: Bytes) -> Bytes {
    let Ok(text) = std::str::from_utf8(&data) else { return data };
    if !text.contains(REVISION) {
        return data;
    }
    let rewritten: String = text
        .split_inclusive('\n')
        .map(|line| {
            let (head, rest) = line.strip_prefix("data: ").map_or(("", line), |rest| ("data: ", rest));
            let (json, tail) = rest.strip_suffix('\n').map_or((rest, ""), |json| (json, "\n"));
            match answer_with_tasks(json) {
                Some(json) => format!("{head}{json}{tail}"),
                None => line.to_owned(),
            }
        })
        .collect();
    rewritten.into()
}

/// The answer to `initialize` in `json`, with the capability; `None` for anything else.
fn answer_with_tasks(json: &str) -> Option<String> {
    let mut answer: Value = serde_json::from_str(json).ok()?;
    let result = answer.get_mut("result")?;
    if result["protocolVersion"] != REVISION || !result["capabilities"].is_object() {
        return None;
    }
    result["capabilities"]["tasks"] = capability();
    serde_json::to_string(&answer).ok()
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;
    use serde_json::json;

    use super::*;

    fn on_revision() -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("mcp-protocol-version", HeaderValue::from_static(REVISION));
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("10"));
        headers
    }

    fn sent(headers: &mut HeaderMap, message: Value) -> (Value, bool) {
        let body = serde_json::to_vec(&message).unwrap();
        let probe = serde_json::from_slice::<Probe>(&body).unwrap();
        let (body, initialize) = as_sent(headers, body.into(), &probe);
        (serde_json::from_slice(&body).unwrap(), initialize)
    }

    #[test]
    fn task_requests_and_tool_lists_on_2025_11_25_are_renamed_and_nothing_else() {
        let mut headers = on_revision();
        for (message, renamed) in [
            (json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}), true),
            (json!({"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"taskId": "t"}}), true),
            (json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "r", "task": {}}}), true),
            (json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "r", "task": null}}), false),
            (
                json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "r", "arguments": {"task": 1}}}),
                false,
            ),
            (json!({"jsonrpc": "2.0", "method": "tasks/get", "params": {"taskId": "t"}}), false),
            (json!([{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}]), false),
        ] {
            let (body, _) = sent(&mut headers, message.clone());
            let method = message["method"].as_str().unwrap_or_default();
            let expected = if renamed { format!("{AS_SENT}{method}") } else { method.to_owned() };
            assert_eq!(body["method"].as_str().unwrap_or_default(), expected, "{message}");
        }
        assert!(headers.get(header::CONTENT_LENGTH).is_none(), "the body's length changed");
        // An escaped key is the key; a call whose arguments say `initialize` is a call.
        let escaped = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"r","\u0074ask":{},"arguments":{"step":"initialize"}}}"#;
        let probe = serde_json::from_slice::<Probe>(escaped).unwrap();
        let (body, initialize) = as_sent(&mut on_revision(), escaped.to_vec().into(), &probe);
        assert!(!initialize);
        assert_eq!(serde_json::from_slice::<Value>(&body).unwrap()["method"], format!("{AS_SENT}tools/call"));
        // Another revision: as sent.
        let (body, _) = sent(&mut HeaderMap::new(), json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}));
        assert_eq!(body["method"], "tools/list");
    }

    #[tokio::test]
    async fn the_answer_to_initialize_on_2025_11_25_carries_the_tasks_capability() {
        let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": REVISION}});
        assert!(sent(&mut HeaderMap::new(), init).1);
        let older =
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18"}});
        assert!(!sent(&mut HeaderMap::new(), older).1);
        let answer =
            json!({"jsonrpc": "2.0", "id": 1, "result": {"protocolVersion": REVISION, "capabilities": {"tools": {}}}});
        let sse = format!("data: \nid: 0\nretry: 3000\n\ndata: {answer}\n\n");
        let response = announce(Response::new(Body::from(sse)));
        let text = String::from_utf8(response.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
        let event = text.lines().find_map(|l| l.strip_prefix("data: {")).expect("the answer");
        let answer: Value = serde_json::from_str(&format!("{{{event}")).unwrap();
        assert_eq!(answer["result"]["capabilities"]["tasks"], capability());
        assert_eq!(answer["result"]["capabilities"]["tools"], json!({}));
        assert!(text.starts_with("data: \nid: 0\nretry: 3000\n\n"), "{text}");
    }
}
