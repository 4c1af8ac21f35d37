//! What the adaptors (D-Bus, the page) and the loop's own tasks ask of the
//! service loop, and what it answers. Each request carries a oneshot for its
//! reply; results of work done off the loop (launches, hypervisor calls,
//! staging) come back as commands too, so the loop never waits on them.

use crate::access::Caller;
use crate::error::Result;
use crate::slicing::handoff::Event;
use crate::slicing::meter::GpuSample;
use crate::slicing::template::Defined;
use crate::time::EpochMs;
use crate::views::PageSnapshot;
use crate::wire::{EndedRow, GpuRow, Sharers, SliceReportRow, SliceRow, TemplateRow, WhyNot};
use crate::workload::{Exit, Found, Kind};
use tokio::sync::oneshot;

pub type Reply<T> = oneshot::Sender<T>;

/// How long a submit may wait for the loop and still be carried out. D-Bus
/// clients give up after 25 s by default (libdbus, sd-bus, GDBus): a submit
/// older than this is refused with Busy, so nobody is told "timed out" about
/// a worker that was placed after all.
pub const SUBMIT_PATIENCE: std::time::Duration = std::time::Duration::from_secs(20);

/// A submitted worker: placed now or waiting, with why.
#[derive(Clone, Debug, PartialEq)]
pub struct Submitted {
    pub name: String,
    pub state: crate::worker::State,
    pub reasons: Vec<String>,
}

/// A window of time callers give in epoch seconds, checked when made: the
/// adaptor refuses a bad one before the caller waits for anything (a turn,
/// the loop).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    from: jiff::Timestamp,
    to: jiff::Timestamp,
}

/// The longest window a report or a slice listing answers for.
pub const MAX_WINDOW_DAYS: i64 = 400;

impl Window {
    /// Both ends (epoch seconds) within years 1 to 9999, `to` after
    /// `from`, at most [`MAX_WINDOW_DAYS`] apart. The `*Ms` methods' windows
    /// are [`Window::checked_ms`]; this is the first methods'.
    pub fn checked(from: i64, to: i64) -> Result<Window> {
        Self::checked_in(from, to, 1000, "epoch seconds")
    }

    /// As [`Window::checked`], both ends in epoch milliseconds.
    pub fn checked_ms(from_ms: i64, to_ms: i64) -> Result<Window> {
        Self::checked_in(from_ms, to_ms, 1, "epoch milliseconds")
    }

    fn checked_in(from: i64, to: i64, ms_each: i64, unit: &str) -> Result<Window> {
        use crate::error::Error;
        let ts = |field: &str, v: i64| {
            v.checked_mul(ms_each)
                .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
                .ok_or_else(|| Error::field(field, format!("{unit} within years 1 to 9999")))
        };
        let (f, t) = (ts("from", from)?, ts("to", to)?);
        if t <= f {
            return Err(Error::field("to", "must be after from"));
        }
        if t.as_millisecond() - f.as_millisecond() > MAX_WINDOW_DAYS * 86_400_000 {
            return Err(Error::field(
                "to",
                format!("a window of at most {MAX_WINDOW_DAYS} days"),
            ));
        }
        Ok(Window { from: f, to: t })
    }

    pub fn from(&self) -> jiff::Timestamp {
        self.from
    }

    pub fn to(&self) -> jiff::Timestamp {
        self.to
    }
}

