//! `/etc/astraeus/node.toml`: the few settings a host owner changes.

use crate::error::{Error, Result};
use serde::Deserialize;
use std::path::Path;
use std::time::Duration;

pub const DEFAULT_PATH: &str = "/etc/astraeus/node.toml";

/// Where a session daemon serves the machine page unless told otherwise
/// (the address the desktop entry opens).
pub const SESSION_LISTEN: &str = "127.0.0.1:8089";
/// The CDI device a WSL2 host's containers get ([`Config::for_wsl`]).
pub const WSL_CDI_DEVICE: &str = "nvidia.com/gpu=all";

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// The machine's name in reasons and listings; the host name when unset.
    pub machine: Option<String>,
    pub access: Access,
    pub inventory: Inventory,
    pub placement: PlacementConfig,
    pub schedule: ScheduleConfig,
    pub usage: UsageConfig,
    pub runtime: RuntimeConfig,
    pub http: HttpConfig,
    pub slicing: SlicingConfig,
    pub history: HistoryConfig,
    pub sharing: SharingConfig,
}

/// How a shared worker's GPU memory is held (docs/sharing.md, "When a
/// share is held").
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SharingConfig {
    /// The hard limit a shared worker gets on each GPU: its share, or its
    /// share and what no one was promised as it starts (it may borrow that;
    /// its soft limit, its share, is still guaranteed to each).
    pub hard_limit: HardLimit,
    /// Where control groups are mounted (the dmem controller's files, and
    /// the paths NVML is given).
    pub cgroup_root: std::path::PathBuf,
}

/// `sharing.hard_limit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HardLimit {
    Share,
    Offered,
}

impl Default for SharingConfig {
    fn default() -> SharingConfig {
        SharingConfig {
            hard_limit: HardLimit::Share,
            cgroup_root: "/sys/fs/cgroup".into(),
        }
    }
}

/// How long the ledger keeps what ended, and the room it keeps on its disk.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HistoryConfig {
    /// Ended workers, their holds, handoff steps, slices and usage older
    /// than this many days are deleted (0: nothing ended is kept beyond
    /// the next hourly pass).
    pub keep_days: u32,
    /// Below this much free space (MB) on the ledger's filesystem new
    /// submits are refused; stops, exits and readings go on.
    pub min_free_mb: u64,
}

/// [`Config::session_path`] from the variables' values.
fn session_path_in(
    xdg_config_home: Option<std::ffi::OsString>,
    home: Option<std::ffi::OsString>,
) -> Option<std::path::PathBuf> {
    xdg_config_home
        .filter(|d| Path::new(d).is_absolute())
        .map(std::path::PathBuf::from)
        .or_else(|| home.map(|h| Path::new(&h).join(".config")))
        .map(|d| d.join("astraeus/node.toml"))
}

/// 400 days: a report over last year (a calendar year, or the 365 days
/// before any day) can still be made well into the next one.
pub const DEFAULT_KEEP_DAYS: u32 = 400;

impl Default for HistoryConfig {
    fn default() -> HistoryConfig {
        HistoryConfig {
            keep_days: DEFAULT_KEEP_DAYS,
            min_free_mb: 64,
        }
    }
}

