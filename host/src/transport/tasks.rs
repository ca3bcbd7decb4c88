//! What MCP 2025-11-25's tasks add to a server's answers, which rmcp 3.9's types drop: a
//! tool's `execution.taskSupport`, and the server's `tasks` capability (task-augmented
//! `tools/call`). rmcp models only the later tasks extension (SEP-2663), so these are read
//! from the server's own messages, next to rmcp's reading: a stdio server's lines, which
//! the gateway frames itself, and a `url` server's HTTP answers ([`super::http_client`]).
//!
//! Tasks also run the other way: a client may say (its own `tasks` capability) that it runs
//! a server's sampling and elicitation requests as tasks, which the server then polls with
//! `tasks/*` requests of its own. rmcp drops that capability and a request's `task` too:
//! [`ClientTasks`] carries the first to a server's `initialize` (written by
//! [`super::lines::ServerLines`], or posted by [`super::http_client::Tapped`]), and
//! [`super::typed::Awaited::answer`] reads the second as it was sent (from a stdio
//! server's lines, or a `url` server's SSE events).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use rmcp::model::{ClientJsonRpcMessage, ClientRequest, JsonRpcMessage, JsonRpcRequest};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::lasting::Locked;

/// The methods of MCP 2025-11-25's tasks, which a client sends about a task it started.
pub const METHODS: [&str; 4] = ["tasks/get", "tasks/result", "tasks/list", "tasks/cancel"];

/// A server-to-client request a client may be asked to run as a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientTaskRequest {
    Sampling,
    Elicitation,
}

impl ClientTaskRequest {
    const ALL: [Self; 2] = [Self::Sampling, Self::Elicitation];

    /// The request with `method`, if it is one.
    pub fn of(method: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.method() == method)
    }

    pub fn method(self) -> &'static str {
        match self {
            Self::Sampling => "sampling/createMessage",
            Self::Elicitation => "elicitation/create",
        }
    }

    /// Where a client's `tasks` capability names it: `requests.KIND.METHOD`, its method's
    /// two halves.
    fn in_capability(self) -> (&'static str, &'static str) {
        self.method().split_once('/').expect("a method is `kind/name`")
    }
}

/// A client's MCP 2025-11-25 `tasks` capability as the gateway relays it to servers: which
/// [`ClientTaskRequest`]s it runs as tasks, and whether it lists and cancels them;
/// nothing else it said (the capability is rebuilt, not copied, so a client cannot make
/// the gateway send a server what it does not understand).
#[derive(Debug, Clone, PartialEq)]
pub struct ClientTasks(Value);

impl ClientTasks {
    /// What of `tasks` (the capability as the client sent it) is relayed; `None` when it
    /// runs none of the requests as tasks.
    pub fn of(tasks: &Value) -> Option<Self> {
        let mut requests = serde_json::Map::new();
        for (kind, method) in ClientTaskRequest::ALL.map(ClientTaskRequest::in_capability) {
            if tasks["requests"][kind][method].is_object() {
                requests.insert(kind.to_owned(), serde_json::json!({ method: {} }));
            }
        }
        if requests.is_empty() {
            return None;
        }
        let mut relayed = serde_json::json!({ "requests": requests });
        for key in ["list", "cancel"] {
            if tasks[key].is_object() {
                relayed[key] = serde_json::json!({});
            }
        }
        Some(Self(relayed))
    }

    /// The capability to put in `initialize`'s `capabilities.tasks`.
    pub fn value(&self) -> &Value {
        &self.0
    }

    /// `message` as sent to a server told of these tasks: `None` when it is not an
    /// `initialize` (sent as it is), else that request with the capability in it.
    pub fn in_initialize(tasks: Option<&Self>, message: &ClientJsonRpcMessage) -> serde_json::Result<Option<Value>> {
        let (Some(tasks), JsonRpcMessage::Request(JsonRpcRequest { request: ClientRequest::InitializeRequest(_), .. })) =
            (tasks, message)
        else {
            return Ok(None);
        };
        let mut value = serde_json::to_value(message)?;
        value["params"]["capabilities"]["tasks"] = tasks.value().clone();
        Ok(Some(value))
    }

