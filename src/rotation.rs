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

/// Most events [`validate`] examines: the full cycle of two templates'
/// hourly repeats (about 7 million) fits; more is refused rather than
/// checked in part.
pub const MAX_VALIDATED_EVENTS: usize = 12_000_000;

/// One problem of a rotation: the action (`template b, actions[1]
/// (resume)`) and what is wrong with it, when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub at: Timestamp,
    pub action: String,
    pub message: String,
    /// For simultaneous resumes: (the template whose slice is left out, the
    /// one that takes the baseboard), by index.
    pub dropped: Option<(usize, usize)>,
}

/// Validation of a rotation, looking ahead `horizon` from `now` (the
/// daemon passes [`FULL_CYCLE_DAYS`]; the walk ends sooner when every
/// schedule has ended): the events in (now, now + horizon]. More than
/// [`MAX_VALIDATED_EVENTS`] of them are refused, never checked in part.
/// Events at or before `now` only make the starting state (who holds the
/// baseboard, which power-off ended the last slice).
///
/// Refuses with `Error::InvalidRequest`, the first problem in time order,
/// naming the template and the action (e.g. `template b, actions[1]
/// (resume)`), the local date-time in `tz` with the zone's name, and the rule:
///
/// - *simultaneous resumes*: two templates resume at the same instant;
/// - *overlap*: a template resumes while another holds the baseboard and the
///   holder's own next event is a power-off (see "Handoff or overlap" in the
///   module documentation; a handoff is accepted, whatever the buffer);
/// - *too soon after a power-off*: a resume while nobody holds the baseboard
///   comes less than `buffer` after the power-off that ended the last slice
///   (of any template, itself included; a `buffer` of zero allows
///   back-to-back slices);
/// - *nothing to power off*: a power-off of a template that does not hold
///   the baseboard then (already off, never resumed, or another template
///   holds it).
///
/// Per-action rules (days, hourly interval, end) are `parse_actions`' job.
pub fn validate(
    templates: &[(String, Vec<ScheduledAction>)],
    now: Timestamp,
    horizon: SignedDuration,
    tz: &TimeZone,
    buffer: std::time::Duration,
) -> Result<()> {
    let until = now
        .checked_add(horizon)
        .unwrap_or(if horizon.is_negative() {
            Timestamp::MIN
        } else {
            Timestamp::MAX
        });
    let mut first = None;
    let complete = walk(
        templates,
        now,
        until,
        tz,
        buffer,
        MAX_VALIDATED_EVENTS,
        &mut |p| {
            first = Some(p);
            false
        },
    );
    if let Some(p) = first {
        return Err(Error::field(&p.action, p.message));
    }
    if !complete {
        return Err(Error::field(
            "actions",
            format!(
                "the schedules together fire more than {MAX_VALIDATED_EVENTS} times before they \
                 end or within the {FULL_CYCLE_DAYS}-day calendar cycle, too many to check for \
                 conflicts; use fewer or less frequent hourly actions"
            ),
        ));
    }
    Ok(())
}

/// Every problem [`validate`] would name, for a window already in the
/// rotation (schedules accepted under older rules, or before a change of
/// zone): at most `limit` lines, each with its local date-time. A
/// simultaneous resume says which slice the timeline drops.
pub fn conflicts(
    templates: &[(String, Vec<ScheduledAction>)],
    from: Timestamp,
    to: Timestamp,
    tz: &TimeZone,
    limit: usize,
) -> Vec<String> {
    problems(templates, from, to, tz, limit)
        .into_iter()
        .map(|p| format!("{}: {}", p.action, p.message))
        .collect()
}

/// The slices [`timeline`] leaves out in [from, to): a template resuming at
/// the same instant as another that takes the baseboard. Each runs, as
/// scheduled, until the template's own next power-off (or `to`), and ends
/// as [`SliceEnd::Dropped`]; ListSlices shows them with the others, so
/// nothing is dropped silently.
pub fn dropped_slices(
    templates: &[(String, Vec<ScheduledAction>)],
    from: Timestamp,
    to: Timestamp,
    tz: &TimeZone,
) -> Vec<Slice> {
    problems(templates, from, to, tz, 100)
        .into_iter()
        .filter_map(|p| {
            let (left_out, taker) = p.dropped?;
            let (name, actions) = &templates[left_out];
            let end = actions
                .iter()
                .filter(|a| rank(a.action) == 0)
                .filter_map(|a| a.next_after(p.at, tz))
                .min()
                .map_or(to, |e| e.min(to));
            Some(Slice {
                template: name.clone(),
                start: p.at,
                end,
                ends_by: SliceEnd::Dropped {
                    by: templates[taker].0.clone(),
                },
            })
        })
        .collect()
}

/// The problems in [from, to), at most `limit`.
fn problems(
    templates: &[(String, Vec<ScheduledAction>)],
    from: Timestamp,
    to: Timestamp,
    tz: &TimeZone,
    limit: usize,
) -> Vec<Problem> {
    let mut found = Vec::new();
    let start = from
        .checked_sub(SignedDuration::from_nanos(1))
        .unwrap_or(from);
    let end = to.checked_sub(SignedDuration::from_nanos(1)).unwrap_or(to);
    walk(
        templates,
        start,
        end,
        tz,
        std::time::Duration::ZERO,
        MAX_EVENTS,
        &mut |p| {
            found.push(p);
            found.len() < limit
        },
    );
    found
}

