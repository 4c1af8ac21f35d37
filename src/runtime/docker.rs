//! Containers through Docker Engine's API on its unix socket, beside
//! podman.rs: the same container names (`astraeus-<worker>`) and label, so a
//! restarted daemon finds its containers again and a second start cannot
//! happen. Paths carry no API version: the engine answers in its own, and
//! every field used here is in Docker 20.10's (API 1.41) and later.
//!
//! A container's GPUs: through CDI where the engine has it on (Docker 25+
//! with CDI enabled lists its spec directories in `/info`), as podman's
//! are; else through Docker's own GPU request, what `docker run --gpus
//! device=UUID` sends, which NVIDIA's container toolkit serves; on WSL,
//! Docker Desktop's request for every GPU (`--gpus all`): WSL has no device
//! per GPU. The started event says which (`Started::gpus_by`).

use super::compat::{self, cdi_devices, container_name, urlencode, Compat, LABEL};
use super::http::{Api, Response};
use super::{cgroup_of, BoxFuture, Exit, Found, Launch, Runtime, Started};
use crate::error::{Error, Result};
use crate::request::Run;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::Duration;

pub struct Docker {
    pub socket: PathBuf,
    /// CDI device name for a GPU, `{uuid}` replaced (runtime.cdi_device).
    pub cdi_device: String,
    /// A WSL2 host: Docker Desktop gives a container every GPU or none.
    pub wsl: bool,
    /// How long one API call may go unanswered (a stop also has the
    /// container's own stop timeout).
    pub answer_within: Duration,
    /// The daemon's own uid: its own workers run as their image says (a
    /// session daemon's rootless Docker); another owner's run as that owner.
    pub own_uid: u32,
}

/// How a container is given its GPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuRequest {
    /// The CDI device of each GPU (runtime.cdi_device).
    Cdi,
    /// Docker's GPU request naming each GPU's UUID (`--gpus device=UUID`).
    ByUuid,
    /// Docker's GPU request for every GPU (`--gpus all`; WSL).
    All,
}

fn engine_error(what: &str, r: &Response) -> String {
    compat::engine_error("Docker", what, r)
}

/// What a Docker user does about a socket that cannot be reached.
fn unreachable_hint(kind: std::io::ErrorKind) -> Option<String> {
    use std::io::ErrorKind::{ConnectionRefused, NotFound, PermissionDenied};
    match kind {
        NotFound | ConnectionRefused => Some(
            "; is dockerd running (systemctl start docker)? Or set runtime.docker_socket to \
             its socket"
                .into(),
        ),
        PermissionDenied => {
            // SAFETY: geteuid cannot fail. The uid, not its name: no name
            // service is asked on the way to an error.
            let uid = unsafe { libc::geteuid() };
            Some(format!(
                "; astraeusd runs as uid {uid}, which may not use Docker's socket: add that \
                 user to the docker group (usermod -aG docker USER) and restart astraeusd"
            ))
        }
        _ => None,
    }
}

fn api_error(what: &str, r: &Response) -> Error {
    Error::Backend(engine_error(what, r))
}

/// The engine's refusal to start a container, with what to do when it is
/// its GPU request that no driver serves.
fn start_error(r: &Response) -> Error {
    let said = engine_error("start", r);
    let hint = if said.contains("could not select device driver \"cdi\"") {
        ": Docker's CDI is off (enable the cdi feature in /etc/docker/daemon.json \
         and restart dockerd), or set runtime.cdi_device to a device its specs name"
    } else if said.contains("could not select device driver") {
        ": NVIDIA's container toolkit is missing or not set up for Docker; install \
         nvidia-container-toolkit, run `nvidia-ctk runtime configure --runtime=docker` \
         and restart dockerd"
    } else {
        ""
    };
    Error::Backend(format!("{said}{hint}"))
}

