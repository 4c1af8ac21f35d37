//! Usage rollups: a closed UTC day of every GPU's measured intervals folded
//! into each base row's exact sums (`report::roll_day`), in place of the
//! intervals. A year of reports then reads a few rows a GPU and day rather
//! than one a minute, and gives the same figures to the millisecond and the
//! millijoule (tests/report_props.rs). The sums are kept as 16-byte
//! little-endian BLOBs: a day's energy in 1/2^32 mJ passes what an SQLite
//! integer holds.

use super::usage::CurrentRun;
use super::{exec, Store};
use crate::error::{Error, Result};
use crate::report::{Base, GpuFacts, RolledDay, RowKind, Sums, DAY_MS};
use rusqlite::{params, OptionalExtension};

/// The rolled-up days a report reads, and the GPUs they were kept for.
#[derive(Debug, Default)]
pub(super) struct Rolled {
    pub days: Vec<RolledDay>,
    /// Each GPU as it was when its days were rolled (its last such day).
    pub gpus: Vec<GpuFacts>,
}

impl Rolled {
    /// Per GPU, the span its rolled-up days cover when they follow each
    /// other without a gap (as they are made, and as retention leaves
    /// them): what a hold wholly inside is no longer needed for.
    pub fn spans(&self) -> Vec<(String, i64, i64)> {
        // Per GPU: its first day, its last day's end, how many days.
        let mut per_gpu: std::collections::BTreeMap<&str, (i64, i64, i64)> = Default::default();
        for d in &self.days {
            let e = per_gpu
                .entry(d.gpu_uuid.as_str())
                .or_insert((d.day_ms, d.day_ms + DAY_MS, 0));
            e.0 = e.0.min(d.day_ms);
            e.1 = e.1.max(d.day_ms + DAY_MS);
            e.2 += 1;
        }
        per_gpu
            .into_iter()
            .filter(|(_, (from, to, n))| (to - from) / DAY_MS == *n)
            .map(|(g, (from, to, _))| (g.to_string(), from, to))
            .collect()
    }
}

impl Store {
    /// The next UTC day and GPU (of `gpus`, by index) to roll up, when the
    /// day ended by `until_ms`: the last day rolled, for a GPU that lacks
    /// it; else the day after it; else the first day with a measured
    /// interval. A GPU at a time: a batch holds the loop a few ms.
    /// None too while the ledger's disk is under `history.min_free_mb`:
    /// a rollup can wait, and must not spend the room kept for stops.
    pub fn next_to_roll(&self, until_ms: i64, gpus: &[GpuFacts]) -> Result<Option<(i64, usize)>> {
        if gpus.is_empty() || self.room_for_new_work().is_err() {
            return Ok(None);
        }
        let last: Option<i64> =
            self.conn
                .query_row("SELECT max(day_ms) FROM usage_days", [], |r| r.get(0))?;
        let next = match last {
            Some(day) => {
                for (i, gpu) in gpus.iter().enumerate() {
                    if !self.is_rolled_up(&gpu.uuid, day)? {
                        return Ok(Some((day, i)));
                    }
                }
                day + DAY_MS
            }
            None => {
                // By the end index: the earliest interval to end.
                let first: Option<i64> = self.conn.query_row(
                    "SELECT min(to_ms) FROM gpu_intervals INDEXED BY gpu_intervals_end",
                    [],
                    |r| r.get(0),
                )?;
                match first {
                    Some(t) => crate::report::day_start(t - 1),
                    None => return Ok(None),
                }
            }
        };
        Ok((next.saturating_add(DAY_MS) <= until_ms).then_some((next, 0)))
    }

