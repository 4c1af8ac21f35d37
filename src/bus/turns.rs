//! Turns at a costly read (listings, reports), given round the users who
//! wait for one: each user's calls queue behind each other, and the next
//! turn goes to the user who has waited longest since their last. A user
//! keeping dozens of year-long reports in flight delays another user's one
//! report by at most the turn running now, not by all of theirs
//! (docs/security.md, "Limits").

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

/// Who waits for a turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Who {
    /// A bus caller, by the uid the bus daemon vouches for.
    Uid(u32),
    /// The machine page, by the client's address (anonymous; its
    /// requests are bounded on their own): each address is a user of its
    /// own, so one address's flood waits behind itself, not others.
    Page(std::net::IpAddr),
}

/// At most this many calls of one user wait for a turn; more are refused
/// at once (a bound on what one user can make the daemon keep).
pub const WAITING_PER_USER: usize = 16;

/// Turns at one costly read, `at_once` at a time.
pub struct FairTurns {
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    free: usize,
    /// Users with calls waiting, in the order their next call gets a turn.
    rotation: VecDeque<Who>,
    waiting: HashMap<Who, VecDeque<oneshot::Sender<()>>>,
}

/// A turn, given on to the next user in the rotation when dropped.
pub struct Turn {
    state: Arc<Mutex<State>>,
}

/// A call of a user with [`WAITING_PER_USER`] calls waiting already.
#[derive(Debug, PartialEq, Eq)]
pub struct TooMany;

impl FairTurns {
    pub fn new(at_once: usize) -> FairTurns {
        FairTurns {
            state: Arc::new(Mutex::new(State {
                free: at_once,
                ..State::default()
            })),
        }
    }

    /// A turn at once, when one is free and no one waits: who asks does
    /// not matter then (and need not be learnt).
    pub fn try_take(&self) -> Option<Turn> {
        self.free_turn(&mut lock(&self.state))
    }

    /// A free turn when no one waits, taken under the lock held as `s`.
    fn free_turn(&self, s: &mut State) -> Option<Turn> {
        if s.free > 0 && s.rotation.is_empty() {
            s.free -= 1;
            return Some(Turn {
                state: self.state.clone(),
            });
        }
        None
    }

    /// Waits for `who`'s turn.
    pub async fn take(&self, who: Who) -> Result<Turn, TooMany> {
        loop {
            let rx = {
                let mut s = lock(&self.state);
                // Free now (checked under the same lock as the queueing:
                // a turn given back between the two would wake no one).
                if let Some(turn) = self.free_turn(&mut s) {
                    return Ok(turn);
                }
                // A user is in the rotation while it has an entry here.
                let fresh = !s.waiting.contains_key(&who);
                let queue = s.waiting.entry(who).or_default();
                // Callers that left count no more.
                queue.retain(|tx| !tx.is_closed());
                if queue.len() >= WAITING_PER_USER {
                    return Err(TooMany);
                }
                let (tx, rx) = oneshot::channel();
                queue.push_back(tx);
                if fresh {
                    s.rotation.push_back(who);
                }
                rx
            };
            let mut waiting = Waiting {
                rx,
                state: Some(self.state.clone()),
            };
            // A sender is dropped unsent only by a panic in `give_on`:
            // then wait again rather than make a turn from nothing.
            if (&mut waiting.rx).await.is_ok() {
                return Ok(Turn {
                    state: waiting.state.take().expect("taken once"),
                });
            }
        }
    }
}

/// A call waiting for its turn. Dropped (its caller gone) after the turn
/// was given to it, it gives the turn on.
struct Waiting {
    rx: oneshot::Receiver<()>,
    state: Option<Arc<Mutex<State>>>,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(state) = self.state.take() {
            self.rx.close();
            if self.rx.try_recv().is_ok() {
                give_on(&state);
            }
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        give_on(&self.state);
    }
}

