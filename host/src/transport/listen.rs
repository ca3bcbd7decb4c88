//! What a server on MCP 2026-07-28 tells its client only on a `subscriptions/listen`
//! request: that its lists changed, and that a resource was updated. (Before that
//! revision, notifications did both, and `resources/subscribe` asked for the second.)
//!
//! Each session keeps one listen open for its list changes, for its whole life, and one
//! more per resource a client follows, until no client follows it ([`Follows`]). A
//! listen the server ends is opened again after a pause that doubles from 1 s to 30 s,
//! and what may have been missed meanwhile is announced as if it had happened: every
//! list changed, or the resource was updated.

// `resources/subscribe` is deprecated by 2026-07-28 but lives in every revision before it.
#![allow(deprecated)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    ResourceUpdatedNotificationParam, ServerNotification, SubscribeRequestParams, SubscriptionFilter,
    UnsubscribeRequestParams,
};
use rmcp::service::Subscription;
use rmcp::{ErrorData, ServiceError};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::supervisor::{Session, restart_delay};
use super::upstream::{Relay, UpstreamEvent};
use crate::config::RestartPolicy;

/// The most resources of one server session the gateway follows at once: each is a
/// request kept open on the server.
pub const MAX_FOLLOWED: usize = 256;

/// What a listen request is for.
#[derive(Debug, Clone)]
enum Purpose {
    Lists,
    Resource(String),
}

impl Purpose {
    fn filter(&self) -> SubscriptionFilter {
        match self {
            Purpose::Lists => SubscriptionFilter::builder()
                .tools_list_changed()
                .prompts_list_changed()
                .resources_list_changed()
                .build(),
            Purpose::Resource(uri) => {
                let mut filter = SubscriptionFilter::new();
                filter.resource_subscriptions = Some(vec![uri.clone()]);
                filter
            }
        }
    }

    /// What may have happened while the listen was closed.
    fn missed(&self) -> Vec<UpstreamEvent> {
        match self {
            Purpose::Lists => {
                vec![UpstreamEvent::ToolsChanged, UpstreamEvent::PromptsChanged, UpstreamEvent::ResourcesChanged]
            }
            Purpose::Resource(uri) => {
                vec![UpstreamEvent::ResourceUpdated(ResourceUpdatedNotificationParam::new(uri.clone()))]
            }
        }
    }
}

/// The resources a session follows on its server's listen requests (2026-07-28), each
/// with the token that ends its listen, and where their updates go.
pub struct Follows {
    relay: Arc<dyn Relay>,
    listens: Mutex<HashMap<String, CancellationToken>>,
}

impl Follows {
    pub fn new(relay: Arc<dyn Relay>) -> Self {
        Self { relay, listens: Mutex::default() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, CancellationToken>> {
        self.listens.lock().expect("not poisoned")
    }
}

impl std::fmt::Debug for Follows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.lock().keys()).finish()
    }
}

impl Session {
    /// Follows the updates of the server's resource `uri`: `resources/subscribe` before
    /// 2026-07-28, a listen request of its own on that revision ([`follow`]).
    pub async fn follow(self: &Arc<Self>, uri: &str) -> Result<(), ServiceError> {
        if self.info.as_ref().is_some_and(|i| !i.protocol_version.has_initialize()) {
            follow(self, uri).await
        } else {
            self.peer.subscribe(SubscribeRequestParams::new(uri)).await
        }
    }

    /// Stops following `uri`: `resources/unsubscribe`, or its listen request cancelled.
    pub async fn unfollow(&self, uri: &str) -> Result<(), ServiceError> {
        if self.info.as_ref().is_some_and(|i| !i.protocol_version.has_initialize()) {
            if let Some(stop) = self.follows.lock().remove(uri) {
                stop.cancel();
            }
            Ok(())
        } else {
            self.peer.unsubscribe(UnsubscribeRequestParams::new(uri)).await
        }
    }
}

/// Keeps a listen open on `session` for its list changes, relayed to `relay`, for as long
/// as the session lives. A server that takes no listen requests is told once, in the log.
pub fn lists(session: &Arc<Session>) {
    let session = session.clone();
    tokio::spawn(async move {
        let relay = session.follows.relay.clone();
        let opened = tokio::select! {
            opened = session.peer.listen(Purpose::Lists.filter()) => opened,
            () = session.closed.cancelled() => return,
        };
        match opened {
            Ok(first) => keep(first, &session, &*relay, Purpose::Lists, session.closed.clone()).await,
            Err(e) => tracing::info!(
                server = %session.server,
                "the server takes no subscriptions/listen, so its list changes go unheard: {e}"
            ),
        }
    });
}

