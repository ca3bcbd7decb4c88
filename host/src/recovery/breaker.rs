//! A circuit breaker per server: it opens on consecutive failures or on a failure rate
//! over a window, stays open for a time that grows with repeated openings (capped,
//! jittered), then admits exactly `half_open_max_calls` probes, and closes after
//! `success_threshold` successes. A failed probe reopens it.
//!
//! Only failures that say something about the server's health count (see
//! `Classification::counts_for_breaker`): invalid arguments, a tool's own error from a
//! healthy server and cancellations leave the breaker alone, or one bad caller could
//! shut a good server off for everybody.
//!
//! Breakers come at two levels, as Envoy's outlier detection ejects one host and not the
//! cluster: one per server, and one per tool ([`ToolBreakers`]). The engine decides which
//! failure goes where.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::clock::{Clock, Rng};
use crate::config::BreakerConfig;

/// What a finished call tells the breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Success,
    Failure,
    /// Says nothing about the server's health.
    Ignored,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Closed,
    Open { until: Instant },
    HalfOpen { in_flight: u32, successes: u32 },
}

/// A point-in-time view, for `rebound_status`.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub state: &'static str,
    pub consecutive_failures: u32,
    pub openings: u32,
    pub retry_in: Option<Duration>,
    pub window_calls: u32,
    pub window_failures: u32,
}

#[derive(Debug)]
struct State {
    phase: Phase,
    consecutive_failures: u32,
    /// Openings since the breaker last closed; grows the open time.
    openings: u32,
    /// Buckets of (start, successes, failures), oldest first, covering the window.
    window: VecDeque<(Instant, u32, u32)>,
    last_success: Option<Instant>,
    /// Counts the half-open periods (and resets): a verdict counts only in the period that
    /// admitted it, not in a later one it outlived (a probe's in a later half-open period,
    /// a call's from before an opening once the breaker has closed again).
    cycle: u64,
}

pub struct Breaker {
    config: BreakerConfig,
    clock: Arc<dyn Clock>,
    rng: Arc<Rng>,
    state: Mutex<State>,
}

/// Buckets per window: enough resolution, bounded memory whatever the call rate.
const BUCKETS: u32 = 10;

impl std::fmt::Debug for Breaker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Breaker").field("state", &self.state).finish()
    }
}

/// The right to make one call. Record its outcome; dropping it unrecorded counts as
/// [`Outcome::Ignored`] (a call abandoned by its caller says nothing about the server).
#[derive(Debug)]
pub struct Permit {
    breaker: Arc<Breaker>,
    probe: bool,
    /// The breaker's cycle when it was admitted.
    cycle: u64,
    recorded: bool,
}

impl Breaker {
    pub fn new(config: BreakerConfig, clock: Arc<dyn Clock>, rng: Arc<Rng>) -> Arc<Self> {
        let state = State {
            phase: Phase::Closed,
            consecutive_failures: 0,
            openings: 0,
            window: VecDeque::new(),
            last_success: None,
            cycle: 0,
        };
        Arc::new(Self { config, clock, rng, state: Mutex::new(state) })
    }

    /// Admits a call, or says how long until the breaker will try the server again.
    pub fn admit(self: &Arc<Self>) -> Result<Permit, Duration> {
        let now = self.clock.now();
        let mut s = self.state.lock().expect("not poisoned");
        let probe = match s.phase {
            Phase::Closed => false,
            Phase::Open { until } if now < until => return Err(until - now),
            Phase::Open { .. } => {
                s.phase = Phase::HalfOpen { in_flight: 1, successes: 0 };
                s.cycle += 1;
                true
            }
            Phase::HalfOpen { in_flight, successes } => {
                if in_flight >= self.config.half_open_max_calls {
                    // Probes are out; their verdict comes soon.
                    return Err(Duration::ZERO);
                }
                s.phase = Phase::HalfOpen { in_flight: in_flight + 1, successes };
                true
            }
        };
        let cycle = s.cycle;
        drop(s);
        Ok(Permit { breaker: self.clone(), probe, cycle, recorded: false })
    }

