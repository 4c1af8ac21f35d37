//! PURE: what is measured over a time slice. CPU from libvirt's domain info,
//! GPU figures from the lines the guest writes to its virtio channel (a
//! passed-through GPU is invisible to the host's NVML). Nothing written is
//! "not reported", never zeros. The readings arrive through the service loop.

use crate::time::EpochMs;
use std::collections::BTreeMap;

/// The virtio channel a template's guest writes its GPU figures to: the
/// lines `nvidia-smi --query-gpu=index,utilization.gpu,memory.used,power.draw
/// --format=csv,noheader,nounits -l 5` prints (docs/time-slicing.md). A
/// passed-through GPU is invisible to the host's NVML, so this is the only
/// source of them.
pub const GPU_CHANNEL: &str = "org.astraeus.gpu.0";

/// One GPU's figures, from one line the guest wrote.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuSample {
    pub index: u32,
    pub util_pct: Option<f64>,
    pub memory_mib: Option<f64>,
    pub power_w: Option<f64>,
}

impl GpuSample {
    /// `0, 37, 10240, 250.12` (units after a number, `[N/A]` and
    /// `[Not Supported]` are accepted: the last two count as unknown).
    /// Lines that are not such a row give None.
    pub fn parse(line: &str) -> Option<GpuSample> {
        let fields: Vec<&str> = line.trim().split(',').map(str::trim).collect();
        if fields.len() != 4 {
            return None;
        }
        let number = |f: &str| -> Result<Option<f64>, ()> {
            if f.starts_with('[') {
                return Ok(None);
            }
            let n: f64 = f
                .split_whitespace()
                .next()
                .ok_or(())?
                .parse()
                .map_err(|_| ())?;
            if n.is_finite() && n >= 0.0 {
                Ok(Some(n))
            } else {
                Err(())
            }
        };
        let index: u32 = fields[0].parse().ok()?;
        // The guest's numbers, kept within what a board can be: a huge
        // figure would make the slice's energy infinite.
        (index < MAX_GUEST_GPUS).then_some(())?;
        Some(GpuSample {
            index,
            util_pct: number(fields[1]).ok()?.map(|u| u.min(100.0)),
            memory_mib: number(fields[2]).ok()?.map(|m| m.min(MAX_MEMORY_MIB)),
            power_w: number(fields[3]).ok()?.map(|p| p.min(MAX_POWER_W)),
        })
    }
}

/// The most GPUs a guest's readings may name (a baseboard has 8, 16 at the
/// largest); rows naming others are dropped, so what is kept per GPU stays
/// bounded whatever the guest writes.
pub const MAX_GUEST_GPUS: u32 = 64;
/// The most one GPU's figures may say (above any board's).
const MAX_MEMORY_MIB: f64 = 16.0 * 1024.0 * 1024.0;
const MAX_POWER_W: f64 = 10_000.0;

/// A guest's line longer than this is dropped (a row is ~30 bytes), and
/// not read into memory past it.
pub const MAX_LINE_BYTES: usize = 256;
/// Lines read from a guest in one second at most: past it the reader
/// pauses until the second is up (the guest's writes wait in its channel).
const MAX_LINES_PER_SECOND: u32 = 256;
/// One GPU's rows closer together than this are dropped (the documented
/// cadence is one every 5 s): the loop is sent at most two a second each.
const MIN_READING_GAP_MS: u64 = 500;

/// What of a guest's lines reaches the service loop. The guest is the
/// slice user's own code: written as fast as it can, its rows would fill
/// the loop's queue (every caller answered busy) and its readings grow.
#[derive(Debug, Default)]
pub struct GuestGate {
    second: u64,
    lines: u32,
    /// When each GPU's last row went to the loop (ms).
    sent: BTreeMap<u32, u64>,
}

impl GuestGate {
    /// A line read at `now_ms`: how long (ms) the reader pauses before it
    /// reads on, when this second's lines are spent (the line is dropped).
    pub fn line(&mut self, now_ms: u64) -> Option<u64> {
        let second = now_ms / 1000;
        if second != self.second {
            self.second = second;
            self.lines = 0;
        }
        self.lines += 1;
        (self.lines > MAX_LINES_PER_SECOND).then(|| 1000 - now_ms % 1000)
    }

