//! The ledger's schema: versioned migrations, and the oldest SQLite they run on.

/// The oldest SQLite the ledger's SQL runs on, as a number and in words.
pub(super) const MIN_SQLITE: (i32, &str) = (3_024_000, "3.24");

/// Versioned migrations: entry N brings the schema from version N to N+1.
pub(super) const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE workers (
    id            INTEGER PRIMARY KEY,
    name          TEXT NOT NULL,
    spec          TEXT NOT NULL,
    owner_uid     INTEGER NOT NULL,
    holders       TEXT NOT NULL DEFAULT '[]',
    state         TEXT NOT NULL CHECK (state IN ('pending', 'running', 'stopped')),
    submitted_ms  INTEGER NOT NULL,
    started_ms    INTEGER,
    ended_ms      INTEGER
);
-- A name belongs to at most one live worker.
CREATE UNIQUE INDEX workers_live_name ON workers(name) WHERE state != 'stopped';
CREATE INDEX workers_state ON workers(state);
CREATE TABLE allocations (
    worker_id        INTEGER NOT NULL REFERENCES workers(id),
    gpu_uuid         TEXT NOT NULL,
    gpu_index        INTEGER NOT NULL,
    share_hundredths INTEGER,
    PRIMARY KEY (worker_id, gpu_uuid)
);
CREATE TABLE events (
    id         INTEGER PRIMARY KEY,
    at_ms      INTEGER NOT NULL,
    worker_id  INTEGER REFERENCES workers(id),
    kind       TEXT NOT NULL,
    detail     TEXT NOT NULL DEFAULT ''
);
CREATE INDEX events_worker ON events(worker_id);
"#,
    r#"
-- A template's scheduled actions, normalized (+N already resolved).
CREATE TABLE schedules (
    template  TEXT PRIMARY KEY,
    actions   TEXT NOT NULL,
    set_ms    INTEGER NOT NULL
);
"#,
    r#"
-- Per-GPU energy and utilisation, one row per closed interval.
CREATE TABLE gpu_intervals (
    gpu_uuid         TEXT NOT NULL,
    from_ms          INTEGER NOT NULL,
    to_ms            INTEGER NOT NULL,
    energy_mj        INTEGER NOT NULL,
    utilization_pct  INTEGER,
    samples          INTEGER NOT NULL,
    PRIMARY KEY (gpu_uuid, from_ms)
);
"#,
    r#"
-- Launched workers: the runtime's id (container id), and how a worker ended.
ALTER TABLE workers ADD COLUMN runtime_id TEXT;
ALTER TABLE workers ADD COLUMN exit_status INTEGER;
ALTER TABLE workers ADD COLUMN end_reason TEXT;
"#,
    r#"
-- A launched worker's control group: GPU processes in it are its own.
ALTER TABLE workers ADD COLUMN cgroup TEXT;
"#,
    r#"
-- Who held what and when, kept after a worker ends (allocations hold only
-- the live promises): the usage report is computed from this.
CREATE TABLE holds (
    worker_id        INTEGER NOT NULL REFERENCES workers(id),
    gpu_uuid         TEXT NOT NULL,
    gpu_index        INTEGER NOT NULL,
    share_hundredths INTEGER,
    from_ms          INTEGER NOT NULL,
    to_ms            INTEGER,
    PRIMARY KEY (worker_id, gpu_uuid)
);
CREATE INDEX holds_time ON holds(from_ms, to_ms);
INSERT INTO holds (worker_id, gpu_uuid, gpu_index, share_hundredths, from_ms)
    SELECT a.worker_id, a.gpu_uuid, a.gpu_index, a.share_hundredths, w.started_ms
    FROM allocations a JOIN workers w ON w.id = a.worker_id;
