//! The errors log: one JSON object per line (`id`, `timestamp`, `type`, `severity`,
//! `message`, `context`, `recovery`, `fix_status`), written off the call path by a
//! background task so that logging never blocks or fails a call. The file is rotated to
//! `NAME.1` past its size cap; the newest entries are also kept in memory for
//! `rebound://errors`. A flood of one kind of failure is written as its first entries
//! and a summary with the count ([`bursts`]), so it never rotates away the failure that
//! started it; every entry that is not written is counted.

use std::collections::VecDeque;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::lasting::Locked;
use crate::recovery::Failure;
use crate::recovery::classify::{Classification, classify};
use crate::recovery::engine::{Record, Role};
use crate::recovery::report::{auto_recoverable, suggested_action};
use crate::redact::Secrets;
use crate::transport::supervisor::{Ended, Next, Trouble};

/// Entries kept in memory for the status (`/status`, `rebound_status`).
const RECENT: usize = 100;
/// Entries kept in memory for each client session's `rebound://errors`, and the most
/// sessions kept (the one written to least recently is forgotten first): one client's
/// failures never push another's out of its own view. Only a client that can read its
/// view again has one (`open_view`): an MCP session, the stdio client; not a request of a
/// 2026-07-28 client over HTTP, which has no session, so that a stream of such requests,
/// each a new name, cannot push the sessions' views out.
const RECENT_PER_SESSION: usize = 20;
/// Four times the default `rebound.http.max_sessions`, so that one client's sessions
/// cannot push out the others' views.
const SESSIONS_KEPT: usize = 1024;
/// The longest message (and error) an entry kept in memory has.
const KEPT_MESSAGE_BYTES: usize = 2 << 10;
/// The longest text of an entry in the file: a tool whose error quotes its input, or a
/// server's long answer, must not make one entry the size of the file (and rotate away
/// everyone's history).
pub const MAX_TEXT_BYTES: usize = 16 << 10;
/// Entries queued for the writer before new ones are dropped (and counted).
const QUEUE: usize = 4096;

mod bursts;

/// The entries kept in memory: the newest in all, and the newest of each session.
#[derive(Debug, Default)]
struct Recent {
    all: VecDeque<Value>,
    by_session: indexmap::IndexMap<String, VecDeque<Value>>,
    /// The sessions that can read their own view, from `open_view` to `close_view`.
    readers: std::collections::HashSet<String>,
}

impl Recent {
    /// Keeps `entry`, written to the file: among all, and (unless it is a flood's summary,
    /// which may count several sessions' failures) among its session's.
    fn keep(&mut self, entry: &Value) {
        let entry = kept(entry);
        push_bounded(&mut self.all, entry.clone(), RECENT);
        if entry.get("repeated").is_none() {
            self.keep_own(entry);
        }
    }

    /// Keeps `entry` among its session's own only: one a flood counts instead of writing
    /// is still its client's to see.
    fn keep_own(&mut self, entry: Value) {
        let Some(session) = entry["context"]["session_id"].as_str().map(str::to_owned) else { return };
        if !self.readers.contains(&session) {
            return;
        }
        // Moved to the back: the session written to least recently is at the front.
        let mut own = self.by_session.shift_remove(&session).unwrap_or_default();
        push_bounded(&mut own, entry, RECENT_PER_SESSION);
        self.by_session.insert(session, own);
        if self.by_session.len() > SESSIONS_KEPT {
            self.by_session.shift_remove_index(0);
        }
    }
}

/// `entry` as kept in memory: its message and error cut at [`KEPT_MESSAGE_BYTES`].
fn kept(entry: &Value) -> Value {
    let mut entry = entry.clone();
    if let Some(message) = entry["message"].as_str().filter(|m| m.len() > KEPT_MESSAGE_BYTES) {
        entry["message"] = Value::String(crate::text::capped(message, KEPT_MESSAGE_BYTES));
    }
    if let Some(error) = entry["context"]["error"].as_str().filter(|m| m.len() > KEPT_MESSAGE_BYTES) {
        entry["context"]["error"] = Value::String(crate::text::capped(error, KEPT_MESSAGE_BYTES));
    }
    entry
}

/// An entry's `type` for a failure of `class`: `mcp_` and its category; `mcp_other` for
/// a category an adapter named (its name is in `context.category`), so that no adapter
/// can write a type of the gateway's own (`mcp_internal_error`, `mcp_server_down`).
fn category_type(class: &Classification) -> String {
    match &class.category {
        crate::recovery::classify::Category::Other(_) => "mcp_other".to_owned(),
        category => format!("mcp_{}", category.as_str().replace('-', "_")),
    }
}

fn push_bounded(entries: &mut VecDeque<Value>, entry: Value, max: usize) {
    if entries.len() == max {
        entries.pop_front();
    }
    entries.push_back(entry);
}

#[derive(Debug)]
pub struct ErrorsLog {
    tx: mpsc::Sender<Value>,
    recent: Mutex<Recent>,
    /// Floods of one kind, counted into summary entries.
    bursts: Mutex<bursts::Bursts>,
    /// Entries lost: the writer's queue was full, or the file could not be written.
    dropped: Arc<AtomicU64>,
    /// Entries queued for the writer, and how far it is (for the wait at shutdown).
    queued: AtomicU64,
    written: Arc<Written>,
    next_id: AtomicU64,
    path: PathBuf,
    /// Replaced on reload (by the old ones and the new).
    secrets: crate::redact::Current,
}

