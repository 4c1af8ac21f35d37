//! PURE (but for [`EpochMs::now`]): the daemon's one type for instants.
//!
//! Inside the daemon an instant is an [`EpochMs`]: milliseconds since the
//! Unix epoch. Other forms exist only at the edges, each converted here:
//! epoch seconds on the wire (D-Bus), signed milliseconds in the ledger
//! (SQLite's INTEGER), and `jiff::Timestamp` where calendars are computed
//! (schedules, slices). Lengths of time stay plain `u64` milliseconds
//! (`buffer_ms`, `dead_time_ms`): an instant plus a length is an instant,
//! an instant minus an instant is a length.

use std::ops::{Add, Sub};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// An instant: milliseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EpochMs(pub u64);

impl EpochMs {
    /// Now, by the system clock (the epoch itself before it: a broken clock
    /// never makes a negative instant).
    pub fn now() -> EpochMs {
        EpochMs(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
        )
    }

    /// From signed milliseconds, as the ledger and the bus carry them (before
    /// the epoch: the epoch).
    pub fn from_i64(ms: i64) -> EpochMs {
        EpochMs(ms.max(0) as u64)
    }

    /// As signed milliseconds, for the ledger and the bus.
    pub fn as_i64(self) -> i64 {
        i64::try_from(self.0).unwrap_or(i64::MAX)
    }

    /// The milliseconds, for the wire (signals carry `at_ms`).
    pub fn millis(self) -> u64 {
        self.0
    }

    /// Epoch seconds, rounded down: what the bus carries for slices and reports.
    pub fn secs(self) -> i64 {
        (self.0 / 1000) as i64
    }

    pub fn from_timestamp(t: jiff::Timestamp) -> EpochMs {
        EpochMs::from_i64(t.as_millisecond())
    }

    pub fn timestamp(self) -> jiff::Timestamp {
        jiff::Timestamp::from_millisecond(self.as_i64()).unwrap_or(jiff::Timestamp::MAX)
    }

    /// How long from now until this instant (zero once it has passed).
    pub fn from_now(self) -> Duration {
        Duration::from_millis(self - EpochMs::now())
    }
}

/// An instant plus a length (saturating: far future stays far future).
impl Add<u64> for EpochMs {
    type Output = EpochMs;
    fn add(self, ms: u64) -> EpochMs {
        EpochMs(self.0.saturating_add(ms))
    }
}

/// The length from an earlier instant to this one; zero when it is later.
impl Sub for EpochMs {
    type Output = u64;
    fn sub(self, earlier: EpochMs) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

impl std::fmt::Display for EpochMs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.timestamp())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edges_convert_and_arithmetic_saturates() {
        let t = EpochMs(1_767_250_800_123);
        assert_eq!(t.secs(), 1_767_250_800);
        assert_eq!(EpochMs::from_i64(t.as_i64()), t);
        assert_eq!(EpochMs::from_i64(-5), EpochMs(0));
        assert_eq!(EpochMs::from_timestamp(t.timestamp()), t);
        assert_eq!(t.timestamp().to_string(), "2026-01-01T07:00:00.123Z");
        assert_eq!((t + 877) - t, 877);
        assert_eq!(
            t - (t + 1),
            0,
            "an earlier minus a later instant is no time"
        );
        assert_eq!(EpochMs(u64::MAX) + 1, EpochMs(u64::MAX));
        assert_eq!(EpochMs(u64::MAX).as_i64(), i64::MAX);
    }
}
