//! Shares the kernel holds (#53): NVML's r615 memory limits through the
//! fake libnvidia-ml, its ABI checked against NVIDIA's own Python binding
//! (nvidia-ml-py 13.615), and set on a real podman container's own
//! control group between init and start — before its command's first line.
//! (Unit workers under a real user manager: tests/units.sh.)

mod common;
#[path = "common/fake_nvml.rs"]
mod fake_nvml;
#[path = "common/podman.rs"]
mod podman;
use astraeusd::inventory::limits::{
    Cgroups, Enforcement, GpuId, Hold, Limits, MemoryLimits, NvmlLimits, NO_LIMIT,
};
use common::*;
use podman::{available, Podman, UUID};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

const GIB: u64 = 1 << 30;

fn l4() -> GpuId {
    GpuId {
        uuid: UUID.into(),
        pci: "00000000:01:00.0".into(),
    }
}

/// Held by a test that uses the fake in this process: the library reads
/// the fixture and limits file from the environment at each call, one pair
/// for the whole binary, so two tests on parallel threads rewrote them
/// under each other's calls ("NVML does not find it", #68).
static IN_PROCESS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// This test's turn at the in-process fake, for as long as it is held.
fn turn() -> std::sync::MutexGuard<'static, ()> {
    IN_PROCESS.lock().unwrap_or_else(|e| e.into_inner())
}

/// The fake's fixture and limits file for this process (the library reads
/// both from the environment at each call; one pair for the whole binary:
/// a test takes its [`turn`] first).
fn hardware(extra: &str) -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let dir =
            PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("held-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("cg/a")).unwrap();
        std::fs::create_dir_all(dir.join("cg/b")).unwrap();
        std::env::set_var("FAKE_NVML_FIXTURE", dir.join("gpus.txt"));
        std::env::set_var("FAKE_NVML_LIMITS", dir.join("limits.txt"));
        dir
    });
    let fx = dir.join("gpus.txt");
    fake_nvml::one_l4(&fx, UUID, 0, "");
    if !extra.is_empty() {
        let text = std::fs::read_to_string(&fx).unwrap();
        std::fs::write(
            &fx,
            text.replacen(" util=3", &format!(" util=3 {extra}"), 1),
        )
        .unwrap();
    }
    dir.clone()
}

fn nvml(lib: &Path, dir: &Path) -> NvmlLimits {
    let cgroups = Cgroups {
        root: dir.join("cg"),
        v1_memory: false,
    };
    NvmlLimits::open(lib, cgroups).unwrap()
}

/// nvidia-ml-py 13.615's pynvml.py, fetched once into cargo's folder for
/// tests' files (CI has the network apt-get uses); None, skipping, where
/// it cannot be had and components are not required.
fn pynvml() -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("pynvml-13.615.71");
    let wheel = dir.join("nvidia_ml_py-13.615.71-py3-none-any.whl");
    if !wheel.exists() {
        let _ = Command::new("python3")
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--quiet",
                "nvidia-ml-py==13.615.71",
                "-d",
            ])
            .arg(&dir)
            .status();
    }
    require_component(
        wheel.exists(),
        "nvidia-ml-py 13.615.71 (python3 -m pip download)",
    )
    .then_some(wheel)
}

