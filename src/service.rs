//! The one service loop: it owns the node (state, ledger) and the GPU source.
//! D-Bus handlers send it commands over a bounded queue; it runs them one at a
//! time, then brings the bus objects up to date and signals what changed. It
//! also feeds the systemd watchdog itself, so a stuck loop stops the pings.

use crate::auth::Caller;
use crate::bus::objects::{
    GpuObject, GpuView, Manager, ManagerSignals, ManagerView, RotationView, Shared, SlicingView,
    TemplateObject, Waits, WorkerObject, WorkerView,
};
use crate::bus::{gpu_path, template_path, worker_path, Loop};
use crate::error::{Error, Result};
use crate::failpoint;
use crate::inventory::GpuSource;
use crate::journal;
use crate::node::{Changes, Node, Phase, Rotation, Worker};
use crate::placement::{self, Gpu};
use crate::request::Run;
use crate::runtime::{Exit, Kind, Runtime};
use crate::slicer::Slicer;
use crate::usage::Sampler;
use sd_notify::NotifyState;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{mpsc, oneshot};
use zbus::{Connection, OwnedObjectPath};

type Reply<T> = oneshot::Sender<T>;

/// (name, state, owner uid, GPUs column, GB its processes use now per GPU at most; -1 unknown)
pub type WorkerRow = (String, String, u32, String, f64);
/// (index, uuid, model, mode, total, offered, held outside, taken (GB), warning)
pub type GpuRow = (u32, String, String, String, f64, f64, f64, f64, String);
/// (sharers with their GB, summary line)
pub type SharersReply = (Vec<(String, f64)>, String);
/// (fits, GPU indexes it would take, reasons it would wait)
pub type WhyNotReply = (bool, Vec<u32>, Vec<String>);
/// (name, state, pending reasons)
pub type SubmitReply = (String, String, Vec<String>);

/// What handlers ask of the loop.
pub enum Command {
    Submit {
        spec: String,
        caller: Caller,
        reply: Reply<Result<SubmitReply>>,
    },
    Stop {
        name: String,
        caller: Caller,
        reply: Reply<Result<()>>,
    },
    GetWorker {
        name: String,
        reply: Reply<Result<String>>,
    },
    ListWorkers {
        reply: Reply<Vec<WorkerRow>>,
    },
    ListGpus {
        reply: Reply<Vec<GpuRow>>,
    },
    ListSharers {
        gpu: u32,
        reply: Reply<Result<SharersReply>>,
    },
    WhyNot {
        spec: String,
        reply: Reply<Result<WhyNotReply>>,
    },
    SetSchedule {
        template: String,
        actions: String,
        caller: Caller,
        reply: Reply<Result<()>>,
    },
    GetSchedule {
        template: String,
        reply: Reply<Result<String>>,
    },
    ListSlices {
        from: i64,
        to: i64,
        reply: Reply<Result<Vec<SliceRow>>>,
    },
    ListSliceNotes {
        from: i64,
        to: i64,
        reply: Reply<Result<Vec<String>>>,
    },
    /// Time-slicing: a template and its persistent VM (root only).
    CreateTemplate {
        spec: String,
        caller: Caller,
        reply: Reply<Result<String>>,
    },
    RemoveTemplate {
        name: String,
        caller: Caller,
        reply: Reply<Result<()>>,
    },
    /// (name, user, domain, state) of every template.
    ListTemplates {
        reply: Reply<Vec<(String, String, String, String)>>,
    },
    /// A person's resume or power-off of a template's VM (root only).
    Resume {
        template: String,
        as_handoff: bool,
        caller: Caller,
        reply: Reply<Result<()>>,
    },
    PowerOff {
        template: String,
        hard: bool,
        caller: Caller,
        reply: Reply<Result<()>>,
    },
    /// Builds a template's weights disk from a source directory (root only).
    StageWeights {
        template: String,
        source: String,
        caller: Caller,
        reply: Reply<Result<()>>,
    },
    /// From the staging task: done (or failed).
    WeightsStaged {
        template: String,
        result: Result<(String, bool)>,
    },
    /// A handoff event from a libvirt task (a failed create, a release confirmed…).
    Slice(crate::slicing::handoff::Event),
    /// One GPU's figures, from what the running slice's guest wrote.
    GuestGpu {
        template: String,
        sample: crate::slicer::GpuSample,
        at_ms: u64,
    },
    SliceReport {
        template: String,
        from: i64,
        to: i64,
        reply: Reply<Result<Vec<crate::bus::objects::SliceReportRow>>>,
    },
    /// Everything the machine page shows, in one go.
    Snapshot {
        reply: Reply<crate::web::Snapshot>,
    },
    UsageReport {
        from: i64,
        to: i64,
        group_by: String,
        reply: Reply<Result<Vec<crate::bus::objects::UsageRow>>>,
    },
    /// From a launch task: the workload started (its runtime id) or failed.
    Launched {
        name: String,
        kind: Kind,
        result: Result<String>,
    },
    /// A launched workload's control group, once its runtime told it.
    Cgroup {
        name: String,
        cgroup: String,
    },
    /// From a watcher: the workload ended.
    Exited {
        name: String,
        kind: Kind,
        id: String,
        exit: Exit,
    },
}

/// Time-slicing settings the loop applies to schedules.
pub struct SliceRules {
    pub tz: jiff::tz::TimeZone,
    pub buffer: Duration,
}

/// What the loop takes from the configuration.
pub struct Settings {
    pub refresh: Duration,
    /// The machine name from config, overriding the source's.
    pub machine_name: Option<String>,
    /// Members (and root) may submit and stop workers.
    pub group: String,
    pub slice_rules: SliceRules,
    /// Energy and utilisation samples are closed into a ledger row this often.
    pub usage_interval: Duration,
    /// Podman, when configured; container workers are refused without it.
    pub containers: Option<Arc<dyn Runtime>>,
    /// The service manager, for unit workers.
    pub units: Option<Arc<dyn Runtime>>,
    /// libvirt, for VM workers.
    pub vms: Option<Arc<dyn Runtime>>,
    /// libvirt, for time-slicing templates (the same connection as `vms`).
    pub templates: Option<Arc<crate::runtime::libvirt::Libvirt>>,
    /// Graceful stop, then forced after this long.
    pub stop_timeout: Duration,
    /// Whether members of the access group may run containers (root-equivalent).
    pub containers_for_group: bool,
    /// Whether members of the access group may run VMs (root-equivalent).
    pub vms_for_group: bool,
    /// Accept weights disks on networked filesystems (`slicing.allow_networked_weights`).
    pub allow_networked_weights: bool,
}

/// Samples kept per GPU in memory (an hour at the default 2 s refresh).
const SAMPLES_KEPT: usize = 1800;

/// How far ahead a new schedule is checked for conflicts.
const SCHEDULE_HORIZON_DAYS: i64 = 400;
/// The longest window ListSlices answers for.
const MAX_SLICE_WINDOW_DAYS: i64 = 400;

/// (template, start, end (epoch seconds), how it ends: poweroff, poweroff-hard, handoff:<to>, open)
pub type SliceRow = (String, i64, i64, String);

/// Bounded: a flood of calls gets `Busy` instead of growing memory.
pub const QUEUE_DEPTH: usize = 256;

pub struct Service {
    node: Node,
    source: Box<dyn GpuSource>,
    conn: Connection,
    rx: mpsc::Receiver<Command>,
    lp: Loop,
    refresh: Duration,
    /// The machine name from config, overriding the source's.
    machine_name: Option<String>,
    /// GPU objects currently on the bus, by index.
    gpu_objects: BTreeSet<u32>,
    slice_rules: SliceRules,
    sampler: Sampler,
    /// What template objects compute their slices from.
    rotation: Shared<RotationView>,
    containers: Option<Arc<dyn Runtime>>,
    units: Option<Arc<dyn Runtime>>,
    vms: Option<Arc<dyn Runtime>>,
    stop_timeout: Duration,
    containers_for_group: bool,
    vms_for_group: bool,
    /// Time-slicing (None without libvirt).
    slicer: Option<crate::slicer::Slicer>,
    /// What template objects show of it, and which objects exist.
    slicing: Shared<SlicingView>,
    template_objects: BTreeSet<String>,
    /// What worker objects explain waits from.
    waits: Waits,
    /// What a group commit holds until its fsync.
    held: Held,
}

/// A reply to send once its group is synced: told the sync's error, if any.
type HeldReply = Box<dyn FnOnce(Option<&Error>) + Send>;

/// At most this many submits and stops share one fsync.
const GROUP: usize = 64;

/// Replies, signals and launches of a group's changes, sent once it is durable.
#[derive(Default)]
struct Held {
    replies: Vec<HeldReply>,
    shown: Vec<Shown>,
    placed: Vec<String>,
}

fn to_f64(a: crate::quantity::Amount) -> f64 {
    a.as_f64()
}

pub fn manager_view(node: &Node, tz: &jiff::tz::TimeZone) -> ManagerView {
    ManagerView {
        machine: node.machine().name.clone(),
        time_zone: tz.iana_name().unwrap_or("UTC").to_string(),
        wsl: node.machine().wsl,
        running: node.running_count() as u32,
        pending: node.pending_count() as u32,
    }
}

