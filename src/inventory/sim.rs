//! The simulated machine: GPUs described in a TOML file (design.md's format),
//! or the seed's `majin` built in. For people trying the daemon without a GPU.

use super::{GpuSource, Own};
use crate::error::{Error, Result};
use crate::placement::{Gpu, Machine};
use crate::quantity::Amount;
use serde::Deserialize;
use std::path::PathBuf;
use std::time::SystemTime;

/// The seed's machine: one RTX 4060 with 8 GB, 1 GB held by the desktop,
/// and a fixed host (16 cores, 64 GB) so that it behaves the same on every
/// machine it is tried on.
pub const MAJIN: &str = r#"
machine = "majin"
cpu_cores = 16
memory_gb = 64
[[gpu]]
model = "NVIDIA GeForce RTX 4060"
uuid = "GPU-5c0a7d3e-4060-4b1e-9f00-000000000000"
total_gb = 8
outside_gb = 1
power_w = 60
"#;

/// A simulated host's CPU cores and memory when its file names none.
pub const DEFAULT_CORES: u32 = 16;
pub const DEFAULT_MEMORY_GB: u64 = 64;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SimFile {
    machine: String,
    #[serde(default)]
    wsl: bool,
    /// Host CPU cores and memory; [`DEFAULT_CORES`] and [`DEFAULT_MEMORY_GB`]
    /// when absent, never the real host's: a simulated machine behaves the
    /// same wherever it runs.
    cpu_cores: Option<u32>,
    memory_gb: Option<u64>,
    #[serde(default)]
    gpu: Vec<SimGpu>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SimGpu {
    model: String,
    #[serde(default = "nvidia")]
    vendor: String,
    uuid: Option<String>,
    total_gb: f64,
    #[serde(default)]
    outside_gb: f64,
    #[serde(default = "yes")]
    healthy: bool,
    /// Simulated draw in watts, for energy accounting.
    #[serde(default)]
    power_w: f64,
    /// Name of the time-slicing baseboard that owns this GPU, if any.
    baseboard: Option<String>,
    /// PCI address (VM workers take it as a hostdev); 0000:<index+1>:00.0 when unset.
    pci: Option<String>,
    /// MIG mode: "on" (split into MIG instances: never offered) or
    /// "pending" (on after its next reset); off when unset.
    mig: Option<SimMig>,
}

#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum SimMig {
    On,
    Pending,
}

/// One of a GPU's identities in the file (its UUID, its PCI address).
type IdOf = fn(&SimGpu) -> Option<&String>;

fn nvidia() -> String {
    "nvidia".into()
}
fn yes() -> bool {
    true
}

/// A GB figure from the file, to exact hundredths.
fn gb(path: &str, v: f64) -> Result<Amount> {
    let h = (v * 100.0).round();
    if !v.is_finite() || v < 0.0 || (v * 100.0 - h).abs() > 1e-6 || h > 1e12 {
        return Err(Error::field(
            path,
            "a number of GB, 0 or more, with at most 2 decimals",
        ));
    }
    Ok(Amount::from_hundredths(h as u64))
}

