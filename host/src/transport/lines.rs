//! Newline-delimited JSON-RPC, the stdio transport of MCP, framed by Rebound on both of
//! its sides (the client on the gateway's stdin, each server on its child's stdout):
//!
//! - a line is bounded as it is read, in bytes and in what it would weigh once read
//!   (`crate::weight`: a line of `0,0,0…` takes a hundred times its bytes as JSON
//!   values): one past either bound is skipped, never buffered;
//! - a large line's buffer is given back once the line is handled, not kept at its
//!   high-water mark for the life of the connection (rmcp's transport keeps it, so a
//!   burst of large calls left their size resident per server);
//! - each message is written whole under a lock, and nothing is kept between writes.

use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use rmcp::ErrorData;
use rmcp::RoleClient;
use rmcp::model::{ClientNotification, JsonRpcMessage};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio_util::sync::CancellationToken;

use super::id_scan::{IdScan, Scanned};
use super::malformed::{INVALID_REQUEST, PARSE_ERROR, Unreadable};
use super::tasks::{ClientTasks, Dropped};
use super::typed::Awaited;
use crate::weight::Weigher;

/// Output: one JSON message a line, written whole under a lock.
pub struct Out<W> {
    write: Arc<tokio::sync::Mutex<Option<W>>>,
    /// Bytes the other side has taken so far: whether a write that holds the output moves.
    taken: Arc<AtomicU64>,
}

impl<W> Clone for Out<W> {
    fn clone(&self) -> Self {
        Self { write: self.write.clone(), taken: self.taken.clone() }
    }
}

impl<W: AsyncWrite + Unpin + Send + 'static> Out<W> {
    pub fn new(write: W) -> Self {
        Self { write: Arc::new(tokio::sync::Mutex::new(Some(write))), taken: Arc::default() }
    }

    /// Writes `line` (one message, without its newline) and flushes it.
    pub async fn write(&self, mut line: Vec<u8>) -> std::io::Result<()> {
        line.push(b'\n');
        let mut write = self.write.lock().await;
        let Some(write) = write.as_mut() else {
            return Err(std::io::Error::new(std::io::ErrorKind::NotConnected, "the output is closed"));
        };
        self.write_counted(write, &line).await
    }

    /// Writes all of `line` to `write`, counting what is taken as it goes, and flushes it.
    async fn write_counted(&self, write: &mut W, mut line: &[u8]) -> std::io::Result<()> {
        while !line.is_empty() {
            let n = write.write(line).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            self.taken.fetch_add(n as u64, Ordering::Relaxed);
            line = &line[n..];
        }
        write.flush().await
    }

    /// Writes `line` (one message, without its newline) unless the other side stops taking
    /// what it is sent for `within`: not written while another write that holds the output
    /// makes no progress for that long; one cut short (its own bytes not taken within it)
    /// leaves part of a line on the output, which is then closed, so that nothing is
    /// written after it. A write ahead of it that is slowly taken is waited for.
    pub async fn write_within(&self, mut line: Vec<u8>, within: Duration) -> Result<(), Unwritten> {
        line.push(b'\n');
        let mut write = loop {
            let seen = self.taken.load(Ordering::Relaxed);
            match tokio::time::timeout(within, self.write.lock()).await {
                Ok(write) => break write,
                Err(_) if self.taken.load(Ordering::Relaxed) != seen => continue,
                Err(_) => return Err(Unwritten::Waited),
            }
        };
        let Some(out) = write.as_mut() else {
            return Err(Unwritten::Failed(std::io::ErrorKind::NotConnected.into()));
        };
        match tokio::time::timeout(within, self.write_counted(out, &line)).await {
            Ok(written) => written.map_err(Unwritten::Failed),
            Err(_) => {
                *write = None;
                Err(Unwritten::Cut)
            }
        }
    }

    /// Closes the output; later writes fail.
    pub async fn close(&self) -> std::io::Result<()> {
        let taken = self.write.lock().await.take();
        if let Some(mut write) = taken {
            write.shutdown().await?;
        }
        Ok(())
    }
}

