//! Time and randomness, injected: the recovery engine reads both only through these
//! handles, so its tests run on tokio's paused clock with a seeded generator.

use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;
use rand::rngs::SmallRng;
use rand::{Rng as _, SeedableRng};
use tokio::time::Instant;

use crate::lasting::Locked;

/// Monotonic time, wall time and sleeping.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> Instant;
    /// For HTTP dates and log timestamps only; never for durations.
    fn wall(&self) -> SystemTime;
    fn sleep(&self, d: Duration) -> BoxFuture<'static, ()>;
}

/// tokio's clock: real in production, pausable and advanceable in tests.
#[derive(Debug, Default, Clone, Copy)]
pub struct TokioClock;

impl Clock for TokioClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn wall(&self) -> SystemTime {
        SystemTime::now()
    }

    fn sleep(&self, d: Duration) -> BoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep(d))
    }
}

/// A source of uniform numbers in `[0, 1)`.
#[derive(Debug)]
pub struct Rng(Mutex<SmallRng>);

impl Rng {
    pub fn seeded(seed: u64) -> Self {
        Self(Mutex::new(SmallRng::seed_from_u64(seed)))
    }

    pub fn from_entropy() -> Self {
        Self(Mutex::new(SmallRng::from_os_rng()))
    }

    pub fn unit(&self) -> f64 {
        self.0.locked().random::<f64>()
    }
}

/// `now + d`, or a year from now where that would overflow (a configured "forever").
pub fn later(now: Instant, d: Duration) -> Instant {
    now.checked_add(d).unwrap_or_else(|| now + Duration::from_secs(365 * 24 * 3600))
}
