//! The time-slicing engine (#52): synchronous and without I/O — the
//! templates and the handoff's state, the settings each handoff runs by,
//! its timer and the scheduled actions' cursor, convergence and pausing.
//! Time comes in with each event (only `wake_ups` reads the clock, for how
//! long until the timer). The service feeds it events
//! ([`TimeSlicing::step`]), has it record each handoff step
//! ([`TimeSlicing::record`], through the node) and carries out the other
//! actions it returns, in order (signals, libvirt calls in tasks); tests
//! drive it directly (tests/time_slicing.rs), as tests/engine.rs drives
//! [`super::Node`].

use crate::schedule::{self, ScheduledAction};
use crate::slicing::handoff::{self, Event, HandoffAction, HandoffState};
use crate::slicing::template::Defined;
use crate::time::EpochMs;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// A paused time-slicing (the ledger refused a step) tries again after
/// this, doubled each time it is refused again, up to RELEARN_AT_MOST.
pub const RELEARN_AFTER: Duration = Duration::from_secs(5);
pub const RELEARN_AT_MOST: Duration = Duration::from_secs(60);

/// What the configuration says of time-slicing.
#[derive(Clone, Copy, Debug)]
pub struct Rules {
    /// At least this long between one slice's power-off and the next resume.
    pub buffer_ms: u64,
    /// A power-off is forced after this long (templates may say otherwise).
    pub stop_timeout_ms: u64,
    /// Accept weights disks on networked filesystems.
    pub allow_networked_weights: bool,
    /// Accept templates with an empty baseboard.
    pub allow_no_baseboard: bool,
}

/// Where the engine writes what it keeps in the ledger (handoff steps,
/// templates): the node, or a test's stand-in. Each call one transaction;
/// the engine changes its memory only after the ledger took the change.
pub trait SlicingLedger {
    fn record_step(&mut self, r: &handoff::Record) -> crate::error::Result<()>;
    fn insert_template(&mut self, name: &str, spec: &str, at: EpochMs) -> crate::error::Result<()>;
    /// Removes the template and its schedule.
    fn remove_template(&mut self, name: &str) -> crate::error::Result<()>;
}

impl SlicingLedger for super::Node {
    fn record_step(&mut self, r: &handoff::Record) -> crate::error::Result<()> {
        self.store.record_step(r)
    }
    fn insert_template(&mut self, name: &str, spec: &str, at: EpochMs) -> crate::error::Result<()> {
        self.store.insert_template(name, spec, at)
    }
    fn remove_template(&mut self, name: &str) -> crate::error::Result<()> {
        super::Node::remove_template(self, name).map(|_| ())
    }
}

pub struct TimeSlicing {
    templates: BTreeMap<String, Defined>,
    state: HandoffState,
    settings: handoff::HandoffTimings,
    /// The handoff machine's wake-up.
    timer: Option<EpochMs>,
    /// Scheduled actions have fired up to here.
    cursor: jiff::Timestamp,
    /// Whether the state has been converged to what runs after the start
    /// (libvirt answered): until then no action fires and no person's
    /// request is taken, since the handoff would start from a guess.
    converged: bool,
    /// Paused (the ledger refused a step, or could not say the last one):
    /// when to learn what runs again and start from the ledger afresh.
    relearn_at: Option<std::time::Instant>,
    /// How long the next pause waits: doubled while the ledger keeps
    /// refusing (a disk that stays full), back to the least once it takes
    /// a step again.
    relearn_after: Duration,
    /// Paused, and not converged since (requests are told so; the journal
    /// is told when it resumes).
    paused: bool,
    /// Converged once since the start: actions missed while the daemon was
    /// down are recorded as skipped only then.
    started: bool,
    /// Accept weights disks on networked filesystems (config).
    allow_networked_weights: bool,
    /// Accept templates with an empty baseboard (config).
    allow_no_baseboard: bool,
    /// Each template's last handoff dead time (ms), for the metrics.
    dead_times: BTreeMap<String, u64>,
    /// Templates whose weights are being staged (their VM may not start).
    staging: BTreeSet<String>,
    /// While not converged, whether each template's VM runs by its last
    /// lifecycle event: libvirt's answer to "what runs" may be older.
    missed: BTreeMap<String, bool>,
}

