//! Property tests for the usage report: per GPU the rows add up exactly to
//! the window and to the measured energy, nobody is billed more than held,
//! every grouping agrees on the totals, and input order does not matter.

use astraeusd::report::*;
use proptest::prelude::*;

const WORKERS: [&str; 4] = ["w0", "w1", "w2", "w3"];
const OWNERS: [&str; 3] = ["ana", "bo", "cy"];
const TEMPLATES: [&str; 2] = ["t0", "t1"];
/// Index 3 names a GPU the report does not list: it must be ignored.
const UUIDS: [&str; 4] = ["GPU-0", "GPU-1", "GPU-2", "GPU-gone"];
const GROUPINGS: [GroupBy; 4] = [GroupBy::Worker, GroupBy::Owner, GroupBy::Gpu, GroupBy::User];

/// A generated case: the window, then the ledger's facts.
#[derive(Clone, Debug)]
struct Case {
    from: i64,
    to: i64,
    gpus: Vec<GpuFacts>,
    holds: Vec<Holding>,
    slices: Vec<SliceHold>,
    measured: Vec<Measured>,
    up: Vec<Up>,
}

impl Case {
    fn ledger(&self) -> Ledger<'_> {
        Ledger {
            records_from: None,
            gpus: &self.gpus,
            holds: &self.holds,
            slices: &self.slices,
            measured: &self.measured,
            up: &self.up,
            rolled: &[],
        }
    }

    fn report(&self, by: GroupBy) -> Vec<Row> {
        report(self.from, self.to, &self.ledger(), by).unwrap()
    }

    fn window(&self) -> u64 {
        (self.to - self.from) as u64
    }

    /// The energy measured on one GPU inside the window: each interval's
    /// energy spread evenly over it, counted up to each edge of the window
    /// and rounded down there, worked out here in u128 (u64 × u64 always
    /// fits; the report's own `clipped_energy_mj` is what is under test,
    /// never the oracle).
    fn energy_of(&self, uuid: &str) -> u64 {
        self.measured
            .iter()
            .filter(|m| m.gpu_uuid == uuid && m.to_ms > m.from_ms)
            .map(|m| {
                let len = (i128::from(m.to_ms) - i128::from(m.from_ms)) as u128;
                let upto = |t: i64| {
                    let t = t.clamp(m.from_ms, m.to_ms);
                    let done = (i128::from(t) - i128::from(m.from_ms)) as u128;
                    u128::from(m.energy_mj) * done / len
                };
                (upto(self.to) - upto(self.from)) as u64
            })
            .sum()
    }

    /// Length of the union of `[from, to)` intervals, clipped to the window.
    fn union_len(&self, mut spans: Vec<(i64, i64)>) -> u64 {
        spans.retain_mut(|s| {
            *s = (s.0.max(self.from), s.1.min(self.to));
            s.0 < s.1
        });
        spans.sort_unstable();
        let (mut total, mut end) = (0u64, i64::MIN);
        for (a, b) in spans {
            let a = a.max(end);
            if b > a {
                total += (b - a) as u64;
                end = b;
            }
        }
        total
    }
}

/// A time in a range around the window; `unit` stretches every time of a
/// case alike, so that huge spans exercise the 256-bit arithmetic.
fn time() -> impl Strategy<Value = i64> {
    -100_000i64..300_000
}

