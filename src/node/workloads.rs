//! What the runtimes report of a placed worker's workload: its id, its
//! control group and the processes in it, where it is in its life, and
//! whether its share is held (its GPU memory limits set and read back).

use super::{Node, Phase};
use crate::error::{Error, Result};
use crate::worker::Worker;

impl Node {
    /// A launched worker's runtime id, recorded before it counts as running.
    /// The workload runs whether or not the ledger could take its id (a
    /// full disk): it is known here either way, so that its exit is matched
    /// to the worker and a stop reaches it; the ledger's error is returned
    /// after.
    pub fn set_launched(&mut self, name: &str, runtime_id: &str) -> Result<()> {
        let Some(w) = self.workers.get(name) else {
            return Err(Error::NotFound(format!("no live worker named {name}")));
        };
        let recorded = if w.runtime_id.as_deref() != Some(runtime_id) {
            self.store.set_runtime_id(w.id, runtime_id)
        } else {
            Ok(())
        };
        let w = self.workers.get_mut(name).expect("checked");
        w.runtime_id = Some(runtime_id.to_string());
        if w.phase != Phase::Stopping {
            w.phase = Phase::Running;
        }
        recorded
    }

    /// The workers whose share is held now.
    pub fn held_workers(&self) -> impl Iterator<Item = &Worker> + '_ {
        self.held.iter().filter_map(|name| self.workers.get(name))
    }

    /// Records whether worker `name` (`id`: not another that took its name
    /// since) has its share held or only promised.
    pub fn set_enforcement(&mut self, name: &str, id: i64, e: crate::memory_limits::Enforcement) {
        if let Some(w) = self.workers.get_mut(name).filter(|w| w.id == id) {
            if e == crate::memory_limits::Enforcement::Held {
                self.held.insert(name.to_string());
            } else {
                self.held.remove(name);
            }
            if w.enforcement.as_ref() != Some(&e) {
                w.enforcement = Some(e);
                self.to_show_again.insert(name.to_string());
            }
        }
    }

    /// Records the control group of a launched worker's workload.
    pub fn set_cgroup(&mut self, name: &str, cgroup: &str) -> Result<()> {
        let Some(w) = self.workers.get_mut(name) else {
            return Ok(()); // ended meanwhile
        };
        if w.cgroup.as_deref() != Some(cgroup) {
            self.store.set_cgroup(w.id, cgroup)?;
            w.cgroup = Some(cgroup.to_string());
            self.with_cgroup.insert(name.to_string());
            self.cgroups_changed += 1;
        }
        Ok(())
    }

    /// The processes found in the control group of worker `name` (`id`:
    /// not another that took its name since).
    pub fn set_cgroup_pids(&mut self, name: &str, id: i64, pids: Vec<u32>) {
        if let Some(w) = self.workers.get_mut(name).filter(|w| w.id == id) {
            if w.cgroup_pids != pids {
                w.cgroup_pids = pids;
                self.to_show_again.insert(name.to_string());
            }
        }
    }

    /// Where a launched worker's workload is (in memory: the ledger knows the rest).
    pub fn set_phase(&mut self, name: &str, phase: Phase) {
        if let Some(w) = self.workers.get_mut(name) {
            w.phase = phase;
        }
    }
}
