//! `unit` workers as systemd transient services, over D-Bus
//! (org.freedesktop.systemd1 StartTransientUnit): `astraeus-worker-<name>.service`,
//! so `systemctl status` and `journalctl -u` work for each worker. The end is
//! noticed from the unit's PropertiesChanged, not by polling.

use super::{BoxFuture, Exit, Found, Launch, Runtime, Started};
use crate::error::{Error, Result};
use crate::request::Run;
use futures_util::StreamExt;
use std::time::Duration;
use zbus::{Connection, OwnedObjectPath, OwnedVariant, Variant};

const SD: &str = "org.freedesktop.systemd1";
const SD_PATH: &str = "/org/freedesktop/systemd1";
const MANAGER: &str = "org.freedesktop.systemd1.Manager";
const PREFIX: &str = "astraeus-worker-";

pub struct Units {
    /// The bus of the service manager: the system bus, or a user's session bus.
    pub conn: Connection,
    /// TimeoutStopSec of each unit: graceful stop, then SIGKILL.
    pub stop_timeout: Duration,
    /// Caps for a unit whose request names none (`runtime.unit_default_*`).
    pub defaults: Defaults,
}

/// CPU and memory caps for units whose request names none; zero: uncapped.
#[derive(Clone, Copy, Debug, Default)]
pub struct Defaults {
    pub cpu_cores: crate::quantity::Amount,
    pub memory_bytes: u64,
}

pub fn unit_name(worker: &str) -> String {
    format!("{PREFIX}{worker}.service")
}

/// The slice a shared worker's unit runs in, its memory limits set on it
/// before the unit starts. A `-` in a slice's name nests it (`a-b.slice`
/// is a child of `a.slice`): escaped, so that worker `a-b`'s slice is never
/// inside worker `a`'s.
pub fn slice_name(worker: &str) -> String {
    format!("{PREFIX}{}.slice", worker.replace('-', "\\x2d"))
}

/// The slice of the unit `id` (`astraeus-worker-NAME.service`).
fn slice_of(id: &str) -> Option<String> {
    let worker = id.strip_prefix(PREFIX)?.strip_suffix(".service")?;
    Some(slice_name(worker))
}

fn backend(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Backend(format!("systemd {what}: {e}"))
}

fn no_such_unit(e: &zbus::Error) -> bool {
    matches!(e, zbus::Error::MethodError(name, _, _) if name.as_str() == "org.freedesktop.systemd1.NoSuchUnit")
}

/// A call to systemd, failed at its deadline (deadline.rs) as
/// `zbus::Error::Failure` naming what it waited for: not as
/// `InputOutput`, which `wait` takes for the bus gone.
async fn answered_in_time<T>(
    what: &str,
    call: impl std::future::Future<Output = zbus::Result<T>>,
) -> zbus::Result<T> {
    let limit = crate::deadline::of(crate::deadline::SYSTEMD);
    tokio::time::timeout(limit, call).await.unwrap_or_else(|_| {
        Err(zbus::Error::Failure(format!(
            "did not answer {what} within {} s; is it hung?",
            limit.as_secs_f64()
        )))
    })
}

impl Units {
    async fn manager<B>(&self, method: &str, body: &B) -> zbus::Result<zbus::Message>
    where
        B: serde::Serialize + zbus::Type,
    {
        let call = self
            .conn
            .call_method(Some(SD), SD_PATH, Some(MANAGER), method, body);
        answered_in_time(method, call).await
    }

    async fn property<T>(&self, path: &OwnedObjectPath, iface: &str, name: &str) -> zbus::Result<T>
    where
        T: TryFrom<OwnedVariant>,
        T::Error: std::fmt::Display,
    {
        let asked = (iface, name);
        let call = self.conn.call_method(
            Some(SD),
            path.as_str(),
            Some("org.freedesktop.DBus.Properties"),
            "Get",
            &asked,
        );
        let m = answered_in_time(name, call).await?;
        let v: OwnedVariant = m.body().deserialize()?;
        T::try_from(v).map_err(|e| zbus::Error::Failure(format!("{name}: {e}")))
    }
}

