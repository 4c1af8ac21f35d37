//! Time-slicing, the loop's side: templates and their VMs, the handoff
//! machine ([`crate::slicing::handoff`]) fed with lifecycle events, due
//! scheduled actions and its own timer, and what it asks for carried out:
//! steps into the ledger and onto the bus here, libvirt calls in tasks
//! ([`super::hypervisor`]). What is due is read from the node's schedules.

mod converge;
mod weights;

use super::hypervisor::Hypervisor;
use super::{Service, Settings};
use crate::access::{Act, Caller};
use crate::bus::manager::Manager;
use crate::bus::BASE_PATH;
use crate::error::{Error, Result};
use crate::failpoint;
use crate::journal;
use crate::node::time_slicing::{interlock_after_refusal, Rules, TimeSlicing};
use crate::schedule;
use crate::slicing::handoff::{Event, HandoffAction, Signal, Step};
use crate::slicing::meter::{GpuSample, Meter};
use crate::slicing::template::{self, Defined, Template};
use crate::time::EpochMs;
use crate::views::SlicingView;

/// The loop's time-slicing: the engine ([`TimeSlicing`]: templates, the
/// handoff's state, timer, cursor, convergence and pausing), and what the
/// loop does for it that is I/O: the hypervisor, the running slice's meter
/// and the task reading its guest.
pub(super) struct Slicing {
    pub engine: TimeSlicing,
    hv: Hypervisor,
    /// The running slice's measurements, and the task reading its guest.
    meter: Option<Meter>,
    guest_reader: Option<tokio::task::AbortHandle>,
    /// A CPU reading asked of libvirt and not answered yet (no pile-up
    /// of calls while libvirt is slow).
    cpu_asked: bool,
}

impl Slicing {
    /// With the templates the ledger holds (no libvirt call).
    pub fn new(hv: Hypervisor, settings: &Settings, stored: Vec<(String, String)>) -> Slicing {
        let rules = Rules {
            buffer_ms: settings.slice_rules.buffer.as_millis() as u64,
            stop_timeout_ms: settings.stop_timeout.as_millis() as u64,
            allow_networked_weights: settings.allow_networked_weights,
            allow_no_baseboard: settings.allow_no_baseboard,
        };
        let engine = TimeSlicing::new(rules, stored, jiff::Timestamp::now());
        let mut s = Slicing {
            engine,
            hv,
            meter: None,
            guest_reader: None,
            cpu_asked: false,
        };
        if !s.engine.templates().is_empty() {
            s.hv.watch_events();
        }
        s
    }

    /// What template objects and the page show of it.
    pub fn view(&self) -> SlicingView {
        let e = &self.engine;
        SlicingView {
            state: e.state().clone(),
            info: e
                .templates()
                .iter()
                .map(|(name, d)| (name.clone(), (d.user(), d.domain.clone())))
                .collect(),
            dead_times: e.dead_times().clone(),
        }
    }

    /// Carries out an action of the handoff machine that is not the loop's own.
    fn execute(&mut self, action: &HandoffAction) {
        match action {
            HandoffAction::SetTimer { at_ms } => self.engine.set_timer(*at_ms),
            other => self.hv.execute(other, self.engine.templates()),
        }
    }
}

const NO_LIBVIRT: &str = "time-slicing needs libvirt (set runtime.libvirt_uri)";

impl Service {
    pub(super) async fn handoff_timer(&mut self) {
        if let Some(s) = self.slicing.as_mut() {
            s.engine.timer_fired();
        }
        let at_ms = EpochMs::now();
        let _ = self.slice(Event::Timer { at_ms }).await;
    }

