//! The D-Bus objects: the Manager at the base path, one object per GPU and one
//! per worker. Their properties are snapshots (views) the service loop replaces;
//! `emit_changes` sends PropertiesChanged for exactly the fields that differ.
//!
//! A view sits behind its own small lock rather than the interface's: zbus holds
//! an interface's read lock for the whole of a method call, so a loop that took
//! the interface's write lock while a handler awaited the loop would deadlock.

use super::{worker_path, BusError, Loop};
use crate::service::{Command, GpuRow, SliceRow, WorkerRow};
use std::sync::{Arc, RwLock, RwLockReadGuard};
use zbus::message::Header;
use zbus::object_server::SignalEmitter;
use zbus::{interface, Connection, OwnedObjectPath};

/// A view shared between its object (reads) and the service loop (replaces).
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

fn path(p: String) -> Result<OwnedObjectPath, BusError> {
    OwnedObjectPath::try_from(p).map_err(|e| BusError::Backend(format!("object path: {e}")))
}

pub struct Manager {
    pub lp: Loop,
    pub view: Shared<ManagerView>,
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

#[interface(name = "org.astraeus.Node1.Manager", introspection_docs = false)]
impl Manager {
    /// Submits a worker spec (the seed's JSON); it is placed now or waits.
    #[zbus(out_args("worker", "state", "reasons"))]
    async fn submit_worker(
        &self,
        spec: String,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(OwnedObjectPath, String, Vec<String>), BusError> {
        let (name, state, reasons) = self
            .lp
            .ask_as(&hdr, conn, |caller, reply| Command::Submit {
                spec,
                caller,
                reply,
            })
            .await??;
        Ok((path(worker_path(&name))?, state, reasons))
    }

    async fn stop_worker(
        &self,
        name: String,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(), BusError> {
        Ok(self
            .lp
            .ask_as(&hdr, conn, |caller, reply| Command::Stop {
                name,
                caller,
                reply,
            })
            .await??)
    }

    #[zbus(out_args("worker"))]
    async fn get_worker(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        name: String,
    ) -> Result<OwnedObjectPath, BusError> {
        let name = self
            .lp
            .ask_from(&hdr, |reply| Command::GetWorker { name, reply })
            .await??;
        path(worker_path(&name))
    }

    /// (name, state, owner uid, the GPUs column `1 · shared 2.2 GB`, GB used now or -1)
    #[zbus(out_args("workers"))]
    async fn list_workers(
        &self,
        #[zbus(header)] hdr: Header<'_>,
    ) -> Result<Vec<WorkerRow>, BusError> {
        self.lp
            .ask_from(&hdr, |reply| Command::ListWorkers { reply })
            .await
    }

    /// (index, uuid, model, mode, total GB, offered GB, held outside GB, taken GB)
    #[zbus(out_args("gpus"))]
    async fn list_gpus(&self, #[zbus(header)] hdr: Header<'_>) -> Result<Vec<GpuRow>, BusError> {
        self.lp
            .ask_from(&hdr, |reply| Command::ListGpus { reply })
            .await
    }

    /// The sharers of one GPU with their GB, and the seed's summary line.
    #[zbus(out_args("sharers", "summary"))]
    async fn list_sharers(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        gpu: u32,
    ) -> Result<(Vec<(String, f64)>, String), BusError> {
        Ok(self
            .lp
            .ask_from(&hdr, |reply| Command::ListSharers { gpu, reply })
            .await??)
    }

    /// A dry run: where the spec would go now, or every reason it would wait.
    #[zbus(out_args("fits", "gpus", "reasons"))]
    async fn why_not(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        spec: String,
    ) -> Result<(bool, Vec<u32>, Vec<String>), BusError> {
        Ok(self
            .lp
            .ask_from(&hdr, |reply| Command::WhyNot { spec, reply })
            .await??)
    }

    /// Sets a template's scheduled actions (JSON list; `[]` removes them).
    /// Atomic: a refused schedule leaves the old one in place. Root only.
    async fn set_schedule(
        &self,
        template: String,
        actions: String,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(), BusError> {
        Ok(self
            .lp
            .ask_as(&hdr, conn, |caller, reply| Command::SetSchedule {
                template,
                actions,
                caller,
                reply,
            })
            .await??)
    }

    /// A template's scheduled actions as JSON (+N resolved to epoch seconds).
    #[zbus(out_args("actions"))]
    async fn get_schedule(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        template: String,
    ) -> Result<String, BusError> {
        Ok(self
            .lp
            .ask_from(&hdr, |reply| Command::GetSchedule { template, reply })
            .await??)
    }

    /// Who owns the GPU baseboard in [from, to) (epoch seconds):
    /// (template, start, end, ends by: poweroff | poweroff-hard | handoff:<template> | open)
    #[zbus(out_args("slices"))]
    async fn list_slices(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        from: i64,
        to: i64,
    ) -> Result<Vec<SliceRow>, BusError> {
        Ok(self
            .lp
            .ask_from(&hdr, |reply| Command::ListSlices { from, to, reply })
            .await??)
    }

    /// What the slice preview must say besides the slices in [from, to): listed
    /// days that do not occur (day 31 in a 30-day month, day 365 outside leap years).
    #[zbus(out_args("notes"))]
    async fn list_slice_notes(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        from: i64,
        to: i64,
    ) -> Result<Vec<String>, BusError> {
        Ok(self
            .lp
            .ask_from(&hdr, |reply| Command::ListSliceNotes { from, to, reply })
            .await??)
    }

    /// Who used how much of each GPU in [from, to) (epoch seconds), grouped by
    /// worker, owner, gpu or user: (key, kind: worker | slice | outside | idle
    /// | downtime, gpu uuid or "" when merged, GPU-milliseconds, millijoules,
    /// busy GPU-milliseconds or -1 when not measured). A shared GPU counts
    /// for each sharer by its share of the GPU's memory; per GPU the rows add
    /// up to the wall-clock time.
    #[zbus(out_args("rows"))]
    async fn usage_report(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        from: i64,
        to: i64,
        group_by: String,
    ) -> Result<Vec<UsageRow>, BusError> {
        Ok(self
            .lp
            .ask_from(&hdr, |reply| Command::UsageReport {
                from,
                to,
                group_by,
                reply,
            })
            .await??)
    }

    /// Defines a time-slicing template and its persistent VM (JSON). Root only.
    #[zbus(out_args("template"))]
    async fn create_template(
        &self,
        spec: String,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<OwnedObjectPath, BusError> {
        let caller = self.lp.caller(&hdr, conn).await?;
        let name = self
            .lp
            .ask_from(&hdr, |reply| Command::CreateTemplate {
                spec,
                caller,
                reply,
            })
            .await??;
        path(crate::bus::template_path(&name))
    }

    /// Removes a template whose VM is off (its libvirt domain is kept). Root only.
    async fn remove_template(
        &self,
        name: String,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(), BusError> {
        Ok(self
            .lp
            .ask_as(&hdr, conn, |caller, reply| Command::RemoveTemplate {
                name,
                caller,
                reply,
            })
            .await??)
    }

    /// (name, user, domain, state) of every template.
    #[zbus(out_args("templates"))]
    async fn list_templates(
        &self,
        #[zbus(header)] hdr: Header<'_>,
    ) -> Result<Vec<(String, String, String, String)>, BusError> {
        self.lp
            .ask_from(&hdr, |reply| Command::ListTemplates { reply })
            .await
    }

    /// Boots a template's VM now. Refused while another holds the GPU
    /// baseboard (the holder is named) unless `as_handoff`. Root only.
    async fn resume(
        &self,
        template: String,
        as_handoff: bool,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(), BusError> {
        Ok(self
            .lp
            .ask_as(&hdr, conn, |caller, reply| Command::Resume {
                template,
                as_handoff,
                caller,
                reply,
            })
            .await??)
    }

    /// Powers a template's VM off (ACPI, forced after the timeout; at once
    /// when `hard`). Works at any time. Root only.
    async fn power_off(
        &self,
        template: String,
        hard: bool,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(), BusError> {
        Ok(self
            .lp
            .ask_as(&hdr, conn, |caller, reply| Command::PowerOff {
                template,
                hard,
                caller,
                reply,
            })
            .await??)
    }

    /// Slices in [from, to) (epoch seconds) of one template ("" = all): (template,
    /// user, start, end (0 = still on), handoff dead time ms, start-to-ready ms
    /// (-1 = none), CPU average and peak %, GPU average and peak %, GPU memory
    /// peak GB, GPU energy Wh (these two: -1 = not reported, never 0), libvirt's
    /// error when it failed). The GPU figures come from inside the guest
    /// (docs/time-slicing.md).
    #[zbus(out_args("slices"))]
    async fn slice_report(
        &self,
        template: String,
        from: i64,
        to: i64,
        #[zbus(header)] hdr: Header<'_>,
    ) -> Result<Vec<SliceReportRow>, BusError> {
        Ok(self
            .lp
            .ask_from(&hdr, |reply| Command::SliceReport {
                template,
                from,
                to,
                reply,
            })
            .await??)
    }

    /// Builds a template's read-only weights disk (an ext4 image) from a
    /// directory while its VM is off. Returns at once; WeightsProgress and
    /// WeightsStaged follow. The same content again changes nothing. Root only.
    async fn stage_weights(
        &self,
        template: String,
        source: String,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(), BusError> {
        Ok(self
            .lp
            .ask_as(&hdr, conn, |caller, reply| Command::StageWeights {
                template,
                source,
                caller,
                reply,
            })
            .await??)
    }

    /// Staging progress: phase "checksum" (fraction of bytes read) or "image".
    #[zbus(signal)]
    pub async fn weights_progress(
        emitter: &SignalEmitter<'_>,
        template: &str,
        phase: &str,
        fraction: f64,
    ) -> zbus::Result<()>;

    /// Staging ended: the content checksum, whether the disk changed, or the error.
    #[zbus(signal)]
    pub async fn weights_staged(
        emitter: &SignalEmitter<'_>,
        template: &str,
        checksum: &str,
        changed: bool,
        error: &str,
    ) -> zbus::Result<()>;

    /// One step of a handoff, as the ledger records it: power-off-asked,
    /// forced, stopped, release-confirmed, start-issued, started, ready,
    /// start-failed, failed, requested (who comes next changed, nothing else
    /// yet); `from`/`to` are templates ("" when none).
    #[zbus(signal)]
    pub async fn handoff_step(
        emitter: &SignalEmitter<'_>,
        step: &str,
        from: &str,
        to: &str,
        at_ms: i64,
        detail: &str,
    ) -> zbus::Result<()>;

    /// A slice begins (its VM is being started); `dead_time_ms`: release
    /// confirmed → start issued in a handoff, -1 otherwise.
    #[zbus(signal)]
    pub async fn slice_started(
        emitter: &SignalEmitter<'_>,
        template: &str,
        at_ms: i64,
        dead_time_ms: i64,
    ) -> zbus::Result<()>;

    /// A slice ends; `error` is libvirt's when it never came up.
    #[zbus(signal)]
    pub async fn slice_ended(
        emitter: &SignalEmitter<'_>,
        template: &str,
        at_ms: i64,
        error: &str,
    ) -> zbus::Result<()>;

    #[zbus(signal)]
    pub async fn worker_new(
        emitter: &SignalEmitter<'_>,
        name: &str,
        worker: OwnedObjectPath,
    ) -> zbus::Result<()>;

    #[zbus(signal)]
    pub async fn worker_removed(
        emitter: &SignalEmitter<'_>,
        name: &str,
        worker: OwnedObjectPath,
    ) -> zbus::Result<()>;

    #[zbus(property)]
    async fn machine(&self) -> String {
        self.view.read().machine.clone()
    }
    /// The zone schedules and slices are computed in.
    #[zbus(property(emits_changed_signal = "const"))]
    async fn time_zone(&self) -> String {
        self.view.read().time_zone.clone()
    }
    #[zbus(property)]
    async fn wsl(&self) -> bool {
        self.view.read().wsl
    }
    #[zbus(property)]
    async fn workers_running(&self) -> u32 {
        self.view.read().running
    }
    #[zbus(property)]
    async fn workers_pending(&self) -> u32 {
        self.view.read().pending
    }
}

impl Manager {
    pub async fn emit_changes(&self, old: &ManagerView, e: &SignalEmitter<'_>) -> zbus::Result<()> {
        let new = self.view.read().clone();
        let mut d = Delta::default();
        d.set(old.machine != new.machine, "Machine", new.machine);
        d.set(old.wsl != new.wsl, "Wsl", new.wsl);
        d.set(old.running != new.running, "WorkersRunning", new.running);
        d.set(old.pending != new.pending, "WorkersPending", new.pending);
        d.emit(e, "org.astraeus.Node1.Manager").await
    }
}

/// A view's changed properties, sent as one PropertiesChanged per object
/// (not one per property: each signal is a message every watcher wakes for).
#[derive(Default)]
struct Delta {
    changed: std::collections::HashMap<&'static str, zbus::Variant<'static>>,
    invalidated: Vec<&'static str>,
}

impl Delta {
    fn set<T>(&mut self, differs: bool, name: &'static str, value: T)
    where
        T: Into<zbus::Variant<'static>> + zbus::zvariant::DynamicType,
    {
        if differs {
            self.changed.insert(name, zbus::Variant::new(value));
        }
    }

    fn invalidate(&mut self, differs: bool, name: &'static str) {
        if differs {
            self.invalidated.push(name);
        }
    }

    async fn emit(self, e: &SignalEmitter<'_>, interface: &'static str) -> zbus::Result<()> {
        if self.changed.is_empty() && self.invalidated.is_empty() {
            return Ok(());
        }
        zbus::fdo::Properties::properties_changed(
            e,
            zbus::names::InterfaceName::from_static_str_unchecked(interface),
            self.changed,
            std::borrow::Cow::Owned(self.invalidated),
        )
        .await
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuView {
    pub index: u32,
    pub uuid: String,
    pub model: String,
    pub vendor: String,
    pub mode: String,
    pub total_gb: f64,
    pub offered_gb: f64,
    pub held_outside_gb: f64,
    pub taken_gb: f64,
    pub sharers: Vec<(String, f64)>,
    pub summary: String,
    /// Non-empty when the GPU needs attention (over-promised, unhealthy in use).
    pub warning: String,
    pub pci_bus_id: String,
    /// Watts and percent now; -1 when the board cannot tell.
    pub power_w: f64,
    pub utilization_pct: i32,
}

pub struct GpuObject {
    pub view: Shared<GpuView>,
}

#[interface(name = "org.astraeus.Node1.Gpu", introspection_docs = false)]
impl GpuObject {
    #[zbus(property)]
    async fn index(&self) -> u32 {
        self.view.read().index
    }
    #[zbus(property)]
    async fn uuid(&self) -> String {
        self.view.read().uuid.clone()
    }
    #[zbus(property)]
    async fn model(&self) -> String {
        self.view.read().model.clone()
    }
    #[zbus(property)]
    async fn vendor(&self) -> String {
        self.view.read().vendor.clone()
    }
    /// free, whole or shared
    #[zbus(property)]
    async fn mode(&self) -> String {
        self.view.read().mode.clone()
    }
    #[zbus(property)]
    async fn total_gb(&self) -> f64 {
        self.view.read().total_gb
    }
    #[zbus(property)]
    async fn offered_gb(&self) -> f64 {
        self.view.read().offered_gb
    }
    #[zbus(property)]
    async fn held_outside_gb(&self) -> f64 {
        self.view.read().held_outside_gb
    }
    #[zbus(property)]
    async fn taken_gb(&self) -> f64 {
        self.view.read().taken_gb
    }
    #[zbus(property)]
    async fn sharers(&self) -> Vec<(String, f64)> {
        self.view.read().sharers.clone()
    }
    #[zbus(property)]
    async fn summary(&self) -> String {
        self.view.read().summary.clone()
    }
    /// Set when the sharers placed no longer fit what it offers, or it is unhealthy in use.
    #[zbus(property)]
    async fn over_promised(&self) -> bool {
        self.view.read().warning.starts_with("over-promised")
    }
    #[zbus(property)]
    async fn warning(&self) -> String {
        self.view.read().warning.clone()
    }
    #[zbus(property)]
    async fn pci_bus_id(&self) -> String {
        self.view.read().pci_bus_id.clone()
    }
    /// Changes at every refresh: read it, no signal (clients poll).
    #[zbus(property(emits_changed_signal = "false"))]
    async fn power_w(&self) -> f64 {
        self.view.read().power_w
    }
    #[zbus(property(emits_changed_signal = "false"))]
    async fn utilization_percent(&self) -> i32 {
        self.view.read().utilization_pct
    }
}

impl GpuObject {
    pub async fn emit_changes(&self, old: &GpuView, e: &SignalEmitter<'_>) -> zbus::Result<()> {
        let n = self.view.read().clone();
        let mut d = Delta::default();
        d.set(old.index != n.index, "Index", n.index);
        d.set(old.uuid != n.uuid, "Uuid", n.uuid);
        d.set(old.model != n.model, "Model", n.model);
        d.set(old.vendor != n.vendor, "Vendor", n.vendor);
        d.set(old.mode != n.mode, "Mode", n.mode);
        d.set(old.total_gb != n.total_gb, "TotalGb", n.total_gb);
        d.set(old.offered_gb != n.offered_gb, "OfferedGb", n.offered_gb);
        d.set(
            old.held_outside_gb != n.held_outside_gb,
            "HeldOutsideGb",
            n.held_outside_gb,
        );
        d.set(old.taken_gb != n.taken_gb, "TakenGb", n.taken_gb);
        d.set(old.sharers != n.sharers, "Sharers", n.sharers);
        d.set(old.summary != n.summary, "Summary", n.summary);
        let warned = old.warning != n.warning;
        d.set(
            warned,
            "OverPromised",
            n.warning.starts_with("over-promised"),
        );
        d.set(warned, "Warning", n.warning);
        d.set(old.pci_bus_id != n.pci_bus_id, "PciBusId", n.pci_bus_id);
        d.emit(e, "org.astraeus.Node1.Gpu").await
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct WorkerView {
    pub name: String,
    pub state: String,
    pub owner: u32,
    pub gpus: Vec<(u32, String)>,
    pub gpu_shared_gb: f64,
    /// About the GPUs it holds (unhealthy, over-promised, no longer seen) and its promise.
    pub warnings: Vec<String>,
    /// GB its processes use now, at most on any one GPU; -1 when unknown.
    pub gpu_used_gb: f64,
    /// Pids whose GPU memory counts as this worker's own (a reservation's holders).
    pub holders: Vec<u32>,
    /// The request as submitted, and with `run.*.env` values hidden.
    pub request: String,
    pub request_redacted: String,
}

pub struct WorkerObject {
    pub lp: Loop,
    pub view: Shared<WorkerView>,
    /// What it asked for (fixed for its life): its reasons are computed from it.
    pub resources: crate::request::Resources,
    pub waits: Waits,
}

/// What worker objects explain waits from, without asking the loop (a getter
/// that awaited the loop could deadlock with it over the object tree): the
/// loop's latest snapshot of the machine and the book, and the workers whose
/// reasons were read since, which are told to read again when it changes.
#[derive(Clone, Default)]
pub struct Waits {
    pub snapshot: Shared<Option<crate::node::Snapshot>>,
    pub read: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
}

impl Waits {
    /// A new snapshot; the names whose reasons were read from older ones.
    /// (Replaced before the set is taken, and a getter marks before it reads:
    /// a read either sees the new snapshot or is in the set.)
    pub fn replace(&self, snapshot: crate::node::Snapshot) -> Vec<String> {
        self.snapshot.replace(Some(snapshot));
        let mut read = self.read.lock().unwrap_or_else(|e| e.into_inner());
        read.drain().collect()
    }
}

#[interface(name = "org.astraeus.Node1.Worker", introspection_docs = false)]
impl WorkerObject {
    async fn stop(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(), BusError> {
        let caller = self.lp.caller(&hdr, conn).await?;
        let name = self.view.read().name.clone();
        Ok(self
            .lp
            .ask_from(&hdr, |reply| Command::Stop {
                name,
                caller,
                reply,
            })
            .await??)
    }

    #[zbus(property(emits_changed_signal = "const"))]
    async fn name(&self) -> String {
        self.view.read().name.clone()
    }
    /// pending or running
    #[zbus(property)]
    async fn state(&self) -> String {
        self.view.read().state.clone()
    }
    #[zbus(property(emits_changed_signal = "const"))]
    async fn owner(&self) -> u32 {
        self.view.read().owner
    }
    /// (index, uuid) of each GPU it holds
    #[zbus(property)]
    async fn gpus(&self) -> Vec<(u32, String)> {
        self.view.read().gpus.clone()
    }
    /// Its share per GPU in GB when shared; 0 when whole or none.
    #[zbus(property(emits_changed_signal = "const"))]
    async fn gpu_shared_gb(&self) -> f64 {
        self.view.read().gpu_shared_gb
    }
    /// Pids whose GPU memory counts as this worker's own.
    #[zbus(property(emits_changed_signal = "const"))]
    async fn holders(&self) -> Vec<u32> {
        self.view.read().holders.clone()
    }
    /// Computed when read (a queue of thousands would otherwise be rebuilt on
    /// every change); PropertiesChanged only invalidates it, and only for
    /// workers whose reasons someone read.
    #[zbus(property(emits_changed_signal = "invalidates"))]
    async fn pending_reasons(&self) -> Vec<String> {
        let name = self.view.read().name.clone();
        self.waits
            .read
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name);
        if self.view.read().state != "pending" {
            return Vec::new();
        }
        match &*self.waits.snapshot.read() {
            Some(s) => s.reasons(&self.resources),
            None => Vec::new(),
        }
    }
    #[zbus(property)]
    async fn warnings(&self) -> Vec<String> {
        self.view.read().warnings.clone()
    }
    /// GB its processes use now (at most, on any one of its GPUs); -1 when unknown.
    #[zbus(property)]
    async fn gpu_used_gb(&self) -> f64 {
        self.view.read().gpu_used_gb
    }
    /// The request; `run.*.env` values only for the owner and root.
    #[zbus(property(emits_changed_signal = "const"))]
    async fn request(
        &self,
        #[zbus(header)] hdr: Option<Header<'_>>,
        #[zbus(connection)] conn: &Connection,
    ) -> String {
        let caller = match &hdr {
            Some(h) => self.lp.caller(h, conn).await.ok(),
            None => None,
        };
        match caller {
            Some(c) if c.uid == 0 || c.uid == self.view.read().owner => {
                self.view.read().request.clone()
            }
            _ => self.view.read().request_redacted.clone(),
        }
    }
}

impl WorkerObject {
    pub async fn emit_changes(&self, old: &WorkerView, e: &SignalEmitter<'_>) -> zbus::Result<()> {
        let n = self.view.read().clone();
        let mut d = Delta::default();
        let left_or_joined_queue =
            old.state != n.state && (old.state == "pending" || n.state == "pending");
        d.invalidate(left_or_joined_queue, "PendingReasons");
        d.set(old.state != n.state, "State", n.state);
        d.set(old.gpus != n.gpus, "Gpus", n.gpus);
        d.set(old.warnings != n.warnings, "Warnings", n.warnings);
        d.set(old.gpu_used_gb != n.gpu_used_gb, "GpuUsedGb", n.gpu_used_gb);
        d.emit(e, "org.astraeus.Node1.Worker").await
    }
}

/// Every template's actions and the zone: what a template object computes its
/// slices from, replaced by the loop whenever a schedule changes.
#[derive(Clone, Debug)]
pub struct RotationView {
    pub templates: Vec<(String, Vec<crate::schedule::ScheduledAction>)>,
    pub tz: jiff::tz::TimeZone,
}

/// One SliceReport row (see the method).
pub type SliceReportRow = (
    String,
    String,
    i64,
    i64,
    i64,
    i64,
    f64,
    f64,
    f64,
    f64,
    f64,
    f64,
    String,
);

/// (key, kind, gpu uuid, GPU-ms, mJ, busy GPU-ms or -1): one UsageReport row.
pub type UsageRow = (String, String, String, u64, u64, i64);

/// (start, end, ends by) of a slice; (0, 0, "") when there is none.
pub type SliceTriple = (i64, i64, String);

pub struct TemplateObject {
    pub name: String,
    pub rotation: Shared<RotationView>,
    pub slicing: Shared<SlicingView>,
}

/// The handoff's state and each defined template's user and VM.
#[derive(Clone, Debug)]
pub struct SlicingView {
    pub state: crate::slicing::handoff::State,
    /// template → (user, domain)
    pub info: std::collections::BTreeMap<String, (String, String)>,
}

impl Default for SlicingView {
    fn default() -> SlicingView {
        SlicingView {
            state: crate::slicing::handoff::State::Idle { released_ms: None },
            info: Default::default(),
        }
    }
}

impl TemplateObject {
    fn slices_now(&self) -> (SliceTriple, SliceTriple) {
        let r = self.rotation.read().clone();
        slices_now(&r, &self.name, jiff::Timestamp::now())
    }
}

/// (active, next) slice of a template at `now`, looking a year ahead;
/// (0, 0, "") where there is none.
pub fn slices_now(
    r: &RotationView,
    template: &str,
    now: jiff::Timestamp,
) -> (SliceTriple, SliceTriple) {
    let until = now
        .checked_add(jiff::SignedDuration::from_hours(24 * 400))
        .unwrap_or(jiff::Timestamp::MAX);
    let none = || (0, 0, String::new());
    let mut active = none();
    let mut next = none();
    for s in crate::slices::timeline(&r.templates, now, until, &r.tz) {
        if s.template != template {
            continue;
        }
        let triple = (s.start.as_second(), s.end.as_second(), s.ends_by.describe());
        if s.start <= now && active.0 == 0 {
            active = triple;
        } else if s.start > now {
            next = triple;
            break;
        }
    }
    (active, next)
}

#[interface(name = "org.astraeus.Node1.Template", introspection_docs = false)]
impl TemplateObject {
    #[zbus(property(emits_changed_signal = "const"))]
    async fn name(&self) -> String {
        self.name.clone()
    }
    /// The slice running now: (start, end, ends by), or (0, 0, "") — changes with time: read it.
    #[zbus(property(emits_changed_signal = "false"))]
    async fn active_slice(&self) -> SliceTriple {
        self.slices_now().0
    }
    /// The next slice to start: (start, end, ends by), or (0, 0, "").
    #[zbus(property(emits_changed_signal = "false"))]
    async fn next_slice(&self) -> SliceTriple {
        self.slices_now().1
    }
    /// Its VM now: off, stopping, waiting (for the release or the buffer),
    /// starting, running or failed; "undefined" for a schedule without a template.
    #[zbus(property(emits_changed_signal = "false"))]
    async fn state(&self) -> String {
        let v = self.slicing.read();
        if !v.info.contains_key(&self.name) {
            return "undefined".into();
        }
        v.state.state_of(&self.name).to_string()
    }
    /// Who its slices serve: `name (internal|external)`.
    #[zbus(property(emits_changed_signal = "false"))]
    async fn user(&self) -> String {
        self.slicing
            .read()
            .info
            .get(&self.name)
            .map(|i| i.0.clone())
            .unwrap_or_default()
    }
    /// Its persistent VM's libvirt domain.
    #[zbus(property(emits_changed_signal = "false"))]
    async fn domain(&self) -> String {
        self.slicing
            .read()
            .info
            .get(&self.name)
            .map(|i| i.1.clone())
            .unwrap_or_default()
    }
}
