//! Property tests for the handoff state machine: a simulated libvirt (that
//! tells the truth, with faults: guests that ignore ACPI, creates that
//! fail, a foreign domain holding the devices, guests that stop on their
//! own, the daemon killed between any two actions) driven by random event
//! sequences. Whatever happens: never a create while a VM is on or before
//! the release is confirmed, never two on, every power-off can be forced,
//! records in time order, and once the faults stop the machine settles to
//! what is true.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use astraeusd::schedule::Action as Scheduled;
use astraeusd::slicing::handoff::*;
use astraeusd::time::EpochMs;
use proptest::prelude::*;

const TEMPLATES: [&str; 3] = ["a", "b", "c"];

#[derive(Clone, Debug)]
enum Op {
    Advance(u64),
    Due(Scheduled, usize),
    Resume(usize, bool),
    PowerOff(usize, bool),
    /// Deliver the oldest asynchronous libvirt event.
    Deliver,
    /// The VM that is on stops by itself.
    Crash,
    Foreign(bool),
    Hang(usize, bool),
    FailStarts(u8),
    ProbePasses(bool),
    StopTimeout,
    /// A person starts a template VM with virsh (when the devices are free).
    VirshStart(usize),
    /// The daemon dies after carrying out `after` actions of the step
    /// `feeds` steps from now (all of them if fewer), and starts again
    /// `down` ms later; `foreign`: a foreign domain took the devices
    /// meanwhile.
    Kill(Kill),
}

#[derive(Clone, Copy, Debug)]
struct Kill {
    feeds: u8,
    after: usize,
    down: u64,
    want: Option<usize>,
    foreign: bool,
}

fn op() -> impl Strategy<Value = Op> {
    let t = 0..TEMPLATES.len();
    let action = prop::sample::select(vec![
        Scheduled::Resume,
        Scheduled::Poweroff,
        Scheduled::PoweroffHard,
    ]);
    prop_oneof![
        4 => prop_oneof![1u64..2_000, 1u64..400_000].prop_map(Op::Advance),
        4 => (action, t.clone()).prop_map(|(a, t)| Op::Due(a, t)),
        2 => (t.clone(), any::<bool>()).prop_map(|(t, h)| Op::Resume(t, h)),
        1 => (t.clone(), any::<bool>()).prop_map(|(t, h)| Op::PowerOff(t, h)),
        4 => Just(Op::Deliver),
        1 => Just(Op::Crash),
        1 => any::<bool>().prop_map(Op::Foreign),
        1 => (t.clone(), any::<bool>()).prop_map(|(t, h)| Op::Hang(t, h)),
        1 => (0u8..4).prop_map(Op::FailStarts),
        1 => any::<bool>().prop_map(Op::ProbePasses),
        1 => Just(Op::StopTimeout),
        1 => t.clone().prop_map(Op::VirshStart),
        2 => (0u8..4, 0usize..6, 0u64..1_000_000, prop::option::of(t), any::<bool>())
            .prop_map(|(feeds, after, down, want, foreign)| Op::Kill(Kill {
                feeds,
                after,
                down,
                want,
                foreign
            })),
    ]
}

fn settings() -> impl Strategy<Value = HandoffTimings> {
    (
        prop::sample::select(vec![0u64, 1_000, 300_000]),
        prop::sample::select(vec![1_000u64, 120_000]),
        0u32..3,
        any::<bool>(),
    )
        .prop_map(|(buffer_ms, stop, retries, per)| {
            let mut per_template = BTreeMap::new();
            if per {
                per_template.insert(
                    "b".to_string(),
                    Limits {
                        stop_timeout_ms: 7_000,
                        start_retries: 0,
                    },
                );
            }
            HandoffTimings {
                buffer_ms,
                poll_ms: 500,
                limits: Limits {
                    stop_timeout_ms: stop,
                    start_retries: retries,
                },
                per_template,
            }
        })
}

enum Later {
    /// An ACPI shutdown the guest obeys; it takes effect when delivered.
    ShutdownDone(String),
    Event(Event),
}

