//! Container workers on a real Docker Engine (Debian's docker.io: dockerd
//! on its own socket, data and exec roots, a busybox image imported from a
//! tarball built here, no registry), driven over a real bus. Each test
//! starts its own dockerd and stops it.
//!
//! The GPU request (`--gpus device=UUID`) is served by NVIDIA's container
//! toolkit on a real host; here a stand-in `nvidia-container-runtime-hook`
//! (a script that exits 0) on dockerd's PATH lets the engine accept it, as
//! the fake libnvidia-ml stands in for the driver: the container then sees
//! `NVIDIA_VISIBLE_DEVICES=<UUID>`, which is what the request asks of the
//! toolkit. Docker 20.10 has no CDI: the CDI path is tested against a
//! stand-in engine in src/runtime/docker.rs.
//!
//! Set ASTRAEUS_REQUIRE_COMPONENTS=1 (CI does) to fail instead of skipping
//! when dockerd is missing.

mod common;
#[path = "common/fake_nvml.rs"]
mod fake_nvml;
#[path = "common/hanging_stop.rs"]
mod hanging_stop;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const UUID: &str = "GPU-5c0a7d3e-4060-4b1e-9f00-000000000000";

fn available() -> bool {
    let ok = Command::new("dockerd")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    require_component(ok, "dockerd (docker.io)")
}

/// One dockerd at a time: each starts its own containerd, and two at once
/// on this 2-core machine made starts slow enough to time out.
static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A private dockerd: its own data and exec roots, socket and pid file.
struct Dockerd {
    dir: PathBuf,
    child: std::process::Child,
    _turn: std::sync::MutexGuard<'static, ()>,
}

impl Dockerd {
    /// Starts dockerd in `dir/docker`; with the stand-in GPU hook on its
    /// PATH when `gpu_hook`. The image `localhost/bb` is imported.
    fn start(dir: &Path, gpu_hook: bool) -> Dockerd {
        let turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        // Short: containerd's sockets live under the exec root (108 bytes).
        let dir = dir.join("dk");
        let hook = dir.join("hook");
        std::fs::create_dir_all(&hook).unwrap();
        let mut path = std::env::var("PATH").unwrap_or_default();
        if gpu_hook {
            let script = hook.join("nvidia-container-runtime-hook");
            std::fs::write(&script, "#!/bin/sh\nexit 0\n").unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
            path = format!("{}:{path}", hook.display());
        }
        let sock = dir.join("d.sock");
        let child = Command::new("dockerd")
            .arg("--data-root")
            .arg(dir.join("data"))
            .arg("--exec-root")
            .arg(dir.join("x"))
            .arg("-H")
            .arg(format!("unix://{}", sock.display()))
            .arg("--pidfile")
            .arg(dir.join("pid"))
            .args(["--iptables=false", "--bridge=none", "--storage-driver=vfs"])
            .env("PATH", path)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("dockerd.log")).unwrap())
            .spawn()
            .unwrap();
        let d = Dockerd {
            dir: dir.clone(),
            child,
            _turn: turn,
        };
        eventually("dockerd answers on its socket", || pinged(&sock));
        // A busybox image, from a tarball: no registry here.
        let rootfs = dir.join("rootfs");
        std::fs::create_dir_all(rootfs.join("bin")).unwrap();
        std::fs::copy("/bin/busybox", rootfs.join("bin/busybox"))
            .expect("busybox-static installed");
        let list = Command::new("/bin/busybox").arg("--list").output().unwrap();
        for applet in String::from_utf8_lossy(&list.stdout).lines() {
            if applet != "busybox" {
                let _ = std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet));
            }
        }
        let tar = dir.join("bb.tar");
        let st = Command::new("tar")
            .arg("-C")
            .arg(&rootfs)
            .arg("-cf")
            .arg(&tar)
            .arg(".")
            .status()
            .unwrap();
        assert!(st.success());
        let out = d.run(&[
            "import",
            "--change",
            "ENV PATH=/bin",
            "--change",
            "CMD [\"/bin/sh\"]",
            tar.to_str().unwrap(),
            "localhost/bb",
        ]);
        assert!(out.contains("sha256:"), "import: {out}");
        d
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("d.sock")
    }

    /// The docker CLI on this engine; stdout and stderr together.
    fn run(&self, args: &[&str]) -> String {
        let o = Command::new("docker")
            .arg("-H")
            .arg(format!("unix://{}", self.socket().display()))
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
    }
}

