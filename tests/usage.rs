//! The usage report from the ledger, on a simulated clock: two sharers of
//! different sizes on an 8 GB GPU, one a launched workload (billed while the
//! daemon is down) and one a reservation (not billed then; that time is
//! downtime), the reservation stopping midway, a daemon restart in between,
//! outside use changing. Every figure is checked exactly: time to the ms,
//! energy to the millijoule, and the GPU's rows add up to the wall clock.

use astraeusd::node::Node;
use astraeusd::placement::{Gpu, Grant, Machine};
use astraeusd::quantity::{Amount, GB_BYTES};
use astraeusd::report::{GroupBy, Row, RowKind};
use astraeusd::store::Store;
use astraeusd::time::EpochMs;
use astraeusd::usage::Interval;

const UUID: &str = "GPU-aaaa";
const MIN: i64 = 60_000;

fn machine() -> Machine {
    Machine {
        name: "majin".into(),
        wsl: false,
        cpu_cores: Amount::whole(16),
        memory_bytes: 64 * GB_BYTES,
        gpus: vec![Gpu {
            index: 0,
            uuid: UUID.into(),
            total: Amount::whole(8),
            healthy: true,
            ..Gpu::default()
        }],
        driver: String::new(),
    }
}

fn interval(from_min: i64, to_min: i64, joules: u64, outside_gb: u64) -> Interval {
    Interval {
        gpu_uuid: UUID.into(),
        from_ms: from_min * MIN,
        to_ms: to_min * MIN,
        energy_mj: joules * 1000,
        utilization_pct: Some(50),
        samples: 10,
        outside_bytes: outside_gb * GB_BYTES,
        total_bytes: 8 * GB_BYTES,
    }
}

fn grant(gb: u64) -> Vec<Grant> {
    vec![Grant {
        gpu_uuid: UUID.into(),
        gpu_index: 0,
        share: Some(Amount::whole(gb)),
    }]
}

/// Builds the hour's ledger and returns the path of its file.
fn ledger(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("ledger.db");
    let mut s = Store::open(&path).unwrap();
    // Run 1: minutes 0 to 30.
    let run1 = s.begin_run(EpochMs(0)).unwrap();
    let container = r#"{"name":"listen","requested_resources":{"gpu_requests":{"shared":true,"memory_gb":2}},"run":{"unit":{"exec":["/bin/true"]}}}"#;
    let reservation =
        r#"{"name":"voice","requested_resources":{"gpu_requests":{"shared":true,"memory_gb":4}}}"#;
    s.insert_worker("listen", container, 1000, &[], Some(&grant(2)), EpochMs(0))
        .unwrap();
    let voice = s
        .insert_worker("voice", reservation, 0, &[], Some(&grant(4)), EpochMs(0))
        .unwrap();
    s.insert_intervals(
        &[interval(0, 10, 600, 1)],
        Some(run1),
        EpochMs::from_i64(10 * MIN),
    )
    .unwrap();
    s.insert_intervals(
        &[interval(10, 20, 600, 2)],
        Some(run1),
        EpochMs::from_i64(20 * MIN),
    )
    .unwrap();
    s.insert_intervals(
        &[interval(20, 30, 600, 2)],
        Some(run1),
        EpochMs::from_i64(30 * MIN),
    )
    .unwrap();
    // Down from 30 to 40 (killed: no clean stop). Run 2: from 40.
    drop(s);
    let mut s = Store::open(&path).unwrap();
    let run2 = s.begin_run(EpochMs::from_i64(40 * MIN)).unwrap();
    s.insert_intervals(
        &[interval(40, 50, 1200, 2)],
        Some(run2),
        EpochMs::from_i64(50 * MIN),
    )
    .unwrap();
    s.stop_worker(voice, EpochMs::from_i64(50 * MIN)).unwrap();
    s.insert_intervals(
        &[interval(50, 60, 601, 2)],
        Some(run2),
        EpochMs::from_i64(60 * MIN),
    )
    .unwrap();
    path
}