impl TimeSlicing {
    /// With the templates the ledger holds (`stored`: name and spec);
    /// not converged: nothing fires until what runs is learned.
    pub fn new(rules: Rules, stored: Vec<(String, String)>, now: jiff::Timestamp) -> TimeSlicing {
        let mut s = TimeSlicing {
            templates: BTreeMap::new(),
            state: HandoffState::Idle { released_ms: None },
            settings: handoff::HandoffTimings {
                buffer_ms: rules.buffer_ms,
                poll_ms: 1000,
                limits: handoff::Limits {
                    stop_timeout_ms: rules.stop_timeout_ms,
                    start_retries: handoff::DEFAULT_START_RETRIES,
                },
                per_template: Default::default(),
            },
            timer: None,
            cursor: now,
            converged: false,
            relearn_at: None,
            relearn_after: RELEARN_AFTER,
            paused: false,
            started: false,
            allow_networked_weights: rules.allow_networked_weights,
            allow_no_baseboard: rules.allow_no_baseboard,
            dead_times: BTreeMap::new(),
            staging: BTreeSet::new(),
            missed: BTreeMap::new(),
        };
        for (name, spec) in stored {
            match Defined::restore(&spec) {
                Ok(d) => {
                    s.templates.insert(name, d);
                }
                Err(e) => tracing::error!(template = %name, "template {name} unreadable: {e}"),
            }
        }
        s.refresh_limits();
        s
    }

    /// What a convergence would do, from what runs (`on`) and the ledger's
    /// last step (`last`), and `state_step`: None when `last` is the step to
    /// resume from; Some(the last step that changed the state) when `last`
    /// was a request or a destroy beside the holder (Some(None): there is
    /// no such step). Returns
    /// the template that should be on (with a schedule, the one it says
    /// now; without, what a person last asked for, or what runs), the state
    /// to take and the actions to carry out. Nothing changes until
    /// [`TimeSlicing::converge_to`].
    #[allow(clippy::type_complexity)]
    pub fn plan_convergence(
        &self,
        rotation: &[(String, Vec<ScheduledAction>)],
        (now, tz): (jiff::Timestamp, &jiff::tz::TimeZone),
        on: &[String],
        last: Option<&handoff::Record>,
        state_step: Option<Option<&handoff::Record>>,
        now_ms: EpochMs,
    ) -> (Option<String>, HandoffState, Vec<HandoffAction>) {
        let scheduled = rotation.iter().any(|(_, a)| !a.is_empty());
        let want = if scheduled {
            crate::rotation::owner_now(rotation, now, tz).filter(|t| self.templates.contains_key(t))
        } else {
            handoff::wanted_without_schedule(last, on)
        };
        let resume_from = state_step.unwrap_or(last);
        let (state, actions) =
            handoff::converge(want.as_deref(), on, resume_from, now_ms, &self.settings);
        (want, state, actions)
    }

    /// Converged: from now on, `state` (what the schedule wants, from what
    /// runs and the ledger's last step), with scheduled actions counted
    /// from `now`; the state before is returned (the ledger's, should the
    /// convergence's steps be refused).
    pub fn converge_to(&mut self, state: HandoffState, now: jiff::Timestamp) -> HandoffState {
        self.cursor = now;
        self.converged = true;
        self.started = true;
        std::mem::replace(&mut self.state, state)
    }

    /// Paused (the ledger refused a step, or could not say the last one):
    /// back to `back_to` (the state the ledger holds) when given, and not
    /// converged: no event steps, no action fires, no timer runs.
    pub fn pause(&mut self, back_to: Option<HandoffState>) {
        if let Some(state) = back_to {
            self.state = state;
        }
        self.converged = false;
        self.paused = true;
        self.timer = None;
    }

    /// When a pause learns what runs again: after the back-off, doubled
    /// each time (a disk that stays full), up to a minute; the wait.
    pub fn relearn_later(&mut self, now: std::time::Instant) -> Duration {
        let wait = self.relearn_after;
        self.relearn_after = (wait * 2).min(RELEARN_AT_MOST);
        self.relearn_at = Some(now + wait);
        wait
    }

    /// Whether a pause's time is up (taken: it is asked once).
    pub fn relearn_due(&mut self, now: std::time::Instant) -> bool {
        let due = !self.converged && self.relearn_at.is_some_and(|t| now >= t);
        if due {
            self.relearn_at = None;
        }
        due
    }

    /// The ledger took a step again: a later pause waits the least.
    pub fn step_recorded(&mut self) {
        self.relearn_after = RELEARN_AFTER;
    }

    /// Records one handoff step, before anything that follows it is done.
    /// Refused (a full disk), nothing after it may be done but what
    /// [`interlock_after_refusal`] keeps, and the caller pauses.
    pub fn record(
        &mut self,
        ledger: &mut dyn SlicingLedger,
        r: &handoff::Record,
    ) -> crate::error::Result<()> {
        ledger.record_step(r)?;
        self.step_recorded();
        Ok(())
    }