impl Docker {
    /// Its API as the calls it shares with podman's make it.
    fn compat(&self) -> Compat<'_> {
        Compat {
            api: Api {
                name: "Docker",
                service: "dockerd",
                socket: &self.socket,
                hint: unreachable_hint,
            },
            prefix: "",
            answer_within: self.answer_within,
            stop_seconds: "t",
            error: api_error,
        }
    }

    /// How this launch's GPUs are asked for: CDI when the engine has it on.
    async fn gpu_request(&self, l: &Launch) -> Result<Option<GpuRequest>> {
        if l.gpu_uuids.is_empty() {
            return Ok(None);
        }
        let r = self.compat().call("info", "GET", "/info", None).await?;
        if r.status != 200 {
            return Err(api_error("info", &r));
        }
        let cdi_on = serde_json::from_slice::<Value>(&r.body)
            .ok()
            .and_then(|v| Some(!v.get("CDISpecDirs")?.as_array()?.is_empty()))
            .unwrap_or(false);
        Ok(Some(if cdi_on {
            GpuRequest::Cdi
        } else if self.wsl {
            GpuRequest::All
        } else {
            GpuRequest::ByUuid
        }))
    }

    /// How the started event says the GPUs were given.
    pub fn gpus_by(&self, l: &Launch, gpus: GpuRequest) -> String {
        match gpus {
            GpuRequest::Cdi => format!(
                "through CDI: {}",
                cdi_devices(&self.cdi_device, &l.gpu_uuids).join(", ")
            ),
            GpuRequest::ByUuid => format!(
                "through Docker's GPU request (--gpus device={})",
                l.gpu_uuids.join(",")
            ),
            GpuRequest::All => "through Docker's GPU request for every GPU (--gpus all)".into(),
        }
    }

    /// The Engine API's create body for a launch.
    pub fn create_body(&self, l: &Launch, gpus: Option<GpuRequest>) -> Result<Value> {
        let Run::Container {
            image,
            command,
            env,
        } = &l.run
        else {
            return Err(Error::InvalidRequest("run: not a container".into()));
        };
        let mut vars: Vec<String> = env
            .iter()
            .filter(|(k, _)| !(l.gpu_memory_gb.is_some() && k.as_str() == "ASTRAEUS_GPU_MEMORY_GB"))
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        if let Some(gb) = &l.gpu_memory_gb {
            vars.push(format!("ASTRAEUS_GPU_MEMORY_GB={gb}"));
        }
        let mut host = serde_json::Map::new();
        if !l.cpu_cores.is_zero() {
            // Billionths of a CPU: hundredths × 10^7.
            host.insert(
                "NanoCpus".into(),
                json!(l.cpu_cores.hundredths() * 10_000_000),
            );
        }
        if l.memory_bytes > 0 {
            host.insert("Memory".into(), json!(l.memory_bytes));
        }
        let requests = match gpus {
            None => json!([]),
            Some(GpuRequest::Cdi) => json!([{
                "Driver": "cdi",
                "DeviceIDs": cdi_devices(&self.cdi_device, &l.gpu_uuids),
            }]),
            Some(GpuRequest::ByUuid) => json!([{
                "Driver": "",
                "Count": 0,
                "DeviceIDs": l.gpu_uuids,
                "Capabilities": [["gpu"]],
            }]),
            Some(GpuRequest::All) => json!([{
                "Driver": "",
                "Count": -1,
                "Capabilities": [["gpu"]],
            }]),
        };
        host.insert("DeviceRequests".into(), requests);
        // As unit workers' NoNewPrivileges=yes: no setuid program of the
        // image raises what its processes may do.
        host.insert("SecurityOpt".into(), json!(["no-new-privileges"]));
        if let Some(most) = l.max_processes {
            host.insert("PidsLimit".into(), json!(most));
        }
        let mut body = json!({
            "Image": image,
            "Env": vars,
            "Labels": { LABEL: l.worker },
            "HostConfig": host,
        });
        if !command.is_empty() {
            body["Cmd"] = json!(command);
        }
        // A member's container runs as that member, not as root; the
        // daemon's own (a session's rootless Docker) as its image says.
        // With its primary group, and no group but that (Docker gives a
        // bare uid root's group: `uid=1003 gid=0 groups=0`).
        if let Some(uid) = l.user.filter(|u| *u != 0 && *u != self.own_uid) {
            body["User"] = json!(match l.group {
                Some(gid) => format!("{uid}:{gid}"),
                None => uid.to_string(),
            });
        }
        Ok(body)
    }

    /// Exit status and end (epoch ms) of an ended container, from its
    /// inspection.
    async fn ended(&self, id: &str) -> (Option<i32>, Option<i64>) {
        let Ok(r) = self
            .compat()
            .call("inspect", "GET", &format!("/containers/{id}/json"), None)
            .await
        else {
            return (None, None);
        };
        let Ok(v) = serde_json::from_slice::<Value>(&r.body) else {
            return (None, None);
        };
        let code = v
            .pointer("/State/ExitCode")
            .and_then(Value::as_i64)
            .map(|c| c as i32);
        let at = v
            .pointer("/State/FinishedAt")
            .and_then(Value::as_str)
            .and_then(|t| t.parse::<jiff::Timestamp>().ok())
            .map(|t| t.as_millisecond())
            .filter(|ms| *ms > 0);
        (code, at)
    }
}

