//! `org.astraeus.Node1.Manager` at the base path: submit and stop workers,
//! list what the machine holds, and drive the time-slicing rotation.

use super::pairs::{self, in_seconds};
use super::{bounded, object_path as path, template_path, worker_path, BusError, Delta, Loop};
use crate::command::{Command, Window};
use crate::views::{ManagerView, Shared};
use crate::wire::{
    seconds, EndedRow, GpuRow, Sharer, SliceReportRow, SliceRow, TemplateRow, UsageRow,
    UsageRowRef, WorkerRow,
};
use zbus::message::Header;
use zbus::object_server::SignalEmitter;
use zbus::{interface, Connection, OwnedObjectPath};

/// The calls whose answers grow with the workers (or the ledger), answered
/// on the lists runtime ([`super::offload`]).
pub const LISTINGS: &[&str] = &[
    "ListWorkers",
    "ListEnforcement",
    "ListPending",
    "ListEnded",
    "ListEndedMs",
    "UsageReport",
    "UsageReportMs",
    "SliceReport",
    "SliceReportMs",
];

pub struct Manager {
    pub lp: Loop,
    pub view: Shared<ManagerView>,
    /// The worker lists are answered from the objects' views, not the loop.
    pub objects: super::tree::Objects,
    /// The machine page's address, `http://ADDR/`; "" when it is off.
    pub page: String,
    /// The engine container workers run through, and its socket.
    pub containers: String,
}