    /// One event into the handoff machine: the new state is taken, and the
    /// state before and the actions to carry out are returned — None, and
    /// nothing changed, while not converged (starting, or paused: the
    /// state in memory is a guess or past what the ledger holds; what
    /// happened meanwhile is read at the convergence).
    pub fn step(&mut self, event: &Event) -> Option<(HandoffState, Vec<HandoffAction>)> {
        if !self.converged {
            return None;
        }
        let (state, actions) = handoff::step(&self.state, event, &self.settings);
        Some((std::mem::replace(&mut self.state, state), actions))
    }

    /// The handoff timer, and the next scheduled actions due after the cursor.
    #[allow(clippy::type_complexity)]
    pub fn wake_ups(
        &self,
        rotation: &[(String, Vec<ScheduledAction>)],
        tz: &jiff::tz::TimeZone,
    ) -> (
        Option<Duration>,
        Option<(jiff::Timestamp, Vec<(String, schedule::Action)>)>,
    ) {
        if !self.converged {
            return (None, None);
        }
        let timer = self.timer.map(EpochMs::from_now);
        (timer, next_due(self.cursor, rotation, tz))
    }

    /// The templates, by name.
    pub fn templates(&self) -> &BTreeMap<String, Defined> {
        &self.templates
    }

    pub fn template(&self, name: &str) -> Option<&Defined> {
        self.templates.get(name)
    }

    /// The handoff's state.
    pub fn state(&self) -> &HandoffState {
        &self.state
    }

    /// Converged since the start or the last pause: events step, actions fire.
    pub fn is_converged(&self) -> bool {
        self.converged
    }

    /// Paused, and not converged since.
    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// The handoff machine's pending wake-up.
    pub fn timer(&self) -> Option<EpochMs> {
        self.timer
    }

    /// Each template's last handoff dead time (ms).
    pub fn dead_times(&self) -> &BTreeMap<String, u64> {
        &self.dead_times
    }

    /// Whether a template's weights are being staged (its VM may not start).
    pub fn is_staging(&self, template: &str) -> bool {
        self.staging.contains(template)
    }

    /// Since when scheduled actions missed count as skipped: the cursor,
    /// once converged since the start (None before: the ledger says).
    pub fn skipped_since(&self) -> Option<jiff::Timestamp> {
        self.started.then_some(self.cursor)
    }

    /// The machine's `SetTimer`: its one wake-up, replaced.
    pub fn set_timer(&mut self, at: EpochMs) {
        self.timer = Some(at);
    }

    /// The wake-up came (the machine is fed `Event::Timer` next).
    pub fn timer_fired(&mut self) {
        self.timer = None;
    }

    /// Scheduled actions up to `at` have fired.
    pub fn fired_up_to(&mut self, at: jiff::Timestamp) {
        self.cursor = at;
    }

    /// A template VM's lifecycle event while not converged: only whether
    /// it runs is kept (the last word of each VM), for the convergence.
    /// False when converged: the event is for [`TimeSlicing::step`].
    pub fn keep_while_learning(&mut self, template: &str, on: bool) -> bool {
        if self.converged {
            return false;
        }
        self.missed.insert(template.to_string(), on);
        true
    }

    /// What was kept while not converged, taken.
    pub fn take_missed(&mut self) -> BTreeMap<String, bool> {
        std::mem::take(&mut self.missed)
    }

    /// Converged after a pause: true once (the journal says it resumed).
    pub fn take_resumed(&mut self) -> bool {
        std::mem::take(&mut self.paused)
    }

    /// A template's weights begin staging; false when they already are.
    pub fn begin_staging(&mut self, template: &str) -> bool {
        self.staging.insert(template.to_string())
    }

    pub fn staging_done(&mut self, template: &str) {
        self.staging.remove(template);
    }

    /// A slice began after a handoff that left the baseboard dead this long.
    pub fn slice_began(&mut self, template: &str, dead_time_ms: Option<u64>) {
        if let Some(ms) = dead_time_ms {
            self.dead_times.insert(template.to_string(), ms);
        }
    }

