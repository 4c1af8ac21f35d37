//! Holders' liveness, off the loop's thread. Every refresh asks whether
//! each worker's holders still run as the processes they were (two reads of
//! /proc each). Holders are named by callers, many per worker and many
//! workers per user: on the loop, review measured seconds a tick with a
//! member's tens of thousands, every call waiting. The check runs in the
//! blocking pool on the distinct holders, one check at a time (a tick that
//! finds one under way asks again at the next), and those found gone come
//! back to the loop as a select branch ([`HolderCheck::done`]).

use super::Service;
use crate::access::{self, Caller};
use crate::error::{Error, Result};
use crate::worker::Holder;
use std::collections::HashSet;
use tokio::task::JoinHandle;

#[derive(Default)]
pub(super) struct HolderCheck {
    under_way: Option<JoinHandle<HashSet<(Holder, u32)>>>,
}

impl HolderCheck {
    /// Checks `holders` (each with its worker owner's uid) with `alive`,
    /// unless a check is under way.
    pub(super) fn start(
        &mut self,
        holders: HashSet<(Holder, u32)>,
        alive: fn(&Holder, u32) -> bool,
    ) {
        if self.under_way.is_some() || holders.is_empty() {
            return;
        }
        self.under_way = Some(tokio::task::spawn_blocking(move || {
            // A test holds a check here (a /proc that answers slowly).
            crate::failpoint::hit("holders.check");
            holders
                .into_iter()
                .filter(|(h, owner)| !alive(h, *owner))
                .collect()
        }));
    }

    /// The holders found gone, each with the owner it was checked for (a
    /// process may be one root's worker keeps and a member's may not), once
    /// the check under way ends; never while none is.
    pub(super) async fn done(&mut self) -> HashSet<(Holder, u32)> {
        let Some(check) = &mut self.under_way else {
            return std::future::pending().await;
        };
        // An error only if the runtime is shutting down: nothing is dropped.
        let gone = check.await.unwrap_or_default();
        self.under_way = None;
        gone
    }
}

/// Whether a holder is still the process it was named as (a reused pid is
/// another process: its start time differs), still all its owner's (`owner`,
/// the worker's): a holder that ran a set-uid program since runs with
/// another user's rights. Root's workers may name anyone's processes.
pub(super) fn still_running(h: &Holder, owner: u32) -> bool {
    let Some(p) = crate::auth::process(h.pid) else {
        return false;
    };
    h.start == Some(p.start) && (owner == 0 || p.uids.iter().all(|u| *u == owner))
}

/// What the loop does with the holders the check found gone.
impl Service {
    /// Holders that are gone, or whose pid another process now has (as the
    /// check off the loop found), no longer count as their worker's:
    /// dropped, with a journal line.
    pub(super) fn drop_holders(&mut self, gone: &std::collections::HashSet<(Holder, u32)>) {
        if gone.is_empty() {
            return;
        }
        match self
            .node
            .keep_holders(|h, owner| !gone.contains(&(*h, owner)))
        {
            Ok(dropped) => {
                for (name, gone) in dropped {
                    self.publish_worker(&name);
                    for h in gone {
                        tracing::warn!(
                            worker = %name,
                            "holder pid {} of worker {name} is gone (or its pid was reused, or \
                             it runs as another user now): its GPU memory no longer counts as \
                             the worker's",
                            h.pid
                        );
                    }
                }
            }
            Err(e) => tracing::error!("recording holders that are gone: {e}"),
        }
    }
}

/// The spec's holders as processes the caller may name, each with its
/// identity (so a reused pid is never taken for it). No holder unless named:
/// a client that keeps running names itself (its own pid).
pub(super) fn holders_of(
    spec: &crate::request::WorkerSpec,
    caller: &Caller,
) -> Result<Vec<Holder>> {
    spec.holders
        .iter()
        .enumerate()
        .map(|(i, &pid)| {
            let p = crate::auth::process(pid).ok_or_else(|| {
                Error::field(
                    &format!("holders[{i}]"),
                    format!("no process {pid} is running"),
                )
            })?;
            access::may_hold(caller, i, pid, p.uids)?;
            Ok(Holder {
                pid,
                start: Some(p.start),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn those_gone_come_back_and_one_check_runs_at_a_time() {
        let mine = crate::auth::process(std::process::id()).unwrap();
        let me = Holder {
            pid: std::process::id(),
            start: Some(mine.start),
        };
        // The same pid with another start time: a reused pid.
        let reused = Holder {
            pid: me.pid,
            start: Some(mine.start + 1),
        };
        let unknown = Holder {
            pid: me.pid,
            start: None,
        };
        let uid = mine.uid;
        let mut check = HolderCheck::default();
        check.start(
            [(me, uid), (reused, uid), (unknown, uid)].into(),
            still_running,
        );
        // Asked again while one runs: ignored.
        check.start([(me, uid)].into(), |_, _| false);
        let gone = check.done().await;
        assert_eq!(gone, [(reused, uid), (unknown, uid)].into());
        // Named by a worker of another owner: this process is not all
        // theirs (root's workers may name anyone's).
        check.start([(me, uid + 1), (me, 0)].into(), still_running);
        assert_eq!(check.done().await, [(me, uid + 1)].into());
        // Nothing under way: done never ends.
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(50), check.done())
                .await
                .is_err()
        );
        check.start([(me, uid)].into(), |_, _| false);
        assert_eq!(check.done().await, [(me, uid)].into());
    }
}
