//! Room on the ledger's disk. A member churning submits, or anything else
//! on the same filesystem, must not leave the host where no share can be
//! freed: below a floor of free space new submits are refused (saying so),
//! and room for stops, exits, readings and handoff steps is held inside the
//! ledger's own files, where nothing else on the filesystem can take it.
//!
//! That room is of two kinds. The write-ahead log's: its file is kept
//! when the daemon closes (`SQLITE_FCNTL_PERSIST_WAL`) and never
//! truncated (SQLite rewinds it after each checkpoint), and blocks are
//! allocated beyond its end (`fallocate` with `FALLOC_FL_KEEP_SIZE`: its
//! size and content unchanged), so a commit's frames go into blocks the log
//! already owns. The database's: pages kept free inside the file (SQLite
//! takes new pages from its free list before it grows the file), in a file
//! whose size is whole chunks of allocated blocks
//! (`SQLITE_FCNTL_CHUNK_SIZE`: never a sparse hole a checkpoint would have
//! to fill). So on a disk another user keeps full (a `dd` loop taking every
//! block freed) stops, exits, readings and handoff steps still commit, and
//! a start opens the ledger without making a file. A reserve given back to
//! the filesystem instead (a file freed a piece at a time, until #63) went
//! to whoever wrote next.

use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// Room kept beyond the log's end: thousands of stops' frames.
pub const RESERVE_BYTES: u64 = 4 * 1024 * 1024;

/// Room kept in the database's free pages: a stop changes pages that
/// exist; what grows the file (readings, new workers) finds this much.
/// Made by writing it through the log once, so no more than needed.
pub const FREE_PAGES_BYTES: u64 = 1024 * 1024;

/// The database file grows (and is truncated) in whole chunks of this,
/// allocated when it grows.
const CHUNK_BYTES: libc::c_int = 1024 * 1024;

/// The reserve is topped up at most this often (a system call per file).
const KEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

pub(super) struct Room {
    /// The ledger's directory, whose filesystem is measured.
    dir: PathBuf,
    /// The write-ahead log.
    wal: PathBuf,
    /// New work is refused below this many free bytes (`history.min_free_mb`).
    min_free: u64,
    /// When the reserve was last topped up.
    kept: std::cell::Cell<Option<std::time::Instant>>,
}

/// Bytes an unprivileged writer may still use on `dir`'s filesystem.
pub fn free_bytes(dir: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C string and a statvfs to fill.
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    #[allow(clippy::useless_conversion)] // the fields' types differ by platform
    Ok(u64::from(s.f_bavail).saturating_mul(u64::from(s.f_frsize)))
}

/// The write-ahead log's path beside `ledger`.
pub fn wal_of(ledger: &Path) -> PathBuf {
    let mut wal = ledger.as_os_str().to_owned();
    wal.push("-wal");
    wal.into()
}

/// Keeps the connection's write-ahead log when it closes (SQLite deletes
/// it otherwise, and makes it anew at the next open): its blocks are the
/// ledger's room. Every connection that opens the ledger sets it, since
/// the last one to close decides.
/// The database grows in allocated chunks ([`CHUNK_BYTES`]): set on every
/// connection too (each checkpoints through its own file handle).
pub(super) fn persist_wal(conn: &rusqlite::Connection) {
    for (op, mut value) in [
        (rusqlite::ffi::SQLITE_FCNTL_PERSIST_WAL, 1 as libc::c_int),
        (rusqlite::ffi::SQLITE_FCNTL_CHUNK_SIZE, CHUNK_BYTES),
    ] {
        // SAFETY: a valid connection handle, the main database's name as a
        // C string, and an int the file control reads (and may write).
        unsafe {
            rusqlite::ffi::sqlite3_file_control(
                conn.handle(),
                c"main".as_ptr(),
                op,
                (&mut value as *mut libc::c_int).cast(),
            );
        }
    }
}

impl Room {
    /// The room of `ledger`. A reserve file an older daemon kept beside it
    /// is removed (its space is what opening the ledger may need now).
    pub(super) fn beside(ledger: &Path) -> Room {
        let dir = ledger
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_path_buf();
        let mut old_reserve = ledger.as_os_str().to_owned();
        old_reserve.push(".reserve");
        let _ = std::fs::remove_file(PathBuf::from(old_reserve));
        Room {
            dir,
            wal: wal_of(ledger),
            min_free: 0,
            kept: std::cell::Cell::new(None),
        }
    }

