//! A power cut, after the fact: tests/power_loss/shim.c (preloaded into the
//! daemon) logged every write to the ledger's files and every sync; [`cut`]
//! rolls each file back to its last sync and lets a random part of the later
//! writes "reach the disk" — the state a power cut may leave, which SIGKILL
//! (the page cache survives it) never does.
//! Include with `#[path = "common/power_loss.rs"] mod power_loss;` next to
//! `ledger_check`.
#![allow(dead_code)] // tests/fsync.rs only builds the shim

use crate::ledger_check::Rng;
use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Builds the shim once per run; its path, for LD_PRELOAD.
pub fn shim() -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("astraeus-power-loss-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let lib = dir.join("power-loss.so");
        let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/power_loss/shim.c");
        let st = std::process::Command::new("gcc")
            .args(["-Wall", "-Werror", "-shared", "-fPIC", "-o"])
            .arg(&lib)
            .arg(src)
            .arg("-ldl")
            .status()
            .expect("gcc runs");
        assert!(st.success(), "building the power-loss shim");
        lib
    })
    .clone()
}

enum Change {
    /// `new` written at `offset`; before it the file had `size_before`
    /// bytes and `old` where `new` went (short at the end of the file).
    Write {
        offset: u64,
        size_before: u64,
        old: Vec<u8>,
        new: Vec<u8>,
    },
    /// Cut to `size` from `size_before`, losing `old`.
    Truncate {
        size: u64,
        size_before: u64,
        old: Vec<u8>,
    },
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        (self.0.len() >= n).then(|| {
            let (head, rest) = self.0.split_at(n);
            self.0 = rest;
            head
        })
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn bytes(&mut self) -> Option<Vec<u8>> {
        let n = self.u64()? as usize;
        Some(self.take(n)?.to_vec())
    }
}

/// Each file's changes since its last sync, in order. A record cut short by
/// the kill ends the log: its write was never made (records come first).
fn unsynced(log: &[u8]) -> HashMap<PathBuf, Vec<Change>> {
    let mut files: HashMap<PathBuf, Vec<Change>> = HashMap::new();
    let mut r = Reader(log);
    while let Some(kind) = r.take(1).map(|k| k[0]) {
        let Some(path) = r
            .u32()
            .and_then(|n| r.take(n as usize))
            .map(|p| PathBuf::from(String::from_utf8_lossy(p).into_owned()))
        else {
            break;
        };
        let change = match kind {
            b'S' => {
                files.entry(path).or_default().clear();
                continue;
            }
            b'W' => (|| {
                Some(Change::Write {
                    offset: r.u64()?,
                    size_before: r.u64()?,
                    old: r.bytes()?,
                    new: r.bytes()?,
                })
            })(),
            b'T' => (|| {
                Some(Change::Truncate {
                    size: r.u64()?,
                    size_before: r.u64()?,
                    old: r.bytes()?,
                })
            })(),
            other => panic!("power-loss log: unknown record {other}"),
        };
        match change {
            Some(c) => files.entry(path).or_default().push(c),
            None => break,
        }
    }
    files
}

/// Applies the power cut to every file the log names: back to its last sync,
/// then half the rounds keep nothing more, the others keep each later change
/// with even odds (in order: a kept write lands on what the disk then held).
/// Returns (changes lost, changes kept).
pub fn cut(log: &Path, rng: &mut Rng) -> (usize, usize) {
    let files = unsynced(&std::fs::read(log).unwrap_or_default());
    let keep_some = rng.below(2) == 0;
    let (mut lost, mut kept) = (0, 0);
    for (path, changes) in files {
        let Ok(f) = std::fs::OpenOptions::new().write(true).open(&path) else {
            continue; // removed since (SQLite deletes its journal files)
        };
        for c in changes.iter().rev() {
            match c {
                Change::Write {
                    offset,
                    size_before,
                    old,
                    ..
                } => {
                    f.write_all_at(old, *offset).unwrap();
                    f.set_len(*size_before).unwrap();
                }
                Change::Truncate {
                    size,
                    size_before,
                    old,
                } => {
                    f.set_len(*size_before).unwrap();
                    f.write_all_at(old, *size).unwrap();
                }
            }
        }
        for c in &changes {
            if !(keep_some && rng.below(2) == 0) {
                lost += 1;
                continue;
            }
            kept += 1;
            match c {
                Change::Write { offset, new, .. } => f.write_all_at(new, *offset).unwrap(),
                Change::Truncate { size, .. } => f.set_len(*size).unwrap(),
            }
        }
        f.sync_all().unwrap();
    }
    (lost, kept)
}
