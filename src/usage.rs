//! Energy and utilisation samples, kept bounded in memory and closed into
//! per-interval aggregates for the ledger, where the usage report splits
//! them among sharers. Pure: time and readings come in as arguments.

use crate::placement::Gpu;
use std::collections::{HashMap, VecDeque};

/// One reading of one GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    pub at_ms: i64,
    pub power_mw: Option<u32>,
    pub energy_mj: Option<u64>,
    pub utilization_pct: Option<u32>,
    pub outside_bytes: u64,
    pub total_bytes: u64,
}

/// One GPU's closed interval, as the ledger keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interval {
    pub gpu_uuid: String,
    pub from_ms: i64,
    pub to_ms: i64,
    /// Energy used in the interval: the counter's difference when the GPU has
    /// one, else power integrated over the samples (trapezoids).
    pub energy_mj: u64,
    /// Mean utilisation over the samples that had one.
    pub utilization_pct: Option<u32>,
    pub samples: u32,
    /// Memory held outside Astraeus (mean over the samples) and the GPU's size.
    pub outside_bytes: u64,
    pub total_bytes: u64,
}

/// GPU-milliseconds and millijoules accounted to something.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counted {
    pub gpu_ms: u64,
    pub energy_mj: u64,
}

impl Counted {
    pub fn add(&mut self, other: Counted) {
        self.gpu_ms = self.gpu_ms.saturating_add(other.gpu_ms);
        self.energy_mj = self.energy_mj.saturating_add(other.energy_mj);
    }
}

/// The metrics' counters: monotonic, kept in the ledger across restarts.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct UsageCounters {
    /// Everything before this was counted.
    pub until_ms: i64,
    /// Per (GPU uuid, kind: worker | slice | outside | idle | downtime | unrecorded).
    pub gpu: std::collections::BTreeMap<(String, String), Counted>,
    /// Per live worker name.
    pub worker: HashMap<String, Counted>,
}

/// Keeps the last `keep` samples per GPU and closes an interval every `every_ms`.
pub struct Sampler {
    every_ms: i64,
    keep: usize,
    started_ms: Option<i64>,
    samples: HashMap<String, VecDeque<Sample>>,
}

impl Sampler {
    pub fn new(every_ms: i64, keep: usize) -> Sampler {
        Sampler {
            every_ms: every_ms.max(1),
            keep: keep.max(2),
            started_ms: None,
            samples: HashMap::new(),
        }
    }

    /// Records a reading of every GPU; returns the intervals closed by it.
    pub fn record(&mut self, at_ms: i64, gpus: &[Gpu]) -> Vec<Interval> {
        for g in gpus {
            let q = self.samples.entry(g.uuid.clone()).or_default();
            q.push_back(Sample {
                at_ms,
                power_mw: g.power_mw,
                energy_mj: g.energy_mj,
                utilization_pct: g.utilization_pct,
                outside_bytes: g.outside.bytes(),
                total_bytes: g.total.bytes(),
            });
            while q.len() > self.keep {
                q.pop_front();
            }
        }
        let start = *self.started_ms.get_or_insert(at_ms);
        if at_ms - start < self.every_ms {
            return Vec::new();
        }
        self.started_ms = Some(at_ms);
        let mut out: Vec<Interval> = self
            .samples
            .iter()
            .filter_map(|(uuid, q)| close(uuid, q, start, at_ms))
            .collect();
        out.sort_by(|a, b| a.gpu_uuid.cmp(&b.gpu_uuid));
        out
    }

    /// The interval still open at `now_ms` (since the last one closed), per
    /// GPU: what a report of a live daemon needs, for the daemon measured
    /// throughout. The last reading's power is carried to `now_ms`.
    pub fn open_intervals(&self, now_ms: i64) -> Vec<Interval> {
        let Some(start) = self.started_ms else {
            return Vec::new();
        };
        let mut out: Vec<Interval> = self
            .samples
            .iter()
            .filter_map(|(uuid, q)| {
                let last = q.back().filter(|s| s.at_ms >= start)?;
                let mut i = close(uuid, q, start, now_ms).unwrap_or(Interval {
                    gpu_uuid: uuid.clone(),
                    from_ms: last.at_ms,
                    to_ms: last.at_ms,
                    energy_mj: 0,
                    utilization_pct: last.utilization_pct,
                    samples: 1,
                    outside_bytes: last.outside_bytes,
                    total_bytes: last.total_bytes,
                });
                if now_ms > i.to_ms {
                    let ms = (now_ms - i.to_ms) as u64;
                    i.energy_mj += u64::from(last.power_mw.unwrap_or(0)) * ms / 1000;
                    i.to_ms = now_ms;
                }
                (i.to_ms > i.from_ms).then_some(i)
            })
            .collect();
        out.sort_by(|a, b| a.gpu_uuid.cmp(&b.gpu_uuid));
        out
    }

