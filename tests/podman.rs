//! Container workers on real podman (runc, a busybox image imported from a
//! tarball built here, a CDI spec written here), driven over a real bus.
//! Set ASTRAEUS_REQUIRE_COMPONENTS=1 (CI does) to fail instead of skipping
//! when podman is missing.

mod common;
#[path = "common/fake_nvml.rs"]
mod fake_nvml;
#[path = "common/hanging_stop.rs"]
mod hanging_stop;
#[path = "common/podman.rs"]
mod podman;
use common::*;
use podman::{available, Podman, UUID};
use std::path::Path;

fn container(name: &str, gb: Option<&str>, script: &str) -> String {
    let gpu = match gb {
        Some(gb) => format!(r#""gpu_requests":{{"shared":true,"memory_gb":{gb}}},"#),
        None => String::new(),
    };
    format!(
        r#"{{"name":"{name}","requested_resources":{{{gpu}"cpu_cores":1,"memory_bytes":268435456}},
            "run":{{"container":{{"image":"localhost/bb","command":["sh","-c",{}],"env":{{"TOKEN":"s3cret"}}}}}}}}"#,
        serde_json::to_string(script).unwrap()
    )
}

/// Submits a shared container of `gb` GB named `name` that sleeps, and
/// waits until it runs.
fn run_sleeper(a: &str, name: &str, gb: &str) {
    let o = manager(
        a,
        None,
        "SubmitWorker",
        &["s", &container(name, Some(gb), "sleep 1000")],
    );
    assert!(o.ok, "{}", o.stderr);
    eventually("running", || state(a, name) == "s \"running\"\n");
}

fn setup(dir: &Path, pm: &Podman, bus: &Bus) -> Daemon {
    setup_with(dir, pm, bus, &[])
}

/// [`setup`] with more environment for the daemon (failpoints).
fn setup_with(dir: &Path, pm: &Podman, bus: &Bus, env: &[(&str, &str)]) -> Daemon {
    std::fs::write(
        dir.join("node.toml"),
        format!(
            "[inventory]\nrefresh_seconds = 0.5\n[runtime]\npodman_socket = \"{}\"\nstop_timeout_seconds = 1\n",
            pm.socket().display()
        ),
    )
    .unwrap();
    std::fs::write(dir.join("majin.toml"), MAJIN_TOML).unwrap();
    Daemon::start(bus, dir, &dir.join("majin.toml"), env)
}

#[test]
fn a_container_gets_its_share_device_and_limits_and_its_exit_frees_the_share() {
    if !available() {
        return;
    }
    let dir = open_tempdir();
    let pm = Podman::start(dir.path());
    let bus = Bus::session();
    let d = setup(dir.path(), &pm, &bus);
    let a = &bus.address;

    let script = "echo GB=$ASTRAEUS_GPU_MEMORY_GB CDI=$SEEN_CDI MEM=$(cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max) NNP=$(awk '/^NoNewPrivs/ {print $2}' /proc/self/status); sleep 3; exit 3";
    let o = manager(
        a,
        None,
        "SubmitWorker",
        &["s", &container("listen", Some("4"), script)],
    );
    assert!(o.ok, "{}", o.stderr);
    // A reservation that does not fit beside it waits.
    let o = manager(a, None, "SubmitWorker", &["s", &shared_spec("voice", "4")]);
    assert!(o.stdout.contains("pending"), "{}", o.stdout);
    eventually("listen running", || state(a, "listen") == "s \"running\"\n");
    let mut logs = String::new();
    eventually("container output", || {
        logs = pm.run(&["logs", "astraeus-listen"]);
        logs.contains("GB=")
    });
    assert!(
        logs.contains(&format!("GB=4 CDI={UUID} MEM=268435456 NNP=1")),
        "{logs}"
    );
    // The request's env is the owner's and root's to see (root here).
    assert!(busctl(
        a,
        &[
            "get-property",
            "org.astraeus.Node1",
            "/org/astraeus/Node1/worker/listen",
            "org.astraeus.Node1.Worker",
            "Request"
        ]
    )
    .stdout
    .contains("s3cret"));
    // And in the listing of every object (its caller learnt once for all).
    let listing = busctl(
        a,
        &[
            "call",
            "org.astraeus.Node1",
            "/org/astraeus/Node1",
            "org.freedesktop.DBus.ObjectManager",
            "GetManagedObjects",
        ],
    );
    assert!(listing.stdout.contains("s3cret"), "{}", listing.stdout);

    // It exits with status 3: the share frees and voice is placed.
    eventually("voice placed after listen exited", || {
        state(a, "voice") == "s \"running\"\n"
    });
    assert!(gone(a, "listen"));
    assert!(
        d.log_text().contains("worker listen exited with status 3"),
        "{}",
        d.log_text()
    );
    eventually("container removed", || {
        !pm.run(&["ps", "-a"]).contains("astraeus-listen")
    });
}