pub fn gpu_view(node: &Node, g: &Gpu) -> GpuView {
    let usage = node.book().usage(&g.uuid);
    GpuView {
        index: g.index,
        uuid: g.uuid.clone(),
        model: g.model.clone(),
        vendor: g.vendor.clone(),
        mode: if g.sliced {
            "time-sliced".into()
        } else {
            node.gpu_mode(&g.uuid).as_str().into()
        },
        total_gb: to_f64(g.total),
        offered_gb: to_f64(g.offered()),
        held_outside_gb: to_f64(g.outside),
        taken_gb: to_f64(node.book().taken(&g.uuid)),
        sharers: usage
            .map(|u| {
                u.sharers
                    .iter()
                    .map(|(n, a)| (n.clone(), to_f64(*a)))
                    .collect()
            })
            .unwrap_or_default(),
        summary: placement::sharers_line(usage),
        warning: node.gpu_warning(g).unwrap_or_default(),
        pci_bus_id: g.pci_bus_id.clone(),
        power_w: g.power_mw.map_or(-1.0, |mw| mw as f64 / 1000.0),
        utilization_pct: g.utilization_pct.map_or(-1, |u| u as i32),
    }
}

/// The most GPU memory a worker's processes use on any one of its GPUs, in
/// GB; -1 when the driver cannot tell.
pub fn used_gb(node: &Node, w: &Worker) -> f64 {
    let uses = node.worker_use(w);
    if uses.iter().any(|(_, u)| u.is_none()) {
        return -1.0;
    }
    let max = uses.iter().filter_map(|(_, u)| *u).max().unwrap_or(0);
    crate::quantity::Amount::gb_from_bytes_ceil(max).as_f64()
}

/// What a warning is about, without its changing numbers: a breach or an
/// over-promise is logged once, not at every refresh.
fn warning_key(w: &str) -> &str {
    let end = w.find([':', '(']).unwrap_or(w.len());
    &w[..end]
}

pub fn worker_view(node: &Node, w: &Worker) -> WorkerView {
    WorkerView {
        gpu_used_gb: used_gb(node, w),
        warnings: node.worker_warnings(w),
        name: w.name().to_string(),
        state: w.state().to_string(),
        owner: w.owner_uid,
        gpus: w
            .grants()
            .iter()
            .map(|g| (g.gpu_index, g.gpu_uuid.clone()))
            .collect(),
        gpu_shared_gb: w.spec.shared_gb().map(to_f64).unwrap_or(0.0),
        holders: w.holders.clone(),
        request: w.spec_text.clone(),
        request_redacted: redact_env(&w.spec_text),
    }
}

/// The request with `run.<kind>.env` values replaced, for callers other than
/// the owner and root (env often carries tokens).
pub fn redact_env(spec: &str) -> String {
    let Ok(mut v) = serde_json::from_str::<serde_json::Value>(spec) else {
        return String::new();
    };
    if let Some(run) = v.get_mut("run").and_then(|r| r.as_object_mut()) {
        for body in run.values_mut() {
            if let Some(env) = body.get_mut("env").and_then(|e| e.as_object_mut()) {
                for val in env.values_mut() {
                    *val = serde_json::Value::String("(hidden)".into());
                }
            }
        }
    }
    v.to_string()
}

fn status_line(node: &Node) -> String {
    let total = node.running_count() + node.pending_count();
    format!(
        "{total} worker{}, {} pending",
        if total == 1 { "" } else { "s" },
        node.pending_count()
    )
}

fn obj_path(p: String) -> OwnedObjectPath {
    OwnedObjectPath::try_from(p).expect("paths are built from escaped labels")
}

impl Service {
    /// Registers every object for the node's current state on `conn`.
    /// The caller requests the bus name afterwards, then calls [`Service::run`].
    pub async fn register(
        node: Node,
        source: Box<dyn GpuSource>,
        conn: Connection,
        settings: Settings,
    ) -> Result<Service> {
        let (tx, rx) = mpsc::channel(QUEUE_DEPTH);
        let Settings {
            refresh,
            machine_name,
            group,
            slice_rules,
            usage_interval,
            containers,
            units,
            vms,
            templates,
            stop_timeout,
            containers_for_group,
            vms_for_group,
            allow_networked_weights,
        } = settings;
        let lp = Loop {
            tx,
            group,
            facts: Default::default(),
            in_flight: Default::default(),
        };
        let server = conn.object_server();
        let bus_err = |e: zbus::Error| Error::Backend(format!("D-Bus: {e}"));
        server
            .at(
                crate::bus::BASE_PATH,
                Manager {
                    lp: lp.clone(),
                    view: Shared::new(manager_view(&node, &slice_rules.tz)),
                },
            )
            .await
            .map_err(bus_err)?;
        server
            .at(crate::bus::BASE_PATH, zbus::fdo::ObjectManager)
            .await
            .map_err(bus_err)?;
        let mut gpu_objects = BTreeSet::new();
        for g in &node.machine().gpus {
            server
                .at(
                    gpu_path(g.index),
                    GpuObject {
                        view: Shared::new(gpu_view(&node, g)),
                    },
                )
                .await
                .map_err(bus_err)?;
            gpu_objects.insert(g.index);
        }
        let waits = Waits::default();
        waits.replace(node.snapshot());
        for w in node.workers() {
            server
                .at(
                    worker_path(w.name()),
                    WorkerObject {
                        lp: lp.clone(),
                        view: Shared::new(worker_view(&node, w)),
                        resources: w.spec.resources.clone(),
                        waits: waits.clone(),
                    },
                )
                .await
                .map_err(bus_err)?;
        }
        let rotation = Shared::new(RotationView {
            templates: node.rotation(),
            tz: slice_rules.tz.clone(),
        });
        let slicer = templates.map(|vms| {
            let mut s = crate::slicer::Slicer::new(
                vms,
                crate::slicing::handoff::Settings {
                    buffer_ms: slice_rules.buffer.as_millis() as u64,
                    poll_ms: 1000,
                    limits: crate::slicing::handoff::Limits {
                        stop_timeout_ms: stop_timeout.as_millis() as u64,
                        start_retries: crate::slicing::handoff::DEFAULT_START_RETRIES,
                    },
                    per_template: Default::default(),
                },
                lp.tx.clone(),
            );
            s.allow_networked_weights = allow_networked_weights;
            for (name, spec) in node.templates().unwrap_or_default() {
                match crate::slicer::Slicer::restore(&spec) {
                    Ok(d) => {
                        s.templates.insert(name, d);
                    }
                    Err(e) => tracing::error!(template = %name, "template {name} unreadable: {e}"),
                }
            }
            s.refresh_limits();
            if !s.templates.is_empty() {
                s.watch_events();
            }
            s
        });
        let mut service = Service {
            node,
            source,
            conn,
            rx,
            lp,
            refresh,
            machine_name,
            gpu_objects,
            slice_rules,
            sampler: Sampler::new(usage_interval.as_millis() as i64, SAMPLES_KEPT),
            rotation,
            containers,
            units,
            vms,
            stop_timeout,
            containers_for_group,
            vms_for_group,
            slicer,
            slicing: Shared::new(SlicingView::default()),
            template_objects: BTreeSet::new(),
            waits,
            held: Held::default(),
        };
        service.publish_templates().await.map_err(bus_err)?;
        Ok(service)
    }

    /// Where other adaptors (the machine page) send their commands.
    pub fn commands(&self) -> mpsc::Sender<Command> {
        self.lp.tx.clone()
    }

    pub fn status_line(&self) -> String {
        status_line(&self.node)
    }

