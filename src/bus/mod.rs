//! Thin D-Bus adaptors. Methods only translate: they learn who the caller is,
//! send one command to the service loop and turn its reply into D-Bus types.
//! Properties are read from views the loop keeps current; no handler
//! touches core state or takes a lock on it.
//!
//! One interface a file: [`manager`] (at the base path), [`gpu`], [`worker`],
//! [`template`]; `crate::wire` holds the rows they send (and astraeusctl
//! reads).

pub mod gpu;
pub mod manager;
pub mod offload;
pub mod outbox;
mod pairs;
pub mod template;
pub mod tree;
pub mod turns;
pub mod worker;

use crate::access::Caller;
use crate::auth;
use crate::command::Command;
use crate::error::Error;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
use zbus::message::{Header, Message};
use zbus::names::{BusName, ErrorName};
use zbus::object_server::SignalEmitter;
use zbus::{Connection, OwnedObjectPath};

pub const BUS_NAME: &str = "org.astraeus.Node1";
pub const BASE_PATH: &str = "/org/astraeus/Node1";
const ERROR_PREFIX: &str = "org.astraeus.Node1.Error";

/// The daemon's typed error on the bus: `org.astraeus.Node1.Error.<Kind>`
/// with the engine's message ([`Error::kind`] names the kind; nothing is
/// collapsed into `Failed`).
#[derive(Debug)]
pub struct BusError(pub Error);

impl From<Error> for BusError {
    /// Its message made printable (bidi and line separators from what a
    /// caller wrote never reach a terminal or a log): [`Error::printable`].
    fn from(e: Error) -> BusError {
        BusError(e.printable())
    }
}

/// The bus itself failed us (asking the bus daemon who called, say).
impl From<zbus::Error> for BusError {
    fn from(e: zbus::Error) -> BusError {
        BusError(Error::Backend(format!("D-Bus: {e}")))
    }
}

impl zbus::DBusError for BusError {
    fn create_reply(&self, call: &Header<'_>) -> zbus::Result<Message> {
        Message::error(call, self.name()).build(&(self.0.message(),))
    }

    fn name(&self) -> ErrorName<'_> {
        ErrorName::from_string_unchecked(format!("{ERROR_PREFIX}.{}", self.0.kind()))
    }

    fn description(&self) -> Option<&str> {
        Some(self.0.message())
    }
}

impl std::fmt::Display for BusError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{ERROR_PREFIX}.{}: {}", self.0.kind(), self.0.message())
    }
}

impl std::error::Error for BusError {}

/// Refuses text arguments over [`crate::request::MAX_SPEC_BYTES`] (256 KiB;
/// a worker spec is a few hundred bytes) in the adaptor, before they are
/// parsed or wait in the loop's queue: a caller sending 30 MiB strings costs
/// the daemon one read of each and nothing more.
pub(crate) fn bounded(args: &[(&str, &str)]) -> Result<(), BusError> {
    let max = crate::request::MAX_SPEC_BYTES;
    match args.iter().find(|(_, text)| text.len() > max) {
        Some((field, text)) => Err(BusError(Error::field(
            field,
            format!(
                "{} bytes is too large; at most {max} are accepted",
                text.len()
            ),
        ))),
        None => Ok(()),
    }
}

/// A turn at a costly read, or why none is waited for.
pub fn taken(turn: Result<turns::Turn, turns::TooMany>) -> Result<turns::Turn, BusError> {
    turn.map_err(|turns::TooMany| {
        busy(format!(
            "{} reads of this user are already waiting for their turn; wait for their replies",
            turns::WAITING_PER_USER
        ))
    })
}

fn busy(message: impl Into<String>) -> BusError {
    BusError(Error::Busy(message.into()))
}

/// An object path built from an escaped label.
pub fn object_path(p: String) -> Result<OwnedObjectPath, BusError> {
    OwnedObjectPath::try_from(p).map_err(|e| BusError(Error::Backend(format!("object path: {e}"))))
}

