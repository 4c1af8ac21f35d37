//! Time-slicing over D-Bus against libvirt's test driver (inside the daemon):
//! templates with persistent VMs, a manual resume refused while another holds
//! the baseboard, a handoff (power-off → stopped → release confirmed → start →
//! ready, each step in the ledger in order), a handoff fired by the schedule,
//! and power-off at any time.

mod common;
use common::*;
use std::path::Path;
use std::time::Duration;

fn steps(db: &Path) -> Vec<String> {
    let c = rusqlite::Connection::open(db).unwrap();
    let mut stmt = c
        .prepare("SELECT step || ' ' || ifnull(from_template,'-') || '>' || ifnull(to_template,'-') FROM handoff_steps ORDER BY id")
        .unwrap();
    stmt.query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// GET a path of the machine page: the body.
/// The machine page's JSON, and its slice entry for `template`.
fn slice_on_page(port: u16, template: &str) -> (serde_json::Value, serde_json::Value) {
    let machine: serde_json::Value =
        serde_json::from_str(&http_get(port, "/machines/majin")).unwrap();
    let slice = machine["slices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["template"] == template)
        .unwrap_or_else(|| panic!("no slice of {template}: {machine}"))
        .clone();
    (machine, slice)
}

fn http_get(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default()
}

#[test]
fn templates_hand_the_baseboard_over_one_at_a_time() {
    let port = free_port();
    let dir = open_tempdir();
    let bus = Bus::session();
    let config = format!(
        "[inventory]\nrefresh_seconds = 0.5\n[schedule]\nhandoff_buffer_seconds = 0\n\
         [runtime]\nlibvirt_uri = \"test:///default\"\nstop_timeout_seconds = 2\n\
         [http]\nlisten = \"{port}\"\n"
    );
    let d = start_majin(&bus, dir.path(), &config, &[]);
    let a = &bus.address;
    for name in ["a", "b"] {
        let o = manager(a, None, "CreateTemplate", &["s", &test_template(name)]);
        assert!(o.ok, "{}", o.stderr);
        assert!(o
            .stdout
            .contains(&format!("/org/astraeus/Node1/template/{name}")));
    }
    let o = manager(a, None, "ListTemplates", &[]);
    assert!(
        o.stdout
            .contains("\"a\" \"team-a (internal)\" \"tmpl-a\" \"off\""),
        "{}",
        o.stdout
    );
    let o = ctl(a, None, &["template", "list"]);
    assert!(
        o.ok && o.stdout.contains("team-b (external)") && o.stdout.contains("tmpl-b"),
        "{}",
        o.stdout
    );
    // A device the VM does not pass through, and a taken name, are refused.
    let bad = test_template("c").replace("0000:41:00.0", "0000:42:00.0");
    let o = manager(a, None, "CreateTemplate", &["s", &bad]);
    assert!(o.stderr.contains("baseboard"), "{}", o.stderr);
    let o = manager(a, None, "CreateTemplate", &["s", &test_template("a")]);
    assert!(o.stderr.contains("already exists"), "{}", o.stderr);
    // No baseboard at all: refused with the seed's premise (this daemon's
    // node.toml does not allow it), the field and the way out named.
    let none = serde_json::json!({
        "name": "c", "workload": {"model": "m", "runtime": "r"},
        "user": {"kind": "internal", "name": "u"},
        "vm": {"domain_xml": "<domain type='test'><name>tmpl-c</name><memory>65536</memory><os><type>hvm</type></os></domain>"},
        "baseboard": [],
    });
    let o = manager(a, None, "CreateTemplate", &["s", &none.to_string()]);
    assert!(
        !o.ok
            && o.stderr.contains("baseboard: template c: an empty list")
            && o.stderr
                .contains("The whole baseboard is passed through to a single VM")
            && o.stderr.contains("allow_no_baseboard = true"),
        "{}",
        o.stderr
    );

    // a on; b may not simply resume while a holds the baseboard.
    assert!(manager(a, None, "Resume", &["sb", "a", "false"]).ok);
    eventually("a running", || template_state(a, "a") == "running");
    let o = manager(a, None, "Resume", &["sb", "b", "false"]);
    assert!(
        o.stderr.contains("template a holds the GPU baseboard"),
        "{}",
        o.stderr
    );
    let o = manager(a, None, "RemoveTemplate", &["s", "a"]);
    assert!(o.stderr.contains("power it off first"), "{}", o.stderr);

    // As a handoff: a is powered off, the release confirmed, then b starts;
    // `astraeusctl events` follows it.
    let mut events = std::process::Command::new(env!("CARGO_BIN_EXE_astraeusctl"))
        .args(["--bus-address", a, "--json", "events"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(events.stdout.take().unwrap()));
    let first = lines.next().unwrap().unwrap();
    assert!(first.contains(r#""event":"following""#), "{first}");
    assert!(manager(a, None, "Resume", &["sb", "b", "true"]).ok);
    eventually("b running", || template_state(a, "b") == "running");
    assert_eq!(template_state(a, "a"), "off");
    let mut followed: Vec<serde_json::Value> = Vec::new();
    // Until the last step (ready) and b's VM running have both been told.
    let (mut ready, mut running) = (false, false);
    for l in lines.by_ref() {
        let v: serde_json::Value = serde_json::from_str(&l.unwrap()).unwrap();
        ready |= v["event"] == "handoff-step" && v["step"] == "ready";
        running |=
            v["event"] == "template-state" && v["template"] == "b" && v["state"] == "running";
        followed.push(v);
        if ready && running {
            break;
        }
    }
    let _ = events.kill();
    let _ = events.wait();
    // The machine page tells the slice state and the handoff's dead time.
    let metrics = http_get(port, "/metrics");
    assert!(
        metrics.contains("astraeus_handoff_dead_time_seconds{template=\"b\"} "),
        "{metrics}"
    );
    let (_, b) = slice_on_page(port, "b");
    assert_eq!(b["state"], "running");
    let db = d.state.join("ledger.db");
    let s = steps(&db);
    let handoff: Vec<&str> = s
        .iter()
        .map(String::as_str)
        .skip_while(|x| !x.starts_with("power-off-asked"))
        .collect();
    assert_eq!(
        handoff
            .iter()
            .map(|x| x.split(' ').next().unwrap())
            .collect::<Vec<_>>(),
        [
            "power-off-asked",
            "stopped",
            "release-confirmed",
            "start-issued",
            "started",
            "ready"
        ],
        "{s:?}"
    );
    // The follower saw the same steps, a to b, each at the ledger's time;
    // a's slice ended and b's started between them.
    let ledger_steps: Vec<(String, String, i64)> = {
        let conn = rusqlite::Connection::open(&db).unwrap();
        let mut q = conn
            .prepare(
                "SELECT step, ifnull(from_template, ''), at_ms FROM handoff_steps \
                 WHERE to_template = 'b' ORDER BY id",
            )
            .unwrap();
        q.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    let seen: Vec<(String, String, i64)> = followed
        .iter()
        .filter(|v| v["event"] == "handoff-step")
        .map(|v| {
            assert_eq!(v["to"], "b");
            (
                v["step"].as_str().unwrap().to_string(),
                v["from"].as_str().unwrap().to_string(),
                v["step_at_ms"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(seen[0].1, "a", "{seen:?}");
    assert_eq!(seen, ledger_steps, "{followed:?}");
    let kinds: Vec<String> = followed
        .iter()
        .map(|v| match v["event"].as_str().unwrap() {
            "slice-started" | "slice-ended" | "template-state" => format!(
                "{} {}{}",
                v["event"].as_str().unwrap(),
                v["template"].as_str().unwrap(),
                v["state"]
                    .as_str()
                    .map(|s| format!(" {s}"))
                    .unwrap_or_default()
            ),
            other => other.to_string(),
        })
        .collect();
    let at = |k: &str| {
        kinds
            .iter()
            .position(|x| x == k)
            .unwrap_or_else(|| panic!("no {k} in {kinds:?}"))
    };
    assert!(at("slice-ended a") < at("slice-started b"), "{kinds:?}");
    // Each VM's state as it changed: a goes off before b runs.
    assert!(
        at("template-state a stopping") < at("template-state a off"),
        "{kinds:?}"
    );
    assert!(
        at("template-state a off") < at("template-state b running"),
        "{kinds:?}"
    );

    // The schedule hands it back to a in two seconds.
    let o = manager(
        a,
        None,
        "SetSchedule",
        &["ss", "a", r#"[{"action":"resume","time":"+2"}]"#],
    );
    assert!(o.ok, "{}", o.stderr);
    eventually("a running again, by the schedule", || {
        template_state(a, "a") == "running"
    });
    assert_eq!(template_state(a, "b"), "off");

    // Power-off works at any time (here through astraeusctl).
    let o = ctl(a, None, &["template", "poweroff", "a", "--hard"]);
    assert!(o.ok, "{}", o.stderr);
    eventually("a off", || template_state(a, "a") == "off");
    // The slices that ran: a, b (after a handoff: its dead time), a again.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let (from, to) = ((now - 3600).to_string(), (now + 60).to_string());
    let o = manager(a, None, "SliceReport", &["sxx", "", &from, &to]);
    assert!(o.ok, "{}", o.stderr);
    assert!(
        o.stdout
            .starts_with("a(ssxxxxdddddds) 3 \"a\" \"team-a (internal)\""),
        "{}",
        o.stdout
    );
    let report = ctl(a, None, &["slices", "--report", "--json"]);
    let rows: serde_json::Value = serde_json::from_str(&report.stdout).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 3, "{rows:?}");
    // The CLI asks SliceReportMs: its instants are the old method's
    // seconds, to the millisecond.
    let old_starts: Vec<i64> = o
        .stdout
        .split('"')
        // a(…) 3 "a" "user" START END … "error" "b" …: six pieces a row.
        .skip(4)
        .step_by(6)
        .map(|rest| rest.split_whitespace().next().unwrap().parse().unwrap())
        .collect();
    let new_starts: Vec<i64> = rows
        .iter()
        .map(|r| r["start_ms"].as_i64().unwrap().div_euclid(1000))
        .collect();
    assert_eq!(new_starts, old_starts, "{}\n{rows:?}", o.stdout);
    let (from_ms, to_ms) = (format!("{from}000"), format!("{to}000"));
    let ms = manager(a, None, "SliceReportMs", &["sxx", "", &from_ms, &to_ms]);
    assert!(
        ms.stdout.starts_with("a(ssxxxxdddddxs) 3 \"a\""),
        "{}",
        ms.stdout
    );
    assert_eq!(rows[1]["template"], "b");
    // Its dead time is the ledger's: release confirmed → start issued; and
    // start-to-ready is start issued → ready.
    let step_at = |name: &str| {
        ledger_steps
            .iter()
            .find(|(s, _, _)| s == name)
            .unwrap_or_else(|| panic!("no {name} in {ledger_steps:?}"))
            .2
    };
    assert_eq!(
        rows[1]["dead_time_ms"].as_i64(),
        Some(step_at("start-issued") - step_at("release-confirmed")),
        "{rows:?}"
    );
    assert_eq!(
        rows[1]["start_to_ready_ms"].as_i64(),
        Some(step_at("ready") - step_at("start-issued")),
        "{rows:?}"
    );
    // The follower was told the same dead time when b's slice started.
    let told = followed
        .iter()
        .find(|v| v["event"] == "slice-started" && v["template"] == "b")
        .unwrap();
    assert_eq!(told["dead_time_ms"], rows[1]["dead_time_ms"]);
    assert!(
        rows.iter().all(|r| r["end"].is_i64()),
        "all ended: {rows:?}"
    );
    // The passed-through GPU is invisible to the host: not reported, never 0.
    assert!(rows.iter().all(|r| r["gpu_avg_pct"].is_null()), "{rows:?}");
    assert!(rows.iter().all(|r| r["gpu_reported"] == false), "{rows:?}");
    let text = ctl(a, None, &["slices", "--report"]);
    // a's first slice had no release before it: its dead time is "none",
    // in words (it was a dash); b's, after the handoff, in ms.
    let first = text.stdout.lines().find(|l| l.starts_with("a ")).unwrap();
    assert!(first.contains(" none "), "{}", text.stdout);
    let second = text.stdout.lines().find(|l| l.starts_with("b ")).unwrap();
    assert!(
        second.contains(&format!(" {} ms ", rows[1]["dead_time_ms"])),
        "{}",
        text.stdout
    );
    assert!(
        text.stdout.contains("by user:") && text.stdout.contains("team-b (external)"),
        "{}",
        text.stdout
    );
    // And says where GPU figures come from, and why there are none.
    assert!(
        text.stdout
            .contains("GPU \"not reported\": the guest sent no GPU lines")
            && text.stdout.contains("org.astraeus.gpu.0"),
        "{}",
        text.stdout
    );
    // They join the usage report: a slice counts its whole baseboard.
    let usage = ctl(
        a,
        None,
        &[
            "usage",
            "--by",
            "user",
            "--csv",
            "--since",
            &format!("@{from}"),
        ],
    );
    assert!(
        usage
            .stdout
            .lines()
            .any(|l| l.starts_with("team-b (external),slice,")),
        "{}",
        usage.stdout
    );

    assert!(manager(a, None, "RemoveTemplate", &["s", "b"]).ok);
    let o = manager(a, None, "ListTemplates", &[]);
    assert!(!o.stdout.contains("\"b\""), "{}", o.stdout);

    // b created again from the same file: it takes the domain it defined
    // then (libvirt refused to define it twice: "already exists with
    // uuid"), and carries none of the removed b's handoff dead time.
    define_template(a, "b");
    let (machine, b) = slice_on_page(port, "b");
    assert!(b["handoff_dead_time_ms"].is_null(), "{machine}");
    // A file that names that domain but describes another VM is refused,
    // saying how to take the domain as it is.
    assert!(manager(a, None, "RemoveTemplate", &["s", "b"]).ok);
    let other = test_template("b").replace(
        "<devices>",
        "<devices><disk type='file' device='disk'><source file='/srv/os/other.img'/>\
         <target dev='vda'/></disk>",
    );
    let o = manager(a, None, "CreateTemplate", &["s", &other]);
    assert!(
        o.stderr.contains(
            "vm.domain_xml: a domain named tmpl-b exists already and is not the VM this XML \
             describes (other devices or disks)"
        ),
        "{}",
        o.stderr
    );
}

/// The daemon with libvirt's test driver and these failpoints ("" none).
fn on_test_driver(bus: &Bus, dir: &Path, failpoints: &str) -> Daemon {
    let config =
        "[runtime]\nlibvirt_uri = \"test:///default\"\n[slicing]\nallow_no_baseboard = true\n";
    start_majin(bus, dir, config, &[("ASTRAEUS_FAILPOINTS", failpoints)])
}

/// Defines template `name` (domain `tmpl-NAME`) with a read-only weights
/// disk at `dir/weights.img`: the image's path and the template's spec.
fn weights_template(a: &str, dir: &Path, name: &str) -> (std::path::PathBuf, serde_json::Value) {
    let image = dir.join("weights.img");
    let xml = format!(
        "<domain type='test'><name>tmpl-{name}</name><memory>65536</memory><os><type>hvm</type></os>\
         <devices><disk type='file' device='disk'><source file='{}'/><target dev='vdb'/><readonly/></disk>\
         </devices></domain>",
        image.display()
    );
    let spec = serde_json::json!({
        "name": name, "workload": {"model": "m", "runtime": "r"},
        "user": {"kind": "internal", "name": "staff"}, "vm": {"domain_xml": xml},
        "baseboard": [], "weights_disk": image.to_str().unwrap(),
    });
    let o = manager(a, None, "CreateTemplate", &["s", &spec.to_string()]);
    assert!(o.ok, "{}", o.stderr);
    (image, spec)
}

#[test]
fn weights_are_staged_once_onto_a_read_only_image() {
    let dir = open_tempdir();
    let bus = Bus::session();
    let d = on_test_driver(&bus, dir.path(), "");
    let a = &bus.address;
    let (image, spec) = weights_template(a, dir.path(), "w");
    // Not read-only in the domain: refused by field.
    let rw = spec
        .to_string()
        .replace("<readonly/>", "")
        .replace("\"name\":\"w\"", "\"name\":\"w2\"")
        .replace("tmpl-w", "tmpl-w2");
    let o = manager(a, None, "CreateTemplate", &["s", &rw]);
    assert!(
        o.stderr
            .contains("weights_disk: must be attached read-only"),
        "{}",
        o.stderr
    );

    let source = dir.path().join("model");
    std::fs::create_dir_all(source.join("shards")).unwrap();
    std::fs::write(source.join("config.json"), "{\"layers\": 32}").unwrap();
    std::fs::write(source.join("shards/0.bin"), vec![7u8; 3 << 20]).unwrap();
    let monitor_out = dir.path().join("signals.txt");
    let mut monitor = monitor(
        a,
        "type='signal',interface='org.astraeus.Node1.Manager'",
        &monitor_out,
    );
    let src = source.to_str().unwrap();
    let o = manager(a, None, "StageWeights", &["ss", "w", src]);
    assert!(o.ok, "{}", o.stderr);
    let signals = || std::fs::read_to_string(&monitor_out).unwrap_or_default();
    eventually("staged", || signals().contains("member=WeightsStaged"));
    let staged = signals();
    assert!(staged.contains("member=WeightsProgress"), "{staged}");
    assert!(staged.contains("string \"checksum\""), "{staged}");
    // The image holds the files (read back without mounting it).
    let out = std::process::Command::new("debugfs")
        .args(["-R", "cat /config.json"])
        .arg(&image)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "{\"layers\": 32}");
    let checksum = rusqlite::Connection::open(d.state.join("ledger.db"))
        .unwrap()
        .query_row(
            "SELECT checksum FROM weights WHERE template = 'w'",
            [],
            |r| r.get::<_, String>(0),
        )
        .unwrap();
    // The checksum is the documented SHA-256 of what the image holds.
    assert_eq!(
        checksum,
        image_checksum(&image, &["config.json", "shards/0.bin"])
    );
    let built = std::fs::metadata(&image).unwrap().modified().unwrap();

    // The same content again (through astraeusctl, which waits): nothing is rebuilt.
    let o = ctl(a, None, &["template", "stage", "w", src]);
    assert!(o.ok, "{}", o.stderr);
    assert!(
        o.stdout.contains("already staged (unchanged): sha256 "),
        "{}",
        o.stdout
    );
    eventually("second staging reported", || {
        signals().matches("member=WeightsStaged").count() == 2
    });
    assert!(signals().contains("boolean false"), "{}", signals());
    assert_eq!(
        std::fs::metadata(&image).unwrap().modified().unwrap(),
        built
    );

    // Never while the VM runs.
    assert!(manager(a, None, "Resume", &["sb", "w", "false"]).ok);
    eventually("w running", || template_state(a, "w") == "running");
    let o = manager(a, None, "StageWeights", &["ss", "w", src]);
    assert!(
        o.stderr.contains("weights are staged while it is off"),
        "{}",
        o.stderr
    );
    let _ = monitor.kill();
    let _ = monitor.wait();
}

/// Staging follows no link (#52): a source that is a link to the daemon's
/// own state directory copied the ledger into the image for a member to
/// read back with debugfs. Now it is refused, naming the link, and no
/// image is made; a real source's files keep modes no wider than their
/// own, and the image is root's alone (0600).
#[test]
fn staging_follows_no_link_and_widens_no_mode() {
    use std::os::unix::fs::PermissionsExt;
    let dir = open_tempdir();
    let bus = Bus::session();
    let d = on_test_driver(&bus, dir.path(), "");
    let a = &bus.address;
    let (image, _) = weights_template(a, dir.path(), "w");
    let link = dir.path().join("innocent");
    std::os::unix::fs::symlink(&d.state, &link).unwrap();
    let o = ctl(a, None, &["template", "stage", "w", link.to_str().unwrap()]);
    assert!(!o.ok, "{}", o.stdout);
    assert!(
        o.stderr.contains("is a link, and links are not followed"),
        "{}",
        o.stderr
    );
    assert!(
        !image.exists(),
        "an image was made from the state directory"
    );

    let source = dir.path().join("model");
    std::fs::create_dir_all(&source).unwrap();
    std::fs::write(source.join("config.json"), "{}").unwrap();
    std::fs::write(source.join("token"), "secret").unwrap();
    std::fs::set_permissions(source.join("token"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let o = ctl(
        a,
        None,
        &["template", "stage", "w", source.to_str().unwrap()],
    );
    assert!(o.ok, "{}", o.stderr);
    let mode = std::fs::metadata(&image).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the image is {mode:o}");
    let stat = std::process::Command::new("debugfs")
        .args(["-R", "stat /token"])
        .arg(&image)
        .output()
        .unwrap();
    let stat = String::from_utf8_lossy(&stat.stdout);
    assert!(stat.contains("Mode:  0600"), "{stat}");
}

/// #63: staging reads as the source's owner. Member A's source holds a
/// file of member B's that A cannot read (moved in from a shared
/// directory): staging it as root is refused, naming the file, and no
/// image is made; a file A may read through a group of theirs is staged;
/// the same tree owned by root stays root's (every file read).
#[test]
fn staging_copies_only_what_the_sources_owner_could_read() {
    assert!(is_root(), "run the suite as root (as CI does)");
    let (a_user, b_user, team) = ("astraeus-test-a", "astraeus-test-b", "astraeus-test-team");
    ensure_user(a_user);
    ensure_user(b_user);
    let run = |cmd: &str, args: &[&str]| {
        let st = std::process::Command::new(cmd).args(args).status().unwrap();
        assert!(st.success(), "{cmd} {args:?}");
    };
    run("groupadd", &["-f", team]);
    run("gpasswd", &["-a", a_user, team]);
    let dir = open_tempdir();
    let bus = Bus::session();
    let _d = on_test_driver(&bus, dir.path(), "");
    let a = &bus.address;
    let (image, _) = weights_template(a, dir.path(), "w");
    let source = dir.path().join("model");
    std::fs::create_dir_all(&source).unwrap();
    let file = |name: &str, text: &str, owner: &str, mode: &str| {
        let path = source.join(name);
        std::fs::write(&path, text).unwrap();
        run("chown", &[owner, path.to_str().unwrap()]);
        run("chmod", &[mode, path.to_str().unwrap()]);
    };
    file("own.txt", "mine", a_user, "600");
    file("team.txt", "ours", &format!("{b_user}:{team}"), "640");
    file("b-private.txt", "b's secret", b_user, "600");
    run("chown", &[a_user, source.to_str().unwrap()]);
    run("chmod", &["700", source.to_str().unwrap()]);
    let src = source.to_str().unwrap();

    let o = ctl(a, None, &["template", "stage", "w", src]);
    assert!(!o.ok, "{}", o.stdout);
    assert!(
        o.stderr.contains("b-private.txt: Permission denied"),
        "{}",
        o.stderr
    );
    assert!(!image.exists(), "an image was made with b's file in it");

    let cat = |name: &str| {
        let out = std::process::Command::new("debugfs")
            .args(["-R", &format!("cat /{name}")])
            .arg(&image)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    std::fs::remove_file(source.join("b-private.txt")).unwrap();
    let o = ctl(a, None, &["template", "stage", "w", src]);
    assert!(o.ok, "{}", o.stderr);
    assert_eq!(cat("own.txt"), "mine");
    assert_eq!(cat("team.txt"), "ours", "read through A's group");

    // Root's own tree: root's rights, every file.
    file("b-private.txt", "b's secret", b_user, "600");
    run("chown", &["root", src]);
    let o = ctl(a, None, &["template", "stage", "w", src]);
    assert!(o.ok, "{}", o.stderr);
    assert_eq!(cat("b-private.txt"), "b's secret");
}

/// New weights whose checksum the ledger refuses (a full disk) are not
/// reported staged: astraeusctl says why, and the image the ledger has no
/// checksum for is removed (staging the old content again would otherwise
/// compare equal to the old checksum); staging again builds and records it.
#[test]
fn weights_the_ledger_does_not_record_are_not_reported_staged() {
    let dir = open_tempdir();
    let bus = Bus::session();
    let d = on_test_driver(&bus, dir.path(), "store.weights=fail");
    let a = &bus.address;
    let (image, _) = weights_template(a, dir.path(), "w");
    let source = dir.path().join("model");
    std::fs::create_dir_all(&source).unwrap();
    std::fs::write(source.join("config.json"), "{\"layers\": 32}").unwrap();
    let src = source.to_str().unwrap();
    let recorded = || {
        rusqlite::Connection::open(d.state.join("ledger.db"))
            .unwrap()
            .query_row(
                "SELECT checksum FROM weights WHERE template = 'w'",
                [],
                |r| r.get::<_, String>(0),
            )
            .ok()
    };
    let o = ctl(a, None, &["template", "stage", "w", src]);
    assert!(!o.ok, "{}", o.stdout);
    assert!(
        o.stderr.contains("the ledger refused its checksum"),
        "{}",
        o.stderr
    );
    assert_eq!(recorded(), None);
    assert!(!image.exists(), "an image the ledger has no checksum for");
    let o = ctl(a, None, &["template", "stage", "w", src]);
    assert!(o.ok, "{}", o.stderr);
    assert!(!o.stdout.contains("unchanged"), "{}", o.stdout);
    assert_eq!(recorded(), Some(image_checksum(&image, &["config.json"])));
}

#[test]
fn actions_missed_while_down_are_recorded_as_skipped_and_never_fired_late() {
    let dir = open_tempdir();
    let bus = Bus::session();
    let start = || {
        start_majin(&bus, dir.path(), "[schedule]\nhandoff_buffer_seconds = 0\n[runtime]\nlibvirt_uri = \"test:///default\"\n[slicing]\nallow_no_baseboard = true\n", &[])
    };
    let a = bus.address.clone();
    let d = start();
    assert!(manager(&a, None, "CreateTemplate", &["s", &test_template("a")]).ok);
    let o = manager(
        &a,
        None,
        "SetSchedule",
        &[
            "ss",
            "a",
            r#"[{"action":"resume","time":"+2"},{"action":"poweroff","time":"+4"}]"#,
        ],
    );
    assert!(o.ok, "{}", o.stderr);
    drop(d); // down before either action is due
    std::thread::sleep(Duration::from_secs(5));
    let d = start();
    let db = d.state.join("ledger.db");
    eventually("skipped actions recorded", || {
        rusqlite::Connection::open(&db)
            .unwrap()
            .query_row(
                "SELECT count(*) FROM events WHERE kind = 'skipped'",
                [],
                |r| r.get::<_, i64>(0),
            )
            .unwrap()
            == 2
    });
    // Converged to now, and the timeline holds no slice from now on, so
    // nothing can start late (a state to read, not a wait that hopes).
    let now = jiff::Timestamp::now().as_second();
    let o = manager(
        &a,
        None,
        "ListSlices",
        &["xx", &(now - 1).to_string(), &(now + 86_400).to_string()],
    );
    assert_eq!(o.stdout.trim(), "a(sxxs) 0", "{}", o.stderr);
    assert!(
        !steps(&db).iter().any(|s| s.starts_with("start-issued")),
        "{:?}",
        steps(&db)
    );
    assert_ne!(template_state(&a, "a"), "running");
}

#[test]
fn a_resume_waiting_out_the_buffer_survives_a_kill() {
    let dir = open_tempdir();
    let bus = Bus::session();
    let start = || {
        start_majin(&bus, dir.path(), "[schedule]\nhandoff_buffer_seconds = 300\n[runtime]\nlibvirt_uri = \"test:///default\"\n[slicing]\nallow_no_baseboard = true\n", &[])
    };
    let a = bus.address.clone();
    let d = start();
    for t in ["a", "b"] {
        assert!(manager(&a, None, "CreateTemplate", &["s", &test_template(t)]).ok);
    }
    assert!(manager(&a, None, "Resume", &["sb", "a", "false"]).ok);
    eventually("a running", || template_state(&a, "a") == "running");
    assert!(manager(&a, None, "PowerOff", &["sb", "a", "true"]).ok);
    eventually("a released", || {
        steps(&d.state.join("ledger.db"))
            .iter()
            .any(|s| s.starts_with("release-confirmed"))
    });
    // b must wait 5 minutes after a's release: accepted, nothing starts yet.
    assert!(manager(&a, None, "Resume", &["sb", "b", "false"]).ok);
    assert_eq!(template_state(&a, "b"), "waiting");
    let db = d.state.join("ledger.db");
    drop(d); // SIGKILL while b waits
    let _d = start();
    // The accepted request is still there: b waits out the same buffer.
    eventually("b waiting after the restart", || {
        template_state(&a, "b") == "waiting"
    });
    assert!(
        steps(&db).iter().any(|s| s.starts_with("requested")),
        "{:?}",
        steps(&db)
    );
    assert!(
        !steps(&db)
            .iter()
            .any(|s| s.starts_with("start-issued") && s.ends_with(">b")),
        "the buffer holds after the restart: {:?}",
        steps(&db)
    );
}

/// A handoff step the ledger refuses (as a full disk would) is not acted
/// on: nothing after it is done (libvirt is not asked to stop or start a
/// VM the ledger would not know of), the person who asked is told, and
/// time-slicing pauses — the rest of the daemon goes on — then starts again
/// from the ledger's last step and what libvirt says runs: each step of the
/// handoff recorded once, in order, before what it stands for was done.
#[test]
fn a_handoff_step_the_ledger_refuses_is_not_acted_on() {
    let dir = open_tempdir();
    let bus = Bus::session();
    let config = "[inventory]\nrefresh_seconds = 0.5\n[schedule]\nhandoff_buffer_seconds = 0\n\
                  [runtime]\nlibvirt_uri = \"test:///default\"\nstop_timeout_seconds = 2\n[slicing]\nallow_no_baseboard = true\n";
    let a = bus.address.clone();
    let refuse = "store.step.forced=fail,store.step.power-off-asked=fail,\
                  store.step.release-confirmed=fail";
    let mut d = start_majin(&bus, dir.path(), config, &[("ASTRAEUS_FAILPOINTS", refuse)]);
    let db = d.state.join("ledger.db");
    for t in ["a", "b"] {
        assert!(manager(&a, None, "CreateTemplate", &["s", &test_template(t)]).ok);
    }
    assert!(manager(&a, None, "Resume", &["sb", "a", "false"]).ok);
    eventually("a running", || template_state(&a, "a") == "running");
    // A hard power-off whose step is refused: a is not destroyed (only
    // VMs beside the one on are, as the interlock's): converged again from
    // the ledger, a is found on and nothing is recorded.
    let before = steps(&db).len();
    let o = manager(&a, None, "PowerOff", &["sb", "a", "true"]);
    assert!(
        o.stderr.contains("refused handoff step forced"),
        "{}",
        o.stderr
    );
    converged_after(&d, "refused handoff step forced", "a should be on now");
    assert_eq!(template_state(&a, "a"), "running");
    assert_eq!(steps(&db).len(), before, "{:?}", steps(&db));
    // The power-off's step is refused: the caller hears it, a runs on.
    let o = manager(&a, None, "Resume", &["sb", "b", "true"]);
    assert!(!o.ok, "{}", o.stdout);
    assert!(
        o.stderr.contains("refused handoff step power-off-asked"),
        "{}",
        o.stderr
    );
    assert_eq!(template_state(&a, "a"), "running");
    assert!(
        !steps(&db).iter().any(|s| s.starts_with("power-off-asked")),
        "{:?}",
        steps(&db)
    );
    // Paused: a person's request is refused meanwhile, by name.
    let o = manager(&a, None, "PowerOff", &["sb", "a", "false"]);
    assert!(o.stderr.contains("time-slicing is paused"), "{}", o.stderr);
    // It starts again from the ledger, which holds a's slice: a stays on.
    converged_after(
        &d,
        "refused handoff step power-off-asked",
        "a should be on now",
    );
    assert_eq!(template_state(&a, "a"), "running");
    // Asked again: the release's step is refused on the way, and b's start
    // waits for its record (the next start from the ledger's last step).
    eventually("the handoff taken", || {
        manager(&a, None, "Resume", &["sb", "b", "true"]).ok
    });
    eventually("b running", || template_state(&a, "b") == "running");
    assert_eq!(template_state(&a, "a"), "off");
    assert!(d.child.try_wait().unwrap().is_none(), "the daemon went on");
    let log = std::fs::read_to_string(&d.log).unwrap();
    assert!(
        log.contains("refused handoff step release-confirmed"),
        "{log}"
    );
    let handoff: Vec<String> = steps(&db)[before..].to_vec();
    assert_eq!(
        handoff,
        [
            "power-off-asked a>b",
            "stopped a>b",
            "release-confirmed a>b",
            "start-issued ->b",
            "started ->b",
            "ready ->b"
        ],
        "{:?}",
        steps(&db)
    );
    drop(d);
    // A ledger that cannot say where the handoff stands is not taken for
    // one with no steps (which converges on what runs): paused, then read
    // again.
    let d = start_majin(
        &bus,
        dir.path(),
        config,
        &[("ASTRAEUS_FAILPOINTS", "store.last-step=fail")],
    );
    eventually("the read refused", || {
        d.log_text().contains("reading the last handoff step")
    });
    let o = manager(&a, None, "Resume", &["sb", "a", "false"]);
    assert!(!o.ok, "{}", o.stdout);
    converged_after(&d, "reading the last handoff step", "should be on now");
}

/// Waits until the daemon's log says `converged` after it said `refused`.
fn converged_after(d: &Daemon, refused: &str, converged: &str) {
    eventually(&format!("{converged}, after {refused}"), || {
        d.log_text()
            .split(refused)
            .nth(1)
            .is_some_and(|after| after.contains(converged))
    });
}

/// A template on the test driver with a readiness probe and, optionally, a
/// GPU channel at `gpu_socket` and a network interface.
fn probed_template(name: &str, readiness: serde_json::Value, extra_devices: &str) -> String {
    let xml = format!(
        "<domain type='test'><name>tmpl-{name}</name><memory>65536</memory>\
         <os><type>hvm</type></os><devices>{extra_devices}</devices></domain>"
    );
    serde_json::json!({
        "name": name,
        "workload": {"model": "m", "runtime": "r"},
        "user": {"kind": "internal", "name": "staff"},
        "vm": {"domain_xml": xml},
        "baseboard": [],
        "readiness": readiness,
    })
    .to_string()
}

/// The guest's GPU channel as a template's VM declares it: the socket this
/// test plays QEMU's end of, and the `<channel>` element.
fn gpu_channel(dir: &Path) -> (std::path::PathBuf, String) {
    let socket = dir.join("gpu.sock");
    let channel = format!(
        "<channel type='unix'><source mode='bind' path='{}'/>\
         <target type='virtio' name='org.astraeus.gpu.0'/></channel>",
        socket.display()
    );
    (socket, channel)
}

/// The slice report's rows for `template`, as astraeusctl prints them.
fn report_rows(a: &str, template: &str) -> Vec<serde_json::Value> {
    let o = ctl(a, None, &["slices", "--report", "--json"]);
    assert!(o.ok, "{}", o.stderr);
    let rows: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    rows.as_array()
        .unwrap()
        .iter()
        .filter(|r| r["template"] == template)
        .cloned()
        .collect()
}

/// A daemon on libvirt's test driver (no handoff buffer) that logs, at
/// debug, each row it reads from a guest's GPU channel.
fn start_reading_guest_rows(bus: &Bus, dir: &std::path::Path) -> Daemon {
    start_majin(
        bus,
        dir,
        "[schedule]\nhandoff_buffer_seconds = 0\n[runtime]\nlibvirt_uri = \"test:///default\"\n[slicing]\nallow_no_baseboard = true\n",
        &[("ASTRAEUS_LOG", "info,astraeusd::runtime::guest_channel=debug")],
    )
}

#[test]
fn a_slice_is_ready_only_when_its_probe_passes_and_reports_the_guests_gpu() {
    use std::io::Write;
    use std::time::Duration;
    let dir = open_tempdir();
    let bus = Bus::session();
    // When each guest row was read: the energy's oracle.
    let d = start_reading_guest_rows(&bus, dir.path());
    let a = &bus.address;
    let stays_starting = |name: &str| {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while template_state(a, name) != "starting" {
            assert!(
                std::time::Instant::now() < deadline,
                "{name} is {}, not starting; log:\n{}",
                template_state(a, name),
                d.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_secs(2));
        assert_eq!(template_state(a, name), "starting", "{}", d.log_text());
    };
    let power_off = |name: &str| {
        assert!(manager(a, None, "PowerOff", &["sb", name, "true"]).ok);
        eventually("off", || template_state(a, name) == "off");
    };

    // HTTP in the VM, and the guest writing nvidia-smi rows to its GPU
    // channel (this test plays QEMU's end of the channel's socket).
    let http = free_port();
    let (socket, channel) = gpu_channel(dir.path());
    let url = format!("http://127.0.0.1:{http}/health");
    let spec = probed_template("h", serde_json::json!({ "http": url }), &channel);
    let o = manager(a, None, "CreateTemplate", &["s", &spec]);
    assert!(o.ok, "{}", o.stderr);
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let guest = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        writeln!(s, "0, 20, 1000, 100").unwrap();
        std::thread::sleep(Duration::from_secs(1));
        // The guest side closes (nvidia-smi restarted, say): the daemon
        // connects again, and what is written then counts too.
        drop(s);
        let (mut s, _) = listener.accept().unwrap();
        writeln!(s, "not a row").unwrap();
        writeln!(s, "0, 60 %, 2000 MiB, 300 W").unwrap();
        s
    });
    assert!(manager(a, None, "Resume", &["sb", "h", "false"]).ok);
    stays_starting("h");
    assert!(
        d.log_text()
            .contains(&format!("h is not ready yet: GET {url} did not answer 2xx")),
        "{}",
        d.log_text()
    );
    let server = std::net::TcpListener::bind(("127.0.0.1", http)).unwrap();
    std::thread::spawn(move || {
        use std::io::Read;
        for s in server.incoming() {
            let mut s = s.unwrap();
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf);
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
        }
    });
    eventually("h running once its URL answers", || {
        template_state(a, "h") == "running"
    });
    let _guest_side = guest.join().unwrap();
    // The daemon's own record of when it read each row (its debug line).
    let read_at = || -> Vec<u64> {
        d.log_text()
            .lines()
            .filter_map(|l| l.split("guest GPU reading of h at ").nth(1))
            .map(|rest| rest.split(' ').next().unwrap().parse().unwrap())
            .collect()
    };
    eventually("both rows read", || read_at().len() == 2);
    power_off("h");
    let rows = report_rows(a, "h");
    assert_eq!(rows.len(), 1, "{rows:?}");
    let h = &rows[0];
    assert_eq!(h["gpu_avg_pct"], 40.0, "{h}");
    assert_eq!(h["gpu_peak_pct"], 60.0, "{h}");
    assert_eq!(h["gpu_reported"], true, "{h}");
    let peak_gb = h["gpu_memory_peak_gb"].as_f64().unwrap();
    assert!((peak_gb - 2000.0 / 1024.0).abs() < 1e-9, "{h}");
    // 100 W from the first row's reading to the second's; the last row
    // has no next reading, so its 300 W count for nothing.
    let at = read_at();
    assert!(at[1] > at[0], "{at:?}");
    let expected_wh = 100.0 * (at[1] - at[0]) as f64 / 1000.0 / 3600.0;
    let wh = h["gpu_energy_wh"].as_f64().unwrap();
    assert!(
        (wh - expected_wh).abs() < 1e-9,
        "{wh} Wh, not {expected_wh}: {h}"
    );
    // The same in mJ, as every JSON counts energy; instants in epoch ms.
    assert_eq!(
        h["gpu_energy_mj"],
        (expected_wh * 3.6e6).round() as u64,
        "{h}"
    );
    // start_ms to the millisecond; the old `start` is its whole seconds.
    let start_ms = h["start_ms"].as_i64().unwrap();
    assert_eq!(
        start_ms.div_euclid(1000),
        h["start"].as_i64().unwrap(),
        "{h}"
    );
    let text = ctl(a, None, &["slices", "--report"]);
    assert!(text.stdout.contains("2.0 GB"), "{}", text.stdout);

    // TCP to an address given: ready once something listens there.
    let tcp = free_port();
    let spec = probed_template(
        "t",
        serde_json::json!({ "tcp": format!("127.0.0.1:{tcp}") }),
        "",
    );
    assert!(manager(a, None, "CreateTemplate", &["s", &spec]).ok);
    assert!(manager(a, None, "Resume", &["sb", "t", "false"]).ok);
    stays_starting("t");
    let _service = std::net::TcpListener::bind(("127.0.0.1", tcp)).unwrap();
    eventually("t running once its port listens", || {
        template_state(a, "t") == "running"
    });
    // No channel in its VM: its GPU figures are "not reported", never 0.
    power_off("t");
    let t = &report_rows(a, "t")[0];
    assert!(
        t["gpu_avg_pct"].is_null() && t["gpu_energy_wh"].is_null(),
        "{t}"
    );
    assert!(d
        .log_text()
        .contains("tmpl-t has no org.astraeus.gpu.0 channel"));

    // The guest agent (libvirt's test driver answers for its guests).
    let spec = probed_template("g", serde_json::json!({ "agent": true }), "");
    assert!(manager(a, None, "CreateTemplate", &["s", &spec]).ok);
    assert!(manager(a, None, "Resume", &["sb", "g", "false"]).ok);
    eventually("g running", || template_state(a, "g") == "running");
    power_off("g");
}

/// Moves the calling thread (and what it starts) into a new network
/// namespace where every address of libvirt's default network
/// (192.168.122.0/24, the test driver's made-up leases) is local, so that
/// what answers there is only what this test puts there. False when this
/// may not be done (not root).
fn own_network_with_the_guests_addresses() -> bool {
    // SAFETY: unshare takes no pointers; it changes only this thread.
    if !is_root() || unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return false;
    }
    for args in [
        &["link", "set", "lo", "up"][..],
        &["route", "add", "local", "192.168.122.0/24", "dev", "lo"],
    ] {
        let ok = std::process::Command::new("ip")
            .args(args)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "ip {args:?}");
    }
    true
}

#[test]
fn a_port_is_probed_on_the_guests_addresses_as_libvirt_knows_them() {
    // Its own thread: the namespace must not outlive the test, even when
    // the harness runs tests on its main thread (--test-threads=1).
    let body = std::thread::spawn(probe_on_the_guests_addresses).join();
    if let Err(panic) = body {
        std::panic::resume_unwind(panic);
    }
}

fn probe_on_the_guests_addresses() {
    if !require_component(
        own_network_with_the_guests_addresses(),
        "root, for a network namespace",
    ) {
        return;
    }
    let dir = open_tempdir();
    let bus = Bus::session();
    let d = start_majin(
        &bus,
        dir.path(),
        "[schedule]\nhandoff_buffer_seconds = 0\n[runtime]\nlibvirt_uri = \"test:///default\"\n[slicing]\nallow_no_baseboard = true\n",
        &[],
    );
    let a = &bus.address;
    let nic = "<interface type='network'><source network='default'/>\
               <mac address='52:54:00:aa:bb:02'/></interface>";
    let spec = probed_template("n", serde_json::json!({ "tcp": 8000 }), nic);
    let o = manager(a, None, "CreateTemplate", &["s", &spec]);
    assert!(o.ok, "{}", o.stderr);
    assert!(manager(a, None, "Resume", &["sb", "n", "false"]).ok);
    // Nothing listens on the guest's address yet: it stays starting, and
    // the log says where it knocked.
    eventually("a probe of the leased address", || {
        d.log_text().lines().any(|l| {
            l.contains("n is not ready yet: TCP 192.168.122.") && l.contains(":8000 refused")
        })
    });
    assert_eq!(template_state(a, "n"), "starting");
    let _service = std::net::TcpListener::bind("0.0.0.0:8000").unwrap();
    eventually("n running once its guest's port listens", || {
        template_state(a, "n") == "running"
    });
    let log = d.log_text();
    assert!(log.contains("n is ready: TCP 192.168.122."), "{log}");
    // Power-off works at any time.
    assert!(manager(a, None, "PowerOff", &["sb", "n", "true"]).ok);
    eventually("off", || template_state(a, "n") == "off");
}

/// A typo in a template's name never takes the baseboard out of service: a
/// schedule for a template that does not exist is refused (and makes no
/// object); one left in a ledger from before is dropped on start, never
/// fired; removing a template removes its schedule with it.
#[test]
fn schedules_belong_to_templates_that_exist() {
    let dir = open_tempdir();
    let bus = Bus::session();
    let config = format!("[schedule]\nhandoff_buffer_seconds = 0\n{TEST_DRIVER}");
    let d = start_majin(&bus, dir.path(), &config, &[]);
    let a = bus.address.clone();
    define_template(&a, "a");
    define_template(&a, "b");
    assert!(manager(&a, None, "Resume", &["sb", "b", "false"]).ok);
    eventually("b runs", || template_state(&a, "b") == "running");

    // The ghost sequence of the issue: refused, and nothing moves.
    let soon = r#"[{"action":"resume","time":"+3"}]"#;
    let o = manager(&a, None, "SetSchedule", &["ss", "ghost", soon]);
    assert!(
        !o.ok && o.stderr.contains("no template named ghost"),
        "{}",
        o.stderr
    );
    let o = gdbus_manager(&a, "SetSchedule", &["ghost", soon]);
    assert!(
        o.stderr.contains("org.astraeus.Node1.Error.NotFound"),
        "{}",
        o.stderr
    );
    assert!(!manager(&a, None, "GetSchedule", &["s", "ghost"]).ok);
    let tree = busctl(&a, &["tree", "--list", "org.astraeus.Node1"]).stdout;
    assert!(!tree.contains("template/ghost"), "{tree}");
    // Nothing was kept that could fire: no schedule row, no slice ahead.
    let db = d.state.join("ledger.db");
    assert_eq!(schedule_rows(&db, "ghost"), 0);
    let now = jiff::Timestamp::now().as_second();
    let o = manager(
        &a,
        None,
        "ListSlices",
        &["xx", &now.to_string(), &(now + 86_400).to_string()],
    );
    assert!(!o.stdout.contains("ghost"), "{}", o.stdout);
    assert_eq!(template_state(&a, "b"), "running");
    assert!(
        !steps(&db).iter().any(|s| s.contains("ghost")),
        "{:?}",
        steps(&db)
    );

    // A name with control characters is echoed printable, never raw.
    for method in ["Resume", "GetSchedule"] {
        let args: &[&str] = if method == "Resume" {
            &["sb", "gh\u{1b}[2Jost", "false"]
        } else {
            &["s", "gh\u{1b}[2Jost"]
        };
        let o = manager(&a, None, method, args);
        assert!(
            o.stderr.contains("gh?[2Jost") && !o.stderr.contains('\u{1b}'),
            "{method}: {:?}",
            o.stderr
        );
    }

    // Removing a template (its VM off) removes its schedule in the same step.
    let later = r#"[{"action":"resume","time":"+86400"}]"#;
    assert!(manager(&a, None, "SetSchedule", &["ss", "a", later]).ok);
    let o = manager(&a, None, "RemoveTemplate", &["s", "a"]);
    assert!(o.ok, "{}", o.stderr);
    assert!(!manager(&a, None, "GetSchedule", &["s", "a"]).ok);
    assert_eq!(schedule_rows(&db, "a"), 0);
    let c = rusqlite::Connection::open(&db).unwrap();

    // A ledger from before this rule holds a schedule for a template that
    // does not exist, due in 2 s: dropped on start, never fired.
    drop(d);
    let due = jiff::Timestamp::now().as_second() + 2;
    c.execute(
        "INSERT INTO schedules (template, actions, set_ms) VALUES ('ghost', ?1, 0)",
        [format!(r#"[{{"action":"resume","time":{due}}}]"#)],
    )
    .unwrap();
    drop(c);
    let d = start_majin(&bus, dir.path(), &config, &[]);
    assert!(!manager(&a, None, "GetSchedule", &["s", "ghost"]).ok);
    assert!(
        d.log_text().contains("dropped the schedule of ghost"),
        "{}",
        d.log_text()
    );
    // Dropped from the ledger before the daemon served anything, so there
    // is nothing left that could fire (read, not waited for).
    assert_eq!(schedule_rows(&db, "ghost"), 0);
    assert!(
        !steps(&db).iter().any(|s| s.contains("ghost")),
        "{:?}",
        steps(&db)
    );
}

/// How many schedule rows the ledger holds for `template`.
fn schedule_rows(db: &Path, template: &str) -> i64 {
    rusqlite::Connection::open(db)
        .unwrap()
        .query_row(
            "SELECT count(*) FROM schedules WHERE template = ?1",
            [template],
            |r| r.get(0),
        )
        .unwrap()
}

/// node.toml for libvirt's test driver over a node file (in `dir`) that
/// has `domain` running, and no buffer between handoffs.
fn with_domain(dir: &Path, domain: &str) -> String {
    let node = dir.join("node.xml");
    std::fs::write(
        &node,
        format!(
            "<node><cpu><mhz>2000</mhz><model>i686</model><active>2</active><total>2</total>\
             <nodes>1</nodes><sockets>1</sockets><cores>2</cores><threads>1</threads></cpu>\
             <memory>2097152</memory>{domain}</node>"
        ),
    )
    .unwrap();
    format!(
        "[schedule]\nhandoff_buffer_seconds = 0\n[runtime]\nlibvirt_uri = \"test://{}\"\n[slicing]\nallow_no_baseboard = true\n",
        node.display()
    )
}

/// The release interlock, over libvirt (a test-driver node file): a domain
/// that is no template but holds a baseboard device keeps the incoming
/// template waiting — no start is issued, and the log names the holder.
/// (Breaking `Libvirt::holders` to answer "nobody" makes this fail.)
#[test]
fn a_foreign_domain_on_the_baseboard_keeps_the_template_waiting() {
    let dir = open_tempdir();
    let intruder = "<domain type='test'><name>intruder</name><memory>65536</memory>\
        <os><type>hvm</type></os><devices><hostdev mode='subsystem' type='pci' managed='yes'>\
        <source><address domain='0x0000' bus='0x41' slot='0x00' function='0x0'/></source>\
        </hostdev></devices></domain>";
    let bus = Bus::session();
    let d = start_majin(&bus, dir.path(), &with_domain(dir.path(), intruder), &[]);
    let a = bus.address.clone();
    define_template(&a, "a");
    assert!(manager(&a, None, "Resume", &["sb", "a", "false"]).ok);
    eventually("the holder is named", || {
        d.log_text().contains("baseboard still held by intruder")
    });
    assert_eq!(template_state(&a, "a"), "waiting");
    let db = d.state.join("ledger.db");
    assert!(
        !steps(&db).iter().any(|s| s.starts_with("start-issued")),
        "{:?}",
        steps(&db)
    );
}

/// The interlock fails closed (#52): an active domain whose XML cannot be
/// read is a holder, named with why, and the template waits. The same
/// bystander described fine passes nothing through, and the template
/// starts. (Taking an unreadable domain as holding nothing, as before,
/// makes the first half fail.)
#[test]
fn a_domain_that_cannot_be_described_keeps_the_template_waiting() {
    for (failpoints, held) in [("libvirt.describe-domain=fail@all", true), ("", false)] {
        let dir = open_tempdir();
        let bystander = "<domain type='test'><name>bystander</name><memory>65536</memory>\
            <os><type>hvm</type></os><devices></devices></domain>";
        let bus = Bus::session();
        let config = with_domain(dir.path(), bystander);
        let d = start_majin(
            &bus,
            dir.path(),
            &config,
            &[("ASTRAEUS_FAILPOINTS", failpoints)],
        );
        let a = bus.address.clone();
        define_template(&a, "a");
        assert!(manager(&a, None, "Resume", &["sb", "a", "false"]).ok);
        if held {
            eventually("the unreadable domain is named a holder", || {
                d.log_text().contains(
                    "baseboard still held by domain bystander: its XML could not be read: \
                     failpoint libvirt.describe-domain",
                )
            });
            std::thread::sleep(std::time::Duration::from_secs(2));
            assert_eq!(template_state(&a, "a"), "waiting");
            let db = d.state.join("ledger.db");
            assert!(
                !steps(&db).iter().any(|s| s.starts_with("start-issued")),
                "{:?}",
                steps(&db)
            );
        } else {
            eventually("a running", || template_state(&a, "a") == "running");
        }
    }
}

/// A template removed and created again starts `off` (#52): the failure
/// was the removed template's, not its name's. (It showed the old
/// `failed` until its next handoff.)
#[test]
fn a_template_created_again_starts_off_with_no_old_failure() {
    let dir = open_tempdir();
    let bus = Bus::session();
    let config = "[schedule]\nhandoff_buffer_seconds = 0\n[runtime]\n\
        libvirt_uri = \"test:///default\"\n[slicing]\nallow_no_baseboard = true\n";
    let d = start_majin(
        &bus,
        dir.path(),
        config,
        &[("ASTRAEUS_FAILPOINTS", "libvirt.power-on=fail@all")],
    );
    let a = &bus.address;
    // The start's line says what is on in words, never "on: " and nothing.
    eventually("converged", || {
        d.log_text()
            .contains("none should be on now; no template VM is on")
    });
    define_template(a, "a");
    assert!(manager(a, None, "Resume", &["sb", "a", "false"]).ok);
    eventually("a failed", || template_state(a, "a") == "failed");
    assert!(manager(a, None, "RemoveTemplate", &["s", "a"]).ok);
    // Its domain is kept in libvirt: created again by that domain's name.
    let again = serde_json::json!({
        "name": "a", "workload": {"model": "m", "runtime": "r"},
        "user": {"kind": "internal", "name": "team-a"}, "vm": {"domain": "tmpl-a"},
        "baseboard": ["0000:41:00.0"],
    });
    let o = manager(a, None, "CreateTemplate", &["s", &again.to_string()]);
    assert!(o.ok, "{}", o.stderr);
    assert_eq!(template_state(a, "a"), "off");
}

/// Two templates on disjoint baseboards still take turns (one VM on at a
/// time, as the design says, whatever devices each passes through): c may
/// not simply resume while a is on, and a handoff powers a off first.
#[test]
fn templates_on_disjoint_baseboards_still_take_turns() {
    let dir = open_tempdir();
    let bus = Bus::session();
    let config = "[schedule]\nhandoff_buffer_seconds = 0\n[runtime]\n\
        libvirt_uri = \"test:///default\"\nstop_timeout_seconds = 2\n[slicing]\nallow_no_baseboard = true\n";
    let _d = start_majin(&bus, dir.path(), config, &[]);
    let a = &bus.address;
    define_template(a, "a");
    let other = test_template("c")
        .replace("bus='0x41'", "bus='0x43'")
        .replace("0000:41:00.0", "0000:43:00.0");
    let o = manager(a, None, "CreateTemplate", &["s", &other]);
    assert!(o.ok, "{}", o.stderr);
    assert!(manager(a, None, "Resume", &["sb", "a", "false"]).ok);
    eventually("a running", || template_state(a, "a") == "running");
    let o = manager(a, None, "Resume", &["sb", "c", "false"]);
    assert!(
        o.stderr.contains("template a holds the GPU baseboard"),
        "{}",
        o.stderr
    );
    assert!(manager(a, None, "Resume", &["sb", "c", "true"]).ok);
    // Never both on: while c is not yet running, a may be; once c is, a is off.
    eventually("c running", || {
        let (sa, sc) = (template_state(a, "a"), template_state(a, "c"));
        assert!(!(sa == "running" && sc == "running"), "both on");
        sc == "running"
    });
    assert_eq!(template_state(a, "a"), "off");
}

/// SHA-256 in the documented form (each file's relative path, a zero byte,
/// its size as 8 little-endian bytes, its bytes; in path order), computed
/// here from the image's own files, read back with debugfs.
fn image_checksum(image: &std::path::Path, files: &[&str]) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    let mut sorted = files.to_vec();
    sorted.sort();
    for rel in sorted {
        let out = std::process::Command::new("debugfs")
            .args(["-R", &format!("cat /{rel}")])
            .arg(image)
            .output()
            .unwrap();
        h.update(rel.as_bytes());
        h.update([0]);
        h.update((out.stdout.len() as u64).to_le_bytes());
        h.update(&out.stdout);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Whoever can write the source may change it while it is staged: the
/// image must still hold exactly what its recorded checksum names (the red
/// team's race: checksum, then `mkfs.ext4 -d` reading the files again). A
/// writer rewrites a file all through the staging; a failpoint holds the
/// staging between its two reads of the content for a second.
#[test]
fn the_image_holds_exactly_what_its_checksum_names() {
    let dir = open_tempdir();
    let bus = Bus::session();
    let d = on_test_driver(&bus, dir.path(), "weights.snapshot-taken=pause1000");
    let a = &bus.address;
    let (image, _) = weights_template(a, dir.path(), "r");
    let source = dir.path().join("model");
    std::fs::create_dir_all(&source).unwrap();
    std::fs::write(source.join("weights.bin"), vec![1u8; 1 << 20]).unwrap();
    std::fs::write(source.join("config.json"), "0").unwrap();
    let writing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let writer = {
        let (writing, config) = (writing.clone(), source.join("config.json"));
        let tmp = dir.path().join("config.tmp");
        std::thread::spawn(move || {
            let mut n = 0u64;
            while writing.load(std::sync::atomic::Ordering::Relaxed) {
                n += 1;
                // Renamed into place (from outside the tree, so the staging
                // never meets a half-written file or a stray one).
                std::fs::write(&tmp, n.to_string()).unwrap();
                std::fs::rename(&tmp, &config).unwrap();
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        })
    };
    let o = ctl(
        a,
        None,
        &["template", "stage", "r", source.to_str().unwrap()],
    );
    writing.store(false, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    assert!(o.ok, "{} {}", o.stdout, o.stderr);
    let recorded = rusqlite::Connection::open(d.state.join("ledger.db"))
        .unwrap()
        .query_row(
            "SELECT checksum FROM weights WHERE template = 'r'",
            [],
            |r| r.get::<_, String>(0),
        )
        .unwrap();
    assert_eq!(
        image_checksum(&image, &["config.json", "weights.bin"]),
        recorded,
        "the image differs from what its checksum names"
    );
    assert!(
        !dir.path().join("weights.snapshot").exists(),
        "the snapshot is removed once the image is built"
    );
}

/// `astraeusctl template stage` at a terminal draws one bar in place
/// (plain lines into a pipe, as the weights tests see), and when the daemon
/// goes away before WeightsStaged it says so and exits non-zero instead of
/// ending quietly as if staged.
#[test]
fn staging_shows_a_bar_at_a_terminal_and_fails_when_the_daemon_goes() {
    let dir = open_tempdir();
    let bus = Bus::session();
    let d = start_majin(
        &bus,
        dir.path(),
        "[runtime]\nlibvirt_uri = \"test:///default\"\n[slicing]\nallow_no_baseboard = true\n",
        // The second staging is held after its snapshot for the kill.
        &[("ASTRAEUS_FAILPOINTS", "weights.snapshot-taken=pause5000@2")],
    );
    let a = bus.address.clone();
    weights_template(&a, dir.path(), "p");
    let source = dir.path().join("model");
    std::fs::create_dir_all(&source).unwrap();
    std::fs::write(source.join("weights.bin"), vec![3u8; 4 << 20]).unwrap();
    let stage = format!(
        "{} --bus-address '{a}' template stage p '{}'",
        env!("CARGO_BIN_EXE_astraeusctl"),
        source.display()
    );
    let out = std::process::Command::new("script")
        .args(["-qec", &stage, "/dev/null"])
        .output()
        .unwrap();
    let tty = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{tty}");
    assert!(
        tty.contains("\r") && tty.contains("[##############################] 100%"),
        "a bar redrawn in place: {tty:?}"
    );
    assert!(tty.contains("weights of p staged: sha256 "), "{tty:?}");
    // New content, staged again; the daemon is killed while it is held.
    std::fs::write(source.join("weights.bin"), vec![4u8; 4 << 20]).unwrap();
    let src = source.to_str().unwrap().to_string();
    let staging = {
        let a = a.clone();
        std::thread::spawn(move || ctl(&a, None, &["template", "stage", "p", &src]))
    };
    eventually("the second staging held after its snapshot", || {
        dir.path().join("weights.snapshot").exists()
    });
    std::thread::sleep(std::time::Duration::from_millis(500));
    d.signal(libc::SIGKILL);
    let o = staging.join().unwrap();
    assert!(!o.ok, "exited 0 without WeightsStaged: {}", o.stdout);
    assert!(
        o.stderr
            .contains("the daemon went away before the weights of p were staged"),
        "{}",
        o.stderr
    );
    assert_eq!(
        o.code,
        Some(69),
        "Gone, as astraeusctl(1) says: {}",
        o.stderr
    );
}

/// A staging refused over a file's name quotes the name, and the source
/// directory may be another user's: a newline in it must not forge a line
/// in the journal, in the WeightsStaged signal or in astraeusctl's output.
#[test]
fn a_refused_names_control_characters_reach_no_line() {
    let dir = open_tempdir();
    let bus = Bus::session();
    let d = on_test_driver(&bus, dir.path(), "");
    let a = &bus.address;
    weights_template(a, dir.path(), "r");
    let source = dir.path().join("model");
    std::fs::create_dir_all(&source).unwrap();
    let fifo = source.join("x\nworker y placed: 0 \u{1b}[2J");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let o = ctl(
        a,
        None,
        &["template", "stage", "r", source.to_str().unwrap()],
    );
    assert!(!o.ok, "{}", o.stdout);
    assert!(
        o.stderr.contains("x?worker y placed: 0 ?[2J"),
        "{}",
        o.stderr
    );
    assert!(
        !o.stderr.contains('\u{1b}') && o.stderr.lines().count() == 1,
        "{}",
        o.stderr
    );
    eventually("logged", || {
        d.log_text().contains("staging the weights of r failed")
    });
    assert!(
        d.log_text()
            .lines()
            .all(|l| !l.starts_with("worker y placed")),
        "{}",
        d.log_text()
    );
}

/// The guest is the slice user's own code: one writing its GPU channel as
/// fast as it can is read at a bounded rate. Each line was a command for
/// the loop (about 60,000 in this test's two seconds without the gate: the
/// loop's queue and CPU were the guest's). Calls are answered meanwhile,
/// and the slice's figures are the rows it wrote.
#[test]
fn a_guest_flooding_its_gpu_channel_holds_no_caller() {
    use std::io::Write;
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = open_tempdir();
    let bus = Bus::session();
    // Each row that reaches the loop, as its debug line.
    let d = start_reading_guest_rows(&bus, dir.path());
    let a = &bus.address;
    let (socket, channel) = gpu_channel(dir.path());
    let spec = probed_template("f", serde_json::json!({ "agent": true }), &channel);
    let o = manager(a, None, "CreateTemplate", &["s", &spec]);
    assert!(o.ok, "{}", o.stderr);
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let flooding = std::sync::Arc::new(AtomicBool::new(true));
    let still = flooding.clone();
    // Not joined: its writes wait while the daemon's reader pauses.
    std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let rows = "0, 50, 1000, 100\n".repeat(4096);
        let endless = "9".repeat(1 << 16);
        while still.load(Ordering::Relaxed) {
            if s.write_all(rows.as_bytes()).is_err() || s.write_all(endless.as_bytes()).is_err() {
                break;
            }
            let _ = s.write_all(b"\n");
        }
    });
    let began = std::time::Instant::now();
    assert!(manager(a, None, "Resume", &["sb", "f", "false"]).ok);
    eventually("f running", || template_state(a, "f") == "running");
    std::thread::sleep(std::time::Duration::from_secs(1));
    for i in 0..20 {
        let o = manager_spec_within(
            a,
            None,
            5,
            "SubmitWorker",
            &shared_spec(&format!("w{i}"), "0.1"),
        );
        assert!(o.ok, "a call during the flood: {}", o.stderr);
    }
    flooding.store(false, Ordering::Relaxed);
    assert!(manager(a, None, "PowerOff", &["sb", "f", "true"]).ok);
    eventually("off", || template_state(a, "f") == "off");
    // Its one GPU's rows reached the loop at most twice a second (the guest
    // wrote hundreds of thousands).
    let reached = d.log_text().matches("guest GPU reading of f at").count();
    let most = 2 * began.elapsed().as_secs() as usize + 2;
    assert!(
        (1..=most).contains(&reached),
        "{reached} rows reached the loop, at most {most}"
    );
    let rows = report_rows(a, "f");
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["gpu_avg_pct"], 50.0, "{}", rows[0]);
    assert_eq!(rows[0]["gpu_peak_pct"], 50.0, "{}", rows[0]);
}

/// A site's command between two tenants' slices (`[slicing]
/// between_slices`): run after the outgoing VM stopped and before the next
/// one starts (also once before the first slice after a start); a failure
/// keeps the baseboard held, says why, and is tried again; a run past its
/// deadline is killed and counts as failed. Its runs are counted by the
/// command itself, with the time, against the ledger's handoff steps.
#[test]
fn the_command_between_slices_runs_before_the_next_vm_and_a_failure_keeps_it_waiting() {
    let dir = open_tempdir();
    let d = dir.path();
    let script = d.join("between.sh");
    std::fs::write(
        &script,
        format!(
            "echo \"$(date +%s%3N)\" >> {d}/runs\n\
             [ ! -e {d}/hang ] || sleep 30\n\
             [ ! -e {d}/fail ] || {{ echo 'GPU reset refused' >&2; exit 3; }}\n",
            d = d.display()
        ),
    )
    .unwrap();
    let bus = Bus::session();
    let config = format!(
        "[schedule]\nhandoff_buffer_seconds = 0\n[runtime]\nlibvirt_uri = \"test:///default\"\n\
         stop_timeout_seconds = 2\n[slicing]\nallow_no_baseboard = true\n\
         between_slices = [\"/bin/sh\", \"{}\"]\nbetween_slices_timeout_seconds = 2\n",
        script.display()
    );
    let daemon = start_majin(
        &bus,
        d,
        &config,
        &[("ASTRAEUS_BETWEEN_SLICES_RETRY_MS", "1000")],
    );
    let a = &bus.address;
    define_template(a, "a");
    define_template(a, "b");
    let runs = || -> Vec<i64> {
        std::fs::read_to_string(d.join("runs"))
            .unwrap_or_default()
            .lines()
            .map(|l| l.trim().parse().unwrap())
            .collect()
    };
    let started_at = |to: &str| -> Vec<i64> {
        let c = rusqlite::Connection::open(daemon.state.join("ledger.db")).unwrap();
        let mut stmt = c
            .prepare("SELECT at_ms FROM handoff_steps WHERE step = 'start-issued' AND to_template = ?1 ORDER BY id")
            .unwrap();
        stmt.query_map([to], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    // The first slice after a start: the command runs first.
    assert!(manager(a, None, "Resume", &["sb", "a", "false"]).ok);
    eventually("a running", || template_state(a, "a") == "running");
    assert_eq!(runs().len(), 1, "{:?}", runs());
    assert!(runs()[0] <= started_at("a")[0]);

    // A handoff whose command fails: a stops, b waits, the journal says why.
    std::fs::write(d.join("fail"), "").unwrap();
    assert!(manager(a, None, "Resume", &["sb", "b", "true"]).ok);
    eventually("the failure said", || {
        daemon
            .log_text()
            .contains("failed with status 3: GPU reset refused; the baseboard stays held")
    });
    eventually("tried again", || runs().len() >= 3);
    assert_eq!(template_state(a, "a"), "off");
    assert_ne!(template_state(a, "b"), "running");
    assert!(
        started_at("b").is_empty(),
        "b started while the command failed"
    );
    // It succeeds: b starts, after it.
    std::fs::remove_file(d.join("fail")).unwrap();
    eventually("b running", || template_state(a, "b") == "running");
    let last_run = *runs().last().unwrap();
    assert!(
        last_run <= started_at("b")[0],
        "{:?} {:?}",
        runs(),
        started_at("b")
    );

    // One that hangs is killed at its deadline, and counts as failed.
    std::fs::write(d.join("hang"), "").unwrap();
    assert!(manager(a, None, "Resume", &["sb", "a", "true"]).ok);
    eventually("the deadline said", || {
        daemon
            .log_text()
            .contains("did not finish within 2 s and was killed")
    });
    assert_eq!(
        started_at("a").len(),
        1,
        "a started again while the command hung"
    );
    std::fs::remove_file(d.join("hang")).unwrap();
    eventually("a running again", || template_state(a, "a") == "running");
    assert_eq!(started_at("a").len(), 2);
}

/// Seed 003's table puts OS disks on networked storage (shared between
/// hosts) and weights on local storage: a template whose OS disk is on
/// local storage is taken, and the ledger's events and the journal say so
/// (#66: nothing said where it lives).
#[test]
fn an_os_disk_on_local_storage_is_said() {
    let dir = open_tempdir();
    let bus = Bus::session();
    let d = on_test_driver(&bus, dir.path(), "");
    let a = &bus.address;
    let os = dir.path().join("os.img");
    std::fs::write(&os, b"").unwrap();
    let xml = format!(
        "<domain type='test'><name>tmpl-local</name><memory>65536</memory><os><type>hvm</type></os>\
         <devices><disk type='file' device='disk'><source file='{}'/><target dev='vda'/></disk>\
         </devices></domain>",
        os.display()
    );
    let spec = serde_json::json!({
        "name": "local", "workload": {"model": "m", "runtime": "r"},
        "user": {"kind": "internal", "name": "staff"}, "vm": {"domain_xml": xml},
        "baseboard": [], "os_disk": os.to_str().unwrap(),
    });
    let o = manager(a, None, "CreateTemplate", &["s", &spec.to_string()]);
    assert!(o.ok, "{}", o.stderr);
    let db = rusqlite::Connection::open(d.state.join("ledger.db")).unwrap();
    let note: String = db
        .query_row(
            "SELECT detail FROM events WHERE kind = 'template-note'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(
        note.starts_with(&format!(
            "template local: its os_disk {} is on local storage (",
            os.display()
        )) && note.contains("starts on this host only"),
        "{note}"
    );
    assert!(d.log_text().contains(&note), "{}", d.log_text());
}