    /// Runs until SIGTERM/SIGINT: commands, inventory refresh, SIGHUP, watchdog.
    pub async fn run(mut self) -> Result<()> {
        let io = |e: std::io::Error| Error::Backend(format!("signals: {e}"));
        let mut term = signal(SignalKind::terminate()).map_err(io)?;
        let mut int = signal(SignalKind::interrupt()).map_err(io)?;
        let mut hup = signal(SignalKind::hangup()).map_err(io)?;
        let mut refresh = tokio::time::interval(self.refresh);
        refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Ping at half the watchdog period; without a watchdog this never fires.
        let watchdog = sd_notify::watchdog_enabled();
        let mut ping = tokio::time::interval(watchdog.map_or(Duration::from_secs(3600), |d| d / 2));
        if let Err(e) = self.node.begin_run(crate::store::now_ms()) {
            tracing::error!("recording this run in the ledger failed: {e}");
        }
        self.reconcile().await;
        self.converge_slices().await;
        loop {
            // A test can stall exactly this loop here: the pings must stop with it.
            failpoint::hit("service.loop");
            // Time-slicing's wake-ups: the handoff's timer and the next
            // scheduled action (timers, not polling).
            let now_ms = crate::slicer::now_ms();
            let handoff_in = self
                .slicer
                .as_ref()
                .and_then(|s| s.timer_ms)
                .map(|t| Duration::from_millis(t.saturating_sub(now_ms)));
            let due = self.slicer.as_ref().and_then(|s| {
                let r = self.rotation.read();
                s.next_due(&r.templates, &r.tz)
            });
            let due_in = due.as_ref().map(|(t, _)| {
                Duration::from_millis((t.as_millisecond() - now_ms as i64).max(0) as u64)
            });
            let lifecycle = async {
                match self.slicer.as_mut() {
                    Some(Slicer {
                        events: Some(events),
                        ..
                    }) => events.recv().await.ok(),
                    _ => std::future::pending().await,
                }
            };
            tokio::select! {
                cmd = self.rx.recv() => match cmd {
                    Some(cmd) => self.handle_group(cmd).await,
                    None => break,
                },
                ev = lifecycle => {
                    if let Some(ev) = ev {
                        let event = match self.slicer.as_ref() {
                            Some(s) => s.lifecycle(&ev).await,
                            None => None,
                        };
                        if let Some(event) = event {
                            let _ = self.slice(event).await;
                        }
                    }
                }
                _ = sleep_or_never(handoff_in) => {
                    if let Some(s) = self.slicer.as_mut() {
                        s.timer_ms = None;
                    }
                    let at_ms = crate::slicer::now_ms();
                    let _ = self.slice(crate::slicing::handoff::Event::Timer { at_ms }).await;
                }
                _ = sleep_or_never(due_in) => {
                    if let Some((t, list)) = due {
                        if let Some(s) = self.slicer.as_mut() {
                            s.cursor = t;
                        }
                        // A sign of life at each fired action: after a crash,
                        // only actions past it count as skipped.
                        let _ = self.node.alive(crate::store::now_ms());
                        for (template, action) in list {
                            tracing::info!(template = %template, "scheduled {action:?} of {template} is due");
                            let at_ms = t.as_millisecond().max(0) as u64;
                            let _ = self
                                .slice(crate::slicing::handoff::Event::Due { action, template, at_ms })
                                .await;
                        }
                    }
                }
                _ = refresh.tick() => {
                    if self.source.changed() {
                        self.reread("the inventory changed").await;
                    }
                    self.sample();
                    self.meter_slice().await;
                }
                _ = hup.recv() => self.reread("SIGHUP").await,
                _ = ping.tick(), if watchdog.is_some() => {
                    let _ = sd_notify::notify(&[NotifyState::Watchdog]);
                }
                _ = term.recv() => break,
                _ = int.recv() => break,
            }
        }
        let _ = sd_notify::notify(&[NotifyState::Stopping]);
        if let Err(e) = self.node.alive(crate::store::now_ms()) {
            tracing::error!("recording the end of this run failed: {e}");
        }
        tracing::info!(
            message_id = journal::LIFECYCLE,
            "stopping; the ledger is closed cleanly"
        );
        Ok(())
    }

    /// Keeps this refresh's energy and utilisation readings; closed intervals go to the ledger.
    fn sample(&mut self) {
        let now = crate::store::now_ms();
        let rows = self.sampler.record(now, &self.node.machine().gpus);
        if !rows.is_empty() {
            if let Err(e) = self.node.record_usage(&rows, now) {
                tracing::error!("recording GPU usage intervals failed: {e}");
            }
        }
    }

    async fn reread(&mut self, why: &str) {
        // Processes in workers' control groups count as theirs (their GPU memory is not outside).
        for (name, cgroup) in self.node.cgroups() {
            let pids = crate::runtime::cgroup_pids(std::path::Path::new("/sys/fs/cgroup"), &cgroup);
            self.node.set_cgroup_pids(&name, pids);
        }
        match self.source.read(&self.node.own()) {
            Ok(mut machine) => {
                if let Some(name) = &self.machine_name {
                    machine.name = name.clone();
                }
                match self.node.set_machine(machine) {
                    Ok(changes) => {
                        tracing::debug!("re-read the machine ({why})");
                        self.publish(&changes).await;
                        self.launch_placed(&changes.placed).await;
                    }
                    Err(e) => tracing::error!("applying the new inventory failed: {e}"),
                }
            }
            Err(e) => tracing::warn!("re-reading the machine ({why}) failed: {e}"),
        }
    }

    /// Group commit: a submit or stop, and every submit or stop queued behind
    /// it (up to [`GROUP`]), are applied one by one, each its own transaction,
    /// then made durable by one fsync; only then do their callers get replies
    /// and the bus the signals. Any other command is handled on its own.
    async fn handle_group(&mut self, first: Command) {
        let groups = |c: &Command| matches!(c, Command::Submit { .. } | Command::Stop { .. });
        if !groups(&first) {
            return self.handle(first).await;
        }
        if let Err(e) = self.node.defer_sync() {
            tracing::error!("group commit: {e}");
        }
        let mut next = Some(first);
        let mut taken = 0;
        while let Some(cmd) = next.take() {
            self.handle(cmd).await;
            taken += 1;
            if taken < GROUP {
                match self.rx.try_recv() {
                    Ok(c) if groups(&c) => next = Some(c),
                    Ok(other) => {
                        self.release().await;
                        return self.handle(other).await;
                    }
                    Err(_) => {}
                }
            }
        }
        self.release().await;
    }

    /// The one fsync of a group, then what it held: replies, signals, launches.
    async fn release(&mut self) {
        let synced = self.node.sync();
        if let Err(e) = &synced {
            tracing::error!("{e}");
        }
        let held = std::mem::take(&mut self.held);
        for reply in held.replies {
            reply(synced.as_ref().err());
        }
        for shown in held.shown {
            self.announce(shown).await;
        }
        self.launch_placed(&held.placed).await;
    }

