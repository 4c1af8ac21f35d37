//! Publishing: the bus objects and the views behind them kept in line with
//! the node. In two phases: [`Service::show`] adds and removes objects and
//! replaces views before a reply (whatever a caller reads after it is
//! current); [`Service::announce`] sends the signals after it.

use super::Service;
use crate::bus::gpu::GpuObject;
use crate::bus::manager::Manager;
use crate::bus::offload::Offloaded;
use crate::bus::template::TemplateObject;
use crate::bus::tree::{self, Above, Dir, Directory, FlatIntrospection, ObjectManager, Objects};
use crate::bus::worker::WorkerObject;
use crate::bus::{gpu_path, object_path, template_path, worker_path, Loop, BASE_PATH};
use crate::journal;
use crate::node::{Changes, Node, Status, Worker};
use crate::placement;
use crate::views::{
    gpu_view, manager_view, worker_view, GpuView, ManagerView, RotationView, Shared, SlicingView,
    Waits, WorkerView,
};
use crate::worker::State;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use zbus::object_server::SignalEmitter;
use zbus::Connection;

/// What is on the bus, and the views the objects read.
pub(super) struct Published {
    /// The reading the GPU objects were last matched with: one object
    /// per GPU of it.
    gpus_of: Arc<crate::placement::Machine>,
    /// Template objects by name.
    templates: BTreeSet<String>,
    /// What worker objects explain waits from.
    waits: Waits,
    /// Every object below the base path, as the listings read them.
    objects: Objects,
    /// What the Manager's properties read.
    manager: Shared<ManagerView>,
    /// PendingReasons invalidations not sent yet.
    stale_reasons: StaleReasons,
    /// The Manager's and GPUs' PropertiesChanged held back.
    held: HeldProperties,
    /// What template objects compute their slices from (a copy of the
    /// node's schedules: the loop reads the node's own).
    pub rotation: Shared<RotationView>,
    /// What template objects show of the handoff.
    pub slicing: Shared<SlicingView>,
}

impl Published {
    pub fn objects(&self) -> Objects {
        self.objects.clone()
    }

    /// The Manager, the ObjectManager, the paths down to the objects, and one
    /// object per GPU and worker.
    pub async fn register(
        conn: &Connection,
        node: &Node,
        lp: &Loop,
        settings: &super::Settings,
    ) -> zbus::Result<Published> {
        let (tz, lists) = (&settings.slice_rules.tz, &settings.lists);
        let server = conn.object_server();
        let objects = Objects::default();
        let manager_shown = Shared::new(manager_view(node, tz));
        let manager = Manager {
            lp: lp.clone(),
            view: manager_shown.clone(),
            objects: objects.clone(),
            page: settings.page.clone(),
            containers: settings.containers_by.clone(),
        };
        let object_manager = ObjectManager {
            objects: objects.clone(),
            lp: lp.clone(),
        };
        let interfaces_xml = tree::base_interfaces_xml(&[&manager, &object_manager]);
        server
            .at(
                BASE_PATH,
                Offloaded::new(manager, crate::bus::manager::LISTINGS, lists.clone()),
            )
            .await?;
        // The paths above the objects introspect flat, and stay (before the
        // ObjectManager: nothing is announced for them).
        let flat = |above| FlatIntrospection {
            above,
            objects: objects.clone(),
            lp: lp.clone(),
        };
        let parts: Vec<&'static str> = BASE_PATH.split('/').skip(1).collect();
        for (depth, child) in parts.iter().enumerate() {
            let path = format!("/{}", parts[..depth].join("/"));
            tree::flatten(server, &path, flat(Above::Path { child }), lists).await?;
        }
        tree::flatten(
            server,
            BASE_PATH,
            flat(Above::Base { interfaces_xml }),
            lists,
        )
        .await?;
        for dir in Dir::ALL {
            server.at(dir.path(), Directory).await?;
            tree::flatten(server, &dir.path(), flat(Above::Dir(dir)), lists).await?;
        }
        server
            .at(
                BASE_PATH,
                Offloaded::new(object_manager, &["GetManagedObjects"], lists.clone()),
            )
            .await?;
        for g in &node.machine().gpus {
            let obj = GpuObject {
                view: Shared::new(gpu_view(node, g)),
            };
            server.at(gpu_path(g.index), obj.clone()).await?;
            objects.add_gpu(g.index, obj);
        }
        let waits = Waits::default();
        waits.replace(node.snapshot());
        for w in node.workers() {
            let obj = worker_object(node, w, lp, &waits);
            server.at(worker_path(w.name()), obj.clone()).await?;
            objects.add_worker(w.name(), obj);
        }
        Ok(Published {
            gpus_of: node.machine_shared(),
            templates: BTreeSet::new(),
            waits,
            objects,
            manager: manager_shown,
            stale_reasons: StaleReasons::default(),
            held: HeldProperties::default(),
            rotation: Shared::new(RotationView {
                templates: node.rotation(),
                tz: tz.clone(),
            }),
            slicing: Shared::new(SlicingView::default()),
        })
    }
}

