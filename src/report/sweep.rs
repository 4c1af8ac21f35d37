//! The sweep: one GPU's window cut into segments at every boundary,
//! each segment's time and energy split among its parts.

use super::*;

/// A row's kind and key under `by`.
pub(super) fn group<'k>(base: &'k Base, gpu: &'k GpuFacts, by: GroupBy) -> (RowKind, &'k str) {
    let key = match (base, by) {
        (_, GroupBy::Gpu) => gpu.uuid.as_str(),
        (Base::Worker { worker, .. }, GroupBy::Worker) => worker,
        (Base::Worker { owner, .. }, GroupBy::Owner | GroupBy::User) => owner,
        (Base::Slice { template, .. }, GroupBy::Worker) => template,
        (Base::Slice { user, .. }, GroupBy::Owner | GroupBy::User) => user,
        (Base::Outside, _) => "outside",
        (Base::Idle, _) => "idle",
        (Base::Downtime, _) => "downtime",
        (Base::Unrecorded, _) => "unrecorded",
    };
    (base.kind(), key)
}

/// A holding or slice on one GPU, clipped to the window.
pub(super) struct Holder {
    base: usize,
    from: i64,
    to: i64,
    /// Bytes of the GPU it is promised (the GPU's size when whole).
    weight: u128,
    runs_while_down: bool,
}

/// A measured interval of one GPU, clipped to the window.
pub(super) struct Meas {
    from: i64,
    to: i64,
    /// The interval as measured, unclipped: its energy is spread over it.
    whole: (i64, i64),
    energy: u128,
    util: Option<u128>,
    outside: u128,
}

impl Meas {
    /// Energy in 1/SCALE mJ from the measured interval's start up to `t`,
    /// rounded down. Spreading energy evenly in time is the same as giving
    /// it to rows in proportion to their time inside the interval; the
    /// differences of this running total telescope, so a segment gets the
    /// same units whatever window it is counted in.
    fn energy_until(&self, t: i64) -> u128 {
        let (from, to) = self.whole;
        mul_div(self.energy * SCALE, span(from, t), span(from, to)).0
    }
}

/// One base row's share of one GPU's window.
pub(super) struct Part {
    pub(super) gpu_ms: u64,
    pub(super) energy_mj: u64,
    pub(super) busy_gpu_ms: Option<u64>,
}

/// One GPU's window before it is split among its base rows: its
/// rolled-up days whole inside the window, as they were kept, and the sums
/// of its raw facts over the rest.
pub(super) struct GpuAccount<'a> {
    pub(super) gpu: &'a GpuFacts,
    window: Window,
    days: Vec<&'a RolledDay>,
    raw: BTreeMap<Base, Sums>,
    /// The energy measured in the window, in mJ.
    energy: u128,
}

impl<'a> GpuAccount<'a> {
    pub(super) fn of(w: Window, gpu: &'a GpuFacts, ledger: &Ledger<'a>) -> GpuAccount<'a> {
        let mut raw: BTreeMap<Base, Sums> = BTreeMap::new();
        let mut energy: u128 = 0;
        let mut days: Vec<&RolledDay> = ledger
            .rolled
            .iter()
            .filter(|d| {
                d.gpu_uuid == gpu.uuid
                    && d.day_ms >= w.from
                    && d.day_ms.saturating_add(DAY_MS) <= w.to
            })
            .collect();
        days.sort_by_key(|d| d.day_ms);
        // A day listed twice is one day; the first listing counts.
        days.dedup_by_key(|d| d.day_ms);
        let mut at = w.from;
        for d in &days {
            if at < d.day_ms {
                let gap = Window {
                    from: at,
                    to: d.day_ms,
                };
                energy += sweep(gap, gpu, ledger, &mut raw);
            }
            energy += u128::from(d.energy_mj);
            at = d.day_ms + DAY_MS;
        }
        if at < w.to {
            let rest = Window { from: at, to: w.to };
            energy += sweep(rest, gpu, ledger, &mut raw);
        }
        GpuAccount {
            gpu,
            window: w,
            days,
            raw,
            energy,
        }
    }

    /// Splits the GPU's window among its base rows, with the window's one
    /// rounding; each base row's part goes to `emit`, in the base rows' order.
    pub(super) fn split<'s>(&'s self, mut emit: impl FnMut(&'s Base, Part)) {
        // Every day's sums (each sorted) and the raw ones, sorted by base row
        // (a stable sort merges the sorted runs) and added up: a year holds
        // tens of thousands, and neither a key is cloned nor a map searched.
        let mut all: Vec<(&Base, &Sums)> = self
            .days
            .iter()
            .flat_map(|d| d.sums.iter().map(|(b, s)| (b, s)))
            .chain(self.raw.iter())
            .collect();
        all.sort_by(|a, b| a.0.cmp(b.0));
        let mut sums: Vec<(&Base, Sums)> = Vec::with_capacity(all.len());
        for (base, s) in all {
            match sums.last_mut() {
                Some((kept, sum)) if *kept == base => sum.add(s),
                _ => sums.push((base, s.clone())),
            }
        }

        // The only rounding to whole units; exact totals by construction: the
        // window's ms and the energy measured in it, split by the sums.
        let w = self.window;
        let ms = apportion(
            span(w.from, w.to),
            &sums.iter().map(|(_, s)| s.ms).collect::<Vec<_>>(),
        );
        let mj = apportion(
            self.energy,
            &sums.iter().map(|(_, s)| s.energy).collect::<Vec<_>>(),
        );
        for ((base, s), (ms, mj)) in sums.into_iter().zip(ms.into_iter().zip(mj)) {
            let part = Part {
                gpu_ms: to_u64(ms),
                energy_mj: to_u64(mj),
                busy_gpu_ms: s.busy.map(|b| to_u64(b / (100 * SCALE))),
            };
            emit(base, part);
        }
    }
}

