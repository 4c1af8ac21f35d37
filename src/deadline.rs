//! Deadlines for the calls out of the daemon that a backend may leave
//! unanswered: nothing waits forever. A call past its deadline fails as a
//! `Backend` error naming the backend and what it waited for; the launch
//! it was part of ends its worker `failed`, and its share is freed.
//!
//! | backend | deadline |
//! |---|---|
//! | podman's API | `runtime.podman_timeout_seconds` (120 s) a call |
//! | Docker's API | `runtime.docker_timeout_seconds` (120 s) a call |
//! | systemd (unit workers) | [`SYSTEMD`] a call |
//! | libvirt (through its helper) | [`LIBVIRT`] a call, [`LIBVIRT`] the helper's start |
//! | the name service (NSS) | [`NSS`] a lookup |
//! | NVML (the inventory's re-read) | the watchdog's period (service/mod.rs) |
//! | NVML or dmem (a worker's memory limits) | [`MEMORY_LIMITS`] for all its GPUs |
//!
//! A blocking lookup (NSS) cannot be cancelled: its thread finishes on its
//! own; the caller no longer waits for it.

use crate::error::{Error, Result};
use std::future::Future;
use std::time::Duration;

/// systemd answers in milliseconds; a StartTransientUnit waits for the job
/// to be queued, not for the unit to run.
pub const SYSTEMD: Duration = Duration::from_secs(30);
/// Long: a domain's create starts QEMU, and a shutdown may wait on the guest.
pub const LIBVIRT: Duration = Duration::from_secs(120);
/// A name service (LDAP, SSSD) that has not answered in this long is taken
/// as one that cannot.
pub const NSS: Duration = Duration::from_secs(10);

/// Setting and reading back one worker's GPU memory limits: driver calls
/// that take milliseconds. Past it the worker starts `promised`, saying so.
pub const MEMORY_LIMITS: Duration = Duration::from_secs(10);

/// `limit`, or the test suite's shorter one (`ASTRAEUS_CALL_DEADLINE_MS`,
/// set by tests that hold a backend that never answers; never in a unit).
pub fn of(limit: Duration) -> Duration {
    std::env::var("ASTRAEUS_CALL_DEADLINE_MS")
        .ok()
        .and_then(|ms| ms.parse().ok())
        .map_or(limit, Duration::from_millis)
}

/// `call`, failed when `backend` has not answered `what` within `limit`.
pub async fn within<T>(
    limit: Duration,
    backend: &str,
    what: &str,
    call: impl Future<Output = Result<T>>,
) -> Result<T> {
    let limit = of(limit);
    tokio::time::timeout(limit, call).await.unwrap_or_else(|_| {
        Err(Error::Backend(format!(
            "{backend} did not answer {what} within {} s; is it hung?",
            limit.as_secs_f64()
        )))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call that never ends fails at its deadline, naming the backend
    /// and what it waited for; one that ends in time is its own answer.
    #[tokio::test]
    async fn a_call_past_its_deadline_fails_naming_the_backend() {
        let limit = Duration::from_millis(50);
        let e = within(limit, "systemd", "StartTransientUnit", async {
            std::future::pending::<Result<()>>().await
        })
        .await
        .unwrap_err();
        assert_eq!(e.kind(), "Backend");
        assert!(
            e.message()
                .starts_with("systemd did not answer StartTransientUnit within 0.05 s"),
            "{e}"
        );
        assert_eq!(within(NSS, "NSS", "x", async { Ok(5) }).await.unwrap(), 5);
    }
}
