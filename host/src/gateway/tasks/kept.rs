//! The tasks one client session started through the gateway, each with the server
//! instance that holds it: what `gateway::tasks` routes by and answers for.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use rmcp::ErrorData;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::gateway::routing::{ProgressGuard, TaskOwner};
use crate::lasting::Locked;
use crate::transport::Session;

/// The tasks one client session keeps through the gateway at once. Past it, tasks that
/// ended or were lost make room, oldest first; when none has, a new one is refused.
pub const MAX_TASKS: usize = 256;
/// How long a task whose server gives it no `ttl` counts as running, unseen.
const UNSETTLED_AT_MOST: Duration = Duration::from_secs(24 * 3600);

/// One client session's tasks.
#[derive(Default)]
pub struct Tasks {
    started: Mutex<HashMap<String, Arc<Started>>>,
}

/// A task a client started, and where it lives.
pub(super) struct Started {
    pub server: Arc<str>,
    /// The server instance (`ServerHandle::instance`) that holds it.
    pub instance: u64,
    /// The tool, as the client named it.
    pub tool: String,
    created: SystemTime,
    /// When the server will have forgotten it (`ttl` after its creation), if ever.
    expires: Option<SystemTime>,
    /// When the server says it created the task (`createdAt`, as it wrote it).
    created_at: String,
    state: Mutex<Held>,
    /// The task's entry in `Routing` (its status and questions go to this client).
    pub owner: TaskOwner,
    /// Where its progress goes (under the client's token), until it ends.
    progress: Mutex<Option<ProgressGuard>>,
    /// Cancelled once the client has seen the task end (in an answer or a status
    /// notification of the server's), or the task is forgotten (by the client's session, or
    /// by its server: its `ttl` is up): its loss is then nobody's news.
    pub settled: CancellationToken,
}

/// Where a new task came from.
pub(super) struct Origin {
    pub server: Arc<str>,
    pub instance: u64,
    pub session: Arc<Session>,
    /// The tool, as the client named it.
    pub tool: String,
    /// The route of the call's progress, if the client asked for progress.
    pub progress: Option<ProgressGuard>,
}

enum Held {
    /// On this server instance.
    By(Arc<Session>),
    /// Its instance was lost before the client saw it end: why, and when.
    Lost { why: String, at: SystemTime },
}

impl Tasks {
    /// Makes room for one more task, or says why there is none.
    pub(super) fn room(&self) -> Result<(), ErrorData> {
        make_room(&mut self.started.locked())
    }

    /// Keeps task `id` (`created`, the server's `task` object, from `origin`), owned in
    /// `Routing` by what `owner` makes of it and the token that says the client saw it end
    /// (the server's status notifications end it there too). Refused when there is no room, or the session
    /// already has a task of that id (another server's, or an earlier instance's): their
    /// requests could not be told apart.
    pub(super) fn keep(
        &self,
        id: &str,
        created: &Value,
        origin: Origin,
        owner: impl FnOnce(&Origin, &CancellationToken) -> TaskOwner,
    ) -> Result<Arc<Started>, ErrorData> {
        let mut started = self.started.locked();
        if let Some(other) = started.get(id).filter(|t| !t.is_over() && t.owner.owns()) {
            return Err(ErrorData::internal_error(
                format!(
                    "server `{}` created task `{id}`, an id this session's task on server `{}` already has; the gateway cannot tell them apart, so it does not keep the new one",
                    origin.server, other.server
                ),
                None,
            ));
        }
        // Other calls may have filled it while this one was out.
        if !started.contains_key(id) {
            make_room(&mut started)?;
        }
        let settled = CancellationToken::new();
        let owner = owner(&origin, &settled);
        let task = Arc::new(Started::new(origin, created, owner, settled));
        task.settle_when_expired();
        if let Some(previous) = started.insert(id.to_owned(), task.clone()) {
            previous.settled.cancel();
        }
        Ok(task)
    }

