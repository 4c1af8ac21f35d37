//! The host command a site may run between two tenants' slices
//! (`[slicing] between_slices`: a GPU reset, a memory scrub): after the
//! outgoing VM stopped and before the baseboard counts as released, under
//! its deadline, so the next VM starts only once it succeeded (its time is
//! part of the handoff's dead time). Until it succeeds the baseboard stays
//! held: the release check answers nothing, the next slice waits, the
//! journal says why, and it is tried again every [`RETRY`]. It is due once
//! more at each start of the daemon: whether it ran after the last stop
//! before a crash cannot be told, and once too often is the safe side.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long after a failure the command is tried again.
pub const RETRY: Duration = Duration::from_secs(30);

/// The command, and whether a run is due.
pub struct BetweenSlices {
    argv: Vec<String>,
    within: Duration,
    /// [`RETRY`] (shorter only in tests).
    retry: Duration,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    due: bool,
    running: bool,
    failed_at: Option<Instant>,
}

impl BetweenSlices {
    /// None when no command is configured.
    pub fn new(argv: &[String], within: Duration, retry: Duration) -> Option<BetweenSlices> {
        (!argv.is_empty()).then(|| BetweenSlices {
            argv: argv.to_vec(),
            within,
            retry,
            state: Mutex::new(State {
                due: true,
                ..State::default()
            }),
        })
    }

    /// A template's VM stopped: a run is due before the next one starts.
    pub fn vm_stopped(&self) {
        let mut s = self.lock();
        s.due = true;
        s.failed_at = None;
    }

    /// Whether the baseboard may count as released: true when no run is
    /// due, or the one due now succeeded; false while one runs, failed
    /// less than its retry interval ago, or failed now (the journal says why).
    pub async fn released(&self) -> bool {
        {
            let mut s = self.lock();
            if !s.due {
                return true;
            }
            if s.running || s.failed_at.is_some_and(|t| t.elapsed() < self.retry) {
                return false;
            }
            s.running = true;
        }
        let started = Instant::now();
        let outcome = self.run().await;
        let mut s = self.lock();
        s.running = false;
        let shown = self.argv.join(" ");
        match outcome {
            Ok(()) => {
                s.due = false;
                s.failed_at = None;
                tracing::info!(
                    "between slices: {shown} done in {:.1} s",
                    started.elapsed().as_secs_f64()
                );
                true
            }
            Err(why) => {
                s.failed_at = Some(Instant::now());
                tracing::warn!(
                    "between slices: {shown} {why}; the baseboard stays held and the next slice \
                     waits (tried again in {} s)",
                    self.retry.as_secs_f64()
                );
                false
            }
        }
    }

    /// One run within its deadline; why it failed, in words.
    async fn run(&self) -> Result<(), String> {
        let mut command = tokio::process::Command::new(&self.argv[0]);
        command
            .args(&self.argv[1..])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let child = command
            .spawn()
            .map_err(|e| format!("could not be started: {e}"))?;
        match tokio::time::timeout(self.within, child.wait_with_output()).await {
            Err(_) => Err(format!(
                "did not finish within {} s and was killed",
                self.within.as_secs()
            )),
            Ok(Err(e)) => Err(format!("could not be waited for: {e}")),
            Ok(Ok(o)) if o.status.success() => Ok(()),
            Ok(Ok(o)) => {
                let said = String::from_utf8_lossy(&o.stderr);
                let last = said.lines().rev().find(|l| !l.trim().is_empty());
                let status = match o.status.code() {
                    Some(code) => format!("failed with status {code}"),
                    None => "was killed by a signal".to_string(),
                };
                Err(match last {
                    Some(l) => format!(
                        "{status}: {}",
                        crate::json_fields::clip(&crate::text::printable(l))
                    ),
                    None => status,
                })
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}
