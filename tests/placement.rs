//! Table and property tests of the pure placement core.

use astraeusd::placement::{self, place, Book, Evaluations, Gpu, Grant, Machine, Mode};
use astraeusd::quantity::Amount;
use astraeusd::request::{GpuCount, GpuId, GpuRequest, Resources};
use proptest::prelude::*;

fn gb(s: &str) -> Amount {
    Amount::parse(s).unwrap()
}

fn gpu(index: u32, model: &str, total: &str, outside: &str) -> Gpu {
    Gpu {
        index,
        uuid: format!("GPU-{index}"),
        model: model.into(),
        vendor: "nvidia".into(),
        total: gb(total),
        outside: gb(outside),
        healthy: true,
        ..Gpu::default()
    }
}

fn machine(gpus: Vec<Gpu>) -> Machine {
    Machine {
        name: "majin".into(),
        wsl: false,
        cpu_cores: Amount::whole(16),
        memory_bytes: 64 << 30,
        gpus,
        driver: String::new(),
    }
}

fn shared(count: u32, mem: &str) -> Resources {
    Resources {
        gpu: Some(GpuRequest {
            count: GpuCount::Exactly(count),
            shared_gb: Some(gb(mem)),
            vendor: None,
            models: vec![],
            ids: vec![],
            healthy_only: true,
        }),
        ..Resources::default()
    }
}

fn whole(count: GpuCount) -> Resources {
    Resources {
        gpu: Some(GpuRequest {
            count,
            shared_gb: None,
            vendor: None,
            models: vec![],
            ids: vec![],
            healthy_only: true,
        }),
        ..Resources::default()
    }
}

fn run(
    m: &Machine,
    book: &mut Book,
    name: &str,
    res: &Resources,
) -> Result<Vec<Grant>, Vec<String>> {
    let v = place(m, book, res, &mut Evaluations::default());
    if let Ok(g) = &v {
        book.add(name, res, g);
    }
    v
}

fn indexes(g: &[Grant]) -> Vec<u32> {
    g.iter().map(|g| g.gpu_index).collect()
}

#[test]
fn fullest_gpu_wins_design_pin() {
    // A 24 GB with 10 taken, B 8 GB with 2 taken: a 4 GB request goes to B.
    let m = machine(vec![gpu(0, "A", "24", "0"), gpu(1, "B", "8", "0")]);
    let mut book = Book::default();
    run(&m, &mut book, "a10", &{
        let mut r = shared(1, "10");
        r.gpu.as_mut().unwrap().ids = vec![GpuId::Index(0)];
        r
    })
    .unwrap();
    run(&m, &mut book, "b2", &{
        let mut r = shared(1, "2");
        r.gpu.as_mut().unwrap().ids = vec![GpuId::Index(1)];
        r
    })
    .unwrap();
    assert_eq!(
        indexes(&run(&m, &mut book, "x", &shared(1, "4")).unwrap()),
        vec![1]
    );
}

#[test]
fn empty_gpus_open_smallest_first_and_only_when_no_shared_fits() {
    let m = machine(vec![
        gpu(0, "big", "24", "0"),
        gpu(1, "small", "8", "0"),
        gpu(2, "mid", "16", "0"),
    ]);
    let mut book = Book::default();
    // First shared work opens the smallest GPU that fits.
    assert_eq!(
        indexes(&run(&m, &mut book, "a", &shared(1, "6")).unwrap()),
        vec![1]
    );
    // 6 more does not fit on GPU 1 (8): opens the smallest that fits, 16 GB.
    assert_eq!(
        indexes(&run(&m, &mut book, "b", &shared(1, "6")).unwrap()),
        vec![2]
    );
    // 2 fits on both shared GPUs: GPU 1 has 2 left → 0 after, GPU 2 has 10 → 8.
    assert_eq!(
        indexes(&run(&m, &mut book, "c", &shared(1, "2")).unwrap()),
        vec![1]
    );
    assert_eq!(book.mode("GPU-0"), Mode::Free, "the big GPU stays whole");
    // A whole request takes the free GPU, never a shared one.
    assert_eq!(
        indexes(&run(&m, &mut book, "w", &whole(GpuCount::Exactly(1))).unwrap()),
        vec![0]
    );
    let reasons = run(&m, &mut book, "w2", &whole(GpuCount::Exactly(1))).unwrap_err();
    assert_eq!(
        reasons,
        vec![
            "GPU 0 of majin is held whole by w",
            "GPU 1 of majin is shared by 2 workers; it needs it whole",
            "GPU 2 of majin is shared by 1 worker; it needs it whole",
        ]
    );
    // Shared work never lands on a whole GPU.
    let reasons = run(&m, &mut book, "s", &shared(1, "20")).unwrap_err();
    assert_eq!(reasons[0], "GPU 0 of majin is held whole by w");
}

