//! The order in which an adapter sees a server's calls. Successful calls are shown to it
//! (`observe`) after the client has its answer, one at a time in the order they ended,
//! so a success never waits on an adapter; a failure's `classify` and `plan` first wait,
//! at most one adapter deadline, until what came before has been shown, so that what an
//! adapter learned (a session, a cursor) is there when it plans.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use tokio::sync::{mpsc, oneshot};

use super::super::bindings::v0_1::rebound::adapter::types as wit;
use super::super::runtime::Request;
use super::Adapter;
use crate::weight::Weigher;

/// Successful calls waiting to be shown; past this they are dropped and counted.
const QUEUE: usize = 256;

/// The most bytes of text (arguments and results) waiting to be shown, for one adapter,
/// every server it serves and every session's copy of it together; a call that would
/// take the queue past it is dropped and counted, so that an adapter slow to observe
/// holds at most this much of the gateway's memory, however large the answers and
/// however many servers and sessions.
pub const QUEUE_BYTES: usize = 16 << 20;

enum Job {
    Observe(wit::CompletedCall, usize),
    Flush(oneshot::Sender<()>),
}

/// One adapter's queue of calls to observe, with its worker made on first use.
#[derive(Default)]
pub(super) struct Lane {
    tx: OnceLock<mpsc::Sender<Job>>,
    /// Bytes of the calls queued and not shown yet, in this lane and those sharing it.
    queued: Arc<AtomicUsize>,
    /// Successful calls not shown because the queue was full, in all those lanes.
    pub dropped: Arc<AtomicU64>,
}

impl Lane {
    /// A lane of its own whose calls count in `queued`, with those of every lane sharing
    /// it (the adapter's, for all the servers it serves).
    pub fn within(queued: Arc<AtomicUsize>) -> Self {
        Self { tx: OnceLock::new(), queued, dropped: Arc::default() }
    }

    /// A lane of its own (its order, its worker) within this one's bytes.
    pub fn sharing(&self) -> Self {
        Self { tx: OnceLock::new(), queued: self.queued.clone(), dropped: self.dropped.clone() }
    }

    /// Whether a call of `arguments` and `result` may still fit, and may be shown to an
    /// adapter that reads at most `heaviest` ([`crate::weight`]): measured and weighed in
    /// one pass without being copied, and no further than the room left or the weight
    /// allowed, so that a large answer costs nothing when it would be dropped anyway. One
    /// without room is counted as dropped.
    pub fn admits(
        &self,
        arguments: Option<&impl serde::Serialize>,
        result: &impl serde::Serialize,
        heaviest: usize,
    ) -> Admission {
        let room = QUEUE_BYTES.saturating_sub(self.queued.load(Ordering::Acquire));
        let mut counted = Counted { left: room, heaviest, weigher: Weigher::default() };
        let fits = serde_json::to_writer(&mut counted, &arguments).is_ok()
            && serde_json::to_writer(&mut counted, result).is_ok();
        if fits {
            Admission::Fits
        } else if counted.weigher.weight() > heaviest {
            Admission::TooHeavy
        } else {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            Admission::NoRoom
        }
    }

    /// Queues `call` for `adapter` to observe, without waiting.
    pub fn push(&self, adapter: &Arc<Adapter>, call: wit::CompletedCall) {
        self.queue(|queued| start(Arc::downgrade(adapter), queued), call);
    }