pub enum Command {
    // ---- from the bus: workers ----
    Submit {
        spec: String,
        caller: Caller,
        /// When the call came: one that waited past [`SUBMIT_PATIENCE`] is
        /// refused unprocessed (its caller has most likely given up).
        asked: std::time::Instant,
        reply: Reply<Result<Submitted>>,
    },
    Stop {
        name: String,
        caller: Caller,
        reply: Reply<Result<()>>,
    },
    GetWorker {
        name: String,
        reply: Reply<Result<String>>,
    },
    // ---- from the bus: Kubernetes claims (the kubelet plugin, claim.rs) ----
    /// A claim's device booked as a worker: its name and its share's text
    /// (`ASTRAEUS_GPU_MEMORY_GB`), or the GPU's whole memory.
    PrepareClaim {
        claim: crate::claim::Claim,
        caller: Caller,
        reply: Reply<Result<(String, String)>>,
    },
    /// A claim's worker ended (none: nothing to do).
    UnprepareClaim {
        uid: String,
        caller: Caller,
        reply: Reply<Result<()>>,
    },
    /// A container of a prepared claim, named by its process (the CDI
    /// hook's call, `astraeusctl claim-hook`): its control group becomes
    /// the claim's (holders, limits). Answers how its share is held.
    BindClaim {
        uid: String,
        pid: u32,
        caller: Caller,
        reply: Reply<Result<String>>,
    },
    /// Each claim booked here: (worker, UID, namespace, name).
    ListClaims {
        reply: Reply<Vec<(String, String, String, String)>>,
    },
    /// What each GPU offers the cluster now.
    ClusterOffers {
        reply: Reply<Vec<crate::node::ClusterOffer>>,
    },
    ListEnded {
        since_ms: i64,
        limit: u32,
        reply: Reply<Result<Vec<EndedRow>>>,
    },
    ListGpus {
        reply: Reply<Vec<GpuRow>>,
    },
    ListSharers {
        gpu: u32,
        reply: Reply<Result<Sharers>>,
    },
    WhyNot {
        spec: String,
        reply: Reply<Result<WhyNot>>,
    },
    UsageReport {
        window: Window,
        group_by: crate::report::GroupBy,
        reply: Reply<Result<Vec<crate::report::Row>>>,
    },
    /// Everything the machine page shows, in one go.
    PageSnapshot {
        reply: Reply<PageSnapshot>,
    },

    // ---- from the bus: time-slicing ----
    SetSchedule {
        template: String,
        actions: String,
        caller: Caller,
        reply: Reply<Result<()>>,
    },
    /// A dry run of SetSchedule: the next slices and notes, nothing saved.
    PreviewSchedule {
        template: String,
        actions: String,
        caller: Caller,
        reply: Reply<Result<(Vec<SliceRow>, Vec<String>)>>,
    },
    GetSchedule {
        template: String,
        reply: Reply<Result<String>>,
    },
    ListSlices {
        window: Window,
        reply: Reply<Result<Vec<SliceRow>>>,
    },
    ListNextSlices {
        count: u32,
        reply: Reply<Result<Vec<SliceRow>>>,
    },
    ListSliceNotes {
        window: Window,
        reply: Reply<Result<Vec<String>>>,
    },
    /// A template and its persistent VM (root only).
    CreateTemplate {
        spec: String,
        caller: Caller,
        reply: Reply<Result<String>>,
    },
    RemoveTemplate {
        name: String,
        caller: Caller,
        reply: Reply<Result<()>>,
    },
    ListTemplates {
        reply: Reply<Vec<TemplateRow>>,
    },
    /// A person's resume or power-off of a template's VM (root only).
    Resume {
        template: String,
        as_handoff: bool,
        caller: Caller,
        reply: Reply<Result<()>>,
    },
    PowerOff {
        template: String,
        hard: bool,
        caller: Caller,
        reply: Reply<Result<()>>,
    },
    /// Builds a template's weights disk from a source directory (root only).
    StageWeights {
        template: String,
        source: String,
        caller: Caller,
        reply: Reply<Result<()>>,
    },
    SliceReport {
        template: String,
        window: Window,
        reply: Reply<Result<Vec<SliceReportRow>>>,
    },