#[test]
fn count_takes_distinct_gpus() {
    let m = machine(vec![
        gpu(0, "L4", "8", "0"),
        gpu(1, "L4", "8", "0"),
        gpu(2, "L4", "8", "0"),
    ]);
    let mut book = Book::default();
    let g = run(&m, &mut book, "two", &shared(2, "3")).unwrap();
    assert_eq!(indexes(&g), vec![0, 1]);
    let g = run(&m, &mut book, "three", &shared(3, "5")).unwrap();
    assert_eq!(indexes(&g), vec![0, 1, 2]);
    // GPUs 0 and 1 are full (3 + 5); only GPU 2 has room.
    let r = run(&m, &mut book, "more", &shared(2, "1")).unwrap_err();
    assert_eq!(r.last().unwrap(), "it fits on 1 GPU of majin; it needs 2");
    assert_eq!(
        indexes(&run(&m, &mut book, "one", &shared(1, "1")).unwrap()),
        vec![2]
    );
    let r = run(&m, &mut book, "four", &shared(4, "0.5")).unwrap_err();
    assert_eq!(r.last().unwrap(), "majin has 3 GPUs that match; it needs 4");
}

#[test]
fn policy_all_takes_every_gpu_or_waits() {
    let m = machine(vec![gpu(0, "A100", "80", "0"), gpu(1, "A100", "80", "0")]);
    let mut book = Book::default();
    assert_eq!(
        indexes(&run(&m, &mut book, "all", &whole(GpuCount::All)).unwrap()),
        vec![0, 1]
    );
    let r = run(&m, &mut book, "all2", &whole(GpuCount::All)).unwrap_err();
    assert_eq!(r.len(), 2);
    book.remove(
        "all",
        &whole(GpuCount::All),
        &[
            Grant {
                gpu_uuid: "GPU-0".into(),
                gpu_index: 0,
                share: None,
            },
            Grant {
                gpu_uuid: "GPU-1".into(),
                gpu_index: 1,
                share: None,
            },
        ],
    );
    run(&m, &mut book, "s", &shared(1, "1")).unwrap();
    let r = run(&m, &mut book, "all3", &whole(GpuCount::All)).unwrap_err();
    assert_eq!(
        r,
        vec!["GPU 0 of majin is shared by 1 worker; it needs it whole"]
    );
}

