//! MCP 2026-07-28's tasks extension (`io.modelcontextprotocol/tasks`) through the
//! gateway, between a client and a server that both speak it. A server may answer a
//! `tools/call` whose request declares the extension with a task (`resultType: "task"`)
//! instead of its result; the gateway declares it upstream only for the tool the client
//! called (not for an alternative or an adapter's side call, whose task the client never
//! asked for), and only when the client declared it.
//!
//! The client gets an id of the gateway's own for the task: 128 random bits, standing for
//! the server instance that holds it and that server's id. `tasks/get`, `tasks/update` and
//! `tasks/cancel` go to that instance under the server's id, and the answers come back
//! under the gateway's. A client on 2026-07-28 has no session: whoever holds a task's id
//! may ask about it, as the extension has it; the ids cannot be guessed, and none names
//! another server's task or another instance's.
//!
//! A task whose server process is lost (a crash, a restart) cannot be finished by the
//! next one, which never heard of it (a `url` server's task is asked for on its current
//! connection): `tasks/get` answers it `failed` from then on, saying why, and
//! the errors log has it once. The gateway keeps a task for its `ttlMs` from its creation
//! (at most a day; an hour when the server gave none), and at most [`MAX_RELAYED`] at once,
//! [`MAX_RELAYED_PER_CLIENT`] running of one address's over HTTP: a call is declared able
//! to become a task only while there is room.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime};

