//! astraeusd: the daemon's entry point. Parses flags, opens the ledger, reads
//! the machine, serves D-Bus, and hands control to the service loop.

use astraeusd::bus::offload::Lists;
use astraeusd::bus::BUS_NAME;
use astraeusd::cli::DaemonArgs as Args;
use astraeusd::config::{self, Config};
use astraeusd::error::Error;
use astraeusd::inventory::limits::{MemoryLimits, Unable};
use astraeusd::inventory::nvml::{NvmlOptions, NvmlSource};
use astraeusd::inventory::{self, sim::SimSource, GpuSource, NoGpus, Own};
use astraeusd::node::Node;
use astraeusd::runtime::libvirt::Libvirt;
use astraeusd::runtime::unit::Units;
use astraeusd::service::{Service, Settings, SliceRules};
use astraeusd::store::Store;
use clap::Parser;
use std::path::PathBuf;
use std::sync::Arc;
use tracing_subscriber::prelude::*;

/// Sets up logging; true when it goes to the journal.
fn init_logging() -> bool {
    let filter = tracing_subscriber::EnvFilter::try_from_env("ASTRAEUS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let registry = tracing_subscriber::registry().with(filter);
    // journald when its socket is there (under systemd), stderr otherwise.
    match tracing_journald::layer() {
        // Fields as journald's own (`MESSAGE_ID=`, `WORKER=`, not the
        // crate's default `F_MESSAGE_ID=`), and priorities as systemd maps
        // them: info is 6, debug 7.
        Ok(journald) => registry
            .with(
                journald
                    .with_field_prefix(None)
                    .with_priority_mappings(tracing_journald::PriorityMappings {
                        info: tracing_journald::Priority::Informational,
                        debug: tracing_journald::Priority::Debug,
                        trace: tracing_journald::Priority::Debug,
                        ..tracing_journald::PriorityMappings::new()
                    })
                    .with_syslog_identifier("astraeusd".into()),
            )
            .init(),
        Err(_) => {
            registry
                .with(
                    tracing_subscriber::fmt::layer()
                        .with_writer(std::io::stderr)
                        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
                )
                .init();
            return false;
        }
    }
    true
}

/// A length of time in ms from the environment, for tests and the soak
/// (scripts/soak compresses a year: history kept seconds, retention every
/// few seconds); never set in a unit.
fn test_override_ms(var: &str) -> Option<std::time::Duration> {
    let ms = std::env::var(var).ok()?.parse::<u64>().ok()?;
    Some(std::time::Duration::from_millis(ms))
}

fn state_dir(args: &Args) -> PathBuf {
    if let Some(d) = &args.state_dir {
        return d.clone();
    }
    // A session daemon's ledger has one home on every systemd, whatever a
    // user unit's StateDirectory= maps to (store/home.rs).
    if args.session || args.bus_address.is_some() {
        return session_home(std::env::var_os("XDG_STATE_HOME"), ".local/state");
    }
    if let Some(d) = std::env::var_os("STATE_DIRECTORY") {
        // systemd may pass several, colon-separated: the first is ours.
        let first = d
            .to_string_lossy()
            .split(':')
            .next()
            .unwrap_or_default()
            .to_string();
        return PathBuf::from(first);
    }
    PathBuf::from("/var/lib/astraeus")
}

/// `$VAR/astraeus` for an XDG base directory variable's value, else
/// `~/<fallback>/astraeus` (a relative value is ignored, as the XDG spec
/// says).
fn session_home(var: Option<std::ffi::OsString>, fallback: &str) -> PathBuf {
    var.map(PathBuf::from)
        .filter(|d| d.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(fallback)))
        .unwrap_or_else(|| PathBuf::from("/tmp"))
        .join("astraeus")
}

/// The state directory is the daemon's alone (0700), whatever started it;
/// the store makes the ledger's own files 0600 ([`Store::open`]).
fn private_state(dir: &std::path::Path) -> Result<(), Error> {
    use std::os::unix::fs::PermissionsExt;
    let fail =
        |e: std::io::Error| Error::Backend(format!("state directory {}: {e}", dir.display()));
    std::fs::create_dir_all(dir).map_err(fail)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(fail)
}

