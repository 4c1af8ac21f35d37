//! Crash test for the ledger: a child process runs a seeded random burst of
//! submits and stops and is SIGKILLed at random points — at named failpoints
//! between the steps of a placement, and at random times. After each kill the
//! ledger is reopened and checked against what the child acknowledged.
//!
//! Replay a failure with CRASH_SEED=<printed seed>; CRASH_RUNS sets the count.

use astraeusd::inventory::sim;
use astraeusd::node::{Node, Status};
use astraeusd::quantity::Amount;
use astraeusd::store::Store;
use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const MACHINE: &str = r#"
machine = "crash"
cpu_cores = 64
memory_gb = 256
[[gpu]]
model = "RTX 4060"
total_gb = 8
outside_gb = 1
[[gpu]]
model = "L4"
total_gb = 24
[[gpu]]
model = "A10"
total_gb = 12
outside_gb = 0.5
"#;

const FAILPOINTS: &[&str] = &[
    "store.insert.after-worker",
    "store.insert.before-commit",
    "store.insert.after-commit",
    "store.start.after-state",
    "store.start.before-commit",
    "store.start.after-commit",
    "store.stop.after-state",
    "store.stop.before-commit",
    "store.stop.after-commit",
    "store.grant.after-row",
];

/// xorshift64*: a tiny seeded generator, so a failure replays exactly.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn spec(rng: &mut Rng, name: &str) -> String {
    match rng.below(4) {
        0 => {
            format!(r#"{{"name":"{name}","requested_resources":{{"gpu_requests":{{"count":1}}}}}}"#)
        }
        _ => {
            let gb = Amount::from_hundredths(50 + rng.below(600));
            let count = 1 + rng.below(2);
            format!(
                r#"{{"name":"{name}","requested_resources":{{"cpu_cores":1,"gpu_requests":{{"count":{count},"shared":true,"memory_gb":{gb}}}}}}}"#
            )
        }
    }
}

/// The child: runs operations until killed (or done), logging intent and acks.
#[test]
fn crash_child() {
    let Ok(db) = std::env::var("CRASH_CHILD_DB") else {
        return; // only meaningful when the parent starts us
    };
    let seed: u64 = std::env::var("CRASH_CHILD_SEED").unwrap().parse().unwrap();
    let run: u64 = std::env::var("CRASH_CHILD_RUN").unwrap().parse().unwrap();
    let mut log = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(std::env::var("CRASH_CHILD_LOG").unwrap())
        .unwrap();
    let mut rng = Rng(seed | 1);
    let machine = sim::parse(MACHINE).unwrap();
    let mut node = Node::open(Store::open(Path::new(&db)).unwrap(), machine).unwrap();
    for i in 0..200 {
        let live: Vec<String> = node.workers().map(|w| w.name().to_string()).collect();
        if !live.is_empty() && rng.below(3) == 0 {
            let name = &live[rng.below(live.len() as u64) as usize];
            writeln!(log, "begin stop {name}").unwrap();
            node.stop(name, 0).unwrap();
            writeln!(log, "ack stop {name}").unwrap();
        } else {
            let name = format!("r{run}-{i}");
            let text = spec(&mut rng, &name);
            writeln!(log, "begin submit {name}").unwrap();
            node.submit(&text, 1000, None).unwrap();
            writeln!(log, "ack submit {name}").unwrap();
        }
    }
}

/// What the acknowledged log says must be live, and the names whose last
/// operation was cut off by a kill (committed or not: either outcome is allowed).
fn expected(log: &str) -> (HashSet<String>, HashSet<String>) {
    let mut live = HashSet::new();
    let mut uncertain = HashSet::new();
    let mut in_flight: Option<String> = None;
    for line in log.lines() {
        let parts: Vec<&str> = line.split(' ').collect();
        match parts.as_slice() {
            ["begin", _, name] => {
                uncertain.extend(in_flight.replace(name.to_string()));
            }
            ["ack", op, name] => {
                if *op == "submit" {
                    live.insert(name.to_string());
                } else {
                    live.remove(*name);
                }
                uncertain.remove(*name);
                in_flight = None;
            }
            _ => {} // a torn last line
        }
    }
    uncertain.extend(in_flight);
    (live, uncertain)
}