#[test]
fn filters_and_health() {
    let mut m = machine(vec![
        gpu(0, "NVIDIA GeForce RTX 4060", "8", "1"),
        gpu(1, "NVIDIA L4", "24", "0"),
    ]);
    m.gpus[1].healthy = false;
    let book = Book::default();
    let mut r = shared(1, "2");
    r.gpu.as_mut().unwrap().models = vec!["a100".into()];
    assert_eq!(
        place(&m, &book, &r, &mut Evaluations::default()).unwrap_err(),
        vec!["no GPU of majin is an a100"]
    );
    r.gpu.as_mut().unwrap().models = vec!["l4".into()];
    assert_eq!(
        place(&m, &book, &r, &mut Evaluations::default()).unwrap_err(),
        vec!["GPU 1 of majin is unhealthy"]
    );
    r.gpu.as_mut().unwrap().healthy_only = false;
    assert_eq!(
        indexes(&place(&m, &book, &r, &mut Evaluations::default()).unwrap()),
        vec![1]
    );
    r.gpu.as_mut().unwrap().models = vec![];
    r.gpu.as_mut().unwrap().vendor = Some("AMD".into());
    assert_eq!(
        place(&m, &book, &r, &mut Evaluations::default()).unwrap_err(),
        vec!["no GPU of majin is made by AMD"]
    );
    r.gpu.as_mut().unwrap().vendor = Some("NVIDIA".into());
    r.gpu.as_mut().unwrap().ids = vec![GpuId::Uuid("GPU-0".into())];
    assert_eq!(
        indexes(&place(&m, &book, &r, &mut Evaluations::default()).unwrap()),
        vec![0]
    );
}

#[test]
fn sliced_gpus_are_never_offered() {
    let mut m = machine(vec![gpu(0, "A100", "80", "0"), gpu(1, "L4", "24", "0")]);
    m.gpus[0].sliced = true;
    let mut book = Book::default();
    assert_eq!(
        indexes(&run(&m, &mut book, "w", &whole(GpuCount::All)).unwrap()),
        vec![1]
    );
    m.gpus[1].sliced = true;
    let r = place(
        &m,
        &Book::default(),
        &shared(1, "1"),
        &mut Evaluations::default(),
    )
    .unwrap_err();
    assert!(r[0].starts_with("no GPU of majin is offered"), "{r:?}");
}

/// A MIG instance is a GPU of its own, offered whole only: a whole request
/// takes it; a shared one never does, and says why.
#[test]
fn mig_instances_are_offered_whole_only() {
    let mut m = machine(vec![
        gpu(0, "A100", "80", "0"),
        gpu(1, "A100 MIG 3g.40gb", "40", "0"),
    ]);
    m.gpus[0].mig = placement::Mig::On;
    m.gpus[1].mig_of = Some(m.gpus[0].uuid.clone());
    let r = place(
        &m,
        &Book::default(),
        &shared(1, "10"),
        &mut Evaluations::default(),
    )
    .unwrap_err();
    assert!(
        r.iter().any(|l| l
            == "GPU 1 of majin is a MIG instance: it is offered whole only (memory limits do not \
                apply to MIG instances)"),
        "{r:?}"
    );
    let mut book = Book::default();
    let g = run(&m, &mut book, "w", &whole(GpuCount::Exactly(1))).unwrap();
    assert_eq!(indexes(&g), vec![1]);
}

/// A GPU in MIG mode runs no work of its own: it is never offered, by
/// memory or whole, and a request it could have served says why; one whose
/// MIG mode is only pending still runs work, and is offered.
#[test]
fn mig_gpus_are_never_offered_and_say_why() {
    let mut m = machine(vec![gpu(0, "A100", "80", "0"), gpu(1, "L4", "24", "0")]);
    m.gpus[0].mig = placement::Mig::On;
    let mut book = Book::default();
    assert_eq!(
        indexes(&run(&m, &mut book, "w", &whole(GpuCount::All)).unwrap()),
        vec![1]
    );
    // Shared work that fits only its 80 GB waits, saying so.
    let r = place(&m, &book, &shared(1, "30"), &mut Evaluations::default()).unwrap_err();
    assert!(
        r.iter().any(|l| l.starts_with(
            "GPU 0 of majin is in MIG mode: it runs no work of its own; its MIG instances \
             are offered whole"
        )),
        "{r:?}"
    );
    // Named by index, alone.
    let mut named = shared(1, "1");
    named.gpu.as_mut().unwrap().ids = vec![GpuId::Index(0)];
    let r = place(&m, &Book::default(), &named, &mut Evaluations::default()).unwrap_err();
    assert!(r[0].starts_with("GPU 0 of majin is in MIG mode"), "{r:?}");
    // Pending: offered now, and warned of.
    m.gpus[0].mig = placement::Mig::Pending;
    let g = run(&m, &mut Book::default(), "p", &shared(1, "30")).unwrap();
    assert_eq!(indexes(&g), vec![0]);
    assert!(m.gpus[0]
        .mig_warning("majin")
        .unwrap()
        .starts_with("MIG mode is pending on GPU 0 of majin"));
    assert_eq!(m.gpus[1].mig_warning("majin"), None);
}