/// After a call, the Manager's and each GPU's PropertiesChanged are sent
/// at most once this often, within this long of the change, with the
/// values then: every submit and stop changes both (counts, memory taken),
/// and on a 2-vCPU machine their two signals, serialised and routed while
/// the caller waited for a CPU to read its reply, were a large part of a
/// lone call's time beyond its floor (docs/benchmarks.md). A reader never
/// sees a stale value: the views behind the properties are replaced before
/// each reply.
pub(super) const PROPERTIES_EVERY: Duration = Duration::from_millis(50);

/// The Manager's and GPUs' views as last announced, while changes to them
/// wait for their PropertiesChanged ([`PROPERTIES_EVERY`]).
#[derive(Default)]
struct HeldProperties {
    /// When the first change held back was made.
    since: Option<Instant>,
    gpus: BTreeMap<u32, GpuView>,
    manager: Option<ManagerView>,
}

/// Workers whose PendingReasons are to be invalidated, and whether a job to
/// send them is already queued.
#[derive(Clone, Default)]
struct StaleReasons {
    names: Arc<Mutex<BTreeSet<String>>>,
    queued: Arc<AtomicBool>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn worker_object(node: &Node, w: &Worker, lp: &Loop, waits: &Waits) -> WorkerObject {
    WorkerObject {
        lp: lp.clone(),
        view: Shared::new(worker_view(node, w)),
        resources: w.spec.resources.clone(),
        waits: waits.clone(),
    }
}

/// What [`Service::show`] changed, for [`Service::announce`] to signal.
#[derive(Default)]
pub(super) struct Shown {
    /// (name, object path) of workers whose objects went or came.
    removed: Vec<(String, String)>,
    added: Vec<(String, String)>,
    /// Workers whose objects went in the group that added them: announced
    /// with WorkerRemoved only (their InterfacesAdded was never sent).
    removed_unseen: Vec<(String, String)>,
    /// Workers whose view was replaced, with the view before.
    workers: Vec<(String, WorkerView)>,
    stale_reasons: Vec<String>,
    gpus: Vec<(u32, GpuView)>,
    manager: Option<ManagerView>,
}

impl Shown {
    /// Only the views that changed: for an undone group, whose objects
    /// were added and removed on the bus silently and never announced.
    pub(super) fn without_objects(mut self) -> Shown {
        self.added.clear();
        self.removed.clear();
        self.removed_unseen.clear();
        self
    }

