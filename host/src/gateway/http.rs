//! `serve --http`: the gateway as a streamable HTTP server. `/mcp` is rmcp's streamable
//! HTTP service with one [`Gateway`] per MCP session, all sharing the [`Hub`]; around it
//! sit, in order, the DNS-rebinding checks (`Host`, `Origin`), the bearer token, and a
//! per-client concurrency limit. `/healthz`, `/readyz` and `/metrics` are for operators.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context, Result};
use axum::Extension;
use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt as _;
use rmcp::transport::StreamableHttpServerConfig;
use rmcp::transport::StreamableHttpService;
use serde_json::json;
use subtle::ConstantTimeEq;
use tokio_util::sync::CancellationToken;
use tower_http::cors::{AllowOrigin, CorsLayer};

mod accept;
mod client_ip;
mod limits;
mod listens;
mod parsed;
mod revoked;
mod tasks;
mod unread;

pub use client_ip::ClientIp;
pub(crate) use limits::without_place;
use limits::{ClientLimits, limit};

use super::hub::Hub;
use super::reload::TokenCell;
use super::server::Gateway;
use crate::config::HttpSettings;
use crate::transport::Status;

/// What every layer of the HTTP front reads, one `Arc` for each request to clone.
#[derive(Clone)]
struct Front(Arc<Parts>);

impl std::ops::Deref for Front {
    type Target = Parts;

    fn deref(&self) -> &Parts {
        &self.0
    }
}

struct Parts {
    hub: Arc<Hub>,
    settings: HttpSettings,
    /// `rebound.http.trusted_proxies`, whose `proxy_header` names the client.
    proxies: client_ip::Proxies,
    limits: Arc<ClientLimits>,
    /// The MCP sessions: a request counts against the session it names only when that
    /// session is one of them.
    sessions: Arc<super::sessions::CappedSessions>,
    /// The tokens that open it now (a reload rotates them).
    tokens: TokenCell,
}

/// Binds `addr` and serves until `shutdown` is cancelled, opened by the `tokens` there are.
pub async fn serve(hub: Arc<Hub>, addr: SocketAddr, tokens: TokenCell, shutdown: CancellationToken) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("cannot listen on {addr}"))?;
    let local = listener.local_addr()?;
    let settings = hub.setup().config.settings.http.clone();
    check_exposure(local, &settings)?;
    // The service's own token: its SSE streams must outlive the signal, to carry the
    // answers of the calls in flight.
    let streams = CancellationToken::new();
    let grace = Duration::from_millis(settings.shutdown_grace_ms);
    let sessions = Arc::new(super::sessions::CappedSessions::new(
        settings.max_sessions,
        Duration::from_millis(settings.session_idle_ms),
    ));
    sessions.close_idle();
    let front = Front(Arc::new(Parts {
        hub: hub.clone(),
        limits: Arc::new(ClientLimits::new(settings.max_concurrent_per_client)),
        proxies: client_ip::Proxies { trusted: settings.proxies().into(), header: settings.proxy_header },
        settings,
        sessions,
        tokens,
    }));
    let app = router(front.clone(), streams.clone());
    // Printed for scripts that bind port 0.
    let threads = tokio::runtime::Handle::current().metrics().num_workers();
    tracing::info!("serving streamable HTTP at http://{local}/mcp on {threads} thread(s)");
    eprintln!("rebound: listening on http://{local}/mcp");
    // Every answer goes out at once: without TCP_NODELAY, an answer written in two parts
    // (an SSE priming event, then the message) waits for the client's delayed ACK.
    // A client that stops reading its answers loses its connection (`unread`).
    let listener = unread::Listener(listener).tap_io(|tcp| {
        if let Err(e) = tcp.get_mut().set_nodelay(true) {
            tracing::debug!("TCP_NODELAY could not be set on a connection: {e}");
        }
    });
    // Once the calls in flight are drained, no connection is accepted (and idle ones
    // close); until then, a new request is answered 503, which a client or a load
    // balancer can act on, where a refused connection says nothing.
    let drained = CancellationToken::new();
    let counted = accept::Counted::new(connections_per_network(&front.settings), front.proxies.clone());
    let mut server = tokio::spawn(accept::serve(listener, app, counted, drained.clone()));
    tokio::select! {
        () = shutdown.cancelled() => {}
        ended = &mut server => return ended.context("the HTTP server failed"),
    }
    drain(&front, grace).await;
    drained.cancel();
    streams.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(1), server).await;
    Ok(())
}

