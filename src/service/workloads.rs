//! Workloads: launch → watch → exit, and after a start, reconcile the ledger
//! with what the runtimes really run. Every runtime call runs in a task; its
//! result comes back to the loop as a command (Launched, Cgroup, Exited,
//! Listed).

use super::Service;
use crate::access::{Caller, Workload};
use crate::command::{Command, Reply};
use crate::error::{Error, Result};
use crate::inventory::limits::{Enforcement, GpuId, Hold, Limits};
use crate::journal;
use crate::node::Phase;
use crate::request::{Run, WorkerSpec};
use crate::runtime::{Exit, Found, Kind, Runtime, Started};
use crate::time::EpochMs;
use crate::worker::State;
use std::sync::Arc;
use std::time::Duration;

/// A reason as it is logged and kept: a runtime's error may quote what the
/// owner wrote (an image, an exec path), so printable, and at most 1,000
/// characters (10,000 ended workers are listed in one reply).
fn reason_text(said: &str) -> String {
    crate::text::clipped(&crate::text::printable(said), 1000)
}

/// How often, and how far apart, a name service that cannot answer (a
/// directory server not up yet at boot) is asked whether a worker's owner
/// is still in the access group before its launch is refused.
const MEMBERSHIP_TRIES: u32 = 5;
const MEMBERSHIP_PAUSE: Duration = Duration::from_secs(2);

/// Whether `uid` is still in `group`: a "no" refuses the launch, and so
/// does a name service that could not answer after a few tries (fail
/// closed), each told as what it is.
async fn still_member(uid: u32, group: String) -> Result<()> {
    let mut tries = 0;
    loop {
        let g = group.clone();
        let lookup = tokio::task::spawn_blocking(move || {
            // A test holds the name service here, as a stalled LDAP would.
            crate::failpoint::hit("launch.membership");
            crate::auth::membership(uid, &g)
        });
        let limit = crate::deadline::of(crate::deadline::NSS);
        let asked = match tokio::time::timeout(limit, lookup).await {
            Ok(asked) => asked,
            Err(_) => Ok(Err(format!(
                "the name service did not answer within {} s",
                limit.as_secs_f64()
            ))),
        };
        let why = match asked {
            Ok(Ok(true)) => return Ok(()),
            Ok(Ok(false)) => format!(
                "its access was withdrawn after it was submitted: uid {uid} is no longer in \
                 group {group}"
            ),
            Ok(Err(e)) if tries + 1 < MEMBERSHIP_TRIES => {
                tries += 1;
                tracing::warn!("{e}; asking again in {} s", MEMBERSHIP_PAUSE.as_secs());
                tokio::time::sleep(MEMBERSHIP_PAUSE).await;
                continue;
            }
            Ok(Err(e)) => format!(
                "whether uid {uid} is still in group {group} could not be checked, so it was \
                 not run: {e}"
            ),
            Err(e) => format!("checking whether uid {uid} is in group {group} failed: {e}"),
        };
        return Err(Error::AccessDenied(why));
    }
}

/// The primary group of `uid` from the name service (off the loop, within
/// its deadline): a member's container runs with it. Unknown, the launch
/// is refused (fail closed: never root's group by default).
async fn primary_group(uid: u32) -> Result<u32> {
    let lookup = tokio::task::spawn_blocking(move || crate::auth::primary_gid(uid));
    let limit = crate::deadline::of(crate::deadline::NSS);
    match tokio::time::timeout(limit, lookup).await {
        Ok(Ok(Some(gid))) => Ok(gid),
        Ok(_) => Err(Error::AccessDenied(format!(
            "uid {uid} has no entry in the user database, so the group its container would \
             run with is unknown"
        ))),
        Err(_) => Err(Error::AccessDenied(format!(
            "the name service did not say uid {uid}'s primary group within {} s",
            limit.as_secs_f64()
        ))),
    }
}

