//! One worker whole, from its object's properties: `astraeusctl status
//! NAME` for a person, `astraeusctl show NAME [-p P] [--value]` as
//! KEY=VALUE lines for scripts (as systemctl's status and show).

use super::{gb, Client, Local};
use serde_json::json;
use zbus::OwnedObjectPath;

type Properties = std::collections::HashMap<String, zbus::OwnedVariant>;

/// Every property of the worker's object, read in one GetAll.
async fn properties(c: &Client, name: &str) -> Result<Properties, String> {
    let path: OwnedObjectPath = c.call("GetWorker", &(name,)).await?;
    let msg = c
        .method(
            path.as_str(),
            "org.freedesktop.DBus.Properties",
            "GetAll",
            &("org.astraeus.Node1.Worker",),
        )
        .await?;
    msg.body().deserialize().map_err(|e| e.to_string())
}

/// A property's value as one line of text: numbers as they are, a list's
/// entries apart by spaces, a structure's fields by ':'; line breaks as
/// spaces (the worker's owner chose some of these texts).
fn plain(v: &zbus::Variant) -> String {
    use zbus::Variant as Value;
    match v {
        Value::Str(s) => s.as_str().replace(['\n', '\r'], " "),
        Value::Bool(b) => if *b { "yes" } else { "no" }.to_string(),
        Value::U8(n) => n.to_string(),
        Value::U16(n) => n.to_string(),
        Value::U32(n) => n.to_string(),
        Value::U64(n) => n.to_string(),
        Value::I16(n) => n.to_string(),
        Value::I32(n) => n.to_string(),
        Value::I64(n) => n.to_string(),
        Value::F64(n) => n.to_string(),
        Value::Array(a) => a.iter().map(plain).collect::<Vec<_>>().join(" "),
        Value::Structure(s) => s.fields().iter().map(plain).collect::<Vec<_>>().join(":"),
        Value::Variant(inner) => plain(inner),
        other => other.to_string(),
    }
}

/// `astraeusctl show NAME`: KEY=VALUE lines, sorted by key; a list of
/// texts (warnings, reasons) a line per entry, an empty one `KEY=`.
/// `-p` picks properties (one the worker lacks is refused, naming those
/// it has); `--value` prints values alone.
pub async fn show(
    c: &Client,
    name: &str,
    picked: &[String],
    value_only: bool,
    json_out: bool,
) -> Result<(), String> {
    let props = properties(c, name).await?;
    let mut keys: Vec<&String> = props.keys().collect();
    keys.sort();
    if let Some(missing) = picked.iter().find(|p| !props.contains_key(*p)) {
        let has: Vec<&str> = keys.iter().map(|k| k.as_str()).collect();
        return Err(format!(
            "NotFound: worker {name} has no property {missing}; it has {}",
            has.join(", ")
        ));
    }
    let keys: Vec<&String> = if picked.is_empty() {
        keys
    } else {
        picked.iter().collect()
    };
    let mut lines = Vec::new();
    for key in keys {
        let v: &zbus::Variant = &props[key];
        let values: Vec<String> = match v {
            zbus::Variant::Array(a) if a.element_signature() == "s" => {
                let all: Vec<String> = a.iter().map(plain).collect();
                if all.is_empty() {
                    vec![String::new()]
                } else {
                    all
                }
            }
            other => vec![plain(other)],
        };
        for value in values {
            lines.push((key.as_str(), value));
        }
    }
    if json_out {
        let mut map = serde_json::Map::new();
        for (k, v) in &lines {
            map.entry(k.to_string())
                .and_modify(|e| {
                    if let serde_json::Value::Array(a) = e {
                        a.push(json!(v));
                    }
                })
                .or_insert_with(|| json!([v]));
        }
        outln!("{}", serde_json::Value::Object(map));
        return Ok(());
    }
    for (k, v) in lines {
        if value_only {
            outln!("{v}");
        } else {
            outln!("{k}={v}");
        }
    }
    Ok(())
}

/// `astraeusctl status NAME`: the worker for a person, as lines (or JSON).
/// How long an ended worker's status is still told (systemctl status keeps
/// a failed unit until `reset-failed`; a worker's end stays in `history`).
const ENDED_TOLD_MS: i64 = 3_600_000;

