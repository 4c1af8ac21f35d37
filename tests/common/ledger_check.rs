//! What every crash test checks after a kill: the ledger agrees with every
//! acknowledged operation. Shared by tests/crash.rs (the engine in a child
//! process) and tests/storm.rs (the daemon over D-Bus with several clients).
//! Include with `#[path = "common/ledger_check.rs"] mod ledger_check;`.
#![allow(dead_code)]

use astraeusd::inventory::sim;
use astraeusd::node::{Node, Status};
use astraeusd::quantity::Amount;
use astraeusd::store::Store;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

pub const MACHINE: &str = r#"
machine = "crash"
cpu_cores = 64
memory_gb = 256
[[gpu]]
model = "RTX 4060"
total_gb = 8
outside_gb = 1
[[gpu]]
model = "L4"
total_gb = 24
[[gpu]]
model = "A10"
total_gb = 12
outside_gb = 0.5
"#;

/// xorshift64*: a tiny seeded generator, so a failure replays exactly.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A random worker spec: a whole GPU, or a share of 0.5 to 6.5 GB on one or two GPUs.
pub fn spec(rng: &mut Rng, name: &str) -> String {
    match rng.below(4) {
        0 => {
            format!(r#"{{"name":"{name}","requested_resources":{{"gpu_requests":{{"count":1}}}}}}"#)
        }
        _ => {
            let gb = Amount::from_hundredths(50 + rng.below(600));
            let count = 1 + rng.below(2);
            format!(
                r#"{{"name":"{name}","requested_resources":{{"cpu_cores":1,"gpu_requests":{{"count":{count},"shared":true,"memory_gb":{gb}}}}}}}"#
            )
        }
    }
}

/// What the acknowledged log says must be live, and the names whose last
/// operation was cut off by a kill (committed or not: either outcome is allowed).
pub fn expected(log: &str) -> (HashSet<String>, HashSet<String>) {
    let mut live = HashSet::new();
    let mut uncertain = HashSet::new();
    let mut in_flight: Option<String> = None;
    for line in log.lines() {
        let parts: Vec<&str> = line.split(' ').collect();
        match parts.as_slice() {
            ["begin", _, name] => {
                uncertain.extend(in_flight.replace(name.to_string()));
            }
            ["ack", op, name] => {
                if *op == "submit" {
                    live.insert(name.to_string());
                } else {
                    live.remove(*name);
                }
                uncertain.remove(*name);
                in_flight = None;
            }
            _ => {} // a torn last line
        }
    }
    uncertain.extend(in_flight);
    (live, uncertain)
}

/// Checks the ledger at `db` against the acknowledgement logs (one per
/// client, each sequential): nothing
/// acknowledged lost, nothing stopped still live, no orphan allocation, no GPU
/// over-promised or both whole and shared, and every pending worker waits
/// for a reason (it does not fit now).
pub fn check(db: &Path, logs: &[String], seed: u64) {
    let machine = sim::parse(MACHINE).unwrap();
    let store = Store::open(db).unwrap();
    assert_eq!(
        store.orphan_allocations().unwrap(),
        0,
        "orphan allocation (seed {seed})"
    );
    let rows = store.live_workers().unwrap();
    let mut names = HashSet::new();
    let mut taken: HashMap<String, Amount> = HashMap::new();
    let mut whole: HashSet<String> = HashSet::new();
    for r in &rows {
        assert!(
            names.insert(r.name.clone()),
            "{} is live twice (seed {seed})",
            r.name
        );
        for g in &r.grants {
            match g.share {
                Some(s) => {
                    *taken.entry(g.gpu_uuid.clone()).or_default() =
                        taken.get(&g.gpu_uuid).copied().unwrap_or_default() + s
                }
                None => assert!(
                    whole.insert(g.gpu_uuid.clone()),
                    "GPU held whole twice (seed {seed})"
                ),
            }
        }
    }
    for g in &machine.gpus {
        let t = taken.get(&g.uuid).copied().unwrap_or_default();
        assert!(
            t <= g.offered(),
            "GPU {} has {t} of {} GB promised (seed {seed})",
            g.index,
            g.offered()
        );
        assert!(
            t.is_zero() || !whole.contains(&g.uuid),
            "GPU {} whole and shared (seed {seed})",
            g.index
        );
    }
    let (mut must_live, mut uncertain) = (HashSet::new(), HashSet::new());
    for log in logs {
        let (live, unsure) = expected(log);
        must_live.extend(live);
        uncertain.extend(unsure);
    }
    for name in &must_live {
        assert!(
            names.contains(name) || uncertain.contains(name),
            "acknowledged worker {name} was lost (seed {seed})"
        );
    }
    for name in &names {
        assert!(
            must_live.contains(name) || uncertain.contains(name),
            "worker {name} is live but its stop was acknowledged (seed {seed})"
        );
    }
    // Reopening the engine converges: no pending worker that fits now, every
    // pending worker has a reason.
    let node = Node::open(store, machine).unwrap();
    assert!(node.audit().is_empty(), "{:?} (seed {seed})", node.audit());
    let mut node = node;
    let pending: Vec<String> = node
        .workers()
        .filter(|w| matches!(w.status, Status::Pending))
        .map(|w| w.spec_text.to_string())
        .collect();
    for text in pending {
        assert!(
            node.why_not(&text).unwrap().is_err(),
            "a pending worker fits now (seed {seed})"
        );
    }
}

/// A seed from `var` (to replay a run), else from the clock; printed by the caller.
pub fn seed_from_env(var: &str) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        })
}