impl Drop for Dockerd {
    fn drop(&mut self) {
        let _ = self.run(&[
            "rm",
            "-f",
            "astraeus-one",
            "astraeus-two",
            "astraeus-listen",
        ]);
        // SIGTERM: dockerd stops its containers and containerd, then exits.
        // SAFETY: a signal to the dockerd this test started.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
        // Its containers' mounts are gone with it; its roots can go now.
        let _ = std::fs::remove_dir_all(self.dir.join("data"));
    }
}

fn container(name: &str, gb: &str, script: &str) -> String {
    format!(
        r#"{{"name":"{name}","requested_resources":{{"gpu_requests":{{"shared":true,"memory_gb":{gb}}},"cpu_cores":1,"memory_bytes":268435456}},
            "run":{{"container":{{"image":"localhost/bb","command":["sh","-c",{}],"env":{{"TOKEN":"s3cret"}}}}}}}}"#,
        serde_json::to_string(script).unwrap()
    )
}

/// The daemon on `bus` with `runtime` lines in its config.
fn daemon(dir: &Path, bus: &Bus, runtime: &str) -> Daemon {
    std::fs::write(
        dir.join("node.toml"),
        format!(
            "[inventory]\nrefresh_seconds = 0.5\n[runtime]\nstop_timeout_seconds = 1\n{runtime}"
        ),
    )
    .unwrap();
    std::fs::write(dir.join("majin.toml"), MAJIN_TOML).unwrap();
    Daemon::start(bus, dir, &dir.join("majin.toml"), &[])
}

/// How a worker that ended did (`astraeusctl --json history`'s ended_by).
fn ended_by(a: &str, name: &str) -> String {
    let o = ctl(a, None, &["--json", "history"]);
    let rows: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    rows.as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == name)
        .map(|r| r["ended_by"].as_str().unwrap().to_string())
        .unwrap_or_else(|| panic!("{name} not in the history: {}", o.stdout))
}

fn taken_gb(a: &str) -> String {
    busctl(
        a,
        &[
            "get-property",
            "org.astraeus.Node1",
            "/org/astraeus/Node1/gpu/0",
            "org.astraeus.Node1.Gpu",
            "TakenGb",
        ],
    )
    .stdout
}

