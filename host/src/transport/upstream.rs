//! The client side of one upstream connection: what the server tells us, or asks of us,
//! is handed to a [`Relay`] (the gateway) so that nothing a server says is dropped.

// Sampling, roots and logging are deprecated by the 2026-07-28 revision (SEP-2577) but
// are live in every revision a gateway speaks today, so they are forwarded faithfully.
#![allow(deprecated)]

use std::sync::Arc;

use futures::FutureExt as _;
use futures::future::BoxFuture;
use rmcp::model::{
    CancelledNotificationParam, ClientCapabilities, ClientJsonRpcMessage, ClientResult, CreateMessageRequestParams,
    CreateMessageResult, CustomNotification, CustomRequest, CustomResult, ElicitRequestParams, ElicitResult,
    Implementation, ListRootsResult, LoggingMessageNotificationParam, ProgressNotificationParam, ProtocolVersion,
    RequestId, ResourceUpdatedNotificationParam, ServerJsonRpcMessage, ServerNotification,
};
use rmcp::service::{InboundStreamOrigin, NotificationContext, RequestContext};
use rmcp::transport::Transport;
use rmcp::{ClientHandler, ErrorData, RoleClient};
use tokio_util::sync::CancellationToken;

use super::http_client::Tap;
use super::supervisor::Trouble;
use super::tasks::ClientTasks;

/// A notification from an upstream server, for the gateway to pass on.
#[derive(Debug)]
pub enum UpstreamEvent {
    Progress(ProgressNotificationParam),
    Log(LoggingMessageNotificationParam),
    ToolsChanged,
    PromptsChanged,
    ResourcesChanged,
    ResourceUpdated(ResourceUpdatedNotificationParam),
    Cancelled(CancelledNotificationParam),
    Custom(CustomNotification),
}

/// A request from an upstream server to the client (server-to-client direction).
#[derive(Debug)]
pub enum UpstreamRequest {
    Sampling(CreateMessageRequestParams),
    Roots,
    Elicitation(ElicitRequestParams),
    Custom(CustomRequest),
}

impl UpstreamRequest {
    /// Its JSON-RPC method (a custom one's as the server wrote it).
    pub fn method(&self) -> &str {
        match self {
            Self::Sampling(_) => "sampling/createMessage",
            Self::Roots => "roots/list",
            Self::Elicitation(_) => "elicitation/create",
            Self::Custom(c) => &c.method,
        }
    }
}

/// Who is asking, for a request from a server.
#[derive(Debug, Clone)]
pub struct Asker {
    /// The upstream session the request came on.
    pub session: u64,
    /// Over streamable HTTP, our request to the server on whose response stream this one
    /// arrived: the call it belongs to. Stdio servers cannot say.
    pub during: Option<RequestId>,
    /// Cancelled when the server gives up on its request.
    pub cancel: CancellationToken,
    /// The task it belongs to (MCP 2025-11-25: `_meta`'s related task), if it says so.
    pub task: Option<String>,
}

/// Where upstream traffic goes, and what a server's supervisor saw go wrong with it:
/// implemented by the gateway.
pub trait Relay: Send + Sync + 'static {
    /// A notification from `server` (session `session`).
    fn notify(&self, server: &str, session: u64, event: UpstreamEvent);
    /// A request from `server`; the answer goes back upstream.
    fn request(
        &self,
        server: &str,
        asker: Asker,
        request: UpstreamRequest,
    ) -> BoxFuture<'static, Result<ClientResult, ErrorData>>;
    /// `server`'s supervisor saw it fail (see [`Trouble`]).
    fn trouble(&self, server: &str, trouble: Trouble);
}

/// An upstream transport that relays progress the moment it arrives. rmcp runs each
/// notification's handler on a task of its own, so handlers can run out of order and a
/// call's answer can overtake the progress sent before it; a client that drops progress
/// after the answer (as the SDKs do) would lose the last steps. Reading happens in wire
/// order, so relaying here keeps that order. For a `url` server it also puts the answers
/// read as they came ([`Tap`]) in place of rmcp's reading of them.
pub struct InOrder<T> {
    pub inner: T,
    pub server: Arc<str>,
    pub session: u64,
    pub relay: Arc<dyn Relay>,
    pub tap: Option<Arc<Tap>>,
}

impl<T: Transport<RoleClient>> Transport<RoleClient> for InOrder<T> {
    type Error = T::Error;

