//! The gateway's clients (downstream sessions) and what each asked to hear: its log
//! level and its resource subscriptions. Notifications reach only the sessions they
//! concern:
//! - catalogue changes (`list_changed`): every session;
//! - a resource update: the sessions subscribed to that resource;
//! - a log message of a shared server: the sessions that set a level (`logging/setLevel`)
//!   at or below the message's; over stdio, the one client whether it set one or not;
//! - anything a `session`-scoped server says: its own session only.
//!
//! A client on 2026-07-28 has no session to send to: it hears list changes and resource
//! updates on each `subscriptions/listen` request it keeps open, as that request's
//! filter allows, and nothing else (see [`Reach`]).

// Logging is deprecated by 2026-07-28 (SEP-2577) but live in every revision we speak.
#![allow(deprecated)]

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use rmcp::model::{
    LoggingLevel, LoggingMessageNotificationParam, ResourceUpdatedNotificationParam, ServerNotification,
};
use rmcp::service::SubscriptionSink;
use rmcp::{Peer, RoleServer};
use tokio_util::sync::CancellationToken;

use super::routing::ClientPeer;
use super::tally::Tally;
use crate::lasting::Locked;
use crate::transport::listen::{Follower, MAX_FOLLOWED};

/// How clients reach this gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Front {
    /// One client, on stdin and stdout.
    Stdio,
    /// Any number of clients over streamable HTTP.
    Http,
}

impl Front {
    /// How many clients its shared servers answer, which bounds what their adapters keep.
    pub fn clients(self) -> crate::plugins::Clients {
        match self {
            Front::Stdio => crate::plugins::Clients::One,
            Front::Http => crate::plugins::Clients::Many,
        }
    }
}

/// How a client hears what it did not ask in a request.
#[derive(Clone)]
pub enum Reach {
    /// A session (every revision before 2026-07-28): notifications go to its peer.
    Session(Peer<RoleServer>),
    /// One `subscriptions/listen` request of a 2026-07-28 client, open until `open` is
    /// cancelled: list changes and resource updates, as its accepted filter allows.
    Listen { sink: SubscriptionSink, open: CancellationToken },
}

impl Reach {
    fn is_closed(&self) -> bool {
        match self {
            Reach::Session(peer) => peer.is_transport_closed(),
            Reach::Listen { open, .. } => open.is_cancelled(),
        }
    }

    fn session(&self) -> Option<&Peer<RoleServer>> {
        match self {
            Reach::Session(peer) => Some(peer),
            Reach::Listen { .. } => None,
        }
    }
}

/// How one live client session (or listen request) is reached, and whose share of the
/// notifications on their way it counts against (its session, or a 2026-07-28 client's
/// address: each of its requests stands alone).
struct To {
    reach: Reach,
    counted: Arc<str>,
}

impl To {
    /// Sends `notification` on a task of its own (see [`Sending`]).
    fn send(&self, sending: &Arc<Sending>, notification: ServerNotification) {
        match self.reach.clone() {
            Reach::Session(peer) => sending.send(&ClientPeer { client: self.counted.clone(), peer }, notification),
            // A listen request's share is its address's: it counts as both.
            Reach::Listen { sink, .. } => {
                let to = Share::new(self.counted.clone(), Some(self.counted.clone()));
                sending.spawn(to, encoded_len(&notification), async move {
                    if let Err(e) = sink.send(notification).await {
                        tracing::debug!("a notification was not delivered on a listen request: {e}");
                    }
                })
            }
        }
    }
}

