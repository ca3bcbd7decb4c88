//! An adapter's key-value store (the `store` import): one per server instance it serves,
//! outliving the instances of its calls, each bounded, and all the stores of one
//! adapter's copies (a `scope: session` server's sessions each have their own) bounded
//! together, so that many sessions do not make an adapter's store many times larger.
//!
//! A session's store reserves its whole room at its first write, and from then on its
//! writes are bounded by that room alone: whether one succeeds never depends on what
//! another session's store holds, which would let an adapter's copy in one session tell
//! its copy in another, `set` by `set`, what it was shown there.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::lasting::Locked;

/// Limits of one store (documented in the WIT).
const MAX_KEY: usize = 256;
const MAX_VALUE: usize = 64 << 10;
const MAX_KEYS: usize = 1024;
/// The most bytes, keys and values together, one server's store may hold.
const MAX_STORE_BYTES: usize = 4 << 20;
/// The bytes a session's own store reserves at its first write, and may hold: room for
/// 512 sessions' stores (twice the default `max_sessions`, for the fresh copies a reload
/// makes while the old ones finish) in [`MAX_ADAPTER_BYTES`].
pub const SESSION_STORE_BYTES: usize = 128 << 10;
/// The most bytes all the stores of one adapter's copies may hold together.
pub const MAX_ADAPTER_BYTES: usize = 64 << 20;
/// What an entry costs beyond its key's and value's bytes (their two allocations' heads
/// and the map's node share): an empty key and value are not free.
const ENTRY_BYTES: usize = 64;

/// The bytes an entry of `key` and `value` counts for.
fn cost(key: &str, value: &str) -> usize {
    ENTRY_BYTES + key.len() + value.len()
}

/// One store, shared by the calls (and the reloads) of one adapter for one server
/// instance. Cloning it shares it.
#[derive(Clone, Default)]
pub struct Kv {
    entries: Arc<Mutex<Entries>>,
    /// A view that only reads ([`Kv::read_only`]): `set` refuses, `delete` does nothing.
    read_only: bool,
}

#[derive(Default)]
struct Entries {
    map: BTreeMap<String, String>,
    /// Bytes of the entries in `map` ([`cost`]).
    bytes: usize,
    /// Bytes held or reserved by every store of the adapter's copies, this one's included.
    all: Arc<AtomicUsize>,
    counting: Counting,
}

/// How a store counts in `all`.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
enum Counting {
    /// A server's store: the bytes it holds, as it holds them.
    #[default]
    Held,
    /// A session's store: [`SESSION_STORE_BYTES`] once it reserved them (at its first
    /// write), nothing before.
    Reserved(bool),
}

impl Entries {
    /// What this store counts for in `all`.
    fn counted(&self) -> usize {
        match self.counting {
            Counting::Held => self.bytes,
            Counting::Reserved(true) => SESSION_STORE_BYTES,
            Counting::Reserved(false) => 0,
        }
    }

    /// The most this store may hold, once it has its room (a session's reserves it now,
    /// if there is any left).
    fn room(&mut self) -> Option<usize> {
        match self.counting {
            Counting::Held => Some(MAX_STORE_BYTES),
            Counting::Reserved(true) => Some(SESSION_STORE_BYTES),
            Counting::Reserved(false) => {
                let room = |n: usize| n.checked_add(SESSION_STORE_BYTES).filter(|n| *n <= MAX_ADAPTER_BYTES);
                self.all.fetch_update(Ordering::Relaxed, Ordering::Relaxed, room).ok()?;
                self.counting = Counting::Reserved(true);
                Some(SESSION_STORE_BYTES)
            }
        }
    }
}

impl Drop for Entries {
    fn drop(&mut self) {
        self.all.fetch_sub(self.counted(), Ordering::Relaxed);
    }
}

impl Kv {
    /// An empty store whose bytes count towards [`MAX_ADAPTER_BYTES`] in `all`, with
    /// those of every other store of the same adapter (its runtime room's), whichever
    /// server it serves.
    pub fn counted_in(all: Arc<AtomicUsize>) -> Self {
        let entries = Entries { map: BTreeMap::new(), bytes: 0, all, counting: Counting::Held };
        Self { entries: Arc::new(Mutex::new(entries)), read_only: false }
    }

