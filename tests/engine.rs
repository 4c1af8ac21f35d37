//! The node engine driven directly (no bus, no loop): the seed's example,
//! restarts, re-examination and reasons, against an in-memory ledger.

use astraeusd::inventory::sim;
use astraeusd::node::*;
use astraeusd::placement;
use astraeusd::store::Store;

fn node() -> Node {
    Node::open(
        Store::open_in_memory().unwrap(),
        sim::parse(sim::MAJIN).unwrap(),
    )
    .unwrap()
}

/// A sim machine of `n` 8 GB L4s, each with `outside_gb` held outside.
fn l4s(n: usize, outside_gb: u32) -> String {
    let mut toml = String::from("machine = \"m\"\ncpu_cores = 64\nmemory_gb = 512\n");
    for _ in 0..n {
        toml.push_str(&format!(
            "[[gpu]]\nmodel = \"L4\"\ntotal_gb = 8\noutside_gb = {outside_gb}\n"
        ));
    }
    toml
}

/// A node on the sim machine `toml`, its ledger in memory.
fn node_on(toml: &str) -> Node {
    Node::open(Store::open_in_memory().unwrap(), sim::parse(toml).unwrap()).unwrap()
}

/// The workers holding GPU `gpu`, in name order.
fn names_on(n: &Node, gpu: u32) -> Vec<String> {
    n.workers()
        .filter(|w| w.grants().iter().any(|g| g.gpu_index == gpu))
        .map(|w| w.name().to_string())
        .collect()
}

/// Submits `count` sharers of `gb` GB each for owner 1, named `prefix0`, ….
fn submit_sharers(n: &mut Node, prefix: &str, count: usize, gb: &str) {
    for i in 0..count {
        n.submit(&shared(&format!("{prefix}{i}"), gb), 1).unwrap();
    }
}

fn shared(name: &str, gb: &str) -> String {
    format!(
        r#"{{"name":"{name}","requested_resources":{{"gpu_requests":{{"count":1,"shared":true,"memory_gb":{gb}}}}}}}"#
    )
}

#[test]
fn the_seeds_example_end_to_end() {
    let mut n = node();
    n.submit(&shared("listen", "2.2"), 1000).unwrap();
    n.submit(&shared("voice", "4.2"), 1000).unwrap();
    n.submit(&shared("small", "1.5"), 1000).unwrap();
    n.submit(&shared("big", "7.5"), 1000).unwrap();
    assert_eq!(
        n.reasons("small"),
        ["GPU 0 of majin: 6.4 of 7 GB taken by shared work; it needs 1.5"]
    );
    assert_eq!(
        n.reasons("big"),
        ["GPU 0 of majin offers 7 of its 8 GB (1 GB held outside Astraeus); it needs 7.5"]
    );
    let uuid = n.machine().gpus[0].uuid.clone();
    assert_eq!(
        placement::sharers_line(n.book().usage(&uuid)),
        "shared: listen 2.2 GB, voice 4.2 GB — 6.4 GB taken"
    );
    assert_eq!(
        placement::gpus_column(n.worker("listen").unwrap().grants()),
        "1 · shared 2.2 GB"
    );
    // voice stops: small fits now and starts; big still waits.
    let c = n.stop("voice", 1000).unwrap();
    assert_eq!(c.updated, vec!["small".to_string()]);
    assert!(matches!(
        n.worker("small").unwrap().status,
        Status::Running { .. }
    ));
    assert_eq!(n.pending_count(), 1);
    assert!(n.audit().is_empty());
}

#[test]
fn names_owners_and_errors() {
    let mut n = node();
    let held = r#"{"name":"a","holders":[42],"requested_resources":{"gpu_requests":{"shared":true,"memory_gb":1}}}"#;
    n.submit(held, 1000).unwrap();
    let pids: Vec<u32> = n
        .worker("a")
        .unwrap()
        .holders
        .iter()
        .map(|h| h.pid)
        .collect();
    assert_eq!(pids, vec![42]);
    let e = n.submit(&shared("a", "1"), 1000).unwrap_err();
    assert_eq!(e.kind(), "Exists");
    assert!(e.message().starts_with("name: "));
    assert_eq!(n.stop("a", 1001).unwrap_err().kind(), "AccessDenied");
    assert_eq!(n.stop("nope", 0).unwrap_err().kind(), "NotFound");
    n.stop("a", 0).unwrap();
    // The name is free again once its worker stopped.
    n.submit(&shared("a", "1"), 1000).unwrap();
}

