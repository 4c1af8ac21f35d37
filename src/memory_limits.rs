//! GPU memory limits as the domain sees them (#53): the [`MemoryLimits`]
//! port the backends implement (NVML's r615 calls and the kernel's dmem
//! controller, in inventory/limits.rs), a worker's [`Hold`] (set, then read
//! back) and its [`Enforcement`]: `held` only when every GPU answered what
//! was set, else `promised` and why.

use std::sync::Arc;

/// NVML_DEVICE_MEMORY_LIMIT_MAX: no hard limit. Clearing is soft 0, hard this.
pub const NO_LIMIT: u64 = u64::MAX;

/// A control group's limits on one GPU, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Guaranteed: past it a client may be evicted under real pressure.
    pub soft: u64,
    /// An allocation past it fails with out-of-memory.
    pub hard: u64,
}

impl Limits {
    pub const NONE: Limits = Limits {
        soft: 0,
        hard: NO_LIMIT,
    };
}

/// What a backend reads back: the limits and, where it counts it, the
/// memory the control group uses on the GPU now (exact, per cgroup).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reading {
    pub limits: Limits,
    pub used: Option<u64>,
}

/// One GPU as the backends name it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuId {
    pub uuid: String,
    /// NVML's PCI bus id (`00000000:01:00.0`).
    pub pci: String,
}

/// Sets and reads a control group's GPU memory limits. `cgroup` is a path
/// below the cgroup root, as `/proc/PID/cgroup` or systemd names it; each
/// backend finds its directory. Errors are plain words for a reason.
pub trait MemoryLimits: Send + Sync {
    fn set(&self, gpu: &GpuId, cgroup: &str, limits: Limits) -> Result<(), String>;
    fn get(&self, gpu: &GpuId, cgroup: &str) -> Result<Reading, String>;
    /// Whether shares on this GPU can be held at all: how, or why not.
    fn can_hold(&self, gpu: &GpuId) -> Result<&'static str, String>;
}

/// A host where nothing can hold a share (simulated GPUs, WSL): every
/// share is promised, for this one reason.
pub struct Unable(pub String);

impl MemoryLimits for Unable {
    fn set(&self, _: &GpuId, _: &str, _: Limits) -> Result<(), String> {
        Err(self.0.clone())
    }
    fn get(&self, _: &GpuId, _: &str) -> Result<Reading, String> {
        Err(self.0.clone())
    }
    fn can_hold(&self, _: &GpuId) -> Result<&'static str, String> {
        Err(self.0.clone())
    }
}

/// Whether a share is held by the kernel or driver, or only promised.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Enforcement {
    Held,
    Promised(String),
}

impl std::fmt::Display for Enforcement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Enforcement::Held => f.write_str("held"),
            Enforcement::Promised(why) => write!(f, "promised: {why}"),
        }
    }
}

/// The limits one shared worker gets on each GPU it holds, and the backend
/// that sets them.
#[derive(Clone)]
pub struct Hold {
    pub backend: Arc<dyn MemoryLimits>,
    /// Each GPU it holds (its index for reasons) and the limits it gets there.
    pub gpus: Vec<(u32, GpuId, Limits)>,
}

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hold").field("gpus", &self.gpus).finish()
    }
}

impl Hold {
    /// Sets the limits on every GPU, then reads each back: held only when
    /// every GPU answers what was set. On any failure what was set is
    /// cleared again (a half-held worker is not held) and the reason names
    /// the GPU.
    pub fn apply(&self, cgroup: &str) -> Enforcement {
        for (index, gpu, want) in &self.gpus {
            let failed = |why: String| Enforcement::Promised(format!("GPU {index}: {why}"));
            if let Err(why) = self.backend.set(gpu, cgroup, *want) {
                self.clear(cgroup);
                return failed(why);
            }
            match self.backend.get(gpu, cgroup) {
                Ok(r) if r.limits == *want => {}
                Ok(r) => {
                    self.clear(cgroup);
                    return failed(format!(
                        "the limits read back (soft {}, hard {}) are not those set (soft {}, hard {})",
                        bytes(r.limits.soft),
                        bytes(r.limits.hard),
                        bytes(want.soft),
                        bytes(want.hard)
                    ));
                }
                Err(why) => {
                    self.clear(cgroup);
                    return failed(format!("the limits could not be read back: {why}"));
                }
            }
        }
        Enforcement::Held
    }

    /// Reads the limits back without setting them: held when every GPU
    /// still answers what is wanted (tests/held_shares.rs; the daemon's
    /// own checks read back through each reading, `Gpu::held_use`).
    pub fn check(&self, cgroup: &str) -> Enforcement {
        for (index, gpu, want) in &self.gpus {
            match self.backend.get(gpu, cgroup) {
                Ok(r) if r.limits == *want => {}
                Ok(_) => {
                    return Enforcement::Promised(format!("GPU {index}: its limits are not set"))
                }
                Err(why) => return Enforcement::Promised(format!("GPU {index}: {why}")),
            }
        }
        Enforcement::Held
    }

    /// Removes the limits (best effort: removing the cgroup clears them too).
    pub fn clear(&self, cgroup: &str) {
        for (_, gpu, _) in &self.gpus {
            let _ = self.backend.set(gpu, cgroup, Limits::NONE);
        }
    }
}

fn bytes(n: u64) -> String {
    if n == NO_LIMIT {
        "none".into()
    } else {
        format!("{n} bytes")
    }
}
