//! Time-slicing's convergence: from what libvirt says runs and the
//! ledger's last step to the state the schedule (or a person) wants, at a
//! start and at the end of a pause; and the pause itself, taken when the
//! ledger refuses a handoff step.

use super::super::Service;
use crate::error::Error;
use crate::journal;
use crate::schedule::ScheduledAction;
use crate::slicing::handoff::{Event, HandoffState, Step};
use crate::time::EpochMs;

impl Service {
    /// After a start: asks libvirt (in a task) which templates' VMs run;
    /// [`Service::converge_slices`] takes the answer.
    pub(in crate::service) fn learn_what_runs(&self) {
        if let Some(s) = &self.slicing {
            let domains = s
                .engine
                .templates()
                .iter()
                .map(|(t, d)| (t.clone(), d.domain.clone()))
                .collect();
            s.hv.running(domains);
        }
    }

    /// The state the schedule says now, from what runs and the last step
    /// the ledger recorded (no burst of missed actions).
    pub(in crate::service) async fn converge_slices(&mut self, on: Vec<String>) {
        let Some(slicer) = self.slicing.as_ref() else {
            return;
        };
        if slicer.engine.is_converged() {
            return;
        }
        let rotation = self.node.rotation();
        let tz = self.slice_rules.tz.clone();
        let now = jiff::Timestamp::now();
        // The handoff resumes from the ledger's last step: a ledger that
        // cannot say it must not be taken for one with no steps (that would
        // converge on what runs, mid-handoff). Paused; read again later.
        let last = match self.node.store().last_step() {
            Ok(last) => last,
            Err(e) => {
                return self.pause_slicing(format!("reading the last handoff step: {e}"), None)
            }
        };
        // Requests only say who is next, and a VM destroyed beside the
        // holder changes nothing: the handoff resumes from its last state step.
        let state_step = match &last {
            Some(r) if matches!(r.step, Step::Requested | Step::Destroyed) => {
                match self.node.store().last_state_step() {
                    Ok(last) => Some(last),
                    Err(e) => {
                        let why = format!("reading the last handoff step: {e}");
                        return self.pause_slicing(why, None);
                    }
                }
            }
            _ => None,
        };
        let (want, state, actions) = slicer.engine.plan_convergence(
            &rotation,
            (now, &tz),
            &on,
            last.as_ref(),
            state_step.as_ref().map(Option::as_ref),
            EpochMs::now(),
        );
        // Never a line ending "on: " with nothing after it (#54).
        let running = if on.is_empty() {
            "no template VM is on".to_string()
        } else {
            format!("on: {}", on.join(", "))
        };
        match &want {
            Some(t) => tracing::info!("time-slicing: {t} should be on now; {running}"),
            None => tracing::info!("time-slicing: none should be on now; {running}"),
        }
        let slicer = self.slicing.as_mut().expect("checked");
        // Missed while the daemon was down (at its start), or while paused.
        let (since, why) = if let Some(cursor) = slicer.engine.skipped_since() {
            (Some(cursor.as_millisecond()), "time-slicing was paused")
        } else {
            (
                self.node.previous_run_end().ok().flatten(),
                "the daemon was down",
            )
        };
        self.record_skipped(&rotation, since, now, why);
        let slicer = self.slicing.as_mut().expect("checked");
        let before = slicer.engine.converge_to(state, now);
        // Through the same path as events' actions: a slice whose end was
        // recorded before the restart is closed, one the handoff ends or
        // starts now is recorded, and every step is told. (Only the
        // hypervisor's calls went through: such slices stayed open.)
        match self.carry_out(&actions, false, None) {
            Err(e) => self.pause_slicing(e.message().to_string(), Some(before)),
            Ok(_) => {
                let slicer = self.slicing.as_mut().expect("checked");
                if slicer.engine.take_resumed() {
                    tracing::info!(
                        message_id = journal::SLICING_PAUSED,
                        "time-slicing resumes after its pause, from the ledger's last step"
                    );
                }
            }
        }
        self.publish_templates();
        self.replay_missed(&on).await;
    }

