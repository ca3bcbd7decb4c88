//! Supervision of one upstream server: start it, list what it offers, watch it, and
//! restart it with exponential backoff when it dies, marking it down after a crash loop.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::http::{HeaderName, HeaderValue};
use rmcp::model::{PaginatedRequestParams, Prompt, ProtocolVersion, Resource, ResourceTemplate, ServerPeerInfo, Tool};
use rmcp::service::{
    ClientCacheConfig, ClientLifecycleMode, PeerRequestOptions, RunningService, serve_client_with_lifecycle_and_ct,
};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{Peer, RoleClient};
use std::sync::RwLock;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::http_client::{Tap, Tapped};
use super::lines::Deaf;
use super::listen::Follows;
use super::process::ServerProcess;
use super::tasks::{Dropped, TaskSupport};
use super::upstream::{InOrder, Offered, Relay, UpstreamHandler};
use crate::config::{HttpLaunch, Launch, Protocol, RestartPolicy, ServerConfig, StdioLaunch};
use crate::lasting::{Locked, ReadWrite};
use crate::pace::Recent;
use crate::redact::Secrets;

/// Lines longer than this from a server are dropped (and the request they answer times
/// out). rmcp's default is 16 MiB; tools that return whole files deserve more.
pub(super) const MAX_MESSAGE_BYTES: usize = 64 << 20;

/// Lines that would weigh more than this once read (`crate::weight`) are dropped as
/// those too long are: 64 MiB of `0,0,0…` would take some 4 GiB as JSON values.
pub(super) const MAX_MESSAGE_WEIGHT: usize = 1 << 30;

static NEXT_SESSION: AtomicU64 = AtomicU64::new(1);
static NEXT_INSTANCE: AtomicU64 = AtomicU64::new(1);

/// What the server is told its client can do (sampling, elicitation, roots), once that is
/// known: a server waits for it before it starts.
pub type Offer = watch::Receiver<Option<Offered>>;

/// How every supervisor of a gateway runs its server.
#[derive(Debug, Clone)]
pub struct Supervision {
    pub policy: RestartPolicy,
    pub init_timeout: Duration,
    /// Applied to every error before it is logged or kept in the state.
    pub secrets: Secrets,
    /// The variables of the gateway's environment a server process does not inherit
    /// (`process::withheld`).
    pub withheld: super::process::Withheld,
    /// What the starts of each server (by name) showed of the revisions it speaks.
    pub revisions: Revisions,
}

/// The servers (by name) whose last start initialised them on a revision before
/// 2026-07-28: their next start initialises them without asking for 2026-07-28 first.
/// Asking (`server/discover`) costs a round trip with a server that does not know the
/// request, and can fail outright: with a server that answers it late (after the 10 s
/// rmcp waits, as a slow first start does) or with an error rmcp does not take for "older
/// revision". Any start that fails asks again next time, so a server upgraded to speak
/// only 2026-07-28 is not locked out. One for a gateway, so that the instances of a
/// `session`-scoped server learn together.
#[derive(Debug, Clone, Default)]
pub struct Revisions(Arc<std::sync::Mutex<std::collections::HashSet<Arc<str>>>>);

impl Revisions {
    fn initialises(&self, server: &str) -> bool {
        self.0.locked().contains(server)
    }

    /// `server` is launched anew (a reload changed its launch, or added it): what its
    /// old process spoke says nothing of the new one's.
    pub fn forget(&self, server: &str) {
        self.0.locked().remove(server);
    }

    /// `server`'s start ended: initialised on `revision`, or (`None`) failed.
    pub fn learn(&self, server: &Arc<str>, revision: Option<&ProtocolVersion>) {
        let mut known = self.0.locked();
        if revision.is_some_and(ProtocolVersion::has_initialize) {
            known.insert(server.clone());
        } else {
            known.remove(server);
        }
    }
}

/// What a server is doing now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Starting,
    Ready,
    Restarting,
    /// Crash-looping or unsupported; a fresh start is tried every `down_retry_ms`.
    Down,
    Stopped,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Starting => "starting",
            Self::Ready => "ready",
            Self::Restarting => "restarting",
            Self::Down => "down",
            Self::Stopped => "stopped",
        }
    }
}

/// The pause between two re-listings of one session: a server announcing list changes
/// without end (each answer with another) has its lists read, the catalogue rebuilt and
/// every client told at most once a pause, not as fast as it can answer.
const RELIST_PAUSE: Duration = Duration::from_secs(1);

/// What a server offers, as it last listed it.
#[derive(Debug, Default)]
pub struct Listing {
    pub tools: Vec<Tool>,
    /// Tool name → its `execution.taskSupport` (MCP 2025-11-25), where it said one.
    pub task_support: HashMap<String, TaskSupport>,
    pub prompts: Vec<Prompt>,
    pub resources: Vec<Resource>,
    pub templates: Vec<ResourceTemplate>,
}

/// One initialised connection to a server process. Replaced on every restart.
#[derive(Debug)]
pub struct Session {
    /// Unique across all servers and restarts.
    pub id: u64,
    /// The server's name.
    pub server: Arc<str>,
    pub peer: Peer<RoleClient>,
    pub info: Option<Arc<ServerPeerInfo>>,
    /// Cancelled the moment the connection is lost, so calls in flight end at once.
    pub closed: CancellationToken,
    pub listing: RwLock<Arc<Listing>>,
    /// The resources followed on listen requests of their own (2026-07-28).
    pub follows: Follows,
    /// What the server's answers said that rmcp's types drop (its tasks).
    pub dropped: Arc<Dropped>,
    /// Asks the supervisor to restart the server (see [`Session::kicker`]); only for a
    /// server process.
    restart: Option<Restart>,
    /// Set while a `ping` asks whether the server still answers ([`Session::probe`]).
    probing: Arc<std::sync::atomic::AtomicBool>,
    /// A re-listing under way, and whether another was asked for meanwhile
    /// ([`Session::refresh`]).
    relisting: std::sync::Mutex<Relisting>,
}

impl Session {
    /// Whether this is a connection to a server process (not to a `url` server, whose
    /// sessions come and go while the server runs on).
    pub fn is_process(&self) -> bool {
        self.restart.is_some()
    }
}

/// Whether a re-listing is under way, and whether it is to list once more when done.
#[derive(Debug, Default)]
struct Relisting {
    running: bool,
    again: bool,
}

/// Ends a re-listing when dropped.
struct Relisted<'a>(&'a std::sync::Mutex<Relisting>);

impl Drop for Relisted<'_> {
    fn drop(&mut self) {
        self.0.locked().running = false;
    }
}

