//! The two messages of every tool call, read as their own types on the stdio sides; and
//! the messages of MCP 2025-11-25's tasks, which rmcp's types would change, read as
//! they are.
//!
//! rmcp reads a message as any of them: it buffers the whole line, then tries each kind
//! of request (or result) in turn, building an error for each that does not fit. A
//! `tools/call` from the client is the fourteenth kind it tries, the call's answer the
//! sixteenth; reading the two that way was a third of the gateway's own time on a call
//! (`cargo xtask bench`). Here a line's top-level keys are read first (its values only
//! skipped), and a tool call, or the answer to one the gateway sent, is read as exactly
//! that type. Anything else, and anything these readers refuse, is left to rmcp's
//! reading, so what is not a tool call is read exactly as before.
//!
//! rmcp 3.9 models tasks as the later extension (SEP-2663), whose `tasks/get` has another
//! shape, and drops a call's `task`. So a client's task-augmented `tools/call` and its
//! `tasks/*` requests are read as custom requests with their params as sent, and the
//! answers to what the gateway sends a server as a custom request are read as they are;
//! so is a server's request that asks the client to run it as a task ([`Awaited::answer`]).

use std::collections::HashMap;

use rmcp::model::ServerRequest;
use rmcp::model::{
    CallToolRequest, CallToolResult, ClientJsonRpcMessage, ClientNotification, ClientRequest, CustomRequest,
    CustomResult, JsonRpcMessage, JsonRpcRequest, JsonRpcResponse, JsonRpcVersion2_0, ProtocolVersion, RequestId,
    ServerJsonRpcMessage, ServerResult,
};
use serde::Deserialize;
use serde::de::IgnoredAny;

use super::tasks::ClientTaskRequest;

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
    /// `params`'s keys, for a `tools/call`'s `task`.
    #[serde(default)]
    params: Key<ParamKeys>,
}

#[derive(Deserialize)]
struct ParamKeys {
    /// Present and not `null`: the call is to run as a task (MCP 2025-11-25).
    #[serde(default)]
    task: Option<IgnoredAny>,
}

/// A value read as `T` when it is one, else as absent (never failing the line's reading).
struct Lenient<T>(Option<T>);

impl<T> Default for Lenient<T> {
    fn default() -> Self {
        Self(None)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Lenient<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either<T> {
            Is(T),
            Not(IgnoredAny),
        }
        Ok(Self(match Either::<T>::deserialize(deserializer)? {
            Either::Is(value) => Some(value),
            Either::Not(_) => None,
        }))
    }
}

/// Whether the request on `line` says it is on a revision with tasks of its own (the
/// extension of 2026-07-28, which names its revision in every request's `_meta`): its
/// `task` and `tasks/*` are not 2025-11-25's. Read again, leniently, only for the requests
/// it decides, off the path of every other line.
fn modern(line: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct Line {
        #[serde(default)]
        params: Lenient<Params>,
    }
    #[derive(Deserialize)]
    struct Params {
        #[serde(default, rename = "_meta")]
        meta: Lenient<Meta>,
    }
    #[derive(Deserialize)]
    struct Meta {
        #[serde(default, rename = "io.modelcontextprotocol/protocolVersion")]
        version: Option<ProtocolVersion>,
    }
    let line = serde_json::from_slice::<Line>(line).ok();
    let version = line.and_then(|l| l.params.0).and_then(|p| p.meta.0).and_then(|m| m.version);
    version.is_some_and(|v| !v.has_initialize())
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

    /// A request is a method with an id and neither a result nor an error (as rmcp checks).
    fn is_request(&self) -> bool {
        self.id.is_some() && self.result.0.is_none() && self.error.0.is_none()
    }
}

/// A client's `tools/call` request, or a request about tasks, or `None` for any other line.
pub fn client_request(line: &[u8]) -> Option<ClientJsonRpcMessage> {
    let keys = Keys::of(line)?;
    let request = keys.is_request();
    match keys.method.0.flatten() {
        Some("tools/call") if request && keys.params.0.as_ref().is_some_and(|p| p.task.is_some()) && !modern(line) => {
            as_it_is(line)
        }
        Some("tools/call") if request => {
            let JsonRpcRequest { jsonrpc, id, request } =
                serde_json::from_slice::<JsonRpcRequest<CallToolRequest>>(line).ok()?;
            Some(JsonRpcMessage::Request(JsonRpcRequest {
                jsonrpc,
                id,
                request: ClientRequest::CallToolRequest(request),
            }))
        }
        Some(method) if request && super::tasks::METHODS.contains(&method) && !modern(line) => as_it_is(line),
        _ => None,
    }
}

