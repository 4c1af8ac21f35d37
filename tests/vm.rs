//! VM workers through libvirt. The runtime itself (and so its helper process,
//! astraeus-libvirt) against the test driver of the suite's libvirtd (the
//! domain it made is read back on a connection of the test's own), the daemon
//! over a real bus against the test driver and against a real libvirtd with
//! QEMU (TCG), started here in a private mount namespace (kill -9 and
//! restart, crash at each named failpoint). Set ASTRAEUS_REQUIRE_COMPONENTS=1
//! (CI does) to fail instead of skipping when a component is missing.

mod common;
use astraeusd::request::{Run, VmSource};
use astraeusd::runtime::libvirt::{self, Libvirt};
use astraeusd::runtime::{Exit, Launch, Runtime};
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

fn launch(worker: &str, source: VmSource) -> Launch {
    Launch {
        worker: worker.into(),
        run: Run::Vm(source),
        gpu_uuids: vec!["GPU-a".into(), "GPU-b".into()],
        gpu_pci: vec!["00000000:65:00.0".into(), "00000000:B3:00.0".into()],
        gpu_memory_gb: Some("80".into()),
        cpu_cores: Default::default(),
        memory_bytes: 0,
        user: None,
        group: None,
        max_processes: None,
        hold: None,
    }
}

/// The suite's libvirtd's test driver, which it shares between connections
/// (the runtime's helper process and this test's own) while any is open.
fn shared_test_driver() -> String {
    format!(
        "test+unix:///default?socket={}/run/libvirt-sock",
        libvirt_root().display()
    )
}

/// The VM runtime, its helper the one this build made.
fn runtime(uri: &str) -> Libvirt {
    Libvirt::with_helper(uri, env!("CARGO_BIN_EXE_astraeus-libvirt"))
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn a_vm_gets_its_gpus_as_hostdevs_and_its_memory_as_oem_strings() {
    let Some(_lock) = libvirtd() else { return };
    let uri = shared_test_driver();
    rt().block_on(async {
        let vms = runtime(&uri);
        // A second connection to the same driver reads back what it made.
        let c = libvirt::direct::open(&uri).unwrap();
        let id = vms
            .start(&launch("listen", VmSource::DomainXml(TEST_DOMAIN.into())))
            .await
            .unwrap()
            .id;
        assert_eq!(id, "astraeus-listen");
        let d = c.lookup_domain_by_name(&id).unwrap();
        assert!(d.is_active().unwrap());
        assert!(!d.is_persistent().unwrap(), "a worker's VM is transient");
        let xml = d.xml_desc(0).unwrap();
        assert!(
            xml.contains("<entry>ASTRAEUS_GPU_MEMORY_GB=80</entry>")
                && xml.contains("<entry>io.systemd.credential:astraeus.gpu_memory_gb=80</entry>"),
            "{xml}"
        );
        assert!(xml.contains("<smbios mode='sysinfo'/>"), "{xml}");
        for bus in ["0x65", "0xb3"] {
            assert!(
                xml.contains(&format!("bus='{bus}' slot='0x00' function='0x0'")),
                "{xml}"
            );
        }
        let found = vms.list().await.unwrap();
        assert!(found.iter().any(|f| f.worker == "listen" && f.running));

        // Its end is noticed from libvirt's lifecycle event.
        let waiting = vms.wait(&id);
        let killer = async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            d.destroy().unwrap();
        };
        let (exit, ()) = tokio::join!(waiting, killer);
        assert_eq!(
            exit,
            Exit::Failed("the domain was destroyed (forced off)".into())
        );
        assert!(c.lookup_domain_by_name(&id).is_err(), "nothing left behind");
    });
}

#[test]
fn a_running_guest_tells_its_addresses_agent_and_channels() {
    let Some(_lock) = libvirtd() else { return };
    let uri = shared_test_driver();
    rt().block_on(async {
        let vms = runtime(&uri);
        let c = libvirt::direct::open(&uri).unwrap();
        let xml = "<domain type='test'><name>probed</name><memory>65536</memory>\
            <os><type>hvm</type></os><devices>\
            <interface type='network'><source network='default'/><mac address='52:54:00:aa:bb:01'/></interface>\
            <channel type='unix'><source mode='bind' path='/run/probed-gpu.sock'/>\
            <target type='virtio' name='org.astraeus.gpu.0'/></channel></devices></domain>";
        let d = c.define_domain_xml(xml).unwrap();
        d.create().unwrap();
        // The test driver hands out 192.168.122.x leases, one per interface.
        let found = vms.guest_addresses("probed").await.unwrap();
        assert!(!found.is_empty(), "a lease is known");
        assert!(
            found.iter().all(|a| a.to_string().starts_with("192.168.122.")),
            "{found:?}"
        );
        // The test driver answers guest-get-time itself (a real guest
        // without an agent does not: tests/vm.rs's QEMU test).
        assert_eq!(vms.agent_answers("probed").await.unwrap(), Ok(()));
        assert_eq!(
            vms.channel_path("probed", "org.astraeus.gpu.0").await.unwrap(),
            Some("/run/probed-gpu.sock".into())
        );
        assert_eq!(vms.channel_path("probed", "org.other").await.unwrap(), None);
        let e = vms.guest_addresses("nope").await.unwrap_err();
        assert!(e.message().contains("nope"), "{e}");
        d.destroy().unwrap();
        d.undefine().unwrap();
    });
}

#[test]
fn an_existing_domain_is_copied_and_must_be_off() {
    let Some(_lock) = libvirtd() else { return };
    let uri = shared_test_driver();
    rt().block_on(async {
        let vms = runtime(&uri);
        let c = libvirt::direct::open(&uri).unwrap();
        let base = TEST_DOMAIN.replace("<name>base</name>", "<name>voice-base</name>");
        let d = c.define_domain_xml(&base).unwrap();
        let id = vms
            .start(&launch("voice", VmSource::Domain("voice-base".into())))
            .await
            .unwrap()
            .id;
        // The defined domain is left as it was: off, persistent, without hostdevs.
        assert!(!d.is_active().unwrap());
        assert!(!d.xml_desc(0).unwrap().contains("hostdev"));
        let copy = c.lookup_domain_by_name(&id).unwrap();
        assert!(copy.xml_desc(0).unwrap().contains("hostdev"));
        assert_ne!(copy.uuid_string().unwrap(), d.uuid_string().unwrap());

        // Graceful stop (the test driver obeys ACPI): exits with 0.
        let waiting = vms.wait(&id);
        let stopping = vms.stop(&id, Duration::from_secs(5));
        let (exit, stopped) = tokio::join!(waiting, stopping);
        stopped.unwrap();
        assert_eq!(exit, Exit::Exited(0));

        // A running source domain is refused: the copy would share its disks.
        d.create().unwrap();
        let e = vms
            .start(&launch("voice2", VmSource::Domain("voice-base".into())))
            .await
            .unwrap_err();
        assert!(
            e.message()
                .starts_with("run.vm.domain: voice-base is running"),
            "{e}"
        );
        let e = vms
            .start(&launch("voice3", VmSource::Domain("nope".into())))
            .await
            .unwrap_err();
        assert_eq!(
            e.message(),
            format!("run.vm.domain: no domain named nope in {uri}")
        );
        d.destroy().unwrap();
    });
}

// ---- the daemon, over a real bus ----

fn daemon(dir: &Path, bus: &Bus, uri: &str, env: &[(&str, &str)]) -> Daemon {
    let config = format!(
        "[inventory]\nrefresh_seconds = 0.5\n[runtime]\nlibvirt_uri = \"{uri}\"\nstop_timeout_seconds = 1\n[slicing]\nallow_no_baseboard = true\n"
    );
    start_majin(bus, dir, &config, env)
}

