//! GPU memory limits the driver or the kernel holds, per control group
//! (#53): NVML's calls of driver r615 (`nvmlDeviceSetMemoryLimits_v1`,
//! `nvmlDeviceGetMemoryLimits_v1`, looked up by name in the driver's
//! library, since nvml-wrapper 0.13 has neither), or the kernel's `dmem`
//! controller where NVML lacks them. A worker's share is `held` only when
//! its limits were set **and read back** on every GPU it holds; anything
//! else is `promised`, with why (docs/sharing.md, "When a share is held").

use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::path::{Path, PathBuf};

pub use crate::memory_limits::{
    Enforcement, GpuId, Hold, Limits, MemoryLimits, Reading, Unable, NO_LIMIT,
};

/// Where control groups are and which hierarchy accounts memory: the
/// `memory` controller's on a v1 or hybrid host, else the unified one.
/// Read from this process's own `/proc/self/cgroup` (what the kernel
/// answers), not guessed from what is mounted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cgroups {
    pub root: PathBuf,
    pub v1_memory: bool,
}

impl Cgroups {
    pub fn of_this_host(root: PathBuf) -> Cgroups {
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let v1_memory = own.lines().any(|line| {
            line.split(':')
                .nth(1)
                .is_some_and(|c| c.split(',').any(|c| c == "memory"))
        });
        Cgroups { root, v1_memory }
    }

    /// The directory of the control group `cgroup` (a path below the root)
    /// in the hierarchy that accounts memory: None for the root itself or
    /// a path that climbs out.
    pub fn dir(&self, cgroup: &str) -> Option<PathBuf> {
        let rel = cgroup.trim_start_matches('/');
        if rel.is_empty() || rel.split('/').any(|p| p == ".." || p == ".") {
            return None;
        }
        let base = if self.v1_memory {
            self.root.join("memory")
        } else {
            self.root.clone()
        };
        Some(base.join(rel))
    }
}

// NVML's return codes met here.
const NVML_SUCCESS: c_int = 0;
const NVML_ERROR_NOT_SUPPORTED: c_int = 3;
const NVML_ERROR_NO_PERMISSION: c_int = 4;
const NVML_ERROR_NOT_FOUND: c_int = 6;
const NVML_ERROR_GPU_IS_LOST: c_int = 15;

/// nvidia-ml-py 13.615's `c_nvmlSetMemoryLimits_v1_t`.
#[repr(C)]
struct SetLimitsV1 {
    name_space: *const c_char,
    soft_limit: u64,
    hard_limit: u64,
}

/// nvidia-ml-py 13.615's `c_nvmlGetMemoryLimits_v1_t`.
#[repr(C)]
struct GetLimitsV1 {
    name_space: *const c_char,
    soft_limit: u64,
    hard_limit: u64,
    current_used: u64,
}

type Device = *mut c_void;
type HandleByUuid = unsafe extern "C" fn(*const c_char, *mut Device) -> c_int;
type SetFn = unsafe extern "C" fn(Device, *mut SetLimitsV1) -> c_int;
type GetFn = unsafe extern "C" fn(Device, *mut GetLimitsV1) -> c_int;
type ErrorString = unsafe extern "C" fn(c_int) -> *const c_char;

/// The r615 calls, found in the driver's library; `calls` None on an
/// older driver (the reason then names its version).
pub struct NvmlLimits {
    // Kept open for the function pointers below; NVML's init is counted
    // and balanced by `Drop`.
    lib: libloading::Library,
    handle_by_uuid: HandleByUuid,
    error_string: ErrorString,
    calls: Option<(SetFn, GetFn)>,
    driver: String,
    cgroups: Cgroups,
}

// SAFETY: NVML is thread-safe (its documentation: "all NVML calls are
// thread-safe"); the struct holds only the library and plain fn pointers.
unsafe impl Send for NvmlLimits {}
unsafe impl Sync for NvmlLimits {}

