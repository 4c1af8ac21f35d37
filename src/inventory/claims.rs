//! One authority per GPU on a host: each daemon that reads real GPUs holds
//! a lock per GPU UUID (`flock` on `/run/astraeus-locks/astraeusd-gpu-<UUID>.lock`)
//! for as long as it manages it. A daemon started for a user (on the session
//! bus) leaves a GPU whose lock another daemon holds alone, and says so; the
//! system daemon manages its GPUs whatever a user holds (a user could take a
//! lock first to block it), and says that too.
//!
//! The locks sit in a directory the packages make at boot (tmpfiles.d:
//! root's, sticky, world-writable), so that every user's daemon can create
//! its lock on every distribution: /run/lock is that on Debian only
//! (upstream systemd makes it 0755 root, and a user's daemon then managed no
//! GPU). A user cannot make that directory first (/run is root's), and the
//! files are opened without following links. Without the packaged
//! directory (a build run from its source tree), /run/lock.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// The lock directory the packages make (systemd/astraeusd.tmpfiles).
pub const LOCK_DIR: &str = "/run/astraeus-locks";
/// Where the locks go when [`LOCK_DIR`] is not there as the packages make it.
pub const FALLBACK_LOCK_DIR: &str = "/run/lock";

/// The directory the locks are kept in: `ASTRAEUS_GPU_LOCK_DIR` when set
/// (tests: each daemon its own, or two sharing one); else `packaged` when
/// it is as tmpfiles makes it (every daemon on the host decides alike, so
/// they all meet in one place); else `fallback`.
pub fn lock_dir(packaged: &Path, fallback: &Path) -> PathBuf {
    if let Some(dir) = std::env::var_os("ASTRAEUS_GPU_LOCK_DIR") {
        return PathBuf::from(dir);
    }
    if shared_by_all(packaged) {
        packaged.to_path_buf()
    } else {
        fallback.to_path_buf()
    }
}

/// Whether `dir` is a directory (not a link) of root's that any user may
/// create files in and none may delete another's: sticky and 0777. Owned
/// by anyone else, its owner could remove a daemon's lock under it and a
/// second daemon take the GPU.
fn shared_by_all(dir: &Path) -> bool {
    std::fs::symlink_metadata(dir)
        .is_ok_and(|m| m.is_dir() && m.uid() == 0 && m.mode() & 0o1777 == 0o1777)
}

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
        let dir = lock_dir(Path::new(LOCK_DIR), Path::new(FALLBACK_LOCK_DIR));
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
        let taken = take(&path);
        match taken {
            Ok(f) => {
                self.held.insert(uuid.to_string(), f);
                self.left.remove(uuid);
                true
            }
            Err(why) if self.yields => {
                if self.left.insert(uuid.to_string()) {
                    match why {
                        Refusal::Held(by) => tracing::warn!(
                            "GPU {uuid} is managed by another astraeusd ({}: held by {by}): \
                             this daemon leaves it alone (one authority per GPU)",
                            path.display()
                        ),
                        // Not another daemon: say what really failed (a
                        // lock directory users cannot write, say).
                        Refusal::Cannot(why) => tracing::warn!(
                            "GPU {uuid}: its lock {} cannot be taken ({why}), so this daemon \
                             leaves it alone (one authority per GPU). {}",
                            path.display(),
                            self.hint()
                        ),
                    }
                }
                false
            }
            Err(why) => {
                if self.left.insert(uuid.to_string()) {
                    tracing::warn!(
                        "GPU {uuid}: its lock {} could not be taken ({}); the system's \
                         astraeusd manages it anyway",
                        path.display(),
                        why.text()
                    );
                }
                true
            }
        }
    }
}

impl Claims {
    /// What to do when a lock cannot be created in the directory in use.
    fn hint(&self) -> String {
        if self.dir == Path::new(FALLBACK_LOCK_DIR) {
            format!(
                "Every user's daemon must be able to create its lock: install the package's \
                 tmpfiles.d/astraeusd.conf and run `systemd-tmpfiles --create astraeusd.conf`, \
                 which makes {LOCK_DIR} (root's, mode 1777) for them."
            )
        } else {
            format!(
                "Every user's daemon must be able to create its lock in {} (root's, mode 1777).",
                self.dir.display()
            )
        }
    }
}

