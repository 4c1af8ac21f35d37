//! The one service loop: it owns the node (state, ledger) and the GPU source.
//! D-Bus handlers and the page send it [`Command`]s over a bounded queue; it
//! runs them one at a time, then brings the bus objects up to date and
//! signals what changed. It also feeds the systemd watchdog itself, so a
//! stuck loop stops the pings.
//!
//! The loop never awaits a hypervisor, a container runtime or the network:
//! such calls run in tasks whose results come back as commands.
//!
//! - this file: the loop, its group commit, and a thin dispatching `handle`;
//! - [`queries`]: read-only answers (lists, dry runs, reports, the page);
//! - [`publish`]: bus objects and views in line with the node;
//! - [`reading`]: the inventory's re-read, in the blocking pool;
//! - [`schedules`]: SetSchedule, checked off the loop one call at a time;
//! - [`workloads`]: launch → watch → exit → reconcile;
//! - [`slicing`]: time-slicing (slice events, metering, converge, templates,
//!   staging), with [`hypervisor`] running its libvirt calls in tasks.

mod between_slices;
pub use between_slices::RETRY as BETWEEN_SLICES_RETRY;
mod claims;
mod holders;
mod hypervisor;
mod publish;
mod queries;
mod reading;
pub mod reload;
mod retention;
mod schedules;
mod settings;
mod slicing;
mod ticker;
mod worker_calls;
mod workloads;

use crate::access;
use crate::bus::Loop;
use crate::command::{Command, Reply};
use crate::error::{Error, Result};
use crate::failpoint;
use crate::inventory::GpuSource;
use crate::journal;
use crate::node::{Changes, GroupEnd, Node};
use crate::notify::Notifier;
use crate::time::EpochMs;
use crate::usage::Sampler;
use publish::{Published, Shown};
use sd_notify::NotifyState;
pub use settings::{Settings, SliceRules};
use std::sync::Arc;
use std::time::Duration;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;
use zbus::Connection;

/// Samples kept per GPU in memory (an hour at the default 2 s refresh).
const SAMPLES_KEPT: usize = 1800;

/// Bounded: a flood of calls gets `Busy` instead of growing memory.
pub const QUEUE_DEPTH: usize = 256;
// One user's calls take at most a quarter of it (bus/mod.rs).
const _: () = assert!(crate::bus::PER_USER_IN_FLIGHT * 4 <= QUEUE_DEPTH);

/// Without a watchdog, a re-read taking longer than this is said.
const READ_STUCK_WITHOUT_WATCHDOG: Duration = Duration::from_secs(30);

/// systemd is told the status line at most this often.
const STATUS_EVERY: Duration = Duration::from_secs(1);

/// At most this many submits and stops share one fsync.
const GROUP: usize = 64;

pub struct Service {
    node: Node,
    /// The GPU source, read off the loop's thread.
    reading: reading::Reading,
    /// The holders' liveness check under way, off the loop.
    holder_check: holders::HolderCheck,
    /// A re-read that does not end was said (without a watchdog).
    read_stuck_said: bool,
    /// A SetSchedule's conflicts are being checked; those that came
    /// after it wait, in order.
    schedule_checking: bool,
    schedules_waiting: std::collections::VecDeque<schedules::AskedSchedule>,
    conn: Connection,
    rx: mpsc::Receiver<Command>,
    lp: Loop,
    config: Option<reload::Loaded>,
    refresh: Duration,
    drain_after: Option<Duration>,
    /// The machine name from config, overriding the source's.
    machine_name: Option<String>,
    access: access::Rules,
    /// Each user's submits of the last minute (`access.max_submits_per_minute`).
    submit_rate: access::SubmitRate,
    /// The retention pass's clock and progress.
    retention: retention::Retention,
    slice_rules: SliceRules,
    sampler: Sampler,
    runtimes: workloads::Runtimes,
    /// Time-slicing (None without libvirt).
    slicing: Option<slicing::Slicing>,
    /// What is on the bus, and the views behind it.
    published: Published,
    /// What a group commit holds until its fsync.
    held: Held,
    /// Everything the loop sends on the bus, in order, without waiting.
    outbox: crate::bus::outbox::Outbox,
    /// A read-only connection to the ledger for usage reports, one at a
    /// time, off the loop (None for a ledger in memory).
    report_reader: Option<Arc<tokio::sync::Mutex<crate::store::Store>>>,
    /// The status line changed since systemd was last told (`STATUS=`).
    status_stale: bool,
    /// When systemd was last told the status line.
    status_sent: std::time::Instant,
    /// systemd's notify socket, kept open.
    notify: Notifier,
    /// Set when the ledger is in a state only a restart can read again:
    /// the loop ends with it (and systemd's Restart= starts a new daemon).
    fatal: Option<Error>,
}

