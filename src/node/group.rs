//! Group commit seen from the node: a group of changes shares one ledger
//! transaction; when its commit fails the ledger rolls it back, and memory
//! is read back from the ledger to match.

use super::{Book, Changes, Node};
use crate::error::{Error, Result};
use crate::store::Failure;

/// How a group of changes ended (see [`Node::end_group`]).
#[derive(Debug)]
pub enum GroupEnd {
    /// Committed and synced: acknowledge it.
    Durable,
    /// Its commit's fsync failed: whether it was kept is unknown until a
    /// restart (SQLite may replay it then), and new work is refused until
    /// then. Memory keeps the group.
    Unsynced(Error),
    /// Not committed: the ledger and memory are as before the group; what
    /// the group had shown differs as these changes say.
    Undone(Error, Changes),
    /// Not committed, and memory could not follow the ledger (or the
    /// ledger's connection is in no known state): nothing of the group may
    /// be shown or launched, and the daemon must restart to read the
    /// ledger again.
    Lost(Error),
}

impl Node {
    /// Group commit (see [`crate::store::Store::begin_group`]): the changes until
    /// [`Node::end_group`] share one transaction; their acknowledgements
    /// wait for it.
    pub fn begin_group(&mut self) -> Result<()> {
        // A few entries at most (one per draining GPU).
        self.kept_before_group = self.book.kept.clone();
        self.store.begin_group()
    }

    /// Commits the group with one fsync. When its commit fails, the ledger
    /// has rolled the whole group back, and so does memory.
    pub fn end_group(&mut self) -> GroupEnd {
        let failed = match self.store.end_group() {
            Ok(()) => return GroupEnd::Durable,
            Err(f) => f,
        };
        match failed.how {
            Failure::Unsynced => GroupEnd::Unsynced(failed.error),
            Failure::Lost => GroupEnd::Lost(failed.error),
            Failure::RolledBack => match self.reload_workers() {
                Ok(changes) => GroupEnd::Undone(failed.error, changes),
                Err(e) => {
                    // Memory no longer matches the ledger: take nothing more.
                    self.store.refuse_until_restart();
                    GroupEnd::Lost(Error::Backend(format!(
                        "{}; reading the workers back from the ledger failed too ({e}); the \
                         daemon restarts to read it again",
                        failed.error.message()
                    )))
                }
            },
        }
    }

    /// A group's commit failed and the ledger rolled the group back: the
    /// workers are read back from it. Those that stay keep what only
    /// memory knows (their workload's phase, the pids in their control
    /// group); a group's changes launch nothing before it is durable, so
    /// none of those it undoes has a workload. Returns what differs from
    /// before, for the bus.
    fn reload_workers(&mut self) -> Result<Changes> {
        let before = std::mem::take(&mut self.workers);
        // GPUs kept for whole requests are memory's alone (drain.rs): as
        // they were when the group began, for the keepers waiting again.
        let kept = std::mem::take(&mut self.kept_before_group);
        self.book = Book::default();
        self.pending.clear();
        self.with_holders.clear();
        self.with_cgroup.clear();
        self.holders_changed += 1;
        self.cgroups_changed += 1;
        self.needs = Default::default();
        self.per_owner.clear();
        self.reasons
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        self.load_workers()?;
        self.book.kept = kept
            .into_iter()
            .filter(|(_, keeper)| self.pending.values().any(|p| p == keeper))
            .collect();
        let mut changes = Changes {
            gpus: self.machine.gpus.iter().map(|g| g.index).collect(),
            ..Changes::default()
        };
        for (name, old) in &before {
            match self.workers.get_mut(name) {
                Some(w) if w.id == old.id && same_place(&w.status, &old.status) => {
                    w.status = old.status.clone();
                    // A stop the group asked is undone with it (its caller
                    // is told the error); one the ledger holds stands
                    // (loaded as Stopping).
                    w.phase = match (old.phase, w.stop_asked) {
                        (super::Phase::Stopping, None) if old.runtime_id.is_some() => {
                            super::Phase::Running
                        }
                        (super::Phase::Stopping, None) => super::Phase::Starting,
                        (_, Some(_)) => super::Phase::Stopping,
                        (phase, None) => phase,
                    };
                    w.cgroup_pids = old.cgroup_pids.clone();
                    // Its workload runs whatever the ledger says: an id the
                    // ledger refused to record (a full disk) is memory's
                    // alone, and memory's is the newer; so for its control
                    // group, had a group recorded it.
                    if old.runtime_id.is_some() {
                        w.runtime_id = old.runtime_id.clone();
                    }
                    if old.cgroup.is_some() && w.cgroup != old.cgroup {
                        w.cgroup = old.cgroup.clone();
                        self.with_cgroup.insert(name.clone());
                    }
                    // What is promised on its GPUs may read differently
                    // (a rare path: a commit that failed).
                    if w.status != super::Status::Pending {
                        changes.updated.push(name.clone());
                    }
                }
                // The group placed it and the ledger has it waiting again,
                // stopping only if the ledger holds its stop (a stop in the
                // undone group is undone: its caller is told the error).
                Some(w) if w.id == old.id => {
                    changes.updated.push(name.clone());
                }
                _ => changes.removed.push(name.clone()),
            }
        }
        for (name, w) in &self.workers {
            if before.get(name).is_none_or(|old| old.id != w.id) {
                changes.added.push(name.clone());
            }
        }
        Ok(changes)
    }
}

/// Whether two statuses place a worker alike: the ledger reads grants back
/// by GPU index, placement gives a sharer of several GPUs fullest first.
fn same_place(a: &super::Status, b: &super::Status) -> bool {
    use super::Status::Running;
    match (a, b) {
        (Running { grants: x }, Running { grants: y }) => by_gpu(x) == by_gpu(y),
        _ => a == b,
    }
}

/// `grants` in one order, whatever order they were given in.
fn by_gpu(grants: &[crate::placement::Grant]) -> Vec<&crate::placement::Grant> {
    let mut sorted: Vec<_> = grants.iter().collect();
    sorted.sort_by(|a, b| a.gpu_uuid.cmp(&b.gpu_uuid));
    sorted
}
