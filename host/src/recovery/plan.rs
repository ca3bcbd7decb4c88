//! Recovery plans: the steps the engine takes after a failure, the [`Advisor`] that may
//! propose them (an adapter plugin), and [`compose`], the one rule that turns an
//! adapter's proposal, the configured fallbacks and the built-in retry into a [`Plan`].

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
/// a plugin call that does not answer at once goes on on a thread of its own.
pub trait Advisor: Send + Sync {
    fn classify(
        &self,
        failure: &FailureContext<'_>,
        builtin: &Classification,
    ) -> BoxFuture<'static, Option<Classification>>;
    fn plan(&self, failure: &FailureContext<'_>, classification: &Classification)
    -> BoxFuture<'static, Option<Advice>>;
    fn observe(&self, call: &Completed<'_>) -> BoxFuture<'static, ()>;
}

/// A successful call, as an advisor is shown it.
pub struct Completed<'a> {
    pub server: &'a str,
    pub tool: &'a str,
    pub arguments: Option<&'a JsonObject>,
    pub result: &'a CallToolResult,
    /// Who wrote its arguments.
    pub arguments_by: ArgumentsBy,
}

/// Who wrote a call's arguments: the client (its own call, a retry of it, or a
/// configured fallback, which maps the client's arguments), or an adapter's plan, which
/// may have put in them what it was shown of any call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgumentsBy {
    Client,
    Adapter,
}

/// An adapter's plan: its steps, and what it holds while the plan runs (the adapter's
/// room for plans, given back when this is dropped).
pub struct Advice {
    pub steps: Vec<Step>,
    pub held: Option<Box<dyn std::any::Any + Send + Sync>>,
}

impl From<Vec<Step>> for Advice {
    fn from(steps: Vec<Step>) -> Self {
        Self { steps, held: None }
    }
}

/// Who put a step in a plan; it decides which limits the step runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The server's adapter: bounded by its grant and the per-call plan limits.
    Adapter,
    /// The user's `recovery.fallbacks`: never limited by grants.
    Config,
    /// The built-in retry.
    Builtin,
}

/// A plan as the engine runs it.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub steps: Vec<(Step, Origin)>,
    /// The adapter's advice for the agent when nothing answered.
    pub give_up: Option<String>,
}

/// The one rule that makes a plan, whoever proposes it:
///
/// 1. the adapter's steps, in its order, up to its first `give-up` (none: the built-in
///    retry, where the failure is retryable);
/// 2. then every configured fallback for the tool that the adapter's steps did not
///    already name, in configuration order, unless the arguments were invalid (they
///    would fail the same way elsewhere) or the client cancelled;
/// 3. then, if nothing answered, the adapter's `give-up` text as the agent's next action.
///
/// A configured fallback stays the configuration's wherever it runs: one the adapter
/// names keeps the configured arguments and no adapter limit applies to it. Whether the
/// arguments were invalid or the client cancelled is the gateway's own judgement
/// (`builtin`), not the adapter's, so no adapter can keep the fallbacks from running.
/// (`server` and `tool` are the call's: a fallback or step that names no server is on
/// `server`, however it is spelt.)
pub fn compose(
    advised: Option<Vec<Step>>,
    recovery: &RecoveryConfig,
    (server, tool): (&str, &str),
    class: &Classification,
    builtin: &Classification,
) -> Plan {
    let mut plan = Plan { steps: Vec::new(), give_up: None };
    let same =
        |a: &Option<String>, b: &Option<String>| a.as_deref().unwrap_or(server) == b.as_deref().unwrap_or(server);
    let configured = |on: &Option<String>, alt: &str| {
        recovery.fallbacks.get(tool).into_iter().flatten().find(|a| a.tool == alt && same(&a.server, on))
    };
    match advised {
        Some(steps) => {
            for step in steps {
                match step {
                    Step::GiveUp(action) => {
                        plan.give_up = Some(action);
                        break;
                    }
                    // As the configuration has it, which is what runs it.
                    Step::Alternative { server: on, tool: alt, .. } if let Some(entry) = configured(&on, &alt) => {
                        let step = Step::Alternative { server: entry.server.clone(), tool: alt, arguments: None };
                        plan.steps.push((step, Origin::Config));
                    }
                    step => plan.steps.push((step, Origin::Adapter)),
                }
            }
        }
        None if class.retryable && class.category != Category::CircuitOpen => {
            plan.steps.push((Step::Retry(None), Origin::Builtin));
        }
        None => {}
    }
    if matches!(builtin.category, Category::ToolValidation | Category::Cancelled) {
        return plan;
    }
    for alt in recovery.fallbacks.get(tool).into_iter().flatten() {
        let named = plan
            .steps
            .iter()
            .any(|(s, _)| matches!(s, Step::Alternative { server: on, tool, .. } if *tool == alt.tool && same(on, &alt.server)));
        if !named {
            let step = Step::Alternative { server: alt.server.clone(), tool: alt.tool.clone(), arguments: None };
            plan.steps.push((step, Origin::Config));
        }
    }
    plan
}

