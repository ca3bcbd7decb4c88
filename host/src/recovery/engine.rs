//! The recovery engine: runs one client call to completion. Attempts go through the
//! server's breaker with a per-attempt timeout inside the call's deadline; failures are
//! classified; safe, retryable ones are retried with full-jitter backoff (honouring
//! retry-after and the retry budget); then the configured alternatives are tried, each
//! through its own server's breaker; and when nothing works the [`Record`] becomes the
//! report.
//!
//! Architecture invariant: the engine does no I/O. Upstream calls go through the
//! [`Upstream`] it is handed; time and randomness through [`Clock`] and [`Rng`].

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use rmcp::model::{CallToolResult, JsonObject, ToolAnnotations};
use serde_json::Value;

use super::backoff;
use super::breaker::{Breaker, Outcome};
use super::budget::RetryBudget;
use super::classify::{Category, Classification, classify};
use super::clock::{Clock, Rng};
use super::failure::Failure;
use super::plan::{self, Advisor, FailureContext, Step};
use crate::config::{Alternative, RecoveryConfig, ServerConfig};

/// The I/O the engine needs; the gateway provides it.
pub trait Upstream: Send + Sync {
    /// One attempt of `tool` on `server`, answered within `timeout` (restarted by progress
    /// where configured) and never later than `max_total`.
    fn call(
        &self,
        server: &str,
        tool: &str,
        arguments: Option<JsonObject>,
        timeout: Duration,
        max_total: Duration,
    ) -> BoxFuture<'_, Result<CallToolResult, Failure>>;
    /// The annotations of a tool as its server publishes it, or `None` if it has no
    /// such tool (right now).
    fn annotations(&self, server: &str, tool: &str) -> Option<Option<ToolAnnotations>>;
    /// Restarts `server` and waits (up to `within`) until it is ready again.
    fn restart(&self, server: &str, within: Duration) -> BoxFuture<'_, ()>;
}

/// A server's counters, for `rebound_status`.
#[derive(Debug, Default)]
pub struct Counters {
    pub calls: AtomicU64,
    pub attempts: AtomicU64,
    pub failures: AtomicU64,
    pub retries: AtomicU64,
    pub recovered: AtomicU64,
    pub fallbacks: AtomicU64,
    pub shed: AtomicU64,
}

/// Everything the engine keeps for one server.
#[derive(Debug)]
pub struct ServerPolicy {
    pub recovery: RecoveryConfig,
    pub breaker: Arc<Breaker>,
    pub budget: RetryBudget,
    pub counters: Counters,
}

/// Why a tool was called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The tool the client asked for.
    Primary,
    /// An alternative that answers the same question.
    Alternative,
    /// A call for its effect, from a plan (`hol_interrupt`).
    SideCall,
}

/// One attempt, as it went.
#[derive(Debug, Clone)]
pub struct AttemptRecord {
    pub server: Arc<str>,
    pub tool: String,
    pub role: Role,
    pub failure: Option<Failure>,
    pub classification: Option<Classification>,
    /// How long the engine waited before this attempt.
    pub waited: Duration,
}

/// How a call went.
#[derive(Debug)]
pub struct Record {
    pub server: Arc<str>,
    pub tool: String,
    pub attempts: Vec<AttemptRecord>,
    /// Whether the tool was safe to replay.
    pub safe: bool,
    /// Why the engine stopped trying, when it did.
    pub stopped: Option<String>,
    /// The suggested action an adapter gave when it gave up.
    pub action: Option<String>,
}

/// The end of a call.
#[derive(Debug)]
pub enum Ending {
    /// A result to pass on as it is: a success, or the tool's own error.
    Answered(CallToolResult),
    /// Nothing worked.
    GaveUp,
}

impl Record {
    /// The last failure on record.
    pub fn last_failure(&self) -> Option<(&Failure, &Classification)> {
        self.attempts.iter().rev().find_map(|a| Some((a.failure.as_ref()?, a.classification.as_ref()?)))
    }

    pub fn failures(&self) -> impl Iterator<Item = (&AttemptRecord, &Failure, &Classification)> {
        self.attempts.iter().filter_map(|a| Some((a, a.failure.as_ref()?, a.classification.as_ref()?)))
    }