/// Asks a server's supervisor to restart it, naming the session to end: a request for a
/// session that is not the current one any more is moot, and one made while the
/// supervisor is busy is seen as soon as it serves that session. With it, what the
/// server did wrong, when it is restarted for a fault of its own ([`Kicker`]).
pub type Restart = Arc<watch::Sender<(u64, Option<Arc<str>>)>>;

/// Asks for `session` to be restarted, for `fault` if any. Sessions are numbered in the
/// order they start: a request for an older one, late, does not take the place of one
/// for a newer.
fn ask_restart(restart: &Restart, session: u64, fault: Option<&str>) {
    restart.send_if_modified(|asked| {
        let newer = session > asked.0;
        if newer {
            *asked = (session, fault.map(Arc::from));
        }
        newer
    });
}

impl Session {
    pub fn is_live(&self) -> bool {
        !self.closed.is_cancelled()
    }

    /// What restarts the server while this session is its live one: the session stopped
    /// reading what it is sent, or answering. Treated as a crash (see [`Kicker`]). A
    /// server over HTTP has no input to stop reading (each message is a request of its
    /// own, which may just be slow): its kicker does nothing.
    pub fn kicker(&self) -> Kicker {
        Kicker { session: self.id, closed: self.closed.clone(), restart: self.restart.clone() }
    }

    /// Asks whether the server process still answers, once a request to it went
    /// unanswered for its whole timeout: a `ping`, which MCP servers answer at once, even
    /// while they serve a slow request. One that answers no ping within `within` has
    /// stopped reading its input or is wedged (however small the requests it was sent:
    /// [`Session::kicker`] sees only a full pipe), and is restarted. Not while `busy`
    /// says it serves something else sent before the ping (a server on one thread may be
    /// working on it, and a restart would cut it short), when it starts or when the ping
    /// goes unanswered. One probe at a time; never with `within` zero, nor for a server
    /// over HTTP.
    pub fn probe(&self, within: Duration, busy: impl Fn(tokio::time::Instant) -> bool + Send + 'static) {
        use std::sync::atomic::Ordering::{AcqRel, Release};
        use tokio::time::{Instant, timeout};
        if within.is_zero() || self.restart.is_none() || self.closed.is_cancelled() {
            return;
        }
        if busy(Instant::now()) {
            tracing::info!(
                server = %self.server,
                "a request to it timed out while it serves one sent before: not pinged, kept running"
            );
            return;
        }
        if self.probing.swap(true, AcqRel) {
            return;
        }
        let (peer, kicker, probing) = (self.peer.clone(), self.kicker(), self.probing.clone());
        let server = self.server.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let ping = rmcp::model::ClientRequest::PingRequest(Default::default());
            let queued = timeout(within, peer.send_cancellable_request(ping, PeerRequestOptions::no_options())).await;
            // Taken once the ping is queued: a request stamped sent before (or as) this
            // was queued before the ping, which waits behind it.
            let asked = Instant::now();
            let answered = match queued {
                // An error is an answer too: the server reads what it is sent.
                Ok(Ok(handle)) => {
                    timeout(within.saturating_sub(started.elapsed()), handle.await_response()).await.is_ok()
                }
                // The connection is gone already: nothing to restart here.
                Ok(Err(_)) => true,
                // Not even taken for writing.
                Err(_) => false,
            };
            probing.store(false, Release);
            if answered {
                tracing::info!(server = %server, "a request to it timed out, but it answered a ping: kept running");
            } else if busy(asked) {
                tracing::info!(
                    server = %server,
                    "it answered no ping, but it serves a request sent before the ping: kept running"
                );
            } else {
                kicker.kick(&format!(
                    "it answered no ping within {} ms, after a request to it timed out",
                    within.as_millis()
                ));
            }
        });
    }

    /// Re-lists everything the server's capabilities say it has, each time within
    /// `within`, and calls `listed` after each listing; a server that does not answer in
    /// time keeps its previous listing. Asked while a re-listing is under way, it returns
    /// at once, and the one under way lists once more when done, after [`RELIST_PAUSE`]:
    /// however many list changes a server announces, one re-listing runs at a time, and
    /// none is missed.
    pub async fn refresh(&self, within: Duration, listed: impl Fn()) {
        {
            let mut relisting = self.relisting.locked();
            if relisting.running {
                relisting.again = true;
                return;
            }
            relisting.running = true;
        }
        // Done, even if this future is dropped half way.
        let done = Relisted(&self.relisting);
        loop {
            match tokio::time::timeout(within, list_all(&self.peer, self.info.as_deref(), &self.dropped)).await {
                Ok(listing) => *self.listing.writing() = Arc::new(listing),
                Err(_) => tracing::warn!(
                    session = self.id,
                    "re-listing took longer than {} ms; the previous listing stays",
                    within.as_millis()
                ),
            }
            listed();
            // Asked again meanwhile: list again, after a pause in which more changes
            // count as one; else done, in the same breath (a request coming between the
            // two would be lost).
            {
                let mut relisting = self.relisting.locked();
                if !relisting.again {
                    relisting.running = false;
                    std::mem::forget(done);
                    return;
                }
            }
            tokio::time::sleep(RELIST_PAUSE).await;
            self.relisting.locked().again = false;
        }
    }

    /// What the server offers, as last listed.
    pub fn listing(&self) -> Arc<Listing> {
        self.listing.reading().clone()
    }
}

/// Restarts a server that stopped answering, if the session it came from is still live (a
/// live session is always its server's current one: a restart closes it first), as after
/// a crash: its session lost at once, `why` its `last_error` and reported, and the next
/// start after the backoff.
#[derive(Debug, Clone)]
pub struct Kicker {
    closed: CancellationToken,
    session: u64,
    restart: Option<Restart>,
}

impl Kicker {
    pub fn kick(&self, why: &str) {
        if let Some(restart) = &self.restart
            && !self.closed.is_cancelled()
        {
            ask_restart(restart, self.session, Some(why));
        }
    }
}

/// A server's state as the gateway sees it.
#[derive(Debug, Clone)]
pub struct ServerState {
    pub status: Status,
    /// The current session, or the last one (closed) while restarting or down: its
    /// listing keeps the server's tools in the catalogue, so clients never lose them.
    pub session: Option<Arc<Session>>,
    /// Successful starts after the first.
    pub restarts: u32,
    pub last_error: Option<String>,
}

/// The gateway's handle on one supervised server.
#[derive(Debug)]
pub struct ServerHandle {
    pub name: Arc<str>,
    /// Unique across every server instance of the gateway (shared or per session).
    pub instance: u64,
    pub config: ServerConfig,
    state: watch::Receiver<ServerState>,
    shutdown: CancellationToken,
    /// Cancelled when a reload replaced or removed it: it finishes its calls, and is not
    /// started again when it ends.
    retired: CancellationToken,
    restart: Restart,
    task: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The longest a call on it may take, in milliseconds, under any configuration it
    /// served under ([`ServerHandle::may_take`]).
    longest_call_ms: std::sync::atomic::AtomicU64,
}

