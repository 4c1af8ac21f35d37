//! Start-up after a crash: what converge and resume_from make of the
//! ledger's last record and the VMs found on.

use super::*;

/// The `destroyed` step among these actions.
pub(super) fn destroyed_step(actions: &[HandoffAction]) -> Record {
    actions
        .iter()
        .find_map(|a| match a {
            HandoffAction::Record(r) if r.step == Step::Destroyed => Some(r.clone()),
            _ => None,
        })
        .expect("the newcomer's destroy is recorded")
}

fn record_of(step: Step, from: Option<&str>, to: Option<&str>, at_ms: u64) -> Record {
    Record {
        step,
        from: from.map(str::to_string),
        to: to.map(str::to_string),
        at_ms: EpochMs(at_ms),
        detail: None,
    }
}

/// Whether `actions` record a start or begin a slice.
fn starts_a_slice(actions: &[HandoffAction]) -> bool {
    actions.iter().any(|a| {
        matches!(
            a,
            HandoffAction::Record(Record {
                step: Step::Started,
                ..
            }) | HandoffAction::Signal(Signal::SliceStarted { .. })
        )
    })
}

/// The newcomer's destroy is the ledger's last step when the daemon
/// restarts (no schedule): the holder is still wanted, not powered off,
/// and the handoff resumes from the step before the destroy (the
/// ledger's `last_state_step` skips it), so b's slice goes on: it was
/// recorded as found running again, a slice begun anew.
#[test]
fn a_restart_after_a_newcomer_was_destroyed_keeps_the_holder() {
    let s = settings(0);
    let started = Event::Started {
        template: "a".into(),
        at_ms: EpochMs(5),
    };
    let (_, actions) = step(&running("b"), &started, &s);
    let destroyed = destroyed_step(&actions);
    assert_eq!(destroyed.to.as_deref(), Some("b"));
    let on = ["b".to_string()];
    let want = wanted_without_schedule(Some(&destroyed), &on);
    assert_eq!(want.as_deref(), Some("b"));
    let ready = record_of(Step::Ready, None, Some("b"), 2);
    let (state, actions) = converge(want.as_deref(), &on, Some(&ready), EpochMs(9), &s);
    assert!(matches!(&state, HandoffState::Running { template, .. } if template == "b"));
    assert!(actions.is_empty(), "{actions:?}");
}

/// The same while the holder is being powered off (by a person, or for
/// another): the restart finishes that, rather than keeping the holder.
#[test]
fn a_restart_after_a_newcomer_was_destroyed_mid_power_off_finishes_it() {
    let s = settings(0);
    let started = Event::Started {
        template: "a".into(),
        at_ms: EpochMs(5),
    };
    for next in [None, Some("c")] {
        let powering_off = HandoffState::PoweringOff {
            from: "b".into(),
            to: next.map(str::to_string),
            forced: false,
            since_ms: EpochMs(1),
        };
        let (_, actions) = step(&powering_off, &started, &s);
        let destroyed = destroyed_step(&actions);
        assert_eq!(destroyed.to.as_deref(), next);
        let on = ["b".to_string()];
        let want = wanted_without_schedule(Some(&destroyed), &on);
        assert_eq!(want.as_deref(), next);
        let asked = record_of(Step::PowerOffAsked, Some("b"), next, 1);
        let (state, actions) = converge(want.as_deref(), &on, Some(&asked), EpochMs(9), &s);
        assert!(
            matches!(&state, HandoffState::PoweringOff { from, to, .. }
                    if from == "b" && to.as_deref() == next),
            "{next:?}: {state:?}"
        );
        assert!(!starts_a_slice(&actions), "{actions:?}");
    }
}

