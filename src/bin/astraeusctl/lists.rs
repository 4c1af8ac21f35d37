//! The lists: `gpus`, `workers`, `history`. Each is an aligned table with a
//! header and a count line, as systemd's tools print them (`--no-legend`
//! leaves both out), or JSON data (numbers, arrays, nulls) with `--json`.

use super::colour::{mode_colour, paint};
use super::{gb, Client, Local};
use astraeusd::wire::{EndedRow, GpuRow, WorkerRow};
use serde_json::json;

/// How a list is printed: JSON, or a table with or without its legend.
#[derive(Clone, Copy)]
pub struct Form {
    pub json: bool,
    pub legend: bool,
}

/// "1 GPU listed." / "3 workers listed.", after a blank line, as machinectl.
fn count_line(n: usize, one: &str, many: &str) {
    outln!();
    outln!("{n} {} listed.", if n == 1 { one } else { many });
}

/// Owners by name, as this host knows them (the uid when it does not).
fn owner_name(uid: u32) -> String {
    user_name(uid).unwrap_or(uid.to_string())
}

/// A user's name, looked up once per uid: a listing of 100,000 workers has
/// a handful of owners, and each lookup reads the user database.
fn user_name(uid: u32) -> Option<String> {
    thread_local! {
        static NAMES: std::cell::RefCell<std::collections::HashMap<u32, Option<String>>> =
            Default::default();
    }
    NAMES.with(|names| {
        names
            .borrow_mut()
            .entry(uid)
            .or_insert_with(|| astraeusd::auth::user_name(uid))
            .clone()
    })
}

/// `0,2 · shared 2.2 GB`, `1 · whole`, `—`: the GPUs a worker holds, by index.
/// The seed's GPUS column: how many GPUs and how (`1 · shared 2.2 GB`,
/// `2 · whole`), as the page, ListWorkers and the journal say it.
pub fn gpus_cell(indices: &[u32], shared_gb: f64) -> String {
    if indices.is_empty() {
        return "—".to_string();
    }
    if shared_gb > 0.0 {
        format!("{} · shared {} GB", indices.len(), gb(shared_gb))
    } else {
        format!("{} · whole", indices.len())
    }
}

/// The GPU column: which GPUs, by index (`0`, `0,2`), in a column of its
/// own so that a count and an index never read alike.
pub fn gpu_cell(indices: &[u32]) -> String {
    if indices.is_empty() {
        return "—".to_string();
    }
    let list: Vec<String> = indices.iter().map(u32::to_string).collect();
    list.join(",")
}

/// A cell padded to `w` columns by its characters (not bytes: `—`, `·`).
fn pad(s: &str, w: usize) -> String {
    let n = s.chars().count();
    format!("{s}{}", " ".repeat(w.saturating_sub(n)))
}

fn width<'a>(header: &str, cells: impl Iterator<Item = &'a str>) -> usize {
    cells
        .map(|c| c.chars().count())
        .chain([header.chars().count()])
        .max()
        .unwrap_or(0)
}

/// What sharers use beyond their shares: what a GPU offers less than its
/// total without it being held outside, to hundredths as amounts are.
fn beyond_shares(g: &GpuRow) -> f64 {
    ((g.total_gb - g.held_outside_gb - g.offered_gb) * 100.0)
        .round()
        .max(0.0)
        / 100.0
}

