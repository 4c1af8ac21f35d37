//! The usage report: who used how much of each GPU over a window of time.
//!
//! A shared GPU counts for each sharer by its share of the GPU's memory: a
//! worker holding 2 GB of an 8 GB GPU for an hour is a quarter of a GPU-hour,
//! with a quarter of the GPU's utilisation and energy over that hour. A whole
//! GPU counts 1 per GPU-hour; a time slice counts every GPU of its baseboard
//! whole. What no sharer was promised has rows of its own: `outside` (memory
//! held outside the daemon, e.g. a desktop), `idle` (unallocated) and
//! `downtime` (the daemon was not running). So, per GPU, the rows add up
//! exactly to the window's wall-clock time, and the energy exactly to the
//! energy measured in the window.
//!
//! Pure: the ledger's facts come in as arguments; no clock, no I/O.
//!
//! How the sums stay exact: each GPU's window is cut into segments at every
//! boundary (holdings, slices, measured intervals, daemon up-time). Inside a
//! segment each part of the GPU has an integer weight in bytes, so fractions
//! are exact ratios of integers. A segment's time and energy are split among
//! the parts in fixed point (1/2^32 ms, 1/2^32 mJ), each part counted up to
//! each edge and rounded down there (floors that telescope, so a segment cut
//! in two gives what it gives whole), summed per sharer, and only the
//! window's totals are rounded to whole ms and mJ (largest remainder). So
//! rounding never drifts with the number of segments, the totals are exact,
//! and a day folded into its sums (`roll_day`, kept by the ledger in place
//! of its measured intervals) gives reports the very figures its facts did.

use crate::json_fields::clip;
use serde::Serialize;
use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::str::FromStr;

/// Fixed-point scale for the per-segment splits: 2^32 parts of a ms (or mJ).
/// Large enough that per-segment rounding is invisible after the final
/// rounding, small enough that sums stay far inside u128.
const SCALE: u128 = 1 << 32;

/// A UTC day in ms: measured history older than a day is kept per GPU and
/// UTC day (`roll_day`).
pub const DAY_MS: i64 = 86_400_000;

/// What the report needs to know of one GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuFacts {
    pub uuid: String,
    /// Its index on the host; orders the per-GPU rows.
    pub index: u32,
    /// Its memory in bytes; shares are fractions of it.
    pub total_bytes: u64,
}

/// A worker's hold on one GPU over `[from_ms, to_ms)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holding {
    pub worker: String,
    pub owner: String,
    pub gpu_uuid: String,
    /// Bytes of the GPU's memory promised to the worker; `None` = the whole GPU.
    pub share_bytes: Option<u64>,
    pub from_ms: i64,
    /// `None`: still held at the end of the window.
    pub to_ms: Option<i64>,
    /// A launched workload (container, unit, VM) keeps running while the
    /// daemon is down and is billed for that time; a bare reservation is not
    /// (that time shows as downtime).
    pub runs_while_down: bool,
}

/// A time slice: a template's VM held every GPU of the baseboard whole.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SliceHold {
    pub template: String,
    pub user: String,
    pub gpu_uuids: Vec<String>,
    pub from_ms: i64,
    /// `None`: still held at the end of the window.
    pub to_ms: Option<i64>,
}

/// One closed measurement interval of one GPU, as the ledger keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Measured {
    pub gpu_uuid: String,
    pub from_ms: i64,
    pub to_ms: i64,
    /// Energy used over the whole interval (even the part outside the window).
    pub energy_mj: u64,
    /// Mean utilisation over the interval, when the GPU reported one.
    pub utilization_pct: Option<u32>,
    /// Memory held by processes the daemon did not start.
    pub outside_bytes: u64,
}

/// An interval when the daemon was running.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Up {
    pub from_ms: i64,
    pub to_ms: i64,
}