impl NvmlLimits {
    /// Opens the driver's library at `path` (the one the inventory loaded).
    pub fn open(path: &Path, cgroups: Cgroups) -> Result<NvmlLimits, String> {
        // SAFETY: loading the NVIDIA driver's library runs its initialisers,
        // as nvml-wrapper's own load of the same file already did.
        let lib = unsafe { libloading::Library::new(path) }
            .map_err(|e| format!("{}: {e}", path.display()))?;
        // SAFETY: each symbol is looked up with NVML's documented signature.
        unsafe {
            let init: libloading::Symbol<unsafe extern "C" fn() -> c_int> = lib
                .get(b"nvmlInit_v2\0")
                .map_err(|e| format!("nvmlInit_v2: {e}"))?;
            let rc = init();
            if rc != NVML_SUCCESS {
                return Err(format!("nvmlInit_v2 answered {rc}"));
            }
            let needed = lib
                .get::<HandleByUuid>(b"nvmlDeviceGetHandleByUUID\0")
                .map(|f| *f)
                .and_then(|h| {
                    lib.get::<ErrorString>(b"nvmlErrorString\0")
                        .map(|f| (h, *f))
                });
            let (handle_by_uuid, error_string) = match needed {
                Ok(both) => both,
                Err(e) => {
                    // Balanced here: no NvmlLimits is made to drop.
                    let shutdown = lib.get::<unsafe extern "C" fn() -> c_int>(b"nvmlShutdown\0");
                    if let Ok(shutdown) = shutdown {
                        shutdown();
                    }
                    return Err(format!("the driver's library lacks a call: {e}"));
                }
            };
            let set = lib.get::<SetFn>(b"nvmlDeviceSetMemoryLimits_v1\0").ok();
            let get = lib.get::<GetFn>(b"nvmlDeviceGetMemoryLimits_v1\0").ok();
            let calls = set.zip(get).map(|(s, g)| (*s, *g));
            let mut version = [0 as c_char; 96];
            let driver = match lib.get::<unsafe extern "C" fn(*mut c_char, c_uint) -> c_int>(
                b"nvmlSystemGetDriverVersion\0",
            ) {
                Ok(f) if f(version.as_mut_ptr(), version.len() as c_uint) == NVML_SUCCESS => {
                    std::ffi::CStr::from_ptr(version.as_ptr())
                        .to_string_lossy()
                        .into_owned()
                }
                _ => "of unknown version".into(),
            };
            Ok(NvmlLimits {
                lib,
                handle_by_uuid,
                error_string,
                calls,
                driver,
                cgroups,
            })
        }
    }

    fn words(&self, rc: c_int, dir: &Path) -> String {
        match rc {
            NVML_ERROR_NOT_SUPPORTED => {
                format!(
                    "driver {} does not support memory limits on it",
                    self.driver
                )
            }
            NVML_ERROR_NO_PERMISSION => "not permitted (NVML's memory limits need root)".into(),
            NVML_ERROR_NOT_FOUND => format!("no control group at {}", dir.display()),
            NVML_ERROR_GPU_IS_LOST => "the GPU is lost".into(),
            _ => {
                // SAFETY: nvmlErrorString returns a static string for any code.
                let s = unsafe { std::ffi::CStr::from_ptr((self.error_string)(rc)) };
                format!("NVML error {rc} ({})", s.to_string_lossy())
            }
        }
    }

    fn device(&self, gpu: &GpuId) -> Result<Device, String> {
        let uuid = CString::new(gpu.uuid.as_str()).map_err(|_| "a UUID with a NUL".to_string())?;
        let mut device: Device = std::ptr::null_mut();
        // SAFETY: a NUL-terminated UUID and a place for the handle.
        let rc = unsafe { (self.handle_by_uuid)(uuid.as_ptr(), &mut device) };
        match rc {
            NVML_SUCCESS => Ok(device),
            NVML_ERROR_NOT_FOUND => Err(format!("NVML lists no GPU {}", gpu.uuid)),
            rc => Err(format!(
                "NVML does not find it ({})",
                self.words(rc, Path::new(""))
            )),
        }
    }