#[test]
fn stop_stops_the_container_and_a_restart_adopts_what_runs() {
    if !available() {
        return;
    }
    let dir = open_tempdir();
    let pm = Podman::start(dir.path());
    let bus = Bus::session();
    let d = setup(dir.path(), &pm, &bus);
    let a = &bus.address;

    for name in ["one", "two"] {
        run_sleeper(a, name, "1");
    }
    let id_one = pm.run(&["inspect", "--format", "{{.Id}}", "astraeus-one"]);

    // Its control group is recorded, and the container's process is in it:
    // that is how its GPU memory counts as the worker's, not as outside use.
    let pid: u32 = pm
        .run(&["inspect", "--format", "{{.State.Pid}}", "astraeus-one"])
        .trim()
        .parse()
        .unwrap();
    let mut cgroup = String::new();
    eventually("cgroup recorded", || {
        let db = rusqlite::Connection::open(d.state.join("ledger.db")).unwrap();
        cgroup = db
            .query_row(
                "SELECT cgroup FROM workers WHERE name = 'one' AND state = 'running'",
                [],
                |r| r.get::<_, Option<String>>(0),
            )
            .unwrap()
            .unwrap_or_default();
        !cgroup.is_empty()
    });
    // The kernel's own word on where the container's process lives
    // (/proc/PID/cgroup: `0::/path` on cgroup v2), not the daemon's reading.
    let kernel = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let path = kernel
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap_or_else(|| panic!("no cgroup v2 line: {kernel}"));
    assert!(
        path == cgroup || path.starts_with(&format!("{cgroup}/")),
        "{pid} is in {path}, the ledger says {cgroup}"
    );

    // kill -9 the daemon; while it is down, "two" ends.
    let mut d = d;
    d.child.kill().unwrap();
    d.child.wait().unwrap();
    pm.run(&["stop", "-t", "0", "astraeus-two"]);
    // When podman says it ended (the list API the daemon reads has seconds).
    let finished_s: i64 = pm
        .run(&[
            "inspect",
            "--format",
            "{{.State.FinishedAt.Unix}}",
            "astraeus-two",
        ])
        .trim()
        .parse()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(3));
    let d = Daemon::start(&bus, dir.path(), &dir.path().join("majin.toml"), &[]);
    // "one" is adopted, not started again; "two" is marked ended and its share freed.
    eventually("one adopted", || state(a, "one") == "s \"running\"\n");
    assert_eq!(
        pm.run(&["inspect", "--format", "{{.Id}}", "astraeus-one"]),
        id_one
    );
    assert_eq!(
        pm.run(&["ps", "-a", "--format", "{{.Names}}"])
            .matches("astraeus-one")
            .count(),
        1
    );
    eventually("two ended", || gone(a, "two"));
    // It ended when podman says it did (billed until then), not when the
    // restarted daemon noticed, three seconds later.
    let ended_ms: i64 = rusqlite::Connection::open(d.state.join("ledger.db"))
        .unwrap()
        .query_row("SELECT ended_ms FROM workers WHERE name = 'two'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(ended_ms, finished_s * 1000, "podman's FinishedAt");
    assert!(
        d.log_text()
            .contains("adopted the running workload of worker one"),
        "{}",
        d.log_text()
    );
    assert_eq!(
        busctl(
            a,
            &[
                "get-property",
                "org.astraeus.Node1",
                "/org/astraeus/Node1/gpu/0",
                "org.astraeus.Node1.Gpu",
                "TakenGb"
            ]
        )
        .stdout,
        "d 1\n"
    );

    // StopWorker: graceful, then forced; the share frees once it is gone.
    assert!(manager(a, None, "StopWorker", &["s", "one"]).ok);
    eventually("one gone", || gone(a, "one"));
    eventually("container removed", || {
        !pm.run(&["ps", "-a"]).contains("astraeus-one")
    });
    assert_eq!(
        busctl(
            a,
            &[
                "get-property",
                "org.astraeus.Node1",
                "/org/astraeus/Node1/gpu/0",
                "org.astraeus.Node1.Gpu",
                "TakenGb"
            ]
        )
        .stdout,
        "d 0\n"
    );
}

