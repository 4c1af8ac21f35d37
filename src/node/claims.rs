//! Kubernetes claims in the node (#64): what each GPU offers the cluster,
//! and a claim booked as a worker only where it fits now. The rules are
//! claim.rs's and placement's; this room reads the book and the machine.

use super::{Changes, Node};
use crate::claim::Claim;
use crate::error::{Error, Result};

/// What one GPU offers the cluster, for the kubelet plugin's slice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterOffer {
    pub index: u32,
    pub uuid: String,
    pub model: String,
    /// Bytes, in whole steps (claim::STEP_BYTES); 0: nothing now.
    pub memory_bytes: u64,
    pub healthy: bool,
    /// Whether it may be taken whole by a claim: it offers something and
    /// no local worker has a share of it.
    pub whole: bool,
    /// A MIG instance: offered whole only (its memory, when free), never
    /// shared (memory limits do not apply to MIG handles).
    pub mig: bool,
    /// Why a GPU offers the cluster nothing it otherwise would, as the
    /// plugin's device taint says it: "unhealthy", "held-by-host" (a local
    /// worker holds it whole), "draining" (kept for a whole request that
    /// waited); "" when nothing is withheld. Claims the scheduler placed
    /// are no reason: it counts those itself.
    pub withheld: &'static str,
    /// The GPU driver's version ("" where none is read).
    pub driver: String,
}

impl ClusterOffer {
    fn of(
        g: &crate::machine::Gpu,
        driver: &str,
        memory_bytes: u64,
        whole: bool,
        mig: bool,
    ) -> ClusterOffer {
        ClusterOffer {
            index: g.index,
            uuid: g.uuid.clone(),
            model: g.model.clone(),
            memory_bytes,
            healthy: g.healthy,
            whole,
            mig,
            withheld: "",
            driver: driver.to_string(),
        }
    }
}

impl Node {
    /// Each GPU that takes shares, with what it offers the cluster now:
    /// what it offers shared work less what the host's own workers (not
    /// claims: the scheduler counts those) take on it.
    pub fn offered_to_cluster(&self) -> Vec<ClusterOffer> {
        let shared = self.machine.gpus.iter().filter(|g| g.takes_shares());
        let instances = self
            .machine
            .gpus
            .iter()
            .filter(|g| g.mig_of.is_some() && !g.withheld());
        shared
            .map(|g| {
                let usage = self.book.usage(&g.uuid);
                let local = usage
                    .map(|u| {
                        u.sharers()
                            .iter()
                            .filter(|(w, _)| !self.is_claim(w))
                            .map(|(_, share)| *share)
                            .sum()
                    })
                    .unwrap_or_default();
                let held_whole = usage.is_some_and(|u| u.whole.is_some());
                let held_by_host = usage
                    .and_then(|u| u.whole.as_deref())
                    .is_some_and(|w| !self.is_claim(w));
                let kept = self.book.kept_for(&g.uuid).is_some();
                let local_sharers =
                    usage.is_some_and(|u| u.sharers().iter().any(|(w, _)| !self.is_claim(w)));
                let memory_bytes = crate::claim::offered_to_cluster(
                    g.takes_shares(),
                    g.healthy,
                    held_whole,
                    kept,
                    g.offered(),
                    local,
                );
                let mut offer = ClusterOffer::of(
                    g,
                    &self.machine.driver,
                    memory_bytes,
                    memory_bytes > 0 && !local_sharers,
                    false,
                );
                offer.withheld = match () {
                    _ if !g.healthy => "unhealthy",
                    _ if held_by_host => "held-by-host",
                    _ if kept => "draining",
                    _ => "",
                };
                offer
            })
            .chain(instances.map(|g| {
                // Whole or nothing: its memory while no one holds it.
                let held = self
                    .book
                    .usage(&g.uuid)
                    .is_some_and(|u| u.whole.is_some() || !u.sharers().is_empty());
                let free = g.healthy && !held;
                let memory_bytes = if free {
                    g.total.hundredths() / crate::claim::STEP_HUNDREDTHS * crate::claim::STEP_BYTES
                } else {
                    0
                };
                ClusterOffer::of(
                    g,
                    &self.machine.driver,
                    memory_bytes,
                    memory_bytes > 0,
                    true,
                )
            }))
            .collect()
    }

    /// Each claim booked here: (worker, UID, namespace, name).
    pub fn claims(&self) -> Vec<(String, String, String, String)> {
        self.workers
            .values()
            .filter_map(|w| {
                let c = w.spec.claim.as_ref()?;
                let (uid, ns, name) = (c.uid.clone(), c.namespace.clone(), c.name.clone());
                Some((w.name().to_string(), uid, ns, name))
            })
            .collect()
    }

    fn is_claim(&self, worker: &str) -> bool {
        self.workers
            .get(worker)
            .is_some_and(|w| w.spec.claim.is_some())
    }

    /// Books a claim's device as a worker owned by `caller_uid` (the
    /// plugin), placed now on its GPU or refused with placement's reason:
    /// a claim never waits in the ledger (the kubelet asks again). Asked
    /// again for the same claim and device, the same answer (the kubelet
    /// retries); for the same claim and another device or memory,
    /// Conflict. Returns the worker's name and whether it is new.
    pub fn prepare_claim(&mut self, claim: &Claim, caller_uid: u32) -> Result<(String, Changes)> {
        let name = claim.worker_name();
        if let Some(w) = self.workers.get(&name) {
            let on = w.grants().first().map(|g| g.gpu_uuid.as_str());
            let same = w.spec.claim.as_ref() == Some(&claim.origin)
                && on == Some(claim.gpu_uuid.as_str())
                && w.spec.shared_gb() == claim.share();
            if same {
                return Ok((name, Changes::default()));
            }
            return Err(Error::Conflict(format!(
                "claim {} is prepared already, on {} with {}: unprepare it first",
                claim.origin.uid,
                on.unwrap_or("no GPU yet"),
                w.spec
                    .shared_gb()
                    .map_or("the GPU whole".to_string(), |s| format!("{s} GB")),
            )));
        }
        // New work: not below the ledger's floor of free space (the room
        // kept there is for stops, exits and readings: store/room.rs).
        self.store.room_for_new_work()?;
        let spec_text = claim.spec();
        if let Err(reasons) = self.why_not(&spec_text)? {
            return Err(Error::Conflict(format!(
                "claim {}/{} does not fit now: {}",
                claim.origin.namespace,
                claim.origin.name,
                reasons.join("; ")
            )));
        }
        let spec = crate::request::WorkerSpec::parse(&spec_text)?;
        self.submit_parsed(spec, &spec_text, caller_uid, Vec::new())
    }
}