#[test]
fn wsl_shared_work_takes_its_memory_on_every_gpu() {
    let mut m = machine(vec![gpu(0, "A", "8", "1"), gpu(1, "B", "4", "0")]);
    m.wsl = true;
    let mut book = Book::default();
    let g = run(&m, &mut book, "a", &shared(1, "3")).unwrap();
    assert_eq!(g.len(), 2);
    assert!(g.iter().all(|g| g.share == Some(gb("3"))));
    // 1.5 more fits on GPU 0 (3 of 7) but not on GPU 1 (3 of 4): it waits.
    let r = run(&m, &mut book, "b", &shared(1, "1.5")).unwrap_err();
    assert_eq!(
        r,
        vec!["GPU 1 of majin: 3 of 4 GB taken by shared work; it needs 1.5"]
    );
}

#[test]
fn host_cores_and_memory_are_promised_too() {
    let m = machine(vec![gpu(0, "A", "8", "0")]);
    let mut book = Book::default();
    let mut r = shared(1, "1");
    r.cpu_cores = Amount::whole(12);
    r.memory_bytes = 40 << 30;
    run(&m, &mut book, "a", &r).unwrap();
    let reasons = run(&m, &mut book, "b", &r).unwrap_err();
    assert_eq!(
        reasons,
        vec![
            "host majin: 12 of 16 CPU cores promised to workers; it needs 12",
            "host majin: 40 of 64 GB of memory promised to workers; it needs 40",
        ]
    );
}

#[test]
fn a_summary_names_at_most_eight_sharers_and_counts_the_rest() {
    let m = machine(vec![gpu(0, "L4", "24", "0")]);
    let mut book = Book::default();
    for i in 0..11 {
        run(&m, &mut book, &format!("w{i:02}"), &shared(1, "0.5")).unwrap();
    }
    let line = placement::sharers_line(book.usage("GPU-0"));
    assert_eq!(
        line,
        "shared: w00 0.5 GB, w01 0.5 GB, w02 0.5 GB, w03 0.5 GB, w04 0.5 GB, w05 0.5 GB, \
         w06 0.5 GB, w07 0.5 GB, and 3 more — 5.5 GB taken"
    );
}

#[test]
fn seed_lines() {
    let m = machine(vec![gpu(0, "NVIDIA GeForce RTX 4060", "8", "1")]);
    let mut book = Book::default();
    run(&m, &mut book, "listen", &shared(1, "2.2")).unwrap();
    run(&m, &mut book, "voice", &shared(1, "4.2")).unwrap();
    assert_eq!(
        placement::sharers_line(book.usage("GPU-0")),
        "shared: listen 2.2 GB, voice 4.2 GB — 6.4 GB taken"
    );
    assert_eq!(
        run(&m, &mut book, "x", &shared(1, "1.5")).unwrap_err(),
        vec!["GPU 0 of majin: 6.4 of 7 GB taken by shared work; it needs 1.5"]
    );
    assert_eq!(
        run(&m, &mut book, "y", &shared(1, "7.5")).unwrap_err(),
        vec!["GPU 0 of majin offers 7 of its 8 GB (1 GB held outside Astraeus); it needs 7.5"]
    );
}