/// `auto` finds Docker when podman does not answer; the container gets its
/// share, its GPU by Docker's request, its limits and labels; the started
/// event says how; its exit frees the share and is recorded.
#[test]
fn a_container_runs_through_docker_and_its_exit_frees_its_share() {
    if !available() {
        return;
    }
    let dir = open_tempdir();
    let dk = Dockerd::start(dir.path(), true);
    let bus = Bus::session();
    let sock = dk.socket();
    let d = daemon(
        dir.path(),
        &bus,
        &format!(
            "podman_socket = \"{}\"\ndocker_socket = \"{}\"\n",
            dir.path().join("no-podman.sock").display(),
            sock.display()
        ),
    );
    let a = &bus.address;
    assert!(
        d.log_text().contains(&format!(
            "container workers run through Docker at {} (auto: podman does not answer",
            sock.display()
        )),
        "{}",
        d.log_text()
    );
    let status = ctl(a, None, &["status"]);
    assert!(
        status
            .stdout
            .contains(&format!("  Containers: Docker at {}\n", sock.display())),
        "{}",
        status.stdout
    );

    let script = "echo GB=$ASTRAEUS_GPU_MEMORY_GB NV=$NVIDIA_VISIBLE_DEVICES TOKEN=$TOKEN \
                  MEM=$(cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max) \
                  NNP=$(awk '/^NoNewPrivs/ {print $2}' /proc/self/status); \
                  sleep 3; exit 3";
    let o = manager(
        a,
        None,
        "SubmitWorker",
        &["s", &container("listen", "4", script)],
    );
    assert!(o.ok, "{}", o.stderr);
    // A reservation that does not fit beside it waits.
    let o = manager(a, None, "SubmitWorker", &["s", &shared_spec("voice", "4")]);
    assert!(o.stdout.contains("pending"), "{}", o.stdout);
    eventually("listen running", || state(a, "listen") == "s \"running\"\n");
    let mut logs = String::new();
    eventually("container output", || {
        logs = dk.run(&["logs", "astraeus-listen"]);
        logs.contains("GB=")
    });
    assert!(
        logs.contains(&format!("GB=4 NV={UUID} TOKEN=s3cret MEM=268435456 NNP=1")),
        "{logs}"
    );
    // Docker's own word on the container: its label, its CPU limit.
    let inspected = dk.run(&[
        "inspect",
        "--format",
        "{{index .Config.Labels \"astraeus.worker\"}} {{.HostConfig.NanoCpus}} {{.Config.User}}",
        "astraeus-listen",
    ]);
    assert_eq!(inspected.trim(), "listen 1000000000", "{inspected}");
    assert!(
        d.log_text().contains(&format!(
            "worker listen started through Docker at {}",
            sock.display()
        )) && d.log_text().contains(&format!(
            "its GPUs through Docker's GPU request (--gpus device={UUID})"
        )),
        "{}",
        d.log_text()
    );

    // It exits with status 3: the share frees and voice is placed.
    eventually("voice placed after listen exited", || {
        state(a, "voice") == "s \"running\"\n"
    });
    assert!(gone(a, "listen"));
    assert_eq!(ended_by(a, "listen"), "exited with status 3");
    eventually("container removed", || {
        !dk.run(&["ps", "-a"]).contains("astraeus-listen")
    });

    // `auto` stays with the engine its live workers run under: killed and
    // started again while a podman answers, the daemon keeps Docker and
    // adopts the container, instead of asking podman (which would know
    // nothing of it) and ending a worker whose container still runs.
    let o = manager(
        a,
        None,
        "SubmitWorker",
        &["s", &container("one", "1", "sleep 1000")],
    );
    assert!(o.ok, "{}", o.stderr);
    eventually("one running", || state(a, "one") == "s \"running\"\n");
    let mut d = d;
    d.child.kill().unwrap();
    d.child.wait().unwrap();
    let podman = std::os::unix::net::UnixListener::bind(dir.path().join("no-podman.sock")).unwrap();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for mut conn in podman.incoming().flatten() {
            let mut buf = [0u8; 1024];
            let _ = conn.read(&mut buf);
            let _ = conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nOK");
        }
    });
    let d = Daemon::start(&bus, dir.path(), &dir.path().join("majin.toml"), &[]);
    eventually("one adopted", || {
        d.log_text()
            .contains("adopted the running workload of worker one")
    });
    assert!(
        d.log_text().contains(&format!(
            "container workers run through Docker at {} (auto: the ledger's live container \
             workers were started through it)",
            sock.display()
        )),
        "{}",
        d.log_text()
    );
    assert_eq!(state(a, "one"), "s \"running\"\n");
    assert!(manager(a, None, "StopWorker", &["s", "one"]).ok);
    eventually("one gone", || gone(a, "one"));
}