/// When a runtime's listing failed after a start, the first pause before
/// it is asked again; each failure doubles it, up to the second.
const RELIST_FIRST: Duration = Duration::from_secs(2);
const RELIST_MOST: Duration = Duration::from_secs(60);

/// The runtimes this daemon was given, by kind.
pub(super) struct Runtimes {
    pub containers: Option<Arc<dyn Runtime>>,
    /// The container engine and its socket, as the started event says it.
    pub containers_by: Option<String>,
    pub units: Option<Arc<dyn Runtime>>,
    pub vms: Option<Arc<dyn Runtime>>,
    /// Graceful stop, then forced after this long.
    pub stop_timeout: Duration,
    /// A member's container runs with at most this many processes.
    pub member_max_processes: u64,
    pub reconciling: Reconciling,
    /// Whether container workers run through Docker (no init step: never held).
    pub containers_docker: bool,
    /// What sets shared workers' GPU memory limits, and the hard limit's rule.
    pub limits: Arc<dyn crate::inventory::limits::MemoryLimits>,
    pub hard_limit: crate::config::HardLimit,
    /// The limits each shared worker (name, id) was given, as set: what
    /// readings are compared with and what is cleared at its end (not
    /// worked out again: `hard_limit = "offered"` moves with outside use,
    /// and a reload may change the rule for later launches only).
    pub holds: std::collections::HashMap<String, (i64, Hold)>,
    /// Held workers whose limits are being set again (one at a time each).
    pub reapplying: std::collections::HashMap<String, i64>,
    /// Workers (name, id) whose workload is being stopped: one task each,
    /// trying until the runtime says it is done.
    pub stopping: std::collections::HashMap<String, (i64, tokio::task::JoinHandle<()>)>,
}

/// A stop that fails or is not answered is tried again after this, then
/// twice as long each time, up to the most.
const STOP_AGAIN_FIRST: Duration = Duration::from_secs(1);
const STOP_AGAIN_MOST: Duration = Duration::from_secs(30);

/// Stops a workload until its runtime says it is done: graceful at first;
/// a call that fails or is not answered (an engine away, or one that
/// takes the call and never replies) is tried again with back-off, and
/// once the stop's timeout has passed, as the engine's kill. Ends when a
/// call succeeds (the watcher then reports the end) or the worker ends.
async fn stop_until_done(rt: Arc<dyn Runtime>, id: String, timeout: Duration) {
    let asked = tokio::time::Instant::now();
    let mut pause = STOP_AGAIN_FIRST;
    loop {
        let kill = asked.elapsed() >= timeout;
        let result = if kill {
            rt.kill(&id).await
        } else {
            rt.stop(&id, timeout).await
        };
        match result {
            Ok(()) => return,
            Err(e) => {
                let how = if kill { "killing" } else { "stopping" };
                tracing::warn!(
                    "{how} {id}: {e}; trying again in {} s (a stop is carried out until it \
                     is done)",
                    pause.as_secs()
                );
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(STOP_AGAIN_MOST);
            }
        }
    }
}

/// The reconciling after a start, while a runtime's listing is awaited
/// (asked again while it fails): the workers launched or followed
/// meanwhile are this run's own, and not reconciled again (a workload
/// still being created is not in a listing taken before; launched once
/// more, it would fail or be removed from under its first start).
#[derive(Default)]
pub(super) struct Reconciling {
    awaited: std::collections::HashSet<Kind>,
    ours: std::collections::HashSet<String>,
}

impl Reconciling {
    /// A worker launched or followed by this run.
    fn ours(&mut self, name: &str) {
        if !self.awaited.is_empty() {
            self.ours.insert(name.to_string());
        }
    }

    /// `kind`'s listing answered (or is no news): once every kind's has,
    /// no name need be kept.
    fn done(&mut self, kind: Kind) {
        self.awaited.remove(&kind);
        if self.awaited.is_empty() {
            self.ours = Default::default();
        }
    }
}