/// The transient unit's properties for a launch.
pub fn properties(
    l: &Launch,
    stop_timeout: Duration,
    defaults: Defaults,
) -> Result<Vec<(&'static str, OwnedVariant)>> {
    {
        let Run::Unit { exec, env } = &l.run else {
            return Err(Error::InvalidRequest("run: not a unit".into()));
        };
        let mut environment: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        if let Some(gb) = &l.gpu_memory_gb {
            environment.push(format!("ASTRAEUS_GPU_MEMORY_GB={gb}"));
        }
        if !l.gpu_uuids.is_empty() {
            let uuids = l.gpu_uuids.join(",");
            environment.push(format!("CUDA_VISIBLE_DEVICES={uuids}"));
            environment.push(format!("NVIDIA_VISIBLE_DEVICES={uuids}"));
        }
        let v = |x: Variant<'static>| OwnedVariant::try_from(x).expect("plain values convert");
        let mut props = vec![
            (
                "Description",
                v(Variant::from(format!("astraeus worker {}", l.worker))),
            ),
            ("Type", v(Variant::from("exec"))),
            (
                "ExecStart",
                v(Variant::from(vec![(exec[0].clone(), exec.clone(), false)])),
            ),
            ("Environment", v(Variant::from(environment))),
            (
                "TimeoutStopUSec",
                v(Variant::from(stop_timeout.as_micros() as u64)),
            ),
            // A worker never gains privileges (setuid binaries, file caps).
            ("NoNewPrivileges", v(Variant::from(true))),
        ];
        let cpu_cores = if l.cpu_cores.is_zero() {
            defaults.cpu_cores
        } else {
            l.cpu_cores
        };
        if !cpu_cores.is_zero() {
            // µs of CPU per second: one core is 1 000 000.
            props.push((
                "CPUQuotaPerSecUSec",
                v(Variant::from(cpu_cores.hundredths() * 10_000)),
            ));
        }
        let memory_bytes = match l.memory_bytes {
            0 => defaults.memory_bytes,
            asked => asked,
        };
        if memory_bytes > 0 {
            props.push(("MemoryMax", v(Variant::from(memory_bytes))));
        }
        if let Some(uid) = l.user.filter(|u| *u != 0) {
            props.push(("User", v(Variant::from(uid.to_string()))));
        }
        Ok(props)
    }
}

impl Units {
    /// A unit's ControlGroup, when it is loaded and has one.
    async fn control_group(&self, unit: &str, kind: &str) -> Option<String> {
        let m = self.manager("GetUnit", &(unit,)).await.ok()?;
        let path: OwnedObjectPath = m.body().deserialize().ok()?;
        let iface = format!("org.freedesktop.systemd1.{kind}");
        let cg: String = self.property(&path, &iface, "ControlGroup").await.ok()?;
        (!cg.is_empty()).then_some(cg)
    }

