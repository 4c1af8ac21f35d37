//! The handoff machine's transitions: one event in, the next state and
//! the actions out (the contract is in the module's doc).

use super::*;

/// Applies one event. Events that do not fit the state (late, duplicated,
/// about another template) change nothing.
pub fn step(
    state: &HandoffState,
    event: &Event,
    s: &HandoffTimings,
) -> (HandoffState, Vec<HandoffAction>) {
    let (next, mut out) = transition(state, event, s);
    // A request that changed the target but recorded nothing (no VM stops
    // or starts yet) is recorded too: its caller is answered, so a restart
    // must not forget it.
    let request = matches!(
        event,
        Event::Due { .. } | Event::ManualResume { .. } | Event::ManualPowerOff { .. }
    );
    if request
        && next.target() != state.target()
        && !out.iter().any(|a| matches!(a, HandoffAction::Record(_)))
    {
        let r = Record {
            step: Step::Requested,
            from: None,
            to: next.target().map(str::to_string),
            at_ms: event.at_ms(),
            detail: None,
        };
        out.insert(0, HandoffAction::Record(r));
    }
    (next, out)
}

fn transition(
    state: &HandoffState,
    event: &Event,
    s: &HandoffTimings,
) -> (HandoffState, Vec<HandoffAction>) {
    let mut out = Vec::new();
    let at = event.at_ms();
    let next = match event {
        Event::Due {
            action, template, ..
        } => match action {
            Scheduled::Resume => resume(state, template, at, s, &mut out),
            Scheduled::Poweroff => power_off(state, template, false, at, s, &mut out),
            Scheduled::PoweroffHard => power_off(state, template, true, at, s, &mut out),
        },
        Event::ManualResume {
            template,
            as_handoff,
            ..
        } => match holder_other_than(state, template) {
            Some(reason) if !as_handoff => {
                out.push(HandoffAction::Refuse { reason });
                state.clone()
            }
            _ => resume(state, template, at, s, &mut out),
        },
        Event::ManualPowerOff { template, hard, .. } => {
            power_off(state, template, *hard, at, s, &mut out)
        }
        Event::Stopped { template, .. } => match state {
            HandoffState::PoweringOff { from, to, .. } if from == template => {
                stopped(from, to.clone(), at, None, s, &mut out)
            }
            HandoffState::Starting { to: t, .. }
            | HandoffState::AwaitingReady { to: t, .. }
            | HandoffState::Running { template: t, .. }
                if t == template =>
            {
                let why = Some("stopped on its own".to_string());
                stopped(t, None, at, why, s, &mut out)
            }
            _ => state.clone(),
        },
        Event::Released { .. } => match state {
            HandoffState::AwaitingRelease {
                from,
                to,
                stopped_ms,
            } if at >= *stopped_ms => {
                record(
                    &mut out,
                    Step::ReleaseConfirmed,
                    Some(from),
                    to.as_deref(),
                    at,
                    None,
                );
                match to {
                    None => HandoffState::Idle {
                        released_ms: Some(at),
                    },
                    Some(to) if s.buffer_ms == 0 => create(to, Some(at), at, &mut out),
                    Some(to) => buffer(to, Some(at), at + s.buffer_ms, at, s, &mut out),
                }
            }
            // The last check after the buffer: start now.
            HandoffState::Buffer {
                to,
                release_confirmed_ms,
                until_ms,
            } if at >= *until_ms => create(to, *release_confirmed_ms, at, &mut out),
            _ => state.clone(),
        },
        Event::StopTimeout { .. } => match state {
            HandoffState::PoweringOff { .. } => force(state, at, s, &mut out),
            _ => state.clone(),
        },
        Event::Timer { .. } => timer(state, at, s, &mut out),
        Event::Started { template, .. } => match state {
            HandoffState::Starting { to, issued_ms, .. } if to == template => {
                record(&mut out, Step::Started, None, Some(to), at, None);
                out.push(HandoffAction::Probe {
                    template: to.clone(),
                });
                out.push(HandoffAction::SetTimer {
                    at_ms: at + s.poll(),
                });
                HandoffState::AwaitingReady {
                    to: to.clone(),
                    issued_ms: *issued_ms,
                    since_ms: at,
                }
            }
            _ => started_outside(state, template, at, s, &mut out),
        },
        Event::StartFailed {
            template, error, ..
        } => match state {
            HandoffState::Starting {
                to,
                attempt,
                issued_ms,
                released_ms,
            } if to == template => {
                let tries = s.limits(to).start_retries + 1;
                let detail = format!("attempt {attempt} of {tries}: {error}");
                record(
                    &mut out,
                    Step::StartFailed,
                    None,
                    Some(to),
                    at,
                    Some(detail),
                );
                if *attempt < tries {
                    // Nothing came on since the release was confirmed.
                    let retry = format!("attempt {} of {tries}", attempt + 1);
                    record(&mut out, Step::StartIssued, None, Some(to), at, Some(retry));
                    out.push(HandoffAction::Create {
                        template: to.clone(),
                    });
                    HandoffState::Starting {
                        to: to.clone(),
                        attempt: attempt + 1,
                        issued_ms: *issued_ms,
                        released_ms: *released_ms,
                    }
                } else {
                    record(
                        &mut out,
                        Step::Failed,
                        None,
                        Some(to),
                        at,
                        Some(error.clone()),
                    );
                    out.push(HandoffAction::Signal(Signal::SliceFailed {
                        template: to.clone(),
                        at_ms: at,
                        error: error.clone(),
                    }));
                    HandoffState::Failed {
                        template: to.clone(),
                        error: error.clone(),
                        at_ms: at,
                    }
                }
            }
            // A VM destroyed while starting never came up: it is off.
            HandoffState::PoweringOff { from, to, .. } if from == template => {
                let why = Some(format!("did not start: {error}"));
                stopped(from, to.clone(), at, why, s, &mut out)
            }
            _ => state.clone(),
        },
        Event::Gone {
            template, error, ..
        } => match state {
            // Only a slice about to start waits for its template: nothing of
            // it runs, so the baseboard is free at once (no retry can help).
            HandoffState::Buffer { to, .. } | HandoffState::Starting { to, .. }
                if to == template =>
            {
                let error = format!("target gone: {error}");
                record(
                    &mut out,
                    Step::TargetGone,
                    None,
                    Some(to),
                    at,
                    Some(error.clone()),
                );
                out.push(HandoffAction::Signal(Signal::SliceFailed {
                    template: to.clone(),
                    at_ms: at,
                    error: error.clone(),
                }));
                HandoffState::Failed {
                    template: to.clone(),
                    error,
                    at_ms: at,
                }
            }
            _ => state.clone(),
        },
        Event::Ready { template, .. } => match state {
            HandoffState::AwaitingReady { to, issued_ms, .. } if to == template => {
                record(&mut out, Step::Ready, None, Some(to), at, None);
                out.push(HandoffAction::Signal(Signal::SliceReady {
                    template: to.clone(),
                    at_ms: at,
                    start_to_ready_ms: at - *issued_ms,
                }));
                HandoffState::Running {
                    template: to.clone(),
                    since_ms: at,
                }
            }
            _ => state.clone(),
        },
    };
    (next, out)
}