    /// Reads the capability from a client's `initialize` (a line rmcp reads too).
    pub fn read_initialize(line: &[u8]) -> Option<Self> {
        #[derive(Deserialize)]
        struct Request {
            params: Params,
        }
        #[derive(Deserialize)]
        struct Params {
            capabilities: Capabilities,
        }
        #[derive(Deserialize)]
        struct Capabilities {
            tasks: Option<Value>,
        }
        let request = serde_json::from_slice::<Request>(line).ok()?;
        Self::of(request.params.capabilities.tasks.as_ref()?)
    }
}

/// A tool's `execution.taskSupport`: whether it may, or must, be called as a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskSupport {
    Forbidden,
    Optional,
    Required,
}

impl TaskSupport {
    /// Whether a task-augmented call of the tool may be sent.
    pub fn allows_tasks(self) -> bool {
        self != Self::Forbidden
    }
}

/// What one server instance's answers said that rmcp's types drop. Filled by its
/// transport as answers arrive, taken by the listing that asked.
#[derive(Debug, Default)]
pub struct Dropped {
    task_calls: AtomicBool,
    /// Tool name → its task support, from the `tools/list` pages read since last taken.
    listed: Mutex<HashMap<String, TaskSupport>>,
    /// Held by the listing that reads `listed`: two at once would take each other's pages.
    listing: tokio::sync::Mutex<()>,
}

/// At most this many tools' task support is kept per listing (a server's tool list is
/// already bounded by the message size; this bounds what a hostile one makes us keep).
const MAX_TOOLS: usize = 4096;

impl Dropped {
    /// Whether the server takes task-augmented `tools/call` (`tasks.requests.tools.call`).
    pub fn task_calls(&self) -> bool {
        self.task_calls.load(Ordering::Relaxed)
    }

    /// The tools of the listing `list` makes (all its pages), and their task support: none
    /// when the server does not take task-augmented calls.
    pub async fn listing<T, E>(
        &self,
        list: impl Future<Output = Result<T, E>>,
    ) -> Result<(T, HashMap<String, TaskSupport>), E> {
        let _turn = self.listing.lock().await;
        self.take_listed(); // what a listing given up on left
        let tools = list.await?;
        let listed = self.take_listed();
        Ok((tools, if self.task_calls() { listed } else { HashMap::new() }))
    }

    pub(super) fn take_listed(&self) -> HashMap<String, TaskSupport> {
        std::mem::take(&mut *self.listed.locked())
    }

    /// Reads an answer to `initialize` (a line rmcp reads too).
    pub fn read_initialize(&self, line: &[u8]) {
        #[derive(Deserialize)]
        struct Answer {
            result: InitializeResult,
        }
        #[derive(Deserialize)]
        struct InitializeResult {
            capabilities: Capabilities,
        }
        #[derive(Deserialize)]
        struct Capabilities {
            tasks: Option<Value>,
        }
        let Ok(answer) = serde_json::from_slice::<Answer>(line) else { return };
        let calls =
            answer.result.capabilities.tasks.as_ref().is_some_and(|t| t["requests"]["tools"]["call"].is_object());
        self.task_calls.store(calls, Ordering::Relaxed);
    }