/// A request read as a custom one: its method and params exactly as sent (`_meta`
/// included, which rmcp's reading would take out of them).
fn as_it_is(line: &[u8]) -> Option<ClientJsonRpcMessage> {
    let JsonRpcRequest { jsonrpc, id, request } = custom(line)?;
    Some(JsonRpcMessage::Request(JsonRpcRequest { jsonrpc, id, request: ClientRequest::CustomRequest(request) }))
}

/// The request on `line` as a custom one, whoever sent it; `None` for params that are not
/// an object, which rmcp's reading refuses with its own error.
fn custom(line: &[u8]) -> Option<JsonRpcRequest<CustomRequest>> {
    #[derive(Deserialize)]
    struct Raw {
        jsonrpc: JsonRpcVersion2_0,
        id: RequestId,
        method: String,
        params: Option<serde_json::Value>,
    }
    let Raw { jsonrpc, id, method, params } = serde_json::from_slice(line).ok()?;
    if params.as_ref().is_some_and(|p| !p.is_object()) {
        return None;
    }
    Some(JsonRpcRequest { jsonrpc, id, request: CustomRequest::new(method, params) })
}

/// A server's request that asks the client to run it as a task (MCP 2025-11-25: a
/// `sampling/createMessage` or `elicitation/create` with a `task`), read as a custom
/// request with its params as sent, since rmcp's types would drop the `task`; `None` for
/// any other message of the server's.
fn task_augmented(keys: &Keys<'_>, line: &[u8]) -> Option<ServerJsonRpcMessage> {
    let method = keys.method.0.flatten()?;
    let task = keys.params.0.as_ref().is_some_and(|p| p.task.is_some());
    if !keys.is_request() || !task || ClientTaskRequest::of(method).is_none() {
        return None;
    }
    let JsonRpcRequest { jsonrpc, id, request } = custom(line)?;
    Some(JsonRpcMessage::Request(JsonRpcRequest { jsonrpc, id, request: ServerRequest::CustomRequest(request) }))
}

/// What the gateway sent a server that its answer is read for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sent {
    /// A `tools/call`: its answer is read as a tool result.
    ToolCall,
    /// A custom request: its answer is passed on as it is.
    Custom,
    /// `tools/list` and `initialize`: rmcp reads their answers; what its types drop is
    /// read too ([`super::tasks::Dropped`]).
    ToolList,
    Initialize,
}

/// The requests sent to one server and not yet answered whose answers are read here.
/// Bounded: past it an answer is simply read the general way.
#[derive(Default)]
pub struct Awaited {
    waiting: HashMap<RequestId, Sent>,
}

/// Requests tracked at once per server; more are read the general way.
const MAX_TRACKED: usize = 1024;

impl Awaited {
    /// Notes what the gateway sends: a request whose answer is read here, or a
    /// cancellation that forgets one.
    pub fn sent(&mut self, message: &rmcp::service::TxJsonRpcMessage<rmcp::RoleClient>) {
        match message {
            // A custom request's answer read the general way could take another shape,
            // so those are always tracked (the gateway sends them only for a client's
            // request about a task, which its limits bound).
            JsonRpcMessage::Request(JsonRpcRequest { id, request, .. })
                if self.waiting.len() < MAX_TRACKED || matches!(request, ClientRequest::CustomRequest(_)) =>
            {
                let kind = match request {
                    ClientRequest::CallToolRequest(_) => Sent::ToolCall,
                    ClientRequest::CustomRequest(_) => Sent::Custom,
                    ClientRequest::ListToolsRequest(_) => Sent::ToolList,
                    ClientRequest::InitializeRequest(_) => Sent::Initialize,
                    _ => return,
                };
                self.waiting.insert(id.clone(), kind);
            }
            JsonRpcMessage::Notification(n) => {
                if let ClientNotification::CancelledNotification(c) = &n.notification
                    && let Some(id) = &c.params.request_id
                {
                    self.take(id);
                }
            }
            _ => {}
        }
    }