    /// The samples kept for one GPU, oldest first.
    pub fn recent(&self, uuid: &str) -> impl Iterator<Item = &Sample> {
        self.samples.get(uuid).into_iter().flatten()
    }
}

fn close(uuid: &str, q: &VecDeque<Sample>, from_ms: i64, to_ms: i64) -> Option<Interval> {
    let inside: Vec<&Sample> = q
        .iter()
        .filter(|s| s.at_ms >= from_ms && s.at_ms <= to_ms)
        .collect();
    if inside.len() < 2 {
        return None;
    }
    let (first, last) = (inside[0], inside[inside.len() - 1]);
    let energy_mj = match (first.energy_mj, last.energy_mj) {
        (Some(a), Some(b)) if b >= a => b - a,
        _ => inside
            .windows(2)
            .map(|w| {
                let (p0, p1) = (
                    w[0].power_mw.unwrap_or(0) as u64,
                    w[1].power_mw.unwrap_or(0) as u64,
                );
                let ms = (w[1].at_ms - w[0].at_ms).max(0) as u64;
                // mW × ms = µJ; trapezoid, then to mJ.
                (p0 + p1) * ms / 2 / 1000
            })
            .sum(),
    };
    let utils: Vec<u32> = inside.iter().filter_map(|s| s.utilization_pct).collect();
    Some(Interval {
        gpu_uuid: uuid.to_string(),
        from_ms: first.at_ms,
        to_ms: last.at_ms,
        energy_mj,
        utilization_pct: (!utils.is_empty())
            .then(|| utils.iter().sum::<u32>() / utils.len() as u32),
        samples: inside.len() as u32,
        outside_bytes: inside.iter().map(|s| s.outside_bytes).sum::<u64>() / inside.len() as u64,
        total_bytes: last.total_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_open_interval_is_measured_up_to_now() {
        let mut s = Sampler::new(10_000, 100);
        let g = |mw| Gpu {
            uuid: "GPU-a".into(),
            power_mw: Some(mw),
            ..Gpu::default()
        };
        assert!(s.open_intervals(0).is_empty(), "nothing read yet");
        s.record(0, &[g(60_000)]);
        // One reading: its power carried to now.
        let open = s.open_intervals(1_000);
        assert_eq!(
            (open[0].from_ms, open[0].to_ms, open[0].energy_mj),
            (0, 1_000, 60_000)
        );
        s.record(2_000, &[g(60_000)]);
        s.record(4_000, &[g(120_000)]);
        // 0-2 s at 60 W, 2-4 s from 60 to 120 W, then 120 W to 5 s.
        let open = s.open_intervals(5_000);
        assert_eq!(open.len(), 1);
        assert_eq!((open[0].from_ms, open[0].to_ms), (0, 5_000));
        assert_eq!(open[0].energy_mj, 120_000 + 180_000 + 120_000);
        // Once an interval closes, the open one starts there.
        assert_eq!(s.record(10_000, &[g(60_000)]).len(), 1);
        let open = s.open_intervals(11_000);
        assert_eq!(
            (open[0].from_ms, open[0].to_ms, open[0].energy_mj),
            (10_000, 11_000, 60_000)
        );
    }

    fn gpu(power: Option<u32>, energy: Option<u64>, util: Option<u32>) -> Gpu {
        Gpu {
            uuid: "GPU-a".into(),
            power_mw: power,
            energy_mj: energy,
            utilization_pct: util,
            ..Gpu::default()
        }
    }

    #[test]
    fn the_energy_counter_wins_over_power_when_present() {
        let mut s = Sampler::new(10_000, 100);
        assert!(s
            .record(0, &[gpu(Some(60_000), Some(1_000), Some(10))])
            .is_empty());
        assert!(s
            .record(5_000, &[gpu(Some(60_000), Some(301_000), Some(30))])
            .is_empty());
        let out = s.record(10_000, &[gpu(Some(60_000), Some(601_000), Some(20))]);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].energy_mj, 600_000);
        assert_eq!(out[0].utilization_pct, Some(20));
        assert_eq!(
            (out[0].from_ms, out[0].to_ms, out[0].samples),
            (0, 10_000, 3)
        );
    }

    #[test]
    fn without_a_counter_power_is_integrated() {
        let mut s = Sampler::new(10_000, 100);
        s.record(0, &[gpu(Some(60_000), None, None)]);
        let out = s.record(10_000, &[gpu(Some(60_000), None, None)]);
        // 60 W for 10 s = 600 J.
        assert_eq!(out[0].energy_mj, 600_000);
        assert_eq!(out[0].utilization_pct, None);
    }

    #[test]
    fn memory_is_bounded() {
        let mut s = Sampler::new(i64::MAX, 5);
        for t in 0..100 {
            s.record(t, &[gpu(Some(1), None, None)]);
        }
        assert_eq!(s.recent("GPU-a").count(), 5);
    }
}
