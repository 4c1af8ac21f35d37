//! What the node reads of the GPUs for its workers: which processes and
//! promises are the workers' own (for the inventory to tell outside use
//! from theirs), and the warnings a GPU or a worker needs attention for.

use super::{Node, Status, Worker};
use crate::inventory::{Claim, Group, Own};
use crate::placement::{beyond_lines, named, Gpu};

impl Node {
    /// What is the workers' own on the GPUs: on each GPU, the running
    /// workers granted it (their shares and holders); their control groups,
    /// to look in for their processes; and the GB promised on each GPU.
    pub fn own(&self) -> Own {
        let mut on_gpu: std::collections::HashMap<String, Vec<Claim>> = Default::default();
        let mut cgroups = Vec::new();
        for w in self.workers.values() {
            if !matches!(w.status, Status::Running { .. }) {
                continue;
            }
            for grant in w.grants() {
                on_gpu
                    .entry(grant.gpu_uuid.clone())
                    .or_default()
                    .push(Claim {
                        worker: w.name().to_string(),
                        share: w.spec.shared_gb(),
                        holders: w.holders.iter().map(|h| h.pid).collect(),
                    });
            }
            if let Some(cgroup) = &w.cgroup {
                cgroups.push(Group {
                    worker: w.name().to_string(),
                    id: w.id,
                    cgroup: cgroup.clone(),
                });
            }
        }
        Own {
            on_gpu,
            cgroups,
            in_cgroups: Default::default(),
            promised: self
                .book
                .gpus
                .iter()
                .map(|(uuid, u)| (uuid.clone(), u.taken()))
                .collect(),
        }
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
                let used = gpu.and_then(|g| g.own_use.as_ref()).map(|uses| {
                    uses.iter()
                        .filter(|(pid, _)| w.own_pids().any(|p| p == *pid))
                        .map(|(_, b)| b)
                        .sum()
                });
                (grant.gpu_index, used)
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
