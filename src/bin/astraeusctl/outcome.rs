//! What a submit or a stop comes to, waited for as systemctl waits for a
//! job (#67): a launch until its worker runs or has ended, a stop until
//! its worker has ended. Polled (its State, a tenth of a second apart):
//! the daemon's objects say it, and a signal missed between a call and
//! a subscription would leave the wait hanging.

use super::{Client, WORKER};

/// How a launch the caller waited for came out.
pub enum Launched {
    Running,
    /// The worker's name, and how it ended (`failed to start: …`).
    Ended(String, String),
}

/// Waits until the worker at `path` runs, or has ended (its object gone:
/// how, from the daemon's history of what ended since `asked_ms`).
pub async fn wait_for_launch(c: &Client, path: &str, asked_ms: i64) -> Result<Launched, String> {
    use astraeusd::wire::EndedRow;
    // From its path: a launch that failed at once took its object with it.
    let label = path.rsplit('/').next().unwrap_or_default();
    let name = astraeusd::bus::unescape_label(label).unwrap_or_else(|| label.to_string());
    loop {
        match c.property::<String>(path, WORKER, "State").await {
            Ok(s) if s == "starting" => {}
            Ok(_) => return Ok(Launched::Running),
            Err(_) => {
                let rows: Vec<EndedRow> = c.call("ListEndedMs", &(asked_ms, 1000u32)).await?;
                let how = rows
                    .into_iter()
                    .find(|r| r.name == name)
                    .map_or_else(|| "ended".to_string(), |r| r.end_reason);
                return Ok(Launched::Ended(name, how));
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Waits until the worker named has ended (no longer among the live).
pub async fn wait_until_gone(c: &Client, name: &str) -> Result<(), String> {
    let path = astraeusd::bus::worker_path(name);
    while c.property::<String>(&path, WORKER, "State").await.is_ok() {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    Ok(())
}
