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
//! stored twice. The source is opened once ([`pinned`]) and every pass
//! (its checksum, the snapshot) walks opened directories below it, never a
//! link, opening only directories and regular files ([`walk`]), so they
//! cannot make it read files from elsewhere either (hard links to others'
//! files are the kernel's to refuse: `fs.protected_hardlinks`).

use crate::error::{Error, Result};
use sha2::{Digest, Sha256};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Whose rights the source is read with: its owner's uid, primary group
/// and groups. The daemon reads as root; a source another user owns is
/// read as that user (filesystem ids and groups of the reading thread
/// alone), so the image holds exactly what they could read: not a file
/// of someone else's they moved in from a shared directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reader {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

impl Reader {
    /// The reader for the source at `path`: its owner, when the daemon
    /// runs as root and the owner is not root; None reads as the daemon.
    /// An owner the name service does not know is refused (fail closed).
    pub fn of_source(path: &Path) -> Result<Option<Reader>> {
        use std::os::unix::fs::MetadataExt;
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Ok(None);
        }
        let owner = std::fs::symlink_metadata(path)
            .map_err(|e| Error::field("source", format!("{}: {e}", path.display())))?
            .uid();
        if owner == 0 {
            return Ok(None);
        }
        let (gid, groups) = crate::auth::groups_of(owner).ok_or_else(|| {
            Error::field(
                "source",
                format!(
                    "{} belongs to uid {owner}, whom the name service does not know, so what \
                     they may read is unknown",
                    path.display()
                ),
            )
        })?;
        Ok(Some(Reader {
            uid: owner,
            gid,
            groups,
        }))
    }
}

thread_local! {
    /// The reader the source's opens on this thread switch to ([`read_as`]).
    static READER: std::cell::RefCell<Option<Reader>> = const { std::cell::RefCell::new(None) };
}

/// Runs `f` (the passes over a source) with its opens of the source made
/// as `reader` ([`as_reader`]); None: as the daemon.
pub fn read_as<T>(reader: Option<&Reader>, f: impl FnOnce() -> T) -> T {
    let before = READER.with(|r| r.replace(reader.cloned()));
    let out = f();
    READER.with(|r| *r.borrow_mut() = before);
    out
}

/// One open of the source, with the reader's rights when there is one:
/// the thread's filesystem uid and gid and its groups switched (raw
/// system calls: glibc's setgroups would switch every thread) and
/// switched back. The kernel checks the open against them, as for that
/// user's own process; what is read after goes through the descriptor.
fn as_reader<T>(open: impl FnOnce() -> T) -> T {
    let Some(reader) = READER.with(|r| r.borrow().clone()) else {
        return open();
    };
    /// Root's ids and groups back, whatever `open` did (or a panic).
    struct Back(Vec<libc::gid_t>);
    impl Drop for Back {
        fn drop(&mut self) {
            // SAFETY: per-thread id changes back to root's, and the groups
            // read before; each only sets this thread's credentials.
            unsafe {
                libc::syscall(libc::SYS_setfsuid, 0);
                libc::syscall(libc::SYS_setfsgid, 0);
                libc::syscall(libc::SYS_setgroups, self.0.len(), self.0.as_ptr());
            }
        }
    }
    // SAFETY: getgroups into a buffer of the size it said.
    let saved = unsafe {
        let n = libc::getgroups(0, std::ptr::null_mut()).max(0) as usize;
        let mut g = vec![0; n];
        let n = libc::getgroups(n as libc::c_int, g.as_mut_ptr()).max(0) as usize;
        g.truncate(n);
        g
    };
    let _back = Back(saved);
    // SAFETY: per-thread credential changes (raw syscalls): the groups
    // first, while this thread still has root's capabilities.
    unsafe {
        libc::syscall(
            libc::SYS_setgroups,
            reader.groups.len(),
            reader.groups.as_ptr(),
        );
        libc::syscall(libc::SYS_setfsgid, reader.gid);
        libc::syscall(libc::SYS_setfsuid, reader.uid);
    }
    open()
}

/// Every regular file below `root`, relative and sorted; symlinks and
/// special files are refused (the guest would see something else).
pub fn files(root: &Path) -> Result<Vec<(PathBuf, u64)>> {
    let mut out = Vec::new();
    walk(
        &open_dir(root)?,
        Path::new(""),
        &mut |_| Ok(()),
        &mut |rel, _, len| {
            out.push((rel.to_path_buf(), len));
            Ok(())
        },
    )?;
    Ok(out)
}

