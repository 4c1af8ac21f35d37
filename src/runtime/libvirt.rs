//! VM workers through libvirt (the virt crate). A worker's VM is a transient
//! domain named `astraeus-<worker>`, made from the submitted domain XML or
//! from an existing (shut off) domain's definition, with its GPUs as PCI
//! hostdevs and its GPU memory in SMBIOS OEM strings (domain_xml.rs). Being
//! transient, it leaves nothing behind once it stops.
//!
//! This module owns libvirt's process-wide event loop: one thread runs it,
//! and lifecycle events of every connection are broadcast to whoever waits
//! (the VM runtime here; the time-slicer shares it). libvirt's calls block, so
//! each runs on tokio's blocking pool.

use super::{BoxFuture, Exit, Found, Launch, Runtime};
use crate::domain_xml::{self, PciAddress};
use crate::error::{Error, Result};
use crate::request::{Run, VmSource};
use std::ffi::CStr;
use std::os::raw::{c_int, c_void};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::sync::broadcast;
use virt::connect::Connect;
use virt::domain::Domain;
use virt::sys;

/// One lifecycle event: which domain, and libvirt's event and detail numbers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lifecycle {
    pub domain: String,
    pub event: u32,
    pub detail: u32,
}

/// Not a libvirt event number: the connection closed (libvirtd went away).
pub const CONNECTION_CLOSED: u32 = u32::MAX;