#[test]
fn a_crash_between_create_and_start_neither_loses_nor_doubles_the_workload() {
    if !available() {
        return;
    }
    let dir = open_tempdir();
    let pm = Podman::start(dir.path());
    let bus = Bus::session();
    std::fs::write(
        dir.path().join("node.toml"),
        format!("[runtime]\npodman_socket = \"{}\"\n", pm.socket().display()),
    )
    .unwrap();
    std::fs::write(dir.path().join("majin.toml"), MAJIN_TOML).unwrap();
    let sim = dir.path().join("majin.toml");
    let mut d = Daemon::start(
        &bus,
        dir.path(),
        &sim,
        &[("ASTRAEUS_FAILPOINTS", "podman.after-create=kill")],
    );
    let _ = manager(
        &bus.address,
        None,
        "SubmitWorker",
        &["s", &container("w", Some("1"), "sleep 1000")],
    );
    let status = d.child.wait().unwrap();
    assert!(!status.success(), "the failpoint killed the daemon");
    // The container exists (created), the ledger holds the worker without a runtime id.
    assert!(pm
        .run(&["ps", "-a", "--format", "{{.Names}}"])
        .contains("astraeus-w"));
    let _d = Daemon::start(&bus, dir.path(), &sim, &[]);
    eventually("w running after restart", || {
        state(&bus.address, "w") == "s \"running\"\n"
    });
    let names = pm.run(&["ps", "-a", "--format", "{{.Names}} {{.State}}"]);
    assert_eq!(names.matches("astraeus-w").count(), 1, "{names}");
    assert!(names.contains("astraeus-w Up"), "{names}");
}

#[test]
fn podman_going_away_does_not_free_a_share_whose_container_still_runs() {
    if !available() {
        return;
    }
    let dir = open_tempdir();
    let mut pm = Podman::start(dir.path());
    let bus = Bus::session();
    let d = setup(dir.path(), &pm, &bus);
    let a = &bus.address;
    run_sleeper(a, "held", "3");
    // Podman's API goes away (restarted, upgraded): the container runs on.
    let _ = pm.service.kill();
    let _ = pm.service.wait();
    // The daemon saw it go, and waited on (its wait retried once, 2 s later).
    eventually("the wait retried", || {
        d.log_text().matches("waiting for container").count() >= 2
    });
    assert_eq!(state(a, "held"), "s \"running\"\n", "{}", d.log_text());
    assert!(pm
        .run(&["ps", "--format", "{{.Names}}"])
        .contains("astraeus-held"));
    // It comes back; a stop then goes through and frees the share.
    pm.service = pm.serve();
    assert!(manager(a, None, "StopWorker", &["s", "held"]).ok);
    eventually("held gone", || gone(a, "held"));
    assert!(d.log_text().contains("retrying"), "{}", d.log_text());
}

