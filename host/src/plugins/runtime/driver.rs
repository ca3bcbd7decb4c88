//! What keeps plugin calls moving without holding the gateway's own threads: the epoch
//! ticker, and the thread a call goes on to once it yields.
//!
//! A call starts on its caller's task, where an adapter that answers at once (they all
//! should: tens of microseconds) costs no hand-off between threads. A guest still running
//! at the next epoch tick yields, and from then on runs on the plugins' own thread: a
//! guest that spins up to its deadline, however many of them at once, takes the gateway's
//! threads for at most one tick each, and never starves the tasks that relay every
//! server's traffic (a task that is always ready to run keeps tokio from polling for I/O
//! more than every 61 polls).

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::Poll;
use std::time::Duration;

use tokio_util::task::AbortOnDropHandle;
use wasmtime::Engine;

/// How often the epoch advances while plugins run.
pub const TICK: Duration = Duration::from_millis(5);

/// The ticker and the plugins' thread of one runtime.
pub struct Driver {
    ticker: Ticker,
    /// Never `None` but while dropped.
    thread: Option<tokio::runtime::Runtime>,
}

impl Driver {
    pub fn start(engine: &Engine) -> std::io::Result<Self> {
        let thread = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("rebound-plugins")
            .enable_all()
            .build()?;
        Ok(Self { ticker: Ticker::start(engine), thread: Some(thread) })
    }

    /// Keeps the epoch advancing while the guard lives.
    pub fn running(&self) -> TickGuard {
        self.ticker.enter()
    }

    /// Runs `call` on the caller's task until it first yields, then on the plugins'
    /// thread. Dropped before it ends, the call is dropped too (at its next yield, one
    /// tick at most: `call` should hold a [`TickGuard`]). `None` if it panicked.
    pub async fn run<T: Send + 'static>(&self, call: impl Future<Output = T> + Send + 'static) -> Option<T> {
        let mut call = Box::pin(call);
        let first = std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
        if let Poll::Ready(done) = first {
            return Some(done);
        }
        let thread = self.thread.as_ref().expect("running");
        let moved = AbortOnDropHandle::new(thread.spawn(call));
        pin!(moved).await.ok()
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // Dropped on an async task, a runtime would block it to wait for its own.
        if let Some(thread) = self.thread.take() {
            thread.shutdown_background();
        }
    }
}

/// Advances the engine's epoch every [`TICK`] while at least one plugin call is in
/// flight, and sleeps otherwise, so an idle gateway does not wake up for nothing.
struct Ticker {
    active: Arc<AtomicUsize>,
    /// Set when the runtime goes (a reload replaced it): the thread ends.
    stop: Arc<AtomicBool>,
    thread: std::thread::Thread,
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.thread.unpark();
    }
}

/// One plugin call in flight, for the ticker.
pub struct TickGuard(Arc<AtomicUsize>);

impl Ticker {
    fn start(engine: &Engine) -> Self {
        let active = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let weak = engine.weak();
        let (busy, stopped) = (active.clone(), stop.clone());
        let handle = std::thread::Builder::new()
            .name("rebound-epoch".into())
            .spawn(move || {
                loop {
                    if stopped.load(Ordering::Acquire) {
                        break;
                    }
                    if busy.load(Ordering::Acquire) == 0 {
                        std::thread::park();
                        continue;
                    }
                    std::thread::sleep(TICK);
                    match weak.upgrade() {
                        Some(engine) => engine.increment_epoch(),
                        None => break,
                    }
                }
            })
            .expect("spawn the epoch thread");
        Self { active, stop, thread: handle.thread().clone() }
    }

    fn enter(&self) -> TickGuard {
        if self.active.fetch_add(1, Ordering::AcqRel) == 0 {
            self.thread.unpark();
        }
        TickGuard(self.active.clone())
    }
}

impl Drop for TickGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::Driver;

    fn thread_name() -> String {
        std::thread::current().name().unwrap_or_default().to_owned()
    }

    /// A call that answers at once stays on its caller's thread; one that yields goes on
    /// on the plugins' thread, leaving the caller's free.
    #[tokio::test(flavor = "current_thread")]
    async fn a_call_that_yields_goes_on_on_the_plugins_thread() {
        let driver = Driver::start(&wasmtime::Engine::default()).unwrap();
        let caller = thread_name();
        assert_eq!(driver.run(async { thread_name() }).await.unwrap(), caller);
        let moved = driver
            .run(async {
                let before = thread_name();
                tokio::task::yield_now().await;
                (before, thread_name())
            })
            .await
            .unwrap();
        assert_eq!(moved, (caller, "rebound-plugins".to_owned()));
    }

    /// A call given up on is dropped where it runs, with what it holds.
    #[tokio::test(flavor = "current_thread")]
    async fn a_call_given_up_on_is_dropped() {
        struct Dropped(Arc<AtomicBool>);
        impl Drop for Dropped {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Release);
            }
        }
        let driver = Driver::start(&wasmtime::Engine::default()).unwrap();
        let dropped = Arc::new(AtomicBool::new(false));
        let held = Dropped(dropped.clone());
        let call = driver.run(async move {
            let _held = held;
            tokio::task::yield_now().await;
            std::future::pending::<()>().await;
        });
        assert!(tokio::time::timeout(std::time::Duration::from_millis(50), call).await.is_err());
        for _ in 0..200 {
            if dropped.load(Ordering::Acquire) {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        panic!("the call given up on lives on");
    }

    /// A runtime dropped on an async task (a reload replaced it) does not panic there.
    #[tokio::test(flavor = "current_thread")]
    async fn it_can_be_dropped_on_an_async_task() {
        drop(Driver::start(&wasmtime::Engine::default()).unwrap());
    }
}
