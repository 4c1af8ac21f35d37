//! What time-slicing asks of a hypervisor, behind one small trait, and
//! its libvirt adaptor: domains by name, power, CPU time, which domains
//! hold the baseboard's devices (the interlock), the guest's agent and
//! channels, and lifecycle events as typed [`VmEvent`]s (libvirt's codes
//! stay in runtime/libvirt).

use crate::domain_xml::PciAddress;
use crate::error::Result;
use crate::runtime::libvirt::{Libvirt, Lifecycle};
use crate::runtime::BoxFuture;
use tokio::sync::broadcast;

pub use crate::runtime::libvirt::VmEvent;

/// What time-slicing asks of a hypervisor: libvirt in production
/// ([`Libvirt`]). Any method may wait as long as the hypervisor does, so
/// they are called only from tasks, never from the loop.
pub trait VmHost: Send + Sync {
    fn is_on<'a>(&'a self, domain: &'a str) -> BoxFuture<'a, Result<bool>>;
    /// An existing domain's XML.
    fn definition<'a>(&'a self, domain: &'a str) -> BoxFuture<'a, Result<String>>;
    /// Defines a persistent domain; its name.
    fn define(&self, xml: String) -> BoxFuture<'_, Result<String>>;
    fn power_on<'a>(&'a self, domain: &'a str) -> BoxFuture<'a, Result<()>>;
    fn power_off<'a>(&'a self, domain: &'a str, hard: bool) -> BoxFuture<'a, Result<()>>;
    /// (CPU time in ns, vCPUs).
    fn cpu_time<'a>(&'a self, domain: &'a str) -> BoxFuture<'a, Result<(u64, u32)>>;
    /// Active domains that hold any of these PCI devices.
    fn holders(&self, devices: Vec<PciAddress>) -> BoxFuture<'_, Result<Vec<String>>>;
    fn guest_addresses<'a>(
        &'a self,
        domain: &'a str,
    ) -> BoxFuture<'a, Result<Vec<std::net::IpAddr>>>;
    /// Whether the guest agent answers (Ok(Err(why)) when it does not).
    fn agent_answers<'a>(
        &'a self,
        domain: &'a str,
    ) -> BoxFuture<'a, Result<std::result::Result<(), String>>>;
    /// The host end of a virtio channel, once the domain runs.
    fn channel_path<'a>(
        &'a self,
        domain: &'a str,
        target: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>>>;
    /// Every domain's lifecycle events.
    fn lifecycle_events(&self) -> broadcast::Receiver<Lifecycle>;
}

impl VmHost for Libvirt {
    fn is_on<'a>(&'a self, domain: &'a str) -> BoxFuture<'a, Result<bool>> {
        Box::pin(Libvirt::is_on(self, domain))
    }
    fn definition<'a>(&'a self, domain: &'a str) -> BoxFuture<'a, Result<String>> {
        Box::pin(Libvirt::definition(self, domain))
    }
    fn define(&self, xml: String) -> BoxFuture<'_, Result<String>> {
        Box::pin(Libvirt::define(self, xml))
    }
    fn power_on<'a>(&'a self, domain: &'a str) -> BoxFuture<'a, Result<()>> {
        Box::pin(Libvirt::power_on(self, domain))
    }
    fn power_off<'a>(&'a self, domain: &'a str, hard: bool) -> BoxFuture<'a, Result<()>> {
        Box::pin(Libvirt::power_off(self, domain, hard))
    }
    fn cpu_time<'a>(&'a self, domain: &'a str) -> BoxFuture<'a, Result<(u64, u32)>> {
        Box::pin(Libvirt::cpu_time(self, domain))
    }
    fn holders(&self, devices: Vec<PciAddress>) -> BoxFuture<'_, Result<Vec<String>>> {
        Box::pin(Libvirt::holders(self, devices))
    }
    fn guest_addresses<'a>(
        &'a self,
        domain: &'a str,
    ) -> BoxFuture<'a, Result<Vec<std::net::IpAddr>>> {
        Box::pin(Libvirt::guest_addresses(self, domain))
    }
    fn agent_answers<'a>(
        &'a self,
        domain: &'a str,
    ) -> BoxFuture<'a, Result<std::result::Result<(), String>>> {
        Box::pin(Libvirt::agent_answers(self, domain))
    }
    fn channel_path<'a>(
        &'a self,
        domain: &'a str,
        target: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>>> {
        Box::pin(Libvirt::channel_path(self, domain, target))
    }
    fn lifecycle_events(&self) -> broadcast::Receiver<Lifecycle> {
        crate::runtime::libvirt::events().subscribe()
    }
}