pub async fn status(c: &Client, name: &str, json_out: bool) -> Result<(), String> {
    let props = match properties(c, name).await {
        Ok(p) => p,
        // Not live: one that ended within the hour is told as it ended.
        Err(e) if astraeusd::cli::kind_of(&e).0 == "NotFound" => {
            return ended_status(c, name, json_out, e).await
        }
        Err(e) => Err(e)?,
    };
    let get = |k: &str| props.get(k).map(|v| v.try_clone().expect("plain value"));
    let text = |k: &str| {
        get(k)
            .and_then(|v| String::try_from(v).ok())
            .unwrap_or_default()
    };
    let list = |k: &str| {
        get(k)
            .and_then(|v| Vec::<String>::try_from(v).ok())
            .unwrap_or_default()
    };
    let number = |k: &str| get(k).and_then(|v| f64::try_from(v).ok()).unwrap_or(-1.0);
    let owner = get("Owner")
        .and_then(|v| u32::try_from(v).ok())
        .unwrap_or(0);
    let gpus: Vec<(u32, String)> = get("Gpus")
        .and_then(|v| Vec::<(u32, String)>::try_from(v).ok())
        .unwrap_or_default();
    let holders: Vec<u32> = get("Holders")
        .and_then(|v| Vec::<u32>::try_from(v).ok())
        .unwrap_or_default();
    let (share, used) = (number("GpuSharedGb"), number("GpuUsedGb"));
    let request: serde_json::Value =
        serde_json::from_str(&text("Request")).unwrap_or(serde_json::Value::Null);
    let owner_name = astraeusd::auth::user_name(owner);
    let when = |k: &str| {
        get(k)
            .and_then(|v| i64::try_from(v).ok())
            .filter(|ms| *ms > 0)
    };
    let (submitted, placed) = (when("SubmittedMs"), when("PlacedMs"));
    if json_out {
        let mut v = json!({
            "name": text("Name"), "state": text("State"), "owner": owner,
            "owner_name": owner_name,
            "gpus": gpus.iter().map(|(i, u)| json!({"index": i, "uuid": u})).collect::<Vec<_>>(),
            "gpu_shared_gb": (share > 0.0).then_some(share),
            "gpu_used_gb": (used >= 0.0).then_some(used),
            "warnings": list("Warnings"), "holders": holders,
            "enforcement": text("Enforcement"),
            "pending_reasons": list("PendingReasons"), "request": request,
            "submitted_ms": submitted, "placed_ms": placed,
        });
        // A Kubernetes claim's worker says which claim (only such a worker).
        if let Some(c) = request.get("claim") {
            v["kubernetes_claim"] = c.clone();
        }
        outln!("{}", serde_json::to_string_pretty(&v).expect("json"));
        return Ok(());
    }
    outln!("{}", text("Name"));
    outln!("  state:    {}", text("State"));
    outln!("  owner:    {}", owner_name.unwrap_or(owner.to_string()));
    // A Kubernetes claim's worker (booked by the kubelet plugin): where
    // the work came from, as the API server names it.
    if let Some(c) = request.get("claim") {
        let part =
            |k: &str| astraeusd::text::printable(c.get(k).and_then(|v| v.as_str()).unwrap_or("?"));
        // Two lines: a UID is 36 characters, and a line stays within 80.
        outln!(
            "  from:     Kubernetes claim {}/{}",
            part("namespace"),
            part("name")
        );
        outln!("  claim:    UID {}", part("uid"));
    }
    let on: Vec<String> = gpus.iter().map(|(i, u)| format!("GPU {i} ({u})")).collect();
    outln!(
        "  GPUs:     {}",
        if on.is_empty() {
            "—".to_string()
        } else {
            on.join(", ")
        }
    );
    if share > 0.0 {
        outln!("  share:    {} GB on each", gb(share));
    }
    if used >= 0.0 && text("State") == "running" {
        outln!("  uses:     {} GB", gb(used));
    }
    if text("State") != "pending" && !text("Enforcement").is_empty() {
        outln!(
            "  memory:   {}",
            astraeusd::text::printable(&text("Enforcement"))
        );
    }
    let local = Local::here();
    for (label, at) in [("submitted:", submitted), ("placed:   ", placed)] {
        if let Some(ms) = at {
            outln!("  {label} {} {}", local.time(ms / 1000), local.name);
        }
    }
    if !holders.is_empty() {
        let h: Vec<String> = holders.iter().map(u32::to_string).collect();
        outln!("  holders:  pids {}", h.join(", "));
    }
    for w in list("Warnings") {
        outln!("  ! {w}");
    }
    let reasons = list("PendingReasons");
    if !reasons.is_empty() {
        outln!("  waits because:");
        for r in reasons {
            outln!("    {}", astraeusd::text::printable(&r));
        }
    }
    // On one line, as the daemon's JSON: the owner's own line breaks and
    // spacing could otherwise lay out lines of their choosing here.
    let request = text("Request");
    let request = serde_json::from_str::<serde_json::Value>(&request)
        .map(|v| v.to_string())
        .unwrap_or_else(|_| request.replace(['\n', '\r'], " "));
    outln!("  request:  {}", request.trim_end());
    Ok(())
}

