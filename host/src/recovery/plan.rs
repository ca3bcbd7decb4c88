//! Recovery plans: the steps the engine takes after a failure, and the [`Advisor`] that
//! may supply them (an adapter plugin) in place of the built-in plan.

use std::time::Duration;

use futures::future::BoxFuture;
use rmcp::model::{CallToolResult, JsonObject};

use super::Failure;
use super::classify::{Category, Classification};
use crate::config::{Alternative, RecoveryConfig};

/// One step of a plan. Steps run in order until one yields the answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Call the failed tool again after the delay (none: the backoff's). The engine
    /// skips it when replaying is not safe, attempts are used up or time is short.
    Retry(Option<Duration>),
    /// Call a tool on the same server for its effect (`hol_interrupt`).
    SideCall { tool: String, arguments: JsonObject },
    /// Call another tool; its success is the answer.
    Alternative { server: Option<String>, tool: String, arguments: Option<JsonObject> },
    /// Restart the server.
    Restart,
    /// Stop, with a suggested action for the agent.
    GiveUp(String),
}

/// A failed attempt, as an advisor sees it.
#[derive(Debug)]
pub struct FailureContext<'a> {
    pub server: &'a str,
    pub tool: &'a str,
    pub arguments: Option<&'a JsonObject>,
    /// 1 for the first attempt.
    pub attempt: u32,
    pub elapsed: Duration,
    pub failure: &'a Failure,
}

/// Server-specific knowledge: refines classifications, plans recovery, learns from
/// successes. Implemented by the plugin host; every method may decline. Async because
/// plugins run on blocking threads, off the runtime's workers.
pub trait Advisor: Send + Sync {
    fn classify(
        &self,
        failure: &FailureContext<'_>,
        builtin: &Classification,
    ) -> BoxFuture<'static, Option<Classification>>;
    fn plan(
        &self,
        failure: &FailureContext<'_>,
        classification: &Classification,
    ) -> BoxFuture<'static, Option<Vec<Step>>>;
    fn observe(
        &self,
        server: &str,
        tool: &str,
        arguments: Option<&JsonObject>,
        result: &CallToolResult,
    ) -> BoxFuture<'static, ()>;
}

/// The plan without an adapter: retry (where the engine finds it safe), then the
/// configured fallbacks, unless the failure rules them out.
pub fn builtin(recovery: &RecoveryConfig, tool: &str, class: &Classification) -> Vec<Step> {
    let mut steps = Vec::new();
    if class.retryable && class.category != Category::CircuitOpen {
        steps.push(Step::Retry(None));
    }
    // A validation error would fail the same way elsewhere; a cancelled call is over.
    if !matches!(class.category, Category::ToolValidation | Category::Cancelled) {
        for alt in recovery.fallbacks.get(tool).into_iter().flatten() {
            steps.push(Step::Alternative { server: alt.server.clone(), tool: alt.tool.clone(), arguments: None });
        }
    }
    steps
}

/// The configured fallback for `tool` on its server, to map its arguments.
pub fn configured<'a>(recovery: &'a RecoveryConfig, tool: &str, alt_tool: &str) -> Option<&'a Alternative> {
    recovery.fallbacks.get(tool)?.iter().find(|a| a.tool == alt_tool)
}
