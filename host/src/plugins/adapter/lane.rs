//! The order in which an adapter sees a server's calls. Successful calls are shown to it
//! (`observe`) after the client has its answer, one at a time in the order they ended,
//! so a success never waits on an adapter; a failure's `classify` and `plan` first wait,
//! at most one adapter deadline, until what came before has been shown, so that what an
//! adapter learned (a session, a cursor) is there when it plans.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::super::bindings::v0_1::rebound::adapter::types as wit;
use super::super::runtime::Request;
use super::Adapter;

/// Successful calls waiting to be shown; past this they are dropped and counted.
const QUEUE: usize = 256;

enum Job {
    Observe(wit::CompletedCall),
    Flush(oneshot::Sender<()>),
}

/// One adapter's queue of calls to observe, with its worker made on first use.
#[derive(Default)]
pub(super) struct Lane {
    tx: OnceLock<mpsc::Sender<Job>>,
    /// Successful calls not shown because the queue was full.
    pub dropped: AtomicU64,
}

impl Lane {
    /// Queues `call` for `adapter` to observe, without waiting.
    pub fn push(&self, adapter: &Arc<Adapter>, call: wit::CompletedCall) {
        let tx = self.tx.get_or_init(|| start(Arc::downgrade(adapter)));
        if tx.try_send(Job::Observe(call)).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Waits until every call queued before now has been observed, at most `within`.
    pub async fn flush(&self, within: Duration) {
        let Some(tx) = self.tx.get() else { return };
        let (done, shown) = oneshot::channel();
        if tx.try_send(Job::Flush(done)).is_ok() {
            let _ = tokio::time::timeout(within, shown).await;
        }
    }
}

/// The worker: shows queued calls in order; ends when the adapter is gone.
fn start(adapter: Weak<Adapter>) -> mpsc::Sender<Job> {
    let (tx, mut rx) = mpsc::channel(QUEUE);
    tokio::spawn(async move {
        while let Some(job) = rx.recv().await {
            match job {
                Job::Observe(call) => {
                    let Some(adapter) = adapter.upgrade() else { break };
                    adapter.call("observe", Request::Observe(call)).await;
                }
                Job::Flush(done) => {
                    let _ = done.send(());
                }
            }
        }
    });
    tx
}