    fn prepare(
        &self,
        gpu: &GpuId,
        cgroup: &str,
    ) -> Result<(SetFn, GetFn, Device, CString, PathBuf), String> {
        let (set, get) = self.calls.ok_or_else(|| self.too_old())?;
        let dir = self
            .cgroups
            .dir(cgroup)
            .ok_or_else(|| format!("{cgroup} is not a control group of its own"))?;
        let name = CString::new(dir.as_os_str().as_encoded_bytes())
            .map_err(|_| "a control group path with a NUL".to_string())?;
        Ok((set, get, self.device(gpu)?, name, dir))
    }

    fn too_old(&self) -> String {
        format!("driver {} has no memory limits (r615+)", self.driver)
    }
}

impl MemoryLimits for NvmlLimits {
    fn set(&self, gpu: &GpuId, cgroup: &str, limits: Limits) -> Result<(), String> {
        let (set, _, device, name, dir) = self.prepare(gpu, cgroup)?;
        let mut arg = SetLimitsV1 {
            name_space: name.as_ptr(),
            soft_limit: limits.soft,
            hard_limit: limits.hard,
        };
        // SAFETY: the layout of nvidia-ml-py's c_nvmlSetMemoryLimits_v1_t
        // (checked against it by tests/held_shares.rs); `name` outlives the call.
        match unsafe { set(device, &mut arg) } {
            NVML_SUCCESS => Ok(()),
            rc => Err(self.words(rc, &dir)),
        }
    }

    fn get(&self, gpu: &GpuId, cgroup: &str) -> Result<Reading, String> {
        let (_, get, device, name, dir) = self.prepare(gpu, cgroup)?;
        match read_limits(get, device, &name) {
            (NVML_SUCCESS, arg) => Ok(Reading {
                limits: Limits {
                    soft: arg.soft_limit,
                    hard: arg.hard_limit,
                },
                used: Some(arg.current_used),
            }),
            (rc, _) => Err(self.words(rc, &dir)),
        }
    }

    fn can_hold(&self, gpu: &GpuId) -> Result<&'static str, String> {
        let (_, get) = self.calls.ok_or_else(|| self.too_old())?;
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return Err(self.words(NVML_ERROR_NO_PERMISSION, Path::new("")));
        }
        let device = self.device(gpu)?;
        // The GPU's own word (#66: a GPU whose limit calls answer
        // NOT_SUPPORTED or NO_PERMISSION read "held" regardless): the
        // limits at the control groups' root read; "none there" is a yes.
        let root = &self.cgroups.root;
        let name = CString::new(root.as_os_str().as_encoded_bytes())
            .map_err(|_| "a control group path with a NUL".to_string())?;
        match read_limits(get, device, &name).0 {
            rc @ (NVML_ERROR_NOT_SUPPORTED | NVML_ERROR_NO_PERMISSION | NVML_ERROR_GPU_IS_LOST) => {
                Err(self.words(rc, root))
            }
            _ => Ok("NVML memory limits"),
        }
    }
}

/// One nvmlDeviceGetMemoryLimits_v1 call for the group named `name`: its
/// return code and what it filled in.
fn read_limits(get: GetFn, device: Device, name: &CString) -> (c_int, GetLimitsV1) {
    let mut arg = GetLimitsV1 {
        name_space: name.as_ptr(),
        soft_limit: 0,
        hard_limit: 0,
        current_used: 0,
    };
    // SAFETY: the layout of nvidia-ml-py's c_nvmlGetMemoryLimits_v1_t
    // (checked against it by tests/held_shares.rs); `name` outlives the call.
    let rc = unsafe { get(device, &mut arg) };
    (rc, arg)
}

impl Drop for NvmlLimits {
    fn drop(&mut self) {
        // SAFETY: balances the nvmlInit_v2 of `open`.
        if let Ok(shutdown) = unsafe {
            self.lib
                .get::<unsafe extern "C" fn() -> c_int>(b"nvmlShutdown\0")
        } {
            unsafe { shutdown() };
        }
    }
}