/// The fallback configured for `tool` of server `own` that is `alt_tool` of `alt_server`,
/// to map its arguments: two fallbacks of one name on two servers each have their own.
pub fn configured<'a>(
    recovery: &'a RecoveryConfig,
    (own, tool): (&str, &str),
    (alt_server, alt_tool): (&str, &str),
) -> Option<&'a Alternative> {
    let on = |a: &Alternative| a.server.as_deref().unwrap_or(own) == alt_server;
    recovery.fallbacks.get(tool)?.iter().find(|a| a.tool == alt_tool && on(a))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recovery::classify::classify;

    fn recovery() -> RecoveryConfig {
        let mut r = RecoveryConfig::default();
        let alt = |tool: &str| Alternative { tool: tool.into(), server: None, arguments: None };
        r.fallbacks.insert("search".into(), vec![alt("loogle"), alt("finder")]);
        r
    }

    fn class(failure: Failure) -> Classification {
        classify(&failure, std::time::SystemTime::UNIX_EPOCH)
    }

    fn timeout() -> Classification {
        class(Failure::Timeout { after: Duration::from_secs(1) })
    }

    fn alt(tool: &str) -> Step {
        Step::Alternative { server: None, tool: tool.into(), arguments: None }
    }

    /// Fallbacks of one tool name on two servers each map the arguments their own way.
    #[test]
    fn a_fallbacks_arguments_are_its_own_servers() {
        let mut r = RecoveryConfig::default();
        let q = serde_json::json!({"q": "$query"}).as_object().cloned();
        let on = |server: Option<&str>, arguments| Alternative {
            tool: "search".into(),
            server: server.map(Into::into),
            arguments,
        };
        r.fallbacks.insert("find".into(), vec![on(Some("m1"), q.clone()), on(Some("m2"), None), on(None, q.clone())]);
        assert_eq!(configured(&r, ("a", "find"), ("m1", "search")).unwrap().arguments, q);
        assert_eq!(configured(&r, ("a", "find"), ("m2", "search")).unwrap().arguments, None);
        assert_eq!(configured(&r, ("a", "find"), ("a", "search")).unwrap().arguments, q, "its own server's");
        assert!(configured(&r, ("a", "find"), ("m3", "search")).is_none());
    }

    #[test]
    fn without_an_adapter_retry_then_every_fallback() {
        let p = compose(None, &recovery(), ("lean", "search"), &timeout(), &timeout());
        assert_eq!(
            p.steps,
            [(Step::Retry(None), Origin::Builtin), (alt("loogle"), Origin::Config), (alt("finder"), Origin::Config)]
        );
        assert_eq!(p.give_up, None);
    }

    #[test]
    fn an_adapters_plan_runs_first_and_its_give_up_comes_last() {
        let advised = vec![Step::Retry(None), alt("finder"), Step::GiveUp("try later".into()), alt("never")];
        let p = compose(Some(advised), &recovery(), ("lean", "search"), &timeout(), &timeout());
        // A configured fallback the adapter names stays the configuration's (its
        // arguments, no adapter limits), at the adapter's position.
        assert_eq!(
            p.steps,
            [(Step::Retry(None), Origin::Adapter), (alt("finder"), Origin::Config), (alt("loogle"), Origin::Config)]
        );
        assert_eq!(p.give_up.as_deref(), Some("try later"));
        let with_args = Step::Alternative { server: None, tool: "finder".into(), arguments: Some(JsonObject::new()) };
        let p = compose(Some(vec![with_args]), &recovery(), ("lean", "search"), &timeout(), &timeout());
        assert_eq!(p.steps[0], (alt("finder"), Origin::Config), "the configured arguments, not the adapter's");
    }

    /// A configured fallback on the call's own server is the same fallback whether its
    /// server is named or left out, in the configuration or in the adapter's step: it runs
    /// once, as configured.
    #[test]
    fn a_configured_fallback_named_with_its_own_server_stays_the_configurations() {
        let bad = Some(serde_json::json!({"q": "the adapter's"}).as_object().cloned().unwrap());
        let named = |server: Option<&str>| Step::Alternative {
            server: server.map(Into::into),
            tool: "loogle".into(),
            arguments: bad.clone(),
        };
        let p = compose(Some(vec![named(Some("lean"))]), &recovery(), ("lean", "search"), &timeout(), &timeout());
        assert_eq!(p.steps, [(alt("loogle"), Origin::Config), (alt("finder"), Origin::Config)]);
        // The other spelling: configured with its server, named by the adapter without.
        let mut spelt = RecoveryConfig::default();
        let on_lean = Alternative { tool: "loogle".into(), server: Some("lean".into()), arguments: None };
        spelt.fallbacks.insert("search".into(), vec![on_lean]);
        let p = compose(Some(vec![named(None)]), &spelt, ("lean", "search"), &timeout(), &timeout());
        let configured = Step::Alternative { server: Some("lean".into()), tool: "loogle".into(), arguments: None };
        assert_eq!(p.steps, [(configured, Origin::Config)]);
        // Another server's tool of that name is the adapter's own step.
        let p = compose(Some(vec![named(Some("other"))]), &recovery(), ("lean", "search"), &timeout(), &timeout());
        assert_eq!(p.steps[0], (named(Some("other")), Origin::Adapter));
        assert_eq!(p.steps.len(), 3);
    }

    #[test]
    fn an_adapter_cannot_rule_the_fallbacks_out() {
        let invalid = class(Failure::Rpc { code: -32602, message: "bad".into(), data: None });
        let cancelled = class(Failure::Cancelled);
        for said in [invalid, cancelled] {
            let p = compose(Some(vec![]), &recovery(), ("lean", "search"), &said, &timeout());
            assert_eq!(p.steps.len(), 2, "the gateway's classification decides: {said:?}");
        }
    }

    #[test]
    fn an_adapter_that_only_gives_up_still_gets_the_fallbacks() {
        let p = compose(Some(vec![Step::GiveUp("no".into())]), &recovery(), ("lean", "search"), &timeout(), &timeout());
        assert_eq!(p.steps, [(alt("loogle"), Origin::Config), (alt("finder"), Origin::Config)]);
    }

    #[test]
    fn invalid_arguments_and_cancellations_get_no_fallbacks() {
        let invalid = class(Failure::Rpc { code: -32602, message: "bad".into(), data: None });
        assert!(compose(None, &recovery(), ("lean", "search"), &invalid, &invalid).steps.is_empty());
        let cancelled = class(Failure::Cancelled);
        assert!(compose(None, &recovery(), ("lean", "search"), &cancelled, &cancelled).steps.is_empty());
        // Unless the server's adapter plans one then: its plan is its own.
        let planned = Some(vec![Step::Alternative { server: None, tool: "loogle".into(), arguments: None }]);
        let p = compose(planned, &recovery(), ("lean", "search"), &invalid, &invalid);
        assert_eq!(p.steps, [(alt("loogle"), Origin::Config)]);
    }

    #[test]
    fn an_open_breaker_is_not_retried_but_falls_back() {
        let open = class(Failure::CircuitOpen { retry_in: Duration::from_secs(1), tool: None, own: false });
        let p = compose(None, &recovery(), ("lean", "search"), &open, &open);
        assert_eq!(p.steps, [(alt("loogle"), Origin::Config), (alt("finder"), Origin::Config)]);
    }
}