/// The connections one network may hold open at once: room for the requests in flight
/// its clients may have (an HTTP/1.1 connection carries one at a time), their event
/// streams and idle kept-alive connections.
fn connections_per_network(settings: &HttpSettings) -> usize {
    settings.max_concurrent_per_client.saturating_mul(16).max(64)
}

/// Refuses to listen where other machines reach the gateway without a token, and says
/// what else an operator should know about who can reach it.
fn check_exposure(local: SocketAddr, settings: &HttpSettings) -> Result<()> {
    let loopback_only = settings.allowed_hosts.iter().all(|h| {
        let (name, _) = split_authority(h);
        name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
    });
    if !local.ip().is_loopback() && settings.auth_token.is_none() {
        // The Host check stops browsers, not a client that writes `Host: localhost`.
        anyhow::bail!(
            "{local} is reachable from other machines, and no token is set: set REBOUND_AUTH_TOKEN (or rebound.http.auth_token), or listen on 127.0.0.1"
        );
    }
    if !local.ip().is_loopback() && loopback_only {
        tracing::warn!(
            "listening on {local}, but only loopback Host names are allowed: add this machine's names to `rebound.http.allowed_hosts`"
        );
    }
    if settings.auth_token.is_none() {
        tracing::info!(
            "no bearer token set (REBOUND_AUTH_TOKEN or rebound.http.auth_token): any process on this machine may connect"
        );
    }
    // With the one token every client has, `/status` shows each one the others' recent
    // failures (their text may quote what they sent).
    if !local.ip().is_loopback() && settings.operator_token.is_none() {
        tracing::warn!(
            "no operator token set: every client with the gateway's token may read /status and /metrics, whose recent errors are all clients'; set rebound.http.operator_token (REBOUND_OPERATOR_TOKEN) where clients are not all yours"
        );
    }
    Ok(())
}

/// Shutdown: new requests are refused (503), those in flight get `grace` to finish, and
/// so do the tool calls whose client went away (a call goes on without its request) or
/// cancelled them (one ends as cancelled after its request has closed), and the calls of
/// 2026-07-28 clients held for their answers (which the clients may still send); the tool
/// calls still running then are ended with an error result, which is sent before the
/// streams close, and written to the errors log.
async fn drain(front: &Front, grace: Duration) {
    front.limits.draining.store(true, Ordering::SeqCst);
    front.hub.close();
    let (requests, calls, held) = (front.limits.in_flight(), front.hub.calls_answering(), front.hub.held.waiting());
    if requests + calls + held > 0 {
        tracing::info!(
            "shutting down: waiting up to {} ms for {requests} request(s) in flight, {calls} tool call(s) running and {held} held for their clients' answers",
            grace.as_millis()
        );
    }
    // No request in flight, no tool call's handler still running, none held.
    let settled = || async {
        front.hub.held.none_waiting().await;
        front.limits.drained().await;
        front.hub.all_answered().await;
    };
    if tokio::time::timeout(grace, settled()).await.is_err() {
        tracing::warn!(
            "shutting down: {} request(s) in flight and {} tool call(s) still running after {} ms; the calls are ended with an error",
            front.limits.in_flight(),
            front.hub.calls_answering(),
            grace.as_millis()
        );
    }
    front.hub.stop_calls();
    let ended = async {
        settled().await;
        while front.hub.routing.in_flight() > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), ended).await;
}

