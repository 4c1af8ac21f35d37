//! The shipped bus policy and the daemon's own checks, on a bus configured like
//! the system bus. Runs as root (as CI does): it starts clients as other users.

mod common;
use common::*;
use std::path::Path;

/// Manager methods anyone may call; every other method must be denied to nobody.
const READ_ONLY: &[&str] = &[
    "GetWorker",
    "ListClusterOffers",
    "ListClaims",
    "ListWorkers",
    "ListPending",
    "ListEnforcement",
    "ListEnded",
    "ListEndedMs",
    "ListGpus",
    "ListSharers",
    "WhyNot",
    "GetSchedule",
    "ListSlices",
    "ListSlicesMs",
    "ListNextSlices",
    "ListNextSlicesMs",
    "ListSliceNotes",
    "ListSliceNotesMs",
    "UsageReport",
    "UsageReportMs",
    "ListTemplates",
    "SliceReport",
    "SliceReportMs",
];

/// (interface, method, in-arg signatures) for every method in the committed XML.
fn object_for(iface: &str) -> &'static str {
    match iface {
        "org.astraeus.Node1.Manager" => "/org/astraeus/Node1",
        "org.astraeus.Node1.Gpu" => "/org/astraeus/Node1/gpu/0",
        "org.astraeus.Node1.Worker" => "/org/astraeus/Node1/worker/w",
        "org.astraeus.Node1.Template" => "/org/astraeus/Node1/template/t",
        other => panic!("no test object for interface {other}: add one"),
    }
}

fn gdbus_as(user: Option<&str>, address: &str, path: &str, method: &str, args: &[&str]) -> Out {
    let mut all = vec![
        "call",
        "--address",
        address,
        "-d",
        "org.astraeus.Node1",
        "-o",
        path,
        "-m",
        method,
    ];
    all.extend_from_slice(args);
    run_as(user, "gdbus", &all)
}

fn sim(dir: &Path) -> std::path::PathBuf {
    let p = dir.join("majin.toml");
    std::fs::write(&p, MAJIN_TOML).unwrap();
    p
}