fn case() -> impl Strategy<Value = Case> {
    let gpus = prop::collection::vec(prop_oneof![1 => Just(0u64), 8 => 1u64..=(1 << 36)], 1..=3);
    let holding = (
        0..WORKERS.len(),
        0..OWNERS.len(),
        0..UUIDS.len(),
        prop::option::of(0u64..=(1 << 36)),
        time(),
        prop::option::of(0i64..150_000),
        any::<bool>(),
    );
    let slice = (
        0..TEMPLATES.len(),
        0..OWNERS.len(),
        prop::collection::btree_set(0..UUIDS.len(), 1..=3),
        time(),
        prop::option::of(0i64..150_000),
    );
    let measured = (
        0..UUIDS.len(),
        time(),
        0i64..100_000,
        0u64..=(1 << 60),
        prop::option::of(0u32..=150),
        0u64..=(1 << 36),
    );
    (
        prop_oneof![Just(1i64), Just(1_000), Just(60_000), Just(1 << 40)],
        time(),
        // Tiny windows too, where rounding to whole ms shows most.
        prop_oneof![1i64..=4, 1i64..=200_000],
        gpus,
        prop::collection::vec(holding, 0..8),
        prop::collection::vec(slice, 0..3),
        prop::collection::vec(measured, 0..8),
        prop::collection::vec((time(), 0i64..200_000), 0..4),
    )
        .prop_map(
            |(unit, from, len, gpus, holds, slices, measured, up)| Case {
                from: from * unit,
                to: (from + len) * unit,
                gpus: gpus
                    .into_iter()
                    .enumerate()
                    .map(|(i, total_bytes)| GpuFacts {
                        uuid: UUIDS[i].to_string(),
                        index: i as u32,
                        total_bytes,
                    })
                    .collect(),
                holds: holds
                    .into_iter()
                    .map(
                        |(w, o, g, share_bytes, from, len, runs_while_down)| Holding {
                            worker: WORKERS[w].to_string(),
                            owner: OWNERS[o].to_string(),
                            gpu_uuid: UUIDS[g].to_string(),
                            share_bytes,
                            from_ms: from * unit,
                            to_ms: len.map(|l| (from + l) * unit),
                            runs_while_down,
                        },
                    )
                    .collect(),
                slices: slices
                    .into_iter()
                    .map(|(t, u, gs, from, len)| SliceHold {
                        template: TEMPLATES[t].to_string(),
                        user: OWNERS[u].to_string(),
                        gpu_uuids: gs.into_iter().map(|g| UUIDS[g].to_string()).collect(),
                        from_ms: from * unit,
                        to_ms: len.map(|l| (from + l) * unit),
                    })
                    .collect(),
                measured: measured
                    .into_iter()
                    .map(
                        |(g, from, len, energy_mj, utilization_pct, outside_bytes)| Measured {
                            gpu_uuid: UUIDS[g].to_string(),
                            from_ms: from * unit,
                            to_ms: (from + len) * unit,
                            energy_mj,
                            utilization_pct,
                            outside_bytes,
                        },
                    )
                    .collect(),
                up: up
                    .into_iter()
                    .map(|(from, len)| Up {
                        from_ms: from * unit,
                        to_ms: (from + len) * unit,
                    })
                    .collect(),
            },
        )
}

/// The case with some GPU-days rolled up (`roll_day` over the raw facts)
/// and the measured intervals they wholly hold dropped, as the ledger
/// keeps them; `picks`: (GPU, a time in the day) pairs.
fn rolled_up(case: &Case, picks: &[(usize, i64)]) -> (Vec<RolledDay>, Vec<Measured>) {
    let mut days: Vec<(String, i64)> = picks
        .iter()
        .map(|&(g, t)| (UUIDS[g].to_string(), day_start(t)))
        .collect();
    days.sort();
    days.dedup();
    let is_rolled = |uuid: &str, t: i64| days.iter().any(|(u, d)| u == uuid && *d == day_start(t));
    let rolled = days
        .iter()
        .filter_map(|(uuid, day)| {
            let gpu = case.gpus.iter().find(|g| &g.uuid == uuid)?;
            Some(roll_day(*day, gpu, &case.ledger()))
        })
        .collect();
    // An interval every day of which is rolled up (for its GPU) is gone.
    let measured = case
        .measured
        .iter()
        .filter(|m| {
            let listed = case.gpus.iter().any(|g| g.uuid == m.gpu_uuid);
            let mut day = day_start(m.from_ms);
            let mut all_rolled = listed && m.to_ms > m.from_ms;
            while all_rolled && day < m.to_ms {
                all_rolled = is_rolled(&m.gpu_uuid, day);
                day = day.saturating_add(DAY_MS);
            }
            !all_rolled
        })
        .cloned()
        .collect();
    (rolled, measured)
}

