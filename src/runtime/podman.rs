//! Containers through podman's libpod REST API on its unix socket. Each
//! container is named `astraeus-<worker>` and labelled `astraeus.worker=<worker>`,
//! so a restarted daemon finds it again and a second start cannot happen.

use super::compat::{self, Compat};
pub use super::compat::{cdi_devices, container_name, urlencode, LABEL};
use super::http::{Api, Response};
use super::{BoxFuture, Exit, Found, Launch, Runtime, Started};
use crate::error::{Error, Result};
use crate::request::Run;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::Duration;

const API: &str = "/v4.0.0/libpod";

pub struct Podman {
    pub socket: PathBuf,
    /// CDI device name for a GPU, `{uuid}` replaced: `nvidia.com/gpu={uuid}`.
    pub cdi_device: String,
    /// How long one API call may go unanswered ([`ANSWER_WITHIN`]; a stop
    /// also has the container's own stop timeout). Without a limit a podman
    /// service that accepts and never answers left a worker "starting",
    /// with no reason, for ever.
    pub answer_within: Duration,
    /// The daemon's own uid: its own workers run as their image says (a
    /// session daemon's rootless podman); another owner's run as that owner.
    pub own_uid: u32,
}

/// Long for an API whose calls take milliseconds: libpod's create does not
/// pull (a missing image is a 404 at once), but podman's storage lock may
/// be held a while by another podman (a pull, a commit).
pub const ANSWER_WITHIN: Duration = Duration::from_secs(120);

fn backend(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Backend(format!("podman {what}: {e}"))
}

fn api_error(what: &str, r: &Response) -> Error {
    compat::api_error("podman", what, r)
}

impl Podman {
    /// Its API as the calls it shares with Docker's make it.
    fn compat(&self) -> Compat<'_> {
        Compat {
            api: Api {
                name: "podman",
                service: "the podman service",
                socket: &self.socket,
                hint: |_| None,
            },
            prefix: API,
            answer_within: self.answer_within,
            stop_seconds: "timeout",
            error: api_error,
        }
    }

    /// The libpod create body for a launch.
    pub fn create_body(&self, l: &Launch) -> Result<Value> {
        let Run::Container {
            image,
            command,
            env,
        } = &l.run
        else {
            return Err(Error::InvalidRequest("run: not a container".into()));
        };
        let mut env: serde_json::Map<String, Value> =
            env.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
        if let Some(gb) = &l.gpu_memory_gb {
            env.insert("ASTRAEUS_GPU_MEMORY_GB".into(), json!(gb));
        }
        let devices: Vec<Value> = cdi_devices(&self.cdi_device, &l.gpu_uuids)
            .iter()
            .map(|p| json!({ "path": p }))
            .collect();
        let mut limits = serde_json::Map::new();
        if !l.cpu_cores.is_zero() {
            // CPU quota per 100 ms period: cores × 100 000 µs.
            limits.insert(
                "cpu".into(),
                json!({ "quota": l.cpu_cores.hundredths() * 1000, "period": 100_000 }),
            );
        }
        if l.memory_bytes > 0 {
            limits.insert("memory".into(), json!({ "limit": l.memory_bytes }));
        }
        if let Some(most) = l.max_processes {
            limits.insert("pids".into(), json!({ "limit": most }));
        }
        let mut body = json!({
            "name": container_name(&l.worker),
            "image": image,
            "env": env,
            "labels": { LABEL: l.worker },
            "devices": devices,
            "resource_limits": limits,
            // As unit workers' NoNewPrivileges=yes: no setuid program of
            // the image raises what its processes may do.
            "no_new_privileges": true,
        });
        if !command.is_empty() {
            body["command"] = json!(command);
        }
        // A member's container runs as that member, not as root.
        // With its primary group, and no group but that (an engine gives a
        // bare uid root's group).
        if let Some(uid) = l.user.filter(|u| *u != 0 && *u != self.own_uid) {
            body["user"] = json!(match l.group {
                Some(gid) => format!("{uid}:{gid}"),
                None => uid.to_string(),
            });
        }
        Ok(body)
    }
}

