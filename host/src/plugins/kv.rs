//! An adapter's key-value store (the `store` import): one per server instance it serves,
//! outliving the instances of its calls, each bounded, and all the stores of one
//! adapter's copies (a `scope: session` server's sessions each have their own) bounded
//! together, so that many sessions do not make an adapter's store many times larger.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::lasting::Locked;

/// Limits of one store (documented in the WIT).
const MAX_KEY: usize = 256;
const MAX_VALUE: usize = 64 << 10;
const MAX_KEYS: usize = 1024;
/// The most bytes, keys and values together, one store may hold.
const MAX_STORE_BYTES: usize = 4 << 20;
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
    /// Bytes held by every store of the adapter's copies, this one's included.
    all: Arc<AtomicUsize>,
}

impl Drop for Entries {
    fn drop(&mut self) {
        self.all.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

impl Kv {
    /// An empty store whose bytes count towards [`MAX_ADAPTER_BYTES`] in `all`, with
    /// those of every other store of the same adapter (its runtime room's), whichever
    /// server it serves.
    pub fn counted_in(all: Arc<AtomicUsize>) -> Self {
        Self { entries: Arc::new(Mutex::new(Entries { map: BTreeMap::new(), bytes: 0, all })), read_only: false }
    }

    /// This store as a call that may only read it sees it: what it holds, and a refusal
    /// (`false`, as past a bound) for every `set`; a `delete` changes nothing.
    pub fn read_only(&self) -> Self {
        Self { entries: self.entries.clone(), read_only: true }
    }

    /// An empty store for another copy of the same adapter: its bytes count with this
    /// one's towards [`MAX_ADAPTER_BYTES`].
    pub fn sibling(&self) -> Self {
        Self::counted_in(self.lock().all.clone())
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
        if e.bytes - old + new > MAX_STORE_BYTES {
            return false;
        }
        let grown = e.all.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |all| {
            let all = all - old + new;
            (all <= MAX_ADAPTER_BYTES).then_some(all)
        });
        if grown.is_err() {
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
            e.all.fetch_sub(freed, Ordering::Relaxed);
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
        // which its stores for every other server share (checked below with siblings).
        let first = Kv::counted_in(Arc::default());
        let value = "v".repeat(MAX_VALUE);
        let per_store = MAX_STORE_BYTES / (ENTRY_BYTES + 4 + MAX_VALUE);
        let fill = |kv: &Kv| (0..per_store).filter(|i| kv.set(format!("{i:04}"), value.clone())).count();
        assert_eq!(fill(&first), per_store);
        let mut copies: Vec<Kv> = Vec::new();
        let mut stored = per_store;
        // Sessions' copies, each with a store of its own, until all of them are full.
        for _ in 0..MAX_ADAPTER_BYTES / MAX_STORE_BYTES + 1 {
            let copy = first.sibling();
            stored += fill(&copy);
            copies.push(copy);
        }
        assert!(stored * (ENTRY_BYTES + 4 + MAX_VALUE) <= MAX_ADAPTER_BYTES, "{stored} values");
        assert!(
            (stored + per_store) * (ENTRY_BYTES + 4 + MAX_VALUE) > MAX_ADAPTER_BYTES,
            "it was full: {stored} values"
        );
        let last = copies.last().unwrap().clone();
        assert!(!last.set("more".into(), value.clone()), "full for every copy");
        assert_eq!(last.get("0000"), None, "a copy's store is its own");
        // A session's copy gone, its bytes are free for the others.
        copies.remove(0);
        assert!(last.set("more".into(), value.clone()));
        let all = held(&first).1;
        assert_eq!(all, first.lock().bytes + copies.iter().map(|c| c.lock().bytes).sum::<usize>());
        drop((copies, last));
        assert_eq!(
            held(&first),
            (per_store * (ENTRY_BYTES + 4 + MAX_VALUE), per_store * (ENTRY_BYTES + 4 + MAX_VALUE))
        );
        // A clone is the same store (a reload keeps it): dropping one frees nothing.
        let kept = first.clone();
        drop(first);
        assert_eq!(held(&kept).1, per_store * (ENTRY_BYTES + 4 + MAX_VALUE));
    }
}
