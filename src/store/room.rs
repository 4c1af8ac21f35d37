//! Room on the ledger's disk. A member churning submits, or anything else
//! on the same filesystem, must not leave the host where no share can be
//! freed: below a floor of free space new submits are refused (saying so),
//! and a reserve file beside the ledger is given back when the disk is all
//! but full, so that stops, exits, readings and handoff steps still commit,
//! and a restart can still open the ledger (SQLite makes its log and
//! shared-memory files anew at each start).

use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// The reserve's size: thousands of stops' pages, and a start's log and
/// shared-memory index.
pub const RESERVE_BYTES: u64 = 8 * 1024 * 1024;

/// What one release gives back. A piece at a time, not the whole: whatever
/// else is filling the disk takes what is freed, and a whole reserve given
/// at once went to the filler before the next stop could use it (seen in
/// tests/faults.rs, one run in two).
const RELEASE_STEP: u64 = 1024 * 1024;
/// Below this much free space a piece of the reserve is given back before
/// a commit: a commit's pages and log fit in it many times over.
const RELEASE_BELOW: u64 = RELEASE_STEP;

pub(super) struct Room {
    /// The ledger's directory, whose filesystem is measured.
    dir: PathBuf,
    reserve: PathBuf,
    /// New work is refused below this many free bytes (`history.min_free_mb`).
    min_free: u64,
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

impl Room {
    /// The room beside `ledger`; at a start on a disk all but full the
    /// reserve is given back first, so that the ledger can be opened.
    pub(super) fn beside(ledger: &Path) -> Room {
        let dir = ledger
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_path_buf();
        let mut reserve = ledger.as_os_str().to_owned();
        reserve.push(".reserve");
        let room = Room {
            dir,
            reserve: reserve.into(),
            min_free: 0,
        };
        room.before_commit();
        room
    }

    pub(super) fn set_min_free(&mut self, bytes: u64) {
        self.min_free = bytes;
        self.keep_reserve();
    }

    /// The reserve's bytes now (0: none).
    fn reserve_len(&self) -> u64 {
        std::fs::metadata(&self.reserve).map_or(0, |m| m.len())
    }

    /// Before a commit: a disk all but full gets a piece of the reserve back.
    pub(super) fn before_commit(&self) {
        match free_bytes(&self.dir) {
            Ok(free) if free < RELEASE_BELOW => self.release(free),
            _ => {}
        }
    }

    /// A write found the disk full: a piece of the reserve goes, for the next try.
    pub(super) fn disk_full(&self) {
        self.release(free_bytes(&self.dir).unwrap_or(0));
    }

    fn release(&self, free: u64) {
        let len = self.reserve_len();
        if len == 0 {
            return;
        }
        let keep = len.saturating_sub(RELEASE_STEP);
        let done = if keep == 0 {
            std::fs::remove_file(&self.reserve)
        } else {
            std::fs::OpenOptions::new()
                .write(true)
                .open(&self.reserve)
                .and_then(|f| f.set_len(keep))
        };
        match done {
            Ok(()) => tracing::warn!(
                "the ledger's disk ({}) is all but full ({} KiB free): {} KiB of its reserve \
                 was given back ({} KiB left) so that stops, exits and readings still commit; \
                 new work is refused until space is freed",
                self.dir.display(),
                free / 1024,
                (len - keep) / 1024,
                keep / 1024
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::error!("giving back {}: {e}", self.reserve.display()),
        }
    }

    /// Makes the reserve again once there is room for it above the floor.
    pub(super) fn keep_reserve(&self) {
        if self.reserve_len() >= RESERVE_BYTES {
            return;
        }
        let Ok(free) = free_bytes(&self.dir) else {
            return;
        };
        if free < self.min_free.max(RESERVE_BYTES) + RESERVE_BYTES {
            return;
        }
        if let Err(e) = allocate(&self.reserve, RESERVE_BYTES) {
            let _ = std::fs::remove_file(&self.reserve);
            tracing::warn!("the ledger's reserve {}: {e}", self.reserve.display());
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
        self.keep_reserve();
        Ok(())
    }
}

/// A file of `bytes` whose blocks are allocated (not sparse), written to a
/// temporary name and renamed, so a half-made reserve is never taken for one.
fn allocate(path: &Path, bytes: u64) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::io::AsRawFd;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".new");
    let tmp = PathBuf::from(tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    // SAFETY: an open file descriptor.
    let r = unsafe { libc::posix_fallocate(f.as_raw_fd(), 0, bytes as libc::off_t) };
    if r != 0 {
        if r != libc::EOPNOTSUPP && r != libc::EINVAL {
            let _ = std::fs::remove_file(&tmp);
            return Err(std::io::Error::from_raw_os_error(r));
        }
        // A filesystem without fallocate: zeros, written.
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..bytes.div_ceil(1 << 20) {
            f.write_all(&zeros)
                .inspect_err(|_| drop(std::fs::remove_file(&tmp)))?;
        }
    }
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reserve is made where there is room, its blocks allocated (not
    /// a sparse file), and given back a piece at a time when a write finds
    /// the disk full; new work is refused under the floor, naming the key.
    #[test]
    fn the_reserve_is_real_and_given_back_and_the_floor_names_its_key() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = dir.path().join("ledger.db");
        let mut room = Room::beside(&ledger);
        room.set_min_free(0);
        let meta = std::fs::metadata(&room.reserve).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!(meta.len(), RESERVE_BYTES);
        assert!(
            meta.blocks() * 512 >= RESERVE_BYTES,
            "allocated, not sparse"
        );
        assert_eq!(meta.mode() & 0o777, 0o600);
        room.for_new_work().unwrap();
        room.disk_full();
        assert_eq!(room.reserve_len(), RESERVE_BYTES - RELEASE_STEP);
        for _ in 0..RESERVE_BYTES / RELEASE_STEP {
            room.disk_full();
        }
        assert_eq!(room.reserve_len(), 0);
        assert!(!room.reserve.exists());
        // Made again, whole, at the next new work there is room for.
        room.for_new_work().unwrap();
        assert_eq!(room.reserve_len(), RESERVE_BYTES);
        room.disk_full();
        room.for_new_work().unwrap();
        assert_eq!(room.reserve_len(), RESERVE_BYTES, "topped up");
        room.set_min_free(u64::MAX / 2);
        let e = room.for_new_work().unwrap_err();
        assert_eq!(e.kind(), "Conflict");
        assert!(e.message().contains("history.min_free_mb"), "{e}");
    }
}