#[test]
fn restart_changes_no_placement() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.db");
    let mut n = Node::open(Store::open(&path).unwrap(), sim::parse(sim::MAJIN).unwrap()).unwrap();
    n.submit(&shared("listen", "2.2"), 1).unwrap();
    n.submit(&shared("big", "7.5"), 1).unwrap();
    let before: Vec<(String, Status)> = n
        .workers()
        .map(|w| (w.name().to_string(), w.status.clone()))
        .collect();
    drop(n);
    let n = Node::open(Store::open(&path).unwrap(), sim::parse(sim::MAJIN).unwrap()).unwrap();
    let after: Vec<(String, Status)> = n
        .workers()
        .map(|w| (w.name().to_string(), w.status.clone()))
        .collect();
    assert_eq!(before, after);
}

#[test]
fn outside_use_shrinking_places_pending_work() {
    let mut n = node();
    n.submit(&shared("big", "7.5"), 1).unwrap();
    assert_eq!(n.pending_count(), 1);
    let m = sim::parse(&sim::MAJIN.replace("outside_gb = 1", "outside_gb = 0")).unwrap();
    let c = n.set_machine(m).unwrap();
    assert_eq!(c.updated, vec!["big".to_string()]);
    assert_eq!(n.pending_count(), 0);
}

#[test]
fn why_not_changes_nothing() {
    let mut n = node();
    let v = n.why_not(&shared("x", "7.5")).unwrap();
    assert!(v.is_err());
    let v = n.why_not(&shared("x", "2")).unwrap();
    assert_eq!(v.unwrap().len(), 1);
    assert_eq!(n.workers().count(), 0);
    assert_eq!(n.store().event_count().unwrap(), 0);
}

#[test]
fn reexamination_is_linear_in_pending_workers() {
    // Eight 8 GB GPUs, each filled by one 7 GB sharer; then thousands of
    // 2 GB workers wait. Each submit must cost one evaluation pass of its
    // own, and a stop one pass over the queue — not a pass per pending
    // worker per event.
    let mut toml = String::from("machine = \"big\"\ncpu_cores = 64\nmemory_gb = 512\n");
    for _ in 0..8 {
        toml.push_str("[[gpu]]\nmodel = \"L4\"\ntotal_gb = 8\n");
    }
    let gpus = 8u64;
    let mut n = node_on(&toml);
    submit_sharers(&mut n, "fill", 8, "7");
    let pending = 3000u64;
    let start = n.evals.0;
    for i in 0..pending {
        n.submit(&shared(&format!("p{i}"), "2"), 1).unwrap();
    }
    assert_eq!(
        n.evals.0 - start,
        pending * gpus,
        "each submit evaluates only itself"
    );
    let start = n.evals.0;
    n.stop("fill0", 1).unwrap();
    // One pass, oldest first, against the one GPU given back: the four
    // that fit are checked and placed (8 GPUs each); then the GPU cannot
    // hold even the smallest share waiting (2 GB in the 0 left), and the
    // pass ends without looking at the other 2,996.
    assert_eq!(n.evals.0 - start, 4 + 4 * gpus);
    assert_eq!(
        n.pending_count() as u64,
        pending - 4,
        "four 2 GB workers fit in 8 GB"
    );
    assert!(n.audit().is_empty(), "{:?}", n.audit());
}

#[test]
fn reasons_are_computed_when_asked_and_current_after_each_change() {
    let mut n = node();
    n.submit(&shared("listen", "2.2"), 1).unwrap();
    n.submit(&shared("big", "7.5"), 1).unwrap();
    n.submit(&shared("mid", "5.5"), 1).unwrap();
    assert_eq!(
        n.reasons("mid"),
        ["GPU 0 of majin: 2.2 of 7 GB taken by shared work; it needs 5.5"]
    );
    let snap = n.snapshot();
    n.submit(&shared("tiny", "0.5"), 1).unwrap();
    assert_eq!(
        n.reasons("mid"),
        ["GPU 0 of majin: 2.7 of 7 GB taken by shared work; it needs 5.5"]
    );
    // A snapshot is the moment it was taken.
    let mid = n.worker("mid").unwrap().spec.resources.clone();
    assert_eq!(
        snap.reasons("mid", &mid),
        ["GPU 0 of majin: 2.2 of 7 GB taken by shared work; it needs 5.5"]
    );
    assert_eq!(n.snapshot().reasons("mid", &mid), n.reasons("mid"));
    let c = n.stop("listen", 1).unwrap();
    assert_eq!(
        c.updated,
        vec!["mid".to_string()],
        "mid fits once listen ends"
    );
    assert!(
        n.reasons("mid").is_empty(),
        "a running worker has no reasons"
    );
    assert!(n.audit().is_empty(), "{:?}", n.audit());
}

