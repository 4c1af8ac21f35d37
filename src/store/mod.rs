//! The ledger: SQLite through rusqlite, in one place. Every mutation is one
//! transaction, committed durably (WAL + synchronous=FULL) before the caller
//! acknowledges anything, so a crash at any point loses nothing acknowledged
//! and books nothing twice.

use crate::error::{Error, Result};
use crate::failpoint;
use crate::placement::Grant;
use crate::quantity::Amount;
use rusqlite::{params, Connection, OptionalExtension, Transaction};
use std::path::Path;

/// Versioned migrations: entry N brings the schema from version N to N+1.
const MIGRATIONS: &[&str] = &[
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
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkerState {
    Pending,
    Running,
    Stopped,
}

impl WorkerState {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerState::Pending => "pending",
            WorkerState::Running => "running",
            WorkerState::Stopped => "stopped",
        }
    }
    fn parse(s: &str) -> Result<WorkerState> {
        match s {
            "pending" => Ok(WorkerState::Pending),
            "running" => Ok(WorkerState::Running),
            "stopped" => Ok(WorkerState::Stopped),
            other => Err(Error::Backend(format!(
                "ledger: unknown worker state {other:?}"
            ))),
        }
    }
}

/// A live worker as the ledger holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerRow {
    pub id: i64,
    pub name: String,
    pub spec: String,
    pub owner_uid: u32,
    pub holders: Vec<u32>,
    pub state: WorkerState,
    pub submitted_ms: i64,
    pub grants: Vec<Grant>,
    /// The runtime's id of its workload, once launched.
    pub runtime_id: Option<String>,
    /// Its workload's control group, once known.
    pub cgroup: Option<String>,
}

pub use crate::slicing::meter::SliceMeasures;

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

/// One worker's hold on one GPU, as the usage report needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HoldRow {
    pub worker: String,
    pub owner_uid: u32,
    /// It has a `run` (its workload keeps running while the daemon is down).
    pub launched: bool,
    pub gpu_uuid: String,
    pub gpu_index: u32,
    pub share_hundredths: Option<u64>,
    pub from_ms: i64,
    pub to_ms: Option<i64>,
}

/// The ledger's facts for one usage report.
#[derive(Clone, Debug, Default)]
pub struct UsageInputs {
    pub holds: Vec<HoldRow>,
    pub measured: Vec<crate::report::Measured>,
    pub up: Vec<crate::report::Up>,
    /// Each GPU's size as last measured, by UUID (for GPUs no longer present).
    pub totals: std::collections::HashMap<String, u64>,
}

/// Now, as the ledger keeps instants (SQLite's INTEGER milliseconds).
pub fn now_ms() -> i64 {
    crate::time::now_ms() as i64
}