fn report(path: &std::path::Path, by: GroupBy) -> Vec<Row> {
    let node = Node::open(Store::open(path).unwrap(), machine()).unwrap();
    node.usage_report(0, 60 * MIN, by, 60 * MIN, &[], |uid| match uid {
        0 => "root".into(),
        n => format!("uid{n}"),
    })
    .unwrap()
}

fn find<'a>(rows: &'a [Row], kind: RowKind, key: &str) -> &'a Row {
    rows.iter()
        .find(|r| r.kind == kind && r.key == key)
        .unwrap_or_else(|| panic!("no {kind:?} row {key} in {rows:#?}"))
}

#[test]
fn shares_downtime_outside_and_idle_add_up_to_the_hour_and_its_energy() {
    let dir = tempfile::tempdir().unwrap();
    let path = ledger(dir.path());
    let rows = report(&path, GroupBy::Worker);
    // listen: 2 of 8 GB for the whole hour, the downtime included (it ran on).
    let listen = find(&rows, RowKind::Worker, "listen");
    assert_eq!(
        (listen.gpu_ms, listen.energy_mj),
        (15 * MIN as u64, 900_250)
    );
    // voice: 4 of 8 GB while the daemon was up and it held them: 0–30 and 40–50.
    let voice = find(&rows, RowKind::Worker, "voice");
    assert_eq!(
        (voice.gpu_ms, voice.energy_mj),
        (20 * MIN as u64, 1_500_000)
    );
    // Downtime: 10 minutes of the 6 GB listen did not hold; nothing measured.
    let down = find(&rows, RowKind::Downtime, "downtime");
    assert_eq!((down.gpu_ms, down.energy_mj), (450_000, 0));
    // Outside: 1 GB for 10 minutes, then 2 GB for 40 minutes of up-time.
    let outside = find(&rows, RowKind::Outside, "outside");
    assert_eq!((outside.gpu_ms, outside.energy_mj), (675_000, 825_250));
    // Idle: 1 GB for the first 10 minutes, 4 GB for the last 10.
    let idle = find(&rows, RowKind::Idle, "idle");
    assert_eq!((idle.gpu_ms, idle.energy_mj), (375_000, 375_500));
    assert_eq!(rows.len(), 5, "{rows:#?}");
    assert_eq!(rows.iter().map(|r| r.gpu_ms).sum::<u64>(), 60 * MIN as u64);
    assert_eq!(rows.iter().map(|r| r.energy_mj).sum::<u64>(), 3_601_000);
    // Half busy throughout: busy time is half of each sharer's measured time.
    assert_eq!(listen.busy_gpu_ms, Some(50 * MIN as u64 / 4 / 2));

    // By owner: the same figures under the owners' names.
    let by_owner = report(&path, GroupBy::Owner);
    assert_eq!(
        find(&by_owner, RowKind::Worker, "uid1000").gpu_ms,
        listen.gpu_ms
    );
    assert_eq!(
        find(&by_owner, RowKind::Worker, "root").energy_mj,
        voice.energy_mj
    );
    // By GPU: one row per kind for the GPU, still adding up to the hour.
    let by_gpu = report(&path, GroupBy::Gpu);
    assert!(by_gpu.iter().all(|r| r.gpu_uuid == UUID));
    assert_eq!(
        by_gpu.iter().map(|r| r.gpu_ms).sum::<u64>(),
        60 * MIN as u64
    );
}

#[test]
fn a_restart_loses_nothing_the_report_is_computed_from_the_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let path = ledger(dir.path());
    // Opened once and closed (its schema checked and migrated, as a daemon
    // starting on it would), then reported from a fresh open: the figures
    // worked out by hand above, nothing lost or changed by the reopening.
    drop(report(&path, GroupBy::Worker));
    let again = report(&path, GroupBy::Worker);
    let listen = find(&again, RowKind::Worker, "listen");
    assert_eq!(
        (listen.gpu_ms, listen.energy_mj),
        (15 * MIN as u64, 900_250)
    );
    let voice = find(&again, RowKind::Worker, "voice");
    assert_eq!(
        (voice.gpu_ms, voice.energy_mj),
        (20 * MIN as u64, 1_500_000)
    );
}

