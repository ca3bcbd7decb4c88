//! MCP 2025-11-25 tasks, as a server that runs its tools as tasks does (`--tasks`): a
//! `tools/call` with a `task` answers at once with the task it created, then runs the tool
//! (sending its progress under the call's token, as long as the task runs), keeps its
//! result and says the task completed; `tasks/get` and `tasks/result` answer for it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Value, json};
use tokio::sync::{Mutex, watch};

/// What the server says it takes, in its answer to `initialize`: task-augmented calls
/// (it answers `tasks/get` and `tasks/result`; it does not list tasks, and a
/// `tasks/cancel` is only noted).
pub fn capability() -> Value {
    json!({"requests": {"tools": {"call": {}}}})
}

/// The tasks this server process runs, each with its result once it has one.
#[derive(Default)]
pub struct Tasks {
    next: AtomicU64,
    results: Mutex<HashMap<String, watch::Receiver<Option<Value>>>>,
}

impl Tasks {
    /// A new task: its id, and where its result goes.
    pub async fn start(&self) -> (String, watch::Sender<Option<Value>>) {
        let id = format!("task-{}", self.next.fetch_add(1, Ordering::Relaxed) + 1);
        let (done, result) = watch::channel(None);
        self.results.lock().await.insert(id.clone(), result);
        (id, done)
    }

    /// Task `id` as `tasks/get` and the status notification describe it.
    pub async fn task(&self, id: &str) -> Result<Value, (i64, String)> {
        let done = self.results.lock().await.get(id).ok_or_else(|| unknown(id))?.borrow().is_some();
        Ok(task(id, if done { "completed" } else { "working" }))
    }

    /// Task `id`'s result, once it has one.
    pub async fn result(&self, id: &str) -> Result<Value, (i64, String)> {
        let mut result = self.results.lock().await.get(id).cloned().ok_or_else(|| unknown(id))?;
        let done = result.wait_for(Option::is_some).await.map_err(|_| (-32603, "the task was dropped".to_owned()))?;
        let mut answer = done.clone().unwrap_or_default();
        answer["_meta"] = json!({"io.modelcontextprotocol/related-task": {"taskId": id}});
        Ok(answer)
    }
}

/// A task object of MCP 2025-11-25. (Its times are a fixed one: nothing here reads them.)
pub fn task(id: &str, status: &str) -> Value {
    const AT: &str = "2026-01-01T00:00:00Z";
    json!({"taskId": id, "status": status, "createdAt": AT, "lastUpdatedAt": AT, "ttl": 600_000, "pollInterval": 50})
}

fn unknown(id: &str) -> (i64, String) {
    (-32602, format!("unknown task {id}"))
}
