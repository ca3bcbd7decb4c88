//! What the requests in flight cost the gateway once read. A body is at most
//! `max_body_bytes`, but read into JSON values it takes far more: every value, a `0` of
//! one byte and its comma included, becomes a node of about a hundred bytes (and a tool
//! call keeps a copy of its arguments for its retries). A body of 4 MiB of `0,0,0…` is
//! about 2 million values: hundreds of MiB once read. So every POST body is weighed
//! before it is read ([`weight`]: its bytes, and [`crate::weight::PER_VALUE`] for each value in it), and
//! the weights of the requests in flight are held against one budget for the gateway
//! ([`GATEWAY_BUDGET`]), of which one client address (an IPv6 one by its /64) may hold a
//! quarter, and the addresses of one IPv6 site (a /48) half; a weight is held until its
//! response has been sent and its request handled.
//! A body that weighs little ([`LIGHT`]: a cancellation, an answer to the server, most
//! calls) is not held against the budget, so that a few clients holding all of it cannot
//! keep everyone else from cancelling or answering; those are bounded by the count of
//! requests in flight.

use std::sync::{Arc, Mutex};

use crate::gateway::tally::Tally;
use crate::lasting::Locked;

pub use crate::weight::json as weight;

/// The most the requests in flight may weigh together.
pub const GATEWAY_BUDGET: usize = 1 << 30;
/// The most the requests in flight from one address may weigh together; a request
/// heavier than this on its own is refused whatever else is in flight.
pub const ADDRESS_SHARE: usize = GATEWAY_BUDGET / 4;
/// The most the requests in flight from one IPv6 site (a /48, many /64s) may weigh.
pub const NETWORK_SHARE: usize = GATEWAY_BUDGET / 2;
/// A weight this small is not held.
pub const LIGHT: usize = 64 << 10;

/// The weights held now: in all, and by address.
#[derive(Debug, Default)]
pub struct Budget {
    held: Mutex<(usize, Tally<String>)>,
}

/// Why a request's weight could not be held.
#[derive(Debug, PartialEq)]
pub enum Past {
    /// It alone weighs more than an address's share.
    Alone,
    /// Its address holds its share, or its network (an IPv6 /48) holds its own.
    Address,
    /// The gateway holds its budget.
    Gateway,
}

/// A weight held until it is dropped.
#[derive(Debug)]
pub struct Held {
    budget: Arc<Budget>,
    address: String,
    network: Option<String>,
    weight: usize,
}

impl Budget {
    /// Holds `weight` for a request from `address`, if it fits.
    /// A light one holds nothing (`None`), and its address is not even named.
    pub fn hold(self: &Arc<Self>, address: impl FnOnce() -> String, weight: usize) -> Result<Option<Held>, Past> {
        if weight > ADDRESS_SHARE {
            return Err(Past::Alone);
        }
        if weight <= LIGHT {
            return Ok(None);
        }
        let address = address();
        let network = super::network_of(&address);
        let mut held = self.held.locked();
        let (total, by_address) = &mut *held;
        if by_address.of(&address) + weight > ADDRESS_SHARE
            || network.as_deref().is_some_and(|n| by_address.of(n) + weight > NETWORK_SHARE)
        {
            return Err(Past::Address);
        }
        if *total + weight > GATEWAY_BUDGET {
            return Err(Past::Gateway);
        }
        *total += weight;
        for key in std::iter::once(&address).chain(&network) {
            by_address.add(key.clone(), weight);
        }
        Ok(Some(Held { budget: self.clone(), address, network, weight }))
    }

    #[cfg(test)]
    fn total(&self) -> (usize, usize) {
        let held = self.held.lock().unwrap();
        (held.0, held.1.len())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut held = self.budget.held.locked();
        let (total, by_address) = &mut *held;
        *total -= self.weight;
        for key in std::iter::once(&self.address).chain(&self.network) {
            by_address.take_back(key, self.weight);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weight::PER_VALUE;

    #[test]
    fn a_body_weighs_its_bytes_and_its_values() {
        let values = |body: &str| (weight(body.as_bytes()) - body.len()) / PER_VALUE;
        assert_eq!(values(r#"{"a":[0,0,0]}"#), 5, "the object, the array and three numbers");
        assert_eq!(values(r#""one long string, with [brackets] and {braces}""#), 1);
        assert_eq!(values(r#"["a \" quote, then", "b\\", "c"]"#), 4, "escapes end no string early");
        assert_eq!(values(""), 1);
        // A body of the most bytes allowed, all of it small values: far heavier than its bytes.
        let zeros = "0,".repeat(2 << 20);
        assert!(weight(zeros.as_bytes()) > ADDRESS_SHARE, "4 MiB of zeros is past any one address's share");
        let text = format!(r#"{{"text":"{}"}}"#, "x".repeat(4 << 20));
        assert!(weight(text.as_bytes()) < (4 << 20) + 1024, "4 MiB of text is about 4 MiB");
    }

    #[test]
    fn weights_are_held_within_an_addresss_share_and_the_gateways_budget() {
        let budget = Arc::new(Budget::default());
        let (quarter, heavy) = (ADDRESS_SHARE, LIGHT + 1);
        assert_eq!(budget.hold(|| "a".into(), quarter + 1).unwrap_err(), Past::Alone);
        let light = budget.hold(|| "a".into(), LIGHT).unwrap();
        assert!(light.is_none(), "a light body holds nothing");
        assert_eq!(budget.total(), (0, 0), "a light body is not held");
        let a = budget.hold(|| "a".into(), quarter - heavy).unwrap().unwrap();
        assert_eq!(budget.hold(|| "a".into(), heavy + 1).unwrap_err(), Past::Address);
        let a2 = budget.hold(|| "a".into(), heavy).unwrap().unwrap();
        // Other addresses have the rest, until the gateway's budget is held.
        let others: Vec<Held> =
            ["b", "c", "d"].iter().map(|b| budget.hold(|| (*b).into(), quarter).unwrap().unwrap()).collect();
        assert_eq!(budget.hold(|| "e".into(), heavy).unwrap_err(), Past::Gateway);
        let cancel = budget.hold(|| "e".into(), 200).expect("a light body passes a full gateway");
        drop(a);
        let e = budget.hold(|| "e".into(), heavy).expect("room made by a's request").unwrap();
        drop((a2, others, e, light, cancel));
        assert_eq!(budget.total(), (0, 0), "everything given back, no address kept");
    }

    /// The /64s of one IPv6 site hold half the budget at most: the rest is the others'.
    #[test]
    fn the_addresses_of_one_ipv6_site_hold_half_the_budget_at_most() {
        let budget = Arc::new(Budget::default());
        let of = |ip: &str| super::super::address_client(ip.parse().unwrap());
        let site: Vec<Held> = ["2001:db8:1:1::1", "2001:db8:1:2::1"]
            .iter()
            .map(|ip| budget.hold(|| of(ip), ADDRESS_SHARE).unwrap().unwrap())
            .collect();
        assert_eq!(budget.hold(|| of("2001:db8:1:3::1"), LIGHT + 1).unwrap_err(), Past::Address);
        let elsewhere = budget.hold(|| of("2001:db8:2:1::1"), ADDRESS_SHARE).expect("another site").unwrap();
        let v4 = budget.hold(|| of("192.0.2.7"), ADDRESS_SHARE).expect("an IPv4 address").unwrap();
        drop((site, elsewhere, v4));
        assert_eq!(budget.total(), (0, 0), "everything given back, no address or network kept");
    }
}