#[test]
fn a_new_reading_reexamines_only_the_gpus_that_changed() {
    let toml = l4s(4, 4);
    let mut n = node_on(&toml);
    submit_sharers(&mut n, "p", 100, "6");
    assert_eq!(n.pending_count(), 100);
    // GPU 2's outside use drops to 1 GB: only GPU 2 is looked at, the
    // oldest fits there, and the 1 GB left holds nobody's 6: the pass ends.
    let mut m = sim::parse(&toml).unwrap();
    m.gpus[2].outside = astraeusd::quantity::Amount::from_hundredths(100);
    let start = n.evals.0;
    let c = n.set_machine(m).unwrap();
    assert_eq!(c.placed, vec!["p0".to_string()]);
    assert_eq!(n.evals.0 - start, 1 + 4);
    assert_eq!(n.worker("p0").unwrap().grants()[0].gpu_index, 2);
    assert!(n.audit().is_empty(), "{:?}", n.audit());
}

/// Use beyond shares as each one is told: the GPU's warning names whose it
/// is, and a worker is told its own, judged with the workers it shares a
/// process with; others on the GPU are not told (its figures change with
/// each reading). The oracle: the figures set by hand below, not the
/// inventory's sums.
#[test]
fn use_beyond_shares_is_a_gpu_warning_and_each_workers_own() {
    use astraeusd::placement::Beyond;
    use astraeusd::quantity::Amount;
    let mut n = node();
    for (name, gb) in [("a", "1"), ("b", "1"), ("c", "2")] {
        n.submit(&shared(name, gb), 1000).unwrap();
    }
    let gb = |h| Amount::from_hundredths(h);
    let set = |names: &[&str], share, used| Beyond {
        workers: names.iter().map(|n| n.to_string()).collect(),
        share: gb(share),
        used: gb(used),
        excess: gb(used - share),
    };
    let mut m = n.machine().clone();
    m.gpus[0].beyond_shares = gb(50);
    m.gpus[0].beyond = vec![set(&["a", "b"], 200, 250)];
    n.set_machine(m.clone()).unwrap();
    let gpu_warning = |n: &Node| n.gpu_warning(&n.machine().gpus[0]);
    assert_eq!(
        gpu_warning(&n).as_deref(),
        Some("used beyond shares: 0.5 GB beyond their 2 GB of shares by workers a, b")
    );
    let warnings = |n: &Node, w: &str| n.worker_warnings(n.worker(w).unwrap());
    assert_eq!(
        warnings(&n, "a"),
        ["uses, with b, more than their 2 GB of shares on GPU 0 of majin (2.5 GB now)"]
    );
    assert!(warnings(&n, "c").is_empty(), "{:?}", warnings(&n, "c"));
    // Alone, in the words of a worker's own breach.
    m.gpus[0].beyond = vec![set(&["c"], 200, 250)];
    n.set_machine(m.clone()).unwrap();
    assert_eq!(
        warnings(&n, "c"),
        ["uses more than its 2 GB share on GPU 0 of majin (2.5 GB now)"]
    );
    // Many sets: the three using most beyond their shares, then a count.
    let many: Vec<Beyond> = (1..=5)
        .map(|i| set(&[&format!("w{i}")], 100, 100 + i))
        .collect();
    m.gpus[0].beyond = many;
    n.set_machine(m.clone()).unwrap();
    assert_eq!(
        gpu_warning(&n).as_deref(),
        Some(
            "used beyond shares: 0.05 GB beyond its 1 GB share by worker w5; \
             0.04 GB beyond its 1 GB share by worker w4; \
             0.03 GB beyond its 1 GB share by worker w3; \
             and 2 more sets of workers beyond their shares"
        )
    );
    // Over-promised is the GPU's, whoever is beyond: everyone is told.
    m.gpus[0].beyond = vec![set(&["c"], 200, 250)];
    m.gpus[0].beyond_shares = gb(500);
    n.set_machine(m.clone()).unwrap();
    let told = warnings(&n, "c");
    assert!(
        told[0].starts_with("GPU 0 of majin is over-promised: 4 GB promised"),
        "{told:?}"
    );
    assert_eq!(told.len(), 2, "{told:?}");
    assert!(warnings(&n, "a")[0].starts_with("GPU 0 of majin is over-promised"));
    // A GPU no one shares any longer (its last reading kept) warns of nothing.
    m.gpus[0].beyond_shares = gb(50);
    n.set_machine(m).unwrap();
    for w in ["a", "b", "c"] {
        n.stop(w, 1000).unwrap();
    }
    assert_eq!(gpu_warning(&n), None);
}

