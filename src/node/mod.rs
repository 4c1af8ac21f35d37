//! The node engine: the machine as last read, what is promised (the book), the
//! live workers, and the ledger. Synchronous and single-owner: the service loop
//! owns one `Node`, tests drive one directly. Every change is committed to the
//! ledger first and mirrored in memory only after the commit succeeds.

use crate::error::{Error, Result};
use crate::placement::{self, Book, Evaluations, Grant, Machine, Mode};
use crate::request::WorkerSpec;
use crate::rotation;
use crate::schedule::{self, ScheduledAction};
use crate::store::{Store, WorkerState};
use crate::time::EpochMs;
pub use crate::worker::{Holder, Phase, State, Status, StopAsked, Worker};

mod claims;
mod counting;
mod drain;
mod group;
mod history;
mod ledger;
mod owners;
mod workloads;
pub use claims::ClusterOffer;
pub use group::GroupEnd;
mod readings;
mod schedules;
pub mod time_slicing;
pub use schedules::ScheduleChange;
use std::collections::BTreeMap;

/// What an operation changed, so the bus layer can signal exactly that.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    /// Workers whose views may read differently (their state, a GPU they
    /// hold, their processes' use).
    pub updated: Vec<String>,
    /// GPUs (by index) whose use or inventory changed.
    pub gpus: Vec<u32>,
    pub machine_changed: bool,
    /// Workers placed by this operation (their workloads are to be launched).
    pub placed: Vec<String>,
}

/// The rules a rotation is checked against, and the moment it is set.
#[derive(Clone)]
pub struct Rotation {
    pub now: jiff::Timestamp,
    pub tz: jiff::tz::TimeZone,
    /// At least this long between one slice's power-off and the next resume.
    pub buffer: std::time::Duration,
    /// How far ahead conflicts are looked for.
    pub horizon: jiff::SignedDuration,
}

/// How far ahead a schedule's preview looks for its first slices.
const PREVIEW_DAYS: i64 = 400;

/// The machine and what is promised on it, at one moment (cheap to clone).
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub machine: std::sync::Arc<Machine>,
    pub book: Book,
}

impl Snapshot {
    /// Whether every waiting worker's reasons read the same against `other`:
    /// the same book (a change replaces the GPUs' entries it touched), and
    /// the same machine but for readings that place nothing.
    pub fn explains_as(&self, other: &Snapshot) -> bool {
        let (a, b) = (&self.book, &other.book);
        let same_book = a.gpus.len() == b.gpus.len()
            && a.gpus.iter().all(|(uuid, u)| {
                b.gpus
                    .get(uuid)
                    .is_some_and(|v| std::sync::Arc::ptr_eq(u, v))
            })
            && (a.kept == b.kept && a.cpu_cores == b.cpu_cores && a.memory_bytes == b.memory_bytes);
        same_book
            && (std::sync::Arc::ptr_eq(&self.machine, &other.machine)
                || self.machine.same_but_readings(&other.machine))
    }

    /// Why worker `who` waits here, one line per GPU that could have served.
    pub fn reasons(&self, who: &str, res: &crate::request::Resources) -> Vec<String> {
        placement::reasons(&self.machine, &self.book, res, who)
    }
}

/// Where a dry run would go.
pub type Verdict = std::result::Result<Vec<Grant>, Vec<String>>;

/// What a change gave back, so a re-examination looks only where it can help.
enum Better {
    /// Anything may fit now (start, or the machine itself changed).
    Everything,
    /// These GPUs (by UUID), and the host's cores and memory when `host`.
    Some { gpus: Vec<String>, host: bool },
}

/// What a new reading of the machine can have given back: the GPUs whose
/// figures changed or that are new; everything when the machine as a whole did.
fn better_machine(old: &Machine, new: &Machine) -> Better {
    if old.name != new.name
        || old.wsl != new.wsl
        || old.cpu_cores != new.cpu_cores
        || old.memory_bytes != new.memory_bytes
    {
        return Better::Everything;
    }
    Better::Some {
        gpus: new
            .gpus
            .iter()
            .filter(|g| !old.gpus.iter().any(|o| g.places_as(o)))
            .map(|g| g.uuid.clone())
            .collect(),
        host: false,
    }
}

