//! Kubernetes claims (#64): PrepareClaim and UnprepareClaim from the
//! kubelet plugin, in the group commit as submits and stops are. The node
//! decides (node/claims.rs); this room only acknowledges once durable.

use super::Service;
use crate::access::{Act, Caller};
use crate::command::Reply;
use crate::error::Result;

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
                Some(w) if w.spec.claim.is_some() => self.node.stop(&name, caller.uid).map(Some),
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
}
