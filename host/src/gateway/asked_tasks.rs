//! Tasks servers asked clients to run (MCP 2025-11-25): a server's `sampling/createMessage`
//! or `elicitation/create` with a `task` that a client answered with a task of its own
//! (`CreateTaskResult`), which the server then follows with `tasks/get`, `tasks/result`
//! and `tasks/cancel` requests naming the task, and `tasks/list`.
//!
//! Those requests go to the client that runs the task, whichever client's call is in
//! flight, and to none when no client of the gateway runs it for that server connection:
//! a task id is the client's, so one client's id could name another's task on a shared
//! server. A second task with an id already kept for that connection is refused (a
//! client other than the first is asked to cancel it), so no id ever names two clients'
//! tasks. A server's `tasks/list` goes to the client the usual rule names
//! (`super::routing`), and its answer keeps only the tasks that client runs for that
//! connection. A client's `notifications/tasks/status` about a task goes to the server
//! connection it runs the task for, and to no other server; one that comes while the
//! client's answer creating its task is still on its way (rmcp handles the two on tasks
//! of their own, so the status can pass the answer) waits for that answer, at most
//! [`EARLY_STATUS_WAIT`], [`EARLY_STATUSES`] of a client at once.
//!
//! Kept until the task's time to live ends (at most a day), a minute after the client
//! said it ended (a terminal status in an answer, or its result fetched), or until its
//! client goes or its server restarts or stops; at most [`PER_CONNECTION`] per server
//! connection (so in all, at most that many per connection the configuration and
//! `max_sessions` allow).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::RequestId;
use serde_json::Value;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::routing::ClientPeer;
use crate::lasting::Locked;

/// The most tasks kept for one server connection.
pub const PER_CONNECTION: usize = 256;

/// The longest a task is kept, whatever its time to live.
const LONGEST: Duration = Duration::from_secs(24 * 60 * 60);

/// How long a task is kept once its client said it ended, for the server to fetch its
/// result or ask once more.
const AFTER_END: Duration = Duration::from_secs(60);

/// The longest task id kept.
const MAX_ID_BYTES: usize = 1024;

/// The server requests about one task, which go to the client that runs it.
pub const ABOUT_ONE: [&str; 3] = ["tasks/get", "tasks/result", "tasks/cancel"];

/// The statuses a task ends with.
const ENDED: [&str; 3] = ["completed", "failed", "cancelled"];

/// The longest a client's task status waits for the answer that creates its task.
pub const EARLY_STATUS_WAIT: Duration = Duration::from_secs(2);

/// The most task statuses of one client waiting so at once; past it, one of no task
/// kept is dropped at once.
pub const EARLY_STATUSES: usize = 16;

/// The client running a task, and the call its server asked during.
struct Runner {
    by: ClientPeer,
    during: Option<RequestId>,
    until: Instant,
}

impl Runner {
    fn is_live(&self, now: Instant) -> bool {
        now < self.until && !self.by.peer.is_transport_closed()
    }
}

/// Why a task a client created cannot be kept.
#[derive(Debug)]
pub struct Refused {
    pub why: String,
    /// Whether the client is to be asked to cancel it (not when the id is one of its own
    /// tasks already kept: that one would be cancelled).
    pub cancel: bool,
}

/// The tasks clients run for servers: per upstream session (a server connection), each
/// task id with its client.
#[derive(Default)]
pub struct AskedTasks {
    connections: Mutex<HashMap<u64, HashMap<String, Runner>>>,
    /// Per client, its answers to requests to run as tasks still on their way, and its
    /// statuses waiting for them.
    asking: Mutex<HashMap<Arc<str>, Asking>>,
    /// Told whenever such an answer has been noted (or given up).
    answered: Notify,
}

#[derive(Default)]
pub struct Asking {
    questions: usize,
    statuses: usize,
}

/// One of a client's counts in [`Asking`], taken back when dropped (however its holder
/// ends). A question's end is told to the statuses waiting for it.
pub struct Counted<'a> {
    tasks: &'a AskedTasks,
    client: &'a Arc<str>,
    count: fn(&mut Asking) -> &mut usize,
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.tasks.change(self.client, |a| *(self.count)(a) -= 1);
        self.tasks.answered.notify_waiters();
    }
}

