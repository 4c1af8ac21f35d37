//! What the service loop takes from the configuration (main.rs fills it).

use super::reload;
use crate::runtime::Runtime;
use std::sync::Arc;
use std::time::Duration;

/// Time-slicing settings the loop applies to schedules.
pub struct SliceRules {
    pub tz: jiff::tz::TimeZone,
    pub buffer: Duration,
}

/// What the loop takes from the configuration.
pub struct Settings {
    /// The user this daemon runs as, when it is not the system's: a member
    /// of its own daemon (access::Rules::owner).
    pub owner: Option<u32>,
    /// node.toml as loaded, re-read on SIGHUP (None: no reloads).
    pub config: Option<reload::Loaded>,
    pub refresh: Duration,
    /// A whole request waiting this long gets a GPU drained for it (None: never).
    pub drain_after: Option<Duration>,
    /// The machine name from config, overriding the source's.
    pub machine_name: Option<String>,
    /// Members (and root) may submit and stop workers.
    pub group: String,
    pub slice_rules: SliceRules,
    /// Energy and utilisation samples are closed into a ledger row this often.
    pub usage_interval: Duration,
    /// Podman or Docker, when configured; container workers are refused
    /// without it.
    pub containers: Option<Arc<dyn Runtime>>,
    /// Which engine that is, and where: "Docker at /var/run/docker.sock"
    /// (the log, the started event, the Manager's ContainerRuntime).
    pub containers_by: String,
    /// Which engine that is (None: no container runtime).
    pub containers_engine: Option<crate::runtime::ContainerRuntime>,
    /// The service manager, for unit workers.
    pub units: Option<Arc<dyn Runtime>>,
    /// libvirt, for VM workers.
    pub vms: Option<Arc<dyn Runtime>>,
    /// What holds shared workers' GPU memory limits (NVML, dmem), or why
    /// nothing can on this host.
    pub limits: Arc<dyn crate::inventory::limits::MemoryLimits>,
    /// `sharing.hard_limit`.
    pub hard_limit: crate::config::HardLimit,
    /// libvirt, for time-slicing templates (the same connection as `vms`).
    pub templates: Option<Arc<crate::runtime::libvirt::Libvirt>>,
    /// Graceful stop, then forced after this long.
    pub stop_timeout: Duration,
    /// A member's container runs with at most this many processes.
    pub member_max_processes: u64,
    /// Whether members of the access group may run containers (root-equivalent).
    pub containers_for_group: bool,
    /// Whether members of the access group may run VMs (root-equivalent).
    pub vms_for_group: bool,
    /// Per-user quotas of live and of pending workers, of submits a minute
    /// and of request bytes held (root exempt).
    pub max_workers_per_user: u32,
    pub max_pending_per_user: u32,
    pub max_submits_per_minute: u32,
    pub max_request_mib_per_user: u32,
    /// How long ended history is kept (`history.keep_days`), and how
    /// often retention runs (hourly; shorter only in tests and the soak).
    pub keep_history: Duration,
    pub retention_every: Duration,
    /// The machine page's address, `http://ADDR/`; "" when it is off.
    pub page: String,
    /// Accept weights disks on networked filesystems (`slicing.allow_networked_weights`).
    pub allow_networked_weights: bool,
    /// Accept templates with an empty baseboard (`slicing.allow_no_baseboard`).
    pub allow_no_baseboard: bool,
    /// The host command between slices and its deadline (`slicing.between_slices`).
    pub between_slices: Vec<String>,
    pub between_slices_within: Duration,
    pub between_slices_retry: Duration,
    /// The runtime that builds and sends the listings, off the loop's thread.
    pub lists: crate::bus::offload::Lists,
}
