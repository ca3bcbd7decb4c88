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
    ErrorCode, ResourceUpdatedNotificationParam, ServerNotification, SubscribeRequestParams, SubscriptionFilter,
    UnsubscribeRequestParams,
};
use rmcp::service::Subscription;
use rmcp::{ErrorData, ServiceError};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::supervisor::{Session, restart_delay};
use super::upstream::{Relay, UpstreamEvent};
use crate::config::RestartPolicy;
use crate::lasting::Locked;

/// The most resources of one server session the gateway follows at once: each is a
/// request kept open on the server.
pub const MAX_FOLLOWED: usize = 256;

/// The most of them one client may have followed where several clients share the
/// gateway: half, so that no one client of a shared server can take all its room from
/// the others.
pub const MAX_FOLLOWED_PER_CLIENT: usize = MAX_FOLLOWED / 2;

/// Who follows a resource: a client session, or one of its listen requests (`holder`),
/// and the client it counts against: over stdio its session, over HTTP its address (an
/// IPv6 one by its /48 site).
#[derive(Debug, Clone)]
pub struct Follower {
    pub holder: Arc<str>,
    pub client: Arc<str>,
    /// The most resources of one server session that client may follow:
    /// [`MAX_FOLLOWED_PER_CLIENT`] of a shared server over HTTP; [`MAX_FOLLOWED`] for the
    /// only client (stdio), a server of its own, or a follow made again after a restart.
    pub share: usize,
}

/// Why a follow was refused: no room left.
#[derive(Debug, Clone, Copy)]
enum Full {
    Session,
    Client,
}

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

/// The resources of one server session that clients follow, and who follows each: the
/// upstream subscription is made for the first follower and ended with the last, under
/// one lock, so that a follow and an unfollow racing cannot end a subscription someone
/// still holds, nor leave one nobody does.
pub struct Follows {
    relay: Arc<dyn Relay>,
    followed: Mutex<Followed>,
}

#[derive(Default)]
struct Followed {
    by_uri: HashMap<String, Follow>,
    /// Tells an entry from a later one for the same resource.
    next: u64,
}

/// One followed resource.
struct Follow {
    id: u64,
    /// Who follows it: client sessions and listen requests, by name, each with the client
    /// it counts against (`Follower::client`).
    holders: HashMap<Arc<str>, Arc<str>>,
    /// Ends its listen request (2026-07-28), or tells its opener it is no longer wanted.
    stop: CancellationToken,
    opening: watch::Receiver<Opening>,
}

/// How a follow stands, as the followers that come meanwhile see it.
#[derive(Debug, Clone)]
enum Opening {
    /// Being subscribed upstream, or unsubscribed: wait, then look again.
    Pending,
    Open,
    Refused(ErrorData),
}

/// What the last follower's going leaves to do.
#[derive(Debug)]
enum Left {
    /// Others still follow it, or it is still being opened (its opener ends it).
    Kept,
    /// Ended (a listen request ends with its `stop`).
    Ended,
    /// Ended, and the server must be told (`resources/unsubscribe`). Until it is, the
    /// entry stays, as `id` and pending, so that a new follower's `resources/subscribe`
    /// comes after the unsubscribe, not before it.
    Close { id: u64, closing: watch::Sender<Opening> },
}

