//! Launching workers: one small trait, one implementation per kind of `run`.
//! Containers run through podman's REST API (podman.rs) or Docker Engine's
//! (docker.rs), units as systemd transient services (unit.rs), VMs as
//! transient libvirt domains (libvirt.rs).

pub mod docker;
mod http;
pub mod libvirt;
pub mod podman;
pub mod unit;
pub mod vm_host;

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
    /// A member's container runs with this primary group and no other
    /// (looked up at its launch); None: as the runtime decides.
    pub group: Option<u32>,
    /// At most this many processes (a member's container: its pids
    /// limit, `runtime.member_max_processes`); None: no limit of ours.
    pub max_processes: Option<u64>,
    /// A shared worker's GPU memory limits, set on its control group after
    /// the group exists and before its command runs; None for whole GPUs,
    /// VMs and workers without GPUs.
    pub hold: Option<crate::inventory::limits::Hold>,
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
    pub enforcement: Option<crate::inventory::limits::Enforcement>,
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
    let apply = tokio::task::spawn_blocking(move || hold.apply(&cgroup));
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

/// A container engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    Podman,
    Docker,
}

impl Engine {
    /// As the ledger records it (`Store::container_engine`).
    pub fn as_str(self) -> &'static str {
        match self {
            Engine::Podman => "podman",
            Engine::Docker => "docker",
        }
    }

    pub fn parse(text: &str) -> Option<Engine> {
        match text {
            "podman" => Some(Engine::Podman),
            "docker" => Some(Engine::Docker),
            _ => None,
        }
    }
}

/// The engine that runs container workers, as `runtime.containers` says,
/// how the log says it ("Docker at /var/run/docker.sock"), and which.
/// `auto` takes the one whose socket answers now, podman first; with
/// neither, podman (a socket-activated or later-started podman is then
/// used, and a launch before it answers fails naming it). But where
/// container workers of the ledger live (`live_under`: the engine they
/// were started through), `auto` keeps that engine, answering or not: a
/// podman restarting as the daemon starts must not send the restart's
/// reconciling to Docker, which would find none of them and end workers
/// whose containers still run.
pub async fn containers(
    config: &crate::config::RuntimeConfig,
    wsl: bool,
    live_under: Option<Engine>,
) -> (std::sync::Arc<dyn Runtime>, String, Engine) {
    use crate::config::ContainerEngine;
    let make = |engine: Engine| -> (std::sync::Arc<dyn Runtime>, String) {
        // SAFETY: geteuid cannot fail.
        let own_uid = unsafe { libc::geteuid() };
        match engine {
            Engine::Podman => (
                std::sync::Arc::new(podman::Podman {
                    socket: config.podman_socket.clone(),
                    cdi_device: config.cdi_device.clone(),
                    answer_within: Duration::from_secs(config.podman_timeout_seconds),
                    own_uid,
                }),
                format!("podman at {}", config.podman_socket.display()),
            ),
            Engine::Docker => (
                std::sync::Arc::new(docker::Docker {
                    socket: config.docker_socket.clone(),
                    cdi_device: config.cdi_device.clone(),
                    wsl,
                    answer_within: Duration::from_secs(config.docker_timeout_seconds),
                    own_uid,
                }),
                format!("Docker at {}", config.docker_socket.display()),
            ),
        }
    };
    let (podman_at, docker_at) = (
        config.podman_socket.display(),
        config.docker_socket.display(),
    );
    let (engine, why) = match (config.containers, live_under) {
        (ContainerEngine::Podman, _) => (Engine::Podman, "runtime.containers = \"podman\"".into()),
        (ContainerEngine::Docker, _) => (Engine::Docker, "runtime.containers = \"docker\"".into()),
        (ContainerEngine::Auto, Some(engine)) => (
            engine,
            "auto: the ledger's live container workers were started through it".into(),
        ),
        (ContainerEngine::Auto, None) => {
            let limit = Duration::from_secs(2);
            if http::pings(&config.podman_socket, limit).await {
                (Engine::Podman, "auto: podman answers".to_string())
            } else if http::pings(&config.docker_socket, limit).await {
                let why = format!("auto: podman does not answer at {podman_at}, Docker does");
                (Engine::Docker, why)
            } else {
                let why = format!("auto: neither podman nor Docker at {docker_at} answers yet");
                (Engine::Podman, why)
            }
        }
    };
    let (rt, by) = make(engine);
    tracing::info!("container workers run through {by} ({why})");
    (rt, by, engine)
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
