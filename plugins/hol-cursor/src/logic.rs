//! The adapter's decisions, free of the host so that they are unit-tested natively.

use serde_json::{Map, Value, json};

use crate::rebound::adapter::types::{Category, Classification, CompletedCall, Failure, Outcome, Step, ToolCall};

/// The host's key-value store.
pub trait Store {
    fn get(&self, key: &str) -> Option<String>;
    fn set(&mut self, key: &str, value: &str);
    fn delete(&mut self, key: &str);
}

/// The session a call is about (hol4-mcp's default is "default").
fn session_of(args: &Map<String, Value>) -> String {
    args.get("session").or_else(|| args.get("name")).and_then(Value::as_str).unwrap_or("default").to_owned()
}

fn parse(args: &str) -> Map<String, Value> {
    serde_json::from_str(args).unwrap_or_default()
}

fn text(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Rpc(e) => format!("{} {}", e.message, e.data.clone().unwrap_or_default()),
        Outcome::ToolError(t) | Outcome::ConnectionLost(t) | Outcome::NotDelivered(t) | Outcome::Other(t) => t.clone(),
        Outcome::Timeout => String::new(),
    }
}

/// Whether the server says it has no such session (never started, dead, or lost when
/// the server restarted).
pub fn session_lost(outcome: &Outcome) -> bool {
    let t = text(outcome).to_ascii_lowercase();
    t.contains("session")
        && ["not found", "no session", "unknown session", "does not exist", "not running", "is dead", "no such"]
            .iter()
            .any(|p| t.contains(p))
}

/// Learns from a successful call.
pub fn observe(store: &mut dyn Store, call: &CompletedCall) {
    let args = parse(&call.arguments);
    let session = session_of(&args);
    let str_arg = |k: &str| args.get(k).and_then(Value::as_str).map(str::to_owned);
    match call.tool.as_str() {
        "hol_start" | "hol_restart" => {
            if let Some(workdir) = str_arg("workdir") {
                store.set(&format!("session/{session}"), &workdir);
            }
        }
        "hol_stop" => {
            store.delete(&format!("session/{session}"));
            store.delete(&format!("cursor/{session}"));
        }
        "hol_cursor_init" => {
            let file = str_arg("file");
            let workdir = str_arg("workdir").or_else(|| store.get(&format!("session/{session}")));
            if let Some(workdir) = &workdir {
                store.set(&format!("session/{session}"), workdir);
            }
            let cursor = json!({"file": file, "workdir": workdir, "theorem": str_arg("start_at")});
            store.set(&format!("cursor/{session}"), &cursor.to_string());
        }
        "hol_cursor_goto" => {
            let key = format!("cursor/{session}");
            let mut cursor: Map<String, Value> = store.get(&key).map(|c| parse(&c)).unwrap_or_default();
            cursor.insert("theorem".into(), json!(str_arg("theorem_name")));
            store.set(&key, &Value::Object(cursor).to_string());
        }
        // Tools that start a session on demand from a file's workdir.
        "hol_state_at" | "hol_check_proof" | "hol_file_status" => {
            if let Some(workdir) = str_arg("workdir") {
                store.set(&format!("session/{session}"), &workdir);
            }
        }
        _ => {}
    }
}

/// Refines the gateway's classification.
pub fn classify(failure: &Failure, builtin: &Classification) -> Option<Classification> {
    if failure.tool == "hol_send" && matches!(failure.outcome, Outcome::Timeout) {
        return Some(Classification {
            retryable: false,
            message: Some("the HOL command did not finish in time; it may still have changed the proof state".into()),
            ..builtin.clone()
        });
    }
    if session_lost(&failure.outcome) {
        return Some(Classification {
            category: Category::Other("session-lost".into()),
            retryable: true,
            // The server had no such session: the command never ran.
            not_delivered: true,
            counts_for_breaker: false,
            message: Some(format!("the HOL session `{}` was gone", session_of(&parse(&failure.arguments)))),
            ..builtin.clone()
        });
    }
    if failure.tool == "holmake" && matches!(failure.outcome, Outcome::ToolError(_)) {
        let args = parse(&failure.arguments);
        let workdir = args.get("workdir").and_then(Value::as_str).unwrap_or(".");
        let theory = failed_theory(&text(&failure.outcome));
        let hint = match theory {
            Some(t) => format!(
                "Holmake failed building `{t}`; read its log with hol_log(workdir=\"{workdir}\", theory=\"{t}\")"
            ),
            None => format!(
                "Holmake failed; list the build logs with hol_logs(workdir=\"{workdir}\") and read one with hol_log"
            ),
        };
        return Some(Classification { message: Some(hint), ..builtin.clone() });
    }
    None
}

