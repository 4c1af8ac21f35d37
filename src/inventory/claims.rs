//! One authority per GPU on a host: each daemon that reads real GPUs holds
//! a lock per GPU UUID (`flock` on `/run/lock/astraeusd-gpu-<UUID>.lock`)
//! for as long as it manages it. A daemon started for a user (on the session
//! bus) leaves a GPU whose lock another daemon holds alone, and says so; the
//! system daemon manages its GPUs whatever a user holds (a user could take a
//! lock first to block it), and says that too.
//!
//! The files sit directly in /run/lock (sticky, world-writable), never in a
//! directory of ours a user could have put there first, and are opened
//! without following links.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::PathBuf;

/// Where the locks are kept unless `ASTRAEUS_GPU_LOCK_DIR` says otherwise
/// (tests: each daemon its own, or two sharing one).
pub const LOCK_DIR: &str = "/run/lock";

pub struct Claims {
    dir: PathBuf,
    /// Whether a GPU another daemon holds is left alone (a user's daemon) or
    /// managed anyway (the system's).
    yields: bool,
    held: HashMap<String, File>,
    /// GPUs left alone, each said once.
    left: HashSet<String>,
}

impl Claims {
    pub fn new(yields: bool) -> Claims {
        let dir = std::env::var_os("ASTRAEUS_GPU_LOCK_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(LOCK_DIR));
        Claims::in_dir(dir, yields)
    }

    fn in_dir(dir: PathBuf, yields: bool) -> Claims {
        Claims {
            dir,
            yields,
            held: HashMap::new(),
            left: HashSet::new(),
        }
    }

    /// Whether this daemon manages the GPU `uuid`: its lock taken now or
    /// before; or not taken, for the system daemon, which manages it anyway.
    pub fn may_manage(&mut self, uuid: &str) -> bool {
        if self.held.contains_key(uuid) {
            return true;
        }
        let safe: String = uuid
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let path = self.dir.join(format!("astraeusd-gpu-{safe}.lock"));
        // Never blocking: another user may have put a FIFO there, whose
        // open waits for a writer that never comes (before READY=1, or
        // holding the inventory's re-read until the watchdog ends us).
        let flags = libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK;
        let taken = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o644)
            .custom_flags(flags)
            .open(&path)
            .or_else(|_| {
                // Created by another user: open it as it is, read-only.
                std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(flags)
                    .open(&path)
            })
            .map_err(|e| e.to_string())
            .and_then(|f| match f.metadata() {
                // A second name is another file's (a hard link another user
                // made, where fs.protected_hardlinks is off): never changed
                // nor locked, which would block whoever locks it.
                Ok(m) if m.file_type().is_file() && m.nlink() > 1 => {
                    Err("it is another file's second name (a hard link)".into())
                }
                Ok(m) if m.file_type().is_file() => {
                    // Ours: readable by all (the unit's UMask makes it 0600),
                    // so a user's daemon can still open and lock it after
                    // this one is gone.
                    // SAFETY: geteuid cannot fail.
                    if m.uid() == unsafe { libc::geteuid() } && m.mode() & 0o777 != 0o644 {
                        let _ = f.set_permissions(std::fs::Permissions::from_mode(0o644));
                    }
                    Ok(f)
                }
                Ok(_) => Err("it is not a regular file (another user's FIFO or link?)".into()),
                Err(e) => Err(e.to_string()),
            })
            .and_then(|f| {
                // SAFETY: flock on a descriptor we own.
                match unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } {
                    0 => Ok(f),
                    _ => Err("another process holds it".to_string()),
                }
            });
        match taken {
            Ok(f) => {
                self.held.insert(uuid.to_string(), f);
                self.left.remove(uuid);
                true
            }
            Err(why) if self.yields => {
                if self.left.insert(uuid.to_string()) {
                    tracing::warn!(
                        "GPU {uuid} is managed by another astraeusd ({}: {why}): this daemon \
                         leaves it alone (one authority per GPU)",
                        path.display()
                    );
                }
                false
            }
            Err(why) => {
                if self.left.insert(uuid.to_string()) {
                    tracing::warn!(
                        "GPU {uuid}: its lock {} could not be taken ({why}); the system's \
                         astraeusd manages it anyway",
                        path.display()
                    );
                }
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// Asks `may_manage` in a thread: None when it did not answer in 5 s
    /// (a blocked open stays blocked; the test ends without it).
    fn answered(claims: Claims, uuid: &'static str) -> Option<(bool, Claims)> {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut claims = claims;
            let managed = claims.may_manage(uuid);
            let _ = tx.send((managed, claims));
        });
        rx.recv_timeout(Duration::from_secs(5)).ok()
    }

