//! Retention at the daemon, as a person configures it (docs/operations.md,
//! `[history] keep_days`; docs/reliability.md): applied at start and again
//! at once when a reload changes `[history]`; what ended longer ago leaves
//! the ledger — ended workers and their events, handoff steps, measured
//! intervals — more than one batch of them here (batches of at most 500
//! rows); what is recent stays, and the last handoff step (a restart
//! resumes from it) whatever its age; `astraeusctl history` shows what is
//! kept. Judged by counting the ledger's rows with SQLite itself. And the
//! ledger across versions (docs/operations.md, "Upgrades"; docs/
//! reliability.md): one from an older daemon, without incremental vacuum,
//! is rewritten once so that retention can shrink it; one newer than the
//! daemon is refused, and left as it is.

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

/// A ledger made before incremental vacuum (auto_vacuum NONE, as older
/// daemons made them) is rewritten once at the first start, not again.
#[test]
fn an_older_ledger_is_rewritten_once_so_retention_can_shrink_it() {
    let dir = open_tempdir();
    let state = dir.path().join("state");
    seed(&state, 10, astraeusd::time::EpochMs::now().as_i64());
    let db = rusqlite::Connection::open(state.join("ledger.db")).unwrap();
    db.execute_batch("PRAGMA auto_vacuum = NONE; VACUUM;")
        .unwrap();
    let mode = |db: &rusqlite::Connection| -> i64 {
        db.query_row("PRAGMA auto_vacuum", [], |r| r.get(0))
            .unwrap()
    };
    assert_eq!(mode(&db), 0, "an older ledger");
    drop(db);
    std::fs::write(dir.path().join("node.toml"), "").unwrap();
    std::fs::write(dir.path().join("majin.toml"), MAJIN_TOML).unwrap();
    let bus = Bus::session();
    let sim = dir.path().join("majin.toml");
    let d = Daemon::start(&bus, dir.path(), &sim, &[]);
    assert!(
        d.log_text()
            .contains("ledger: rewritten once so that retention can shrink it"),
        "{}",
        d.log_text()
    );
    assert!(d.stop().success());
    let db = rusqlite::Connection::open(state.join("ledger.db")).unwrap();
    assert_eq!(mode(&db), 2, "INCREMENTAL");
    drop(db);
    let d = Daemon::start(&bus, dir.path(), &sim, &[]);
    assert!(!d.log_text().contains("rewritten once"), "{}", d.log_text());
}

/// A ledger whose schema is newer than this daemon knows (a downgrade) is
/// refused at start, saying so, and left as it is: the daemon exits, the
/// schema version is unchanged.
#[test]
fn a_ledger_newer_than_the_daemon_is_refused_and_left_as_it_is() {
    let dir = open_tempdir();
    let state = dir.path().join("state");
    seed(&state, 1, astraeusd::time::EpochMs::now().as_i64());
    let db = rusqlite::Connection::open(state.join("ledger.db")).unwrap();
    db.pragma_update(None, "user_version", 999).unwrap();
    drop(db);
    std::fs::write(dir.path().join("majin.toml"), MAJIN_TOML).unwrap();
    std::fs::write(dir.path().join("node.toml"), "").unwrap();
    let bus = Bus::session();
    let o = std::process::Command::new("timeout")
        .arg("20")
        .arg(env!("CARGO_BIN_EXE_astraeusd"))
        .args(["--bus-address", &bus.address, "--sim"])
        .arg(dir.path().join("majin.toml"))
        .arg("--state-dir")
        .arg(&state)
        .arg("--config")
        .arg(dir.path().join("node.toml"))
        .env_remove("NOTIFY_SOCKET")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && o.status.code() != Some(124),
        "it must exit, refusing: {:?} {said}",
        o.status
    );
    assert!(
        said.contains("ledger schema version 999 is newer than this daemon knows"),
        "{said}"
    );
    let db = rusqlite::Connection::open(state.join("ledger.db")).unwrap();
    let v: i64 = db
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(v, 999, "left as it is");
}
