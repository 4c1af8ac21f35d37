//! A live worker: what it asked for, where it is placed, and where its
//! workload is in its life. Strings for its state exist only where it is
//! shown (bus, page, journal) and stored (ledger).

use crate::placement::{Grant, Machine};
use crate::request::WorkerSpec;

/// A process named as a worker's holder: its pid and its identity (the
/// kernel's start time of the process, in clock ticks since boot), so that
/// the pid reused by another process is never taken for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Holder {
    pub pid: u32,
    /// None: not known (a ledger from before identities were kept); such a
    /// holder is dropped at the first check.
    pub start: Option<u64>,
}

/// The state a person sees.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum State {
    #[default]
    Pending,
    Starting,
    Running,
    Stopping,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Starting => "starting",
            State::Running => "running",
            State::Stopping => "stopping",
        }
    }
}

impl std::fmt::Display for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a worker is. A pending worker's reasons are not kept here: they are
/// computed when asked ([`Node::reasons`]), since every change of a GPU would
/// otherwise rebuild them for the whole queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    Pending,
    Running { grants: Vec<Grant> },
}

impl Status {
    /// As the ledger and every surface say it: pending or running.
    pub fn as_str(&self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Running { .. } => "running",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Worker {
    pub id: i64,
    pub spec: WorkerSpec,
    /// The request as submitted, and with `run.*.env` values hidden (made
    /// once: every view of the worker shares them).
    pub spec_text: std::sync::Arc<str>,
    pub spec_redacted: std::sync::Arc<str>,
    pub owner_uid: u32,
    /// Processes whose GPU memory counts as its own (a reservation's holders).
    pub holders: Vec<Holder>,
    pub submitted: crate::time::EpochMs,
    /// When it was placed (the ledger's started_ms); None while it waits.
    pub placed: Option<crate::time::EpochMs>,
    pub status: Status,
    /// For workers with a `run`: where its workload is in its life.
    pub phase: Phase,
    /// The runtime's id of its workload (container id), once launched.
    pub runtime_id: Option<String>,
    /// Its workload's control group, and the processes found in it at the
    /// last inventory refresh: their GPU memory is the worker's own.
    pub cgroup: Option<String>,
    pub cgroup_pids: Vec<u32>,
    /// Whether its share is held by the driver or kernel (set and read
    /// back on its control group) or only promised; None until its launch
    /// or, after a restart, its check reports.
    pub enforcement: Option<crate::memory_limits::Enforcement>,
    /// Its stop, once acknowledged (kept in the ledger): carried out until
    /// its workload is gone, and it never runs again.
    pub stop_asked: Option<StopAsked>,
}

/// Who asked a worker to stop, and when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StopAsked {
    pub by_uid: u32,
    pub at: crate::time::EpochMs,
}

impl StopAsked {
    /// How the ledger's history says the end of a worker stopped so:
    /// "stopped" by its owner, "stopped by uid N" by anyone else (root),
    /// and "; killed after N s" when its workload had to be killed (it
    /// ended by SIGKILL: status 137, as engines report a kill). A uid, not
    /// a name: the name service is never asked on the loop's behalf (a
    /// slow directory would stall it), and every surface that shows a
    /// reason resolves no more than it is given.
    pub fn reason(
        &self,
        owner_uid: u32,
        exit_status: Option<i32>,
        ended: crate::time::EpochMs,
    ) -> String {
        let mut reason = if self.by_uid == owner_uid {
            "stopped".to_string()
        } else {
            format!("stopped by uid {}", self.by_uid)
        };
        if exit_status == Some(KILLED) {
            let secs = (ended.as_i64() - self.at.as_i64()).max(0) as f64 / 1000.0;
            reason.push_str(&format!("; killed after {} s", secs.round() as i64));
        }
        reason
    }
}

/// The status a workload killed by SIGKILL ends with (128 + 9).
pub const KILLED: i32 = 137;

/// A placed worker's workload: a reservation is simply `Held`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Held,
    Starting,
    Running,
    Stopping,
}

impl Worker {
    /// pending, starting, running or stopping — the State a person sees.
    pub fn state(&self) -> State {
        match (&self.status, self.phase) {
            (Status::Pending, _) => State::Pending,
            (_, Phase::Starting) => State::Starting,
            (_, Phase::Stopping) => State::Stopping,
            _ => State::Running,
        }
    }