/// Ops of the quota tallies' property test: submit a sharer of `gb` tenths
/// for owner `owner`, stop the `i`th live worker, or restart on the ledger.
#[derive(Clone, Debug)]
enum Op {
    Submit { owner: u32, tenths: u8 },
    Stop(usize),
    Restart,
}

fn ops() -> impl proptest::strategy::Strategy<Value = Vec<Op>> {
    use proptest::prelude::*;
    proptest::collection::vec(
        prop_oneof![
            4 => (0u32..3, 1u8..80).prop_map(|(owner, tenths)| Op::Submit { owner, tenths }),
            3 => any::<usize>().prop_map(Op::Stop),
            1 => Just(Op::Restart),
        ],
        1..60,
    )
}

proptest::proptest! {
    /// The (live, pending) tallies the quotas read, kept as workers come,
    /// are placed (a stop frees room for a pending one) and go, agree with a
    /// count over the live workers after every step and across restarts.
    #[test]
    fn quota_tallies_match_a_count_of_the_live_workers(ops in ops()) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.db");
        let open = || Node::open(Store::open(&path).unwrap(), sim::parse(sim::MAJIN).unwrap()).unwrap();
        let mut n = open();
        for (k, op) in ops.into_iter().enumerate() {
            match op {
                Op::Submit { owner, tenths } => {
                    let gb = format!("{}.{}", tenths / 10, tenths % 10);
                    n.submit(&shared(&format!("w{k}"), &gb), owner).unwrap();
                }
                Op::Stop(i) => {
                    let names: Vec<String> = n.workers().map(|w| w.name().to_string()).collect();
                    if !names.is_empty() {
                        n.stop(&names[i % names.len()], 0).unwrap();
                    }
                }
                Op::Restart => {
                    drop(n);
                    n = open();
                }
            }
            for uid in 0..3 {
                let counted = n.workers().filter(|w| w.owner_uid == uid).fold(
                    astraeusd::access::Holding::default(),
                    |h, w| astraeusd::access::Holding {
                        live: h.live + 1,
                        pending: h.pending
                            + usize::from(w.state() == astraeusd::worker::State::Pending),
                        request_bytes: h.request_bytes + w.spec_text.len(),
                    },
                );
                proptest::prop_assert_eq!(n.held_by(uid), counted, "owner {}", uid);
            }
        }
    }
}

/// What a real host's refresh reads anew each time (power, the energy
/// counter, utilisation, processes' bytes) places nothing: a reading that
/// moved only those re-examines no pending worker and shows again only the
/// GPUs that moved and the workers on a GPU whose processes' bytes moved;
/// the rest (outside use) is a change of the machine, as before.
#[test]
fn readings_that_place_nothing_show_again_only_what_they_are_of() {
    let toml = l4s(3, 1);
    let mut n = node_on(&toml);
    submit_sharers(&mut n, "s", 3, "6");
    submit_sharers(&mut n, "p", 10, "6");
    assert_eq!(n.pending_count(), 10);
    let on_1 = names_on(&n, 1);
    assert_eq!(on_1.len(), 1);

    let mut m = sim::parse(&toml).unwrap();
    for g in &mut m.gpus {
        g.energy_mj = Some(1_000);
        g.power_mw = Some(70_000);
    }
    m.gpus[1].own_use = Some(vec![(4242, 1 << 30)]);
    let start = n.evals.0;
    let c = n.set_machine(m.clone()).unwrap();
    assert!(!c.machine_changed);
    assert_eq!(c.gpus, vec![0, 1, 2]);
    assert_eq!(c.updated, on_1, "the workers on the GPU whose bytes moved");
    assert_eq!(n.evals.0, start, "no pending worker re-examined");
    assert_eq!(n.machine().gpus[0].energy_mj, Some(1_000), "kept");

    // The counter moves on GPU 0 alone.
    m.gpus[0].energy_mj = Some(2_000);
    let c = n.set_machine(m.clone()).unwrap();
    assert_eq!((c.gpus, c.updated), (vec![0], vec![]));

    // Outside use shrinks on GPU 2: a change of the machine.
    m.gpus[2].outside = astraeusd::quantity::Amount::from_hundredths(0);
    let c = n.set_machine(m).unwrap();
    assert!(c.machine_changed);
    assert_eq!(c.gpus, vec![0, 1, 2]);
    assert!(n.audit().is_empty(), "{:?}", n.audit());
}