#[test]
fn nobody_may_read_but_every_mutation_is_denied_by_the_bus() {
    assert!(
        is_root(),
        "this test starts clients as other users: run the suite as root (as CI does)"
    );
    let dir = open_tempdir();
    let bus = Bus::system_like(dir.path(), Some(policy_file()));
    std::fs::write(dir.path().join("node.toml"), TEST_DRIVER).unwrap();
    let _d = Daemon::start(&bus, dir.path(), &sim(dir.path()), &[]);
    let a = &bus.address;
    // Root may mutate: the object for the Worker interface.
    let o = manager(a, None, "SubmitWorker", &["s", r#"{"name":"w"}"#]);
    assert!(o.ok, "root submit: {}", o.stderr);
    define_template(a, "t");
    let o = manager(
        a,
        None,
        "SetSchedule",
        &["ss", "t", r#"[{"action":"resume","time":"+60"}]"#],
    );
    assert!(o.ok, "root sets a schedule: {}", o.stderr);

    let methods = methods_in_xml();
    assert!(methods.len() >= 8, "{methods:?}");
    for (iface, method, ins) in &methods {
        let args: Vec<String> = ins
            .iter()
            .enumerate()
            .map(|(i, t)| match (method.as_str(), t.as_str()) {
                ("ListSlices" | "ListSliceNotes" | "UsageReport", "x") => {
                    ["0", "86400"][i].to_string()
                }
                ("ListSlicesMs" | "ListSliceNotesMs" | "UsageReportMs", "x") => {
                    ["0", "86400000"][i].to_string()
                }
                ("UsageReport" | "UsageReportMs", "s") => "owner".to_string(),
                ("ListEnded" | "ListEndedMs", "x") => "0".to_string(),
                ("ListEnded" | "ListEndedMs" | "ListNextSlices" | "ListNextSlicesMs", "u") => {
                    "10".to_string()
                }
                ("SliceReport", _) => ["", "0", "86400"][i].to_string(),
                ("SliceReportMs", _) => ["", "0", "86400000"][i].to_string(),
                (_, "b") => "false".to_string(),
                ("SetSchedule", "s") => ["t", "[]"][i].to_string(),
                ("WhyNot" | "SubmitWorker", "s") => shared_spec("probe", "1"),
                ("GetWorker" | "StopWorker", "s") => "w".to_string(),
                ("GetSchedule", "s") => "t".to_string(),
                (_, "s") => "x".to_string(),
                (_, "u") => "0".to_string(),
                ("PrepareClaim", "t") => "268435456".to_string(),
                (m, t) => panic!("{m}: add a probe value for type {t}"),
            })
            .collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let full = format!("{iface}.{method}");
        let o = gdbus_as(Some("nobody"), a, object_for(iface), &full, &args);
        let bus_denied = o.stderr.contains("org.freedesktop.DBus.Error.AccessDenied");
        if iface == "org.astraeus.Node1.Manager" && READ_ONLY.contains(&method.as_str()) {
            assert!(o.ok, "nobody may call {full}: {}", o.stderr);
        } else {
            assert!(
                bus_denied,
                "the bus policy must deny {full} to nobody; got: {} {}",
                o.stdout, o.stderr
            );
        }
    }
    // Properties and introspection are readable by anyone.
    for path in [
        "/org/astraeus/Node1",
        "/org/astraeus/Node1/gpu/0",
        "/org/astraeus/Node1/worker/w",
    ] {
        let o = busctl_as(
            Some("nobody"),
            a,
            &["introspect", "org.astraeus.Node1", path],
        );
        assert!(o.ok, "introspect {path}: {}", o.stderr);
    }
    let o = gdbus_as(
        Some("nobody"),
        a,
        "/org/astraeus/Node1/gpu/0",
        "org.freedesktop.DBus.Properties.GetAll",
        &["org.astraeus.Node1.Gpu"],
    );
    assert!(
        o.ok && o.stdout.contains("'OfferedGb': <7.0>"),
        "{} {}",
        o.stdout,
        o.stderr
    );
    let o = gdbus_as(
        Some("nobody"),
        a,
        "/org/astraeus/Node1",
        "org.freedesktop.DBus.ObjectManager.GetManagedObjects",
        &[],
    );
    assert!(o.ok, "{}", o.stderr);
    // Nothing nobody did changed anything.
    assert_eq!(
        manager(a, None, "ListWorkers", &[])
            .stdout
            .matches("running")
            .count(),
        1
    );
}

#[test]
fn members_of_astraeus_cannot_stop_each_others_workers() {
    assert!(
        is_root(),
        "this test creates users and runs clients as them: run the suite as root (as CI does)"
    );
    let uid_a = ensure_user("astraeus-test-a");
    ensure_user("astraeus-test-b");
    let dir = open_tempdir();
    let bus = Bus::system_like(dir.path(), Some(policy_file()));
    let _d = Daemon::start(&bus, dir.path(), &sim(dir.path()), &[]);
    let a = &bus.address;

    let o = gdbus_as(
        Some("astraeus-test-a"),
        a,
        "/org/astraeus/Node1",
        "org.astraeus.Node1.Manager.SubmitWorker",
        &[&shared_spec("mine", "1")],
    );
    assert!(o.ok, "a member may submit: {}", o.stderr);
    let o = busctl(
        a,
        &[
            "get-property",
            "org.astraeus.Node1",
            "/org/astraeus/Node1/worker/mine",
            "org.astraeus.Node1.Worker",
            "Owner",
        ],
    );
    assert_eq!(o.stdout, format!("u {uid_a}\n"));

    // b passes the bus policy (a member) but the daemon refuses: not b's worker.
    let o = gdbus_as(
        Some("astraeus-test-b"),
        a,
        "/org/astraeus/Node1",
        "org.astraeus.Node1.Manager.StopWorker",
        &["mine"],
    );
    assert!(
        o.stderr.contains("org.astraeus.Node1.Error.AccessDenied"),
        "{}",
        o.stderr
    );
    assert!(
        o.stderr
            .contains(&format!("worker mine belongs to uid {uid_a}")),
        "{}",
        o.stderr
    );
    let o = gdbus_as(
        Some("astraeus-test-b"),
        a,
        "/org/astraeus/Node1/worker/mine",
        "org.astraeus.Node1.Worker.Stop",
        &[],
    );
    assert!(
        o.stderr.contains("org.astraeus.Node1.Error.AccessDenied"),
        "{}",
        o.stderr
    );
    // The owner may.
    let o = gdbus_as(
        Some("astraeus-test-a"),
        a,
        "/org/astraeus/Node1/worker/mine",
        "org.astraeus.Node1.Worker.Stop",
        &[],
    );
    assert!(o.ok, "{}", o.stderr);
}

#[test]
fn the_daemon_refuses_non_members_even_when_the_bus_lets_them_through() {
    assert!(
        is_root(),
        "this test runs clients as nobody: run the suite as root (as CI does)"
    );
    let dir = open_tempdir();
    let open_policy = careless_policy(dir.path());
    let bus = Bus::system_like(dir.path(), Some(&open_policy));
    let _d = Daemon::start(&bus, dir.path(), &sim(dir.path()), &[]);
    let o = gdbus_as(
        Some("nobody"),
        &bus.address,
        "/org/astraeus/Node1",
        "org.astraeus.Node1.Manager.SubmitWorker",
        &[&shared_spec("sneaky", "1")],
    );
    assert!(
        o.stderr.contains("org.astraeus.Node1.Error.AccessDenied"),
        "{}",
        o.stderr
    );
    assert!(
        o.stderr
            .contains("only root and members of group astraeus may"),
        "{}",
        o.stderr
    );
    // astraeusctl says the refused user by name too (looked up where it
    // runs, as the daemon's uid is this process's).
    let o = ctl(&bus.address, Some("nobody"), &["stop", "sneaky"]);
    assert_eq!(o.code, Some(5), "{}", o.stderr);
    assert!(o.stderr.contains("uid 65534 (nobody)"), "{}", o.stderr);
    // (Env redaction of Request is tested with a running container in tests/podman.rs.)
}

/// The member astraeus-test-a, and a daemon on a system-like bus under
/// the shipped policy configured by `config`.
fn member_and_daemon(config: &str) -> (tempfile::TempDir, Bus, Daemon) {
    assert!(is_root(), "run the suite as root (as CI does)");
    ensure_user("astraeus-test-a");
    let dir = open_tempdir();
    let bus = Bus::system_like(dir.path(), Some(policy_file()));
    std::fs::write(dir.path().join("node.toml"), config).unwrap();
    let d = Daemon::start(&bus, dir.path(), &sim(dir.path()), &[]);
    (dir, bus, d)
}

/// One member cannot fill the daemon: beyond access.max_pending_per_user
/// waiting (or max_workers_per_user held) a submit is QuotaExceeded; root
/// is exempt.
#[test]
fn members_are_held_to_their_quotas_and_root_is_not() {
    let (_dir, bus, _d) =
        member_and_daemon("[access]\nmax_workers_per_user = 4\nmax_pending_per_user = 2\n");
    let a = &bus.address;
    let submit = |user: Option<&str>, name: &str, gb: &str| {
        gdbus_as(
            user,
            a,
            "/org/astraeus/Node1",
            "org.astraeus.Node1.Manager.SubmitWorker",
            &[&shared_spec(name, gb)],
        )
    };
    let member = Some("astraeus-test-a");
    // One placed, two that can never fit the 7 GB offered wait; with two
    // waiting, any further submit is refused.
    assert!(submit(member, "small1", "1").ok);
    assert!(submit(member, "wait1", "7.5").ok);
    assert!(submit(member, "wait2", "7.5").ok);
    let o = submit(member, "wait3", "7.5");
    assert!(
        o.stderr.contains("org.astraeus.Node1.Error.QuotaExceeded")
            && o.stderr.contains("access.max_pending_per_user"),
        "{}",
        o.stderr
    );
    // One waiting less: room for one more, up to four held in all.
    let o = gdbus_as(
        member,
        a,
        "/org/astraeus/Node1",
        "org.astraeus.Node1.Manager.StopWorker",
        &["wait2"],
    );
    assert!(o.ok, "{}", o.stderr);
    assert!(submit(member, "small2", "1").ok);
    assert!(submit(member, "small3", "1").ok);
    let o = submit(member, "small4", "1");
    assert!(
        o.stderr.contains("org.astraeus.Node1.Error.QuotaExceeded")
            && o.stderr.contains("access.max_workers_per_user"),
        "{}",
        o.stderr
    );
    // Root is exempt.
    for i in 0..4 {
        assert!(submit(None, &format!("root{i}"), "7.5").ok);
    }
}

/// One member cannot churn the ledger full: beyond
/// access.max_request_mib_per_user of requests held live, or
/// access.max_submits_per_minute submits in a minute, a submit is
/// QuotaExceeded naming the key (not the bus's LimitsExceeded, which
/// astraeusctl would send again); a refused submit is not counted; root is
/// neither held nor counted.
#[test]
fn members_are_held_to_a_submit_rate_and_to_the_bytes_they_keep_live() {
    let (_dir, bus, _d) =
        member_and_daemon("[access]\nmax_submits_per_minute = 12\nmax_request_mib_per_user = 1\n");
    let a = &bus.address;
    let call = |user: Option<&str>, method: &str, arg: &str| {
        gdbus_as(
            user,
            a,
            "/org/astraeus/Node1",
            &format!("org.astraeus.Node1.Manager.{method}"),
            &[arg],
        )
    };
    // A unit worker that waits (7.5 of 7 GB offered), its env padded:
    // 120,000 bytes of request each, 8 of them within 1 MiB, not 9.
    let padded = |name: &str| {
        let spec = format!(
            r#"{{"name":"{name}","requested_resources":{{"gpu_requests":{{"shared":true,"memory_gb":7.5}}}},"run":{{"unit":{{"exec":["/bin/true"],"env":{{"PAD":"{}"}}}}}}}}"#,
            "x".repeat(119_700)
        );
        let spec = format!("{spec}{}", " ".repeat(120_000 - spec.len()));
        assert_eq!(spec.len(), 120_000);
        spec
    };
    let member = Some("astraeus-test-a");
    for i in 0..8 {
        let o = call(member, "SubmitWorker", &padded(&format!("pad{i}")));
        assert!(o.ok, "{}", o.stderr);
    }
    let o = call(member, "SubmitWorker", &padded("pad8"));
    assert!(
        o.stderr.contains("org.astraeus.Node1.Error.QuotaExceeded")
            && o.stderr.contains("access.max_request_mib_per_user"),
        "{}",
        o.stderr
    );
    // A stop gives its bytes back.
    assert!(call(member, "StopWorker", "pad0").ok);
    assert!(call(member, "SubmitWorker", &shared_spec("small0", "1")).ok);
    // Nine counted so far (the refusal was not): three more, then no more.
    for i in 1..4 {
        let o = call(
            member,
            "SubmitWorker",
            &shared_spec(&format!("small{i}"), "0.1"),
        );
        assert!(o.ok, "{}", o.stderr);
    }
    let o = call(member, "SubmitWorker", &shared_spec("small4", "0.1"));
    assert!(
        o.stderr.contains("org.astraeus.Node1.Error.QuotaExceeded")
            && o.stderr.contains("access.max_submits_per_minute"),
        "{}",
        o.stderr
    );
    // Stops are not submits: still allowed.
    assert!(call(member, "StopWorker", "small1").ok);
    // Root is exempt from both.
    for i in 0..15 {
        let o = call(None, "SubmitWorker", &padded(&format!("root{i}")));
        assert!(o.ok, "{}", o.stderr);
    }
}

/// #63: the submit rate's window survives a restart (read back from the
/// ledger): a member at access.max_submits_per_minute is refused after a
/// kill -9 and a start as before it (a fresh 60 a restart, until now).
#[test]
fn a_restart_gives_no_member_a_fresh_minute_of_submits() {
    let (dir, bus, mut d) = member_and_daemon("[access]\nmax_submits_per_minute = 3\n");
    let a = &bus.address;
    let submit = |name: &str| {
        gdbus_as(
            Some("astraeus-test-a"),
            a,
            "/org/astraeus/Node1",
            "org.astraeus.Node1.Manager.SubmitWorker",
            &[&shared_spec(name, "0.1")],
        )
    };
    for i in 0..3 {
        assert!(submit(&format!("r{i}")).ok);
    }
    let refused = |o: &Out| {
        o.stderr.contains("org.astraeus.Node1.Error.QuotaExceeded")
            && o.stderr.contains("access.max_submits_per_minute")
    };
    assert!(refused(&submit("r3")));
    d.child.kill().unwrap();
    d.child.wait().unwrap();
    let _d = Daemon::start(&bus, dir.path(), &sim(dir.path()), &[]);
    let o = submit("r4");
    assert!(refused(&o), "{}", o.stderr);
}

/// The figure docs/reliability.md gives (#50): how far one member churning
/// as hard as it can moves the ledger, in bytes per hour. Four callers of
/// one member loop submit + stop of a 120 KB request (the most gdbus passes
/// in one argument; the issue sent 260 KB over the bus);
/// the shipped limits hold them to access.max_submits_per_minute. Not a
/// pass/fail test (it takes minutes): run it on a release build with
///   cargo build --release && ASTRAEUS_TEST_DAEMON=$PWD/target/release/astraeusd \
///     ASTRAEUS_CHURN_SECONDS=600 cargo test --test policy -- --ignored --nocapture churn
#[test]
#[ignore = "a measurement, not a check: minutes long, run by hand on a release build (see above)"]
fn one_members_churn_in_bytes_per_hour() {
    let seconds: u64 = std::env::var("ASTRAEUS_CHURN_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(180);
    let (dir, bus, d) = member_and_daemon("");
    let a = bus.address.clone();
    let ledger = || {
        ["ledger.db", "ledger.db-wal"]
            .iter()
            .map(|f| std::fs::metadata(d.state.join(f)).map_or(0, |m| m.len()))
            .sum::<u64>()
    };
    let spec = |name: &str| {
        format!(
            r#"{{"name":"{name}","requested_resources":{{"gpu_requests":{{"shared":true,"memory_gb":1}}}},"run":{{"unit":{{"exec":["/bin/true"],"env":{{"PAD":"{}"}}}}}}}}"#,
            "x".repeat(120_000)
        )
    };
    // A minute of churn first: the log reaches its working size.
    let churn = |until: std::time::Instant, who: usize| {
        let (mut submitted, mut i) = (0u64, 0u64);
        while std::time::Instant::now() < until {
            i += 1;
            let name = format!("c{who}-{i}");
            let path = "/org/astraeus/Node1";
            let m = "org.astraeus.Node1.Manager";
            let o = gdbus_as(
                Some("astraeus-test-a"),
                &a,
                path,
                &format!("{m}.SubmitWorker"),
                &[&spec(&name)],
            );
            if o.ok {
                submitted += 1;
                gdbus_as(
                    Some("astraeus-test-a"),
                    &a,
                    path,
                    &format!("{m}.StopWorker"),
                    &[&name],
                );
            }
        }
        submitted
    };
    let run = |secs: u64| {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(secs);
        std::thread::scope(|s| {
            let hands: Vec<_> = (0..4).map(|w| s.spawn(move || churn(until, w))).collect();
            hands.into_iter().map(|h| h.join().unwrap()).sum::<u64>()
        })
    };
    run(60);
    let before = ledger();
    let submitted = run(seconds);
    let after = ledger();
    let per_hour = (after.saturating_sub(before)) as f64 * 3600.0 / seconds as f64;
    println!(
        "one member, {seconds} s of churn: {submitted} submits taken (and stopped); the ledger \
         and its log {before} -> {after} bytes: {:.1} MB an hour",
        per_hour / 1e6
    );
    drop(dir);
}

/// Holders cannot lie: a member may name only its own processes (another
/// user's GPU memory would stop counting as held outside), nothing is a
/// holder unless named (the caller's pid is no default), and a holder that
/// is gone (or whose pid another process took) stops counting.
#[test]
fn holders_are_the_callers_own_live_processes() {
    assert!(is_root(), "run the suite as root (as CI does)");
    let uid = ensure_user("astraeus-test-a");
    let dir = open_tempdir();
    let bus = Bus::system_like(dir.path(), Some(policy_file()));
    std::fs::write(
        dir.path().join("node.toml"),
        "[inventory]\nrefresh_seconds = 0.2\n",
    )
    .unwrap();
    let d = Daemon::start(&bus, dir.path(), &sim(dir.path()), &[]);
    let a = &bus.address;
    let member = Some("astraeus-test-a");
    let spec = |name: &str, holders: &[u32]| {
        format!(
            r#"{{"name":"{name}","holders":{holders:?},"requested_resources":{{"gpu_requests":{{"shared":true,"memory_gb":1}}}}}}"#
        )
    };
    let submit = |name: &str, holders: &[u32]| {
        gdbus_as(
            member,
            a,
            "/org/astraeus/Node1",
            "org.astraeus.Node1.Manager.SubmitWorker",
            &[&spec(name, holders)],
        )
    };
    let holders_of = |name: &str| {
        busctl(
            a,
            &[
                "get-property",
                "org.astraeus.Node1",
                &format!("/org/astraeus/Node1/worker/{name}"),
                "org.astraeus.Node1.Worker",
                "Holders",
            ],
        )
        .stdout
    };
    // Root's process (this test) is not the member's to name.
    let root_pid = std::process::id();
    let o = submit("spoof", &[root_pid]);
    assert!(
        o.stderr.contains("org.astraeus.Node1.Error.AccessDenied")
            && o.stderr
                .contains(&format!("holders[0]: process {root_pid} belongs to uid 0")),
        "{}",
        o.stderr
    );
    // The member's process running with root's rights (a set-uid program
    // it started) is not its own either.
    let mut setuid = std::process::Command::new("setpriv")
        .args(["--ruid", &uid.to_string(), "--euid", "0", "--clear-groups"])
        .args(["sleep", "60"])
        .spawn()
        .unwrap();
    let spid = setuid.id();
    eventually("the set-uid sleeper runs", || {
        std::fs::read_to_string(format!("/proc/{spid}/status"))
            .is_ok_and(|s| s.contains(&format!("Uid:\t{uid}\t0\t")))
    });
    let o = submit("setuid", &[spid]);
    setuid.kill().unwrap();
    setuid.wait().unwrap();
    assert!(
        o.stderr.contains("org.astraeus.Node1.Error.AccessDenied")
            && o.stderr.contains(&format!(
                "holders[0]: process {spid} runs with the rights of another user"
            )),
        "{}",
        o.stderr
    );
    // No holders named: none (not the caller's short-lived pid).
    assert!(submit("plain", &[]).ok);
    assert_eq!(holders_of("plain"), "au 0\n");
    // Its own process: taken, until it is gone.
    let mut own = std::process::Command::new("setpriv")
        .args([
            "--reuid",
            &uid.to_string(),
            "--regid",
            "65534",
            "--clear-groups",
            "sleep",
            "60",
        ])
        .spawn()
        .unwrap();
    let pid = own.id();
    eventually("the sleeper runs as the member", || {
        std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.contains(&uid.to_string()))
        })
    });
    let o = submit("held", &[pid]);
    assert!(o.ok, "{}", o.stderr);
    assert_eq!(holders_of("held"), format!("au 1 {pid}\n"));
    own.kill().unwrap();
    own.wait().unwrap();
    eventually("the gone holder is dropped", || {
        holders_of("held") == "au 0\n"
    });
    assert!(
        d.log_text()
            .contains(&format!("holder pid {pid} of worker held is gone")),
        "{}",
        d.log_text()
    );
}

/// The rotation and the templates are root's by the daemon's own check, not
/// only the bus policy's: on a bus that lets anyone call anything, a member
/// of group astraeus is still refused, by the daemon, for every one of them;
/// root passes the same check.
#[test]
fn the_daemon_itself_keeps_the_baseboard_for_root() {
    assert!(is_root(), "run the suite as root (as CI does)");
    ensure_user("astraeus-test-a");
    let dir = open_tempdir();
    let open = careless_policy(dir.path());
    let bus = Bus::system_like(dir.path(), Some(&open));
    let _d = Daemon::start(&bus, dir.path(), &sim(dir.path()), &[]);
    let a = &bus.address;
    let call = |user: Option<&str>, method: &str, args: &[&str]| {
        gdbus_as(
            user,
            a,
            "/org/astraeus/Node1",
            &format!("org.astraeus.Node1.Manager.{method}"),
            args,
        )
    };
    let member = Some("astraeus-test-a");
    // The bus lets the member through: its own submit works.
    let o = call(member, "SubmitWorker", &[&shared_spec("mine", "1")]);
    assert!(o.ok, "{}", o.stderr);
    let template = r#"{"name":"t","workload":{"model":"m","runtime":"r"},"user":{"kind":"internal","name":"u"},"vm":{"domain_xml":"<domain type='test'><name>t</name><memory>65536</memory><os><type>hvm</type></os></domain>"},"baseboard":[]}"#;
    for (method, args, words) in [
        ("SetSchedule", vec!["t", "[]"], "may not set schedules"),
        ("PreviewSchedule", vec!["t", "[]"], "may not set schedules"),
        (
            "CreateTemplate",
            vec![template],
            "only root may define them",
        ),
        ("RemoveTemplate", vec!["t"], "root's to start and stop"),
        ("Resume", vec!["t", "false"], "root's to start and stop"),
        ("PowerOff", vec!["t", "true"], "root's to start and stop"),
        (
            "StageWeights",
            vec!["t", "/tmp"],
            "root's to start and stop",
        ),
    ] {
        let o = call(member, method, &args);
        assert!(
            o.stderr.contains("org.astraeus.Node1.Error.AccessDenied") && o.stderr.contains(words),
            "{method}: {}",
            o.stderr
        );
    }
    // Root passes the daemon's check (and meets the next one: no template t).
    let o = call(None, "SetSchedule", &["t", "[]"]);
    assert!(
        o.stderr.contains("org.astraeus.Node1.Error.NotFound"),
        "{}",
        o.stderr
    );
}

/// Containers are root's unless `access.containers_for_group` extends them
/// to the group (a container can mount the host): the daemon's own check,
/// on a bus that lets anyone call.
#[test]
fn only_root_may_run_a_container_unless_config_extends_it_to_the_group() {
    assert!(is_root(), "run the suite as root (as CI does)");
    ensure_user("astraeus-test-a");
    let spec = r#"{"name":"c","run":{"container":{"image":"localhost/none","command":["true"]}}}"#;
    for (extended, refused) in [(false, true), (true, false)] {
        let dir = open_tempdir();
        let open = careless_policy(dir.path());
        let bus = Bus::system_like(dir.path(), Some(&open));
        std::fs::write(
            dir.path().join("node.toml"),
            format!(
                "[access]\ncontainers_for_group = {extended}\n[runtime]\npodman_socket = \"{}\"\n",
                dir.path().join("no-podman.sock").display()
            ),
        )
        .unwrap();
        let _d = Daemon::start(&bus, dir.path(), &sim(dir.path()), &[]);
        let o = gdbus_as(
            Some("astraeus-test-a"),
            &bus.address,
            "/org/astraeus/Node1",
            "org.astraeus.Node1.Manager.SubmitWorker",
            &[spec],
        );
        assert_eq!(
            o.stderr.contains("org.astraeus.Node1.Error.AccessDenied"),
            refused,
            "containers_for_group = {extended}: {} {}",
            o.stdout,
            o.stderr
        );
        if refused {
            assert!(
                o.stderr.contains("access.containers_for_group"),
                "{}",
                o.stderr
            );
        } else {
            assert!(o.ok, "{}", o.stderr);
        }
    }
}

/// Membership is checked again when a waiting worker is launched: a user
/// taken out of the access group while their container waited for its GPU
/// does not get it run (as the switch that allowed containers is checked
/// again). The oracle: the reason the worker ends with, in the journal's
/// text, and its being gone.
#[test]
fn a_worker_of_someone_taken_out_of_the_group_is_not_launched() {
    assert!(is_root(), "run the suite as root (as CI does)");
    let user = "astraeus-test-late";
    let uid = ensure_user(user);
    let group = "astraeus-late";
    let run = |cmd: &str, args: &[&str]| {
        let st = std::process::Command::new(cmd).args(args).status().unwrap();
        assert!(st.success(), "{cmd} {args:?}");
    };
    run("groupadd", &["-f", group]);
    run("gpasswd", &["-a", user, group]);
    let dir = open_tempdir();
    let bus = Bus::system_like(dir.path(), Some(policy_file()));
    std::fs::write(
        dir.path().join("node.toml"),
        format!(
            "[access]\ngroup = \"{group}\"\ncontainers_for_group = true\n\
             [runtime]\npodman_socket = \"{}\"\n",
            dir.path().join("no-podman.sock").display()
        ),
    )
    .unwrap();
    let d = Daemon::start(&bus, dir.path(), &sim(dir.path()), &[]);
    let a = &bus.address;
    let whole = r#"{"name":"blocker","requested_resources":{"gpu_requests":{"count":1}}}"#;
    assert!(manager(a, None, "SubmitWorker", &["s", whole]).ok);
    let queued = r#"{"name":"queued","requested_resources":{"gpu_requests":{"shared":true,"memory_gb":1}},
        "run":{"container":{"image":"localhost/bb"}}}"#;
    let o = manager(a, Some(user), "SubmitWorker", &["s", queued]);
    assert!(o.ok, "{}", o.stderr);
    assert_eq!(state(a, "queued"), "s \"pending\"\n");

    run("gpasswd", &["-d", user, group]);
    assert!(manager(a, None, "StopWorker", &["s", "blocker"]).ok);
    eventually("queued ended", || gone(a, "queued"));
    let why = format!(
        "worker queued failed to start: its access was withdrawn after it was submitted: \
         uid {uid} is no longer in group {group}"
    );
    assert!(d.log_text().contains(&why), "{}", d.log_text());
}

