//! Where a session daemon's ledger lives, and the one move an older
//! layout needs. systemd 252 maps a user unit's `StateDirectory=` to
//! `~/.config`, 254 and later to `~/.local/state`: a daemon that followed
//! `$STATE_DIRECTORY` found an empty ledger after an upgrade. A session
//! daemon now keeps it in `$XDG_STATE_HOME/astraeus` on every systemd, and
//! carries a ledger an older build left in `~/.config/astraeus` over once.

use crate::error::{Error, Result};
use std::path::Path;

/// The name an old ledger is set aside under once carried over: kept (a
/// copy to go back to), never read again.
pub const CARRIED_OVER: &str = "ledger.db.carried-over";

/// Carries the ledger at `old` over to `new`, when `new` has none yet and
/// `old` exists: SQLite copies it whole into a file beside `new` (`VACUUM
/// INTO` reads every committed row, those still in its log too), synced,
/// then renamed into place (a crash leaves either no ledger there, and the
/// move is made again, or the whole one); then the old file and its log
/// are set aside. Ok(true): carried over.
pub fn carry_over(old: &Path, new: &Path) -> Result<bool> {
    if new.exists() || !old.exists() {
        return Ok(false);
    }
    let fail = |what: &str, e: String| {
        Error::Backend(format!(
            "carrying the ledger {} over to {}: {what}: {e}",
            old.display(),
            new.display()
        ))
    };
    let dir = new.parent().unwrap_or(Path::new("."));
    let copy = dir.join("ledger.db.carrying");
    let _ = std::fs::remove_file(&copy);
    {
        let conn =
            rusqlite::Connection::open(old).map_err(|e| fail("opening it", e.to_string()))?;
        conn.execute("VACUUM INTO ?1", [copy.to_string_lossy().as_ref()])
            .map_err(|e| fail("copying it", e.to_string()))?;
    }
    std::fs::File::open(&copy)
        .and_then(|f| f.sync_all())
        .map_err(|e| fail("syncing the copy", e.to_string()))?;
    std::fs::rename(&copy, new).map_err(|e| fail("renaming the copy", e.to_string()))?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    let aside = old.with_file_name(CARRIED_OVER);
    std::fs::rename(old, &aside).map_err(|e| fail("setting the old one aside", e.to_string()))?;
    for suffix in ["-wal", "-shm"] {
        let mut log = old.as_os_str().to_owned();
        log.push(suffix);
        let mut to = aside.as_os_str().to_owned();
        to.push(suffix);
        let _ = std::fs::rename(&log, &to);
    }
    tracing::info!(
        "the ledger {} (where an older build kept it) was carried over to {}; the old file is \
         kept as {}",
        old.display(),
        new.display(),
        aside.display()
    );
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ledger left with its log unmerged (a kill) is carried over whole,
    /// once; the old one is set aside; a second call does nothing.
    #[test]
    fn a_ledger_is_carried_over_once_with_its_log() {
        let top = tempfile::tempdir().unwrap();
        let (old_dir, new_dir) = (top.path().join("config"), top.path().join("state"));
        std::fs::create_dir_all(&old_dir).unwrap();
        std::fs::create_dir_all(&new_dir).unwrap();
        let old = old_dir.join("ledger.db");
        let writer = rusqlite::Connection::open(&old).unwrap();
        writer.pragma_update(None, "journal_mode", "WAL").unwrap();
        writer.pragma_update(None, "wal_autocheckpoint", 0).unwrap();
        writer
            .execute_batch("CREATE TABLE t (n INTEGER); INSERT INTO t VALUES (1), (2), (3);")
            .unwrap();
        // Left open, as by a kill: the rows are in the log alone.
        assert!(
            std::fs::metadata(old_dir.join("ledger.db-wal"))
                .unwrap()
                .len()
                > 0
        );
        let new = new_dir.join("ledger.db");
        assert!(carry_over(&old, &new).unwrap());
        drop(writer);
        let n: i64 = rusqlite::Connection::open(&new)
            .unwrap()
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 3);
        assert!(!old.exists());
        assert!(old_dir.join(CARRIED_OVER).exists());
        assert!(!new_dir.join("ledger.db.carrying").exists());
        // Once: with a ledger at `new`, nothing more is carried.
        std::fs::write(&old, b"an old file again").unwrap();
        assert!(!carry_over(&old, &new).unwrap());
        assert!(old.exists());
    }
}
