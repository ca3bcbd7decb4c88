//! The HTTP front's connections: accepted, served by hyper with a deadline for each
//! request's head, counted per network, and closed gracefully on shutdown.
//!
//! Nothing above hyper sees a connection before its first request head has arrived: not
//! the `Host` check, not the token. So a connection that sends nothing, or a head a byte
//! at a time, must be ended here, or anyone who reaches the port holds descriptors and
//! header buffers for as long as they like, until no client can connect. A head (the
//! first one, or the next on a kept-alive connection) has [`HEAD_TIMEOUT`] to arrive; and
//! one network (an IPv4 address, an IPv6 /48; every loopback address is one) holds at
//! most `per_network` connections at once, a connection past that being closed as soon
//! as it is accepted. A trusted proxy's connections carry many clients and are not
//! counted so.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt as _;

use super::client_ip::{Proxies, loopback_as_one};
use crate::lasting::Locked as _;

/// How long a request's head may take to arrive, counted from when the connection opens
/// or its last answer was written: past it the connection closes (an idle kept-alive one
/// included, as clients expect of any server).
pub(super) const HEAD_TIMEOUT: Duration = Duration::from_secs(30);

/// Connections open per network.
#[derive(Clone)]
pub(super) struct Counted {
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
    per_network: usize,
    proxies: Proxies,
}

/// One connection's place in its network's count, given back when the connection ends.
pub(super) struct Held {
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
    network: IpAddr,
}

impl Counted {
    pub(super) fn new(per_network: usize, proxies: Proxies) -> Self {
        Self { open: Arc::default(), per_network, proxies }
    }

    /// A place for a connection from `peer`; `Ok(None)` for a trusted proxy's, `Err` with
    /// the network when it has no room.
    pub(super) fn admit(&self, peer: IpAddr) -> Result<Option<Held>, IpAddr> {
        let peer = peer.to_canonical();
        if self.proxies.trusted.iter().any(|block| block.contains(&peer)) {
            return Ok(None);
        }
        let network = network(peer);
        let mut open = self.open.locked();
        let count = open.entry(network).or_default();
        if *count >= self.per_network {
            return Err(network);
        }
        *count += 1;
        Ok(Some(Held { open: self.open.clone(), network }))
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut open = self.open.locked();
        if let Some(count) = open.get_mut(&self.network) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.network);
            }
        }
    }
}

/// The network `peer` counts under: an IPv4 address itself, an IPv6 one its /48, every
/// loopback address one.
fn network(peer: IpAddr) -> IpAddr {
    match loopback_as_one(peer) {
        IpAddr::V6(v6) => {
            let [a, b, c, ..] = v6.segments();
            IpAddr::V6(std::net::Ipv6Addr::new(a, b, c, 0, 0, 0, 0, 0))
        }
        v4 => v4,
    }
}

/// Serves `app` on the connections `listener` accepts, until `stop`: then no connection
/// is accepted, each open one ends once its request in flight is answered, and this
/// returns when all have.
pub(super) async fn serve<L>(mut listener: L, app: Router, counted: Counted, stop: CancellationToken)
where
    L: axum::serve::Listener<Addr = SocketAddr>,
{
    let connections = TaskTracker::new();
    let refusals = crate::pace::LogBudget::new(10, Duration::from_secs(60));
    loop {
        let (io, peer) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stop.cancelled() => break,
        };
        let held = match counted.admit(peer.ip()) {
            Ok(held) => held,
            Err(network) => {
                if refusals.take() {
                    tracing::warn!(
                        "a connection from {peer} closed: its network ({network}) has {} open already",
                        counted.per_network
                    );
                }
                continue;
            }
        };
        connections.spawn(serve_one(io, peer, app.clone(), held, stop.clone()));
    }
    // Closed at once: a client connecting from now on is refused, not left waiting.
    drop(listener);
    connections.close();
    connections.wait().await;
}

