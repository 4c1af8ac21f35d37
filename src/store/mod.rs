//! The ledger: SQLite through rusqlite, in one place. Every mutation is one
//! transaction, committed durably (WAL + synchronous=FULL) before the caller
//! acknowledges anything, so a crash at any point loses nothing acknowledged
//! and books nothing twice.

mod checkpoint;
mod counters;
pub mod home;
mod retention;
mod rollup;
pub mod room;
mod schema;
mod slicing;
mod usage;
mod workers;

pub use retention::Forgotten;
pub use slicing::SliceRecord;
pub use usage::{CurrentRun, HoldRow, UsageInputs};
pub use workers::{EndedWorker, WorkerRow, WorkerState};

use crate::error::{Error, Result};
use crate::time::EpochMs;
use rusqlite::{params, Connection, OptionalExtension};
use schema::{MIGRATIONS, MIN_SQLITE};
use std::path::Path;

pub use crate::slicing::meter::SliceMeasures;

/// The ledger and its WAL and shared-memory files are the daemon's alone
/// (0600): they hold run specs, whose env values (tokens) the bus hides.
/// SQLite gives the WAL and shm the database file's mode, so creating that
/// 0600 is enough; files of an older install are corrected.
fn private_files(path: &Path) -> Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let fail = |p: &Path, e: std::io::Error| Error::Backend(format!("ledger {}: {e}", p.display()));
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| fail(path, e))?;
    for suffix in ["", "-wal", "-shm"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        let p = std::path::PathBuf::from(p);
        match std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)) {
            // Absent, or removed meanwhile by a connection closing last.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            r => r.map_err(|e| fail(&p, e))?,
        }
    }
    Ok(())
}

/// A group's commit or its fsync failed (see [`Store::end_group`]).
#[derive(Debug)]
pub struct GroupFailed {
    pub error: Error,
    pub how: Failure,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The ledger is as before the group (its commit failed or SQLite
    /// rolled it back): memory must follow.
    RolledBack,
    /// Written to the log, but its fsync failed: kept or not is known
    /// after a restart; new work is refused until then.
    Unsynced,
    /// Neither committed nor rolled back: only a restart can go on.
    Lost,
}

pub struct Store {
    /// Checkpoints the log away from the committing thread (None in
    /// memory and for readers). Before `conn`: dropped first, its thread
    /// closes its connection before the writer's.
    checkpoints: Option<checkpoint::Checkpointer>,
    conn: Connection,
    /// The ledger's file (None in memory), for [`Store::reader`].
    path: Option<std::path::PathBuf>,
    /// A group's transaction is open ([`Store::begin_group`]).
    in_group: bool,
    /// Set when that fsync failed: every later commit is refused (the commit
    /// hook rolls it back), reads go on, a restart rereads what is on disk.
    broken: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// The floor of free space and the reserve (None in memory): room.rs.
    room: Option<room::Room>,
}

impl Store {
    pub fn open(path: &Path) -> Result<Store> {
        let room = room::Room::beside(path);
        private_files(path)?;
        let conn = Connection::open(path)
            .map_err(|e| Error::Backend(format!("ledger {}: {e}", path.display())))?;
        room::persist_wal(&conn);
        let mut store = Store::setup(conn)?;
        store.path = Some(path.to_path_buf());
        store.checkpoints = Some(checkpoint::Checkpointer::start(path)?);
        store.room = Some(room);
        store.keep_reserve();
        Ok(store)
    }

    /// New submits are refused below `bytes` free on the ledger's disk
    /// (`history.min_free_mb`); the reserve is made when there is room.
    pub fn set_min_free(&mut self, bytes: u64) {
        if let Some(r) = &mut self.room {
            r.set_min_free(bytes);
        }
    }

    /// Tops up the room the ledger's files hold (room.rs), where the disk
    /// has it: beyond the log's end, and free pages in the database (a
    /// transaction of its own, outside any group, that adds a blob and
    /// deletes it: its pages stay on the free list).
    fn keep_reserve(&self) {
        let Some(room) = &self.room else {
            return;
        };
        if self.in_group || !self.conn.is_autocommit() || !room.room_for_reserve() {
            return;
        }
        // Free pages first: their blob passes through the log, which then
        // gets its reserve beyond what it grew to.
        if let Err(e) = self.keep_free_pages() {
            if !self.conn.is_autocommit() {
                let _ = self.conn.execute_batch("ROLLBACK");
            }
            tracing::debug!("ledger: keeping free pages: {e}");
        }
        room.keep_log_reserve();
    }