/// A `subscriptions/listen` request waits for the servers' first start before rmcp reads
/// it: rmcp decides its acknowledgement in a synchronous hook, which must see their
/// resources (over stdio, `GatewayService` does the same); and its resources past the
/// client's room are taken out of it (`listens`). Known by its body (`limits` marks it),
/// as rmcp knows it: this does not rest on rmcp refusing a request whose `Mcp-Method`
/// header is missing or another method's.
async fn settle_listen(
    State(front): State<Front>,
    Extension(ClientIp(client)): Extension<ClientIp>,
    request: Request,
    next: Next,
) -> Response {
    if request.extensions().get::<limits::Listen>().is_none() {
        return next.run(request).await;
    }
    front.hub.settled().await;
    // Its acknowledgement names only what the client has room to follow (`listens`).
    let max = front.settings.max_body_bytes;
    let request = listens::trim(&front.hub, &site_of(&address_client(client).into()), max, request).await;
    next.run(request).await
}

/// The whole HTTP surface: `/mcp` and `/metrics` behind the token, the probes open.
/// `streams` ends the MCP service's streams.
fn router(front: Front, streams: CancellationToken) -> Router {
    let settings = &front.settings;
    // The Host and Origin checks are done once, by `guard`, for every route; rmcp's own
    // are turned off so that the two cannot disagree.
    let config = StreamableHttpServerConfig::default()
        .disable_allowed_hosts()
        .disable_allowed_origins()
        // `limit` holds a body to `max_body_bytes`; the room above it is for a method
        // `http::tasks` renamed.
        .with_max_request_body_bytes(settings.max_body_bytes.saturating_add(64))
        .with_cancellation_token(streams);
    let factory_hub = front.hub.clone();
    let mcp = StreamableHttpService::new(move || Ok(Gateway::new(factory_hub.clone())), front.sessions.clone(), config);
    let protected = Router::new()
        .nest_service("/mcp", mcp)
        .route("/metrics", get(metrics))
        .route("/status", get(status_document))
        .layer(middleware::from_fn(session_ended))
        .layer(middleware::from_fn_with_state(front.clone(), settle_listen))
        // Inside `limit`, which marks a listen request.
        .layer(middleware::from_fn_with_state(front.clone(), revoked::ends_with_token))
        .layer(middleware::from_fn_with_state(front.clone(), limit))
        // The operator's (not an MCP message: outside `limit`, which reads every POST as one).
        .route("/reset-breaker", post(reset_breaker))
        .layer(middleware::from_fn_with_state(front.clone(), authorize))
        .layer(middleware::from_fn_with_state(front.clone(), client_ip::known));
    // Browser pages on an allowed Origin may call /mcp: their preflight is answered here,
    // before the token is asked for (a preflight cannot carry it).
    let origins = front.settings.allowed_origins.clone();
    let cors = CorsLayer::new()
        .allow_origin(AllowOrigin::predicate(move |origin, _| {
            origin.to_str().is_ok_and(|o| origin_allowed(&origins, o))
        }))
        .allow_methods([Method::GET, Method::POST, Method::DELETE])
        .allow_headers([
            header::AUTHORIZATION,
            header::CONTENT_TYPE,
            header::ACCEPT,
            HeaderName::from_static("mcp-session-id"),
            HeaderName::from_static("mcp-protocol-version"),
            HeaderName::from_static("last-event-id"),
        ])
        .expose_headers([HeaderName::from_static("mcp-session-id")]);
    let guarded = Router::new()
        // The page holds no data (it reads /status, with the token): a browser that
        // navigates here cannot send a bearer token.
        .route("/", get(status_page))
        .merge(protected)
        .layer(cors)
        .layer(middleware::from_fn_with_state(front.clone(), guard));
    // The probes answer whatever `Host` they are sent to (a cluster's probe names the
    // pod's address); `/readyz` names servers only to an allowed one.
    Router::new()
        .route("/healthz", get(|| async { axum::Json(json!({"status": "ok"})) }))
        .route("/readyz", get(readyz))
        .merge(guarded)
        .with_state(front)
}