    /// A change's reply, signals and launches, held until its group is durable.
    fn hold<T: Send + 'static>(
        &mut self,
        reply: Reply<Result<T>>,
        value: T,
        shown: Shown,
        placed: Vec<String>,
    ) {
        self.held
            .replies
            .push(Box::new(move |failed: Option<&Error>| {
                let _ = reply.send(match failed {
                    None => Ok(value),
                    Some(e) => Err(e.clone()),
                });
            }));
        self.held.shown.push(shown);
        self.held.placed.extend(placed);
    }

    async fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Submit {
                spec,
                caller,
                reply,
            } => {
                let r = if !caller.may_mutate() {
                    Err(Error::AccessDenied(format!(
                        "uid {} may not submit workers: only root and members of group {} may",
                        caller.uid, self.lp.group
                    )))
                } else {
                    crate::request::WorkerSpec::parse(&spec).and_then(|parsed| {
                        self.may_run(&parsed, &caller)?;
                        self.node
                            .submit_parsed(parsed, &spec, caller.uid, caller.pid)
                    })
                };
                match r {
                    Ok((name, changes)) => {
                        let w = self.node.worker(&name).expect("just submitted");
                        let out = (
                            name.clone(),
                            w.state().to_string(),
                            self.node.reasons(&name),
                        );
                        // Objects and views now (a caller reads them after the
                        // reply); the reply, signals and launches once durable.
                        let shown = self.show(&changes).await;
                        self.hold(reply, out, shown, changes.placed);
                    }
                    Err(e) => {
                        let _ = reply.send(Err(e));
                    }
                }
            }
            Command::Stop {
                name,
                caller,
                reply,
            } => {
                if !caller.may_mutate() {
                    let _ = reply.send(Err(Error::AccessDenied(format!(
                        "uid {} may not stop workers: only root and members of group {} may",
                        caller.uid, self.lp.group
                    ))));
                    return;
                }
                let launched = match self.node.check_stop(&name, caller.uid) {
                    Err(e) => {
                        let _ = reply.send(Err(e));
                        return;
                    }
                    Ok(w) => w.launches() && w.state() != "pending",
                };
                if launched {
                    // The share frees when the runtime reports the workload gone.
                    self.stop_workload(&name).await;
                    let _ = reply.send(Ok(()));
                } else {
                    match self.node.stop(&name, caller.uid) {
                        Ok(changes) => {
                            let shown = self.show(&changes).await;
                            self.hold(reply, (), shown, changes.placed);
                        }
                        Err(e) => {
                            let _ = reply.send(Err(e));
                        }
                    }
                }
            }
            Command::GetWorker { name, reply } => {
                let r = match self.node.worker(&name) {
                    Some(w) => Ok(w.name().to_string()),
                    None => Err(Error::NotFound(format!("no live worker named {name}"))),
                };
                let _ = reply.send(r);
            }
            Command::ListWorkers { reply } => {
                let rows = self
                    .node
                    .workers()
                    .map(|w| {
                        (
                            w.name().to_string(),
                            w.status.as_str().to_string(),
                            w.owner_uid,
                            placement::gpus_column(w.grants()),
                            used_gb(&self.node, w),
                        )
                    })
                    .collect();
                let _ = reply.send(rows);
            }
            Command::ListGpus { reply } => {
                let rows = self
                    .node
                    .machine()
                    .gpus
                    .iter()
                    .map(|g| {
                        let v = gpu_view(&self.node, g);
                        (
                            v.index,
                            v.uuid,
                            v.model,
                            v.mode,
                            v.total_gb,
                            v.offered_gb,
                            v.held_outside_gb,
                            v.taken_gb,
                            v.warning,
                        )
                    })
                    .collect();
                let _ = reply.send(rows);
            }
            Command::ListSharers { gpu, reply } => {
                let r = match self.node.machine().gpus.iter().find(|g| g.index == gpu) {
                    Some(g) => {
                        let v = gpu_view(&self.node, g);
                        Ok((v.sharers, v.summary))
                    }
                    None => Err(Error::NotFound(format!(
                        "gpu: {} has no GPU {gpu}; it has {}",
                        self.node.machine().name,
                        describe_indexes(&self.node)
                    ))),
                };
                let _ = reply.send(r);
            }
            Command::SetSchedule {
                template,
                actions,
                caller,
                reply,
            } => {
                let r = if caller.uid != 0 {
                    Err(Error::AccessDenied(format!(
                        "uid {} may not set schedules: the GPU baseboard's rotation is root's to change",
                        caller.uid
                    )))
                } else {
                    let rules = Rotation {
                        now: jiff::Timestamp::now(),
                        tz: self.slice_rules.tz.clone(),
                        buffer: self.slice_rules.buffer,
                        horizon: jiff::SignedDuration::from_hours(24 * SCHEDULE_HORIZON_DAYS),
                    };
                    self.node.set_schedule(&template, &actions, &rules)
                };
                if r.is_ok() {
                    tracing::info!(template = %template, "schedule of {template} set");
                    if let Err(e) = self.publish_rotation().await {
                        tracing::error!("updating template objects failed: {e}");
                    }
                }
                let _ = reply.send(r);
            }
            Command::GetSchedule { template, reply } => {
                let r = match self.node.schedule(&template) {
                    Some(actions) => Ok(serde_json::to_string(actions).expect("actions serialize")),
                    None => Err(Error::NotFound(format!(
                        "template {template} has no schedule"
                    ))),
                };
                let _ = reply.send(r);
            }
            Command::CreateTemplate {
                spec,
                caller,
                reply,
            } => {
                let r = self.create_template(&spec, &caller).await;
                let _ = reply.send(r);
            }
            Command::RemoveTemplate {
                name,
                caller,
                reply,
            } => {
                let r = self.remove_template(&name, &caller).await;
                let _ = reply.send(r);
            }
            Command::ListTemplates { reply } => {
                let rows = match &self.slicer {
                    Some(s) => s
                        .templates
                        .values()
                        .map(|d| {
                            let t = &d.template;
                            let user = format!("{} ({})", t.user.name, t.user.kind.as_str());
                            let state = s.state.state_of(&t.name).to_string();
                            (t.name.clone(), user, d.domain.clone(), state)
                        })
                        .collect(),
                    None => Vec::new(),
                };
                let _ = reply.send(rows);
            }
            Command::Resume {
                template,
                as_handoff,
                caller,
                reply,
            } => {
                let staging = self
                    .slicer
                    .as_ref()
                    .is_some_and(|s| s.staging.contains(&template));
                let r = match self.manual(&caller, &template) {
                    Ok(()) if staging => Err(Error::Conflict(format!(
                        "the weights of {template} are being staged; it starts when they are done"
                    ))),
                    Ok(()) => {
                        let at_ms = crate::slicer::now_ms();
                        self.slice(crate::slicing::handoff::Event::ManualResume {
                            template,
                            as_handoff,
                            at_ms,
                        })
                        .await
                    }
                    Err(e) => Err(e),
                };
                let _ = reply.send(r);
            }
            Command::PowerOff {
                template,
                hard,
                caller,
                reply,
            } => {
                let r = match self.manual(&caller, &template) {
                    Ok(()) => {
                        let at_ms = crate::slicer::now_ms();
                        self.slice(crate::slicing::handoff::Event::ManualPowerOff {
                            template,
                            hard,
                            at_ms,
                        })
                        .await
                    }
                    Err(e) => Err(e),
                };
                let _ = reply.send(r);
            }
            Command::StageWeights {
                template,
                source,
                caller,
                reply,
            } => {
                let r = self.stage_weights(&template, &source, &caller);
                let _ = reply.send(r);
            }
            Command::WeightsStaged { template, result } => {
                if let Some(s) = self.slicer.as_mut() {
                    s.staging.remove(&template);
                }
                let image = self
                    .slicer
                    .as_ref()
                    .and_then(|s| s.templates.get(&template))
                    .and_then(|d| d.template.weights_disk.clone())
                    .unwrap_or_default();
                let (checksum, changed, error) = match result {
                    Ok((sum, changed)) => {
                        if changed {
                            if let Err(e) = self.node.set_weights(&template, &sum, &image) {
                                tracing::error!("recording the weights of {template}: {e}");
                            }
                        }
                        tracing::info!(template = %template, "weights of {template} staged ({sum}{})", if changed { "" } else { ", unchanged" });
                        (sum, changed, String::new())
                    }
                    Err(e) => {
                        tracing::warn!(template = %template, "staging the weights of {template} failed: {e}");
                        (String::new(), false, e.message().to_string())
                    }
                };
                if let Some(e) = self.manager_emitter() {
                    let _ =
                        Manager::weights_staged(&e, &template, &checksum, changed, &error).await;
                }
            }
            Command::Slice(event) => {
                let _ = self.slice(event).await;
            }
            Command::GuestGpu {
                template,
                sample,
                at_ms,
            } => {
                let meter = self.slicer.as_mut().and_then(|s| s.meter.as_mut());
                // A reading that arrives after its slice ended is dropped.
                if let Some(m) = meter.filter(|m| m.template == template) {
                    m.record_gpu(at_ms, &sample);
                }
            }
            Command::SliceReport {
                template,
                from,
                to,
                reply,
            } => {
                let r = slice_window(from, to).and_then(|(f, t)| {
                    let rows = self
                        .node
                        .slice_records(f.as_millisecond(), t.as_millisecond())?;
                    let n = |v: Option<f64>| v.unwrap_or(-1.0);
                    Ok(rows
                        .into_iter()
                        .filter(|r| template.is_empty() || r.template == template)
                        .map(|r| {
                            let m = &r.measures;
                            (
                                r.template,
                                r.user,
                                r.start_ms / 1000,
                                r.end_ms.map_or(0, |e| e / 1000),
                                r.dead_time_ms.unwrap_or(-1),
                                r.start_to_ready_ms.unwrap_or(-1),
                                n(m.cpu_avg_pct),
                                n(m.cpu_peak_pct),
                                n(m.gpu_avg_pct),
                                n(m.gpu_peak_pct),
                                m.gpu_memory_peak_bytes
                                    .map_or(-1.0, |b| b as f64 / crate::quantity::GB_BYTES as f64),
                                n(m.energy_j.map(|j| j / 3600.0)),
                                r.error.unwrap_or_default(),
                            )
                        })
                        .collect())
                });
                let _ = reply.send(r);
            }
            Command::Snapshot { reply } => {
                let _ = reply.send(self.snapshot());
            }
            Command::UsageReport {
                from,
                to,
                group_by,
                reply,
            } => {
                let _ = reply.send(self.usage_report(from, to, &group_by));
            }
            Command::ListSlices { from, to, reply } => {
                let r = slice_window(from, to).map(|(from, to)| {
                    self.node
                        .slices(from, to, &self.slice_rules.tz)
                        .into_iter()
                        .map(|s| {
                            let ends = s.ends_by.describe();
                            (s.template, s.start.as_second(), s.end.as_second(), ends)
                        })
                        .collect()
                });
                let _ = reply.send(r);
            }
            Command::ListSliceNotes { from, to, reply } => {
                let r = slice_window(from, to)
                    .map(|(from, to)| self.node.slice_notes(from, to, &self.slice_rules.tz));
                let _ = reply.send(r);
            }
            Command::Launched { name, kind, result } => self.launched(name, kind, result).await,
            Command::Cgroup { name, cgroup } => {
                if let Err(e) = self.node.set_cgroup(&name, &cgroup) {
                    tracing::error!(worker = %name, "recording the control group failed: {e}");
                }
            }
            Command::Exited {
                name,
                kind,
                id,
                exit,
            } => self.exited(name, kind, id, exit).await,
            Command::WhyNot { spec, reply } => {
                let r = self.node.why_not(&spec).map(|v| match v {
                    Ok(grants) => (
                        true,
                        grants.iter().map(|g| g.gpu_index).collect(),
                        Vec::new(),
                    ),
                    Err(reasons) => (false, Vec::new(), reasons),
                });
                let _ = reply.send(r);
            }
        }
    }

    /// Brings bus objects in line with the node after `changes`, signalling
    /// only what differs.
    /// Shows a change on the bus: [`Service::show`], then [`Service::announce`].
    async fn publish(&mut self, changes: &Changes) {
        let shown = self.show(changes).await;
        self.announce(shown).await;
    }

    /// The part of publishing a reply must wait for: objects added and
    /// removed, and every view replaced, so that whatever a caller reads after
    /// the reply is current. No signal but the ObjectManager's own.
    async fn show(&mut self, changes: &Changes) -> Shown {
        let mut shown = Shown::default();
        if let Err(e) = self.try_show(changes, &mut shown).await {
            tracing::error!("updating D-Bus objects failed: {e}");
        }
        shown
    }

    /// The signals of what [`Service::show`] changed, sent after the reply.
    async fn announce(&mut self, shown: Shown) {
        if let Err(e) = self.try_announce(shown).await {
            tracing::error!("signalling D-Bus changes failed: {e}");
        }
        let _ = sd_notify::notify(&[NotifyState::Status(&status_line(&self.node))]);
    }

    async fn try_show(&mut self, changes: &Changes, shown: &mut Shown) -> zbus::Result<()> {
        let server = self.conn.object_server();
        // Waits are explained from this moment on; reasons read before may differ.
        let read_before = self.waits.replace(self.node.snapshot());
        for name in &changes.removed {
            tracing::info!(message_id = journal::EXITED, worker = %name, "worker {name} ended; its share is free");
            let p = worker_path(name);
            server.remove::<WorkerObject, _>(p.as_str()).await?;
            shown.removed.push((name.clone(), p));
        }
        for name in &changes.added {
            let Some(w) = self.node.worker(name) else {
                continue;
            };
            let p = worker_path(name);
            server
                .at(
                    p.as_str(),
                    WorkerObject {
                        lp: self.lp.clone(),
                        view: Shared::new(worker_view(&self.node, w)),
                        resources: w.spec.resources.clone(),
                        waits: self.waits.clone(),
                    },
                )
                .await?;
            log_state(&self.node, w);
            shown.added.push((name.clone(), p));
        }
        // A new reading can change any worker's warnings.
        let names: Vec<String> = if changes.machine_changed {
            self.node.workers().map(|w| w.name().to_string()).collect()
        } else {
            changes.updated.clone()
        };
        for name in names {
            if changes.added.contains(&name) {
                continue;
            }
            if let Some(old) = self.show_worker(&name).await? {
                shown.workers.push((name, old));
            }
        }
        // Reasons someone read may read differently now: they read again.
        for name in read_before {
            let pending = self
                .node
                .worker(&name)
                .is_some_and(|w| w.state() == "pending");
            if pending && !changes.added.contains(&name) {
                shown.stale_reasons.push(name);
            }
        }
        // GPUs: add or remove objects when the inventory's shape changed.
        let now: BTreeSet<u32> = self.node.machine().gpus.iter().map(|g| g.index).collect();
        for gone in self.gpu_objects.difference(&now) {
            server
                .remove::<GpuObject, _>(gpu_path(*gone).as_str())
                .await?;
        }
        for g in &self.node.machine().gpus {
            let view = gpu_view(&self.node, g);
            if !self.gpu_objects.contains(&g.index) {
                server
                    .at(
                        gpu_path(g.index),
                        GpuObject {
                            view: Shared::new(view),
                        },
                    )
                    .await?;
            } else if changes.machine_changed || changes.gpus.contains(&g.index) {
                let iface = server
                    .interface::<_, GpuObject>(gpu_path(g.index).as_str())
                    .await?;
                let old = iface.get().await.view.replace(view);
                shown.gpus.push((g.index, old));
            }
        }
        self.gpu_objects = now;
        let manager = server
            .interface::<_, Manager>(crate::bus::BASE_PATH)
            .await?;
        let old = manager
            .get()
            .await
            .view
            .replace(manager_view(&self.node, &self.slice_rules.tz));
        shown.manager = Some(old);
        Ok(())
    }

    async fn try_announce(&mut self, shown: Shown) -> zbus::Result<()> {
        let server = self.conn.object_server();
        let manager = server
            .interface::<_, Manager>(crate::bus::BASE_PATH)
            .await?;
        for (name, p) in shown.removed {
            manager.worker_removed(&name, obj_path(p)).await?;
        }
        for (name, p) in shown.added {
            manager.worker_new(&name, obj_path(p)).await?;
        }
        // A worker that ended meanwhile has no object left to signal from.
        for (name, old) in shown.workers {
            if let Ok(iface) = self.worker_object(&name).await {
                let obj = iface.get().await;
                obj.emit_changes(&old, iface.signal_emitter()).await?;
            }
        }
        for name in shown.stale_reasons {
            if let Ok(iface) = self.worker_object(&name).await {
                let obj = iface.get().await;
                obj.pending_reasons_invalidate(iface.signal_emitter())
                    .await?;
            }
        }
        for (index, old) in shown.gpus {
            let iface = server
                .interface::<_, GpuObject>(gpu_path(index).as_str())
                .await?;
            let obj = iface.get().await;
            let warning = obj.view.read().warning.clone();
            if warning_key(&old.warning) != warning_key(&warning) && !warning.is_empty() {
                tracing::warn!(
                    message_id = if warning.starts_with("over-promised") {
                        journal::OVER_PROMISED
                    } else {
                        journal::WORKER_WARNING
                    },
                    gpu = index,
                    "GPU {index} of {} is {warning}",
                    self.node.machine().name
                );
            }
            obj.emit_changes(&old, iface.signal_emitter()).await?;
        }
        if let Some(old) = shown.manager {
            let obj = manager.get().await;
            obj.emit_changes(&old, manager.signal_emitter()).await?;
        }
        Ok(())
    }
}