/// A daemon off the system bus serves the user it runs as (`scripts/try`
/// run by someone with no `astraeus` group): their own submits are taken,
/// another user's (not a member) are refused. The daemon runs as nobody.
#[test]
fn a_daemon_off_the_system_bus_serves_the_user_it_runs_as() {
    assert!(is_root(), "run the suite as root (as CI does)");
    let outsider = "astraeus-test-out";
    if !std::process::Command::new("id")
        .arg(outsider)
        .output()
        .unwrap()
        .status
        .success()
    {
        let st = std::process::Command::new("useradd")
            .args([
                "-M",
                "-N",
                "-g",
                "nogroup",
                "-s",
                "/usr/sbin/nologin",
                outsider,
            ])
            .status()
            .unwrap();
        assert!(st.success());
    }
    let dir = open_tempdir();
    let open_policy = careless_policy(dir.path());
    let bus = Bus::system_like(dir.path(), Some(&open_policy));
    let sim = sim(dir.path());
    std::fs::write(dir.path().join("node.toml"), "").unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let chown = |p: &Path| {
        let st = std::process::Command::new("chown")
            .args(["nobody:nogroup", p.to_str().unwrap()])
            .status()
            .unwrap();
        assert!(st.success());
    };
    chown(&state);
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut daemon = std::process::Command::new("setpriv")
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_astraeusd"))
        .args(["--bus-address", &bus.address, "--sim"])
        .arg(&sim)
        .arg("--state-dir")
        .arg(&state)
        .arg("--config")
        .arg(dir.path().join("node.toml"))
        .stderr(std::fs::File::create(dir.path().join("daemon.log")).unwrap())
        .spawn()
        .unwrap();
    let a = &bus.address;
    eventually("the daemon owns its name", || {
        manager(a, None, "ListWorkers", &[]).ok
    });
    let own = manager(
        a,
        Some("nobody"),
        "SubmitWorker",
        &["s", &shared_spec("own", "1")],
    );
    let other = manager(
        a,
        Some(outsider),
        "SubmitWorker",
        &["s", &shared_spec("other", "1")],
    );
    let _ = daemon.kill();
    let _ = daemon.wait();
    assert!(own.ok, "{}", own.stderr);
    assert!(!other.ok);
    assert!(
        other.stderr.contains("may not submit workers"),
        "{}",
        other.stderr
    );
}
