//! `echo-server [--http ADDR]`: a minimal MCP server on rmcp with one tool, `echo`, which
//! answers with its `message`. Over stdio it is the fast upstream of the HTTP benchmark
//! (`bench-http`), where the gateway, not the server, is the bottleneck; with `--http` it
//! serves the same tool over rmcp's own streamable HTTP transport, the direct connection
//! the gateways are measured against.

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListToolsResult, PaginatedRequestParams,
    ServerCapabilities, ServerConfig, Tool, ToolsCapability,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::json;

#[derive(Clone)]
struct Echo;

impl ServerHandler for Echo {
    fn get_info(&self) -> ServerConfig {
        let mut caps = ServerCapabilities::default();
        caps.tools = Some(ToolsCapability::default());
        ServerConfig::new(caps)
    }

    async fn list_tools(
        &self,
        _: Option<PaginatedRequestParams>,
        _: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let schema = json!({"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]});
        let schema = schema.as_object().cloned().unwrap_or_default();
        Ok(ListToolsResult::with_all_items(vec![Tool::new("echo", "Answers with its message", Arc::new(schema))]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if request.name != "echo" {
            return Err(ErrorData::invalid_params(format!("unknown tool `{}`", request.name), None));
        }
        let message = request.arguments.as_ref().and_then(|a| a.get("message")).and_then(|m| m.as_str());
        let message = message.ok_or_else(|| ErrorData::invalid_params("`message` is a string", None))?;
        Ok(CallToolResult::success(vec![ContentBlock::text(format!("Echo: {message}"))]).into())
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [] => {
            let running = Echo.serve((tokio::io::stdin(), tokio::io::stdout())).await?;
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
            let service = StreamableHttpService::new(|| Ok(Echo), sessions, config);
            axum::serve(listener, axum::Router::new().nest_service("/mcp", service)).await?;
        }
        _ => anyhow::bail!("usage: echo-server [--http ADDR]"),
    }
    Ok(())
}
