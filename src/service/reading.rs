//! The inventory's re-read, off the loop's thread. NVML's calls, `/proc`,
//! and the user-name lookup for a process outside any worker (NSS: LDAP or
//! sssd behind it) can each take long, and another user's processes are
//! among what is read. On the loop's thread, which also serves the bus
//! (#25), a slow read held every call; now it runs in the blocking pool and
//! its machine comes back to the loop as a select branch ([`Reading::done`]).
//! One read at a time: a re-read asked for meanwhile follows it. The
//! workers' control groups are looked in there too, just before the read
//! (a member's unit may hold thousands of tasks in nested groups).

use crate::error::{Error, Result};
use crate::inventory::{GpuSource, Own};
use crate::placement::Machine;
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

type Read = (Box<dyn GpuSource>, Result<Machine>, InCgroups);

/// By worker name: the worker's id and the processes found in its group.
pub(super) type InCgroups = std::collections::HashMap<String, (i64, Vec<u32>)>;

/// A read that ended: the machine, the processes found in the workers'
/// control groups, why it was asked for, and why another was meanwhile.
pub(super) struct Done {
    pub machine: Result<Machine>,
    pub in_cgroups: InCgroups,
    pub why: String,
    pub again: Option<String>,
}

pub(super) struct Reading {
    /// The source, while no read has it.
    source: Option<Box<dyn GpuSource>>,
    /// The read under way, why it was asked for, and since when.
    under_way: Option<(JoinHandle<Read>, String, Instant)>,
    /// A re-read asked for while one was under way: why.
    again: Option<String>,
}

impl Reading {
    pub(super) fn new(source: Box<dyn GpuSource>) -> Reading {
        Reading {
            source: Some(source),
            under_way: None,
            again: None,
        }
    }

    /// Whether a re-read may find something new (cheap; no while one is
    /// under way).
    pub(super) fn changed(&mut self) -> bool {
        self.source.as_mut().is_some_and(|s| s.changed())
    }

    /// Starts a re-read with what the workers own now, unless one is under
    /// way: then one more follows it.
    pub(super) fn start(&mut self, mut own: Own, why: &str) {
        let Some(mut source) = self.source.take() else {
            self.again = Some(why.to_string());
            return;
        };
        let read = tokio::task::spawn_blocking(move || {
            // A test holds a read here (a slow NVML or NSS).
            crate::failpoint::hit("inventory.read");
            if !own.cgroups.is_empty() {
                // And here, as a unit of many tasks would.
                crate::failpoint::hit("cgroups.walk");
            }
            let root = std::path::Path::new("/sys/fs/cgroup");
            own.in_cgroups = own
                .cgroups
                .iter()
                .map(|g| {
                    let pids = crate::runtime::cgroup_pids(root, &g.cgroup);
                    (g.worker.clone(), (g.id, pids))
                })
                .collect();
            let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| source.read(&own)))
                .unwrap_or_else(|_| Err(Error::Backend("reading the machine panicked".into())));
            (source, read, own.in_cgroups)
        });
        self.under_way = Some((read, why.to_string(), Instant::now()));
    }

    /// The read under way when it has taken longer than `limit`: why it
    /// was asked for.
    pub(super) fn stuck(&self, limit: Duration) -> Option<&str> {
        match &self.under_way {
            Some((_, why, since)) if since.elapsed() > limit => Some(why),
            _ => None,
        }
    }

    /// The read under way once it ends; never while none is.
    pub(super) async fn done(&mut self) -> Done {
        let Some((read, _, _)) = &mut self.under_way else {
            return std::future::pending().await;
        };
        let joined = read.await;
        let (_, why, _) = self.under_way.take().expect("a read was under way");
        let (machine, in_cgroups) = match joined {
            Ok((source, machine, in_cgroups)) => {
                self.source = Some(source);
                (machine, in_cgroups)
            }
            // Only if the runtime is shutting down (the read catches panics).
            Err(e) => (
                Err(Error::Backend(format!("reading the machine: {e}"))),
                InCgroups::new(),
            ),
        };
        Done {
            machine,
            in_cgroups,
            why,
            again: self.again.take(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// A source whose each read waits for the test's word: `true` panics.
    struct Told {
        reads: u32,
        told: mpsc::Receiver<bool>,
    }

    impl GpuSource for Told {
        fn read(&mut self, _own: &Own) -> Result<Machine> {
            self.reads += 1;
            if self.told.recv().unwrap() {
                panic!("the driver fell over");
            }
            Ok(Machine {
                name: format!("read {}", self.reads),
                wsl: false,
                cpu_cores: crate::quantity::Amount::whole(1),
                memory_bytes: 1,
                gpus: Vec::new(),
                driver: String::new(),
            })
        }
    }

    fn reading() -> (Reading, mpsc::Sender<bool>) {
        let (tell, told) = mpsc::channel();
        (Reading::new(Box::new(Told { reads: 0, told })), tell)
    }

    #[tokio::test]
    async fn a_reread_asked_for_during_one_follows_it_and_one_runs_at_a_time() {
        let (mut r, tell) = reading();
        r.start(Own::default(), "first");
        assert!(!r.changed(), "nothing to ask while the source is out");
        r.start(Own::default(), "second");
        r.start(Own::default(), "third");
        tell.send(false).unwrap();
        let done = r.done().await;
        assert_eq!(done.machine.unwrap().name, "read 1", "only one read ran");
        assert_eq!(done.why, "first");
        assert_eq!(
            done.again.as_deref(),
            Some("third"),
            "the latest reason follows"
        );
        // Nothing under way: done never ends.
        assert!(tokio::time::timeout(Duration::from_millis(50), r.done())
            .await
            .is_err());
        r.start(Own::default(), "third");
        tell.send(false).unwrap();
        let done = r.done().await;
        assert_eq!(done.machine.unwrap().name, "read 2");
        assert_eq!(done.again, None);
    }

    #[tokio::test]
    async fn a_read_that_panics_is_an_error_and_the_source_is_kept() {
        let (mut r, tell) = reading();
        r.start(Own::default(), "refresh");
        tell.send(true).unwrap();
        let machine = r.done().await.machine;
        assert!(machine.unwrap_err().message().contains("panicked"));
        r.start(Own::default(), "refresh");
        tell.send(false).unwrap();
        assert_eq!(r.done().await.machine.unwrap().name, "read 2");
    }

    #[tokio::test]
    async fn a_read_is_stuck_once_it_outlasts_the_limit() {
        let (mut r, tell) = reading();
        assert_eq!(r.stuck(Duration::ZERO), None, "none under way");
        r.start(Own::default(), "SIGHUP");
        assert_eq!(r.stuck(Duration::from_secs(60)), None);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(r.stuck(Duration::from_millis(10)), Some("SIGHUP"));
        tell.send(false).unwrap();
        r.done().await.machine.unwrap();
    }
}
