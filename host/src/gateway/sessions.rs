//! HTTP sessions, capped. Every MCP session holds a gateway handler and rmcp's buffers;
//! clients that open sessions and walk away would grow memory without bound. At
//! `rebound.http.max_sessions`, a new session first closes the idle session (no stream
//! open: no call in flight, no GET stream) used least recently; only when every session
//! is busy does the least recently used busy one go. Its client gets 404 and, as the
//! protocol says, starts a new session.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::{Stream, StreamExt as _};
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::SessionManager;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::session::{RestoreOutcome, ServerSseMessage, SessionId};
use tokio::time::Instant;

/// rmcp's in-memory sessions, at most `max` of them, each closed after `idle` without
/// a request from its client.
pub struct CappedSessions {
    inner: LocalSessionManager,
    max: usize,
    idle: std::time::Duration,
    used: Arc<Mutex<HashMap<SessionId, Use>>>,
    /// A session was closed (idle, evicted or deleted) since the last round of `close_idle`.
    closed: std::sync::atomic::AtomicBool,
}

/// How a session is used: when last, how many of its streams are open, and who made it
/// (its client's address, once known).
#[derive(Debug, Clone)]
struct Use {
    at: Instant,
    streams: usize,
    owner: Option<Arc<str>>,
}

/// Counts a stream as open while it lives.
struct Open {
    used: Arc<Mutex<HashMap<SessionId, Use>>>,
    id: SessionId,
}

impl Drop for Open {
    fn drop(&mut self) {
        if let Some(u) = self.used.lock().expect("not poisoned").get_mut(&self.id) {
            u.streams = u.streams.saturating_sub(1);
            u.at = Instant::now();
        }
    }
}

impl CappedSessions {
    /// At most `max` sessions; one that sends nothing for `idle` is closed.
    pub fn new(max: usize, idle: std::time::Duration) -> Self {
        let mut inner = LocalSessionManager::default();
        // rmcp's own timer restarts with every message, the gateway's included (a log
        // line, a `list_changed`), so a client that walked away could be kept forever:
        // it stays only as a backstop, and `close_idle` decides from the client's side.
        inner.session_config.keep_alive = Some(idle.saturating_mul(4));
        Self { inner, max: max.max(1), idle, used: Arc::default(), closed: Default::default() }
    }

    /// Closes, from now on, every session whose client has sent nothing for `idle` and
    /// holds no stream open (a stream open is a client still listening); and a round after
    /// any session closed (idle, evicted or deleted), gives the memory it held back to the
    /// system.
    pub fn close_idle(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let every = (self.idle / 4).clamp(std::time::Duration::from_millis(250), std::time::Duration::from_secs(30));
        tokio::spawn(async move {
            let mut closed_last_round = false;
            loop {
                tokio::time::sleep(every).await;
                let Some(sessions) = weak.upgrade() else { return };
                let idle: Vec<SessionId> = sessions
                    .used
                    .lock()
                    .expect("not poisoned")
                    .iter()
                    .filter(|(_, u)| u.streams == 0 && u.at.elapsed() >= sessions.idle)
                    .map(|(id, _)| id.clone())
                    .collect();
                // A closed session's task ends after `close_session` returns: what it held is
                // free by the next round, and goes back to the system then.
                if closed_last_round {
                    tokio::task::spawn_blocking(crate::memory::trim);
                }
                for id in idle {
                    tracing::info!(session = %id, "closing an HTTP session idle for {} ms (rebound.http.session_idle_ms)", sessions.idle.as_millis());
                    let _ = sessions.close_session(&id).await;
                }
                closed_last_round = sessions.closed.swap(false, std::sync::atomic::Ordering::AcqRel);
            }
        });
    }

    /// Session `id` was made by `owner` (its client's address).
    pub fn made_by(&self, id: &str, owner: &str) {
        if let Some(u) = self.used.lock().expect("not poisoned").get_mut(id) {
            u.owner = Some(owner.into());
        }
    }

