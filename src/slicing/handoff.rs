//! The handoff interlock of one baseboard as a pure state machine: the
//! caller feeds [`Event`]s (scheduled actions, libvirt lifecycle events, the
//! answers to its checks, timers, manual requests) to [`step`] and carries
//! out the returned [`Action`]s in order. No I/O and no clock: every event
//! carries its time, the caller's clock when it hands the event over (never
//! going back), so records come out in time order.
//!
//! A handoff is power-off (ACPI; destroyed when the stop timeout passes) →
//! STOPPED → release confirmed (no active domain holds the baseboard's
//! devices) → at least the buffer → create the incoming VM → started →
//! ready (its readiness probe passes). Exactly one template VM is ever on:
//! [`Action::Create`] is only ever returned in the step that handles a
//! [`Event::Released`] (or retries a create that failed, when nothing came
//! on), and only while the machine holds no VM.
//!
//! # Contract with the caller
//!
//! - Carry the actions out in the order given: each step's [`Action::Record`]
//!   comes before the libvirt call it announces, so a daemon killed between
//!   the two finds the intent in the ledger ([`converge`]).
//! - [`Action::SetTimer`] replaces the pending wake-up (there is one); when
//!   it is due, send [`Event::Timer`]. Stale or early timers are harmless.
//! - [`Action::CheckRelease`]: if no active domain (template VM or any other)
//!   holds the baseboard's devices — and no other template VM of this
//!   baseboard is active, which covers an empty baseboard — send
//!   [`Event::Released`] at once; otherwise send nothing (the machine asks
//!   again every `poll_ms`).
//! - [`Action::Create`]: answer [`Event::Started`] or [`Event::StartFailed`]
//!   with libvirt's error. Forward libvirt's STARTED and STOPPED lifecycle
//!   events of template domains too (a repeat is harmless; a template VM
//!   started behind the daemon's back is taken in, or destroyed if another
//!   is on). An event can wait in a queue while the domain changes again,
//!   so send Stopped only while the domain is inactive and Started only
//!   while it is active (virDomainIsActive when the event is handled): a
//!   stale STOPPED must never end the VM created after it. [`Action::Probe`]: probe once (TCP, HTTP, guest
//!   agent) and send [`Event::Ready`] if it passed; a template whose
//!   readiness is libvirt's STARTED answers Ready at once.
//! - Every [`Action::Record`] goes to the ledger and out as the HandoffStep
//!   signal; [`Action::Signal`] carries the slice signals.
//! - Templates are named, not domains: the caller maps between a template
//!   and its domain (events for domains of no template are not sent).

use std::collections::BTreeMap;

use crate::time::EpochMs;

use crate::schedule::Action as Scheduled;

/// A poweroff that does not stop the guest within this long is forced.
pub const DEFAULT_STOP_TIMEOUT_MS: u64 = 120_000;
/// Between one VM's release and the next one's start (seed: e.g. 5 minutes).
pub const DEFAULT_BUFFER_MS: u64 = 300_000;
/// How often release is re-checked and readiness re-probed.
pub const DEFAULT_POLL_MS: u64 = 5_000;
pub const DEFAULT_START_RETRIES: u32 = 2;

/// What a template may override (`stop_timeout_seconds`, `start_retries`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub stop_timeout_ms: u64,
    /// Creates tried after the first one fails.
    pub start_retries: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// 0 starts the incoming VM as soon as the release is confirmed.
    pub buffer_ms: u64,
    pub poll_ms: u64,
    pub limits: Limits,
    pub per_template: BTreeMap<String, Limits>,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            buffer_ms: DEFAULT_BUFFER_MS,
            poll_ms: DEFAULT_POLL_MS,
            limits: Limits {
                stop_timeout_ms: DEFAULT_STOP_TIMEOUT_MS,
                start_retries: DEFAULT_START_RETRIES,
            },
            per_template: BTreeMap::new(),
        }
    }
}

impl Settings {
    pub fn limits(&self, template: &str) -> Limits {
        self.per_template
            .get(template)
            .copied()
            .unwrap_or(self.limits)
    }

    fn poll(&self) -> u64 {
        self.poll_ms.max(1)
    }
}

/// Where the baseboard's handoff stands. Times are epoch milliseconds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    /// No template VM on. `released_ms`: the last confirmed release, which
    /// the next start's buffer counts from (None: none known).
    Idle { released_ms: Option<EpochMs> },
    /// `from` was asked to stop (`forced`: destroyed) at `since_ms`; `to`
    /// starts once it is off and released.
    PoweringOff {
        from: String,
        to: Option<String>,
        forced: bool,
        since_ms: EpochMs,
    },
    /// `from` is off; waiting until nothing holds the baseboard's devices.
    AwaitingRelease {
        from: String,
        to: Option<String>,
        stopped_ms: EpochMs,
    },
    /// Waiting until `until_ms`, then a last release check, then create `to`.
    /// `release_confirmed_ms` is set when `to` takes over from another VM
    /// (a handoff): the start of the handoff's dead time.
    Buffer {
        to: String,
        release_confirmed_ms: Option<EpochMs>,
        until_ms: EpochMs,
    },
    /// Create issued (`attempt` from 1), answer pending. `issued_ms` is the
    /// first attempt's; `released_ms` as in `Buffer`.
    Starting {
        to: String,
        attempt: u32,
        issued_ms: EpochMs,
        released_ms: Option<EpochMs>,
    },
    /// Started at `since_ms`; probing until ready.
    AwaitingReady {
        to: String,
        issued_ms: EpochMs,
        since_ms: EpochMs,
    },
    /// Ready since `since_ms`.
    Running { template: String, since_ms: EpochMs },
    /// The slice of `template` failed to start; no VM is on, the baseboard
    /// is free for the next slice.
    Failed {
        template: String,
        error: String,
        at_ms: EpochMs,
    },
}

impl State {
    /// The state once `template` is removed (its VM off or failed): a
    /// failure that was its own goes with it, so a template created again
    /// under the name starts off (#52). The baseboard was free.
    pub fn without(&self, template: &str) -> State {
        match self {
            State::Failed { template: t, .. } if t == template => State::Idle { released_ms: None },
            other => other.clone(),
        }
    }

    /// The template whose VM is, or may be, on.
    pub fn on(&self) -> Option<&str> {
        match self {
            State::PoweringOff { from, .. } => Some(from),
            State::Starting { to, .. } | State::AwaitingReady { to, .. } => Some(to),
            State::Running { template, .. } => Some(template),
            _ => None,
        }
    }

    /// The template that holds the baseboard once the machine settles.
    pub fn target(&self) -> Option<&str> {
        match self {
            State::Idle { .. } | State::Failed { .. } => None,
            State::PoweringOff { to, .. } | State::AwaitingRelease { to, .. } => to.as_deref(),
            State::Buffer { to, .. }
            | State::Starting { to, .. }
            | State::AwaitingReady { to, .. } => Some(to),
            State::Running { template, .. } => Some(template),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            State::Idle { .. } => "idle",
            State::PoweringOff { .. } => "powering-off",
            State::AwaitingRelease { .. } => "awaiting-release",
            State::Buffer { .. } => "buffer",
            State::Starting { .. } => "starting",
            State::AwaitingReady { .. } => "awaiting-ready",
            State::Running { .. } => "running",
            State::Failed { .. } => "failed",
        }
    }

    /// One template's VM, as its D-Bus object and the page show it.
    pub fn state_of(&self, template: &str) -> VmState {
        match self {
            State::PoweringOff { from, .. } if from == template => VmState::Stopping,
            State::Starting { to, .. } | State::AwaitingReady { to, .. } if to == template => {
                VmState::Starting
            }
            State::Running { template: t, .. } if t == template => VmState::Running,
            State::Failed { template: t, .. } if t == template => VmState::Failed,
            _ if self.target() == Some(template) => VmState::Waiting,
            _ => VmState::Off,
        }
    }
}

/// Where one template's VM is in the rotation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VmState {
    Off,
    Stopping,
    /// For the release of the baseboard or the buffer.
    Waiting,
    Starting,
    Running,
    Failed,
}

impl VmState {
    pub fn as_str(self) -> &'static str {
        match self {
            VmState::Off => "off",
            VmState::Stopping => "stopping",
            VmState::Waiting => "waiting",
            VmState::Starting => "starting",
            VmState::Running => "running",
            VmState::Failed => "failed",
        }
    }
}

impl std::fmt::Display for VmState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A scheduled action fired.
    Due {
        action: Scheduled,
        template: String,
        at_ms: EpochMs,
    },
    /// libvirt: the template's domain stopped (STOPPED, or SHUTDOWN→off).
    Stopped { template: String, at_ms: EpochMs },
    /// The answer to [`Action::CheckRelease`]: nothing holds the devices.
    Released { at_ms: EpochMs },
    /// Force the power-off now (the same as the stop-timeout timer).
    StopTimeout { at_ms: EpochMs },
    /// The wake-up asked by [`Action::SetTimer`].
    Timer { at_ms: EpochMs },
    /// The create returned (libvirt STARTED).
    Started { template: String, at_ms: EpochMs },
    StartFailed {
        template: String,
        error: String,
        at_ms: EpochMs,
    },
    /// The template to start is gone (removed, or its domain undefined in
    /// libvirt): no retry can help; the handoff ends with the baseboard free.
    Gone {
        template: String,
        error: String,
        at_ms: EpochMs,
    },
    /// The readiness probe passed.
    Ready { template: String, at_ms: EpochMs },
    /// Resume from a person; `as_handoff` lets it take over from a holder.
    ManualResume {
        template: String,
        as_handoff: bool,
        at_ms: EpochMs,
    },
    ManualPowerOff {
        template: String,
        hard: bool,
        at_ms: EpochMs,
    },
}