/// What [`Service::show`] changed, for [`Service::announce`] to signal.
#[derive(Default)]
struct Shown {
    /// (name, object path) of workers whose objects went or came.
    removed: Vec<(String, String)>,
    added: Vec<(String, String)>,
    /// Workers whose view was replaced, with the view before.
    workers: Vec<(String, WorkerView)>,
    stale_reasons: Vec<String>,
    gpus: Vec<(u32, GpuView)>,
    manager: Option<ManagerView>,
}

impl Service {
    /// One worker's view replaced and its changes signalled.
    async fn publish_worker(&mut self, name: &str) -> zbus::Result<()> {
        if let Some(old) = self.show_worker(name).await? {
            let workers = vec![(name.to_string(), old)];
            self.try_announce(Shown {
                workers,
                ..Shown::default()
            })
            .await?;
        }
        Ok(())
    }

    async fn worker_object(
        &self,
        name: &str,
    ) -> zbus::Result<zbus::object_server::InterfaceRef<WorkerObject>> {
        self.conn
            .object_server()
            .interface::<_, WorkerObject>(worker_path(name).as_str())
            .await
    }

    /// Replaces a worker's view; the one before, to signal the difference.
    async fn show_worker(&self, name: &str) -> zbus::Result<Option<WorkerView>> {
        let Some(w) = self.node.worker(name) else {
            return Ok(None);
        };
        let iface = self.worker_object(name).await?;
        let obj = iface.get().await;
        let view = worker_view(&self.node, w);
        for warning in view
            .warnings
            .iter()
            .filter(|w| !obj.view.read().warnings.contains(w))
        {
            tracing::warn!(message_id = journal::WORKER_WARNING, worker = %name, "worker {name}: {warning}");
        }
        let new_state = view.state.clone();
        let old = obj.view.replace(view);
        if old.state != new_state {
            log_state(&self.node, w);
        }
        Ok(Some(old))
    }
}

impl Service {
    /// Template objects follow the schedules: one per template that has one.
    async fn publish_rotation(&mut self) -> zbus::Result<()> {
        let templates = self.node.rotation();
        self.rotation.replace(RotationView {
            templates,
            tz: self.slice_rules.tz.clone(),
        });
        self.publish_templates().await
    }

    /// Template objects for every template defined or scheduled, and the
    /// slicing view behind them.
    async fn publish_templates(&mut self) -> zbus::Result<()> {
        let mut names: BTreeSet<String> =
            self.node.rotation().into_iter().map(|(t, _)| t).collect();
        let mut view = SlicingView::default();
        if let Some(s) = &self.slicer {
            view.state = s.state.clone();
            for (name, d) in &s.templates {
                names.insert(name.clone());
                let user = format!(
                    "{} ({})",
                    d.template.user.name,
                    d.template.user.kind.as_str()
                );
                view.info.insert(name.clone(), (user, d.domain.clone()));
            }
        }
        self.slicing.replace(view);
        let server = self.conn.object_server();
        for name in self.template_objects.difference(&names) {
            server
                .remove::<TemplateObject, _>(template_path(name).as_str())
                .await?;
        }
        for name in names.difference(&self.template_objects) {
            let obj = TemplateObject {
                name: name.clone(),
                rotation: self.rotation.clone(),
                slicing: self.slicing.clone(),
            };
            server.at(template_path(name), obj).await?;
        }
        self.template_objects = names;
        Ok(())
    }
}

impl Service {
    fn runtime(&self, kind: Kind) -> Option<Arc<dyn Runtime>> {
        match kind {
            Kind::Container => self.containers.clone(),
            Kind::Unit => self.units.clone(),
            Kind::Vm => self.vms.clone(),
        }
    }

    /// Containers and VMs are root-equivalent powers; units run as their owner.
    fn may_run(&self, spec: &crate::request::WorkerSpec, caller: &Caller) -> Result<()> {
        match &spec.run {
            Some(Run::Container { .. }) => {
                if caller.uid != 0 && !self.containers_for_group {
                    return Err(Error::AccessDenied(format!(
                        "uid {}: containers are root-equivalent, so only root may run them \
                         (access.containers_for_group extends this to group {})",
                        caller.uid, self.lp.group
                    )));
                }
                if self.containers.is_none() {
                    return Err(Error::field(
                        "run.container",
                        "this daemon has no container runtime (set runtime.podman_socket)",
                    ));
                }
                Ok(())
            }
            Some(Run::Unit { .. }) if self.units.is_none() => Err(Error::field(
                "run.unit",
                "this daemon has no service manager to start units with",
            )),
            Some(Run::Unit { .. }) => Ok(()),
            Some(Run::Vm(_)) => {
                if caller.uid != 0 && !self.vms_for_group {
                    return Err(Error::AccessDenied(format!(
                        "uid {}: a VM with passed-through devices is root-equivalent, so only \
                         root may run one (access.vms_for_group extends this to group {})",
                        caller.uid, self.lp.group
                    )));
                }
                if self.vms.is_none() {
                    return Err(Error::field(
                        "run.vm",
                        "this daemon has no VM runtime (set runtime.libvirt_uri)",
                    ));
                }
                Ok(())
            }
            None => Ok(()),
        }
    }