    /// The answer on this line when it is read here, or `None` for rmcp to read. Only a
    /// complete result of a tool call is read as one (`CallToolResult` refuses every other
    /// `resultType`); questions, tasks and errors are left to rmcp, as is anything else the
    /// server says but a request to be run as a task (`task_augmented`). The answer to a
    /// custom request is its result as it is.
    pub fn answer(&mut self, line: &[u8], dropped: &super::tasks::Dropped) -> Option<ServerJsonRpcMessage> {
        let keys = Keys::of(line)?;
        if keys.method.0.is_some() {
            return task_augmented(&keys, line); // a request or notification of the server's
        }
        // Any answer ends the wait, an error too.
        let sent = self.take(&keys.id?)?;
        if keys.result.0.is_none() || keys.error.0.is_some() {
            return None;
        }
        let (jsonrpc, id, result) = match sent {
            Sent::ToolCall => {
                let JsonRpcResponse { jsonrpc, id, result } =
                    serde_json::from_slice::<JsonRpcResponse<CallToolResult>>(line).ok()?;
                (jsonrpc, id, ServerResult::CallToolResult(result))
            }
            Sent::Custom => {
                let JsonRpcResponse { jsonrpc, id, result } =
                    serde_json::from_slice::<JsonRpcResponse<CustomResult>>(line).ok()?;
                (jsonrpc, id, ServerResult::CustomResult(result))
            }
            Sent::ToolList => {
                dropped.read_tools(line);
                return None;
            }
            Sent::Initialize => {
                dropped.read_initialize(line);
                return None;
            }
        };
        Some(JsonRpcMessage::Response(JsonRpcResponse { jsonrpc, id, result }))
    }

    /// Whether no answer is awaited.
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Forgets request `id`: it will not be answered (its sending failed), or its answer
    /// will not be read (it was too long).
    pub fn forget(&mut self, id: &RequestId) {
        self.take(id);
    }

    /// What request `id` was, no longer awaited. An id echoed as a string of its number
    /// (`"7"` for `7`) is the same request, as rmcp reads it.
    fn take(&mut self, id: &RequestId) -> Option<Sent> {
        self.waiting.remove(id).or_else(|| match id {
            RequestId::String(s) => s.parse().ok().and_then(|n| self.waiting.remove(&RequestId::Number(n))),
            RequestId::Number(_) => None,
        })
    }

    /// How many answers are awaited.
    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    #[cfg(test)]
    fn answer_to(&mut self, line: &[u8]) -> Option<ServerJsonRpcMessage> {
        self.answer(line, &super::tasks::Dropped::default())
    }
}

#[cfg(test)]
mod tests {
    use rmcp::model::{
        CallToolRequestParams, CancelledNotification, CancelledNotificationParam, JsonRpcNotification,
        JsonRpcVersion2_0, NumberOrString, RequestMetaObject,
    };
    use serde_json::json;