pub struct Store {
    conn: Connection,
    /// The write-ahead log, for the one fsync that ends a group of commits.
    wal: Option<std::path::PathBuf>,
    /// Commits since [`Store::defer_sync`] are written but not yet synced.
    deferred: bool,
    /// Set when that fsync failed: every later commit is refused (the commit
    /// hook rolls it back), reads go on, a restart rereads what is on disk.
    broken: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Store {
    pub fn open(path: &Path) -> Result<Store> {
        let conn = Connection::open(path)
            .map_err(|e| Error::Backend(format!("ledger {}: {e}", path.display())))?;
        let mut store = Store::setup(conn)?;
        let mut wal = path.as_os_str().to_owned();
        wal.push("-wal");
        store.wal = Some(wal.into());
        Ok(store)
    }

    /// Group commit: until [`Store::sync`], commits are written to the log but
    /// not synced (WAL with synchronous=NORMAL keeps them atomic; a crash of
    /// the process loses nothing, only a power cut could). The caller holds
    /// every acknowledgement until `sync` returns.
    pub fn defer_sync(&mut self) -> Result<()> {
        if !self.deferred {
            self.conn.pragma_update(None, "synchronous", "NORMAL")?;
            self.deferred = true;
        }
        Ok(())
    }

    /// Makes every commit since [`Store::defer_sync`] durable with one fsync
    /// of the log, and commits sync on their own again.
    pub fn sync(&mut self) -> Result<()> {
        if !self.deferred {
            return Ok(());
        }
        self.deferred = false;
        let synced = match &self.wal {
            Some(wal) => std::fs::File::open(wal).and_then(|f| f.sync_data()),
            None => Ok(()),
        };
        if let Err(e) = synced {
            // Whether those commits reached the disk is unknown (the kernel may
            // have dropped the pages): take nothing more until a restart.
            self.broken.store(true, std::sync::atomic::Ordering::SeqCst);
            return Err(Error::Backend(format!(
                "ledger: its disk did not confirm the last writes (fsync: {e}); whether they \
                 were kept is known after the daemon restarts, and new work is refused until then"
            )));
        }
        self.conn.pragma_update(None, "synchronous", "FULL")?;
        Ok(())
    }

    pub fn open_in_memory() -> Result<Store> {
        Store::setup(Connection::open_in_memory()?)
    }

    fn setup(mut conn: Connection) -> Result<Store> {
        // WAL for concurrent readers; FULL so a commit survives power loss.
        // Every statement is prepared once and kept (parsing SQL was a seventh
        // of a submit's instructions under callgrind).
        conn.set_prepared_statement_cache_capacity(64);
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
        let version = version as usize;
        if version > MIGRATIONS.len() {
            return Err(Error::Backend(format!(
                "ledger schema version {version} is newer than this daemon knows ({})",
                MIGRATIONS.len()
            )));
        }
        for (v, sql) in MIGRATIONS.iter().enumerate().skip(version) {
            let tx = conn.transaction()?;
            tx.execute_batch(sql)?;
            tx.pragma_update(None, "user_version", (v + 1) as i64)?;
            tx.commit()?;
        }
        let broken = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let refuse = broken.clone();
        conn.commit_hook(Some(move || {
            refuse.load(std::sync::atomic::Ordering::SeqCst)
        }))?;
        Ok(Store {
            conn,
            wal: None,
            deferred: false,
            broken,
        })
    }

    /// Records a new worker, placed (`grants` is `Some`) or pending, in one transaction.
    pub fn insert_worker(
        &mut self,
        name: &str,
        spec: &str,
        owner_uid: u32,
        holders: &[u32],
        grants: Option<&[Grant]>,
        at_ms: i64,
    ) -> Result<i64> {
        let tx = self.conn.transaction()?;
        let state = if grants.is_some() {
            WorkerState::Running
        } else {
            WorkerState::Pending
        };
        exec(
            &tx,
            "INSERT INTO workers (name, spec, owner_uid, holders, state, submitted_ms, started_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![
                name,
                spec,
                owner_uid,
                serde_json::to_string(holders).expect("pids serialize"),
                state.as_str(),
                at_ms,
                grants.map(|_| at_ms),
            ],
        )
        .map_err(|e| match e {
            rusqlite::Error::SqliteFailure(f, _)
                if f.code == rusqlite::ErrorCode::ConstraintViolation =>
            {
                Error::Exists(format!("a live worker named {name} already exists"))
            }
            e => e.into(),
        })?;
        let id = tx.last_insert_rowid();
        failpoint::hit("store.insert.after-worker");
        event(&tx, at_ms, id, "submitted", "")?;
        if let Some(grants) = grants {
            insert_grants(&tx, id, grants, at_ms)?;
        }
        failpoint::hit("store.insert.before-commit");
        tx.commit()?;
        failpoint::hit("store.insert.after-commit");
        Ok(id)
    }

    /// A pending worker is placed.
    pub fn start_worker(&mut self, id: i64, grants: &[Grant], at_ms: i64) -> Result<()> {
        let tx = self.conn.transaction()?;
        let n = exec(
&tx,
            "UPDATE workers SET state = 'running', started_ms = ?2 WHERE id = ?1 AND state = 'pending'",
            params![id, at_ms],
        )?;
        if n != 1 {
            return Err(Error::Backend(format!(
                "ledger: worker {id} is not pending"
            )));
        }
        failpoint::hit("store.start.after-state");
        insert_grants(&tx, id, grants, at_ms)?;
        failpoint::hit("store.start.before-commit");
        tx.commit()?;
        failpoint::hit("store.start.after-commit");
        Ok(())
    }

