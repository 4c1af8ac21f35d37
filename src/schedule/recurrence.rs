//! When a scheduled action fires: DST-correct recurrence in a time zone,
//! within its END rule.

use super::*;

impl ScheduledAction {
    /// The next occurrences strictly after `after`, ascending, at most
    /// `limit`, within the END rule. A count-based end counts from the very
    /// first occurrence, including those at or before `after`.
    ///
    /// Calendar repeats fire at TIME's local time of day in `tz`: a time in a
    /// DST gap moves forward by the gap, a time in a fold fires once, at its
    /// first instance. Hourly repeats are absolute hours and ignore `tz`.
    pub fn occurrences_after(
        &self,
        after: Timestamp,
        tz: &TimeZone,
        limit: usize,
    ) -> Vec<Timestamp> {
        let mut out = Vec::new();
        if limit == 0 {
            return out;
        }
        match self.repeat {
            Repeat::None => {
                if self.time > after && !self.ended(0, self.time) {
                    out.push(self.time);
                }
            }
            Repeat::Hourly => self.hourly_after(after, limit, &mut out),
            Repeat::Weekly | Repeat::Monthly | Repeat::Yearly => {
                self.calendar_after(after, tz, limit, &mut out)
            }
        }
        out
    }

    /// The first occurrence strictly after `after`, if any.
    pub fn next_after(&self, after: Timestamp, tz: &TimeZone) -> Option<Timestamp> {
        self.occurrences_after(after, tz, 1).first().copied()
    }

    /// For a preview: the listed days that do not occur between `from` and
    /// `until` (local dates in `tz`; also bounded by TIME and an end epoch),
    /// one line per month (monthly) or year (yearly day 365), at most
    /// `limit` lines, e.g. "day 31 does not occur in April 2027". Empty for
    /// other repeats, whose listed days always occur.
    pub fn missing_days(
        &self,
        from: Timestamp,
        until: Timestamp,
        tz: &TimeZone,
        limit: usize,
    ) -> Vec<String> {
        let from = from.max(self.time);
        let until = match self.end {
            End::Until(end) => until.min(end),
            _ => until,
        };
        let mut lines = Vec::new();
        if from > until || limit == 0 {
            return lines;
        }
        let (first, last) = (tz.to_datetime(from).date(), tz.to_datetime(until).date());
        match self.repeat {
            Repeat::Monthly => {
                let (mut year, mut month) = (first.year(), first.month());
                while (year, month) <= (last.year(), last.month()) && lines.len() < limit {
                    let length = month_len(i64::from(year), month);
                    let missing: Vec<String> = self
                        .days
                        .iter()
                        .filter(|&&d| d > length)
                        // Only days that would have fallen inside the range.
                        .filter(|&&d| {
                            let key = (year, month, d);
                            key >= (first.year(), first.month(), first.day() as u16)
                                && key <= (last.year(), last.month(), last.day() as u16)
                        })
                        .map(u16::to_string)
                        .collect();
                    if !missing.is_empty() {
                        let name = Date::new(year, month, 1)
                            .map(|d| d.strftime("%B %Y").to_string())
                            .unwrap_or_default();
                        lines.push(if missing.len() == 1 {
                            format!("day {} does not occur in {name}", missing[0])
                        } else {
                            format!("days {} do not occur in {name}", missing.join(", "))
                        });
                    }
                    (year, month) = if month == 12 {
                        (year + 1, 1)
                    } else {
                        (year, month + 1)
                    };
                }
            }
            Repeat::Yearly if self.days.contains(&365) => {
                for year in first.year()..=last.year() {
                    let in_range = (year, 365) >= (first.year(), first.day_of_year() - 1)
                        && (year, 365) <= (last.year(), last.day_of_year() - 1);
                    if !is_leap(i64::from(year)) && in_range && lines.len() < limit {
                        lines.push(format!(
                            "day 365 does not occur in {year} (not a leap year)"
                        ));
                    }
                }
            }
            _ => {}
        }
        lines
    }

    /// Whether the occurrence with this 0-based index, at this instant, is
    /// past the END rule.
    fn ended(&self, index: u64, at: Timestamp) -> bool {
        match self.end {
            End::After(count) => index >= u64::from(count),
            End::Until(end) => at > end,
            End::None | End::Never => false,
        }
    }