impl Runtimes {
    fn get(&self, kind: Kind) -> Option<Arc<dyn Runtime>> {
        match kind {
            Kind::Container => self.containers.clone(),
            Kind::Unit => self.units.clone(),
            Kind::Vm => self.vms.clone(),
        }
    }
}

impl Service {
    /// Whether the caller may run this spec's workload, and whether this
    /// daemon has a runtime for it.
    pub(super) fn may_run(&self, spec: &WorkerSpec, caller: &Caller) -> Result<()> {
        let (workload, missing) = match &spec.run {
            None => (Workload::Reservation, None),
            Some(Run::Container { .. }) => (
                Workload::Container,
                self.runtimes.containers.is_none().then_some((
                    "run.container",
                    "this daemon has no container runtime (set runtime.containers)",
                )),
            ),
            Some(Run::Unit { .. }) => (
                Workload::Unit,
                self.runtimes.units.is_none().then_some((
                    "run.unit",
                    "this daemon has no service manager to start units with",
                )),
            ),
            Some(Run::Vm(_)) => (
                Workload::Vm,
                self.runtimes.vms.is_none().then_some((
                    "run.vm",
                    "this daemon has no VM runtime (set runtime.libvirt_uri)",
                )),
            ),
        };
        self.access.may_run(caller, workload)?;
        let env = match &spec.run {
            Some(Run::Container { env, .. }) => Some(("run.container.env", env)),
            Some(Run::Unit { env, .. }) => Some(("run.unit.env", env)),
            _ => None,
        };
        if let Some((field, env)) = env {
            crate::access::may_set_env(caller, self.access.owner, field, env.keys())?;
        }
        match missing {
            Some((field, why)) => Err(Error::field(field, why)),
            None => Ok(()),
        }
    }

    /// Starts the workloads of workers just placed, each in its own task.
    pub(super) async fn launch_placed(&mut self, placed: &[String]) {
        for name in placed {
            self.launch(name, None).await;
        }
    }

    /// Starts one worker's workload in a task; a `stale` one of the same
    /// name (created, never started) is removed first, in the same task.
    async fn launch(&mut self, name: &str, stale: Option<String>) {
        let Some(w) = self.node.worker(name) else {
            return;
        };
        let Some(kind) = w.kind() else {
            return;
        };
        let (Some(rt), Some(mut launch)) = (self.runtimes.get(kind), w.launch(self.node.machine()))
        else {
            return;
        };
        launch.hold = self.hold_for(w);
        let member = w.owner_uid != 0 && self.access.owner != Some(w.owner_uid);
        if kind == Kind::Container && member {
            launch.max_processes = Some(self.runtimes.member_max_processes);
        }
        if let Some(hold) = &launch.hold {
            let kept = (w.id, hold.clone());
            self.runtimes.holds.insert(name.to_string(), kept);
        }
        if w.phase == Phase::Stopping {
            // Asked to stop after it was placed and before this launch (in
            // the same group, or before a crash): its caller was told it
            // stops, so it never runs; a stale one never started goes too.
            let reason = match w.stop_asked {
                Some(asked) => asked.reason(w.owner_uid, None, EpochMs::now()),
                None => "stopped".to_string(),
            };
            if let Some(id) = stale {
                tokio::spawn(async move {
                    let _ = rt.remove(&id).await;
                });
            }
            // Boxed: ending it frees a share, which launches what it places.
            Box::pin(self.end_worker(name, None, &reason, None)).await;
            return;
        }
        // Allowed when it was submitted; the switch that allowed it may have
        // been turned off since (a reload) while it waited for its GPUs.
        let workload = match kind {
            Kind::Container => Workload::Container,
            Kind::Unit => Workload::Unit,
            Kind::Vm => Workload::Vm,
        };
        let owner = Caller {
            uid: w.owner_uid,
            pid: None,
            member: true,
        };
        let allowed = self.access.may_run(&owner, workload).map_err(|e| {
            Error::AccessDenied(format!(
                "its access was withdrawn after it was submitted: {}",
                e.message()
            ))
        });
        self.node.set_phase(name, Phase::Starting);
        self.publish_worker(name);
        self.runtimes.reconciling.ours(name);
        let tx = self.lp.tx.clone();
        let name = name.to_string();
        let (uid, group) = (owner.uid, self.access.group.clone());
        let owner_is_daemons = self.access.owner == Some(uid);
        tokio::spawn(async move {
            if let Some(id) = stale {
                let _ = rt.remove(&id).await;
            }
            // Nor may it run for someone taken out of the access group while
            // it waited (NSS, which may be slow, off the loop).
            let allowed = match allowed {
                Ok(()) if owner_is_daemons => Ok(()),
                Ok(()) => still_member(uid, group).await,
                refused => refused,
            };
            // A member's container runs with the member's primary group
            // (not root's, an engine's default for a bare uid).
            let allowed = match allowed {
                Ok(()) if kind == Kind::Container && uid != 0 && !owner_is_daemons => {
                    primary_group(uid).await.map(|gid| launch.group = Some(gid))
                }
                other => other,
            };
            // Refused, it ends as a launch that failed, in a turn of its own
            // (ended here, the next it frees room for would be launched
            // within this call, and so on down the queue).
            let result = match allowed {
                Ok(()) => rt.start(&launch).await,
                Err(e) => Err(e),
            };
            // Never dropped: a lost report would leak a share.
            let _ = tx.send(Command::Launched { name, kind, result }).await;
        });
    }