    /// A group's changes, to be announced one after another: each object's
    /// PropertiesChanged is sent once, from its view before the group to
    /// its view now (one per change repeated the same final values: at 50
    /// callers the bus daemon spent more on our signals than on the calls).
    /// Objects added and removed keep their order. A view from before a
    /// worker's object was removed belongs to that object, gone (a name
    /// stopped and submitted again in the group is another object): only
    /// views from after its last removal count. An object added and
    /// removed within the group was never announced (gone when announced):
    /// its removal is not either.
    pub(super) fn coalesce(group: Vec<Shown>) -> Vec<Shown> {
        let removed_at: std::collections::HashMap<String, usize> = group
            .iter()
            .enumerate()
            .flat_map(|(i, s)| s.removed.iter().map(move |(name, _)| (name.clone(), i)))
            .collect();
        // Names whose object is gone at the group's end: the last thing
        // the group did to them was a removal.
        let added_at: std::collections::HashMap<String, usize> = group
            .iter()
            .enumerate()
            .flat_map(|(i, s)| s.added.iter().map(move |(name, _)| (name.clone(), i)))
            .collect();
        let gone_at_end = |name: &str| {
            removed_at
                .get(name)
                .is_some_and(|&r| added_at.get(name).is_none_or(|&a| a < r))
        };
        let mut added_so_far = std::collections::HashSet::new();
        let mut workers = std::collections::HashSet::new();
        let mut gpus = BTreeSet::new();
        let mut manager = false;
        group
            .into_iter()
            .enumerate()
            .map(|(i, mut s)| {
                let (unseen, seen) = std::mem::take(&mut s.removed)
                    .into_iter()
                    .partition(|(name, _)| added_so_far.contains(name) && gone_at_end(name));
                (s.removed_unseen, s.removed) = (unseen, seen);
                added_so_far.extend(s.added.iter().map(|(name, _)| name.clone()));
                s.workers.retain(|(name, _)| {
                    removed_at.get(name).is_none_or(|&r| i > r) && workers.insert(name.clone())
                });
                s.gpus.retain(|(index, _)| gpus.insert(*index));
                if manager {
                    s.manager = None;
                }
                manager |= s.manager.is_some();
                s
            })
            .collect()
    }
}

/// What a warning is about, without its changing numbers: a breach or an
/// over-promise is logged once, not at every refresh.
fn warning_key(w: &str) -> &str {
    let end = w.find([':', '(']).unwrap_or(w.len());
    &w[..end]
}

/// placed / pending, with the worker and its GPUs as journal fields.
fn log_state(node: &Node, w: &Worker) {
    let name = w.name();
    match &w.status {
        Status::Running { grants } => {
            let gpus: Vec<String> = grants.iter().map(|g| g.gpu_index.to_string()).collect();
            tracing::info!(
                message_id = journal::PLACED,
                worker = %name,
                gpu = %gpus.join(" "),
                "worker {name} placed: {}",
                placement::gpus_column(grants)
            );
        }
        Status::Pending => tracing::info!(
            message_id = journal::PENDING,
            worker = %name,
            "worker {name} waits: {}",
            node.reasons(name).join("; ")
        ),
    }
}

impl Service {
    /// Brings bus objects in line with the node after `changes`, signalling
    /// only what differs: [`Service::show`], then [`Service::announce`].
    pub(super) fn publish(&mut self, changes: &Changes) {
        let shown = self.show(changes);
        self.announce(shown);
    }

    /// The part of publishing a reply must follow: objects added and removed
    /// (queued on the outbox, ahead of the reply) and every view replaced now,
    /// so that whatever a caller reads after the reply is current.
    pub(super) fn show(&mut self, changes: &Changes) -> Shown {
        let mut shown = Shown::default();
        // Waits are explained from this moment on; reasons read before may differ.
        let read_before = self.published.waits.replace(self.node.snapshot());
        for name in &changes.removed {
            tracing::info!(message_id = journal::EXITED, worker = %name, "worker {name} ended; its share is free");
            let p = worker_path(name);
            self.published.objects.remove_worker(name);
            self.on_conn("removing a worker object", move |conn| async move {
                conn.object_server()
                    .remove::<WorkerObject, _>(p.as_str())
                    .await
                    .map(drop)
            });
            shown.removed.push((name.clone(), worker_path(name)));
        }
        for name in &changes.added {
            let Some(w) = self.node.worker(name) else {
                continue;
            };
            let p = worker_path(name);
            let obj = worker_object(&self.node, w, &self.lp, &self.published.waits);
            self.published.objects.add_worker(name, obj.clone());
            self.on_conn("adding a worker object", move |conn| async move {
                conn.object_server().at(p, obj).await.map(drop)
            });
            log_state(&self.node, w);
            shown.added.push((name.clone(), worker_path(name)));
        }
        // The workers whose views may read differently: a change's own, and
        // those a reading, a stop or an undone group names (node/readings.rs).
        for name in &changes.updated {
            if changes.added.contains(name) {
                continue;
            }
            if let Some(old) = self.show_worker(name) {
                shown.workers.push((name.clone(), old));
            }
        }
        // Reasons someone read may read differently now: they read again.
        for name in read_before {
            let pending = self
                .node
                .worker(&name)
                .is_some_and(|w| w.state() == State::Pending);
            if pending && !changes.added.contains(&name) {
                shown.stale_reasons.push(name);
            }
        }
        // Only a new reading (a new machine) changes the inventory's shape,
        // even one whose changes were lost to a failed re-examination;
        // otherwise only the GPUs the change touched are looked at, not
        // every GPU of the machine per call.
        let machine = self.node.machine_shared();
        if !Arc::ptr_eq(&self.published.gpus_of, &machine) {
            self.show_inventory(machine, &mut shown);
        } else {
            for &index in &changes.gpus {
                if shown.gpus.iter().any(|(i, _)| *i == index) {
                    continue;
                }
                let gpu = self.node.machine().gpus.iter().find(|g| g.index == index);
                if let (Some(g), Some(obj)) = (gpu, self.published.objects.gpu(index)) {
                    shown
                        .gpus
                        .push((index, obj.view.replace(gpu_view(&self.node, g))));
                }
            }
        }
        let view = manager_view(&self.node, &self.slice_rules.tz);
        shown.manager = Some(self.published.manager.replace(view));
        shown
    }