/// StopWorker stops the container within its timeout; a daemon killed
/// and started again adopts what still runs and records, at Docker's own
/// time, the exit of what ended while it was away.
#[test]
fn stop_stops_the_container_and_a_restart_adopts_what_runs() {
    if !available() {
        return;
    }
    let dir = open_tempdir();
    let dk = Dockerd::start(dir.path(), true);
    let bus = Bus::session();
    let runtime = format!(
        "containers = \"docker\"\ndocker_socket = \"{}\"\n",
        dk.socket().display()
    );
    let mut d = daemon(dir.path(), &bus, &runtime);
    let a = &bus.address;
    for name in ["one", "two"] {
        let o = manager(
            a,
            None,
            "SubmitWorker",
            &["s", &container(name, "1", "sleep 1000")],
        );
        assert!(o.ok, "{}", o.stderr);
        eventually("running", || state(a, name) == "s \"running\"\n");
    }
    let id_one = dk.run(&["inspect", "--format", "{{.Id}}", "astraeus-one"]);
    // Its control group is recorded: the kernel's word on where the
    // container's first process lives (/proc/PID/cgroup, the memory
    // hierarchy on this hybrid host) is the ledger's.
    let pid: u32 = dk
        .run(&["inspect", "--format", "{{.State.Pid}}", "astraeus-one"])
        .trim()
        .parse()
        .unwrap();
    let kernel = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let path = kernel
        .lines()
        .find_map(|l| l.split_once(":memory:").map(|(_, p)| p.to_string()))
        .or_else(|| {
            kernel
                .lines()
                .find_map(|l| l.strip_prefix("0::").map(str::to_string))
        })
        .unwrap_or_else(|| panic!("no memory or v2 line: {kernel}"));
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
    assert_eq!(cgroup, path, "{kernel}");

    // kill -9 the daemon; while it is down, "two" ends.
    d.child.kill().unwrap();
    d.child.wait().unwrap();
    dk.run(&["stop", "-t", "0", "astraeus-two"]);
    let finished = dk.run(&[
        "inspect",
        "--format",
        "{{.State.FinishedAt}}",
        "astraeus-two",
    ]);
    let finished_ms = finished
        .trim()
        .parse::<jiff::Timestamp>()
        .unwrap()
        .as_millisecond();
    std::thread::sleep(std::time::Duration::from_secs(2));
    let d = Daemon::start(&bus, dir.path(), &dir.path().join("majin.toml"), &[]);
    eventually("one adopted", || state(a, "one") == "s \"running\"\n");
    assert_eq!(
        dk.run(&["inspect", "--format", "{{.Id}}", "astraeus-one"]),
        id_one
    );
    assert_eq!(
        dk.run(&["ps", "-a", "--format", "{{.Names}}"])
            .matches("astraeus-one")
            .count(),
        1
    );
    eventually("two ended", || gone(a, "two"));
    // It ended when Docker says it did (to the ms), not when the
    // restarted daemon noticed, two seconds later; with its status (137:
    // killed, as `docker stop -t 0` does).
    let (ended_ms, status): (i64, Option<i64>) =
        rusqlite::Connection::open(d.state.join("ledger.db"))
            .unwrap()
            .query_row(
                "SELECT ended_ms, exit_status FROM workers WHERE name = 'two'",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
    assert_eq!(ended_ms, finished_ms, "Docker's FinishedAt: {finished}");
    assert_eq!(status, Some(137));
    assert!(
        d.log_text()
            .contains("adopted the running workload of worker one"),
        "{}",
        d.log_text()
    );
    assert_eq!(taken_gb(a), "d 1\n");

    // StopWorker: graceful, then forced after 1 s; the share frees once it is gone.
    assert!(manager(a, None, "StopWorker", &["s", "one"]).ok);
    eventually("one gone", || gone(a, "one"));
    eventually("container removed", || {
        !dk.run(&["ps", "-a"]).contains("astraeus-one")
    });
    assert_eq!(taken_gb(a), "d 0\n");
}

/// What a Docker user meets, each as a reason on the worker that names
/// Docker and says what to do: a GPU request no driver serves (no NVIDIA
/// container toolkit), an image not on the host, no engine at the socket,
/// and a socket the daemon's user may not use.
#[test]
fn docker_errors_say_what_to_do() {
    if !available() {
        return;
    }
    let dir = open_tempdir();
    // No GPU hook on this dockerd's PATH: nothing serves `--gpus`.
    let dk = Dockerd::start(dir.path(), false);
    let bus = Bus::session();
    let runtime = format!(
        "containers = \"docker\"\ndocker_socket = \"{}\"\n",
        dk.socket().display()
    );
    let d = daemon(dir.path(), &bus, &runtime);
    let a = &bus.address;
    let o = manager(
        a,
        None,
        "SubmitWorker",
        &["s", &container("one", "1", "sleep 1000")],
    );
    assert!(o.ok, "{}", o.stderr);
    eventually("one failed", || gone(a, "one"));
    let said = ended_by(a, "one");
    assert!(
        said.starts_with("failed to start: Docker start: could not select device driver")
            && said.contains("NVIDIA's container toolkit is missing")
            && said.contains("nvidia-ctk runtime configure --runtime=docker"),
        "{said}"
    );
    // Nothing of the failed launch is left, and its share is free.
    assert!(!dk.run(&["ps", "-a"]).contains("astraeus-one"));
    assert_eq!(taken_gb(a), "d 0\n");

    // An image that is not on the host.
    let missing = r#"{"name":"two","requested_resources":{"gpu_requests":{"shared":true,"memory_gb":1}},
        "run":{"container":{"image":"localhost/not-here"}}}"#;
    // With a GPU, the engine's GPU check comes at start, after create:
    // create is what finds the image missing.
    let o = manager(a, None, "SubmitWorker", &["s", missing]);
    assert!(o.ok, "{}", o.stderr);
    eventually("two failed", || gone(a, "two"));
    assert_eq!(
        ended_by(a, "two"),
        "failed to start: Docker create: No such image: localhost/not-here:latest (HTTP 404): \
         pull it on the host first (docker pull localhost/not-here); astraeusd never pulls an image"
    );
    drop(d);

    // No engine at the socket.
    let other = dir.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    let bus2 = Bus::session();
    let gone_sock = dir.path().join("no-docker.sock");
    let runtime = format!(
        "containers = \"docker\"\ndocker_socket = \"{}\"\n",
        gone_sock.display()
    );
    let _d2 = daemon(&other, &bus2, &runtime);
    let o = manager(
        &bus2.address,
        None,
        "SubmitWorker",
        &["s", &container("three", "1", "true")],
    );
    assert!(o.ok, "{}", o.stderr);
    eventually("three failed", || gone(&bus2.address, "three"));
    let said = ended_by(&bus2.address, "three");
    assert!(
        said.starts_with("failed to start: Docker info: No such file or directory")
            && said.contains(
                "is dockerd running (systemctl start docker)? Or set runtime.docker_socket"
            ),
        "{said}"
    );

    // A daemon whose user may not use the socket (dockerd's is root's,
    // group docker, 0660): run as nobody, whose own daemon may run
    // containers (access::Rules::may_run) but not reach this engine.
    let mine = dir.path().join("nobody");
    let state = mine.join("state");
    std::fs::create_dir_all(&state).unwrap();
    let st = Command::new("chown")
        .arg("-R")
        .arg("nobody")
        .arg(&mine)
        .status()
        .unwrap();
    assert!(st.success());
    std::fs::write(mine.join("majin.toml"), MAJIN_TOML).unwrap();
    std::fs::write(
        mine.join("node.toml"),
        format!(
            "[inventory]\nrefresh_seconds = 0.5\n[runtime]\n{}",
            runtime.replace(
                &gone_sock.display().to_string(),
                &dk.socket().display().to_string(),
            )
        ),
    )
    .unwrap();
    // A bus other users may use, as the system's (a session bus admits
    // only the user who started it); anyone may own and call here.
    let open = mine.join("open.conf");
    std::fs::write(
        &open,
        "<busconfig><policy context=\"default\"><allow own=\"*\"/>\
         <allow send_destination=\"*\"/></policy></busconfig>",
    )
    .unwrap();
    let bus3 = Bus::system_like(&mine, Some(&open));
    let mut nobody = Command::new("setpriv")
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_astraeusd"))
        .args(["--bus-address", &bus3.address, "--sim"])
        .arg(mine.join("majin.toml"))
        .arg("--state-dir")
        .arg(&state)
        .arg("--config")
        .arg(mine.join("node.toml"))
        .env("ASTRAEUS_GPU_LOCK_DIR", &state)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(mine.join("daemon.log")).unwrap())
        .spawn()
        .unwrap();
    let a3 = &bus3.address;
    let log = mine.join("daemon.log");
    eventually("nobody's daemon on its bus", || {
        if let Ok(Some(exit)) = nobody.try_wait() {
            panic!(
                "{exit}: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        manager(a3, Some("nobody"), "ListGpus", &[]).ok
    });
    let o = manager(
        a3,
        Some("nobody"),
        "SubmitWorker",
        &["s", &container("four", "1", "true")],
    );
    assert!(o.ok, "{}", o.stderr);
    eventually("four failed", || gone(a3, "four"));
    let said = ended_by(a3, "four");
    let _ = nobody.kill();
    let _ = nobody.wait();
    assert!(
        said.starts_with("failed to start: Docker info: Permission denied")
            && said.contains("astraeusd runs as uid 65534, which may not use Docker's socket: add that user to the docker group"),
        "{said}"
    );
}

/// A Docker container's processes are its worker's own: the GPU memory a
/// process in its control group uses (the fake NVML lists the container's
/// own pid) counts as the worker's use, never as memory held outside.
#[test]
fn a_docker_containers_gpu_memory_is_its_own_not_held_outside() {
    if !available() {
        return;
    }
    const GB: u64 = 1 << 30;
    let dir = open_tempdir();
    let dk = Dockerd::start(dir.path(), true);
    let bus = Bus::session();
    let fx = dir.path().join("gpus.txt");
    let hardware = |used: u64, procs: &str| fake_nvml::one_l4(&fx, UUID, used, procs);
    hardware(0, "");
    std::fs::write(
        dir.path().join("node.toml"),
        format!(
            "machine = \"majin\"\n[inventory]\nrefresh_seconds = 0.5\nwsl = false\nnvml_library = \"{}\"\n\
             [runtime]\ncontainers = \"docker\"\ndocker_socket = \"{}\"\nstop_timeout_seconds = 1\n",
            fake_nvml::fake_lib(false).display(),
            dk.socket().display()
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
        &["s", &container("one", "4", "sleep 600")],
    );
    assert!(o.ok, "{}", o.stderr);
    eventually("one running", || state(a, "one") == "s \"running\"\n");
    let pid = dk
        .run(&["inspect", "--format", "{{.State.Pid}}", "astraeus-one"])
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
            "/org/astraeus/Node1/worker/one",
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
    assert!(manager(a, None, "StopWorker", &["s", "one"]).ok);
    eventually("one gone", || gone(a, "one"));
}

/// #63: dockerd takes the stop call and never answers it, and the daemon
/// is killed -9 while the stop hangs: the acknowledged stop is the
/// ledger's, so the restarted daemon carries it out (tried again as
/// Docker's kill once the stop's timeout passed); the worker never runs
/// again, its share frees, and history says it was stopped and killed.
#[test]
fn a_stop_dockerd_never_answers_survives_a_kill_9() {
    if !available() {
        return;
    }
    let dir = open_tempdir();
    let dk = Dockerd::start(dir.path(), true);
    let hang = hanging_stop::HangingStop::start(&dir.path().join("hang.sock"), &dk.socket());
    let bus = Bus::session();
    let runtime = format!(
        "containers = \"docker\"\ndocker_socket = \"{}\"\ndocker_timeout_seconds = 5\n",
        hang.socket.display()
    );
    let mut d = daemon(dir.path(), &bus, &runtime);
    let a = &bus.address;
    let o = manager(
        a,
        None,
        "SubmitWorker",
        &["s", &container("one", "2", "trap '' TERM; sleep 1000")],
    );
    assert!(o.ok, "{}", o.stderr);
    eventually("one running", || state(a, "one") == "s \"running\"\n");

    assert!(manager(a, None, "StopWorker", &["s", "one"]).ok);
    assert_eq!(state(a, "one"), "s \"stopping\"\n");
    eventually("the stop call taken", || hang.stops() >= 1);
    d.child.kill().unwrap();
    d.child.wait().unwrap();
    assert!(dk
        .run(&["ps", "--format", "{{.Names}}"])
        .contains("astraeus-one"));

    let d = Daemon::start(&bus, dir.path(), &dir.path().join("majin.toml"), &[]);
    eventually("one stopped", || {
        assert_ne!(
            state(a, "one"),
            "s \"running\"\n",
            "one runs again after its stop"
        );
        gone(a, "one")
    });
    assert!(
        hang.kills() >= 1,
        "the stop was never tried again as a kill"
    );
    assert!(!dk
        .run(&["ps", "--format", "{{.Names}}"])
        .contains("astraeus-one"));
    let reason = ended_by(a, "one");
    assert!(reason.starts_with("stopped; killed after "), "{reason}");
    assert_eq!(taken_gb(a), "d 0\n");
    assert!(d.log_text().contains("trying again in"), "{}", d.log_text());
}

/// #63: a member's request may not set what a GPU runtime reads as a
/// device request (NVIDIA_VISIBLE_DEVICES=all would be every GPU): refused
/// naming the key; root may. A member's container runs as the member's uid
/// and primary group, with no group of root's, and a process limit.
#[test]
fn a_members_container_reaches_no_gpu_through_its_environment_nor_roots_group() {
    if !available() {
        return;
    }
    let user = "astraeus-test-dk";
    let uid = ensure_user(user);
    let gid = astraeusd::auth::primary_gid(uid).unwrap();
    let dir = open_tempdir();
    let dk = Dockerd::start(dir.path(), true);
    let bus = Bus::system_like(dir.path(), Some(&careless_policy(dir.path())));
    let runtime = format!(
        "containers = \"docker\"\ndocker_socket = \"{}\"\nmember_max_processes = 300\n\
         [access]\ncontainers_for_group = true\n",
        dk.socket().display()
    );
    let _d = daemon(dir.path(), &bus, &runtime);
    let a = &bus.address;
    let with_env = |name: &str, key: &str| {
        container(name, "1", "sleep 1").replace(
            r#""TOKEN":"s3cret""#,
            &format!(r#""TOKEN":"s3cret","{key}":"all""#),
        )
    };
    for key in ["NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"] {
        let o = manager(
            a,
            Some(user),
            "SubmitWorker",
            &["s", &with_env("greedy", key)],
        );
        assert!(!o.ok, "{}", o.stdout);
        assert!(
            o.stderr
                .contains(&format!("run.container.env.{key}: uid {uid}")),
            "{}",
            o.stderr
        );
    }
    assert!(gone(a, "greedy"), "nothing of the refused request is kept");
    // Root may.
    let o = manager(
        a,
        None,
        "SubmitWorker",
        &["s", &with_env("two", "NVIDIA_DRIVER_CAPABILITIES")],
    );
    assert!(o.ok, "{}", o.stderr);

    let script = "echo ID=$(id) PIDS=$(cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || \
                  cat /sys/fs/cgroup/pids.max); sleep 2";
    let o = manager(
        a,
        Some(user),
        "SubmitWorker",
        &["s", &container("one", "1", script)],
    );
    assert!(o.ok, "{}", o.stderr);
    let mut logs = String::new();
    eventually("its output", || {
        logs = dk.run(&["logs", "astraeus-one"]);
        logs.contains("PIDS=")
    });
    assert!(
        logs.contains(&format!("ID=uid={uid} gid={gid} groups={gid} PIDS=300")),
        "{logs}"
    );
}