/// Why a shared worker under Docker is promised, never held.
pub const NO_INIT_STEP: &str = "Docker starts a container's command as it creates its \
    control group; no limit can be set before it runs (podman can)";

impl Runtime for Docker {
    fn start<'a>(&'a self, l: &'a Launch) -> BoxFuture<'a, Result<Started>> {
        Box::pin(async move {
            let gpus = self.gpu_request(l).await?;
            let body = self.create_body(l, gpus)?;
            let name = container_name(&l.worker);
            let path = format!("/containers/create?name={}", urlencode(&name));
            let r = match self
                .compat()
                .call("create", "POST", &path, Some(&body))
                .await
            {
                Ok(r) => r,
                Err(e) => {
                    // Unanswered: the engine may still create it; removed
                    // while the name is still this worker's.
                    let _ = self.remove(&name).await;
                    return Err(e);
                }
            };
            match r.status {
                201 => {}
                // Creating never pulls (a pull of gigabytes would hold the
                // GPUs idle): the image must be on the host.
                404 => {
                    return Err(Error::Backend(format!(
                        "{}: pull it on the host first (docker pull {}); astraeusd never \
                         pulls an image",
                        engine_error("create", &r),
                        crate::text::printable(body["Image"].as_str().unwrap_or_default()),
                    )))
                }
                _ => return Err(api_error("create", &r)),
            }
            let id = serde_json::from_slice::<Value>(&r.body)
                .ok()
                .and_then(|v| v.get("Id").and_then(Value::as_str).map(str::to_string))
                .ok_or_else(|| Error::Backend("Docker create: no Id in the reply".into()))?;
            crate::failpoint::hit("docker.after-create");
            let started = self
                .compat()
                .call("start", "POST", &format!("/containers/{id}/start"), None)
                .await;
            let err = match started {
                Ok(r) if r.status == 204 || r.status == 304 => {
                    // Docker creates a container's processes and runs its
                    // command in one step (no `init`): nothing can be set
                    // on its control group before the command's first line.
                    let enforcement = l.hold.as_ref().map(|_| {
                        crate::inventory::limits::Enforcement::Promised(NO_INIT_STEP.into())
                    });
                    return Ok(Started {
                        gpus_by: gpus.map(|g| self.gpus_by(l, g)),
                        id,
                        enforcement,
                    });
                }
                Ok(r) => start_error(&r),
                Err(e) => e,
            };
            let _ = self.remove(&id).await;
            Err(err)
        })
    }

    fn wait<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Exit> {
        Box::pin(async move {
            let path = format!("/containers/{id}/wait?condition=not-running");
            loop {
                match self
                    .compat()
                    .call_within(None, "wait", "POST", &path, None)
                    .await
                {
                    Ok(r) if r.status == 200 => {
                        let v: Value = serde_json::from_slice(&r.body).unwrap_or_default();
                        let error = v.pointer("/Error/Message").and_then(Value::as_str);
                        return match (v.get("StatusCode").and_then(Value::as_i64), error) {
                            (_, Some(e)) if !e.is_empty() => {
                                Exit::Failed(format!("Docker: {}", crate::text::printable(e)))
                            }
                            (Some(code), _) => Exit::Exited(code as i32),
                            (None, _) => Exit::Failed(format!(
                                "Docker wait: unexpected reply {:?}",
                                r.text()
                            )),
                        };
                    }
                    Ok(r) => return Exit::Failed(engine_error("wait", &r)),
                    // dockerd is gone (restarted, stopped): with live restore
                    // the container may well still run, so its share stays
                    // held; wait again.
                    Err(e) => {
                        tracing::warn!("waiting for container {id}: {e}; retrying");
                        tokio::time::sleep(Duration::from_secs(2)).await;
                    }
                }
            }
        })
    }

