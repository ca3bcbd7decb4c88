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

/// How long a background loop that panicked waits before it starts again: a bug that
/// panics at once every time costs a log line a second, not a spinning core.
const AGAIN_AFTER: Duration = Duration::from_secs(1);

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
        while std::panic::AssertUnwindSafe(make()).catch_unwind().await.is_err() {
            tracing::error!("Rebound's {what} failed (a bug); it starts again");
            tokio::time::sleep(AGAIN_AFTER).await;
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
