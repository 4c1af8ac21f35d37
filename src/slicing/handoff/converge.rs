//! Start-up after downtime or a crash: the state wanted now, from the
//! ledger's last record and the VMs libvirt says are on, never a burst of
//! what was missed.

use super::machine::{buffer, check_release_soon, record, stopped};
use super::*;

/// The state at start-up, from the last ledger record that is not a
/// [`Step::Requested`] (requests reach [`converge`] as `want`) nor a
/// [`Step::Destroyed`] (not a step of the handoff), and the
/// template VM that is on now (the caller lists active domains). Finishes what the
/// record shows in flight, safely: a power-off is asked again, a stop is
/// followed by a release check, a start is redone only after a fresh check.
pub fn resume_from(
    last: Option<&Record>,
    vm_on: Option<&str>,
    now_ms: EpochMs,
    s: &HandoffTimings,
) -> (HandoffState, Vec<HandoffAction>) {
    let mut out = Vec::new();
    let now = now_ms;
    let to_of = |r: &Record| r.to.clone();
    let state = match (vm_on, last) {
        // Killed while powering it off: ask again, keeping the deadline.
        (Some(t), Some(r))
            if matches!(r.step, Step::PowerOffAsked | Step::Forced)
                && r.from.as_deref() == Some(t) =>
        {
            let forced = r.step == Step::Forced;
            let template = t.to_string();
            out.push(if forced {
                HandoffAction::Destroy { template }
            } else {
                HandoffAction::Shutdown { template }
            });
            out.push(HandoffAction::SetTimer {
                at_ms: r.at_ms + s.limits(t).stop_timeout_ms,
            });
            HandoffState::PoweringOff {
                from: t.to_string(),
                to: to_of(r),
                forced,
                since_ms: r.at_ms,
            }
        }
        (Some(t), Some(r)) if r.step == Step::Ready && r.to.as_deref() == Some(t) => {
            HandoffState::Running {
                template: t.to_string(),
                since_ms: r.at_ms,
            }
        }
        (Some(t), last) => {
            let mine = last.filter(|r| {
                r.to.as_deref() == Some(t)
                    && matches!(
                        r.step,
                        Step::StartIssued | Step::Started | Step::StartFailed
                    )
            });
            let (issued_ms, since_ms) = match mine {
                Some(r) if r.step == Step::Started => (r.at_ms, r.at_ms),
                Some(r) => (r.at_ms, now),
                None => {
                    // A stop recorded before the daemon stopped, its slice
                    // perhaps not closed yet (as the arm with none on does).
                    if let Some(r) = last.filter(|r| r.step == Step::Stopped) {
                        if let Some(from) = r.from.as_deref().filter(|f| *f != t) {
                            out.push(HandoffAction::CloseSlice {
                                template: from.to_string(),
                                at_ms: r.at_ms,
                                error: None,
                            });
                        }
                    }
                    // On, but no slice of it is open: someone started it.
                    let why = Some("found running at start-up".to_string());
                    record(&mut out, Step::Started, None, Some(t), now, why);
                    out.push(HandoffAction::Signal(Signal::SliceStarted {
                        template: t.to_string(),
                        at_ms: now,
                        dead_time_ms: None,
                    }));
                    (now, now)
                }
            };
            out.push(HandoffAction::Probe {
                template: t.to_string(),
            });
            out.push(HandoffAction::SetTimer {
                at_ms: now + s.poll(),
            });
            HandoffState::AwaitingReady {
                to: t.to_string(),
                issued_ms,
                since_ms,
            }
        }
        (None, None) => HandoffState::Idle { released_ms: None },
        (None, Some(r)) => match (r.step, r.from.as_deref(), r.to.as_deref()) {
            (Step::PowerOffAsked | Step::Forced | Step::Stopped, Some(from), _) => {
                if r.step == Step::Stopped {
                    out.push(HandoffAction::CloseSlice {
                        template: from.to_string(),
                        at_ms: r.at_ms,
                        error: None,
                    });
                    check_release_soon(now, s, &mut out);
                    HandoffState::AwaitingRelease {
                        from: from.to_string(),
                        to: to_of(r),
                        stopped_ms: now,
                    }
                } else {
                    let why = Some("found off at start-up".to_string());
                    stopped(from, to_of(r), now, why, s, &mut out)
                }
            }
            (Step::ReleaseConfirmed, from, Some(to)) => {
                let handoff = from.map(|_| r.at_ms);
                buffer(to, handoff, r.at_ms + s.buffer_ms, now, s, &mut out)
            }
            (Step::ReleaseConfirmed, _, None) => HandoffState::Idle {
                released_ms: Some(r.at_ms),
            },
            // A create that may never have run: check again, then redo it.
            (Step::StartIssued | Step::StartFailed, _, Some(to)) => {
                buffer(to, None, now, now, s, &mut out)
            }
            (Step::Started | Step::Ready, _, Some(to)) => {
                let why = Some("found off at start-up".to_string());
                stopped(to, None, now, why, s, &mut out)
            }
            (Step::Failed | Step::TargetGone, _, Some(to)) => {
                let error = r.detail.clone().unwrap_or_default();
                out.push(HandoffAction::CloseSlice {
                    template: to.to_string(),
                    at_ms: r.at_ms,
                    error: Some(error.clone()),
                });
                HandoffState::Failed {
                    template: to.to_string(),
                    error,
                    at_ms: r.at_ms,
                }
            }
            _ => HandoffState::Idle { released_ms: None },
        },
    };
    (state, out)
}

