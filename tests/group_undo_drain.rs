//! A failed group commit and the GPUs kept for whole requests (draining):
//! the keeping is memory's alone, not the ledger's, and survives the undo.
//! A group that stops the last sharer of a kept GPU places the whole
//! request on it; undone, the request waits again with its GPU kept.
//!
//! Its own test binary: the failpoint table is read from the environment
//! once per process (tests/group_undo.rs fails another group the same way).

use astraeusd::inventory::sim;
use astraeusd::node::*;
use astraeusd::store::Store;
use astraeusd::time::EpochMs;
use std::time::Duration;

#[test]
fn an_undone_group_keeps_the_gpu_kept_for_a_whole_request() {
    // The second group's commit fails, as on a full disk.
    std::env::set_var("ASTRAEUS_FAILPOINTS", "store.group.commit=fail@2");
    let dir = tempfile::tempdir().unwrap();
    let machine = sim::parse(sim::MAJIN).unwrap();
    let uuid = machine.gpus[0].uuid.clone();
    let mut n = Node::open(Store::open(&dir.path().join("ledger.db")).unwrap(), machine).unwrap();
    let shared = r#"{"name":"a","requested_resources":{"gpu_requests":{"count":1,"shared":true,"memory_gb":3}}}"#;
    let whole = r#"{"name":"big","requested_resources":{"gpu_requests":{"count":1}}}"#;
    n.begin_group().unwrap();
    n.submit(shared, 1000).unwrap();
    n.submit(whole, 1000).unwrap();
    assert!(matches!(n.end_group(), GroupEnd::Durable));
    // big waited long enough: majin's GPU is kept for it.
    let later = EpochMs::from_i64(EpochMs::now().as_i64() + 3_600_000);
    n.drain(later, Some(Duration::from_secs(60))).unwrap();
    assert_eq!(n.book().kept_for(&uuid), Some("big"));

    n.begin_group().unwrap();
    n.stop("a", 1000).unwrap();
    assert!(matches!(
        n.worker("big").unwrap().status,
        Status::Running { .. }
    ));
    let GroupEnd::Undone(..) = n.end_group() else {
        panic!("the failed commit must undo the group");
    };
    assert_eq!(n.pending_names().collect::<Vec<_>>(), ["big"]);
    assert!(matches!(
        n.worker("a").unwrap().status,
        Status::Running { .. }
    ));
    assert_eq!(n.book().kept_for(&uuid), Some("big"), "still kept for big");
    assert!(n.audit().is_empty(), "{:?}", n.audit());
}
