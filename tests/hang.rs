//! The loop never waits on a hypervisor: with a libvirtd that accepts
//! connections and never answers (a unix socket nobody serves), every call
//! that needs libvirt waits in a task of its own, while D-Bus calls keep
//! being answered, WATCHDOG=1 keeps coming, and SIGTERM still ends the
//! daemon. A loop that awaited libvirt would stall all three. Likewise the
//! inventory's re-read (NVML, NSS): a hung one stops the daemon after the
//! watchdog's period rather than leave it placing on a stale machine.

mod common;

use common::*;
use std::os::unix::net::{UnixDatagram, UnixListener};
use std::time::{Duration, Instant};

/// A "libvirtd" that takes every connection and never says a word.
fn silent_libvirtd(path: &std::path::Path) {
    let listener = UnixListener::bind(path).unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming() {
            held.push(conn); // kept open, never read or written
        }
    });
}

/// A "systemd" on the bus at `address`: it owns org.freedesktop.systemd1
/// and never answers a call (a connection with no object served), until
/// the returned sender is dropped.
fn silent_systemd(address: &str) -> std::sync::mpsc::Sender<()> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let address = address.to_string();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let conn = zbus::connection::Builder::address(address.as_str())
                .name("org.freedesktop.systemd1")
                .build()
                .await
                .unwrap();
            ready_tx.send(()).unwrap();
            let _ = tokio::task::spawn_blocking(move || stop_rx.recv()).await;
            drop(conn);
        });
    });
    ready_rx.recv().unwrap();
    stop_tx
}

/// A bound notify socket in `dir`, read with a 100 ms timeout.
fn notify_socket(dir: &std::path::Path) -> (std::path::PathBuf, UnixDatagram) {
    let path = dir.join("notify.sock");
    let notify = UnixDatagram::bind(&path).unwrap();
    notify
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    (path, notify)
}

/// busctl with a bound on how long it waits for the reply.
fn call(address: &str, timeout_s: u32, method: &str, args: &[&str]) -> Out {
    let timeout = format!("--timeout={timeout_s}");
    let mut all = vec![
        timeout.as_str(),
        "call",
        "org.astraeus.Node1",
        "/org/astraeus/Node1",
        "org.astraeus.Node1.Manager",
        method,
    ];
    all.extend_from_slice(args);
    busctl(address, &all)
}

#[test]
fn a_hung_libvirtd_stalls_no_caller_and_no_watchdog_ping() {
    let dir = open_tempdir();
    let sock = dir.path().join("libvirt-sock");
    silent_libvirtd(&sock);
    // A template in the ledger: at start the daemon must learn whether its
    // VM runs, which asks libvirt.
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let mut store = astraeusd::store::Store::open(&state.join("ledger.db")).unwrap();
    store
        .insert_template("a", &test_template("a"), astraeusd::time::EpochMs::now())
        .unwrap();
    drop(store);

    let (notify_path, notify) = notify_socket(dir.path());
    let bus = Bus::session();
    let config = format!(
        "[runtime]\nlibvirt_uri = \"qemu+unix:///system?socket={}\"\n",
        sock.display()
    );
    // 1 s watchdog: a ping every 500 ms while the loop turns.
    let d = start_majin(
        &bus,
        dir.path(),
        &config,
        &[
            ("NOTIFY_SOCKET", notify_path.to_str().unwrap()),
            ("WATCHDOG_USEC", "1000000"),
        ],
    );

    // A new template's VM is looked up in libvirt: that call waits (its
    // reply with it), in the background.
    let address = bus.address.clone();
    let spec_b = test_template("b");
    let create = std::thread::spawn(move || call(&address, 8, "CreateTemplate", &["s", &spec_b]));

    // Meanwhile everything that does not need libvirt is answered.
    std::thread::sleep(Duration::from_millis(500));
    let listed = call(&bus.address, 5, "ListWorkers", &[]);
    assert!(listed.ok, "ListWorkers: {}{}", listed.stdout, listed.stderr);
    let submitted = call(
        &bus.address,
        5,
        "SubmitWorker",
        &["s", &shared_spec("listen", "2.5")],
    );
    assert!(
        submitted.ok && submitted.stdout.contains("running"),
        "SubmitWorker: {}{}",
        submitted.stdout,
        submitted.stderr
    );
    // A person's resume is refused while the daemon cannot know what runs,
    // rather than started from a guess or left waiting.
    let resume = call(&bus.address, 5, "Resume", &["sb", "a", "false"]);
    assert!(
        !resume.ok && resume.stderr.contains("libvirt has not answered yet"),
        "Resume: {}{}",
        resume.stdout,
        resume.stderr
    );
    let templates = call(&bus.address, 5, "ListTemplates", &[]);
    assert!(templates.ok, "ListTemplates: {}", templates.stderr);
    assert_eq!(template_state(&bus.address, "a"), "off");

    // The watchdog keeps being fed: count pings over 3 s.
    let mut pings = 0;
    let start = Instant::now();
    let mut buf = [0u8; 4096];
    while start.elapsed() < Duration::from_secs(3) {
        if let Ok(n) = notify.recv(&mut buf) {
            pings += String::from_utf8_lossy(&buf[..n])
                .matches("WATCHDOG=1")
                .count();
        }
    }
    assert!(pings >= 4, "{pings} WATCHDOG=1 in 3 s with a hung libvirtd");

    // The template call is still waiting on libvirt (never answered).
    let created = create.join().unwrap();
    assert!(
        !created.ok,
        "CreateTemplate cannot succeed without libvirt: {}",
        created.stdout
    );

    // SIGTERM ends the daemon although calls still wait on libvirt.
    let mut d = d;
    d.signal(libc::SIGTERM);
    let status = ends_within(&mut d, &notify, "SIGTERM did not end the daemon");
    assert!(status.success(), "{status:?}; log:\n{}", d.log_text());
}