    // ---- from the loop's own tasks ----
    /// A SetSchedule whose conflicts were checked off the loop.
    ScheduleChecked {
        change: crate::node::ScheduleChange,
        checked: Result<()>,
        caller: Caller,
        reply: Reply<Result<()>>,
    },
    /// A launch task: the workload started (its runtime id) or failed.
    Launched {
        name: String,
        kind: Kind,
        result: Result<crate::workload::Started>,
    },
    /// A launched workload's control group, once its runtime told it.
    Cgroup {
        name: String,
        cgroup: String,
    },
    /// The control group of a claim's container, read off the loop
    /// (None: its process is gone or in no group of its own).
    ClaimCgroup {
        name: String,
        id: i64,
        pid: u32,
        cgroup: Option<String>,
        /// Whether the group bound before still has a process.
        bound_alive: bool,
        reply: Reply<Result<String>>,
    },
    /// What setting (or checking) a shared worker's GPU memory limits found.
    Enforced {
        name: String,
        id: i64,
        enforcement: crate::memory_limits::Enforcement,
    },
    /// A watcher: the workload ended.
    Exited {
        name: String,
        kind: Kind,
        id: String,
        exit: Exit,
    },
    /// After a start: what a runtime runs, to reconcile the ledger with;
    /// `tries` listings of it failed before this one.
    Listed {
        kind: Kind,
        found: Result<Vec<Found>>,
        tries: u32,
    },
    /// A new template's VM, looked up or defined in libvirt.
    TemplatePrepared {
        spec: String,
        result: Result<Box<Defined>>,
        reply: Reply<Result<String>>,
    },
    /// The staging task: done (checksum, whether the disk changed) or failed.
    WeightsStaged {
        template: String,
        result: Result<(String, bool)>,
    },
    /// A handoff event from a libvirt task (a failed create, a release confirmed…).
    Slice(Event),
    /// A libvirt lifecycle event, with whether the domain runs now (asked
    /// off the loop: a late STOPPED of an earlier run must not end a new one).
    Lifecycle {
        domain: String,
        event: crate::workload::VmEvent,
        on: bool,
        at: EpochMs,
    },
    /// After a start: which templates' VMs run, to converge the handoff to.
    Running {
        on: Vec<String>,
    },
    /// The running slice VM's CPU time (ns) and vCPUs, read at `at`.
    SliceCpu {
        template: String,
        at: EpochMs,
        cpu: Option<(u64, u32)>,
    },
    /// One GPU's figures, from what the running slice's guest wrote.
    GuestGpu {
        template: String,
        sample: GpuSample,
        at: EpochMs,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(w: Result<Window>) -> String {
        match w {
            Ok(w) => panic!("accepted {:?}..{:?}", w.from(), w.to()),
            Err(e) => e.message().to_string(),
        }
    }

    #[test]
    fn a_window_in_ms_is_the_window_in_seconds_times_a_thousand() {
        let s = Window::checked(1_700_000_000, 1_700_086_400).unwrap();
        let ms = Window::checked_ms(1_700_000_000_000, 1_700_086_400_000).unwrap();
        assert_eq!((s.from(), s.to()), (ms.from(), ms.to()));
        // Milliseconds are kept, not rounded to seconds.
        let odd = Window::checked_ms(1_700_000_000_001, 1_700_000_000_002).unwrap();
        assert_eq!(odd.from().as_millisecond(), 1_700_000_000_001);
    }

    #[test]
    fn a_window_names_the_field_and_the_unit_it_wants() {
        let days = MAX_WINDOW_DAYS * 86_400_000;
        assert!(Window::checked_ms(0, days).is_ok());
        assert!(refusal(Window::checked_ms(0, days + 1)).contains("at most 400 days"));
        assert!(refusal(Window::checked_ms(5, 5)).contains("to: must be after from"));
        let far = refusal(Window::checked_ms(i64::MAX, i64::MAX));
        assert!(
            far.starts_with("from: epoch milliseconds within years"),
            "{far}"
        );
        let far = refusal(Window::checked(0, i64::MAX / 10));
        assert!(far.starts_with("to: epoch seconds within years"), "{far}");
    }
}