    use super::super::tasks::{Dropped, TaskSupport};
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
        let ours = client_request(&call).expect("a tool call");
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
            assert!(client_request(&line(other.clone())).is_none(), "{other}");
        }
        assert!(
            client_request(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":").is_none()
        );
        assert!(client_request(b"\"method\"").is_none());
    }

    fn call_sent(calls: &mut Awaited, id: i64) {
        let request = CallToolRequest::new(CallToolRequestParams::new("echo"));
        calls.sent(&JsonRpcMessage::Request(JsonRpcRequest::new(
            NumberOrString::Number(id),
            ClientRequest::CallToolRequest(request),
        )));
    }

    #[test]
    fn only_the_answer_to_a_tool_call_sent_is_read_as_a_tool_result() {
        let mut calls = Awaited::default();
        let answer = line(json!({"result": {"content": [{"type": "text", "text": "Echo: ping"}], "isError": false,
            "structuredContent": null}, "jsonrpc": "2.0", "id": 3}));
        assert!(calls.answer(&answer, &Dropped::default()).is_none(), "no call 3 was sent");
        call_sent(&mut calls, 3);
        let ours = calls.answer(&answer, &Dropped::default()).expect("the answer to call 3");
        let theirs: ServerJsonRpcMessage = general(&answer).unwrap();
        assert_eq!(serde_json::to_value(&ours).unwrap(), serde_json::to_value(&theirs).unwrap());
        assert!(matches!(&theirs, JsonRpcMessage::Response(r) if matches!(r.result, ServerResult::CallToolResult(_))));
        assert_eq!(calls.len(), 0, "an answered call is forgotten");
        // Its id echoed as a string of its number is the same call, as rmcp reads it.
        call_sent(&mut calls, 4);
        let echoed = line(json!({"jsonrpc": "2.0", "id": "4", "result": {"content": []}}));
        assert!(calls.answer(&echoed, &Dropped::default()).is_some());
        call_sent(&mut calls, 5);
        calls.forget(&NumberOrString::String("5".into()));
        assert_eq!(calls.len(), 0);
    }

    #[test]
    fn questions_tasks_and_errors_are_left_to_rmcp_and_end_the_call() {
        let mut calls = Awaited::default();
        for (id, other) in [
            (1, json!({"jsonrpc": "2.0", "id": 1, "result": {"resultType": "input_required", "inputRequests": {}}})),
            (2, json!({"jsonrpc": "2.0", "id": 2, "error": {"code": -32602, "message": "no"}})),
            (3, json!({"jsonrpc": "2.0", "id": 3, "result": {}})),
        ] {
            call_sent(&mut calls, id);
            assert!(calls.answer_to(&line(other.clone())).is_none(), "{other}");
        }
        assert_eq!(calls.len(), 0);
        // A request of the server's with the id of a call in flight is not an answer.
        call_sent(&mut calls, 4);
        assert!(calls.answer_to(&line(json!({"jsonrpc": "2.0", "id": 4, "method": "ping"}))).is_none());
        let with_method = json!({"jsonrpc": "2.0", "id": 4, "method": null, "result": {"content": []}});
        assert!(calls.answer_to(&line(with_method)).is_none(), "a `method` key, even null, is not an answer's");
        assert_eq!(calls.len(), 1);
    }

    #[test]
    fn a_cancelled_call_is_forgotten_and_the_record_is_bounded() {
        let mut calls = Awaited::default();
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

    fn custom(message: ClientJsonRpcMessage) -> (String, Option<serde_json::Value>) {
        let JsonRpcMessage::Request(JsonRpcRequest { request: ClientRequest::CustomRequest(c), .. }) = message else {
            panic!("a custom request: {message:?}")
        };
        (c.method, c.params)
    }

    #[test]
    fn task_requests_are_read_as_they_are_and_a_plain_call_stays_a_tool_call() {
        let params = json!({"name": "research", "arguments": {"topic": "x"}, "task": {"ttl": 60000},
            "_meta": {"progressToken": 1}});
        let call = line(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}));
        assert_eq!(custom(client_request(&call).unwrap()), ("tools/call".to_owned(), Some(params)));
        for method in super::super::tasks::METHODS {
            let params = json!({"taskId": "t-1", "_meta": {"k": 1}});
            let request = line(json!({"jsonrpc": "2.0", "id": 2, "method": method, "params": params}));
            assert_eq!(custom(client_request(&request).unwrap()), (method.to_owned(), Some(params)));
        }
        // An escaped key is the same key.
        let escaped = br#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"r","\u0074ask":{}}}"#;
        assert_eq!(custom(client_request(escaped).unwrap()).0, "tools/call");
        // `task` inside the arguments, or `null`, or a notification, is not a task-augmented call.
        for params in [json!({"name": "todo", "arguments": {"task": "buy milk"}}), json!({"name": "x", "task": null})] {
            let plain = line(json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": params}));
            assert!(matches!(
                client_request(&plain),
                Some(JsonRpcMessage::Request(JsonRpcRequest { request: ClientRequest::CallToolRequest(_), .. }))
            ));
        }
        let note = line(json!({"jsonrpc": "2.0", "method": "tasks/get", "params": {"taskId": "t"}}));
        assert!(client_request(&note).is_none());
        let odd = line(json!({"jsonrpc": "2.0", "id": 4, "method": "tasks/get", "params": [1]}));
        assert!(client_request(&odd).is_none(), "left to rmcp, which refuses it");
        // A `_meta` that names no revision, or is not even an object, leaves them as they are.
        for meta in [json!("odd"), json!({"io.modelcontextprotocol/protocolVersion": 7}), json!(null)] {
            let params = json!({"name": "r", "task": {"ttl": 1}, "_meta": meta});
            let call = line(json!({"jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": params}));
            assert_eq!(custom(client_request(&call).unwrap()).0, "tools/call", "{meta}");
        }
    }

    /// A client on 2026-07-28 has tasks of its own: its `task` is not 2025-11-25's (the
    /// call stays a tool call), and its `tasks/*` are left to rmcp.
    #[test]
    fn a_2026_clients_tasks_are_not_read_as_2025_11_25s() {
        let meta = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28"});
        let params = json!({"name": "r", "task": {"ttl": 1}, "_meta": meta});
        let call = line(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}));
        assert!(matches!(
            client_request(&call),
            Some(JsonRpcMessage::Request(JsonRpcRequest { request: ClientRequest::CallToolRequest(_), .. }))
        ));
        let get =
            line(json!({"jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": {"taskId": "t", "_meta": meta}}));
        assert!(client_request(&get).is_none());
    }

    #[test]
    fn a_custom_requests_answer_is_read_as_it_is_and_listings_feed_what_rmcp_drops() {
        let mut sent = Awaited::default();
        let custom = CustomRequest::new("tasks/get", Some(json!({"taskId": "t"})));
        sent.sent(&JsonRpcMessage::Request(JsonRpcRequest::new(
            NumberOrString::Number(5),
            ClientRequest::CustomRequest(custom),
        )));
        let task = json!({"taskId": "t", "status": "working", "ttl": 60000, "pollInterval": 1000,
            "createdAt": "2026-01-01T00:00:00Z", "lastUpdatedAt": "2026-01-01T00:00:00Z"});
        let answer = sent.answer_to(&line(json!({"jsonrpc": "2.0", "id": 5, "result": task}))).expect("read here");
        let JsonRpcMessage::Response(JsonRpcResponse { result: ServerResult::CustomResult(result), .. }) = answer
        else {
            panic!("{answer:?}")
        };
        assert_eq!(result.0, task, "exactly as the server said it");
        let list = rmcp::model::ListToolsRequest::default();
        sent.sent(&JsonRpcMessage::Request(JsonRpcRequest::new(
            NumberOrString::Number(6),
            ClientRequest::ListToolsRequest(list),
        )));
        let dropped = Dropped::default();
        let page = line(json!({"jsonrpc": "2.0", "id": 6, "result": {"tools": [
            {"name": "r", "inputSchema": {"type": "object"}, "execution": {"taskSupport": "optional"}}]}}));
        assert!(sent.answer(&page, &dropped).is_none(), "rmcp reads the listing");
        assert_eq!(dropped.take_listed()["r"], TaskSupport::Optional);
    }

    #[test]
    fn a_servers_request_to_be_run_as_a_task_is_read_as_it_was_sent_and_no_other() {
        let mut awaited = Awaited::default();
        let asked = json!({"jsonrpc": "2.0", "id": 3, "method": "sampling/createMessage", "params": {
            "task": {"ttl": 300000}, "messages": [], "maxTokens": 10, "_meta": {"k": 1}}});
        let read = awaited.answer_to(&line(asked.clone())).expect("read here");
        let JsonRpcMessage::Request(JsonRpcRequest { request: ServerRequest::CustomRequest(custom), .. }) = read else {
            panic!("{read:?}")
        };
        assert_eq!(custom.method, "sampling/createMessage");
        assert_eq!(custom.params, Some(asked["params"].clone()), "the task and `_meta` kept");
        let elicit = json!({"jsonrpc": "2.0", "id": "e", "method": "elicitation/create", "params": {"task": {}, "message": "m"}});
        assert!(awaited.answer_to(&line(elicit)).is_some());
        // Without a task, another method, a notification, odd params: rmcp reads them.
        for other in [
            json!({"jsonrpc": "2.0", "id": 3, "method": "sampling/createMessage", "params": {"messages": [], "maxTokens": 1}}),
            json!({"jsonrpc": "2.0", "id": 3, "method": "sampling/createMessage", "params": {"task": null}}),
            json!({"jsonrpc": "2.0", "id": 3, "method": "roots/list", "params": {"task": {}}}),
            json!({"jsonrpc": "2.0", "method": "elicitation/create", "params": {"task": {}}}),
            json!({"jsonrpc": "2.0", "id": 3, "method": "elicitation/create", "params": [1]}),
        ] {
            assert!(awaited.answer_to(&line(other.clone())).is_none(), "{other}");
        }
    }
}
