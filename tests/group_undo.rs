//! Group commit's failure path, driven on the node directly: a group of
//! changes (a stop that lets a waiting worker in, submits placed and
//! pending) whose commit fails is undone in memory as the ledger undoes it.
//! The oracle is twofold: the node as it was before the group, and a node
//! opened afresh from the same ledger (the restart path).
//!
//! Its own test binary: the failpoint table is read from the environment
//! once per process, so it is set here before anything reads it.

use astraeusd::inventory::sim;
use astraeusd::node::*;
use astraeusd::store::Store;

fn shared(name: &str, gb: &str) -> String {
    format!(
        r#"{{"name":"{name}","requested_resources":{{"gpu_requests":{{"count":1,"shared":true,"memory_gb":{gb}}}}}}}"#
    )
}

/// Everything a caller can see of the node's workers and book.
fn described(n: &Node) -> Vec<String> {
    let mut out: Vec<String> = n
        .workers()
        .map(|w| {
            let grants: Vec<String> = w
                .grants()
                .iter()
                .map(|g| format!("{} {:?}", g.gpu_uuid, g.share.map(|a| a.to_string())))
                .collect();
            format!(
                "{} #{} {:?} [{}]",
                w.spec.name,
                w.id,
                w.state(),
                grants.join(", ")
            )
        })
        .collect();
    out.push(format!(
        "pending: {:?}",
        n.pending_names().collect::<Vec<_>>()
    ));
    for g in &n.machine().gpus {
        out.push(format!("GPU {} taken {}", g.index, n.book().taken(&g.uuid)));
    }
    out.push(format!("uid 1000 holds {:?}", n.held_by(1000)));
    out
}

#[test]
fn a_group_whose_commit_fails_is_undone_in_memory_as_in_the_ledger() {
    // The second group's commit fails, as on a full disk.
    std::env::set_var("ASTRAEUS_FAILPOINTS", "store.group.commit=fail@2");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let machine = sim::parse(sim::MAJIN).unwrap();
    let mut n = Node::open(Store::open(&path).unwrap(), machine.clone()).unwrap();

    // Majin's GPU offers 7 GB: a and b fill it, c waits.
    n.begin_group().unwrap();
    n.submit(&shared("a", "3"), 1000).unwrap();
    n.submit(&shared("b", "4"), 1000).unwrap();
    n.submit(&shared("c", "2"), 1000).unwrap();
    assert!(matches!(n.end_group(), GroupEnd::Durable));
    let before = described(&n);
    assert_eq!(n.pending_names().collect::<Vec<_>>(), ["c"]);

    // b stops (c is placed), d is placed, e waits — and the commit fails.
    n.begin_group().unwrap();
    n.stop("b", 1000).unwrap();
    n.submit(&shared("d", "1"), 1000).unwrap();
    n.submit(&shared("e", "5"), 1000).unwrap();
    assert_eq!(n.pending_names().collect::<Vec<_>>(), ["e"]);
    assert_ne!(described(&n), before);
    let GroupEnd::Undone(e, changes) = n.end_group() else {
        panic!("the failed commit must undo the group");
    };
    assert!(e.message().contains("disk is full"), "{}", e.message());

    assert_eq!(described(&n), before, "memory is as before the group");
    assert!(n.audit().is_empty(), "{:?}", n.audit());
    let mut removed = changes.removed.clone();
    removed.sort();
    assert_eq!(removed, ["d", "e"]);
    assert_eq!(changes.added, ["b"]);
    // c is waiting again; a, running throughout, is shown again too (what
    // is promised on its GPU changed back).
    assert_eq!(changes.updated, ["a", "c"]);
    let fresh = Node::open(Store::open(&path).unwrap(), machine.clone()).unwrap();
    assert_eq!(described(&fresh), before, "the ledger agrees");
    drop(fresh);

    // Work goes on: the next group is kept.
    n.begin_group().unwrap();
    n.submit(&shared("f", "0.5"), 1000).unwrap();
    assert!(matches!(n.end_group(), GroupEnd::Durable));
    drop(n);
    let reopened = Node::open(Store::open(&path).unwrap(), machine).unwrap();
    let names: Vec<&str> = reopened.workers().map(|w| w.spec.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "c", "f"]);
}