/// A reply to send once its group is synced: told the sync's error, if any.
type HeldReply = Box<dyn FnOnce(Option<&Error>) + Send>;

/// Replies, signals and launches of a group's changes, sent once it is durable.
#[derive(Default)]
struct Held {
    replies: Vec<HeldReply>,
    shown: Vec<Shown>,
    placed: Vec<String>,
    /// Workers whose stop the group records: their workloads are stopped
    /// once it is durable.
    stops: Vec<String>,
}

impl Service {
    /// Registers every object for the node's current state on `conn`.
    /// The caller requests the bus name afterwards, then calls [`Service::run`].
    pub async fn register(
        node: Node,
        source: Box<dyn GpuSource>,
        conn: Connection,
        settings: Settings,
    ) -> Result<Service> {
        let (tx, rx) = mpsc::channel(QUEUE_DEPTH);
        // A restart gives no member a fresh minute of submits.
        let now = EpochMs::now().as_i64();
        let since = now - access::SubmitRate::window_ms();
        let submit_rate = access::SubmitRate::from_recent(node.store().submits_since(since)?, now);
        let lp = Loop {
            tx,
            group: settings.group.clone(),
            facts: Default::default(),
            in_flight: Default::default(),
            ledger_reads: Arc::new(crate::bus::turns::FairTurns::new(1)),
        };
        let slicing = settings.templates.clone().map(|vms| {
            slicing::Slicing::new(
                hypervisor::Hypervisor::new(vms, lp.tx.clone()).with_between_slices(
                    between_slices::BetweenSlices::new(
                        &settings.between_slices,
                        settings.between_slices_within,
                        settings.between_slices_retry,
                    ),
                ),
                &settings,
                node.store().templates().unwrap_or_default(),
            )
        });
        let published = Published::register(&conn, &node, &lp, &settings)
            .await
            .map_err(|e| Error::Backend(format!("D-Bus: {e}")))?;
        let report_reader = node
            .store()
            .reader()?
            .map(|r| Arc::new(tokio::sync::Mutex::new(r)));
        let mut service = Service {
            node,
            reading: reading::Reading::new(source),
            holder_check: holders::HolderCheck::default(),
            read_stuck_said: false,
            schedule_checking: false,
            schedules_waiting: Default::default(),
            conn,
            rx,
            lp,
            config: settings.config,
            refresh: settings.refresh,
            drain_after: settings.drain_after,
            machine_name: settings.machine_name,
            access: access::Rules {
                group: settings.group,
                containers_for_group: settings.containers_for_group,
                vms_for_group: settings.vms_for_group,
                max_workers: settings.max_workers_per_user,
                max_pending: settings.max_pending_per_user,
                max_submits_per_minute: settings.max_submits_per_minute,
                max_request_bytes: settings.max_request_mib_per_user as usize * 1024 * 1024,
                owner: settings.owner,
            },
            submit_rate,
            retention: retention::Retention::new(settings.keep_history, settings.retention_every),
            sampler: Sampler::new(settings.usage_interval.as_millis() as i64, SAMPLES_KEPT),
            slice_rules: settings.slice_rules,
            runtimes: workloads::Runtimes {
                containers: settings.containers,
                containers_by: (!settings.containers_by.is_empty())
                    .then(|| settings.containers_by.clone()),
                units: settings.units,
                vms: settings.vms,
                stop_timeout: settings.stop_timeout,
                member_max_processes: settings.member_max_processes,
                reconciling: Default::default(),
                limits: settings.limits,
                hard_limit: settings.hard_limit,
                reapplying: Default::default(),
                holds: Default::default(),
                stopping: Default::default(),
                containers_docker: settings.containers_engine
                    == Some(crate::runtime::ContainerRuntime::Docker),
            },
            slicing,
            published,
            held: Held::default(),
            outbox: crate::bus::outbox::Outbox::start(),
            report_reader,
            status_stale: false,
            status_sent: std::time::Instant::now(),
            notify: Notifier::from_env(),
            fatal: None,
        };
        service.publish_templates();
        Ok(service)
    }