    pub(super) async fn launched(
        &mut self,
        name: String,
        kind: Kind,
        result: Result<crate::runtime::Started>,
    ) {
        let Some(rt) = self.runtimes.get(kind) else {
            return;
        };
        let live = self.node.worker(&name).is_some();
        match (result, live) {
            (Ok(started), true) => {
                if let (Some(e), Some(w)) = (started.enforcement, self.node.worker(&name)) {
                    let id = w.id;
                    self.enforced(&name, id, e);
                }
                let id = started.id;
                let short = &id[..20.min(id.len())];
                let how = match (&self.runtimes.containers_by, kind) {
                    (Some(engine), Kind::Container) => format!(" through {engine}"),
                    _ => String::new(),
                };
                let gpus = started
                    .gpus_by
                    .map(|g| format!("; its GPUs {g}"))
                    .unwrap_or_default();
                tracing::info!(
                    message_id = journal::STARTED,
                    worker = %name,
                    "worker {name} started{how} ({short}){gpus}"
                );
                if let Err(e) = self.follow_workload(&name, kind, &id).await {
                    tracing::error!(worker = %name, "recording the launch failed: {e}");
                }
            }
            (Ok(Started { id, .. }), false) => {
                // Stopped while it was starting: nothing may keep running.
                let timeout = self.runtimes.stop_timeout;
                tokio::spawn(async move {
                    let _ = rt.stop(&id, timeout).await;
                    let _ = rt.remove(&id).await;
                });
            }
            (Err(e), true) => {
                let reason = reason_text(&format!("failed to start: {}", e.message()));
                tracing::warn!(message_id = journal::EXITED, worker = %name, "worker {name} {reason}");
                self.end_worker(&name, None, &reason, None).await;
            }
            (Err(_), false) => {}
        }
    }

    /// A live worker's workload is known, launched or found running after a
    /// restart: its id is recorded and its end watched, and a StopWorker
    /// that came while the id was unknown (nothing to stop then) is carried
    /// out now.
    async fn follow_workload(&mut self, name: &str, kind: Kind, id: &str) -> Result<()> {
        self.runtimes.reconciling.ours(name);
        let recorded = self.node.set_launched(name, id);
        self.watch(name.to_string(), kind, id.to_string());
        let stop_asked = self
            .node
            .worker(name)
            .is_some_and(|w| w.phase == Phase::Stopping);
        if stop_asked {
            self.stop_workload(name).await;
        } else {
            self.publish_worker(name);
        }
        recorded
    }

