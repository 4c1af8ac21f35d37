//! The scheduled-action JSON: any input is accepted or refused with a typed
//! InvalidRequest naming its field; what is accepted yields occurrences.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let now = jiff::Timestamp::from_second(1_767_250_800).unwrap();
    match astraeusd::schedule::parse_actions(text, now) {
        Ok(actions) => {
            let tz = jiff::tz::TimeZone::get("Europe/Berlin").unwrap();
            for a in &actions {
                let _ = a.occurrences_after(now, &tz, 5);
            }
        }
        Err(e) => {
            assert_eq!(e.kind(), "InvalidRequest", "{e}");
            assert!(e.message().contains(": "), "no field path in {e}");
        }
    }
});