/// The GPUs (UUIDs) the system bus's astraeusd manages, for a daemon that is
/// not it (a desktop's session daemon): those it must not hand out too. The
/// name is only looked up, never activated; no system bus, no daemon there,
/// or no answer within 2 s: none.
async fn system_daemon_gpus() -> Vec<String> {
    let ask = async {
        let conn = zbus::Connection::system().await.ok()?;
        let dbus = zbus::fdo::DBusProxy::new(&conn).await.ok()?;
        let name = zbus::names::BusName::try_from(astraeusd::bus::BUS_NAME).ok()?;
        if !dbus.name_has_owner(name).await.ok()? {
            return None;
        }
        let reply = conn
            .call_method(
                Some(astraeusd::bus::BUS_NAME),
                astraeusd::bus::BASE_PATH,
                Some("org.astraeus.Node1.Manager"),
                "ListGpus",
                &(),
            )
            .await
            .ok()?;
        let rows: Vec<astraeusd::wire::GpuRow> = reply.body().deserialize().ok()?;
        Some(rows.into_iter().map(|r| r.uuid).collect::<Vec<_>>())
    };
    let uuids = tokio::time::timeout(std::time::Duration::from_secs(2), ask)
        .await
        .ok()
        .flatten()
        .unwrap_or_default();
    for uuid in &uuids {
        tracing::warn!(
            "GPU {uuid} is managed by the system's astraeusd: this daemon leaves it alone \
             (one authority per GPU)"
        );
    }
    uuids
}

/// Err: the daemon could not start. Ok(Err): it started, then had to stop
/// (the ledger in a state only a restart reads again).
/// The engine container workers run through (`runtime::containers`), kept
/// in the ledger so that `auto` stays with it while its workers live.
async fn container_engine(
    node: &mut Node,
    config: &Config,
    wsl: bool,
) -> Result<
    (
        std::sync::Arc<dyn astraeusd::runtime::Runtime>,
        String,
        astraeusd::runtime::ContainerRuntime,
    ),
    Error,
> {
    use astraeusd::runtime::{ContainerRuntime, Kind};
    let live = node.workers().any(|w| {
        w.kind() == Some(Kind::Container) && w.state() != astraeusd::worker::State::Pending
    });
    let recorded = node.store().container_engine()?;
    let live_under = recorded
        .as_deref()
        .and_then(ContainerRuntime::parse)
        .filter(|_| live);
    let (rt, by, engine) = astraeusd::runtime::containers(&config.runtime, wsl, live_under).await;
    // Best effort: a start on a full disk must still open the ledger and
    // take stops; unrecorded, the next start probes again.
    if recorded.as_deref() != Some(engine.as_str()) {
        if let Err(e) = node.set_container_engine(engine.as_str()) {
            tracing::warn!("recording the container engine in the ledger failed: {e}");
        }
    }
    Ok((rt, by, engine))
}

/// Opens NVML for the inventory and, from the same library, what holds
/// shared workers' memory limits: NVML's r615 calls, else the kernel's
/// dmem controller under `sharing.cgroup_root`.
fn nvml_with_limits(
    config: &Config,
    limits: &mut Arc<dyn MemoryLimits>,
    opts: NvmlOptions,
) -> Result<NvmlSource, Error> {
    use astraeusd::inventory::limits::{Cgroups, DmemLimits, HostLimits, NvmlLimits};
    let mut source = NvmlSource::open(opts)?;
    let root = config.sharing.cgroup_root.clone();
    let (nvml, nvml_missing) =
        match NvmlLimits::open(source.library(), Cgroups::of_this_host(root.clone())) {
            Ok(n) => (Some(n), String::new()),
            Err(e) => (
                None,
                format!("NVML's memory limits could not be loaded ({e})"),
            ),
        };
    *limits = Arc::new(HostLimits {
        nvml,
        dmem: DmemLimits { root },
        nvml_missing,
    });
    source.set_limits(limits.clone());
    Ok(source)
}