    /// Where other adaptors (the machine page) send their commands.
    pub fn commands(&self) -> mpsc::Sender<Command> {
        self.lp.tx.clone()
    }

    /// The index of the bus objects, whose views the page reads off the loop.
    pub fn objects(&self) -> crate::bus::tree::Objects {
        self.published.objects()
    }

    /// Tells systemd the daemon is ready, with its status line (returned).
    pub fn ready(&mut self) -> String {
        let status = crate::views::status_line(&self.node);
        self.notify
            .send(&[NotifyState::Ready, NotifyState::Status(&status)]);
        status
    }

    /// Runs until SIGTERM/SIGINT: commands, inventory refresh, SIGHUP, watchdog.
    pub async fn run(mut self) -> Result<()> {
        let io = |e: std::io::Error| Error::Backend(format!("signals: {e}"));
        let mut term = signal(SignalKind::terminate()).map_err(io)?;
        let mut int = signal(SignalKind::interrupt()).map_err(io)?;
        let mut hup = signal(SignalKind::hangup()).map_err(io)?;
        let timer_failed = |e: std::io::Error| Error::Backend(format!("the refresh timer: {e}"));
        let refresh = ticker::Ticker::new(self.refresh).map_err(timer_failed)?;
        // Ping at half the watchdog period; without a watchdog this never fires.
        let watchdog = sd_notify::watchdog_enabled();
        let mut ping = tokio::time::interval(watchdog.map_or(Duration::from_secs(3600), |d| d / 2));
        // zbus's reader ends when the bus daemon goes or its socket fails;
        // the loop would go on (and on pinging the watchdog) with every call
        // unanswered, so the daemon stops instead, for systemd to restart.
        let bus = self.conn.clone();
        let bus_closed = bus.closed();
        tokio::pin!(bus_closed);
        if let Err(e) = self.node.begin_run(EpochMs::now()) {
            tracing::error!("recording this run in the ledger failed: {e}");
        }
        // Both ask runtimes in tasks; their answers come back as commands.
        self.reconcile();
        self.learn_what_runs();
        self.hold_bound_claims();
        loop {
            // A test can stall exactly this loop here: the pings must stop with it.
            failpoint::hit("service.loop");
            // Time-slicing's wake-ups: the handoff's timer and the next
            // scheduled action (timers, not polling).
            let (handoff_in, due) = match &self.slicing {
                Some(s) => s
                    .engine
                    .wake_ups(&self.node.rotation(), &self.slice_rules.tz),
                None => (None, None),
            };
            let due_in = due
                .as_ref()
                .map(|(t, _)| EpochMs::from_timestamp(*t).from_now());
            // A status line held back by the once-a-second rule is told
            // when its second is up, whatever else wakes the loop.
            let status_in = self
                .status_stale
                .then(|| STATUS_EVERY.saturating_sub(self.status_sent.elapsed()));
            // Likewise the Manager's and GPUs' PropertiesChanged held back.
            let properties_in = self.properties_due_in();
            let retention_in = self.retention.due_in();
            let mut called = false;
            tokio::select! {
                cmd = self.rx.recv() => match cmd {
                    Some(cmd) => {
                        called = true;
                        self.handle_group(cmd).await;
                    }
                    None => break,
                },
                _ = sleep_or_never(handoff_in) => self.handoff_timer().await,
                _ = sleep_or_never(due_in) => {
                    if let Some((at, list)) = due {
                        self.fire_due(at, list).await;
                    }
                }
                done = self.reading.done() => {
                    for (name, (id, pids)) in done.in_cgroups {
                        self.node.set_cgroup_pids(&name, id, pids);
                    }
                    self.apply_reading(done.machine, &done.why).await;
                    if let Some(why) = done.again {
                        self.reread(&why);
                    }
                    // GPUs for whole requests, on the machine as now read.
                    self.drain().await;
                }
                gone = self.holder_check.done() => self.drop_holders(&gone),
                ticked = refresh.tick() => {
                    if let Err(e) = ticked {
                        // Not seen; were it, the loop would spin on it.
                        let e = timer_failed(e);
                        tracing::error!("{e}");
                        self.fatal = Some(e);
                    }
                    self.check_reading(watchdog);
                    self.holder_check
                        .start(self.node.holders(), holders::still_running);
                    if self.reading.changed() {
                        self.reread("the inventory changed");
                    }
                    self.sample();
                    self.meter_slice();
                    self.relearn_if_due();
                    self.drain().await;
                }
                _ = hup.recv() => {
                    self.reload_config();
                    self.reread("SIGHUP");
                    self.drain().await;
                }
                _ = ping.tick(), if watchdog.is_some() => {
                    self.notify.send(&[NotifyState::Watchdog]);
                }
                _ = tokio::time::sleep(retention_in) => self.retention_step(),
                _ = sleep_or_never(status_in) => {}
                _ = sleep_or_never(properties_in) => {}
                _ = &mut bus_closed => {
                    // Said once, by main, as "stopped: …".
                    self.fatal = Some(Error::Backend(
                        "the bus connection closed: no call can reach the daemon any more \
                         (was the bus daemon restarted?)"
                            .into(),
                    ));
                }
                _ = term.recv() => break,
                _ = int.recv() => break,
            }
            // At most once a second (a message systemd wakes for, 5 % of a
            // lone call's time when sent every turn); a change within the
            // second is told when the second is up (`status_in`).
            if self.status_stale && self.status_sent.elapsed() >= STATUS_EVERY {
                self.send_status(&[]);
            }
            // Held back only to keep them out of a reply's way: a change
            // of a tick or a timer has no caller waiting, and waking again
            // 50 ms later for it would double an idle daemon's wake-ups.
            self.send_held_properties(!called);
            if self.fatal.is_some() {
                break;
            }
        }
        self.send_status(&[NotifyState::Stopping]);
        self.send_held_properties(true);
        if !self.outbox.flush(Duration::from_secs(2)).await {
            tracing::warn!("the last signals and replies were not all sent within 2 s");
        }
        if let Err(e) = self.node.alive(EpochMs::now()) {
            tracing::error!("recording the end of this run failed: {e}");
        }
        if let Some(e) = self.fatal.take() {
            return Err(e);
        }
        tracing::info!(
            message_id = journal::LIFECYCLE,
            "stopping; the ledger is closed cleanly"
        );
        Ok(())
    }

