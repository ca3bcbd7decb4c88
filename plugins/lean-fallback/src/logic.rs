//! The adapter's decisions, free of the host so that they are unit-tested natively.

use serde_json::{Map, Value, json};

use crate::rebound::adapter::types::{Alternative, Category, Classification, Failure, Outcome, Step};

/// `adapter_config` for this adapter.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// How long to wait before the one retry (default 5 s).
    pub retry_delay_ms: u64,
}

impl Config {
    pub fn from_json(text: &str) -> Self {
        let v: Value = serde_json::from_str(text).unwrap_or(Value::Null);
        Self { retry_delay_ms: v.get("retry_delay_ms").and_then(Value::as_u64).unwrap_or(5_000) }
    }
}

const SEARCHES: [&str; 3] = ["lean_leansearch", "lean_loogle", "lean_leanfinder"];

fn text(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Rpc(e) => format!("{} {}", e.message, e.data.clone().unwrap_or_default()),
        Outcome::ToolError(t) | Outcome::ConnectionLost(t) | Outcome::NotDelivered(t) | Outcome::Other(t) => t.clone(),
        Outcome::Timeout => String::new(),
    }
}

fn aborted(outcome: &Outcome) -> bool {
    let t = text(outcome).to_ascii_lowercase();
    matches!(outcome, Outcome::Timeout)
        || matches!(outcome, Outcome::Rpc(e) if e.code == -32001)
        || t.contains("aborterror")
        || t.contains("operation was aborted")
        || t.contains("timed out")
}

fn rate_limited(outcome: &Outcome) -> bool {
    let t = text(outcome).to_ascii_lowercase();
    t.contains("rate limit") || t.contains("429") || t.contains("too many requests")
}

/// lean-lsp-mcp's error types: `-32001`/AbortError is a timeout (retryable), a rate limit
/// is a rate limit.
pub fn classify(failure: &Failure, builtin: &Classification) -> Option<Classification> {
    if rate_limited(&failure.outcome) {
        return Some(Classification {
            category: Category::RateLimit,
            retryable: true,
            counts_for_breaker: false,
            message: Some(format!("`{}` is rate-limited; `lean_local_search` has no rate limit", failure.tool)),
            ..builtin.clone()
        });
    }
    if aborted(&failure.outcome) {
        return Some(Classification {
            category: Category::Timeout,
            retryable: true,
            message: Some(format!(
                "`{}` timed out (AbortError -32001), often from several lean-lsp-mcp instances contending; pre-build the project with `lake build` and limit concurrent Lean sessions",
                failure.tool
            )),
            ..builtin.clone()
        });
    }
    None
}

fn alternative(tool: &str, arguments: Value) -> Step {
    Step::Alternative(Alternative { server: None, tool: tool.into(), arguments: arguments.to_string() })
}

/// The alternatives for `tool`, with arguments mapped from `args`.
pub fn alternatives(tool: &str, args: &Map<String, Value>) -> Vec<Step> {
    let query = args.get("query").cloned().unwrap_or(Value::Null);
    let count = args.get("num_results").or_else(|| args.get("limit")).cloned();
    let search = |t: &str| {
        let mut a = json!({"query": query});
        if let Some(n) = &count {
            a["num_results"] = n.clone();
        }
        alternative(t, a)
    };
    match tool {
        t if SEARCHES.contains(&t) => SEARCHES.iter().filter(|s| **s != t).map(|s| search(s)).collect(),
        "lean_state_search" => {
            let mut a = Map::new();
            for k in ["file_path", "line", "column", "num_results"] {
                if let Some(v) = args.get(k) {
                    a.insert(k.into(), v.clone());
                }
            }
            vec![alternative("lean_hammer_premise", Value::Object(a))]
        }
        "lean_diagnostic_messages" => {
            // lean_goal needs a position: the range's first line.
            match (args.get("file_path"), args.get("start_line").or_else(|| args.get("line")).filter(|v| !v.is_null()))
            {
                (Some(file), Some(line)) => vec![alternative("lean_goal", json!({"file_path": file, "line": line}))],
                _ => vec![],
            }
        }
        _ => vec![],
    }
}

/// What to say when every alternative failed: continue with the information available.
fn give_up(tool: &str, args: &Map<String, Value>) -> Step {
    Step::GiveUp(match tool {
        "lean_diagnostic_messages" => {
            "run `lake build` in the project (via the shell) to see the diagnostics, and continue with what you have".to_owned()
        }
        "lean_local_search" => {
            "lean_local_search has no alternative; continue with the partial results you have and note what could not be searched".to_owned()
        }
        "lean_state_search" => "explore tactics by hand (lean_multi_attempt) and continue".to_owned(),
        t if SEARCHES.contains(&t) => format!(
            "every Lean search failed for {}; continue with what you found so far and note the search as not done",
            args.get("query").map(Value::to_string).unwrap_or_default()
        ),
        t => format!("`{t}` failed; continue with the information gathered so far and note what could not be checked"),
    })
}

