//! Facts about callers from the system (NSS): membership of the access group
//! and user names. Unknown users are not members (fail closed); the rules
//! that use these facts are in [`crate::access`].

use std::ffi::{CStr, CString};

/// The id of the group named `group`, if the system knows one.
pub fn group_id(group: &str) -> Option<libc::gid_t> {
    lookup_gid(group).ok().flatten()
}

/// The id of the group named `group`: None when there is none, an error
/// when the name service could not say (a directory server not up yet).
fn lookup_gid(group: &str) -> Result<Option<libc::gid_t>, String> {
    let Ok(group_c) = CString::new(group) else {
        return Ok(None);
    };
    let mut buf = vec![0u8; 16384];
    // SAFETY: getgrnam_r writes only into our buffers, whose sizes we pass.
    unsafe {
        let mut grp: libc::group = std::mem::zeroed();
        let mut grp_out: *mut libc::group = std::ptr::null_mut();
        let r = libc::getgrnam_r(
            group_c.as_ptr(),
            &mut grp,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut grp_out,
        );
        match (r, grp_out.is_null()) {
            (0, false) => Ok(Some(grp.gr_gid)),
            (0, true) => Ok(None),
            (r, _) if not_found(r) => Ok(None),
            (r, _) => Err(format!(
                "looking up group {group}: {}",
                std::io::Error::from_raw_os_error(r)
            )),
        }
    }
}

/// The codes getpwuid_r and getgrnam_r give for "no such entry" besides 0
/// (getpwnam(3): ENOENT, ESRCH, EBADF or EPERM, by implementation).
fn not_found(code: libc::c_int) -> bool {
    matches!(code, libc::ENOENT | libc::ESRCH | libc::EBADF | libc::EPERM)
}

/// Whether `uid` belongs to `group` (primary or supplementary); unknown
/// users and groups are not members, and neither is anyone the name
/// service could not answer for (fail closed).
pub fn is_member(uid: u32, group: &str) -> bool {
    membership(uid, group).unwrap_or(false)
}

/// [`is_member`], telling a name service that could not answer apart from
/// a "no": an error then, which a caller may ask again.
pub fn membership(uid: u32, group: &str) -> Result<bool, String> {
    if uid == 0 {
        return Ok(true);
    }
    let Some(gid) = lookup_gid(group)? else {
        return Ok(false);
    };
    // SAFETY: the *_r calls write only into our buffers, whose sizes we pass.
    unsafe {
        let mut pw_buf = vec![0u8; 16384];
        let mut pw: libc::passwd = std::mem::zeroed();
        let mut pw_out: *mut libc::passwd = std::ptr::null_mut();
        let r = libc::getpwuid_r(
            uid,
            &mut pw,
            pw_buf.as_mut_ptr().cast(),
            pw_buf.len(),
            &mut pw_out,
        );
        match (r, pw_out.is_null()) {
            (0, false) => {}
            (0, true) => return Ok(false),
            (r, _) if not_found(r) => return Ok(false),
            (r, _) => {
                let e = std::io::Error::from_raw_os_error(r);
                return Err(format!("looking up uid {uid}: {e}"));
            }
        }
        if pw.pw_gid == gid {
            return Ok(true);
        }
        let name = CStr::from_ptr(pw.pw_name);
        let mut groups = vec![0 as libc::gid_t; 1024];
        let mut n = groups.len() as libc::c_int;
        if libc::getgrouplist(name.as_ptr(), pw.pw_gid, groups.as_mut_ptr(), &mut n) < 0 {
            return Err(format!("uid {uid} is in more than 1024 groups"));
        }
        Ok(groups[..n.max(0) as usize].contains(&gid))
    }
}

/// A user's name, or the uid in digits when it has none (as `ls -l` shows it).
pub fn user_name_or_uid(uid: u32) -> String {
    user_name(uid).unwrap_or_else(|| uid.to_string())
}

/// The user name of a uid, when NSS knows it.
pub fn user_name(uid: u32) -> Option<String> {
    passwd(uid, |pw| {
        // SAFETY: getpwuid_r filled pw_name with a C string in our buffer.
        unsafe { CStr::from_ptr(pw.pw_name) }
            .to_string_lossy()
            .into_owned()
    })
}

/// The primary group of a uid, when NSS knows it.
pub fn primary_gid(uid: u32) -> Option<u32> {
    passwd(uid, |pw| pw.pw_gid)
}

