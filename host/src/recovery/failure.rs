//! One failed attempt at a tool call, as observed by the gateway.

use std::time::Duration;

use rmcp::model::CallToolResult;
use serde_json::Value;

use super::classify::{Category, Classification};
use crate::transport::Status;
use crate::transport::lines::DROPPED_ANSWER;

/// What happened to one attempt.
#[derive(Debug, Clone)]
pub enum Failure {
    /// No answer within the attempt's timeout; `notifications/cancelled` went upstream.
    Timeout { after: Duration },
    /// A JSON-RPC error from the server.
    Rpc { code: i32, message: String, data: Option<Value> },
    /// The tool answered with `isError: true`.
    ToolError { result: Box<CallToolResult> },
    /// The connection was lost while the call was in flight: it may or may not have run.
    /// `session`: the upstream session lost, when the server's whole connection was (every
    /// call in flight on it failed with it), not one request's.
    ConnectionLost { reason: String, session: Option<u64> },
    /// The call never left the gateway: the server was not running.
    Unavailable { status: Status, reason: Option<String> },
    /// The request could not be written to the server, so it was never delivered.
    SendFailed { reason: String },
    /// A `url` server's HTTP endpoint (or a proxy before it) refused the request with an
    /// error status and no MCP answer (429, a 5xx, 401 or 403), its `Retry-After` as it
    /// came. The request may have run behind it, except where the status says otherwise.
    HttpStatus { status: u16, retry_after: Option<String> },
    /// A breaker is open, the server's or (`tool`) that tool's alone: the call was not
    /// made.
    /// `tool`: the tool's breaker, not the server's; `own`: the breaker of this client's
    /// calls alone (the server serves many, and only this one's calls failed).
    CircuitOpen { retry_in: Duration, tool: Option<String>, own: bool },
    /// The server answered with something that is not a tool result.
    Protocol { reason: String },
    /// The client cancelled the call.
    Cancelled,
    /// The server (on MCP 2026-07-28) asked the client something, and the client did not
    /// or could not answer: nothing against the server, nothing to retry.
    Unanswered { reason: String },
    /// The gateway itself failed while handling the call (a panic, caught): a bug.
    Internal { reason: String },
    /// What the server made for the client was past a limit of the gateway's (a task
    /// past the tasks it relays, in all or for this client) and undone upstream: nothing
    /// against the server, which did as asked.
    GatewayLimit { reason: String },
}

impl Failure {
    /// Whether the attempt may have taken effect, in part or whole, although it failed:
    /// it timed out or lost its connection in flight (as `class`, the failure's
    /// classification, says, also of a timeout a server reports), its answer was dropped
    /// for its size, the server answered it with what is not a tool's result (it had the
    /// request), the gateway failed while handling it, or cancelled what the server had
    /// started for it. The gateway's own
    /// classification decides too: an adapter's refinement can say it may have run, never
    /// that it did not (the client would be told it may call again a tool that ran).
    pub fn may_have_run(&self, class: &Classification) -> bool {
        let dropped = |data: &Option<Value>| data.as_ref().is_some_and(|d| d.get(DROPPED_ANSWER).is_some());
        // Only the category is read: any time will do.
        let builtin = super::classify::classify(self, std::time::SystemTime::UNIX_EPOCH);
        let ran = |c: &Classification| matches!(c.category, Category::Timeout | Category::Transport);
        ran(class)
            || ran(&builtin)
            || matches!(self, Self::Internal { .. } | Self::GatewayLimit { .. } | Self::Protocol { .. })
            || matches!(self, Self::Rpc { data, .. } if dropped(data))
    }

    /// A short machine-readable name for logs and `_meta`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Timeout { .. } => "timeout",
            Self::Rpc { .. } => "rpc_error",
            Self::ToolError { .. } => "tool_error",
            Self::ConnectionLost { .. } => "connection_lost",
            Self::Unavailable { .. } => "unavailable",
            Self::SendFailed { .. } => "send_failed",
            Self::HttpStatus { .. } => "http_status",
            Self::CircuitOpen { .. } => "circuit_open",
            Self::Protocol { .. } => "protocol",
            Self::Cancelled => "cancelled",
            Self::Unanswered { .. } => "unanswered",
            Self::Internal { .. } => "internal",
            Self::GatewayLimit { .. } => "gateway_limit",
        }
    }

    /// The text of an `isError` result, or the message of anything else.
    pub fn message(&self) -> String {
        match self {
            Self::Timeout { after } => format!("no answer within {} ms", after.as_millis()),
            Self::Rpc { code, message, .. } => format!("JSON-RPC error {code}: {message}"),
            Self::ToolError { result } => result
                .content
                .iter()
                .filter_map(|c| c.as_text().map(|t| t.text.as_str()))
                .collect::<Vec<_>>()
                .join("\n"),
            Self::ConnectionLost { reason, .. } => format!("connection lost: {reason}"),
            Self::Unavailable { status, reason } => match reason {
                Some(r) => format!("server is {} ({r})", status.as_str()),
                None => format!("server is {}", status.as_str()),
            },
            Self::SendFailed { reason } => format!("request not delivered: {reason}"),
            Self::HttpStatus { status, retry_after: None } => {
                format!("the server's HTTP endpoint answered HTTP {status}")
            }
            Self::HttpStatus { status, retry_after: Some(after) } => {
                format!("the server's HTTP endpoint answered HTTP {status} (Retry-After: {after})")
            }
            Self::CircuitOpen { retry_in, tool, own: true } => format!(
                "this client's calls to {} failed repeatedly, so a circuit breaker of its own sheds them; other clients' calls are not shed by it (next probe in {} ms)",
                tool.as_ref().map_or("the server".to_owned(), |t| format!("tool `{t}`")),
                retry_in.as_millis()
            ),
            Self::CircuitOpen { retry_in, tool: None, .. } => format!(
                "the server's circuit breaker is open after repeated failures (next probe in {} ms)",
                retry_in.as_millis()
            ),
            Self::CircuitOpen { retry_in, tool: Some(tool), .. } => format!(
                "the circuit breaker of tool `{tool}` is open after repeated failures; the server's other tools still answer (next probe in {} ms)",
                retry_in.as_millis()
            ),
            Self::Protocol { reason } => format!("protocol error: {reason}"),
            Self::Cancelled => "cancelled by the client".to_owned(),
            Self::Unanswered { reason } => format!("the server asked the client for input, with no answer: {reason}"),
            Self::Internal { reason } => format!("Rebound failed internally while handling the call: {reason}"),
            Self::GatewayLimit { reason } => reason.clone(),
        }
    }
}