/// Gives a turn that ended to the next user in the rotation (its callers
/// that left are skipped, and the user keeps its place for the next), or
/// frees it.
fn give_on(state: &Mutex<State>) {
    let mut s = lock(state);
    while let Some(who) = s.rotation.pop_front() {
        let Some(queue) = s.waiting.get_mut(&who) else {
            continue;
        };
        let mut given = false;
        while let Some(tx) = queue.pop_front() {
            if tx.send(()).is_ok() {
                given = true;
                break;
            }
        }
        if queue.is_empty() {
            s.waiting.remove(&who);
        } else {
            s.rotation.push_back(who);
        }
        if given {
            return;
        }
    }
    s.free += 1;
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOCAL: std::net::IpAddr = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
    use std::time::Duration;

    /// The order in which the calls below get their turns, each call
    /// named by (who, its number among that user's calls).
    async fn order(turns: Arc<FairTurns>, calls: &[(Who, u32)]) -> Vec<(Who, u32)> {
        let done = Arc::new(Mutex::new(Vec::new()));
        let first = turns.take(Who::Page(LOCAL)).await.unwrap();
        let mut tasks = Vec::new();
        for &(who, n) in calls {
            let (turns, done) = (turns.clone(), done.clone());
            tasks.push(tokio::spawn(async move {
                let _turn = turns.take(who).await.unwrap();
                done.lock().unwrap().push((who, n));
                tokio::time::sleep(Duration::from_millis(5)).await;
            }));
            // Queued in the order listed.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        drop(first);
        for t in tasks {
            t.await.unwrap();
        }
        let got = done.lock().unwrap().clone();
        got
    }

    #[tokio::test]
    async fn a_user_with_many_calls_waiting_takes_turns_with_the_others() {
        let (a, b, c) = (Who::Uid(1), Who::Uid(2), Who::Uid(3));
        let calls = [(a, 1), (a, 2), (a, 3), (a, 4), (b, 1), (c, 1), (b, 2)];
        let got = order(Arc::new(FairTurns::new(1)), &calls).await;
        // Round the users in the order they came: a, b, c, then again.
        assert_eq!(
            got,
            vec![(a, 1), (b, 1), (c, 1), (a, 2), (b, 2), (a, 3), (a, 4)]
        );
    }

    #[tokio::test]
    async fn a_caller_that_leaves_gives_its_turn_on() {
        let turns = Arc::new(FairTurns::new(1));
        let running = turns.take(Who::Uid(1)).await.unwrap();
        // One leaves while waiting; one is given the turn but leaves
        // before it runs (its future dropped): neither keeps it.
        let left = tokio::spawn({
            let t = turns.clone();
            async move { t.take(Who::Uid(2)).await.map(drop) }
        });
        tokio::time::sleep(Duration::from_millis(5)).await;
        left.abort();
        assert!(left.await.unwrap_err().is_cancelled());
        let mut granted = Box::pin(turns.take(Who::Uid(3)));
        assert!(futures_poll(&mut granted).is_none(), "a turn is taken");
        drop(running);
        drop(granted);
        // The turn is free again: taken at once.
        let t = tokio::time::timeout(Duration::from_secs(5), turns.take(Who::Uid(4))).await;
        assert!(matches!(t, Ok(Ok(_))), "the turn was lost");
        assert_eq!(lock(&turns.state).free, 0);
    }

    #[tokio::test]
    async fn callers_that_left_neither_count_nor_cost_their_user_a_round() {
        let turns = Arc::new(FairTurns::new(1));
        let running = turns.take(Who::Uid(9)).await.unwrap();
        // The page: as many requests as it may keep waiting, all gone.
        for _ in 0..WAITING_PER_USER {
            let mut left = Box::pin(turns.take(Who::Page(LOCAL)));
            assert!(futures_poll(&mut left).is_none());
        }
        // They neither fill the page's share...
        let mut page = Box::pin(turns.take(Who::Page(LOCAL)));
        assert!(
            futures_poll(&mut page).is_none(),
            "refused for callers gone"
        );
        // ...nor lose it its place: a user who came after it, and one of
        // its requests that leaves while queued before the page's next.
        let mut other = Box::pin(turns.take(Who::Uid(2)));
        assert!(futures_poll(&mut other).is_none());
        let mut next = Box::pin(turns.take(Who::Page(LOCAL)));
        assert!(futures_poll(&mut next).is_none());
        drop(page);
        drop(running);
        let page_turn = futures_poll(&mut next);
        assert!(matches!(page_turn, Some(Ok(_))), "the page is next");
        assert!(futures_poll(&mut other).is_none());
        drop(page_turn);
        assert!(matches!(futures_poll(&mut other), Some(Ok(_))));
    }

    #[tokio::test]
    async fn a_user_may_keep_only_so_many_calls_waiting() {
        let turns = Arc::new(FairTurns::new(1));
        let _running = turns.take(Who::Uid(1)).await.unwrap();
        let mut waiting = Vec::new();
        for _ in 0..WAITING_PER_USER {
            let t = turns.clone();
            waiting.push(tokio::spawn(
                async move { t.take(Who::Uid(1)).await.map(drop) },
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(turns.take(Who::Uid(1)).await.err(), Some(TooMany));
        // Another user still queues.
        let mut other = Box::pin(turns.take(Who::Uid(2)));
        assert!(futures_poll(&mut other).is_none());
    }

    /// Turns taken and given back from many threads at once: none is lost
    /// (every caller gets one) and never two are held. A turn given back
    /// between a caller's look and its queueing once woke no one: every
    /// later caller queued behind it for ever.
    #[test]
    fn turns_taken_from_many_threads_are_neither_lost_nor_doubled() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_all()
            .build()
            .unwrap();
        let turns = Arc::new(FairTurns::new(1));
        let held = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let done = rt.block_on(async {
            let mut tasks = Vec::new();
            for t in 0..8u32 {
                let (turns, held) = (turns.clone(), held.clone());
                tasks.push(tokio::spawn(async move {
                    for i in 0..20_000u32 {
                        let turn = turns.take(Who::Uid((t + i) % 3)).await.unwrap();
                        let now = held.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        assert_eq!(now, 0, "two turns held at once");
                        held.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                        drop(turn);
                        if i % 64 == 0 {
                            tokio::task::yield_now().await;
                        }
                    }
                }));
            }
            tokio::time::timeout(Duration::from_secs(60), async {
                for t in tasks {
                    t.await.unwrap();
                }
            })
            .await
        });
        assert!(done.is_ok(), "a turn was lost: callers wait for ever");
        assert_eq!(lock(&turns.state).free, 1);
    }

    /// Polls a future once.
    fn futures_poll<F: std::future::Future + Unpin>(f: &mut F) -> Option<F::Output> {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        match std::pin::Pin::new(f).poll(&mut cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        }
    }
}
