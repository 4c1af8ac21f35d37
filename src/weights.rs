//! Staging a template's model weights once onto its read-only weights disk.
//!
//! The disk is an ext4 image built with `mkfs.ext4 -d <source>` on the
//! host-local path the template names. Why an image rather than a host
//! directory shared over virtiofs: the guest sees a plain read-only block
//! device (any guest kernel mounts it, no virtiofsd per VM to run and
//! restart, no host filesystem exposed to the guest), the domain XML can say
//! `<readonly/>` and libvirt enforces it, and the image is one file whose
//! content is fixed once staged — exactly "weights staged once".
//!
//! The content checksum (SHA-256 over each file's relative path, size and
//! bytes, in path order) is what makes staging idempotent: the same content
//! again is a no-op. The image is built beside the target and renamed over
//! it only when complete, so a failure never leaves a half-written disk.
//!
//! New content is first copied into a snapshot (a directory beside the image
//! that only the daemon can enter); the checksum recorded is the snapshot's,
//! and the image is built from the snapshot. Whoever can write the source
//! cannot make the image differ from its checksum by changing files between
//! the two reads. The cost: the content is read twice and, for a while,
//! stored twice. The source is opened once ([`pinned`]) and the snapshot
//! read through opened directories below it, never through a link, so they
//! cannot make it copy files from elsewhere either (hard links to others'
//! files are the kernel's to refuse: `fs.protected_hardlinks`).

use crate::error::{Error, Result};
use sha2::{Digest, Sha256};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Every regular file below `root`, relative and sorted; symlinks and
/// special files are refused (the guest would see something else).
pub fn files(root: &Path) -> Result<Vec<(PathBuf, u64)>> {
    let mut out = Vec::new();
    walk(root, root, &mut out)?;
    out.sort();
    Ok(out)
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<(PathBuf, u64)>) -> Result<()> {
    // Named below the source (the root may be a /proc/self/fd path).
    let shown = |p: &Path| match p.strip_prefix(root) {
        Ok(rel) if rel.as_os_str().is_empty() => ".".to_string(),
        Ok(rel) => rel.display().to_string(),
        Err(_) => p.display().to_string(),
    };
    let io = |e: std::io::Error| Error::field("source", format!("{}: {e}", shown(dir)));
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let entry = entry.map_err(io)?;
        let meta = std::fs::symlink_metadata(entry.path()).map_err(io)?;
        let path = entry.path();
        if meta.is_dir() {
            walk(root, &path, out)?;
        } else if meta.is_file() {
            let rel = path.strip_prefix(root).expect("below root").to_path_buf();
            out.push((rel, meta.len()));
        } else {
            return Err(Error::field(
                "source",
                format!("{} is not a regular file or directory", shown(&path)),
            ));
        }
    }
    Ok(())
}

/// The content checksum of a source tree; `progress(done, total)` in bytes.
pub fn checksum(root: &Path, mut progress: impl FnMut(u64, u64)) -> Result<String> {
    use std::io::Read;
    let list = files(root)?;
    let total: u64 = list.iter().map(|(_, n)| n).sum();
    let mut h = Sha256::new();
    let mut done = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    for (rel, len) in &list {
        h.update(rel.to_string_lossy().as_bytes());
        h.update([0]);
        h.update(len.to_le_bytes());
        // Swapped for a link or a FIFO since the walk: refused, not followed
        // or waited on.
        let refused = |why: String| Error::field("source", format!("{}: {why}", rel.display()));
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(root.join(rel))
            .map_err(|e| refused(e.to_string()))?;
        if !f.metadata().map_err(|e| refused(e.to_string()))?.is_file() {
            return Err(refused("not a regular file any more".into()));
        }
        loop {
            let n = f
                .read(&mut buf)
                .map_err(|e| Error::field("source", format!("{}: {e}", rel.display())))?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
            done += n as u64;
            progress(done, total);
        }
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// The source directory opened once, and a path that leads to it as it was
/// opened (`/proc/self/fd/N`) whatever its owner does to its path later;
/// the path is good while the file is kept. Refused when `image` lies
/// inside it (the snapshot beside the image would be copied into itself).
pub fn pinned(source: &Path, image: &Path) -> Result<(std::fs::File, PathBuf)> {
    use std::os::unix::io::AsRawFd;
    let dir = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(source)
        .map_err(|e| Error::field("source", format!("{}: {e}", source.display())))?;
    let at = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()));
    let real = std::fs::read_link(&at)
        .map_err(|e| Error::field("source", format!("{}: {e}", source.display())))?;
    let image_dir = resolved(image.parent().unwrap_or(image));
    if image_dir.starts_with(&real) {
        return Err(Error::field(
            "weights_disk",
            format!(
                "{} is inside the source {}: stage from a directory that does not hold it",
                image.display(),
                real.display()
            ),
        ));
    }
    Ok((dir, at))
}

