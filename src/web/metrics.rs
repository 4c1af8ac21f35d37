//! The page's Prometheus text (`/metrics`): gauges of the snapshot and
//! counters of the ledger's usage, with labels escaped per the exposition
//! format.

use super::PageSnapshot;
use crate::views::GpuView;
use crate::worker::State;

/// Prometheus text format.
pub fn metrics(snap: &PageSnapshot) -> String {
    let mut out = String::new();
    let gb = |v: f64| (v * crate::quantity::GB_BYTES as f64).round() as u64;
    let mut typed = |kind: &str, name: &str, help: &str, rows: Vec<(String, String)>| {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
        for (labels, value) in rows {
            out.push_str(&format!("{name}{labels} {value}\n"));
        }
    };
    let mut family =
        |name: &str, help: &str, rows: Vec<(String, String)>| typed("gauge", name, help, rows);
    let gpu_labels = |v: &GpuView| {
        format!(
            "{{machine=\"{}\",gpu=\"{}\",uuid=\"{}\"}}",
            label(&snap.machine),
            v.index,
            label(&v.uuid)
        )
    };
    let per_gpu = |f: &dyn Fn(&GpuView) -> f64| {
        snap.gpus
            .iter()
            .map(|g| (gpu_labels(&g.view), gb(f(&g.view)).to_string()))
            .collect::<Vec<_>>()
    };
    family(
        "astraeus_build_info",
        "Always 1; the running build's version, and its commit when the build knew it (ASTRAEUS_COMMIT at build time; \"unknown\" otherwise).",
        vec![(
            format!(
                "{{version=\"{}\",commit=\"{}\"}}",
                label(env!("CARGO_PKG_VERSION")),
                label(option_env!("ASTRAEUS_COMMIT").unwrap_or("unknown"))
            ),
            "1".to_string(),
        )],
    );
    family(
        "astraeus_gpu_healthy",
        "1 when the GPU is fit for work, 0 when it is not (see the page or the Health property for why).",
        snap.gpus
            .iter()
            .map(|g| (gpu_labels(&g.view), u8::from(g.view.healthy).to_string()))
            .collect(),
    );
    family(
        "astraeus_gpu_draining",
        "1 while the GPU is kept (drained) for a whole-GPU request that waited too long.",
        snap.gpus
            .iter()
            .map(|g| {
                let draining = !g.view.draining_for.is_empty();
                (gpu_labels(&g.view), u8::from(draining).to_string())
            })
            .collect(),
    );
    family(
        "astraeus_gpu_over_promised",
        "1 when the GPU's sharers were promised more than it now offers (something outside took memory).",
        snap.gpus
            .iter()
            .map(|g| {
                let over = g.view.warning.starts_with("over-promised");
                (gpu_labels(&g.view), u8::from(over).to_string())
            })
            .collect(),
    );
    family(
        "astraeus_gpu_memory_total_bytes",
        "GPU memory.",
        per_gpu(&|v| v.total_gb),
    );
    family(
        "astraeus_gpu_memory_offered_bytes",
        "GPU memory offered to shared work (total less what is held outside and what sharers use beyond their shares).",
        per_gpu(&|v| v.offered_gb),
    );
    family(
        "astraeus_gpu_memory_outside_bytes",
        "GPU memory held outside Astraeus.",
        per_gpu(&|v| v.held_outside_gb),
    );
    family(
        "astraeus_gpu_memory_beyond_shares_bytes",
        "GPU memory shared workers use beyond their shares.",
        per_gpu(&|v| v.beyond_shares_gb),
    );
    family(
        "astraeus_gpu_memory_taken_bytes",
        "GPU memory promised to shared workers.",
        per_gpu(&|v| v.taken_gb),
    );
    let mut shares = Vec::new();
    let mut used = Vec::new();
    for w in &snap.workers {
        let v = &w.view;
        for (index, uuid) in &v.gpus {
            let labels = format!(
                "{{machine=\"{}\",worker=\"{}\",gpu=\"{index}\",uuid=\"{}\"}}",
                label(&snap.machine),
                label(&v.name),
                label(uuid)
            );
            let whole = snap
                .gpus
                .iter()
                .find(|g| g.view.uuid == *uuid)
                .map_or(0.0, |g| g.view.total_gb);
            shares.push((labels, gb(w.shared_gb.unwrap_or(whole)).to_string()));
        }
        if v.gpu_used_gb >= 0.0 && !v.gpus.is_empty() {
            let labels = format!(
                "{{machine=\"{}\",worker=\"{}\"}}",
                label(&snap.machine),
                label(&v.name)
            );
            used.push((labels, gb(v.gpu_used_gb).to_string()));
        }
    }
    family(
        "astraeus_worker_share_bytes",
        "GPU memory promised to a worker on a GPU (a whole GPU's memory when whole).",
        shares,
    );
    family(
        "astraeus_worker_used_bytes",
        "GPU memory a worker's processes use now (the most on any one of its GPUs).",
        used,
    );
    let m = format!("{{machine=\"{}\"}}", label(&snap.machine));
    let count = |state: State| {
        snap.workers
            .iter()
            .filter(|w| w.view.state == state)
            .count()
    };
    family(
        "astraeus_workers_pending",
        "Workers waiting for room.",
        vec![(m.clone(), count(State::Pending).to_string())],
    );
    family(
        "astraeus_workers_running",
        "Workers placed.",
        vec![(m, count(State::Running).to_string())],
    );
    family(
        "astraeus_slice_active",
        "1 while a template's time slice is scheduled now.",
        snap.slices
            .iter()
            .map(|s| {
                (
                    format!("{{template=\"{}\"}}", label(&s.template)),
                    u8::from(s.active.is_some()).to_string(),
                )
            })
            .collect(),
    );
    family(
        "astraeus_handoff_dead_time_seconds",
        "The last handoff's dead time: release confirmed → start issued.",
        snap.slices
            .iter()
            .filter_map(|s| {
                let ms = s.dead_time_ms?;
                Some((
                    format!("{{template=\"{}\"}}", label(&s.template)),
                    format!("{:.3}", ms as f64 / 1000.0),
                ))
            })
            .collect(),
    );
    counters(snap, &mut typed);
    out
}

