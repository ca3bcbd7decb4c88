//! A per-server retry budget: every call deposits `ratio` of a token, every retry costs a
//! whole one. When a server fails completely, retries stop once the reserve is spent,
//! so an outage never multiplies the load on it; when it fails now and then, there is
//! always budget for the retries that make those calls succeed.
//!
//! On a server many clients share, a retry also costs the client a token of its own
//! ([`Budgets`]): a client's budget starts at half the reserve and grows with its calls,
//! so one client whose calls keep failing spends its own deposits and half a reserve of
//! the server's, and leaves the rest to the others. A client here is the one the shared
//! breakers count ([`Culprit::shared`]): the /64s of an IPv6 site share one budget, so
//! that two of them cannot spend the whole reserve.

use std::collections::HashMap;
use std::sync::Mutex;

use super::breaker::{Blame, Culprit};
use crate::lasting::Locked;

/// The most clients of one server with a budget of their own; past it, full ones make
/// room, and a client that finds none retries on the server's budget alone.
pub const MAX_CLIENT_BUDGETS: usize = 4096;

/// Whose retry budget is spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spent {
    Server,
    /// The client's own: its calls failed too often recently, whatever the others' did.
    Client,
}

impl std::fmt::Display for Spent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Server => "the server's retry budget is spent (too many failures recently)",
            Self::Client => {
                "this client's retry budget for the server is spent (too many of its calls failed recently)"
            }
        })
    }
}

/// A server's retry budget, and each retrying client's own when many share the server.
#[derive(Debug)]
pub struct Budgets {
    server: RetryBudget,
    /// Tokens by client, made on its first retry.
    clients: Mutex<HashMap<u64, f64>>,
    /// Whether `clients` has any: until one retries, a call's deposit takes no lock more.
    any_client: std::sync::atomic::AtomicBool,
}

impl Budgets {
    pub fn new(ratio: f64, reserve: u32) -> Self {
        Self { server: RetryBudget::new(ratio, reserve), clients: Mutex::default(), any_client: Default::default() }
    }

    /// The most a client's own budget holds, and what it starts with.
    fn own_max(&self) -> f64 {
        (self.server.max / 2.0).max(1.0)
    }

    /// A call was made, by `blame`'s client if many share the server.
    pub fn deposit(&self, blame: Blame) {
        self.server.deposit();
        if let Blame::Client(Culprit { shared: client, .. }) = blame
            && self.any_client.load(std::sync::atomic::Ordering::Relaxed)
        {
            let own_max = self.own_max();
            if let Some(tokens) = self.clients.locked().get_mut(&client) {
                *tokens = (*tokens + self.server.ratio).min(own_max);
            }
        }
    }

    /// Takes the tokens for one retry of `blame`'s call, if there are: the server's, and
    /// the client's own when many share the server. Else says whose budget is spent.
    pub fn withdraw(&self, blame: Blame) -> Result<(), Spent> {
        let server = || if self.server.withdraw() { Ok(()) } else { Err(Spent::Server) };
        let Blame::Client(Culprit { shared: client, .. }) = blame else { return server() };
        let own_max = self.own_max();
        let mut clients = self.clients.locked();
        if !clients.contains_key(&client) && clients.len() >= MAX_CLIENT_BUDGETS {
            clients.retain(|_, tokens| *tokens < own_max);
        }
        if !clients.contains_key(&client) && clients.len() >= MAX_CLIENT_BUDGETS {
            return server();
        }
        self.any_client.store(true, std::sync::atomic::Ordering::Relaxed);
        let own = clients.entry(client).or_insert(own_max);
        if *own < 1.0 {
            return Err(Spent::Client);
        }
        server()?;
        *own -= 1.0;
        Ok(())
    }

    /// The server's tokens.
    pub fn tokens(&self) -> f64 {
        self.server.tokens()
    }
}

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
        let mut t = self.tokens.locked();
        *t = (*t + self.ratio).min(self.max);
    }

    /// Takes the token for one retry, if there is one.
    pub fn withdraw(&self) -> bool {
        let mut t = self.tokens.locked();
        if *t >= 1.0 {
            *t -= 1.0;
            true
        } else {
            false
        }
    }

    pub fn tokens(&self) -> f64 {
        *self.tokens.locked()
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

    /// One client whose calls keep failing spends its own budget and half the reserve of
    /// the server's: another client's occasional failures still find budget.
    #[test]
    fn one_failing_client_leaves_the_others_their_retries() {
        let b = Budgets::new(0.2, 10);
        let (failing, other) = (Blame::client(1), Blame::client(2));
        let mut retries = 0;
        for i in 0..1000 {
            b.deposit(failing);
            retries += u32::from(b.withdraw(failing).is_ok()) + u32::from(b.withdraw(failing).is_ok());
            b.deposit(other);
            if i % 10 == 0 {
                assert_eq!(b.withdraw(other), Ok(()), "call {i}");
            }
        }
        assert!(retries <= 5 + 200, "{retries}");
        assert_eq!(b.withdraw(failing), Err(Spent::Client));
        // Over stdio, the server's budget alone, as ever.
        let b = Budgets::new(0.2, 10);
        assert_eq!((0..20).filter(|_| b.withdraw(Blame::Server).is_ok()).count(), 10);
        assert_eq!(b.withdraw(Blame::Server), Err(Spent::Server));
    }

    /// Two /64s of one IPv6 site spend one client's budget between them, not two.
    #[test]
    fn the_clients_of_one_site_share_one_budget() {
        let b = Budgets::new(0.2, 10);
        let of_site = |own| Blame::Client(Culprit { own, shared: 7 });
        let spent = (0..20).filter(|i| b.withdraw(of_site(i % 2)).is_ok()).count();
        assert_eq!(spent, 5, "half the reserve, for the site");
        assert_eq!(b.withdraw(Blame::client(8)), Ok(()), "another client still retries");
    }

    /// At most [`MAX_CLIENT_BUDGETS`] clients have a budget of their own: past it, a full
    /// one (its calls have topped it up since it last retried) makes room, and while none
    /// is full a new client retries on the server's budget alone.
    #[test]
    fn client_budgets_are_bounded_and_full_ones_make_room() {
        let b = Budgets::new(1.0, 100_000);
        for client in 0..MAX_CLIENT_BUDGETS as u64 {
            assert_eq!(b.withdraw(Blame::client(client)), Ok(()));
        }
        let newcomer = Blame::client(u64::MAX);
        assert_eq!(b.withdraw(newcomer), Ok(()), "on the server's budget alone");
        assert!(!b.clients.lock().unwrap().contains_key(&u64::MAX), "no budget of its own");
        b.deposit(Blame::client(0));
        assert_eq!(b.withdraw(newcomer), Ok(()));
        let clients = b.clients.lock().unwrap();
        assert!(clients.contains_key(&u64::MAX) && !clients.contains_key(&0), "client 0, full, made room");
        assert_eq!(clients.len(), MAX_CLIENT_BUDGETS);
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
