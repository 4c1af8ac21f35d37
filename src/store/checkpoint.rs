//! The log's checkpoints, off the thread that commits.
//!
//! SQLite's automatic checkpoint runs inside the COMMIT that brings the
//! write-ahead log to 1,000 pages: on the service loop, every ~200 calls, it
//! copied those pages into the database and synced it (1–7 ms here), while
//! every caller waited (#25). The ledger's writer instead only notes the
//! log's length ([`on_commit`]); past [`EVERY_PAGES`] it asks a thread of
//! its own, with its own connection, to copy the log into the database and
//! sync it, beside later commits, and asks again after each pass while the
//! log is long. A pass that commits land in cannot let the log start over:
//! under a steady stream of commits the writer does that at
//! [`BACKSTOP_PAGES`], checkpointing inline as SQLite would have, with only
//! the pages since the thread's last pass left to copy and sync. Should the
//! thread be stuck or fail, that backstop bounds the log too.

use crate::error::{Error, Result};
use rusqlite::Connection;
use std::cell::Cell;
use std::ffi::c_int;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::time::Duration;

/// The log's length (pages) at which a pass is asked for: SQLite's own
/// default.
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
    ask: Option<SyncSender<()>>,
    /// A pass was asked for and has not finished.
    asked: Arc<AtomicBool>,
    /// Told when the thread has closed its connection.
    ended: Receiver<()>,
}

impl Checkpointer {
    pub fn start(path: &Path) -> Result<Checkpointer> {
        let fail =
            |e: String| Error::Backend(format!("ledger {}: checkpoints: {e}", path.display()));
        let conn = Connection::open(path).map_err(|e| fail(e.to_string()))?;
        super::room::persist_wal(&conn);
        // Its passes sync the log before copying and the database after.
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(|e| fail(e.to_string()))?;
        // A pass that commits landed in syncs nothing: the database is
        // synced here, so that the backstop syncs only the pages it copies.
        let database = std::fs::File::open(path).map_err(|e| fail(e.to_string()))?;
        let (ask, asked_for) = sync_channel::<()>(1);
        let (end, ended) = channel();
        let asked = Arc::new(AtomicBool::new(false));
        let done = asked.clone();
        std::thread::Builder::new()
            .name("checkpoints".into())
            .spawn(move || {
                while asked_for.recv().is_ok() {
                    // A test holds checkpoints here to see the loop go on.
                    crate::failpoint::hit("store.checkpoint");
                    let copied = conn
                        .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
                        .map_err(|e| e.to_string())
                        .and_then(|()| database.sync_data().map_err(|e| e.to_string()));
                    if let Err(e) = copied {
                        tracing::warn!(
                            "ledger: a checkpoint failed ({e}); later commits ask again"
                        );
                    }
                    done.store(false, Ordering::SeqCst);
                }
                drop(conn);
                let _ = end.send(());
            })
            .map_err(|e| fail(e.to_string()))?;
        Ok(Checkpointer {
            ask: Some(ask),
            asked,
            ended,
        })
    }

    /// After a commit, on the committing thread: asks for a pass once the
    /// log is long, unless one is under way.
    pub fn after_commit(&self) {
        let pages = LOG_PAGES.with(Cell::get);
        if pages >= EVERY_PAGES && !self.asked.swap(true, Ordering::SeqCst) {
            if let Some(ask) = &self.ask {
                // Full only while a pass is under way, which `asked` rules out.
                let _ = ask.try_send(());
            }
        }
    }
}

impl Drop for Checkpointer {
    /// The thread closes its connection before the writer closes its own
    /// (the last to close checkpoints and removes the log), unless it is
    /// stuck in a pass.
    fn drop(&mut self) {
        self.ask = None;
        let _ = self.ended.recv_timeout(Duration::from_secs(2));
    }
}