/// The daemon's exit status once it ends, within 15 s (else `what` fails
/// the test); its notify socket is read meanwhile (the daemon's messages
/// go on arriving and must not fill it).
fn ends_within(d: &mut Daemon, notify: &UnixDatagram, what: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut buf = [0u8; 4096];
    loop {
        let _ = notify.recv(&mut buf); // at most its 100 ms read timeout
        if let Some(status) = d.child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "{what}; log:\n{}", d.log_text());
    }
}

/// The inventory's re-read runs off the loop (tests/hostile.rs), so a hung
/// NVML or user-name lookup no longer stalls the loop and its watchdog
/// pings: a re-read that has not ended within the watchdog's period stops
/// the daemon instead (exit 1, saying why), for systemd to start it afresh,
/// as the missing pings had it do.
#[test]
fn a_reread_hung_past_the_watchdog_period_stops_the_daemon() {
    let dir = open_tempdir();
    let (notify_path, notify) = notify_socket(dir.path());
    let bus = Bus::session();
    let mut d = start_majin(
        &bus,
        dir.path(),
        "[inventory]\nrefresh_seconds = 0.2\n",
        &[
            ("NOTIFY_SOCKET", notify_path.to_str().unwrap()),
            ("WATCHDOG_USEC", "2000000"),
            ("ASTRAEUS_FAILPOINTS", "inventory.read=pause60000"),
        ],
    );
    // The desktop takes more memory: the next refresh re-reads, and hangs.
    let held = Instant::now();
    let sim = dir.path().join("majin.toml");
    let text = std::fs::read_to_string(&sim).unwrap();
    std::fs::write(&sim, text.replace("outside_gb = 1", "outside_gb = 2")).unwrap();
    eventually("the re-read is held inside", || {
        d.log_text().contains("failpoint inventory.read reached")
    });
    let status = ends_within(&mut d, &notify, "a hung re-read did not stop the daemon");
    assert_eq!(status.code(), Some(1), "log:\n{}", d.log_text());
    assert!(
        held.elapsed() >= Duration::from_secs(2),
        "stopped before the watchdog's period"
    );
    assert!(
        d.log_text()
            .contains("re-reading the machine (the inventory changed) has not ended after 2 s"),
        "{}",
        d.log_text()
    );
}

