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