async fn run(args: Args, lists: Lists) -> Result<Result<(), Error>, Error> {
    let (config_path, explicit) = match &args.config {
        Some(p) => (Some(p.clone()), true),
        None if args.session => (Config::session_path(), false),
        None => (Some(std::path::PathBuf::from(config::DEFAULT_PATH)), false),
    };
    let mut config = match &config_path {
        Some(path) => Config::load(path, explicit)?,
        None => Config::default(),
    };
    let runtime_dir = std::env::var_os("XDG_RUNTIME_DIR").map(std::path::PathBuf::from);
    if args.session {
        config = config.for_session(runtime_dir.as_deref());
    }
    let wsl = config.inventory.wsl.unwrap_or_else(inventory::detect_wsl);
    if wsl {
        config = config.for_wsl();
    }
    let machine_name = config.machine.clone().unwrap_or_else(inventory::host_name);
    let unable = |why: &str| -> Arc<dyn MemoryLimits> { Arc::new(Unable(why.into())) };
    let mut limits = unable("simulated GPU");
    let mut source: Box<dyn GpuSource> = match &args.sim {
        Some(None) => Box::new(SimSource::builtin()),
        Some(Some(p)) => Box::new(SimSource::file(p.clone())),
        None if !config.inventory.nvml => Box::new(NoGpus {
            machine: machine_name.clone(),
            wsl,
        }),
        None => Box::new(nvml_with_limits(
            &config,
            &mut limits,
            NvmlOptions {
                library: config.inventory.nvml_library.clone(),
                machine: machine_name.clone(),
                wsl,
                baseboard: config.inventory.baseboard.clone(),
                // One authority per GPU: off the system bus, defer to its daemon.
                managed_elsewhere: if args.session || args.bus_address.is_some() {
                    system_daemon_gpus().await
                } else {
                    Vec::new()
                },
                claims: astraeusd::inventory::claims::Claims::new(
                    args.session || args.bus_address.is_some(),
                ),
            },
        )?),
    };
    if wsl {
        limits = unable("WSL (its GPUs are the Windows host's: no per-container limits)");
    }
    let mut machine = source.read(&Own::default())?;
    if let Some(name) = &config.machine {
        machine.name = name.clone();
    }
    // A baseboard entry that names no GPU here (a typo, another host's
    // address) would leave the GPU it meant offered to shared work.
    for id in &config.inventory.baseboard {
        let named = std::slice::from_ref(id);
        if !machine
            .gpus
            .iter()
            .any(|g| astraeusd::inventory::on_baseboard(named, &g.uuid, &g.pci_bus_id))
        {
            tracing::warn!(
                "inventory.baseboard: {} is none of this machine's GPUs (by UUID or PCI \
                 address): nothing is kept for time-slicing by it",
                astraeusd::text::printable(id)
            );
        }
    }
    if astraeusd::auth::group_id(&config.access.group).is_none() {
        tracing::warn!(
            "access.group: no group named {} on this host: only root may submit and stop \
             workers until it exists",
            astraeusd::text::printable(&config.access.group)
        );
    }
    let dir = state_dir(&args);
    private_state(&dir)?;
    // A session daemon's ledger an older build left where systemd < 254
    // put a user unit's StateDirectory=: carried over once.
    if args.session && args.state_dir.is_none() {
        let old = session_home(std::env::var_os("XDG_CONFIG_HOME"), ".config").join("ledger.db");
        astraeusd::store::home::carry_over(&old, &dir.join("ledger.db"))?;
    }
    let mut store = Store::open(&dir.join("ledger.db"))?;
    store.set_min_free(config.history.min_free_mb.saturating_mul(1_000_000));
    let mut node = Node::open(store, machine)?;
    // Now that the workers' holder pids are known, read again so their GPU
    // memory counts as theirs and not as outside.
    let mut machine = source.read(&node.own())?;
    if let Some(name) = &config.machine {
        machine.name = name.clone();
    }
    node.set_machine(machine)?;
    tracing::info!(
        "ledger {} loaded: {} running, {} pending",
        dir.join("ledger.db").display(),
        node.running_count(),
        node.pending_count()
    );

    let builder = if let Some(addr) = &args.bus_address {
        zbus::connection::Builder::address(addr.as_str())
    } else if args.session {
        zbus::connection::Builder::session()
    } else {
        zbus::connection::Builder::system()
    };
    let conn = builder
        .build()
        .await
        .map_err(|e| Error::Backend(format!("connecting to the bus: {e}")))?;
    // A std listener, bound before the service so that its address is a
    // property of the Manager: the page is served on the lists runtime,
    // whose driver it is registered with there.
    let listener = match config.http.address()? {
        None => None,
        Some(addr) => match std::net::TcpListener::bind(addr).and_then(|l| {
            l.set_nonblocking(true)?;
            Ok(l)
        }) {
            Ok(l) => Some((addr, l)),
            // The session default: a port in use costs the page only.
            Err(e) if config.http.listen_by_default => {
                tracing::warn!("no machine page: cannot listen on {addr}: {e} (set [http] listen)");
                None
            }
            // The configuration is fine; the host is not (a port in use).
            Err(e) => {
                return Err(Error::Backend(format!(
                    "http.listen: cannot listen on {addr}: {e}"
                )))
            }
        },
    };
    // One libvirt connection (and event loop) for VM workers and templates.
    let libvirt = (!config.runtime.libvirt_uri.is_empty())
        .then(|| std::sync::Arc::new(Libvirt::new(&config.runtime.libvirt_uri)));
    let (containers, containers_by, engine) = container_engine(&mut node, &config, wsl).await?;
    let settings = Settings {
        limits,
        hard_limit: config.sharing.hard_limit,
        // SAFETY: geteuid cannot fail.
        owner: (args.session || args.bus_address.is_some()).then(|| unsafe { libc::geteuid() }),
        config: config_path.map(|path| astraeusd::service::reload::Loaded {
            path,
            explicit,
            session: args.session.then_some(runtime_dir),
            config: config.clone(),
        }),
        refresh: config.refresh(),
        drain_after: config.placement.drain_after(),
        machine_name: config.machine.clone(),
        group: config.access.group.clone(),
        slice_rules: SliceRules {
            tz: config.time_zone()?,
            buffer: std::time::Duration::from_secs(config.schedule.handoff_buffer_seconds),
        },
        usage_interval: std::time::Duration::from_secs(config.usage.interval_seconds.max(1)),
        containers: Some(containers),
        containers_by,
        containers_engine: Some(engine),
        units: Some(std::sync::Arc::new(Units {
            conn: conn.clone(),
            stop_timeout: std::time::Duration::from_secs(config.runtime.stop_timeout_seconds),
            defaults: astraeusd::runtime::unit::Defaults {
                cpu_cores: astraeusd::quantity::Amount::whole(u64::from(
                    config.runtime.unit_default_cpu_cores,
                )),
                memory_bytes: config
                    .runtime
                    .unit_default_memory_gb
                    .saturating_mul(astraeusd::quantity::GB_BYTES),
            },
        })),
        vms: libvirt
            .clone()
            .map(|l| l as std::sync::Arc<dyn astraeusd::runtime::Runtime>),
        templates: libvirt,
        stop_timeout: std::time::Duration::from_secs(config.runtime.stop_timeout_seconds),
        member_max_processes: config.runtime.member_max_processes,
        containers_for_group: config.access.containers_for_group,
        max_workers_per_user: config.access.max_workers_per_user,
        max_pending_per_user: config.access.max_pending_per_user,
        max_submits_per_minute: config.access.max_submits_per_minute,
        max_request_mib_per_user: config.access.max_request_mib_per_user,
        keep_history: test_override_ms("ASTRAEUS_HISTORY_KEEP_MS")
            .unwrap_or_else(|| config.history.keep()),
        retention_every: test_override_ms("ASTRAEUS_RETENTION_EVERY_MS")
            .unwrap_or(std::time::Duration::from_secs(3600)),
        vms_for_group: config.access.vms_for_group,
        allow_networked_weights: config.slicing.allow_networked_weights,
        allow_no_baseboard: config.slicing.allow_no_baseboard,
        between_slices: config.slicing.between_slices.clone(),
        between_slices_within: std::time::Duration::from_secs(
            config.slicing.between_slices_timeout_seconds,
        ),
        between_slices_retry: test_override_ms("ASTRAEUS_BETWEEN_SLICES_RETRY_MS")
            .unwrap_or(astraeusd::service::BETWEEN_SLICES_RETRY),
        page: listener
            .as_ref()
            .map_or_else(String::new, |(addr, _)| format!("http://{addr}/")),
        lists: lists.clone(),
    };
    let mut service = Service::register(node, source, conn.clone(), settings).await?;
    if let Some((addr, listener)) = listener {
        tracing::info!("machine page on http://{addr}/");
        let mut names = config.http.names.clone();
        names.push(inventory::host_name());
        let hosts = astraeusd::web::Hosts { names };
        let (commands, objects) = (service.commands(), service.objects());
        lists.spawn(async move {
            match tokio::net::TcpListener::from_std(listener) {
                Ok(l) => astraeusd::web::serve(l, commands, objects, hosts).await,
                Err(e) => tracing::error!("no machine page: {e}"),
            }
        });
    }
    // The name last: once it is owned, every object is already there.
    conn.request_name_with_flags(BUS_NAME, zbus::fdo::RequestNameFlags::DO_NOT_QUEUE)
        .await
        .map_err(|e| {
            Error::Conflict(format!(
                "cannot own {BUS_NAME}: {e} (is another astraeusd running?)"
            ))
        })?;
    let status = service.ready();
    tracing::info!(
        message_id = astraeusd::journal::LIFECYCLE,
        "ready on {BUS_NAME}: {status}"
    );
    Ok(service.run().await)
}

