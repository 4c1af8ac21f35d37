//! Launching workers: one small trait, one implementation per kind of `run`.
//! Containers run through podman's REST API (podman.rs), units as systemd
//! transient services (unit.rs), VMs as transient libvirt domains (libvirt.rs).

mod http;
pub mod libvirt;
pub mod podman;
pub mod unit;

use crate::error::Result;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

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

pub trait Runtime: Send + Sync {
    /// Starts the workload; returns the runtime's id for it.
    fn start<'a>(&'a self, launch: &'a Launch) -> BoxFuture<'a, Result<String>>;
    /// Resolves when the workload ends (not by polling: the runtime's own wait).
    fn wait<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Exit>;
    /// Graceful stop, forced after `timeout`.
    fn stop<'a>(&'a self, id: &'a str, timeout: Duration) -> BoxFuture<'a, Result<()>>;
    /// Forgets an ended workload (removes the container).
    fn remove<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<()>>;
    /// Every workload this daemon started, by the worker it belongs to.
    fn list(&self) -> BoxFuture<'_, Result<Vec<Found>>>;
    /// The workload's control group (a path below the cgroup root): GPU
    /// processes in it are the worker's own, not outside use. None where the
    /// runtime cannot tell (a VM's passed-through GPU is invisible to the
    /// host's NVML anyway).
    fn cgroup<'a>(&'a self, _id: &'a str) -> BoxFuture<'a, Option<String>> {
        Box::pin(async { None })
    }
}

/// The processes in a control group and its children, looked up in each
/// hierarchy mounted under `root` (the unified one, or v1's per-controller ones).
pub fn cgroup_pids(root: &std::path::Path, cgroup: &str) -> Vec<u32> {
    let rel = cgroup.trim_start_matches('/');
    if rel.is_empty() || rel.split('/').any(|part| part == "..") {
        return Vec::new();
    }
    let mut pids = Vec::new();
    for hierarchy in ["", "unified", "systemd", "pids", "memory"] {
        let dir = root.join(hierarchy).join(rel);
        if dir.is_dir() {
            collect_pids(&dir, &mut pids, 0);
            break;
        }
    }
    pids.sort_unstable();
    pids.dedup();
    pids
}

fn collect_pids(dir: &std::path::Path, out: &mut Vec<u32>, depth: u32) {
    if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        out.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
    }
    if depth >= 16 {
        return;
    }
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            collect_pids(&entry.path(), out, depth + 1);
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_cgroups_pids_include_its_children_in_whichever_hierarchy_has_it() {
        let root = tempfile::tempdir().unwrap();
        let g = root.path().join("unified/machine.slice/libpod-1.scope");
        std::fs::create_dir_all(g.join("container")).unwrap();
        std::fs::write(g.join("cgroup.procs"), "12\n").unwrap();
        std::fs::write(g.join("container/cgroup.procs"), "40\n41\n").unwrap();
        let pids = super::cgroup_pids(root.path(), "/machine.slice/libpod-1.scope");
        assert_eq!(pids, [12, 40, 41]);
        assert!(super::cgroup_pids(root.path(), "/machine.slice/other").is_empty());
        assert!(super::cgroup_pids(root.path(), "/../etc").is_empty());
        assert!(super::cgroup_pids(root.path(), "/").is_empty());
    }
}
