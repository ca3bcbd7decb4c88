//! A 2026-07-28 client's `subscriptions/listen` over HTTP, before rmcp reads it. rmcp
//! decides the request's acknowledgement in a hook that cannot tell which client asks
//! (`Gateway::accepted_subscription_filter`), so it could name a resource that the
//! client's other listen requests had left it no room to follow. Here the client is known
//! (by its address, an IPv6 one by its site: `super::site_of`): each shared server's resources past the
//! room the client has there now (its share, less what its listen requests follow; and
//! the room the server's connection has) are taken out of the request, and the
//! acknowledgement names only what the client had room for when the request was read.
//! (Another of its listen requests still following what it was acknowledged, or one at
//! the same moment, may still take that room first; what finds none goes unfollowed, in
//! the log.)

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::header;
use serde_json::Value;

use crate::gateway::hub::Hub;
use crate::transport::listen::MAX_FOLLOWED_PER_CLIENT;

/// `request` (a POST of a `subscriptions/listen`, its body read within `max` bytes by
/// `limits` already) without the resources `client` has no room to follow.
pub(super) async fn trim(hub: &Hub, client: &str, max: usize, request: Request) -> Request {
    let (mut parts, body) = request.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, max).await else {
        return Request::from_parts(parts, Body::empty()); // never: the body is in memory
    };
    match trimmed(&bytes, |uris| room(hub, client, uris)) {
        Some(body) => {
            parts.headers.remove(header::CONTENT_LENGTH);
            Request::from_parts(parts, Body::from(body))
        }
        None => Request::from_parts(parts, Body::from(bytes)),
    }
}

/// `body` with only the resources `room` keeps (it says, for each, whether it is kept);
/// `None` when it keeps them all, or the body is no listen request with resources.
fn trimmed(body: &Bytes, room: impl FnOnce(&[Value]) -> Vec<bool>) -> Option<Vec<u8>> {
    let mut message: Value = serde_json::from_slice(body).ok()?;
    if message["method"] != "subscriptions/listen" {
        return None;
    }
    let uris = message.get_mut("params")?.get_mut("notifications")?.get_mut("resourceSubscriptions")?;
    let uris = uris.as_array_mut()?;
    let kept = room(uris);
    if kept.iter().all(|k| *k) {
        return None;
    }
    let mut kept = kept.into_iter();
    uris.retain(|_| kept.next().unwrap_or(true));
    serde_json::to_vec(&message).ok()
}

/// For each of `uris` (as the client names them), whether `client` has room to follow it
/// on its shared server now; what names no resource of a live server is left to the
/// gateway's own checks.
fn room(hub: &Hub, client: &str, uris: &[Value]) -> Vec<bool> {
    let (catalogue, setup) = (hub.catalogue(), hub.setup());
    let mut kept = vec![true; uris.len()];
    // Each server's resources (as the server names them), with where they are in the list.
    let mut by_server: HashMap<Arc<str>, (Vec<usize>, Vec<String>)> = HashMap::new();
    for (at, uri) in uris.iter().enumerate() {
        let Some((server, uri)) = uri.as_str().and_then(|uri| catalogue.resource(uri)) else { continue };
        let (places, names) = by_server.entry(server).or_default();
        places.push(at);
        names.push(uri);
    }
    for (server, (places, names)) in by_server {
        let Some(session) = setup.servers.get(&*server).and_then(|h| h.state().session) else { continue };
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        for (at, room) in places.into_iter().zip(session.follows.room_for(client, MAX_FOLLOWED_PER_CLIENT, &names)) {
            kept[at] = room;
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_listen_request_keeps_only_the_resources_there_is_room_for() {
        let listen = json!({"jsonrpc": "2.0", "id": 1, "method": "subscriptions/listen", "params": {
            "notifications": {"toolsListChanged": true, "resourceSubscriptions": ["r://a", "r://b", "r://c"]}}});
        let body = Bytes::from(serde_json::to_vec(&listen).unwrap());
        let trimmed = trimmed(&body, |uris| {
            assert_eq!(uris.len(), 3);
            vec![true, false, true]
        })
        .expect("trimmed");
        let trimmed: Value = serde_json::from_slice(&trimmed).unwrap();
        assert_eq!(trimmed["params"]["notifications"]["resourceSubscriptions"], json!(["r://a", "r://c"]));
        assert_eq!(trimmed["params"]["notifications"]["toolsListChanged"], true, "the rest as sent");
        assert_eq!(trimmed["id"], 1);
        // Room for all, no resources, or no listen request at all: as sent.
        assert!(trimmed_none(&body, vec![true, true, true]));
        for other in [
            json!({"jsonrpc": "2.0", "id": 1, "method": "subscriptions/listen", "params": {"notifications": {}}}),
            json!([1, 2]),
            json!({"params": {"notifications": {"resourceSubscriptions": "r://a"}}}),
        ] {
            assert!(trimmed_none(&Bytes::from(serde_json::to_vec(&other).unwrap()), vec![false]), "{other}");
        }
        assert!(trimmed_none(&Bytes::from_static(b"not json"), vec![false]));
    }

    fn trimmed_none(body: &Bytes, room: Vec<bool>) -> bool {
        trimmed(body, |_| room).is_none()
    }
}