/// Runs `script` with NVIDIA's binding pointed at the fake library (as
/// pynvml loads any libnvidia-ml); its stdout.
fn python(wheel: &Path, script: &str) -> String {
    let prelude = format!(
        "import ctypes, pynvml\npynvml.nvmlLib = ctypes.CDLL({:?})\npynvml.nvmlInit()\n\
         h = pynvml.nvmlDeviceGetHandleByIndex(0)\n",
        fake_nvml::fake_lib(false).display().to_string()
    );
    let o = Command::new("python3")
        .env("PYTHONPATH", wheel)
        .args(["-c", &(prelude + script)])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "python: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// Our layout against NVIDIA's: what pynvml sets, we read; what we set,
/// pynvml reads — soft, hard and the all-ones "no limit" alike.
#[test]
fn the_limits_layout_is_nvidias_own() {
    let Some(wheel) = pynvml() else { return };
    let _turn = turn();
    let dir = hardware("");
    let ours = nvml(&fake_nvml::fake_lib(false), &dir);
    let a = dir.join("cg/a");
    python(
        &wheel,
        &format!(
            "s = pynvml.c_nvmlSetMemoryLimits_v1_t(); s.nameSpace = {:?}.encode(); \
             s.softLimit = {}; s.hardLimit = {}\npynvml.nvmlDeviceSetMemoryLimits_v1(h, s)\n",
            a.display().to_string(),
            3 * GIB,
            5 * GIB
        ),
    );
    let r = ours.get(&l4(), "/a").unwrap();
    assert_eq!(
        r.limits,
        Limits {
            soft: 3 * GIB,
            hard: 5 * GIB
        }
    );
    assert_eq!(r.used, Some(0));

    ours.set(
        &l4(),
        "/b",
        Limits {
            soft: 7 * GIB,
            hard: NO_LIMIT,
        },
    )
    .unwrap();
    let read = python(
        &wheel,
        &format!(
            "g = pynvml.c_nvmlGetMemoryLimits_v1_t(); g.nameSpace = {:?}.encode()\n\
             pynvml.nvmlDeviceGetMemoryLimits_v1(h, g)\n\
             print(g.softLimit, g.hardLimit == pynvml.NVML_DEVICE_MEMORY_LIMIT_MAX, g.currentUsed)\n",
            dir.join("cg/b").display().to_string()
        ),
    );
    assert_eq!(read.trim(), format!("{} True 0", 7 * GIB));
    // Cleared by us (soft 0, hard MAX): pynvml reads no limit.
    ours.set(&l4(), "/b", Limits::NONE).unwrap();
    let read = python(
        &wheel,
        &format!(
            "g = pynvml.c_nvmlGetMemoryLimits_v1_t(); g.nameSpace = {:?}.encode()\n\
             pynvml.nvmlDeviceGetMemoryLimits_v1(h, g)\n\
             print(g.softLimit, g.hardLimit == pynvml.NVML_DEVICE_MEMORY_LIMIT_MAX)\n",
            dir.join("cg/b").display().to_string()
        ),
    );
    assert_eq!(read.trim(), "0 True");
}

/// Held only when set and read back; every other answer a driver gives is
/// promised, in words.
#[test]
fn what_each_driver_answers_is_held_or_promised_in_words() {
    let _turn = turn();
    let dir = hardware("");
    let want = Limits {
        soft: 2 * GIB,
        hard: 2 * GIB,
    };
    let hold = |backend: NvmlLimits| Hold {
        backend: Arc::new(backend),
        gpus: vec![(0, l4(), want)],
    };
    let promised = |e: Enforcement| match e {
        Enforcement::Promised(why) => why,
        Enforcement::Held => panic!("held"),
    };
    let full = || nvml(&fake_nvml::fake_lib(false), &dir);
    assert_eq!(hold(full()).apply("/a"), Enforcement::Held);
    assert_eq!(full().get(&l4(), "/a").unwrap().limits, want);
    assert_eq!(hold(full()).check("/a"), Enforcement::Held);

    // No such control group: the driver's NOT_FOUND, named.
    let why = promised(hold(full()).apply("/gone"));
    assert_eq!(
        why,
        format!(
            "GPU 0: no control group at {}",
            dir.join("cg/gone").display()
        )
    );

    // The GPU itself says whether it can hold a share (its ShareLimits):
    // by its own limit calls' answer, not by the calls being there (#66).
    assert_eq!(full().can_hold(&l4()), Ok("NVML memory limits"));
    hardware("limits=notsup");
    let why = promised(hold(full()).apply("/a"));
    assert_eq!(
        why,
        "GPU 0: driver 999.99-fake does not support memory limits on it"
    );
    assert_eq!(
        full().can_hold(&l4()),
        Err("driver 999.99-fake does not support memory limits on it".to_string())
    );
    hardware("limits=noperm");
    let why = promised(hold(full()).apply("/a"));
    assert_eq!(why, "GPU 0: not permitted (NVML's memory limits need root)");
    assert_eq!(
        full().can_hold(&l4()),
        Err("not permitted (NVML's memory limits need root)".to_string())
    );
    // A driver that reads back other than it was told: not held, and what
    // was set is cleared again.
    hardware("limits=disagree");
    let why = promised(hold(full()).apply("/b"));
    assert!(
        why.starts_with("GPU 0: the limits read back (soft 2147483649 bytes"),
        "{why}"
    );
    hardware("");
    assert_eq!(full().get(&l4(), "/b").unwrap().limits, Limits::NONE);
    // Restored after a GPU reset lost them: check says so.
    full().set(&l4(), "/a", Limits::NONE).unwrap();
    assert_eq!(
        promised(hold(full()).check("/a")),
        "GPU 0: its limits are not set"
    );

    // An older driver: the symbols are absent.
    let old = nvml(&fake_nvml::fake_lib(true), &dir);
    assert_eq!(
        old.can_hold(&l4()).unwrap_err(),
        "driver 999.99-fake has no memory limits (r615+)"
    );
    assert_eq!(
        promised(hold(old).apply("/a")),
        "GPU 0: driver 999.99-fake has no memory limits (r615+)"
    );
}

/// The limits file as the fake keeps it: (uuid, soft, hard, dir) lines.
fn limits_in(file: &Path) -> Vec<(String, u64, u64, String)> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut p = l.splitn(4, ' ');
            Some((
                p.next()?.to_string(),
                p.next()?.parse().ok()?,
                p.next()?.parse().ok()?,
                p.next()?.to_string(),
            ))
        })
        .collect()
}