    /// Reads one page of `tools/list` (a line rmcp reads too). A value that is not one of
    /// the three is ignored, as if the tool had said nothing.
    pub fn read_tools(&self, line: &[u8]) {
        #[derive(Deserialize)]
        struct Answer {
            result: Page,
        }
        #[derive(Deserialize)]
        struct Page {
            tools: Vec<ToolExecution>,
        }
        #[derive(Deserialize)]
        struct ToolExecution {
            name: Option<String>,
            execution: Option<Value>,
        }
        let Ok(answer) = serde_json::from_slice::<Answer>(line) else { return };
        let mut listed = self.listed.locked();
        // A name listed twice is the first tool of that name (as the listing keeps it).
        let mut seen = std::collections::HashSet::new();
        for tool in answer.result.tools {
            let Some(name) = tool.name.filter(|n| seen.insert(n.clone())) else { continue };
            let Some(execution) = tool.execution else { continue };
            let Ok(support) = serde_json::from_value::<TaskSupport>(execution["taskSupport"].clone()) else { continue };
            if listed.len() < MAX_TOOLS {
                listed.entry(name).or_insert(support);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn line(value: Value) -> Vec<u8> {
        serde_json::to_vec(&value).unwrap()
    }

    #[test]
    fn a_servers_task_support_is_read_and_what_is_not_one_ignored() {
        let dropped = Dropped::default();
        dropped.read_initialize(&line(json!({"jsonrpc": "2.0", "id": 0, "result": {"protocolVersion": "2025-11-25",
            "capabilities": {"tasks": {"list": {}, "requests": {"tools": {"call": {}}}}}, "serverInfo": {"name": "s", "version": "1"}}})));
        assert!(dropped.task_calls());
        dropped.read_tools(&line(json!({"jsonrpc": "2.0", "id": 1, "result": {"tools": [
            {"name": "research", "inputSchema": {}, "execution": {"taskSupport": "required"}},
            {"name": "echo", "inputSchema": {}},
            {"name": "odd", "inputSchema": {}, "execution": {"taskSupport": "sometimes"}},
            {"name": "odder", "inputSchema": {}, "execution": "required"},
            {"inputSchema": {}, "execution": {"taskSupport": "optional"}},
        ]}})));
        dropped.read_tools(&line(json!({"jsonrpc": "2.0", "id": 2, "result": {"tools": [
            {"name": "maybe", "inputSchema": {}, "execution": {"taskSupport": "optional"}}], "nextCursor": "x"}})));
        let listed = dropped.take_listed();
        assert_eq!(listed.len(), 2, "{listed:?}");
        assert_eq!(listed["research"], TaskSupport::Required);
        assert_eq!(listed["maybe"], TaskSupport::Optional);
        assert!(dropped.take_listed().is_empty(), "taken");
        // A later start without the capability says so.
        dropped.read_initialize(&line(json!({"jsonrpc": "2.0", "id": 0, "result": {"capabilities": {"tools": {}}}})));
        assert!(!dropped.task_calls());
    }

    #[test]
    fn a_clients_tasks_capability_is_relayed_as_what_the_gateway_understands_of_it() {
        let all = json!({"list": {}, "cancel": {}, "requests": {
            "sampling": {"createMessage": {}}, "elicitation": {"create": {"x": 1}}, "tools": {"call": {}}}, "other": {}});
        let relayed = ClientTasks::of(&all).unwrap();
        assert_eq!(
            relayed.value(),
            &json!({"list": {}, "cancel": {}, "requests": {"sampling": {"createMessage": {}}, "elicitation": {"create": {}}}})
        );
        let sampling = json!({"requests": {"sampling": {"createMessage": {}}}, "list": true});
        assert_eq!(
            ClientTasks::of(&sampling).unwrap().value(),
            &json!({"requests": {"sampling": {"createMessage": {}}}})
        );
        // Nothing it runs as a task: nothing to relay.
        for none in
            [json!({"list": {}, "cancel": {}}), json!({"requests": {"sampling": {"createMessage": true}}}), json!(7)]
        {
            assert_eq!(ClientTasks::of(&none), None, "{none}");
        }
        let init =
            line(json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-11-25",
            "capabilities": {"sampling": {}, "tasks": all}, "clientInfo": {"name": "c", "version": "1"}}}));
        assert_eq!(ClientTasks::read_initialize(&init), Some(relayed));
        let plain = line(json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"capabilities": {}}}));
        assert_eq!(ClientTasks::read_initialize(&plain), None);
    }

    #[tokio::test]
    async fn a_listing_shows_task_support_only_from_a_server_that_takes_task_calls() {
        let dropped = Dropped::default();
        let page = line(json!({"jsonrpc": "2.0", "id": 1, "result": {"tools": [
            {"name": "r", "inputSchema": {}, "execution": {"taskSupport": "required"}}]}}));
        let list = async {
            dropped.read_tools(&page);
            Ok::<_, ()>("tools")
        };
        let (tools, support) = dropped.listing(list).await.unwrap();
        assert_eq!((tools, support.len()), ("tools", 0), "no `tasks.requests.tools.call`: nothing to show");
        dropped.read_initialize(&line(json!({"jsonrpc": "2.0", "id": 0, "result": {
            "capabilities": {"tasks": {"requests": {"tools": {"call": {}}}}}}})));
        let list = async {
            dropped.read_tools(&page);
            Ok::<_, ()>("tools")
        };
        let (_, support) = dropped.listing(list).await.unwrap();
        assert_eq!(support["r"], TaskSupport::Required);
    }
}