    /// Whether `id` names a session open now.
    pub fn knows(&self, id: &str) -> bool {
        self.used.lock().expect("not poisoned").contains_key(id)
    }

    fn touch(&self, id: &SessionId) {
        if let Some(u) = self.used.lock().expect("not poisoned").get_mut(id) {
            u.at = Instant::now();
        }
    }

    /// Marks a stream of `id` open until the returned guard is dropped.
    fn open(&self, id: &SessionId) -> Open {
        if let Some(u) = self.used.lock().expect("not poisoned").get_mut(id) {
            u.streams += 1;
            u.at = Instant::now();
        }
        Open { used: self.used.clone(), id: id.clone() }
    }

    /// Makes room for one more session, under one lock so that two new sessions cannot
    /// both take the last place: the sessions to close, already forgotten here. They are
    /// taken from the address that holds the most sessions, so that a client opening
    /// session after session closes its own, not others'; among equals, idle ones (least
    /// recently used first) before busy ones.
    fn make_room(&self) -> Vec<SessionId> {
        let mut used = self.used.lock().expect("not poisoned");
        let over = (used.len() + 1).saturating_sub(self.max);
        if over == 0 {
            return Vec::new();
        }
        let owner = |id: &SessionId, u: &Use| u.owner.clone().unwrap_or_else(|| id.clone());
        let mut held: HashMap<Arc<str>, usize> = HashMap::new();
        for (id, u) in used.iter() {
            *held.entry(owner(id, u)).or_default() += 1;
        }
        let mut order: Vec<_> = used
            .iter()
            .map(|(id, u)| (id.clone(), (std::cmp::Reverse(held[&owner(id, u)]), u.streams > 0, u.at)))
            .collect();
        order.sort_by_key(|(_, key)| *key);
        let evicted: Vec<SessionId> = order.into_iter().take(over).map(|(id, _)| id).collect();
        for id in &evicted {
            used.remove(id);
        }
        evicted
    }
}

/// `stream`, counted as open (by `open`) for as long as it lives.
fn counted<S: Stream + Send + Sync + 'static>(
    open: Open,
    stream: S,
) -> impl Stream<Item = S::Item> + Send + Sync + 'static {
    stream.map(move |item| {
        let _open = &open;
        item
    })
}

impl SessionManager for CappedSessions {
    type Error = <LocalSessionManager as SessionManager>::Error;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        for old in self.make_room() {
            self.closed.store(true, std::sync::atomic::Ordering::Release);
            tracing::info!(session = %old, "closing the least recently used HTTP session: rebound.http.max_sessions ({}) reached", self.max);
            let _ = self.inner.close_session(&old).await;
        }
        let (id, transport) = self.inner.create_session().await?;
        self.used.lock().expect("not poisoned").insert(id.clone(), Use { at: Instant::now(), streams: 0, owner: None });
        Ok((id, transport))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        self.touch(id);
        self.inner.initialize_session(id, message).await
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        self.inner.has_session(id).await
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        self.used.lock().expect("not poisoned").remove(id);
        self.closed.store(true, std::sync::atomic::Ordering::Release);
        self.inner.close_session(id).await
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let open = self.open(id);
        Ok(counted(open, self.inner.create_stream(id, message).await?))
    }

    async fn accept_message(&self, id: &SessionId, message: ClientJsonRpcMessage) -> Result<(), Self::Error> {
        self.touch(id);
        self.inner.accept_message(id, message).await
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let open = self.open(id);
        Ok(counted(open, self.inner.create_standalone_stream(id).await?))
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let open = self.open(id);
        Ok(counted(open, self.inner.resume(id, last_event_id).await?))
    }

    async fn restore_session(&self, id: SessionId) -> Result<RestoreOutcome<Self::Transport>, Self::Error> {
        self.inner.restore_session(id).await
    }

    fn event_store(&self) -> Option<std::sync::Arc<dyn rmcp::transport::streamable_http_server::session::EventStore>> {
        self.inner.event_store()
    }
}
