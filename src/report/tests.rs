use super::*;

const GIB: u64 = 1 << 30;
const HOUR: i64 = 3_600_000;

fn gpu(uuid: &str, index: u32, gib: u64) -> GpuFacts {
    GpuFacts {
        uuid: uuid.to_string(),
        index,
        total_bytes: gib * GIB,
    }
}

fn hold(
    worker: &str,
    owner: &str,
    gpu: &str,
    gib: Option<u64>,
    from: i64,
    to: Option<i64>,
) -> Holding {
    Holding {
        worker: worker.to_string(),
        owner: owner.to_string(),
        gpu_uuid: gpu.to_string(),
        share_bytes: gib.map(|g| g * GIB),
        from_ms: from,
        to_ms: to,
        runs_while_down: false,
    }
}

fn measured(
    gpu: &str,
    from: i64,
    to: i64,
    energy_mj: u64,
    util: Option<u32>,
    outside_gib: u64,
) -> Measured {
    Measured {
        gpu_uuid: gpu.to_string(),
        from_ms: from,
        to_ms: to,
        energy_mj,
        utilization_pct: util,
        outside_bytes: outside_gib * GIB,
    }
}

fn up(from: i64, to: i64) -> Up {
    Up {
        from_ms: from,
        to_ms: to,
    }
}

/// (kind, key, gpu_ms, energy_mj) of each row, for compact asserts.
fn brief(rows: &[Row]) -> Vec<(RowKind, &str, u64, u64)> {
    rows.iter()
        .map(|r| (r.kind, r.key.as_str(), r.gpu_ms, r.energy_mj))
        .collect()
}

fn run(from: i64, to: i64, ledger: &Ledger<'_>, by: GroupBy) -> Vec<Row> {
    report(from, to, ledger, by).unwrap()
}

#[test]
fn seed_two_of_eight_gb_for_an_hour_is_a_quarter_gpu_hour() {
    let gpus = [gpu("GPU-a", 0, 8)];
    let holds = [hold("w", "ana", "GPU-a", Some(2), 0, Some(HOUR))];
    let measured = [measured("GPU-a", 0, HOUR, 1_000_000, Some(80), 0)];
    let ups = [up(0, HOUR)];
    let ledger = Ledger {
        records_from: None,
        gpus: &gpus,
        holds: &holds,
        measured: &measured,
        up: &ups,
        ..Default::default()
    };
    let rows = run(0, HOUR, &ledger, GroupBy::Worker);
    assert_eq!(
        brief(&rows),
        vec![
            (RowKind::Worker, "w", 900_000, 250_000),
            (RowKind::Idle, "idle", 2_700_000, 750_000),
        ]
    );
    // A quarter of 80 % of an hour.
    assert_eq!(rows[0].busy_gpu_ms, Some(720_000));
    assert_eq!(rows[0].gpu_uuid, "");
    assert_eq!(hours(rows[0].gpu_ms), 0.25);
}

#[test]
fn two_sharers_one_stopping_midway() {
    let gpus = [gpu("GPU-a", 0, 8)];
    let holds = [
        hold("a", "ana", "GPU-a", Some(2), 0, Some(HOUR)),
        hold("b", "bo", "GPU-a", Some(4), 0, Some(HOUR / 2)),
    ];
    let measured = [
        measured("GPU-a", 0, HOUR / 2, 600_000, None, 0),
        measured("GPU-a", HOUR / 2, HOUR, 300_000, None, 0),
    ];
    let ups = [up(0, HOUR)];
    let ledger = Ledger {
        records_from: None,
        gpus: &gpus,
        holds: &holds,
        measured: &measured,
        up: &ups,
        ..Default::default()
    };
    let rows = run(0, HOUR, &ledger, GroupBy::Worker);
    assert_eq!(
        brief(&rows),
        vec![
            // 1/4 of both halves of the energy.
            (RowKind::Worker, "a", 900_000, 225_000),
            // 1/2 of the first half hour and its energy.
            (RowKind::Worker, "b", 900_000, 300_000),
            // 1/4 of the first half, 3/4 of the second.
            (RowKind::Idle, "idle", 1_800_000, 375_000),
        ]
    );
    assert!(rows.iter().all(|r| r.busy_gpu_ms.is_none()));
}