    /// Tells systemd the status line, with `also`.
    fn send_status(&mut self, also: &[NotifyState]) {
        let status = crate::views::status_line(&self.node);
        let mut states = vec![NotifyState::Status(&status)];
        states.extend_from_slice(also);
        self.notify.send(&states);
        self.status_stale = false;
        self.status_sent = std::time::Instant::now();
    }

    /// Keeps GPUs for whole requests that waited too long (and lets go of
    /// those no longer needed): see node/drain.rs.
    async fn drain(&mut self) {
        match self.node.drain(EpochMs::now(), self.drain_after) {
            Ok(changes) if changes == Changes::default() => {}
            Ok(changes) => {
                self.publish(&changes);
                self.launch_placed(&changes.placed).await;
            }
            Err(e) => tracing::error!("draining GPUs for whole work: {e}"),
        }
    }

    /// Keeps this refresh's energy and utilisation readings; closed intervals go to the ledger.
    fn sample(&mut self) {
        let now = EpochMs::now();
        let rows = self.sampler.record(now.as_i64(), &self.node.machine().gpus);
        if !rows.is_empty() {
            if let Err(e) = self.node.record_usage(&rows, now) {
                tracing::error!("recording GPU usage intervals failed: {e}");
            } else if let Err(e) = self.node.count_usage(now.as_i64()) {
                tracing::error!("counting GPU usage for the metrics failed: {e}");
            }
        }
    }

