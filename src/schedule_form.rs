//! PURE: schedules in the words an operator thinks in — "Mon/Wed/Fri 09:00
//! to 17:00 from 2027-01-04 until 2027-06-30" — turned into the OpenNebula
//! style actions SetSchedule takes (a resume and a power-off that repeat
//! alike), and stored actions described back in words. No I/O, no clock:
//! the first day and the zone are arguments.
//!
//! The mapping (docs/time-slicing.md has the table): `--weekly mon,wed,fri`
//! is REPEAT 0 with DAYS "1,3,5" (0 = Sunday), `--monthly 1,15` REPEAT 1
//! with DAYS "1,15", `--hourly N` REPEAT 3 with DAYS "N"; `--until DATE` is
//! END_TYPE 2 with the last second of that local day, `--times N` END_TYPE 1
//! (N firings of each action in all), neither END_TYPE 0. A slice whose
//! `--to` is not after `--from` ends the next day (overnight).

use crate::error::{Error, Result};
use crate::schedule::{End, Repeat, ScheduledAction};
use jiff::civil::{Date, Time, Weekday};
use jiff::tz::TimeZone;
use jiff::Timestamp;
use serde_json::{json, Value};

/// How the slices repeat.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Every {
    Weekly(Vec<Weekday>),
    /// Days of the month, 1 to 31.
    Monthly(Vec<u8>),
    /// Every N hours (1 to 168), from the first slice on.
    Hourly(u16),
    /// Days of the year, counted from 0 (0 = 1 January) as OpenNebula's
    /// scheduler counts them, 0 to 365.
    Yearly(Vec<u16>),
}

/// When the repeats stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Until {
    Never,
    /// The last local day with a slice.
    Date(Date),
    /// This many slices in all.
    Times(u32),
}

/// A readable schedule: each slice from `from` to `to` (local times).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Form {
    pub every: Every,
    pub from: Time,
    pub to: Time,
    /// The first local day a slice may start.
    pub starting: Date,
    pub until: Until,
}

const WEEKDAYS: [(&str, Weekday); 7] = [
    ("monday", Weekday::Monday),
    ("tuesday", Weekday::Tuesday),
    ("wednesday", Weekday::Wednesday),
    ("thursday", Weekday::Thursday),
    ("friday", Weekday::Friday),
    ("saturday", Weekday::Saturday),
    ("sunday", Weekday::Sunday),
];

/// `mon,wed,fri` or `mon-fri` (names of three letters or more, any case).
pub fn parse_weekdays(text: &str) -> Result<Vec<Weekday>> {
    let accepted = "weekdays as mon,wed,fri or a range mon-fri";
    let day = |t: &str| {
        let t = t.trim().to_ascii_lowercase();
        WEEKDAYS
            .iter()
            .position(|(full, _)| t.len() >= 3 && full.starts_with(&t))
            .ok_or_else(|| Error::field("--weekly", format!("{accepted}; got {t:?}")))
    };
    let mut days = Vec::new();
    for part in text.split(',').filter(|p| !p.trim().is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (day(a)?, day(b)?);
                let mut i = a;
                loop {
                    days.push(WEEKDAYS[i].1);
                    if i == b {
                        break;
                    }
                    i = (i + 1) % 7;
                }
            }
            None => days.push(WEEKDAYS[day(part)?].1),
        }
    }
    if days.is_empty() {
        return Err(Error::field("--weekly", format!("{accepted}; got nothing")));
    }
    days.sort_by_key(|d| d.to_monday_zero_offset());
    days.dedup();
    Ok(days)
}

/// `1,15` (days of the month, 1 to 31).
pub fn parse_month_days(text: &str) -> Result<Vec<u8>> {
    let mut days = Vec::new();
    for part in text.split(',').filter(|p| !p.trim().is_empty()) {
        let d: u8 = part
            .trim()
            .parse()
            .ok()
            .filter(|d| (1..=31).contains(d))
            .ok_or_else(|| {
                Error::field(
                    "--monthly",
                    format!("days of the month 1 to 31, as 1,15; got {part:?}"),
                )
            })?;
        days.push(d);
    }
    if days.is_empty() {
        return Err(Error::field(
            "--monthly",
            "days of the month 1 to 31, as 1,15; got nothing",
        ));
    }
    days.sort_unstable();
    days.dedup();
    Ok(days)
}