// ---- transitions ----

/// `t` should hold the baseboard: start it, or hand over to it.
fn resume(
    state: &HandoffState,
    t: &str,
    at: EpochMs,
    s: &HandoffTimings,
    out: &mut Vec<HandoffAction>,
) -> HandoffState {
    let retarget = |to: &Option<String>| to.as_deref() != Some(t);
    match state {
        HandoffState::Idle { released_ms } => {
            let until = released_ms.map_or(at, |r| at.max(r + s.buffer_ms));
            // The last release carries over: the baseboard's time without
            // a VM is told for a resume long after a power-off too (#52).
            buffer(t, *released_ms, until, at, s, out)
        }
        HandoffState::Failed { .. } => buffer(t, None, at, at, s, out),
        _ if state.on() == Some(t) && !matches!(state, HandoffState::PoweringOff { .. }) => {
            state.clone()
        }
        HandoffState::Running { template: u, .. } | HandoffState::AwaitingReady { to: u, .. } => {
            ask_power_off(u, Some(t), false, at, s, out)
        }
        // A VM still booting has nothing to save: destroy it.
        HandoffState::Starting { to: u, .. } => ask_power_off(u, Some(t), true, at, s, out),
        HandoffState::PoweringOff {
            from,
            to,
            forced,
            since_ms,
        } if retarget(to) => HandoffState::PoweringOff {
            from: from.clone(),
            to: Some(t.to_string()),
            forced: *forced,
            since_ms: *since_ms,
        },
        HandoffState::AwaitingRelease {
            from,
            to,
            stopped_ms,
        } if retarget(to) => HandoffState::AwaitingRelease {
            from: from.clone(),
            to: Some(t.to_string()),
            stopped_ms: *stopped_ms,
        },
        HandoffState::Buffer {
            to,
            release_confirmed_ms,
            until_ms,
        } if to != t => HandoffState::Buffer {
            to: t.to_string(),
            release_confirmed_ms: *release_confirmed_ms,
            until_ms: *until_ms,
        },
        _ => state.clone(),
    }
}

