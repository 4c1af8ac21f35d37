//! `astraeusctl events`: what the daemon says, a line each, until Ctrl-C.
//! Only the daemon's own signals are followed; when it goes away, so do we.

use super::{gb, Client, Local};
use astraeusd::bus::{BASE_PATH, BUS_NAME};
use futures_util::StreamExt;
use serde_json::json;
use std::collections::HashMap;
use zbus::OwnedVariant as OwnedValue;

/// One thing that happened, as a line and as JSON.
struct Event {
    kind: &'static str,
    line: String,
    data: serde_json::Value,
}

pub async fn follow(c: &Client, json_out: bool) -> Result<(), String> {
    let mut signals = c.daemon_signals().await?;
    let local = Local::here();
    // Said once subscribed, so that a reader knows nothing after it is missed.
    if json_out {
        outln!("{}", json!({"event": "following", "time_zone": local.name}));
    } else {
        outln!(
            "following {BUS_NAME} (times in {}); Ctrl-C to stop",
            local.name
        );
    }
    loop {
        let msg = match signals.next().await {
            Some(Ok(msg)) => msg,
            // One message that did not read: the stream goes on.
            Some(Err(_)) => continue,
            None => return Err("Unreachable: the bus connection ended".into()),
        };
        let header = msg.header();
        let member = header.member().map(|m| m.to_string()).unwrap_or_default();
        if member == "NameOwnerChanged" {
            return Err("Gone: the daemon went away; see: journalctl -u astraeusd".into());
        }
        let path = header.path().map(|p| p.to_string()).unwrap_or_default();
        let Some(event) = read(c, &member, &path, &msg).await else {
            continue;
        };
        let now = jiff::Timestamp::now();
        if json_out {
            let mut data = event.data;
            data["event"] = json!(event.kind);
            data["at_ms"] = json!(now.as_millisecond());
            outln!("{data}");
        } else {
            // A line each, flushed by stdout's line buffering; a reader gone
            // (`| head`) ends the follower quietly (see out_line).
            // One event, one line: a newline in what the daemon relays
            // (a staging error quoting a file's name) must not forge another.
            outln!(
                "{}  {}",
                local.format(now.as_second(), "%H:%M:%S"),
                astraeusd::text::printable(&event.line)
            );
        }
    }
}

/// The name in a worker's or template's path (`_xx` is the byte 0xxx).
fn name_of(path: &str, kind: &str) -> Option<String> {
    let label = path.strip_prefix(&format!("{BASE_PATH}/{kind}/"))?;
    astraeusd::bus::unescape_label(label)
}

async fn read(c: &Client, member: &str, path: &str, msg: &zbus::Message) -> Option<Event> {
    let body = msg.body();
    let ev = |kind, line: String, data| Some(Event { kind, line, data });
    match member {
        "WorkerNew" => {
            let (name, object): (String, zbus::OwnedObjectPath) = body.deserialize().ok()?;
            // Born running or pending: no change of state follows, so say which.
            let state: String = worker_property(c, object.as_str(), "State")
                .await
                .unwrap_or_default();
            let reasons: Vec<String> = if state == "pending" {
                worker_property(c, object.as_str(), "PendingReasons")
                    .await
                    .unwrap_or_default()
            } else {
                Vec::new()
            };
            let line = if reasons.is_empty() {
                format!("worker {name} submitted: {state}")
            } else {
                format!("worker {name} submitted: waits: {}", reasons.join("; "))
            };
            ev(
                "worker-new",
                line,
                json!({"worker": name, "state": state, "pending_reasons": reasons}),
            )
        }
        "WorkerRemoved" => {
            let (name, _): (String, zbus::OwnedObjectPath) = body.deserialize().ok()?;
            ev(
                "worker-removed",
                format!("worker {name} ended"),
                json!({"worker": name}),
            )
        }
        "HandoffStep" => {
            let (step, from, to, at_ms, detail): (String, String, String, i64, String) =
                body.deserialize().ok()?;
            let detail_text = if detail.is_empty() {
                String::new()
            } else {
                format!(": {detail}")
            };
            ev(
                "handoff-step",
                format!("handoff {from} → {to}: {step}{detail_text}"),
                json!({"step": step, "from": from, "to": to, "step_at_ms": at_ms, "detail": detail}),
            )
        }
        "SliceStarted" => {
            let (template, at_ms, dead): (String, i64, i64) = body.deserialize().ok()?;
            // The signal says -1 when no release came before (a first
            // start, one found running): said in words, null in JSON.
            let (said, dead) = if dead < 0 {
                ("no release before it to count from".to_string(), None)
            } else {
                (format!("{dead} ms without a VM on"), Some(dead))
            };
            ev(
                "slice-started",
                format!("slice of {template} started ({said})"),
                json!({"template": template, "slice_at_ms": at_ms, "dead_time_ms": dead}),
            )
        }
        "SliceEnded" => {
            let (template, at_ms, error): (String, i64, String) = body.deserialize().ok()?;
            let how = if error.is_empty() {
                String::new()
            } else {
                format!(": {error}")
            };
            ev(
                "slice-ended",
                format!("slice of {template} ended{how}"),
                json!({"template": template, "slice_at_ms": at_ms,
                       "error": (!error.is_empty()).then_some(error)}),
            )
        }
        "WeightsStaged" => {
            let (template, sum, changed, error): (String, String, bool, String) =
                body.deserialize().ok()?;
            let line = if error.is_empty() {
                format!("weights of {template} staged: sha256 {sum}")
            } else {
                format!("weights of {template} failed: {error}")
            };
            ev(
                "weights-staged",
                line,
                json!({"template": template, "checksum": sum, "changed": changed,
                       "error": (!error.is_empty()).then_some(error)}),
            )
        }
        "PropertiesChanged" => {
            let (iface, changed, invalidated): (String, HashMap<String, OwnedValue>, Vec<String>) =
                body.deserialize().ok()?;
            properties(c, &iface, path, changed, invalidated).await
        }
        _ => None,
    }
}

