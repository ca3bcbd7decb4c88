//! Launching a stdio server as a child in its own process group, and stopping it
//! politely: stdin closed, then SIGTERM, then SIGKILL, always reaped — within 2 s, well
//! inside the 4 s MCP clients give a gateway to exit. Each group is also listed with the
//! [`super::watchdog`], which stops it should the gateway itself be killed.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::config::StdioLaunch;
use crate::lasting::Locked;
use crate::redact::Secrets;

/// How long a child gets after stdin closes, and again after SIGTERM.
const GRACE: Duration = Duration::from_secs(1);

/// A running child server. Dropping it kills the whole process group.
#[derive(Debug)]
pub struct ServerProcess {
    child: Child,
    pgid: Option<Pid>,
    /// The last lines the server wrote to stderr, for start-up error messages.
    tail: Arc<Mutex<VecDeque<String>>>,
    /// The task reading stderr; it ends when the server's stderr closes.
    reader: Option<tokio::task::JoinHandle<()>>,
}

/// How many stderr lines a start-up error quotes.
const TAIL_LINES: usize = 5;
/// The longest stderr line kept; the rest of a longer one is read and dropped, so a
/// server that prints a huge line costs no more memory than this.
pub const MAX_STDERR_LINE: usize = 8 << 10;

/// Lines of at most `cap` bytes (lossily decoded), however long they were written.
struct CappedLines<R> {
    reader: BufReader<R>,
    cap: usize,
}

impl<R: tokio::io::AsyncRead + Unpin> CappedLines<R> {
    fn new(inner: R, cap: usize) -> Self {
        Self { reader: BufReader::with_capacity(cap.min(64 << 10), inner), cap }
    }

    /// The next line (its first `cap` bytes) and whether it was cut, or none at the end.
    async fn next(&mut self) -> Option<(String, bool)> {
        let mut line = Vec::new();
        let mut cut = false;
        loop {
            let available = match self.reader.fill_buf().await {
                Ok([]) if line.is_empty() && !cut => return None,
                Ok([]) => break,
                Ok(bytes) => bytes,
                Err(_) => return None,
            };
            let (chunk, done) = match available.iter().position(|b| *b == b'\n') {
                Some(i) => (&available[..i], Some(i + 1)),
                None => (available, None),
            };
            let room = self.cap.saturating_sub(line.len());
            cut |= chunk.len() > room;
            line.extend_from_slice(&chunk[..chunk.len().min(room)]);
            let used = done.unwrap_or(available.len());
            self.reader.consume(used);
            if done.is_some() {
                break;
            }
        }
        Some((String::from_utf8_lossy(&line).trim_end_matches('\r').to_owned(), cut))
    }
}

/// `text` without its last `n` bytes (at a character boundary).
fn trim_end(text: &str, n: usize) -> &str {
    &text[..text.floor_char_boundary(text.len().saturating_sub(n))]
}

/// The child's protocol pipes.
pub struct Pipes {
    pub stdin: ChildStdin,
    pub stdout: ChildStdout,
}

/// The standard variables holding the headers of an OTLP exporter (`crate::telemetry`).
const OTLP_HEADERS: [&str; 4] = [
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
    "OTEL_EXPORTER_OTLP_LOGS_HEADERS",
];