    pub(super) async fn fire_due(
        &mut self,
        at: jiff::Timestamp,
        list: Vec<(String, schedule::Action)>,
    ) {
        if let Some(s) = self.slicing.as_mut() {
            s.engine.fired_up_to(at);
        }
        // A sign of life at each fired action: after a crash, only actions
        // past it count as skipped.
        let _ = self.node.alive(EpochMs::now());
        for (template, action) in list {
            // Paused by the one before (its step refused): the rest is not
            // fired from a state the ledger does not hold.
            if !self
                .slicing
                .as_ref()
                .is_some_and(|s| s.engine.is_converged())
            {
                let what = format!(
                    "{} of {template} due at {at} skipped: time-slicing is paused",
                    action.as_str()
                );
                tracing::warn!(template = %template, "{what}");
                continue;
            }
            tracing::info!(template = %template, "scheduled {} of {template} is due", action.as_str());
            let at_ms = EpochMs::from_timestamp(at);
            let _ = self
                .slice(Event::Due {
                    action,
                    template,
                    at_ms,
                })
                .await;
        }
    }

    /// A libvirt event about a template VM, as a handoff event (a late
    /// STOPPED of an earlier run must not end the VM created after it).
    pub(super) async fn lifecycle(
        &mut self,
        domain: &str,
        event: crate::workload::VmEvent,
        on: bool,
        at_ms: EpochMs,
    ) {
        let Some(s) = self.slicing.as_mut() else {
            return;
        };
        let Some(template) = s.engine.template_of(domain).map(str::to_string) else {
            return;
        };
        // Not converged (starting, or paused): the state is a guess, so
        // the event waits for the convergence. Only whether the VM runs is
        // kept, the last word of each VM (a STOPPED then an UNDEFINED must
        // not leave it unsaid).
        if s.engine.keep_while_learning(&template, on) {
            return;
        }
        use crate::workload::VmEvent;
        let event = match event {
            VmEvent::Stopped if !on => Event::Stopped { template, at_ms },
            VmEvent::Started if on => Event::Started { template, at_ms },
            _ => return,
        };
        let _ = self.slice(event).await;
    }

    /// Asks libvirt for the running template VM's CPU time (in a task).
    pub(super) fn meter_slice(&mut self) {
        let Some(s) = self.slicing.as_mut() else {
            return;
        };
        let Some(template) = s.meter.as_ref().map(|m| m.template.clone()) else {
            return;
        };
        let Some(domain) = s.engine.template(&template).map(|d| d.domain.clone()) else {
            return;
        };
        if !s.cpu_asked {
            s.cpu_asked = true;
            s.hv.cpu_time(template, domain);
        }
    }

    pub(super) fn slice_cpu(&mut self, template: &str, at: EpochMs, cpu: Option<(u64, u32)>) {
        let Some(s) = self.slicing.as_mut() else {
            return;
        };
        s.cpu_asked = false;
        // A reading that arrives after its slice ended is dropped.
        if let (Some(m), Some((cpu_ns, vcpus))) = (s.meter.as_mut(), cpu) {
            if m.template == template {
                m.record(at, cpu_ns, vcpus);
            }
        }
    }

    pub(super) fn guest_gpu(&mut self, template: &str, sample: &GpuSample, at: EpochMs) {
        let meter = self.slicing.as_mut().and_then(|s| s.meter.as_mut());
        // A reading that arrives after its slice ended is dropped.
        if let Some(m) = meter.filter(|m| m.template == template) {
            m.record_gpu(at, sample);
        }
    }

    /// Root only, time-slicing configured, and the template defined.
    fn manual(&self, caller: &Caller, template: &str) -> Result<&Slicing> {
        self.access.may(caller, Act::DriveTemplate)?;
        match &self.slicing {
            None => Err(Error::Conflict(NO_LIBVIRT.into())),
            Some(s) if s.engine.template(template).is_none() => {
                // The caller's text, made printable before it is echoed.
                Err(Error::NotFound(format!(
                    "no template named {}",
                    crate::text::printable(template)
                )))
            }
            Some(s) if s.engine.is_paused() => Err(Error::Conflict(
                "time-slicing is paused: the ledger refused a handoff step or could not read \
                 the last one (the daemon's log says which); it starts again from the last step \
                 recorded, try again shortly"
                    .into(),
            )),
            Some(s) if !s.engine.is_converged() => Err(Error::Conflict(
                "time-slicing is still learning which VMs run (libvirt has not answered yet); \
                 try again shortly"
                    .into(),
            )),
            Some(s) => Ok(s),
        }
    }