/// Parses a sim file's text into a machine.
pub fn parse(text: &str) -> Result<Machine> {
    let f: SimFile = toml::from_str(text).map_err(|e| {
        Error::InvalidRequest(format!("sim machine{}", crate::config::where_in(text, &e)))
    })?;
    crate::request::validate_name("machine", &f.machine)?;
    let mut gpus = Vec::new();
    for (i, g) in f.gpu.iter().enumerate() {
        let path = |k: &str| format!("gpu[{i}].{k}");
        let total = gb(&path("total_gb"), g.total_gb)?;
        let outside = gb(&path("outside_gb"), g.outside_gb)?;
        if outside > total {
            return Err(Error::field(&path("outside_gb"), "at most total_gb"));
        }
        if !(0.0..=10_000.0).contains(&g.power_w) {
            return Err(Error::field(&path("power_w"), "0 to 10000 watts"));
        }
        // Two GPUs by one name would be one GPU held twice.
        let ids: [(&str, IdOf); 2] = [("uuid", |g| g.uuid.as_ref()), ("pci", |g| g.pci.as_ref())];
        for (key, id) in ids {
            if let Some(v) = id(g).filter(|v| f.gpu[..i].iter().any(|e| id(e) == Some(*v))) {
                return Err(Error::field(
                    &path(key),
                    format!("{v} is another GPU's already"),
                ));
            }
        }
        gpus.push(Gpu {
            index: i as u32,
            uuid: g
                .uuid
                .clone()
                .unwrap_or_else(|| format!("GPU-sim-{}-{i}", f.machine)),
            model: g.model.clone(),
            vendor: g.vendor.to_lowercase(),
            total,
            outside,
            healthy: g.healthy,
            sliced: g.baseboard.is_some(),
            mig: match g.mig {
                None => crate::placement::Mig::Off,
                Some(SimMig::On) => crate::placement::Mig::On,
                Some(SimMig::Pending) => crate::placement::Mig::Pending,
            },
            problem: (!g.healthy).then(|| "marked unhealthy in the sim file".to_string()),
            power_mw: (g.power_w > 0.0).then_some((g.power_w * 1000.0) as u32),
            pci_bus_id: g
                .pci
                .clone()
                .unwrap_or_else(|| format!("00000000:{:02X}:00.0", i + 1)),
            share_limits: crate::machine::ShareLimits::Not("simulated GPU".into()),
            ..Gpu::default()
        });
    }
    Ok(Machine {
        name: f.machine,
        wsl: f.wsl,
        cpu_cores: Amount::whole(u64::from(f.cpu_cores.unwrap_or(DEFAULT_CORES))),
        memory_bytes: f
            .memory_gb
            .unwrap_or(DEFAULT_MEMORY_GB)
            .saturating_mul(crate::quantity::GB_BYTES),
        gpus,
        driver: String::new(),
    })
}

/// A sim machine read from a file (re-read when it changes), or the built-in one.
pub struct SimSource {
    path: Option<PathBuf>,
    seen: Option<SystemTime>,
}

impl SimSource {
    pub fn builtin() -> SimSource {
        SimSource {
            path: None,
            seen: None,
        }
    }
    pub fn file(path: PathBuf) -> SimSource {
        SimSource {
            path: Some(path),
            seen: None,
        }
    }
    fn mtime(&self) -> Option<SystemTime> {
        self.path
            .as_ref()
            .and_then(|p| std::fs::metadata(p).ok())
            .and_then(|m| m.modified().ok())
    }
}

impl GpuSource for SimSource {
    fn read(&mut self, _own: &Own) -> Result<Machine> {
        match &self.path {
            None => parse(MAJIN),
            Some(p) => {
                self.seen = self.mtime();
                let text = std::fs::read_to_string(p)
                    .map_err(|e| Error::Backend(format!("sim machine {}: {e}", p.display())))?;
                parse(&text)
            }
        }
    }

