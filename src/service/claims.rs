//! Kubernetes claims (#64): PrepareClaim and UnprepareClaim from the
//! kubelet plugin, in the group commit as submits and stops are; a pod's
//! container bound to its claim by the CDI hook (BindClaim). The node
//! decides (node/claims.rs); this room only acknowledges once durable.

use super::Service;
use crate::access::{Act, Caller};
use crate::command::{Command, Reply};
use crate::error::{Error, Result};

impl Service {
    pub(super) fn prepare_claim(
        &mut self,
        claim: crate::claim::Claim,
        caller: Caller,
        reply: Reply<Result<(String, String)>>,
    ) {
        let r = self
            .access
            .may(&caller, Act::PrepareClaim)
            .and_then(|()| self.node.prepare_claim(&claim, caller.uid));
        match r {
            Ok((name, changes)) => {
                // What its containers are told (ASTRAEUS_GPU_MEMORY_GB):
                // its share, or the whole GPU's memory.
                let machine = self.node.machine();
                let memory_gb = match claim.share() {
                    Some(share) => share.to_string(),
                    None => machine
                        .gpus
                        .iter()
                        .find(|g| g.uuid == claim.gpu_uuid)
                        .map(|g| g.total.to_string())
                        .unwrap_or_default(),
                };
                tracing::info!(
                    worker = %name,
                    "claim {}/{} prepared on {} ({})",
                    claim.origin.namespace,
                    claim.origin.name,
                    claim.gpu_uuid,
                    claim.share().map_or("the GPU whole".into(), |s| format!("{s} GB"))
                );
                let shown = self.show(&changes);
                self.hold(reply, (name, memory_gb), shown, changes.placed);
            }
            Err(e) => {
                let _ = reply.send(Err(e));
            }
        }
    }

    pub(super) async fn unprepare_claim(
        &mut self,
        uid: String,
        caller: Caller,
        reply: Reply<Result<()>>,
    ) {
        let name = crate::claim::worker_name(&uid);
        let r = self.access.may(&caller, Act::PrepareClaim).and_then(|()| {
            match self.node.worker(&name) {
                Some(w) if w.spec.claim.is_some() => {
                    // Its limits go with it (its pod's group may outlive it).
                    self.clear_hold(&name);
                    self.node.stop(&name, caller.uid).map(Some)
                }
                // Gone already (the kubelet retries): nothing to do.
                _ => Ok(None),
            }
        });
        match r {
            Ok(Some(changes)) => {
                let shown = self.show(&changes);
                self.hold(reply, (), shown, changes.placed);
            }
            Ok(None) => self.reply_in_order(reply, Ok(())),
            Err(e) => {
                let _ = reply.send(Err(e));
            }
        }
    }

    /// A pod's container of a prepared claim, named by its process (the
    /// CDI hook runs as the container is created, before its command):
    /// its control group, read off the loop, becomes the claim's.
    pub(super) fn bind_claim(
        &mut self,
        uid: String,
        pid: u32,
        caller: Caller,
        reply: Reply<Result<String>>,
    ) {
        let name = crate::claim::worker_name(&uid);
        let r = self
            .access
            .may(&caller, Act::PrepareClaim)
            .and_then(|()| match self.node.worker(&name) {
                Some(w) if w.spec.claim.is_some() => Ok(w.id),
                _ => Err(Error::NotFound(format!(
                    "claim_uid: no prepared claim {uid} (the kubelet prepares a claim before its containers are created)"
                ))),
            });
        let caller_pid = caller.pid;
        let (id, bound) = match r {
            Ok(id) => (id, self.node.worker(&name).and_then(|w| w.cgroup.clone())),
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        let tx = self.lp.tx.clone();
        tokio::spawn(async move {
            // /proc of a process the caller names, and whether the group
            // bound before still has a process (a container restarted in
            // its pod left it empty): read off the loop.
            let (pid, cgroup, bound_alive) = tokio::task::spawn_blocking(move || {
                let root = std::path::Path::new("/sys/fs/cgroup");
                let alive =
                    bound.is_some_and(|b| !crate::runtime::cgroup_pids(root, &b).is_empty());
                let pid = crate::runtime::hooked_process(pid, caller_pid);
                (pid, crate::runtime::cgroup_of_pid(pid), alive)
            })
            .await
            .unwrap_or((pid, None, false));
            let cmd = Command::ClaimCgroup {
                name,
                id,
                pid,
                cgroup,
                bound_alive,
                reply,
            };
            let _ = tx.send(cmd).await;
        });
    }

    /// The claim's container's control group, found: recorded as the
    /// claim's (its processes are the claim's holders from the next
    /// reading), and a share's limits set on it before the reply, so the
    /// hook returns, and the container's command runs, only once they are.
    /// One container a claim is bound at a time: another's group is
    /// refused (`Conflict`) while the one bound has a process, the claim's
    /// limits being for one group; a container that replaces an ended one
    /// (restarted in its pod) takes the claim over.
    pub(super) fn claim_cgroup(
        &mut self,
        name: &str,
        id: i64,
        pid: u32,
        cgroup: Option<String>,
        bound_alive: bool,
        reply: Reply<Result<String>>,
    ) {
        let w = match self.node.worker(name) {
            Some(w) if w.id == id => w,
            _ => {
                let why = format!("{name} ended while its container was being bound");
                let _ = reply.send(Err(Error::NotFound(why)));
                return;
            }
        };
        let Some(cgroup) = cgroup else {
            let why = format!("pid: process {pid} is gone or in no control group of its own");
            let _ = reply.send(Err(Error::InvalidRequest(why)));
            return;
        };
        if let Some(bound) = w.cgroup.as_deref().filter(|b| *b != cgroup && bound_alive) {
            let why = format!(
                "{name} is bound to another container's control group ({bound}); a claim's \
                 share is held for one container"
            );
            let _ = reply.send(Err(Error::Conflict(why)));
            return;
        }
        let hold = self.hold_for(w);
        // The ended container's group: its limits go where it outlives it.
        if w.cgroup.as_deref().is_some_and(|b| b != cgroup) {
            self.clear_hold(name);
        }
        if let Err(e) = self.node.set_cgroup(name, &cgroup) {
            let _ = reply.send(Err(e));
            return;
        }
        tracing::info!(worker = %name, "worker {name}: a container bound (process {pid}, {cgroup})");
        let Some(hold) = hold else {
            // The GPU whole: nothing to limit.
            let _ = reply.send(Ok("the GPU whole".into()));
            return;
        };
        self.runtimes
            .holds
            .insert(name.to_string(), (id, hold.clone()));
        self.apply_hold_off_loop(name.to_string(), id, hold, cgroup, Some(reply));
    }

    /// At a start: each claim bound to a container has its limits set again
    /// on that container's group and read back (a restart forgets what
    /// was held; a GPU reset meanwhile may have cleared them).
    pub(super) fn hold_bound_claims(&mut self) {
        let bound: Vec<(String, i64, String)> = self
            .node
            .workers()
            .filter(|w| w.spec.claim.is_some())
            .filter_map(|w| Some((w.name().to_string(), w.id, w.cgroup.clone()?)))
            .collect();
        for (name, id, cgroup) in bound {
            let Some(hold) = self.node.worker(&name).and_then(|w| self.hold_for(w)) else {
                continue;
            };
            self.runtimes.holds.insert(name.clone(), (id, hold.clone()));
            self.apply_hold_off_loop(name, id, hold, cgroup, None);
        }
    }
}