    /// Whether a row of GPU `index` read at `now_ms` goes to the loop.
    pub fn admit(&mut self, index: u32, now_ms: u64) -> bool {
        match self.sent.get(&index) {
            Some(t) if now_ms.saturating_sub(*t) < MIN_READING_GAP_MS => false,
            _ => {
                self.sent.insert(index, now_ms);
                true
            }
        }
    }
}

/// Gaps longer than this between two readings of a GPU are not counted as
/// energy (the guest stopped reporting; nothing is guessed for the gap).
const MAX_ENERGY_GAP_MS: u64 = 60_000;

/// A slice's readings of one figure, as their sum, count and peak: a
/// slice lasts days, its guest writes as often as it likes.
#[derive(Debug, Default)]
struct Figures {
    sum: f64,
    count: u64,
    peak: Option<f64>,
}

impl Figures {
    fn add(&mut self, x: f64) {
        self.sum += x;
        self.count += 1;
        self.peak = Some(self.peak.map_or(x, |p| p.max(x)));
    }

    fn mean(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum / self.count as f64)
    }
}

/// What is measured over the running slice: CPU from libvirt's domain info,
/// GPU figures from what the guest writes to [`GPU_CHANNEL`] (none written:
/// "not reported", never zeros).
#[derive(Debug, Default)]
pub struct Meter {
    pub template: String,
    /// (when, cpu ns) of the last reading.
    last: Option<(EpochMs, u64)>,
    cpu: Figures,
    gpu_util: Figures,
    /// Each GPU's last reading: (at ms, memory MiB, power W).
    gpus: BTreeMap<u32, (EpochMs, Option<f64>, Option<f64>)>,
    memory_peak_mib: Option<f64>,
    energy_j: Option<f64>,
}

impl Meter {
    pub fn new(template: &str) -> Meter {
        Meter {
            template: template.to_string(),
            ..Meter::default()
        }
    }

    /// Adds a reading of the domain's CPU time (ns), taken at `at`.
    pub fn record(&mut self, at: EpochMs, cpu_ns: u64, vcpus: u32) {
        if let Some((t0, c0)) = self.last {
            if at > t0 && cpu_ns >= c0 {
                let wall_ns = (at - t0) as f64 * 1e6;
                let pct = (cpu_ns - c0) as f64 * 100.0 / (wall_ns * vcpus as f64);
                self.cpu.add(pct.min(100.0));
            }
        }
        self.last = Some((at, cpu_ns));
    }

    /// Adds one GPU's reading from the guest, received at `at`. Energy
    /// is each GPU's power times the time to its next reading.
    pub fn record_gpu(&mut self, at: EpochMs, s: &GpuSample) {
        if let Some(u) = s.util_pct {
            self.gpu_util.add(u);
        }
        if let Some((t0, _, Some(p0))) = self.gpus.get(&s.index) {
            let dt = at - *t0;
            if dt > 0 && dt <= MAX_ENERGY_GAP_MS {
                *self.energy_j.get_or_insert(0.0) += p0 * dt as f64 / 1000.0;
            }
        }
        self.gpus.insert(s.index, (at, s.memory_mib, s.power_w));
        // The baseboard's memory in use now: each GPU's latest reading.
        let known: Vec<f64> = self.gpus.values().filter_map(|g| g.1).collect();
        if !known.is_empty() {
            let total: f64 = known.iter().sum();
            self.memory_peak_mib = Some(self.memory_peak_mib.map_or(total, |p| p.max(total)));
        }
    }

    pub fn measures(&self) -> SliceMeasures {
        SliceMeasures {
            cpu_avg_pct: self.cpu.mean(),
            cpu_peak_pct: self.cpu.peak,
            gpu_avg_pct: self.gpu_util.mean(),
            gpu_peak_pct: self.gpu_util.peak,
            gpu_memory_peak_bytes: self
                .memory_peak_mib
                .map(|m| (m * 1024.0 * 1024.0).round() as u64),
            energy_j: self.energy_j,
        }
    }
}

