//! What travels on the bus as rows: named structs whose D-Bus signature is the
//! tuple the introspection XML documents (a struct of fields in this order).
//! The loop answers with them, the adaptors send them, and `astraeusctl`
//! reads them back: this file imports nothing else of the crate. (A usage
//! report is the exception on the way out: the loop answers with the
//! report's own rows, and the adaptor sends each as a [`UsageRowRef`].)

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

/// One slice of ListSlicesMs: `(sxxs)`; instants in epoch ms.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Type)]
pub struct SliceRow {
    pub template: String,
    pub start_ms: i64,
    pub end_ms: i64,
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

/// One slice of SliceReportMs: `(ssxxxxdddddxs)`; -1 where nothing was
/// measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Type)]
pub struct SliceReportRow {
    pub template: String,
    pub user: String,
    pub start_ms: i64,
    /// 0 while it is still on.
    pub end_ms: i64,
    pub dead_time_ms: i64,
    pub start_to_ready_ms: i64,
    pub cpu_avg_pct: f64,
    pub cpu_peak_pct: f64,
    pub gpu_avg_pct: f64,
    pub gpu_peak_pct: f64,
    pub gpu_memory_peak_gb: f64,
    pub gpu_energy_mj: i64,
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

impl UsageRow {
    /// The bytes rows take as a D-Bus body (`a(sssttx)`), from each row's
    /// three strings (key, kind, gpu uuid), counted without serialising
    /// them: a year's report is tens of thousands of rows, and counting them
    /// through the serialiser cost as much as sending them. Each struct
    /// starts 8-aligned, each string is its u32 length, its bytes and a NUL,
    /// 4-aligned; the three integers are 8-aligned.
    pub fn wire_size<'a>(rows: impl IntoIterator<Item = [&'a str; 3]>) -> usize {
        let align = |at: usize, to: usize| at.next_multiple_of(to);
        // The array's length, then the padding to its first struct.
        let mut at = 8;
        for texts in rows {
            at = align(at, 8);
            for text in texts {
                at = align(at, 4) + 4 + text.len() + 1;
            }
            at = align(at, 8) + 3 * 8;
        }
        at
    }
}

/// [`UsageRow`] borrowed: what the daemon serialises a report's rows as,
/// without copying them into UsageRows first (a year's report is tens of
/// thousands). The same signature, field for field.
#[derive(Debug, Serialize, Type)]
pub struct UsageRowRef<'a> {
    pub key: &'a str,
    pub kind: &'a str,
    pub gpu_uuid: &'a str,
    pub gpu_ms: u64,
    pub energy_mj: u64,
    pub busy_gpu_ms: i64,
}

/// A slice as a Template object shows it (`ActiveSliceMs`): `(xxs)`,
/// instants in epoch ms; (0, 0, "") when none.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, Type)]
pub struct SliceTriple {
    pub start_ms: i64,
    pub end_ms: i64,
    pub ends_by: String,
}

/// The slice rows as Node1's first methods send them, instants in epoch
/// seconds and energy in Wh (ListSlices, ListNextSlices, PreviewSchedule,
/// SliceReport, ActiveSlice, NextSlice). Kept for one release beside the
/// `*Ms` methods, then removed (docs/operations.md, Units).
pub mod seconds {
    use serde::{Deserialize, Serialize};
    use zbus::zvariant::Type;