impl Podman {
    /// Creates the container's processes without running its command
    /// (libpod's init); its first process's pid, when podman names it.
    async fn init(&self, id: &str) -> Result<Option<u32>> {
        let r = self
            .compat()
            .call("init", "POST", &format!("/containers/{id}/init"), None)
            .await?;
        if r.status != 204 && r.status != 304 {
            return Err(api_error("init", &r));
        }
        let r = self
            .compat()
            .call("inspect", "GET", &format!("/containers/{id}/json"), None)
            .await?;
        let v: Value = serde_json::from_slice(&r.body).map_err(|e| backend("inspect", e))?;
        Ok(v.pointer("/State/Pid")
            .and_then(Value::as_u64)
            .filter(|pid| *pid > 0)
            .map(|pid| pid as u32))
    }
}

impl Runtime for Podman {
    fn start<'a>(&'a self, l: &'a Launch) -> BoxFuture<'a, Result<Started>> {
        Box::pin(async move {
            let body = self.create_body(l)?;
            let name = container_name(&l.worker);
            let r = match self
                .compat()
                .call("create", "POST", "/containers/create", Some(&body))
                .await
            {
                Ok(r) => r,
                Err(e) => {
                    // Unanswered (or cut off): podman may still create it. A
                    // container left behind would run unaccounted, or hold
                    // the name; removed before the worker is failed (while
                    // the name is still the worker's, so nothing new has it).
                    let _ = self.remove(&name).await;
                    return Err(e);
                }
            };
            if r.status != 201 {
                return Err(api_error("create", &r));
            }
            let id = serde_json::from_slice::<Value>(&r.body)
                .ok()
                .and_then(|v| v.get("Id").and_then(Value::as_str).map(str::to_string))
                .ok_or_else(|| backend("create", "no Id in the reply"))?;
            crate::failpoint::hit("podman.after-create");
            // A shared worker's memory limits go on its control group
            // between init (the container's processes exist, its command
            // not yet run) and start: no byte of it runs unlimited.
            let enforcement = match &l.hold {
                None => None,
                Some(_) => match self.init(&id).await {
                    Ok(pid) => super::hold(l, pid.and_then(super::cgroup_of_pid)).await,
                    Err(e) => {
                        let _ = self.remove(&id).await;
                        return Err(e);
                    }
                },
            };
            let started = self
                .compat()
                .call("start", "POST", &format!("/containers/{id}/start"), None)
                .await;
            let err = match started {
                Ok(r) if r.status == 204 || r.status == 304 => {
                    let devices = cdi_devices(&self.cdi_device, &l.gpu_uuids);
                    return Ok(Started {
                        id,
                        gpus_by: (!devices.is_empty())
                            .then(|| format!("through CDI: {}", devices.join(", "))),
                        enforcement,
                    });
                }
                Ok(r) => api_error("start", &r),
                Err(e) => e,
            };
            let _ = self.remove(&id).await;
            Err(err)
        })
    }

