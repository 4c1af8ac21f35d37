//! The rotation state machine driven by a simulated clock over libvirt's
//! test driver: a node file defines three template domains, and every
//! action the machine returns is carried out on that real connection
//! (virDomainShutdown, virDomainDestroy, virDomainCreate, the active list
//! for the release check). Faults are injected around it: guests that
//! ignore ACPI shutdown (the shutdown is not passed on), creates that fail
//! (libvirt is not called, an error comes back), and the daemon killed
//! between any two actions — the machine's state is dropped, the ledger
//! (the records carried out so far) and libvirt's domains are kept, and
//! `converge` restarts it as the daemon does. After every libvirt call
//! libvirt itself is asked: never two template domains active. Once the
//! faults stop, every handoff completes or is marked failed, and the
//! machine agrees with libvirt.
//!
//! The test driver keeps its domains per connection, so the one connection
//! lives across the simulated restarts — the part a real restart changes
//! (libvirtd keeps the domains) is covered on real libvirtd in tests/vm.rs.

use std::collections::BTreeSet;

use astraeusd::schedule::Action as Scheduled;
use astraeusd::slicing::handoff::*;
use astraeusd::time::EpochMs;
use proptest::prelude::*;
use virt::connect::Connect;
use virt::domain::Domain;

const TEMPLATES: [&str; 3] = ["a", "b", "c"];

fn node_file(dir: &std::path::Path) -> String {
    let domains: String = TEMPLATES
        .iter()
        .map(|t| {
            format!(
                "<domain type='test'><name>tmpl-{t}</name><memory>65536</memory>\
                 <os><type>hvm</type></os></domain>"
            )
        })
        .collect();
    let xml = format!(
        "<node><cpu><mhz>2000</mhz><model>i686</model><active>2</active><total>2</total>\
         <nodes>1</nodes><sockets>1</sockets><cores>2</cores><threads>1</threads></cpu>\
         <memory>2097152</memory>{domains}</node>"
    );
    let path = dir.join("node.xml");
    std::fs::write(&path, xml).unwrap();
    format!("test://{}", path.display())
}

#[derive(Clone, Debug)]
enum Op {
    Advance(u64),
    Due(Scheduled, usize),
    Resume(usize, bool),
    PowerOff(usize, bool),
    /// The guest of this template ignores (true) or obeys ACPI shutdown.
    Hang(usize, bool),
    /// The next creates fail.
    FailStarts(u8),
    /// The daemon dies after carrying out `.1` actions of the step `.0`
    /// events from now (all of them, and no kill, if fewer), and restarts
    /// at once.
    Kill(u8, usize),
    /// RemoveTemplate (refused, as the daemon does, unless its VM is off
    /// or failed); a removed template gets no requests.
    Remove(usize),
    /// Its domain is undefined in libvirt behind the daemon's back (a
    /// running one becomes transient and vanishes once it stops).
    Undefine(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let t = 0..TEMPLATES.len();
    prop_oneof![
        3 => (1u64..4_000).prop_map(Op::Advance),
        2 => (prop::sample::select(vec![Scheduled::Resume, Scheduled::Poweroff, Scheduled::PoweroffHard]), t.clone())
            .prop_map(|(a, t)| Op::Due(a, t)),
        3 => (t.clone(), any::<bool>()).prop_map(|(t, h)| Op::Resume(t, h)),
        1 => (t.clone(), any::<bool>()).prop_map(|(t, h)| Op::PowerOff(t, h)),
        2 => (t.clone(), any::<bool>()).prop_map(|(t, h)| Op::Hang(t, h)),
        1 => (0u8..3).prop_map(Op::FailStarts),
        2 => (0u8..4, 0usize..6).prop_map(|(f, k)| Op::Kill(f, k)),
        1 => t.clone().prop_map(Op::Remove),
        1 => t.prop_map(Op::Undefine),
    ]
}

struct World {
    conn: Connect,
    s: HandoffTimings,
    state: HandoffState,
    now: u64,
    timer: Option<u64>,
    /// The ledger: every record carried out, across restarts.
    ledger: Vec<Record>,
    hang: BTreeSet<String>,
    fail_starts: u8,
    kill_after: Option<(u8, usize)>,
    /// Templates removed from the daemon.
    removed: BTreeSet<String>,
    /// Events libvirt (or the probe) answered, handed over in order.
    queue: std::collections::VecDeque<Event>,
    restarts: u32,
}

fn domain(t: &str) -> String {
    format!("tmpl-{t}")
}

impl World {
    fn new(uri: &str, s: HandoffTimings) -> World {
        let conn = Connect::open(Some(uri)).unwrap();
        // The test driver boots a node file's domains: start with all off.
        for t in TEMPLATES {
            let d = conn.lookup_domain_by_name(&domain(t)).unwrap();
            if d.is_active().unwrap() {
                d.destroy().unwrap();
            }
        }
        World {
            conn,
            s,
            state: HandoffState::Idle { released_ms: None },
            now: 1_000_000,
            timer: None,
            ledger: Vec::new(),
            hang: BTreeSet::new(),
            fail_starts: 0,
            kill_after: None,
            removed: BTreeSet::new(),
            queue: Default::default(),
            restarts: 0,
        }
    }

