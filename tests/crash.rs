//! Crash test for the ledger: a child process runs a seeded random burst of
//! submits and stops and is SIGKILLed at random points — at named failpoints
//! between the steps of a placement, and at random times. After each kill the
//! ledger is reopened and checked against what the child acknowledged.
//!
//! Replay a failure with CRASH_SEED=<printed seed>; CRASH_RUNS sets the count.

#[path = "common/ledger_check.rs"]
mod ledger_check;

use astraeusd::inventory::sim;
use astraeusd::node::Node;
use astraeusd::store::Store;
use ledger_check::{check, count_from_env, seed_from_env, spec, Rng, MACHINE};
use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

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

/// Appends one line with one write: `writeln!` writes a line in pieces, and
/// a kill between them tore it and glued the next run's first line onto it,
/// hiding that line's intent from the check.
fn note(log: &mut std::fs::File, line: &str) {
    log.write_all(format!("{line}\n").as_bytes()).unwrap();
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
            note(&mut log, &format!("begin stop {name}"));
            node.stop(name, 0).unwrap();
            note(&mut log, &format!("ack stop {name}"));
        } else {
            let name = format!("r{run}-{i}");
            let text = spec(&mut rng, &name);
            note(&mut log, &format!("begin submit {name}"));
            node.submit(&text, 1000).unwrap();
            note(&mut log, &format!("ack submit {name}"));
        }
    }
}

#[test]
fn killed_at_any_point_the_ledger_keeps_every_acknowledged_operation() {
    let (seed, runs) = (
        seed_from_env("CRASH_SEED"),
        count_from_env("CRASH_RUNS", 40),
    );
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
        check(&db, &[log], seed);
    }
    eprintln!("crash test: {killed} of {runs} runs were killed mid-burst");
    assert!(killed > 0, "no run was killed: the test exercised nothing");
}
