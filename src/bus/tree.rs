//! The object tree's listings, answered from the daemon's own index of its
//! objects instead of zbus's tree: `GetManagedObjects`, `Introspect` on the
//! paths above the objects, and the Manager's two lists of workers.
//!
//! zbus answers the first two by walking its tree under the lock that adding
//! or removing an object takes (and its Introspect nests every descendant's
//! interfaces, which busctl cannot parse). With thousands of workers, anyone
//! allowed to read could then hold the service loop up for seconds, watchdog
//! included. Here a listing copies the index (cheap handles), lets go of it,
//! and builds its answer while yielding; one listing is built at a time
//! (later ones wait their turn, never the loop), the turns given round the
//! users waiting (bus/turns.rs).
//!
//! The paths above the objects (`/` … `/org/astraeus/Node1/worker`) are kept
//! for the daemon's life: each directory carries an empty
//! `org.astraeus.Node1.Directory` interface, because zbus prunes a node that
//! has only the standard interfaces and would bring its own Introspectable
//! back when the node returns.

use super::gpu::GpuObject;
use super::template::TemplateObject;
use super::turns::{FairTurns, Turn, Who};
use super::worker::WorkerObject;
use super::{escape_label, gpu_path, template_path, worker_path, BASE_PATH};
use super::{BusError, Loop};
use crate::views::WorkerSnap;
use crate::wire::WorkerRow;
use crate::worker::State;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use zbus::fdo::ManagedObjects;
use zbus::message::Header;
use zbus::names::InterfaceName;
use zbus::object_server::{Interface, SignalEmitter};
use zbus::{interface, Connection, ObjectServer, OwnedObjectPath};

/// Listings built at once; more wait for a turn.
const LISTINGS_AT_ONCE: usize = 1;
/// Objects handled between two yields to the runtime.
const YIELD_EVERY: usize = 64;

/// Every object the daemon serves below the base path, by kind: the same
/// handles (and so the same views) as the objects in zbus's tree.
#[derive(Clone)]
pub struct Objects {
    index: Arc<RwLock<Index>>,
    turns: Arc<FairTurns>,
}

#[derive(Default)]
struct Index {
    /// By worker name.
    workers: BTreeMap<String, WorkerObject>,
    gpus: BTreeMap<u32, GpuObject>,
    /// By template name.
    templates: BTreeMap<String, TemplateObject>,
}

/// One object of the index, copied out of it.
enum Listed {
    Worker(WorkerObject),
    Gpu(GpuObject),
    Template(TemplateObject),
}

impl Default for Objects {
    fn default() -> Objects {
        Objects {
            index: Arc::default(),
            turns: Arc::new(FairTurns::new(LISTINGS_AT_ONCE)),
        }
    }
}

