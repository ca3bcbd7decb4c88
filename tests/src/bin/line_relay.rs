//! The floor of any stdio gateway, for `cargo xtask bench`: starts the server given as its
//! arguments and copies each line from its own stdin to the server and each line of the
//! server's back to its stdout, decoding nothing. What a call costs through it is what the
//! two extra pipe hops cost on this machine; what Rebound adds beyond it is its own.
//!
//! usage: line-relay SERVER [ARGS...]

use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, AsyncWrite, AsyncWriteExt, BufReader};

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let program = args.next().ok_or_else(|| anyhow::anyhow!("usage: line-relay SERVER [ARGS...]"))?;
    let mut server = tokio::process::Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let (to_server, from_server) = (server.stdin.take().expect("piped"), server.stdout.take().expect("piped"));
    // Non-blocking pipes, as Rebound reads and writes its client's.
    let (stdin, stdout) = rmcp::transport::stdio_pipes();
    tokio::select! {
        r = copy_lines(BufReader::new(stdin), to_server) => r,
        r = copy_lines(BufReader::new(from_server), stdout) => r,
    }
}

/// One write per line, flushed, as a line-oriented gateway would.
async fn copy_lines(mut from: impl AsyncBufReadExt + Unpin, mut to: impl AsyncWrite + Unpin) -> anyhow::Result<()> {
    let mut line = Vec::new();
    while from.read_until(b'\n', &mut line).await? > 0 {
        to.write_all(&line).await?;
        to.flush().await?;
        line.clear();
    }
    Ok(())
}
