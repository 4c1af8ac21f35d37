//! What the bus objects and the machine page show, and how it is built from
//! the node. The service loop builds views after each change and puts them
//! behind [`Shared`]; the adaptors (bus, web) only read them. Nothing here
//! does I/O or imports an adaptor: the user names the page shows come in as
//! a function.

use crate::node::{Node, Worker};
use crate::placement::{self, Gpu};
use crate::quantity::Amount;
use crate::rotation::Slice;
use crate::schedule::ScheduledAction;
use crate::slicing::handoff::{self, VmState};
use crate::wire::{GpuRow, Sharer, Sharers, SliceTriple, WorkerRow};
use crate::worker::State;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};

/// A view shared between its object (reads) and the service loop (replaces).
///
/// A view sits behind its own small lock rather than the interface's: zbus
/// holds an interface's read lock for the whole of a method call, so a loop
/// that took the interface's write lock while a handler awaited the loop
/// would deadlock.
#[derive(Clone, Debug, Default)]
pub struct Shared<V>(Arc<RwLock<V>>);

impl<V> Shared<V> {
    pub fn new(v: V) -> Shared<V> {
        Shared(Arc::new(RwLock::new(v)))
    }
    pub fn read(&self) -> RwLockReadGuard<'_, V> {
        self.0.read().unwrap_or_else(|e| e.into_inner())
    }
    /// Puts in the new view and hands back the old one.
    pub fn replace(&self, v: V) -> V {
        std::mem::replace(&mut *self.0.write().unwrap_or_else(|e| e.into_inner()), v)
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ManagerView {
    pub machine: String,
    /// The zone schedules are computed in (IANA name).
    pub time_zone: String,
    pub wsl: bool,
    pub running: u32,
    pub pending: u32,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuView {
    pub index: u32,
    pub uuid: String,
    pub model: String,
    pub vendor: String,
    /// free, whole, shared, unhealthy, time-sliced or mig.
    pub mode: String,
    pub healthy: bool,
    /// "ok", or why it is not healthy.
    pub health: String,
    pub total_gb: f64,
    pub offered_gb: f64,
    pub held_outside_gb: f64,
    /// What sharers use beyond their shares ([`placement::Gpu::beyond`]).
    pub beyond_shares_gb: f64,
    pub taken_gb: f64,
    /// Each sharer and its share: the placement book's own map (a pointer:
    /// the list is built only when someone reads it).
    pub sharers: placement::SharerMap,
    /// The worker holding it whole; empty when none does.
    pub held_whole_by: String,
    /// The whole request it is drained (kept) for; empty when none.
    pub draining_for: String,
    pub summary: String,
    /// Non-empty when the GPU needs attention (over-promised, unhealthy in use).
    pub warning: String,
    pub pci_bus_id: String,
    /// Watts and percent now; -1 when the board cannot tell.
    pub power_w: f64,
    pub utilization_pct: i32,
    /// Whether a share of it can be held: `held: by …` or `promised: why`.
    pub share_limits: String,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct WorkerView {
    pub name: String,
    pub state: State,
    pub owner: u32,
    /// A Kubernetes claim's namespace: whose it is, shown as `k8s/NS`.
    pub claim_namespace: Option<String>,
    pub gpus: Vec<(u32, String)>,
    pub gpu_shared_gb: f64,
    /// About the GPUs it holds (unhealthy, over-promised, no longer seen) and its promise.
    pub warnings: Vec<String>,
    /// GB its processes use now, at most on any one GPU; -1 when unknown.
    pub gpu_used_gb: f64,
    /// `held`, or `promised: why` ([`crate::worker::Worker::enforcement_text`]).
    pub enforcement: String,
    /// Pids whose GPU memory counts as this worker's own (a reservation's holders).
    pub holders: Vec<u32>,
    /// The request as submitted, and with `run.*.env` values hidden.
    pub request: std::sync::Arc<str>,
    pub request_redacted: std::sync::Arc<str>,
    /// Its place in the queue (the ledger's id: older is smaller).
    pub id: i64,
    /// Epoch milliseconds it was submitted, and placed (0 while it waits).
    pub submitted_ms: i64,
    pub placed_ms: i64,
    /// Its ListWorkers row, built with the view (lists are answered from
    /// views, off the service loop).
    pub row: WorkerRow,
}

/// What worker objects explain waits from, without asking the loop (a getter
/// that awaited the loop could deadlock with it over the object tree): the
/// loop's latest snapshot of the machine and the book, and the workers whose
/// reasons were read since, which are told to read again when it changes.
#[derive(Clone, Default)]
pub struct Waits {
    pub snapshot: Shared<Option<crate::node::Snapshot>>,
    pub read: Arc<Mutex<HashSet<String>>>,
}

impl Waits {
    /// A new snapshot; the names whose reasons were read from older ones.
    /// (Replaced before the set is taken, and a getter marks before it reads:
    /// a read either sees the new snapshot or is in the set.) None, and
    /// the set kept, when every reason reads the same against it: a re-read
    /// that found nothing new, or only readings that place nothing (on a
    /// real host, every refresh told every reader of a reason).
    pub fn replace(&self, snapshot: crate::node::Snapshot) -> Vec<String> {
        let old = self.snapshot.replace(Some(snapshot.clone()));
        if old.is_some_and(|old| old.explains_as(&snapshot)) {
            return Vec::new();
        }
        let mut read = self.read.lock().unwrap_or_else(|e| e.into_inner());
        read.drain().collect()
    }

    /// Notes that `name`'s reasons were read (before reading them).
    pub fn mark_read(&self, name: &str) {
        self.read
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_string());
    }

    /// Why worker `who` (with these resources) waits, by the latest snapshot.
    pub fn explain(&self, who: &str, res: &crate::request::Resources) -> Vec<String> {
        match &*self.snapshot.read() {
            Some(s) => s.reasons(who, res),
            None => Vec::new(),
        }
    }
}

/// Every template's actions and the zone: what a template object computes its
/// slices from. A copy for the bus: the loop itself reads the schedules it
/// owns (the node's).
#[derive(Clone, Debug)]
pub struct RotationView {
    pub templates: Vec<(String, Vec<ScheduledAction>)>,
    pub tz: jiff::tz::TimeZone,
}

/// The handoff's state and each defined template's user and VM.
#[derive(Clone, Debug)]
pub struct SlicingView {
    pub state: handoff::HandoffState,
    /// template → (user, domain)
    pub info: BTreeMap<String, (String, String)>,
    /// Each template's last handoff dead time (ms).
    pub dead_times: BTreeMap<String, u64>,
}

impl Default for SlicingView {
    fn default() -> SlicingView {
        SlicingView {
            state: handoff::HandoffState::Idle { released_ms: None },
            info: Default::default(),
            dead_times: Default::default(),
        }
    }
}

impl SlicingView {
    /// A defined template's VM state; None for a schedule without a template.
    pub fn state_of(&self, template: &str) -> Option<VmState> {
        self.info
            .contains_key(template)
            .then(|| self.state.state_of(template))
    }
}

/// (start, end, ends by) of a slice in epoch ms; zeros when none.
pub fn slice_triple(s: Option<&Slice>) -> SliceTriple {
    s.map_or_else(SliceTriple::default, |s| SliceTriple {
        start_ms: s.start.as_millisecond(),
        end_ms: s.end.as_millisecond(),
        ends_by: s.ends_by.describe(),
    })
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
        // The driver's or the sim file's words, shown as they are only
        // when printable (docs/security.md).
        model: crate::text::printable(&g.model),
        vendor: g.vendor.clone(),
        mode: if g.sliced {
            "time-sliced".into()
        } else if g.mig == placement::Mig::On {
            "mig".into()
        } else if !g.healthy {
            "unhealthy".into()
        } else {
            node.gpu_mode(&g.uuid).as_str().into()
        },
        healthy: g.healthy,
        health: if g.healthy {
            "ok".into()
        } else {
            g.problem.clone().unwrap_or_else(|| "unhealthy".into())
        },
        total_gb: g.total.as_f64(),
        // What sharing may place on it: nothing in MIG mode (its instances
        // are offered, each whole) nor while a template's baseboard holds
        // it; the warning and the mode say why.
        offered_gb: if g.sliced || g.mig == placement::Mig::On {
            0.0
        } else {
            g.offered().as_f64()
        },
        held_outside_gb: g.outside.as_f64(),
        beyond_shares_gb: g.beyond_shares.as_f64(),
        taken_gb: node.book().taken(&g.uuid).as_f64(),
        sharers: usage.map(|u| u.sharers().clone()).unwrap_or_default(),
        held_whole_by: usage.and_then(|u| u.whole.clone()).unwrap_or_default(),
        draining_for: node
            .book()
            .kept_for(&g.uuid)
            .unwrap_or_default()
            .to_string(),
        summary: {
            let line = match node.book().kept_for(&g.uuid) {
                Some(keeper) => {
                    format!("{}; draining for {keeper}", placement::sharers_line(usage))
                }
                None => placement::sharers_line(usage),
            };
            match &g.mig_of {
                Some(parent) => {
                    let of = node
                        .index_now(parent)
                        .map_or(parent.clone(), |i| format!("GPU {i}"));
                    format!("a MIG instance of {of}, offered whole only; {line}")
                }
                None => line,
            }
        },
        warning: (node.gpu_warning(g))
            .or_else(|| g.mig_warning(&node.machine().name))
            .unwrap_or_default(),
        pci_bus_id: g.pci_bus_id.clone(),
        power_w: g.power_mw.map_or(-1.0, |mw| mw as f64 / 1000.0),
        utilization_pct: g.utilization_pct.map_or(-1, |u| u as i32),
        share_limits: g.share_limits.to_string(),
    }
}

pub fn gpu_row(v: GpuView) -> GpuRow {
    GpuRow {
        index: v.index,
        uuid: v.uuid,
        model: v.model,
        mode: v.mode,
        total_gb: v.total_gb,
        offered_gb: v.offered_gb,
        held_outside_gb: v.held_outside_gb,
        taken_gb: v.taken_gb,
        warning: v.warning,
        draining_for: v.draining_for,
        health: v.health,
    }
}

pub fn sharers(v: GpuView) -> Sharers {
    Sharers {
        sharers: v
            .sharers
            .iter()
            .map(|(name, gb)| Sharer {
                name: name.to_string(),
                gb: gb.as_f64(),
            })
            .collect(),
        summary: v.summary,
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
    Amount::gb_from_bytes_ceil(max).as_f64()
}

pub fn worker_view(node: &Node, w: &Worker) -> WorkerView {
    let used = used_gb(node, w);
    // Where the GPU is now: a reading without an earlier GPU renumbers
    // those after it; the grant keeps the index it was placed at.
    let index_now = |g: &placement::Grant| node.index_now(&g.gpu_uuid).unwrap_or(g.gpu_index);
    WorkerView {
        gpu_used_gb: used,
        warnings: node.worker_warnings(w),
        enforcement: w.enforcement_text(),
        name: w.name().to_string(),
        state: w.state(),
        owner: w.owner_uid,
        claim_namespace: w.spec.claim.as_ref().map(|c| c.namespace.clone()),
        gpus: w
            .grants()
            .iter()
            .map(|g| (index_now(g), g.gpu_uuid.clone()))
            .collect(),
        gpu_shared_gb: w.spec.shared_gb().map_or(0.0, Amount::as_f64),
        holders: w.holders.iter().map(|h| h.pid).collect(),
        request: w.spec_text.clone(),
        request_redacted: w.spec_redacted.clone(),
        id: w.id,
        submitted_ms: w.submitted.as_i64(),
        placed_ms: w.placed.map_or(0, |t| t.as_i64()),
        row: WorkerRow {
            name: w.name().to_string(),
            state: w.status.as_str().to_string(),
            owner_uid: w.owner_uid,
            gpus: placement::gpus_column(w.grants()),
            gpu_used_gb: used,
            gpu_indices: w.grants().iter().map(index_now).collect(),
            gpu_shared_gb: w.spec.shared_gb().map_or(0.0, Amount::as_f64),
        },
    }
}

/// systemd's STATUS= line.
pub fn status_line(node: &Node) -> String {
    let total = node.running_count() + node.pending_count();
    format!(
        "{total} worker{}, {} pending",
        if total == 1 { "" } else { "s" },
        node.pending_count()
    )
}

/// What the machine page shows, taken by the loop in one go.
#[derive(Clone, Debug, Default)]
pub struct PageSnapshot {
    pub machine: String,
    pub time_zone: String,
    pub gpus: Vec<GpuSnap>,
    pub workers: Vec<WorkerSnap>,
    pub slices: Vec<SliceSnap>,
    /// The metrics' counters (GPU-time and energy so far).
    pub counters: std::sync::Arc<crate::usage::UsageCounters>,
}

#[derive(Clone, Debug, Default)]
pub struct GpuSnap {
    pub view: GpuView,
    /// `offers 7 of its 8 GB (1 GB held outside Astraeus)`.
    pub offers: String,
    /// GB workers' processes use on it now; None when the driver cannot tell.
    pub used_gb: Option<f64>,
}

#[derive(Clone, Debug, Default)]
pub struct WorkerSnap {
    pub view: WorkerView,
    pub owner: String,
    /// Its share per GPU when shared; None for whole GPUs or none.
    pub shared_gb: Option<f64>,
    /// Why it waits, when pending.
    pub pending_reasons: Vec<String>,
}

#[derive(Clone, Debug, Default)]
pub struct SliceSnap {
    pub template: String,
    /// Its VM's state (off, running…), or "on"/"off" by the schedule for a
    /// schedule without a template.
    pub state: String,
    /// The last handoff's dead time (release confirmed → start issued).
    pub dead_time_ms: Option<u64>,
    pub active: Option<SliceTriple>,
    pub next: Option<SliceTriple>,
}

/// What the page needs of the loop: everything but the workers, which the
/// page reads from the objects' views off the loop
/// ([`crate::bus::tree::Objects::worker_snaps`]).
pub fn page_snapshot(
    node: &Node,
    rotation: &RotationView,
    slicing: &SlicingView,
    now: jiff::Timestamp,
) -> PageSnapshot {
    let manager = manager_view(node, &rotation.tz);
    // Every template defined or scheduled.
    let mut names: BTreeSet<&String> = rotation.templates.iter().map(|(t, _)| t).collect();
    names.extend(slicing.info.keys());
    let slices = names
        .into_iter()
        .map(|t| {
            let (active, next) =
                crate::rotation::slices_now(&rotation.templates, t, now, &rotation.tz);
            SliceSnap {
                template: t.clone(),
                state: match slicing.state_of(t) {
                    Some(s) => s.as_str().to_string(),
                    None if active.is_some() => "on".into(),
                    None => "off".into(),
                },
                dead_time_ms: slicing.dead_times.get(t).copied(),
                active: active.as_ref().map(|s| slice_triple(Some(s))),
                next: next.as_ref().map(|s| slice_triple(Some(s))),
            }
        })
        .collect();
    PageSnapshot {
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
                    Amount::gb_from_bytes_ceil(bytes).as_f64()
                }),
            })
            .collect(),
        // Filled by the page from the objects' views, off the loop.
        workers: Vec::new(),
        slices,
        counters: node.counters(),
    }
}
