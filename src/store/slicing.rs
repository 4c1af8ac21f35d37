//! The ledger's time-slicing records: templates, schedules, the slices that
//! ran (with what was measured), handoff steps and staged weights.

use super::{exec, Store};
use crate::error::{Error, Result};
use crate::failpoint;
use crate::slicing::meter::SliceMeasures;
use crate::time::EpochMs;
use rusqlite::{params, OptionalExtension};

/// One slice as the ledger keeps it.
#[derive(Clone, Debug, PartialEq)]
pub struct SliceRecord {
    pub template: String,
    pub user: String,
    /// The PCI devices it owned, space-separated.
    pub baseboard: String,
    pub start_ms: i64,
    pub end_ms: Option<i64>,
    pub dead_time_ms: Option<i64>,
    pub start_to_ready_ms: Option<i64>,
    pub measures: SliceMeasures,
    pub error: Option<String>,
}

/// Slices overlapping a window [?1, ?2): an open slice's end is indexed as
/// the largest there is (schema migration 13), spelled as the index has it.
pub(super) const SLICES_IN: &str = "SELECT template, user, baseboard, start_ms, end_ms,
        dead_time_ms, start_to_ready_ms, cpu_avg_pct, cpu_peak_pct, gpu_avg_pct, gpu_peak_pct,
        gpu_memory_peak_bytes, energy_j, error
    FROM slices WHERE start_ms < ?2 AND coalesce(end_ms, 9223372036854775807) > ?1
    ORDER BY start_ms, id";
/// A template's open slice (the latest), read through the same index: the
/// loop asks at each slice's start.
pub(super) const OPEN_SLICE: &str = "SELECT id FROM slices
    WHERE template = ?1 AND coalesce(end_ms, 9223372036854775807) = 9223372036854775807
    ORDER BY id DESC LIMIT 1";

impl Store {
    /// A slice begins (its start was issued); a restart between start issued
    /// and started finds it open and keeps it: still the same slice.
    pub fn open_slice_once(
        &mut self,
        template: &str,
        user: &str,
        baseboard: &str,
        at: EpochMs,
        dead_time_ms: Option<i64>,
    ) -> Result<()> {
        if self.open_slice_of(template)?.is_some() {
            return Ok(());
        }
        self.open_slice(template, user, baseboard, at, dead_time_ms)
            .map(|_| ())
    }

    /// The template's open slice is ready (its probe passed).
    pub fn slice_ready_of(&mut self, template: &str, start_to_ready_ms: i64) -> Result<()> {
        match self.open_slice_of(template)? {
            Some(id) => self.slice_ready(id, start_to_ready_ms),
            None => Ok(()),
        }
    }

    /// The template's open slice closes with what was measured over it.
    pub fn close_slice_of(
        &mut self,
        template: &str,
        at: EpochMs,
        m: &SliceMeasures,
        error: Option<&str>,
    ) -> Result<()> {
        match self.open_slice_of(template)? {
            Some(id) => self.close_slice(id, at, m, error),
            None => Ok(()),
        }
    }

    /// The last handoff step recorded, if any.
    pub fn last_step(&self) -> Result<Option<crate::slicing::handoff::Record>> {
        // A test fails this read, as an I/O error would.
        if failpoint::fails("store.last-step") {
            return Err(Error::Backend("failpoint store.last-step".into()));
        }
        Ok(self.steps(Some(1))?.pop())
    }