pub struct Node {
    /// Shared with the bus's snapshot (see [`Node::snapshot`]); replaced, never changed.
    machine: std::sync::Arc<Machine>,
    book: Book,
    workers: BTreeMap<String, Worker>,
    /// Pending workers by ledger id: oldest first.
    pending: BTreeMap<i64, String>,
    /// Workers with holders (the refresh checks only these).
    with_holders: std::collections::BTreeSet<String>,
    /// Workers whose control group was learnt (and perhaps some that ended
    /// since: [`Node::own`] reads only the running ones).
    with_cgroup: std::collections::BTreeSet<String>,
    /// Counts the changes to running workers' holders: claims built before
    /// the last one are built again (readings.rs).
    holders_changed: u64,
    /// Counts the changes to which running workers have a control group:
    /// the list of groups to look in is built again (readings.rs).
    cgroups_changed: u64,
    /// The claims [`Node::own`] built for each GPU (readings.rs).
    own_cache: readings::OwnCache,
    /// Workers to show again with the next reading: their control group's
    /// processes changed, or a reading that would have shown them failed.
    to_show_again: std::collections::BTreeSet<String>,
    /// Workers whose share is held (their limits are read back at each reading).
    held: std::collections::BTreeSet<String>,
    /// The least the pending workers ask of a GPU (ends passes early).
    needs: placement::Needs,
    store: Store,
    /// Each template's scheduled actions (time-slicing rotation).
    schedules: BTreeMap<String, Vec<ScheduledAction>>,
    /// Counts the changes to `schedules`: a [`ScheduleChange`] checked
    /// against an older count is checked again.
    schedules_changed: u64,
    /// GPU evaluations done so far (tests prove re-examination is linear).
    pub evals: Evaluations,
    /// Reasons computed since the machine or the book last changed, by worker.
    /// A Mutex (uncontended: one owner) so that asking takes `&self`.
    reasons: std::sync::Mutex<std::collections::HashMap<String, Vec<String>>>,
    /// This daemon run in the ledger (its start), once begun.
    run: Option<i64>,
    /// The metrics' counters, as the ledger has them (see `count_usage`).
    /// Shared with the page's snapshots (a pointer, not a copy of every
    /// worker's counters); copied on write once a usage interval.
    counters: std::sync::Arc<crate::usage::UsageCounters>,
    /// What each owner holds (owners.rs), kept as workers come, are placed
    /// and go: the quotas are checked on every submit, and a walk over the
    /// live workers was two thirds of a submit at 100,000 of them.
    per_owner: std::collections::HashMap<u32, crate::access::Holding>,
    /// The GPUs kept for whole requests when the open group began (see
    /// group.rs: memory's alone, so an undone group puts them back).
    kept_before_group: BTreeMap<String, String>,
}

impl Node {
    /// Rebuilds the state from the ledger: running workers keep exactly the
    /// placements the ledger holds; pending ones are examined afresh.
    pub fn open(store: Store, machine: Machine) -> Result<Node> {
        let mut node = Node {
            machine: std::sync::Arc::new(machine),
            book: Book::default(),
            workers: BTreeMap::new(),
            pending: BTreeMap::new(),
            with_holders: Default::default(),
            with_cgroup: Default::default(),
            holders_changed: 0,
            cgroups_changed: 0,
            own_cache: Default::default(),
            to_show_again: Default::default(),
            held: Default::default(),
            needs: Default::default(),
            run: None,
            counters: Default::default(),
            per_owner: Default::default(),
            kept_before_group: BTreeMap::new(),
            store,
            schedules: BTreeMap::new(),
            schedules_changed: 0,
            evals: Evaluations::default(),
            reasons: Default::default(),
        };
        // A schedule without its template would hand the baseboard to no
        // one: such schedules (from ledgers before they were bound to
        // templates) are dropped, never executed.
        for template in node.store.drop_orphan_schedules(EpochMs::now())? {
            tracing::warn!(
                template = %template,
                "dropped the schedule of {template}: no such template (it was never run)"
            );
        }
        for (template, json) in node.store.schedules()? {
            // Stored actions are normalized (+N resolved); an END_VALUE that has
            // passed since is not an error when loading, so parse as of the epoch.
            let actions =
                schedule::parse_actions(&json, jiff::Timestamp::UNIX_EPOCH).map_err(|e| {
                    Error::Backend(format!(
                        "ledger: schedule of {template} no longer parses: {e}"
                    ))
                })?;
            node.schedules.insert(template, actions);
        }
        node.load_workers()?;
        node.counters = std::sync::Arc::new(
            node.store
                .load_counters(node.workers.keys().map(String::as_str))?,
        );
        let mut changes = Changes::default();
        node.reexamine(Better::Everything, &mut changes)?;
        Ok(node)
    }