/// Who should hold the baseboard after a restart on a host without a
/// schedule: who the last record was heading for (a request, or a handoff
/// under way, finishes; a power-off stays off), or, after a failed slice or
/// on a fresh ledger, the VM that is on.
pub fn wanted_without_schedule(last: Option<&Record>, vm_on: &[String]) -> Option<String> {
    match last {
        Some(r) if !matches!(r.step, Step::Failed | Step::TargetGone) => r.to.clone(),
        _ => vm_on.first().cloned(),
    }
}

/// Start-up after downtime or a crash: only the state wanted now, never a
/// burst of the actions missed. `want` is who should hold the baseboard now
/// — the schedule's owner, or a manual request newer than the schedule's
/// last event (the caller decides, and records what it skipped). `vm_on`:
/// the template VMs active now; more than one breaks the rule, and all but
/// one are destroyed at once.
pub fn converge(
    want: Option<&str>,
    vm_on: &[String],
    last: Option<&Record>,
    now_ms: EpochMs,
    s: &HandoffTimings,
) -> (HandoffState, Vec<HandoffAction>) {
    let is_on = |t: &&str| vm_on.iter().any(|v| v == t);
    // The one kept: the one wanted, else the one the ledger last had on
    // (not a newcomer whose destroy a crash cut short), else any.
    let recorded_on = last.and_then(|r| match r.step {
        Step::PowerOffAsked | Step::Forced => r.from.as_deref(),
        Step::StartIssued | Step::Started | Step::StartFailed | Step::Ready => r.to.as_deref(),
        _ => None,
    });
    let keep = want
        .filter(is_on)
        .or(recorded_on.filter(is_on))
        .or(vm_on.first().map(String::as_str));
    let (state, actions) = resume_from(last, keep, now_ms, s);
    let mut out = Vec::new();
    // The one the ledger had on is off, and another is on: its slice ends
    // (it stayed open). One that is on is destroyed below instead.
    if let (Some(t), Some(r)) = (keep, last) {
        let holder = match r.step {
            Step::PowerOffAsked | Step::Forced => r.from.as_deref(),
            Step::Started | Step::Ready => r.to.as_deref(),
            _ => None,
        };
        if let Some(off) = holder.filter(|h| *h != t && !is_on(h)) {
            let why = format!("found off at start-up, {t} on instead");
            record(&mut out, Step::Stopped, Some(off), want, now_ms, Some(why));
            out.push(HandoffAction::Signal(Signal::SliceEnded {
                template: off.to_string(),
                at_ms: now_ms,
            }));
        }
    }
    for extra in vm_on.iter().filter(|v| Some(v.as_str()) != keep) {
        let why = format!(
            "on together with {}; exactly one template VM may be on",
            keep.unwrap_or_default()
        );
        // `to`: who holds the baseboard once settled, so a restart still
        // wants it: the one wanted (the event below brings the handoff there).
        record(
            &mut out,
            Step::Destroyed,
            Some(extra),
            want,
            now_ms,
            Some(why.clone()),
        );
        out.push(HandoffAction::Destroy {
            template: extra.clone(),
        });
        // Its slice ends here, if it had one open (it held the baseboard
        // before the daemon stopped, and another was started meanwhile).
        out.push(HandoffAction::CloseSlice {
            template: extra.clone(),
            at_ms: now_ms,
            error: Some(format!("destroyed at a start: {why}")),
        });
    }
    out.extend(actions);
    let event = match (want, state.target()) {
        (Some(w), target) if target != Some(w) => Some(Scheduled::Resume.at(w, now_ms)),
        (None, Some(t)) => Some(Scheduled::Poweroff.at(t, now_ms)),
        _ => None,
    };
    match event {
        None => (state, out),
        Some(event) => {
            let (state, actions) = step(&state, &event, s);
            out.extend(actions);
            (state, out)
        }
    }
}

pub(super) trait Due {
    fn at(self, template: &str, at_ms: EpochMs) -> Event;
}

impl Due for Scheduled {
    fn at(self, template: &str, at_ms: EpochMs) -> Event {
        Event::Due {
            action: self,
            template: template.to_string(),
            at_ms,
        }
    }
}
