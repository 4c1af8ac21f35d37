//! PURE: who may do what. Every uid / group-member / owner rule of the daemon
//! is here, so that one file answers "can a user do X". The facts come from
//! the bus daemon (uid, pid) and NSS (membership) — see [`crate::auth`] — and
//! fail closed: an unknown user is no member.

use crate::error::{Error, Result};

/// The caller of one D-Bus method, as the bus daemon vouches for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub pid: Option<u32>,
    /// Member of the access group (root counts as a member).
    pub member: bool,
}

impl Caller {
    pub fn is_root(&self) -> bool {
        self.uid == 0
    }
}

/// What a caller asks to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    SubmitWorker,
    StopWorker,
    SetSchedule,
    DefineTemplate,
    /// Resume, power off, stage weights, remove: the baseboard's VMs.
    DriveTemplate,
}

/// What kind of workload a worker asks to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    Reservation,
    Container,
    Unit,
    Vm,
}

/// Live workers one user may hold by default (root is exempt).
pub const DEFAULT_MAX_WORKERS: u32 = 1000;
/// Pending workers one user may have waiting by default (root is exempt).
pub const DEFAULT_MAX_PENDING: u32 = 100;

/// The access settings from the configuration.
#[derive(Clone, Debug)]
pub struct Rules {
    /// Members (and root) may submit and stop workers.
    pub group: String,
    /// Whether members may run containers (root-equivalent).
    pub containers_for_group: bool,
    /// Whether members may run VMs (root-equivalent).
    pub vms_for_group: bool,
    /// Per-user quotas (`access.max_workers_per_user`, `max_pending_per_user`).
    pub max_workers: u32,
    pub max_pending: u32,
    /// The user a daemon off the system bus runs as (a session's, `scripts/try`'s):
    /// their own daemon serves them as it serves members.
    pub owner: Option<u32>,
}

impl Rules {
    pub fn new(group: &str) -> Rules {
        Rules {
            group: group.to_string(),
            containers_for_group: false,
            vms_for_group: false,
            max_workers: DEFAULT_MAX_WORKERS,
            max_pending: DEFAULT_MAX_PENDING,
            owner: None,
        }
    }

    /// A user holding `live` workers, `pending` of them waiting, may submit
    /// one more only within its quotas (so no one can fill the daemon's
    /// memory and queue); root is exempt.
    pub fn within_quota(&self, caller: &Caller, live: usize, pending: usize) -> Result<()> {
        let uid = caller.uid;
        if caller.is_root() {
            return Ok(());
        }
        if live >= self.max_workers as usize {
            return Err(Error::QuotaExceeded(format!(
                "uid {uid} holds {live} workers, the most access.max_workers_per_user allows; \
                 stop some first"
            )));
        }
        if pending >= self.max_pending as usize {
            return Err(Error::QuotaExceeded(format!(
                "uid {uid} has {pending} workers waiting, the most access.max_pending_per_user \
                 allows; stop some or wait until they are placed"
            )));
        }
        Ok(())
    }

    /// Workers are for root and members of the access group; the GPU
    /// baseboard's rotation and VMs are root's alone.
    pub fn may(&self, caller: &Caller, act: Act) -> Result<()> {
        let uid = caller.uid;
        let member = caller.is_root() || caller.member || self.owner == Some(uid);
        let denied = match act {
            Act::SubmitWorker | Act::StopWorker if member => return Ok(()),
            _ if caller.is_root() => return Ok(()),
            Act::SubmitWorker | Act::StopWorker => format!(
                "uid {uid} may not {} workers: only root and members of group {} may",
                if act == Act::SubmitWorker {
                    "submit"
                } else {
                    "stop"
                },
                self.group
            ),
            Act::SetSchedule => format!(
                "uid {uid} may not set schedules: the GPU baseboard's rotation is root's to change"
            ),
            Act::DefineTemplate => {
                format!("uid {uid}: templates own the GPU baseboard; only root may define them")
            }
            Act::DriveTemplate => {
                format!("uid {uid}: the GPU baseboard's VMs are root's to start and stop")
            }
        };
        Err(Error::AccessDenied(denied))
    }

    /// Containers and VMs are root-equivalent powers; units run as their
    /// owner, reservations run nothing.
    pub fn may_run(&self, caller: &Caller, workload: Workload) -> Result<()> {
        let uid = caller.uid;
        match workload {
            Workload::Container if !caller.is_root() && !self.containers_for_group => {
                Err(Error::AccessDenied(format!(
                    "uid {uid}: containers are root-equivalent, so only root may run them \
                     (access.containers_for_group extends this to group {})",
                    self.group
                )))
            }
            Workload::Vm if !caller.is_root() && !self.vms_for_group => {
                Err(Error::AccessDenied(format!(
                    "uid {uid}: a VM with passed-through devices is root-equivalent, so only \
                     root may run one (access.vms_for_group extends this to group {})",
                    self.group
                )))
            }
            _ => Ok(()),
        }
    }
}

