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
    /// Prepare or unprepare a Kubernetes claim: the kubelet plugin's.
    PrepareClaim,
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
/// Submits one user may make in any minute by default (root is exempt):
/// one a second, more than a person or a sane script needs, and few
/// enough that churn (submit, stop, again) grows the ledger by a bounded
/// amount (docs/reliability.md).
pub const DEFAULT_MAX_SUBMITS_PER_MINUTE: u32 = 60;
/// MiB of requests one user's live workers may hold by default (root is
/// exempt): 64 requests of the largest size, thousands of usual ones.
pub const DEFAULT_MAX_REQUEST_MIB: u32 = 16;

const MIB: usize = 1024 * 1024;

/// Each user's submits of the last minute (a sliding window), for
/// `access.max_submits_per_minute`. Pure: the time comes in.
#[derive(Debug, Default)]
pub struct SubmitRate {
    recent: std::collections::HashMap<u32, std::collections::VecDeque<i64>>,
}

impl SubmitRate {
    const WINDOW_MS: i64 = 60_000;

    /// The window as the ledger has it at a start: each submit `(uid, at)`
    /// of the minute before `now_ms` (a restart gives no one a fresh
    /// minute), oldest first.
    pub fn from_recent(submits: impl IntoIterator<Item = (u32, i64)>, now_ms: i64) -> SubmitRate {
        let mut rate = SubmitRate::default();
        let mut recent: Vec<_> = submits
            .into_iter()
            .filter(|&(_, at)| at > now_ms - Self::WINDOW_MS && at <= now_ms)
            .collect();
        recent.sort_by_key(|&(_, at)| at);
        for (uid, at) in recent {
            rate.recent.entry(uid).or_default().push_back(at);
        }
        rate
    }

    /// Submits since this many ms before now the window needs at a start.
    pub fn window_ms() -> i64 {
        Self::WINDOW_MS
    }

    /// Counts a submit of `uid` at `now_ms` if fewer than `max` came in the
    /// minute before; otherwise counts nothing and says how long until one
    /// more would be allowed.
    pub fn take(&mut self, uid: u32, now_ms: i64, max: usize) -> Option<i64> {
        // Users with nothing recent are forgotten, so the map stays as
        // small as the users of the last minute.
        self.recent
            .retain(|_, q| q.back().is_some_and(|&t| t > now_ms - Self::WINDOW_MS));
        let q = self.recent.entry(uid).or_default();
        while q.front().is_some_and(|&t| t <= now_ms - Self::WINDOW_MS) {
            q.pop_front();
        }
        if q.len() >= max {
            let oldest = *q.front().expect("max is at least 1");
            return Some(oldest + Self::WINDOW_MS - now_ms);
        }
        q.push_back(now_ms);
        None
    }
}