/// Everything the ledger recorded that the report reads. Facts naming a GPU
/// missing from `gpus` are ignored: the report is about the listed GPUs.
#[derive(Clone, Copy, Debug, Default)]
pub struct Ledger<'a> {
    pub gpus: &'a [GpuFacts],
    pub holds: &'a [Holding],
    pub slices: &'a [SliceHold],
    pub measured: &'a [Measured],
    /// When the daemon ran; none at all means the whole window is downtime.
    pub up: &'a [Up],
    /// From when the ledger has records (its first start, or where
    /// retention cut): time before it is `unrecorded`, not downtime.
    pub records_from: Option<i64>,
    /// Days kept as sums in place of their measured intervals (`roll_day`).
    pub rolled: &'a [RolledDay],
}

/// How rows are keyed and merged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GroupBy {
    /// Per worker name; a slice by its template.
    Worker,
    /// Per owner; a slice by its user.
    Owner,
    /// One row per GPU and kind, keyed by the GPU's uuid.
    Gpu,
    /// The same keys as `Owner`, under the name a slice's side uses: a
    /// worker's owner and a slice's user are both the person who used it.
    User,
}

/// The words `GroupBy` parses, as error messages list them.
pub const GROUP_BY_ACCEPTED: &str = "worker|owner|gpu|user";

impl GroupBy {
    pub fn as_str(self) -> &'static str {
        match self {
            GroupBy::Worker => "worker",
            GroupBy::Owner => "owner",
            GroupBy::Gpu => "gpu",
            GroupBy::User => "user",
        }
    }
}

impl fmt::Display for GroupBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for GroupBy {
    type Err = ReportError;

    fn from_str(text: &str) -> Result<GroupBy, ReportError> {
        match text {
            "worker" => Ok(GroupBy::Worker),
            "owner" => Ok(GroupBy::Owner),
            "gpu" => Ok(GroupBy::Gpu),
            "user" => Ok(GroupBy::User),
            _ => Err(ReportError::UnknownGroupBy(text.to_string())),
        }
    }
}

/// What a row accounts for. The order is the report's order within a GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RowKind {
    /// Shared or whole-GPU workers.
    Worker,
    /// Time slices.
    Slice,
    /// Memory held outside the daemon.
    Outside,
    /// Unallocated while the daemon ran.
    Idle,
    /// The daemon was not running (and nothing billed was running either).
    Downtime,
    /// Before the ledger's records begin (its first start, or what
    /// retention deleted): neither use nor downtime, just not known.
    Unrecorded,
}

impl RowKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RowKind::Worker => "worker",
            RowKind::Slice => "slice",
            RowKind::Outside => "outside",
            RowKind::Idle => "idle",
            RowKind::Downtime => "downtime",
            RowKind::Unrecorded => "unrecorded",
        }
    }
}

/// One line of the report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Row {
    /// Worker name, owner, user or GPU uuid (per `GroupBy`); for the
    /// unpromised kinds under worker/owner/user: "outside", "idle", "downtime", "unrecorded".
    pub key: String,
    pub kind: RowKind,
    /// The GPU, or "" when rows of several GPUs were merged.
    pub gpu_uuid: String,
    /// GPU-milliseconds: time × fraction of the GPU.
    pub gpu_ms: u64,
    pub energy_mj: u64,
    /// Utilisation × fraction × time, rounded down (so never above
    /// `gpu_ms`); over the time a utilisation was measured. `None` when no
    /// measurement covering the row's time had a utilisation.
    pub busy_gpu_ms: Option<u64>,
}

/// Why a report was refused. The message starts with the field's name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReportError {
    /// `until` is not after `since`.
    EmptyWindow { since_ms: i64, until_ms: i64 },
    /// `group_by` is not one of `GROUP_BY_ACCEPTED`.
    UnknownGroupBy(String),
}

impl ReportError {
    /// The request field at fault.
    pub fn field(&self) -> &'static str {
        match self {
            ReportError::EmptyWindow { .. } => "until",
            ReportError::UnknownGroupBy(_) => "group_by",
        }
    }
}