    /// Starts the worker's slice (kept if it is there already) and answers
    /// its control group once systemd has made it.
    async fn slice(&self, slice: &str, worker: &str) -> Result<String> {
        let v = |x: Variant<'static>| OwnedVariant::try_from(x).expect("plain values convert");
        let props: Vec<(&str, OwnedVariant)> = vec![
            (
                "Description",
                v(Variant::from(format!(
                    "astraeus worker {worker}'s GPU memory limits"
                ))),
            ),
            // On a v1 host its memory controller's group is made only so.
            ("MemoryAccounting", v(Variant::from(true))),
        ];
        let aux: Vec<(String, Vec<(String, OwnedVariant)>)> = Vec::new();
        match self
            .manager("StartTransientUnit", &(slice, "fail", props, aux))
            .await
        {
            Ok(_) => {}
            Err(zbus::Error::MethodError(name, _, _))
                if name.as_str() == "org.freedesktop.systemd1.UnitExists" => {}
            Err(e) => return Err(backend("StartTransientUnit (slice)", e)),
        }
        // The start is a job: the group exists once it ran (milliseconds).
        for _ in 0..100 {
            if let Some(cg) = self.control_group(slice, "Slice").await {
                return Ok(cg);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(backend(
            "StartTransientUnit (slice)",
            format!("{slice} has no control group after 2 s"),
        ))
    }

    async fn ended(&self, path: &OwnedObjectPath) -> zbus::Result<Option<Exit>> {
        let state: String = self
            .property(path, "org.freedesktop.systemd1.Unit", "ActiveState")
            .await?;
        if state != "inactive" && state != "failed" {
            return Ok(None);
        }
        let service = "org.freedesktop.systemd1.Service";
        let status: i32 = self.property(path, service, "ExecMainStatus").await?;
        let result: String = self.property(path, service, "Result").await?;
        Ok(Some(match result.as_str() {
            "success" | "exit-code" => Exit::Exited(status),
            other => Exit::Failed(format!("the unit ended with result {other}")),
        }))
    }
}

impl Runtime for Units {
    fn start<'a>(&'a self, l: &'a Launch) -> BoxFuture<'a, Result<Started>> {
        Box::pin(async move {
            let name = unit_name(&l.worker);
            let mut props = properties(l, self.stop_timeout, self.defaults)?;
            // A shared worker: its slice first, limits on the slice, then
            // the unit inside it; its command never runs unlimited.
            let mut enforcement = None;
            if l.hold.is_some() {
                let slice = slice_name(&l.worker);
                let cgroup = self.slice(&slice, &l.worker).await?;
                enforcement = super::hold(l, Some(cgroup)).await;
                let v = OwnedVariant::try_from(Variant::from(slice)).expect("a string converts");
                props.push(("Slice", v));
            }
            let aux: Vec<(String, Vec<(String, OwnedVariant)>)> = Vec::new();
            let started = self
                .manager("StartTransientUnit", &(name.as_str(), "fail", props, aux))
                .await;
            if let Err(e) = started {
                // Its slice goes with it (and the limits on it).
                if l.hold.is_some() {
                    let slice = slice_name(&l.worker);
                    let _ = self.manager("StopUnit", &(slice.as_str(), "replace")).await;
                }
                return Err(backend("StartTransientUnit", e));
            }
            Ok(Started {
                enforcement,
                ..Started::id(name)
            })
        })
    }

    fn wait<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Exit> {
        Box::pin(async move {
            let _ = self.manager("Subscribe", &()).await;
            let path: OwnedObjectPath = match self.manager("GetUnit", &(id,)).await {
                Ok(m) => match m.body().deserialize() {
                    Ok(p) => p,
                    Err(e) => return Exit::Failed(format!("systemd GetUnit: {e}")),
                },
                // Already gone: it finished and was collected.
                Err(e) if no_such_unit(&e) => return Exit::Exited(0),
                Err(e) => return Exit::Failed(format!("systemd GetUnit: {e}")),
            };
            let rule = zbus::MatchRule::builder()
                .msg_type(zbus::message::Type::Signal)
                .interface("org.freedesktop.DBus.Properties")
                .member("PropertiesChanged")
                .path(path.clone())
                .build();
            let mut changes = match rule {
                Ok(rule) => zbus::MessageStream::for_match_rule(rule, &self.conn, None)
                    .await
                    .ok(),
                Err(_) => None,
            };
            loop {
                match self.ended(&path).await {
                    Ok(Some(exit)) => return exit,
                    Ok(None) => {}
                    // Collected between two signals: it ended cleanly.
                    Err(e) if matches!(&e, zbus::Error::MethodError(..) | zbus::Error::FDO(_)) => {
                        return Exit::Exited(0)
                    }
                    // The bus connection lost (dbus restarted): whether the
                    // unit ended is unknown; the daemon stops on it, and the
                    // next run adopts the unit as it finds it.
                    Err(zbus::Error::InputOutput(_)) => std::future::pending::<()>().await,
                    Err(e) => return Exit::Failed(format!("systemd: {e}")),
                }
                // Wake on the unit's next change; a slow re-check only guards
                // against a signal lost between subscribing and reading.
                match changes.as_mut() {
                    Some(s) => {
                        let _ = tokio::time::timeout(Duration::from_secs(30), s.next()).await;
                    }
                    None => tokio::time::sleep(Duration::from_secs(5)).await,
                }
            }
        })
    }

    fn stop<'a>(&'a self, id: &'a str, _timeout: Duration) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            match self.manager("StopUnit", &(id, "replace")).await {
                Ok(_) => Ok(()),
                Err(e) if no_such_unit(&e) => Ok(()),
                Err(e) => Err(backend("StopUnit", e)),
            }
        })
    }

    fn remove<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            // A failed unit stays listed until reset; a clean one is collected by itself.
            let _ = self.manager("ResetFailedUnit", &(id,)).await;
            // Its slice, if it had one: the group goes, and its limits with it.
            if let Some(slice) = slice_of(id) {
                let _ = self.manager("StopUnit", &(slice.as_str(), "replace")).await;
            }
            Ok(())
        })
    }

    /// Its slice's group where it has one (the group its limits are on),
    /// else the unit's own.
    fn cgroup<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Option<String>> {
        Box::pin(async move {
            if let Some(slice) = slice_of(id) {
                if let Some(cg) = self.control_group(&slice, "Slice").await {
                    return Some(cg);
                }
            }
            self.control_group(id, "Service").await
        })
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<Found>>> {
        Box::pin(async move {
            type Row = (
                String,
                String,
                String,
                String,
                String,
                String,
                OwnedObjectPath,
                u32,
                String,
                OwnedObjectPath,
            );
            let m = self
                .manager(
                    "ListUnitsByPatterns",
                    &(Vec::<String>::new(), vec![format!("{PREFIX}*.service")]),
                )
                .await
                .map_err(|e| backend("ListUnitsByPatterns", e))?;
            let rows: Vec<Row> = m
                .body()
                .deserialize()
                .map_err(|e| backend("ListUnitsByPatterns", e))?;
            Ok(rows
                .into_iter()
                .filter_map(|r| {
                    let worker =
                        r.0.strip_prefix(PREFIX)?
                            .strip_suffix(".service")?
                            .to_string();
                    let running = matches!(
                        r.3.as_str(),
                        "active" | "activating" | "reloading" | "deactivating"
                    );
                    Some(Found {
                        worker,
                        id: r.0.clone(),
                        running,
                        exit_code: (!running).then_some(0),
                        ended_ms: None,
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

    fn launch(user: Option<u32>) -> Launch {
        Launch {
            worker: "job".into(),
            run: Run::Unit {
                exec: vec![
                    "/usr/bin/whisper-server".into(),
                    "--port".into(),
                    "9000".into(),
                ],
                env: [("K".to_string(), "V".to_string())].into(),
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

    fn get<'a>(props: &'a [(&str, OwnedVariant)], key: &str) -> Option<&'a OwnedVariant> {
        props.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    #[test]
    fn a_workers_slice_never_nests_in_anothers() {
        assert_eq!(slice_name("job"), "astraeus-worker-job.slice");
        // `astraeus-worker-a-b.slice` would be a child of worker a's slice.
        assert_eq!(slice_name("a-b"), "astraeus-worker-a\\x2db.slice");
        assert_eq!(
            slice_of("astraeus-worker-a-b.service").as_deref(),
            Some("astraeus-worker-a\\x2db.slice")
        );
        assert_eq!(slice_of("other.service"), None);
    }

    #[test]
    fn a_non_root_owners_unit_runs_as_that_user_with_its_environment_and_limits() {
        let p = properties(
            &launch(Some(1000)),
            Duration::from_secs(10),
            Defaults::default(),
        )
        .unwrap();
        assert_eq!(
            String::try_from(get(&p, "User").unwrap().clone()).unwrap(),
            "1000"
        );
        let env = Vec::<String>::try_from(get(&p, "Environment").unwrap().clone()).unwrap();
        assert!(env.contains(&"ASTRAEUS_GPU_MEMORY_GB=2.5".to_string()));
        assert!(env.contains(&"CUDA_VISIBLE_DEVICES=GPU-a,GPU-b".to_string()));
        assert!(env.contains(&"NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b".to_string()));
        assert!(env.contains(&"K=V".to_string()));
        assert_eq!(
            u64::try_from(get(&p, "CPUQuotaPerSecUSec").unwrap().clone()).unwrap(),
            1_500_000
        );
        assert_eq!(
            u64::try_from(get(&p, "MemoryMax").unwrap().clone()).unwrap(),
            1 << 30
        );
        assert_eq!(
            u64::try_from(get(&p, "TimeoutStopUSec").unwrap().clone()).unwrap(),
            10_000_000
        );
        assert!(bool::try_from(get(&p, "NoNewPrivileges").unwrap().clone()).unwrap());
        // Root's units run as root: no User=.
        let p = properties(
            &launch(Some(0)),
            Duration::from_secs(10),
            Defaults::default(),
        )
        .unwrap();
        assert!(get(&p, "User").is_none());
        // A request without limits gets the configured caps, or none.
        let mut bare = launch(Some(1000));
        bare.cpu_cores = Amount::ZERO;
        bare.memory_bytes = 0;
        let p = properties(&bare, Duration::from_secs(10), Defaults::default()).unwrap();
        assert!(get(&p, "CPUQuotaPerSecUSec").is_none() && get(&p, "MemoryMax").is_none());
        let caps = Defaults {
            cpu_cores: Amount::whole(2),
            memory_bytes: 4 << 30,
        };
        let p = properties(&bare, Duration::from_secs(10), caps).unwrap();
        assert_eq!(
            u64::try_from(get(&p, "CPUQuotaPerSecUSec").unwrap().clone()).unwrap(),
            2_000_000
        );
        assert_eq!(
            u64::try_from(get(&p, "MemoryMax").unwrap().clone()).unwrap(),
            4 << 30
        );
        // The request's own limits win over the caps.
        let p = properties(&launch(Some(1000)), Duration::from_secs(10), caps).unwrap();
        assert_eq!(
            u64::try_from(get(&p, "MemoryMax").unwrap().clone()).unwrap(),
            1 << 30
        );
    }
}