/// `0,181` (days of the year counted from 0: 0 = 1 January, 365 = 31
/// December of a leap year), as a yearly repeat's DAYS.
pub fn parse_year_days(text: &str) -> Result<Vec<u16>> {
    let accepted = "days of the year counted from 0 (0 = 1 January), 0 to 365, as 0,181";
    let mut days = Vec::new();
    for part in text.split(',').filter(|p| !p.trim().is_empty()) {
        let d: u16 = part
            .trim()
            .parse()
            .ok()
            .filter(|d| *d <= 365)
            .ok_or_else(|| Error::field("--yearly", format!("{accepted}; got {part:?}")))?;
        days.push(d);
    }
    if days.is_empty() {
        return Err(Error::field("--yearly", format!("{accepted}; got nothing")));
    }
    days.sort_unstable();
    days.dedup();
    Ok(days)
}

/// `09:00` or `9:30` (24-hour local time).
pub fn parse_clock(flag: &str, text: &str) -> Result<Time> {
    let wrong = || {
        Error::field(
            flag,
            format!("a local time HH:MM (24-hour), as 09:00; got {text:?}"),
        )
    };
    let (h, m) = text.trim().split_once(':').ok_or_else(wrong)?;
    let (h, m): (i8, i8) = (
        h.parse().map_err(|_| wrong())?,
        m.parse().map_err(|_| wrong())?,
    );
    Time::new(h, m, 0, 0).map_err(|_| wrong())
}

impl Form {
    /// The actions, as SetSchedule's JSON list: a resume at `from` and a
    /// power-off at `to`, repeating alike. Times are RFC 3339 with the
    /// zone's offset on the first day, which is how the daemon reads them.
    pub fn actions(&self, tz: &TimeZone) -> Result<Value> {
        let overnight = self.to <= self.from;
        let at = |date: Date, time: Time, flag: &str| -> Result<String> {
            let z = date
                .to_datetime(time)
                .to_zoned(tz.clone())
                .map_err(|e| Error::field(flag, e.to_string()))?;
            Ok(z.timestamp().display_with_offset(z.offset()).to_string())
        };
        let off_day = if overnight {
            self.starting
                .tomorrow()
                .map_err(|e| Error::field("--starting", e.to_string()))?
        } else {
            self.starting
        };
        let (repeat, on_days, off_days) = match &self.every {
            Every::Weekly(days) => {
                let list = |shift: i8| {
                    let mut n: Vec<i8> = days
                        .iter()
                        .map(|d| (d.to_sunday_zero_offset() + shift) % 7)
                        .collect();
                    n.sort_unstable();
                    n.iter()
                        .map(|d| d.to_string())
                        .collect::<Vec<_>>()
                        .join(",")
                };
                (Repeat::Weekly, list(0), list(i8::from(overnight)))
            }
            Every::Monthly(days) => {
                let days = days.iter().map(u8::to_string);
                same_day(
                    Repeat::Monthly,
                    days,
                    overnight,
                    "monthly",
                    "day 31",
                    "month",
                )?
            }
            Every::Yearly(days) => {
                let days = days.iter().map(u16::to_string);
                same_day(Repeat::Yearly, days, overnight, "yearly", "day 365", "year")?
            }
            Every::Hourly(n) => {
                if !(1..=crate::schedule::MAX_HOURLY_INTERVAL).contains(n) {
                    return Err(Error::field(
                        "--hourly",
                        format!(
                            "an interval of 1 to {} hours; got {n}",
                            crate::schedule::MAX_HOURLY_INTERVAL
                        ),
                    ));
                }
                let minutes = |t: Time| i32::from(t.hour()) * 60 + i32::from(t.minute());
                let length =
                    minutes(self.to) - minutes(self.from) + if overnight { 1440 } else { 0 };
                if length >= i32::from(*n) * 60 {
                    return Err(Error::field(
                        "--to",
                        format!("a slice must be shorter than the interval ({n} hours); {} to {} is not", self.from, self.to),
                    ));
                }
                (Repeat::Hourly, n.to_string(), n.to_string())
            }
        };
        let (end_type, end_value) = match self.until {
            Until::Never => (0, None),
            Until::Times(0) => {
                return Err(Error::field("--times", "at least 1 slice"));
            }
            Until::Times(n) => (1, Some(json!(n))),
            Until::Date(d) => {
                if d < self.starting {
                    return Err(Error::field(
                        "--until",
                        format!("a day on or after the first ({}); got {d}", self.starting),
                    ));
                }
                // The last second of that local day: its slices still start.
                let next = d
                    .tomorrow()
                    .map_err(|e| Error::field("--until", e.to_string()))?;
                let end = next
                    .to_zoned(tz.clone())
                    .map_err(|e| Error::field("--until", e.to_string()))?
                    .timestamp()
                    .as_second()
                    - 1;
                (2, Some(json!(end)))
            }
        };
        let action = |name: &str, time: String, days: String, end_value: Option<Value>| {
            let mut a = json!({
                "action": name, "time": time, "repeat": repeat.code(),
                "days": days, "end_type": end_type,
            });
            if let Some(v) = end_value {
                a["end_value"] = v;
            }
            a
        };
        // The power-off of an overnight slice ends on the day after: its
        // end by date is a day later too.
        let off_end = match (self.until, overnight) {
            (Until::Date(_), true) => end_value
                .clone()
                .map(|v| json!(v.as_i64().unwrap_or(0) + 86_400)),
            _ => end_value.clone(),
        };
        Ok(json!([
            action(
                "resume",
                at(self.starting, self.from, "--from")?,
                on_days,
                end_value
            ),
            action("poweroff", at(off_day, self.to, "--to")?, off_days, off_end),
        ]))
    }
}

