//! Tasks servers asked clients to run (MCP 2025-11-25): a server's `sampling/createMessage`
//! or `elicitation/create` with a `task` that a client answered with a task of its own
//! (`CreateTaskResult`), which the server then follows with `tasks/get`, `tasks/result`
//! and `tasks/cancel` requests naming the task, and `tasks/list`.
//!
//! Those requests go to the client that runs the task, whichever client's call is in
//! flight, and to none when no client of the gateway runs it for that server connection:
//! a task id is the client's, so one client's id could name another's task on a shared
//! server. A second task with an id already kept for that connection is refused (the
//! client is asked to cancel it), so no id ever names two clients' tasks. A server's
//! `tasks/list` goes to the client the usual rule names (`super::routing`), and its answer
//! keeps only the tasks that client runs for that connection.
//!
//! Kept until the task's time to live ends (at most a day) or its client goes; at most
//! [`PER_CONNECTION`] per server connection and [`KEPT`] in all.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use rmcp::model::RequestId;
use rmcp::{Peer, RoleServer};
use serde_json::Value;
use tokio::time::Instant;

/// The most tasks kept for one server connection.
pub const PER_CONNECTION: usize = 256;

/// The most tasks kept for all servers.
const KEPT: usize = 4096;

/// The longest a task is kept, whatever its time to live.
const LONGEST: Duration = Duration::from_secs(24 * 60 * 60);

/// The longest task id kept.
const MAX_ID_BYTES: usize = 1024;

/// The server requests about one task, which go to the client that runs it.
pub const ABOUT_ONE: [&str; 3] = ["tasks/get", "tasks/result", "tasks/cancel"];

/// The client running a task: its session, and the call the server asked during.
struct Runner {
    peer: Peer<RoleServer>,
    during: Option<RequestId>,
    until: Instant,
}

impl Runner {
    fn is_live(&self, now: Instant) -> bool {
        now < self.until && !self.peer.is_transport_closed()
    }
}

/// The tasks clients run for servers: (upstream session, task id) → its client.
#[derive(Default)]
pub struct AskedTasks {
    tasks: Mutex<HashMap<(u64, String), Runner>>,
}

impl AskedTasks {
    /// `peer` answered a request of upstream `session`'s server (asked during its call
    /// `during`) with `answer`: the task it created, if it did, is kept as its. An error
    /// says why a task could not be kept; the task is then to be cancelled.
    pub fn created(
        &self,
        session: u64,
        answer: &Value,
        peer: &Peer<RoleServer>,
        during: Option<RequestId>,
    ) -> Result<(), String> {
        let Some(task) = answer.get("task").filter(|t| t.is_object()) else { return Ok(()) };
        let Some(id) = task["taskId"].as_str() else { return Err("its task has no `taskId`".to_owned()) };
        if id.len() > MAX_ID_BYTES {
            return Err(format!("its task's id is longer than {MAX_ID_BYTES} bytes"));
        }
        let now = Instant::now();
        let ttl = task["ttl"].as_u64().map_or(LONGEST, |ms| Duration::from_millis(ms).min(LONGEST));
        let mut tasks = self.tasks.lock().expect("not poisoned");
        let key = (session, id.to_owned());
        if tasks.get(&key).is_some_and(|runner| runner.is_live(now)) {
            return Err(format!("a task with id `{id}` already runs for this server"));
        }
        if tasks.len() >= KEPT || tasks.keys().filter(|(s, _)| *s == session).count() >= PER_CONNECTION {
            tasks.retain(|_, runner| runner.is_live(now));
        }
        if tasks.len() >= KEPT {
            return Err(format!("the gateway keeps at most {KEPT} tasks that clients run for servers"));
        }
        if tasks.keys().filter(|(s, _)| *s == session).count() >= PER_CONNECTION {
            return Err(format!("the gateway keeps at most {PER_CONNECTION} tasks that clients run for one server"));
        }
        tasks.insert(key, Runner { peer: peer.clone(), during, until: now + ttl });
        Ok(())
    }

    /// The client that runs task `id` for upstream `session`, and the call its server
    /// asked during.
    pub fn runner(&self, session: u64, id: &str) -> Option<(Peer<RoleServer>, Option<RequestId>)> {
        let tasks = self.tasks.lock().expect("not poisoned");
        let runner = tasks.get(&(session, id.to_owned())).filter(|r| r.is_live(Instant::now()))?;
        Some((runner.peer.clone(), runner.during.clone()))
    }

    /// A client's answer to upstream `session`'s `tasks/list`, with only the tasks that
    /// client runs for it.
    pub fn only_theirs(&self, session: u64, peer: &Peer<RoleServer>, mut answer: Value) -> Value {
        let tasks = self.tasks.lock().expect("not poisoned");
        let now = Instant::now();
        let theirs = |task: &Value| {
            let id = task["taskId"].as_str().unwrap_or_default();
            tasks.get(&(session, id.to_owned())).is_some_and(|r| r.is_live(now) && same(&r.peer, peer))
        };
        if let Some(list) = answer.get_mut("tasks").and_then(Value::as_array_mut) {
            list.retain(theirs);
        }
        answer
    }
}

