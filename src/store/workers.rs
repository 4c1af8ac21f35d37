//! The ledger's workers: their rows and their holds (a live allocation is a
//! hold not yet ended). A worker's life is read from its row (submitted,
//! started, ended, why, its runtime id) and its holds: no separate event
//! rows, so a submit or a stop writes as few pages as it can (#25). Each
//! mutation is one transaction.

use super::{exec, Store};
use crate::error::{Error, Result};
use crate::failpoint;
use crate::placement::Grant;
use crate::quantity::Amount;
use crate::time::EpochMs;
use rusqlite::{params, Connection, OptionalExtension};

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

/// A worker that ended, as the ledger keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndedWorker {
    pub id: i64,
    pub name: String,
    pub owner_uid: u32,
    pub submitted_ms: i64,
    /// When it was placed; None when it ended waiting.
    pub started_ms: Option<i64>,
    pub ended_ms: i64,
    /// Its workload's exit status, when it exited by itself.
    pub exit_status: Option<i32>,
    /// stopped, exited, failed: … (as recorded when it ended).
    pub end_reason: String,
    /// The GPUs it held (from `holds`, kept after the end).
    pub grants: Vec<Grant>,
}

/// A live worker as the ledger holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerRow {
    pub id: i64,
    pub name: String,
    pub spec: String,
    pub owner_uid: u32,
    pub holders: Vec<crate::worker::Holder>,
    pub state: WorkerState,
    pub submitted_ms: i64,
    /// When it was placed, if it was.
    pub started_ms: Option<i64>,
    pub grants: Vec<Grant>,
    /// The runtime's id of its workload, once launched.
    pub runtime_id: Option<String>,
    /// Its workload's control group, once known.
    pub cgroup: Option<String>,
    /// A stop acknowledged and not yet carried out: (when, by which uid).
    pub stop_asked: Option<(i64, u32)>,
}

