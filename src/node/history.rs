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
}
