//! Schedules over D-Bus: set atomically, read back, slices listed, kept across a restart.

mod common;
use common::*;
use jiff::civil::date;
use jiff::tz::TimeZone;

fn berlin_epoch(y: i16, m: i8, d: i8, h: i8) -> i64 {
    date(y, m, d)
        .at(h, 0, 0, 0)
        .to_zoned(TimeZone::get("Europe/Berlin").unwrap())
        .unwrap()
        .timestamp()
        .as_second()
}

#[test]
fn a_weekday_rotation_set_listed_refused_atomically_and_kept() {
    let dir = open_tempdir();
    std::fs::write(
        dir.path().join("node.toml"),
        "[schedule]\ntime_zone = \"Europe/Berlin\"\nhandoff_buffer_seconds = 300\n",
    )
    .unwrap();
    let sim = dir.path().join("majin.toml");
    std::fs::write(&sim, MAJIN_TOML).unwrap();
    let bus = Bus::session();
    let d = Daemon::start(&bus, dir.path(), &sim, &[]);
    let a = &bus.address;

    // Mon 2027-03-01 is a Monday. A: Mon/Wed/Fri 09-17; B: Tue/Thu 09-17.
    let nine = berlin_epoch(2027, 3, 1, 9);
    let five = berlin_epoch(2027, 3, 1, 17);
    let rot = |days: &str| {
        format!(
            r#"[{{"action":"resume","time":{nine},"repeat":0,"days":"{days}","end_type":0}},
                {{"action":"poweroff","time":{five},"repeat":0,"days":"{days}","end_type":0}}]"#
        )
    };
    let o = manager(a, None, "SetSchedule", &["ss", "alpha", &rot("1,3,5")]);
    assert!(o.ok, "{}", o.stderr);
    let o = manager(a, None, "SetSchedule", &["ss", "beta", &rot("2,4")]);
    assert!(o.ok, "{}", o.stderr);
    let shown = manager(a, None, "GetSchedule", &["s", "alpha"]).stdout;
    assert!(shown.contains(&format!(r#"\"time\":{nine}"#)), "{shown}");

    // A week of slices: five of them, alternating, each 09:00–17:00 Berlin.
    let o = manager(
        a,
        None,
        "ListSlices",
        &[
            "xx",
            &nine.to_string(),
            &berlin_epoch(2027, 3, 6, 0).to_string(),
        ],
    );
    assert_eq!(
        o.stdout.trim(),
        format!(
            r#"a(sxxs) 5 "alpha" {} {} "poweroff" "beta" {} {} "poweroff" "alpha" {} {} "poweroff" "beta" {} {} "poweroff" "alpha" {} {} "poweroff""#,
            berlin_epoch(2027, 3, 1, 9),
            berlin_epoch(2027, 3, 1, 17),
            berlin_epoch(2027, 3, 2, 9),
            berlin_epoch(2027, 3, 2, 17),
            berlin_epoch(2027, 3, 3, 9),
            berlin_epoch(2027, 3, 3, 17),
            berlin_epoch(2027, 3, 4, 9),
            berlin_epoch(2027, 3, 4, 17),
            berlin_epoch(2027, 3, 5, 9),
            berlin_epoch(2027, 3, 5, 17),
        )
    );

    // Refusals name the field or the conflict, and leave the old schedule in place.
    let o = gdbus(
        a,
        &[
            "-o",
            "/org/astraeus/Node1",
            "-m",
            "org.astraeus.Node1.Manager.SetSchedule",
            "beta",
            r#"[{"action":"resume","time":"+60","repeat":0,"days":"7"}]"#,
        ],
    );
    assert!(
        o.stderr.contains("org.astraeus.Node1.Error.InvalidRequest"),
        "{}",
        o.stderr
    );
    assert!(o.stderr.contains("actions[0].days: "), "{}", o.stderr);
    // beta at noon on Mondays: inside alpha's slice, which means to power off by itself at 17:00.
    let noon = format!(
        r#"[{{"action":"resume","time":{},"repeat":0,"days":"1"}},{{"action":"poweroff","time":{},"repeat":0,"days":"1"}}]"#,
        berlin_epoch(2027, 3, 1, 12),
        berlin_epoch(2027, 3, 1, 13)
    );
    let o = gdbus(
        a,
        &[
            "-o",
            "/org/astraeus/Node1",
            "-m",
            "org.astraeus.Node1.Manager.SetSchedule",
            "beta",
            &noon,
        ],
    );
    assert!(
        o.stderr.contains("org.astraeus.Node1.Error.InvalidRequest"),
        "{}",
        o.stderr
    );
    assert!(
        o.stderr.contains("at Mon 2027-03-01 12:00 Europe/Berlin"),
        "{}",
        o.stderr
    );
    assert!(
        o.stderr
            .contains("overlap: template alpha holds the GPU baseboard"),
        "{}",
        o.stderr
    );
    assert!(o.stderr.contains("Europe/Berlin"), "{}", o.stderr);
    assert!(manager(a, None, "GetSchedule", &["s", "beta"])
        .stdout
        .contains(r#"\"days\":\"2,4\""#));
    let o = gdbus(
        a,
        &[
            "-o",
            "/org/astraeus/Node1",
            "-m",
            "org.astraeus.Node1.Manager.GetSchedule",
            "nope",
        ],
    );
    assert!(
        o.stderr.contains("org.astraeus.Node1.Error.NotFound"),
        "{}",
        o.stderr
    );
    let o = manager(a, None, "ListSlices", &["xx", "100", "50"]);
    assert!(o.stderr.contains("to: must be after from"), "{}", o.stderr);

    // astraeusctl shows the table in the daemon's zone, with the zone named.
    let o = ctl(
        a,
        None,
        &["slices", "--from", "2027-03-01", "--to", "2027-03-03"],
    );
    assert_eq!(
        o.stdout,
        "times in Europe/Berlin\n\
         TEMPLATE  START                 END                   ENDS BY\n\
         alpha     Mon 2027-03-01 09:00  Mon 2027-03-01 17:00  poweroff\n\
         beta      Tue 2027-03-02 09:00  Tue 2027-03-02 17:00  poweroff\n"
    );

    // Kept in the ledger across a restart.
    assert!(d.stop().success());
    let _d = Daemon::start(&bus, dir.path(), &sim, &[]);
    assert!(manager(a, None, "GetSchedule", &["s", "alpha"])
        .stdout
        .contains(r#"\"days\":\"1,3,5\""#));
    // [] removes a schedule.
    assert!(manager(a, None, "SetSchedule", &["ss", "beta", "[]"]).ok);
    assert!(!manager(a, None, "GetSchedule", &["s", "beta"]).ok);
}