/// Whether two handles are the same client session: rmcp's `Peer` has no identity of its
/// own, but each session's peer info is one shared cell.
fn same(a: &Peer<RoleServer>, b: &Peer<RoleServer>) -> bool {
    match (a.peer_info(), b.peer_info()) {
        (Some(a), Some(b)) => std::sync::Arc::ptr_eq(&a, &b),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use rmcp::service::RunningService;
    use rmcp::{RoleClient, ServiceExt as _};
    use serde_json::json;

    use super::*;

    struct Nothing;
    impl rmcp::ServerHandler for Nothing {}

    /// A client session of a gateway-side server over an in-memory pipe: its peer, and
    /// both ends to keep it open.
    async fn session() -> (Peer<RoleServer>, RunningService<RoleServer, Nothing>, RunningService<RoleClient, ()>) {
        let (ours, theirs) = tokio::io::duplex(1 << 16);
        let server = tokio::spawn(async move { Nothing.serve(ours).await.unwrap() });
        let client = ().serve(theirs).await.unwrap();
        let server = server.await.unwrap();
        (server.peer().clone(), server, client)
    }

    fn created(id: &str, ttl: u64) -> Value {
        json!({"task": {"taskId": id, "status": "working", "ttl": ttl}})
    }

    #[tokio::test]
    async fn a_task_is_its_clients_and_its_id_cannot_name_another_clients_task() {
        let ((alice, _a, _ac), (bob, _b, _bc)) = (session().await, session().await);
        let asked = AskedTasks::default();
        asked.created(1, &created("t", 60_000), &alice, Some(RequestId::Number(7))).unwrap();
        let (runner, during) = asked.runner(1, "t").expect("kept");
        assert!(same(&runner, &alice) && !same(&runner, &bob));
        assert_eq!(during, Some(RequestId::Number(7)));
        assert!(asked.runner(2, "t").is_none(), "another server connection's task of that id is unknown");
        let refused = asked.created(1, &created("t", 60_000), &bob, None).unwrap_err();
        assert!(refused.contains("already runs"), "{refused}");
        assert!(same(&asked.runner(1, "t").unwrap().0, &alice), "still alice's");
        asked.created(2, &created("t", 60_000), &bob, None).unwrap();
        // An answer that is no task keeps nothing; a task without an id, or a huge one, is refused.
        asked.created(1, &json!({"role": "assistant", "model": "m"}), &bob, None).unwrap();
        assert!(asked.created(1, &json!({"task": {"status": "working"}}), &bob, None).is_err());
        assert!(asked.created(1, &created(&"x".repeat(MAX_ID_BYTES + 1), 1), &bob, None).is_err());
        // A server's task list keeps only what the answering client runs for it.
        asked.created(1, &created("b", 60_000), &bob, None).unwrap();
        let list = json!({"tasks": [{"taskId": "t"}, {"taskId": "b"}, {"taskId": "unknown"}], "nextCursor": "c"});
        assert_eq!(asked.only_theirs(1, &alice, list.clone()), json!({"tasks": [{"taskId": "t"}], "nextCursor": "c"}));
        assert_eq!(asked.only_theirs(1, &bob, list)["tasks"], json!([{"taskId": "b"}]));
    }

    #[tokio::test]
    async fn a_task_is_kept_for_its_time_to_live_and_within_bounds() {
        let (alice, _a, _ac) = session().await;
        tokio::time::pause();
        let asked = AskedTasks::default();
        asked.created(1, &created("short", 1_000), &alice, None).unwrap();
        for n in 1..PER_CONNECTION {
            asked.created(1, &created(&format!("t{n}"), 60_000), &alice, None).unwrap();
        }
        let refused = asked.created(1, &created("one-more", 60_000), &alice, None).unwrap_err();
        assert!(refused.contains("at most 256"), "{refused}");
        asked.created(2, &created("one-more", 60_000), &alice, None).expect("another connection has room");
        tokio::time::advance(Duration::from_millis(1_001)).await;
        assert!(asked.runner(1, "short").is_none(), "its time to live ended");
        asked.created(1, &created("one-more", 60_000), &alice, None).expect("the ended task's room");
        // No time to live: kept a day at most.
        asked.created(3, &json!({"task": {"taskId": "forever"}}), &alice, None).unwrap();
        tokio::time::advance(LONGEST).await;
        assert!(asked.runner(3, "forever").is_none());
    }

    #[tokio::test]
    async fn a_task_of_a_client_that_went_away_is_no_ones() {
        let (alice, server, client) = session().await;
        let asked = AskedTasks::default();
        asked.created(1, &created("t", 60_000), &alice, None).unwrap();
        client.cancel().await.unwrap();
        let _ = server.waiting().await;
        assert!(asked.runner(1, "t").is_none());
    }
}