/// Why [`Out::write_within`] did not write its line.
#[derive(Debug)]
pub enum Unwritten {
    /// Another write held the output, and the other side took none of it for the time
    /// given: nothing was written.
    Waited,
    /// Cut short: the output is closed.
    Cut,
    Failed(std::io::Error),
}

/// Bytes of lines on their way out, counted until written or given up.
#[derive(Debug, Default, Clone)]
pub struct Queued(Arc<AtomicUsize>);

impl Queued {
    /// The bytes counted now.
    pub fn bytes(&self) -> usize {
        self.0.load(Ordering::Acquire)
    }

    /// Counts `bytes` until the guard is dropped.
    pub fn hold(&self, bytes: usize) -> QueuedBytes {
        self.0.fetch_add(bytes, Ordering::AcqRel);
        QueuedBytes(self.0.clone(), bytes)
    }
}

/// Bytes counted in a [`Queued`] while it lives.
pub struct QueuedBytes(Arc<AtomicUsize>, usize);

impl Drop for QueuedBytes {
    fn drop(&mut self) {
        self.0.fetch_sub(self.1, Ordering::AcqRel);
    }
}

/// Refusals written at once; past it, a refusal is counted and dropped.
pub const REFUSALS_PENDING: usize = 64;

/// Messages of one kind not sent because the other side was not reading, counted and
/// logged at each power of two.
pub struct Unsent {
    what: &'static str,
    count: AtomicU64,
}

impl Unsent {
    /// `what`: the messages, as the log line names them.
    pub const fn new(what: &'static str) -> Self {
        Self { what, count: AtomicU64::new(0) }
    }

    /// One more not sent.
    pub fn one(&self) {
        let count = self.count.fetch_add(1, Ordering::Relaxed) + 1;
        if count.is_power_of_two() {
            tracing::warn!("{count} {} not sent: the other side is not reading what it is sent", self.what);
        }
    }
}

/// Refusals written on tasks of their own, at most [`REFUSALS_PENDING`] at once.
pub struct Refusals<W> {
    out: Out<W>,
    pending: Arc<tokio::sync::Semaphore>,
    dropped: Unsent,
}

impl<W: AsyncWrite + Unpin + Send + 'static> Refusals<W> {
    pub fn new(out: Out<W>) -> Self {
        Self { out, pending: Arc::new(tokio::sync::Semaphore::new(REFUSALS_PENDING)), dropped: Unsent::new("refusals") }
    }

    /// Sends `message` on a task of its own: `receive` may be dropped at any await, and the
    /// refusal must not be lost with it.
    pub fn send(&self, message: serde_json::Value) {
        let Ok(permit) = self.pending.clone().try_acquire_owned() else {
            self.dropped.one();
            return;
        };
        let out = self.out.clone();
        tokio::spawn(async move {
            let _held = permit;
            let _ = out.write(message.to_string().into_bytes()).await;
        });
    }

    /// Waits until every refusal sent so far is written.
    pub async fn all_sent(&self) {
        let _ = self.pending.acquire_many(REFUSALS_PENDING as u32).await;
    }
}

/// What [`Lines::next`] found.
#[derive(Debug, PartialEq)]
pub enum Line {
    /// A whole line is in the buffer.
    Complete,
    /// A line past a bound was skipped: what it was (`super::id_scan`), and which bound.
    TooLong(Scanned, Past),
    /// The input ended.
    End,
}

/// The bound a skipped line was past.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Past {
    /// Longer than this many bytes.
    Length(usize),
    /// Heavier than this once read ([`crate::weight`]).
    Weight(usize),
}

impl std::fmt::Display for Past {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Length(max) => write!(f, "longer than {max} bytes"),
            Self::Weight(max) => write!(
                f,
                "heavier than {} MiB once read (its bytes, and {} for each JSON value in it)",
                max >> 20,
                crate::weight::PER_VALUE
            ),
        }
    }
}