fn insert_grants(tx: &Connection, id: i64, grants: &[Grant], at: EpochMs) -> Result<()> {
    let at_ms = at.as_i64();
    for g in grants {
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
    Ok(())
}

/// An ended worker's request, when it launched a workload: what the usage
/// report reads of it (store/usage.rs `launches`).
pub(super) const ENDED_LAUNCHED: &str = r#"{"run":{}}"#;

// What a start reads: the live workers and their open holds, through the
// live-name index and the holds' end index (an open hold's end indexed as
// the largest there is: store/schema.rs, migration 12), so that a start
// costs what is live, not what the ledger has kept (store/usage.rs test).
// Without INDEXED BY, SQLite reads every worker ever to keep the id order.
pub(super) const LIVE_WORKERS: &str = "SELECT id, name, spec, owner_uid, holders, state,
        submitted_ms, runtime_id, cgroup, started_ms, stop_asked_ms, stop_asked_by
    FROM workers INDEXED BY workers_live_name
    WHERE state != 'stopped' ORDER BY id";
pub(super) const LIVE_HOLDS: &str = "SELECT h.worker_id, h.gpu_uuid, h.gpu_index,
        h.share_hundredths
    FROM holds h JOIN workers w ON w.id = h.worker_id
    WHERE coalesce(h.to_ms, 9223372036854775807) = 9223372036854775807
      AND w.state != 'stopped'
    ORDER BY h.worker_id, h.gpu_index";

impl Store {
    /// Records a new worker, placed (`grants` is `Some`) or pending, in one transaction.
    pub fn insert_worker(
        &mut self,
        name: &str,
        spec: &str,
        owner_uid: u32,
        holders: &[crate::worker::Holder],
        grants: Option<&[Grant]>,
        at: EpochMs,
    ) -> Result<i64> {
        let at_ms = at.as_i64();
        let tx = self.change()?;
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
        if let Some(grants) = grants {
            insert_grants(&tx, id, grants, at)?;
        }
        failpoint::hit("store.insert.before-commit");
        tx.commit()?;
        failpoint::hit("store.insert.after-commit");
        Ok(id)
    }

    /// A pending worker is placed.
    pub fn start_worker(&mut self, id: i64, grants: &[Grant], at: EpochMs) -> Result<()> {
        let at_ms = at.as_i64();
        // A test refuses one placement here, as a full disk would.
        if failpoint::fails("store.start") {
            return Err(rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_FULL),
                Some("failpoint store.start".into()),
            )
            .into());
        }
        let tx = self.change()?;
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
        insert_grants(&tx, id, grants, at)?;
        failpoint::hit("store.start.before-commit");
        tx.commit()?;
        failpoint::hit("store.start.after-commit");
        Ok(())
    }

    /// A worker that launched nothing ends: its allocations are released
    /// in the same transaction.
    pub fn stop_worker(&mut self, id: i64, at: EpochMs) -> Result<()> {
        self.end_worker(id, at, None, "stopped", false)
    }

    /// A worker ends — stopped, exited or failed — and its allocations are
    /// released, in one transaction. What only a live worker needs goes
    /// with it: its request (env values included: tokens) is cut to what
    /// history and the usage report read of an ended worker (whether it
    /// `launched` a workload, which runs on while the daemon is down), and
    /// its holders and control group are dropped. So churn keeps some
    /// hundred bytes a worker, not its request (up to 256 KiB).
    pub fn end_worker(
        &mut self,
        id: i64,
        at: EpochMs,
        exit_status: Option<i32>,
        reason: &str,
        launched: bool,
    ) -> Result<()> {
        let at_ms = at.as_i64();
        let kept = if launched { ENDED_LAUNCHED } else { "{}" };
        let tx = self.change()?;
        let n = exec(
            &tx,
            "UPDATE workers SET state = 'stopped', ended_ms = ?2, exit_status = ?3, end_reason = ?4,
                 spec = ?5, holders = '[]', cgroup = NULL
             WHERE id = ?1 AND state != 'stopped'",
            params![id, at_ms, exit_status, reason, kept],
        )?;
        if n != 1 {
            return Err(Error::Backend(format!("ledger: worker {id} is not live")));
        }
        failpoint::hit("store.stop.after-state");
        exec(
            &tx,
            "UPDATE holds SET to_ms = ?2 WHERE worker_id = ?1 AND to_ms IS NULL",
            params![id, at_ms],
        )?;
        failpoint::hit("store.stop.before-commit");
        tx.commit()?;
        failpoint::hit("store.stop.after-commit");
        Ok(())
    }

    /// Records the runtime's id of a launched worker.
    pub fn set_runtime_id(&mut self, id: i64, runtime_id: &str) -> Result<()> {
        self.write(
            "UPDATE workers SET runtime_id = ?2 WHERE id = ?1 AND state = 'running'",
            params![id, runtime_id],
        )?;
        Ok(())
    }

    /// Records a launched worker's control group.
    /// A live worker's holders, replaced (those gone are dropped).
    pub fn set_holders(&mut self, id: i64, holders: &[crate::worker::Holder]) -> Result<()> {
        self.write(
            "UPDATE workers SET holders = ?2 WHERE id = ?1",
            params![
                id,
                serde_json::to_string(holders).expect("holders serialize")
            ],
        )?;
        Ok(())
    }

    /// Records that a live worker's stop was asked (by `by`, at `at`):
    /// before the caller is told, so that a crash or a lost call to the
    /// runtime cannot undo it (the stop is carried out again from here).
    /// The first ask is kept.
    pub fn ask_stop(&mut self, id: i64, by: u32, at: EpochMs) -> Result<()> {
        self.write(
            "UPDATE workers SET stop_asked_ms = ?2, stop_asked_by = ?3
             WHERE id = ?1 AND state != 'stopped' AND stop_asked_ms IS NULL",
            params![id, at.as_i64(), by],
        )?;
        failpoint::hit("store.ask-stop.after-write");
        Ok(())
    }

    pub fn set_cgroup(&mut self, id: i64, cgroup: &str) -> Result<()> {
        self.write(
            "UPDATE workers SET cgroup = ?2 WHERE id = ?1 AND state = 'running'",
            params![id, cgroup],
        )?;
        Ok(())
    }

    /// Each submit (its owner, when) since `since_ms`, live or ended: a
    /// start reads the submit rate's window back from them. Newest first,
    /// by id (submits are numbered as they come), read until 10 s older
    /// than `since_ms` (a clock set back meanwhile) so that a start reads
    /// the last minute, not the ledger.
    pub fn submits_since(&self, since_ms: i64) -> Result<Vec<(u32, i64)>> {
        let mut stmt = self
            .conn
            .prepare("SELECT owner_uid, submitted_ms FROM workers ORDER BY id DESC")?;
        let mut rows = stmt.query([])?;
        let mut out = Vec::new();
        while let Some(r) = rows.next()? {
            let (uid, at): (u32, i64) = (r.get(0)?, r.get(1)?);
            if at < since_ms - 10_000 {
                break;
            }
            out.push((uid, at));
        }
        Ok(out)
    }

    /// Every live worker with its allocations, oldest first.
    pub fn live_workers(&self) -> Result<Vec<WorkerRow>> {
        let mut stmt = self.conn.prepare_cached(LIVE_WORKERS)?;
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
                    r.get::<_, Option<i64>>(9)?,
                    r.get::<_, Option<i64>>(10)?
                        .zip(r.get::<_, Option<u32>>(11)?),
                ))
            })?
            .map(|row| {
                let (
                    id,
                    name,
                    spec,
                    owner_uid,
                    holders,
                    state,
                    submitted_ms,
                    runtime_id,
                    cgroup,
                    started_ms,
                    stop_asked,
                ) = row?;
                Ok(WorkerRow {
                    id,
                    name,
                    spec,
                    owner_uid,
                    holders: parse_holders(&holders).map_err(|e| {
                        Error::Backend(format!("ledger: holders of worker {id}: {e}"))
                    })?,
                    state: WorkerState::parse(&state)?,
                    submitted_ms,
                    started_ms,
                    grants: Vec::new(),
                    runtime_id,
                    cgroup,
                    stop_asked,
                })
            })
            .collect::<Result<_>>()?;
        let mut by_id: std::collections::HashMap<i64, usize> =
            rows.iter().enumerate().map(|(i, r)| (r.id, i)).collect();
        let mut stmt = self.conn.prepare_cached(LIVE_HOLDS)?;
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

    /// Allocations (holds not ended) whose worker is not running: must
    /// always be empty.
    pub fn orphan_allocations(&self) -> Result<i64> {
        Ok(self.conn.query_row(
            "SELECT count(*) FROM holds h LEFT JOIN workers w ON w.id = h.worker_id
             WHERE h.to_ms IS NULL AND (w.id IS NULL OR w.state != 'running')",
            [],
            |r| r.get(0),
        )?)
    }

    /// Workers that ended at or after `since_ms`, newest first, at most
    /// `limit` of them, each with the GPUs it held.
    pub fn ended_workers(&self, since_ms: i64, limit: u32) -> Result<Vec<EndedWorker>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT id, name, owner_uid, submitted_ms, started_ms, ended_ms, exit_status,
                    coalesce(end_reason, '')
             FROM workers WHERE state = 'stopped' AND ended_ms >= ?1
             ORDER BY ended_ms DESC, id DESC LIMIT ?2",
        )?;
        let mut rows: Vec<EndedWorker> = stmt
            .query_map(params![since_ms, limit], |r| {
                Ok(EndedWorker {
                    id: r.get(0)?,
                    name: r.get(1)?,
                    owner_uid: r.get(2)?,
                    submitted_ms: r.get(3)?,
                    started_ms: r.get(4)?,
                    ended_ms: r.get(5)?,
                    exit_status: r.get(6)?,
                    end_reason: r.get(7)?,
                    grants: Vec::new(),
                })
            })?
            .collect::<rusqlite::Result<_>>()?;
        let mut held = self.conn.prepare_cached(
            "SELECT gpu_uuid, gpu_index, share_hundredths FROM holds
             WHERE worker_id = ?1 ORDER BY gpu_index",
        )?;
        for w in &mut rows {
            w.grants = held
                .query_map(params![w.id], |r| {
                    Ok(Grant {
                        gpu_uuid: r.get(0)?,
                        gpu_index: r.get(1)?,
                        share: r
                            .get::<_, Option<i64>>(2)?
                            .map(|h| Amount::from_hundredths(h as u64)),
                    })
                })?
                .collect::<rusqlite::Result<_>>()?;
        }
        Ok(rows)
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
}

/// Holders as the ledger keeps them: `[{"pid":…,"start":…}]`, or bare pids
/// from before identities were kept (their identity unknown).
fn parse_holders(text: &str) -> serde_json::Result<Vec<crate::worker::Holder>> {
    use crate::worker::Holder;
    serde_json::from_str::<Vec<Holder>>(text).or_else(|_| {
        serde_json::from_str::<Vec<u32>>(text).map(|pids| {
            pids.into_iter()
                .map(|pid| Holder { pid, start: None })
                .collect()
        })
    })
}