    /// `(sxxs)`.
    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Type)]
    pub struct SliceRow {
        pub template: String,
        pub start: i64,
        pub end: i64,
        pub ends_by: String,
    }

    /// `(ssxxxxdddddds)`.
    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Type)]
    pub struct SliceReportRow {
        pub template: String,
        pub user: String,
        pub start: i64,
        pub end: i64,
        pub dead_time_ms: i64,
        pub start_to_ready_ms: i64,
        pub cpu_avg_pct: f64,
        pub cpu_peak_pct: f64,
        pub gpu_avg_pct: f64,
        pub gpu_peak_pct: f64,
        pub gpu_memory_peak_gb: f64,
        pub gpu_energy_wh: f64,
        pub error: String,
    }

    /// `(xxs)`.
    #[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, Type)]
    pub struct SliceTriple {
        pub start: i64,
        pub end: i64,
        pub ends_by: String,
    }

    /// Epoch ms to epoch seconds, rounded down (towards the past).
    fn secs(ms: i64) -> i64 {
        ms.div_euclid(1000)
    }

    impl From<super::SliceRow> for SliceRow {
        fn from(r: super::SliceRow) -> Self {
            SliceRow {
                template: r.template,
                start: secs(r.start_ms),
                end: secs(r.end_ms),
                ends_by: r.ends_by,
            }
        }
    }

    impl From<super::SliceTriple> for SliceTriple {
        fn from(t: super::SliceTriple) -> Self {
            SliceTriple {
                start: secs(t.start_ms),
                end: secs(t.end_ms),
                ends_by: t.ends_by,
            }
        }
    }

    impl From<super::SliceReportRow> for SliceReportRow {
        fn from(r: super::SliceReportRow) -> Self {
            SliceReportRow {
                template: r.template,
                user: r.user,
                start: secs(r.start_ms),
                end: secs(r.end_ms),
                dead_time_ms: r.dead_time_ms,
                start_to_ready_ms: r.start_to_ready_ms,
                cpu_avg_pct: r.cpu_avg_pct,
                cpu_peak_pct: r.cpu_peak_pct,
                gpu_avg_pct: r.gpu_avg_pct,
                gpu_peak_pct: r.gpu_peak_pct,
                gpu_memory_peak_gb: r.gpu_memory_peak_gb,
                gpu_energy_wh: if r.gpu_energy_mj < 0 {
                    -1.0
                } else {
                    r.gpu_energy_mj as f64 / 3.6e6
                },
                error: r.error,
            }
        }
    }
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
        assert_eq!(SliceReportRow::SIGNATURE.to_string(), "(ssxxxxdddddxs)");
        assert_eq!(UsageRow::SIGNATURE.to_string(), "(sssttx)");
        assert_eq!(UsageRowRef::SIGNATURE.to_string(), "(sssttx)");
        assert_eq!(SliceTriple::SIGNATURE.to_string(), "(xxs)");
        assert_eq!(Sharers::SIGNATURE.to_string(), "(a(sd)s)");
        assert_eq!(WhyNot::SIGNATURE.to_string(), "(bauas)");
        // The old methods' rows, as they were.
        assert_eq!(seconds::SliceRow::SIGNATURE.to_string(), "(sxxs)");
        assert_eq!(
            seconds::SliceReportRow::SIGNATURE.to_string(),
            "(ssxxxxdddddds)"
        );
        assert_eq!(seconds::SliceTriple::SIGNATURE.to_string(), "(xxs)");
    }

    /// Counted as zbus serialises them (the oracle), for rows whose
    /// strings end at every alignment.
    #[test]
    fn usage_rows_are_counted_as_zbus_serialises_them() {
        let ctxt = zbus::wire::serialized::Context::new(zbus::wire::LE, 0);
        let mut rows = Vec::new();
        for n in 0..40 {
            let size = zbus::wire::serialized_size(ctxt, &rows).unwrap().size();
            let texts = rows
                .iter()
                .map(|r: &UsageRow| [r.key.as_str(), r.kind.as_str(), r.gpu_uuid.as_str()]);
            assert_eq!(UsageRow::wire_size(texts), size, "{n} rows");
            rows.push(UsageRow {
                key: "k".repeat(n % 11),
                kind: "w".repeat(n % 7),
                gpu_uuid: "g".repeat(n % 5),
                gpu_ms: n as u64,
                energy_mj: 1,
                busy_gpu_ms: -1,
            });
        }
    }

    #[test]
    fn the_old_rows_say_what_the_old_methods_said() {
        let row = SliceReportRow {
            template: "t".into(),
            user: "u (internal)".into(),
            start_ms: 1_700_000_000_999,
            end_ms: 0,
            dead_time_ms: 12,
            start_to_ready_ms: -1,
            cpu_avg_pct: 1.0,
            cpu_peak_pct: 2.0,
            gpu_avg_pct: -1.0,
            gpu_peak_pct: -1.0,
            gpu_memory_peak_gb: -1.0,
            gpu_energy_mj: 7_200_000,
            error: String::new(),
        };
        let old = seconds::SliceReportRow::from(row.clone());
        // Seconds rounded down; 0 (still on) stays 0; 7.2e6 mJ = 2 Wh.
        assert_eq!((old.start, old.end), (1_700_000_000, 0));
        assert_eq!(old.gpu_energy_wh, 2.0);
        assert_eq!(old.dead_time_ms, 12);
        let unmeasured = SliceReportRow {
            gpu_energy_mj: -1,
            ..row
        };
        assert_eq!(
            seconds::SliceReportRow::from(unmeasured).gpu_energy_wh,
            -1.0
        );
        // Before the epoch, down is towards the past: -0.5 s is -1 s.
        let t = seconds::SliceTriple::from(SliceTriple {
            start_ms: -500,
            end_ms: 1500,
            ends_by: "open".into(),
        });
        assert_eq!((t.start, t.end), (-1, 1));
    }
}
