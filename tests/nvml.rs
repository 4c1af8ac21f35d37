//! The daemon reading GPUs through the real nvml-wrapper code path, against a
//! fake libnvidia-ml.so.1 built here from tests/fake_nvml/fake_nvml.c, whose
//! devices each test describes in a fixture file it rewrites as "hardware" changes.

mod common;
#[path = "common/fake_nvml.rs"]
mod fake_nvml;
#[path = "common/webdriver.rs"]
mod webdriver;
use common::*;
use fake_nvml::fake_lib;
use std::path::Path;
use std::process::{Child, Command};

const GB: u64 = 1 << 30;

struct Gpu<'a> {
    uuid: &'a str,
    name: &'a str,
    total: u64,
    used: u64,
    reserved: u64,
    /// More fixture fields, as tests/fake_nvml/fake_nvml.c reads them
    /// (`fail=1`, `retired=notsup remap=pending`, …).
    extra: &'a str,
}

fn fixture(path: &Path, gpus: &[Gpu], procs: &[(u32, u32, u64, &str)]) {
    let mut text = String::new();
    for (i, g) in gpus.iter().enumerate() {
        text.push_str(&format!(
            "gpu uuid={} name={} total={} used={} reserved={} bus=00000000:0{i}:00.0 power=60000 energy=1000 util=3 {}\n",
            g.uuid,
            g.name.replace(' ', "_"),
            g.total,
            g.used,
            g.reserved,
            g.extra
        ));
    }
    for (gpu, pid, mem, kind) in procs {
        text.push_str(&format!("proc gpu={gpu} pid={pid} mem={mem} kind={kind}\n"));
    }
    // Write then rename, so the library never reads half a file.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(tmp, path).unwrap();
}

fn rtx(used: u64, reserved: u64) -> Gpu<'static> {
    Gpu {
        uuid: "GPU-4060",
        name: "NVIDIA GeForce RTX 4060",
        total: 8 * GB,
        used,
        reserved,
        extra: "",
    }
}
fn l4(used: u64) -> Gpu<'static> {
    Gpu {
        uuid: "GPU-L4",
        name: "NVIDIA L4",
        total: 24 * GB,
        used,
        reserved: 0,
        extra: "",
    }
}

/// A real process to stand for a desktop or a reservation's holder.
fn sleeper() -> Child {
    Command::new("sleep").arg("120").spawn().unwrap()
}

fn start(bus: &Bus, dir: &Path, lib: &Path, fixture_path: &Path, extra_config: &str) -> Daemon {
    std::fs::write(
        dir.join("node.toml"),
        format!(
            "machine = \"majin\"\n[inventory]\nrefresh_seconds = 0.2\nwsl = false\nnvml_library = \"{}\"\n{extra_config}",
            lib.display()
        ),
    )
    .unwrap();
    Daemon::start_with(
        bus,
        dir,
        None,
        &[("FAKE_NVML_FIXTURE", fixture_path.to_str().unwrap())],
    )
}

fn prop(a: &str, path: &str, iface: &str, name: &str) -> String {
    busctl(
        a,
        &["get-property", "org.astraeus.Node1", path, iface, name],
    )
    .stdout
}

#[test]
fn two_gpus_a_desktop_and_outside_use_that_grows_and_shrinks() {
    let dir = open_tempdir();
    let fx = dir.path().join("gpus.txt");
    let mut desktop = sleeper();
    let pid = desktop.id();
    // A process with a compute and a graphics context is listed twice by
    // NVML, with the same memory: counted (and named) once.
    fixture(
        &fx,
        &[rtx(GB, 0), l4(0)],
        &[(0, pid, GB, "graphics"), (0, pid, GB, "compute")],
    );
    let bus = Bus::session();
    let d = start(&bus, dir.path(), &fake_lib(false), &fx, "");
    let a = &bus.address;

    let o = ctl(a, None, &["gpus"]);
    assert_eq!(
        o.stdout,
        "GPU  MODEL                    TOTAL  OFFERED  OUTSIDE  MODE  TAKEN  HEALTH\n\
         0    NVIDIA GeForce RTX 4060  8 GB   7 GB     1 GB     free  —      ok\n\
         1    NVIDIA L4                24 GB  24 GB    0 GB     free  —      ok\n\
         \n\
         2 GPUs listed.\n"
    );
    // Shared work opens the smallest GPU that fits: the 4060.
    assert!(
        manager(
            a,
            None,
            "SubmitWorker",
            &["s", &shared_spec("listen", "2.2")]
        )
        .ok
    );
    assert!(
        manager(
            a,
            None,
            "SubmitWorker",
            &["s", &shared_spec("voice", "4.2")]
        )
        .ok
    );
    assert_eq!(
        prop(
            a,
            "/org/astraeus/Node1/gpu/0",
            "org.astraeus.Node1.Gpu",
            "TakenGb"
        ),
        "d 6.4\n"
    );
    // 7.5 does not fit the 4060 but opens the L4; with the L4 asked for by
    // model it fits; asked for on the 4060 by id it waits with the seed's
    // sentence and who holds the outside memory.
    let spec = r#"{"name":"big","requested_resources":{"gpu_requests":{"shared":true,"memory_gb":7.5,"ids":[0]}}}"#;
    let o = manager(a, None, "SubmitWorker", &["s", spec]);
    assert!(
        o.stdout.contains(&format!(
            "GPU 0 of majin offers 7 of its 8 GB (1 GB held outside Astraeus); it needs 7.5 \\342\\200\\224 1 GB held by pid {pid} (sleep, user root)\""
        )),
        "{}",
        o.stdout
    );
    let small = r#"{"name":"small","requested_resources":{"gpu_requests":{"shared":true,"memory_gb":1.5,"ids":["GPU-4060"]}}}"#;
    assert!(manager(a, None, "SubmitWorker", &["s", small])
        .stdout
        .contains("pending"));

    // The desktop grows to 2 GB: the 4060 offers 6 but 6.4 are promised.
    fixture(
        &fx,
        &[rtx(2 * GB, 0), l4(0)],
        &[(0, pid, 2 * GB, "graphics")],
    );
    eventually("over-promised flag", || {
        prop(
            a,
            "/org/astraeus/Node1/gpu/0",
            "org.astraeus.Node1.Gpu",
            "OverPromised",
        ) == "b true\n"
    });
    let o = ctl(a, None, &["gpus"]);
    assert!(o.stdout.contains("  ! over-promised: 6.4 GB promised to sharers but it offers 6 of its 8 GB (2 GB held outside Astraeus)"), "{}", o.stdout);
    // Never a silent eviction: both sharers still run, and say why they should worry.
    assert_eq!(
        prop(
            a,
            "/org/astraeus/Node1/worker/voice",
            "org.astraeus.Node1.Worker",
            "State"
        ),
        "s \"running\"\n"
    );
    assert!(prop(
        a,
        "/org/astraeus/Node1/worker/voice",
        "org.astraeus.Node1.Worker",
        "Warnings"
    )
    .contains("over-promised"));
    assert!(d.log_text().contains("over-promised"), "logged");

    // The desktop lets go and something reserves 0.25 GB: offers 7.75 of 8;
    // small (1.5) still does not fit beside 6.4, but the flag clears.
    fixture(&fx, &[rtx(0, GB / 4), l4(0)], &[]);
    eventually("flag clears", || {
        prop(
            a,
            "/org/astraeus/Node1/gpu/0",
            "org.astraeus.Node1.Gpu",
            "OfferedGb",
        ) == "d 7.75\n"
    });
    assert_eq!(
        prop(
            a,
            "/org/astraeus/Node1/gpu/0",
            "org.astraeus.Node1.Gpu",
            "OverPromised"
        ),
        "b false\n"
    );
    assert!(prop(a, "/org/astraeus/Node1/worker/small", "org.astraeus.Node1.Worker", "PendingReasons")
        .contains("GPU 0 of majin: 6.4 of 7.75 GB taken by shared work; it needs 1.5 \\342\\200\\224 0.25 GB reserved by the driver"));
    // Stop voice: small is re-examined and placed.
    assert!(manager(a, None, "StopWorker", &["s", "voice"]).ok);
    assert_eq!(
        prop(
            a,
            "/org/astraeus/Node1/worker/small",
            "org.astraeus.Node1.Worker",
            "State"
        ),
        "s \"running\"\n"
    );
    let _ = desktop.kill();
    let _ = desktop.wait();
    let _ = desktop.wait();
}