    /// A worker ends: its allocations are released in the same transaction.
    pub fn stop_worker(&mut self, id: i64, at_ms: i64) -> Result<()> {
        self.end_worker(id, at_ms, None, "stopped")
    }

    /// A worker ends — stopped, exited or failed — and its allocations are
    /// released, in one transaction.
    pub fn end_worker(
        &mut self,
        id: i64,
        at_ms: i64,
        exit_status: Option<i32>,
        reason: &str,
    ) -> Result<()> {
        let tx = self.conn.transaction()?;
        let n = exec(
            &tx,
            "UPDATE workers SET state = 'stopped', ended_ms = ?2, exit_status = ?3, end_reason = ?4
             WHERE id = ?1 AND state != 'stopped'",
            params![id, at_ms, exit_status, reason],
        )?;
        if n != 1 {
            return Err(Error::Backend(format!("ledger: worker {id} is not live")));
        }
        failpoint::hit("store.stop.after-state");
        exec(
            &tx,
            "DELETE FROM allocations WHERE worker_id = ?1",
            params![id],
        )?;
        exec(
            &tx,
            "UPDATE holds SET to_ms = ?2 WHERE worker_id = ?1 AND to_ms IS NULL",
            params![id, at_ms],
        )?;
        event(&tx, at_ms, id, "stopped", reason)?;
        failpoint::hit("store.stop.before-commit");
        tx.commit()?;
        failpoint::hit("store.stop.after-commit");
        Ok(())
    }

    /// Records the runtime's id of a launched worker.
    pub fn set_runtime_id(&mut self, id: i64, runtime_id: &str, at_ms: i64) -> Result<()> {
        let tx = self.conn.transaction()?;
        exec(
            &tx,
            "UPDATE workers SET runtime_id = ?2 WHERE id = ?1 AND state = 'running'",
            params![id, runtime_id],
        )?;
        event(&tx, at_ms, id, "launched", runtime_id)?;
        tx.commit()?;
        Ok(())
    }

    /// Records a launched worker's control group.
    pub fn set_cgroup(&mut self, id: i64, cgroup: &str) -> Result<()> {
        exec(
            &self.conn,
            "UPDATE workers SET cgroup = ?2 WHERE id = ?1 AND state = 'running'",
            params![id, cgroup],
        )?;
        Ok(())
    }