    /// The signals of what [`Service::show`] changed, queued after the reply.
    pub(super) fn announce(&mut self, shown: Shown) {
        let unseen = shown.removed_unseen.into_iter().map(|r| (r, false));
        for ((name, p), announced) in shown.removed.into_iter().map(|r| (r, true)).chain(unseen) {
            if announced {
                let path = p.clone();
                self.on_conn("InterfacesRemoved", move |conn| async move {
                    tree::interfaces_removed::<WorkerObject>(&conn, &path).await
                });
            }
            self.signal("WorkerRemoved", BASE_PATH.into(), move |e| async move {
                Manager::worker_removed(&e, &name, owned_path(p)?).await
            });
        }
        for (name, p) in shown.added {
            // Its properties as they are when announced (a worker added and
            // removed in one group has no object left to announce).
            if let Some(obj) = self.published.objects.worker(&name) {
                let path = p.clone();
                self.on_conn("InterfacesAdded", move |conn| async move {
                    let added = obj.added_message(&path)?;
                    conn.send(&added).await
                });
            }
            self.signal("WorkerNew", BASE_PATH.into(), move |e| async move {
                Manager::worker_new(&e, &name, owned_path(p)?).await
            });
        }
        // A worker that ended meanwhile has no object left to signal from.
        for (name, old) in shown.workers {
            if let Some(obj) = self.published.objects.worker(&name) {
                let delta = obj.delta(&old);
                if !delta.is_empty() {
                    self.signal(
                        "PropertiesChanged",
                        worker_path(&name),
                        move |e| async move { delta.emit(&e).await },
                    );
                }
            }
        }
        self.invalidate_reasons(shown.stale_reasons);
        for (index, old) in shown.gpus {
            let Some(obj) = self.published.objects.gpu(index) else {
                continue;
            };
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
            // The view announced last is kept: the signal, when sent, says
            // what changed since then. Nothing is held (nor woken for)
            // when nothing changed.
            if !obj.delta(&old).is_empty() {
                self.published.held.gpus.entry(index).or_insert(old);
            }
        }
        if let Some(old) = shown.manager {
            if !Manager::delta(&old, &self.published.manager.read()).is_empty() {
                self.published.held.manager.get_or_insert(old);
            }
        }
        let held = &mut self.published.held;
        if held.since.is_none() && (held.manager.is_some() || !held.gpus.is_empty()) {
            held.since = Some(Instant::now());
        }
        // Told to systemd at most once a second, not per change: see
        // `Service::run`.
        self.status_stale = true;
    }

    /// How long until the held PropertiesChanged are due (None: none held).
    pub(super) fn properties_due_in(&self) -> Option<Duration> {
        let since = self.published.held.since?;
        Some(PROPERTIES_EVERY.saturating_sub(since.elapsed()))
    }