struct World {
    s: HandoffTimings,
    state: HandoffState,
    now: u64,
    /// Template VMs active in "libvirt".
    on: BTreeSet<String>,
    /// A domain that is not a template holds the baseboard's devices.
    foreign: bool,
    /// The machine was told Released since anything last came on.
    confirmed: bool,
    hang: BTreeSet<String>,
    fail_starts: u8,
    probe_passes: bool,
    timer: Option<u64>,
    /// Answers to the machine's own calls: delivered before anything else.
    immediate: VecDeque<Event>,
    later: VecDeque<Later>,
    last_record: Option<Record>,
    kill: Option<Kill>,
}

impl World {
    fn new(s: HandoffTimings) -> World {
        World {
            s,
            state: HandoffState::Idle { released_ms: None },
            now: 1_000_000,
            on: BTreeSet::new(),
            foreign: false,
            confirmed: false,
            hang: BTreeSet::new(),
            fail_starts: 0,
            probe_passes: true,
            timer: None,
            immediate: VecDeque::new(),
            later: VecDeque::new(),
            last_record: None,
            kill: None,
        }
    }

    fn feed(&mut self, event: Event) -> Result<(), TestCaseError> {
        if matches!(event, Event::Released { .. }) {
            self.confirmed = true;
        }
        let (next, actions) = step(&self.state, &event, &self.s);
        match &mut self.kill {
            Some(k) if k.feeds > 0 => k.feeds -= 1,
            Some(k) => {
                // Killed part-way: the state is lost, carried-out actions stay.
                let k = *k;
                self.kill = None;
                self.apply_all(&actions[..k.after.min(actions.len())])?;
                return self.restart(k);
            }
            None => {}
        }
        self.state = next;
        self.check_state()?;
        self.apply_all(&actions)
    }

    fn apply_all(&mut self, actions: &[HandoffAction]) -> Result<(), TestCaseError> {
        for a in actions {
            self.apply(a)?;
        }
        Ok(())
    }

    fn apply(&mut self, action: &HandoffAction) -> Result<(), TestCaseError> {
        match action {
            HandoffAction::Record(r) => {
                if let Some(last) = &self.last_record {
                    prop_assert!(
                        r.at_ms >= last.at_ms,
                        "record {r:?} before the last one {last:?}"
                    );
                }
                prop_assert_eq!(r.at_ms, EpochMs(self.now));
                self.last_record = Some(r.clone());
            }
            HandoffAction::Shutdown { template } => {
                if self.on.contains(template) && !self.hang.contains(template) {
                    self.later.push_back(Later::ShutdownDone(template.clone()));
                }
            }
            HandoffAction::Destroy { template } => {
                if self.on.remove(template) {
                    self.forget_shutdown(template);
                    self.later.push_back(Later::Event(Event::Stopped {
                        template: template.clone(),
                        at_ms: EpochMs(self.now),
                    }));
                }
            }
            HandoffAction::CheckRelease => {
                if self.on.is_empty() && !self.foreign {
                    self.immediate.push_back(Event::Released {
                        at_ms: EpochMs(self.now),
                    });
                }
            }
            HandoffAction::SetTimer { at_ms } => self.timer = Some(at_ms.millis()),
            HandoffAction::Create { template } => {
                prop_assert!(
                    self.on.is_empty(),
                    "create {template} while {:?} is on",
                    self.on
                );
                prop_assert!(
                    !self.foreign,
                    "create {template} while a foreign domain holds"
                );
                prop_assert!(self.confirmed, "create {template} before release confirmed");
                if self.fail_starts > 0 {
                    self.fail_starts -= 1;
                    self.immediate.push_back(Event::StartFailed {
                        template: template.clone(),
                        error: "internal error: process exited while connecting".into(),
                        at_ms: EpochMs(self.now),
                    });
                } else {
                    self.on.insert(template.clone());
                    self.forget_shutdown(template);
                    self.confirmed = false;
                    self.immediate.push_back(Event::Started {
                        template: template.clone(),
                        at_ms: EpochMs(self.now),
                    });
                }
            }
            HandoffAction::Probe { template } => {
                if self.probe_passes && self.on.contains(template) {
                    self.immediate.push_back(Event::Ready {
                        template: template.clone(),
                        at_ms: EpochMs(self.now),
                    });
                }
            }
            HandoffAction::Signal(_)
            | HandoffAction::Refuse { .. }
            | HandoffAction::CloseSlice { .. } => {}
        }
        prop_assert!(self.on.len() <= 1, "two template VMs on: {:?}", self.on);
        Ok(())
    }