    /// Every live worker with its allocations, oldest first.
    pub fn live_workers(&self) -> Result<Vec<WorkerRow>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT id, name, spec, owner_uid, holders, state, submitted_ms, runtime_id, cgroup FROM workers
             WHERE state != 'stopped' ORDER BY id",
        )?;
        let mut rows: Vec<WorkerRow> = stmt
            .query_map([], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, u32>(3)?,
                    r.get::<_, String>(4)?,
                    r.get::<_, String>(5)?,
                    r.get::<_, i64>(6)?,
                    r.get::<_, Option<String>>(7)?,
                    r.get::<_, Option<String>>(8)?,
                ))
            })?
            .map(|row| {
                let (id, name, spec, owner_uid, holders, state, submitted_ms, runtime_id, cgroup) =
                    row?;
                Ok(WorkerRow {
                    id,
                    name,
                    spec,
                    owner_uid,
                    holders: serde_json::from_str(&holders).map_err(|e| {
                        Error::Backend(format!("ledger: holders of worker {id}: {e}"))
                    })?,
                    state: WorkerState::parse(&state)?,
                    submitted_ms,
                    grants: Vec::new(),
                    runtime_id,
                    cgroup,
                })
            })
            .collect::<Result<_>>()?;
        let mut by_id: std::collections::HashMap<i64, usize> =
            rows.iter().enumerate().map(|(i, r)| (r.id, i)).collect();
        let mut stmt = self.conn.prepare_cached(
            "SELECT a.worker_id, a.gpu_uuid, a.gpu_index, a.share_hundredths FROM allocations a
             JOIN workers w ON w.id = a.worker_id WHERE w.state != 'stopped'
             ORDER BY a.worker_id, a.gpu_index",
        )?;
        let allocs = stmt.query_map([], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                Grant {
                    gpu_uuid: r.get(1)?,
                    gpu_index: r.get(2)?,
                    share: r
                        .get::<_, Option<i64>>(3)?
                        .map(|h| Amount::from_hundredths(h as u64)),
                },
            ))
        })?;
        for a in allocs {
            let (worker_id, grant) = a?;
            if let Some(i) = by_id.get_mut(&worker_id) {
                rows[*i].grants.push(grant);
            }
        }
        Ok(rows)
    }

    /// Allocations whose worker is not running: must always be empty.
    pub fn orphan_allocations(&self) -> Result<i64> {
        Ok(self.conn.query_row(
            "SELECT count(*) FROM allocations a LEFT JOIN workers w ON w.id = a.worker_id
             WHERE w.id IS NULL OR w.state != 'running'",
            [],
            |r| r.get(0),
        )?)
    }

    /// The id of the live worker with this name, if any.
    pub fn live_id(&self, name: &str) -> Result<Option<i64>> {
        Ok(self
            .conn
            .query_row(
                "SELECT id FROM workers WHERE name = ?1 AND state != 'stopped'",
                params![name],
                |r| r.get(0),
            )
            .optional()?)
    }

    /// Replaces a template's schedule (an empty list removes it), in one transaction.
    pub fn set_schedule(
        &mut self,
        template: &str,
        actions: Option<&str>,
        at_ms: i64,
    ) -> Result<()> {
        let tx = self.conn.transaction()?;
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

    /// Every template's JSON, by name.
    pub fn templates(&self) -> Result<Vec<(String, String)>> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT name, spec FROM templates ORDER BY name")?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Adds a template (a name is taken once).
    pub fn insert_template(&mut self, name: &str, spec: &str, at_ms: i64) -> Result<()> {
        let tx = self.conn.transaction()?;
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
    pub fn remove_template(&mut self, name: &str, at_ms: i64) -> Result<bool> {
        let tx = self.conn.transaction()?;
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
        start_ms: i64,
        dead_time_ms: Option<i64>,
    ) -> Result<i64> {
        exec(
            &self.conn,
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
            .query_row(
                "SELECT id FROM slices WHERE template = ?1 AND end_ms IS NULL ORDER BY id DESC LIMIT 1",
                params![template],
                |r| r.get(0),
            )
            .optional()?)
    }

    pub fn slice_ready(&mut self, id: i64, start_to_ready_ms: i64) -> Result<()> {
        exec(
            &self.conn,
            "UPDATE slices SET start_to_ready_ms = ?2 WHERE id = ?1",
            params![id, start_to_ready_ms],
        )?;
        Ok(())
    }

    /// A slice ends with what was measured over it.
    pub fn close_slice(
        &mut self,
        id: i64,
        end_ms: i64,
        m: &SliceMeasures,
        error: Option<&str>,
    ) -> Result<()> {
        exec(
            &self.conn,
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

    /// Slices overlapping [from_ms, to_ms), oldest first.
    pub fn slices(&self, from_ms: i64, to_ms: i64) -> Result<Vec<SliceRecord>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT template, user, baseboard, start_ms, end_ms, dead_time_ms, start_to_ready_ms,
                    cpu_avg_pct, cpu_peak_pct, gpu_avg_pct, gpu_peak_pct, gpu_memory_peak_bytes,
                    energy_j, error
             FROM slices WHERE start_ms < ?2 AND (end_ms IS NULL OR end_ms > ?1) ORDER BY start_ms, id",
        )?;
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

    /// The last sign of life of the run before `current`.
    pub fn previous_run_end(&self, current: Option<i64>) -> Result<Option<i64>> {
        Ok(self
            .conn
            .query_row(
                "SELECT alive_ms FROM daemon_runs WHERE started_ms < ?1 ORDER BY started_ms DESC LIMIT 1",
                params![current.unwrap_or(i64::MAX)],
                |r| r.get(0),
            )
            .optional()?)
    }

    pub fn record_event(&mut self, kind: &str, detail: &str, at_ms: i64) -> Result<()> {
        exec(
            &self.conn,
            "INSERT INTO events (at_ms, worker_id, kind, detail) VALUES (?1, NULL, ?2, ?3)",
            params![at_ms, kind, detail],
        )?;
        Ok(())
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
        at_ms: i64,
    ) -> Result<()> {
        exec(
            &self.conn,
            "INSERT INTO weights (template, checksum, image, staged_ms) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT(template) DO UPDATE SET checksum = excluded.checksum,
             image = excluded.image, staged_ms = excluded.staged_ms",
            params![template, checksum, image, at_ms],
        )?;
        Ok(())
    }

    /// Records one handoff step.
    pub fn record_step(&mut self, r: &crate::slicing::handoff::Record) -> Result<()> {
        exec(
            &self.conn,
            "INSERT INTO handoff_steps (at_ms, step, from_template, to_template, detail)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![r.at_ms as i64, r.step.as_str(), r.from, r.to, r.detail],
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
    /// only change who is next): what a restart resumes from.
    pub fn last_state_step(&self) -> Result<Option<crate::slicing::handoff::Record>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT step, from_template, to_template, at_ms, detail FROM handoff_steps
             WHERE step != 'requested' ORDER BY id DESC LIMIT 1",
        )?;
        let steps = read_steps(stmt.query([])?)?;
        Ok(steps.into_iter().next_back())
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
            at_ms: at as u64,
            detail,
        });
    }
    Ok(out)
}