-- Memory held outside Astraeus (mean over the interval's samples) and the GPU's size.
ALTER TABLE gpu_intervals ADD COLUMN outside_bytes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE gpu_intervals ADD COLUMN total_bytes INTEGER NOT NULL DEFAULT 0;
-- When the daemon ran: from its start to its last sign of life (each usage
-- interval and a clean stop); the gaps are downtime in the report.
CREATE TABLE daemon_runs (
    started_ms INTEGER PRIMARY KEY,
    alive_ms   INTEGER NOT NULL
);
"#,
    r#"
-- Time-slicing templates (their JSON, as created) and every handoff step
-- with its time: a daemon killed mid-handoff resumes from the last one.
CREATE TABLE templates (
    name       TEXT PRIMARY KEY,
    spec       TEXT NOT NULL,
    created_ms INTEGER NOT NULL
);
-- One row per time slice: who it served, its handoff and start figures,
-- and what was measured over it (NULL = not reported, never zero).
CREATE TABLE slices (
    id                INTEGER PRIMARY KEY,
    template          TEXT NOT NULL,
    user              TEXT NOT NULL,
    baseboard         TEXT NOT NULL,
    start_ms          INTEGER NOT NULL,
    end_ms            INTEGER,
    dead_time_ms      INTEGER,
    start_to_ready_ms INTEGER,
    cpu_avg_pct       REAL,
    cpu_peak_pct      REAL,
    gpu_avg_pct       REAL,
    gpu_peak_pct      REAL,
    gpu_memory_peak_bytes INTEGER,
    energy_j          REAL,
    error             TEXT
);
CREATE INDEX slices_time ON slices(start_ms, end_ms);
-- The content staged on each template's weights disk (staging is a no-op
-- when the checksum is the same).
CREATE TABLE weights (
    template  TEXT PRIMARY KEY,
    checksum  TEXT NOT NULL,
    image     TEXT NOT NULL,
    staged_ms INTEGER NOT NULL
);
CREATE TABLE handoff_steps (
    id            INTEGER PRIMARY KEY,
    at_ms         INTEGER NOT NULL,
    step          TEXT NOT NULL,
    from_template TEXT,
    to_template   TEXT,
    detail        TEXT
);
"#,
    r#"
-- Ended workers, newest first, for `astraeusctl history`.
CREATE INDEX workers_ended ON workers(ended_ms) WHERE state = 'stopped';
-- The metrics' counters: GPU-milliseconds and energy accounted so far, per
-- GPU and kind (worker, slice, outside, idle, downtime) and per worker name,
-- up to `usage_counted.until_ms` (so a restart neither loses nor recounts).
CREATE TABLE usage_counters (
    scope      TEXT NOT NULL CHECK (scope IN ('gpu', 'worker')),
    key        TEXT NOT NULL,
    kind       TEXT NOT NULL,
    gpu_ms     INTEGER NOT NULL,
    energy_mj  INTEGER NOT NULL,
    PRIMARY KEY (scope, key, kind)
);
CREATE TABLE usage_counted (
    id        INTEGER PRIMARY KEY CHECK (id = 1),
    until_ms  INTEGER NOT NULL
);
"#,
    r#"