/// The memory controller's directory of a process (this host is v1 hybrid;
/// on a v2 host the unified one).
fn memory_dir(pid: &str) -> PathBuf {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let path = astraeusd::runtime::cgroup_of(&text).unwrap();
    let cg = Cgroups::of_this_host("/sys/fs/cgroup".into());
    cg.dir(&path).unwrap()
}

fn worker_prop(a: &str, name: &str, prop: &str) -> String {
    busctl(
        a,
        &[
            "get-property",
            "org.astraeus.Node1",
            &format!("/org/astraeus/Node1/worker/{name}"),
            "org.astraeus.Node1.Worker",
            prop,
        ],
    )
    .stdout
}

fn start(bus: &Bus, dir: &Path, pm: &Podman, lib: &Path, extra: &str) -> Daemon {
    start_env(bus, dir, pm, lib, extra, &[])
}

/// [`start`] with more of the daemon's environment.
fn start_env(
    bus: &Bus,
    dir: &Path,
    pm: &Podman,
    lib: &Path,
    extra: &str,
    more: &[(&str, &str)],
) -> Daemon {
    std::fs::write(
        dir.join("node.toml"),
        format!(
            "machine = \"majin\"\n[inventory]\nrefresh_seconds = 0.5\nwsl = false\nnvml_library = \"{}\"\n\
             [runtime]\npodman_socket = \"{}\"\nstop_timeout_seconds = 1\n{extra}",
            lib.display(),
            pm.socket().display()
        ),
    )
    .unwrap();
    let env = [
        ("FAKE_NVML_FIXTURE", dir.join("gpus.txt")),
        ("FAKE_NVML_LIMITS", dir.join("limits.txt")),
        ("FAKE_NVML_LIMITS_LOG", dir.join("limits.log")),
    ];
    let mut env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.to_str().unwrap())).collect();
    env.extend_from_slice(more);
    Daemon::start_with(bus, dir, None, &env)
}