// ---- over the bus ----

mod common;
use common::*;

/// The daemon on majin drawing 60 W, read every 0.2 s, its usage closed
/// into the ledger every `interval` seconds.
fn metered_majin(bus: &Bus, dir: &std::path::Path, interval: u32) -> Daemon {
    std::fs::write(
        dir.join("node.toml"),
        format!("[inventory]\nrefresh_seconds = 0.2\n[usage]\ninterval_seconds = {interval}\n"),
    )
    .unwrap();
    std::fs::write(
        dir.join("majin.toml"),
        MAJIN_TOML.replace("outside_gb = 1", "outside_gb = 1\npower_w = 60"),
    )
    .unwrap();
    Daemon::start(bus, dir, &dir.join("majin.toml"), &[])
}

/// `astraeusctl usage --by gpu --csv` over [since, until) (epoch seconds).
fn usage_by_gpu_csv(a: &str, since: u64, until: u64) -> Out {
    let (since, until) = (format!("@{since}"), format!("@{until}"));
    ctl(
        a,
        None,
        &[
            "usage", "--since", &since, "--until", &until, "--by", "gpu", "--csv",
        ],
    )
}

#[test]
fn usage_report_over_the_bus_adds_up_and_astraeusctl_prints_it() {
    let dir = open_tempdir();
    let bus = Bus::session();
    let _d = metered_majin(&bus, dir.path(), 1);
    let a = &bus.address;
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        - 5;
    assert!(manager(a, None, "SubmitWorker", &["s", &shared_spec("listen", "2")]).ok);
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let until = since + 10;
    let o = usage_by_gpu_csv(a, since, until);
    assert!(o.ok, "{}", o.stderr);
    let mut lines = o.stdout.lines();
    assert_eq!(
        lines.next(),
        Some("gpu,kind,gpu,gpu_ms,energy_mj,busy_gpu_ms")
    );
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    let total: u64 = rows.iter().map(|r| r[3].parse::<u64>().unwrap()).sum();
    assert_eq!(total, 10_000, "{}", o.stdout);
    let kinds: Vec<&str> = rows.iter().map(|r| r[1]).collect();
    // The 5 s before the ledger's first start are not downtime (#50), the
    // seconds after now are.
    for kind in ["worker", "outside", "idle", "downtime", "unrecorded"] {
        assert!(kinds.contains(&kind), "{kind} missing: {}", o.stdout);
    }
    // The sim GPU draws a steady 60 W while the daemon watches it, so the
    // energy is 60 mJ for each ms not in `downtime` (nor `unrecorded`,
    // before the ledger's first start): worked out here from the report's
    // own times, not from how the daemon integrates power.
    let energy: u64 = rows.iter().map(|r| r[4].parse::<u64>().unwrap()).sum();
    let up_ms: u64 = rows
        .iter()
        .filter(|r| r[1] != "downtime" && r[1] != "unrecorded")
        .map(|r| r[3].parse::<u64>().unwrap())
        .sum();
    // Each stretch between two readings (one per 0.2 s refresh) is kept in
    // whole ms, so each may be up to 1 ms (60 mJ) short.
    let stretches = up_ms / 200 + rows.len() as u64 + 1;
    assert!(
        energy.abs_diff(60 * up_ms) <= 60 * stretches,
        "60 W for {up_ms} ms is {} mJ, not {energy}: {}",
        60 * up_ms,
        o.stdout
    );

    // The table and JSON forms; a bad grouping names its field.
    let o = ctl(a, None, &["usage", "--by", "worker"]);
    assert!(
        o.ok && o.stdout.starts_with("WORKER") && o.stdout.contains("listen"),
        "{}",
        o.stdout
    );
    let o = manager(a, None, "UsageReport", &["xxs", "0", "3600", "team"]);
    assert!(
        o.stderr.contains("group_by: one of worker|owner|gpu|user"),
        "{}",
        o.stderr
    );
    let o = manager(a, None, "UsageReport", &["xxs", "3600", "0", "gpu"]);
    assert!(o.stderr.contains("to:"), "{}", o.stderr);
}

