//! libvirt itself, through the virt crate. Only the helper process
//! `astraeus-libvirt` (src/bin/astraeus-libvirt.rs) calls into this module, so
//! only the helper links libvirt: the daemon never maps it, and a host that
//! never runs a VM or template needs none of it installed.
//!
//! This module owns libvirt's process-wide event loop: one thread runs it,
//! and lifecycle events of every connection are broadcast (the helper sends
//! them on to the daemon). libvirt's calls block; the helper runs each on a
//! thread of its own.

use super::wire::{Lifecycle, Request};
use super::CONNECTION_CLOSED;
use crate::domain_xml::{self, PciAddress};
use crate::error::{Error, Result};
use crate::request::VmSource;
use serde_json::{json, Value};
use std::ffi::CStr;
use std::os::raw::{c_int, c_void};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::sync::broadcast;
use virt::connect::Connect;
use virt::domain::Domain;
use virt::sys;

/// The broadcast every lifecycle event goes to; starts the event loop once.
pub fn events() -> &'static broadcast::Sender<Lifecycle> {
    static EVENTS: OnceLock<broadcast::Sender<Lifecycle>> = OnceLock::new();
    EVENTS.get_or_init(|| {
        // Errors come back as values; libvirt's default handler would also print them.
        virt::error::clear_error_callback();
        // Must precede every Connect::open, or connections get no events.
        if let Err(e) = virt::event::event_register_default_impl() {
            eprintln!("libvirt's event loop cannot start: {e}");
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

/// A domain by name; NotFound when libvirt has no such domain (so callers
/// can tell "gone" from "libvirt failed"), libvirt's words either way.
fn lookup(c: &Connect, uri: &str, name: &str) -> Result<Domain> {
    c.lookup_domain_by_name(name)
        .map_err(|e| not_found_or_backend(uri, name, e))
}

fn not_found_or_backend(uri: &str, name: &str, e: virt::error::Error) -> Error {
    let text = format!("libvirt at {uri}: domain {name}: {}", e.message());
    match e.code() {
        virt::enumutil::Enum::Known(virt::error::ErrorNumber::NoDomain) => Error::NotFound(text),
        _ => Error::Backend(text),
    }
}

/// One libvirt URI: opened on first use and reopened when libvirtd went away
/// underneath it.
pub struct Connection {
    uri: String,
    slot: Mutex<Option<Arc<Connect>>>,
}

impl Connection {
    pub fn new(uri: &str) -> Connection {
        Connection {
            uri: uri.to_string(),
            slot: Mutex::new(None),
        }
    }

    fn conn(&self) -> Result<Arc<Connect>> {
        let uri = &self.uri;
        let mut slot = self.slot.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = slot.as_ref() {
            if c.is_alive().unwrap_or(false) {
                return Ok(c.clone());
            }
            eprintln!("libvirt at {uri} went away; reconnecting");
        }
        let c = Arc::new(open(uri)?);
        if let Some(old) = slot.replace(c.clone()) {
            // Never dropped: the virt crate panics when closing a connection
            // fails, which a dead one may. Reconnects are rare; the leak is small.
            std::mem::forget(old);
        }
        Ok(c)
    }

    /// Runs one request, blocking for as long as libvirt does; the answer as
    /// JSON, of the type its [`Request`] variant names.
    pub fn run(&self, request: Request) -> Result<Value> {
        let c = self.conn()?;
        let (c, uri) = (&*c, self.uri.as_str());
        Ok(match request {
            // Only "no such domain" (from either call: a transient domain
            // can end between them) means gone: libvirtd failing or going
            // away mid-call (it answers errors while it shuts down) is an
            // error, and the waiter asks again, rather than a running VM
            // taken for stopped.
            Request::Active { name } => {
                match lookup(c, uri, &name).and_then(|d| {
                    d.is_active()
                        .map_err(|e| not_found_or_backend(uri, &name, e))
                }) {
                    Ok(active) => json!(active),
                    Err(Error::NotFound(_)) => json!(false),
                    Err(e) => return Err(e),
                }
            }
            Request::Create {
                source,
                worker,
                gpus,
                gpu_memory_gb,
            } => json!(create(c, uri, &source, &worker, &gpus, &gpu_memory_gb)?),
            Request::Shutdown { name } => {
                if let Ok(d) = c.lookup_domain_by_name(&name) {
                    d.shutdown().map_err(|e| backend(uri, e))?;
                }
                Value::Null
            }
            Request::Destroy { name } => {
                match c.lookup_domain_by_name(&name) {
                    Ok(d) if d.is_active().unwrap_or(false) => {
                        d.destroy().map_err(|e| backend(uri, e))?;
                    }
                    _ => {}
                }
                Value::Null
            }
            Request::ListWorkers => {
                let domains = c
                    .list_all_domains(sys::VIR_CONNECT_LIST_DOMAINS_ACTIVE)
                    .map_err(|e| backend(uri, e))?;
                let found: Vec<(String, String)> = domains
                    .iter()
                    .filter_map(|d| {
                        Some((domain_xml::worker_of(&d.xml_desc(0).ok()?)?, d.name().ok()?))
                    })
                    .collect();
                json!(found)
            }
            Request::Define { xml } => {
                let d = c.define_domain_xml(&xml).map_err(|e| backend(uri, e))?;
                json!(d.name().map_err(|e| backend(uri, e))?)
            }
            Request::Definition { name } => {
                let d = c.lookup_domain_by_name(&name).map_err(|_| {
                    Error::field("vm.domain", format!("no domain named {name} in {uri}"))
                })?;
                json!(d
                    .xml_desc(sys::VIR_DOMAIN_XML_INACTIVE)
                    .map_err(|e| backend(uri, e))?)
            }
            Request::PowerOn { name } => {
                let d = lookup(c, uri, &name)?;
                d.create().map_err(|e| backend(uri, e))?;
                Value::Null
            }
            Request::PowerOff { name, hard } => {
                match c.lookup_domain_by_name(&name) {
                    Ok(d) if d.is_active().unwrap_or(false) => {
                        let r = if hard {
                            d.destroy().map(|_| ())
                        } else {
                            d.shutdown().map(|_| ())
                        };
                        r.map_err(|e| backend(uri, e))?;
                    }
                    _ => {}
                }
                Value::Null
            }
            Request::CpuTime { name } => {
                let d = lookup(c, uri, &name)?;
                let i = d.info().map_err(|e| backend(uri, e))?;
                json!((i.cpu_time, i.nr_virt_cpu.max(1)))
            }
            Request::GuestAddresses { name } => json!(guest_addresses(c, uri, &name)?),
            Request::AgentAnswers { name } => {
                let d = lookup(c, uri, &name)?;
                let (mut seconds, mut nanos) = (0, 0);
                // SAFETY: the domain pointer is valid while `d` lives; libvirt
                // writes the two out-parameters and keeps no reference to them.
                let rc = unsafe { sys::virDomainGetTime(d.as_ptr(), &mut seconds, &mut nanos, 0) };
                if rc == 0 {
                    Value::Null
                } else {
                    json!(virt::error::Error::last_error().message().to_string())
                }
            }
            Request::ChannelPath { name, target } => {
                let d = lookup(c, uri, &name)?;
                let xml = d.xml_desc(0).map_err(|e| backend(uri, e))?;
                json!(domain_xml::channel_path(&xml, &target))
            }
            Request::Holders { devices } => json!(holders(c, uri, &devices)?),
        })
    }
}

/// A worker's transient domain: the submitted XML, or a copy of an existing
/// (shut off) domain, with its GPUs as hostdevs and its memory as OEM strings.
fn create(
    c: &Connect,
    uri: &str,
    source: &VmSource,
    worker: &str,
    gpus: &[PciAddress],
    gb: &str,
) -> Result<String> {
    let base = match source {
        VmSource::DomainXml(xml) => xml.clone(),
        VmSource::Domain(name) => {
            let d = c.lookup_domain_by_name(name).map_err(|_| {
                Error::field("run.vm.domain", format!("no domain named {name} in {uri}"))
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
    let xml = domain_xml::worker_domain(&base, worker, gpus, gb)?;
    let d = c.create_domain_xml(&xml, 0).map_err(|e| backend(uri, e))?;
    d.name().map_err(|e| backend(uri, e))
}

/// The running guest's IP addresses, IPv4 first: from libvirt's DHCP leases,
/// then the guest agent, then the host's ARP table (the first source that
/// knows any).
fn guest_addresses(c: &Connect, uri: &str, name: &str) -> Result<Vec<std::net::IpAddr>> {
    let d = lookup(c, uri, name)?;
    let sources = [
        sys::VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE,
        sys::VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT,
        sys::VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_ARP,
    ];
    Ok(first_known(sources.into_iter().map(|source| {
        d.interface_addresses(source, 0).map(|interfaces| {
            interfaces
                .into_iter()
                .flat_map(|i| i.addrs)
                .map(|a| a.addr)
                .collect()
        })
    })))
}

/// The addresses the first source that knows any gives (sources are asked
/// in order, lazily: one that answers spares the rest), IPv4 before IPv6,
/// loopback never. A source that fails (no agent in the guest, libvirt
/// unable to read the ARP table) knows none.
fn first_known<E>(
    sources: impl IntoIterator<Item = std::result::Result<Vec<String>, E>>,
) -> Vec<std::net::IpAddr> {
    for addresses in sources.into_iter().flatten() {
        let mut found: Vec<std::net::IpAddr> = addresses
            .iter()
            .filter_map(|a| a.parse().ok())
            .filter(|a: &std::net::IpAddr| !a.is_loopback())
            .collect();
        found.sort_by_key(|a| a.is_ipv6());
        if !found.is_empty() {
            return found;
        }
    }
    Vec::new()
}

/// Active domains whose XML passes any of `devices` through (release is
/// confirmed when this is empty), each by name; an active domain that
/// cannot be described counts too, saying why (the interlock fails
/// closed: a domain whose devices are unknown may hold the baseboard).
fn holders(c: &Connect, uri: &str, devices: &[PciAddress]) -> Result<Vec<String>> {
    let domains = c
        .list_all_domains(sys::VIR_CONNECT_LIST_DOMAINS_ACTIVE)
        .map_err(|e| backend(uri, e))?;
    let mut out = Vec::new();
    for d in &domains {
        let name = match d.name() {
            Ok(name) => crate::text::printable(&name),
            Err(e) => {
                out.push(format!(
                    "an active domain whose name could not be read ({})",
                    crate::text::printable(&e.to_string())
                ));
                continue;
            }
        };
        let xml = if crate::failpoint::fails("libvirt.describe-domain") {
            Err("failpoint libvirt.describe-domain".to_string())
        } else {
            d.xml_desc(0).map_err(|e| e.to_string())
        };
        match xml {
            Ok(xml) => match domain_xml::passes_through(&xml, devices) {
                Ok(true) => out.push(name),
                Ok(false) => {}
                Err(why) => out.push(format!("domain {name}: {}", crate::text::printable(&why))),
            },
            // Gone since it was listed: off, so it holds nothing.
            Err(_) if !d.is_active().unwrap_or(true) => {}
            Err(e) => out.push(format!(
                "domain {name}: its XML could not be read: {}",
                crate::text::printable(&e)
            )),
        }
    }
    Ok(out)
}

/// The order of the address sources. Through libvirt, the lease is tested
/// with the test driver (tests/vm.rs), which answers every source alike;
/// real QEMU's ARP source could not be: libvirt 9.0 fails reading these
/// machines' (gVisor) neighbour table ("wrong nlmsg len").
#[cfg(test)]
mod tests {
    use super::first_known;
    use std::cell::Cell;

    fn ips(list: &[&str]) -> Vec<std::net::IpAddr> {
        list.iter().map(|a| a.parse().unwrap()).collect()
    }

    fn known(list: &[&str]) -> Result<Vec<String>, &'static str> {
        Ok(list.iter().map(|a| a.to_string()).collect())
    }

    #[test]
    fn the_lease_is_asked_first_and_spares_the_agent_and_the_arp_table() {
        let asked = Cell::new(0);
        let sources = [
            known(&["192.168.122.7"]),
            known(&["10.0.0.1"]),
            known(&["10.0.0.2"]),
        ];
        let found = first_known(sources.into_iter().inspect(|_| asked.set(asked.get() + 1)));
        assert_eq!(found, ips(&["192.168.122.7"]));
        assert_eq!(asked.get(), 1, "the agent and ARP were asked too");
    }

    #[test]
    fn no_lease_then_the_agent_then_the_arp_table() {
        // No lease (not on a libvirt network), the agent's answer.
        let found = first_known([known(&[]), known(&["10.0.0.5"]), known(&["10.0.0.9"])]);
        assert_eq!(found, ips(&["10.0.0.5"]));
        // No lease, no agent in the guest (an error), ARP knows it.
        let found = first_known([known(&[]), Err("no agent"), known(&["10.0.0.9"])]);
        assert_eq!(found, ips(&["10.0.0.9"]));
        // Only loopback from the agent counts as nothing known.
        let found = first_known([
            known(&[]),
            known(&["127.0.0.1", "::1"]),
            known(&["10.0.0.9"]),
        ]);
        assert_eq!(found, ips(&["10.0.0.9"]));
        // Nobody knows: none, not an error.
        let found = first_known([Err("x"), Err("no agent"), Err("wrong nlmsg len")]);
        assert!(found.is_empty());
    }

    #[test]
    fn ipv4_comes_before_ipv6_loopback_and_nonsense_never() {
        let found = first_known([known(&[
            "fe80::1",
            "::1",
            "not an address",
            "127.0.0.1",
            "10.1.2.3",
        ])]);
        assert_eq!(found, ips(&["10.1.2.3", "fe80::1"]));
    }
}