/// A newcomer whose destroy a crash cut short is on beside the holder
/// at the restart, and sorts first: the one the ledger last had on is
/// kept (its power-off finished), the newcomer destroyed again, and
/// the record names who holds the baseboard once settled (the next, or
/// none). Any VM on was kept (the first by name): the newcomer was
/// taken for found running, a slice begun for it, and the holder
/// destroyed with its slice left open.
#[test]
fn a_restart_keeps_the_vm_the_ledger_had_on_not_a_newcomer() {
    let s = settings(0);
    let on = ["a".to_string(), "b".to_string()];
    for next in [None, Some("c")] {
        let asked = record_of(Step::PowerOffAsked, Some("b"), next, 1);
        let (state, actions) = converge(next, &on, Some(&asked), EpochMs(9), &s);
        assert!(
            matches!(&state, HandoffState::PoweringOff { from, to, .. }
                    if from == "b" && to.as_deref() == next),
            "{next:?}: {state:?}"
        );
        let destroyed = destroyed_step(&actions);
        assert_eq!(
            (destroyed.from.as_deref(), destroyed.to.as_deref()),
            (Some("a"), next)
        );
        assert!(!starts_a_slice(&actions), "{actions:?}");
    }
}

/// Two VMs found on at a start: the one not kept is destroyed, named as
/// such (not a forced power-off of the holder), its slice closed, and names who holds the
/// baseboard once settled: a restart after it neither powers the one
/// kept off nor finds it running anew.
#[test]
fn a_second_vm_found_on_is_destroyed_and_a_restart_after_keeps_the_first() {
    let s = settings(0);
    let on = ["b".to_string(), "a".to_string()];
    let (state, actions) = converge(Some("b"), &on, None, EpochMs(5), &s);
    let destroyed = destroyed_step(&actions);
    assert_eq!(
        (destroyed.from.as_deref(), destroyed.to.as_deref()),
        (Some("a"), Some("b"))
    );
    assert_eq!(state.on(), Some("b"));
    // a's slice, if it had one open, ends with it (and only a's).
    let closed: Vec<&HandoffAction> = actions
        .iter()
        .filter(|a| matches!(a, HandoffAction::CloseSlice { .. }))
        .collect();
    assert_eq!(
        closed,
        [&HandoffAction::CloseSlice {
            template: "a".into(),
            at_ms: EpochMs(5),
            error: Some(
                "destroyed at a start: on together with b; exactly one template VM may be on"
                    .into()
            ),
        }]
    );
    // The ledger then holds a's destroy, then b's start (found running):
    // a restart resumes from the start (last_state_step skips the destroy).
    let found = actions
        .iter()
        .find_map(|a| match a {
            HandoffAction::Record(r) if r.step == Step::Started => Some(r.clone()),
            _ => None,
        })
        .expect("b found running");
    let want = wanted_without_schedule(Some(&destroyed), &on[..1]);
    assert_eq!(want.as_deref(), Some("b"));
    let (state, actions) = converge(want.as_deref(), &on[..1], Some(&found), EpochMs(9), &s);
    assert_eq!(state.on(), Some("b"));
    assert!(!starts_a_slice(&actions), "{actions:?}");
}

/// The holder went off while the daemon was down and another VM was
/// started: the holder's slice ends (a `stopped` step, SliceEnded)
/// before the other is found running; it stayed open.
#[test]
fn a_holder_found_off_with_another_on_has_its_slice_ended() {
    let s = settings(0);
    let on = ["b".to_string()];
    for last in [
        record_of(Step::Ready, None, Some("a"), 2),
        record_of(Step::PowerOffAsked, Some("a"), Some("b"), 2),
    ] {
        let (state, actions) = converge(Some("b"), &on, Some(&last), EpochMs(9), &s);
        assert_eq!(state.on(), Some("b"));
        let ended = actions
            .iter()
            .position(|a| {
                a == &HandoffAction::Signal(Signal::SliceEnded {
                    template: "a".into(),
                    at_ms: EpochMs(9),
                })
            })
            .expect("a's slice ends");
        let stopped = actions
                .iter()
                .position(|a| matches!(a, HandoffAction::Record(r) if r.step == Step::Stopped && r.from.as_deref() == Some("a")))
                .expect("a's stop recorded");
        let found = actions
                .iter()
                .position(|a| matches!(a, HandoffAction::Record(r) if r.step == Step::Started && r.to.as_deref() == Some("b")))
                .expect("b found running");
        assert!(stopped < ended && ended < found, "{actions:?}");
    }
    // b's own start in flight: nothing of a's to end.
    let issued = record_of(Step::StartIssued, Some("a"), Some("b"), 2);
    let (_, actions) = converge(Some("b"), &on, Some(&issued), EpochMs(9), &s);
    let ends = |actions: &[HandoffAction]| {
        actions
            .iter()
            .any(|a| matches!(a, HandoffAction::Signal(Signal::SliceEnded { .. })))
    };
    assert!(!ends(&actions), "{actions:?}");
    // a on as well: destroyed, its slice closed as such, not "found off".
    let both = ["b".to_string(), "a".to_string()];
    let ready = record_of(Step::Ready, None, Some("a"), 2);
    let (_, actions) = converge(Some("b"), &both, Some(&ready), EpochMs(9), &s);
    assert!(!ends(&actions), "{actions:?}");
    assert_eq!(destroyed_step(&actions).from.as_deref(), Some("a"));
    // Killed after a's stop was recorded, before its slice closed: the
    // next start closes it.
    let stopped = record_of(Step::Stopped, Some("a"), Some("b"), 5);
    let (_, actions) = resume_from(Some(&stopped), Some("b"), EpochMs(9), &s);
    assert!(
        actions.contains(&HandoffAction::CloseSlice {
            template: "a".into(),
            at_ms: EpochMs(5),
            error: None
        }),
        "{actions:?}"
    );
}

