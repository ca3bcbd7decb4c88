//! What keeps plugin calls moving without holding the gateway's own threads: the epoch
//! ticker, and the thread a call goes on to once it yields.
//!
//! A call starts on its caller's task, where an adapter that answers at once (they all
//! should: tens of microseconds) costs no hand-off between threads. A guest still running
//! at the next epoch tick yields, and from then on runs on the plugins' own threads: a
//! guest that spins up to its deadline, however many of them at once, takes the gateway's
//! threads for at most one tick each, and never starves the tasks that relay every
//! server's traffic (a task that is always ready to run keeps tokio from polling for I/O
//! more than every 61 polls). One adapter's calls take at most half of those threads at
//! once (its others wait for their turn, which is their own time), so a call that waits
//! there, ready to run, waits for other adapters: that time is counted ([`Queued`]), and
//! a call stopped at its deadline after waiting most of it was busy, not at fault.

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use tokio_util::task::AbortOnDropHandle;
use wasmtime::Engine;

use crate::lasting::Locked;

/// How often the epoch advances while plugins run.
pub const TICK: Duration = Duration::from_millis(5);

/// The ticker and the plugins' threads of one runtime.
pub struct Driver {
    ticker: Ticker,
    cores: usize,
    /// Never `None` but while dropped.
    threads: Option<tokio::runtime::Runtime>,
}

impl Driver {
    pub fn start(engine: &Engine) -> std::io::Result<Self> {
        // As many as the machine's cores (at most 4): spinning guests share them with one
        // another, and the system shares the cores with the gateway's own threads.
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(1, 4);
        let threads = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(cores)
            .thread_name("rebound-plugins")
            .enable_all()
            .build()?;
        Ok(Self { ticker: Ticker::start(engine), cores, threads: Some(threads) })
    }

    /// Keeps the epoch advancing while the guard lives.
    pub fn running(&self) -> TickGuard {
        self.ticker.enter()
    }

    /// How many of the plugins' threads one adapter's calls may take at once.
    pub fn per_adapter(&self) -> usize {
        (self.cores / 2).max(1)
    }

    /// Runs `call` on the caller's task until it first yields, then, once `turns` (its
    /// adapter's, [`Self::per_adapter`] permits) lets it, on the plugins' threads,
    /// counting into `queued` the time it waits there to be run. Dropped before it ends,
    /// the call is dropped too (at its next yield, one tick at most: `call` should hold a
    /// [`TickGuard`]). `None` if it panicked.
    pub async fn run<T: Send + 'static>(
        &self,
        call: impl Future<Output = T> + Send + 'static,
        turns: Arc<tokio::sync::Semaphore>,
        queued: Arc<AtomicU64>,
    ) -> Option<T> {
        let mut call = Box::pin(call);
        // A panic here is the call's, as it would be on the plugins' threads: contained.
        let first = std::future::poll_fn(|cx| {
            Poll::Ready(std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| call.as_mut().poll(cx))))
        })
        .await;
        match first {
            Ok(Poll::Ready(done)) => return Some(done),
            Ok(Poll::Pending) => {}
            Err(_) => return None,
        }
        let Ok(turn) = turns.acquire_owned().await else { return None };
        let call = async move {
            // Declared first, dropped last: the turn goes with the call.
            let _turn = turn;
            let call = call;
            call.await
        };
        let threads = self.threads.as_ref().expect("running");
        // Spawned, it is ready to run: its wait starts now.
        let woken = Arc::new(Stamp(Mutex::new((Some(Instant::now()), None))));
        let moved = Queued { call: Box::pin(call), queued, woken };
        pin!(AbortOnDropHandle::new(threads.spawn(moved))).await.ok()
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // Dropped on an async task, a runtime would block it to wait for its own.
        if let Some(threads) = self.threads.take() {
            threads.shutdown_background();
        }
    }
}

/// A call on the plugins' threads, counting (in nanoseconds) the time from each wake to
/// the poll that follows: the time it was ready to run and waited for a thread.
struct Queued<F> {
    call: Pin<Box<F>>,
    queued: Arc<AtomicU64>,
    woken: Arc<Stamp>,
}

/// When the call was last woken, and the waker that wakes it.
#[derive(Default)]
struct Stamp(Mutex<(Option<Instant>, Option<Waker>)>);

impl Wake for Stamp {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let mut stamp = self.0.locked();
        stamp.0.get_or_insert_with(Instant::now);
        if let Some(waker) = &stamp.1 {
            waker.wake_by_ref();
        }
    }
}