/// Follows `uri` on `session` (a server on 2026-07-28): a listen request of its own,
/// opened now (so that a server that refuses it is an error for the client that asked),
/// its updates relayed until [`Session::unfollow`] or the session's end. Following a
/// resource already followed does nothing.
async fn follow(session: &Arc<Session>, uri: &str) -> Result<(), ServiceError> {
    // The entry is made before the listen is opened, so that a follow of the same
    // resource meanwhile is not a second listen, and an unfollow meanwhile is not lost.
    let stop = session.closed.child_token();
    {
        let mut follows = session.follows.lock();
        if follows.contains_key(uri) {
            return Ok(());
        }
        if follows.len() >= MAX_FOLLOWED {
            let message =
                format!("the gateway follows at most {MAX_FOLLOWED} resources of server `{}`", session.server);
            return Err(ServiceError::McpError(ErrorData::invalid_request(message, None)));
        }
        follows.insert(uri.to_owned(), stop.clone());
    }
    // Until the listen is open, a failure (or this future dropped by a timeout) undoes it.
    let mut undo = Undo { session, uri, armed: true };
    let purpose = Purpose::Resource(uri.to_owned());
    let first = match session.peer.listen(purpose.filter()).await {
        Ok(first) if first.acknowledged().resource_subscriptions.iter().flatten().any(|u| u == uri) => first,
        refused => {
            let message = format!("server `{}` does not follow `{uri}`", session.server);
            return Err(refused.err().unwrap_or(ServiceError::McpError(ErrorData::invalid_params(message, None))));
        }
    };
    undo.armed = false;
    // Unfollowed while it was being opened: dropping `first` cancels it.
    if stop.is_cancelled() {
        return Ok(());
    }
    let session = session.clone();
    tokio::spawn(async move {
        let relay = session.follows.relay.clone();
        keep(first, &session, &*relay, purpose, stop).await
    });
    Ok(())
}

/// Removes a follow's entry when dropped while armed.
struct Undo<'a> {
    session: &'a Session,
    uri: &'a str,
    armed: bool,
}

impl Drop for Undo<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.session.follows.lock().remove(self.uri);
        }
    }
}

/// Relays what `subscription` brings, and opens it again when the server ends it, until
/// `stop` (the session's end, or the follow's). Dropping a subscription cancels it.
async fn keep(first: Subscription, session: &Session, relay: &dyn Relay, purpose: Purpose, stop: CancellationToken) {
    let (server, id) = (&*session.server, session.id);
    // The pause before reopening: the restarts' backoff, from 1 s to 30 s.
    let backoff = RestartPolicy { initial_delay_ms: 1000, max_delay_ms: 30_000, ..RestartPolicy::default() };
    let mut subscription = first;
    let mut failed = 0;
    loop {
        let opened_at = Instant::now();
        relay_events(&mut subscription, &stop, relay, server, id).await;
        drop(subscription);
        // Only a listen that lasted resets the pause: one the server ends at once is not
        // reopened (and every list re-read) every second.
        if opened_at.elapsed() >= Duration::from_secs(30) {
            failed = 0;
        }
        subscription = loop {
            tokio::select! {
                () = tokio::time::sleep(restart_delay(&backoff, failed)) => {}
                () = stop.cancelled() => return,
            }
            failed += 1;
            let opened = tokio::select! {
                opened = session.peer.listen(purpose.filter()) => opened,
                () = stop.cancelled() => return,
            };
            match opened {
                Ok(subscription) => break subscription,
                Err(e) => tracing::debug!(server, ?purpose, "subscriptions/listen failed again: {e}"),
            }
        };
        for event in purpose.missed() {
            relay.notify(server, id, event);
        }
    }
}

/// Relays the list changes and resource updates `subscription` brings until it ends or
/// `stop`.
async fn relay_events(
    subscription: &mut Subscription,
    stop: &CancellationToken,
    relay: &dyn Relay,
    server: &str,
    id: u64,
) {
    loop {
        let next = tokio::select! {
            next = subscription.next() => next,
            () = stop.cancelled() => return,
        };
        let event = match next {
            Ok(Some(ServerNotification::ToolListChangedNotification(_))) => UpstreamEvent::ToolsChanged,
            Ok(Some(ServerNotification::PromptListChangedNotification(_))) => UpstreamEvent::PromptsChanged,
            Ok(Some(ServerNotification::ResourceListChangedNotification(_))) => UpstreamEvent::ResourcesChanged,
            Ok(Some(ServerNotification::ResourceUpdatedNotification(n))) => UpstreamEvent::ResourceUpdated(n.params),
            Ok(Some(_)) => continue,
            Ok(None) | Err(_) => {
                tracing::debug!(
                    server,
                    session = id,
                    "the server's subscriptions/listen ended: {:?}",
                    subscription.end()
                );
                return;
            }
        };
        relay.notify(server, id, event);
    }
}