/// A monthly or yearly repeat: its days alike for both actions, and a
/// slice that ends the day it starts (the last day of a month or year
/// has no day after it in every one).
fn same_day(
    repeat: Repeat,
    days: impl Iterator<Item = String>,
    overnight: bool,
    what: &str,
    last: &str,
    period: &str,
) -> Result<(Repeat, String, String)> {
    if overnight {
        return Err(Error::field(
            "--to",
            format!(
                "a {what} slice must end the same day (--to after --from): {last} \
                 has no day after it in every {period}; use a weekly or hourly schedule"
            ),
        ));
    }
    let list = days.collect::<Vec<_>>().join(",");
    Ok((repeat, list.clone(), list))
}

/// One stored action in words, in `tz`: "resume every Mon, Wed, Fri at
/// 09:00 from 2027-01-04, until Wed 2027-06-30 23:59:59".
pub fn describe(a: &ScheduledAction, tz: &TimeZone) -> String {
    let first = a.time.to_zoned(tz.clone());
    // Seconds only when not zero: a 20-second slice reads as two times.
    let clock = match first.second() {
        0 => first.strftime("%H:%M").to_string(),
        _ => first.strftime("%H:%M:%S").to_string(),
    };
    let day = first.strftime("%a %Y-%m-%d").to_string();
    let list = |names: Vec<String>| names.join(", ");
    let when = match a.repeat {
        Repeat::None => format!("once, at {day} {clock}"),
        Repeat::Weekly => {
            let names = a
                .days
                .iter()
                .map(|&d| {
                    let wd = Weekday::from_sunday_zero_offset(d as i8).unwrap_or(Weekday::Sunday);
                    let full = WEEKDAYS
                        .iter()
                        .find(|(_, w)| *w == wd)
                        .map_or("?", |(n, _)| n);
                    full[..1].to_ascii_uppercase() + &full[1..3]
                })
                .collect();
            format!("every {} at {clock}, from {day}", list(names))
        }
        Repeat::Monthly => format!(
            "on day{} {} of each month at {clock}, from {day}",
            if a.days.len() == 1 { "" } else { "s" },
            list(a.days.iter().map(u16::to_string).collect())
        ),
        Repeat::Yearly => format!(
            "on day{} {} of each year (counted from 0) at {clock}, from {day}",
            if a.days.len() == 1 { "" } else { "s" },
            list(a.days.iter().map(u16::to_string).collect())
        ),
        Repeat::Hourly => format!(
            "every {} hour{}, from {day} {clock}",
            a.days.first().copied().unwrap_or(1),
            if a.days.first() == Some(&1) { "" } else { "s" }
        ),
    };
    let end = match a.end {
        End::None | End::Never => String::new(),
        End::After(n) => format!(", {n} time{} in all", if n == 1 { "" } else { "s" }),
        End::Until(t) => format!(", until {}", local_second(t, tz)),
    };
    format!("{:<13} {when}{end}", a.action.as_str())
}

