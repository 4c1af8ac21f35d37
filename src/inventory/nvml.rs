//! Real NVIDIA GPUs through nvml-wrapper. Each read queries every device once
//! (a handful of NVML calls per GPU, no sleeping), so it is cheap enough to run
//! every few seconds on an 8-GPU host.

use super::{board_total, held_outside, host_resources, GpuSource, Own, ProcessUse};
use crate::error::{Error, Result};
use crate::machine::{HeldUse, ShareLimits};
use crate::placement::{Gpu, Machine};
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use std::collections::{HashMap, HashSet};
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
    /// The library it loaded (the memory limits' calls are looked up there).
    library: PathBuf,
    /// What holds shares' memory limits, asked whether it can for each GPU.
    limits: Option<std::sync::Arc<dyn super::limits::MemoryLimits>>,
    opts: NvmlOptions,
    /// Consecutive failed refreshes per GPU index, the UUID last read at
    /// each index, and each GPU's last good reading by UUID.
    failures: HashMap<u32, u32>,
    uuid_at: HashMap<u32, String>,
    last: HashMap<String, Gpu>,
    /// What was said once already: (GPU index, which note).
    noted: HashSet<(u32, &'static str)>,
    /// Critical XID events, read at every refresh (so within seconds).
    xids: XidEvents,
}

/// XIDs that mean the GPU itself is in trouble and needs a reset (NVIDIA's
/// list of XIDs that require one: double-bit ECC, row remapping, NVLink,
/// fallen off the bus, contained/uncontained ECC, GSP, …). Other critical
/// XIDs (13, 31, 43: an application's fault) leave its health alone.
const XIDS_NEEDING_RESET: &[(u64, &str)] = &[
    (48, "a double-bit ECC error"),
    (63, "a row remapping event"),
    (64, "a row remapping failure"),
    (74, "an NVLink error"),
    (79, "it fell off the bus"),
    (92, "a high single-bit ECC error rate"),
    (94, "a contained ECC error"),
    (95, "an uncontained ECC error"),
    (119, "a GSP RPC timeout"),
    (120, "a GSP error"),
    (136, "a link training failure"),
    (140, "an unrecovered ECC error"),
    (154, "a recovery action required by the driver"),
];

/// NVML's event set for critical XIDs (nvmlEventSet), polled without waiting:
/// `set` is the library's opaque handle (null when events are not offered).
struct XidEvents {
    set: *mut std::ffi::c_void,
    tried: bool,
    /// GPUs (by UUID) whose XIDs are recorded in the set.
    registered: HashSet<String>,
    /// A GPU's XID that needs a reset, by UUID: unhealthy until the daemon restarts.
    seen: HashMap<String, (u64, &'static str)>,
}

// SAFETY: the handle is only used by the source's owner, one call at a time
// (the source moves between threads, it is never shared).
unsafe impl Send for XidEvents {}

const EVENT_TYPE_XID_CRITICAL: u64 = 0x8;

/// What NVML tells of a GPU's memory health, each source where the board
/// has it: boards before Ampere retire pages; A100, H100 and later remap
/// rows instead (and answer NOT_SUPPORTED for retired pages); boards with
/// ECC count uncorrected errors.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MemoryHealth {
    pub retired_pages_pending: Option<bool>,
    pub rows: Option<RowRemapping>,
    /// Uncorrected ECC errors since the driver loaded.
    pub uncorrected_errors: Option<u64>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RowRemapping {
    pub pending: bool,
    pub failed: bool,
}

impl MemoryHealth {
    /// What is wrong, in words (empty when nothing is).
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.retired_pages_pending == Some(true) {
            out.push("retired pages are pending (a GPU reset retires them)".to_string());
        }
        if let Some(rows) = self.rows {
            if rows.failed {
                out.push("row remapping failed (the GPU needs service)".to_string());
            } else if rows.pending {
                out.push("rows are waiting to be remapped (a GPU reset remaps them)".to_string());
            }
        }
        match self.uncorrected_errors {
            Some(1) => out.push("1 uncorrected ECC error since the driver loaded".to_string()),
            Some(n) if n > 1 => out.push(format!(
                "{n} uncorrected ECC errors since the driver loaded"
            )),
            _ => {}
        }
        out
    }

