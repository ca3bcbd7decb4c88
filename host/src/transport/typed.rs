//! The two messages of every tool call, read as their own types on the stdio sides.
//!
//! rmcp reads a message as any of them: it buffers the whole line, then tries each kind
//! of request (or result) in turn, building an error for each that does not fit. A
//! `tools/call` from the client is the fourteenth kind it tries, the call's answer the
//! sixteenth; reading the two that way was a third of the gateway's own time on a call
//! (`cargo xtask bench`). Here a line's top-level keys are read first (its values only
//! skipped), and a tool call, or the answer to one the gateway sent, is read as exactly
//! that type. Anything else, and anything these readers refuse, is left to rmcp's
//! reading, so what is not a tool call is read exactly as before.

use std::collections::HashSet;

use rmcp::model::{
    CallToolRequest, CallToolResult, ClientJsonRpcMessage, ClientNotification, ClientRequest, JsonRpcMessage,
    JsonRpcRequest, JsonRpcResponse, RequestId, ServerJsonRpcMessage, ServerResult,
};
use serde::Deserialize;
use serde::de::IgnoredAny;

/// A message's top-level keys, with the method's name; values are skipped, not decoded.
#[derive(Deserialize)]
struct Keys<'a> {
    #[serde(default, borrow)]
    method: Key<Option<&'a str>>,
    id: Option<RequestId>,
    #[serde(default)]
    result: Key<IgnoredAny>,
    #[serde(default)]
    error: Key<IgnoredAny>,
}

/// A key that is there (`Some`), whatever its value, `null` too (rmcp counts keys, and
/// `Option` alone would read `null` as absent), or not. (A method name with escapes is not
/// read here: the line is left to rmcp.)
struct Key<T>(Option<T>);

impl<T> Default for Key<T> {
    fn default() -> Self {
        Self(None)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Key<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        T::deserialize(deserializer).map(|value| Self(Some(value)))
    }
}

impl Keys<'_> {
    fn of(line: &[u8]) -> Option<Keys<'_>> {
        serde_json::from_slice(line).ok()
    }
}

/// A client's `tools/call` request, or `None` for any other line.
pub fn tool_call(line: &[u8]) -> Option<ClientJsonRpcMessage> {
    let keys = Keys::of(line)?;
    // A request is a method with an id and neither a result nor an error (as rmcp checks).
    let request = keys.id.is_some() && keys.result.0.is_none() && keys.error.0.is_none();
    if !request || keys.method.0.flatten() != Some("tools/call") {
        return None;
    }
    let JsonRpcRequest { jsonrpc, id, request } =
        serde_json::from_slice::<JsonRpcRequest<CallToolRequest>>(line).ok()?;
    Some(JsonRpcMessage::Request(JsonRpcRequest { jsonrpc, id, request: ClientRequest::CallToolRequest(request) }))
}

/// The `tools/call` requests sent to one server and not yet answered, so that their
/// answers are read as tool results. Bounded: past it a call's answer is simply read the
/// general way.
#[derive(Default)]
pub struct ToolCalls {
    waiting: HashSet<RequestId>,
}

/// Calls tracked at once per server; more are read the general way.
const MAX_TRACKED: usize = 1024;

impl ToolCalls {
    /// Notes what the gateway sends: a tool call's id, or a cancellation that forgets one.
    pub fn sent(&mut self, message: &rmcp::service::TxJsonRpcMessage<rmcp::RoleClient>) {
        match message {
            JsonRpcMessage::Request(JsonRpcRequest { id, request: ClientRequest::CallToolRequest(_), .. })
                if self.waiting.len() < MAX_TRACKED =>
            {
                self.waiting.insert(id.clone());
            }
            JsonRpcMessage::Notification(n) => {
                if let ClientNotification::CancelledNotification(c) = &n.notification
                    && let Some(id) = &c.params.request_id
                {
                    self.waiting.remove(id);
                }
            }
            _ => {}
        }
    }

    /// The answer to a tool call on this line, or `None` for any other line. Only a
    /// complete result is read here (`CallToolResult` refuses every other `resultType`);
    /// questions, tasks and errors are left to rmcp, as is anything else the server says.
    pub fn answer(&mut self, line: &[u8]) -> Option<ServerJsonRpcMessage> {
        let keys = Keys::of(line)?;
        if keys.method.0.is_some() {
            return None; // a request or notification of the server's
        }
        // Any answer ends the call, an error too.
        let answers_a_call = self.waiting.remove(&keys.id?);
        if !answers_a_call || keys.result.0.is_none() || keys.error.0.is_some() {
            return None;
        }
        let JsonRpcResponse { jsonrpc, id, result } =
            serde_json::from_slice::<JsonRpcResponse<CallToolResult>>(line).ok()?;
        Some(JsonRpcMessage::Response(JsonRpcResponse { jsonrpc, id, result: ServerResult::CallToolResult(result) }))
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.waiting.len()
    }
}

#[cfg(test)]
mod tests {
    use rmcp::model::{
        CallToolRequestParams, CancelledNotification, CancelledNotificationParam, JsonRpcNotification,
        JsonRpcVersion2_0, NumberOrString, RequestMetaObject,
    };
    use serde_json::json;

    use super::*;

    /// What rmcp's own reading makes of `line`, for comparison.
    fn general<T: serde::de::DeserializeOwned>(line: &[u8]) -> Option<T> {
        serde_json::from_slice(line).ok()
    }