pub fn plan(config: &Config, failure: &Failure, class: &Classification) -> Option<Vec<Step>> {
    let args: Map<String, Value> = serde_json::from_str(&failure.arguments).unwrap_or_default();
    let tool = failure.tool.as_str();
    match class.category {
        Category::RateLimit if SEARCHES.contains(&tool) => {
            let mut steps = vec![alternative(
                "lean_local_search",
                json!({"query": args.get("query").cloned().unwrap_or(Value::Null)}),
            )];
            steps.extend(alternatives(tool, &args));
            steps.push(give_up(tool, &args));
            Some(steps)
        }
        Category::Timeout | Category::RateLimit => {
            let mut steps = Vec::new();
            // Retry once, after a delay.
            if failure.attempt == 1 {
                steps.push(Step::Retry(Some(config.retry_delay_ms)));
            }
            steps.extend(alternatives(tool, &args));
            steps.push(give_up(tool, &args));
            Some(steps)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rebound::adapter::types::{RpcError, Severity};

    fn failure(tool: &str, args: Value, attempt: u32, outcome: Outcome) -> Failure {
        Failure {
            server: "lean".into(),
            tool: tool.into(),
            arguments: args.to_string(),
            attempt,
            elapsed_ms: 0,
            outcome,
        }
    }

    fn abort() -> Outcome {
        Outcome::Rpc(RpcError { code: -32001, message: "AbortError: The operation was aborted".into(), data: None })
    }

    fn builtin() -> Classification {
        Classification {
            category: Category::ToolExecution,
            retryable: false,
            retry_after_ms: None,
            counts_for_breaker: false,
            not_delivered: false,
            severity: Severity::Medium,
            message: None,
        }
    }

    fn planned(tool: &str, args: Value, attempt: u32, outcome: Outcome) -> Vec<(String, Value)> {
        let f = failure(tool, args, attempt, outcome);
        let c = classify(&f, &builtin()).expect("classified");
        plan(&Config::from_json("null"), &f, &c)
            .unwrap()
            .into_iter()
            .map(|s| match s {
                Step::Retry(d) => ("retry".into(), json!(d)),
                Step::Alternative(a) => (a.tool, serde_json::from_str(&a.arguments).unwrap()),
                Step::GiveUp(_) => ("give-up".into(), Value::Null),
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn an_abort_is_retried_once_after_five_seconds_then_the_other_searches() {
        let args = json!({"query": "add comm", "num_results": 3});
        assert_eq!(
            planned("lean_leansearch", args.clone(), 1, abort()),
            [
                ("retry".into(), json!(5000)),
                ("lean_loogle".into(), json!({"query": "add comm", "num_results": 3})),
                ("lean_leanfinder".into(), json!({"query": "add comm", "num_results": 3})),
                ("give-up".into(), Value::Null),
            ]
        );
        let second: Vec<String> = planned("lean_loogle", args, 2, abort()).into_iter().map(|s| s.0).collect();
        assert_eq!(second, ["lean_leansearch", "lean_leanfinder", "give-up"]);
    }

    #[test]
    fn the_delay_is_configurable() {
        assert_eq!(Config::from_json(r#"{"retry_delay_ms": 250}"#).retry_delay_ms, 250);
    }

    #[test]
    fn state_search_falls_back_to_hammer_premise_at_the_same_position() {
        let args = json!({"file_path": "A.lean", "line": 3, "column": 7, "num_results": 4});
        assert_eq!(
            planned("lean_state_search", args.clone(), 2, Outcome::Timeout)[0],
            ("lean_hammer_premise".into(), args)
        );
    }

    #[test]
    fn diagnostics_fall_back_to_goal_where_a_position_is_known_else_to_lake_build() {
        let with = planned("lean_diagnostic_messages", json!({"file_path": "A.lean", "start_line": 12}), 2, abort());
        assert_eq!(with[0], ("lean_goal".into(), json!({"file_path": "A.lean", "line": 12})));
        let f = failure("lean_diagnostic_messages", json!({"file_path": "A.lean"}), 2, abort());
        let c = classify(&f, &builtin()).unwrap();
        let steps = plan(&Config::from_json("null"), &f, &c).unwrap();
        assert!(matches!(&steps[..], [Step::GiveUp(a)] if a.contains("lake build")));
    }

    #[test]
    fn local_search_has_no_alternative() {
        let f = failure("lean_local_search", json!({"query": "x"}), 2, abort());
        let c = classify(&f, &builtin()).unwrap();
        assert!(
            matches!(&plan(&Config::from_json("null"), &f, &c).unwrap()[..], [Step::GiveUp(a)] if a.contains("partial results"))
        );
    }

    #[test]
    fn a_rate_limited_search_goes_to_local_search_first() {
        let steps =
            planned("lean_leanfinder", json!({"query": "q"}), 1, Outcome::ToolError("429 Too Many Requests".into()));
        assert_eq!(steps[0], ("lean_local_search".into(), json!({"query": "q"})));
        assert_eq!(steps[1].0, "lean_leansearch");
    }

    #[test]
    fn other_failures_are_left_to_the_host() {
        let f = failure("lean_goal", json!({}), 1, Outcome::ToolError("no goals".into()));
        assert_eq!(classify(&f, &builtin()), None);
    }
}