    /// Folds the day from `day_ms` of `gpu` into its sums and deletes the
    /// intervals that are then wholly rolled up, in one transaction; how
    /// many intervals went. `current`: this run, as the report sees it.
    pub fn roll_up_day(
        &mut self,
        day_ms: i64,
        gpu: &GpuFacts,
        current: Option<CurrentRun>,
    ) -> Result<usize> {
        if day_ms != crate::report::day_start(day_ms) {
            return Err(Error::Backend(format!(
                "usage rollup: {day_ms} is not the start of a UTC day"
            )));
        }
        let end = day_ms + DAY_MS;
        // Read, then written in one transaction: the loop is the one writer.
        let facts = self.facts_in(
            day_ms,
            end,
            current,
            vec![gpu.clone()],
            Some(&gpu.uuid),
            &[],
        )?;
        let day = crate::report::roll_day(day_ms, gpu, &facts.ledger());
        let tx = self.change()?;
        exec(
            &tx,
            "INSERT OR REPLACE INTO usage_days (gpu_uuid, day_ms, gpu_index, total_bytes, energy_mj)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![
                gpu.uuid,
                day_ms,
                gpu.index,
                gpu.total_bytes as i64,
                day.energy_mj as i64
            ],
        )?;
        for (base, sums) in &day.sums {
            let (name, owner) = match base {
                Base::Worker { worker, owner } => (worker.as_str(), owner.as_str()),
                Base::Slice { template, user } => (template.as_str(), user.as_str()),
                _ => ("", ""),
            };
            exec(
                &tx,
                "INSERT OR REPLACE INTO usage_rollup
                 (day_ms, gpu_uuid, kind, name, owner, ms, energy, busy)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    day_ms,
                    gpu.uuid,
                    base.kind().as_str(),
                    name,
                    owner,
                    sums.ms.to_le_bytes(),
                    sums.energy.to_le_bytes(),
                    sums.busy.map(u128::to_le_bytes)
                ],
            )?;
        }
        // Intervals whose every day is rolled up now: from the GPU's first
        // rolled day to this day's end (by the primary key).
        let first: i64 = tx.query_row(
            "SELECT min(day_ms) FROM usage_days WHERE gpu_uuid = ?1",
            params![gpu.uuid],
            |r| r.get(0),
        )?;
        let folded = exec(
            &tx,
            "DELETE FROM gpu_intervals
             WHERE gpu_uuid = ?1 AND from_ms >= ?2 AND from_ms < ?3 AND to_ms <= ?3",
            params![gpu.uuid, first, end],
        )?;
        tx.commit()?;
        Ok(folded)
    }

    /// The rolled-up days that overlap [from_ms, to_ms), every GPU's.
    pub(super) fn rolled_in(&self, from_ms: i64, to_ms: i64) -> Result<Rolled> {
        let mut out = Rolled::default();
        let lo = from_ms.saturating_sub(DAY_MS);
        // Both tables in their key's order (day, GPU, …): the sums are
        // matched to their day walking the two side by side.
        let mut stmt = self.conn.prepare_cached(
            "SELECT gpu_uuid, day_ms, gpu_index, total_bytes, energy_mj FROM usage_days
             WHERE day_ms > ?1 AND day_ms < ?2 ORDER BY day_ms, gpu_uuid",
        )?;
        let rows = stmt.query_map(params![lo, to_ms], |r| {
            Ok((
                RolledDay {
                    gpu_uuid: r.get(0)?,
                    day_ms: r.get(1)?,
                    energy_mj: r.get::<_, i64>(4)? as u64,
                    sums: Vec::new(),
                },
                GpuFacts {
                    uuid: r.get(0)?,
                    index: r.get(2)?,
                    total_bytes: r.get::<_, i64>(3)? as u64,
                },
            ))
        })?;
        for row in rows {
            let (day, gpu) = row?;
            out.days.push(day);
            // Ordered by day: the last listing of a GPU is its latest.
            match out.gpus.iter_mut().find(|g| g.uuid == gpu.uuid) {
                Some(g) => *g = gpu,
                None => out.gpus.push(gpu),
            }
        }
        let mut stmt = self.conn.prepare_cached(
            "SELECT day_ms, gpu_uuid, kind, name, owner, ms, energy, busy FROM usage_rollup
             WHERE day_ms > ?1 AND day_ms < ?2 ORDER BY day_ms, gpu_uuid",
        )?;
        let mut rows = stmt.query(params![lo, to_ms])?;
        let mut i = 0;
        while let Some(r) = rows.next()? {
            let day: i64 = r.get(0)?;
            let gpu = text(r, 1)?;
            while i < out.days.len()
                && (out.days[i].day_ms, out.days[i].gpu_uuid.as_str()) < (day, gpu)
            {
                i += 1;
            }
            let Some(d) = out.days.get_mut(i) else {
                break;
            };
            if (d.day_ms, d.gpu_uuid.as_str()) != (day, gpu) {
                continue; // sums without their day: not kept
            }
            let (name, owner) = (r.get::<_, String>(3)?, r.get::<_, String>(4)?);
            let base = match text(r, 2)? {
                k if k == RowKind::Worker.as_str() => Base::Worker {
                    worker: name,
                    owner,
                },
                k if k == RowKind::Slice.as_str() => Base::Slice {
                    template: name,
                    user: owner,
                },
                k if k == RowKind::Outside.as_str() => Base::Outside,
                k if k == RowKind::Idle.as_str() => Base::Idle,
                k if k == RowKind::Downtime.as_str() => Base::Downtime,
                k if k == RowKind::Unrecorded.as_str() => Base::Unrecorded,
                other => {
                    return Err(Error::Backend(format!(
                        "ledger: a usage rollup of kind {other:?}, which this build does not know"
                    )))
                }
            };
            let sums = Sums {
                ms: units(r, 5)?,
                energy: units(r, 6)?,
                busy: match r.get_ref(7)? {
                    rusqlite::types::ValueRef::Null => None,
                    _ => Some(units(r, 7)?),
                },
            };
            d.sums.push((base, sums));
        }
        Ok(out)
    }

    /// Whether the day from `day_ms` is rolled up for `gpu`.
    pub fn is_rolled_up(&self, gpu: &str, day_ms: i64) -> Result<bool> {
        Ok(self
            .conn
            .query_row(
                "SELECT 1 FROM usage_days WHERE gpu_uuid = ?1 AND day_ms = ?2",
                params![gpu, day_ms],
                |_| Ok(()),
            )
            .optional()?
            .is_some())
    }
}

