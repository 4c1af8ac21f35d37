//! Usage rollups: a closed UTC day of every GPU's measured intervals folded
//! into each base row's exact sums (`report::roll_day`), in place of the
//! intervals. A year of reports then reads one row a GPU and day rather
//! than one a minute, and gives the same figures to the millisecond and the
//! millijoule (tests/report_props.rs). A day's sums are kept in one BLOB
//! (`usage_days.sums`, [`encode`]): a report over a year reads 2,920 rows
//! on 8 GPUs, not the 75,000 a row per base row and day made (a third of
//! the report's time went to SQLite stepping through them). Days an older
//! build rolled up keep that row per base row (`usage_rollup`), and are
//! read as they are.

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
            &Default::default(),
        )?;
        let day = crate::report::roll_day(day_ms, gpu, &facts.ledger());
        let tx = self.change()?;
        exec(
            &tx,
            "INSERT OR REPLACE INTO usage_days (gpu_uuid, day_ms, gpu_index, total_bytes, energy_mj, sums)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![
                gpu.uuid,
                day_ms,
                gpu.index,
                gpu.total_bytes as i64,
                day.energy_mj as i64,
                encode(&day.sums)
            ],
        )?;
        // One truth per day: no rows of the older form beside the BLOB.
        exec(
            &tx,
            "DELETE FROM usage_rollup WHERE day_ms = ?1 AND gpu_uuid = ?2",
            params![day_ms, gpu.uuid],
        )?;
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
        let mut stmt = self.conn.prepare_cached(
            "SELECT gpu_uuid, day_ms, gpu_index, total_bytes, energy_mj, sums FROM usage_days
             WHERE day_ms > ?1 AND day_ms < ?2 ORDER BY day_ms, gpu_uuid",
        )?;
        let mut rows = stmt.query(params![lo, to_ms])?;
        let mut older_form = false;
        while let Some(r) = rows.next()? {
            let gpu = GpuFacts {
                uuid: r.get(0)?,
                index: r.get(2)?,
                total_bytes: r.get::<_, i64>(3)? as u64,
            };
            let day_ms: i64 = r.get(1)?;
            let sums = match r.get_ref(5)? {
                rusqlite::types::ValueRef::Null => {
                    older_form = true;
                    Vec::new()
                }
                v => decode(v.as_blob().unwrap_or_default()).map_err(|why| {
                    Error::Backend(format!(
                        "ledger: the rolled-up day {day_ms} of GPU {} cannot be read: {why}",
                        gpu.uuid
                    ))
                })?,
            };
            out.days.push(RolledDay {
                gpu_uuid: gpu.uuid.clone(),
                day_ms,
                energy_mj: r.get::<_, i64>(4)? as u64,
                sums,
            });
            // Ordered by day: the last listing of a GPU is its latest.
            match out.gpus.iter_mut().find(|g| g.uuid == gpu.uuid) {
                Some(g) => *g = gpu,
                None => out.gpus.push(gpu),
            }
        }
        if older_form {
            self.older_form_into(lo, to_ms, &mut out.days)?;
        }
        Ok(out)
    }

    /// The sums of days an older build rolled up, a row per base row, into
    /// `days` (those without a BLOB). Both in their key's order (day, GPU,
    /// …): the sums are matched to their day walking the two side by side.
    fn older_form_into(&self, lo: i64, to_ms: i64, days: &mut [RolledDay]) -> Result<()> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT day_ms, gpu_uuid, kind, name, owner, ms, energy, busy FROM usage_rollup
             WHERE day_ms > ?1 AND day_ms < ?2 ORDER BY day_ms, gpu_uuid",
        )?;
        let mut rows = stmt.query(params![lo, to_ms])?;
        let mut i = 0;
        while let Some(r) = rows.next()? {
            let day: i64 = r.get(0)?;
            let gpu = text(r, 1)?;
            while i < days.len() && (days[i].day_ms, days[i].gpu_uuid.as_str()) < (day, gpu) {
                i += 1;
            }
            let Some(d) = days.get_mut(i) else {
                break;
            };
            if (d.day_ms, d.gpu_uuid.as_str()) != (day, gpu) {
                continue; // sums without their day: not kept
            }
            let (name, owner) = (r.get::<_, String>(3)?, r.get::<_, String>(4)?);
            let kind = text(r, 2)?;
            let base = KINDS
                .into_iter()
                .find(|k| k.as_str() == kind)
                .map(|k| base_of(k, name, owner))
                .ok_or_else(|| {
                    Error::Backend(format!(
                        "ledger: a usage rollup of kind {kind:?}, which this build does not know"
                    ))
                })?;
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
        Ok(())
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

/// The base row of `kind` with its name and owner (empty for the kinds
/// that have none).
fn base_of(kind: RowKind, name: String, owner: String) -> Base {
    match kind {
        RowKind::Worker => Base::Worker {
            worker: name,
            owner,
        },
        RowKind::Slice => Base::Slice {
            template: name,
            user: owner,
        },
        RowKind::Outside => Base::Outside,
        RowKind::Idle => Base::Idle,
        RowKind::Downtime => Base::Downtime,
        RowKind::Unrecorded => Base::Unrecorded,
    }
}

/// The form of `usage_days.sums`: this byte, how many base rows (u32 LE;
/// a BLOB cut short is then always seen), then per base row its kind
/// (a byte: [`KINDS`]' index), name and owner (each a u32 LE length and
/// UTF-8), time and energy (u128 LE each), and a byte saying whether busy
/// time follows (u128 LE).
const SUMS_FORM: u8 = 1;
const KINDS: [RowKind; 6] = [
    RowKind::Worker,
    RowKind::Slice,
    RowKind::Outside,
    RowKind::Idle,
    RowKind::Downtime,
    RowKind::Unrecorded,
];

/// A day's sums as kept in `usage_days.sums`.
fn encode(sums: &[(Base, Sums)]) -> Vec<u8> {
    let mut out = vec![SUMS_FORM];
    out.extend_from_slice(&(sums.len() as u32).to_le_bytes());
    for (base, s) in sums {
        let (name, owner) = match base {
            Base::Worker { worker, owner } => (worker.as_str(), owner.as_str()),
            Base::Slice { template, user } => (template.as_str(), user.as_str()),
            _ => ("", ""),
        };
        let kind = KINDS
            .iter()
            .position(|k| *k == base.kind())
            .expect("every kind is listed");
        out.push(kind as u8);
        for text in [name, owner] {
            out.extend_from_slice(&(text.len() as u32).to_le_bytes());
            out.extend_from_slice(text.as_bytes());
        }
        out.extend_from_slice(&s.ms.to_le_bytes());
        out.extend_from_slice(&s.energy.to_le_bytes());
        match s.busy {
            Some(b) => {
                out.push(1);
                out.extend_from_slice(&b.to_le_bytes());
            }
            None => out.push(0),
        }
    }
    out
}

/// `usage_days.sums` read back, or what is wrong with it.
fn decode(bytes: &[u8]) -> std::result::Result<Vec<(Base, Sums)>, String> {
    let (&form, rest) = bytes.split_first().ok_or("it is empty")?;
    if form != SUMS_FORM {
        return Err(format!(
            "its form is {form}; this build reads form {SUMS_FORM}"
        ));
    }
    let mut r = Bytes(rest);
    let count = u32::from_le_bytes(r.take(4)?.try_into().expect("4 bytes"));
    // Room for them all at once (growing it showed in a year's report),
    // but never more than the bytes can hold: a base row takes at least
    // its kind, two lengths, two sums and the busy flag.
    const SMALLEST_ROW: usize = 1 + 4 + 4 + 16 + 16 + 1;
    let mut out = Vec::with_capacity((count as usize).min(r.0.len() / SMALLEST_ROW));
    for _ in 0..count {
        let kind = *KINDS
            .get(r.take(1)?[0] as usize)
            .ok_or("a base row of an unknown kind")?;
        let (name, owner) = (r.text()?, r.text()?);
        let (ms, energy) = (r.units()?, r.units()?);
        let busy = match r.take(1)?[0] {
            0 => None,
            1 => Some(r.units()?),
            _ => return Err("a busy flag other than 0 or 1".into()),
        };
        out.push((base_of(kind, name, owner), Sums { ms, energy, busy }));
    }
    if !r.0.is_empty() {
        return Err("it goes on after its last base row".into());
    }
    Ok(out)
}

/// What is left of a BLOB being read.
struct Bytes<'a>(&'a [u8]);