/// The directory at `path`, opened (the root of a walk; named `.` in
/// errors, as `path` may be a /proc/self/fd path).
fn open_dir(path: &Path) -> Result<std::fs::File> {
    as_reader(|| {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(path)
    })
    .map_err(|e| Error::field("source", format!("{}: {e}", shown(Path::new("")))))
}

/// Directories below the source a walk goes into at most: one descriptor
/// is held open for each level.
const MAX_DEPTH: usize = 64;

/// An entry of an opened directory: a directory, opened, or a regular file
/// known by a bare path descriptor ([`Bare::open`] reads it).
enum Entry {
    Dir(std::fs::File),
    File(Bare, u64),
}

/// A regular file below the source, held by an `O_PATH` descriptor: it
/// opens nothing until read.
struct Bare(std::fs::File);

impl Bare {
    /// The file, opened to read through its own descriptor (never its
    /// name). Not waiting: a lease its owner holds on it makes the open
    /// fail at once rather than wait for the lease to break (45 s a time).
    fn open(&self, here: &Path) -> Result<std::fs::File> {
        use std::os::unix::io::AsRawFd;
        as_reader(|| {
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
                .open(format!("/proc/self/fd/{}", self.0.as_raw_fd()))
        })
        .map_err(|e| Error::field("source", format!("{}: {e}", shown(here))))
    }
}

/// The entry `name` of the opened directory `dir` (at `here` below the
/// source): a directory or a regular file, found relative to `dir` and
/// never through a link. It is opened as a bare path (`O_PATH`, which
/// opens nothing: no device's driver, no FIFO's wait) and its type read;
/// a directory is then opened through that descriptor, whatever its name
/// leads to by then, and a file when it is read ([`Bare::open`]).
fn open_entry(dir: &std::fs::File, name: &std::ffi::OsStr, here: &Path) -> Result<Entry> {
    use std::os::unix::io::AsRawFd;
    let refused = |why: String| Error::field("source", format!("{}: {why}", shown(here)));
    let c_name = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(name))
        .map_err(|_| refused("a name with a NUL".into()))?;
    let flags = libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: a valid directory descriptor and a NUL-terminated name.
    let bare = as_reader(|| openat(dir.as_raw_fd(), &c_name, flags))
        .map_err(|e| refused(e.to_string()))?;
    let meta = bare.metadata().map_err(|e| refused(e.to_string()))?;
    if meta.is_file() {
        return Ok(Entry::File(Bare(bare), meta.len()));
    }
    if meta.file_type().is_symlink() {
        return Err(refused("a link (links are not followed)".into()));
    }
    if !meta.is_dir() {
        return Err(refused("not a regular file or directory".into()));
    }
    let opened = as_reader(|| {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(format!("/proc/self/fd/{}", bare.as_raw_fd()))
    })
    .map_err(|e| refused(e.to_string()))?;
    Ok(Entry::Dir(opened))
}

/// Walks the tree below the opened directory `dir` (at `rel` below the
/// source) in path order, names sorted in each directory: `on_dir` for
/// each directory below it, `on_file` for each regular file with its size.
/// Anything else is refused, by name, and so is a tree deeper than
/// [`MAX_DEPTH`].
fn walk(
    dir: &std::fs::File,
    rel: &Path,
    on_dir: &mut impl FnMut(&Path) -> Result<()>,
    on_file: &mut impl FnMut(&Path, Bare, u64) -> Result<()>,
) -> Result<()> {
    use std::os::unix::io::AsRawFd;
    let refused = |why: String| Error::field("source", format!("{}: {why}", shown(rel)));
    // The open directory's entries (its /proc link names the directory
    // itself, whatever its path now leads to).
    let listed = as_reader(|| std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd())))
        .map_err(|e| refused(e.to_string()))?;
    let mut names = Vec::new();
    for entry in listed {
        names.push(entry.map_err(|e| refused(e.to_string()))?.file_name());
    }
    names.sort();
    for name in names {
        let here = rel.join(&name);
        match open_entry(dir, &name, &here)? {
            Entry::Dir(_) if here.components().count() > MAX_DEPTH => {
                return Err(Error::field(
                    "source",
                    format!("{}: deeper than {MAX_DEPTH} directories", shown(&here)),
                ));
            }
            Entry::Dir(sub) => {
                on_dir(&here)?;
                walk(&sub, &here, on_dir, on_file)?;
            }
            Entry::File(file, len) => on_file(&here, file, len)?,
        }
    }
    Ok(())
}