impl Follows {
    pub fn new(relay: Arc<dyn Relay>) -> Self {
        Self { relay, followed: Mutex::default() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Followed> {
        self.followed.locked()
    }

    /// `who` joins the open follow of `uri`, waits for the one being opened, or opens it
    /// (its `stop` a child of `closed`); `Err` past [`MAX_FOLLOWED`] resources, or past
    /// its client's share.
    fn turn(&self, uri: &str, who: &Follower, closed: &CancellationToken) -> Result<Turn, Full> {
        let mut followed = self.lock();
        let its = |f: &Follow| f.holders.values().any(|client| *client == who.client);
        let room = followed.by_uri.values().filter(|f| its(f)).count() < who.share;
        if let Some(follow) = followed.by_uri.get_mut(uri) {
            if matches!(*follow.opening.borrow(), Opening::Open) {
                if !room && !its(follow) {
                    return Err(Full::Client);
                }
                follow.holders.insert(who.holder.clone(), who.client.clone());
                return Ok(Turn::Done);
            }
            return Ok(Turn::Wait(follow.opening.clone()));
        }
        if followed.by_uri.len() >= MAX_FOLLOWED {
            return Err(Full::Session);
        }
        if !room {
            return Err(Full::Client);
        }
        followed.next += 1;
        let (id, stop) = (followed.next, closed.child_token());
        let (opened, opening) = watch::channel(Opening::Pending);
        let holders = HashMap::from([(who.holder.clone(), who.client.clone())]);
        followed.by_uri.insert(uri.to_owned(), Follow { id, holders, stop: stop.clone(), opening });
        Ok(Turn::Open { id, stop, opened })
    }

    /// Which of `uris` (in order) `client` could follow now with `share`: `turn`'s answer
    /// for each, as if each one admitted before it had been taken, a repeated one not.
    /// (A listen request of the client's still following what it was acknowledged, or
    /// one that comes meanwhile, may still take the room first.) The lock is held only
    /// to copy what is followed, at most [`MAX_FOLLOWED`] entries, whatever `uris` holds.
    pub fn room_for<'a>(&self, client: &str, share: usize, uris: &[&'a str]) -> Vec<bool> {
        let (theirs, mut total) = {
            let followed = self.lock();
            let theirs: HashMap<String, bool> = followed
                .by_uri
                .iter()
                .map(|(uri, f)| (uri.clone(), f.holders.values().any(|c| **c == *client)))
                .collect();
            (theirs, followed.by_uri.len())
        };
        let mut held = theirs.values().filter(|its| **its).count();
        let mut seen: std::collections::HashSet<&str> = std::collections::HashSet::new();
        let mut admit = |uri: &'a str| {
            if !seen.insert(uri) {
                return false;
            }
            match theirs.get(uri) {
                Some(true) => true,
                Some(false) if held < share => {
                    held += 1;
                    true
                }
                None if held < share && total < MAX_FOLLOWED => {
                    (held, total) = (held + 1, total + 1);
                    true
                }
                _ => false,
            }
        };
        uris.iter().map(|uri| admit(uri)).collect()
    }

    /// `holder` leaves the follow of `uri`. The last to leave ends it (its `stop`
    /// cancelled); `tell_server`: ending it takes a request to the server.
    fn leave(&self, uri: &str, holder: &str, tell_server: bool) -> Left {
        let mut followed = self.lock();
        let Followed { by_uri, next } = &mut *followed;
        let Some(follow) = by_uri.get_mut(uri) else { return Left::Kept };
        follow.holders.remove(holder);
        if !follow.holders.is_empty() {
            return Left::Kept;
        }
        follow.stop.cancel();
        if !matches!(*follow.opening.borrow(), Opening::Open) {
            return Left::Kept;
        }
        if !tell_server {
            by_uri.remove(uri);
            return Left::Ended;
        }
        *next += 1;
        let (closing, opening) = watch::channel(Opening::Pending);
        (follow.id, follow.opening) = (*next, opening);
        Left::Close { id: *next, closing }
    }

    /// Removes the follow `id` of `uri` (not a later one for the same resource).
    fn forget(&self, uri: &str, id: u64) {
        let mut followed = self.lock();
        if followed.by_uri.get(uri).is_some_and(|f| f.id == id) {
            followed.by_uri.remove(uri);
        }
    }
}

impl std::fmt::Debug for Follows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.lock().by_uri.keys()).finish()
    }
}

/// What a follower does next.
enum Turn {
    Done,
    Wait(watch::Receiver<Opening>),
    Open { id: u64, stop: CancellationToken, opened: watch::Sender<Opening> },
}

