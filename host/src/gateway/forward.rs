//! A client's request other than a tool call, forwarded to one server instance:
//! `prompts/get`, `resources/read`, `completion/complete` and a task's requests. (A tool
//! call has its own path, `super::call`, which recovery drives.)
//!
//! While it is out it counts as the client's request in flight on that instance, so that
//! what the server asks its client meanwhile reaches that client and no other
//! (`super::routing`), and its progress reaches the client under the client's own token,
//! before the answer. It is bounded: the server has a time to answer it (a task's result
//! excepted: that waits for the client's cancellation), and handing it over is bounded
//! too, though rmcp takes a request for writing at once. Given up on for any reason (its
//! time, the client's cancellation, the caller dropping it, the gateway stopping: its
//! client is answered that it shut down), it is cancelled upstream,
//! and a server process that does not take the cancellation within a second has stopped
//! reading its input: it is restarted (`call::cancel_upstream`).

use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{ClientRequest, RequestId, RequestMetaObject, ServerResult};
use rmcp::service::{PeerRequestOptions, RequestContext, RequestHandle};
use rmcp::{ErrorData, RoleClient, RoleServer, ServiceError};

use super::call::{cancel_upstream, from_service_error, hand_over, unread, why_cancelled};
use super::pins::Pin;
use super::routing::{ProgressGuard, ProgressTo};
use super::server::Gateway;
use crate::recovery::Failure;
use crate::transport::Session;

/// A server instance's live session, as a request is forwarded to it.
#[derive(Clone)]
pub struct Instance {
    /// The server instance (`ServerHandle::instance`): whose calls in flight it counts in.
    pub instance: u64,
    pub session: Arc<Session>,
    /// Held for the request's whole life, all its rounds, once it was bound to the
    /// instance; none for a task's requests, which go to where the task lives, whatever
    /// the current setup.
    pub held: Option<Arc<Pin>>,
}

/// One request to forward.
pub struct Out<'a> {
    /// Its method, for messages.
    pub method: &'a str,
    pub request: ClientRequest,
    /// The client's `_meta` it carries (the request's own, if any, kept besides): its
    /// progress token is the one the server's progress reaches the client under.
    pub meta: Option<RequestMetaObject>,
    /// How long the server may take to take the request off its input.
    pub hand_over: Duration,
    /// How long it may take to answer; `None`: as long as it works on it (a task's result).
    pub answer_within: Option<Duration>,
    /// Whether a failure the gateway sees (no answer in time, the connection lost, the
    /// server not reading) goes to the errors log; not for a task's requests, whose loss
    /// is the task's to report.
    pub logged: bool,
}

/// What a forwarded request came to, besides an answer.
#[derive(Debug)]
pub enum Fault {
    /// The server instance's connection was lost while the request was out.
    Lost,
    Error(ErrorData),
}

impl From<ErrorData> for Fault {
    fn from(e: ErrorData) -> Self {
        Self::Error(e)
    }
}

/// A forwarded request's fault, and the failure the gateway saw in it, if it saw one
/// (not the server's own error, nor the client's cancellation): for the errors log.
struct Failed {
    fault: Fault,
    seen: Option<Box<Failure>>,
}

impl Failed {
    fn seen(fault: impl Into<Fault>, failure: Failure) -> Self {
        Self { fault: fault.into(), seen: Some(Box::new(failure)) }
    }

    fn lost() -> Self {
        Self::seen(Fault::Lost, Failure::ConnectionLost { reason: "the connection was lost".to_owned(), session: None })
    }
}

impl<T: Into<Fault>> From<T> for Failed {
    fn from(fault: T) -> Self {
        Self { fault: fault.into(), seen: None }
    }
}

impl Fault {
    /// As the client is told it, naming `server`.
    pub fn into_error(self, server: &str) -> ErrorData {
        match self {
            Self::Lost => ErrorData::internal_error(format!("server `{server}`: the connection was lost"), None),
            Self::Error(e) => e,
        }
    }
}