/// Why a server could not take a call.
#[derive(Debug, Clone)]
pub struct NotReady {
    pub status: Status,
    pub last_error: Option<String>,
}

impl ServerHandle {
    pub fn state(&self) -> ServerState {
        self.state.borrow().clone()
    }

    /// Whether it was told to stop (its session ended, or the gateway is stopping).
    pub fn is_stopped(&self) -> bool {
        self.shutdown.is_cancelled()
    }

    pub fn subscribe(&self) -> watch::Receiver<ServerState> {
        self.state.clone()
    }

    /// The live session, waiting up to `within` for one (a start or restart in progress).
    /// A server that is down answers at once.
    pub async fn ready_session(&self, within: Duration) -> Result<Arc<Session>, NotReady> {
        let mut rx = self.state.clone();
        let wait = rx.wait_for(|s| {
            matches!(s.status, Status::Down | Status::Stopped)
                || (s.status == Status::Ready && s.session.as_ref().is_some_and(|x| x.is_live()))
        });
        let state = match tokio::time::timeout(within, wait).await {
            Ok(Ok(state)) => state.clone(),
            _ => self.state(),
        };
        match state.session {
            Some(session) if state.status == Status::Ready && session.is_live() => Ok(session),
            _ => Err(NotReady { status: state.status, last_error: state.last_error }),
        }
    }

    /// Restarts a running server now (an adapter's plan asked for it) and waits up to
    /// `within` for it to be ready again. `session` is the one a call failed on: if the
    /// server has since started another (it crashed and came back), that one is not
    /// restarted, only waited for. Without it, the current session is restarted. A
    /// server that is not running is left to its own restart.
    pub async fn restart(&self, session: Option<u64>, within: Duration) -> Result<Arc<Session>, NotReady> {
        let before = session.or_else(|| self.state().session.map(|s| s.id));
        if let Some(session) = before {
            ask_restart(&self.restart, session, None);
        }
        let mut rx = self.state.clone();
        let fresh = rx.wait_for(|s| {
            matches!(s.status, Status::Down | Status::Stopped)
                || (s.status == Status::Ready
                    && s.session.as_ref().is_some_and(|x| x.is_live() && Some(x.id) != before))
        });
        let _ = tokio::time::timeout(within, fresh).await;
        self.ready_session(Duration::ZERO).await
    }

    /// A reload replaced or removed the server: this instance serves the calls it has
    /// until it is stopped, but if it ends meanwhile (it crashed, or stopped answering and
    /// was to be restarted) it is not started again with its old launch, nor is a start in
    /// progress finished. Its calls' next attempts go to its successor.
    pub fn retire(&self) {
        self.retired.cancel();
    }

    /// A configuration it serves under lets a call on it take up to `longest`.
    pub fn may_take(&self, longest: Duration) {
        let ms = u64::try_from(longest.as_millis()).unwrap_or(u64::MAX);
        self.longest_call_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// The longest a call on it may take under any configuration it served under (none
    /// said yet: `None`), which is how long a retired one waits for its calls in flight.
    pub fn longest_call(&self) -> Option<Duration> {
        let ms = self.longest_call_ms.load(Ordering::Relaxed);
        (ms > 0).then(|| Duration::from_millis(ms))
    }

    /// Whether a reload replaced or removed this instance.
    pub fn is_retired(&self) -> bool {
        self.retired.is_cancelled()
    }

    /// Stops the server and waits for its process to be gone, whoever else waits too.
    pub async fn shutdown(&self) {
        self.shutdown.cancel();
        let task = self.task.locked().take();
        match task {
            Some(task) => _ = task.await,
            // Another caller awaits the supervisor: `Stopped` is published once the
            // process is gone (or the supervisor ended, which closes the channel).
            None => _ = self.state.clone().wait_for(|s| s.status == Status::Stopped).await,
        }
    }
}

/// Starts supervising `config` once `offer` says what its client can do; its traffic goes
/// to the relay `relay` makes for the new instance's id.
pub fn spawn_supervisor(
    config: ServerConfig,
    relay: impl FnOnce(u64) -> Arc<dyn Relay>,
    offer: Offer,
    how: &Supervision,
) -> ServerHandle {
    let (tx, rx) =
        watch::channel(ServerState { status: Status::Starting, session: None, restarts: 0, last_error: None });
    let (shutdown, retired) = (CancellationToken::new(), CancellationToken::new());
    // No session is numbered 0.
    let restart = Arc::new(watch::Sender::new((0, None)));
    let name: Arc<str> = config.name.as_str().into();
    let instance = NEXT_INSTANCE.fetch_add(1, Ordering::Relaxed);
    let sup = Supervisor {
        name: name.clone(),
        config: config.clone(),
        relay: relay(instance),
        offer,
        how: how.clone(),
        tx,
        shutdown: shutdown.clone(),
        retired: retired.clone(),
        restart: restart.clone(),
    };
    let task = supervised(sup);
    let task = std::sync::Mutex::new(Some(task));
    let longest_call_ms = std::sync::atomic::AtomicU64::new(0);
    ServerHandle { name, instance, config, state: rx, shutdown, retired, restart, task, longest_call_ms }
}

/// `sup` run, and should it panic (a bug), run again as a server that ended: its process
/// went with the supervisor, so its session is closed and the server is `restarting`,
/// saying why, until the new start is up; not `ready` for ever with nothing serving it.
fn supervised(sup: Supervisor) -> tokio::task::JoinHandle<()> {
    let what = format!("supervision of the server `{}`", sup.name);
    let again = std::sync::atomic::AtomicBool::new(false);
    crate::lasting::spawn(what, move || {
        if again.swap(true, Ordering::Relaxed) {
            sup.tx.send_modify(|s| {
                s.status = Status::Restarting;
                s.last_error = Some(SUPERVISION_FAILED.into());
                if let Some(session) = &s.session {
                    session.closed.cancel();
                }
            });
        }
        sup.clone().run()
    })
}

/// Why a server whose supervision panicked is starting again.
const SUPERVISION_FAILED: &str =
    "Rebound's supervision of this server failed (a bug, in the gateway's log); it starts again";

/// The delay before restart number `attempt` (0-based): `initial · 2^attempt`, capped.
pub fn restart_delay(policy: &RestartPolicy, attempt: u32) -> Duration {
    crate::pace::grown(policy.initial_delay_ms, 2.0, policy.max_delay_ms, attempt)
}

#[derive(Clone)]
struct Supervisor {
    name: Arc<str>,
    config: ServerConfig,
    relay: Arc<dyn Relay>,
    offer: Offer,
    how: Supervision,
    tx: watch::Sender<ServerState>,
    shutdown: CancellationToken,
    /// See [`ServerHandle::retire`].
    retired: CancellationToken,
    restart: Restart,
}

/// Why connecting to a server failed; `handshake` when it got as far as the protocol
/// (rmcp's error, or the process exiting meanwhile), not when it could not be reached or
/// ran out of time.
struct ConnectError {
    message: String,
    handshake: bool,
}

impl ConnectError {
    fn other(message: String) -> Self {
        Self { message, handshake: false }
    }

