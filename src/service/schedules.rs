//! Templates' schedules over the bus: SetSchedule, its conflicts checked
//! in the blocking pool one call at a time, and its dry run.

use super::Service;
use crate::access::{Act, Caller};
use crate::command::{Command, Reply};
use crate::error::{Error, Result};
use crate::failpoint;
use crate::node::{Rotation, ScheduleChange};

/// A SetSchedule as asked, waiting for its turn to be checked.
pub(super) struct AskedSchedule {
    pub template: String,
    pub actions: String,
    pub caller: Caller,
    pub reply: Reply<Result<()>>,
}

impl Service {
    /// SetSchedule: checked here but for the new rotation's conflicts,
    /// which walk the whole calendar cycle (a quarter second at the
    /// densest, and the loop's thread serves the bus): those are checked in
    /// the blocking pool, and the change comes back as
    /// [`Command::ScheduleChecked`] to be saved. One check at a time, in
    /// the order the calls came: two schedules for one template are saved
    /// in that order, and none is checked against a rotation about to
    /// change.
    pub(super) fn set_schedule(&mut self, asked: AskedSchedule) {
        if self.schedule_checking {
            return self.schedules_waiting.push_back(asked);
        }
        let AskedSchedule {
            template,
            actions,
            caller,
            reply,
        } = asked;
        let change = self.access.may(&caller, Act::SetSchedule).and_then(|()| {
            self.node
                .schedule_change(&template, &actions, self.rotation_rules())
        });
        let change = match change {
            Ok(change) => change,
            Err(e) => {
                self.reply_in_order(reply, Err(e));
                return self.next_schedule();
            }
        };
        self.schedule_checking = true;
        let tx = self.lp.tx.clone();
        tokio::spawn(async move {
            let checked = tokio::task::spawn_blocking(move || {
                // A test holds a check here (the densest schedules).
                failpoint::hit("schedule.check");
                let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    change.check_conflicts()
                }))
                .unwrap_or_else(|_| Err(Error::Backend("checking the schedule panicked".into())));
                (change, checked)
            })
            .await;
            // A JoinError: only when the runtime shuts down.
            if let Ok((change, checked)) = checked {
                let cmd = Command::ScheduleChecked {
                    change,
                    checked,
                    caller,
                    reply,
                };
                let _ = tx.send(cmd).await;
            }
        });
    }

    /// The next SetSchedule waiting for its check, if any.
    fn next_schedule(&mut self) {
        if let Some(asked) = self.schedules_waiting.pop_front() {
            self.set_schedule(asked);
        }
    }

    /// A schedule whose conflicts were checked: saved, unless the rotation
    /// changed meanwhile (then it is checked again).
    pub(super) fn schedule_checked(
        &mut self,
        change: ScheduleChange,
        checked: Result<()>,
        caller: Caller,
        reply: Reply<Result<()>>,
    ) {
        self.schedule_checking = false;
        let (template, actions) = (change.template.clone(), change.json.clone());
        if !self.node.schedule_is_current(&change) {
            // A template removed meanwhile: checked again, before the rest.
            return self.set_schedule(AskedSchedule {
                template,
                actions,
                caller,
                reply,
            });
        }
        match checked.and_then(|()| self.node.apply_schedule(change)) {
            Ok(()) => {
                tracing::info!(template = %template, "schedule of {template} set");
                self.publish_rotation();
                self.reply_in_order(reply, Ok(()));
            }
            Err(e) => self.reply_in_order(reply, Err(e)),
        }
        self.next_schedule();
    }

    /// The rules a schedule is checked against, as of now.
    fn rotation_rules(&self) -> Rotation {
        Rotation {
            now: jiff::Timestamp::now(),
            tz: self.slice_rules.tz.clone(),
            buffer: self.slice_rules.buffer,
            horizon: jiff::SignedDuration::from_hours(24 * crate::rotation::FULL_CYCLE_DAYS),
        }
    }

    /// SetSchedule's dry run: root only, like SetSchedule (it costs a
    /// validation); the next ten slices and the notes, nothing saved.
    pub(super) fn preview_schedule(
        &self,
        template: &str,
        actions: &str,
        caller: &Caller,
    ) -> Result<(Vec<crate::wire::SliceRow>, Vec<String>)> {
        self.access.may(caller, Act::SetSchedule)?;
        let rules = self.rotation_rules();
        let (slices, notes) = self.node.preview_schedule(template, actions, &rules, 10)?;
        let rows = slices.into_iter().map(super::queries::slice_row).collect();
        Ok((rows, notes))
    }
}