/// A non-root caller names as holders only its own processes (their GPU
/// memory would otherwise stop counting as held outside: a lie that lets a
/// share be placed on memory another user's process holds): every uid of
/// the process (real, effective, saved, filesystem) is the caller's, so a
/// set-uid program it started is not its own.
pub fn may_hold(caller: &Caller, index: usize, pid: u32, uids: [u32; 4]) -> Result<()> {
    if caller.is_root() || uids.iter().all(|u| *u == caller.uid) {
        return Ok(());
    }
    let [real, effective, saved, fs] = uids;
    let whose = if real == caller.uid {
        format!("runs with the rights of another user (uids {real}, {effective}, {saved}, {fs})")
    } else {
        format!("belongs to uid {real}")
    };
    Err(Error::AccessDenied(format!(
        "holders[{index}]: process {pid} {whose}; uid {} may name only its own processes",
        caller.uid
    )))
}

/// A worker is stopped by its owner or root.
pub fn may_stop(caller_uid: u32, worker: &str, owner_uid: u32) -> Result<()> {
    if caller_uid != 0 && caller_uid != owner_uid {
        return Err(Error::AccessDenied(format!(
            "worker {worker} belongs to uid {owner_uid}; only its owner or root may stop it"
        )));
    }
    Ok(())
}

/// A worker's `run.*.env` (often tokens) is shown to its owner and root; to
/// anyone else, and to a caller who could not be told, it is hidden.
pub fn sees_env(caller_uid: Option<u32>, owner_uid: u32) -> bool {
    matches!(caller_uid, Some(uid) if uid == 0 || uid == owner_uid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(uid: u32, member: bool) -> Caller {
        Caller {
            uid,
            pid: None,
            member,
        }
    }

    #[test]
    fn workers_are_for_members_and_the_baseboard_for_root() {
        let rules = Rules::new("astraeus");
        let (root, member, other) = (caller(0, false), caller(1000, true), caller(1001, false));
        for act in [Act::SubmitWorker, Act::StopWorker] {
            assert!(rules.may(&root, act).is_ok());
            assert!(rules.may(&member, act).is_ok());
            let e = rules.may(&other, act).unwrap_err();
            assert_eq!(e.kind(), "AccessDenied");
            assert!(e.message().contains("members of group astraeus"), "{e}");
        }
        for act in [Act::SetSchedule, Act::DefineTemplate, Act::DriveTemplate] {
            assert!(rules.may(&root, act).is_ok());
            assert!(rules.may(&member, act).is_err(), "{act:?}");
            assert!(rules.may(&other, act).is_err(), "{act:?}");
        }
    }

    #[test]
    fn root_equivalent_workloads_need_root_unless_extended() {
        let mut rules = Rules::new("g");
        let member = caller(1000, true);
        assert!(rules.may_run(&member, Workload::Container).is_err());
        assert!(rules.may_run(&member, Workload::Vm).is_err());
        assert!(rules.may_run(&member, Workload::Unit).is_ok());
        assert!(rules.may_run(&member, Workload::Reservation).is_ok());
        assert!(rules.may_run(&caller(0, false), Workload::Vm).is_ok());
        rules.containers_for_group = true;
        assert!(rules.may_run(&member, Workload::Container).is_ok());
        assert!(rules.may_run(&member, Workload::Vm).is_err());
        rules.vms_for_group = true;
        assert!(rules.may_run(&member, Workload::Vm).is_ok());
    }

    #[test]
    fn quotas_bind_everyone_but_root() {
        let mut rules = Rules::new("g");
        rules.max_workers = 3;
        rules.max_pending = 2;
        let member = caller(1000, true);
        assert!(rules.within_quota(&member, 2, 1).is_ok());
        let e = rules.within_quota(&member, 3, 0).unwrap_err();
        assert_eq!(e.kind(), "QuotaExceeded");
        assert!(e.message().contains("access.max_workers_per_user"), "{e}");
        let e = rules.within_quota(&member, 2, 2).unwrap_err();
        assert!(e.message().contains("access.max_pending_per_user"), "{e}");
        assert!(rules
            .within_quota(&caller(0, false), 10_000, 10_000)
            .is_ok());
    }

    #[test]
    fn holders_are_the_callers_own_processes() {
        let member = caller(1000, true);
        assert!(may_hold(&member, 0, 42, [1000; 4]).is_ok());
        let e = may_hold(&member, 1, 42, [0; 4]).unwrap_err();
        assert_eq!(e.kind(), "AccessDenied");
        assert!(
            e.message()
                .starts_with("holders[1]: process 42 belongs to uid 0"),
            "{e}"
        );
        // A set-uid program the member started: root's rights, not its own.
        for uids in [
            [1000, 0, 0, 0],
            [1000, 1000, 0, 1000],
            [1000, 1000, 1000, 0],
        ] {
            let e = may_hold(&member, 0, 42, uids).unwrap_err();
            assert!(
                e.message()
                    .starts_with("holders[0]: process 42 runs with the rights of another user"),
                "{e}"
            );
        }
        assert!(may_hold(&caller(0, false), 0, 42, [1000; 4]).is_ok());
    }

    #[test]
    fn owners_and_root_stop_and_see_env() {
        assert!(may_stop(0, "w", 1000).is_ok());
        assert!(may_stop(1000, "w", 1000).is_ok());
        assert_eq!(
            may_stop(1001, "w", 1000).unwrap_err().kind(),
            "AccessDenied"
        );
        assert!(sees_env(Some(0), 1000));
        assert!(sees_env(Some(1000), 1000));
        assert!(!sees_env(Some(1001), 1000));
        assert!(
            !sees_env(None, 1000),
            "unknown caller: hidden (fail closed)"
        );
    }
}