/// Container `name`'s process and memory group, the one limit the fake
/// holds (4 GB soft, `hard`) on that group, set before its command ran.
fn limits_on_its_own_group(
    pm: &Podman,
    name: &str,
    dir: &Path,
    hard: u64,
    d: &Daemon,
) -> (String, PathBuf) {
    let pid = pm
        .run(&["inspect", "--format", "{{.State.Pid}}", name])
        .trim()
        .to_string();
    let own = memory_dir(&pid);
    assert_eq!(
        limits_in(&dir.join("limits.txt")),
        [(UUID.to_string(), 4 * GIB, hard, own.display().to_string())],
        "{}",
        d.log_text()
    );
    set_before_its_command(dir, &own);
    (pid, own)
}

/// The limits were set on `group` (the fake's log of each set says which
/// processes were in it then) before its command (`sleep`) ran, with the
/// runtime's init in it.
fn set_before_its_command(dir: &Path, group: &Path) {
    let log = std::fs::read_to_string(dir.join("limits.log")).unwrap();
    let set = log
        .lines()
        .find(|l| l.starts_with("set ") && l.contains(&group.display().to_string()))
        .unwrap_or_else(|| panic!("no set for {}: {log}", group.display()));
    let procs = set.rsplit("procs=").next().unwrap();
    assert!(!procs.is_empty(), "the group had no process yet: {set}");
    assert!(
        !procs.split(',').any(|c| c == "sleep"),
        "its command ran before its limit: {set}"
    );
}

/// `astraeusctl workers`: the worker's row has `word` in its MEMORY column.
fn workers_row_says(a: &str, name: &str, word: &str) {
    let o = ctl(a, None, &["workers"]);
    let row = o
        .stdout
        .lines()
        .find(|l| l.starts_with(&format!("{name} ")));
    let cells: Vec<&str> = row.unwrap_or_default().split("  ").map(str::trim).collect();
    assert!(cells.contains(&word), "{}", o.stdout);
}

/// A private podman, a session bus, and the fake's one L4, idle; None
/// (skipped) without podman.
fn podman_and_an_l4() -> Option<(tempfile::TempDir, Podman, Bus)> {
    if !available() {
        return None;
    }
    let dir = open_tempdir();
    let pm = Podman::start(dir.path());
    fake_nvml::one_l4(&dir.path().join("gpus.txt"), UUID, 0, "");
    Some((dir, pm, Bus::session()))
}

fn submit(a: &str, name: &str, gb: &str) {
    let spec = format!(
        r#"{{"name":"{name}","requested_resources":{{"gpu_requests":{{"shared":true,"memory_gb":{gb}}}}},
            "run":{{"container":{{"image":"localhost/bb","command":["sleep","600"]}}}}}}"#
    );
    let o = manager(a, None, "SubmitWorker", &["s", &spec]);
    assert!(o.ok, "{}", o.stderr);
    eventually(&format!("{name} running"), || {
        state(a, name) == "s \"running\"\n"
    });
}

