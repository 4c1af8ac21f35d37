//! Property tests for scheduled actions: ordering, END rules, calendar
//! placement across DST, call-to-call consistency and JSON round trips.

use astraeusd::schedule::*;
use jiff::civil::Date;
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};
use proptest::prelude::*;

/// Zones with ordinary DST, a 30-minute DST (Lord Howe), DST at midnight
/// (Sao Paulo, until 2019), a skipped whole day (Apia, 2011) and none.
const ZONES: [&str; 7] = [
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "Australia/Lord_Howe",
    "America/Sao_Paulo",
    "Pacific/Apia",
    "Asia/Kolkata",
];

const NOW: i64 = 1_767_225_600; // 2026-01-01T00:00:00Z

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(seconds).unwrap()
}

fn zone() -> impl Strategy<Value = (String, TimeZone)> {
    prop::sample::select(ZONES.to_vec())
        .prop_map(|name| (name.to_string(), TimeZone::get(name).unwrap()))
}

/// Weekly, monthly or yearly with a valid, sorted set of days.
fn calendar_repeat() -> impl Strategy<Value = (Repeat, Vec<u16>)> {
    // Half the days drawn from the edges: month ends, Feb 29, day 365.
    let set = |lo: u16, hi: u16, edges: Vec<u16>, most: usize| {
        prop::collection::btree_set(prop_oneof![lo..=hi, prop::sample::select(edges)], 1..=most)
            .prop_map(|s| s.into_iter().collect::<Vec<_>>())
    };
    prop_oneof![
        set(0, 6, vec![0, 6], 7).prop_map(|d| (Repeat::Weekly, d)),
        set(1, 31, vec![1, 28, 29, 30, 31], 5).prop_map(|d| (Repeat::Monthly, d)),
        set(0, 365, vec![0, 58, 59, 364, 365], 5).prop_map(|d| (Repeat::Yearly, d)),
    ]
}

fn any_repeat() -> impl Strategy<Value = (Repeat, Vec<u16>)> {
    prop_oneof![
        1 => Just((Repeat::None, vec![])),
        3 => calendar_repeat(),
        1 => (1u16..=168).prop_map(|h| (Repeat::Hourly, vec![h])),
    ]
}

/// A valid action starting 2001..2100 (times after NOW where an end epoch
/// needs it, so it also survives parsing).
fn action_with(
    repeats: impl Strategy<Value = (Repeat, Vec<u16>)>,
) -> impl Strategy<Value = ScheduledAction> {
    (
        prop::sample::select(vec![Action::Resume, Action::Poweroff, Action::PoweroffHard]),
        1_000_000_000i64..4_100_000_000,
        repeats,
        0u8..4,
        1u32..200,
        0i64..5 * 366 * 86_400,
    )
        .prop_map(|(action, time, (repeat, days), end_kind, count, span)| {
            let end = match (repeat, end_kind) {
                (Repeat::None, _) => End::None,
                (_, 0) => End::None,
                (_, 1) => End::Never,
                (_, 2) => End::After(count),
                // Past both TIME and NOW, as parsing demands.
                _ => End::Until(at(time.max(NOW + 1) + span)),
            };
            ScheduledAction {
                action,
                time: at(time),
                repeat,
                days,
                end,
            }
        })
}

fn action() -> impl Strategy<Value = ScheduledAction> {
    action_with(any_repeat())
}

/// Seconds from TIME to `after`: a little before it up to ten years later,
/// weighted to the first months, where a count end is still running.
fn offset() -> impl Strategy<Value = i64> {
    const DAY: i64 = 86_400;
    prop_oneof![-30 * DAY..90 * DAY, 0..2 * 366 * DAY, 0..10 * 366 * DAY,]
}

fn listed(a: &ScheduledAction, date: Date) -> bool {
    let day = match a.repeat {
        Repeat::Weekly => date.weekday().to_sunday_zero_offset() as u16,
        Repeat::Monthly => date.day() as u16,
        Repeat::Yearly => (date.day_of_year() - 1) as u16,
        Repeat::None | Repeat::Hourly => return false,
    };
    a.days.contains(&day)
}