    /// The live workers as the ledger has them, into an empty book.
    pub(super) fn load_workers(&mut self) -> Result<()> {
        for row in self.store.live_workers()? {
            let spec = WorkerSpec::parse(&row.spec).map_err(|e| {
                Error::Backend(format!("ledger: worker {} no longer parses: {e}", row.name))
            })?;
            let status = match row.state {
                WorkerState::Running => {
                    self.book.add(&row.name, &spec.resources, &row.grants);
                    Status::Running { grants: row.grants }
                }
                _ => {
                    self.pending.insert(row.id, row.name.clone());
                    self.needs.add(spec.resources.gpu.as_ref());
                    Status::Pending
                }
            };
            if !row.holders.is_empty() {
                self.with_holders.insert(row.name.clone());
            }
            if row.cgroup.is_some() {
                self.with_cgroup.insert(row.name.clone());
            }
            let pending = i8::from(status == Status::Pending);
            self.tally(row.owner_uid, 1, pending, row.spec.len() as isize);
            self.workers.insert(
                row.name.clone(),
                Worker {
                    id: row.id,
                    spec,
                    spec_redacted: crate::request::redact_env(&row.spec).into(),
                    spec_text: row.spec.into(),
                    owner_uid: row.owner_uid,
                    holders: row.holders,
                    submitted: EpochMs::from_i64(row.submitted_ms),
                    placed: row.started_ms.map(EpochMs::from_i64),
                    status,
                    // A stop acknowledged before the crash is carried out
                    // (its launch, or its adoption, stops it).
                    phase: if row.stop_asked.is_some() {
                        Phase::Stopping
                    } else {
                        Phase::Held
                    },
                    runtime_id: row.runtime_id,
                    cgroup: row.cgroup,
                    cgroup_pids: Vec::new(),
                    enforcement: None,
                    stop_asked: row.stop_asked.map(|(at, by_uid)| StopAsked {
                        by_uid,
                        at: EpochMs::from_i64(at),
                    }),
                },
            );
        }
        Ok(())
    }

    pub fn machine(&self) -> &Machine {
        &self.machine
    }
    /// The machine as read last: a new reading is a new one.
    pub fn machine_shared(&self) -> std::sync::Arc<Machine> {
        self.machine.clone()
    }
    pub fn book(&self) -> &Book {
        &self.book
    }
    pub fn workers(&self) -> impl Iterator<Item = &Worker> {
        self.workers.values()
    }
    pub fn worker(&self, name: &str) -> Option<&Worker> {
        self.workers.get(name)
    }
    /// Drops holders that are gone or are no longer who they were (the pid
    /// reused): `alive` tells, per holder, whether it still is. The ledger
    /// first, then memory; the dropped ones, by worker.
    pub fn keep_holders(
        &mut self,
        alive: impl Fn(&Holder, u32) -> bool,
    ) -> Result<Vec<(String, Vec<Holder>)>> {
        let mut dropped = Vec::new();
        let names: Vec<String> = self.with_holders.iter().cloned().collect();
        for name in names {
            let w = &self.workers[&name];
            let (keep, gone): (Vec<Holder>, Vec<Holder>) =
                w.holders.iter().partition(|h| alive(h, w.owner_uid));
            if gone.is_empty() {
                continue;
            }
            self.store.set_holders(w.id, &keep)?;
            if keep.is_empty() {
                self.with_holders.remove(&name);
            }
            self.workers.get_mut(&name).expect("listed").holders = keep;
            self.holders_changed += 1;
            dropped.push((name, gone));
        }
        Ok(dropped)
    }

    /// Every live worker's holders with the uid of the worker's owner,
    /// each once.
    pub fn holders(&self) -> std::collections::HashSet<(Holder, u32)> {
        self.with_holders
            .iter()
            .flat_map(|name| {
                let w = &self.workers[name];
                w.holders.iter().map(|h| (*h, w.owner_uid))
            })
            .collect()
    }