    fn snapshot(&self) -> crate::web::Snapshot {
        use crate::web::{GpuSnap, SliceSnap, WorkerSnap};
        let node = &self.node;
        let manager = manager_view(node, &self.slice_rules.tz);
        let mut owners: HashMap<u32, String> = HashMap::new();
        let workers = node
            .workers()
            .map(|w| WorkerSnap {
                view: worker_view(node, w),
                owner: owners
                    .entry(w.owner_uid)
                    .or_insert_with(|| {
                        crate::auth::user_name(w.owner_uid)
                            .unwrap_or_else(|| w.owner_uid.to_string())
                    })
                    .clone(),
                shared_gb: w
                    .spec
                    .shared_gb()
                    .filter(|_| w.state() != "pending")
                    .map(to_f64),
                pending_reasons: node.reasons(w.name()),
            })
            .collect();
        let rotation = self.rotation.read().clone();
        let now = jiff::Timestamp::now();
        // Every template defined or scheduled.
        let mut names: BTreeSet<&String> = rotation.templates.iter().map(|(t, _)| t).collect();
        if let Some(s) = &self.slicer {
            names.extend(s.templates.keys());
        }
        let slices = names
            .into_iter()
            .map(|t| {
                let (active, next) = crate::bus::objects::slices_now(&rotation, t, now);
                let defined = self.slicer.as_ref().filter(|s| s.templates.contains_key(t));
                SliceSnap {
                    template: t.clone(),
                    state: match defined {
                        Some(s) => s.state.state_of(t).to_string(),
                        None if active.0 != 0 => "on".into(),
                        None => "off".into(),
                    },
                    dead_time_ms: defined.and_then(|s| s.dead_times.get(t).copied()),
                    active: (active.0 != 0).then_some(active),
                    next: (next.0 != 0).then_some(next),
                }
            })
            .collect();
        crate::web::Snapshot {
            machine: manager.machine,
            time_zone: manager.time_zone,
            gpus: node
                .machine()
                .gpus
                .iter()
                .map(|g| GpuSnap {
                    view: gpu_view(node, g),
                    offers: placement::offers_line(g),
                    used_gb: g.own_use.as_ref().map(|uses| {
                        let bytes: u64 = uses.iter().map(|(_, b)| b).sum();
                        crate::quantity::Amount::gb_from_bytes_ceil(bytes).as_f64()
                    }),
                })
                .collect(),
            workers,
            slices,
        }
    }

    /// Root only, and the template must exist.
    fn manual(&self, caller: &Caller, template: &str) -> Result<()> {
        if caller.uid != 0 {
            return Err(Error::AccessDenied(format!(
                "uid {}: the GPU baseboard's VMs are root's to start and stop",
                caller.uid
            )));
        }
        match &self.slicer {
            None => Err(Error::Conflict(
                "time-slicing needs libvirt (set runtime.libvirt_uri)".into(),
            )),
            Some(s) if !s.templates.contains_key(template) => {
                Err(Error::NotFound(format!("no template named {template}")))
            }
            Some(_) => Ok(()),
        }
    }

    async fn create_template(&mut self, spec: &str, caller: &Caller) -> Result<String> {
        if caller.uid != 0 {
            return Err(Error::AccessDenied(format!(
                "uid {}: templates own the GPU baseboard; only root may define them",
                caller.uid
            )));
        }
        let Some(slicer) = &self.slicer else {
            return Err(Error::Conflict(
                "time-slicing needs libvirt (set runtime.libvirt_uri)".into(),
            ));
        };
        let defined = slicer.prepare(spec).await?;
        let name = defined.template.name.clone();
        self.node.insert_template(&name, spec)?;
        let slicer = self.slicer.as_mut().expect("checked above");
        slicer.watch_events();
        slicer.templates.insert(name.clone(), defined);
        slicer.refresh_limits();
        tracing::info!(template = %name, "template {name} defined");
        if let Err(e) = self.publish_templates().await {
            tracing::error!("publishing template {name}: {e}");
        }
        Ok(name)
    }

    async fn remove_template(&mut self, name: &str, caller: &Caller) -> Result<()> {
        self.manual(caller, name)?;
        let slicer = self.slicer.as_ref().expect("manual() checked");
        if slicer.state.state_of(name) != "off" {
            return Err(Error::Conflict(format!(
                "template {name}'s VM is {}; power it off first",
                slicer.state.state_of(name)
            )));
        }
        self.node.remove_template(name)?;
        let slicer = self.slicer.as_mut().expect("checked");
        slicer.templates.remove(name);
        slicer.refresh_limits();
        tracing::info!(template = %name, "template {name} removed (its libvirt domain is kept)");
        let _ = self.publish_rotation().await;
        Ok(())
    }

    /// Feeds one event to the handoff machine and carries out its actions:
    /// steps into the ledger and onto the bus, hypervisor calls in tasks.
    /// A refused manual request comes back as Conflict.
    async fn slice(&mut self, event: crate::slicing::handoff::Event) -> Result<()> {
        use crate::slicing::handoff::{step, Action, Signal};
        let Some(slicer) = self.slicer.as_mut() else {
            return Ok(());
        };
        let (state, actions) = step(&slicer.state, &event, &slicer.settings);
        slicer.state = state;
        let mut refused = None;
        let emitter = self.manager_emitter();
        for a in &actions {
            match a {
                Action::Record(r) => {
                    if let Err(e) = self.node.record_step(r) {
                        tracing::error!("recording handoff step {}: {e}", r.step.as_str());
                    }
                    // Crash tests kill the daemon right after a step is recorded.
                    failpoint::hit(&format!("slice.after-{}", r.step.as_str()));
                    let (from, to) = (
                        r.from.as_deref().unwrap_or(""),
                        r.to.as_deref().unwrap_or(""),
                    );
                    let detail = r.detail.as_deref().unwrap_or("");
                    tracing::info!(
                        message_id = journal::HANDOFF_STEP,
                        template = %if to.is_empty() { from } else { to },
                        "handoff: {} (from {from:?} to {to:?}) {detail}",
                        r.step.as_str()
                    );
                    if let Some(e) = &emitter {
                        let _ = Manager::handoff_step(
                            e,
                            r.step.as_str(),
                            from,
                            to,
                            r.at_ms as i64,
                            detail,
                        )
                        .await;
                    }
                }
                Action::Signal(Signal::SliceStarted {
                    template,
                    at_ms,
                    dead_time_ms,
                }) => {
                    self.slice_began(template, *at_ms, *dead_time_ms);
                    if let Some(e) = &emitter {
                        let dead = dead_time_ms.map_or(-1, |d| d as i64);
                        let _ = Manager::slice_started(e, template, *at_ms as i64, dead).await;
                    }
                }
                Action::Signal(Signal::SliceEnded { template, at_ms }) => {
                    self.slice_done(template, *at_ms, None);
                    if let Some(e) = &emitter {
                        let _ = Manager::slice_ended(e, template, *at_ms as i64, "").await;
                    }
                }
                Action::Signal(Signal::SliceFailed {
                    template,
                    at_ms,
                    error,
                }) => {
                    tracing::warn!(template = %template, "slice of {template} failed: {error}");
                    self.slice_done(template, *at_ms, Some(error));
                    if let Some(e) = &emitter {
                        let _ = Manager::slice_ended(e, template, *at_ms as i64, error).await;
                    }
                }
                Action::Signal(Signal::SliceReady {
                    template,
                    start_to_ready_ms,
                    ..
                }) => {
                    tracing::info!(template = %template, "slice of {template} ready after {start_to_ready_ms} ms");
                    if let Err(e) = self.node.slice_ready(template, *start_to_ready_ms as i64) {
                        tracing::error!("recording the slice of {template} ready: {e}");
                    }
                }
                Action::Refuse { reason } => refused = Some(reason.clone()),
                other => {
                    if let Some(s) = self.slicer.as_mut() {
                        s.execute(other);
                    }
                }
            }
        }
        if let Err(e) = self.publish_templates().await {
            tracing::error!("publishing templates: {e}");
        }
        match refused {
            Some(reason) => Err(Error::Conflict(reason)),
            None => Ok(()),
        }
    }

    /// Starts staging a template's weights (its VM must be off); progress and
    /// the end come as signals.
    fn stage_weights(&mut self, template: &str, source: &str, caller: &Caller) -> Result<()> {
        self.manual(caller, template)?;
        let slicer = self.slicer.as_mut().expect("manual() checked");
        let d = &slicer.templates[template];
        let Some(image) = d.template.weights_disk.clone() else {
            return Err(Error::field(
                "weights_disk",
                format!("template {template} has no weights disk to stage"),
            ));
        };
        if slicer.state.state_of(template) != "off" {
            return Err(Error::Conflict(format!(
                "template {template}'s VM is {}; weights are staged while it is off",
                slicer.state.state_of(template)
            )));
        }
        let source = std::path::PathBuf::from(source);
        if !source.is_dir() {
            return Err(Error::field(
                "source",
                format!("{} is not a directory", source.display()),
            ));
        }
        if !slicer.staging.insert(template.to_string()) {
            return Err(Error::Conflict(format!(
                "the weights of {template} are already being staged"
            )));
        }
        let before = self.node.weights(template)?;
        let (tx, conn, template) = (self.lp.tx.clone(), self.conn.clone(), template.to_string());
        tokio::task::spawn_blocking(move || {
            let emitter =
                zbus::object_server::SignalEmitter::new(&conn, crate::bus::BASE_PATH).ok();
            let rt = tokio::runtime::Handle::current();
            let progress = |phase: &str, fraction: f64| {
                if let Some(e) = &emitter {
                    let _ = rt.block_on(Manager::weights_progress(e, &template, phase, fraction));
                }
            };
            let mut last = std::time::Instant::now();
            let result = crate::weights::checksum(&source, |done, total| {
                if last.elapsed() > Duration::from_millis(200) || done == total {
                    last = std::time::Instant::now();
                    progress("checksum", done as f64 / total.max(1) as f64);
                }
            })
            .and_then(|sum| {
                let image_path = std::path::Path::new(&image);
                if before.as_deref() == Some(sum.as_str()) && image_path.exists() {
                    return Ok((sum, false)); // the same content: nothing to do
                }
                progress("image", 0.0);
                crate::weights::build_image(&source, image_path)?;
                progress("image", 1.0);
                Ok((sum, true))
            });
            let _ = tx.blocking_send(Command::WeightsStaged { template, result });
        });
        Ok(())
    }