/// The most notifications on their way to one client at once, and their bytes; to all
/// the sessions of one address (an IPv6 one by its /64), and of one IPv6 site (a /48:
/// twice an address's); to all clients together; and how long each may wait for its
/// client. A client that never reads cannot make the gateway
/// hold what servers keep saying, nor keep another client from hearing unless clients of
/// four addresses do at once: past any of these counts or bytes, a new notification is
/// dropped and counted; past its time, one waiting is given up.
pub const MAX_SENDING_TO_ONE: usize = 512;
pub const MAX_SENDING_BYTES_TO_ONE: usize = 8 << 20;
pub const MAX_SENDING_TO_ADDRESS: usize = 1024;
pub const MAX_SENDING_BYTES_TO_ADDRESS: usize = 16 << 20;
pub const MAX_SENDING_TO_NETWORK: usize = 2 * MAX_SENDING_TO_ADDRESS;
pub const MAX_SENDING_BYTES_TO_NETWORK: usize = 2 * MAX_SENDING_BYTES_TO_ADDRESS;
pub const MAX_SENDING: usize = 4096;
pub const MAX_SENDING_BYTES: usize = 64 << 20;
pub const SEND_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);

/// Notifications on their way to clients, each on a task of its own so that a client
/// that does not read never holds up the server that spoke; bounded by
/// [`MAX_SENDING_TO_ONE`], [`MAX_SENDING_TO_ADDRESS`], [`MAX_SENDING`], their bytes and
/// [`SEND_WITHIN`].
#[derive(Debug, Default)]
pub struct Sending {
    /// On their way: how many, and their bytes, in all, to each client and each address.
    load: Mutex<Load>,
    /// Each HTTP session's address, known from its `initialize` to its end.
    addresses: Mutex<HashMap<Arc<str>, Share>>,
    dropped: std::sync::atomic::AtomicU64,
}

/// How many notifications are on their way, and their bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Count {
    n: usize,
    bytes: usize,
}

impl Count {
    /// One notification of `bytes`.
    fn one(bytes: usize) -> Self {
        Self { n: 1, bytes }
    }

    /// Whether one more of `bytes` would be past `max` notifications or `max_bytes`.
    fn full(self, max: usize, max_bytes: usize, bytes: usize) -> bool {
        self.n >= max || self.bytes.saturating_add(bytes) > max_bytes
    }
}

impl std::ops::AddAssign for Count {
    fn add_assign(&mut self, other: Self) {
        (self.n, self.bytes) = (self.n + other.n, self.bytes + other.bytes);
    }
}

impl std::ops::SubAssign for Count {
    fn sub_assign(&mut self, other: Self) {
        (self.n, self.bytes) = (self.n - other.n, self.bytes - other.bytes);
    }
}

#[derive(Debug, Default)]
struct Load {
    all: Count,
    by_client: Tally<Arc<str>, Count>,
    by_address: Tally<Arc<str>, Count>,
}

/// Whose shares a notification counts against: its client's, and its address's (and
/// its IPv6 site's) if it came over HTTP.
#[derive(Debug, Clone)]
struct Share {
    client: Arc<str>,
    address: Option<Arc<str>>,
    network: Option<Arc<str>>,
}

impl Share {
    fn new(client: Arc<str>, address: Option<Arc<str>>) -> Self {
        let network = address.as_deref().and_then(super::http::network_of).map(Arc::from);
        Self { client, address, network }
    }

    /// The shares past the client's own, each with its bounds.
    fn wider(&self) -> impl Iterator<Item = (&Arc<str>, usize, usize)> {
        let address = self.address.iter().map(|a| (a, MAX_SENDING_TO_ADDRESS, MAX_SENDING_BYTES_TO_ADDRESS));
        address.chain(self.network.iter().map(|n| (n, MAX_SENDING_TO_NETWORK, MAX_SENDING_BYTES_TO_NETWORK)))
    }
}

impl Load {
    /// Counts a notification of `bytes` to `to`, unless that is past a bound.
    fn take(&mut self, to: &Share, bytes: usize) -> bool {
        if self.all.full(MAX_SENDING, MAX_SENDING_BYTES, bytes)
            || self.by_client.of(&to.client).full(MAX_SENDING_TO_ONE, MAX_SENDING_BYTES_TO_ONE, bytes)
            || to.wider().any(|(key, max, max_bytes)| self.by_address.of(key).full(max, max_bytes, bytes))
        {
            return false;
        }
        self.all += Count::one(bytes);
        self.by_client.add(to.client.clone(), Count::one(bytes));
        for (key, ..) in to.wider() {
            self.by_address.add(key.clone(), Count::one(bytes));
        }
        true
    }