/// `--check-config`: the file a start would read, checked as a start
/// checks it, said in plain words on stdout (fine) or stderr (not).
fn check_config(args: &Args) -> std::process::ExitCode {
    let path = match &args.config {
        Some(p) => Some(p.clone()),
        None if args.session => Config::session_path(),
        None => Some(std::path::PathBuf::from(config::DEFAULT_PATH)),
    };
    let Some(path) = path else {
        println!("no configuration file (neither $XDG_CONFIG_HOME nor $HOME): the daemon would run on its defaults");
        return std::process::ExitCode::SUCCESS;
    };
    if args.config.is_none() && !path.exists() {
        println!(
            "{}: not there; the daemon would run on its defaults",
            path.display()
        );
        return std::process::ExitCode::SUCCESS;
    }
    match Config::load(&path, true) {
        Ok(_) => {
            println!("{}: ok", path.display());
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            eprintln!("astraeusd: {}", config::explained(&path, &text, &e));
            std::process::ExitCode::FAILURE
        }
    }
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    if args.check_config {
        return check_config(&args);
    }
    let to_journal = init_logging();
    astraeusd::bus::tree::tune_allocator();
    // One thread runs the service loop and the bus: a call, its change, its
    // commit and its reply pass no work between threads (on 2 vCPUs each
    // hand-over cost a wake-up of tens of µs, #25). The loop never awaits a
    // hypervisor, a container runtime or the network (tasks and the
    // blocking pool do), and the listings, whose cost grows with the
    // workers, run on a runtime of their own (bus/offload.rs), as does the
    // machine page. What the loop's turns do themselves (the ledger's
    // writes, the inventory's reading each refresh) holds the bus while it
    // runs: docs/architecture.md, "Threads".
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let lists = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("astraeus-lists")
        .enable_all()
        .build()
        .expect("tokio runtime for listings");
    let result = rt.block_on(run(args, lists.handle().clone()));
    // A call still waiting on a hung libvirtd (on the blocking pool) must not
    // hold the exit: the ledger is already closed cleanly.
    rt.shutdown_timeout(std::time::Duration::from_secs(2));
    lists.shutdown_timeout(std::time::Duration::from_secs(1));
    match result {
        Ok(Ok(())) => std::process::ExitCode::SUCCESS,
        Ok(Err(e)) => {
            tracing::error!(message_id = astraeusd::journal::LIFECYCLE, "stopped: {e}");
            std::process::ExitCode::FAILURE
        }
        Err(e) => {
            // In plain words: the kinds are D-Bus errors' names, not a
            // reader's of the journal.
            let e = e.message();
            tracing::error!("cannot start: {e}");
            // Said once: on stderr too only when the log went to the journal
            // and stderr is not the journal as well (a terminal, say).
            if to_journal && std::env::var_os("JOURNAL_STREAM").is_none() {
                eprintln!("astraeusd: cannot start: {e}");
            }
            std::process::ExitCode::FAILURE
        }
    }
}
