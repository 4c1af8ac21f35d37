//! `org.astraeus.Node1.Worker`: one object per live worker. Its pending
//! reasons are explained when read, from the loop's latest snapshot.

use super::{BusError, Delta, Loop};
use crate::command::Command;
use crate::views::{Shared, Waits, WorkerView};
use crate::worker::State;
use std::collections::HashMap;
use zbus::message::Header;
use zbus::{interface, Connection};

#[derive(Clone)]
pub struct WorkerObject {
    pub lp: Loop,
    pub view: Shared<WorkerView>,
    /// What it asked for (fixed for its life): its reasons are computed from it.
    pub resources: crate::request::Resources,
    pub waits: Waits,
}

impl WorkerObject {
    /// Its name and why it waits, as ListPending sends them.
    pub fn name_and_reasons(&self) -> (String, Vec<String>) {
        let name = self.view.read().name.clone();
        let reasons = self.waits.explain(&name, &self.resources);
        (name, reasons)
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
            .ask_for(&caller, &hdr, |reply| Command::Stop {
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
        self.view.read().state.as_str().into()
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
    /// Pids whose GPU memory counts as this worker's own (a holder that is
    /// gone is dropped).
    #[zbus(property)]
    async fn holders(&self) -> Vec<u32> {
        self.view.read().holders.clone()
    }
    /// Computed when read (a queue of thousands would otherwise be rebuilt on
    /// every change); PropertiesChanged only invalidates it, and only for
    /// workers whose reasons someone read.
    #[zbus(property(emits_changed_signal = "invalidates"))]
    async fn pending_reasons(&self) -> Vec<String> {
        let (name, state) = {
            let v = self.view.read();
            (v.name.clone(), v.state)
        };
        self.waits.mark_read(&name);
        if state != State::Pending {
            return Vec::new();
        }
        self.waits.explain(&name, &self.resources)
    }
    #[zbus(property)]
    async fn warnings(&self) -> Vec<String> {
        self.view.read().warnings.clone()
    }
    /// When it was submitted (epoch milliseconds).
    #[zbus(property(emits_changed_signal = "const"))]
    async fn submitted_ms(&self) -> i64 {
        self.view.read().submitted_ms
    }
    /// When it was placed (epoch milliseconds); 0 while it waits.
    #[zbus(property)]
    async fn placed_ms(&self) -> i64 {
        self.view.read().placed_ms
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
        let v = self.view.read();
        if crate::access::sees_env(caller.map(|c| c.uid), v.owner) {
            v.request.clone()
        } else {
            v.request_redacted.clone()
        }
    }
}

/// Borrowed, for a variant that copies nothing.
fn strs(list: &[String]) -> Vec<&str> {
    list.iter().map(String::as_str).collect()
}

impl WorkerObject {
    /// InterfacesAdded for this worker at `path`, its properties as a reader
    /// without credentials reads them (the request with `run.*.env`
    /// hidden), built from the view itself: zbus's GetAll, which it used
    /// to go through, copies every value into a map of owned variants
    /// first, 6 % of the daemon's time at 50 callers (#25). tests/dbus.rs
    /// compares the two.
    pub fn added_message(&self, path: &str) -> zbus::Result<zbus::Message> {
        use zbus::Variant;
        let v = self.view.read();
        // As the getter does: marked before it reads; only a waiting
        // worker has reasons (and only its reads are told to read again).
        let reasons = if v.state == State::Pending {
            self.waits.mark_read(&v.name);
            self.waits.explain(&v.name, &self.resources)
        } else {
            Vec::new()
        };
        let gpus: Vec<(u32, &str)> = v.gpus.iter().map(|(i, u)| (*i, u.as_str())).collect();
        let properties: HashMap<&str, Variant<'_>> = HashMap::from([
            ("Name", Variant::from(v.name.as_str())),
            ("State", v.state.as_str().into()),
            ("Owner", v.owner.into()),
            ("Gpus", gpus.into()),
            ("GpuSharedGb", v.gpu_shared_gb.into()),
            ("Holders", v.holders.clone().into()),
            ("PendingReasons", strs(&reasons).into()),
            ("Warnings", strs(&v.warnings).into()),
            ("SubmittedMs", v.submitted_ms.into()),
            ("PlacedMs", v.placed_ms.into()),
            ("GpuUsedGb", v.gpu_used_gb.into()),
            ("Request", v.request_redacted.as_str().into()),
        ]);
        let interfaces =
            HashMap::from([(<Self as zbus::object_server::Interface>::name(), properties)]);
        zbus::Message::signal(
            super::BASE_PATH,
            "org.freedesktop.DBus.ObjectManager",
            "InterfacesAdded",
        )
        .build(&(zbus::ObjectPath::try_from(path)?, interfaces))
    }

    /// What changed since `old`, as one PropertiesChanged to send.
    pub fn delta(&self, old: &WorkerView) -> Delta {
        let n = self.view.read().clone();
        let mut d = Delta::new("org.astraeus.Node1.Worker");
        let left_or_joined_queue =
            old.state != n.state && (old.state == State::Pending || n.state == State::Pending);
        d.invalidate(left_or_joined_queue, "PendingReasons");
        d.set(old.state != n.state, "State", n.state.as_str());
        d.set(old.gpus != n.gpus, "Gpus", n.gpus);
        d.set(old.placed_ms != n.placed_ms, "PlacedMs", n.placed_ms);
        d.set(old.holders != n.holders, "Holders", n.holders);
        d.set(old.warnings != n.warnings, "Warnings", n.warnings);
        d.set(old.gpu_used_gb != n.gpu_used_gb, "GpuUsedGb", n.gpu_used_gb);
        d
    }
}