/// A worker's holder using memory on GPUs its worker was not granted (here
/// a worker with no GPU at all): that memory is outside use there, named,
/// and not offered. It was taken for the worker's own on every GPU, hidden
/// from placement: the GPUs kept offering it to others.
#[test]
fn a_holders_memory_on_a_gpu_its_worker_was_not_granted_is_outside() {
    let dir = open_tempdir();
    let fx = dir.path().join("gpus.txt");
    let mut holder = sleeper();
    let pid = holder.id();
    fixture(&fx, &[rtx(0, 0), l4(0)], &[]);
    let bus = Bus::session();
    let _d = start(&bus, dir.path(), &fake_lib(false), &fx, "");
    let a = &bus.address;
    let spec = format!(r#"{{"name":"hider","holders":[{pid}]}}"#);
    assert!(manager(a, None, "SubmitWorker", &["s", &spec]).ok);
    assert!(state(a, "hider").contains("running"));
    fixture(
        &fx,
        &[rtx(2 * GB, 0), l4(5 * GB)],
        &[(0, pid, 2 * GB, "compute"), (1, pid, 5 * GB, "compute")],
    );
    let offered = |i: u32| {
        prop(
            a,
            &format!("/org/astraeus/Node1/gpu/{i}"),
            "org.astraeus.Node1.Gpu",
            "OfferedGb",
        )
    };
    eventually("the holder's memory is outside", || {
        offered(0) == "d 6\n" && offered(1) == "d 19\n"
    });
    // A request that cannot fit is told whose memory it is.
    let big =
        r#"{"name":"big","requested_resources":{"gpu_requests":{"shared":true,"memory_gb":20}}}"#;
    let why = manager(a, None, "WhyNot", &["s", big]).stdout;
    assert!(why.contains(&format!("5 GB held by pid {pid}")), "{why}");
    let _ = holder.kill();
    let _ = holder.wait();
}

#[test]
fn a_reservations_holder_is_its_own_use_not_outside() {
    let dir = open_tempdir();
    let fx = dir.path().join("gpus.txt");
    let mut holder = sleeper();
    let pid = holder.id();
    fixture(&fx, &[rtx(0, 0)], &[]);
    let bus = Bus::session();
    let d = start(&bus, dir.path(), &fake_lib(false), &fx, "");
    let a = &bus.address;
    let spec = format!(
        r#"{{"name":"listen","holders":[{pid}],"requested_resources":{{"gpu_requests":{{"shared":true,"memory_gb":2.5}}}}}}"#
    );
    assert!(manager(a, None, "SubmitWorker", &["s", &spec]).ok);
    // The holder starts using 2 GB: it is the worker's own, not outside.
    // (Wait until that reading is taken — the worker's use shows it — so
    // the check below is of the new reading, not of the old one.)
    fixture(&fx, &[rtx(2 * GB, 0)], &[(0, pid, 2 * GB, "compute")]);
    eventually("the holder's use is read", || {
        prop(
            a,
            "/org/astraeus/Node1/worker/listen",
            "org.astraeus.Node1.Worker",
            "GpuUsedGb",
        ) == "d 2\n"
    });
    assert_eq!(
        prop(
            a,
            "/org/astraeus/Node1/gpu/0",
            "org.astraeus.Node1.Gpu",
            "OfferedGb"
        ),
        "d 8\n"
    );
    // Another process using 1 GB is outside.
    let mut other = sleeper();
    fixture(
        &fx,
        &[rtx(3 * GB, 0)],
        &[(0, pid, 2 * GB, "compute"), (0, other.id(), GB, "compute")],
    );
    eventually("outside follows", || {
        prop(
            a,
            "/org/astraeus/Node1/gpu/0",
            "org.astraeus.Node1.Gpu",
            "OfferedGb",
        ) == "d 7\n"
    });
    // Metering: the holder now uses 3 GB of its 2.5 GB promise.
    fixture(
        &fx,
        &[rtx(4 * GB, 0)],
        &[(0, pid, 3 * GB, "compute"), (0, other.id(), GB, "compute")],
    );
    eventually("breach flagged", || {
        prop(
            a,
            "/org/astraeus/Node1/worker/listen",
            "org.astraeus.Node1.Worker",
            "Warnings",
        ) == "as 1 \"uses more than its 2.5 GB share on GPU 0 of majin (3 GB now)\"\n"
    });
    assert_eq!(
        prop(
            a,
            "/org/astraeus/Node1/worker/listen",
            "org.astraeus.Node1.Worker",
            "GpuUsedGb"
        ),
        "d 3\n"
    );
    // Its 0.5 GB beyond the share is not free for others, nor outside
    // Astraeus: named as what it is.
    let gpu = |name: &str| {
        prop(
            a,
            "/org/astraeus/Node1/gpu/0",
            "org.astraeus.Node1.Gpu",
            name,
        )
    };
    assert_eq!(gpu("OfferedGb"), "d 6.5\n");
    assert_eq!(gpu("HeldOutsideGb"), "d 1\n");
    assert_eq!(gpu("BeyondSharesGb"), "d 0.5\n");
    let warning = "used beyond shares: 0.5 GB beyond its 2.5 GB share by worker listen";
    assert_eq!(gpu("Warning"), format!("s \"{warning}\"\n"));
    assert_eq!(gpu("OverPromised"), "b false\n");
    let o = ctl(a, None, &["gpus"]);
    assert!(
        o.stdout.contains(&format!("\n  ! {warning}\n")),
        "{}",
        o.stdout
    );
    let o = ctl(a, None, &["--json", "gpus"]);
    assert!(
        o.stdout.contains("\"beyond_shares_gb\": 0.5,"),
        "{}",
        o.stdout
    );
    let big =
        r#"{"name":"big","requested_resources":{"gpu_requests":{"shared":true,"memory_gb":7}}}"#;
    let why = manager(a, None, "WhyNot", &["s", big]).stdout;
    assert!(
        why.contains(
            "offers 6.5 of its 8 GB (1 GB held outside Astraeus, 0.5 GB used beyond shares); \
             it needs 7"
        ) && why.contains("0.5 GB beyond its 2.5 GB share by worker listen"),
        "{why}"
    );
    let o = ctl(a, None, &["workers"]);
    assert!(
        o.stdout
            .contains("listen  running  root   1 · shared 2.5 GB  0    promised  3 GB"),
        "{}",
        o.stdout
    );
    // Logged once per breach, not at every refresh, nor when its figures
    // move (the property follows them).
    std::thread::sleep(std::time::Duration::from_millis(800));
    fixture(
        &fx,
        &[rtx(4 * GB + GB / 2, 0)],
        &[
            (0, pid, 3 * GB + GB / 2, "compute"),
            (0, other.id(), GB, "compute"),
        ],
    );
    eventually("the breach's figures follow", || {
        prop(
            a,
            "/org/astraeus/Node1/worker/listen",
            "org.astraeus.Node1.Worker",
            "Warnings",
        ) == "as 1 \"uses more than its 2.5 GB share on GPU 0 of majin (3.5 GB now)\"\n"
    });
    assert_eq!(
        d.log_text()
            .matches("uses more than its 2.5 GB share")
            .count(),
        1,
        "{}",
        d.log_text()
    );
    let _ = holder.kill();
    let _ = other.kill();
    let _ = holder.wait();
    let _ = other.wait();
}

#[test]
fn a_gpu_whose_queries_keep_failing_becomes_unhealthy_and_its_workers_are_flagged() {
    let dir = open_tempdir();
    let fx = dir.path().join("gpus.txt");
    fixture(&fx, &[rtx(0, 0), l4(0)], &[]);
    let bus = Bus::session();
    let d = start(&bus, dir.path(), &fake_lib(false), &fx, "");
    let a = &bus.address;
    let on_l4 = r#"{"name":"on-l4","requested_resources":{"gpu_requests":{"models":["L4"]}}}"#;
    assert!(manager(a, None, "SubmitWorker", &["s", on_l4]).ok);
    let mut failing = l4(0);
    failing.extra = "fail=1";
    fixture(&fx, &[rtx(0, 0), failing], &[]);
    eventually("worker flagged", || {
        prop(
            a,
            "/org/astraeus/Node1/worker/on_2dl4",
            "org.astraeus.Node1.Worker",
            "Warnings",
        )
        .contains("GPU 1 of majin is unhealthy while in use: its NVML queries keep failing")
    });
    // Nothing dropped from the ledger: it still runs, on the same GPU.
    assert_eq!(
        prop(
            a,
            "/org/astraeus/Node1/worker/on_2dl4",
            "org.astraeus.Node1.Worker",
            "State"
        ),
        "s \"running\"\n"
    );
    // healthy_only (the default) avoids the GPU, with a reason.
    let o = manager(
        a,
        None,
        "WhyNot",
        &[
            "s",
            r#"{"name":"x","requested_resources":{"gpu_requests":{"models":["L4"]}}}"#,
        ],
    );
    assert!(
        o.stdout
            .contains("GPU 1 of majin is unhealthy \\342\\200\\224 its NVML queries keep failing"),
        "{}",
        o.stdout
    );
    assert!(
        d.log_text().contains("NVML query failed"),
        "{}",
        d.log_text()
    );
    // Its ill health is shown where people look: the GPU object, the CLI.
    let gpu1 = |p: &str| prop(a, "/org/astraeus/Node1/gpu/1", "org.astraeus.Node1.Gpu", p);
    assert_eq!(gpu1("Healthy"), "b false\n");
    assert_eq!(gpu1("Mode"), "s \"unhealthy\"\n");
    assert!(
        gpu1("Health").contains("NVML queries keep failing"),
        "{}",
        gpu1("Health")
    );
    assert_eq!(
        prop(
            a,
            "/org/astraeus/Node1/gpu/0",
            "org.astraeus.Node1.Gpu",
            "Healthy"
        ),
        "b true\n"
    );
    let o = ctl(a, None, &["gpus"]);
    assert!(
        o.stdout
            .lines()
            .any(|l| l.starts_with("1    NVIDIA L4") && l.contains("  unhealthy  ")),
        "{}",
        o.stdout
    );
    assert!(!o.stdout.contains('\x1b'), "no colour into a pipe");
    // In a real terminal (a pty, through script(1)) it is red; NO_COLOR,
    // TERM=dumb and --color=never turn that off.
    // In the pty: `env` before the command, `flags` after it.
    let shell = |env: &str, flags: &str| {
        let cmd = format!(
            "{env} {} --bus-address '{a}' {flags} gpus",
            env!("CARGO_BIN_EXE_astraeusctl")
        );
        let out = std::process::Command::new("script")
            .args(["-qec", &cmd, "/dev/null"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let tty = shell("TERM=xterm", "");
    assert!(
        tty.lines()
            .any(|l| l.starts_with("1    NVIDIA L4") && l.contains("\x1b[1;31munhealthy\x1b[0m")),
        "{tty:?}"
    );
    assert!(tty.contains("\x1b[32mfree\x1b[0m"), "{tty:?}");
    let plain = shell("TERM=xterm NO_COLOR=1", "");
    assert!(
        plain.contains("unhealthy") && !plain.contains('\x1b'),
        "{plain:?}"
    );
    assert!(
        shell("TERM=xterm", "").contains('\x1b'),
        "a terminal: colour"
    );
    // CI=true as a CI runner sets it: anstream alone would colour a dumb
    // terminal there (the failure CI saw).
    for env in ["TERM=dumb", "CI=true TERM=dumb", "env -u TERM CI=true"] {
        assert!(!shell(env, "").contains('\x1b'), "{env}: no colour");
    }
    let never = shell("TERM=xterm", "--color=never");
    assert!(
        never.contains("unhealthy") && !never.contains('\x1b'),
        "{never:?}"
    );
    // --color=always and CLICOLOR_FORCE into a pipe.
    let o = ctl(a, None, &["--color=always", "gpus"]);
    assert!(
        o.stdout.contains("\x1b[1;31munhealthy\x1b[0m"),
        "{}",
        o.stdout
    );
    let forced = std::process::Command::new(env!("CARGO_BIN_EXE_astraeusctl"))
        .args(["--bus-address", a, "gpus"])
        .env("CLICOLOR_FORCE", "1")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&forced.stdout).contains('\x1b'));
    // The failure passes (a transient fault, a driver reload): healthy again.
    fixture(&fx, &[rtx(0, 0), l4(0)], &[]);
    eventually("GPU 1 healthy again", || gpu1("Healthy") == "b true\n");
    assert!(
        d.log_text().contains("GPU 1 answers NVML again"),
        "{}",
        d.log_text()
    );
}

#[test]
fn missing_optional_symbols_are_tolerated() {
    let dir = open_tempdir();
    let fx = dir.path().join("gpus.txt");
    fixture(&fx, &[rtx(GB, 0)], &[]);
    let bus = Bus::session();
    let _d = start(&bus, dir.path(), &fake_lib(true), &fx, "");
    let o = ctl(&bus.address, None, &["gpus"]);
    assert_eq!(
        o.stdout,
        "GPU  MODEL                    TOTAL  OFFERED  OUTSIDE  MODE  TAKEN  HEALTH\n\
         0    NVIDIA GeForce RTX 4060  8 GB   7 GB     1 GB     free  —      ok\n\
         \n\
         1 GPU listed.\n"
    );
}

/// A GPU in MIG mode (NVML's GetMigMode says current 1) runs no work of
/// its own: `gpus` says `mig`, and a shared request only it could serve
/// waits, saying why. One whose MIG mode is only pending is shared, and
/// warned of. A driver without the call (the fake built without its
/// optional symbols) reads as no MIG.
#[test]
fn a_mig_gpu_is_never_offered_and_a_pending_one_is_warned_of() {
    let dir = open_tempdir();
    let fx = dir.path().join("gpus.txt");
    let pending = Gpu {
        extra: "mig=0,1",
        ..rtx(0, 0)
    };
    let on = Gpu {
        extra: "mig=1,1",
        ..l4(0)
    };
    fixture(&fx, &[pending, on], &[]);
    let bus = Bus::session();
    let d = start(&bus, dir.path(), &fake_lib(false), &fx, "");
    let a = &bus.address;
    let o = ctl(a, None, &["--no-legend", "gpus"]);
    let lines: Vec<&str> = o.stdout.lines().collect();
    assert!(
        lines[0].starts_with("0    NVIDIA GeForce RTX 4060") && lines[0].contains(" free "),
        "{}",
        o.stdout
    );
    assert!(
        lines[1].starts_with("  ! MIG mode is pending on GPU 0 of majin: after its next reset"),
        "{}",
        o.stdout
    );
    assert!(
        lines[2].starts_with("1    NVIDIA L4") && lines[2].contains(" mig "),
        "{}",
        o.stdout
    );
    // It offers sharing nothing (#66: OFFERED said its 24 GB), and says why.
    assert_eq!(
        prop(
            a,
            "/org/astraeus/Node1/gpu/1",
            "org.astraeus.Node1.Gpu",
            "OfferedGb"
        ),
        "d 0\n"
    );
    let cells: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(cells[5..7], ["0", "GB"], "OFFERED: {}", lines[2]);
    // 10 GB would fit only the L4's 24: it can never be placed, and says why.
    let o = manager(a, None, "SubmitWorker", &["s", &shared_spec("big", "10")]);
    assert!(
        !o.ok
            && o.stderr.contains("it can never be placed on majin")
            && o.stderr.contains(
                "GPU 1 of majin is in MIG mode: it runs no work of its own; its MIG \
                 instances are offered whole, each as a GPU of its own (turn MIG off \
                 to share it: nvidia-smi -i 1 -mig 0, then reset the GPU)"
            ),
        "{}",
        o.stderr
    );
    // 2 GB goes on the GPU whose MIG mode is only pending.
    let o = manager(a, None, "SubmitWorker", &["s", &shared_spec("small", "2")]);
    assert!(o.stdout.contains("running"), "{}", o.stdout);
    drop(d);

    // An older driver, without nvmlDeviceGetMigMode: no MIG.
    let dir = open_tempdir();
    let fx = dir.path().join("gpus.txt");
    fixture(
        &fx,
        &[Gpu {
            extra: "mig=1,1",
            ..l4(0)
        }],
        &[],
    );
    let bus = Bus::session();
    let _d = start(&bus, dir.path(), &fake_lib(true), &fx, "");
    let o = ctl(&bus.address, None, &["--no-legend", "gpus"]);
    assert!(o.stdout.contains(" free "), "{}", o.stdout);
}

/// A GPU in MIG mode offers each of its MIG instances as a GPU of its own,
/// whole only: listed after the GPUs, with its own UUID, name and memory; a
/// whole request takes one; a shared request never does, and says why; an
/// instance is unhealthy when its GPU is.
#[test]
fn mig_instances_are_offered_whole_each_a_gpu_of_its_own() {
    let dir = open_tempdir();
    let fx = dir.path().join("gpus.txt");
    let write = |parent: &str| {
        let extra = format!("mig=1,1 {parent}");
        fixture(
            &fx,
            &[Gpu {
                extra: &extra,
                ..l4(0)
            }],
            &[],
        );
        let mut text = std::fs::read_to_string(&fx).unwrap();
        text.push_str(&format!(
            "mig gpu=0 uuid=MIG-aaaa name=NVIDIA_L4_MIG_1g.6gb total={} used=0\n\
             mig gpu=0 uuid=MIG-bbbb name=NVIDIA_L4_MIG_2g.12gb total={} used={GB}\n",
            6 * GB,
            12 * GB
        ));
        std::fs::write(&fx, text).unwrap();
    };
    write("");
    let bus = Bus::session();
    let d = start(&bus, dir.path(), &fake_lib(false), &fx, "");
    let a = &bus.address;
    let o = ctl(a, None, &["--no-legend", "gpus"]);
    let lines: Vec<&str> = o.stdout.lines().filter(|l| !l.starts_with("  ")).collect();
    assert_eq!(lines.len(), 3, "{}", o.stdout);
    assert!(
        lines[0].starts_with("0    NVIDIA L4 ") && lines[0].contains(" mig "),
        "{}",
        o.stdout
    );
    assert!(
        lines[1].starts_with("1    NVIDIA L4 MIG 1g.6gb ") && lines[1].contains(" 6 GB "),
        "{}",
        o.stdout
    );
    assert!(
        lines[2].starts_with("2    NVIDIA L4 MIG 2g.12gb ") && lines[2].contains(" 1 GB "),
        "{}",
        o.stdout
    );
    let gpu_prop = |i: u32, name: &str| {
        busctl(
            a,
            &[
                "get-property",
                "org.astraeus.Node1",
                &format!("/org/astraeus/Node1/gpu/{i}"),
                "org.astraeus.Node1.Gpu",
                name,
            ],
        )
        .stdout
    };
    assert_eq!(gpu_prop(1, "Uuid"), "s \"MIG-aaaa\"\n");
    // Its summary (the page's line under it) says what it is.
    assert!(
        gpu_prop(1, "Summary").starts_with("s \"a MIG instance of GPU 0, offered whole only; "),
        "{}",
        gpu_prop(1, "Summary")
    );
    assert!(gpu_prop(2, "ShareLimits").starts_with("s \"promised: a MIG instance"));
    // Shared work: never on an instance, and it says so for each.
    let o = manager(a, None, "SubmitWorker", &["s", &shared_spec("small", "1")]);
    assert!(
        !o.ok
            && o.stderr.contains(
                "GPU 1 of majin is a MIG instance: it is offered whole only (memory limits \
                 do not apply to MIG instances)"
            )
            && o.stderr.contains("GPU 2 of majin is a MIG instance"),
        "{}",
        o.stderr
    );
    // Whole work takes one, the lowest free.
    let whole = r#"{"name":"w","requested_resources":{"gpu_requests":{"count":1}}}"#;
    let o = manager(a, None, "SubmitWorker", &["s", whole]);
    assert!(o.stdout.contains("running"), "{} {}", o.stdout, o.stderr);
    let o = busctl(
        a,
        &[
            "get-property",
            "org.astraeus.Node1",
            "/org/astraeus/Node1/worker/w",
            "org.astraeus.Node1.Worker",
            "Gpus",
        ],
    );
    assert_eq!(o.stdout, "a(us) 1 1 \"MIG-aaaa\"\n");
    // To a Kubernetes cluster: each instance whole (mig), its memory while
    // free; the GPU in MIG mode not at all. A claim takes the free one whole.
    let offers = manager(a, None, "ListClusterOffers", &[]).stdout;
    assert_eq!(
        offers,
        format!(
            "a(usstbbbss) 2 1 \"MIG-aaaa\" \"NVIDIA L4 MIG 1g.6gb\" 0 true false true \"\" \
             \"999.99-fake\" 2 \"MIG-bbbb\" \"NVIDIA L4 MIG 2g.12gb\" {} true true true \"\" \
             \"999.99-fake\"\n",
            12 * GB
        )
    );
    let uid = "0b5e0000-1111-2222-3333-444444444444";
    let o = manager(
        a,
        None,
        "PrepareClaim",
        &["sssst", uid, "team-a", "big", "MIG-bbbb", "0"],
    );
    assert!(o.ok, "{}", o.stderr);
    assert!(
        o.stdout.ends_with(" \"12\"\n"),
        "told the instance's memory: {}",
        o.stdout
    );
    let offers = manager(a, None, "ListClusterOffers", &[]).stdout;
    assert!(
        offers.ends_with(" 0 true false true \"\" \"999.99-fake\"\n"),
        "taken: {offers}"
    );
    assert!(manager(a, None, "UnprepareClaim", &["s", uid]).ok);
    // Its GPU's row remapping failed: the instances are unhealthy, saying why.
    write("remap=failed");
    eventually("instances unhealthy", || {
        gpu_prop(1, "Healthy") == "b false\n"
    });
    let health = gpu_prop(2, "Health");
    assert!(
        health.starts_with("s \"its GPU 0 is unhealthy: "),
        "{health}"
    );
    drop(d);
}

#[test]
fn without_nvml_the_daemon_says_what_it_tried_and_exits() {
    let dir = open_tempdir();
    std::fs::write(
        dir.path().join("node.toml"),
        "[inventory]\nnvml_library = \"/nonexistent/libnvidia-ml.so.1\"\n",
    )
    .unwrap();
    let bus = Bus::session();
    let out = Command::new(env!("CARGO_BIN_EXE_astraeusd"))
        .args(["--bus-address", &bus.address, "--state-dir"])
        .arg(dir.path().join("state"))
        .arg("--config")
        .arg(dir.path().join("node.toml"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("NVML could not be loaded; tried: /nonexistent/libnvidia-ml.so.1"),
        "{err}"
    );
    assert!(err.contains("--sim"), "{err}");
    // Said once (the log is stderr here), as a failure to start.
    assert_eq!(err.matches("NVML could not be loaded").count(), 1, "{err}");
    assert!(err.contains("cannot start: "), "{err}");
    // A host that only time-slices runs without NVML.
    std::fs::write(dir.path().join("node.toml"), "[inventory]\nnvml = false\n").unwrap();
    let d = Daemon::start_with(&bus, dir.path(), None, &[]);
    assert_eq!(
        manager(&bus.address, None, "ListGpus", &[]).stdout.trim(),
        "a(usssddddsss) 0"
    );
    drop(d);
}

#[test]
fn energy_and_utilisation_intervals_reach_the_ledger() {
    let dir = open_tempdir();
    let fx = dir.path().join("gpus.txt");
    let write = |energy: u64| {
        let text = format!(
            "gpu uuid=GPU-4060 name=RTX total={} used=0 reserved=0 bus=00000000:01:00.0 power=60000 energy={energy} util=40 fail=0 pending=0\n",
            8 * GB
        );
        std::fs::write(fx.with_extension("tmp"), text).unwrap();
        std::fs::rename(fx.with_extension("tmp"), &fx).unwrap();
    };
    write(1_000);
    let bus = Bus::session();
    let d = start(
        &bus,
        dir.path(),
        &fake_lib(false),
        &fx,
        "[usage]\ninterval_seconds = 1\n",
    );
    // The counter advances 60 J every 0.2 s (300 W).
    for k in 1..=15u64 {
        std::thread::sleep(std::time::Duration::from_millis(200));
        write(1_000 + k * 60_000);
    }
    let db = rusqlite::Connection::open(d.state.join("ledger.db")).unwrap();
    let (rows, energy, util): (i64, i64, Option<i64>) = db
        .query_row(
            "SELECT count(*), sum(energy_mj), max(utilization_pct) FROM gpu_intervals WHERE gpu_uuid = 'GPU-4060'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert!(rows >= 1, "no interval recorded");
    assert!(
        energy > 0 && energy % 60_000 == 0,
        "energy {energy} mJ is not a sum of counter steps"
    );
    assert_eq!(util, Some(40));
}

/// Another user's process names itself with terminal escapes: its name
/// reaches the reasons, astraeusctl and the journal only as printable text.
#[test]
fn a_process_name_with_escapes_is_shown_printable() {
    let dir = open_tempdir();
    let fx = dir.path().join("gpus.txt");
    // The shell renames itself (comm, 15 bytes) and stays: its pid holds 1 GB.
    let mut hostile = Command::new("sh")
        .arg("-c")
        .arg(r#"printf '\033]0;owned\007\033[2J' > /proc/$$/comm; while :; do sleep 1; done"#)
        .spawn()
        .unwrap();
    let pid = hostile.id();
    eventually("the process renamed itself", || {
        std::fs::read(format!("/proc/{pid}/comm")).is_ok_and(|c| c.starts_with(b"\x1b]0;owned"))
    });
    // The driver's own words too: a board name that would turn text around.
    let turned = Gpu {
        name: "RTX\u{202e}0604",
        ..rtx(GB, 0)
    };
    fixture(&fx, &[turned], &[(0, pid, GB, "graphics")]);
    let bus = Bus::session();
    let d = start(&bus, dir.path(), &fake_lib(false), &fx, "");
    let a = &bus.address;
    let gpu = "/org/astraeus/Node1/gpu/0";
    let model = prop(a, gpu, "org.astraeus.Node1.Gpu", "Model");
    let spec = dir.path().join("big.json");
    std::fs::write(
        &spec,
        r#"{"name":"big","requested_resources":{"gpu_requests":{"shared":true,"memory_gb":7.5}}}"#,
    )
    .unwrap();
    let o = ctl(a, None, &["submit", spec.to_str().unwrap()]);
    let _ = hostile.kill();
    let _ = hostile.wait();
    assert_eq!(model, "s \"RTX?0604\"\n");
    assert!(
        o.stdout
            .contains(&format!("held by pid {pid} (?]0;owned??[2J, user root)")),
        "{:?}",
        o.stdout
    );
    for (what, text) in [
        ("astraeusctl", o.stdout.clone()),
        ("the journal", d.log_text()),
    ] {
        assert!(
            !text.contains('\u{1b}') && !text.contains('\u{7}'),
            "{what} got a raw escape: {text:?}"
        );
    }
}

const MIB: u64 = 1 << 20;

/// Real boards report a little less than they are sold as: an "8 GB" RTX
/// 4060 8188 MiB plus a few hundred MiB reserved, an 80 GB H100 81,559 MiB.
/// They read as sold, the figures shown add up (offered + outside = total),
/// and placement never promises more than NVML says is there.
#[test]
fn real_board_sizes_read_as_sold_and_their_figures_add_up() {
    let dir = tempfile::tempdir().unwrap();
    let bus = Bus::session();
    let mut desktop = sleeper();
    let fx = dir.path().join("fixture");
    let rtx = Gpu {
        uuid: "GPU-4060",
        name: "NVIDIA GeForce RTX 4060",
        total: 8188 * MIB,
        used: 700 * MIB,
        reserved: 300 * MIB,
        extra: "",
    };
    let h100 = Gpu {
        uuid: "GPU-H100",
        name: "NVIDIA H100 80GB HBM3",
        total: 81_559 * MIB,
        used: 0,
        reserved: 0,
        extra: "",
    };
    fixture(
        &fx,
        &[rtx, h100],
        &[(0, desktop.id(), 700 * MIB, "graphics")],
    );
    let _d = start(&bus, dir.path(), &fake_lib(false), &fx, "");
    let a = &bus.address;
    let out = ctl(a, None, &["gpus"]).stdout;
    // 700 (desktop) + 300 (reserved) + 4 (unreported) MiB = 0.98 GB, shown rounded up.
    assert!(
        out.contains("0    NVIDIA GeForce RTX 4060  8 GB   7.01 GB   0.99 GB  free"),
        "{out}"
    );
    // 361 MiB unreported = 0.35 GB, rounded up.
    assert!(
        out.contains("1    NVIDIA H100 80GB HBM3    80 GB  79.64 GB  0.36 GB  free"),
        "{out}"
    );
    for (i, total, offered, outside) in [(0, "8", "7.01", "0.99"), (1, "80", "79.64", "0.36")] {
        let path = format!("/org/astraeus/Node1/gpu/{i}");
        let get = |p: &str| prop(a, &path, "org.astraeus.Node1.Gpu", p);
        assert_eq!(get("TotalGb"), format!("d {total}\n"));
        assert_eq!(get("OfferedGb"), format!("d {offered}\n"));
        assert_eq!(get("HeldOutsideGb"), format!("d {outside}\n"));
    }
    // The oracle for "never more than there": NVML's own figures, in bytes.
    let free_0 = 8188 * MIB - 700 * MIB - 300 * MIB;
    assert!(701 * GB / 100 <= free_0 && 702 * GB / 100 > free_0 - MIB);
    let on_gpu0 = |name: &str, gb: &str| {
        format!(
            r#"{{"name":"{name}","requested_resources":{{"gpu_requests":{{"shared":true,"memory_gb":{gb},"ids":[0]}}}}}}"#
        )
    };
    let o = manager(a, None, "SubmitWorker", &["s", &on_gpu0("fits", "7.01")]);
    assert!(
        o.ok && o.stdout.contains("running"),
        "{}{}",
        o.stdout,
        o.stderr
    );
    assert!(manager(a, None, "StopWorker", &["s", "fits"]).ok);
    let o = manager(a, None, "SubmitWorker", &["s", &on_gpu0("over", "7.02")]);
    assert!(
        o.ok && o.stdout.contains("pending"),
        "{}{}",
        o.stdout,
        o.stderr
    );
    let _ = desktop.kill();
    let _ = desktop.wait();
}

/// A WSL2 card: NVML lists no processes there (NOT_SUPPORTED), so what is
/// used less what workers were promised is outside; every container sees
/// every GPU. An "8 GB" card with about 1 GB used by the desktop reads as
/// the seed's; a worker's own use does not count as outside.
#[test]
fn a_wsl2_card_reads_as_sold_and_counts_promises_as_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let bus = Bus::session();
    let fx = dir.path().join("fixture");
    // The power figure marks each rewrite, so a test knows when it was read.
    let card = |used: u64, watts: u64| {
        format!(
            "gpu uuid=GPU-wsl name=NVIDIA_GeForce_RTX_4060_Laptop_GPU total={} used={used} reserved=0 \
             bus=00000000:01:00.0 power={} energy=1000 util=3 fail=0 pending=0 procs=notsup\n",
            8188 * MIB,
            watts * 1000
        )
    };
    std::fs::write(&fx, card(1020 * MIB, 40)).unwrap();
    std::fs::write(
        dir.path().join("node.toml"),
        format!(
            "machine = \"majin\"\n[inventory]\nrefresh_seconds = 0.2\nwsl = true\nnvml_library = \"{}\"\n",
            fake_lib(false).display()
        ),
    )
    .unwrap();
    let _d = Daemon::start_with(
        &bus,
        dir.path(),
        None,
        &[("FAKE_NVML_FIXTURE", fx.to_str().unwrap())],
    );
    let a = &bus.address;
    let out = ctl(a, None, &["gpus"]).stdout;
    assert!(out.contains("majin is a WSL2 host"), "{out}");
    // 1020 MiB used + 4 MiB unreported = exactly 1 GB outside.
    assert!(
        out.contains("0    NVIDIA GeForce RTX 4060 Laptop GPU  8 GB   7 GB     1 GB     free"),
        "{out}"
    );
    let o = manager(
        a,
        None,
        "SubmitWorker",
        &["s", &shared_spec("listen", "2.2")],
    );
    assert!(o.ok && o.stdout.contains("running"), "{}", o.stderr);
    // Its process now uses its 2.2 GB: promised to it, so not outside.
    std::fs::write(&fx, card(1020 * MIB + 22 * GB / 10, 41)).unwrap();
    let path = "/org/astraeus/Node1/gpu/0";
    eventually("the new reading is taken", || {
        prop(a, path, "org.astraeus.Node1.Gpu", "PowerW") == "d 41\n"
    });
    assert_eq!(
        prop(a, path, "org.astraeus.Node1.Gpu", "HeldOutsideGb"),
        "d 1\n"
    );
    // Beyond its promise, the excess is outside (0.5 GB over 2.2).
    std::fs::write(&fx, card(1020 * MIB + 27 * GB / 10, 42)).unwrap();
    eventually("outside grows by the use beyond the promise", || {
        prop(a, path, "org.astraeus.Node1.Gpu", "HeldOutsideGb") == "d 1.5\n"
    });
}

/// One authority per GPU: a daemon off the system bus (a desktop's session
/// daemon) leaves alone the GPUs the system bus's daemon manages, and says
/// so; with no system daemon it manages them itself.
#[test]
fn a_session_daemon_leaves_the_system_daemons_gpus_alone() {
    let fx_dir = tempfile::tempdir().unwrap();
    let fx = fx_dir.path().join("gpus.txt");
    fixture(&fx, &[rtx(0, 0), l4(0)], &[]);
    let lib = fake_lib(false);
    // The "system" daemon, on its own bus.
    let sys_dir = tempfile::tempdir().unwrap();
    let system_bus = Bus::session();
    let _system = start(&system_bus, sys_dir.path(), &lib, &fx, "");
    let listed = |a: &str| manager(a, None, "ListGpus", &[]).stdout;
    assert!(listed(&system_bus.address).starts_with("a(usssddddsss) 2"));
    // A second daemon whose system bus is that one: it takes neither GPU.
    let user_dir = tempfile::tempdir().unwrap();
    let user_bus = Bus::session();
    std::fs::write(
        user_dir.path().join("node.toml"),
        format!(
            "machine = \"majin\"\n[inventory]\nrefresh_seconds = 0.2\nwsl = false\nnvml_library = \"{}\"\n",
            lib.display()
        ),
    )
    .unwrap();
    let user = Daemon::start_with(
        &user_bus,
        user_dir.path(),
        None,
        &[
            ("FAKE_NVML_FIXTURE", fx.to_str().unwrap()),
            ("DBUS_SYSTEM_BUS_ADDRESS", &system_bus.address),
        ],
    );
    assert_eq!(listed(&user_bus.address).trim(), "a(usssddddsss) 0");
    assert!(
        user.log_text().contains(
            "GPU GPU-4060 is managed by the system's astraeusd: this daemon leaves it alone"
        ),
        "{}",
        user.log_text()
    );
    let o = manager(
        &user_bus.address,
        None,
        "SubmitWorker",
        &["s", &shared_spec("x", "1")],
    );
    assert!(
        o.stderr.contains("can never be placed on majin"),
        "nothing to place on: {}",
        o.stderr
    );
    // Without a system daemon it manages them itself.
    drop(user);
    let alone_dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        user_dir.path().join("node.toml"),
        alone_dir.path().join("node.toml"),
    )
    .unwrap();
    let nobody = Bus::session();
    let _alone = Daemon::start_with(
        &user_bus,
        alone_dir.path(),
        None,
        &[
            ("FAKE_NVML_FIXTURE", fx.to_str().unwrap()),
            ("DBUS_SYSTEM_BUS_ADDRESS", &nobody.address),
        ],
    );
    assert!(listed(&user_bus.address).starts_with("a(usssddddsss) 2"));
}

/// Two user daemons on one host (no system daemon to defer to): the second
/// finds the per-GPU locks the first holds and leaves both GPUs alone,
/// saying so; once the first is gone, it takes them.
#[test]
fn a_second_daemon_leaves_the_gpus_another_holds_alone() {
    let fx_dir = tempfile::tempdir().unwrap();
    let fx = fx_dir.path().join("gpus.txt");
    fixture(&fx, &[rtx(0, 0), l4(0)], &[]);
    let lib = fake_lib(false);
    let locks = tempfile::tempdir().unwrap();
    let config = format!(
        "machine = \"majin\"\n[inventory]\nrefresh_seconds = 0.2\nwsl = false\nnvml_library = \"{}\"\n",
        lib.display()
    );
    let daemon = |dir: &Path, bus: &Bus| {
        std::fs::write(dir.join("node.toml"), &config).unwrap();
        Daemon::start_with(
            bus,
            dir,
            None,
            &[
                ("FAKE_NVML_FIXTURE", fx.to_str().unwrap()),
                ("ASTRAEUS_GPU_LOCK_DIR", locks.path().to_str().unwrap()),
                // No system bus: nothing to defer to but the locks.
                ("DBUS_SYSTEM_BUS_ADDRESS", "unix:path=/nonexistent"),
            ],
        )
    };
    let listed = |a: &str| manager(a, None, "ListGpus", &[]).stdout;
    let (first_dir, first_bus) = (tempfile::tempdir().unwrap(), Bus::session());
    let first = daemon(first_dir.path(), &first_bus);
    assert!(listed(&first_bus.address).starts_with("a(usssddddsss) 2"));
    let (second_dir, second_bus) = (tempfile::tempdir().unwrap(), Bus::session());
    let second = daemon(second_dir.path(), &second_bus);
    assert_eq!(listed(&second_bus.address).trim(), "a(usssddddsss) 0");
    assert!(
        second
            .log_text()
            .contains("GPU GPU-4060 is managed by another astraeusd"),
        "{}",
        second.log_text()
    );
    // The first ends: its locks go with it, and the second takes the GPUs.
    first.stop();
    eventually("the second daemon takes both GPUs", || {
        listed(&second_bus.address).starts_with("a(usssddddsss) 2")
    });
}

/// Memory health from each source a board has: retired pages on older
/// boards, row remapping on A100/H100 (whose retired-pages query answers
/// NOT_SUPPORTED: it must not read as "healthy, checked"), uncorrected ECC
/// errors; a query refused for want of permission is said once and judged
/// without; a board with none of them is said to be judged by its queries
/// answering; a GPU that recovers (reset) is healthy again; a GPU NVML stops
/// listing stays in view, unhealthy.
#[test]
fn memory_health_is_read_from_each_source_the_board_has() {
    let dir = open_tempdir();
    let fx = dir.path().join("gpus.txt");
    let board = |uuid, name, extra| Gpu {
        uuid,
        name,
        total: 16 * GB,
        used: 0,
        reserved: 0,
        extra,
    };
    let boards = |a100: &'static str, with_l4: bool| {
        let mut v = vec![
            board("GPU-V100", "Tesla V100", "retired=1"),
            board("GPU-A100", "NVIDIA A100", a100),
            board(
                "GPU-H100",
                "NVIDIA H100",
                "retired=notsup remap=failed ecc=3",
            ),
            board("GPU-4060", "NVIDIA GeForce RTX 4060", "retired=notsup"),
        ];
        if with_l4 {
            v.push(board(
                "GPU-L4",
                "NVIDIA L4",
                "retired=noperm remap=none ecc=0",
            ));
        }
        v
    };
    fixture(&fx, &boards("retired=notsup remap=pending", true), &[]);
    let bus = Bus::session();
    let d = start(&bus, dir.path(), &fake_lib(false), &fx, "");
    let a = &bus.address;
    let health = |i: u32| {
        let p = format!("/org/astraeus/Node1/gpu/{i}");
        (
            prop(a, &p, "org.astraeus.Node1.Gpu", "Healthy"),
            prop(a, &p, "org.astraeus.Node1.Gpu", "Health"),
        )
    };
    eventually("the GPUs read", || health(4).0 == "b true\n");
    let unhealthy = |i: u32, why: &str| {
        let (healthy, text) = health(i);
        assert_eq!(healthy, "b false\n", "GPU {i}: {text}");
        assert!(text.contains(why), "GPU {i}: {text}");
    };
    unhealthy(0, "retired pages are pending (a GPU reset retires them)");
    unhealthy(
        1,
        "rows are waiting to be remapped (a GPU reset remaps them)",
    );
    unhealthy(
        2,
        "row remapping failed (the GPU needs service); 3 uncorrected ECC errors since the driver loaded",
    );
    assert_eq!(health(3).0, "b true\n");
    let log = d.log_text();
    assert!(
        log.contains(
            "GPU 3 reports neither retired pages, row remapping nor ECC errors: \
             its health is judged by its NVML queries answering"
        ),
        "{log}"
    );
    assert!(
        log.contains(
            "GPU 4: NVML does not tell its retired pages (the current user does not have \
             permission to perform this operation); its health is judged without it"
        ),
        "{log}"
    );
    // Said once, not at every refresh: two readings later (each seen, as
    // GPU 3's outside use moves) it is still one line.
    for gb in [1, 2] {
        let mut moved = boards("retired=notsup remap=pending", true);
        moved[3].used = gb * GB;
        fixture(&fx, &moved, &[]);
        let outside = format!("d {gb}\n");
        eventually("a reading after the line", || {
            prop(
                a,
                "/org/astraeus/Node1/gpu/3",
                "org.astraeus.Node1.Gpu",
                "HeldOutsideGb",
            ) == outside
        });
    }
    assert_eq!(d.log_text().matches("does not tell its").count(), 1);

    // The A100 was reset (rows remapped); the L4 fell off the bus.
    fixture(&fx, &boards("retired=notsup remap=none ecc=0", false), &[]);
    eventually("the A100 healthy again", || health(1).0 == "b true\n");
    eventually("the L4 flagged", || health(4).0 == "b false\n");
    unhealthy(4, "NVML no longer lists it");
    assert!(
        d.log_text()
            .contains("GPU 4 (GPU-L4) is no longer listed by NVML"),
        "{}",
        d.log_text()
    );
    // It comes back.
    fixture(&fx, &boards("retired=notsup remap=none ecc=0", true), &[]);
    eventually("the L4 back", || health(4).0 == "b true\n");
}

/// With no `nvml_library` set, the driver's library is found by its name the
/// way the dynamic loader finds it (here: LD_LIBRARY_PATH), as on a host
/// with the driver installed.
#[test]
fn nvml_is_found_by_name_when_no_path_is_set() {
    let dir = open_tempdir();
    let fx = dir.path().join("gpus.txt");
    fixture(&fx, &[rtx(GB, 0)], &[]);
    let libdir = dir.path().join("lib");
    std::fs::create_dir_all(&libdir).unwrap();
    std::fs::copy(fake_lib(false), libdir.join("libnvidia-ml.so.1")).unwrap();
    std::fs::write(
        dir.path().join("node.toml"),
        "machine = \"majin\"\n[inventory]\nrefresh_seconds = 0.2\nwsl = false\n",
    )
    .unwrap();
    let bus = Bus::session();
    let _d = Daemon::start_with(
        &bus,
        dir.path(),
        None,
        &[
            ("FAKE_NVML_FIXTURE", fx.to_str().unwrap()),
            ("LD_LIBRARY_PATH", libdir.to_str().unwrap()),
        ],
    );
    let o = ctl(&bus.address, None, &["--no-legend", "gpus"]);
    assert!(
        o.stdout.starts_with("0    NVIDIA GeForce RTX 4060  8 GB"),
        "{}",
        o.stdout
    );
    // Without it there, the search is named: the name, then WSL's directory.
    let out = Command::new(env!("CARGO_BIN_EXE_astraeusd"))
        .args(["--bus-address", &Bus::session().address, "--state-dir"])
        .arg(dir.path().join("state2"))
        .arg("--config")
        .arg(dir.path().join("node.toml"))
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("tried: libnvidia-ml.so.1 (")
            && err.contains("/usr/lib/wsl/lib/libnvidia-ml.so.1 ("),
        "{err}"
    );
}

/// Critical XID events, read at every refresh: an application's fault (13,
/// 31) leaves the GPU's health alone; one that means the GPU needs a reset
/// (79: fallen off the bus) makes it unhealthy, and it stays so; a board
/// without events is said once.
#[test]
fn a_gpu_that_reports_a_fatal_xid_is_unhealthy_within_a_refresh() {
    let dir = open_tempdir();
    let fx = dir.path().join("gpus.txt");
    let with = |gpu1: &'static str| {
        fixture(
            &fx,
            &[
                Gpu {
                    extra: "events=notsup",
                    ..rtx(GB, 0)
                },
                Gpu {
                    extra: gpu1,
                    ..l4(0)
                },
            ],
            &[],
        )
    };
    with("");
    let bus = Bus::session();
    let d = start(&bus, dir.path(), &fake_lib(false), &fx, "");
    let a = &bus.address;
    let health = || {
        prop(
            a,
            "/org/astraeus/Node1/gpu/1",
            "org.astraeus.Node1.Gpu",
            "Health",
        )
    };
    eventually("GPU 0 said to have no events", || {
        d.log_text().contains("GPU 0 reports no XID events")
    });
    assert_eq!(health(), "s \"ok\"\n");
    // An application's fault.
    with("xid=13");
    eventually("XID 13 read", || {
        d.log_text()
            .contains("GPU 1 reported XID 13 (an application's fault, not the GPU's)")
    });
    assert_eq!(health(), "s \"ok\"\n");
    // The GPU itself fails.
    with("xid=13,79");
    eventually("GPU 1 unhealthy", || {
        health()
            == "s \"it reported XID 79 (it fell off the bus); reset it, then restart astraeusd\"\n"
    });
    assert!(d
        .log_text()
        .contains("GPU 1 reported XID 79 (it fell off the bus): it takes no new work"));
    // It stays so: a later event is read, and the GPU is still unhealthy.
    with("xid=13,79,31");
    eventually("XID 31 read", || {
        d.log_text().contains("GPU 1 reported XID 31")
    });
    assert!(health().contains("XID 79"), "{}", health());
    let o = manager(a, None, "SubmitWorker", &["s", &shared_spec("after", "20")]);
    assert!(
        o.stdout.contains("pending"),
        "no new work on it: {}",
        o.stdout
    );
}