/// A refusal, as JSON with a hint for whoever reads it.
fn refuse(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(json!({"error": message}))).into_response()
}

/// Requests refused for their `Host` or `Origin` (before any token is asked for) are
/// logged at most this often; `rebound_http_rejected_total` counts them all.
static REFUSALS_LOGGED: crate::pace::LogBudget = crate::pace::LogBudget::new(10, Duration::from_secs(60));

/// DNS rebinding: a page on an attacker's domain that resolves to 127.0.0.1 reaches us
/// with its own `Host`, and a browser marks its requests with their `Origin`.
async fn guard(State(front): State<Front>, request: Request, next: Next) -> Response {
    let headers = request.headers();
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    if !host.is_some_and(|h| host_allowed(&front.settings.allowed_hosts, h)) {
        front.hub.metrics.rejected("host");
        if REFUSALS_LOGGED.take() {
            tracing::warn!(host = host.unwrap_or("(none)"), "refused a request for a Host that is not allowed");
        }
        return refuse(
            StatusCode::FORBIDDEN,
            "this Host is not allowed; add it to rebound.http.allowed_hosts if the gateway should answer to it",
        );
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        if !origin_allowed(&front.settings.allowed_origins, origin) {
            front.hub.metrics.rejected("origin");
            if REFUSALS_LOGGED.take() {
                tracing::warn!(origin, "refused a request from an Origin that is not allowed");
            }
            return refuse(
                StatusCode::FORBIDDEN,
                "this Origin is not allowed; add it to rebound.http.allowed_origins if pages there may use the gateway",
            );
        }
    }
    next.run(request).await
}

/// The bearer token, when one is configured.
async fn authorize(State(front): State<Front>, request: Request, next: Next) -> Response {
    let operators = for_operators(&request);
    if front.opens(request.headers(), operators) {
        return next.run(request).await;
    }
    unauthorized(&front, operators)
}

/// Whether `request` is for the operator's routes: what every client and server did is
/// the operator's, when the gateway has one.
fn for_operators(request: &Request) -> bool {
    matches!(request.uri().path(), "/status" | "/metrics" | "/reset-breaker")
}

/// The refusal of a request without the token its route needs.
fn unauthorized(front: &Front, operators: bool) -> Response {
    let says = match front.settings.operator_token {
        Some(_) if operators => "the operator's token (REBOUND_OPERATOR_TOKEN where the gateway runs)",
        _ => "the gateway's token (REBOUND_AUTH_TOKEN where the gateway runs)",
    };
    front.hub.metrics.rejected("unauthorized");
    let mut response = refuse(StatusCode::UNAUTHORIZED, &format!("send {says} as `Authorization: Bearer TOKEN`"));
    response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"rebound\""));
    response
}

impl Front {
    /// Whether `headers` carry the token that opens the clients' routes, or with
    /// `operators` the operator's (`/status`, `/metrics`: the clients' token when there
    /// is no operator token); always, when the gateway has no token at all. The tokens
    /// are those of `tokens` now: a reload rotates them (whether there is one stays as
    /// the gateway started, `reload::rotate_tokens`).
    fn opens(&self, headers: &HeaderMap, operators: bool) -> bool {
        self.admits(bearer(headers), operators)
    }

    /// Whether `token` (a request's bearer token, if it sent one) opens the clients'
    /// routes, or with `operators` the operator's, as [`Front::opens`] says.
    fn admits(&self, token: Option<&str>, operators: bool) -> bool {
        let tokens = self.tokens.borrow();
        let expected = match &tokens.operator {
            Some(token) if operators => Some(token),
            _ => tokens.clients.as_ref(),
        };
        expected.is_none_or(|expected| token.is_some_and(|p| bool::from(p.as_bytes().ct_eq(expected.as_bytes()))))
    }
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then_some(token.trim())
}

