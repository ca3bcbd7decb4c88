//! Whom a request over HTTP is counted against: the address it came from, or, when that
//! is a proxy the operator trusts (`rebound.http.trusted_proxies`), the client the proxies
//! name in `X-Forwarded-For` (or RFC 7239's `Forwarded`, `rebound.http.proxy_header`).
//! Each proxy appends the address it was reached from, so the header is read from its
//! end: the first address that is no trusted proxy is the client (what came before it,
//! the client may have written itself).

use std::net::{IpAddr, SocketAddr};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::Response;
use ipnet::IpNet;

use super::Front;
use crate::config::ProxyHeader;

/// The proxies the operator trusts, and the header they name clients in.
#[derive(Debug, Clone)]
pub struct Proxies {
    pub trusted: std::sync::Arc<[IpNet]>,
    pub header: ProxyHeader,
}

/// The address a request's client is known by, in the request's extensions for what
/// comes after (`limits`, `listens`, the gateway's per-address task shares).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientIp(pub IpAddr);

impl ClientIp {
    /// The client address of the HTTP request whose parts rmcp put in `extensions` (a
    /// message's or a request context's), if it came over HTTP.
    pub fn of(extensions: &rmcp::model::Extensions) -> Option<IpAddr> {
        let parts = extensions.get::<axum::http::request::Parts>()?;
        parts.extensions.get::<ClientIp>().map(|client| client.0)
    }
}

/// At most this many hops of the header are read, from its end; a chain of trusted
/// proxies longer than that is taken to end at the last one read.
const MAX_HOPS: usize = 32;

/// Every request: its client's address, as [`client_ip`] tells it.
pub async fn known(
    State(front): State<Front>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    mut request: Request,
    next: Next,
) -> Response {
    let ip = loopback_as_one(client_ip(peer.ip(), request.headers(), &front.proxies));
    request.extensions_mut().insert(ClientIp(ip));
    next.run(request).await
}

/// `ip`, every loopback address (all of 127.0.0.0/8, `::1`) as one, `127.0.0.1`: any
/// process on the machine may connect from any of them, and counted apart, one process
/// using many would take many addresses' shares of what is counted per address, and make
/// another local client, on `127.0.0.1` alone, the address holding the most sessions,
/// whose sessions are closed first.
pub fn loopback_as_one(ip: IpAddr) -> IpAddr {
    if ip.to_canonical().is_loopback() { IpAddr::V4(std::net::Ipv4Addr::LOCALHOST) } else { ip }
}

/// The client of a request from `peer` with `headers`: `peer`, unless it is one of the
/// trusted `proxies`; then the nearest address in their header that is not (or the
/// farthest read, when all are). A hop that is not an address ends the reading at the
/// hop before it, which a trusted proxy wrote.
pub fn client_ip(peer: IpAddr, headers: &HeaderMap, proxies: &Proxies) -> IpAddr {
    let trusts = |ip: IpAddr| proxies.trusted.iter().any(|block| block.contains(&ip));
    let mut client = peer.to_canonical();
    if !trusts(client) {
        return client;
    }
    // Lines in the order the proxies added them, and within a line hops left to right:
    // read from the end, lazily, at most `MAX_HOPS`. Hop by hop, as bytes: what the client
    // wrote before a proxy's hop (on the same line, as nginx joins them), text or not, a
    // quote left open included, cannot hide that hop.
    let (name, hop_ip): (_, fn(&str) -> Option<IpAddr>) = match proxies.header {
        ProxyHeader::XForwardedFor => ("x-forwarded-for", hop_ip),
        ProxyHeader::Forwarded => ("forwarded", forwarded_for),
    };
    let mut read = 0;
    'lines: for line in headers.get_all(name).iter().rev() {
        for hop in line.as_bytes().rsplit(|b| *b == b',') {
            if read == MAX_HOPS {
                break 'lines;
            }
            read += 1;
            let Some(ip) = std::str::from_utf8(hop).ok().and_then(hop_ip) else { break 'lines };
            client = ip;
            if !trusts(client) {
                break 'lines;
            }
        }
    }
    client
}