    fn wait<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Exit> {
        Box::pin(async move {
            let path = format!("/containers/{id}/wait?condition=exited&condition=stopped");
            loop {
                match self
                    .compat()
                    .call_within(None, "wait", "POST", &path, None)
                    .await
                {
                    Ok(r) if r.status == 200 => {
                        return match r.text().trim().parse::<i32>() {
                            Ok(code) => Exit::Exited(code),
                            Err(_) => Exit::Failed(format!(
                                "podman wait: unexpected reply {:?}",
                                r.text()
                            )),
                        }
                    }
                    Ok(r) => return Exit::Failed(api_error("wait", &r).message().to_string()),
                    // Podman's socket is gone (restarted, stopped): the container
                    // may well still run, so its share stays held; wait again.
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

    /// The container's control group: its first process's, as the kernel
    /// names it (the `memory` controller's on a v1 host, where podman's
    /// `CgroupPath` may name another hierarchy's), else podman's word.
    fn cgroup<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Option<String>> {
        Box::pin(async move {
            let r = self
                .compat()
                .call("inspect", "GET", &format!("/containers/{id}/json"), None)
                .await
                .ok()?;
            let v: Value = serde_json::from_slice(&r.body).ok()?;
            let by_pid = v
                .pointer("/State/Pid")
                .and_then(Value::as_u64)
                .filter(|pid| *pid > 0)
                .and_then(|pid| super::cgroup_of_pid(pid as u32));
            if by_pid.is_some() {
                return by_pid;
            }
            let path = v.pointer("/State/CgroupPath")?.as_str()?;
            (!path.is_empty()).then(|| path.to_string())
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
            let items: Vec<Value> =
                serde_json::from_slice(&r.body).map_err(|e| backend("list", e))?;
            Ok(items
                .iter()
                .filter_map(|c| {
                    let worker = c.get("Labels")?.get(LABEL)?.as_str()?.to_string();
                    let state = c.get("State")?.as_str()?;
                    Some(Found {
                        worker,
                        id: c.get("Id")?.as_str()?.to_string(),
                        running: state == "running",
                        exit_code: (state == "exited")
                            .then(|| c.get("ExitCode").and_then(Value::as_i64).map(|x| x as i32))
                            .flatten(),
                        ended_ms: (state == "exited")
                            .then(|| c.get("ExitedAt").and_then(Value::as_i64))
                            .flatten()
                            .filter(|s| *s > 0)
                            .map(|s| s * 1000),
                    })
                })
                .collect())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quantity::Amount;

    /// A service that reads each request and never answers: the launch
    /// fails in its time with a reason, instead of starting for ever, after
    /// asking to remove what podman may yet create under the worker's name;
    /// the wait (a long poll by design) keeps waiting.
    #[tokio::test]
    async fn a_podman_that_never_answers_fails_the_call_in_its_time() {
        use tokio::io::AsyncReadExt;
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("podman.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let asked = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let seen = asked.clone();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    let n = conn.read(&mut buf).await.unwrap_or(0);
                    let head = String::from_utf8_lossy(&buf[..n]);
                    let line = head.lines().next().unwrap_or("").to_string();
                    seen.lock().unwrap().push(line);
                    std::future::pending::<()>().await;
                    drop(conn);
                });
            }
        });
        let p = Podman {
            socket,
            cdi_device: "nvidia.com/gpu={uuid}".into(),
            answer_within: Duration::from_millis(200),
            own_uid: 0,
        };
        let l = Launch {
            worker: "w".into(),
            run: Run::Container {
                image: "localhost/bb".into(),
                command: vec![],
                env: Default::default(),
            },
            gpu_uuids: vec![],
            gpu_pci: vec![],
            gpu_memory_gb: None,
            cpu_cores: Amount::ZERO,
            memory_bytes: 0,
            user: None,
            group: None,
            max_processes: None,
            hold: None,
        };
        let limit = Duration::from_secs(10);
        let e = tokio::time::timeout(limit, p.start(&l))
            .await
            .expect("the call gives up by itself")
            .unwrap_err();
        assert!(
            e.message()
                .starts_with("podman create: no answer within 0.2 s (socket "),
            "{}",
            e.message()
        );
        assert_eq!(
            *asked.lock().unwrap(),
            [
                "POST /v4.0.0/libpod/containers/create HTTP/1.1",
                "DELETE /v4.0.0/libpod/containers/astraeus-w?force=true HTTP/1.1"
            ]
        );
        let e = tokio::time::timeout(limit, p.stop("c", Duration::from_millis(300)))
            .await
            .expect("the call gives up by itself")
            .unwrap_err();
        assert!(
            e.message().contains("no answer within 0.5 s"),
            "{}",
            e.message()
        );
        let waited = tokio::time::timeout(Duration::from_secs(1), p.wait("c")).await;
        assert!(waited.is_err(), "a wait is a long poll: it has no limit");
    }

    #[test]
    fn the_create_body_carries_share_devices_and_limits() {
        let p = Podman {
            socket: "/x".into(),
            cdi_device: "nvidia.com/gpu={uuid}".into(),
            answer_within: ANSWER_WITHIN,
            own_uid: 0,
        };
        let l = Launch {
            worker: "listen".into(),
            run: Run::Container {
                image: "localhost/bb".into(),
                command: vec!["sh".into()],
                env: [("K".to_string(), "V".to_string())].into(),
            },
            gpu_uuids: vec!["GPU-a".into()],
            gpu_pci: vec![],
            gpu_memory_gb: Some("2.5".into()),
            cpu_cores: Amount::parse("1.5").unwrap(),
            memory_bytes: 1 << 30,
            user: None,
            group: None,
            max_processes: None,
            hold: None,
        };
        let b = p.create_body(&l).unwrap();
        assert_eq!(b["name"], "astraeus-listen");
        assert_eq!(b["env"]["ASTRAEUS_GPU_MEMORY_GB"], "2.5");
        assert_eq!(b["env"]["K"], "V");
        assert_eq!(b["devices"][0]["path"], "nvidia.com/gpu=GPU-a");
        assert_eq!(b["resource_limits"]["cpu"]["quota"], 150_000);
        assert_eq!(b["resource_limits"]["memory"]["limit"], 1u64 << 30);
        assert_eq!(b["labels"][LABEL], "listen");
        assert_eq!(b["no_new_privileges"], true);
        assert!(b.get("user").is_none(), "no owner named: as the image says");
        // A member's runs as that member; root's and the daemon's own as
        // the image says.
        let as_member = Launch {
            user: Some(1001),
            group: None,
            max_processes: None,
            hold: None,
            ..l.clone()
        };
        assert_eq!(p.create_body(&as_member).unwrap()["user"], "1001");
        let session = Podman {
            own_uid: 1000,
            socket: "/x".into(),
            cdi_device: "nvidia.com/gpu={uuid}".into(),
            answer_within: ANSWER_WITHIN,
        };
        for own in [0, 1000] {
            let l = Launch {
                user: Some(own),
                group: None,
                max_processes: None,
                hold: None,
                ..l.clone()
            };
            let body = session.create_body(&l).unwrap();
            assert!(body.get("user").is_none(), "{own}: {body}");
        }
    }

    #[test]
    fn a_device_named_without_its_uuid_is_asked_for_once() {
        let mut p = Podman {
            socket: "/x".into(),
            cdi_device: "nvidia.com/gpu=all".into(),
            answer_within: ANSWER_WITHIN,
            own_uid: 0,
        };
        let l = Launch {
            worker: "w".into(),
            run: Run::Container {
                image: "i".into(),
                command: vec![],
                env: Default::default(),
            },
            gpu_uuids: vec!["GPU-a".into(), "GPU-b".into()],
            gpu_pci: vec![],
            gpu_memory_gb: None,
            cpu_cores: Amount::parse("0").unwrap(),
            memory_bytes: 0,
            user: None,
            group: None,
            max_processes: None,
            hold: None,
        };
        let paths = |p: &Podman| p.create_body(&l).unwrap()["devices"].clone();
        assert_eq!(paths(&p), json!([{ "path": "nvidia.com/gpu=all" }]));
        p.cdi_device = "nvidia.com/gpu={uuid}".into();
        assert_eq!(
            paths(&p),
            json!([{ "path": "nvidia.com/gpu=GPU-a" }, { "path": "nvidia.com/gpu=GPU-b" }])
        );
    }
}
