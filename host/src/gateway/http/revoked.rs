//! A token a reload rotated away opens nothing from then on, whenever the request that
//! carries it was let in. `authorize` reads the token as the request's headers arrive;
//! a body may come much later (a client sends it when it likes), so it is asked again
//! once `limit` has read it, as the request is handled. And the streams a client holds
//! open outlive the request that opened them: its session's standalone `GET` stream,
//! and a 2026-07-28 client's `subscriptions/listen`. Those opened with a token that no
//! longer opens the gateway end: whoever held only the old one hears nothing more, and
//! a client given the new one opens them again with it. A request's own stream, which
//! ends with its answer, is left to finish: the request was let in with a good token.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, header};
use axum::middleware::Next;
use axum::response::Response;
use futures::StreamExt as _;

use super::limits::Listen;
use super::{Front, bearer, for_operators, unauthorized};

/// Refuses a request whose token a reload rotated away since `authorize` let it in, and
/// ends a held stream once a reload makes the token it was opened with stop opening the
/// gateway.
pub(super) async fn ends_with_token(State(front): State<Front>, request: Request, next: Next) -> Response {
    if front.tokens.borrow().clients.is_none() {
        // Without a token there is none to rotate: none is set on a reload either.
        return next.run(request).await;
    }
    let held = request.method() == Method::GET || request.extensions().get::<Listen>().is_some();
    let (token, operators) = (bearer(request.headers()).map(str::to_owned), for_operators(&request));
    // Taken before the token is asked again: a rotation from then on is heard.
    let mut rotations = front.tokens.subscribe();
    if !front.admits(token.as_deref(), operators) {
        return unauthorized(&front, operators);
    }
    let response = next.run(request).await;
    let stream = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if !held || !stream {
        return response;
    }
    let revoked = async move {
        while rotations.changed().await.is_ok() {
            if !front.admits(token.as_deref(), operators) {
                tracing::info!("a stream opened with a token a reload rotated away was closed");
                return;
            }
        }
        // The gateway is going away: its own shutdown ends the stream.
        std::future::pending().await
    };
    let (parts, body) = response.into_parts();
    Response::from_parts(parts, Body::from_stream(body.into_data_stream().take_until(Box::pin(revoked))))
}
