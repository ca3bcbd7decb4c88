//! Which client a server's traffic belongs to: the calls in flight on each server
//! instance (for requests a server makes while serving one), and where each call's
//! progress goes.
//!
//! The rule for a server-to-client request (sampling, elicitation, roots):
//! 1. over streamable HTTP the server says which of our requests it is serving, and the
//!    request goes to the client of exactly that call; if that call has ended, to none
//!    (only a call whose sending is not yet recorded here may still be the one, unless
//!    the request names one that ended in the last 5 s);
//! 2. otherwise (a stdio server cannot say), to the client whose calls are in flight on
//!    that instance, when they are all one client's (the newest of its calls);
//! 3. with calls of several clients in flight (sessions that just closed included, and
//!    calls of another client that ended unanswered in the last 5 s, cancelled or timed
//!    out, which the server may still be serving, and tasks of another client running
//!    there), to none of them: which one the server means
//!    cannot be known, and guessing would show one client another's request. The server is
//!    told so (give it `"scope": "session"` to have one instance per client);
//! 4. with no call in flight, to the instance's own client (a `session`-scoped server), or
//!    the gateway's only client (stdio); else to none.
//!
//! A shared server's log line over HTTP follows the same rule, and also goes to none for
//! 5 s after another client's call there was answered during the call of the client it
//! would go to: a server may write about a call just after answering it
//! (`Routing::log_reader`).
//!
//! On a shared server over HTTP, a request the gateway makes of its own accord or about
//! what several clients share (a subscription made, made again or given up, the log
//! level, a task of a client gone cancelled) counts as another client's call, while it is
//! out, and for 5 s after unless it was answered (`Routing::aside`): what the server says
//! then may be about it.
//!
//! A call here is any request a client sent on to the server while it is out: a tool
//! call (`super::call`), and every other request forwarded (`super::forward`), a task's
//! included. A request that says it belongs to a task (MCP 2025-11-25's related task)
//! goes to the client that started that task on that instance, or to none, before any
//! of these rules; so does a request about a task a client runs for the server
//! (`super::asked_tasks`).
//!
//! The client chosen must also have advertised the capability (`to_client`); `ask` then
//! asks it, and closes the client's dialog if the server gives up. A client on 2026-07-28
//! takes no requests: when the call found is one of its, the request goes to that call's
//! `Bridge` instead, and comes back to it as a question in the call's answer
//! (`super::held`).

// Sampling and roots are deprecated by 2026-07-28 (SEP-2577) but live in every revision
// the gateway speaks; they are relayed faithfully.
#![allow(deprecated)]

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CancelledNotificationParam, ClientCapabilities, ClientResult, CreateMessageRequest, ElicitRequest, GetExtensions,
    ProgressNotificationParam, ProgressToken, RequestId, ServerRequest,
};
use rmcp::service::{OriginatingRequestId, PeerRequestOptions, RequestContext};
use rmcp::{ErrorData, Peer, RoleServer};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::asked_tasks::AskedTasks;
use super::early::Early;
use super::held::Bridge;
use crate::lasting::Locked;
use crate::transport::tasks::ClientTaskRequest;
use crate::transport::{Asker, UpstreamRequest};

/// A client's call in flight on a server instance: a tool call, or another request it
/// sent on (`super::forward`).
struct InFlight {
    id: u64,
    /// The downstream session that made it ([`GATEWAY`] for the gateway's own).
    client: Arc<str>,
    /// None for the gateway's own request ([`Routing::aside`]): nobody to ask.
    peer: Option<Peer<RoleServer>>,
    /// The client's id for the call.
    request: RequestId,
    /// The upstream session and our request id there, and when it was sent, once the
    /// attempt is.
    upstream: Option<(u64, RequestId, tokio::time::Instant)>,
    /// For a call of a 2026-07-28 client, which takes no requests: where its server's
    /// questions go instead (`super::held`).
    bridge: Option<Bridge>,
    /// When it was put in flight.
    since: Instant,
}

/// A client session as a server's request reaches it: its name (one per session, as in
/// the errors log) and its peer.
#[derive(Clone)]
pub struct ClientPeer {
    pub client: Arc<str>,
    pub peer: Peer<RoleServer>,
}

/// Whom a server instance serves, as its requests are routed.
pub enum Serves {
    /// Many clients, none of its own: a shared server over HTTP.
    Many,
    /// One client: a session's own instance's, or over stdio the gateway's client (`None`
    /// while there is none that takes requests, a client on 2026-07-28), asked about what
    /// belongs to no call.
    One(Option<ClientPeer>),
}

/// Who should answer a server's request.
pub enum Caller {
    /// This client, about its request `during` (if known: over HTTP the request then
    /// travels on that call's response stream).
    Client { to: ClientPeer, during: Option<RequestId> },
    /// This call of a 2026-07-28 client, which is asked in the call's answer.
    Held(Bridge),
    /// Nobody may: why, for the server.
    Nobody(&'static str),
}

/// Who the gateway's own requests are of, among the clients' calls in flight.
pub const GATEWAY: &str = "the gateway";

/// `call`'s client, unless its session is gone.
fn client_of(call: &InFlight) -> Caller {
    if let Some(bridge) = &call.bridge {
        return Caller::Held(bridge.clone());
    }
    let Some(peer) = &call.peer else {
        return Caller::Nobody(
            "the request this belongs to is one the gateway made of its own accord, for no one client",
        );
    };
    if peer.is_transport_closed() {
        return Caller::Nobody("the client whose call this request belongs to is gone");
    }
    let to = ClientPeer { client: call.client.clone(), peer: peer.clone() };
    Caller::Client { to, during: Some(call.request.clone()) }
}

/// Calls in flight and progress routes, for every server instance.
#[derive(Default)]
pub struct Routing {
    /// Calls in flight per server instance, newest last.
    in_flight: Mutex<HashMap<u64, Vec<InFlight>>>,
    next_call: AtomicU64,
    /// (upstream session, upstream token) → downstream.
    progress: Mutex<HashMap<(u64, ProgressToken), ProgressRoute>>,
    /// Progress that came before its call was mapped (a server may report before the
    /// send returns here), briefly (`super::early`). Locked after `progress`, never before.
    early_progress: Mutex<Early>,
    /// (upstream session, task id) → the client that started the task, under the number
    /// of its `TaskOwner` (a later owner of the same key is not removed by an earlier one).
    tasks: Mutex<HashMap<TaskKey, TaskEntry>>,
    next_task: AtomicU64,
    /// Woken whenever a task is owned, for the server requests waiting for their task's
    /// owner ([`Routing::task_owner_soon`]), and how many wait.
    owned: tokio::sync::Notify,
    waiting_for_owners: std::sync::atomic::AtomicUsize,
    /// Per server instance, the clients whose calls ended there in the last
    /// [`ENDED_COUNTS`], how, and when (see rule 3 and `log_reader`).
    ended: Mutex<Endings>,
    /// The upstream requests of calls that ended (or were sent again) in the last
    /// [`ENDED_COUNTS`], oldest first: a server's request naming one is no other call's.
    gone: Mutex<Gone>,
    /// The tasks clients run for servers, and which client runs each.
    pub run_by_clients: AskedTasks,
    /// The tasks of servers on 2026-07-28 relayed to their clients (`super::tasks`).
    pub relayed: super::tasks::Relayed,
    /// Per upstream session and client, the session's requests waiting for the client's
    /// answer.
    asked: super::pins::Counts<(u64, Arc<str>)>,
    /// Requests bound for an instance, not yet (or between rounds not) in flight on it.
    pub pins: super::pins::Pins,
    /// The notifications on their way to clients, whose bounds a call's progress counts
    /// against too (`Downstreams::sending`, the same).
    pub sending: Arc<super::downstreams::Sending>,
}

/// How long a server's request about a task no client owns yet waits for its owner.
pub const OWNER_WAIT: Duration = Duration::from_secs(2);
/// The most server requests waiting for their task's owner at once.
pub const OWNER_WAITERS: usize = 64;

/// The longest progress message passed on (a status line, not a payload: progress waiting
/// for a slow client, or for its call to be mapped, is held in memory), in bytes.
pub const MAX_PROGRESS_MESSAGE: usize = 4096;

/// The longest progress token a server's progress may name: the gateway's own are short.
const MAX_PROGRESS_TOKEN: usize = 256;

/// The most requests of one server connection that wait for one client's answers at once:
/// past it, the server is answered with an error at once (a server asking thousands of
/// questions must not hold as many waits in the gateway, and a client that leaves them
/// unanswered keeps no other client from being asked).
pub const MAX_ASKED: usize = 64;

/// One request of a server's waiting for a client's answer, counted by (upstream
/// session, client) until dropped.
pub type Asked = super::pins::Counted<(u64, Arc<str>)>;

/// How a call ended, for what the server says after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// Cancelled or timed out: the server may still be serving it, and its request for
    /// it still on its way (rule 3).
    Unanswered,
    /// Answered: the server may still write about it in its log (`Routing::log_reader`).
    Answered,
}

