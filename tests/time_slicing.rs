//! The time-slicing engine (src/node/time_slicing.rs) driven directly, with
//! no bus, no libvirt and no ledger (#52), as tests/engine.rs drives the
//! worker engine: templates restored from their specs, nothing steps until
//! it has converged, and a handoff asked of it is one VM at a time —
//! power-off, the release checked, then the next VM's create.

use astraeusd::node::time_slicing::{Rules, TimeSlicing};
use astraeusd::slicing::handoff::{Event, HandoffAction, HandoffState, VmState};
use astraeusd::time::EpochMs;

fn spec(name: &str) -> (String, String) {
    // The baseboard passed through, as the seed's premise is.
    let xml = format!(
        "<domain type='test'><name>tmpl-{name}</name><memory>65536</memory>\
         <os><type>hvm</type></os><devices><hostdev mode='subsystem' type='pci' managed='yes'>\
         <source><address domain='0x0000' bus='0x41' slot='0x00' function='0x0'/></source>\
         </hostdev></devices></domain>"
    );
    let spec = serde_json::json!({
        "name": name,
        "workload": {"model": "m", "runtime": "vllm"},
        "user": {"kind": "internal", "name": format!("team-{name}")},
        "vm": {"domain_xml": xml},
        "baseboard": ["0000:41:00.0"],
    });
    (name.to_string(), spec.to_string())
}

fn engine() -> TimeSlicing {
    let rules = Rules {
        buffer_ms: 0,
        stop_timeout_ms: 10_000,
        allow_networked_weights: false,
        allow_no_baseboard: false,
    };
    let stored = vec![spec("a"), spec("b"), ("bad".to_string(), "{".to_string())];
    TimeSlicing::new(rules, stored, jiff::Timestamp::UNIX_EPOCH)
}

fn at(ms: i64) -> EpochMs {
    EpochMs::from_i64(1_800_000_000_000 + ms)
}

fn creates(actions: &[HandoffAction]) -> Vec<&str> {
    actions
        .iter()
        .filter_map(|a| match a {
            HandoffAction::Create { template } => Some(template.as_str()),
            _ => None,
        })
        .collect()
}

/// Answers what the engine asks (a release check: nothing holds the
/// baseboard; a timer: it fires) until it asks for a create; the time then
/// and what it creates.
fn until_created(
    e: &mut TimeSlicing,
    mut actions: Vec<HandoffAction>,
    mut t: i64,
) -> (i64, Vec<String>) {
    loop {
        let asked: Vec<String> = creates(&actions).iter().map(|s| s.to_string()).collect();
        if !asked.is_empty() {
            return (t, asked);
        }
        t += 1000;
        assert!(t < 600_000, "nothing is ever created: {:?}", e.state());
        let ev = if actions
            .iter()
            .any(|a| matches!(a, HandoffAction::CheckRelease))
        {
            Event::Released { at_ms: at(t) }
        } else {
            Event::Timer { at_ms: at(t) }
        };
        actions = e.step(&ev).unwrap().1;
    }
}

#[test]
fn templates_are_restored_and_nothing_steps_before_convergence() {
    let mut e = engine();
    // The unreadable one is left out (and said in the log).
    assert_eq!(e.templates().keys().collect::<Vec<_>>(), ["a", "b"]);
    assert_eq!(e.template_of("tmpl-b"), Some("b"));
    assert_eq!(e.template_of("tmpl-c"), None);
    let resume = Event::ManualResume {
        template: "a".into(),
        as_handoff: false,
        at_ms: at(0),
    };
    assert!(e.step(&resume).is_none(), "not converged: nothing steps");
    assert_eq!(*e.state(), HandoffState::Idle { released_ms: None });
    // Nor does its timer wake it.
    e.set_timer(at(5));
    assert_eq!(e.wake_ups(&[], &jiff::tz::TimeZone::UTC).0, None);
}