    /// A notification counted by [`Load::take`] was delivered or given up.
    fn give_back(&mut self, to: &Share, bytes: usize) {
        self.all -= Count::one(bytes);
        self.by_client.take_back(&to.client, Count::one(bytes));
        for (key, ..) in to.wider() {
            self.by_address.take_back(key, Count::one(bytes));
        }
    }
}

impl Sending {
    /// Sends `notification` to `to`.
    pub fn send(self: &Arc<Self>, to: &ClientPeer, notification: ServerNotification) {
        let peer = to.peer.clone();
        let placed = self.addresses.locked().get(&to.client).cloned();
        let to = placed.unwrap_or_else(|| Share::new(to.client.clone(), None));
        self.spawn(to, encoded_len(&notification), async move {
            if let Err(e) = peer.send_notification(notification).await {
                tracing::debug!("a downstream notification was not delivered: {e}");
            }
        });
    }

    /// The HTTP session `client` came from `address` (see [`super::http::address_client`]).
    fn place(&self, client: Arc<str>, address: Arc<str>) {
        // Its site read from its address once, not for each notification.
        let share = Share::new(client.clone(), Some(address));
        self.addresses.locked().insert(client, share);
    }

    /// The session `client` ended.
    fn forget(&self, client: &str) {
        self.addresses.locked().remove(client);
    }

    /// Runs `delivery` of a notification `bytes` long to `to` on a task of its own,
    /// within the bounds.
    fn spawn(self: &Arc<Self>, to: Share, bytes: usize, delivery: impl Future<Output = ()> + Send + 'static) {
        let Some(held) = self.take(to, bytes) else { return };
        tokio::spawn(async move {
            if tokio::time::timeout(SEND_WITHIN, delivery).await.is_err() {
                tracing::debug!("a notification waited {} s for its client; given up", SEND_WITHIN.as_secs());
            }
            drop(held);
        });
    }

    /// Room for a notification `bytes` long on its way to `client` (a session's name, as
    /// [`ClientPeer::client`]), counted against its shares until the [`Holding`] is
    /// dropped; none, and the notification counted as dropped, past a bound. For what
    /// goes out in an order of its own (a call's progress), not through [`Self::send`].
    pub fn hold(self: &Arc<Self>, client: &Arc<str>, bytes: usize) -> Option<Holding> {
        let placed = self.addresses.locked().get(client).cloned();
        self.take(placed.unwrap_or_else(|| Share::new(client.clone(), None)), bytes)
    }

    fn take(self: &Arc<Self>, to: Share, bytes: usize) -> Option<Holding> {
        if self.load.locked().take(&to, bytes) {
            return Some(Holding { sending: self.clone(), to, bytes });
        }
        let dropped = self.dropped.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if dropped.is_power_of_two() || dropped == 0 {
            tracing::warn!(
                "{} notifications dropped: clients read slower than servers speak ({MAX_SENDING} or {MAX_SENDING_BYTES} bytes on their way at most)",
                dropped + 1
            );
        }
        None
    }

    /// Notifications on their way now, in all.
    #[cfg(test)]
    pub(super) fn load(&self) -> (usize, usize) {
        let all = self.load.locked().all;
        (all.n, all.bytes)
    }
}

/// A notification's room among those on their way ([`Sending::hold`]), given back when
/// dropped: once it was delivered or given up.
pub struct Holding {
    sending: Arc<Sending>,
    to: Share,
    bytes: usize,
}

impl Drop for Holding {
    fn drop(&mut self) {
        self.sending.load.locked().give_back(&self.to, self.bytes);
    }
}