    /// A pending ACPI request does not outlive the VM it was sent to.
    fn forget_shutdown(&mut self, template: &str) {
        self.later
            .retain(|l| !matches!(l, Later::ShutdownDone(t) if t == template));
    }

    /// Checks every state the machine enters: a power-off can always be
    /// forced when its timeout passes (or on StopTimeout).
    fn check_state(&self) -> Result<(), TestCaseError> {
        if let HandoffState::PoweringOff { from, since_ms, .. } = &self.state {
            let deadline = *since_ms + self.s.limits(from).stop_timeout_ms;
            for e in [
                Event::Timer { at_ms: deadline },
                Event::StopTimeout {
                    at_ms: EpochMs(self.now),
                },
            ] {
                let (_, actions) = step(&self.state, &e, &self.s);
                prop_assert!(
                    actions.contains(&HandoffAction::Destroy {
                        template: from.clone()
                    }),
                    "{e:?} in {:?} gave {actions:?}",
                    self.state
                );
            }
        }
        Ok(())
    }

    fn restart(&mut self, k: Kill) -> Result<(), TestCaseError> {
        // Guests keep shutting down while the daemon is away; its queued
        // events and its timer are lost.
        for l in std::mem::take(&mut self.later) {
            if let Later::ShutdownDone(t) = l {
                self.on.remove(&t);
            }
        }
        self.immediate.clear();
        self.timer = None;
        self.now += k.down;
        if k.foreign && self.on.is_empty() {
            self.foreign = true;
            self.confirmed = false;
        }
        let vm_on: Vec<String> = self.on.iter().cloned().collect();
        let want = k.want.map(|i| TEMPLATES[i]);
        let (state, actions) = converge(
            want,
            &vm_on,
            self.last_record.as_ref(),
            EpochMs(self.now),
            &self.s,
        );
        prop_assert!(
            !actions
                .iter()
                .any(|a| matches!(a, HandoffAction::Create { .. })),
            "converge created directly: {actions:?}"
        );
        self.state = state;
        self.check_state()?;
        self.apply_all(&actions)
    }

    fn drain_immediate(&mut self) -> Result<(), TestCaseError> {
        while let Some(e) = self.immediate.pop_front() {
            self.feed(e)?;
        }
        Ok(())
    }

    fn deliver_later(&mut self) -> Result<(), TestCaseError> {
        let now = self.now;
        let stopped = |template| Event::Stopped {
            template,
            at_ms: EpochMs(now),
        };
        let event = match self.later.pop_front() {
            Some(Later::ShutdownDone(t)) => self.on.remove(&t).then(|| stopped(t)),
            // The caller checks the domain when it hands a lifecycle event
            // over: a stale one (the domain changed since) is dropped.
            Some(Later::Event(Event::Stopped { template, .. })) => {
                (!self.on.contains(&template)).then(|| stopped(template))
            }
            Some(Later::Event(Event::Started { template, .. })) => {
                self.on.contains(&template).then_some(Event::Started {
                    template,
                    at_ms: EpochMs(now),
                })
            }
            Some(Later::Event(other)) => Some(other),
            None => None,
        };
        match event {
            Some(e) => self.feed(e),
            None => Ok(()),
        }
    }