/// A session ended by `DELETE` is answered 204 rather than rmcp's 202: the official
/// Python SDK takes anything but 200 or 204 for a failure and warns on every close.
async fn session_ended(request: Request, next: Next) -> Response {
    let delete = request.method() == Method::DELETE;
    let mut response = next.run(request).await;
    if delete && response.status() == StatusCode::ACCEPTED {
        *response.status_mut() = StatusCode::NO_CONTENT;
    }
    response
}

/// Ready once every shared server is up or has been given up on for now: its first start
/// failed, it was marked down after a crash loop, or it was still not up when the
/// start-up wait (`startup_timeout_ms`) ended. Then
/// the gateway serves what it has, and says which servers it is without. A server that
/// restarts later does not make the gateway unready, nor does one a reload added or
/// relaunched. A server whose start still goes on with no error (past the start-up wait,
/// or begun by a reload) is listed as starting, not given up on. Server names are given only to
/// whoever holds the operator's token (probes need none): to others, counts.
async fn readyz(State(front): State<Front>, headers: HeaderMap) -> Response {
    let hub = &front.hub;
    let setup = hub.setup();
    let waiting = hub.starting(&setup);
    let (mut without, mut starting) = (Vec::new(), waiting.clone());
    for handle in setup.servers.values() {
        let state = handle.state();
        if state.status == Status::Ready || waiting.contains(&handle.name) {
            continue;
        }
        if state.status == Status::Starting && state.last_error.is_none() {
            starting.push(handle.name.clone()); // started by a reload, after start-up
        } else {
            without.push(
                json!({"server": &*handle.name, "status": state.status.as_str(), "last_error": state.last_error}),
            );
        }
    }
    let shutting_down = front.limits.draining.load(Ordering::SeqCst);
    let ready = waiting.is_empty() && !shutting_down;
    let status = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    let mut body = json!({
        "ready": ready,
        "shutting_down": shutting_down,
        "servers": setup.servers.len(),
        "servers_ready": setup.servers.len().saturating_sub(without.len() + starting.len()),
        "servers_starting": starting.len(),
        "servers_given_up": without.len(),
    });
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    if front.opens(&headers, true) && host.is_some_and(|h| host_allowed(&front.settings.allowed_hosts, h)) {
        body["starting"] = json!(starting.iter().map(|n| &**n).collect::<Vec<_>>());
        body["given_up"] = json!(without);
    }
    (status, axum::Json(body)).into_response()
}

/// The status page: one self-contained file, no CDN, nothing to build.
async fn status_page() -> Response {
    let csp = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:; frame-ancestors 'none'";
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8"), (header::CONTENT_SECURITY_POLICY, csp)],
        include_str!("status_page.html"),
    )
        .into_response()
}

/// The status document (`status::document`), versioned by its `schema` field.
async fn status_document(State(front): State<Front>) -> Response {
    // What adapters printed only where no client can read it: behind an operator token.
    let operators = front.settings.operator_token.is_some();
    axum::Json(super::status::document(&front.hub, operators)).into_response()
}

/// Which breakers `POST /reset-breaker` closes: a server's (and its tools'), or one tool's.
#[derive(serde::Deserialize)]
struct ResetBreaker {
    server: String,
    tool: Option<String>,
}