/// How long `notification` is as JSON.
pub fn encoded_len(notification: &impl serde::Serialize) -> usize {
    struct Counted(usize);
    impl std::io::Write for Counted {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counted = Counted(0);
    let _ = serde_json::to_writer(&mut counted, notification);
    counted.0
}

/// One client session, or one listen request of a 2026-07-28 client.
struct Downstream {
    /// The entry's name: the session's, or one of its listen requests'.
    client: Arc<str>,
    /// The client session it belongs to (its own name for a session).
    owner: Arc<str>,
    /// Whose share of the notifications on their way it counts against: its session's,
    /// or a 2026-07-28 client's address.
    counted: Arc<str>,
    /// Whose share of a server's followed resources its subscriptions count against
    /// (`transport::listen::Follower`), as when they were made: over HTTP its address's
    /// (an IPv6 one's site, `http::site_of`), over stdio its session's.
    follows_as: Arc<str>,
    reach: Reach,
    /// The level it set last, and the most verbose it has set (see [`Downstreams::level`]).
    level: Option<LoggingLevel>,
    loudest: Option<LoggingLevel>,
    subscriptions: HashSet<Subscription>,
}

/// A resource a session subscribed to: on which server instance, by the URI the server
/// knows, and by the URI the session knows (they differ for `rebound://via/` URIs).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Subscription {
    pub instance: u64,
    pub uri: String,
    pub exposed: String,
}

/// Every client session that finished initialising.
pub struct Downstreams {
    front: Front,
    list: Mutex<Vec<Downstream>>,
    /// The level every shared server took when last asked (none: not known to have).
    shared_level: Mutex<Option<LoggingLevel>>,
    /// By server: the shared instance, gone, whose subscriptions wait for their holders'
    /// own instances of it (see [`Self::park`]).
    parked: Mutex<HashMap<Arc<str>, u64>>,
    /// Notifications on their way to any of them.
    pub sending: Arc<Sending>,
}

/// Who holds `d`'s subscriptions, as they are made again on another instance (after a
/// restart, a relaunch, a move): as they were, each within its client's share when made,
/// and a restart takes none of them away.
fn follower(d: &Downstream) -> Follower {
    Follower { holder: d.client.clone(), client: d.follows_as.clone(), share: MAX_FOLLOWED }
}

/// Severity order, most verbose first (rmcp's type has no order).
pub fn rank(level: LoggingLevel) -> u8 {
    match level {
        LoggingLevel::Debug => 0,
        LoggingLevel::Info => 1,
        LoggingLevel::Notice => 2,
        LoggingLevel::Warning => 3,
        LoggingLevel::Error => 4,
        LoggingLevel::Critical => 5,
        LoggingLevel::Alert => 6,
        LoggingLevel::Emergency => 7,
    }
}

impl Downstreams {
    /// The sessions of `front`, whose notifications go out through `sending` (the one a
    /// call's progress counts against too, `Routing::sending`).
    pub fn new(front: Front, sending: Arc<Sending>) -> Self {
        let shared_level = Mutex::default();
        Self { front, list: Mutex::default(), shared_level, parked: Mutex::default(), sending }
    }

    pub fn front(&self) -> Front {
        self.front
    }

    /// `client` finished initialising: it hears notifications from now on. Over HTTP,
    /// `address` is whose share (with its other sessions) they count against too.
    pub fn add(&self, client: Arc<str>, peer: Peer<RoleServer>, address: Option<Arc<str>>) {
        let follows_as = address.as_ref().map_or_else(|| client.clone(), super::http::site_of);
        if let Some(address) = address {
            self.sending.place(client.clone(), address);
        }
        let entry = (client.clone(), client.clone(), client);
        self.add_entry(entry, follows_as, Reach::Session(peer));
    }

    /// `owner` (a 2026-07-28 client) opened the listen request `listen`, reached by `reach`.
    /// Its notifications count against `counted`'s share (its address), its subscriptions
    /// against its site's.
    pub fn add_listen(&self, listen: Arc<str>, owner: Arc<str>, counted: Arc<str>, reach: Reach) {
        let follows_as = super::http::site_of(&counted);
        self.add_entry((listen, owner, counted), follows_as, reach);
    }

