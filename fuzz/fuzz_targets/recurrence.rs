//! The recurrence engine: arbitrary (structured) actions in zones with DST;
//! occurrences are strictly after the start, strictly ascending, within the
//! END rule's count, and computing them never panics or hangs.
#![no_main]
use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input {
    time: i64,
    repeat: i8,
    days: Vec<u16>,
    end_type: i8,
    end_value: i64,
    after: i64,
    zone: u8,
    limit: u8,
}

const ZONES: &[&str] = &["UTC", "Europe/Berlin", "America/New_York", "Australia/Sydney", "Asia/Kolkata"];

fuzz_target!(|i: Input| {
    let days: Vec<String> = i.days.iter().take(8).map(|d| d.to_string()).collect();
    let json = format!(
        r#"[{{"action":"resume","time":{},"repeat":{},"days":"{}","end_type":{},"end_value":{}}}]"#,
        i.time % 8_000_000_000,
        i.repeat,
        days.join(","),
        i.end_type,
        i.end_value
    );
    let now = jiff::Timestamp::from_second(1_767_250_800).unwrap();
    let Ok(actions) = astraeusd::schedule::parse_actions(&json, now) else {
        return;
    };
    let tz = jiff::tz::TimeZone::get(ZONES[i.zone as usize % ZONES.len()]).unwrap();
    let Ok(after) = jiff::Timestamp::from_second(i.after % 250_000_000_000) else {
        return;
    };
    let limit = 1 + i.limit as usize % 50;
    let got = actions[0].occurrences_after(after, &tz, limit);
    assert!(got.len() <= limit);
    assert!(got.iter().all(|t| *t > after), "{json}: not after {after}: {got:?}");
    assert!(got.windows(2).all(|w| w[0] < w[1]), "{json}: not ascending: {got:?}");
    if i.end_type == 1 && i.end_value >= 0 {
        assert!(got.len() as i64 <= i.end_value.max(0), "{json}: more than END_VALUE");
    }
});