/// A restart while podman's API is away (restarted with the daemon): the
/// listing that reconciles fails, and is asked again until it answers;
/// then the container is adopted and watched, and its exit frees its share.
/// A worker launched by this run before the late listing answers is this
/// run's own: not adopted again, nor ended as vanished, nor launched twice
/// (each listing is held 3 s on its way to the loop).
#[test]
fn a_restart_while_podman_is_away_adopts_its_containers_once_it_answers() {
    if !available() {
        return;
    }
    let dir = open_tempdir();
    let mut pm = Podman::start(dir.path());
    let bus = Bus::session();
    let mut d = setup(dir.path(), &pm, &bus);
    let a = &bus.address;
    run_sleeper(a, "kept", "2");
    d.child.kill().unwrap();
    d.child.wait().unwrap();
    let _ = pm.service.kill();
    let _ = pm.service.wait();

    let held = [("ASTRAEUS_FAILPOINTS", "runtime.listed=pause3000@all")];
    let d = Daemon::start(&bus, dir.path(), &dir.path().join("majin.toml"), &held);
    eventually("the listing failed", || {
        d.log_text()
            .contains("cannot reconcile Container workloads")
    });
    pm.service = pm.serve();
    run_sleeper(a, "fresh", "1");
    eventually("kept adopted", || {
        d.log_text()
            .contains("adopted the running workload of worker kept")
    });
    // The late listing has been reconciled: fresh is as it was.
    assert_eq!(state(a, "fresh"), "s \"running\"\n", "{}", d.log_text());
    let log = d.log_text();
    assert!(!log.contains("worker fresh failed"), "{log}");
    assert!(
        !log.contains("adopted the running workload of worker fresh"),
        "{log}"
    );
    let names = pm.run(&["ps", "-a", "--format", "{{.Names}}"]);
    assert_eq!(names.matches("astraeus-fresh").count(), 1, "{names}");
    // Watched: an exit is seen and frees its share.
    pm.run(&["stop", "-t", "0", "astraeus-kept"]);
    eventually("kept gone", || gone(a, "kept"));
}

#[test]
fn podman_gone_at_launch_fails_the_worker_and_frees_its_share() {
    if !available() {
        return;
    }
    let dir = open_tempdir();
    let mut pm = Podman::start(dir.path());
    let bus = Bus::session();
    let d = setup(dir.path(), &pm, &bus);
    let a = &bus.address;
    // Podman's API is down when the worker is placed.
    let _ = pm.service.kill();
    let _ = pm.service.wait();
    let o = manager(
        a,
        None,
        "SubmitWorker",
        &["s", &container("late", Some("3"), "sleep 1000")],
    );
    assert!(o.ok, "{}", o.stderr);
    eventually("late ended", || gone(a, "late"));
    assert!(
        d.log_text().contains("worker late failed to start:"),
        "{}",
        d.log_text()
    );
    // Its share is free: the whole offer is there for the next one.
    let o = manager(a, None, "WhyNot", &["s", &shared_spec("next", "7")]);
    assert!(o.stdout.starts_with("bauas true"), "{}", o.stdout);
    // Podman back: nothing of the failed launch exists or appears, by the
    // time the daemon has launched through it again.
    pm.service = pm.serve();
    let o = manager(
        a,
        None,
        "SubmitWorker",
        &["s", &container("next", Some("3"), "sleep 1000")],
    );
    assert!(o.ok, "{}", o.stderr);
    eventually("next running", || state(a, "next") == "s \"running\"\n");
    assert!(!pm
        .run(&["ps", "-a", "--format", "{{.Names}}"])
        .contains("astraeus-late"));
    assert!(manager(a, None, "StopWorker", &["s", "next"]).ok);
    eventually("next gone", || gone(a, "next"));
}