    /// The GPU memory limits a shared worker gets on each GPU it holds:
    /// soft its share, hard its share or that and what no one is promised
    /// (`sharing.hard_limit`), as it starts. None for whole GPUs, VMs (a passed-through
    /// GPU is the guest's), reservations and workers without GPUs; a
    /// claim's is set on its container's group.
    pub(super) fn hold_for(&self, w: &crate::worker::Worker) -> Option<Hold> {
        let share = w.spec.shared_gb()?;
        // A claim's share is held on its pod's container (BindClaim).
        let in_a_group =
            matches!(w.kind(), Some(Kind::Container | Kind::Unit)) || w.spec.claim.is_some();
        if !in_a_group || w.grants().is_empty() {
            return None;
        }
        let machine = self.node.machine();
        let gpus = w
            .grants()
            .iter()
            .map(|g| {
                let now = machine.gpus.iter().find(|m| m.uuid == g.gpu_uuid);
                // "offered": its share and what no one is promised on the
                // GPU as it starts (others' soft limits still guarantee
                // theirs: a borrower is the one evicted under pressure).
                let hard = match (self.runtimes.hard_limit, now) {
                    (crate::config::HardLimit::Offered, Some(m)) => {
                        let taken = self.node.book().taken(&g.gpu_uuid);
                        share + m.offered().saturating_sub(taken)
                    }
                    _ => share,
                };
                let id = GpuId {
                    uuid: g.gpu_uuid.clone(),
                    pci: now.map(|m| m.pci_bus_id.clone()).unwrap_or_default(),
                };
                let index = now.map_or(g.gpu_index, |m| m.index);
                let limits = Limits {
                    soft: share.bytes(),
                    hard: hard.bytes(),
                };
                (index, id, limits)
            })
            .collect();
        Some(Hold {
            backend: self.runtimes.limits.clone(),
            gpus,
        })
    }

    /// A held worker whose limits a reading read back as other than set
    /// (a GPU reset clears them; a driver may lose them): set again and
    /// read back, off the loop; until then it stays `held` (a reading
    /// a moment ago found it so) unless that fails.
    pub(super) fn reapply_lost_limits(&mut self) {
        let machine = self.node.machine();
        let mut lost = Vec::new();
        for w in self.node.held_workers() {
            if self.runtimes.reapplying.contains_key(w.name()) {
                continue;
            }
            let hold = self
                .runtimes
                .holds
                .get(w.name())
                .filter(|(id, _)| *id == w.id);
            let (Some((_, hold)), Some(cgroup)) = (hold, w.cgroup.clone()) else {
                continue;
            };
            let hold = hold.clone();
            let differs = hold.gpus.iter().find_map(|(index, gpu, want)| {
                let g = machine.gpus.iter().find(|g| g.uuid == gpu.uuid)?;
                let read = g.held_use.iter().find(|h| h.worker == w.name())?;
                (read.limits != Some((want.soft, want.hard))).then_some(*index)
            });
            if let Some(index) = differs {
                lost.push((w.name().to_string(), w.id, hold, cgroup, index));
            }
        }
        for (name, id, hold, cgroup, index) in lost {
            tracing::warn!(
                worker = %name,
                "worker {name}'s GPU memory limits on GPU {index} are no longer what was set \
                 (a GPU reset clears them): setting them again"
            );
            self.runtimes.reapplying.insert(name.clone(), id);
            self.apply_hold_off_loop(name, id, hold, cgroup, None);
        }
    }

    /// Sets a worker's limits on `cgroup` and reads them back, off the
    /// loop; what that found comes back as `Command::Enforced`, and then
    /// (a hook waiting for it) `told` hears it in words.
    pub(super) fn apply_hold_off_loop(
        &self,
        name: String,
        id: i64,
        hold: Hold,
        cgroup: String,
        told: Option<Reply<Result<String>>>,
    ) {
        let tx = self.lp.tx.clone();
        tokio::spawn(async move {
            let enforcement = crate::runtime::apply_hold(hold, Some(cgroup)).await;
            let said = enforcement.to_string();
            let cmd = Command::Enforced {
                name,
                id,
                enforcement,
            };
            let _ = tx.send(cmd).await;
            if let Some(told) = told {
                let _ = told.send(Ok(said));
            }
        });
    }