/// `inventory.baseboard` names a GPU by UUID or by PCI address however it
/// is written (lspci's `0000:01:00.0`, NVML's `00000000:01:00.0`): that GPU
/// is time-sliced, never offered to shared work; an entry that names no GPU
/// here is said at the start (it would leave the GPU it meant offered), as
/// is an access group the host does not have.
#[test]
fn a_baseboard_gpu_is_named_by_uuid_or_any_form_of_its_pci_address() {
    let dir = open_tempdir();
    let lib = fake_lib(false);
    let fx = dir.path().join("gpus.txt");
    fixture(&fx, &[rtx(0, 0), l4(0)], &[]);
    let bus = Bus::session();
    let d = start(
        &bus,
        dir.path(),
        &lib,
        &fx,
        "baseboard = [\"0000:01:00.0\", \"GPU-bbbbb\"]\n[access]\ngroup = \"no-such-group-xyz\"\n",
    );
    let a = &bus.address;
    let mode = |i: u32| {
        prop(
            a,
            &format!("/org/astraeus/Node1/gpu/{i}"),
            "org.astraeus.Node1.Gpu",
            "Mode",
        )
    };
    assert_eq!(mode(0), "s \"free\"\n");
    assert_eq!(mode(1), "s \"time-sliced\"\n");
    let log = d.log_text();
    assert!(
        log.contains("inventory.baseboard: GPU-bbbbb is none of this machine's GPUs"),
        "{log}"
    );
    assert!(!log.contains("0000:01:00.0 is none"), "{log}");
    // So is an access group the host does not have (only root could work).
    assert!(
        log.contains("access.group: no group named no-such-group-xyz on this host"),
        "{log}"
    );
}