/// `path` with links resolved, as far as it exists (the rest as written).
fn resolved(path: &Path) -> PathBuf {
    let mut missing = Vec::new();
    let mut at = path;
    loop {
        if let Ok(mut real) = std::fs::canonicalize(at) {
            real.extend(missing.iter().rev());
            return real;
        }
        match (at.parent(), at.file_name()) {
            (Some(parent), Some(name)) => {
                missing.push(name.to_os_string());
                at = parent;
            }
            _ => return path.to_path_buf(),
        }
    }
}

/// Where the snapshot of new content for `image` is kept while it is staged.
pub fn snapshot_path(image: &Path) -> PathBuf {
    image.with_extension("snapshot")
}

/// Copies the tree at `source` into `snapshot`, a fresh directory (mode
/// 0700) replacing whatever a staging cut short left there.
pub fn snapshot(source: &Path, snapshot: &Path) -> Result<()> {
    snapshot_watched(source, snapshot, |_| {})
}

/// [`snapshot`], calling `copied` after each file (tests change the source
/// there, as its owner could while a large file is copied).
///
/// Each file and directory is opened relative to its already opened parent
/// and never through a link: whoever can write the source may swap a
/// directory for a link to `/etc` or the ledger between two files, and a
/// path opened afresh from the source would follow it (`O_NOFOLLOW` guards
/// only a path's last part) into the image the guest reads.
fn snapshot_watched(source: &Path, snapshot: &Path, copied: impl FnMut(&Path)) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    let backend = |what: String, e: std::io::Error| {
        Error::Backend(format!("staging weights: snapshot: {what}: {e}"))
    };
    if snapshot.exists() {
        std::fs::remove_dir_all(snapshot)
            .map_err(|e| backend(snapshot.display().to_string(), e))?;
    }
    std::fs::DirBuilder::new()
        .mode(0o700)
        .recursive(true)
        .create(snapshot)
        .map_err(|e| backend(snapshot.display().to_string(), e))?;
    let root = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(source)
        .map_err(|e| Error::field("source", format!("{}: {e}", source.display())))?;
    let mut copied = copied;
    copy_dir(&root, Path::new(""), snapshot, &mut copied)
}

/// Copies the directory open as `dir` (at `rel` below the source) to `to`.
fn copy_dir(
    dir: &std::fs::File,
    rel: &Path,
    to: &Path,
    copied: &mut impl FnMut(&Path),
) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    use std::os::unix::io::AsRawFd;
    let refused =
        |name: &Path, why: String| Error::field("source", format!("{}: {why}", name.display()));
    let backend = |what: &Path, e: std::io::Error| {
        Error::Backend(format!(
            "staging weights: snapshot: {}: {e}",
            what.display()
        ))
    };
    // The open directory's entries (its /proc link names the directory
    // itself, whatever its path now leads to), in name order.
    let listed = std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd()))
        .map_err(|e| refused(rel, e.to_string()))?;
    let mut names = Vec::new();
    for entry in listed {
        names.push(entry.map_err(|e| refused(rel, e.to_string()))?.file_name());
    }
    names.sort();
    for name in names {
        let here = rel.join(&name);
        let c_name =
            std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(name.as_os_str()))
                .map_err(|_| refused(&here, "a name with a NUL".into()))?;
        // Never a link, never waiting (a FIFO), relative to the open parent.
        let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK;
        // SAFETY: a valid directory descriptor and a NUL-terminated name.
        let fd = unsafe { libc::openat(dir.as_raw_fd(), c_name.as_ptr(), flags) };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            return Err(refused(&here, format!("{e} (links are not followed)")));
        }
        // SAFETY: a descriptor just opened, owned from here on.
        let file = unsafe { <std::fs::File as std::os::unix::io::FromRawFd>::from_raw_fd(fd) };
        let meta = file.metadata().map_err(|e| refused(&here, e.to_string()))?;
        let target = to.join(&name);
        if meta.is_dir() {
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&target)
                .map_err(|e| backend(&target, e))?;
            copy_dir(&file, &here, &target, copied)?;
        } else if meta.is_file() {
            let mut out = std::fs::File::create(&target).map_err(|e| backend(&target, e))?;
            std::io::copy(&mut std::io::BufReader::new(file), &mut out)
                .map_err(|e| backend(&here, e))?;
            copied(&here);
        } else {
            return Err(refused(&here, "not a regular file or directory".into()));
        }
    }
    Ok(())
}