    fn add_entry(&self, (client, owner, counted): (Arc<str>, Arc<str>, Arc<str>), follows_as: Arc<str>, reach: Reach) {
        // Closed entries stay until `remove`, which ends the subscriptions they held.
        let mut list = self.list.locked();
        list.retain(|d| d.client != client);
        let subscriptions = HashSet::new();
        list.push(Downstream { client, owner, counted, follows_as, reach, level: None, loudest: None, subscriptions });
    }

    /// Sends `notification` to the client session `owner` however it is reached.
    pub fn tell(&self, owner: &str, notification: ServerNotification) {
        for (reach, ()) in self.live(|d| if &*d.owner == owner { vec![()] } else { vec![] }) {
            reach.send(&self.sending, notification.clone());
        }
    }

    /// How each live client is reached.
    fn reaches(&self) -> Vec<To> {
        let list = self.list.locked();
        list.iter()
            .filter(|d| !d.reach.is_closed())
            .map(|d| To { reach: d.reach.clone(), counted: d.counted.clone() })
            .collect()
    }

    /// The only client, over stdio, if it has a session (a 2026-07-28 client has none).
    pub fn only_stdio_client(&self) -> Option<ClientPeer> {
        if self.front != Front::Stdio {
            return None;
        }
        let list = self.list.locked();
        let mut sessions = list.iter().filter(|d| !d.reach.is_closed()).filter_map(|d| Some((d, d.reach.session()?)));
        match (sessions.next(), sessions.next()) {
            (Some((only, peer)), None) => Some(ClientPeer { client: only.client.clone(), peer: peer.clone() }),
            _ => None,
        }
    }

    /// Sends `notification` to every client, without waiting on any of them.
    pub fn broadcast(&self, notification: ServerNotification) {
        for reach in self.reaches() {
            reach.send(&self.sending, notification.clone());
        }
    }

    /// A log message of a shared server over stdio, to the one client (at the level it
    /// set, if it set one). Over HTTP a shared server's lines may tell of any client's
    /// calls: never sent to every client, `relay.rs` picks the one they concern.
    pub fn log(&self, log: LoggingMessageNotificationParam) {
        if self.front != Front::Stdio {
            return;
        }
        // Logging on 2026-07-28 is asked per request; a listen request never carries it.
        let wants =
            |d: &Downstream| d.reach.session().is_some() && d.level.is_none_or(|level| rank(log.level) >= rank(level));
        for (reach, ()) in self.live(|d| if wants(d) { vec![()] } else { vec![] }) {
            reach.send(
                &self.sending,
                ServerNotification::LoggingMessageNotification(rmcp::model::Notification::new(log.clone())),
            );
        }
    }

    /// Each live client's reach with each of what `pick` takes from it.
    fn live<T>(&self, pick: impl Fn(&Downstream) -> Vec<T>) -> Vec<(To, T)> {
        let list = self.list.locked();
        list.iter()
            .filter(|d| !d.reach.is_closed())
            .flat_map(|d| pick(d).into_iter().map(|t| (To { reach: d.reach.clone(), counted: d.counted.clone() }, t)))
            .collect()
    }

    /// Whether `client` wants a log message at `level` (of its own session-scoped server).
    pub fn wants_log(&self, client: &str, level: LoggingLevel) -> bool {
        let list = self.list.locked();
        // A 2026-07-28 client (no session entry) asks for logs per request, never here.
        list.iter()
            .find(|d| &*d.client == client && d.reach.session().is_some())
            .is_some_and(|d| d.level.is_none_or(|l| rank(level) >= rank(l)))
    }

    /// Server instance `instance` says its resource `uri` changed: to the sessions
    /// subscribed to it, each by the URI it subscribed with.
    pub fn resource_updated(&self, instance: u64, update: ResourceUpdatedNotificationParam) {
        let to = self.live(|d| {
            let theirs = d.subscriptions.iter().filter(|s| s.instance == instance && s.uri == update.uri);
            theirs.map(|s| s.exposed.clone()).collect()
        });
        for (reach, exposed) in to {
            let mut update = update.clone();
            update.uri = exposed;
            reach.send(
                &self.sending,
                ServerNotification::ResourceUpdatedNotification(rmcp::model::Notification::new(update)),
            );
        }
    }