/// A rollup's sum, as kept: 16 bytes, little-endian (a day's energy in
/// 1/2^32 mJ passes what an SQLite integer holds).
fn units(r: &rusqlite::Row<'_>, column: usize) -> Result<u128> {
    let bytes = r.get_ref(column)?.as_blob().ok();
    bytes
        .and_then(|b| <[u8; 16]>::try_from(b).ok())
        .map(u128::from_le_bytes)
        .ok_or_else(|| {
            Error::Backend(format!(
                "ledger: a usage rollup holds something other than a 16-byte sum in column {column}"
            ))
        })
}

/// A text column, borrowed from the row.
fn text<'r>(r: &'r rusqlite::Row<'_>, column: usize) -> Result<&'r str> {
    r.get_ref(column)?
        .as_str()
        .map_err(|e| Error::Backend(format!("ledger: a usage rollup's column {column}: {e}")))
}

#[cfg(test)]
mod tests {
    use crate::report::{day_start, GpuFacts, GroupBy, DAY_MS};
    use crate::store::{CurrentRun, Store};
    use rusqlite::params;

    const MINUTE: i64 = 60_000;
    /// A day's start, some way after the epoch.
    const D0: i64 = 20_000 * DAY_MS;

    fn gpus() -> Vec<GpuFacts> {
        (0..2)
            .map(|i| GpuFacts {
                uuid: format!("GPU-{i}"),
                index: i,
                total_bytes: 3 << 30,
            })
            .collect()
    }

    /// Four days and a bit of history on two GPUs of 3 GiB: two daemon
    /// runs with a gap of downtime, an interval a minute while up with
    /// energy, utilisation and outside memory that move, and workers of
    /// two owners (shares that do not divide the GPU evenly; one that
    /// launched and so runs while the daemon is down; holds that span
    /// midnights). Counted into the metrics up to `now`.
    fn history(now: i64) -> Store {
        history_in(Store::open_in_memory().unwrap(), now)
    }