    /// Events that came while not converged (libvirt being asked what runs,
    /// or paused before): libvirt's answer for a VM may be older than the
    /// VM's last event (a VM that stopped just after its question would be
    /// taken for on). Where the last event's word on whether the VM runs
    /// differs from the answer, it is fed now as a start or a stop; were it
    /// the older of the two, the event that made the answer true follows.
    async fn replay_missed(&mut self, on: &[String]) {
        let Some(s) = self.slicing.as_mut().filter(|s| s.engine.is_converged()) else {
            return; // paused again: kept for the next convergence
        };
        for (template, runs) in s.engine.take_missed() {
            if runs != on.contains(&template) {
                let what = if runs { "started" } else { "stopped" };
                tracing::info!(
                    template = %template,
                    "time-slicing: {template}'s VM {what} while time-slicing was not converged"
                );
                let at_ms = EpochMs::now();
                let event = match runs {
                    true => Event::Started { template, at_ms },
                    false => Event::Stopped { template, at_ms },
                };
                let _ = self.slice(event).await;
            }
        }
    }

    /// Scheduled actions that fell while the daemon was down are not fired
    /// late (the state converges to now instead); each is recorded as skipped.
    fn record_skipped(
        &mut self,
        rotation: &[(String, Vec<ScheduledAction>)],
        since_ms: Option<i64>,
        now: jiff::Timestamp,
        why: &str,
    ) {
        let Some(Ok(since)) = since_ms.map(jiff::Timestamp::from_millisecond) else {
            return;
        };
        for (template, actions) in rotation {
            for a in actions {
                for at in a.occurrences_after(since, &self.slice_rules.tz, 1000) {
                    if at > now {
                        break;
                    }
                    let what = format!(
                        "{} of {template} due at {at} skipped: {why}",
                        a.action.as_str()
                    );
                    tracing::warn!(template = %template, "{what}");
                    if let Err(e) = self.node.record_event("skipped", &what, EpochMs::now()) {
                        tracing::error!("recording a skipped action: {e}");
                    }
                }
            }
        }
    }

    /// Time-slicing stops where the ledger stopped recording (a full disk,
    /// a failed read): no scheduled action fires, no person's request is
    /// taken, no timer runs and libvirt's events are kept for the next
    /// convergence. After a while (5 s, doubled while the ledger keeps
    /// refusing, up to a minute) it learns what runs and converges from
    /// the ledger's last step, as a start does (the path the crash tests
    /// kill after every step); the rest of the daemon goes on. A ledger
    /// that refuses every commit until a restart (a write of unknown fate)
    /// ends the loop instead: only a restart reads it again. `back_to`:
    /// the state before the refused change, where the ledger stands (the
    /// views show it until the state is learned afresh).
    pub(super) fn pause_slicing(&mut self, why: String, back_to: Option<HandoffState>) {
        let Some(s) = self.slicing.as_mut() else {
            return;
        };
        s.engine.pause(back_to);
        if self.node.store().refuses_until_restart() {
            let e = Error::Backend(format!(
                "time-slicing: {why}; the ledger refuses every write until a restart: stopping, \
                 for the service manager to start the daemon afresh"
            ));
            tracing::error!("{e}");
            self.fatal.get_or_insert(e);
            return;
        }
        let Some(s) = self.slicing.as_mut() else {
            return;
        };
        let wait = s.engine.relearn_later(std::time::Instant::now());
        tracing::error!(
            message_id = journal::SLICING_PAUSED,
            "time-slicing: {why}; paused: it starts again from the ledger's last step and \
             what libvirt says runs, at the first refresh after {} s",
            wait.as_secs()
        );
    }

    /// Each refresh: a pause whose time is up learns what runs again
    /// ([`Service::converge_slices`] takes the answer).
    pub(in crate::service) fn relearn_if_due(&mut self) {
        let now = std::time::Instant::now();
        if self
            .slicing
            .as_mut()
            .is_some_and(|s| s.engine.relearn_due(now))
        {
            self.learn_what_runs();
        }
    }
}
