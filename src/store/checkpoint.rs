//! The log's checkpoints, off the thread that commits.
//!
//! SQLite's automatic checkpoint runs inside the COMMIT that brings the
//! write-ahead log to 1,000 pages: on the service loop, every ~200 calls, it
//! copied those pages into the database and synced it (1–7 ms here), while
//! every caller waited (#25: the lone calls' p99). The ledger's writer
//! instead only notes the log's length ([`on_commit`]); past
//! [`EVERY_PAGES`] it asks a thread of its own, with its own connection, for
//! a PASSIVE checkpoint, which runs beside later commits. Should that
//! thread fall behind or fail, the writer checkpoints inline at
//! [`BACKSTOP_PAGES`], as SQLite would have.

use crate::error::{Error, Result};
use rusqlite::Connection;
use std::cell::Cell;
use std::ffi::c_int;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::Arc;

/// The log's length (pages) at which a checkpoint is asked for: SQLite's
/// own default.
pub const EVERY_PAGES: c_int = 1000;
/// The log's length at which the writer checkpoints itself.
pub const BACKSTOP_PAGES: c_int = 2000;

thread_local! {
    /// The log's length after this thread's last commit: the hook below
    /// runs inside the COMMIT, on the committing thread.
    static LOG_PAGES: Cell<c_int> = const { Cell::new(0) };
}

/// The writer's WAL hook (it replaces SQLite's automatic checkpoint).
pub fn on_commit(wal: &rusqlite::hooks::Wal, pages: c_int) -> rusqlite::Result<()> {
    LOG_PAGES.with(|p| p.set(pages));
    if pages >= BACKSTOP_PAGES {
        // An error here would make the COMMIT report a failure although it
        // committed; a checkpoint not done now is done at a later commit.
        let _ = wal.checkpoint();
    }
    Ok(())
}

/// The thread that checkpoints the ledger's log when asked.
pub struct Checkpointer {
    ask: SyncSender<()>,
    /// A checkpoint was asked for and has not finished.
    asked: Arc<AtomicBool>,
}

impl Checkpointer {
    pub fn start(path: &Path) -> Result<Checkpointer> {
        let fail = |e: rusqlite::Error| {
            Error::Backend(format!("ledger {}: checkpoints: {e}", path.display()))
        };
        let conn = Connection::open(path).map_err(fail)?;
        // A checkpoint syncs the log before and the database after at FULL.
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(fail)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(fail)?;
        let (ask, asked_for) = sync_channel::<()>(1);
        let asked = Arc::new(AtomicBool::new(false));
        let done = asked.clone();
        std::thread::Builder::new()
            .name("checkpoints".into())
            .spawn(move || {
                while asked_for.recv().is_ok() {
                    // A test holds checkpoints here to see the loop go on.
                    crate::failpoint::hit("store.checkpoint");
                    if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
                    {
                        tracing::warn!(
                            "ledger: a checkpoint failed ({e}); later commits ask again"
                        );
                    }
                    done.store(false, Ordering::SeqCst);
                }
            })
            .map_err(|e| Error::Backend(format!("ledger: the checkpoint thread: {e}")))?;
        Ok(Checkpointer { ask, asked })
    }

    /// After a commit on this thread: asks for a checkpoint once the log is
    /// long, unless one is under way.
    pub fn after_commit(&self) {
        let pages = LOG_PAGES.with(Cell::get);
        if pages >= EVERY_PAGES && !self.asked.swap(true, Ordering::SeqCst) {
            // Full only while one is under way, which `asked` rules out.
            let _ = self.ask.try_send(());
        }
    }
}
