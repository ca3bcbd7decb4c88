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

/// Breakers opened together (in many gateways, or for many tools) do not all probe the
/// server at once: each opening lasts 80–100% of its time, drawn at random.
#[tokio::test(start_paused = true)]
async fn breakers_opened_together_probe_at_different_times() {
    let config = BreakerConfig { open_ms: 1_000, ..BreakerConfig::default() };
    let opened_for: Vec<u128> = (0..20)
        .map(|seed| {
            let b = Breaker::new(config, Arc::new(TokioClock), Arc::new(Rng::seeded(seed)));
            fail(&b, 5);
            b.admit().expect_err("open").as_millis()
        })
        .collect();
    assert!(opened_for.iter().all(|ms| (800..=1000).contains(ms)), "{opened_for:?}");
    let spread = opened_for.iter().max().unwrap() - opened_for.iter().min().unwrap();
    assert!(spread >= 100, "spread over the last fifth: {opened_for:?}");
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

fn fail_as(b: &Arc<Breaker>, client: u64, n: u32) {
    for _ in 0..n {
        b.admit().expect("admitted").record_blaming(Outcome::Failure, Blame::client(client));
    }
}

/// One client's failures never open a breaker many clients share, however many: its
/// thresholds are met by the others' failures, without those of the client that failed
/// most.
#[tokio::test(start_paused = true)]
async fn one_clients_failures_alone_do_not_open_it() {
    let b = defaults();
    fail_as(&b, 1, 50);
    assert_eq!(b.phase(), Phase::Closed, "one client's failures");
    assert_eq!(b.snapshot().consecutive_failures, 50);
    fail_as(&b, 2, 4);
    assert_eq!(b.phase(), Phase::Closed, "four of the others'");
    fail_as(&b, 3, 1);
    assert!(matches!(b.phase(), Phase::Open { .. }), "five of the others', in a row");

    let b = defaults();
    fail_as(&b, 1, 4);
    fail(&b, 4);
    assert_eq!(b.phase(), Phase::Closed);
    fail(&b, 1);
    assert!(matches!(b.phase(), Phase::Open { .. }), "the server's own failures count in full");

    // Another client's success ends the run.
    let b = defaults();
    fail_as(&b, 1, 10);
    b.admit().unwrap().record_blaming(Outcome::Success, Blame::client(2));
    fail_as(&b, 2, 4);
    fail_as(&b, 3, 4);
    assert_eq!(b.phase(), Phase::Closed, "four of the others' since");
}

/// A client whose calls crash a shared server takes the others' calls in flight down
/// with its own, over and over: the crashes are its failures, not the others', and open
/// no breaker they share; a crash it had no part in counts against the server.
#[tokio::test(start_paused = true)]
async fn the_calls_one_crash_takes_down_are_one_failure() {
    let b = defaults();
    let crash = |id: u64, clients: &[u64]| {
        for &client in clients {
            let lost = Blamed { on: Blame::client(client), lost: Some(id) };
            b.admit().expect("admitted").record_blaming(Outcome::Failure, lost);
        }
    };
    for id in 0..10 {
        crash(id, &[1, 2 + id % 3, 5]);
    }
    assert_eq!(b.phase(), Phase::Closed, "{:?}", b.snapshot());
    assert_eq!(b.snapshot().consecutive_failures, 10, "one failure a crash");
    for id in 10..14 {
        crash(id, &[2, 3]);
    }
    assert_eq!(b.phase(), Phase::Closed, "four crashes without clients 1 and 5");
    crash(14, &[4]);
    assert!(matches!(b.phase(), Phase::Open { .. }), "five");
}

/// A crash is one failure however its calls' failures come back: across two buckets of
/// the window, and with another call's answer between them.
#[tokio::test(start_paused = true)]
async fn a_crash_is_one_failure_however_its_calls_come_back() {
    let b = defaults();
    let lost = |client| Blamed { on: Blame::client(client), lost: Some(1) };
    b.admit().unwrap().record_blaming(Outcome::Failure, lost(1));
    tokio::time::advance(Duration::from_secs(7)).await;
    b.admit().unwrap().record_blaming(Outcome::Success, Blame::client(3));
    b.admit().unwrap().record_blaming(Outcome::Failure, lost(2));
    let s = b.snapshot();
    assert_eq!((s.consecutive_failures, s.window_calls, s.window_failures), (0, 2, 1), "{s:?}");
}

/// Two crashes whose calls come back interleaved (a reload's old instance and its
/// successor, both lost) are two failures, each its clients': not three.
#[tokio::test(start_paused = true)]
async fn crashes_whose_calls_come_back_interleaved_are_one_failure_each() {
    let b = defaults();
    let lost = |client, id| Blamed { on: Blame::client(client), lost: Some(id) };
    for (client, id) in [(1, 10), (2, 20), (3, 10), (4, 20), (5, 10)] {
        b.admit().unwrap().record_blaming(Outcome::Failure, lost(client, id));
    }
    let s = b.snapshot();
    assert_eq!((s.consecutive_failures, s.window_failures), (2, 2), "{s:?}");
    // Only the last few are remembered: a session lost long ago counts anew.
    for id in 30..30 + super::blame::RECENT_LOSSES as u64 {
        b.admit().unwrap().record_blaming(Outcome::Failure, lost(6, id));
    }
    b.admit().unwrap().record_blaming(Outcome::Failure, lost(7, 10));
    assert_eq!(b.snapshot().consecutive_failures, 2 + super::blame::RECENT_LOSSES as u32 + 1);
}

/// Half-open, probes lost together in one crash are one failed probe, both their clients'
/// (as one client's, it does not reopen the breaker): both wait, and another client's
/// probes decide.
#[tokio::test(start_paused = true)]
async fn probes_lost_in_one_crash_are_one_failed_probe() {
    let b = breaker(BreakerConfig { half_open_max_calls: 3, ..BreakerConfig::default() });
    fail(&b, 5);
    tokio::time::advance(Duration::from_secs(61)).await;
    let lost = |client| Blamed { on: Blame::client(client), lost: Some(9) };
    let (one, two) = (b.admit_for(Blame::client(1)).unwrap(), b.admit_for(Blame::client(2)).unwrap());
    one.record_blaming(Outcome::Failure, lost(1));
    two.record_blaming(Outcome::Failure, lost(2));
    assert!(matches!(b.phase(), Phase::HalfOpen { in_flight: 0, successes: 0 }), "{:?}", b.phase());
    assert!(b.admit_for(Blame::client(1)).is_err() && b.admit_for(Blame::client(2)).is_err());
    for _ in 0..2 {
        b.admit_for(Blame::client(3)).expect("another's probe").record_blaming(Outcome::Success, Blame::client(3));
    }
    assert_eq!(b.phase(), Phase::Closed);
}

/// A crash's first failure to come back may be of a call the breaker no longer counts
/// (admitted before it opened): the crash is still counted, with the next. Half-open,
/// the probe lost in it is a failed probe.
#[tokio::test(start_paused = true)]
async fn a_crash_whose_first_failure_is_out_of_date_is_counted_with_the_next() {
    let b = defaults();
    let stale = b.admit().unwrap();
    fail(&b, 5);
    tokio::time::advance(Duration::from_secs(61)).await;
    let probe = b.admit_for(Blame::client(2)).expect("a probe");
    let lost = |client| Blamed { on: Blame::client(client), lost: Some(9) };
    stale.record_blaming(Outcome::Failure, lost(1));
    probe.record_blaming(Outcome::Failure, lost(2));
    assert!(matches!(b.phase(), Phase::HalfOpen { in_flight: 0, .. }), "{:?}", b.phase());
    assert!(b.admit_for(Blame::client(2)).is_err(), "its probe failed: it waits");
    assert_eq!(b.snapshot().consecutive_failures, 1);
}

#[tokio::test(start_paused = true)]
async fn the_failure_rate_leaves_out_the_client_that_failed_most() {
    let b = breaker(BreakerConfig {
        min_calls: 10,
        failure_rate: 0.5,
        failure_threshold: u32::MAX,
        ..BreakerConfig::default()
    });
    // Client 1 always fails, client 2 always answers: all of the failures are one's.
    for _ in 0..20 {
        fail_as(&b, 1, 1);
        b.admit().unwrap().record_blaming(Outcome::Success, Blame::client(2));
    }
    assert_eq!(b.phase(), Phase::Closed, "half the calls failed, all of them one client's");
    // Without client 1's 20 failed calls: 20 answered; the others' failures must reach half.
    for n in 1..20 {
        fail_as(&b, 2 + n % 2, 1);
        assert_eq!(b.phase(), Phase::Closed, "{n} of the others' failures");
    }
    fail_as(&b, 2, 1);
    assert!(matches!(b.phase(), Phase::Open { .. }), "20 of 40 of the others' calls failed");
}

/// Half-open, a probe one client failed frees its slot, and that client gets no other
/// probe in the period: the next probe, another client's, decides.
#[tokio::test(start_paused = true)]
async fn one_clients_failed_probe_does_not_reopen_it() {
    let b = defaults();
    fail(&b, 5);
    tokio::time::advance(Duration::from_secs(61)).await;
    b.admit_for(Blame::client(1)).expect("a probe").record_blaming(Outcome::Failure, Blame::client(1));
    assert!(matches!(b.phase(), Phase::HalfOpen { in_flight: 0, successes: 0 }), "{:?}", b.phase());
    // It waits as long as the breaker would have reopened for it (its second opening).
    let wait = b.admit_for(Blame::client(1)).expect_err("not its probe again");
    assert!(wait >= Duration::from_secs(96) && wait <= Duration::from_secs(120), "{wait:?}");
    let now = tokio::time::Instant::now();
    assert!(b.refuses_at(Blame::client(1), now) && !b.refuses_at(Blame::client(2), now));
    b.admit_for(Blame::client(2)).expect("another's probe").record_blaming(Outcome::Failure, Blame::client(2));
    assert!(matches!(b.phase(), Phase::Open { .. }));
}

/// A client alone on a shared server, its probe failed, probes again once it has waited:
/// it is not locked out of a half-open breaker no other client probes.
#[tokio::test(start_paused = true)]
async fn a_client_alone_probes_again_after_its_wait() {
    let b = defaults();
    fail(&b, 5);
    tokio::time::advance(Duration::from_secs(61)).await;
    b.admit_for(Blame::client(1)).unwrap().record_blaming(Outcome::Failure, Blame::client(1));
    let wait = b.admit_for(Blame::client(1)).expect_err("waits");
    tokio::time::advance(wait).await;
    let probe = b.admit_for(Blame::client(1)).expect("a probe of a new half-open period");
    probe.record_blaming(Outcome::Success, Blame::client(1));
    b.admit_for(Blame::client(1)).unwrap().record_blaming(Outcome::Success, Blame::client(1));
    assert_eq!(b.phase(), Phase::Closed);
}

/// Unused for a whole window and shedding nothing, a breaker is idle: what it knows is
/// stale (a failure long ago, or an open time that has passed).
#[tokio::test(start_paused = true)]
async fn a_breaker_left_alone_for_a_window_is_idle() {
    // Open for longer than a window.
    let b = breaker(BreakerConfig { open_ms: 120_000, ..BreakerConfig::default() });
    assert!(b.idle());
    fail(&b, 1);
    assert!(!b.idle(), "just used");
    tokio::time::advance(Duration::from_millis(BreakerConfig::default().window_ms)).await;
    assert!(b.idle(), "a failure a window ago, nothing since");
    fail(&b, 4); // five in a row, with that one
    tokio::time::advance(Duration::from_millis(BreakerConfig::default().window_ms)).await;
    assert!(!b.idle(), "open: it sheds calls");
    tokio::time::advance(Duration::from_millis(BreakerConfig::default().max_open_ms)).await;
    assert!(b.idle(), "its open time has passed, unused since");
}

mod levels {
    use super::*;
    use crate::recovery::breaker::levels::{Failed, MAX_CLIENT_BREAKERS, MAX_TOOL_BREAKERS};

    fn breakers() -> ServerBreakers {
        breakers_with(BreakerConfig::default())
    }

    fn breakers_with(config: BreakerConfig) -> ServerBreakers {
        ServerBreakers::new(config, Arc::new(TokioClock), Arc::new(Rng::seeded(7)))
    }

    fn failed(outcome: Outcome, tool_level: bool, undelivered: bool) -> Failed {
        let window = Duration::from_millis(BreakerConfig::default().window_ms);
        let now = tokio::time::Instant::now();
        let since = now.checked_sub(window).unwrap_or(now);
        Failed { outcome, tool_level, undelivered, lost: None, since }
    }

    fn fail_as(b: &ServerBreakers, tool: &str, client: u64, n: u32) {
        for _ in 0..n {
            let permits = b.admit(tool, Blame::client(client)).expect("admitted");
            b.failed(permits, tool, failed(Outcome::Failure, true, false));
        }
    }

    /// A client whose calls keep failing is shed by breakers of its own; the others' calls
    /// go on. Once another client fails too, the server is shed for everyone.
    #[tokio::test(start_paused = true)]
    async fn one_client_is_shed_alone_until_another_fails_too() {
        let b = breakers();
        fail_as(&b, "fetch", 1, 5);
        let shed = b.admit("fetch", Blame::client(1)).expect_err("its own breaker is open");
        assert!(shed.own && !shed.tool, "{shed:?}");
        assert_eq!(b.own(1).unwrap().snapshot().state, "open");
        assert_eq!(b.server.snapshot().state, "closed");
        let other = b.admit("fetch", Blame::client(2)).expect("another client's call goes through");
        b.succeeded(other);
        assert!(b.own(2).is_none(), "no breaker of its own without a failure");
        let now = tokio::time::Instant::now();
        assert!(b.refused_at("fetch", Blame::client(1), now).is_some_and(|w| w.contains("this client")));
        assert_eq!(b.refused_at("fetch", Blame::client(2), now), None);

        // (Client 2's success above ended client 1's run.) The others' failures open
        // the shared breaker for everyone: five in a row, without those of the client
        // that failed most.
        for client in 2..=6 {
            fail_as(&b, "fetch", client, 1);
        }
        assert_eq!(b.server.snapshot().state, "closed", "four of the others'");
        fail_as(&b, "fetch", 7, 1);
        let shed = b.admit("fetch", Blame::client(3)).expect_err("the server's breaker is open");
        assert!(!shed.own, "{shed:?}");
    }

    /// Two clients the shared breakers count as one (two /64s of one IPv6 site) open no
    /// shared breaker by failing in turn, where two clients of their own would; each is
    /// shed by its own breakers alone, and a third client's calls go on.
    #[tokio::test(start_paused = true)]
    async fn two_clients_of_one_site_are_one_client_to_the_shared_breakers() {
        let of_site = |own| Blame::Client(Culprit { own, shared: 100 });
        let fail = |b: &ServerBreakers, blame| {
            let permits = b.admit("fetch", blame).expect("admitted");
            b.failed(permits, "fetch", failed(Outcome::Failure, true, false));
        };
        let b = breakers();
        for _ in 0..5 {
            fail(&b, of_site(1));
            fail(&b, of_site(2));
        }
        assert_eq!(b.server.snapshot().state, "closed", "one client's ten failures");
        assert_eq!((b.own(1).unwrap().snapshot().state, b.own(2).unwrap().snapshot().state), ("open", "open"));
        b.succeeded(b.admit("fetch", Blame::client(3)).expect("another client's call goes through"));

        // The same failures from two clients apart open the shared breaker.
        let b = breakers();
        for _ in 0..5 {
            fail(&b, Blame::client(1));
            fail(&b, Blame::client(2));
        }
        assert_eq!(b.server.snapshot().state, "open");
    }

    /// Past the most tools with a breaker of their own, idle ones make room; while none is
    /// idle, a tool without one counts its failures at the server's level, even while
    /// other tools answer (before, they counted nowhere, and the tool was never shed).
    #[tokio::test(start_paused = true)]
    async fn tools_past_the_most_with_breakers_still_count_their_failures() {
        let b = breakers();
        for n in 0..MAX_TOOL_BREAKERS {
            b.succeeded(b.admit(&format!("t{n}"), Blame::Server).unwrap());
        }
        for _ in 0..5 {
            let permits = b.admit("late", Blame::Server).unwrap();
            b.failed(permits, "late", failed(Outcome::Failure, true, false));
            b.succeeded(b.admit("t0", Blame::Server).unwrap());
        }
        assert!(b.tools.existing("late").is_none(), "every tool's breaker is busy");
        let s = b.server.snapshot();
        assert_eq!(s.window_failures, 5, "{s:?}");
        // A window later they are idle: the next tool gets a breaker of its own.
        tokio::time::advance(Duration::from_millis(BreakerConfig::default().window_ms)).await;
        b.succeeded(b.admit("later", Blame::Server).unwrap());
        assert!(b.tools.existing("later").is_some());
    }

    /// The calls one crash took down are one failure at every level: a client's own
    /// breakers count the crash once, however many of its calls went down with it, and
    /// the shared ones blame it on each client that lost a call.
    #[tokio::test(start_paused = true)]
    async fn a_crash_is_one_failure_at_every_level() {
        let b = breakers();
        for crash in 0..4 {
            for client in [1, 1, 1, 2] {
                let permits = b.admit("fetch", Blame::client(client)).expect("admitted");
                b.failed(permits, "fetch", Failed { lost: Some(crash), ..failed(Outcome::Failure, false, false) });
            }
        }
        assert_eq!(b.own(1).unwrap().snapshot().consecutive_failures, 4, "one failure a crash");
        assert_eq!(b.own(1).unwrap().snapshot().state, "closed");
        assert_eq!(b.server.snapshot().consecutive_failures, 4);
        assert_eq!(b.server.snapshot().state, "closed", "each crash was both clients'");
        let permits = b.admit("fetch", Blame::client(1)).expect("admitted");
        b.failed(permits, "fetch", Failed { lost: Some(4), ..failed(Outcome::Failure, false, false) });
        assert_eq!(b.own(1).unwrap().snapshot().state, "open", "the fifth crash");
        assert_eq!(b.server.snapshot().state, "closed");
    }

    /// A request that never reached the server is the server's failure, whoever sent it.
    #[tokio::test(start_paused = true)]
    async fn an_undelivered_request_counts_for_everyone() {
        let b = breakers();
        for _ in 0..5 {
            let permits = b.admit("fetch", Blame::client(1)).unwrap();
            b.failed(permits, "fetch", failed(Outcome::Failure, false, true));
        }
        assert_eq!(b.server.snapshot().state, "open");
        assert!(b.own(1).is_none(), "nothing of its own to blame");
    }

    /// Over stdio, and on a session's own instance, every failure is the server's: the
    /// breaker opens as it always did, and there are no breakers of a client's own.
    #[tokio::test(start_paused = true)]
    async fn the_one_client_of_a_server_opens_its_breaker() {
        let b = breakers();
        for _ in 0..5 {
            let permits = b.admit("fetch", Blame::Server).unwrap();
            b.failed(permits, "fetch", failed(Outcome::Failure, true, false));
        }
        assert!(!b.admit("fetch", Blame::Server).expect_err("open").own);
    }

    /// Past the most breakers clients may hold, idle ones make room; a client that finds
    /// none has no breaker of its own, and the shared ones still hold.
    #[tokio::test(start_paused = true)]
    async fn clients_breakers_are_bounded() {
        // The shared breaker never opens here: this is about the clients' own.
        let b = breakers_with(BreakerConfig {
            failure_threshold: u32::MAX,
            min_calls: u32::MAX,
            ..BreakerConfig::default()
        });
        let window = Duration::from_millis(BreakerConfig::default().window_ms);
        // A server-level and a tool-level breaker each.
        for client in 0..(MAX_CLIENT_BREAKERS as u64 / 2) {
            fail_as(&b, "fetch", client, 1);
        }
        // Just before they go stale: none is idle.
        tokio::time::advance(window - Duration::from_secs(1)).await;
        fail_as(&b, "fetch", u64::MAX, 1);
        assert!(b.own(u64::MAX).is_none(), "all taken and busy");
        // Stale now (a window since the clients that failed once left), but the last
        // look was too recent to look again.
        tokio::time::advance(Duration::from_secs(2)).await;
        fail_as(&b, "fetch", u64::MAX, 1);
        assert!(b.own(u64::MAX).is_none(), "not looked for again so soon");
        tokio::time::advance(window / 10).await;
        fail_as(&b, "fetch", u64::MAX, 1);
        assert_eq!(b.own(u64::MAX).unwrap().snapshot().consecutive_failures, 1, "room was made");
        assert!(b.own(0).is_none(), "the stale ones went");
    }

    /// A client failing a tool that answers other clients is shed from that tool alone:
    /// the server and the tool are up.
    #[tokio::test(start_paused = true)]
    async fn a_client_failing_a_tool_that_answers_others_is_shed_from_it_alone() {
        let b = breakers();
        b.succeeded(b.admit("fetch", Blame::client(2)).unwrap());
        fail_as(&b, "fetch", 1, 5);
        let shed = b.admit("fetch", Blame::client(1)).expect_err("its own breaker of the tool");
        assert!(shed.own && shed.tool, "{shed:?}");
        assert!(b.own(1).is_none(), "no breaker of the server of its own: its failures were the tool's");
        b.succeeded(b.admit("other", Blame::client(1)).expect("its calls of other tools go on"));
        assert!(b.reset_tool("fetch"));
        assert!(b.admit("fetch", Blame::client(1)).is_ok(), "reset with the tool's");
    }
}
