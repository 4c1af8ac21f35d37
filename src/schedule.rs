//! Scheduled actions with OpenNebula SCHED_ACTION semantics: parse and
//! validate a template's JSON list of actions, and compute when each one
//! fires in a given time zone.
//!
//! The module is pure: no I/O and no clock reads. "Now" and the time zone are
//! always arguments, so callers (and tests) decide both.

use std::ops::ControlFlow;

use jiff::civil::{Date, Time};
use jiff::tz::{AmbiguousOffset, TimeZone};
use jiff::{Timestamp, ToSpan};
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::json_fields::clip;

/// Largest accepted JSON document, in bytes.
pub const MAX_JSON_BYTES: usize = 64 * 1024;
/// Most actions one template may carry.
pub const MAX_ACTIONS: usize = 256;
/// Longest hourly interval, in hours (one week).
pub const MAX_HOURLY_INTERVAL: u16 = 168;
/// How many years ahead of its start, or of the last listed date it found, a
/// calendar search looks before giving up, so that a day that (almost) never
/// occurs still terminates. 400 years is one full Gregorian cycle: whatever
/// exists at all exists within it.
const SEARCH_YEARS: i32 = 400;

const FIELDS: [&str; 6] = ["action", "time", "repeat", "days", "end_type", "end_value"];
const ACTIONS_ACCEPTED: &str = r#"one of "resume", "poweroff", "poweroff-hard""#;
const TIME_ACCEPTED: &str = r#"integer epoch seconds (> 0), "+N" (N whole seconds from now) or an RFC 3339 date-time with the zone's offset ("2027-01-04T09:00:00+01:00")"#;
const REPEAT_ACCEPTED: &str = "one of -1 (none), 0 (weekly), 1 (monthly), 2 (yearly), 3 (hourly)";
const END_TYPE_ACCEPTED: &str =
    "one of -1 (none), 0 (never), 1 (after end_value occurrences), 2 (until the end_value epoch)";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    Resume,
    Poweroff,
    PoweroffHard,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Resume => "resume",
            Action::Poweroff => "poweroff",
            Action::PoweroffHard => "poweroff-hard",
        }
    }

    fn from_name(name: &str) -> Option<Action> {
        match name {
            "resume" => Some(Action::Resume),
            "poweroff" => Some(Action::Poweroff),
            "poweroff-hard" => Some(Action::PoweroffHard),
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Repeat {
    None,
    Weekly,
    Monthly,
    Yearly,
    Hourly,
}

impl Repeat {
    /// The number used in JSON (OpenNebula's REPEAT).
    pub fn code(self) -> i64 {
        match self {
            Repeat::None => -1,
            Repeat::Weekly => 0,
            Repeat::Monthly => 1,
            Repeat::Yearly => 2,
            Repeat::Hourly => 3,
        }
    }

    fn from_code(code: i64) -> Option<Repeat> {
        match code {
            -1 => Some(Repeat::None),
            0 => Some(Repeat::Weekly),
            1 => Some(Repeat::Monthly),
            2 => Some(Repeat::Yearly),
            3 => Some(Repeat::Hourly),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Repeat::None => "none",
            Repeat::Weekly => "weekly",
            Repeat::Monthly => "monthly",
            Repeat::Yearly => "yearly",
            Repeat::Hourly => "hourly",
        }
    }

    /// What `days` may hold for this repeat; every days error repeats it.
    fn days_accepted(self) -> &'static str {
        match self {
            Repeat::None => "no days without a repeat",
            Repeat::Weekly => "weekly days are 0 (Sunday) to 6 (Saturday)",
            Repeat::Monthly => "monthly days are 1 to 31",
            Repeat::Yearly => {
                "yearly days are 0 to 365 (day of the year counted from 0; 365 only in leap years)"
            }
            Repeat::Hourly => "hourly takes exactly one number, the interval in hours, 1 to 168",
        }
    }

    fn max_day(self) -> u16 {
        match self {
            Repeat::None => 0,
            Repeat::Weekly => 6,
            Repeat::Monthly => 31,
            Repeat::Yearly => 365,
            Repeat::Hourly => MAX_HOURLY_INTERVAL,
        }
    }

    fn min_day(self) -> u16 {
        match self {
            Repeat::Monthly | Repeat::Hourly => 1,
            _ => 0,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum End {
    /// END_TYPE -1: not given (only for actions that do not repeat).
    None,
    /// END_TYPE 0: repeats forever.
    Never,
    /// END_TYPE 1: this many occurrences in total, counted from the first.
    After(u32),
    /// END_TYPE 2: no occurrence after this instant (one exactly at it fires).
    Until(Timestamp),
}

impl End {
    /// The number used in JSON (OpenNebula's END_TYPE).
    pub fn code(self) -> i64 {
        match self {
            End::None => -1,
            End::Never => 0,
            End::After(_) => 1,
            End::Until(_) => 2,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduledAction {
    pub action: Action,
    /// The first possible occurrence; a `+N` from the JSON is already resolved.
    pub time: Timestamp,
    pub repeat: Repeat,
    /// Sorted, without duplicates; empty exactly when `repeat` is `None`.
    /// For hourly, the single interval in hours.
    pub days: Vec<u16>,
    pub end: End,
}

/// Parses a template's JSON list of scheduled actions. A `"+N"` time is
/// resolved against `now` here, once; the result holds absolute times.
pub fn parse_actions(json: &str, now: Timestamp) -> Result<Vec<ScheduledAction>> {
    if json.len() > MAX_JSON_BYTES {
        return Err(Error::field(
            "actions",
            format!(
                "at most {MAX_JSON_BYTES} bytes of JSON; got {} bytes",
                json.len()
            ),
        ));
    }
    let value: Value = serde_json::from_str(json).map_err(|e| {
        Error::field(
            "actions",
            format!(
                r#"not valid JSON ({e}); expected a list like [{{"action":"poweroff","time":"+3600"}}], or OpenNebula's SCHED_ACTION=[ACTION="poweroff", TIME="+3600"] text"#
            ),
        )
    })?;
    let Value::Array(items) = value else {
        return Err(Error::field(
            "actions",
            format!(
                r#"a JSON list of actions like [{{"action":"poweroff","time":"+3600"}}]; got {}"#,
                shown(&value)
            ),
        ));
    };
    if items.len() > MAX_ACTIONS {
        return Err(Error::field(
            "actions",
            format!("at most {MAX_ACTIONS} actions; got {}", items.len()),
        ));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| parse_action(&format!("actions[{i}]"), item, now))
        .collect()
}

fn parse_action(path: &str, value: &Value, now: Timestamp) -> Result<ScheduledAction> {
    let Value::Object(map) = value else {
        return Err(Error::field(
            path,
            format!(
                r#"an object like {{"action":"poweroff","time":"+3600"}}; got {}"#,
                shown(value)
            ),
        ));
    };
    if let Some(key) = map.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(Error::field(
            &format!("{path}.{}", clip(key)),
            format!("unknown field; accepted fields are {}", FIELDS.join(", ")),
        ));
    }
    let at = |name: &str| format!("{path}.{name}");

    let action = match map.get("action") {
        None => {
            return Err(Error::field(
                &at("action"),
                format!("required; {ACTIONS_ACCEPTED}"),
            ))
        }
        Some(v) => v.as_str().and_then(Action::from_name).ok_or_else(|| {
            Error::field(
                &at("action"),
                format!("{ACTIONS_ACCEPTED}; got {}", shown(v)),
            )
        })?,
    };
    let time = parse_time(&at("time"), map.get("time"), now)?;

    let repeat = match map.get("repeat") {
        None => Repeat::None,
        Some(v) => v.as_i64().and_then(Repeat::from_code).ok_or_else(|| {
            Error::field(
                &at("repeat"),
                format!("{REPEAT_ACCEPTED}; got {}", shown(v)),
            )
        })?,
    };

    let days = match (repeat, map.get("days")) {
        (Repeat::None, None) => Vec::new(),
        (Repeat::None, Some(_)) => {
            return Err(Error::field(
                &at("days"),
                "only with a repeat (0 weekly, 1 monthly, 2 yearly, 3 hourly); \
                 repeat is -1 (none), so leave days out",
            ))
        }
        (r, None) => {
            return Err(Error::field(
                &at("days"),
                format!(
                    "required with repeat {} ({}); {}",
                    r.code(),
                    r.name(),
                    r.days_accepted()
                ),
            ))
        }
        (r, Some(Value::String(s))) => parse_days(&at("days"), r, s)?,
        (r, Some(v)) => {
            return Err(Error::field(
                &at("days"),
                format!(
                    r#"a string of comma-separated numbers like "1,3,5"; {}; got {}"#,
                    r.days_accepted(),
                    shown(v)
                ),
            ))
        }
    };

    let end_type = match map.get("end_type") {
        None => -1,
        Some(v) => v
            .as_i64()
            .filter(|code| (-1..=2).contains(code))
            .ok_or_else(|| {
                Error::field(
                    &at("end_type"),
                    format!("{END_TYPE_ACCEPTED}; got {}", shown(v)),
                )
            })?,
    };
    // An ending only means something for an action that repeats; rejecting it
    // catches a template that meant to set a repeat and forgot.
    if end_type != -1 && repeat == Repeat::None {
        return Err(Error::field(
            &at("end_type"),
            format!(
                "only with a repeat (0 weekly, 1 monthly, 2 yearly, 3 hourly); repeat is -1 \
                 (none), so leave end_type out or set it to -1; got {end_type}"
            ),
        ));
    }
    let end = match (end_type, map.get("end_value")) {
        (-1, None) => End::None,
        (0, None) => End::Never,
        (-1 | 0, Some(_)) => {
            return Err(Error::field(
                &at("end_value"),
                format!(
                    "only with end_type 1 (number of occurrences) or 2 (end epoch); \
                     end_type is {end_type}, so leave end_value out"
                ),
            ))
        }
        (1, None) => {
            return Err(Error::field(
                &at("end_value"),
                "required with end_type 1: the total number of occurrences, 1 to 4294967295",
            ))
        }
        (_, None) => {
            return Err(Error::field(
                &at("end_value"),
                "required with end_type 2: the epoch seconds after which the action stops",
            ))
        }
        (1, Some(v)) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .filter(|&n| n >= 1)
            .map(End::After)
            .ok_or_else(|| {
                Error::field(
                    &at("end_value"),
                    format!(
                        "with end_type 1, the total number of occurrences, 1 to 4294967295; got {}",
                        shown(v)
                    ),
                )
            })?,
        (_, Some(v)) => End::Until(parse_end_epoch(&at("end_value"), v, now, time)?),
    };

    Ok(ScheduledAction {
        action,
        time,
        repeat,
        days,
        end,
    })
}

fn parse_time(path: &str, value: Option<&Value>, now: Timestamp) -> Result<Timestamp> {
    let Some(value) = value else {
        return Err(Error::field(path, format!("required; {TIME_ACCEPTED}")));
    };
    let wrong = || Error::field(path, format!("{TIME_ACCEPTED}; got {}", shown(value)));
    let seconds = match value {
        Value::Number(n) => n.as_i64().filter(|&s| s > 0).ok_or_else(wrong)?,
        Value::String(s) if !s.starts_with('+') => {
            let at: Timestamp = s.parse().map_err(|_| wrong())?;
            at.as_second()
        }
        Value::String(s) => {
            let digits = s.strip_prefix('+').ok_or_else(wrong)?;
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(wrong());
            }
            // Too many digits for i64 is simply "too late", like any overflow.
            digits
                .parse::<i64>()
                .ok()
                .and_then(|n| now.as_second().checked_add(n))
                .unwrap_or(i64::MAX)
        }
        _ => return Err(wrong()),
    };
    Timestamp::from_second(seconds).map_err(|_| {
        Error::field(
            path,
            format!(
                "{TIME_ACCEPTED}, at the latest epoch {}; got {}",
                Timestamp::MAX.as_second(),
                shown(value)
            ),
        )
    })
}

/// RFC 3339 times must carry the zone's own offset at that instant: a
/// calendar repeat fires at the time of day in the zone, so a time written
/// with another offset would fire at another hour than the one written.
pub fn check_offsets(json: &str, tz: &TimeZone) -> Result<()> {
    let Ok(Value::Array(list)) = serde_json::from_str::<Value>(json) else {
        return Ok(()); // parse_actions reports what is wrong with it
    };
    for (i, a) in list.iter().enumerate() {
        let Some(text) = a.get("time").and_then(Value::as_str) else {
            continue;
        };
        let (Ok(at), Some(theirs)) = (text.parse::<Timestamp>(), offset_seconds(text)) else {
            continue;
        };
        let ours = tz.to_offset(at).seconds();
        if theirs != ours {
            let name = tz.iana_name().unwrap_or("the configured zone");
            return Err(Error::field(
                &format!("actions[{i}].time"),
                format!(
                    "{text} has offset {}, but {name} is at {} then; repeats fire at the \
                     local time of day in {name}, so write the time with that offset",
                    hh_mm(theirs),
                    hh_mm(ours)
                ),
            ));
        }
    }
    Ok(())
}

/// The offset of an RFC 3339 date-time in seconds ("Z", "+01:00", "-05:30").
fn offset_seconds(text: &str) -> Option<i32> {
    if text.ends_with(['Z', 'z']) {
        return Some(0);
    }
    let tail = text.get(text.len().checked_sub(6)?..)?;
    let sign = match tail.as_bytes()[0] {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    let h: i32 = tail.get(1..3)?.parse().ok()?;
    let m: i32 = tail.get(4..6)?.parse().ok()?;
    Some(sign * (h * 3600 + m * 60))
}

/// An offset as "+01:00".
fn hh_mm(seconds: i32) -> String {
    let sign = if seconds < 0 { '-' } else { '+' };
    let s = seconds.abs();
    format!("{sign}{:02}:{:02}", s / 3600, s % 3600 / 60)
}

fn parse_end_epoch(
    path: &str,
    value: &Value,
    now: Timestamp,
    time: Timestamp,
) -> Result<Timestamp> {
    let end = value
        .as_i64()
        .filter(|&s| s > 0)
        .and_then(|s| Timestamp::from_second(s).ok())
        .ok_or_else(|| {
            Error::field(
                path,
                format!(
                    "with end_type 2, integer epoch seconds (> 0, at most {}); got {}",
                    Timestamp::MAX.as_second(),
                    shown(value)
                ),
            )
        })?;
    if end <= now {
        return Err(Error::field(
            path,
            format!(
                "with end_type 2, an epoch later than now ({}, {now}); got {} ({end}), \
                 which is in the past",
                now.as_second(),
                end.as_second()
            ),
        ));
    }
    // An end before the first occurrence would make the action never run.
    if end < time {
        return Err(Error::field(
            path,
            format!(
                "with end_type 2, an epoch not before time ({}, {time}); got {} ({end}), \
                 so the action would never run",
                time.as_second(),
                end.as_second()
            ),
        ));
    }
    Ok(end)
}

/// Parses `"1, 3,5"`: numbers separated by commas, whitespace around each
/// tolerated; the result is sorted without duplicates.
fn parse_days(path: &str, repeat: Repeat, text: &str) -> Result<Vec<u16>> {
    let accepted = repeat.days_accepted();
    let mut days = Vec::new();
    for token in text.split(',').map(str::trim) {
        if token.is_empty() || !token.bytes().all(|b| b.is_ascii_digit()) {
            return Err(Error::field(
                path,
                format!(
                    r#"comma-separated numbers like "1,3,5"; {accepted}; got {}"#,
                    shown(&Value::String(text.to_string()))
                ),
            ));
        }
        let day = token
            .parse::<u16>()
            .ok()
            .filter(|d| (repeat.min_day()..=repeat.max_day()).contains(d))
            .ok_or_else(|| Error::field(path, format!("{accepted}; got {}", clip(token))))?;
        days.push(day);
    }
    days.sort_unstable();
    days.dedup();
    if repeat == Repeat::Hourly && days.len() != 1 {
        return Err(Error::field(
            path,
            format!(
                "{accepted}; got {} numbers in {}",
                days.len(),
                shown(&Value::String(text.to_string()))
            ),
        ));
    }
    Ok(days)
}

/// The offending value as JSON, shortened so an error never echoes a whole
/// document back.
fn shown(value: &Value) -> String {
    clip(&value.to_string())
}

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
    fn walk_dates(&self, from: Date, mut visit: impl FnMut(Date) -> ControlFlow<()>) {
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
    fn slots_between(&self, first: Date, to: Date) -> u64 {
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

/// Writes the same JSON shape that `parse_actions` reads, with `time` (and an
/// end epoch) as integer epoch seconds.
impl Serialize for ScheduledAction {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("action", self.action.as_str())?;
        map.serialize_entry("time", &self.time.as_second())?;
        map.serialize_entry("repeat", &self.repeat.code())?;
        if self.repeat != Repeat::None {
            let days: Vec<String> = self.days.iter().map(u16::to_string).collect();
            map.serialize_entry("days", &days.join(","))?;
        }
        map.serialize_entry("end_type", &self.end.code())?;
        match self.end {
            End::After(count) => map.serialize_entry("end_value", &count)?,
            End::Until(end) => map.serialize_entry("end_value", &end.as_second())?,
            End::None | End::Never => {}
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::civil::date;

    #[test]
    fn rfc3339_times_and_the_zones_offset() {
        let one = |t: &str| format!(r#"[{{"action":"resume","time":"{t}"}}]"#);
        let a = parse_actions(&one("2027-01-04T09:00:00+01:00"), Timestamp::UNIX_EPOCH).unwrap();
        assert_eq!(a[0].time.as_second(), 1_799_049_600);
        let berlin = TimeZone::get("Europe/Berlin").unwrap();
        assert!(check_offsets(&one("2027-01-04T09:00:00+01:00"), &berlin).is_ok());
        assert!(check_offsets(&one("2027-07-05T09:00:00+02:00"), &berlin).is_ok());
        let e = check_offsets(&one("2027-01-04T09:00:00+02:00"), &berlin).unwrap_err();
        assert_eq!(
            e.message(),
            "actions[0].time: 2027-01-04T09:00:00+02:00 has offset +02:00, but Europe/Berlin is \
             at +01:00 then; repeats fire at the local time of day in Europe/Berlin, so write \
             the time with that offset"
        );
        assert!(check_offsets(&one("2027-01-04T08:00:00Z"), &berlin).is_err());
        assert!(check_offsets(&one("2027-01-04T08:00:00Z"), &TimeZone::UTC).is_ok());
        // Without an offset it is no instant at all.
        assert!(parse_actions(&one("2027-01-04T09:00:00"), Timestamp::UNIX_EPOCH).is_err());
    }

    const NOW: i64 = 1_767_225_600; // 2026-01-01T00:00:00Z

    fn now() -> Timestamp {
        Timestamp::from_second(NOW).unwrap()
    }

    fn berlin() -> TimeZone {
        TimeZone::get("Europe/Berlin").unwrap()
    }

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn one(json: &str) -> ScheduledAction {
        let mut all = parse_actions(json, now()).unwrap();
        assert_eq!(all.len(), 1);
        all.remove(0)
    }

    fn err(json: &str, message: &str) {
        assert_eq!(
            parse_actions(json, now()),
            Err(Error::InvalidRequest(message.to_string())),
            "for {json}"
        );
    }

    /// A local Berlin wall time as an instant (compatible disambiguation).
    fn local(dt: jiff::civil::DateTime) -> Timestamp {
        berlin().to_timestamp(dt).unwrap()
    }

    fn before(t: Timestamp) -> Timestamp {
        t.checked_sub(1.second()).unwrap()
    }

    #[test]
    fn parses_the_documented_example() {
        let json = r#"[{"action":"resume","time":1767250800,"repeat":0,"days":"1,3,5","end_type":0},
                       {"action":"poweroff","time":"+3600"}]"#;
        let all = parse_actions(json, now()).unwrap();
        assert_eq!(
            all,
            vec![
                ScheduledAction {
                    action: Action::Resume,
                    time: Timestamp::from_second(1_767_250_800).unwrap(),
                    repeat: Repeat::Weekly,
                    days: vec![1, 3, 5],
                    end: End::Never,
                },
                ScheduledAction {
                    action: Action::Poweroff,
                    time: Timestamp::from_second(NOW + 3600).unwrap(),
                    repeat: Repeat::None,
                    days: vec![],
                    end: End::None,
                },
            ]
        );
    }

    #[test]
    fn plus_n_resolves_against_now_once() {
        let a = one(r#"[{"action":"poweroff-hard","time":"+0"}]"#);
        assert_eq!(a.time, now());
        let a = one(r#"[{"action":"poweroff","time":"+86400"}]"#);
        assert_eq!(a.time.as_second(), NOW + 86_400);
        // Serializing keeps the resolved epoch, not "+N".
        assert_eq!(
            serde_json::to_string(&a).unwrap(),
            format!(
                r#"{{"action":"poweroff","time":{},"repeat":-1,"end_type":-1}}"#,
                NOW + 86_400
            )
        );
    }

    #[test]
    fn days_tolerate_whitespace_and_collapse_duplicates() {
        let a = one(r#"[{"action":"resume","time":1,"repeat":1,"days":" 31 ,1,  15,1"}]"#);
        assert_eq!(a.days, vec![1, 15, 31]);
        assert_eq!(a.end, End::None);
        let a = one(r#"[{"action":"resume","time":1,"repeat":3,"days":"5,5"}]"#);
        assert_eq!(a.days, vec![5]);
    }

    #[test]
    fn document_level_errors() {
        err("", "actions: not valid JSON (EOF while parsing a value at line 1 column 0); expected a list like [{\"action\":\"poweroff\",\"time\":\"+3600\"}], or OpenNebula's SCHED_ACTION=[ACTION=\"poweroff\", TIME=\"+3600\"] text");
        err(
            r#"{"action":"resume"}"#,
            r#"actions: a JSON list of actions like [{"action":"poweroff","time":"+3600"}]; got {"action":"resume"}"#,
        );
        let big = format!("[{}]", " ".repeat(MAX_JSON_BYTES));
        err(
            &big,
            "actions: at most 65536 bytes of JSON; got 65538 bytes",
        );
        let many = format!(
            "[{}]",
            vec![r#"{"action":"resume","time":1}"#; 257].join(",")
        );
        err(&many, "actions: at most 256 actions; got 257");
        let most = format!(
            "[{}]",
            vec![r#"{"action":"resume","time":1}"#; 256].join(",")
        );
        assert_eq!(parse_actions(&most, now()).unwrap().len(), 256);
        assert_eq!(parse_actions("[]", now()).unwrap(), vec![]);
    }

    #[test]
    fn object_and_field_errors() {
        err(
            r#"[{"action":"resume","time":1}, 7]"#,
            r#"actions[1]: an object like {"action":"poweroff","time":"+3600"}; got 7"#,
        );
        err(
            r#"[{"action":"resume","time":1,"Time":2}]"#,
            "actions[0].Time: unknown field; accepted fields are action, time, repeat, days, end_type, end_value",
        );
        err(
            r#"[{"time":1}]"#,
            r#"actions[0].action: required; one of "resume", "poweroff", "poweroff-hard""#,
        );
        err(
            r#"[{"action":"reboot","time":1}]"#,
            r#"actions[0].action: one of "resume", "poweroff", "poweroff-hard"; got "reboot""#,
        );
        err(
            r#"[{"action":"resume"}]"#,
            r#"actions[0].time: required; integer epoch seconds (> 0), "+N" (N whole seconds from now) or an RFC 3339 date-time with the zone's offset ("2027-01-04T09:00:00+01:00")"#,
        );
        for bad in [
            "0", "-5", "1.5", "\"3600\"", "\"+\"", "\"+-1\"", "\"+1h\"", "null",
        ] {
            err(
                &format!(r#"[{{"action":"resume","time":{bad}}}]"#),
                &format!(
                    r#"actions[0].time: integer epoch seconds (> 0), "+N" (N whole seconds from now) or an RFC 3339 date-time with the zone's offset ("2027-01-04T09:00:00+01:00"); got {bad}"#
                ),
            );
        }
        err(
            r#"[{"action":"resume","time":"+99999999999999999999"}]"#,
            r#"actions[0].time: integer epoch seconds (> 0), "+N" (N whole seconds from now) or an RFC 3339 date-time with the zone's offset ("2027-01-04T09:00:00+01:00"), at the latest epoch 253402207200; got "+99999999999999999999""#,
        );
        err(
            r#"[{"action":"resume","time":253402207201}]"#,
            r#"actions[0].time: integer epoch seconds (> 0), "+N" (N whole seconds from now) or an RFC 3339 date-time with the zone's offset ("2027-01-04T09:00:00+01:00"), at the latest epoch 253402207200; got 253402207201"#,
        );
        err(
            r#"[{"action":"resume","time":1,"repeat":4}]"#,
            "actions[0].repeat: one of -1 (none), 0 (weekly), 1 (monthly), 2 (yearly), 3 (hourly); got 4",
        );
        err(
            r#"[{"action":"resume","time":1,"repeat":"0"}]"#,
            r#"actions[0].repeat: one of -1 (none), 0 (weekly), 1 (monthly), 2 (yearly), 3 (hourly); got "0""#,
        );
    }

    #[test]
    fn days_errors() {
        let with = |repeat: i64, days: &str| {
            format!(
                r#"[{{"action":"resume","time":1}},{{"action":"resume","time":1,"repeat":{repeat},"days":{days}}}]"#
            )
        };
        err(
            &with(0, r#""1,7""#),
            "actions[1].days: weekly days are 0 (Sunday) to 6 (Saturday); got 7",
        );
        err(
            &with(1, r#""0""#),
            "actions[1].days: monthly days are 1 to 31; got 0",
        );
        err(
            &with(1, r#""32""#),
            "actions[1].days: monthly days are 1 to 31; got 32",
        );
        err(
            &with(2, r#""366""#),
            "actions[1].days: yearly days are 0 to 365 (day of the year counted from 0; 365 only in leap years); got 366",
        );
        err(
            &with(3, r#""0""#),
            "actions[1].days: hourly takes exactly one number, the interval in hours, 1 to 168; got 0",
        );
        err(
            &with(3, r#""169""#),
            "actions[1].days: hourly takes exactly one number, the interval in hours, 1 to 168; got 169",
        );
        err(
            &with(3, r#""2,4""#),
            r#"actions[1].days: hourly takes exactly one number, the interval in hours, 1 to 168; got 2 numbers in "2,4""#,
        );
        err(
            &with(0, r#""1,,3""#),
            r#"actions[1].days: comma-separated numbers like "1,3,5"; weekly days are 0 (Sunday) to 6 (Saturday); got "1,,3""#,
        );
        err(
            &with(0, r#""""#),
            r#"actions[1].days: comma-separated numbers like "1,3,5"; weekly days are 0 (Sunday) to 6 (Saturday); got """#,
        );
        err(
            &with(0, r#""-1""#),
            r#"actions[1].days: comma-separated numbers like "1,3,5"; weekly days are 0 (Sunday) to 6 (Saturday); got "-1""#,
        );
        err(
            &with(1, r#""99999999""#),
            "actions[1].days: monthly days are 1 to 31; got 99999999",
        );
        err(
            &with(0, "[1,3]"),
            r#"actions[1].days: a string of comma-separated numbers like "1,3,5"; weekly days are 0 (Sunday) to 6 (Saturday); got [1,3]"#,
        );
        err(
            r#"[{"action":"resume","time":1,"repeat":1}]"#,
            "actions[0].days: required with repeat 1 (monthly); monthly days are 1 to 31",
        );
        err(
            r#"[{"action":"resume","time":1,"days":"1"}]"#,
            "actions[0].days: only with a repeat (0 weekly, 1 monthly, 2 yearly, 3 hourly); repeat is -1 (none), so leave days out",
        );
    }

    #[test]
    fn end_errors() {
        let weekly = r#""action":"resume","time":1767250800,"repeat":0,"days":"1""#;
        err(
            &format!(r#"[{{{weekly},"end_type":3}}]"#),
            "actions[0].end_type: one of -1 (none), 0 (never), 1 (after end_value occurrences), 2 (until the end_value epoch); got 3",
        );
        err(
            r#"[{"action":"resume","time":1,"end_type":0}]"#,
            "actions[0].end_type: only with a repeat (0 weekly, 1 monthly, 2 yearly, 3 hourly); repeat is -1 (none), so leave end_type out or set it to -1; got 0",
        );
        err(
            &format!(r#"[{{{weekly},"end_type":0,"end_value":3}}]"#),
            "actions[0].end_value: only with end_type 1 (number of occurrences) or 2 (end epoch); end_type is 0, so leave end_value out",
        );
        err(
            &format!(r#"[{{{weekly},"end_value":3}}]"#),
            "actions[0].end_value: only with end_type 1 (number of occurrences) or 2 (end epoch); end_type is -1, so leave end_value out",
        );
        err(
            &format!(r#"[{{{weekly},"end_type":1}}]"#),
            "actions[0].end_value: required with end_type 1: the total number of occurrences, 1 to 4294967295",
        );
        err(
            &format!(r#"[{{{weekly},"end_type":2}}]"#),
            "actions[0].end_value: required with end_type 2: the epoch seconds after which the action stops",
        );
        for bad in ["0", "-1", "4294967296", "2.5", "\"3\""] {
            err(
                &format!(r#"[{{{weekly},"end_type":1,"end_value":{bad}}}]"#),
                &format!("actions[0].end_value: with end_type 1, the total number of occurrences, 1 to 4294967295; got {bad}"),
            );
        }
        err(
            &format!(r#"[{{{weekly},"end_type":2,"end_value":"+5"}}]"#),
            r#"actions[0].end_value: with end_type 2, integer epoch seconds (> 0, at most 253402207200); got "+5""#,
        );
        err(
            &format!(r#"[{{{weekly},"end_type":2,"end_value":1700000000}}]"#),
            "actions[0].end_value: with end_type 2, an epoch later than now (1767225600, 2026-01-01T00:00:00Z); got 1700000000 (2023-11-14T22:13:20Z), which is in the past",
        );
        err(
            &format!(r#"[{{{weekly},"end_type":2,"end_value":1767225600}}]"#),
            "actions[0].end_value: with end_type 2, an epoch later than now (1767225600, 2026-01-01T00:00:00Z); got 1767225600 (2026-01-01T00:00:00Z), which is in the past",
        );
        err(
            &format!(r#"[{{{weekly},"end_type":2,"end_value":1767240000}}]"#),
            "actions[0].end_value: with end_type 2, an epoch not before time (1767250800, 2026-01-01T07:00:00Z); got 1767240000 (2026-01-01T04:00:00Z), so the action would never run",
        );
    }

    #[test]
    fn long_values_are_clipped_in_errors() {
        let long = "x".repeat(100);
        err(
            &format!(r#"[{{"action":"{long}","time":1}}]"#),
            &format!(
                r#"actions[0].action: one of "resume", "poweroff", "poweroff-hard"; got "{}…"#,
                "x".repeat(39)
            ),
        );
    }

    #[test]
    fn once_fires_once() {
        let a = one(r#"[{"action":"poweroff","time":"+60"}]"#);
        let tz = TimeZone::UTC;
        assert_eq!(a.occurrences_after(now(), &tz, 10), vec![a.time]);
        assert_eq!(a.occurrences_after(a.time, &tz, 10), vec![]);
        assert_eq!(a.occurrences_after(now(), &tz, 0), vec![]);
    }

    #[test]
    fn weekly_keeps_local_time_across_dst() {
        // Monday 2026-03-23 09:00 CET; DST starts Sunday 2026-03-29.
        let time = local(date(2026, 3, 23).at(9, 0, 0, 0));
        let a = ScheduledAction {
            action: Action::Resume,
            time,
            repeat: Repeat::Weekly,
            days: vec![1],
            end: End::Never,
        };
        let got = a.occurrences_after(before(time), &berlin(), 3);
        let zoned: Vec<_> = got.iter().map(|t| t.to_zoned(berlin())).collect();
        for z in &zoned {
            assert_eq!(z.time(), jiff::civil::time(9, 0, 0, 0));
        }
        assert_eq!(zoned[0].date(), date(2026, 3, 23));
        assert_eq!(zoned[1].date(), date(2026, 3, 30));
        assert_eq!(zoned[0].offset().seconds(), 3600);
        assert_eq!(zoned[1].offset().seconds(), 7200);
        assert_eq!(got[1], ts("2026-03-30T07:00:00Z"));
    }

    #[test]
    fn spring_forward_gap_moves_later() {
        // Sundays at 02:30; on 2026-03-29 02:30 does not exist in Berlin.
        let time = local(date(2026, 3, 22).at(2, 30, 0, 0));
        let a = ScheduledAction {
            action: Action::Poweroff,
            time,
            repeat: Repeat::Weekly,
            days: vec![0],
            end: End::Never,
        };
        let got = a.occurrences_after(time, &berlin(), 2);
        assert_eq!(got[0], ts("2026-03-29T01:30:00Z"));
        assert_eq!(
            got[0].to_zoned(berlin()).time(),
            jiff::civil::time(3, 30, 0, 0)
        );
        assert!(in_gap(
            date(2026, 3, 29),
            jiff::civil::time(2, 30, 0, 0),
            &berlin()
        ));
        // The week after, 02:30 exists again.
        assert_eq!(
            got[1].to_zoned(berlin()).time(),
            jiff::civil::time(2, 30, 0, 0)
        );
    }

    #[test]
    fn fall_back_fold_fires_once_at_first_instance() {
        // Sundays at 02:30; on 2026-10-25 02:30 happens twice in Berlin.
        let time = local(date(2026, 10, 18).at(2, 30, 0, 0));
        let a = ScheduledAction {
            action: Action::Poweroff,
            time,
            repeat: Repeat::Weekly,
            days: vec![0],
            end: End::Never,
        };
        let got = a.occurrences_after(time, &berlin(), 2);
        assert_eq!(
            got,
            vec![ts("2026-10-25T00:30:00Z"), ts("2026-11-01T01:30:00Z")]
        );
        // Asking from between the two instances finds nothing that day.
        let got = a.occurrences_after(ts("2026-10-25T00:30:00Z"), &berlin(), 1);
        assert_eq!(got, vec![ts("2026-11-01T01:30:00Z")]);

        // TIME itself the second 02:30: that day's slot (the first 02:30) is
        // before TIME, so it does not fire and does not count.
        let a = ScheduledAction {
            time: ts("2026-10-25T01:30:00Z"),
            end: End::After(1),
            ..a
        };
        let got = a.occurrences_after(before(a.time), &berlin(), 5);
        assert_eq!(got, vec![ts("2026-11-01T01:30:00Z")]);
        assert_eq!(
            a.occurrences_after(ts("2026-12-01T00:00:00Z"), &berlin(), 5),
            vec![]
        );
        // Starting the search later must not count that skipped slot either.
        let a = ScheduledAction {
            end: End::After(3),
            ..a
        };
        let all = a.occurrences_after(before(a.time), &berlin(), 5);
        assert_eq!(all.len(), 3);
        assert_eq!(all[2], ts("2026-11-15T01:30:00Z"));
        assert_eq!(a.occurrences_after(all[1], &berlin(), 5), vec![all[2]]);
    }

    #[test]
    fn time_fires_only_if_its_day_is_listed() {
        // Thursday 2026-01-01; weekly on Mondays only.
        let a = one(r#"[{"action":"resume","time":1767250800,"repeat":0,"days":"1"}]"#);
        let got = a.occurrences_after(before(a.time), &TimeZone::UTC, 1);
        assert_eq!(got, vec![ts("2026-01-05T07:00:00Z")]);
        // Listed: TIME itself is the first occurrence.
        let a = one(r#"[{"action":"resume","time":1767250800,"repeat":0,"days":"4"}]"#);
        assert_eq!(
            a.occurrences_after(before(a.time), &TimeZone::UTC, 1),
            vec![a.time]
        );
    }

    #[test]
    fn monthly_31_skips_short_months() {
        let time = ts("2027-01-31T10:00:00Z");
        let a = ScheduledAction {
            action: Action::Resume,
            time,
            repeat: Repeat::Monthly,
            days: vec![31],
            end: End::Never,
        };
        let months: Vec<i8> = a
            .occurrences_after(before(time), &TimeZone::UTC, 8)
            .iter()
            .map(|t| t.to_zoned(TimeZone::UTC).month())
            .collect();
        assert_eq!(months, vec![1, 3, 5, 7, 8, 10, 12, 1]);
        assert_eq!(
            a.missing_days(time, ts("2027-12-31T23:00:00Z"), &TimeZone::UTC, 100),
            vec![
                "day 31 does not occur in February 2027",
                "day 31 does not occur in April 2027",
                "day 31 does not occur in June 2027",
                "day 31 does not occur in September 2027",
                "day 31 does not occur in November 2027",
            ]
        );
        let b = ScheduledAction {
            days: vec![1, 29, 30, 31],
            ..a
        };
        assert_eq!(
            b.missing_days(
                ts("2027-02-10T00:00:00Z"),
                ts("2027-05-01T00:00:00Z"),
                &TimeZone::UTC,
                100
            ),
            vec![
                "days 29, 30, 31 do not occur in February 2027",
                "day 31 does not occur in April 2027"
            ]
        );
        // April 31 would fall after the range's end: not reported.
        assert!(b
            .missing_days(
                ts("2027-04-01T00:00:00Z"),
                ts("2027-04-20T00:00:00Z"),
                &TimeZone::UTC,
                100
            )
            .is_empty());
        assert_eq!(
            b.missing_days(time, ts("2030-01-01T00:00:00Z"), &TimeZone::UTC, 2)
                .len(),
            2
        );
    }

    #[test]
    fn yearly_365_only_in_leap_years() {
        let time = ts("2025-01-01T12:00:00Z");
        let a = ScheduledAction {
            action: Action::Resume,
            time,
            repeat: Repeat::Yearly,
            days: vec![365],
            end: End::Never,
        };
        assert_eq!(
            a.occurrences_after(time, &TimeZone::UTC, 2),
            vec![ts("2028-12-31T12:00:00Z"), ts("2032-12-31T12:00:00Z")]
        );
        assert_eq!(
            a.missing_days(time, ts("2029-06-01T00:00:00Z"), &TimeZone::UTC, 10),
            vec![
                "day 365 does not occur in 2025 (not a leap year)",
                "day 365 does not occur in 2026 (not a leap year)",
                "day 365 does not occur in 2027 (not a leap year)",
            ]
        );
        // Day 0 and 59 (Feb 29 in leap years, Mar 1 otherwise).
        let b = ScheduledAction {
            days: vec![0, 59],
            ..a.clone()
        };
        assert_eq!(
            b.occurrences_after(time, &TimeZone::UTC, 3),
            vec![
                ts("2025-03-01T12:00:00Z"),
                ts("2026-01-01T12:00:00Z"),
                ts("2026-03-01T12:00:00Z")
            ]
        );
        // A count longer than one 400-year cycle of leap years (97 of them
        // from 2001) is still followed to its end.
        let long = ScheduledAction {
            action: Action::Resume,
            time: ts("2001-09-09T01:46:40Z"),
            repeat: Repeat::Yearly,
            days: vec![365],
            end: End::After(98),
        };
        let all = long.occurrences_after(before(long.time), &TimeZone::UTC, 200);
        assert_eq!(all.len(), 98);
        assert_eq!(all[97], ts("2404-12-31T01:46:40Z"));
        // Near the end of the calendar the search stops instead of failing.
        assert_eq!(
            a.occurrences_after(ts("9999-01-01T00:00:00Z"), &TimeZone::UTC, 5),
            vec![]
        );
    }

    #[test]
    fn hourly_with_count_gives_exactly_that_many() {
        let a = one(
            r#"[{"action":"poweroff","time":"+0","repeat":3,"days":"5","end_type":1,"end_value":3}]"#,
        );
        let all = a.occurrences_after(before(a.time), &berlin(), 100);
        let hours: Vec<i64> = all.iter().map(|t| (t.as_second() - NOW) / 3600).collect();
        assert_eq!(hours, vec![0, 5, 10]);
        assert_eq!(a.occurrences_after(a.time, &berlin(), 100).len(), 2);
        assert_eq!(a.occurrences_after(all[2], &berlin(), 100), vec![]);
    }

    #[test]
    fn hourly_far_future_is_arithmetic() {
        let a = one(r#"[{"action":"poweroff","time":"+0","repeat":3,"days":"1"}]"#);
        let after = ts("9000-01-01T00:30:00Z");
        let got = a.occurrences_after(after, &TimeZone::UTC, 2);
        assert_eq!(
            got,
            vec![ts("9000-01-01T01:00:00Z"), ts("9000-01-01T02:00:00Z")]
        );
        // Past the representable range it just stops.
        assert_eq!(
            a.occurrences_after(Timestamp::MAX, &TimeZone::UTC, 2),
            vec![]
        );
    }

    #[test]
    fn end_until_is_inclusive() {
        // Daily via weekly all days, 07:00 UTC from 2026-01-01; end exactly at
        // the third occurrence.
        let end = 1_767_250_800 + 2 * 86_400;
        let a = one(&format!(
            r#"[{{"action":"resume","time":1767250800,"repeat":0,"days":"0,1,2,3,4,5,6","end_type":2,"end_value":{end}}}]"#
        ));
        let got = a.occurrences_after(before(a.time), &TimeZone::UTC, 10);
        assert_eq!(got.len(), 3);
        assert_eq!(got[2].as_second(), end);
        let a = ScheduledAction {
            end: End::Until(Timestamp::from_second(end - 1).unwrap()),
            ..a
        };
        assert_eq!(
            a.occurrences_after(before(a.time), &TimeZone::UTC, 10)
                .len(),
            2
        );
    }

    #[test]
    fn count_end_counts_from_the_first_occurrence() {
        // Mon/Wed/Fri from Thursday 2026-01-01 07:00 UTC, 10 occurrences in total.
        let a = one(
            r#"[{"action":"resume","time":1767250800,"repeat":0,"days":"1,3,5","end_type":1,"end_value":10}]"#,
        );
        let all = a.occurrences_after(before(a.time), &TimeZone::UTC, 100);
        assert_eq!(all.len(), 10);
        assert_eq!(all[0], ts("2026-01-02T07:00:00Z"));
        // Asking from later sees only what is left of the same ten.
        assert_eq!(
            a.occurrences_after(all[6], &TimeZone::UTC, 100),
            all[7..].to_vec()
        );
        assert_eq!(
            a.occurrences_after(ts("2027-01-01T00:00:00Z"), &TimeZone::UTC, 100),
            vec![]
        );
    }

    #[test]
    fn huge_count_far_ahead_is_fast() {
        let a = ScheduledAction {
            action: Action::Resume,
            time: ts("2026-01-01T07:00:00Z"),
            repeat: Repeat::Monthly,
            days: vec![1, 31],
            end: End::After(u32::MAX),
        };
        let got = a.occurrences_after(ts("9000-01-15T00:00:00Z"), &berlin(), 3);
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].to_zoned(berlin()).date(), date(9000, 1, 31));
    }

    #[test]
    fn slot_arithmetic_matches_walking() {
        let tz = TimeZone::UTC;
        let cases = [
            (Repeat::Weekly, vec![0, 2, 6]),
            (Repeat::Monthly, vec![1, 29, 30, 31]),
            (Repeat::Yearly, vec![0, 59, 364, 365]),
        ];
        for (repeat, days) in cases {
            let a = ScheduledAction {
                action: Action::Resume,
                time: ts("1999-12-30T00:00:00Z"),
                repeat,
                days,
                end: End::Never,
            };
            let first = tz.to_datetime(a.time).date();
            for to in [
                date(1999, 12, 30),
                date(2000, 2, 29),
                date(2000, 3, 1),
                date(2101, 1, 1),
                // Almost 400 years of walking.
                date(2398, 7, 9),
            ] {
                let mut walked = 0;
                a.walk_dates(first, |d| {
                    if d >= to {
                        return ControlFlow::Break(());
                    }
                    walked += 1;
                    ControlFlow::Continue(())
                });
                assert_eq!(a.slots_between(first, to), walked, "{repeat:?} to {to}");
            }
        }
    }

    #[test]
    fn skipped_whole_day_fires_once() {
        // Samoa skipped 2011-12-30: Friday's 09:00 lands on Saturday's 09:00.
        let tz = TimeZone::get("Pacific/Apia").unwrap();
        let time = tz.to_timestamp(date(2011, 12, 26).at(9, 0, 0, 0)).unwrap();
        let a = ScheduledAction {
            action: Action::Resume,
            time,
            repeat: Repeat::Weekly,
            days: vec![5, 6],
            end: End::Never,
        };
        let got = a.occurrences_after(time, &tz, 3);
        let dates: Vec<Date> = got.iter().map(|t| t.to_zoned(tz.clone()).date()).collect();
        assert_eq!(
            dates,
            vec![date(2011, 12, 31), date(2012, 1, 6), date(2012, 1, 7)]
        );
    }

    #[test]
    fn serializes_the_json_shape() {
        let json = r#"[{"action":"resume","time":1767250800,"repeat":0,"days":"1,3,5","end_type":1,"end_value":4},{"action":"poweroff-hard","time":1767250800,"repeat":3,"days":"2","end_type":2,"end_value":1800000000},{"action":"poweroff","time":1767250800,"repeat":-1,"end_type":-1}]"#;
        let all = parse_actions(json, now()).unwrap();
        assert_eq!(serde_json::to_string(&all).unwrap(), json);
    }
}