    /// `client` set its log level.
    pub fn set_level(&self, client: &str, level: LoggingLevel) {
        let mut list = self.list.locked();
        if let Some(d) = list.iter_mut().find(|d| &*d.client == client) {
            d.level = Some(level);
            d.loudest = d.loudest.into_iter().chain([level]).min_by_key(|l| rank(*l));
        }
    }

    /// The level every shared server took when last asked, if they all did.
    pub fn shared_level(&self) -> Option<LoggingLevel> {
        *self.shared_level.locked()
    }

    /// Every shared server took `level` (none: not all of them took the last asked, or
    /// one started since, and was asked on its own).
    pub fn took_shared_level(&self, level: Option<LoggingLevel>) {
        *self.shared_level.locked() = level;
    }

    /// Whether `client` set a level (`logging/setLevel`) that lets a line at `level` through.
    pub fn asked_for(&self, client: &str, level: LoggingLevel) -> bool {
        self.level(Some(client)).is_some_and(|asked| rank(level) >= rank(asked))
    }

    /// The most verbose level any live session (or only `only`) asked for: the level a
    /// shared server is set to (`only` none), or a session's own instance.
    ///
    /// Over HTTP, a shared server's is the most verbose any live session has asked for
    /// since it opened: a session that lowers its level again lowers no shared server (it
    /// hears only what its level lets through, [`Self::asked_for`]). So a client that sets
    /// levels again and again, or alternates two, changes a shared server's level at most
    /// once each way, and does not keep the gateway's own request out on every shared
    /// server, during which their log lines and requests reach no client.
    pub fn level(&self, only: Option<&str>) -> Option<LoggingLevel> {
        let sticky = only.is_none() && self.front == Front::Http;
        let list = self.list.locked();
        list.iter()
            .filter(|d| !d.reach.is_closed() && only.is_none_or(|c| c == &*d.client))
            .filter_map(|d| if sticky { d.loudest } else { d.level })
            .min_by_key(|l| rank(*l))
    }

    /// Records `client`'s (un)subscription; returns whether `client` is still here (a
    /// subscription made for a client gone meanwhile is to be ended upstream). An
    /// unsubscription ends the client's subscription to the resource it knows as
    /// `subscription.exposed` on whichever instance holds it now: a reload may have moved
    /// it to a relaunched server's new one.
    pub fn subscribe(&self, client: &str, subscription: Subscription, on: bool) -> bool {
        let mut list = self.list.locked();
        let Some(d) = list.iter_mut().find(|d| &*d.client == client) else { return false };
        if on {
            d.subscriptions.insert(subscription);
        } else {
            d.subscriptions.retain(|s| s.exposed != subscription.exposed || s.uri != subscription.uri);
        }
        true
    }

    /// Whether `client` is subscribed to `uri` of server instance `instance`: checked after
    /// a subscription is made upstream for it, which an unsubscribe (or its end) may
    /// have overtaken.
    pub fn holds(&self, client: &str, instance: u64, uri: &str) -> bool {
        let list = self.list.locked();
        list.iter()
            .filter(|d| &*d.client == client && !d.reach.is_closed())
            .any(|d| d.subscriptions.iter().any(|s| s.instance == instance && s.uri == uri))
    }

    /// Tells `client` that the resource `uri` of server instance `instance` may have
    /// changed, when it still follows it: it was followed upstream after the client was
    /// told it is, or again after the server restarted, and an update in between went
    /// unheard.
    pub fn announce(&self, client: &str, instance: u64, uri: &str) {
        let to = self.live(|d| {
            let theirs =
                d.subscriptions.iter().filter(|s| &*d.client == client && s.instance == instance && s.uri == uri);
            theirs.map(|s| s.exposed.clone()).collect()
        });
        for (reach, exposed) in to {
            let update = ResourceUpdatedNotificationParam::new(exposed);
            reach.send(
                &self.sending,
                ServerNotification::ResourceUpdatedNotification(rmcp::model::Notification::new(update)),
            );
        }
    }