impl Objects {
    pub fn add_worker(&self, name: &str, o: WorkerObject) {
        self.write().workers.insert(name.to_string(), o);
    }
    pub fn remove_worker(&self, name: &str) {
        self.write().workers.remove(name);
    }
    pub fn add_gpu(&self, index: u32, o: GpuObject) {
        self.write().gpus.insert(index, o);
    }
    pub fn remove_gpu(&self, index: u32) {
        self.write().gpus.remove(&index);
    }
    pub fn add_template(&self, name: &str, o: TemplateObject) {
        self.write().templates.insert(name.to_string(), o);
    }
    pub fn remove_template(&self, name: &str) {
        self.write().templates.remove(name);
    }
    /// A worker's object (the loop replaces its view through it).
    pub fn worker(&self, name: &str) -> Option<WorkerObject> {
        self.read().workers.get(name).cloned()
    }
    pub fn gpu(&self, index: u32) -> Option<GpuObject> {
        self.read().gpus.get(&index).cloned()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Index> {
        self.index.read().unwrap_or_else(|e| e.into_inner())
    }
    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Index> {
        self.index.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Turns at building a listing (one at a time).
    pub fn turns(&self) -> &FairTurns {
        &self.turns
    }

    fn workers(&self) -> Vec<WorkerObject> {
        self.read().workers.values().cloned().collect()
    }

    /// ListWorkers: every live worker's row, by name.
    pub async fn worker_rows(&self, _turn: Turn) -> Vec<WorkerRow> {
        // A test holds a listing here, as 100,000 workers would.
        crate::failpoint::hit_in_task("bus.listing");
        let mut rows = Vec::new();
        for (i, w) in self.workers().iter().enumerate() {
            pause(i).await;
            rows.push(w.view.read().row.clone());
        }
        give_back_memory();
        rows
    }

    /// The machine page's workers, from the same views, off the loop like
    /// the lists. Owners' names are looked up once each, in the blocking
    /// pool and after this listing's turn: a slow name service (LDAP
    /// behind NSS) delays this page, not the other listings.
    pub async fn worker_snaps(
        &self,
        client: std::net::IpAddr,
        owner_name: impl Fn(u32) -> String + Send + 'static,
    ) -> Option<Vec<WorkerSnap>> {
        let mut out = Vec::new();
        {
            // Each of the page's client addresses is one more user in the
            // rotation: None when as many of its requests wait as a user's may.
            let _turn = match self.turns.try_take() {
                Some(turn) => turn,
                None => self.turns.take(Who::Page(client)).await.ok()?,
            };
            // A test holds the page here, as 100,000 workers would.
            crate::failpoint::hit_in_task("page.workers");
            for (i, w) in self.workers().iter().enumerate() {
                pause(i).await;
                let view = w.view.read().clone();
                let pending = view.state == State::Pending;
                out.push(WorkerSnap {
                    owner: String::new(),
                    shared_gb: (!pending && view.gpu_shared_gb > 0.0).then_some(view.gpu_shared_gb),
                    pending_reasons: if pending {
                        w.waits.explain(&view.name, &w.resources)
                    } else {
                        Vec::new()
                    },
                    view,
                });
            }
        }
        let uids: std::collections::BTreeSet<u32> = out.iter().map(|w| w.view.owner).collect();
        let names: HashMap<u32, String> = tokio::task::spawn_blocking(move || {
            uids.into_iter().map(|u| (u, owner_name(u))).collect()
        })
        .await
        .unwrap_or_default();
        for w in &mut out {
            w.owner = match &w.view.claim_namespace {
                // A claim is its namespace's (root, the plugin, books it).
                Some(ns) => crate::claim::owner_label(ns),
                None => names
                    .get(&w.view.owner)
                    .cloned()
                    .unwrap_or_else(|| w.view.owner.to_string()),
            };
        }
        give_back_memory();
        Some(out)
    }

    /// ListPending: every pending worker with its reasons, oldest first.
    pub async fn pending(&self, _turn: Turn) -> Vec<(String, Vec<String>)> {
        let mut waiting: Vec<(i64, WorkerObject)> = self
            .workers()
            .into_iter()
            .filter_map(|w| {
                let (state, id) = {
                    let v = w.view.read();
                    (v.state, v.id)
                };
                (state == State::Pending).then_some((id, w))
            })
            .collect();
        waiting.sort_by_key(|(id, _)| *id);
        let mut out = Vec::with_capacity(waiting.len());
        for (i, (_, w)) in waiting.iter().enumerate() {
            pause(i).await;
            out.push(w.name_and_reasons());
        }
        give_back_memory();
        out
    }

    /// Every placed worker's name and Enforcement, oldest first.
    pub async fn enforcement(&self, _turn: Turn) -> Vec<(String, String)> {
        let mut placed: Vec<(i64, String, String)> = Vec::new();
        for (i, w) in self.workers().iter().enumerate() {
            pause(i).await;
            let v = w.view.read();
            if v.state != State::Pending {
                placed.push((v.id, v.name.clone(), v.enforcement.clone()));
            }
        }
        placed.sort_by_key(|(id, _, _)| *id);
        give_back_memory();
        placed.into_iter().map(|(_, n, e)| (n, e)).collect()
    }

    fn listed(&self) -> Vec<(String, Listed)> {
        let index = self.read();
        let workers = index
            .workers
            .iter()
            .map(|(n, o)| (worker_path(n), Listed::Worker(o.clone())));
        let gpus = index
            .gpus
            .iter()
            .map(|(i, o)| (gpu_path(*i), Listed::Gpu(o.clone())));
        let templates = index
            .templates
            .iter()
            .map(|(n, o)| (template_path(n), Listed::Template(o.clone())));
        workers.chain(gpus).chain(templates).collect()
    }

    /// The labels below one directory, for its introspection.
    fn children(&self, dir: Dir) -> Vec<String> {
        let index = self.read();
        match dir {
            Dir::Workers => index.workers.keys().map(|n| escape_label(n)).collect(),
            Dir::Gpus => index.gpus.keys().map(u32::to_string).collect(),
            Dir::Templates => index.templates.keys().map(|n| escape_label(n)).collect(),
        }
    }
}

/// Yields to the runtime now and then, so that a long listing shares its
/// thread with the service loop.
async fn pause(i: usize) {
    if i % YIELD_EVERY == YIELD_EVERY - 1 {
        tokio::task::yield_now().await;
    }
}

/// The most one reply may carry: dbus-daemon's default `max_message_size`
/// (32 MiB, the system bus's unless an administrator raised it), less room
/// for the header. A bigger message is not refused but taken for a broken
/// sender: the bus daemon drops the daemon's connection, its name and every
/// call, and the daemon stops for systemd to restart it. So a reply that
/// big is refused instead, saying what to ask for.
pub const MAX_REPLY_BYTES: usize = 32 * 1024 * 1024 - 64 * 1024;

/// Refuses (`Conflict`) a reply `what` bigger than [`MAX_REPLY_BYTES`],
/// saying what to ask `instead`; its size is counted by serialising it into
/// nothing (off the loop, as the reply itself is built).
pub fn fits_the_bus<T>(value: &T, what: &str, instead: &str) -> Result<(), BusError>
where
    T: serde::Serialize + zbus::zvariant::DynamicType,
{
    let ctxt = zbus::wire::serialized::Context::new(zbus::wire::LE, 0);
    too_big(
        zbus::wire::serialized_size(ctxt, value)?.size(),
        what,
        instead,
    )
}

/// The size of a dictionary reply (`a{…}`) counted entry by entry as it is
/// built, each at its place in the message: a reply over the bus's limit is
/// refused as soon as it gets there, not built in full first (the listing
/// of 100,000 workers took 1.6 s to build before it was counted and
/// refused). Exact but for a few bytes: each entry starts 8-aligned, so
/// only which entry comes last (the map's order) moves the total.
pub struct DictSize(usize);

impl Default for DictSize {
    fn default() -> DictSize {
        // The array's length.
        DictSize(4)
    }
}

impl DictSize {
    /// Counts one more entry; refuses (as [`too_big`]) once over the limit.
    pub fn add<K, V>(
        &mut self,
        key: &K,
        value: &V,
        what: &str,
        instead: &str,
    ) -> Result<(), BusError>
    where
        K: serde::Serialize + zbus::zvariant::Type,
        V: serde::Serialize + zbus::zvariant::Type,
    {
        let ctxt = zbus::wire::serialized::Context::new(zbus::wire::LE, self.0);
        self.0 += zbus::wire::serialized_size(ctxt, &(key, value))?.size();
        if self.0 <= MAX_REPLY_BYTES {
            return Ok(());
        }
        give_back_memory();
        Err(BusError(crate::error::Error::Conflict(format!(
            "{what} would be over {:.1} MB, {TOO_BIG}: {instead}",
            self.0 as f64 / 1e6
        ))))
    }

    pub fn bytes(&self) -> usize {
        self.0
    }
}

/// [`fits_the_bus`] for a reply whose size is known.
pub fn too_big(size: usize, what: &str, instead: &str) -> Result<(), BusError> {
    if size <= MAX_REPLY_BYTES {
        return Ok(());
    }
    give_back_memory();
    Err(BusError(crate::error::Error::Conflict(format!(
        "{what} would be {:.1} MB, {TOO_BIG}: {instead}",
        size as f64 / 1e6
    ))))
}

/// What a reply refused for its size says (the bench looks for it).
pub const TOO_BIG: &str = "more than the bus carries in one message (32 MiB)";

/// A listing and its turn: the turn is given back when zbus drops the
/// value, once the reply built from it is sent, so replies are built (and
/// sent) one at a time too.
pub struct Listing {
    objects: ManagedObjects,
    _turn: Turn,
}

impl Drop for Listing {
    fn drop(&mut self) {
        // Freed before the turn is given back, then handed to the system.
        std::mem::take(&mut self.objects);
        give_back_memory();
    }
}

/// The allocator's two bounds, set before any thread starts. Buffers of
/// 1 MiB and more (a listing's reply) come straight from the system and go
/// back to it when freed: glibc would otherwise raise that bound to the
/// largest buffer freed so far and serve the next big reply from the heap,
/// which it then keeps. And up to 1 MiB free at the heap's top is kept:
/// fixing the first bound also fixes the second at glibc's 128 KiB, and a
/// commit frees ~160 KiB there (SQLite's): the heap was shrunk and grown
/// again, its pages faulted in afresh, on nearly every call (strace: 545
/// `brk` in 360 calls, 9 with this; no change in latency or throughput
/// this host could measure, nor in idle memory). A big listing still gives
/// its memory back (`give_back_memory` trims all).
pub fn tune_allocator() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets tunables, before any thread is started.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 20);
    }
}