    /// The Manager's and GPUs' PropertiesChanged held back, sent when due,
    /// or with `now` at once (no caller waits: a tick woke the loop, or
    /// the daemon is stopping).
    pub(super) fn send_held_properties(&mut self, now: bool) {
        if !now && self.properties_due_in().is_none_or(|d| !d.is_zero()) {
            return;
        }
        let held = std::mem::take(&mut self.published.held);
        for (index, old) in held.gpus {
            // A GPU gone meanwhile has no object left to signal from.
            let Some(obj) = self.published.objects.gpu(index) else {
                continue;
            };
            let delta = obj.delta(&old);
            if !delta.is_empty() {
                self.signal("PropertiesChanged", gpu_path(index), move |e| async move {
                    delta.emit(&e).await
                });
            }
        }
        if let Some(old) = held.manager {
            let delta = Manager::delta(&old, &self.published.manager.read());
            if !delta.is_empty() {
                self.signal("PropertiesChanged", BASE_PATH.into(), move |e| async move {
                    delta.emit(&e).await
                });
            }
        }
    }

    /// PendingReasons invalidated for `names`, coalesced: one job sends
    /// every name gathered until it runs, so a burst of changes while
    /// thousands of workers' reasons were read (one GetManagedObjects reads
    /// them all) costs one signal per worker, not one per worker per change.
    fn invalidate_reasons(&mut self, names: Vec<String>) {
        if names.is_empty() {
            return;
        }
        let stale = &self.published.stale_reasons;
        lock(&stale.names).extend(names);
        if stale.queued.swap(true, Ordering::SeqCst) {
            return;
        }
        let (stale, objects, conn) = (
            stale.clone(),
            self.published.objects.clone(),
            self.conn.clone(),
        );
        self.outbox.send(async move {
            stale.queued.store(false, Ordering::SeqCst);
            let names = std::mem::take(&mut *lock(&stale.names));
            for name in names {
                let Some(obj) = objects.worker(&name) else {
                    continue;
                };
                let sent = match SignalEmitter::new(&conn, worker_path(&name)) {
                    Ok(e) => obj.pending_reasons_invalidate(&e).await,
                    Err(e) => Err(e),
                };
                if let Err(e) = sent {
                    tracing::error!("sending PropertiesChanged failed: {e}");
                }
            }
        });
    }