impl Gateway {
    /// Sends `out` to `to` for the client of `cx` and waits for the answer (see the
    /// module). The server's progress on it reaches the client under the client's token
    /// (rmcp sends a token of its own), before the answer.
    pub(super) async fn forward(
        &self,
        to: &Instance,
        out: Out<'_>,
        cx: &RequestContext<RoleServer>,
    ) -> Result<ServerResult, Fault> {
        let (answer, progress) = self.forward_keeping_progress(to, out, cx).await?;
        if let Some(progress) = progress {
            progress.end().await;
        }
        Ok(answer)
    }

    /// [`Gateway::forward`], the client's progress route kept past the answer: a task's
    /// progress comes for as long as the task runs.
    pub(super) async fn forward_keeping_progress(
        &self,
        to: &Instance,
        out: Out<'_>,
        cx: &RequestContext<RoleServer>,
    ) -> Result<(ServerResult, Option<ProgressGuard>), Fault> {
        let (method, logged) = (out.method, out.logged);
        self.send_and_wait(to, out, cx).await.map_err(|Failed { fault, seen }| {
            if let Some(failure) = seen.filter(|_| logged) {
                self.request_failed(&to.session.server, method, &failure);
            }
            fault
        })
    }

    /// A request other than a tool call, to `server`, failed as the gateway saw it: the
    /// errors log has it, as the client's; not while the gateway stops, which ends them.
    pub(super) fn request_failed(&self, server: &str, method: &str, failure: &Failure) {
        if !self.hub.stopping().is_cancelled() {
            self.hub.errors.request_failed(&self.own.client, server, method, failure, std::time::SystemTime::now());
        }
    }

    async fn send_and_wait(
        &self,
        to: &Instance,
        out: Out<'_>,
        cx: &RequestContext<RoleServer>,
    ) -> Result<(ServerResult, Option<ProgressGuard>), Failed> {
        let Instance { instance, session, .. } = to;
        let server = &session.server;
        let call = self.hub.routing.track_call(*instance, &self.own.client, cx);
        let client_token = out.meta.as_ref().and_then(RequestMetaObject::get_progress_token);
        let options = match out.meta {
            Some(meta) => PeerRequestOptions::no_options().with_meta(meta),
            None => PeerRequestOptions::no_options(),
        };
        let sent = send(session, (out.request, options), out.hand_over, cx).await?;
        call.sent(session.id, sent.id.clone());
        let progress = ProgressTo::of(cx, client_token)
            .map(|to| self.hub.routing.progress_route(session.id, sent.progress_token.clone(), (to, &self.own.client)));
        let mut abandoned = Abandoned { session, id: Some(sent.id.clone()), cx };
        let response = sent.await_response();
        let answer = tokio::select! {
            biased;
            answer = within(out.answer_within, response) => answer,
            () = cx.ct.cancelled() => return Err(super::answered::by_the_client().into()),
            () = session.closed.cancelled() => return Err(Failed::lost()),
            // Past the grace period, the gateway ends what is still out, answered before
            // it stops (cancelled upstream as it is given up).
            () = self.hub.stopping().cancelled() => return Err(shut_down(server, out.method).into()),
        };
        if matches!(answer, Some(Ok(_) | Err(rmcp::ServiceError::McpError(_)))) {
            call.answered();
        }
        match answer {
            Some(answer) => match abandoned.answered(answer, out.method) {
                Ok(answer) => Ok((answer, progress)),
                Err(failed) => {
                    // An error is an answer too: the progress before it goes first.
                    if let Some(progress) = progress {
                        progress.end().await;
                    }
                    Err(failed)
                }
            },
            None => {
                // Whether the server still answers at all is asked of it (a ping).
                session.probe(self.ping_timeout(server), call.others_in_flight(session.id));
                let after = out.answer_within.unwrap_or_default();
                let message =
                    format!("server `{server}` did not answer `{}` within {} ms", out.method, after.as_millis());
                Err(Failed::seen(ErrorData::internal_error(message, None), Failure::Timeout { after }))
            }
        }
    }

    /// How long `server` gets to answer a ping (`recovery.ping_timeout_ms`).
    fn ping_timeout(&self, server: &str) -> Duration {
        let setup = self.hub.setup();
        Duration::from_millis(setup.config.servers.get(server).map_or(0, |s| s.recovery.ping_timeout_ms))
    }
}