/// A view's changed properties, sent as one PropertiesChanged per object
/// (not one per property: each signal is a message every watcher wakes for).
pub struct Delta {
    interface: &'static str,
    changed: HashMap<&'static str, zbus::Variant<'static>>,
    invalidated: Vec<&'static str>,
}

impl Delta {
    pub(crate) fn new(interface: &'static str) -> Delta {
        Delta {
            interface,
            changed: HashMap::new(),
            invalidated: Vec::new(),
        }
    }

    /// Whether there is nothing to send.
    pub fn is_empty(&self) -> bool {
        self.changed.is_empty() && self.invalidated.is_empty()
    }

    pub(crate) fn set<T>(&mut self, differs: bool, name: &'static str, value: T)
    where
        T: Into<zbus::Variant<'static>> + zbus::zvariant::DynamicType,
    {
        if differs {
            self.changed.insert(name, zbus::Variant::new(value));
        }
    }

    pub(crate) fn invalidate(&mut self, differs: bool, name: &'static str) {
        if differs {
            self.invalidated.push(name);
        }
    }

    pub async fn emit(self, e: &SignalEmitter<'_>) -> zbus::Result<()> {
        if self.is_empty() {
            return Ok(());
        }
        zbus::fdo::Properties::properties_changed(
            e,
            zbus::names::InterfaceName::from_static_str_unchecked(self.interface),
            self.changed,
            std::borrow::Cow::Owned(self.invalidated),
        )
        .await
    }
}

/// Object path label for a worker or template name: every byte outside
/// `[A-Za-z0-9]` becomes `_xx` (hex), as systemd escapes unit names.
pub fn escape_label(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() {
            out.push(b as char);
        } else {
            out.push_str(&format!("_{b:02x}"));
        }
    }
    out
}

/// The name back from its label; None when the label is not one
/// `escape_label` makes.
pub fn unescape_label(label: &str) -> Option<String> {
    let mut out = Vec::with_capacity(label.len());
    let mut bytes = label.bytes();
    while let Some(b) = bytes.next() {
        if b == b'_' {
            let hex = [bytes.next()?, bytes.next()?];
            out.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
        } else if b.is_ascii_alphanumeric() {
            out.push(b);
        } else {
            return None;
        }
    }
    String::from_utf8(out).ok()
}

pub fn worker_path(name: &str) -> String {
    format!("{BASE_PATH}/worker/{}", escape_label(name))
}

pub fn template_path(name: &str) -> String {
    format!("{BASE_PATH}/template/{}", escape_label(name))
}

pub fn gpu_path(index: u32) -> String {
    format!("{BASE_PATH}/gpu/{index}")
}

/// The handlers' side of the service loop: a bounded queue.
#[derive(Clone)]
pub struct Loop {
    pub tx: mpsc::Sender<Command>,
    pub group: String,
    /// Caller facts by unique bus name. The bus never reuses a unique name, so
    /// uid and pid never go stale; group membership is re-read after a while.
    pub facts: Arc<Mutex<HashMap<String, (Caller, Instant)>>>,
    /// Calls waiting for the loop, by client and by user.
    pub in_flight: Arc<Mutex<InFlight>>,
    /// Turns at reading the ledger (reports, ended workers), round the users.
    pub ledger_reads: Arc<turns::FairTurns>,
}

/// At most this many calls of one client wait for the loop at once: a client
/// flooding the daemon gets `Busy`, and every other client still gets in.
pub const PER_CLIENT_IN_FLIGHT: usize = 16;

/// At most this many calls of one user, over all its connections, wait for
/// the loop at once: a quarter of its queue ([`crate::service::QUEUE_DEPTH`]),
/// so that a user opening many connections cannot fill it for the others
/// (reads are counted once the queue is half full: [`Loop::ask_from`]).
/// Fewer when others' calls fill the queue: [`user_share`].
pub const PER_USER_IN_FLIGHT: usize = 64;