/// A client whose call ended, how, and when.
struct Ended {
    client: Arc<str>,
    how: Ending,
    at: Instant,
}

/// The calls that ended in the last [`ENDED_COUNTS`], per server instance.
#[derive(Default)]
struct Endings {
    by_instance: HashMap<u64, Vec<Ended>>,
    /// When the stale were last swept from every instance's (at most once a
    /// [`SWEEP_EVERY`], so that a busy gateway's calls do not each walk them all).
    swept: Option<Instant>,
}

/// How often the stale endings are swept, once more than [`ENDED_KEPT`] instances have some.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// How long a client's call still counts once it ended: a call cancelled or timed out may
/// still be served, and the server's request for it still on its way (rule 3); a call
/// answered may still be written about.
const ENDED_COUNTS: Duration = Duration::from_secs(5);

/// Whether `ended` still counts, at `now`.
fn still_counts(ended: &Ended, now: Instant) -> bool {
    now.duration_since(ended.at) < ENDED_COUNTS
}

/// The most clients remembered per instance, and instances, before the stale are swept.
const ENDED_KEPT: usize = 64;

/// The most ended upstream requests remembered (13 000 a second for [`ENDED_COUNTS`]).
const GONE_KEPT: usize = 1 << 16;

/// The upstream requests of calls that ended in the last [`ENDED_COUNTS`], oldest first,
/// and each one's end.
#[derive(Default)]
struct Gone {
    order: VecDeque<((u64, RequestId), Instant)>,
    at: HashMap<(u64, RequestId), Instant>,
}

impl Gone {
    fn add(&mut self, request: (u64, RequestId), now: Instant) {
        while let Some((oldest, at)) = self.order.front()
            && (now.duration_since(*at) >= ENDED_COUNTS || self.order.len() >= GONE_KEPT)
        {
            if self.at.get(oldest) == Some(at) {
                self.at.remove(oldest);
            }
            self.order.pop_front();
        }
        self.order.push_back((request.clone(), now));
        self.at.insert(request, now);
    }
}

impl Routing {
    /// Counts a request of upstream session `session` waiting for `client`'s answer;
    /// `None` when [`MAX_ASKED`] of its requests wait for that client already.
    pub fn asked_by(&self, session: u64, client: &Arc<str>) -> Option<Asked> {
        self.asked.count_below((session, client.clone()), MAX_ASKED)
    }

    /// Registers the request of `cx`, a call of `client`, in flight on `instance`;
    /// dropped when the guard is.
    pub fn track_call(
        self: &Arc<Self>,
        instance: u64,
        client: &Arc<str>,
        cx: &RequestContext<RoleServer>,
    ) -> CallGuard {
        let call = InFlight {
            id: self.next_call.fetch_add(1, Ordering::Relaxed),
            client: client.clone(),
            peer: Some(cx.peer.clone()),
            request: cx.id.clone(),
            upstream: None,
            bridge: cx.extensions.get::<Bridge>().cloned(),
            since: Instant::now(),
        };
        self.track(instance, call)
    }

    /// Registers a request the gateway sends `instance` of its own accord, or for a
    /// client but about what several share (a subscription, the log level, a task of a
    /// client gone cancelled), until the guard is dropped, and unless it was answered
    /// ([`CallGuard::answered`]) for a moment after (rule 3): what the server asks or logs
    /// without naming a call meanwhile may be about it, and so reaches no client.
    pub fn aside(self: &Arc<Self>, instance: u64) -> CallGuard {
        let call = InFlight {
            id: self.next_call.fetch_add(1, Ordering::Relaxed),
            client: GATEWAY.into(),
            peer: None,
            request: RequestId::Number(0),
            upstream: None,
            bridge: None,
            since: Instant::now(),
        };
        self.track(instance, call)
    }

    fn track(self: &Arc<Self>, instance: u64, call: InFlight) -> CallGuard {
        let id = call.id;
        let client = call.peer.is_some().then(|| call.client.clone());
        self.in_flight.locked().entry(instance).or_default().push(call);
        CallGuard { routing: self.clone(), instance, id, client, answered: AtomicBool::new(false) }
    }

    /// Task `id` on upstream `session` is `owner`'s, until the guard is dropped; `ended` is
    /// cancelled when the server says the task ended.
    pub fn own_task(
        self: &Arc<Self>,
        session: u64,
        id: &str,
        owner: ClientPeer,
        ended: CancellationToken,
    ) -> TaskOwner {
        let key = (session, id.to_owned());
        let number = self.next_task.fetch_add(1, Ordering::Relaxed);
        self.tasks.locked().insert(key.clone(), TaskEntry { number, owner, ended });
        self.owned.notify_waiters();
        TaskOwner { routing: self.clone(), key, number }
    }