    /// This store as a call that may only read it sees it: what it holds, and a refusal
    /// (`false`, as past a bound) for every `set`; a `delete` changes nothing.
    pub fn read_only(&self) -> Self {
        Self { entries: self.entries.clone(), read_only: true }
    }

    /// An empty store for a session's copy of the same adapter, which reserves
    /// [`SESSION_STORE_BYTES`] of [`MAX_ADAPTER_BYTES`] with this one's at its first
    /// write (refused while the adapter's stores hold or reserve them all).
    pub fn sibling(&self) -> Self {
        let all = self.lock().all.clone();
        let entries = Entries { map: BTreeMap::new(), bytes: 0, all, counting: Counting::Reserved(false) };
        Self { entries: Arc::new(Mutex::new(entries)), read_only: false }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.locked()
    }

    pub fn get(&self, key: &str) -> Option<String> {
        self.lock().map.get(key).cloned()
    }

    /// Sets `key` to `value`, unless that would take this store or all of its adapter's
    /// past their bounds: then nothing changes, and it says so with `false`.
    pub fn set(&self, key: String, value: String) -> bool {
        if self.read_only {
            return false;
        }
        let mut e = self.lock();
        let old = e.map.get(&key).map(|v| cost(&key, v));
        if key.len() > MAX_KEY || value.len() > MAX_VALUE || (old.is_none() && e.map.len() >= MAX_KEYS) {
            return false;
        }
        let (old, new) = (old.unwrap_or(0), cost(&key, &value));
        let Some(room) = e.room() else { return false };
        if e.bytes - old + new > room {
            return false;
        }
        // A session's store has its room already; a server's counts what it holds.
        let grown = e.counting != Counting::Held
            || e.all
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |all| {
                    let all = all - old + new;
                    (all <= MAX_ADAPTER_BYTES).then_some(all)
                })
                .is_ok();
        if !grown {
            return false;
        }
        e.bytes = e.bytes - old + new;
        e.map.insert(key, value);
        true
    }

    pub fn delete(&self, key: &str) {
        if self.read_only {
            return;
        }
        let mut e = self.lock();
        if let Some(value) = e.map.remove(key) {
            let freed = cost(key, &value);
            e.bytes -= freed;
            if e.counting == Counting::Held {
                e.all.fetch_sub(freed, Ordering::Relaxed);
            }
        }
    }

    /// The keys that start with `prefix`, in order.
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        let e = self.lock();
        e.map.range(prefix.to_owned()..).take_while(|(k, _)| k.starts_with(prefix)).map(|(k, _)| k.clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(kv: &Kv) -> (usize, usize) {
        let e = kv.lock();
        (e.bytes, e.all.load(Ordering::Relaxed))
    }

    #[test]
    fn a_read_only_view_reads_the_store_and_changes_nothing() {
        let kv = Kv::counted_in(Arc::default());
        assert!(kv.set("kept".into(), "before".into()));
        let view = kv.read_only();
        assert_eq!(view.get("kept").as_deref(), Some("before"));
        assert_eq!(view.keys("ke"), ["kept"]);
        assert!(!view.set("kept".into(), "after".into()), "a write through the view");
        assert!(!view.set("new".into(), "value".into()), "a new key through the view");
        view.delete("kept");
        assert_eq!(kv.get("kept").as_deref(), Some("before"));
        assert_eq!(kv.keys(""), ["kept"]);
        assert_eq!(held(&kv), (cost("kept", "before"), cost("kept", "before")));
        // The store itself still writes, and the view sees it.
        assert!(kv.set("kept".into(), "after".into()));
        assert_eq!(view.get("kept").as_deref(), Some("after"));
    }

    #[test]
    fn a_store_keeps_its_bounds_and_refuses_past_them_changing_nothing() {
        let kv = Kv::default();
        assert!(kv.set("k".into(), "v".into()));
        assert!(!kv.set("k".repeat(MAX_KEY + 1), "v".into()), "a key too long");
        assert!(!kv.set("k".into(), "v".repeat(MAX_VALUE + 1)), "a value too long");
        assert_eq!(kv.get("k").as_deref(), Some("v"), "a refused set changes nothing");
        for i in 1..MAX_KEYS {
            assert!(kv.set(format!("k-{i:04}"), String::new()));
        }
        assert!(!kv.set("one too many".into(), String::new()), "past the keys");
        assert!(kv.set("k".into(), "w".into()), "an existing key can still change");
        // Entries cost what they take beyond their bytes: empty ones too.
        assert!(held(&kv).0 >= MAX_KEYS * ENTRY_BYTES, "{:?}", held(&kv));
        kv.delete("k-0001");
        assert!(kv.set("room again".into(), String::new()));
        assert_eq!(kv.keys("k-").len(), MAX_KEYS - 2);
        assert_eq!(kv.keys("room"), ["room again"]);
    }

    #[test]
    fn a_store_holds_at_most_its_bytes_and_counts_them_exactly() {
        let kv = Kv::default();
        let value = "v".repeat(MAX_VALUE);
        let fits = MAX_STORE_BYTES / (ENTRY_BYTES + 4 + MAX_VALUE);
        for i in 0..fits {
            assert!(kv.set(format!("{i:04}"), value.clone()), "{i}");
        }
        assert!(!kv.set("more".into(), value.clone()), "past 4 MiB");
        // Replacing a value counts the difference, not both.
        assert!(kv.set("0000".into(), "x".into()));
        assert_eq!(
            held(&kv),
            (
                (fits - 1) * (ENTRY_BYTES + 4 + MAX_VALUE) + ENTRY_BYTES + 5,
                (fits - 1) * (ENTRY_BYTES + 4 + MAX_VALUE) + ENTRY_BYTES + 5
            )
        );
        assert!(kv.set("more".into(), value.clone()), "room made by the smaller value");
        for i in 0..fits {
            kv.delete(&format!("{i:04}"));
        }
        kv.delete("more");
        kv.delete("never set");
        assert_eq!(held(&kv), (0, 0));
    }

    #[test]
    fn the_stores_of_an_adapters_copies_are_bounded_together_and_free_what_they_held() {
        // As the adapter's first store for a server is made: counted in its room's total,
        // which its stores for every other server share, as they hold bytes.
        let first = Kv::counted_in(Arc::default());
        let value = "v".repeat(MAX_VALUE);
        let (entry, per_store) = (ENTRY_BYTES + 4 + MAX_VALUE, MAX_STORE_BYTES / (ENTRY_BYTES + 4 + MAX_VALUE));
        let fill = |kv: &Kv| (0..per_store).filter(|i| kv.set(format!("{i:04}"), value.clone())).count();
        assert_eq!(fill(&first), per_store);
        assert_eq!(held(&first), (per_store * entry, per_store * entry));
        // Sessions' copies reserve their room at their first write (a copy that never
        // writes takes none), until the adapter's is all taken.
        let room = (MAX_ADAPTER_BYTES - per_store * entry) / SESSION_STORE_BYTES;
        let mut copies: Vec<Kv> = (0..room + 2).map(|_| first.sibling()).collect();
        assert_eq!(held(&first).1, per_store * entry, "nothing reserved before a write");
        let (idle, last) = (copies.pop().unwrap(), copies.pop().unwrap());
        assert!(copies.iter().all(|c| c.set("k".into(), String::new())));
        assert!(!last.set("k".into(), String::new()), "no room left for it");
        assert_eq!(held(&first).1, per_store * entry + room * SESSION_STORE_BYTES);
        // A session's store holds what its room holds, whatever the others hold: full
        // ones and empty ones alike.
        let per_session = (SESSION_STORE_BYTES - cost("k", "")) / entry;
        assert_eq!(fill(&copies[0]), per_session);
        assert_eq!(fill(&copies[1]), per_session, "the same with a neighbour full");
        assert!(!copies[1].set("more".into(), value.clone()), "past its room");
        assert_eq!(copies[2].get("0000"), None, "a copy's store is its own");
        copies[2].delete("k");
        assert!(copies[2].set("k".into(), String::new()), "its room stays its own, emptied or not");
        // A session's copy gone, its room is free for the next write that needs it.
        copies.remove(0);
        assert!(last.set("k".into(), value.clone()));
        drop((copies, last, idle));
        assert_eq!(held(&first), (per_store * entry, per_store * entry), "every session's room given back");
        // A clone is the same store (a reload keeps it): dropping one frees nothing.
        let kept = first.clone();
        drop(first);
        assert_eq!(held(&kept).1, per_store * entry);
    }
}