use rmcp::model::{
    CancelTaskParams, CancelTaskRequest, ClientRequest, CreateTaskResult, DetailedTask, GetTaskParams, GetTaskRequest,
    GetTaskResult, RequestMetaObject, ServerResult, Task, TaskPayload, TaskStatus, UpdateTaskParams, UpdateTaskRequest,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use serde_json::json;

use super::super::answered::until_cancelled;
use super::super::call::{Tasks, request_meta};
use super::super::forward::{Fault, Instance, Out};
use super::super::server::Gateway;
use super::super::tally::Tally;
use super::{MAX_ID_BYTES, lost_record};
use crate::lasting::Locked;
use crate::recovery::Failure;
use crate::transport::Session;

/// The most tasks the gateway relays at once, for all clients.
pub const MAX_RELAYED: usize = 4096;

/// The most of them still running that one address has over HTTP, where a 2026-07-28
/// client has no session (`server::task_owner`); a stdio gateway has one client. The
/// addresses of one IPv6 site (a /48) have twice that together.
pub const MAX_RELAYED_PER_CLIENT: usize = 256;
pub const MAX_RELAYED_PER_NETWORK: usize = 2 * MAX_RELAYED_PER_CLIENT;

/// The shares a task of `owner` takes, each with its bound: its address's, and its IPv6
/// site's.
fn shares(owner: &Arc<str>) -> impl Iterator<Item = (Arc<str>, usize)> {
    let network = crate::gateway::http::network_of(owner).map(|n| (Arc::from(n), MAX_RELAYED_PER_NETWORK));
    std::iter::once((owner.clone(), MAX_RELAYED_PER_CLIENT)).chain(network)
}

/// How long a task is kept when its server set no `ttlMs`, and the longest it is kept.
const DEFAULT_TTL: Duration = Duration::from_secs(3600);
const MAX_TTL: Duration = Duration::from_secs(24 * 3600);

/// The tasks relayed, by the gateway's ids.
#[derive(Default)]
pub struct Relayed {
    tasks: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    by_id: HashMap<String, Arc<Entry>>,
    /// How many each client has (and each IPv6 site: see [`shares`]).
    per_client: Tally<Arc<str>>,
    /// Of the tasks that take a client's share (over HTTP), how many each server holds
    /// (on any of its instances: a `url` server's tasks outlive a relaunch), by the time
    /// each is kept until.
    per_server: HashMap<Arc<str>, BTreeMap<Instant, usize>>,
}

impl Table {
    fn insert(&mut self, id: String, entry: Entry) {
        // A server that gives an id again (once its time to live is up, say) means its
        // new task by it: the older task of that id is forgotten, so that its client, who
        // may be another, cannot reach the new one through it.
        self.forget_upstream(&entry.server, &entry.session, entry.process, &entry.upstream);
        if let Some(owner) = &entry.owner {
            for (share, _) in shares(owner) {
                self.per_client.add(share, 1);
            }
            *self.per_server.entry(entry.server.clone()).or_default().entry(entry.until).or_default() += 1;
            entry.counted.store(true, Ordering::Release);
        }
        self.by_id.insert(id, Arc::new(entry));
    }

    /// Forgets the tasks that `server` held under its id `upstream` (on connection
    /// `session`, if the server is a process), and says whether there were any.
    fn forget_upstream(&mut self, server: &str, session: &Weak<Session>, process: bool, upstream: &str) -> bool {
        // (A process's task is its connection's: another connection's of that id is
        // another task already, which its own connection's loss reports.)
        let same_task_id =
            |e: &Entry| &*e.server == server && e.upstream == upstream && (!process || e.session.ptr_eq(session));
        let reused: Vec<String> =
            (self.by_id.iter()).filter(|(_, e)| same_task_id(e)).map(|(id, _)| id.clone()).collect();
        for id in &reused {
            self.remove(id);
        }
        !reused.is_empty()
    }

    fn remove(&mut self, id: &str) {
        if let Some(entry) = self.by_id.remove(id) {
            self.release(&entry);
        }
    }

    /// `entry` no longer takes its owner's share (it ended, or is forgotten).
    fn release(&mut self, entry: &Entry) {
        let Some(owner) = entry.owner.as_ref().filter(|_| entry.counted.swap(false, Ordering::AcqRel)) else { return };
        for (share, _) in shares(owner) {
            self.per_client.take_back(&share, 1);
        }
        if let Some(deadlines) = self.per_server.get_mut(&entry.server) {
            if let Some(n) = deadlines.get_mut(&entry.until) {
                *n -= 1;
                if *n == 0 {
                    deadlines.remove(&entry.until);
                }
            }
            if deadlines.is_empty() {
                self.per_server.remove(&entry.server);
            }
        }
    }

    /// Forgets the tasks whose time is up, when the table is full or `owner`'s share is.
    fn prune_for(&mut self, owner: Option<&str>) {
        if !self.full_for(owner) {
            return;
        }
        let now = Instant::now();
        let expired: Vec<String> =
            self.by_id.iter().filter(|(_, e)| e.until <= now).map(|(id, _)| id.clone()).collect();
        for id in expired {
            self.remove(&id);
        }
        // Still full: a client's task seen ended (kept only to be asked about again, its
        // result perhaps not fetched yet) makes room: one of the client holding the most
        // tasks, the one whose time is nearest up, so that tasks started and ended from one
        // address, however many, cannot keep everyone else's from being relayed, nor make
        // room with theirs.
        if self.by_id.len() >= MAX_RELAYED {
            let mut holds: HashMap<&str, usize> = HashMap::new();
            for owner in self.by_id.values().filter_map(|e| e.owner.as_deref()) {
                *holds.entry(owner).or_default() += 1;
            }
            let seen_ended = |e: &Entry| e.owner.is_some() && !e.counted.load(Ordering::Acquire);
            let first = self.by_id.iter().filter(|(_, e)| seen_ended(e)).max_by_key(|(_, e)| {
                let held = e.owner.as_deref().map_or(0, |o| holds[o]);
                (held, std::cmp::Reverse(e.until))
            });
            if let Some(id) = first.map(|(id, _)| id.clone()) {
                self.remove(&id);
            }
        }
    }

    /// Whether the table, or one of `owner`'s shares of it (of the tasks that have not
    /// ended), is full.
    fn full_for(&self, owner: Option<&str>) -> bool {
        let full = |(share, max): (Arc<str>, usize)| self.per_client.of(&share) >= max;
        self.by_id.len() >= MAX_RELAYED || owner.is_some_and(|o| shares(&Arc::from(o)).any(full))
    }

    fn has_room(&mut self, owner: Option<&str>) -> bool {
        self.prune_for(owner);
        !self.full_for(owner)
    }
}

/// Where one task lives.
pub struct Entry {
    server: Arc<str>,
    tool: String,
    instance: u64,
    session: Weak<Session>,
    /// The client whose share it takes while it runs (none over stdio).
    owner: Option<Arc<str>>,
    /// Whether it takes that share now: until it is seen ended.
    counted: AtomicBool,
    /// A task of a server on 2025-11-25 (`super::bridged`).
    legacy: bool,
    /// Held by a server process, lost with it; else by a `url` server, which keeps it
    /// across its connections.
    process: bool,
    /// The server's id for it.
    upstream: String,
    created_at: String,
    until: Instant,
    /// Why the gateway answers it failed for good, once it does (`failed_for_good`): its
    /// instance was found gone, or (`super::bridged`) it could not go on.
    pub(super) ended_as: std::sync::OnceLock<String>,
    /// How many polls in a row found it ended but could not have its result
    /// (`super::bridged`).
    pub(super) result_misses: std::sync::atomic::AtomicU32,
}

/// The server instance a task was created on, and the tool called.
pub struct Origin<'a> {
    pub server: &'a Arc<str>,
    pub tool: &'a str,
    pub instance: u64,
    pub session: &'a Arc<Session>,
    /// The client whose share it takes (`server::task_owner`).
    pub owner: Option<Arc<str>>,
    /// The server is on 2025-11-25 (`super::bridged`).
    pub legacy: bool,
}

