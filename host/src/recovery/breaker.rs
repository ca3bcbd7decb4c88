//! A circuit breaker per server: it opens on consecutive failures or on a failure rate
//! over a window, stays open for a time that grows with repeated openings (capped,
//! jittered), then admits exactly `half_open_max_calls` probes, and closes after
//! `success_threshold` successes. A failed probe reopens it (on a breaker many clients
//! share, a second client's: see below).
//!
//! Only failures that say something about the server's health count (see
//! `Classification::counts_for_breaker`): invalid arguments, a tool's own error from a
//! healthy server and cancellations leave the breaker alone, or one bad caller could
//! shut a good server off for everybody. Every call lost with one session (a crash) is
//! one failure ([`Blamed`]); the breaker remembers the last few lost sessions it counted.
//!
//! Nor can one client's failures open a breaker that many clients' calls go through (a
//! shared server's, over HTTP): each failure says whom it is blamed on ([`Blame`]), and
//! the thresholds are met (and, half-open, a failed probe reopens it) without the
//! failures the one client that failed most had a part in. One client whose calls fail
//! (its arguments make a tool hang, say) is shed by breakers of its own ([`levels`]); a
//! failed probe of its refuses it the next probes of that half-open period.
//!
//! Breakers come at two levels, as Envoy's outlier detection ejects one host and not the
//! cluster: one per server, and one per tool ([`ToolBreakers`]); and on a server many
//! clients share, each failing client has its own of both. [`ServerBreakers::failed`]
//! decides which failure goes where.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::clock::{Clock, Rng};
use crate::config::BreakerConfig;
use crate::lasting::Locked;

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

/// A stretch of the window: its calls' verdicts, its failures by whom they are blamed on.
#[derive(Debug)]
struct Bucket {
    start: Instant,
    successes: u32,
    failures: Failures,
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
    /// The consecutive failures (half-open, the failed probes), by whom they are blamed on.
    run: Failures,
    /// Half-open, until when a client whose probe failed gets no other: as long as the
    /// breaker would have opened again for it.
    refused_until: Option<Instant>,
    /// Openings since the breaker last closed; grows the open time.
    openings: u32,
    /// Oldest first, covering the window.
    window: VecDeque<Bucket>,
    last_success: Option<Instant>,
    /// When a call was last admitted or its verdict recorded.
    last_used: Option<Instant>,
    /// Counts the half-open periods (and resets): a verdict counts only in the period that
    /// admitted it, not in a later one it outlived (a probe's in a later half-open period,
    /// a call's from before an opening once the breaker has closed again).
    cycle: u64,
    /// The sessions whose loss was counted last, the latest last (at most
    /// [`blame::RECENT_LOSSES`]): a failure lost with one of them too is that failure,
    /// not another.
    losses: VecDeque<u64>,
}

impl State {
    /// The failures in a row, and the clients refused a probe, are forgotten.
    fn end_run(&mut self) {
        self.run.clear();
        self.refused_until = None;
    }

    /// Joins a failure lost with a session whose loss was counted (one of the last few)
    /// to that failure, if it was: its client is given a part in it wherever it was
    /// counted (the run, a bucket of the window) and is still there, and a `probe` of this
    /// half-open period frees its slot. Whether it was joined; if not, it is a new failure.
    fn join_loss(&mut self, blame: Blamed, probe: bool) -> bool {
        if !blame.lost.is_some_and(|id| self.losses.contains(&id)) {
            return false;
        }
        self.run.join(blame);
        for bucket in &mut self.window {
            bucket.failures.join(blame);
        }
        if let (Phase::HalfOpen { in_flight, successes }, true) = (self.phase, probe) {
            self.phase = Phase::HalfOpen { in_flight: in_flight.saturating_sub(1), successes };
        }
        true
    }

    /// Counts a new failure in the run (the caller counts it in the window), remembering
    /// the session it was lost with, if it was.
    fn count_failure(&mut self, blame: Blamed) {
        if let Some(id) = blame.lost {
            blame::remember(&mut self.losses, id);
        }
        self.run.add(blame);
    }