    /// A slice opens in the ledger and its meter starts.
    fn slice_began(&mut self, template: &str, at_ms: u64, dead_time_ms: Option<u64>) {
        let Some(s) = self.slicer.as_mut() else {
            return;
        };
        let Some(d) = s.templates.get(template) else {
            return;
        };
        let user = format!(
            "{} ({})",
            d.template.user.name,
            d.template.user.kind.as_str()
        );
        let board: Vec<String> = d
            .template
            .baseboard
            .iter()
            .map(crate::slicing::template::pci_text)
            .collect();
        let mut meter = crate::slicer::Meter::new(template);
        let reader = crate::slicer::read_guest_gpus(
            s.vms.clone(),
            d.domain.clone(),
            template.to_string(),
            self.lp.tx.clone(),
        );
        meter.reader = Some(tokio::spawn(reader).abort_handle());
        s.meter = Some(meter);
        if let Some(ms) = dead_time_ms {
            s.dead_times.insert(template.to_string(), ms);
        }
        if let Err(e) = self.node.open_slice(
            template,
            &user,
            &board.join(" "),
            at_ms as i64,
            dead_time_ms.map(|d| d as i64),
        ) {
            tracing::error!("recording the slice of {template}: {e}");
        }
    }

    /// A slice closes with what was measured over it.
    fn slice_done(&mut self, template: &str, at_ms: u64, error: Option<&str>) {
        let measures = match self.slicer.as_mut().and_then(|s| s.meter.take()) {
            Some(m) if m.template == template => m.measures(),
            _ => Default::default(),
        };
        if let Err(e) = self
            .node
            .close_slice(template, at_ms as i64, &measures, error)
        {
            tracing::error!("closing the slice of {template}: {e}");
        }
    }

    /// Reads the running template VM's CPU time into its slice's meter.
    async fn meter_slice(&mut self) {
        let Some(s) = self.slicer.as_ref() else {
            return;
        };
        let Some(template) = s.meter.as_ref().map(|m| m.template.clone()) else {
            return;
        };
        let Some(domain) = s.templates.get(&template).map(|d| d.domain.clone()) else {
            return;
        };
        if let Ok((cpu_ns, vcpus)) = s.vms.cpu_time(&domain).await {
            let wall_ns = crate::store::now_ms().max(0) as u64 * 1_000_000;
            if let Some(m) = self.slicer.as_mut().and_then(|s| s.meter.as_mut()) {
                m.record(wall_ns, cpu_ns, vcpus);
            }
        }
    }

    /// Scheduled actions that fell while the daemon was down are not fired
    /// late (the state converges to now instead); each is recorded as skipped.
    fn record_skipped(&mut self, rotation: &RotationView, now: jiff::Timestamp) {
        let Ok(Some(down_since)) = self.node.previous_run_end() else {
            return;
        };
        let Ok(since) = jiff::Timestamp::from_millisecond(down_since) else {
            return;
        };
        for (template, actions) in &rotation.templates {
            for a in actions {
                for at in a.occurrences_after(since, &rotation.tz, 1000) {
                    if at > now {
                        break;
                    }
                    let what = format!(
                        "{:?} of {template} due at {at} skipped: the daemon was down",
                        a.action
                    );
                    tracing::warn!(template = %template, "{what}");
                    if let Err(e) = self.node.record_event("skipped", &what) {
                        tracing::error!("recording a skipped action: {e}");
                    }
                }
            }
        }
    }