    /// [`Self::task_owner`], or the one that is noted within [`OWNER_WAIT`]: a server may
    /// ask about a task it has just created before the gateway has read its answer
    /// creating it. At most [`OWNER_WAITERS`] requests wait at once; others are answered
    /// at once.
    pub async fn task_owner_soon(&self, session: u64, id: &str) -> Option<ClientPeer> {
        if let Some(owner) = self.task_owner(session, id) {
            return Some(owner);
        }
        // Counted while it waits, however the wait ends (its request given up included).
        struct Waiting<'a>(&'a std::sync::atomic::AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
        let _waiting = Waiting(&self.waiting_for_owners);
        if self.waiting_for_owners.fetch_add(1, Ordering::AcqRel) >= OWNER_WAITERS {
            return None;
        }
        let waited = tokio::time::timeout(OWNER_WAIT, async {
            loop {
                let owned = self.owned.notified();
                if let Some(owner) = self.task_owner(session, id) {
                    return owner;
                }
                owned.await;
            }
        });
        waited.await.ok()
    }

    /// The client that started task `id` on upstream `session`, while it is there.
    pub fn task_owner(&self, session: u64, id: &str) -> Option<ClientPeer> {
        let owner = self.tasks.locked().get(&(session, id.to_owned()))?.owner.clone();
        (!owner.peer.is_transport_closed()).then_some(owner)
    }

    /// Whether a client has task `id` on upstream `session` running (not seen ended, nor
    /// forgotten, nor expired), while that client is there.
    pub fn task_running(&self, session: u64, id: &str) -> bool {
        let tasks = self.tasks.locked();
        tasks
            .get(&(session, id.to_owned()))
            .is_some_and(|t| !t.ended.is_cancelled() && !t.owner.peer.is_transport_closed())
    }

    /// Forgets who has task `id` on upstream `session`, whose server has given that id to
    /// a new task: its client finds it unknown from then on. Whether it was running (see
    /// [`Self::task_running`]), when whose task the server means by the id cannot be told.
    pub fn disown_task(&self, session: u64, id: &str) -> bool {
        let disowned = self.tasks.locked().remove(&(session, id.to_owned()));
        disowned.is_some_and(|t| !t.ended.is_cancelled() && !t.owner.peer.is_transport_closed())
    }

    /// A task's status from upstream `session` (a `notifications/tasks/status`'s params):
    /// noted if it says the task ended, and the client it goes to.
    pub fn task_status(&self, session: u64, status: &serde_json::Value) -> Option<ClientPeer> {
        let id = status["taskId"].as_str()?;
        if matches!(status["status"].as_str(), Some("completed" | "failed" | "cancelled"))
            && let Some(entry) = self.tasks.locked().get(&(session, id.to_owned()))
        {
            entry.ended.cancel();
        }
        self.task_owner(session, id)
    }

    /// Who should answer `asker`'s request to `instance` of `server`, which `serves` (see
    /// the module's rule).
    pub fn caller(&self, (server, instance): (&str, u64), asker: &Asker, serves: Serves) -> Caller {
        if let Some(task) = &asker.task {
            return match self.task_owner(asker.session, task) {
                Some(to) => Caller::Client { to, during: None },
                None => Caller::Nobody("the task this request belongs to is no task a client of the gateway has now"),
            };
        }
        let in_flight = self.in_flight.locked();
        let calls = in_flight.get(&instance).map(Vec::as_slice).unwrap_or_default();
        // The gateway's own requests count where the server serves several clients; one
        // with a client of its own says nothing but to that client.
        let (shared, otherwise) = match serves {
            Serves::Many => (true, None),
            Serves::One(client) => (false, client),
        };
        let mut candidates: Vec<&InFlight> = calls.iter().filter(|c| shared || c.peer.is_some()).collect();
        if let Some(during) = &asker.during {
            let exact = calls
                .iter()
                .find(|c| c.upstream.as_ref().is_some_and(|(s, id, _)| *s == asker.session && id == during));
            if let Some(call) = exact {
                return client_of(call);
            }
            // The call it names has ended (cancelled, timed out), or is one whose sending
            // is not recorded yet: only those can be meant, unless it named an ended one.
            candidates.retain(|c| c.upstream.is_none());
            if candidates.is_empty() || self.is_gone(asker.session, during) {
                return Caller::Nobody("the call this request belongs to has ended");
            }
        }
        // Closed sessions count: their calls may be the ones the server means.
        let Some(newest) = candidates.last() else {
            return match otherwise {
                Some(to) => Caller::Client { to, during: None },
                None => Caller::Nobody("no client of the gateway has a call in flight on this server"),
            };
        };
        if candidates.iter().any(|c| c.client != newest.client) {
            return Caller::Nobody(
                "calls of several clients are in flight on this shared server, and which one this request belongs to cannot be known (give the server \"scope\": \"session\" in Rebound's configuration)",
            );
        }
        if self.another_runs_a_task(asker.session, &newest.client) {
            return Caller::Nobody(
                "a task of another client runs on this shared server, and this request may be that task's (give the server \"scope\": \"session\" in Rebound's configuration)",
            );
        }
        // (A session's own instance, and a server over stdio, serve one client: a task
        // relayed there is that client's.)
        if shared && self.relayed.may_run_on(server) {
            return Caller::Nobody(
                "a task a client on MCP 2026-07-28 had relayed may run on this shared server, and this request may be that task's (give the server \"scope\": \"session\" in Rebound's configuration)",
            );
        }
        if asker.during.is_none() && self.another_ended(instance, &newest.client, shared) {
            return Caller::Nobody(
                "a call of another client ended unanswered on this shared server a moment ago, and this request may still be that call's (give the server \"scope\": \"session\" in Rebound's configuration)",
            );
        }
        // A 2026-07-28 client is asked only in a call that can carry questions (not, say,
        // its `completion/complete`): its newest such call.
        client_of(candidates.iter().rev().find(|c| c.bridge.is_some()).unwrap_or(newest))
    }

    /// Upstream request `request` on `session` ended (or was sent again) now.
    fn gone(&self, session: u64, request: RequestId) {
        self.gone.locked().add((session, request), Instant::now());
    }

    /// Whether upstream request `request` on `session` ended a moment ago.
    fn is_gone(&self, session: u64, request: &RequestId) -> bool {
        let gone = self.gone.locked();
        gone.at.get(&(session, request.clone())).is_some_and(|at| at.elapsed() < ENDED_COUNTS)
    }

    /// Whether a task of a client other than `client` runs on upstream `session`: what
    /// the server says without naming a task may be that task's.
    fn another_runs_a_task(&self, session: u64, client: &str) -> bool {
        let tasks = self.tasks.locked();
        tasks.iter().any(|((s, _), t)| *s == session && *t.owner.client != *client && !t.ended.is_cancelled())
    }

    /// A call of `client` on `instance` ended now, as `how` says.
    fn call_ended(&self, instance: u64, client: Arc<str>, how: Ending) {
        let now = Instant::now();
        let fresh = |ended: &Ended| still_counts(ended, now);
        let mut ended = self.ended.locked();
        if ended.by_instance.len() > ENDED_KEPT && ended.swept.is_none_or(|at| now.duration_since(at) >= SWEEP_EVERY) {
            ended.by_instance.retain(|_, clients| {
                clients.retain(fresh);
                !clients.is_empty()
            });
            ended.swept = Some(now);
        }
        let clients = ended.by_instance.entry(instance).or_default();
        clients.retain(|ended| fresh(ended) && (ended.client != client || ended.how != how));
        if clients.len() >= ENDED_KEPT {
            // An answered call holds back only log lines; one unanswered, requests too.
            let oldest = clients.iter().position(|e| e.how == Ending::Answered).unwrap_or(0);
            clients.remove(oldest);
        }
        clients.push(Ended { client, how, at: now });
    }