fn local_second(t: Timestamp, tz: &TimeZone) -> String {
    t.to_zoned(tz.clone())
        .strftime("%a %Y-%m-%d %H:%M:%S")
        .to_string()
}

/// What a yearly repeat's DAYS mean in dates, in `year`: counted from 0
/// as OpenNebula's scheduler counts them (its reference says from 1, so a
/// pasted example lands a day off: said in every dry run, #66). A day the
/// year lacks (365 outside a leap year) is said to be skipped.
pub fn yearly_days_in(days: &[u16], year: i16) -> String {
    let listed: Vec<String> = days.iter().map(u16::to_string).collect();
    let dates: Vec<String> = days
        .iter()
        .map(|&d| {
            let first = Date::new(year, 1, 1).expect("1 January");
            match first.with().day_of_year(d as i16 + 1).build() {
                Ok(date) => date.strftime("%-d %B").to_string(),
                Err(_) => format!("none (day {d} is only in a leap year)"),
            }
        })
        .collect();
    format!(
        "DAYS {} count from 0, as OpenNebula's scheduler counts them: in {year}, {}",
        listed.join(","),
        dates.join(", ")
    )
}

/// Today in `tz` at `now` (the CLI's default first day).
pub fn today(now: Timestamp, tz: &TimeZone) -> Date {
    now.to_zoned(tz.clone()).date()
}

#[cfg(test)]
mod tests {
    /// Yearly DAYS in dates: counted from 0 (1 is 2 January), day 365
    /// only in a leap year, 59 is 1 March or 29 February.
    #[test]
    fn yearly_days_are_told_in_dates_counted_from_0() {
        let said = super::yearly_days_in(&[0, 1, 59, 365], 2027);
        assert_eq!(
            said,
            "DAYS 0,1,59,365 count from 0, as OpenNebula's scheduler counts them: in 2027, \
             1 January, 2 January, 1 March, none (day 365 is only in a leap year)"
        );
        assert!(super::yearly_days_in(&[59, 365], 2028).ends_with("29 February, 31 December"));
    }

    use super::*;

