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

mod parse;
mod recurrence;

pub use parse::{check_offsets, parse_actions};
pub use recurrence::in_gap;

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
mod tests;