// ---- property tests over random sequences ----

/// Right after a placement, every GPU it touched carries at most what it offers.
fn within_offered(m: &Machine, book: &Book, grants: &[Grant]) {
    for g in grants {
        let gpu = m.gpus.iter().find(|x| x.uuid == g.gpu_uuid).unwrap();
        assert!(
            book.taken(&g.gpu_uuid) <= gpu.offered(),
            "GPU {} has {} of {} GB promised",
            gpu.index,
            book.taken(&g.gpu_uuid),
            gpu.offered()
        );
    }
}

/// An independent judge of "could it be placed now": every GPU is tried by
/// the rules as the design states them, from the running workers' own
/// grants (not the book): a shared request fits a GPU no one holds whole
/// whose shares plus its own stay within total less outside, in bytes; a
/// whole request fits an empty GPU; it needs `count` such GPUs (all of them
/// for `all`); a MIG instance takes whole work only. Not for WSL pools
/// (there a share lands on every GPU).
fn brute_fits(m: &Machine, running: &[(String, Resources, Vec<Grant>)], res: &Resources) -> bool {
    let Some(q) = res.gpu.as_ref() else {
        return true;
    };
    let fits_on = |g: &Gpu| {
        let on: Vec<&Grant> = running
            .iter()
            .flat_map(|r| r.2.iter())
            .filter(|x| x.gpu_uuid == g.uuid)
            .collect();
        match q.shared_gb {
            Some(_) if g.mig_of.is_some() => false,
            Some(need) => {
                let shares: Option<u64> = on.iter().map(|x| x.share.map(|s| s.bytes())).sum();
                shares.is_some_and(|taken| {
                    taken + need.bytes() <= g.total.bytes().saturating_sub(g.outside.bytes())
                })
            }
            None => on.is_empty(),
        }
    };
    let fitting = m.gpus.iter().filter(|g| fits_on(g)).count();
    match q.count {
        GpuCount::Exactly(c) => fitting >= c as usize,
        GpuCount::All => fitting == m.gpus.len(),
    }
}