impl Lifecycle {
    pub fn stopped(&self) -> bool {
        self.event == sys::VIR_DOMAIN_EVENT_STOPPED
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

/// The broadcast every lifecycle event goes to; starts the event loop once.
pub fn events() -> &'static broadcast::Sender<Lifecycle> {
    static EVENTS: OnceLock<broadcast::Sender<Lifecycle>> = OnceLock::new();
    EVENTS.get_or_init(|| {
        // Errors come back as values; libvirt's default handler would also print them.
        virt::error::clear_error_callback();
        // Must precede every Connect::open, or connections get no events.
        if let Err(e) = virt::event::event_register_default_impl() {
            tracing::error!("libvirt's event loop cannot start: {e}");
        }
        std::thread::Builder::new()
            .name("libvirt-events".into())
            .spawn(|| loop {
                if virt::event::event_run_default_impl().is_err() {
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
            .expect("spawning the libvirt event thread");
        broadcast::channel(1024).0
    })
}

unsafe extern "C" fn on_lifecycle(
    _conn: sys::virConnectPtr,
    dom: sys::virDomainPtr,
    event: c_int,
    detail: c_int,
    _opaque: *mut c_void,
) -> c_int {
    // SAFETY: libvirt passes a valid domain for the duration of the call; the
    // name belongs to the domain and is copied here.
    let name = unsafe {
        let p = sys::virDomainGetName(dom);
        if p.is_null() {
            return 0;
        }
        CStr::from_ptr(p).to_string_lossy().into_owned()
    };
    let _ = events().send(Lifecycle {
        domain: name,
        event: event as u32,
        detail: detail as u32,
    });
    0
}

unsafe extern "C" fn on_close(_conn: sys::virConnectPtr, reason: c_int, _opaque: *mut c_void) {
    // Waiters re-check their domains on a fresh connection.
    let _ = events().send(Lifecycle {
        domain: String::new(),
        event: CONNECTION_CLOSED,
        detail: reason as u32,
    });
}

type LifecycleCallback =
    unsafe extern "C" fn(sys::virConnectPtr, sys::virDomainPtr, c_int, c_int, *mut c_void) -> c_int;

/// Opens a connection whose lifecycle events reach [`events`].
pub fn open(uri: &str) -> Result<Connect> {
    events();
    let conn = Connect::open(Some(uri))
        .map_err(|e| Error::Backend(format!("libvirt at {uri}: {}", e.message())))?;
    // SAFETY: the callback has the signature libvirt calls lifecycle callbacks
    // with (libvirt's API takes it as the generic type, to be cast back);
    // it keeps no pointer beyond the call and has no opaque data to free.
    let id = unsafe {
        let cb: LifecycleCallback = on_lifecycle;
        sys::virConnectDomainEventRegisterAny(
            conn.as_ptr(),
            std::ptr::null_mut(),
            sys::VIR_DOMAIN_EVENT_ID_LIFECYCLE as c_int,
            Some(std::mem::transmute::<
                LifecycleCallback,
                unsafe extern "C" fn(sys::virConnectPtr, sys::virDomainPtr, *mut c_void),
            >(cb)),
            std::ptr::null_mut(),
            None,
        )
    };
    if id < 0 {
        return Err(Error::Backend(format!(
            "libvirt at {uri}: cannot watch domain events: {}",
            virt::error::Error::last_error().message()
        )));
    }
    // SAFETY: as above; the callback keeps nothing and has no opaque data.
    unsafe {
        sys::virConnectRegisterCloseCallback(
            conn.as_ptr(),
            Some(on_close),
            std::ptr::null_mut(),
            None,
        );
    }
    Ok(conn)
}

/// libvirt's error, as a backend error naming the URI.
fn backend(uri: &str, e: virt::error::Error) -> Error {
    Error::Backend(format!("libvirt at {uri}: {}", e.message()))
}

/// The domain named `name`; libvirt's error names the domain.
/// A domain by name; NotFound when libvirt has no such domain (so callers
/// can tell "gone" from "libvirt failed").
fn lookup(c: &Connect, uri: &str, name: &str) -> Result<Domain> {
    c.lookup_domain_by_name(name).map_err(|e| {
        let text = format!("libvirt at {uri}: domain {name}: {}", e.message());
        match e.code() {
            virt::enumutil::Enum::Known(virt::error::ErrorNumber::NoDomain) => {
                Error::NotFound(text)
            }
            _ => Error::Backend(text),
        }
    })
}

/// The VM runtime.
pub struct Libvirt {
    uri: String,
    /// Opened on first use (a host without libvirt still runs the daemon) and
    /// reopened when libvirtd went away underneath it. Opened on the blocking
    /// pool like every call: opening can hang as long as libvirtd does.
    conn: Arc<Mutex<Option<Arc<Connect>>>>,
}

impl Libvirt {
    pub fn new(uri: &str) -> Libvirt {
        Libvirt {
            uri: uri.to_string(),
            conn: Arc::new(Mutex::new(None)),
        }
    }

    fn conn(slot: &Mutex<Option<Arc<Connect>>>, uri: &str) -> Result<Arc<Connect>> {
        let mut slot = slot.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = slot.as_ref() {
            if c.is_alive().unwrap_or(false) {
                return Ok(c.clone());
            }
            tracing::warn!("libvirt at {uri} went away; reconnecting");
        }
        let c = Arc::new(open(uri)?);
        if let Some(old) = slot.replace(c.clone()) {
            // Never dropped: the virt crate panics when closing a connection
            // fails, which a dead one may. Reconnects are rare; the leak is small.
            std::mem::forget(old);
        }
        Ok(c)
    }

    /// Runs a blocking libvirt call (and the connect before it) on tokio's
    /// blocking pool: no async worker thread ever waits on libvirtd.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connect, &str) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let (slot, uri) = (self.conn.clone(), self.uri.clone());
        tokio::task::spawn_blocking(move || {
            let conn = Libvirt::conn(&slot, &uri)?;
            f(&conn, &uri)
        })
        .await
        .map_err(|e| Error::Backend(format!("libvirt call panicked: {e}")))?
    }

    /// Whether the domain is running now; false when it is gone.
    async fn active(&self, name: &str) -> Result<bool> {
        let name = name.to_string();
        self.blocking(move |c, _| {
            Ok(c.lookup_domain_by_name(&name)
                .ok()
                .and_then(|d| d.is_active().ok())
                .unwrap_or(false))
        })
        .await
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

/// How long a domain found stopped may take for its STOPPED event to arrive:
/// libvirtd can answer "not active" before the event reaches our event thread.
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
    fn start<'a>(&'a self, launch: &'a Launch) -> BoxFuture<'a, Result<String>> {
        Box::pin(async move {
            let Run::Vm(source) = &launch.run else {
                return Err(Error::field("run", "the VM runtime runs only vm workers"));
            };
            let mut gpus = Vec::new();
            for (uuid, pci) in launch.gpu_uuids.iter().zip(&launch.gpu_pci) {
                gpus.push(PciAddress::parse(pci).ok_or_else(|| {
                    Error::Backend(format!(
                        "GPU {uuid} has no PCI address ({pci:?}) to pass through"
                    ))
                })?);
            }
            let source = source.clone();
            let worker = launch.worker.clone();
            let gb = launch.gpu_memory_gb.clone().unwrap_or_else(|| "0".into());
            self.blocking(move |c, uri| {
                let base = match &source {
                    VmSource::DomainXml(xml) => xml.clone(),
                    VmSource::Domain(name) => {
                        let d = c.lookup_domain_by_name(name).map_err(|_| {
                            Error::field(
                                "run.vm.domain",
                                format!("no domain named {name} in {uri}"),
                            )
                        })?;
                        if d.is_active().unwrap_or(false) {
                            return Err(Error::Conflict(format!(
                                "run.vm.domain: {name} is running; the worker runs its own copy \
                                 of it, on the same disks, so {name} must be shut off"
                            )));
                        }
                        d.xml_desc(sys::VIR_DOMAIN_XML_INACTIVE | sys::VIR_DOMAIN_XML_SECURE)
                            .map_err(|e| backend(uri, e))?
                    }
                };
                let xml = domain_xml::worker_domain(&base, &worker, &gpus, &gb)?;
                crate::failpoint::hit("libvirt.before-create");
                let d = c.create_domain_xml(&xml, 0).map_err(|e| backend(uri, e))?;
                crate::failpoint::hit("libvirt.after-create");
                d.name().map_err(|e| backend(uri, e))
            })
            .await
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
            let name = id.to_string();
            let mut done = Box::pin(self.stopped(id));
            let asked = self
                .blocking({
                    let name = name.clone();
                    move |c, uri| match c.lookup_domain_by_name(&name) {
                        Ok(d) => d.shutdown().map(|_| ()).map_err(|e| backend(uri, e)),
                        Err(_) => Ok(()), // already gone
                    }
                })
                .await;
            if asked.is_ok() && tokio::time::timeout(timeout, &mut done).await.is_ok() {
                return Ok(());
            }
            // ACPI ignored (or refused): force it off.
            self.blocking(move |c, uri| match c.lookup_domain_by_name(&name) {
                Ok(d) if d.is_active().unwrap_or(false) => {
                    d.destroy().map(|_| ()).map_err(|e| backend(uri, e))
                }
                _ => Ok(()),
            })
            .await
        })
    }

    fn remove<'a>(&'a self, _id: &'a str) -> BoxFuture<'a, Result<()>> {
        // Transient: libvirt forgets the domain when it stops.
        Box::pin(async { Ok(()) })
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<Found>>> {
        Box::pin(self.blocking(|c, uri| {
            let domains = c
                .list_all_domains(sys::VIR_CONNECT_LIST_DOMAINS_ACTIVE)
                .map_err(|e| backend(uri, e))?;
            Ok(domains
                .iter()
                .filter_map(|d| {
                    let worker = domain_xml::worker_of(&d.xml_desc(0).ok()?)?;
                    Some(Found {
                        worker,
                        id: d.name().ok()?,
                        running: true,
                        exit_code: None,
                        ended_ms: None,
                    })
                })
                .collect())
        }))
    }
}

/// Template VMs (time-slicing): persistent domains started and stopped in
/// turn. Each call runs on tokio's blocking pool; results come back as values,
/// the VMs' changes as lifecycle events on [`events`].
impl Libvirt {
    /// Defines a template's VM from its XML (kept across power cycles);
    /// returns the domain's name.
    pub async fn define(&self, xml: String) -> Result<String> {
        self.blocking(move |c, uri| {
            let d = c.define_domain_xml(&xml).map_err(|e| backend(uri, e))?;
            d.name().map_err(|e| backend(uri, e))
        })
        .await
    }

    /// The inactive definition of an existing domain.
    pub async fn definition(&self, name: &str) -> Result<String> {
        let name = name.to_string();
        self.blocking(move |c, uri| {
            let d = c.lookup_domain_by_name(&name).map_err(|_| {
                Error::field("vm.domain", format!("no domain named {name} in {uri}"))
            })?;
            d.xml_desc(sys::VIR_DOMAIN_XML_INACTIVE)
                .map_err(|e| backend(uri, e))
        })
        .await
    }

    /// Whether the domain is running (or paused) now.
    pub async fn is_on(&self, name: &str) -> Result<bool> {
        self.active(name).await
    }

    /// virDomainCreate: boots the powered-off VM (the seed's resume).
    pub async fn power_on(&self, name: &str) -> Result<()> {
        let name = name.to_string();
        self.blocking(move |c, uri| {
            let d = lookup(c, uri, &name)?;
            d.create().map(|_| ()).map_err(|e| backend(uri, e))
        })
        .await
    }

    /// virDomainShutdown (ACPI), or virDomainDestroy when `hard`.
    pub async fn power_off(&self, name: &str, hard: bool) -> Result<()> {
        let name = name.to_string();
        self.blocking(move |c, uri| match c.lookup_domain_by_name(&name) {
            Ok(d) if d.is_active().unwrap_or(false) => {
                let r = if hard {
                    d.destroy().map(|_| ())
                } else {
                    d.shutdown().map(|_| ())
                };
                r.map_err(|e| backend(uri, e))
            }
            _ => Ok(()),
        })
        .await
    }

    /// The domain's CPU time so far (ns) and its vCPUs, for its CPU use.
    pub async fn cpu_time(&self, name: &str) -> Result<(u64, u32)> {
        let name = name.to_string();
        self.blocking(move |c, uri| {
            let d = lookup(c, uri, &name)?;
            let i = d.info().map_err(|e| backend(uri, e))?;
            Ok((i.cpu_time, i.nr_virt_cpu.max(1)))
        })
        .await
    }

    /// The running guest's IP addresses, IPv4 first: from libvirt's DHCP
    /// leases, then the guest agent, then the host's ARP table (the first
    /// source that knows any).
    pub async fn guest_addresses(&self, name: &str) -> Result<Vec<std::net::IpAddr>> {
        let name = name.to_string();
        self.blocking(move |c, uri| {
            let d = lookup(c, uri, &name)?;
            for source in [
                sys::VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE,
                sys::VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT,
                sys::VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_ARP,
            ] {
                let Ok(interfaces) = d.interface_addresses(source, 0) else {
                    continue;
                };
                let mut found: Vec<std::net::IpAddr> = interfaces
                    .iter()
                    .flat_map(|i| i.addrs.iter())
                    .filter_map(|a| a.addr.parse().ok())
                    .filter(|a: &std::net::IpAddr| !a.is_loopback())
                    .collect();
                found.sort_by_key(|a| a.is_ipv6());
                if !found.is_empty() {
                    return Ok(found);
                }
            }
            Ok(Vec::new())
        })
        .await
    }

    /// Whether the guest agent answers: virDomainGetTime goes to the agent
    /// (guest-get-time) and fails when none runs or it does not answer;
    /// then libvirt's words say why. (The test driver answers it itself.)
    pub async fn agent_answers(&self, name: &str) -> Result<std::result::Result<(), String>> {
        let name = name.to_string();
        self.blocking(move |c, uri| {
            let d = lookup(c, uri, &name)?;
            let (mut seconds, mut nanos) = (0, 0);
            // SAFETY: the domain pointer is valid while `d` lives; libvirt
            // writes the two out-parameters and keeps no reference to them.
            let rc = unsafe { sys::virDomainGetTime(d.as_ptr(), &mut seconds, &mut nanos, 0) };
            if rc == 0 {
                Ok(Ok(()))
            } else {
                Ok(Err(virt::error::Error::last_error().message().to_string()))
            }
        })
        .await
    }

    /// The host side of the running domain's virtio channel named `target`
    /// (a unix socket path), from its live XML.
    pub async fn channel_path(&self, name: &str, target: &str) -> Result<Option<String>> {
        let (name, target) = (name.to_string(), target.to_string());
        self.blocking(move |c, uri| {
            let d = lookup(c, uri, &name)?;
            let xml = d.xml_desc(0).map_err(|e| backend(uri, e))?;
            Ok(domain_xml::channel_path(&xml, &target))
        })
        .await
    }

    /// Active domains whose XML passes any of `devices` through (release
    /// is confirmed when this is empty).
    pub async fn holders(&self, devices: Vec<PciAddress>) -> Result<Vec<String>> {
        self.blocking(move |c, uri| {
            let domains = c
                .list_all_domains(sys::VIR_CONNECT_LIST_DOMAINS_ACTIVE)
                .map_err(|e| backend(uri, e))?;
            Ok(domains
                .iter()
                .filter(|d| {
                    d.xml_desc(0)
                        .ok()
                        .is_some_and(|xml| domain_xml::passes_through(&xml, &devices))
                })
                .filter_map(|d| d.name().ok())
                .collect())
        })
        .await
    }
}
