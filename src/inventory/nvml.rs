//! Real NVIDIA GPUs through nvml-wrapper. Each read queries every device once
//! (a handful of NVML calls per GPU, no sleeping), so it is cheap enough to run
//! every few seconds on an 8-GPU host.

use super::{board_total, held_outside, host_resources, GpuSource, Own, ProcessUse};
use crate::error::{Error, Result};
use crate::placement::{Gpu, Machine};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::Nvml;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::PathBuf;

/// A GPU becomes unhealthy after this many refreshes in a row whose queries failed.
const FAILURES_BEFORE_UNHEALTHY: u32 = 3;

pub struct NvmlOptions {
    /// The driver's library; searched by name (and in /usr/lib/wsl/lib) when unset.
    pub library: Option<PathBuf>,
    pub machine: String,
    pub wsl: bool,
    /// UUIDs or PCI bus ids of GPUs owned by a time-slicing baseboard.
    pub baseboard: Vec<String>,
    /// UUIDs of GPUs another astraeusd manages (the system's, when this one
    /// runs on a session bus): not listed here, never offered twice.
    pub managed_elsewhere: Vec<String>,
    /// The per-GPU locks this daemon holds (and whether it yields to others').
    pub claims: super::claims::Claims,
}

pub struct NvmlSource {
    nvml: Nvml,
    opts: NvmlOptions,
    /// Consecutive failed refreshes per GPU index, and its last good reading.
    failures: HashMap<u32, u32>,
    last: HashMap<u32, Gpu>,
}

impl NvmlSource {
    /// Loads the driver's library, trying each candidate path in turn; the
    /// error names every path tried and why it failed.
    pub fn open(opts: NvmlOptions) -> Result<NvmlSource> {
        let candidates: Vec<PathBuf> = match &opts.library {
            Some(p) => vec![p.clone()],
            None => vec![
                PathBuf::from("libnvidia-ml.so.1"),
                PathBuf::from("/usr/lib/wsl/lib/libnvidia-ml.so.1"),
            ],
        };
        let mut tried = Vec::new();
        for path in &candidates {
            match Nvml::builder().lib_path(OsStr::new(path)).init() {
                Ok(nvml) => {
                    tracing::info!("NVML loaded from {}", path.display());
                    return Ok(NvmlSource {
                        nvml,
                        opts,
                        failures: HashMap::new(),
                        last: HashMap::new(),
                    });
                }
                Err(e) => tried.push(format!("{} ({e})", path.display())),
            }
        }
        Err(Error::Backend(format!(
            "NVML could not be loaded; tried: {}. Install the NVIDIA driver, set inventory.nvml_library in the config, \
             set inventory.nvml = false on a host that only time-slices, or start with --sim to try the daemon without a GPU",
            tried.join(", ")
        )))
    }

