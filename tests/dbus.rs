//! The real daemon on a real dbus-daemon, driven by busctl, gdbus and astraeusctl.

mod common;
use common::*;

fn sim_file(dir: &std::path::Path) -> std::path::PathBuf {
    let p = dir.join("majin.toml");
    std::fs::write(&p, MAJIN_TOML).unwrap();
    p
}

/// The daemon with `ASTRAEUS_FAILPOINTS` set to `spec`.
fn with_failpoints(bus: &Bus, dir: &std::path::Path, sim: &std::path::Path, spec: &str) -> Daemon {
    Daemon::start(bus, dir, sim, &[("ASTRAEUS_FAILPOINTS", spec)])
}

#[test]
fn seed_example_over_busctl_and_gdbus_with_signals_and_restart() {
    let dir = open_tempdir();
    let bus = Bus::session();
    let sim = sim_file(dir.path());
    let d = Daemon::start(&bus, dir.path(), &sim, &[]);
    let a = bus.address.clone();

    // Watch the bus for signals while we work.
    let monitor_log = dir.path().join("monitor.log");
    let mut monitor = monitor(
        &a,
        "type='signal',sender='org.astraeus.Node1'",
        &monitor_log,
    );

    let o = manager(
        &a,
        None,
        "SubmitWorker",
        &["s", &shared_spec("listen", "2.2")],
    );
    assert!(o.ok, "{}", o.stderr);
    assert_eq!(
        o.stdout.trim(),
        r#"osas "/org/astraeus/Node1/worker/listen" "running" 0"#
    );
    let o = gdbus_manager(&a, "SubmitWorker", &[&shared_spec("voice", "4.2")]);
    assert!(o.ok, "{}", o.stderr);
    assert!(o.stdout.contains("'running'"), "{}", o.stdout);
    let o = manager(
        &a,
        None,
        "SubmitWorker",
        &["s", &shared_spec("small", "1.5")],
    );
    assert_eq!(
        o.stdout.trim(),
        r#"osas "/org/astraeus/Node1/worker/small" "pending" 1 "GPU 0 of majin: 6.4 of 7 GB taken by shared work; it needs 1.5""#
    );
    let o = gdbus_manager(&a, "SubmitWorker", &[&shared_spec("big", "7.5")]);
    assert!(
        o.stdout.contains(
            "GPU 0 of majin offers 7 of its 8 GB (1 GB held outside Astraeus); it needs 7.5"
        ),
        "{}",
        o.stdout
    );

    // The sharers line and the GPU object.
    let o = manager(&a, None, "ListSharers", &["u", "0"]);
    assert!(
        o.stdout.contains(r#""listen" 2.2 "voice" 4.2"#),
        "{}",
        o.stdout
    );
    let o = gdbus_manager(&a, "ListSharers", &["0"]);
    assert!(
        o.stdout
            .contains("shared: listen 2.2 GB, voice 4.2 GB — 6.4 GB taken"),
        "{}",
        o.stdout
    );
    let o = busctl(
        &a,
        &[
            "get-property",
            "org.astraeus.Node1",
            "/org/astraeus/Node1/gpu/0",
            "org.astraeus.Node1.Gpu",
            "OfferedGb",
            "TakenGb",
            "Mode",
            "Sharers",
        ],
    );
    assert_eq!(
        o.stdout,
        "d 7\nd 6.4\ns \"shared\"\na(sd) 2 \"listen\" 2.2 \"voice\" 4.2\n"
    );

    // Typed errors with the foundation's messages.
    let o = gdbus_manager(
        &a,
        "SubmitWorker",
        &[r#"{"name":"x","requested_resources":{"gpu_requests":{"shared":true}}}"#],
    );
    assert!(!o.ok);
    assert!(
        o.stderr.contains("org.astraeus.Node1.Error.InvalidRequest"),
        "{}",
        o.stderr
    );
    assert!(
        o.stderr
            .contains("requested_resources.gpu_requests.memory_gb: required when shared is true"),
        "{}",
        o.stderr
    );
    let o = gdbus_manager(&a, "SubmitWorker", &[&shared_spec("listen", "1")]);
    assert!(
        o.stderr.contains("org.astraeus.Node1.Error.Exists"),
        "{}",
        o.stderr
    );
    let o = gdbus_manager(&a, "StopWorker", &["nope"]);
    assert!(
        o.stderr.contains("org.astraeus.Node1.Error.NotFound"),
        "{}",
        o.stderr
    );
    let o = gdbus_manager(&a, "GetWorker", &["small"]);
    assert!(
        o.stdout
            .contains("objectpath '/org/astraeus/Node1/worker/small'"),
        "{}",
        o.stdout
    );

    // Stop voice: small is placed, its properties change; big still waits.
    let o = busctl(
        &a,
        &[
            "call",
            "org.astraeus.Node1",
            "/org/astraeus/Node1/worker/voice",
            "org.astraeus.Node1.Worker",
            "Stop",
        ],
    );
    assert!(o.ok, "{}", o.stderr);
    let o = busctl(
        &a,
        &[
            "get-property",
            "org.astraeus.Node1",
            "/org/astraeus/Node1/worker/small",
            "org.astraeus.Node1.Worker",
            "State",
            "PendingReasons",
            "Gpus",
        ],
    );
    assert_eq!(
        o.stdout,
        "s \"running\"\nas 0\na(us) 1 0 \"GPU-5c0a7d3e-4060-4b1e-9f00-000000000000\"\n"
    );
    let o = busctl(
        &a,
        &[
            "get-property",
            "org.astraeus.Node1",
            "/org/astraeus/Node1",
            "org.astraeus.Node1.Manager",
            "WorkersRunning",
            "WorkersPending",
            "Machine",
            "Wsl",
        ],
    );
    assert_eq!(o.stdout, "u 2\nu 1\ns \"majin\"\nb false\n");

    eventually("signals seen by dbus-monitor", || {
        let log = std::fs::read_to_string(&monitor_log).unwrap_or_default();
        log.contains("member=WorkerRemoved") && log.contains("path=/org/astraeus/Node1/worker/small; interface=org.freedesktop.DBus.Properties; member=PropertiesChanged")
    });
    let _ = monitor.kill();
    let _ = monitor.wait();
    let log = std::fs::read_to_string(&monitor_log).unwrap();
    assert!(log.contains("member=WorkerNew"), "{log}");
    assert!(log.contains("member=InterfacesAdded"), "{log}");
    assert!(log.contains("member=InterfacesRemoved"), "{log}");
    // PropertiesChanged only when something may have changed, and for big (still
    // pending, its reasons read when it appeared) only as an invalidation of its
    // reasons: they are computed when read, not rebuilt for the queue.
    let big = "path=/org/astraeus/Node1/worker/big; interface=org.freedesktop.DBus.Properties";
    assert!(
        log.contains(big),
        "big's reasons were read, then GPU 0 changed: {log}"
    );
    for (at, _) in log.match_indices(big) {
        let rest = &log[at..];
        let end = rest[1..]
            .find("\nsignal ")
            .or_else(|| rest[1..].find("\nmethod "))
            .map_or(rest.len(), |e| e + 1);
        let signal = &rest[..end];
        assert!(
            signal.contains("string \"PendingReasons\"") && !signal.contains("dict entry("),
            "{signal}"
        );
    }

    // Journal fields: each event about a worker names it and its kind.
    let log = d.log_text();
    assert!(
        log.contains("message_id=\"289c420c04474b6894f80da2da49d6c0\" worker=listen gpu=0"),
        "{log}"
    );
    assert!(
        log.contains("message_id=\"c333d8604cae4623bc6d1d18f2136927\" worker=small"),
        "{log}"
    );
    assert!(
        log.contains("message_id=\"3f42d4092f59400783976b9f3a69e65d\" worker=voice"),
        "{log}"
    );

    // Restart: the same placements and reasons come back from the ledger.
    let before = manager(&a, None, "ListWorkers", &[]).stdout;
    assert!(d.stop().success());
    let d = Daemon::start(&bus, dir.path(), &sim, &[]);
    assert_eq!(manager(&a, None, "ListWorkers", &[]).stdout, before);
    // (busctl escapes the non-ASCII middle dot.)
    assert!(
        before.contains(r#""small" "running" 0 "1 \302\267 shared 1.5 GB""#),
        "{before}"
    );

    // The sim file changes (the desktop lets go of its GB): the GPU offers
    // 8 and big's reason follows.
    std::fs::write(&sim, MAJIN_TOML.replace("outside_gb = 1", "outside_gb = 0")).unwrap();
    d.signal(libc::SIGHUP);
    eventually("big placed after the inventory changed", || {
        busctl(
            &a,
            &[
                "get-property",
                "org.astraeus.Node1",
                "/org/astraeus/Node1/gpu/0",
                "org.astraeus.Node1.Gpu",
                "OfferedGb",
            ],
        )
        .stdout
            == "d 8\n"
    });
    // 2.2 + 1.5 + 7.5 > 8: big still waits, with a current reason.
    let o = busctl(
        &a,
        &[
            "get-property",
            "org.astraeus.Node1",
            "/org/astraeus/Node1/worker/big",
            "org.astraeus.Node1.Worker",
            "PendingReasons",
        ],
    );
    assert_eq!(
        o.stdout,
        "as 1 \"GPU 0 of majin: 3.7 of 8 GB taken by shared work; it needs 7.5\"\n"
    );
}

#[test]
fn why_not_is_a_dry_run() {
    let dir = open_tempdir();
    let bus = Bus::session();
    let _d = Daemon::start(&bus, dir.path(), &sim_file(dir.path()), &[]);
    let o = manager(&bus.address, None, "WhyNot", &["s", &shared_spec("x", "2")]);
    assert_eq!(o.stdout.trim(), "bauas true 1 0 0");
    let o = manager(
        &bus.address,
        None,
        "WhyNot",
        &["s", &shared_spec("x", "7.5")],
    );
    assert_eq!(
        o.stdout.trim(),
        r#"bauas false 0 1 "GPU 0 of majin offers 7 of its 8 GB (1 GB held outside Astraeus); it needs 7.5""#
    );
    assert_eq!(
        manager(&bus.address, None, "ListWorkers", &[])
            .stdout
            .trim(),
        "a(ssusdaud) 0"
    );
}

/// The `<interface name="org.astraeus…">` blocks of an introspection document.
fn interface_blocks(xml: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = xml;
    while let Some(start) = rest.find("<interface name=\"org.astraeus.") {
        let end = rest[start..].find("</interface>").unwrap() + start + "</interface>".len();
        let block: Vec<&str> = rest[start..end].lines().map(str::trim).collect();
        out.push(block.join("\n"));
        rest = &rest[end..];
    }
    out.sort();
    out
}

#[test]
fn introspection_of_the_live_daemon_matches_the_committed_xml() {
    let dir = open_tempdir();
    let bus = Bus::session();
    std::fs::write(dir.path().join("node.toml"), TEST_DRIVER).unwrap();
    let _d = Daemon::start(&bus, dir.path(), &sim_file(dir.path()), &[]);
    let a = &bus.address;
    manager(a, None, "SubmitWorker", &["s", r#"{"name":"w.1"}"#]);
    define_template(a, "t");
    let o = manager(
        a,
        None,
        "SetSchedule",
        &["ss", "t", r#"[{"action":"resume","time":"+3600"}]"#],
    );
    assert!(o.ok, "{}", o.stderr);
    // busctl reads every path without a warning (zbus's own Introspect
    // nested each descendant's interfaces: 66 lines of warnings).
    let shown = busctl(a, &["tree", "org.astraeus.Node1"]);
    assert!(
        shown.ok && shown.stderr.is_empty(),
        "busctl tree: {}",
        shown.stderr
    );
    let tree = busctl(a, &["tree", "--list", "org.astraeus.Node1"]).stdout;
    let mut live = Vec::new();
    for path in tree.lines() {
        let o = busctl(
            a,
            &["introspect", "--xml-interface", "org.astraeus.Node1", path],
        );
        assert!(
            o.stderr.is_empty(),
            "busctl introspect {path}: {}",
            o.stderr
        );
        let plain = busctl(a, &["introspect", "org.astraeus.Node1", path]);
        assert!(
            plain.ok && plain.stderr.is_empty(),
            "busctl introspect {path}: {}",
            plain.stderr
        );
        let xml = o.stdout;
        for b in interface_blocks(&xml) {
            if !live.contains(&b) {
                live.push(b);
            }
        }
    }
    live.sort();
    assert!(
        tree.contains("/org/astraeus/Node1/worker/w_2e1"),
        "escaped worker path: {tree}"
    );
    let committed = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/dbus/org.astraeus.Node1.xml"
    ))
    .unwrap();
    assert_eq!(
        live,
        interface_blocks(&committed),
        "dbus/org.astraeus.Node1.xml differs from the live daemon: run scripts/introspect-xml"
    );
    assert_eq!(
        live.len(),
        5,
        "Manager, Gpu, Worker, Template and Directory"
    );
}

#[test]
fn watchdog_pings_come_from_the_service_loop_and_stop_when_it_is_stuck() {
    use std::os::unix::net::UnixDatagram;
    use std::time::{Duration, Instant};
    let dir = open_tempdir();
    let bus = Bus::session();
    let sock_path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let sock_str = sock_path.to_str().unwrap().to_string();
    // 100 ms watchdog: a ping every 50 ms. The loop blocks on its 40th turn.
    let mut d = Daemon::start(
        &bus,
        dir.path(),
        &sim_file(dir.path()),
        &[
            ("NOTIFY_SOCKET", &sock_str),
            ("WATCHDOG_USEC", "100000"),
            ("ASTRAEUS_FAILPOINTS", "service.loop=block@40"),
        ],
    );
    let mut buf = [0u8; 4096];
    let mut messages: Vec<String> = Vec::new();
    let mut recv = |messages: &mut Vec<String>| match sock.recv(&mut buf) {
        Ok(n) => {
            messages.push(String::from_utf8_lossy(&buf[..n]).into_owned());
            true
        }
        Err(_) => false,
    };
    // Until the loop says it is held (the failpoint logs as it fires).
    eventually("the loop is held at its failpoint", || {
        recv(&mut messages);
        d.log_text().contains("failpoint service.loop reached")
    });
    // What the loop sent before it was held is already queued: drain it.
    sock.set_nonblocking(true).unwrap();
    while recv(&mut messages) {}
    sock.set_nonblocking(false).unwrap();
    let ready = messages
        .iter()
        .position(|m| m.contains("READY=1"))
        .expect("READY=1 sent");
    assert!(
        messages[ready].contains("STATUS=0 workers, 0 pending"),
        "{:?}",
        messages[ready]
    );
    let pings = |m: &[String]| m.iter().filter(|m| m.contains("WATCHDOG=1")).count();
    let before = pings(&messages);
    assert!(before >= 10, "pings before the stall: {before}");
    // From the moment the loop is held, 40 watchdog periods in which a ping
    // from anywhere but the loop would have come ~40 times. Absence needs a
    // window, but this one starts where the loop stopped, not at the last
    // ping, and a slow machine can only make pings fewer: it bounds no speed.
    let held = Instant::now();
    let mut after = Vec::new();
    while held.elapsed() < Duration::from_secs(2) {
        recv(&mut after);
    }
    assert_eq!(
        pings(&after),
        0,
        "pings went on while the service loop was held: {after:?}"
    );
    // The process is alive, held where the failpoint holds it: the stuck
    // loop stopped the pings. The bus shares the loop's thread, so nothing
    // answers either until the watchdog has the daemon restarted
    // (tests/system_manager.sh sees that under systemd).
    assert!(d.child.try_wait().unwrap().is_none(), "the daemon is alive");
    let o = busctl(
        &bus.address,
        &[
            "--timeout=1",
            "call",
            "org.astraeus.Node1",
            "/",
            "org.freedesktop.DBus.Peer",
            "Ping",
        ],
    );
    assert!(!o.ok, "a daemon with a stuck loop answered: {}", o.stdout);
    drop(d);
}

/// A new worker's object is registered before its SubmitWorker reply (so
/// the caller can read it at once) and announced after it: the reply
/// leaves the daemon before InterfacesAdded, which carries the worker's
/// properties as a reader without credentials sees them (#25: the
/// announcement was built on the call's path, under zbus's tree lock).
#[test]
fn a_new_worker_is_announced_after_its_reply_with_its_properties() {
    let dir = open_tempdir();
    let bus = Bus::session();
    let _d = Daemon::start(&bus, dir.path(), &sim_file(dir.path()), &[]);
    let a = &bus.address;
    let log = dir.path().join("monitor.log");
    let mut watch = monitor(a, "sender='org.astraeus.Node1'", &log);
    let o = manager(a, None, "SubmitWorker", &["s", &shared_spec("voice", "1")]);
    assert!(o.ok, "{}", o.stderr);
    let o = busctl(
        a,
        &[
            "get-property",
            "org.astraeus.Node1",
            "/org/astraeus/Node1/worker/voice",
            "org.astraeus.Node1.Worker",
            "State",
        ],
    );
    assert_eq!(o.stdout, "s \"running\"\n", "{}", o.stderr);
    eventually("InterfacesAdded seen", || {
        std::fs::read_to_string(&log).is_ok_and(|s| s.contains("member=InterfacesAdded"))
    });
    let _ = watch.kill();
    let _ = watch.wait();
    let seen = std::fs::read_to_string(&log).unwrap();
    let reply = seen.find("method return").expect("the reply was seen");
    let added = seen.find("member=InterfacesAdded").unwrap();
    assert!(reply < added, "InterfacesAdded before the reply: {seen}");
    let signal = &seen[added..];
    for part in [
        "object path \"/org/astraeus/Node1/worker/voice\"",
        "string \"org.astraeus.Node1.Worker\"",
        "string \"State\"\n               variant                   string \"running\"",
    ] {
        assert!(signal.contains(part), "{part} missing: {signal}");
    }
}

/// A worker's InterfacesAdded is built from its view, not through zbus's
/// GetAll (#25): it must carry exactly what GetAll answers for the same
/// object — zbus's own answer is the oracle — for a running worker and a
/// waiting one, whose reasons it carries. (No env here: the request's env
/// hiding is request::redact_env's, tested there and in tests/podman.rs.)
#[test]
fn a_workers_announcement_carries_what_get_all_answers() {
    use futures_util::StreamExt;
    use std::collections::HashMap;
    type Props = HashMap<String, zbus::OwnedVariant>;
    let dir = open_tempdir();
    let bus = Bus::session();
    // No refresh while the test reads: each worker's view stays as announced.
    std::fs::write(
        dir.path().join("node.toml"),
        "[inventory]\nrefresh_seconds = 600\n",
    )
    .unwrap();
    let _d = Daemon::start(&bus, dir.path(), &sim_file(dir.path()), &[]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let a = bus.address.as_str();
        let watcher = zbus::connection::Builder::address(a).build().await.unwrap();
        let rule = zbus::MatchRule::builder()
            .msg_type(zbus::message::Type::Signal)
            .interface("org.freedesktop.DBus.ObjectManager")
            .member("InterfacesAdded")
            .build()
            .unwrap();
        let mut added = zbus::MessageStream::for_match_rule(rule, &watcher, None)
            .await
            .unwrap();
        let c = zbus::connection::Builder::address(a).build().await.unwrap();
        for (name, gb, state) in [("voice", "6", "running"), ("later", "2", "pending")] {
            c.call_method(
                Some("org.astraeus.Node1"),
                "/org/astraeus/Node1",
                Some("org.astraeus.Node1.Manager"),
                "SubmitWorker",
                &shared_spec(name, gb),
            )
            .await
            .unwrap();
            let path = format!("/org/astraeus/Node1/worker/{name}");
            let announced: Props = loop {
                let m = added.next().await.unwrap().unwrap();
                let (p, mut ifaces): (zbus::OwnedObjectPath, HashMap<String, Props>) =
                    m.body().deserialize().unwrap();
                if p.as_str() == path {
                    assert_eq!(ifaces.len(), 1, "{ifaces:?}");
                    break ifaces.remove("org.astraeus.Node1.Worker").unwrap();
                }
            };
            let got: Props = c
                .call_method(
                    Some("org.astraeus.Node1"),
                    path.as_str(),
                    Some("org.freedesktop.DBus.Properties"),
                    "GetAll",
                    &"org.astraeus.Node1.Worker",
                )
                .await
                .unwrap()
                .body()
                .deserialize()
                .unwrap();
            assert_eq!(announced, got, "{name}");
            let state_of = |p: &Props| format!("{:?}", p["State"]);
            assert!(state_of(&got).contains(state), "{got:?}");
            let reasons = format!("{:?}", got["PendingReasons"]);
            assert_eq!(
                reasons.contains("6 of 7 GB taken by shared work"),
                state == "pending",
                "{reasons}"
            );
            // The listing of every object gives each worker as GetAll does
            // (it builds them from the views, its caller learnt once).
            let listed: HashMap<zbus::OwnedObjectPath, HashMap<String, Props>> = c
                .call_method(
                    Some("org.astraeus.Node1"),
                    "/org/astraeus/Node1",
                    Some("org.freedesktop.DBus.ObjectManager"),
                    "GetManagedObjects",
                    &(),
                )
                .await
                .unwrap()
                .body()
                .deserialize()
                .unwrap();
            let entry = listed
                .iter()
                .find(|(p, _)| p.as_str() == path)
                .map(|(_, ifaces)| &ifaces["org.astraeus.Node1.Worker"]);
            assert_eq!(entry, Some(&got), "{name} in GetManagedObjects");
        }
    });
}

/// systemd hears the status line at most once a second, not once per
/// change: a burst of submits costs a message or two, and the last one
/// tells the final count when its second is up (the inventory's refresh,
/// ten minutes here, wakes the loop too late for that).
#[test]
fn the_status_line_reaches_systemd_at_most_once_a_second() {
    use std::os::unix::net::UnixDatagram;
    use std::time::{Duration, Instant};
    let dir = open_tempdir();
    let bus = Bus::session();
    let sock_path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    std::fs::write(
        dir.path().join("node.toml"),
        "[inventory]\nrefresh_seconds = 600\n",
    )
    .unwrap();
    let _d = Daemon::start(
        &bus,
        dir.path(),
        &sim_file(dir.path()),
        &[("NOTIFY_SOCKET", sock_path.to_str().unwrap())],
    );
    let mut buf = [0u8; 4096];
    let mut statuses = Vec::new();
    let mut listen = |for_: Duration, statuses: &mut Vec<String>| {
        let until = Instant::now() + for_;
        while Instant::now() < until {
            if let Ok(n) = sock.recv(&mut buf) {
                let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                statuses.extend(
                    text.lines()
                        .filter(|l| l.starts_with("STATUS="))
                        .map(String::from),
                );
            }
        }
    };
    listen(Duration::from_millis(300), &mut statuses);
    assert!(!statuses.is_empty(), "READY=1 carries the status line");
    statuses.clear();
    let burst = Instant::now();
    for i in 0..8 {
        let o = manager(
            &bus.address,
            None,
            "SubmitWorker",
            &["s", &shared_spec(&format!("w{i}"), "0.5")],
        );
        assert!(o.ok, "{}", o.stderr);
    }
    listen(Duration::from_secs(3), &mut statuses);
    let seconds = burst.elapsed().as_secs_f64();
    assert!(
        (statuses.len() as f64) <= seconds.ceil() + 1.0,
        "{} status lines in {seconds:.1} s: {statuses:?}",
        statuses.len()
    );
    assert_eq!(
        statuses.last().map(String::as_str),
        Some("STATUS=8 workers, 0 pending"),
        "{statuses:?}"
    );
}

#[test]
fn sigterm_says_stopping_and_exits_cleanly() {
    use std::os::unix::net::UnixDatagram;
    use std::time::Duration;
    let dir = open_tempdir();
    let bus = Bus::session();
    let sock_path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let d = Daemon::start(
        &bus,
        dir.path(),
        &sim_file(dir.path()),
        &[("NOTIFY_SOCKET", sock_path.to_str().unwrap())],
    );
    manager(
        &bus.address,
        None,
        "SubmitWorker",
        &["s", &shared_spec("a", "1")],
    );
    let status = d.stop();
    assert!(status.success(), "{status:?}");
    let mut all = String::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = sock.recv(&mut buf) {
        all.push_str(&String::from_utf8_lossy(&buf[..n]));
        if all.contains("STOPPING=1") {
            break;
        }
    }
    assert!(all.contains("READY=1"), "{all}");
    assert!(all.contains("STATUS=1 worker, 0 pending"), "{all}");
    assert!(all.contains("STOPPING=1"), "{all}");
}

#[test]
fn astraeusctl_shows_the_seeds_words() {
    let dir = open_tempdir();
    let bus = Bus::session();
    let _d = Daemon::start(&bus, dir.path(), &sim_file(dir.path()), &[]);
    let a = &bus.address;
    for (name, gb) in [("listen", "2.2"), ("voice", "4.2"), ("small", "1.5")] {
        let f = dir.path().join(format!("{name}.json"));
        std::fs::write(&f, shared_spec(name, gb)).unwrap();
        let o = ctl(a, None, &["submit", f.to_str().unwrap()]);
        assert!(o.ok, "{}", o.stderr);
    }
    let o = ctl(a, None, &["gpus"]);
    assert_eq!(
        o.stdout,
        "GPU  MODEL                    TOTAL  OFFERED  OUTSIDE  MODE    TAKEN   HEALTH\n\
         0    NVIDIA GeForce RTX 4060  8 GB   7 GB     1 GB     shared  6.4 GB  ok\n\
         \n\
         1 GPU listed.\n"
    );
    // The daemon's own status: its machine, its workers, its container
    // engine (whichever `auto` found: podman, Docker, or podman when
    // neither answers), its zone and its page.
    let o = ctl(a, None, &["status"]);
    let lines: Vec<&str> = o.stdout.lines().collect();
    assert_eq!(
        lines[..2],
        ["astraeusd on majin", "     Workers: 2 running, 1 waiting"],
        "{}",
        o.stdout
    );
    assert!(
        lines[2].starts_with("  Containers: podman at ")
            || lines[2].starts_with("  Containers: Docker at "),
        "{}",
        o.stdout
    );
    // The zone is the host's (none is configured here).
    assert!(lines[3].starts_with("   Time zone: "), "{}", o.stdout);
    assert_eq!(
        lines[4..],
        ["        Page: off ([http] listen)"],
        "{}",
        o.stdout
    );
    // The seed's GPUS column (a count), which GPUs in a column of their
    // own, owners by name, a count line as systemd's tools.
    let o = ctl(a, None, &["workers"]);
    assert_eq!(
        o.stdout,
        "NAME    STATE    OWNER  GPUS               GPU  MEMORY    USED\n\
         listen  running  root   1 · shared 2.2 GB  0    promised  unknown\n\
         small   pending  root   —                  —    —         —\n\
         \x20         GPU 0 of majin: 6.4 of 7 GB taken by shared work; it needs 1.5\n\
         voice   running  root   1 · shared 4.2 GB  0    promised  unknown\n\
         \n\
         3 workers listed.\n"
    );
    // For scripts: the rows alone, one line a worker.
    let o = ctl(a, None, &["--no-legend", "workers"]);
    assert_eq!(
        o.stdout,
        "listen  running  root   1 · shared 2.2 GB  0    promised  unknown\n\
         small   pending  root   —                  —    —         —\n\
         voice   running  root   1 · shared 4.2 GB  0    promised  unknown\n"
    );
    // A locale that is not UTF-8 gets the same table in ASCII, aligned
    // alike; JSON stays UTF-8, as JSON is.
    let in_locale = |locale: &str, args: &[&str]| {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_astraeusctl"))
            .args(["--bus-address", a])
            .args(args)
            .env("LC_ALL", locale)
            .output()
            .unwrap();
        String::from_utf8(o.stdout).unwrap()
    };
    assert_eq!(
        in_locale("C", &["--no-legend", "workers"]),
        "listen  running  root   1 - shared 2.2 GB  0    promised  unknown\n\
         small   pending  root   -                  -    -         -\n\
         voice   running  root   1 - shared 4.2 GB  0    promised  unknown\n"
    );
    assert!(in_locale("C.UTF-8", &["workers"]).contains("1 · shared 2.2 GB"));
    assert_eq!(
        in_locale("C", &["--json", "workers"]),
        in_locale("C.UTF-8", &["--json", "workers"])
    );
    // For scripts: the rows alone.
    let o = ctl(a, None, &["--no-legend", "gpus"]);
    assert_eq!(
        o.stdout,
        "0    NVIDIA GeForce RTX 4060  8 GB   7 GB     1 GB     shared  6.4 GB  ok\n"
    );
    // The simulated machine has no per-process readings: use is unknown.
    let o = ctl(a, None, &["sharers", "0"]);
    assert_eq!(
        o.stdout,
        "GPU 0: shared: listen 2.2 GB, voice 4.2 GB — 6.4 GB taken\n"
    );
    // JSON is data: numbers, arrays and nulls, no display strings.
    let o = ctl(a, None, &["--json", "workers"]);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(
        v[0],
        serde_json::json!({"name": "listen", "state": "running", "owner": 0,
            "owner_name": "root", "kubernetes_claim": null, "gpus": [0], "gpu_shared_gb": 2.2,
            "gpu_used_gb": null,
            "enforcement": "promised: a reservation (no workload of its own to limit)",
            "pending_reasons": []})
    );
    assert_eq!(v[1]["name"], "small");
    assert_eq!(
        v[1]["enforcement"],
        serde_json::Value::Null,
        "waiting: none"
    );
    assert_eq!(v[1]["gpus"], serde_json::json!([]));
    assert_eq!(
        v[1]["gpu_used_gb"],
        serde_json::Value::Null,
        "waiting: none"
    );
    assert_eq!(
        v[1]["pending_reasons"][0],
        "GPU 0 of majin: 6.4 of 7 GB taken by shared work; it needs 1.5"
    );
    let o = ctl(a, None, &["--json", "gpus"]);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(v[0]["offered_gb"], 7.0);
    assert_eq!(v[0]["taken_gb"], 6.4);
    assert_eq!(v[0]["healthy"], true);
    assert_eq!(v[0]["warning"], serde_json::Value::Null);
    let o = ctl(a, None, &["stop", "nope"]);
    assert!(!o.ok);
    assert_eq!(
        o.stderr,
        "astraeusctl: NotFound: no live worker named nope\n"
    );
    let o = ctl(a, None, &["stop", "voice"]);
    assert_eq!(o.stdout, "stopped voice\n");
    // Several, as podman stop A B: each answered in turn, the worst status.
    for name in ["s1", "s2"] {
        assert!(manager(a, None, "SubmitWorker", &["s", &shared_spec(name, "0.5")]).ok);
    }
    let o = ctl(a, None, &["stop", "s1", "nope", "s2"]);
    assert_eq!(o.stdout, "stopped s1\nstopped s2\n");
    assert_eq!(o.code, Some(4), "{}", o.stderr);
    assert_eq!(
        o.stderr,
        "astraeusctl: nope: NotFound: no live worker named nope\n\
         astraeusctl: NotFound: not every worker named was stopped (see above)\n"
    );
    assert_eq!(ctl(a, None, &["stop"]).code, Some(2), "a name is required");
    let f = dir.path().join("why.json");
    std::fs::write(&f, shared_spec("x", "7.5")).unwrap();
    let o = ctl(a, None, &["why", f.to_str().unwrap()]);
    assert_eq!(
        o.stdout,
        "it would wait:\n  GPU 0 of majin offers 7 of its 8 GB (1 GB held outside Astraeus); it needs 7.5\n"
    );
    // The GPU turns unhealthy under its sharers: TAKEN still says what
    // they hold (#66: it said "—" while TakenGb said 5.4).
    let taken = busctl(
        a,
        &[
            "get-property",
            "org.astraeus.Node1",
            "/org/astraeus/Node1/gpu/0",
            "org.astraeus.Node1.Gpu",
            "TakenGb",
        ],
    )
    .stdout;
    let sim = dir.path().join("majin.toml");
    std::fs::write(&sim, format!("{MAJIN_TOML}healthy = false\n")).unwrap();
    eventually("unhealthy", || {
        ctl(a, None, &["--no-legend", "gpus"])
            .stdout
            .contains(" unhealthy ")
    });
    let o = ctl(a, None, &["--no-legend", "gpus"]);
    let shown = format!("{} GB", taken.trim().trim_start_matches("d "));
    assert!(
        o.stdout.contains(&format!(" unhealthy  {shown} ")),
        "{taken}: {}",
        o.stdout
    );
}

/// What the daemon said just before it left (its last changes, sent as it
/// stops) is shown before `astraeusctl events` says it left: a stand-in
/// owning the daemon's name sends a burst of WorkerRemoved and leaves at
/// once; every one of them is printed, then the follower ends with 69.
/// (Taken in turns, the bus's NameOwnerChanged came first and the rest was
/// lost: seen as a last GPU change missing in the test below.)
#[test]
fn astraeusctl_events_shows_what_the_daemon_said_before_it_left() {
    use std::io::BufRead;
    const BURST: usize = 300;
    let bus = Bus::session();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let daemon = rt.block_on(async {
        zbus::connection::Builder::address(bus.address.as_str())
            .name("org.astraeus.Node1")
            .build()
            .await
            .unwrap()
    });
    let mut follower = std::process::Command::new(env!("CARGO_BIN_EXE_astraeusctl"))
        .args(["--bus-address", &bus.address, "--json", "events"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(follower.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    assert!(first.contains("following"), "{first}");
    rt.block_on(async {
        for i in 0..BURST {
            let path = zbus::OwnedObjectPath::try_from(format!("/org/astraeus/Node1/worker/w{i}"))
                .unwrap();
            daemon
                .emit_signal(
                    None::<()>,
                    "/org/astraeus/Node1",
                    "org.astraeus.Node1.Manager",
                    "WorkerRemoved",
                    &(format!("w{i}"), path),
                )
                .await
                .unwrap();
        }
        daemon.close().await.unwrap();
    });
    let removed: Vec<String> = lines
        .map(Result::unwrap)
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(&l).unwrap();
            assert_eq!(v["event"], "worker-removed", "{l}");
            v["worker"].as_str().unwrap().to_string()
        })
        .collect();
    let expected: Vec<String> = (0..BURST).map(|i| format!("w{i}")).collect();
    assert_eq!(removed.len(), BURST, "printed before the end: {removed:?}");
    assert_eq!(removed, expected);
    let status = follower.wait().unwrap();
    assert_eq!(status.code(), Some(69));
}

/// `astraeusctl events` follows what happens as lines (and JSON lines) and
/// ends, with 69, when the daemon goes; `history` lists ended workers with
/// their end from the ledger, in the reader's zone, `--since` read as
/// journalctl reads it.
#[test]
fn astraeusctl_follows_events_and_lists_the_history() {
    use std::io::BufRead;
    let dir = open_tempdir();
    let bus = Bus::session();
    let d = Daemon::start(&bus, dir.path(), &sim_file(dir.path()), &[]);
    let a = &bus.address;
    let follow = |json: bool| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_astraeusctl"));
        cmd.args(["--bus-address", a]);
        if json {
            cmd.arg("--json");
        }
        let mut child = cmd
            .arg("events")
            .env("TZ", "UTC")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        (child, lines)
    };
    let (mut text, mut text_lines) = follow(false);
    let first = text_lines.next().unwrap().unwrap();
    assert_eq!(
        first,
        "following org.astraeus.Node1 (times in UTC); Ctrl-C to stop"
    );
    let (mut json, mut json_lines) = follow(true);
    // Each says so once it is subscribed.
    let first = json_lines.next().unwrap().unwrap();
    assert_eq!(first, r#"{"event":"following","time_zone":"UTC"}"#);
    assert!(
        manager(
            a,
            None,
            "SubmitWorker",
            &["s", &shared_spec("listen", "2.2")]
        )
        .ok
    );
    assert!(manager(a, None, "SubmitWorker", &["s", &shared_spec("big", "6")]).ok);
    assert!(manager(a, None, "StopWorker", &["s", "listen"]).ok);
    let mut seen = Vec::new();
    for l in text_lines.by_ref() {
        let l = l.unwrap();
        // "HH:MM:SS  what"
        assert_eq!(l.as_bytes()[2], b':', "{l}");
        seen.push(l[10..].to_string());
        if l.ends_with("6 GB taken") {
            break;
        }
    }
    // listen's end and big's start are one change of the GPU: it is never
    // free. A GPU's changes are told at most every 50 ms, with its values
    // then: its lines come a moment after the workers' (listen's 2.2 GB
    // is not told at all when big runs within the 50 ms).
    let (gpu, workers): (Vec<&String>, Vec<&String>) =
        seen.iter().partition(|l| l.starts_with("GPU 0"));
    assert_eq!(
        workers,
        [
            "worker listen submitted: running",
            "worker big submitted: waits: GPU 0 of majin: 2.2 of 7 GB taken by shared work; it needs 6",
            "worker listen ended",
            "worker big is running",
        ],
        "{seen:?}"
    );
    assert!(
        gpu == ["GPU 0 is shared, 2.2 GB taken", "GPU 0: 6 GB taken"]
            || gpu == ["GPU 0 is shared, 6 GB taken"],
        "{seen:?}"
    );
    // Read by `head -1`: once the reader is gone, the follower ends, quietly.
    let mut piped = std::process::Command::new("bash")
        .args([
            "-c",
            &format!(
                "set -o pipefail; {} --bus-address '{a}' events | head -1",
                env!("CARGO_BIN_EXE_astraeusctl")
            ),
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Its first line is out (head has it) before anything else happens.
    let mut piped_out = std::io::BufReader::new(piped.stdout.take().unwrap());
    let mut first = String::new();
    std::io::BufRead::read_line(&mut piped_out, &mut first).unwrap();
    assert!(first.starts_with("following "), "{first}");
    assert!(manager(a, None, "SubmitWorker", &["s", &shared_spec("ping", "0.1")]).ok);
    let mut err = String::new();
    std::io::Read::read_to_string(&mut piped.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(err, "", "the follower complained when its reader left");
    assert!(
        piped.wait().unwrap().success(),
        "the follower failed when its reader left"
    );
    let d_state = d.state.clone();
    // The daemon goes: both followers say so and end with 69.
    d.stop();
    let rest: Vec<String> = json_lines.map(Result::unwrap).collect();
    let events: Vec<serde_json::Value> = rest
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // The GPU's events come a moment after (see above): apart here.
    let (gpu, events): (Vec<_>, Vec<_>) = events.into_iter().partition(|e| e["event"] == "gpu");
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert!(
        kinds.starts_with(&["worker-new", "worker-new", "worker-removed"]),
        "{rest:?}"
    );
    assert_eq!(gpu.last().unwrap()["taken_gb"], 6.1, "{rest:?}");
    assert_eq!(events[0]["worker"], "listen");
    assert_eq!(events[0]["state"], "running");
    assert_eq!(
        events[1]["pending_reasons"][0],
        "GPU 0 of majin: 2.2 of 7 GB taken by shared work; it needs 6"
    );
    assert!(events[0]["at_ms"].as_i64().unwrap() > 1_700_000_000_000);
    for child in [&mut text, &mut json] {
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(69));
    }
    let mut err = String::new();
    std::io::Read::read_to_string(&mut text.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(
        err,
        "astraeusctl: Gone: the daemon went away; see: journalctl -u astraeusd\n"
    );

    // The history, read from a daemon started again on the same ledger.
    let d = Daemon::start(&bus, dir.path(), &sim_file(dir.path()), &[]);
    assert_eq!(d.state, d_state);
    let ledger = d.state.join("ledger.db");
    let ended_ms: i64 = std::process::Command::new("sqlite3")
        .arg(&ledger)
        .arg("SELECT ended_ms FROM workers WHERE name = 'listen'")
        .output()
        .map(|o| String::from_utf8(o.stdout).unwrap().trim().parse().unwrap())
        .unwrap();
    let in_zone = |zone: &str| {
        jiff::Timestamp::from_millisecond(ended_ms)
            .unwrap()
            .to_zoned(jiff::tz::TimeZone::get(zone).unwrap())
            .strftime("%Y-%m-%d %H:%M:%S")
            .to_string()
    };
    let history = |zone: &str, args: &[&str]| {
        let mut all = vec!["history"];
        all.extend_from_slice(args);
        let o = ctl_tz(a, zone, &all);
        assert!(o.ok, "{}", o.stderr);
        o.stdout
    };
    let shown = history("Asia/Tokyo", &["--since", "1h"]);
    let lines: Vec<&str> = shown.lines().collect();
    assert_eq!(lines[0], "times in Asia/Tokyo");
    assert_eq!(
        lines[1].split_whitespace().collect::<Vec<_>>(),
        ["NAME", "OWNER", "GPUS", "GPU", "PLACED", "ENDED", "HOW"]
    );
    assert!(
        lines[2].starts_with("listen  root   1 · shared 2.2 GB  0    "),
        "{shown}"
    );
    assert!(
        lines[2].ends_with(&format!("  {}  stopped", in_zone("Asia/Tokyo"))),
        "{shown}"
    );
    assert_eq!(&lines[3..], ["", "1 ended worker listed."]);
    let shown = history("America/New_York", &["--no-legend"]);
    assert!(shown.contains(&in_zone("America/New_York")), "{shown}");
    assert_eq!(shown.lines().count(), 1, "{shown}");
    // Nothing ended since tomorrow.
    assert_eq!(
        history("UTC", &["--since", "tomorrow"]),
        "times in UTC\nNAME  OWNER  GPUS  GPU  PLACED  ENDED  HOW\n\n0 ended workers listed.\n"
    );
    let o = ctl(a, None, &["--json", "history"]);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(v[0]["name"], "listen");
    assert_eq!(v[0]["ended_ms"], ended_ms);
    assert_eq!(v[0]["gpus"], serde_json::json!([0]));
    assert_eq!(v[0]["gpu_shared_gb"], 2.2);
    assert_eq!(v[0]["exit_status"], serde_json::Value::Null);
    assert_eq!(v[0]["ended_by"], "stopped");
    assert_eq!(v.as_array().unwrap().len(), 1, "big still runs");
    // `status` gives when big was submitted and placed, as the ledger has it.
    let ledger_ms = |column: &str| -> i64 {
        let o = std::process::Command::new("sqlite3")
            .arg(&ledger)
            .arg(format!(
                "SELECT {column} FROM workers WHERE name = 'big' AND state = 'running'"
            ))
            .output()
            .unwrap();
        String::from_utf8(o.stdout).unwrap().trim().parse().unwrap()
    };
    let (submitted, placed) = (ledger_ms("submitted_ms"), ledger_ms("started_ms"));
    let at = |ms: i64| {
        jiff::Timestamp::from_millisecond(ms)
            .unwrap()
            .to_zoned(jiff::tz::TimeZone::get("Asia/Tokyo").unwrap())
            .strftime("%Y-%m-%d %H:%M:%S")
            .to_string()
    };
    let o = ctl_tz(a, "Asia/Tokyo", &["status", "big"]);
    assert!(
        o.stdout.contains(&format!(
            "  submitted: {} Asia/Tokyo\n  placed:    {} Asia/Tokyo\n",
            at(submitted),
            at(placed)
        )),
        "{}",
        o.stdout
    );
    let v: serde_json::Value =
        serde_json::from_str(&ctl(a, None, &["--json", "status", "big"]).stdout).unwrap();
    assert_eq!(v["submitted_ms"], submitted);
    assert_eq!(v["placed_ms"], placed);
    let o = ctl(a, None, &["history", "--limit", "0"]);
    assert_eq!(o.code, Some(3), "{}", o.stderr);
    assert!(o.stderr.contains("limit: 1 to 10000"), "{}", o.stderr);
}

/// A request's own line breaks and spacing do not lay out lines of its
/// owner's choosing in `astraeusctl status` (root reads it there) nor in
/// `show`: it is printed on one line. They were printed as sent. `show`
/// is systemctl's: KEY=VALUE by D-Bus property name, `-p`, `--value`.
#[test]
fn status_and_show_print_a_request_on_one_line() {
    let dir = open_tempdir();
    let bus = Bus::session();
    let _d = start_majin(&bus, dir.path(), "", &[]);
    let a = &bus.address;
    let spec = "{\"name\":\"w\",\n  \"requested_resources\":\n{\"gpu_requests\":\
                {\"shared\":true,\"memory_gb\":1}}}\n";
    assert!(manager(a, None, "SubmitWorker", &["s", spec]).ok);
    let o = ctl(a, None, &["status", "w"]);
    let line = o
        .stdout
        .lines()
        .find(|l| l.starts_with("  request:"))
        .unwrap_or_else(|| panic!("{}", o.stdout));
    assert_eq!(
        line,
        "  request:  {\"name\":\"w\",\"requested_resources\":{\"gpu_requests\":\
         {\"shared\":true,\"memory_gb\":1}}}",
        "{}",
        o.stdout
    );
    assert!(o.stdout.contains("  GPUs:     GPU 0 (GPU-"), "{}", o.stdout);
    // show: every property, a line each, sorted; the request on one line.
    let o = ctl(a, None, &["show", "w"]);
    let lines: Vec<&str> = o.stdout.lines().collect();
    for want in [
        "Name=w",
        "State=running",
        "GpuSharedGb=1",
        "PendingReasons=",
        "Warnings=",
    ] {
        assert!(lines.contains(&want), "{want}: {}", o.stdout);
    }
    assert!(
        lines.iter().any(|l| l.starts_with("Gpus=0:GPU-")),
        "{}",
        o.stdout
    );
    let request: Vec<&&str> = lines.iter().filter(|l| l.starts_with("Request=")).collect();
    assert_eq!(request.len(), 1, "{}", o.stdout);
    assert!(
        request[0].ends_with("{\"shared\":true,\"memory_gb\":1}}} "),
        "{}",
        o.stdout
    );
    let mut sorted = lines.clone();
    sorted.sort();
    assert_eq!(lines, sorted);
    // -p in the order asked, --value alone; a property it lacks is named.
    let o = ctl(
        a,
        None,
        &["show", "w", "-p", "State,Name", "-p", "GpuSharedGb"],
    );
    assert_eq!(o.stdout, "State=running\nName=w\nGpuSharedGb=1\n");
    let o = ctl(a, None, &["show", "w", "-p", "State", "--value"]);
    assert_eq!(o.stdout, "running\n");
    let o = ctl(a, None, &["show", "w", "-p", "Colour"]);
    assert_eq!(o.code, Some(4), "{}", o.stderr);
    assert!(
        o.stderr
            .contains("worker w has no property Colour; it has "),
        "{}",
        o.stderr
    );
}

#[test]
fn a_wsl_host_says_so_and_shares_every_gpu() {
    let dir = open_tempdir();
    let sim = dir.path().join("wsl.toml");
    std::fs::write(
        &sim,
        "machine = \"pc\"\nwsl = true\n[[gpu]]\nmodel = \"RTX 4090\"\ntotal_gb = 24\n[[gpu]]\nmodel = \"RTX 3060\"\ntotal_gb = 12\n",
    )
    .unwrap();
    let bus = Bus::session();
    let _d = Daemon::start(&bus, dir.path(), &sim, &[]);
    let a = &bus.address;
    assert_eq!(
        busctl(
            a,
            &[
                "get-property",
                "org.astraeus.Node1",
                "/org/astraeus/Node1",
                "org.astraeus.Node1.Manager",
                "Wsl"
            ]
        )
        .stdout,
        "b true\n"
    );
    assert!(manager(a, None, "SubmitWorker", &["s", &shared_spec("voice", "4")]).ok);
    let o = ctl(a, None, &["gpus"]);
    assert_eq!(
        o.stdout,
        "pc is a WSL2 host: every container sees every GPU, so shared work takes its memory on each\n\
         GPU  MODEL     TOTAL  OFFERED  OUTSIDE  MODE    TAKEN  HEALTH\n\
         0    RTX 4090  24 GB  24 GB    0 GB     shared  4 GB   ok\n\
         1    RTX 3060  12 GB  12 GB    0 GB     shared  4 GB   ok\n\
         \n\
         2 GPUs listed.\n"
    );
}

/// The built-in majin is the seed's machine on every host: the seed's
/// listen + voice, each asking for 2 CPU cores, both run even where the
/// host itself has only 2.
#[test]
fn the_builtin_majin_has_the_same_host_everywhere() {
    let dir = open_tempdir();
    let bus = Bus::session();
    let sim = dir.path().join("builtin.toml");
    std::fs::write(&sim, astraeusd::inventory::sim::MAJIN).unwrap();
    let _d = Daemon::start(&bus, dir.path(), &sim, &[]);
    let a = &bus.address;
    for (name, gb) in [("listen", "2.2"), ("voice", "4.2")] {
        let spec = format!(
            r#"{{"name":"{name}","requested_resources":{{"cpu_cores":2,"gpu_requests":{{"shared":true,"memory_gb":{gb}}}}}}}"#
        );
        let o = manager(a, None, "SubmitWorker", &["s", &spec]);
        assert!(o.ok, "{}", o.stderr);
        assert!(o.stdout.contains("\"running\""), "{name}: {}", o.stdout);
    }
}

/// Requests no state of this machine could ever serve are refused at once,
/// with the seed's words, instead of waiting forever; WhyNot says the same.
/// One that could fit once others leave still waits.
#[test]
fn impossible_requests_are_refused_and_possible_ones_wait() {
    let dir = open_tempdir();
    let bus = Bus::session();
    let sim = dir.path().join("three.toml");
    std::fs::write(
        &sim,
        "machine = \"majin\"\n\
         [[gpu]]\nmodel = \"NVIDIA L4\"\ntotal_gb = 24\n\
         [[gpu]]\nmodel = \"NVIDIA L4\"\ntotal_gb = 24\n\
         [[gpu]]\nmodel = \"NVIDIA H100\"\ntotal_gb = 80\noutside_gb = 10\n",
    )
    .unwrap();
    let _d = Daemon::start(&bus, dir.path(), &sim, &[]);
    let a = &bus.address;
    let four = r#"{"name":"four","requested_resources":{"gpu_requests":{"count":4}}}"#;
    let big3 = r#"{"name":"big3","requested_resources":{"gpu_requests":{"count":3,"shared":true,"memory_gb":50}}}"#;
    for (spec, words) in [
        (four, "majin has 3 GPUs that match; it needs 4"),
        (big3, "it fits on 1 GPU of majin; it needs 3"),
    ] {
        for method in ["SubmitWorker", "WhyNot"] {
            let o = gdbus_manager(a, method, &[spec]);
            assert!(
                o.stderr.contains("org.astraeus.Node1.Error.Unsatisfiable")
                    && o.stderr.contains("can never be placed on majin")
                    && o.stderr.contains(words),
                "{method}: {}",
                o.stderr
            );
        }
    }
    assert!(
        !manager(a, None, "GetWorker", &["s", "four"]).ok,
        "nothing half-applied"
    );
    // 75 GB fits the H100 only once its outside use leaves: it waits.
    let waits =
        r#"{"name":"waits","requested_resources":{"gpu_requests":{"shared":true,"memory_gb":75}}}"#;
    let o = manager(a, None, "SubmitWorker", &["s", waits]);
    assert!(
        o.ok && o.stdout.contains("pending"),
        "{}{}",
        o.stdout,
        o.stderr
    );
}

/// A whole request behind a steady stream of shared submits and stops (the
/// GPU never empties) is placed once it has waited `drain_after_seconds`:
/// the GPU drains for it, which the bus, the CLI and the new sharer's reason
/// all say; then it takes the GPU when the last sharer ends.
#[test]
fn a_whole_request_is_not_starved_by_a_stream_of_sharers() {
    let dir = tempfile::tempdir().unwrap();
    let bus = Bus::session();
    let _d = start_majin(
        &bus,
        dir.path(),
        "[inventory]\nrefresh_seconds = 0.2\n[placement]\ndrain_after_seconds = 1\n",
        &[],
    );
    let a = &bus.address;
    let draining_for = || {
        busctl(
            a,
            &[
                "get-property",
                "org.astraeus.Node1",
                "/org/astraeus/Node1/gpu/0",
                "org.astraeus.Node1.Gpu",
                "DrainingFor",
            ],
        )
        .stdout
    };
    let submit = |name: &str| {
        let o = manager(a, None, "SubmitWorker", &["s", &shared_spec(name, "1")]);
        assert!(o.ok, "{}", o.stderr);
    };
    submit("s0");
    let big = r#"{"name":"big","requested_resources":{"gpu_requests":{"count":1}}}"#;
    assert!(manager(a, None, "SubmitWorker", &["s", big]).ok);
    assert_eq!(state(a, "big"), "s \"pending\"\n");
    assert_eq!(draining_for(), "s \"\"\n");
    // The stream: a new sharer, then the one before it stops; the GPU
    // always has one. Until the GPU drains, each new one is placed.
    let mut i = 0;
    eventually("GPU 0 drains for big", || {
        i += 1;
        submit(&format!("s{i}"));
        if draining_for() == "s \"big\"\n" {
            return true;
        }
        assert_eq!(state(a, &format!("s{i}")), "s \"running\"\n");
        assert!(manager(a, None, "StopWorker", &["s", &format!("s{}", i - 1)]).ok);
        std::thread::sleep(std::time::Duration::from_millis(100));
        false
    });
    // The newest sharer may have landed just before the drain: the next waits.
    i += 1;
    submit(&format!("s{i}"));
    assert_eq!(state(a, &format!("s{i}")), "s \"pending\"\n");
    let reasons = busctl(
        a,
        &[
            "get-property",
            "org.astraeus.Node1",
            &format!("/org/astraeus/Node1/worker/s{i}"),
            "org.astraeus.Node1.Worker",
            "PendingReasons",
        ],
    )
    .stdout;
    assert!(
        reasons.contains("GPU 0 of majin is draining for big, a whole-GPU request that waited too long: no new work goes on it until big is placed"),
        "{reasons}"
    );
    let gpus = ctl(a, None, &["gpus"]);
    assert!(gpus.stdout.contains("draining for big"), "{}", gpus.stdout);
    // The sharers still there end: big takes the GPU; the GPU drains for no one.
    for j in 0..i {
        let _ = manager(a, None, "StopWorker", &["s", &format!("s{j}")]);
    }
    eventually("big runs", || state(a, "big") == "s \"running\"\n");
    assert_eq!(draining_for(), "s \"\"\n");
    assert_eq!(state(a, &format!("s{i}")), "s \"pending\"\n");
}

/// `systemctl reload` (SIGHUP) re-reads node.toml: what can change live is
/// applied (here: draining turned on), what needs a restart is named in the
/// journal, and a file that no longer parses changes nothing.
#[test]
fn a_reload_applies_what_it_can_and_names_what_needs_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let bus = Bus::session();
    let config = |extra: &str| {
        format!("[inventory]\nrefresh_seconds = 0.2\n[placement]\ndrain_after_seconds = 0\n{extra}")
    };
    let d = start_majin(&bus, dir.path(), &config(""), &[]);
    let a = &bus.address;
    assert!(manager(a, None, "SubmitWorker", &["s", &shared_spec("listen", "1")]).ok);
    let big = r#"{"name":"big","requested_resources":{"gpu_requests":{"count":1}}}"#;
    assert!(manager(a, None, "SubmitWorker", &["s", big]).ok);
    let draining_for = || {
        busctl(
            a,
            &[
                "get-property",
                "org.astraeus.Node1",
                "/org/astraeus/Node1/gpu/0",
                "org.astraeus.Node1.Gpu",
                "DrainingFor",
            ],
        )
        .stdout
    };
    // A broken file: logged, nothing changes, the daemon goes on.
    std::fs::write(
        dir.path().join("node.toml"),
        "[placement]\ndrain_after_seconds = \"soon\"\n",
    )
    .unwrap();
    d.signal(libc::SIGHUP);
    eventually("the refusal logged", || {
        d.log_text()
            .contains("not reloaded, the running configuration stays")
    });
    assert!(
        d.log_text()
            .contains("line 2 (`drain_after_seconds = \"soon\"`)"),
        "{}",
        d.log_text()
    );
    assert_eq!(draining_for(), "s \"\"\n");
    // One a restart would refuse is refused now (it is not "applied at the
    // next start"): an unknown zone.
    std::fs::write(
        dir.path().join("node.toml"),
        config("[schedule]\ntime_zone = \"Mars/Base\"\n"),
    )
    .unwrap();
    d.signal(libc::SIGHUP);
    eventually("the zone refused", || {
        d.log_text()
            .contains("schedule.time_zone: \"Mars/Base\" is not a known time zone")
    });
    assert!(!d.log_text().contains("applied only by a restart"));
    // Draining on (live), and the page's address changed (needs a restart).
    let text = "[inventory]\nrefresh_seconds = 0.2\n[placement]\ndrain_after_seconds = 1\n\
                [http]\nlisten = \"127.0.0.1:9\"\n[sharing]\nhard_limit = \"offered\"\n\
                cgroup_root = \"/elsewhere\"\n";
    std::fs::write(dir.path().join("node.toml"), text).unwrap();
    d.signal(libc::SIGHUP);
    eventually("GPU 0 drains for big", || draining_for() == "s \"big\"\n");
    assert!(
        d.log_text().contains(
            "node.toml reloaded: applied [placement] drain_after_seconds, [sharing] hard_limit \
             (for workers started from now on); changed but applied only by a restart \
             (systemctl restart astraeusd): [http], [sharing] cgroup_root"
        ),
        "{}",
        d.log_text()
    );
    assert_eq!(state(a, "listen"), "s \"running\"\n", "nothing else moved");
}

/// astraeusctl's exit codes name what went wrong (astraeusctl(1)), `--json`
/// errors are JSON too, and with no daemon it says what to check.
#[test]
fn astraeusctl_exit_codes_json_errors_and_the_daemon_down_hint() {
    let dir = tempfile::tempdir().unwrap();
    let bus = Bus::session();
    let d = start_majin(
        &bus,
        dir.path(),
        "[inventory]\nrefresh_seconds = 0.2\n",
        &[],
    );
    let a = &bus.address;
    let spec = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    };
    let cases = [
        (
            vec!["stop".to_string(), "nope".to_string()],
            4,
            "NotFound: no live worker named nope",
        ),
        (
            vec![
                "submit".into(),
                spec(
                    "bad.json",
                    r#"{"name":"x","requested_resources":{"gpu_requests":{"shared":true}}}"#,
                ),
            ],
            3,
            "InvalidRequest: ",
        ),
        (
            vec![
                "submit".into(),
                spec("huge.json", &shared_spec("huge", "9")),
            ],
            7,
            "Unsatisfiable: ",
        ),
        (
            vec!["usage".into(), "--since".into(), "someday".into()],
            2,
            "--since",
        ),
        (
            vec![
                "usage".into(),
                "--since".into(),
                "now".into(),
                "--until".into(),
                "1h".into(),
            ],
            2,
            "--until: must be after --since",
        ),
        // A file of the caller's that is not there: neither the daemon's
        // NotFound nor a daemon that is down.
        (
            vec!["submit".into(), "/nonexistent/NotFound".into()],
            66,
            "NoInput: /nonexistent/NotFound: No such file or directory",
        ),
        (
            vec![
                "template".into(),
                "stage".into(),
                "t".into(),
                "/nonexistent".into(),
            ],
            66,
            "NoInput: /nonexistent: No such file or directory",
        ),
    ];
    for (args, code, words) in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = ctl(a, None, &args);
        assert_eq!(o.code, Some(*code), "{args:?}: {}", o.stderr);
        assert!(o.stderr.contains(words), "{args:?}: {}", o.stderr);
    }
    // The same as JSON on stderr.
    let o = ctl(a, None, &["--json", "stop", "nope"]);
    let v: serde_json::Value = serde_json::from_str(o.stderr.trim()).unwrap();
    assert_eq!(v["error"], "NotFound");
    assert_eq!(v["exit_code"], 4);
    assert!(v["message"]
        .as_str()
        .unwrap()
        .starts_with("no live worker named nope"));
    // Usage errors too, whichever side of the subcommand --json is on.
    for args in [
        &["--json", "history", "--limit", "x"][..],
        &["--json", "usage", "--csv"],
        &["usage", "--csv", "--json"],
    ] {
        let o = ctl(a, None, args);
        assert_eq!(o.code, Some(2), "{args:?}: {}", o.stderr);
        let v: serde_json::Value = serde_json::from_str(o.stderr.trim())
            .unwrap_or_else(|e| panic!("{args:?}: {e}: {}", o.stderr));
        assert_eq!(v["error"], "Usage", "{args:?}");
        assert_eq!(v["exit_code"], 2);
    }
    // No daemon on this bus: 69 (EX_UNAVAILABLE), and what to check.
    let empty = Bus::session();
    let o = ctl(&empty.address, None, &["gpus"]);
    assert_eq!(o.code, Some(69), "{}", o.stderr);
    assert!(
        o.stderr.contains(&format!(
            "is astraeusd running on the bus at {}?",
            empty.address
        )),
        "{}",
        o.stderr
    );
    // No bus at all: which bus was tried, and what to check instead of
    // astraeusd; 69 still.
    let o = ctl("unix:path=/nonexistent/bus", None, &["gpus"]);
    assert_eq!(o.code, Some(69), "{}", o.stderr);
    assert!(
        o.stderr
            .contains("NoBus: cannot reach the bus at unix:path=/nonexistent/bus")
            && o.stderr.contains("is a bus listening at that address?")
            && !o.stderr.contains("is astraeusd running"),
        "{}",
        o.stderr
    );
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_astraeusctl"))
        .arg("gpus")
        .env(
            "DBUS_SYSTEM_BUS_ADDRESS",
            "unix:path=/nonexistent/system_bus_socket",
        )
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(69), "{stderr}");
    assert!(
        stderr.contains("cannot reach the system bus at unix:path=/nonexistent/system_bus_socket")
            && stderr.contains("is D-Bus running? systemctl status dbus"),
        "{stderr}"
    );
    // A bus that would start the daemon on demand and cannot (its program
    // fails): also 69, with the bus's reason and the same hint.
    let services = tempfile::tempdir().unwrap();
    std::fs::write(
        services.path().join("org.astraeus.Node1.service"),
        "[D-BUS Service]\nName=org.astraeus.Node1\nExec=/bin/false\n",
    )
    .unwrap();
    let failing = Bus::session_activating(Some(services.path()));
    let o = ctl(&failing.address, None, &["gpus"]);
    assert_eq!(o.code, Some(69), "{}", o.stderr);
    assert!(o.stderr.contains("Spawn.ChildExited"), "{}", o.stderr);
    assert!(o.stderr.contains("is astraeusd running"), "{}", o.stderr);
    let o = ctl(&failing.address, None, &["--json", "gpus"]);
    let v: serde_json::Value = serde_json::from_str(o.stderr.trim()).unwrap();
    assert_eq!(v["error"], "StartFailed");
    assert_eq!(v["exit_code"], 69);
    // A daemon that is there and does not answer (stopped here): astraeusctl
    // gives up after --timeout (default 25 s, as busctl's) instead of
    // waiting for ever, says which call went unanswered, and exits 69.
    d.signal(libc::SIGSTOP);
    let o = ctl(a, None, &["--timeout", "1", "gpus"]);
    let json = ctl(a, None, &["--json", "--timeout", "1", "workers"]);
    d.signal(libc::SIGCONT);
    assert_eq!(o.code, Some(69), "{}", o.stderr);
    assert!(
        o.stderr
            .contains("NoReply: astraeusd did not answer ListGpus within 1 s (--timeout)"),
        "{}",
        o.stderr
    );
    assert!(o.stderr.contains("is astraeusd running"), "{}", o.stderr);
    let v: serde_json::Value = serde_json::from_str(json.stderr.trim()).unwrap();
    assert_eq!(v["error"], "NoReply", "{}", json.stderr);
    assert_eq!(v["exit_code"], 69);
    // Once it answers again, so does astraeusctl; 0 is not a timeout.
    assert!(ctl(a, None, &["--timeout", "1", "gpus"]).ok);
    let o = ctl(a, None, &["--timeout", "0", "gpus"]);
    assert_eq!(o.code, Some(2), "{}", o.stderr);
    assert!(o.stderr.contains("--timeout"), "{}", o.stderr);
}

/// A stop frees room for two waiting workers and the ledger refuses the
/// second placement (a failpoint stands in for a full disk): the stop is
/// done and answered as done, the first is placed, on the bus and in the
/// GPU's figures alike, the second waits, and once the first is stopped its
/// share is free again and the second is placed. (The refusal failed the
/// whole pass: the first stayed pending on the bus while the ledger and the
/// GPU's book had it placed, and its share was never given back.)
#[test]
fn a_placement_the_ledger_refuses_leaves_the_others_placed_and_that_one_waiting() {
    let dir = open_tempdir();
    let bus = Bus::session();
    let sim = sim_file(dir.path());
    let _d = with_failpoints(&bus, dir.path(), &sim, "store.start=fail@2");
    let a = &bus.address;
    let submit = |name: &str, gb: &str| {
        let o = manager(a, None, "SubmitWorker", &["s", &shared_spec(name, gb)]);
        assert!(o.ok, "{}", o.stderr);
    };
    submit("big", "6.5");
    submit("first", "1");
    submit("second", "1");
    assert_eq!(state(a, "first"), "s \"pending\"\n");
    assert_eq!(state(a, "second"), "s \"pending\"\n");
    let o = manager(a, None, "StopWorker", &["s", "big"]);
    assert!(o.ok, "the stop was made: {}", o.stderr);
    assert_eq!(state(a, "first"), "s \"running\"\n");
    assert_eq!(state(a, "second"), "s \"pending\"\n");
    assert_eq!(gpu_property(a, 0, "TakenGb").as_deref(), Some("d 1"));
    let o = manager(a, None, "StopWorker", &["s", "first"]);
    assert!(o.ok, "{}", o.stderr);
    assert_eq!(state(a, "second"), "s \"running\"\n");
    assert_eq!(gpu_property(a, 0, "TakenGb").as_deref(), Some("d 1"));
    let o = manager(a, None, "StopWorker", &["s", "second"]);
    assert!(o.ok, "{}", o.stderr);
    assert_eq!(gpu_property(a, 0, "TakenGb").as_deref(), Some("d 0"));
}

/// A submit whose group's ledger commit fails (a failpoint stands in for
/// the full disk that tests/faults.rs fills for real) leaves no trace: its
/// caller gets the disk's error, the object that was added for it is gone
/// from the bus again, the listing and a restarted daemon agree, and the
/// next submit is taken.
#[test]
fn a_submit_whose_commit_fails_leaves_no_trace_on_the_bus_or_in_the_ledger() {
    let dir = open_tempdir();
    let bus = Bus::session();
    let sim = sim_file(dir.path());
    let d = with_failpoints(&bus, dir.path(), &sim, "store.group.commit=fail@2");
    let a = &bus.address;
    let log = dir.path().join("monitor.log");
    let mut watch = monitor(a, "type='signal',sender='org.astraeus.Node1'", &log);
    let submit = |name: &str| manager(a, None, "SubmitWorker", &["s", &shared_spec(name, "1")]);
    let o = submit("kept");
    assert!(o.ok, "{}", o.stderr);
    let o = submit("lost");
    assert!(!o.ok, "{}", o.stdout);
    assert!(
        o.stderr
            .contains("ledger: its disk is full, so new work is refused"),
        "{}",
        o.stderr
    );
    let o = manager(a, None, "GetWorker", &["s", "lost"]);
    assert!(
        !o.ok && o.stderr.contains("no live worker named lost"),
        "{}",
        o.stderr
    );
    let tree = busctl(a, &["tree", "--list", "org.astraeus.Node1"]);
    assert!(tree.ok, "{}", tree.stderr);
    assert!(tree.stdout.contains("/worker/kept"), "{}", tree.stdout);
    assert!(!tree.stdout.contains("/worker/lost"), "{}", tree.stdout);
    let o = submit("after");
    assert!(o.ok, "{}", o.stderr);
    let listed = manager(a, None, "ListWorkers", &[]).stdout;
    assert!(
        listed.contains("kept") && listed.contains("after"),
        "{listed}"
    );
    assert!(!listed.contains("lost"), "{listed}");
    // Nothing was ever announced of it: no WorkerNew, no InterfacesAdded,
    // and so nothing taken back either (signals after "after"'s arrive in
    // order: once its WorkerNew is seen, "lost"'s would have been).
    eventually("after announced", || {
        std::fs::read_to_string(&log).is_ok_and(|s| s.contains("string \"after\""))
    });
    let _ = watch.kill();
    let _ = watch.wait();
    let seen = std::fs::read_to_string(&log).unwrap();
    assert!(!seen.contains("worker/lost"), "{seen}");
    assert!(!seen.contains("\"lost\""), "{seen}");
    assert!(d.stop().success());
    let _d = Daemon::start(&bus, dir.path(), &sim, &[]);
    let listed = manager(a, None, "ListWorkers", &[]).stdout;
    assert!(
        listed.contains("kept") && listed.contains("after"),
        "{listed}"
    );
    assert!(!listed.contains("lost"), "{listed}");
}

/// The daemon, its loop holding the first group open for 6 s after its
/// first change (calls queued meanwhile join it), and dbus-monitor writing
/// the daemon's signals to the returned log.
fn group_held_open(
    bus: &Bus,
    dir: &std::path::Path,
) -> (Daemon, std::process::Child, std::path::PathBuf) {
    let sim = sim_file(dir);
    let d = with_failpoints(bus, dir, &sim, "service.group=pause6000@1");
    let log = dir.join("monitor.log");
    let watch = monitor(
        &bus.address,
        "type='signal',sender='org.astraeus.Node1'",
        &log,
    );
    (d, watch, log)
}

/// A worker submitted and stopped within one group commit: its object was
/// gone when the group's InterfacesAdded were sent, so none was; nor is an
/// InterfacesRemoved for it. WorkerNew and WorkerRemoved still pair up.
#[test]
fn a_worker_added_and_removed_in_one_group_gets_no_interfaces_removed() {
    let dir = open_tempdir();
    let bus = Bus::session();
    let (d, mut watch, log) = group_held_open(&bus, dir.path());
    let a = bus.address.clone();
    let call = |method: &'static str, arg: String| {
        let a = a.clone();
        std::thread::spawn(move || manager(&a, None, method, &["s", &arg]))
    };
    let submit = call("SubmitWorker", shared_spec("brief", "0.5"));
    eventually("the submit held in its group", || {
        d.log_text().contains("failpoint service.group reached")
    });
    // Queued while the group is held open: it joins the group.
    let stop = call("StopWorker", "brief".into());
    for t in [submit, stop] {
        let o = t.join().unwrap();
        assert!(o.ok, "{}", o.stderr);
    }
    eventually("WorkerRemoved for brief", || {
        std::fs::read_to_string(&log).is_ok_and(|s| s.contains("member=WorkerRemoved"))
    });
    // A signal sent after the group's, to know the monitor saw them all.
    assert!(
        manager(
            &a,
            None,
            "SubmitWorker",
            &["s", &shared_spec("later", "0.5")]
        )
        .ok
    );
    eventually("the later submit's WorkerNew", || {
        std::fs::read_to_string(&log).is_ok_and(|s| s.matches("member=WorkerNew").count() == 2)
    });
    let _ = watch.kill();
    let _ = watch.wait();
    let seen = std::fs::read_to_string(&log).unwrap();
    assert_eq!(seen.matches("member=WorkerNew").count(), 2, "{seen}");
    assert_eq!(seen.matches("member=WorkerRemoved").count(), 1, "{seen}");
    assert_eq!(seen.matches("member=InterfacesAdded").count(), 1, "{seen}");
    assert_eq!(
        seen.matches("member=InterfacesRemoved").count(),
        0,
        "{seen}"
    );
}

/// Submits handled as one group send each object's PropertiesChanged once,
/// with the values after the whole group, not once per submit with the
/// same final values (the bus daemon spent more on those than on the
/// calls). The group is held open after its first submit (a failpoint
/// pauses the loop's task there) while five more queue and join it.
#[test]
fn a_group_of_submits_sends_each_objects_properties_changed_once() {
    let dir = open_tempdir();
    let bus = Bus::session();
    let (d, mut watch, log) = group_held_open(&bus, dir.path());
    let a = bus.address.clone();
    let submit = |name: String| {
        let a = a.clone();
        std::thread::spawn(move || {
            manager(&a, None, "SubmitWorker", &["s", &shared_spec(&name, "0.5")])
        })
    };
    let first = submit("w0".into());
    eventually("the first submit held in its group", || {
        d.log_text().contains("failpoint service.group reached")
    });
    let rest: Vec<_> = (1..6).map(|i| submit(format!("w{i}"))).collect();
    for t in std::iter::once(first).chain(rest) {
        let o = t.join().unwrap();
        assert!(o.ok, "{}", o.stderr);
    }
    // The Manager's and the GPU's come a moment after (held back up to 50 ms).
    let manager_changed =
        "path=/org/astraeus/Node1; interface=org.freedesktop.DBus.Properties; member=PropertiesChanged";
    eventually(
        "six WorkerNew signals and the Manager's PropertiesChanged",
        || {
            std::fs::read_to_string(&log).is_ok_and(|s| {
                s.matches("member=WorkerNew").count() == 6 && s.contains(manager_changed)
            })
        },
    );
    // Time for a second one, were it (wrongly) sent.
    std::thread::sleep(std::time::Duration::from_millis(200));
    let _ = watch.kill();
    let _ = watch.wait();
    let seen = std::fs::read_to_string(&log).unwrap();
    let changed = |path: &str| {
        seen.matches(&format!(
            "path={path}; interface=org.freedesktop.DBus.Properties; member=PropertiesChanged"
        ))
        .count()
    };
    assert_eq!(changed("/org/astraeus/Node1"), 1, "{seen}");
    assert_eq!(changed("/org/astraeus/Node1/gpu/0"), 1, "{seen}");
    // The one Manager signal carries the count after all six.
    let manager_signal = seen
        .split("\nsignal ")
        .find(|m| m.contains("path=/org/astraeus/Node1; interface=org.freedesktop.DBus.Properties"))
        .unwrap();
    assert!(
        manager_signal.contains("string \"WorkersRunning\"\n         variant             uint32 6"),
        "{manager_signal}"
    );
}

/// The Manager's and a GPU's PropertiesChanged are held back a moment (at
/// most 50 ms) and sent once for every change made meanwhile, with the
/// values after them: lone submits in a row, each its own group and each
/// answered before the next is sent, share them. Their properties read
/// right after a reply are current all the same.
#[test]
fn lone_submits_in_a_row_share_the_managers_and_gpus_properties_changed() {
    const N: u32 = 30;
    let dir = open_tempdir();
    let bus = Bus::session();
    let _d = Daemon::start(&bus, dir.path(), &sim_file(dir.path()), &[]);
    let log = dir.path().join("monitor.log");
    let mut watch = monitor(
        &bus.address,
        "type='signal',sender='org.astraeus.Node1'",
        &log,
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let began = std::time::Instant::now();
    let running = rt.block_on(async {
        let c = zbus::connection::Builder::address(bus.address.as_str())
            .build()
            .await
            .unwrap();
        let node = zbus::Proxy::new(
            &c,
            "org.astraeus.Node1",
            "/org/astraeus/Node1",
            "org.astraeus.Node1.Manager",
        )
        .await
        .unwrap();
        for i in 0..N {
            let spec = shared_spec(&format!("w{i}"), "0.1");
            let _: (zbus::OwnedObjectPath, String, Vec<String>) =
                node.call("SubmitWorker", &(spec,)).await.unwrap();
        }
        // Read without the proxy's cache (which only signals would update).
        let props = zbus::fdo::PropertiesProxy::builder(&c)
            .destination("org.astraeus.Node1")
            .path("/org/astraeus/Node1")
            .build()
            .await
            .unwrap();
        let name = zbus::names::InterfaceName::try_from("org.astraeus.Node1.Manager").unwrap();
        u32::try_from(props.get(name, "WorkersRunning").await.unwrap()).unwrap()
    });
    let took_ms = began.elapsed().as_millis() as usize;
    assert_eq!(running, N, "read right after the last reply");
    let last = format!("string \"WorkersRunning\"\n         variant             uint32 {N}");
    eventually(
        "the Manager's PropertiesChanged with every submit counted",
        || std::fs::read_to_string(&log).is_ok_and(|s| s.contains(&last)),
    );
    let _ = watch.kill();
    let _ = watch.wait();
    let seen = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        seen.matches("member=WorkerNew").count(),
        N as usize,
        "{seen}"
    );
    for path in ["/org/astraeus/Node1", "/org/astraeus/Node1/gpu/0"] {
        let sent = seen
            .matches(&format!(
                "path={path}; interface=org.freedesktop.DBus.Properties; member=PropertiesChanged"
            ))
            .count();
        // One per submit without the holding back; with it, at most one
        // per 50 ms while the submits came (and the last, after them):
        // judged by the time they took, so a busy host that slows the
        // submits down changes the bound, not the verdict (#68: 15 of 30
        // failed a fixed bound while other tests ran).
        let most = took_ms / 50 + 2;
        assert!(
            (1..=most.min(N as usize)).contains(&sent),
            "{path}: {sent} sent in {took_ms} ms (at most {most})\n{seen}"
        );
    }
}

/// A sim machine of `gpus` GPUs of 8 GB, none held outside.
fn eights(gpus: usize) -> String {
    let mut t = String::from("machine = \"eights\"\ncpu_cores = 16\nmemory_gb = 64\n");
    for i in 0..gpus {
        t.push_str(&format!(
            "[[gpu]]\nmodel = \"L4\"\nuuid = \"GPU-e{i}\"\ntotal_gb = 8\n"
        ));
    }
    t
}

/// A GPU's property over the bus, as busctl prints it (None: no such object).
fn gpu_property(a: &str, index: u32, property: &str) -> Option<String> {
    let o = busctl(
        a,
        &[
            "get-property",
            "org.astraeus.Node1",
            &format!("/org/astraeus/Node1/gpu/{index}"),
            "org.astraeus.Node1.Gpu",
            property,
        ],
    );
    o.ok.then(|| o.stdout.trim().to_string())
}

/// The index of the one GPU a worker holds, from its own object.
fn gpu_of(a: &str, worker: &str) -> u32 {
    let o = busctl(
        a,
        &[
            "get-property",
            "org.astraeus.Node1",
            &format!("/org/astraeus/Node1/worker/{worker}"),
            "org.astraeus.Node1.Worker",
            "Gpus",
        ],
    );
    // a(us) 1 INDEX "UUID"
    let fields: Vec<&str> = o.stdout.split_whitespace().collect();
    assert_eq!(fields[..2], ["a(us)", "1"], "{}", o.stdout);
    fields[2].parse().unwrap()
}

/// A call shows what it changed on the GPUs it touched, read right after
/// its reply; the GPUs it did not touch keep their views. GPU objects come
/// and go only with a new reading of the inventory, and calls after that
/// show the new shape.
#[test]
fn a_call_shows_the_gpus_it_touched_and_a_new_reading_adds_and_removes_gpu_objects() {
    let dir = open_tempdir();
    let bus = Bus::session();
    let sim = dir.path().join("eights.toml");
    std::fs::write(&sim, eights(2)).unwrap();
    let d = Daemon::start(&bus, dir.path(), &sim, &[]);
    let a = bus.address.clone();
    let submit = |name: &str, gb: &str| {
        let o = manager(&a, None, "SubmitWorker", &["s", &shared_spec(name, gb)]);
        assert!(o.stdout.contains("\"running\""), "{}{}", o.stdout, o.stderr);
        gpu_of(&a, name)
    };
    let taken = |index: u32| gpu_property(&a, index, "TakenGb");

    // 6 + 5 > 8: the two land on different GPUs.
    let six = submit("six", "6");
    let five = submit("five", "5");
    assert_ne!(six, five);
    assert_eq!(taken(six).as_deref(), Some("d 6"));
    assert_eq!(taken(five).as_deref(), Some("d 5"));
    assert!(manager(&a, None, "StopWorker", &["s", "six"]).ok);
    assert_eq!(taken(six).as_deref(), Some("d 0"));
    assert_eq!(taken(five).as_deref(), Some("d 5"), "untouched by the stop");

    // A third GPU appears with a new reading, then goes again.
    assert_eq!(gpu_property(&a, 2, "TotalGb"), None);
    std::fs::write(&sim, eights(3)).unwrap();
    d.signal(libc::SIGHUP);
    eventually("GPU 2's object after the reading", || {
        gpu_property(&a, 2, "TotalGb").as_deref() == Some("d 8")
    });
    // Best fit: beside five (3 left there), not on an empty GPU.
    assert_eq!(submit("three", "3"), five);
    assert_eq!(taken(five).as_deref(), Some("d 8"));
    // 7 fits only on an empty GPU; the new one is as good as any.
    let seven = submit("seven", "7");
    assert_ne!(seven, five);
    assert_eq!(taken(seven).as_deref(), Some("d 7"));
    assert!(manager(&a, None, "StopWorker", &["s", "seven"]).ok);
    std::fs::write(&sim, eights(2)).unwrap();
    d.signal(libc::SIGHUP);
    eventually("GPU 2's object gone after the reading", || {
        gpu_property(&a, 2, "TotalGb").is_none()
    });
    // five's GPU is full: one goes to the other, shown at once.
    let one = submit("one", "1");
    assert_ne!(one, five);
    assert_eq!(taken(one).as_deref(), Some("d 1"));
    assert_eq!(taken(five).as_deref(), Some("d 8"));
}

/// A worker holding a whole GPU: its MEMORY column and Enforcement say
/// `whole` (#66: "promised" read weaker than it is: no one else is placed
/// on its GPU, so there is nothing to limit).
#[test]
fn a_whole_workers_memory_says_whole() {
    let dir = open_tempdir();
    let bus = Bus::session();
    let _d = Daemon::start(&bus, dir.path(), &sim_file(dir.path()), &[]);
    let a = &bus.address;
    let big = r#"{"name":"big","requested_resources":{"gpu_requests":{"count":1}}}"#;
    assert!(manager(a, None, "SubmitWorker", &["s", big]).ok);
    assert_eq!(state(a, "big"), "s \"running\"\n");
    let e = busctl(
        a,
        &[
            "get-property",
            "org.astraeus.Node1",
            "/org/astraeus/Node1/worker/big",
            "org.astraeus.Node1.Worker",
            "Enforcement",
        ],
    );
    assert_eq!(
        e.stdout,
        "s \"whole: its GPUs are all its own (no limit to hold)\"\n"
    );
    let o = ctl(a, None, &["--no-legend", "workers"]);
    let cells: Vec<&str> = o.stdout.split_whitespace().collect();
    assert!(
        cells.windows(2).any(|w| w == ["0", "whole"]),
        "the GPU column, then MEMORY: {}",
        o.stdout
    );
}
