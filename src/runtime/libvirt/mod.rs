//! VM workers and template VMs through libvirt, which runs in a helper
//! process: `astraeus-libvirt` (src/bin/astraeus-libvirt.rs, [`direct`]) links
//! libvirt and does each call; this side asks it over a pipe ([`wire`]) and
//! links nothing of libvirt. The helper starts on the first VM or template
//! call, so a host that only shares GPUs by memory never maps libvirt and
//! need not have it installed; where it is missing, that call fails saying
//! what to install.
//!
//! A worker's VM is a transient domain named `astraeus-<worker>`, made from
//! the submitted domain XML or from an existing (shut off) domain's
//! definition, with its GPUs as PCI hostdevs and its GPU memory in SMBIOS OEM
//! strings (domain_xml.rs). Being transient, it leaves nothing behind once it
//! stops. Lifecycle events of every domain come from the helper and are
//! broadcast on [`events`] (the VM runtime here; the time-slicer shares it).

pub mod direct;
pub mod wire;

use super::{BoxFuture, Exit, Found, Launch, Runtime, Started};
use crate::domain_xml::PciAddress;
use crate::error::{Error, Result};
use crate::request::Run;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::ChildStdin;
use tokio::sync::{broadcast, oneshot};
// libvirt's event numbers only: constants, so nothing of libvirt is linked.
use virt::sys;
pub use wire::Lifecycle;
use wire::{Call, Out, Request};

/// Not a libvirt event number: the connection closed (libvirtd or the
/// helper went away), so waiters look again.
pub const CONNECTION_CLOSED: u32 = u32::MAX;

/// Where the packages install the helper. A daemon looks first beside its
/// own binary (a build tree), then here.
pub const HELPER_INSTALLED: &str = "/usr/libexec/astraeusd/astraeus-libvirt";
const HELPER_NAME: &str = "astraeus-libvirt";

pub use crate::workload::VmEvent;

impl Lifecycle {
    pub fn stopped(&self) -> bool {
        self.event == sys::VIR_DOMAIN_EVENT_STOPPED
    }

    /// What kind of event it is.
    pub fn kind(&self) -> VmEvent {
        match self.event {
            sys::VIR_DOMAIN_EVENT_STARTED => VmEvent::Started,
            sys::VIR_DOMAIN_EVENT_STOPPED => VmEvent::Stopped,
            _ => VmEvent::Other,
        }
    }

    /// How a STOPPED event ends a worker, in libvirt's own terms.
    pub fn exit(&self) -> Exit {
        match self.detail {
            sys::VIR_DOMAIN_EVENT_STOPPED_SHUTDOWN => Exit::Exited(0),
            sys::VIR_DOMAIN_EVENT_STOPPED_DESTROYED => {
                Exit::Failed("the domain was destroyed (forced off)".into())
            }
            sys::VIR_DOMAIN_EVENT_STOPPED_CRASHED => Exit::Failed("the guest crashed".into()),
            sys::VIR_DOMAIN_EVENT_STOPPED_FAILED => {
                Exit::Failed("the hypervisor failed to run the domain".into())
            }
            other => Exit::Failed(format!("the domain stopped (libvirt detail {other})")),
        }
    }
}

/// The broadcast every lifecycle event the helper reports goes to.
pub fn events() -> &'static broadcast::Sender<Lifecycle> {
    static EVENTS: OnceLock<broadcast::Sender<Lifecycle>> = OnceLock::new();
    EVENTS.get_or_init(|| broadcast::channel(1024).0)
}

/// The VM runtime and the template VMs' hypervisor.
pub struct Libvirt {
    uri: String,
    helper_path: Option<PathBuf>,
    /// Started on first use; started again after it ended.
    helper: tokio::sync::Mutex<Option<Arc<Helper>>>,
    next_id: AtomicU64,
}

/// A running helper: where calls are written and who waits for which reply.
struct Helper {
    stdin: tokio::sync::Mutex<ChildStdin>,
    pending: Arc<Mutex<HashMap<u64, oneshot::Sender<Result<Value>>>>>,
    ended: Arc<AtomicBool>,
}

/// What a host without libvirt is told.
fn unavailable(why: &str) -> Error {
    Error::Backend(format!(
        "libvirt is not available here ({}): VM workers and templates need libvirt's \
         client library — install libvirt0 (Debian, Ubuntu) or libvirt-libs (Fedora, RHEL)",
        crate::text::printable(why.trim())
    ))
}

impl Libvirt {
    /// The helper found beside this program, else where the packages put it.
    pub fn new(uri: &str) -> Libvirt {
        Libvirt {
            uri: uri.to_string(),
            helper_path: None,
            helper: tokio::sync::Mutex::new(None),
            next_id: AtomicU64::new(1),
        }
    }