    /// Replaces a template's schedule (an empty list removes it), in one transaction.
    pub fn set_schedule(
        &mut self,
        template: &str,
        actions: Option<&str>,
        at: EpochMs,
    ) -> Result<()> {
        let at_ms = at.as_i64();
        let tx = self.change()?;
        // A schedule belongs to a template: checked in the same transaction
        // that writes it, so none can be set for a template being removed.
        let exists: Option<i64> = tx
            .query_row(
                "SELECT 1 FROM templates WHERE name = ?1",
                params![template],
                |r| r.get(0),
            )
            .optional()?;
        if exists.is_none() {
            return Err(Error::NotFound(format!(
                "no template named {template}: define it first (CreateTemplate), then schedule it"
            )));
        }
        match actions {
            Some(json) => exec(
&tx,
                "INSERT INTO schedules (template, actions, set_ms) VALUES (?1, ?2, ?3)
                 ON CONFLICT(template) DO UPDATE SET actions = excluded.actions, set_ms = excluded.set_ms",
                params![template, json, at_ms],
            )?,
            None => exec(&tx, "DELETE FROM schedules WHERE template = ?1", params![template])?,
        };
        exec(
            &tx,
            "INSERT INTO events (at_ms, worker_id, kind, detail) VALUES (?1, NULL, 'schedule', ?2)",
            params![at_ms, template],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// Whether a template of this name is defined.
    pub fn has_template(&self, name: &str) -> Result<bool> {
        Ok(self
            .conn
            .prepare_cached("SELECT 1 FROM templates WHERE name = ?1")?
            .exists(params![name])?)
    }

    /// Every template's JSON, by name.
    pub fn templates(&self) -> Result<Vec<(String, String)>> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT name, spec FROM templates ORDER BY name")?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Adds a template (a name is taken once).
    pub fn insert_template(&mut self, name: &str, spec: &str, at: EpochMs) -> Result<()> {
        let at_ms = at.as_i64();
        let tx = self.change()?;
        exec(
            &tx,
            "INSERT INTO templates (name, spec, created_ms) VALUES (?1, ?2, ?3)",
            params![name, spec, at_ms],
        )
        .map_err(|e| match e {
            rusqlite::Error::SqliteFailure(f, _)
                if f.code == rusqlite::ErrorCode::ConstraintViolation =>
            {
                Error::Exists(format!("a template named {name} already exists"))
            }
            e => e.into(),
        })?;
        exec(
            &tx,
            "INSERT INTO events (at_ms, worker_id, kind, detail) VALUES (?1, NULL, 'template', ?2)",
            params![at_ms, name],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// Removes a template and its schedule, in one transaction.
    pub fn remove_template(&mut self, name: &str, at: EpochMs) -> Result<bool> {
        let at_ms = at.as_i64();
        let tx = self.change()?;
        let n = exec(&tx, "DELETE FROM templates WHERE name = ?1", params![name])?;
        exec(
            &tx,
            "DELETE FROM schedules WHERE template = ?1",
            params![name],
        )?;
        exec(
&tx,
            "INSERT INTO events (at_ms, worker_id, kind, detail) VALUES (?1, NULL, 'template-removed', ?2)",
            params![at_ms, name],
        )?;
        tx.commit()?;
        Ok(n == 1)
    }

    /// A slice begins (its VM's start was issued); returns its id.
    pub fn open_slice(
        &mut self,
        template: &str,
        user: &str,
        baseboard: &str,
        start: EpochMs,
        dead_time_ms: Option<i64>,
    ) -> Result<i64> {
        let start_ms = start.as_i64();
        self.write(
            "INSERT INTO slices (template, user, baseboard, start_ms, dead_time_ms)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![template, user, baseboard, start_ms, dead_time_ms],
        )?;
        Ok(self.conn.last_insert_rowid())
    }

    /// The open slice of a template, if any (the latest).
    pub fn open_slice_of(&self, template: &str) -> Result<Option<i64>> {
        Ok(self
            .conn
            .prepare_cached(OPEN_SLICE)?
            .query_row(params![template], |r| r.get(0))
            .optional()?)
    }

    pub fn slice_ready(&mut self, id: i64, start_to_ready_ms: i64) -> Result<()> {
        self.write(
            "UPDATE slices SET start_to_ready_ms = ?2 WHERE id = ?1",
            params![id, start_to_ready_ms],
        )?;
        Ok(())
    }

    /// A slice ends with what was measured over it.
    pub fn close_slice(
        &mut self,
        id: i64,
        end: EpochMs,
        m: &SliceMeasures,
        error: Option<&str>,
    ) -> Result<()> {
        let end_ms = end.as_i64();
        self.write(
            "UPDATE slices SET end_ms = ?2, cpu_avg_pct = ?3, cpu_peak_pct = ?4, gpu_avg_pct = ?5,
             gpu_peak_pct = ?6, gpu_memory_peak_bytes = ?7, energy_j = ?8, error = ?9
             WHERE id = ?1 AND end_ms IS NULL",
            params![
                id,
                end_ms,
                m.cpu_avg_pct,
                m.cpu_peak_pct,
                m.gpu_avg_pct,
                m.gpu_peak_pct,
                m.gpu_memory_peak_bytes.map(|b| b as i64),
                m.energy_j,
                error
            ],
        )?;
        Ok(())
    }

    /// Slices overlapping [from_ms, to_ms), oldest first (read by their end,
    /// as holds are: see store/usage.rs).
    pub fn slices(&self, from_ms: i64, to_ms: i64) -> Result<Vec<SliceRecord>> {
        let mut stmt = self.conn.prepare_cached(SLICES_IN)?;
        let rows = stmt.query_map(params![from_ms, to_ms], |r| {
            Ok(SliceRecord {
                template: r.get(0)?,
                user: r.get(1)?,
                baseboard: r.get(2)?,
                start_ms: r.get(3)?,
                end_ms: r.get(4)?,
                dead_time_ms: r.get(5)?,
                start_to_ready_ms: r.get(6)?,
                measures: SliceMeasures {
                    cpu_avg_pct: r.get(7)?,
                    cpu_peak_pct: r.get(8)?,
                    gpu_avg_pct: r.get(9)?,
                    gpu_peak_pct: r.get(10)?,
                    gpu_memory_peak_bytes: r.get::<_, Option<i64>>(11)?.map(|b| b as u64),
                    energy_j: r.get(12)?,
                },
                error: r.get(13)?,
            })
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// The checksum staged on a template's weights disk, if any.
    pub fn weights(&self, template: &str) -> Result<Option<String>> {
        Ok(self
            .conn
            .query_row(
                "SELECT checksum FROM weights WHERE template = ?1",
                params![template],
                |r| r.get(0),
            )
            .optional()?)
    }

    pub fn set_weights(
        &mut self,
        template: &str,
        checksum: &str,
        image: &str,
        at: EpochMs,
    ) -> Result<()> {
        let at_ms = at.as_i64();
        // A test refuses the checksum here, as a full disk would.
        if failpoint::fails("store.weights") {
            return Err(Error::Backend("failpoint store.weights".into()));
        }
        self.write(
            "INSERT INTO weights (template, checksum, image, staged_ms) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT(template) DO UPDATE SET checksum = excluded.checksum,
             image = excluded.image, staged_ms = excluded.staged_ms",
            params![template, checksum, image, at_ms],
        )?;
        Ok(())
    }

    /// Records one handoff step.
    pub fn record_step(&mut self, r: &crate::slicing::handoff::Record) -> Result<()> {
        // A test refuses one step here, as a full disk would.
        if failpoint::fails(&format!("store.step.{}", r.step.as_str())) {
            return Err(rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_FULL),
                Some("failpoint store.step".into()),
            )
            .into());
        }
        self.write(
            "INSERT INTO handoff_steps (at_ms, step, from_template, to_template, detail)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![r.at_ms.as_i64(), r.step.as_str(), r.from, r.to, r.detail],
        )?;
        Ok(())
    }

    /// Handoff steps, oldest first (all of them when `limit` is None).
    pub fn steps(&self, limit: Option<usize>) -> Result<Vec<crate::slicing::handoff::Record>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT step, from_template, to_template, at_ms, detail FROM
             (SELECT * FROM handoff_steps ORDER BY id DESC LIMIT ?1) ORDER BY id",
        )?;
        let limit = limit.map_or(-1, |l| l as i64);
        let steps = read_steps(stmt.query(params![limit])?);
        steps
    }

    /// The last handoff step that says where the handoff stands (requests
    /// only change who is next; a VM destroyed beside the holder changes
    /// nothing): what a restart resumes from.
    pub fn last_state_step(&self) -> Result<Option<crate::slicing::handoff::Record>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT step, from_template, to_template, at_ms, detail FROM handoff_steps
             WHERE step NOT IN ('requested', 'destroyed') ORDER BY id DESC LIMIT 1",
        )?;
        let steps = read_steps(stmt.query([])?)?;
        Ok(steps.into_iter().next_back())
    }

    /// Every template's schedule: (template, normalized actions JSON).
    /// Drops schedules whose template does not exist (ledgers written before
    /// schedules were bound to templates could hold them), in one
    /// transaction; the templates they named.
    pub fn drop_orphan_schedules(&mut self, at: EpochMs) -> Result<Vec<String>> {
        let tx = self.change()?;
        let orphans: Vec<String> = {
            let mut stmt = tx.prepare(
                "SELECT template FROM schedules WHERE template NOT IN (SELECT name FROM templates)
                 ORDER BY template",
            )?;
            let rows = stmt.query_map([], |r| r.get(0))?;
            rows.collect::<rusqlite::Result<_>>()?
        };
        for t in &orphans {
            exec(&tx, "DELETE FROM schedules WHERE template = ?1", params![t])?;
            exec(
                &tx,
                "INSERT INTO events (at_ms, worker_id, kind, detail)
                 VALUES (?1, NULL, 'schedule-orphan-dropped', ?2)",
                params![at.as_i64(), t],
            )?;
        }
        tx.commit()?;
        Ok(orphans)
    }

    pub fn schedules(&self) -> Result<Vec<(String, String)>> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT template, actions FROM schedules ORDER BY template")?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}

fn read_steps(rows: rusqlite::Rows<'_>) -> Result<Vec<crate::slicing::handoff::Record>> {
    let rows = rows.mapped(|r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, Option<String>>(1)?,
            r.get::<_, Option<String>>(2)?,
            r.get::<_, i64>(3)?,
            r.get::<_, Option<String>>(4)?,
        ))
    });
    let mut out = Vec::new();
    for row in rows {
        let (step, from, to, at, detail) = row?;
        let step = crate::slicing::handoff::Step::parse(&step)
            .ok_or_else(|| Error::Backend(format!("ledger: unknown handoff step {step}")))?;
        out.push(crate::slicing::handoff::Record {
            step,
            from,
            to,
            at_ms: crate::time::EpochMs::from_i64(at),
            detail,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slicing::handoff::{Record, Step};

    fn step(step: Step, from: Option<&str>, to: Option<&str>, at: u64) -> Record {
        Record {
            step,
            from: from.map(str::to_string),
            to: to.map(str::to_string),
            at_ms: EpochMs(at),
            detail: None,
        }
    }

    /// A restart resumes from the last step that says where the handoff
    /// stands: not a request, nor a VM destroyed beside the holder.
    #[test]
    fn the_step_a_restart_resumes_from_skips_requests_and_destroyed_vms() {
        let mut store = Store::open_in_memory().unwrap();
        let ready = step(Step::Ready, None, Some("b"), 1);
        store.record_step(&ready).unwrap();
        store
            .record_step(&step(Step::Destroyed, Some("a"), Some("b"), 2))
            .unwrap();
        store
            .record_step(&step(Step::Requested, None, Some("b"), 3))
            .unwrap();
        assert_eq!(store.last_step().unwrap().unwrap().step, Step::Requested);
        assert_eq!(store.last_state_step().unwrap(), Some(ready));
    }
}