/// How many calls a user may have waiting for the loop, with `others`
/// waiting besides its own in a queue of `depth` (other users' calls, the
/// daemon's own work, calls of users not learnt yet): half the places
/// they leave (rounded up), and at most [`PER_USER_IN_FLIGHT`]. However
/// many users flood, each leaves half of what it found for those after it:
/// with a fixed quarter each, two flooders filled the queue (the calls
/// made before users are learnt count for no one: [`Loop::ask_from`]).
pub fn user_share(depth: usize, others: usize) -> usize {
    PER_USER_IN_FLIGHT.min(depth.saturating_sub(others).div_ceil(2))
}

/// Calls waiting for the loop: by client (unique bus name) and by uid.
#[derive(Default)]
pub struct InFlight {
    by_client: HashMap<String, usize>,
    by_user: HashMap<u32, usize>,
}

/// One less waiting under `key`; the entry goes at zero.
fn release<K: std::hash::Hash + Eq>(map: &mut HashMap<K, usize>, key: &K) {
    if let Some(n) = map.get_mut(key) {
        *n -= 1;
        if *n == 0 {
            map.remove(key);
        }
    }
}

/// A call's place in the queue, given back when it is answered.
struct Slot {
    map: Arc<Mutex<InFlight>>,
    client: String,
    /// Counted for its user too (when known).
    uid: Option<u32>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut m = self.map.lock().unwrap_or_else(|e| e.into_inner());
        release(&mut m.by_client, &self.client);
        if let Some(uid) = self.uid {
            release(&mut m.by_user, &uid);
        }
    }
}

/// How long a caller's group membership is trusted before NSS is asked again.
const MEMBERSHIP_TTL: Duration = Duration::from_secs(5);
/// Bound on remembered callers; the map is simply cleared when it is reached.
const MAX_REMEMBERED: usize = 4096;