/// What was measured over a slice; None = not reported (never a zero).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SliceMeasures {
    pub cpu_avg_pct: Option<f64>,
    pub cpu_peak_pct: Option<f64>,
    pub gpu_avg_pct: Option<f64>,
    pub gpu_peak_pct: Option<f64>,
    pub gpu_memory_peak_bytes: Option<u64>,
    pub energy_j: Option<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guest_writing_fast_is_read_at_a_bounded_rate() {
        let mut gate = GuestGate::default();
        // 256 lines a second are read; the 257th pauses the reader for the
        // rest of its second.
        for i in 0..256 {
            assert_eq!(gate.line(5_000 + i), None);
        }
        assert_eq!(gate.line(5_300), Some(700));
        assert_eq!(gate.line(6_000), None, "a new second reads again");
        // Each GPU's rows reach the loop at most twice a second.
        assert!(gate.admit(0, 10_000));
        assert!(!gate.admit(0, 10_499));
        assert!(gate.admit(1, 10_499), "GPUs apart");
        assert!(gate.admit(0, 10_500));
    }

    #[test]
    fn rows_beyond_a_boards_gpus_and_figures_are_dropped_or_bounded() {
        assert_eq!(GpuSample::parse("64, 1, 1, 1"), None);
        assert_eq!(GpuSample::parse("4294967295, 1, 1, 1"), None);
        let s = GpuSample::parse("63, 100, 1e308, 1e308").unwrap();
        assert_eq!(s.memory_mib, Some(16.0 * 1024.0 * 1024.0));
        assert_eq!(s.power_w, Some(10_000.0));
        let mut m = Meter::new("t");
        m.record_gpu(EpochMs(0), &s);
        m.record_gpu(EpochMs(60_000), &s);
        assert!(m.measures().energy_j.is_some_and(f64::is_finite));
    }

    #[test]
    fn nvidia_smi_rows_are_read_with_or_without_units() {
        let s = GpuSample::parse("0, 37, 10240, 250.12").unwrap();
        assert_eq!(
            s,
            GpuSample {
                index: 0,
                util_pct: Some(37.0),
                memory_mib: Some(10240.0),
                power_w: Some(250.12)
            }
        );
        let s = GpuSample::parse("3, 100 %, 81559 MiB, [N/A]").unwrap();
        assert_eq!(
            (s.index, s.util_pct, s.memory_mib, s.power_w),
            (3, Some(100.0), Some(81559.0), None)
        );
        let s = GpuSample::parse("1, [Not Supported], 0, 70").unwrap();
        assert_eq!(s.util_pct, None);
        // A header, a short row, a negative or non-number figure: not a row.
        for bad in [
            "index, utilization.gpu [%], memory.used [MiB], power.draw [W]",
            "0, 37, 10240",
            "0, -1, 1, 1",
            "0, x, 1, 1",
            "0, NaN, 1, 1",
            "",
        ] {
            assert_eq!(GpuSample::parse(bad), None, "{bad:?}");
        }
    }

    fn row(index: u32, util: f64, mib: f64, watts: Option<f64>) -> GpuSample {
        GpuSample {
            index,
            util_pct: Some(util),
            memory_mib: Some(mib),
            power_w: watts,
        }
    }

    #[test]
    fn guest_gpu_figures_give_use_memory_peak_and_energy() {
        let mut m = Meter::new("a");
        assert_eq!(m.measures().gpu_avg_pct, None, "none written: not reported");
        assert_eq!(m.measures().energy_j, None);
        // Two GPUs every 5 s; GPU 1 reports no power.
        m.record_gpu(EpochMs(0), &row(0, 20.0, 1000.0, Some(100.0)));
        m.record_gpu(EpochMs(0), &row(1, 40.0, 3000.0, None));
        m.record_gpu(EpochMs(5_000), &row(0, 60.0, 2000.0, Some(300.0)));
        m.record_gpu(EpochMs(5_000), &row(1, 80.0, 3000.0, None));
        m.record_gpu(EpochMs(10_000), &row(0, 0.0, 500.0, Some(50.0)));
        let got = m.measures();
        assert_eq!(got.gpu_avg_pct, Some(40.0));
        assert_eq!(got.gpu_peak_pct, Some(80.0));
        // Peak of the sum of the GPUs' latest readings: 2000 + 3000 MiB.
        assert_eq!(got.gpu_memory_peak_bytes, Some(5000 * 1024 * 1024));
        // 100 W for 5 s, then 300 W for 5 s.
        assert_eq!(got.energy_j, Some(2000.0));
        // A long silence is not counted.
        m.record_gpu(
            EpochMs(10_000 + MAX_ENERGY_GAP_MS + 1),
            &row(0, 0.0, 500.0, Some(50.0)),
        );
        assert_eq!(m.measures().energy_j, Some(2000.0));
    }
}