    /// Template domains libvirt says are active, checked against the rule.
    fn active(&self) -> Result<Vec<String>, TestCaseError> {
        let on: Vec<String> = TEMPLATES
            .iter()
            .filter(|t| self.lookup(t).is_some_and(|d| d.is_active().unwrap()))
            .map(|t| t.to_string())
            .collect();
        prop_assert!(on.len() <= 1, "two template VMs on at once: {on:?}");
        Ok(on)
    }

    /// The template's domain; None once undefined (and off).
    fn lookup(&self, t: &str) -> Option<Domain> {
        self.conn.lookup_domain_by_name(&domain(t)).ok()
    }

    fn feed(&mut self, e: Event) -> Result<(), TestCaseError> {
        let (next, actions) = step(&self.state, &e, &self.s);
        match self.kill_after.take() {
            Some((0, k)) if k < actions.len() => {
                self.carry_out(&actions[..k])?;
                self.restart()
            }
            other => {
                self.kill_after = other.filter(|(f, _)| *f > 0).map(|(f, k)| (f - 1, k));
                self.state = next;
                self.carry_out(&actions)
            }
        }
    }

    /// The daemon starts again as a host without a schedule does: who should
    /// hold the baseboard from the last record, where the handoff stands
    /// from the last record that is not a request, the VMs on from libvirt.
    fn restart(&mut self) -> Result<(), TestCaseError> {
        self.restarts += 1;
        let on = self.active()?;
        let want = wanted_without_schedule(self.ledger.last(), &on);
        let last = self.ledger.iter().rev().find(|r| r.step != Step::Requested);
        self.queue.clear();
        self.timer = None;
        let (state, actions) = converge(want.as_deref(), &on, last, EpochMs(self.now), &self.s);
        self.state = state;
        self.carry_out(&actions)
    }

