//! A per-server retry budget: every call deposits `ratio` of a token, every retry costs a
//! whole one. When a server fails completely, retries stop once the reserve is spent,
//! so an outage never multiplies the load on it; when it fails now and then, there is
//! always budget for the retries that make those calls succeed.

use std::sync::Mutex;

#[derive(Debug)]
pub struct RetryBudget {
    tokens: Mutex<f64>,
    ratio: f64,
    max: f64,
}

impl RetryBudget {
    /// Starts with `reserve` tokens, the most it will ever hold.
    pub fn new(ratio: f64, reserve: u32) -> Self {
        let max = f64::from(reserve.max(1));
        Self { tokens: Mutex::new(max), ratio, max }
    }

    /// A call was made.
    pub fn deposit(&self) {
        let mut t = self.tokens.lock().expect("not poisoned");
        *t = (*t + self.ratio).min(self.max);
    }

    /// Takes the token for one retry, if there is one.
    pub fn withdraw(&self) -> bool {
        let mut t = self.tokens.lock().expect("not poisoned");
        if *t >= 1.0 {
            *t -= 1.0;
            true
        } else {
            false
        }
    }

    pub fn tokens(&self) -> f64 {
        *self.tokens.lock().expect("not poisoned")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_spends_the_reserve_then_retries_stop() {
        let b = RetryBudget::new(0.2, 10);
        let mut retries = 0;
        for _ in 0..1000 {
            b.deposit();
            // Every call fails and wants two retries.
            retries += u32::from(b.withdraw()) + u32::from(b.withdraw());
        }
        // The reserve plus 20% of the calls, never 2× the calls.
        assert!(retries <= 10 + 200, "{retries}");
        assert!(retries >= 200, "{retries}");
    }

    #[test]
    fn occasional_failures_always_find_budget() {
        let b = RetryBudget::new(0.2, 10);
        for i in 0..1000 {
            b.deposit();
            if i % 10 == 0 {
                assert!(b.withdraw(), "call {i}");
            }
        }
    }
}