    pub fn running_count(&self) -> usize {
        self.workers.len() - self.pending.len()
    }
    /// The pending workers' names, oldest first.
    pub fn pending_names(&self) -> impl Iterator<Item = &str> {
        self.pending.values().map(String::as_str)
    }
    pub fn pending_count(&self) -> usize {
        self.pending.len()
    }
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Submits a worker: placed now if it fits, else pending with its reasons.
    /// The spec's holders are taken as named (the service checks who they
    /// are first: [`Node::submit_parsed`]).
    pub fn submit(&mut self, spec_text: &str, owner_uid: u32) -> Result<(String, Changes)> {
        let spec = WorkerSpec::parse(spec_text)?;
        let holders = spec
            .holders
            .iter()
            .map(|&pid| Holder { pid, start: None })
            .collect();
        self.submit_parsed(spec, spec_text, owner_uid, holders)
    }

    /// As [`Node::submit`], for a spec the caller has parsed (and checked) already.
    pub fn submit_parsed(
        &mut self,
        spec: WorkerSpec,
        spec_text: &str,
        owner_uid: u32,
        holders: Vec<Holder>,
    ) -> Result<(String, Changes)> {
        let name = spec.name.clone();
        if self.workers.contains_key(&name) {
            return Err(Error::Exists(format!(
                "name: a live worker named {name} already exists; stop it first or choose another name"
            )));
        }
        let verdict = placement::fits(&self.machine, &self.book, &spec.resources, &mut self.evals);
        if verdict.is_none() {
            self.refuse_if_never_fits(&spec.resources)?;
        }
        let grants = verdict.as_deref();
        let at = EpochMs::now();
        let id = self
            .store
            .insert_worker(&name, spec_text, owner_uid, &holders, grants, at)?;
        let mut changes = Changes {
            added: vec![name.clone()],
            ..Changes::default()
        };
        let status = match verdict {
            Some(grants) => {
                self.book.add(&name, &spec.resources, &grants);
                self.forget_reasons();
                changes.gpus.extend(grants.iter().map(|g| g.gpu_index));
                changes.placed.push(name.clone());
                Status::Running { grants }
            }
            None => {
                self.pending.insert(id, name.clone());
                self.needs.add(spec.resources.gpu.as_ref());
                Status::Pending
            }
        };
        if !holders.is_empty() {
            self.with_holders.insert(name.clone());
        }
        let pending = i8::from(status == Status::Pending);
        self.tally(owner_uid, 1, pending, spec_text.len() as isize);
        self.workers.insert(
            name.clone(),
            Worker {
                id,
                spec,
                spec_text: spec_text.into(),
                spec_redacted: crate::request::redact_env(spec_text).into(),
                owner_uid,
                holders,
                submitted: at,
                placed: matches!(status, Status::Running { .. }).then_some(at),
                status,
                phase: Phase::Held,
                runtime_id: None,
                cgroup: None,
                cgroup_pids: Vec::new(),
                enforcement: None,
                stop_asked: None,
            },
        );
        self.mark_starting(&changes.placed);
        Ok((name, changes))
    }

    /// Stops a worker; its share frees and pending workers are re-examined.
    /// A caller other than root may stop only its own workers.
    pub fn stop(&mut self, name: &str, caller_uid: u32) -> Result<Changes> {
        let owner = self.check_stop(name, caller_uid)?.owner_uid;
        // Stopped by someone else (root): the record says who, and the
        // owner's notifications say so (astraeusctl notify).
        let reason = if caller_uid == owner {
            "stopped".to_string()
        } else {
            format!("stopped by uid {caller_uid}")
        };
        self.end(name, None, &reason)
    }

    /// A placed worker with a workload is asked to stop: the ask (who,
    /// when) goes into the ledger, in the caller's group, before the caller
    /// is told, and the worker is `stopping` from now on, across restarts,
    /// until its workload is gone. Asked again, the first ask stands.
    pub fn ask_stop(&mut self, name: &str, caller_uid: u32) -> Result<Changes> {
        let w = self.check_stop(name, caller_uid)?;
        if w.stop_asked.is_none() {
            let asked = StopAsked {
                by_uid: caller_uid,
                at: EpochMs::now(),
            };
            self.store.ask_stop(w.id, caller_uid, asked.at)?;
            let w = self.workers.get_mut(name).expect("checked above");
            w.stop_asked = Some(asked);
        }
        self.set_phase(name, Phase::Stopping);
        Ok(Changes {
            updated: vec![name.to_string()],
            ..Changes::default()
        })
    }