/// Returns the allocator's free memory to the system. A big listing frees
/// tens of MB in small pieces that glibc would otherwise keep for the
/// process: after a flood of them, the daemon's memory comes back to where
/// it was.
pub fn give_back_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

impl zbus::Type for Listing {
    const SIGNATURE: &'static zbus::Signature = <ManagedObjects as zbus::Type>::SIGNATURE;
}

impl serde::Serialize for Listing {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.objects.serialize(s)
    }
}

/// `org.freedesktop.DBus.ObjectManager` at the base path, from the index.
/// Its InterfacesAdded/Removed are sent by the daemon
/// ([`interfaces_added`], [`interfaces_removed`]), not by zbus.
pub struct ObjectManager {
    pub objects: Objects,
    /// To learn who asks (whose turn a listing is).
    pub lp: Loop,
}

#[interface(
    name = "org.freedesktop.DBus.ObjectManager",
    introspection_docs = false
)]
impl ObjectManager {
    /// Every object with its properties, as Properties.GetAll gives them to
    /// this caller (a worker's request shows its env to its owner and root only).
    async fn get_managed_objects(
        &self,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(connection)] conn: &Connection,
        #[zbus(header)] hdr: Header<'_>,
    ) -> Result<Listing, BusError> {
        let (turn, learnt) = self.lp.turn_at(self.objects.turns(), &hdr, conn).await?;
        crate::failpoint::hit_in_task("bus.listing");
        // Who asks, learnt once for every worker's request (whose env only
        // its owner and root see): a caller that left sees none.
        let viewer = match learnt {
            Some(uid) => Some(uid),
            None => self.lp.uid(&hdr, conn).await,
        };
        let bus = |e: zbus::fdo::Error| BusError::from(zbus::Error::from(e));
        let mut objects = ManagedObjects::new();
        let mut size = DictSize::default();
        let (what, instead) = (
            "the listing of every object",
            "list workers with ListWorkers and ListPending, and read one object with \
             Properties.GetAll",
        );
        for (i, (path, o)) in self.objects.listed().into_iter().enumerate() {
            pause(i).await;
            let path = OwnedObjectPath::try_from(path)?;
            let emitter = SignalEmitter::new(conn, path.clone())?;
            let (name, props) = match &o {
                Listed::Worker(w) => (WorkerObject::name(), w.properties_for(viewer)?),
                Listed::Gpu(g) => (
                    GpuObject::name(),
                    g.get_all(server, conn, Some(&hdr), &emitter)
                        .await
                        .map_err(bus)?,
                ),
                Listed::Template(t) => (
                    TemplateObject::name(),
                    t.get_all(server, conn, Some(&hdr), &emitter)
                        .await
                        .map_err(bus)?,
                ),
            };
            let interfaces = HashMap::from([(name.into(), props)]);
            if let Err(e) = size.add(&path, &interfaces, what, instead) {
                drop(objects);
                give_back_memory();
                return Err(e);
            }
            objects.insert(path, interfaces);
        }
        Ok(Listing {
            objects,
            _turn: turn,
        })
    }

    #[zbus(signal)]
    async fn interfaces_added(
        emitter: &SignalEmitter<'_>,
        object_path: zbus::ObjectPath<'_>,
        interfaces_and_properties: HashMap<InterfaceName<'_>, HashMap<String, zbus::OwnedVariant>>,
    ) -> zbus::Result<()>;

    #[zbus(signal)]
    async fn interfaces_removed(
        emitter: &SignalEmitter<'_>,
        object_path: zbus::ObjectPath<'_>,
        interfaces: Vec<InterfaceName<'_>>,
    ) -> zbus::Result<()>;
}