impl Event {
    pub fn at_ms(&self) -> EpochMs {
        match self {
            Event::Due { at_ms, .. }
            | Event::Stopped { at_ms, .. }
            | Event::Released { at_ms }
            | Event::StopTimeout { at_ms }
            | Event::Timer { at_ms }
            | Event::Started { at_ms, .. }
            | Event::StartFailed { at_ms, .. }
            | Event::Gone { at_ms, .. }
            | Event::Ready { at_ms, .. }
            | Event::ManualResume { at_ms, .. }
            | Event::ManualPowerOff { at_ms, .. } => *at_ms,
        }
    }
}

/// A handoff step as the ledger keeps it (and HandoffStep shows it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    PowerOffAsked,
    Forced,
    Stopped,
    ReleaseConfirmed,
    StartIssued,
    Started,
    Ready,
    /// One create failed (it may be retried).
    StartFailed,
    /// The slice gave up starting.
    Failed,
    /// The slice's template is gone (removed, or its domain undefined):
    /// nothing was started; the baseboard is free.
    TargetGone,
    /// A request changed who holds the baseboard next (`to`; None: no one)
    /// in a step that records nothing else — a resume waiting out the
    /// buffer, a retarget mid-handoff — so a restart still knows it.
    Requested,
    /// A template VM that was not to be on (`from`: started behind the
    /// daemon's back, or on beside another at a start) was destroyed; the
    /// handoff is where it was (`to`: who holds the baseboard once it
    /// settles). Not a step of the handoff: a restart resumes from the one
    /// before it.
    Destroyed,
}

const STEPS: [(Step, &str); 12] = [
    (Step::PowerOffAsked, "power-off-asked"),
    (Step::Forced, "forced"),
    (Step::Stopped, "stopped"),
    (Step::ReleaseConfirmed, "release-confirmed"),
    (Step::StartIssued, "start-issued"),
    (Step::Started, "started"),
    (Step::Ready, "ready"),
    (Step::StartFailed, "start-failed"),
    (Step::Failed, "failed"),
    (Step::TargetGone, "target-gone"),
    (Step::Requested, "requested"),
    (Step::Destroyed, "destroyed"),
];

impl Step {
    pub fn as_str(self) -> &'static str {
        STEPS
            .iter()
            .find(|(s, _)| *s == self)
            .expect("every step")
            .1
    }

    pub fn parse(text: &str) -> Option<Step> {
        STEPS.iter().find(|(_, t)| *t == text).map(|(s, _)| *s)
    }
}