#[test]
fn over_the_bus_a_vm_takes_its_gpu_whole_and_stopping_it_places_the_next() {
    // libvirt's test driver lives inside the daemon's libvirt helper.
    let dir = open_tempdir();
    let bus = Bus::session();
    let _d = daemon(dir.path(), &bus, "test:///default", &[]);
    let a = &bus.address;
    let o = manager(
        a,
        None,
        "SubmitWorker",
        &["s", &vm_spec("big", 1, TEST_DOMAIN)],
    );
    assert!(o.ok, "{}", o.stderr);
    eventually("big running", || state(a, "big") == "s \"running\"\n");
    let o = manager(a, None, "SubmitWorker", &["s", &shared_spec("small", "1")]);
    assert!(o.stdout.contains("pending"), "{}", o.stdout);
    assert!(o.stdout.contains("held whole"), "{}", o.stdout);
    let o = manager(a, None, "StopWorker", &["s", "big"]);
    assert!(o.ok, "{}", o.stderr);
    eventually("big gone", || gone(a, "big"));
    eventually("small placed", || state(a, "small") == "s \"running\"\n");

    // A VM cannot share a GPU; a broken document names its field.
    let shared = r#"{"name":"s","requested_resources":{"gpu_requests":{"shared":true,"memory_gb":1}},"run":{"vm":{"domain":"d"}}}"#;
    let o = manager(a, None, "SubmitWorker", &["s", shared]);
    assert!(
        o.stderr.contains("run.vm: a VM takes its GPUs whole"),
        "{}",
        o.stderr
    );
    let o = manager(
        a,
        None,
        "SubmitWorker",
        &["s", &vm_spec("x", 0, "<domain><name>")],
    );
    assert!(
        o.stderr.contains("run.vm.domain_xml: not well-formed XML"),
        "{}",
        o.stderr
    );
}

#[test]
fn only_root_may_run_a_vm_unless_config_extends_it_to_the_group() {
    if !require_component(is_root(), "root, to call as another user") {
        return;
    }
    for (extended, expect) in [(false, "access.vms_for_group"), (true, "/worker/v")] {
        let dir = open_tempdir();
        let open_policy = careless_policy(dir.path());
        let bus = Bus::system_like(dir.path(), Some(&open_policy));
        // nobody is a member of the access group here (its primary group).
        std::fs::write(
            dir.path().join("node.toml"),
            format!(
                "[access]\ngroup = \"nogroup\"\nvms_for_group = {extended}\n\
                 [runtime]\nlibvirt_uri = \"test:///default\"\n[slicing]\nallow_no_baseboard = true\n"
            ),
        )
        .unwrap();
        std::fs::write(dir.path().join("majin.toml"), MAJIN_TOML).unwrap();
        let _d = Daemon::start(&bus, dir.path(), &dir.path().join("majin.toml"), &[]);
        let o = manager(
            &bus.address,
            Some("nobody"),
            "SubmitWorker",
            &["s", &vm_spec("v", 0, TEST_DOMAIN)],
        );
        assert!(
            o.stdout.contains(expect) || o.stderr.contains(expect),
            "{} {}",
            o.stdout,
            o.stderr
        );
        if !extended {
            assert!(o.stderr.contains("only root may run one"), "{}", o.stderr);
        }
    }
}

/// node.toml letting members of `nogroup` run VMs (`on`), on the test driver.
fn members_vms(on: bool) -> String {
    format!(
        "[access]\ngroup = \"nogroup\"\nvms_for_group = {on}\n\
         [runtime]\nlibvirt_uri = \"test:///default\"\n[slicing]\nallow_no_baseboard = true\n"
    )
}

/// A daemon on a system-like bus whose policy lets anyone call, members'
/// VMs on ([`members_vms`]), with `env`.
fn for_members_vms(dir: &Path, env: &[(&str, &str)]) -> (Bus, Daemon) {
    let open_policy = careless_policy(dir);
    let bus = Bus::system_like(dir, Some(&open_policy));
    std::fs::write(dir.join("node.toml"), members_vms(true)).unwrap();
    std::fs::write(dir.join("majin.toml"), MAJIN_TOML).unwrap();
    let d = Daemon::start(&bus, dir, &dir.join("majin.toml"), env);
    (bus, d)
}

/// The name service's deadline (docs/reliability.md: "NSS 10 s a lookup"),
/// at a member's launch: a lookup held past it (a stalled LDAP, held by a
/// failpoint) is asked again a few times, then the worker ends as a launch
/// that failed, saying the name service did not answer, and it never
/// starts (fail closed); calls are answered meanwhile. The deadline is the
/// suite's shorter one (ASTRAEUS_CALL_DEADLINE_MS).
#[test]
fn a_name_service_that_does_not_answer_fails_a_members_launch_at_its_deadline() {
    if !require_component(is_root(), "root, to call as another user") {
        return;
    }
    let dir = open_tempdir();
    let (bus, d) = for_members_vms(
        dir.path(),
        &[
            ("ASTRAEUS_FAILPOINTS", "launch.membership=pause4000@all"),
            ("ASTRAEUS_CALL_DEADLINE_MS", "300"),
        ],
    );
    let a = bus.address.clone();
    let o = manager(
        &a,
        Some("nobody"),
        "SubmitWorker",
        &["s", &vm_spec("v", 1, TEST_DOMAIN)],
    );
    assert!(o.ok, "{}", o.stderr);
    eventually("the first lookup held", || {
        d.log_text().contains("failpoint launch.membership reached")
    });
    // The loop is not the one waiting.
    let o = manager(
        &a,
        None,
        "SubmitWorker",
        &[
            "s",
            r#"{"name":"meanwhile","requested_resources":{"gpu_requests":{"shared":true,"memory_gb":1}}}"#,
        ],
    );
    assert!(o.ok, "{}", o.stderr);
    let line = |log: &str| {
        log.lines()
            .find(|l| l.contains("worker v failed to start"))
            .map(str::to_string)
    };
    // Five tries, two seconds apart.
    let until = std::time::Instant::now() + Duration::from_secs(40);
    while line(&d.log_text()).is_none() && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(200));
    }
    let log = d.log_text();
    let line = line(&log).unwrap_or_else(|| panic!("v never failed: {log}"));
    assert!(
        line.contains("could not be checked, so it was not run")
            && line.contains("the name service did not answer within 0.3 s"),
        "{line}"
    );
    assert_eq!(
        log.matches("failpoint launch.membership reached").count(),
        5,
        "{log}"
    );
    assert!(!log.contains("worker v started"), "{log}");
}

/// A member's VM worker waits for its GPU while `vms_for_group` is on; the
/// switch is turned off (reload) before the GPU frees: the worker is not
/// started when it is placed, but ended as a launch that failed, saying
/// why. It was started.
#[test]
fn a_vm_queued_before_its_switch_was_turned_off_is_not_started() {
    if !require_component(is_root(), "root, to call as another user") {
        return;
    }
    let dir = open_tempdir();
    let (bus, d) = for_members_vms(dir.path(), &[]);
    let a = bus.address.clone();
    let hog = r#"{"name":"hog","requested_resources":{"gpu_requests":{"count":1}}}"#;
    assert!(manager(&a, None, "SubmitWorker", &["s", hog]).ok);
    let o = manager(
        &a,
        Some("nobody"),
        "SubmitWorker",
        &["s", &vm_spec("v", 1, TEST_DOMAIN)],
    );
    assert!(o.ok, "{}", o.stderr);
    assert!(state(&a, "v").contains("pending"));
    std::fs::write(dir.path().join("node.toml"), members_vms(false)).unwrap();
    d.signal(libc::SIGHUP);
    eventually("reloaded", || d.log_text().contains("node.toml reloaded"));
    assert!(manager(&a, None, "StopWorker", &["s", "hog"]).ok);
    eventually("v ended", || {
        !manager(&a, None, "ListWorkers", &[])
            .stdout
            .contains("\"v\"")
    });
    let log = d.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("worker v failed to start: its access was withdrawn"))
        .unwrap_or_else(|| panic!("no line saying v was not started: {log}"));
    assert!(line.contains("only root may run one"), "{line}");
    assert!(!log.contains("worker v started"), "{log}");
}

// ---- a real libvirtd with QEMU (TCG) ----

const QEMU_DOMAIN: &str = "<domain type='qemu'><name>q</name><memory unit='MiB'>64</memory>\
    <vcpu>1</vcpu><os><type arch='x86_64' machine='pc'>hvm</type></os>\
    <devices><emulator>/usr/bin/qemu-system-x86_64</emulator></devices></domain>";

/// Tests that share the one libvirtd run one at a time: each daemon removes
/// VMs of ours that its own ledger does not hold.
static LIBVIRTD: std::sync::Mutex<bool> = std::sync::Mutex::new(false);