impl Store {
    /// What the usage report of [from_ms, to_ms) is computed from.
    pub fn usage_inputs(&self, from_ms: i64, to_ms: i64) -> Result<UsageInputs> {
        let mut out = UsageInputs::default();
        let mut stmt = self.conn.prepare_cached(
            "SELECT w.name, w.owner_uid, w.spec, h.gpu_uuid, h.gpu_index, h.share_hundredths,
                    h.from_ms, h.to_ms
             FROM holds h JOIN workers w ON w.id = h.worker_id
             WHERE h.from_ms < ?2 AND (h.to_ms IS NULL OR h.to_ms > ?1)
             ORDER BY h.from_ms, w.id",
        )?;
        let rows = stmt.query_map(params![from_ms, to_ms], |r| {
            Ok(HoldRow {
                worker: r.get(0)?,
                owner_uid: r.get(1)?,
                launched: r.get::<_, String>(2)?.contains("\"run\""),
                gpu_uuid: r.get(3)?,
                gpu_index: r.get(4)?,
                share_hundredths: r.get::<_, Option<i64>>(5)?.map(|h| h as u64),
                from_ms: r.get(6)?,
                to_ms: r.get(7)?,
            })
        })?;
        out.holds = rows.collect::<rusqlite::Result<_>>()?;
        let mut stmt = self.conn.prepare_cached(
            "SELECT gpu_uuid, from_ms, to_ms, energy_mj, utilization_pct, outside_bytes, total_bytes
             FROM gpu_intervals WHERE from_ms < ?2 AND to_ms > ?1 ORDER BY from_ms",
        )?;
        let rows = stmt.query_map(params![from_ms, to_ms], |r| {
            Ok((
                crate::report::Measured {
                    gpu_uuid: r.get(0)?,
                    from_ms: r.get(1)?,
                    to_ms: r.get(2)?,
                    energy_mj: r.get::<_, i64>(3)? as u64,
                    utilization_pct: r.get(4)?,
                    outside_bytes: r.get::<_, i64>(5)? as u64,
                },
                r.get::<_, i64>(6)? as u64,
            ))
        })?;
        for row in rows {
            let (m, total) = row?;
            if total > 0 {
                out.totals.insert(m.gpu_uuid.clone(), total);
            }
            out.measured.push(m);
        }
        let mut stmt = self.conn.prepare_cached(
            "SELECT started_ms, alive_ms FROM daemon_runs
             WHERE started_ms < ?2 AND alive_ms > ?1 ORDER BY started_ms",
        )?;
        let rows = stmt.query_map(params![from_ms, to_ms], |r| {
            Ok(crate::report::Up {
                from_ms: r.get(0)?,
                to_ms: r.get(1)?,
            })
        })?;
        out.up = rows.collect::<rusqlite::Result<_>>()?;
        Ok(out)
    }