    /// Whether a call of a client other than `client` (or, on a `shared` instance, a
    /// request of the gateway's own) ended unanswered on `instance` a moment ago.
    fn another_ended(&self, instance: u64, client: &str, shared: bool) -> bool {
        self.another_ended_as(instance, |e| {
            *e.client != *client && e.how == Ending::Unanswered && (shared || &*e.client != GATEWAY)
        })
    }

    /// Whether a call of a client other than `client` (not the gateway's own request, which
    /// tells of no client) was answered on `instance` a moment ago, while a call of
    /// `client`'s in flight there now was: what the server writes during that call may be
    /// about the other. (Not one answered before: that is the case of every client that
    /// calls after another, whose calls' lines would all be held back.)
    fn another_answered(&self, instance: u64, client: &str) -> bool {
        let in_flight = self.in_flight.locked();
        let calls = in_flight.get(&instance).map(Vec::as_slice).unwrap_or_default();
        let Some(first) = calls.iter().filter(|c| *c.client == *client).map(|c| c.since).min() else {
            return false;
        };
        self.another_ended_as(instance, |e| {
            *e.client != *client && e.how == Ending::Answered && &*e.client != GATEWAY && e.at >= first
        })
    }

    /// Whether a call that ended on `instance` a moment ago is `such`.
    fn another_ended_as(&self, instance: u64, such: impl Fn(&Ended) -> bool) -> bool {
        let now = Instant::now();
        let ended = self.ended.locked();
        ended.by_instance.get(&instance).is_some_and(|clients| clients.iter().any(|e| still_counts(e, now) && such(e)))
    }

    /// The client a log line of `instance`'s (on upstream `session`) may be shown to:
    /// the one a request of the server's would go to (see the module's rule), unless a
    /// call of another client was answered there in the last [`ENDED_COUNTS`] while that
    /// client's call was in flight (a line a server writes about a call after answering it
    /// cannot be told from one about the calls in flight then); else nobody, since the
    /// line may tell of any client's calls.
    /// A line that names its task (`task`) goes to that task's client alone.
    pub fn log_reader(
        &self,
        (server, instance): (&str, u64),
        session: u64,
        task: Option<String>,
    ) -> Option<ClientPeer> {
        if let Some(task) = task {
            return self.task_owner(session, &task);
        }
        let asker = Asker { session, during: None, cancel: Default::default(), task: None };
        match self.caller((server, instance), &asker, Serves::Many) {
            Caller::Client { to, .. } if !self.another_answered(instance, &to.client) => Some(to),
            Caller::Client { .. } | Caller::Held(_) | Caller::Nobody(_) => None,
        }
    }

    /// Whether `client`'s request `request` is still in flight on `instance`.
    pub fn is_in_flight(&self, instance: u64, client: &str, request: &RequestId) -> bool {
        let in_flight = self.in_flight.locked();
        let calls = in_flight.get(&instance).map(Vec::as_slice).unwrap_or_default();
        calls.iter().any(|c| *c.client == *client && c.request == *request)
    }

    /// Clients' calls in flight on `instance` (not the gateway's own requests, which a
    /// stop ends), and requests that hold it ([`Self::pins`]).
    pub fn in_flight_on(&self, instance: u64) -> usize {
        let in_flight = self.in_flight.locked();
        let calls = in_flight.get(&instance).map_or(0, |calls| calls.iter().filter(|c| c.peer.is_some()).count());
        calls + self.pins.on(&instance)
    }

    /// Clients' calls in flight on any instance.
    pub fn in_flight(&self) -> usize {
        let in_flight = self.in_flight.locked();
        in_flight.values().flatten().filter(|c| c.peer.is_some()).count()
    }

    /// Sends progress of `session`'s `upstream` token where `to` says, in the order it
    /// arrives, until [`Routing::unmap_progress`]; what waits for the client counts
    /// against its share of the notifications on their way (`client`, a session's name).
    pub fn map_progress(&self, session: u64, upstream: ProgressToken, (to, client): (ProgressTo, &Arc<str>)) {
        let mut route = ProgressRoute { to, client: client.clone(), sending: self.sending.clone(), forwarder: None };
        let mut routes = self.progress.locked();
        for p in self.early_progress.locked().take(session, &upstream) {
            route.forward(p);
        }
        routes.insert((session, upstream), route);
    }

    /// [`Routing::map_progress`], ended when the guard is dropped or ended.
    pub fn progress_route(
        self: &Arc<Self>,
        session: u64,
        upstream: ProgressToken,
        to: (ProgressTo, &Arc<str>),
    ) -> ProgressGuard {
        self.map_progress(session, upstream.clone(), to);
        ProgressGuard { routing: self.clone(), session, upstream, ended: false }
    }

    /// Ends the mapping; the forwarder, if progress came, is to be flushed before the
    /// answer is sent.
    pub fn unmap_progress(&self, session: u64, upstream: &ProgressToken) -> Option<ProgressForwarder> {
        let route = self.progress.locked().remove(&(session, upstream.clone()))?;
        route.forwarder.map(|(_, task)| ProgressForwarder(task))
    }

    /// Progress from upstream `session`: to its call's client, or kept a moment in case
    /// its call is about to be mapped. Progress is never sent to anyone else. Its message
    /// is cut at [`MAX_PROGRESS_MESSAGE`] bytes; progress under a token longer than any
    /// the gateway gives ([`MAX_PROGRESS_TOKEN`]) is no call's, and dropped.
    pub fn progress(&self, session: u64, p: ProgressNotificationParam) {
        let Some(p) = bounded(p) else { return };
        let mut routes = self.progress.locked();
        if let Some(route) = routes.get_mut(&(session, p.progress_token.clone())) {
            route.forward(p);
            return;
        }
        self.early_progress.locked().keep(session, p);
    }
}

/// `p` with its message cut at [`MAX_PROGRESS_MESSAGE`] bytes; `None` under a token longer
/// than [`MAX_PROGRESS_TOKEN`].
fn bounded(mut p: ProgressNotificationParam) -> Option<ProgressNotificationParam> {
    if let rmcp::model::NumberOrString::String(token) = &p.progress_token.0
        && token.len() > MAX_PROGRESS_TOKEN
    {
        return None;
    }
    if let Some(message) = p.message.as_mut() {
        crate::text::cap(message, MAX_PROGRESS_MESSAGE);
    }
    Some(p)
}

/// Where one request's progress goes: to the client's request under its own token, or,
/// for a call held between a 2026-07-28 client's requests (`super::held`), to whichever
/// of them waits for its answer now (nowhere while none does).
#[derive(Clone)]
pub enum ProgressTo {
    Request(Peer<RoleServer>, ProgressToken),
    Waiting(Waiting),
}