/// Walks the events in (now, until] through the owner model, telling
/// `problem` each rule broken (it returns whether to go on). Returns
/// whether the walk was complete (not cut at `max_events`).
fn walk(
    templates: &[(String, Vec<ScheduledAction>)],
    now: Timestamp,
    until: Timestamp,
    tz: &TimeZone,
    buffer: std::time::Duration,
    max_events: usize,
    problem: &mut dyn FnMut(Problem) -> bool,
) -> bool {
    let buffer = SignedDuration::try_from(buffer).unwrap_or(SignedDuration::MAX);
    let mut machine = Machine::at(templates, now, tz);
    let mut streams = Streams::new(templates, now, tz);
    let who = |event: Event, kind: Action| {
        format!(
            "template {}, actions[{}] ({})",
            templates[event.template].0,
            event.action,
            kind.as_str()
        )
    };
    let at = |event: Event, kind: Action, rule: String| Problem {
        at: event.at,
        action: who(event, kind),
        message: format!("at {}, {rule}", local(event.at, tz)),
        dropped: None,
    };

    for _ in 0..max_events {
        let Some(event) = streams.peek().filter(|e| e.at <= until) else {
            return true;
        };
        streams.pop();
        let kind = streams.kind(event);
        if kind == Action::Resume {
            if let Some(first) = machine.last_resume {
                if first.at == event.at && first.template != event.template {
                    let mut p = at(
                        event,
                        kind,
                        format!(
                            "simultaneous resumes: {} resumes at the same instant; \
                             only one template can take the GPU baseboard at a time \
                             (the slice of template {} is not started)",
                            who(first, streams.kind(first)),
                            templates[event.template].0
                        ),
                    );
                    p.dropped = Some((event.template, first.template));
                    if !problem(p) {
                        return true;
                    }
                }
            }
            match (machine.holder, machine.last_off) {
                (Some(holding), _) if holding.template != event.template => {
                    if let Some(next) = streams.next_of(holding.template) {
                        let next_kind = streams.kind(next);
                        if next_kind != Action::Resume {
                            let p = at(
                                event,
                                kind,
                                format!(
                                    "overlap: template {} holds the GPU baseboard then and \
                                     powers off by itself only at {} ({}); a resume may take \
                                     the baseboard from another template only as a handoff, \
                                     when that template's next action is a resume or there \
                                     is none",
                                    templates[holding.template].0,
                                    local(next.at, tz),
                                    who(next, next_kind)
                                ),
                            );
                            if !problem(p) {
                                return true;
                            }
                        }
                    }
                }
                (None, Some(off)) => {
                    let gap = event.at.duration_since(off.at);
                    if gap < buffer {
                        let p = at(
                            event,
                            kind,
                            format!(
                                "too soon after a power-off: {} ends the previous slice at {}, \
                                 only {gap:#} earlier; a resume needs at least {buffer:#} \
                                 (the buffer) after the previous power-off",
                                who(off, streams.kind(off)),
                                local(off.at, tz)
                            ),
                        );
                        if !problem(p) {
                            return true;
                        }
                    }
                }
                _ => {}
            }
        }
        let holder = machine.holder;
        if let Step::NoSlice = machine.apply(event, kind) {
            let name = &templates[event.template].0;
            let state = match holder {
                Some(holding) => format!("template {} holds it", templates[holding.template].0),
                None => "no template holds it".to_string(),
            };
            let p = at(
                event,
                kind,
                format!(
                    "nothing to power off: template {name} does not hold the GPU baseboard \
                     then ({state}); a power-off must end a slice that a resume of template \
                     {name} started"
                ),
            );
            if !problem(p) {
                return true;
            }
        }
    }
    streams.peek().is_none_or(|e| e.at > until)
}

/// An instant as local date-time with the zone's name and offset, e.g.
/// `Mon 2026-03-02 09:00 Europe/Berlin (UTC+01:00)`; seconds only when not
/// zero.
fn local(at: Timestamp, tz: &TimeZone) -> String {
    let zoned = at.to_zoned(tz.clone());
    let pattern = if zoned.second() == 0 && zoned.subsec_nanosecond() == 0 {
        "%a %Y-%m-%d %H:%M"
    } else {
        "%a %Y-%m-%d %H:%M:%S"
    };
    let offset = zoned.strftime("%:z");
    match tz.iana_name() {
        Some(name) => format!("{} {name} (UTC{offset})", zoned.strftime(pattern)),
        None => format!("{} UTC{offset}", zoned.strftime(pattern)),
    }
}

/// One occurrence of one action, ordered as the owner model processes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Event {
    at: Timestamp,
    /// 0 for power-offs, 1 for resumes: power-offs first at one instant.
    rank: u8,
    template: usize,
    action: usize,
}

fn rank(kind: Action) -> u8 {
    match kind {
        Action::Resume => 1,
        Action::Poweroff | Action::PoweroffHard => 0,
    }
}

/// One action's occurrences, fetched in batches.
struct Cursor<'a> {
    action: &'a ScheduledAction,
    after: Timestamp,
    pending: VecDeque<Timestamp>,
    done: bool,
}

impl Cursor<'_> {
    fn head(&mut self, tz: &TimeZone) -> Option<Timestamp> {
        if self.pending.is_empty() && !self.done {
            let batch = self.action.occurrences_after(self.after, tz, BATCH);
            match batch.last() {
                Some(&last) => self.after = last,
                None => self.done = true,
            }
            self.pending.extend(batch);
        }
        self.pending.front().copied()
    }
}