/// A report reaching into the live daemon's run counts it as up and
/// measured until now: no downtime, and the energy of 60 W over the window
/// (the readings not yet closed into a ledger interval included).
#[test]
fn a_live_report_bills_no_downtime_and_all_the_energy() {
    let dir = open_tempdir();
    let bus = Bus::session();
    let _d = metered_majin(&bus, dir.path(), 3);
    let a = &bus.address;
    let secs = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    };
    // Whole seconds after the daemon's first readings…
    std::thread::sleep(std::time::Duration::from_millis(1200));
    let since = secs() + 1;
    // …to a moment inside an interval that has not closed yet.
    while secs() < since + 7 {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let until = secs();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let o = manager(
        a,
        None,
        "UsageReport",
        &["xxs", &since.to_string(), &until.to_string(), "gpu"],
    );
    assert!(o.ok, "{}", o.stderr);
    // a(sssttx) N "key" "kind" "uuid" ms mJ busy …
    let fields: Vec<&str> = o.stdout.split_whitespace().collect();
    let rows: Vec<&[&str]> = fields[2..].chunks(6).collect();
    let window_ms = (until - since) * 1000;
    let ms: u64 = rows.iter().map(|r| r[3].parse::<u64>().unwrap()).sum();
    assert_eq!(ms, window_ms, "{}", o.stdout);
    assert!(!o.stdout.contains("\"downtime\""), "{}", o.stdout);
    let energy: u64 = rows.iter().map(|r| r[4].parse::<u64>().unwrap()).sum();
    let want = 60 * window_ms; // 60 W × ms = mJ
    let off = energy.abs_diff(want) as f64 / want as f64;
    assert!(
        off < 0.01,
        "energy {energy} mJ against {want} mJ: {}",
        o.stdout
    );

    // UsageReportMs says the same of the same window, and takes its edges
    // to the millisecond: half a second later, half a second less.
    let (since_ms, until_ms) = ((since * 1000).to_string(), (until * 1000).to_string());
    let in_ms = manager(
        a,
        None,
        "UsageReportMs",
        &["xxs", &since_ms, &until_ms, "gpu"],
    );
    assert_eq!(in_ms.stdout, o.stdout);
    let later = (since * 1000 + 500).to_string();
    let half = manager(a, None, "UsageReportMs", &["xxs", &later, &until_ms, "gpu"]);
    assert!(half.ok, "{}", half.stderr);
    let fields: Vec<&str> = half.stdout.split_whitespace().collect();
    let ms: u64 = (fields[2..].chunks(6))
        .map(|r| r[3].parse::<u64>().unwrap())
        .sum();
    assert_eq!(ms, window_ms - 500, "{}", half.stdout);
}

/// /metrics as Prometheus reads it (python3-prometheus-client's parser):
/// each family's type, and its samples as (name, labels, value).
fn scrape(port: u16) -> serde_json::Value {
    let (status, _, body) = get(port, "/metrics");
    assert_eq!(status, 200);
    let parse = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
out = {}
for f in text_string_to_metric_families(sys.stdin.read()):
    out[f.name] = {"type": f.type, "samples": [[s.name, s.labels, s.value] for s in f.samples]}
print(json.dumps(out))
"#;
    let mut child = std::process::Command::new("/usr/bin/python3")
        .args(["-c", parse])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 with prometheus_client (python3-prometheus-client)");
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), body.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the exposition does not parse:\n{body}"
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// One value of a family's samples whose labels include `want`.
fn sample(m: &serde_json::Value, family: &str, want: &[(&str, &str)]) -> Option<f64> {
    m[family]["samples"].as_array()?.iter().find_map(|s| {
        let labels = &s[1];
        want.iter()
            .all(|(k, v)| labels[*k] == *v)
            .then(|| s[2].as_f64().unwrap())
    })
}