impl ProgressTo {
    /// Where progress of the request of `cx`, whose client's token is `token`, goes.
    pub fn of(cx: &RequestContext<RoleServer>, token: Option<ProgressToken>) -> Option<Self> {
        match cx.extensions.get::<Waiting>() {
            Some(waiting) => Some(Self::Waiting(waiting.clone())),
            None => token.map(|token| Self::Request(cx.peer.clone(), token)),
        }
    }

    /// Who hears progress that comes now, and the held call's `Waiting` it counts against
    /// until handed over.
    fn now(&self) -> Option<(Listener, Option<Waiting>)> {
        match self {
            Self::Request(peer, token) => Some(((peer.clone(), token.clone()), None)),
            Self::Waiting(waiting) => {
                // Counted under the lock, so that whoever sets the next listener and then
                // waits for what is on its way sees this one.
                let current = waiting.0.listener.locked();
                let listener = current.clone()?;
                waiting.0.queued.send_modify(|n| *n += 1);
                drop(current);
                Some((listener, Some(waiting.clone())))
            }
        }
    }
}

/// A client's request, and its progress token.
type Listener = (Peer<RoleServer>, ProgressToken);

/// The request of a held call that waits for its answer now, with its progress token,
/// and how much progress it was given that is not yet handed to it.
#[derive(Clone, Default)]
pub struct Waiting(Arc<WaitingFor>);

#[derive(Default)]
struct WaitingFor {
    listener: Mutex<Option<Listener>>,
    queued: watch::Sender<usize>,
}

impl Waiting {
    /// Progress that comes from now on goes to `peer` under `token`, or nowhere.
    pub fn set(&self, to: Option<Listener>) {
        *self.0.listener.locked() = to;
    }

    /// Waits until the progress given to the request that waited so far has been handed
    /// to its client, so that the answer to that request, sent next, comes after it. A
    /// client that does not read is given `within`, not the call.
    pub async fn delivered(&self, within: Duration) {
        let mut queued = self.0.queued.subscribe();
        let _ = tokio::time::timeout(within, queued.wait_for(|n| *n == 0)).await;
    }

