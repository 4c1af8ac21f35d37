//! The daemon's clock, read in one place. Instants inside the daemon are
//! milliseconds since the Unix epoch; epoch seconds exist only on the wire
//! and `jiff` only where calendars are computed (schedules).

use std::time::{SystemTime, UNIX_EPOCH};

/// Now, in milliseconds since the Unix epoch (0 before it: a broken clock
/// never makes a negative instant).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
