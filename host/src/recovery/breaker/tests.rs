use std::time::Duration;

use super::*;
use crate::recovery::clock::TokioClock;

fn breaker(config: BreakerConfig) -> Arc<Breaker> {
    Breaker::new(config, Arc::new(TokioClock), Arc::new(Rng::seeded(7)))
}

fn defaults() -> Arc<Breaker> {
    breaker(BreakerConfig::default())
}

fn fail(b: &Arc<Breaker>, n: u32) {
    for _ in 0..n {
        b.admit().expect("admitted").record(Outcome::Failure);
    }
}

#[tokio::test(start_paused = true)]
async fn opens_after_consecutive_failures_and_rejects_without_calling() {
    let b = defaults();
    fail(&b, 4);
    assert_eq!(b.phase(), Phase::Closed);
    b.admit().unwrap().record(Outcome::Success);
    fail(&b, 4);
    assert_eq!(b.phase(), Phase::Closed, "a success resets the count");
    fail(&b, 1);
    let retry_in = b.admit().expect_err("open");
    assert!(retry_in >= Duration::from_secs(48) && retry_in <= Duration::from_secs(60), "{retry_in:?}");
}

/// Calls admitted before the breaker opened that fail after it has closed again (a hung
/// call timing out late) are of the period before: they do not count towards opening it
/// again on a server that has recovered.
#[tokio::test(start_paused = true)]
async fn a_verdict_from_before_an_opening_does_not_count_after_the_breaker_closed() {
    let b = defaults();
    let hung: Vec<Permit> = (0..5).map(|_| b.admit().unwrap()).collect();
    fail(&b, 5);
    tokio::time::advance(Duration::from_secs(61)).await;
    for _ in 0..BreakerConfig::default().success_threshold {
        b.admit().expect("a probe").record(Outcome::Success);
    }
    assert_eq!(b.phase(), Phase::Closed);
    for permit in hung {
        permit.record(Outcome::Failure);
    }
    assert_eq!(b.phase(), Phase::Closed, "the late failures were of the period before");
    assert_eq!(b.snapshot().consecutive_failures, 0);
    fail(&b, 5);
    assert!(b.admit().is_err(), "this period's own failures still open it");
}

#[tokio::test(start_paused = true)]
async fn ignored_outcomes_do_not_count() {
    let b = defaults();
    for _ in 0..50 {
        b.admit().unwrap().record(Outcome::Ignored);
        drop(b.admit().unwrap()); // abandoned by its caller
    }
    assert_eq!(b.phase(), Phase::Closed);
    assert_eq!(b.snapshot().window_calls, 0);
}

#[tokio::test(start_paused = true)]
async fn half_open_admits_exactly_the_configured_probes_among_many_callers() {
    let b = breaker(BreakerConfig { half_open_max_calls: 3, ..BreakerConfig::default() });
    fail(&b, 5);
    tokio::time::advance(Duration::from_secs(61)).await;
    let tasks: Vec<_> = (0..200)
        .map(|_| {
            let b = b.clone();
            tokio::spawn(async move { b.admit().ok() })
        })
        .collect();
    let mut permits = Vec::new();
    for t in tasks {
        permits.extend(t.await.unwrap());
    }
    assert_eq!(permits.len(), 3);
    assert!(matches!(b.phase(), Phase::HalfOpen { in_flight: 3, successes: 0 }));
    // An abandoned probe frees its slot for another caller.
    drop(permits.pop());
    let again = b.admit().expect("a slot was freed");
    permits.push(again);
    assert!(b.admit().is_err());
}

#[tokio::test(start_paused = true)]
async fn closes_after_success_threshold_probes() {
    let b = defaults();
    fail(&b, 5);
    tokio::time::advance(Duration::from_secs(60)).await;
    b.admit().unwrap().record(Outcome::Success);
    assert!(matches!(b.phase(), Phase::HalfOpen { successes: 1, .. }));
    b.admit().unwrap().record(Outcome::Success);
    assert_eq!(b.phase(), Phase::Closed);
    assert_eq!(b.snapshot().openings, 0);
}