/// Newline-delimited lines of at most `max` bytes, and of at most `max_weight` once read,
/// read without ever buffering more. Cancel-safe: a partial line stays in the buffer for
/// the next call.
pub struct Lines<R> {
    read: R,
    buf: Vec<u8>,
    /// The longest line taken, in bytes.
    pub max: usize,
    /// The most a line taken may weigh once read.
    max_weight: usize,
    /// What the line in the buffer weighs so far.
    weigher: Weigher,
    /// Set while skipping the rest of a line found past a bound: its id, read as it goes
    /// by, and the bound.
    skipping: Option<(Box<IdScan>, Past)>,
}

impl<R: AsyncBufRead + Unpin> Lines<R> {
    pub fn new(read: R, max: usize, max_weight: usize) -> Self {
        Self { read, buf: Vec::new(), max, max_weight, weigher: Weigher::default(), skipping: None }
    }

    pub async fn next(&mut self) -> std::io::Result<Line> {
        loop {
            let available = self.read.fill_buf().await?;
            if available.is_empty() {
                return Ok(Line::End);
            }
            let newline = available.iter().position(|b| *b == b'\n');
            let take = newline.map_or(available.len(), |at| at + 1);
            let piece = &available[..take];
            // (The line so far, without this piece, was within both bounds.)
            let past = if self.skipping.is_some() {
                None
            } else if self.buf.len() + take > self.max.saturating_add(1) {
                Some(Past::Length(self.max))
            } else {
                self.weigher.feed(piece);
                (self.weigher.weight() > self.max_weight).then_some(Past::Weight(self.max_weight))
            };
            if let Some(past) = past {
                // Past a bound: what was kept is read for its id and let go; the rest is
                // read as it comes, never kept.
                let mut scan = Box::<IdScan>::default();
                scan.feed(&self.buf);
                self.buf = Vec::new();
                self.skipping = Some((scan, past));
            }
            match self.skipping.as_mut() {
                Some((scan, _)) => scan.feed(piece),
                None => self.buf.extend_from_slice(piece),
            }
            self.read.consume(take);
            if newline.is_some() {
                self.weigher = Weigher::default();
                return Ok(match self.skipping.take() {
                    Some((scan, past)) => Line::TooLong(scan.finish(), past),
                    None => Line::Complete,
                });
            }
        }
    }

    /// The message on the line just read: `None` for a blank line, the reason it cannot
    /// be read otherwise. (A UTF-8 byte order mark is skipped, as RFC 8259 allows.)
    /// `typed` reads the kinds of message it knows faster (`super::typed`) and leaves the
    /// rest (`None`) to the general reading.
    pub fn message<T: serde::de::DeserializeOwned>(
        &self,
        typed: impl FnOnce(&[u8]) -> Option<T>,
    ) -> Result<Option<T>, Unreadable> {
        let line = self.line();
        let line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
        if line.iter().all(u8::is_ascii_whitespace) {
            return Ok(None);
        }
        if let Some(message) = typed(line) {
            return Ok(Some(message));
        }
        serde_json::from_slice(line).map(Some).map_err(|_| Unreadable::of(line))
    }

    /// The line just read, without its line ending.
    pub fn line(&self) -> &[u8] {
        let line = self.buf.strip_suffix(b"\n").unwrap_or(&self.buf);
        line.strip_suffix(b"\r").unwrap_or(line)
    }

    /// Forgets the line just read; a large one gives its memory back.
    pub fn clear(&mut self) {
        if self.buf.capacity() > 64 << 10 {
            self.buf = Vec::new();
        } else {
            self.buf.clear();
        }
    }
}

