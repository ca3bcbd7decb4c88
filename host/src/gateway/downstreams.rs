//! The gateway's clients (downstream sessions) and what each asked to hear: its log
//! level and its resource subscriptions. Notifications reach only the sessions they
//! concern:
//! - catalogue changes (`list_changed`): every session;
//! - a resource update: the sessions subscribed to that resource;
//! - a log message of a shared server: the sessions that set a level (`logging/setLevel`)
//!   at or below the message's; over stdio, the one client whether it set one or not;
//! - anything a `session`-scoped server says: its own session only.

// Logging is deprecated by 2026-07-28 (SEP-2577) but live in every revision we speak.
#![allow(deprecated)]

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use rmcp::model::{
    LoggingLevel, LoggingMessageNotificationParam, ResourceUpdatedNotificationParam, ServerNotification,
};
use rmcp::{Peer, RoleServer};

/// How clients reach this gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Front {
    /// One client, on stdin and stdout.
    Stdio,
    /// Any number of clients over streamable HTTP.
    Http,
}

/// One client session.
struct Downstream {
    client: Arc<str>,
    peer: Peer<RoleServer>,
    level: Option<LoggingLevel>,
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
    pub fn new(front: Front) -> Self {
        Self { front, list: Mutex::default() }
    }

    pub fn front(&self) -> Front {
        self.front
    }

    /// `client` finished initialising: it hears notifications from now on.
    pub fn add(&self, client: Arc<str>, peer: Peer<RoleServer>) {
        let mut list = self.list.lock().expect("not poisoned");
        list.retain(|d| !d.peer.is_transport_closed() && d.client != client);
        list.push(Downstream { client, peer, level: None, subscriptions: HashSet::new() });
    }

    /// The live sessions' peers.
    pub fn peers(&self) -> Vec<Peer<RoleServer>> {
        let mut list = self.list.lock().expect("not poisoned");
        list.retain(|d| !d.peer.is_transport_closed());
        list.iter().map(|d| d.peer.clone()).collect()
    }

    /// The only client, over stdio.
    pub fn only_stdio_client(&self) -> Option<Peer<RoleServer>> {
        match (self.front, self.peers().as_slice()) {
            (Front::Stdio, [only]) => Some(only.clone()),
            _ => None,
        }
    }

    /// Sends `notification` to every session, without waiting on any of them.
    pub fn broadcast(&self, notification: ServerNotification) {
        for peer in self.peers() {
            send(peer, notification.clone());
        }
    }

    /// A log message of a shared server, to the sessions that asked for its level.
    pub fn log(&self, log: LoggingMessageNotificationParam) {
        let stdio = self.front == Front::Stdio;
        let wants = |d: &Downstream| match d.level {
            Some(level) => rank(log.level) >= rank(level),
            None => stdio,
        };
        for (peer, ()) in self.live(|d| if wants(d) { vec![()] } else { vec![] }) {
            send(peer, ServerNotification::LoggingMessageNotification(rmcp::model::Notification::new(log.clone())));
        }
    }

    /// Each live session's peer with each of what `pick` takes from it.
    fn live<T>(&self, pick: impl Fn(&Downstream) -> Vec<T>) -> Vec<(Peer<RoleServer>, T)> {
        let list = self.list.lock().expect("not poisoned");
        list.iter()
            .filter(|d| !d.peer.is_transport_closed())
            .flat_map(|d| pick(d).into_iter().map(|t| (d.peer.clone(), t)))
            .collect()
    }

    /// Whether `client` wants a log message at `level` (of its own session-scoped server).
    pub fn wants_log(&self, client: &str, level: LoggingLevel) -> bool {
        let list = self.list.lock().expect("not poisoned");
        list.iter().find(|d| &*d.client == client).is_none_or(|d| d.level.is_none_or(|l| rank(level) >= rank(l)))
    }