    /// A daemon run begins (its id is its start time).
    pub fn begin_run(&mut self, at_ms: i64) -> Result<i64> {
        exec(
            &self.conn,
            "INSERT OR REPLACE INTO daemon_runs (started_ms, alive_ms) VALUES (?1, ?1)",
            params![at_ms],
        )?;
        Ok(at_ms)
    }

    /// The run was alive at `at_ms` (a usage interval closed, or a clean stop).
    pub fn alive(&mut self, run: i64, at_ms: i64) -> Result<()> {
        exec(
            &self.conn,
            "UPDATE daemon_runs SET alive_ms = max(alive_ms, ?2) WHERE started_ms = ?1",
            params![run, at_ms],
        )?;
        Ok(())
    }

    /// Closed sampling intervals and the run's sign of life, in one transaction.
    pub fn insert_intervals(
        &mut self,
        rows: &[crate::usage::Interval],
        run: Option<i64>,
        at_ms: i64,
    ) -> Result<()> {
        let tx = self.conn.transaction()?;
        for r in rows {
            exec(
&tx,
                "INSERT OR REPLACE INTO gpu_intervals
                 (gpu_uuid, from_ms, to_ms, energy_mj, utilization_pct, samples, outside_bytes, total_bytes)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    r.gpu_uuid,
                    r.from_ms,
                    r.to_ms,
                    r.energy_mj as i64,
                    r.utilization_pct,
                    r.samples,
                    r.outside_bytes as i64,
                    r.total_bytes as i64
                ],
            )?;
        }
        if let Some(run) = run {
            exec(
                &tx,
                "UPDATE daemon_runs SET alive_ms = max(alive_ms, ?2) WHERE started_ms = ?1",
                params![run, at_ms],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Every template's schedule: (template, normalized actions JSON).
    pub fn schedules(&self) -> Result<Vec<(String, String)>> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT template, actions FROM schedules ORDER BY template")?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    pub fn event_count(&self) -> Result<i64> {
        Ok(self
            .conn
            .query_row("SELECT count(*) FROM events", [], |r| r.get(0))?)
    }
}

fn event(tx: &Transaction, at_ms: i64, worker: i64, kind: &str, detail: &str) -> Result<()> {
    exec(
        tx,
        "INSERT INTO events (at_ms, worker_id, kind, detail) VALUES (?1, ?2, ?3, ?4)",
        params![at_ms, worker, kind, detail],
    )?;
    Ok(())
}

fn insert_grants(tx: &Transaction, id: i64, grants: &[Grant], at_ms: i64) -> Result<()> {
    for g in grants {
        exec(
            tx,
            "INSERT INTO allocations (worker_id, gpu_uuid, gpu_index, share_hundredths)
             VALUES (?1, ?2, ?3, ?4)",
            params![
                id,
                g.gpu_uuid,
                g.gpu_index,
                g.share.map(|s| s.hundredths() as i64)
            ],
        )?;
        exec(tx,
            "INSERT OR REPLACE INTO holds (worker_id, gpu_uuid, gpu_index, share_hundredths, from_ms)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![
                id,
                g.gpu_uuid,
                g.gpu_index,
                g.share.map(|s| s.hundredths() as i64),
                at_ms
            ],
        )?;
        failpoint::hit("store.grant.after-row");
    }
    let detail = serde_json::to_string(
        &grants
            .iter()
            .map(|g| (g.gpu_uuid.as_str(), g.share.map(|s| s.to_string())))
            .collect::<Vec<_>>(),
    )
    .expect("grants serialize");
    event(tx, at_ms, id, "placed", &detail)
}