/// What one user holds, as the quotas weigh it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Holding {
    /// Live workers, pending or placed.
    pub live: usize,
    /// Of those, the ones waiting.
    pub pending: usize,
    /// Bytes of their requests (the JSON as submitted).
    pub request_bytes: usize,
}

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
    /// `access.max_submits_per_minute`.
    pub max_submits_per_minute: u32,
    /// `access.max_request_mib_per_user`, in bytes.
    pub max_request_bytes: usize,
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
            max_submits_per_minute: DEFAULT_MAX_SUBMITS_PER_MINUTE,
            max_request_bytes: DEFAULT_MAX_REQUEST_MIB as usize * MIB,
            owner: None,
        }
    }

    /// A user holding `held` may submit one more request of `new_bytes`
    /// only within its quotas (so no one can fill the daemon's memory,
    /// queue or ledger); root is exempt.
    pub fn within_quota(&self, caller: &Caller, held: Holding, new_bytes: usize) -> Result<()> {
        let uid = caller.uid;
        let Holding {
            live,
            pending,
            request_bytes,
        } = held;
        if caller.is_root() {
            return Ok(());
        }
        if request_bytes.saturating_add(new_bytes) > self.max_request_bytes {
            return Err(Error::QuotaExceeded(format!(
                "uid {uid}'s live workers hold {} KiB of requests and this one is {} KiB, more \
                 than access.max_request_mib_per_user ({} MiB) allows; stop some first",
                request_bytes.div_ceil(1024),
                new_bytes.div_ceil(1024),
                self.max_request_bytes / MIB
            )));
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

    /// A submit by `caller` at `now_ms`, counted in `rate` when allowed:
    /// more than `access.max_submits_per_minute` in the last minute is
    /// refused (root is exempt and not counted).
    pub fn within_rate(&self, caller: &Caller, rate: &mut SubmitRate, now_ms: i64) -> Result<()> {
        if caller.is_root() {
            return Ok(());
        }
        let max = self.max_submits_per_minute as usize;
        if let Some(wait_ms) = rate.take(caller.uid, now_ms, max) {
            return Err(Error::QuotaExceeded(format!(
                "uid {} submitted {max} workers in the last minute, the most \
                 access.max_submits_per_minute allows; try again in {} s",
                caller.uid,
                ((wait_ms + 999) / 1000).max(1)
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
            Act::PrepareClaim => format!(
                "uid {uid}: Kubernetes claims are prepared by the kubelet plugin, which runs as root"
            ),
            Act::DriveTemplate => {
                format!("uid {uid}: the GPU baseboard's VMs are root's to start and stop")
            }
        };
        Err(Error::AccessDenied(denied))
    }

    /// Containers and VMs are root-equivalent powers; units run as their
    /// owner, reservations run nothing. A daemon's own user (a session
    /// daemon's) runs them too: its backends are that user's (rootless
    /// podman, `qemu:///session`), or ones the user could reach anyway.
    pub fn may_run(&self, caller: &Caller, workload: Workload) -> Result<()> {
        let uid = caller.uid;
        if self.owner == Some(uid) {
            return Ok(());
        }
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

/// Environment variables a GPU runtime reads as a request for devices or
/// driver features, not as the workload's own settings: NVIDIA's container
/// toolkit reads every `NVIDIA_*` (`NVIDIA_VISIBLE_DEVICES=all` asks for
/// every GPU, `NVIDIA_DRIVER_CAPABILITIES=all` for every driver feature);
/// AMD's, Habana's and Ascend's container runtimes their
/// `*_VISIBLE_DEVICES`. `ASTRAEUS_*` is the daemon's own, refused to
/// everyone (request.rs). docs/security.md lists them.
pub fn is_device_request_env(key: &str) -> bool {
    const KEYS: &[&str] = &[
        "AMD_VISIBLE_DEVICES",
        "HABANA_VISIBLE_DEVICES",
        "ASCEND_VISIBLE_DEVICES",
    ];
    key.starts_with("NVIDIA_") || KEYS.contains(&key)
}

/// Only root (and a session daemon's own user) may set a variable a GPU
/// runtime takes as a device request: the daemon gives a worker its GPUs.
/// `field` is the env's path (`run.container.env`); keys were checked to
/// be letters, digits and `_` when the request was read.
pub fn may_set_env<'a>(
    caller: &Caller,
    daemon_owner: Option<u32>,
    field: &str,
    mut keys: impl Iterator<Item = &'a String>,
) -> Result<()> {
    if caller.is_root() || daemon_owner == Some(caller.uid) {
        return Ok(());
    }
    match keys.find(|k| is_device_request_env(k)) {
        Some(key) => Err(Error::AccessDenied(format!(
            "{field}.{key}: uid {}: a GPU runtime reads {key} as a request for devices, so only \
             root may set it (the daemon gives a worker its GPUs: gpu_requests)",
            caller.uid
        ))),
        None => Ok(()),
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

    #[test]
    fn the_submit_window_read_back_at_a_start_counts_as_before() {
        let now = 1_000_000;
        let mut rate = SubmitRate::from_recent(
            [
                (7, now - 61_000),
                (7, now - 30_000),
                (7, now - 10_000),
                (8, now - 5_000),
            ],
            now,
        );
        // Two of 7's submits are in the window: one more at 3 a minute.
        assert_eq!(rate.take(7, now, 3), None);
        assert_eq!(
            rate.take(7, now, 3),
            Some(30_000),
            "the oldest leaves in 30 s"
        );
        assert_eq!(rate.take(8, now, 1), Some(55_000));
        assert_eq!(rate.take(9, now, 1), None, "no one else is held");
    }

    #[test]
    fn only_root_sets_what_a_gpu_runtime_reads_as_a_device_request() {
        let member = Caller {
            uid: 1003,
            pid: None,
            member: true,
        };
        let root = Caller { uid: 0, ..member };
        let env = |keys: &[&str]| keys.iter().map(|k| k.to_string()).collect::<Vec<_>>();
        for key in [
            "NVIDIA_VISIBLE_DEVICES",
            "NVIDIA_DRIVER_CAPABILITIES",
            "NVIDIA_REQUIRE_CUDA",
            "AMD_VISIBLE_DEVICES",
        ] {
            let keys = env(&["TOKEN", key]);
            let e = may_set_env(&member, None, "run.container.env", keys.iter()).unwrap_err();
            assert_eq!(e.kind(), "AccessDenied");
            assert!(
                e.message()
                    .starts_with(&format!("run.container.env.{key}: uid 1003")),
                "{e}"
            );
            assert!(may_set_env(&root, None, "run.container.env", keys.iter()).is_ok());
            // A session daemon's own user is its root.
            assert!(may_set_env(&member, Some(1003), "run.container.env", keys.iter()).is_ok());
        }
        // What narrows what a process sees inside the container is its own.
        let keys = env(&["CUDA_VISIBLE_DEVICES", "NVIDIAX", "MY_NVIDIA_HOME"]);
        assert!(may_set_env(&member, None, "run.unit.env", keys.iter()).is_ok());
    }

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
    fn a_session_daemons_owner_runs_containers_and_vms_on_its_own_backends() {
        let mut rules = Rules::new("g");
        rules.owner = Some(1000);
        let (owner, member) = (caller(1000, false), caller(1001, true));
        for w in [Workload::Container, Workload::Vm] {
            assert!(rules.may_run(&owner, w).is_ok(), "{w:?}");
            assert!(rules.may_run(&member, w).is_err(), "{w:?}");
        }
    }

    #[test]
    fn quotas_bind_everyone_but_root() {
        let mut rules = Rules::new("g");
        rules.max_workers = 3;
        rules.max_pending = 2;
        rules.max_request_bytes = 10_000;
        let member = caller(1000, true);
        let held = |live, pending, request_bytes| Holding {
            live,
            pending,
            request_bytes,
        };
        assert!(rules.within_quota(&member, held(2, 1, 0), 100).is_ok());
        let e = rules.within_quota(&member, held(3, 0, 0), 100).unwrap_err();
        assert_eq!(e.kind(), "QuotaExceeded");
        assert!(e.message().contains("access.max_workers_per_user"), "{e}");
        let e = rules.within_quota(&member, held(2, 2, 0), 100).unwrap_err();
        assert!(e.message().contains("access.max_pending_per_user"), "{e}");
        // Up to the byte cap and not one byte more.
        assert!(rules
            .within_quota(&member, held(1, 0, 9_000), 1_000)
            .is_ok());
        let e = rules
            .within_quota(&member, held(1, 0, 9_000), 1_001)
            .unwrap_err();
        assert_eq!(e.kind(), "QuotaExceeded");
        assert!(
            e.message().contains("access.max_request_mib_per_user"),
            "{e}"
        );
        assert!(rules
            .within_quota(&caller(0, false), held(10_000, 10_000, 1 << 40), 1 << 20)
            .is_ok());
    }

    /// A member gets `max` submits in any minute (a sliding window: the
    /// oldest leaving frees one), is told how long until the next, and
    /// root is neither held nor counted.
    #[test]
    fn submits_are_held_to_a_rate_per_minute_but_roots() {
        let mut rules = Rules::new("g");
        rules.max_submits_per_minute = 3;
        let mut rate = SubmitRate::default();
        let member = caller(1000, true);
        let other = caller(1001, true);
        for t in [0, 10_000, 20_000] {
            rules.within_rate(&member, &mut rate, t).unwrap();
        }
        let e = rules.within_rate(&member, &mut rate, 30_000).unwrap_err();
        assert_eq!(e.kind(), "QuotaExceeded");
        assert!(
            e.message().contains("access.max_submits_per_minute")
                && e.message().contains("try again in 30 s"),
            "{e}"
        );
        // Another member has a minute of its own.
        rules.within_rate(&other, &mut rate, 30_000).unwrap();
        // A refusal is not counted: the first submit leaves the window at
        // 60 s, and one more fits then, not before.
        assert!(rules.within_rate(&member, &mut rate, 59_999).is_err());
        rules.within_rate(&member, &mut rate, 60_000).unwrap();
        assert!(rules.within_rate(&member, &mut rate, 60_001).is_err());
        for t in 0..100 {
            rules.within_rate(&caller(0, false), &mut rate, t).unwrap();
        }
        assert!(!rate.recent.contains_key(&0), "root is not counted");
        // Users quiet for a minute are forgotten.
        rules.within_rate(&member, &mut rate, 200_000).unwrap();
        assert_eq!(rate.recent.len(), 1);
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
