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
    /// Whether its GPU memory share is held by the driver or kernel: `held`
    /// only when its limits were set and read back on every GPU it holds,
    /// else `promised: ` and why.
    #[zbus(property)]
    async fn enforcement(&self) -> String {
        self.view.read().enforcement.clone()
    }
    /// The request; `run.*.env` values only for the owner and root.
    #[zbus(property(emits_changed_signal = "const"))]
    async fn request(
        &self,
        #[zbus(header)] hdr: Option<Header<'_>>,
        #[zbus(connection)] conn: &Connection,
    ) -> String {
        let reader = match &hdr {
            Some(h) => tokio::time::timeout(LEARN_READER_WITHIN, async {
                crate::failpoint::hit_async("bus.request_reader").await;
                // The uid alone (no group lookup: NSS may be slow).
                self.lp.uid(h, conn).await
            })
            .await
            .ok()
            .flatten(),
            None => None,
        };
        let v = self.view.read();
        if crate::access::sees_env(reader, v.owner) {
            v.request.to_string()
        } else {
            v.request_redacted.to_string()
        }
    }
}

/// How long the Request getter waits to learn who reads it (a round trip
/// to the bus daemon, well under a millisecond unless a flood delays it).
/// zbus holds its object tree's read lock across a Properties.Get: while
/// the getter waits, every new object waits, and each submit's reply with
/// it; were zbus's dispatch queue to fill meanwhile, the bus daemon's
/// answer could never be read (a deadlock). Past this the env stays hidden,
/// as for a caller who cannot be told (fail closed).
const LEARN_READER_WITHIN: std::time::Duration = std::time::Duration::from_millis(500);

/// Every property of the Worker interface, borrowed from the view: the
/// request with its `run.*.env` values only when `sees_env`.
fn properties<'a>(
    v: &'a WorkerView,
    reasons: &'a [String],
    sees_env: bool,
) -> HashMap<&'static str, zbus::Variant<'a>> {
    use zbus::Variant;
    let gpus: Vec<(u32, &str)> = v.gpus.iter().map(|(i, u)| (*i, u.as_str())).collect();
    let request = if sees_env {
        &v.request
    } else {
        &v.request_redacted
    };
    HashMap::from([
        ("Name", Variant::from(v.name.as_str())),
        ("State", v.state.as_str().into()),
        ("Owner", v.owner.into()),
        ("Gpus", gpus.into()),
        ("GpuSharedGb", v.gpu_shared_gb.into()),
        ("Holders", v.holders.clone().into()),
        ("PendingReasons", strs(reasons).into()),
        ("Warnings", strs(&v.warnings).into()),
        ("SubmittedMs", v.submitted_ms.into()),
        ("PlacedMs", v.placed_ms.into()),
        ("GpuUsedGb", v.gpu_used_gb.into()),
        ("Enforcement", v.enforcement.as_str().into()),
        ("Request", (&**request).into()),
    ])
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
        let v = self.view.read();
        let reasons = self.reasons_read(&v);
        let properties = properties(&v, &reasons, false);
        let interfaces =
            HashMap::from([(<Self as zbus::object_server::Interface>::name(), properties)]);
        zbus::Message::signal(
            super::BASE_PATH,
            "org.freedesktop.DBus.ObjectManager",
            "InterfacesAdded",
        )
        .build(&(zbus::ObjectPath::try_from(path)?, interfaces))
    }

    /// Its properties as GetAll gives them to a caller of uid `viewer`
    /// (None: unknown), without a round trip to the bus: a listing of every
    /// worker learns its caller once, where GetAll's request getter asked
    /// the bus daemon for each worker (20,000 round trips for a caller that
    /// had left, under the listings' one turn).
    ///
    /// Its reasons are not marked read: a listing reads every waiting
    /// worker's, and marked, each change after it sent a PropertiesChanged
    /// for every one of them (20,000 in tests/hostile.rs), ahead of the
    /// replies that followed. A client told of reason changes reads them
    /// with Get, GetAll or ListPending.
    pub fn properties_for(
        &self,
        viewer: Option<u32>,
    ) -> zbus::Result<HashMap<String, zbus::OwnedVariant>> {
        let v = self.view.read();
        let reasons = if v.state == State::Pending {
            self.waits.explain(&v.name, &self.resources)
        } else {
            Vec::new()
        };
        let sees_env = crate::access::sees_env(viewer, v.owner);
        properties(&v, &reasons, sees_env)
            .into_iter()
            .map(|(name, value)| Ok((name.to_string(), value.try_into_owned()?)))
            .collect()
    }

    /// Its reasons to wait, marked read as the getter marks them: only a
    /// waiting worker has reasons (and only its reads are told to read again).
    fn reasons_read(&self, v: &WorkerView) -> Vec<String> {
        if v.state == State::Pending {
            self.waits.mark_read(&v.name);
            self.waits.explain(&v.name, &self.resources)
        } else {
            Vec::new()
        }
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
        d.set(
            old.enforcement != n.enforcement,
            "Enforcement",
            n.enforcement,
        );
        d
    }
}