-- A live allocation is a hold not yet ended: one table where there were
-- two, and a worker's life is read from its row and its holds (no event
-- rows for it), so a submit or a stop writes fewer pages (#25). First the
-- holds are made to agree with the allocations of running workers, which
-- were the truth: each is an open hold with the allocation's GPU and share;
-- every other open hold is closed (at its worker's end, else its start).
INSERT INTO holds (worker_id, gpu_uuid, gpu_index, share_hundredths, from_ms)
    SELECT a.worker_id, a.gpu_uuid, a.gpu_index, a.share_hundredths,
           coalesce(w.started_ms, w.submitted_ms)
    FROM allocations a JOIN workers w ON w.id = a.worker_id
    WHERE w.state = 'running'
    ON CONFLICT (worker_id, gpu_uuid) DO UPDATE SET
        to_ms = NULL, gpu_index = excluded.gpu_index,
        share_hundredths = excluded.share_hundredths;
UPDATE holds SET to_ms = coalesce(
        (SELECT w.ended_ms FROM workers w WHERE w.id = holds.worker_id), holds.from_ms)
    WHERE to_ms IS NULL AND NOT EXISTS (
        SELECT 1 FROM allocations a JOIN workers w ON w.id = a.worker_id
        WHERE a.worker_id = holds.worker_id AND a.gpu_uuid = holds.gpu_uuid
          AND w.state = 'running');
DROP TABLE allocations;
-- Nothing reads workers by state through an index (live ones: the partial
-- name index; ended ones: workers_ended), nor events by worker.
DROP INDEX IF EXISTS workers_state;
DROP INDEX IF EXISTS events_worker;
"#,
    // 10 and 11: holds were indexed by their start alone for a while on
    // 2026-12-05 (a page less per stop), then by (start, end) again: the
    // usage count's window query read every hold's row without the end in
    // the index. Ledgers that took 10 come back through 11.
    r#"
DROP INDEX IF EXISTS holds_time;
CREATE INDEX holds_from ON holds(from_ms);
"#,
    r#"
DROP INDEX IF EXISTS holds_from;
CREATE INDEX IF NOT EXISTS holds_time ON holds(from_ms, to_ms);
"#,
    // 12: the loop counts each closed sampling interval (a minute) into the
    // metrics' counters, reading the holds and GPU intervals that overlap
    // it: `from_ms < end AND (to_ms IS NULL OR to_ms > start)`. Indexed by
    // start, that read walked every hold begun before the window (all of
    // history), and GPU intervals had no index on time at all (a year at 8
    // GPUs: 475 ms on the loop a minute). Indexed by end, it reads the open
    // holds and those that ended in the window, and the recent intervals.
    // An open hold's end is NULL, indexed as the largest end there is: open
    // holds sort after the closed ones, next to those just closed, so that
    // a stop still moves its entry within one index page.
    r#"
DROP INDEX IF EXISTS holds_time;
CREATE INDEX holds_end ON holds(coalesce(to_ms, 9223372036854775807), from_ms);
CREATE INDEX gpu_intervals_end ON gpu_intervals(to_ms);
"#,
    // 13: time slices, which the same count reads too, by end as holds are.
    r#"
DROP INDEX IF EXISTS slices_time;
CREATE INDEX slices_end ON slices(coalesce(end_ms, 9223372036854775807), start_ms);
"#,
    // 14: the daemon's runs, which the same count reads (for downtime), by
    // their last sign of life: by start, it walked every run ever recorded,
    // one more each restart (a crash loop under Restart= adds thousands).
    r#"
CREATE INDEX daemon_runs_alive ON daemon_runs(alive_ms);
"#,
    // 15: holds kept in the order of their key (WITHOUT ROWID): with a
    // rowid, the key (worker, GPU) was an index of its own beside the
    // table, one B-tree more written by every submit and read by every
    // stop to find the row (#25). Rows kept; the end index as in 12.
    r#"
CREATE TABLE holds_by_key (
    worker_id        INTEGER NOT NULL REFERENCES workers(id),
    gpu_uuid         TEXT NOT NULL,
    gpu_index        INTEGER NOT NULL,
    share_hundredths INTEGER,
    from_ms          INTEGER NOT NULL,
    to_ms            INTEGER,
    PRIMARY KEY (worker_id, gpu_uuid)
) WITHOUT ROWID;
INSERT INTO holds_by_key (worker_id, gpu_uuid, gpu_index, share_hundredths, from_ms, to_ms)
    SELECT worker_id, gpu_uuid, gpu_index, share_hundredths, from_ms, to_ms FROM holds;
DROP TABLE holds;
ALTER TABLE holds_by_key RENAME TO holds;
CREATE INDEX holds_end ON holds(coalesce(to_ms, 9223372036854775807), from_ms);
"#,
    // 16: facts about the ledger itself; `kept_from_ms`: where retention
    // last cut (store/retention.rs), before which the report has no records.
    r#"
CREATE TABLE ledger_meta (
    key    TEXT PRIMARY KEY,
    value  INTEGER NOT NULL
);
"#,
    // 17: usage rollups (store/rollup.rs): a closed UTC day of a GPU's
    // measured intervals folded into each base row's exact sums (report.rs:
    // 1/2^32 ms and mJ, as 16-byte little-endian BLOBs since a day's energy
    // in those units passes i64), kept in place of the intervals. `usage_days`: the days
    // rolled per GPU, the GPU as it was and the day's energy.
    r#"
CREATE TABLE usage_days (
    gpu_uuid    TEXT NOT NULL,
    day_ms      INTEGER NOT NULL,
    gpu_index   INTEGER NOT NULL,
    total_bytes INTEGER NOT NULL,
    energy_mj   INTEGER NOT NULL,
    PRIMARY KEY (day_ms, gpu_uuid)
) WITHOUT ROWID;
CREATE INDEX usage_days_gpu ON usage_days(gpu_uuid, day_ms);
CREATE TABLE usage_rollup (
    day_ms   INTEGER NOT NULL,
    gpu_uuid TEXT NOT NULL,
    kind     TEXT NOT NULL,
    name     TEXT NOT NULL,
    owner    TEXT NOT NULL,
    ms       BLOB NOT NULL,
    energy   BLOB NOT NULL,
    busy     BLOB,
    PRIMARY KEY (day_ms, gpu_uuid, kind, name, owner)
) WITHOUT ROWID;
-- A report skips the holds a rolled-up day of their GPU stands for: the
-- GPU in the end index, so that is decided from the index alone.
DROP INDEX holds_end;
CREATE INDEX holds_end ON holds(coalesce(to_ms, 9223372036854775807), from_ms, gpu_uuid);
"#,
    // 18: a rolled-up day's sums in one BLOB on its row (store/rollup.rs):
    // a year's report read 75,000 rows of usage_rollup on 8 GPUs. Days
    // rolled up before keep their rows there, read as they are. And the
    // holds by their start, for those before the rolled-up days.
    r#"
ALTER TABLE usage_days ADD COLUMN sums BLOB;
-- The holds before a report's rolled-up days, by their start
-- (store/usage.rs, HOLDS_BEFORE).
CREATE INDEX holds_start ON holds(from_ms, coalesce(to_ms, 9223372036854775807), gpu_uuid);
"#,
    // 19: usage_days as a rowid table. A WITHOUT ROWID row keeps only about
    // a 20th of a page in place; a rolled-up day's BLOB (about 1.8 KB a
    // GPU-day at 100 workers) spilled the rest onto an overflow page of its
    // own, and a year's report read 13 MB of pages for 5 MB of rows. In
    // their days' order, as the report reads them.
    r#"
CREATE TABLE usage_days_new (
    gpu_uuid    TEXT NOT NULL,
    day_ms      INTEGER NOT NULL,
    gpu_index   INTEGER NOT NULL,
    total_bytes INTEGER NOT NULL,
    energy_mj   INTEGER NOT NULL,
    sums        BLOB,
    UNIQUE (day_ms, gpu_uuid)
);
INSERT INTO usage_days_new (gpu_uuid, day_ms, gpu_index, total_bytes, energy_mj, sums)
    SELECT gpu_uuid, day_ms, gpu_index, total_bytes, energy_mj, sums FROM usage_days
    ORDER BY day_ms, gpu_uuid;
DROP TABLE usage_days;
ALTER TABLE usage_days_new RENAME TO usage_days;
CREATE INDEX usage_days_gpu ON usage_days(gpu_uuid, day_ms);
"#,
    // 20: an acknowledged stop is the ledger's before its reply (#63): who
    // asked and when, carried out at every start and adoption until the
    // workload is gone, so that a stopped worker never runs again.
    r#"
ALTER TABLE workers ADD COLUMN stop_asked_ms INTEGER;
ALTER TABLE workers ADD COLUMN stop_asked_by INTEGER;
"#,
    // 21: the ledger's room (#63, store/room.rs): a blob added and deleted
    // in one transaction leaves its pages on the free list, where commits
    // find them however full the disk is. Never holds a row.
    r#"
CREATE TABLE ledger_room (pad BLOB);
"#,
];

#[cfg(test)]
mod tests {
    use super::MIGRATIONS;
    use crate::store::Store;
    use rusqlite::Connection;

    fn indexes(conn: &Connection, table: &str) -> Vec<String> {
        conn.prepare(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ?1
             AND sql IS NOT NULL ORDER BY name",
        )
        .unwrap()
        .query_map([table], |r| r.get(0))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap()
    }

    /// A ledger that took migration 10 (holds by start alone), one that
    /// did not, and ones of versions 11 and 13 all end with holds, GPU
    /// intervals, slices and the daemon's runs indexed by their end, their
    /// rows kept.
    #[test]
    fn older_ledgers_end_with_what_they_hold_indexed_by_its_end() {
        for version in [9, 10, 11, 13, 14] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("ledger.db");
            {
                let conn = Connection::open(&path).unwrap();
                for m in &MIGRATIONS[..version] {
                    conn.execute_batch(m).unwrap();
                }
                conn.pragma_update(None, "user_version", version as i64)
                    .unwrap();
                conn.execute_batch(
                    "INSERT INTO workers (id, name, spec, owner_uid, state, submitted_ms, started_ms)
                         VALUES (1, 'a', '{}', 0, 'running', 5, 5);
                     INSERT INTO holds (worker_id, gpu_uuid, gpu_index, share_hundredths, from_ms)
                         VALUES (1, 'GPU-x', 0, 50, 5);",
                )
                .unwrap();
            }
            drop(Store::open(&path).unwrap());
            let conn = Connection::open(&path).unwrap();
            assert_eq!(
                indexes(&conn, "holds"),
                ["holds_end", "holds_start"],
                "from {version}"
            );
            assert_eq!(
                indexes(&conn, "gpu_intervals"),
                ["gpu_intervals_end"],
                "from {version}"
            );
            assert_eq!(indexes(&conn, "slices"), ["slices_end"], "from {version}");
            assert_eq!(
                indexes(&conn, "daemon_runs"),
                ["daemon_runs_alive"],
                "from {version}"
            );
            let version: i64 = conn
                .pragma_query_value(None, "user_version", |r| r.get(0))
                .unwrap();
            assert_eq!(version as usize, MIGRATIONS.len());
            let holds: i64 = conn
                .query_row("SELECT count(*) FROM holds WHERE to_ms IS NULL", [], |r| {
                    r.get(0)
                })
                .unwrap();
            assert_eq!(holds, 1);
            // Keyed without a rowid: no index of its own for the key.
            let sql: String = conn
                .query_row(
                    "SELECT sql FROM sqlite_master WHERE name = 'holds'",
                    [],
                    |r| r.get(0),
                )
                .unwrap();
            assert!(sql.ends_with("WITHOUT ROWID"), "{sql}");
            let autoindexes: i64 = conn
                .query_row(
                    "SELECT count(*) FROM sqlite_master WHERE tbl_name = 'holds' AND sql IS NULL",
                    [],
                    |r| r.get(0),
                )
                .unwrap();
            assert_eq!(autoindexes, 0, "from {version}");
        }
    }

    /// A rolled-up day's sums (2 KB here) stay on the table's own pages
    /// once migration 19 has run (dbstat counts the pages): a version-18
    /// ledger spilled each onto an overflow page of its own, and keeps every
    /// day through the migration.
    #[test]
    fn rolled_up_days_keep_their_sums_on_their_own_pages() {
        let overflow = |conn: &Connection| -> i64 {
            conn.query_row(
                "SELECT count(*) FROM dbstat WHERE name = 'usage_days' AND pagetype = 'overflow'",
                [],
                |r| r.get(0),
            )
            .unwrap()
        };
        let days = |conn: &Connection| -> Vec<(String, i64, Vec<u8>)> {
            conn.prepare("SELECT gpu_uuid, day_ms, sums FROM usage_days ORDER BY day_ms, gpu_uuid")
                .unwrap()
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .unwrap()
                .collect::<rusqlite::Result<_>>()
                .unwrap()
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        let before = {
            let conn = Connection::open(&path).unwrap();
            for m in &MIGRATIONS[..18] {
                conn.execute_batch(m).unwrap();
            }
            conn.pragma_update(None, "user_version", 18).unwrap();
            for day in 0..40i64 {
                for gpu in ["GPU-a", "GPU-b"] {
                    conn.execute(
                        "INSERT INTO usage_days (gpu_uuid, day_ms, gpu_index, total_bytes, energy_mj, sums)
                         VALUES (?1, ?2, 0, 1, 0, ?3)",
                        rusqlite::params![gpu, day * 86_400_000, vec![day as u8; 2_000]],
                    )
                    .unwrap();
                }
            }
            assert!(overflow(&conn) >= 80, "version 18 spills every day's sums");
            days(&conn)
        };
        drop(Store::open(&path).unwrap());
        let conn = Connection::open(&path).unwrap();
        assert_eq!(days(&conn), before);
        assert_eq!(overflow(&conn), 0);
        // And a day rolled up after it, replaced as the rollup does.
        conn.execute(
            "INSERT OR REPLACE INTO usage_days (gpu_uuid, day_ms, gpu_index, total_bytes, energy_mj, sums)
             VALUES ('GPU-a', 0, 0, 1, 0, ?1)",
            [vec![7u8; 2_000]],
        )
        .unwrap();
        assert_eq!(days(&conn).len(), before.len());
        assert_eq!(overflow(&conn), 0);
    }
}
