//! The worker request JSON: any input is accepted or refused with a typed
//! InvalidRequest whose message starts with the field it is about.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match astraeusd::request::WorkerSpec::parse(text) {
        Ok(spec) => {
            // What was accepted has a valid name and serializes back.
            astraeusd::request::validate_name("name", &spec.name).expect("accepted name is valid");
        }
        Err(e) => {
            assert_eq!(e.kind(), "InvalidRequest", "{e}");
            assert!(e.message().contains(": "), "no field path in {e}");
        }
    }
});
