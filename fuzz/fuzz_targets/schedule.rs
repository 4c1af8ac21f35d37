//! A schedule as SetSchedule reads it — our JSON, or OpenNebula's own
//! SCHED_ACTION text or JSON (`schedule_one::read`): any input is accepted
//! or refused with a typed InvalidRequest naming its field or block; what
//! is accepted yields occurrences.
#![no_main]
use libfuzzer_sys::fuzz_target;

fn refused(e: &astraeusd::error::Error) {
    assert_eq!(e.kind(), "InvalidRequest", "{e}");
    assert!(e.message().contains(": "), "no field path in {e}");
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let now = jiff::Timestamp::from_second(1_767_250_800).unwrap();
    let read = match astraeusd::schedule_one::read(text) {
        Ok(read) => read,
        Err(e) => return refused(&e),
    };
    match read.explain(astraeusd::schedule::parse_actions(&read.json, now)) {
        Ok(actions) => {
            let tz = jiff::tz::TimeZone::get("Europe/Berlin").unwrap();
            for a in &actions {
                let _ = a.occurrences_after(now, &tz, 5);
            }
        }
        Err(e) => refused(&e),
    }
});