#[test]
fn a_resume_during_a_poweroff_changes_only_who_comes_next() {
    let s = settings(0);
    let p = HandoffState::PoweringOff {
        from: "a".into(),
        to: Some("b".into()),
        forced: false,
        since_ms: EpochMs(0),
    };
    let (state, actions) = step(&p, &due(Scheduled::Resume, "c", 5), &s);
    assert_eq!(actions, [requested(Some("c"), 5)], "only recorded");
    // The same again changes nothing, and records nothing.
    assert_eq!(step(&state, &due(Scheduled::Resume, "c", 6), &s).1, []);
    assert_eq!(state.target(), Some("c"));
    assert_eq!(state.on(), Some("a"));
    assert_eq!(state.state_of("a"), VmState::Stopping);
    assert_eq!(state.state_of("c"), VmState::Waiting);
    assert_eq!(state.state_of("b"), VmState::Off);
}

fn rec(step: Step, from: Option<&str>, to: Option<&str>, at_ms: u64) -> Record {
    Record {
        step,
        from: from.map(Into::into),
        to: to.map(Into::into),
        at_ms: EpochMs(at_ms),
        detail: None,
    }
}

/// A daemon stopped between recording a slice's end and closing it in
/// the ledger closes it at start-up, at the recorded time.
#[test]
fn a_restart_closes_the_slice_whose_end_was_recorded() {
    let s = settings(300_000);
    let stopped = rec(Step::Stopped, Some("a"), Some("b"), 7_000);
    let (state, actions) = resume_from(Some(&stopped), None, EpochMs(9_000), &s);
    assert!(
        matches!(state, HandoffState::AwaitingRelease { .. }),
        "{state:?}"
    );
    assert!(actions.contains(&HandoffAction::CloseSlice {
        template: "a".into(),
        at_ms: EpochMs(7_000),
        error: None
    }));
    let mut failed = rec(Step::Failed, None, Some("b"), 8_000);
    failed.detail = Some("no such domain".into());
    let (_, actions) = resume_from(Some(&failed), None, EpochMs(9_000), &s);
    assert!(actions.contains(&HandoffAction::CloseSlice {
        template: "b".into(),
        at_ms: EpochMs(8_000),
        error: Some("no such domain".into())
    }));
}