/// Writes one metric family: (type, name, help, rows of labels and value).
type Family<'a> = dyn FnMut(&str, &str, &str, Vec<(String, String)>) + 'a;

/// The counters: GPU-time and energy per GPU (by what it went to) and per
/// live worker, kept in the ledger (monotonic across restarts), counted up
/// to the last closed usage interval.
fn counters(snap: &PageSnapshot, typed: &mut Family) {
    let c = &snap.counters;
    let m = label(&snap.machine);
    // GPUs no longer on the machine are left out (their series end).
    let per_gpu = c.gpu.iter().filter_map(|((uuid, kind), n)| {
        let g = snap.gpus.iter().find(|g| g.view.uuid == *uuid)?;
        let labels = format!(
            "{{machine=\"{m}\",gpu=\"{}\",uuid=\"{}\",kind=\"{}\"}}",
            g.view.index,
            label(uuid),
            label(kind)
        );
        Some((labels, *n))
    });
    time_and_energy(
        typed,
        per_gpu.collect(),
        ("astraeus_gpu_seconds_total", "GPU-seconds by what they went to: worker, slice, outside, idle, downtime, unrecorded (before the ledger's records begin; a shared GPU counts for each sharer by its share of the memory; per GPU the kinds add up to the time counted)."),
        ("astraeus_gpu_energy_joules_total", "Energy the GPU drew, by what it went to (as the GPU-seconds)."),
    );
    let per_worker = snap.workers.iter().filter_map(|w| {
        let n = c.worker.get(&w.view.name)?;
        let labels = format!("{{machine=\"{m}\",worker=\"{}\"}}", label(&w.view.name));
        Some((labels, *n))
    });
    time_and_energy(
        typed,
        per_worker.collect(),
        (
            "astraeus_worker_gpu_seconds_total",
            "GPU-seconds a live worker was given (its share of each GPU's memory when shared).",
        ),
        (
            "astraeus_worker_energy_joules_total",
            "Energy billed to a live worker (its share of each GPU's energy).",
        ),
    );
    typed(
        "gauge",
        "astraeus_usage_counted_until_timestamp_seconds",
        "The counters include everything before this time (the last closed usage interval).",
        vec![(
            format!("{{machine=\"{m}\"}}"),
            format!("{:.3}", c.until_ms as f64 / 1000.0),
        )],
    );
}

/// Two counter families from one set of rows: seconds and joules, each
/// (name, help).
fn time_and_energy(
    typed: &mut Family,
    rows: Vec<(String, crate::usage::Counted)>,
    seconds: (&str, &str),
    joules: (&str, &str),
) {
    let as_unit = |v: u64| format!("{:.3}", v as f64 / 1000.0);
    let secs = rows
        .iter()
        .map(|(l, n)| (l.clone(), as_unit(n.gpu_ms)))
        .collect();
    typed("counter", seconds.0, seconds.1, secs);
    let energy = rows
        .into_iter()
        .map(|(l, n)| (l, as_unit(n.energy_mj)))
        .collect();
    typed("counter", joules.0, joules.1, energy);
}

/// A Prometheus label value, escaped.
pub(super) fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