    fn carry_out(&mut self, actions: &[HandoffAction]) -> Result<(), TestCaseError> {
        for a in actions {
            match a {
                HandoffAction::Record(r) => {
                    if let Some(last) = self.ledger.last() {
                        prop_assert!(r.at_ms >= last.at_ms, "records in time order");
                    }
                    self.ledger.push(r.clone());
                }
                HandoffAction::Shutdown { template } => {
                    if let Some(d) = self.lookup(template) {
                        if !self.hang.contains(template) && d.is_active().unwrap() {
                            d.shutdown().unwrap();
                        }
                    }
                    self.after_stop(template)?;
                }
                HandoffAction::Destroy { template } => {
                    if let Some(d) = self.lookup(template) {
                        if d.is_active().unwrap() {
                            d.destroy().unwrap();
                        }
                    }
                    self.after_stop(template)?;
                }
                HandoffAction::CheckRelease => {
                    if self.active()?.is_empty() {
                        self.queue.push_back(Event::Released {
                            at_ms: EpochMs(self.now),
                        });
                    }
                }
                HandoffAction::SetTimer { at_ms } => self.timer = Some(at_ms.millis()),
                HandoffAction::Create { template } => {
                    // The machine's promise: a create only when nothing is on.
                    prop_assert!(
                        self.active()?.is_empty(),
                        "create {template} while a VM is on"
                    );
                    // As the daemon does: a removed template or an
                    // undefined domain is gone, not a failed start.
                    let gone = if self.removed.contains(template) {
                        Some(format!("template {template} no longer exists"))
                    } else if self.lookup(template).is_none() {
                        Some(format!(
                            "its domain {} is not defined in libvirt",
                            domain(template)
                        ))
                    } else {
                        None
                    };
                    if let Some(error) = gone {
                        self.queue.push_back(Event::Gone {
                            template: template.clone(),
                            error,
                            at_ms: EpochMs(self.now),
                        });
                    } else if self.fail_starts > 0 {
                        self.fail_starts -= 1;
                        self.queue.push_back(Event::StartFailed {
                            template: template.clone(),
                            error: "injected: cannot start".into(),
                            at_ms: EpochMs(self.now),
                        });
                    } else {
                        match self.lookup(template).unwrap().create() {
                            Ok(_) => self.queue.push_back(Event::Started {
                                template: template.clone(),
                                at_ms: EpochMs(self.now),
                            }),
                            Err(e) => self.queue.push_back(Event::StartFailed {
                                template: template.clone(),
                                error: e.message().to_string(),
                                at_ms: EpochMs(self.now),
                            }),
                        }
                    }
                    self.active()?;
                }
                HandoffAction::Probe { template } => self.queue.push_back(Event::Ready {
                    template: template.clone(),
                    at_ms: EpochMs(self.now),
                }),
                HandoffAction::Signal(_)
                | HandoffAction::Refuse { .. }
                | HandoffAction::CloseSlice { .. } => {}
            }
        }
        Ok(())
    }

    /// libvirt's STOPPED, sent only while the domain is inactive.
    fn after_stop(&mut self, template: &str) -> Result<(), TestCaseError> {
        if !self
            .lookup(template)
            .is_some_and(|d| d.is_active().unwrap())
        {
            self.queue.push_back(Event::Stopped {
                template: template.to_string(),
                at_ms: EpochMs(self.now),
            });
        }
        self.active().map(|_| ())
    }

    /// Hands over what libvirt answered, then the timer if nothing else.
    fn drain(&mut self) -> Result<(), TestCaseError> {
        for _ in 0..1000 {
            if let Some(e) = self.queue.pop_front() {
                self.feed(e)?;
                continue;
            }
            return Ok(());
        }
        prop_assert!(false, "events never stopped coming");
        Ok(())
    }

    fn advance(&mut self, ms: u64) -> Result<(), TestCaseError> {
        let until = self.now + ms;
        while let Some(t) = self.timer.filter(|t| *t <= until) {
            self.now = self.now.max(t);
            self.timer = None;
            self.feed(Event::Timer {
                at_ms: EpochMs(self.now),
            })?;
            self.drain()?;
        }
        self.now = until;
        Ok(())
    }