impl Relayed {
    /// Keeps the task `created` on `origin` and returns it under an id of the gateway's
    /// own; one that cannot be kept is cancelled upstream.
    pub fn keep(&self, mut created: CreateTaskResult, origin: Origin<'_>) -> Result<CreateTaskResult, Failure> {
        let upstream = std::mem::take(&mut created.task.task_id);
        let refuse = |failure: Failure| {
            cancel_upstream(origin.session, &upstream);
            Err(failure)
        };
        if upstream.len() > MAX_ID_BYTES {
            let reason = format!("the server created a task whose id is longer than {MAX_ID_BYTES} bytes");
            return refuse(Failure::Protocol { reason });
        }
        let ttl = created.task.ttl_ms.map_or(DEFAULT_TTL, Duration::from_millis).min(MAX_TTL);
        let id = format!("rebound-{:032x}", rand::random::<u128>());
        let entry = Entry {
            server: origin.server.clone(),
            tool: origin.tool.to_owned(),
            instance: origin.instance,
            session: Arc::downgrade(origin.session),
            owner: origin.owner.clone(),
            counted: AtomicBool::new(false),
            legacy: origin.legacy,
            process: origin.session.is_process(),
            upstream: upstream.clone(),
            created_at: stamp(&created.task.created_at),
            until: Instant::now() + ttl,
            ended_as: std::sync::OnceLock::new(),
            result_misses: std::sync::atomic::AtomicU32::new(0),
        };
        let mut tasks = self.tasks.locked();
        if !tasks.has_room(origin.owner.as_deref()) {
            drop(tasks);
            // Concurrent calls may all have found room when they were sent: the client's
            // load, which must not open the server's breaker for every client.
            return refuse(Failure::GatewayLimit {
                reason: format!(
                    "the gateway already relays {MAX_RELAYED} tasks, or {MAX_RELAYED_PER_CLIENT} of this client's, or {MAX_RELAYED_PER_NETWORK} of its IPv6 site's; the task was cancelled"
                ),
            });
        }
        tasks.insert(id.clone(), entry);
        created.task.task_id = id;
        Ok(created)
    }

    /// Whether there is room for one more task of `owner`'s: a call is made a task only
    /// then, so that one is not refused once its server has started it.
    pub fn has_room(&self, owner: Option<&str>) -> bool {
        self.tasks.locked().has_room(owner)
    }

