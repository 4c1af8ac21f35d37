//! Crash storm over D-Bus: several clients submit and stop workers while the
//! daemon is SIGKILLed at random moments and restarted, many times over.
//! After each kill the ledger must agree with every acknowledged call
//! (acknowledged ⇒ durable; nothing placed twice; shares within what each GPU
//! offers; no orphan allocation; pending workers still waiting for a reason).
//!
//! Seeded: STORM_SEED=<printed seed> replays a run; STORM_KILLS sets how many
//! kills (CI: 12; the long run in docs/reliability.md: 1,000).

mod common;
#[path = "common/ledger_check.rs"]
mod ledger_check;

use common::*;
use ledger_check::{check, count_from_env, seed_from_env, spec, Rng, MACHINE};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const CLIENTS: u64 = 4;

/// One client: sequential calls, each logged as `begin` before and `ack` after
/// the daemon answered; stops only workers it knows are live.
fn client(
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

#[test]
fn sigkill_storm_over_dbus_keeps_every_acknowledged_call() {
    let (seed, kills) = (
        seed_from_env("STORM_SEED"),
        count_from_env("STORM_KILLS", 12),
    );
    eprintln!("storm seed {seed} ({kills} kills); replay with STORM_SEED={seed}");
    let mut rng = Rng(seed | 1);
    let dir = open_tempdir();
    std::fs::write(dir.path().join("storm.toml"), MACHINE).unwrap();
    let bus = Bus::session();
    let logs: Vec<Arc<Mutex<String>>> = (0..CLIENTS).map(|_| Arc::default()).collect();
    let lives: Vec<Arc<Mutex<Vec<String>>>> = (0..CLIENTS).map(|_| Arc::default()).collect();
    let (mut acked, started) = (0, Instant::now());
    for round in 0..kills {
        let d = Daemon::start(&bus, dir.path(), &dir.path().join("storm.toml"), &[]);
        let stop = Arc::new(AtomicBool::new(false));
        let clients: Vec<_> = (0..CLIENTS)
            .map(|id| {
                let (address, seed) = (bus.address.clone(), rng.next());
                let (log, live, stop) = (
                    logs[id as usize].clone(),
                    lives[id as usize].clone(),
                    stop.clone(),
                );
                std::thread::spawn(move || client(address, id, round, seed, log, live, stop))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(30 + rng.below(300)));
        let mut d = d;
        d.child.kill().unwrap(); // SIGKILL, mid-call for some client
        d.child.wait().unwrap();
        stop.store(true, Ordering::Relaxed);
        for c in clients {
            acked += c.join().unwrap();
        }
        let texts: Vec<String> = logs.iter().map(|l| l.lock().unwrap().clone()).collect();
        check(&d.state.join("ledger.db"), &texts, seed);
        // What a client believed live may have been uncertain: it learns the
        // truth from the ledger, as a restarted client would ask the daemon.
        let store = astraeusd::store::Store::open(&d.state.join("ledger.db")).unwrap();
        let truly: Vec<String> = store
            .live_workers()
            .unwrap()
            .into_iter()
            .map(|r| r.name)
            .collect();
        for (id, live) in lives.iter().enumerate() {
            let prefix = format!("c{id}-");
            *live.lock().unwrap() = truly
                .iter()
                .filter(|n| n.starts_with(&prefix))
                .cloned()
                .collect();
            // A new log starts from what the ledger holds (acknowledged = live).
            *logs[id].lock().unwrap() = live
                .lock()
                .unwrap()
                .iter()
                .map(|n| format!("begin submit {n}\nack submit {n}\n"))
                .collect();
        }
    }
    eprintln!(
        "storm: {kills} kills, {acked} acknowledged calls in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(
        acked > 0,
        "no call was acknowledged: the storm exercised nothing"
    );
}
