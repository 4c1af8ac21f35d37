//! A disk that fails an fsync, where a user meets it: the daemon runs with
//! tests/power_loss/shim.c preloaded, which fails each sync of a ledger file
//! with EIO, syncing nothing, while a file of the test's exists (as a
//! failing disk does). The fsync is SQLite's, inside COMMIT, after the
//! commit's frames were written to the log: whether they reach the disk is
//! unknown, and SQLite replays whatever whole commits the log holds at the
//! next open. So the caller is told exactly that, no new work is taken
//! until a restart reads the ledger again, and reads go on meanwhile.

mod common;
#[path = "common/ledger_check.rs"]
mod ledger_check;
#[path = "common/power_loss.rs"]
mod power_loss;

use common::*;
use std::path::Path;

/// The daemon on majin with `config`, its ledger's syncs failing while
/// `dir/failing` exists.
fn daemon(bus: &Bus, dir: &Path, config: &str) -> Daemon {
    let shim = power_loss::shim();
    let writes = dir.join("writes.log");
    let sync = format!("fail:{}", dir.join("failing").display());
    start_majin(
        bus,
        dir,
        config,
        &[
            ("LD_PRELOAD", shim.to_str().unwrap()),
            ("ASTRAEUS_POWER_LOSS_LOG", writes.to_str().unwrap()),
            ("ASTRAEUS_POWER_LOSS_SYNC", &sync),
        ],
    )
}

fn submit(a: &str, name: &str) -> Out {
    manager(a, None, "SubmitWorker", &["s", &shared_spec(name, "0.5")])
}

fn listed(a: &str) -> String {
    manager(a, None, "ListWorkers", &[]).stdout
}

const REFUSED: &str = "new work is refused until the daemon restarts";

/// A submit's group commit whose fsync fails: the caller hears that its
/// worker may or may not have been kept, later work is refused, reads go
/// on; after a crash the log's frames (in the page cache here) are replayed,
/// so the worker is there — which is why the daemon may not have told the
/// caller "rolled back" and gone on.
#[test]
fn a_submit_whose_fsync_failed_is_told_so_and_new_work_waits_for_a_restart() {
    let dir = open_tempdir();
    let bus = Bus::session();
    let config = "[inventory]\nrefresh_seconds = 0.2\n";
    let mut d = daemon(&bus, dir.path(), config);
    let a = d.address.clone();
    let o = submit(&a, "kept");
    assert!(o.ok, "{}", o.stderr);

    std::fs::write(dir.path().join("failing"), "").unwrap();
    let o = submit(&a, "unsure");
    assert!(!o.ok, "a submit whose fsync failed was acknowledged");
    assert!(
        o.stderr
            .contains("its disk did not confirm the last writes")
            && o.stderr
                .contains("whether they were kept is known after the daemon restarts"),
        "{}",
        o.stderr
    );
    std::fs::remove_file(dir.path().join("failing")).unwrap();

    // The disk answers again, but the fate of the last commit is unknown:
    // nothing new is taken until a restart.
    let o = submit(&a, "after");
    assert!(!o.ok, "new work was taken after a failed fsync");
    assert!(o.stderr.contains(REFUSED), "{}", o.stderr);
    assert!(listed(&a).contains("\"kept\""), "reads go on");

    d.child.kill().unwrap();
    d.child.wait().unwrap();
    drop(d);
    let d = daemon(&bus, dir.path(), config);
    let a = d.address.clone();
    let list = listed(&a);
    assert!(
        list.contains("\"kept\""),
        "acknowledged worker lost: {list}"
    );
    assert!(
        !list.contains("\"after\""),
        "a refused worker was kept: {list}"
    );
    assert!(
        list.contains("\"unsure\""),
        "the log's last commit was written before its fsync failed, and a \
         restart replays it: {list}"
    );
    let o = submit(&a, "fresh");
    assert!(o.ok, "a restarted daemon takes work again: {}", o.stderr);
}

/// A change that commits on its own (here a closed usage interval, written
/// at a refresh) and whose fsync fails stops new work the same way.
#[test]
fn a_lone_write_whose_fsync_failed_stops_new_work_too() {
    let dir = open_tempdir();
    let bus = Bus::session();
    let config = "[inventory]\nrefresh_seconds = 0.2\n[usage]\ninterval_seconds = 1\n";
    let d = daemon(&bus, dir.path(), config);
    let a = d.address.clone();
    assert!(submit(&a, "before").ok);

    a_failed_fsync_refuses_new_work(&d, dir.path(), "a usage interval's commit", || {});
    assert!(listed(&a).contains("\"before\""), "reads go on");
}

/// With the ledger's syncs failing, `cause` makes the daemon write on its
/// own; once that write's fsync has failed (the journal says so) and the
/// disk answers again, a submit is refused until a restart.
fn a_failed_fsync_refuses_new_work(d: &Daemon, dir: &Path, what: &str, cause: impl FnOnce()) {
    std::fs::write(dir.join("failing"), "").unwrap();
    cause();
    eventually(&format!("{what} to fail its fsync"), || {
        d.log_text()
            .contains("its disk did not confirm the last writes")
    });
    std::fs::remove_file(dir.join("failing")).unwrap();
    let o = submit(&d.address, "after");
    assert!(!o.ok, "new work was taken after a failed fsync");
    assert!(o.stderr.contains(REFUSED), "{}", o.stderr);
}

/// A write that is its own transaction without a savepoint (here a
/// worker's holders, rewritten when one of its holder processes is gone)
/// and whose fsync fails stops new work the same way.
#[test]
fn a_bare_write_whose_fsync_failed_stops_new_work_too() {
    let dir = open_tempdir();
    let bus = Bus::session();
    let d = daemon(&bus, dir.path(), "[inventory]\nrefresh_seconds = 0.2\n");
    let a = d.address.clone();
    let mut holder = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let spec = format!(
        r#"{{"name":"held","holders":[{}],"requested_resources":{{"gpu_requests":{{"shared":true,"memory_gb":0.5}}}}}}"#,
        holder.id()
    );
    let o = manager(&a, None, "SubmitWorker", &["s", &spec]);
    assert!(o.ok, "{}", o.stderr);

    a_failed_fsync_refuses_new_work(&d, dir.path(), "the holders' rewrite", || {
        holder.kill().unwrap();
        holder.wait().unwrap();
    });
}
