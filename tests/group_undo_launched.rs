//! A failed group commit and what only memory knows: a workload's id and
//! control group that the ledger does not hold (here recorded in the group
//! that fails; in the daemon, an id whose write a full disk refused) name a
//! workload that runs on, so the undo must not forget them; and a worker
//! the group did not touch, holding two GPUs, stays as it was (the ledger
//! reads its grants back in another order than placement gave them).
//!
//! Its own test binary: the failpoint table is read from the environment
//! once per process (tests/group_undo.rs fails another group the same way).

use astraeusd::inventory::sim;
use astraeusd::node::*;
use astraeusd::store::Store;

#[test]
fn an_undone_group_keeps_a_launch_it_recorded_and_leaves_others_as_they_were() {
    // The second group's commit fails, as on a full disk.
    std::env::set_var("ASTRAEUS_FAILPOINTS", "store.group.commit=fail@2");
    let dir = tempfile::tempdir().unwrap();
    // GPU 1 offers less than GPU 0: a sharer of both is given GPU 1 first.
    let machine = sim::parse(
        "machine = \"m\"\ncpu_cores = 8\nmemory_gb = 64\n\
         [[gpu]]\nmodel = \"L4\"\ntotal_gb = 8\noutside_gb = 0\n\
         [[gpu]]\nmodel = \"L4\"\ntotal_gb = 8\noutside_gb = 2\n",
    )
    .unwrap();
    let mut n = Node::open(Store::open(&dir.path().join("ledger.db")).unwrap(), machine).unwrap();
    let spec = |name: &str, count: u32| {
        format!(
            r#"{{"name":"{name}","requested_resources":{{"gpu_requests":{{"count":{count},"shared":true,"memory_gb":1}}}},
                "run":{{"container":{{"image":"localhost/bb"}}}}}}"#
        )
    };
    n.begin_group().unwrap();
    n.submit(&spec("pair", 2), 1000).unwrap();
    n.submit(&spec("one", 1), 1000).unwrap();
    assert!(matches!(n.end_group(), GroupEnd::Durable));
    let indexes = |n: &Node| -> Vec<u32> {
        let w = n.worker("pair").unwrap();
        w.grants().iter().map(|g| g.gpu_index).collect()
    };
    assert_eq!(
        indexes(&n),
        [1, 0],
        "the premise: placement's order is not the ledger's"
    );
    n.set_launched("pair", "pair-id").unwrap();
    let pair_phase = n.worker("pair").unwrap().phase;

    // "one"'s launch is recorded within a group that then fails: its
    // container runs.
    n.begin_group().unwrap();
    n.set_launched("one", "one-id").unwrap();
    n.set_cgroup("one", "/machine.slice/libpod-one.scope")
        .unwrap();
    n.submit(&spec("late", 1), 1000).unwrap();
    let GroupEnd::Undone(_, changes) = n.end_group() else {
        panic!("the failed commit must undo the group");
    };
    assert_eq!(changes.removed, ["late"]);

    let one = n.worker("one").unwrap();
    assert_eq!(
        one.runtime_id.as_deref(),
        Some("one-id"),
        "its workload runs"
    );
    assert_eq!(
        one.cgroup.as_deref(),
        Some("/machine.slice/libpod-one.scope")
    );
    assert_eq!(one.phase, Phase::Running);
    let pair = n.worker("pair").unwrap();
    assert_eq!(pair.phase, pair_phase, "untouched by the group");
    assert_eq!(pair.runtime_id.as_deref(), Some("pair-id"));
    assert!(n.audit().is_empty(), "{:?}", n.audit());
}
