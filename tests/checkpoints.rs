//! The ledger's write-ahead log is checkpointed by a thread of its own, not
//! inside a call's commit on the service loop (src/store/checkpoint.rs):
//! SQLite's automatic checkpoint, at 1,000 pages, made one call in ~200 and
//! every caller behind it wait for the database's sync. The real daemon on
//! a real dbus-daemon, its ledger's files read from outside.

mod common;
use common::*;
use std::path::Path;

/// Frames the log file holds (it is written over, not shrunk, after a
/// checkpoint: its length is the most it held since): its length less the
/// 32-byte header, over the page size (in that header) and a frame's 24.
fn log_frames(state: &Path) -> u64 {
    let Ok(log) = std::fs::read(state.join("ledger.db-wal")) else {
        return 0;
    };
    if log.len() < 32 {
        return 0;
    }
    let page = u32::from_be_bytes(log[8..12].try_into().unwrap()) as u64;
    (log.len() as u64 - 32) / (page + 24)
}

/// When the database file was last written, and its length: a checkpoint
/// changes it (its size alone may not: the ledger keeps free pages in it
/// and grows in whole chunks, store/room.rs).
fn database_bytes(state: &Path) -> (u64, std::time::SystemTime) {
    let m = std::fs::metadata(state.join("ledger.db")).unwrap();
    (m.len(), m.modified().unwrap())
}

/// SubmitWorkers of 0.01 GB each (all placed), `per` from each of
/// `callers` connections at once, named `prefix`-caller-i; with `stop`,
/// each stopped after its submit.
fn submit(a: &str, prefix: &str, callers: usize, per: usize, stop: bool) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut tasks = Vec::new();
        for c in 0..callers {
            let conn = zbus::connection::Builder::address(a).build().await.unwrap();
            let prefix = prefix.to_string();
            tasks.push(tokio::spawn(async move {
                for i in 0..per {
                    let spec = shared_spec(&format!("{prefix}-{c}-{i}"), "0.01");
                    let reply = conn
                        .call_method(
                            Some("org.astraeus.Node1"),
                            "/org/astraeus/Node1",
                            Some("org.astraeus.Node1.Manager"),
                            "SubmitWorker",
                            &(spec,),
                        )
                        .await
                        .unwrap();
                    let (_, state, _): (zbus::OwnedObjectPath, String, Vec<String>) =
                        reply.body().deserialize().unwrap();
                    assert_eq!(state, "running");
                    if stop {
                        conn.call_method(
                            Some("org.astraeus.Node1"),
                            "/org/astraeus/Node1",
                            Some("org.astraeus.Node1.Manager"),
                            "StopWorker",
                            &(format!("{prefix}-{c}-{i}"),),
                        )
                        .await
                        .unwrap();
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
}

/// With the checkpoint thread held, calls go on and the log grows past
/// SQLite's 1,000 pages (nothing on the loop checkpoints it), until the
/// writer's backstop at 2,000 checkpoints it after all.
#[test]
fn calls_go_on_while_the_checkpoint_thread_is_held_and_the_backstop_bounds_the_log() {
    let dir = open_tempdir();
    let bus = Bus::session();
    let d = start_majin(
        &bus,
        dir.path(),
        "",
        &[("ASTRAEUS_FAILPOINTS", "store.checkpoint=block")],
    );
    let before = database_bytes(&d.state);
    let mut batch = 0;
    while log_frames(&d.state) <= 1200 {
        assert!(batch < 8, "{} frames", log_frames(&d.state));
        submit(&bus.address, &format!("a{batch}"), 1, 50, false);
        batch += 1;
    }
    assert_eq!(database_bytes(&d.state), before, "nothing checkpointed yet");
    // Past 2,000 the writer checkpoints itself.
    while database_bytes(&d.state) == before {
        assert!(batch < 12, "{} frames", log_frames(&d.state));
        submit(&bus.address, &format!("b{batch}"), 1, 50, false);
        batch += 1;
    }
    let frames = log_frames(&d.state);
    assert!(
        (2000..2100).contains(&frames),
        "the log held {frames} frames"
    );
}

/// Left to run, the checkpoint thread keeps the log near 1,000 pages, with
/// eight callers' grouped commits between its passes (seen running to the
/// backstop's 2,000 with the thread never asked).
#[test]
fn the_checkpoint_thread_keeps_the_log_short_under_load() {
    let dir = open_tempdir();
    let bus = Bus::session();
    let d = start_majin(&bus, dir.path(), "", &[]);
    let before = database_bytes(&d.state);
    // Well over 2,000 pages written to the log in all, commits grouped.
    submit(&bus.address, "a", 8, 150, true);
    assert_ne!(database_bytes(&d.state), before, "checkpointed");
    let frames = log_frames(&d.state);
    assert!(
        (1000..1400).contains(&frames),
        "the log held {frames} frames at most"
    );
}

/// Changes committed alone (outside a group: an exit, a placement by a
/// reading) ask the thread as a group's commit does: the log is
/// checkpointed by it, near 1,000 pages, not by the writer at 2,000.
#[test]
fn changes_committed_alone_ask_for_the_checkpoint_too() {
    let dir = open_tempdir();
    let path = dir.path().join("ledger.db");
    let mut store = astraeusd::store::Store::open(&path).unwrap();
    let spec = r#"{"name":"x","requested_resources":{"gpu_requests":{"count":1,"shared":true,"memory_gb":1}}}"#;
    let before = database_bytes(dir.path());
    let mut i = 0;
    // Until the thread has checkpointed (the database file grows), short
    // of the writer's own checkpoint at 2,000 pages.
    while database_bytes(dir.path()) == before {
        assert!(
            log_frames(dir.path()) < 1_900,
            "the log reached the writer's backstop: no one asked the thread"
        );
        let now = astraeusd::time::EpochMs::now();
        store
            .insert_worker(&format!("w{i}"), spec, 1000, &[], None, now)
            .unwrap();
        i += 1;
    }
    assert!(
        log_frames(dir.path()) >= 1_000,
        "checkpointed at its length"
    );
}