/// A container's processes are its worker's own: the GPU memory a process
/// in its control group uses counts as the worker's use, never as memory
/// held outside Astraeus (the fake NVML lists the container's own pid).
#[test]
fn a_containers_gpu_memory_is_its_own_not_held_outside() {
    if !available() {
        return;
    }
    const GB: u64 = 1 << 30;
    let dir = open_tempdir();
    let pm = Podman::start(dir.path());
    let bus = Bus::session();
    let fx = dir.path().join("gpus.txt");
    let hardware = |used: u64, procs: &str| fake_nvml::one_l4(&fx, UUID, used, procs);
    hardware(0, "");
    std::fs::write(
        dir.path().join("node.toml"),
        format!(
            "machine = \"majin\"\n[inventory]\nrefresh_seconds = 0.5\nwsl = false\nnvml_library = \"{}\"\n\
             [runtime]\npodman_socket = \"{}\"\nstop_timeout_seconds = 1\n",
            fake_nvml::fake_lib(false).display(),
            pm.socket().display()
        ),
    )
    .unwrap();
    let d = Daemon::start_with(
        &bus,
        dir.path(),
        None,
        &[("FAKE_NVML_FIXTURE", fx.to_str().unwrap())],
    );
    let a = &bus.address;
    let o = manager(
        a,
        None,
        "SubmitWorker",
        &["s", &container("c", Some("4"), "sleep 600")],
    );
    assert!(o.ok, "{}", o.stderr);
    eventually("c running", || state(a, "c") == "s \"running\"\n");
    let pid = pm
        .run(&["inspect", "--format", "{{.State.Pid}}", "astraeus-c"])
        .trim()
        .to_string();
    assert!(pid.parse::<u32>().is_ok(), "{pid}");
    // The container's process takes 3 GB of its 4 GB share.
    hardware(
        3 * GB,
        &format!("proc gpu=0 pid={pid} mem={} kind=compute\n", 3 * GB),
    );
    let prop = |path: &str, iface: &str, name: &str| {
        busctl(
            a,
            &["get-property", "org.astraeus.Node1", path, iface, name],
        )
        .stdout
    };
    eventually("its use read as its own", || {
        prop(
            "/org/astraeus/Node1/worker/c",
            "org.astraeus.Node1.Worker",
            "GpuUsedGb",
        ) == "d 3\n"
    });
    assert_eq!(
        prop(
            "/org/astraeus/Node1/gpu/0",
            "org.astraeus.Node1.Gpu",
            "HeldOutsideGb"
        ),
        "d 0\n",
        "{}",
        d.log_text()
    );
    assert!(manager(a, None, "StopWorker", &["s", "c"]).ok);
    eventually("c gone", || gone(a, "c"));
}

/// A container given a whole GPU gets that GPU's device (through CDI) and
/// its whole memory in ASTRAEUS_GPU_MEMORY_GB (8 GB on majin).
/// The workers' control groups are looked in off the loop's thread, with
/// the inventory's re-read (a member's unit may hold thousands of tasks in
/// nested groups): held there 6 s, the look holds no call.
#[test]
fn looking_in_a_containers_control_group_holds_no_one_else() {
    if !available() {
        return;
    }
    let dir = open_tempdir();
    let pm = Podman::start(dir.path());
    let bus = Bus::session();
    let d = setup_with(
        dir.path(),
        &pm,
        &bus,
        &[("ASTRAEUS_FAILPOINTS", "cgroups.walk=pause6000")],
    );
    let a = &bus.address;
    let o = manager(
        a,
        None,
        "SubmitWorker",
        &["s", &container("c", Some("4"), "sleep 600")],
    );
    assert!(o.ok, "{}", o.stderr);
    eventually("c running", || state(a, "c") == "s \"running\"\n");
    assert!(!d.log_text().contains("failpoint cgroups.walk reached"));
    // A new reading of the machine (the sim file changed) looks in c's group.
    let sim = dir.path().join("majin.toml");
    let text = std::fs::read_to_string(&sim).unwrap();
    std::fs::write(&sim, text.replace("outside_gb = 1", "outside_gb = 2")).unwrap();
    eventually("the look is held", || {
        d.log_text().contains("failpoint cgroups.walk reached")
    });
    let o = manager_spec_within(a, None, 5, "SubmitWorker", &shared_spec("meanwhile", "1"));
    assert!(o.ok, "a submit waited on the look: {}", o.stderr);
    let outside = || {
        busctl(
            a,
            &[
                "get-property",
                "org.astraeus.Node1",
                "/org/astraeus/Node1/gpu/0",
                "org.astraeus.Node1.Gpu",
                "HeldOutsideGb",
            ],
        )
        .stdout
    };
    assert_eq!(
        outside().trim(),
        "d 1",
        "the reading ended before the submit"
    );
    eventually("the reading applied", || outside().trim() == "d 2");
}

#[test]
fn a_whole_gpu_container_gets_the_device_and_its_whole_memory() {
    if !available() {
        return;
    }
    let dir = open_tempdir();
    let pm = Podman::start(dir.path());
    let bus = Bus::session();
    let _d = setup(dir.path(), &pm, &bus);
    let a = &bus.address;
    let spec = serde_json::json!({
        "name": "whole",
        "requested_resources": {"gpu_requests": {"count": 1}, "cpu_cores": 1},
        "run": {"container": {"image": "localhost/bb", "command": ["sh", "-c",
            "echo GB=$ASTRAEUS_GPU_MEMORY_GB CDI=$SEEN_CDI; sleep 600"]}},
    });
    let o = manager(a, None, "SubmitWorker", &["s", &spec.to_string()]);
    assert!(o.ok, "{}", o.stderr);
    let mut logs = String::new();
    eventually("its output", || {
        logs = pm.run(&["logs", "astraeus-whole"]);
        logs.contains("GB=")
    });
    assert!(logs.contains(&format!("GB=8 CDI={UUID}")), "{logs}");
    assert!(manager(a, None, "StopWorker", &["s", "whole"]).ok);
    eventually("whole gone", || gone(a, "whole"));
}