/// Runs one statement, prepared once per connection and cached.
fn exec(conn: &Connection, sql: &str, params: impl rusqlite::Params) -> rusqlite::Result<usize> {
    conn.prepare_cached(sql)?.execute(params)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(uuid: &str, share: Option<u64>) -> Grant {
        Grant {
            gpu_uuid: uuid.into(),
            gpu_index: 0,
            share: share.map(Amount::from_hundredths),
        }
    }

    #[test]
    fn a_group_commit_syncs_once_and_a_failed_sync_refuses_all_later_work() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        let mut s = Store::open(&path).unwrap();
        let sync_mode = |s: &Store| -> i64 {
            s.conn
                .pragma_query_value(None, "synchronous", |r| r.get(0))
                .unwrap()
        };
        assert_eq!(sync_mode(&s), 2, "FULL outside a group");
        s.defer_sync().unwrap();
        assert_eq!(sync_mode(&s), 1, "NORMAL inside a group");
        s.insert_worker("a", "{}", 1, &[], None, 1).unwrap();
        s.insert_worker("b", "{}", 1, &[], None, 1).unwrap();
        s.sync().unwrap();
        assert_eq!(sync_mode(&s), 2, "FULL again after the group's fsync");
        // The fsync fails: the group's fate is unknown, so nothing more is taken.
        s.defer_sync().unwrap();
        s.insert_worker("c", "{}", 1, &[], None, 1).unwrap();
        s.wal = Some(dir.path().join("no-such-dir/ledger.db-wal"));
        let e = s.sync().unwrap_err();
        assert_eq!(e.kind(), "Backend");
        assert!(e.message().contains("did not confirm"), "{}", e.message());
        let e = s.insert_worker("d", "{}", 1, &[], None, 1).unwrap_err();
        assert!(
            e.message().contains("refused until the daemon restarts"),
            "{}",
            e.message()
        );
        // Reads go on.
        assert_eq!(s.live_workers().unwrap().len(), 3);
        drop(s);
        let s = Store::open(&path).unwrap();
        let names: Vec<String> = s
            .live_workers()
            .unwrap()
            .into_iter()
            .map(|r| r.name)
            .collect();
        assert_eq!(names, ["a", "b", "c"]);
    }

    #[test]
    fn migrations_apply_once_and_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        let mut s = Store::open(&path).unwrap();
        let id = s
            .insert_worker("a", "{}", 1000, &[], Some(&[grant("GPU-x", Some(220))]), 1)
            .unwrap();
        drop(s);
        let s = Store::open(&path).unwrap();
        let rows = s.live_workers().unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].id, id);
        assert_eq!(rows[0].state, WorkerState::Running);
        assert_eq!(rows[0].grants, vec![grant("GPU-x", Some(220))]);
        let mode: String = s
            .conn
            .pragma_query_value(None, "journal_mode", |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
    }

    #[test]
    fn live_names_are_unique_and_reusable_after_stop() {
        let mut s = Store::open_in_memory().unwrap();
        let id = s.insert_worker("a", "{}", 0, &[], None, 1).unwrap();
        let e = s.insert_worker("a", "{}", 0, &[], None, 2).unwrap_err();
        assert!(matches!(e, Error::Exists(_)));
        s.stop_worker(id, 3).unwrap();
        s.insert_worker("a", "{}", 0, &[], None, 4).unwrap();
        assert_eq!(s.orphan_allocations().unwrap(), 0);
    }

    #[test]
    fn stop_releases_allocations_in_the_same_transaction() {
        let mut s = Store::open_in_memory().unwrap();
        let id = s.insert_worker("a", "{}", 0, &[], None, 1).unwrap();
        s.start_worker(id, &[grant("GPU-x", None)], 2).unwrap();
        assert!(s.start_worker(id, &[grant("GPU-y", None)], 2).is_err());
        s.stop_worker(id, 3).unwrap();
        assert!(s.live_workers().unwrap().is_empty());
        assert_eq!(s.orphan_allocations().unwrap(), 0);
        assert!(s.stop_worker(id, 4).is_err());
    }
}