    /// Queues `call` for the worker `start` makes on first use.
    fn queue(&self, start: impl FnOnce(Arc<AtomicUsize>) -> mpsc::Sender<Job>, call: wit::CompletedCall) {
        let tx = self.tx.get_or_init(|| start(self.queued.clone()));
        let bytes = call.server.len() + call.tool.len() + call.arguments.len() + call.call_result.len();
        let room = self.queued.fetch_add(bytes, Ordering::AcqRel) + bytes <= QUEUE_BYTES;
        if !room || tx.try_send(Job::Observe(call, bytes)).is_err() {
            self.queued.fetch_sub(bytes, Ordering::AcqRel);
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Waits until every call queued before now has been observed, at most until `end`.
    pub async fn flush_until(&self, end: tokio::time::Instant) {
        let Some(tx) = self.tx.get() else { return };
        let (done, shown) = oneshot::channel();
        if tx.try_send(Job::Flush(done)).is_ok() {
            let _ = tokio::time::timeout_at(end, shown).await;
        }
    }
}

/// Whether a successful call may be queued for an adapter to observe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Fits,
    /// The queue's bytes are taken (counted as dropped).
    NoRoom,
    /// It weighs more than the adapter may be shown.
    TooHeavy,
}

/// A sink that takes `left` bytes more, and text weighing up to `heaviest`, then fails.
struct Counted {
    left: usize,
    heaviest: usize,
    weigher: Weigher,
}

impl std::io::Write for Counted {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.left = self.left.checked_sub(bytes.len()).ok_or_else(|| std::io::Error::other("past the room left"))?;
        self.weigher.feed(bytes);
        if self.weigher.weight() > self.heaviest {
            return Err(std::io::Error::other("past the weight allowed"));
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The worker: shows queued calls in order; ends when the adapter is gone.
fn start(adapter: Weak<Adapter>, queued: Arc<AtomicUsize>) -> mpsc::Sender<Job> {
    let (tx, mut rx) = mpsc::channel(QUEUE);
    tokio::spawn(async move {
        while let Some(job) = rx.recv().await {
            match job {
                // Its bytes count until the adapter has been shown it: a call on its way
                // into the adapter is held as much as one waiting.
                Job::Observe(call, bytes) => {
                    if let Some(adapter) = adapter.upgrade() {
                        adapter.call("observe", Request::Observe(call)).await;
                    }
                    queued.fetch_sub(bytes, Ordering::AcqRel);
                }
                Job::Flush(done) => {
                    let _ = done.send(());
                }
            }
        }
    });
    tx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(bytes: usize) -> wit::CompletedCall {
        let result = "r".repeat(bytes);
        wit::CompletedCall { server: String::new(), tool: String::new(), arguments: String::new(), call_result: result }
    }

    /// Calls wait in the queue up to a number and a size: however large the answers, an
    /// adapter slow to observe holds at most [`QUEUE_BYTES`] of them.
    #[tokio::test]
    async fn the_queue_is_bounded_in_bytes_as_well_as_in_calls() {
        let lane = Lane::default();
        let (tx, mut rx) = mpsc::channel(QUEUE);
        let mut worker = Some(tx);
        let mut start = |_: Arc<AtomicUsize>| worker.take().unwrap();
        for _ in 0..5 {
            lane.queue(&mut start, call(5 << 20));
        }
        assert_eq!(lane.dropped.load(Ordering::Relaxed), 2, "16 MiB hold three of 5 MiB");
        lane.queue(&mut start, call(1 << 10));
        assert_eq!(lane.dropped.load(Ordering::Relaxed), 2, "a small one still fits");
        let Some(Job::Observe(_, bytes)) = rx.recv().await else { panic!() };
        lane.queued.fetch_sub(bytes, Ordering::AcqRel); // as the worker does
        lane.queue(&mut start, call(5 << 20));
        assert_eq!(lane.dropped.load(Ordering::Relaxed), 2, "a call shown makes room");
        // A session's copy of the adapter has a lane of its own within the same bytes.
        let copy = lane.sharing();
        let (tx, _rx) = mpsc::channel(QUEUE);
        copy.queue(|_| tx, call(5 << 20));
        assert_eq!(lane.dropped.load(Ordering::Relaxed), 3, "the copy's call is past the bytes they share");
        // So is the adapter's lane for another server it serves, its drops its own.
        let other = Lane::within(lane.queued.clone());
        let (tx, _rx) = mpsc::channel(QUEUE);
        other.queue(|_| tx, call(5 << 20));
        assert_eq!(other.dropped.load(Ordering::Relaxed), 1, "another server's call is past the bytes they share");
    }

    /// A call that cannot fit is found so before it is copied, measured no further than
    /// the room left.
    #[test]
    fn a_call_past_the_room_left_is_not_copied() {
        let lane = Lane::default();
        let small = serde_json::json!({"text": "x".repeat(1 << 10)});
        let any = usize::MAX;
        assert_eq!(lane.admits(None::<&serde_json::Value>, &small, any), Admission::Fits);
        lane.queued.store(QUEUE_BYTES - 100, Ordering::Release);
        assert_eq!(lane.admits(None::<&serde_json::Value>, &small, any), Admission::NoRoom);
        assert_eq!(
            lane.admits(Some(&small), &serde_json::json!({}), any),
            Admission::NoRoom,
            "its arguments count too"
        );
        assert_eq!(lane.dropped.load(Ordering::Relaxed), 2);
    }

    /// A call heavier than the adapter may be shown is found so in the same pass, before
    /// it is copied, by its values as well as its bytes; it is not counted as dropped.
    #[test]
    fn a_call_too_heavy_to_show_is_found_before_it_is_copied() {
        let lane = Lane::default();
        let zeros = serde_json::json!({"values": vec![0; 1000]});
        let text = serde_json::to_string(&zeros).unwrap();
        let weight = crate::weight::json(text.as_bytes()) + crate::weight::json(b"null");
        assert!(
            text.len() < 3000 && weight > 1000 * crate::weight::PER_VALUE,
            "a thousand values weigh more than their bytes"
        );
        assert_eq!(lane.admits(None::<&serde_json::Value>, &zeros, weight), Admission::Fits);
        assert_eq!(
            lane.admits(None::<&serde_json::Value>, &zeros, weight - 2 * crate::weight::PER_VALUE),
            Admission::TooHeavy
        );
        assert_eq!(
            lane.admits(Some(&zeros), &serde_json::json!({}), 64 << 10),
            Admission::TooHeavy,
            "its arguments weigh too"
        );
        assert_eq!(lane.dropped.load(Ordering::Relaxed), 0);
    }
}