/// Of the workers on a GPU whose processes' bytes moved, only those whose
/// own processes (holders, or processes found in their control group) came,
/// went or moved are shown again; all of them when the readings have no
/// per-process figures on one side. A worker whose group's processes
/// changed is shown again with the next reading, whatever moved.
#[test]
fn only_the_workers_whose_processes_moved_are_shown_again() {
    let toml = l4s(1, 1);
    let mut n = node_on(&toml);
    let held = |name: &str, pid: u32| {
        format!(
            r#"{{"name":"{name}","holders":[{pid}],"requested_resources":{{"gpu_requests":{{"count":1,"shared":true,"memory_gb":1}}}}}}"#
        )
    };
    n.submit(&held("a", 101), 1).unwrap();
    n.submit(&held("b", 102), 1).unwrap();
    n.submit(&shared("c", "1"), 1).unwrap();
    let mut m = sim::parse(&toml).unwrap();
    let read = |n: &mut Node, m: &placement::Machine| n.set_machine(m.clone()).unwrap().updated;
    const GB: u64 = 1 << 30;
    m.gpus[0].own_use = Some(vec![(101, GB), (102, GB)]);
    assert_eq!(
        read(&mut n, &m),
        ["a", "b", "c"],
        "figures where there were none"
    );
    m.gpus[0].own_use = Some(vec![(101, 2 * GB), (102, GB)]);
    assert_eq!(read(&mut n, &m), ["a"]);
    m.gpus[0].own_use = Some(vec![(101, 2 * GB)]);
    assert_eq!(read(&mut n, &m), ["b"], "its process went");
    m.gpus[0].own_use = Some(vec![(101, 2 * GB), (102, GB), (103, GB)]);
    assert_eq!(
        read(&mut n, &m),
        ["b"],
        "its process came; 103 is no worker's"
    );
    m.gpus[0].energy_mj = Some(5);
    assert_eq!(
        read(&mut n, &m),
        Vec::<String>::new(),
        "only the counter moved"
    );
    m.gpus[0].own_use = None;
    assert_eq!(read(&mut n, &m), ["a", "b", "c"], "figures gone");

    // c's control group now holds 103: c is shown again with the next
    // reading, even one in which nothing moved.
    let id = n.worker("c").unwrap().id;
    n.set_cgroup_pids("c", id, vec![103]);
    assert_eq!(read(&mut n, &m), ["c"]);
    assert_eq!(read(&mut n, &m), Vec::<String>::new());
    m.gpus[0].own_use = Some(vec![(101, 2 * GB), (102, GB), (103, 3 * GB)]);
    assert_eq!(read(&mut n, &m), ["a", "b", "c"]);
    m.gpus[0].own_use = Some(vec![(101, 2 * GB), (102, GB), (103, GB)]);
    assert_eq!(read(&mut n, &m), ["c"]);
    assert!(n.audit().is_empty(), "{:?}", n.audit());
}