/// zbus's reader ends when the bus daemon goes (a restart of dbus, a
/// failed socket). The loop would go on, pinging the watchdog, with every
/// call unanswered: the daemon stops instead (exit 1, saying why), for
/// systemd to start it afresh on the new bus.
#[test]
fn a_bus_that_goes_away_stops_the_daemon() {
    let dir = open_tempdir();
    let (notify_path, notify) = notify_socket(dir.path());
    let bus = Bus::session();
    let mut d = start_majin(
        &bus,
        dir.path(),
        "",
        &[
            ("NOTIFY_SOCKET", notify_path.to_str().unwrap()),
            ("WATCHDOG_USEC", "2000000"),
        ],
    );
    drop(bus); // SIGTERM to this test's dbus-daemon
    let status = ends_within(&mut d, &notify, "a lost bus did not stop the daemon");
    assert_eq!(status.code(), Some(1), "log:\n{}", d.log_text());
    assert!(
        d.log_text()
            .contains("stopped: Backend: the bus connection closed"),
        "{}",
        d.log_text()
    );
}

/// Nothing waits forever on a backend that accepts and never answers: a
/// container worker whose podman never answers, and a VM worker whose
/// libvirtd never answers, each end `failed` within their deadlines
/// (runtime.podman_timeout_seconds; deadline.rs's, shortened here), with a
/// reason naming the backend and what it waited for, and their shares are
/// freed; calls are answered meanwhile. Seen failing with the libvirt
/// call's deadline left out (the VM worker stayed `starting`).
#[test]
fn a_launch_whose_backend_never_answers_fails_in_its_time_and_frees_its_share() {
    let dir = open_tempdir();
    let podman = dir.path().join("podman.sock");
    let libvirt = dir.path().join("libvirt-sock");
    silent_libvirtd(&podman); // the same silence serves for podman
    silent_libvirtd(&libvirt);
    let bus = Bus::session();
    let _systemd = silent_systemd(&bus.address);
    let config = format!(
        "[access]\nvms_for_group = true\n[runtime]\npodman_socket = \"{}\"\n\
         podman_timeout_seconds = 1\nlibvirt_uri = \"qemu+unix:///system?socket={}\"\n",
        podman.display(),
        libvirt.display()
    );
    let d = start_majin(
        &bus,
        dir.path(),
        &config,
        &[("ASTRAEUS_CALL_DEADLINE_MS", "1500")],
    );
    let a = &bus.address;
    let container = r#"{"name":"c","requested_resources":{"gpu_requests":{"shared":true,"memory_gb":3}},"run":{"container":{"image":"docker.io/library/busybox"}}}"#;
    let o = manager(a, None, "SubmitWorker", &["s", container]);
    assert!(o.ok, "{}", o.stderr);
    let o = manager(
        a,
        None,
        "SubmitWorker",
        &["s", &vm_spec("v", 1, "<domain/>")],
    );
    assert!(o.ok, "{}", o.stderr);
    let unit = r#"{"name":"u","requested_resources":{"gpu_requests":{"shared":true,"memory_gb":1}},"run":{"unit":{"exec":["/bin/sleep","60"]}}}"#;
    let o = manager(a, None, "SubmitWorker", &["s", unit]);
    assert!(o.ok, "{}", o.stderr);
    let started = Instant::now();
    // Answered meanwhile.
    assert!(call(a, 2, "ListWorkers", &[]).ok);
    eventually("the three launches end", || {
        gone(a, "c") && gone(a, "v") && gone(a, "u")
    });
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    let history = ctl(a, None, &["history"]);
    assert!(
        history
            .stdout
            .contains("podman create: no answer within 1 s"),
        "{}{}",
        history.stdout,
        history.stderr
    );
    assert!(
        history.stdout.contains("libvirt did not answer"),
        "{}{}",
        history.stdout,
        history.stderr
    );
    // systemd's deadline (docs/reliability.md: "systemd 30 s a call").
    assert!(
        history
            .stdout
            .contains("did not answer StartTransientUnit within 1.5 s"),
        "{}{}",
        history.stdout,
        history.stderr
    );
    // Their shares are free again: a whole GPU request fits the GPU.
    let o = manager(
        a,
        None,
        "SubmitWorker",
        &[
            "s",
            r#"{"name":"whole","requested_resources":{"gpu_requests":{"count":1}}}"#,
        ],
    );
    assert!(
        o.ok && o.stdout.contains("running"),
        "{}{}",
        o.stdout,
        o.stderr
    );
    drop(d);
}
