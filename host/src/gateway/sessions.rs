//! HTTP sessions, capped. Every MCP session holds a gateway handler and rmcp's buffers;
//! clients that open sessions and walk away would grow memory without bound. At
//! `rebound.http.max_sessions`, a new session closes one of the network holding the most
//! sessions (an IPv6 /48; an IPv4 address is its own), of its address holding the most
//! (an IPv6 one by its /64): so that sessions opened from the many /64s one IPv6 site
//! has cannot push out everyone else's. (IPv4 addresses are not grouped: many users
//! share one behind NAT, and a /24 may be a carrier's pool of unrelated users.) Among those, the idle session (no stream open: no call in flight, no
//! GET stream) used least recently goes first; a busy one only when none is idle. Its
//! client gets 404 and, as the protocol says, starts a new session.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::{Stream, StreamExt as _};
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::SessionManager;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::session::{RestoreOutcome, ServerSseMessage, SessionId};
use tokio::time::Instant;

use crate::lasting::Locked;

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
/// (once known).
#[derive(Debug, Clone)]
struct Use {
    at: Instant,
    streams: usize,
    owner: Option<Maker>,
}

/// Who made a session: its client's address (an IPv6 one by its /64, as every share per
/// address is counted) and the network around it (an IPv6 /48; an IPv4 address alone).
#[derive(Debug, Clone)]
struct Maker {
    address: Arc<str>,
    network: Arc<str>,
}

impl Maker {
    fn of(ip: std::net::IpAddr) -> Self {
        let address: Arc<str> = super::http::address_client(ip).into();
        let network = super::http::site_of(&address);
        Self { address, network }
    }
}

/// Counts a stream as open while it lives.
struct Open {
    used: Arc<Mutex<HashMap<SessionId, Use>>>,
    id: SessionId,
}