/// `t` should be off (`hard`: destroyed). Works in every state.
fn power_off(
    state: &HandoffState,
    t: &str,
    hard: bool,
    at: EpochMs,
    s: &HandoffTimings,
    out: &mut Vec<HandoffAction>,
) -> HandoffState {
    let mine = |to: &Option<String>| to.as_deref() == Some(t);
    match state {
        HandoffState::Running { template: u, .. } | HandoffState::AwaitingReady { to: u, .. }
            if u == t =>
        {
            ask_power_off(t, None, hard, at, s, out)
        }
        HandoffState::Starting { to: u, .. } if u == t => ask_power_off(t, None, true, at, s, out),
        HandoffState::PoweringOff { from, forced, .. } if from == t => {
            if hard && !forced {
                force(state, at, s, out)
            } else {
                state.clone()
            }
        }
        // `t` was coming next: it no longer is.
        HandoffState::PoweringOff {
            from,
            to,
            forced,
            since_ms,
        } if mine(to) => HandoffState::PoweringOff {
            from: from.clone(),
            to: None,
            forced: *forced,
            since_ms: *since_ms,
        },
        HandoffState::AwaitingRelease {
            from,
            to,
            stopped_ms,
        } if mine(to) => HandoffState::AwaitingRelease {
            from: from.clone(),
            to: None,
            stopped_ms: *stopped_ms,
        },
        HandoffState::Buffer {
            to,
            release_confirmed_ms,
            ..
        } if to == t => HandoffState::Idle {
            released_ms: *release_confirmed_ms,
        },
        _ => state.clone(),
    }
}

fn ask_power_off(
    from: &str,
    to: Option<&str>,
    hard: bool,
    at: EpochMs,
    s: &HandoffTimings,
    out: &mut Vec<HandoffAction>,
) -> HandoffState {
    let template = from.to_string();
    if hard {
        record(
            out,
            Step::Forced,
            Some(from),
            to,
            at,
            Some("hard power-off".into()),
        );
        out.push(HandoffAction::Destroy { template });
    } else {
        record(out, Step::PowerOffAsked, Some(from), to, at, None);
        out.push(HandoffAction::Shutdown { template });
    }
    out.push(HandoffAction::SetTimer {
        at_ms: at + s.limits(from).stop_timeout_ms,
    });
    HandoffState::PoweringOff {
        from: from.to_string(),
        to: to.map(str::to_string),
        forced: hard,
        since_ms: at,
    }
}

/// `t` was started behind the daemon's back (`virsh start`). Another VM
/// already on keeps the baseboard and the newcomer is destroyed; otherwise
/// `t` is taken as holding it, and powered off if another should.
fn started_outside(
    state: &HandoffState,
    t: &str,
    at: EpochMs,
    s: &HandoffTimings,
    out: &mut Vec<HandoffAction>,
) -> HandoffState {
    match state.on() {
        Some(u) if u == t => state.clone(),
        Some(u) => {
            let why = format!("started outside Astraeus while {u} holds the baseboard");
            // `to`: who holds the baseboard once the machine settles (not
            // u, when u is being powered off), so a restart right after
            // this still wants it.
            record(out, Step::Destroyed, Some(t), state.target(), at, Some(why));
            out.push(HandoffAction::Destroy {
                template: t.to_string(),
            });
            state.clone()
        }
        None => {
            let why = Some("started outside Astraeus".to_string());
            record(out, Step::Started, None, Some(t), at, why);
            out.push(HandoffAction::Signal(Signal::SliceStarted {
                template: t.to_string(),
                at_ms: at,
                dead_time_ms: None,
            }));
            match state.target() {
                Some(next) if next != t => ask_power_off(t, Some(next), false, at, s, out),
                _ => {
                    out.push(HandoffAction::Probe {
                        template: t.to_string(),
                    });
                    out.push(HandoffAction::SetTimer {
                        at_ms: at + s.poll(),
                    });
                    HandoffState::AwaitingReady {
                        to: t.to_string(),
                        issued_ms: at,
                        since_ms: at,
                    }
                }
            }
        }
    }
}

/// Destroys the VM being powered off; again after each timeout, in case
/// libvirt could not (a device busy).
fn force(
    state: &HandoffState,
    at: EpochMs,
    s: &HandoffTimings,
    out: &mut Vec<HandoffAction>,
) -> HandoffState {
    let HandoffState::PoweringOff {
        from, to, forced, ..
    } = state
    else {
        return state.clone();
    };
    let timeout = s.limits(from).stop_timeout_ms;
    let why = if *forced {
        "destroy asked again".to_string()
    } else {
        format!("did not stop within {} s", timeout / 1000)
    };
    record(out, Step::Forced, Some(from), to.as_deref(), at, Some(why));
    out.push(HandoffAction::Destroy {
        template: from.clone(),
    });
    out.push(HandoffAction::SetTimer {
        at_ms: at + timeout,
    });
    HandoffState::PoweringOff {
        from: from.clone(),
        to: to.clone(),
        forced: true,
        since_ms: at,
    }
}