    fn line(value: serde_json::Value) -> Vec<u8> {
        serde_json::to_vec(&value).unwrap()
    }

    #[test]
    fn a_tool_call_reads_as_rmcp_reads_it() {
        let call = line(json!({"method": "tools/call", "params": {"name": "echo", "arguments": {"m": "é\"x"},
            "_meta": {"progressToken": 7, "other": 1}}, "jsonrpc": "2.0", "id": 12}));
        let ours = tool_call(&call).expect("a tool call");
        let theirs: ClientJsonRpcMessage = general(&call).unwrap();
        assert_eq!(serde_json::to_value(&ours).unwrap(), serde_json::to_value(&theirs).unwrap());
        let meta = |message: ClientJsonRpcMessage| {
            let JsonRpcMessage::Request(JsonRpcRequest { request: ClientRequest::CallToolRequest(call), .. }) = message
            else {
                panic!("a tool call")
            };
            call.extensions.get::<RequestMetaObject>().cloned()
        };
        let ours = meta(ours);
        assert!(ours.as_ref().and_then(RequestMetaObject::get_progress_token).is_some(), "{ours:?}");
        assert_eq!(ours, meta(theirs), "_meta is read into the request's extensions, as rmcp reads it");
    }

    #[test]
    fn what_is_not_a_well_formed_tool_call_is_left_to_rmcp() {
        for other in [
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
            json!({"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "x"}}),
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "x"}, "result": {}}),
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "x"}, "result": null}),
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "x"}, "error": null}),
            json!({"jsonrpc": "2.0", "id": null, "method": "tools/call", "params": {"name": "x"}}),
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"arguments": {}}}),
            json!({"jsonrpc": "1.0", "id": 1, "method": "tools/call", "params": {"name": "x"}}),
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "method": "ping", "params": {"name": "x"}}),
            json!([{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "x"}}]),
        ] {
            assert!(tool_call(&line(other.clone())).is_none(), "{other}");
        }
        assert!(tool_call(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":").is_none());
        assert!(tool_call(b"\"method\"").is_none());
    }

    fn call_sent(calls: &mut ToolCalls, id: i64) {
        let request = CallToolRequest::new(CallToolRequestParams::new("echo"));
        calls.sent(&JsonRpcMessage::Request(JsonRpcRequest::new(
            NumberOrString::Number(id),
            ClientRequest::CallToolRequest(request),
        )));
    }

    #[test]
    fn only_the_answer_to_a_tool_call_sent_is_read_as_a_tool_result() {
        let mut calls = ToolCalls::default();
        let answer = line(json!({"result": {"content": [{"type": "text", "text": "Echo: ping"}], "isError": false,
            "structuredContent": null}, "jsonrpc": "2.0", "id": 3}));
        assert!(calls.answer(&answer).is_none(), "no call 3 was sent");
        call_sent(&mut calls, 3);
        let ours = calls.answer(&answer).expect("the answer to call 3");
        let theirs: ServerJsonRpcMessage = general(&answer).unwrap();
        assert_eq!(serde_json::to_value(&ours).unwrap(), serde_json::to_value(&theirs).unwrap());
        assert!(matches!(&theirs, JsonRpcMessage::Response(r) if matches!(r.result, ServerResult::CallToolResult(_))));
        assert_eq!(calls.len(), 0, "an answered call is forgotten");
    }

    #[test]
    fn questions_tasks_and_errors_are_left_to_rmcp_and_end_the_call() {
        let mut calls = ToolCalls::default();
        for (id, other) in [
            (1, json!({"jsonrpc": "2.0", "id": 1, "result": {"resultType": "input_required", "inputRequests": {}}})),
            (2, json!({"jsonrpc": "2.0", "id": 2, "error": {"code": -32602, "message": "no"}})),
            (3, json!({"jsonrpc": "2.0", "id": 3, "result": {}})),
        ] {
            call_sent(&mut calls, id);
            assert!(calls.answer(&line(other.clone())).is_none(), "{other}");
        }
        assert_eq!(calls.len(), 0);
        // A request of the server's with the id of a call in flight is not an answer.
        call_sent(&mut calls, 4);
        assert!(calls.answer(&line(json!({"jsonrpc": "2.0", "id": 4, "method": "ping"}))).is_none());
        let with_method = json!({"jsonrpc": "2.0", "id": 4, "method": null, "result": {"content": []}});
        assert!(calls.answer(&line(with_method)).is_none(), "a `method` key, even null, is not an answer's");
        assert_eq!(calls.len(), 1);
    }

    #[test]
    fn a_cancelled_call_is_forgotten_and_the_record_is_bounded() {
        let mut calls = ToolCalls::default();
        call_sent(&mut calls, 9);
        let cancel = CancelledNotification::new(CancelledNotificationParam::new(Some(NumberOrString::Number(9)), None));
        calls.sent(&JsonRpcMessage::Notification(JsonRpcNotification {
            jsonrpc: JsonRpcVersion2_0,
            notification: ClientNotification::CancelledNotification(cancel),
        }));
        assert_eq!(calls.len(), 0);
        for id in 0..(MAX_TRACKED as i64 + 10) {
            call_sent(&mut calls, id);
        }
        assert_eq!(calls.len(), MAX_TRACKED);
    }
}