/// The variables of the gateway's environment that no server process inherits (a
/// server's own `env` may still pass one on):
/// - those holding the gateway's own HTTP tokens: `REBOUND_AUTH_TOKEN`,
///   `REBOUND_OPERATOR_TOKEN`, and any other whose value is one of `tokens` (a `${VAR}`
///   the configuration reads one from);
/// - the headers the gateway's OpenTelemetry exporter sends (`OTLP_HEADERS`), which
///   usually carry the telemetry backend's key;
/// - `secrets`, the variables named like secrets that the configuration reads for one
///   server or another (`redact::secret_variables`).
///
/// A server's tool (a shell, a code runner, one that reads its environment) would
/// otherwise show them to any client: the operator's token opens every client's errors,
/// and one server's credentials are not another's.
pub fn withheld<'a>(
    tokens: impl IntoIterator<Item = &'a str>,
    secrets: impl IntoIterator<Item = &'a str>,
) -> Vec<OsString> {
    let tokens: Vec<&str> = tokens.into_iter().collect();
    let holds_one = |value: &OsString| tokens.iter().any(|t| value.as_encoded_bytes() == t.as_bytes());
    let by_value = std::env::vars_os().filter(|(_, value)| holds_one(value)).map(|(name, _)| name);
    let own = ["REBOUND_AUTH_TOKEN", "REBOUND_OPERATOR_TOKEN"].into_iter().chain(OTLP_HEADERS);
    let named = own.chain(secrets).map(OsString::from);
    named.chain(by_value).collect()
}

/// The variables no server process inherits ([`withheld`]), as the configuration applied
/// last has them: one for a gateway, so that a server a reload kept, started again later,
/// is started without the variables of the tokens that reload set.
#[derive(Debug, Clone, Default)]
pub struct Withheld(Arc<Mutex<Arc<[OsString]>>>);

impl Withheld {
    pub fn set(&self, names: Vec<OsString>) {
        *self.0.locked() = names.into();
    }

    pub fn now(&self) -> Arc<[OsString]> {
        self.0.locked().clone()
    }
}

impl ServerProcess {
    /// Starts `launch` for the server `name`; its stderr lines go to the log under that
    /// name (stdout is the protocol).
    /// Lines are redacted with `secrets` before they are logged or kept: servers print
    /// their configuration when they fail.
    /// Of the gateway's environment, the variables named `withheld` ([`withheld`]) are not
    /// passed on; the server's own `env` is.
    pub fn spawn(
        name: &str,
        launch: &StdioLaunch,
        secrets: &Secrets,
        withheld: &[OsString],
    ) -> std::io::Result<(Self, Pipes)> {
        let mut cmd = Command::new(&launch.command);
        for variable in withheld {
            cmd.env_remove(variable);
        }
        cmd.args(&launch.args)
            .envs(&launch.env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own group, so that a server's helpers (npx → node, uv → python) are
            // signalled with it and a Ctrl-C meant for the gateway does not reach them.
            .process_group(0)
            .kill_on_drop(true);
        if let Some(cwd) = &launch.cwd {
            cmd.current_dir(cwd);
        }
        let mut child = cmd.spawn()?;
        let pgid = child.id().and_then(|id| i32::try_from(id).ok()).map(Pid::from_raw);
        if let Some(pgid) = pgid {
            super::watchdog::note(pgid, true);
        }
        let stdin = child.stdin.take().expect("stdin is piped");
        let stdout = child.stdout.take().expect("stdout is piped");
        let tail = Arc::new(Mutex::new(VecDeque::with_capacity(TAIL_LINES)));
        let reader = child.stderr.take().map(|stderr| {
            let name = name.to_owned();
            let tail = tail.clone();
            let secrets = secrets.clone();
            tokio::spawn(async move {
                let mut lines = CappedLines::new(stderr, MAX_STDERR_LINE);
                while let Some((line, cut)) = lines.next().await {
                    // A secret cut in half no longer matches: what is left of the line past
                    // the last place one could start is dropped with the rest.
                    let line = if cut { trim_end(&line, secrets.longest().saturating_sub(1)) } else { &line };
                    let mut line = secrets.redact(line).into_owned();
                    if cut {
                        line.push_str(" …(cut)");
                    }
                    tracing::info!(target: "rebound::upstream", server = %name, "{line}");
                    let mut tail = tail.locked();
                    if tail.len() == TAIL_LINES {
                        tail.pop_front();
                    }
                    tail.push_back(line);
                }
            })
        });
        Ok((Self { child, pgid, tail, reader }, Pipes { stdin, stdout }))
    }

    /// `"; stderr: …"` with the server's last stderr lines, or nothing.
    pub fn stderr_tail(&self) -> String {
        let tail = self.tail.locked();
        if tail.is_empty() {
            String::new()
        } else {
            format!("; its stderr ended with: {}", tail.iter().cloned().collect::<Vec<_>>().join(" | "))
        }
    }

    /// [`Self::stderr_tail`] once the server's stderr has been read to its end (or after
    /// a moment, if something it started keeps stderr open): for a server that exited.
    pub async fn final_stderr_tail(&mut self) -> String {
        if let Some(reader) = self.reader.take() {
            let _ = tokio::time::timeout(Duration::from_millis(500), reader).await;
        }
        self.stderr_tail()
    }

    /// Waits for the child to exit by itself.
    pub async fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        self.child.wait().await
    }