    /// Whether `caller_uid` may stop the worker: its owner or root.
    pub fn check_stop(&self, name: &str, caller_uid: u32) -> Result<&Worker> {
        let w = self
            .workers
            .get(name)
            .ok_or_else(|| Error::NotFound(format!("no live worker named {name}")))?;
        crate::access::may_stop(caller_uid, name, w.owner_uid)?;
        Ok(w)
    }

    /// A worker ends (stopped, exited, failed): the ledger records how, its
    /// share frees and pending workers are re-examined.
    pub fn end(&mut self, name: &str, exit_status: Option<i32>, reason: &str) -> Result<Changes> {
        self.end_at(name, exit_status, reason, EpochMs::now())
    }

    /// [`Node::end`] at a time the runtime reported (a container that exited
    /// while the daemon was down ended then, not when the daemon noticed).
    pub fn end_at(
        &mut self,
        name: &str,
        exit_status: Option<i32>,
        reason: &str,
        at: EpochMs,
    ) -> Result<Changes> {
        let w = self
            .workers
            .get(name)
            .ok_or_else(|| Error::NotFound(format!("no live worker named {name}")))?;
        let launched = w.spec.run.is_some();
        self.store
            .end_worker(w.id, at, exit_status, reason, launched)?;
        let w = self.workers.remove(name).expect("checked above");
        self.with_holders.remove(name);
        self.held.remove(name);
        if self.with_cgroup.remove(name) {
            self.cgroups_changed += 1;
        }
        let pending = i8::from(w.status == Status::Pending);
        self.tally(w.owner_uid, -1, -pending, -(w.spec_text.len() as isize));
        let mut changes = Changes {
            removed: vec![name.to_string()],
            ..Changes::default()
        };
        match &w.status {
            Status::Running { grants } => {
                let over_promised = self.over_promised_among(grants);
                self.book.remove(name, &w.spec.resources, grants);
                for uuid in over_promised {
                    changes.updated.extend(self.workers_on(&uuid));
                }
                changes.updated.sort_unstable();
                changes.updated.dedup();
                self.forget_reasons();
                changes.gpus.extend(self.indexes_now(grants));
                let res = &w.spec.resources;
                let better = Better::Some {
                    gpus: grants.iter().map(|g| g.gpu_uuid.clone()).collect(),
                    host: !res.cpu_cores.is_zero() || res.memory_bytes > 0,
                };
                self.reexamine(better, &mut changes)?;
            }
            Status::Pending => {
                self.pending.remove(&w.id);
                self.needs.remove(w.spec.resources.gpu.as_ref());
                self.reasons_memo().remove(name);
                self.let_go(&[name.to_string()], &mut changes)?;
            }
        }
        Ok(changes)
    }

    /// Where a request would go now, or why it would wait. Changes nothing.
    pub fn why_not(&mut self, spec_text: &str) -> Result<Verdict> {
        let spec = WorkerSpec::parse(spec_text)?;
        let verdict = placement::place(&self.machine, &self.book, &spec.resources, &mut self.evals);
        if verdict.is_err() {
            self.refuse_if_never_fits(&spec.resources)?;
        }
        Ok(verdict)
    }

    /// A request that could never be placed here, even with the machine
    /// emptied of all work and outside use, is refused instead of waiting
    /// forever; one that could fit once others leave waits.
    fn refuse_if_never_fits(&self, res: &crate::request::Resources) -> Result<()> {
        match placement::never_fits(&self.machine, res) {
            Some(reasons) => Err(Error::Unsatisfiable(format!(
                "it can never be placed on {}, even with nothing else on it: {}",
                self.machine.name,
                reasons.join("; ")
            ))),
            None => Ok(()),
        }
    }

    /// Why a pending worker waits, one line per GPU that could have served
    /// (empty when it is not pending). Computed when asked and kept until the
    /// machine or the book changes.
    pub fn reasons(&self, name: &str) -> Vec<String> {
        let Some(w) = self
            .workers
            .get(name)
            .filter(|w| w.status == Status::Pending)
        else {
            return Vec::new();
        };
        let mut memo = self.reasons_memo();
        if let Some(r) = memo.get(name) {
            return r.clone();
        }
        let r = placement::reasons(&self.machine, &self.book, &w.spec.resources, name);
        memo.insert(name.to_string(), r.clone());
        r
    }

    fn reasons_memo(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Vec<String>>> {
        self.reasons.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The machine or the book changed: every reason computed may be stale.
    fn forget_reasons(&mut self) {
        self.reasons_memo().clear();
    }

    /// The machine and the book as they are now, for explaining waits
    /// elsewhere (bus property getters) without asking this owner.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            machine: self.machine.clone(),
            book: self.book.clone(),
        }
    }