    /// Whether the board reports any of them.
    pub fn known(&self) -> bool {
        self.retired_pages_pending.is_some()
            || self.rows.is_some()
            || self.uncorrected_errors.is_some()
    }
}

/// nvmlDeviceGetRemappedRows, which nvml-wrapper 0.13 does not wrap: called
/// through the library nvml-wrapper loaded, with its error mapping.
fn remapped_rows(nvml: &Nvml, d: &Device) -> std::result::Result<RowRemapping, NvmlError> {
    let sym = nvml_wrapper::error::nvml_sym(nvml.lib().nvmlDeviceGetRemappedRows.as_ref())?;
    let (mut corrected, mut uncorrected, mut pending, mut failed) = (0, 0, 0, 0);
    // SAFETY: the handle is valid while `d` lives; the out-pointers are ours.
    let rc = unsafe {
        sym(
            d.handle(),
            &mut corrected,
            &mut uncorrected,
            &mut pending,
            &mut failed,
        )
    };
    nvml_wrapper::error::nvml_try(rc)?;
    Ok(RowRemapping {
        pending: pending != 0,
        failed: failed != 0,
    })
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
                        library: path.clone(),
                        limits: None,
                        opts,
                        failures: HashMap::new(),
                        uuid_at: HashMap::new(),
                        last: HashMap::new(),
                        noted: HashSet::new(),
                        xids: XidEvents {
                            set: std::ptr::null_mut(),
                            tried: false,
                            registered: HashSet::new(),
                            seen: HashMap::new(),
                        },
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

    /// What holds shares' memory limits (each reading says, per GPU,
    /// whether it can).
    pub fn set_limits(&mut self, limits: std::sync::Arc<dyn super::limits::MemoryLimits>) {
        self.limits = Some(limits);
    }

    /// The driver's library, as loaded.
    pub fn library(&self) -> &std::path::Path {
        &self.library
    }

    /// A health query's answer: None where the board does not have it; a
    /// lost GPU fails the whole reading; any other error (no permission, an
    /// unknown failure) is said once and counts as not known.
    fn health_query<T>(
        &mut self,
        index: u32,
        what: &'static str,
        answer: std::result::Result<T, NvmlError>,
    ) -> std::result::Result<Option<T>, String> {
        match answer {
            Ok(v) => Ok(Some(v)),
            Err(NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_)) => Ok(None),
            Err(e @ (NvmlError::GpuLost | NvmlError::Uninitialized)) => Err(format!("{what}: {e}")),
            Err(e) => {
                if self.noted.insert((index, what)) {
                    tracing::warn!(
                        gpu = index,
                        "GPU {index}: NVML does not tell its {what} ({e}); its health is judged without it"
                    );
                }
                Ok(None)
            }
        }
    }

    fn memory_health(&mut self, index: u32) -> std::result::Result<MemoryHealth, String> {
        let d = self
            .nvml
            .device_by_index(index)
            .map_err(|e| format!("handle: {e}"))?;
        let retired = d.are_pages_pending_retired();
        let rows = remapped_rows(&self.nvml, &d);
        let ecc = d.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile);
        let health = MemoryHealth {
            retired_pages_pending: self.health_query(index, "retired pages", retired)?,
            rows: self.health_query(index, "row remapping", rows)?,
            uncorrected_errors: self.health_query(index, "ECC error counts", ecc)?,
        };
        if !health.known() && self.noted.insert((index, "no memory health")) {
            tracing::info!(
                gpu = index,
                "GPU {index} reports neither retired pages, row remapping nor ECC errors: \
                 its health is judged by its NVML queries answering"
            );
        }
        Ok(health)
    }

    /// Registers a GPU for critical XID events, once (the set is made on
    /// first use); a board or driver without them is said once.
    fn watch_xids(&mut self, index: u32, uuid: &str) {
        if self.xids.registered.contains(uuid) {
            return;
        }
        let lib = self.nvml.lib();
        if !self.xids.tried {
            self.xids.tried = true;
            let made =
                nvml_wrapper::error::nvml_sym(lib.nvmlEventSetCreate.as_ref()).and_then(|create| {
                    let mut set = std::ptr::null_mut();
                    // SAFETY: NVML writes the new set's handle into `set`.
                    nvml_wrapper::error::nvml_try(unsafe { create(&mut set) })?;
                    Ok(set)
                });
            match made {
                Ok(set) => self.xids.set = set.cast(),
                Err(e) => tracing::info!(
                    "NVML offers no XID events ({e}): GPU faults are seen by their queries only"
                ),
            }
        }
        if self.xids.set.is_null() {
            return;
        }
        let registered = nvml_wrapper::error::nvml_sym(lib.nvmlDeviceRegisterEvents.as_ref())
            .and_then(|register| {
                let d = self.nvml.device_by_index(index)?;
                // SAFETY: a valid device handle and the set made above.
                let rc =
                    unsafe { register(d.handle(), EVENT_TYPE_XID_CRITICAL, self.xids.set.cast()) };
                nvml_wrapper::error::nvml_try(rc)
            });
        match registered {
            Ok(()) => {
                self.xids.registered.insert(uuid.to_string());
            }
            Err(e) => {
                if self.noted.insert((index, "no xid events")) {
                    tracing::info!(gpu = index, "GPU {index} reports no XID events ({e})");
                }
            }
        }
    }

    /// Takes every critical XID NVML holds for us, without waiting.
    fn drain_xids(&mut self) {
        if self.xids.set.is_null() {
            return;
        }
        let lib = self.nvml.lib();
        let Ok(wait) = nvml_wrapper::error::nvml_sym(lib.nvmlEventSetWait_v2.as_ref()) else {
            return;
        };
        let Ok(index_of) = nvml_wrapper::error::nvml_sym(lib.nvmlDeviceGetIndex.as_ref()) else {
            return;
        };
        // A bound: NVML hands events one at a time; a storm must not hold a refresh.
        for _ in 0..64 {
            // SAFETY: NVML fills the event data, a plain C struct, zeroed here.
            let mut data = unsafe { std::mem::zeroed() };
            let rc = unsafe { wait(self.xids.set.cast(), &mut data, 0) };
            if nvml_wrapper::error::nvml_try(rc).is_err() {
                break; // NVML_ERROR_TIMEOUT: nothing more, now.
            }
            if data.eventType & EVENT_TYPE_XID_CRITICAL == 0 {
                continue;
            }
            let mut index = 0;
            // SAFETY: the event's device handle, as NVML gave it.
            if nvml_wrapper::error::nvml_try(unsafe { index_of(data.device, &mut index) }).is_err()
            {
                continue;
            }
            let xid = data.eventData;
            let uuid = self.uuid_at.get(&index).cloned().unwrap_or_default();
            match XIDS_NEEDING_RESET.iter().find(|(x, _)| *x == xid) {
                Some(&(_, what)) => {
                    tracing::error!(
                        gpu = index,
                        "GPU {index} reported XID {xid} ({what}): it takes no new work \
                         until it is reset and astraeusd is restarted"
                    );
                    self.xids.seen.insert(uuid, (xid, what));
                }
                None => tracing::warn!(
                    gpu = index,
                    "GPU {index} reported XID {xid} (an application's fault, not the GPU's): its health is unchanged"
                ),
            }
        }
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
        let processes = processes_on(&d);
        // The bytes under the board's nominal size are the driver's too.
        let (total, unreported) = board_total(mem.total);
        let reserved = mem.reserved.saturating_add(unreported);
        let mut mine = own.on(&uuid);
        let held_use = self.read_held(own, &uuid, &pci_bus_id, &mut mine);
        let held = held_outside(mem.used, reserved, processes.as_deref(), &mine);
        let own_use = own_use(processes.as_deref(), &mine);
        let sliced = super::on_baseboard(&self.opts.baseboard, &uuid, &pci_bus_id);
        // Not supported (a GPU without MIG) or absent (an older driver):
        // off. NVML's MIG modes: 0 disabled, 1 enabled.
        let mig = match d.mig_mode() {
            Ok(m) if m.current == 1 => crate::placement::Mig::On,
            Ok(m) if m.pending == 1 => crate::placement::Mig::Pending,
            _ => crate::placement::Mig::Off,
        };
        let share_limits = self.share_limits(&uuid, &pci_bus_id, mig);
        Ok(Gpu {
            share_limits,
            held_use,
            index,
            uuid,
            model,
            vendor: "nvidia".into(),
            total,
            outside: held.outside.min(total),
            beyond_shares: held.beyond_shares,
            beyond: held.beyond,
            healthy: true,
            sliced,
            mig,
            mig_of: None,
            outside_detail: held.detail,
            problem: None,
            pci_bus_id,
            own_use,
            power_mw: d.power_usage().ok(),
            energy_mj: d.total_energy_consumption().ok(),
            utilization_pct: d.utilization_rates().ok().map(|u| u.gpu),
        })
    }
}