impl AskedTasks {
    /// `by` answered a request of upstream `session`'s server (asked during its call
    /// `during`) with `answer`: the task it created, if it did, is kept as its.
    pub fn created(
        &self,
        session: u64,
        answer: &Value,
        by: &ClientPeer,
        during: Option<RequestId>,
    ) -> Result<(), Refused> {
        let Some(task) = answer.get("task").filter(|t| t.is_object()) else { return Ok(()) };
        let refused = |why: String| Err(Refused { why, cancel: true });
        let Some(id) = task["taskId"].as_str() else { return refused("its task has no `taskId`".to_owned()) };
        if id.len() > MAX_ID_BYTES {
            return refused(format!("its task's id is longer than {MAX_ID_BYTES} bytes"));
        }
        let now = Instant::now();
        let ttl = task["ttl"].as_u64().map_or(LONGEST, |ms| Duration::from_millis(ms).min(LONGEST));
        let mut connections = self.connections.locked();
        // A connection's first task: those whose tasks have all run their time go, one
        // forgotten before an answer on its way was noted among them.
        if !connections.contains_key(&session) {
            connections.retain(|_, tasks| tasks.values().any(|runner| runner.is_live(now)));
        }
        let tasks = connections.entry(session).or_default();
        if let Some(kept) = tasks.get(id).filter(|runner| runner.is_live(now)) {
            let why = format!("a task with id `{id}` already runs for this server");
            return Err(Refused { why, cancel: kept.by.client != by.client });
        }
        if tasks.len() >= PER_CONNECTION {
            tasks.retain(|_, runner| runner.is_live(now));
        }
        if tasks.len() >= PER_CONNECTION {
            return refused(format!(
                "the gateway keeps at most {PER_CONNECTION} tasks that clients run for one server"
            ));
        }
        tasks.insert(id.to_owned(), Runner { by: by.clone(), during, until: now + ttl });
        Ok(())
    }

    /// The client that runs task `id` for upstream `session`, and the call its server
    /// asked during.
    pub fn runner(&self, session: u64, id: &str) -> Option<(ClientPeer, Option<RequestId>)> {
        let connections = self.connections.locked();
        let runner = connections.get(&session)?.get(id).filter(|r| r.is_live(Instant::now()))?;
        Some((runner.by.clone(), runner.during.clone()))
    }

    /// The client's answer about task `id` (to `tasks/result` when `result`) came back to
    /// upstream `session`: once the task has ended, it is kept only a moment longer.
    pub fn answered(&self, session: u64, id: &str, result: bool, answer: &Value) {
        let ended = result || answer["status"].as_str().is_some_and(|s| ENDED.contains(&s));
        if !ended {
            return;
        }
        let mut connections = self.connections.locked();
        if let Some(runner) = connections.get_mut(&session).and_then(|tasks| tasks.get_mut(id)) {
            runner.until = runner.until.min(Instant::now() + AFTER_END);
        }
    }

    /// A client's answer to upstream `session`'s `tasks/list`, with only the tasks
    /// `client` runs for it.
    pub fn only_theirs(&self, session: u64, client: &str, mut answer: Value) -> Value {
        let connections = self.connections.locked();
        let (tasks, now) = (connections.get(&session), Instant::now());
        let theirs = |task: &Value| {
            let runner = task["taskId"].as_str().and_then(|id| tasks?.get(id));
            runner.is_some_and(|r| r.is_live(now) && *r.by.client == *client)
        };
        if let Some(list) = answer.get_mut("tasks").and_then(Value::as_array_mut) {
            list.retain(theirs);
        }
        answer
    }

    /// Whether `client` runs task `id` for upstream `session`.
    pub fn runs_for(&self, session: u64, id: &str, client: &str) -> bool {
        if id.len() > MAX_ID_BYTES {
            return false; // never kept, and not hashed
        }
        let connections = self.connections.locked();
        let runner = connections.get(&session).and_then(|tasks| tasks.get(id));
        runner.is_some_and(|r| r.is_live(Instant::now()) && *r.by.client == *client)
    }

    /// Upstream `session` ended: the tasks run for it are no one's any more.
    pub fn forget_connection(&self, session: u64) {
        self.connections.locked().remove(&session);
    }

    /// `client` is asked to run a request as a task: until the count is dropped (once
    /// its answer is noted, or the question given up), a task status of the client's
    /// waits for that answer.
    pub fn asking<'a>(&'a self, client: &'a Arc<str>) -> Counted<'a> {
        self.change(client, |a| a.questions += 1);
        Counted { tasks: self, client, count: |a| &mut a.questions }
    }

    /// Whether `kept` (whether a task `client` named is kept) holds, now or once the
    /// answers `client` is sending to requests to run as tasks are noted, within
    /// [`EARLY_STATUS_WAIT`]; `false` at once when none is on its way, or when
    /// [`EARLY_STATUSES`] of the client's already wait.
    pub async fn kept_soon(&self, client: &Arc<str>, kept: impl Fn() -> bool) -> bool {
        let waited = async {
            loop {
                let answered = self.answered.notified();
                if kept() {
                    return true;
                }
                if self.asking.locked().get(client).is_none_or(|a| a.questions == 0) {
                    return false;
                }
                answered.await;
            }
        };
        if kept() {
            return true;
        }
        let room = self.asking.locked().get_mut(client).is_some_and(|a| {
            let room = a.questions > 0 && a.statuses < EARLY_STATUSES;
            a.statuses += usize::from(room);
            room
        });
        if !room {
            return false;
        }
        let _counted = Counted { tasks: self, client, count: |a| &mut a.statuses };
        tokio::time::timeout(EARLY_STATUS_WAIT, waited).await.unwrap_or(false)
    }