#[derive(Clone, Debug)]
enum Op {
    Submit {
        shared: Option<u64>,
        count: u32,
        all: bool,
    },
    Stop(usize),
    Outside {
        gpu: usize,
        hundredths: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        // Whole GB half the time: GPUs filled to the byte come often.
        4 => (prop::option::weighted(0.8, prop_oneof![1u64..900, (1u64..9).prop_map(|gb| gb * 100)]), 1u32..3, prop::bool::weighted(0.05))
            .prop_map(|(shared, count, all)| Op::Submit { shared, count, all: all && shared.is_none() }),
        2 => (0usize..64).prop_map(Op::Stop),
        1 => (0usize..4, 0u64..400).prop_map(|(gpu, hundredths)| Op::Outside { gpu, hundredths }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn invariants_hold_over_random_sequences(
        sizes in prop::collection::vec(prop_oneof![Just("8"), Just("12"), Just("24")], 1..4),
        wsl in prop::bool::weighted(0.2),
        ops in prop::collection::vec(op(), 1..60),
        instances in prop::collection::vec(prop::bool::weighted(0.25), 4),
    ) {
        let mut m = machine(sizes.iter().enumerate().map(|(i, s)| gpu(i as u32, "G", s, "0")).collect());
        m.wsl = wsl;
        // Some GPUs are MIG instances (of a parent not listed): whole work only.
        for (g, instance) in m.gpus.iter_mut().zip(&instances) {
            if *instance {
                g.mig_of = Some("GPU-parent".into());
            }
        }
        let mut book = Book::default();
        // (name, resources, grants) for running; (name, resources) for pending, oldest first.
        let mut running: Vec<(String, Resources, Vec<Grant>)> = Vec::new();
        let mut pending: Vec<(String, Resources)> = Vec::new();
        let mut next = 0;
        let reexamine = |m: &Machine, book: &mut Book, running: &mut Vec<(String, Resources, Vec<Grant>)>, pending: &mut Vec<(String, Resources)>| {
            let mut still = Vec::new();
            for (name, res) in pending.drain(..) {
                match place(m, book, &res, &mut Evaluations::default()) {
                    Ok(g) => {
                        book.add(&name, &res, &g);
                        within_offered(m, book, &g);
                        running.push((name, res, g));
                    }
                    Err(_) => still.push((name, res)),
                }
            }
            *pending = still;
        };
        for op in ops {
            match op {
                Op::Submit { shared: s, count, all } => {
                    let res = match (s, all) {
                        (Some(h), _) => shared(count, &Amount::from_hundredths(h).to_string()),
                        (None, true) => whole(GpuCount::All),
                        (None, false) => whole(GpuCount::Exactly(count)),
                    };
                    next += 1;
                    let name = format!("w{next}");
                    let could = brute_fits(&m, &running, &res);
                    match place(&m, &book, &res, &mut Evaluations::default()) {
                        Ok(g) => {
                            prop_assert!(could || m.wsl, "placed what the judge says cannot fit");
                            let distinct: std::collections::HashSet<_> = g.iter().map(|g| &g.gpu_uuid).collect();
                            prop_assert_eq!(distinct.len(), g.len(), "GPUs are distinct");
                            book.add(&name, &res, &g);
                            within_offered(&m, &book, &g);
                            running.push((name, res, g));
                        }
                        Err(reasons) => {
                            prop_assert!(!reasons.is_empty());
                            pending.push((name, res));
                        }
                    }
                }
                Op::Stop(i) => {
                    if !running.is_empty() {
                        let (name, res, g) = running.remove(i % running.len());
                        book.remove(&name, &res, &g);
                        reexamine(&m, &mut book, &mut running, &mut pending);
                    }
                }
                Op::Outside { gpu, hundredths } => {
                    let n = m.gpus.len();
                    let g = &mut m.gpus[gpu % n];
                    g.outside = Amount::from_hundredths(hundredths).min(g.total);
                    reexamine(&m, &mut book, &mut running, &mut pending);
                }
            }
            // Invariants after every step.
            for g in &m.gpus {
                let u = book.usage(&g.uuid);
                if let Some(u) = u {
                    prop_assert!(u.whole.is_none() || u.sharers().is_empty(), "whole XOR shared");
                    prop_assert!(g.mig_of.is_none() || u.sharers().is_empty(), "no share on a MIG instance");
                    // The total kept as sharers come and go is their sum.
                    let sum = u.sharers().values().fold(Amount::ZERO, |a, &b| a + b);
                    prop_assert_eq!(u.taken(), sum, "taken is the sum of the shares");
                }
            }
            for (name, res) in &pending {
                prop_assert!(m.wsl || !brute_fits(&m, &running, res), "pending {} fits now, by the judge", name);
                let v = place(&m, &book, res, &mut Evaluations::default());
                prop_assert!(v.is_err(), "pending {} would fit now", name);
                let reasons = v.unwrap_err();
                prop_assert!(!reasons.is_empty(), "pending {} has no reason", name);
                // A reason line for every GPU that could have served (no filters here).
                // Every GPU that refused it says why, unless the count alone is short.
                let count_short = reasons.iter().any(|r| r.contains(" that match") || r.starts_with("it fits on"));
                for g in &m.gpus {
                    let named = reasons.iter().any(|r| r.starts_with(&format!("GPU {} of", g.index)));
                    let fits_alone = res.gpu.as_ref().is_some_and(|q| q.shared_gb.is_some_and(|need| g.mig_of.is_none() && book.mode(&g.uuid) != Mode::Whole && book.taken(&g.uuid) + need <= g.offered()))
                        || book.usage(&g.uuid).is_none() && res.gpu.as_ref().is_some_and(|q| q.shared_gb.is_none());
                    prop_assert!(named || fits_alone || count_short, "{}: GPU {} unexplained in {:?}", name, g.index, reasons);
                }
            }
        }
        // Shares placed while the GPU offered enough: sum ≤ offered at placement,
        // so with outside use never above the value at placement time it holds now.
        for g in &m.gpus {
            if g.outside.is_zero() {
                prop_assert!(book.taken(&g.uuid) <= g.offered(), "sum of shares ≤ offered");
            }
        }
    }
}

/// One step the engine may take, for the engine-against-model property.
#[derive(Clone, Debug)]
enum Step {
    Submit {
        shared: Option<u64>,
        count: u32,
        cores: u32,
        id: Option<u32>,
    },
    Stop(usize),
    Outside {
        gpu: usize,
        hundredths: u64,
    },
    Health {
        gpu: usize,
        healthy: bool,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        5 => (prop::option::weighted(0.8, 1u64..900), 1u32..3, prop::option::weighted(0.3, 1u32..8), prop::option::weighted(0.2, 0u32..4))
            .prop_map(|(shared, count, cores, id)| Step::Submit { shared, count, cores: cores.unwrap_or(0), id }),
        3 => (0usize..64).prop_map(Step::Stop),
        1 => (0usize..4, 0u64..600).prop_map(|(gpu, hundredths)| Step::Outside { gpu, hundredths }),
        1 => (0usize..4, prop::bool::ANY).prop_map(|(gpu, healthy)| Step::Health { gpu, healthy }),
    ]
}

fn spec_json(name: &str, s: &Step) -> String {
    let Step::Submit {
        shared,
        count,
        cores,
        id,
    } = s
    else {
        unreachable!()
    };
    let mut gpu = format!(r#""count":{count}"#);
    if let Some(h) = shared {
        gpu.push_str(&format!(
            r#","shared":true,"memory_gb":{}"#,
            Amount::from_hundredths(*h)
        ));
    }
    if let Some(i) = id {
        gpu.push_str(&format!(r#","ids":[{i}]"#));
    }
    let cores = if *cores > 0 {
        format!(r#""cpu_cores":{cores},"#)
    } else {
        String::new()
    };
    format!(r#"{{"name":"{name}","requested_resources":{{{cores}"gpu_requests":{{{gpu}}}}}}}"#)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(150))]
    /// The engine re-examines only where a change gave capacity back and
    /// builds no reasons on the way; a naive model re-examines every pending
    /// worker in full after every change. Both must agree on every placement.
    #[test]
    fn the_engine_places_exactly_as_a_full_reexamination(
        sizes in prop::collection::vec(prop_oneof![Just("8"), Just("12"), Just("24")], 1..5),
        steps in prop::collection::vec(step(), 1..60),
    ) {
        use astraeusd::node::{Node, Status};
        use astraeusd::request::WorkerSpec;
        let mut m = machine(sizes.iter().enumerate().map(|(i, s)| gpu(i as u32, "G", s, "0")).collect());
        let mut node = Node::open(astraeusd::store::Store::open_in_memory().unwrap(), m.clone()).unwrap();
        let mut book = Book::default();
        let mut running: Vec<(String, Resources, Vec<Grant>)> = Vec::new();
        let mut pending: Vec<(String, Resources)> = Vec::new();
        let full_pass = |m: &Machine, book: &mut Book, running: &mut Vec<(String, Resources, Vec<Grant>)>, pending: &mut Vec<(String, Resources)>| {
            let mut still = Vec::new();
            for (name, res) in pending.drain(..) {
                match place(m, book, &res, &mut Evaluations::default()) {
                    Ok(g) => { book.add(&name, &res, &g); running.push((name, res, g)); }
                    Err(_) => still.push((name, res)),
                }
            }
            *pending = still;
        };
        for (n, s) in steps.iter().enumerate() {
            match s {
                Step::Submit { .. } => {
                    let name = format!("w{n}");
                    let text = spec_json(&name, s);
                    let res = WorkerSpec::parse(&text).unwrap().resources;
                    // The oracle for "impossible": the model's own machine,
                    // emptied of work and outside use, every GPU healthy.
                    let mut empty = m.clone();
                    for g in &mut empty.gpus {
                        g.outside = Amount::ZERO;
                        g.healthy = true;
                        g.problem = None;
                    }
                    let possible = place(&empty, &Book::default(), &res, &mut Evaluations::default()).is_ok();
                    match node.submit(&text, 1) {
                        Err(e) => {
                            prop_assert_eq!(e.kind(), "Unsatisfiable", "{}", e);
                            prop_assert!(!possible, "{} refused but could fit an empty machine: {}", name, e);
                            continue;
                        }
                        Ok(_) => prop_assert!(possible, "{} accepted but could never fit", name),
                    }
                    match place(&m, &book, &res, &mut Evaluations::default()) {
                        Ok(g) => { book.add(&name, &res, &g); running.push((name, res, g)); }
                        Err(_) => pending.push((name, res)),
                    }
                }
                Step::Stop(i) => {
                    if !running.is_empty() {
                        let (name, res, g) = running.remove(i % running.len());
                        node.stop(&name, 1).unwrap();
                        book.remove(&name, &res, &g);
                        full_pass(&m, &mut book, &mut running, &mut pending);
                    }
                }
                Step::Outside { gpu, hundredths } => {
                    let k = gpu % m.gpus.len();
                    m.gpus[k].outside = Amount::from_hundredths(*hundredths).min(m.gpus[k].total);
                    node.set_machine(m.clone()).unwrap();
                    full_pass(&m, &mut book, &mut running, &mut pending);
                }
                Step::Health { gpu, healthy } => {
                    let k = gpu % m.gpus.len();
                    m.gpus[k].healthy = *healthy;
                    node.set_machine(m.clone()).unwrap();
                    full_pass(&m, &mut book, &mut running, &mut pending);
                }
            }
            for (name, _, grants) in &running {
                let w = node.worker(name).unwrap();
                prop_assert_eq!(&w.status, &Status::Running { grants: grants.clone() }, "{}", name);
            }
            for (name, res) in &pending {
                prop_assert_eq!(&node.worker(name).unwrap().status, &Status::Pending, "{}", name);
                // Reasons asked now are the ones the full placement gives now.
                let want = place(&m, &book, res, &mut Evaluations::default()).unwrap_err();
                prop_assert_eq!(node.reasons(name), want, "{}", name);
            }
            prop_assert_eq!(node.workers().count(), running.len() + pending.len());
            prop_assert!(node.audit().is_empty(), "{:?}", node.audit());
        }
    }
}

/// What no state of the machine could serve, told apart from what waits.
#[test]
fn never_fits_only_what_an_emptied_machine_cannot_hold() {
    let mut m = machine(vec![
        gpu(0, "L4", "24", "0"),
        gpu(1, "L4", "24", "0"),
        gpu(2, "H100", "80", "10"),
    ]);
    let four = placement::never_fits(&m, &whole(GpuCount::Exactly(4))).unwrap();
    assert_eq!(
        four.last().unwrap(),
        "majin has 3 GPUs that match; it needs 4"
    );
    let big3 = placement::never_fits(&m, &shared(3, "50")).unwrap();
    assert_eq!(
        big3.last().unwrap(),
        "it fits on 1 GPU of majin; it needs 3"
    );
    // Outside use and ill health pass; work leaves: these only wait.
    assert_eq!(placement::never_fits(&m, &shared(1, "75")), None);
    m.gpus[2].healthy = false;
    assert_eq!(placement::never_fits(&m, &shared(1, "75")), None);
    assert_eq!(
        placement::never_fits(&m, &whole(GpuCount::Exactly(3))),
        None
    );
}