/// The operator's breaker reset, of a shared server's breakers (a client's
/// `rebound_reset_breaker` resets only its session's own servers' over HTTP).
async fn reset_breaker(
    State(front): State<Front>,
    axum::extract::Query(asked): axum::extract::Query<ResetBreaker>,
) -> Response {
    use super::status::{Resetter, Unreset, reset_breakers};
    let setup = front.hub.setup();
    let (server, tool) = (asked.server.as_str(), asked.tool.as_deref());
    match reset_breakers(&setup, Resetter::Operator, server, tool) {
        Ok(done) => {
            tracing::info!(server, tool, "circuit breakers reset by the operator");
            axum::Json(json!({"reset": done})).into_response()
        }
        Err(why) => {
            let status = match why {
                Unreset::NoServer | Unreset::NoBreaker => StatusCode::NOT_FOUND,
                Unreset::Shared | Unreset::PerSession => StatusCode::CONFLICT,
            };
            (status, axum::Json(json!({"error": why.explain(&setup, server, tool)}))).into_response()
        }
    }
}

async fn metrics(State(front): State<Front>) -> Response {
    let body = front.hub.metrics.render(&super::status::snapshot(&front.hub));
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], body).into_response()
}

/// How a client without an MCP session (one on 2026-07-28) is known over HTTP: by its
/// address, an IPv6 one by its /64, the block one host or subscriber is given, so that a
/// host cannot take many clients' shares by using many of its addresses. An IPv4 address
/// mapped into IPv6 is the IPv4 one.
pub(crate) fn address_client(ip: std::net::IpAddr) -> String {
    match ip.to_canonical() {
        std::net::IpAddr::V4(v4) => format!("address {v4}"),
        std::net::IpAddr::V6(v6) => {
            let [a, b, c, d, ..] = v6.segments();
            format!("address {}/64", std::net::Ipv6Addr::new(a, b, c, d, 0, 0, 0, 0))
        }
    }
}

/// The network around a client address of [`address_client`], for what is counted per
/// address: an IPv6 address's /48 (a site, whose /64s are its addresses), so that the
/// many /64s of one site cannot take many addresses' shares; none for an IPv4 address,
/// its own network.
pub(crate) fn network_of(address: &str) -> Option<String> {
    let v6: std::net::Ipv6Addr = address.strip_prefix("address ")?.strip_suffix("/64")?.parse().ok()?;
    let [a, b, c, ..] = v6.segments();
    Some(format!("network {}/48", std::net::Ipv6Addr::new(a, b, c, 0, 0, 0, 0, 0)))
}

/// Whom `client` (a client of [`address_client`], or over stdio a session) counts as
/// where one IPv6 site must take no more than one address: its network, else itself.
pub(crate) fn site_of(client: &Arc<str>) -> Arc<str> {
    network_of(client).map_or_else(|| client.clone(), Arc::from)
}

/// Splits `host[:port]`, `[v6]:port` or a bare IPv6 address.
fn split_authority(authority: &str) -> (&str, Option<&str>) {
    if let Some(rest) = authority.strip_prefix('[') {
        return match rest.split_once(']') {
            Some((host, port)) => (host, port.strip_prefix(':')),
            None => (authority, None),
        };
    }
    match authority.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') => (host, Some(port)),
        _ => (authority, None),
    }
}

/// Whether `host` (a `Host` header) is on the list: an entry without a port allows any
/// port, an entry with one only that port. Names compare case-insensitively.
fn host_allowed(allowed: &[String], host: &str) -> bool {
    let (name, port) = split_authority(host);
    allowed.iter().any(|entry| {
        let (e_name, e_port) = split_authority(entry);
        e_name.eq_ignore_ascii_case(name) && (e_port.is_none() || e_port == port)
    })
}

