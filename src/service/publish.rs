//! Publishing: the bus objects and the views behind them kept in line with
//! the node. In two phases: [`Service::show`] adds and removes objects and
//! replaces views before a reply (whatever a caller reads after it is
//! current); [`Service::announce`] sends the signals after it.

use super::Service;
use crate::bus::gpu::GpuObject;
use crate::bus::manager::{Manager, ManagerSignals};
use crate::bus::template::TemplateObject;
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
use sd_notify::NotifyState;
use std::collections::BTreeSet;
use zbus::Connection;

/// What is on the bus, and the views the objects read.
pub(super) struct Published {
    /// GPU objects by index.
    gpus: BTreeSet<u32>,
    /// Template objects by name.
    templates: BTreeSet<String>,
    /// What worker objects explain waits from.
    waits: Waits,
    /// What template objects compute their slices from (a copy of the
    /// node's schedules: the loop reads the node's own).
    pub rotation: Shared<RotationView>,
    /// What template objects show of the handoff.
    pub slicing: Shared<SlicingView>,
}

impl Published {
    /// The Manager, the ObjectManager, and one object per GPU and worker.
    pub async fn register(
        conn: &Connection,
        node: &Node,
        lp: &Loop,
        tz: &jiff::tz::TimeZone,
    ) -> zbus::Result<Published> {
        let server = conn.object_server();
        let manager = Manager {
            lp: lp.clone(),
            view: Shared::new(manager_view(node, tz)),
        };
        server.at(BASE_PATH, manager).await?;
        server.at(BASE_PATH, zbus::fdo::ObjectManager).await?;
        let mut gpus = BTreeSet::new();
        for g in &node.machine().gpus {
            let view = Shared::new(gpu_view(node, g));
            server.at(gpu_path(g.index), GpuObject { view }).await?;
            gpus.insert(g.index);
        }
        let waits = Waits::default();
        waits.replace(node.snapshot());
        for w in node.workers() {
            server
                .at(worker_path(w.name()), worker_object(node, w, lp, &waits))
                .await?;
        }
        Ok(Published {
            gpus,
            templates: BTreeSet::new(),
            waits,
            rotation: Shared::new(RotationView {
                templates: node.rotation(),
                tz: tz.clone(),
            }),
            slicing: Shared::new(SlicingView::default()),
        })
    }
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
    /// Workers whose view was replaced, with the view before.
    workers: Vec<(String, WorkerView)>,
    stale_reasons: Vec<String>,
    gpus: Vec<(u32, GpuView)>,
    manager: Option<ManagerView>,
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
    pub(super) async fn publish(&mut self, changes: &Changes) {
        let shown = self.show(changes).await;
        self.announce(shown).await;
    }

    /// The part of publishing a reply must wait for: objects added and
    /// removed, and every view replaced, so that whatever a caller reads after
    /// the reply is current. No signal but the ObjectManager's own.
    pub(super) async fn show(&mut self, changes: &Changes) -> Shown {
        let mut shown = Shown::default();
        if let Err(e) = self.try_show(changes, &mut shown).await {
            tracing::error!("updating D-Bus objects failed: {e}");
        }
        shown
    }

    /// The signals of what [`Service::show`] changed, sent after the reply.
    pub(super) async fn announce(&mut self, shown: Shown) {
        if let Err(e) = self.try_announce(shown).await {
            tracing::error!("signalling D-Bus changes failed: {e}");
        }
        let status = crate::views::status_line(&self.node);
        let _ = sd_notify::notify(&[NotifyState::Status(&status)]);
    }

    async fn try_show(&mut self, changes: &Changes, shown: &mut Shown) -> zbus::Result<()> {
        let server = self.conn.object_server();
        // Waits are explained from this moment on; reasons read before may differ.
        let read_before = self.published.waits.replace(self.node.snapshot());
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
            let obj = worker_object(&self.node, w, &self.lp, &self.published.waits);
            server.at(p.as_str(), obj).await?;
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
                .is_some_and(|w| w.state() == State::Pending);
            if pending && !changes.added.contains(&name) {
                shown.stale_reasons.push(name);
            }
        }
        // GPUs: add or remove objects when the inventory's shape changed.
        let now: BTreeSet<u32> = self.node.machine().gpus.iter().map(|g| g.index).collect();
        for gone in self.published.gpus.difference(&now) {
            server
                .remove::<GpuObject, _>(gpu_path(*gone).as_str())
                .await?;
        }
        for g in &self.node.machine().gpus {
            let view = gpu_view(&self.node, g);
            if !self.published.gpus.contains(&g.index) {
                let view = Shared::new(view);
                server.at(gpu_path(g.index), GpuObject { view }).await?;
            } else if changes.machine_changed || changes.gpus.contains(&g.index) {
                let iface = server
                    .interface::<_, GpuObject>(gpu_path(g.index).as_str())
                    .await?;
                let old = iface.get().await.view.replace(view);
                shown.gpus.push((g.index, old));
            }
        }
        self.published.gpus = now;
        let manager = server.interface::<_, Manager>(BASE_PATH).await?;
        let view = manager_view(&self.node, &self.slice_rules.tz);
        shown.manager = Some(manager.get().await.view.replace(view));
        Ok(())
    }

    async fn try_announce(&mut self, shown: Shown) -> zbus::Result<()> {
        let server = self.conn.object_server();
        let manager = server.interface::<_, Manager>(BASE_PATH).await?;
        let path = |p: String| object_path(p).map_err(|e| zbus::Error::Failure(e.to_string()));
        for (name, p) in shown.removed {
            manager.worker_removed(&name, path(p)?).await?;
        }
        for (name, p) in shown.added {
            manager.worker_new(&name, path(p)?).await?;
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

    /// One worker's view replaced and its changes signalled.
    pub(super) async fn publish_worker(&mut self, name: &str) -> zbus::Result<()> {
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
        let new_state = view.state;
        let old = obj.view.replace(view);
        if old.state != new_state {
            log_state(&self.node, w);
        }
        Ok(Some(old))
    }

    /// Template objects follow the schedules: one per template that has one.
    pub(super) async fn publish_rotation(&mut self) -> zbus::Result<()> {
        self.published.rotation.replace(RotationView {
            templates: self.node.rotation(),
            tz: self.slice_rules.tz.clone(),
        });
        self.publish_templates().await
    }

    /// Template objects for every template defined or scheduled, and the
    /// slicing view behind them.
    pub(super) async fn publish_templates(&mut self) -> zbus::Result<()> {
        let mut names: BTreeSet<String> =
            self.node.rotation().into_iter().map(|(t, _)| t).collect();
        let view = self.slicing.as_ref().map(|s| s.view()).unwrap_or_default();
        names.extend(view.info.keys().cloned());
        self.published.slicing.replace(view);
        let server = self.conn.object_server();
        for name in self.published.templates.difference(&names) {
            server
                .remove::<TemplateObject, _>(template_path(name).as_str())
                .await?;
        }
        for name in names.difference(&self.published.templates) {
            let obj = TemplateObject {
                name: name.clone(),
                rotation: self.published.rotation.clone(),
                slicing: self.published.slicing.clone(),
            };
            server.at(template_path(name), obj).await?;
        }
        self.published.templates = names;
        Ok(())
    }
}