    /// The attempt whose result is the answer, if one succeeded.
    pub fn answered_by(&self) -> Option<&AttemptRecord> {
        self.attempts.last().filter(|a| a.failure.is_none() && a.role != Role::SideCall)
    }

    /// Whether the answer came after a failure.
    pub fn recovered(&self) -> bool {
        self.answered_by().is_some() && self.attempts.len() > 1
    }

    fn push(
        &mut self,
        server: &Arc<str>,
        tool: &str,
        role: Role,
        failed: Option<(Failure, Classification)>,
        waited: Duration,
    ) {
        let (failure, classification) = failed.unzip();
        self.attempts.push(AttemptRecord {
            server: server.clone(),
            tool: tool.to_owned(),
            role,
            failure,
            classification,
            waited,
        });
    }
}

pub struct Engine {
    servers: HashMap<Arc<str>, ServerPolicy>,
    clock: Arc<dyn Clock>,
    rng: Arc<Rng>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("servers", &self.servers.keys().collect::<Vec<_>>()).finish()
    }
}

/// Whether `tool` may be replayed: config says so, or its annotations do.
pub fn is_idempotent(recovery: &RecoveryConfig, tool: &str, annotations: Option<&ToolAnnotations>) -> bool {
    if let Some(explicit) = recovery.tools.get(tool).and_then(|t| t.idempotent) {
        return explicit;
    }
    annotations.is_some_and(|a| a.read_only_hint == Some(true) || a.idempotent_hint == Some(true))
}

