//! What clients say of themselves to their servers, outside any request: that their roots
//! changed, and their custom notifications (a task's status included). Each is passed on
//! to every server concerned on a task of rmcp's own, and a server that does not read its
//! input holds it there; so at most [`PER_CLIENT`] of one client's, [`PER_ADDRESS`] of
//! one address's (over HTTP, all its sessions together), twice that of one IPv6 site's,
//! and [`IN_ALL`] of all clients', are on their way at once, each within [`SEND_WITHIN`]
//! per server. Past any bound, one more is dropped (and logged): a client flooding a
//! server that does not read would otherwise hold its notifications in memory without
//! end, and one address opening sessions would take every other client's room.

use std::sync::{Arc, LazyLock, Mutex};

pub use super::downstreams::SEND_WITHIN;
use super::tally::Tally;
use crate::lasting::Locked;

/// The most notifications of one client (a session, or over HTTP a request of a
/// 2026-07-28 client) on their way to its servers at once.
pub const PER_CLIENT: usize = 16;
/// The most of one address's sessions together (an IPv6 site's: twice that).
pub const PER_ADDRESS: usize = IN_ALL / 4;
/// The most of all clients' together.
pub const IN_ALL: usize = 256;

#[derive(Default)]
struct OnTheirWay {
    all: usize,
    by_client: Tally<Arc<str>>,
}

static ON_THEIR_WAY: LazyLock<Mutex<OnTheirWay>> = LazyLock::new(Mutex::default);

fn on_their_way() -> std::sync::MutexGuard<'static, OnTheirWay> {
    // Taken in a guard's `drop`: a panic elsewhere never makes it unusable.
    ON_THEIR_WAY.locked()
}

/// One notification of a client on its way, counted until dropped: under the client,
/// and its address and site, if it has them.
#[must_use]
pub struct OnItsWay {
    counted: Vec<Arc<str>>,
}

impl Drop for OnItsWay {
    fn drop(&mut self) {
        let mut counts = on_their_way();
        counts.all -= 1;
        for key in &self.counted {
            counts.by_client.take_back(key, 1);
        }
    }
}

/// Room for one more notification of `client`, over HTTP from `address` (of
/// `http::address_client`), on its way to its servers, if there is.
pub fn admit(client: &Arc<str>, address: Option<String>) -> Option<OnItsWay> {
    let site = address.as_deref().and_then(super::http::network_of);
    let mut counted: Vec<(Arc<str>, usize)> = vec![(client.clone(), PER_CLIENT)];
    counted.extend(address.map(|a| (Arc::from(format!("{a} in all")), PER_ADDRESS)));
    counted.extend(site.map(|s| (Arc::from(format!("{s} in all")), 2 * PER_ADDRESS)));
    let mut counts = on_their_way();
    if counts.all >= IN_ALL || counted.iter().any(|(key, most)| counts.by_client.of(key) >= *most) {
        return None;
    }
    counts.all += 1;
    for (key, _) in &counted {
        counts.by_client.add(key.clone(), 1);
    }
    Some(OnItsWay { counted: counted.into_iter().map(|(key, _)| key).collect() })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client has room for [`PER_CLIENT`] at once, given back as each is done; another
    /// client's room is its own.
    #[test]
    fn each_client_has_its_own_room_given_back_once_done() {
        let (one, other): (Arc<str>, Arc<str>) = ("onward test client".into(), "onward test other".into());
        let mut held: Vec<_> = (0..PER_CLIENT).map(|_| admit(&one, None).expect("room")).collect();
        assert!(admit(&one, None).is_none(), "past its room");
        let theirs = admit(&other, None).expect("another client's room is its own");
        held.pop();
        assert!(admit(&one, None).is_some(), "room given back");
        drop((held, theirs));
        assert_eq!(on_their_way().by_client.of(&*one), 0);
    }

    /// One address's sessions together have [`PER_ADDRESS`], however many it opens, and
    /// leave the rest of the room to other addresses.
    #[test]
    fn one_addresses_sessions_share_one_room() {
        let address = || Some("address 192.0.2.77".to_owned());
        let sessions: Vec<Arc<str>> =
            (0..PER_ADDRESS / PER_CLIENT + 1).map(|i| format!("onward session {i}").into()).collect();
        let held: Vec<_> = sessions[..PER_ADDRESS / PER_CLIENT]
            .iter()
            .flat_map(|s| (0..PER_CLIENT).map(|_| admit(s, address()).expect("room")).collect::<Vec<_>>())
            .collect();
        let fresh = sessions.last().unwrap();
        assert!(admit(fresh, address()).is_none(), "a new session of the address has no more room");
        let elsewhere = admit(&Arc::from("onward session elsewhere"), Some("address 192.0.2.78".to_owned()));
        assert!(elsewhere.is_some(), "another address's room is its own");
        drop((held, elsewhere));
        assert_eq!(on_their_way().by_client.of("address 192.0.2.77 in all"), 0);
    }
}
