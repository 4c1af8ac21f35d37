//! SubmitWorker and StopWorker: checked (who, quotas, room, rate),
//! recorded in the caller's group commit, acknowledged once durable; a
//! stop of a workload is the ledger's before its reply and carried out
//! after (workloads.rs).

use super::{holders, Service};
use crate::access::{Act, Caller};
use crate::command::{Reply, Submitted};
use crate::error::Result;
use crate::time::EpochMs;

impl Service {
    pub(super) async fn submit(
        &mut self,
        spec: String,
        caller: Caller,
        reply: Reply<Result<Submitted>>,
    ) {
        let r = self.access.may(&caller, Act::SubmitWorker).and_then(|()| {
            let held = self.node.held_by(caller.uid);
            self.access.within_quota(&caller, held, spec.len())?;
            // Before anything is written: a disk near full takes no new work
            // (stops, exits and readings still commit: store/room.rs).
            self.node.store().room_for_new_work()?;
            let now = EpochMs::now().as_i64();
            self.access
                .within_rate(&caller, &mut self.submit_rate, now)?;
            let parsed = crate::request::WorkerSpec::parse(&spec)?;
            if parsed.claim.is_some() {
                return Err(crate::error::Error::field(
                    "claim",
                    "set by PrepareClaim only (the kubelet plugin), not in a request",
                ));
            }
            self.may_run(&parsed, &caller)?;
            let holders = holders::holders_of(&parsed, &caller)?;
            self.node.submit_parsed(parsed, &spec, caller.uid, holders)
        });
        match r {
            Ok((name, changes)) => {
                let w = self.node.worker(&name).expect("just submitted");
                let out = Submitted {
                    name: name.clone(),
                    state: w.state(),
                    reasons: self.node.reasons(&name),
                };
                // Objects and views now (a caller reads them after the
                // reply); the reply, signals and launches once durable.
                let shown = self.show(&changes);
                self.hold(reply, out, shown, changes.placed);
            }
            Err(e) => {
                let _ = reply.send(Err(e));
            }
        }
    }

    pub(super) async fn stop(&mut self, name: String, caller: Caller, reply: Reply<Result<()>>) {
        // A name no worker could have is told as such, and never echoed.
        let may = self.access.may(&caller, Act::StopWorker);
        if let Err(e) = may.and_then(|()| crate::request::validate_name("name", &name)) {
            let _ = reply.send(Err(e));
            return;
        }
        let launched = match self.node.check_stop(&name, caller.uid) {
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
            Ok(w) => w.launches() && w.state() != crate::worker::State::Pending,
        };
        if launched {
            // Acknowledged once the ledger holds it; carried out after
            // (and again after a crash) until the workload is gone. The
            // share frees when the runtime reports it gone.
            match self.node.ask_stop(&name, caller.uid) {
                Ok(changes) => {
                    let shown = self.show(&changes);
                    self.hold(reply, (), shown, Vec::new());
                    self.held.stops.push(name);
                }
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            }
            return;
        }
        // A claim's limits go (its pod may run on: docs/kubernetes.md).
        self.clear_hold(&name);
        match self.node.stop(&name, caller.uid) {
            Ok(changes) => {
                let shown = self.show(&changes);
                self.hold(reply, (), shown, changes.placed);
            }
            Err(e) => {
                let _ = reply.send(Err(e));
            }
        }
    }
}
