//! What podman's libpod API and Docker Engine's API share: the container
//! names and label (a restarted daemon finds its containers in either),
//! CDI device names, the engines' error bodies, and the calls that are the
//! same in both (stop, kill, remove).

use super::http::{Api, Response};
use crate::error::{Error, Result};
use serde_json::Value;
use std::time::Duration;

/// The label every container of a worker carries: `astraeus.worker=<worker>`.
pub const LABEL: &str = "astraeus.worker";

pub fn container_name(worker: &str) -> String {
    format!("astraeus-{worker}")
}

/// The CDI devices for these GPUs, `{uuid}` replaced; each once: a name
/// without `{uuid}` (WSL's `nvidia.com/gpu=all`) is the same for every GPU.
pub fn cdi_devices(device: &str, gpu_uuids: &[String]) -> Vec<String> {
    let mut paths: Vec<String> = Vec::new();
    for u in gpu_uuids {
        let path = device.replace("{uuid}", u);
        if !paths.contains(&path) {
            paths.push(path);
        }
    }
    paths
}

pub fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// An engine's error body (`{"message": …}` in both; libpod adds a
/// `cause`) as words: "podman stop: … (HTTP 500)", made printable.
pub fn engine_error(engine: &str, what: &str, r: &Response) -> String {
    let msg = serde_json::from_slice::<Value>(&r.body)
        .ok()
        .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_string))
        .unwrap_or_else(|| r.text());
    format!(
        "{engine} {what}: {} (HTTP {})",
        crate::text::printable(&msg),
        r.status
    )
}

pub fn api_error(engine: &str, what: &str, r: &Response) -> Error {
    Error::Backend(engine_error(engine, what, r))
}

/// One engine's API, for the calls both make alike.
pub struct Compat<'a> {
    pub api: Api<'a>,
    /// Put before every path: libpod's versioned prefix, nothing for Docker.
    pub prefix: &'static str,
    /// How long one call may go unanswered (a stop adds its own timeout).
    pub answer_within: Duration,
    /// The stop call's query field for its timeout in seconds.
    pub stop_seconds: &'static str,
    /// How the engine's refusals read.
    pub error: fn(&str, &Response) -> Error,
}

impl Compat<'_> {
    /// A call that must be answered within `limit` (None: a long poll).
    pub async fn call_within(
        &self,
        limit: Option<Duration>,
        what: &str,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Response> {
        let path = format!("{}{path}", self.prefix);
        self.api.call(limit, what, method, &path, body).await
    }

    pub async fn call(
        &self,
        what: &str,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Response> {
        self.call_within(Some(self.answer_within), what, method, path, body)
            .await
    }

    /// Graceful stop, killed by the engine after `timeout`.
    pub async fn stop(&self, id: &str, timeout: Duration) -> Result<()> {
        let path = format!(
            "/containers/{id}/stop?{}={}",
            self.stop_seconds,
            timeout.as_secs()
        );
        let limit = Some(self.answer_within + timeout);
        let r = self.call_within(limit, "stop", "POST", &path, None).await?;
        match r.status {
            204 | 304 | 404 => Ok(()),
            _ => Err((self.error)("stop", &r)),
        }
    }

    pub async fn kill(&self, id: &str) -> Result<()> {
        let path = format!("/containers/{id}/kill?signal=KILL");
        let r = self.call("kill", "POST", &path, None).await?;
        // 404: gone; 409: not running. Either way, nothing runs.
        match r.status {
            200 | 204 | 304 | 404 | 409 => Ok(()),
            _ => Err((self.error)("kill", &r)),
        }
    }

    /// Forgets an ended container (forced: one still running goes too).
    pub async fn remove(&self, id: &str) -> Result<()> {
        let path = format!("/containers/{id}?force=true");
        let r = self.call("remove", "DELETE", &path, None).await?;
        match r.status {
            200 | 204 | 404 => Ok(()),
            _ => Err((self.error)("remove", &r)),
        }
    }
}