    pub(super) async fn resume(
        &mut self,
        template: String,
        as_handoff: bool,
        caller: &Caller,
    ) -> Result<()> {
        if self.manual(caller, &template)?.engine.is_staging(&template) {
            return Err(Error::Conflict(format!(
                "the weights of {template} are being staged; it starts when they are done"
            )));
        }
        let at_ms = EpochMs::now();
        self.slice(Event::ManualResume {
            template,
            as_handoff,
            at_ms,
        })
        .await
    }

    pub(super) async fn power_off(
        &mut self,
        template: String,
        hard: bool,
        caller: &Caller,
    ) -> Result<()> {
        self.manual(caller, &template)?;
        let at_ms = EpochMs::now();
        self.slice(Event::ManualPowerOff {
            template,
            hard,
            at_ms,
        })
        .await
    }

    /// Checks a new template, then looks its VM up in libvirt in a task;
    /// [`Service::template_prepared`] finishes (and replies).
    pub(super) fn create_template(
        &mut self,
        spec: String,
        caller: &Caller,
        reply: crate::command::Reply<Result<String>>,
    ) {
        let checked = self.access.may(caller, Act::DefineTemplate).and_then(|()| {
            let s = self
                .slicing
                .as_ref()
                .ok_or_else(|| Error::Conflict(NO_LIBVIRT.into()))?;
            let t = Template::parse(&spec)?;
            let fs = (t.weights_disk.as_ref())
                .and_then(|w| crate::weights::fs_type_of(std::path::Path::new(w)))
                .unwrap_or_default();
            s.engine.check_new(&t, &fs)?;
            Ok(t)
        });
        match (checked, &self.slicing) {
            (Ok(t), Some(s)) => s.hv.prepare(t.stored_spec(&spec), t, reply),
            (Err(e), _) => {
                let _ = reply.send(Err(e));
            }
            (Ok(_), None) => unreachable!("checked above"),
        }
    }

    /// A new template's VM is known to libvirt: checked again against the
    /// templates defined meanwhile, then recorded.
    pub(super) async fn template_prepared(
        &mut self,
        spec: &str,
        prepared: Result<Box<Defined>>,
    ) -> Result<String> {
        let defined = *prepared?;
        let s = self
            .slicing
            .as_mut()
            .ok_or_else(|| Error::Conflict(NO_LIBVIRT.into()))?;
        let name = s
            .engine
            .add_template(&mut self.node, spec, defined, EpochMs::now())?;
        s.hv.watch_events();
        tracing::info!(template = %name, "template {name} defined");
        self.note_os_disk_storage(&name);
        self.publish_templates();
        Ok(name)
    }

    /// Where the template's OS disk lives, against seed 003's table (OS
    /// disks on networked storage, shared between hosts; weights local):
    /// one on local storage is said in the ledger's events and the journal
    /// (not refused: a single host works so, its VM starts here only).
    fn note_os_disk_storage(&mut self, name: &str) {
        let os_disk = self
            .slicing
            .as_ref()
            .and_then(|s| s.engine.template(name))
            .and_then(|d| d.template.os_disk.clone());
        let Some(os_disk) = os_disk else {
            return;
        };
        let fs = crate::weights::fs_type_of(std::path::Path::new(&os_disk)).unwrap_or_default();
        if template::is_networked_fs(&fs) {
            return;
        }
        let what = format!(
            "template {name}: its os_disk {} is on local storage ({fs}); seed 003 keeps OS disks on \
             networked storage, shared between hosts, so this VM starts on this host only",
            crate::text::printable(&os_disk)
        );
        tracing::info!(template = %name, "{what}");
        if let Err(e) = self
            .node
            .record_event("template-note", &what, EpochMs::now())
        {
            tracing::warn!("recording a template's note: {e}");
        }
    }