    /// Whether a task an HTTP client had relayed may still run on `server` (not seen
    /// ended, nor lost with its connection, its time not up): what a shared server says or
    /// asks without naming a task may be that task's, and so any client's, since a client
    /// on 2026-07-28 is known only by its address.
    pub fn may_run_on(&self, server: &str) -> bool {
        let tasks = self.tasks.locked();
        let last = tasks.per_server.get(server).and_then(|deadlines| deadlines.last_key_value());
        last.is_some_and(|(until, _)| *until > Instant::now())
    }

    /// Server instance `instance` lost a connection: the tasks its process held on it are
    /// lost with it (each answered failed when next asked about) and take no share, nor
    /// count as running there, from now on.
    pub fn connection_lost(&self, instance: u64) {
        let mut tasks = self.tasks.locked();
        let lost: Vec<Arc<Entry>> = tasks
            .by_id
            .values()
            .filter(|e| e.instance == instance && e.process && e.live().is_none())
            .cloned()
            .collect();
        for entry in lost {
            tasks.release(&entry);
        }
    }

    /// The task the gateway's id `id` stands for, while it is kept.
    fn get(&self, id: &str) -> Result<Arc<Entry>, ErrorData> {
        let mut tasks = self.tasks.locked();
        match tasks.by_id.get(id) {
            Some(entry) if entry.until > Instant::now() => Ok(entry.clone()),
            Some(_) => {
                tasks.remove(id);
                Err(unknown(id))
            }
            None => Err(unknown(id)),
        }
    }

    /// A server gave its id `upstream` to a new task, on connection `session`: the tasks
    /// relayed under that id are forgotten (see `Table::insert`).
    pub(super) fn forget_upstream(&self, server: &str, session: &Arc<Session>, upstream: &str) {
        let process = session.is_process();
        self.tasks.locked().forget_upstream(server, &Arc::downgrade(session), process, upstream);
    }

    pub(super) fn forget(&self, id: &str) {
        self.tasks.locked().remove(id);
    }

    /// Task `entry` was seen ended: it is kept (it may be asked about again) but no longer
    /// takes its owner's share.
    fn ended(&self, entry: &Entry) {
        self.tasks.locked().release(entry);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.tasks.locked().by_id.len()
    }
}

impl Entry {
    /// Its instance's session, while that runs.
    fn live(&self) -> Option<Arc<Session>> {
        self.session.upgrade().filter(|s| !s.closed.is_cancelled())
    }
}

/// A server's `createdAt` as kept: as it came, unless it is longer than a timestamp
/// (then the gateway's time).
fn stamp(created_at: &str) -> String {
    if created_at.len() <= 64 {
        created_at.to_owned()
    } else {
        humantime::format_rfc3339_millis(SystemTime::now()).to_string()
    }
}

fn unknown(id: &str) -> ErrorData {
    ErrorData::invalid_params(format!("unknown task `{id}`: the gateway relays no task of that id"), None)
}

/// Asks `session`'s server to cancel its task `id`, which nobody could reach. Off the
/// caller's path, bounded.
pub(in crate::gateway) fn cancel_upstream(session: &Session, id: &str) {
    let request = ClientRequest::CancelTaskRequest(CancelTaskRequest::new(CancelTaskParams::new(id)));
    // (While a relayed task may run on a shared server, what it says without naming a
    // task reaches no client anyway: `Routing::caller`.)
    super::send_apart(session, request, None);
}