impl<'a> Bytes<'a> {
    fn take(&mut self, n: usize) -> std::result::Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err("it ends in the middle of a base row".into());
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    fn text(&mut self) -> std::result::Result<String, String> {
        let len = u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")) as usize;
        String::from_utf8(self.take(len)?.to_vec()).map_err(|_| "a name that is not UTF-8".into())
    }

    fn units(&mut self) -> std::result::Result<u128, String> {
        Ok(u128::from_le_bytes(
            self.take(16)?.try_into().expect("16 bytes"),
        ))
    }
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
            .0
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
            .prepare("SELECT DISTINCT day_ms FROM usage_days ORDER BY day_ms")
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

    /// A day's sums read back as written, whatever the names hold; a BLOB
    /// cut short, of another form, or with a byte out of place is an error
    /// that says so, never sums made up.
    #[test]
    fn a_days_sums_read_back_as_written_or_say_what_is_wrong() {
        use super::{decode, encode};
        use crate::report::{Base, Sums};
        let sums = vec![
            (
                Base::Worker {
                    worker: "asr-ü\u{1F600}".into(),
                    owner: "1000".into(),
                },
                Sums {
                    ms: u128::MAX - 7,
                    energy: 1 << 100,
                    busy: Some(42),
                },
            ),
            (
                Base::Slice {
                    template: "".into(),
                    user: "root".into(),
                },
                Sums {
                    ms: 0,
                    energy: 3,
                    busy: None,
                },
            ),
            (Base::Outside, Sums::default()),
            (
                Base::Idle,
                Sums {
                    ms: 1,
                    energy: 2,
                    busy: Some(0),
                },
            ),
            (Base::Downtime, Sums::default()),
            (Base::Unrecorded, Sums::default()),
        ];
        let bytes = encode(&sums);
        assert_eq!(decode(&bytes).unwrap(), sums);
        assert_eq!(decode(&encode(&[])).unwrap(), vec![]);
        for cut in 1..bytes.len() {
            assert!(decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode(&longer).unwrap_err().contains("goes on"));
        assert!(decode(&[]).unwrap_err().contains("empty"));
        let mut other = bytes.clone();
        other[0] = 2;
        assert!(decode(&other).unwrap_err().contains("its form is 2"));
        let mut kind = bytes.clone();
        kind[5] = 6;
        assert!(decode(&kind).unwrap_err().contains("unknown kind"));
        let mut flag = encode(&sums[2..3]);
        let last = flag.len() - 1;
        flag[last] = 2;
        assert!(decode(&flag).unwrap_err().contains("busy flag"));
    }

    /// Days an older build rolled up (a row per base row in usage_rollup,
    /// no BLOB) give the report what the same days kept as a BLOB give, in
    /// every grouping; a day rolled up again is kept in one form only.
    #[test]
    fn days_an_older_build_rolled_up_report_as_they_did() {
        let now = D0 + 4 * DAY_MS + 5 * 3_600_000 + 11;
        let mut store = history(now);
        while let Some((day, i)) = store.next_to_roll(now - DAY_MS, &gpus()).unwrap() {
            store.roll_up_day(day, &gpus()[i], None).unwrap();
        }
        let by = [GroupBy::Worker, GroupBy::Owner, GroupBy::Gpu, GroupBy::User];
        let blobs: Vec<_> = by
            .iter()
            .map(|&b| report(&store, D0, now, b, now))
            .collect();
        // Each day as an older build kept it.
        let days: Vec<(i64, String, Vec<u8>)> = store
            .conn
            .prepare("SELECT day_ms, gpu_uuid, sums FROM usage_days")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert!(!days.is_empty());
        for (day, gpu, bytes) in &days {
            for (base, sums) in super::decode(bytes).unwrap() {
                let (name, owner) = match &base {
                    crate::report::Base::Worker { worker, owner } => {
                        (worker.clone(), owner.clone())
                    }
                    crate::report::Base::Slice { template, user } => {
                        (template.clone(), user.clone())
                    }
                    _ => (String::new(), String::new()),
                };
                store
                    .conn
                    .execute(
                        "INSERT INTO usage_rollup (day_ms, gpu_uuid, kind, name, owner, ms, energy, busy)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                        params![
                            day,
                            gpu,
                            base.kind().as_str(),
                            name,
                            owner,
                            sums.ms.to_le_bytes(),
                            sums.energy.to_le_bytes(),
                            sums.busy.map(u128::to_le_bytes)
                        ],
                    )
                    .unwrap();
            }
        }
        store
            .conn
            .execute("UPDATE usage_days SET sums = NULL", [])
            .unwrap();
        let rows: Vec<_> = by
            .iter()
            .map(|&b| report(&store, D0, now, b, now))
            .collect();
        assert_eq!(rows, blobs);
        // Rolled up again: the BLOB, and the older rows of that day gone.
        let (day, gpu, _) = &days[0];
        let facts = gpus().into_iter().find(|g| &g.uuid == gpu).unwrap();
        store.roll_up_day(*day, &facts, None).unwrap();
        let older: i64 = store
            .conn
            .query_row(
                "SELECT count(*) FROM usage_rollup WHERE day_ms = ?1 AND gpu_uuid = ?2",
                params![day, gpu],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(older, 0);
    }
}
