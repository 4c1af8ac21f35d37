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

mod exact;
mod sweep;

use exact::*;
use sweep::*;

#[cfg(test)]
mod tests;
