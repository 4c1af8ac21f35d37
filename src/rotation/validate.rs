//! A rotation checked over its whole calendar cycle: overlaps, gaps
//! shorter than the buffer, power-offs with no slice, and the slices a
//! conflict drops.

use super::*;

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
