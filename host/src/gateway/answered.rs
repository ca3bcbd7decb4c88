//! Every request a client makes is answered, or given up once the client cancels it.
//!
//! - A handler that panics (a bug) answers with an error: otherwise the request would go
//!   unanswered and, over stdio, keep its place among the client's requests in flight.
//! - A handler whose client cancelled its request stops waiting (for the servers' first
//!   start, for a server restarting): rmcp sends nothing for a cancelled request, and the
//!   front frees its place at once, so a handler waiting on would be one more than
//!   `max_concurrent_per_client` allows, and would send on a request no one wants.
//!
//! The tool call has its own guard (`tool_call`), which also writes the errors log.

use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures::FutureExt as _;
use rmcp::ErrorData;
use tokio_util::sync::CancellationToken;

/// `answer` to a request of method `method`, given up once `cancelled`, an error in
/// place of a panic. Only for a handler that may be dropped at any await: what it holds
/// upstream is given up on drop (`forward`).
pub(super) async fn answered<T>(
    method: &str,
    cancelled: &CancellationToken,
    answer: impl Future<Output = Result<T, ErrorData>>,
) -> Result<T, ErrorData> {
    until_cancelled(cancelled, unpanicked(method, answer)).await?
}

/// `answer` to a request of method `method`, an error in place of a panic.
pub(super) async fn unpanicked<T>(
    method: &str,
    answer: impl Future<Output = Result<T, ErrorData>>,
) -> Result<T, ErrorData> {
    AssertUnwindSafe(answer).catch_unwind().await.unwrap_or_else(|_| {
        tracing::error!(%method, "Rebound failed while answering a request (a bug); the client is told so");
        let message = format!("rebound: Rebound failed while answering `{method}` (a bug, in its log); ask again");
        Err(ErrorData::internal_error(message, None))
    })
}

/// `wait`, unless `cancelled` first: the cancellation is seen before `wait` is polled
/// again, so a wait that ends as its request is cancelled goes no further.
pub(super) async fn until_cancelled<T>(
    cancelled: &CancellationToken,
    wait: impl Future<Output = T>,
) -> Result<T, ErrorData> {
    tokio::select! {
        biased;
        () = cancelled.cancelled() => Err(by_the_client()),
        done = wait => Ok(done),
    }
}

/// The error a request its client cancelled ends with (rmcp does not send it).
pub(super) fn by_the_client() -> ErrorData {
    ErrorData::internal_error("cancelled by the client", None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panic_is_answered_with_an_error() {
        let never = CancellationToken::new();
        let answer: Result<(), _> = answered("prompts/get", &never, async { panic!("a bug") }).await;
        let message = answer.unwrap_err().message;
        assert!(message.contains("failed while answering `prompts/get`"), "{message}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_request_stops_waiting() {
        let cancelled = CancellationToken::new();
        let waiting = tokio::spawn({
            let cancelled = cancelled.clone();
            async move { answered("resources/read", &cancelled, std::future::pending::<Result<(), ErrorData>>()).await }
        });
        tokio::time::sleep(std::time::Duration::from_secs(60)).await;
        assert!(!waiting.is_finished());
        cancelled.cancel();
        assert_eq!(waiting.await.unwrap().unwrap_err().message, "cancelled by the client");
    }

    #[tokio::test]
    async fn a_wait_that_ends_as_its_request_is_cancelled_goes_no_further() {
        let cancelled = CancellationToken::new();
        cancelled.cancel();
        let done = until_cancelled(&cancelled, std::future::ready(())).await;
        assert!(done.is_err());
    }
}