    fn handshake(e: &rmcp::service::ClientInitializeError, message: String) -> Self {
        use rmcp::service::ClientInitializeError as E;
        Self { message, handshake: !matches!(e, E::TransportError { .. } | E::Cancelled) }
    }
}

/// A running, initialised server.
struct Connection {
    /// The child process of a stdio server; none for an HTTP one.
    process: Option<ServerProcess>,
    service: tokio::task::JoinHandle<()>,
    /// Cancelled when rmcp's service loop ends (the server closed its output), so the
    /// join handle itself is awaited only once, in `stop`.
    service_ended: CancellationToken,
    /// Said when a stdio server is found to have stopped reading its input.
    deaf: Deaf,
    stop: CancellationToken,
    session: Arc<Session>,
}

/// How a connection's service ended.
enum Served {
    /// The server went away (exited, closed its output, the HTTP session ended: `error`
    /// says which, redacted), after being up this long.
    Lost { up_for: Duration, error: String },
    /// A restart was asked for (an adapter's plan), after being up this long.
    Restart { up_for: Duration },
    /// The gateway is stopping.
    Shutdown,
}

/// What a supervisor saw go wrong with its server, and what it does about it: for the
/// relay to report (the errors log). A restart that was asked for, and is made at once,
/// is not trouble.
#[derive(Debug)]
pub struct Trouble {
    pub ended: Ended,
    pub next: Next,
}

/// How the server's last start or session ended. Errors are redacted.
#[derive(Debug)]
pub enum Ended {
    /// Its connection was lost: the process exited, closed its output, or its HTTP
    /// session ended.
    Lost(String),
    /// It could not be started, or did not finish initialising.
    StartFailed(String),
    /// A restart was asked for (an adapter's plan). One for a fault of the server's
    /// (it stopped answering, `Kicker`) is `Lost`.
    Asked,
}

/// When the server is started next.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Next {
    /// After this backoff.
    Restart(Duration),
    /// It ended `endings` times within the crash window, or once more while marked down
    /// (`tries`: how many times it has been tried since it was marked down, 0 when it
    /// has just been): it is marked down, and tried again after `retry_in`.
    Down { endings: usize, tries: u32, retry_in: Duration },
}

/// How often a server that stays down is reported: each of its first tries, then ever
/// fewer (the gap doubles), at least one an hour.
const STILL_DOWN_EVERY: Duration = Duration::from_secs(3600);

/// The recent failures that tell a crash loop, and the backoff so far.
#[derive(Default)]
struct Failures {
    crashes: Recent,
    attempt: u32,
    /// Marked down, and not up for a whole crash window since: the next ending marks it
    /// down again, one start per `down_retry_ms`, not another burst of restarts.
    down: Option<Downtime>,
}

/// A server marked down: how many times it has been tried since, and which of those
/// tries was last reported.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Downtime {
    tries: u32,
    reported: u32,
}

impl Failures {
    /// The server ended at `now` (`asked`: a restart asked for): when it starts next.
    /// Every ending counts towards the crash loop (a restart asked for too, so that
    /// restarts on every call end with the server marked down like any other loop), which
    /// marks the server down, to be tried after `down_retry_ms`, once: until it stays up
    /// for a crash window, each ending marks it down again. Otherwise after the backoff,
    /// but for a restart asked for, which is at once. With it, whether this ending is
    /// reported: a restart asked for and made is not trouble, and a server that stays down
    /// is reported on some of its tries only.
    fn ended(&mut self, now: Instant, policy: &RestartPolicy, asked: bool) -> (Next, bool) {
        let window = Duration::from_millis(policy.crash_window_ms);
        let looping = self.crashes.reached(now, window, policy.crash_loop_limit as usize);
        if looping || self.down.is_some() {
            let endings = self.crashes.len();
            let retry_in = Duration::from_millis(policy.down_retry_ms);
            let mut down = self.down.unwrap_or_default();
            let reported = self.down.is_none() || down.tried(retry_in);
            *self = Failures { down: Some(down), ..Failures::default() };
            (Next::Down { endings, tries: down.tries, retry_in }, reported)
        } else if asked {
            (Next::Restart(Duration::ZERO), false)
        } else {
            let delay = restart_delay(policy, self.attempt);
            self.attempt = self.attempt.saturating_add(1);
            (Next::Restart(delay), true)
        }
    }

    /// The server served for `up_for` before it ended: up for a whole crash window, it
    /// has not been looping (nor is it still down), however it ended.
    fn served(&mut self, up_for: Duration, policy: &RestartPolicy) {
        if up_for >= Duration::from_millis(policy.crash_window_ms) {
            *self = Failures::default();
        }
    }
}

impl Downtime {
    /// Counts one more try, a `retry` after the last, and says whether it is reported:
    /// the 1st, 2nd, 4th, 8th… (the gap doubles), and at least one per
    /// [`STILL_DOWN_EVERY`].
    fn tried(&mut self, retry: Duration) -> bool {
        self.tries = self.tries.saturating_add(1);
        let since = retry.saturating_mul(self.tries - self.reported);
        let due = self.tries >= self.reported.saturating_mul(2) || since >= STILL_DOWN_EVERY;
        if due {
            self.reported = self.tries;
        }
        due
    }
}

impl Supervisor {
    /// Starts the server once it is told what its client can do, and keeps it running:
    /// restarted with backoff when it goes away, marked down in a crash loop, stopped at
    /// shutdown; once retired by a reload, not started again.
    async fn run(mut self) {
        let caps = tokio::select! {
            caps = self.offer.wait_for(Option::is_some) => caps.ok().and_then(|c| c.clone()),
            () = self.shutdown.cancelled() => None,
        };
        let Some(caps) = caps else {
            self.tx.send_modify(|s| s.status = Status::Stopped);
            return;
        };
        let mut failures = Failures::default();
        let mut first = true;
        loop {
            let started = tokio::select! {
                r = self.start(&caps) => r,
                () = self.shutdown.cancelled() => break,
                () = self.retired.cancelled() => {
                    self.retired();
                    break;
                }
            };
            let ended = match started {
                Ok(conn) => {
                    let (up_for, ended) = match self.serve(conn, !first).await {
                        Served::Shutdown => break,
                        Served::Restart { up_for } => (up_for, Ended::Asked),
                        Served::Lost { up_for, error } => (up_for, Ended::Lost(error)),
                    };
                    failures.served(up_for, &self.how.policy);
                    ended
                }
                Err(error) => Ended::StartFailed(self.failed_to_start(&error, first)),
            };
            first = false;
            if self.retired() {
                break;
            }
            self.pause(&mut failures, ended).await;
            if self.shutdown.is_cancelled() || self.retired() {
                break;
            }
        }
        self.tx.send_modify(|s| {
            s.status = Status::Stopped;
            if let Some(session) = &s.session {
                session.closed.cancel();
            }
        });
    }

