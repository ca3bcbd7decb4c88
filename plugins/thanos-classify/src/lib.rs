//! thanos-classify: seed 004's error hierarchy and its fallback-strategy table as an
//! adapter, used for every server that names no adapter of its own.
//!
//! The host's built-in classifier already sorts failures into the hierarchy; this adapter
//! adds the strategy table (what each category calls for) and the agent-facing advice.
//!
//! | category | strategy |
//! |---|---|
//! | connection, transport, server-unavailable | back off and retry |
//! | timeout | retry (the host keeps it to safe tools) |
//! | rate-limit | wait the server's retry-after, then retry |
//! | tool-not-found | retry once (the tool list is refreshed meanwhile) |
//! | capability, configuration, protocol, initialization, discovery | do not retry |
//! | tool-validation | do not retry: the arguments must change |
//! | circuit-open | wait for the breaker; the host's fallbacks apply |

wit_bindgen::generate!({ world: "plugin", path: "../../wit/since_v0.1.0", additional_derives: [PartialEq] });

use exports::rebound::adapter::adapter::Guest;
use rebound::adapter::types::{AdapterInfo, Category, Classification, CompletedCall, Failure, Step};

struct Thanos;

/// What seed 004 says to do about each category, for the agent.
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
        Category::CircuitOpen => {
            "the server's circuit breaker is open after repeated failures; wait for it or use a backup"
        }
        Category::RateLimit => "the server is rate-limiting; wait the time it asked for and throttle requests",
        Category::ToolExecution | Category::Cancelled | Category::Other(_) => return None,
    })
}

/// The strategy table.
pub fn strategy(failure: &Failure, class: &Classification) -> Option<Vec<Step>> {
    let give_up = |c: &Category| Step::GiveUp(advice(c).unwrap_or("do not retry").to_owned());
    Some(match &class.category {
        Category::Connection | Category::Transport | Category::ServerUnavailable | Category::Timeout => {
            vec![Step::Retry(None)]
        }
        Category::RateLimit => vec![Step::Retry(class.retry_after_ms)],
        Category::ToolNotFound if failure.attempt == 1 => vec![Step::Retry(None)],
        Category::ToolNotFound
        | Category::Capability
        | Category::Configuration
        | Category::Protocol
        | Category::Initialization
        | Category::Discovery
        | Category::ToolValidation => vec![give_up(&class.category)],
        // Circuit open: the host's configured fallbacks are the backup.
        Category::CircuitOpen | Category::ToolExecution | Category::Cancelled | Category::Other(_) => return None,
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
        assert_eq!(plan(Category::Connection, 1), Some(vec![Step::Retry(None)]));
        assert_eq!(plan(Category::RateLimit, 1), Some(vec![Step::Retry(Some(2_000))]));
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
