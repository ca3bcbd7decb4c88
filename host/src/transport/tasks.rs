//! What MCP 2025-11-25's tasks add to a server's answers, which rmcp 3.9's types drop: a
//! tool's `execution.taskSupport`, and the server's `tasks` capability (task-augmented
//! `tools/call`). rmcp models only the later tasks extension (SEP-2663), so these are read
//! from the server's own messages, next to rmcp's reading: a stdio server's lines, which
//! the gateway frames itself, and a `url` server's HTTP answers ([`super::http_client`]).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The methods of MCP 2025-11-25's tasks, which a client sends about a task it started.
pub const METHODS: [&str; 4] = ["tasks/get", "tasks/result", "tasks/list", "tasks/cancel"];

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
        std::mem::take(&mut *self.listed.lock().expect("not poisoned"))
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
        let mut listed = self.listed.lock().expect("not poisoned");
        for tool in answer.result.tools {
            let (Some(name), Some(execution)) = (tool.name, tool.execution) else { continue };
            let Ok(support) = serde_json::from_value::<TaskSupport>(execution["taskSupport"].clone()) else { continue };
            if listed.len() < MAX_TOOLS {
                listed.insert(name, support);
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