    fn changed(&mut self) -> bool {
        self.path.is_some() && self.mtime() != self.seen
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_is_the_seeds_majin() {
        let m = SimSource::builtin().read(&Own::default()).unwrap();
        assert_eq!(m.name, "majin");
        assert_eq!(m.gpus.len(), 1);
        let g = &m.gpus[0];
        assert_eq!(g.model, "NVIDIA GeForce RTX 4060");
        assert_eq!(g.total, Amount::whole(8));
        assert_eq!(g.offered(), Amount::whole(7));
        // A fixed host, whatever this machine has.
        assert_eq!(m.cpu_cores, Amount::whole(16));
        assert_eq!(m.memory_bytes, 64 * crate::quantity::GB_BYTES);
        let bare = parse("machine = \"m\"\n").unwrap();
        assert_eq!(bare.cpu_cores, Amount::whole(u64::from(DEFAULT_CORES)));
        assert_eq!(
            bare.memory_bytes,
            DEFAULT_MEMORY_GB * crate::quantity::GB_BYTES
        );
    }

    #[test]
    fn a_sim_gpu_may_be_in_mig_mode() {
        let m = parse(
            "machine = \"m\"\n[[gpu]]\nmodel = \"A100\"\ntotal_gb = 80\nmig = \"on\"\n\
             [[gpu]]\nmodel = \"A100\"\ntotal_gb = 80\nmig = \"pending\"\n\
             [[gpu]]\nmodel = \"L4\"\ntotal_gb = 24\n",
        )
        .unwrap();
        let modes: Vec<_> = m.gpus.iter().map(|g| g.mig).collect();
        use crate::placement::Mig;
        assert_eq!(modes, [Mig::On, Mig::Pending, Mig::Off]);
        let e = parse("machine = \"m\"\n[[gpu]]\nmodel = \"x\"\ntotal_gb = 8\nmig = \"yes\"\n")
            .unwrap_err();
        assert!(
            e.message().contains("on") && e.message().contains("pending"),
            "{}",
            e.message()
        );
    }

    #[test]
    fn bad_files_name_the_key() {
        let e = parse("machine = \"m\"\n[[gpu]]\nmodel = \"x\"\ntotal_gb = 8\noutside_gb = 9\n")
            .unwrap_err();
        assert_eq!(e.message(), "gpu[0].outside_gb: at most total_gb");
        let e = parse("machine = \"m\"\n[[gpu]]\nmodel = \"x\"\ntotal_gb = 8.125\n").unwrap_err();
        assert!(e.message().starts_with("gpu[0].total_gb: "));
        let e = parse("machine = \"m\"\ncolour = 1\n").unwrap_err();
        assert!(
            e.message().contains("line 2 (`colour = 1`): unknown field"),
            "{e}"
        );
        // One table where a list of them is meant: the line says where.
        let e = parse("machine = \"m\"\n[gpu]\nmodel = \"x\"\ntotal_gb = 8\n").unwrap_err();
        assert!(
            e.message().starts_with("sim machine, line 2 (`[gpu]`): "),
            "{e}"
        );
        let two = |a: &str, b: &str| {
            parse(&format!(
                "machine = \"m\"\n[[gpu]]\nmodel = \"x\"\ntotal_gb = 8\n{a}\n\
                 [[gpu]]\nmodel = \"x\"\ntotal_gb = 8\n{b}\n"
            ))
        };
        let e = two("uuid = \"GPU-same\"", "uuid = \"GPU-same\"").unwrap_err();
        assert_eq!(
            e.message(),
            "gpu[1].uuid: GPU-same is another GPU's already"
        );
        let e = two("pci = \"00000000:01:00.0\"", "pci = \"00000000:01:00.0\"").unwrap_err();
        assert_eq!(
            e.message(),
            "gpu[1].pci: 00000000:01:00.0 is another GPU's already"
        );
        assert!(two("uuid = \"GPU-a\"", "uuid = \"GPU-b\"").is_ok());
        for w in ["-50", "nan", "1e30"] {
            let e = two(&format!("power_w = {w}"), "").unwrap_err();
            assert_eq!(e.message(), "gpu[0].power_w: 0 to 10000 watts", "{w}");
        }
    }

    #[test]
    fn file_changes_are_seen() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.toml");
        std::fs::write(&p, MAJIN).unwrap();
        let mut s = SimSource::file(p.clone());
        assert!(s.changed());
        s.read(&Own::default()).unwrap();
        assert!(!s.changed());
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&p, MAJIN.replace("outside_gb = 1", "outside_gb = 2")).unwrap();
        let t = SystemTime::now() + std::time::Duration::from_secs(5);
        std::fs::File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .set_modified(t)
            .unwrap();
        assert!(s.changed());
        assert_eq!(
            s.read(&Own::default()).unwrap().gpus[0].outside,
            Amount::whole(2)
        );
    }
}