/// One connection, with `ConnectInfo` for every request on it.
async fn serve_one<I>(io: I, peer: SocketAddr, app: Router, held: Option<Held>, stop: CancellationToken)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
        request.extensions_mut().insert(ConnectInfo(peer));
        app.clone().oneshot(request.map(Body::new))
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(HEAD_TIMEOUT);
    let mut connection = pin!(builder.serve_connection(TokioIo::new(io), service));
    let ended: Result<(), hyper::Error> = tokio::select! {
        ended = connection.as_mut() => ended,
        () = stop.cancelled() => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(e) = ended {
        tracing::trace!("connection from {peer} ended: {e}");
    }
    drop(held);
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::{TcpListener, TcpStream};
    use tokio::time::Instant;

    use super::*;

    fn no_proxies() -> Proxies {
        Proxies { trusted: Arc::from([]), header: Default::default() }
    }

    /// When the gateway ends `stream`, within twice `HEAD_TIMEOUT`, and what it said first.
    async fn ended(mut stream: TcpStream) -> (Instant, String) {
        let mut said = Vec::new();
        let read = tokio::time::timeout(HEAD_TIMEOUT * 2, stream.read_to_end(&mut said)).await;
        assert!(read.is_ok(), "the connection is still open");
        (Instant::now(), String::from_utf8_lossy(&said).into_owned())
    }

    /// A connection whose request head does not arrive within `HEAD_TIMEOUT` (nothing
    /// sent, or a head in part) is ended, while a whole request is answered; a network
    /// past its share has a new connection closed at once.
    #[tokio::test(start_paused = true)]
    async fn a_head_that_never_arrives_ends_its_connection_and_a_full_network_takes_no_more() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let late = || async {
            tokio::time::sleep(HEAD_TIMEOUT * 3).await;
            "late"
        };
        let app =
            Router::new().route("/", axum::routing::get(|| async { "hi" })).route("/late", axum::routing::get(late));
        let stop = CancellationToken::new();
        let server = tokio::spawn(serve(listener, app, Counted::new(2, no_proxies()), stop.clone()));
        let start = Instant::now();
        let mut partial = TcpStream::connect(addr).await.unwrap();
        partial.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nX-Pad: aaaa").await.unwrap();
        let silent = TcpStream::connect(addr).await.unwrap();
        let ((partial_at, _), (silent_at, _)) = tokio::join!(ended(partial), ended(silent));
        assert!(partial_at - start >= HEAD_TIMEOUT && silent_at - start >= HEAD_TIMEOUT);

        let mut whole = TcpStream::connect(addr).await.unwrap();
        whole.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
        let (_, answer) = ended(whole).await;
        assert!(answer.starts_with("HTTP/1.1 200") && answer.ends_with("hi"), "{answer}");

        // An answer that takes longer than a head may is not cut short.
        let mut slow = TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET /late HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
        let mut answer = Vec::new();
        slow.read_to_end(&mut answer).await.unwrap();
        assert!(String::from_utf8_lossy(&answer).ends_with("late"));

        let held = [TcpStream::connect(addr).await.unwrap(), TcpStream::connect(addr).await.unwrap()];
        tokio::time::sleep(Duration::from_millis(10)).await;
        let asked = Instant::now();
        let (closed_at, said) = ended(TcpStream::connect(addr).await.unwrap()).await;
        assert!(closed_at - asked < HEAD_TIMEOUT && said.is_empty(), "the third connection is closed at once");
        drop(held);
        stop.cancel();
        server.await.unwrap();
    }

    #[test]
    fn a_network_holds_its_share_of_connections_and_a_trusted_proxy_is_not_counted() {
        let proxies = Proxies { trusted: Arc::from(["10.0.0.1/32".parse().unwrap()]), header: Default::default() };
        let counted = Counted::new(2, proxies);
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let first = counted.admit(ip("2001:db8:1:2::1")).unwrap();
        let _second = counted.admit(ip("2001:db8:1:ffff::9")).unwrap();
        assert_eq!(counted.admit(ip("2001:db8:1::5")).err(), Some(ip("2001:db8:1::")), "one /48");
        assert!(counted.admit(ip("2001:db8:2::1")).is_ok(), "another network");
        drop(first);
        assert!(counted.admit(ip("2001:db8:1::5")).is_ok(), "a place given back");
        let (_a, _b) = (counted.admit(ip("127.0.0.1")).unwrap(), counted.admit(ip("127.0.0.2")).unwrap());
        assert!(counted.admit(ip("::1")).is_err(), "every loopback address is one");
        for _ in 0..10 {
            assert!(matches!(counted.admit(ip("10.0.0.1")), Ok(None)), "a trusted proxy");
        }
    }
}
