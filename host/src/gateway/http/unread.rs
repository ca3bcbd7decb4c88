//! Connections whose client stops reading. An answer the client does not take waits in
//! the socket's buffer, then in hyper's and rmcp's, for as long as the connection stays
//! open: a client that sends calls and never reads their answers would hold them all, for
//! hours, with nothing to tell it from a slow link. So a write that makes no progress for
//! [`STALL`] ends the connection, and with it whatever waited to be written on it. A
//! stream with nothing to say writes nothing and is never cut; a slow reader that takes a
//! byte now and then is never cut either.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Sleep;

/// How long a write may find the client's side full before the connection ends.
pub(super) const STALL: Duration = Duration::from_secs(60);

/// The HTTP front's listener: each connection it accepts is [`Watched`].
pub(super) struct Listener(pub(super) TcpListener);

impl axum::serve::Listener for Listener {
    type Io = Watched<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let (io, addr) = axum::serve::Listener::accept(&mut self.0).await;
        (Watched::new(io, STALL), addr)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.0.local_addr()
    }
}

/// A connection whose writes fail once one has waited `limit` without progress.
pub(super) struct Watched<S> {
    io: S,
    limit: Duration,
    /// Set when a write first finds no room, cleared by any progress.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<S> Watched<S> {
    fn new(io: S, limit: Duration) -> Self {
        Self { io, limit, stalled: None }
    }

    pub(super) fn get_mut(&mut self) -> &mut S {
        &mut self.io
    }

    /// What a write that returned `poll` means: progress clears the watch, a wait starts
    /// it (or finds it run out).
    fn watch<T>(&mut self, poll: Poll<io::Result<T>>, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        if poll.is_ready() {
            self.stalled = None;
            return poll;
        }
        let limit = self.limit;
        let stalled = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match stalled.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client read nothing for {} s", limit.as_secs()),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.io).poll_write(cx, buf);
        self.watch(poll, cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.watch(poll, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.io).poll_flush(cx);
        self.watch(poll, cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.io).poll_shutdown(cx);
        self.watch(poll, cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const LIMIT: Duration = Duration::from_secs(60);

    /// Fills `io` until a write would wait, and says how much went in.
    async fn fill(io: &mut Watched<tokio::io::DuplexStream>) -> usize {
        let mut written = 0;
        let chunk = [7u8; 256];
        while let Ok(Ok(n)) = tokio::time::timeout(Duration::from_millis(1), io.write(&chunk)).await {
            written += n;
        }
        written
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_the_client_never_takes_ends_the_connection() {
        let (near, _far) = tokio::io::duplex(1024);
        let mut io = Watched::new(near, LIMIT);
        assert_eq!(fill(&mut io).await, 1024);
        let started = tokio::time::Instant::now();
        let error = tokio::time::timeout(LIMIT * 2, io.write_all(&[1; 64]))
            .await
            .expect("a write nobody reads must end")
            .expect_err("a write nobody reads must fail");
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        // The wait began with `fill`'s last write, which found no room a millisecond before.
        assert!(started.elapsed() >= LIMIT - Duration::from_millis(1), "cut after {:?}", started.elapsed());
        assert!(started.elapsed() < LIMIT + Duration::from_secs(1), "cut after {:?}", started.elapsed());
    }

    #[tokio::test(start_paused = true)]
    async fn a_reader_that_takes_a_little_now_and_then_is_never_cut() {
        let (near, mut far) = tokio::io::duplex(1024);
        let mut io = Watched::new(near, LIMIT);
        fill(&mut io).await;
        // Slower than the limit in all, but never a limit's length without taking a byte.
        let reader = tokio::spawn(async move {
            let mut byte = [0u8; 16];
            let mut taken = 0;
            while taken < 64 * 16 + 1024 {
                tokio::time::sleep(LIMIT / 2).await;
                taken += far.read(&mut byte).await.unwrap();
            }
            far
        });
        io.write_all(&[1; 64 * 16]).await.expect("a slow reader's writes go through");
        io.flush().await.unwrap();
        let _far = reader.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_with_nothing_to_write_is_never_cut() {
        let (near, mut far) = tokio::io::duplex(1024);
        let mut io = Watched::new(near, LIMIT);
        tokio::time::sleep(LIMIT * 10).await;
        io.write_all(b"late").await.expect("an idle connection still writes");
        let mut got = [0u8; 4];
        far.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"late");
    }
}
