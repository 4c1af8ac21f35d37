//! Facts about callers from the system (NSS): membership of the access group
//! and user names. Unknown users are not members (fail closed); the rules
//! that use these facts are in [`crate::access`].

use std::ffi::{CStr, CString};

/// The id of the group named `group`, if the system knows one.
pub fn group_id(group: &str) -> Option<libc::gid_t> {
    let group_c = CString::new(group).ok()?;
    let mut buf = vec![0u8; 16384];
    // SAFETY: getgrnam_r writes only into our buffers, whose sizes we pass.
    unsafe {
        let mut grp: libc::group = std::mem::zeroed();
        let mut grp_out: *mut libc::group = std::ptr::null_mut();
        if libc::getgrnam_r(
            group_c.as_ptr(),
            &mut grp,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut grp_out,
        ) != 0
            || grp_out.is_null()
        {
            return None;
        }
        Some(grp.gr_gid)
    }
}

/// Whether `uid` belongs to `group` (primary or supplementary).
pub fn is_member(uid: u32, group: &str) -> bool {
    if uid == 0 {
        return true;
    }
    let Some(gid) = group_id(group) else {
        return false;
    };
    // SAFETY: the *_r calls write only into our buffers, whose sizes we pass.
    unsafe {
        let mut pw_buf = vec![0u8; 16384];
        let mut pw: libc::passwd = std::mem::zeroed();
        let mut pw_out: *mut libc::passwd = std::ptr::null_mut();
        if libc::getpwuid_r(
            uid,
            &mut pw,
            pw_buf.as_mut_ptr().cast(),
            pw_buf.len(),
            &mut pw_out,
        ) != 0
            || pw_out.is_null()
        {
            return false;
        }
        if pw.pw_gid == gid {
            return true;
        }
        let name = CStr::from_ptr(pw.pw_name);
        let mut groups = vec![0 as libc::gid_t; 1024];
        let mut n = groups.len() as libc::c_int;
        if libc::getgrouplist(name.as_ptr(), pw.pw_gid, groups.as_mut_ptr(), &mut n) < 0 {
            return false;
        }
        groups[..n.max(0) as usize].contains(&gid)
    }
}

/// A user's name, or the uid in digits when it has none (as `ls -l` shows it).
pub fn user_name_or_uid(uid: u32) -> String {
    user_name(uid).unwrap_or_else(|| uid.to_string())
}

/// The user name of a uid, when NSS knows it.
pub fn user_name(uid: u32) -> Option<String> {
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
        Some(CStr::from_ptr(pw.pw_name).to_string_lossy().into_owned())
    }
}

/// What the kernel says of a running process: its real uid and its start
/// time (clock ticks since boot), which with the pid names it uniquely.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Process {
    pub uid: u32,
    pub start: u64,
}

/// The process `pid`, if one runs.
pub fn process(pid: u32) -> Option<Process> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    // The name (field 2) may hold spaces and parentheses: fields are
    // counted after the last ')'; starttime is field 22.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 1..];
    let start = after_name.split_whitespace().nth(19)?.parse().ok()?;
    Some(Process { uid, start })
}

#[cfg(test)]
mod tests {
    use super::*;

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
            Some(me),
            "the same process, the same start"
        );
        assert!(me.start > 0);
    }
}