/// A shared container's limits are on its own control group (the one its
/// process is in) before its command ran: when the driver was called, the
/// group held only the runtime's init, no `sleep`. Read back: `held`, in
/// the property, `astraeusctl workers` and `show`. Lost (a GPU reset), a
/// restart sets them again; stopped, they are gone.
#[test]
fn a_containers_limit_is_on_its_own_group_before_its_command_runs() {
    let Some((dir, pm, bus)) = podman_and_an_l4() else {
        return;
    };
    let lib = fake_nvml::fake_lib(false);
    // hard_limit = "offered": soft its 4 GB share, hard the L4's 24 GB.
    let d = start(
        &bus,
        dir.path(),
        &pm,
        &lib,
        "[sharing]\nhard_limit = \"offered\"\n",
    );
    let a = &bus.address;
    submit(a, "c", "4");
    eventually("held", || {
        worker_prop(a, "c", "Enforcement") == "s \"held\"\n"
    });
    let (pid, own) = limits_on_its_own_group(&pm, "astraeus-c", dir.path(), 24 * GIB, &d);
    workers_row_says(a, "c", "held");
    // Its use read from its limits (the driver's count for its group,
    // 5 GB), not from its processes (the 1 GB NVML lists for its pid): it
    // uses more than its 4 GB share, and is told so.
    let fx = dir.path().join("gpus.txt");
    fake_nvml::one_l4(
        &fx,
        UUID,
        5 * GIB,
        &format!("proc gpu=0 pid={pid} mem={GIB} kind=compute\n"),
    );
    let text = std::fs::read_to_string(&fx).unwrap();
    std::fs::write(
        &fx,
        text.replacen(" util=3", &format!(" util=3 cgused={}", 5 * GIB), 1),
    )
    .unwrap();
    eventually("its exact use", || {
        worker_prop(a, "c", "GpuUsedGb") == "d 5\n"
    });
    assert_eq!(
        worker_prop(a, "c", "Warnings"),
        "as 1 \"uses more than its 4 GB share on GPU 0 of majin (5 GB now)\"\n"
    );
    // Its limits lost while it runs (a GPU reset clears them): the next
    // reading sees it, and they are set again.
    std::fs::write(dir.path().join("limits.txt"), "").unwrap();
    eventually("set again", || {
        limits_in(&dir.path().join("limits.txt")).len() == 1
    });
    assert!(
        d.log_text().contains("are no longer what was set"),
        "{}",
        d.log_text()
    );
    assert_eq!(worker_prop(a, "c", "Enforcement"), "s \"held\"\n");
    fake_nvml::one_l4(&fx, UUID, 0, "");

    let o = ctl(a, None, &["status", "c"]);
    assert!(o.stdout.contains("\n  memory:   held\n"), "{}", o.stdout);
    let o = ctl(a, None, &["show", "c"]);
    assert!(
        o.stdout.lines().any(|l| l == "Enforcement=held"),
        "{}",
        o.stdout
    );

    // kill -9, and the limits lost meanwhile (a GPU reset): the restart
    // adopts the container and sets them again, read back.
    d.signal(libc::SIGKILL);
    drop(d);
    std::fs::write(dir.path().join("limits.txt"), "").unwrap();
    let d = start(
        &bus,
        dir.path(),
        &pm,
        &lib,
        "[sharing]\nhard_limit = \"offered\"\n",
    );
    eventually("adopted and held again", || {
        worker_prop(a, "c", "Enforcement") == "s \"held\"\n"
            && limits_in(&dir.path().join("limits.txt")).len() == 1
    });
    assert_eq!(
        limits_in(&dir.path().join("limits.txt"))[0].3,
        own.display().to_string()
    );

    // Stopped: no limit is left on any group that still exists.
    assert!(manager(a, None, "StopWorker", &["s", "c"]).ok);
    eventually("c gone", || gone(a, "c"));
    eventually("its limits gone", || {
        limits_in(&dir.path().join("limits.txt"))
            .iter()
            .all(|(_, _, _, d)| !Path::new(d).exists())
    });
    drop(d);
}

/// An older driver (the library without the r615 calls): the worker runs,
/// promised, and every surface says why; the GPU says it cannot hold shares.
#[test]
fn on_an_older_driver_a_share_is_promised_and_says_why() {
    let Some((dir, pm, bus)) = podman_and_an_l4() else {
        return;
    };
    let port = free_port();
    let d = start(
        &bus,
        dir.path(),
        &pm,
        &fake_nvml::fake_lib(true),
        &format!("[http]\nlisten = \"127.0.0.1:{port}\"\n"),
    );
    let a = &bus.address;
    submit(a, "c", "4");
    let why = "promised: GPU 0: driver 999.99-fake has no memory limits (r615+)";
    eventually("promised", || {
        worker_prop(a, "c", "Enforcement") == format!("s \"{why}\"\n")
    });
    let gpu = busctl(
        a,
        &[
            "get-property",
            "org.astraeus.Node1",
            "/org/astraeus/Node1/gpu/0",
            "org.astraeus.Node1.Gpu",
            "ShareLimits",
        ],
    );
    assert_eq!(
        gpu.stdout,
        "s \"promised: driver 999.99-fake has no memory limits (r615+)\"\n"
    );
    workers_row_says(a, "c", "promised");
    let o = ctl(a, None, &["--json", "workers"]);
    let j: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(j[0]["enforcement"], why);
    // The page's JSON API, as the page reads it.
    let (code, _, body) = get(port, "/machines/majin/workers");
    assert_eq!(code, 200, "{body}");
    let j: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(j["workers"][0]["enforcement"], why);
    assert!(limits_in(&dir.path().join("limits.txt")).is_empty());
    assert!(manager(a, None, "StopWorker", &["s", "c"]).ok);
    eventually("c gone", || gone(a, "c"));
    drop(d);
}