    /// Records what a launch or check found of a worker's limits.
    pub(super) fn enforced(&mut self, name: &str, id: i64, e: Enforcement) {
        if self.runtimes.reapplying.get(name) == Some(&id) {
            self.runtimes.reapplying.remove(name);
        }
        if let Enforcement::Promised(why) = &e {
            if self.node.worker(name).is_some_and(|w| w.id == id) {
                tracing::info!(worker = %name, "worker {name}'s GPU memory share is promised, not held: {why}");
            }
        }
        self.node.set_enforcement(name, id, e);
        self.publish_worker(name);
    }

    /// A running shared worker whose limits are not known (adopted after a
    /// restart): they are set again on its control group and read back,
    /// off the loop.
    pub(super) fn check_hold(&mut self, name: &str, cgroup: String) {
        let Some(w) = self.node.worker(name) else {
            return;
        };
        if w.enforcement.is_some() || w.phase != Phase::Running {
            return;
        }
        let (Some(hold), id) = (self.hold_for(w), w.id) else {
            return;
        };
        // Docker's containers run their command as they are made: one found
        // running after a restart was never held, and is not now.
        if w.kind() == Some(Kind::Container) && self.runtimes.containers_docker {
            let why = crate::runtime::docker::NO_INIT_STEP.to_string();
            self.enforced(name, id, Enforcement::Promised(why));
            return;
        }
        self.runtimes
            .holds
            .insert(name.to_string(), (id, hold.clone()));
        self.apply_hold_off_loop(name.to_string(), id, hold, cgroup, None);
    }

    /// A worker's limits go as it ends (removing its group clears them
    /// too; this clears them where the group outlives it: a claim's pod).
    pub(super) fn clear_hold(&mut self, name: &str) {
        let kept = self.runtimes.holds.remove(name);
        let held = self.node.worker(name).and_then(|w| {
            let held = w.enforcement == Some(Enforcement::Held);
            let hold = kept.filter(|(id, _)| *id == w.id).map(|(_, h)| h);
            held.then(|| hold.zip(w.cgroup.clone()))?
        });
        if let Some((hold, cgroup)) = held {
            tokio::task::spawn_blocking(move || hold.clear(&cgroup));
        }
    }

    /// Ends a worker, at the runtime's own time when it has one.
    async fn end_worker(
        &mut self,
        name: &str,
        status: Option<i32>,
        reason: &str,
        at: Option<EpochMs>,
    ) {
        let at = at.unwrap_or_else(EpochMs::now);
        if let Some((_, stopping)) = self.runtimes.stopping.remove(name) {
            stopping.abort();
        }
        self.clear_hold(name);
        // Listed to anyone (the ended list) and logged.
        let reason = reason_text(reason);
        match self.node.end_at(name, status, &reason, at) {
            Ok(changes) => {
                self.publish(&changes);
                self.launch_placed(&changes.placed).await;
            }
            Err(e) => tracing::error!(worker = %name, "ending the worker failed: {e}"),
        }
    }

