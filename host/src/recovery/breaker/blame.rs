//! Whom a breaker's failures are blamed on, and what they say without the client that
//! failed most: on a server many clients share, a breaker counts the failures of all
//! its clients but the one with the most, so that no one client's calls can open it,
//! however many of them fail.
//!
//! A lost connection (a server that crashed, say) fails every call in flight on it at
//! once, whoever made them: it is one failure, blamed on each client that lost a call
//! with it. So a client whose calls crash a shared server opens no breaker through the
//! calls of the others that went down with its own: what the others say is the failures
//! the client that failed most had no part in.

use std::collections::{HashSet, VecDeque};

use super::levels::MAX_CLIENT_BREAKERS;

/// Whom a failure is blamed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blame {
    /// The server: every failure of a server that serves one client, and one that proves
    /// the request never reached the server, whoever sent it.
    Server,
    /// One client of the many a server serves (see the gateway's `blame_of`).
    Client(Culprit),
}

/// A client a failure is blamed on, by two keys: its own, whose breakers shed its calls
/// alone, and the wider one the shared breakers tell clients apart by, which a holder of
/// many own keys (the /64s of one IPv6 site) cannot multiply. The shared breakers leave out
/// the failures of the one that failed most: were they told apart by the own key, two /64s
/// of one site could open a shared breaker for everyone; were the own breakers keyed by the
/// wide one, a site's failing /64 would shed its neighbours' calls too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Culprit {
    /// Whose own breakers its calls go through.
    pub own: u64,
    /// Whom the shared breakers count its failures against.
    pub shared: u64,
}

impl Blame {
    /// One client whose own key is its shared one.
    pub const fn client(key: u64) -> Self {
        Self::Client(Culprit { own: key, shared: key })
    }
}

/// One failure as a breaker counts it: whom it is blamed on, and the connection it was
/// lost with, if it was (the failures of every call that went down with one connection
/// are one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Blamed {
    pub on: Blame,
    /// The lost connection (upstream session) that failed the call.
    pub lost: Option<u64>,
}

impl From<Blame> for Blamed {
    fn from(on: Blame) -> Self {
        Self { on, lost: None }
    }
}

/// The most clients one tally tells apart. A client past them takes the place of the one
/// with the fewest failures, whose part in them is then no one's. Failures of their own
/// keep the client that failed most told apart. Crashes may not: one that takes down the
/// calls of more than 15 other clients with its culprit's can push the culprit out, and
/// then its crashes count as the others' (as every lost call did before crashes were
/// one failure).
const MAX_CLIENTS: usize = 16;

/// The most clients given a part in one lost connection's failure.
const MAX_IN_ONE_LOSS: usize = MAX_CLIENT_BREAKERS;

/// The lost sessions a breaker remembers, the latest last. A breaker's sessions mostly
/// follow one another, but not always (a reload's old instance drains beside its
/// successor): the calls of two crashes may come back interleaved.
pub(super) const RECENT_LOSSES: usize = 4;

/// Remembers `lost` as the latest of the recent losses, forgetting the oldest past
/// [`RECENT_LOSSES`].
pub(super) fn remember<T>(recent: &mut VecDeque<T>, lost: T) {
    if recent.len() == RECENT_LOSSES {
        recent.pop_front();
    }
    recent.push_back(lost);
}

/// Failures by whom they are blamed on.
#[derive(Debug, Clone, Default)]
pub(super) struct Failures {
    /// Every failure, a lost connection's once.
    total: u32,
    /// The failures each client had a part in; none more than `total`.
    clients: Vec<(u64, u32)>,
    /// The sessions whose loss was counted here last ([`RECENT_LOSSES`]), and the clients
    /// given a part in each.
    losses: VecDeque<(u64, HashSet<u64>)>,
}

impl Failures {
    /// Counts a new failure.
    pub fn add(&mut self, failure: impl Into<Blamed>) {
        let Blamed { on, lost } = failure.into();
        self.total += 1;
        let key = match on {
            Blame::Client(culprit) => Some(culprit.shared),
            Blame::Server => None,
        };
        if let Some(key) = key {
            self.count(key, 1);
        }
        if let Some(id) = lost {
            remember(&mut self.losses, (id, key.into_iter().collect()));
        }
    }

    /// Gives the client of a failure lost with a session whose loss was counted here (one
    /// of the last few) a part in that failure, once; the total does not grow. A failure
    /// lost with another session, or blamed on the server, changes nothing.
    pub fn join(&mut self, failure: Blamed) {
        let Blamed { on: Blame::Client(Culprit { shared: key, .. }), lost: Some(id) } = failure else {
            return;
        };
        let Some((_, with)) = self.losses.iter_mut().find(|(lost, _)| *lost == id) else {
            return;
        };
        if with.len() < MAX_IN_ONE_LOSS && with.insert(key) {
            self.count(key, 1);
        }
    }

