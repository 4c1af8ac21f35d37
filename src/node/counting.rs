//! The usage report and the metrics' counters: the report counted window
//! after window into the ledger (see `Store::add_counters`), so that they
//! survive restarts.

use super::Node;
use crate::error::Result;

impl Node {
    /// The usage report of [from_ms, to_ms), computed from the ledger (so a
    /// restart loses nothing). This run counts as up until `now_ms`.
    pub fn usage_report(
        &self,
        from_ms: i64,
        to_ms: i64,
        by: crate::report::GroupBy,
        now_ms: i64,
        live: &[crate::usage::Interval],
        owner_name: impl Fn(u32) -> String,
    ) -> Result<Vec<crate::report::Row>> {
        let (current, gpus) = self.report_facts(now_ms, live.to_vec());
        self.store
            .usage_report(from_ms, to_ms, by, current, gpus, owner_name)
            .map(|(rows, _facts)| rows)
    }

    /// What a usage report needs of the live daemon besides the ledger: this
    /// run (up until `now_ms`, with `live`, what it measured since its last
    /// interval closed) and the GPUs the machine has now. Cheap: taken on
    /// the loop for a report that runs on [`crate::store::Store::reader`].
    pub fn report_facts(
        &self,
        now_ms: i64,
        live: Vec<crate::usage::Interval>,
    ) -> (
        Option<crate::store::CurrentRun>,
        Vec<crate::report::GpuFacts>,
    ) {
        let gpus = self
            .machine
            .gpus
            .iter()
            .map(|g| crate::report::GpuFacts {
                uuid: g.uuid.clone(),
                index: g.index,
                total_bytes: g.total.bytes(),
            })
            .collect();
        let current = self.run.map(|started_ms| crate::store::CurrentRun {
            started_ms,
            now_ms,
            open: live,
        });
        (current, gpus)
    }

    /// The metrics' counters so far (shared: the page holds them as they were).
    pub fn counters(&self) -> std::sync::Arc<crate::usage::UsageCounters> {
        self.counters.clone()
    }

    /// Counts the usage report over the window since the last count (up to
    /// `now_ms`, when a sampling interval has just closed) into the
    /// counters, in the ledger and here. The window is small: its cost does
    /// not grow with the ledger (holds and GPU intervals are read by their
    /// end: store/usage.rs; the first count after an upgrade reads the
    /// ledger once, from the first run).
    pub fn count_usage(&mut self, now_ms: i64) -> Result<()> {
        let Some(from) = self.store.counting_from()? else {
            return Ok(());
        };
        if now_ms <= from {
            return Ok(());
        }
        let report = |by| self.usage_report(from, now_ms, by, now_ms, &[], |uid| uid.to_string());
        let mut gpu: Vec<((String, String), crate::usage::Counted)> = Vec::new();
        for r in report(crate::report::GroupBy::Gpu)? {
            let c = crate::usage::Counted {
                gpu_ms: r.gpu_ms,
                energy_mj: r.energy_mj,
            };
            gpu.push(((r.gpu_uuid, r.kind.as_str().to_string()), c));
        }
        let mut worker: Vec<(String, crate::usage::Counted)> = Vec::new();
        for r in report(crate::report::GroupBy::Worker)? {
            if r.kind == crate::report::RowKind::Worker {
                let c = crate::usage::Counted {
                    gpu_ms: r.gpu_ms,
                    energy_mj: r.energy_mj,
                };
                worker.push((r.key, c));
            }
        }
        self.store.add_counters(&gpu, &worker, now_ms)?;
        let counters = std::sync::Arc::make_mut(&mut self.counters);
        counters.until_ms = now_ms;
        for (k, c) in gpu {
            counters.gpu.entry(k).or_default().add(c);
        }
        for (name, c) in worker {
            if !self.workers.contains_key(&name) {
                continue;
            }
            match counters.worker.get_mut(&name) {
                Some(total) => total.add(c),
                // Not counted since the start: the ledger's total, this
                // window included (a name used before goes on from there).
                None => {
                    let total = self.store.worker_counter(&name)?.unwrap_or(c);
                    counters.worker.insert(name, total);
                }
            }
        }
        let live = &self.workers;
        counters.worker.retain(|name, _| live.contains_key(name));
        Ok(())
    }
}
