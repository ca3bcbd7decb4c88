//! Connections whose client stops reading. An answer the client does not take waits in
//! the socket's buffer, then in hyper's and rmcp's, for as long as the connection stays
//! open: a client that sends calls and never reads their answers would hold them all, for
//! hours, with nothing to tell it from a slow link. So a write that makes no progress for
//! [`STALL`] ends the connection, and with it whatever waited to be written on it. A
//! stream with nothing to say writes nothing and is never cut; a reader that keeps taking
//! what it was sent, however slowly, is never cut either (its backlog in the system
//! shrinking counts, [`Backlog`]).

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

/// What a connection has written that its client has not yet taken, where the system
/// says: Linux wakes a writer only once a third of a full send buffer has drained, so a
/// client reading a few KiB a second behind megabytes can leave a write waiting for
/// minutes while it reads. A backlog that shrank is progress.
pub(super) trait Backlog {
    fn backlog(&self) -> Option<usize>;
}

impl Backlog for TcpStream {
    #[allow(unsafe_code, reason = "an ioctl that reads one number of the socket's")]
    fn backlog(&self) -> Option<usize> {
        use std::os::fd::AsRawFd;
        let mut queued: libc::c_int = 0;
        // SAFETY: TIOCOUTQ (SIOCOUTQ) writes one int, the bytes in the socket's send
        // queue, through the pointer, which points at one; the descriptor is this
        // stream's, open for as long as `self` is.
        let said = unsafe { libc::ioctl(self.as_raw_fd(), libc::TIOCOUTQ, &raw mut queued) };
        (said == 0).then(|| usize::try_from(queued).unwrap_or(0))
    }
}

/// A connection whose writes fail once one has waited `limit` without progress.
pub(super) struct Watched<S> {
    io: S,
    limit: Duration,
    /// Set when a write first finds no room, cleared by any progress; with the backlog
    /// then.
    stalled: Option<(Pin<Box<Sleep>>, Option<usize>)>,
}

impl<S: Backlog> Watched<S> {
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
        loop {
            let io = &self.io;
            let (sleep, then) = self.stalled.get_or_insert_with(|| (Box::pin(tokio::time::sleep(limit)), io.backlog()));
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            // Taken, if slowly: wait on from here.
            if let (Some(now), Some(then)) = (io.backlog(), *then)
                && now < then
            {
                self.stalled = None;
                continue;
            }
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client read nothing for {} s", limit.as_secs()),
            )));
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Backlog + Unpin> AsyncWrite for Watched<S> {
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

    /// A pipe in memory has no system queue to read.
    impl Backlog for tokio::io::DuplexStream {
        fn backlog(&self) -> Option<usize> {
            None
        }
    }

    /// A real connection whose client reads a little, too little for the system to wake
    /// the writer: its shrinking backlog is progress, and only a limit's length without
    /// any ends it.
    #[tokio::test(start_paused = true)]
    async fn a_reader_too_slow_to_wake_the_writer_is_not_cut_while_it_reads() {
        use tokio::io::AsyncReadExt as _;
        // Buffers of fixed sizes (no autotuning): reading 64 KiB of a 256 KiB receive
        // buffer never drains a third of the 1 MiB send buffer behind it.
        let listening = tokio::net::TcpSocket::new_v4().unwrap();
        listening.set_send_buffer_size(1 << 20).unwrap();
        listening.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let listener = listening.listen(1).unwrap();
        let connecting = tokio::net::TcpSocket::new_v4().unwrap();
        connecting.set_recv_buffer_size(256 << 10).unwrap();
        let mut client = connecting.connect(listener.local_addr().unwrap()).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let mut io = Watched::new(server, LIMIT);
        let chunk = vec![7u8; 64 << 10];
        while let Ok(Ok(_)) = tokio::time::timeout(Duration::from_millis(1), io.write(&chunk)).await {}
        let stalled = tokio::time::Instant::now();
        let before = io.io.backlog().expect("a socket says its backlog");
        let mut taken = vec![0u8; 64 << 10];
        client.read_exact(&mut taken).await.unwrap();
        // The system moves what the client made room for on its own: looked for, not
        // waited a set time for.
        let moved = (0..5_000).any(|_| {
            std::thread::sleep(Duration::from_millis(1));
            io.io.backlog().unwrap() < before
        });
        assert!(moved, "the system moved what the client made room for");
        let error = tokio::time::timeout(LIMIT * 3, io.write_all(&chunk)).await.expect("ends").unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        let waited = stalled.elapsed();
        assert!(waited >= 2 * LIMIT - Duration::from_millis(2), "cut after {waited:?}, while the client read");
    }

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