    fn keep_free_pages(&self) -> Result<()> {
        let free: i64 = self
            .conn
            .pragma_query_value(None, "freelist_count", |r| r.get(0))?;
        let page = self.page_size()?;
        let want = room::FREE_PAGES_BYTES as i64 / page;
        if free >= want / 2 {
            return Ok(());
        }
        let pad = (want - free) * page;
        self.conn.execute_batch(&format!(
            "BEGIN; INSERT INTO ledger_room (pad) VALUES (zeroblob({pad})); \
             DELETE FROM ledger_room; COMMIT;"
        ))?;
        self.after_commit();
        Ok(())
    }

    fn page_size(&self) -> Result<i64> {
        Ok(self
            .conn
            .pragma_query_value(None, "page_size", |r| r.get(0))?)
    }

    /// Free pages the ledger keeps as its room (room.rs): a shrink leaves them.
    pub fn pages_kept_free(&self) -> Result<u64> {
        Ok((room::FREE_PAGES_BYTES as i64 / self.page_size()?) as u64)
    }

    /// Whether the ledger's disk has room for new work (above the floor).
    pub fn room_for_new_work(&self) -> Result<()> {
        self.room.as_ref().map_or(Ok(()), room::Room::for_new_work)
    }

    /// A second, read-only connection to the same ledger (None for one in
    /// memory): long reads (a usage report over a year) run on it away from
    /// the service loop, which goes on writing (WAL lets a reader see the
    /// last commit while the writer adds more). Its schema is the one this
    /// store brought up to date.
    pub fn reader(&self) -> Result<Option<Store>> {
        let Some(path) = &self.path else {
            return Ok(None);
        };
        use rusqlite::OpenFlags;
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|e| Error::Backend(format!("ledger {}: {e}", path.display())))?;
        room::persist_wal(&conn);
        conn.set_prepared_statement_cache_capacity(64);
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        // Room for a year's report in its cache (SQLite's default is 2 MiB):
        // the next report reads the pages from memory, not through a
        // system call each. Only what reports read is kept, up to this.
        conn.pragma_update(None, "cache_size", -65_536)?;
        Ok(Some(Store {
            conn,
            path: None,
            in_group: false,
            broken: Default::default(),
            checkpoints: None,
            room: None,
        }))
    }

    /// Group commit: the changes until [`Store::end_group`] share one
    /// transaction (each change its own savepoint within it, so a change
    /// that fails is undone alone), written once and synced once: the
    /// pages a group touches are written once, not once per change. The
    /// caller holds every acknowledgement until `end_group` returns.
    /// After a failed commit whose fate is unknown no group is opened:
    /// each change then commits on its own, and the commit hook refuses it
    /// before memory changes.
    pub fn begin_group(&mut self) -> Result<()> {
        if self.in_group || self.broken.load(std::sync::atomic::Ordering::SeqCst) {
            return Ok(());
        }
        self.conn.prepare_cached("BEGIN")?.execute([])?;
        self.in_group = true;
        Ok(())
    }