/// A path below the source as people read it (the source itself is `.`).
/// A path within the source as an error quotes it: printable (the
/// source's names are its owner's, who may be another user).
fn shown(rel: &Path) -> String {
    match rel.as_os_str().is_empty() {
        true => ".".to_string(),
        false => crate::text::printable(&rel.display().to_string()),
    }
}

/// The content checksum of a source tree; `progress(done, total)` in bytes.
/// Two walks: one for the total, then one that reads.
pub fn checksum(root: &Path, mut progress: impl FnMut(u64, u64)) -> Result<String> {
    use std::io::Read;
    let total: u64 = files(root)?.iter().map(|(_, n)| n).sum();
    let mut h = Sha256::new();
    let mut done = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    walk(
        &open_dir(root)?,
        Path::new(""),
        &mut |_| Ok(()),
        &mut |rel, bare, len| {
            h.update(rel.to_string_lossy().as_bytes());
            h.update([0]);
            h.update(len.to_le_bytes());
            let mut f = bare.open(rel)?;
            loop {
                let n = f
                    .read(&mut buf)
                    .map_err(|e| Error::field("source", format!("{}: {e}", shown(rel))))?;
                if n == 0 {
                    return Ok(());
                }
                h.update(&buf[..n]);
                // Files grown since the first walk do not pass the total.
                done = (done + n as u64).min(total);
                progress(done, total);
            }
        },
    )?;
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// The source directory opened once, no component of its path a link
/// (`open_without_links`), and a path that leads to it as it was opened
/// (`/proc/self/fd/N`) whatever its owner does to its path later;
/// the path is good while the file is kept. Refused when `image` lies
/// inside it (the snapshot beside the image would be copied into itself).
pub fn pinned(source: &Path, image: &Path) -> Result<(std::fs::File, PathBuf)> {
    use std::os::unix::io::AsRawFd;
    let dir = open_without_links(source)?;
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

/// The directory at the absolute `path`, opened one component at a time
/// from `/` and never through a link. A source that is a link, or lies
/// below one, is refused: whoever owns the link decides where it leads
/// (the daemon's own state, say), and the daemon reads as root.
fn open_without_links(path: &Path) -> Result<std::fs::File> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::io::AsRawFd;
    use std::path::Component;
    let refused = |why: String| Error::field("source", format!("{}: {why}", path.display()));
    if !path.is_absolute() {
        return Err(refused("not an absolute path".into()));
    }
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    let mut dir = open_dir(Path::new("/"))?;
    let mut walked = PathBuf::from("/");
    for part in path.components() {
        let name = match part {
            Component::RootDir | Component::CurDir => continue,
            Component::Normal(name) => name,
            Component::ParentDir | Component::Prefix(_) => {
                return Err(refused(
                    "`..` is not followed: name the directory itself".into(),
                ))
            }
        };
        walked.push(name);
        let c_name = std::ffi::CString::new(name.as_bytes())
            .map_err(|_| refused("a name with a NUL".into()))?;
        let opened = as_reader(|| openat(dir.as_raw_fd(), &c_name, flags));
        let e = match opened {
            Ok(opened) => {
                dir = opened;
                continue;
            }
            Err(e) => e,
        };
        {
            let is_link =
                std::fs::symlink_metadata(&walked).is_ok_and(|m| m.file_type().is_symlink());
            return Err(if is_link {
                refused(format!(
                    "{} is a link, and links are not followed: name the directory it leads to",
                    walked.display()
                ))
            } else {
                refused(format!("{}: {e}", walked.display()))
            });
        }
    }
    Ok(dir)
}

/// `openat(dir, name, flags)`, the descriptor owned.
fn openat(
    dir: libc::c_int,
    name: &std::ffi::CStr,
    flags: libc::c_int,
) -> std::io::Result<std::fs::File> {
    use std::os::unix::io::FromRawFd;
    // SAFETY: a directory descriptor the caller holds and a NUL-terminated name.
    let fd = unsafe { libc::openat(dir, name.as_ptr(), flags) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor just opened, owned from here on.
    Ok(unsafe { std::fs::File::from_raw_fd(fd) })
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
/// and never through a link ([`walk`]): whoever can write the source may
/// swap a directory for a link to `/etc` or the ledger between two files,
/// and a path opened afresh from the source would follow it (`O_NOFOLLOW`
/// guards only a path's last part) into the image the guest reads.
fn snapshot_watched(source: &Path, snapshot: &Path, copied: impl FnMut(&Path)) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    let backend = |what: &Path, e: std::io::Error| {
        Error::Backend(format!(
            "staging weights: snapshot: {}: {e}",
            what.display()
        ))
    };
    if snapshot.exists() {
        std::fs::remove_dir_all(snapshot).map_err(|e| backend(snapshot, e))?;
    }
    let new_dir = |path: &Path| {
        std::fs::DirBuilder::new()
            .mode(0o700)
            .recursive(true)
            .create(path)
            .map_err(|e| backend(path, e))
    };
    new_dir(snapshot)?;
    let root = open_dir(source)?;
    let mut copied = copied;
    walk(
        &root,
        Path::new(""),
        &mut |rel| new_dir(&snapshot.join(rel)),
        &mut |rel, bare, _| {
            use std::os::unix::fs::PermissionsExt;
            let file = bare.open(rel)?;
            let target = snapshot.join(rel);
            // No wider than the source's mode (the image keeps it): a file
            // only its owner may read stays so for the guest.
            let mode = file
                .metadata()
                .map_err(|e| backend(rel, e))?
                .permissions()
                .mode()
                & 0o777;
            let mut out = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(mode)
                .open(&target)
                .map_err(|e| backend(&target, e))?;
            std::io::copy(&mut std::io::BufReader::new(file), &mut out)
                .map_err(|e| backend(rel, e))?;
            copied(rel);
            Ok(())
        },
    )
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
    // Only root reads the image (libvirt hands it to the VM): 0600 set
    // after it is made, whatever the umask.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| backend("creating the image", e.to_string()))?;
    {
        use std::os::unix::fs::PermissionsExt;
        f.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(|e| backend("creating the image", e.to_string()))?;
    }
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

/// The filesystem type a path lives on, from /proc/self/mountinfo (the
/// longest mount point that contains it); fuse subtypes as `fuse.sshfs`.
pub fn fs_type_of(path: &std::path::Path) -> Option<String> {
    let path = std::fs::canonicalize(path)
        .or_else(|_| {
            path.parent().map_or(
                Err(std::io::ErrorKind::NotFound.into()),
                std::fs::canonicalize,
            )
        })
        .ok()?;
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mut best: Option<(usize, String)> = None;
    for line in info.lines() {
        let (left, right) = line.split_once(" - ")?;
        let mount = left.split(' ').nth(4)?.replace("\\040", " ");
        let fs = right.split(' ').next()?.to_string();
        let inside = path.starts_with(&mount);
        if inside && best.as_ref().is_none_or(|(len, _)| mount.len() >= *len) {
            best = Some((mount.len(), fs));
        }
    }
    best.map(|(_, fs)| fs)
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

    /// A source that is a link, or lies below one, is refused naming the
    /// link (whoever owns it decides where it leads: the daemon's state,
    /// say); so is one named with `..`. The directory itself is taken.
    #[test]
    fn a_source_through_a_link_is_refused() {
        let top = tempfile::tempdir().unwrap();
        let real = top.path().join("real");
        std::fs::create_dir_all(real.join("model")).unwrap();
        let link = top.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let image = top.path().join("out/w.img");
        for source in [link.clone(), link.join("model")] {
            let e = pinned(&source, &image).unwrap_err();
            assert!(
                e.message().starts_with("source: ")
                    && e.message().contains(&format!(
                        "{} is a link, and links are not followed",
                        link.display()
                    )),
                "{e}"
            );
        }
        let e = pinned(&real.join("model/../model"), &image).unwrap_err();
        assert!(e.message().contains("`..` is not followed"), "{e}");
        let e = pinned(Path::new("relative/model"), &image).unwrap_err();
        assert!(e.message().contains("not an absolute path"), "{e}");
        assert!(pinned(&real.join("model"), &image).is_ok());
    }

    /// The snapshot keeps each file's mode, never wider (the image keeps
    /// the snapshot's); the image is 0600 whatever the umask.
    #[test]
    fn modes_are_kept_never_widened_and_the_image_is_for_root_alone() {
        use std::os::unix::fs::PermissionsExt;
        let top = tempfile::tempdir().unwrap();
        let src = top.path().join("model");
        std::fs::create_dir(&src).unwrap();
        for (name, mode) in [("open", 0o644), ("group", 0o640), ("mine", 0o600)] {
            std::fs::write(src.join(name), name).unwrap();
            std::fs::set_permissions(src.join(name), std::fs::Permissions::from_mode(mode))
                .unwrap();
        }
        let snap = top.path().join("w.snapshot");
        snapshot(&src, &snap).unwrap();
        for (name, mode) in [("open", 0o644), ("group", 0o640), ("mine", 0o600)] {
            let got = std::fs::metadata(snap.join(name))
                .unwrap()
                .permissions()
                .mode()
                & 0o777;
            assert_eq!(got & !mode, 0, "{name}: {got:o} is wider than {mode:o}");
        }
        if std::process::Command::new("mkfs.ext4")
            .arg("-V")
            .output()
            .is_ok()
        {
            let image = top.path().join("w.img");
            build_image(&snap, &image).unwrap();
            let mode = std::fs::metadata(&image).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600);
        }
    }

    /// The same swap while the checksum reads: refused, not read. The
    /// checksum's walk went by paths, and hashed what the link led to.
    #[test]
    fn a_directory_swapped_for_a_link_mid_checksum_is_not_followed() {
        let src = tempfile::tempdir().unwrap();
        let secret = tempfile::tempdir().unwrap();
        std::fs::write(secret.path().join("s"), b"SECRET").unwrap();
        std::fs::write(src.path().join("a"), b"first").unwrap();
        std::fs::create_dir(src.path().join("z")).unwrap();
        std::fs::write(src.path().join("z/s"), b"weights").unwrap();
        let (s, z) = (secret.path().to_path_buf(), src.path().join("z"));
        let mut swapped = false;
        let r = checksum(src.path(), |done, _| {
            if done == 5 && !swapped {
                swapped = true;
                std::fs::rename(&z, z.with_extension("old")).unwrap();
                std::os::unix::fs::symlink(&s, &z).unwrap();
            }
        });
        let e = r.unwrap_err();
        assert!(e.message().starts_with("source: z: "), "{e}");
    }

    /// A FIFO in the source is refused without being opened: a writer
    /// waiting on it (its owner's, say) is not let through. Opened to read
    /// its type, even without waiting, it was.
    #[test]
    fn a_fifo_in_the_source_is_refused_unopened() {
        let src = tempfile::tempdir().unwrap();
        let fifo = src.path().join("pipe");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let writer = {
            let fifo = fifo.clone();
            std::thread::spawn(move || std::fs::OpenOptions::new().write(true).open(fifo))
        };
        // Let the writer reach its wait in open().
        std::thread::sleep(std::time::Duration::from_millis(200));
        for r in [
            files(src.path()).map(drop),
            checksum(src.path(), |_, _| {}).map(drop),
        ] {
            let e = r.unwrap_err();
            let m = e.message();
            assert!(
                m.starts_with("source: pipe") && m.contains("not a regular"),
                "{e}"
            );
        }
        let snap = tempfile::tempdir().unwrap();
        assert!(snapshot(src.path(), &snap.path().join("s")).is_err());
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(!writer.is_finished(), "the FIFO was opened");
        // Let the writer go.
        let _reader = std::fs::File::open(&fifo).unwrap();
        writer.join().unwrap().unwrap();
    }

    /// A file its owner holds a write lease on is refused at once, not
    /// waited for: each open would wait for the lease to break (45 s, and
    /// its owner can take it again after each).
    #[test]
    fn a_leased_file_is_refused_not_waited_for() {
        use std::os::unix::io::AsRawFd;
        let src = tempfile::tempdir().unwrap();
        std::fs::write(src.path().join("w"), b"weights").unwrap();
        let leased = std::fs::File::open(src.path().join("w")).unwrap();
        // The lease's holder (this process) is told of a break by SIGIO,
        // which would end it.
        // SAFETY: ignoring a signal no other part of the tests uses.
        unsafe { libc::signal(libc::SIGIO, libc::SIG_IGN) };
        // SAFETY: a valid descriptor; F_SETLEASE takes an int.
        let r = unsafe { libc::fcntl(leased.as_raw_fd(), libc::F_SETLEASE, libc::F_WRLCK) };
        assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
        let e = checksum(src.path(), |_, _| {}).unwrap_err();
        assert!(e.message().starts_with("source: w: "), "{e}");
        let snap = tempfile::tempdir().unwrap();
        assert!(snapshot(src.path(), &snap.path().join("s")).is_err());
        // Not opened to learn its size either.
        assert_eq!(files(src.path()).unwrap(), [(PathBuf::from("w"), 7)]);
    }

    #[test]
    fn a_tree_too_deep_is_refused() {
        let src = tempfile::tempdir().unwrap();
        let mut deep = src.path().to_path_buf();
        for _ in 0..=MAX_DEPTH {
            deep.push("d");
        }
        std::fs::create_dir_all(&deep).unwrap();
        let e = files(src.path()).unwrap_err();
        assert!(e.message().contains("deeper than 64 directories"), "{e}");
        std::fs::remove_dir(&deep).unwrap();
        assert!(files(src.path()).unwrap().is_empty());
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
