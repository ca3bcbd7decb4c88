//! Floods of one kind of failure — a breaker shedding every call through an outage, say —
//! must not bury the failure that started them. Per kind (server, tool, type, outcome,
//! and the client session for up to [`SESSIONS_APART`] sessions a kind),
//! the first [`BURST`] entries of each [`WINDOW`] are written in full; the rest are
//! counted, and the window ends with one summary entry that says how many there were,
//! between when and when, and repeats the last of them.

use std::collections::HashMap;

use serde_json::{Value, json};
use tokio::time::{Duration, Instant};

/// Entries of one kind written in full per window.
pub const BURST: u32 = 10;
pub const WINDOW: Duration = Duration::from_secs(10);
/// The most a window's summary is written after the window ends.
pub const SUMMARY_DELAY: Duration = Duration::from_secs(1);
/// Kinds tracked at once; past this, entries are written in full (the writer's queue
/// still bounds them).
const MAX_KINDS: usize = 1024;
/// Client sessions counted apart per kind of failure; the failures of any more (a
/// client on 2026-07-28 is a new session with every request) are counted together.
const SESSIONS_APART: usize = 8;

#[derive(Debug, Default)]
pub struct Bursts {
    by_kind: HashMap<String, Burst>,
    /// Per kind of failure (server, tool, type, outcome), the sessions counted apart.
    apart: HashMap<String, usize>,
}

#[derive(Debug)]
struct Burst {
    started: Instant,
    written: u32,
    suppressed: u64,
    /// The timestamp of the first entry counted instead of written.
    first: Option<Value>,
    /// The last entry counted instead of written.
    last: Option<Value>,
}

impl Bursts {
    /// Whether `entry` is written now (else it is counted), and the summary of the kind's
    /// previous window if that just ended with entries counted.
    pub fn admit(&mut self, entry: &Value, now: Instant) -> (bool, Option<Value>) {
        let (kind, base) = self.kind(entry);
        if !self.by_kind.contains_key(&kind) {
            if self.by_kind.len() >= MAX_KINDS {
                return (true, None);
            }
            if let Some(base) = base {
                *self.apart.entry(base).or_default() += 1;
            }
        }
        let burst = self.by_kind.entry(kind).or_insert_with(|| Burst::new(now));
        let mut summary = None;
        if now.duration_since(burst.started) >= WINDOW {
            summary = burst.summary();
            *burst = Burst::new(now);
        }
        if burst.written < BURST {
            burst.written += 1;
            return (true, summary);
        }
        burst.suppressed += 1;
        burst.first.get_or_insert_with(|| entry["timestamp"].clone());
        burst.last = Some(entry.clone());
        (false, summary)
    }

    /// The summaries of every window that has ended by `now`; kinds with nothing pending
    /// are forgotten.
    pub fn flush(&mut self, now: Instant) -> Vec<Value> {
        let mut out = Vec::new();
        let apart = &mut self.apart;
        self.by_kind.retain(|kind, burst| {
            if now.duration_since(burst.started) < WINDOW {
                return true;
            }
            out.extend(burst.summary());
            if let Some((base, session)) = kind.rsplit_once(SEPARATOR)
                && session != TOGETHER
                && let Some(n) = apart.get_mut(base)
            {
                *n -= 1;
                if *n == 0 {
                    apart.remove(base);
                }
            }
            false
        });
        out
    }

    /// `entry`'s kind: its kind of failure, and its client session while
    /// [`SESSIONS_APART`] sessions at most are counted apart for it, so that one client's
    /// failures neither keep another's from being written nor count into its summary;
    /// with the kind of failure when the session is to be counted apart from now on.
    fn kind(&self, entry: &Value) -> (String, Option<String>) {
        let c = &entry["context"];
        let base = [&c["server"], &c["tool_name"], &c["method"], &entry["type"], &entry["fix_status"]]
            .map(Value::to_string)
            .join("\u{0}");
        let own = format!("{base}{SEPARATOR}{}", c["session_id"]);
        if self.by_kind.contains_key(&own) {
            return (own, None);
        }
        if self.apart.get(&base).copied().unwrap_or(0) < SESSIONS_APART {
            return (own, Some(base));
        }
        (format!("{base}{SEPARATOR}{TOGETHER}"), None)
    }
}