impl Session {
    /// `holder` (a client session or listen request) follows the updates of the server's
    /// resource `uri`. The first follower subscribes upstream (`resources/subscribe`
    /// before 2026-07-28, a listen request of its own on that revision) and the others
    /// wait for that to be done; a server that refuses it is an error for each of them.
    pub async fn follow(self: &Arc<Self>, uri: &str, who: &Follower) -> Result<(), ServiceError> {
        loop {
            let turn = self.follows.turn(uri, who, &self.closed).map_err(|full| {
                let message = match full {
                    Full::Session => {
                        format!("the gateway follows at most {MAX_FOLLOWED} resources of server `{}`", self.server)
                    }
                    Full::Client => format!(
                        "a client may follow at most {} resources of server `{}` through the gateway (those it follows with other clients too); let one go first",
                        who.share, self.server
                    ),
                };
                ServiceError::McpError(ErrorData::invalid_request(message, None))
            })?;
            match turn {
                Turn::Done => return Ok(()),
                Turn::Wait(mut opening) => {
                    // An opening given up (its request dropped), or a closing done, lets
                    // a waiter look again, and open it itself.
                    if let Ok(Opening::Refused(e)) =
                        opening.wait_for(|o| !matches!(o, Opening::Pending)).await.as_deref()
                    {
                        return Err(ServiceError::McpError(e.clone()));
                    }
                }
                Turn::Open { id, stop, opened } => return self.open_follow(uri, id, stop, opened).await,
            }
        }
    }

    /// The first follower's part: the subscription made upstream, its outcome told to the
    /// followers waiting. A failure (or this future dropped by a timeout) removes the
    /// entry, and so does the end of one everyone left while it was being made, once it
    /// is undone upstream.
    async fn open_follow(
        self: &Arc<Self>,
        uri: &str,
        id: u64,
        stop: CancellationToken,
        opened: watch::Sender<Opening>,
    ) -> Result<(), ServiceError> {
        if !self.is_modern() {
            return self.subscribe(uri, id, stop, opened).await;
        }
        // Declared after `opened`, so dropped before it: the entry is gone by the time
        // the waiters are let go.
        let mut undo = Undo { session: self, uri, id, armed: true };
        let refused = |e: &ServiceError| {
            opened.send_replace(self.refusal(e));
        };
        let purpose = Purpose::Resource(uri.to_owned());
        let first = open(self, &purpose).await.inspect_err(refused)?;
        // Left by everyone while it was being opened: dropping `first` cancels it.
        if stop.is_cancelled() {
            return Ok(());
        }
        undo.armed = false;
        opened.send_replace(Opening::Open);
        let session = self.clone();
        tokio::spawn(async move {
            let relay = session.follows.relay.clone();
            keep(Some(first), &session, &*relay, purpose, stop).await
        });
        Ok(())
    }

    /// `holder` stops following `uri`; the last follower's going ends the subscription
    /// upstream (`resources/unsubscribe`, or its listen request cancelled).
    pub async fn unfollow(&self, uri: &str, holder: &str) -> Result<(), ServiceError> {
        match self.follows.leave(uri, holder, !self.is_modern()) {
            Left::Kept | Left::Ended => Ok(()),
            Left::Close { id, closing } => {
                // However this ends, the entry goes, then (`closing` dropped after it) the
                // followers waiting look again.
                let forget = Undo { session: self, uri, id, armed: true };
                let done = self.peer.unsubscribe(UnsubscribeRequestParams::new(uri)).await;
                drop(forget);
                drop(closing);
                done
            }
        }
    }

