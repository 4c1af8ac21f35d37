//! What each owner holds (live and pending workers, bytes of requests),
//! kept as workers come, are placed and go: the quotas read it on every
//! submit (tests/engine.rs checks it against a count after random steps).

use super::Node;
use crate::access::Holding;

impl Node {
    /// What one user holds, for its quotas.
    pub fn held_by(&self, uid: u32) -> Holding {
        self.per_owner.get(&uid).copied().unwrap_or_default()
    }

    /// Counts a worker of `uid` in (+1) or out (-1) of its live and pending
    /// tallies, and its request's bytes in (+) or out (-).
    pub(super) fn tally(&mut self, uid: u32, live: i8, pending: i8, bytes: isize) {
        let t = self.per_owner.entry(uid).or_default();
        t.live = t.live.saturating_add_signed(live.into());
        t.pending = t.pending.saturating_add_signed(pending.into());
        t.request_bytes = t.request_bytes.saturating_add_signed(bytes);
        if *t == Holding::default() {
            self.per_owner.remove(&uid);
        }
    }
}