    /// Commits the group, durably: at `synchronous = FULL` SQLite's COMMIT
    /// writes the group's pages to the log and fsyncs it once. A commit
    /// that fails to write (a full disk) leaves the ledger as it was before
    /// the group: [`Failure::RolledBack`] says the caller must undo the
    /// group in memory too. A commit whose fsync fails has left the whole
    /// group in the log, on disk or not: its fate is known after a restart,
    /// and nothing more is taken until then ([`Failure::Unsynced`]).
    pub fn end_group(&mut self) -> std::result::Result<(), GroupFailed> {
        if !self.in_group {
            return Ok(());
        }
        self.in_group = false;
        crate::failpoint::hit("store.group.before-commit");
        // SQLite rolls a whole transaction back on some I/O errors (FULL,
        // IOERR, NOMEM) in a statement; every change after that was refused
        // (`Store::change`), so the ledger is as before the group.
        let lost_under_us = self.conn.is_autocommit();
        let committed = if lost_under_us {
            Err(rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ABORT),
                Some("the group's transaction was rolled back by SQLite".into()),
            ))
        } else if crate::failpoint::fails("store.group.commit") {
            Err(rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_FULL),
                Some("failpoint store.group.commit".into()),
            ))
        } else {
            // A transaction whose every call was refused commits without a
            // sync in the cases measured (strace: refused inserts), and at
            // worst syncs once.
            self.conn
                .prepare_cached("COMMIT")
                .and_then(|mut c| c.execute([]))
                .inspect(|_| crate::failpoint::hit("store.group.after-commit"))
        }
        .map(drop);
        if let Err(e) = committed {
            if !self.conn.is_autocommit() {
                let _ = self.conn.execute_batch("ROLLBACK");
            }
            if !self.conn.is_autocommit() {
                // Neither committed nor rolled back: the connection is in no
                // state to go on from; only a restart rereads the ledger.
                self.refuse_until_restart();
                return Err(GroupFailed {
                    error: Error::Backend(format!(
                        "ledger: a group's commit failed ({e}) and so did its rollback; \
                         the daemon restarts to read the ledger again"
                    )),
                    how: Failure::Lost,
                });
            }
            if fate_unknown(&e) {
                self.refuse_until_restart();
                return Err(GroupFailed {
                    error: unconfirmed(&e),
                    how: Failure::Unsynced,
                });
            }
            return Err(GroupFailed {
                error: e.into(),
                how: Failure::RolledBack,
            });
        }
        self.after_commit();
        if self.room.as_ref().is_some_and(room::Room::due) {
            self.keep_reserve();
        }
        Ok(())
    }

    /// Asks for a checkpoint once the log is long (store/checkpoint.rs).
    fn after_commit(&self) {
        if let Some(c) = &self.checkpoints {
            c.after_commit();
        }
    }

    /// One change's savepoint: inside a group it is undone alone when the
    /// change fails; outside one it is the change's own transaction.
    /// Refused when its group's transaction was rolled back under it
    /// (it would commit on its own, unsynced, and be told it failed), or
    /// when a transaction outside any group is still open (it would never
    /// commit).
    fn change(&mut self) -> Result<Change<'_>> {
        if self.in_group == self.conn.is_autocommit() {
            return Err(Error::Backend(
                "ledger: its transaction was lost to an I/O error, so this change was not \
                 recorded; try again"
                    .into(),
            ));
        }
        exec(&self.conn, "SAVEPOINT change", [])?;
        Ok(Change {
            conn: &self.conn,
            alone: !self.in_group,
            broken: &self.broken,
            checkpoints: self.checkpoints.as_ref().filter(|_| !self.in_group),
            released: false,
        })
    }

    /// One statement outside a change's savepoint. Outside a group it is
    /// its own transaction, COMMIT and fsync included, so it can leave a
    /// commit of unknown fate as well ([`fate_unknown`]).
    fn write(&self, sql: &str, params: impl rusqlite::Params) -> Result<usize> {
        let n = exec(&self.conn, sql, params)
            .map_err(|e| failed_write(e, !self.in_group, &self.broken))?;
        if !self.in_group {
            self.after_commit();
        }
        Ok(n)
    }

    /// Whether commits are refused until a restart ([`Store::refuse_until_restart`],
    /// or a write whose fate is unknown).
    pub fn refuses_until_restart(&self) -> bool {
        self.broken.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// From now on every commit is refused (the commit hook), reads go on:
    /// for when the ledger's state or memory's agreement with it is unknown.
    pub fn refuse_until_restart(&self) {
        self.broken.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn open_in_memory() -> Result<Store> {
        Store::setup(Connection::open_in_memory()?)
    }

    fn setup(mut conn: Connection) -> Result<Store> {
        // The packages link the system's SQLite: the ledger's upserts
        // (ON CONFLICT … DO UPDATE) need 3.24 or later.
        if rusqlite::version_number() < MIN_SQLITE.0 {
            return Err(Error::Backend(format!(
                "ledger: SQLite {} is too old; astraeusd needs {} or later",
                rusqlite::version(),
                MIN_SQLITE.1
            )));
        }
        // WAL for concurrent readers; FULL so a commit survives power loss:
        // each COMMIT (a group's, see begin_group) fsyncs the log. Never
        // changed after this: a PRAGMA synchronous expires every prepared
        // statement, and toggling it around each group cost a lone call
        // 6 % (#25).
        // Every statement is prepared once and kept (parsing SQL was a seventh
        // of a submit's instructions under callgrind).
        conn.set_prepared_statement_cache_capacity(64);
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
        let version = version as usize;
        // Pages that retention frees go back to the filesystem
        // (store/retention.rs): set before a new ledger's first table; an
        // older ledger is rewritten once below.
        if version == 0 {
            conn.pragma_update(None, "auto_vacuum", "INCREMENTAL")?;
        }
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
        let auto_vacuum: i64 = conn.pragma_query_value(None, "auto_vacuum", |r| r.get(0))?;
        if auto_vacuum != 2 {
            // Once, for a ledger an older build made: a full rewrite (twice
            // its size free on its disk); without it, freed pages are still
            // reused, the file just does not shrink.
            let started = std::time::Instant::now();
            if let Err(e) = conn.execute_batch("PRAGMA auto_vacuum = INCREMENTAL; VACUUM;") {
                tracing::warn!(
                    "ledger: could not make it able to shrink ({e}); will try at the next start"
                );
            } else {
                tracing::info!(
                    "ledger: rewritten once so that retention can shrink it ({} ms)",
                    started.elapsed().as_millis()
                );
            }
        }
        let broken = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let refuse = broken.clone();
        conn.commit_hook(Some(move || {
            refuse.load(std::sync::atomic::Ordering::SeqCst)
        }))?;
        // Checkpoints are asked of another thread (store/checkpoint.rs);
        // this replaces SQLite's automatic one.
        conn.wal_hook(Some(checkpoint::on_commit));
        Ok(Store {
            conn,
            path: None,
            in_group: false,
            broken,
            checkpoints: None,
            room: None,
        })
    }

    /// The container engine ("podman" or "docker") this ledger's container
    /// workers were last started through (`runtime::containers`).
    pub fn container_engine(&self) -> Result<Option<String>> {
        Ok(self
            .conn
            .query_row(
                "SELECT CAST(value AS TEXT) FROM ledger_meta WHERE key = 'container_engine'",
                [],
                |r| r.get(0),
            )
            .optional()?)
    }

    pub fn set_container_engine(&mut self, engine: &str) -> Result<()> {
        self.write(
            "INSERT INTO ledger_meta (key, value) VALUES ('container_engine', ?1)
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            params![engine],
        )?;
        Ok(())
    }

    pub fn record_event(&mut self, kind: &str, detail: &str, at: EpochMs) -> Result<()> {
        let at_ms = at.as_i64();
        self.write(
            "INSERT INTO events (at_ms, worker_id, kind, detail) VALUES (?1, NULL, ?2, ?3)",
            params![at_ms, kind, detail],
        )?;
        Ok(())
    }
}

impl Store {
    pub fn event_count(&self) -> Result<i64> {
        Ok(self
            .conn
            .query_row("SELECT count(*) FROM events", [], |r| r.get(0))?)
    }
}

/// One change's savepoint (see [`Store::change`]), used as the connection
/// it derefs to. Alone (outside a group) its commit is the transaction's,
/// fsync included, and one of unknown fate refuses all later work.
/// Dropped unreleased (the change failed, or its release did) it is rolled
/// back and released, as rusqlite's `Savepoint` does; its three statements
/// are prepared once (rusqlite's parse theirs on every change: 3 % of a
/// lone call's CPU).
struct Change<'a> {
    conn: &'a Connection,
    alone: bool,
    broken: &'a std::sync::atomic::AtomicBool,
    /// Asked after the commit of a change alone, as a group's is after its.
    checkpoints: Option<&'a checkpoint::Checkpointer>,
    released: bool,
}