/// A server's stdout and stdin, as the gateway's rmcp client transport. A line from the
/// server that is not a message is logged and skipped, and answered with the protocol's
/// error when it was a request (the server would wait on it); a line past the bound is
/// logged and skipped.
pub struct ServerLines<R, W> {
    lines: Lines<BufReader<R>>,
    out: Out<W>,
    refusals: Refusals<W>,
    awaited: Awaited,
    /// What the server's answers say that rmcp's types drop.
    dropped: Arc<Dropped>,
    /// Put in `initialize`'s capabilities, which rmcp's type cannot carry.
    tasks: Option<ClientTasks>,
    /// Said once the server is found to have stopped reading its input: its session ends
    /// (`receive` ends, and the supervisor, told, restarts the server at once).
    deaf: Deaf,
    /// Room for the answers and notifications waiting to be written ([`WAITING_WRITES`]).
    waiting: Arc<tokio::sync::Semaphore>,
    _role: PhantomData<fn() -> RoleClient>,
}

/// The answers (to the server's own requests) and notifications that may wait to be
/// written to a server at once. rmcp writes each on a task of its own, so a server that
/// stops reading its input and sends request after request (a ping rmcp answers at once)
/// would have its answers pile up for ever: past this many waiting, it is taken to have
/// stopped reading. (The clients' notifications on their way to it take at most 256.)
const WAITING_WRITES: usize = 1024;

/// Said once a server is found to have stopped reading its input, with why: its supervisor
/// closes the session at once (no call is given to it past that moment) and restarts it.
#[derive(Debug, Clone, Default)]
pub struct Deaf {
    found: CancellationToken,
    why: Arc<std::sync::OnceLock<&'static str>>,
}

impl Deaf {
    fn found(&self, why: &'static str) {
        let _ = self.why.set(why);
        self.found.cancel();
    }

    /// Once the server is found to have stopped reading: why.
    pub async fn found_out(&self) -> &'static str {
        self.found.cancelled().await;
        self.why.get().copied().unwrap_or("it stopped reading its input")
    }
}

/// How long a cancellation may take to reach a server's input before the server is taken
/// to have stopped reading it.
pub const CANCEL_WRITE: Duration = Duration::from_secs(1);

impl<R: AsyncRead + Unpin, W: AsyncWrite + Unpin + Send + 'static> ServerLines<R, W> {
    /// A server told, when initialised, that the client runs `tasks` as tasks; its lines
    /// of at most `max_line` bytes and `max_weight` once read.
    pub fn new(
        read: R,
        write: W,
        (max_line, max_weight): (usize, usize),
        dropped: Arc<Dropped>,
        tasks: Option<ClientTasks>,
    ) -> Self {
        let out = Out::new(write);
        Self {
            lines: Lines::new(BufReader::new(read), max_line, max_weight),
            refusals: Refusals::new(out.clone()),
            out,
            awaited: Awaited::default(),
            dropped,
            tasks,
            deaf: Deaf::default(),
            waiting: Arc::new(tokio::sync::Semaphore::new(WAITING_WRITES)),
            _role: PhantomData,
        }
    }

    /// Says on `deaf` when the server is found to have stopped reading its input.
    pub fn telling(mut self, deaf: Deaf) -> Self {
        self.deaf = deaf;
        self
    }

    /// Writes a cancellation on a task of its own, within [`CANCEL_WRITE`]: rmcp waits for
    /// the write of the cancellation it sends when a request's time is up before it says
    /// so, and behind a server that stopped reading its input that write never ends (nor
    /// would the attempt, until the whole call's deadline). A server that takes nothing it
    /// is sent for that long has stopped reading, and its session ends; one still taking a
    /// request ahead of it, however slowly, is waited for.
    fn cancel_detached(&self, line: Vec<u8>) {
        let (out, deaf) = (self.out.clone(), self.deaf.clone());
        tokio::spawn(async move {
            let why = match out.write_within(line, CANCEL_WRITE).await {
                Ok(()) | Err(Unwritten::Failed(_)) => return,
                Err(Unwritten::Waited) => {
                    "it stopped reading its input: it took nothing it was sent for a second, so a cancellation could not be written"
                }
                Err(Unwritten::Cut) => "it stopped reading its input: it stopped taking a cancellation halfway",
            };
            deaf.found(why);
        });
    }

    /// `item` as written: an `initialize` with the client's `tasks` capability.
    fn encode(&self, item: &TxJsonRpcMessage<RoleClient>) -> serde_json::Result<Vec<u8>> {
        match ClientTasks::in_initialize(self.tasks.as_ref(), item)? {
            Some(initialize) => serde_json::to_vec(&initialize),
            None => serde_json::to_vec(item),
        }
    }

    /// The message on the line just read; `None` for an empty line or one that is not a
    /// message (answered when it was a request, which the server waits on).
    fn decode(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        let unreadable = match self.lines.message(|line| self.awaited.answer(line, &self.dropped)) {
            Ok(message) => return message,
            Err(unreadable) => unreadable,
        };
        // What is not JSON is usually a server printing to stdout (a banner): noted,
        // never answered (the answer could start an exchange of errors).
        if unreadable.code == PARSE_ERROR {
            tracing::debug!("the server printed what is not JSON-RPC: {}", unreadable.message);
            return None;
        }
        tracing::warn!(id = %unreadable.id, "the server sent what is not an MCP message: {}", unreadable.message);
        // A request the server waits on is told why it will not be answered; other JSON
        // (a JSON log line printed to stdout) is not.
        if unreadable.is_request {
            self.refusals.send(unreadable.to_json());
        }
        None
    }
}