    /// Adds `n` to the failures `key` had a part in. Past the clients told apart, the one
    /// with the fewest makes room: its failures stay in the total, as no one's.
    fn count(&mut self, key: u64, n: u32) {
        if let Some((_, count)) = self.clients.iter_mut().find(|(k, _)| *k == key) {
            *count += n;
        } else if self.clients.len() < MAX_CLIENTS {
            self.clients.push((key, n));
        } else if let Some(fewest) = self.clients.iter_mut().min_by_key(|(_, count)| *count) {
            *fewest = (key, n);
        }
    }

    pub fn total(&self) -> u32 {
        self.total
    }

    /// The failures of the one client that failed most (none when all are the server's).
    pub fn most_of_one(&self) -> u32 {
        self.clients.iter().map(|(_, n)| *n).max().unwrap_or(0)
    }

    /// The failures the client that failed most had no part in: what the others say.
    pub fn of_others(&self) -> u32 {
        self.total.saturating_sub(self.most_of_one())
    }

    /// Whether any of them is blamed on `blame`'s client.
    pub fn blames(&self, blame: Blame) -> bool {
        matches!(blame, Blame::Client(c) if self.clients.iter().any(|(k, _)| *k == c.shared))
    }

    pub fn merge(&mut self, other: &Failures) {
        self.total += other.total;
        for (key, n) in &other.clients {
            self.count(*key, *n);
        }
    }

    pub fn clear(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_that_failed_most_is_left_out() {
        let mut f = Failures::default();
        for _ in 0..10 {
            f.add(Blame::client(1));
        }
        assert_eq!((f.total(), f.of_others()), (10, 0));
        f.add(Blame::client(2));
        f.add(Blame::Server);
        assert_eq!((f.total(), f.most_of_one(), f.of_others()), (12, 10, 2));
        assert!(f.blames(Blame::client(2)) && !f.blames(Blame::client(3)) && !f.blames(Blame::Server));
    }

    /// The calls one lost connection took down are one failure, which each of their
    /// clients had a part in: a client in every crash is the one that failed most, and
    /// the others' calls that went down with its own say nothing without it.
    #[test]
    fn the_calls_lost_with_one_connection_are_one_failure() {
        let lost = |on, id| Blamed { on, lost: Some(id) };
        let mut f = Failures::default();
        for crash in 0..5 {
            f.add(lost(Blame::client(1), crash));
            f.join(lost(Blame::client(2), crash));
            f.join(lost(Blame::client(2), crash));
            f.join(lost(Blame::client(3 + crash % 2), crash));
            f.join(lost(Blame::client(9), crash + 1));
        }
        assert_eq!((f.total(), f.most_of_one(), f.of_others()), (5, 5, 0), "{f:?}");
        // A crash clients 1 and 2 had no part in is what the others say; so is a failure
        // of another kind, and one lost with no connection named (one request's own).
        f.add(lost(Blame::client(3), 9));
        f.join(lost(Blame::client(4), 9));
        assert_eq!((f.total(), f.most_of_one(), f.of_others()), (6, 5, 1), "{f:?}");
        f.add(Blame::client(3));
        f.add(Blamed { on: Blame::client(4), lost: None });
        assert_eq!((f.total(), f.most_of_one(), f.of_others()), (8, 5, 3), "{f:?}");
        // Two crashes whose calls come back interleaved are one failure each.
        let mut f = Failures::default();
        for (client, crash) in [(1, 10), (2, 20), (3, 10), (3, 20), (4, 10)] {
            match f.losses.iter().any(|(id, _)| *id == crash) {
                true => f.join(lost(Blame::client(client), crash)),
                false => f.add(lost(Blame::client(client), crash)),
            }
        }
        assert_eq!((f.total(), f.most_of_one(), f.of_others()), (2, 2, 0), "client 3 was in both: {f:?}");
        // The server's failures lost with one connection are one too.
        let mut f = Failures::default();
        f.add(lost(Blame::Server, 7));
        f.join(lost(Blame::Server, 7));
        assert_eq!((f.total(), f.of_others()), (1, 1));
    }

    /// Past the clients it tells apart, the one with the fewest failures makes room: a
    /// client that starts failing after many failed once is still told apart.
    #[test]
    fn past_the_clients_it_tells_apart_the_fewest_failures_are_the_servers() {
        let mut f = Failures::default();
        for key in 0..(MAX_CLIENTS as u64 + 4) {
            f.add(Blame::client(key));
        }
        assert_eq!((f.total(), f.most_of_one(), f.of_others()), (20, 1, 19));
        for _ in 0..30 {
            f.add(Blame::client(99));
        }
        assert_eq!((f.total(), f.most_of_one(), f.of_others()), (50, 30, 20));
        let mut sum = Failures::default();
        sum.merge(&f);
        sum.merge(&f);
        assert_eq!((sum.total(), sum.most_of_one()), (100, 60));
    }
}