pub async fn gpus(c: &Client, form: Form) -> Result<(), String> {
    let rows: Vec<GpuRow> = c.call("ListGpus", &()).await?;
    if form.json {
        let j: Vec<_> = rows
            .iter()
            .map(|g| {
                json!({"index": g.index, "uuid": g.uuid, "model": g.model, "mode": g.mode,
                   "total_gb": g.total_gb, "offered_gb": g.offered_gb,
                   "held_outside_gb": g.held_outside_gb,
                   // ListGpus keeps its signature: derived (the Gpu object's BeyondSharesGb).
                   "beyond_shares_gb": beyond_shares(g),
                   "taken_gb": g.taken_gb,
                   "healthy": g.health == "ok",
                   // As the page's JSON says it: "ok" when healthy, never null.
                   "health": g.health,
                   "warning": (!g.warning.is_empty()).then_some(&g.warning),
                   "draining_for": (!g.draining_for.is_empty()).then_some(&g.draining_for)})
            })
            .collect();
        outln!("{}", serde_json::to_string_pretty(&j).expect("json"));
        return Ok(());
    }
    if form.legend && c.manager_property::<bool>("Wsl").await? {
        let machine: String = c.manager_property("Machine").await?;
        outln!("{machine} is a WSL2 host: every container sees every GPU, so shared work takes its memory on each");
    }
    let cell = |x: f64| format!("{} GB", gb(x));
    let table: Vec<[String; 8]> = rows
        .iter()
        .map(|g| {
            [
                g.index.to_string(),
                astraeusd::text::printable(&g.model),
                cell(g.total_gb),
                cell(g.offered_gb),
                cell(g.held_outside_gb),
                g.mode.clone(),
                // What sharers hold on it, whatever its mode: an unhealthy
                // GPU still holds its sharers' memory.
                if g.mode == "shared" || g.taken_gb > 0.0 {
                    cell(g.taken_gb)
                } else {
                    "—".into()
                },
                astraeusd::text::printable(&g.health),
            ]
        })
        .collect();
    const HEAD: [&str; 8] = [
        "GPU", "MODEL", "TOTAL", "OFFERED", "OUTSIDE", "MODE", "TAKEN", "HEALTH",
    ];
    let w: Vec<usize> = (0..8)
        .map(|i| width(HEAD[i], table.iter().map(|r| r[i].as_str())))
        .collect();
    if form.legend {
        let head: Vec<String> = (0..7).map(|i| pad(HEAD[i], w[i])).collect();
        outln!("{}  {}", head.join("  "), HEAD[7]);
    }
    for (g, r) in rows.iter().zip(&table) {
        let left: Vec<String> = (0..5).map(|i| pad(&r[i], w[i])).collect();
        // Only the words painted here carry escapes; the rest is printable.
        let health = if g.health == "ok" {
            paint("ok", "32")
        } else {
            paint(&r[7], "1;31")
        };
        super::out_line(&format!(
            "{}  {}  {}  {health}",
            left.join("  "),
            // Padded outside the colour: only the word is painted.
            paint(&r[5], mode_colour(&r[5])) + &" ".repeat(w[5] - r[5].chars().count()),
            pad(&r[6], w[6]),
        ));
        if !g.draining_for.is_empty() {
            super::out_line(&format!(
                "  {}",
                paint(&format!("draining for {}", g.draining_for), "33")
            ));
        }
        if !g.warning.is_empty() {
            super::out_line(&format!("  {}", paint(&format!("! {}", g.warning), "1;33")));
        }
    }
    if form.legend {
        count_line(rows.len(), "GPU", "GPUs");
    }
    Ok(())
}

pub async fn workers(c: &Client, form: Form) -> Result<(), String> {
    // Two calls however many workers wait.
    let rows: Vec<WorkerRow> = c.call("ListWorkers", &()).await?;
    let mut pending: std::collections::HashMap<String, Vec<String>> =
        if rows.iter().any(|r| r.state == "pending") {
            let list: Vec<(String, Vec<String>)> = c.call("ListPending", &()).await?;
            list.into_iter().collect()
        } else {
            Default::default()
        };
    // One more call when any runs: whether each one's share is held.
    let enforcement: std::collections::HashMap<String, String> =
        if rows.iter().any(|r| r.state != "pending") {
            let list: Vec<(String, String)> = c.call("ListEnforcement", &()).await?;
            list.into_iter().collect()
        } else {
            Default::default()
        };
    // And one when any is a Kubernetes claim (named claim-UID): its owner
    // is its namespace, `k8s/NAMESPACE` (the plugin, root, books it).
    let claims: std::collections::HashMap<String, (String, String)> =
        if rows.iter().any(|r| r.name.starts_with("claim-")) {
            let list: Vec<(String, String, String, String)> = c.call("ListClaims", &()).await?;
            list.into_iter()
                .map(|(worker, _, ns, name)| (worker, (ns, name)))
                .collect()
        } else {
            Default::default()
        };
    let owner = |r: &WorkerRow| match claims.get(&r.name) {
        Some((ns, _)) => format!("k8s/{ns}"),
        None => owner_name(r.owner_uid),
    };
    if form.json {
        let j: Vec<_> = rows
            .iter()
            .map(|r| {
                let claim = claims.get(&r.name).map(|(ns, name)| json!({"namespace": ns, "name": name}));
                json!({"name": r.name, "state": r.state, "owner": r.owner_uid,
                   "owner_name": claims.get(&r.name).map_or_else(|| user_name(r.owner_uid), |_| Some(owner(r))),
                   "kubernetes_claim": claim,
                   "gpus": r.gpu_indices,
                   "gpu_shared_gb": (r.gpu_shared_gb > 0.0).then_some(r.gpu_shared_gb),
                   // Null where nothing is read: waiting, or no reading (as the table's — and "unknown").
                   "gpu_used_gb": (r.state == "running" && r.gpu_used_gb >= 0.0).then_some(r.gpu_used_gb),
                   // `held`, or `promised: why`; null while it waits.
                   "enforcement": enforcement.get(&r.name),
                   "pending_reasons": pending.get(&r.name).cloned().unwrap_or_default()})
            })
            .collect();
        outln!("{}", serde_json::to_string_pretty(&j).expect("json"));
        return Ok(());
    }
    let table: Vec<[String; 7]> = rows
        .iter()
        .map(|r| {
            let used = if r.state != "running" {
                "—".to_string()
            } else if r.gpu_used_gb < 0.0 {
                "unknown".to_string()
            } else {
                format!("{} GB", gb(r.gpu_used_gb))
            };
            // The word alone (`held`, `promised`); why, in `show` and --json.
            let memory = enforcement
                .get(&r.name)
                .and_then(|e| e.split(':').next())
                .unwrap_or("—")
                .to_string();
            [
                r.name.clone(),
                r.state.clone(),
                owner(r),
                gpus_cell(&r.gpu_indices, r.gpu_shared_gb),
                gpu_cell(&r.gpu_indices),
                memory,
                used,
            ]
        })
        .collect();
    const HEAD: [&str; 7] = ["NAME", "STATE", "OWNER", "GPUS", "GPU", "MEMORY", "USED"];
    let w: Vec<usize> = (0..7)
        .map(|i| width(HEAD[i], table.iter().map(|r| r[i].as_str())))
        .collect();
    let line = |r: [&str; 7]| {
        let left: Vec<String> = (0..6).map(|i| pad(r[i], w[i])).collect();
        format!("{}  {}", left.join("  "), r[6])
    };
    if form.legend {
        outln!("{}", line(HEAD));
    }
    for r in &table {
        outln!(
            "{}",
            line([&r[0], &r[1], &r[2], &r[3], &r[4], &r[5], &r[6]])
        );
        // The rows alone for scripts (--no-legend): one line a worker.
        let reasons = pending.remove(r[0].as_str()).filter(|_| form.legend);
        for why in reasons.unwrap_or_default() {
            // One line each: what a reason quotes cannot start a row.
            outln!(
                "{}    {}",
                " ".repeat(w[0]),
                astraeusd::text::printable(&why)
            );
        }
    }
    if form.legend {
        count_line(rows.len(), "worker", "workers");
    }
    Ok(())
}