/// A container worker placed and stopped in the same group (the submit held
/// inside its group by a failpoint while the stop queues behind it) is never
/// launched: its caller was told it stops, so no container may run for it.
/// (The launch used to overwrite the stop's phase and start it anyway.)
#[test]
fn a_container_stopped_in_the_group_that_placed_it_never_runs() {
    if !available() {
        return;
    }
    let dir = open_tempdir();
    let pm = Podman::start(dir.path());
    let bus = Bus::session();
    let d = setup_with(
        dir.path(),
        &pm,
        &bus,
        &[("ASTRAEUS_FAILPOINTS", "service.group=pause3000@1")],
    );
    let a = bus.address.clone();
    let submit = {
        let a = a.clone();
        std::thread::spawn(move || {
            manager(
                &a,
                None,
                "SubmitWorker",
                &["s", &container("brief", Some("1"), "sleep 300")],
            )
        })
    };
    eventually("the submit held in its group", || {
        d.log_text().contains("failpoint service.group reached")
    });
    let o = manager(&a, None, "StopWorker", &["s", "brief"]);
    assert!(o.ok, "{}", o.stderr);
    let o = submit.join().unwrap();
    assert!(o.ok, "{}", o.stderr);
    eventually("brief ended", || gone(&a, "brief"));
    let log = d.log_text();
    assert!(!log.contains("worker brief started"), "{log}");
    assert!(
        !pm.run(&["ps", "-a"]).contains("astraeus-brief"),
        "{}",
        pm.run(&["ps", "-a"])
    );
}

/// GPU 0's TakenGb as busctl prints it (`d 2\n`).
fn taken_gb(a: &str) -> String {
    let gpu = "/org/astraeus/Node1/gpu/0";
    let args = [
        "get-property",
        "org.astraeus.Node1",
        gpu,
        "org.astraeus.Node1.Gpu",
        "TakenGb",
    ];
    busctl(a, &args).stdout
}