    /// rmcp quotes this in transport errors, which reach the agent's report; the default
    /// is the full generic type name.
    fn name() -> std::borrow::Cow<'static, str> {
        "upstream".into()
    }

    fn send(
        &mut self,
        item: ClientJsonRpcMessage,
    ) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send + 'static {
        if let Some(tap) = &self.tap {
            tap.sending(&item);
        }
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<ServerJsonRpcMessage> {
        let mut message = self.inner.receive().await?;
        if let Some(tap) = &self.tap {
            message = tap.replace(message);
        }
        // Relayed as read, before anything the server said after them: a log line, whose
        // client is the one with a call in flight (`gateway::routing`), must be routed
        // before the answer that ends that call.
        if let ServerJsonRpcMessage::Notification(n) = &message {
            match &n.notification {
                ServerNotification::ProgressNotification(p) => {
                    self.relay.notify(&self.server, self.session, UpstreamEvent::Progress(p.params.clone()));
                }
                ServerNotification::LoggingMessageNotification(log) => {
                    self.relay.notify(&self.server, self.session, UpstreamEvent::Log(log.params.clone()));
                }
                _ => {}
            }
        }
        Some(message)
    }

    fn close(&mut self) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

/// What a server is told the client behind the gateway can do: rmcp's capabilities, and
/// the requests it runs as tasks (MCP 2025-11-25), which they cannot carry; the server's
/// transport tells it those (`lines::ServerLines`, `http_client::Tapped`).
#[derive(Debug, Clone, Default)]
pub struct Offered {
    pub caps: ClientCapabilities,
    pub tasks: Option<ClientTasks>,
}

/// The rmcp client handler of one upstream session.
pub struct UpstreamHandler {
    pub server: Arc<str>,
    pub session: u64,
    pub relay: Arc<dyn Relay>,
    /// What the server is told the client can do: the client's own capabilities.
    pub offered: Offered,
}

impl UpstreamHandler {
    async fn ask(&self, request: UpstreamRequest, cx: &RequestContext<RoleClient>) -> Result<ClientResult, ErrorData> {
        let during = match cx.extensions.get::<InboundStreamOrigin>() {
            Some(InboundStreamOrigin::OutboundRequest(id)) => Some(id.clone()),
            _ => None,
        };
        let task = related_task(&cx.meta, &request);
        let asker = Asker { session: self.session, during, cancel: cx.ct.clone(), task };
        let method = crate::text::capped(request.method(), 256);
        unpanicked(&self.server, &method, async { self.relay.request(&self.server, asker, request).await }).await
    }
}

/// `asked`, the answer to `server`'s request of `method`, an error in place of a panic (a
/// bug): rmcp answers nothing for a handler that panics, and the server would wait.
async fn unpanicked(
    server: &str,
    method: &str,
    asked: impl Future<Output = Result<ClientResult, ErrorData>>,
) -> Result<ClientResult, ErrorData> {
    std::panic::AssertUnwindSafe(asked).catch_unwind().await.unwrap_or_else(|_| {
        tracing::error!(
            server,
            method,
            "Rebound failed while passing on a request of the server (a bug); the server is told so"
        );
        Err(ErrorData::internal_error(format!("Rebound failed while passing on `{method}` (a bug, in its log)"), None))
    })
}

/// The task `request` says it belongs to, in its `_meta` (`meta`, where rmcp put it when it
/// read the request; a request read as it was sent, `typed`, keeps it in its params).
fn related_task(meta: &rmcp::model::RequestMetaObject, request: &UpstreamRequest) -> Option<String> {
    let sent = match request {
        UpstreamRequest::Custom(c) => c.params.as_ref().and_then(|p| p.get("_meta")),
        _ => None,
    };
    let related = meta.0.get(RELATED_TASK).or_else(|| sent?.get(RELATED_TASK))?;
    related["taskId"].as_str().map(str::to_owned)
}

/// The `_meta` key that ties a message to its task (MCP 2025-11-25).
pub const RELATED_TASK: &str = "io.modelcontextprotocol/related-task";

fn unexpected(what: &str) -> ErrorData {
    ErrorData::internal_error(format!("the client answered {what} with an unexpected result"), None)
}

