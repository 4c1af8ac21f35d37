//! The reports: usage (table, JSON or CSV), the slices ahead, and the
//! slices that ran.

use super::{lists, Local};
use astraeusd::wire::{SliceReportRow, SliceRow, UsageRow};
use serde_json::json;

/// The usage report as a table (hours, kWh), JSON or CSV (exact ms and mJ).
pub fn print_usage(rows: &[UsageRow], by: &str, form: lists::Form, csv: bool) {
    let busy = |b: i64| (b >= 0).then_some(b as u64);
    if form.json {
        let j: Vec<_> = rows
            .iter()
            .map(
                |UsageRow {
                     key,
                     kind,
                     gpu_uuid: gpu,
                     gpu_ms: ms,
                     energy_mj: mj,
                     busy_gpu_ms: b,
                 }| {
                    json!({"key": key, "kind": kind, "gpu": gpu, "gpu_ms": ms,
                       "gpu_hours": *ms as f64 / 3.6e6, "energy_mj": mj,
                       "energy_kwh": *mj as f64 / 3.6e9, "busy_gpu_ms": busy(*b)})
                },
            )
            .collect();
        outln!("{}", serde_json::to_string_pretty(&j).expect("json"));
        return;
    }
    if csv {
        if form.legend {
            outln!("{by},kind,gpu,gpu_ms,energy_mj,busy_gpu_ms");
        }
        for UsageRow {
            key,
            kind,
            gpu_uuid: gpu,
            gpu_ms: ms,
            energy_mj: mj,
            busy_gpu_ms: b,
        } in rows
        {
            let b = busy(*b).map(|b| b.to_string()).unwrap_or_default();
            let key = if key.contains([',', '"', '\n']) {
                format!("\"{}\"", key.replace('"', "\"\""))
            } else {
                key.clone()
            };
            outln!("{key},{kind},{gpu},{ms},{mj},{b}");
        }
        return;
    }
    let w = rows
        .iter()
        .map(|r| r.key.len())
        .max()
        .unwrap_or(8)
        .max(by.len());
    let header = by.to_uppercase();
    let kw = rows.iter().map(|r| r.kind.len()).max().unwrap_or(0).max(8);
    if form.legend {
        outln!(
            "{header:<w$}  {:<kw$}  {:>10}  {:>10}  {:>6}",
            "KIND",
            "GPU-HOURS",
            "ENERGY kWh",
            "BUSY"
        );
    }
    for UsageRow {
        key,
        kind,
        gpu_ms: ms,
        energy_mj: mj,
        busy_gpu_ms: b,
        ..
    } in rows
    {
        let use_ = match busy(*b) {
            Some(b) if *ms > 0 => format!("{:.0}%", b as f64 * 100.0 / *ms as f64),
            _ => "—".into(),
        };
        outln!(
            "{key:<w$}  {kind:<kw$}  {:>10.3}  {:>10.4}  {use_:>6}",
            *ms as f64 / 3.6e6,
            *mj as f64 / 3.6e9
        );
    }
    if form.legend {
        outln!();
        outln!(
            "{} listed.",
            match rows.len() {
                1 => "1 row".to_string(),
                n => format!("{n} rows"),
            }
        );
    }
}

/// Slices as a table in the caller's zone (or JSON), then their notes.
pub fn print_slices(rows: &[SliceRow], notes: &[String], local: &Local, form: lists::Form) {
    if form.json {
        let j: Vec<_> = rows
                    .iter()
                    .map(
                        // `start` and `end` (epoch seconds) kept for one
                        // release beside `start_ms`, `end_ms` (docs/operations.md).
                        |r| json!({"template": r.template, "start_ms": r.start_ms, "end_ms": r.end_ms,
                                   "start": r.start_ms.div_euclid(1000), "end": r.end_ms.div_euclid(1000),
                                   "ends_by": r.ends_by}),
                    )
                    .collect();
        let out = json!({"time_zone": local.name, "slices": j, "notes": notes});
        outln!("{}", serde_json::to_string_pretty(&out).expect("json"));
        return;
    }
    // Seconds only when not zero (a slice of seconds reads as two times).
    let at = |ms: i64| {
        let secs = ms.div_euclid(1000);
        match secs.rem_euclid(60) {
            0 => local.format(secs, "%a %Y-%m-%d %H:%M"),
            _ => local.format(secs, "%a %Y-%m-%d %H:%M:%S"),
        }
    };
    let w = rows
        .iter()
        .map(|r| r.template.len())
        .max()
        .unwrap_or(8)
        .max(8);
    if form.legend {
        outln!("times in {}", local.name);
        outln!(
            "{:<w$}  {:<20}  {:<20}  ENDS BY",
            "TEMPLATE",
            "START",
            "END"
        );
    }
    for SliceRow {
        template: t,
        start_ms: s,
        end_ms: e,
        ends_by: by,
    } in rows
    {
        let by = by
            .replace("handoff:", "handoff to ")
            .replace("dropped:", "NOT STARTED: simultaneous with ");
        outln!("{t:<w$}  {:<20}  {:<20}  {by}", at(*s), at(*e));
    }
    if form.legend {
        for n in notes {
            outln!("note: {n}");
        }
        outln!();
        outln!(
            "{} listed.",
            match rows.len() {
                1 => "1 slice".to_string(),
                n => format!("{n} slices"),
            }
        );
    }
}