/// The ledger's record of a worker's stop and end: (stop_asked_by, end_reason).
fn stop_record(state: &Path, name: &str) -> (Option<u32>, Option<String>) {
    rusqlite::Connection::open(state.join("ledger.db"))
        .unwrap()
        .query_row(
            "SELECT stop_asked_by, end_reason FROM workers WHERE name = ?1 ORDER BY id DESC",
            [name],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap()
}

/// Waits until worker `name` is gone, failing the moment it reads
/// `running`: a stop once acknowledged is never undone.
fn gone_never_running(a: &str, name: &str) {
    eventually("the stopped worker ended", || {
        let s = state(a, name);
        assert_ne!(s, "s \"running\"\n", "{name} runs again after its stop");
        gone(a, name)
    });
}

/// #63: a stop acknowledged while podman's API is away, then the daemon
/// killed -9 before it could be carried out: after both come back the
/// container is stopped, the share freed, and the worker never read as
/// running again; history says it was stopped.
#[test]
fn a_stop_acknowledged_while_podman_is_away_survives_a_kill_9() {
    if !available() {
        return;
    }
    let dir = open_tempdir();
    let mut pm = Podman::start(dir.path());
    let bus = Bus::session();
    let mut d = setup(dir.path(), &pm, &bus);
    let a = &bus.address;
    run_sleeper(a, "held", "2");
    let _ = pm.service.kill();
    let _ = pm.service.wait();

    let o = manager(a, None, "StopWorker", &["s", "held"]);
    assert!(o.ok, "{}", o.stderr);
    assert_eq!(state(a, "held"), "s \"stopping\"\n");
    // In the ledger before the reply: who asked (root).
    assert_eq!(stop_record(&d.state, "held"), (Some(0), None));
    // The call fails while podman is away, and is tried again.
    eventually("the stop tried again", || {
        d.log_text().contains("trying again in")
    });
    d.child.kill().unwrap();
    d.child.wait().unwrap();
    assert!(
        pm.run(&["ps", "--format", "{{.Names}}"])
            .contains("astraeus-held"),
        "the container runs on while both are down"
    );

    pm.service = pm.serve();
    let d = Daemon::start(&bus, dir.path(), &dir.path().join("majin.toml"), &[]);
    gone_never_running(a, "held");
    eventually("the container stopped", || {
        !pm.run(&["ps", "--format", "{{.Names}}"])
            .contains("astraeus-held")
    });
    let (_, reason) = stop_record(&d.state, "held");
    let reason = reason.unwrap();
    // sh as PID 1 ignores SIGTERM: podman kills it after the stop's timeout.
    assert!(reason.starts_with("stopped"), "{reason}");
    assert!(!reason.contains("exited with status"), "{reason}");
    assert_eq!(taken_gb(a), "d 0\n", "its share freed");
}

/// #63: podman takes the stop call and never answers it: the call's own
/// deadline ends it, and the stop is tried again as podman's kill once
/// the stop's timeout has passed; the container ends, and history says
/// it was stopped and killed.
#[test]
fn a_stop_podman_never_answers_is_tried_again_as_a_kill() {
    if !available() {
        return;
    }
    let dir = open_tempdir();
    let pm = Podman::start(dir.path());
    let hang = hanging_stop::HangingStop::start(&dir.path().join("hang.sock"), &pm.socket());
    let bus = Bus::session();
    std::fs::write(
        dir.path().join("node.toml"),
        format!(
            "[inventory]\nrefresh_seconds = 0.5\n[runtime]\npodman_socket = \"{}\"\n\
             stop_timeout_seconds = 1\npodman_timeout_seconds = 5\n",
            hang.socket.display()
        ),
    )
    .unwrap();
    std::fs::write(dir.path().join("majin.toml"), MAJIN_TOML).unwrap();
    let d = Daemon::start(&bus, dir.path(), &dir.path().join("majin.toml"), &[]);
    let a = &bus.address;
    let o = manager(
        a,
        None,
        "SubmitWorker",
        &[
            "s",
            &container("deaf", Some("1"), "trap '' TERM; sleep 1000"),
        ],
    );
    assert!(o.ok, "{}", o.stderr);
    eventually("running", || state(a, "deaf") == "s \"running\"\n");

    assert!(manager(a, None, "StopWorker", &["s", "deaf"]).ok);
    gone_never_running(a, "deaf");
    assert!(hang.stops() >= 1, "the stop call was never made");
    assert!(
        hang.kills() >= 1,
        "the stop was never tried again as a kill"
    );
    let (_, reason) = stop_record(&d.state, "deaf");
    let reason = reason.unwrap();
    assert!(reason.starts_with("stopped; killed after "), "{reason}");
    assert!(d.log_text().contains("trying again in"), "{}", d.log_text());
    assert!(!pm
        .run(&["ps", "--format", "{{.Names}}"])
        .contains("astraeus-deaf"));
}

/// #63: a member's podman container runs as the member's uid and primary
/// group, with no group of root's, and a process limit (the refusal of a
/// member's NVIDIA_* keys is the same check as Docker's: tests/docker.rs).
#[test]
fn a_members_container_runs_with_its_own_group_and_a_process_limit() {
    if !available() {
        return;
    }
    let user = "astraeus-test-pm";
    let uid = ensure_user(user);
    let gid = astraeusd::auth::primary_gid(uid).unwrap();
    let dir = open_tempdir();
    let pm = Podman::start(dir.path());
    let bus = Bus::system_like(dir.path(), Some(&careless_policy(dir.path())));
    std::fs::write(
        dir.path().join("node.toml"),
        format!(
            "[runtime]\npodman_socket = \"{}\"\nmember_max_processes = 300\n\
             [access]\ncontainers_for_group = true\n",
            pm.socket().display()
        ),
    )
    .unwrap();
    std::fs::write(dir.path().join("majin.toml"), MAJIN_TOML).unwrap();
    let _d = Daemon::start(&bus, dir.path(), &dir.path().join("majin.toml"), &[]);
    let a = &bus.address;
    let script = "echo ID=$(id) PIDS=$(cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || \
                  cat /sys/fs/cgroup/pids.max); sleep 2";
    let o = manager(
        a,
        Some(user),
        "SubmitWorker",
        &["s", &container("mine", Some("1"), script)],
    );
    assert!(o.ok, "{}", o.stderr);
    let mut logs = String::new();
    eventually("its output", || {
        logs = pm.run(&["logs", "astraeus-mine"]);
        logs.contains("PIDS=")
    });
    assert!(
        logs.contains(&format!("ID=uid={uid} gid={gid} groups={gid} PIDS=300")),
        "{logs}"
    );
}

/// `astraeusctl submit` and `stop` wait for the outcome, as systemctl start
/// and stop wait for their jobs (#67): a submit whose launch fails exits 1
/// saying how (not `starting:` and 0), one that launches says `running`;
/// a stop of a container that ignores SIGTERM returns once it has ended
/// (killed after the stop timeout), not at the acknowledgement; with
/// --no-block both return at once.
#[test]
fn submit_and_stop_wait_for_the_outcome_unless_told_not_to() {
    if !available() {
        return;
    }
    let dir = open_tempdir();
    let pm = Podman::start(dir.path());
    let bus = Bus::session();
    let _d = setup(dir.path(), &pm, &bus);
    let a = &bus.address;
    let file = |name: &str, spec: &str| {
        let f = dir.path().join(format!("{name}.json"));
        std::fs::write(&f, spec).unwrap();
        f.to_str().unwrap().to_string()
    };
    // A launch that fails: no such image.
    let missing = container("nope", Some("1"), "true").replace("localhost/bb", "localhost/missing");
    let o = ctl(a, None, &["submit", &file("nope", &missing)]);
    assert!(!o.ok, "{}", o.stdout);
    assert_eq!(o.code, Some(1), "{}", o.stderr);
    assert!(
        o.stderr
            .contains("LaunchFailed: worker nope failed to start:"),
        "{}",
        o.stderr
    );
    // Ended, it is still told (as systemctl status tells a failed unit),
    // with the exit status of a unit that is not running.
    let o = ctl(a, None, &["status", "nope"]);
    assert_eq!(o.code, Some(3), "{}{}", o.stdout, o.stderr);
    assert!(
        o.stdout.starts_with("nope\n  state:    ended ") && o.stdout.contains("failed to start:"),
        "{}",
        o.stdout
    );
    // One that launches: running when submit returns.
    let o = ctl(
        a,
        None,
        &[
            "submit",
            &file(
                "deaf",
                &container("deaf", Some("1"), "trap '' TERM; sleep 1000"),
            ),
        ],
    );
    assert!(o.ok, "{}", o.stderr);
    assert!(o.stdout.starts_with("running: "), "{}", o.stdout);
    assert_eq!(state(a, "deaf"), "s \"running\"\n");
    // Its stop returns once it has ended (SIGTERM ignored: killed after the
    // 1 s stop timeout), and it is gone by then.
    let o = ctl(a, None, &["stop", "deaf"]);
    assert!(o.ok, "{}", o.stderr);
    assert_eq!(o.stdout, "stopped deaf\n");
    assert!(gone(a, "deaf"), "stop returned before the worker ended");
    let o = ctl(a, None, &["status", "deaf"]);
    assert!(
        o.stdout.contains("killed after") && o.stdout.contains("  exit:     status 137"),
        "{}",
        o.stdout
    );
    // --no-block: at once.
    let o = ctl(
        a,
        None,
        &[
            "submit",
            "--no-block",
            &file(
                "quick",
                &container("quick", Some("1"), "trap '' TERM; sleep 1000"),
            ),
        ],
    );
    assert!(
        o.ok && o.stdout.starts_with("starting: "),
        "{}{}",
        o.stdout,
        o.stderr
    );
    eventually("quick running", || state(a, "quick") == "s \"running\"\n");
    let o = ctl(a, None, &["stop", "--no-block", "quick"]);
    assert_eq!(o.stdout, "stopping quick\n", "{}", o.stderr);
    assert!(!gone(a, "quick"), "--no-block waited for the end");
    eventually("quick gone", || gone(a, "quick"));
}