    /// Server instance `instance` says its resource `uri` changed: to the sessions
    /// subscribed to it, each by the URI it subscribed with.
    pub fn resource_updated(&self, instance: u64, update: ResourceUpdatedNotificationParam) {
        let to = self.live(|d| {
            let theirs = d.subscriptions.iter().filter(|s| s.instance == instance && s.uri == update.uri);
            theirs.map(|s| s.exposed.clone()).collect()
        });
        for (peer, exposed) in to {
            let mut update = update.clone();
            update.uri = exposed;
            send(peer, ServerNotification::ResourceUpdatedNotification(rmcp::model::Notification::new(update)));
        }
    }

    /// `client` set its log level.
    pub fn set_level(&self, client: &str, level: LoggingLevel) {
        let mut list = self.list.lock().expect("not poisoned");
        if let Some(d) = list.iter_mut().find(|d| &*d.client == client) {
            d.level = Some(level);
        }
    }

    /// The most verbose level any live session (or only `only`) asked for.
    pub fn level(&self, only: Option<&str>) -> Option<LoggingLevel> {
        let list = self.list.lock().expect("not poisoned");
        list.iter()
            .filter(|d| !d.peer.is_transport_closed() && only.is_none_or(|c| c == &*d.client))
            .filter_map(|d| d.level)
            .min_by_key(|l| rank(*l))
    }

    /// Records `client`'s (un)subscription; returns whether any live session is still
    /// subscribed to that resource of that instance (to keep, or end, the upstream
    /// subscription).
    pub fn subscribe(&self, client: &str, subscription: Subscription, on: bool) -> bool {
        let mut list = self.list.lock().expect("not poisoned");
        if let Some(d) = list.iter_mut().find(|d| &*d.client == client) {
            if on {
                d.subscriptions.insert(subscription.clone());
            } else {
                d.subscriptions.remove(&subscription);
            }
        }
        list.iter()
            .filter(|d| !d.peer.is_transport_closed())
            .any(|d| d.subscriptions.iter().any(|s| s.instance == subscription.instance && s.uri == subscription.uri))
    }

    /// Every URI of server instance `instance` some live session is subscribed to
    /// (re-applied after it restarts).
    pub fn subscriptions(&self, instance: u64) -> Vec<String> {
        let list = self.list.lock().expect("not poisoned");
        let mut uris: Vec<String> = list
            .iter()
            .filter(|d| !d.peer.is_transport_closed())
            .flat_map(|d| d.subscriptions.iter().filter(|s| s.instance == instance).map(|s| s.uri.clone()))
            .collect();
        uris.sort();
        uris.dedup();
        uris
    }

    /// A server was relaunched as instance `new` (`Some`), or removed (`None`): its
    /// subscriptions follow it, or end.
    pub fn reinstance(&self, old: u64, new: Option<u64>) {
        let mut list = self.list.lock().expect("not poisoned");
        for d in list.iter_mut() {
            let moved: Vec<Subscription> = d.subscriptions.iter().filter(|s| s.instance == old).cloned().collect();
            for mut s in moved {
                d.subscriptions.remove(&s);
                if let Some(new) = new {
                    s.instance = new;
                    d.subscriptions.insert(s);
                }
            }
        }
    }

    /// `client`'s session ended: it is forgotten, and the subscriptions no other live
    /// session holds are returned, to be ended upstream.
    pub fn remove(&self, client: &str) -> Vec<(u64, String)> {
        let mut list = self.list.lock().expect("not poisoned");
        let Some(at) = list.iter().position(|d| &*d.client == client) else { return Vec::new() };
        let gone = list.swap_remove(at);
        list.retain(|d| !d.peer.is_transport_closed());
        gone.subscriptions
            .into_iter()
            .filter(|s| {
                !list.iter().any(|d| d.subscriptions.iter().any(|o| o.instance == s.instance && o.uri == s.uri))
            })
            .map(|s| (s.instance, s.uri))
            .collect()
    }
}

/// Sends `notification` to `peer` on a task of its own: a client that does not read
/// never holds up the server that spoke.
pub fn send(peer: Peer<RoleServer>, notification: ServerNotification) {
    tokio::spawn(async move {
        if let Err(e) = peer.send_notification(notification).await {
            tracing::debug!("a downstream notification was not delivered: {e}");
        }
    });
}