    fn manager_emitter(&self) -> Option<zbus::object_server::SignalEmitter<'static>> {
        zbus::object_server::SignalEmitter::new(&self.conn, crate::bus::BASE_PATH).ok()
    }

    /// After a start: the state the schedule says now, from what runs and
    /// the last step the ledger recorded (no burst of missed actions).
    async fn converge_slices(&mut self) {
        let Some(slicer) = self.slicer.as_ref() else {
            return;
        };
        let rotation = self.rotation.read().clone();
        let now = jiff::Timestamp::now();
        let mut on = Vec::new();
        for (name, d) in &slicer.templates {
            if slicer.vms.is_on(&d.domain).await.unwrap_or(false) {
                on.push(name.clone());
            }
        }
        let last = self.node.last_step().ok().flatten();
        // With a schedule, the state it says now; without one, what a person
        // last asked for (a request, or a handoff under way, finishes) or,
        // after a failed slice or on a fresh ledger, what runs.
        let scheduled = rotation.templates.iter().any(|(_, a)| !a.is_empty());
        let want = if scheduled {
            slicer
                .templates
                .keys()
                .find(|t| crate::bus::objects::slices_now(&rotation, t, now).0 .0 != 0)
                .cloned()
        } else {
            crate::slicing::handoff::wanted_without_schedule(last.as_ref(), &on)
        };
        // Requests only say who is next; the handoff resumes from its last step.
        let last = match &last {
            Some(r) if r.step == crate::slicing::handoff::Step::Requested => {
                self.node.last_state_step().ok().flatten()
            }
            _ => last,
        };
        let slicer = self.slicer.as_ref().expect("checked");
        let (state, actions) = crate::slicing::handoff::converge(
            want.as_deref(),
            &on,
            last.as_ref(),
            crate::slicer::now_ms(),
            &slicer.settings,
        );
        tracing::info!("time-slicing: {want:?} should be on now; on: {on:?}");
        self.record_skipped(&rotation, now);
        let slicer = self.slicer.as_mut().expect("checked");
        slicer.state = state;
        slicer.cursor = now;
        // Replay the actions through the same path as events.
        for a in actions {
            match a {
                crate::slicing::handoff::Action::Record(r) => {
                    let _ = self.node.record_step(&r);
                }
                other => {
                    if let Some(s) = self.slicer.as_mut() {
                        s.execute(&other);
                    }
                }
            }
        }
        let _ = self.publish_templates().await;
    }

    /// The usage report over [from, to) (epoch seconds), as UsageReport rows.
    fn usage_report(
        &self,
        from: i64,
        to: i64,
        group_by: &str,
    ) -> Result<Vec<crate::bus::objects::UsageRow>> {
        let by: crate::report::GroupBy = group_by.parse()?;
        let (from, to) = slice_window(from, to)?;
        let rows = self.node.usage_report(
            from.as_millisecond(),
            to.as_millisecond(),
            by,
            crate::store::now_ms(),
            |uid| crate::auth::user_name(uid).unwrap_or_else(|| uid.to_string()),
        )?;
        Ok(rows
            .into_iter()
            .map(|r| {
                let busy = r.busy_gpu_ms.map_or(-1, |b| b as i64);
                let kind = r.kind.as_str().to_string();
                (r.key, kind, r.gpu_uuid, r.gpu_ms, r.energy_mj, busy)
            })
            .collect())
    }

    /// Starts the workloads of workers just placed, each in its own task.
    async fn launch_placed(&mut self, placed: &[String]) {
        for name in placed {
            let Some(w) = self.node.worker(name) else {
                continue;
            };
            let Some(kind) = w.kind() else {
                continue;
            };
            let (Some(rt), Some(launch)) = (self.runtime(kind), w.launch(self.node.machine()))
            else {
                continue;
            };
            self.node.set_phase(name, Phase::Starting);
            let _ = self.publish_worker(name).await;
            let tx = self.lp.tx.clone();
            let name = name.clone();
            tokio::spawn(async move {
                let result = rt.start(&launch).await;
                // Never dropped: a lost report would leak a share.
                let _ = tx.send(Command::Launched { name, kind, result }).await;
            });
        }
    }

    async fn launched(&mut self, name: String, kind: Kind, result: Result<String>) {
        let Some(rt) = self.runtime(kind) else {
            return;
        };
        let live = self.node.worker(&name).map(|w| w.phase);
        match (result, live) {
            (Ok(id), Some(phase)) => {
                if let Err(e) = self.node.set_launched(&name, &id) {
                    tracing::error!(worker = %name, "recording the launch failed: {e}");
                }
                tracing::info!(worker = %name, "worker {name} started ({})", &id[..20.min(id.len())]);
                self.watch(name.clone(), kind, id.clone());
                if phase == Phase::Stopping {
                    self.stop_workload(&name).await;
                }
                let _ = self.publish_worker(&name).await;
            }
            (Ok(id), None) => {
                // Stopped while it was starting: nothing may keep running.
                let timeout = self.stop_timeout;
                tokio::spawn(async move {
                    let _ = rt.stop(&id, timeout).await;
                    let _ = rt.remove(&id).await;
                });
            }
            (Err(e), Some(_)) => {
                let reason = format!("failed to start: {}", e.message());
                tracing::warn!(message_id = journal::EXITED, worker = %name, "worker {name} {reason}");
                self.end_worker(&name, None, &reason).await;
            }
            (Err(_), None) => {}
        }
    }

    async fn end_worker(&mut self, name: &str, status: Option<i32>, reason: &str) {
        self.end_worker_at(name, status, reason, None).await
    }

    /// Ends a worker at the runtime's own time when it has one.
    async fn end_worker_at(
        &mut self,
        name: &str,
        status: Option<i32>,
        reason: &str,
        at_ms: Option<i64>,
    ) {
        let at_ms = at_ms.unwrap_or_else(crate::store::now_ms);
        match self.node.end_at(name, status, reason, at_ms) {
            Ok(changes) => {
                self.publish(&changes).await;
                self.launch_placed(&changes.placed).await;
            }
            Err(e) => tracing::error!(worker = %name, "ending the worker failed: {e}"),
        }
    }

    /// Waits for the workload's end in a task of its own (the runtime's own
    /// wait or change signals, not polling).
    fn watch(&self, name: String, kind: Kind, id: String) {
        let Some(rt) = self.runtime(kind) else {
            return;
        };
        let tx = self.lp.tx.clone();
        let (cg_rt, cg_tx, cg_id, cg_name) = (rt.clone(), tx.clone(), id.clone(), name.clone());
        tokio::spawn(async move {
            if let Some(cgroup) = cg_rt.cgroup(&cg_id).await {
                let _ = cg_tx
                    .send(Command::Cgroup {
                        name: cg_name,
                        cgroup,
                    })
                    .await;
            }
        });
        tokio::spawn(async move {
            let exit = rt.wait(&id).await;
            let _ = tx
                .send(Command::Exited {
                    name,
                    kind,
                    id,
                    exit,
                })
                .await;
        });
    }

    async fn exited(&mut self, name: String, kind: Kind, id: String, exit: Exit) {
        self.exited_at(name, kind, id, exit, None).await
    }

    async fn exited_at(
        &mut self,
        name: String,
        kind: Kind,
        id: String,
        exit: Exit,
        at_ms: Option<i64>,
    ) {
        let ours = self
            .node
            .worker(&name)
            .is_some_and(|w| w.runtime_id.as_deref() == Some(id.as_str()));
        if let Some(rt) = self.runtime(kind) {
            let id = id.clone();
            tokio::spawn(async move {
                let _ = rt.remove(&id).await;
            });
        }
        if !ours {
            return;
        }
        let (status, reason) = match &exit {
            Exit::Exited(code) => (Some(*code), format!("exited with status {code}")),
            Exit::Failed(why) => (None, format!("failed: {why}")),
        };
        tracing::info!(message_id = journal::EXITED, worker = %name, "worker {name} {reason}");
        self.end_worker_at(&name, status, &reason, at_ms).await;
    }

    /// Graceful stop, then forced; the watcher reports the end.
    async fn stop_workload(&mut self, name: &str) {
        self.node.set_phase(name, Phase::Stopping);
        let _ = self.publish_worker(name).await;
        let w = self.node.worker(name);
        let rt = w.and_then(|w| w.kind()).and_then(|k| self.runtime(k));
        let id = w.and_then(|w| w.runtime_id.clone());
        let (Some(rt), Some(id)) = (rt, id) else {
            return; // still starting: stopped when its launch reports back
        };
        let timeout = self.stop_timeout;
        tokio::spawn(async move {
            if let Err(e) = rt.stop(&id, timeout).await {
                tracing::warn!("stopping {id}: {e}");
            }
        });
    }

    /// After a start: the ledger against what really runs, for each runtime.
    /// Running workloads are adopted, ended ones are ended, missing ones
    /// launched once; nothing starts twice (workloads are named by worker).
    async fn reconcile(&mut self) {
        for kind in [Kind::Container, Kind::Unit, Kind::Vm] {
            self.reconcile_kind(kind).await;
        }
    }

    async fn reconcile_kind(&mut self, kind: Kind) {
        let Some(rt) = self.runtime(kind) else {
            return;
        };
        let live: Vec<(String, Option<String>)> = self
            .node
            .workers()
            .filter(|w| w.kind() == Some(kind) && w.state() != "pending")
            .map(|w| (w.name().to_string(), w.runtime_id.clone()))
            .collect();
        // libvirt is only connected to when VMs are in play: a host without
        // VM workers keeps libvirt unloaded (memory, keepalive wake-ups).
        // VMs are created only after the ledger holds their worker, so none
        // of ours can run unknown to an empty ledger.
        if kind == Kind::Vm && live.is_empty() {
            return;
        }
        let found = match rt.list().await {
            Ok(f) => f,
            // No podman (or service manager) on a host that uses none is no news.
            Err(e) if live.is_empty() => {
                tracing::debug!("cannot list {kind:?} workloads: {e}");
                return;
            }
            Err(e) => {
                tracing::error!(
                    "cannot reconcile {kind:?} workloads (they stay as the ledger says): {e}"
                );
                return;
            }
        };
        for f in &found {
            if !live.iter().any(|(n, _)| *n == f.worker) {
                tracing::warn!(
                    "removing {} of worker {}, which the ledger no longer holds",
                    f.id,
                    f.worker
                );
                let _ = rt.stop(&f.id, self.stop_timeout).await;
                let _ = rt.remove(&f.id).await;
            }
        }
        let mut relaunch = Vec::new();
        for (name, runtime_id) in live {
            match found.iter().find(|f| f.worker == name) {
                Some(f) if f.running => {
                    if let Err(e) = self.node.set_launched(&name, &f.id) {
                        tracing::error!(worker = %name, "adopting failed: {e}");
                    }
                    tracing::info!(worker = %name, "adopted the running workload of worker {name}");
                    self.watch(name.clone(), kind, f.id.clone());
                    let _ = self.publish_worker(&name).await;
                }
                Some(f) if f.exit_code.is_none() => {
                    // Created but never started (a crash between the two): start afresh.
                    let _ = rt.remove(&f.id).await;
                    relaunch.push(name);
                }
                Some(f) => {
                    // Ended while we were down.
                    let _ = self.node.set_launched(&name, &f.id);
                    let code = f.exit_code.unwrap_or_default();
                    // Ended at the runtime's own time: billed until then, not until now.
                    self.exited_at(name, kind, f.id.clone(), Exit::Exited(code), f.ended_ms)
                        .await;
                }
                None if runtime_id.is_none() => relaunch.push(name),
                None => {
                    let why = "its workload vanished while the daemon was down";
                    tracing::warn!(message_id = journal::EXITED, worker = %name, "worker {name} failed: {why}");
                    self.end_worker(&name, None, &format!("failed: {why}"))
                        .await;
                }
            }
        }
        self.launch_placed(&relaunch).await;
    }
}

/// placed / pending, with the worker and its GPUs as journal fields.
fn log_state(node: &Node, w: &Worker) {
    let name = w.name();
    match &w.status {
        crate::node::Status::Running { grants } => {
            let gpus: Vec<String> = grants.iter().map(|g| g.gpu_index.to_string()).collect();
            tracing::info!(
                message_id = journal::PLACED,
                worker = %name,
                gpu = %gpus.join(" "),
                "worker {name} placed: {}",
                placement::gpus_column(grants)
            );
        }
        crate::node::Status::Pending => tracing::info!(
            message_id = journal::PENDING,
            worker = %name,
            "worker {name} waits: {}",
            node.reasons(name).join("; ")
        ),
    }
}

/// A ListSlices window: epoch seconds, from before to, at most 400 days.
fn slice_window(from: i64, to: i64) -> Result<(jiff::Timestamp, jiff::Timestamp)> {
    let ts = |field: &str, v: i64| {
        jiff::Timestamp::from_second(v)
            .map_err(|_| Error::field(field, "epoch seconds within years 1 to 9999"))
    };
    let (f, t) = (ts("from", from)?, ts("to", to)?);
    if t <= f {
        return Err(Error::field("to", "must be after from"));
    }
    if to - from > MAX_SLICE_WINDOW_DAYS * 86_400 {
        return Err(Error::field(
            "to",
            format!("a window of at most {MAX_SLICE_WINDOW_DAYS} days"),
        ));
    }
    Ok((f, t))
}

fn describe_indexes(node: &Node) -> String {
    let idx: Vec<String> = node
        .machine()
        .gpus
        .iter()
        .map(|g| g.index.to_string())
        .collect();
    if idx.is_empty() {
        "none".into()
    } else {
        idx.join(", ")
    }
}

/// Sleeps for `d`, or forever when there is nothing to wait for.
async fn sleep_or_never(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_values_are_hidden_from_others() {
        let spec = r#"{"name":"w","run":{"container":{"image":"x","env":{"TOKEN":"s3cret"}}}}"#;
        let r = redact_env(spec);
        assert!(!r.contains("s3cret"));
        assert!(r.contains(r#""TOKEN":"(hidden)""#));
    }
}