/// The kernel's dmem controller (6.14+): `dmem.capacity` at the root lists
/// each device region (`nvidia/0000:01:00.0/vidmem SIZE`), and a control
/// group's `dmem.min` (soft) and `dmem.max` (hard) take `REGION BYTES`
/// lines. Only on the unified hierarchy.
pub struct DmemLimits {
    pub root: PathBuf,
}

impl DmemLimits {
    /// The region of the GPU's video memory, when the kernel lists one.
    fn region(&self, gpu: &GpuId) -> Option<String> {
        let capacity = std::fs::read_to_string(self.root.join("dmem.capacity")).ok()?;
        // NVML's bus id has an 8-digit domain; the kernel's a 4-digit one.
        let pci = gpu.pci.to_ascii_lowercase();
        let short = pci.get(pci.len().saturating_sub(12)..).unwrap_or(&pci);
        capacity.lines().find_map(|line| {
            let region = line.split_whitespace().next()?;
            let mut parts = region.split('/');
            let (_, dev, _) = (parts.next()?, parts.next()?, parts.next()?);
            (dev.eq_ignore_ascii_case(short) && region.ends_with("/vidmem"))
                .then(|| region.to_string())
        })
    }

    fn dir(&self, cgroup: &str) -> Result<PathBuf, String> {
        let dir = Cgroups {
            root: self.root.clone(),
            v1_memory: false,
        }
        .dir(cgroup)
        .ok_or_else(|| format!("{cgroup} is not a control group of its own"))?;
        if dir.is_dir() {
            Ok(dir)
        } else {
            Err(format!("no control group at {}", dir.display()))
        }
    }

    /// One region's value in a `dmem.*` file (`max` is no limit).
    fn value(dir: &Path, file: &str, region: &str) -> Result<u64, String> {
        let path = dir.join(file);
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let line = text
            .lines()
            .find(|l| l.split_whitespace().next() == Some(region))
            .ok_or_else(|| format!("{} lists no {region}", path.display()))?;
        match line.split_whitespace().nth(1) {
            Some("max") => Ok(NO_LIMIT),
            Some(n) => n
                .parse()
                .map_err(|_| format!("{}: {line:?} is no size", path.display())),
            None => Err(format!("{}: {line:?} is no size", path.display())),
        }
    }
}

impl MemoryLimits for DmemLimits {
    fn set(&self, gpu: &GpuId, cgroup: &str, limits: Limits) -> Result<(), String> {
        let region = self.region(gpu).ok_or_else(|| self.no_region())?;
        let dir = self.dir(cgroup)?;
        let write = |file: &str, n: u64| {
            let value = if n == NO_LIMIT {
                "max".to_string()
            } else {
                n.to_string()
            };
            let path = dir.join(file);
            std::fs::write(&path, format!("{region} {value}\n")).map_err(|e| match e.kind() {
                std::io::ErrorKind::PermissionDenied => {
                    format!("not permitted to write {}", path.display())
                }
                // The packaged system unit's ProtectControlGroups=yes.
                std::io::ErrorKind::ReadOnlyFilesystem => format!(
                    "{} is on a read-only mount (a unit with ProtectControlGroups=yes: \
                     allow it with ReadWritePaths=/sys/fs/cgroup in a drop-in)",
                    path.display()
                ),
                _ => format!("{}: {e}", path.display()),
            })
        };
        // The hard limit first when it falls, so soft never exceeds it.
        write("dmem.max", limits.hard)?;
        write("dmem.min", limits.soft)
    }

    fn get(&self, gpu: &GpuId, cgroup: &str) -> Result<Reading, String> {
        let region = self.region(gpu).ok_or_else(|| self.no_region())?;
        let dir = self.dir(cgroup)?;
        Ok(Reading {
            limits: Limits {
                soft: Self::value(&dir, "dmem.min", &region)?,
                hard: Self::value(&dir, "dmem.max", &region)?,
            },
            used: Self::value(&dir, "dmem.current", &region).ok(),
        })
    }