    /// Another user's FIFO (or anything but a regular file) where a lock
    /// belongs is never opened to wait on, nor held as a lock: a user's
    /// daemon leaves the GPU alone, the system's manages it anyway.
    #[test]
    fn a_fifo_where_a_lock_belongs_is_not_waited_on_nor_held() {
        // SAFETY: geteuid cannot fail.
        let root = unsafe { libc::geteuid() } == 0;
        for yields in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("astraeusd-gpu-GPU-1.lock");
            let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
            // As /run/lock has it: the read-write open fails (another user's
            // FIFO in a sticky world-writable directory, fs.protected_fifos;
            // or, not root, one we may only read) and the read-only one
            // follows, which waited for a writer for ever.
            let mode = if root { 0o666 } else { 0o444 };
            // SAFETY: a valid NUL-terminated path.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), mode) }, 0);
            if root {
                let sticky = std::fs::Permissions::from_mode(0o1777);
                std::fs::set_permissions(dir.path(), sticky).unwrap();
                // Where nobody cannot own it (a user namespace) or the
                // sysctl is 0, the read-write open succeeds and only the
                // regular-file check is tested.
                // SAFETY: a valid path; 65534 is nobody.
                let _ = unsafe { libc::chown(c.as_ptr(), 65534, 65534) };
            }
            let claims = Claims::in_dir(dir.path().to_path_buf(), yields);
            let (managed, claims) = answered(claims, "GPU-1").expect("answered at once");
            assert_eq!(managed, !yields);
            assert!(claims.held.is_empty(), "a FIFO held as a lock");
        }
    }

    /// A hard link where a lock belongs (another user's, to a file of
    /// root's) is neither chmodded nor locked: the file it names is left
    /// as it was and free for its own users to lock.
    #[test]
    fn a_hard_link_where_a_lock_belongs_is_not_changed_nor_held() {
        for yields in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let other = dir.path().join("someone-elses.lock");
            std::fs::write(&other, "").unwrap();
            std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o666)).unwrap();
            std::fs::hard_link(&other, dir.path().join("astraeusd-gpu-GPU-3.lock")).unwrap();
            let claims = Claims::in_dir(dir.path().to_path_buf(), yields);
            let (managed, claims) = answered(claims, "GPU-3").expect("answered at once");
            assert_eq!(managed, !yields);
            assert!(claims.held.is_empty(), "another file held as a lock");
            let mode = std::fs::metadata(&other).unwrap().mode() & 0o777;
            assert_eq!(mode, 0o666, "another file's mode changed");
            let f = File::open(&other).unwrap();
            // SAFETY: flock on a descriptor we own.
            let free = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            assert_eq!(free, 0, "another file left locked");
        }
    }

    /// A regular file is taken and held; a second claimant finds it held.
    #[test]
    fn a_lock_is_taken_once() {
        let dir = tempfile::tempdir().unwrap();
        let first = Claims::in_dir(dir.path().to_path_buf(), true);
        let (managed, first) = answered(first, "GPU-2").unwrap();
        assert!(managed);
        let second = Claims::in_dir(dir.path().to_path_buf(), true);
        let (managed, _second) = answered(second, "GPU-2").unwrap();
        assert!(!managed, "held by the first");
        drop(first);
    }
}