    fn op(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let now = self.now;
        let name = |i: usize| TEMPLATES[i].to_string();
        match op {
            Op::Advance(ms) => {
                self.now += ms;
                if self.timer.is_some_and(|t| t <= self.now) {
                    self.timer = None;
                    self.feed(Event::Timer {
                        at_ms: EpochMs(self.now),
                    })?;
                }
            }
            Op::Due(action, t) => self.feed(Event::Due {
                action: *action,
                template: name(*t),
                at_ms: EpochMs(now),
            })?,
            Op::Resume(t, as_handoff) => self.feed(Event::ManualResume {
                template: name(*t),
                as_handoff: *as_handoff,
                at_ms: EpochMs(now),
            })?,
            Op::PowerOff(t, hard) => self.feed(Event::ManualPowerOff {
                template: name(*t),
                hard: *hard,
                at_ms: EpochMs(now),
            })?,
            Op::Deliver => self.deliver_later()?,
            Op::Crash => {
                if let Some(t) = self.on.pop_first() {
                    self.forget_shutdown(&t);
                    self.later.push_back(Later::Event(Event::Stopped {
                        template: t,
                        at_ms: EpochMs(now),
                    }));
                }
            }
            Op::Foreign(holds) => {
                // Devices in use by a VM cannot be taken by another.
                if !*holds || self.on.is_empty() {
                    if *holds {
                        self.confirmed = false;
                    }
                    self.foreign = *holds;
                }
            }
            Op::Hang(t, hangs) => {
                if *hangs {
                    self.hang.insert(name(*t));
                } else {
                    self.hang.remove(&name(*t));
                }
            }
            Op::FailStarts(n) => self.fail_starts = *n,
            Op::ProbePasses(p) => self.probe_passes = *p,
            Op::StopTimeout => self.feed(Event::StopTimeout {
                at_ms: EpochMs(now),
            })?,
            Op::VirshStart(t) => {
                if self.on.is_empty() && !self.foreign {
                    self.on.insert(name(*t));
                    self.confirmed = false;
                    self.later.push_back(Later::Event(Event::Started {
                        template: name(*t),
                        at_ms: EpochMs(now),
                    }));
                }
            }
            Op::Kill(k) => self.kill = Some(*k),
        }
        self.drain_immediate()
    }