    /// Times read as stored: minutes, and seconds only when there are some
    /// (a 20-second slice read "resume once at 15:24 / poweroff once at 15:24").
    #[test]
    fn described_times_show_seconds_only_when_there_are_some() {
        let tz = TimeZone::UTC;
        let at = |json: &str| {
            let a = crate::schedule::parse_actions(json, Timestamp::UNIX_EPOCH).unwrap();
            describe(&a[0], &tz)
        };
        assert_eq!(
            at(r#"[{"action":"resume","time":1894116240}]"#),
            "resume        once, at Tue 2030-01-08 15:24"
        );
        assert_eq!(
            at(r#"[{"action":"poweroff","time":1894116260}]"#),
            "poweroff      once, at Tue 2030-01-08 15:24:20"
        );
    }
    use crate::schedule::parse_actions;

    fn berlin() -> TimeZone {
        TimeZone::get("Europe/Berlin").unwrap()
    }

    #[test]
    fn weekdays_names_ranges_and_errors() {
        use Weekday::*;
        assert_eq!(
            parse_weekdays("mon,wed,fri").unwrap(),
            [Monday, Wednesday, Friday]
        );
        assert_eq!(parse_weekdays("Fri,Monday").unwrap(), [Monday, Friday]);
        assert_eq!(
            parse_weekdays("sat-mon").unwrap(),
            [Monday, Saturday, Sunday]
        );
        let e = parse_weekdays("mo").unwrap_err();
        assert!(
            e.message().starts_with("--weekly: weekdays as mon,wed,fri"),
            "{}",
            e.message()
        );
        assert!(parse_weekdays("funday").is_err());
        assert_eq!(parse_month_days("15,1,15").unwrap(), [1, 15]);
        assert!(parse_month_days("32").is_err());
        assert_eq!(
            parse_clock("--from", "9:30").unwrap(),
            Time::new(9, 30, 0, 0).unwrap()
        );
        assert!(parse_clock("--from", "24:00").is_err());
    }

    #[test]
    fn a_weekly_form_becomes_a_resume_and_a_poweroff_that_parse() {
        let form = Form {
            every: Every::Weekly(parse_weekdays("mon,wed,fri").unwrap()),
            from: parse_clock("--from", "09:00").unwrap(),
            to: parse_clock("--to", "17:00").unwrap(),
            starting: "2027-01-04".parse().unwrap(),
            until: Until::Date("2027-06-30".parse().unwrap()),
        };
        let v = form.actions(&berlin()).unwrap();
        assert_eq!(v[0]["action"], "resume");
        assert_eq!(v[0]["time"], "2027-01-04T09:00:00+01:00");
        assert_eq!(v[0]["days"], "1,3,5");
        assert_eq!(v[0]["repeat"], 0);
        assert_eq!(v[1]["time"], "2027-01-04T17:00:00+01:00");
        // 2027-06-30 ends at 23:59:59 CEST (UTC+2): 2027-06-30T21:59:59Z.
        assert_eq!(v[0]["end_value"], 1_814_392_799);
        let actions = parse_actions(&v.to_string(), Timestamp::UNIX_EPOCH).unwrap();
        assert_eq!(
            describe(&actions[0], &berlin()),
            "resume        every Mon, Wed, Fri at 09:00, from Mon 2027-01-04, until Wed 2027-06-30 23:59:59"
        );
        // Overnight: the power-off comes the next day, on the next weekday.
        let night = Form {
            every: Every::Weekly(parse_weekdays("fri,sat").unwrap()),
            from: parse_clock("--from", "22:00").unwrap(),
            to: parse_clock("--to", "06:00").unwrap(),
            starting: "2027-01-01".parse().unwrap(),
            until: Until::Times(4),
        };
        let v = night.actions(&berlin()).unwrap();
        assert_eq!(v[0]["days"], "5,6");
        assert_eq!(v[1]["days"], "0,6");
        assert_eq!(v[1]["time"], "2027-01-02T06:00:00+01:00");
        assert_eq!(v[1]["end_value"], 4);
    }

    #[test]
    fn monthly_and_hourly_forms_and_their_limits() {
        let base = |every, from: &str, to: &str| Form {
            every,
            from: parse_clock("--from", from).unwrap(),
            to: parse_clock("--to", to).unwrap(),
            starting: "2027-03-01".parse().unwrap(),
            until: Until::Never,
        };
        let v = base(Every::Monthly(vec![1, 15]), "08:00", "12:00")
            .actions(&berlin())
            .unwrap();
        assert_eq!(
            (v[0]["repeat"].as_i64(), v[0]["days"].as_str()),
            (Some(1), Some("1,15"))
        );
        assert_eq!(v[0]["end_type"], 0);
        let e = base(Every::Monthly(vec![31]), "22:00", "02:00")
            .actions(&berlin())
            .unwrap_err();
        assert!(e
            .message()
            .starts_with("--to: a monthly slice must end the same day"));
        // Yearly: days of the year counted from 0, as OpenNebula's code does.
        let v = base(
            Every::Yearly(parse_year_days("0,181").unwrap()),
            "08:00",
            "12:00",
        )
        .actions(&berlin())
        .unwrap();
        assert_eq!(
            (v[0]["repeat"].as_i64(), v[0]["days"].as_str()),
            (Some(2), Some("0,181"))
        );
        let parsed = crate::schedule::parse_actions(&v.to_string(), jiff::Timestamp::UNIX_EPOCH);
        assert!(parsed.is_ok(), "{parsed:?}");
        assert!(parse_year_days("366")
            .unwrap_err()
            .message()
            .starts_with("--yearly: days of the year counted from 0"));
        assert!(base(Every::Yearly(vec![0]), "22:00", "02:00")
            .actions(&berlin())
            .unwrap_err()
            .message()
            .starts_with("--to: a yearly slice must end the same day"));
        let v = base(Every::Hourly(6), "00:00", "02:00")
            .actions(&berlin())
            .unwrap();
        assert_eq!(
            (v[1]["repeat"].as_i64(), v[1]["days"].as_str()),
            (Some(3), Some("6"))
        );
        let e = base(Every::Hourly(2), "00:00", "02:00")
            .actions(&berlin())
            .unwrap_err();
        assert!(
            e.message().contains("shorter than the interval"),
            "{}",
            e.message()
        );
    }
}