/// One value the ledger holds, read with the sqlite3 tool (not the daemon).
fn ledger_value<T: std::str::FromStr>(dir: &std::path::Path, sql: &str) -> T {
    let o = std::process::Command::new("sqlite3")
        .arg(dir.join("ledger.db"))
        .arg(sql)
        .output()
        .unwrap();
    String::from_utf8(o.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{sql}: {}", String::from_utf8_lossy(&o.stderr)))
}

fn ledger_i64(dir: &std::path::Path, sql: &str) -> i64 {
    ledger_value(dir, sql)
}

/// The metrics' counters are Prometheus counters that add up: per GPU the
/// kinds make the time counted since the first run, a sharer's GPU-seconds
/// are its share of the memory times the time it held it (from the
/// ledger), its energy the same share of the 60 W drawn; they survive a
/// restart and never go back.
#[test]
fn metrics_count_gpu_time_and_energy_across_restarts() {
    let dir = open_tempdir();
    let bus = Bus::session();
    let port = free_port();
    let start = || {
        std::fs::write(
            dir.path().join("node.toml"),
            format!(
                "[inventory]\nrefresh_seconds = 0.2\n[usage]\ninterval_seconds = 1\n\
                 [http]\nlisten = \"{port}\"\n"
            ),
        )
        .unwrap();
        std::fs::write(
            dir.path().join("majin.toml"),
            MAJIN_TOML.replace("outside_gb = 1", "outside_gb = 1\npower_w = 60"),
        )
        .unwrap();
        Daemon::start(&bus, dir.path(), &dir.path().join("majin.toml"), &[])
    };
    let d = start();
    let state = d.state.clone();
    let until = |m: &serde_json::Value| {
        sample(m, "astraeus_usage_counted_until_timestamp_seconds", &[]).unwrap()
    };
    // A first window counted before the worker comes: all of its hold is measured.
    eventually("a first count", || until(&scrape(port)) > 0.0);
    // Which build answers: its version, and its commit or "unknown".
    let m = scrape(port);
    assert_eq!(m["astraeus_build_info"]["type"], "gauge");
    let build = &m["astraeus_build_info"]["samples"][0];
    assert_eq!(build[1]["version"], env!("CARGO_PKG_VERSION"), "{build}");
    assert!(
        build[1]["commit"].as_str().is_some_and(|c| !c.is_empty()),
        "{build}"
    );
    assert_eq!(build[2], 1.0);
    let a = &bus.address;
    assert!(manager(a, None, "SubmitWorker", &["s", &shared_spec("listen", "2")]).ok);
    let held_from = ledger_i64(
        &state,
        "SELECT h.from_ms FROM holds h JOIN workers w ON w.id = h.worker_id WHERE w.name = 'listen'",
    );
    let mut m = scrape(port);
    eventually("listen counted", || {
        m = scrape(port);
        sample(&m, "astraeus_worker_gpu_seconds", &[("worker", "listen")]).is_some_and(|s| s > 0.5)
    });
    for family in [
        "astraeus_gpu_seconds",
        "astraeus_gpu_energy_joules",
        "astraeus_worker_gpu_seconds",
        "astraeus_worker_energy_joules",
    ] {
        assert_eq!(m[family]["type"], "counter", "{family}");
    }
    assert_eq!(m["astraeus_gpu_over_promised"]["type"], "gauge");
    let first_run = ledger_i64(&state, "SELECT min(started_ms) FROM daemon_runs");
    let check = |m: &serde_json::Value| {
        let until_ms = (until(m) * 1000.0).round() as i64;
        // The ledger's mark is what the gauge says.
        assert_eq!(
            until_ms,
            ledger_i64(&state, "SELECT until_ms FROM usage_counted")
        );
        // Per GPU the kinds add up to the time counted.
        let kinds: f64 = m["astraeus_gpu_seconds"]["samples"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s[1]["gpu"] == "0")
            .map(|s| s[2].as_f64().unwrap())
            .sum();
        let counted = (until_ms - first_run) as f64 / 1000.0;
        assert!((kinds - counted).abs() < 0.01, "{kinds} vs {counted}");
        // listen holds 2 of the 8 GB: a quarter of each second since it was placed.
        let held = (until_ms - held_from) as f64 / 1000.0;
        let secs = sample(m, "astraeus_worker_gpu_seconds", &[("worker", "listen")]).unwrap();
        // (The report rounds each stretch between readings down to the
        // millisecond: a few ms per second at most.)
        assert!(
            (secs - held / 4.0).abs() < 0.01 + 0.02 * held / 4.0,
            "{secs} vs {held} / 4"
        );
        // Its quarter of the energy the ledger's measured intervals hold
        // for the time it held the GPU (each interval prorated by overlap).
        let measured_mj: f64 = ledger_value(
            &state,
            &format!(
                "SELECT sum(energy_mj * 1.0 * (min(to_ms, {until_ms}) - max(from_ms, {held_from})) \
                 / (to_ms - from_ms)) FROM gpu_intervals \
                 WHERE to_ms > {held_from} AND from_ms < {until_ms} AND to_ms > from_ms"
            ),
        );
        let joules = sample(m, "astraeus_worker_energy_joules", &[("worker", "listen")]).unwrap();
        let expected = measured_mj / 1000.0 / 4.0;
        assert!(
            (joules - expected).abs() < 0.01 + 0.02 * expected,
            "{joules} J vs a quarter of {measured_mj} mJ measured"
        );
        (secs, joules, kinds)
    };
    let before = check(&m);
    // A restart: the counters go on from the ledger, never back.
    d.stop();
    let d = start();
    assert_eq!(d.state, state);
    let mut after = scrape(port);
    eventually("counted again after the restart", || {
        after = scrape(port);
        until(&after) * 1000.0 > (before.2 * 1000.0) + first_run as f64 + 1500.0
    });
    let now = check(&after);
    assert!(now.0 > before.0 && now.1 > before.1 && now.2 > before.2);
    // The restart's gap is downtime, counted as such.
    assert!(sample(
        &after,
        "astraeus_gpu_seconds",
        &[("gpu", "0"), ("kind", "downtime")]
    )
    .is_some_and(|s| s > 0.0));
}

/// docs/architecture.md: "a run counts as up until its last usage interval
/// (a kill loses at most `usage.interval_seconds` of up-time to downtime)".
/// A daemon metering every second is SIGKILLed after four seconds up and
/// restarted on the same ledger: the report's downtime is the time it was
/// really down plus at most one interval (and a timer's lateness, 0.5 s
/// allowed). Were the killed run's time not kept, four seconds would be lost.
#[test]
fn a_kill_loses_at_most_one_interval_of_up_time() {
    let now_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
    };
    let dir = open_tempdir();
    let bus = Bus::session();
    let mut first = metered_majin(&bus, dir.path(), 1);
    let a = &bus.address;
    let since = now_ms().div_ceil(1000);
    assert!(manager(a, None, "SubmitWorker", &["s", &shared_spec("listen", "2")]).ok);
    std::thread::sleep(std::time::Duration::from_secs(4));
    let killed_ms = now_ms();
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    std::thread::sleep(std::time::Duration::from_secs(1));
    let _second = Daemon::start(&bus, dir.path(), &dir.path().join("majin.toml"), &[]);
    let restarted_ms = now_ms();
    // The window ends between the kill and the restart's READY, so no time
    // after the report (counted as not up yet) falls in it.
    let until = restarted_ms / 1000;
    let o = usage_by_gpu_csv(a, since, until);
    assert!(o.ok, "{}", o.stderr);
    let downtime: u64 = o
        .stdout
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect::<Vec<_>>())
        .filter(|r| r[1] == "downtime")
        .map(|r| r[3].parse::<u64>().unwrap())
        .sum();
    let down = until * 1000 - killed_ms;
    assert!(downtime > 0, "the kill left no downtime: {}", o.stdout);
    assert!(
        downtime <= down + 1_000 + 500,
        "down {down} ms, yet {downtime} ms of downtime: more than one interval of up-time lost\n{}",
        o.stdout
    );
}

