//! Retention at the daemon, as a person configures it (docs/operations.md,
//! `[history] keep_days`; docs/reliability.md): applied at start and again
//! at once when a reload changes `[history]`; what ended longer ago leaves
//! the ledger — ended workers and their events, handoff steps, measured
//! intervals — more than one batch of them here (batches of at most 500
//! rows); what is recent stays, and the last handoff step (a restart
//! resumes from it) whatever its age; `astraeusctl history` shows what is
//! kept. Judged by counting the ledger's rows with SQLite itself.

mod common;
use common::*;
use std::path::Path;

const DAY_MS: i64 = 86_400_000;

/// A ledger with `n` workers ended 500 days ago (each with an event), a
/// handoff step and a measured interval each as old, and one of each
/// ended 100 days and 10 days ago.
fn seed(state: &Path, n: usize, now_ms: i64) {
    std::fs::create_dir_all(state).unwrap();
    drop(astraeusd::store::Store::open(&state.join("ledger.db")).unwrap());
    let mut db = rusqlite::Connection::open(state.join("ledger.db")).unwrap();
    let tx = db.transaction().unwrap();
    // Each a millisecond apart: one GPU's intervals start at distinct times.
    let ended = |name: &str, days_ago: i64, nth: i64| {
        let at = now_ms - days_ago * DAY_MS - nth;
        let spec = format!(
            r#"{{"name":"{name}","requested_resources":{{"gpu_requests":{{"shared":true,"memory_gb":1}}}}}}"#
        );
        tx.execute(
            "INSERT INTO workers (name, spec, owner_uid, state, submitted_ms, started_ms, ended_ms) \
             VALUES (?1, ?2, 0, 'stopped', ?3, ?3, ?4)",
            rusqlite::params![name, spec, at - 1000, at],
        )
        .unwrap();
        let id = tx.last_insert_rowid();
        tx.execute(
            "INSERT INTO events (at_ms, worker_id, kind, detail) VALUES (?1, ?2, 'ended', 'exited with status 0')",
            rusqlite::params![at, id],
        )
        .unwrap();
        tx.execute(
            "INSERT INTO handoff_steps (at_ms, step, from_template, to_template) VALUES (?1, 'stopped', 'a', NULL)",
            rusqlite::params![at],
        )
        .unwrap();
        tx.execute(
            "INSERT INTO gpu_intervals (gpu_uuid, from_ms, to_ms, energy_mj, samples) VALUES ('GPU-old', ?1, ?2, 1000, 1)",
            rusqlite::params![at - 1000, at],
        )
        .unwrap();
    };
    for i in 0..n {
        ended(&format!("old{i}"), 500, i as i64);
    }
    ended("middle", 100, 0);
    ended("recent", 10, 0);
    tx.commit().unwrap();
}

/// Rows of each kind in the ledger now: (workers, events, steps, intervals).
fn counts(state: &Path) -> (i64, i64, i64, i64) {
    let db = rusqlite::Connection::open(state.join("ledger.db")).unwrap();
    let n = |sql: &str| db.query_row(sql, [], |r| r.get::<_, i64>(0)).unwrap();
    (
        n("SELECT count(*) FROM workers WHERE ended_ms IS NOT NULL"),
        n("SELECT count(*) FROM events WHERE kind = 'ended'"),
        n("SELECT count(*) FROM handoff_steps"),
        n("SELECT count(*) FROM gpu_intervals WHERE gpu_uuid = 'GPU-old'"),
    )
}

#[test]
fn keep_days_is_applied_at_start_and_at_once_on_a_reload() {
    const OLD: usize = 700;
    let dir = open_tempdir();
    let state = dir.path().join("state");
    let now = astraeusd::time::EpochMs::now().as_i64();
    seed(&state, OLD, now);
    let all = OLD as i64 + 2;
    assert_eq!(counts(&state), (all, all, all, all), "seeded");
    let config = |days: u32| format!("[history]\nkeep_days = {days}\n");
    std::fs::write(dir.path().join("node.toml"), config(365)).unwrap();
    std::fs::write(dir.path().join("majin.toml"), MAJIN_TOML).unwrap();
    let bus = Bus::session();
    let d = Daemon::start(&bus, dir.path(), &dir.path().join("majin.toml"), &[]);
    let a = &bus.address;
    // At start: what ended 500 days ago goes, more than a batch of each.
    eventually("the old rows gone", || counts(&state).0 == 2);
    eventually("their events, steps and intervals too", || {
        counts(&state) == (2, 2, 2, 2)
    });
    let history = ctl(a, None, &["history"]).stdout;
    assert!(
        history.contains("recent") && history.contains("middle") && !history.contains("old1"),
        "{history}"
    );
    // A reload that keeps 30 days: at once, not at the next hourly pass.
    std::fs::write(dir.path().join("node.toml"), config(30)).unwrap();
    d.signal(libc::SIGHUP);
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while counts(&state) != (1, 1, 1, 1) && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(
        counts(&state),
        (1, 1, 1, 1),
        "after the reload: {}",
        d.log_text()
    );
    let history = ctl(a, None, &["history"]).stdout;
    assert!(
        history.contains("recent") && !history.contains("middle"),
        "{history}"
    );
    // The last handoff step stays whatever its age (a restart resumes
    // from it): with 1 day kept, the 10-day-old worker goes, its step not.
    std::fs::write(dir.path().join("node.toml"), config(1)).unwrap();
    d.signal(libc::SIGHUP);
    eventually("the 10-day-old worker gone", || counts(&state).0 == 0);
    assert_eq!(counts(&state).2, 1, "the last handoff step is kept");
}
