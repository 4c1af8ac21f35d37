use super::*;

fn settings(buffer_ms: u64) -> HandoffTimings {
    HandoffTimings {
        buffer_ms,
        poll_ms: 1_000,
        limits: Limits {
            stop_timeout_ms: 60_000,
            start_retries: 1,
        },
        per_template: BTreeMap::new(),
    }
}

fn due(action: Scheduled, t: &str, at_ms: u64) -> Event {
    action.at(t, EpochMs(at_ms))
}

fn running(t: &str) -> HandoffState {
    HandoffState::Running {
        template: t.into(),
        since_ms: EpochMs(0),
    }
}

fn steps(actions: &[HandoffAction]) -> Vec<&'static str> {
    actions
        .iter()
        .filter_map(|a| match a {
            HandoffAction::Record(r) => Some(r.step.as_str()),
            _ => None,
        })
        .collect()
}

fn has(actions: &[HandoffAction], want: &HandoffAction) -> bool {
    actions.contains(want)
}

fn create(t: &str) -> HandoffAction {
    HandoffAction::Create { template: t.into() }
}

/// Feeds events in order, returning the last state and all actions.
fn run(
    state: HandoffState,
    events: &[Event],
    s: &HandoffTimings,
) -> (HandoffState, Vec<HandoffAction>) {
    let mut state = state;
    let mut all = Vec::new();
    for e in events {
        let (next, actions) = step(&state, e, s);
        state = next;
        all.extend(actions);
    }
    (state, all)
}

#[test]
fn a_handoff_runs_every_step_in_order_with_its_timings() {
    let s = settings(300_000);
    let stopped = |at_ms| Event::Stopped {
        template: "a".into(),
        at_ms,
    };
    let (state, actions) = run(
        running("a"),
        &[
            due(Scheduled::Resume, "b", 1_000),
            stopped(EpochMs(21_000)),
            Event::Released {
                at_ms: EpochMs(22_000),
            },
            Event::Timer {
                at_ms: EpochMs(100_000),
            }, // early: re-armed
            Event::Timer {
                at_ms: EpochMs(322_000),
            },
            Event::Released {
                at_ms: EpochMs(322_500),
            },
            Event::Started {
                template: "b".into(),
                at_ms: EpochMs(330_000),
            },
            Event::Ready {
                template: "b".into(),
                at_ms: EpochMs(400_000),
            },
        ],
        &s,
    );
    assert_eq!(state, running_since("b", 400_000));
    assert_eq!(
        steps(&actions),
        [
            "power-off-asked",
            "stopped",
            "release-confirmed",
            "start-issued",
            "started",
            "ready"
        ]
    );
    assert!(has(
        &actions,
        &HandoffAction::Shutdown {
            template: "a".into()
        }
    ));
    assert!(has(
        &actions,
        &HandoffAction::SetTimer {
            at_ms: EpochMs(61_000)
        }
    ));
    assert!(has(
        &actions,
        &HandoffAction::SetTimer {
            at_ms: EpochMs(322_000)
        }
    ));
    assert!(has(
        &actions,
        &HandoffAction::Signal(Signal::SliceEnded {
            template: "a".into(),
            at_ms: EpochMs(21_000)
        })
    ));
    assert!(has(
        &actions,
        &HandoffAction::Signal(Signal::SliceStarted {
            template: "b".into(),
            at_ms: EpochMs(322_500),
            dead_time_ms: Some(300_500)
        })
    ));
    assert!(has(
        &actions,
        &HandoffAction::Signal(Signal::SliceReady {
            template: "b".into(),
            at_ms: EpochMs(400_000),
            start_to_ready_ms: 77_500
        })
    ));
}

fn running_since(t: &str, since_ms: u64) -> HandoffState {
    HandoffState::Running {
        template: t.into(),
        since_ms: EpochMs(since_ms),
    }
}