/// Whether `origin` (`scheme://host[:port]`, or `null`) is on the list. An entry's port
/// may be `*`; without one it means the scheme's default port.
fn origin_allowed(allowed: &[String], origin: &str) -> bool {
    if origin == "null" {
        return allowed.iter().any(|a| a == "null");
    }
    let Some((scheme, authority)) = origin.split_once("://") else { return false };
    let default_port = match scheme {
        "https" => "443",
        "http" => "80",
        _ => "",
    };
    let (name, port) = split_authority(authority);
    let port = port.unwrap_or(default_port);
    allowed.iter().any(|entry| {
        let Some((e_scheme, e_authority)) = entry.split_once("://") else { return false };
        let (e_name, e_port) = split_authority(e_authority);
        e_scheme.eq_ignore_ascii_case(scheme)
            && e_name.eq_ignore_ascii_case(name)
            && match e_port {
                Some("*") => true,
                Some(p) => p == port,
                None => port == default_port,
            }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_without_a_session_is_its_address_an_ipv6_one_its_64() {
        let of = |ip: &str| address_client(ip.parse().unwrap());
        assert_eq!(of("192.0.2.7"), "address 192.0.2.7");
        assert_eq!(of("::ffff:192.0.2.7"), "address 192.0.2.7", "mapped IPv4 is the IPv4 client");
        assert_eq!(of("2001:db8:1:2:aaaa::1"), "address 2001:db8:1:2::/64");
        assert_eq!(of("2001:db8:1:2:bbbb:cccc:dddd:eeee"), of("2001:db8:1:2::9"), "one /64, one client");
        assert_ne!(of("2001:db8:1:3::1"), of("2001:db8:1:2::1"));
        assert_eq!(of("::1"), "address ::/64");
        let network = |ip: &str| network_of(&of(ip));
        assert_eq!(network("2001:db8:1:2:aaaa::1").as_deref(), Some("network 2001:db8:1::/48"));
        assert_eq!(network("2001:db8:1:ff::1"), network("2001:db8:1:2::1"), "one /48, one network");
        assert_eq!((network("192.0.2.7"), network("::ffff:192.0.2.7")), (None, None), "an IPv4 address is its own");
    }

    fn list(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn hosts_match_by_name_and_optional_port() {
        let allowed = list(&["localhost", "127.0.0.1", "[::1]", "gw.example.com:8443"]);
        for ok in ["localhost", "localhost:3000", "LOCALHOST:1", "127.0.0.1:9", "[::1]:80", "gw.example.com:8443"] {
            assert!(host_allowed(&allowed, ok), "{ok}");
        }
        for bad in
            ["evil.com", "evil.com:3000", "localhost.evil.com", "gw.example.com", "gw.example.com:80", "127.0.0.2"]
        {
            assert!(!host_allowed(&allowed, bad), "{bad}");
        }
    }

    #[test]
    fn origins_match_scheme_host_and_port() {
        let allowed = list(&["http://localhost:*", "https://app.example.com", "http://127.0.0.1:3000"]);
        for ok in
            ["http://localhost:5173", "http://localhost", "https://app.example.com", "https://app.example.com:443"]
        {
            assert!(origin_allowed(&allowed, ok), "{ok}");
        }
        for bad in [
            "null",
            "http://evil.com",
            "https://localhost:5173",
            "http://app.example.com",
            "https://app.example.com:8443",
            "http://127.0.0.1:3001",
            "garbage",
        ] {
            assert!(!origin_allowed(&allowed, bad), "{bad}");
        }
        assert!(origin_allowed(&list(&["null"]), "null"));
    }

    #[test]
    fn by_default_pages_on_this_machine_are_allowed_over_http_and_https() {
        let defaults = crate::config::HttpSettings::default().allowed_origins;
        for ok in [
            "http://localhost:5173",
            "https://localhost:8443",
            "https://127.0.0.1:3000",
            "https://[::1]",
            "http://[::1]:80",
        ] {
            assert!(origin_allowed(&defaults, ok), "{ok}");
        }
        for bad in ["https://localhost.evil.com", "http://127.0.0.2:3000", "https://evil.com", "null"] {
            assert!(!origin_allowed(&defaults, bad), "{bad}");
        }
    }

    #[test]
    fn bearer_tokens_are_read_from_the_authorization_header() {
        let mut h = HeaderMap::new();
        assert_eq!(bearer(&h), None);
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer abc"));
        assert_eq!(bearer(&h), Some("abc"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic abc"));
        assert_eq!(bearer(&h), None);
    }
}
