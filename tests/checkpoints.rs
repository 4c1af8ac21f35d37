//! The ledger's write-ahead log is checkpointed by a thread of its own, not
//! inside a call's commit on the service loop (src/store/checkpoint.rs):
//! SQLite's automatic checkpoint, at 1,000 pages, made one call in ~200 and
//! every caller behind it wait for the database's sync. The real daemon on
//! a real dbus-daemon, its ledger's files read from outside.

mod common;
use common::*;
use std::path::Path;

/// A frame of the log: a page of 4 KiB and its 24-byte header.
const FRAME: u64 = 4096 + 24;

/// Frames the log file holds (it is written over, not shrunk, after a
/// checkpoint: its length is the most it held since).
fn log_frames(state: &Path) -> u64 {
    std::fs::metadata(state.join("ledger.db-wal")).map_or(0, |m| m.len() / FRAME)
}

fn database_bytes(state: &Path) -> u64 {
    std::fs::metadata(state.join("ledger.db")).unwrap().len()
}

/// `n` SubmitWorkers, one after another, of 0.01 GB each (all placed).
fn submit(a: &str, prefix: &str, n: usize) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let c = zbus::connection::Builder::address(a).build().await.unwrap();
        for i in 0..n {
            let spec = shared_spec(&format!("{prefix}{i}"), "0.01");
            let reply = c
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
    // ~5 pages a submit: ~1,500 in the log.
    submit(&bus.address, "a", 300);
    let frames = log_frames(&d.state);
    assert!(frames > 1200, "the log holds {frames} frames");
    assert_eq!(database_bytes(&d.state), before, "nothing checkpointed yet");
    // Past 2,000 the writer checkpoints itself.
    submit(&bus.address, "b", 150);
    assert!(
        database_bytes(&d.state) > before,
        "the backstop checkpointed the log ({} frames)",
        log_frames(&d.state)
    );
    assert!(log_frames(&d.state) < 2100, "{}", log_frames(&d.state));
}

/// Left to run, the checkpoint thread keeps the log near 1,000 pages.
#[test]
fn the_checkpoint_thread_keeps_the_log_short() {
    let dir = open_tempdir();
    let bus = Bus::session();
    let d = start_majin(&bus, dir.path(), "", &[]);
    let before = database_bytes(&d.state);
    submit(&bus.address, "a", 300);
    eventually("the log checkpointed into the database", || {
        database_bytes(&d.state) > before
    });
    let frames = log_frames(&d.state);
    assert!(
        (1000..1300).contains(&frames),
        "the log holds {frames} frames"
    );
}
