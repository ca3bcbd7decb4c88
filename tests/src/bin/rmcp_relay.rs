//! The floor of a gateway built on rmcp, for `cargo xtask bench`: an rmcp server over its
//! own stdio whose `tools/list` and `tools/call` are sent on, as they are, by an rmcp
//! client of the server given as its arguments. Every message is read into rmcp's types and
//! written from them on both sides, as in Rebound, with nothing else: no recovery, no
//! routing, no metrics. What a call costs through it, beyond `line-relay`, is what two rmcp
//! endpoints cost; what Rebound adds beyond it is the rest of its own.
//!
//! usage: rmcp-relay SERVER [ARGS...]

use std::process::Stdio;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig,
    ToolsCapability,
};
use rmcp::service::{Peer, RequestContext, RoleClient};
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};

struct Relay {
    server: Peer<RoleClient>,
}

/// What the server said went wrong, as the client's error.
fn failed(e: rmcp::ServiceError) -> ErrorData {
    match e {
        rmcp::ServiceError::McpError(e) => e,
        other => ErrorData::internal_error(other.to_string(), None),
    }
}

impl ServerHandler for Relay {
    fn get_info(&self) -> ServerConfig {
        let mut caps = ServerCapabilities::default();
        caps.tools = Some(ToolsCapability::default());
        ServerConfig::new(caps)
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        self.server.list_tools(request).await.map_err(failed)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        self.server.call_tool_once(request).await.map_err(failed)
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let program = args.next().ok_or_else(|| anyhow::anyhow!("usage: rmcp-relay SERVER [ARGS...]"))?;
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let (to_server, from_server) = (child.stdin.take().expect("piped"), child.stdout.take().expect("piped"));
    let upstream = ().serve((from_server, to_server)).await?;
    // Non-blocking pipes, as Rebound reads and writes its client's.
    let front = Relay { server: upstream.peer().clone() }.serve(rmcp::transport::stdio_pipes()).await?;
    front.waiting().await?;
    Ok(())
}
