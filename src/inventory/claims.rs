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
use std::os::unix::fs::OpenOptionsExt;
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
        let taken = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .or_else(|_| {
                // Created by another user: open it as it is, read-only.
                std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                    .open(&path)
            })
            .map_err(|e| e.to_string())
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