    fn op(&mut self, o: &Op) -> Result<(), TestCaseError> {
        let at_ms = self.now;
        match o {
            Op::Advance(ms) => return self.advance(*ms),
            Op::Hang(t, h) => {
                let t = TEMPLATES[*t].to_string();
                if *h {
                    self.hang.insert(t);
                } else {
                    self.hang.remove(&t);
                }
            }
            Op::FailStarts(n) => self.fail_starts = *n,
            Op::Kill(f, k) => self.kill_after = Some((*f, *k)),
            // The daemon refuses requests for a removed template (NotFound),
            // and its schedule went with it.
            Op::Due(_, t) | Op::Resume(t, _) | Op::PowerOff(t, _)
                if self.removed.contains(TEMPLATES[*t]) => {}
            Op::Remove(t) => {
                let name = TEMPLATES[*t];
                if matches!(self.state.state_of(name), VmState::Off | VmState::Failed) {
                    self.removed.insert(name.to_string());
                }
            }
            Op::Undefine(t) => {
                if let Some(d) = self.lookup(TEMPLATES[*t]) {
                    d.undefine().unwrap();
                }
            }
            Op::Due(action, t) => self.feed(Event::Due {
                action: *action,
                template: TEMPLATES[*t].into(),
                at_ms: EpochMs(at_ms),
            })?,
            Op::Resume(t, as_handoff) => self.feed(Event::ManualResume {
                template: TEMPLATES[*t].into(),
                as_handoff: *as_handoff,
                at_ms: EpochMs(at_ms),
            })?,
            Op::PowerOff(t, hard) => self.feed(Event::ManualPowerOff {
                template: TEMPLATES[*t].into(),
                hard: *hard,
                at_ms: EpochMs(at_ms),
            })?,
        }
        self.drain()
    }