    /// A re-read that has not ended within the watchdog's period is the
    /// stuck loop it made when it ran on the loop's thread (NVML, or a
    /// user-name lookup, hung): the daemon stops, for systemd to start one
    /// afresh, as the watchdog had it do then. Without a watchdog it is
    /// said, and the daemon goes on with the machine it last read.
    fn check_reading(&mut self, watchdog: Option<Duration>) {
        let limit = watchdog.unwrap_or(READ_STUCK_WITHOUT_WATCHDOG);
        let Some(why) = self.reading.stuck(limit) else {
            self.read_stuck_said = false;
            return;
        };
        let e = Error::Backend(format!(
            "re-reading the machine ({why}) has not ended after {} s: NVML or a user-name \
             lookup (NSS) hangs",
            limit.as_secs()
        ));
        if watchdog.is_some() {
            tracing::error!("{e}; stopping, for the service manager to start the daemon afresh");
            self.fatal = Some(e);
        } else if !self.read_stuck_said {
            tracing::error!("{e}; placing on the machine as last read");
            self.read_stuck_said = true;
        }
    }

    /// Starts re-reading the machine (see [`reading`]); its result comes
    /// back to [`Service::apply_reading`].
    fn reread(&mut self, why: &str) {
        self.reading.start(self.node.own(), why);
    }

    async fn apply_reading(&mut self, read: Result<crate::placement::Machine>, why: &str) {
        match read {
            Ok(mut machine) => {
                if let Some(name) = &self.machine_name {
                    machine.name = name.clone();
                }
                match self.node.set_machine(machine) {
                    Ok(changes) => {
                        tracing::debug!("re-read the machine ({why})");
                        self.publish(&changes);
                        self.launch_placed(&changes.placed).await;
                        self.reapply_lost_limits();
                    }
                    Err(e) => tracing::error!("applying the new inventory failed: {e}"),
                }
            }
            Err(e) => tracing::warn!("re-reading the machine ({why}) failed: {e}"),
        }
    }

    /// Group commit: a submit or stop, and every submit or stop queued behind
    /// it (up to [`GROUP`]), share one ledger transaction (each its own
    /// savepoint), committed and made durable by one fsync; only then do
    /// their callers get replies and the bus the signals. A group whose
    /// commit fails (a full disk) is undone in memory too, and each caller
    /// told why. Any other command is handled on its own.
    async fn handle_group(&mut self, first: Command) {
        let groups = |c: &Command| {
            matches!(
                c,
                Command::Submit { .. }
                    | Command::Stop { .. }
                    | Command::PrepareClaim { .. }
                    | Command::UnprepareClaim { .. }
            )
        };
        if !groups(&first) {
            return self.handle(first).await;
        }
        if let Err(e) = self.node.begin_group() {
            tracing::error!("group commit: {e}");
        }
        let mut next = Some(first);
        let mut taken = 0;
        while let Some(cmd) = next.take() {
            self.handle(cmd).await;
            taken += 1;
            // A test holds a group open here (this task only: the bus goes
            // on taking calls, which join the group).
            failpoint::hit_async("service.group").await;
            if taken < GROUP {
                match self.rx.try_recv() {
                    Ok(c) if groups(&c) => next = Some(c),
                    Ok(other) => {
                        self.release().await;
                        // A lost group leaves memory half read back: the
                        // loop stops, and nothing more is done on it.
                        if self.fatal.is_none() {
                            self.handle(other).await;
                        }
                        return;
                    }
                    Err(_) => {}
                }
            }
        }
        self.release().await;
    }

    /// The group's commit and fsync, then what it held: replies, signals,
    /// launches. An undone group sends none of its own signals and
    /// launches nothing: the bus is brought back in line with the ledger,
    /// then each caller gets the error.
    async fn release(&mut self) {
        let held = std::mem::take(&mut self.held);
        let failed = match self.node.end_group() {
            GroupEnd::Durable => None,
            GroupEnd::Unsynced(e) => {
                tracing::error!("{e}");
                Some(e)
            }
            GroupEnd::Lost(e) => {
                tracing::error!("{e}");
                self.send_replies(held.replies, Some(e.clone()));
                self.fatal = Some(e);
                return;
            }
            GroupEnd::Undone(e, changes) => {
                tracing::error!(
                    "{e} ({} change(s) not recorded and undone)",
                    held.replies.len()
                );
                // Objects the group added go and those it removed come back,
                // silently: none of the group's announcements were sent.
                let shown = self.show(&changes).without_objects();
                self.announce(shown);
                self.send_replies(held.replies, Some(e));
                return;
            }
        };
        let replied = !held.replies.is_empty();
        self.send_replies(held.replies, failed);
        if replied {
            // Each reply above wakes its caller's task, which then writes
            // the reply message; yielding once lets those tasks run before
            // this task writes the group's signals, so callers are not kept
            // waiting behind WorkerNew and PropertiesChanged.
            self.outbox.send(tokio::task::yield_now());
        }
        for shown in Shown::coalesce(held.shown) {
            self.announce(shown);
        }
        self.launch_placed(&held.placed).await;
        for name in held.stops {
            self.stop_workload(&name).await;
        }
    }

