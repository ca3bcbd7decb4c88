//! How often things may happen, for every layer: the one exponential backoff (a retry's
//! ceiling, a restart's delay, a breaker's open time all grow by it) and the one count of
//! recent events (a server's crashes, an adapter's faults). A leaf: it depends on
//! nothing of the gateway's.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// Wait number `n` (0-based) of an exponential backoff: `min(cap_ms, initial_ms ·
/// multiplier^n)`, computed without overflow for every `n` (and never past `cap_ms`).
pub fn grown(initial_ms: u64, multiplier: f64, cap_ms: u64, n: u32) -> Duration {
    // `powi` saturates to infinity for large n, and `min` then takes the cap; the
    // exponent is clamped because powi takes an i32.
    let grown = initial_ms as f64 * multiplier.powi(n.min(i32::MAX as u32) as i32);
    let ms = if grown.is_finite() { grown.min(cap_ms as f64) } else { cap_ms as f64 };
    // Above 2^53 an f64 rounds, possibly past the cap: clamp again in integers.
    Duration::from_millis((ms.max(0.0) as u64).min(cap_ms))
}

/// The times of recent events, to tell whether `limit` of them fell within a window (a
/// crash loop, a faulting adapter). Holds at most `limit` times.
#[derive(Debug, Default, Clone)]
pub struct Recent {
    at: VecDeque<Instant>,
}

impl Recent {
    /// Counts an event at `now`, forgets those more than `window` before it, and says
    /// whether `limit` (at least one) fell within it.
    pub fn reached(&mut self, now: Instant, window: Duration, limit: usize) -> bool {
        self.at.push_back(now);
        let limit = limit.max(1);
        while self.at.len() > limit || self.at.front().is_some_and(|t| now.saturating_duration_since(*t) > window) {
            self.at.pop_front();
        }
        self.at.len() >= limit
    }

    /// The events within the window as of the last one counted.
    pub fn len(&self) -> usize {
        self.at.len()
    }

    pub fn is_empty(&self) -> bool {
        self.at.is_empty()
    }

    pub fn clear(&mut self) {
        self.at.clear();
    }
}

/// At most `lines` log lines in each window of `every` (one starting at the first line
/// past the last window), the rest counted in `dropped`: a source of lines someone else
/// can set going (an adapter, refused requests) cannot flood the gateway's log and crowd
/// out the lines that matter.
#[derive(Debug)]
pub struct LogBudget {
    lines: u32,
    every: Duration,
    window: std::sync::Mutex<(Option<Instant>, u32)>,
    pub dropped: std::sync::atomic::AtomicU64,
}

impl LogBudget {
    pub const fn new(lines: u32, every: Duration) -> Self {
        Self { lines, every, window: std::sync::Mutex::new((None, 0)), dropped: std::sync::atomic::AtomicU64::new(0) }
    }

    /// Whether one more line may be written now.
    pub fn take(&self) -> bool {
        use crate::lasting::Locked as _;
        let now = Instant::now();
        let mut w = self.window.locked();
        if w.0.is_none_or(|start| now.duration_since(start) >= self.every) {
            *w = (Some(now), 0);
        }
        if w.1 >= self.lines {
            self.dropped.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return false;
        }
        w.1 += 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// A budget writes its lines in a window, counts the rest, and writes again in the
    /// next window.
    #[tokio::test(start_paused = true)]
    async fn a_log_budget_writes_so_many_lines_a_window_and_counts_the_rest() {
        let budget = LogBudget::new(3, Duration::from_secs(60));
        let taken = (0..10).filter(|_| budget.take()).count();
        assert_eq!((taken, budget.dropped.load(std::sync::atomic::Ordering::Relaxed)), (3, 7));
        tokio::time::advance(Duration::from_secs(59)).await;
        assert!(!budget.take(), "still the same window");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(budget.take(), "a new window");
    }

    #[test]
    fn a_backoff_grows_by_its_multiplier_to_its_cap_and_never_overflows() {
        let ms = |m, n| grown(250, m, 30_000, n).as_millis();
        assert_eq!(
            (0..9).map(|n| ms(2.0, n)).collect::<Vec<_>>(),
            [250, 500, 1000, 2000, 4000, 8000, 16_000, 30_000, 30_000]
        );
        assert_eq!(ms(1.5, 2), 562);
        assert_eq!(ms(2.0, u32::MAX), 30_000);
        assert_eq!(grown(u64::MAX, 2.0, u64::MAX, 70), Duration::from_millis(u64::MAX));
        assert_eq!(grown(0, 2.0, 10, 5), Duration::ZERO);
    }

    proptest! {
        #[test]
        fn a_backoff_is_never_past_its_cap_and_never_shrinks(
            initial in 0u64..=u64::MAX / 2,
            cap in 0u64..=u64::MAX / 2,
            multiplier in 1.0f64..1000.0,
            n in 0u32..=u32::MAX - 1,
        ) {
            let initial = initial.min(cap);
            let (this, next) = (grown(initial, multiplier, cap, n), grown(initial, multiplier, cap, n + 1));
            prop_assert!(next <= Duration::from_millis(cap));
            prop_assert!(this <= next, "{this:?} then {next:?}");
        }
    }

    #[test]
    fn recent_events_count_within_their_window_only() {
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let window = Duration::from_secs(60);
        let mut recent = Recent::default();
        assert!(!recent.reached(at(0), window, 3));
        assert!(!recent.reached(at(30), window, 3));
        // The first is more than a window before the third: two within it.
        assert!(!recent.reached(at(61), window, 3));
        assert_eq!(recent.len(), 2);
        assert!(recent.reached(at(62), window, 3));
        // However many come, no more than the limit are kept.
        for s in 63..1000 {
            assert!(recent.reached(at(63), window, 3), "{s}");
        }
        assert_eq!(recent.len(), 3);
        recent.clear();
        assert!(recent.is_empty());
        assert!(recent.reached(at(2000), window, 0), "a limit of none is one");
    }
}