#[test]
fn outside_use_follows_each_measured_interval_and_is_capped_by_free_memory() {
    let gpus = [gpu("GPU-a", 0, 8)];
    let holds = [hold("w", "ana", "GPU-a", Some(2), 0, Some(HOUR))];
    // 2 GB outside, then 8 GB (only 6 are free: the worker's 2 are promised).
    let measured = [
        measured("GPU-a", 0, HOUR / 2, 0, None, 2),
        measured("GPU-a", HOUR / 2, HOUR, 0, None, 8),
    ];
    let ups = [up(0, HOUR)];
    let ledger = Ledger {
        records_from: None,
        gpus: &gpus,
        holds: &holds,
        measured: &measured,
        up: &ups,
        ..Default::default()
    };
    assert_eq!(
        brief(&run(0, HOUR, &ledger, GroupBy::Worker)),
        vec![
            (RowKind::Worker, "w", 900_000, 0),
            (RowKind::Outside, "outside", 450_000 + 1_350_000, 0),
            (RowKind::Idle, "idle", 900_000, 0),
        ]
    );
}

#[test]
fn downtime_bills_a_container_but_not_a_reservation() {
    let gpus = [gpu("GPU-a", 0, 8)];
    let mut container = hold("c", "ana", "GPU-a", Some(2), 0, None);
    container.runs_while_down = true;
    let reservation = hold("r", "bo", "GPU-a", Some(4), 0, None);
    let holds = [container, reservation];
    // Down over the middle third; nothing measured then.
    let ups = [up(0, 1_200_000), up(2_400_000, HOUR)];
    let measured = [
        measured("GPU-a", 0, 1_200_000, 400_000, None, 0),
        measured("GPU-a", 2_400_000, HOUR, 400_000, None, 0),
    ];
    let ledger = Ledger {
        records_from: None,
        gpus: &gpus,
        holds: &holds,
        measured: &measured,
        up: &ups,
        ..Default::default()
    };
    assert_eq!(
        brief(&run(0, HOUR, &ledger, GroupBy::Worker)),
        vec![
            (RowKind::Worker, "c", 900_000, 200_000),
            (RowKind::Worker, "r", 1_200_000, 400_000),
            (RowKind::Idle, "idle", 600_000, 200_000),
            // 6 of 8 GB over the 20 minutes down.
            (RowKind::Downtime, "downtime", 900_000, 0),
        ]
    );
}

#[test]
fn no_up_interval_at_all_is_all_downtime() {
    let gpus = [gpu("GPU-a", 0, 8)];
    let holds = [hold("r", "bo", "GPU-a", Some(4), 0, None)];
    let ledger = Ledger {
        records_from: None,
        gpus: &gpus,
        holds: &holds,
        ..Default::default()
    };
    assert_eq!(
        brief(&run(0, HOUR, &ledger, GroupBy::Owner)),
        vec![(RowKind::Downtime, "downtime", 3_600_000, 0)]
    );
}

/// A ledger a minute old, asked for the last hour: the 59 minutes
/// before its first start are not downtime (the daemon did not exist),
/// and the rows still add up to the window; a gap after the records
/// begin is downtime as before. Seen failing with the cut left out.
#[test]
fn time_before_the_records_begin_is_unrecorded_not_downtime() {
    let gpus = [gpu("GPU-a", 0, 8)];
    let ups = [
        up(59 * 60_000, 59 * 60_000 + 30_000),
        up(HOUR - 10_000, HOUR),
    ];
    let ledger = Ledger {
        records_from: Some(59 * 60_000),
        gpus: &gpus,
        up: &ups,
        ..Default::default()
    };
    assert_eq!(
        brief(&run(0, HOUR, &ledger, GroupBy::Gpu)),
        vec![
            (RowKind::Idle, "GPU-a", 40_000, 0),
            (RowKind::Downtime, "GPU-a", 20_000, 0),
            (RowKind::Unrecorded, "GPU-a", 59 * 60_000, 0),
        ]
    );
    // Records from before the window: nothing is unrecorded.
    let ledger = Ledger {
        records_from: Some(-5),
        ..ledger
    };
    let rows = run(0, HOUR, &ledger, GroupBy::Owner);
    assert!(
        rows.iter().all(|r| r.kind != RowKind::Unrecorded),
        "{rows:?}"
    );
    assert_eq!(
        rows.iter()
            .find(|r| r.kind == RowKind::Downtime)
            .unwrap()
            .gpu_ms,
        HOUR as u64 - 40_000
    );
}