/// InterfacesAdded for the object at `path`, with its properties as a
/// caller with no credentials reads them. zbus registers objects silently
/// (its `object-manager` feature is off): the daemon announces them itself,
/// after the reply that needs the object, not while zbus's tree is locked
/// on the call's path (#25).
pub async fn interfaces_added<I: Interface>(
    conn: &Connection,
    path: &str,
    iface: &I,
) -> zbus::Result<()> {
    let emitter = SignalEmitter::new(conn, BASE_PATH)?;
    // Serialised as they come (a copy of every value was 1 % of the
    // daemon's time at 50 callers).
    let props = iface
        .get_all(conn.object_server(), conn, None, &emitter)
        .await?;
    ObjectManager::interfaces_added(
        &emitter,
        zbus::ObjectPath::try_from(path)?,
        HashMap::from([(I::name(), props)]),
    )
    .await
}

/// InterfacesRemoved for the object of interface `I` that was at `path`.
pub async fn interfaces_removed<I: Interface>(conn: &Connection, path: &str) -> zbus::Result<()> {
    let emitter = SignalEmitter::new(conn, BASE_PATH)?;
    ObjectManager::interfaces_removed(&emitter, zbus::ObjectPath::try_from(path)?, vec![I::name()])
        .await
}

/// Registers `iface` at `path` and announces it at once: for objects no
/// reply waits on (GPUs, templates).
pub async fn add_announced<I: Interface + Clone>(
    conn: &Connection,
    path: &str,
    iface: I,
) -> zbus::Result<()> {
    conn.object_server().at(path, iface.clone()).await?;
    interfaces_added(conn, path, &iface).await
}

