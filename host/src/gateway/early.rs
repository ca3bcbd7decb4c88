//! Progress that came before its call was mapped (a server may report before the send
//! returns here), kept a moment for that call: per upstream session and per token, so
//! that progress nobody will ask for (a task's, when its client gave no token; a server's
//! noise) cannot push out another call's.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use rmcp::model::{ProgressNotificationParam, ProgressToken};
use tokio::time::Instant;

/// How long progress is kept for a call about to be mapped.
const KEPT: Duration = Duration::from_secs(2);
/// The most kept for one token, for one upstream session, and in all.
const PER_TOKEN: usize = 8;
const PER_SESSION: usize = 64;
const MAX: usize = 1024;

/// Early progress, by upstream session, oldest first.
#[derive(Default)]
pub struct Early {
    by_session: HashMap<u64, VecDeque<(Instant, ProgressNotificationParam)>>,
    kept: usize,
}

impl Early {
    /// Keeps `p` from upstream `session` a moment. Past a bound, the oldest of its token
    /// (or of its session) makes room; with everything full of what is still fresh, `p`
    /// is dropped.
    pub fn keep(&mut self, session: u64, p: ProgressNotificationParam) {
        let now = Instant::now();
        if self.kept >= MAX {
            self.forget_before(now);
        }
        let queue = self.by_session.entry(session).or_default();
        let before = queue.len();
        queue.retain(|(t, _)| now.duration_since(*t) <= KEPT);
        let of_token = queue.iter().filter(|(_, q)| q.progress_token == p.progress_token).count();
        if of_token >= PER_TOKEN {
            let oldest = queue.iter().position(|(_, q)| q.progress_token == p.progress_token);
            queue.remove(oldest.unwrap_or_default());
        } else if queue.len() >= PER_SESSION {
            queue.pop_front();
        } else if self.kept - (before - queue.len()) >= MAX {
            self.kept -= before - queue.len();
            if queue.is_empty() {
                self.by_session.remove(&session);
            }
            return;
        }
        queue.push_back((now, p));
        self.kept = self.kept - before + queue.len();
    }

    /// The progress kept for `token` of upstream `session`, in the order it came.
    pub fn take(&mut self, session: u64, token: &ProgressToken) -> Vec<ProgressNotificationParam> {
        let Some(queue) = self.by_session.get_mut(&session) else { return Vec::new() };
        let mut taken = Vec::new();
        queue.retain(|(_, p)| {
            let ours = p.progress_token == *token;
            if ours {
                taken.push(p.clone());
            }
            !ours
        });
        self.kept -= taken.len();
        if queue.is_empty() {
            self.by_session.remove(&session);
        }
        taken
    }

    /// Forgets everything kept longer than [`KEPT`] before `now`.
    fn forget_before(&mut self, now: Instant) {
        self.by_session.retain(|_, queue| {
            queue.retain(|(t, _)| now.duration_since(*t) <= KEPT);
            !queue.is_empty()
        });
        self.kept = self.by_session.values().map(VecDeque::len).sum();
    }
}

#[cfg(test)]
mod tests {
    use rmcp::model::NumberOrString;

    use super::*;

    fn token(name: &str) -> ProgressToken {
        ProgressToken(NumberOrString::String(name.into()))
    }

    fn progress(name: &str, n: u32) -> ProgressNotificationParam {
        ProgressNotificationParam::new(token(name), f64::from(n))
    }

    fn kept(early: &Early) -> usize {
        early.by_session.values().map(VecDeque::len).sum()
    }

    #[tokio::test(start_paused = true)]
    async fn a_token_flooding_progress_nobody_asked_for_does_not_push_out_another_calls() {
        let mut early = Early::default();
        early.keep(1, progress("mine", 1));
        early.keep(2, progress("theirs", 1));
        for n in 0..10_000 {
            early.keep(1, progress("noise", n));
        }
        assert_eq!(kept(&early), early.kept);
        // The flood's newest are kept, as many as one token may have.
        let noise: Vec<f64> = early.take(1, &token("noise")).iter().map(|p| p.progress).collect();
        assert_eq!(noise, (9_992..10_000).map(f64::from).collect::<Vec<_>>());
        assert_eq!(early.take(1, &token("mine")).len(), 1, "the same session's other call kept its progress");
        assert_eq!(early.take(2, &token("theirs")).len(), 1, "another session's progress was pushed out");
        assert_eq!(early.kept, 0);
        assert!(early.by_session.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn many_tokens_of_one_session_stay_within_its_share_and_everything_within_the_bound() {
        let mut early = Early::default();
        early.keep(7, progress("other session", 1));
        for n in 0..10_000 {
            early.keep(1, progress(&format!("t{n}"), n));
        }
        assert_eq!(early.by_session[&1].len(), PER_SESSION);
        for session in 100..200 {
            for n in 0..PER_SESSION as u32 {
                early.keep(session, progress(&format!("t{n}"), n));
            }
        }
        assert_eq!(kept(&early), early.kept);
        assert!(early.kept <= MAX, "{}", early.kept);
        // Full of fresh progress, the gateway drops the newest, not another session's.
        assert_eq!(early.take(7, &token("other session")).len(), 1);
        assert!(!early.by_session.contains_key(&199), "no empty queue is left behind");
    }

    #[tokio::test(start_paused = true)]
    async fn progress_is_kept_a_moment_only() {
        let mut early = Early::default();
        early.keep(1, progress("late", 1));
        tokio::time::sleep(KEPT + Duration::from_millis(1)).await;
        early.keep(1, progress("fresh", 1));
        assert!(early.take(1, &token("late")).is_empty());
        assert_eq!(early.take(1, &token("fresh")).len(), 1);
        assert_eq!(early.kept, 0);
    }
}