/// How many rounds, from `var` when set.
pub fn count_from_env(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

pub const CLIENTS: u64 = 4;

/// One client: sequential calls, each logged as `begin` before and `ack` after
/// the daemon answered; stops only workers it knows are live.
pub fn client(
    address: String,
    id: u64,
    round: u64,
    seed: u64,
    log: Arc<Mutex<String>>,
    live: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
) -> u64 {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let Ok(conn) = zbus::connection::Builder::address(address.as_str())
            .build()
            .await
        else {
            return 0;
        };
        let mut rng = Rng(seed | 1);
        let mut acked = 0;
        for n in 0.. {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let victim = {
                let live = live.lock().unwrap();
                // Stop more often once a client holds many: the ledger stays
                // about the same size however many kills a run has.
                let stop_one = if live.len() > 12 {
                    rng.below(2) == 0
                } else {
                    rng.below(3) == 0
                };
                (!live.is_empty() && stop_one)
                    .then(|| live[rng.below(live.len() as u64) as usize].clone())
            };
            let (op, name, result) = match victim {
                Some(name) => {
                    log.lock()
                        .unwrap()
                        .push_str(&format!("begin stop {name}\n"));
                    let r = conn
                        .call_method(
                            Some("org.astraeus.Node1"),
                            "/org/astraeus/Node1",
                            Some("org.astraeus.Node1.Manager"),
                            "StopWorker",
                            &(name.as_str(),),
                        )
                        .await;
                    ("stop", name, r)
                }
                None => {
                    let name = format!("c{id}-{round}-{n}");
                    let text = spec(&mut rng, &name);
                    log.lock()
                        .unwrap()
                        .push_str(&format!("begin submit {name}\n"));
                    let r = conn
                        .call_method(
                            Some("org.astraeus.Node1"),
                            "/org/astraeus/Node1",
                            Some("org.astraeus.Node1.Manager"),
                            "SubmitWorker",
                            &(text.as_str(),),
                        )
                        .await;
                    ("submit", name, r)
                }
            };
            match result {
                Ok(_) => {
                    log.lock().unwrap().push_str(&format!("ack {op} {name}\n"));
                    let mut live = live.lock().unwrap();
                    if op == "submit" {
                        live.push(name);
                    } else {
                        live.retain(|l| *l != name);
                    }
                    acked += 1;
                }
                // A typed refusal is an answer too: nothing changed.
                Err(zbus::Error::MethodError(err, _, _))
                    if err.as_str().starts_with("org.astraeus.Node1.Error.") =>
                {
                    let mut l = log.lock().unwrap();
                    // Undo the begin: the daemon answered that nothing happened.
                    let cut = l.len() - format!("begin {op} {name}\n").len();
                    l.truncate(cut);
                }
                // The daemon died mid-call: this operation stays uncertain.
                Err(_) => break,
            }
        }
        acked
    })
}