#[interface(name = "org.astraeus.Node1.Manager", introspection_docs = false)]
impl Manager {
    /// Submits a worker spec (the seed's JSON); it is placed now or waits.
    #[zbus(out_args("worker", "state", "reasons"))]
    async fn submit_worker(
        &self,
        spec: String,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(OwnedObjectPath, String, Vec<String>), BusError> {
        bounded(&[("request", &spec)])?;
        let asked = std::time::Instant::now();
        // A test holds a submit here until it is older than the loop accepts.
        crate::failpoint::hit_async("bus.submit").await;
        let s = self
            .lp
            .ask_as(&hdr, conn, |caller, reply| Command::Submit {
                spec,
                caller,
                asked,
                reply,
            })
            .await??;
        Ok((
            path(worker_path(&s.name))?,
            s.state.as_str().into(),
            s.reasons,
        ))
    }

    async fn stop_worker(
        &self,
        name: String,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(), BusError> {
        bounded(&[("name", &name)])?;
        Ok(self
            .lp
            .ask_as(&hdr, conn, |caller, reply| Command::Stop {
                name,
                caller,
                reply,
            })
            .await??)
    }

    /// Books a device the Kubernetes scheduler allocated to a claim (the
    /// kubelet plugin's call): a worker `claim-UID` pinned to the GPU by
    /// UUID, with `memory_bytes` of it (a multiple of 256 MiB) or, with 0,
    /// the GPU whole. Placed now or refused with the daemon's own reason
    /// (`Conflict`); asked again, the same answer. Returns the worker and
    /// what its containers are told in ASTRAEUS_GPU_MEMORY_GB.
    #[zbus(out_args("worker", "memory_gb"))]
    #[allow(clippy::too_many_arguments)] // the call's D-Bus arguments, as they come
    async fn prepare_claim(
        &self,
        claim_uid: String,
        namespace: String,
        name: String,
        gpu_uuid: String,
        memory_bytes: u64,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(OwnedObjectPath, String), BusError> {
        bounded(&[
            ("claim_uid", &claim_uid),
            ("namespace", &namespace),
            ("name", &name),
            ("gpu_uuid", &gpu_uuid),
        ])?;
        let claim =
            crate::claim::Claim::new(&claim_uid, &namespace, &name, &gpu_uuid, memory_bytes)?;
        let (worker, memory_gb) = self
            .lp
            .ask_as(&hdr, conn, |caller, reply| Command::PrepareClaim {
                claim,
                caller,
                reply,
            })
            .await??;
        Ok((path(worker_path(&worker))?, memory_gb))
    }

    /// Ends a claim's worker (the kubelet plugin's call); a claim not
    /// prepared is no error (the kubelet asks again after a restart).
    async fn unprepare_claim(
        &self,
        claim_uid: String,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(), BusError> {
        bounded(&[("claim_uid", &claim_uid)])?;
        crate::claim::check_uid(&claim_uid)?;
        Ok(self
            .lp
            .ask_as(&hdr, conn, |caller, reply| Command::UnprepareClaim {
                uid: claim_uid,
                caller,
                reply,
            })
            .await??)
    }

    /// Binds a pod's container to its prepared claim (the CDI hook's call,
    /// `astraeusctl claim-hook`, as the container is created): the
    /// control group of process `pid` becomes the claim's, its processes
    /// the claim's holders, and a share's GPU memory limits are set on it
    /// before the reply. Returns how the share is held ("held",
    /// "promised: why", or "the GPU whole"). One container a claim.
    #[zbus(out_args("enforcement"))]
    async fn bind_claim_container(
        &self,
        claim_uid: String,
        pid: u32,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<String, BusError> {
        bounded(&[("claim_uid", &claim_uid)])?;
        crate::claim::check_uid(&claim_uid)?;
        if pid == 0 {
            return Err(crate::error::Error::field("pid", "a process id, not 0").into());
        }
        Ok(self
            .lp
            .ask_as(&hdr, conn, |caller, reply| Command::BindClaim {
                uid: claim_uid,
                pid,
                caller,
                reply,
            })
            .await??)
    }

    /// (worker, claim UID, namespace, name) of each Kubernetes claim
    /// booked here: where the work came from, for `astraeusctl workers`
    /// (the owner column: `k8s/NAMESPACE`) and the plugin's clean-up.
    #[zbus(out_args("claims"))]
    async fn list_claims(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<Vec<(String, String, String, String)>, BusError> {
        self.lp
            .ask_from(&hdr, conn, |reply| Command::ListClaims { reply })
            .await
    }

    /// (index, UUID, model, bytes, healthy, whole, mig) of each GPU that
    /// takes shares: the memory it offers the Kubernetes cluster now (what
    /// it offers shared work less what the host's own workers take, in
    /// 256 MiB steps; 0 when held whole, kept for a whole request or
    /// unhealthy), and whether a claim may take it whole (no local worker
    /// shares it); then each MIG instance (mig: true), whole only: its
    /// memory while free, else 0. Then why a GPU offers nothing it
    /// otherwise would: "unhealthy", "held-by-host", "draining" or ""; last
    /// the driver's version ("" where none is read).
    /// The plugin reads it again when a Gpu's properties change.
    #[zbus(out_args("offers"))]
    async fn list_cluster_offers(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<Vec<(u32, String, String, u64, bool, bool, bool, String, String)>, BusError> {
        let offers = self
            .lp
            .ask_from(&hdr, conn, |reply| Command::ClusterOffers { reply })
            .await?;
        Ok(offers
            .into_iter()
            .map(|o| {
                let withheld = o.withheld.to_string();
                (
                    o.index,
                    o.uuid,
                    o.model,
                    o.memory_bytes,
                    o.healthy,
                    o.whole,
                    o.mig,
                    withheld,
                    o.driver,
                )
            })
            .collect())
    }

    #[zbus(out_args("worker"))]
    async fn get_worker(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        name: String,
    ) -> Result<OwnedObjectPath, BusError> {
        bounded(&[("name", &name)])?;
        let name = self
            .lp
            .ask_from(&hdr, conn, |reply| Command::GetWorker { name, reply })
            .await??;
        path(worker_path(&name))
    }

    /// (name, state, owner uid, the GPUs column `1 · shared 2.2 GB`, GB used now or -1,
    /// the indices of its GPUs, GB of each it shares or 0)
    #[zbus(out_args("workers"))]
    async fn list_workers(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<Vec<WorkerRow>, BusError> {
        let (turn, _) = self.lp.turn_at(self.objects.turns(), &hdr, conn).await?;
        let rows = self.objects.worker_rows(turn).await;
        let instead = "none lists them in parts: stop workers, or read one with GetWorker";
        super::tree::fits_the_bus(&rows, "the list of workers", instead)?;
        Ok(rows)
    }

    /// Every placed worker, oldest first, with its Enforcement (`held`, or
    /// `promised: why`): one call however many run.
    #[zbus(out_args("enforcement"))]
    async fn list_enforcement(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<Vec<(String, String)>, BusError> {
        let (turn, _) = self.lp.turn_at(self.objects.turns(), &hdr, conn).await?;
        let rows = self.objects.enforcement(turn).await;
        let instead = "none lists them in parts: read one's Enforcement";
        super::tree::fits_the_bus(&rows, "the list of enforcement", instead)?;
        Ok(rows)
    }

    /// Every pending worker, oldest first, with why it waits: one call
    /// however many wait (what `astraeusctl workers` shows).
    #[zbus(out_args("pending"))]
    async fn list_pending(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<Vec<(String, Vec<String>)>, BusError> {
        let (turn, _) = self.lp.turn_at(self.objects.turns(), &hdr, conn).await?;
        let pending = self.objects.pending(turn).await;
        let instead = "none lists them in parts: read one's PendingReasons";
        super::tree::fits_the_bus(&pending, "the list of waiting workers", instead)?;
        Ok(pending)
    }

    /// Workers that ended at or after `since_ms` (epoch ms), newest first,
    /// at most `limit` (1 to 10,000): (name, owner uid, the GPUs column,
    /// GPU indices, GB shared on each or 0, submitted, placed (0: never) and
    /// ended in epoch ms, exit status or -1, how it ended).
    #[zbus(out_args("workers"))]
    async fn list_ended_ms(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        since_ms: i64,
        limit: u32,
    ) -> Result<Vec<EndedRow>, BusError> {
        pairs::ended(&self.lp, &hdr, conn, since_ms, limit).await
    }

    /// ListEndedMs with `since` in epoch seconds; kept for one release.
    #[zbus(out_args("workers"))]
    async fn list_ended(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        since: i64,
        limit: u32,
    ) -> Result<Vec<EndedRow>, BusError> {
        pairs::ended(&self.lp, &hdr, conn, since.saturating_mul(1000), limit).await
    }

    /// (index, uuid, model, mode, total GB, offered GB, held outside GB, taken GB,
    /// warning, the whole request it drains for, health: "ok" or why not)
    #[zbus(out_args("gpus"))]
    async fn list_gpus(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<Vec<GpuRow>, BusError> {
        self.lp
            .ask_from(&hdr, conn, |reply| Command::ListGpus { reply })
            .await
    }

    /// The sharers of one GPU with their GB, and the seed's summary line.
    #[zbus(out_args("sharers", "summary"))]
    async fn list_sharers(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        gpu: u32,
    ) -> Result<(Vec<Sharer>, String), BusError> {
        let s = self
            .lp
            .ask_from(&hdr, conn, |reply| Command::ListSharers { gpu, reply })
            .await??;
        Ok((s.sharers, s.summary))
    }

    /// A dry run: where the spec would go now, or every reason it would wait.
    #[zbus(out_args("fits", "gpus", "reasons"))]
    async fn why_not(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        spec: String,
    ) -> Result<(bool, Vec<u32>, Vec<String>), BusError> {
        bounded(&[("request", &spec)])?;
        let w = self
            .lp
            .ask_from(&hdr, conn, |reply| Command::WhyNot { spec, reply })
            .await??;
        Ok((w.fits, w.gpus, w.reasons))
    }

    /// Sets a template's scheduled actions (our JSON list, or OpenNebula's
    /// SCHED_ACTION text or JSON as `onevm show` prints it; `[]` removes them).
    /// Atomic: a refused schedule leaves the old one in place. Root only.
    async fn set_schedule(
        &self,
        template: String,
        actions: String,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(), BusError> {
        bounded(&[("template", &template), ("actions", &actions)])?;
        Ok(self
            .lp
            .ask_as(&hdr, conn, |caller, reply| Command::SetSchedule {
                template,
                actions,
                caller,
                reply,
            })
            .await??)
    }

    /// SetSchedule's dry run (root only): the next ten slices (as
    /// ListSlicesMs') with the template's actions replaced, and notes on
    /// listed days that do not occur; refused exactly as SetSchedule would
    /// be; nothing is saved.
    #[zbus(out_args("slices", "notes"))]
    async fn preview_schedule_ms(
        &self,
        template: String,
        actions: String,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(Vec<SliceRow>, Vec<String>), BusError> {
        pairs::preview(&self.lp, &hdr, conn, template, actions).await
    }

    /// PreviewScheduleMs in epoch seconds; kept for one release.
    #[zbus(out_args("slices", "notes"))]
    async fn preview_schedule(
        &self,
        template: String,
        actions: String,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(Vec<seconds::SliceRow>, Vec<String>), BusError> {
        let (rows, notes) = pairs::preview(&self.lp, &hdr, conn, template, actions).await?;
        Ok((in_seconds(rows), notes))
    }

    /// A template's scheduled actions as JSON (+N resolved to epoch seconds).
    #[zbus(out_args("actions"))]
    async fn get_schedule(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        template: String,
    ) -> Result<String, BusError> {
        bounded(&[("template", &template)])?;
        Ok(self
            .lp
            .ask_from(&hdr, conn, |reply| Command::GetSchedule { template, reply })
            .await??)
    }

    /// Who owns the GPU baseboard in [from_ms, to_ms) (epoch ms): (template,
    /// start, end (epoch ms), ends by: poweroff | poweroff-hard |
    /// handoff:<template> | open)
    #[zbus(out_args("slices"))]
    async fn list_slices_ms(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<Vec<SliceRow>, BusError> {
        pairs::slices(&self.lp, &hdr, conn, Window::checked_ms(from_ms, to_ms)?).await
    }

    /// ListSlicesMs in epoch seconds; kept for one release.
    #[zbus(out_args("slices"))]
    async fn list_slices(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        from: i64,
        to: i64,
    ) -> Result<Vec<seconds::SliceRow>, BusError> {
        let rows = pairs::slices(&self.lp, &hdr, conn, Window::checked(from, to)?).await?;
        Ok(in_seconds(rows))
    }

    /// The next `count` slices (1 to 1000) from now on, however far away
    /// (the calendar's whole cycle is walked): as ListSlicesMs' rows. Fewer
    /// when the schedules hold fewer; none when no schedule is set or all
    /// have ended.
    #[zbus(out_args("slices"))]
    async fn list_next_slices_ms(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        count: u32,
    ) -> Result<Vec<SliceRow>, BusError> {
        pairs::next_slices(&self.lp, &hdr, conn, count).await
    }

    /// ListNextSlicesMs in epoch seconds; kept for one release.
    #[zbus(out_args("slices"))]
    async fn list_next_slices(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        count: u32,
    ) -> Result<Vec<seconds::SliceRow>, BusError> {
        Ok(in_seconds(
            pairs::next_slices(&self.lp, &hdr, conn, count).await?,
        ))
    }

    /// What the slice preview must say besides the slices in [from_ms,
    /// to_ms) (epoch ms): listed days that do not occur (day 31 in a 30-day
    /// month, day 365 outside leap years).
    #[zbus(out_args("notes"))]
    async fn list_slice_notes_ms(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<Vec<String>, BusError> {
        pairs::notes(&self.lp, &hdr, conn, Window::checked_ms(from_ms, to_ms)?).await
    }

    /// ListSliceNotesMs with its window in epoch seconds; kept for one release.
    #[zbus(out_args("notes"))]
    async fn list_slice_notes(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        from: i64,
        to: i64,
    ) -> Result<Vec<String>, BusError> {
        pairs::notes(&self.lp, &hdr, conn, Window::checked(from, to)?).await
    }

    /// Who used how much of each GPU in [from_ms, to_ms) (epoch ms), grouped
    /// by worker, owner, gpu or user: (key, kind: worker | slice | outside |
    /// idle | downtime, gpu uuid or "" when merged, GPU-milliseconds,
    /// millijoules, busy GPU-milliseconds or -1 when not measured). A shared
    /// GPU counts for each sharer by its share of the GPU's memory; per GPU
    /// the rows add up to the wall-clock time.
    #[zbus(out_args("rows"))]
    async fn usage_report_ms(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        from_ms: i64,
        to_ms: i64,
        group_by: String,
    ) -> Result<UsageRows, BusError> {
        pairs::usage(&self.lp, &hdr, conn, (from_ms, to_ms), 1, group_by)
            .await
            .map(UsageRows)
    }

    /// UsageReportMs with its window in epoch seconds; kept for one release.
    #[zbus(out_args("rows"))]
    async fn usage_report(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        from: i64,
        to: i64,
        group_by: String,
    ) -> Result<UsageRows, BusError> {
        pairs::usage(&self.lp, &hdr, conn, (from, to), 1000, group_by)
            .await
            .map(UsageRows)
    }

    /// Defines a time-slicing template and its persistent VM (JSON). Root only.
    #[zbus(out_args("template"))]
    async fn create_template(
        &self,
        spec: String,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<OwnedObjectPath, BusError> {
        bounded(&[("request", &spec)])?;
        let caller = self.lp.caller(&hdr, conn).await?;
        let name = self
            .lp
            .ask_for(&caller, &hdr, |reply| Command::CreateTemplate {
                spec,
                caller,
                reply,
            })
            .await??;
        path(template_path(&name))
    }

    /// Removes a template whose VM is off (its libvirt domain is kept). Root only.
    async fn remove_template(
        &self,
        name: String,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(), BusError> {
        bounded(&[("name", &name)])?;
        Ok(self
            .lp
            .ask_as(&hdr, conn, |caller, reply| Command::RemoveTemplate {
                name,
                caller,
                reply,
            })
            .await??)
    }

    /// (name, user, domain, state) of every template.
    #[zbus(out_args("templates"))]
    async fn list_templates(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<Vec<TemplateRow>, BusError> {
        self.lp
            .ask_from(&hdr, conn, |reply| Command::ListTemplates { reply })
            .await
    }

    /// Boots a template's VM now. Refused while another holds the GPU
    /// baseboard (the holder is named) unless `as_handoff`. Root only.
    async fn resume(
        &self,
        template: String,
        as_handoff: bool,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(), BusError> {
        bounded(&[("template", &template)])?;
        Ok(self
            .lp
            .ask_as(&hdr, conn, |caller, reply| Command::Resume {
                template,
                as_handoff,
                caller,
                reply,
            })
            .await??)
    }

    /// Powers a template's VM off (ACPI, forced after the timeout; at once
    /// when `hard`). Works at any time. Root only.
    async fn power_off(
        &self,
        template: String,
        hard: bool,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(), BusError> {
        bounded(&[("template", &template)])?;
        Ok(self
            .lp
            .ask_as(&hdr, conn, |caller, reply| Command::PowerOff {
                template,
                hard,
                caller,
                reply,
            })
            .await??)
    }

    /// Slices in [from_ms, to_ms) (epoch ms) of one template ("" = all):
    /// (template, user, start, end (epoch ms; 0 = still on), handoff dead
    /// time ms, start-to-ready ms (-1 = none), CPU average and peak %, GPU
    /// average and peak %, GPU memory peak GB (-1 = not reported, never 0),
    /// GPU energy mJ (-1 = not reported), libvirt's error when it failed).
    /// The GPU figures come from inside the guest (docs/time-slicing.md).
    #[zbus(out_args("slices"))]
    async fn slice_report_ms(
        &self,
        template: String,
        from_ms: i64,
        to_ms: i64,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<Vec<SliceReportRow>, BusError> {
        bounded(&[("template", &template)])?;
        let window = Window::checked_ms(from_ms, to_ms)?;
        pairs::slice_rows(&self.lp, &hdr, conn, template, window).await
    }

    /// SliceReportMs in epoch seconds and its energy in Wh (-1 = not
    /// reported); kept for one release.
    #[zbus(out_args("slices"))]
    async fn slice_report(
        &self,
        template: String,
        from: i64,
        to: i64,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<Vec<seconds::SliceReportRow>, BusError> {
        bounded(&[("template", &template)])?;
        let window = Window::checked(from, to)?;
        let rows = pairs::slice_rows(&self.lp, &hdr, conn, template, window).await?;
        Ok(in_seconds(rows))
    }

    /// Builds a template's read-only weights disk (an ext4 image) from a
    /// directory while its VM is off. Returns at once; WeightsProgress and
    /// WeightsStaged follow. The same content again changes nothing. Root only.
    async fn stage_weights(
        &self,
        template: String,
        source: String,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(), BusError> {
        bounded(&[("template", &template), ("source", &source)])?;
        Ok(self
            .lp
            .ask_as(&hdr, conn, |caller, reply| Command::StageWeights {
                template,
                source,
                caller,
                reply,
            })
            .await??)
    }

    /// Staging progress: phase "checksum" (fraction of bytes read) or "image".
    #[zbus(signal)]
    pub async fn weights_progress(
        emitter: &SignalEmitter<'_>,
        template: &str,
        phase: &str,
        fraction: f64,
    ) -> zbus::Result<()>;

    /// Staging ended: the content checksum, whether the disk changed, or the error.
    #[zbus(signal)]
    pub async fn weights_staged(
        emitter: &SignalEmitter<'_>,
        template: &str,
        checksum: &str,
        changed: bool,
        error: &str,
    ) -> zbus::Result<()>;

    /// One step of a handoff, as the ledger records it: power-off-asked,
    /// forced, stopped, release-confirmed, start-issued, started, ready,
    /// start-failed, failed, target-gone, requested (who comes next
    /// changed, nothing else yet), destroyed (a template VM on beside the
    /// one holding the baseboard, destroyed; not a step of the handoff);
    /// `from`/`to` are templates ("" when none). For `forced` and
    /// `destroyed`, `from` is the VM destroyed and `to` who holds the
    /// baseboard once it settles.
    #[zbus(signal)]
    pub async fn handoff_step(
        emitter: &SignalEmitter<'_>,
        step: &str,
        from: &str,
        to: &str,
        at_ms: i64,
        detail: &str,
    ) -> zbus::Result<()>;

    /// A slice begins (its VM is being started); `dead_time_ms`: release
    /// confirmed → start issued in a handoff, -1 otherwise.
    #[zbus(signal)]
    pub async fn slice_started(
        emitter: &SignalEmitter<'_>,
        template: &str,
        at_ms: i64,
        dead_time_ms: i64,
    ) -> zbus::Result<()>;

    /// A slice ends; `error` is libvirt's when it never came up.
    #[zbus(signal)]
    pub async fn slice_ended(
        emitter: &SignalEmitter<'_>,
        template: &str,
        at_ms: i64,
        error: &str,
    ) -> zbus::Result<()>;

    #[zbus(signal)]
    pub async fn worker_new(
        emitter: &SignalEmitter<'_>,
        name: &str,
        worker: OwnedObjectPath,
    ) -> zbus::Result<()>;

    #[zbus(signal)]
    pub async fn worker_removed(
        emitter: &SignalEmitter<'_>,
        name: &str,
        worker: OwnedObjectPath,
    ) -> zbus::Result<()>;

    #[zbus(property)]
    async fn machine(&self) -> String {
        self.view.read().machine.clone()
    }
    /// The zone schedules and slices are computed in.
    #[zbus(property(emits_changed_signal = "const"))]
    async fn time_zone(&self) -> String {
        self.view.read().time_zone.clone()
    }
    /// Where this daemon serves its machine page (`http://127.0.0.1:8089/`),
    /// or "" when `[http] listen` is off: what the desktop entry opens.
    #[zbus(property(emits_changed_signal = "const"))]
    async fn page_url(&self) -> String {
        self.page.clone()
    }
    /// The engine container workers run through, and its socket ("Docker
    /// at /var/run/docker.sock"), as `runtime.containers` chose it at start.
    #[zbus(property(emits_changed_signal = "const"))]
    async fn container_runtime(&self) -> String {
        self.containers.clone()
    }
    #[zbus(property)]
    async fn wsl(&self) -> bool {
        self.view.read().wsl
    }
    #[zbus(property)]
    async fn workers_running(&self) -> u32 {
        self.view.read().running
    }
    #[zbus(property)]
    async fn workers_pending(&self) -> u32 {
        self.view.read().pending
    }
}

impl Manager {
    /// What changed from `old` to `new`, as one PropertiesChanged to send.
    pub fn delta(old: &ManagerView, new: &ManagerView) -> Delta {
        let new = new.clone();
        let mut d = Delta::new("org.astraeus.Node1.Manager");
        d.set(old.machine != new.machine, "Machine", new.machine);
        d.set(old.wsl != new.wsl, "Wsl", new.wsl);
        d.set(old.running != new.running, "WorkersRunning", new.running);
        d.set(old.pending != new.pending, "WorkersPending", new.pending);
        d
    }
}

/// A report's rows as UsageReport sends them, `a(sssttx)`: each
/// serialised as the [`UsageRow`] it stands for, borrowed from the report's
/// own row (a year's report is tens of thousands; copying them into
/// UsageRows first cost an allocation each).
pub struct UsageRows(Vec<crate::report::Row>);

impl zbus::Type for UsageRows {
    const SIGNATURE: &'static zbus::Signature = <Vec<UsageRow> as zbus::Type>::SIGNATURE;
}

impl serde::Serialize for UsageRows {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(|r| {
            UsageRowRef {
                key: &r.key,
                kind: r.kind.as_str(),
                gpu_uuid: &r.gpu_uuid,
                gpu_ms: r.gpu_ms,
                energy_mj: r.energy_mj,
                busy_gpu_ms: r
                    .busy_gpu_ms
                    .map_or(-1, |b| i64::try_from(b).unwrap_or(i64::MAX)),
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Row, RowKind};

    /// The rows go out as the documented UsageRows would (zbus's own
    /// serialisation of them is the oracle), and are counted as they go.
    #[test]
    fn report_rows_are_sent_as_the_usage_rows_they_stand_for() {
        let rows = vec![
            Row {
                key: "stt".into(),
                kind: RowKind::Worker,
                gpu_uuid: "GPU-1".into(),
                gpu_ms: 3_600_000,
                energy_mj: 7,
                busy_gpu_ms: Some(12),
            },
            Row {
                key: "idle".into(),
                kind: RowKind::Idle,
                gpu_uuid: String::new(),
                gpu_ms: 1,
                energy_mj: 0,
                busy_gpu_ms: None,
            },
        ];
        let documented: Vec<UsageRow> = rows
            .iter()
            .map(|r| UsageRow {
                key: r.key.clone(),
                kind: r.kind.as_str().into(),
                gpu_uuid: r.gpu_uuid.clone(),
                gpu_ms: r.gpu_ms,
                energy_mj: r.energy_mj,
                busy_gpu_ms: r.busy_gpu_ms.map_or(-1, |b| b as i64),
            })
            .collect();
        let ctxt = zbus::wire::serialized::Context::new(zbus::wire::LE, 0);
        let sent = zbus::wire::to_bytes(ctxt, &UsageRows(rows.clone())).unwrap();
        let oracle = zbus::wire::to_bytes(ctxt, &documented).unwrap();
        assert_eq!(sent.bytes(), oracle.bytes());
        let texts = rows
            .iter()
            .map(|r| [r.key.as_str(), r.kind.as_str(), r.gpu_uuid.as_str()]);
        assert_eq!(UsageRow::wire_size(texts), oracle.len());
        assert_eq!(
            <UsageRows as zbus::Type>::SIGNATURE,
            <Vec<UsageRow> as zbus::Type>::SIGNATURE
        );
    }
}