    /// Closes the breaker by hand (`rebound_reset_breaker`).
    pub fn reset(&self) {
        let mut s = self.state.lock().expect("not poisoned");
        s.phase = Phase::Closed;
        s.consecutive_failures = 0;
        s.openings = 0;
        s.window.clear();
        s.cycle += 1;
    }

    /// Whether the breaker is open and will still be `at`, refusing every call till then.
    pub fn open_at(&self, at: Instant) -> bool {
        matches!(self.phase(), Phase::Open { until } if at < until)
    }

    pub fn phase(&self) -> Phase {
        self.state.lock().expect("not poisoned").phase
    }

    pub fn snapshot(&self) -> Snapshot {
        let now = self.clock.now();
        let mut s = self.state.lock().expect("not poisoned");
        self.prune(&mut s, now);
        let (calls, failures) = s.window.iter().fold((0, 0), |(c, f), (_, ok, bad)| (c + ok + bad, f + bad));
        let (state, retry_in) = match s.phase {
            Phase::Closed => ("closed", None),
            // Its open time is over: the next call is let through as a probe.
            Phase::Open { until } if now >= until => ("half-open", None),
            Phase::Open { until } => ("open", Some(until.saturating_duration_since(now))),
            Phase::HalfOpen { .. } => ("half-open", None),
        };
        Snapshot {
            state,
            consecutive_failures: s.consecutive_failures,
            openings: s.openings,
            retry_in,
            window_calls: calls,
            window_failures: failures,
        }
    }

    fn record(&self, probe: bool, cycle: u64, outcome: Outcome) {
        let now = self.clock.now();
        let mut s = self.state.lock().expect("not poisoned");
        if outcome == Outcome::Success {
            s.last_success = Some(now);
        }
        match (s.phase, probe) {
            (Phase::HalfOpen { in_flight, successes }, true) if cycle == s.cycle => match outcome {
                Outcome::Success if successes + 1 >= self.config.success_threshold => {
                    s.phase = Phase::Closed;
                    s.consecutive_failures = 0;
                    s.openings = 0;
                    s.window.clear();
                }
                Outcome::Success => {
                    s.phase = Phase::HalfOpen { in_flight: in_flight.saturating_sub(1), successes: successes + 1 }
                }
                Outcome::Failure => self.open(&mut s, now),
                Outcome::Ignored => s.phase = Phase::HalfOpen { in_flight: in_flight.saturating_sub(1), successes },
            },
            // (Admitted while closed before an opening, and come back after the breaker
            // closed again: of a period that is over.)
            (Phase::Closed, false) if cycle == s.cycle => match outcome {
                Outcome::Success => {
                    s.consecutive_failures = 0;
                    self.tally(&mut s, now, false);
                }
                Outcome::Failure => {
                    s.consecutive_failures += 1;
                    self.tally(&mut s, now, true);
                    if s.consecutive_failures >= self.config.failure_threshold || self.rate_tripped(&s) {
                        self.open(&mut s, now);
                    }
                }
                Outcome::Ignored => {}
            },
            // A verdict from before the last transition: the breaker has moved on.
            _ => {}
        }
    }

    /// Whether a call through this breaker succeeded at `since` or later.
    pub fn answered_since(&self, since: Instant) -> bool {
        self.state.lock().expect("not poisoned").last_success.is_some_and(|t| t >= since)
    }

    fn open(&self, s: &mut State, now: Instant) {
        s.openings = s.openings.saturating_add(1);
        let (open, cap) = (self.config.open_ms, self.config.max_open_ms.max(self.config.open_ms));
        let grown = crate::pace::grown(open, 2.0, cap, s.openings.saturating_sub(1));
        // Jitter within the last fifth, so that breakers opened together in many
        // gateways do not all probe the server in the same instant.
        let for_ms = grown.mul_f64(0.8 + 0.2 * self.rng.unit());
        s.phase = Phase::Open { until: super::clock::later(now, for_ms) };
        s.consecutive_failures = 0;
        s.window.clear();
    }

    fn bucket_len(&self) -> Duration {
        Duration::from_millis((self.config.window_ms / u64::from(BUCKETS)).max(1))
    }