    /// The first follower's part before 2026-07-28: `resources/subscribe`. Given up on
    /// while it is out (this future dropped by a timeout), it is undone upstream, since
    /// the server may make it still (see [`Subscribing`]).
    async fn subscribe(
        self: &Arc<Self>,
        uri: &str,
        id: u64,
        stop: CancellationToken,
        opened: watch::Sender<Opening>,
    ) -> Result<(), ServiceError> {
        let mut out = Subscribing { session: self.clone(), uri: uri.to_owned(), id, opened: Some(opened) };
        let answer = self.peer.subscribe(SubscribeRequestParams::new(uri)).await;
        let opened = out.opened.take().expect("taken once, here");
        // Declared after `opened`, so dropped before it: the entry is gone by the time
        // the waiters are let go.
        let mut undo = Undo { session: self, uri, id, armed: true };
        if let Err(e) = answer {
            opened.send_replace(self.refusal(&e));
            return Err(e);
        }
        if stop.is_cancelled() {
            let _ = self.peer.unsubscribe(UnsubscribeRequestParams::new(uri)).await;
            return Ok(());
        }
        undo.armed = false;
        opened.send_replace(Opening::Open);
        Ok(())
    }

    /// What the followers waiting are told of a subscription the server refused.
    fn refusal(&self, e: &ServiceError) -> Opening {
        Opening::Refused(match e {
            ServiceError::McpError(e) => e.clone(),
            other => ErrorData::internal_error(format!("server `{}`: {other}", self.server), None),
        })
    }

    /// Whether the server speaks 2026-07-28, where listen requests replace
    /// `resources/subscribe`.
    fn is_modern(&self) -> bool {
        self.info.as_ref().is_some_and(|i| !i.protocol_version.has_initialize())
    }
}

/// Keeps a listen open on `session` for its list changes, relayed to `relay`, for as long
/// as the session lives. A server that takes no listen requests is told once, in the
/// log; one that fails to open it otherwise is asked again, with backoff.
pub fn lists(session: &Arc<Session>) {
    let session = session.clone();
    tokio::spawn(async move {
        let relay = session.follows.relay.clone();
        let opened = tokio::select! {
            opened = open(&session, &Purpose::Lists) => opened,
            () = session.closed.cancelled() => return,
        };
        let first = match opened {
            Ok(first) => Some(first),
            Err(ServiceError::McpError(e)) if e.code == ErrorCode::METHOD_NOT_FOUND => {
                tracing::info!(
                    server = %session.server,
                    "the server takes no subscriptions/listen, so its list changes go unheard: {}", e.message
                );
                return;
            }
            Err(e) => {
                tracing::info!(server = %session.server, "subscriptions/listen failed, to be tried again: {e}");
                None
            }
        };
        keep(first, &session, &*relay, Purpose::Lists, session.closed.clone()).await
    });
}

/// Opens a listen request on `session` for `purpose`; one for a resource must be
/// acknowledged for that resource.
async fn open(session: &Session, purpose: &Purpose) -> Result<Subscription, ServiceError> {
    let subscription = session.peer.listen(purpose.filter()).await?;
    if let Purpose::Resource(uri) = purpose
        && !subscription.acknowledged().resource_subscriptions.iter().flatten().any(|u| u == uri)
    {
        let message = format!("server `{}` does not follow `{uri}`", session.server);
        return Err(ServiceError::McpError(ErrorData::invalid_params(message, None)));
    }
    Ok(subscription)
}

/// A `resources/subscribe` out to the server, for follow `id` of `uri`. Dropped while it
/// still holds `opened` (given up on before the answer), the server may make the
/// subscription still, and nobody would end it: it is undone upstream, off the dropping
/// path and bounded, and only then is the entry removed and the followers waiting let
/// go, so that the server sees a next follower's subscribe after that unsubscribe.
struct Subscribing {
    session: Arc<Session>,
    uri: String,
    id: u64,
    opened: Option<watch::Sender<Opening>>,
}

impl Drop for Subscribing {
    fn drop(&mut self) {
        let Some(opened) = self.opened.take() else { return };
        let (session, uri, id) = (self.session.clone(), std::mem::take(&mut self.uri), self.id);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            session.follows.forget(&uri, id);
            return;
        };
        runtime.spawn(async move {
            let undone = session.peer.unsubscribe(UnsubscribeRequestParams::new(&uri));
            let _ = tokio::time::timeout(UNDO_WITHIN, undone).await;
            session.follows.forget(&uri, id);
            drop(opened);
        });
    }
}