const CLAIM_UID: &str = "0b5e0000-1111-2222-3333-444444444444";

/// A claim's CDI spec, as the kubelet plugin writes it
/// (kubernetes/internal/plugin/spec_test.go pins the same form), in the
/// one place podman 4.3 reads specs from; removed when dropped.
struct ClaimSpec(PathBuf);

impl ClaimSpec {
    fn write(bus: &str, gb: &str) -> ClaimSpec {
        let hook = env!("CARGO_BIN_EXE_astraeusctl");
        let spec = serde_json::json!({
            "cdiVersion": "0.5.0",
            "kind": "astraeus.dev/claim",
            "devices": [{"name": CLAIM_UID, "containerEdits": {
                "env": [format!("ASTRAEUS_GPU_MEMORY_GB={gb}")],
                "hooks": [{"hookName": "createContainer", "path": hook,
                    "args": ["astraeusctl", "--bus-address", bus, "claim-hook", CLAIM_UID],
                    "timeout": 60}]}}]
        });
        // "astraeus-test-": a run that died leaves it for the next Podman::start to remove.
        let path = PathBuf::from(format!("/etc/cdi/astraeus-test-claim-{CLAIM_UID}.json"));
        std::fs::write(&path, spec.to_string()).unwrap();
        ClaimSpec(path)
    }
}