    /// The session's task `id`; not one whose server has since given its id to another
    /// task (once its time to live is up, say), which may be another client's.
    pub(super) fn get(&self, id: &str) -> Result<Arc<Started>, ErrorData> {
        let task = self.started.locked().get(id).cloned();
        task.filter(|t| t.owner.owns()).ok_or_else(|| {
            ErrorData::invalid_params(format!("unknown task `{id}`: no task of this session has that id"), None)
        })
    }

    pub(super) fn forget(&self, id: &str) {
        if let Some(task) = self.started.locked().remove(id) {
            task.settled.cancel();
        }
    }

    pub(super) fn all(&self) -> Vec<(String, Arc<Started>)> {
        let started = self.started.locked();
        let owned = started.iter().filter(|(_, t)| t.owner.owns());
        let mut all: Vec<_> = owned.map(|(id, t)| (id.clone(), t.clone())).collect();
        all.sort_by_key(|(_, t)| t.created);
        all
    }
}

/// How long from `now` a task that `expires` then (or never) may count as running.
fn unsettled_for(expires: Option<SystemTime>, now: SystemTime) -> Duration {
    match expires {
        Some(at) => at.duration_since(now).unwrap_or_default().min(UNSETTLED_AT_MOST),
        None => UNSETTLED_AT_MOST,
    }
}

/// Cancels `settled` after `left`, unless something settles it first.
async fn settle_after(settled: CancellationToken, left: Duration) {
    tokio::select! {
        () = tokio::time::sleep(left) => settled.cancel(),
        () = settled.cancelled() => {}
    }
}

/// Room in `started` for one more task: the oldest that is over makes it, if needed.
fn make_room(started: &mut HashMap<String, Arc<Started>>) -> Result<(), ErrorData> {
    if started.len() < MAX_TASKS {
        return Ok(());
    }
    let oldest = started.iter().filter(|(_, t)| t.is_over()).min_by_key(|(_, t)| t.created).map(|(id, _)| id.clone());
    let Some(oldest) = oldest else {
        return Err(ErrorData::invalid_request(
            format!("this session has {MAX_TASKS} tasks in progress through the gateway; wait for one to end"),
            None,
        ));
    };
    if let Some(forgotten) = started.remove(&oldest) {
        forgotten.settled.cancel();
    }
    Ok(())
}

/// The session is gone, and nobody can reach its tasks any more: those still running are
/// cancelled on their servers (a client could otherwise leave any number running on a
/// shared server, 256 a session at a time).
impl Drop for Tasks {
    fn drop(&mut self) {
        for (id, task) in self.started.locked_mut() {
            // (Not one whose id the server has since given to another task.)
            if !task.is_over()
                && task.owner.owns()
                && let Some(session) = task.live_session()
            {
                super::cancel_upstream(&session, id, Some(task.owner.aside(task.instance)));
            }
            task.settled.cancel();
        }
    }
}

impl Started {
    /// Task `created` (the server's `task` object), from `origin`.
    fn new(origin: Origin, created: &Value, owner: TaskOwner, settled: CancellationToken) -> Self {
        let Origin { server, instance, session, tool, progress } = origin;
        let now = SystemTime::now();
        // The server's `createdAt` as it wrote it, when it is a plausible timestamp.
        let created_at =
            created["createdAt"].as_str().filter(|t| t.len() <= 64).map_or_else(|| rfc3339(now), str::to_owned);
        Self {
            server,
            instance,
            tool,
            created: now,
            expires: created["ttl"].as_u64().and_then(|ms| now.checked_add(Duration::from_millis(ms))),
            created_at,
            state: Mutex::new(Held::By(session)),
            owner,
            progress: Mutex::new(progress),
            settled,
        }
    }

