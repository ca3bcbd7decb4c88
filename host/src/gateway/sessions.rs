//! HTTP sessions, capped. Every MCP session holds a gateway handler and rmcp's buffers;
//! clients that open sessions and walk away would grow memory without bound. At
//! `rebound.http.max_sessions`, a new session first evicts the one used least recently
//! (its client gets 404 and, as the protocol says, starts a new session).

use std::collections::HashMap;
use std::sync::Mutex;

use futures::Stream;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::SessionManager;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::session::{RestoreOutcome, ServerSseMessage, SessionId};
use tokio::time::Instant;

/// rmcp's in-memory sessions, at most `max` of them.
pub struct CappedSessions {
    inner: LocalSessionManager,
    max: usize,
    /// When each session was last used.
    used: Mutex<HashMap<SessionId, Instant>>,
}

impl CappedSessions {
    pub fn new(max: usize) -> Self {
        Self { inner: LocalSessionManager::default(), max: max.max(1), used: Mutex::default() }
    }

    fn touch(&self, id: &SessionId) {
        if let Some(at) = self.used.lock().expect("not poisoned").get_mut(id) {
            *at = Instant::now();
        }
    }

    /// The sessions to close so that one more fits: the least recently used first.
    fn to_evict(&self) -> Vec<SessionId> {
        let used = self.used.lock().expect("not poisoned");
        let over = (used.len() + 1).saturating_sub(self.max);
        let mut by_age: Vec<(&SessionId, &Instant)> = used.iter().collect();
        by_age.sort_by_key(|(_, at)| **at);
        by_age.into_iter().take(over).map(|(id, _)| id.clone()).collect()
    }
}

impl SessionManager for CappedSessions {
    type Error = <LocalSessionManager as SessionManager>::Error;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        for old in self.to_evict() {
            tracing::info!(session = %old, "closing the least recently used HTTP session: rebound.http.max_sessions ({}) reached", self.max);
            self.used.lock().expect("not poisoned").remove(&old);
            let _ = self.inner.close_session(&old).await;
        }
        let (id, transport) = self.inner.create_session().await?;
        self.used.lock().expect("not poisoned").insert(id.clone(), Instant::now());
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
        self.inner.close_session(id).await
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.touch(id);
        self.inner.create_stream(id, message).await
    }

    async fn accept_message(&self, id: &SessionId, message: ClientJsonRpcMessage) -> Result<(), Self::Error> {
        self.touch(id);
        self.inner.accept_message(id, message).await
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.touch(id);
        self.inner.create_standalone_stream(id).await
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.touch(id);
        self.inner.resume(id, last_event_id).await
    }

    async fn restore_session(&self, id: SessionId) -> Result<RestoreOutcome<Self::Transport>, Self::Error> {
        self.inner.restore_session(id).await
    }

    fn event_store(&self) -> Option<std::sync::Arc<dyn rmcp::transport::streamable_http_server::session::EventStore>> {
        self.inner.event_store()
    }
}
