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
    /// (server, URI) pairs it subscribed to.
    subscriptions: HashSet<(Arc<str>, String)>,
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
        let to: Vec<_> = self
            .list
            .lock()
            .expect("not poisoned")
            .iter()
            .filter(|d| !d.peer.is_transport_closed())
            .filter(|d| match d.level {
                Some(level) => rank(log.level) >= rank(level),
                None => stdio,
            })
            .map(|d| d.peer.clone())
            .collect();
        for peer in to {
            send(peer, ServerNotification::LoggingMessageNotification(rmcp::model::Notification::new(log.clone())));
        }
    }

    /// Whether `client` wants a log message at `level` (of its own session-scoped server).
    pub fn wants_log(&self, client: &str, level: LoggingLevel) -> bool {
        let list = self.list.lock().expect("not poisoned");
        list.iter().find(|d| &*d.client == client).is_none_or(|d| d.level.is_none_or(|l| rank(level) >= rank(l)))
    }

    /// `server` says its resource `uri` changed (`update` names it as clients know it):
    /// to the sessions subscribed to it (of them, only `only` for a session-scoped server).
    pub fn resource_updated(
        &self,
        server: &str,
        uri: &str,
        update: ResourceUpdatedNotificationParam,
        only: Option<&str>,
    ) {
        let to: Vec<_> = self
            .list
            .lock()
            .expect("not poisoned")
            .iter()
            .filter(|d| !d.peer.is_transport_closed() && only.is_none_or(|c| c == &*d.client))
            .filter(|d| d.subscriptions.iter().any(|(s, u)| &**s == server && u == uri))
            .map(|d| d.peer.clone())
            .collect();
        for peer in to {
            let n = ServerNotification::ResourceUpdatedNotification(rmcp::model::Notification::new(update.clone()));
            send(peer, n);
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

    /// Records `client`'s (un)subscription; returns whether any session is still
    /// subscribed to `uri` of `server` (to keep, or end, the upstream subscription).
    pub fn subscribe(&self, client: &str, server: Arc<str>, uri: String, on: bool) -> bool {
        let mut list = self.list.lock().expect("not poisoned");
        if let Some(d) = list.iter_mut().find(|d| &*d.client == client) {
            if on {
                d.subscriptions.insert((server.clone(), uri.clone()));
            } else {
                d.subscriptions.remove(&(server.clone(), uri.clone()));
            }
        }
        list.iter().any(|d| d.subscriptions.contains(&(server.clone(), uri.clone())))
    }

    /// Every URI of `server` some live session (or only `only`) is subscribed to
    /// (re-applied after it restarts).
    pub fn subscriptions(&self, server: &str, only: Option<&str>) -> Vec<String> {
        let list = self.list.lock().expect("not poisoned");
        let mut uris: Vec<String> = list
            .iter()
            .filter(|d| !d.peer.is_transport_closed() && only.is_none_or(|c| c == &*d.client))
            .flat_map(|d| d.subscriptions.iter().filter(|(s, _)| &**s == server).map(|(_, u)| u.clone()))
            .collect();
        uris.sort();
        uris.dedup();
        uris
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