    /// Settles the task once its server has forgotten it (its `ttl`; with none, after
    /// [`UNSETTLED_AT_MOST`]), seen or not: a task its client never asks about again does
    /// not count as running (which holds its server's log lines and wedge restarts back
    /// for everyone, `Routing`) for ever.
    fn settle_when_expired(&self) {
        tokio::spawn(settle_after(self.settled.clone(), unsettled_for(self.expires, SystemTime::now())));
    }

    /// Its progress no longer goes to the client: it ended, or its instance is gone.
    pub(super) fn stop_progress(&self) {
        drop(self.progress.locked().take());
    }

    /// Whether it no longer needs a place: the client saw it end, or it was lost, or its
    /// server has forgotten it.
    pub(super) fn is_over(&self) -> bool {
        self.settled.is_cancelled() || self.lost().is_some() || self.expires.is_some_and(|t| t <= SystemTime::now())
    }

    pub(super) fn lost(&self) -> Option<(String, SystemTime)> {
        match &*self.state.locked() {
            Held::By(_) => None,
            Held::Lost { why, at } => Some((why.clone(), *at)),
        }
    }

    pub(super) fn session(&self) -> Option<Arc<Session>> {
        match &*self.state.locked() {
            Held::By(session) => Some(session.clone()),
            Held::Lost { .. } => None,
        }
    }

    /// Notes what the server said of the task: once the client has seen it end, its loss
    /// no longer matters.
    pub(super) fn saw(&self, status: &Value) {
        if matches!(status.as_str(), Some("completed" | "failed" | "cancelled")) {
            self.settled.cancel();
        }
    }

    /// The instance is gone: from now on the gateway answers for the task. True the
    /// first time.
    pub(super) fn lose(&self) -> bool {
        let mut state = self.state.locked();
        if matches!(*state, Held::Lost { .. }) {
            return false;
        }
        let why = format!(
            "the task was lost: server `{}` stopped (a crash or a restart) before it finished, and its next instance does not know it; call the tool again",
            self.server
        );
        *state = Held::Lost { why, at: SystemTime::now() };
        true
    }

    /// The instance that holds the task, while it lives.
    pub(super) fn live_session(&self) -> Option<Arc<Session>> {
        self.session().filter(|s| s.is_live())
    }

    /// The task as the gateway reports it once lost (a `Task` of MCP 2025-11-25).
    pub(super) fn lost_task(&self, id: &str) -> Option<Value> {
        let (why, at) = self.lost()?;
        Some(json!({
            "taskId": id,
            "status": "failed",
            "statusMessage": why,
            "createdAt": self.created_at,
            "lastUpdatedAt": rfc3339(at),
            "ttl": null,
        }))
    }
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_counts_as_running_until_its_server_forgets_it_a_day_at_most() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let ms = Duration::from_millis;
        assert_eq!(unsettled_for(Some(now + ms(300)), now), ms(300));
        assert_eq!(unsettled_for(Some(now - ms(300)), now), Duration::ZERO, "already forgotten");
        assert_eq!(unsettled_for(None, now), UNSETTLED_AT_MOST, "no ttl: a day");
        assert_eq!(unsettled_for(Some(now + UNSETTLED_AT_MOST * 30), now), UNSETTLED_AT_MOST);
    }

    #[tokio::test(start_paused = true)]
    async fn an_unseen_task_is_settled_when_its_time_is_up_and_the_wait_ends_with_it() {
        let settled = CancellationToken::new();
        let waiting = tokio::spawn(settle_after(settled.clone(), Duration::from_secs(60)));
        tokio::time::sleep(Duration::from_secs(59)).await;
        assert!(!settled.is_cancelled());
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(settled.is_cancelled(), "its ttl is up");
        waiting.await.unwrap();
        // Seen to end first, the wait ends at once.
        let seen = CancellationToken::new();
        let waiting = tokio::spawn(settle_after(seen.clone(), UNSETTLED_AT_MOST));
        seen.cancel();
        waiting.await.unwrap();
    }
}