    /// Changes `client`'s entry, which goes once nothing is counted in it.
    fn change(&self, client: &Arc<str>, change: impl FnOnce(&mut Asking)) {
        let mut asking = self.asking.locked();
        let entry = asking.entry(client.clone()).or_default();
        change(entry);
        if entry.questions == 0 && entry.statuses == 0 {
            asking.remove(client);
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use rmcp::service::RunningService;
    use rmcp::{RoleClient, RoleServer, ServiceExt as _};
    use serde_json::json;

    use super::*;

    pub(in crate::gateway) struct Nothing;
    impl rmcp::ServerHandler for Nothing {}

    /// Client session `name` of a gateway-side server over an in-memory pipe, and both
    /// ends, to keep it open.
    pub(in crate::gateway) async fn session(
        name: &str,
    ) -> (ClientPeer, RunningService<RoleServer, Nothing>, RunningService<RoleClient, ()>) {
        let (ours, theirs) = tokio::io::duplex(1 << 16);
        let server = tokio::spawn(async move { Nothing.serve(ours).await.unwrap() });
        let client = ().serve(theirs).await.unwrap();
        let server = server.await.unwrap();
        (ClientPeer { client: name.into(), peer: server.peer().clone() }, server, client)
    }

    fn created(id: &str, ttl: u64) -> Value {
        json!({"task": {"taskId": id, "status": "working", "ttl": ttl}})
    }

    fn runs(asked: &AskedTasks, session: u64, id: &str) -> Option<String> {
        asked.runner(session, id).map(|(by, _)| by.client.to_string())
    }

    #[tokio::test]
    async fn a_task_is_its_clients_and_its_id_cannot_name_another_clients_task() {
        let ((alice, _a, _ac), (bob, _b, _bc)) = (session("alice").await, session("bob").await);
        let asked = AskedTasks::default();
        asked.created(1, &created("t", 60_000), &alice, Some(RequestId::Number(7))).unwrap();
        assert_eq!(asked.runner(1, "t").unwrap().1, Some(RequestId::Number(7)));
        assert_eq!(runs(&asked, 1, "t").as_deref(), Some("alice"));
        assert_eq!(runs(&asked, 2, "t"), None, "another server connection's task of that id is unknown");
        let refused = asked.created(1, &created("t", 60_000), &bob, None).unwrap_err();
        assert!(refused.why.contains("already runs") && refused.cancel, "{refused:?}");
        assert_eq!(runs(&asked, 1, "t").as_deref(), Some("alice"), "still alice's");
        // Alice's own id again: refused, but her kept task is not to be cancelled.
        assert!(!asked.created(1, &created("t", 60_000), &alice, None).unwrap_err().cancel);
        asked.created(2, &created("t", 60_000), &bob, None).unwrap();
        assert!(asked.runs_for(2, "t", "bob") && !asked.runs_for(1, "t", "bob"));
        assert!(asked.runs_for(1, "t", "alice") && !asked.runs_for(2, "t", "alice"));
        assert!(!asked.runs_for(1, "other", "alice"));
        // An answer that is no task keeps nothing; a task without an id, or a huge one, is refused.
        asked.created(1, &json!({"role": "assistant", "model": "m"}), &bob, None).unwrap();
        assert!(asked.created(1, &json!({"task": {"status": "working"}}), &bob, None).is_err());
        assert!(asked.created(1, &created(&"x".repeat(MAX_ID_BYTES + 1), 1), &bob, None).is_err());
        // A server's task list keeps only what the answering client runs for it.
        asked.created(1, &created("b", 60_000), &bob, None).unwrap();
        let list = json!({"tasks": [{"taskId": "t"}, {"taskId": "b"}, {"taskId": "unknown"}, {}], "nextCursor": "c"});
        assert_eq!(asked.only_theirs(1, "alice", list.clone()), json!({"tasks": [{"taskId": "t"}], "nextCursor": "c"}));
        assert_eq!(asked.only_theirs(1, "bob", list.clone())["tasks"], json!([{"taskId": "b"}]));
        assert_eq!(asked.only_theirs(9, "bob", list)["tasks"], json!([]));
    }

    #[tokio::test]
    async fn a_task_is_kept_for_its_time_to_live_and_within_bounds() {
        let (alice, _a, _ac) = session("alice").await;
        tokio::time::pause();
        let asked = AskedTasks::default();
        asked.created(1, &created("short", 1_000), &alice, None).unwrap();
        for n in 1..PER_CONNECTION {
            asked.created(1, &created(&format!("t{n}"), 60_000), &alice, None).unwrap();
        }
        let refused = asked.created(1, &created("one-more", 60_000), &alice, None).unwrap_err();
        assert!(refused.why.contains("at most 256"), "{refused:?}");
        asked.created(2, &created("one-more", 60_000), &alice, None).expect("another connection has room");
        tokio::time::advance(Duration::from_millis(1_001)).await;
        assert_eq!(runs(&asked, 1, "short"), None, "its time to live ended");
        asked.created(1, &created("one-more", 60_000), &alice, None).expect("the ended task's room");
        // No time to live: kept a day at most.
        asked.created(3, &json!({"task": {"taskId": "forever"}}), &alice, None).unwrap();
        tokio::time::advance(LONGEST).await;
        assert_eq!(runs(&asked, 3, "forever"), None);
        // A connection noted after it was forgotten (an answer on its way as it ended) is
        // not kept past its tasks' time: the next new connection's first task sweeps it.
        asked.forget_connection(1);
        asked.forget_connection(2);
        asked.created(4, &created("t", 60_000), &alice, None).unwrap();
        assert_eq!(asked.connections.lock().unwrap().keys().collect::<Vec<_>>(), [&4]);
    }

    #[tokio::test]
    async fn a_task_that_ended_is_kept_a_moment_and_a_gone_connection_forgets_its_tasks() {
        let (alice, _a, _ac) = session("alice").await;
        tokio::time::pause();
        let asked = AskedTasks::default();
        for id in ["done", "fetched", "working"] {
            asked.created(1, &created(id, 3_600_000), &alice, None).unwrap();
        }
        asked.answered(1, "done", false, &json!({"taskId": "done", "status": "completed"}));
        asked.answered(1, "fetched", true, &json!({"action": "accept"}));
        asked.answered(1, "working", false, &json!({"taskId": "working", "status": "working"}));
        tokio::time::advance(AFTER_END - Duration::from_millis(1)).await;
        assert!(runs(&asked, 1, "done").is_some() && runs(&asked, 1, "fetched").is_some(), "a moment more");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!((runs(&asked, 1, "done"), runs(&asked, 1, "fetched")), (None, None));
        assert!(runs(&asked, 1, "working").is_some());
        asked.forget_connection(1);
        assert_eq!(runs(&asked, 1, "working"), None);
    }

    #[tokio::test]
    async fn a_task_of_a_client_that_went_away_is_no_ones() {
        let (alice, server, client) = session("alice").await;
        let asked = AskedTasks::default();
        asked.created(1, &created("t", 60_000), &alice, None).unwrap();
        client.cancel().await.unwrap();
        let _ = server.waiting().await;
        assert_eq!(runs(&asked, 1, "t"), None);
    }

    /// A client's status that passed its answer creating the task waits for that answer,
    /// and only while such an answer is on its way, for a bounded time, a bounded number.
    #[tokio::test(start_paused = true)]
    async fn a_status_that_passed_its_tasks_creation_waits_for_it() {
        let (alice, _server, _client) = session("alice").await;
        let asked = Arc::new(AskedTasks::default());
        let kept = |asked: &Arc<AskedTasks>| {
            let asked = asked.clone();
            let client = alice.client.clone();
            tokio::spawn(async move { asked.kept_soon(&client, || asked.runs_for(1, "t", "alice")).await })
        };
        let started = Instant::now();
        assert!(!kept(&asked).await.unwrap(), "no task and no question: none");
        assert_eq!(started.elapsed(), Duration::ZERO, "and at once");

        let question = asked.asking(&alice.client);
        let waiting = kept(&asked);
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!waiting.is_finished());
        asked.created(1, &created("t", 60_000), &alice, None).unwrap();
        drop(question);
        assert!(waiting.await.unwrap(), "kept once the answer was noted");
        asked.forget_connection(1);

        // An answer that never comes, and one given up.
        let question = asked.asking(&alice.client);
        let started = Instant::now();
        assert!(!kept(&asked).await.unwrap());
        assert_eq!(started.elapsed(), EARLY_STATUS_WAIT);
        let waiting = kept(&asked);
        tokio::task::yield_now().await;
        drop(question);
        assert!(!waiting.await.unwrap());
        assert!(asked.asking.lock().unwrap().is_empty(), "nothing left counted");

        // At most EARLY_STATUSES of a client wait at once.
        let _question = asked.asking(&alice.client);
        let waiting: Vec<_> = (0..EARLY_STATUSES).map(|_| kept(&asked)).collect();
        tokio::task::yield_now().await;
        let started = Instant::now();
        assert!(!kept(&asked).await.unwrap());
        assert_eq!(started.elapsed(), Duration::ZERO, "one more is dropped at once");
        for w in waiting {
            assert!(!w.await.unwrap());
        }
    }
}