    /// [`history`] in `store`.
    fn history_in(store: Store, now: i64) -> Store {
        let tx = store.conn.unchecked_transaction().unwrap();
        let start = D0 + 5 * 3_600_000 + 7;
        let gap = (D0 + 2 * DAY_MS - 3_600_000, D0 + 2 * DAY_MS + 7_200_000);
        for (a, b) in [(start, gap.0), (gap.1, now)] {
            tx.execute(
                "INSERT INTO daemon_runs (started_ms, alive_ms) VALUES (?1, ?2)",
                params![a, b],
            )
            .unwrap();
            let mut t = a;
            let mut k: i64 = 0;
            while t + MINUTE <= b {
                for g in 0..2i64 {
                    tx.execute(
                        "INSERT INTO gpu_intervals (gpu_uuid, from_ms, to_ms, energy_mj,
                           utilization_pct, samples, outside_bytes, total_bytes)
                         VALUES (?1, ?2, ?3, ?4, ?5, 1, ?6, ?7)",
                        params![
                            format!("GPU-{g}"),
                            t,
                            t + MINUTE,
                            1_000_003 + (k * 7919 + g) % 65_537,
                            (k + g) % 101,
                            ((k * 31 + g) % 17) << 26,
                            3i64 << 30
                        ],
                    )
                    .unwrap();
                }
                t += MINUTE;
                k += 1;
            }
        }
        // Name, owner, request, GPU, from, to, share in hundredths of a GB.
        type Worker<'a> = (&'a str, u32, &'a str, i64, i64, Option<i64>, i64);
        let workers: [Worker; 5] = [
            (
                "asr",
                1000,
                "{}",
                0,
                start + 1_000,
                Some(D0 + DAY_MS + 123_457),
                33,
            ),
            (
                "tts",
                1001,
                r#"{"run":{}}"#,
                0,
                D0 + 20 * 3_600_000,
                None,
                67,
            ),
            (
                "emb",
                1000,
                "{}",
                1,
                start + 99,
                Some(D0 + 3 * DAY_MS + 1),
                45,
            ),
            (
                "llm",
                1001,
                r#"{"run":{}}"#,
                1,
                D0 + DAY_MS + 13,
                Some(D0 + 2 * DAY_MS + 3_600_000),
                100,
            ),
            ("big", 1000, "{}", 0, D0 + 3 * DAY_MS + 77, None, 200),
        ];
        for (id, (name, uid, spec, gpu, from, to, hundredths)) in workers.iter().enumerate() {
            tx.execute(
                "INSERT INTO workers (id, name, spec, owner_uid, state, submitted_ms, started_ms, ended_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6, ?7)",
                params![id as i64 + 1, name, spec, uid, if to.is_some() { "stopped" } else { "running" }, from, to],
            )
            .unwrap();
            tx.execute(
                "INSERT INTO holds (worker_id, gpu_uuid, gpu_index, share_hundredths, from_ms, to_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![id as i64 + 1, format!("GPU-{gpu}"), gpu, hundredths, from, to],
            )
            .unwrap();
        }
        tx.execute(
            "INSERT INTO usage_counted (id, until_ms) VALUES (1, ?1)",
            params![now],
        )
        .unwrap();
        tx.commit().unwrap();
        store
    }

    fn report(store: &Store, from: i64, to: i64, by: GroupBy, now: i64) -> Vec<crate::report::Row> {
        let current = CurrentRun {
            started_ms: D0 + 2 * DAY_MS + 7_200_000,
            now_ms: now,
            open: Vec::new(),
        };
        store
            .usage_report(from, to, by, Some(current), gpus(), |uid| {
                format!("user{uid}")
            })
            .unwrap()
    }

    fn intervals(store: &Store) -> i64 {
        store
            .conn
            .query_row("SELECT count(*) FROM gpu_intervals", [], |r| r.get(0))
            .unwrap()
    }

    /// Every closed day rolled up: the same report from every window (the
    /// whole history, whole days, and edges inside rolled-up days, which
    /// widen to those days' edges), in every grouping; the intervals of
    /// those days gone; the open day left raw.
    #[test]
    fn reports_over_rolled_up_days_equal_those_over_the_intervals() {
        let now = D0 + 4 * DAY_MS + 5 * 3_600_000 + 11;
        let raw = history(now);
        let mut rolled = history(now);
        let current = |now_ms| CurrentRun {
            started_ms: D0 + 2 * DAY_MS + 7_200_000,
            now_ms,
            open: Vec::new(),
        };
        let mut days = Vec::new();
        let until = now - DAY_MS;
        while let Some((day, i)) = rolled.next_to_roll(until, &gpus()).unwrap() {
            rolled
                .roll_up_day(day, &gpus()[i], Some(current(now)))
                .unwrap();
            days.push(day);
        }
        days.dedup();
        // The first day has intervals from 05:00; the fourth ends a day before now.
        assert_eq!(days, [D0, D0 + DAY_MS, D0 + 2 * DAY_MS]);
        let left: i64 = rolled
            .conn
            .query_row("SELECT min(from_ms) FROM gpu_intervals", [], |r| r.get(0))
            .unwrap();
        assert!(
            left >= D0 + 3 * DAY_MS,
            "an interval of a rolled-up day is left"
        );
        assert!(intervals(&rolled) < intervals(&raw) / 3);

        let windows = [
            (D0 - DAY_MS, now),
            (D0, D0 + 3 * DAY_MS),
            (D0 + DAY_MS, now),
            (D0 + 3 * 3_600_000, D0 + 2 * DAY_MS + 5),
            (D0 + DAY_MS + 1, D0 + 3 * DAY_MS + 4_000_000),
        ];
        for (from, to) in windows {
            let (wide_from, wide_to) = (
                if from > D0 && from < D0 + 3 * DAY_MS {
                    day_start(from)
                } else {
                    from
                },
                if to > D0 && to < D0 + 3 * DAY_MS && to != day_start(to) {
                    day_start(to) + DAY_MS
                } else {
                    to
                },
            );
            for by in [GroupBy::Worker, GroupBy::Owner, GroupBy::Gpu, GroupBy::User] {
                let want = report(&raw, wide_from, wide_to, by, now);
                assert!(!want.is_empty());
                assert_eq!(
                    report(&rolled, from, to, by, now),
                    want,
                    "{from}..{to} by {by}"
                );
            }
        }
        // Owners are named once the report is made.
        let by_owner = report(&rolled, D0, now, GroupBy::Owner, now);
        assert!(by_owner.iter().any(|r| r.key == "user1001"), "{by_owner:?}");
    }

    /// Rolling a day waits until it is counted into the metrics and a
    /// day old, and never starts inside a day.
    #[test]
    fn only_closed_counted_days_are_rolled_up() {
        let now = D0 + 4 * DAY_MS + 5 * 3_600_000;
        let mut store = history(now);
        assert_eq!(store.next_to_roll(D0 + DAY_MS - 1, &gpus()).unwrap(), None);
        assert_eq!(
            store.next_to_roll(D0 + DAY_MS, &gpus()).unwrap(),
            Some((D0, 0))
        );
        assert!(store.roll_up_day(D0 + 5, &gpus()[0], None).is_err());
        store.roll_up_day(D0, &gpus()[0], None).unwrap();
        // The day's other GPU next, even once later days are due.
        assert_eq!(store.next_to_roll(now, &gpus()).unwrap(), Some((D0, 1)));
        assert_eq!(
            store.next_to_roll(D0 + DAY_MS, &gpus()).unwrap(),
            Some((D0, 1))
        );
        store.roll_up_day(D0, &gpus()[1], None).unwrap();
        assert!(store.is_rolled_up("GPU-1", D0).unwrap());
        assert_eq!(
            store.next_to_roll(now, &gpus()).unwrap(),
            Some((D0 + DAY_MS, 0))
        );
    }

    /// Under the floor of free space nothing is rolled up (it can wait;
    /// the room is kept for stops); with room again, the due day is.
    #[test]
    fn nothing_is_rolled_up_under_the_floor_of_free_space() {
        let now = D0 + 4 * DAY_MS + 5 * 3_600_000;
        let dir = tempfile::tempdir().unwrap();
        let mut store = history_in(Store::open(&dir.path().join("ledger.db")).unwrap(), now);
        store.set_min_free(u64::MAX / 2);
        assert_eq!(store.next_to_roll(now, &gpus()).unwrap(), None);
        store.set_min_free(0);
        assert_eq!(store.next_to_roll(now, &gpus()).unwrap(), Some((D0, 0)));
    }

    /// Retention deletes the rolled-up days before its cutoff, keeps the
    /// one it falls in whole, and the report's records begin there.
    #[test]
    fn retention_forgets_rolled_up_days_and_keeps_the_one_it_cuts() {
        let now = D0 + 4 * DAY_MS + 5 * 3_600_000;
        let mut store = history(now);
        while let Some((day, i)) = store.next_to_roll(now - DAY_MS, &gpus()).unwrap() {
            store.roll_up_day(day, &gpus()[i], None).unwrap();
        }
        let cutoff = D0 + DAY_MS + 3_600_000;
        while store.forget_before(cutoff, 3, None).unwrap().more {}
        let days: Vec<i64> = store
            .conn
            .prepare("SELECT DISTINCT day_ms FROM usage_rollup ORDER BY day_ms")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert_eq!(days, [D0 + DAY_MS, D0 + 2 * DAY_MS]);
        assert!(!store.is_rolled_up("GPU-0", D0).unwrap());
        assert!(store.is_rolled_up("GPU-0", D0 + DAY_MS).unwrap());
        assert_eq!(store.records_from().unwrap(), Some(D0 + DAY_MS));
    }
}
