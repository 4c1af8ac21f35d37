//! Who owns the GPU baseboard when: several templates share one baseboard and
//! take turns by their scheduled actions. A template's `resume` starts its
//! slice; the slice ends at its own `poweroff`/`poweroff-hard`, or when
//! another template resumes (a handoff).
//!
//! The module is pure, like [`crate::schedule`]: "now", the window and the
//! time zone are always arguments.
//!
//! # The owner model
//!
//! All occurrences of all actions of all templates are merged into one
//! stream of events, ordered by instant; at the same instant power-offs come
//! before resumes, then templates in the order given, then actions by index.
//! One template at most holds the baseboard; each event changes that:
//!
//! - a power-off of the holder ends its slice; a power-off of any other
//!   template has no slice to end and changes nothing (`validate` refuses it);
//! - a resume while nobody holds starts a slice; a resume by the holder
//!   itself changes nothing (the slice goes on);
//! - a resume while another template holds is a handoff: the holder's slice
//!   ends there and the resuming template's starts;
//! - when several templates resume at the same instant (`validate` refuses
//!   that), the first one in `templates` order wins and the others' resumes
//!   at that instant are ignored.
//!
//! # Handoff or overlap
//!
//! A resume while another template holds the baseboard is a *handoff meant*
//! only when the holder's own next scheduled event after that instant
//! (however far ahead, not only within a validation horizon) is a resume, or
//! when it has none at all: the holder was meant to run until someone takes
//! over. When the holder's own next event is a power-off, it meant to keep
//! running until then and end its slice by itself; the resume comes too
//! early and the two slices overlap: `validate` refuses it.
//!
//! A holder that powers off shortly *before* the resume (within the buffer)
//! did end its slice by itself, just too late for the next one: that is the
//! gap rule, not an overlap. A power-off at the very instant of the resume is
//! ordered before it, so it is a gap of zero, allowed only with a zero
//! buffer.
//!
//! The daemon performs a handoff as power-off → release → buffer → resume,
//! so the incoming template's machine really starts the buffer (plus the
//! outgoing machine's shutdown time) after its scheduled resume. `timeline`
//! reports the scheduled resume as the slice's `start` all the same.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use jiff::tz::TimeZone;
use jiff::{SignedDuration, Timestamp};

use crate::error::{Error, Result};
use crate::schedule::{Action, ScheduledAction};

/// Most events `timeline` and `validate` examine (from the start of their
/// window), so that both always finish quickly.
pub const MAX_EVENTS: usize = 100_000;

/// Occurrences fetched per action per call to `occurrences_after`.
const BATCH: usize = 32;

/// How a slice ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SliceEnd {
    /// The template's own `poweroff`.
    Poweroff,
    /// The template's own `poweroff-hard`.
    PoweroffHard,
    /// Another template resumed and took the baseboard over.
    Handoff { to: String },
    /// Still running at the end of the window: at `to`, or where the
    /// timeline stopped after `MAX_EVENTS` events.
    Open,
    /// Never started: another template resumed at the same instant and the
    /// timeline gave it the baseboard (schedules that conflict, accepted
    /// under older rules; [`dropped_slices`] lists these).
    Dropped { by: String },
}

impl SliceEnd {
    /// `poweroff`, `poweroff-hard`, `handoff:<template>` or `open`, as D-Bus shows it.
    pub fn describe(&self) -> String {
        match self {
            SliceEnd::Poweroff => "poweroff".to_string(),
            SliceEnd::PoweroffHard => "poweroff-hard".to_string(),
            SliceEnd::Handoff { to } => format!("handoff:{to}"),
            SliceEnd::Open => "open".to_string(),
            SliceEnd::Dropped { by } => format!("dropped:{by}"),
        }
    }
}

/// One template's uninterrupted hold of the baseboard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slice {
    pub template: String,
    /// The scheduled resume (for a handoff, the machine really starts later:
    /// see the module documentation), or the window's `from` for a slice
    /// that had started before it.
    pub start: Timestamp,
    pub end: Timestamp,
    pub ends_by: SliceEnd,
}

/// A template's slice running at `now` and its next one, looking 400 days
/// ahead: what its Template object and the page show, and who the schedule
/// says should hold the baseboard after a restart.
pub fn slices_now(
    templates: &[(String, Vec<ScheduledAction>)],
    template: &str,
    now: Timestamp,
    tz: &TimeZone,
) -> (Option<Slice>, Option<Slice>) {
    let until = now
        .checked_add(SignedDuration::from_hours(24 * 400))
        .unwrap_or(Timestamp::MAX);
    let mut active = None;
    for s in timeline(templates, now, until, tz) {
        if s.template != template {
            continue;
        }
        if s.start <= now && active.is_none() {
            active = Some(s);
        } else if s.start > now {
            return (active, Some(s));
        }
    }
    (active, None)
}

/// The template the schedule gives the baseboard to at `now`, if any.
pub fn owner_now(
    templates: &[(String, Vec<ScheduledAction>)],
    now: Timestamp,
    tz: &TimeZone,
) -> Option<String> {
    let until = now
        .checked_add(SignedDuration::from_hours(24))
        .unwrap_or(Timestamp::MAX);
    timeline(templates, now, until, tz)
        .into_iter()
        .find(|s| s.start <= now && now < s.end)
        .map(|s| s.template)
}