#[test]
fn no_create_before_release_or_during_the_buffer() {
    let s = settings(300_000);
    let off = HandoffState::AwaitingRelease {
        from: "a".into(),
        to: Some("b".into()),
        stopped_ms: EpochMs(10_000),
    };
    // A check answered before the stop, and timers, start nothing.
    let (state, actions) = run(
        off.clone(),
        &[
            Event::Released {
                at_ms: EpochMs(9_000),
            },
            Event::Timer {
                at_ms: EpochMs(11_000),
            },
        ],
        &s,
    );
    assert_eq!(state, off);
    assert!(!actions
        .iter()
        .any(|a| matches!(a, HandoffAction::Create { .. })));
    assert!(has(&actions, &HandoffAction::CheckRelease));
    // Released inside the buffer: still waiting.
    let (state, actions) = run(
        off,
        &[
            Event::Released {
                at_ms: EpochMs(12_000),
            },
            Event::Released {
                at_ms: EpochMs(13_000),
            },
        ],
        &s,
    );
    assert!(matches!(
        state,
        HandoffState::Buffer {
            until_ms: EpochMs(312_000),
            ..
        }
    ));
    assert!(!actions
        .iter()
        .any(|a| matches!(a, HandoffAction::Create { .. })));
}

#[test]
fn a_zero_buffer_starts_on_the_release() {
    let s = settings(0);
    let (state, actions) = step(
        &HandoffState::AwaitingRelease {
            from: "a".into(),
            to: Some("b".into()),
            stopped_ms: EpochMs(5),
        },
        &Event::Released { at_ms: EpochMs(7) },
        &s,
    );
    assert!(matches!(
        state,
        HandoffState::Starting {
            attempt: 1,
            issued_ms: EpochMs(7),
            ..
        }
    ));
    assert_eq!(steps(&actions), ["release-confirmed", "start-issued"]);
    assert!(has(&actions, &create("b")));
    // From idle, a resume checks the release first, then starts.
    let (state, actions) = run(
        HandoffState::Idle { released_ms: None },
        &[
            due(Scheduled::Resume, "a", 100),
            Event::Released {
                at_ms: EpochMs(100),
            },
        ],
        &s,
    );
    assert!(matches!(state, HandoffState::Starting { .. }));
    assert_eq!(actions[0], requested(Some("a"), 100));
    assert_eq!(actions[1], HandoffAction::CheckRelease);
    assert!(has(
        &actions,
        &HandoffAction::Signal(Signal::SliceStarted {
            template: "a".into(),
            at_ms: EpochMs(100),
            dead_time_ms: None
        })
    ));
    // A resume long after a power-off (the seed's usual scheduled
    // pair) tells the time the baseboard had no VM (#52).
    let (_, actions) = run(
        HandoffState::Idle {
            released_ms: Some(EpochMs(40)),
        },
        &[
            due(Scheduled::Resume, "a", 100),
            Event::Released {
                at_ms: EpochMs(100),
            },
        ],
        &s,
    );
    assert!(has(
        &actions,
        &HandoffAction::Signal(Signal::SliceStarted {
            template: "a".into(),
            at_ms: EpochMs(100),
            dead_time_ms: Some(60)
        })
    ));
}

#[test]
fn a_resume_soon_after_a_poweroff_waits_out_the_buffer() {
    let s = settings(300_000);
    let (state, actions) = step(
        &HandoffState::Idle {
            released_ms: Some(EpochMs(1_000)),
        },
        &due(Scheduled::Resume, "b", 60_000),
        &s,
    );
    assert_eq!(
        state,
        HandoffState::Buffer {
            to: "b".into(),
            release_confirmed_ms: Some(EpochMs(1_000)),
            until_ms: EpochMs(301_000)
        }
    );
    // Recorded: a restart while it waits must still start b.
    assert_eq!(
        actions,
        [
            requested(Some("b"), 60_000),
            HandoffAction::SetTimer {
                at_ms: EpochMs(301_000)
            }
        ]
    );
}