#[test]
fn a_whole_gpu_counts_one_per_hour_and_leaves_no_room_outside() {
    let gpus = [gpu("GPU-a", 0, 8)];
    let holds = [hold("w", "ana", "GPU-a", None, 0, None)];
    let measured = [measured("GPU-a", 0, HOUR, 123_457, Some(50), 1)];
    let ups = [up(0, HOUR)];
    let ledger = Ledger {
        records_from: None,
        gpus: &gpus,
        holds: &holds,
        measured: &measured,
        up: &ups,
        ..Default::default()
    };
    let rows = run(0, HOUR, &ledger, GroupBy::Gpu);
    assert_eq!(
        brief(&rows),
        vec![(RowKind::Worker, "GPU-a", 3_600_000, 123_457)]
    );
    assert_eq!(rows[0].gpu_uuid, "GPU-a");
    assert_eq!(rows[0].busy_gpu_ms, Some(1_800_000));
}

#[test]
fn a_slice_counts_every_gpu_of_the_baseboard_whole() {
    let gpus = [gpu("GPU-b", 1, 80), gpu("GPU-a", 0, 80)];
    let slices = [SliceHold {
        template: "train".to_string(),
        user: "ana".to_string(),
        gpu_uuids: vec!["GPU-a".to_string(), "GPU-b".to_string()],
        from_ms: 0,
        to_ms: Some(HOUR / 2),
    }];
    let ups = [up(0, HOUR)];
    let ledger = Ledger {
        records_from: None,
        gpus: &gpus,
        slices: &slices,
        up: &ups,
        ..Default::default()
    };
    assert_eq!(
        brief(&run(0, HOUR, &ledger, GroupBy::Worker)),
        vec![
            (RowKind::Slice, "train", 3_600_000, 0),
            (RowKind::Idle, "idle", 3_600_000, 0),
        ]
    );
    assert_eq!(
        brief(&run(0, HOUR, &ledger, GroupBy::User)),
        vec![
            (RowKind::Slice, "ana", 3_600_000, 0),
            (RowKind::Idle, "idle", 3_600_000, 0),
        ]
    );
    // Per GPU, ordered by index, not by the order given.
    let per_gpu = run(0, HOUR, &ledger, GroupBy::Gpu);
    assert_eq!(
        brief(&per_gpu),
        vec![
            (RowKind::Slice, "GPU-a", 1_800_000, 0),
            (RowKind::Idle, "GPU-a", 1_800_000, 0),
            (RowKind::Slice, "GPU-b", 1_800_000, 0),
            (RowKind::Idle, "GPU-b", 1_800_000, 0),
        ]
    );
}

#[test]
fn a_slice_keeps_billing_while_the_daemon_is_down() {
    let gpus = [gpu("GPU-a", 0, 80)];
    let slices = [SliceHold {
        template: "train".to_string(),
        user: "ana".to_string(),
        gpu_uuids: vec!["GPU-a".to_string()],
        from_ms: 0,
        to_ms: None,
    }];
    let ups = [up(0, HOUR / 4)];
    let ledger = Ledger {
        records_from: None,
        gpus: &gpus,
        slices: &slices,
        up: &ups,
        ..Default::default()
    };
    assert_eq!(
        brief(&run(0, HOUR, &ledger, GroupBy::Owner)),
        vec![(RowKind::Slice, "ana", 3_600_000, 0)]
    );
}