/// Unregisters the object of interface `I` at `path` and announces it.
pub async fn remove_announced<I: Interface>(conn: &Connection, path: &str) -> zbus::Result<()> {
    conn.object_server().remove::<I, _>(path).await?;
    interfaces_removed::<I>(conn, path).await
}

/// The three directories of objects below the base path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    Workers,
    Gpus,
    Templates,
}

impl Dir {
    pub const ALL: [Dir; 3] = [Dir::Workers, Dir::Gpus, Dir::Templates];

    pub fn label(self) -> &'static str {
        match self {
            Dir::Workers => "worker",
            Dir::Gpus => "gpu",
            Dir::Templates => "template",
        }
    }

    pub fn path(self) -> String {
        format!("{BASE_PATH}/{}", self.label())
    }
}

/// `org.astraeus.Node1.Directory`: nothing to call; it keeps a directory's
/// node in zbus's tree while it is empty (see the module's note).
pub struct Directory;

#[interface(name = "org.astraeus.Node1.Directory", introspection_docs = false)]
impl Directory {}

/// What one path above the objects holds, for its introspection.
pub enum Above {
    /// `/`, `/org`, `/org/astraeus`: only the way down.
    Path { child: &'static str },
    /// The base path: the Manager, the ObjectManager and the directories.
    Base { interfaces_xml: String },
    /// A directory: its objects.
    Dir(Dir),
}

/// `org.freedesktop.DBus.Introspectable` for the paths above the objects:
/// their own interfaces and their children's names only, as the D-Bus
/// specification describes (zbus's nests every descendant's interfaces).
pub struct FlatIntrospection {
    pub above: Above,
    pub objects: Objects,
    /// To learn who asks (whose turn a directory's listing is).
    pub lp: Loop,
}

/// org.freedesktop.DBus.Peer as zbus serves it on every path.
const PEER_XML: &str = r#"  <interface name="org.freedesktop.DBus.Peer">
    <method name="Ping">
    </method>
    <method name="GetMachineId">
      <arg type="s" direction="out"/>
    </method>
  </interface>
"#;

impl FlatIntrospection {
    fn xml(&self, children: &[String]) -> String {
        let mut xml = String::from(
            "<!DOCTYPE node PUBLIC \"-//freedesktop//DTD D-BUS Object Introspection 1.0//EN\"\n \
             \"http://www.freedesktop.org/standards/dbus/1.0/introspect.dtd\">\n<node>\n",
        );
        xml.push_str(PEER_XML);
        self.introspect_to_writer(&mut xml, 2);
        zbus::fdo::Properties.introspect_to_writer(&mut xml, 2);
        match &self.above {
            Above::Base { interfaces_xml } => xml.push_str(interfaces_xml),
            Above::Dir(_) => Directory.introspect_to_writer(&mut xml, 2),
            Above::Path { .. } => {}
        }
        for c in children {
            xml.push_str("  <node name=\"");
            xml.push_str(c);
            xml.push_str("\"/>\n");
        }
        xml.push_str("</node>\n");
        xml
    }
}

#[interface(
    name = "org.freedesktop.DBus.Introspectable",
    introspection_docs = false
)]
impl FlatIntrospection {
    async fn introspect(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<String, BusError> {
        Ok(match &self.above {
            Above::Path { child } => self.xml(&[child.to_string()]),
            Above::Base { .. } => {
                let dirs: Vec<String> = Dir::ALL.iter().map(|d| d.label().into()).collect();
                self.xml(&dirs)
            }
            Above::Dir(d) => {
                let _turn = self.lp.turn_at(self.objects.turns(), &hdr, conn).await?;
                let xml = self.xml(&self.objects.children(*d));
                too_big(
                    xml.len(),
                    "this directory's introspection",
                    "list its objects with ListWorkers or ListTemplates",
                )?;
                give_back_memory();
                xml
            }
        })
    }
}

/// The XML of the interfaces served at the base path, for its introspection.
pub fn base_interfaces_xml(ifaces: &[&dyn Interface]) -> String {
    let mut xml = String::new();
    for i in ifaces {
        i.introspect_to_writer(&mut xml, 2);
    }
    xml
}

/// Replaces zbus's Introspectable at `path` with a flat one (answered on
/// the lists runtime: a directory lists every object's name).
pub async fn flatten(
    server: &ObjectServer,
    path: &str,
    f: FlatIntrospection,
    lists: &super::offload::Lists,
) -> zbus::Result<()> {
    server
        .remove_named(
            path,
            InterfaceName::from_static_str_unchecked("org.freedesktop.DBus.Introspectable"),
        )
        .await
        .ok();
    server
        .at(
            path,
            super::offload::Offloaded::new(f, &["Introspect"], lists.clone()),
        )
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use zbus::{OwnedVariant, Variant};

    /// Counted entry by entry as a listing is built, a dictionary's size is
    /// what zvariant counts for the whole (the oracle), but for the padding
    /// after its last entry; and the count refuses once over the limit.
    #[test]
    fn a_dictionary_counted_entry_by_entry_is_its_size() {
        let mut objects = ManagedObjects::new();
        let mut size = DictSize::default();
        for i in 0..50usize {
            let path = OwnedObjectPath::try_from(format!("/o/w{i}_{}", "a".repeat(i % 7))).unwrap();
            let props: HashMap<String, OwnedVariant> = HashMap::from([
                (
                    "Name".to_string(),
                    OwnedVariant::try_from(Variant::from("x".repeat(i * 3))).unwrap(),
                ),
                ("Id".to_string(), OwnedVariant::from(i as u32)),
            ]);
            let name = InterfaceName::from_static_str_unchecked("org.x.Worker");
            let interfaces = HashMap::from([(name.into(), props)]);
            size.add(&path, &interfaces, "it", "less").unwrap();
            objects.insert(path, interfaces);
        }
        let ctxt = zbus::wire::serialized::Context::new(zbus::wire::LE, 0);
        let whole = zbus::wire::serialized_size(ctxt, &objects).unwrap().size();
        assert!(
            size.bytes().abs_diff(whole) < 8,
            "{} against {whole}",
            size.bytes()
        );

        let mut nearly = DictSize(MAX_REPLY_BYTES - 16);
        let refused = nearly.add(&"key", &"a value longer than sixteen bytes", "it", "less");
        let message = refused.unwrap_err().0.message().to_string();
        assert!(message.contains(TOO_BIG), "{message}");
        assert!(message.starts_with("it would be over 33.5 MB"), "{message}");
    }
}
