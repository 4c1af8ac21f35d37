//! A template's JSON list of scheduled actions read and checked: every
//! error names its field and what would be accepted.

use super::*;

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