/// The suite's own libvirtd and virtlogd, never the host's: started in a
/// private mount namespace where libvirt's run, state, log and cache
/// directories and its persistent domain configs are this run's directories
/// under [`libvirt_root`] (with a usable /dev/kvm node, as
/// test-environment.md describes), and reached through their own socket
/// ([`qemu_uri`]). A watcher stops them, and any QEMU they started, when
/// this test binary exits.
const START_LIBVIRTD: &str = r#"set -e
n=/run/astraeus-test-kvm; [ -e $n ] || mknod $n c 10 232
chown root:kvm $n; chmod 0660 $n; mount --bind $n /dev/kvm
for d in run lib log cache domains; do mkdir -p "$R/$d"; done
# On a fresh machine libvirt has not made these yet: they are the mount points.
mkdir -p /run/libvirt /var/lib/libvirt /var/log/libvirt /var/cache/libvirt /etc/libvirt/qemu
mount --bind "$R/run" /run/libvirt
mount --bind "$R/lib" /var/lib/libvirt
mount --bind "$R/log" /var/log/libvirt
mount --bind "$R/cache" /var/cache/libvirt
mount --bind "$R/domains" /etc/libvirt/qemu
alive() { [ -e "$R/run/$1.pid" ] && kill -0 "$(cat "$R/run/$1.pid")" 2>/dev/null; }
alive virtlogd || virtlogd -d --pid-file "$R/run/virtlogd.pid"
libvirtd -d --pid-file "$R/run/libvirtd.pid"
"#;