    fn read_one(&self, index: u32, own: &Own) -> std::result::Result<Gpu, String> {
        let err = |what: &str, e: nvml_wrapper::error::NvmlError| format!("{what}: {e}");
        let d = self
            .nvml
            .device_by_index(index)
            .map_err(|e| err("handle", e))?;
        let uuid = d.uuid().map_err(|e| err("uuid", e))?;
        let model = d.name().map_err(|e| err("name", e))?;
        let mem = d.memory_info().map_err(|e| err("memory", e))?;
        let pci_bus_id = d.pci_info().map(|p| p.bus_id).unwrap_or_default();
        let mut processes = Some(Vec::new());
        for list in [
            d.running_compute_processes(),
            d.running_graphics_processes(),
        ] {
            match (list, processes.as_mut()) {
                (Ok(list), Some(procs)) => {
                    for p in list {
                        let bytes = match p.used_gpu_memory {
                            UsedGpuMemory::Used(b) => Some(b),
                            UsedGpuMemory::Unavailable => None,
                        };
                        // A process with both contexts is listed twice: count it once.
                        if !procs.iter().any(|q: &ProcessUse| q.pid == p.pid) {
                            procs.push(ProcessUse {
                                pid: p.pid,
                                bytes,
                                who: describe_pid(p.pid),
                            });
                        }
                    }
                }
                // Per-process readings unavailable: fall back to what is promised.
                (Err(_), _) => processes = None,
                (Ok(_), None) => {}
            }
        }
        let promised = own.promised.get(&uuid).copied().unwrap_or_default();
        // The bytes under the board's nominal size are the driver's too.
        let (total, unreported) = board_total(mem.total);
        let reserved = mem.reserved.saturating_add(unreported);
        let (outside, outside_detail) =
            held_outside(mem.used, reserved, processes.as_deref(), own, promised);
        let own_use = processes.as_ref().map(|procs| {
            procs
                .iter()
                .filter(|p| own.pids.contains(&p.pid))
                .filter_map(|p| p.bytes.map(|b| (p.pid, b)))
                .collect()
        });
        // Optional queries: not every board or driver has them.
        let pending_retired = d.are_pages_pending_retired().unwrap_or(false);
        let sliced = self
            .opts
            .baseboard
            .iter()
            .any(|id| id.eq_ignore_ascii_case(&uuid) || id.eq_ignore_ascii_case(&pci_bus_id));
        Ok(Gpu {
            index,
            uuid,
            model,
            vendor: "nvidia".into(),
            total,
            outside: outside.min(total),
            healthy: !pending_retired,
            sliced,
            outside_detail,
            problem: pending_retired.then(|| "retired pages are pending".to_string()),
            pci_bus_id,
            own_use,
            power_mw: d.power_usage().ok(),
            energy_mj: d.total_energy_consumption().ok(),
            utilization_pct: d.utilization_rates().ok().map(|u| u.gpu),
        })
    }
}

impl GpuSource for NvmlSource {
    fn read(&mut self, own: &Own) -> Result<Machine> {
        let count = self
            .nvml
            .device_count()
            .map_err(|e| Error::Backend(format!("NVML device count: {e}")))?;
        let mut gpus = Vec::new();
        for index in 0..count {
            match self.read_one(index, own) {
                Ok(gpu)
                    if self.opts.managed_elsewhere.contains(&gpu.uuid)
                        || !self.opts.claims.may_manage(&gpu.uuid) => {}
                Ok(gpu) => {
                    self.failures.remove(&index);
                    self.last.insert(index, gpu.clone());
                    gpus.push(gpu);
                }
                Err(why) => {
                    let n = self.failures.entry(index).or_insert(0);
                    *n += 1;
                    tracing::warn!(gpu = index, "NVML query failed ({n} in a row): {why}");
                    // Keep the GPU listed with its last reading, so its workers
                    // stay in view; after a few failures it is unhealthy.
                    if let Some(mut gpu) = self.last.get(&index).cloned() {
                        if *n >= FAILURES_BEFORE_UNHEALTHY {
                            gpu.healthy = false;
                            gpu.problem = Some(format!("its NVML queries keep failing ({why})"));
                        }
                        gpus.push(gpu);
                    }
                }
            }
        }
        let (cpu_cores, memory_bytes) = host_resources();
        Ok(Machine {
            name: self.opts.machine.clone(),
            wsl: self.opts.wsl,
            cpu_cores,
            memory_bytes,
            gpus,
        })
    }
}

/// `Xorg, user gdm` for a pid, as far as /proc tells. Another user names
/// their own process: its name is made printable before it goes anywhere.
fn describe_pid(pid: u32) -> String {
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| crate::text::printable(s.strip_suffix('\n').unwrap_or(&s)))
        .unwrap_or_else(|_| "unknown".into());
    match crate::auth::process(pid).map(|p| p.uid) {
        Some(uid) => {
            let user = crate::auth::user_name(uid).unwrap_or_else(|| uid.to_string());
            format!("{comm}, user {}", crate::text::printable(&user))
        }
        None => comm,
    }
}