/// The key in the `data` of the error the gateway answers a request with in place of a
/// server's answer too long to read (its value the bound): the request ran.
pub const DROPPED_ANSWER: &str = "reboundDroppedAnswerOverBytes";

impl<R: AsyncRead + Unpin, W: AsyncWrite + Unpin + Send + 'static> ServerLines<R, W> {
    /// A message of the server's too long to read: a request of its own is refused (the
    /// server waits on it), and an answer fails the gateway's request it answered now,
    /// rather than at its timeout.
    fn too_long(&mut self, scanned: Scanned, past: Past) -> Option<RxJsonRpcMessage<RoleClient>> {
        if let Some(id) = scanned.answers() {
            let id = id?;
            self.awaited.forget(&id);
            let why = format!("the server's answer is {past}, past what the gateway reads; it was dropped");
            // The bound it was past, in bytes of text or of what it would weigh once read.
            let (Past::Length(bound) | Past::Weight(bound)) = past;
            let data = serde_json::json!({ DROPPED_ANSWER: bound });
            return Some(JsonRpcMessage::error(ErrorData::internal_error(why, Some(data)), Some(id)));
        }
        let why = format!("Invalid Request: the request is {past}, past what the gateway reads");
        self.refusals.send(Unreadable::answered(INVALID_REQUEST, why, scanned.id?).to_json());
        None
    }
}