impl ErrorsLog {
    /// Starts the writer task for `path`. No entry carries any of `secrets`.
    pub fn start(path: PathBuf, max_bytes: u64, secrets: Secrets) -> Arc<Self> {
        let (tx, rx) = mpsc::channel(QUEUE);
        let writer_path = path.clone();
        let dropped = Arc::new(AtomicU64::new(0));
        let written = Arc::new(Written::default());
        let (lost, done) = (dropped.clone(), written.clone());
        tokio::task::spawn_blocking(move || write_loop(rx, &writer_path, max_bytes, &lost, &done));
        let log = Arc::new(Self {
            tx,
            recent: Mutex::default(),
            bursts: Mutex::default(),
            dropped,
            queued: AtomicU64::new(0),
            written,
            next_id: AtomicU64::new(0),
            path,
            secrets: crate::redact::Current::new(secrets),
        });
        // Ends a flood's window even when no entry of its kind follows, within a second.
        let weak = Arc::downgrade(&log);
        crate::lasting::spawn("errors log's flood summaries", move || {
            let weak = weak.clone();
            async move {
                let mut tick = tokio::time::interval(bursts::SUMMARY_DELAY);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    let Some(log) = weak.upgrade() else { break };
                    let summaries = log.bursts.locked().flush(tokio::time::Instant::now());
                    for s in summaries {
                        log.send(s);
                    }
                }
            }
        });
        log
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one entry per failed attempt of the call in `record`.
    pub fn record(&self, record: &Record, session: &str, now: SystemTime) {
        self.record_first(record, session, now, usize::MAX);
    }

    /// [`Self::record`], of the first `failures` failures only.
    pub fn record_first(&self, record: &Record, session: &str, now: SystemTime, failures: usize) {
        let recovered = record.answered_by().is_some();
        let alternative = record.answered_by().filter(|a| a.role == Role::Alternative).map(|a| a.tool.clone());
        let attempts = record.attempts.len();
        for (i, (attempt, failure, class)) in record.failures().enumerate().take(failures) {
            let id = self.new_id(now);
            let code = match failure {
                Failure::Rpc { code, .. } => Some(*code),
                _ => None,
            };
            let kind = match failure {
                Failure::Rpc { code: -32001, .. } => "mcp_abort_error".to_owned(),
                // A bug of Rebound's (a panic caught in the call), as one caught outside it is.
                Failure::Internal { .. } => "mcp_internal_error".to_owned(),
                _ => category_type(class),
            };
            let entry = json!({
                "id": id,
                "timestamp": humantime::format_rfc3339_millis(now).to_string(),
                "type": kind,
                "severity": class.severity.as_str(),
                "message": format!("MCP tool {} on server {} failed: {}", attempt.tool, attempt.server, failure.message()),
                "context": {
                    "session_id": session,
                    "server": &*attempt.server,
                    "tool_name": attempt.tool,
                    "requested_tool": record.tool,
                    "error_code": code,
                    "category": class.category.as_str(),
                    "kind": class.kind.as_str(),
                    "attempt": i + 1,
                    "attempts": attempts,
                    "retry_attempted": attempts > i + 1,
                    "alternative_used": alternative,
                },
                "recovery": {
                    "suggested_action": suggested_action(&attempt.server, &attempt.tool, failure, class),
                    "auto_recoverable": auto_recoverable(class),
                },
                "fix_status": if recovered { "recovered" } else { "unfixed" },
            });
            self.push(entry);
        }
    }

    /// A request other than a tool call (`method`: `prompts/get`, `resources/read`,
    /// `completion/complete`) to `server` failed as the gateway saw it: its server not
    /// running, no answer in time, the connection lost, the server not reading, a broken
    /// answer. (A server's own error is its answer.)
    pub fn request_failed(&self, session: &str, server: &str, method: &str, failure: &Failure, now: SystemTime) {
        let class = classify(failure, now);
        let action = match failure {
            Failure::Timeout { .. } => format!(
                "ask again later; if `{method}` keeps timing out, raise `mcpServers.{server}.recovery.timeout_ms` (each answer) or `recovery.deadline_ms` (all of it)"
            ),
            Failure::Protocol { .. } => {
                format!("the `{server}` server broke the MCP protocol; report the error to the server's maintainer")
            }
            Failure::ConnectionLost { .. } => format!(
                "the connection to the `{server}` server was lost (a server process is restarted); ask again shortly"
            ),
            _ => suggested_action(server, method, failure, &class),
        };
        self.push(json!({
            "id": self.new_id(now),
            "timestamp": humantime::format_rfc3339_millis(now).to_string(),
            "type": category_type(&class),
            "severity": class.severity.as_str(),
            "message": format!("MCP request {method} on server {server} failed: {}", failure.message()),
            "context": {
                "session_id": session,
                "server": server,
                "tool_name": null,
                "method": method,
                "category": class.category.as_str(),
                "kind": class.kind.as_str(),
            },
            "recovery": {"suggested_action": action, "auto_recoverable": auto_recoverable(&class)},
            "fix_status": "unfixed",
        }));
    }

    /// A call of `tool` on `server` still running when the gateway shut down: the
    /// record of its attempts ended with it, and it may or may not have taken effect.
    pub fn cut_short(&self, session: &str, server: &str, tool: &str, now: SystemTime) {
        let message = format!(
            "MCP tool {tool} on server {server} was still running when the gateway shut down; it may or may not have taken effect"
        );
        self.unfinished(("mcp_shutdown", "high", "shutdown"), message, (session, server, tool), now);
    }

