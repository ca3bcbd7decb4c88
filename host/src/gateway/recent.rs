//! The last calls of each server, kept for the status page's charts: when each ended,
//! how long it took and how it ended. Bounded per server; recorded as calls end.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::lasting::Locked;

/// Calls kept per server.
pub const KEPT: usize = 120;

/// One ended call.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Call {
    /// When it ended, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    pub took_ms: f64,
    /// `ok`, `recovered`, `tool_error` or `gave_up`.
    pub outcome: &'static str,
}

#[derive(Debug, Default)]
pub struct RecentCalls {
    by_server: Mutex<HashMap<String, VecDeque<Call>>>,
}

impl RecentCalls {
    pub fn push(&self, server: &str, took: Duration, outcome: &'static str) {
        let at_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        let call = Call { at_ms, took_ms: took.as_secs_f64() * 1000.0, outcome };
        let mut by_server = self.by_server.locked();
        let calls = match by_server.get_mut(server) {
            Some(calls) => calls,
            None => by_server.entry(server.to_owned()).or_default(),
        };
        if calls.len() == KEPT {
            calls.pop_front();
        }
        calls.push_back(call);
    }

    /// `server`'s last calls, oldest first.
    pub fn of(&self, server: &str) -> Vec<Call> {
        self.by_server.locked().get(server).map(|c| c.iter().copied().collect()).unwrap_or_default()
    }
}

/// The `q`-quantile (0..=1) of the calls' durations, in milliseconds.
pub fn quantile(calls: &[Call], q: f64) -> Option<f64> {
    let mut took: Vec<f64> = calls.iter().map(|c| c.took_ms).collect();
    took.sort_by(f64::total_cmp);
    let at = ((took.len() as f64 - 1.0) * q.clamp(0.0, 1.0)).round() as usize;
    took.get(at).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_last_calls_of_each_server() {
        let recent = RecentCalls::default();
        for i in 0..(KEPT + 5) {
            recent.push("a", Duration::from_millis(i as u64), "ok");
        }
        recent.push("b", Duration::from_millis(7), "gave_up");
        let a = recent.of("a");
        assert_eq!(a.len(), KEPT);
        assert_eq!(a[0].took_ms, 5.0);
        assert_eq!(recent.of("b")[0].outcome, "gave_up");
        assert!(recent.of("c").is_empty());
        assert_eq!(quantile(&a, 0.5), Some(65.0));
        assert_eq!(quantile(&a, 1.0), Some((KEPT + 4) as f64));
        assert_eq!(quantile(&[], 0.5), None);
    }
}
