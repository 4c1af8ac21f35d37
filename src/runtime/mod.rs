//! Launching workers: one small trait ([`Runtime`]) and its
//! implementations. Containers run through podman's REST API (podman.rs) or
//! Docker Engine's (docker.rs; which of the two: containers.rs), units as
//! systemd transient services (unit.rs), VMs as transient libvirt domains
//! (libvirt/). The types they share with the engine are the domain's
//! (crate::workload).

mod compat;
mod containers;
pub mod docker;
pub mod guest_channel;
mod http;
pub mod libvirt;
pub mod podman;
pub mod unit;
pub mod vm_host;
pub mod vm_probes;

use crate::error::Result;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

pub use crate::workload::{Exit, Found, Kind, Launch, Started};

/// Sets a launch's GPU memory limits on the workload's control group
/// (`cgroup`, as [`cgroup_of`] or systemd names it) and reads them back,
/// on a blocking thread and within [`crate::deadline::MEMORY_LIMITS`]:
/// None when the launch holds nothing.
pub async fn hold(
    l: &Launch,
    cgroup: Option<String>,
) -> Option<crate::inventory::limits::Enforcement> {
    Some(apply_hold(l.hold.clone()?, cgroup).await)
}

/// [`hold`]'s work for any hold: also a restart's check of an adopted worker.
pub async fn apply_hold(
    hold: crate::inventory::limits::Hold,
    cgroup: Option<String>,
) -> crate::inventory::limits::Enforcement {
    use crate::inventory::limits::Enforcement;
    let Some(cgroup) = cgroup else {
        return Enforcement::Promised("its control group could not be found".into());
    };
    let limit = crate::deadline::of(crate::deadline::MEMORY_LIMITS);
    let apply = tokio::task::spawn_blocking(move || {
        // A test holds the driver's calls here, as a wedged driver would.
        crate::failpoint::hit("limits.apply");
        hold.apply(&cgroup)
    });
    match tokio::time::timeout(limit, apply).await {
        Ok(Ok(e)) => e,
        Ok(Err(_)) => Enforcement::Promised("setting its limits failed unexpectedly".into()),
        Err(_) => Enforcement::Promised(format!(
            "its limits were not set within {} s",
            limit.as_secs_f64()
        )),
    }
}

/// The process a container's CDI hook names (its OCI state's `pid`),
/// seen from here. runc runs `createContainer` hooks from the container's
/// init, inside the container's pid namespace: the state says 1, and the
/// hook (`caller`, whose pid the bus gives) is that init's child. Other
/// runtimes run hooks in their own namespace, where the state's pid is the
/// host's. So: the hook's parent when the state's pid is that parent's
/// pid in a namespace nested below this one, else the state's pid.
pub fn hooked_process(state_pid: u32, caller: Option<u32>) -> u32 {
    let status = |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/status")).ok();
    caller
        .and_then(|c| status_field(&status(c)?, "PPid")?.parse::<u32>().ok())
        .and_then(|parent| {
            let text = status(parent)?;
            let ids: Vec<&str> = status_field(&text, "NSpid")?.split_whitespace().collect();
            (ids.len() > 1 && ids.last()? == &state_pid.to_string()).then_some(parent)
        })
        .unwrap_or(state_pid)
}

/// One field of a `/proc/PID/status` text (`PPid:\t1` → "1").
fn status_field<'a>(status: &'a str, key: &str) -> Option<&'a str> {
    status.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k == key).then(|| v.trim())
    })
}

/// The control group of process `pid` ([`cgroup_of`] its `/proc/PID/cgroup`).
pub fn cgroup_of_pid(pid: u32) -> Option<String> {
    cgroup_of(&std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?)
}

pub trait Runtime: Send + Sync {
    /// Starts the workload.
    fn start<'a>(&'a self, launch: &'a Launch) -> BoxFuture<'a, Result<Started>>;
    /// Resolves when the workload ends (not by polling: the runtime's own wait).
    fn wait<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Exit>;
    /// Graceful stop, forced after `timeout`.
    fn stop<'a>(&'a self, id: &'a str, timeout: Duration) -> BoxFuture<'a, Result<()>>;
    /// Kills the workload now: what a stop comes to when its graceful
    /// call was not answered within its timeout. By default, a stop with
    /// no grace.
    fn kill<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<()>> {
        self.stop(id, Duration::ZERO)
    }
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

pub use containers::{containers, ContainerRuntime};

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

/// The control group a process is in, from its `/proc/PID/cgroup` text: on
/// a v1 or hybrid host the `memory` controller's path (where a container's
/// processes are accounted), else the unified hierarchy's `0::` line.
/// None for the root group or text that names none.
pub fn cgroup_of(proc_cgroup: &str) -> Option<String> {
    let path_of = |want: &dyn Fn(&str) -> bool| {
        proc_cgroup.lines().find_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            want(controllers).then(|| path.trim().to_string())
        })
    };
    let memory = |c: &str| c.split(',').any(|c| c == "memory");
    let unified = |c: &str| c.is_empty();
    let path = path_of(&memory).or_else(|| path_of(&unified))?;
    (path.starts_with('/') && path != "/").then_some(path)
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
    fn a_process_cgroup_is_its_memory_controllers_or_the_unified_one() {
        // These machines: hybrid v1, with a unified line besides.
        let hybrid = "9:name=systemd:/docker/abc\n4:memory:/docker/abc\n\
                      3:cpu,cpuacct:/docker/abc\n0::/docker/abc\n";
        assert_eq!(super::cgroup_of(hybrid).as_deref(), Some("/docker/abc"));
        // Pure v1 where memory is joined with another controller.
        let v1 = "5:pids:/x\n4:memory,hugetlb:/system.slice/docker-abc.scope\n";
        assert_eq!(
            super::cgroup_of(v1).as_deref(),
            Some("/system.slice/docker-abc.scope")
        );
        // Pure v2.
        let v2 = "0::/system.slice/docker-abc.scope\n";
        assert_eq!(
            super::cgroup_of(v2).as_deref(),
            Some("/system.slice/docker-abc.scope")
        );
        assert_eq!(super::cgroup_of("0::/\n"), None);
        assert_eq!(super::cgroup_of("garbage"), None);
        assert_eq!(super::cgroup_of(""), None);
    }

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