/// A reading that changes the machine (outside use, health) shows again
/// the workers on the GPUs that read differently and those it placed, not
/// every worker; all of them when the machine's name, in every warning,
/// changed. What each is told is the oracle: a worker not shown again reads
/// the same warnings and use before and after.
#[test]
fn a_changed_machine_shows_again_the_workers_on_the_gpus_that_changed() {
    let toml = l4s(3, 1);
    let mut n = node_on(&toml);
    submit_sharers(&mut n, "s", 6, "3");
    n.submit(&shared("big", "5"), 1).unwrap();
    assert_eq!(n.pending_count(), 1);
    type Seen = std::collections::BTreeMap<String, (Vec<String>, f64)>;
    let seen = |n: &Node| -> Seen {
        n.workers()
            .map(|w| {
                let view = astraeusd::views::worker_view(n, w);
                (w.name().to_string(), (view.warnings, view.gpu_used_gb))
            })
            .collect()
    };
    // Every worker that reads differently is shown again.
    let shown_if_changed = |before: &Seen, after: &Seen, c: &Changes| {
        for (name, view) in after {
            if before.get(name).is_some_and(|b| b != view) {
                assert!(c.updated.contains(name), "{name} not shown again: {view:?}");
            }
        }
    };
    let (on_0, on_1) = (names_on(&n, 0), names_on(&n, 1));
    assert_eq!(on_0.len(), 2);

    // GPU 0 grows outside use: over-promised, told to its two sharers only,
    // while every GPU's counters move (no view shows them).
    let mut m = sim::parse(&toml).unwrap();
    m.gpus[0].outside = astraeusd::quantity::Amount::whole(4);
    for g in &mut m.gpus {
        g.energy_mj = Some(7_000);
        g.power_mw = Some(61_000);
        g.utilization_pct = Some(40);
    }
    let before = seen(&n);
    let c = n.set_machine(m.clone()).unwrap();
    assert!(c.machine_changed);
    assert_eq!(c.updated, on_0);
    let after = seen(&n);
    for (name, view) in &after {
        assert_eq!(before[name] == *view, !c.updated.contains(name), "{name}");
    }

    // A sharer of the over-promised GPU 0 stops: what is promised there,
    // which the other's warning names, reads differently.
    let before = seen(&n);
    assert!(before[&on_0[1]].0[0].contains("over-promised: 6 GB promised"));
    let c = n.stop(&on_0[0], 1).unwrap();
    shown_if_changed(&before, &seen(&n), &c);
    assert!(c.updated.contains(&on_0[1]));

    // One of GPU 1's sharers stops (5 GB do not fit in the 4 left), then
    // GPU 1 loses its outside use: "big" is placed there by the reading
    // and shown with the sharer left on it.
    n.stop(&on_1[0], 1).unwrap();
    assert_eq!(n.pending_count(), 1);
    m.gpus[1].outside = astraeusd::quantity::Amount::ZERO;
    let c = n.set_machine(m.clone()).unwrap();
    assert_eq!(c.placed, ["big"]);
    assert_eq!(c.updated, ["big", on_1[1].as_str()]);

    // Another name for the machine: every worker, running or waiting.
    m.name = "other".into();
    let c = n.set_machine(m).unwrap();
    let all: Vec<String> = n.workers().map(|w| w.name().to_string()).collect();
    assert_eq!(c.updated, all);
    assert!(n.audit().is_empty(), "{:?}", n.audit());
}

/// Ops of the workers'-own property test: submit a sharer (tenths of a GB)
/// or a whole-GPU worker, either naming a holder; stop the `i`th live
/// worker; drop the holders of pid `p`; learn the `i`th worker's control
/// group; read what is the workers' own (the claims kept from it); restart.
#[derive(Clone, Debug)]
enum OwnOp {
    Submit {
        tenths: Option<u8>,
        holder: Option<u32>,
    },
    Stop(usize),
    DropHolder(u32),
    Cgroup(usize),
    Read,
    Restart,
}

