//! Floods of one kind of failure — a breaker shedding every call through an outage, say —
//! must not bury the failure that started them. Per kind (client session, server, tool,
//! type, outcome),
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

#[derive(Debug, Default)]
pub struct Bursts {
    by_kind: HashMap<String, Burst>,
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
        let kind = kind_of(entry);
        if !self.by_kind.contains_key(&kind) && self.by_kind.len() >= MAX_KINDS {
            return (true, None);
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
        self.by_kind.retain(|_, burst| {
            if now.duration_since(burst.started) < WINDOW {
                return true;
            }
            out.extend(burst.summary());
            false
        });
        out
    }
}

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

/// A flood's kind: one client's failures are never counted into another's, so that one
/// cannot keep the other's from being written, nor be shown them in its summary.
fn kind_of(entry: &Value) -> String {
    let c = &entry["context"];
    format!(
        "{}\u{0}{}\u{0}{}\u{0}{}\u{0}{}",
        c["session_id"], c["server"], c["tool_name"], entry["type"], entry["fix_status"]
    )
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