/// The timeline of who owns the GPU baseboard in [from, to): each
/// template's slice runs from one of its `resume` occurrences to its next
/// `poweroff`/`poweroff-hard` occurrence, or to another template's resume (a
/// handoff), whichever comes first. Exactly one owner at a time by
/// construction: slices are ascending and never overlap.
///
/// Events before `from` decide who holds the baseboard at `from`; such a
/// slice is reported from `from` on. A slice still running at `to` ends there
/// as [`SliceEnd::Open`]. `start` is always the scheduled resume, although a
/// handoff delays the real start (see the module documentation). The
/// timeline applies the owner model mechanically and does not judge the
/// rotation: a power-off with no slice to end is skipped, and a resume during
/// another template's slice is always a handoff; [`validate`] refuses both.
/// At most [`MAX_EVENTS`] events in the window are examined; past them the
/// last slice ends as `Open` at the first event left unexamined.
pub fn timeline(
    templates: &[(String, Vec<ScheduledAction>)],
    from: Timestamp,
    to: Timestamp,
    tz: &TimeZone,
) -> Vec<Slice> {
    let mut slices = Vec::new();
    if from >= to {
        return slices;
    }
    // Events strictly before `from` make the starting state.
    let cut = from.checked_sub(SignedDuration::from_nanos(1)).ok();
    let mut machine = match cut {
        Some(cut) => Machine::at(templates, cut, tz),
        None => Machine::default(),
    };
    if let Some(holding) = &mut machine.holder {
        holding.since = from;
    }
    let mut streams = Streams::new(templates, cut.unwrap_or(from), tz);
    let name = |template: usize| templates[template].0.clone();
    let mut push = |holding: Holding, end: Timestamp, ends_by: SliceEnd| {
        if holding.since < end {
            slices.push(Slice {
                template: name(holding.template),
                start: holding.since,
                end,
                ends_by,
            });
        }
    };

    let mut end = to;
    let mut examined = 0;
    while let Some(event) = streams.peek() {
        if event.at >= to {
            break;
        }
        if examined == MAX_EVENTS {
            end = event.at;
            break;
        }
        examined += 1;
        streams.pop();
        match machine.apply(event, streams.kind(event)) {
            Step::HandedOff(holding) => push(
                holding,
                event.at,
                SliceEnd::Handoff {
                    to: name(event.template),
                },
            ),
            Step::Ended(holding) => {
                let ends_by = match streams.kind(event) {
                    Action::PoweroffHard => SliceEnd::PoweroffHard,
                    _ => SliceEnd::Poweroff,
                };
                push(holding, event.at, ends_by);
            }
            Step::Started | Step::Continued | Step::Ignored | Step::NoSlice => {}
        }
    }
    if let Some(holding) = machine.holder {
        push(holding, end, SliceEnd::Open);
    }
    slices
}

/// The Gregorian calendar repeats every 400 years (146,097 days, a whole
/// number of weeks): weekly, monthly and yearly repeats, and the zone's
/// rules for the future, all come round again. Validation looks this far
/// ahead when any schedule is open-ended.
pub const FULL_CYCLE_DAYS: i64 = 146_097;

/// The next `count` slices from `from` on, however far away: the timeline
/// a 400-day window at a time (as ListSlices would give them), up to the
/// calendar's whole cycle, each slice a window's edge cut joined again.
/// The walk stops once `count` are found, or once no action of any
/// template occurs after the window walked (every schedule has ended).
/// Fewer than `count` when the cycle holds fewer.
pub fn next_slices(
    templates: &[(String, Vec<ScheduledAction>)],
    from: Timestamp,
    count: usize,
    tz: &TimeZone,
) -> Vec<Slice> {
    let step = SignedDuration::from_hours(24 * 400);
    let end = from
        .checked_add(SignedDuration::from_hours(24 * FULL_CYCLE_DAYS))
        .unwrap_or(Timestamp::MAX);
    let mut out: Vec<Slice> = Vec::new();
    let mut at = from;
    while at < end {
        let until = at.checked_add(step).unwrap_or(Timestamp::MAX).min(end);
        for s in timeline(templates, at, until, tz) {
            match out.last_mut() {
                // Cut at the edge: the same slice, reported from `at` on.
                Some(last)
                    if last.ends_by == SliceEnd::Open
                        && last.end == at
                        && s.start == at
                        && s.template == last.template =>
                {
                    last.end = s.end;
                    last.ends_by = s.ends_by;
                }
                _ => out.push(s),
            }
        }
        at = until;
        let open_at_edge = out
            .last()
            .is_some_and(|s| s.ends_by == SliceEnd::Open && s.end == at);
        if out.len() >= count && !open_at_edge {
            break;
        }
        let more = templates
            .iter()
            .flat_map(|(_, actions)| actions)
            .any(|a| a.next_after(at, tz).is_some());
        if !more {
            break;
        }
    }
    out.truncate(count);
    out
}

mod stream;
mod validate;

use stream::*;
pub use validate::{conflicts, dropped_slices, validate, Problem, MAX_VALIDATED_EVENTS};

#[cfg(test)]
mod tests;