    /// Faults stop; time passes until the machine is quiet. Then every
    /// handoff has completed or been marked failed, and the machine and
    /// libvirt agree about who is on.
    fn settle(&mut self) -> Result<(), TestCaseError> {
        self.hang.clear();
        self.fail_starts = 0;
        self.kill_after = None;
        let longest = self.s.limits.stop_timeout_ms.max(7_000) + self.s.buffer_ms;
        for _ in 0..8 {
            self.advance(longest + 2 * self.s.poll_ms)?;
        }
        let on = self.active()?;
        match &self.state {
            HandoffState::Running { template, .. } => {
                prop_assert_eq!(on, vec![template.clone()]);
                let ready = self
                    .ledger
                    .iter()
                    .rev()
                    .find(|r| r.step != Step::Ready || r.to.as_deref() == Some(template));
                prop_assert!(
                    ready.is_some_and(|r| r.step == Step::Ready),
                    "the last handoff ends ready: {:?}",
                    self.ledger.last()
                );
            }
            HandoffState::Idle { .. } => prop_assert!(on.is_empty(), "idle but {on:?} on"),
            HandoffState::Failed { template, .. } => {
                prop_assert!(on.is_empty(), "failed but {on:?} on");
                prop_assert!(
                    self.ledger.iter().any(|r| {
                        matches!(r.step, Step::Failed | Step::TargetGone)
                            && r.to.as_deref() == Some(template)
                    }),
                    "a failed slice is recorded"
                );
            }
            other => prop_assert!(false, "did not settle: {other:?}"),
        }
        Ok(())
    }
}

impl World {
    /// Liveness: whatever happened before, a resume (as a handoff) of a
    /// template that still exists brings it up, and a hard power-off of it
    /// leaves the baseboard free — the machine is never wedged.
    fn still_live(&mut self) -> Result<(), TestCaseError> {
        let Some(t) = TEMPLATES
            .iter()
            .find(|t| !self.removed.contains(**t) && self.lookup(t).is_some())
            .map(|t| t.to_string())
        else {
            return Ok(());
        };
        let at_ms = EpochMs(self.now);
        self.feed(Event::ManualResume {
            template: t.clone(),
            as_handoff: true,
            at_ms,
        })?;
        self.drain()?;
        self.settle()?;
        prop_assert!(
            matches!(&self.state, HandoffState::Running { template, .. } if *template == t),
            "resume {t} left {:?}",
            self.state
        );
        prop_assert_eq!(self.active()?, vec![t.clone()]);
        self.feed(Event::ManualPowerOff {
            template: t.clone(),
            hard: true,
            at_ms: EpochMs(self.now),
        })?;
        self.drain()?;
        self.settle()?;
        prop_assert!(
            matches!(self.state, HandoffState::Idle { .. }),
            "power-off {t} left {:?}",
            self.state
        );
        prop_assert!(self.active()?.is_empty());
        Ok(())
    }
}

fn settings() -> impl Strategy<Value = HandoffTimings> {
    (
        prop::sample::select(vec![0u64, 1_000, 300_000]),
        prop::sample::select(vec![1_000u64, 120_000]),
        0u32..3,
    )
        .prop_map(
            |(buffer_ms, stop_timeout_ms, start_retries)| HandoffTimings {
                buffer_ms,
                poll_ms: 500,
                limits: Limits {
                    stop_timeout_ms,
                    start_retries,
                },
                per_template: Default::default(),
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn over_libvirts_test_driver_never_two_on_and_every_handoff_ends(
        s in settings(),
        ops in prop::collection::vec(op(), 1..50),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let mut world = World::new(&node_file(dir.path()), s);
        for o in &ops {
            world.op(o)?;
        }
        world.settle()?;
        world.still_live()?;
    }
}

/// The faults the property test draws at random, once each in a fixed
/// order, so each is known to be exercised: a hung shutdown forced off, a
/// failing start retried and then failed, a kill after every action of a
/// handoff's step.
#[test]
fn each_fault_over_the_test_driver() {
    let dir = tempfile::tempdir().unwrap();
    let s = HandoffTimings {
        buffer_ms: 0,
        poll_ms: 500,
        limits: Limits {
            stop_timeout_ms: 2_000,
            start_retries: 1,
        },
        per_template: Default::default(),
    };
    let mut w = World::new(&node_file(dir.path()), s);
    let run = |w: &mut World, ops: &[Op]| {
        for o in ops {
            w.op(o).unwrap();
        }
    };
    run(&mut w, &[Op::Resume(0, false), Op::Advance(1_000)]);
    assert!(matches!(&w.state, HandoffState::Running { template, .. } if template == "a"));
    // a ignores ACPI: forced off after the timeout, then b starts.
    run(&mut w, &[Op::Hang(0, true), Op::Resume(1, true)]);
    assert_eq!(w.active().unwrap(), ["a"], "a hangs");
    run(&mut w, &[Op::Advance(2_500)]);
    assert_eq!(w.active().unwrap(), ["b"]);
    assert!(w.ledger.iter().any(|r| r.step == Step::Forced));
    // c cannot start: tried twice, failed, nothing on.
    run(
        &mut w,
        &[Op::FailStarts(2), Op::Resume(2, true), Op::Advance(3_000)],
    );
    assert!(matches!(&w.state, HandoffState::Failed { template, .. } if template == "c"));
    assert!(w.active().unwrap().is_empty(), "the GPU stays free");
    let starts = w
        .ledger
        .iter()
        .filter(|r| r.step == Step::StartFailed)
        .count();
    assert_eq!(starts, 2);
    // Killed after each action of the steps that start b, in turn: the
    // request ([requested, check release]), then the release's answer
    // ([release-confirmed? start-issued, create, signal]). b comes up.
    for (feeds, k) in [(0, 1), (0, 2), (1, 0), (1, 1), (1, 2), (1, 3), (2, 0)] {
        run(&mut w, &[Op::PowerOff(1, true), Op::Advance(1_000)]);
        run(
            &mut w,
            &[Op::Kill(feeds, k), Op::Resume(1, false), Op::Advance(3_000)],
        );
        assert!(
            matches!(&w.state, HandoffState::Running { template, .. } if template == "b"),
            "after a kill at action {k}: {:?}",
            w.state
        );
        assert_eq!(w.active().unwrap(), ["b"]);
    }
    assert!(w.restarts >= 5, "{} restarts", w.restarts);
    // Killed before the request was recorded: its caller had no answer,
    // and nothing of it is left to finish.
    run(
        &mut w,
        &[
            Op::PowerOff(1, true),
            Op::Advance(1_000),
            Op::Kill(0, 0),
            Op::Resume(1, false),
            Op::Advance(3_000),
        ],
    );
    assert!(w.active().unwrap().is_empty());
    w.settle().unwrap();
}