    /// Hourly: occurrence k is TIME + k·interval; the first one after `after`
    /// is found arithmetically, so a far-away `after` costs nothing.
    fn hourly_after(&self, after: Timestamp, limit: usize, out: &mut Vec<Timestamp>) {
        let Some(&hours) = self.days.first().filter(|&&h| h > 0) else {
            return;
        };
        let step = i64::from(hours) * 3600;
        let start = self.time.as_second();
        // Seconds, floored: occurrence k is then > `after` even with sub-seconds.
        let mut k = if after < self.time {
            0
        } else {
            (after.as_second() - start) / step + 1
        };
        while out.len() < limit {
            let Some(at) = k
                .checked_mul(step)
                .and_then(|offset| start.checked_add(offset))
                .and_then(|s| Timestamp::from_second(s).ok())
            else {
                return;
            };
            if self.ended(k as u64, at) {
                return;
            }
            out.push(at);
            k += 1;
        }
    }

    /// Weekly, monthly, yearly: one "slot" per listed local date from TIME's
    /// date on, at TIME's local time of day. Slots are numbered for the count
    /// end; the walk starts near `after`, with the slots before it counted
    /// arithmetically.
    fn calendar_after(
        &self,
        after: Timestamp,
        tz: &TimeZone,
        limit: usize,
        out: &mut Vec<Timestamp>,
    ) {
        if self.days.is_empty() {
            return;
        }
        let start = tz.to_datetime(self.time);
        let (first, time_of_day) = (start.date(), start.time());
        let instant = |date: Date| tz.to_timestamp(date.to_datetime(time_of_day)).ok();

        // A few days' margin before `after`, because a DST gap can push a
        // slot's instant past its local midnight.
        let from = if after > self.time {
            let near = tz.to_datetime(after).date();
            near.checked_sub(3.days()).unwrap_or(near).max(first)
        } else {
            first
        };
        // TIME's own date is a slot only if its instant is not before TIME
        // (it is, when TIME is the second instance of a folded hour).
        let first_is_early = self.lists(first) && instant(first).is_some_and(|at| at < self.time);
        let mut index = if from > first {
            self.slots_between(first, from) - u64::from(first_is_early)
        } else {
            0
        };

        let mut previous: Option<Timestamp> = None;
        self.walk_dates(from, |date| {
            let Some(at) = instant(date) else {
                return ControlFlow::Break(());
            };
            if at < self.time {
                return ControlFlow::Continue(());
            }
            if self.ended(index, at) {
                return ControlFlow::Break(());
            }
            index += 1;
            // A zone that skips a whole day can map two listed dates onto one
            // instant: fire once (the slot still counts).
            if previous.is_some_and(|p| at <= p) {
                return ControlFlow::Continue(());
            }
            previous = Some(at);
            if at > after {
                out.push(at);
                if out.len() >= limit {
                    return ControlFlow::Break(());
                }
            }
            ControlFlow::Continue(())
        });
    }

    fn lists(&self, date: Date) -> bool {
        let day = match self.repeat {
            Repeat::Weekly => date.weekday().to_sunday_zero_offset() as u16,
            Repeat::Monthly => date.day() as u16,
            Repeat::Yearly => (date.day_of_year() - 1) as u16,
            Repeat::None | Repeat::Hourly => return false,
        };
        self.days.binary_search(&day).is_ok()
    }