impl Drop for ClaimSpec {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A pod's container started through real podman with its claim's CDI
/// device: it is told its share, and the spec's createContainer hook
/// (astraeusctl claim-hook) binds it to the claim before its command
/// runs: the limits are on its own group with only the runtime's init in
/// it, its processes are the claim's holders. A second container of the
/// claim runs unbound; a restart sets the limits again; unprepared, they
/// are gone while the pod runs on.
#[test]
fn a_pods_container_is_bound_to_its_claim_by_the_cdi_hook_before_its_command_runs() {
    let Some((dir, pm, bus)) = podman_and_an_l4() else {
        return;
    };
    let lib = fake_nvml::fake_lib(false);
    let d = start(&bus, dir.path(), &pm, &lib, "");
    let a = &bus.address;
    // Its worker's object: claim-UID, D-Bus-escaped.
    let claim = format!("claim_2d{}", CLAIM_UID.replace('-', "_2d"));
    let prepared = manager(
        a,
        None,
        "PrepareClaim",
        &[
            "sssst",
            CLAIM_UID,
            "team-a",
            "voice",
            UUID,
            &(4 * GIB).to_string(),
        ],
    );
    assert!(prepared.ok, "{}", prepared.stderr);
    assert_eq!(
        worker_prop(a, &claim, "Enforcement"),
        "s \"promised: no container of its pod bound yet (the claim CDI hook binds it as it is created)\"\n"
    );
    let _spec = ClaimSpec::write(a, "4");
    let device = format!("astraeus.dev/claim={CLAIM_UID}");
    let run = |name: &str| {
        pm.cmd()
            .args(["run", "-d", "--network", "none", "--name", name, "--device"])
            .args([device.as_str(), "localhost/bb", "sleep", "600"])
            .output()
            .unwrap()
    };
    let o = run("pod-c");
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stderr),
        d.log_text()
    );
    let env = pm
        .cmd()
        .args(["exec", "pod-c", "cat", "/proc/1/environ"])
        .output()
        .unwrap();
    // Its command's own environment (an exec'd process gets podman's, not CDI's).
    let env = String::from_utf8_lossy(&env.stdout);
    assert!(
        env.split('\0').any(|v| v == "ASTRAEUS_GPU_MEMORY_GB=4"),
        "{env:?}"
    );
    assert_eq!(worker_prop(a, &claim, "Enforcement"), "s \"held\"\n");
    let (pid, own) = limits_on_its_own_group(&pm, "pod-c", dir.path(), 4 * GIB, &d);
    // Its processes' GPU memory is the claim's: 5 GB used, beyond its share.
    let fx = dir.path().join("gpus.txt");
    fake_nvml::one_l4(
        &fx,
        UUID,
        5 * GIB,
        &format!("proc gpu=0 pid={pid} mem={} kind=compute\n", 5 * GIB),
    );
    eventually("its container's use metered as the claim's", || {
        worker_prop(a, &claim, "GpuUsedGb") == "d 5\n"
    });
    assert_eq!(
        worker_prop(a, &claim, "Warnings"),
        format!("as 1 \"uses more than its 4 GB share on GPU 0 of majin (5 GB now)\"\n")
    );
    fake_nvml::one_l4(&fx, UUID, 0, "");

    // A second container of the claim runs, unbound: the limits stay the first's.
    let o = run("pod-d");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(limits_in(&dir.path().join("limits.txt")).len(), 1);
    assert!(
        d.log_text().contains("a container bound (process"),
        "{}",
        d.log_text()
    );

    // kill -9, the limits lost meanwhile: the restart sets them again.
    d.signal(libc::SIGKILL);
    drop(d);
    std::fs::write(dir.path().join("limits.txt"), "").unwrap();
    let d = start(&bus, dir.path(), &pm, &lib, "");
    eventually("held again after the restart", || {
        worker_prop(a, &claim, "Enforcement") == "s \"held\"\n"
            && limits_in(&dir.path().join("limits.txt")).len() == 1
    });
    assert_eq!(
        limits_in(&dir.path().join("limits.txt"))[0].3,
        own.display().to_string()
    );

    // Unprepared (the pod ended, or root stopped the claim): its limits go,
    // though the container still runs.
    assert!(manager(a, None, "UnprepareClaim", &["s", CLAIM_UID]).ok);
    eventually("its limits gone", || {
        limits_in(&dir.path().join("limits.txt")).is_empty()
    });
    assert!(pm
        .run(&["inspect", "--format", "{{.State.Running}}", "pod-c"])
        .contains("true"));
    drop(d);
}

/// The memory limits' deadline (docs/reliability.md: a worker's limits set
/// and read back within MEMORY_LIMITS for all its GPUs): a driver whose
/// calls do not return (held by a failpoint) leaves the worker running,
/// its share `promised` saying its limits were not set in time — never
/// `held`, and no launch waits on it. The deadline is the suite's shorter
/// one (ASTRAEUS_CALL_DEADLINE_MS).
#[test]
fn limits_not_set_within_their_deadline_leave_the_share_promised_saying_so() {
    let Some((dir, pm, bus)) = podman_and_an_l4() else {
        return;
    };
    let lib = fake_nvml::fake_lib(false);
    let d = start_env(
        &bus,
        dir.path(),
        &pm,
        &lib,
        "",
        &[
            ("ASTRAEUS_FAILPOINTS", "limits.apply=pause5000@all"),
            ("ASTRAEUS_CALL_DEADLINE_MS", "300"),
        ],
    );
    let a = &bus.address;
    submit(a, "c", "4");
    assert!(d.log_text().contains("failpoint limits.apply reached"));
    assert_eq!(
        worker_prop(a, "c", "Enforcement"),
        "s \"promised: its limits were not set within 0.3 s\"\n"
    );
    workers_row_says(a, "c", "promised");
}