impl fmt::Display for ReportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReportError::EmptyWindow { since_ms, until_ms } => write!(
                f,
                "until: `until` must be after `since`; got since {since_ms} ms, until {until_ms} ms"
            ),
            ReportError::UnknownGroupBy(given) => write!(
                f,
                "group_by: one of {GROUP_BY_ACCEPTED}; got {:?}",
                clip(given)
            ),
        }
    }
}

impl std::error::Error for ReportError {}

impl From<ReportError> for crate::error::Error {
    fn from(e: ReportError) -> crate::error::Error {
        // Display already starts with the field path, as InvalidRequest wants.
        crate::error::Error::InvalidRequest(e.to_string())
    }
}

/// GPU-milliseconds as GPU-hours, for display.
pub fn hours(ms: u64) -> f64 {
    ms as f64 / 3_600_000.0
}

/// The part of a measured interval's energy that falls in `[from_ms, to_ms)`:
/// the energy spread evenly over the interval, counted from its start up to
/// each edge and rounded down there. The floors telescope: adjacent pieces
/// of an interval get exactly what the whole would, so a day counted alone
/// (a rolled-up day) gets what it gets inside a longer window. An empty or
/// reversed interval measured nothing. Per GPU, the report's energy rows
/// sum exactly to the sum of this over the GPU's intervals.
pub fn clipped_energy_mj(m: &Measured, from_ms: i64, to_ms: i64) -> u64 {
    if m.to_ms <= m.from_ms {
        return 0;
    }
    let (a, b) = (m.from_ms.max(from_ms), m.to_ms.min(to_ms));
    if a >= b {
        return 0;
    }
    let len = span(m.from_ms, m.to_ms);
    let upto = |t| mul_div(u128::from(m.energy_mj), span(m.from_ms, t), len).0;
    // Both are at most energy_mj, since the spans are at most the interval.
    (upto(b) - upto(a)) as u64
}

/// The start (UTC midnight) of the day holding `t`.
pub fn day_start(t: i64) -> i64 {
    t.div_euclid(DAY_MS).saturating_mul(DAY_MS)
}

/// The window a report of `[from_ms, to_ms)` covers: an edge inside a
/// rolled-up day moves out to that day's edge. Such a day's intervals are
/// gone and only its whole is known, so the report covers it whole and
/// stays exact rather than guess at a part.
pub fn covered(from_ms: i64, to_ms: i64, rolled: &[RolledDay]) -> (i64, i64) {
    let (mut from, mut to) = (from_ms, to_ms);
    for d in rolled {
        let end = d.day_ms.saturating_add(DAY_MS);
        if d.day_ms < from && from < end {
            from = d.day_ms;
        }
        if d.day_ms < to && to < end {
            to = end;
        }
    }
    (from, to)
}

/// One GPU's UTC day `[day_ms, day_ms + DAY_MS)` folded into its base
/// rows' exact sums. A report given this in `Ledger::rolled`, and no longer
/// the day's measured intervals, equals the report over the raw facts, as
/// long as the ledger's facts reach the day's end (the day is closed).
pub fn roll_day(day_ms: i64, gpu: &GpuFacts, ledger: &Ledger<'_>) -> RolledDay {
    let (energy_mj, sums) = sums_between(day_ms, day_ms.saturating_add(DAY_MS), gpu, ledger);
    RolledDay {
        gpu_uuid: gpu.uuid.clone(),
        day_ms,
        energy_mj,
        sums,
    }
}

/// One GPU's raw facts over `[from_ms, to_ms)` as its base rows' exact
/// sums (nonzero ones, sorted) and the energy measured in it, in mJ.
/// Additive: cut anywhere, the two sides' sums add up to the whole's to
/// the last unit, which is what lets a rolled-up day stand in for its facts.
pub fn sums_between(
    from_ms: i64,
    to_ms: i64,
    gpu: &GpuFacts,
    ledger: &Ledger<'_>,
) -> (u64, Vec<(Base, Sums)>) {
    let mut sums = BTreeMap::new();
    let mut energy = 0;
    if from_ms < to_ms {
        let w = Window {
            from: from_ms,
            to: to_ms,
        };
        energy = sweep(w, gpu, ledger, &mut sums);
    }
    sums.retain(|_, s: &mut Sums| *s != Sums::default());
    (to_u64(energy), sums.into_iter().collect())
}

