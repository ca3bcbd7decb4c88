//! What outlives a panic (a bug): the locks it was holding, and the gateway's background
//! loops.
//!
//! A panic while a `std` lock is held poisons it, and `lock().expect(..)` would then panic
//! in every later call through it: one bug would fail every call of a server until a
//! restart, and a guard whose `Drop` takes a poisoned lock while a panic unwinds would
//! abort the process. What the gateway's locks guard (maps, counts, queues) is changed in
//! steps that each leave it whole, so a lock is taken as it is, poisoned or not.
//!
//! A background loop (a sweep, a ticker) that panicked would be gone without a word, and
//! what it does (end held calls past their time, close idle sessions) would stop for
//! good: [`spawn`] starts it again.

use std::future::Future;
use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use futures::FutureExt as _;

/// How long a background loop that panicked waits before it starts again: a second after
/// its first panic, doubling with each panic in a row up to a minute, so that a bug that
/// panics at once every time costs a log line a minute, not a spinning core. A loop that
/// ran longer than [`AGAIN_AFTER_MAX`] before it panicked starts again after a second.
const AGAIN_AFTER_MS: u64 = 1_000;
const AGAIN_AFTER_MAX: Duration = Duration::from_secs(60);

/// Runs the loop `make` makes on the runtime, logged and started again whenever it panics,
/// until it ends of itself. `what` names it in the log.
pub fn spawn<F>(
    what: impl std::fmt::Display + Send + 'static,
    make: impl Fn() -> F + Send + 'static,
) -> tokio::task::JoinHandle<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    tokio::spawn(async move {
        let mut in_a_row = 0;
        loop {
            let started = tokio::time::Instant::now();
            if std::panic::AssertUnwindSafe(make()).catch_unwind().await.is_ok() {
                return;
            }
            if started.elapsed() > AGAIN_AFTER_MAX {
                in_a_row = 0;
            }
            let wait = crate::pace::grown(AGAIN_AFTER_MS, 2.0, AGAIN_AFTER_MAX.as_millis() as u64, in_a_row);
            in_a_row = in_a_row.saturating_add(1);
            tracing::error!("Rebound's {what} failed (a bug); it starts again in {} s", wait.as_secs());
            tokio::time::sleep(wait).await;
        }
    })
}

/// [`Mutex::lock`] and [`Mutex::get_mut`], poisoned or not.
pub trait Locked<T: ?Sized> {
    fn locked(&self) -> MutexGuard<'_, T>;
    fn locked_mut(&mut self) -> &mut T;
}

impl<T: ?Sized> Locked<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn locked_mut(&mut self) -> &mut T {
        self.get_mut().unwrap_or_else(PoisonError::into_inner)
    }
}

/// [`RwLock::read`] and [`RwLock::write`], poisoned or not.
pub trait ReadWrite<T: ?Sized> {
    fn reading(&self) -> RwLockReadGuard<'_, T>;
    fn writing(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T: ?Sized> ReadWrite<T> for RwLock<T> {
    fn reading(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn writing(&self) -> RwLockWriteGuard<'_, T> {
        self.write().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// A loop that panics is started again, until it ends of itself.
    #[tokio::test(start_paused = true)]
    async fn a_background_loop_that_panics_starts_again() {
        let runs = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counted = runs.clone();
        let task = spawn("test loop", move || {
            let run = counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            async move {
                tokio::time::sleep(Duration::from_millis(10)).await;
                assert!(run >= 2, "a bug in run {run}");
            }
        });
        task.await.expect("ended of itself");
        assert_eq!(runs.load(std::sync::atomic::Ordering::Relaxed), 3, "twice again after a panic, then done");
    }

    /// A loop that panics each time waits a second, then twice as long each time, up to a
    /// minute; one that ran for longer than that before its panic waits a second again.
    #[tokio::test(start_paused = true)]
    async fn a_loop_that_panics_each_time_waits_longer_each_time() {
        let starts = Arc::new(Mutex::new(Vec::new()));
        let (seen, t0) = (starts.clone(), tokio::time::Instant::now());
        let task = spawn("test loop", move || {
            let run = {
                let mut seen = seen.locked();
                seen.push(t0.elapsed().as_secs());
                seen.len()
            };
            async move {
                // The ninth run lasts two minutes before its panic; the tenth ends.
                if run == 9 {
                    tokio::time::sleep(Duration::from_secs(120)).await;
                }
                assert!(run >= 10, "a bug in run {run}");
            }
        });
        task.await.expect("ended of itself");
        // Waits of 1, 2, 4, 8, 16, 32, 60, 60 s; then 120 s of running and a wait of 1 s.
        assert_eq!(*starts.locked(), [0, 1, 3, 7, 15, 31, 63, 123, 183, 304]);
    }

    /// A lock a panic left poisoned is still taken, with what it held.
    #[test]
    fn a_lock_poisoned_by_a_panic_is_still_taken() {
        let (counts, table) = (Arc::new(Mutex::new(1)), Arc::new(RwLock::new(vec![1])));
        let (c, t) = (counts.clone(), table.clone());
        let panicked = std::thread::spawn(move || {
            let (_held, _written) = (c.lock().unwrap(), t.write().unwrap());
            panic!("a bug while both are held");
        })
        .join();
        assert!(panicked.is_err() && counts.is_poisoned() && table.is_poisoned());
        *counts.locked() += 1;
        table.writing().push(2);
        assert_eq!((*counts.locked(), table.reading().clone()), (2, vec![1, 2]));
    }
}
