//! Templates' schedules: set (checked, then saved), previewed. The check
//! of a new rotation's conflicts walks the whole calendar cycle (up to a
//! quarter second for the densest schedules): [`ScheduleChange`] carries
//! what it needs, so that the service runs it off the loop's thread and
//! saves the change after ([`Node::apply_schedule`]).

use super::{Node, Rotation, PREVIEW_DAYS};
use crate::error::{Error, Result};
use crate::rotation;
use crate::schedule::{self, ScheduledAction};
use crate::time::EpochMs;

/// A template's new schedule, checked but for the rotation's conflicts.
pub struct ScheduleChange {
    pub template: String,
    /// The actions as asked for (to check again if another schedule
    /// changes first).
    pub json: String,
    actions: Vec<ScheduledAction>,
    /// Every template's actions with this change.
    all: Vec<(String, Vec<ScheduledAction>)>,
    rules: Rotation,
    /// [`Node::schedules_changed`](super::Node) when it was checked.
    seen: u64,
}

impl ScheduleChange {
    /// The new rotation's conflicts, over the whole horizon: pure, runs
    /// anywhere.
    pub fn check_conflicts(&self) -> Result<()> {
        let r = &self.rules;
        rotation::validate(&self.all, r.now, r.horizon, &r.tz, r.buffer)
    }
}

impl Node {
    /// Replaces a template's schedule, atomically: the new rotation (this
    /// template's actions with every other template's) is validated first, and a
    /// refused schedule leaves the old one in place. An empty list removes it.
    pub fn set_schedule(&mut self, template: &str, json: &str, rules: &Rotation) -> Result<()> {
        let change = self.schedule_change(template, json, rules.clone())?;
        change.check_conflicts()?;
        self.apply_schedule(change)
    }

    /// A schedule for `template`, checked (template defined, actions,
    /// offsets) but for its conflicts ([`ScheduleChange::check_conflicts`]).
    pub fn schedule_change(
        &self,
        template: &str,
        json: &str,
        rules: Rotation,
    ) -> Result<ScheduleChange> {
        let (actions, all) = self.rotation_with(template, json, &rules)?;
        Ok(ScheduleChange {
            template: template.to_string(),
            json: json.to_string(),
            actions,
            all,
            rules,
            seen: self.schedules_changed,
        })
    }

    /// Whether the rotation is still the one `change` was checked against
    /// (else its check, passed or failed, is to be done again).
    pub fn schedule_is_current(&self, change: &ScheduleChange) -> bool {
        change.seen == self.schedules_changed
    }

    /// Saves a change whose conflicts were checked against the rotation as
    /// it is ([`Node::schedule_is_current`]).
    pub fn apply_schedule(&mut self, change: ScheduleChange) -> Result<()> {
        if !self.schedule_is_current(&change) {
            return Err(Error::Conflict(
                "the schedules changed while this one was checked; try again".into(),
            ));
        }
        let ScheduleChange {
            template,
            actions,
            rules,
            ..
        } = change;
        let normalized = (!actions.is_empty())
            .then(|| serde_json::to_string(&actions).expect("actions serialize"));
        self.store.set_schedule(
            &template,
            normalized.as_deref(),
            EpochMs::from_timestamp(rules.now),
        )?;
        if actions.is_empty() {
            self.schedules.remove(&template);
        } else {
            self.schedules.insert(template, actions);
        }
        self.schedules_changed += 1;
        Ok(())
    }

    /// The rotation as it would be with `template`'s actions replaced by
    /// `json`: checked (template defined, actions, offsets) but for its
    /// conflicts, not saved. The template's new actions and every template's.
    #[allow(clippy::type_complexity)]
    fn rotation_with(
        &self,
        template: &str,
        json: &str,
        rules: &Rotation,
    ) -> Result<(Vec<ScheduledAction>, Vec<(String, Vec<ScheduledAction>)>)> {
        crate::request::validate_name("template", template)?;
        if !self.store.has_template(template)? {
            return Err(Error::NotFound(format!(
                "no template named {template}: define it first (CreateTemplate), then schedule it"
            )));
        }
        // Ours, or OpenNebula's own text or JSON, pasted as `onevm show` prints it.
        let read = crate::schedule_one::read(json)?;
        let actions = read.explain(schedule::parse_actions(&read.json, rules.now))?;
        read.explain(schedule::check_offsets(&read.json, &rules.tz))?;
        // A stale paste (every time passed, every repeat ended) would do
        // nothing but switch the VM now, by the convergence rule.
        if !actions.is_empty()
            && actions
                .iter()
                .all(|a| a.next_after(rules.now, &rules.tz).is_none())
        {
            return Err(Error::field(
                "actions",
                "every action's times have passed (repeats ended too): nothing is left to do, \
                 and the VM would only be switched on or off now for it; give a TIME to come, \
                 or [] to remove the schedule",
            ));
        }
        let mut all: Vec<(String, Vec<ScheduledAction>)> = self
            .schedules
            .iter()
            .filter(|(t, _)| t.as_str() != template)
            .map(|(t, a)| (t.clone(), a.clone()))
            .collect();
        if !actions.is_empty() {
            all.push((template.to_string(), actions.clone()));
            all.sort_by(|a, b| a.0.cmp(&b.0));
        }
        Ok((actions, all))
    }

    /// A dry run of [`Node::set_schedule`]: the first `count` slices from
    /// now (within the horizon) with `template`'s actions replaced, and the
    /// notes on its listed days that do not occur; nothing is saved.
    /// The next `count` slices from `now` on, however far away.
    pub fn next_slices(
        &self,
        now: jiff::Timestamp,
        count: usize,
        tz: &jiff::tz::TimeZone,
    ) -> Vec<rotation::Slice> {
        rotation::next_slices(&self.rotation(), now, count, tz)
    }

    pub fn preview_schedule(
        &self,
        template: &str,
        json: &str,
        rules: &Rotation,
        count: usize,
    ) -> Result<(Vec<rotation::Slice>, Vec<String>)> {
        let change = self.schedule_change(template, json, rules.clone())?;
        change.check_conflicts()?;
        let ScheduleChange { actions, all, .. } = change;
        let window = jiff::SignedDuration::from_hours(24 * PREVIEW_DAYS);
        let until = rules
            .now
            .checked_add(window)
            .unwrap_or(jiff::Timestamp::MAX);
        let slices = rotation::next_slices(&all, rules.now, count, &rules.tz);
        let mut notes = Vec::new();
        for (i, a) in actions.iter().enumerate() {
            for line in a.missing_days(rules.now, until, &rules.tz, 10) {
                notes.push(format!("actions[{i}] ({}): {line}", a.action.as_str()));
            }
            // A pasted yearly DAYS, in dates (OpenNebula's reference and
            // its code count them differently).
            if a.repeat == crate::schedule::Repeat::Yearly {
                let year = rules.now.to_zoned(rules.tz.clone()).year();
                let dates = crate::schedule_form::yearly_days_in(&a.days, year);
                notes.push(format!("actions[{i}] ({}): {dates}", a.action.as_str()));
            }
        }
        Ok((slices, notes))
    }
}