    /// Rebound failed (a panic, caught) while answering a call of `tool` on `server`
    /// outside the recovery engine, which logs its own.
    pub fn failed_internally(&self, session: &str, server: &str, tool: &str, now: SystemTime) {
        let message = format!(
            "Rebound failed while answering a call of MCP tool {tool} on server {server} (a bug, in its log); it may or may not have taken effect"
        );
        self.unfinished(("mcp_internal_error", "critical", "internal"), message, (session, server, tool), now);
    }

    /// An entry of a call that ended without its answer, which may have taken effect.
    fn unfinished(
        &self,
        (kind, severity, category): (&str, &str, &str),
        message: String,
        (session, server, tool): (&str, &str, &str),
        now: SystemTime,
    ) {
        let action = format!("check whether the call of `{tool}` took effect, then call it again");
        self.push(json!({
            "id": self.new_id(now),
            "timestamp": humantime::format_rfc3339_millis(now).to_string(),
            "type": kind,
            "severity": severity,
            "message": message,
            "context": {"session_id": session, "server": server, "tool_name": tool, "requested_tool": tool, "category": category},
            "recovery": {"suggested_action": action, "auto_recoverable": false},
            "fix_status": "unfixed",
        }));
    }

    /// `server` (a `session`-scoped instance of that session's, else shared) crashed, could
    /// not be started, or was marked down; `trouble` says what its supervisor does next.
    pub fn server_trouble(&self, server: &str, session: Option<&str>, trouble: &Trouble, now: SystemTime) {
        let (ended, what, error) = match &trouble.ended {
            Ended::Lost(e) => ("mcp_server_crash", "was lost", Some(e)),
            Ended::StartFailed(e) => ("mcp_server_start_failed", "failed to start", Some(e)),
            Ended::Asked => ("mcp_server_restart", "was restarted on request", None),
        };
        let said = error.map(|e| format!(": {e}")).unwrap_or_default();
        let check = format!("check server `{server}`'s command, arguments and stderr");
        let (kind, severity, next, action, auto) = match trouble.next {
            Next::Restart(after) => (
                ended,
                "high",
                format!("it is started again in {} ms", after.as_millis()),
                format!("none if it comes back; if it keeps failing, {check}"),
                true,
            ),
            Next::Down { endings, tries, retry_in } => (
                "mcp_server_down",
                "critical",
                match tries {
                    1 => format!(
                        "it is still down (1 try since it was marked down), tried again every {} ms",
                        retry_in.as_millis()
                    ),
                    2.. => format!(
                        "it is still down ({tries} tries since it was marked down), tried again every {} ms",
                        retry_in.as_millis()
                    ),
                    0 => format!(
                        "it ended {endings} times in its crash window and is marked down, tried again every {} ms",
                        retry_in.as_millis()
                    ),
                },
                format!("{check} (`rebound check`); calls to it fail at once until a start holds"),
                false,
            ),
        };
        self.push(json!({
            "id": self.new_id(now),
            "timestamp": humantime::format_rfc3339_millis(now).to_string(),
            "type": kind,
            "severity": severity,
            "message": format!("MCP server {server} {what}{said}; {next}"),
            "context": {"session_id": session, "server": server, "tool_name": null, "category": "server", "error": error},
            "recovery": {"suggested_action": action, "auto_recoverable": auto},
            "fix_status": "unfixed",
        }));
    }