    /// Waits for the workload's end in a task of its own (the runtime's own
    /// wait or change signals, not polling).
    fn watch(&self, name: String, kind: Kind, id: String) {
        let Some(rt) = self.runtimes.get(kind) else {
            return;
        };
        let tx = self.lp.tx.clone();
        let (cg_rt, cg_tx, cg_id, cg_name) = (rt.clone(), tx.clone(), id.clone(), name.clone());
        tokio::spawn(async move {
            if let Some(cgroup) = cg_rt.cgroup(&cg_id).await {
                let cmd = Command::Cgroup {
                    name: cg_name,
                    cgroup,
                };
                let _ = cg_tx.send(cmd).await;
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

    pub(super) async fn exited(&mut self, name: String, kind: Kind, id: String, exit: Exit) {
        self.exited_at(name, kind, id, exit, None).await
    }

    async fn exited_at(
        &mut self,
        name: String,
        kind: Kind,
        id: String,
        exit: Exit,
        at: Option<EpochMs>,
    ) {
        let ours = self
            .node
            .worker(&name)
            .is_some_and(|w| w.runtime_id.as_deref() == Some(id.as_str()));
        if let Some(rt) = self.runtimes.get(kind) {
            let id = id.clone();
            tokio::spawn(async move {
                let _ = rt.remove(&id).await;
            });
        }
        if !ours {
            return;
        }
        let (status, mut reason) = match &exit {
            Exit::Exited(code) => (Some(*code), format!("exited with status {code}")),
            Exit::Failed(why) => (None, reason_text(&format!("failed: {why}"))),
        };
        // Its stop was asked: the stop is why it ended (and whether it had
        // to be killed), not the status its workload's end happened to give.
        let stopped = self
            .node
            .worker(&name)
            .and_then(|w| Some((w.stop_asked?, w.owner_uid)));
        if let (Some((asked, owner)), Exit::Exited(_)) = (stopped, &exit) {
            reason = asked.reason(owner, status, at.unwrap_or_else(EpochMs::now));
        }
        tracing::info!(message_id = journal::EXITED, worker = %name, "worker {name} {reason}");
        self.end_worker(&name, status, &reason, at).await;
    }

    /// Graceful stop, then forced, tried until the runtime says it is
    /// done; the watcher reports the end. A stop already under way for
    /// this worker is not started twice.
    pub(super) async fn stop_workload(&mut self, name: &str) {
        self.node.set_phase(name, Phase::Stopping);
        self.publish_worker(name);
        let Some(w) = self.node.worker(name) else {
            return;
        };
        let rt = w.kind().and_then(|k| self.runtimes.get(k));
        let (Some(rt), Some(id)) = (rt, w.runtime_id.clone()) else {
            return; // still starting: stopped when its launch reports back
        };
        let worker_id = w.id;
        let under_way = self
            .runtimes
            .stopping
            .get(name)
            .is_some_and(|(id, task)| *id == worker_id && !task.is_finished());
        if under_way {
            return;
        }
        let task = tokio::spawn(stop_until_done(rt, id, self.runtimes.stop_timeout));
        self.runtimes
            .stopping
            .insert(name.to_string(), (worker_id, task));
    }

    /// Placed workers of this kind (their workloads should exist).
    fn placed_of(&self, kind: Kind) -> Vec<(String, Option<String>)> {
        self.node
            .workers()
            .filter(|w| w.kind() == Some(kind) && w.state() != State::Pending)
            .map(|w| (w.name().to_string(), w.runtime_id.clone()))
            .collect()
    }

    /// After a start: asks each runtime what it runs, in tasks; the answers
    /// come back as [`Command::Listed`] for [`Service::reconcile_kind`].
    pub(super) fn reconcile(&mut self) {
        for kind in [Kind::Container, Kind::Unit, Kind::Vm] {
            if self.runtimes.get(kind).is_none() {
                continue;
            }
            // libvirt is only connected to when VMs are in play: a host without
            // VM workers keeps libvirt unloaded (memory, keepalive wake-ups).
            // VMs are created only after the ledger holds their worker, so none
            // of ours can run unknown to an empty ledger.
            if kind == Kind::Vm && self.placed_of(kind).is_empty() {
                continue;
            }
            self.runtimes.reconciling.awaited.insert(kind);
            self.list_after(kind, 0, Duration::ZERO);
        }
    }

    /// Lists `kind`'s workloads after `pause`, for [`Service::reconcile_kind`].
    fn list_after(&self, kind: Kind, tries: u32, pause: Duration) {
        let Some(rt) = self.runtimes.get(kind) else {
            return;
        };
        let tx = self.lp.tx.clone();
        tokio::spawn(async move {
            tokio::time::sleep(pause).await;
            let found = rt.list().await;
            // A test holds a listing here while the loop launches others.
            crate::failpoint::hit_async("runtime.listed").await;
            let _ = tx.send(Command::Listed { kind, found, tries }).await;
        });
    }

    /// The ledger against what really runs: running workloads are adopted,
    /// ended ones are ended, missing ones launched once; nothing starts
    /// twice (workloads are named by worker).
    pub(super) async fn reconcile_kind(
        &mut self,
        kind: Kind,
        found: Result<Vec<Found>>,
        tries: u32,
    ) {
        let Some(rt) = self.runtimes.get(kind) else {
            return;
        };
        let mut live = self.placed_of(kind);
        live.retain(|(name, _)| !self.runtimes.reconciling.ours.contains(name));
        let found = match found {
            Ok(f) => f,
            // No podman (or service manager) on a host that uses none is no news.
            Err(e) if live.is_empty() => {
                tracing::debug!("cannot list {kind:?} workloads: {e}");
                self.runtimes.reconciling.done(kind);
                return;
            }
            // Podman's API restarting with the daemon, say: until a listing
            // answers, no one watches these workloads (an exit or a stop
            // would never free their shares) and those placed but never
            // launched wait; so it is asked again, less often each time.
            Err(e) => {
                let pause = RELIST_FIRST
                    .saturating_mul(1 << tries.min(5))
                    .min(RELIST_MOST);
                let again = pause.as_secs();
                if tries == 0 {
                    tracing::error!(
                        "cannot reconcile {kind:?} workloads (they stay as the ledger says; \
                         listing again in {again} s): {e}"
                    );
                } else {
                    tracing::warn!("cannot list {kind:?} workloads yet (again in {again} s): {e}");
                }
                self.list_after(kind, tries + 1, pause);
                return;
            }
        };
        self.runtimes.reconciling.done(kind);
        let timeout = self.runtimes.stop_timeout;
        for f in &found {
            if !live.iter().any(|(n, _)| *n == f.worker) {
                tracing::warn!(
                    "removing {} of worker {}, which the ledger no longer holds",
                    f.id,
                    f.worker
                );
                let (rt, id) = (rt.clone(), f.id.clone());
                tokio::spawn(async move {
                    let _ = rt.stop(&id, timeout).await;
                    let _ = rt.remove(&id).await;
                });
            }
        }
        let mut relaunch = Vec::new();
        for (name, runtime_id) in live {
            match found.iter().find(|f| f.worker == name) {
                Some(f) if f.running => {
                    tracing::info!(worker = %name, "adopted the running workload of worker {name}");
                    if let Err(e) = self.follow_workload(&name, kind, &f.id).await {
                        tracing::error!(worker = %name, "adopting failed: {e}");
                    }
                }
                Some(f) if f.exit_code.is_none() => {
                    // Created but never started (a crash between the two): start afresh.
                    self.launch(&name, Some(f.id.clone())).await;
                }
                Some(f) => {
                    // Ended while we were down.
                    let _ = self.node.set_launched(&name, &f.id);
                    let code = f.exit_code.unwrap_or_default();
                    // Ended at the runtime's own time: billed until then, not until now.
                    let ended = f.ended_ms.map(EpochMs::from_i64);
                    self.exited_at(name, kind, f.id.clone(), Exit::Exited(code), ended)
                        .await;
                }
                None if runtime_id.is_none() => relaunch.push(name),
                None => {
                    let why = "its workload vanished while the daemon was down";
                    tracing::warn!(message_id = journal::EXITED, worker = %name, "worker {name} failed: {why}");
                    self.end_worker(&name, None, &format!("failed: {why}"), None)
                        .await;
                }
            }
        }
        self.launch_placed(&relaunch).await;
    }
}