/// One hop of `X-Forwarded-For`: `1.2.3.4`, `1.2.3.4:80`, `2001:db8::1`, `[2001:db8::1]`
/// or `[2001:db8::1]:80`; anything else (`unknown`, a name) is none.
fn hop_ip(hop: &str) -> Option<IpAddr> {
    let hop = hop.trim();
    let ip = hop.parse::<IpAddr>().ok().or_else(|| hop.parse::<SocketAddr>().ok().map(|a| a.ip()));
    let ip = ip.or_else(|| hop.strip_prefix('[')?.strip_suffix(']')?.parse().ok());
    ip.map(|ip| ip.to_canonical())
}

/// One hop of `Forwarded` (RFC 7239): its `for=` parameter, a token or a quoted string
/// (`for=192.0.2.60;proto=http`, `for="[2001:db8::7]:4711"`), read as an
/// `X-Forwarded-For` hop. A hop without one, or whose `for` is no address (`unknown`, an
/// obfuscated `_name`), is none.
fn forwarded_for(hop: &str) -> Option<IpAddr> {
    let value = hop.split(';').find_map(|pair| {
        let (name, value) = pair.split_once('=')?;
        name.trim().eq_ignore_ascii_case("for").then_some(value.trim())
    })?;
    let value = match value.strip_prefix('"') {
        Some(quoted) => quoted.strip_suffix('"')?,
        None => value,
    };
    hop_ip(value)
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// Every address a process on this machine can connect from is one client: many of
    /// them give it no more than one.
    #[test]
    fn every_loopback_address_is_one_client() {
        for local in ["127.0.0.1", "127.0.1.9", "127.255.255.254", "::1", "::ffff:127.0.0.2"] {
            assert_eq!(loopback_as_one(ip(local)), ip("127.0.0.1"), "{local}");
            let one = super::super::super::http::address_client(loopback_as_one(ip(local)));
            assert_eq!(one, "address 127.0.0.1", "{local}");
        }
        for other in ["10.0.0.1", "2001:db8::1", "::ffff:198.51.100.4", "0.0.0.0"] {
            assert_eq!(loopback_as_one(ip(other)), ip(other), "{other}");
        }
    }

    fn headers(lines: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for line in lines {
            headers.append("x-forwarded-for", HeaderValue::from_str(line).unwrap());
        }
        headers
    }

    fn proxies(list: &[&str]) -> Proxies {
        let trusted = list.iter().map(|p| crate::config::proxy_block(p).unwrap()).collect();
        Proxies { trusted, header: ProxyHeader::XForwardedFor }
    }

    #[test]
    fn a_request_not_from_a_trusted_proxy_is_its_own_address_whatever_it_claims() {
        let trusted = proxies(&["10.0.0.0/8"]);
        let claims = headers(&["10.0.0.1, 192.0.2.9"]);
        assert_eq!(client_ip(ip("198.51.100.4"), &claims, &trusted), ip("198.51.100.4"));
        assert_eq!(
            client_ip(ip("198.51.100.4"), &claims, &proxies(&[])),
            ip("198.51.100.4"),
            "no proxy is trusted by default"
        );
    }

    #[test]
    fn the_client_is_the_nearest_hop_no_trusted_proxy_wrote() {
        let trusted = proxies(&["127.0.0.1", "10.0.0.0/8"]);
        // The client wrote the first hop itself; the proxies appended the rest.
        let chain = headers(&["203.0.113.66, 198.51.100.4, 10.1.2.3"]);
        assert_eq!(client_ip(ip("127.0.0.1"), &chain, &trusted), ip("198.51.100.4"));
        // The same chain over several lines, as proxies that add a line of their own send it.
        let lines = headers(&["203.0.113.66", "198.51.100.4", "10.1.2.3"]);
        assert_eq!(client_ip(ip("127.0.0.1"), &lines, &trusted), ip("198.51.100.4"));
        // Ports and brackets, as some proxies write them.
        let ported = headers(&["[2001:db8::7]:4711, 10.0.0.2:80"]);
        assert_eq!(client_ip(ip("10.0.0.9"), &ported, &trusted), ip("2001:db8::7"));
        // An IPv4 address mapped into IPv6 is the IPv4 one, the proxy's as the client's.
        let mapped = headers(&["::ffff:198.51.100.4"]);
        assert_eq!(client_ip(ip("::ffff:127.0.0.1"), &mapped, &trusted), ip("198.51.100.4"));
    }

    #[test]
    fn a_hop_that_is_no_address_ends_the_chain_at_the_proxy_before_it() {
        let trusted = proxies(&["127.0.0.1", "10.0.0.0/8"]);
        assert_eq!(client_ip(ip("127.0.0.1"), &headers(&["unknown, 10.0.0.5"]), &trusted), ip("10.0.0.5"));
        assert_eq!(client_ip(ip("127.0.0.1"), &headers(&["198.51.100.4, unknown"]), &trusted), ip("127.0.0.1"));
        assert_eq!(client_ip(ip("127.0.0.1"), &headers(&[""]), &trusted), ip("127.0.0.1"));
        assert_eq!(client_ip(ip("127.0.0.1"), &HeaderMap::new(), &trusted), ip("127.0.0.1"), "no header: the proxy");
        let mut opaque = HeaderMap::new();
        opaque.append("x-forwarded-for", HeaderValue::from_bytes(b"198.51.100.4, \xff").unwrap());
        assert_eq!(client_ip(ip("127.0.0.1"), &opaque, &trusted), ip("127.0.0.1"), "a hop that is not text");
        // What the client wrote before the proxy's hop, text or not, leaves that hop its own.
        let mut sneaky = HeaderMap::new();
        sneaky.append("x-forwarded-for", HeaderValue::from_bytes(b"\x80, 198.51.100.4").unwrap());
        assert_eq!(client_ip(ip("127.0.0.1"), &sneaky, &trusted), ip("198.51.100.4"));
        let lines = headers(&["10.0.0.1, 10.0.0.2", "198.51.100.4"]);
        assert_eq!(client_ip(ip("127.0.0.1"), &lines, &trusted), ip("198.51.100.4"), "what it claims is not read");
    }

    #[test]
    fn a_long_chain_of_trusted_hops_is_read_only_so_far() {
        let trusted = proxies(&["10.0.0.0/8"]);
        let mut hops: Vec<String> = vec!["198.51.100.4".into()];
        hops.extend((0..100).map(|i| format!("10.0.{}.{}", i / 250, i % 250 + 1)));
        let chain = headers(&[&hops.join(", ")]);
        let client = client_ip(ip("10.9.9.9"), &chain, &trusted);
        assert!(trusted.trusted[0].contains(&client), "the farthest hop read, not the client's own claim: {client}");
        assert_eq!(client, ip(&hops[hops.len() - MAX_HOPS]));
    }

    /// Behind proxies that write RFC 7239's `Forwarded`, that header names the client, read
    /// as `X-Forwarded-For` is; the other header is then the client's word, never read.
    #[test]
    fn a_forwarded_header_names_the_client_when_the_proxies_write_that_one() {
        let trusted = Proxies { header: ProxyHeader::Forwarded, ..proxies(&["127.0.0.1", "10.0.0.0/8"]) };
        let forwarded = |lines: &[&str]| {
            let mut headers = headers(&["203.0.113.66"]); // the client's own X-Forwarded-For
            for line in lines {
                headers.append("forwarded", HeaderValue::from_str(line).unwrap());
            }
            headers
        };
        let from = |lines: &[&str]| client_ip(ip("127.0.0.1"), &forwarded(lines), &trusted);
        assert_eq!(from(&["for=203.0.113.66, for=198.51.100.4;proto=https, For=10.1.2.3"]), ip("198.51.100.4"));
        assert_eq!(from(&["for=198.51.100.4", "by=10.0.0.1;for=\"10.1.2.3:8080\""]), ip("198.51.100.4"));
        assert_eq!(from(&["for=\"[2001:db8:cafe::17]:4711\""]), ip("2001:db8:cafe::17"));
        assert_eq!(from(&["FOR = 198.51.100.4"]), ip("198.51.100.4"), "names and spaces as proxies write them");
        // No address: the reading ends at the proxy before it.
        assert_eq!(from(&["for=198.51.100.4, for=unknown"]), ip("127.0.0.1"));
        assert_eq!(from(&["for=198.51.100.4, for=_hidden, for=10.0.0.5"]), ip("10.0.0.5"));
        assert_eq!(from(&["proto=https"]), ip("127.0.0.1"), "a hop without `for`");
        assert_eq!(from(&[]), ip("127.0.0.1"), "only X-Forwarded-For: not read");
        // A quote the client left open, before the proxy's hop on the same line, hides nothing.
        assert_eq!(from(&["for=\"203.0.113.66, for=198.51.100.4"]), ip("198.51.100.4"));
        assert_eq!(from(&["for=\"198.51.100.4"]), ip("127.0.0.1"), "a quote never closed is no address");
    }
}