impl Loop {
    /// Sends one request and awaits its reply. A full queue is `Busy`, never a wait
    /// without bound.
    pub async fn ask<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<T>) -> Command,
    ) -> Result<T, BusError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .try_send(make(reply))
            .map_err(|_| busy("the daemon is busy or stopping; try again"))?;
        rx.await
            .map_err(|_| busy("the daemon is stopping; try again"))
    }

    /// [`Loop::ask`] on behalf of the message's sender, within its client's
    /// share of the queue, and its user's when the user is known. Who calls
    /// is learnt for that (a round trip to the bus daemon) only once the
    /// queue is half full: a read needs no more, and under a flood of big
    /// messages to the daemon that round trip waits behind all of them
    /// (tests/hostile.rs). Until then at most half the queue is taken by
    /// calls of unknown users, so one flooding user leaves a quarter.
    pub async fn ask_from<T>(
        &self,
        hdr: &Header<'_>,
        conn: &Connection,
        make: impl FnOnce(oneshot::Sender<T>) -> Command,
    ) -> Result<T, BusError> {
        let uid = match self.known_uid(hdr) {
            Some(uid) => Some(uid),
            None if self.tx.capacity() < self.tx.max_capacity() / 2 => {
                Some(self.caller(hdr, conn).await?.uid)
            }
            None => None,
        };
        self.ask_within(uid, hdr, make).await
    }

    /// [`Loop::ask`] for a caller already learnt from this message, within
    /// its client's and its user's shares of the queue.
    pub async fn ask_for<T>(
        &self,
        caller: &Caller,
        hdr: &Header<'_>,
        make: impl FnOnce(oneshot::Sender<T>) -> Command,
    ) -> Result<T, BusError> {
        self.ask_within(Some(caller.uid), hdr, make).await
    }

    /// The uid of a sender learnt before (a unique name's uid never changes).
    fn known_uid(&self, hdr: &Header<'_>) -> Option<u32> {
        let sender = hdr.sender()?.to_string();
        self.lock_facts().get(&sender).map(|(c, _)| c.uid)
    }

    /// [`Loop::ask`] within the client's share of the queue, and the
    /// user's (`uid`) when known.
    async fn ask_within<T>(
        &self,
        uid: Option<u32>,
        hdr: &Header<'_>,
        make: impl FnOnce(oneshot::Sender<T>) -> Command,
    ) -> Result<T, BusError> {
        let client = hdr.sender().map(|s| s.to_string()).unwrap_or_default();
        let _slot = {
            let mut m = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
            if m.by_client.get(&client).copied().unwrap_or(0) >= PER_CLIENT_IN_FLIGHT {
                return Err(busy(format!(
                    "{PER_CLIENT_IN_FLIGHT} calls of this client are already waiting; \
                     wait for their replies"
                )));
            }
            if let Some(uid) = uid {
                let mine = m.by_user.get(&uid).copied().unwrap_or(0);
                let waiting = self.tx.max_capacity() - self.tx.capacity();
                let share = user_share(self.tx.max_capacity(), waiting.saturating_sub(mine));
                if share == 0 {
                    return Err(busy("the daemon is busy or stopping; try again"));
                }
                if mine >= share {
                    return Err(busy(format!(
                        "{mine} calls of this user (uid {uid}) are already waiting, its \
                         share of the daemon's queue now ({share}); wait for their replies"
                    )));
                }
                *m.by_user.entry(uid).or_insert(0) += 1;
            }
            *m.by_client.entry(client.clone()).or_insert(0) += 1;
            Slot {
                map: self.in_flight.clone(),
                client,
                uid,
            }
        };
        self.ask(make).await
    }

    /// The caller's turn at a costly read. Who calls is learnt only when
    /// the turn must be waited for (a round trip to the bus daemon, which a
    /// flood of big messages delays): a free turn is taken at once. The uid
    /// comes back when it was learnt (so that it is not asked for again).
    pub async fn turn_at(
        &self,
        turns: &turns::FairTurns,
        hdr: &Header<'_>,
        conn: &Connection,
    ) -> Result<(turns::Turn, Option<u32>), BusError> {
        if let Some(turn) = turns.try_take() {
            return Ok((turn, None));
        }
        let uid = match self.known_uid(hdr) {
            Some(uid) => uid,
            None => self.uid_of(hdr, conn).await?,
        };
        let turn = taken(turns.take(turns::Who::Uid(uid)).await)?;
        // A turn waited for may come after its caller gave up (busctl
        // stops waiting after 25 s): zbus runs a handler to its end
        // whether or not anyone still waits, and a listing built for no one
        // held every caller queued behind it, so under a flood of costly
        // reads nearly every one was built for a caller that had left
        // (#68). One round trip to the bus daemon, only for a waited turn.
        if !self.still_there(hdr, conn).await {
            return Err(BusError(Error::Busy(
                "the caller left while its read waited for its turn".into(),
            )));
        }
        Ok((turn, Some(uid)))
    }

    /// Whether the caller's connection is still on the bus (a failing
    /// answer counts as there: the read goes on as before).
    async fn still_there(&self, hdr: &Header<'_>, conn: &Connection) -> bool {
        let Ok(sender) = sender_of(hdr) else {
            return true;
        };
        let Ok(dbus) = zbus::fdo::DBusProxy::new(conn).await else {
            return true;
        };
        let name = zbus::names::BusName::Unique(sender.clone());
        dbus.name_has_owner(name).await.unwrap_or(true)
    }

    /// The caller's uid, learnt before or asked of the bus daemon (no group
    /// lookup); None when it cannot tell (the caller left).
    pub async fn uid(&self, hdr: &Header<'_>, conn: &Connection) -> Option<u32> {
        match self.known_uid(hdr) {
            Some(uid) => Some(uid),
            None => self.uid_of(hdr, conn).await.ok(),
        }
    }

    /// The caller's uid from the bus daemon (no group lookup).
    async fn uid_of(&self, hdr: &Header<'_>, conn: &Connection) -> Result<u32, BusError> {
        let dbus = zbus::fdo::DBusProxy::new(conn).await?;
        dbus.get_connection_unix_user(sender_of(hdr)?.clone().into())
            .await
            .map_err(|e| unknown_caller(e.to_string()))
    }

    /// [`Loop::ask_from`] for a read of the ledger (a report, ended
    /// workers), in the caller's turn: one read at a time, the turns given
    /// round the users waiting, so that one user's many reads do not hold
    /// another's.
    pub async fn ask_in_turn<T>(
        &self,
        hdr: &Header<'_>,
        conn: &Connection,
        make: impl FnOnce(oneshot::Sender<T>) -> Command,
    ) -> Result<T, BusError> {
        let _turn = self.turn_at(&self.ledger_reads, hdr, conn).await?;
        self.ask_from(hdr, conn, make).await
    }

    /// Learns the caller, then asks the loop on its behalf.
    pub async fn ask_as<T>(
        &self,
        hdr: &Header<'_>,
        conn: &Connection,
        make: impl FnOnce(Caller, oneshot::Sender<T>) -> Command,
    ) -> Result<T, BusError> {
        let caller = self.caller(hdr, conn).await?;
        self.ask_for(&caller, hdr, |reply| make(caller, reply))
            .await
    }

    /// Who is calling: uid and pid from the bus daemon, group membership from NSS.
    pub async fn caller(&self, hdr: &Header<'_>, conn: &Connection) -> Result<Caller, BusError> {
        let sender = sender_of(hdr)?;
        let key = sender.to_string();
        if let Some((caller, at)) = self.lock_facts().get(&key) {
            if at.elapsed() < MEMBERSHIP_TTL {
                return Ok(*caller);
            }
        }
        let dbus = zbus::fdo::DBusProxy::new(conn).await?;
        let name: BusName<'_> = sender.into();
        // One round trip for both (GetConnectionUnixUser and …ProcessID
        // would be two, on the call's path).
        let credentials = dbus
            .get_connection_credentials(name)
            .await
            .map_err(|e| unknown_caller(e.to_string()))?;
        let uid = credentials
            .unix_user_id()
            .ok_or_else(|| unknown_caller("the bus gave no UnixUserID".into()))?;
        let pid = credentials.process_id();
        let group = self.group.clone();
        let member = tokio::task::spawn_blocking(move || auth::is_member(uid, &group))
            .await
            .unwrap_or(false);
        let caller = Caller { uid, pid, member };
        let mut facts = self.lock_facts();
        if facts.len() >= MAX_REMEMBERED {
            facts.clear();
        }
        facts.insert(key, (caller, Instant::now()));
        Ok(caller)
    }

    fn lock_facts(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Caller, Instant)>> {
        self.facts.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The unique bus name a call came from.
fn sender_of<'h>(hdr: &'h Header<'_>) -> Result<&'h zbus::names::UniqueName<'h>, BusError> {
    hdr.sender()
        .ok_or_else(|| BusError(Error::AccessDenied("the call carries no sender".into())))
}

