//! The ledger's history kept bounded (store/retention.rs): what ended
//! before a cutoff is forgotten in batches, the file shrinks.

use super::Node;
use crate::error::Result;
use crate::store::Forgotten;
use crate::time::EpochMs;

impl Node {
    /// One batch: at most `limit` rows of each kind that ended before
    /// `cutoff`. This run's record is kept whatever its age.
    pub fn forget_ended(&mut self, cutoff: EpochMs, limit: usize) -> Result<Forgotten> {
        let run = self.run;
        self.store.forget_before(cutoff.as_i64(), limit, run)
    }

    /// New submits are refused below `bytes` free on the ledger's disk.
    pub fn set_min_free(&mut self, bytes: u64) {
        self.store.set_min_free(bytes);
    }

    /// Gives up to `pages` free pages of the ledger back; how many are left.
    pub fn shrink_ledger(&mut self, pages: u32) -> Result<u64> {
        self.store.shrink(pages)
    }

    /// Rolls up the next closed UTC day of one GPU's usage when one is
    /// due: ended a day before `now`, and counted into the metrics (a count's window
    /// must never reach into a rolled-up day, which reports see whole).
    /// How many intervals were folded, or None when no day is due.
    pub fn roll_up_next(&mut self, now: EpochMs) -> Result<Option<usize>> {
        let Some(counted) = self.store.counting_from()? else {
            return Ok(None);
        };
        let until = counted.min(now.as_i64().saturating_sub(crate::report::DAY_MS));
        let (current, gpus) = self.report_facts(now.as_i64(), Vec::new());
        let Some((day, i)) = self.store.next_to_roll(until, &gpus)? else {
            return Ok(None);
        };
        Ok(Some(self.store.roll_up_day(day, &gpus[i], current)?))
    }
}