impl HistoryConfig {
    /// How long ended history is kept.
    pub fn keep(&self) -> Duration {
        Duration::from_secs(u64::from(self.keep_days) * 86_400)
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SlicingConfig {
    /// Accept a template's weights disk on a networked filesystem (NFS,
    /// CIFS, Ceph…): the seed wants it host-local, so a slice's start does
    /// not wait on the network.
    pub allow_networked_weights: bool,
    /// Accept a template that lists no baseboard devices (trials, tests):
    /// the seed's premise is the whole baseboard passed through.
    pub allow_no_baseboard: bool,
    /// A host command run between two slices (a GPU reset, a memory
    /// scrub), as its argv: after the outgoing VM stopped and before the
    /// baseboard counts as released. Empty: none.
    pub between_slices: Vec<String>,
    /// How long it may run before it is killed (and counts as failed).
    pub between_slices_timeout_seconds: u64,
}

impl Default for SlicingConfig {
    fn default() -> SlicingConfig {
        SlicingConfig {
            allow_networked_weights: false,
            allow_no_baseboard: false,
            between_slices: Vec::new(),
            between_slices_timeout_seconds: 300,
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// The machine page's address (`127.0.0.1:8089`, or a bare port for
    /// loopback); unset: no HTTP server.
    pub listen: Option<String>,
    /// Host names the page answers to besides IP addresses, `localhost` and
    /// this host's name (a browser's Host header; any other name gets 421,
    /// which defeats DNS rebinding).
    pub names: Vec<String>,
    /// `listen` was not in the file but is a session daemon's default: a
    /// port in use then costs the page, not the daemon.
    #[serde(skip)]
    pub listen_by_default: bool,
}

impl HttpConfig {
    /// The socket address to listen on, if the page is on.
    pub fn address(&self) -> Result<Option<std::net::SocketAddr>> {
        let Some(text) = self.listen.as_deref() else {
            return Ok(None);
        };
        let refused = || {
            Error::field(
                "http.listen",
                format!(
                    "an address and port such as 127.0.0.1:8089, or a port (1 to 65535); \
                     got {text:?}"
                ),
            )
        };
        let address = match text.parse::<u16>() {
            Ok(port) => std::net::SocketAddr::from(([127, 0, 0, 1], port)),
            Err(_) => text.parse().map_err(|_| refused())?,
        };
        // Port 0 would be one the kernel picks: nobody could find the page.
        if address.port() == 0 {
            return Err(refused());
        }
        Ok(Some(address))
    }
}

/// Which engine runs container workers (`runtime.containers`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ContainerEngine {
    Podman,
    Docker,
    /// The one whose socket answers at start, podman first.
    Auto,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeConfig {
    /// podman, docker, or auto (the one whose socket answers, podman first).
    pub containers: ContainerEngine,
    /// Podman's API socket (podman.socket / `podman system service`).
    pub podman_socket: std::path::PathBuf,
    /// Docker Engine's API socket.
    pub docker_socket: std::path::PathBuf,
    /// The CDI device a container gets for each of its GPUs; `{uuid}` is replaced.
    pub cdi_device: String,
    /// StopWorker stops gracefully, then forces after this long.
    pub stop_timeout_seconds: u64,
    /// A call to podman's API that has not answered in this long fails
    /// (a launch then ends its worker `failed`, naming podman).
    pub podman_timeout_seconds: u64,
    /// The same for Docker's API.
    pub docker_timeout_seconds: u64,
    /// A member's container runs with at most this many processes.
    pub member_max_processes: u64,
    /// libvirt, for VM workers; "" turns VM workers off.
    pub libvirt_uri: String,
    /// CPU cores and memory (GB) a unit worker is capped at when its request
    /// names none; 0 leaves it uncapped.
    pub unit_default_cpu_cores: u32,
    pub unit_default_memory_gb: u64,
}

impl Default for RuntimeConfig {
    fn default() -> RuntimeConfig {
        RuntimeConfig {
            containers: ContainerEngine::Auto,
            podman_socket: "/run/podman/podman.sock".into(),
            docker_socket: "/var/run/docker.sock".into(),
            cdi_device: "nvidia.com/gpu={uuid}".into(),
            stop_timeout_seconds: 10,
            podman_timeout_seconds: 120,
            docker_timeout_seconds: 120,
            member_max_processes: 4096,
            libvirt_uri: "qemu:///system".into(),
            unit_default_cpu_cores: 0,
            unit_default_memory_gb: 0,
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PlacementConfig {
    /// A whole request waiting this long gets a GPU drained for it; 0: never.
    pub drain_after_seconds: u64,
}

impl Default for PlacementConfig {
    fn default() -> PlacementConfig {
        PlacementConfig {
            drain_after_seconds: 600,
        }
    }
}

impl PlacementConfig {
    /// How long a whole request waits before a GPU drains for it; None: never.
    pub fn drain_after(&self) -> Option<Duration> {
        (self.drain_after_seconds > 0).then(|| Duration::from_secs(self.drain_after_seconds))
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UsageConfig {
    /// Energy and utilisation samples are closed into a ledger row this often.
    pub interval_seconds: u64,
}

impl Default for UsageConfig {
    fn default() -> UsageConfig {
        UsageConfig {
            interval_seconds: 60,
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScheduleConfig {
    /// The zone schedules are computed in (e.g. "Europe/Berlin"); the host's when unset.
    pub time_zone: Option<String>,
    /// At least this long between one slice's power-off and the next resume.
    pub handoff_buffer_seconds: u64,
}

impl Default for ScheduleConfig {
    fn default() -> ScheduleConfig {
        ScheduleConfig {
            time_zone: None,
            handoff_buffer_seconds: 300,
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Access {
    /// Members of this group (and root) may submit and stop workers.
    pub group: String,
    /// Let members run containers too: an image of their choosing on this
    /// host's kernel, as their uid with no-new-privileges; only the runtime's
    /// isolation stands between it and the host (docs/security.md).
    pub containers_for_group: bool,
    /// Let members run VMs too. A VM gets whole GPUs passed through and the
    /// disks its XML names: membership then equals root.
    pub vms_for_group: bool,
    /// Live workers (pending or placed) one user may hold; root is exempt.
    pub max_workers_per_user: u32,
    /// Pending workers one user may have waiting; root is exempt.
    pub max_pending_per_user: u32,
    /// Submits one user may make in any minute; root is exempt.
    pub max_submits_per_minute: u32,
    /// MiB of requests one user's live workers may hold; root is exempt.
    pub max_request_mib_per_user: u32,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Inventory {
    /// How often the GPU inventory is re-read, in seconds.
    pub refresh_seconds: f64,
    /// Read GPUs through NVML; false on a host that only time-slices.
    pub nvml: bool,
    /// The driver's NVML library; searched for when unset.
    pub nvml_library: Option<std::path::PathBuf>,
    /// Force WSL2 mode on or off; detected when unset.
    pub wsl: Option<bool>,
    /// GPUs (UUIDs or PCI bus ids) owned by a time-slicing baseboard: never offered.
    pub baseboard: Vec<String>,
}

impl Default for Access {
    fn default() -> Access {
        Access {
            group: "astraeus".into(),
            containers_for_group: false,
            vms_for_group: false,
            max_workers_per_user: crate::access::DEFAULT_MAX_WORKERS,
            max_pending_per_user: crate::access::DEFAULT_MAX_PENDING,
            max_submits_per_minute: crate::access::DEFAULT_MAX_SUBMITS_PER_MINUTE,
            max_request_mib_per_user: crate::access::DEFAULT_MAX_REQUEST_MIB,
        }
    }
}

impl Default for Inventory {
    fn default() -> Inventory {
        Inventory {
            refresh_seconds: 2.0,
            nvml: true,
            nvml_library: None,
            wsl: None,
            baseboard: Vec::new(),
        }
    }
}

/// The longest `placement.drain_after_seconds` (a year): more is "never",
/// which 0 says.
const MAX_DRAIN_AFTER_SECONDS: u64 = 31_536_000;

/// Where in `text` a TOML error is, and what it is, on one line: ", line 3
/// (`group = astraeus`): invalid string; expected `"`, `'`". The file is
/// the operator's; the line is shown as it is, made printable.
pub(crate) fn where_in(text: &str, e: &toml::de::Error) -> String {
    let what = e.message().trim().replace('\n', "; ");
    let Some(span) = e.span() else {
        return format!(": {what}");
    };
    let start = span.start.min(text.len());
    let line_no = text[..start].matches('\n').count() + 1;
    let line = text.lines().nth(line_no - 1).unwrap_or_default().trim();
    let line = crate::text::printable(&line.chars().take(80).collect::<String>());
    format!(", line {line_no} (`{line}`): {what}")
}

/// A configuration error in plain words, with the line of the key it names
/// when the file has it (a value out of range is found by serde's checks
/// after parsing, which know no lines): `config FILE, line N (`…`): key: …`.
pub fn explained(path: &Path, text: &str, e: &Error) -> String {
    let message = e.message();
    if message.starts_with("config ") {
        return message.to_string(); // a parse error: it has its line
    }
    let key = message.split(": ").next().unwrap_or_default();
    match line_of(text, key) {
        Some((n, line)) => format!(
            "config {}, line {n} (`{}`): {message}",
            path.display(),
            crate::text::printable(&line.chars().take(80).collect::<String>())
        ),
        None => format!("config {}: {message}", path.display()),
    }
}

/// The line (1-based) and text where `key` (`table.name`, or `name` at the
/// top; an index such as `baseboard[1]` is dropped) is set in `text`.
fn line_of(text: &str, key: &str) -> Option<(usize, String)> {
    let key = key.split('[').next()?;
    let (table, name) = key.rsplit_once('.').unwrap_or(("", key));
    let mut current = String::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.trim();
        if let Some(header) = t.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            current = header.trim().to_string();
            continue;
        }
        let set = t
            .split_once('=')
            .is_some_and(|(k, _)| k.trim().trim_matches('"') == name);
        if set && current == table {
            return Some((i + 1, t.to_string()));
        }
    }
    None
}

impl Config {
    /// Reads the file; a missing default file means defaults, a missing
    /// explicitly named one is an error.
    pub fn load(path: &Path, explicit: bool) -> Result<Config> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => {
                return Ok(Config::default())
            }
            Err(e) => return Err(Error::Backend(format!("config {}: {e}", path.display()))),
        };
        let c: Config = toml::from_str(&text).map_err(|e| {
            Error::InvalidRequest(format!("config {}{}", path.display(), where_in(&text, &e)))
        })?;
        c.check()?;
        Ok(c)
    }

    /// What serde cannot say of a value: its range, and the settings read
    /// only at a start (a reload that took them would tell of a change
    /// the next start refuses). Checked at every load, before the daemon
    /// opens its ledger.
    fn check(&self) -> Result<()> {
        let within = |field: &str, v: u64, range: std::ops::RangeInclusive<u64>, what: &str| {
            if range.contains(&v) {
                Ok(())
            } else {
                Err(Error::field(field, format!("{what}; got {v}")))
            }
        };
        if !(0.1..=3600.0).contains(&self.inventory.refresh_seconds) {
            return Err(Error::field(
                "inventory.refresh_seconds",
                "a number of seconds from 0.1 to 3600",
            ));
        }
        if let Some(name) = &self.machine {
            crate::request::validate_name("machine", name)?;
        }
        for (i, id) in self.inventory.baseboard.iter().enumerate() {
            let uuid = id.get(..4).is_some_and(|p| p.eq_ignore_ascii_case("GPU-"));
            if !uuid && crate::domain_xml::PciAddress::parse(id).is_none() {
                return Err(Error::field(
                    &format!("inventory.baseboard[{i}]"),
                    format!("a GPU's UUID (GPU-…) or PCI address (0000:41:00.0); got {id:?}"),
                ));
            }
        }
        self.time_zone()?;
        self.http.address()?;
        within(
            "placement.drain_after_seconds",
            self.placement.drain_after_seconds,
            0..=MAX_DRAIN_AFTER_SECONDS,
            "0 (never) or up to 31536000 seconds (a year)",
        )?;
        within(
            "usage.interval_seconds",
            self.usage.interval_seconds,
            1..=3600,
            "1 to 3600 seconds",
        )?;
        if let Some(program) = self.slicing.between_slices.first() {
            if !program.starts_with('/') {
                return Err(Error::field(
                    "slicing.between_slices",
                    format!(
                        "the command as a list whose first word is an absolute path, such as \
                         [\"/usr/bin/nvidia-smi\", \"--gpu-reset\"]; got {program:?}"
                    ),
                ));
            }
        }
        within(
            "slicing.between_slices_timeout_seconds",
            self.slicing.between_slices_timeout_seconds,
            1..=3600,
            "1 to 3600 seconds",
        )?;
        within(
            "schedule.handoff_buffer_seconds",
            self.schedule.handoff_buffer_seconds,
            0..=86_400,
            "0 to 86400 seconds (a day)",
        )?;
        within(
            "runtime.stop_timeout_seconds",
            self.runtime.stop_timeout_seconds,
            0..=3600,
            "0 to 3600 seconds",
        )?;
        within(
            "runtime.podman_timeout_seconds",
            self.runtime.podman_timeout_seconds,
            1..=3600,
            "1 to 3600 seconds",
        )?;
        within(
            "runtime.docker_timeout_seconds",
            self.runtime.docker_timeout_seconds,
            1..=3600,
            "1 to 3600 seconds",
        )?;
        within(
            "runtime.member_max_processes",
            self.runtime.member_max_processes,
            16..=4_194_304,
            "16 to 4194304 processes",
        )?;
        within(
            "history.keep_days",
            u64::from(self.history.keep_days),
            0..=36_500,
            "0 (keep nothing ended) to 36500 days",
        )?;
        within(
            "history.min_free_mb",
            self.history.min_free_mb,
            0..=1_048_576,
            "0 (no floor) to 1048576 MB",
        )?;
        within(
            "access.max_submits_per_minute",
            u64::from(self.access.max_submits_per_minute),
            1..=1_000_000,
            "1 to 1000000 submits",
        )?;
        within(
            "access.max_request_mib_per_user",
            u64::from(self.access.max_request_mib_per_user),
            1..=1_048_576,
            "1 to 1048576 MiB",
        )?;
        within(
            "runtime.unit_default_memory_gb",
            self.runtime.unit_default_memory_gb,
            0..=1_048_576,
            "0 (uncapped) to 1048576 GB",
        )
    }

    /// Where a daemon on the session bus (a desktop, WSL) reads its
    /// configuration: `$XDG_CONFIG_HOME/astraeus/node.toml` (or
    /// `~/.config/…`), and only there: absent, it runs on the defaults and
    /// the session's ([`Config::for_session`]). Never the system's file:
    /// an `[http] listen` or a policy meant for the system daemon is not
    /// the user's (a session daemon served its page on the system's
    /// address). None: neither variable is set.
    pub fn session_path() -> Option<std::path::PathBuf> {
        session_path_in(
            std::env::var_os("XDG_CONFIG_HOME"),
            std::env::var_os("HOME"),
        )
    }

    /// A WSL2 host's defaults, where the file left them: the one CDI device
    /// NVIDIA's `nvidia-ctk cdi generate --mode=wsl` writes, `nvidia.com/gpu=all`
    /// (WSL gives every container every GPU; there is no device per UUID).
    pub fn for_wsl(mut self) -> Config {
        if self.runtime.cdi_device == RuntimeConfig::default().cdi_device {
            self.runtime.cdi_device = WSL_CDI_DEVICE.into();
        }
        self
    }

    /// A session daemon's defaults, where the file left the system's: the
    /// user's rootless podman (`$XDG_RUNTIME_DIR/podman/podman.sock`), the
    /// user's rootless Docker (`$XDG_RUNTIME_DIR/docker.sock`) when it is
    /// there (else the system's, which Docker Desktop's WSL integration
    /// and the docker group use), and libvirt's session (`qemu:///session`).
    pub fn for_session(mut self, runtime_dir: Option<&Path>) -> Config {
        let system = RuntimeConfig::default();
        if self.runtime.podman_socket == system.podman_socket {
            if let Some(run) = runtime_dir {
                self.runtime.podman_socket = run.join("podman/podman.sock");
            }
        }
        if self.runtime.docker_socket == system.docker_socket {
            if let Some(rootless) = runtime_dir
                .map(|run| run.join("docker.sock"))
                .filter(|s| s.exists())
            {
                self.runtime.docker_socket = rootless;
            }
        }
        if self.runtime.libvirt_uri == system.libvirt_uri {
            self.runtime.libvirt_uri = "qemu:///session".into();
        }
        // The desktop entry opens the page here.
        if self.http.listen.is_none() {
            self.http.listen = Some(SESSION_LISTEN.into());
            self.http.listen_by_default = true;
        }
        self
    }

    /// The zone named in config, or the host's (UTC when the host has none).
    pub fn time_zone(&self) -> Result<jiff::tz::TimeZone> {
        match &self.schedule.time_zone {
            Some(name) => jiff::tz::TimeZone::get(name).map_err(|e| {
                Error::field(
                    "schedule.time_zone",
                    format!("{name:?} is not a known time zone ({e})"),
                )
            }),
            None => Ok(jiff::tz::TimeZone::try_system().unwrap_or(jiff::tz::TimeZone::UTC)),
        }
    }

    pub fn refresh(&self) -> Duration {
        Duration::from_secs_f64(self.inventory.refresh_seconds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_daemon_uses_the_users_podman_and_libvirt_unless_told_otherwise() {
        let run = Path::new("/run/user/1000");
        let c = Config::default().for_session(Some(run));
        assert_eq!(c.runtime.podman_socket, run.join("podman/podman.sock"));
        assert_eq!(c.runtime.libvirt_uri, "qemu:///session");
        assert_eq!(c.http.listen.as_deref(), Some("127.0.0.1:8089"));
        assert!(c.http.listen_by_default);
        // What the file names stays.
        let mut named = Config::default();
        named.runtime.podman_socket = "/srv/podman.sock".into();
        named.runtime.libvirt_uri = String::new();
        let c = named.for_session(Some(run));
        assert_eq!(c.runtime.podman_socket, Path::new("/srv/podman.sock"));
        assert_eq!(c.runtime.libvirt_uri, "");
    }

    #[test]
    fn a_session_daemon_uses_the_users_rootless_docker_only_when_it_is_there() {
        let run = tempfile::tempdir().unwrap();
        let c = Config::default().for_session(Some(run.path()));
        assert_eq!(c.runtime.docker_socket, Path::new("/var/run/docker.sock"));
        std::fs::write(run.path().join("docker.sock"), "").unwrap();
        let c = Config::default().for_session(Some(run.path()));
        assert_eq!(c.runtime.docker_socket, run.path().join("docker.sock"));
        let mut named = Config::default();
        named.runtime.docker_socket = "/srv/docker.sock".into();
        let c = named.for_session(Some(run.path()));
        assert_eq!(c.runtime.docker_socket, Path::new("/srv/docker.sock"));
    }

    #[test]
    fn a_wsl_host_asks_for_the_one_device_nvidia_ctk_writes_there_unless_told_otherwise() {
        let c = Config::default().for_wsl();
        assert_eq!(c.runtime.cdi_device, "nvidia.com/gpu=all");
        let mut named = Config::default();
        named.runtime.cdi_device = "example.com/gpu={uuid}".into();
        assert_eq!(named.for_wsl().runtime.cdi_device, "example.com/gpu={uuid}");
    }

    #[test]
    fn the_shipped_example_parses_and_says_what_the_defaults_are() {
        let example: Config = toml::from_str(include_str!("../packaging/node.toml")).unwrap();
        let d = Config::default();
        assert_eq!(example.access.group, d.access.group);
        assert_eq!(example.access.vms_for_group, d.access.vms_for_group);
        assert_eq!(
            example.access.max_workers_per_user,
            d.access.max_workers_per_user
        );
        assert_eq!(
            example.access.max_pending_per_user,
            d.access.max_pending_per_user
        );
        assert_eq!(example.runtime.libvirt_uri, d.runtime.libvirt_uri);
        assert_eq!(
            example.runtime.unit_default_cpu_cores,
            d.runtime.unit_default_cpu_cores
        );
        assert_eq!(
            example.runtime.unit_default_memory_gb,
            d.runtime.unit_default_memory_gb
        );
        assert_eq!(example.runtime.podman_socket, d.runtime.podman_socket);
        assert_eq!(example.runtime.containers, d.runtime.containers);
        assert_eq!(example.runtime.docker_socket, d.runtime.docker_socket);
        assert_eq!(
            example.runtime.docker_timeout_seconds,
            d.runtime.docker_timeout_seconds
        );
        assert_eq!(
            example.runtime.podman_timeout_seconds,
            d.runtime.podman_timeout_seconds
        );
        assert_eq!(
            example.runtime.member_max_processes,
            d.runtime.member_max_processes
        );
        assert_eq!(example.history.keep_days, d.history.keep_days);
        assert_eq!(example.history.min_free_mb, d.history.min_free_mb);
        assert_eq!(
            example.access.max_submits_per_minute,
            d.access.max_submits_per_minute
        );
        assert_eq!(
            example.access.max_request_mib_per_user,
            d.access.max_request_mib_per_user
        );
        assert_eq!(example.http.listen, None, "the page is off by default");
        assert!(!example.slicing.allow_networked_weights);
        assert!(!d.slicing.allow_networked_weights);
        // The key the weights refusal names is the key the config reads.
        let on: Config = toml::from_str("[slicing]\nallow_networked_weights = true").unwrap();
        assert!(on.slicing.allow_networked_weights);
        assert_eq!(
            crate::slicing::template::ALLOW_NETWORKED_WEIGHTS,
            "slicing.allow_networked_weights"
        );
    }

    #[test]
    fn the_page_listens_on_loopback_for_a_bare_port_and_names_a_bad_address() {
        let http = |s: &str| HttpConfig {
            listen: Some(s.into()),
            ..HttpConfig::default()
        };
        assert_eq!(
            http("8089").address().unwrap(),
            Some("127.0.0.1:8089".parse().unwrap())
        );
        assert_eq!(
            http("[::1]:9000").address().unwrap(),
            Some("[::1]:9000".parse().unwrap())
        );
        let e = http("localhost").address().unwrap_err();
        assert!(e.message().starts_with("http.listen: "), "{e}");
        assert_eq!(HttpConfig::default().address().unwrap(), None);
        // Port 0 is one the kernel would pick: nobody could find the page.
        for zero in ["0", "127.0.0.1:0"] {
            let e = http(zero).address().unwrap_err();
            assert!(e.message().contains("1 to 65535"), "{e}");
        }
    }

    fn load(text: &str) -> Result<Config> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.toml");
        std::fs::write(&path, text).unwrap();
        Config::load(&path, true)
    }

    /// An operator's typo is refused at load (before the ledger is opened,
    /// and by a reload, which then keeps what it had), naming the setting
    /// and what it takes, or the line it is on.
    #[test]
    fn a_typo_is_refused_naming_the_setting_or_its_line() {
        let refused = |text: &str, says: &str| {
            let e = load(text).unwrap_err();
            assert!(matches!(e, Error::InvalidRequest(_)), "{text}: {e:?}");
            assert!(e.message().contains(says), "{text}: {e}");
        };
        refused("machine = \"\"", "machine: 1 to 64 characters");
        refused(
            "[history]\nkeep_days = 40000",
            "history.keep_days: 0 (keep nothing ended) to 36500 days; got 40000",
        );
        refused(
            "[access]\nmax_submits_per_minute = 0",
            "access.max_submits_per_minute: 1 to 1000000",
        );
        refused(
            "[runtime]\npodman_timeout_seconds = 0",
            "runtime.podman_timeout_seconds: 1 to 3600 seconds",
        );
        refused(
            "[runtime]\ndocker_timeout_seconds = 0",
            "runtime.docker_timeout_seconds: 1 to 3600 seconds",
        );
        refused(
            "[runtime]\ncontainers = \"lxc\"",
            "unknown variant `lxc`, expected one of `podman`, `docker`, `auto`",
        );
        refused("machine = \"a b/c\"", "machine: 1 to 64 characters");
        refused(
            "[schedule]\ntime_zone = \"Mars/Base\"",
            "schedule.time_zone: \"Mars/Base\" is not a known time zone",
        );
        refused(
            "[http]\nlisten = \"nope\"",
            "http.listen: an address and port",
        );
        refused("[http]\nlisten = \"0\"", "http.listen: an address and port");
        refused(
            "[placement]\ndrain_after_seconds = 9223372036854775807",
            "placement.drain_after_seconds: 0 (never) or up to 31536000 seconds (a year); \
             got 9223372036854775807",
        );
        refused(
            "[usage]\ninterval_seconds = 0",
            "usage.interval_seconds: 1 to 3600",
        );
        refused(
            "[schedule]\nhandoff_buffer_seconds = 9999999",
            "schedule.handoff_buffer_seconds: 0 to 86400",
        );
        refused(
            "[runtime]\nstop_timeout_seconds = 99999999999",
            "runtime.stop_timeout_seconds: 0 to 3600",
        );
        refused(
            "[runtime]\nunit_default_memory_gb = 9223372036854775807",
            "runtime.unit_default_memory_gb: 0 (uncapped) to 1048576 GB",
        );
        refused(
            "[inventory]\nbaseboard = [\"GPU-a\", \"slot 3\"]",
            "inventory.baseboard[1]: a GPU's UUID (GPU-…) or PCI address",
        );
        // What TOML itself refuses: the line, as written, and why.
        refused(
            "[access]\n\ngroup = astraeus\n",
            "line 3 (`group = astraeus`): ",
        );
        refused(
            "[access]\nmax_workers_per_user = -1\n",
            "line 2 (`max_workers_per_user = -1`): invalid value",
        );
        refused(
            "[inventory]\nrefrsh_seconds = 2\n",
            "line 2 (`refrsh_seconds = 2`): unknown field",
        );
        // The shipped example and the edges of each range load.
        assert!(load(include_str!("../packaging/node.toml")).is_ok());
        let edges = "machine = \"majin\"\n[placement]\ndrain_after_seconds = 31536000\n\
                     [usage]\ninterval_seconds = 3600\n[schedule]\nhandoff_buffer_seconds = 0\n\
                     time_zone = \"Europe/Berlin\"\n[http]\nlisten = \"65535\"\n";
        load(edges).unwrap();
    }

    /// A session daemon reads the user's file or none: never /etc's.
    #[test]
    fn a_session_daemon_reads_the_users_file_and_never_the_systems() {
        use super::session_path_in;
        use std::path::PathBuf;
        let home = Some("/home/ana".into());
        assert_eq!(
            session_path_in(None, home.clone()),
            Some(PathBuf::from("/home/ana/.config/astraeus/node.toml"))
        );
        assert_eq!(
            session_path_in(Some("/cfg".into()), home.clone()),
            Some(PathBuf::from("/cfg/astraeus/node.toml"))
        );
        // A relative XDG_CONFIG_HOME is invalid (XDG spec): ignored.
        assert_eq!(
            session_path_in(Some("cfg".into()), home),
            Some(PathBuf::from("/home/ana/.config/astraeus/node.toml"))
        );
        assert_eq!(session_path_in(None, None), None);
    }
}