#[tokio::test(start_paused = true)]
async fn a_failed_probe_reopens_for_longer_up_to_the_cap() {
    let b = breaker(BreakerConfig { open_ms: 1_000, max_open_ms: 4_000, ..BreakerConfig::default() });
    fail(&b, 5);
    let mut opened_for = Vec::new();
    for _ in 0..5 {
        let wait = b.admit().expect_err("open");
        opened_for.push(wait.as_millis());
        tokio::time::advance(wait).await;
        b.admit().expect("probe").record(Outcome::Failure);
    }
    let bounds = [(800, 1000), (1600, 2000), (3200, 4000), (3200, 4000), (3200, 4000)];
    for (got, (lo, hi)) in opened_for.iter().zip(bounds) {
        assert!((lo..=hi).contains(got), "{opened_for:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_timed_out_probe_counts_as_a_failure() {
    let b = defaults();
    fail(&b, 5);
    tokio::time::advance(Duration::from_secs(60)).await;
    let probe = b.admit().unwrap();
    assert!(b.admit().is_err(), "one probe at a time");
    probe.record(Outcome::Failure);
    assert!(matches!(b.phase(), Phase::Open { .. }));
}

#[tokio::test(start_paused = true)]
async fn opens_on_failure_rate_over_the_window() {
    let b = breaker(BreakerConfig { min_calls: 10, failure_rate: 0.5, ..BreakerConfig::default() });
    // Alternating: never two failures in a row, but half of all calls fail.
    for i in 0..9 {
        b.admit().unwrap().record(if i % 2 == 0 { Outcome::Success } else { Outcome::Failure });
    }
    assert_eq!(b.phase(), Phase::Closed, "below min_calls");
    b.admit().unwrap().record(Outcome::Failure);
    assert!(matches!(b.phase(), Phase::Open { .. }));
}

#[tokio::test(start_paused = true)]
async fn old_calls_leave_the_window() {
    let b = breaker(BreakerConfig { min_calls: 4, failure_rate: 0.5, window_ms: 10_000, ..BreakerConfig::default() });
    fail(&b, 3);
    b.admit().unwrap().record(Outcome::Success);
    tokio::time::advance(Duration::from_secs(11)).await;
    assert_eq!(b.snapshot().window_calls, 0);
    fail(&b, 1);
    assert_eq!(b.phase(), Phase::Closed);
}

#[tokio::test(start_paused = true)]
async fn reset_closes_it_by_hand() {
    let b = defaults();
    fail(&b, 5);
    b.reset();
    assert!(b.admit().is_ok());
}

/// A probe that outlives its half-open period (another probe failed and the breaker
/// reopened, then half-opened again) has no say in the next one: it neither counts
/// towards closing nor frees a slot that lets more than `half_open_max_calls` out.
#[tokio::test(start_paused = true)]
async fn a_probe_from_an_earlier_half_open_period_has_no_say() {
    let b = breaker(BreakerConfig { half_open_max_calls: 2, ..BreakerConfig::default() });
    fail(&b, 5);
    tokio::time::advance(Duration::from_secs(61)).await;
    let (first, late) = (b.admit().expect("probe"), b.admit().expect("probe"));
    first.record(Outcome::Failure);
    tokio::time::advance(b.admit().expect_err("open again")).await;
    let current = b.admit().expect("a probe of the new period");
    late.record(Outcome::Success);
    assert!(matches!(b.phase(), Phase::HalfOpen { in_flight: 1, successes: 0 }), "{:?}", b.phase());
    let second = b.admit().expect("the period's second probe");
    assert!(b.admit().is_err(), "no third probe while two are out");
    current.record(Outcome::Success);
    second.record(Outcome::Success);
    assert_eq!(b.phase(), Phase::Closed);
}