impl Gateway {
    /// `tasks/get`: as the task's instance reports it, under the gateway's id; a task
    /// whose instance is lost, as failed.
    pub(in crate::gateway) async fn relayed_get(
        &self,
        params: GetTaskParams,
        cx: &RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        let relayed = &self.hub.routing.relayed;
        let entry = relayed.get(&params.task_id)?;
        if entry.legacy {
            let got = self.legacy_get(&entry, &params.task_id, cx).await;
            if let Some(Ok(answer)) = &got
                && answer.task.status().is_terminal()
            {
                relayed.ended(&entry);
            }
            return got.unwrap_or_else(|| Ok(self.lost(&params.task_id, &entry)));
        }
        let request = |upstream: &str| ClientRequest::GetTaskRequest(GetTaskRequest::new(GetTaskParams::new(upstream)));
        match self.to_task(&entry, "tasks/get", request, cx).await {
            Some(Ok(ServerResult::GetTaskResult(mut answer))) => {
                if answer.task.status().is_terminal() {
                    relayed.ended(&entry);
                }
                answer.task.task.task_id = params.task_id;
                Ok(answer)
            }
            Some(Ok(_)) => Err(ErrorData::internal_error(
                format!("server `{}` answered tasks/get with something that is not a task", entry.server),
                None,
            )),
            Some(Err(e)) => {
                // The server no longer knows it (its time to live ran out): neither do we.
                if e.code == rmcp::model::ErrorCode::INVALID_PARAMS {
                    relayed.forget(&params.task_id);
                }
                Err(e)
            }
            None => Ok(self.lost(&params.task_id, &entry)),
        }
    }

    /// `tasks/update`: the client's answers to the task's questions, to its instance.
    pub(in crate::gateway) async fn relayed_update(
        &self,
        params: UpdateTaskParams,
        cx: &RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let entry = self.hub.routing.relayed.get(&params.task_id)?;
        if entry.legacy {
            return Err(ErrorData::invalid_params(
                format!("task `{}` is a server's on MCP 2025-11-25, which takes no tasks/update", params.task_id),
                None,
            ));
        }
        let answers = params.input_responses;
        let request = |upstream: &str| {
            ClientRequest::UpdateTaskRequest(UpdateTaskRequest::new(UpdateTaskParams::new(upstream, answers.clone())))
        };
        self.acknowledged(&params.task_id, &entry, "tasks/update", request, cx).await
    }

    /// `tasks/cancel`, to the task's instance.
    pub(in crate::gateway) async fn relayed_cancel(
        &self,
        params: CancelTaskParams,
        cx: &RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let entry = self.hub.routing.relayed.get(&params.task_id)?;
        let legacy = entry.legacy;
        let request = move |upstream: &str| match legacy {
            true => super::bridged::legacy_request("tasks/cancel", upstream),
            false => ClientRequest::CancelTaskRequest(CancelTaskRequest::new(CancelTaskParams::new(upstream))),
        };
        self.acknowledged(&params.task_id, &entry, "tasks/cancel", request, cx).await
    }

    /// A request about the task `id` that its server acknowledges; one about a lost task
    /// is refused.
    async fn acknowledged(
        &self,
        id: &str,
        entry: &Entry,
        method: &str,
        request: impl Fn(&str) -> ClientRequest,
        cx: &RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        match self.to_task(entry, method, request, cx).await {
            Some(answer) => answer.map(|_| ()),
            None => {
                self.lost(id, entry);
                Err(ErrorData::invalid_params(
                    format!("task `{id}` was lost with its server's instance: it has failed, and takes nothing more"),
                    None,
                ))
            }
        }
    }

    /// Sends `request` (made with the server's id of the task) to the task's instance,
    /// with the client's `_meta` and capabilities: `None` if the instance is gone.
    pub(super) async fn to_task(
        &self,
        entry: &Entry,
        method: &str,
        request: impl Fn(&str) -> ClientRequest,
        cx: &RequestContext<RoleServer>,
    ) -> Option<Result<ServerResult, ErrorData>> {
        let timeout = self.limits(&entry.server).timeout;
        let to = match entry.live() {
            Some(session) => Instance { instance: entry.instance, session, held: None },
            None if entry.process => return None,
            // A `url` server's task outlives the connection it was made on: it is asked
            // for on the server's current one, or later.
            None => match until_cancelled(&cx.ct, self.upstream(&entry.server, timeout)).await {
                Ok(Ok(to)) => to,
                Ok(Err(e)) | Err(e) => return Some(Err(e)),
            },
        };
        let meta: RequestMetaObject = request_meta(&to.session, cx, Tasks::Yes);
        let out = Out {
            method,
            request: request(&entry.upstream),
            meta: Some(meta),
            hand_over: timeout,
            answer_within: Some(timeout),
            logged: false,
        };
        match self.forward(&to, out, cx).await {
            Ok(answer) => Some(Ok(answer)),
            Err(Fault::Lost) if entry.process => None,
            Err(lost @ Fault::Lost) => Some(Err(lost.into_error(&entry.server))),
            Err(Fault::Error(e)) => Some(Err(e)),
        }
    }

