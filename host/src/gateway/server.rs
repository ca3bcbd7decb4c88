//! The MCP server a client connects to: lists come from the catalogue, requests are
//! routed to the server that owns the name, and a routed tool call always ends in a
//! result, never in a JSON-RPC error.

// Logging and subscriptions are deprecated by 2026-07-28 (SEP-2577) but live in every
// revision the gateway speaks.
#![allow(deprecated)]

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelledNotificationParam, ClientNotification, CompleteRequestParams,
    CompleteResult, CustomNotification, GetPromptRequestParams, GetPromptResponse, Implementation, ListPromptsResult,
    ListResourceTemplatesResult, ListResourcesResult, ListToolsResult, PaginatedRequestParams, PromptsCapability,
    ProtocolVersion, ReadResourceRequestParams, ReadResourceResponse, ResourcesCapability, ServerCapabilities,
    SetLevelRequestParams, SubscribeRequestParams, ToolsCapability, UnsubscribeRequestParams,
};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceError};

use std::sync::atomic::{AtomicU64, Ordering};

use futures::future::BoxFuture;
use rmcp::model::{CallToolResult, JsonObject, ReadResourceResult, ToolAnnotations};

use super::call::{Attempt, attempt};
use super::hub::Hub;
use super::status;
use crate::recovery::Failure;
use crate::recovery::engine::{Ending, Upstream};
use crate::recovery::report;
use crate::transport::Session;

/// One downstream session's handler. Cheap to clone; all state lives in the [`Hub`].
#[derive(Clone)]
pub struct Gateway {
    hub: Arc<Hub>,
    /// Names this downstream session in the errors log.
    session: Arc<str>,
}

impl Gateway {
    pub fn new(hub: Arc<Hub>) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let millis = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or_default();
        let session = format!("sess_{millis}_{}", NEXT.fetch_add(1, Ordering::Relaxed)).into();
        Self { hub, session }
    }

    /// The live session of `server`, waiting for a start in progress up to `within`.
    async fn session(&self, server: &str, within: Duration) -> Result<Arc<Session>, ErrorData> {
        let handle = self
            .hub
            .servers
            .get(server)
            .ok_or_else(|| ErrorData::internal_error(format!("no server `{server}`"), None))?;
        handle.ready_session(within).await.map_err(|nr| {
            let failure = Failure::Unavailable { status: nr.status, reason: nr.last_error };
            ErrorData::internal_error(format!("server `{server}`: {}", failure.message()), None)
        })
    }

    fn wait_for(&self, server: &str) -> Duration {
        self.hub
            .config
            .servers
            .get(server)
            .map(|s| Duration::from_millis(s.recovery.timeout_ms))
            .unwrap_or(Duration::from_secs(30))
    }
}

fn upstream_error(server: &str, e: ServiceError) -> ErrorData {
    match e {
        ServiceError::McpError(e) => e,
        other => ErrorData::internal_error(format!("server `{server}`: {other}"), None),
    }
}

impl ServerHandler for Gateway {
    fn get_info(&self) -> rmcp::model::ServerConfig {
        // Everything a server behind us might offer; lists may be empty.
        let mut caps = ServerCapabilities::default();
        let mut tools = ToolsCapability::default();
        tools.list_changed = Some(true);
        caps.tools = Some(tools);
        let mut prompts = PromptsCapability::default();
        prompts.list_changed = Some(true);
        caps.prompts = Some(prompts);
        let mut resources = ResourcesCapability::default();
        resources.list_changed = Some(true);
        resources.subscribe = Some(true);
        caps.resources = Some(resources);
        caps.logging = Some(Default::default());
        caps.completions = Some(Default::default());
        rmcp::model::ServerConfig::new(caps)
            .with_server_info(Implementation::new("rebound", env!("CARGO_PKG_VERSION")).with_title("Rebound MCP gateway"))
            .with_instructions("Rebound is a gateway in front of several MCP servers. When a tool fails, its result says what was tried and what to do next.")
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        // 2026-07-28 forbids server-to-client requests, which the servers behind us use.
        Cow::Borrowed(ProtocolVersion::known_up_to(&ProtocolVersion::LATEST_WITH_INITIALIZE))
    }

    async fn on_initialized(&self, cx: NotificationContext<RoleServer>) {
        self.hub.add_downstream(cx.peer);
    }

    async fn list_tools(
        &self,
        _: Option<PaginatedRequestParams>,
        _: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        self.hub.settled().await;
        let mut tools = self.hub.catalogue().tools.clone();
        if self.hub.config.settings.gateway_tools {
            tools.extend(status::tools());
        }
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        use futures::FutureExt as _;
        let name = request.name.clone();
        // The engine catches a panic inside a call; this catches one anywhere else on the
        // call's path (reporting, logging, metrics), so that no call goes unanswered.
        match std::panic::AssertUnwindSafe(self.call_tool_inner(request, cx)).catch_unwind().await {
            Ok(answer) => answer,
            Err(_) => {
                tracing::error!(tool = %name, "Rebound failed while answering a call (a bug); the client is told so");
                let text = format!(
                    "rebound: Rebound failed while answering this call of `{name}` (a bug, in its log); check whether the call took effect, then call it again"
                );
                Ok(CallToolResult::error(vec![rmcp::model::ContentBlock::text(text)]).into())
            }
        }
    }

