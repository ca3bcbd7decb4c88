//! thanos-classify: the MCP error taxonomy's fallback-strategy table as an adapter, used
//! for every server that names no adapter of its own.
//!
//! The host's built-in classifier already sorts failures into the taxonomy, and its
//! built-in plan already backs off and retries what is transient (honouring retry-after),
//! then runs the configured fallbacks. This adapter adds only what the built-in plan
//! lacks: the agent-facing advice for each category, and a definite "do not retry" where
//! retrying cannot help. Where it has nothing to add it returns no plan, so the built-in
//! one applies unchanged.
//!
//! | category | strategy |
//! |---|---|
//! | connection, transport, server-unavailable, timeout, rate-limit | the built-in plan (no plan of its own) |
//! | tool-not-found | retry once (the tool list is refreshed meanwhile), then give up |
//! | capability, configuration, protocol, initialization, discovery | do not retry |
//! | tool-validation | do not retry: the arguments must change |
//! | circuit-open, tool-execution | the built-in plan: the configured fallbacks |

wit_bindgen::generate!({ world: "plugin", path: "../../wit/since_v0.2.0", additional_derives: [PartialEq] });

use exports::rebound::adapter::adapter::{Guest, Manifest};
use rebound::adapter::types::{AdapterInfo, Category, Classification, CompletedCall, Failure, Step};

struct Thanos;

/// What to do about each category, for the agent.
pub fn advice(category: &Category) -> Option<&'static str> {
    Some(match category {
        Category::Connection => {
            "connection to the server failed; retried with backoff. If it persists, check that the server is running"
        }
        Category::Transport => "the transport to the server failed; check the server process and its configuration",
        Category::Timeout => "the server did not answer in time; increase the timeout or check the server's health",
        Category::Protocol => {
            "the server broke the MCP protocol; report it to its maintainer and use an alternative server"
        }
        Category::Initialization => "the server failed to initialise; check its version and configuration",
        Category::Capability => "the server lacks the capability for this; use a different server or approach",
        Category::ToolNotFound => {
            "the tool does not exist on the server (any more); refresh the tool list and check the name"
        }
        Category::ToolValidation => "the arguments were rejected; fix them against the tool's schema",
        Category::Configuration => "the MCP configuration is invalid; fix the configuration file",
        Category::Discovery => "no server configuration was found; create one in a searched location",
        Category::ServerUnavailable => "the server is unavailable or unhealthy; wait and retry, and check its logs",
        Category::CircuitOpen => "a circuit breaker is open after repeated failures; wait for it or use a backup",
        Category::RateLimit => "the server is rate-limiting; wait the time it asked for and throttle requests",
        Category::ToolExecution | Category::Cancelled | Category::Other(_) => return None,
    })
}

/// The strategy table.
pub fn strategy(failure: &Failure, class: &Classification) -> Option<Vec<Step>> {
    let give_up = |c: &Category| Step::GiveUp(advice(c).unwrap_or("do not retry").to_owned());
    Some(match &class.category {
        Category::ToolNotFound if failure.attempt == 1 => vec![Step::Retry(None)],
        Category::ToolNotFound
        | Category::Capability
        | Category::Configuration
        | Category::Protocol
        | Category::Initialization
        | Category::Discovery
        | Category::ToolValidation => vec![give_up(&class.category)],
        // The built-in plan already does what the strategy table says: back off and
        // retry (honouring retry-after), then the configured fallbacks.
        Category::Connection
        | Category::Transport
        | Category::ServerUnavailable
        | Category::Timeout
        | Category::RateLimit
        | Category::CircuitOpen
        | Category::ToolExecution
        | Category::Cancelled
        | Category::Other(_) => return None,
    })
}

impl Guest for Thanos {
    fn info() -> AdapterInfo {
        AdapterInfo {
            name: "thanos-classify".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            servers: vec![],
            tools: vec![],
        }
    }

    fn declare() -> Manifest {
        // It needs nothing beyond the built-in plan, and learns nothing from successes.
        Manifest { tools: vec![], restart: false, observes: vec![] }
    }

    fn classify(_failure: Failure, builtin: Classification) -> Option<Classification> {
        let message = advice(&builtin.category)?;
        Some(Classification { message: Some(message.to_owned()), ..builtin })
    }

    fn plan(failure: Failure, class: Classification) -> Option<Vec<Step>> {
        strategy(&failure, &class)
    }

    fn observe(_call: CompletedCall) {}
}

export!(Thanos);

#[cfg(test)]
mod tests {
    use super::*;
    use rebound::adapter::types::{Outcome, Severity};

    fn class(category: Category) -> Classification {
        Classification {
            category,
            retryable: true,
            retry_after_ms: Some(2_000),
            counts_for_breaker: false,
            not_delivered: false,
            severity: Severity::Medium,
            message: None,
        }
    }

    fn failure(attempt: u32) -> Failure {
        Failure {
            server: "s".into(),
            tool: "t".into(),
            arguments: "{}".into(),
            attempt,
            elapsed_ms: 0,
            outcome: Outcome::Timeout,
        }
    }

    #[test]
    fn the_strategy_table() {
        let plan = |c, n| strategy(&failure(n), &class(c));
        // Nothing beyond the built-in plan: no plan, so configured fallbacks still run.
        for c in [Category::Connection, Category::Transport, Category::ServerUnavailable, Category::Timeout] {
            assert_eq!(plan(c, 1), None);
        }
        assert_eq!(plan(Category::RateLimit, 1), None);
        assert_eq!(plan(Category::ToolNotFound, 1), Some(vec![Step::Retry(None)]));
        assert!(matches!(plan(Category::ToolNotFound, 2).unwrap()[..], [Step::GiveUp(_)]));
        for c in [Category::Capability, Category::Configuration, Category::Protocol, Category::ToolValidation] {
            assert!(matches!(plan(c, 1).unwrap()[..], [Step::GiveUp(_)]));
        }
        assert_eq!(plan(Category::CircuitOpen, 1), None);
        assert_eq!(plan(Category::ToolExecution, 1), None);
    }

    #[test]
    fn classify_adds_the_advice_and_keeps_the_rest() {
        let c = Thanos::classify(failure(1), class(Category::RateLimit)).unwrap();
        assert!(c.message.unwrap().contains("rate-limiting"));
        assert_eq!(c.retry_after_ms, Some(2_000));
        assert_eq!(Thanos::classify(failure(1), class(Category::ToolExecution)), None);
    }
}