impl Engine {
    pub fn new<'a>(servers: impl IntoIterator<Item = &'a ServerConfig>, clock: Arc<dyn Clock>, rng: Arc<Rng>) -> Self {
        let servers = servers
            .into_iter()
            .map(|s| {
                let policy = ServerPolicy {
                    recovery: s.recovery.clone(),
                    breaker: Breaker::new(s.recovery.breaker, clock.clone(), rng.clone()),
                    budget: RetryBudget::new(s.recovery.retry.budget_ratio, s.recovery.retry.budget_reserve),
                    counters: Counters::default(),
                };
                (Arc::from(s.name.as_str()), policy)
            })
            .collect();
        Self { servers, clock, rng }
    }

    pub fn policy(&self, server: &str) -> Option<&ServerPolicy> {
        self.servers.get(server)
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Runs `tool` on `server` until it succeeds, fails for good, or runs out of time.
    /// `annotations` are the tool's as its server published them (the caller found the
    /// tool in the catalogue already); `advisor` (the server's adapter) may refine
    /// classifications and supply plans.
    pub async fn run(
        &self,
        upstream: &dyn Upstream,
        advisor: Option<&dyn Advisor>,
        server: Arc<str>,
        tool: String,
        annotations: Option<&ToolAnnotations>,
        arguments: Option<JsonObject>,
    ) -> (Ending, Record) {
        let policy = self.servers.get(&server).expect("the catalogue routes only to configured servers");
        let recovery = &policy.recovery;
        let safe = is_idempotent(recovery, &tool, annotations);
        let started = self.clock.now();
        let deadline = super::clock::later(started, Duration::from_millis(recovery.deadline_for(&tool)));
        let mut record = Record {
            server: server.clone(),
            tool: tool.clone(),
            attempts: Vec::new(),
            safe,
            stopped: None,
            action: None,
        };
        policy.counters.calls.fetch_add(1, Ordering::Relaxed);
        policy.budget.deposit();

        let mut primary = 0u32;
        let mut waited = Duration::ZERO;
        'attempts: loop {
            primary += 1;
            let timeout = Duration::from_millis(recovery.timeout_for(&tool));
            let outcome = self.attempt(upstream, policy, &server, &tool, arguments.clone(), timeout, deadline).await;
            let (failure, builtin) = match outcome {
                Ok(result) => {
                    record.push(&server, &tool, Role::Primary, None, waited);
                    if primary > 1 {
                        policy.counters.recovered.fetch_add(1, Ordering::Relaxed);
                    }
                    if let Some(a) = advisor {
                        a.observe(&server, &tool, arguments.as_ref(), &result).await;
                    }
                    return (Ending::Answered(result), record);
                }
                Err(f) => f,
            };
            let ctx = FailureContext {
                server: &server,
                tool: &tool,
                arguments: arguments.as_ref(),
                attempt: primary,
                elapsed: self.clock.now().saturating_duration_since(started),
                failure: &failure,
            };
            let class = match advisor {
                Some(a) => a.classify(&ctx, &builtin).await.unwrap_or(builtin),
                None => builtin,
            };
            let advised = match advisor {
                Some(a) => a.plan(&ctx, &class).await,
                None => None,
            };
            record.push(&server, &tool, Role::Primary, Some((failure.clone(), class.clone())), waited);
            if class.category == Category::Cancelled {
                record.stopped = Some("the client cancelled the call".into());
                return (Ending::GaveUp, record);
            }
            let steps = match advised {
                Some(steps) => steps,
                // A healthy server said no, and nobody knows better: the agent gets the
                // tool's own answer.
                None if matches!(failure, Failure::ToolError { .. }) && !class.retryable => {
                    let Failure::ToolError { result } = failure else { unreachable!() };
                    let mut result = *result;
                    // An adapter's word on the error goes along with it (hol-cursor: which
                    // build log to read).
                    if let Some(note) = &class.message {
                        result.content.push(rmcp::model::ContentBlock::text(format!("[rebound: {note}]")));
                    }
                    return (Ending::Answered(result), record);
                }
                None => plan::builtin(recovery, &tool, &class),
            };
            if steps.is_empty() && record.stopped.is_none() {
                record.stopped = Some(format!("a {} failure has no recovery", class.category));
            }
            for step in steps {
                match step {
                    Step::Retry(delay) => match self.retry_delay(policy, &class, safe, primary - 1, deadline, delay) {
                        Ok(d) => {
                            policy.counters.retries.fetch_add(1, Ordering::Relaxed);
                            self.clock.sleep(d).await;
                            waited = d;
                            continue 'attempts;
                        }
                        Err(why) => record.stopped = Some(why),
                    },
                    Step::SideCall { tool: side, arguments: args } => {
                        let timeout = Duration::from_millis(recovery.timeout_for(&side));
                        let outcome =
                            self.attempt(upstream, policy, &server, &side, Some(args.clone()), timeout, deadline).await;
                        match outcome {
                            Ok(result) => {
                                if let Some(a) = advisor {
                                    a.observe(&server, &side, Some(&args), &result).await;
                                }
                                record.push(&server, &side, Role::SideCall, None, Duration::ZERO);
                            }
                            Err(f) => record.push(&server, &side, Role::SideCall, Some(f), Duration::ZERO),
                        }
                    }
                    Step::Alternative { server: alt_server, tool: alt_tool, arguments: alt_args } => {
                        if self.clock.now() >= deadline {
                            record.stopped = Some("the call's deadline passed".into());
                            break 'attempts;
                        }
                        let alt_server: Arc<str> =
                            alt_server.as_deref().map(Arc::from).unwrap_or_else(|| server.clone());
                        let Some(alt_policy) = self.servers.get(&alt_server) else { continue };
                        if upstream.annotations(&alt_server, &alt_tool).is_none() {
                            continue; // this server (or version of it) has no such tool
                        }
                        alt_policy.counters.fallbacks.fetch_add(1, Ordering::Relaxed);
                        let args = alt_args.or_else(|| {
                            let configured = plan::configured(recovery, &tool, &alt_tool)?;
                            map_arguments(configured, arguments.as_ref())
                        });
                        let args = args.or_else(|| arguments.clone());
                        let timeout = Duration::from_millis(alt_policy.recovery.timeout_for(&alt_tool));
                        let outcome = self
                            .attempt(upstream, alt_policy, &alt_server, &alt_tool, args.clone(), timeout, deadline)
                            .await;
                        match outcome {
                            Ok(result) => {
                                record.push(&alt_server, &alt_tool, Role::Alternative, None, Duration::ZERO);
                                policy.counters.recovered.fetch_add(1, Ordering::Relaxed);
                                if let Some(a) = advisor {
                                    a.observe(&alt_server, &alt_tool, args.as_ref(), &result).await;
                                }
                                return (Ending::Answered(result), record);
                            }
                            Err(f) => record.push(&alt_server, &alt_tool, Role::Alternative, Some(f), Duration::ZERO),
                        }
                    }
                    Step::Restart => {
                        let within = deadline.saturating_duration_since(self.clock.now());
                        upstream.restart(&server, within).await;
                    }
                    Step::GiveUp(action) => {
                        record.action = Some(action);
                        break 'attempts;
                    }
                }
            }
            break;
        }
        (Ending::GaveUp, record)
    }

    /// One attempt through the breaker, classified when it fails.
    #[allow(clippy::too_many_arguments, reason = "one call's worth of context, used once")]
    async fn attempt(
        &self,
        upstream: &dyn Upstream,
        policy: &ServerPolicy,
        server: &str,
        tool: &str,
        arguments: Option<JsonObject>,
        timeout: Duration,
        deadline: tokio::time::Instant,
    ) -> Result<CallToolResult, (Failure, Classification)> {
        let failed = |f: Failure| {
            let c = classify(&f, self.clock.wall());
            policy.counters.failures.fetch_add(1, Ordering::Relaxed);
            (f, c)
        };
        let remaining = deadline.saturating_duration_since(self.clock.now());
        if remaining.is_zero() {
            return Err(failed(Failure::Timeout { after: Duration::ZERO }));
        }
        let permit = match policy.breaker.admit() {
            Ok(p) => p,
            Err(retry_in) => {
                policy.counters.shed.fetch_add(1, Ordering::Relaxed);
                return Err(failed(Failure::CircuitOpen { retry_in }));
            }
        };
        policy.counters.attempts.fetch_add(1, Ordering::Relaxed);
        match upstream.call(server, tool, arguments, timeout.min(remaining), remaining).await {
            Ok(result) => {
                permit.record(Outcome::Success);
                Ok(result)
            }
            Err(failure) => {
                let (failure, class) = failed(failure);
                permit.record(if class.counts_for_breaker {
                    Outcome::Failure
                } else if matches!(failure, Failure::ToolError { .. }) && !class.retryable {
                    Outcome::Success
                } else {
                    Outcome::Ignored
                });
                Err((failure, class))
            }
        }
    }

    /// How long to wait before retry `n + 1`, or why not to retry.
    fn retry_delay(
        &self,
        policy: &ServerPolicy,
        class: &Classification,
        safe: bool,
        n: u32,
        deadline: tokio::time::Instant,
        asked: Option<Duration>,
    ) -> Result<Duration, String> {
        let retry = &policy.recovery.retry;
        if !class.retryable {
            return Err(format!("a {} failure is not worth retrying", class.category));
        }
        if class.category == Category::CircuitOpen {
            return Err("the server's circuit breaker is open".into());
        }
        if !(safe || class.not_delivered) {
            return Err("the tool is not marked read-only or idempotent, so it is not replayed automatically".into());
        }
        if n + 1 >= retry.max_attempts {
            return Err(format!("all {} attempts were used", retry.max_attempts));
        }
        let base = asked.unwrap_or_else(|| backoff::full_jitter(retry, n, self.rng.unit()));
        let delay = class.retry_after.map_or(base, |after| after.max(base));
        let remaining = deadline.saturating_duration_since(self.clock.now());
        if delay >= remaining {
            return Err(match class.retry_after {
                Some(after) => format!("the server asked to wait {} ms, past the call's deadline", after.as_millis()),
                None => "no time was left before the call's deadline".into(),
            });
        }
        if !policy.budget.withdraw() {
            return Err("the server's retry budget is spent (too many failures recently)".into());
        }
        Ok(delay)
    }
}

/// The alternative's arguments: `"$name"` copies the original argument `name`.
pub fn map_arguments(alt: &Alternative, original: Option<&JsonObject>) -> Option<JsonObject> {
    let Some(template) = &alt.arguments else {
        return original.cloned();
    };
    let mut out = JsonObject::new();
    for (key, value) in template {
        match value {
            Value::String(s) if s.starts_with('$') => {
                if let Some(v) = original.and_then(|o| o.get(&s[1..])) {
                    out.insert(key.clone(), v.clone());
                }
            }
            literal => {
                out.insert(key.clone(), literal.clone());
            }
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests;