impl Drop for Open {
    fn drop(&mut self) {
        if let Some(u) = self.used.locked().get_mut(&self.id) {
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
        crate::lasting::spawn("closing of idle HTTP sessions", move || {
            let weak = weak.clone();
            async move {
                let mut closed_last_round = false;
                loop {
                    tokio::time::sleep(every).await;
                    let Some(sessions) = weak.upgrade() else { return };
                    let idle: Vec<SessionId> = sessions
                        .used
                        .locked()
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
            }
        });
    }

    /// Session `id` was made by a client at `ip`.
    pub fn made_by(&self, id: &str, ip: std::net::IpAddr) {
        if let Some(u) = self.used.locked().get_mut(id) {
            u.owner = Some(Maker::of(ip));
        }
    }

    /// Whether `id` names a session open now.
    pub fn knows(&self, id: &str) -> bool {
        self.used.locked().contains_key(id)
    }

    fn touch(&self, id: &SessionId) {
        if let Some(u) = self.used.locked().get_mut(id) {
            u.at = Instant::now();
        }
    }

    /// Marks a stream of `id` open until the returned guard is dropped.
    fn open(&self, id: &SessionId) -> Open {
        if let Some(u) = self.used.locked().get_mut(id) {
            u.streams += 1;
            u.at = Instant::now();
        }
        Open { used: self.used.clone(), id: id.clone() }
    }

    /// Makes room for one more session, under one lock so that two new sessions cannot
    /// both take the last place: the sessions to close (see [`eviction_order`]), already
    /// forgotten here.
    fn make_room(&self) -> Vec<SessionId> {
        let mut used = self.used.locked();
        let over = (used.len() + 1).saturating_sub(self.max);
        if over == 0 {
            return Vec::new();
        }
        let evicted: Vec<SessionId> = eviction_order(&used).into_iter().take(over).collect();
        for id in &evicted {
            used.remove(id);
        }
        evicted
    }
}

/// The sessions in the order they are closed to make room: first those of the network
/// holding the most sessions, within it of the address holding the most, so that a
/// client opening session after session closes its own, not others', however many
/// addresses of one network it has; among equals, idle ones (least recently used first)
/// before busy ones. A session whose maker is not known yet counts as its own.
fn eviction_order(used: &HashMap<SessionId, Use>) -> Vec<SessionId> {
    let keys = |id: &SessionId, u: &Use| match &u.owner {
        Some(m) => (m.network.clone(), m.address.clone()),
        None => (id.clone(), id.clone()),
    };
    let (mut networks, mut addresses) = (HashMap::<Arc<str>, usize>::new(), HashMap::<Arc<str>, usize>::new());
    for (id, u) in used {
        let (network, address) = keys(id, u);
        *networks.entry(network).or_default() += 1;
        *addresses.entry(address).or_default() += 1;
    }
    let mut order: Vec<_> = used
        .iter()
        .map(|(id, u)| {
            let (network, address) = keys(id, u);
            let held = (std::cmp::Reverse(networks[&network]), std::cmp::Reverse(addresses[&address]));
            (id.clone(), (held, u.streams > 0, u.at))
        })
        .collect();
    order.sort_by_key(|a| a.1);
    order.into_iter().map(|(id, _)| id).collect()
}

/// The client address of the HTTP request that carried `message` (`http::ClientIp`).
fn maker_of(message: &ClientJsonRpcMessage) -> Option<std::net::IpAddr> {
    let rmcp::model::JsonRpcMessage::Request(request) = message else { return None };
    super::http::ClientIp::of(rmcp::model::GetExtensions::extensions(&request.request))
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
            tracing::info!(session = %old, "closing an HTTP session (of the network, then the address, holding the most; idle before busy; then the least recently used): rebound.http.max_sessions ({}) reached", self.max);
            let _ = self.inner.close_session(&old).await;
        }
        let (id, transport) = self.inner.create_session().await?;
        self.used.locked().insert(id.clone(), Use { at: Instant::now(), streams: 0, owner: None });
        Ok((id, transport))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        self.touch(id);
        // Its maker is known from here, not only once the answer is on its way: a client
        // that hangs up meanwhile leaves a session of its own (rmcp keeps it), which must
        // not count as another client's when room is made.
        if let Some(ip) = maker_of(&message) {
            self.made_by(id, ip);
        }
        self.inner.initialize_session(id, message).await
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        self.inner.has_session(id).await
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        self.used.locked().remove(id);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The address `initialize_session` records as the session's maker is that of the
    /// HTTP request the `initialize` came in (rmcp puts the request's parts in it).
    #[test]
    fn an_initializes_maker_is_its_requests_address() {
        use rmcp::model::{ClientRequest, InitializeRequest, JsonRpcMessage, JsonRpcRequest, NumberOrString};
        let ip: std::net::IpAddr = [198, 51, 100, 4].into();
        let (mut parts, ()) = axum::http::Request::new(()).into_parts();
        parts.extensions.insert(super::super::http::ClientIp(ip));
        let mut request = ClientRequest::InitializeRequest(InitializeRequest::new(Default::default()));
        rmcp::model::GetExtensions::extensions_mut(&mut request).insert(parts);
        let message = JsonRpcMessage::Request(JsonRpcRequest::new(NumberOrString::Number(0), request));
        assert_eq!(maker_of(&message), Some(ip));
        let bare = ClientRequest::InitializeRequest(InitializeRequest::new(Default::default()));
        assert_eq!(maker_of(&JsonRpcMessage::Request(JsonRpcRequest::new(NumberOrString::Number(0), bare))), None);
    }

    fn session(ip: &str, streams: usize, at: Instant) -> Use {
        Use { at, streams, owner: Some(Maker::of(ip.parse().unwrap())) }
    }

    /// Sessions opened from many addresses of one network close one another, not the
    /// sessions of clients elsewhere; within a network, the address holding the most goes
    /// first, and idle sessions before busy ones.
    #[tokio::test(start_paused = true)]
    async fn room_is_made_from_the_network_and_address_holding_the_most() {
        let t0 = Instant::now();
        let later = |ms: u64| t0 + std::time::Duration::from_millis(ms);
        let mut used = HashMap::new();
        used.insert(SessionId::from("alice"), session("192.0.2.7", 0, t0));
        used.insert(SessionId::from("bob"), session("2001:db8:aaaa:1::5", 0, later(1)));
        // One /48, three /64s: one session each, all newer and busy.
        for n in 0..3u16 {
            let ip = format!("2001:db8:bbbb:{n:x}::1");
            used.insert(SessionId::from(format!("spray{n}")), session(&ip, 1, later(10 + u64::from(n))));
        }
        let order = eviction_order(&used);
        assert!(order[..3].iter().all(|id| id.starts_with("spray")), "{order:?}");
        assert_eq!(&*order[3], "alice", "least recently used of the rest");
        // Within the network, the address holding the most, then idle before busy.
        used.insert(SessionId::from("spray0b"), session("2001:db8:bbbb:0::2", 1, later(20)));
        used.insert(SessionId::from("spray0c"), session("2001:db8:bbbb:0::3", 0, later(30)));
        let order = eviction_order(&used);
        assert_eq!(order[..3].iter().map(|id| &**id).collect::<Vec<_>>(), ["spray0c", "spray0", "spray0b"]);
        // IPv4 addresses are their own: users of one /24 (a carrier's NAT pool) are not
        // closed for the sake of one address holding more.
        let mut used = HashMap::new();
        for n in 0..3 {
            used.insert(SessionId::from(format!("pool{n}")), session(&format!("203.0.113.{n}"), 0, later(n)));
        }
        used.insert(SessionId::from("heavy1"), session("198.51.100.9", 1, later(5)));
        used.insert(SessionId::from("heavy2"), session("198.51.100.9", 1, later(6)));
        let order = eviction_order(&used);
        assert!(order[..2].iter().all(|id| id.starts_with("heavy")), "{order:?}");
    }

    /// A session of rmcp's, initialised and served by a handler that does nothing.
    async fn opened(sessions: &CappedSessions) -> SessionId {
        struct Quiet;
        impl rmcp::ServerHandler for Quiet {}
        let (id, transport) = sessions.create_session().await.unwrap();
        tokio::spawn(async move {
            use rmcp::ServiceExt as _;
            if let Ok(service) = Quiet.serve(transport).await {
                let _ = service.waiting().await;
            }
        });
        let message = |json: serde_json::Value| serde_json::from_value::<ClientJsonRpcMessage>(json).unwrap();
        let init = message(serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}));
        sessions.initialize_session(&id, init).await.unwrap();
        let initialized = message(serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        sessions.accept_message(&id, initialized).await.unwrap();
        id
    }