#[test]
fn a_handoff_through_the_engine_is_one_vm_at_a_time() {
    let mut e = engine();
    let before = e.converge_to(
        HandoffState::Idle { released_ms: None },
        jiff::Timestamp::UNIX_EPOCH,
    );
    assert_eq!(before, HandoffState::Idle { released_ms: None });
    assert!(e.is_converged() && e.skipped_since().is_some());

    // a on, from nothing: its create comes once the baseboard is checked free.
    let (_, actions) = e
        .step(&Event::ManualResume {
            template: "a".into(),
            as_handoff: false,
            at_ms: at(0),
        })
        .unwrap();
    let (t, asked) = until_created(&mut e, actions, 0);
    assert_eq!(asked, ["a"]);
    e.step(&Event::Started {
        template: "a".into(),
        at_ms: at(t + 1),
    })
    .unwrap();
    assert_eq!(e.state().on(), Some("a"));

    // b asked to take over: a is powered off first, and b is not created
    // until a has stopped and nothing holds the baseboard.
    let (_, actions) = e
        .step(&Event::ManualResume {
            template: "b".into(),
            as_handoff: true,
            at_ms: at(t + 2),
        })
        .unwrap();
    assert!(
        actions.iter().any(|a| matches!(a, HandoffAction::Shutdown { template } | HandoffAction::Destroy { template } if template == "a")),
        "{actions:?}"
    );
    assert!(
        creates(&actions).is_empty(),
        "b created while a is on: {actions:?}"
    );
    assert_eq!(
        e.state().state_of("b"),
        VmState::Waiting,
        "b waits its turn"
    );
    let (_, actions) = e
        .step(&Event::Stopped {
            template: "a".into(),
            at_ms: at(t + 3),
        })
        .unwrap();
    assert!(
        creates(&actions).is_empty(),
        "b created before the release: {actions:?}"
    );
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, HandoffAction::CheckRelease)),
        "{actions:?}"
    );
    let (_, asked) = until_created(&mut e, actions, t + 4);
    assert_eq!(asked, ["b"]);
    assert_eq!(e.state().state_of("a"), VmState::Off);
}

/// A pause (the ledger refused a step): back to the ledger's state, no
/// event steps, and it learns what runs again after a back-off that doubles
/// while the ledger keeps refusing (5 s, 10 s, … up to a minute) and is the
/// least again once a step is recorded.
#[test]
fn a_pause_stops_every_step_and_backs_off() {
    use std::time::{Duration, Instant};
    let mut e = engine();
    e.converge_to(
        HandoffState::Idle { released_ms: None },
        jiff::Timestamp::UNIX_EPOCH,
    );
    e.set_timer(at(5));
    let ledgers = HandoffState::Idle {
        released_ms: Some(at(1)),
    };
    e.pause(Some(ledgers.clone()));
    assert_eq!(*e.state(), ledgers);
    assert!(e.is_paused() && !e.is_converged() && e.timer().is_none());
    let resume = Event::ManualResume {
        template: "a".into(),
        as_handoff: false,
        at_ms: at(2),
    };
    assert!(e.step(&resume).is_none(), "paused: nothing steps");
    let t0 = Instant::now();
    let waits: Vec<u64> = (0..6).map(|_| e.relearn_later(t0).as_secs()).collect();
    assert_eq!(waits, [5, 10, 20, 40, 60, 60]);
    assert!(!e.relearn_due(t0), "not before its time");
    assert!(e.relearn_due(t0 + Duration::from_secs(61)));
    assert!(!e.relearn_due(t0 + Duration::from_secs(62)), "asked once");
    e.step_recorded();
    assert_eq!(e.relearn_later(t0).as_secs(), 5);
}

