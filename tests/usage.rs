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
    let before = report(&path, GroupBy::Worker);
    // Reopen (as a restarted daemon would): the same report.
    let again = report(&path, GroupBy::Worker);
    assert_eq!(before, again);
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
    let o = ctl(
        a,
        None,
        &[
            "usage",
            "--since",
            &since.to_string(),
            "--until",
            &until.to_string(),
            "--by",
            "gpu",
            "--csv",
        ],
    );
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
    for kind in ["worker", "outside", "idle", "downtime"] {
        assert!(kinds.contains(&kind), "{kind} missing: {}", o.stdout);
    }
    let energy: u64 = rows.iter().map(|r| r[4].parse::<u64>().unwrap()).sum();
    assert!(energy > 0, "60 W were drawn: {}", o.stdout);

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
}