    /// Whether a reload replaced or removed this instance, which is then not started again.
    fn retired(&self) -> bool {
        let retired = self.retired.is_cancelled();
        if retired {
            tracing::info!(server = %self.name, "a reload replaced or removed this instance: not started again");
        }
        retired
    }

    /// Publishes `conn` as the server's session and serves until it ends; a `restarted`
    /// one counts as a restart.
    async fn serve(&self, mut conn: Connection, restarted: bool) -> Served {
        self.tx.send_modify(|s| {
            s.status = Status::Ready;
            s.session = Some(conn.session.clone());
            s.last_error = None;
            if restarted {
                s.restarts += 1;
            }
        });
        if restarted {
            tracing::info!(server = %self.name, "restarted and re-initialised");
        } else {
            tracing::info!(server = %self.name, "ready");
        }
        let up_since = Instant::now();
        let mut asked = self.restart.subscribe();
        let lost = tokio::select! {
            lost = exited(&mut conn.process) => lost,
            // Found before rmcp's service ends (it drains for seconds): the session is
            // closed now, so no call is given to it meanwhile.
            why = conn.deaf.found_out() => why.to_owned(),
            () = conn.service_ended.cancelled() => match conn.process {
                None => "the HTTP session ended".to_owned(),
                // Usually the process is exiting; its status says more.
                Some(_) => tokio::time::timeout(Duration::from_millis(200), exited(&mut conn.process))
                    .await
                    .unwrap_or_else(|_| "the server closed its output".to_owned()),
            },
            () = self.shutdown.cancelled() => {
                conn.stop().await;
                return Served::Shutdown;
            }
            () = async { drop(asked.wait_for(|(session, _)| *session == conn.session.id).await) } => {
                // A fault of the server's (it stopped answering) is a lost connection, with
                // its backoff and its report; a restart an adapter's plan asked for is not.
                let fault = asked.borrow().1.clone();
                match fault {
                    Some(fault) => fault.to_string(),
                    None => {
                        tracing::info!(server = %self.name, "restarting on request");
                        self.tx.send_modify(|s| s.status = Status::Restarting);
                        conn.stop().await;
                        return Served::Restart { up_for: up_since.elapsed() };
                    }
                }
            }
        };
        conn.session.closed.cancel();
        let lost = self.how.secrets.redact(&lost).into_owned();
        tracing::warn!(server = %self.name, "connection lost: {lost}; restarting");
        self.tx.send_modify(|s| {
            s.status = Status::Restarting;
            s.last_error = Some(lost.clone());
        });
        conn.stop().await;
        Served::Lost { up_for: up_since.elapsed(), error: lost }
    }

    /// A start failed: kept as the server's last error. The error, redacted.
    fn failed_to_start(&self, error: &str, first: bool) -> String {
        let error = self.how.secrets.redact(error).into_owned();
        tracing::warn!(server = %self.name, "failed to start: {error}");
        self.tx.send_modify(|s| {
            s.status = if first { Status::Starting } else { Status::Restarting };
            s.last_error = Some(error.clone());
        });
        error
    }