    async fn list_prompts(
        &self,
        _: Option<PaginatedRequestParams>,
        _: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        self.hub.settled().await;
        Ok(ListPromptsResult::with_all_items(self.hub.catalogue().prompts.clone()))
    }

    async fn get_prompt(
        &self,
        mut request: GetPromptRequestParams,
        _: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        let route = self
            .hub
            .catalogue()
            .prompt(&request.name)
            .cloned()
            .ok_or_else(|| ErrorData::invalid_params(format!("unknown prompt `{}`", request.name), None))?;
        let session = self.session(&route.server, self.wait_for(&route.server)).await?;
        request.name = route.name;
        session.peer.get_prompt(request).await.map(Into::into).map_err(|e| upstream_error(&route.server, e))
    }

    async fn list_resources(
        &self,
        _: Option<PaginatedRequestParams>,
        _: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        self.hub.settled().await;
        let mut resources = self.hub.catalogue().resources.clone();
        if self.hub.config.settings.gateway_tools {
            resources.extend(status::resources());
        }
        Ok(ListResourcesResult::with_all_items(resources))
    }

    async fn list_resource_templates(
        &self,
        _: Option<PaginatedRequestParams>,
        _: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        self.hub.settled().await;
        Ok(ListResourceTemplatesResult::with_all_items(self.hub.catalogue().templates.clone()))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        if self.hub.config.settings.gateway_tools
            && let Some(contents) = status::read(&self.hub, &request.uri)
        {
            return Ok(ReadResourceResult::new(vec![contents]).into());
        }
        let server = self.resource_server(&request.uri)?;
        let session = self.session(&server, self.wait_for(&server)).await?;
        session.peer.read_resource(request).await.map(Into::into).map_err(|e| upstream_error(&server, e))
    }

    async fn subscribe(&self, request: SubscribeRequestParams, _: RequestContext<RoleServer>) -> Result<(), ErrorData> {
        let server = self.resource_server(&request.uri)?;
        let session = self.session(&server, self.wait_for(&server)).await?;
        let uri = request.uri.clone();
        session.peer.subscribe(request).await.map_err(|e| upstream_error(&server, e))?;
        self.hub.subscribed(server, uri, true);
        Ok(())
    }

    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        _: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let server = self.resource_server(&request.uri)?;
        self.hub.subscribed(server.clone(), request.uri.clone(), false);
        let session = self.session(&server, self.wait_for(&server)).await?;
        session.peer.unsubscribe(request).await.map_err(|e| upstream_error(&server, e))
    }

    async fn complete(
        &self,
        mut request: CompleteRequestParams,
        _: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        let catalogue = self.hub.catalogue();
        let server = match &mut request.r#ref {
            rmcp::model::Reference::Prompt(p) => {
                let route = catalogue
                    .prompt(&p.name)
                    .cloned()
                    .ok_or_else(|| ErrorData::invalid_params(format!("unknown prompt `{}`", p.name), None))?;
                p.name = route.name;
                route.server
            }
            rmcp::model::Reference::Resource(r) => catalogue
                .template_server(&r.uri)
                .ok_or_else(|| ErrorData::invalid_params(format!("no server offers `{}`", r.uri), None))?,
            _ => {
                return Err(ErrorData::invalid_params("unsupported completion reference", None));
            }
        };
        let session = self.session(&server, self.wait_for(&server)).await?;
        session.peer.complete(request).await.map_err(|e| upstream_error(&server, e))
    }

    async fn set_level(&self, request: SetLevelRequestParams, _: RequestContext<RoleServer>) -> Result<(), ErrorData> {
        self.hub.set_log_level(request.level);
        for handle in self.hub.servers.values() {
            let Some(session) = handle.state().session.filter(|s| s.is_live()) else {
                continue;
            };
            if session.info.as_ref().is_some_and(|i| i.capabilities.logging.is_some())
                && let Err(e) = session.peer.set_level(SetLevelRequestParams::new(request.level)).await
            {
                tracing::debug!(server = %handle.name, "logging/setLevel failed: {e}");
            }
        }
        Ok(())
    }

    async fn on_cancelled(&self, _: CancelledNotificationParam, _: NotificationContext<RoleServer>) {
        // rmcp cancels the request's token; `attempt` passes the cancellation upstream.
    }

    async fn on_roots_list_changed(&self, _: NotificationContext<RoleServer>) {
        for session in self.live_sessions() {
            let _ = session.peer.notify_roots_list_changed().await;
        }
    }

    async fn on_custom_notification(&self, notification: CustomNotification, _: NotificationContext<RoleServer>) {
        for session in self.live_sessions() {
            let n = ClientNotification::CustomNotification(notification.clone());
            let _ = session.peer.send_notification(n).await;
        }
    }
}