#[test]
fn energy_is_split_to_the_millijoule() {
    let gpus = [gpu("GPU-a", 0, 8)];
    let holds = [
        hold("a", "ana", "GPU-a", Some(2), 0, None),
        hold("b", "bo", "GPU-a", Some(1), 0, None),
    ];
    let measured = [measured("GPU-a", 0, HOUR, 1001, None, 0)];
    let ups = [up(0, HOUR)];
    let ledger = Ledger {
        records_from: None,
        gpus: &gpus,
        holds: &holds,
        measured: &measured,
        up: &ups,
        ..Default::default()
    };
    // Exact shares 250.25, 125.125 and 625.625: the one mJ left over goes
    // to the largest remainder.
    assert_eq!(
        brief(&run(0, HOUR, &ledger, GroupBy::Worker)),
        vec![
            (RowKind::Worker, "a", 900_000, 250),
            (RowKind::Worker, "b", 450_000, 125),
            (RowKind::Idle, "idle", 2_250_000, 626),
        ]
    );
}

#[test]
fn equal_remainders_go_to_the_first_row_in_order() {
    let gpus = [gpu("GPU-a", 0, 3)];
    let holds = [
        hold("c", "x", "GPU-a", Some(1), 0, None),
        hold("a", "x", "GPU-a", Some(1), 0, None),
        hold("b", "x", "GPU-a", Some(1), 0, None),
    ];
    let measured = [measured("GPU-a", 0, HOUR, 1000, None, 0)];
    let ups = [up(0, HOUR)];
    let ledger = Ledger {
        records_from: None,
        gpus: &gpus,
        holds: &holds,
        measured: &measured,
        up: &ups,
        ..Default::default()
    };
    assert_eq!(
        brief(&run(0, HOUR, &ledger, GroupBy::Worker)),
        vec![
            (RowKind::Worker, "a", 1_200_000, 334),
            (RowKind::Worker, "b", 1_200_000, 333),
            (RowKind::Worker, "c", 1_200_000, 333),
        ]
    );
}

#[test]
fn busy_time_is_rounded_down_so_it_never_exceeds_the_time() {
    // 10 bytes shared 3/3/4 over 2 ms: exact times .6, .6 and .8 ms; the
    // two ms left go to c and (tie, first in order) a, so b gets 0 ms.
    let gpus = [GpuFacts {
        uuid: "GPU-a".to_string(),
        index: 0,
        total_bytes: 10,
    }];
    let share = |worker: &str, bytes: u64| Holding {
        share_bytes: Some(bytes),
        ..hold(worker, "x", "GPU-a", None, 0, None)
    };
    let holds = [share("a", 3), share("b", 3), share("c", 4)];
    let measured = [measured("GPU-a", 0, 2, 10, Some(100), 0)];
    let ups = [up(0, 2)];
    let ledger = Ledger {
        records_from: None,
        gpus: &gpus,
        holds: &holds,
        measured: &measured,
        up: &ups,
        ..Default::default()
    };
    let rows = run(0, 2, &ledger, GroupBy::Worker);
    assert_eq!(
        brief(&rows),
        vec![
            (RowKind::Worker, "a", 1, 3),
            (RowKind::Worker, "b", 0, 3),
            (RowKind::Worker, "c", 1, 4),
        ]
    );
    // 100 % busy: .6 ms rounds down to 0, never up past b's 0 ms.
    let busy: Vec<Option<u64>> = rows.iter().map(|r| r.busy_gpu_ms).collect();
    assert_eq!(busy, vec![Some(0), Some(0), Some(0)]);
}