/// The theory named in Holmake's failure output (`fooTheory` or "building foo").
pub fn failed_theory(output: &str) -> Option<String> {
    output.split(|c: char| !(c.is_alphanumeric() || c == '_')).find_map(|w| {
        let t = w.strip_suffix("Theory")?;
        (!t.is_empty()).then(|| t.to_owned())
    })
}

/// What to do about a failure.
pub fn plan(store: &dyn Store, failure: &Failure, class: &Classification) -> Option<Vec<Step>> {
    let args = parse(&failure.arguments);
    let session = session_of(&args);
    let call =
        |tool: &str, arguments: Value| Step::SideCall(ToolCall { tool: tool.into(), arguments: arguments.to_string() });

    if failure.tool == "hol_send" && matches!(failure.outcome, Outcome::Timeout) {
        return Some(vec![
            call("hol_interrupt", json!({"session": session})),
            Step::GiveUp(format!(
                "the command was interrupted (hol_interrupt) and not replayed; session `{session}` is still there: check its state, then send a smaller step or a larger `timeout`"
            )),
        ]);
    }
    if class.category == Category::Other("session-lost".into()) {
        // Restore once; if the retry fails the same way, say so.
        if failure.attempt > 1 {
            return Some(vec![Step::GiveUp(format!(
                "session `{session}` could not be restored; call hol_start(workdir, name=\"{session}\") yourself"
            ))]);
        }
        let Some(workdir) = store.get(&format!("session/{session}")) else {
            return Some(vec![Step::GiveUp(format!(
                "session `{session}` is gone and its workdir was never seen; call hol_start(workdir, name=\"{session}\")"
            ))]);
        };
        let mut steps = vec![call("hol_start", json!({"workdir": workdir, "name": session}))];
        if let Some(cursor) = store.get(&format!("cursor/{session}")).map(|c| parse(&c)) {
            // The host skips these where the server has no cursor tools.
            match cursor.get("theorem").and_then(Value::as_str) {
                Some(theorem) => {
                    steps.push(call("hol_cursor_goto", json!({"session": session, "theorem_name": theorem})))
                }
                None => {
                    if let Some(file) = cursor.get("file").and_then(Value::as_str) {
                        steps.push(call(
                            "hol_cursor_init",
                            json!({"file": file, "session": session, "workdir": workdir}),
                        ));
                    }
                }
            }
        }
        steps.push(Step::Retry(Some(0)));
        return Some(steps);
    }
    if matches!(failure.outcome, Outcome::ConnectionLost(_)) && failure.tool.starts_with("hol") {
        return Some(vec![Step::GiveUp(format!(
            "the HOL server stopped and is being restarted; its sessions are restored on your next call to session `{session}`, but the proof state since the last cursor position is lost"
        ))]);
    }
    None
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::rebound::adapter::types::{RpcError, Severity};

    #[derive(Default)]
    struct Mem(BTreeMap<String, String>);

    impl Store for Mem {
        fn get(&self, key: &str) -> Option<String> {
            self.0.get(key).cloned()
        }
        fn set(&mut self, key: &str, value: &str) {
            self.0.insert(key.into(), value.into());
        }
        fn delete(&mut self, key: &str) {
            self.0.remove(key);
        }
    }

    fn ok(tool: &str, args: Value) -> CompletedCall {
        CompletedCall { server: "hol".into(), tool: tool.into(), arguments: args.to_string(), call_result: "{}".into() }
    }

    fn failure(tool: &str, args: Value, attempt: u32, outcome: Outcome) -> Failure {
        Failure {
            server: "hol".into(),
            tool: tool.into(),
            arguments: args.to_string(),
            attempt,
            elapsed_ms: 0,
            outcome,
        }
    }

    fn builtin() -> Classification {
        Classification {
            category: Category::Timeout,
            retryable: true,
            retry_after_ms: None,
            counts_for_breaker: true,
            not_delivered: false,
            severity: Severity::High,
            message: None,
        }
    }

    fn side(step: &Step) -> (String, Value) {
        match step {
            Step::SideCall(c) => (c.tool.clone(), serde_json::from_str(&c.arguments).unwrap()),
            other => panic!("not a side call: {other:?}"),
        }
    }

    #[test]
    fn a_timed_out_send_is_interrupted_never_replayed() {
        let f = failure("hol_send", json!({"session": "main", "command": "e(metis_tac[])"}), 1, Outcome::Timeout);
        let c = classify(&f, &builtin()).unwrap();
        assert!(!c.retryable);
        let steps = plan(&Mem::default(), &f, &c).unwrap();
        assert_eq!(side(&steps[0]), ("hol_interrupt".into(), json!({"session": "main"})));
        assert!(matches!(&steps[1], Step::GiveUp(a) if a.contains("not replayed")));
        assert!(!steps.iter().any(|s| matches!(s, Step::Retry(_))));
    }

    #[test]
    fn a_lost_session_is_restored_from_what_was_learned() {
        let mut store = Mem::default();
        observe(&mut store, &ok("hol_start", json!({"workdir": "/proj", "name": "main"})));
        observe(&mut store, &ok("hol_cursor_init", json!({"file": "/proj/fooScript.sml", "session": "main"})));
        observe(&mut store, &ok("hol_cursor_goto", json!({"session": "main", "theorem_name": "add_comm"})));
        let f = failure(
            "hol_send",
            json!({"session": "main", "command": "e(simp[])"}),
            1,
            Outcome::ToolError("Error: Session 'main' not found. Start it with hol_start.".into()),
        );
        let c = classify(&f, &builtin()).unwrap();
        assert!(c.not_delivered && c.retryable);
        let steps = plan(&store, &f, &c).unwrap();
        assert_eq!(side(&steps[0]), ("hol_start".into(), json!({"workdir": "/proj", "name": "main"})));
        assert_eq!(side(&steps[1]), ("hol_cursor_goto".into(), json!({"session": "main", "theorem_name": "add_comm"})));
        assert_eq!(steps[2], Step::Retry(Some(0)));
        // A second failure the same way gives up.
        let again = failure("hol_send", json!({"session": "main"}), 2, f.outcome.clone());
        assert!(matches!(&plan(&store, &again, &c).unwrap()[..], [Step::GiveUp(_)]));
    }

    #[test]
    fn an_unknown_session_without_a_workdir_asks_the_agent() {
        let f = failure(
            "hol_send",
            json!({"session": "x"}),
            1,
            Outcome::Rpc(RpcError { code: -32602, message: "unknown session x".into(), data: None }),
        );
        let c = classify(&f, &builtin()).unwrap();
        assert!(matches!(&plan(&Mem::default(), &f, &c).unwrap()[..], [Step::GiveUp(a)] if a.contains("hol_start")));
    }

    #[test]
    fn stopping_a_session_forgets_it() {
        let mut store = Mem::default();
        observe(&mut store, &ok("hol_start", json!({"workdir": "/p"})));
        assert_eq!(store.get("session/default").as_deref(), Some("/p"));
        observe(&mut store, &ok("hol_stop", json!({"session": "default"})));
        assert!(store.0.is_empty());
    }

    #[test]
    fn a_failed_holmake_points_to_the_theory_log() {
        let f = failure(
            "holmake",
            json!({"workdir": "/proj"}),
            1,
            Outcome::ToolError("Holmake failed:\nFailed to build fooTheory\n".into()),
        );
        let c = classify(&f, &builtin()).unwrap();
        assert_eq!(
            c.message.as_deref().unwrap(),
            "Holmake failed building `foo`; read its log with hol_log(workdir=\"/proj\", theory=\"foo\")"
        );
        assert_eq!(plan(&Mem::default(), &f, &c), None, "the build output itself reaches the agent");
    }
}