/// All actions' occurrences after an instant, merged in event order.
struct Streams<'a> {
    templates: &'a [(String, Vec<ScheduledAction>)],
    tz: &'a TimeZone,
    cursors: Vec<Vec<Cursor<'a>>>,
    /// Exactly each cursor's head, as an event.
    heap: BinaryHeap<Reverse<Event>>,
}

impl<'a> Streams<'a> {
    fn new(
        templates: &'a [(String, Vec<ScheduledAction>)],
        after: Timestamp,
        tz: &'a TimeZone,
    ) -> Streams<'a> {
        let mut heap = BinaryHeap::new();
        let cursors = templates
            .iter()
            .enumerate()
            .map(|(template, (_, actions))| {
                actions
                    .iter()
                    .enumerate()
                    .map(|(index, action)| {
                        let mut cursor = Cursor {
                            action,
                            after,
                            pending: VecDeque::new(),
                            done: false,
                        };
                        if let Some(at) = cursor.head(tz) {
                            heap.push(Reverse(Event {
                                at,
                                rank: rank(action.action),
                                template,
                                action: index,
                            }));
                        }
                        cursor
                    })
                    .collect()
            })
            .collect();
        Streams {
            templates,
            tz,
            cursors,
            heap,
        }
    }

    fn kind(&self, event: Event) -> Action {
        self.templates[event.template].1[event.action].action
    }

    fn peek(&self) -> Option<Event> {
        self.heap.peek().map(|Reverse(event)| *event)
    }

    fn pop(&mut self) -> Option<Event> {
        let Reverse(event) = self.heap.pop()?;
        let cursor = &mut self.cursors[event.template][event.action];
        cursor.pending.pop_front();
        if let Some(at) = cursor.head(self.tz) {
            self.heap.push(Reverse(Event { at, ..event }));
        }
        Some(event)
    }

    /// The template's next event not yet popped.
    fn next_of(&self, template: usize) -> Option<Event> {
        self.cursors[template]
            .iter()
            .enumerate()
            .filter_map(|(index, cursor)| {
                let at = *cursor.pending.front()?;
                Some(Event {
                    at,
                    rank: rank(cursor.action.action),
                    template,
                    action: index,
                })
            })
            .min()
    }
}

#[derive(Clone, Copy, Debug)]
struct Holding {
    template: usize,
    since: Timestamp,
}

/// What one event did to the owner state.
enum Step {
    Started,
    /// A resume by the holder itself.
    Continued,
    /// The slice that just ended by this resume's handoff.
    HandedOff(Holding),
    /// The slice that just ended by this power-off.
    Ended(Holding),
    /// A resume at the same instant as another template's earlier one,
    /// which wins.
    Ignored,
    /// A power-off of a template that does not hold the baseboard.
    NoSlice,
}

#[derive(Debug, Default)]
struct Machine {
    holder: Option<Holding>,
    /// The first resume (in event order) at the latest resume instant.
    last_resume: Option<Event>,
    /// The power-off that ended the latest slice ended by a power-off.
    last_off: Option<Event>,
}

impl Machine {
    /// The state after every event at or before `cut`, found without
    /// replaying them: the holder is the winner of the latest resume instant,
    /// unless it powered off since (the events in between are power-offs
    /// only, and only the holder's own power-off changes anything).
    fn at(templates: &[(String, Vec<ScheduledAction>)], cut: Timestamp, tz: &TimeZone) -> Machine {
        let resume = templates
            .iter()
            .enumerate()
            .flat_map(|(template, (_, actions))| {
                actions
                    .iter()
                    .enumerate()
                    .filter(|(_, a)| a.action == Action::Resume)
                    .filter_map(move |(index, a)| {
                        Some(Event {
                            at: last_at_or_before(a, cut, tz)?,
                            rank: rank(Action::Resume),
                            template,
                            action: index,
                        })
                    })
            })
            // Latest instant; at one instant, the first in event order.
            .min_by_key(|e| (Reverse(e.at), e.template, e.action));
        let Some(resume) = resume else {
            return Machine::default();
        };
        let off = templates[resume.template]
            .1
            .iter()
            .enumerate()
            .filter(|(_, a)| a.action != Action::Resume)
            .filter_map(|(index, a)| {
                Some(Event {
                    at: a.next_after(resume.at, tz).filter(|&at| at <= cut)?,
                    rank: rank(a.action),
                    template: resume.template,
                    action: index,
                })
            })
            .min();
        Machine {
            holder: off.is_none().then_some(Holding {
                template: resume.template,
                since: resume.at,
            }),
            last_resume: Some(resume),
            last_off: off,
        }
    }

    fn apply(&mut self, event: Event, kind: Action) -> Step {
        if kind != Action::Resume {
            return match self.holder {
                Some(holding) if holding.template == event.template => {
                    self.holder = None;
                    self.last_off = Some(event);
                    Step::Ended(holding)
                }
                _ => Step::NoSlice,
            };
        }
        match self.last_resume {
            Some(first) if first.at == event.at => {
                if first.template != event.template {
                    return Step::Ignored;
                }
            }
            _ => self.last_resume = Some(event),
        }
        let started = Holding {
            template: event.template,
            since: event.at,
        };
        match self.holder.replace(started) {
            None => Step::Started,
            Some(holding) if holding.template == event.template => {
                self.holder = Some(holding);
                Step::Continued
            }
            Some(holding) => Step::HandedOff(holding),
        }
    }
}