/// One ledger entry. `from` is the outgoing VM of the step (power-off,
/// stop, release), `to` the incoming one (or the one starting).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub step: Step,
    pub from: Option<String>,
    pub to: Option<String>,
    pub at_ms: EpochMs,
    /// libvirt's error, why a power-off was forced, …
    pub detail: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Signal {
    /// The slice begins: its VM is being created. `dead_time_ms`, in a
    /// handoff: from the release confirmed to this start.
    SliceStarted {
        template: String,
        at_ms: EpochMs,
        dead_time_ms: Option<u64>,
    },
    /// The probe passed; `start_to_ready_ms` from the first create issued.
    SliceReady {
        template: String,
        at_ms: EpochMs,
        start_to_ready_ms: u64,
    },
    SliceEnded {
        template: String,
        at_ms: EpochMs,
    },
    /// The slice never came up; it ends here.
    SliceFailed {
        template: String,
        at_ms: EpochMs,
        error: String,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Record(Record),
    /// virDomainShutdown (ACPI).
    Shutdown {
        template: String,
    },
    /// virDomainDestroy.
    Destroy {
        template: String,
    },
    CheckRelease,
    SetTimer {
        at_ms: EpochMs,
    },
    /// virDomainCreate.
    Create {
        template: String,
    },
    Probe {
        template: String,
    },
    Signal(Signal),
    /// A manual request refused; the caller answers it with Conflict.
    Refuse {
        reason: String,
    },
    /// At start-up: the slice of `template` ends at `at_ms` (with `error`
    /// when it failed), if the daemon stopped between recording that and
    /// closing it; nothing when it is closed already, and no signal (its
    /// end was the last step, from before the restart).
    CloseSlice {
        template: String,
        at_ms: EpochMs,
        error: Option<String>,
    },
}

/// Applies one event. Events that do not fit the state (late, duplicated,
/// about another template) change nothing.
pub fn step(state: &State, event: &Event, s: &Settings) -> (State, Vec<Action>) {
    let (next, mut out) = transition(state, event, s);
    // A request that changed the target but recorded nothing (no VM stops
    // or starts yet) is recorded too: its caller is answered, so a restart
    // must not forget it.
    let request = matches!(
        event,
        Event::Due { .. } | Event::ManualResume { .. } | Event::ManualPowerOff { .. }
    );
    if request
        && next.target() != state.target()
        && !out.iter().any(|a| matches!(a, Action::Record(_)))
    {
        let r = Record {
            step: Step::Requested,
            from: None,
            to: next.target().map(str::to_string),
            at_ms: event.at_ms(),
            detail: None,
        };
        out.insert(0, Action::Record(r));
    }
    (next, out)
}

fn transition(state: &State, event: &Event, s: &Settings) -> (State, Vec<Action>) {
    let mut out = Vec::new();
    let at = event.at_ms();
    let next = match event {
        Event::Due {
            action, template, ..
        } => match action {
            Scheduled::Resume => resume(state, template, at, s, &mut out),
            Scheduled::Poweroff => power_off(state, template, false, at, s, &mut out),
            Scheduled::PoweroffHard => power_off(state, template, true, at, s, &mut out),
        },
        Event::ManualResume {
            template,
            as_handoff,
            ..
        } => match holder_other_than(state, template) {
            Some(reason) if !as_handoff => {
                out.push(Action::Refuse { reason });
                state.clone()
            }
            _ => resume(state, template, at, s, &mut out),
        },
        Event::ManualPowerOff { template, hard, .. } => {
            power_off(state, template, *hard, at, s, &mut out)
        }
        Event::Stopped { template, .. } => match state {
            State::PoweringOff { from, to, .. } if from == template => {
                stopped(from, to.clone(), at, None, s, &mut out)
            }
            State::Starting { to: t, .. }
            | State::AwaitingReady { to: t, .. }
            | State::Running { template: t, .. }
                if t == template =>
            {
                let why = Some("stopped on its own".to_string());
                stopped(t, None, at, why, s, &mut out)
            }
            _ => state.clone(),
        },
        Event::Released { .. } => match state {
            State::AwaitingRelease {
                from,
                to,
                stopped_ms,
            } if at >= *stopped_ms => {
                record(
                    &mut out,
                    Step::ReleaseConfirmed,
                    Some(from),
                    to.as_deref(),
                    at,
                    None,
                );
                match to {
                    None => State::Idle {
                        released_ms: Some(at),
                    },
                    Some(to) if s.buffer_ms == 0 => create(to, Some(at), at, &mut out),
                    Some(to) => buffer(to, Some(at), at + s.buffer_ms, at, s, &mut out),
                }
            }
            // The last check after the buffer: start now.
            State::Buffer {
                to,
                release_confirmed_ms,
                until_ms,
            } if at >= *until_ms => create(to, *release_confirmed_ms, at, &mut out),
            _ => state.clone(),
        },
        Event::StopTimeout { .. } => match state {
            State::PoweringOff { .. } => force(state, at, s, &mut out),
            _ => state.clone(),
        },
        Event::Timer { .. } => timer(state, at, s, &mut out),
        Event::Started { template, .. } => match state {
            State::Starting { to, issued_ms, .. } if to == template => {
                record(&mut out, Step::Started, None, Some(to), at, None);
                out.push(Action::Probe {
                    template: to.clone(),
                });
                out.push(Action::SetTimer {
                    at_ms: at + s.poll(),
                });
                State::AwaitingReady {
                    to: to.clone(),
                    issued_ms: *issued_ms,
                    since_ms: at,
                }
            }
            _ => started_outside(state, template, at, s, &mut out),
        },
        Event::StartFailed {
            template, error, ..
        } => match state {
            State::Starting {
                to,
                attempt,
                issued_ms,
                released_ms,
            } if to == template => {
                let tries = s.limits(to).start_retries + 1;
                let detail = format!("attempt {attempt} of {tries}: {error}");
                record(
                    &mut out,
                    Step::StartFailed,
                    None,
                    Some(to),
                    at,
                    Some(detail),
                );
                if *attempt < tries {
                    // Nothing came on since the release was confirmed.
                    let retry = format!("attempt {} of {tries}", attempt + 1);
                    record(&mut out, Step::StartIssued, None, Some(to), at, Some(retry));
                    out.push(Action::Create {
                        template: to.clone(),
                    });
                    State::Starting {
                        to: to.clone(),
                        attempt: attempt + 1,
                        issued_ms: *issued_ms,
                        released_ms: *released_ms,
                    }
                } else {
                    record(
                        &mut out,
                        Step::Failed,
                        None,
                        Some(to),
                        at,
                        Some(error.clone()),
                    );
                    out.push(Action::Signal(Signal::SliceFailed {
                        template: to.clone(),
                        at_ms: at,
                        error: error.clone(),
                    }));
                    State::Failed {
                        template: to.clone(),
                        error: error.clone(),
                        at_ms: at,
                    }
                }
            }
            // A VM destroyed while starting never came up: it is off.
            State::PoweringOff { from, to, .. } if from == template => {
                let why = Some(format!("did not start: {error}"));
                stopped(from, to.clone(), at, why, s, &mut out)
            }
            _ => state.clone(),
        },
        Event::Gone {
            template, error, ..
        } => match state {
            // Only a slice about to start waits for its template: nothing of
            // it runs, so the baseboard is free at once (no retry can help).
            State::Buffer { to, .. } | State::Starting { to, .. } if to == template => {
                let error = format!("target gone: {error}");
                record(
                    &mut out,
                    Step::TargetGone,
                    None,
                    Some(to),
                    at,
                    Some(error.clone()),
                );
                out.push(Action::Signal(Signal::SliceFailed {
                    template: to.clone(),
                    at_ms: at,
                    error: error.clone(),
                }));
                State::Failed {
                    template: to.clone(),
                    error,
                    at_ms: at,
                }
            }
            _ => state.clone(),
        },
        Event::Ready { template, .. } => match state {
            State::AwaitingReady { to, issued_ms, .. } if to == template => {
                record(&mut out, Step::Ready, None, Some(to), at, None);
                out.push(Action::Signal(Signal::SliceReady {
                    template: to.clone(),
                    at_ms: at,
                    start_to_ready_ms: at - *issued_ms,
                }));
                State::Running {
                    template: to.clone(),
                    since_ms: at,
                }
            }
            _ => state.clone(),
        },
    };
    (next, out)
}

/// The state at start-up, from the last ledger record that is not a
/// [`Step::Requested`] (requests reach [`converge`] as `want`) nor a
/// [`Step::Destroyed`] (not a step of the handoff), and the
/// template VM that is on now (the caller lists active domains). Finishes what the
/// record shows in flight, safely: a power-off is asked again, a stop is
/// followed by a release check, a start is redone only after a fresh check.
pub fn resume_from(
    last: Option<&Record>,
    vm_on: Option<&str>,
    now_ms: EpochMs,
    s: &Settings,
) -> (State, Vec<Action>) {
    let mut out = Vec::new();
    let now = now_ms;
    let to_of = |r: &Record| r.to.clone();
    let state = match (vm_on, last) {
        // Killed while powering it off: ask again, keeping the deadline.
        (Some(t), Some(r))
            if matches!(r.step, Step::PowerOffAsked | Step::Forced)
                && r.from.as_deref() == Some(t) =>
        {
            let forced = r.step == Step::Forced;
            let template = t.to_string();
            out.push(if forced {
                Action::Destroy { template }
            } else {
                Action::Shutdown { template }
            });
            out.push(Action::SetTimer {
                at_ms: r.at_ms + s.limits(t).stop_timeout_ms,
            });
            State::PoweringOff {
                from: t.to_string(),
                to: to_of(r),
                forced,
                since_ms: r.at_ms,
            }
        }
        (Some(t), Some(r)) if r.step == Step::Ready && r.to.as_deref() == Some(t) => {
            State::Running {
                template: t.to_string(),
                since_ms: r.at_ms,
            }
        }
        (Some(t), last) => {
            let mine = last.filter(|r| {
                r.to.as_deref() == Some(t)
                    && matches!(
                        r.step,
                        Step::StartIssued | Step::Started | Step::StartFailed
                    )
            });
            let (issued_ms, since_ms) = match mine {
                Some(r) if r.step == Step::Started => (r.at_ms, r.at_ms),
                Some(r) => (r.at_ms, now),
                None => {
                    // A stop recorded before the daemon stopped, its slice
                    // perhaps not closed yet (as the arm with none on does).
                    if let Some(r) = last.filter(|r| r.step == Step::Stopped) {
                        if let Some(from) = r.from.as_deref().filter(|f| *f != t) {
                            out.push(Action::CloseSlice {
                                template: from.to_string(),
                                at_ms: r.at_ms,
                                error: None,
                            });
                        }
                    }
                    // On, but no slice of it is open: someone started it.
                    let why = Some("found running at start-up".to_string());
                    record(&mut out, Step::Started, None, Some(t), now, why);
                    out.push(Action::Signal(Signal::SliceStarted {
                        template: t.to_string(),
                        at_ms: now,
                        dead_time_ms: None,
                    }));
                    (now, now)
                }
            };
            out.push(Action::Probe {
                template: t.to_string(),
            });
            out.push(Action::SetTimer {
                at_ms: now + s.poll(),
            });
            State::AwaitingReady {
                to: t.to_string(),
                issued_ms,
                since_ms,
            }
        }
        (None, None) => State::Idle { released_ms: None },
        (None, Some(r)) => match (r.step, r.from.as_deref(), r.to.as_deref()) {
            (Step::PowerOffAsked | Step::Forced | Step::Stopped, Some(from), _) => {
                if r.step == Step::Stopped {
                    out.push(Action::CloseSlice {
                        template: from.to_string(),
                        at_ms: r.at_ms,
                        error: None,
                    });
                    check_release_soon(now, s, &mut out);
                    State::AwaitingRelease {
                        from: from.to_string(),
                        to: to_of(r),
                        stopped_ms: now,
                    }
                } else {
                    let why = Some("found off at start-up".to_string());
                    stopped(from, to_of(r), now, why, s, &mut out)
                }
            }
            (Step::ReleaseConfirmed, from, Some(to)) => {
                let handoff = from.map(|_| r.at_ms);
                buffer(to, handoff, r.at_ms + s.buffer_ms, now, s, &mut out)
            }
            (Step::ReleaseConfirmed, _, None) => State::Idle {
                released_ms: Some(r.at_ms),
            },
            // A create that may never have run: check again, then redo it.
            (Step::StartIssued | Step::StartFailed, _, Some(to)) => {
                buffer(to, None, now, now, s, &mut out)
            }
            (Step::Started | Step::Ready, _, Some(to)) => {
                let why = Some("found off at start-up".to_string());
                stopped(to, None, now, why, s, &mut out)
            }
            (Step::Failed | Step::TargetGone, _, Some(to)) => {
                let error = r.detail.clone().unwrap_or_default();
                out.push(Action::CloseSlice {
                    template: to.to_string(),
                    at_ms: r.at_ms,
                    error: Some(error.clone()),
                });
                State::Failed {
                    template: to.to_string(),
                    error,
                    at_ms: r.at_ms,
                }
            }
            _ => State::Idle { released_ms: None },
        },
    };
    (state, out)
}

/// Who should hold the baseboard after a restart on a host without a
/// schedule: who the last record was heading for (a request, or a handoff
/// under way, finishes; a power-off stays off), or, after a failed slice or
/// on a fresh ledger, the VM that is on.
pub fn wanted_without_schedule(last: Option<&Record>, vm_on: &[String]) -> Option<String> {
    match last {
        Some(r) if !matches!(r.step, Step::Failed | Step::TargetGone) => r.to.clone(),
        _ => vm_on.first().cloned(),
    }
}

/// Start-up after downtime or a crash: only the state wanted now, never a
/// burst of the actions missed. `want` is who should hold the baseboard now
/// — the schedule's owner, or a manual request newer than the schedule's
/// last event (the caller decides, and records what it skipped). `vm_on`:
/// the template VMs active now; more than one breaks the rule, and all but
/// one are destroyed at once.
pub fn converge(
    want: Option<&str>,
    vm_on: &[String],
    last: Option<&Record>,
    now_ms: EpochMs,
    s: &Settings,
) -> (State, Vec<Action>) {
    let is_on = |t: &&str| vm_on.iter().any(|v| v == t);
    // The one kept: the one wanted, else the one the ledger last had on
    // (not a newcomer whose destroy a crash cut short), else any.
    let recorded_on = last.and_then(|r| match r.step {
        Step::PowerOffAsked | Step::Forced => r.from.as_deref(),
        Step::StartIssued | Step::Started | Step::StartFailed | Step::Ready => r.to.as_deref(),
        _ => None,
    });
    let keep = want
        .filter(is_on)
        .or(recorded_on.filter(is_on))
        .or(vm_on.first().map(String::as_str));
    let (state, actions) = resume_from(last, keep, now_ms, s);
    let mut out = Vec::new();
    // The one the ledger had on is off, and another is on: its slice ends
    // (it stayed open). One that is on is destroyed below instead.
    if let (Some(t), Some(r)) = (keep, last) {
        let holder = match r.step {
            Step::PowerOffAsked | Step::Forced => r.from.as_deref(),
            Step::Started | Step::Ready => r.to.as_deref(),
            _ => None,
        };
        if let Some(off) = holder.filter(|h| *h != t && !is_on(h)) {
            let why = format!("found off at start-up, {t} on instead");
            record(&mut out, Step::Stopped, Some(off), want, now_ms, Some(why));
            out.push(Action::Signal(Signal::SliceEnded {
                template: off.to_string(),
                at_ms: now_ms,
            }));
        }
    }
    for extra in vm_on.iter().filter(|v| Some(v.as_str()) != keep) {
        let why = format!(
            "on together with {}; exactly one template VM may be on",
            keep.unwrap_or_default()
        );
        // `to`: who holds the baseboard once settled, so a restart still
        // wants it: the one wanted (the event below brings the handoff there).
        record(
            &mut out,
            Step::Destroyed,
            Some(extra),
            want,
            now_ms,
            Some(why.clone()),
        );
        out.push(Action::Destroy {
            template: extra.clone(),
        });
        // Its slice ends here, if it had one open (it held the baseboard
        // before the daemon stopped, and another was started meanwhile).
        out.push(Action::CloseSlice {
            template: extra.clone(),
            at_ms: now_ms,
            error: Some(format!("destroyed at a start: {why}")),
        });
    }
    out.extend(actions);
    let event = match (want, state.target()) {
        (Some(w), target) if target != Some(w) => Some(Scheduled::Resume.at(w, now_ms)),
        (None, Some(t)) => Some(Scheduled::Poweroff.at(t, now_ms)),
        _ => None,
    };
    match event {
        None => (state, out),
        Some(event) => {
            let (state, actions) = step(&state, &event, s);
            out.extend(actions);
            (state, out)
        }
    }
}

trait Due {
    fn at(self, template: &str, at_ms: EpochMs) -> Event;
}

impl Due for Scheduled {
    fn at(self, template: &str, at_ms: EpochMs) -> Event {
        Event::Due {
            action: self,
            template: template.to_string(),
            at_ms,
        }
    }
}

// ---- transitions ----

/// `t` should hold the baseboard: start it, or hand over to it.
fn resume(state: &State, t: &str, at: EpochMs, s: &Settings, out: &mut Vec<Action>) -> State {
    let retarget = |to: &Option<String>| to.as_deref() != Some(t);
    match state {
        State::Idle { released_ms } => {
            let until = released_ms.map_or(at, |r| at.max(r + s.buffer_ms));
            // The last release carries over: the baseboard's time without
            // a VM is told for a resume long after a power-off too (#52).
            buffer(t, *released_ms, until, at, s, out)
        }
        State::Failed { .. } => buffer(t, None, at, at, s, out),
        _ if state.on() == Some(t) && !matches!(state, State::PoweringOff { .. }) => state.clone(),
        State::Running { template: u, .. } | State::AwaitingReady { to: u, .. } => {
            ask_power_off(u, Some(t), false, at, s, out)
        }
        // A VM still booting has nothing to save: destroy it.
        State::Starting { to: u, .. } => ask_power_off(u, Some(t), true, at, s, out),
        State::PoweringOff {
            from,
            to,
            forced,
            since_ms,
        } if retarget(to) => State::PoweringOff {
            from: from.clone(),
            to: Some(t.to_string()),
            forced: *forced,
            since_ms: *since_ms,
        },
        State::AwaitingRelease {
            from,
            to,
            stopped_ms,
        } if retarget(to) => State::AwaitingRelease {
            from: from.clone(),
            to: Some(t.to_string()),
            stopped_ms: *stopped_ms,
        },
        State::Buffer {
            to,
            release_confirmed_ms,
            until_ms,
        } if to != t => State::Buffer {
            to: t.to_string(),
            release_confirmed_ms: *release_confirmed_ms,
            until_ms: *until_ms,
        },
        _ => state.clone(),
    }
}

/// `t` should be off (`hard`: destroyed). Works in every state.
fn power_off(
    state: &State,
    t: &str,
    hard: bool,
    at: EpochMs,
    s: &Settings,
    out: &mut Vec<Action>,
) -> State {
    let mine = |to: &Option<String>| to.as_deref() == Some(t);
    match state {
        State::Running { template: u, .. } | State::AwaitingReady { to: u, .. } if u == t => {
            ask_power_off(t, None, hard, at, s, out)
        }
        State::Starting { to: u, .. } if u == t => ask_power_off(t, None, true, at, s, out),
        State::PoweringOff { from, forced, .. } if from == t => {
            if hard && !forced {
                force(state, at, s, out)
            } else {
                state.clone()
            }
        }
        // `t` was coming next: it no longer is.
        State::PoweringOff {
            from,
            to,
            forced,
            since_ms,
        } if mine(to) => State::PoweringOff {
            from: from.clone(),
            to: None,
            forced: *forced,
            since_ms: *since_ms,
        },
        State::AwaitingRelease {
            from,
            to,
            stopped_ms,
        } if mine(to) => State::AwaitingRelease {
            from: from.clone(),
            to: None,
            stopped_ms: *stopped_ms,
        },
        State::Buffer {
            to,
            release_confirmed_ms,
            ..
        } if to == t => State::Idle {
            released_ms: *release_confirmed_ms,
        },
        _ => state.clone(),
    }
}

fn ask_power_off(
    from: &str,
    to: Option<&str>,
    hard: bool,
    at: EpochMs,
    s: &Settings,
    out: &mut Vec<Action>,
) -> State {
    let template = from.to_string();
    if hard {
        record(
            out,
            Step::Forced,
            Some(from),
            to,
            at,
            Some("hard power-off".into()),
        );
        out.push(Action::Destroy { template });
    } else {
        record(out, Step::PowerOffAsked, Some(from), to, at, None);
        out.push(Action::Shutdown { template });
    }
    out.push(Action::SetTimer {
        at_ms: at + s.limits(from).stop_timeout_ms,
    });
    State::PoweringOff {
        from: from.to_string(),
        to: to.map(str::to_string),
        forced: hard,
        since_ms: at,
    }
}

/// `t` was started behind the daemon's back (`virsh start`). Another VM
/// already on keeps the baseboard and the newcomer is destroyed; otherwise
/// `t` is taken as holding it, and powered off if another should.
fn started_outside(
    state: &State,
    t: &str,
    at: EpochMs,
    s: &Settings,
    out: &mut Vec<Action>,
) -> State {
    match state.on() {
        Some(u) if u == t => state.clone(),
        Some(u) => {
            let why = format!("started outside Astraeus while {u} holds the baseboard");
            // `to`: who holds the baseboard once the machine settles (not
            // u, when u is being powered off), so a restart right after
            // this still wants it.
            record(out, Step::Destroyed, Some(t), state.target(), at, Some(why));
            out.push(Action::Destroy {
                template: t.to_string(),
            });
            state.clone()
        }
        None => {
            let why = Some("started outside Astraeus".to_string());
            record(out, Step::Started, None, Some(t), at, why);
            out.push(Action::Signal(Signal::SliceStarted {
                template: t.to_string(),
                at_ms: at,
                dead_time_ms: None,
            }));
            match state.target() {
                Some(next) if next != t => ask_power_off(t, Some(next), false, at, s, out),
                _ => {
                    out.push(Action::Probe {
                        template: t.to_string(),
                    });
                    out.push(Action::SetTimer {
                        at_ms: at + s.poll(),
                    });
                    State::AwaitingReady {
                        to: t.to_string(),
                        issued_ms: at,
                        since_ms: at,
                    }
                }
            }
        }
    }
}

/// Destroys the VM being powered off; again after each timeout, in case
/// libvirt could not (a device busy).
fn force(state: &State, at: EpochMs, s: &Settings, out: &mut Vec<Action>) -> State {
    let State::PoweringOff {
        from, to, forced, ..
    } = state
    else {
        return state.clone();
    };
    let timeout = s.limits(from).stop_timeout_ms;
    let why = if *forced {
        "destroy asked again".to_string()
    } else {
        format!("did not stop within {} s", timeout / 1000)
    };
    record(out, Step::Forced, Some(from), to.as_deref(), at, Some(why));
    out.push(Action::Destroy {
        template: from.clone(),
    });
    out.push(Action::SetTimer {
        at_ms: at + timeout,
    });
    State::PoweringOff {
        from: from.clone(),
        to: to.clone(),
        forced: true,
        since_ms: at,
    }
}

fn timer(state: &State, at: EpochMs, s: &Settings, out: &mut Vec<Action>) -> State {
    match state {
        State::PoweringOff { from, since_ms, .. } => {
            let deadline = *since_ms + s.limits(from).stop_timeout_ms;
            if at >= deadline {
                return force(state, at, s, out);
            }
            out.push(Action::SetTimer { at_ms: deadline });
        }
        State::AwaitingRelease { .. } => check_release_soon(at, s, out),
        State::Buffer { until_ms, .. } if at >= *until_ms => check_release_soon(at, s, out),
        State::Buffer { until_ms, .. } => out.push(Action::SetTimer { at_ms: *until_ms }),
        State::AwaitingReady { to, .. } => {
            out.push(Action::Probe {
                template: to.clone(),
            });
            out.push(Action::SetTimer {
                at_ms: at + s.poll(),
            });
        }
        _ => {}
    }
    state.clone()
}

/// `from` is off: its slice ends; the baseboard is free once released.
fn stopped(
    from: &str,
    to: Option<String>,
    at: EpochMs,
    why: Option<String>,
    s: &Settings,
    out: &mut Vec<Action>,
) -> State {
    record(out, Step::Stopped, Some(from), to.as_deref(), at, why);
    out.push(Action::Signal(Signal::SliceEnded {
        template: from.to_string(),
        at_ms: at,
    }));
    check_release_soon(at, s, out);
    State::AwaitingRelease {
        from: from.to_string(),
        to,
        stopped_ms: at,
    }
}

fn check_release_soon(at: EpochMs, s: &Settings, out: &mut Vec<Action>) {
    out.push(Action::CheckRelease);
    out.push(Action::SetTimer {
        at_ms: at + s.poll(),
    });
}

/// Waits until `until`, then checks the release once more before starting.
fn buffer(
    to: &str,
    release_confirmed_ms: Option<EpochMs>,
    until: EpochMs,
    at: EpochMs,
    s: &Settings,
    out: &mut Vec<Action>,
) -> State {
    if until <= at {
        check_release_soon(at, s, out);
    } else {
        out.push(Action::SetTimer { at_ms: until });
    }
    State::Buffer {
        to: to.to_string(),
        release_confirmed_ms,
        until_ms: until,
    }
}

/// Only ever called in the step that handled a `Released`.
fn create(to: &str, released_ms: Option<EpochMs>, at: EpochMs, out: &mut Vec<Action>) -> State {
    record(out, Step::StartIssued, None, Some(to), at, None);
    out.push(Action::Create {
        template: to.to_string(),
    });
    out.push(Action::Signal(Signal::SliceStarted {
        template: to.to_string(),
        at_ms: at,
        dead_time_ms: released_ms.map(|r| at - r),
    }));
    State::Starting {
        to: to.to_string(),
        attempt: 1,
        issued_ms: at,
        released_ms,
    }
}

/// Why a plain manual resume of `t` is refused: another template holds
/// the baseboard, or is about to.
fn holder_other_than(state: &State, t: &str) -> Option<String> {
    let holder = match state {
        State::Starting { to, .. } | State::AwaitingReady { to, .. } => Some(to),
        State::Running { template, .. } => Some(template),
        _ => None,
    };
    if let Some(u) = holder.filter(|u| *u != t) {
        return Some(format!(
            "template {u} holds the GPU baseboard; resume {t} as a handoff to take it over"
        ));
    }
    match state.target() {
        Some(u) if u != t => Some(format!(
            "the GPU baseboard is being handed over to template {u}; resume {t} as a \
             handoff to take it over"
        )),
        _ => None,
    }
}

fn record(
    out: &mut Vec<Action>,
    step: Step,
    from: Option<&str>,
    to: Option<&str>,
    at_ms: EpochMs,
    detail: Option<String>,
) {
    out.push(Action::Record(Record {
        step,
        from: from.map(str::to_string),
        to: to.map(str::to_string),
        at_ms,
        detail,
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(buffer_ms: u64) -> Settings {
        Settings {
            buffer_ms,
            poll_ms: 1_000,
            limits: Limits {
                stop_timeout_ms: 60_000,
                start_retries: 1,
            },
            per_template: BTreeMap::new(),
        }
    }

    fn due(action: Scheduled, t: &str, at_ms: u64) -> Event {
        action.at(t, EpochMs(at_ms))
    }

    fn running(t: &str) -> State {
        State::Running {
            template: t.into(),
            since_ms: EpochMs(0),
        }
    }

    fn steps(actions: &[Action]) -> Vec<&'static str> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Record(r) => Some(r.step.as_str()),
                _ => None,
            })
            .collect()
    }

    fn has(actions: &[Action], want: &Action) -> bool {
        actions.contains(want)
    }

    fn create(t: &str) -> Action {
        Action::Create { template: t.into() }
    }

    /// Feeds events in order, returning the last state and all actions.
    fn run(state: State, events: &[Event], s: &Settings) -> (State, Vec<Action>) {
        let mut state = state;
        let mut all = Vec::new();
        for e in events {
            let (next, actions) = step(&state, e, s);
            state = next;
            all.extend(actions);
        }
        (state, all)
    }

    #[test]
    fn a_handoff_runs_every_step_in_order_with_its_timings() {
        let s = settings(300_000);
        let stopped = |at_ms| Event::Stopped {
            template: "a".into(),
            at_ms,
        };
        let (state, actions) = run(
            running("a"),
            &[
                due(Scheduled::Resume, "b", 1_000),
                stopped(EpochMs(21_000)),
                Event::Released {
                    at_ms: EpochMs(22_000),
                },
                Event::Timer {
                    at_ms: EpochMs(100_000),
                }, // early: re-armed
                Event::Timer {
                    at_ms: EpochMs(322_000),
                },
                Event::Released {
                    at_ms: EpochMs(322_500),
                },
                Event::Started {
                    template: "b".into(),
                    at_ms: EpochMs(330_000),
                },
                Event::Ready {
                    template: "b".into(),
                    at_ms: EpochMs(400_000),
                },
            ],
            &s,
        );
        assert_eq!(state, running_since("b", 400_000));
        assert_eq!(
            steps(&actions),
            [
                "power-off-asked",
                "stopped",
                "release-confirmed",
                "start-issued",
                "started",
                "ready"
            ]
        );
        assert!(has(
            &actions,
            &Action::Shutdown {
                template: "a".into()
            }
        ));
        assert!(has(
            &actions,
            &Action::SetTimer {
                at_ms: EpochMs(61_000)
            }
        ));
        assert!(has(
            &actions,
            &Action::SetTimer {
                at_ms: EpochMs(322_000)
            }
        ));
        assert!(has(
            &actions,
            &Action::Signal(Signal::SliceEnded {
                template: "a".into(),
                at_ms: EpochMs(21_000)
            })
        ));
        assert!(has(
            &actions,
            &Action::Signal(Signal::SliceStarted {
                template: "b".into(),
                at_ms: EpochMs(322_500),
                dead_time_ms: Some(300_500)
            })
        ));
        assert!(has(
            &actions,
            &Action::Signal(Signal::SliceReady {
                template: "b".into(),
                at_ms: EpochMs(400_000),
                start_to_ready_ms: 77_500
            })
        ));
    }

    fn running_since(t: &str, since_ms: u64) -> State {
        State::Running {
            template: t.into(),
            since_ms: EpochMs(since_ms),
        }
    }

    #[test]
    fn no_create_before_release_or_during_the_buffer() {
        let s = settings(300_000);
        let off = State::AwaitingRelease {
            from: "a".into(),
            to: Some("b".into()),
            stopped_ms: EpochMs(10_000),
        };
        // A check answered before the stop, and timers, start nothing.
        let (state, actions) = run(
            off.clone(),
            &[
                Event::Released {
                    at_ms: EpochMs(9_000),
                },
                Event::Timer {
                    at_ms: EpochMs(11_000),
                },
            ],
            &s,
        );
        assert_eq!(state, off);
        assert!(!actions.iter().any(|a| matches!(a, Action::Create { .. })));
        assert!(has(&actions, &Action::CheckRelease));
        // Released inside the buffer: still waiting.
        let (state, actions) = run(
            off,
            &[
                Event::Released {
                    at_ms: EpochMs(12_000),
                },
                Event::Released {
                    at_ms: EpochMs(13_000),
                },
            ],
            &s,
        );
        assert!(matches!(
            state,
            State::Buffer {
                until_ms: EpochMs(312_000),
                ..
            }
        ));
        assert!(!actions.iter().any(|a| matches!(a, Action::Create { .. })));
    }

    #[test]
    fn a_zero_buffer_starts_on_the_release() {
        let s = settings(0);
        let (state, actions) = step(
            &State::AwaitingRelease {
                from: "a".into(),
                to: Some("b".into()),
                stopped_ms: EpochMs(5),
            },
            &Event::Released { at_ms: EpochMs(7) },
            &s,
        );
        assert!(matches!(
            state,
            State::Starting {
                attempt: 1,
                issued_ms: EpochMs(7),
                ..
            }
        ));
        assert_eq!(steps(&actions), ["release-confirmed", "start-issued"]);
        assert!(has(&actions, &create("b")));
        // From idle, a resume checks the release first, then starts.
        let (state, actions) = run(
            State::Idle { released_ms: None },
            &[
                due(Scheduled::Resume, "a", 100),
                Event::Released {
                    at_ms: EpochMs(100),
                },
            ],
            &s,
        );
        assert!(matches!(state, State::Starting { .. }));
        assert_eq!(actions[0], requested(Some("a"), 100));
        assert_eq!(actions[1], Action::CheckRelease);
        assert!(has(
            &actions,
            &Action::Signal(Signal::SliceStarted {
                template: "a".into(),
                at_ms: EpochMs(100),
                dead_time_ms: None
            })
        ));
        // A resume long after a power-off (the seed's usual scheduled
        // pair) tells the time the baseboard had no VM (#52).
        let (_, actions) = run(
            State::Idle {
                released_ms: Some(EpochMs(40)),
            },
            &[
                due(Scheduled::Resume, "a", 100),
                Event::Released {
                    at_ms: EpochMs(100),
                },
            ],
            &s,
        );
        assert!(has(
            &actions,
            &Action::Signal(Signal::SliceStarted {
                template: "a".into(),
                at_ms: EpochMs(100),
                dead_time_ms: Some(60)
            })
        ));
    }

    #[test]
    fn a_resume_soon_after_a_poweroff_waits_out_the_buffer() {
        let s = settings(300_000);
        let (state, actions) = step(
            &State::Idle {
                released_ms: Some(EpochMs(1_000)),
            },
            &due(Scheduled::Resume, "b", 60_000),
            &s,
        );
        assert_eq!(
            state,
            State::Buffer {
                to: "b".into(),
                release_confirmed_ms: Some(EpochMs(1_000)),
                until_ms: EpochMs(301_000)
            }
        );
        // Recorded: a restart while it waits must still start b.
        assert_eq!(
            actions,
            [
                requested(Some("b"), 60_000),
                Action::SetTimer {
                    at_ms: EpochMs(301_000)
                }
            ]
        );
    }

    #[test]
    fn after_a_restart_the_last_record_says_who_is_wanted() {
        let r = |step, from: Option<&str>, to: Option<&str>| Record {
            step,
            from: from.map(str::to_string),
            to: to.map(str::to_string),
            at_ms: EpochMs(0),
            detail: None,
        };
        let on = vec!["a".to_string()];
        // A power-off by hand, killed midway: it stays off.
        let off = r(Step::PowerOffAsked, Some("a"), None);
        assert_eq!(wanted_without_schedule(Some(&off), &on), None);
        // A handoff under way, or a request waiting out the buffer, finishes.
        let handoff = r(Step::PowerOffAsked, Some("a"), Some("b"));
        assert_eq!(
            wanted_without_schedule(Some(&handoff), &on).as_deref(),
            Some("b")
        );
        let request = r(Step::Requested, None, Some("c"));
        assert_eq!(
            wanted_without_schedule(Some(&request), &[]).as_deref(),
            Some("c")
        );
        // After a failed slice, or on a fresh ledger: what is on is kept.
        let failed = r(Step::Failed, None, Some("b"));
        assert_eq!(
            wanted_without_schedule(Some(&failed), &on).as_deref(),
            Some("a")
        );
        assert_eq!(wanted_without_schedule(None, &on).as_deref(), Some("a"));
        // Two on at start-up, a fresh ledger and no schedule: the one on
        // first is wanted, the other destroyed; the record names who
        // stays, so a restart right after still wants it.
        let both = ["a".to_string(), "b".to_string()];
        let want = wanted_without_schedule(None, &both);
        let (_, actions) = converge(want.as_deref(), &both, None, EpochMs(5), &settings(0));
        let destroyed = destroyed_step(&actions);
        assert_eq!(
            (destroyed.from.as_deref(), destroyed.to.as_deref()),
            (Some("b"), Some("a"))
        );
        assert_eq!(
            wanted_without_schedule(Some(&destroyed), &["a".into()]).as_deref(),
            Some("a")
        );
        // With none wanted (a schedule's off time), it names none: the
        // one kept is powered off next.
        let (state, actions) = converge(None, &both, None, EpochMs(5), &settings(0));
        assert_eq!(destroyed_step(&actions).to, None);
        assert_eq!(state.target(), None);
    }

    fn requested(to: Option<&str>, at_ms: u64) -> Action {
        Action::Record(Record {
            step: Step::Requested,
            from: None,
            to: to.map(str::to_string),
            at_ms: EpochMs(at_ms),
            detail: None,
        })
    }

    #[test]
    fn a_guest_that_ignores_acpi_is_destroyed_after_the_timeout() {
        let s = settings(0);
        let (state, _) = step(&running("a"), &due(Scheduled::Poweroff, "a", 0), &s);
        // Before the deadline: re-armed, nothing forced.
        let (state, actions) = step(
            &state,
            &Event::Timer {
                at_ms: EpochMs(30_000),
            },
            &s,
        );
        assert_eq!(
            actions,
            [Action::SetTimer {
                at_ms: EpochMs(60_000)
            }]
        );
        let (state, actions) = step(
            &state,
            &Event::Timer {
                at_ms: EpochMs(60_000),
            },
            &s,
        );
        assert!(matches!(state, State::PoweringOff { forced: true, .. }));
        assert!(has(
            &actions,
            &Action::Destroy {
                template: "a".into()
            }
        ));
        match &actions[0] {
            Action::Record(r) => {
                assert_eq!(r.step, Step::Forced);
                assert_eq!(r.detail.as_deref(), Some("did not stop within 60 s"));
            }
            other => panic!("{other:?}"),
        }
        // Destroy is asked again if the VM still does not stop.
        let (_, actions) = step(
            &state,
            &Event::Timer {
                at_ms: EpochMs(120_000),
            },
            &s,
        );
        assert!(has(
            &actions,
            &Action::Destroy {
                template: "a".into()
            }
        ));
        // StopTimeout forces at once.
        let (_, actions) = step(
            &State::PoweringOff {
                from: "a".into(),
                to: None,
                forced: false,
                since_ms: EpochMs(0),
            },
            &Event::StopTimeout { at_ms: EpochMs(1) },
            &s,
        );
        assert!(has(
            &actions,
            &Action::Destroy {
                template: "a".into()
            }
        ));
    }

    #[test]
    fn poweroff_hard_destroys_and_escalates_a_graceful_one() {
        let s = settings(0);
        let (state, actions) = step(&running("a"), &due(Scheduled::PoweroffHard, "a", 5), &s);
        assert!(matches!(state, State::PoweringOff { forced: true, .. }));
        assert_eq!(steps(&actions), ["forced"]);
        assert!(has(
            &actions,
            &Action::Destroy {
                template: "a".into()
            }
        ));
        let graceful = State::PoweringOff {
            from: "a".into(),
            to: None,
            forced: false,
            since_ms: EpochMs(0),
        };
        let (state, actions) = step(
            &graceful,
            &Event::ManualPowerOff {
                template: "a".into(),
                hard: true,
                at_ms: EpochMs(9),
            },
            &s,
        );
        assert!(matches!(state, State::PoweringOff { forced: true, .. }));
        assert!(has(
            &actions,
            &Action::Destroy {
                template: "a".into()
            }
        ));
    }

    #[test]
    fn a_target_that_is_gone_ends_the_handoff_at_once_with_the_baseboard_free() {
        let s = settings(0);
        let starting = State::Starting {
            to: "b".into(),
            attempt: 1,
            issued_ms: EpochMs(0),
            released_ms: None,
        };
        let gone = Event::Gone {
            template: "b".into(),
            error: "its domain tmpl-b is not defined in libvirt".into(),
            at_ms: EpochMs(5),
        };
        let (state, actions) = step(&starting, &gone, &s);
        let error = "target gone: its domain tmpl-b is not defined in libvirt";
        assert_eq!(
            state,
            State::Failed {
                template: "b".into(),
                error: error.into(),
                at_ms: EpochMs(5)
            }
        );
        // No retry: one record, and nothing started.
        assert_eq!(steps(&actions), ["target-gone"]);
        assert!(!actions.iter().any(|a| matches!(a, Action::Create { .. })));
        assert_eq!(state.on(), None);
        // A restart reads it as a failed slice: no one is wanted, nothing redone.
        let Action::Record(r) = &actions[0] else {
            panic!("{actions:?}")
        };
        assert_eq!(Step::parse("target-gone"), Some(Step::TargetGone));
        assert_eq!(wanted_without_schedule(Some(r), &[]), None);
        // For anyone else, or once running, it changes nothing.
        let other = Event::Gone {
            template: "c".into(),
            error: "x".into(),
            at_ms: EpochMs(6),
        };
        assert_eq!(step(&starting, &other, &s).0, starting);
        let running = State::Running {
            template: "b".into(),
            since_ms: EpochMs(1),
        };
        assert_eq!(step(&running, &gone, &s).0, running);
        // The next resume of an existing template starts normally.
        let (state, _) = step(&state, &due(Scheduled::Resume, "c", 7), &s);
        assert!(matches!(state, State::Buffer { .. }));
    }

    #[test]
    fn start_failures_are_retried_then_the_slice_fails_and_the_gpu_stays_free() {
        let s = settings(0);
        let starting = State::Starting {
            to: "b".into(),
            attempt: 1,
            issued_ms: EpochMs(0),
            released_ms: None,
        };
        let fail = |at_ms| Event::StartFailed {
            template: "b".into(),
            error: "internal error: no IOMMU".into(),
            at_ms,
        };
        let (state, actions) = step(&starting, &fail(EpochMs(1)), &s);
        assert!(matches!(
            state,
            State::Starting {
                attempt: 2,
                issued_ms: EpochMs(0),
                ..
            }
        ));
        assert_eq!(steps(&actions), ["start-failed", "start-issued"]);
        assert!(has(&actions, &create("b")));
        let (state, actions) = step(&state, &fail(EpochMs(2)), &s);
        assert_eq!(
            state,
            State::Failed {
                template: "b".into(),
                error: "internal error: no IOMMU".into(),
                at_ms: EpochMs(2)
            }
        );
        assert_eq!(steps(&actions), ["start-failed", "failed"]);
        match &actions[0] {
            Action::Record(r) => assert_eq!(
                r.detail.as_deref(),
                Some("attempt 2 of 2: internal error: no IOMMU")
            ),
            other => panic!("{other:?}"),
        }
        assert!(!actions.iter().any(|a| matches!(a, Action::Create { .. })));
        // The next slice starts normally.
        let (state, _) = step(&state, &due(Scheduled::Resume, "c", 3), &s);
        assert!(matches!(state, State::Buffer { .. }));
        assert_eq!(state.on(), None);
    }

    #[test]
    fn a_manual_resume_while_another_holds_is_refused_naming_the_holder() {
        let s = settings(0);
        let ask = |as_handoff| Event::ManualResume {
            template: "b".into(),
            as_handoff,
            at_ms: EpochMs(1),
        };
        let (state, actions) = step(&running("a"), &ask(false), &s);
        assert_eq!(state, running("a"));
        assert_eq!(
            actions,
            [Action::Refuse {
                reason: "template a holds the GPU baseboard; resume b as a handoff to take \
                         it over"
                    .into()
            }]
        );
        let to_c = State::AwaitingRelease {
            from: "a".into(),
            to: Some("c".into()),
            stopped_ms: EpochMs(0),
        };
        let (_, actions) = step(&to_c, &ask(false), &s);
        assert_eq!(
            actions,
            [Action::Refuse {
                reason: "the GPU baseboard is being handed over to template c; resume b as \
                         a handoff to take it over"
                    .into()
            }]
        );
        // As a handoff it takes over.
        let (state, actions) = step(&running("a"), &ask(true), &s);
        assert!(matches!(
            &state,
            State::PoweringOff { from, to: Some(to), forced: false, .. } if from == "a" && to == "b"
        ));
        assert_eq!(steps(&actions), ["power-off-asked"]);
        // Nobody holds it: a plain resume is fine.
        let (state, _) = step(&State::Idle { released_ms: None }, &ask(false), &s);
        assert_eq!(state.target(), Some("b"));
    }

    #[test]
    fn poweroff_works_in_every_state() {
        let s = settings(300_000);
        let off = |t: &str| Event::ManualPowerOff {
            template: t.into(),
            hard: false,
            at_ms: EpochMs(50),
        };
        // The incoming one is dropped from a handoff in progress.
        let (state, actions) = step(
            &State::AwaitingRelease {
                from: "a".into(),
                to: Some("b".into()),
                stopped_ms: EpochMs(0),
            },
            &off("b"),
            &s,
        );
        assert_eq!(state.target(), None);
        assert_eq!(actions, [requested(None, 50)]);
        let (state, _) = step(
            &State::Buffer {
                to: "b".into(),
                release_confirmed_ms: Some(EpochMs(10)),
                until_ms: EpochMs(99),
            },
            &off("b"),
            &s,
        );
        assert_eq!(
            state,
            State::Idle {
                released_ms: Some(EpochMs(10))
            }
        );
        // A VM still starting is destroyed.
        let (state, actions) = step(
            &State::Starting {
                to: "b".into(),
                attempt: 1,
                issued_ms: EpochMs(0),
                released_ms: None,
            },
            &off("b"),
            &s,
        );
        assert!(matches!(state, State::PoweringOff { forced: true, .. }));
        assert!(has(
            &actions,
            &Action::Destroy {
                template: "b".into()
            }
        ));
        // It never came up: off, then released.
        let (state, actions) = step(
            &state,
            &Event::StartFailed {
                template: "b".into(),
                error: "x".into(),
                at_ms: EpochMs(60),
            },
            &s,
        );
        assert!(matches!(state, State::AwaitingRelease { .. }));
        assert!(has(&actions, &Action::CheckRelease));
        // Off already, or not ours: nothing to do, nothing refused.
        let idle = State::Idle { released_ms: None };
        assert_eq!(step(&idle, &off("a"), &s), (idle.clone(), vec![]));
    }

    #[test]
    fn a_vm_that_stops_on_its_own_ends_its_slice() {
        let s = settings(0);
        let (state, actions) = step(
            &running("a"),
            &Event::Stopped {
                template: "a".into(),
                at_ms: EpochMs(9),
            },
            &s,
        );
        assert!(matches!(state, State::AwaitingRelease { to: None, .. }));
        assert!(has(
            &actions,
            &Action::Signal(Signal::SliceEnded {
                template: "a".into(),
                at_ms: EpochMs(9)
            })
        ));
        let (state, actions) = step(&state, &Event::Released { at_ms: EpochMs(10) }, &s);
        assert_eq!(
            state,
            State::Idle {
                released_ms: Some(EpochMs(10))
            }
        );
        assert_eq!(steps(&actions), ["release-confirmed"]);
        // Late or foreign events change nothing.
        for e in [
            Event::Stopped {
                template: "z".into(),
                at_ms: EpochMs(11),
            },
            Event::Ready {
                template: "a".into(),
                at_ms: EpochMs(11),
            },
            Event::Released { at_ms: EpochMs(11) },
        ] {
            assert_eq!(step(&state, &e, &s).0, state);
        }
    }

    #[test]
    fn a_vm_started_behind_our_back_is_taken_in_or_sent_away() {
        let s = settings(0);
        let started = |t: &str| Event::Started {
            template: t.into(),
            at_ms: EpochMs(5),
        };
        // Nobody held the baseboard: it holds it now.
        let (state, actions) = step(&State::Idle { released_ms: None }, &started("a"), &s);
        assert!(matches!(state, State::AwaitingReady { .. }));
        assert_eq!(state.on(), Some("a"));
        assert_eq!(steps(&actions), ["started"]);
        // b was coming next: a is powered off for it.
        let (state, _) = step(
            &State::Buffer {
                to: "b".into(),
                release_confirmed_ms: None,
                until_ms: EpochMs(9),
            },
            &started("a"),
            &s,
        );
        assert!(matches!(
            &state,
            State::PoweringOff { from, to: Some(to), .. } if from == "a" && to == "b"
        ));
        // Another VM is on: the newcomer is destroyed at once.
        let (state, actions) = step(&running("b"), &started("a"), &s);
        assert_eq!(state, running("b"));
        assert!(has(
            &actions,
            &Action::Destroy {
                template: "a".into()
            }
        ));
        // A repeated STARTED of the holder changes nothing.
        assert_eq!(
            step(&running("b"), &started("b"), &s),
            (running("b"), vec![])
        );
    }

    /// The `destroyed` step among these actions.
    fn destroyed_step(actions: &[Action]) -> Record {
        actions
            .iter()
            .find_map(|a| match a {
                Action::Record(r) if r.step == Step::Destroyed => Some(r.clone()),
                _ => None,
            })
            .expect("the newcomer's destroy is recorded")
    }

    fn record_of(step: Step, from: Option<&str>, to: Option<&str>, at_ms: u64) -> Record {
        Record {
            step,
            from: from.map(str::to_string),
            to: to.map(str::to_string),
            at_ms: EpochMs(at_ms),
            detail: None,
        }
    }

    /// Whether `actions` record a start or begin a slice.
    fn starts_a_slice(actions: &[Action]) -> bool {
        actions.iter().any(|a| {
            matches!(
                a,
                Action::Record(Record {
                    step: Step::Started,
                    ..
                }) | Action::Signal(Signal::SliceStarted { .. })
            )
        })
    }

    /// The newcomer's destroy is the ledger's last step when the daemon
    /// restarts (no schedule): the holder is still wanted, not powered off,
    /// and the handoff resumes from the step before the destroy (the
    /// ledger's `last_state_step` skips it), so b's slice goes on: it was
    /// recorded as found running again, a slice begun anew.
    #[test]
    fn a_restart_after_a_newcomer_was_destroyed_keeps_the_holder() {
        let s = settings(0);
        let started = Event::Started {
            template: "a".into(),
            at_ms: EpochMs(5),
        };
        let (_, actions) = step(&running("b"), &started, &s);
        let destroyed = destroyed_step(&actions);
        assert_eq!(destroyed.to.as_deref(), Some("b"));
        let on = ["b".to_string()];
        let want = wanted_without_schedule(Some(&destroyed), &on);
        assert_eq!(want.as_deref(), Some("b"));
        let ready = record_of(Step::Ready, None, Some("b"), 2);
        let (state, actions) = converge(want.as_deref(), &on, Some(&ready), EpochMs(9), &s);
        assert!(matches!(&state, State::Running { template, .. } if template == "b"));
        assert!(actions.is_empty(), "{actions:?}");
    }

    /// The same while the holder is being powered off (by a person, or for
    /// another): the restart finishes that, rather than keeping the holder.
    #[test]
    fn a_restart_after_a_newcomer_was_destroyed_mid_power_off_finishes_it() {
        let s = settings(0);
        let started = Event::Started {
            template: "a".into(),
            at_ms: EpochMs(5),
        };
        for next in [None, Some("c")] {
            let powering_off = State::PoweringOff {
                from: "b".into(),
                to: next.map(str::to_string),
                forced: false,
                since_ms: EpochMs(1),
            };
            let (_, actions) = step(&powering_off, &started, &s);
            let destroyed = destroyed_step(&actions);
            assert_eq!(destroyed.to.as_deref(), next);
            let on = ["b".to_string()];
            let want = wanted_without_schedule(Some(&destroyed), &on);
            assert_eq!(want.as_deref(), next);
            let asked = record_of(Step::PowerOffAsked, Some("b"), next, 1);
            let (state, actions) = converge(want.as_deref(), &on, Some(&asked), EpochMs(9), &s);
            assert!(
                matches!(&state, State::PoweringOff { from, to, .. }
                    if from == "b" && to.as_deref() == next),
                "{next:?}: {state:?}"
            );
            assert!(!starts_a_slice(&actions), "{actions:?}");
        }
    }

    /// A newcomer whose destroy a crash cut short is on beside the holder
    /// at the restart, and sorts first: the one the ledger last had on is
    /// kept (its power-off finished), the newcomer destroyed again, and
    /// the record names who holds the baseboard once settled (the next, or
    /// none). Any VM on was kept (the first by name): the newcomer was
    /// taken for found running, a slice begun for it, and the holder
    /// destroyed with its slice left open.
    #[test]
    fn a_restart_keeps_the_vm_the_ledger_had_on_not_a_newcomer() {
        let s = settings(0);
        let on = ["a".to_string(), "b".to_string()];
        for next in [None, Some("c")] {
            let asked = record_of(Step::PowerOffAsked, Some("b"), next, 1);
            let (state, actions) = converge(next, &on, Some(&asked), EpochMs(9), &s);
            assert!(
                matches!(&state, State::PoweringOff { from, to, .. }
                    if from == "b" && to.as_deref() == next),
                "{next:?}: {state:?}"
            );
            let destroyed = destroyed_step(&actions);
            assert_eq!(
                (destroyed.from.as_deref(), destroyed.to.as_deref()),
                (Some("a"), next)
            );
            assert!(!starts_a_slice(&actions), "{actions:?}");
        }
    }

    /// Two VMs found on at a start: the one not kept is destroyed, named as
    /// such (not a forced power-off of the holder), its slice closed, and names who holds the
    /// baseboard once settled: a restart after it neither powers the one
    /// kept off nor finds it running anew.
    #[test]
    fn a_second_vm_found_on_is_destroyed_and_a_restart_after_keeps_the_first() {
        let s = settings(0);
        let on = ["b".to_string(), "a".to_string()];
        let (state, actions) = converge(Some("b"), &on, None, EpochMs(5), &s);
        let destroyed = destroyed_step(&actions);
        assert_eq!(
            (destroyed.from.as_deref(), destroyed.to.as_deref()),
            (Some("a"), Some("b"))
        );
        assert_eq!(state.on(), Some("b"));
        // a's slice, if it had one open, ends with it (and only a's).
        let closed: Vec<&Action> = actions
            .iter()
            .filter(|a| matches!(a, Action::CloseSlice { .. }))
            .collect();
        assert_eq!(
            closed,
            [&Action::CloseSlice {
                template: "a".into(),
                at_ms: EpochMs(5),
                error: Some(
                    "destroyed at a start: on together with b; exactly one template VM may be on"
                        .into()
                ),
            }]
        );
        // The ledger then holds a's destroy, then b's start (found running):
        // a restart resumes from the start (last_state_step skips the destroy).
        let found = actions
            .iter()
            .find_map(|a| match a {
                Action::Record(r) if r.step == Step::Started => Some(r.clone()),
                _ => None,
            })
            .expect("b found running");
        let want = wanted_without_schedule(Some(&destroyed), &on[..1]);
        assert_eq!(want.as_deref(), Some("b"));
        let (state, actions) = converge(want.as_deref(), &on[..1], Some(&found), EpochMs(9), &s);
        assert_eq!(state.on(), Some("b"));
        assert!(!starts_a_slice(&actions), "{actions:?}");
    }

    /// The holder went off while the daemon was down and another VM was
    /// started: the holder's slice ends (a `stopped` step, SliceEnded)
    /// before the other is found running; it stayed open.
    #[test]
    fn a_holder_found_off_with_another_on_has_its_slice_ended() {
        let s = settings(0);
        let on = ["b".to_string()];
        for last in [
            record_of(Step::Ready, None, Some("a"), 2),
            record_of(Step::PowerOffAsked, Some("a"), Some("b"), 2),
        ] {
            let (state, actions) = converge(Some("b"), &on, Some(&last), EpochMs(9), &s);
            assert_eq!(state.on(), Some("b"));
            let ended = actions
                .iter()
                .position(|a| {
                    a == &Action::Signal(Signal::SliceEnded {
                        template: "a".into(),
                        at_ms: EpochMs(9),
                    })
                })
                .expect("a's slice ends");
            let stopped = actions
                .iter()
                .position(|a| matches!(a, Action::Record(r) if r.step == Step::Stopped && r.from.as_deref() == Some("a")))
                .expect("a's stop recorded");
            let found = actions
                .iter()
                .position(|a| matches!(a, Action::Record(r) if r.step == Step::Started && r.to.as_deref() == Some("b")))
                .expect("b found running");
            assert!(stopped < ended && ended < found, "{actions:?}");
        }
        // b's own start in flight: nothing of a's to end.
        let issued = record_of(Step::StartIssued, Some("a"), Some("b"), 2);
        let (_, actions) = converge(Some("b"), &on, Some(&issued), EpochMs(9), &s);
        let ends = |actions: &[Action]| {
            actions
                .iter()
                .any(|a| matches!(a, Action::Signal(Signal::SliceEnded { .. })))
        };
        assert!(!ends(&actions), "{actions:?}");
        // a on as well: destroyed, its slice closed as such, not "found off".
        let both = ["b".to_string(), "a".to_string()];
        let ready = record_of(Step::Ready, None, Some("a"), 2);
        let (_, actions) = converge(Some("b"), &both, Some(&ready), EpochMs(9), &s);
        assert!(!ends(&actions), "{actions:?}");
        assert_eq!(destroyed_step(&actions).from.as_deref(), Some("a"));
        // Killed after a's stop was recorded, before its slice closed: the
        // next start closes it.
        let stopped = record_of(Step::Stopped, Some("a"), Some("b"), 5);
        let (_, actions) = resume_from(Some(&stopped), Some("b"), EpochMs(9), &s);
        assert!(
            actions.contains(&Action::CloseSlice {
                template: "a".into(),
                at_ms: EpochMs(5),
                error: None
            }),
            "{actions:?}"
        );
    }

    #[test]
    fn a_resume_during_a_poweroff_changes_only_who_comes_next() {
        let s = settings(0);
        let p = State::PoweringOff {
            from: "a".into(),
            to: Some("b".into()),
            forced: false,
            since_ms: EpochMs(0),
        };
        let (state, actions) = step(&p, &due(Scheduled::Resume, "c", 5), &s);
        assert_eq!(actions, [requested(Some("c"), 5)], "only recorded");
        // The same again changes nothing, and records nothing.
        assert_eq!(step(&state, &due(Scheduled::Resume, "c", 6), &s).1, []);
        assert_eq!(state.target(), Some("c"));
        assert_eq!(state.on(), Some("a"));
        assert_eq!(state.state_of("a"), VmState::Stopping);
        assert_eq!(state.state_of("c"), VmState::Waiting);
        assert_eq!(state.state_of("b"), VmState::Off);
    }

    fn rec(step: Step, from: Option<&str>, to: Option<&str>, at_ms: u64) -> Record {
        Record {
            step,
            from: from.map(Into::into),
            to: to.map(Into::into),
            at_ms: EpochMs(at_ms),
            detail: None,
        }
    }

    /// A daemon stopped between recording a slice's end and closing it in
    /// the ledger closes it at start-up, at the recorded time.
    #[test]
    fn a_restart_closes_the_slice_whose_end_was_recorded() {
        let s = settings(300_000);
        let stopped = rec(Step::Stopped, Some("a"), Some("b"), 7_000);
        let (state, actions) = resume_from(Some(&stopped), None, EpochMs(9_000), &s);
        assert!(matches!(state, State::AwaitingRelease { .. }), "{state:?}");
        assert!(actions.contains(&Action::CloseSlice {
            template: "a".into(),
            at_ms: EpochMs(7_000),
            error: None
        }));
        let mut failed = rec(Step::Failed, None, Some("b"), 8_000);
        failed.detail = Some("no such domain".into());
        let (_, actions) = resume_from(Some(&failed), None, EpochMs(9_000), &s);
        assert!(actions.contains(&Action::CloseSlice {
            template: "b".into(),
            at_ms: EpochMs(8_000),
            error: Some("no such domain".into())
        }));
    }

    #[test]
    fn a_restart_finishes_the_recorded_handoff() {
        let s = settings(300_000);
        // Killed while powering a off: asked again, the deadline kept.
        let asked = rec(Step::PowerOffAsked, Some("a"), Some("b"), 1_000);
        let (state, actions) = resume_from(Some(&asked), Some("a"), EpochMs(5_000), &s);
        assert_eq!(
            state,
            State::PoweringOff {
                from: "a".into(),
                to: Some("b".into()),
                forced: false,
                since_ms: EpochMs(1_000)
            }
        );
        assert_eq!(
            actions,
            [
                Action::Shutdown {
                    template: "a".into()
                },
                Action::SetTimer {
                    at_ms: EpochMs(61_000)
                }
            ]
        );
        // It stopped while we were down: release is checked.
        let (state, actions) = resume_from(Some(&asked), None, EpochMs(5_000), &s);
        assert!(matches!(
            state,
            State::AwaitingRelease {
                stopped_ms: EpochMs(5_000),
                ..
            }
        ));
        assert_eq!(steps(&actions), ["stopped"]);
        assert!(has(&actions, &Action::CheckRelease));
        // Release was confirmed: the buffer counts from then.
        let released = rec(Step::ReleaseConfirmed, Some("a"), Some("b"), 2_000);
        let (state, actions) = resume_from(Some(&released), None, EpochMs(5_000), &s);
        assert_eq!(
            state,
            State::Buffer {
                to: "b".into(),
                release_confirmed_ms: Some(EpochMs(2_000)),
                until_ms: EpochMs(302_000)
            }
        );
        assert_eq!(
            actions,
            [Action::SetTimer {
                at_ms: EpochMs(302_000)
            }]
        );
        // A create that may not have run: checked again before redoing it.
        let issued = rec(Step::StartIssued, None, Some("b"), 302_000);
        let (state, actions) = resume_from(Some(&issued), None, EpochMs(303_000), &s);
        assert!(matches!(
            state,
            State::Buffer {
                until_ms: EpochMs(303_000),
                ..
            }
        ));
        assert_eq!(actions[0], Action::CheckRelease);
        // It did run: probe it.
        let (state, actions) = resume_from(Some(&issued), Some("b"), EpochMs(303_000), &s);
        assert!(matches!(
            state,
            State::AwaitingReady {
                issued_ms: EpochMs(302_000),
                ..
            }
        ));
        assert!(has(
            &actions,
            &Action::Probe {
                template: "b".into()
            }
        ));
        let ready = rec(Step::Ready, None, Some("b"), 310_000);
        assert_eq!(
            resume_from(Some(&ready), Some("b"), EpochMs(400_000), &s).0,
            running_since("b", 310_000)
        );
    }

    #[test]
    fn converge_goes_straight_to_what_is_wanted_now() {
        let s = settings(0);
        let ready_a = rec(Step::Ready, None, Some("a"), 1_000);
        // Down for days; the schedule now says c: a hands over to c, once.
        let (state, actions) = converge(
            Some("c"),
            &["a".into()],
            Some(&ready_a),
            EpochMs(9_000_000),
            &s,
        );
        assert!(matches!(
            &state,
            State::PoweringOff { from, to: Some(to), .. } if from == "a" && to == "c"
        ));
        assert_eq!(steps(&actions), ["power-off-asked"]);
        // Nothing wanted: the holder is powered off.
        let (state, _) = converge(None, &["a".into()], Some(&ready_a), EpochMs(9_000_000), &s);
        assert_eq!(state.target(), None);
        // Already as wanted: nothing at all.
        let (state, actions) = converge(
            Some("a"),
            &["a".into()],
            Some(&ready_a),
            EpochMs(9_000_000),
            &s,
        );
        assert_eq!(state, running_since("a", 1_000));
        assert!(actions.is_empty());
        // Two on (someone else's doing): all but the wanted one destroyed.
        let (state, actions) = converge(
            Some("b"),
            &["a".into(), "b".into()],
            Some(&ready_a),
            EpochMs(9_000_000),
            &s,
        );
        assert_eq!(state.on(), Some("b"));
        assert!(has(
            &actions,
            &Action::Destroy {
                template: "a".into()
            }
        ));
        assert!(!has(
            &actions,
            &Action::Destroy {
                template: "b".into()
            }
        ));
        // Nothing on, something wanted: a release check first, never a create.
        let (state, actions) = converge(Some("b"), &[], None, EpochMs(9_000_000), &s);
        assert!(matches!(state, State::Buffer { .. }));
        assert!(!actions.iter().any(|a| matches!(a, Action::Create { .. })));
    }

    #[test]
    fn steps_have_stable_names() {
        for (step, name) in STEPS {
            assert_eq!(step.as_str(), name);
            assert_eq!(Step::parse(name), Some(step));
        }
        assert_eq!(Step::parse("nope"), None);
    }
}
