//! The hub's part in the clients' resource subscriptions, which outlive the server
//! instances they are made on: made again on an instance that restarts, moved with a
//! relaunch to its new instance (and between a session's own instance and a shared one
//! when a reload changes a server's scope), and given up with their last holder.

// Logging is deprecated by 2026-07-28 (SEP-2577) but live in every revision we speak.
#![allow(deprecated)]

use std::sync::Arc;
use std::time::Duration;

use rmcp::model::SetLevelRequestParams;

use super::Hub;
use crate::config::Scope;
use crate::gateway::downstreams::Front;
use crate::gateway::relay::Owner;
use crate::gateway::setup::{Changes, Setup};
use crate::transport::listen::{Follower, MAX_FOLLOWED_PER_CLIENT};
use crate::transport::supervisor::{ServerHandle, Session, Status};

impl Hub {
    /// The clients' subscriptions to each relaunched server move to its new instance once
    /// it serves in place of the old one (those made until then went to the old one);
    /// followed there once it is ready (now, or when it becomes ready), and each resource
    /// announced as updated, since what changed meanwhile was not heard.
    pub(super) fn move_subscriptions(self: &Arc<Self>, changes: &Changes) {
        for (old, new) in &changes.moved {
            match changes.started.iter().find(|h| h.instance == *new) {
                Some(handle) => self.move_subscriptions_to(*old, handle.clone()),
                None => {
                    self.downstreams.reinstance(*old, Some(*new));
                }
            }
        }
    }

    /// The subscriptions made on instance `old` move to `handle`, which replaces it (see
    /// [`Self::move_subscriptions`]).
    pub fn move_subscriptions_to(self: &Arc<Self>, old: u64, handle: Arc<ServerHandle>) {
        let moved = self.downstreams.reinstance(old, Some(handle.instance));
        self.follow_when_ready(handle, moved);
    }

    /// `client`'s subscriptions to a server that a reload made `session`-scoped, parked
    /// since, move to its own instance `handle` of it (just started).
    pub fn claim_parked(self: &Arc<Self>, client: &str, handle: &Arc<ServerHandle>) {
        let moved = self.downstreams.claim(client, &handle.name, handle.instance);
        self.follow_when_ready(handle.clone(), moved);
    }

    /// The subscriptions to the shared servers that `next` makes `session`-scoped (their
    /// instances retired, not relaunched) are parked for the sessions' own instances.
    pub(super) fn park_made_session(&self, next: &Setup, changes: &Changes) {
        for handle in &changes.retired {
            if !changes.relaunched(handle.instance)
                && next.config.servers.get(&*handle.name).is_some_and(|s| s.scope == Scope::Session)
            {
                self.downstreams.park(handle.name.clone(), handle.instance);
            }
        }
    }

    /// The subscriptions parked for a server a reload made `session`-scoped (see
    /// [`Downstreams::park`]) wait on while it still is; they move to its shared
    /// instance once a reload makes it shared again, and end once it is removed.
    pub(super) fn unpark(self: &Arc<Self>, setup: &Setup) {
        for name in self.downstreams.parked() {
            if setup.config.servers.get(&*name).is_some_and(|s| s.scope == Scope::Session) {
                continue;
            }
            let shared = setup.servers.get(&*name).cloned();
            let moved = self.downstreams.unpark(&name, shared.as_ref().map(|h| h.instance));
            if let Some(shared) = shared {
                self.follow_when_ready(shared, moved);
            }
        }
    }

    /// Follows `moved`, the subscriptions moved to `handle`, once it is ready (now, or
    /// when it becomes ready), announcing each resource as updated to its holder: what
    /// changed meanwhile was not heard.
    fn follow_when_ready(self: &Arc<Self>, handle: Arc<ServerHandle>, mut moved: Vec<(Follower, String)>) {
        if moved.is_empty() {
            return;
        }
        // Onto a shared instance over HTTP, each client within its share of it, as when
        // it subscribes there (those beyond it are logged, not made).
        let shared = self.setup().servers.get(&handle.name).is_some_and(|h| Arc::ptr_eq(h, &handle));
        if shared && self.downstreams.front() == Front::Http {
            for (who, _) in &mut moved {
                who.share = MAX_FOLLOWED_PER_CLIENT;
            }
        }
        let (hub, mut state) = (Arc::downgrade(self), handle.subscribe());
        tokio::spawn(async move {
            // Ends when the instance stops (its supervisor drops the sender).
            let ready = state.wait_for(|s| matches!(s.status, Status::Ready | Status::Stopped)).await;
            if ready.is_ok_and(|s| s.status == Status::Ready)
                && let Some(hub) = hub.upgrade()
            {
                // Its level was set when it became ready ([`Self::watch`]).
                hub.follow(&handle, None, moved, true);
            }
        });
    }