#[test]
fn a_restart_finishes_the_recorded_handoff() {
    let s = settings(300_000);
    // Killed while powering a off: asked again, the deadline kept.
    let asked = rec(Step::PowerOffAsked, Some("a"), Some("b"), 1_000);
    let (state, actions) = resume_from(Some(&asked), Some("a"), EpochMs(5_000), &s);
    assert_eq!(
        state,
        HandoffState::PoweringOff {
            from: "a".into(),
            to: Some("b".into()),
            forced: false,
            since_ms: EpochMs(1_000)
        }
    );
    assert_eq!(
        actions,
        [
            HandoffAction::Shutdown {
                template: "a".into()
            },
            HandoffAction::SetTimer {
                at_ms: EpochMs(61_000)
            }
        ]
    );
    // It stopped while we were down: release is checked.
    let (state, actions) = resume_from(Some(&asked), None, EpochMs(5_000), &s);
    assert!(matches!(
        state,
        HandoffState::AwaitingRelease {
            stopped_ms: EpochMs(5_000),
            ..
        }
    ));
    assert_eq!(steps(&actions), ["stopped"]);
    assert!(has(&actions, &HandoffAction::CheckRelease));
    // Release was confirmed: the buffer counts from then.
    let released = rec(Step::ReleaseConfirmed, Some("a"), Some("b"), 2_000);
    let (state, actions) = resume_from(Some(&released), None, EpochMs(5_000), &s);
    assert_eq!(
        state,
        HandoffState::Buffer {
            to: "b".into(),
            release_confirmed_ms: Some(EpochMs(2_000)),
            until_ms: EpochMs(302_000)
        }
    );
    assert_eq!(
        actions,
        [HandoffAction::SetTimer {
            at_ms: EpochMs(302_000)
        }]
    );
    // A create that may not have run: checked again before redoing it.
    let issued = rec(Step::StartIssued, None, Some("b"), 302_000);
    let (state, actions) = resume_from(Some(&issued), None, EpochMs(303_000), &s);
    assert!(matches!(
        state,
        HandoffState::Buffer {
            until_ms: EpochMs(303_000),
            ..
        }
    ));
    assert_eq!(actions[0], HandoffAction::CheckRelease);
    // It did run: probe it.
    let (state, actions) = resume_from(Some(&issued), Some("b"), EpochMs(303_000), &s);
    assert!(matches!(
        state,
        HandoffState::AwaitingReady {
            issued_ms: EpochMs(302_000),
            ..
        }
    ));
    assert!(has(
        &actions,
        &HandoffAction::Probe {
            template: "b".into()
        }
    ));
    let ready = rec(Step::Ready, None, Some("b"), 310_000);
    assert_eq!(
        resume_from(Some(&ready), Some("b"), EpochMs(400_000), &s).0,
        running_since("b", 310_000)
    );
}

#[test]
fn converge_goes_straight_to_what_is_wanted_now() {
    let s = settings(0);
    let ready_a = rec(Step::Ready, None, Some("a"), 1_000);
    // Down for days; the schedule now says c: a hands over to c, once.
    let (state, actions) = converge(
        Some("c"),
        &["a".into()],
        Some(&ready_a),
        EpochMs(9_000_000),
        &s,
    );
    assert!(matches!(
        &state,
        HandoffState::PoweringOff { from, to: Some(to), .. } if from == "a" && to == "c"
    ));
    assert_eq!(steps(&actions), ["power-off-asked"]);
    // Nothing wanted: the holder is powered off.
    let (state, _) = converge(None, &["a".into()], Some(&ready_a), EpochMs(9_000_000), &s);
    assert_eq!(state.target(), None);
    // Already as wanted: nothing at all.
    let (state, actions) = converge(
        Some("a"),
        &["a".into()],
        Some(&ready_a),
        EpochMs(9_000_000),
        &s,
    );
    assert_eq!(state, running_since("a", 1_000));
    assert!(actions.is_empty());
    // Two on (someone else's doing): all but the wanted one destroyed.
    let (state, actions) = converge(
        Some("b"),
        &["a".into(), "b".into()],
        Some(&ready_a),
        EpochMs(9_000_000),
        &s,
    );
    assert_eq!(state.on(), Some("b"));
    assert!(has(
        &actions,
        &HandoffAction::Destroy {
            template: "a".into()
        }
    ));
    assert!(!has(
        &actions,
        &HandoffAction::Destroy {
            template: "b".into()
        }
    ));
    // Nothing on, something wanted: a release check first, never a create.
    let (state, actions) = converge(Some("b"), &[], None, EpochMs(9_000_000), &s);
    assert!(matches!(state, HandoffState::Buffer { .. }));
    assert!(!actions
        .iter()
        .any(|a| matches!(a, HandoffAction::Create { .. })));
}

#[test]
fn steps_have_stable_names() {
    for (step, name) in STEPS {
        assert_eq!(step.as_str(), name);
        assert_eq!(Step::parse(name), Some(step));
    }
    assert_eq!(Step::parse("nope"), None);
}