/// The lock at `path`, opened without following links or waiting and
/// flocked, or why not.
fn take(path: &std::path::Path) -> Result<File, Refusal> {
    // Never blocking: another user may have put a FIFO there, whose
    // open waits for a writer that never comes (before READY=1, or
    // holding the inventory's re-read until the watchdog ends us).
    let flags = libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .mode(0o644)
        .custom_flags(flags)
        .open(path)
        .or_else(|first| {
            // Created by another user: open it as it is, read-only. None
            // there: what made the first open fail is the news (a
            // directory users may not write), not that it is missing.
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(flags)
                .open(path)
                .map_err(|e| match e.kind() {
                    std::io::ErrorKind::NotFound => first,
                    _ => e,
                })
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
            Ok(m) => {
                use std::os::unix::fs::FileTypeExt;
                let t = m.file_type();
                let kind = if t.is_dir() {
                    "a directory"
                } else if t.is_fifo() {
                    "a FIFO"
                } else if t.is_socket() {
                    "a socket"
                } else {
                    "a device or other special file"
                };
                Err(format!("it is {kind}, not a lock file (another user's?)"))
            }
            Err(e) => Err(e.to_string()),
        })
        .map_err(Refusal::Cannot)
        .and_then(|f| {
            // SAFETY: flock on a descriptor we own.
            match unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } {
                0 => Ok(f),
                _ => Err(Refusal::Held(holder(&f))),
            }
        })
}

/// Why a lock was not taken.
enum Refusal {
    /// Another process holds it: who (as `holder` says).
    Held(String),
    /// It could not be opened or is not a lock file: what failed.
    Cannot(String),
}

impl Refusal {
    fn text(&self) -> String {
        match self {
            Refusal::Held(by) => format!("held by {by}"),
            Refusal::Cannot(why) => why.clone(),
        }
    }
}

/// Who holds the flock on `file`, from /proc/locks: the process's name
/// (another user's: made printable and clipped), pid and uid; or "another
/// process" when that cannot be read.
fn holder(file: &File) -> String {
    let Ok(meta) = file.metadata() else {
        return "another process".into();
    };
    let locks = std::fs::read_to_string("/proc/locks").unwrap_or_default();
    // "1: FLOCK  ADVISORY  WRITE 4242 08:01:1234 0 EOF": pid, then dev:inode.
    let pid = locks.lines().find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (kind, pid, at) = (f.get(1)?, f.get(4)?, f.get(5)?);
        let inode: u64 = at.rsplit(':').next()?.parse().ok()?;
        (*kind == "FLOCK" && inode == meta.ino()).then(|| pid.parse::<u32>().ok())?
    });
    let Some(pid) = pid else {
        return "another process".into();
    };
    let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    let name = crate::text::clipped(&crate::text::printable(name.trim()), 32);
    let uid = std::fs::metadata(format!("/proc/{pid}")).map(|m| m.uid());
    match uid {
        Ok(uid) => format!("{name} (pid {pid}, uid {uid})"),
        Err(_) => format!("{name} (pid {pid})"),
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

    /// The packaged directory is used only as tmpfiles makes it (root's,
    /// sticky, world-writable, not a link); else the fallback.
    #[test]
    fn the_packaged_lock_directory_is_used_only_as_tmpfiles_makes_it() {
        // SAFETY: geteuid cannot fail.
        let root = unsafe { libc::geteuid() } == 0;
        let top = tempfile::tempdir().unwrap();
        let (packaged, fallback) = (top.path().join("locks"), top.path().join("fallback"));
        let chosen = || super::lock_dir(&packaged, &fallback);
        assert_eq!(chosen(), fallback, "missing");
        std::fs::create_dir(&packaged).unwrap();
        std::fs::set_permissions(&packaged, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(chosen(), fallback, "0755: users cannot create their locks");
        std::fs::set_permissions(&packaged, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert_eq!(
            chosen(),
            fallback,
            "not sticky: a user could delete another's lock"
        );
        std::fs::set_permissions(&packaged, std::fs::Permissions::from_mode(0o1777)).unwrap();
        assert_eq!(
            chosen() == packaged,
            root,
            "as tmpfiles makes it, when root's"
        );
        let link = top.path().join("link");
        std::os::unix::fs::symlink(&packaged, &link).unwrap();
        assert_eq!(super::lock_dir(&link, &fallback), fallback, "a link");
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

    /// A refusal says who holds the lock (this test's own process here),
    /// or what really failed; never "another daemon" for a lock that could
    /// not be opened.
    #[test]
    fn a_refusal_names_the_holder_or_the_real_error() {
        let dir = tempfile::tempdir().unwrap();
        let mut first = Claims::in_dir(dir.path().to_path_buf(), true);
        assert!(first.may_manage("GPU-5"));
        let path = dir.path().join("astraeusd-gpu-GPU-5.lock");
        let f = File::open(&path).unwrap();
        let by = holder(&f);
        let me = std::process::id();
        assert!(by.contains(&format!("pid {me},")), "{by}");
        match take(&path) {
            Err(Refusal::Held(by)) => assert!(by.contains(&format!("pid {me},")), "{by}"),
            _ => panic!("taken twice"),
        }
        // A directory where the lock belongs: the open fails, and says so.
        let odd = dir.path().join("astraeusd-gpu-GPU-6.lock");
        std::fs::create_dir(&odd).unwrap();
        match take(&odd) {
            Err(Refusal::Cannot(why)) => assert!(why.contains("directory"), "{why}"),
            _ => panic!("a directory taken for a lock"),
        }
    }
}
