//! The answer a client gets when a call cannot be completed: an `isError: true` result
//! whose text says what failed and what to do next, with the same report as data in
//! `_meta.rebound`. Never a JSON-RPC error, which some clients punish by disabling the
//! tool for the rest of the session (seed 002).

use rmcp::model::{CallToolResult, ContentBlock, MetaObject};
use serde_json::{Value, json};

use super::Failure;
use crate::transport::Status;

/// What the report says about a call.
#[derive(Debug)]
pub struct Report<'a> {
    pub server: &'a str,
    pub tool: &'a str,
    pub failure: &'a Failure,
    pub attempts: u32,
}

impl Report<'_> {
    /// The next step for the agent, in words.
    pub fn suggested_action(&self) -> String {
        let (server, tool) = (self.server, self.tool);
        match self.failure {
            Failure::Timeout { .. } => format!(
                "the request was cancelled; call `{tool}` again later or with a smaller input, and if it keeps timing out raise `recovery.tools.{tool}.timeout_ms` for server `{server}`"
            ),
            Failure::ConnectionLost { .. } => format!(
                "the `{server}` server is being restarted; call `{tool}` again in a few seconds (check first whether the interrupted call took effect)"
            ),
            Failure::Unavailable {
                status: Status::Down,
                ..
            } => format!(
                "the `{server}` server crashed repeatedly and is marked down; Rebound tries to start it again periodically; check its command and its stderr in the gateway's log"
            ),
            Failure::Unavailable { .. } | Failure::SendFailed { .. } => format!(
                "the `{server}` server is not running and the call was not made; Rebound is restarting it, so try again shortly"
            ),
            Failure::CircuitOpen { .. } => format!(
                "the `{server}` server failed repeatedly and is being given time to recover; try again later or use another tool"
            ),
            Failure::Rpc { code: -32602, .. } => {
                format!("check the arguments against `{tool}`'s input schema and call it again")
            }
            Failure::Rpc { .. } | Failure::Protocol { .. } => format!(
                "the `{server}` server could not run `{tool}`; try an alternative tool, or report the error to the server's maintainer"
            ),
            Failure::ToolError { .. } => {
                "read the tool's error above and adjust the call".to_string()
            }
            Failure::Cancelled => "nothing: the call was cancelled by the client".to_owned(),
        }
    }

    /// Whether waiting and trying again can be expected to work.
    pub fn auto_recoverable(&self) -> bool {
        matches!(
            self.failure,
            Failure::Timeout { .. }
                | Failure::ConnectionLost { .. }
                | Failure::Unavailable { .. }
                | Failure::SendFailed { .. }
        )
    }

    /// The `isError` result for the client.
    pub fn into_result(self) -> CallToolResult {
        let action = self.suggested_action();
        let text = format!(
            "rebound: `{}` on server `{}` failed after {} attempt{}: {}.\nWhat to do: {action}.",
            self.tool,
            self.server,
            self.attempts,
            if self.attempts == 1 { "" } else { "s" },
            self.failure.message(),
        );
        let data = json!({
            "status": "failed",
            "server": self.server,
            "tool": self.tool,
            "failure": { "kind": self.failure.kind(), "message": self.failure.message() },
            "attempts": self.attempts,
            "suggested_action": action,
            "auto_recoverable": self.auto_recoverable(),
        });
        let mut result = CallToolResult::error(vec![ContentBlock::text(text)]);
        result.meta = Some(meta(data));
        result
    }
}

/// `_meta` with Rebound's report under its own key.
pub fn meta(report: Value) -> MetaObject {
    let mut m = MetaObject::new();
    m.insert("rebound".to_owned(), report);
    m
}
