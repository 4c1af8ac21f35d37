//! Group commit seen from the node: a group of changes shares one ledger
//! transaction; when its commit fails the ledger rolls it back, and memory
//! is read back from the ledger to match.

use super::{Book, Changes, Node};
use crate::error::{Error, Result};

/// How a group of changes ended (see [`Node::end_group`]).
#[derive(Debug)]
pub enum GroupEnd {
    /// Committed and synced: acknowledge it.
    Durable,
    /// Whether it was kept is unknown until a restart (its fsync failed,
    /// or its commit and then its rollback or the reading back), and new
    /// work is refused until then.
    Unsynced(Error),
    /// Not committed: the ledger and memory are as before the group; what
    /// the group had shown differs as these changes say.
    Undone(Error, Changes),
}

impl Node {
    /// Group commit (see [`crate::store::Store::begin_group`]): the changes until
    /// [`Node::end_group`] share one transaction; their acknowledgements
    /// wait for it.
    pub fn begin_group(&mut self) -> Result<()> {
        self.store.begin_group()
    }

    /// Commits the group with one fsync. When its commit fails, the ledger
    /// has rolled the whole group back, and so does memory.
    pub fn end_group(&mut self) -> GroupEnd {
        match self.store.end_group() {
            Ok(()) => GroupEnd::Durable,
            Err(f) if !f.rolled_back => GroupEnd::Unsynced(f.error),
            Err(f) => match self.reload_workers() {
                Ok(changes) => GroupEnd::Undone(f.error, changes),
                Err(e) => {
                    // Memory no longer matches the ledger: take nothing more.
                    self.store.refuse_until_restart();
                    GroupEnd::Unsynced(Error::Backend(format!(
                        "{}; reading the workers back from the ledger failed too ({e}), so new \
                         work is refused until the daemon restarts",
                        f.error.message()
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
        self.book = Book::default();
        self.pending.clear();
        self.with_holders.clear();
        self.needs = Default::default();
        self.per_owner.clear();
        self.reasons
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        self.load_workers()?;
        let mut changes = Changes {
            gpus: self.machine.gpus.iter().map(|g| g.index).collect(),
            ..Changes::default()
        };
        for (name, old) in &before {
            match self.workers.get_mut(name) {
                Some(w) if w.id == old.id => {
                    w.phase = old.phase;
                    w.cgroup_pids = old.cgroup_pids.clone();
                    if w.status != old.status {
                        changes.updated.push(name.clone());
                    }
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