impl ClientHandler for UpstreamHandler {
    fn get_info(&self) -> rmcp::model::ClientConfig {
        // What the client behind the gateway can do (see `Hub::offer`), so that the server
        // offers through the gateway what it would offer the client directly.
        rmcp::model::ClientConfig::new(
            self.offered.caps.clone(),
            Implementation::new("rebound", env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE)
    }

    async fn create_message(
        &self,
        params: CreateMessageRequestParams,
        cx: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        match self.ask(UpstreamRequest::Sampling(params), &cx).await? {
            ClientResult::CreateMessageResult(r) => Ok(*r),
            _ => Err(unexpected("sampling/createMessage")),
        }
    }

    async fn list_roots(&self, cx: RequestContext<RoleClient>) -> Result<ListRootsResult, ErrorData> {
        match self.ask(UpstreamRequest::Roots, &cx).await? {
            ClientResult::ListRootsResult(r) => Ok(r),
            _ => Err(unexpected("roots/list")),
        }
    }

    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        cx: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        match self.ask(UpstreamRequest::Elicitation(request), &cx).await? {
            ClientResult::ElicitResult(r) => Ok(r),
            _ => Err(unexpected("elicitation/create")),
        }
    }

    async fn on_custom_request(
        &self,
        request: CustomRequest,
        cx: RequestContext<RoleClient>,
    ) -> Result<CustomResult, ErrorData> {
        if request.method == super::http_client::UNREAD_REQUEST {
            return Err(super::http_client::unread_request());
        }
        match self.ask(UpstreamRequest::Custom(request), &cx).await? {
            ClientResult::CustomResult(r) => Ok(r),
            other => serde_json::to_value(other)
                .map(CustomResult)
                .map_err(|e| ErrorData::internal_error(e.to_string(), None)),
        }
    }

    async fn on_cancelled(&self, params: CancelledNotificationParam, _: NotificationContext<RoleClient>) {
        self.relay.notify(&self.server, self.session, UpstreamEvent::Cancelled(params));
    }

    async fn on_progress(&self, _: ProgressNotificationParam, _: NotificationContext<RoleClient>) {
        // Already relayed, in order, by `InOrder` as it arrived.
    }

    async fn on_logging_message(&self, _: LoggingMessageNotificationParam, _: NotificationContext<RoleClient>) {
        // Relayed by `InOrder` as it is read.
    }

    async fn on_resource_updated(&self, params: ResourceUpdatedNotificationParam, _: NotificationContext<RoleClient>) {
        self.relay.notify(&self.server, self.session, UpstreamEvent::ResourceUpdated(params));
    }

    async fn on_resource_list_changed(&self, _: NotificationContext<RoleClient>) {
        self.relay.notify(&self.server, self.session, UpstreamEvent::ResourcesChanged);
    }

    async fn on_tool_list_changed(&self, _: NotificationContext<RoleClient>) {
        self.relay.notify(&self.server, self.session, UpstreamEvent::ToolsChanged);
    }

    async fn on_prompt_list_changed(&self, _: NotificationContext<RoleClient>) {
        self.relay.notify(&self.server, self.session, UpstreamEvent::PromptsChanged);
    }

    async fn on_custom_notification(&self, notification: CustomNotification, _: NotificationContext<RoleClient>) {
        self.relay.notify(&self.server, self.session, UpstreamEvent::Custom(notification));
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A server's request whose passing on panics (a bug) is answered with an error: the
    /// server is not left waiting.
    #[tokio::test]
    async fn a_panic_passing_on_a_servers_request_answers_it_with_an_error() {
        let asked = async { panic!("a bug") };
        let answer = unpanicked("everything", UpstreamRequest::Roots.method(), asked).await;
        assert!(answer.unwrap_err().message.contains("`roots/list` (a bug"));
        let fine = unpanicked("everything", "roots/list", async { Ok(ClientResult::empty(())) }).await;
        assert!(fine.is_ok());
    }

    #[test]
    fn a_requests_task_is_read_where_rmcp_put_its_meta_or_in_its_params_as_sent() {
        let related = |task: &str| json!({RELATED_TASK: {"taskId": task}});
        let mut meta = rmcp::model::RequestMetaObject::default();
        meta.0.insert(RELATED_TASK.to_owned(), related("read")[RELATED_TASK].clone());
        assert_eq!(related_task(&meta, &UpstreamRequest::Roots).as_deref(), Some("read"));
        let sent = CustomRequest::new("sampling/createMessage", Some(json!({"task": {}, "_meta": related("sent")})));
        let sent = UpstreamRequest::Custom(sent);
        assert_eq!(related_task(&rmcp::model::RequestMetaObject::default(), &sent).as_deref(), Some("sent"));
        assert_eq!(related_task(&meta, &sent).as_deref(), Some("read"), "rmcp's reading first");
        let none = UpstreamRequest::Custom(CustomRequest::new("x", Some(json!({"_meta": {}}))));
        assert_eq!(related_task(&rmcp::model::RequestMetaObject::default(), &none), None);
    }
}
