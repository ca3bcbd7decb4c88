//! What clients say of themselves to their servers, outside any request: that their roots
//! changed, and their custom notifications (a task's status included). Each is passed on
//! to every server concerned on a task of rmcp's own, and a server that does not read its
//! input holds it there; so at most [`PER_CLIENT`] of one client's, and [`IN_ALL`] of all
//! clients', are on their way at once, each within [`SEND_WITHIN`] per server. Past
//! either bound, one more is dropped (and logged): a client flooding a server that does
//! not read would otherwise hold its notifications in memory without end.

use std::sync::{Arc, LazyLock, Mutex, PoisonError};

pub use super::downstreams::SEND_WITHIN;
use super::tally::Tally;

/// The most notifications of one client (a session, or over HTTP a request of a
/// 2026-07-28 client) on their way to its servers at once.
pub const PER_CLIENT: usize = 16;
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
    ON_THEIR_WAY.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One notification of `client` on its way, counted until dropped.
#[must_use]
pub struct OnItsWay {
    client: Arc<str>,
}

impl Drop for OnItsWay {
    fn drop(&mut self) {
        let mut counts = on_their_way();
        counts.all -= 1;
        counts.by_client.take_back(&self.client, 1);
    }
}

/// Room for one more notification of `client` on its way to its servers, if there is.
pub fn admit(client: &Arc<str>) -> Option<OnItsWay> {
    let mut counts = on_their_way();
    if counts.all >= IN_ALL || counts.by_client.of(client) >= PER_CLIENT {
        return None;
    }
    counts.all += 1;
    counts.by_client.add(client.clone(), 1);
    Some(OnItsWay { client: client.clone() })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client has room for [`PER_CLIENT`] at once, given back as each is done; another
    /// client's room is its own.
    #[test]
    fn each_client_has_its_own_room_given_back_once_done() {
        let (one, other): (Arc<str>, Arc<str>) = ("onward test client".into(), "onward test other".into());
        let mut held: Vec<_> = (0..PER_CLIENT).map(|_| admit(&one).expect("room")).collect();
        assert!(admit(&one).is_none(), "past its room");
        let theirs = admit(&other).expect("another client's room is its own");
        held.pop();
        assert!(admit(&one).is_some(), "room given back");
        drop((held, theirs));
        assert_eq!(on_their_way().by_client.of(&*one), 0);
    }
}
