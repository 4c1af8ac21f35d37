//! Where the GPU inventory comes from, behind one small trait: the simulated
//! machine (`--sim`) here; NVML through nvml-wrapper joins it as another source.

pub mod sim;

use crate::error::Result;
use crate::placement::Machine;
use crate::quantity::Amount;

/// Reads the machine as it is now. Called at start and on every refresh.
pub trait GpuSource: Send {
    fn read(&mut self) -> Result<Machine>;
    /// Whether the source changed since the last read (cheap; e.g. a file's mtime).
    fn changed(&mut self) -> bool {
        false
    }
}

/// The host's CPU cores and memory, promised to workers alongside GPUs.
pub fn host_resources() -> (Amount, u64) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let mem_kib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .unwrap_or(0);
    (Amount::whole(cores), mem_kib * 1024)
}