/// Per kind: (gpu_ms, energy_mj, busy_gpu_ms) summed over the rows.
fn totals_by_kind(rows: &[Row]) -> std::collections::BTreeMap<RowKind, (u128, u128, u128)> {
    let mut out = std::collections::BTreeMap::new();
    for r in rows {
        let t = out.entry(r.kind).or_insert((0, 0, 0));
        t.0 += u128::from(r.gpu_ms);
        t.1 += u128::from(r.energy_mj);
        t.2 += u128::from(r.busy_gpu_ms.unwrap_or(0));
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn per_gpu_rows_add_up_to_the_window_and_the_measured_energy(case in case()) {
        let rows = case.report(GroupBy::Gpu);
        for g in &case.gpus {
            let mine: Vec<&Row> = rows.iter().filter(|r| r.gpu_uuid == g.uuid).collect();
            let ms: u64 = mine.iter().map(|r| r.gpu_ms).sum();
            let mj: u64 = mine.iter().map(|r| r.energy_mj).sum();
            prop_assert_eq!(ms, case.window(), "time of {}", g.uuid);
            prop_assert_eq!(mj, case.energy_of(&g.uuid), "energy of {}", g.uuid);
        }
        for r in &rows {
            prop_assert!(case.gpus.iter().any(|g| g.uuid == r.gpu_uuid), "unlisted GPU {:?}", r);
            prop_assert_eq!(&r.key, &r.gpu_uuid);
            prop_assert!(r.gpu_ms > 0 || r.energy_mj > 0, "empty row {:?}", r);
            prop_assert!(r.gpu_ms <= case.window(), "row longer than the window {:?}", r);
            prop_assert!(r.busy_gpu_ms.unwrap_or(0) <= r.gpu_ms, "busier than used {:?}", r);
        }
        // Sorted by GPU index, then kind.
        let order: Vec<(u32, RowKind)> = rows
            .iter()
            .map(|r| (case.gpus.iter().find(|g| g.uuid == r.gpu_uuid).unwrap().index, r.kind))
            .collect();
        prop_assert!(order.windows(2).all(|w| w[0] < w[1]), "order {:?}", order);
    }

    #[test]
    fn nobody_is_billed_more_than_it_held(case in case()) {
        let rows = case.report(GroupBy::Worker);
        for r in &rows {
            prop_assert_eq!(&r.gpu_uuid, "");
            prop_assert!(r.busy_gpu_ms.unwrap_or(0) <= r.gpu_ms, "busier than used {:?}", r);
            let held: u64 = case
                .gpus
                .iter()
                .map(|g| {
                    let spans: Vec<(i64, i64)> = match r.kind {
                        RowKind::Worker => case
                            .holds
                            .iter()
                            .filter(|h| h.worker == r.key && h.gpu_uuid == g.uuid)
                            .map(|h| (h.from_ms, h.to_ms.unwrap_or(case.to)))
                            .collect(),
                        RowKind::Slice => case
                            .slices
                            .iter()
                            .filter(|s| s.template == r.key && s.gpu_uuids.contains(&g.uuid))
                            .map(|s| (s.from_ms, s.to_ms.unwrap_or(case.to)))
                            .collect(),
                        _ => vec![(case.from, case.to)],
                    };
                    case.union_len(spans)
                })
                .sum();
            prop_assert!(r.gpu_ms <= held, "{:?} billed over {} ms held", r, held);
        }
    }

    #[test]
    fn every_grouping_agrees_on_the_totals(case in case()) {
        let by_gpu = totals_by_kind(&case.report(GroupBy::Gpu));
        let all_ms: u128 = by_gpu.values().map(|t| t.0).sum();
        prop_assert_eq!(all_ms, u128::from(case.window()) * case.gpus.len() as u128);
        let all_mj: u128 = by_gpu.values().map(|t| t.1).sum();
        let measured: u128 = case.gpus.iter().map(|g| u128::from(case.energy_of(&g.uuid))).sum();
        prop_assert_eq!(all_mj, measured);
        for by in [GroupBy::Worker, GroupBy::Owner, GroupBy::User] {
            let rows = case.report(by);
            prop_assert_eq!(totals_by_kind(&rows), by_gpu.clone(), "grouped by {}", by);
            // Merged: one row per kind and key.
            let keys: Vec<(RowKind, &str)> = rows.iter().map(|r| (r.kind, r.key.as_str())).collect();
            prop_assert!(keys.windows(2).all(|w| w[0] < w[1]), "keys {:?}", keys);
        }
    }

    #[test]
    fn the_order_of_the_inputs_does_not_matter(case in case(), pick in 0..GROUPINGS.len()) {
        let by = GROUPINGS[pick];
        let mut reversed = case.clone();
        reversed.holds.reverse();
        reversed.slices.reverse();
        reversed.measured.reverse();
        reversed.up.reverse();
        reversed.gpus.reverse();
        prop_assert_eq!(case.report(by), reversed.report(by));
    }

    #[test]
    fn a_lone_whole_holder_gets_its_held_time_exactly(
        case in case(),
        from in time(),
        len in 0i64..150_000,
        runs_while_down in any::<bool>(),
    ) {
        let mut case = case;
        case.holds = vec![Holding {
            worker: "solo".to_string(),
            owner: "ana".to_string(),
            gpu_uuid: case.gpus[0].uuid.clone(),
            share_bytes: None,
            from_ms: from,
            to_ms: Some(from + len),
            runs_while_down,
        }];
        case.slices.clear();
        let held = case.union_len(vec![(from, from + len)]);
        // Billed in full while up, or always when it runs on its own.
        let billed = if runs_while_down {
            held
        } else {
            let ups: Vec<(i64, i64)> = case
                .up
                .iter()
                .map(|u| (u.from_ms.max(from), u.to_ms.min(from + len)))
                .collect();
            case.union_len(ups)
        };
        let rows = case.report(GroupBy::Worker);
        let got = rows.iter().find(|r| r.kind == RowKind::Worker).map_or(0, |r| r.gpu_ms);
        prop_assert_eq!(got, billed);
    }

    /// Rolled-up days give the report the raw facts give, to the ms and the
    /// mJ: the window, widened to the whole of a rolled-up day it cuts
    /// (`covered`), computed once from the raw facts and once from the
    /// rolled-up days with the intervals they replaced gone.
    #[test]
    fn rolled_up_days_give_the_report_the_raw_facts_give(
        case in case(),
        unit in prop_oneof![Just(1i64), Just(1_000), Just(60_000), Just(1 << 40)],
        picks in prop::collection::vec((0..UUIDS.len(), time()), 0..6),
        pick in 0..GROUPINGS.len(),
    ) {
        let by = GROUPINGS[pick];
        let picks: Vec<(usize, i64)> = picks.into_iter().map(|(g, t)| (g, t * unit)).collect();
        let (rolled, measured) = rolled_up(&case, &picks);
        let (from, to) = covered(case.from, case.to, &rolled);
        prop_assert!(from <= case.from && to >= case.to);
        let raw = report(from, to, &case.ledger(), by).unwrap();
        let ledger = Ledger { rolled: &rolled, measured: &measured, ..case.ledger() };
        let kept = report(case.from, case.to, &ledger, by).unwrap();
        prop_assert_eq!(kept, raw);
    }

    /// The sums a rolled-up day keeps are additive to the last of their
    /// 2^32 units a ms (or mJ): a stretch cut anywhere gives, side by
    /// side, exactly what it gives whole. (The report's totals round these,
    /// which would hide a unit lost here.)
    #[test]
    fn sums_cut_anywhere_add_up_to_the_whole(case in case(), cut in 0.0f64..=1.0) {
        let m = case.from + ((case.to - case.from) as f64 * cut) as i64;
        for gpu in &case.gpus {
            let whole = sums_between(case.from, case.to, gpu, &case.ledger());
            let left = sums_between(case.from, m, gpu, &case.ledger());
            let right = sums_between(m, case.to, gpu, &case.ledger());
            let mut added: std::collections::BTreeMap<Base, Sums> = left.1.into_iter().collect();
            for (base, s) in right.1 {
                let e = added.entry(base).or_default();
                e.ms += s.ms;
                e.energy += s.energy;
                e.busy = match (e.busy, s.busy) {
                    (Some(a), Some(b)) => Some(a + b),
                    (a, b) => a.or(b),
                };
            }
            prop_assert_eq!(left.0 + right.0, whole.0, "energy of {}", gpu.uuid);
            prop_assert_eq!(added.into_iter().collect::<Vec<_>>(), whole.1, "sums of {}", gpu.uuid);
        }
    }
}