    /// A session whose client sends nothing for `idle` is closed, unless it holds a
    /// stream open (a client still listening): that one ends only once nothing has passed
    /// either way for four times `idle` (rmcp's keep-alive), and is closed after.
    #[tokio::test(start_paused = true)]
    async fn a_session_listening_on_a_stream_outlives_idle_until_nothing_passes_for_four_times_it() {
        let idle = std::time::Duration::from_secs(10);
        let sessions = Arc::new(CappedSessions::new(8, idle));
        sessions.close_idle();
        let (silent, listening) = (opened(&sessions).await, opened(&sessions).await);
        let mut stream = Box::pin(sessions.create_standalone_stream(&listening).await.unwrap());
        tokio::time::sleep(idle * 2).await;
        assert!(!sessions.knows(&silent), "silent, no stream open: closed past idle");
        assert!(!sessions.has_session(&silent).await.unwrap());
        assert!(sessions.knows(&listening), "a client still listening is kept");
        assert!(sessions.has_session(&listening).await.unwrap());
        // Nothing passes on its stream: four times idle after its last message, rmcp ends
        // the session and its stream with it.
        assert!(tokio::time::timeout(idle, stream.next()).await.is_err(), "open at three times idle");
        let ended = tokio::time::timeout(idle * 2, stream.next()).await;
        assert!(matches!(ended, Ok(None)), "the stream ended");
        drop(stream); // as the HTTP front does with an ended response body
        // rmcp keeps an ended session's entry until it is closed: the gateway closes it,
        // now idle with no stream open.
        tokio::time::sleep(idle * 2).await;
        assert!(!sessions.knows(&listening), "the gateway forgot it");
        assert!(!sessions.has_session(&listening).await.unwrap(), "and rmcp too");
    }
}