/// What a sharer uses beyond its share is drawn on the machine page as
/// what it is (neither outside Astraeus nor free), in headless Chromium
/// with and without JavaScript.
#[test]
fn the_page_draws_use_beyond_a_share_apart_from_outside_and_free() {
    if !require_component(webdriver::available(), "chromium and chromium-driver") {
        return;
    }
    let dir = open_tempdir();
    let fx = dir.path().join("gpus.txt");
    let mut holder = sleeper();
    let mut desktop = sleeper();
    let pid = holder.id();
    fixture(&fx, &[rtx(0, 0)], &[]);
    let port = free_port();
    let bus = Bus::session();
    let _d = start(
        &bus,
        dir.path(),
        &fake_lib(false),
        &fx,
        &format!("[http]\nlisten = \"127.0.0.1:{port}\"\n"),
    );
    let a = &bus.address;
    let spec = format!(
        r#"{{"name":"listen","holders":[{pid}],"requested_resources":{{"gpu_requests":{{"shared":true,"memory_gb":2.5}}}}}}"#
    );
    assert!(manager(a, None, "SubmitWorker", &["s", &spec]).ok);
    // The holder uses 3 GB of its 2.5 GB share; a desktop holds 1 GB.
    fixture(
        &fx,
        &[rtx(4 * GB, 0)],
        &[
            (0, pid, 3 * GB, "compute"),
            (0, desktop.id(), GB, "graphics"),
        ],
    );
    eventually("the reading taken", || {
        prop(
            a,
            "/org/astraeus/Node1/gpu/0",
            "org.astraeus.Node1.Gpu",
            "OfferedGb",
        ) == "d 6.5\n"
    });
    let bar = [
        "listen 2.5 GB",
        "outside 1 GB",
        "beyond shares 0.5 GB",
        "free 4 GB",
    ];
    let offers = "offers 6.5 of its 8 GB (1 GB held outside Astraeus, 0.5 GB used beyond shares)";
    let url = format!("http://127.0.0.1:{port}/");
    let served = webdriver::Browser::start_without_javascript().unwrap();
    served.navigate(&url).unwrap();
    assert_eq!(served.texts(".gpu .seg"), bar);
    assert_eq!(served.text(".gpu .offers").as_deref(), Some(offers));
    let live = webdriver::Browser::start().unwrap();
    live.navigate(&url).unwrap();
    live.wait_for(
        "#updated",
        |t| !t.is_empty(),
        std::time::Duration::from_secs(10),
    )
    .unwrap();
    assert_eq!(live.texts(".gpu .seg"), bar);
    assert_eq!(live.text(".gpu .offers").as_deref(), Some(offers));
    assert_eq!(
        live.texts(".gpu .legend span"),
        [
            "listen 2.5 GB",
            "outside Astraeus 1 GB",
            "used beyond shares 0.5 GB",
            "free 4 GB",
            "measured use 3 GB"
        ]
    );
    for p in [&mut holder, &mut desktop] {
        let _ = p.kill();
        let _ = p.wait();
    }
}