impl std::ops::Deref for Change<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        self.conn
    }
}

impl Change<'_> {
    fn commit(mut self) -> Result<()> {
        exec(self.conn, "RELEASE change", [])
            .map_err(|e| failed_write(e, self.alone, self.broken))?;
        self.released = true;
        if let Some(c) = self.checkpoints {
            c.after_commit();
        }
        Ok(())
    }
}

impl Drop for Change<'_> {
    fn drop(&mut self) {
        if !self.released {
            // Errors here leave the transaction to the group's commit or
            // rollback, or (alone, outside any transaction) mean there is
            // nothing left to undo.
            let _ = exec(self.conn, "ROLLBACK TO change", []);
            let _ = exec(self.conn, "RELEASE change", []);
        }
    }
}

/// The error of a write that was its own transaction (`alone`) or part of
/// a group's: alone, a commit of unknown fate refuses all later work.
fn failed_write(e: rusqlite::Error, alone: bool, broken: &std::sync::atomic::AtomicBool) -> Error {
    if alone && fate_unknown(&e) {
        broken.store(true, std::sync::atomic::Ordering::SeqCst);
        unconfirmed(&e)
    } else {
        e.into()
    }
}

/// Whether a failed COMMIT may have left its transaction in the log.
/// SQLite writes a commit's frames, the commit frame last, then fsyncs
/// them, then updates the log's index in shared memory: an I/O error from
/// the fsync on (the fsync, the index's shared memory, memory) leaves a
/// whole commit in the log, on disk or not, which SQLite replays at the
/// next open. Only a restart tells. The I/O errors known to come before
/// the commit frame is written (a failed read, write, lock or truncation;
/// a full disk is SQLITE_FULL) roll back for good, as does any error that
/// is not an I/O or memory error.
fn fate_unknown(e: &rusqlite::Error) -> bool {
    use rusqlite::ffi::*;
    let rusqlite::Error::SqliteFailure(f, _) = e else {
        return false;
    };
    let before_the_commit_frame = [
        SQLITE_IOERR_READ,
        SQLITE_IOERR_SHORT_READ,
        SQLITE_IOERR_WRITE,
        SQLITE_IOERR_TRUNCATE,
        SQLITE_IOERR_FSTAT,
        SQLITE_IOERR_LOCK,
        SQLITE_IOERR_RDLOCK,
        SQLITE_IOERR_ACCESS,
        SQLITE_IOERR_CHECKRESERVEDLOCK,
    ];
    match f.extended_code & 0xff {
        SQLITE_IOERR => !before_the_commit_frame.contains(&f.extended_code),
        SQLITE_NOMEM => true,
        _ => false,
    }
}