    /// A group's replies, told its error if any, through the outbox: behind
    /// the objects its changes added (or, undone, removed again).
    fn send_replies(&self, replies: Vec<HeldReply>, failed: Option<Error>) {
        for reply in replies {
            let failed = failed.clone();
            self.outbox.send(async move { reply(failed.as_ref()) });
        }
    }

    /// A reply sent behind what the change queued on the outbox (objects it
    /// added, signals), so the caller finds them when it reads.
    fn reply_in_order<T: Send + 'static>(&self, reply: Reply<T>, value: T) {
        self.outbox.send(async move {
            let _ = reply.send(value);
        });
    }

    /// A change's reply, signals and launches, held until its group is durable.
    fn hold<T: Send + 'static>(
        &mut self,
        reply: Reply<Result<T>>,
        value: T,
        shown: Shown,
        placed: Vec<String>,
    ) {
        self.held
            .replies
            .push(Box::new(move |failed: Option<&Error>| {
                let _ = reply.send(match failed {
                    None => Ok(value),
                    Some(e) => Err(e.clone()),
                });
            }));
        self.held.shown.push(shown);
        self.held.placed.extend(placed);
    }

    /// Each command to the room that handles it.
    async fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Submit {
                spec,
                caller,
                asked,
                reply,
            } => {
                if asked.elapsed() > crate::command::SUBMIT_PATIENCE {
                    tracing::warn!(
                        "a submit (uid {}) waited {} s for its turn; refused unprocessed, as its \
                         caller has most likely given up",
                        caller.uid,
                        asked.elapsed().as_secs()
                    );
                    let _ = reply.send(Err(Error::Busy(format!(
                        "the daemon took over {} s to come to this request; nothing was \
                         submitted: try again",
                        crate::command::SUBMIT_PATIENCE.as_secs()
                    ))));
                    return;
                }
                self.submit(spec, caller, reply).await
            }
            Command::Stop {
                name,
                caller,
                reply,
            } => self.stop(name, caller, reply).await,
            Command::PrepareClaim {
                claim,
                caller,
                reply,
            } => self.prepare_claim(claim, caller, reply),
            Command::UnprepareClaim { uid, caller, reply } => {
                self.unprepare_claim(uid, caller, reply).await
            }
            Command::BindClaim {
                uid,
                pid,
                caller,
                reply,
            } => self.bind_claim(uid, pid, caller, reply),
            Command::ClusterOffers { reply } => {
                let _ = reply.send(self.node.offered_to_cluster());
            }
            Command::ListClaims { reply } => {
                let _ = reply.send(self.node.claims());
            }
            Command::GetWorker { name, reply } => {
                let _ = reply.send(self.get_worker(&name));
            }
            Command::ListEnded {
                since_ms,
                limit,
                reply,
            } => self.list_ended(since_ms, limit, reply),
            Command::ListGpus { reply } => {
                // A test holds the loop here (its task only: the bus goes on
                // taking calls, which queue for it).
                failpoint::hit_async("service.list-gpus").await;
                let _ = reply.send(self.list_gpus());
            }
            Command::ListSharers { gpu, reply } => {
                let _ = reply.send(self.list_sharers(gpu));
            }
            Command::WhyNot { spec, reply } => {
                let _ = reply.send(self.why_not(&spec));
            }
            Command::UsageReport {
                window,
                group_by,
                reply,
            } => self.usage_report(window, group_by, reply),
            Command::PageSnapshot { reply } => {
                let _ = reply.send(self.page_snapshot());
            }
            Command::SetSchedule {
                template,
                actions,
                caller,
                reply,
            } => self.set_schedule(schedules::AskedSchedule {
                template,
                actions,
                caller,
                reply,
            }),
            Command::ScheduleChecked {
                change,
                checked,
                caller,
                reply,
            } => self.schedule_checked(change, checked, caller, reply),
            Command::PreviewSchedule {
                template,
                actions,
                caller,
                reply,
            } => {
                let _ = reply.send(self.preview_schedule(&template, &actions, &caller));
            }
            Command::GetSchedule { template, reply } => {
                let _ = reply.send(self.get_schedule(&template));
            }
            Command::ListSlices { window, reply } => {
                let _ = reply.send(Ok(self.list_slices(window)));
            }
            Command::ListNextSlices { count, reply } => {
                let _ = reply.send(Ok(self.list_next_slices(count)));
            }
            Command::ListSliceNotes { window, reply } => {
                let _ = reply.send(Ok(self.list_slice_notes(window)));
            }
            Command::SliceReport {
                template,
                window,
                reply,
            } => self.slice_report(template, window, reply),
            Command::CreateTemplate {
                spec,
                caller,
                reply,
            } => self.create_template(spec, &caller, reply),
            Command::TemplatePrepared {
                spec,
                result,
                reply,
            } => {
                let r = self.template_prepared(&spec, result).await;
                self.reply_in_order(reply, r);
            }
            Command::RemoveTemplate {
                name,
                caller,
                reply,
            } => {
                let r = self.remove_template(&name, &caller).await;
                self.reply_in_order(reply, r);
            }
            Command::ListTemplates { reply } => {
                let _ = reply.send(self.list_templates());
            }
            Command::Resume {
                template,
                as_handoff,
                caller,
                reply,
            } => {
                let r = self.resume(template, as_handoff, &caller).await;
                self.reply_in_order(reply, r);
            }
            Command::PowerOff {
                template,
                hard,
                caller,
                reply,
            } => {
                let r = self.power_off(template, hard, &caller).await;
                self.reply_in_order(reply, r);
            }
            Command::StageWeights {
                template,
                source,
                caller,
                reply,
            } => {
                let r = self.stage_weights(&template, &source, &caller);
                let _ = reply.send(r);
            }
            Command::WeightsStaged { template, result } => {
                self.weights_staged(template, result).await
            }
            Command::Slice(event) => {
                let _ = self.slice(event).await;
            }
            Command::Lifecycle {
                domain,
                event,
                on,
                at,
            } => self.lifecycle(&domain, event, on, at).await,
            Command::Running { on } => self.converge_slices(on).await,
            Command::SliceCpu { template, at, cpu } => self.slice_cpu(&template, at, cpu),
            Command::GuestGpu {
                template,
                sample,
                at,
            } => self.guest_gpu(&template, &sample, at),
            // Units are systemd's, asked over the daemon's own bus
            // connection: with it closed (the daemon is stopping), an error
            // says nothing of the unit, which the next run adopts as found.
            // Recorded as failed, that run would stop a unit that runs on.
            Command::Launched { kind, .. } | Command::Exited { kind, .. }
                if kind == crate::runtime::Kind::Unit && self.conn.is_closed() => {}
            Command::Launched { name, kind, result } => self.launched(name, kind, result).await,
            Command::Cgroup { name, cgroup } => {
                if let Err(e) = self.node.set_cgroup(&name, &cgroup) {
                    tracing::error!(worker = %name, "recording the control group failed: {e}");
                }
                self.check_hold(&name, cgroup);
            }
            Command::ClaimCgroup {
                name,
                id,
                pid,
                cgroup,
                bound_alive,
                reply,
            } => self.claim_cgroup(&name, id, pid, cgroup, bound_alive, reply),
            Command::Enforced {
                name,
                id,
                enforcement,
            } => self.enforced(&name, id, enforcement),
            Command::Exited {
                name,
                kind,
                id,
                exit,
            } => self.exited(name, kind, id, exit).await,
            Command::Listed { kind, found, tries } => self.reconcile_kind(kind, found, tries).await,
        }
    }
}

/// Sleeps for `d`, or forever when there is nothing to wait for.
async fn sleep_or_never(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}