pub async fn history(
    c: &Client,
    form: Form,
    since: Option<String>,
    limit: u32,
) -> Result<(), String> {
    let local = Local::here();
    let since = match since {
        Some(s) => local.when(&s, "--since")?,
        None => 0,
    };
    let rows: Vec<EndedRow> = c.call("ListEndedMs", &(since * 1000, limit)).await?;
    let ms = |v: i64| (v > 0).then_some(v);
    if form.json {
        let j: Vec<_> = rows
            .iter()
            .map(|r| {
                json!({"name": r.name, "owner": r.owner_uid,
                   "owner_name": user_name(r.owner_uid),
                   "gpus": r.gpu_indices,
                   "gpu_shared_gb": (r.gpu_shared_gb > 0.0).then_some(r.gpu_shared_gb),
                   "submitted_ms": r.submitted_ms,
                   "started_ms": ms(r.started_ms), "ended_ms": r.ended_ms,
                   "exit_status": (r.exit_status >= 0).then_some(r.exit_status),
                   "ended_by": r.end_reason})
            })
            .collect();
        outln!("{}", serde_json::to_string_pretty(&j).expect("json"));
        return Ok(());
    }
    let table: Vec<[String; 7]> = rows
        .iter()
        .map(|r| {
            [
                r.name.clone(),
                owner_name(r.owner_uid),
                gpus_cell(&r.gpu_indices, r.gpu_shared_gb),
                gpu_cell(&r.gpu_indices),
                ms(r.started_ms).map_or("never".into(), |t| local.time(t / 1000)),
                local.time(r.ended_ms / 1000),
                astraeusd::text::printable(&r.end_reason),
            ]
        })
        .collect();
    const HEAD: [&str; 7] = ["NAME", "OWNER", "GPUS", "GPU", "PLACED", "ENDED", "HOW"];
    let w: Vec<usize> = (0..7)
        .map(|i| width(HEAD[i], table.iter().map(|r| r[i].as_str())))
        .collect();
    let line = |r: [&str; 7]| {
        let left: Vec<String> = (0..6).map(|i| pad(r[i], w[i])).collect();
        format!("{}  {}", left.join("  "), r[6])
    };
    if form.legend {
        outln!("times in {}", local.name);
        outln!("{}", line(HEAD));
    }
    for r in &table {
        outln!(
            "{}",
            line([&r[0], &r[1], &r[2], &r[3], &r[4], &r[5], &r[6]])
        );
    }
    if form.legend {
        count_line(rows.len(), "ended worker", "ended workers");
    }
    Ok(())
}