/// A convergence, planned by the engine from what runs and the ledger's
/// last step: with no schedule and nothing recorded, the VM that runs stays
/// on; two found on at once (one started behind the daemon's back) leave
/// one of them on — never two. After a request (b next) recorded on top of
/// a's start, b is what is wanted, and the handoff resumes from a's start.
#[test]
fn a_convergence_keeps_what_runs_and_never_two_on() {
    use astraeusd::slicing::handoff::{Record, Step};
    let e = engine();
    let now = (jiff::Timestamp::UNIX_EPOCH, &jiff::tz::TimeZone::UTC);
    let (want, state, _) = e.plan_convergence(&[], now, &["a".to_string()], None, None, at(0));
    assert_eq!(want.as_deref(), Some("a"));
    assert_eq!(state.on(), Some("a"));
    let two = ["a".to_string(), "b".to_string()];
    let (_, state, actions) = e.plan_convergence(&[], now, &two, None, None, at(0));
    let destroyed: Vec<&str> = actions
        .iter()
        .filter_map(|a| match a {
            HandoffAction::Destroy { template } | HandoffAction::Shutdown { template } => {
                Some(template.as_str())
            }
            _ => None,
        })
        .collect();
    assert_eq!(destroyed.len(), 1, "{actions:?}");
    let kept = state.on().expect("one of the two stays on");
    assert!(
        two.iter().any(|t| t == kept) && kept != destroyed[0],
        "{state:?} {actions:?}"
    );

    let record = |step, to: &str| Record {
        step,
        from: None,
        to: Some(to.into()),
        at_ms: at(0),
        detail: None,
    };
    let requested = record(Step::Requested, "b");
    let started = record(Step::Started, "a");
    let on_a = ["a".to_string()];
    let (want, state, _) = e.plan_convergence(
        &[],
        now,
        &on_a,
        Some(&requested),
        Some(Some(&started)),
        at(1),
    );
    assert_eq!(want.as_deref(), Some("b"), "what the request asked");
    // Resumed from a's start (a is on), handing over to b.
    assert_eq!(state.on(), Some("a"), "{state:?}");
    assert_eq!(state.target(), Some("b"), "{state:?}");
}

/// A ledger that takes steps and templates until it is full.
struct Ledger {
    steps: Vec<astraeusd::slicing::handoff::Step>,
    templates: Vec<String>,
    full_after: usize,
}

impl Ledger {
    fn full(&self) -> astraeusd::error::Result<()> {
        if self.steps.len() + self.templates.len() >= self.full_after {
            return Err(astraeusd::error::Error::Backend("the disk is full".into()));
        }
        Ok(())
    }
}

impl astraeusd::node::time_slicing::SlicingLedger for Ledger {
    fn record_step(
        &mut self,
        r: &astraeusd::slicing::handoff::Record,
    ) -> astraeusd::error::Result<()> {
        self.full()?;
        self.steps.push(r.step);
        Ok(())
    }
    fn insert_template(&mut self, name: &str, _: &str, _: EpochMs) -> astraeusd::error::Result<()> {
        self.full()?;
        self.templates.push(name.to_string());
        Ok(())
    }
    fn remove_template(&mut self, name: &str) -> astraeusd::error::Result<()> {
        self.full()?;
        self.templates.retain(|t| t != name);
        Ok(())
    }
}

/// The engine records its own steps, each before what follows it is done;
/// a refused one stops the handoff there (the caller pauses) and, of what
/// follows, lets only the interlock's destroys of VMs other than the one
/// on run. A step taken again brings the pause's back-off down.
#[test]
fn the_engine_records_its_steps_and_a_refused_one_lets_only_the_interlock_through() {
    use astraeusd::node::time_slicing::interlock_after_refusal;
    let mut e = engine();
    e.converge_to(
        HandoffState::Idle { released_ms: None },
        jiff::Timestamp::UNIX_EPOCH,
    );
    // A full ledger refuses the next step whenever one comes.
    let r = astraeusd::slicing::handoff::Record {
        step: astraeusd::slicing::handoff::Step::Requested,
        from: None,
        to: Some("b".into()),
        at_ms: at(1),
        detail: None,
    };
    let mut full = Ledger {
        steps: Vec::new(),
        templates: Vec::new(),
        full_after: 0,
    };
    e.relearn_later(std::time::Instant::now());
    assert!(e.record(&mut full, &r).is_err());
    assert!(full.steps.is_empty());
    assert_eq!(
        e.relearn_later(std::time::Instant::now()).as_secs(),
        10,
        "refused: no reset"
    );
    let mut room = ledger_with_room();
    assert!(e.record(&mut room, &r).is_ok());
    assert_eq!(
        room.steps,
        [astraeusd::slicing::handoff::Step::Requested],
        "recorded as given"
    );
    assert_eq!(
        e.relearn_later(std::time::Instant::now()).as_secs(),
        5,
        "taken: reset"
    );

    // After a refusal: only destroys of VMs other than the one on.
    let rest = [
        HandoffAction::Destroy {
            template: "b".into(),
        },
        HandoffAction::Create {
            template: "a".into(),
        },
        HandoffAction::Shutdown {
            template: "b".into(),
        },
        HandoffAction::Destroy {
            template: "a".into(),
        },
        HandoffAction::CheckRelease,
    ];
    assert_eq!(
        interlock_after_refusal(&rest, Some("a")),
        [&HandoffAction::Destroy {
            template: "b".into()
        }]
    );
    assert_eq!(
        interlock_after_refusal(&rest, None).len(),
        2,
        "none on: every destroy"
    );
}

