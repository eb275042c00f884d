//! The bounded pool in which requests are prepared — a transport's parsing of the body, the
//! chat template's rendering, tokenising — after admission has reserved their place and
//! before they are queued (issue 35 point 2).
//!
//! Preparing a request costs memory in proportion to its body (a JSON tree, a conversation,
//! its text and ids) and CPU in proportion to its length. Done by every request at once, four
//! 8 MiB bodies of tiny messages took a daemon from 20 MiB to 1.58 GiB; here at most
//! [`PREP_TURNS`] are prepared at once, so that memory is bounded by a few bodies whatever
//! arrives. Waiting for a turn costs a blocked thread and nothing else, and admission bounds
//! how many wait (each holds a reserved place in the queue).
//!
//! Turns are fair across accounts (uids, API keys: [`Caller::account`]) the way the queue is:
//! one account holds at most all turns but one, and when a turn frees it goes to the waiter
//! whose account holds the fewest turns now, the earliest of those first. One user's flood of
//! large bodies therefore never delays another user's request (a turn is always left for it),
//! and is itself prepared one body at a time (issue 35's second attack: four 8 MiB bodies at
//! once).

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use super::caller::Caller;

/// Requests prepared at once. Two: one account's large body never makes another's small one
/// wait behind it (an account holds at most one of them), and the memory held is that of two
/// bodies at most.
pub const PREP_TURNS: usize = 2;

#[derive(Default)]
struct State {
    /// Turns held now, by account.
    held: HashMap<Caller, usize>,
    /// Waiters in arrival order: (ticket, account).
    waiting: Vec<(u64, Caller)>,
    next_ticket: u64,
}

impl State {
    fn in_use(&self) -> usize {
        self.held.values().sum()
    }

    fn held_by(&self, account: &Caller) -> usize {
        self.held.get(account).copied().unwrap_or(0)
    }

    /// The waiter the next free turn goes to: among those whose account holds fewer than
    /// `per_account`, the fewest turns held by its account, then the earliest.
    fn next(&self, per_account: usize) -> Option<u64> {
        self.waiting
            .iter()
            .filter(|(_, account)| self.held_by(account) < per_account)
            .min_by_key(|(ticket, account)| (self.held_by(account), *ticket))
            .map(|(ticket, _)| *ticket)
    }
}

pub(crate) struct PrepPool {
    state: Mutex<State>,
    freed: Condvar,
    turns: usize,
    /// Turns one account may hold at once: all but one (at least one).
    per_account: usize,
}

/// A turn in the pool, given back when dropped.
pub struct PrepTurn {
    pool: Arc<PrepPool>,
    account: Caller,
}

impl PrepPool {
    pub fn new(turns: usize) -> Arc<PrepPool> {
        Arc::new(PrepPool {
            state: Mutex::new(State::default()),
            freed: Condvar::new(),
            turns: turns.max(1),
            per_account: turns.saturating_sub(1).max(1),
        })
    }

    /// The bookkeeping never panics while holding the lock; a poisoned state is consistent.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits (blocking the calling thread) until a turn is free and it is `account`'s.
    pub fn enter(self: &Arc<PrepPool>, account: Caller) -> PrepTurn {
        let mut st = self.lock();
        let ticket = st.next_ticket;
        st.next_ticket += 1;
        st.waiting.push((ticket, account.clone()));
        while st.in_use() >= self.turns || st.next(self.per_account) != Some(ticket) {
            st = self.freed.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        st.waiting.retain(|(t, _)| *t != ticket);
        *st.held.entry(account.clone()).or_default() += 1;
        drop(st);
        // Another turn may be free too (several left at once): its waiter must look again.
        self.freed.notify_all();
        PrepTurn {
            pool: Arc::clone(self),
            account,
        }
    }
}

impl Drop for PrepTurn {
    fn drop(&mut self) {
        let mut st = self.pool.lock();
        if let Some(held) = st.held.get_mut(&self.account) {
            *held -= 1;
            if *held == 0 {
                st.held.remove(&self.account);
            }
        }
        drop(st);
        self.pool.freed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// Starts a thread that waits for a turn of `caller`'s account, reports `name` when it
    /// has one, and holds it until told to let go.
    fn waiter(
        pool: &Arc<PrepPool>,
        caller: Caller,
        name: &'static str,
        got: &mpsc::Sender<&'static str>,
    ) -> mpsc::Sender<()> {
        let (release, hold) = mpsc::channel::<()>();
        let (pool, got) = (Arc::clone(pool), got.clone());
        std::thread::spawn(move || {
            let _turn = pool.enter(caller.account());
            got.send(name).expect("report");
            let _ = hold.recv();
        });
        release
    }

    /// Waits until `n` threads wait for a turn.
    fn until_waiting(pool: &PrepPool, n: usize) {
        while pool.lock().waiting.len() != n {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// One account holds one of the two turns, so another account's request is prepared at
    /// once beside its flood; a freed turn goes to the waiter whose account holds the fewest.
    /// Accounts here are API keys (issue 35 point 5: each key has its own turn): the names one
    /// key's callers give themselves do not make them more than the one key.
    #[test]
    fn a_newcomer_is_prepared_at_once_beside_a_flooding_users_requests() {
        let pool = PrepPool::new(2);
        let (got, report) = mpsc::channel();
        let key = |key, scope: &str| Caller::Key {
            key,
            scope: Some(scope.into()),
        };
        let a1 = waiter(&pool, key(0, "one"), "a1", &got);
        assert_eq!(report.recv().expect("turn"), "a1");
        let a2 = waiter(&pool, key(0, "two"), "a2", &got);
        until_waiting(&pool, 1);
        assert!(
            report.recv_timeout(Duration::from_millis(50)).is_err(),
            "one account holds one turn of two"
        );
        let b = waiter(&pool, key(1, "one"), "b", &got);
        assert_eq!(report.recv().expect("turn"), "b", "the newcomer at once");
        let c = waiter(&pool, Caller::Uid(7), "c", &got);
        until_waiting(&pool, 2);
        assert!(
            report.recv_timeout(Duration::from_millis(50)).is_err(),
            "no third turn while two are held"
        );
        drop(a1);
        assert_eq!(
            report.recv().expect("turn"),
            "a2",
            "the earliest of the idle accounts"
        );
        drop(b);
        assert_eq!(report.recv().expect("turn"), "c");
        drop((a2, c));
    }
}
