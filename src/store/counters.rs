//! The metrics' counters in the ledger: what the usage report accounted,
//! window after window, summed per GPU and kind and per worker name, with
//! the end of the last window counted, all in one transaction.

use super::{exec, Store};
use crate::error::Result;
use crate::usage::{Counted, UsageCounters};
use rusqlite::{params, OptionalExtension};

impl Store {
    /// Where counting resumes: the end of the last window counted, else the
    /// start of the first daemon run (None: no run yet).
    pub fn counting_from(&self) -> Result<Option<i64>> {
        let until: Option<i64> = self
            .conn
            .query_row("SELECT until_ms FROM usage_counted WHERE id = 1", [], |r| {
                r.get(0)
            })
            .optional()?;
        if until.is_some() {
            return Ok(until);
        }
        Ok(self
            .conn
            .query_row("SELECT min(started_ms) FROM daemon_runs", [], |r| r.get(0))?)
    }

    /// The counters so far: every GPU's, and those of the workers named.
    pub fn load_counters<'a>(
        &self,
        workers: impl Iterator<Item = &'a str>,
    ) -> Result<UsageCounters> {
        let mut out = UsageCounters {
            until_ms: self.counting_from()?.unwrap_or(0),
            ..Default::default()
        };
        let mut stmt = self.conn.prepare_cached(
            "SELECT key, kind, gpu_ms, energy_mj FROM usage_counters WHERE scope = 'gpu'",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok((
                (r.get::<_, String>(0)?, r.get::<_, String>(1)?),
                Counted {
                    gpu_ms: r.get::<_, i64>(2)? as u64,
                    energy_mj: r.get::<_, i64>(3)? as u64,
                },
            ))
        })?;
        out.gpu = rows.collect::<rusqlite::Result<_>>()?;
        for name in workers {
            if let Some(c) = self.worker_counter(name)? {
                out.worker.insert(name.to_string(), c);
            }
        }
        Ok(out)
    }

    /// One worker name's counter, if it was ever counted.
    pub fn worker_counter(&self, name: &str) -> Result<Option<Counted>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT gpu_ms, energy_mj FROM usage_counters
             WHERE scope = 'worker' AND key = ?1 AND kind = ''",
        )?;
        Ok(stmt
            .query_row(params![name], |r| {
                Ok(Counted {
                    gpu_ms: r.get::<_, i64>(0)? as u64,
                    energy_mj: r.get::<_, i64>(1)? as u64,
                })
            })
            .optional()?)
    }

    /// Adds one window's amounts and moves the mark to its end, at once.
    pub fn add_counters(
        &mut self,
        gpu: &[((String, String), Counted)],
        worker: &[(String, Counted)],
        until_ms: i64,
    ) -> Result<()> {
        let tx = self.change()?;
        {
            let mut add = tx.prepare_cached(
                "INSERT INTO usage_counters (scope, key, kind, gpu_ms, energy_mj)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (scope, key, kind) DO UPDATE SET
                   gpu_ms = gpu_ms + excluded.gpu_ms,
                   energy_mj = energy_mj + excluded.energy_mj",
            )?;
            for ((uuid, kind), c) in gpu {
                add.execute(params![
                    "gpu",
                    uuid,
                    kind,
                    c.gpu_ms as i64,
                    c.energy_mj as i64
                ])?;
            }
            for (name, c) in worker {
                add.execute(params![
                    "worker",
                    name,
                    "",
                    c.gpu_ms as i64,
                    c.energy_mj as i64
                ])?;
            }
        }
        exec(
            &tx,
            "INSERT INTO usage_counted (id, until_ms) VALUES (1, ?1)
             ON CONFLICT (id) DO UPDATE SET until_ms = excluded.until_ms",
            params![until_ms],
        )?;
        crate::failpoint::hit("store.counters.before-commit");
        tx.commit()?;
        Ok(())
    }
}