fn from_start(a: &ScheduledAction, tz: &TimeZone, limit: usize) -> Vec<Timestamp> {
    a.occurrences_after(a.time.checked_sub(1.second()).unwrap(), tz, limit)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn ascending_after_and_bounded(a in action(), (_, tz) in zone(), off in offset(), limit in 0usize..40) {
        let after = at(a.time.as_second() + off);
        let got = a.occurrences_after(after, &tz, limit);
        prop_assert!(got.len() <= limit);
        prop_assert!(got.windows(2).all(|w| w[0] < w[1]), "not ascending: {got:?}");
        prop_assert!(got.iter().all(|&t| t > after && t >= a.time));
        if let End::Until(end) = a.end {
            prop_assert!(got.iter().all(|&t| t <= end));
        }
        if a.repeat == Repeat::Hourly {
            let step = i64::from(a.days[0]) * 3600;
            prop_assert!(got.iter().all(|t| (t.as_second() - a.time.as_second()) % step == 0));
        }
    }

    /// Each calendar occurrence is a listed local date at TIME's local time
    /// of day, unless that time fell into a gap on that date (then the
    /// occurrence is that gap-shifted instant, possibly past midnight).
    #[test]
    fn calendar_occurrences_sit_on_listed_days(a in action_with(calendar_repeat()), (name, tz) in zone(), off in offset()) {
        let time_of_day = tz.to_datetime(a.time).time();
        let after = at(a.time.as_second() + off);
        for t in a.occurrences_after(after, &tz, 30) {
            let local = tz.to_datetime(t);
            let mut candidates = vec![local.date()];
            candidates.extend(local.date().yesterday().ok());
            let ok = candidates.iter().any(|&d| {
                listed(&a, d)
                    && tz.to_timestamp(d.to_datetime(time_of_day)).ok() == Some(t)
                    && (local.time() == time_of_day || in_gap(d, time_of_day, &tz))
            });
            prop_assert!(ok, "{t} ({local} in {name}) is not a listed day at {time_of_day}");
        }
    }

    /// Asking after the last returned occurrence continues the same sequence.
    #[test]
    fn calls_chain_into_one_sequence(a in action(), (_, tz) in zone(), off in offset(), n1 in 1usize..15, n2 in 1usize..15) {
        let after = at(a.time.as_second() + off);
        let first = a.occurrences_after(after, &tz, n1);
        let whole = a.occurrences_after(after, &tz, n1 + n2);
        match first.last() {
            Some(&last) if first.len() == n1 => {
                let mut chained = first.clone();
                chained.extend(a.occurrences_after(last, &tz, n2));
                prop_assert_eq!(chained, whole);
            }
            Some(&last) => {
                prop_assert!(a.occurrences_after(last, &tz, n2).is_empty());
                prop_assert_eq!(first, whole);
            }
            None => prop_assert!(whole.is_empty()),
        }
    }

    /// Starting the search late (arithmetic skip, count carried over) gives
    /// the same occurrences as listing everything from the start.
    #[test]
    fn late_start_agrees_with_full_listing(a in action(), (_, tz) in zone(), off in offset(), n in 1usize..20) {
        const FULL: usize = 3000;
        let after = at(a.time.as_second() + off);
        let full = from_start(&a, &tz, FULL);
        let expected: Vec<Timestamp> = full.iter().copied().filter(|&t| t > after).take(n).collect();
        if full.len() < FULL || expected.len() == n {
            prop_assert_eq!(a.occurrences_after(after, &tz, n), expected);
        }
    }

    /// From any point between two occurrences, the rest of the sequence
    /// follows, up to the count end; this checks the slot arithmetic right
    /// where the count runs out.
    #[test]
    fn rest_follows_from_any_occurrence(
        a in action(),
        count in 1u32..60,
        (_, tz) in zone(),
        pick in any::<prop::sample::Index>(),
        fraction in 0.0f64..1.0,
        n in 1usize..10,
    ) {
        let a = if a.repeat == Repeat::None { a } else { ScheduledAction { end: End::After(count), ..a } };
        let full = from_start(&a, &tz, 3000);
        prop_assume!(full.len() < 3000);
        prop_assume!(!full.is_empty());
        let k = pick.index(full.len());
        // A point from this occurrence up to just before the next one.
        let after = match full.get(k + 1) {
            Some(next) => {
                let gap = (next.as_second() - full[k].as_second()) as f64;
                at(full[k].as_second() + (gap * fraction) as i64)
            }
            None => full[k],
        };
        let expected: Vec<Timestamp> = full[k + 1..].iter().copied().filter(|&t| t > after).take(n).collect();
        prop_assert_eq!(a.occurrences_after(after, &tz, n), expected);
    }

    #[test]
    fn count_end_is_never_exceeded(a in action(), (name, tz) in zone(), off in offset()) {
        let End::After(count) = a.end else { return Ok(()); };
        let count = count as usize;
        let all = from_start(&a, &tz, count + 10);
        prop_assert!(all.len() <= count);
        // Only a skipped whole day (Apia, 2011) can merge two occurrences.
        if name != "Pacific/Apia" {
            prop_assert_eq!(all.len(), count);
        }
        let after = at(a.time.as_second() + off);
        let late = a.occurrences_after(after, &tz, count + 10);
        prop_assert!(late.iter().all(|t| all.contains(t)));
    }
}