/// How long the gateway waits for a server to undo a subscription nobody wanted.
const UNDO_WITHIN: Duration = Duration::from_secs(5);

/// Removes a follow's entry (that one, not a later one for the same resource) when
/// dropped while armed.
struct Undo<'a> {
    session: &'a Session,
    uri: &'a str,
    id: u64,
    armed: bool,
}

impl Drop for Undo<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.session.follows.forget(self.uri, self.id);
        }
    }
}

/// Relays what the listen for `purpose` brings (starting with `first`, if it opened),
/// and opens it again when the server ends it, until `stop` (the session's end, or the
/// follow's). Dropping a subscription cancels it.
async fn keep(
    first: Option<Subscription>,
    session: &Session,
    relay: &dyn Relay,
    purpose: Purpose,
    stop: CancellationToken,
) {
    let (server, id) = (&*session.server, session.id);
    // The pause before reopening: the restarts' backoff, from 1 s to 30 s.
    let backoff = RestartPolicy { initial_delay_ms: 1000, max_delay_ms: 30_000, ..RestartPolicy::default() };
    let mut next = first;
    let mut failed = 0;
    loop {
        if let Some(mut subscription) = next.take() {
            let opened_at = Instant::now();
            relay_events(&mut subscription, &stop, relay, server, id).await;
            drop(subscription);
            // Only a listen that lasted resets the pause: one the server ends at once is
            // not reopened (and every list re-read) every second.
            if opened_at.elapsed() >= Duration::from_secs(30) {
                failed = 0;
            }
        }
        tokio::select! {
            () = tokio::time::sleep(restart_delay(&backoff, failed)) => {}
            () = stop.cancelled() => return,
        }
        failed += 1;
        let opened = tokio::select! {
            opened = open(session, &purpose) => opened,
            () = stop.cancelled() => return,
        };
        match opened {
            Ok(subscription) => {
                next = Some(subscription);
                for event in purpose.missed() {
                    relay.notify(server, id, event);
                }
            }
            Err(e) => tracing::debug!(server, ?purpose, "subscriptions/listen failed again: {e}"),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A relay that hears nothing: these tests are of the bookkeeping alone.
    struct Deaf;

    impl Relay for Deaf {
        fn notify(&self, _: &str, _: u64, _: UpstreamEvent) {}
        fn trouble(&self, _: &str, _: super::super::supervisor::Trouble) {}
        fn request(
            &self,
            _: &str,
            _: super::super::upstream::Asker,
            _: super::super::upstream::UpstreamRequest,
        ) -> futures::future::BoxFuture<'static, Result<rmcp::model::ClientResult, ErrorData>> {
            Box::pin(async { Err(ErrorData::internal_error("deaf", None)) })
        }
    }

    fn follows() -> (Follows, CancellationToken) {
        (Follows::new(Arc::new(Deaf)), CancellationToken::new())
    }

    fn name(s: &str) -> Follower {
        Follower { holder: s.into(), client: s.into(), share: MAX_FOLLOWED_PER_CLIENT }
    }

    #[test]
    fn the_first_follower_opens_and_the_others_wait_then_join() {
        let (follows, closed) = follows();
        let Ok(Turn::Open { opened, stop, .. }) = follows.turn("r://1", &name("a"), &closed) else { panic!("opens") };
        let Ok(Turn::Wait(waiting)) = follows.turn("r://1", &name("b"), &closed) else { panic!("waits") };
        opened.send_replace(Opening::Open);
        assert!(matches!(*waiting.borrow(), Opening::Open));
        assert!(matches!(follows.turn("r://1", &name("b"), &closed), Ok(Turn::Done)));
        // Both hold it: the first to leave does not end it, the last does.
        assert!(matches!(follows.leave("r://1", "a", false), Left::Kept));
        assert!(!stop.is_cancelled());
        assert!(matches!(follows.leave("r://1", "b", false), Left::Ended));
        assert!(stop.is_cancelled());
        assert!(matches!(follows.turn("r://1", &name("c"), &closed), Ok(Turn::Open { .. })));
    }

    #[test]
    fn an_opening_refused_is_the_same_error_for_who_waited_and_leaves_nothing() {
        let (follows, closed) = follows();
        let Ok(Turn::Open { opened, id, .. }) = follows.turn("r://1", &name("a"), &closed) else { panic!() };
        let Ok(Turn::Wait(waiting)) = follows.turn("r://1", &name("b"), &closed) else { panic!() };
        opened.send_replace(Opening::Refused(ErrorData::invalid_params("no", None)));
        follows.forget("r://1", id);
        assert!(matches!(&*waiting.borrow(), Opening::Refused(e) if e.message == "no"));
        assert!(follows.lock().by_uri.is_empty());
    }

    #[test]
    fn a_follow_everyone_left_while_it_opened_is_ended_by_its_opener_before_anyone_follows_anew() {
        let (follows, closed) = follows();
        let Ok(Turn::Open { id, stop, opened }) = follows.turn("r://1", &name("a"), &closed) else { panic!() };
        // Its only follower leaves while it is being opened: it stays, for its opener.
        assert!(matches!(follows.leave("r://1", "a", true), Left::Kept));
        assert!(stop.is_cancelled());
        let Ok(Turn::Wait(waiting)) = follows.turn("r://1", &name("b"), &closed) else { panic!("waits") };
        // The opener undoes it upstream, forgets it, and lets the waiter go.
        follows.forget("r://1", id);
        drop(opened);
        assert!(waiting.has_changed().is_err());
        assert!(matches!(follows.turn("r://1", &name("b"), &closed), Ok(Turn::Open { .. })));
    }

    #[test]
    fn a_new_follower_waits_for_the_unsubscribe_of_the_last_one_and_an_old_undo_takes_nothing() {
        let (follows, closed) = follows();
        let Ok(Turn::Open { id: first, opened, .. }) = follows.turn("r://1", &name("a"), &closed) else { panic!() };
        opened.send_replace(Opening::Open);
        let Left::Close { id: closing_id, closing } = follows.leave("r://1", "a", true) else { panic!("closes") };
        assert_ne!(closing_id, first);
        // A subscribe now would race the unsubscribe on the wire: it waits.
        let Ok(Turn::Wait(waiting)) = follows.turn("r://1", &name("b"), &closed) else { panic!("waits") };
        // An undo of the first entry, late, does not take the closing one.
        follows.forget("r://1", first);
        assert!(matches!(follows.turn("r://1", &name("c"), &closed), Ok(Turn::Wait(_))));
        follows.forget("r://1", closing_id);
        drop(closing);
        assert!(waiting.has_changed().is_err());
        assert!(matches!(follows.turn("r://1", &name("b"), &closed), Ok(Turn::Open { .. })));
    }

    #[test]
    fn a_leave_by_who_never_followed_changes_nothing() {
        let (follows, closed) = follows();
        let Ok(Turn::Open { opened, stop, .. }) = follows.turn("r://1", &name("a"), &closed) else { panic!() };
        opened.send_replace(Opening::Open);
        assert!(matches!(follows.leave("r://1", "stranger", true), Left::Kept));
        assert!(matches!(follows.leave("r://2", "a", true), Left::Kept));
        assert!(!stop.is_cancelled());
    }

    #[test]
    fn at_most_max_followed_resources_and_the_session_end_stops_them_all() {
        let (follows, closed) = follows();
        let stops: Vec<CancellationToken> = (0..MAX_FOLLOWED)
            .map(|i| match follows.turn(&format!("r://{i}"), &name(&format!("client {}", i % 4)), &closed) {
                Ok(Turn::Open { stop, .. }) => stop,
                _ => panic!("follow {i} opens"),
            })
            .collect();
        assert!(matches!(follows.turn("r://one-too-many", &name("a"), &closed), Err(Full::Session)));
        // One already followed is still joined past the cap.
        assert!(matches!(follows.turn("r://0", &name("b"), &closed), Ok(Turn::Wait(_))));
        closed.cancel();
        assert!(stops.iter().all(CancellationToken::is_cancelled));
    }

    #[test]
    fn one_client_follows_at_most_half_of_what_a_session_may() {
        let (follows, closed) = follows();
        let listen = |client: &str, n: u32| Follower {
            holder: format!("{client} listen {n}").into(),
            client: client.into(),
            share: MAX_FOLLOWED_PER_CLIENT,
        };
        for i in 0..MAX_FOLLOWED_PER_CLIENT {
            let Ok(Turn::Open { opened, .. }) = follows.turn(&format!("r://{i}"), &listen("a", 1), &closed) else {
                panic!("follow {i} opens")
            };
            opened.send_replace(Opening::Open);
        }
        let Ok(Turn::Open { opened, .. }) = follows.turn("r://b", &name("b"), &closed) else { panic!() };
        opened.send_replace(Opening::Open);
        // Past its share, the client may follow nothing new, nor join what others follow.
        assert!(matches!(follows.turn("r://more", &listen("a", 2), &closed), Err(Full::Client)));
        assert!(matches!(follows.turn("r://b", &listen("a", 2), &closed), Err(Full::Client)));
        // What it follows already, another of its listen requests may join; other clients
        // have their own share.
        assert!(matches!(follows.turn("r://0", &listen("a", 2), &closed), Ok(Turn::Done)));
        assert!(matches!(follows.turn("r://0", &name("b"), &closed), Ok(Turn::Done)));
        assert!(matches!(follows.turn("r://more", &name("b"), &closed), Ok(Turn::Open { .. })));
        // Leaving one makes room again.
        assert!(matches!(follows.leave("r://1", "a listen 1", false), Left::Ended));
        assert!(matches!(follows.turn("r://b", &listen("a", 2), &closed), Ok(Turn::Done)));
    }

    #[test]
    fn the_room_a_client_has_is_what_following_would_find() {
        let (follows, closed) = follows();
        let (a, b) = (Follower { holder: "a listen 1".into(), client: "a".into(), share: 3 }, name("b"));
        for (uri, who) in [("r://a1", &a), ("r://a2", &a), ("r://b1", &b)] {
            let Ok(Turn::Open { opened, .. }) = follows.turn(uri, who, &closed) else { panic!("{uri} opens") };
            opened.send_replace(Opening::Open);
        }
        // `a` holds two of three: what it holds, then one more (new or another's), then none.
        let room = follows.room_for("a", 3, &["r://a1", "r://b1", "r://new", "r://a2", "r://a1"]);
        assert_eq!(room, [true, true, false, true, false]);
        assert_eq!(follows.room_for("a", 3, &["r://new", "r://b1"]), [true, false]);
        assert_eq!(follows.room_for("c", 3, &["r://a1", "r://x", "r://y", "r://z"]), [true, true, true, false]);
        // As `turn` finds it.
        assert!(matches!(follows.turn("r://new", &a, &closed), Ok(Turn::Open { .. })));
        assert!(matches!(follows.turn("r://b1", &a, &closed), Err(Full::Client)));
    }

    #[test]
    fn follows_still_being_opened_count_towards_the_share() {
        let (follows, closed) = follows();
        let _opening: Vec<_> = (0..MAX_FOLLOWED_PER_CLIENT)
            .map(|i| match follows.turn(&format!("r://{i}"), &name("a"), &closed) {
                Ok(Turn::Open { opened, .. }) => opened,
                _ => panic!("follow {i} opens"),
            })
            .collect();
        assert!(matches!(follows.turn("r://more", &name("a"), &closed), Err(Full::Client)));
    }
}