proptest::proptest! {
    /// What a refresh is told is the workers' own (built once per GPU and
    /// kept while its use and the holders stay) is what a walk over the
    /// running workers and their grants says, after every step.
    #[test]
    fn own_is_what_a_walk_over_the_running_workers_claims(ops in proptest::collection::vec(
        {
            use proptest::prelude::*;
            prop_oneof![
                4 => (proptest::option::of(1u8..40), proptest::option::of(100u32..104))
                    .prop_map(|(tenths, holder)| OwnOp::Submit { tenths, holder }),
                2 => any::<usize>().prop_map(OwnOp::Stop),
                1 => (100u32..104).prop_map(OwnOp::DropHolder),
                1 => any::<usize>().prop_map(OwnOp::Cgroup),
                2 => Just(OwnOp::Read),
                1 => Just(OwnOp::Restart),
            ]
        },
        1..60,
    )) {
        use astraeusd::worker::Status;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.db");
        let open = || Node::open(Store::open(&path).unwrap(), sim::parse(&l4s(3, 1)).unwrap()).unwrap();
        let mut n = open();
        let names = |n: &Node| n.workers().map(|w| w.name().to_string()).collect::<Vec<_>>();
        for (k, op) in ops.into_iter().enumerate() {
            match op {
                OwnOp::Submit { tenths, holder } => {
                    let gpu = match tenths {
                        Some(t) => format!(r#"{{"count":1,"shared":true,"memory_gb":{}.{}}}"#, t / 10, t % 10),
                        None => r#"{"count":1}"#.to_string(),
                    };
                    let holders = holder.map(|p| format!(r#","holders":[{p}]"#)).unwrap_or_default();
                    let spec = format!(r#"{{"name":"w{k}"{holders},"requested_resources":{{"gpu_requests":{gpu}}}}}"#);
                    n.submit(&spec, 0).unwrap();
                }
                OwnOp::Stop(i) => {
                    let names = names(&n);
                    if !names.is_empty() {
                        n.stop(&names[i % names.len()], 0).unwrap();
                    }
                }
                OwnOp::DropHolder(pid) => {
                    n.keep_holders(|h, _| h.pid != pid).unwrap();
                }
                OwnOp::Cgroup(i) => {
                    let names = names(&n);
                    if !names.is_empty() {
                        let name = &names[i % names.len()];
                        n.set_cgroup(name, &format!("/workers/{name}")).unwrap();
                    }
                }
                OwnOp::Read => {
                    n.own();
                }
                OwnOp::Restart => {
                    drop(n);
                    n = open();
                }
            }
            // The oracle: every running worker's grants, in name order.
            let mut claims: std::collections::HashMap<String, Vec<astraeusd::inventory::Claim>> = Default::default();
            let mut groups = Vec::new();
            for w in n.workers() {
                let Status::Running { grants } = &w.status else { continue };
                for g in grants {
                    claims.entry(g.gpu_uuid.clone()).or_default().push(astraeusd::inventory::Claim {
                        worker: w.name().to_string(),
                        share: w.spec.shared_gb(),
                        holders: w.holders.iter().map(|h| h.pid).collect(),
                    });
                }
                if let Some(cgroup) = &w.cgroup {
                    groups.push(astraeusd::inventory::Group { worker: w.name().to_string(), id: w.id, cgroup: cgroup.clone() });
                }
            }
            let own = n.own();
            let told: std::collections::HashMap<String, Vec<astraeusd::inventory::Claim>> =
                own.on_gpu.iter().map(|(uuid, c)| (uuid.clone(), c.to_vec())).collect();
            proptest::prop_assert_eq!(told, claims);
            proptest::prop_assert_eq!(own.cgroups.to_vec(), groups);
        }
    }
}

/// A worker's view and a stop name the GPU it holds where that GPU is now:
/// after a reading without GPU 0, the GPU a worker was placed on as GPU 1
/// is GPU 0 (the oracle: the index the new machine gives its uuid).
#[test]
fn a_stop_after_renumbering_refreshes_the_gpu_by_its_index_now() {
    let toml = l4s(2, 0);
    let mut n = node_on(&toml);
    submit_sharers(&mut n, "s", 2, "6");
    assert_eq!(names_on(&n, 1), ["s1"]);
    let uuid = n.worker("s1").unwrap().grants()[0].gpu_uuid.clone();
    n.stop("s0", 1).unwrap();
    let mut m = sim::parse(&toml).unwrap();
    m.gpus.remove(0);
    m.gpus[0].index = 0;
    assert_eq!(m.gpus[0].uuid, uuid);
    n.set_machine(m).unwrap();
    // Its view names the GPU as the GPU objects and its warnings do.
    let view = astraeusd::views::worker_view(&n, n.worker("s1").unwrap());
    assert_eq!(view.gpus, [(0, uuid)]);
    assert_eq!(view.row.gpu_indices, [0]);
    assert_eq!(n.worker_use(n.worker("s1").unwrap())[0].0, 0);
    let c = n.stop("s1", 1).unwrap();
    assert_eq!(c.gpus, [0]);
}