impl Gateway {
    /// A tool call, routed and run through the recovery engine.
    async fn call_tool_inner(
        &self,
        request: CallToolRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if self.hub.config.settings.gateway_tools
            && let Some(result) = status::call(&self.hub, &request.name, request.arguments.as_ref())
        {
            return Ok(result.into());
        }
        self.hub.settled().await;
        let catalogue = self.hub.catalogue();
        let Some((route, tool)) = catalogue.tool(&request.name) else {
            // The one failure that is a protocol error: there is nothing to route to.
            return Err(ErrorData::invalid_params(
                format!("unknown tool `{}`; call tools/list for the tools this gateway offers", request.name),
                None,
            ));
        };
        let upstreams = Upstreams { hub: &self.hub, cx: &cx };
        let started = std::time::Instant::now();
        let (ending, record) = self
            .hub
            .engine
            .run(
                &upstreams,
                self.hub.advisor(),
                route.server.clone(),
                route.name.clone(),
                tool.annotations.as_ref(),
                request.arguments,
            )
            .await;
        if record.failures().next().is_some() {
            self.hub.errors.record(&record, &self.session, self.hub.engine.clock().wall());
            if let Some((failure, class)) = record.last_failure() {
                let level = if record.answered_by().is_some() { tracing::Level::INFO } else { class.kind.log_level() };
                log_at(
                    level,
                    &record.server,
                    &record.tool,
                    class.category.as_str(),
                    &failure.message(),
                    record.attempts.len(),
                );
            }
        }
        if !record.denied.is_empty()
            && let Some(adapter) = self.hub.plugins.adapters.get(&record.server)
        {
            adapter.report_denied(&record.denied);
        }
        self.hub.metrics.observe(&record, &ending, started.elapsed());
        let result = match ending {
            Ending::Answered(result) => report::recovered(result, &record, &self.hub.secrets),
            Ending::GaveUp => report::gave_up(&record, &self.hub.secrets),
        };
        Ok(result.into())
    }
}

impl Gateway {
    fn resource_server(&self, uri: &str) -> Result<Arc<str>, ErrorData> {
        self.hub
            .catalogue()
            .resource_server(uri)
            .ok_or_else(|| ErrorData::resource_not_found(format!("no server offers `{uri}`"), None))
    }

    fn live_sessions(&self) -> Vec<Arc<Session>> {
        self.hub.servers.values().filter_map(|h| h.state().session.filter(|s| s.is_live())).collect()
    }
}

/// The engine's way upstream for one client request.
struct Upstreams<'a> {
    hub: &'a Arc<Hub>,
    cx: &'a RequestContext<RoleServer>,
}

impl Upstream for Upstreams<'_> {
    fn call(
        &self,
        server: &str,
        tool: &str,
        arguments: Option<JsonObject>,
        timeout: Duration,
        max_total: Duration,
    ) -> BoxFuture<'_, Result<CallToolResult, Failure>> {
        let server = server.to_owned();
        let tool = tool.to_owned();
        Box::pin(async move {
            let Some(handle) = self.hub.servers.get(server.as_str()) else {
                return Err(Failure::Unavailable {
                    status: crate::transport::Status::Stopped,
                    reason: Some(format!("no server `{server}`")),
                });
            };
            let call = self.hub.track_call(&handle.name, &self.cx.peer, self.cx.id.clone());
            let started = tokio::time::Instant::now();
            // Waiting for a restart in progress counts against the call's deadline.
            let session = handle
                .ready_session(timeout)
                .await
                .map_err(|nr| Failure::Unavailable { status: nr.status, reason: nr.last_error })?;
            let spent = started.elapsed();
            let how = Attempt {
                timeout,
                max_total: max_total.saturating_sub(spent).max(Duration::from_millis(1)),
                progress_extends_timeout: handle.config.recovery.progress_extends_timeout,
            };
            attempt(self.hub, &session, &tool, arguments, how, self.cx, &call).await
        })
    }

    fn restart(&self, server: &str, within: Duration) -> BoxFuture<'_, ()> {
        let server = server.to_owned();
        Box::pin(async move {
            let Some(handle) = self.hub.servers.get(server.as_str()) else { return };
            if let Err(nr) = handle.restart(within).await {
                tracing::warn!(server, "restart asked by the adapter did not complete: {:?}", nr.status);
            }
        })
    }

    fn annotations(&self, server: &str, tool: &str) -> Option<Option<ToolAnnotations>> {
        let session = self.hub.servers.get(server)?.state().session?;
        let listing = session.listing();
        listing.tools.iter().find(|t| t.name == tool).map(|t| t.annotations.clone())
    }
}

fn log_at(level: tracing::Level, server: &str, tool: &str, category: &str, message: &str, attempts: usize) {
    match level {
        tracing::Level::ERROR => tracing::error!(server, tool, category, attempts, "call failed: {message}"),
        tracing::Level::WARN => tracing::warn!(server, tool, category, attempts, "call failed: {message}"),
        _ => tracing::info!(server, tool, category, attempts, "call recovered after: {message}"),
    }
}