    /// One notification given to it was handed over, or dropped.
    fn done(&self) {
        self.0.queued.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// A notification on its way, to whom, the held call's `Waiting` it counts against, and
/// its room among the notifications on their way.
type Queued = (ProgressNotificationParam, Listener, Option<Waiting>, super::downstreams::Holding);

/// Where one call's progress goes. The forwarding task starts with the first progress:
/// most calls have none, and a task per call would cost every call.
struct ProgressRoute {
    to: ProgressTo,
    /// The session whose share of the notifications on their way its progress takes.
    client: Arc<str>,
    sending: Arc<super::downstreams::Sending>,
    forwarder: Option<(mpsc::Sender<Queued>, tokio::task::JoinHandle<()>)>,
}

/// The most progress notifications queued for one client's request (a task's included)
/// while its client reads them slower than the server sends them, within its share of
/// the notifications on their way (`downstreams::MAX_SENDING_TO_ONE` and the rest).
/// Past either the newest are dropped: each says how far along the work is, and a later
/// one says it again. Each waits for its client [`super::downstreams::SEND_WITHIN`] at
/// most.
const PROGRESS_QUEUED: usize = 256;

impl ProgressRoute {
    /// Queues `p` for the client, in order, unless [`PROGRESS_QUEUED`] are waiting.
    /// Queues `p` for whoever hears it now (in the order it came: for a held call, the
    /// request waiting now, not when it is sent), unless [`PROGRESS_QUEUED`] are waiting.
    fn forward(&mut self, p: ProgressNotificationParam) {
        let Some((listener, waiting)) = self.to.now() else { return };
        let Some(held) = self.sending.hold(&self.client, super::downstreams::encoded_len(&p)) else {
            if let Some(waiting) = waiting {
                waiting.done();
            }
            return;
        };
        let (tx, _) = self.forwarder.get_or_insert_with(|| {
            let (tx, mut rx) = mpsc::channel::<Queued>(PROGRESS_QUEUED);
            let task = tokio::spawn(async move {
                while let Some((mut p, (peer, token), waiting, held)) = rx.recv().await {
                    p.progress_token = token;
                    let within = super::downstreams::SEND_WITHIN;
                    if tokio::time::timeout(within, peer.notify_progress(p)).await.is_err() {
                        tracing::debug!("progress waited {} s for its client; given up", within.as_secs());
                    }
                    drop(held);
                    if let Some(waiting) = waiting {
                        waiting.done();
                    }
                }
            });
            (tx, task)
        });
        if let Err(refused) = tx.try_send((p, listener, waiting, held))
            && let (_, _, Some(waiting), _) = refused.into_inner()
        {
            waiting.done();
        }
    }
}

/// Keeps one request's progress going to its client until dropped, or ended.
pub struct ProgressGuard {
    routing: Arc<Routing>,
    session: u64,
    upstream: ProgressToken,
    ended: bool,
}

impl ProgressGuard {
    /// Ends the route once the progress relayed so far has reached the client's session,
    /// so that an answer sent next comes after it.
    pub async fn end(mut self) {
        self.ended = true;
        if let Some(progress) = self.routing.unmap_progress(self.session, &self.upstream) {
            progress.flush().await;
        }
    }
}

impl Drop for ProgressGuard {
    fn drop(&mut self) {
        // Progress already queued still goes out.
        if !self.ended {
            self.routing.unmap_progress(self.session, &self.upstream);
        }
    }
}

/// The task passing one call's progress on.
pub struct ProgressForwarder(tokio::task::JoinHandle<()>);

impl ProgressForwarder {
    /// Waits until the progress relayed so far has been handed to the client's session,
    /// so that the answer, sent next, comes after it. A client that does not read is
    /// given a second, not the call.
    pub async fn flush(self) {
        let _ = tokio::time::timeout(Duration::from_secs(1), self.0).await;
    }
}

/// A task on a server: (upstream session, task id).
type TaskKey = (u64, String);

/// A task's client, under the number of its `TaskOwner`.
struct TaskEntry {
    number: u64,
    owner: ClientPeer,
    ended: CancellationToken,
}

/// Keeps a task registered as its client's until dropped.
pub struct TaskOwner {
    routing: Arc<Routing>,
    key: TaskKey,
    number: u64,
}

impl TaskOwner {
    /// [`Routing::aside`]: for a request about the task that is no longer its client's.
    pub fn aside(&self, instance: u64) -> CallGuard {
        self.routing.aside(instance)
    }

    /// Whether the task's id on its connection is still this task's: a server may give
    /// it to a new task (once its time to live is up, say), whose owner it is then.
    pub fn owns(&self) -> bool {
        let tasks = self.routing.tasks.locked();
        tasks.get(&self.key).is_some_and(|entry| entry.number == self.number)
    }
}

impl Drop for TaskOwner {
    fn drop(&mut self) {
        let mut tasks = self.routing.tasks.locked();
        if tasks.get(&self.key).is_some_and(|entry| entry.number == self.number) {
            tasks.remove(&self.key);
        }
    }
}

/// Keeps a call registered as in flight until dropped.
pub struct CallGuard {
    routing: Arc<Routing>,
    instance: u64,
    id: u64,
    /// The client session whose call it is (none for the gateway's own requests).
    pub client: Option<Arc<str>>,
    /// Whether the server answered it: a call that ended unanswered (cancelled, timed
    /// out, lost) may still be served, and counts for a moment after (rule 3).
    answered: AtomicBool,
}

impl CallGuard {
    /// The server answered the call (with a result or an error).
    pub fn answered(&self) {
        self.answered.store(true, Ordering::Relaxed);
    }

    /// Whether its server instance serves another client request than this call's: one
    /// sent by the instant asked about and still in flight, or a task running on its
    /// upstream `session`, whenever asked. Attempts of this same client request (its
    /// retries, its alternatives) are not another; nor is a request sent after that
    /// instant, which waits behind whatever was sent then.
    pub fn others_in_flight(&self, session: u64) -> impl Fn(tokio::time::Instant) -> bool + Send + 'static {
        let (routing, instance) = (self.routing.clone(), self.instance);
        let mine = {
            let in_flight = self.routing.in_flight.locked();
            let this = in_flight.get(&instance).and_then(|calls| calls.iter().find(|c| c.id == self.id));
            this.map(|c| (c.client.clone(), c.request.clone()))
        };
        move |before| {
            let calls = {
                let in_flight = routing.in_flight.locked();
                let calls = in_flight.get(&instance).map(Vec::as_slice).unwrap_or_default();
                calls.iter().any(|c| {
                    let same =
                        mine.as_ref().is_some_and(|(client, request)| c.client == *client && c.request == *request);
                    !same && c.upstream.as_ref().is_some_and(|(_, _, at)| *at <= before)
                })
            };
            // A task the server has not said ended may be what it works on.
            calls || routing.tasks.locked().iter().any(|((s, _), t)| *s == session && !t.ended.is_cancelled())
        }
    }

    /// The attempt went out as request `request` on upstream session `session`.
    pub fn sent(&self, session: u64, request: RequestId) {
        let mut in_flight = self.routing.in_flight.locked();
        if let Some(call) = in_flight.get_mut(&self.instance).and_then(|c| c.iter_mut().find(|c| c.id == self.id)) {
            // Marked gone before the lock is released, as in `drop`: what the server says
            // about the old request meanwhile finds it in one or the other.
            if let Some((session, request, _)) = call.upstream.replace((session, request, tokio::time::Instant::now()))
            {
                self.routing.gone(session, request);
            }
        }
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        // The call's end is noted before it leaves the calls in flight (both under their
        // lock, which the rule takes first): what the server says meanwhile finds it in
        // one or the other.
        let mut in_flight = self.routing.in_flight.locked();
        let Some(calls) = in_flight.get_mut(&self.instance) else { return };
        let Some(at) = calls.iter().position(|c| c.id == self.id) else { return };
        let call = calls.remove(at);
        if calls.is_empty() {
            in_flight.remove(&self.instance);
        }
        if let Some((session, request, _)) = call.upstream {
            self.routing.gone(session, request);
        }
        let how = if self.answered.load(Ordering::Relaxed) { Ending::Answered } else { Ending::Unanswered };
        self.routing.call_ended(self.instance, call.client, how);
    }
}

/// `request` as the client sees it, if its capabilities allow it.
pub fn to_client(request: UpstreamRequest, peer: &Peer<RoleServer>, server: &str) -> Result<ServerRequest, ErrorData> {
    // A 2026-07-28 client never initialised (over HTTP rmcp makes up its details, with its
    // revision): servers may not send it requests.
    let Some(info) = peer.peer_info().filter(|i| i.protocol_version.has_initialize()) else {
        return Err(ErrorData::new(
            rmcp::model::ErrorCode::METHOD_NOT_FOUND,
            format!(
                "the client behind the gateway speaks MCP 2026-07-28, which takes no requests from servers outside a call it made (server `{server}` sent one)"
            ),
            None,
        ));
    };
    as_request(request, &info.capabilities, server)
}

/// `request` as a client with `caps` may be asked it: a client that did not advertise
/// the capability is not.
pub fn as_request(
    request: UpstreamRequest,
    caps: &ClientCapabilities,
    server: &str,
) -> Result<ServerRequest, ErrorData> {
    let (request, supported, what) = match request {
        UpstreamRequest::Sampling(p) => {
            (ServerRequest::CreateMessageRequest(CreateMessageRequest::new(p)), caps.sampling.is_some(), "sampling")
        }
        UpstreamRequest::Roots => (ServerRequest::ListRootsRequest(Default::default()), caps.roots.is_some(), "roots"),
        UpstreamRequest::Elicitation(p) => {
            (ServerRequest::ElicitRequest(ElicitRequest::new(p)), caps.elicitation.is_some(), "elicitation")
        }
        // Asked to run as a task (`transport::typed`): as its method says.
        UpstreamRequest::Custom(c) => match ClientTaskRequest::of(&c.method) {
            Some(ClientTaskRequest::Sampling) => (ServerRequest::CustomRequest(c), caps.sampling.is_some(), "sampling"),
            Some(ClientTaskRequest::Elicitation) => {
                (ServerRequest::CustomRequest(c), caps.elicitation.is_some(), "elicitation")
            }
            None => (ServerRequest::CustomRequest(c), true, "custom requests"),
        },
    };
    if !supported {
        return Err(ErrorData::new(
            rmcp::model::ErrorCode::METHOD_NOT_FOUND,
            format!("the client behind the gateway does not support {what} (server `{server}` asked for it)"),
            None,
        ));
    }
    Ok(request)
}

/// Asks `peer` the server's `request` (about the client's call `originating`), and
/// closes the client's dialog if the server gives up on it.
pub async fn ask(
    peer: Peer<RoleServer>,
    mut request: ServerRequest,
    originating: Option<RequestId>,
    asker: Asker,
) -> Result<ClientResult, ErrorData> {
    if let Some(id) = originating {
        request.extensions_mut().insert(OriginatingRequestId(id));
    }
    // On a task of its own: rmcp marks requests sent from inside a request handler with
    // that request's id (a task-local), and here that would be the upstream server's id,
    // which means nothing to the client's session.
    let sent = tokio::spawn(async move {
        let handle = peer.send_cancellable_request(request, PeerRequestOptions::no_options()).await?;
        let id = handle.id.clone();
        tokio::select! {
            answer = handle.await_response() => answer,
            () = asker.cancel.cancelled() => {
                // The server gave up: close the client's dialog too.
                let reason = Some("the server cancelled its request".to_owned());
                let _ = peer.notify_cancelled(CancelledNotificationParam::new(Some(id), reason.clone())).await;
                Err(rmcp::ServiceError::Cancelled { reason })
            }
        }
    });
    match sent.await {
        Ok(answer) => answer.map_err(|e| match e {
            rmcp::ServiceError::McpError(e) => e,
            other => ErrorData::internal_error(format!("the client did not answer: {other}"), None),
        }),
        Err(e) => Err(ErrorData::internal_error(format!("forwarding the request failed: {e}"), None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call of `client`'s in flight, as `track_call` registers one (its `id` apart from
    /// those `Routing` gives).
    fn call_of(id: u64, client: &ClientPeer, request: i64) -> InFlight {
        InFlight {
            id,
            client: client.client.clone(),
            peer: Some(client.peer.clone()),
            request: RequestId::Number(request),
            upstream: None,
            bridge: None,
            since: Instant::now(),
        }
    }

    #[test]
    fn progress_is_kept_to_a_status_line_under_a_token_of_the_gateways() {
        let token = |t: &str| ProgressToken(rmcp::model::NumberOrString::String(t.into()));
        let mut p = ProgressNotificationParam::new(token("7"), 0.5).with_message("é".repeat(10_000));
        let cut = bounded(p.clone()).unwrap().message.unwrap();
        assert!(cut.len() <= MAX_PROGRESS_MESSAGE + '…'.len_utf8() && cut.ends_with('…'), "{}", cut.len());
        p.progress_token = token(&"x".repeat(MAX_PROGRESS_TOKEN + 1));
        assert!(bounded(p).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_of_another_client_that_just_ended_still_counts_for_a_moment() {
        let routing = Routing::default();
        routing.call_ended(1, "x".into(), Ending::Unanswered);
        assert!(routing.another_ended(1, "y", true), "x's call may still be served");
        assert!(!routing.another_ended(1, "x", true), "a client's own ended call is no other client's");
        assert!(!routing.another_ended(2, "y", true), "on another instance");
        tokio::time::sleep(ENDED_COUNTS).await;
        assert!(!routing.another_ended(1, "y", true));
        // Remembered within bounds: the stale are swept once many instances are known.
        for n in 0..1000 {
            routing.call_ended(n, format!("c{n}").into(), Ending::Unanswered);
        }
        tokio::time::sleep(ENDED_COUNTS).await;
        routing.call_ended(5000, "z".into(), Ending::Unanswered);
        assert_eq!(routing.ended.lock().unwrap().by_instance.len(), 1);
        for n in 0..1000 {
            routing.call_ended(7, format!("c{n}").into(), Ending::Unanswered);
        }
        assert_eq!(routing.ended.lock().unwrap().by_instance[&7].len(), ENDED_KEPT);
    }

    /// A request that names a call which ended goes to nobody, even while another
    /// client's call (not yet recorded as sent) could otherwise be the one it names.
    #[tokio::test(start_paused = true)]
    async fn a_request_naming_an_ended_call_goes_to_nobody() {
        let routing = Arc::new(Routing::default());
        let (bob, _server, _client) = super::super::asked_tasks::tests::session("bob").await;
        let call = call_of(1, &bob, 1);
        routing.in_flight.lock().unwrap().entry(1).or_default().push(call);
        routing.gone(0, RequestId::Number(7));
        let asking = |during: i64| {
            let asker =
                Asker { session: 0, during: Some(RequestId::Number(during)), cancel: Default::default(), task: None };
            match routing.caller(("a", 1), &asker, Serves::Many) {
                Caller::Client { to, .. } => Some(to.client.to_string()),
                Caller::Held(_) | Caller::Nobody(_) => None,
            }
        };
        assert_eq!(asking(7), None, "alice's call, which ended");
        assert_eq!(asking(8).as_deref(), Some("bob"), "a call not yet recorded as sent may be his");
        tokio::time::sleep(ENDED_COUNTS).await;
        assert_eq!(asking(7).as_deref(), Some("bob"), "forgotten in time");
        for n in 0..(GONE_KEPT as i64 + 10) {
            routing.gone(0, RequestId::Number(n));
        }
        let gone = routing.gone.lock().unwrap();
        assert_eq!((gone.order.len(), gone.at.len()), (GONE_KEPT, GONE_KEPT));
    }

    /// While the gateway has a request of its own out on an instance (a subscription made
    /// again, the log level, a task of a client gone cancelled), and a moment after, what
    /// the server says without naming a call reaches no client: it may be about another's.
    #[tokio::test(start_paused = true)]
    async fn what_a_server_says_during_the_gateways_own_request_reaches_no_client() {
        let routing = Arc::new(Routing::default());
        let (alice, _server, _client) = super::super::asked_tasks::tests::session("alice").await;
        let call = call_of(1000, &alice, 1);
        routing.in_flight.lock().unwrap().entry(1).or_default().push(call);
        let reader = || routing.log_reader(("a", 1), 0, None).map(|to| to.client.to_string());
        assert_eq!(reader().as_deref(), Some("alice"));
        let aside = routing.aside(1);
        assert_eq!(reader(), None, "the gateway's request is out");
        let asker = Asker { session: 0, during: None, cancel: Default::default(), task: None };
        assert!(matches!(routing.caller(("a", 1), &asker, Serves::Many), Caller::Nobody(_)));
        drop(aside);
        assert_eq!(reader(), None, "the server may still speak of it");
        tokio::time::sleep(ENDED_COUNTS).await;
        assert_eq!(reader().as_deref(), Some("alice"));
        let answered = routing.aside(1);
        answered.answered();
        drop(answered);
        assert_eq!(reader().as_deref(), Some("alice"), "one the server answered holds nothing back");
        // Alone on a shared instance, it is nobody's either. On an instance with a client
        // of its own (the stdio client's, a session's), everything is that client's.
        let alone = routing.aside(2);
        assert!(matches!(routing.caller(("a", 2), &asker, Serves::Many), Caller::Nobody(_)));
        let own = || Serves::One(Some(ClientPeer { client: alice.client.clone(), peer: alice.peer.clone() }));
        assert!(matches!(routing.caller(("a", 2), &asker, own()), Caller::Client { .. }));
        let call = call_of(1001, &alice, 2);
        routing.in_flight.lock().unwrap().entry(2).or_default().push(call);
        // Over stdio with no client that takes requests besides its calls' (2026-07-28).
        assert!(matches!(routing.caller(("a", 2), &asker, Serves::One(None)), Caller::Client { .. }));
        drop(alone);
        assert!(matches!(routing.caller(("a", 2), &asker, own()), Caller::Client { .. }), "its end holds nothing back");
    }

    /// A call's progress waiting for its client takes the client's share of the
    /// notifications on their way, as every notification to it does: past the share it
    /// is dropped, and what was delivered gives its room back.
    #[tokio::test]
    async fn a_calls_progress_counts_against_its_clients_share_of_notifications() {
        use rmcp::ServiceExt as _;
        struct Heard(Arc<Mutex<Vec<f64>>>);
        impl rmcp::ClientHandler for Heard {
            async fn on_progress(
                &self,
                p: ProgressNotificationParam,
                _: rmcp::service::NotificationContext<rmcp::RoleClient>,
            ) {
                self.0.lock().unwrap().push(p.progress);
            }
        }
        let routing = Arc::new(Routing::default());
        let (ours, theirs) = tokio::io::duplex(1 << 16);
        let server = tokio::spawn(async move { super::super::asked_tasks::tests::Nothing.serve(ours).await.unwrap() });
        let heard = Arc::new(Mutex::new(Vec::new()));
        let _client = Heard(heard.clone()).serve(theirs).await.unwrap();
        let server = server.await.unwrap();
        let (alice, peer): (Arc<str>, _) = ("alice".into(), server.peer().clone());
        let token = |t: &str| ProgressToken(rmcp::model::NumberOrString::String(t.into()));
        let full: Vec<_> = (0..super::super::downstreams::MAX_SENDING_TO_ONE)
            .map(|_| routing.sending.hold(&alice, 1).expect("room"))
            .collect();
        let to = ProgressTo::Request(peer, token("down"));
        routing.map_progress(1, token("up"), (to, &alice));
        routing.progress(1, ProgressNotificationParam::new(token("up"), 1.0));
        drop(full);
        routing.progress(1, ProgressNotificationParam::new(token("up"), 2.0));
        routing.unmap_progress(1, &token("up")).expect("a forwarder").flush().await;
        // (In order: had the first not been dropped, it would be heard first.)
        for _ in 0..500 {
            if !heard.lock().unwrap().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(heard.lock().unwrap().first(), Some(&2.0), "the first came past the client's share");
        assert_eq!(routing.sending.load(), (0, 0), "what was delivered gave its room back");
    }

    /// A task id a server gives again (once the first task's time to live is up, say)
    /// is the new task's: the first task's owner owns it no more.
    #[tokio::test]
    async fn a_task_id_given_again_is_owned_by_the_new_tasks_client() {
        let routing = Arc::new(Routing::default());
        let (alice, _s1, _c1) = super::super::asked_tasks::tests::session("alice").await;
        let (bob, _s2, _c2) = super::super::asked_tasks::tests::session("bob").await;
        let alices = routing.own_task(3, "1", alice, CancellationToken::new());
        assert!(alices.owns());
        let bobs = routing.own_task(3, "1", bob, CancellationToken::new());
        assert!(!alices.owns() && bobs.owns());
        assert_eq!(routing.task_owner(3, "1").map(|o| o.client.to_string()).as_deref(), Some("bob"));
        drop(alices);
        assert!(bobs.owns(), "the first owner's end takes nothing of the new one's");
    }

    /// A shared server's log line goes to the one client with calls in flight there, and
    /// to nobody while another client's call there may still be served.
    #[tokio::test(start_paused = true)]
    async fn a_log_line_goes_to_the_one_client_in_flight() {
        let routing = Arc::new(Routing::default());
        let (alice, _server, _client) = super::super::asked_tasks::tests::session("alice").await;
        let call = call_of(1, &alice, 1);
        routing.in_flight.lock().unwrap().entry(1).or_default().push(call);
        let reader = || routing.log_reader(("a", 1), 0, None).map(|to| to.client.to_string());
        assert_eq!(reader().as_deref(), Some("alice"));
        routing.call_ended(1, "bob".into(), Ending::Unanswered);
        assert_eq!(reader(), None, "bob's call ended unanswered a moment ago: it may be his");
        tokio::time::sleep(ENDED_COUNTS).await;
        assert_eq!(reader().as_deref(), Some("alice"));
        // A line the server writes just after answering Bob may be about his call; a
        // request of the server's is not held back by it (rule 3 is of unanswered calls).
        routing.call_ended(1, "bob".into(), Ending::Answered);
        assert_eq!(reader(), None, "bob's call was answered during hers: the line may tell of it");
        let asker = Asker { session: 0, during: None, cancel: Default::default(), task: None };
        assert!(matches!(routing.caller(("a", 1), &asker, Serves::Many), Caller::Client { .. }));
        tokio::time::sleep(ENDED_COUNTS).await;
        assert_eq!(reader().as_deref(), Some("alice"));
        routing.call_ended(1, "alice".into(), Ending::Answered);
        assert_eq!(reader().as_deref(), Some("alice"), "her own answered call holds nothing back");
        // A call made after Bob's was answered is no call his answer came during: what
        // the server writes in it is shown (as to every client that calls after another).
        routing.call_ended(1, "bob".into(), Ending::Answered);
        tokio::time::sleep(Duration::from_millis(10)).await;
        routing.in_flight.lock().unwrap().get_mut(&1).unwrap()[0].since = Instant::now();
        assert_eq!(reader().as_deref(), Some("alice"), "her call began after his answer");
        assert!(routing.log_reader(("a", 2), 0, None).is_none(), "nobody's call is in flight on another instance");
        // While a task of Bob's runs there, a line that names no task may be his; one that
        // names his task is his alone.
        let (bob, _server, _client) = super::super::asked_tasks::tests::session("bob").await;
        let ended = CancellationToken::new();
        let task = routing.own_task(0, "t1", bob, ended.clone());
        assert!(routing.task_running(0, "t1"), "a new task of that id on that connection would be refused");
        assert!(!routing.task_running(1, "t1"), "on another connection it is another task");
        assert_eq!(reader(), None, "a line of his task's, perhaps");
        let tagged = routing.log_reader(("a", 1), 0, Some("t1".into())).map(|to| to.client.to_string());
        assert_eq!(tagged.as_deref(), Some("bob"));
        assert!(routing.log_reader(("a", 1), 0, Some("t2".into())).is_none(), "no task of anyone's");
        ended.cancel();
        assert_eq!(reader().as_deref(), Some("alice"), "his task ended");
        assert!(!routing.task_running(0, "t1"), "its id may be used again");
        drop(task);
        // A task a client on 2026-07-28 had relayed there (known by its address alone)
        // may be what a line says, whoever's call is in flight.
        super::super::tasks::relayed::tests::running(&routing.relayed, "kept", "127.0.0.2", 1);
        assert_eq!(reader(), None, "a line of the relayed task's, perhaps");
        super::super::tasks::relayed::tests::forget(&routing.relayed, "kept");
        assert_eq!(reader().as_deref(), Some("alice"));
    }

    /// A server's request about a task it has just created waits, briefly, for the
    /// gateway to note whose task it is; one about a task nobody owns is refused after
    /// that wait, and only so many wait at once.
    #[tokio::test(start_paused = true)]
    async fn a_request_about_a_task_just_created_waits_for_its_owner() {
        let routing = Arc::new(Routing::default());
        let (bob, _server, _client) = super::super::asked_tasks::tests::session("bob").await;
        let ended = CancellationToken::new();
        let asking = {
            let routing = routing.clone();
            tokio::spawn(async move { routing.task_owner_soon(0, "t1").await.map(|to| to.client.to_string()) })
        };
        tokio::time::sleep(OWNER_WAIT / 2).await;
        let _task = routing.own_task(0, "t1", bob, ended);
        assert_eq!(asking.await.unwrap().as_deref(), Some("bob"));
        let started = Instant::now();
        assert!(routing.task_owner_soon(0, "t2").await.is_none());
        assert_eq!(started.elapsed(), OWNER_WAIT, "nobody's, once the wait is over");
        routing.waiting_for_owners.store(OWNER_WAITERS, Ordering::Release);
        let started = Instant::now();
        assert!(routing.task_owner_soon(0, "t2").await.is_none());
        assert_eq!(started.elapsed(), Duration::ZERO, "too many wait: at once");
        assert_eq!(routing.task_owner_soon(0, "t1").await.map(|to| to.client.to_string()).as_deref(), Some("bob"));
    }
}
