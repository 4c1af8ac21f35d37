//! Every occurrence of every template's actions as one ordered stream of
//! events, and the owner machine that reads it.

use super::*;

/// One occurrence of one action, ordered as the owner model processes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Event {
    pub(super) at: Timestamp,
    /// 0 for power-offs, 1 for resumes: power-offs first at one instant.
    pub(super) rank: u8,
    pub(super) template: usize,
    pub(super) action: usize,
}

pub(super) fn rank(kind: Action) -> u8 {
    match kind {
        Action::Resume => 1,
        Action::Poweroff | Action::PoweroffHard => 0,
    }
}

/// One action's occurrences, fetched in batches.
pub(super) struct Cursor<'a> {
    pub(super) action: &'a ScheduledAction,
    pub(super) after: Timestamp,
    pub(super) pending: VecDeque<Timestamp>,
    pub(super) done: bool,
}

impl Cursor<'_> {
    pub(super) fn head(&mut self, tz: &TimeZone) -> Option<Timestamp> {
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
pub(super) struct Streams<'a> {
    pub(super) templates: &'a [(String, Vec<ScheduledAction>)],
    pub(super) tz: &'a TimeZone,
    pub(super) cursors: Vec<Vec<Cursor<'a>>>,
    /// Exactly each cursor's head, as an event.
    pub(super) heap: BinaryHeap<Reverse<Event>>,
}

impl<'a> Streams<'a> {
    pub(super) fn new(
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

    pub(super) fn kind(&self, event: Event) -> Action {
        self.templates[event.template].1[event.action].action
    }

    pub(super) fn peek(&self) -> Option<Event> {
        self.heap.peek().map(|Reverse(event)| *event)
    }

    pub(super) fn pop(&mut self) -> Option<Event> {
        let Reverse(event) = self.heap.pop()?;
        let cursor = &mut self.cursors[event.template][event.action];
        cursor.pending.pop_front();
        if let Some(at) = cursor.head(self.tz) {
            self.heap.push(Reverse(Event { at, ..event }));
        }
        Some(event)
    }

    /// The template's next event not yet popped.
    pub(super) fn next_of(&self, template: usize) -> Option<Event> {
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
pub(super) struct Holding {
    pub(super) template: usize,
    pub(super) since: Timestamp,
}

/// What one event did to the owner state.
pub(super) enum Step {
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
pub(super) struct Machine {
    pub(super) holder: Option<Holding>,
    /// The first resume (in event order) at the latest resume instant.
    pub(super) last_resume: Option<Event>,
    /// The power-off that ended the latest slice ended by a power-off.
    pub(super) last_off: Option<Event>,
}

impl Machine {
    /// The state after every event at or before `cut`, found without
    /// replaying them: the holder is the winner of the latest resume instant,
    /// unless it powered off since (the events in between are power-offs
    /// only, and only the holder's own power-off changes anything).
    pub(super) fn at(
        templates: &[(String, Vec<ScheduledAction>)],
        cut: Timestamp,
        tz: &TimeZone,
    ) -> Machine {
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

    pub(super) fn apply(&mut self, event: Event, kind: Action) -> Step {
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
pub(super) fn last_at_or_before(
    a: &ScheduledAction,
    x: Timestamp,
    tz: &TimeZone,
) -> Option<Timestamp> {
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