    /// The task `id`, whose instance is gone, as failed; the first time, the errors log
    /// says so.
    fn lost(&self, id: &str, entry: &Entry) -> GetTaskResult {
        let why = format!("its server `{}` stopped while it ran; the task is lost", entry.server);
        // Reported the first time it is answered failed for good.
        if entry.ended_as.set(why.clone()).is_ok() {
            tracing::warn!(server = %entry.server, tool = %entry.tool, task = id, "{why}");
            let record = lost_record(&entry.server, &entry.tool, id, &why);
            self.hub.errors.record(&record, &self.own.client, SystemTime::now());
        }
        self.failed_for_good(id, entry, &why)
    }

    /// The task `id` as failed for `why`, from now on, whatever its server says of it.
    pub(super) fn failed_for_good(&self, id: &str, entry: &Entry, why: &str) -> GetTaskResult {
        let _ = entry.ended_as.set(why.to_owned());
        self.hub.routing.relayed.ended(entry);
        let why = entry.ended_as.get().map_or(why, String::as_str);
        let now = humantime::format_rfc3339_millis(SystemTime::now()).to_string();
        let task = Task::new(id, TaskStatus::Failed, entry.created_at.clone(), now).with_status_message(why);
        let error = json!({"code": rmcp::model::ErrorCode::INTERNAL_ERROR.0, "message": format!("rebound: {why}")});
        let error = error.as_object().cloned().unwrap_or_default();
        GetTaskResult::new(DetailedTask::new(task, TaskPayload::Failed { error }))
    }
}

#[cfg(test)]
pub(in crate::gateway) mod tests {
    use super::*;

    /// Keeps, as `id`, a running task of `owner`'s on server instance `instance`, for a
    /// minute.
    pub(in crate::gateway) fn running(relayed: &Relayed, id: &str, owner: &str, instance: u64) {
        let entry = Entry { instance, ..entry(owner, Instant::now() + Duration::from_secs(60)) };
        relayed.tasks.lock().unwrap().insert(id.into(), entry);
    }

    pub(in crate::gateway) fn forget(relayed: &Relayed, id: &str) {
        relayed.forget(id);
    }

    /// A task of `owner`'s on server `a`, under an upstream id of its own.
    fn entry(owner: &str, until: Instant) -> Entry {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        Entry {
            server: "a".into(),
            tool: "t".into(),
            instance: 1,
            session: Weak::new(),
            owner: Some(owner.into()),
            counted: AtomicBool::new(false),
            legacy: false,
            process: true,
            upstream: format!("u{}", NEXT.fetch_add(1, Ordering::Relaxed)),
            created_at: String::new(),
            until,
            ended_as: std::sync::OnceLock::new(),
            result_misses: std::sync::atomic::AtomicU32::new(0),
        }
    }

    /// A server that gives a task's id to a new task (once the first's time to live is
    /// up, say): the first is forgotten, so that its client cannot reach the new one,
    /// another's, through it.
    #[test]
    fn an_id_a_server_gives_again_is_the_new_tasks_alone() {
        let relayed = Relayed::default();
        let soon = Instant::now() + Duration::from_secs(60);
        let reused = |owner| Entry { upstream: "7".into(), ..entry(owner, soon) };
        relayed.tasks.lock().unwrap().insert("alices".into(), reused("alice"));
        relayed.tasks.lock().unwrap().insert("other".into(), entry("alice", soon));
        relayed.tasks.lock().unwrap().insert("bobs".into(), reused("bob"));
        assert!(relayed.get("alices").is_err(), "alice's id no longer reaches task 7");
        assert!(relayed.get("bobs").is_ok() && relayed.get("other").is_ok());
        let elsewhere = Entry { server: "b".into(), ..reused("carol") };
        relayed.tasks.lock().unwrap().insert("carols".into(), elsewhere);
        assert!(relayed.get("bobs").is_ok(), "another server's task 7 is another task");
        assert_eq!(relayed.tasks.lock().unwrap().per_client.of("alice"), 1, "alice's share freed");
    }