#[test]
fn after_a_restart_the_last_record_says_who_is_wanted() {
    let r = |step, from: Option<&str>, to: Option<&str>| Record {
        step,
        from: from.map(str::to_string),
        to: to.map(str::to_string),
        at_ms: EpochMs(0),
        detail: None,
    };
    let on = vec!["a".to_string()];
    // A power-off by hand, killed midway: it stays off.
    let off = r(Step::PowerOffAsked, Some("a"), None);
    assert_eq!(wanted_without_schedule(Some(&off), &on), None);
    // A handoff under way, or a request waiting out the buffer, finishes.
    let handoff = r(Step::PowerOffAsked, Some("a"), Some("b"));
    assert_eq!(
        wanted_without_schedule(Some(&handoff), &on).as_deref(),
        Some("b")
    );
    let request = r(Step::Requested, None, Some("c"));
    assert_eq!(
        wanted_without_schedule(Some(&request), &[]).as_deref(),
        Some("c")
    );
    // After a failed slice, or on a fresh ledger: what is on is kept.
    let failed = r(Step::Failed, None, Some("b"));
    assert_eq!(
        wanted_without_schedule(Some(&failed), &on).as_deref(),
        Some("a")
    );
    assert_eq!(wanted_without_schedule(None, &on).as_deref(), Some("a"));
    // Two on at start-up, a fresh ledger and no schedule: the one on
    // first is wanted, the other destroyed; the record names who
    // stays, so a restart right after still wants it.
    let both = ["a".to_string(), "b".to_string()];
    let want = wanted_without_schedule(None, &both);
    let (_, actions) = converge(want.as_deref(), &both, None, EpochMs(5), &settings(0));
    let destroyed = destroyed_step(&actions);
    assert_eq!(
        (destroyed.from.as_deref(), destroyed.to.as_deref()),
        (Some("b"), Some("a"))
    );
    assert_eq!(
        wanted_without_schedule(Some(&destroyed), &["a".into()]).as_deref(),
        Some("a")
    );
    // With none wanted (a schedule's off time), it names none: the
    // one kept is powered off next.
    let (state, actions) = converge(None, &both, None, EpochMs(5), &settings(0));
    assert_eq!(destroyed_step(&actions).to, None);
    assert_eq!(state.target(), None);
}

fn requested(to: Option<&str>, at_ms: u64) -> HandoffAction {
    HandoffAction::Record(Record {
        step: Step::Requested,
        from: None,
        to: to.map(str::to_string),
        at_ms: EpochMs(at_ms),
        detail: None,
    })
}

#[test]
fn a_guest_that_ignores_acpi_is_destroyed_after_the_timeout() {
    let s = settings(0);
    let (state, _) = step(&running("a"), &due(Scheduled::Poweroff, "a", 0), &s);
    // Before the deadline: re-armed, nothing forced.
    let (state, actions) = step(
        &state,
        &Event::Timer {
            at_ms: EpochMs(30_000),
        },
        &s,
    );
    assert_eq!(
        actions,
        [HandoffAction::SetTimer {
            at_ms: EpochMs(60_000)
        }]
    );
    let (state, actions) = step(
        &state,
        &Event::Timer {
            at_ms: EpochMs(60_000),
        },
        &s,
    );
    assert!(matches!(
        state,
        HandoffState::PoweringOff { forced: true, .. }
    ));
    assert!(has(
        &actions,
        &HandoffAction::Destroy {
            template: "a".into()
        }
    ));
    match &actions[0] {
        HandoffAction::Record(r) => {
            assert_eq!(r.step, Step::Forced);
            assert_eq!(r.detail.as_deref(), Some("did not stop within 60 s"));
        }
        other => panic!("{other:?}"),
    }
    // Destroy is asked again if the VM still does not stop.
    let (_, actions) = step(
        &state,
        &Event::Timer {
            at_ms: EpochMs(120_000),
        },
        &s,
    );
    assert!(has(
        &actions,
        &HandoffAction::Destroy {
            template: "a".into()
        }
    ));
    // StopTimeout forces at once.
    let (_, actions) = step(
        &HandoffState::PoweringOff {
            from: "a".into(),
            to: None,
            forced: false,
            since_ms: EpochMs(0),
        },
        &Event::StopTimeout { at_ms: EpochMs(1) },
        &s,
    );
    assert!(has(
        &actions,
        &HandoffAction::Destroy {
            template: "a".into()
        }
    ));
}

