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
