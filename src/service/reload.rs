//! `systemctl reload` (SIGHUP): the inventory is re-read, and so is
//! node.toml. What can change while the daemon runs is applied at once;
//! what cannot (sockets, the zone, timers built at start) is named in the
//! journal as waiting for a restart. A file that no longer parses changes
//! nothing: the error is logged and the running configuration stays.

use super::Service;
use crate::config::Config;

/// Where the configuration came from, and what it said when last applied.
pub struct Loaded {
    pub path: std::path::PathBuf,
    /// Named on the command line (a missing file is then an error).
    pub explicit: bool,
    /// On a session bus: the session's defaults apply (with this runtime dir).
    pub session: Option<Option<std::path::PathBuf>>,
    pub config: Config,
}

impl Service {
    pub(super) fn reload_config(&mut self) {
        let Some(loaded) = &self.config else {
            return;
        };
        let new = match Config::load(&loaded.path, loaded.explicit) {
            Ok(c) => match &loaded.session {
                Some(run) => c.for_session(run.as_deref()),
                None => c,
            },
            Err(e) => {
                tracing::error!(
                    "{} not reloaded, the running configuration stays: {e}",
                    loaded.path.display()
                );
                return;
            }
        };
        let old = &loaded.config;
        let mut applied = Vec::new();
        let a = &new.access;
        if (
            a.containers_for_group,
            a.vms_for_group,
            a.max_workers_per_user,
            a.max_pending_per_user,
            a.max_submits_per_minute,
            a.max_request_mib_per_user,
        ) != (
            old.access.containers_for_group,
            old.access.vms_for_group,
            old.access.max_workers_per_user,
            old.access.max_pending_per_user,
            old.access.max_submits_per_minute,
            old.access.max_request_mib_per_user,
        ) {
            self.access.containers_for_group = a.containers_for_group;
            self.access.vms_for_group = a.vms_for_group;
            self.access.max_workers = a.max_workers_per_user;
            self.access.max_pending = a.max_pending_per_user;
            self.access.max_submits_per_minute = a.max_submits_per_minute;
            self.access.max_request_bytes = a.max_request_mib_per_user as usize * 1024 * 1024;
            applied.push("[access] containers_for_group, vms_for_group and quotas");
        }
        if new.placement.drain_after() != old.placement.drain_after() {
            self.drain_after = new.placement.drain_after();
            applied.push("[placement] drain_after_seconds");
        }
        if new.machine != old.machine {
            self.machine_name = new.machine.clone();
            applied.push("machine");
        }
        // Read at each launch: a worker started from now on gets it.
        if new.sharing.hard_limit != old.sharing.hard_limit {
            self.runtimes.hard_limit = new.sharing.hard_limit;
            applied.push("[sharing] hard_limit (for workers started from now on)");
        }
        if format!("{:?}", new.history) != format!("{:?}", old.history) {
            self.retention.set_keep(new.history.keep());
            let floor = new.history.min_free_mb.saturating_mul(1_000_000);
            self.node.set_min_free(floor);
            applied.push("[history]");
        }
        // Everything else is built into the running daemon at start.
        let section = |name: &'static str, o: String, n: String| (o != n).then_some(name);
        let mut restart: Vec<&str> = [
            section(
                "[inventory]",
                format!("{:?}", old.inventory),
                format!("{:?}", new.inventory),
            ),
            section(
                "[schedule]",
                format!("{:?}", old.schedule),
                format!("{:?}", new.schedule),
            ),
            section(
                "[usage]",
                format!("{:?}", old.usage),
                format!("{:?}", new.usage),
            ),
            section(
                "[runtime]",
                format!("{:?}", old.runtime),
                format!("{:?}", new.runtime),
            ),
            section(
                "[http]",
                format!("{:?}", old.http),
                format!("{:?}", new.http),
            ),
            section(
                "[slicing]",
                format!("{:?}", old.slicing),
                format!("{:?}", new.slicing),
            ),
        ]
        .into_iter()
        .flatten()
        .collect();
        if new.access.group != old.access.group {
            restart.push("[access] group");
        }
        if new.sharing.cgroup_root != old.sharing.cgroup_root {
            restart.push("[sharing] cgroup_root");
        }
        let applied = if applied.is_empty() {
            "nothing to apply".to_string()
        } else {
            format!("applied {}", applied.join(", "))
        };
        if restart.is_empty() {
            tracing::info!("node.toml reloaded: {applied}");
        } else {
            tracing::warn!(
                "node.toml reloaded: {applied}; changed but applied only by a restart \
                 (systemctl restart astraeusd): {}",
                restart.join(", ")
            );
        }
        if let Some(loaded) = &mut self.config {
            // What a restart would still apply stays "changed" next time too.
            let mut kept = new;
            kept.inventory = loaded.config.inventory.clone();
            kept.schedule = loaded.config.schedule.clone();
            kept.usage = loaded.config.usage.clone();
            kept.runtime = loaded.config.runtime.clone();
            kept.http = loaded.config.http.clone();
            kept.slicing = loaded.config.slicing.clone();
            kept.access.group = loaded.config.access.group.clone();
            loaded.config = kept;
        }
    }
}