/// What a client is told of its request still out when the gateway ended it to stop.
fn shut_down(server: &str, method: &str) -> ErrorData {
    let message = format!(
        "the gateway shut down while `{method}` to server `{server}` was out; ask again once the gateway is back"
    );
    ErrorData::internal_error(message, None)
}

/// `request` handed over to `session`'s writer within `hand_over`, unless the client
/// cancels it or the connection ends first: a server that stops reading its input stops
/// rmcp's writer, and then handing a request over can wait forever.
async fn send(
    session: &Session,
    (request, options): (ClientRequest, PeerRequestOptions),
    hand_over_within: Duration,
    cx: &RequestContext<RoleServer>,
) -> Result<RequestHandle<RoleClient>, Failed> {
    let server = &session.server;
    // A request its client cancelled is not handed over, however ready the writer is.
    tokio::select! {
        biased;
        () = cx.ct.cancelled() => Err(super::answered::by_the_client().into()),
        () = session.closed.cancelled() => Err(Failed::lost()),
        r = hand_over(session, request, options, hand_over_within) => match r {
            Some(sent) => sent.map_err(|e| failed_with(server, e)),
            None => {
                let reason = format!("{}; it is restarted", unread(hand_over_within));
                let error = ErrorData::internal_error(format!("server `{server}`: {reason}"), None);
                Err(Failed::seen(error, Failure::SendFailed { reason }))
            }
        },
    }
}

/// `response` within `limit` (`None` when it took longer), or as long as it takes.
async fn within<F: Future>(limit: Option<Duration>, response: F) -> Option<F::Output> {
    match limit {
        Some(limit) => tokio::time::timeout(limit, response).await.ok(),
        None => Some(response.await),
    }
}

/// Tells the server its request `id` is no longer wanted, when dropped before the answer.
struct Abandoned<'a> {
    session: &'a Session,
    id: Option<RequestId>,
    /// The client's request it serves: once cancelled, why is what the server is told,
    /// whoever drops this (`super::answered` may, first).
    cx: &'a RequestContext<RoleServer>,
}

impl Abandoned<'_> {
    /// The answer came: nothing to cancel. An error the connection's end caused is the
    /// connection lost.
    fn answered(&mut self, answer: Result<ServerResult, ServiceError>, method: &str) -> Result<ServerResult, Failed> {
        self.id = None;
        let session = self.session;
        match answer {
            Ok(result) => Ok(result),
            Err(ServiceError::TransportClosed | ServiceError::TransportSend(_)) if session.closed.is_cancelled() => {
                Err(Failed::lost())
            }
            Err(ServiceError::UnexpectedResponse) => {
                let reason = format!("server `{}` answered `{method}` with something else", session.server);
                Err(Failed::seen(ErrorData::internal_error(reason.clone(), None), Failure::Protocol { reason }))
            }
            Err(e) => Err(failed_with(&session.server, e)),
        }
    }
}

impl Drop for Abandoned<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            let reason =
                if self.cx.ct.is_cancelled() { why_cancelled(self.cx) } else { "the gateway no longer waits for it" };
            cancel_upstream(self.session, id, reason);
        }
    }
}

/// An error from `server`'s session, as the client is told it ([`upstream_error`]) and as
/// the gateway saw it fail (as a tool call's attempt would: a `url` server's refusal is its
/// HTTP status); the server's own error, or a cancellation, is no failure it saw.
fn failed_with(server: &str, e: ServiceError) -> Failed {
    match e {
        ServiceError::McpError(e) => e.into(),
        ServiceError::Cancelled { .. } => upstream_error(server, e).into(),
        e => {
            let error = ErrorData::internal_error(format!("server `{server}`: {e}"), None);
            Failed::seen(error, from_service_error(e))
        }
    }
}

/// An error from a server's session, as the client is told it: the server's own error
/// as it is, anything else (a lost connection, a broken answer) naming the server.
pub fn upstream_error(server: &str, e: ServiceError) -> ErrorData {
    match e {
        ServiceError::McpError(e) => e,
        other => ErrorData::internal_error(format!("server `{server}`: {other}"), None),
    }
}
