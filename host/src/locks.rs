//! Locks that outlive a panic.
//!
//! A panic while a `std` lock is held (a bug) poisons it, and `lock().expect(..)` would
//! then panic in every later call through it: one bug would fail every call of a server
//! until a restart, and a guard whose `Drop` takes a poisoned lock while a panic unwinds
//! would abort the process. What the gateway's locks guard (maps, counts, queues) is
//! changed in steps that each leave it whole, so a lock is taken as it is, poisoned or not.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// [`Mutex::lock`] and [`Mutex::get_mut`], poisoned or not.
pub trait Locked<T: ?Sized> {
    fn locked(&self) -> MutexGuard<'_, T>;
    fn locked_mut(&mut self) -> &mut T;
}

impl<T: ?Sized> Locked<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn locked_mut(&mut self) -> &mut T {
        self.get_mut().unwrap_or_else(PoisonError::into_inner)
    }
}

/// [`RwLock::read`] and [`RwLock::write`], poisoned or not.
pub trait ReadWrite<T: ?Sized> {
    fn reading(&self) -> RwLockReadGuard<'_, T>;
    fn writing(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T: ?Sized> ReadWrite<T> for RwLock<T> {
    fn reading(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn writing(&self) -> RwLockWriteGuard<'_, T> {
        self.write().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// A lock a panic left poisoned is still taken, with what it held.
    #[test]
    fn a_lock_poisoned_by_a_panic_is_still_taken() {
        let (counts, table) = (Arc::new(Mutex::new(1)), Arc::new(RwLock::new(vec![1])));
        let (c, t) = (counts.clone(), table.clone());
        let panicked = std::thread::spawn(move || {
            let (_held, _written) = (c.lock().unwrap(), t.write().unwrap());
            panic!("a bug while both are held");
        })
        .join();
        assert!(panicked.is_err() && counts.is_poisoned() && table.is_poisoned());
        *counts.locked() += 1;
        table.writing().push(2);
        assert_eq!((*counts.locked(), table.reading().clone()), (2, vec![1, 2]));
    }
}