/// Adds one GPU's raw facts over `w` to `sums` (in 1/SCALE units, not
/// rounded); returns the energy measured in `w`, in mJ.
pub(super) fn sweep(
    w: Window,
    gpu: &GpuFacts,
    ledger: &Ledger<'_>,
    sums: &mut BTreeMap<Base, Sums>,
) -> u128 {
    let up = merge_up(ledger.up, w);
    // A 0-byte GPU would make every share a division by zero; as 1 byte any
    // share over-promises and is scaled, and whole holders still count.
    let cap = u128::from(gpu.total_bytes.max(1));

    let mut bases: Vec<Base> = vec![Base::Outside, Base::Idle, Base::Downtime, Base::Unrecorded];
    let mut holders: Vec<(Base, Holder)> = Vec::new();
    for h in ledger.holds.iter().filter(|h| h.gpu_uuid == gpu.uuid) {
        let Some((from, to)) = w.clip(h.from_ms, h.to_ms.unwrap_or(w.to)) else {
            continue;
        };
        let base = Base::Worker {
            worker: h.worker.clone(),
            owner: h.owner.clone(),
        };
        let weight = h.share_bytes.map_or(cap, u128::from);
        holders.push((
            base,
            Holder {
                base: 0, // set below, once the base rows are sorted
                from,
                to,
                weight,
                runs_while_down: h.runs_while_down,
            },
        ));
    }
    for s in ledger
        .slices
        .iter()
        .filter(|s| s.gpu_uuids.contains(&gpu.uuid))
    {
        let Some((from, to)) = w.clip(s.from_ms, s.to_ms.unwrap_or(w.to)) else {
            continue;
        };
        let base = Base::Slice {
            template: s.template.clone(),
            user: s.user.clone(),
        };
        // A slice's VM runs on its own, so it is billed while the daemon is down.
        holders.push((
            base,
            Holder {
                base: 0, // set below, once the base rows are sorted
                from,
                to,
                weight: cap,
                runs_while_down: true,
            },
        ));
    }
    // Sorted base rows: ties in rounding are broken by this order, so the
    // result does not depend on the order of the inputs.
    bases.extend(holders.iter().map(|(b, _)| b.clone()));
    bases.sort();
    bases.dedup();
    let index = |b: &Base| bases.binary_search(b).expect("every base is listed");
    let (outside_i, idle_i, down_i, unrecorded_i) = (
        index(&Base::Outside),
        index(&Base::Idle),
        index(&Base::Downtime),
        index(&Base::Unrecorded),
    );
    let mut holders: Vec<Holder> = holders
        .into_iter()
        .map(|(b, h)| Holder {
            base: index(&b),
            ..h
        })
        .collect();

    let mut energy_mj: u128 = 0;
    let mut meas: Vec<Meas> = Vec::new();
    for m in ledger
        .measured
        .iter()
        .filter(|m| m.gpu_uuid == gpu.uuid && m.to_ms > m.from_ms)
    {
        let Some((from, to)) = w.clip(m.from_ms, m.to_ms) else {
            continue;
        };
        energy_mj += u128::from(clipped_energy_mj(m, w.from, w.to));
        meas.push(Meas {
            from,
            to,
            whole: (m.from_ms, m.to_ms),
            energy: u128::from(m.energy_mj),
            // A reading above 100 % is noise; a GPU cannot be busier than busy.
            util: m.utilization_pct.map(|u| u128::from(u.min(100))),
            outside: u128::from(m.outside_bytes),
        });
    }

    // Every boundary cuts; between two cuts nothing changes.
    let mut cuts: Vec<i64> = vec![w.from, w.to];
    cuts.extend(holders.iter().flat_map(|h| [h.from, h.to]));
    cuts.extend(meas.iter().flat_map(|m| [m.from, m.to]));
    cuts.extend(up.iter().flat_map(|&(a, b)| [a, b]));
    let records_from = ledger.records_from.unwrap_or(i64::MIN);
    cuts.extend(w.clip(records_from, w.to).map(|(a, _)| a));
    cuts.sort_unstable();
    cuts.dedup();

    // Sweep: items enter in order of start and leave once a cut reaches their end.
    holders.sort_by_key(|h| h.from);
    meas.sort_by_key(|m| m.from);
    let (mut next_h, mut next_m, mut next_up) = (0, 0, 0);
    let (mut held, mut measuring): (Vec<usize>, Vec<usize>) = (Vec::new(), Vec::new());
    let mut acc = vec![Sums::default(); bases.len()];
    let mut parts: Vec<(usize, u128)> = Vec::new();
    let mut energy_edges: Vec<(u128, u128)> = Vec::new();
    // Per base row: the edge, weight and total of its last segment, and
    // its running total of time units there.
    let mut until_end: Vec<Option<(i64, u128, u128, i128)>> = vec![None; bases.len()];
    for seg in cuts.windows(2) {
        let (a, b) = (seg[0], seg[1]);
        while next_h < holders.len() && holders[next_h].from <= a {
            held.push(next_h);
            next_h += 1;
        }
        held.retain(|&i| holders[i].to > a);
        while next_m < meas.len() && meas[next_m].from <= a {
            measuring.push(next_m);
            next_m += 1;
        }
        measuring.retain(|&i| meas[i].to > a);
        while next_up < up.len() && up[next_up].1 <= a {
            next_up += 1;
        }
        let is_up = next_up < up.len() && up[next_up].0 <= a;

        // The segment's weights in bytes; they sum to max(promised, cap).
        parts.clear();
        let mut promised: u128 = 0;
        for h in held.iter().map(|&i| &holders[i]) {
            if is_up || h.runs_while_down {
                parts.push((h.base, h.weight));
                promised += h.weight;
            }
        }
        // Over-promise (shares above the GPU's size) leaves nothing free and
        // the holders split the GPU in proportion: fractions stay within [0, 1].
        let free = cap.saturating_sub(promised);
        if is_up {
            // Overlapping measurements should not happen; if they do, the
            // larger reading is used so outside use is not under-reported.
            let outside_bytes = measuring
                .iter()
                .map(|&i| meas[i].outside)
                .max()
                .unwrap_or(0);
            let outside = free.min(outside_bytes);
            parts.push((outside_i, outside));
            parts.push((idle_i, free - outside));
        } else if a < records_from {
            parts.push((unrecorded_i, free));
        } else {
            parts.push((down_i, free));
        }
        // One entry per base row (a worker may hold the GPU twice).
        parts.sort_unstable_by_key(|&(i, _)| i);
        parts.dedup_by(|later, kept| {
            let same = later.0 == kept.0;
            if same {
                kept.1 += later.1;
            }
            same
        });
        let total: u128 = parts.iter().map(|&(_, wt)| wt).sum();
        let util = measuring.iter().filter_map(|&i| meas[i].util).max();
        // Each measured interval's energy up to both edges, once per
        // segment rather than once per part.
        energy_edges.clear();
        energy_edges.extend(
            measuring
                .iter()
                .map(|&m| (meas[m].energy_until(a), meas[m].energy_until(b))),
        );
        for &(i, weight) in parts.iter() {
            // Each part's units up to each edge, rounded down there: the
            // floors telescope, so a segment cut in two (at a rolled-up
            // day's edge) gives each part exactly what it gives uncut.
            let upto = |units: u128| mul_div(units, weight, total).0;
            // The part's running total at `a` is usually the one worked out
            // at the end of the segment before.
            let until_a = match until_end[i] {
                Some((t, w, sum, units)) if (t, w, sum) == (a, weight, total) => units,
                _ => ms_until(a, weight, total),
            };
            let until_b = ms_until(b, weight, total);
            until_end[i] = Some((b, weight, total, until_b));
            // Non-negative: the running total grows with time.
            let ms = (until_b - until_a) as u128;
            let energy: u128 = energy_edges
                .iter()
                .map(|&(until_a, until_b)| upto(until_b) - upto(until_a))
                .sum();
            let row = &mut acc[i];
            row.ms += ms;
            row.energy += energy;
            if let (Some(u), true) = (util, ms > 0) {
                row.busy = Some(row.busy.unwrap_or(0) + ms * u);
            }
        }
    }
    for (base, s) in bases.into_iter().zip(acc) {
        sums.entry(base).or_default().add(&s);
    }
    energy_mj
}