#[test]
fn rounding_does_not_drift_with_many_segments() {
    // 100 intervals of 10 ms cut one second into 100 segments, each
    // worth 3⅓ ms per sharer; rounding each segment would hand the same
    // sharer the extra ms (and mJ) 100 times over.
    let gpus = [gpu("GPU-a", 0, 3)];
    let holds = [
        hold("a", "x", "GPU-a", Some(1), 0, None),
        hold("b", "x", "GPU-a", Some(1), 0, None),
        hold("c", "x", "GPU-a", Some(1), 0, None),
    ];
    let measured: Vec<Measured> = (0..100)
        .map(|i| measured("GPU-a", i * 10, i * 10 + 10, 1, None, 0))
        .collect();
    let ups = [up(0, 1000)];
    let ledger = Ledger {
        records_from: None,
        gpus: &gpus,
        holds: &holds,
        measured: &measured,
        up: &ups,
        ..Default::default()
    };
    assert_eq!(
        brief(&run(0, 1000, &ledger, GroupBy::Worker)),
        vec![
            (RowKind::Worker, "a", 334, 34),
            (RowKind::Worker, "b", 333, 33),
            (RowKind::Worker, "c", 333, 33),
        ]
    );
}

#[test]
fn overlapping_measurements_add_energy_and_take_the_larger_reading() {
    let gpus = [gpu("GPU-a", 0, 8)];
    let holds = [hold("w", "ana", "GPU-a", Some(2), 0, None)];
    // Should not happen, but if it does: both energies count, and the
    // larger outside use and utilisation are believed.
    let measured = [
        measured("GPU-a", 0, HOUR, 1000, Some(20), 1),
        measured("GPU-a", 0, HOUR, 600, Some(40), 2),
    ];
    let ups = [up(0, HOUR)];
    let ledger = Ledger {
        records_from: None,
        gpus: &gpus,
        holds: &holds,
        measured: &measured,
        up: &ups,
        ..Default::default()
    };
    let rows = run(0, HOUR, &ledger, GroupBy::Worker);
    assert_eq!(
        brief(&rows),
        vec![
            (RowKind::Worker, "w", 900_000, 400),
            (RowKind::Outside, "outside", 900_000, 400),
            (RowKind::Idle, "idle", 1_800_000, 800),
        ]
    );
    assert_eq!(rows[0].busy_gpu_ms, Some(360_000));
}

#[test]
fn over_promise_is_scaled_to_the_whole_gpu() {
    let gpus = [gpu("GPU-a", 0, 8)];
    let holds = [
        hold("a", "ana", "GPU-a", Some(6), 0, None),
        hold("b", "bo", "GPU-a", Some(4), 0, None),
    ];
    // Outside use cannot squeeze in: nothing is free.
    let measured = [measured("GPU-a", 0, HOUR, 1000, None, 2)];
    let ups = [up(0, HOUR)];
    let ledger = Ledger {
        records_from: None,
        gpus: &gpus,
        holds: &holds,
        measured: &measured,
        up: &ups,
        ..Default::default()
    };
    assert_eq!(
        brief(&run(0, HOUR, &ledger, GroupBy::Worker)),
        vec![
            (RowKind::Worker, "a", 2_160_000, 600),
            (RowKind::Worker, "b", 1_440_000, 400),
        ]
    );
    // A whole holder and a full-size share split the GPU in halves.
    let holds = [
        hold("a", "ana", "GPU-a", None, 0, None),
        hold("b", "bo", "GPU-a", Some(8), 0, None),
    ];
    let ledger = Ledger {
        records_from: None,
        holds: &holds,
        ..ledger
    };
    assert_eq!(
        brief(&run(0, HOUR, &ledger, GroupBy::Worker)),
        vec![
            (RowKind::Worker, "a", 1_800_000, 500),
            (RowKind::Worker, "b", 1_800_000, 500),
        ]
    );
}

#[test]
fn the_window_clips_holdings_and_energy() {
    let gpus = [gpu("GPU-a", 0, 8)];
    let holds = [
        hold("a", "ana", "GPU-a", Some(2), 0, Some(2_800_000)),
        hold("b", "bo", "GPU-a", Some(4), 4_000_000, None),
    ];
    // Half of this interval lies before the window.
    let measured = [measured("GPU-a", 0, 2_000_000, 2_000_000, None, 0)];
    let ups = [up(-HOUR, 10 * HOUR)];
    let ledger = Ledger {
        records_from: None,
        gpus: &gpus,
        holds: &holds,
        measured: &measured,
        up: &ups,
        ..Default::default()
    };
    let (from, to) = (1_000_000, 4_600_000);
    assert_eq!(clipped_energy_mj(&measured[0], from, to), 1_000_000);
    assert_eq!(
        brief(&run(from, to, &ledger, GroupBy::Worker)),
        vec![
            (RowKind::Worker, "a", 450_000, 250_000),
            (RowKind::Worker, "b", 300_000, 0),
            (RowKind::Idle, "idle", 2_850_000, 750_000),
        ]
    );
}

