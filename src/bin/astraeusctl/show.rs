//! `astraeusctl show NAME`: one worker whole, from its object's properties.

use super::{gb, Client, Local};
use serde_json::json;
use zbus::OwnedObjectPath;

/// `astraeusctl show NAME`: every property of the worker's object, read in
/// one GetAll, as lines (or JSON).
pub async fn show(c: &Client, name: &str, json_out: bool) -> Result<(), String> {
    let path: OwnedObjectPath = c.call("GetWorker", &(name,)).await?;
    let msg = c
        .method(
            path.as_str(),
            "org.freedesktop.DBus.Properties",
            "GetAll",
            &("org.astraeus.Node1.Worker",),
        )
        .await?;
    let props: std::collections::HashMap<String, zbus::OwnedVariant> =
        msg.body().deserialize().map_err(|e| e.to_string())?;
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
        let v = json!({
            "name": text("Name"), "state": text("State"), "owner": owner,
            "owner_name": owner_name,
            "gpus": gpus.iter().map(|(i, u)| json!({"index": i, "uuid": u})).collect::<Vec<_>>(),
            "gpu_shared_gb": (share > 0.0).then_some(share),
            "gpu_used_gb": (used >= 0.0).then_some(used),
            "warnings": list("Warnings"), "holders": holders,
            "pending_reasons": list("PendingReasons"), "request": request,
            "submitted_ms": submitted, "placed_ms": placed,
        });
        outln!("{}", serde_json::to_string_pretty(&v).expect("json"));
        return Ok(());
    }
    outln!("{}", text("Name"));
    outln!("  state:    {}", text("State"));
    outln!("  owner:    {}", owner_name.unwrap_or(owner.to_string()));
    let on: Vec<String> = gpus.iter().map(|(i, u)| format!("{i} ({u})")).collect();
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
