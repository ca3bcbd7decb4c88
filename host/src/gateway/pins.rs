//! Requests on their way to a server instance. A client's request other than a tool call
//! is bound to an instance before it is sent, and may take several rounds (a server on
//! 2026-07-28 asking questions the gateway has its client answer in between); for all
//! that time the instance is held, so that a reload replacing it waits for the request
//! as it waits for the calls in flight ([`super::routing::Routing::in_flight_on`]),
//! instead of stopping it under the request. (A client on 2026-07-28 answers questions
//! in a request of its own: each is bound anew.)

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// How many requests hold each server instance.
#[derive(Default)]
pub struct Pins(Arc<Mutex<HashMap<u64, usize>>>);

/// One request's hold on an instance, released when dropped.
#[derive(Debug)]
pub struct Pin {
    pins: Arc<Mutex<HashMap<u64, usize>>>,
    instance: u64,
}

impl Pins {
    pub fn pin(&self, instance: u64) -> Pin {
        *self.0.lock().expect("not poisoned").entry(instance).or_default() += 1;
        Pin { pins: self.0.clone(), instance }
    }

    /// How many requests hold `instance`.
    pub fn on(&self, instance: u64) -> usize {
        self.0.lock().expect("not poisoned").get(&instance).copied().unwrap_or(0)
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        let mut pins = self.pins.lock().expect("not poisoned");
        if let Some(n) = pins.get_mut(&self.instance) {
            *n -= 1;
            if *n == 0 {
                pins.remove(&self.instance);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instance_is_held_while_any_pin_on_it_lives() {
        let pins = Pins::default();
        let (a, b) = (pins.pin(1), pins.pin(1));
        let other = pins.pin(2);
        assert_eq!((pins.on(1), pins.on(2), pins.on(3)), (2, 1, 0));
        drop(a);
        assert_eq!(pins.on(1), 1);
        drop((b, other));
        assert_eq!((pins.on(1), pins.on(2)), (0, 0));
        assert!(pins.0.lock().unwrap().is_empty(), "nothing kept for instances no longer held");
    }
}
