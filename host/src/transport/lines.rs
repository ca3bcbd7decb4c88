//! Newline-delimited JSON-RPC, the stdio transport of MCP, framed by Rebound on both of
//! its sides (the client on the gateway's stdin, each server on its child's stdout):
//!
//! - a line is bounded as it is read: one past the bound is skipped, never buffered;
//! - a large line's buffer is given back once the line is handled, not kept at its
//!   high-water mark for the life of the connection (rmcp's transport keeps it, so a
//!   burst of large calls left their size resident per server);
//! - each message is written whole under a lock, and nothing is kept between writes.

use std::marker::PhantomData;
use std::sync::Arc;

use rmcp::RoleClient;
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};

/// Output: one JSON message a line, written whole under a lock.
pub struct Out<W> {
    write: Arc<tokio::sync::Mutex<Option<W>>>,
}

impl<W> Clone for Out<W> {
    fn clone(&self) -> Self {
        Self { write: self.write.clone() }
    }
}

impl<W: AsyncWrite + Unpin + Send + 'static> Out<W> {
    pub fn new(write: W) -> Self {
        Self { write: Arc::new(tokio::sync::Mutex::new(Some(write))) }
    }

    /// Writes `line` (one message, without its newline) and flushes it.
    pub async fn write(&self, mut line: Vec<u8>) -> std::io::Result<()> {
        line.push(b'\n');
        let mut write = self.write.lock().await;
        let Some(write) = write.as_mut() else {
            return Err(std::io::Error::new(std::io::ErrorKind::NotConnected, "the output is closed"));
        };
        write.write_all(&line).await?;
        write.flush().await
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

/// What [`Lines::next`] found.
#[derive(Debug, PartialEq)]
pub enum Line {
    /// A whole line is in the buffer.
    Complete,
    /// A line longer than the bound was skipped.
    TooLong,
    /// The input ended.
    End,
}

/// Newline-delimited lines of at most `max` bytes, read without ever buffering more.
/// Cancel-safe: a partial line stays in the buffer for the next call.
pub struct Lines<R> {
    read: R,
    buf: Vec<u8>,
    /// The longest line taken, in bytes.
    pub max: usize,
    /// Set while skipping the rest of a line found too long.
    skipping: bool,
}

impl<R: AsyncBufRead + Unpin> Lines<R> {
    pub fn new(read: R, max: usize) -> Self {
        Self { read, buf: Vec::new(), max, skipping: false }
    }

    pub async fn next(&mut self) -> std::io::Result<Line> {
        loop {
            let available = self.read.fill_buf().await?;
            if available.is_empty() {
                return Ok(Line::End);
            }
            let newline = available.iter().position(|b| *b == b'\n');
            let take = newline.map_or(available.len(), |at| at + 1);
            let over = !self.skipping && self.buf.len() + take > self.max.saturating_add(1);
            if !self.skipping && !over {
                self.buf.extend_from_slice(&available[..take]);
            }
            self.read.consume(take);
            let was_skipping = self.skipping;
            self.skipping = (was_skipping || over) && newline.is_none();
            if over {
                self.buf = Vec::new();
                return Ok(Line::TooLong);
            }
            if newline.is_some() && !was_skipping {
                return Ok(Line::Complete);
            }
        }
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
/// server that is not a message is logged and skipped (there is no one to answer: the
/// server is not waiting for a reply to it); a line past the bound likewise.
pub struct ServerLines<R, W> {
    lines: Lines<BufReader<R>>,
    out: Out<W>,
    _role: PhantomData<fn() -> RoleClient>,
}

impl<R: AsyncRead + Unpin, W: AsyncWrite + Unpin + Send + 'static> ServerLines<R, W> {
    pub fn new(read: R, write: W, max_line: usize) -> Self {
        Self { lines: Lines::new(BufReader::new(read), max_line), out: Out::new(write), _role: PhantomData }
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
        let encoded = serde_json::to_vec(&item).map_err(std::io::Error::from);
        let out = self.out.clone();
        async move { out.write(encoded?).await }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        loop {
            match self.lines.next().await {
                Ok(Line::Complete) => {}
                Ok(Line::TooLong) => {
                    tracing::warn!("the server sent a message longer than {} bytes; it was skipped", self.lines.max);
                    continue;
                }
                Ok(Line::End) => return None,
                Err(e) => {
                    tracing::warn!("cannot read from the server: {e}");
                    return None;
                }
            }
            let line = self.lines.line();
            let line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
            let message = if line.iter().all(u8::is_ascii_whitespace) {
                None
            } else {
                match serde_json::from_slice::<RxJsonRpcMessage<RoleClient>>(line) {
                    Ok(message) => Some(message),
                    Err(e) => {
                        tracing::debug!("skipped a line from the server that is not an MCP message: {e}");
                        None
                    }
                }
            };
            self.lines.clear();
            if message.is_some() {
                return message;
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.out.close().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_line_past_the_bound_is_skipped_and_a_large_one_gives_its_buffer_back() {
        let big = "x".repeat(200 << 10);
        let input = format!("{big}{big}\n{big}\nsmall\r\n\nlast");
        // A small read buffer, so that lines arrive in many pieces.
        let mut lines = Lines::new(tokio::io::BufReader::with_capacity(1000, input.as_bytes()), 300 << 10);
        assert_eq!(lines.next().await.unwrap(), Line::TooLong);
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
}