/// JSON as a template might write it: `+N` or epoch times, optional fields
/// left out when default, spaces and duplicates in `days`.
fn json_action() -> impl Strategy<Value = String> {
    (
        action(),
        any::<bool>(),
        prop::collection::vec((0usize..3, 0usize..3, any::<bool>()), 1..4),
        any::<bool>(),
    )
        .prop_map(|(a, relative, spacing, explicit)| {
            let mut fields = vec![format!(r#""action":"{}""#, a.action.as_str())];
            let time = a.time.as_second();
            fields.push(if relative && time >= NOW {
                format!(r#""time":"+{}""#, time - NOW)
            } else {
                format!(r#""time":{time}"#)
            });
            if a.repeat != Repeat::None || explicit {
                fields.push(format!(r#""repeat":{}"#, a.repeat.code()));
            }
            if a.repeat != Repeat::None {
                let mut parts: Vec<String> = Vec::new();
                for (i, &day) in a.days.iter().enumerate() {
                    let (before, after, dup) = spacing[i % spacing.len()];
                    parts.push(format!("{}{day}{}", " ".repeat(before), " ".repeat(after)));
                    if dup {
                        parts.push(day.to_string());
                    }
                }
                parts.reverse();
                fields.push(format!(r#""days":"{}""#, parts.join(",")));
            }
            if a.end != End::None || explicit {
                fields.push(format!(r#""end_type":{}"#, a.end.code()));
            }
            match a.end {
                End::After(n) => fields.push(format!(r#""end_value":{n}"#)),
                End::Until(t) => fields.push(format!(r#""end_value":{}"#, t.as_second())),
                End::None | End::Never => {}
            }
            format!("{{{}}}", fields.join(","))
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn json_round_trips(items in prop::collection::vec(json_action(), 0..6)) {
        let now = at(NOW);
        let json = format!("[{}]", items.join(","));
        let parsed = parse_actions(&json, now).map_err(|e| TestCaseError::fail(format!("{e:?} for {json}")))?;
        let written = serde_json::to_string(&parsed).unwrap();
        prop_assert_eq!(parse_actions(&written, now), Ok(parsed.clone()));
        // Writing is canonical: a second trip gives the same text.
        prop_assert_eq!(serde_json::to_string(&parsed).unwrap(), written);
    }
}