fn unconfirmed(e: &rusqlite::Error) -> Error {
    Error::Backend(format!(
        "ledger: its disk did not confirm the last writes ({e}); whether they were kept is \
         known after the daemon restarts, and new work is refused until then"
    ))
}

/// Runs one statement, prepared once per connection and cached.
fn exec(conn: &Connection, sql: &str, params: impl rusqlite::Params) -> rusqlite::Result<usize> {
    conn.prepare_cached(sql)?.execute(params)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::Grant;
    use crate::quantity::Amount;

    fn grant(uuid: &str, share: Option<u64>) -> Grant {
        Grant {
            gpu_uuid: uuid.into(),
            gpu_index: 0,
            share: share.map(Amount::from_hundredths),
        }
    }

    /// A change that fails part-way through a group is undone whole (its
    /// savepoint rolled back: its first statement's row goes too), and the
    /// group's other changes are committed. Seen failing with the
    /// savepoint's rollback left out.
    #[test]
    fn a_change_failing_part_way_through_a_group_is_undone_whole() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Store::open(&dir.path().join("ledger.db")).unwrap();
        s.begin_group().unwrap();
        s.insert_worker("a", "{}", 1, &[], None, EpochMs(1))
            .unwrap();
        // The hold, written after the worker's row, is refused.
        s.conn
            .execute_batch(
                "CREATE TEMP TRIGGER no_holds BEFORE INSERT ON holds \
                 BEGIN SELECT RAISE(ABORT, 'no holds'); END;",
            )
            .unwrap();
        let grants = [grant("GPU-0", Some(50))];
        assert!(s
            .insert_worker("x", "{}", 1, &[], Some(&grants), EpochMs(2))
            .is_err());
        s.conn.execute_batch("DROP TRIGGER no_holds").unwrap();
        s.insert_worker("b", "{}", 1, &[], Some(&grants), EpochMs(3))
            .unwrap();
        s.end_group().unwrap();
        // Read by another connection: what the ledger holds on disk.
        let other = Connection::open(dir.path().join("ledger.db")).unwrap();
        let names: Vec<String> = other
            .prepare("SELECT name FROM workers ORDER BY id")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert_eq!(names, ["a", "b"]);
        let holds: i64 = other
            .query_row("SELECT count(*) FROM holds", [], |r| r.get(0))
            .unwrap();
        assert_eq!(holds, 1, "b's hold only");
    }

    /// A group is one transaction at `synchronous = FULL` (its COMMIT
    /// fsyncs the log: tests/storm.rs's power cut is the oracle for that,
    /// tests/fsync.rs for a failed fsync); a change that fails is undone
    /// alone. After a commit of unknown fate every later change is refused.
    #[test]
    fn a_group_is_one_transaction_and_a_commit_of_unknown_fate_refuses_all_later_work() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        let mut s = Store::open(&path).unwrap();
        let sync_mode = |s: &Store| -> i64 {
            s.conn
                .pragma_query_value(None, "synchronous", |r| r.get(0))
                .unwrap()
        };
        s.begin_group().unwrap();
        assert_eq!(sync_mode(&s), 2, "FULL, in a group too");
        assert!(!s.conn.is_autocommit(), "one transaction for the group");
        s.insert_worker("a", "{}", 1, &[], None, EpochMs(1))
            .unwrap();
        s.insert_worker("b", "{}", 1, &[], None, EpochMs(1))
            .unwrap();
        // A change that fails is undone alone (its savepoint).
        assert!(s
            .insert_worker("a", "{}", 1, &[], None, EpochMs(1))
            .is_err());
        s.end_group().unwrap();
        assert!(s.conn.is_autocommit());
        s.begin_group().unwrap();
        s.insert_worker("c", "{}", 1, &[], None, EpochMs(1))
            .unwrap();
        s.end_group().unwrap();
        // What a commit whose fsync failed leaves (tests/fsync.rs makes a
        // real fsync fail): nothing more is taken.
        s.refuse_until_restart();
        // No group is opened any more: each change is refused on its own.
        s.begin_group().unwrap();
        assert!(s.conn.is_autocommit());
        let e = s
            .insert_worker("d", "{}", 1, &[], None, EpochMs(1))
            .unwrap_err();
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

    /// A failed fsync, or a failure after it (the log's index in shared
    /// memory, memory), may leave a whole commit in the log; a failed write
    /// leaves none (its commit frame is written last), a full disk or a
    /// refused commit neither.
    #[test]
    fn only_a_failure_from_the_fsync_on_leaves_a_commit_of_unknown_fate() {
        use rusqlite::ffi::*;
        let err = |code| rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), None);
        for code in [
            SQLITE_IOERR_FSYNC,
            SQLITE_IOERR_SHMMAP,
            SQLITE_IOERR_SHMSIZE,
            SQLITE_NOMEM,
        ] {
            assert!(fate_unknown(&err(code)), "{code}");
        }
        for code in [
            SQLITE_IOERR_WRITE,
            SQLITE_IOERR_READ,
            SQLITE_FULL,
            SQLITE_CONSTRAINT_COMMITHOOK,
            SQLITE_BUSY,
            SQLITE_READONLY,
        ] {
            assert!(!fate_unknown(&err(code)), "{code}");
        }
    }

    /// SQLite rolls a whole transaction back on some I/O errors in a
    /// statement (FULL, IOERR, NOMEM): the changes after that in the group
    /// are refused, not committed on their own unsynced, and the group ends
    /// rolled back, the ledger as before it.
    #[test]
    fn a_group_rolled_back_under_it_takes_no_more_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        let mut s = Store::open(&path).unwrap();
        s.begin_group().unwrap();
        s.insert_worker("a", "{}", 1, &[], None, EpochMs(1))
            .unwrap();
        // What SQLite does on its own after such an error.
        s.conn.execute_batch("ROLLBACK").unwrap();
        let e = s
            .insert_worker("b", "{}", 1, &[], None, EpochMs(1))
            .unwrap_err();
        assert!(e.message().contains("not recorded"), "{}", e.message());
        let failed = s.end_group().unwrap_err();
        assert_eq!(failed.how, Failure::RolledBack);
        drop(s);
        assert!(Store::open(&path)
            .unwrap()
            .live_workers()
            .unwrap()
            .is_empty());
    }

    /// A ledger from before allocations became open holds: a live worker's
    /// allocation with no hold of its own gets one, a hold left open for a
    /// worker that ended (its allocation gone) is closed at its end, and
    /// the live grants read back are exactly the allocations.
    #[test]
    fn allocations_become_open_holds_when_the_ledger_is_upgraded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        let mut conn = Connection::open(&path).unwrap();
        for (v, sql) in MIGRATIONS.iter().enumerate().take(8) {
            let tx = conn.transaction().unwrap();
            tx.execute_batch(sql).unwrap();
            tx.pragma_update(None, "user_version", (v + 1) as i64)
                .unwrap();
            tx.commit().unwrap();
        }
        // 1: an allocation without its hold; 2: ended, its hold left open;
        // 3: agreeing; 4: running, its hold closed and with another share;
        // 5: stopped, an allocation left behind.
        conn.execute_batch(
            "INSERT INTO workers (id, name, spec, owner_uid, state, submitted_ms, started_ms, ended_ms)
               VALUES (1, 'live', '{}', 7, 'running', 10, 20, NULL),
                      (2, 'ended', '{}', 7, 'stopped', 10, 20, 90),
                      (3, 'held', '{}', 7, 'running', 10, 30, NULL),
                      (4, 'closed', '{}', 7, 'running', 10, 40, NULL),
                      (5, 'left', '{}', 7, 'stopped', 10, 50, 95);
             INSERT INTO allocations VALUES (1, 'GPU-a', 0, 150), (3, 'GPU-b', 1, NULL),
                                            (4, 'GPU-a', 0, 250), (5, 'GPU-b', 1, 50);
             INSERT INTO holds (worker_id, gpu_uuid, gpu_index, share_hundredths, from_ms, to_ms)
               VALUES (2, 'GPU-a', 0, 100, 20, NULL), (3, 'GPU-b', 1, NULL, 30, NULL),
                      (4, 'GPU-a', 0, 100, 40, 60);",
        )
        .unwrap();
        drop(conn);
        let s = Store::open(&path).unwrap();
        let live: Vec<String> = s
            .live_workers()
            .unwrap()
            .into_iter()
            .map(|w| {
                let g: Vec<String> = w
                    .grants
                    .iter()
                    .map(|g| format!("{} {:?}", g.gpu_uuid, g.share.map(|a| a.hundredths())))
                    .collect();
                format!("{}: {}", w.name, g.join(", "))
            })
            .collect();
        assert_eq!(
            live,
            [
                "live: GPU-a Some(150)",
                "held: GPU-b None",
                "closed: GPU-a Some(250)"
            ]
        );
        assert_eq!(s.orphan_allocations().unwrap(), 0);
        let holds: Vec<(i64, i64, Option<i64>)> = s
            .conn
            .prepare("SELECT worker_id, from_ms, to_ms FROM holds ORDER BY worker_id")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert_eq!(
            holds,
            [
                (1, 20, None),
                (2, 20, Some(90)),
                (3, 30, None),
                (4, 40, None)
            ]
        );
    }

    #[test]
    fn migrations_apply_once_and_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        let mut s = Store::open(&path).unwrap();
        let id = s
            .insert_worker(
                "a",
                "{}",
                1000,
                &[],
                Some(&[grant("GPU-x", Some(220))]),
                EpochMs(1),
            )
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
        let id = s
            .insert_worker("a", "{}", 0, &[], None, EpochMs(1))
            .unwrap();
        let e = s
            .insert_worker("a", "{}", 0, &[], None, EpochMs(2))
            .unwrap_err();
        assert!(matches!(e, Error::Exists(_)));
        s.stop_worker(id, EpochMs(3)).unwrap();
        s.insert_worker("a", "{}", 0, &[], None, EpochMs(4))
            .unwrap();
        assert_eq!(s.orphan_allocations().unwrap(), 0);
    }

    #[test]
    fn stop_releases_allocations_in_the_same_transaction() {
        let mut s = Store::open_in_memory().unwrap();
        let id = s
            .insert_worker("a", "{}", 0, &[], None, EpochMs(1))
            .unwrap();
        s.start_worker(id, &[grant("GPU-x", None)], EpochMs(2))
            .unwrap();
        assert!(s
            .start_worker(id, &[grant("GPU-y", None)], EpochMs(2))
            .is_err());
        s.stop_worker(id, EpochMs(3)).unwrap();
        assert!(s.live_workers().unwrap().is_empty());
        assert_eq!(s.orphan_allocations().unwrap(), 0);
        assert!(s.stop_worker(id, EpochMs(4)).is_err());
    }
}