    #[test]
    fn expired_tasks_are_unknown_and_dropped() {
        let relayed = Relayed::default();
        let now = Instant::now();
        relayed.tasks.lock().unwrap().insert("old".into(), entry("c", now));
        relayed.tasks.lock().unwrap().insert("new".into(), entry("c", now + Duration::from_secs(60)));
        assert!(relayed.get("old").is_err());
        assert!(relayed.get("new").is_ok());
        assert!(relayed.get("other").err().unwrap().message.contains("unknown task"));
        assert_eq!(relayed.len(), 1);
    }

    /// A server instance may run a client's relayed task while one has not been seen
    /// ended and its time is not up; over stdio (no owner) none counts.
    #[test]
    fn an_instance_may_run_a_relayed_task_until_it_ended_or_its_time_is_up() {
        let relayed = Relayed::default();
        let soon = Instant::now() + Duration::from_secs(60);
        assert!(!relayed.may_run_on("a"));
        relayed.tasks.lock().unwrap().insert("a".into(), entry("c", soon));
        relayed.tasks.lock().unwrap().insert("b".into(), entry("c", soon + Duration::from_secs(60)));
        assert!(relayed.may_run_on("a") && !relayed.may_run_on("b"));
        relayed.ended(&relayed.get("a").unwrap());
        assert!(relayed.may_run_on("a"), "b still runs");
        relayed.forget("b");
        assert!(!relayed.may_run_on("a"), "both seen ended or forgotten");
        relayed.tasks.lock().unwrap().insert("c".into(), entry("c", Instant::now()));
        assert!(!relayed.may_run_on("a"), "its time is up, unseen");
        let stdio = Entry { owner: None, ..entry("c", soon + Duration::from_secs(60)) };
        relayed.tasks.lock().unwrap().insert("d".into(), stdio);
        assert!(!relayed.may_run_on("a"), "a stdio gateway has one client");
        // The latest time counts only while its task does: a long task seen ended leaves
        // the others' times.
        let relayed = Relayed::default();
        relayed.tasks.lock().unwrap().insert("long".into(), entry("c", soon + Duration::from_secs(86_400)));
        relayed.tasks.lock().unwrap().insert("over".into(), entry("c", Instant::now()));
        assert!(relayed.may_run_on("a"));
        relayed.ended(&relayed.get("long").unwrap());
        assert!(!relayed.may_run_on("a"), "only a task whose time is up is left");
        // A task its server's process held is lost with the connection; one a `url`
        // server holds is not.
        let relayed = Relayed::default();
        relayed.tasks.lock().unwrap().insert("held".into(), entry("c", soon));
        relayed.connection_lost(2);
        assert!(relayed.may_run_on("a"), "another instance's connection");
        relayed.connection_lost(1);
        assert!(!relayed.may_run_on("a") && relayed.has_room(Some("c")));
        assert!(relayed.get("held").is_ok(), "kept, to be answered failed");
        relayed.tasks.lock().unwrap().insert("remote".into(), Entry { process: false, ..entry("c", soon) });
        relayed.connection_lost(1);
        assert!(relayed.may_run_on("a"));
    }