    /// Stops the child (whose stdin the caller has already closed): a grace period, then
    /// SIGTERM to its group, another grace period, then SIGKILL. Always reaps it.
    pub async fn stop(mut self) {
        if tokio::time::timeout(GRACE, self.child.wait()).await.is_ok() {
            self.signal_group(Signal::SIGKILL); // helpers it left behind
            self.forget_group();
            return;
        }
        self.terminate().await;
    }

    /// SIGTERM to the child's group, a grace period, then SIGKILL; reaps it: for a child
    /// whose stdin could not be closed (a write to it blocked), which a grace period
    /// would not end.
    pub async fn terminate(mut self) {
        self.signal_group(Signal::SIGTERM);
        if tokio::time::timeout(GRACE, self.child.wait()).await.is_err() {
            self.signal_group(Signal::SIGKILL);
            let _ = self.child.start_kill();
            // A process stuck in the kernel (a hung network mount) dies only when it
            // leaves it: the stop does not wait for that. It is reaped, and its group
            // forgotten by the watchdog, on a task of its own when it does.
            if tokio::time::timeout(GRACE, self.child.wait()).await.is_err() {
                tracing::warn!(
                    pid = self.child.id(),
                    "a server process did not exit on SIGKILL within a second; left to exit"
                );
                tokio::spawn(async move {
                    let _ = self.child.wait().await;
                    self.forget_group();
                });
                return;
            }
        }
        self.signal_group(Signal::SIGKILL);
        self.forget_group();
    }

    /// Reaped: the id may be reused from now on, so neither Drop nor the watchdog may
    /// signal it.
    fn forget_group(&mut self) {
        if let Some(pgid) = self.pgid.take() {
            super::watchdog::note(pgid, false);
        }
    }

    fn signal_group(&self, signal: Signal) {
        if let Some(pgid) = self.pgid {
            // ESRCH (group already gone) is the normal case after a clean exit.
            let _ = killpg(pgid, signal);
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.signal_group(Signal::SIGKILL);
        self.forget_group();
    }
}

#[cfg(test)]
mod tests {
    use super::CappedLines;

    #[tokio::test]
    async fn long_lines_are_cut_and_the_rest_still_read() {
        let mut input = b"short\r\n".to_vec();
        input.extend(std::iter::repeat_n(b'x', 100_000));
        input.extend(b"\nnext\nno newline at the end");
        let mut lines = CappedLines::new(&input[..], 10);
        let mut next = async || lines.next().await;
        assert_eq!(next().await, Some(("short".to_owned(), false)));
        assert_eq!(next().await, Some(("xxxxxxxxxx".to_owned(), true)));
        assert_eq!(next().await, Some(("next".to_owned(), false)));
        assert_eq!(next().await, Some(("no newline".to_owned(), true)));
        assert_eq!(next().await, None);
        assert_eq!(super::trim_end("abcdé", 1), "abcd");
        assert_eq!(super::trim_end("abc", 9), "");
    }
}