/// The usage report over `[from_ms, to_ms)`, grouped by `by`, sorted by GPU
/// (index, then uuid; merged rows have none), then kind, then key. Rows with
/// neither time nor energy are left out. An edge inside a rolled-up day
/// covers that whole day (`covered`).
pub fn report(
    from_ms: i64,
    to_ms: i64,
    ledger: &Ledger<'_>,
    by: GroupBy,
) -> Result<Vec<Row>, ReportError> {
    if from_ms >= to_ms {
        return Err(ReportError::EmptyWindow {
            since_ms: from_ms,
            until_ms: to_ms,
        });
    }
    let (from_ms, to_ms) = covered(from_ms, to_ms, ledger.rolled);
    let window = Window {
        from: from_ms,
        to: to_ms,
    };
    // Each GPU's raw facts summed first: the parts below borrow their keys
    // from these sums and from the rolled-up days, so that a year's tens of
    // thousands of parts copy no string (only the rows made of them do).
    let mut seen: HashSet<&str> = HashSet::new();
    let accounts: Vec<GpuAccount<'_>> = (ledger.gpus.iter())
        // A uuid listed twice is one GPU; the first listing counts.
        .filter(|gpu| seen.insert(gpu.uuid.as_str()))
        .map(|gpu| GpuAccount::of(window, gpu, ledger))
        .collect();
    // Sort key: the GPU for per-GPU rows (None when merged), kind, key.
    // Gathered, then sorted and merged once: a year holds tens of
    // thousands of rows, and a map's search per part cost more.
    type SortKey<'k> = (Option<(u32, &'k str)>, RowKind, &'k str);
    // Room for a part per base row of every rolled-up day (most of a long
    // window's), and a few more: growing it showed in a year's report.
    let rolled_rows: usize = ledger.rolled.iter().map(|d| d.sums.len()).sum();
    let mut parts: Vec<(SortKey<'_>, Part)> = Vec::with_capacity(rolled_rows + 64);
    for account in &accounts {
        let gpu = account.gpu;
        account.split(|base, part| {
            let (kind, key) = group(base, gpu, by);
            let sort = (by == GroupBy::Gpu).then_some((gpu.index, gpu.uuid.as_str()));
            parts.push(((sort, kind, key), part));
        });
    }
    // Stable: a key's parts add up in the order the GPUs gave them.
    parts.sort_by(|a, b| a.0.cmp(&b.0));
    let mut rows: Vec<Row> = Vec::new();
    let mut last: Option<SortKey<'_>> = None;
    for (sort, part) in parts {
        if last != Some(sort) {
            let (gpu, kind, key) = sort;
            rows.push(Row {
                key: key.to_string(),
                kind,
                gpu_uuid: gpu.map_or_else(String::new, |(_, u)| u.to_string()),
                gpu_ms: 0,
                energy_mj: 0,
                busy_gpu_ms: None,
            });
            last = Some(sort);
        }
        let row = rows.last_mut().expect("pushed above");
        row.gpu_ms = row.gpu_ms.saturating_add(part.gpu_ms);
        row.energy_mj = row.energy_mj.saturating_add(part.energy_mj);
        row.busy_gpu_ms = match (row.busy_gpu_ms, part.busy_gpu_ms) {
            (Some(a), Some(b)) => Some(a.saturating_add(b)),
            (a, b) => a.or(b),
        };
    }
    rows.retain(|r| r.gpu_ms > 0 || r.energy_mj > 0);
    Ok(rows)
}

/// The report's window, `from < to`.
#[derive(Clone, Copy, Debug)]
struct Window {
    from: i64,
    to: i64,
}

impl Window {
    /// `[from, to)` clipped to the window; None when nothing is left.
    fn clip(self, from: i64, to: i64) -> Option<(i64, i64)> {
        let (a, b) = (from.max(self.from), to.min(self.to));
        (a < b).then_some((a, b))
    }
}