/// A uid's primary group and every group it is in (the primary among
/// them), as a login of that user would have them; None when NSS does not
/// know the uid.
pub fn groups_of(uid: u32) -> Option<(u32, Vec<u32>)> {
    let (name, gid) = passwd(uid, |pw| {
        // SAFETY: getpwuid_r filled pw_name with a C string in our buffer.
        (unsafe { CStr::from_ptr(pw.pw_name) }.to_owned(), pw.pw_gid)
    })?;
    let mut groups: Vec<libc::gid_t> = vec![0; 64];
    loop {
        let mut n = groups.len() as libc::c_int;
        // SAFETY: a C string, and a buffer whose length we pass and which
        // getgrouplist writes at most n entries of.
        let r = unsafe { libc::getgrouplist(name.as_ptr(), gid, groups.as_mut_ptr(), &mut n) };
        if r >= 0 {
            groups.truncate(n.max(0) as usize);
            return Some((gid, groups));
        }
        if groups.len() >= 65536 {
            return None;
        }
        groups.resize((n.max(0) as usize).max(groups.len() * 2), 0);
    }
}

/// What `read` takes of uid's passwd entry, when NSS has one.
fn passwd<T>(uid: u32, read: impl FnOnce(&libc::passwd) -> T) -> Option<T> {
    let mut buf = vec![0u8; 16384];
    // SAFETY: getpwuid_r writes only into our buffer, whose size we pass.
    unsafe {
        let mut pw: libc::passwd = std::mem::zeroed();
        let mut out: *mut libc::passwd = std::ptr::null_mut();
        if libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr().cast(), buf.len(), &mut out) != 0
            || out.is_null()
        {
            return None;
        }
        Some(read(&pw))
    }
}

/// What the kernel says of a running process: its uids (real, effective,
/// saved, filesystem) and its start time (clock ticks since boot), which
/// with the pid names it uniquely.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Process {
    /// The real uid: whose process it is.
    pub uid: u32,
    /// Real, effective, saved and filesystem uids.
    pub uids: [u32; 4],
    pub start: u64,
    /// Its name (comm) as the kernel gives it: its owner's to choose, so
    /// made printable before it is shown.
    pub name: String,
}

/// The process `pid`, if one runs. Its status and stat are read through
/// its /proc directory opened once: were the pid to end and be taken by
/// another process between the two reads, the second read fails rather
/// than pair one process's uids with another's start time.
pub fn process(pid: u32) -> Option<Process> {
    let dir = std::fs::File::open(format!("/proc/{pid}")).ok()?;
    let status = read_in(&dir, c"status")?;
    let mut uids = [0u32; 4];
    let mut fields = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace();
    for uid in &mut uids {
        *uid = fields.next()?.parse().ok()?;
    }
    // The name (field 2) may hold spaces and parentheses: fields are
    // counted after the last ')'; starttime is field 22.
    let stat = read_in(&dir, c"stat")?;
    let (open, close) = (stat.find('(')?, stat.rfind(')')?);
    let start = stat[close + 1..].split_whitespace().nth(19)?.parse().ok()?;
    Some(Process {
        uid: uids[0],
        uids,
        start,
        name: stat.get(open + 1..close)?.to_string(),
    })
}

/// A file of the directory `dir`, read whole.
fn read_in(dir: &std::fs::File, name: &CStr) -> Option<String> {
    use std::io::Read;
    use std::os::unix::io::{AsRawFd, FromRawFd};
    // SAFETY: a valid directory descriptor and a NUL-terminated name.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: a descriptor just opened, owned from here on.
    let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
    let mut text = String::new();
    file.read_to_string(&mut text).ok()?;
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_read_through_its_directory_is_that_one_process() {
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let pid = child.id();
        let p = process(pid).unwrap();
        assert_eq!(p.uids, [p.uid; 4]);
        assert_eq!(p.name, "sleep", "read from the same directory");
        // Its directory, opened while it ran, reads nothing once it ended
        // and was reaped: whatever takes its pid next is not read through it.
        let dir = std::fs::File::open(format!("/proc/{pid}")).unwrap();
        assert!(read_in(&dir, c"stat").is_some());
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(read_in(&dir, c"status"), None);
        assert_eq!(read_in(&dir, c"stat"), None);
        assert_eq!(process(pid), None);
    }

    #[test]
    fn root_is_always_a_member_and_unknowns_never() {
        assert!(is_member(0, "no-such-group-xyz"));
        assert!(!is_member(65534, "no-such-group-xyz"));
        assert!(!is_member(4_000_000_000, "root"));
        // nobody's primary group is nogroup on Debian.
        assert!(!is_member(65534, "root"));
        assert_eq!(user_name(0).as_deref(), Some("root"));
        let me = process(std::process::id()).unwrap();
        assert_eq!(me.uid, unsafe { libc::getuid() });
        assert_eq!(
            process(std::process::id()),
            Some(me.clone()),
            "the same process, the same start"
        );
        assert!(me.start > 0);
    }
}