fn timer(
    state: &HandoffState,
    at: EpochMs,
    s: &HandoffTimings,
    out: &mut Vec<HandoffAction>,
) -> HandoffState {
    match state {
        HandoffState::PoweringOff { from, since_ms, .. } => {
            let deadline = *since_ms + s.limits(from).stop_timeout_ms;
            if at >= deadline {
                return force(state, at, s, out);
            }
            out.push(HandoffAction::SetTimer { at_ms: deadline });
        }
        HandoffState::AwaitingRelease { .. } => check_release_soon(at, s, out),
        HandoffState::Buffer { until_ms, .. } if at >= *until_ms => check_release_soon(at, s, out),
        HandoffState::Buffer { until_ms, .. } => {
            out.push(HandoffAction::SetTimer { at_ms: *until_ms })
        }
        HandoffState::AwaitingReady { to, .. } => {
            out.push(HandoffAction::Probe {
                template: to.clone(),
            });
            out.push(HandoffAction::SetTimer {
                at_ms: at + s.poll(),
            });
        }
        _ => {}
    }
    state.clone()
}

/// `from` is off: its slice ends; the baseboard is free once released.
pub(super) fn stopped(
    from: &str,
    to: Option<String>,
    at: EpochMs,
    why: Option<String>,
    s: &HandoffTimings,
    out: &mut Vec<HandoffAction>,
) -> HandoffState {
    record(out, Step::Stopped, Some(from), to.as_deref(), at, why);
    out.push(HandoffAction::Signal(Signal::SliceEnded {
        template: from.to_string(),
        at_ms: at,
    }));
    check_release_soon(at, s, out);
    HandoffState::AwaitingRelease {
        from: from.to_string(),
        to,
        stopped_ms: at,
    }
}

pub(super) fn check_release_soon(at: EpochMs, s: &HandoffTimings, out: &mut Vec<HandoffAction>) {
    out.push(HandoffAction::CheckRelease);
    out.push(HandoffAction::SetTimer {
        at_ms: at + s.poll(),
    });
}

/// Waits until `until`, then checks the release once more before starting.
pub(super) fn buffer(
    to: &str,
    release_confirmed_ms: Option<EpochMs>,
    until: EpochMs,
    at: EpochMs,
    s: &HandoffTimings,
    out: &mut Vec<HandoffAction>,
) -> HandoffState {
    if until <= at {
        check_release_soon(at, s, out);
    } else {
        out.push(HandoffAction::SetTimer { at_ms: until });
    }
    HandoffState::Buffer {
        to: to.to_string(),
        release_confirmed_ms,
        until_ms: until,
    }
}

/// Only ever called in the step that handled a `Released`.
fn create(
    to: &str,
    released_ms: Option<EpochMs>,
    at: EpochMs,
    out: &mut Vec<HandoffAction>,
) -> HandoffState {
    record(out, Step::StartIssued, None, Some(to), at, None);
    out.push(HandoffAction::Create {
        template: to.to_string(),
    });
    out.push(HandoffAction::Signal(Signal::SliceStarted {
        template: to.to_string(),
        at_ms: at,
        dead_time_ms: released_ms.map(|r| at - r),
    }));
    HandoffState::Starting {
        to: to.to_string(),
        attempt: 1,
        issued_ms: at,
        released_ms,
    }
}

/// Why a plain manual resume of `t` is refused: another template holds
/// the baseboard, or is about to.
fn holder_other_than(state: &HandoffState, t: &str) -> Option<String> {
    let holder = match state {
        HandoffState::Starting { to, .. } | HandoffState::AwaitingReady { to, .. } => Some(to),
        HandoffState::Running { template, .. } => Some(template),
        _ => None,
    };
    if let Some(u) = holder.filter(|u| *u != t) {
        return Some(format!(
            "template {u} holds the GPU baseboard; resume {t} as a handoff to take it over"
        ));
    }
    match state.target() {
        Some(u) if u != t => Some(format!(
            "the GPU baseboard is being handed over to template {u}; resume {t} as a \
             handoff to take it over"
        )),
        _ => None,
    }
}

pub(super) fn record(
    out: &mut Vec<HandoffAction>,
    step: Step,
    from: Option<&str>,
    to: Option<&str>,
    at_ms: EpochMs,
    detail: Option<String>,
) {
    out.push(HandoffAction::Record(Record {
        step,
        from: from.map(str::to_string),
        to: to.map(str::to_string),
        at_ms,
        detail,
    }));
}