    /// Waits before the next start (see [`Supervisor::next_start`]); an ending that was
    /// not asked for, or that marks the server down, is reported to the relay first (a
    /// server that stays down, on the tries [`Downtime::tried`] picks).
    async fn pause(&self, failures: &mut Failures, ended: Ended) {
        let (next, reported) = self.next_start(failures, matches!(ended, Ended::Asked));
        let wait = match next {
            Next::Restart(after) => after,
            Next::Down { retry_in, .. } => retry_in,
        };
        if reported {
            self.relay.trouble(&self.name, Trouble { ended, next });
        }
        if !wait.is_zero() {
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = self.shutdown.cancelled() => {}
                () = self.retired.cancelled() => {}
            }
        }
    }

    /// When the server starts next ([`Failures::ended`]), with whether this ending is
    /// reported; one that marks it down says so.
    fn next_start(&self, failures: &mut Failures, asked: bool) -> (Next, bool) {
        let (next, reported) = failures.ended(Instant::now(), &self.how.policy, asked);
        if let Next::Down { endings, retry_in, .. } = next {
            tracing::error!(server = %self.name, endings, "crash loop: marked down, next try in {} ms", retry_in.as_millis());
            self.tx.send_modify(|s| s.status = Status::Down);
        }
        (next, reported)
    }

    async fn start(&self, caps: &Offered) -> Result<Connection, String> {
        let id = NEXT_SESSION.fetch_add(1, Ordering::Relaxed);
        let lifecycle = self.lifecycle();
        let asked = matches!(lifecycle, ClientLifecycleMode::Auto { .. });
        let dropped = Arc::new(Dropped::default());
        let mut deaf = Deaf::default();
        let (running, process, stop) = match self.connect(id, caps, lifecycle, &dropped, &deaf).await {
            // A server that cannot take the question is initialised at once, afresh (what
            // the first connection found does not hold for the second).
            Err(e) if asked && e.handshake => {
                tracing::info!(server = %self.name, "asking for MCP 2026-07-28 failed ({}); initialising instead", e.message);
                deaf = Deaf::default();
                self.connect(id, caps, ClientLifecycleMode::Initialize, &dropped, &deaf).await
            }
            connected => connected,
        }
        .map_err(|e| {
            self.how.revisions.learn(&self.name, None);
            e.message
        })?;
        running.set_response_cache_config(ClientCacheConfig::disabled()).await;
        let peer = running.peer().clone();
        let info = running.peer_info();
        self.how.revisions.learn(&self.name, info.as_ref().map(|i| &i.protocol_version));
        // The first listing is part of the start: a server that initialises and then
        // never lists its tools has failed to start, and is restarted with backoff.
        let Ok(listing) = tokio::time::timeout(self.how.init_timeout, list_all(&peer, info.as_deref(), &dropped)).await
        else {
            stop.cancel();
            let _ = tokio::time::timeout(Duration::from_secs(1), running.cancel()).await;
            if let Some(process) = process {
                process.stop().await;
            }
            return Err(format!(
                "initialised but did not list its tools within {} ms",
                self.how.init_timeout.as_millis()
            ));
        };
        let session = Arc::new(Session {
            id,
            server: self.name.clone(),
            peer,
            info,
            closed: CancellationToken::new(),
            listing: RwLock::new(Arc::new(listing)),
            follows: Follows::new(self.relay.clone()),
            dropped,
            restart: process.is_some().then(|| self.restart.clone()),
            probing: Arc::default(),
            relisting: std::sync::Mutex::default(),
        });
        if session.info.as_ref().is_some_and(|i| !i.protocol_version.has_initialize()) {
            super::listen::lists(&session);
        }
        let service_ended = CancellationToken::new();
        let ended = service_ended.clone();
        let closed = session.closed.clone();
        let service = tokio::spawn(async move {
            let _ = running.waiting().await;
            // The session is unusable from this moment, whatever the process does next.
            closed.cancel();
            ended.cancel();
        });
        Ok(Connection { process, service, service_ended, deaf, stop, session })
    }

    /// How the connection starts (`mcpServers.NAME.protocol`, and what the last start
    /// showed: [`Revisions`]).
    fn lifecycle(&self) -> ClientLifecycleMode {
        if self.config.protocol == Protocol::Auto && !self.how.revisions.initialises(&self.name) {
            ClientLifecycleMode::Auto {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
                legacy_version: Some(ProtocolVersion::LATEST_WITH_INITIALIZE),
            }
        } else {
            ClientLifecycleMode::Initialize
        }
    }

    /// Connects to the server (a new process for a stdio one, which says on `deaf` when it
    /// stops reading its input) and initialises session `id`.
    async fn connect(
        &self,
        id: u64,
        caps: &Offered,
        lifecycle: ClientLifecycleMode,
        dropped: &Arc<Dropped>,
        deaf: &Deaf,
    ) -> Result<(RunningService<RoleClient, UpstreamHandler>, Option<ServerProcess>, CancellationToken), ConnectError>
    {
        let handler = UpstreamHandler {
            server: self.name.clone(),
            session: id,
            relay: self.relay.clone(),
            offered: caps.clone(),
        };
        let stop = CancellationToken::new();
        match &self.config.launch {
            Launch::Stdio(launch) => {
                let told = (dropped.clone(), deaf.clone());
                let (process, running) = self.start_stdio(launch, handler, lifecycle, &stop, told).await?;
                Ok((running, Some(process), stop))
            }
            Launch::Http(http) => {
                Ok((self.start_http(http, handler, lifecycle, &stop, dropped.clone()).await?, None, stop))
            }
        }
    }

    fn in_order<T>(&self, inner: T, handler: &UpstreamHandler, tap: Option<Arc<Tap>>) -> InOrder<T> {
        InOrder { inner, server: self.name.clone(), session: handler.session, relay: self.relay.clone(), tap }
    }

    /// Spawns the server's process and initialises it over its stdin and stdout.
    async fn start_stdio(
        &self,
        launch: &StdioLaunch,
        handler: UpstreamHandler,
        lifecycle: ClientLifecycleMode,
        stop: &CancellationToken,
        // What its transport tells the session: what rmcp's types drop of the server's
        // answers, and when the server stops reading its input.
        (dropped, deaf): (Arc<Dropped>, Deaf),
    ) -> Result<(ServerProcess, RunningService<RoleClient, UpstreamHandler>), ConnectError> {
        let (mut process, pipes) =
            ServerProcess::spawn(&self.name, launch, &self.how.secrets, &self.how.withheld.now()).map_err(|e| {
                if let Some(cwd) = launch.cwd.as_ref().filter(|c| !c.is_dir()) {
                    return ConnectError::other(format!(
                        "cannot run `{}` in its `cwd` {}, which is not a folder it can enter: {e}",
                        launch.command,
                        cwd.display()
                    ));
                }
                let hint =
                    if e.kind() == std::io::ErrorKind::NotFound { " (is it installed and on PATH?)" } else { "" };
                ConnectError::other(format!("cannot run `{}`: {e}{hint}", launch.command))
            })?;
        let tasks = handler.offered.tasks.clone();
        let transport = super::lines::ServerLines::new(
            pipes.stdout,
            pipes.stdin,
            (MAX_MESSAGE_BYTES, MAX_MESSAGE_WEIGHT),
            dropped,
            tasks,
        )
        .telling(deaf);
        let transport = self.in_order(transport, &handler, None);
        let init = tokio::select! {
            r = tokio::time::timeout(self.how.init_timeout, serve_client_with_lifecycle_and_ct(handler, transport, lifecycle, stop.clone())) => r,
            status = process.wait() => {
                let status = status.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string());
                let message = format!("exited during start-up ({status}){}", process.final_stderr_tail().await);
                return Err(ConnectError { message, handshake: true });
            }
        };
        match init {
            Ok(Ok(running)) => Ok((process, running)),
            Ok(Err(e)) => {
                // Usually the server has exited: its last words say why.
                let tail = process.final_stderr_tail().await;
                stop.cancel();
                process.stop().await;
                Err(ConnectError::handshake(&e, format!("initialisation failed: {e}{tail}")))
            }
            Err(_) => {
                stop.cancel();
                process.stop().await;
                Err(ConnectError::other(format!("did not initialise within {} ms", self.how.init_timeout.as_millis())))
            }
        }
    }

    /// Connects to a streamable HTTP server and initialises a session. rmcp's transport
    /// re-initialises by itself when the server forgets the session (HTTP 404), replaying
    /// the requests that met the expired session once: the server never saw them. What
    /// its types drop of the answers is read too ([`super::http_client`]).
    async fn start_http(
        &self,
        http: &HttpLaunch,
        handler: UpstreamHandler,
        lifecycle: ClientLifecycleMode,
        stop: &CancellationToken,
        dropped: Arc<Dropped>,
    ) -> Result<RunningService<RoleClient, UpstreamHandler>, ConnectError> {
        let headers = http
            .headers
            .iter()
            .filter_map(|(k, v)| {
                Some((HeaderName::try_from(k.as_str()).ok()?, HeaderValue::try_from(v.as_str()).ok()?))
            })
            .collect();
        let config = StreamableHttpClientTransportConfig::with_uri(http.url.as_str())
            .custom_headers(headers)
            .reinit_on_expired_session(true)
            .max_sse_event_size(MAX_MESSAGE_BYTES);
        let tap = Tap::new(dropped, handler.offered.tasks.clone());
        let client = Tapped::new(tap.clone())
            .map_err(|e| ConnectError::other(format!("cannot make an HTTP client for {}: {e}", http.url)))?;
        let transport = StreamableHttpClientTransport::with_client(client, config);
        let transport = self.in_order(transport, &handler, Some(tap));
        match tokio::time::timeout(
            self.how.init_timeout,
            serve_client_with_lifecycle_and_ct(handler, transport, lifecycle, stop.clone()),
        )
        .await
        {
            Ok(Ok(running)) => Ok(running),
            Ok(Err(e)) => Err(ConnectError::handshake(&e, format!("cannot initialise a session at {}: {e}", http.url))),
            Err(_) => {
                stop.cancel();
                Err(ConnectError::other(format!(
                    "{} did not initialise within {} ms",
                    http.url,
                    self.how.init_timeout.as_millis()
                )))
            }
        }
    }
}