/// On a real host power, the energy counter and utilisation move at every
/// refresh, and they place nothing: a waiting worker's reasons read before
/// are not invalidated for them (each refresh told every reader of a reason
/// to read it again: `astraeusctl events` printed each wait every 2 s).
/// Outside use moving is a change of the machine: then they are.
#[test]
fn readings_that_place_nothing_invalidate_no_reason() {
    let dir = open_tempdir();
    let fx = dir.path().join("gpus.txt");
    fixture(&fx, &[rtx(0, 0)], &[]);
    let bus = Bus::session();
    let _d = start(&bus, dir.path(), &fake_lib(false), &fx, "");
    let a = &bus.address;
    assert!(manager(a, None, "SubmitWorker", &["s", &shared_spec("big", "6")]).ok);
    let o = manager(a, None, "SubmitWorker", &["s", &shared_spec("p", "4")]);
    assert!(o.stdout.contains("pending"), "{}", o.stdout);
    let log = dir.path().join("monitor.log");
    let mut watch = monitor(
        a,
        "type='signal',path='/org/astraeus/Node1/worker/p',member='PropertiesChanged'",
        &log,
    );
    let reasons = || {
        prop(
            a,
            "/org/astraeus/Node1/worker/p",
            "org.astraeus.Node1.Worker",
            "PendingReasons",
        )
    };
    assert!(reasons().contains("it needs 4"), "{}", reasons());
    // Power and energy move (as at every refresh of a real host).
    let moved = |from: &str, to: &str| {
        let text = std::fs::read_to_string(&fx).unwrap();
        let tmp = fx.with_extension("tmp");
        std::fs::write(&tmp, text.replace(from, to)).unwrap();
        std::fs::rename(tmp, &fx).unwrap();
    };
    moved("power=60000 energy=1000", "power=70000 energy=5000");
    eventually("the new power read", || {
        prop(
            a,
            "/org/astraeus/Node1/gpu/0",
            "org.astraeus.Node1.Gpu",
            "PowerW",
        ) == "d 70\n"
    });
    std::thread::sleep(std::time::Duration::from_millis(600));
    let told = || {
        std::fs::read_to_string(&log)
            .unwrap()
            .contains("PendingReasons")
    };
    assert!(!told(), "{}", std::fs::read_to_string(&log).unwrap());
    // Outside use grows by 1 GB: p's reasons differ, and its reader is told.
    moved("used=0 ", &format!("used={} ", GB));
    eventually("the reader of p's reasons told", told);
    let _ = watch.kill();
    let _ = watch.wait();
}