    fn can_hold(&self, gpu: &GpuId) -> Result<&'static str, String> {
        self.region(gpu)
            .map(|_| "the kernel's dmem controller")
            .ok_or_else(|| self.no_region())
    }
}

impl DmemLimits {
    fn no_region(&self) -> String {
        format!(
            "the kernel's dmem controller lists no region for it ({})",
            self.root.join("dmem.capacity").display()
        )
    }
}

/// NVML where the driver has the r615 calls, else dmem where the kernel
/// lists the GPU's region, else nothing (NVML's reason, naming the driver).
pub struct HostLimits {
    pub nvml: Option<NvmlLimits>,
    pub dmem: DmemLimits,
    /// Why there is no NVML backend at all (its library failed to open).
    pub nvml_missing: String,
}

impl HostLimits {
    fn pick(&self, gpu: &GpuId) -> Result<&dyn MemoryLimits, String> {
        let nvml_why = match &self.nvml {
            Some(n) => match n.can_hold(gpu) {
                Ok(_) => return Ok(n),
                Err(why) => why,
            },
            None => self.nvml_missing.clone(),
        };
        match self.dmem.can_hold(gpu) {
            Ok(_) => Ok(&self.dmem),
            Err(_) => Err(nvml_why),
        }
    }
}

impl MemoryLimits for HostLimits {
    fn set(&self, gpu: &GpuId, cgroup: &str, limits: Limits) -> Result<(), String> {
        self.pick(gpu)?.set(gpu, cgroup, limits)
    }
    fn get(&self, gpu: &GpuId, cgroup: &str) -> Result<Reading, String> {
        self.pick(gpu)?.get(gpu, cgroup)
    }
    fn can_hold(&self, gpu: &GpuId) -> Result<&'static str, String> {
        self.pick(gpu)?.can_hold(gpu)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn l4() -> GpuId {
        GpuId {
            uuid: "GPU-a".into(),
            pci: "00000000:01:00.0".into(),
        }
    }

    /// A dmem tree as a 6.14 kernel lays it out: the region listed at the
    /// root, a worker's group with the controller's files.
    fn dmem_tree() -> (tempdir::Dir, DmemLimits) {
        let root = tempdir::Dir::new();
        std::fs::write(
            root.0.join("dmem.capacity"),
            "drm/0000:03:00.0/vram0 8589934592\nnvidia/0000:01:00.0/vidmem 25769803776\n",
        )
        .unwrap();
        let group = root.0.join("system.slice/w.scope");
        std::fs::create_dir_all(&group).unwrap();
        let region = "nvidia/0000:01:00.0/vidmem";
        std::fs::write(
            group.join("dmem.min"),
            format!("drm/0000:03:00.0/vram0 0\n{region} 0\n"),
        )
        .unwrap();
        std::fs::write(
            group.join("dmem.max"),
            format!("drm/0000:03:00.0/vram0 max\n{region} max\n"),
        )
        .unwrap();
        std::fs::write(group.join("dmem.current"), format!("{region} 1048576\n")).unwrap();
        let dmem = DmemLimits {
            root: root.0.clone(),
        };
        (root, dmem)
    }