impl<F: Future> Future for Queued<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let waker = {
            let mut stamp = self.woken.0.locked();
            if let Some(at) = stamp.0.take() {
                let waited = u64::try_from(at.elapsed().as_nanos()).unwrap_or(u64::MAX);
                self.queued.fetch_add(waited, Ordering::Relaxed);
            }
            stamp.1 = Some(cx.waker().clone());
            Waker::from(self.woken.clone())
        };
        let polled = self.call.as_mut().poll(&mut Context::from_waker(&waker));
        // Woken while it ran, it is ready again only from now: the rest was its own time.
        let mut stamp = self.woken.0.locked();
        if let Some(at) = stamp.0.as_mut() {
            *at = Instant::now();
        }
        polled
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
                    // Not while a call still runs (one given up on, on its way out): a
                    // guest that ticks no more would never yield to be dropped.
                    if stopped.load(Ordering::Acquire) && busy.load(Ordering::Acquire) == 0 {
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
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::time::Duration;

    use super::Driver;

    fn counter() -> Arc<AtomicU64> {
        Arc::new(AtomicU64::new(0))
    }

    /// An adapter's turns on the plugins' threads.
    fn turns(driver: &Driver) -> Arc<tokio::sync::Semaphore> {
        Arc::new(tokio::sync::Semaphore::new(driver.per_adapter()))
    }

    fn thread_name() -> String {
        std::thread::current().name().unwrap_or_default().to_owned()
    }

    /// A call that answers at once stays on its caller's thread; one that yields goes on
    /// on the plugins' thread, leaving the caller's free.
    #[tokio::test(flavor = "current_thread")]
    async fn a_call_that_yields_goes_on_on_the_plugins_thread() {
        let driver = Driver::start(&wasmtime::Engine::default()).unwrap();
        let caller = thread_name();
        assert_eq!(driver.run(async { thread_name() }, turns(&driver), counter()).await.unwrap(), caller);
        let moved = driver
            .run(
                async {
                    let before = thread_name();
                    tokio::task::yield_now().await;
                    (before, thread_name())
                },
                turns(&driver),
                counter(),
            )
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
        let call = driver.run(
            async move {
                let _held = held;
                tokio::task::yield_now().await;
                std::future::pending::<()>().await;
            },
            turns(&driver),
            counter(),
        );
        assert!(tokio::time::timeout(std::time::Duration::from_millis(50), call).await.is_err());
        for _ in 0..200 {
            if dropped.load(Ordering::Acquire) {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        panic!("the call given up on lives on");
    }

    /// The time a call waits, ready, for one of the plugins' threads is counted: with
    /// every thread held by other adapters' calls, it waits; a call that answers at once
    /// never waits there. (Ordered by signals, not by sleeps.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_calls_wait_for_a_thread_is_counted() {
        let driver = Arc::new(Driver::start(&wasmtime::Engine::default()).unwrap());
        let (held, mut holding_all) = tokio::sync::mpsc::unbounded_channel();
        let (gates, holding): (Vec<_>, Vec<_>) = (0..driver.cores)
            .map(|_| {
                let (driver, held) = (driver.clone(), held.clone());
                let (gate, closed) = std::sync::mpsc::channel::<()>();
                let hold = async move {
                    tokio::task::yield_now().await; // now on a plugins' thread
                    held.send(()).unwrap();
                    let _ = closed.recv(); // holds its thread until its gate opens
                };
                (gate, tokio::spawn(async move { driver.run(hold, turns(&driver), counter()).await }))
            })
            .unzip();
        for _ in 0..driver.cores {
            holding_all.recv().await.unwrap();
        }
        let (queued, its_turns) = (counter(), turns(&driver));
        let waiting = tokio::spawn({
            let (driver, queued, its_turns) = (driver.clone(), queued.clone(), its_turns.clone());
            async move { driver.run(tokio::task::yield_now(), its_turns, queued).await }
        });
        // Its turn taken, it is on its way to a thread, all of them held.
        while its_turns.available_permits() == driver.per_adapter() {
            tokio::task::yield_now().await;
        }
        drop(gates);
        waiting.await.unwrap().unwrap();
        assert!(queued.load(Ordering::Relaxed) > 0, "it waited for a thread");
        for h in holding {
            h.await.unwrap().unwrap();
        }
        let alone = counter();
        driver.run(async {}, turns(&driver), alone.clone()).await.unwrap();
        assert_eq!(alone.load(Ordering::Relaxed), 0, "answered at once, it never waited there");
    }

    /// One adapter's calls take at most its turns of the plugins' threads at once: the
    /// others wait for a turn (their own time), so a call waiting for a thread always
    /// waits for another adapter's.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_adapters_calls_take_at_most_half_the_threads() {
        let driver = Arc::new(Driver::start(&wasmtime::Engine::default()).unwrap());
        let (mine, running, most) = (turns(&driver), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let calls: Vec<_> = (0..8)
            .map(|_| {
                let (driver, mine, running, most) = (driver.clone(), mine.clone(), running.clone(), most.clone());
                tokio::spawn(async move {
                    let call = async move {
                        tokio::task::yield_now().await;
                        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(20));
                        running.fetch_sub(1, Ordering::SeqCst);
                    };
                    driver.run(call, mine, counter()).await
                })
            })
            .collect();
        for call in calls {
            call.await.unwrap().unwrap();
        }
        assert_eq!(most.load(Ordering::SeqCst), driver.per_adapter() as u64);
    }

    /// A call that panics is answered `None` wherever it panics, on its caller's task
    /// (before it first yields) as on the plugins' threads, and the caller goes on.
    #[tokio::test(flavor = "current_thread")]
    async fn a_call_that_panics_is_contained_where_it_panics() {
        let driver = Driver::start(&wasmtime::Engine::default()).unwrap();
        assert!(driver.run(async { panic!("at once") }, turns(&driver), counter()).await.is_none());
        let later = async {
            tokio::task::yield_now().await;
            panic!("once moved")
        };
        assert!(driver.run(later, turns(&driver), counter()).await.is_none());
        assert_eq!(driver.run(async { 7 }, turns(&driver), counter()).await, Some(7));
    }

    /// A runtime dropped on an async task (a reload replaced it) does not panic there.
    #[tokio::test(flavor = "current_thread")]
    async fn it_can_be_dropped_on_an_async_task() {
        drop(Driver::start(&wasmtime::Engine::default()).unwrap());
    }
}