    /// One pass over the pending workers, oldest first. Placing only consumes
    /// capacity, so a worker that did not fit earlier in the pass cannot fit
    /// later in it: one pass is complete. And since no pending worker fitted
    /// before this change, only one that a GPU given back (or the host's freed
    /// cores and memory) could serve can fit now: the others cost one cheap,
    /// string-free check each ([`placement::could_use`]); no reason is built.
    fn reexamine(&mut self, better: Better, changes: &mut Changes) -> Result<()> {
        let improved: Vec<usize> = match &better {
            Better::Everything => Vec::new(),
            Better::Some { gpus, .. } => gpus
                .iter()
                .filter_map(|u| self.machine.gpus.iter().position(|g| &g.uuid == u))
                .collect(),
        };
        let mut placed = Vec::new();
        // Only GPUs were given back: once none of them could serve even the
        // least anyone waits for, nobody later in the queue fits either.
        let gpus_only = matches!(better, Better::Some { host: false, .. });
        let exhausted = |node: &Node| {
            gpus_only
                && !improved
                    .iter()
                    .any(|&i| node.needs.might_use(&node.machine.gpus[i], &node.book))
        };
        let mut done = exhausted(self);
        for (&id, name) in &self.pending {
            if done {
                break;
            }
            let w = self.workers.get(name).expect("pending workers are live");
            let res = &w.spec.resources;
            let worth_a_look = match &better {
                Better::Everything => true,
                Better::Some { host, .. } => {
                    (*host && (!res.cpu_cores.is_zero() || res.memory_bytes > 0))
                        || res.gpu.as_ref().is_some_and(|req| {
                            improved.iter().any(|&i| {
                                self.evals.0 += 1;
                                placement::could_use(
                                    &self.machine,
                                    &self.machine.gpus[i],
                                    &self.book,
                                    req,
                                )
                            })
                        })
                }
            };
            if !worth_a_look {
                continue;
            }
            if let Some(grants) =
                placement::fits_for(&self.machine, &self.book, res, name, &mut self.evals)
            {
                let at = EpochMs::now();
                // A placement the ledger refused (a full disk) leaves that
                // worker pending, in the ledger and here, and ends this
                // pass; those placed before it stand (each committed, or in
                // the caller's group) and are applied below. Failing the
                // whole re-examination would leave them placed in the
                // ledger and the book but pending here, and fail the change
                // that asked for the pass although it was made.
                if let Err(e) = self.store.start_worker(id, &grants, at) {
                    tracing::error!("placing worker {name} failed, it waits: {e}");
                    break;
                }
                self.book.add(name, res, &grants);
                changes.gpus.extend(grants.iter().map(|g| g.gpu_index));
                placed.push((id, name.clone(), grants, at));
                done = exhausted(self);
            }
        }
        for (id, name, grants, at) in placed {
            self.pending.remove(&id);
            if let Some(w) = self.workers.get_mut(&name) {
                self.needs.remove(w.spec.resources.gpu.as_ref());
                w.status = Status::Running { grants };
                w.placed = Some(at);
                // Launched before, waiting again after an undone group.
                if w.cgroup.is_some() {
                    self.cgroups_changed += 1;
                }
                let owner = w.owner_uid;
                self.tally(owner, 0, -1, 0);
            }
            changes.placed.push(name.clone());
            changes.updated.push(name);
        }
        if !changes.placed.is_empty() {
            self.forget_reasons();
        }
        changes.gpus.sort_unstable();
        changes.gpus.dedup();
        self.mark_starting(&changes.placed);
        // GPUs kept for workers just placed serve others again.
        let placed = changes.placed.clone();
        self.let_go(&placed, changes)
    }

    /// Placed workers whose workload is to be launched are `starting` at once.
    fn mark_starting(&mut self, placed: &[String]) {
        for name in placed {
            if let Some(w) = self.workers.get_mut(name) {
                if w.launches() && w.phase == Phase::Held {
                    w.phase = Phase::Starting;
                }
            }
        }
    }

    /// Closed energy / utilisation intervals go to the ledger for the usage report.
    pub fn record_usage(&mut self, rows: &[crate::usage::Interval], at: EpochMs) -> Result<()> {
        self.store.insert_intervals(rows, self.run, at)
    }