/// State changes of workers, GPUs and templates' VMs, and why a worker waits.
async fn properties(
    c: &Client,
    iface: &str,
    path: &str,
    changed: HashMap<String, OwnedValue>,
    invalidated: Vec<String>,
) -> Option<Event> {
    let text = |k: &str| {
        changed
            .get(k)
            .and_then(|v| v.try_clone().ok())
            .and_then(|v| String::try_from(v).ok())
    };
    match iface {
        "org.astraeus.Node1.Worker" => {
            let name = name_of(path, "worker")?;
            if let Some(state) = text("State") {
                return Some(Event {
                    kind: "worker-state",
                    line: format!("worker {name} is {state}"),
                    data: json!({"worker": name, "state": state}),
                });
            }
            if invalidated.iter().any(|p| p == "PendingReasons") {
                // Sent without its value (many may change at once): read it.
                let reasons: Vec<String> = worker_property(c, path, "PendingReasons").await?;
                if reasons.is_empty() {
                    return None;
                }
                return Some(Event {
                    kind: "worker-waits",
                    line: format!("worker {name} waits: {}", reasons.join("; ")),
                    data: json!({"worker": name, "pending_reasons": reasons}),
                });
            }
            None
        }
        "org.astraeus.Node1.Gpu" => {
            let index: u32 = path
                .strip_prefix(&format!("{BASE_PATH}/gpu/"))?
                .parse()
                .ok()?;
            let mode = text("Mode");
            let taken = changed
                .get("TakenGb")
                .and_then(|v| v.try_clone().ok())
                .and_then(|v| f64::try_from(v).ok());
            let line = match (&mode, taken) {
                (Some(m), Some(t)) if m == "shared" => {
                    format!("GPU {index} is shared, {} GB taken", gb(t))
                }
                (Some(m), _) => format!("GPU {index} is {m}"),
                (None, Some(t)) => format!("GPU {index}: {} GB taken", gb(t)),
                (None, None) => return None,
            };
            Some(Event {
                kind: "gpu",
                line,
                data: json!({"gpu": index, "mode": mode, "taken_gb": taken}),
            })
        }
        "org.astraeus.Node1.Template" => {
            let name = name_of(path, "template")?;
            let state = text("State")?;
            Some(Event {
                kind: "template-state",
                line: format!("template {name} is {state}"),
                data: json!({"template": name, "state": state}),
            })
        }
        _ => None,
    }
}

/// One property of a worker's object; None when it cannot be read (gone).
pub(super) async fn worker_property<T>(c: &Client, path: &str, name: &str) -> Option<T>
where
    T: TryFrom<OwnedValue>,
    T::Error: std::fmt::Display,
{
    c.property(path, "org.astraeus.Node1.Worker", name)
        .await
        .ok()
}
