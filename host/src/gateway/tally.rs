//! Amounts held by key, each key forgotten once it holds nothing: what the requests in
//! flight weigh by address ([`super::http::parsed`]), the tasks each client has relayed
//! ([`super::tasks::relayed`]), the notifications on their way to each client
//! ([`super::downstreams`]), the requests holding each server instance ([`super::pins`]).
//! Keys come from clients (an address, a session), so a map that kept every key it had
//! seen would grow without bound; this one holds only the keys that hold something.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::ops::{AddAssign, SubAssign};

/// What a key holds: a count, bytes, or both together. Its default is nothing.
pub trait Amount: Copy + Default + PartialEq + AddAssign + SubAssign {}

impl<T: Copy + Default + PartialEq + AddAssign + SubAssign> Amount for T {}

/// Amounts by key; a key holding nothing is not kept.
#[derive(Debug)]
pub struct Tally<K, V = usize> {
    by_key: HashMap<K, V>,
}

impl<K, V> Default for Tally<K, V> {
    fn default() -> Self {
        Self { by_key: HashMap::new() }
    }
}

impl<K: Eq + Hash, V: Amount> Tally<K, V> {
    /// What `key` holds: nothing if it is not kept.
    pub fn of<Q: Eq + Hash + ?Sized>(&self, key: &Q) -> V
    where
        K: Borrow<Q>,
    {
        self.by_key.get(key).copied().unwrap_or_default()
    }

    /// Adds `amount` to what `key` holds (nothing keeps no key).
    pub fn add(&mut self, key: K, amount: V) {
        if amount == V::default() {
            return;
        }
        *self.by_key.entry(key).or_default() += amount;
    }

    /// Takes `amount` back from `key`, which must hold at least that (it was added);
    /// the key is forgotten once it holds nothing.
    pub fn take_back<Q: Eq + Hash + ?Sized>(&mut self, key: &Q, amount: V)
    where
        K: Borrow<Q>,
    {
        let Some(held) = self.by_key.get_mut(key) else {
            debug_assert!(amount == V::default(), "an amount taken back that was never added");
            return;
        };
        *held -= amount;
        if *held == V::default() {
            self.by_key.remove(key);
        }
    }

    /// How many keys hold something.
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_kept_while_it_holds_something() {
        let mut tally: Tally<String> = Tally::default();
        tally.add("a".into(), 3);
        tally.add("a".into(), 2);
        tally.add("b".into(), 1);
        tally.add("c".into(), 0);
        assert_eq!((tally.of("a"), tally.of("b"), tally.of("c")), (5, 1, 0));
        tally.take_back("a", 3);
        assert_eq!((tally.of("a"), tally.len()), (2, 2));
        tally.take_back("a", 2);
        tally.take_back("b", 1);
        assert!(tally.is_empty(), "no key kept that holds nothing");
    }

    #[derive(Debug, Clone, Copy, Default, PartialEq)]
    struct Pair(usize, usize);
    impl AddAssign for Pair {
        fn add_assign(&mut self, other: Self) {
            (self.0, self.1) = (self.0 + other.0, self.1 + other.1);
        }
    }
    impl SubAssign for Pair {
        fn sub_assign(&mut self, other: Self) {
            (self.0, self.1) = (self.0 - other.0, self.1 - other.1);
        }
    }

    #[test]
    fn an_amount_of_two_parts_is_forgotten_when_both_are_nothing() {
        let mut tally: Tally<&str, Pair> = Tally::default();
        tally.add("a", Pair(1, 10));
        tally.add("a", Pair(1, 0));
        tally.take_back("a", Pair(1, 10));
        assert_eq!(tally.of("a"), Pair(1, 0), "one still held, of no bytes");
        tally.take_back("a", Pair(1, 0));
        assert!(tally.is_empty());
    }
}