impl Connection {
    /// Closes the session and its process: rmcp closes the server's stdin, then the
    /// process gets its grace periods and signals.
    async fn stop(self) {
        self.session.closed.cancel();
        self.stop.cancel();
        let closed = tokio::time::timeout(Duration::from_secs(1), self.service).await.is_ok();
        match self.process {
            Some(process) if closed => process.stop().await,
            // rmcp could not close its stdin in that second (a write to it blocked): so
            // that the whole stop stays within about 3 s, no grace for a close not made.
            Some(process) => process.terminate().await,
            None => {}
        }
    }
}

/// Why a server's process ended, when it does; never, for an HTTP server.
async fn exited(process: &mut Option<ServerProcess>) -> String {
    match process {
        Some(process) => match process.wait().await {
            Ok(s) => format!("the server process exited ({s})"),
            Err(e) => format!("the server process could not be waited for: {e}"),
        },
        None => std::future::pending().await,
    }
}

/// Lists what `info`'s capabilities announce. A list that fails is logged and left empty:
/// one broken list must not hide the rest of the server.
async fn list_all(peer: &Peer<RoleClient>, info: Option<&ServerPeerInfo>, dropped: &Dropped) -> Listing {
    let caps = info.map(|i| &i.capabilities);
    let has = |f: fn(&rmcp::model::ServerCapabilities) -> bool| caps.is_some_and(f);
    let at = |cursor| Some(PaginatedRequestParams::default().with_cursor(cursor));
    let mut listing = Listing::default();
    if has(|c| c.tools.is_some()) {
        let tools = paged("tools", |c| async move { peer.list_tools(at(c)).await.map(|r| (r.tools, r.next_cursor)) });
        match dropped.listing(tools).await {
            Ok((tools, support)) => {
                (listing.tools, listing.task_support) = (once_each(tools, |t| t.name.to_string()), support)
            }
            Err(e) => tracing::warn!("tools/list failed: {e}"),
        }
    }
    if has(|c| c.prompts.is_some()) {
        match paged("prompts", |c| async move { peer.list_prompts(at(c)).await.map(|r| (r.prompts, r.next_cursor)) })
            .await
        {
            Ok(prompts) => listing.prompts = once_each(prompts, |p| p.name.clone()),
            Err(e) => tracing::warn!("prompts/list failed: {e}"),
        }
    }
    if has(|c| c.resources.is_some()) {
        let resources = |c| async move { peer.list_resources(at(c)).await.map(|r| (r.resources, r.next_cursor)) };
        match paged("resources", resources).await {
            Ok(resources) => listing.resources = resources,
            Err(e) => tracing::warn!("resources/list failed: {e}"),
        }
        let templates =
            |c| async move { peer.list_resource_templates(at(c)).await.map(|r| (r.resource_templates, r.next_cursor)) };
        match paged("resource templates", templates).await {
            Ok(templates) => listing.templates = templates,
            Err(e) => tracing::warn!("resources/templates/list failed: {e}"),
        }
    }
    listing
}

/// `items` with each name once, the first kept: a server listing a name twice offers one
/// thing by it.
fn once_each<T>(items: Vec<T>, name: impl Fn(&T) -> String) -> Vec<T> {
    let mut seen = std::collections::HashSet::new();
    let before = items.len();
    let kept: Vec<T> = items.into_iter().filter(|item| seen.insert(name(item))).collect();
    if kept.len() < before {
        tracing::warn!("the server lists {} names more than once; each is offered once", before - kept.len());
    }
    kept
}

/// The most of one kind (tools, prompts, resources, resource templates) kept from a
/// server's listing, and the most pages it is read in: past either, the rest is left
/// out, and said so. (A server listing page after page, or the same page for ever, would
/// fill the gateway's memory for as long as `init_timeout_ms` lets it.)
pub const MAX_LISTED: usize = 10_000;
const MAX_PAGES: usize = 100;

/// The most a listing kept may weigh ([`crate::weight`]): 10,000 tools with schemas of a
/// hundred values each fit; a server's pages of 60 MiB descriptions do not (each page is
/// bounded as it is read, but a listing keeps them all, and the catalogue copies it).
pub const MAX_LISTING_WEIGHT: usize = 256 << 20;