    /// Who is subscribed to which URI of server instance `instance`, among the live
    /// sessions and listen requests (re-applied after it restarts).
    pub fn subscriptions(&self, instance: u64) -> Vec<(Follower, String)> {
        let list = self.list.locked();
        list.iter()
            .filter(|d| !d.reach.is_closed())
            .flat_map(|d| {
                let uris = d.subscriptions.iter().filter(|s| s.instance == instance);
                let who = follower(d);
                uris.map(move |s| (who.clone(), s.uri.clone()))
            })
            .collect()
    }

    /// A server was relaunched as instance `new` (`Some`), or removed (`None`): its
    /// subscriptions follow it, or end (unless they are parked: [`Self::park`]). Returns
    /// those moved, to be followed on `new`.
    pub fn reinstance(&self, old: u64, new: Option<u64>) -> Vec<(Follower, String)> {
        if new.is_none() && self.parked.locked().values().any(|p| *p == old) {
            return Vec::new();
        }
        self.move_where(old, new, |_| true)
    }

    /// The subscriptions to instance `old` of the entries `whose` move to `new` (returned),
    /// or end.
    fn move_where(&self, old: u64, new: Option<u64>, whose: impl Fn(&Downstream) -> bool) -> Vec<(Follower, String)> {
        let mut list = self.list.locked();
        let mut moved = Vec::new();
        for d in list.iter_mut().filter(|d| whose(d)) {
            let these: Vec<Subscription> = d.subscriptions.iter().filter(|s| s.instance == old).cloned().collect();
            for mut s in these {
                d.subscriptions.remove(&s);
                if let Some(new) = new {
                    moved.push((follower(d), s.uri.clone()));
                    s.instance = new;
                    d.subscriptions.insert(s);
                }
            }
        }
        moved
    }

    /// A reload made `server` `session`-scoped: the subscriptions to its shared instance
    /// `old`, which stops, wait for their holders' own instances of it, each made when
    /// its session next asks for anything ([`Self::claim`]), rather than end with `old`.
    /// Those of a 2026-07-28 client's listen requests over HTTP end: such a client
    /// reaches shared servers only. Those parked earlier for `server` join them.
    pub fn park(&self, server: Arc<str>, old: u64) {
        let before = self.parked.locked().insert(server, old);
        if let Some(before) = before {
            self.move_where(before, Some(old), |_| true);
        }
        if self.front == Front::Http {
            self.move_where(old, None, |d| matches!(d.reach, Reach::Listen { .. }));
        }
    }

    /// `client`'s subscriptions parked for `server` (its session's and its listen
    /// requests') move to its own instance `new` (returned, to be followed there).
    pub fn claim(&self, client: &str, server: &str, new: u64) -> Vec<(Follower, String)> {
        let Some(old) = self.parked.locked().get(server).copied() else { return Vec::new() };
        self.move_where(old, Some(new), |d| &*d.client == client || &*d.owner == client)
    }

    /// The servers whose subscriptions are parked.
    pub fn parked(&self) -> Vec<Arc<str>> {
        self.parked.locked().keys().cloned().collect()
    }

    /// `server`'s subscriptions wait no longer: they move to the shared instance `new`
    /// (returned, to be followed there: a reload made it shared again), or end (`None`:
    /// it was removed).
    pub fn unpark(&self, server: &str, new: Option<u64>) -> Vec<(Follower, String)> {
        let Some(old) = self.parked.locked().remove(server) else { return Vec::new() };
        self.move_where(old, new, |_| true)
    }

