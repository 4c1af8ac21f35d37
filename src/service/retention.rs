//! The retention pass (store/retention.rs): at the start and hourly, what
//! ended longer ago than `history.keep_days` leaves the ledger in batches,
//! one per turn of the loop with its other work in between, then the file
//! gives its free pages back. The longest batch is logged with the pass:
//! docs/reliability.md has the figure.

use super::Service;
use crate::time::EpochMs;
use std::time::{Duration, Instant};

/// Rows of each kind one batch deletes: a few milliseconds of the loop.
const BATCH_ROWS: usize = 500;
/// Free pages one step gives back.
const SHRINK_PAGES: u32 = 1024;
/// Other work's turn between two batches.
const BETWEEN_BATCHES: Duration = Duration::from_millis(20);

pub(super) struct Retention {
    keep: Duration,
    every: Duration,
    next: Instant,
    pass: Option<Pass>,
    /// The keep changed while a pass ran (its cutoff is the old one):
    /// another pass follows it at once.
    again: bool,
}

struct Pass {
    cutoff: EpochMs,
    started: Instant,
    rows: usize,
    /// GPU-days of usage rolled up.
    days: usize,
    batches: usize,
    longest: Duration,
    stage: Stage,
}

/// A pass forgets, then rolls up closed days, then shrinks the file.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stage {
    Forget,
    RollUp,
    Shrink,
}

impl Retention {
    /// Ended history is kept `keep`; a pass runs now and then every `every`.
    pub(super) fn new(keep: Duration, every: Duration) -> Retention {
        Retention {
            keep,
            every,
            next: Instant::now(),
            pass: None,
            again: false,
        }
    }

    /// When the loop should take the next step.
    pub(super) fn due_in(&self) -> Duration {
        match self.pass {
            Some(_) => BETWEEN_BATCHES,
            None => self.next.saturating_duration_since(Instant::now()),
        }
    }

    /// A reload changed `[history]`: a pass with the new keep runs at once
    /// (docs/operations.md), not at the next hourly one; one running now
    /// finishes with its cutoff, and the new pass follows it.
    pub(super) fn set_keep(&mut self, keep: Duration) {
        self.keep = keep;
        self.next = Instant::now();
        self.again = self.pass.is_some();
    }
}

impl Service {
    /// One step of retention: a batch, a shrink, or the start of a pass.
    pub(super) fn retention_step(&mut self) {
        let r = &mut self.retention;
        let pass = r.pass.get_or_insert_with(|| Pass {
            cutoff: EpochMs(EpochMs::now().0.saturating_sub(r.keep.as_millis() as u64)),
            started: Instant::now(),
            rows: 0,
            batches: 0,
            longest: Duration::ZERO,
            stage: Stage::Forget,
            days: 0,
        });
        let began = Instant::now();
        let done = match pass.stage {
            Stage::Forget => match self.node.forget_ended(pass.cutoff, BATCH_ROWS) {
                Ok(f) => {
                    pass.rows += f.rows();
                    if !f.more {
                        pass.stage = Stage::RollUp;
                    }
                    false
                }
                Err(e) => {
                    tracing::warn!(
                        "retention: deleting what ended before {} failed: {e}",
                        pass.cutoff
                    );
                    true
                }
            },
            // A GPU-day per batch: its intervals become a few sums.
            Stage::RollUp => match self.node.roll_up_next(EpochMs::now()) {
                Ok(Some(folded)) => {
                    pass.days += 1;
                    pass.rows += folded;
                    false
                }
                Ok(None) => {
                    pass.stage = Stage::Shrink;
                    false
                }
                Err(e) => {
                    tracing::warn!("retention: rolling up a day of usage failed: {e}");
                    pass.stage = Stage::Shrink;
                    false
                }
            },
            Stage::Shrink => match self.node.shrink_ledger(SHRINK_PAGES) {
                Ok(left) => left == 0,
                Err(e) => {
                    tracing::warn!("retention: giving the ledger's free pages back failed: {e}");
                    true
                }
            },
        };
        pass.batches += 1;
        pass.longest = pass.longest.max(began.elapsed());
        if done {
            let size = self.node.store().size_bytes().unwrap_or(0);
            tracing::info!(
                "retention: {} rows that ended before {} deleted or rolled up ({} GPU-days of usage \
                 rolled up) in {} batches over {} ms (the longest {:.1} ms); the ledger is {} KiB",
                pass.rows,
                pass.cutoff,
                pass.days,
                pass.batches,
                pass.started.elapsed().as_millis(),
                pass.longest.as_secs_f64() * 1000.0,
                size / 1024
            );
            self.retention.pass = None;
            self.retention.next = match std::mem::take(&mut self.retention.again) {
                true => Instant::now(),
                false => Instant::now() + self.retention.every,
            };
        }
    }
}