fn check(db: &Path, log: &str, seed: u64) {
    let machine = sim::parse(MACHINE).unwrap();
    let store = Store::open(db).unwrap();
    assert_eq!(
        store.orphan_allocations().unwrap(),
        0,
        "orphan allocation (seed {seed})"
    );
    let rows = store.live_workers().unwrap();
    let mut names = HashSet::new();
    let mut taken: HashMap<String, Amount> = HashMap::new();
    let mut whole: HashSet<String> = HashSet::new();
    for r in &rows {
        assert!(
            names.insert(r.name.clone()),
            "{} is live twice (seed {seed})",
            r.name
        );
        for g in &r.grants {
            match g.share {
                Some(s) => {
                    *taken.entry(g.gpu_uuid.clone()).or_default() =
                        taken.get(&g.gpu_uuid).copied().unwrap_or_default() + s
                }
                None => assert!(
                    whole.insert(g.gpu_uuid.clone()),
                    "GPU held whole twice (seed {seed})"
                ),
            }
        }
    }
    for g in &machine.gpus {
        let t = taken.get(&g.uuid).copied().unwrap_or_default();
        assert!(
            t <= g.offered(),
            "GPU {} has {t} of {} GB promised (seed {seed})",
            g.index,
            g.offered()
        );
        assert!(
            t.is_zero() || !whole.contains(&g.uuid),
            "GPU {} whole and shared (seed {seed})",
            g.index
        );
    }
    let (must_live, uncertain) = expected(log);
    for name in &must_live {
        assert!(
            names.contains(name) || uncertain.contains(name),
            "acknowledged worker {name} was lost (seed {seed})"
        );
    }
    for name in &names {
        assert!(
            must_live.contains(name) || uncertain.contains(name),
            "worker {name} is live but its stop was acknowledged (seed {seed})"
        );
    }
    // Reopening the engine converges: no pending worker that fits now, every
    // pending worker has a reason.
    let node = Node::open(store, machine).unwrap();
    assert!(node.audit().is_empty(), "{:?} (seed {seed})", node.audit());
    let mut node = node;
    let pending: Vec<String> = node
        .workers()
        .filter(|w| matches!(w.status, Status::Pending { .. }))
        .map(|w| w.spec_text.clone())
        .collect();
    for text in pending {
        assert!(
            node.why_not(&text).unwrap().is_err(),
            "a pending worker fits now (seed {seed})"
        );
    }
}

#[test]
fn killed_at_any_point_the_ledger_keeps_every_acknowledged_operation() {
    let seed: u64 = std::env::var("CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    let runs: u64 = std::env::var("CRASH_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);
    eprintln!("crash test seed {seed} ({runs} runs); replay with CRASH_SEED={seed}");
    let mut rng = Rng(seed | 1);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    let log_path = dir.path().join("acks.log");
    let exe = std::env::current_exe().unwrap();
    let mut killed = 0;
    for run in 0..runs {
        let child_seed = rng.next();
        let mut cmd = Command::new(&exe);
        cmd.args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
            .env("CRASH_CHILD_DB", &db)
            .env("CRASH_CHILD_SEED", child_seed.to_string())
            .env("CRASH_CHILD_RUN", run.to_string())
            .env("CRASH_CHILD_LOG", &log_path)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        // Half the runs die at a named failpoint, the others at a random time.
        let timer = if rng.below(2) == 0 {
            let fp = FAILPOINTS[rng.below(FAILPOINTS.len() as u64) as usize];
            cmd.env(
                "ASTRAEUS_FAILPOINTS",
                format!("{fp}=kill@{}", 1 + rng.below(40)),
            );
            None
        } else {
            Some(Duration::from_millis(20 + rng.below(400)))
        };
        let mut child = cmd.spawn().unwrap();
        let started = Instant::now();
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                if !status.success() {
                    killed += 1;
                }
                break;
            }
            if timer.is_some_and(|t| started.elapsed() >= t) {
                child.kill().unwrap(); // SIGKILL
                child.wait().unwrap();
                killed += 1;
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        check(&db, &log, seed);
    }
    eprintln!("crash test: {killed} of {runs} runs were killed mid-burst");
    assert!(killed > 0, "no run was killed: the test exercised nothing");
}
