//! What the node reads of the GPUs for its workers: which processes and
//! promises are the workers' own (for the inventory to tell outside use
//! from theirs), a new reading taken in (what it changes and shows again),
//! and the warnings a GPU or a worker needs attention for.

use super::{better_machine, Changes, Node, Status, Worker};
use crate::error::Result;
use crate::placement::{beyond_lines, named, Gpu, GpuUse, Grant, Machine};
use crate::workload::{Claim, Group, Own};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// The running workers the book has on one GPU (whole, or its sharers, in
/// name order), as claims.
fn claims_on(workers: &BTreeMap<String, Worker>, used: &GpuUse) -> Arc<[Claim]> {
    used.workers()
        .filter_map(|name| workers.get(name))
        .filter(|w| matches!(w.status, Status::Running { .. }))
        .map(|w| Claim {
            worker: w.name().to_string(),
            share: w.spec.shared_gb(),
            holders: w.holders.iter().map(|h| h.pid).collect(),
        })
        .collect()
}

/// The claims [`Node::own`] built for each GPU, kept while the GPU's use in
/// the book is the same (its `Arc`: the book copies a use on write while
/// this holds it) and no running worker's holders changed. Built afresh at
/// every refresh, the claims cost 65 ms of the loop's CPU a refresh at
/// 100,000 running workers (#25, docs/benchmarks.md); now an idle refresh
/// costs what the GPUs are.
#[derive(Default)]
pub(super) struct OwnCache {
    holders_changed: u64,
    on_gpu: HashMap<String, (Arc<GpuUse>, Arc<[Claim]>)>,
    /// The groups to look in, as of a count of `Node::cgroups_changed`.
    groups: Option<(u64, Arc<[Group]>)>,
}

impl Node {
    /// What is the workers' own on the GPUs: on each GPU, the running
    /// workers granted it (their shares and holders); their control groups,
    /// to look in for their processes; and the GB promised on each GPU.
    pub fn own(&mut self) -> Own {
        let cache = &mut self.own_cache;
        if cache.holders_changed != self.holders_changed {
            cache.on_gpu.clear();
            cache.holders_changed = self.holders_changed;
        }
        cache
            .on_gpu
            .retain(|uuid, _| self.book.gpus.contains_key(uuid));
        let mut on_gpu = HashMap::new();
        for (uuid, used) in &self.book.gpus {
            let claims = match cache.on_gpu.get(uuid) {
                Some((seen, claims)) if Arc::ptr_eq(seen, used) => claims.clone(),
                _ => {
                    let claims = claims_on(&self.workers, used);
                    cache
                        .on_gpu
                        .insert(uuid.clone(), (used.clone(), claims.clone()));
                    claims
                }
            };
            if !claims.is_empty() {
                on_gpu.insert(uuid.clone(), claims);
            }
        }
        // Only workers whose group was learnt, built again only when that
        // changed: a walk over every launched worker at each refresh would
        // cost the loop what the claims did.
        let cgroups = match &cache.groups {
            Some((seen, groups)) if *seen == self.cgroups_changed => groups.clone(),
            _ => {
                let groups: Arc<[Group]> = self
                    .with_cgroup
                    .iter()
                    .filter_map(|name| self.workers.get(name))
                    .filter(|w| matches!(w.status, Status::Running { .. }))
                    .filter_map(|w| {
                        Some(Group {
                            worker: w.name().to_string(),
                            id: w.id,
                            cgroup: w.cgroup.clone()?,
                        })
                    })
                    .collect();
                cache.groups = Some((self.cgroups_changed, groups.clone()));
                groups
            }
        };
        Own {
            on_gpu,
            cgroups,
            held: self.held_groups(),
            in_cgroups: Default::default(),
            promised: self
                .book
                .gpus
                .iter()
                .map(|(uuid, u)| (uuid.clone(), u.taken()))
                .collect(),
        }
    }

    /// The workers whose share is held, and the group their limits are on
    /// (few: shared workers on hosts that hold shares).
    fn held_groups(&self) -> Arc<[Group]> {
        self.held
            .iter()
            .filter_map(|name| self.workers.get(name))
            .filter_map(|w| {
                Some(Group {
                    worker: w.name().to_string(),
                    id: w.id,
                    cgroup: w.cgroup.clone()?,
                })
            })
            .collect()
    }

    /// A new reading of the machine: promises stay, pending work is re-examined.
    pub fn set_machine(&mut self, machine: Machine) -> Result<Changes> {
        // The workers this reading may show differently, and those whose
        // group's processes changed: shown with it, or with the next one
        // should it fail (the machine is taken in either way).
        let mut shown = std::mem::take(&mut self.to_show_again);
        shown.extend(self.shown_again_by(&machine));
        match self.take_reading(machine) {
            Ok(mut changes) => {
                let shown = shown.into_iter();
                changes
                    .updated
                    .extend(shown.filter(|name| self.workers.contains_key(name)));
                changes.updated.sort_unstable();
                changes.updated.dedup();
                Ok(changes)
            }
            Err(e) => {
                self.to_show_again = shown;
                Err(e)
            }
        }
    }

