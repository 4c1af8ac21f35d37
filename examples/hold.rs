//! Sets one control group's GPU memory limits as the daemon does for a
//! shared worker (inventory/limits.rs: NVML's r615 calls, else dmem), reads
//! them back and prints the enforcement a worker would get; with `clear`,
//! removes them. For scripts/gpu-check on a host with a real driver:
//!   cargo run --example hold -- LIBNVIDIA_ML CGROUP UUID PCI SHARE_BYTES
//!   cargo run --example hold -- LIBNVIDIA_ML CGROUP UUID PCI clear
//! CGROUP is a path below the cgroup root, as /proc/PID/cgroup names it.

use astraeusd::inventory::limits::{
    Cgroups, DmemLimits, GpuId, Hold, HostLimits, Limits, NvmlLimits,
};
use std::sync::Arc;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [lib, cgroup, uuid, pci, what] = &args[..] else {
        eprintln!("usage: hold LIBNVIDIA_ML CGROUP UUID PCI SHARE_BYTES|clear");
        std::process::exit(2);
    };
    let root = std::path::PathBuf::from("/sys/fs/cgroup");
    let (nvml, nvml_missing) = match NvmlLimits::open(
        std::path::Path::new(lib),
        Cgroups::of_this_host(root.clone()),
    ) {
        Ok(n) => (Some(n), String::new()),
        Err(e) => (None, e),
    };
    let backend = HostLimits {
        nvml,
        dmem: DmemLimits { root },
        nvml_missing,
    };
    let gpu = GpuId {
        uuid: uuid.clone(),
        pci: pci.clone(),
    };
    let share = if what == "clear" {
        0
    } else {
        what.parse().expect("SHARE_BYTES")
    };
    let hold = Hold {
        backend: Arc::new(backend),
        gpus: vec![(
            0,
            gpu,
            Limits {
                soft: share,
                hard: share,
            },
        )],
    };
    if what == "clear" {
        hold.clear(cgroup);
        println!("cleared");
    } else {
        println!("{}", hold.apply(cgroup));
    }
}
