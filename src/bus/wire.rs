//! What travels on the bus as rows: named structs whose D-Bus signature is the
//! tuple the introspection XML documents (a struct of fields in this order).
//! The loop answers with them, the adaptors send them, and `astraeusctl`
//! reads them back: this file imports nothing else of the crate.

use serde::{Deserialize, Serialize};
use zbus::Type;

/// One row of ListWorkers: `(ssusdaud)`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, Type)]
pub struct WorkerRow {
    pub name: String,
    pub state: String,
    pub owner_uid: u32,
    /// The GPUs column: `1 · shared 2.5 GB`, `0 · whole`, `—`.
    pub gpus: String,
    /// GB its processes use now, at most on any one GPU; -1 when unknown.
    pub gpu_used_gb: f64,
    /// The indices of the GPUs it holds (empty while it waits).
    pub gpu_indices: Vec<u32>,
    /// GB of each GPU it asked to share; 0 for whole GPUs or none.
    pub gpu_shared_gb: f64,
}

/// One row of ListEnded: `(susaudxxxis)`, a worker that ended.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, Type)]
pub struct EndedRow {
    pub name: String,
    pub owner_uid: u32,
    /// The GPUs column it had: `1 · shared 2.5 GB`, `0 · whole`, `—`.
    pub gpus: String,
    pub gpu_indices: Vec<u32>,
    /// GB of each GPU it shared; 0 when whole or none.
    pub gpu_shared_gb: f64,
    /// Epoch milliseconds: submitted, placed (0 when it never was), ended.
    pub submitted_ms: i64,
    pub started_ms: i64,
    pub ended_ms: i64,
    /// Its workload's exit status; -1 when it did not exit by itself.
    pub exit_status: i32,
    /// How it ended: `stopped`, `exited`, `failed: …`.
    pub end_reason: String,
}

/// One row of ListGpus: `(usssddddsss)`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Type)]
pub struct GpuRow {
    pub index: u32,
    pub uuid: String,
    pub model: String,
    pub mode: String,
    pub total_gb: f64,
    pub offered_gb: f64,
    pub held_outside_gb: f64,
    pub taken_gb: f64,
    pub warning: String,
    /// The whole request it is drained for; empty when none.
    pub draining_for: String,
    /// "ok", or why the GPU is not healthy.
    pub health: String,
}

/// One sharer of a GPU: `(sd)`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Type)]
pub struct Sharer {
    pub name: String,
    pub gb: f64,
}

/// ListSharers' two out arguments: `a(sd)s`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Type)]
pub struct Sharers {
    pub sharers: Vec<Sharer>,
    /// The seed's line: `GPU 0 of majin: 6.5 of 7 GB taken by shared work`.
    pub summary: String,
}

/// WhyNot's three out arguments: `baus`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Type)]
pub struct WhyNot {
    pub fits: bool,
    pub gpus: Vec<u32>,
    pub reasons: Vec<String>,
}

/// One slice of ListSlices: `(sxxs)`; times in epoch seconds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Type)]
pub struct SliceRow {
    pub template: String,
    pub start: i64,
    pub end: i64,
    /// poweroff, poweroff-hard, handoff:<template> or open.
    pub ends_by: String,
}

/// One template of ListTemplates: `(ssss)`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Type)]
pub struct TemplateRow {
    pub name: String,
    /// `name (internal|external)`.
    pub user: String,
    pub domain: String,
    pub state: String,
}

/// One slice of SliceReport: `(ssxxxxdddddds)`; -1 where nothing was measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Type)]
pub struct SliceReportRow {
    pub template: String,
    pub user: String,
    pub start: i64,
    /// 0 while it is still on.
    pub end: i64,
    pub dead_time_ms: i64,
    pub start_to_ready_ms: i64,
    pub cpu_avg_pct: f64,
    pub cpu_peak_pct: f64,
    pub gpu_avg_pct: f64,
    pub gpu_peak_pct: f64,
    pub gpu_memory_peak_gb: f64,
    pub gpu_energy_wh: f64,
    /// libvirt's error when the slice never came up.
    pub error: String,
}

/// One row of UsageReport: `(sssttx)`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Type)]
pub struct UsageRow {
    pub key: String,
    /// worker, slice, outside, idle or downtime.
    pub kind: String,
    /// "" when merged over GPUs.
    pub gpu_uuid: String,
    pub gpu_ms: u64,
    pub energy_mj: u64,
    /// -1 when not measured.
    pub busy_gpu_ms: i64,
}

/// A slice as a Template object shows it: `(xxs)`; (0, 0, "") when none.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, Type)]
pub struct SliceTriple {
    pub start: i64,
    pub end: i64,
    pub ends_by: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_keep_the_documented_signatures() {
        assert_eq!(WorkerRow::SIGNATURE.to_string(), "(ssusdaud)");
        assert_eq!(EndedRow::SIGNATURE.to_string(), "(susaudxxxis)");
        assert_eq!(GpuRow::SIGNATURE.to_string(), "(usssddddsss)");
        assert_eq!(SliceRow::SIGNATURE.to_string(), "(sxxs)");
        assert_eq!(TemplateRow::SIGNATURE.to_string(), "(ssss)");
        assert_eq!(SliceReportRow::SIGNATURE.to_string(), "(ssxxxxdddddds)");
        assert_eq!(UsageRow::SIGNATURE.to_string(), "(sssttx)");
        assert_eq!(SliceTriple::SIGNATURE.to_string(), "(xxs)");
        assert_eq!(Sharers::SIGNATURE.to_string(), "(a(sd)s)");
        assert_eq!(WhyNot::SIGNATURE.to_string(), "(bauas)");
    }
}