    /// A new entry's id: its time in milliseconds and a number of its own.
    fn new_id(&self, now: SystemTime) -> String {
        let millis = now.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or_default();
        format!("err_{millis}_{}", self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    fn push(&self, mut entry: Value) {
        let secrets = self.secrets.get();
        secrets.redact_json_within(&mut entry, MAX_TEXT_BYTES);
        let (write, summary) = self.bursts.locked().admit(&entry, tokio::time::Instant::now());
        if let Some(summary) = summary {
            self.send(summary);
        }
        if write {
            self.send(entry);
        } else {
            self.recent.locked().keep_own(kept(&entry));
        }
    }

    /// Writes the summaries of every flood still being counted, and waits up to `within`
    /// for the writer to have written everything queued (at shutdown: the process exits
    /// without waiting for the writer's thread).
    pub async fn flush(&self, within: std::time::Duration) {
        let far = tokio::time::Instant::now() + bursts::WINDOW;
        let summaries = self.bursts.locked().flush(far);
        for s in summaries {
            self.send(s);
        }
        let queued = self.queued.load(Ordering::Acquire);
        let all_written = async {
            loop {
                let written = self.written.notify.notified();
                tokio::pin!(written);
                written.as_mut().enable();
                if self.written.count.load(Ordering::Acquire) >= queued {
                    return;
                }
                written.await;
            }
        };
        if tokio::time::timeout(within, all_written).await.is_err() {
            tracing::warn!("the errors log's last entries were not all written within {} ms", within.as_millis());
        }
    }

    /// Keeps `entry` among the recent ones and hands it to the writer.
    fn send(&self, mut entry: Value) {
        if entry.get("repeated").is_some() {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            entry["id"] = Value::String(format!("{}_r{id}", entry["id"].as_str().unwrap_or("err")));
        }
        self.recent.locked().keep(&entry);
        // A summary that cannot be written loses every entry it counts.
        let stands_for = entry["repeated"]["count"].as_u64().unwrap_or(1);
        match self.tx.try_send(entry) {
            Ok(()) => _ = self.queued.fetch_add(1, Ordering::AcqRel),
            Err(_) => _ = self.dropped.fetch_add(stands_for, Ordering::Relaxed),
        }
    }

    /// The newest entries, oldest first.
    pub fn recent(&self) -> Vec<Value> {
        self.recent.locked().all.iter().cloned().collect()
    }

    /// From now on `session` (an MCP session, the stdio client) keeps its own entries, to
    /// read with [`Self::recent_of`].
    pub fn open_view(&self, session: &str) {
        self.recent.locked().readers.insert(session.to_owned());
    }

    /// `session` has ended: its view is forgotten.
    pub fn close_view(&self, session: &str) {
        let mut recent = self.recent.locked();
        recent.readers.remove(session);
        recent.by_session.shift_remove(session);
    }

    /// The newest entries of client session `session`'s calls, oldest first.
    pub fn recent_of(&self, session: &str) -> Vec<Value> {
        let recent = self.recent.locked();
        recent.by_session.get(session).map(|entries| entries.iter().cloned().collect()).unwrap_or_default()
    }

    /// From now on, entries carry none of `secrets` either.
    pub fn set_secrets(&self, secrets: Secrets) {
        self.secrets.set(secrets);
    }

    /// What it hides now: every secret of the setups applied, and of a reload about to
    /// apply once it rotated a token (the reports of the gateway's state are hidden with
    /// them too).
    pub fn secrets(&self) -> Secrets {
        self.secrets.get()
    }

    /// What it hides, as it changes: for what outlives a reload (a call's trace).
    pub fn current_secrets(&self) -> crate::redact::Current {
        self.secrets.clone()
    }

    /// Entries not written because the writer fell behind or the file was unwritable.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// How many queued entries the writer has done with (written, or counted as dropped), and
/// a wake-up for whoever waits on that.
#[derive(Debug, Default)]
struct Written {
    count: AtomicU64,
    notify: tokio::sync::Notify,
}

fn write_loop(mut rx: mpsc::Receiver<Value>, path: &Path, max_bytes: u64, dropped: &AtomicU64, done: &Written) {
    let mut warned = false;
    while let Some(entry) = rx.blocking_recv() {
        let mut line = entry.to_string();
        line.push('\n');
        if let Err(e) = append(path, line.as_bytes(), max_bytes) {
            dropped.fetch_add(entry["repeated"]["count"].as_u64().unwrap_or(1), Ordering::Relaxed);
            // Logged once: a read-only disk must not flood the log either.
            if !warned {
                tracing::warn!("cannot write the errors log {}: {e}", path.display());
                warned = true;
            }
        }
        done.count.fetch_add(1, Ordering::AcqRel);
        done.notify.notify_waiters();
    }
}

/// Appends `line` to the log at `path`, first moving a log it would take past
/// `max_bytes` to `PATH.1`. Gateways sharing one log (two stdio clients of one
/// configuration) take turns: each holds the file's lock from its size check to its
/// write, and one that finds the file moved while it waited writes to the new one. The
/// log is readable by its owner alone: it quotes every client's failures. A symbolic link
/// in the log's place is not followed (whoever could write the log's folder would have
/// the gateway write to, and take for its own, any file its user may write), and a line
/// written in part (a full disk) is taken back, so that the next is not glued to it. Nor
/// is a log that belongs to another user written, root excepted (one made for the gateway
/// beforehand): its owner could read it whatever its permissions; nor anything but a
/// regular file (a device's permissions are the whole machine's, a FIFO would hold the
/// writer).
fn append(path: &Path, line: &[u8], max_bytes: u64) -> std::io::Result<()> {
    use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _};
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    for _ in 0..LOCK_TRIES {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            // Not waiting for a reader, should a FIFO be in the log's place.
            .custom_flags((nix::fcntl::OFlag::O_NOFOLLOW | nix::fcntl::OFlag::O_NONBLOCK).bits())
            .open(path)?;
        // Another gateway stopped (Ctrl-Z) or hung while holding the lock must not stop
        // this one's writer: a turn is waited for a while, then the entry is dropped.
        let file = match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            Ok(file) => file,
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                std::thread::sleep(std::time::Duration::from_millis(10));
                continue;
            }
            Err((_, errno)) => return Err(errno.into()),
        };
        let ours = file.metadata()?;
        if !ours.is_file() {
            // A device (`/dev/null`) or a FIFO: neither kept nor made the owner's alone.
            return Err(std::io::Error::other(
                "it is not a regular file: name a file for the log (it cannot be turned off)",
            ));
        }
        let me = nix::unistd::geteuid().as_raw();
        if foreign(ours.uid(), me) {
            return Err(std::io::Error::other(format!(
                "it belongs to user {}, who could read every client's failures in it: remove it, or give it to this user (uid {me})",
                ours.uid()
            )));
        }
        // A log made before, or by root for this user (in `/var/log`): made the owner's
        // alone where the file system lets it be, and written all the same where it does not.
        if ours.permissions().mode() & 0o077 != 0
            && let Err(e) = file.set_permissions(std::fs::Permissions::from_mode(0o600))
        {
            tracing::debug!("the errors log {} keeps its permissions: {e}", path.display());
        }
        let current = std::fs::symlink_metadata(path).map(|m| (m.dev(), m.ino())).ok();
        if current != Some((ours.dev(), ours.ino())) {
            continue; // moved by another gateway while this one waited for the lock
        }
        if ours.len() > 0 && ours.len() + line.len() as u64 > max_bytes {
            let mut rotated = path.as_os_str().to_owned();
            rotated.push(".1");
            if let Err(e) = std::fs::rename(path, rotated) {
                // A folder the gateway may not write (a log made for it beforehand, in
                // `/var/log`): the log starts again in place, rather than take no entry
                // from now on, and keeps its bound.
                tracing::warn!("cannot rotate the errors log {} ({e}): emptied in place", path.display());
                file.set_len(0)?;
            }
            continue;
        }
        let written = (&*file).write_all(line);
        if written.is_err() {
            let _ = file.set_len(ours.len());
        }
        return written;
    }
    Err(std::io::Error::other("another process kept the log locked, or kept moving it"))
}

