//! Launching workers: one small trait, one implementation per kind of `run`.
//! Containers run through podman's REST API (podman.rs), units as systemd
//! transient services (unit.rs), VMs as transient libvirt domains (libvirt.rs).

pub mod domain_xml;
mod http;
pub mod libvirt;
pub mod podman;
pub mod unit;

use crate::error::Result;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Everything a runtime needs to start one worker.
#[derive(Clone, Debug)]
pub struct Launch {
    pub worker: String,
    pub run: crate::request::Run,
    /// UUIDs of the GPUs it holds.
    pub gpu_uuids: Vec<String>,
    /// Their PCI addresses, in the same order (VMs take them as hostdevs).
    pub gpu_pci: Vec<String>,
    /// ASTRAEUS_GPU_MEMORY_GB: its share per GPU (shared), or its GPUs' memory (whole).
    pub gpu_memory_gb: Option<String>,
    pub cpu_cores: crate::quantity::Amount,
    pub memory_bytes: u64,
    /// Run as this uid (units of non-root owners); None: as the runtime decides.
    pub user: Option<u32>,
}

/// Which runtime a workload belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Container,
    Unit,
    Vm,
}

/// How a workload ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Exit {
    Exited(i32),
    /// The runtime's own error text.
    Failed(String),
}

/// A workload found running (or ended) under a runtime, for reconciliation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    pub worker: String,
    pub id: String,
    pub running: bool,
    pub exit_code: Option<i32>,
}

pub trait Runtime: Send + Sync {
    /// Starts the workload; returns the runtime's id for it.
    fn start<'a>(&'a self, launch: &'a Launch) -> BoxFuture<'a, Result<String>>;
    /// Resolves when the workload ends (not by polling: the runtime's own wait).
    fn wait<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Exit>;
    /// Graceful stop, forced after `timeout`.
    fn stop<'a>(&'a self, id: &'a str, timeout: Duration) -> BoxFuture<'a, Result<()>>;
    /// Forgets an ended workload (removes the container).
    fn remove<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<()>>;
    /// Every workload this daemon started, by the worker it belongs to.
    fn list(&self) -> BoxFuture<'_, Result<Vec<Found>>>;
}
