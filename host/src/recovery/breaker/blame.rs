//! Whom a breaker's failures are blamed on, and what they say without the client that
//! failed most: on a server many clients share, a breaker counts the failures of all
//! its clients but the one with the most, so that no one client's calls can open it,
//! however many of them fail.

/// Whom a failure is blamed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blame {
    /// The server: every failure of a server that serves one client, and one that proves
    /// the request never reached the server, whoever sent it.
    Server,
    /// One client of the many a server serves, by a key (see the gateway's `blame_of`).
    Client(u64),
}

/// The most clients one tally tells apart. A client past them takes the place of the one
/// with the fewest failures, whose failures then count as the server's: any client with
/// more than a sixteenth of the failures stays told apart, the one that failed most
/// above all.
const MAX_CLIENTS: usize = 16;

/// Failures by whom they are blamed on.
#[derive(Debug, Clone, Default)]
pub(super) struct Failures {
    server: u32,
    clients: Vec<(u64, u32)>,
}

impl Failures {
    pub fn add(&mut self, blame: Blame) {
        self.add_n(blame, 1);
    }

    fn add_n(&mut self, blame: Blame, n: u32) {
        let Blame::Client(key) = blame else {
            self.server += n;
            return;
        };
        if let Some((_, count)) = self.clients.iter_mut().find(|(k, _)| *k == key) {
            *count += n;
        } else if self.clients.len() < MAX_CLIENTS {
            self.clients.push((key, n));
        } else if let Some(fewest) = self.clients.iter_mut().min_by_key(|(_, count)| *count) {
            self.server += fewest.1;
            *fewest = (key, n);
        }
    }

    pub fn total(&self) -> u32 {
        self.server + self.clients.iter().map(|(_, n)| n).sum::<u32>()
    }

    /// The failures of the one client that failed most (none when all are the server's).
    pub fn most_of_one(&self) -> u32 {
        self.clients.iter().map(|(_, n)| *n).max().unwrap_or(0)
    }

    /// The failures but those of the client that failed most: what the others say.
    pub fn of_others(&self) -> u32 {
        self.total() - self.most_of_one()
    }

    /// Whether any of them is blamed on `blame`'s client.
    pub fn blames(&self, blame: Blame) -> bool {
        matches!(blame, Blame::Client(key) if self.clients.iter().any(|(k, _)| *k == key))
    }

    pub fn merge(&mut self, other: &Failures) {
        self.server += other.server;
        for (key, n) in &other.clients {
            self.add_n(Blame::Client(*key), *n);
        }
    }

    pub fn clear(&mut self) {
        self.server = 0;
        self.clients.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_that_failed_most_is_left_out() {
        let mut f = Failures::default();
        for _ in 0..10 {
            f.add(Blame::Client(1));
        }
        assert_eq!((f.total(), f.of_others()), (10, 0));
        f.add(Blame::Client(2));
        f.add(Blame::Server);
        assert_eq!((f.total(), f.most_of_one(), f.of_others()), (12, 10, 2));
        assert!(f.blames(Blame::Client(2)) && !f.blames(Blame::Client(3)) && !f.blames(Blame::Server));
    }

    /// Past the clients it tells apart, the one with the fewest failures makes room: a
    /// client that starts failing after many failed once is still told apart.
    #[test]
    fn past_the_clients_it_tells_apart_the_fewest_failures_are_the_servers() {
        let mut f = Failures::default();
        for key in 0..(MAX_CLIENTS as u64 + 4) {
            f.add(Blame::Client(key));
        }
        assert_eq!((f.total(), f.most_of_one(), f.of_others()), (20, 1, 19));
        for _ in 0..30 {
            f.add(Blame::Client(99));
        }
        assert_eq!((f.total(), f.most_of_one(), f.of_others()), (50, 30, 20));
        let mut sum = Failures::default();
        sum.merge(&f);
        sum.merge(&f);
        assert_eq!((sum.total(), sum.most_of_one()), (100, 60));
    }
}