impl NvmlSource {
    /// The MIG instances of a GPU in MIG mode, each offered as a GPU of
    /// its own, whole only (memory limits do not apply to MIG handles):
    /// its UUID, name and memory; its health, bus and fate its parent's.
    /// Indices are given by the caller, after every physical GPU's.
    fn mig_instances(&self, parent: &Gpu, own: &Own) -> Vec<Gpu> {
        let Ok(d) = self.nvml.device_by_index(parent.index) else {
            return Vec::new();
        };
        let slots = d.mig_device_count().unwrap_or(0);
        let mut out = Vec::new();
        for slot in 0..slots {
            // An empty slot answers NOT_FOUND.
            let Ok(m) = d.mig_device_by_index(slot) else {
                continue;
            };
            let (Ok(uuid), Ok(mem)) = (m.uuid(), m.memory_info()) else {
                continue;
            };
            let model = m
                .name()
                .unwrap_or_else(|_| format!("{} MIG instance", parent.model));
            let (total, unreported) = board_total(mem.total);
            let processes = processes_on(&m);
            let mine = own.on(&uuid);
            let held = held_outside(
                mem.used,
                mem.reserved.saturating_add(unreported),
                processes.as_deref(),
                &mine,
            );
            let own_use = own_use(processes.as_deref(), &mine);
            out.push(Gpu {
                index: 0,
                uuid,
                model,
                vendor: "nvidia".into(),
                total,
                outside: held.outside.min(total),
                healthy: parent.healthy,
                problem: parent
                    .problem
                    .as_ref()
                    .map(|p| format!("its GPU {} is unhealthy: {p}", parent.index)),
                outside_detail: held.detail,
                pci_bus_id: parent.pci_bus_id.clone(),
                mig_of: Some(parent.uuid.clone()),
                own_use,
                share_limits: ShareLimits::Not(
                    "a MIG instance (memory limits do not apply to MIG instances; offered whole)"
                        .into(),
                ),
                ..Gpu::default()
            });
        }
        out
    }