    /// A half-open period begins, with one probe out: the one being admitted.
    fn begin_half_open(&mut self) {
        self.phase = Phase::HalfOpen { in_flight: 1, successes: 0 };
        self.end_run();
        self.cycle += 1;
    }
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
            run: Failures::default(),
            refused_until: None,
            openings: 0,
            window: VecDeque::new(),
            last_success: None,
            last_used: None,
            cycle: 0,
            losses: VecDeque::new(),
        };
        Arc::new(Self { config, clock, rng, state: Mutex::new(state) })
    }

    /// Admits a call, or says how long until the breaker will try the server again.
    pub fn admit(self: &Arc<Self>) -> Result<Permit, Duration> {
        self.admit_for(Blame::Server)
    }

    /// Admits a call whose failure would be blamed on `blame`: half-open, not a client
    /// whose probe already failed in this period.
    pub fn admit_for(self: &Arc<Self>, blame: Blame) -> Result<Permit, Duration> {
        let now = self.clock.now();
        let mut s = self.state.locked();
        s.last_used = Some(now);
        let probe = match s.phase {
            Phase::Closed => false,
            Phase::Open { until } if now < until => return Err(until - now),
            Phase::Open { .. } => {
                s.begin_half_open();
                true
            }
            Phase::HalfOpen { in_flight, .. } if s.run.blames(blame) => match s.refused_until {
                Some(until) if now < until => return Err(until - now),
                // Its wait is over: a new half-open period, which it may probe, once the
                // other clients' probes of this one have had their say.
                _ if in_flight > 0 => return Err(Duration::ZERO),
                _ => {
                    s.begin_half_open();
                    true
                }
            },
            Phase::HalfOpen { in_flight, successes } => {
                // Probes are out, whose verdict comes soon.
                if in_flight >= self.config.half_open_max_calls {
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
        let mut s = self.state.locked();
        s.phase = Phase::Closed;
        s.end_run();
        s.openings = 0;
        s.window.clear();
        s.cycle += 1;
    }

    /// Whether the breaker is open and will still be `at`, refusing every call till then.
    pub fn open_at(&self, at: Instant) -> bool {
        self.refuses_at(Blame::Server, at)
    }

    /// Whether it will still refuse a call blamed on `blame` at `at`: open, or half-open
    /// with that client's probe failed and its wait not over.
    pub fn refuses_at(&self, blame: Blame, at: Instant) -> bool {
        let s = self.state.locked();
        match s.phase {
            Phase::Closed => false,
            Phase::Open { until } => at < until,
            Phase::HalfOpen { .. } => s.run.blames(blame) && s.refused_until.is_some_and(|t| at < t),
        }
    }

    pub fn phase(&self) -> Phase {
        self.state.locked().phase
    }

    pub fn snapshot(&self) -> Snapshot {
        let now = self.clock.now();
        let mut s = self.state.locked();
        self.prune(&mut s, now);
        let (calls, failures) = window_totals(&s.window);
        let (state, retry_in) = match s.phase {
            Phase::Closed => ("closed", None),
            // Its open time is over: the next call is let through as a probe.
            Phase::Open { until } if now >= until => ("half-open", None),
            Phase::Open { until } => ("open", Some(until.saturating_duration_since(now))),
            Phase::HalfOpen { .. } => ("half-open", None),
        };
        Snapshot {
            state,
            consecutive_failures: s.run.total(),
            openings: s.openings,
            retry_in,
            window_calls: calls,
            window_failures: failures.total(),
        }
    }

    fn record(&self, probe: bool, cycle: u64, outcome: Outcome, blame: Blamed) {
        let now = self.clock.now();
        let mut s = self.state.locked();
        s.last_used = Some(now);
        if outcome == Outcome::Success {
            s.last_success = Some(now);
        }
        let current_probe = probe && cycle == s.cycle;
        if outcome == Outcome::Failure && s.join_loss(blame, current_probe) {
            return;
        }
        match (s.phase, probe) {
            (Phase::HalfOpen { in_flight, successes }, true) if cycle == s.cycle => {
                let in_flight = in_flight.saturating_sub(1);
                match outcome {
                    Outcome::Success if successes + 1 >= self.config.success_threshold => {
                        s.phase = Phase::Closed;
                        s.end_run();
                        s.openings = 0;
                        s.window.clear();
                    }
                    Outcome::Success => s.phase = Phase::HalfOpen { in_flight, successes: successes + 1 },
                    Outcome::Failure => {
                        s.count_failure(blame);
                        if s.run.of_others() > 0 {
                            self.open(&mut s, now);
                        } else {
                            // One client's failed probe: the next probe, another's, decides;
                            // this one waits as long as the breaker would have reopened.
                            s.phase = Phase::HalfOpen { in_flight, successes };
                            s.refused_until = Some(super::clock::later(now, self.open_time(s.openings + 1)));
                        }
                    }
                    Outcome::Ignored => s.phase = Phase::HalfOpen { in_flight, successes },
                }
            }
            // (Admitted while closed before an opening, and come back after the breaker
            // closed again: of a period that is over.)
            (Phase::Closed, false) if cycle == s.cycle => match outcome {
                Outcome::Success => {
                    s.run.clear();
                    self.tally(&mut s, now, None);
                }
                Outcome::Failure => {
                    s.count_failure(blame);
                    self.tally(&mut s, now, Some(blame));
                    if s.run.of_others() >= self.config.failure_threshold || self.rate_tripped(&s) {
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
        self.state.locked().last_success.is_some_and(|t| t >= since)
    }

    fn open(&self, s: &mut State, now: Instant) {
        s.openings = s.openings.saturating_add(1);
        s.phase = Phase::Open { until: super::clock::later(now, self.open_time(s.openings)) };
        s.end_run();
        s.window.clear();
    }

    /// How long its `openings`th opening lasts: grown with each, capped, and jittered
    /// within the last fifth, so that breakers opened together in many gateways do not
    /// all probe the server in the same instant.
    fn open_time(&self, openings: u32) -> Duration {
        let (open, cap) = (self.config.open_ms, self.config.max_open_ms.max(self.config.open_ms));
        let grown = crate::pace::grown(open, 2.0, cap, openings.saturating_sub(1));
        grown.mul_f64(0.8 + 0.2 * self.rng.unit())
    }

    fn bucket_len(&self) -> Duration {
        Duration::from_millis((self.config.window_ms / u64::from(BUCKETS)).max(1))
    }

    fn prune(&self, s: &mut State, now: Instant) {
        let window = Duration::from_millis(self.config.window_ms);
        while s.window.front().is_some_and(|b| now.saturating_duration_since(b.start) >= window) {
            s.window.pop_front();
        }
    }

    /// Counts a verdict in the window: a failure (blamed on someone) or a success.
    fn tally(&self, s: &mut State, now: Instant, failed: Option<Blamed>) {
        self.prune(s, now);
        let fresh = s.window.back().is_some_and(|b| now.saturating_duration_since(b.start) < self.bucket_len());
        if !fresh {
            s.window.push_back(Bucket { start: now, successes: 0, failures: Failures::default() });
        }
        let bucket = s.window.back_mut().expect("just pushed");
        match failed {
            Some(blame) => bucket.failures.add(blame),
            None => bucket.successes += 1,
        }
    }

    /// Whether the window's failure rate trips it, without the failed calls of the one
    /// client that failed most (its successes stay in: the rate only falls for them).
    fn rate_tripped(&self, s: &State) -> bool {
        let (calls, failures) = window_totals(&s.window);
        let calls = calls - failures.most_of_one();
        // (Some failure of the others' at least, whatever `min_calls` says.)
        failures.of_others() > 0
            && calls >= self.config.min_calls
            && f64::from(failures.of_others()) >= self.config.failure_rate * f64::from(calls)
    }

    /// Whether it has not been used for a whole window and sheds no call now: what it
    /// knows is stale, and nothing would be lost with it.
    pub fn idle(&self) -> bool {
        let now = self.clock.now();
        let s = self.state.locked();
        let window = Duration::from_millis(self.config.window_ms);
        let unused = s.last_used.is_none_or(|t| now.saturating_duration_since(t) >= window);
        // An opening is remembered for a window after it ended, so that the next one of
        // a client that came back lasts longer.
        let busy = match s.phase {
            Phase::Closed => false,
            Phase::Open { until } => now < super::clock::later(until, window),
            Phase::HalfOpen { in_flight, .. } => in_flight > 0 || s.refused_until.is_some_and(|t| now < t),
        };
        unused && !busy
    }
}

/// The calls, and the failures by whom they are blamed on, over `window`.
fn window_totals(window: &VecDeque<Bucket>) -> (u32, Failures) {
    window.iter().fold((0, Failures::default()), |(calls, mut failures), b| {
        failures.merge(&b.failures);
        (calls + b.successes + b.failures.total(), failures)
    })
}

impl Permit {
    /// Records the call's outcome, a failure blamed on the server.
    pub fn record(self, outcome: Outcome) {
        self.record_blaming(outcome, Blame::Server);
    }

    /// Records the call's outcome, a failure blamed on `blame` (and, if it was lost with
    /// its connection, one with every call lost with it).
    pub fn record_blaming(mut self, outcome: Outcome, blame: impl Into<Blamed>) {
        self.recorded = true;
        self.breaker.record(self.probe, self.cycle, outcome, blame.into());
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if !self.recorded {
            self.breaker.record(self.probe, self.cycle, Outcome::Ignored, Blame::Server.into());
        }
    }
}

mod blame;
pub mod levels;

use blame::Failures;
pub use blame::{Blame, Blamed, Culprit};

pub use levels::{MAX_TOOL_BREAKERS, Permits, ServerBreakers, Shed, ToolBreakers};

#[cfg(test)]
mod tests;