    pub(super) fn set_min_free(&mut self, bytes: u64) {
        self.min_free = bytes;
    }

    /// Whether the reserve is due to be topped up ([`KEEP_EVERY`]).
    pub(super) fn due(&self) -> bool {
        self.kept.get().is_none_or(|t| t.elapsed() >= KEEP_EVERY)
    }

    /// Whether the disk has room for the reserve: the floor and as much
    /// again free (on a small disk the reserve must not be what fills it).
    pub(super) fn room_for_reserve(&self) -> bool {
        self.kept.set(Some(std::time::Instant::now()));
        free_bytes(&self.dir)
            .is_ok_and(|free| free >= self.min_free.max(RESERVE_BYTES) + 2 * RESERVE_BYTES)
    }

    /// Tops up the room beyond the log's end to [`RESERVE_BYTES`]: what it
    /// grew into since is allocated again. Without `fallocate` (a
    /// filesystem that has none) there is none: said at debug.
    pub(super) fn keep_log_reserve(&self) {
        use std::os::unix::fs::MetadataExt;
        use std::os::unix::io::AsRawFd;
        let Ok(f) = std::fs::OpenOptions::new().write(true).open(&self.wal) else {
            return; // no log yet: the first commit makes it
        };
        let Ok(meta) = f.metadata() else {
            return;
        };
        if (meta.blocks() * 512).saturating_sub(meta.len()) >= RESERVE_BYTES {
            return;
        }
        // SAFETY: an open descriptor; KEEP_SIZE changes neither the file's
        // size nor its content.
        let r = unsafe {
            libc::fallocate(
                f.as_raw_fd(),
                libc::FALLOC_FL_KEEP_SIZE,
                meta.len() as libc::off_t,
                RESERVE_BYTES as libc::off_t,
            )
        };
        if r != 0 {
            let e = std::io::Error::last_os_error();
            tracing::debug!("the ledger's reserve beyond {}: {e}", self.wal.display());
        }
    }

    /// New work only above the floor: `Conflict`, naming the key, below it.
    pub(super) fn for_new_work(&self) -> Result<()> {
        let free = free_bytes(&self.dir)
            .map_err(|e| Error::Backend(format!("ledger's disk {}: {e}", self.dir.display())))?;
        if free < self.min_free {
            return Err(Error::Conflict(format!(
                "the ledger's disk ({}) has {} MB free, under the {} MB that \
                 history.min_free_mb keeps: new work is refused until space is freed there \
                 (stops still work)",
                self.dir.display(),
                free / 1_000_000,
                self.min_free / 1_000_000
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The log's reserve is blocks beyond its end, its size and content
    /// unchanged, topped up after it grew into it; new work is refused
    /// under the floor, naming the key.
    #[test]
    fn the_logs_reserve_lies_beyond_its_end_and_the_floor_names_its_key() {
        use std::os::unix::fs::MetadataExt;
        let reserved = |p: &Path| {
            let m = std::fs::metadata(p).unwrap();
            (m.blocks() * 512).saturating_sub(m.len())
        };
        let dir = tempfile::tempdir().unwrap();
        let ledger = dir.path().join("ledger.db");
        let wal = wal_of(&ledger);
        std::fs::write(&wal, vec![2u8; 4096]).unwrap();
        let mut room = Room::beside(&ledger);
        room.set_min_free(0);
        assert!(room.room_for_reserve());
        room.keep_log_reserve();
        assert!(reserved(&wal) >= RESERVE_BYTES);
        assert_eq!(
            std::fs::read(&wal).unwrap(),
            vec![2u8; 4096],
            "size and content kept"
        );
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new().append(true).open(&wal).unwrap();
        f.write_all(&vec![3u8; 1 << 20]).unwrap();
        assert!(reserved(&wal) < RESERVE_BYTES);
        room.keep_log_reserve();
        assert!(reserved(&wal) >= RESERVE_BYTES, "topped up");
        room.set_min_free(u64::MAX / 2);
        assert!(!room.room_for_reserve(), "not under the floor");
        let e = room.for_new_work().unwrap_err();
        assert_eq!(e.kind(), "Conflict");
        assert!(e.message().contains("history.min_free_mb"), "{e}");
    }
}
