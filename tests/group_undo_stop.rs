//! A stop is acknowledged only once the ledger holds it (#63): a stop
//! asked in a group whose commit fails is undone in memory too (the worker
//! is running again, its caller told the error), and a stop the ledger
//! holds is read back at a start (the worker is stopping, by whom it was
//! asked), so it is carried out and the worker never runs again.
//!
//! Its own test binary: the failpoint table is read from the environment
//! once per process.

use astraeusd::inventory::sim;
use astraeusd::node::*;
use astraeusd::store::Store;

#[test]
fn a_stop_is_undone_with_its_group_and_read_back_once_durable() {
    // The second group's commit fails, as on a full disk.
    std::env::set_var("ASTRAEUS_FAILPOINTS", "store.group.commit=fail@2");
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger.db");
    let machine = || {
        sim::parse(
            "machine = \"m\"\ncpu_cores = 8\nmemory_gb = 64\n\
             [[gpu]]\nmodel = \"L4\"\ntotal_gb = 8\noutside_gb = 0\n",
        )
        .unwrap()
    };
    let mut n = Node::open(Store::open(&ledger).unwrap(), machine()).unwrap();
    let spec = r#"{"name":"c","requested_resources":{"gpu_requests":{"shared":true,"memory_gb":1}},
        "run":{"container":{"image":"localhost/bb"}}}"#;
    n.begin_group().unwrap();
    n.submit(spec, 1000).unwrap();
    assert!(matches!(n.end_group(), GroupEnd::Durable));
    n.set_launched("c", "c-id").unwrap();
    assert_eq!(n.worker("c").unwrap().phase, Phase::Running);

    // Asked in a group that fails: undone, in memory as in the ledger.
    n.begin_group().unwrap();
    n.ask_stop("c", 0).unwrap();
    assert_eq!(n.worker("c").unwrap().state(), State::Stopping);
    assert!(matches!(n.end_group(), GroupEnd::Undone(..)));
    let w = n.worker("c").unwrap();
    assert_eq!(
        w.phase,
        Phase::Running,
        "the stop its caller was refused is undone"
    );
    assert_eq!(w.stop_asked, None);
    assert_eq!(
        w.runtime_id.as_deref(),
        Some("c-id"),
        "its workload is still known"
    );

    // Asked again, durably: a start reads it back.
    n.begin_group().unwrap();
    n.ask_stop("c", 0).unwrap();
    assert!(matches!(n.end_group(), GroupEnd::Durable));
    drop(n);
    let n = Node::open(Store::open(&ledger).unwrap(), machine()).unwrap();
    let w = n.worker("c").unwrap();
    assert_eq!(
        w.state(),
        State::Stopping,
        "a stop acknowledged is carried out after a start"
    );
    assert_eq!(w.stop_asked.map(|s| s.by_uid), Some(0));
}