#[test]
fn clipped_energy_counts_up_to_each_edge_rounded_down() {
    // 10 mJ over 3 ms: 3⅓ by the first edge, 6⅔ by the second.
    let m = measured("GPU-a", 0, 3, 10, None, 0);
    assert_eq!(clipped_energy_mj(&m, 0, 1), 3);
    assert_eq!(clipped_energy_mj(&m, 1, 2), 3);
    assert_eq!(clipped_energy_mj(&m, 2, 3), 4);
    assert_eq!(clipped_energy_mj(&m, 1, 3), 7);
    assert_eq!(clipped_energy_mj(&m, -5, 5), 10);
    assert_eq!(clipped_energy_mj(&m, 3, 5), 0);
    let empty = measured("GPU-a", 3, 3, 10, None, 0);
    assert_eq!(clipped_energy_mj(&empty, 0, 5), 0);
}

#[test]
fn owner_rows_merge_workers_and_gpus() {
    let gpus = [gpu("GPU-a", 0, 8), gpu("GPU-b", 1, 8)];
    let holds = [
        hold("w1", "ana", "GPU-a", Some(2), 0, None),
        hold("w2", "ana", "GPU-b", Some(4), 0, None),
        hold("w3", "bo", "GPU-b", Some(4), 0, None),
        // A GPU the report does not list is not reported.
        hold("w4", "bo", "GPU-gone", None, 0, None),
    ];
    let ups = [up(0, HOUR)];
    let ledger = Ledger {
        records_from: None,
        gpus: &gpus,
        holds: &holds,
        up: &ups,
        ..Default::default()
    };
    assert_eq!(
        brief(&run(0, HOUR, &ledger, GroupBy::Owner)),
        vec![
            (RowKind::Worker, "ana", 900_000 + 1_800_000, 0),
            (RowKind::Worker, "bo", 1_800_000, 0),
            (RowKind::Idle, "idle", 2_700_000, 0),
        ]
    );
}

#[test]
fn errors_name_the_field() {
    let ledger = Ledger::default();
    let err = report(5, 5, &ledger, GroupBy::Gpu).unwrap_err();
    assert_eq!(err.field(), "until");
    assert_eq!(
        err.to_string(),
        "until: `until` must be after `since`; got since 5 ms, until 5 ms"
    );
    let err = "team".parse::<GroupBy>().unwrap_err();
    assert_eq!(err.field(), "group_by");
    assert_eq!(
        err.to_string(),
        r#"group_by: one of worker|owner|gpu|user; got "team""#
    );
    let err: crate::error::Error = err.into();
    assert_eq!(err.kind(), "InvalidRequest");
    for by in [GroupBy::Worker, GroupBy::Owner, GroupBy::Gpu, GroupBy::User] {
        assert_eq!(by.as_str().parse::<GroupBy>(), Ok(by));
    }
}

#[test]
fn mul_div_is_exact_past_u128() {
    let big = u128::MAX;
    assert_eq!(mul_div(big, big, big), (big, 0));
    assert_eq!(mul_div(big, 3, 4), (big / 4 * 3 + 2, 1));
    let (hi, lo) = wide_mul(big, big);
    assert_eq!((hi, lo), (big - 1, 1));
}

#[test]
fn apportion_sums_exactly_and_gives_zero_weights_nothing() {
    assert_eq!(apportion(10, &[1, 1, 1]), vec![4, 3, 3]);
    assert_eq!(apportion(10, &[0, 2, 1]), vec![0, 7, 3]);
    assert_eq!(apportion(7, &[0, 0]), vec![0, 0]);
    assert_eq!(apportion(0, &[5, 1]), vec![0, 0]);
}