    fn take_reading(&mut self, machine: Machine) -> Result<Changes> {
        let mut changes = Changes::default();
        if machine == *self.machine {
            return Ok(changes);
        }
        // On a real host the energy counter moves at every refresh, power
        // and utilisation most of the time, processes' bytes often: none
        // of them places anything. Then only the GPUs that moved are shown
        // again: not every GPU, every refresh.
        if self.machine.same_but_readings(&machine) {
            for (old, new) in self.machine.gpus.iter().zip(&machine.gpus) {
                if old != new {
                    changes.gpus.push(new.index);
                }
            }
            self.machine = std::sync::Arc::new(machine);
            return Ok(changes);
        }
        changes.machine_changed = true;
        changes.gpus.extend(machine.gpus.iter().map(|g| g.index));
        let better = better_machine(&self.machine, &machine);
        self.machine = std::sync::Arc::new(machine);
        self.forget_reasons();
        self.reexamine(better, &mut changes)?;
        Ok(changes)
    }

    /// The running workers whose views a new machine may change: those on a
    /// GPU (by UUID) that reads differently in more than its counters
    /// (power, energy, utilisation: no view shows them), those whose own
    /// processes' bytes came, went or moved (their use), or all when the
    /// machine's name (in every warning) changed. A waiting worker's view
    /// reads nothing of the machine (its reasons are read when asked). A
    /// desktop's memory moves at most refreshes: every worker shown again
    /// at each cost the loop 663 ms a refresh at 100,000 workers (#25).
    fn shown_again_by<'a>(&'a self, new: &'a Machine) -> Vec<String> {
        if *new == *self.machine {
            return Vec::new();
        }
        let old = &self.machine;
        if old.name != new.name {
            return self.workers.keys().cloned().collect();
        }
        let by_uuid = |m: &'a Machine| -> HashMap<&'a str, &'a Gpu> {
            m.gpus.iter().map(|g| (g.uuid.as_str(), g)).collect()
        };
        let (before, after) = (by_uuid(old), by_uuid(new));
        let mut shown = Vec::new();
        for (uuid, used) in &self.book.gpus {
            let on = used.workers();
            match (before.get(uuid.as_str()), after.get(uuid.as_str())) {
                (Some(old), Some(new)) if old.same_but_readings(new) => {
                    if old.held_use != new.held_use {
                        shown.extend(on.map(str::to_string));
                        continue;
                    }
                    if old.own_use == new.own_use {
                        continue;
                    }
                    let Some(moved) = moved_pids(&old.own_use, &new.own_use) else {
                        shown.extend(on.map(str::to_string));
                        continue;
                    };
                    let own_moved = |name: &&str| {
                        self.workers
                            .get(*name)
                            .is_some_and(|w| w.own_pids().any(|pid| moved.contains(&pid)))
                    };
                    shown.extend(on.filter(own_moved).map(str::to_string));
                }
                (None, None) => {}
                _ => shown.extend(on.map(str::to_string)),
            }
        }
        shown
    }

    /// The GPUs among `grants` promised beyond what they offer now: the
    /// warning their workers read names what is promised, which a stop
    /// changes.
    pub(super) fn over_promised_among(&self, grants: &[Grant]) -> Vec<String> {
        grants
            .iter()
            .filter(|grant| {
                let gpu = self.machine.gpus.iter().find(|g| g.uuid == grant.gpu_uuid);
                gpu.is_some_and(|g| self.book.taken(&g.uuid) > g.offered())
            })
            .map(|grant| grant.gpu_uuid.clone())
            .collect()
    }

    /// The index GPU `uuid` has in the machine now: a grant keeps the one
    /// it was placed at, which a reading without an earlier GPU shifts.
    pub fn index_now(&self, uuid: &str) -> Option<u32> {
        self.machine
            .gpus
            .iter()
            .find(|g| g.uuid == uuid)
            .map(|g| g.index)
    }

    /// The indexes of the GPUs of `grants` now.
    pub(super) fn indexes_now(&self, grants: &[Grant]) -> Vec<u32> {
        let now = grants.iter().filter_map(|g| self.index_now(&g.gpu_uuid));
        now.collect()
    }

    /// The running workers on GPU `uuid` (its whole holder or its sharers).
    pub(super) fn workers_on(&self, uuid: &str) -> Vec<String> {
        let on = self.book.usage(uuid).into_iter().flat_map(GpuUse::workers);
        on.map(str::to_string).collect()
    }

    /// Why a GPU needs attention, if it does: promised beyond what it offers
    /// now (outside use, or a sharer's beyond its share, grew after
    /// placement), unhealthy while in use, or its sharers using beyond their
    /// shares (memory the others were promised is at risk).
    pub fn gpu_warning(&self, g: &Gpu) -> Option<String> {
        let in_use = self.book.usage(&g.uuid).is_some();
        self.gpus_own_warning(g).or_else(|| {
            // Only while shared: a GPU gone keeps its last reading.
            (in_use && !g.beyond.is_empty())
                .then(|| format!("used beyond shares: {}", beyond_lines(&g.beyond).join("; ")))
        })
    }

    /// What every worker on a GPU is told about it: over-promised or
    /// unhealthy in use. Use beyond shares is told to the GPU and to the
    /// workers it is theirs (its figures change with every reading: told
    /// to everyone else, each change was a new warning for each of them).
    fn gpus_own_warning(&self, g: &Gpu) -> Option<String> {
        let taken = self.book.taken(&g.uuid);
        if taken > g.offered() {
            return Some(format!(
                "over-promised: {taken} GB promised to sharers but it offers {} of its {} GB{}",
                g.offered(),
                g.total,
                g.held_text().map(|h| format!(" ({h})")).unwrap_or_default()
            ));
        }
        if !g.healthy && self.book.usage(&g.uuid).is_some() {
            return Some(format!(
                "unhealthy while in use{}",
                g.problem
                    .as_ref()
                    .map(|p| format!(": {p}"))
                    .unwrap_or_default()
            ));
        }
        None
    }

    /// The GPU memory a worker's processes use now, per GPU it holds (index,
    /// bytes); `None` where the driver gives no per-process readings.
    pub fn worker_use(&self, w: &Worker) -> Vec<(u32, Option<u64>)> {
        w.grants()
            .iter()
            .map(|grant| {
                let gpu = self.machine.gpus.iter().find(|g| g.uuid == grant.gpu_uuid);
                // Its group's exact use where its limits count it.
                let exact = gpu.and_then(|g| {
                    g.held_use
                        .iter()
                        .find(|h| h.worker == w.name())
                        .and_then(|h| h.used)
                });
                if let Some(bytes) = exact {
                    // And its holders outside its group, by their own bytes.
                    let holders: u64 = gpu
                        .and_then(|g| g.own_use.as_ref())
                        .into_iter()
                        .flatten()
                        .filter(|(pid, _)| {
                            w.holders.iter().any(|h| h.pid == *pid) && !w.cgroup_pids.contains(pid)
                        })
                        .map(|(_, b)| b)
                        .sum();
                    return (
                        gpu.map_or(grant.gpu_index, |g| g.index),
                        Some(bytes + holders),
                    );
                }
                let used = gpu.and_then(|g| g.own_use.as_ref()).map(|uses| {
                    uses.iter()
                        .filter(|(pid, _)| w.own_pids().any(|p| p == *pid))
                        .map(|(_, b)| b)
                        .sum()
                });
                (gpu.map_or(grant.gpu_index, |g| g.index), used)
            })
            .collect()
    }

    /// Warnings about a running worker: its GPUs (unhealthy, over-promised,
    /// gone) and its promise (using more than
    /// its share, judged with the workers it shares a process with).
    pub fn worker_warnings(&self, w: &Worker) -> Vec<String> {
        let m = &self.machine.name;
        let mut out = Vec::new();
        for grant in w.grants() {
            let Some(g) = self.machine.gpus.iter().find(|g| g.uuid == grant.gpu_uuid) else {
                out.push(format!(
                    "GPU {} of {m} ({}) is no longer seen by the inventory",
                    grant.gpu_index, grant.gpu_uuid
                ));
                continue;
            };
            if let Some(warning) = self.gpus_own_warning(g) {
                out.push(format!("GPU {} of {m} is {warning}", g.index));
            }
            let index = g.index;
            for b in g
                .beyond
                .iter()
                .filter(|b| b.workers.iter().any(|n| n == w.name()))
            {
                let (share, used) = (b.share, b.used);
                let others: Vec<&str> = b
                    .workers
                    .iter()
                    .map(String::as_str)
                    .filter(|n| *n != w.name())
                    .collect();
                out.push(if others.is_empty() {
                    format!("uses more than its {share} GB share on GPU {index} of {m} ({used} GB now)")
                } else {
                    format!(
                        "uses, with {}, more than their {share} GB of shares on GPU {index} of {m} ({used} GB now)",
                        named(others.into_iter())
                    )
                });
            }
        }
        out
    }
}

/// The processes whose bytes on a GPU differ between two readings (came,
/// went or moved); None when either reading has no per-process figures
/// (then every worker's use may read differently).
fn moved_pids(
    old: &Option<Vec<(u32, u64)>>,
    new: &Option<Vec<(u32, u64)>>,
) -> Option<std::collections::HashSet<u32>> {
    let (Some(old), Some(new)) = (old, new) else {
        return None;
    };
    let by_pid = |uses: &[(u32, u64)]| {
        let mut sums = BTreeMap::<u32, u64>::new();
        for &(pid, bytes) in uses {
            *sums.entry(pid).or_default() += bytes;
        }
        sums
    };
    let (old, new) = (by_pid(old), by_pid(new));
    let came_or_moved = new.iter().filter(|(pid, b)| old.get(pid) != Some(b));
    let went = old.keys().filter(|pid| !new.contains_key(pid));
    Some(
        came_or_moved
            .map(|(pid, _)| *pid)
            .chain(went.copied())
            .collect(),
    )
}