#[test]
fn poweroff_hard_destroys_and_escalates_a_graceful_one() {
    let s = settings(0);
    let (state, actions) = step(&running("a"), &due(Scheduled::PoweroffHard, "a", 5), &s);
    assert!(matches!(
        state,
        HandoffState::PoweringOff { forced: true, .. }
    ));
    assert_eq!(steps(&actions), ["forced"]);
    assert!(has(
        &actions,
        &HandoffAction::Destroy {
            template: "a".into()
        }
    ));
    let graceful = HandoffState::PoweringOff {
        from: "a".into(),
        to: None,
        forced: false,
        since_ms: EpochMs(0),
    };
    let (state, actions) = step(
        &graceful,
        &Event::ManualPowerOff {
            template: "a".into(),
            hard: true,
            at_ms: EpochMs(9),
        },
        &s,
    );
    assert!(matches!(
        state,
        HandoffState::PoweringOff { forced: true, .. }
    ));
    assert!(has(
        &actions,
        &HandoffAction::Destroy {
            template: "a".into()
        }
    ));
}

#[test]
fn a_target_that_is_gone_ends_the_handoff_at_once_with_the_baseboard_free() {
    let s = settings(0);
    let starting = HandoffState::Starting {
        to: "b".into(),
        attempt: 1,
        issued_ms: EpochMs(0),
        released_ms: None,
    };
    let gone = Event::Gone {
        template: "b".into(),
        error: "its domain tmpl-b is not defined in libvirt".into(),
        at_ms: EpochMs(5),
    };
    let (state, actions) = step(&starting, &gone, &s);
    let error = "target gone: its domain tmpl-b is not defined in libvirt";
    assert_eq!(
        state,
        HandoffState::Failed {
            template: "b".into(),
            error: error.into(),
            at_ms: EpochMs(5)
        }
    );
    // No retry: one record, and nothing started.
    assert_eq!(steps(&actions), ["target-gone"]);
    assert!(!actions
        .iter()
        .any(|a| matches!(a, HandoffAction::Create { .. })));
    assert_eq!(state.on(), None);
    // A restart reads it as a failed slice: no one is wanted, nothing redone.
    let HandoffAction::Record(r) = &actions[0] else {
        panic!("{actions:?}")
    };
    assert_eq!(Step::parse("target-gone"), Some(Step::TargetGone));
    assert_eq!(wanted_without_schedule(Some(r), &[]), None);
    // For anyone else, or once running, it changes nothing.
    let other = Event::Gone {
        template: "c".into(),
        error: "x".into(),
        at_ms: EpochMs(6),
    };
    assert_eq!(step(&starting, &other, &s).0, starting);
    let running = HandoffState::Running {
        template: "b".into(),
        since_ms: EpochMs(1),
    };
    assert_eq!(step(&running, &gone, &s).0, running);
    // The next resume of an existing template starts normally.
    let (state, _) = step(&state, &due(Scheduled::Resume, "c", 7), &s);
    assert!(matches!(state, HandoffState::Buffer { .. }));
}