    /// Visits the listed dates from `from` on, ascending, stepping by day,
    /// month or year as the repeat allows, until `visit` breaks or no listed
    /// date turns up for SEARCH_YEARS years (counted from `from` or from the
    /// last date visited, so a rare day with a long count, like day 365 for
    /// a hundred leap years, is followed to its end).
    pub(super) fn walk_dates(&self, from: Date, mut visit: impl FnMut(Date) -> ControlFlow<()>) {
        let bound = |year: i16| (i32::from(year) + SEARCH_YEARS).min(9999) as i16;
        let mut last_year = bound(from.year());
        // Visits one date; true when the walk is to stop.
        let mut step = |date: Date, last_year: &mut i16| {
            *last_year = bound(date.year());
            visit(date).is_break()
        };
        match self.repeat {
            Repeat::Weekly => {
                let mut date = from;
                while date.year() <= last_year {
                    if self.lists(date) && step(date, &mut last_year) {
                        return;
                    }
                    match date.tomorrow() {
                        Ok(next) => date = next,
                        Err(_) => return,
                    }
                }
            }
            Repeat::Monthly => {
                let (mut year, mut month) = (from.year(), from.month());
                while year <= last_year {
                    // A day the month lacks (31 in April) has no slot there.
                    for &day in &self.days {
                        let Ok(date) = Date::new(year, month, day as i8) else {
                            break;
                        };
                        if date >= from && step(date, &mut last_year) {
                            return;
                        }
                    }
                    (year, month) = if month == 12 {
                        (year + 1, 1)
                    } else {
                        (year, month + 1)
                    };
                }
            }
            Repeat::Yearly => {
                let mut year = from.year();
                while year <= last_year {
                    let Ok(new_year) = Date::new(year, 1, 1) else {
                        return;
                    };
                    // Day 365 exists only in leap years.
                    for &day in self
                        .days
                        .iter()
                        .filter(|&&d| d < new_year.days_in_year() as u16)
                    {
                        let Ok(date) = new_year.with().day_of_year(day as i16 + 1).build() else {
                            break;
                        };
                        if date >= from && step(date, &mut last_year) {
                            return;
                        }
                    }
                    year += 1;
                }
            }
            Repeat::None | Repeat::Hourly => {}
        }
    }

    /// How many listed dates lie in `[first, to)`, by arithmetic rather than
    /// by walking.
    pub(super) fn slots_between(&self, first: Date, to: Date) -> u64 {
        let rank = |date: Date| -> i64 {
            match self.repeat {
                Repeat::Weekly => 0, // handled below: weekly is relative to `first`
                Repeat::Monthly => monthly_rank(&self.days, date),
                Repeat::Yearly => yearly_rank(&self.days, date),
                Repeat::None | Repeat::Hourly => 0,
            }
        };
        let count = if self.repeat == Repeat::Weekly {
            // Civil dates: whole days, no DST involved.
            let days = to.duration_since(first).as_secs() / 86_400;
            let weekday0 = i64::from(first.weekday().to_sunday_zero_offset());
            let listed = |weekday: i64| self.days.contains(&(weekday as u16));
            let per_week = (0..7).filter(|&w| listed(w)).count() as i64;
            let partial = (0..days % 7).filter(|i| listed((weekday0 + i) % 7)).count() as i64;
            days / 7 * per_week + partial
        } else {
            rank(to) - rank(first)
        };
        count.max(0) as u64
    }
}

/// Listed monthly dates before `date`, counted from 0001-01-01.
fn monthly_rank(days: &[u16], date: Date) -> i64 {
    let fitting = |length: u16| days.iter().filter(|&&d| d <= length).count() as i64;
    let year = i64::from(date.year());
    let (years, leaps) = (year - 1, leap_years_before(year));
    // A common year has seven 31-day months, four 30-day months and February.
    let mut rank = years * (7 * fitting(31) + 4 * fitting(30) + fitting(28))
        + leaps * (fitting(29) - fitting(28));
    for month in 1..date.month() {
        rank += fitting(month_len(year, month));
    }
    rank + days.iter().filter(|&&d| d < date.day() as u16).count() as i64
}

/// Listed yearly dates (0-based day of year) before `date`, counted from
/// 0001-01-01.
fn yearly_rank(days: &[u16], date: Date) -> i64 {
    let common = days.iter().filter(|&&d| d <= 364).count() as i64;
    let leap_only = i64::from(days.contains(&365));
    let year = i64::from(date.year());
    let day_of_year = (date.day_of_year() - 1) as u16;
    (year - 1) * common
        + leap_years_before(year) * leap_only
        + days.iter().filter(|&&d| d < day_of_year).count() as i64
}

/// Leap years in [1, year).
fn leap_years_before(year: i64) -> i64 {
    let y = year - 1;
    y / 4 - y / 100 + y / 400
}

fn is_leap(year: i64) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

fn month_len(year: i64, month: i8) -> u16 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// True when `time` on `date` does not exist on the clocks of `tz` (a DST
/// gap), so its occurrence was moved forward. Public for previews and tests.
pub fn in_gap(date: Date, time: Time, tz: &TimeZone) -> bool {
    matches!(
        tz.to_ambiguous_timestamp(date.to_datetime(time)).offset(),
        AmbiguousOffset::Gap { .. }
    )
}