    /// A client session (or a listen request) ended: it is forgotten, and its
    /// subscriptions given up (each ends upstream with its last follower), on the shared
    /// servers and on a session's own instances alike.
    pub fn session_ended(self: &Arc<Self>, client: &str) {
        for (instance, uri, holder) in self.downstreams.remove(client) {
            let Some(handle) = self.instance(instance) else { continue };
            if let Some(session) = handle.state().session.filter(|s| s.is_live()) {
                let (hub, within) = (self.clone(), self.timeout_of(&handle.name));
                tokio::spawn(async move {
                    let _ = hub.unfollow_for(&session, instance, &uri, &holder, within).await;
                });
            }
        }
    }

    /// A server instance became ready: re-apply the log level and subscriptions its
    /// clients set (all sessions' for a shared server, its owner's for its own), on a
    /// task of its own, each within the server's `recovery.timeout_ms`: a server slow to
    /// answer them holds up neither the catalogue nor its other state changes. After a
    /// restart, each resource followed is announced as updated to its followers.
    pub(super) fn on_ready(self: &Arc<Self>, handle: &ServerHandle, owner: Option<&Owner>, restarted: bool) {
        let Some(session) = handle.state().session else { return };
        let only = owner.map(|o| &*o.client);
        // Asked on its own, it may take its level after a client's newer one reached the
        // others: the next `logging/setLevel` asks every shared server again.
        if owner.is_none() {
            self.downstreams.took_shared_level(None);
        }
        let level = self
            .downstreams
            .level(only)
            .filter(|_| session.info.as_ref().is_some_and(|i| i.capabilities.logging.is_some()));
        if let Some(level) = level {
            let (within, instance, hub) = (self.timeout_of(&handle.name), handle.instance, self.clone());
            let session = session.clone();
            tokio::spawn(async move {
                // Every session's level: what the server says meanwhile is no one client's.
                let _ = hub.aside(instance, within, session.peer.set_level(SetLevelRequestParams::new(level))).await;
            });
        }
        self.follow_again(handle, &session, restarted);
    }

    /// Makes the clients' subscriptions to `handle` again on its `session`; after a
    /// restart (`restarted`), each resource is announced as updated, since what changed
    /// meanwhile was not heard.
    fn follow_again(self: &Arc<Self>, handle: &ServerHandle, session: &Arc<Session>, restarted: bool) {
        self.follow(handle, Some(session), self.downstreams.subscriptions(handle.instance), restarted);
    }

    /// Makes `subscriptions`, held on `handle`, on its session (the current one unless
    /// given); `announce`d as updated once made (see [`Self::follow_again`]).
    fn follow(
        self: &Arc<Self>,
        handle: &ServerHandle,
        session: Option<&Arc<Session>>,
        subscriptions: Vec<(Follower, String)>,
        restarted: bool,
    ) {
        let Some(session) = session.cloned().or_else(|| handle.state().session) else { return };
        if subscriptions.is_empty() {
            return;
        }
        let within = self.timeout_of(&handle.name);
        let timeout_ms = within.as_millis();
        let (server, instance, hub) = (handle.name.clone(), handle.instance, self.clone());
        tokio::spawn(async move {
            let (session, server, hub) = (&session, &server, &hub);
            let follows = subscriptions.iter().map(|(who, uri)| async move {
                match hub.follow_for(session, who, instance, uri, within).await {
                    // What changed while the server was down, or as it restarted, was
                    // not heard: its followers read it afresh.
                    Ok(Ok(())) if restarted => hub.downstreams.announce(&who.holder, instance, uri),
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::info!(%server, %uri, "a subscription could not be made again: {e}"),
                    Err(_) => {
                        tracing::info!(%server, %uri, "a subscription could not be made again within {timeout_ms} ms")
                    }
                }
            });
            futures::future::join_all(follows).await;
        });
    }

    /// `who` follows `uri` of server instance `instance` on `session`, within `within`.
    /// Its subscription is recorded downstream before this; if the holder let it go
    /// meanwhile (an unsubscribe, its end), the follow made for it is given up again.
    pub(in crate::gateway) async fn follow_for(
        &self,
        session: &Arc<Session>,
        who: &Follower,
        instance: u64,
        uri: &str,
        within: Duration,
    ) -> Result<Result<(), rmcp::ServiceError>, tokio::time::error::Elapsed> {
        let followed = self.aside(instance, within, session.follow(uri, who)).await;
        if matches!(followed, Ok(Ok(()))) && !self.downstreams.holds(&who.holder, instance, uri) {
            let _ = self.unfollow_for(session, instance, uri, &who.holder, within).await;
        }
        followed
    }

    /// `holder` lets `uri` of server instance `instance` go on `session` (upstream, with
    /// its last follower), within `within`. What the server says meanwhile is no one
    /// client's: a subscription may be several clients', and its URI tells of them.
    pub(in crate::gateway) async fn unfollow_for(
        &self,
        session: &Arc<Session>,
        instance: u64,
        uri: &str,
        holder: &str,
        within: Duration,
    ) -> Result<Result<(), rmcp::ServiceError>, tokio::time::error::Elapsed> {
        self.aside(instance, within, session.unfollow(uri, holder)).await
    }
}
