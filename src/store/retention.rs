//! Retention: what ended longer ago than `history.keep_days` leaves the
//! ledger in small batches (each one short transaction, so the loop that
//! runs them answers between two), and the file gives the pages back
//! (incremental vacuum). What is live never goes: live workers and their
//! holds, open slices, the handoff step a restart resumes from, the
//! current daemon run.

use super::{exec, Store};
use crate::error::Result;
use rusqlite::params;

/// One batch's deletions, per table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Forgotten {
    pub workers: usize,
    pub events: usize,
    pub steps: usize,
    pub slices: usize,
    pub intervals: usize,
    pub runs: usize,
    /// Rolled-up days' rows (store/rollup.rs).
    pub rollups: usize,
    /// A table had more than the batch took: another batch is due.
    pub more: bool,
}

impl Forgotten {
    pub fn rows(&self) -> usize {
        self.workers
            + self.events
            + self.steps
            + self.slices
            + self.intervals
            + self.runs
            + self.rollups
    }
}

impl Store {
    /// One batch of retention: at most `limit` rows of each kind that
    /// ended before `cutoff_ms`, in one transaction. Events go before the
    /// workers they name (an old ledger's worker events), a batch of
    /// workers with their holds and the metrics' counters of their names
    /// (when no live worker has the name). `current_run`: never deleted.
    pub fn forget_before(
        &mut self,
        cutoff_ms: i64,
        limit: usize,
        current_run: Option<i64>,
    ) -> Result<Forgotten> {
        let limit = limit.max(1) as i64;
        let tx = self.change()?;
        // Ids grow with time: the oldest events are the first ids.
        let events = exec(
            &tx,
            "DELETE FROM events WHERE id IN
               (SELECT id FROM events WHERE at_ms < ?1 ORDER BY id LIMIT ?2)",
            params![cutoff_ms, limit],
        )?;
        let mut out = Forgotten {
            events,
            ..Forgotten::default()
        };
        let events_left = events as i64 == limit;
        if !events_left {
            let ids: Vec<(i64, String)> = tx
                .prepare_cached(
                    "SELECT id, name FROM workers INDEXED BY workers_ended
                     WHERE state = 'stopped' AND ended_ms < ?1 LIMIT ?2",
                )?
                .query_map(params![cutoff_ms, limit], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<rusqlite::Result<_>>()?;
            for (id, name) in &ids {
                exec(&tx, "DELETE FROM holds WHERE worker_id = ?1", params![id])?;
                exec(&tx, "DELETE FROM workers WHERE id = ?1", params![id])?;
                exec(
                    &tx,
                    "DELETE FROM usage_counters WHERE scope = 'worker' AND key = ?1
                     AND NOT EXISTS (SELECT 1 FROM workers INDEXED BY workers_live_name
                                     WHERE name = ?1 AND state != 'stopped')",
                    params![name],
                )?;
            }
            out.workers = ids.len();
        }
        // Every step but those from the one a restart resumes from on.
        out.steps = exec(
            &tx,
            "DELETE FROM handoff_steps WHERE id IN
               (SELECT id FROM handoff_steps WHERE at_ms < ?1 AND id < coalesce(
                  (SELECT max(id) FROM handoff_steps
                   WHERE step NOT IN ('requested', 'destroyed')),
                  (SELECT max(id) FROM handoff_steps)) ORDER BY id LIMIT ?2)",
            params![cutoff_ms, limit],
        )?;
        out.slices = exec(
            &tx,
            "DELETE FROM slices WHERE id IN
               (SELECT id FROM slices INDEXED BY slices_end
                WHERE coalesce(end_ms, 9223372036854775807) < ?1 LIMIT ?2)",
            params![cutoff_ms, limit],
        )?;
        out.intervals = exec(
            &tx,
            "DELETE FROM gpu_intervals WHERE rowid IN
               (SELECT rowid FROM gpu_intervals INDEXED BY gpu_intervals_end
                WHERE to_ms < ?1 LIMIT ?2)",
            params![cutoff_ms, limit],
        )?;
        out.runs = exec(
            &tx,
            "DELETE FROM daemon_runs WHERE started_ms IN
               (SELECT started_ms FROM daemon_runs INDEXED BY daemon_runs_alive
                WHERE alive_ms < ?1 AND started_ms != ?3 LIMIT ?2)",
            params![cutoff_ms, limit, current_run.unwrap_or(i64::MIN)],
        )?;
        // Rolled-up days that ended before the cutoff; the one it falls in
        // stays whole (only its whole is known).
        let rollup_rows = exec(
            &tx,
            "DELETE FROM usage_rollup WHERE (day_ms, gpu_uuid, kind, name, owner) IN
               (SELECT day_ms, gpu_uuid, kind, name, owner FROM usage_rollup
                WHERE day_ms <= ?1 - 86400000 LIMIT ?2)",
            params![cutoff_ms, limit],
        )?;
        let rollup_days = exec(
            &tx,
            "DELETE FROM usage_days WHERE (day_ms, gpu_uuid) IN
               (SELECT day_ms, gpu_uuid FROM usage_days d WHERE day_ms <= ?1 - 86400000
                AND NOT EXISTS (SELECT 1 FROM usage_rollup r
                                WHERE r.day_ms = d.day_ms AND r.gpu_uuid = d.gpu_uuid)
                LIMIT ?2)",
            params![cutoff_ms, limit],
        )?;
        out.rollups = rollup_rows + rollup_days;
        // The report's records begin here now (see `records_from`): at the
        // cutoff, or at the start of a rolled-up day kept whole across it.
        let first_day: Option<i64> =
            tx.query_row("SELECT min(day_ms) FROM usage_days", [], |r| r.get(0))?;
        exec(
            &tx,
            "INSERT INTO ledger_meta (key, value) VALUES ('kept_from_ms', ?1)
             ON CONFLICT (key) DO UPDATE SET value = max(value, excluded.value)",
            params![first_day.map_or(cutoff_ms, |d| d.min(cutoff_ms))],
        )?;
        tx.commit()?;
        out.more = events_left
            || [
                out.workers,
                out.steps,
                out.slices,
                out.intervals,
                out.runs,
                rollup_rows,
                rollup_days,
            ]
            .iter()
            .any(|&n| n as i64 == limit);
        Ok(out)
    }

    /// Gives up to `pages` free pages back to the filesystem, keeping
    /// those the ledger holds as its room (room.rs); how many more free
    /// pages are left to give.
    pub fn shrink(&mut self, pages: u32) -> Result<u64> {
        let keep = if self.room.is_some() {
            self.pages_kept_free()?
        } else {
            0
        };
        let free = |s: &Store| -> Result<u64> {
            Ok(s.conn
                .pragma_query_value(None, "freelist_count", |r| r.get::<_, i64>(0))?
                as u64)
        };
        let spare = free(self)?.saturating_sub(keep);
        if spare == 0 {
            return Ok(0);
        }
        let pages = u64::from(pages).min(spare);
        self.conn
            .execute_batch(&format!("PRAGMA incremental_vacuum({pages})"))?;
        Ok(free(self)?.saturating_sub(keep))
    }

    /// The ledger's size in bytes (pages in use and free).
    pub fn size_bytes(&self) -> Result<u64> {
        let pages: i64 = self
            .conn
            .pragma_query_value(None, "page_count", |r| r.get(0))?;
        let size: i64 = self
            .conn
            .pragma_query_value(None, "page_size", |r| r.get(0))?;
        Ok((pages * size) as u64)
    }

    /// From when the ledger has records: its first daemon run, or where
    /// retention last cut, whichever is later (None: no run yet).
    pub fn records_from(&self) -> Result<Option<i64>> {
        let first: Option<i64> =
            self.conn
                .query_row("SELECT min(started_ms) FROM daemon_runs", [], |r| r.get(0))?;
        let cut: Option<i64> = self.conn.query_row(
            "SELECT max(value) FROM ledger_meta WHERE key = 'kept_from_ms'",
            [],
            |r| r.get(0),
        )?;
        Ok(match (first, cut) {
            (Some(f), Some(c)) => Some(f.max(c)),
            (f, c) => f.or(c),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::Grant;
    use crate::quantity::Amount;
    use crate::time::EpochMs;

    const DAY: i64 = 86_400_000;

    fn count(s: &Store, sql: &str) -> i64 {
        s.conn.query_row(sql, [], |r| r.get(0)).unwrap()
    }

    /// What ended before the cutoff goes, batch by batch (400 rows a
    /// kind here), and nothing else: a live worker whose hold began
    /// long ago, what ended after the cutoff, the open slice, the step a
    /// restart resumes from and the current run stay. An ended worker kept
    /// no request (its env) from its end on; the file shrinks once the
    /// pages are given back. Oracle: counts by hand of what was written.
    #[test]
    fn what_ended_before_the_cutoff_goes_in_batches_and_nothing_live_does() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Store::open(&dir.path().join("ledger.db")).unwrap();
        let grant = |i| Grant {
            gpu_uuid: format!("GPU-{i}"),
            gpu_index: 0,
            share: Some(Amount::from_hundredths(100)),
        };
        let secret = format!(
            r#"{{"run":{{"container":{{"image":"x","env":{{"TOKEN":"s3cret{}"}}}}}}}}"#,
            "x".repeat(20_000)
        );
        let live = s
            .insert_worker(
                "live",
                &secret,
                7,
                &[],
                Some(&[grant(0)]),
                EpochMs(DAY as u64),
            )
            .unwrap();
        for i in 0..10 {
            let id = s
                .insert_worker(
                    &format!("old{i}"),
                    &secret,
                    7,
                    &[],
                    Some(&[grant(1)]),
                    EpochMs(DAY as u64),
                )
                .unwrap();
            s.end_worker(id, EpochMs(2 * DAY as u64), Some(0), "exited", true)
                .unwrap();
        }
        let recent = s
            .insert_worker("recent", &secret, 7, &[], None, EpochMs(9 * DAY as u64))
            .unwrap();
        s.end_worker(recent, EpochMs(11 * DAY as u64), None, "stopped", false)
            .unwrap();
        assert_eq!(
            count(
                &s,
                "SELECT count(*) FROM workers WHERE spec LIKE '%s3cret%'"
            ),
            1,
            "only the live worker keeps its request"
        );
        s.conn
            .execute_batch(&format!(
                "INSERT INTO daemon_runs VALUES (0, {a}), ({b}, {c});
                 INSERT INTO events (at_ms, kind) VALUES (1, 'x'), (2, 'x'), ({c}, 'y');
                 INSERT INTO handoff_steps (at_ms, step) VALUES (1, 'requested'), (2, 'powered-off'),
                     (3, 'requested'), ({c}, 'requested');
                 INSERT INTO slices (template, user, baseboard, start_ms, end_ms)
                     VALUES ('t', 'u', 'b', 1, 2), ('t', 'u', 'b', 3, NULL);",
                a = 3 * DAY,
                b = 9 * DAY,
                c = 12 * DAY
            ))
            .unwrap();
        let rows: Vec<crate::usage::Interval> = (0..2200)
            .map(|m| crate::usage::Interval {
                gpu_uuid: "GPU-0".into(),
                from_ms: m * DAY / 200,
                to_ms: (m + 1) * DAY / 200,
                energy_mj: 5,
                utilization_pct: None,
                samples: 1,
                outside_bytes: 0,
                total_bytes: 1,
            })
            .collect();
        s.insert_intervals(&rows, None, EpochMs(0)).unwrap();
        // Pages in use: the file less its free pages (it keeps some as its
        // room, store/room.rs, which a shrink leaves).
        let used = |s: &Store| {
            let free: i64 = s
                .conn
                .pragma_query_value(None, "freelist_count", |r| r.get(0))
                .unwrap();
            s.size_bytes().unwrap() - free as u64 * s.page_size().unwrap() as u64
        };
        let before = used(&s);

        let cutoff = 10 * DAY;
        let mut batches = Vec::new();
        loop {
            let f = s.forget_before(cutoff, 400, Some(9 * DAY)).unwrap();
            batches.push(f);
            if !f.more {
                break;
            }
        }
        assert!(batches.len() >= 4, "in batches: {batches:?}");
        assert!(batches
            .iter()
            .all(|f| f.workers <= 400 && f.intervals <= 400));
        let names: Vec<String> = s
            .conn
            .prepare("SELECT name FROM workers ORDER BY id")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert_eq!(names, ["live", "recent"]);
        assert_eq!(count(&s, "SELECT count(*) FROM holds"), 1, "the live hold");
        assert_eq!(s.live_workers().unwrap()[0].id, live);
        assert_eq!(count(&s, "SELECT count(*) FROM events"), 1);
        // The last state step (powered-off) and what came after it stay.
        let steps: String = s
            .conn
            .query_row(
                "SELECT group_concat(at_ms, ',') FROM handoff_steps",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(steps, format!("2,3,{}", 12 * DAY));
        assert_eq!(
            count(&s, "SELECT count(*) FROM slices"),
            1,
            "the open slice"
        );
        assert_eq!(
            count(&s, "SELECT count(*) FROM gpu_intervals"),
            2200 - 1999,
            "those that ended before day 10 went"
        );
        assert_eq!(
            count(&s, "SELECT sum(started_ms) FROM daemon_runs"),
            9 * DAY,
            "the current run"
        );
        assert_eq!(s.records_from().unwrap(), Some(cutoff));
        while s.shrink(2).unwrap() > 0 {}
        let after = used(&s);
        assert!(after * 10 < before * 6, "{before} -> {after}");
        let kept = s.pages_kept_free().unwrap() * s.page_size().unwrap() as u64;
        let size = s.size_bytes().unwrap();
        assert!(
            size <= after + kept && size >= after + kept / 2,
            "only the room is kept free: {size} = {after} in use + {kept} kept?"
        );
    }
}