    mod tempdir {
        pub struct Dir(pub std::path::PathBuf);
        impl Dir {
            pub fn new() -> Dir {
                static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
                let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let p =
                    std::env::temp_dir().join(format!("astraeus-dmem-{}-{n}", std::process::id()));
                let _ = std::fs::remove_dir_all(&p);
                std::fs::create_dir_all(&p).unwrap();
                Dir(p)
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    #[test]
    fn dmem_writes_the_gpus_region_and_reads_it_back() {
        let (root, dmem) = dmem_tree();
        let want = Limits {
            soft: 2 << 30,
            hard: 3 << 30,
        };
        dmem.set(&l4(), "/system.slice/w.scope", want).unwrap();
        // What the kernel got: one line per file, the GPU's region only.
        let group = root.0.join("system.slice/w.scope");
        assert_eq!(
            std::fs::read_to_string(group.join("dmem.max")).unwrap(),
            format!("nvidia/0000:01:00.0/vidmem {}\n", 3u64 << 30)
        );
        assert_eq!(
            std::fs::read_to_string(group.join("dmem.min")).unwrap(),
            format!("nvidia/0000:01:00.0/vidmem {}\n", 2u64 << 30)
        );
        let r = dmem.get(&l4(), "/system.slice/w.scope").unwrap();
        assert_eq!(
            r,
            Reading {
                limits: want,
                used: Some(1 << 20)
            }
        );
        // Cleared: `max` written, read as no limit.
        dmem.set(&l4(), "/system.slice/w.scope", Limits::NONE)
            .unwrap();
        assert!(std::fs::read_to_string(group.join("dmem.max"))
            .unwrap()
            .ends_with(" max\n"));
        assert_eq!(
            dmem.get(&l4(), "/system.slice/w.scope").unwrap().limits,
            Limits::NONE
        );
    }

    #[test]
    fn dmem_refuses_a_gpu_it_lists_no_region_for_and_a_missing_group() {
        let (_root, dmem) = dmem_tree();
        let other = GpuId {
            uuid: "GPU-b".into(),
            pci: "00000000:02:00.0".into(),
        };
        let why = dmem.can_hold(&other).unwrap_err();
        assert!(why.contains("lists no region"), "{why}");
        assert!(dmem.can_hold(&l4()).is_ok());
        let why = dmem.set(&l4(), "/gone.scope", Limits::NONE).unwrap_err();
        assert!(why.starts_with("no control group at "), "{why}");
        assert!(
            dmem.set(&l4(), "/", Limits::NONE).is_err(),
            "the root is no worker's"
        );
        assert!(dmem.set(&l4(), "/../etc", Limits::NONE).is_err());
    }

    /// A backend that answers set but reads back what it likes.
    struct Liar(Limits);
    impl MemoryLimits for Liar {
        fn set(&self, _: &GpuId, _: &str, _: Limits) -> Result<(), String> {
            Ok(())
        }
        fn get(&self, _: &GpuId, _: &str) -> Result<Reading, String> {
            Ok(Reading {
                limits: self.0,
                used: None,
            })
        }
        fn can_hold(&self, _: &GpuId) -> Result<&'static str, String> {
            Ok("a liar")
        }
    }

    #[test]
    fn held_only_when_what_is_read_back_is_what_was_set() {
        let want = Limits {
            soft: 1 << 30,
            hard: 1 << 30,
        };
        let hold = |answer| Hold {
            backend: Arc::new(Liar(answer)),
            gpus: vec![(0, l4(), want)],
        };
        assert_eq!(hold(want).apply("/w"), Enforcement::Held);
        let off = Limits {
            soft: (1 << 30) + 1,
            hard: 1 << 30,
        };
        let e = hold(off).apply("/w");
        assert!(
            matches!(&e, Enforcement::Promised(why) if why.starts_with("GPU 0: the limits read back")),
            "{e}"
        );
        let unable = Hold {
            backend: Arc::new(Unable("simulated GPU".into())),
            gpus: vec![(1, l4(), want)],
        };
        assert_eq!(
            unable.apply("/w").to_string(),
            "promised: GPU 1: simulated GPU"
        );
    }

    #[test]
    fn the_memory_hierarchy_is_chosen_by_what_the_kernel_says() {
        let v1 = Cgroups {
            root: "/sys/fs/cgroup".into(),
            v1_memory: true,
        };
        let v2 = Cgroups {
            root: "/sys/fs/cgroup".into(),
            v1_memory: false,
        };
        assert_eq!(
            v1.dir("/machine.slice/x.scope").unwrap(),
            Path::new("/sys/fs/cgroup/memory/machine.slice/x.scope")
        );
        assert_eq!(
            v2.dir("/machine.slice/x.scope").unwrap(),
            Path::new("/sys/fs/cgroup/machine.slice/x.scope")
        );
        assert_eq!(v2.dir("/"), None);
        assert_eq!(v2.dir("/a/../b"), None);
    }
}