    /// A new template's checks against the rules and the templates defined
    /// (`fs_type`: the filesystem its weights disk is on, when it has one),
    /// before its VM is looked up.
    pub fn check_new(
        &self,
        t: &crate::slicing::template::Template,
        fs_type: &str,
    ) -> crate::error::Result<()> {
        use crate::slicing::template;
        template::check_has_baseboard(t, self.allow_no_baseboard)?;
        Defined::check_new(t, &self.others(), None)?;
        if let Some(weights) = &t.weights_disk {
            template::check_weights_local(weights, fs_type, self.allow_networked_weights)?;
        }
        Ok(())
    }

    /// A template whose VM libvirt knows: checked again against the
    /// templates defined meanwhile, recorded, then kept.
    pub fn add_template(
        &mut self,
        ledger: &mut dyn SlicingLedger,
        spec: &str,
        defined: Defined,
        at: EpochMs,
    ) -> crate::error::Result<String> {
        Defined::check_new(&defined.template, &self.others(), Some(&defined.domain))?;
        let name = defined.template.name.clone();
        ledger.insert_template(&name, spec, at)?;
        self.templates.insert(name.clone(), defined);
        self.refresh_limits();
        Ok(name)
    }

    /// Removes a template whose VM is off (or failed to start: nothing of
    /// it runs): from the ledger, with its schedule, then from memory, its
    /// handoff figures too (one created again under the name starts
    /// without them). Its libvirt domain is kept.
    pub fn remove_template(
        &mut self,
        ledger: &mut dyn SlicingLedger,
        name: &str,
    ) -> crate::error::Result<()> {
        let vm = self.state.state_of(name);
        if !matches!(vm, handoff::VmState::Off | handoff::VmState::Failed) {
            return Err(crate::error::Error::Conflict(format!(
                "template {name}'s VM is {vm}; power it off first"
            )));
        }
        ledger.remove_template(name)?;
        self.templates.remove(name);
        self.dead_times.remove(name);
        self.state = self.state.without(name);
        self.refresh_limits();
        Ok(())
    }

    /// Per-template limits, from the templates' overrides.
    fn refresh_limits(&mut self) {
        let base = self.settings.limits;
        self.settings.per_template = self
            .templates
            .values()
            .filter(|d| {
                d.template.stop_timeout_seconds.is_some() || d.template.start_retries.is_some()
            })
            .map(|d| {
                let limits = handoff::Limits {
                    stop_timeout_ms: d
                        .template
                        .stop_timeout_seconds
                        .map_or(base.stop_timeout_ms, |s| s * 1000),
                    start_retries: d.template.start_retries.unwrap_or(base.start_retries),
                };
                (d.template.name.clone(), limits)
            })
            .collect();
    }

    /// The template whose VM this domain is.
    pub fn template_of(&self, domain: &str) -> Option<&str> {
        self.templates
            .values()
            .find(|d| d.domain == domain)
            .map(|d| d.template.name.as_str())
    }

    fn others(&self) -> Vec<&Defined> {
        self.templates.values().collect()
    }
}

/// Of the actions after a step the ledger refused, those that still run:
/// the interlock's destroys of VMs other than `on`, the one the state had
/// on before the event (None at a convergence: every destroy runs) — an
/// extra found at convergence, one started behind the daemon's back. One
/// VM fewer on is what any convergence would do, and none may stay on
/// beside another while the disk is full; a person's hard power-off (a
/// destroy of the one on) is not one of them, nor anything else (libvirt's
/// calls would leave the VMs where a restart, resuming from the last
/// recorded step, does not expect them).
pub fn interlock_after_refusal<'a>(
    rest: &'a [HandoffAction],
    on: Option<&str>,
) -> Vec<&'a HandoffAction> {
    rest.iter()
        .filter(
            |a| matches!(a, HandoffAction::Destroy { template } if Some(template.as_str()) != on),
        )
        .collect()
}

/// The earliest scheduled action after `cursor`: (when, [(template, action)]).
#[allow(clippy::type_complexity)]
pub fn next_due(
    cursor: jiff::Timestamp,
    rotation: &[(String, Vec<ScheduledAction>)],
    tz: &jiff::tz::TimeZone,
) -> Option<(jiff::Timestamp, Vec<(String, schedule::Action)>)> {
    let mut best: Option<(jiff::Timestamp, Vec<(String, schedule::Action)>)> = None;
    for (template, actions) in rotation {
        for a in actions {
            let Some(t) = a.next_after(cursor, tz) else {
                continue;
            };
            match &mut best {
                Some((bt, list)) if *bt == t => list.push((template.clone(), a.action)),
                Some((bt, _)) if *bt < t => {}
                _ => best = Some((t, vec![(template.clone(), a.action)])),
            }
        }
    }
    best
}