/// A part's time units from the epoch up to `t`, for a part of `weight`
/// in `total`: `t × SCALE × weight / total` rounded down (towards the past
/// before the epoch). One origin for every segment, so that differences
/// telescope; the epoch, so that today's products stay inside u128.
fn ms_until(t: i64, weight: u128, total: u128) -> i128 {
    let (q, r) = mul_div(SCALE * u128::from(t.unsigned_abs()), weight, total);
    // q <= SCALE × |t| < 2^96.
    if t >= 0 {
        q as i128
    } else {
        -(q as i128) - i128::from(r > 0)
    }
}

/// Length of `[a, b)` in ms; i128 so even `i64::MIN..i64::MAX` fits.
fn span(a: i64, b: i64) -> u128 {
    (i128::from(b) - i128::from(a)).max(0) as u128
}

/// The up intervals clipped to the window, sorted and merged so that the
/// sweep can ask "is the daemon up here" with one pointer.
fn merge_up(up: &[Up], w: Window) -> Vec<(i64, i64)> {
    let mut clipped: Vec<(i64, i64)> = up
        .iter()
        .filter_map(|u| w.clip(u.from_ms, u.to_ms))
        .collect();
    clipped.sort_unstable();
    let mut merged: Vec<(i64, i64)> = Vec::with_capacity(clipped.len());
    for (a, b) in clipped {
        match merged.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    merged
}

/// Who a piece of one GPU's time belongs to, before grouping. Rounding is
/// done at this level, so every grouping is a sum of the same numbers and
/// the groupings agree with each other exactly.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Base {
    Worker { worker: String, owner: String },
    Slice { template: String, user: String },
    Outside,
    Idle,
    Downtime,
    Unrecorded,
}

impl Base {
    pub fn kind(&self) -> RowKind {
        match self {
            Base::Worker { .. } => RowKind::Worker,
            Base::Slice { .. } => RowKind::Slice,
            Base::Outside => RowKind::Outside,
            Base::Idle => RowKind::Idle,
            Base::Downtime => RowKind::Downtime,
            Base::Unrecorded => RowKind::Unrecorded,
        }
    }
}

/// A base row's exact sums over some of one GPU's time, before the
/// window's one rounding: what a rolled-up day keeps per base row.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sums {
    /// Time, in 1/2^32 ms.
    pub ms: u128,
    /// Energy, in 1/2^32 mJ.
    pub energy: u128,
    /// Time units × utilisation percent; `None` when no utilisation was
    /// measured in its time.
    pub busy: Option<u128>,
}

impl Sums {
    fn add(&mut self, other: &Sums) {
        self.ms += other.ms;
        self.energy += other.energy;
        self.busy = match (self.busy, other.busy) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
    }
}

/// One GPU's UTC day folded into its base rows' sums (`roll_day`): the
/// ledger keeps this in place of the day's measured intervals.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RolledDay {
    pub gpu_uuid: String,
    /// The day's start, a multiple of `DAY_MS`.
    pub day_ms: i64,
    /// The energy measured in the day, as `clipped_energy_mj` counts it.
    pub energy_mj: u64,
    /// One entry per base row, sorted.
    pub sums: Vec<(Base, Sums)>,
}