    /// Queues a job on the bus connection (a change of zbus's object tree,
    /// an announcement) on the outbox; a failure is logged (`what` names it).
    pub(super) fn on_conn<F, Fut>(&self, what: &'static str, f: F)
    where
        F: FnOnce(Connection) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = zbus::Result<()>> + Send,
    {
        let conn = self.conn.clone();
        self.outbox.send(async move {
            if let Err(e) = f(conn).await {
                tracing::error!("{what} failed: {e}");
            }
        });
    }

    /// Queues a signal from `path` on the outbox; a failure is logged.
    pub(super) fn signal<F, Fut>(&self, what: &'static str, path: String, f: F)
    where
        F: FnOnce(SignalEmitter<'static>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = zbus::Result<()>> + Send,
    {
        let conn = self.conn.clone();
        self.outbox.send(async move {
            let sent = match SignalEmitter::new(&conn, path) {
                Ok(e) => f(e.into_owned()).await,
                Err(e) => Err(e),
            };
            if let Err(e) = sent {
                tracing::error!("sending {what} failed: {e}");
            }
        });
    }

    /// One worker's view replaced and its changes signalled.
    pub(super) fn publish_worker(&mut self, name: &str) {
        if let Some(old) = self.show_worker(name) {
            let workers = vec![(name.to_string(), old)];
            self.announce(Shown {
                workers,
                ..Shown::default()
            });
        }
    }

    /// GPU objects added and removed to match a new reading of the
    /// inventory, and every GPU's view replaced.
    fn show_inventory(&mut self, machine: Arc<crate::placement::Machine>, shown: &mut Shown) {
        let before = std::mem::replace(&mut self.published.gpus_of, machine);
        let now: BTreeSet<u32> = self.node.machine().gpus.iter().map(|g| g.index).collect();
        let gone = before
            .gpus
            .iter()
            .map(|g| g.index)
            .filter(|i| !now.contains(i));
        for gone in gone {
            self.published.objects.remove_gpu(gone);
            self.on_conn("removing a GPU object", move |conn| async move {
                tree::remove_announced::<GpuObject>(&conn, &gpu_path(gone)).await
            });
        }
        for g in &self.node.machine().gpus {
            if let Some(obj) = self.published.objects.gpu(g.index) {
                let view = gpu_view(&self.node, g);
                shown.gpus.push((g.index, obj.view.replace(view)));
            } else {
                let obj = GpuObject {
                    view: Shared::new(gpu_view(&self.node, g)),
                };
                self.published.objects.add_gpu(g.index, obj.clone());
                let p = gpu_path(g.index);
                self.on_conn("adding a GPU object", move |conn| async move {
                    tree::add_announced(&conn, &p, obj).await
                });
            }
        }
    }

    /// Replaces a worker's view; the one before, to signal the difference.
    fn show_worker(&self, name: &str) -> Option<WorkerView> {
        let w = self.node.worker(name)?;
        let Some(obj) = self.published.objects.worker(name) else {
            tracing::error!(worker = %name, "worker {name} has no object to show");
            return None;
        };
        let view = worker_view(&self.node, w);
        // Said once per kind of warning, as a GPU's are: its figures
        // ("3.1 GB now") change with every reading, and another user's
        // memory moving them must not make a journal line a reading.
        for warning in view.warnings.iter().filter(|w| {
            let key = warning_key(w);
            !obj.view
                .read()
                .warnings
                .iter()
                .any(|old| warning_key(old) == key)
        }) {
            tracing::warn!(message_id = journal::WORKER_WARNING, worker = %name, "worker {name}: {warning}");
        }
        let new_state = view.state;
        let old = obj.view.replace(view);
        // One journal event when a worker is placed or starts to wait, not
        // one per step of its launch (starting → running → stopping).
        if (old.state == State::Pending) != (new_state == State::Pending) {
            log_state(&self.node, w);
        }
        Some(old)
    }

    /// Template objects follow the schedules: one per template that has one.
    pub(super) fn publish_rotation(&mut self) {
        self.published.rotation.replace(RotationView {
            templates: self.node.rotation(),
            tz: self.slice_rules.tz.clone(),
        });
        self.publish_templates()
    }

    /// Template objects for every template defined or scheduled, and the
    /// slicing view behind them.
    pub(super) fn publish_templates(&mut self) {
        let mut names: BTreeSet<String> =
            self.node.rotation().into_iter().map(|(t, _)| t).collect();
        let view = self.slicing.as_ref().map(|s| s.view()).unwrap_or_default();
        names.extend(view.info.keys().cloned());
        // Each template whose VM changed state says so (PropertiesChanged).
        let changed: Vec<(String, String)> = {
            let old = self.published.slicing.read();
            names
                .intersection(&self.published.templates)
                .filter(|t| old.state_of(t) != view.state_of(t))
                .map(|t| {
                    let state = view.state_of(t).map_or("undefined", |s| s.as_str());
                    (t.clone(), state.to_string())
                })
                .collect()
        };
        self.published.slicing.replace(view);
        for (name, state) in changed {
            let mut delta = crate::bus::Delta::new("org.astraeus.Node1.Template");
            delta.set(true, "State", state);
            self.signal(
                "PropertiesChanged",
                template_path(&name),
                move |e| async move { delta.emit(&e).await },
            );
        }
        for name in self.published.templates.difference(&names) {
            self.published.objects.remove_template(name);
            let p = template_path(name);
            self.on_conn("removing a template object", move |conn| async move {
                tree::remove_announced::<TemplateObject>(&conn, &p).await
            });
        }
        for name in names.difference(&self.published.templates) {
            let obj = TemplateObject {
                name: name.clone(),
                rotation: self.published.rotation.clone(),
                slicing: self.published.slicing.clone(),
            };
            self.published.objects.add_template(name, obj.clone());
            let p = template_path(name);
            self.on_conn("adding a template object", move |conn| async move {
                tree::add_announced(&conn, &p, obj).await
            });
        }
        self.published.templates = names;
    }
}

fn owned_path(p: String) -> zbus::Result<zbus::OwnedObjectPath> {
    object_path(p).map_err(|e| zbus::Error::Failure(e.to_string()))
}