/// A report taken off the loop reads the ledger a moment after the live
/// run's facts were taken: the loop may have closed the open interval into
/// the ledger meanwhile. That stretch counts once, not twice (its energy
/// from the ledger's rows as written, by hand: 600 + 600 + 600 + 1200 + 601 J).
#[test]
fn an_interval_closed_after_the_facts_were_taken_counts_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = ledger(dir.path());
    let store = Store::open(&path).unwrap();
    let current = astraeusd::store::CurrentRun {
        started_ms: 40 * MIN,
        now_ms: 60 * MIN,
        // What the loop still held open when the report was asked for.
        open: vec![interval(50, 60, 601, 2)],
    };
    let gpus = vec![astraeusd::report::GpuFacts {
        uuid: UUID.into(),
        index: 0,
        total_bytes: 8 * GB_BYTES,
    }];
    let rows = store
        .usage_report(0, 60 * MIN, GroupBy::Gpu, Some(current), gpus, |u| {
            u.to_string()
        })
        .unwrap()
        .0;
    let energy: u64 = rows.iter().map(|r| r.energy_mj).sum();
    assert_eq!(energy, 3_601_000, "{rows:#?}");
    let time: u64 = rows.iter().map(|r| r.gpu_ms).sum();
    assert_eq!(time, 60 * MIN as u64, "the GPU's rows add up to the hour");
}