    fn stop<'a>(&'a self, id: &'a str, timeout: Duration) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move { self.compat().stop(id, timeout).await })
    }

    fn kill<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move { self.compat().kill(id).await })
    }

    fn remove<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move { self.compat().remove(id).await })
    }

    /// Docker's inspection names no control group: the container's first
    /// process's does (`/proc/PID/cgroup`), whichever driver placed it
    /// (`/docker/<id>` with cgroupfs, `system.slice/docker-<id>.scope` with
    /// systemd), on v1, hybrid and v2 hosts alike.
    fn cgroup<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Option<String>> {
        Box::pin(async move {
            let r = self
                .compat()
                .call("inspect", "GET", &format!("/containers/{id}/json"), None)
                .await
                .ok()?;
            let v: Value = serde_json::from_slice(&r.body).ok()?;
            let pid = v.pointer("/State/Pid")?.as_u64().filter(|p| *p > 0)?;
            // procfs answers at once: no thread of its own.
            let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
            cgroup_of(&text)
        })
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<Found>>> {
        Box::pin(async move {
            let filters = json!({ "label": [LABEL] }).to_string();
            let path = format!("/containers/json?all=true&filters={}", urlencode(&filters));
            let r = self.compat().call("list", "GET", &path, None).await?;
            if r.status != 200 {
                return Err(api_error("list", &r));
            }
            let items: Vec<Value> = serde_json::from_slice(&r.body)
                .map_err(|e| Error::Backend(format!("Docker list: {e}")))?;
            let mut found = Vec::new();
            for c in &items {
                let (Some(worker), Some(id), Some(state)) = (
                    c.pointer(&format!("/Labels/{LABEL}"))
                        .and_then(Value::as_str),
                    c.get("Id").and_then(Value::as_str),
                    c.get("State").and_then(Value::as_str),
                ) else {
                    continue;
                };
                // A paused or restarting container still holds its GPUs.
                let running = matches!(state, "running" | "paused" | "restarting");
                let (exit_code, ended_ms) = if matches!(state, "exited" | "dead") {
                    self.ended(id).await
                } else {
                    (None, None)
                };
                found.push(Found {
                    worker: worker.to_string(),
                    id: id.to_string(),
                    running,
                    exit_code,
                    ended_ms,
                });
            }
            Ok(found)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quantity::Amount;

    fn docker(wsl: bool) -> Docker {
        Docker {
            socket: "/nonexistent/docker.sock".into(),
            cdi_device: "nvidia.com/gpu={uuid}".into(),
            wsl,
            answer_within: Duration::from_secs(1),
            own_uid: 1000,
        }
    }

    fn launch(user: Option<u32>) -> Launch {
        Launch {
            worker: "listen".into(),
            run: Run::Container {
                image: "localhost/bb".into(),
                command: vec!["sh".into()],
                env: [
                    ("K".to_string(), "V".to_string()),
                    // The daemon's value wins over one the request sets.
                    ("ASTRAEUS_GPU_MEMORY_GB".to_string(), "99".to_string()),
                ]
                .into(),
            },
            gpu_uuids: vec!["GPU-a".into(), "GPU-b".into()],
            gpu_pci: vec![],
            gpu_memory_gb: Some("2.5".into()),
            cpu_cores: Amount::parse("1.5").unwrap(),
            memory_bytes: 1 << 30,
            user,
            group: None,
            max_processes: None,
            hold: None,
        }
    }

    #[test]
    fn the_create_body_carries_share_labels_limits_and_owner() {
        let b = docker(false)
            .create_body(&launch(Some(1001)), Some(GpuRequest::ByUuid))
            .unwrap();
        assert_eq!(b["Image"], "localhost/bb");
        assert_eq!(b["Cmd"], json!(["sh"]));
        assert_eq!(b["Env"], json!(["K=V", "ASTRAEUS_GPU_MEMORY_GB=2.5"]));
        assert_eq!(b["Labels"][LABEL], "listen");
        assert_eq!(b["HostConfig"]["NanoCpus"], 1_500_000_000u64);
        assert_eq!(b["HostConfig"]["Memory"], 1u64 << 30);
        assert_eq!(b["User"], "1001");
        assert_eq!(b["HostConfig"]["SecurityOpt"], json!(["no-new-privileges"]));
        // Root's and the daemon's own run as the image says.
        for own in [Some(0), Some(1000), None] {
            let b = docker(false).create_body(&launch(own), None).unwrap();
            assert!(b.get("User").is_none(), "{own:?}: {b}");
            assert_eq!(b["HostConfig"]["DeviceRequests"], json!([]));
        }
    }

    #[test]
    fn each_gpu_request_is_what_docker_run_sends() {
        let d = docker(false);
        let l = launch(None);
        let requests =
            |g| d.create_body(&l, Some(g)).unwrap()["HostConfig"]["DeviceRequests"].clone();
        assert_eq!(
            requests(GpuRequest::Cdi),
            json!([{"Driver": "cdi", "DeviceIDs": ["nvidia.com/gpu=GPU-a", "nvidia.com/gpu=GPU-b"]}])
        );
        assert_eq!(
            requests(GpuRequest::ByUuid),
            json!([{"Driver": "", "Count": 0, "DeviceIDs": ["GPU-a", "GPU-b"], "Capabilities": [["gpu"]]}])
        );
        assert_eq!(
            requests(GpuRequest::All),
            json!([{"Driver": "", "Count": -1, "Capabilities": [["gpu"]]}])
        );
        assert_eq!(
            d.gpus_by(&l, GpuRequest::ByUuid),
            "through Docker's GPU request (--gpus device=GPU-a,GPU-b)"
        );
    }

    /// What a stand-in engine was asked: (request line, body) each.
    type Asked = std::sync::Arc<std::sync::Mutex<Vec<(String, String)>>>;

    /// A stand-in engine on a unix socket: answers each request from
    /// `answer` (None: never answers) and records what it was asked.
    fn engine(answer: fn(&str) -> Option<(u16, String)>) -> (tempfile::TempDir, PathBuf, Asked) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("docker.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let asked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = asked.clone();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let mut raw = Vec::new();
                    let mut buf = [0u8; 4096];
                    // The head, then as much body as it announces.
                    let (head, body) = loop {
                        let n = conn.read(&mut buf).await.unwrap_or(0);
                        raw.extend_from_slice(&buf[..n]);
                        let text = String::from_utf8_lossy(&raw).into_owned();
                        if let Some((head, body)) = text.split_once("\r\n\r\n") {
                            let want: usize = head
                                .lines()
                                .find_map(|l| l.strip_prefix("Content-Length: "))
                                .and_then(|n| n.parse().ok())
                                .unwrap_or(0);
                            if body.len() >= want || n == 0 {
                                break (head.to_string(), body.to_string());
                            }
                        }
                        if n == 0 {
                            break (text, String::new());
                        }
                    };
                    let line = head.lines().next().unwrap_or("").to_string();
                    seen.lock().unwrap().push((line.clone(), body));
                    match answer(&line) {
                        Some((status, reply)) => {
                            let out = format!(
                                "HTTP/1.1 {status} X\r\nContent-Length: {}\r\n\r\n{reply}",
                                reply.len()
                            );
                            let _ = conn.write_all(out.as_bytes()).await;
                        }
                        None => std::future::pending::<()>().await,
                    }
                });
            }
        });
        (dir, socket, asked)
    }

    #[tokio::test]
    async fn an_engine_with_cdi_on_is_asked_for_the_cdi_devices() {
        let (_dir, socket, asked) = engine(|line| {
            Some(match line.split_whitespace().nth(1).unwrap_or("") {
                "/info" => (200, r#"{"CDISpecDirs":["/etc/cdi","/var/run/cdi"]}"#.into()),
                p if p.starts_with("/containers/create") => (201, r#"{"Id":"c1"}"#.into()),
                "/containers/c1/start" => (204, String::new()),
                _ => (404, r#"{"message":"no"}"#.into()),
            })
        });
        let d = Docker {
            socket,
            ..docker(false)
        };
        let started = d.start(&launch(None)).await.unwrap();
        assert_eq!(started.id, "c1");
        assert_eq!(
            started.gpus_by.as_deref(),
            Some("through CDI: nvidia.com/gpu=GPU-a, nvidia.com/gpu=GPU-b")
        );
        let asked = asked.lock().unwrap();
        let lines: Vec<&str> = asked.iter().map(|(l, _)| l.as_str()).collect();
        assert_eq!(
            lines,
            [
                "GET /info HTTP/1.1",
                "POST /containers/create?name=astraeus-listen HTTP/1.1",
                "POST /containers/c1/start HTTP/1.1"
            ]
        );
        let body: Value = serde_json::from_str(&asked[1].1).unwrap();
        assert_eq!(
            body["HostConfig"]["DeviceRequests"],
            json!([{"Driver": "cdi", "DeviceIDs": ["nvidia.com/gpu=GPU-a", "nvidia.com/gpu=GPU-b"]}])
        );
    }

    /// An engine without CDI on a WSL host: Docker Desktop's request for
    /// every GPU.
    #[tokio::test]
    async fn on_wsl_without_cdi_every_gpu_is_asked_for() {
        let (_dir, socket, asked) = engine(|line| {
            Some(match line.split_whitespace().nth(1).unwrap_or("") {
                "/info" => (200, r#"{"ServerVersion":"27.0.3"}"#.into()),
                p if p.starts_with("/containers/create") => (201, r#"{"Id":"c1"}"#.into()),
                _ => (204, String::new()),
            })
        });
        let d = Docker {
            socket,
            ..docker(true)
        };
        let started = d.start(&launch(None)).await.unwrap();
        assert_eq!(
            started.gpus_by.as_deref(),
            Some("through Docker's GPU request for every GPU (--gpus all)")
        );
        let body: Value = serde_json::from_str(&asked.lock().unwrap()[1].1).unwrap();
        assert_eq!(body["HostConfig"]["DeviceRequests"][0]["Count"], -1);
    }

    /// An engine that reads each request and never answers: the launch
    /// fails in its time, naming Docker, after asking to remove what the
    /// engine may yet create under the worker's name; a wait keeps waiting.
    #[tokio::test]
    async fn a_docker_that_never_answers_fails_the_call_in_its_time() {
        let (_dir, socket, asked) = engine(|line| {
            line.starts_with("GET /info")
                .then(|| (200, "{}".to_string()))
        });
        let d = Docker {
            socket,
            answer_within: Duration::from_millis(200),
            ..docker(false)
        };
        let limit = Duration::from_secs(10);
        let e = tokio::time::timeout(limit, d.start(&launch(None)))
            .await
            .expect("the call gives up by itself")
            .unwrap_err();
        assert!(
            e.message()
                .starts_with("Docker create: no answer within 0.2 s (socket "),
            "{}",
            e.message()
        );
        assert!(e.message().ends_with("is dockerd hung?"), "{}", e.message());
        let lines: Vec<String> = asked
            .lock()
            .unwrap()
            .iter()
            .map(|(l, _)| l.clone())
            .collect();
        assert_eq!(
            lines,
            [
                "GET /info HTTP/1.1",
                "POST /containers/create?name=astraeus-listen HTTP/1.1",
                "DELETE /containers/astraeus-listen?force=true HTTP/1.1"
            ]
        );
        let e = tokio::time::timeout(limit, d.stop("c", Duration::from_millis(300)))
            .await
            .expect("the call gives up by itself")
            .unwrap_err();
        assert!(
            e.message().contains("no answer within 0.5 s"),
            "{}",
            e.message()
        );
        let waited = tokio::time::timeout(Duration::from_secs(1), d.wait("c")).await;
        assert!(waited.is_err(), "a wait is a long poll: it has no limit");
    }

    #[test]
    fn a_refused_gpu_request_says_what_to_install() {
        let r = Response {
            status: 500,
            body:
                br#"{"message":"could not select device driver \"\" with capabilities: [[gpu]]"}"#
                    .to_vec(),
        };
        let e = start_error(&r);
        assert!(
            e.message().starts_with(
                "Docker start: could not select device driver \"\" with capabilities: [[gpu]] (HTTP 500): \
                 NVIDIA's container toolkit is missing"
            ),
            "{}",
            e.message()
        );
        assert!(e
            .message()
            .contains("nvidia-ctk runtime configure --runtime=docker"));
    }
}