    /// Whether the daemon launches a workload for it (a container, a unit or a VM).
    pub fn launches(&self) -> bool {
        self.kind().is_some()
    }

    /// Which runtime launches it.
    pub fn kind(&self) -> Option<crate::workload::Kind> {
        match self.spec.run {
            Some(crate::request::Run::Container { .. }) => Some(crate::workload::Kind::Container),
            Some(crate::request::Run::Unit { .. }) => Some(crate::workload::Kind::Unit),
            Some(crate::request::Run::Vm(_)) => Some(crate::workload::Kind::Vm),
            None => None,
        }
    }

    /// What its runtime needs to start it.
    pub fn launch(&self, machine: &Machine) -> Option<crate::workload::Launch> {
        let run = self.spec.run.clone()?;
        let grants = self.grants();
        let gpu_memory_gb = match self.spec.shared_gb() {
            Some(share) => Some(share.to_string()),
            None => grants
                .iter()
                .filter_map(|g| machine.gpus.iter().find(|m| m.uuid == g.gpu_uuid))
                .map(|g| g.total)
                .min()
                .map(|t| t.to_string()),
        };
        Some(crate::workload::Launch {
            worker: self.name().to_string(),
            run,
            gpu_uuids: grants.iter().map(|g| g.gpu_uuid.clone()).collect(),
            gpu_pci: grants
                .iter()
                .map(|g| {
                    machine
                        .gpus
                        .iter()
                        .find(|m| m.uuid == g.gpu_uuid)
                        .map(|m| m.pci_bus_id.clone())
                        .unwrap_or_default()
                })
                .collect(),
            gpu_memory_gb,
            cpu_cores: self.spec.resources.cpu_cores,
            memory_bytes: self.spec.resources.memory_bytes,
            user: Some(self.owner_uid),
            group: None,
            max_processes: None,
            hold: None,
        })
    }

    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// Its `Enforcement` as a person reads it: the first word `held` only
    /// when its limits were set and read back on every GPU it holds,
    /// `whole` for a worker holding whole GPUs (nothing to limit: no one
    /// else is placed there), else `promised` and why.
    pub fn enforcement_text(&self) -> String {
        let why = match (&self.enforcement, self.state()) {
            (Some(e), _) => return e.to_string(),
            (None, State::Pending) => "it waits for its GPUs",
            (None, _) if self.grants().is_empty() => "it holds no GPU",
            (None, _) if self.spec.shared_gb().is_none() => {
                return "whole: its GPUs are all its own (no limit to hold)".into()
            }
            (None, _) if self.spec.claim.is_some() => {
                "no container of its pod bound yet (the claim CDI hook binds it as it is created)"
            }
            (None, _) if !self.launches() => "a reservation (no workload of its own to limit)",
            (None, State::Starting) => "starting (its limits are set before its command runs)",
            (None, _) => "its limits are not known yet",
        };
        format!("promised: {why}")
    }

    /// Processes whose GPU memory is this worker's: its holders and its workload's.
    pub fn own_pids(&self) -> impl Iterator<Item = u32> + '_ {
        self.holders
            .iter()
            .map(|h| h.pid)
            .chain(self.cgroup_pids.iter().copied())
    }
    pub fn grants(&self) -> &[Grant] {
        match &self.status {
            Status::Running { grants } => grants,
            Status::Pending => &[],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::EpochMs;

    #[test]
    fn a_stop_says_who_and_whether_it_had_to_kill() {
        let asked = |by_uid| StopAsked {
            by_uid,
            at: EpochMs::from_i64(10_000),
        };
        let at = EpochMs::from_i64(14_400);
        assert_eq!(asked(1000).reason(1000, Some(0), at), "stopped");
        assert_eq!(asked(0).reason(1000, Some(143), at), "stopped by uid 0");
        assert_eq!(asked(0).reason(1000, None, at), "stopped by uid 0");
        assert_eq!(
            asked(1000).reason(1000, Some(KILLED), at),
            "stopped; killed after 4 s"
        );
        assert_eq!(
            asked(0).reason(1000, Some(137), EpochMs::from_i64(5)),
            "stopped by uid 0; killed after 0 s"
        );
    }
}