    /// The /64s of one IPv6 site take twice one address's share at most.
    #[test]
    fn the_addresses_of_one_ipv6_site_take_twice_an_addresss_share() {
        let relayed = Relayed::default();
        let later = Instant::now() + Duration::from_secs(60);
        let of = |block: u32| format!("address 2001:db8:1:{block:x}::/64");
        for block in 0..2 {
            for n in 0..MAX_RELAYED_PER_CLIENT {
                assert!(relayed.has_room(Some(&of(block))));
                relayed.tasks.lock().unwrap().insert(format!("{block}-{n}"), entry(&of(block), later));
            }
        }
        assert!(!relayed.has_room(Some(&of(2))), "the site's share is taken");
        assert!(relayed.has_room(Some("address 2001:db8:2:1::/64")), "another site's is its own");
        relayed.forget("0-0");
        assert!(relayed.has_room(Some(&of(2))));
    }

    /// One client's tasks take at most its share; expired ones make room again.
    #[test]
    fn one_client_takes_at_most_its_share() {
        let relayed = Relayed::default();
        let later = Instant::now() + Duration::from_secs(60);
        for n in 0..MAX_RELAYED_PER_CLIENT {
            assert!(relayed.has_room(Some("greedy")));
            relayed.tasks.lock().unwrap().insert(format!("g{n}"), entry("greedy", later));
        }
        assert!(!relayed.has_room(Some("greedy")));
        assert!(relayed.has_room(Some("neighbour")), "another client's room is its own");
        relayed.forget("g0");
        assert!(relayed.has_room(Some("greedy")));
        relayed.tasks.lock().unwrap().insert("g0".into(), entry("greedy", Instant::now()));
        assert!(relayed.has_room(Some("greedy")), "an expired task makes room");
        assert_eq!(relayed.len(), MAX_RELAYED_PER_CLIENT - 1);
        // A task seen ended is kept, but takes no share; over stdio there are no shares.
        relayed.tasks.lock().unwrap().insert("g0".into(), entry("greedy", later));
        assert!(!relayed.has_room(Some("greedy")));
        let ended = relayed.get("g1").unwrap();
        relayed.ended(&ended);
        relayed.ended(&ended);
        assert!(relayed.has_room(Some("greedy")) && relayed.get("g1").is_ok());
        relayed.tasks.lock().unwrap().insert("g1b".into(), entry("greedy", later));
        assert!(!relayed.has_room(Some("greedy")), "ended twice, released once");
        assert!(relayed.has_room(None));
    }

    /// Tasks started and seen ended from one address fill the table only until another
    /// client's task needs a place: each then makes room, the nearest its end first; a
    /// table full of running tasks has none.
    #[test]
    fn tasks_seen_ended_make_room_for_everyone_elses() {
        let relayed = Relayed::default();
        let now = Instant::now();
        for n in 0..MAX_RELAYED {
            let until = now + Duration::from_secs(3600 + n as u64);
            relayed.tasks.lock().unwrap().insert(format!("e{n}"), entry(&format!("churner{}", n % 16), until));
            relayed.ended(&relayed.get(&format!("e{n}")).unwrap());
        }
        assert_eq!(relayed.len(), MAX_RELAYED);
        assert!(relayed.has_room(Some("neighbour")), "an ended task made room");
        assert!(relayed.get("e0").is_err() && relayed.get("e1").is_ok(), "the nearest its end went first");
        relayed.tasks.lock().unwrap().insert("mine".into(), entry("neighbour", now + Duration::from_secs(60)));
        relayed.ended(&relayed.get("mine").unwrap());
        // The clients holding the most make room, not another whose ended task's end is
        // nearer (its result perhaps not fetched yet).
        assert!(relayed.has_room(Some("neighbour")));
        assert!(relayed.get("mine").is_ok(), "the neighbour's ended task is kept");
        assert!(relayed.get("e1").is_err(), "churner1 held the most: its nearest went");
        // Running tasks are never made room by.
        let running = Relayed::default();
        for n in 0..MAX_RELAYED {
            running
                .tasks
                .lock()
                .unwrap()
                .insert(format!("r{n}"), entry(&format!("c{}", n % 32), now + Duration::from_secs(60)));
        }
        assert!(!running.has_room(Some("neighbour")));
        assert_eq!(running.len(), MAX_RELAYED);
    }
}