/// The action's last occurrence at or before `x`, by bisection on
/// `next_after` (which is monotone), so even a far-away one costs about a
/// hundred calls at most.
fn last_at_or_before(a: &ScheduledAction, x: Timestamp, tz: &TimeZone) -> Option<Timestamp> {
    let instant = |ns: i128| Timestamp::from_nanosecond(ns).ok();
    let fires_by_x = |after: i128| {
        instant(after)
            .and_then(|after| a.next_after(after, tz))
            .is_some_and(|at| at <= x)
    };
    // Invariant: some occurrence lies in (lo, x], none in (hi, x].
    let mut lo = a.time.as_nanosecond() - 1;
    let mut hi = x.as_nanosecond();
    if lo >= hi || !fires_by_x(lo) {
        return None;
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fires_by_x(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    a.next_after(instant(lo)?, tz)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{End, Repeat};
    use jiff::civil::{date, DateTime};
    use std::time::Duration;

    fn berlin() -> TimeZone {
        TimeZone::get("Europe/Berlin").unwrap()
    }

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn local_ts(dt: DateTime) -> Timestamp {
        berlin().to_timestamp(dt).unwrap()
    }

    fn weekly(action: Action, time: Timestamp, days: &[u16]) -> ScheduledAction {
        ScheduledAction {
            action,
            time,
            repeat: Repeat::Weekly,
            days: days.to_vec(),
            end: End::Never,
        }
    }

    fn monthly(action: Action, time: Timestamp, days: &[u16]) -> ScheduledAction {
        ScheduledAction {
            repeat: Repeat::Monthly,
            ..weekly(action, time, days)
        }
    }

    fn hourly(action: Action, time: Timestamp, hours: u16) -> ScheduledAction {
        ScheduledAction {
            repeat: Repeat::Hourly,
            ..weekly(action, time, &[hours])
        }
    }

    fn once(action: Action, time: Timestamp) -> ScheduledAction {
        ScheduledAction {
            action,
            time,
            repeat: Repeat::None,
            days: vec![],
            end: End::None,
        }
    }

    fn rotation(parts: &[(&str, Vec<ScheduledAction>)]) -> Vec<(String, Vec<ScheduledAction>)> {
        parts
            .iter()
            .map(|(name, actions)| (name.to_string(), actions.clone()))
            .collect()
    }

    /// (template, start, end, ends_by) with "H:b" for a handoff to b.
    fn slices(rows: &[(&str, &str, &str, &str)]) -> Vec<Slice> {
        rows.iter()
            .map(|&(template, start, end, by)| Slice {
                template: template.to_string(),
                start: ts(start),
                end: ts(end),
                ends_by: match by {
                    "off" => SliceEnd::Poweroff,
                    "hard" => SliceEnd::PoweroffHard,
                    "open" => SliceEnd::Open,
                    _ => SliceEnd::Handoff {
                        to: by.strip_prefix("H:").unwrap().to_string(),
                    },
                },
            })
            .collect()
    }

    const DAYS_400: SignedDuration = SignedDuration::from_hours(400 * 24);
    const FIVE_MIN: Duration = Duration::from_secs(300);

    fn refused(
        templates: &[(String, Vec<ScheduledAction>)],
        now: Timestamp,
        buffer: Duration,
        message: &str,
    ) {
        assert_eq!(
            validate(templates, now, DAYS_400, &berlin(), buffer),
            Err(Error::InvalidRequest(message.to_string()))
        );
    }

    /// A Mon/Wed/Fri, B Tue/Thu, each 09:00-17:00 Berlin, from Monday
    /// 2026-03-23; DST starts Sunday 2026-03-29.
    fn weekdays() -> Vec<(String, Vec<ScheduledAction>)> {
        let nine = local_ts(date(2026, 3, 23).at(9, 0, 0, 0));
        let five = local_ts(date(2026, 3, 23).at(17, 0, 0, 0));
        rotation(&[
            (
                "a",
                vec![
                    weekly(Action::Resume, nine, &[1, 3, 5]),
                    weekly(Action::Poweroff, five, &[1, 3, 5]),
                ],
            ),
            (
                "b",
                vec![
                    weekly(Action::Resume, nine, &[2, 4]),
                    weekly(Action::Poweroff, five, &[2, 4]),
                ],
            ),
        ])
    }

    #[test]
    fn weekday_rotation_across_dst() {
        let templates = weekdays();
        let from = local_ts(date(2026, 3, 23).at(0, 0, 0, 0));
        let to = local_ts(date(2026, 4, 6).at(0, 0, 0, 0));
        assert_eq!(
            timeline(&templates, from, to, &berlin()),
            slices(&[
                // CET: 09:00 is 08:00Z.
                ("a", "2026-03-23T08:00:00Z", "2026-03-23T16:00:00Z", "off"),
                ("b", "2026-03-24T08:00:00Z", "2026-03-24T16:00:00Z", "off"),
                ("a", "2026-03-25T08:00:00Z", "2026-03-25T16:00:00Z", "off"),
                ("b", "2026-03-26T08:00:00Z", "2026-03-26T16:00:00Z", "off"),
                ("a", "2026-03-27T08:00:00Z", "2026-03-27T16:00:00Z", "off"),
                // CEST: 09:00 is 07:00Z.
                ("a", "2026-03-30T07:00:00Z", "2026-03-30T15:00:00Z", "off"),
                ("b", "2026-03-31T07:00:00Z", "2026-03-31T15:00:00Z", "off"),
                ("a", "2026-04-01T07:00:00Z", "2026-04-01T15:00:00Z", "off"),
                ("b", "2026-04-02T07:00:00Z", "2026-04-02T15:00:00Z", "off"),
                ("a", "2026-04-03T07:00:00Z", "2026-04-03T15:00:00Z", "off"),
            ])
        );
        // A window starting and ending inside slices.
        assert_eq!(
            timeline(
                &templates,
                ts("2026-03-25T11:00:00Z"),
                ts("2026-03-26T12:30:00Z"),
                &berlin()
            ),
            slices(&[
                ("a", "2026-03-25T11:00:00Z", "2026-03-25T16:00:00Z", "off"),
                ("b", "2026-03-26T08:00:00Z", "2026-03-26T12:30:00Z", "open"),
            ])
        );
        // A window in the night holds nothing; an empty window neither.
        assert_eq!(
            timeline(
                &templates,
                ts("2026-03-25T17:00:00Z"),
                ts("2026-03-26T08:00:00Z"),
                &berlin()
            ),
            vec![]
        );
        assert_eq!(timeline(&templates, to, from, &berlin()), vec![]);
        // An event exactly at `from` belongs to the window, one at `to` not.
        assert_eq!(
            timeline(
                &templates,
                ts("2026-03-24T08:00:00Z"),
                ts("2026-03-24T16:00:00Z"),
                &berlin()
            ),
            slices(&[("b", "2026-03-24T08:00:00Z", "2026-03-24T16:00:00Z", "open")])
        );
        for buffer in [Duration::ZERO, FIVE_MIN] {
            assert_eq!(
                validate(&templates, from, DAYS_400, &berlin(), buffer),
                Ok(())
            );
        }
    }

    /// A at t0, B at t0+4h, C at t0+8h, each every 12 hours, no power-offs.
    fn hourly_three() -> (Timestamp, Vec<(String, Vec<ScheduledAction>)>) {
        let t0 = ts("2026-03-28T20:00:00Z");
        let at = |h: i64| t0 + SignedDuration::from_hours(h);
        let templates = rotation(&[
            ("a", vec![hourly(Action::Resume, at(0), 12)]),
            ("b", vec![hourly(Action::Resume, at(4), 12)]),
            ("c", vec![hourly(Action::Resume, at(8), 12)]),
        ]);
        (t0, templates)
    }

    #[test]
    fn hourly_rotation_hands_off() {
        let (t0, templates) = hourly_three();
        let to = t0 + SignedDuration::from_hours(24);
        // Across Berlin's DST change: hourly ignores the zone.
        assert_eq!(
            timeline(&templates, t0, to, &berlin()),
            slices(&[
                ("a", "2026-03-28T20:00:00Z", "2026-03-29T00:00:00Z", "H:b"),
                ("b", "2026-03-29T00:00:00Z", "2026-03-29T04:00:00Z", "H:c"),
                ("c", "2026-03-29T04:00:00Z", "2026-03-29T08:00:00Z", "H:a"),
                ("a", "2026-03-29T08:00:00Z", "2026-03-29T12:00:00Z", "H:b"),
                ("b", "2026-03-29T12:00:00Z", "2026-03-29T16:00:00Z", "H:c"),
                ("c", "2026-03-29T16:00:00Z", "2026-03-29T20:00:00Z", "open"),
            ])
        );
        // Weeks later, the holder at `from` is found without replaying.
        assert_eq!(
            timeline(
                &templates,
                ts("2026-05-01T03:00:00Z"),
                ts("2026-05-01T13:00:00Z"),
                &berlin()
            ),
            slices(&[
                ("b", "2026-05-01T03:00:00Z", "2026-05-01T04:00:00Z", "H:c"),
                ("c", "2026-05-01T04:00:00Z", "2026-05-01T08:00:00Z", "H:a"),
                ("a", "2026-05-01T08:00:00Z", "2026-05-01T12:00:00Z", "H:b"),
                ("b", "2026-05-01T12:00:00Z", "2026-05-01T13:00:00Z", "open"),
            ])
        );
        // Handoffs need no gap, so a buffer does not matter.
        for buffer in [Duration::ZERO, FIVE_MIN, Duration::from_secs(3 * 3600)] {
            assert_eq!(
                validate(&templates, t0, DAYS_400, &berlin(), buffer),
                Ok(())
            );
        }
    }

    /// W resumes every Monday at `w_hour` (no power-off: it runs until handed
    /// over); M takes the 1st of each month 02:00-06:00. 2026-06-01 is a
    /// Monday.
    fn maintenance(w_hour: i8) -> Vec<(String, Vec<ScheduledAction>)> {
        let monday = date(2026, 5, 25);
        rotation(&[
            (
                "W",
                vec![weekly(
                    Action::Resume,
                    local_ts(monday.at(w_hour, 0, 0, 0)),
                    &[1],
                )],
            ),
            (
                "M",
                vec![
                    monthly(Action::Resume, local_ts(monday.at(2, 0, 0, 0)), &[1]),
                    monthly(Action::Poweroff, local_ts(monday.at(6, 0, 0, 0)), &[1]),
                ],
            ),
        ])
    }

    #[test]
    fn monthly_maintenance_slice() {
        let from = local_ts(date(2026, 5, 25).at(0, 0, 0, 0));
        let to = local_ts(date(2026, 6, 15).at(0, 0, 0, 0));
        // W at 08:00: M takes over at 02:00 (W's next action is a resume,
        // so a handoff), powers off at 06:00, W resumes at 08:00.
        let templates = maintenance(8);
        assert_eq!(
            timeline(&templates, from, to, &berlin()),
            slices(&[
                ("W", "2026-05-25T06:00:00Z", "2026-06-01T00:00:00Z", "H:M"),
                ("M", "2026-06-01T00:00:00Z", "2026-06-01T04:00:00Z", "off"),
                // W's resume on 06-08 continues its slice.
                ("W", "2026-06-01T06:00:00Z", "2026-06-14T22:00:00Z", "open"),
            ])
        );
        assert_eq!(
            validate(&templates, from, DAYS_400, &berlin(), FIVE_MIN),
            Ok(())
        );

        // W at 03:00 lands inside M's slice: the timeline hands over (M's
        // 06:00 power-off then has nothing to end), validation refuses.
        let templates = maintenance(3);
        assert_eq!(
            timeline(&templates, from, to, &berlin()),
            slices(&[
                ("W", "2026-05-25T01:00:00Z", "2026-06-01T00:00:00Z", "H:M"),
                ("M", "2026-06-01T00:00:00Z", "2026-06-01T01:00:00Z", "H:W"),
                ("W", "2026-06-01T01:00:00Z", "2026-06-14T22:00:00Z", "open"),
            ])
        );
        refused(
            &templates,
            from,
            FIVE_MIN,
            "template W, actions[0] (resume): at Mon 2026-06-01 03:00 Europe/Berlin (UTC+02:00), \
             overlap: template M holds the GPU baseboard then and powers off by itself only at \
             Mon 2026-06-01 06:00 Europe/Berlin (UTC+02:00) (template M, actions[1] (poweroff)); \
             a resume may take the baseboard from another template only as a handoff, when that \
             template's next action is a resume or there is none",
        );
        // Beyond the horizon, the same conflict is not looked at.
        assert_eq!(
            validate(
                &templates,
                from,
                SignedDuration::from_hours(24 * 6),
                &berlin(),
                FIVE_MIN
            ),
            Ok(())
        );
    }

    #[test]
    fn overlap_within_a_day_is_refused() {
        // B resumes Wednesday 12:00 while A (09:00-17:00) still holds.
        let mut templates = weekdays();
        templates[1].1[0] = weekly(
            Action::Resume,
            local_ts(date(2026, 3, 23).at(12, 0, 0, 0)),
            &[3],
        );
        templates[1].1[1] = weekly(
            Action::Poweroff,
            local_ts(date(2026, 3, 23).at(20, 0, 0, 0)),
            &[3],
        );
        refused(
            &templates,
            ts("2026-03-23T00:00:00Z"),
            Duration::ZERO,
            "template b, actions[0] (resume): at Wed 2026-03-25 12:00 Europe/Berlin (UTC+01:00), \
             overlap: template a holds the GPU baseboard then and powers off by itself only at \
             Wed 2026-03-25 17:00 Europe/Berlin (UTC+01:00) (template a, actions[1] (poweroff)); \
             a resume may take the baseboard from another template only as a handoff, when that \
             template's next action is a resume or there is none",
        );
        // Asked from inside that slice, the holder comes from the past.
        refused(
            &templates,
            ts("2026-03-25T10:00:00Z"),
            Duration::ZERO,
            "template b, actions[0] (resume): at Wed 2026-03-25 12:00 Europe/Berlin (UTC+01:00), \
             overlap: template a holds the GPU baseboard then and powers off by itself only at \
             Wed 2026-03-25 17:00 Europe/Berlin (UTC+01:00) (template a, actions[1] (poweroff)); \
             a resume may take the baseboard from another template only as a handoff, when that \
             template's next action is a resume or there is none",
        );
    }

    /// A 09:00-17:00 and B from 17:00 + `minutes`, Mondays, to 23:00.
    fn back_to_back(minutes: i8) -> Vec<(String, Vec<ScheduledAction>)> {
        let monday = date(2026, 3, 23);
        let at = |h: i8, m: i8| local_ts(monday.at(h, m, 0, 0));
        rotation(&[
            (
                "a",
                vec![
                    weekly(Action::Resume, at(9, 0), &[1]),
                    weekly(Action::Poweroff, at(17, 0), &[1]),
                ],
            ),
            (
                "b",
                vec![
                    weekly(Action::PoweroffHard, at(23, 0), &[1]),
                    weekly(Action::Resume, at(17, minutes), &[1]),
                ],
            ),
        ])
    }

    #[test]
    fn gap_shorter_than_the_buffer_is_refused() {
        let now = ts("2026-03-23T00:00:00Z");
        refused(
            &back_to_back(3),
            now,
            FIVE_MIN,
            "template b, actions[1] (resume): at Mon 2026-03-23 17:03 Europe/Berlin (UTC+01:00), \
             too soon after a power-off: template a, actions[1] (poweroff) ends the previous \
             slice at Mon 2026-03-23 17:00 Europe/Berlin (UTC+01:00), only 3m earlier; a resume \
             needs at least 5m (the buffer) after the previous power-off",
        );
        // Exactly the buffer is enough; a zero buffer allows back to back.
        let three = Duration::from_secs(180);
        assert_eq!(
            validate(&back_to_back(3), now, DAYS_400, &berlin(), three),
            Ok(())
        );
        assert_eq!(
            validate(&back_to_back(0), now, DAYS_400, &berlin(), Duration::ZERO),
            Ok(())
        );
        refused(
            &back_to_back(0),
            now,
            Duration::from_secs(1),
            "template b, actions[1] (resume): at Mon 2026-03-23 17:00 Europe/Berlin (UTC+01:00), \
             too soon after a power-off: template a, actions[1] (poweroff) ends the previous \
             slice at Mon 2026-03-23 17:00 Europe/Berlin (UTC+01:00), only 0s earlier; a resume \
             needs at least 1s (the buffer) after the previous power-off",
        );
        // Back to back at one instant: the power-off comes first, no handoff.
        assert_eq!(
            timeline(&back_to_back(0), now, ts("2026-03-24T00:00:00Z"), &berlin()),
            slices(&[
                ("a", "2026-03-23T08:00:00Z", "2026-03-23T16:00:00Z", "off"),
                ("b", "2026-03-23T16:00:00Z", "2026-03-23T22:00:00Z", "hard"),
            ])
        );
        // The power-off may lie before `now`.
        refused(
            &back_to_back(3),
            ts("2026-03-23T16:01:00Z"),
            FIVE_MIN,
            "template b, actions[1] (resume): at Mon 2026-03-23 17:03 Europe/Berlin (UTC+01:00), \
             too soon after a power-off: template a, actions[1] (poweroff) ends the previous \
             slice at Mon 2026-03-23 17:00 Europe/Berlin (UTC+01:00), only 3m earlier; a resume \
             needs at least 5m (the buffer) after the previous power-off",
        );
        // The same template restarting needs the buffer too.
        let monday = date(2026, 3, 23);
        let restart = rotation(&[(
            "a",
            vec![
                weekly(Action::Resume, local_ts(monday.at(9, 0, 0, 0)), &[1]),
                weekly(Action::Poweroff, local_ts(monday.at(12, 0, 0, 0)), &[1]),
                weekly(Action::Resume, local_ts(monday.at(12, 1, 30, 0)), &[1]),
                weekly(Action::Poweroff, local_ts(monday.at(17, 0, 0, 0)), &[1]),
            ],
        )]);
        refused(
            &restart,
            now,
            FIVE_MIN,
            "template a, actions[2] (resume): at Mon 2026-03-23 12:01:30 Europe/Berlin \
             (UTC+01:00), too soon after a power-off: template a, actions[1] (poweroff) ends \
             the previous slice at Mon 2026-03-23 12:00 Europe/Berlin (UTC+01:00), only 1m 30s \
             earlier; a resume needs at least 5m (the buffer) after the previous power-off",
        );
    }

    #[test]
    fn poweroff_without_a_slice_is_refused() {
        let now = ts("2026-03-23T00:00:00Z");
        let monday = date(2026, 3, 23);
        let at = |h: i8| local_ts(monday.at(h, 0, 0, 0));
        // Never resumed.
        refused(
            &rotation(&[("a", vec![once(Action::Poweroff, at(10))])]),
            now,
            FIVE_MIN,
            "template a, actions[0] (poweroff): at Mon 2026-03-23 10:00 Europe/Berlin \
             (UTC+01:00), nothing to power off: template a does not hold the GPU baseboard then \
             (no template holds it); a power-off must end a slice that a resume of template a \
             started",
        );
        // Already off: a hard power-off half an hour after the soft one.
        refused(
            &rotation(&[(
                "a",
                vec![
                    weekly(Action::Resume, at(9), &[1]),
                    weekly(Action::Poweroff, at(17), &[1]),
                    weekly(
                        Action::PoweroffHard,
                        local_ts(monday.at(17, 30, 0, 0)),
                        &[1],
                    ),
                ],
            )]),
            now,
            FIVE_MIN,
            "template a, actions[2] (poweroff-hard): at Mon 2026-03-23 17:30 Europe/Berlin \
             (UTC+01:00), nothing to power off: template a does not hold the GPU baseboard then \
             (no template holds it); a power-off must end a slice that a resume of template a \
             started",
        );
        // Another template holds the baseboard.
        refused(
            &rotation(&[
                ("a", vec![once(Action::Resume, at(9))]),
                ("c", vec![once(Action::Poweroff, at(10))]),
            ]),
            now,
            FIVE_MIN,
            "template c, actions[0] (poweroff): at Mon 2026-03-23 10:00 Europe/Berlin \
             (UTC+01:00), nothing to power off: template c does not hold the GPU baseboard then \
             (template a holds it); a power-off must end a slice that a resume of template c \
             started",
        );
    }

    #[test]
    fn simultaneous_resumes_are_refused() {
        let now = ts("2026-03-23T00:00:00Z");
        let nine = local_ts(date(2026, 3, 23).at(9, 0, 0, 0));
        let templates = rotation(&[
            ("a", vec![weekly(Action::Resume, nine, &[1, 2])]),
            ("b", vec![weekly(Action::Resume, nine, &[2])]),
        ]);
        refused(
            &templates,
            now,
            FIVE_MIN,
            "template b, actions[0] (resume): at Tue 2026-03-24 09:00 Europe/Berlin (UTC+01:00), \
             simultaneous resumes: template a, actions[0] (resume) resumes at the same instant; \
             only one template can take the GPU baseboard at a time (the slice of template b \
             is not started)",
        );
        // The timeline gives it to the first template listed.
        assert_eq!(
            timeline(&templates, now, ts("2026-03-25T00:00:00Z"), &berlin()),
            slices(&[("a", "2026-03-23T08:00:00Z", "2026-03-25T00:00:00Z", "open")])
        );
        // The same template resuming twice at once is harmless.
        let twice = rotation(&[(
            "a",
            vec![
                weekly(Action::Resume, nine, &[1]),
                once(Action::Resume, nine),
            ],
        )]);
        assert_eq!(validate(&twice, now, DAYS_400, &berlin(), FIVE_MIN), Ok(()));
    }

    #[test]
    fn validation_is_bounded() {
        // Three templates handing over every hour for a century: the event cap
        // stops it.
        let t0 = ts("2026-01-01T00:00:00Z");
        let templates = rotation(&[
            ("a", vec![hourly(Action::Resume, t0, 1)]),
            (
                "b",
                vec![hourly(
                    Action::Resume,
                    t0 + SignedDuration::from_mins(20),
                    1,
                )],
            ),
            (
                "c",
                vec![hourly(
                    Action::Resume,
                    t0 + SignedDuration::from_mins(40),
                    1,
                )],
            ),
        ]);
        let century = SignedDuration::from_hours(100 * 366 * 24);
        assert_eq!(
            validate(&templates, t0, century, &berlin(), FIVE_MIN),
            Ok(())
        );
        let all = timeline(&templates, t0, t0 + century, &berlin());
        assert_eq!(all.len(), MAX_EVENTS);
        let last = all.last().unwrap();
        assert_eq!(last.ends_by, SliceEnd::Open);
        assert_eq!(
            last.end,
            t0 + SignedDuration::from_mins(20 * MAX_EVENTS as i64)
        );
        // Far from the actions' start, the starting state is still cheap.
        let later = ts("2126-01-01T00:10:00Z");
        assert_eq!(
            timeline(
                &templates,
                later,
                later + SignedDuration::from_mins(30),
                &berlin()
            ),
            slices(&[
                ("a", "2126-01-01T00:10:00Z", "2126-01-01T00:20:00Z", "H:b"),
                ("b", "2126-01-01T00:20:00Z", "2126-01-01T00:40:00Z", "open"),
            ])
        );
        // A negative or zero horizon looks at nothing.
        let bad = rotation(&[(
            "a",
            vec![once(Action::Poweroff, t0 + SignedDuration::from_secs(1))],
        )]);
        assert_eq!(
            validate(&bad, t0, SignedDuration::ZERO, &berlin(), FIVE_MIN),
            Ok(())
        );
        assert_eq!(
            validate(&bad, t0, SignedDuration::from_secs(-5), &berlin(), FIVE_MIN),
            Ok(())
        );
        assert!(validate(&bad, t0, SignedDuration::MAX, &berlin(), FIVE_MIN).is_err());
    }

    /// The next slices however far away: a first resume 500 days out and
    /// its power-off 500 days later (one slice across a 400-day edge of the
    /// walk, joined), then a weekly rotation from three years out; what one
    /// long timeline window gives is the oracle. Schedules that have ended
    /// give none, and the walk stops.
    #[test]
    fn next_slices_reach_past_400_days_and_join_what_an_edge_cut() {
        let t0 = ts("2030-01-01T00:00:00Z");
        let day = |n: i64| t0 + SignedDuration::from_hours(24 * n);
        let far = rotation(&[(
            "a",
            vec![
                once(Action::Resume, day(500)),
                once(Action::Poweroff, day(1000)),
            ],
        )]);
        let got = next_slices(&far, t0, 5, &TimeZone::UTC);
        assert_eq!(got, timeline(&far, t0, day(1100), &TimeZone::UTC));
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].start, got[0].end), (day(500), day(1000)));
        assert_eq!(got[0].ends_by, SliceEnd::Poweroff);

        let weekly_from = day(3 * 365);
        let weekly = rotation(&[(
            "b",
            vec![
                weekly(
                    Action::Resume,
                    weekly_from + SignedDuration::from_hours(9),
                    &[1, 3],
                ),
                weekly(
                    Action::Poweroff,
                    weekly_from + SignedDuration::from_hours(17),
                    &[1, 3],
                ),
            ],
        )]);
        let got = next_slices(&weekly, t0, 3, &TimeZone::UTC);
        let mut oracle = timeline(
            &weekly,
            t0,
            weekly_from + SignedDuration::from_hours(24 * 30),
            &TimeZone::UTC,
        );
        oracle.truncate(3);
        assert_eq!(got, oracle);
        assert_eq!(got.len(), 3);
        assert!(got[0].start >= weekly_from, "{got:?}");

        // All in the past: nothing, and no walk over the cycle.
        let ended = rotation(&[(
            "c",
            vec![
                once(Action::Resume, day(-10)),
                once(Action::Poweroff, day(-9)),
            ],
        )]);
        assert_eq!(next_slices(&ended, t0, 3, &TimeZone::UTC), vec![]);
    }

    #[test]
    fn last_occurrence_by_bisection() {
        let tz = berlin();
        let t0 = local_ts(date(2026, 3, 23).at(9, 0, 0, 0));
        let a = weekly(Action::Resume, t0, &[1, 4]);
        assert_eq!(last_at_or_before(&a, t0, &tz), Some(t0));
        assert_eq!(
            last_at_or_before(&a, t0 - SignedDuration::from_nanos(1), &tz),
            None
        );
        // Thursday 03-26 09:00 CET; Monday 03-30 09:00 CEST.
        assert_eq!(
            last_at_or_before(&a, ts("2026-03-30T06:59:59Z"), &tz),
            Some(ts("2026-03-26T08:00:00Z"))
        );
        assert_eq!(
            last_at_or_before(&a, ts("2026-03-30T07:00:00Z"), &tz),
            Some(ts("2026-03-30T07:00:00Z"))
        );
        let counted = ScheduledAction {
            end: End::After(3),
            ..a
        };
        assert_eq!(
            last_at_or_before(&counted, ts("2030-01-01T00:00:00Z"), &tz),
            Some(ts("2026-03-30T07:00:00Z"))
        );
    }
}