impl<R, W> Transport<RoleClient> for ServerLines<R, W>
where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send + 'static,
{
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.awaited.sent(&item);
        let encoded = self.encode(&item).map_err(std::io::Error::from);
        let cancellation = matches!(&item, JsonRpcMessage::Notification(n)
            if matches!(n.notification, ClientNotification::CancelledNotification(_)));
        if let (true, Ok(line)) = (cancellation, &encoded) {
            self.cancel_detached(line.clone());
        }
        // A request is written by rmcp's loop itself, one at a time; what else it writes
        // waits on a task of its own, and is counted.
        let waiting = match &item {
            JsonRpcMessage::Request(_) => None,
            _ if cancellation => None,
            _ => Some(self.waiting.clone().try_acquire_owned().map_err(|_| {
                self.deaf
                    .found("it stopped reading its input: 1024 answers and notifications waited to be written to it");
                std::io::Error::other("the server stopped reading its input")
            })),
        };
        let out = self.out.clone();
        async move {
            let _waiting = waiting.transpose()?;
            match cancellation {
                true => encoded.map(drop),
                false => out.write(encoded?).await,
            }
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        loop {
            // (`Lines::next` is cancel-safe.)
            let next = tokio::select! {
                biased;
                () = self.deaf.found.cancelled() => return None,
                next = self.lines.next() => next,
            };
            match next {
                Ok(Line::Complete) => {}
                Ok(Line::TooLong(scanned, past)) => {
                    tracing::warn!("the server sent a message {past}; it was skipped");
                    match self.too_long(scanned, past) {
                        Some(failed) => return Some(failed),
                        None => continue,
                    }
                }
                Ok(Line::End) => return None,
                Err(e) => {
                    tracing::warn!("cannot read from the server: {e}");
                    return None;
                }
            }
            let message = self.decode();
            self.lines.clear();
            if message.is_some() {
                return message;
            }
        }
    }

    /// Behind a server that stopped reading its input, a write holds the output for good:
    /// it goes with the session's tasks, and the supervisor stops the process.
    async fn close(&mut self) -> Result<(), Self::Error> {
        tokio::time::timeout(CANCEL_WRITE, self.out.close()).await.unwrap_or(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A line short enough but of many values is skipped once it would weigh too much
    /// read, unkept, its id read as it went by; the weighing starts over on each line.
    #[tokio::test]
    async fn a_line_too_heavy_to_read_is_skipped_as_one_too_long() {
        let zeros = vec!["0"; 10_000].join(",");
        let heavy = format!(r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"v":[{zeros}]}}}}"#);
        let light = format!(r#"{{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{{"v":"{zeros}"}}}}"#);
        let input = format!(
            "{heavy}
{light}
{light}
"
        );
        let max_weight = 100 * crate::weight::PER_VALUE + 100_000;
        let mut lines = Lines::new(tokio::io::BufReader::with_capacity(1000, input.as_bytes()), 1 << 20, max_weight);
        let Line::TooLong(scanned, past) = lines.next().await.unwrap() else { panic!("not skipped") };
        assert_eq!((scanned.id, past), (Some(serde_json::json!(7)), Past::Weight(max_weight)));
        assert!(lines.buf.capacity() < 64 << 10, "the heavy line was kept");
        assert!(past.to_string().contains("for each JSON value"), "{past}");
        for _ in 0..2 {
            assert_eq!(lines.next().await.unwrap(), Line::Complete, "its one value is a long string: light");
            assert_eq!(lines.line(), light.as_bytes());
            lines.clear();
        }
    }

    #[tokio::test]
    async fn a_line_past_the_bound_is_skipped_and_a_large_one_gives_its_buffer_back() {
        let big = "x".repeat(200 << 10);
        let input = format!("{big}{big}\n{big}\nsmall\r\n\nlast");
        // A small read buffer, so that lines arrive in many pieces.
        let mut lines = Lines::new(tokio::io::BufReader::with_capacity(1000, input.as_bytes()), 300 << 10, usize::MAX);
        assert_eq!(lines.next().await.unwrap(), Line::TooLong(Scanned::default(), Past::Length(300 << 10)));
        assert!(lines.buf.capacity() <= 300 << 10, "the long line was buffered");
        assert_eq!(lines.next().await.unwrap(), Line::Complete);
        assert_eq!(lines.line().len(), 200 << 10);
        lines.clear();
        assert_eq!(lines.buf.capacity(), 0, "the large line's buffer was kept");
        assert_eq!(lines.next().await.unwrap(), Line::Complete);
        assert_eq!(lines.line(), b"small");
        lines.clear();
        assert_eq!(lines.next().await.unwrap(), Line::Complete);
        assert_eq!(lines.line(), b"");
        lines.clear();
        // A last line without its newline is not a message.
        assert_eq!(lines.next().await.unwrap(), Line::End);
    }

    /// A server that stops reading its input: the request that filled its pipe waits, the
    /// cancellation of it is taken as sent at once (rmcp waits for that before it ends the
    /// attempt), and a second later, not written, it ends the server's session.
    #[tokio::test(start_paused = true)]
    async fn a_cancellation_the_server_does_not_take_ends_its_session_not_the_attempt() {
        use rmcp::model::{
            CallToolRequestParams, CancelledNotification, CancelledNotificationParam, ClientRequest, JsonRpcRequest,
            NumberOrString,
        };
        let (ours, _theirs) = tokio::io::duplex(1 << 10);
        let (read, write) = tokio::io::split(ours);
        let mut transport = ServerLines::new(read, write, (1 << 16, usize::MAX), Arc::default(), None);
        let mut params = CallToolRequestParams::new("echo");
        params.arguments = Some(serde_json::json!({"message": "x".repeat(4 << 10)}).as_object().cloned().unwrap());
        let call = ClientRequest::CallToolRequest(rmcp::model::CallToolRequest::new(params));
        let call = JsonRpcMessage::Request(JsonRpcRequest::new(NumberOrString::Number(1), call));
        let mut filling = Box::pin(transport.send(call));
        assert!(futures::poll!(&mut filling).is_pending(), "the pipe is full");
        let cancel = CancelledNotification::new(CancelledNotificationParam::new(
            Some(NumberOrString::Number(1)),
            Some("timed out".into()),
        ));
        let cancel = JsonRpcMessage::notification(ClientNotification::from(cancel));
        tokio::time::timeout(Duration::from_millis(10), transport.send(cancel)).await.expect("taken at once").unwrap();
        let ended = tokio::time::timeout(CANCEL_WRITE * 2, transport.receive()).await.expect("the session ended");
        assert!(ended.is_none());
        drop(filling);
        // A cancellation that began to be written and was cut short closes the output.
        let (ours, _theirs) = tokio::io::duplex(16);
        let out = Out::new(ours);
        assert!(matches!(out.write_within(vec![b'x'; 64], CANCEL_WRITE).await, Err(Unwritten::Cut)));
        assert!(out.write(b"{}".to_vec()).await.is_err(), "nothing is written after part of a line");
    }

    /// A server that stops reading its input and asks on (pings rmcp answers at once):
    /// its answers wait, each on a task of rmcp's, until WAITING_WRITES wait, and the next
    /// ends its session rather than piling up for ever.
    #[tokio::test(start_paused = true)]
    async fn answers_a_server_does_not_take_end_its_session_past_a_bound() {
        use rmcp::model::{ClientResult, NumberOrString};
        let (ours, _theirs) = tokio::io::duplex(1 << 10);
        let (read, write) = tokio::io::split(ours);
        let mut transport = ServerLines::new(read, write, (1 << 16, usize::MAX), Arc::default(), None);
        let answer = |n| JsonRpcMessage::response(ClientResult::empty(()), NumberOrString::Number(n));
        // As rmcp sends, each answer on a task of its own: kept, polled once. The first
        // few fill the pipe and are done; the rest wait.
        type Sent = std::pin::Pin<Box<dyn Future<Output = std::io::Result<()>> + Send>>;
        let mut waiting: Vec<Sent> = Vec::new();
        let refused = loop {
            let n = waiting.len() as i64;
            assert!(n <= 2 * WAITING_WRITES as i64, "answers pile up past the bound");
            let mut sent = Box::pin(transport.send(answer(n))) as Sent;
            match futures::poll!(&mut sent) {
                std::task::Poll::Ready(Err(e)) => break e,
                _ => waiting.push(sent),
            }
        };
        let written = 1024 / r#"{"jsonrpc":"2.0","id":1000,"result":{}}"#.len();
        assert!(waiting.len() >= WAITING_WRITES, "refused at {}: {refused}", waiting.len());
        assert!(waiting.len() <= WAITING_WRITES + written + 1, "refused at {}", waiting.len());
        let ended =
            tokio::time::timeout(Duration::from_millis(10), transport.receive()).await.expect("the session ended");
        assert!(ended.is_none());
        assert!(transport.deaf.found_out().await.contains("1024 answers"));
    }

    /// A cancellation behind a large write that the other side takes slowly waits for it,
    /// however long it takes: only a write that makes no progress is given up on.
    #[tokio::test(start_paused = true)]
    async fn a_write_behind_one_slowly_taken_waits_for_it() {
        use tokio::io::AsyncReadExt as _;
        let (ours, mut theirs) = tokio::io::duplex(1 << 10);
        let out = Out::new(ours);
        let large = out.clone();
        let writing = tokio::spawn(async move { large.write(vec![b'x'; 16 << 10]).await });
        tokio::task::yield_now().await;
        let reading = tokio::spawn(async move {
            let mut taken = Vec::new();
            let mut piece = [0u8; 512];
            while !taken.ends_with(b"}\n") {
                tokio::time::sleep(CANCEL_WRITE / 2).await;
                let n = theirs.read(&mut piece).await.unwrap();
                taken.extend_from_slice(&piece[..n]);
            }
            taken
        });
        let started = tokio::time::Instant::now();
        out.write_within(b"{}".to_vec(), CANCEL_WRITE).await.expect("written after the large one");
        assert!(started.elapsed() > CANCEL_WRITE * 4, "it waited well past its second");
        writing.await.unwrap().unwrap();
        let taken = reading.await.unwrap();
        assert_eq!(taken.len(), (16 << 10) + 1 + 3, "the large line, then the cancellation, whole");
    }

    #[tokio::test]
    async fn a_server_request_that_cannot_be_read_is_answered_and_its_noise_is_not() {
        use tokio::io::AsyncBufReadExt as _;
        let (ours, theirs) = tokio::io::duplex(1 << 16);
        let (read, write) = tokio::io::split(ours);
        let mut transport = ServerLines::new(read, write, (1 << 16, usize::MAX), Arc::default(), None);
        let (their_read, mut their_write) = tokio::io::split(theirs);
        let input = concat!(
            "Starting server...\n",
            r#"{"jsonrpc":"2.0","id":5,"method":"sampling/createMessage","params":"not an object"}"#,
            "\n",
            r#"{"id":6,"level":"info","msg":"a JSON log line, not a request"}"#,
            "\n",
            r#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#,
            "\n",
        );
        their_write.write_all(input.as_bytes()).await.unwrap();
        let message = transport.receive().await.expect("the notification gets through");
        assert!(matches!(message, rmcp::model::ServerJsonRpcMessage::Notification(_)), "{message:?}");
        let mut back = tokio::io::BufReader::new(their_read).lines();
        let line = tokio::time::timeout(std::time::Duration::from_secs(5), back.next_line()).await.expect("answered");
        let answer: serde_json::Value = serde_json::from_str(&line.unwrap().unwrap()).unwrap();
        assert_eq!((answer["id"].as_u64(), answer["error"]["code"].as_i64()), (Some(5), Some(-32600)), "{answer}");
        // Nothing for the banner or the log line.
        transport.close().await.unwrap();
        assert!(back.next_line().await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_server_is_told_in_initialize_what_the_client_runs_as_tasks() {
        use rmcp::model::{ClientRequest, InitializeRequest, JsonRpcRequest, NumberOrString};
        use tokio::io::AsyncBufReadExt as _;
        let tasks = ClientTasks::of(&serde_json::json!({"requests": {"sampling": {"createMessage": {}}}})).unwrap();
        let (ours, theirs) = tokio::io::duplex(1 << 16);
        let (read, write) = tokio::io::split(ours);
        let mut transport = ServerLines::new(read, write, (1 << 16, usize::MAX), Arc::default(), Some(tasks.clone()));
        let init = ClientRequest::InitializeRequest(InitializeRequest::new(Default::default()));
        let list = ClientRequest::ListToolsRequest(Default::default());
        for (n, request) in [(1, init), (2, list)] {
            let message = JsonRpcMessage::Request(JsonRpcRequest::new(NumberOrString::Number(n), request));
            transport.send(message).await.unwrap();
        }
        let mut sent = tokio::io::BufReader::new(theirs).lines();
        let init: serde_json::Value = serde_json::from_str(&sent.next_line().await.unwrap().unwrap()).unwrap();
        assert_eq!(&init["params"]["capabilities"]["tasks"], tasks.value());
        assert!(init["params"]["clientInfo"].is_object(), "the rest as rmcp wrote it: {init}");
        let list: serde_json::Value = serde_json::from_str(&sent.next_line().await.unwrap().unwrap()).unwrap();
        assert_eq!(list["method"], "tools/list");
    }
}