fn ledger_with_room() -> Ledger {
    Ledger {
        steps: Vec::new(),
        templates: Vec::new(),
        full_after: usize::MAX,
    }
}

/// Templates come and go through the engine, the ledger first: one the
/// ledger refuses is not kept (nor forgotten), one whose VM is on is not
/// removed, and one removed takes its handoff figures with it.
#[test]
fn templates_are_written_to_the_ledger_before_the_engine_keeps_them() {
    use astraeusd::slicing::template::Defined;
    let mut e = engine();
    let (_, c) = spec("c");
    let defined = || Defined::restore(&c).unwrap();
    let mut full = Ledger {
        steps: Vec::new(),
        templates: Vec::new(),
        full_after: 0,
    };
    assert!(e.add_template(&mut full, &c, defined(), at(0)).is_err());
    assert!(e.template("c").is_none(), "refused by the ledger: not kept");
    let mut room = ledger_with_room();
    assert_eq!(
        e.add_template(&mut room, &c, defined(), at(0)).unwrap(),
        "c"
    );
    assert_eq!(room.templates, ["c"]);
    assert_eq!(e.templates().keys().collect::<Vec<_>>(), ["a", "b", "c"]);
    // The same again is refused by its checks, before the ledger.
    assert!(e.add_template(&mut room, &c, defined(), at(0)).is_err());
    assert_eq!(room.templates, ["c"]);

    // c on: it may not go.
    e.converge_to(
        HandoffState::Idle { released_ms: None },
        jiff::Timestamp::UNIX_EPOCH,
    );
    let resume = Event::ManualResume {
        template: "c".into(),
        as_handoff: false,
        at_ms: at(1),
    };
    let (_, actions) = e.step(&resume).unwrap();
    let (t, made) = until_created(&mut e, actions, 2);
    assert_eq!(made, ["c"]);
    let started = Event::Started {
        template: "c".into(),
        at_ms: at(t + 1),
    };
    e.step(&started).unwrap();
    // Its slice began after a handoff that left the baseboard dead 1.2 s.
    e.slice_began("c", Some(1200));
    assert_eq!(e.dead_times().get("c"), Some(&1200));
    assert_eq!(e.state().on(), Some("c"));
    let err = e.remove_template(&mut room, "c").unwrap_err();
    assert!(err.message().contains("power it off first"), "{err:?}");
    assert_eq!(room.templates, ["c"], "the ledger is not asked");

    // Off: the ledger first (a full one keeps it), then memory.
    let off = Event::ManualPowerOff {
        template: "c".into(),
        hard: true,
        at_ms: at(t + 2),
    };
    e.step(&off).unwrap();
    let stopped = Event::Stopped {
        template: "c".into(),
        at_ms: at(t + 3),
    };
    e.step(&stopped).unwrap();
    assert_eq!(e.state().state_of("c"), VmState::Off);
    assert!(e.remove_template(&mut full, "c").is_err());
    assert!(e.template("c").is_some(), "refused by the ledger: kept");
    e.remove_template(&mut room, "c").unwrap();
    assert!(room.templates.is_empty());
    assert!(e.template("c").is_none());
    assert!(!e.dead_times().contains_key("c"));
}