    /// `client`'s session (with its listen requests), or one listen request, ended: it
    /// is forgotten, and the subscriptions of every entry gone are returned (instance,
    /// URI, the entry's name), each to be given up upstream.
    pub fn remove(&self, client: &str) -> Vec<(u64, String, Arc<str>)> {
        let mut list = self.list.locked();
        // Closed entries go too: a session or listen request whose end was not seen.
        let (gone, kept): (Vec<_>, Vec<_>) =
            list.drain(..).partition(|d| &*d.client == client || &*d.owner == client || d.reach.is_closed());
        *list = kept;
        for session in gone.iter().filter(|d| d.reach.session().is_some()) {
            self.sending.forget(&session.client);
        }
        gone.into_iter()
            .flat_map(|d| {
                let holder = d.client;
                d.subscriptions.into_iter().map(move |s| (s.instance, s.uri, holder.clone()))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Notifications a client does not read are held within the bounds: past its own
    /// count or bytes, new ones to it are dropped, and others still go; past its address's
    /// (its other sessions together), new ones to any of them; past all clients' together,
    /// any new one; each is given up after its time.
    #[tokio::test(start_paused = true)]
    async fn notifications_a_client_does_not_read_are_bounded() {
        let sending = Arc::new(Sending::default());
        let to = |client: &str, address: Option<&str>| Share::new(client.into(), address.map(Into::into));
        for _ in 0..MAX_SENDING_TO_ONE + 5 {
            sending.spawn(to("slow", None), 10, std::future::pending());
        }
        assert_eq!(sending.load(), (MAX_SENDING_TO_ONE, MAX_SENDING_TO_ONE * 10));
        assert_eq!(sending.dropped.load(std::sync::atomic::Ordering::Relaxed), 5);
        sending.spawn(to("other", None), 10, std::future::pending());
        assert_eq!(sending.load().0, MAX_SENDING_TO_ONE + 1, "another client is still sent to");

        // Sessions of one address that never read: their address's share, not everyone's.
        for session in 0..8 {
            for _ in 0..MAX_SENDING_TO_ONE {
                sending.spawn(to(&format!("greedy {session}"), Some("address 10.0.0.9")), 10, std::future::pending());
            }
        }
        assert_eq!(sending.load().0, MAX_SENDING_TO_ONE + 1 + MAX_SENDING_TO_ADDRESS, "one address's share");
        sending.spawn(to("polite", Some("address 10.0.0.10")), 10, std::future::pending());
        assert_eq!(sending.load().0, MAX_SENDING_TO_ONE + 2 + MAX_SENDING_TO_ADDRESS, "another address still heard");
        // The /64s of one IPv6 site that never read: its share, twice an address's.
        for block in 0..4 {
            for session in 0..2 {
                let client = format!("site {block} {session}");
                let address = format!("address 2001:db8:1:{block}::/64");
                for _ in 0..MAX_SENDING_TO_ONE {
                    sending.spawn(to(&client, Some(&address)), 10, std::future::pending());
                }
            }
        }
        let before = MAX_SENDING_TO_ONE + 2 + MAX_SENDING_TO_ADDRESS;
        assert_eq!(sending.load().0, before + MAX_SENDING_TO_NETWORK, "one site's share");
        sending.spawn(to("next door", Some("address 2001:db8:2:1::/64")), 10, std::future::pending());
        assert_eq!(sending.load().0, before + MAX_SENDING_TO_NETWORK + 1, "another site still heard");

        for i in 0..MAX_SENDING {
            sending.spawn(to(&format!("client {i}"), None), 10, std::future::pending());
        }
        assert_eq!(sending.load().0, MAX_SENDING, "all together");
        tokio::time::sleep(SEND_WITHIN + std::time::Duration::from_millis(1)).await;
        assert_eq!(sending.load(), (0, 0), "given up on in time");
        let load = sending.load.lock().unwrap();
        assert!(load.by_client.is_empty() && load.by_address.is_empty());
        drop(load);
        sending.spawn(to("slow", None), MAX_SENDING_BYTES_TO_ONE / 2 + 1, std::future::pending());
        sending.spawn(to("slow", None), MAX_SENDING_BYTES_TO_ONE / 2 + 1, std::future::pending());
        assert_eq!(sending.load().0, 1, "the second is past its bytes");
        let note = ServerNotification::ToolListChangedNotification(Default::default());
        assert_eq!(encoded_len(&note), serde_json::to_vec(&note).unwrap().len());
    }
}