    fn prune(&self, s: &mut State, now: Instant) {
        let window = Duration::from_millis(self.config.window_ms);
        while s.window.front().is_some_and(|(start, _, _)| now.saturating_duration_since(*start) >= window) {
            s.window.pop_front();
        }
    }

    fn tally(&self, s: &mut State, now: Instant, failed: bool) {
        self.prune(s, now);
        let fresh =
            s.window.back().is_some_and(|(start, _, _)| now.saturating_duration_since(*start) < self.bucket_len());
        if !fresh {
            s.window.push_back((now, 0, 0));
        }
        let bucket = s.window.back_mut().expect("just pushed");
        if failed {
            bucket.2 += 1;
        } else {
            bucket.1 += 1;
        }
    }

    fn rate_tripped(&self, s: &State) -> bool {
        let (calls, failures) = s.window.iter().fold((0u32, 0u32), |(c, f), (_, ok, bad)| (c + ok + bad, f + bad));
        calls >= self.config.min_calls && f64::from(failures) >= self.config.failure_rate * f64::from(calls)
    }
}

impl Permit {
    pub fn record(mut self, outcome: Outcome) {
        self.recorded = true;
        self.breaker.record(self.probe, self.cycle, outcome);
    }
}

/// The most tools of one server that get a breaker of their own; calls of further tools
/// are guarded by the server's breaker alone. Tool names come from the server's listing
/// and from adapters' plans, so their number needs a bound.
pub const MAX_TOOL_BREAKERS: usize = 1024;

/// The breakers of one server's tools, each made on the tool's first call with the
/// server's breaker settings.
pub struct ToolBreakers {
    config: BreakerConfig,
    clock: Arc<dyn Clock>,
    rng: Arc<Rng>,
    by_tool: Mutex<HashMap<String, Arc<Breaker>>>,
}

impl std::fmt::Debug for ToolBreakers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolBreakers").field("tools", &self.by_tool.lock().map(|m| m.len()).unwrap_or(0)).finish()
    }
}

impl ToolBreakers {
    pub fn new(config: BreakerConfig, clock: Arc<dyn Clock>, rng: Arc<Rng>) -> Self {
        Self { config, clock, rng, by_tool: Mutex::default() }
    }

    /// The breaker of `tool`, made on first use; none past [`MAX_TOOL_BREAKERS`].
    pub fn get(&self, tool: &str) -> Option<Arc<Breaker>> {
        let mut map = self.by_tool.lock().expect("not poisoned");
        if let Some(b) = map.get(tool) {
            return Some(b.clone());
        }
        if map.len() >= MAX_TOOL_BREAKERS {
            return None;
        }
        let b = Breaker::new(self.config, self.clock.clone(), self.rng.clone());
        map.insert(tool.to_owned(), b.clone());
        Some(b)
    }

    /// The breaker of `tool` if it has one already.
    pub fn existing(&self, tool: &str) -> Option<Arc<Breaker>> {
        self.by_tool.lock().expect("not poisoned").get(tool).cloned()
    }

    /// Every tool's breaker that is not closed and clean, by name.
    pub fn troubled(&self) -> Vec<(String, Snapshot)> {
        let map = self.by_tool.lock().expect("not poisoned");
        let mut out: Vec<(String, Snapshot)> = map
            .iter()
            .map(|(t, b)| (t.clone(), b.snapshot()))
            .filter(|(_, s)| s.state != "closed" || s.consecutive_failures > 0 || s.window_failures > 0)
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Whether a tool other than `tool` answered at `since` or later: evidence that the
    /// server is up and a failure of `tool` is confined to it.
    pub fn others_answered(&self, tool: &str, since: Instant) -> bool {
        let map = self.by_tool.lock().expect("not poisoned");
        map.iter().any(|(t, b)| t != tool && b.answered_since(since))
    }

    /// Closes every tool's breaker.
    pub fn reset_all(&self) {
        for b in self.by_tool.lock().expect("not poisoned").values() {
            b.reset();
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if !self.recorded {
            self.breaker.record(self.probe, self.cycle, Outcome::Ignored);
        }
    }
}

#[cfg(test)]
mod tests;