    pub(super) async fn remove_template(&mut self, name: &str, caller: &Caller) -> Result<()> {
        self.manual(caller, name)?;
        let s = self.slicing.as_mut().expect("manual() checked");
        s.engine.remove_template(&mut self.node, name)?;
        tracing::info!(template = %name, "template {name} removed (its libvirt domain is kept)");
        self.publish_rotation();
        Ok(())
    }

    /// Feeds one event to the handoff machine and carries out its actions:
    /// steps into the ledger and onto the bus, hypervisor calls in tasks.
    /// A refused manual request comes back as Conflict.
    pub(super) async fn slice(&mut self, event: Event) -> Result<()> {
        let Some(s) = self.slicing.as_mut() else {
            return Ok(());
        };
        // Not converged (starting, or paused): answers of tasks begun
        // before may be stale. What happened meanwhile is read from libvirt
        // at the convergence (lifecycle events are kept for it).
        let Some((before, actions)) = s.engine.step(&event) else {
            tracing::debug!("time-slicing not converged: {event:?} is left to the convergence");
            return Ok(());
        };
        let on_before = before.on().map(str::to_string);
        let carried = self.carry_out(&actions, true, on_before.as_deref());
        if let Err(e) = &carried {
            self.pause_slicing(e.message().to_string(), Some(before));
        }
        self.publish_templates();
        match carried? {
            Some(reason) => Err(Error::Conflict(reason)),
            None => Ok(()),
        }
    }

    /// Carries out a handoff's actions: steps recorded (and told), slices
    /// opened and closed, the hypervisor's calls; a refusal's reason.
    /// `crash_points`: the tests' kill points after each step (not at
    /// start-up, where the steps finish a handoff from before). `on`: the
    /// template the state before the event had on (None at convergence).
    fn carry_out(
        &mut self,
        actions: &[HandoffAction],
        crash_points: bool,
        on: Option<&str>,
    ) -> Result<Option<String>> {
        let mut refused = None;
        for (i, a) in actions.iter().enumerate() {
            match a {
                HandoffAction::Record(r) => {
                    // The engine records it through the node, in order; a
                    // refused step is not acted on (the caller pauses), and
                    // of what follows only the interlock's destroys run.
                    let s = self.slicing.as_mut().expect("actions come from the engine");
                    if let Err(e) = s.engine.record(&mut self.node, r) {
                        for destroy in interlock_after_refusal(&actions[i..], on) {
                            s.execute(destroy);
                        }
                        return Err(Error::Backend(format!(
                            "the ledger refused handoff step {} ({}); nothing after it was done \
                             but the interlock's destroys",
                            r.step.as_str(),
                            e.message()
                        )));
                    }
                    if r.step == Step::Stopped {
                        if let Some(s) = self.slicing.as_ref() {
                            s.hv.vm_stopped();
                        }
                    }
                    if crash_points {
                        // Crash tests kill the daemon right after a step is recorded.
                        failpoint::hit(&format!("slice.after-{}", r.step.as_str()));
                    }
                    let from = r.from.as_deref().unwrap_or("");
                    let to = r.to.as_deref().unwrap_or("");
                    let detail = r.detail.as_deref().unwrap_or("");
                    let who = |t: &str| {
                        if t.is_empty() {
                            "none".to_string()
                        } else {
                            t.to_string()
                        }
                    };
                    // The template the step is about: the one coming, or
                    // the one a forced step destroys.
                    let about = if to.is_empty() || matches!(r.step, Step::Forced | Step::Destroyed)
                    {
                        from
                    } else {
                        to
                    };
                    tracing::info!(
                        message_id = journal::HANDOFF_STEP,
                        template = %about,
                        "handoff: {} (from {} to {}) {detail}",
                        r.step.as_str(),
                        who(from),
                        who(to)
                    );
                    let (at, step) = (r.at_ms.as_i64(), r.step.as_str());
                    let (from, to, detail) = (from.to_string(), to.to_string(), detail.to_string());
                    self.signal("HandoffStep", BASE_PATH.into(), move |e| async move {
                        Manager::handoff_step(&e, step, &from, &to, at, &detail).await
                    });
                }
                HandoffAction::Signal(Signal::SliceStarted {
                    template,
                    at_ms,
                    dead_time_ms,
                }) => {
                    self.slice_began(template, *at_ms, *dead_time_ms);
                    let dead = dead_time_ms.map_or(-1, |d| d as i64);
                    let (template, at) = (template.clone(), at_ms.as_i64());
                    self.signal("SliceStarted", BASE_PATH.into(), move |e| async move {
                        Manager::slice_started(&e, &template, at, dead).await
                    });
                }
                HandoffAction::CloseSlice {
                    template,
                    at_ms,
                    error,
                } => self.slice_done(template, *at_ms, error.as_deref()),
                HandoffAction::Signal(Signal::SliceEnded { template, at_ms }) => {
                    self.slice_done(template, *at_ms, None);
                    let (template, at) = (template.clone(), at_ms.as_i64());
                    self.signal("SliceEnded", BASE_PATH.into(), move |e| async move {
                        Manager::slice_ended(&e, &template, at, "").await
                    });
                }
                HandoffAction::Signal(Signal::SliceFailed {
                    template,
                    at_ms,
                    error,
                }) => {
                    tracing::warn!(template = %template, "slice of {template} failed: {error}");
                    self.slice_done(template, *at_ms, Some(error));
                    let (template, at, error) = (template.clone(), at_ms.as_i64(), error.clone());
                    self.signal("SliceEnded", BASE_PATH.into(), move |e| async move {
                        Manager::slice_ended(&e, &template, at, &error).await
                    });
                }
                HandoffAction::Signal(Signal::SliceReady {
                    template,
                    start_to_ready_ms,
                    ..
                }) => {
                    tracing::info!(template = %template, "slice of {template} ready after {start_to_ready_ms} ms");
                    if let Err(e) = self
                        .node
                        .slice_ready_of(template, *start_to_ready_ms as i64)
                    {
                        tracing::error!("recording the slice of {template} ready: {e}");
                    }
                }
                HandoffAction::Refuse { reason } => refused = Some(reason.clone()),
                other => {
                    if let Some(s) = self.slicing.as_mut() {
                        s.execute(other);
                    }
                }
            }
        }
        Ok(refused)
    }

