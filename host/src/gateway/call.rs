//! One attempt at a tool call on an upstream session: the request with its timeout,
//! progress remapped to the client's token, and cancellation passed on in both cases.

use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, CancelledNotificationParam, ClientRequest, JsonObject,
    RequestMetaObject, ServerResult,
};
use rmcp::service::{PeerRequestOptions, RequestContext};
use rmcp::{RoleServer, ServiceError};

use super::hub::{CallGuard, Hub};
use crate::recovery::Failure;
use crate::transport::Session;

/// How to make one attempt.
#[derive(Debug, Clone, Copy)]
pub struct Attempt {
    pub timeout: Duration,
    /// The most the attempt may take, progress or not: what is left of the call's deadline.
    pub max_total: Duration,
    pub progress_extends_timeout: bool,
}

/// Calls `tool` on `session` once. A successful answer with `isError: true` is a
/// [`Failure::ToolError`].
pub async fn attempt(
    hub: &Arc<Hub>,
    session: &Session,
    tool: &str,
    arguments: Option<JsonObject>,
    how: Attempt,
    cx: &RequestContext<RoleServer>,
    call: &CallGuard,
) -> Result<CallToolResult, Failure> {
    let mut params = CallToolRequestParams::new(tool.to_owned());
    params.arguments = arguments;
    // Pass the client's `_meta` on (rmcp puts its own progress token in).
    let mut meta = RequestMetaObject::default();
    meta.extend(cx.meta.clone());
    let mut options = PeerRequestOptions::with_timeout(how.timeout).with_meta(meta);
    options = options.with_max_total_timeout(how.max_total);
    if how.progress_extends_timeout {
        options = options.reset_timeout_on_progress();
    }
    let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
    let handle = tokio::select! {
        r = session.peer.send_cancellable_request(request, options) => r.map_err(from_service_error)?,
        () = session.closed.cancelled() => return Err(Failure::Unavailable { status: crate::transport::Status::Restarting, reason: Some("the connection was lost before the call was sent".into()) }),
    };
    let (id, token) = (handle.id.clone(), handle.progress_token.clone());
    call.sent(session.id, id.clone());
    let mapped = cx.meta.get_progress_token().is_some_and(|client| {
        hub.map_progress(session.id, token.clone(), cx.peer.clone(), client);
        true
    });
    let response = handle.await_response();
    tokio::pin!(response);
    let outcome = tokio::select! {
        r = &mut response => r.map_err(from_service_error),
        () = cx.ct.cancelled() => {
            let reason = Some("cancelled by the client".to_owned());
            let _ = session.peer.notify_cancelled(CancelledNotificationParam::new(Some(id), reason)).await;
            Err(Failure::Cancelled)
        }
        () = session.closed.cancelled() => Err(Failure::ConnectionLost { reason: "the server stopped while the call was in flight".into() }),
    };
    if mapped && let Some(progress) = hub.unmap_progress(session.id, &token) {
        progress.flush().await;
    }
    match outcome? {
        ServerResult::CallToolResult(result) if result.is_error == Some(true) => {
            Err(Failure::ToolError { result: Box::new(result) })
        }
        ServerResult::CallToolResult(result) => Ok(result),
        other => Err(Failure::Protocol { reason: format!("tools/call was answered with {}", variant_name(&other)) }),
    }
}

fn from_service_error(e: ServiceError) -> Failure {
    match e {
        ServiceError::McpError(e) => Failure::Rpc { code: e.code.0, message: e.message.into_owned(), data: e.data },
        ServiceError::Timeout { timeout: after } => Failure::Timeout { after },
        ServiceError::TransportClosed => Failure::ConnectionLost { reason: "the connection closed".into() },
        ServiceError::TransportSend(e) => Failure::SendFailed { reason: e.to_string() },
        ServiceError::Cancelled { .. } => Failure::Cancelled,
        other => Failure::Protocol { reason: other.to_string() },
    }
}

fn variant_name(result: &ServerResult) -> String {
    serde_json::to_value(result)
        .ok()
        .and_then(|v| v.as_object().map(|o| o.keys().cloned().collect::<Vec<_>>().join(",")))
        .map(|keys| format!("a result with keys [{keys}]"))
        .unwrap_or_else(|| "an unexpected result".to_owned())
}