#[test]
fn start_failures_are_retried_then_the_slice_fails_and_the_gpu_stays_free() {
    let s = settings(0);
    let starting = HandoffState::Starting {
        to: "b".into(),
        attempt: 1,
        issued_ms: EpochMs(0),
        released_ms: None,
    };
    let fail = |at_ms| Event::StartFailed {
        template: "b".into(),
        error: "internal error: no IOMMU".into(),
        at_ms,
    };
    let (state, actions) = step(&starting, &fail(EpochMs(1)), &s);
    assert!(matches!(
        state,
        HandoffState::Starting {
            attempt: 2,
            issued_ms: EpochMs(0),
            ..
        }
    ));
    assert_eq!(steps(&actions), ["start-failed", "start-issued"]);
    assert!(has(&actions, &create("b")));
    let (state, actions) = step(&state, &fail(EpochMs(2)), &s);
    assert_eq!(
        state,
        HandoffState::Failed {
            template: "b".into(),
            error: "internal error: no IOMMU".into(),
            at_ms: EpochMs(2)
        }
    );
    assert_eq!(steps(&actions), ["start-failed", "failed"]);
    match &actions[0] {
        HandoffAction::Record(r) => assert_eq!(
            r.detail.as_deref(),
            Some("attempt 2 of 2: internal error: no IOMMU")
        ),
        other => panic!("{other:?}"),
    }
    assert!(!actions
        .iter()
        .any(|a| matches!(a, HandoffAction::Create { .. })));
    // The next slice starts normally.
    let (state, _) = step(&state, &due(Scheduled::Resume, "c", 3), &s);
    assert!(matches!(state, HandoffState::Buffer { .. }));
    assert_eq!(state.on(), None);
}

#[test]
fn a_manual_resume_while_another_holds_is_refused_naming_the_holder() {
    let s = settings(0);
    let ask = |as_handoff| Event::ManualResume {
        template: "b".into(),
        as_handoff,
        at_ms: EpochMs(1),
    };
    let (state, actions) = step(&running("a"), &ask(false), &s);
    assert_eq!(state, running("a"));
    assert_eq!(
        actions,
        [HandoffAction::Refuse {
            reason: "template a holds the GPU baseboard; resume b as a handoff to take \
                         it over"
                .into()
        }]
    );
    let to_c = HandoffState::AwaitingRelease {
        from: "a".into(),
        to: Some("c".into()),
        stopped_ms: EpochMs(0),
    };
    let (_, actions) = step(&to_c, &ask(false), &s);
    assert_eq!(
        actions,
        [HandoffAction::Refuse {
            reason: "the GPU baseboard is being handed over to template c; resume b as \
                         a handoff to take it over"
                .into()
        }]
    );
    // As a handoff it takes over.
    let (state, actions) = step(&running("a"), &ask(true), &s);
    assert!(matches!(
        &state,
        HandoffState::PoweringOff { from, to: Some(to), forced: false, .. } if from == "a" && to == "b"
    ));
    assert_eq!(steps(&actions), ["power-off-asked"]);
    // Nobody holds it: a plain resume is fine.
    let (state, _) = step(&HandoffState::Idle { released_ms: None }, &ask(false), &s);
    assert_eq!(state.target(), Some("b"));
}