/// Each slice, then hours by template and by user; -1 reads "not reported".
pub fn print_slice_report(rows: &[SliceReportRow], zone: &Local, form: lists::Form) {
    let figure = |v: f64, unit: &str| {
        if v < 0.0 {
            "not reported".to_string()
        } else {
            format!("{v:.1}{unit}")
        }
    };
    // A value that is not there is said in words, never -1 nor a dash:
    // a slice with no release before it has no dead time; one not ready
    // (yet, or ever) has no start-to-ready.
    let ms = |v: i64, missing: &str| {
        if v < 0 {
            missing.to_string()
        } else {
            format!("{v} ms")
        }
    };
    // GPU figures come only from the guest (its org.astraeus.gpu.0
    // channel): a slice with none had a guest that sent no GPU lines.
    let gpu_reported = |r: &SliceReportRow| {
        r.gpu_avg_pct >= 0.0 || r.gpu_memory_peak_gb >= 0.0 || r.gpu_energy_mj >= 0
    };
    let now = jiff::Timestamp::now().as_millisecond();
    let hours = |r: &SliceReportRow| {
        ((if r.end_ms == 0 { now } else { r.end_ms }) - r.start_ms) as f64 / 3_600_000.0
    };
    // Wh in the table (a slice's energy reads best so); -1: not reported.
    let wh = |r: &SliceReportRow| {
        if r.gpu_energy_mj < 0 {
            -1.0
        } else {
            r.gpu_energy_mj as f64 / 3.6e6
        }
    };
    if form.json {
        let j: Vec<_> = rows
            .iter()
            .map(|r| {
                let opt = |v: f64| (v >= 0.0).then_some(v);
                // Instants in epoch ms and energy in mJ, as every other JSON
                // here; `start`, `end` (seconds) and `gpu_energy_wh` are kept
                // for one release (docs/operations.md, Units).
                json!({"template": r.template, "user": r.user,
                       "start_ms": r.start_ms, "end_ms": (r.end_ms != 0).then_some(r.end_ms),
                       "start": r.start_ms.div_euclid(1000), "end": (r.end_ms != 0).then_some(r.end_ms.div_euclid(1000)),
                       "dead_time_ms": (r.dead_time_ms >= 0).then_some(r.dead_time_ms), "start_to_ready_ms": (r.start_to_ready_ms >= 0).then_some(r.start_to_ready_ms),
                       "cpu_avg_pct": opt(r.cpu_avg_pct), "cpu_peak_pct": opt(r.cpu_peak_pct), "gpu_avg_pct": opt(r.gpu_avg_pct),
                       "gpu_peak_pct": opt(r.gpu_peak_pct), "gpu_memory_peak_gb": opt(r.gpu_memory_peak_gb),
                       "gpu_energy_mj": (r.gpu_energy_mj >= 0).then_some(r.gpu_energy_mj),
                       "gpu_energy_wh": opt(wh(r)), "gpu_reported": gpu_reported(r),
                       "error": (!r.error.is_empty()).then_some(&r.error)})
            })
            .collect();
        outln!("{}", serde_json::to_string_pretty(&j).expect("json"));
        return;
    }
    let local = |ms: i64| zone.format(ms.div_euclid(1000), "%Y-%m-%d %H:%M");
    if form.legend {
        outln!("times in {}", zone.name);
        outln!(
            "{:<12} {:<24} {:<16} {:<16} {:>10} {:>12} {:>14} {:>14} {:>13} {:>13}",
            "TEMPLATE",
            "USER",
            "START",
            "END",
            "DEAD TIME",
            "TO READY",
            "CPU avg/peak",
            "GPU avg/peak",
            "GPU mem peak",
            "GPU energy"
        );
    }
    for r in rows {
        let end = if r.end_ms == 0 {
            "on".to_string()
        } else {
            local(r.end_ms)
        };
        let cpu = if r.cpu_avg_pct < 0.0 {
            "not reported".into()
        } else {
            format!(
                "{}/{}",
                figure(r.cpu_avg_pct, "%"),
                figure(r.cpu_peak_pct, "%")
            )
        };
        let gpu = if r.gpu_avg_pct < 0.0 {
            "not reported".into()
        } else {
            format!(
                "{}/{}",
                figure(r.gpu_avg_pct, "%"),
                figure(r.gpu_peak_pct, "%")
            )
        };
        outln!(
            "{:<12} {:<24} {:<16} {:<16} {:>10} {:>12} {:>14} {:>14} {:>13} {:>13}{}",
            r.template,
            r.user,
            local(r.start_ms),
            end,
            ms(r.dead_time_ms, "none"),
            ms(r.start_to_ready_ms, "not ready"),
            cpu,
            gpu,
            figure(r.gpu_memory_peak_gb, " GB"),
            figure(wh(r), " Wh"),
            if r.error.is_empty() {
                String::new()
            } else {
                format!("  failed: {}", astraeusd::text::printable(&r.error))
            }
        );
    }
    if !form.legend {
        return;
    }
    if rows.iter().any(|r| !gpu_reported(r)) {
        outln!(
            "GPU \"not reported\": the guest sent no GPU lines. A passed-through GPU is \
             invisible to the host; the guest reports its own on the channel \
             org.astraeus.gpu.0 (docs/time-slicing.md gives the one line that does)."
        );
    }
    for (what, key) in [("template", 0usize), ("user", 1)] {
        let mut by: std::collections::BTreeMap<&str, f64> = Default::default();
        for r in rows {
            *by.entry(if key == 0 { &r.template } else { &r.user })
                .or_default() += hours(r);
        }
        outln!("by {what}:");
        for (k, h) in by {
            outln!("  {k:<24} {h:>8.2} h");
        }
    }
}