/// Days older than a day are rolled up at the daemon's start (#50): the
/// usage report over them reads the same, to the ms and the mJ, from the
/// rolled-up days as it did from their intervals, in every grouping, and
/// a window with edges inside rolled-up days covers those days whole.
#[test]
fn days_rolled_up_at_start_report_what_their_intervals_did() {
    const DAY: i64 = 86_400_000;
    let dir = open_tempdir();
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let db = state.join("ledger.db");
    drop(astraeusd::store::Store::open(&db).unwrap());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let today = now.div_euclid(DAY) * DAY;
    let start = today - 4 * DAY + 5 * 3_600_000 + 3;
    let uuid = "GPU-5c0a7d3e-4060-4b1e-9f00-000000000000";
    {
        let mut conn = rusqlite::Connection::open(&db).unwrap();
        let tx = conn.transaction().unwrap();
        // Up from `start` until two minutes ago, with an hour of downtime.
        let gap = (today - 2 * DAY - 1_800_000, today - 2 * DAY + 1_800_000);
        for (a, b) in [(start, gap.0), (gap.1, now - 120_000)] {
            tx.execute(
                "INSERT INTO daemon_runs (started_ms, alive_ms) VALUES (?1, ?2)",
                rusqlite::params![a, b],
            )
            .unwrap();
            let (mut t, mut k) = (a, 0i64);
            while t + 60_000 <= b {
                tx.execute(
                    "INSERT INTO gpu_intervals (gpu_uuid, from_ms, to_ms, energy_mj,
                       utilization_pct, samples, outside_bytes, total_bytes)
                     VALUES (?1, ?2, ?3, ?4, ?5, 1, ?6, 8589934592)",
                    rusqlite::params![
                        uuid,
                        t,
                        t + 60_000,
                        3_600_000 + k * 7 % 9973,
                        k % 97,
                        (1i64 << 30) + ((k % 13) << 24)
                    ],
                )
                .unwrap();
                t += 60_000;
                k += 1;
            }
        }
        // Sharers of root and nobody, across midnights, one that launched.
        let workers = [
            (
                "asr",
                0,
                "{}",
                start + 11,
                Some(today - 3 * DAY + 7_777_777),
                150,
            ),
            (
                "tts",
                65534,
                r#"{"run":{}}"#,
                today - 3 * DAY - 5,
                Some(today - DAY + 3),
                225,
            ),
            ("emb", 0, "{}", today - 2 * DAY + 99, None, 99),
        ];
        for (id, (name, uid, spec, from, to, hundredths)) in workers.into_iter().enumerate() {
            tx.execute(
                "INSERT INTO workers (id, name, spec, owner_uid, state, submitted_ms, started_ms, ended_ms)
                 VALUES (?1, ?2, ?3, ?4, 'stopped', ?5, ?5, ?6)",
                rusqlite::params![id as i64 + 1, name, spec, uid, from, to.unwrap_or(now - 130_000)],
            )
            .unwrap();
            tx.execute(
                "INSERT INTO holds (worker_id, gpu_uuid, gpu_index, share_hundredths, from_ms, to_ms)
                 VALUES (?1, ?2, 0, ?3, ?4, ?5)",
                rusqlite::params![id as i64 + 1, uuid, hundredths, from, to.unwrap_or(now - 130_000)],
            )
            .unwrap();
        }
        tx.commit().unwrap();
    }
    let bus = Bus::session();
    let a = &bus.address;
    let secs = |ms: i64| format!("@{}", ms / 1000);
    let usage = |from: i64, to: i64, by: &str| {
        let o = ctl(
            a,
            None,
            &[
                "usage",
                "--since",
                &secs(from),
                "--until",
                &secs(to),
                "--by",
                by,
                "--csv",
            ],
        );
        assert!(o.ok, "{}", o.stderr);
        o.stdout
    };
    let whole = (today - 3 * DAY, today - DAY);
    let inside = (today - 3 * DAY + 5 * 3_600_000, today - DAY - 3 * 3_600_000);
    let groupings = ["worker", "owner", "gpu", "user"];

    // Nothing is counted into the metrics yet, so nothing is rolled up.
    let d = start_majin(
        &bus,
        dir.path(),
        "[inventory]\nrefresh_seconds = 0.2\n",
        &[],
    );
    let from_intervals: Vec<String> = groupings
        .iter()
        .map(|by| usage(whole.0, whole.1, by))
        .collect();
    assert!(from_intervals[0].contains("tts") && from_intervals[0].contains("downtime"));
    assert!(
        from_intervals[1].contains("nobody"),
        "{}",
        from_intervals[1]
    );
    assert_eq!(ledger_i64(&state, "SELECT count(*) FROM usage_days"), 0);
    d.stop();
    let intervals = ledger_i64(&state, "SELECT count(*) FROM gpu_intervals");

    // Counted up to now: the days that ended a day ago roll up at the start.
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute(
            "INSERT OR REPLACE INTO usage_counted (id, until_ms) VALUES (1, ?1)",
            [now],
        )
        .unwrap();
    let d = start_majin(
        &bus,
        dir.path(),
        "[inventory]\nrefresh_seconds = 0.2\n",
        &[],
    );
    eventually("three days rolled up", || {
        ledger_i64(&state, "SELECT count(*) FROM usage_days") == 3
            && d.log_text().contains("GPU-days of usage rolled up")
    });
    let left = ledger_i64(&state, "SELECT count(*) FROM gpu_intervals");
    assert!(left < intervals / 2, "{left} of {intervals} intervals left");
    assert_eq!(
        ledger_i64(
            &state,
            &format!(
                "SELECT count(*) FROM gpu_intervals WHERE to_ms <= {}",
                today - DAY
            )
        ),
        0
    );
    for (by, want) in groupings.iter().zip(&from_intervals) {
        assert_eq!(&usage(whole.0, whole.1, by), want, "by {by}");
        assert_eq!(
            &usage(inside.0, inside.1, by),
            want,
            "by {by}, edges inside"
        );
    }
    // astraeusctl says so when an edge falls inside such a day, not else.
    let note = |from: i64, to: i64| {
        ctl(
            a,
            None,
            &["usage", "--since", &secs(from), "--until", &secs(to)],
        )
        .stderr
    };
    let said = note(inside.0, inside.1);
    assert!(
        said.contains("may start at 00:00 UTC of the day --since falls in")
            && said.contains("may end at the 00:00 UTC after --until"),
        "{said}"
    );
    assert!(!note(whole.0, whole.1).contains("note:"));
}