/// The daemon whole, for a person (`astraeusctl status` with no name): its
/// machine and zone, its workers, the engine container workers run
/// through, and its page.
pub async fn daemon_status(c: &Client, json_out: bool) -> Result<(), String> {
    // Every Manager property in one GetAll.
    let msg = c
        .method(
            super::BASE_PATH,
            "org.freedesktop.DBus.Properties",
            "GetAll",
            &(super::MANAGER,),
        )
        .await?;
    let props: Properties = msg.body().deserialize().map_err(|e| e.to_string())?;
    let get = |k: &str| props.get(k).map(|v| v.try_clone().expect("plain value"));
    let text = |k: &str| {
        get(k)
            .and_then(|v| String::try_from(v).ok())
            .unwrap_or_default()
    };
    let count = |k: &str| get(k).and_then(|v| u32::try_from(v).ok()).unwrap_or(0);
    let (machine, zone, containers, page) = (
        text("Machine"),
        text("TimeZone"),
        text("ContainerRuntime"),
        text("PageUrl"),
    );
    let (running, pending) = (count("WorkersRunning"), count("WorkersPending"));
    let wsl = get("Wsl")
        .and_then(|v| bool::try_from(v).ok())
        .unwrap_or(false);
    if json_out {
        let j = json!({"machine": machine, "time_zone": zone, "workers_running": running,
                       "workers_pending": pending, "container_runtime": containers,
                       "page_url": (!page.is_empty()).then_some(&page), "wsl": wsl});
        outln!("{}", serde_json::to_string_pretty(&j).expect("json"));
        return Ok(());
    }
    let printable = astraeusd::text::printable;
    outln!(
        "astraeusd on {}{}",
        printable(&machine),
        if wsl { " (a WSL2 host)" } else { "" }
    );
    outln!("     Workers: {running} running, {pending} waiting");
    outln!("  Containers: {}", printable(&containers));
    outln!("   Time zone: {}", printable(&zone));
    outln!(
        "        Page: {}",
        if page.is_empty() {
            "off ([http] listen)".to_string()
        } else {
            printable(&page).to_string()
        }
    );
    Ok(())
}

/// `status NAME` of a worker that ended within [`ENDED_TOLD_MS`]: how it
/// ended, with its exit status, as `systemctl status` tells a failed
/// unit; the exit status 3 (not running), as systemctl's. None ended so
/// recently: the NotFound that no live worker gave (`not_live`).
async fn ended_status(
    c: &Client,
    name: &str,
    json_out: bool,
    not_live: String,
) -> Result<(), String> {
    use astraeusd::wire::EndedRow;
    let since = jiff::Timestamp::now().as_millisecond() - ENDED_TOLD_MS;
    let rows: Vec<EndedRow> = c
        .call("ListEndedMs", &(since, 1000u32))
        .await
        .map_err(|_| not_live.clone())?;
    // Newest first: the last of that name.
    let Some(row) = rows.into_iter().find(|r| r.name == name) else {
        return Err(not_live);
    };
    let exit = (row.exit_status >= 0).then_some(row.exit_status);
    let owner_name = astraeusd::auth::user_name(row.owner_uid);
    if json_out {
        outln!(
            "{}",
            json!({
                "name": row.name, "state": "ended", "owner": row.owner_uid,
                "owner_name": owner_name,
                "gpus": row.gpu_indices,
                "gpu_shared_gb": (row.gpu_shared_gb > 0.0).then_some(row.gpu_shared_gb),
                "submitted_ms": row.submitted_ms,
                "placed_ms": (row.started_ms > 0).then_some(row.started_ms),
                "ended_ms": row.ended_ms, "exit_status": exit, "ended": row.end_reason,
            })
        );
    } else {
        let ago = (jiff::Timestamp::now().as_millisecond() - row.ended_ms).max(0) / 1000;
        outln!("{}", row.name);
        outln!("  state:    ended {ago} s ago: {}", row.end_reason);
        outln!(
            "  owner:    {}",
            owner_name.unwrap_or(row.owner_uid.to_string())
        );
        outln!("  GPUs:     {}", row.gpus);
        if let Some(code) = exit {
            outln!("  exit:     status {code}");
        }
        outln!("  history:  astraeusctl history");
    }
    Err(format!("NotRunning: worker {name} has ended"))
}