    /// Removes a template and its schedule.
    pub fn remove_template(&mut self, name: &str) -> Result<bool> {
        let removed = self.store.remove_template(name, EpochMs::now())?;
        self.schedules.remove(name);
        // A schedule for it being checked now must not be saved after.
        if removed {
            self.schedules_changed += 1;
        }
        Ok(removed)
    }

    /// When the previous daemon run was last alive (its downtime starts there).
    pub fn previous_run_end(&self) -> Result<Option<i64>> {
        self.store.previous_run_end(self.run)
    }

    /// This daemon run begins: from now until its last sign of life it is up.
    pub fn begin_run(&mut self, at: EpochMs) -> Result<()> {
        self.run = Some(self.store.begin_run(at)?);
        Ok(())
    }

    /// A sign of life (a clean stop): the run was up until `at_ms`.
    pub fn alive(&mut self, at: EpochMs) -> Result<()> {
        match self.run {
            Some(run) => self.store.alive(run, at),
            None => Ok(()),
        }
    }

    /// Every template's actions, by template name.
    pub fn rotation(&self) -> Vec<(String, Vec<ScheduledAction>)> {
        self.schedules
            .iter()
            .map(|(t, a)| (t.clone(), a.clone()))
            .collect()
    }

    pub fn schedule(&self, template: &str) -> Option<&[ScheduledAction]> {
        self.schedules.get(template).map(Vec::as_slice)
    }

    /// Who owns the GPU baseboard when, in [from, to), by start; with the
    /// slices conflicting schedules leave out (ends_by `dropped:…`), so a
    /// listing never hides one (the notes say why).
    pub fn slices(
        &self,
        from: jiff::Timestamp,
        to: jiff::Timestamp,
        tz: &jiff::tz::TimeZone,
    ) -> Vec<rotation::Slice> {
        let rotation = self.rotation();
        let mut all = rotation::timeline(&rotation, from, to, tz);
        all.extend(rotation::dropped_slices(&rotation, from, to, tz));
        all.sort_by(|a, b| (a.start, &a.template).cmp(&(b.start, &b.template)));
        all
    }

    /// What the slice preview must say besides the slices: listed days that do
    /// not occur in the window (day 31 in a 30-day month, day 365 outside leap years).
    pub fn slice_notes(
        &self,
        from: jiff::Timestamp,
        to: jiff::Timestamp,
        tz: &jiff::tz::TimeZone,
    ) -> Vec<String> {
        // Conflicts the schedules' check did not see (set under older rules).
        let mut notes = rotation::conflicts(&self.rotation(), from, to, tz, 20);
        for (template, actions) in &self.schedules {
            for (i, a) in actions.iter().enumerate() {
                for line in a.missing_days(from, to, tz, 50) {
                    notes.push(format!(
                        "template {template}, actions[{i}] ({}): {line}",
                        a.action.as_str()
                    ));
                }
            }
        }
        notes
    }

    /// GPU mode by index, for the bus and CLI.
    pub fn gpu_mode(&self, uuid: &str) -> Mode {
        self.book.mode(uuid)
    }

    /// Broken invariants, if any (tests and the crash harness use this).
    pub fn audit(&self) -> Vec<String> {
        let mut broken = Vec::new();
        for g in &self.machine.gpus {
            let Some(u) = self.book.usage(&g.uuid) else {
                continue;
            };
            if u.whole.is_some() && !u.sharers().is_empty() {
                broken.push(format!("GPU {} is both whole and shared", g.index));
            }
            if g.sliced {
                broken.push(format!("GPU {} is time-sliced but has workers", g.index));
            }
        }
        for (uuid, keeper) in &self.book.kept {
            if self
                .workers
                .get(keeper)
                .is_none_or(|w| w.status != Status::Pending)
            {
                broken.push(format!(
                    "GPU {uuid} is kept for {keeper}, which does not wait"
                ));
            }
        }
        for w in self.workers.values() {
            if w.status == Status::Pending {
                if self.reasons(w.name()).is_empty() {
                    broken.push(format!("pending worker {} has no reason", w.name()));
                }
                if placement::fits_for(
                    &self.machine,
                    &self.book,
                    &w.spec.resources,
                    w.name(),
                    &mut Evaluations::default(),
                )
                .is_some()
                {
                    broken.push(format!("pending worker {} would fit now", w.name()));
                }
            }
        }
        broken
    }
}
