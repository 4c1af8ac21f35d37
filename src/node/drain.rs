//! Drain for whole work: best fit puts new shared work on partly used GPUs,
//! so with every GPU partly shared a whole request could wait forever. Once
//! one has waited `after`, a GPU is kept for it (placement::drain_pick):
//! no new sharer lands there, and when its last sharer ends the whole
//! request takes it. Oldest whole request first; at most one GPU *draining*
//! (kept and still shared) per owner at a time (one member's k waiting
//! requests do not drain k GPUs), while empty GPUs a request can use are
//! kept for it at once (else new shared work would open them).
//!
//! Nothing here is in the ledger: what is kept follows from the pending
//! workers' submit times and the clock, so a restart recomputes it.

use super::{Better, Changes, Node, Status};
use crate::error::Result;
use crate::placement::{self, Mode};
use crate::time::EpochMs;
use std::collections::BTreeMap;
use std::time::Duration;

impl Node {
    /// Keeps GPUs for whole requests that have waited `after` or longer
    /// (never when `after` is None), and lets go of GPUs kept for requests
    /// that no longer wait or can no longer use them.
    pub fn drain(&mut self, now: EpochMs, after: Option<Duration>) -> Result<Changes> {
        let mut kept = self.book.kept.clone();
        kept.retain(|uuid, keeper| {
            let req = self
                .workers
                .get(keeper)
                .filter(|w| w.status == Status::Pending)
                .and_then(|w| w.spec.resources.gpu.as_ref());
            let gpu = self.machine.gpus.iter().find(|g| &g.uuid == uuid);
            matches!((req, gpu), (Some(r), Some(g)) if placement::may_keep(g, r))
        });
        // One owner's waiting whole requests drain one GPU at a time (its
        // oldest request's): k requests of one member must not take k GPUs
        // from everyone's shared work.
        let owner = |keeper: &String| self.workers[keeper].owner_uid;
        let mut draining: std::collections::HashMap<u32, (i64, String)> = Default::default();
        for (uuid, keeper) in kept
            .iter()
            .filter(|(u, _)| self.book.mode(u) == Mode::Shared)
        {
            let id = self.workers[keeper].id;
            let first = draining.entry(owner(keeper)).or_insert((id, uuid.clone()));
            if id < first.0 {
                *first = (id, uuid.clone());
            }
        }
        kept.retain(|uuid, keeper| {
            self.book.mode(uuid) != Mode::Shared || draining[&owner(keeper)].1 == *uuid
        });
        // Only whole requests drain GPUs: with none waiting, the queue (of
        // thousands of shared ones, say) is not walked at every refresh.
        let after = after.filter(|_| self.needs.whole() > 0);
        if let Some(after) = after {
            let waited_enough = |submitted: EpochMs| {
                now.as_i64().saturating_sub(submitted.as_i64()) >= after.as_millis() as i64
            };
            for name in self.pending.values() {
                let w = &self.workers[name];
                let Some(req) = w
                    .spec
                    .resources
                    .gpu
                    .as_ref()
                    .filter(|r| r.shared_gb.is_none())
                else {
                    continue;
                };
                if !waited_enough(w.submitted) {
                    continue;
                }
                let mut book = self.book.clone();
                book.kept = kept.clone();
                // Empty GPUs it can use are kept at once; then one shared GPU drains.
                loop {
                    let draining = kept
                        .iter()
                        .any(|(u, k)| owner(k) == w.owner_uid && book.mode(u) == Mode::Shared);
                    if draining {
                        break;
                    }
                    let Some(uuid) = placement::drain_pick(&self.machine, &book, req) else {
                        break;
                    };
                    let empty = book.mode(&uuid) == Mode::Free;
                    kept.insert(uuid.clone(), name.clone());
                    book.kept.insert(uuid, name.clone());
                    if !empty {
                        break;
                    }
                }
            }
        }
        self.set_kept(kept)
    }

    /// Lets go of the GPUs kept for these workers (placed, or no longer
    /// pending); the GPUs let go are re-examined for everyone else.
    pub(super) fn let_go(&mut self, workers: &[String], changes: &mut Changes) -> Result<()> {
        if workers.is_empty() || self.book.kept.is_empty() {
            return Ok(());
        }
        let mut kept = self.book.kept.clone();
        kept.retain(|_, keeper| !workers.contains(keeper));
        let more = self.set_kept(kept)?;
        merge(changes, more);
        Ok(())
    }

    /// Replaces what is kept: changed GPUs are reported, reasons forgotten,
    /// and GPUs no longer kept re-examined (they may serve others now).
    fn set_kept(&mut self, kept: BTreeMap<String, String>) -> Result<Changes> {
        let mut changes = Changes::default();
        if kept == self.book.kept {
            return Ok(changes);
        }
        let old = std::mem::replace(&mut self.book.kept, kept);
        let index = |uuid: &str| self.index_now(uuid);
        let mut freed = Vec::new();
        for (uuid, keeper) in &old {
            if self.book.kept.get(uuid) != Some(keeper) {
                freed.push(uuid.clone());
                changes.gpus.extend(index(uuid));
            }
        }
        for (uuid, keeper) in &self.book.kept {
            if old.get(uuid) != Some(keeper) {
                changes.gpus.extend(index(uuid));
                let gpu = index(uuid).map_or_else(|| uuid.clone(), |i| i.to_string());
                tracing::info!(
                    worker = %keeper,
                    gpu = %gpu,
                    "GPU {gpu} drains for {keeper}, a whole-GPU request that waited too long: \
                     no new work goes on it until {keeper} is placed"
                );
            }
        }
        self.forget_reasons();
        if !freed.is_empty() {
            self.reexamine(
                Better::Some {
                    gpus: freed,
                    host: false,
                },
                &mut changes,
            )?;
        }
        changes.gpus.sort_unstable();
        changes.gpus.dedup();
        Ok(changes)
    }
}

/// Adds `more` to `changes`: what a follow-up step changed too.
fn merge(changes: &mut Changes, more: Changes) {
    changes.gpus.extend(more.gpus);
    changes.gpus.sort_unstable();
    changes.gpus.dedup();
    changes.updated.extend(more.updated);
    changes.placed.extend(more.placed);
}