/// Builds the read-only ext4 image of `source` at `image` (atomically).
pub fn build_image(source: &Path, image: &Path) -> Result<()> {
    let list = files(source)?;
    let bytes: u64 = list.iter().map(|(_, n)| n).sum();
    // Room for the files, ext4's metadata and a margin; 4 KiB blocks.
    let size = (bytes + bytes / 10 + list.len() as u64 * 8192 + (32 << 20)).div_ceil(4096) * 4096;
    let tmp = image.with_extension("staging");
    let _ = std::fs::remove_file(&tmp);
    let backend = |what: &str, e: String| Error::Backend(format!("staging weights: {what}: {e}"));
    let f =
        std::fs::File::create(&tmp).map_err(|e| backend("creating the image", e.to_string()))?;
    f.set_len(size)
        .map_err(|e| backend("sizing the image", e.to_string()))?;
    drop(f);
    let out = std::process::Command::new("mkfs.ext4")
        .args(["-q", "-F", "-L", "weights", "-m", "0", "-d"])
        .arg(source)
        .arg(&tmp)
        .output()
        .map_err(|e| backend("running mkfs.ext4 (e2fsprogs)", e.to_string()))?;
    if !out.status.success() {
        let _ = std::fs::remove_file(&tmp);
        return Err(backend(
            "mkfs.ext4",
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ));
    }
    std::fs::rename(&tmp, image).map_err(|e| backend("renaming the image", e.to_string()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checksum_follows_content_names_and_nothing_else() {
        let a = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(a.path().join("sub")).unwrap();
        std::fs::write(a.path().join("sub/w.bin"), b"weights").unwrap();
        std::fs::write(a.path().join("config.json"), b"{}").unwrap();
        let mut seen = Vec::new();
        let one = checksum(a.path(), |d, t| seen.push((d, t))).unwrap();
        assert_eq!(seen.last(), Some(&(9, 9)));
        assert_eq!(one.len(), 64);
        // Same content elsewhere: same checksum.
        let b = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(b.path().join("sub")).unwrap();
        std::fs::write(b.path().join("config.json"), b"{}").unwrap();
        std::fs::write(b.path().join("sub/w.bin"), b"weights").unwrap();
        assert_eq!(checksum(b.path(), |_, _| {}).unwrap(), one);
        // A renamed or changed file: another.
        std::fs::write(b.path().join("sub/w.bin"), b"weightz").unwrap();
        assert_ne!(checksum(b.path(), |_, _| {}).unwrap(), one);
    }

    /// The source's owner swaps a directory for a link to elsewhere while
    /// an earlier file is copied: the snapshot fails rather than copying
    /// what the link leads to. It was copied (the path was opened afresh).
    #[test]
    fn a_directory_swapped_for_a_link_mid_copy_is_not_followed() {
        let src = tempfile::tempdir().unwrap();
        let secret = tempfile::tempdir().unwrap();
        std::fs::write(secret.path().join("s"), b"SECRET").unwrap();
        std::fs::write(src.path().join("a"), b"first").unwrap();
        std::fs::create_dir(src.path().join("z")).unwrap();
        std::fs::write(src.path().join("z/s"), b"weights").unwrap();
        let out = tempfile::tempdir().unwrap();
        let snap = out.path().join("snap");
        let (s, z) = (secret.path().to_path_buf(), src.path().join("z"));
        let r = snapshot_watched(src.path(), &snap, |done| {
            if done == Path::new("a") {
                std::fs::rename(&z, z.with_extension("old")).unwrap();
                std::os::unix::fs::symlink(&s, &z).unwrap();
            }
        });
        let leaked = std::fs::read(snap.join("z/s")).unwrap_or_default();
        assert_ne!(leaked, b"SECRET", "the link was followed");
        let e = r.unwrap_err();
        assert!(e.message().starts_with("source: z: "), "{e}");
        // Untouched, the same tree is copied whole.
        std::fs::remove_file(&z).unwrap();
        std::fs::rename(z.with_extension("old"), &z).unwrap();
        snapshot(src.path(), &snap).unwrap();
        assert_eq!(std::fs::read(snap.join("z/s")).unwrap(), b"weights");
        assert_eq!(std::fs::read(snap.join("a")).unwrap(), b"first");
    }

    /// The source's path swapped for a link after it was opened: the pinned
    /// path still reads the directory opened; an image inside it is refused.
    #[test]
    fn a_pinned_source_is_the_directory_opened() {
        let top = tempfile::tempdir().unwrap();
        let src = top.path().join("model");
        std::fs::create_dir(&src).unwrap();
        std::fs::write(src.join("w"), b"weights").unwrap();
        let elsewhere = top.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::fs::write(elsewhere.join("w"), b"SECRET").unwrap();
        let image = top.path().join("out/w.img");
        std::fs::create_dir(top.path().join("out")).unwrap();
        let (_dir, at) = pinned(&src, &image).unwrap();
        std::fs::rename(&src, top.path().join("moved")).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &src).unwrap();
        let snap = top.path().join("out/w.snapshot");
        snapshot(&at, &snap).unwrap();
        assert_eq!(std::fs::read(snap.join("w")).unwrap(), b"weights");
        for inside in [elsewhere.join("w.img"), elsewhere.join("not/yet/w.img")] {
            let e = pinned(&elsewhere, &inside).unwrap_err();
            assert!(e.message().starts_with("weights_disk: "), "{e}");
        }
    }

    #[test]
    fn special_files_are_refused_by_name() {
        let a = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/etc/passwd", a.path().join("link")).unwrap();
        let e = files(a.path()).unwrap_err();
        assert!(e.message().starts_with("source: "), "{e}");
        assert!(e.message().contains("link"), "{e}");
    }
}
