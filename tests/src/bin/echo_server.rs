//! `echo-server [--http ADDR]`: a minimal MCP server on rmcp with one tool, `echo`, which
//! answers with its `message`. Over stdio it is the fast upstream of the HTTP benchmark
//! (`bench-http`), where the gateway, not the server, is the bottleneck; with `--http` it
//! serves the same tool over rmcp's own streamable HTTP transport, the direct connection
//! the gateways are measured against.
//!
//! It also speaks MCP 2026-07-28's tasks extension, as rmcp models it: `later` (a
//! `message` and `ms`) answers as a task when the request declares the extension, done
//! after `ms`; `exit` ends the process without answering.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ContentBlock, CreateTaskResult,
    DetailedTask, GetTaskParams, GetTaskResult, ListToolsResult, PaginatedRequestParams, ServerCapabilities,
    ServerConfig, Task, TaskPayload, TaskStatus, Tool, ToolsCapability,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::json;

/// The tasks made, by id: each as last reported.
#[derive(Clone, Default)]
struct Echo {
    tasks: Arc<Mutex<HashMap<String, DetailedTask>>>,
}

fn now() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}

impl Echo {
    /// Starts `later`'s task: done with `text` after `ms`.
    fn start(&self, text: String, ms: u64) -> CreateTaskResult {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let id = format!("task-{}", NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        let task =
            Task::new(id.clone(), TaskStatus::Working, now(), now()).with_ttl_ms(60_000).with_poll_interval_ms(10);
        self.tasks.lock().unwrap().insert(id.clone(), DetailedTask::new(task.clone(), TaskPayload::Working));
        let tasks = self.tasks.clone();
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
            let mut tasks = tasks.lock().unwrap();
            let Some(running) = tasks.get_mut(&id).filter(|t| !t.status().is_terminal()) else { return };
            let result = serde_json::to_value(CallToolResult::success(vec![ContentBlock::text(text)])).unwrap();
            let mut task = running.task.clone();
            task.last_updated_at = now();
            *running = DetailedTask::new(task, TaskPayload::Completed { result: result.as_object().cloned().unwrap() });
        });
        CreateTaskResult::new(task)
    }
}

impl ServerHandler for Echo {
    fn get_info(&self) -> ServerConfig {
        let mut caps = ServerCapabilities::builder().enable_tasks().build();
        caps.tools = Some(ToolsCapability::default());
        ServerConfig::new(caps)
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        _: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        let tasks = self.tasks.lock().unwrap();
        let task = tasks.get(&request.task_id).ok_or_else(|| ErrorData::invalid_params("no such task", None))?;
        Ok(GetTaskResult::new(task.clone()))
    }

    async fn cancel_task(&self, request: CancelTaskParams, _: RequestContext<RoleServer>) -> Result<(), ErrorData> {
        let mut tasks = self.tasks.lock().unwrap();
        let task = tasks.get_mut(&request.task_id).ok_or_else(|| ErrorData::invalid_params("no such task", None))?;
        if !task.status().is_terminal() {
            let mut cancelled = task.task.clone();
            cancelled.last_updated_at = now();
            *task = DetailedTask::new(cancelled, TaskPayload::Cancelled);
        }
        Ok(())
    }

    async fn list_tools(
        &self,
        _: Option<PaginatedRequestParams>,
        _: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let schema = json!({"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]});
        let schema = schema.as_object().cloned().unwrap_or_default();
        let schema = Arc::new(schema);
        let empty = Arc::new(serde_json::Map::new());
        Ok(ListToolsResult::with_all_items(vec![
            Tool::new("echo", "Answers with its message", schema.clone()),
            Tool::new("later", "Answers with its message after `ms`, as a task when it can", schema),
            Tool::new("exit", "Ends the server without answering", empty),
        ]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let arguments = request.arguments.unwrap_or_default();
        let message = arguments.get("message").and_then(|m| m.as_str());
        let message = || message.ok_or_else(|| ErrorData::invalid_params("`message` is a string", None));
        match request.name.as_ref() {
            "echo" => Ok(CallToolResult::success(vec![ContentBlock::text(format!("Echo: {}", message()?))]).into()),
            "later" => {
                let (text, ms) = (format!("Later: {}", message()?), arguments.get("ms").and_then(|m| m.as_u64()));
                if cx.client_capabilities().is_some_and(|c| c.supports_tasks()) {
                    return Ok(self.start(text, ms.unwrap_or(0)).into());
                }
                tokio::time::sleep(std::time::Duration::from_millis(ms.unwrap_or(0))).await;
                Ok(CallToolResult::success(vec![ContentBlock::text(text)]).into())
            }
            "exit" => std::process::exit(3),
            other => Err(ErrorData::invalid_params(format!("unknown tool `{other}`"), None)),
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [] => {
            let running = Echo::default().serve((tokio::io::stdin(), tokio::io::stdout())).await?;
            running.waiting().await?;
        }
        [flag, addr] if flag == "--http" => {
            let listener = tokio::net::TcpListener::bind(addr.as_str()).await?;
            // As any HTTP server that answers small messages should: no Nagle delay.
            let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
                let _ = tcp.set_nodelay(true);
            });
            let config = StreamableHttpServerConfig::default();
            let sessions = Arc::new(LocalSessionManager::default());
            let service = StreamableHttpService::new(|| Ok(Echo::default()), sessions, config);
            axum::serve(listener, axum::Router::new().nest_service("/mcp", service)).await?;
        }
        _ => anyhow::bail!("usage: echo-server [--http ADDR]"),
    }
    Ok(())
}