    /// The limits of each held worker on this GPU, read back; where they
    /// are set and count its group's use, that use is its own, exactly
    /// (`mine.exact`), in place of its processes' bytes.
    fn read_held(&self, own: &Own, uuid: &str, pci: &str, mine: &mut super::OwnOn) -> Vec<HeldUse> {
        let (Some(limits), Some(claims)) = (&self.limits, own.on_gpu.get(uuid)) else {
            return Vec::new();
        };
        let id = super::limits::GpuId {
            uuid: uuid.to_string(),
            pci: pci.to_string(),
        };
        let mut out = Vec::new();
        for group in own.held.iter() {
            let Some(gb) = claims
                .iter()
                .find(|c| c.worker == group.worker)
                .and_then(|c| c.share)
            else {
                continue;
            };
            let read = limits.get(&id, &group.cgroup).ok();
            let set = read.filter(|r| r.limits != super::limits::Limits::NONE);
            if let Some(used) = set.and_then(|r| r.used) {
                mine.exact.insert(group.worker.clone(), used);
                let in_group = own
                    .in_cgroups
                    .get(&group.worker)
                    .filter(|(id, _)| *id == group.id);
                mine.exact_pids.extend(
                    in_group
                        .into_iter()
                        .flat_map(|(_, pids)| pids.iter().copied()),
                );
                if !mine.shares.iter().any(|s| s.worker == group.worker) {
                    mine.shares.push(super::Share {
                        worker: group.worker.clone(),
                        gb,
                        pids: Vec::new(),
                    });
                }
            }
            out.push(HeldUse {
                worker: group.worker.clone(),
                limits: read.map(|r| (r.limits.soft, r.limits.hard)),
                used: set.and_then(|r| r.used),
            });
        }
        out
    }