#[test]
fn poweroff_works_in_every_state() {
    let s = settings(300_000);
    let off = |t: &str| Event::ManualPowerOff {
        template: t.into(),
        hard: false,
        at_ms: EpochMs(50),
    };
    // The incoming one is dropped from a handoff in progress.
    let (state, actions) = step(
        &HandoffState::AwaitingRelease {
            from: "a".into(),
            to: Some("b".into()),
            stopped_ms: EpochMs(0),
        },
        &off("b"),
        &s,
    );
    assert_eq!(state.target(), None);
    assert_eq!(actions, [requested(None, 50)]);
    let (state, _) = step(
        &HandoffState::Buffer {
            to: "b".into(),
            release_confirmed_ms: Some(EpochMs(10)),
            until_ms: EpochMs(99),
        },
        &off("b"),
        &s,
    );
    assert_eq!(
        state,
        HandoffState::Idle {
            released_ms: Some(EpochMs(10))
        }
    );
    // A VM still starting is destroyed.
    let (state, actions) = step(
        &HandoffState::Starting {
            to: "b".into(),
            attempt: 1,
            issued_ms: EpochMs(0),
            released_ms: None,
        },
        &off("b"),
        &s,
    );
    assert!(matches!(
        state,
        HandoffState::PoweringOff { forced: true, .. }
    ));
    assert!(has(
        &actions,
        &HandoffAction::Destroy {
            template: "b".into()
        }
    ));
    // It never came up: off, then released.
    let (state, actions) = step(
        &state,
        &Event::StartFailed {
            template: "b".into(),
            error: "x".into(),
            at_ms: EpochMs(60),
        },
        &s,
    );
    assert!(matches!(state, HandoffState::AwaitingRelease { .. }));
    assert!(has(&actions, &HandoffAction::CheckRelease));
    // Off already, or not ours: nothing to do, nothing refused.
    let idle = HandoffState::Idle { released_ms: None };
    assert_eq!(step(&idle, &off("a"), &s), (idle.clone(), vec![]));
}

#[test]
fn a_vm_that_stops_on_its_own_ends_its_slice() {
    let s = settings(0);
    let (state, actions) = step(
        &running("a"),
        &Event::Stopped {
            template: "a".into(),
            at_ms: EpochMs(9),
        },
        &s,
    );
    assert!(matches!(
        state,
        HandoffState::AwaitingRelease { to: None, .. }
    ));
    assert!(has(
        &actions,
        &HandoffAction::Signal(Signal::SliceEnded {
            template: "a".into(),
            at_ms: EpochMs(9)
        })
    ));
    let (state, actions) = step(&state, &Event::Released { at_ms: EpochMs(10) }, &s);
    assert_eq!(
        state,
        HandoffState::Idle {
            released_ms: Some(EpochMs(10))
        }
    );
    assert_eq!(steps(&actions), ["release-confirmed"]);
    // Late or foreign events change nothing.
    for e in [
        Event::Stopped {
            template: "z".into(),
            at_ms: EpochMs(11),
        },
        Event::Ready {
            template: "a".into(),
            at_ms: EpochMs(11),
        },
        Event::Released { at_ms: EpochMs(11) },
    ] {
        assert_eq!(step(&state, &e, &s).0, state);
    }
}

#[test]
fn a_vm_started_behind_our_back_is_taken_in_or_sent_away() {
    let s = settings(0);
    let started = |t: &str| Event::Started {
        template: t.into(),
        at_ms: EpochMs(5),
    };
    // Nobody held the baseboard: it holds it now.
    let (state, actions) = step(&HandoffState::Idle { released_ms: None }, &started("a"), &s);
    assert!(matches!(state, HandoffState::AwaitingReady { .. }));
    assert_eq!(state.on(), Some("a"));
    assert_eq!(steps(&actions), ["started"]);
    // b was coming next: a is powered off for it.
    let (state, _) = step(
        &HandoffState::Buffer {
            to: "b".into(),
            release_confirmed_ms: None,
            until_ms: EpochMs(9),
        },
        &started("a"),
        &s,
    );
    assert!(matches!(
        &state,
        HandoffState::PoweringOff { from, to: Some(to), .. } if from == "a" && to == "b"
    ));
    // Another VM is on: the newcomer is destroyed at once.
    let (state, actions) = step(&running("b"), &started("a"), &s);
    assert_eq!(state, running("b"));
    assert!(has(
        &actions,
        &HandoffAction::Destroy {
            template: "a".into()
        }
    ));
    // A repeated STARTED of the holder changes nothing.
    assert_eq!(
        step(&running("b"), &started("b"), &s),
        (running("b"), vec![])
    );
}

mod converge;
use converge::destroyed_step;
