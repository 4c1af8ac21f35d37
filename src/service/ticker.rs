//! The refresh's clock: a timerfd, armed again after each tick, one
//! wake-up per period.
//!
//! tokio's timer wheel reaches a far timer level by level: a 2 s interval
//! woke the idle daemon twice per tick (at the start of the wheel's 64 ms
//! slot, then on time), a 10 s one three times (strace). The kernel's
//! timer wakes it once.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

pub(super) struct Ticker {
    fd: AsyncFd<OwnedFd>,
    period: Duration,
}

impl Ticker {
    /// Ticks at once, then a `period` after each tick was taken
    /// (CLOCK_MONOTONIC): ticks missed while the loop was busy are one,
    /// as with tokio's `MissedTickBehavior::Delay`.
    pub fn new(period: Duration) -> io::Result<Ticker> {
        // SAFETY: no pointers; the result is checked.
        let raw = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: the `OwnedFd` keeps the descriptor open, and the same,
        // for as long as the `AsyncFd` that owns it.
        let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }?;
        let ticker = Ticker { fd, period };
        // The first tick at once (a zero time would disarm the timer).
        ticker.arm(Duration::from_nanos(1))?;
        Ok(ticker)
    }

    /// One expiry, `after` from now.
    fn arm(&self, after: Duration) -> io::Result<()> {
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: after.as_secs() as libc::time_t,
                tv_nsec: after.subsec_nanos() as libc::c_long,
            },
        };
        let fd = self.fd.get_ref().as_raw_fd();
        // SAFETY: `spec` outlives the call; the old value is not asked for.
        if unsafe { libc::timerfd_settime(fd, 0, &spec, std::ptr::null_mut()) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// The next tick.
    pub async fn tick(&self) -> io::Result<()> {
        loop {
            let mut ready = self.fd.readable().await?;
            let read = ready.try_io(|fd| {
                let mut expirations = [0u8; 8];
                // SAFETY: reads at most 8 bytes into an 8-byte buffer.
                let n = unsafe { libc::read(fd.as_raw_fd(), expirations.as_mut_ptr().cast(), 8) };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(())
                }
            });
            match read {
                Ok(result) => return result.and_then(|()| self.arm(self.period)),
                // Not due after all (another reader): wait again.
                Err(_would_block) => continue,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// The first tick comes at once, the next ones a period apart (never
    /// sooner: `Instant`, the same clock read apart, is the oracle), and
    /// ticks missed while nobody waited come as one.
    #[test]
    fn ticks_at_once_then_once_per_period() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let period = Duration::from_millis(200);
            let start = Instant::now();
            let ticker = Ticker::new(period).unwrap();
            ticker.tick().await.unwrap();
            assert!(start.elapsed() < period, "the first tick is at once");
            let first = Instant::now();
            ticker.tick().await.unwrap();
            ticker.tick().await.unwrap();
            assert!(first.elapsed() >= period * 2, "{:?}", first.elapsed());
            // Three periods missed: one tick now, the next a period on.
            std::thread::sleep(period * 3);
            ticker.tick().await.unwrap();
            let missed = Instant::now();
            ticker.tick().await.unwrap();
            assert!(
                missed.elapsed() >= period,
                "missed ticks are one: {:?}",
                missed.elapsed()
            );
        });
    }
}
