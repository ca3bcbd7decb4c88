//! Counts by key of what is out, each counted until its guard is dropped: the requests on
//! their way to a server instance ([`Pins`]), and a server's requests waiting for one
//! client's answers (`Routing::asked_by`).
//!
//! A client's request other than a tool call is bound to an instance before it is sent,
//! and may take several rounds (a server on 2026-07-28 asking questions the gateway has
//! its client answer in between); for all that time the instance is held, so that a
//! reload replacing it waits for the request as it waits for the calls in flight
//! ([`super::routing::Routing::in_flight_on`]), instead of stopping it under the request.
//! (A client on 2026-07-28 answers questions in a request of its own: each is bound anew.)

use std::hash::Hash;
use std::sync::{Arc, Mutex};

use super::tally::Tally;
use crate::lasting::Locked;

/// How many of something are out, by key.
pub struct Counts<K>(Arc<Mutex<Tally<K>>>);

/// One counted under its key, until dropped.
#[derive(Debug)]
pub struct Counted<K: Eq + Hash> {
    counts: Arc<Mutex<Tally<K>>>,
    key: K,
}

/// How many requests hold each server instance.
pub type Pins = Counts<u64>;
/// One request's hold on an instance.
pub type Pin = Counted<u64>;

impl<K> Default for Counts<K> {
    fn default() -> Self {
        Self(Arc::default())
    }
}

impl<K: Eq + Hash + Clone> Counts<K> {
    pub fn count(&self, key: K) -> Counted<K> {
        self.count_below(key, usize::MAX).expect("no count reaches usize::MAX")
    }

    /// Counts one more under `key`, unless `max` are counted there already.
    pub fn count_below(&self, key: K, max: usize) -> Option<Counted<K>> {
        let mut counts = self.0.locked();
        if counts.of(&key) >= max {
            return None;
        }
        counts.add(key.clone(), 1);
        Some(Counted { counts: self.0.clone(), key })
    }

    /// How many are counted under `key`.
    pub fn on(&self, key: &K) -> usize {
        self.0.locked().of(key)
    }
}

impl<K: Eq + Hash> Drop for Counted<K> {
    fn drop(&mut self) {
        self.counts.locked().take_back(&self.key, 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_counted_while_any_guard_on_it_lives() {
        let pins = Pins::default();
        let (a, b) = (pins.count(1), pins.count(1));
        let other = pins.count(2);
        assert_eq!((pins.on(&1), pins.on(&2), pins.on(&3)), (2, 1, 0));
        drop(a);
        assert_eq!(pins.on(&1), 1);
        drop((b, other));
        assert_eq!((pins.on(&1), pins.on(&2)), (0, 0));
        assert!(pins.0.lock().unwrap().is_empty(), "nothing kept for keys no longer counted");
        let asked = Counts::default();
        let first = asked.count_below("c", 1).unwrap();
        assert!(asked.count_below("c", 1).is_none(), "at most one");
        drop(first);
        assert!(asked.count_below("c", 1).is_some(), "room again");
    }
}