/// A row's kind and key under `by`.
fn group<'k>(base: &'k Base, gpu: &'k GpuFacts, by: GroupBy) -> (RowKind, &'k str) {
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
struct Holder {
    base: usize,
    from: i64,
    to: i64,
    /// Bytes of the GPU it is promised (the GPU's size when whole).
    weight: u128,
    runs_while_down: bool,
}

/// A measured interval of one GPU, clipped to the window.
struct Meas {
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
struct Part {
    gpu_ms: u64,
    energy_mj: u64,
    busy_gpu_ms: Option<u64>,
}

/// One GPU's window before it is split among its base rows: its
/// rolled-up days whole inside the window, as they were kept, and the sums
/// of its raw facts over the rest.
struct GpuAccount<'a> {
    gpu: &'a GpuFacts,
    window: Window,
    days: Vec<&'a RolledDay>,
    raw: BTreeMap<Base, Sums>,
    /// The energy measured in the window, in mJ.
    energy: u128,
}

impl<'a> GpuAccount<'a> {
    fn of(w: Window, gpu: &'a GpuFacts, ledger: &Ledger<'a>) -> GpuAccount<'a> {
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
    fn split<'s>(&'s self, mut emit: impl FnMut(&'s Base, Part)) {
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
fn sweep(w: Window, gpu: &GpuFacts, ledger: &Ledger<'_>, sums: &mut BTreeMap<Base, Sums>) -> u128 {
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

fn to_u64(x: u128) -> u64 {
    u64::try_from(x).unwrap_or(u64::MAX)
}

/// Splits `total` in proportion to `weights` into integers that sum to
/// `total` exactly (largest-remainder method): each part is its exact share
/// rounded down, and the units left over go to the largest remainders, ties
/// to the lower index. A part never exceeds its exact share rounded up, and a
/// zero weight gets zero. All zero weights get nothing.
fn apportion(total: u128, weights: &[u128]) -> Vec<u128> {
    let sum: u128 = weights.iter().sum();
    if sum == 0 {
        return vec![0; weights.len()];
    }
    let mut parts = Vec::with_capacity(weights.len());
    let mut rems = Vec::with_capacity(weights.len());
    for &wt in weights {
        let (q, r) = mul_div(total, wt, sum);
        parts.push(q);
        rems.push(r);
    }
    // Fewer than weights.len() units are left, one per largest remainder.
    let left = total - parts.iter().sum::<u128>();
    if left > 0 {
        let mut order: Vec<usize> = (0..weights.len()).collect();
        order.sort_by(|&x, &y| rems[y].cmp(&rems[x]).then(x.cmp(&y)));
        for &i in order.iter().take(left as usize) {
            parts[i] += 1;
        }
    }
    parts
}

/// `(a × b / d, a × b % d)` exactly, with a 256-bit product where u128
/// overflows. Requires `d > 0` and a quotient that fits u128 (true whenever
/// `b <= d`, as in every call here).
fn mul_div(a: u128, b: u128, d: u128) -> (u128, u128) {
    // The common cases of a sweep, without a division: a segment that is
    // its measured interval whole (b = d) or starts it (a = 0), a part
    // that is the whole GPU.
    if b == d {
        return (a, 0);
    }
    if a == 0 || b == 0 {
        return (0, 0);
    }
    if let Some(p) = a.checked_mul(b) {
        return (p / d, p % d);
    }
    let (hi, lo) = wide_mul(a, b);
    debug_assert!(hi < d, "quotient does not fit u128");
    // Long division, one bit of `lo` at a time; `hi < d` keeps r < d.
    let mut r = hi;
    let mut q: u128 = 0;
    for bit in (0..128).rev() {
        let carry = r >> 127;
        r = (r << 1) | ((lo >> bit) & 1);
        q <<= 1;
        // With the carry the true value is >= 2^128 > d; wrapping gives it less d.
        if carry == 1 || r >= d {
            r = r.wrapping_sub(d);
            q |= 1;
        }
    }
    (q, r)
}

/// The 256-bit product of two u128, as (high, low) halves.
fn wide_mul(a: u128, b: u128) -> (u128, u128) {
    const LOW: u128 = u64::MAX as u128;
    let (a1, a0) = (a >> 64, a & LOW);
    let (b1, b0) = (b >> 64, b & LOW);
    let (p00, p01, p10, p11) = (a0 * b0, a0 * b1, a1 * b0, a1 * b1);
    // The middle column, below 3 × 2^64, carries into the high half.
    let mid = (p00 >> 64) + (p01 & LOW) + (p10 & LOW);
    let lo = (p00 & LOW) | (mid << 64);
    let hi = p11 + (p01 >> 64) + (p10 >> 64) + (mid >> 64);
    (hi, lo)
}

#[cfg(test)]
mod tests {
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
}