/// Every page of a listing, from `page(cursor)`, within [`MAX_LISTED`], [`MAX_PAGES`]
/// and [`MAX_LISTING_WEIGHT`].
async fn paged<T, F, Fut>(what: &str, mut page: F) -> Result<Vec<T>, rmcp::ServiceError>
where
    T: serde::Serialize,
    F: FnMut(Option<String>) -> Fut,
    Fut: Future<Output = Result<(Vec<T>, Option<String>), rmcp::ServiceError>>,
{
    let mut all = Vec::new();
    let mut cursor = None;
    let mut seen = std::collections::HashSet::new();
    let mut weight = 0usize;
    for _ in 0..MAX_PAGES {
        let (items, next) = page(cursor).await?;
        for item in items {
            weight = weight.saturating_add(crate::weight::of(&item));
            if weight > MAX_LISTING_WEIGHT {
                tracing::warn!(
                    "the server's {what} weigh more than {} MiB once read; the rest are left out",
                    MAX_LISTING_WEIGHT >> 20
                );
                return Ok(all);
            }
            all.push(item);
        }
        if all.len() > MAX_LISTED {
            all.truncate(MAX_LISTED);
            tracing::warn!("the server lists more than {MAX_LISTED} {what}; the rest are left out");
            return Ok(all);
        }
        cursor = match next {
            // A cursor given before leads to pages read already.
            Some(next) if !seen.insert(next.clone()) => {
                tracing::warn!("the server's {what} lead back to a page read already; the listing ends there");
                return Ok(all);
            }
            Some(next) => Some(next),
            None => return Ok(all),
        };
    }
    tracing::warn!("the server's {what} take more than {MAX_PAGES} pages; the rest are left out");
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A listing is read within bounds whatever the server answers: the same page for
    /// ever, or pages past the most kept.
    #[tokio::test]
    async fn a_listing_is_read_within_its_bounds() {
        let pages = std::sync::atomic::AtomicUsize::new(0);
        let again = |_| {
            pages.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            async { Ok((vec![1u8], Some("same".to_owned()))) }
        };
        assert_eq!(paged("tools", again).await.unwrap().len(), 2, "the same page is read again once, no more");
        assert_eq!(pages.into_inner(), 2);
        let next = std::sync::atomic::AtomicUsize::new(0);
        let endless = |_| {
            let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            async move { Ok((vec![1u8], Some(n.to_string()))) }
        };
        assert_eq!(paged("tools", endless).await.unwrap().len(), MAX_PAGES);
        let big = |_| {
            let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            async move { Ok((vec![0u8; 3_000], Some(n.to_string()))) }
        };
        assert_eq!(paged("tools", big).await.unwrap().len(), MAX_LISTED);
        let ends = |cursor: Option<String>| async move {
            Ok(match cursor {
                None => (vec![1u8, 2], Some("2".to_owned())),
                Some(_) => (vec![3u8], None),
            })
        };
        assert_eq!(paged("tools", ends).await.unwrap(), [1, 2, 3]);
        // Pages of heavy items (a million values, about 130 MiB once read, each): kept up
        // to the weight, not the count.
        let next = std::sync::atomic::AtomicUsize::new(0);
        let heavy = |_| {
            let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            async move { Ok((vec![vec![0u8; 1 << 20]], Some(n.to_string()))) }
        };
        let kept = paged("tools", heavy).await.unwrap();
        assert_eq!(kept.len(), 1, "the listing ends at its weight");
        assert_eq!(next.into_inner(), 2, "and no page is asked for past it");
        assert_eq!(once_each(vec![1, 2, 1, 3, 2], u8::to_string), [1, 2, 3]);
    }

    #[test]
    fn a_server_is_asked_until_it_shows_it_initialises_and_again_after_a_failed_start() {
        let (old, new) = (&ProtocolVersion::V_2025_11_25, &ProtocolVersion::V_2026_07_28);
        let name: Arc<str> = "s".into();
        let known = Revisions::default();
        let after = |revision| {
            known.learn(&name, revision);
            known.initialises(&name)
        };
        assert!(!known.initialises(&name), "nothing known: ask");
        assert!(!after(Some(new)), "speaks 2026-07-28: keep asking");
        assert!(after(Some(old)), "initialised: no question next time");
        assert!(after(Some(old)));
        assert!(!after(None), "a failed start (it may have been upgraded): ask again");
        assert!(after(Some(old)));
        // One for the gateway: every instance of the server sees what one learned.
        assert!(known.clone().initialises(&name));
        // Launched anew by a reload: asked again.
        known.forget(&name);
        assert!(!known.initialises(&name));
    }

    #[test]
    fn a_server_that_stays_down_is_reported_ever_less_often_and_at_least_hourly() {
        let reported = |retry: Duration, tries: u32| {
            let mut down = Downtime::default();
            (1..=tries).filter(|_| down.tried(retry)).collect::<Vec<_>>()
        };
        let minute = Duration::from_secs(60);
        // The gap doubles up to an hour's worth of tries, then stays there.
        assert_eq!(reported(minute, 300), [1, 2, 4, 8, 16, 32, 64, 124, 184, 244]);
        // Tried once an hour or less often, every try is reported.
        assert_eq!(reported(STILL_DOWN_EVERY, 5), [1, 2, 3, 4, 5]);
        assert_eq!(reported(Duration::from_secs(7200), 3), [1, 2, 3]);
        // A second between tries: a day of them writes few entries.
        assert!(reported(Duration::from_secs(1), 86_400).len() < 40);
        let mut down = Downtime { tries: u32::MAX - 1, reported: 1 };
        assert!(down.tried(minute) && down.tried(minute), "past an hour since the last report");
        assert_eq!(down.tries, u32::MAX, "counts saturate");
    }

    /// A server's endings, on an injected clock: restarts after a growing backoff (at once
    /// when asked for) until `crash_loop_limit` endings fall within a crash window; then
    /// marked down, tried once per `down_retry_ms`, and marked down again by its next
    /// ending, until it stays up for a whole window.
    #[test]
    fn endings_back_off_then_mark_the_server_down_until_it_stays_up_a_window() {
        let policy = RestartPolicy {
            initial_delay_ms: 100,
            max_delay_ms: 1000,
            crash_loop_limit: 3,
            crash_window_ms: 10_000,
            down_retry_ms: 60_000,
        };
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let restart = |ms| (Next::Restart(Duration::from_millis(ms)), true);
        let down = |endings, tries| (Next::Down { endings, tries, retry_in: Duration::from_secs(60) }, true);
        let mut failures = Failures::default();
        assert_eq!(failures.ended(at(0), &policy, false), restart(100));
        assert_eq!(failures.ended(at(1), &policy, true), (Next::Restart(Duration::ZERO), false), "asked for");
        assert_eq!(failures.ended(at(2), &policy, false), down(3, 0), "three within the window");
        // Tried again after a minute: ending once more, it is down again at once.
        failures.served(Duration::from_secs(1), &policy);
        assert_eq!(failures.ended(at(63), &policy, false), down(1, 1));
        failures.served(Duration::from_secs(1), &policy);
        assert_eq!(failures.ended(at(124), &policy, false), down(1, 2));
        failures.served(Duration::from_secs(1), &policy);
        assert_eq!(
            failures.ended(at(185), &policy, false).0,
            Next::Down { endings: 1, tries: 3, retry_in: Duration::from_secs(60) }
        );
        // Up for a whole window: no longer down, the backoff starts over.
        failures.served(Duration::from_secs(10), &policy);
        assert_eq!(failures.ended(at(300), &policy, false), restart(100));
        assert_eq!(failures.ended(at(301), &policy, false), restart(200));
        // Endings spread wider than the window never make a loop, and the backoff caps.
        let mut spread = Failures::default();
        let delays: Vec<Next> = (0..6).map(|i| spread.ended(at(20 * i), &policy, false).0).collect();
        assert!(delays.iter().all(|n| matches!(n, Next::Restart(_))), "{delays:?}");
        assert_eq!(delays[5], Next::Restart(Duration::from_millis(1000)));
    }

    #[test]
    fn restart_delay_doubles_to_the_cap_and_never_overflows() {
        let p = RestartPolicy { initial_delay_ms: 250, max_delay_ms: 30_000, ..RestartPolicy::default() };
        let ms: Vec<u128> = (0..9).map(|a| restart_delay(&p, a).as_millis()).collect();
        assert_eq!(ms, [250, 500, 1000, 2000, 4000, 8000, 16_000, 30_000, 30_000]);
        assert_eq!(restart_delay(&p, u32::MAX).as_millis(), 30_000);
    }
}