/// The bus daemon could not say who called.
fn unknown_caller(why: String) -> BusError {
    BusError(Error::AccessDenied(format!(
        "cannot tell who the caller is: {why}"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flooding_users_each_leave_half_of_what_they_found() {
        // Half the queue taken by calls of users not learnt yet, then
        // flooders one after another, each taking all it may.
        let mut waiting = 128;
        let mut took = Vec::new();
        for _ in 0..5 {
            let share = user_share(256, waiting);
            took.push(share);
            waiting += share;
        }
        assert_eq!(took, [64, 32, 16, 8, 4]);
        assert_eq!(user_share(256, waiting), 2, "room for the next");
        assert_eq!(user_share(256, 0), PER_USER_IN_FLIGHT);
        assert_eq!(user_share(256, 255), 1);
        assert_eq!(user_share(256, 256), 0);
    }

    #[test]
    fn labels_escape_and_come_back() {
        for name in ["voice", "a-b.c", "ünï code", "x_y", "_", "9"] {
            let label = escape_label(name);
            assert!(label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_'));
            assert_eq!(unescape_label(&label).as_deref(), Some(name));
        }
        assert_eq!(escape_label("a-b"), "a_2db");
        for bad in ["_", "_2", "_zz", "a-b", "_ff"] {
            assert_eq!(unescape_label(bad), None, "{bad}");
        }
    }
}