    /// A slice opens in the ledger and its meter starts.
    fn slice_began(&mut self, template: &str, at: EpochMs, dead_time_ms: Option<u64>) {
        let Some(s) = self.slicing.as_mut() else {
            return;
        };
        let Some(d) = s.engine.template(template) else {
            return;
        };
        let user = d.user();
        let board: Vec<String> = d
            .template
            .baseboard
            .iter()
            .map(template::pci_text)
            .collect();
        let reader = s.hv.read_guest_gpus(d.domain.clone(), template.to_string());
        if let Some(old) = s.guest_reader.replace(reader) {
            old.abort();
        }
        s.meter = Some(Meter::new(template));
        s.engine.slice_began(template, dead_time_ms);
        if let Err(e) = self.node.open_slice_once(
            template,
            &user,
            &board.join(" "),
            at,
            dead_time_ms.map(|d| d as i64),
        ) {
            tracing::error!("recording the slice of {template}: {e}");
        }
    }

    /// A slice closes with what was measured over it.
    fn slice_done(&mut self, template: &str, at: EpochMs, error: Option<&str>) {
        // The meter and the guest's reader are the running slice's: another
        // template's slice closing (a VM destroyed beside the one kept, at a
        // convergence) leaves them running.
        let measures = match self.slicing.as_mut() {
            Some(s) => match s.meter.take_if(|m| m.template == template) {
                Some(m) => {
                    if let Some(reader) = s.guest_reader.take() {
                        reader.abort();
                    }
                    m.measures()
                }
                None => Default::default(),
            },
            None => Default::default(),
        };
        if let Err(e) = self.node.close_slice_of(template, at, &measures, error) {
            tracing::error!("closing the slice of {template}: {e}");
        }
    }
}