const SEPARATOR: char = '\u{0}';
/// The session part of the kind the sessions past [`SESSIONS_APART`] share.
const TOGETHER: &str = "*";

impl Burst {
    fn new(now: Instant) -> Self {
        Self { started: now, written: 0, suppressed: 0, first: None, last: None }
    }

    fn summary(&mut self) -> Option<Value> {
        let mut last = self.last.take()?;
        let count = std::mem::take(&mut self.suppressed);
        let first = self.first.take().unwrap_or(Value::Null);
        let message =
            format!("{count} more like this, not written one by one: {}", last["message"].as_str().unwrap_or(""));
        last["message"] = json!(message);
        last["repeated"] = json!({"count": count, "first": first, "last": last["timestamp"].clone()});
        Some(last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(tool: &str, at: u64) -> Value {
        json!({"type": "mcp_circuit_open", "fix_status": "unfixed", "timestamp": at, "message": "shed",
               "context": {"server": "a", "tool_name": tool}})
    }

    #[tokio::test(start_paused = true)]
    async fn a_flood_is_written_as_its_first_entries_and_one_count() {
        let mut b = Bursts::default();
        let start = Instant::now();
        let written: Vec<bool> = (0..1000).map(|i| b.admit(&entry("t", i), start).0).collect();
        assert!(written[..BURST as usize].iter().all(|w| *w), "the start of the episode is kept");
        assert!(written[BURST as usize..].iter().all(|w| !*w));
        // Another kind is not held up by the first.
        assert!(b.admit(&entry("other", 0), start).0);
        assert!(b.flush(start + WINDOW / 2).is_empty(), "the window is still open");
        let summaries = b.flush(start + WINDOW);
        assert_eq!(summaries.len(), 1);
        let s = &summaries[0];
        assert_eq!(s["repeated"], json!({"count": 990, "first": 10, "last": 999}));
        assert!(s["message"].as_str().unwrap().starts_with("990 more like this"));
        // A new window writes in full again.
        assert!(b.admit(&entry("t", 2000), start + WINDOW * 2).0);
    }

    /// One client's flood is its own: another client's failures of the same kind are
    /// written in full.
    #[tokio::test(start_paused = true)]
    async fn one_clients_flood_does_not_silence_anothers() {
        let mut b = Bursts::default();
        let start = Instant::now();
        let of = |session: &str| {
            let mut e = entry("t", 0);
            e["context"]["session_id"] = json!(session);
            e
        };
        for _ in 0..100 {
            b.admit(&of("bob"), start);
        }
        assert!((0..BURST).all(|_| b.admit(&of("alice"), start).0));
        assert!(!b.admit(&of("alice"), start).0, "her own flood is counted");

        // A new session with every failure (a client on 2026-07-28) is still a flood: a
        // few sessions are counted apart, the rest together.
        let mut b = Bursts::default();
        let written = (0..1000).filter(|i| b.admit(&of(&format!("s{i}")), start).0).count();
        assert_eq!(written, SESSIONS_APART + BURST as usize);
        let summaries = b.flush(start + WINDOW);
        assert_eq!(summaries.len(), 1, "one summary, for the sessions counted together");
        assert_eq!(summaries[0]["repeated"]["count"], 1000 - written);
        assert!(b.apart.is_empty() && b.by_kind.is_empty(), "nothing left counted");
    }

    #[tokio::test(start_paused = true)]
    async fn a_window_that_ends_on_the_next_entry_yields_its_summary_then() {
        let mut b = Bursts::default();
        let start = Instant::now();
        for i in 0..=u64::from(BURST) {
            b.admit(&entry("t", i), start);
        }
        let (written, summary) = b.admit(&entry("t", 99), start + WINDOW);
        assert!(written);
        assert_eq!(summary.unwrap()["repeated"]["count"], 1);
    }
}