    /// With the helper at `path` (tests, which run from elsewhere).
    pub fn with_helper(uri: &str, path: impl Into<PathBuf>) -> Libvirt {
        Libvirt {
            helper_path: Some(path.into()),
            ..Libvirt::new(uri)
        }
    }

    fn helper_path(&self) -> PathBuf {
        if let Some(p) = &self.helper_path {
            return p.clone();
        }
        std::env::current_exe()
            .ok()
            .and_then(|exe| Some(exe.parent()?.join(HELPER_NAME)))
            .filter(|p| p.is_file())
            .unwrap_or_else(|| PathBuf::from(HELPER_INSTALLED))
    }

    async fn helper(&self) -> Result<Arc<Helper>> {
        let mut slot = self.helper.lock().await;
        if let Some(h) = slot.as_ref() {
            if !h.ended.load(Ordering::SeqCst) {
                return Ok(h.clone());
            }
        }
        let h = Arc::new(self.start_helper().await?);
        *slot = Some(h.clone());
        Ok(h)
    }

    async fn start_helper(&self) -> Result<Helper> {
        let path = self.helper_path();
        let mut child = tokio::process::Command::new(&path)
            .arg(&self.uri)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| unavailable(&format!("its helper {}: {e}", path.display())))?;
        let (Some(stdin), Some(stdout), Some(mut stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(Error::Backend("libvirt's helper has no pipes".into()));
        };
        let mut lines = BufReader::new(stdout).lines();
        // It says ready once libvirt is loaded and its event loop runs; a
        // missing libvirt.so ends it before, in the dynamic loader's words.
        let first = lines.next_line().await.ok().flatten();
        if !matches!(
            first.as_deref().map(serde_json::from_str),
            Some(Ok(Out::Ready))
        ) {
            let mut said = String::new();
            let _ = tokio::time::timeout(Duration::from_secs(5), stderr.read_to_string(&mut said))
                .await;
            let _ = child.start_kill();
            let why = said
                .lines()
                .next()
                .unwrap_or("its helper ended at once")
                .to_string();
            return Err(unavailable(&why));
        }
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                tracing::warn!("libvirt: {}", crate::text::printable(&line));
            }
        });
        let pending: Arc<Mutex<HashMap<u64, oneshot::Sender<Result<Value>>>>> = Arc::default();
        let ended = Arc::new(AtomicBool::new(false));
        let (waiting, gone) = (pending.clone(), ended.clone());
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                match serde_json::from_str::<Out>(&line) {
                    Ok(Out::Reply { id, ok, err }) => {
                        let answer = match err {
                            Some(e) => Err(Error::from(e)),
                            None => Ok(ok.unwrap_or(Value::Null)),
                        };
                        let caller = lock(&waiting).remove(&id);
                        if let Some(caller) = caller {
                            let _ = caller.send(answer);
                        }
                    }
                    Ok(Out::Event(ev)) => {
                        let _ = events().send(ev);
                    }
                    Ok(Out::Ready) => {}
                    Err(e) => tracing::warn!("libvirt's helper said something unreadable: {e}"),
                }
            }
            // Its callers get an error; waiters look again on a new helper.
            gone.store(true, Ordering::SeqCst);
            lock(&waiting).clear();
            let _ = events().send(Lifecycle {
                domain: String::new(),
                event: CONNECTION_CLOSED,
                detail: 0,
            });
            let status = child.wait().await;
            tracing::warn!("libvirt's helper ended ({status:?}); the next call starts it again");
        });
        Ok(Helper {
            stdin: tokio::sync::Mutex::new(stdin),
            pending,
            ended,
        })
    }

    /// One call to libvirt, in the helper; its answer as `T`.
    async fn call<T: DeserializeOwned>(&self, request: Request) -> Result<T> {
        let what = request.what();
        let helper = crate::deadline::within(
            crate::deadline::LIBVIRT,
            "libvirt's helper",
            "its start",
            self.helper(),
        )
        .await?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        lock(&helper.pending).insert(id, tx);
        // Ended after its callers were cleared: this one would wait for ever.
        if helper.ended.load(Ordering::SeqCst) {
            lock(&helper.pending).remove(&id);
            return Err(Error::Backend("libvirt's helper ended; try again".into()));
        }
        let mut line = serde_json::to_vec(&Call { id, request })
            .map_err(|e| Error::Backend(format!("libvirt call: {e}")))?;
        line.push(b'\n');
        if let Err(e) = helper.stdin.lock().await.write_all(&line).await {
            lock(&helper.pending).remove(&id);
            helper.ended.store(true, Ordering::SeqCst);
            return Err(Error::Backend(format!("libvirt's helper is gone: {e}")));
        }
        let answered = async {
            rx.await
                .map_err(|_| Error::Backend("libvirt's helper ended before it answered".into()))?
        };
        let value = crate::deadline::within(crate::deadline::LIBVIRT, "libvirt", &what, answered)
            .await
            .inspect_err(|_| drop(lock(&helper.pending).remove(&id)))?;
        serde_json::from_value(value)
            .map_err(|e| Error::Backend(format!("libvirt's helper answered oddly: {e}")))
    }

    /// Whether the domain is running now; false when it is gone.
    async fn active(&self, name: &str) -> Result<bool> {
        self.call(Request::Active { name: name.into() }).await
    }

    /// Resolves with the domain's STOPPED event, or soon when it is not
    /// running. Subscribes when called, not when first polled, so a stop
    /// caused between the call and the first poll (stop's shutdown) is seen.
    fn stopped<'a>(
        &'a self,
        name: &'a str,
    ) -> impl std::future::Future<Output = Result<Lifecycle>> + 'a {
        let rx = events().subscribe();
        self.stopped_after(rx, name)
    }

    async fn stopped_after(
        &self,
        mut rx: broadcast::Receiver<Lifecycle>,
        name: &str,
    ) -> Result<Lifecycle> {
        let gone = Lifecycle {
            domain: name.to_string(),
            event: sys::VIR_DOMAIN_EVENT_STOPPED,
            detail: u32::MAX,
        };
        if !self.active(name).await? {
            return Ok(last_word(&mut rx, name).await.unwrap_or(gone));
        }
        loop {
            match rx.recv().await {
                Ok(ev) if ev.domain == name && ev.stopped() => return Ok(ev),
                Ok(ev) if ev.event != CONNECTION_CLOSED => {}
                // Events may have been missed: look again (on a new connection).
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {
                    if !self.active(name).await? {
                        return Ok(last_word(&mut rx, name).await.unwrap_or(gone));
                    }
                }
                Err(broadcast::error::RecvError::Closed) => return Ok(gone),
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// How long a domain found stopped may take for its STOPPED event to arrive:
/// libvirtd can answer "not active" before the event reaches us.
const LAST_WORD_GRACE: Duration = Duration::from_secs(2);

/// The STOPPED event of a domain already found not running, when the
/// subscription holds it or it arrives within [`LAST_WORD_GRACE`]; None when
/// it never comes (the domain stopped before we subscribed, or libvirt lost it).
async fn last_word(rx: &mut broadcast::Receiver<Lifecycle>, name: &str) -> Option<Lifecycle> {
    let wait = async {
        loop {
            match rx.recv().await {
                Ok(ev) if ev.domain == name && ev.stopped() => return Some(ev),
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    };
    tokio::time::timeout(LAST_WORD_GRACE, wait)
        .await
        .ok()
        .flatten()
}

impl Runtime for Libvirt {
    fn start<'a>(&'a self, launch: &'a Launch) -> BoxFuture<'a, Result<Started>> {
        Box::pin(async move {
            let Run::Vm(source) = &launch.run else {
                return Err(Error::field("run", "the VM runtime runs only vm workers"));
            };
            let mut gpus = Vec::new();
            for (uuid, pci) in launch.gpu_uuids.iter().zip(&launch.gpu_pci) {
                // Its PCI device is its parent GPU, whole: passing that
                // through would take every instance of it.
                if uuid.starts_with("MIG-") {
                    return Err(Error::field(
                        "gpu_requests",
                        format!(
                            "GPU {uuid} is a MIG instance: a VM takes whole PCI devices, \
                             and its device is the GPU it is part of; ask for a whole GPU \
                             not in MIG mode"
                        ),
                    ));
                }
                gpus.push(PciAddress::parse(pci).ok_or_else(|| {
                    Error::Backend(format!(
                        "GPU {uuid} has no PCI address ({pci:?}) to pass through"
                    ))
                })?);
            }
            let request = Request::Create {
                source: source.clone(),
                worker: launch.worker.clone(),
                gpus,
                gpu_memory_gb: launch.gpu_memory_gb.clone().unwrap_or_else(|| "0".into()),
            };
            crate::failpoint::hit("libvirt.before-create");
            let name: String = self.call(request).await?;
            crate::failpoint::hit("libvirt.after-create");
            Ok(Started::id(name))
        })
    }

    fn wait<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Exit> {
        Box::pin(async move {
            loop {
                match self.stopped(id).await {
                    Ok(ev) if ev.detail == u32::MAX => {
                        return Exit::Failed(
                            "the domain stopped while its events could not be seen \
                             (libvirt was out of reach)"
                                .into(),
                        )
                    }
                    Ok(ev) => return ev.exit(),
                    // libvirtd away: keep waiting for it rather than end a VM that may run on.
                    Err(e) => {
                        tracing::warn!("waiting for domain {id}: {e}");
                        tokio::time::sleep(Duration::from_secs(2)).await;
                    }
                }
            }
        })
    }

    fn stop<'a>(&'a self, id: &'a str, timeout: Duration) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let mut done = Box::pin(self.stopped(id));
            let asked: Result<()> = self.call(Request::Shutdown { name: id.into() }).await;
            // Seen stopped, not merely "libvirt failed while we looked".
            if asked.is_ok() && matches!(tokio::time::timeout(timeout, &mut done).await, Ok(Ok(_)))
            {
                return Ok(());
            }
            // ACPI ignored (or refused), or its end not seen: force it off.
            self.call(Request::Destroy { name: id.into() }).await
        })
    }

    fn remove<'a>(&'a self, _id: &'a str) -> BoxFuture<'a, Result<()>> {
        // Transient: libvirt forgets the domain when it stops.
        Box::pin(async { Ok(()) })
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<Found>>> {
        Box::pin(async move {
            let found: Vec<(String, String)> = self.call(Request::ListWorkers).await?;
            Ok(found
                .into_iter()
                .map(|(worker, id)| Found {
                    worker,
                    id,
                    running: true,
                    exit_code: None,
                    ended_ms: None,
                })
                .collect())
        })
    }
}

/// Template VMs (time-slicing): persistent domains started and stopped in
/// turn. Results come back as values, the VMs' changes as lifecycle events
/// on [`events`].
impl Libvirt {
    /// Defines a template's VM from its XML (kept across power cycles);
    /// returns the domain's name.
    pub async fn define(&self, xml: String) -> Result<String> {
        self.call(Request::Define { xml }).await
    }

    /// The inactive definition of an existing domain.
    pub async fn definition(&self, name: &str) -> Result<String> {
        self.call(Request::Definition { name: name.into() }).await
    }

    /// Whether the domain is running (or paused) now.
    pub async fn is_on(&self, name: &str) -> Result<bool> {
        self.active(name).await
    }

    /// virDomainCreate: boots the powered-off VM (the seed's resume).
    pub async fn power_on(&self, name: &str) -> Result<()> {
        // Tests make a start fail here (the test driver starts anything).
        if crate::failpoint::fails("libvirt.power-on") {
            return Err(Error::Backend(format!(
                "domain {name} did not start: failpoint libvirt.power-on"
            )));
        }
        self.call(Request::PowerOn { name: name.into() }).await
    }

    /// virDomainShutdown (ACPI), or virDomainDestroy when `hard`.
    pub async fn power_off(&self, name: &str, hard: bool) -> Result<()> {
        let name = name.into();
        self.call(Request::PowerOff { name, hard }).await
    }

    /// The domain's CPU time so far (ns) and its vCPUs, for its CPU use.
    pub async fn cpu_time(&self, name: &str) -> Result<(u64, u32)> {
        self.call(Request::CpuTime { name: name.into() }).await
    }

    /// The running guest's IP addresses, IPv4 first: from libvirt's DHCP
    /// leases, then the guest agent, then the host's ARP table (the first
    /// source that knows any).
    pub async fn guest_addresses(&self, name: &str) -> Result<Vec<std::net::IpAddr>> {
        self.call(Request::GuestAddresses { name: name.into() })
            .await
    }

    /// Whether the guest agent answers: virDomainGetTime goes to the agent
    /// (guest-get-time) and fails when none runs or it does not answer;
    /// then libvirt's words say why. (The test driver answers it itself.)
    pub async fn agent_answers(&self, name: &str) -> Result<std::result::Result<(), String>> {
        let why: Option<String> = self
            .call(Request::AgentAnswers { name: name.into() })
            .await?;
        Ok(why.map_or(Ok(()), Err))
    }

    /// The host side of the running domain's virtio channel named `target`
    /// (a unix socket path), from its live XML.
    pub async fn channel_path(&self, name: &str, target: &str) -> Result<Option<String>> {
        let (name, target) = (name.into(), target.into());
        self.call(Request::ChannelPath { name, target }).await
    }

    /// Active domains whose XML passes any of `devices` through (release
    /// is confirmed when this is empty).
    pub async fn holders(&self, devices: Vec<PciAddress>) -> Result<Vec<String>> {
        self.call(Request::Holders { devices }).await
    }
}
