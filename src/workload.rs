//! A worker's workload as the backends report it and the engine reads it:
//! the domain's side of the runtimes (what a launch needs, how a workload
//! ended or was found) and of the inventory (which processes and control
//! groups are the workers' own). Defined here, beside worker.rs, so that the
//! engine (node/) and the domain import nothing from runtime/ or inventory/:
//! the backends implement what this names.

use crate::quantity::Amount;
use std::collections::{HashMap, HashSet};

/// Everything a runtime needs to start one worker.
#[derive(Clone, Debug)]
pub struct Launch {
    pub worker: String,
    pub run: crate::request::Run,
    /// UUIDs of the GPUs it holds.
    pub gpu_uuids: Vec<String>,
    /// Their PCI addresses, in the same order (VMs take them as hostdevs).
    pub gpu_pci: Vec<String>,
    /// ASTRAEUS_GPU_MEMORY_GB: its share per GPU (shared), or its GPUs' memory (whole).
    pub gpu_memory_gb: Option<String>,
    pub cpu_cores: crate::quantity::Amount,
    pub memory_bytes: u64,
    /// Run as this uid (units of non-root owners); None: as the runtime decides.
    pub user: Option<u32>,
    /// A member's container runs with this primary group and no other
    /// (looked up at its launch); None: as the runtime decides.
    pub group: Option<u32>,
    /// At most this many processes (a member's container: its pids
    /// limit, `runtime.member_max_processes`); None: no limit of ours.
    pub max_processes: Option<u64>,
    /// A shared worker's GPU memory limits, set on its control group after
    /// the group exists and before its command runs; None for whole GPUs,
    /// VMs and workers without GPUs.
    pub hold: Option<crate::memory_limits::Hold>,
}

/// Which runtime a workload belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Container,
    Unit,
    Vm,
}

/// How a workload ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Exit {
    Exited(i32),
    /// The runtime's own error text.
    Failed(String),
}

/// A workload found running (or ended) under a runtime, for reconciliation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    pub worker: String,
    pub id: String,
    pub running: bool,
    pub exit_code: Option<i32>,
    /// When it ended, by the runtime's own clock (epoch ms), when it says.
    pub ended_ms: Option<i64>,
}

/// A workload a runtime started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Started {
    /// The runtime's id for it.
    pub id: String,
    /// How it was given its GPUs, as the worker's started event says it
    /// ("through CDI: nvidia.com/gpu=GPU-…"); None where there is nothing
    /// to say (a unit, a VM's hostdevs, no GPU).
    pub gpus_by: Option<String>,
    /// Whether the launch's `hold` was set before the command ran; None
    /// when it had none.
    pub enforcement: Option<crate::memory_limits::Enforcement>,
}

impl Started {
    pub fn id(id: impl Into<String>) -> Started {
        Started {
            id: id.into(),
            gpus_by: None,
            enforcement: None,
        }
    }
}

/// What a source needs from the engine to tell workers' memory from outside memory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Own {
    /// By GPU (UUID): the running workers granted it. A worker's process
    /// on a GPU it was not granted is outside use there (else a holder
    /// could hide what it takes on any GPU from placement).
    pub on_gpu: HashMap<String, std::sync::Arc<[Claim]>>,
    /// The running workers' control groups: the processes in them are
    /// theirs. Looked in off the loop,
    /// just before the read (service/reading.rs), into `in_cgroups`.
    pub cgroups: std::sync::Arc<[Group]>,
    /// By worker name: the worker's id and the processes found in its
    /// control group.
    pub in_cgroups: HashMap<String, (i64, Vec<u32>)>,
    /// GB promised to workers on each GPU (by UUID), for hosts without
    /// per-process readings (WSL2).
    pub promised: HashMap<String, Amount>,
    /// The workers whose share is held (limits set and read back), with
    /// the control group the limits are on: read back at each reading,
    /// their exact use counted from them.
    pub held: std::sync::Arc<[Group]>,
}

/// A running worker's control group (a path below the cgroup root).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    pub worker: String,
    /// The worker's id: a name may be used again once its worker ended.
    pub id: i64,
    pub cgroup: String,
}

/// A running worker granted a GPU: its share of it (None: the GPU whole)
/// and the processes it names as its own (holders).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    pub worker: String,
    pub share: Option<Amount>,
    pub holders: Vec<u32>,
}

/// One shared worker's promise on a GPU and the processes that are its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Share {
    pub worker: String,
    pub gb: Amount,
    pub pids: Vec<u32>,
}

/// What is the workers' own on one GPU ([`Own::on`]).
#[derive(Clone, Debug, Default)]
pub struct OwnOn {
    /// Processes whose memory on it is a worker's own: the holders and
    /// control-group processes of the running workers granted it.
    pub pids: HashSet<u32>,
    /// What its workers placed by memory were promised, and their processes:
    /// what they use beyond that is outside use too (placement promised
    /// the rest of the GPU to others).
    pub shares: Vec<Share>,
    pub promised: Amount,
    /// By worker: its control group's exact use of the GPU, where its
    /// limits answer it (NVML's currentUsed): counted instead of the bytes
    /// of the processes in that group (`exact_pids`). Its holders outside
    /// the group still count by their own bytes.
    pub exact: HashMap<String, u64>,
    pub exact_pids: HashSet<u32>,
}

impl Own {
    /// What is the workers' own on the GPU `uuid`.
    pub fn on(&self, uuid: &str) -> OwnOn {
        let mut on = OwnOn {
            promised: self.promised.get(uuid).copied().unwrap_or_default(),
            ..OwnOn::default()
        };
        for c in self.on_gpu.get(uuid).into_iter().flat_map(|c| c.iter()) {
            let found = self
                .in_cgroups
                .get(&c.worker)
                .into_iter()
                .flat_map(|(_, p)| p);
            let pids: Vec<u32> = c.holders.iter().chain(found).copied().collect();
            // A worker with no process known here has nothing to tell
            // apart from outside use, and uses nothing beyond its share
            // (nor links to another's: that is by a process in common).
            // Skipped, a refresh of 100,000 such sharers allocates nothing
            // for them (#25).
            if pids.is_empty() {
                continue;
            }
            on.pids.extend(&pids);
            if let Some(gb) = c.share {
                on.shares.push(Share {
                    worker: c.worker.clone(),
                    gb,
                    pids,
                });
            }
        }
        on
    }
}

/// A domain's lifecycle event as time-slicing reads it: libvirt's codes
/// mapped in runtime/libvirt, so that nothing above the runtime matches them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VmEvent {
    Started,
    Stopped,
    /// Defined, undefined, suspended, resumed…: nothing a handoff waits for.
    Other,
}
