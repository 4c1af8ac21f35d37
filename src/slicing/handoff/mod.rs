//! The handoff interlock of one baseboard as a pure state machine: the
//! caller feeds [`Event`]s (scheduled actions, libvirt lifecycle events, the
//! answers to its checks, timers, manual requests) to [`step`] and carries
//! out the returned [`HandoffAction`]s in order. No I/O and no clock: every event
//! carries its time, the caller's clock when it hands the event over (never
//! going back), so records come out in time order.
//!
//! A handoff is power-off (ACPI; destroyed when the stop timeout passes) →
//! STOPPED → release confirmed (no active domain holds the baseboard's
//! devices) → at least the buffer → create the incoming VM → started →
//! ready (its readiness probe passes). Exactly one template VM is ever on:
//! [`HandoffAction::Create`] is only ever returned in the step that handles a
//! [`Event::Released`] (or retries a create that failed, when nothing came
//! on), and only while the machine holds no VM.
//!
//! # Contract with the caller
//!
//! - Carry the actions out in the order given: each step's [`HandoffAction::Record`]
//!   comes before the libvirt call it announces, so a daemon killed between
//!   the two finds the intent in the ledger ([`converge`]).
//! - [`HandoffAction::SetTimer`] replaces the pending wake-up (there is one); when
//!   it is due, send [`Event::Timer`]. Stale or early timers are harmless.
//! - [`HandoffAction::CheckRelease`]: if no active domain (template VM or any other)
//!   holds the baseboard's devices — and no other template VM of this
//!   baseboard is active, which covers an empty baseboard — send
//!   [`Event::Released`] at once; otherwise send nothing (the machine asks
//!   again every `poll_ms`).
//! - [`HandoffAction::Create`]: answer [`Event::Started`] or [`Event::StartFailed`]
//!   with libvirt's error. Forward libvirt's STARTED and STOPPED lifecycle
//!   events of template domains too (a repeat is harmless; a template VM
//!   started behind the daemon's back is taken in, or destroyed if another
//!   is on). An event can wait in a queue while the domain changes again,
//!   so send Stopped only while the domain is inactive and Started only
//!   while it is active (virDomainIsActive when the event is handled): a
//!   stale STOPPED must never end the VM created after it. [`HandoffAction::Probe`]: probe once (TCP, HTTP, guest
//!   agent) and send [`Event::Ready`] if it passed; a template whose
//!   readiness is libvirt's STARTED answers Ready at once.
//! - Every [`HandoffAction::Record`] goes to the ledger and out as the HandoffStep
//!   signal; [`HandoffAction::Signal`] carries the slice signals.
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
pub struct HandoffTimings {
    /// 0 starts the incoming VM as soon as the release is confirmed.
    pub buffer_ms: u64,
    pub poll_ms: u64,
    pub limits: Limits,
    pub per_template: BTreeMap<String, Limits>,
}

impl Default for HandoffTimings {
    fn default() -> HandoffTimings {
        HandoffTimings {
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

impl HandoffTimings {
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
pub enum HandoffState {
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

impl HandoffState {
    /// The state once `template` is removed (its VM off or failed): a
    /// failure that was its own goes with it, so a template created again
    /// under the name starts off (#52). The baseboard was free.
    pub fn without(&self, template: &str) -> HandoffState {
        match self {
            HandoffState::Failed { template: t, .. } if t == template => {
                HandoffState::Idle { released_ms: None }
            }
            other => other.clone(),
        }
    }

    /// The template whose VM is, or may be, on.
    pub fn on(&self) -> Option<&str> {
        match self {
            HandoffState::PoweringOff { from, .. } => Some(from),
            HandoffState::Starting { to, .. } | HandoffState::AwaitingReady { to, .. } => Some(to),
            HandoffState::Running { template, .. } => Some(template),
            _ => None,
        }
    }

    /// The template that holds the baseboard once the machine settles.
    pub fn target(&self) -> Option<&str> {
        match self {
            HandoffState::Idle { .. } | HandoffState::Failed { .. } => None,
            HandoffState::PoweringOff { to, .. } | HandoffState::AwaitingRelease { to, .. } => {
                to.as_deref()
            }
            HandoffState::Buffer { to, .. }
            | HandoffState::Starting { to, .. }
            | HandoffState::AwaitingReady { to, .. } => Some(to),
            HandoffState::Running { template, .. } => Some(template),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            HandoffState::Idle { .. } => "idle",
            HandoffState::PoweringOff { .. } => "powering-off",
            HandoffState::AwaitingRelease { .. } => "awaiting-release",
            HandoffState::Buffer { .. } => "buffer",
            HandoffState::Starting { .. } => "starting",
            HandoffState::AwaitingReady { .. } => "awaiting-ready",
            HandoffState::Running { .. } => "running",
            HandoffState::Failed { .. } => "failed",
        }
    }

    /// One template's VM, as its D-Bus object and the page show it.
    pub fn state_of(&self, template: &str) -> VmState {
        match self {
            HandoffState::PoweringOff { from, .. } if from == template => VmState::Stopping,
            HandoffState::Starting { to, .. } | HandoffState::AwaitingReady { to, .. }
                if to == template =>
            {
                VmState::Starting
            }
            HandoffState::Running { template: t, .. } if t == template => VmState::Running,
            HandoffState::Failed { template: t, .. } if t == template => VmState::Failed,
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
    /// The answer to [`HandoffAction::CheckRelease`]: nothing holds the devices.
    Released { at_ms: EpochMs },
    /// Force the power-off now (the same as the stop-timeout timer).
    StopTimeout { at_ms: EpochMs },
    /// The wake-up asked by [`HandoffAction::SetTimer`].
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
pub enum HandoffAction {
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

mod converge;
mod machine;

#[cfg(test)]
use converge::Due;
pub use converge::{converge, resume_from, wanted_without_schedule};
pub use machine::step;

#[cfg(test)]
mod tests;