/// Whether a log owned by `owner` is another user's to a gateway running as `me`: root's
/// is not (one made for the gateway beforehand, in `/var/log`).
fn foreign(owner: u32, me: u32) -> bool {
    owner != me && owner != 0
}

/// Turns at the errors log's lock, 10 ms apart, before an entry is dropped.
const LOCK_TRIES: usize = 200;

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::recovery::engine::AttemptRecord;

    fn record(recovered: bool) -> Record {
        let failure =
            Failure::Rpc { code: -32001, message: "AbortError: The operation was aborted".into(), data: None };
        record_of(failure, recovered)
    }

    fn record_of(failure: Failure, recovered: bool) -> Record {
        let class = classify(&failure, SystemTime::UNIX_EPOCH);
        let mut attempts = vec![AttemptRecord {
            server: "lean".into(),
            tool: "lean_leansearch".into(),
            role: Role::Primary,
            failure: Some(failure),
            classification: Some(class),
            waited: Duration::ZERO,
        }];
        if recovered {
            attempts.push(AttemptRecord {
                server: "lean".into(),
                tool: "lean_loogle".into(),
                role: Role::Alternative,
                failure: None,
                classification: None,
                waited: Duration::ZERO,
            });
        }
        Record {
            server: "lean".into(),
            tool: "lean_leansearch".into(),
            attempts,
            safe: true,
            stopped: None,
            action: None,
            denied: Vec::new(),
            not_tried: Vec::new(),
            notes: 0,
        }
    }

    async fn lines(path: &Path, n: usize) -> Vec<Value> {
        for _ in 0..200 {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            if text.lines().count() >= n {
                return text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("fewer than {n} lines in {}", path.display());
    }

    #[tokio::test]
    async fn entries_have_the_documented_fields() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("logs/errors.jsonl");
        let log = ErrorsLog::start(path.clone(), 1 << 20, Secrets::default());
        log.record(&record(true), "sess_1", SystemTime::UNIX_EPOCH + Duration::from_secs(1_769_600_000));
        log.record(&record(false), "sess_1", SystemTime::UNIX_EPOCH);
        let entries = lines(&path, 2).await;
        let e = &entries[0];
        assert!(e["id"].as_str().unwrap().starts_with("err_1769600000000_"));
        assert_eq!(e["timestamp"], "2026-01-28T11:33:20.000Z");
        assert_eq!(e["type"], "mcp_abort_error");
        assert_eq!(e["severity"], "high");
        assert_eq!(
            e["message"],
            "MCP tool lean_leansearch on server lean failed: JSON-RPC error -32001: AbortError: The operation was aborted"
        );
        assert_eq!(e["context"]["error_code"], -32001);
        assert_eq!(e["context"]["tool_name"], "lean_leansearch");
        assert_eq!(e["context"]["retry_attempted"], true);
        assert_eq!(e["context"]["alternative_used"], "lean_loogle");
        assert_eq!(e["context"]["session_id"], "sess_1");
        assert_eq!(e["recovery"]["auto_recoverable"], true);
        assert_eq!(e["fix_status"], "recovered");
        assert_eq!(entries[1]["fix_status"], "unfixed");
        assert_eq!(log.recent().len(), 2);
    }

    /// A panic caught inside a call is a bug of Rebound's, under the one type the README
    /// names for them.
    #[tokio::test]
    async fn a_panic_caught_in_a_call_is_an_internal_error_and_only_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("errors.jsonl");
        let log = ErrorsLog::start(path.clone(), 1 << 20, Secrets::default());
        let panicked = Failure::Internal { reason: "a bug in the call path".into() };
        log.record(&record_of(panicked, false), "sess_1", SystemTime::UNIX_EPOCH);
        let entry = &lines(&path, 1).await[0];
        assert_eq!(
            (entry["type"].as_str(), entry["severity"].as_str()),
            (Some("mcp_internal_error"), Some("critical"))
        );
        // An adapter naming its own category cannot pass for one.
        let mut forged = record_of(Failure::Rpc { code: -32603, message: "x".into(), data: None }, false);
        let class = forged.attempts[0].classification.as_mut().unwrap();
        class.category = crate::recovery::classify::Category::Other("internal_error".into());
        log.record(&forged, "sess_1", SystemTime::UNIX_EPOCH);
        let entry = &lines(&path, 2).await[1];
        let (kind, named) = (entry["type"].as_str(), entry["context"]["category"].as_str());
        assert_eq!((kind, named), (Some("mcp_other"), Some("internal_error")));
    }

    /// A server's crash, failed start and marking down are entries too: of the session
    /// that owns a `session`-scoped instance (it sees them in `rebound://errors`), else of
    /// no session.
    #[tokio::test]
    async fn a_servers_trouble_is_an_entry() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("errors.jsonl");
        let log = ErrorsLog::start(path.clone(), 1 << 20, Secrets::default());
        log.open_view("sess_1");
        let ms = Duration::from_millis;
        let lost = Trouble {
            ended: Ended::Lost("the server process exited (exit status: 3)".into()),
            next: Next::Restart(ms(250)),
        };
        log.server_trouble("mem", Some("sess_1"), &lost, SystemTime::UNIX_EPOCH);
        let failed = Trouble {
            ended: Ended::StartFailed("no such command".into()),
            next: Next::Down { endings: 5, tries: 0, retry_in: ms(60_000) },
        };
        log.server_trouble("git", None, &failed, SystemTime::UNIX_EPOCH);
        let asked = Trouble { ended: Ended::Asked, next: Next::Down { endings: 1, tries: 3, retry_in: ms(1000) } };
        log.server_trouble("git", None, &asked, SystemTime::UNIX_EPOCH);
        let entries = lines(&path, 3).await;
        let (crash, down, again) = (&entries[0], &entries[1], &entries[2]);
        assert_eq!(crash["type"], "mcp_server_crash");
        assert_eq!(crash["severity"], "high");
        assert_eq!(
            crash["message"],
            "MCP server mem was lost: the server process exited (exit status: 3); it is started again in 250 ms"
        );
        assert_eq!(crash["context"]["session_id"], "sess_1");
        assert_eq!(crash["context"]["server"], "mem");
        assert_eq!(crash["recovery"]["auto_recoverable"], true);
        assert_eq!(crash["fix_status"], "unfixed");
        assert_eq!(down["type"], "mcp_server_down");
        assert_eq!(down["severity"], "critical");
        assert_eq!(
            down["message"],
            "MCP server git failed to start: no such command; it ended 5 times in its crash window and is marked down, tried again every 60000 ms"
        );
        assert_eq!(down["context"]["session_id"], Value::Null);
        assert_eq!(down["context"]["error"], "no such command");
        assert_eq!(down["recovery"]["auto_recoverable"], false);
        assert_eq!(
            again["message"],
            "MCP server git was restarted on request; it is still down (3 tries since it was marked down), tried again every 1000 ms"
        );
        assert_eq!(log.recent_of("sess_1").len(), 1, "the owning session's own");
        assert_eq!(log.recent().len(), 3);
    }

    /// At shutdown every entry queued is on disk once `flush` returns: the process exits
    /// without waiting for the writer.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn flush_returns_once_everything_queued_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("errors.jsonl");
        let log = ErrorsLog::start(path.clone(), 1 << 20, Secrets::default());
        // (A tool each: each kind's first entries are written, none counted.)
        for i in 0..2000 {
            log.cut_short("sess_1", "lean", &format!("tool_{i}"), SystemTime::UNIX_EPOCH);
        }
        log.flush(Duration::from_secs(10)).await;
        let written = std::fs::read_to_string(&path).unwrap_or_default();
        assert_eq!(written.lines().count(), 2000);
        assert!(written.lines().all(|l| l.contains(r#""type":"mcp_shutdown""#)), "{written}");
        // A call Rebound failed to answer (a bug, caught) is on record too.
        log.failed_internally("sess_1", "lean", "lean_goal", SystemTime::UNIX_EPOCH);
        log.flush(Duration::from_secs(10)).await;
        let written = std::fs::read_to_string(&path).unwrap_or_default();
        let last: Value = serde_json::from_str(written.lines().last().unwrap()).unwrap();
        assert_eq!((last["type"].as_str(), last["severity"].as_str()), (Some("mcp_internal_error"), Some("critical")));
        assert_eq!(last["context"]["tool_name"], "lean_goal");
    }

    /// A client's own view keeps its entries however many another client makes.
    #[test]
    fn one_clients_failures_do_not_crowd_out_anothers() {
        let mut recent = Recent::default();
        let readers =
            ["alice", "bob", "big"].into_iter().map(String::from).chain((0..SESSIONS_KEPT).map(|i| format!("s{i}")));
        recent.readers = readers.collect();
        let entry = |session: &str, i: usize| json!({"id": i, "context": {"session_id": session}});
        recent.keep(&entry("alice", 0));
        for i in 1..=RECENT * 2 {
            recent.keep(&entry("bob", i));
        }
        assert_eq!(recent.all.len(), RECENT);
        assert!(recent.all.iter().all(|e| e["context"]["session_id"] == "bob"), "the operator's view: the newest");
        assert_eq!(recent.by_session["alice"].len(), 1);
        assert_eq!(recent.by_session["bob"].len(), RECENT_PER_SESSION);
        for i in 0..SESSIONS_KEPT {
            recent.keep(&entry(&format!("s{i}"), i));
        }
        assert!(!recent.by_session.contains_key("alice"), "the session written to least recently goes first");
        assert_eq!(recent.by_session.len(), SESSIONS_KEPT);
        recent.keep(&json!({"message": "m".repeat(1 << 20), "context": {"session_id": "big"}}));
        assert!(recent.by_session["big"][0]["message"].as_str().unwrap().len() < KEPT_MESSAGE_BYTES + 4, "kept short");
    }

    /// Requests of clients without a session (each a name of its own, never read again)
    /// keep no view, so however many come, a session's view stays; a session that ended
    /// has none.
    #[tokio::test]
    async fn only_a_client_that_can_read_its_view_has_one() {
        let mut recent = Recent::default();
        recent.readers.insert("alice".into());
        let entry = |session: &str| json!({"context": {"session_id": session}});
        recent.keep(&entry("alice"));
        for i in 0..SESSIONS_KEPT * 4 {
            recent.keep(&entry(&format!("sess_stateless_{i}")));
        }
        assert_eq!(recent.by_session.len(), 1, "only alice's");
        assert_eq!(recent.by_session["alice"].len(), 1);
        assert_eq!(recent.all.len(), RECENT, "the operator's view has them all");
        let dir = tempfile::tempdir().unwrap();
        let log = ErrorsLog::start(dir.path().join("errors.jsonl"), 1 << 20, Secrets::default());
        log.open_view("bob");
        log.record(&record(false), "bob", SystemTime::UNIX_EPOCH);
        assert_eq!(log.recent_of("bob").len(), 1);
        log.close_view("bob");
        assert!(log.recent_of("bob").is_empty());
        log.record(&record(false), "bob", SystemTime::UNIX_EPOCH);
        assert!(log.recent_of("bob").is_empty(), "an ended session keeps nothing");
    }

    /// A flood's entries that are counted rather than written are still in their own
    /// client's view; its summary, which may count other clients' failures, is not.
    #[tokio::test]
    async fn a_clients_counted_failures_stay_in_its_own_view() {
        let dir = tempfile::tempdir().unwrap();
        let log = ErrorsLog::start(dir.path().join("errors.jsonl"), 1 << 20, Secrets::default());
        log.open_view("alice");
        for _ in 0..25 {
            log.record(&record(false), "alice", SystemTime::UNIX_EPOCH);
        }
        assert_eq!(log.recent().len(), 10, "the flood's first entries are written");
        assert_eq!(log.recent_of("alice").len(), RECENT_PER_SESSION, "all of hers are in her view");
        let mut recent = Recent::default();
        recent.keep(&json!({"repeated": {"count": 3}, "context": {"session_id": "bob"}}));
        assert!(recent.by_session.is_empty() && recent.all.len() == 1, "a summary is the operator's");
    }

    /// A flood's summary is written when its window ends, with no entry of its kind to
    /// follow it. (The clock is moved by hand: the writer's blocking thread keeps a paused
    /// clock from moving on its own.)
    #[tokio::test(start_paused = true)]
    async fn a_floods_summary_is_written_when_its_window_ends() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("errors.jsonl");
        let log = ErrorsLog::start(path.clone(), 1 << 20, Secrets::default());
        tokio::task::yield_now().await; // its clock starts
        tokio::time::advance(Duration::from_secs(3)).await; // the flood starts 3 s later
        for _ in 0..15 {
            log.record(&record(false), "s", SystemTime::UNIX_EPOCH);
        }
        let written = || std::fs::read_to_string(&path).unwrap_or_default().lines().count();
        for _ in 0..(bursts::WINDOW + bursts::SUMMARY_DELAY).as_secs() {
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        for _ in 0..500 {
            if written() > bursts::BURST as usize {
                break;
            }
            tokio::task::yield_now().await;
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let summary: Value =
            serde_json::from_str(text.lines().nth(bursts::BURST as usize).expect("a summary")).unwrap();
        assert_eq!(summary["repeated"]["count"], 5, "{summary}");
    }

    #[tokio::test]
    async fn the_file_is_rotated_past_its_cap() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("errors.jsonl");
        let log = ErrorsLog::start(path.clone(), 2_000, Secrets::default());
        for _ in 0..20 {
            log.record(&record(false), "s", SystemTime::UNIX_EPOCH);
        }
        // The writer is done when the newest entry is in the current file.
        let last = log.recent().last().unwrap()["id"].as_str().unwrap().to_owned();
        for _ in 0..200 {
            if std::fs::read_to_string(&path).is_ok_and(|t| t.contains(&last)) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(dir.path().join("errors.jsonl.1").exists());
        assert!(std::fs::metadata(&path).unwrap().len() <= 2_000);
    }

    /// A failure that quotes a huge text (a tool echoing its input) is one entry of a
    /// bounded size, its secret hidden however the cut falls; the file is its owner's.
    #[tokio::test]
    async fn an_entry_is_bounded_whatever_the_failure_says() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("errors.jsonl");
        let secrets = Secrets::in_order(vec!["sekrit-value-123".into()], usize::MAX);
        let log = ErrorsLog::start(path.clone(), 1 << 20, secrets);
        // The message's own words before it take 60 bytes: the cut goes through the secret.
        let said = format!("{}sekrit-value-123{}", "x".repeat(MAX_TEXT_BYTES - 60 - 8), "y".repeat(1 << 20));
        log.request_failed("s", "a", "prompts/get", &Failure::Protocol { reason: said }, SystemTime::UNIX_EPOCH);
        log.flush(Duration::from_secs(5)).await;
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 1);
        assert!(text.len() < MAX_TEXT_BYTES + 4096, "{}", text.len());
        assert!(!text.contains("sekrit"), "the secret is hidden");
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    }

    /// Gateways sharing one log take turns: each finds the file another moved, and no
    /// entry is written into the file that was moved away.
    #[test]
    fn gateways_sharing_a_log_lose_no_entry_when_it_is_rotated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("errors.jsonl");
        let line = |w: usize, n: usize| format!("{{\"w\":{w},\"n\":{n:04}}}\n");
        let size = line(0, 0).len() as u64;
        std::thread::scope(|scope| {
            for w in 0..4 {
                let path = &path;
                scope.spawn(move || {
                    for n in 0..100 {
                        append(path, line(w, n).as_bytes(), size * 300).unwrap();
                    }
                });
            }
        });
        // 400 lines, rotated once at 300: every one is in one file or the other.
        let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default().lines().count();
        assert_eq!(read(&path) + read(&dir.path().join("errors.jsonl.1")), 400);
    }

    /// A log that cannot be rotated (here because a folder is where its `.1` would go;
    /// in use, because its folder is not the gateway's to write) is emptied in place past
    /// its cap, and the newest entries are kept.
    #[test]
    fn a_log_that_cannot_be_rotated_is_emptied_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("errors.jsonl");
        std::fs::create_dir(dir.path().join("errors.jsonl.1")).unwrap();
        std::fs::write(dir.path().join("errors.jsonl.1/in-the-way"), "").unwrap();
        let line = |n: usize| format!("{{\"n\":{n:04}}}\n");
        let size = line(0).len() as u64;
        let written: Vec<_> = (0..25).map(|n| append(&path, line(n).as_bytes(), size * 10)).collect();
        assert!(written.iter().all(Result::is_ok), "{written:?}");
        let kept = std::fs::read_to_string(&path).unwrap();
        assert_eq!(kept, (20..25).map(line).collect::<String>());
    }

    /// A symbolic link put in the log's place (by whoever can write its folder) is not
    /// followed: the file it names is neither written nor made the gateway's.
    #[test]
    fn a_link_in_the_logs_place_is_not_followed() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim.txt");
        std::fs::write(&victim, "x").unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o644)).unwrap();
        let path = dir.path().join("errors.jsonl");
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        assert!(append(&path, b"{}\n", 1 << 20).is_err());
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "x");
        assert_eq!(std::fs::metadata(&victim).unwrap().permissions().mode() & 0o777, 0o644);
    }

    /// Only a regular file is the log: a device keeps its permissions (they are the whole
    /// machine's), and a FIFO with no reader is refused at once rather than waited on.
    #[test]
    fn a_device_or_a_fifo_is_not_the_log() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("errors.jsonl");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        let refused = append(&fifo, b"{}\n", 1 << 20).unwrap_err();
        assert!(
            refused.kind() == std::io::ErrorKind::Other || refused.raw_os_error() == Some(libc::ENXIO),
            "{refused}"
        );
        let null = Path::new("/dev/null");
        let mode = || std::fs::metadata(null).unwrap().permissions().mode() & 0o777;
        let before = mode();
        assert!(append(null, b"{}\n", 1 << 20).unwrap_err().to_string().contains("not a regular file"));
        assert_eq!(mode(), before, "/dev/null keeps its permissions");
    }

    #[test]
    fn a_log_is_anothers_unless_it_is_ours_or_roots() {
        assert!(!foreign(1000, 1000) && !foreign(0, 1000) && !foreign(0, 0));
        assert!(foreign(1001, 1000) && foreign(65534, 0));
    }

    /// A log another user made in the log's place (in a folder both may write) is not
    /// written: its owner could read every client's failures. Needs root to make it.
    #[test]
    fn a_log_that_belongs_to_another_user_is_not_written() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("errors.jsonl");
        std::fs::write(&path, "").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        let nobody = nix::unistd::Uid::from_raw(65534);
        nix::unistd::chown(&path, Some(nobody), None).unwrap();
        let refused = append(&path, b"{}\n", 1 << 20).unwrap_err();
        assert!(refused.to_string().contains("belongs to user 65534"), "{refused}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "");
        nix::unistd::chown(&path, Some(nix::unistd::Uid::from_raw(0)), None).unwrap();
        append(&path, b"{}\n", 1 << 20).expect("one made for it by root is written");
    }

    #[tokio::test]
    async fn an_unwritable_log_fails_no_call() {
        let log = ErrorsLog::start("/proc/rebound-cannot-write-here/errors.jsonl".into(), 1 << 20, Secrets::default());
        log.record(&record(false), "s", SystemTime::UNIX_EPOCH);
        assert_eq!(log.recent().len(), 1);
        // What it could not write is counted as dropped, once the writer has tried.
        log.flush(Duration::from_secs(5)).await;
        assert_eq!(log.dropped(), 1);
    }

    /// Past the entries queued for a writer that has fallen behind (here, one that takes
    /// none), entries are dropped and counted, not held.
    #[test]
    fn entries_past_the_queue_are_dropped_and_counted() {
        let (tx, rx) = mpsc::channel(QUEUE);
        let log = ErrorsLog {
            tx,
            recent: Mutex::default(),
            bursts: Mutex::default(),
            dropped: Arc::default(),
            queued: AtomicU64::new(0),
            written: Arc::default(),
            next_id: AtomicU64::new(0),
            path: "unwritten.jsonl".into(),
            secrets: crate::redact::Current::default(),
        };
        let lost = Trouble { ended: Ended::Lost("gone".into()), next: Next::Restart(Duration::from_millis(250)) };
        // Each of another server: no flood to fold them into.
        for i in 0..QUEUE + 100 {
            log.server_trouble(&format!("s{i}"), None, &lost, SystemTime::UNIX_EPOCH);
        }
        assert_eq!(log.dropped(), 100);
        assert_eq!(rx.len(), QUEUE, "the queue holds what it may");
        assert_eq!(log.recent().len(), RECENT, "the recent ones are kept all the same");
    }
}