    /// Whether a share of this GPU can be held, and by what or why not.
    fn share_limits(&self, uuid: &str, pci: &str, mig: crate::placement::Mig) -> ShareLimits {
        if self.opts.wsl {
            return ShareLimits::Not("WSL (no per-container GPU memory limits)".into());
        }
        if mig == crate::placement::Mig::On {
            return ShareLimits::Not(
                "MIG mode (memory limits do not apply to MIG instances)".into(),
            );
        }
        let Some(limits) = &self.limits else {
            return ShareLimits::Unknown;
        };
        let id = super::limits::GpuId {
            uuid: uuid.to_string(),
            pci: pci.to_string(),
        };
        match limits.can_hold(&id) {
            Ok(how) => ShareLimits::By(how.into()),
            Err(why) => ShareLimits::Not(why),
        }
    }
}

impl Drop for NvmlSource {
    fn drop(&mut self) {
        if self.xids.set.is_null() {
            return;
        }
        if let Ok(free) = nvml_wrapper::error::nvml_sym(self.nvml.lib().nvmlEventSetFree.as_ref()) {
            // SAFETY: the set made in watch_xids, freed once, before NVML shuts down.
            unsafe { free(self.xids.set.cast()) };
        }
    }
}

impl GpuSource for NvmlSource {
    fn read(&mut self, own: &Own) -> Result<Machine> {
        let count = self
            .nvml
            .device_count()
            .map_err(|e| Error::Backend(format!("NVML device count: {e}")))?;
        // XIDs first: a GPU that just failed is judged so in this same reading.
        self.drain_xids();
        let mut gpus = Vec::new();
        // Every GPU NVML listed this time, whether it answered or not.
        let mut listed = HashSet::new();
        for index in 0..count {
            let reading = self.read_one(index, own).and_then(|mut gpu| {
                self.watch_xids(index, &gpu.uuid);
                let mut problems = self.memory_health(index)?.problems();
                if let Some((xid, what)) = self.xids.seen.get(&gpu.uuid) {
                    problems.push(format!(
                        "it reported XID {xid} ({what}); reset it, then restart astraeusd"
                    ));
                }
                if !problems.is_empty() {
                    gpu.healthy = false;
                    gpu.problem = Some(problems.join("; "));
                }
                Ok(gpu)
            });
            match reading {
                Ok(gpu)
                    if self.opts.managed_elsewhere.contains(&gpu.uuid)
                        || !self.opts.claims.may_manage(&gpu.uuid) =>
                {
                    self.last.remove(&gpu.uuid);
                }
                Ok(gpu) => {
                    listed.insert(gpu.uuid.clone());
                    self.noted.remove(&(index, "gone"));
                    if self.failures.remove(&index).is_some() {
                        tracing::info!(gpu = index, "GPU {index} answers NVML again");
                    }
                    self.uuid_at.insert(index, gpu.uuid.clone());
                    self.last.insert(gpu.uuid.clone(), gpu.clone());
                    gpus.push(gpu);
                }
                Err(why) => {
                    let n = self.failures.entry(index).or_insert(0);
                    *n += 1;
                    tracing::warn!(gpu = index, "NVML query failed ({n} in a row): {why}");
                    // Keep the GPU listed with its last reading, so its workers
                    // stay in view; after a few failures it is unhealthy.
                    listed.extend(self.uuid_at.get(&index).cloned());
                    let last = self.uuid_at.get(&index).and_then(|u| self.last.get(u));
                    if let Some(mut gpu) = last.cloned() {
                        if *n >= FAILURES_BEFORE_UNHEALTHY {
                            gpu.healthy = false;
                            gpu.problem = Some(format!("its NVML queries keep failing ({why})"));
                        }
                        gpus.push(gpu);
                    }
                }
            }
        }
        // A GPU NVML no longer lists (fallen off the bus, or the driver lost
        // it) stays in view, unhealthy, so its workers are not orphaned
        // silently; it comes back when it is listed again.
        let mut gone: Vec<Gpu> = self
            .last
            .values()
            .filter(|g| !listed.contains(&g.uuid))
            .cloned()
            .collect();
        gone.sort_by_key(|g| g.index);
        for mut gpu in gone {
            if self.noted.insert((gpu.index, "gone")) {
                tracing::error!(
                    gpu = gpu.index,
                    "GPU {} ({}) is no longer listed by NVML",
                    gpu.index,
                    gpu.uuid
                );
            }
            gpu.healthy = false;
            gpu.problem = Some("NVML no longer lists it (fallen off the bus?)".into());
            gpus.push(gpu);
        }
        // MIG instances after every GPU listed or kept, in their parents'
        // order; not remembered as GPUs are (a MIG layout changed goes
        // with its instances, and their workers are told they are gone).
        let mut next = gpus.iter().map(|g| g.index + 1).max().unwrap_or(0);
        let parents: Vec<Gpu> = gpus
            .iter()
            .filter(|g| g.mig == crate::placement::Mig::On && listed.contains(&g.uuid))
            .cloned()
            .collect();
        for parent in parents {
            for mut instance in self.mig_instances(&parent, own) {
                instance.index = next;
                next += 1;
                gpus.push(instance);
            }
        }
        let (cpu_cores, memory_bytes) = host_resources();
        Ok(Machine {
            name: self.opts.machine.clone(),
            wsl: self.opts.wsl,
            cpu_cores,
            memory_bytes,
            gpus,
            driver: self.nvml.sys_driver_version().unwrap_or_default(),
        })
    }
}

/// The processes using a GPU (or a MIG instance) and their memory; None
/// when the driver gives no per-process readings.
fn processes_on(d: &Device) -> Option<Vec<ProcessUse>> {
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
    processes
}

/// What the workers' own processes use on a device (pid, bytes); None
/// without per-process readings.
fn own_use(processes: Option<&[ProcessUse]>, mine: &super::OwnOn) -> Option<Vec<(u32, u64)>> {
    processes.map(|procs| {
        procs
            .iter()
            .filter(|p| mine.pids.contains(&p.pid))
            .filter_map(|p| p.bytes.map(|b| (p.pid, b)))
            .collect()
    })
}

/// `Xorg, user gdm` for a pid, as far as /proc tells. Another user names
/// their own process: its name is made printable before it goes anywhere.
/// Name and user are read from one open of its /proc directory: a pid
/// taken by another process between two reads cannot pair one's name
/// with the other's user.
fn describe_pid(pid: u32) -> String {
    match crate::auth::process(pid) {
        Some(p) => {
            let user = crate::auth::user_name_or_uid(p.uid);
            let (name, user) = (
                crate::text::printable(&p.name),
                crate::text::printable(&user),
            );
            format!("{name}, user {user}")
        }
        None => "unknown".into(),
    }
}