/// Runs detached until the test binary ($T) exits, then stops what the
/// suite started here: QEMU first (it outlives libvirtd), then the daemons.
const WATCH_LIBVIRTD: &str = r#"while kill -0 "$T" 2>/dev/null; do sleep 0.5; done
for f in "$R"/run/qemu/*.pid; do [ -e "$f" ] && kill -9 "$(cat "$f")"; done
for p in libvirtd virtlogd; do [ -e "$R/run/$p.pid" ] && kill "$(cat "$R/run/$p.pid")"; done
sleep 1; rm -rf "$R""#;

/// This run's libvirt directories (the marker scripts/test looks for).
fn libvirt_root() -> PathBuf {
    std::env::temp_dir().join(format!("astraeus-test-libvirt-{}", std::process::id()))
}

/// The URI of the suite's own libvirtd (its socket, not the host's).
fn qemu_uri() -> String {
    format!(
        "qemu:///system?socket={}/run/libvirt-sock",
        libvirt_root().display()
    )
}

fn start_libvirtd() {
    let st = Command::new("unshare")
        .args(["-m", "sh", "-c", START_LIBVIRTD])
        .env("R", libvirt_root())
        .status()
        .unwrap();
    assert!(st.success(), "starting libvirtd");
    eventually("libvirtd answers", || virsh(&["version"]).is_some());
}

/// The suite's libvirtd's pid, while it runs.
fn libvirtd_pid() -> Option<i32> {
    let pid: i32 = std::fs::read_to_string(libvirt_root().join("run/libvirtd.pid"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    // SAFETY: signal 0 only checks that the process exists.
    (unsafe { libc::kill(pid, 0) } == 0).then_some(pid)
}

/// Starts the suite's libvirtd (once); None when it cannot run here.
fn libvirtd() -> Option<std::sync::MutexGuard<'static, bool>> {
    let present = Path::new("/usr/sbin/libvirtd").exists()
        && Path::new("/usr/bin/qemu-system-x86_64").exists();
    if !require_component(
        present && is_root(),
        "root, libvirt-daemon-system and qemu-system-x86",
    ) {
        return None;
    }
    let mut started = LIBVIRTD.lock().unwrap_or_else(|e| e.into_inner());
    if !*started {
        start_libvirtd();
        Command::new("setsid")
            .args(["-f", "sh", "-c", WATCH_LIBVIRTD])
            .env("R", libvirt_root())
            .env("T", std::process::id().to_string())
            .status()
            .unwrap();
        *started = true;
    }
    Some(started)
}

fn virsh(args: &[&str]) -> Option<String> {
    let o = Command::new("virsh")
        .args(["-c", &qemu_uri()])
        .args(args)
        .output()
        .ok()?;
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).trim().to_string())
}

/// The QEMU process of a domain: its pid and command line.
fn qemu_of(domain: &str) -> Option<(u32, String)> {
    let pidfile = libvirt_root().join(format!("run/qemu/{domain}.pid"));
    let pid: u32 = std::fs::read_to_string(pidfile).ok()?.trim().parse().ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some((pid, String::from_utf8_lossy(&cmdline).replace('\0', " ")))
}

fn running_domains() -> Vec<String> {
    virsh(&["list", "--name"])
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

#[test]
fn real_qemu_vm_is_told_its_memory_adopted_after_a_crash_and_stopped() {
    let Some(_lock) = libvirtd() else { return };
    let dir = open_tempdir();
    let bus = Bus::session();
    let d = daemon(dir.path(), &bus, &qemu_uri(), &[]);
    let a = &bus.address;
    for name in ["qa", "qb"] {
        let o = manager(
            a,
            None,
            "SubmitWorker",
            &["s", &vm_spec(name, 0, QEMU_DOMAIN)],
        );
        assert!(o.ok, "{}", o.stderr);
        eventually("running", || state(a, name) == "s \"running\"\n");
    }
    let (pid, cmdline) = qemu_of("astraeus-qa").expect("qemu runs");
    assert!(
        cmdline.contains(
            "-smbios type=11,value=ASTRAEUS_GPU_MEMORY_GB=0,\
             value=io.systemd.credential:astraeus.gpu_memory_gb=0"
        ),
        "{cmdline}"
    );

    // kill -9 the daemon; while it is down, qb's VM is destroyed.
    let mut d = d;
    d.child.kill().unwrap();
    d.child.wait().unwrap();
    virsh(&["destroy", "astraeus-qb"]).expect("destroy qb");
    let d = daemon(dir.path(), &bus, &qemu_uri(), &[]);
    eventually("qa adopted", || state(a, "qa") == "s \"running\"\n");
    eventually("qb ended", || gone(a, "qb"));
    assert_eq!(
        qemu_of("astraeus-qa").map(|q| q.0),
        Some(pid),
        "not started again"
    );
    assert!(
        d.log_text()
            .contains("worker qb failed: its workload vanished"),
        "{}",
        d.log_text()
    );

    // StopWorker: ACPI is ignored by a guest without an OS, so it is forced off.
    let o = manager(a, None, "StopWorker", &["s", "qa"]);
    assert!(o.ok, "{}", o.stderr);
    eventually("qa gone", || gone(a, "qa"));
    assert!(!running_domains()
        .iter()
        .any(|n| n.starts_with("astraeus-q")));
}

#[test]
fn real_qemu_a_crash_at_each_step_of_a_launch_neither_loses_nor_doubles_the_vm() {
    let Some(_lock) = libvirtd() else { return };
    for point in ["libvirt.before-create", "libvirt.after-create"] {
        let dir = open_tempdir();
        let bus = Bus::session();
        let failpoint = format!("{point}=kill");
        let mut d = daemon(
            dir.path(),
            &bus,
            &qemu_uri(),
            &[("ASTRAEUS_FAILPOINTS", &failpoint)],
        );
        let _ = manager(
            &bus.address,
            None,
            "SubmitWorker",
            &["s", &vm_spec("crash", 0, QEMU_DOMAIN)],
        );
        assert!(
            !d.child.wait().unwrap().success(),
            "{point} killed the daemon"
        );
        let d = daemon(dir.path(), &bus, &qemu_uri(), &[]);
        eventually("crash running after restart", || {
            state(&bus.address, "crash") == "s \"running\"\n"
        });
        let ours: Vec<String> = running_domains()
            .into_iter()
            .filter(|n| n == "astraeus-crash")
            .collect();
        assert_eq!(ours.len(), 1, "{point}: exactly one VM");
        let o = manager(&bus.address, None, "StopWorker", &["s", "crash"]);
        assert!(o.ok, "{}", o.stderr);
        // (Seen once in CI: the worker never went. What to read then.)
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !gone(&bus.address, "crash") {
            assert!(
                std::time::Instant::now() < deadline,
                "{point}: crash not gone: state {:?}, domains {:?}",
                state(&bus.address, "crash"),
                running_domains()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(!running_domains().contains(&"astraeus-crash".to_string()));
        drop(d);
    }
}

#[test]
fn real_qemu_libvirtd_restarted_under_the_daemon_neither_loses_nor_doubles_the_vm() {
    let Some(_lock) = libvirtd() else { return };
    let dir = open_tempdir();
    let bus = Bus::session();
    let d = daemon(dir.path(), &bus, &qemu_uri(), &[]);
    let a = &bus.address;
    let o = manager(
        a,
        None,
        "SubmitWorker",
        &["s", &vm_spec("lr", 0, QEMU_DOMAIN)],
    );
    assert!(o.ok, "{}", o.stderr);
    eventually("lr running", || state(a, "lr") == "s \"running\"\n");
    let (pid, _) = qemu_of("astraeus-lr").expect("qemu runs");

    // libvirtd goes away and comes back; QEMU runs on.
    let libvirtd = libvirtd_pid().expect("the suite's libvirtd runs");
    // SAFETY: a signal to the suite's own libvirtd.
    assert_eq!(unsafe { libc::kill(libvirtd, libc::SIGTERM) }, 0);
    eventually("libvirtd gone", || libvirtd_pid().is_none());
    // The daemon has seen it go (its watcher's connection closed) …
    eventually("the daemon notices libvirtd went away", || {
        d.log_text().contains("went away; reconnecting")
    });
    // … and has not ended the VM for that.
    assert_eq!(
        state(a, "lr"),
        "s \"running\"\n",
        "a VM whose QEMU runs is not ended"
    );
    start_libvirtd();
    assert_eq!(
        qemu_of("astraeus-lr").map(|q| q.0),
        Some(pid),
        "not started twice"
    );

    // Its end is still noticed, through the daemon's new connection.
    virsh(&["destroy", "astraeus-lr"]).expect("destroy lr");
    eventually("lr ended", || gone(a, "lr"));
    assert!(
        // Destroyed (if the daemon had reconnected) or seen stopped on reconnecting.
        d.log_text().contains("worker lr failed: the domain"),
        "{}",
        d.log_text()
    );
}

fn qemu_template(name: &str) -> String {
    let xml = QEMU_DOMAIN.replace(
        "<name>q</name>",
        &format!("<name>astraeus-test-tmpl-{name}</name>"),
    );
    serde_json::json!({
        "name": name, "workload": {"model": "m", "runtime": "r"},
        "user": {"kind": "internal", "name": "staff"}, "vm": {"domain_xml": xml}, "baseboard": [],
    })
    .to_string()
}

/// Stateless slices (seed 003: "no user state is carried across slices"):
/// a template is stateless unless it says not, its VM defined with
/// transient disks, so what its guest wrote during one slice is gone in
/// the next. The guest's writes here are QEMU's own block layer writing
/// the disk (`qemu-io` through the monitor), as a guest OS would; the next
/// slice reads the disk as it was defined, and so does the host's file.
/// The same after QEMU is killed mid-slice (a crashed VM).
#[test]
fn real_qemu_a_stateless_templates_slices_each_start_from_its_clean_disk() {
    use std::os::unix::fs::PermissionsExt;
    let Some(_lock) = libvirtd() else { return };
    forget_template_domains(&["st"]);
    let dir = open_tempdir();
    // QEMU runs as libvirt's own user: the disk's folder is open to it.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let disk = dir.path().join("os.img");
    std::fs::File::create(&disk)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let bus = Bus::session();
    let d = start_majin(&bus, dir.path(), &handoff_on_qemu(), &[]);
    let a = &bus.address;
    let with_disk = qemu_template("st").replace(
        "<devices>",
        &format!(
            "<devices><disk type='file' device='disk'><driver name='qemu' type='raw'/>\
             <source file='{}'/><target dev='vda' bus='virtio'/></disk>",
            disk.display()
        ),
    );
    let mut spec: serde_json::Value = serde_json::from_str(&with_disk).unwrap();
    spec["os_disk"] = disk.display().to_string().into();
    let o = manager(a, None, "CreateTemplate", &["s", &spec.to_string()]);
    assert!(o.ok, "{}", o.stderr);
    let domain = "astraeus-test-tmpl-st";
    let defined = virsh(&["dumpxml", "--inactive", domain]).unwrap();
    assert!(defined.contains("<transient/>"), "{defined}");
    // The guest's disk is libvirt's overlay over the file; HMP's qemu-io
    // writes through QEMU's block layer as the guest would (its output is
    // not returned over the monitor: what it wrote is read from the files).
    let qemu_io = |cmd: &str| {
        // Through the disk's device (its QOM path: virtio-blk-pci's
        // backend), whose writes the guest's own are.
        let device = "/machine/peripheral/virtio-disk0/virtio-backend";
        let hmp = format!("qemu-io -d {device} \"{cmd}\"");
        virsh(&["qemu-monitor-command", domain, "--hmp", &hmp])
    };
    let overlay = dir.path().join(format!("os.img.TRANSIENT-{domain}"));
    // 4 KiB of 0x5a: what the slice wrote, wherever it landed.
    let written = |p: &Path| {
        let mark = [0x5au8; 4096];
        std::fs::read(p).is_ok_and(|b| b.windows(4096).step_by(512).any(|w| w == mark))
    };
    for slice in ["powered off", "crashed", "last"] {
        let o = manager(a, None, "Resume", &["sb", "st", "false"]);
        assert!(o.ok, "{}", o.stderr);
        eventually("st running", || template_state(a, "st") == "running");
        // What the slice before wrote is gone: the guest's disk is a fresh
        // overlay on the file as defined.
        assert!(overlay.exists(), "{slice}: the overlay libvirt boots from");
        assert!(!written(&overlay) && !written(&disk), "{slice}");
        if slice == "last" {
            break;
        }
        let said = qemu_io("write -P 0x5a 0 4k");
        assert_eq!(
            said.as_deref(),
            Some(""),
            "qemu-io says nothing when it wrote"
        );
        eventually("the guest's write in its overlay", || written(&overlay));
        assert!(
            !written(&disk),
            "the write went to the overlay, not the file"
        );
        if slice == "powered off" {
            assert!(manager(a, None, "PowerOff", &["sb", "st", "true"]).ok);
        } else {
            let (pid, _) = qemu_of(domain).expect("qemu runs");
            // SAFETY: a plain signal to the VM's QEMU.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        eventually("st off", || template_state(a, "st") != "running");
        assert!(!written(&disk));
    }
    let _ = manager(a, None, "PowerOff", &["sb", "st", "true"]);
    eventually("st off at the end", || template_state(a, "st") != "running");
    drop(d);
    forget_template_domains(&["st"]);
}

/// Every lifecycle event of the suite's libvirtd, as `virsh event --all
/// --loop --timestamp` prints them, independent of the daemon: each event
/// is seen (a poll of `virsh list` missed overlaps shorter than its period),
/// in libvirt's order.
struct VmEvents {
    virsh: std::process::Child,
    log: PathBuf,
}

/// Starts watching; returns once virsh is subscribed (it has reported a
/// probe domain defined and undefined here).
fn watch_template_vms(dir: &Path) -> VmEvents {
    let log = dir.join("vm-events.log");
    let watcher = Command::new("virsh")
        .args(["-c", &qemu_uri(), "event", "--all", "--loop", "--timestamp"])
        .stdout(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let probe = dir.join("probe.xml");
    std::fs::write(
        &probe,
        QEMU_DOMAIN.replace("<name>q</name>", "<name>astraeus-test-probe</name>"),
    )
    .unwrap();
    eventually("virsh event subscribed", || {
        let _ = virsh(&["define", probe.to_str().unwrap()]);
        let _ = virsh(&["undefine", "astraeus-test-probe"]);
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains("'astraeus-test-probe': Undefined"))
    });
    VmEvents {
        virsh: watcher,
        log,
    }
}

/// `2026-12-04 06:30:00.123+0000` as milliseconds (days counted from the
/// first date seen: a watch spans a minute, perhaps a midnight).
fn event_millis(stamp: &str, first_day: &mut Option<String>, days: &mut i64) -> i64 {
    let (date, time) = stamp.split_once(' ').expect("a date and a time");
    match first_day {
        Some(d) if d != date => {
            *days += 1;
            *first_day = Some(date.to_string());
        }
        None => *first_day = Some(date.to_string()),
        _ => {}
    }
    let hms = &time[..time.find(['+', '-']).unwrap_or(time.len())];
    let mut parts = hms.split(':');
    let (h, m, s): (i64, i64, f64) = (
        parts.next().unwrap().parse().unwrap(),
        parts.next().unwrap().parse().unwrap(),
        parts.next().unwrap().parse().unwrap(),
    );
    *days * 86_400_000 + (h * 3600 + m * 60) * 1000 + (s * 1000.0).round() as i64
}

impl VmEvents {
    /// Stops watching and checks what libvirt reported of the template VMs:
    /// no start while another is on, and each start at least `buffer` after
    /// the stop before it. Returns how many starts it saw.
    fn check(mut self, buffer: Duration) -> usize {
        let _ = self.virsh.kill();
        let _ = self.virsh.wait();
        let text = std::fs::read_to_string(&self.log).unwrap();
        let (mut on, mut starts) = (std::collections::BTreeSet::new(), 0);
        let (mut last_stop, mut day, mut days) = (None::<i64>, None, 0);
        for line in text.lines() {
            let Some((stamp, rest)) = line.split_once(": event 'lifecycle' for domain '") else {
                continue;
            };
            let Some((name, what)) = rest.split_once("': ") else {
                continue;
            };
            if !name.starts_with("astraeus-test-tmpl-") {
                continue;
            }
            let at = event_millis(stamp, &mut day, &mut days);
            match what.split(' ').next() {
                Some("Started") => {
                    assert!(on.is_empty(), "{name} started while {on:?} on:\n{text}");
                    if let Some(stop) = last_stop {
                        assert!(
                            at - stop >= buffer.as_millis() as i64,
                            "{name} started {} ms after the last stop, within the buffer:\n{text}",
                            at - stop
                        );
                    }
                    on.insert(name.to_string());
                    starts += 1;
                }
                Some("Stopped") => {
                    on.remove(name);
                    last_stop = Some(at);
                }
                _ => {}
            }
        }
        starts
    }
}

/// Time-slicing on real libvirtd: buffer 0, guests forced off after 2 s.
fn handoff_on_qemu() -> String {
    format!(
        "[schedule]\nhandoff_buffer_seconds = 0\n[runtime]\nlibvirt_uri = \"{}\"\nstop_timeout_seconds = 2\n[slicing]\nallow_no_baseboard = true\n",
        qemu_uri()
    )
}

/// Destroys and undefines the test templates' domains (left by an earlier run).
fn forget_template_domains(names: &[&str]) {
    for n in names {
        let d = format!("astraeus-test-tmpl-{n}");
        let _ = virsh(&["destroy", &d]);
        let _ = virsh(&["undefine", &d]);
    }
}

#[test]
fn real_qemu_two_scheduled_handoffs_force_off_guests_that_ignore_acpi_never_two_on() {
    let Some(_lock) = libvirtd() else { return };
    forget_template_domains(&["sa", "sb"]);
    let dir = open_tempdir();
    let bus = Bus::session();
    let d = start_majin(&bus, dir.path(), &handoff_on_qemu(), &[]);
    let a = &bus.address;
    assert!(manager(a, None, "CreateTemplate", &["s", &qemu_template("sa")]).ok);
    // sb: ready when its guest agent answers, and a GPU channel. Its guest
    // has no OS: no agent answers and nothing writes GPU figures.
    // Sockets in the test's directory: libvirt's default place is under the
    // suite's private /var/lib/libvirt, which the daemon (outside that mount
    // namespace) cannot see.
    let channels = format!(
        "<devices><channel type='unix'><source mode='bind' path='{0}/agent.sock'/>\
         <target type='virtio' name='org.qemu.guest_agent.0'/></channel>\
         <channel type='unix'><source mode='bind' path='{0}/gpu.sock'/>\
         <target type='virtio' name='org.astraeus.gpu.0'/></channel>",
        dir.path().display()
    );
    let mut sb: serde_json::Value =
        serde_json::from_str(&qemu_template("sb").replace("<devices>", &channels)).unwrap();
    sb["readiness"] = serde_json::json!({"agent": true});
    let o = manager(a, None, "CreateTemplate", &["s", &sb.to_string()]);
    assert!(o.ok, "{}", o.stderr);

    let events = watch_template_vms(dir.path());
    let o = manager(
        a,
        None,
        "SetSchedule",
        &[
            "ss",
            "sa",
            r#"[{"action":"resume","time":"+2"},{"action":"resume","time":"+16"}]"#,
        ],
    );
    assert!(o.ok, "{}", o.stderr);
    let o = manager(
        a,
        None,
        "SetSchedule",
        &["ss", "sb", r#"[{"action":"resume","time":"+9"}]"#],
    );
    assert!(o.ok, "{}", o.stderr);
    eventually("sa running", || template_state(a, "sa") == "running");
    // sa ignores ACPI: forced off after 2 s, then sb starts (buffer 0).
    eventually("sb starting", || template_state(a, "sb") == "starting");
    assert_eq!(template_state(a, "sa"), "off");
    eventually("sb's agent probed", || {
        d.log_text()
            .contains("sb is not ready yet: the guest agent does not answer")
    });
    // The reader connects on its own task; it may log after the probe.
    eventually("sb's GPU channel read", || {
        d.log_text()
            .contains("reading the GPU figures astraeus-test-tmpl-sb's guest writes to /")
    });
    assert_eq!(template_state(a, "sb"), "starting", "never ready");
    // The second handoff: sb (still starting) forced off, sa on again.
    eventually("sa running again", || template_state(a, "sa") == "running");
    assert_eq!(template_state(a, "sb"), "off");
    assert!(manager(a, None, "PowerOff", &["sb", "sa", "true"]).ok);
    eventually("sa off", || template_state(a, "sa") == "off");
    assert_eq!(events.check(Duration::ZERO), 3, "sa, sb, sa again");

    let db = rusqlite::Connection::open(d.state.join("ledger.db")).unwrap();
    let forced: i64 = db
        .query_row(
            "SELECT count(*) FROM handoff_steps WHERE step = 'forced'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(forced >= 2, "both handoffs forced a guest off: {forced}");
    let o = ctl(a, None, &["slices", "--report", "--json"]);
    let rows: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    let rows = rows.as_array().unwrap();
    let names: Vec<&str> = rows
        .iter()
        .map(|r| r["template"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["sa", "sb", "sa"], "{rows:?}");
    for r in rows {
        // No guest wrote GPU figures: not reported, never 0.
        assert!(
            r["gpu_avg_pct"].is_null() && r["gpu_energy_wh"].is_null(),
            "{r}"
        );
    }
    // sa's first slice ran a guest for seconds: libvirt counted its CPU time.
    assert!(
        rows[0]["cpu_avg_pct"].as_f64().is_some_and(|c| c > 0.0),
        "{rows:?}"
    );
    assert!(rows[1]["dead_time_ms"].as_i64().unwrap() >= 0, "{rows:?}");
    assert!(
        rows[1]["start_to_ready_ms"].is_null(),
        "sb never got ready: {rows:?}"
    );
    assert!(rows[2]["start_to_ready_ms"].is_i64(), "{rows:?}");
    drop(d);
    forget_template_domains(&["sa", "sb"]);
}

#[test]
fn real_qemu_a_daemon_killed_mid_handoff_finishes_it_after_restart_never_two_on() {
    let Some(_lock) = libvirtd() else { return };
    forget_template_domains(&["ta", "tb"]);
    let dir = open_tempdir();
    let bus = Bus::session();
    let start = |env: &[(&str, &str)]| start_majin(&bus, dir.path(), &handoff_on_qemu(), env);
    let a = bus.address.clone();
    let d = start(&[]);
    for n in ["ta", "tb"] {
        let o = manager(&a, None, "CreateTemplate", &["s", &qemu_template(n)]);
        assert!(o.ok, "{}", o.stderr);
    }
    assert!(manager(&a, None, "Resume", &["sb", "ta", "false"]).ok);
    eventually("ta running", || template_state(&a, "ta") == "running");
    let ledger = d.state.join("ledger.db");
    drop(d);

    // Watch libvirt all along: never two template VMs on.
    let events = watch_template_vms(dir.path());
    // Killed right after each step of a handoff is recorded, in turn: the
    // baseboard goes ta -> tb, tb -> ta, … and each restart finishes the
    // handoff from the step the ledger holds (ACPI ignored: forced after 2 s).
    let steps = [
        "power-off-asked",
        "forced",
        "stopped",
        "release-confirmed",
        "start-issued",
        "started",
    ];
    let mut holder = "ta";
    let mut last_id: i64 = rusqlite::Connection::open(&ledger)
        .unwrap()
        .query_row("SELECT max(id) FROM handoff_steps", [], |r| r.get(0))
        .unwrap();
    for point in steps {
        let next = if holder == "ta" { "tb" } else { "ta" };
        let failpoint = format!("slice.after-{point}=kill");
        let mut d = start(&[("ASTRAEUS_FAILPOINTS", &failpoint)]);
        eventually(&format!("{holder} adopted as running"), || {
            template_state(&a, holder) == "running"
        });
        let _ = manager(&a, None, "Resume", &["sb", next, "true"]);
        assert!(
            !d.child.wait().unwrap().success(),
            "the failpoint {point} killed the daemon"
        );
        let d = start(&[]);
        eventually(&format!("{next} running after a kill at {point}"), || {
            template_state(&a, next) == "running"
        });
        assert_eq!(template_state(&a, holder), "off", "killed at {point}");
        // One slice open, the incoming VM's: the outgoing one's was closed
        // (a kill right after "stopped" left it open for ever, billed until
        // now and overlapping the next).
        let open: Vec<String> = rusqlite::Connection::open(&ledger)
            .unwrap()
            .prepare("SELECT template FROM slices WHERE end_ms IS NULL")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(open, [next], "open slices after a kill at {point}");
        // This handoff's steps. A step recorded just before the kill may be
        // recorded again after it (its libvirt call may not have been
        // made), but the incoming VM is started and made ready once.
        let steps: Vec<(String, Option<String>, Option<String>)> =
            rusqlite::Connection::open(&ledger)
                .unwrap()
                .prepare(
                    "SELECT step, from_template, to_template FROM handoff_steps \
                     WHERE id > ?1 ORDER BY id",
                )
                .unwrap()
                .query_map([last_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .unwrap()
                .map(Result::unwrap)
                .collect();
        let count = |step: &str| steps.iter().filter(|s| s.0 == step).count();
        assert_eq!(count("started"), 1, "killed at {point}: {steps:?}");
        assert_eq!(count("ready"), 1, "killed at {point}: {steps:?}");
        assert!(count("start-issued") >= 1, "killed at {point}: {steps:?}");
        assert_eq!(count("start-failed"), 0, "killed at {point}: {steps:?}");
        let (last, _, to) = steps.last().unwrap();
        assert_eq!(
            (last.as_str(), to.as_deref()),
            ("ready", Some(next)),
            "{steps:?}"
        );
        last_id = rusqlite::Connection::open(&ledger)
            .unwrap()
            .query_row("SELECT max(id) FROM handoff_steps", [], |r| r.get(0))
            .unwrap();
        drop(d);
        holder = next;
    }
    assert!(events.check(Duration::ZERO) > 1, "no handoff seen");
    let forced: i64 = rusqlite::Connection::open(&ledger)
        .unwrap()
        .query_row(
            "SELECT count(*) FROM handoff_steps WHERE step = 'forced'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(
        forced >= steps.len() as i64,
        "each handoff forced its guest off: {forced}"
    );
    forget_template_domains(&["ta", "tb"]);
}

#[test]
fn real_qemu_a_template_that_cannot_start_is_retried_then_failed_and_the_gpu_stays_free() {
    let Some(_lock) = libvirtd() else { return };
    forget_template_domains(&["broken", "fine"]);
    let dir = open_tempdir();
    let bus = Bus::session();
    let d = start_majin(&bus, dir.path(), &handoff_on_qemu(), &[]);
    let a = &bus.address;
    // Its disk does not exist: libvirt defines it, but every start fails.
    let broken = qemu_template("broken").replace(
        "<devices>",
        "<devices><disk type='file' device='disk'><source file='/nonexistent/astraeus-os.img'/><target dev='vda'/></disk>",
    );
    assert!(manager(a, None, "CreateTemplate", &["s", &broken]).ok);
    assert!(manager(a, None, "CreateTemplate", &["s", &qemu_template("fine")]).ok);
    assert!(manager(a, None, "Resume", &["sb", "broken", "false"]).ok);
    eventually("broken failed", || template_state(a, "broken") == "failed");
    let db = rusqlite::Connection::open(d.state.join("ledger.db")).unwrap();
    let failed_starts: i64 = db
        .query_row(
            "SELECT count(*) FROM handoff_steps WHERE step = 'start-failed'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(failed_starts, 3, "the first start and two retries");
    let error: String = db
        .query_row(
            "SELECT error FROM slices WHERE template = 'broken'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(
        error.contains("nonexistent"),
        "libvirt's own words: {error}"
    );
    // The GPU stays free: the next template starts without a handoff.
    let o = manager(a, None, "Resume", &["sb", "fine", "false"]);
    assert!(o.ok, "{}", o.stderr);
    eventually("fine running", || template_state(a, "fine") == "running");
    let _ = manager(a, None, "PowerOff", &["sb", "fine", "true"]);
    eventually("fine off", || template_state(a, "fine") == "off");
    drop(d);
    forget_template_domains(&["broken", "fine"]);
}

/// A handoff whose target's domain is undefined in libvirt while it waits
/// out the buffer ends with a target-gone step and the baseboard free (no
/// retries); the next resume of an existing template runs.
#[test]
fn real_qemu_a_target_undefined_mid_handoff_frees_the_baseboard() {
    let Some(_lock) = libvirtd() else { return };
    forget_template_domains(&["ua", "ub"]);
    let dir = open_tempdir();
    let bus = Bus::session();
    let config =
        handoff_on_qemu().replace("handoff_buffer_seconds = 0", "handoff_buffer_seconds = 3");
    let d = start_majin(&bus, dir.path(), &config, &[]);
    let a = &bus.address;
    for n in ["ua", "ub"] {
        let o = manager(a, None, "CreateTemplate", &["s", &qemu_template(n)]);
        assert!(o.ok, "{}", o.stderr);
    }
    assert!(manager(a, None, "Resume", &["sb", "ua", "false"]).ok);
    eventually("ua running", || template_state(a, "ua") == "running");
    assert!(manager(a, None, "Resume", &["sb", "ub", "true"]).ok);
    // ua goes off (forced after 2 s: no OS answers ACPI); ub waits out the buffer.
    eventually("ua off, ub waiting", || {
        template_state(a, "ua") == "off" && template_state(a, "ub") == "waiting"
    });
    assert!(virsh(&["undefine", "astraeus-test-tmpl-ub"]).is_some());
    eventually("ub failed", || template_state(a, "ub") == "failed");
    let db = rusqlite::Connection::open(d.state.join("ledger.db")).unwrap();
    let gone: Vec<String> = db
        .prepare("SELECT ifnull(detail, '') FROM handoff_steps WHERE step = 'target-gone' AND to_template = 'ub'")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        gone,
        ["target gone: its domain astraeus-test-tmpl-ub is not defined in libvirt"]
    );
    let retries: i64 = db
        .query_row(
            "SELECT count(*) FROM handoff_steps WHERE step = 'start-failed'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(retries, 0, "no retries for a target that is gone");
    assert!(
        !running_domains()
            .iter()
            .any(|n| n.starts_with("astraeus-test-tmpl-")),
        "the baseboard is free"
    );
    // The next resume of a template that exists runs.
    assert!(manager(a, None, "Resume", &["sb", "ua", "false"]).ok);
    eventually("ua running again", || template_state(a, "ua") == "running");
    assert!(manager(a, None, "PowerOff", &["sb", "ua", "true"]).ok);
    eventually("ua off", || template_state(a, "ua") == "off");
    // A failed template may be removed.
    let o = manager(a, None, "RemoveTemplate", &["s", "ub"]);
    assert!(o.ok, "{}", o.stderr);
    drop(d);
    forget_template_domains(&["ua", "ub"]);
}

/// The release interlock, both halves, with the holder outside the daemon:
/// libvirtd serves its shared test driver (`test+unix:///default`) to the
/// daemon and to virsh alike, so this test can start and stop a domain that
/// is no template but holds the baseboard's device. While it runs, the
/// incoming template waits (the holder named, no start issued); when it
/// goes, the start proceeds. (Breaking `Libvirt::holders` to answer
/// "nobody" fails the first half; breaking it to answer always fails the second.)
#[test]
fn a_foreign_domain_holds_the_baseboard_until_it_goes() {
    let Some(_lock) = libvirtd() else { return };
    let uri = shared_test_driver();
    // The test's own connection: libvirtd keeps the shared test driver's
    // state only while some connection to it is open.
    let conn = libvirt::direct::open(&uri).expect("the suite's libvirtd serves the test driver");
    let intruder = conn
        .create_domain_xml(
            "<domain type='test'><name>intruder</name><memory>65536</memory>\
         <os><type>hvm</type></os><devices><hostdev mode='subsystem' type='pci' managed='yes'>\
         <source><address domain='0x0000' bus='0x41' slot='0x00' function='0x0'/></source>\
         </hostdev></devices></domain>",
            0,
        )
        .expect("the intruder runs");
    let dir = open_tempdir();
    let bus = Bus::session();
    let config =
        format!("[schedule]\nhandoff_buffer_seconds = 0\n[runtime]\nlibvirt_uri = \"{uri}\"\n[slicing]\nallow_no_baseboard = true\n");
    let d = start_majin(&bus, dir.path(), &config, &[]);
    let a = bus.address.clone();
    define_template(&a, "a");
    assert!(manager(&a, None, "Resume", &["sb", "a", "false"]).ok);
    eventually("the holder is named", || {
        d.log_text().contains("baseboard still held by intruder")
    });
    assert_eq!(template_state(&a, "a"), "waiting");
    let started = || {
        rusqlite::Connection::open(d.state.join("ledger.db"))
            .unwrap()
            .query_row(
                "SELECT count(*) FROM handoff_steps WHERE step = 'start-issued'",
                [],
                |r| r.get::<_, i64>(0),
            )
            .unwrap()
    };
    assert_eq!(started(), 0, "a start was issued while the device was held");
    // The holder goes: the template starts, with nothing else asked.
    intruder.destroy().expect("the intruder stops");
    eventually("a running", || template_state(&a, "a") == "running");
    assert_eq!(started(), 1);
    assert!(manager(&a, None, "PowerOff", &["sb", "a", "true"]).ok);
    eventually("a off", || template_state(&a, "a") == "off");
    drop(d);
    // Not closed: the virt crate panics when a close fails (as the daemon does).
    std::mem::forget(conn);
}

/// The watcher's own check fails on what it must catch: a start while
/// another template VM is on, even 1 ms of overlap, and a start inside the
/// buffer (lines as `virsh event --timestamp` prints them).
#[test]
fn the_vm_event_check_catches_an_overlap_and_a_short_buffer() {
    let dir = open_tempdir();
    let check = |lines: &str, buffer: u64| {
        let log = dir.path().join("events.log");
        std::fs::write(&log, lines).unwrap();
        let virsh = Command::new("true").spawn().unwrap();
        std::panic::catch_unwind(|| VmEvents { virsh, log }.check(Duration::from_secs(buffer)))
    };
    let ev = |t: &str, name: &str, what: &str| {
        format!("2026-12-04 {t}+0000: event 'lifecycle' for domain 'astraeus-test-tmpl-{name}': {what}\n")
    };
    let handoff = [
        ev("23:59:58.000", "a", "Started Booted"),
        ev("23:59:59.500", "a", "Stopped Destroyed"),
    ]
    .concat();
    let next_day = |t: &str| ev(t, "b", "Started Booted").replace("2026-12-04", "2026-12-05");
    assert_eq!(
        check(&(handoff.clone() + &next_day("00:00:00.000")), 0).ok(),
        Some(2)
    );
    assert!(check(&(handoff.clone() + &next_day("00:00:00.000")), 1).is_err());
    assert_eq!(
        check(&(handoff.clone() + &next_day("00:00:00.600")), 1).ok(),
        Some(2)
    );
    let overlap = [
        ev("10:00:00.000", "a", "Started Booted"),
        ev("10:00:05.000", "b", "Started Booted"),
        ev("10:00:05.001", "a", "Stopped Destroyed"),
    ]
    .concat();
    assert!(check(&overlap, 0).is_err());
}

/// A domain named like a worker's but without the daemon's mark is never
/// taken for it: after a restart that finds `astraeus-w` running but
/// unmarked (its own VM gone while the daemon was down), w ends as gone and
/// the stranger runs on, untouched.
#[test]
fn an_unmarked_domain_with_a_workers_name_is_not_taken_for_it() {
    let Some(_lock) = libvirtd() else { return };
    let uri = shared_test_driver();
    // The test's own connection keeps the shared test driver's state.
    let conn = libvirt::direct::open(&uri).expect("the suite's libvirtd serves the test driver");
    let dir = open_tempdir();
    let bus = Bus::session();
    let mut d = daemon(dir.path(), &bus, &uri, &[]);
    let a = bus.address.clone();
    let o = manager(
        &a,
        None,
        "SubmitWorker",
        &["s", &vm_spec("w", 0, TEST_DOMAIN)],
    );
    assert!(o.ok, "{}", o.stderr);
    eventually("w running", || state(&a, "w") == "s \"running\"\n");
    // The daemon dies; its VM goes; a stranger takes the name.
    d.child.kill().unwrap();
    d.child.wait().unwrap();
    conn.lookup_domain_by_name("astraeus-w")
        .expect("w's domain")
        .destroy()
        .expect("w's domain stops");
    let stranger = conn
        .create_domain_xml(
            "<domain type='test'><name>astraeus-w</name><memory>65536</memory>\
             <os><type>hvm</type></os></domain>",
            0,
        )
        .expect("the stranger runs");
    let d = daemon(dir.path(), &bus, &uri, &[]);
    eventually("w ended", || gone(&a, "w"));
    assert!(
        stranger.is_active().expect("the stranger answers"),
        "the stranger was stopped: {}",
        d.log_text()
    );
    stranger.destroy().expect("the stranger stops");
    drop(d);
    std::mem::forget(conn);
}

/// Never two on, even across a restart: two template VMs found on when the
/// daemon starts (started behind its back while it was down), one is
/// destroyed at once, the step recorded with why.
#[test]
fn two_template_vms_found_on_at_start_leave_one() {
    two_on_at_start(false);
}

/// The same with a ledger that refuses the step (a full disk): time-slicing
/// pauses, but the interlock's destroy does not wait for the record.
#[test]
fn two_template_vms_found_on_leave_one_though_the_ledger_refuses_the_step() {
    two_on_at_start(true);
}

/// A template VM started behind the daemon's back while another holds the
/// baseboard is destroyed (a `destroyed` step), and a restart after it
/// resumes from the step before: the holder runs on in the same slice. The
/// destroy was a `forced` step a restart resumed from: the holder was
/// recorded as found running again, a second `started` step.
#[test]
fn a_restart_after_a_newcomer_was_destroyed_keeps_the_holders_slice() {
    let Some(_lock) = libvirtd() else { return };
    let (conn, dir, bus, config) = defined_then_killed(&["ha", "hb"]);
    let a = bus.address.clone();
    let on = |name: &str| {
        conn.lookup_domain_by_name(name)
            .and_then(|d| d.is_active())
            .unwrap_or(false)
    };
    let d = start_majin(&bus, dir.path(), &config, &[]);
    assert!(manager(&a, None, "Resume", &["sb", "ha", "false"]).ok);
    eventually("ha running", || template_state(&a, "ha") == "running");
    conn.lookup_domain_by_name("tmpl-hb")
        .expect("defined by the daemon")
        .create()
        .expect("started behind its back");
    eventually("hb destroyed", || !on("tmpl-hb"));
    let ledger = d.state.join("ledger.db");
    let count = |sql: &str| -> i64 {
        rusqlite::Connection::open(&ledger)
            .unwrap()
            .query_row(sql, [], |r| r.get(0))
            .unwrap()
    };
    let destroyed = "SELECT count(*) FROM handoff_steps WHERE step = 'destroyed' \
                     AND from_template = 'hb' AND to_template = 'ha'";
    eventually("hb's destroy recorded", || count(destroyed) == 1);
    drop(d);
    let d = start_majin(&bus, dir.path(), &config, &[]);
    eventually("converged", || d.log_text().contains("should be on now"));
    eventually("ha running again", || template_state(&a, "ha") == "running");
    assert!(on("tmpl-ha") && !on("tmpl-hb"));
    let started =
        "SELECT count(*) FROM handoff_steps WHERE step = 'started' AND to_template = 'ha'";
    assert_eq!(count(started), 1, "{}", d.log_text());
    assert_eq!(
        count("SELECT count(*) FROM slices WHERE template = 'ha'"),
        1,
        "one slice"
    );
    for vm in ["tmpl-ha", "tmpl-hb"] {
        if let Ok(vm) = conn.lookup_domain_by_name(vm) {
            let _ = vm.destroy();
            let _ = vm.undefine();
        }
    }
    drop(d);
    std::mem::forget(conn);
}

/// The holder's VM runs on while the daemon is down (killed), another
/// template's VM is started behind its back, and the schedule gives the
/// baseboard to that one: at the start, the holder is the VM destroyed, and
/// its slice ends there with why (it stayed open, as if it still ran).
#[test]
fn a_holder_destroyed_at_a_start_has_its_slice_closed() {
    let Some(_lock) = libvirtd() else { return };
    let (conn, dir, bus, config) = defined_then_killed(&["ca", "cb"]);
    let a = bus.address.clone();
    let on = |name: &str| {
        conn.lookup_domain_by_name(name)
            .and_then(|d| d.is_active())
            .unwrap_or(false)
    };
    let mut d = start_majin(&bus, dir.path(), &config, &[]);
    assert!(manager(&a, None, "Resume", &["sb", "ca", "false"]).ok);
    eventually("ca running", || template_state(&a, "ca") == "running");
    let o = manager(
        &a,
        None,
        "SetSchedule",
        &["ss", "cb", r#"[{"action":"resume","time":"+4"}]"#],
    );
    assert!(o.ok, "{}", o.stderr);
    let due = std::time::Instant::now() + std::time::Duration::from_secs(4);
    d.child.kill().unwrap();
    d.child.wait().unwrap();
    conn.lookup_domain_by_name("tmpl-cb")
        .expect("defined by the daemon")
        .create()
        .expect("started behind its back");
    let ledger = d.state.join("ledger.db");
    let open_slices = || -> Vec<String> {
        let db = rusqlite::Connection::open(&ledger).unwrap();
        let mut q = db
            .prepare("SELECT template FROM slices WHERE end_ms IS NULL ORDER BY id")
            .unwrap();
        q.query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    assert_eq!(open_slices(), ["ca"]);
    // Restarted once the schedule says cb holds the baseboard.
    std::thread::sleep(due.saturating_duration_since(std::time::Instant::now()));
    drop(d);
    let d = start_majin(&bus, dir.path(), &config, &[]);
    eventually("converged", || d.log_text().contains("should be on now"));
    eventually("ca destroyed", || !on("tmpl-ca"));
    assert!(on("tmpl-cb"), "{}", d.log_text());
    eventually("cb's slice recorded", || open_slices() == ["cb"]);
    let error: String = rusqlite::Connection::open(&ledger)
        .unwrap()
        .query_row("SELECT error FROM slices WHERE template = 'ca'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert!(
        error.starts_with("destroyed at a start: on together with cb"),
        "{error}"
    );
    for vm in ["tmpl-ca", "tmpl-cb"] {
        if let Ok(vm) = conn.lookup_domain_by_name(vm) {
            let _ = vm.destroy();
            let _ = vm.undefine();
        }
    }
    drop(d);
    std::mem::forget(conn);
}

/// Templates defined by a daemon on the shared test driver (buffer 0; a
/// domain of the same name left by another test is removed first), which
/// is then killed, their VMs off: the driver's connection, and the
/// daemon's directory, bus and node.toml for the next start.
fn defined_then_killed(names: &[&str]) -> (virt::connect::Connect, tempfile::TempDir, Bus, String) {
    let uri = shared_test_driver();
    let conn = libvirt::direct::open(&uri).expect("the suite's libvirtd serves the test driver");
    for name in names {
        if let Ok(vm) = conn.lookup_domain_by_name(&format!("tmpl-{name}")) {
            let _ = vm.destroy();
            let _ = vm.undefine();
        }
    }
    let dir = open_tempdir();
    let bus = Bus::session();
    let config =
        format!("[schedule]\nhandoff_buffer_seconds = 0\n[runtime]\nlibvirt_uri = \"{uri}\"\n[slicing]\nallow_no_baseboard = true\n");
    let mut d = start_majin(&bus, dir.path(), &config, &[]);
    for name in names {
        define_template(&bus.address, name);
    }
    d.child.kill().unwrap();
    d.child.wait().unwrap();
    (conn, dir, bus, config)
}

fn two_on_at_start(refused: bool) {
    let Some(_lock) = libvirtd() else { return };
    let (conn, dir, bus, config) = defined_then_killed(&["a", "b"]);
    let on = |name: &str| {
        conn.lookup_domain_by_name(name)
            .and_then(|d| d.is_active())
            .unwrap_or(false)
    };
    for name in ["tmpl-a", "tmpl-b"] {
        conn.lookup_domain_by_name(name)
            .expect("defined by the daemon")
            .create()
            .expect("started behind its back");
    }
    assert!(on("tmpl-a") && on("tmpl-b"));
    let refuse = [("ASTRAEUS_FAILPOINTS", "store.step.destroyed=fail")];
    let env: &[(&str, &str)] = if refused { &refuse } else { &[] };
    let d = start_majin(&bus, dir.path(), &config, env);
    eventually("one of them off", || !(on("tmpl-a") && on("tmpl-b")));
    assert!(on("tmpl-a") || on("tmpl-b"), "one stays on");
    let destroyed: Option<String> = rusqlite::Connection::open(d.state.join("ledger.db"))
        .unwrap()
        .query_row(
            "SELECT detail FROM handoff_steps WHERE step = 'destroyed' ORDER BY id DESC LIMIT 1",
            [],
            |r| r.get(0),
        )
        .ok();
    if refused {
        assert_eq!(destroyed, None, "the refused step is not in the ledger");
        assert!(
            d.log_text().contains("refused handoff step destroyed"),
            "{}",
            d.log_text()
        );
    } else {
        let destroyed = destroyed.unwrap();
        assert!(
            destroyed.contains("exactly one template VM may be on"),
            "{destroyed}"
        );
    }
    for name in ["tmpl-a", "tmpl-b"] {
        if let Ok(d) = conn.lookup_domain_by_name(name) {
            let _ = d.destroy();
            let _ = d.undefine();
        }
    }
    drop(d);
    std::mem::forget(conn);
}

/// A template VM that stops while the daemon is asking libvirt what runs
/// (the answer held by a failpoint, as a busy loop would leave it unread):
/// once converged the daemon takes it for off, as it is. The stop's event
/// came before the answer was read; it was dropped, and the VM taken for on.
#[test]
fn a_vm_that_stops_while_libvirt_is_asked_what_runs_is_not_taken_for_on() {
    let Some(_lock) = libvirtd() else { return };
    let (conn, dir, bus, config) = defined_then_killed(&["late"]);
    let a = bus.address.clone();
    let vm = conn
        .lookup_domain_by_name("tmpl-late")
        .expect("defined by the daemon");
    vm.create().expect("started behind its back");
    let held = [(
        "ASTRAEUS_FAILPOINTS",
        "hypervisor.running-answered=pause5000",
    )];
    let d = start_majin(&bus, dir.path(), &config, &held);
    eventually("libvirt's answer held", || {
        d.log_text()
            .contains("failpoint hypervisor.running-answered reached")
    });
    vm.destroy().expect("stopped while the answer is held");
    eventually("converged", || d.log_text().contains("should be on now"));
    eventually("late taken for off", || template_state(&a, "late") == "off");
    // By the replay, not by an event after the answer (a destroy late
    // for the 5 s hold would pass without it).
    assert!(
        d.log_text()
            .contains("late's VM stopped while time-slicing was not converged"),
        "{}",
        d.log_text()
    );
    let stops: i64 = rusqlite::Connection::open(d.state.join("ledger.db"))
        .unwrap()
        .query_row(
            "SELECT count(*) FROM handoff_steps WHERE step = 'stopped' \
             AND detail LIKE '%stopped on its own%'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(stops, 1, "the stop is in the ledger: {}", d.log_text());
    let _ = vm.undefine();
    drop(d);
    std::mem::forget(conn);
}

/// The daemon's libvirt helper killed under a running VM worker: the worker
/// is not lost (a new helper finds its domain on the same libvirtd), and
/// stopping it goes through the new helper and ends it as the guest did.
#[test]
fn a_killed_libvirt_helper_is_started_again_and_loses_no_vm() {
    let Some(_lock) = libvirtd() else { return };
    let uri = shared_test_driver();
    // Keeps the shared test driver's state while the helpers come and go.
    let conn = libvirt::direct::open(&uri).expect("the suite's libvirtd serves the test driver");
    let dir = open_tempdir();
    let bus = Bus::session();
    let d = daemon(dir.path(), &bus, &uri, &[]);
    let a = &bus.address;
    let o = manager(
        a,
        None,
        "SubmitWorker",
        &["s", &vm_spec("kept", 1, TEST_DOMAIN)],
    );
    assert!(o.ok, "{}", o.stderr);
    eventually("kept running", || state(a, "kept") == "s \"running\"\n");
    let helper = || {
        let o = Command::new("pgrep")
            .args(["-P", &d.child.id().to_string(), "-f", "astraeus-libvirt"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout)
            .trim()
            .parse::<i32>()
            .ok()
    };
    let first = helper().expect("a helper runs the VM");
    // SAFETY: a plain kill(2) of the helper this test found.
    assert_eq!(unsafe { libc::kill(first, libc::SIGKILL) }, 0);
    let o = manager(a, None, "StopWorker", &["s", "kept"]);
    assert!(o.ok, "{}", o.stderr);
    eventually("kept gone", || gone(a, "kept"));
    let second = helper().expect("a new helper did the stop");
    assert_ne!(first, second);
    let o = manager(a, None, "ListEnded", &["xu", "0", "10"]);
    assert!(o.stdout.contains("\"kept\""), "{}", o.stdout);
    assert!(
        !o.stdout.contains("could not be seen") && !o.stdout.contains("failed"),
        "the worker ended as if its VM were lost: {}",
        o.stdout
    );
    assert!(
        conn.lookup_domain_by_name("astraeus-kept").is_err(),
        "the stopped VM is gone from libvirt"
    );
}