    /// With the faults gone (guests that ignore ACPI stay), the machine
    /// finishes what it is doing: no handoff is left half done, and what it
    /// believes is what libvirt says.
    fn settle(&mut self) -> Result<(), TestCaseError> {
        self.kill = None;
        self.foreign = false;
        self.fail_starts = 0;
        self.probe_passes = true;
        self.drain_immediate()?;
        for _ in 0..500 {
            let settled = matches!(
                self.state,
                HandoffState::Idle { .. }
                    | HandoffState::Running { .. }
                    | HandoffState::Failed { .. }
            );
            if settled && self.later.is_empty() {
                break;
            }
            if !self.later.is_empty() {
                self.deliver_later()?;
            } else if let Some(at) = self.timer.take() {
                self.now = self.now.max(at);
                self.feed(Event::Timer {
                    at_ms: EpochMs(self.now),
                })?;
            } else {
                prop_assert!(false, "stuck in {:?} with nothing to wait for", self.state);
            }
            self.drain_immediate()?;
        }
        match &self.state {
            HandoffState::Running { template, .. } => {
                prop_assert_eq!(self.on.iter().collect::<Vec<_>>(), vec![template]);
            }
            HandoffState::Idle { .. } | HandoffState::Failed { .. } => {
                prop_assert!(self.on.is_empty(), "{:?} on in {:?}", self.on, self.state)
            }
            other => prop_assert!(false, "did not settle: {other:?}"),
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn the_interlock_holds_under_random_events_and_faults(
        s in settings(),
        ops in prop::collection::vec(op(), 1..80),
    ) {
        let mut world = World::new(s);
        for o in &ops {
            world.op(o)?;
        }
        world.settle()?;
    }

    /// Arbitrary events, true or not: a create only ever answers a release
    /// confirmation (or retries a failed create) while the machine holds no
    /// VM, and records follow the events' time order.
    #[test]
    fn creates_only_follow_a_release_whatever_the_events(
        s in settings(),
        events in prop::collection::vec((event(), 0u64..100_000), 1..80),
    ) {
        let mut state = HandoffState::Idle { released_ms: None };
        let mut now = 0;
        let mut last_record = 0;
        for (e, gap) in events {
            now += gap;
            let e = retime(e, now);
            let (next, actions) = step(&state, &e, &s);
            if actions.iter().any(|a| matches!(a, HandoffAction::Create { .. })) {
                let released = matches!(e, Event::Released { .. }) && state.on().is_none();
                let retry = matches!(e, Event::StartFailed { .. })
                    && matches!(state, HandoffState::Starting { .. });
                prop_assert!(released || retry, "{e:?} in {state:?} gave {actions:?}");
            }
            for a in &actions {
                if let HandoffAction::Record(r) = a {
                    prop_assert!(r.at_ms >= EpochMs(last_record));
                    last_record = r.at_ms.millis();
                }
            }
            state = next;
        }
    }
}

/// An event at time 0; `retime` gives it its time.
fn event() -> impl Strategy<Value = Event> {
    let t = prop::sample::select(TEMPLATES.to_vec()).prop_map(str::to_string);
    let action = prop::sample::select(vec![
        Scheduled::Resume,
        Scheduled::Poweroff,
        Scheduled::PoweroffHard,
    ]);
    prop_oneof![
        (action, t.clone()).prop_map(|(action, template)| Event::Due {
            action,
            template,
            at_ms: EpochMs(0)
        }),
        t.clone().prop_map(|template| Event::Stopped {
            template,
            at_ms: EpochMs(0)
        }),
        Just(Event::Released { at_ms: EpochMs(0) }),
        Just(Event::Timer { at_ms: EpochMs(0) }),
        Just(Event::StopTimeout { at_ms: EpochMs(0) }),
        t.clone().prop_map(|template| Event::Started {
            template,
            at_ms: EpochMs(0)
        }),
        t.clone().prop_map(|template| Event::StartFailed {
            template,
            error: "boom".into(),
            at_ms: EpochMs(0)
        }),
        t.clone().prop_map(|template| Event::Gone {
            template,
            error: "removed".into(),
            at_ms: EpochMs(0)
        }),
        t.clone().prop_map(|template| Event::Ready {
            template,
            at_ms: EpochMs(0)
        }),
        (t.clone(), any::<bool>()).prop_map(|(template, as_handoff)| Event::ManualResume {
            template,
            as_handoff,
            at_ms: EpochMs(0)
        }),
        (t, any::<bool>()).prop_map(|(template, hard)| Event::ManualPowerOff {
            template,
            hard,
            at_ms: EpochMs(0)
        }),
    ]
}

fn retime(e: Event, at: u64) -> Event {
    match e {
        Event::Due {
            action, template, ..
        } => Event::Due {
            action,
            template,
            at_ms: EpochMs(at),
        },
        Event::Stopped { template, .. } => Event::Stopped {
            template,
            at_ms: EpochMs(at),
        },
        Event::Released { .. } => Event::Released { at_ms: EpochMs(at) },
        Event::StopTimeout { .. } => Event::StopTimeout { at_ms: EpochMs(at) },
        Event::Timer { .. } => Event::Timer { at_ms: EpochMs(at) },
        Event::Started { template, .. } => Event::Started {
            template,
            at_ms: EpochMs(at),
        },
        Event::StartFailed {
            template, error, ..
        } => Event::StartFailed {
            template,
            error,
            at_ms: EpochMs(at),
        },
        Event::Gone {
            template, error, ..
        } => Event::Gone {
            template,
            error,
            at_ms: EpochMs(at),
        },
        Event::Ready { template, .. } => Event::Ready {
            template,
            at_ms: EpochMs(at),
        },
        Event::ManualResume {
            template,
            as_handoff,
            ..
        } => Event::ManualResume {
            template,
            as_handoff,
            at_ms: EpochMs(at),
        },
        Event::ManualPowerOff { template, hard, .. } => Event::ManualPowerOff {
            template,
            hard,
            at_ms: EpochMs(at),
        },
    }
}
