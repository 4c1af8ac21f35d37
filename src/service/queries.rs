//! Read-only answers: lists, the dry run, reports and the page's snapshot.
//! Nothing here changes the node or waits on anything but the ledger.

use super::Service;
use crate::command::{Reply, Window};
use crate::error::{Error, Result};
use crate::time::EpochMs;
use crate::views::{self, RotationView, SlicingView};
use crate::wire::{EndedRow, GpuRow, Sharers, SliceReportRow, SliceRow, TemplateRow, WhyNot};

/// One slice as ListSlicesMs and PreviewScheduleMs send it (the first
/// methods' rows are made from it by the adaptor: `wire::seconds`).
pub(super) fn slice_row(s: crate::rotation::Slice) -> SliceRow {
    SliceRow {
        ends_by: s.ends_by.describe(),
        template: s.template,
        start_ms: s.start.as_millisecond(),
        end_ms: s.end.as_millisecond(),
    }
}

impl Service {
    pub(super) fn get_worker(&self, name: &str) -> Result<String> {
        // A name no worker could have is told as such, and never echoed.
        crate::request::validate_name("name", name)?;
        match self.node.worker(name) {
            Some(w) => Ok(w.name().to_string()),
            None => Err(Error::NotFound(format!("no live worker named {name}"))),
        }
    }

    /// Workers that ended since then, newest first (at most `limit`, up
    /// to 10,000 rows of the ledger: read off the loop).
    pub(super) fn list_ended(
        &self,
        since_ms: i64,
        limit: u32,
        reply: Reply<Result<Vec<EndedRow>>>,
    ) {
        let read = move |store: &crate::store::Store| {
            // A test holds a listing here, as a long history would.
            crate::failpoint::hit("ended.list");
            let rows = store.ended_workers(since_ms, limit)?;
            Ok((rows.into_iter().map(ended_row).collect(), ()))
        };
        self.read_off_the_loop("listing of ended workers", read, reply);
    }

    pub(super) fn list_gpus(&self) -> Vec<GpuRow> {
        self.node
            .machine()
            .gpus
            .iter()
            .map(|g| views::gpu_row(views::gpu_view(&self.node, g)))
            .collect()
    }

    pub(super) fn list_sharers(&self, gpu: u32) -> Result<Sharers> {
        match self.node.machine().gpus.iter().find(|g| g.index == gpu) {
            Some(g) => Ok(views::sharers(views::gpu_view(&self.node, g))),
            None => Err(Error::NotFound(format!(
                "gpu: {} has no GPU {gpu}; it has {}",
                self.node.machine().name,
                self.describe_indexes()
            ))),
        }
    }

    pub(super) fn why_not(&mut self, spec: &str) -> Result<WhyNot> {
        self.node.why_not(spec).map(|v| match v {
            Ok(grants) => WhyNot {
                fits: true,
                gpus: grants.iter().map(|g| g.gpu_index).collect(),
                reasons: Vec::new(),
            },
            Err(reasons) => WhyNot {
                fits: false,
                gpus: Vec::new(),
                reasons,
            },
        })
    }

    /// The usage report over the window, as UsageReport rows. The live
    /// run's facts are taken here (the arguments were checked by the
    /// adaptor, before the caller's turn); the ledger is read
    /// and the report computed on the report reader, away from the loop (a
    /// year of rows takes seconds), one report at a time.
    pub(super) fn usage_report(
        &self,
        window: Window,
        by: crate::report::GroupBy,
        reply: Reply<Result<Vec<crate::report::Row>>>,
    ) {
        let (from, to) = (window.from().as_millisecond(), window.to().as_millisecond());
        let now = EpochMs::now().as_i64();
        let (current, gpus) = self
            .node
            .report_facts(now, self.sampler.open_intervals(now));
        let report = move |store: &crate::store::Store| {
            // A test holds a report here, as a year of rows would.
            crate::failpoint::hit("usage.report");
            store.usage_report(from, to, by, current, gpus, crate::auth::user_name_or_uid)
        };
        self.read_off_the_loop("usage report", report, reply);
    }

    /// Runs `read` on the ledger's second connection, on a thread of the
    /// blocking pool, and replies from there: a report's cost grows with the
    /// ledger's rows (and the window a caller names), and the loop must not
    /// wait on it. `read` answers with the reply and what it was worked out
    /// from, which is freed after the reply is sent (a year's report's facts
    /// took milliseconds to free, ahead of its reply).
    fn read_off_the_loop<T: Send + 'static, Spent: Send + 'static>(
        &self,
        what: &'static str,
        read: impl FnOnce(&crate::store::Store) -> Result<(T, Spent)> + Send + 'static,
        reply: Reply<Result<T>>,
    ) {
        let Some(reader) = self.report_reader.clone() else {
            // A ledger in memory (tests) has no second connection.
            let _ = reply.send(read(self.node.store()).map(|(answer, _)| answer));
            return;
        };
        tokio::spawn(async move {
            let reader = reader.lock_owned().await;
            tokio::task::spawn_blocking(move || {
                let read = std::panic::AssertUnwindSafe(|| read(&reader));
                let (answer, spent) = match std::panic::catch_unwind(read) {
                    Ok(Ok((answer, spent))) => (Ok(answer), Some(spent)),
                    Ok(Err(e)) => (Err(e), None),
                    Err(_) => (Err(Error::Backend(format!("the {what} failed"))), None),
                };
                let _ = reply.send(answer);
                drop(spent);
            });
        });
    }

    pub(super) fn page_snapshot(&self) -> views::PageSnapshot {
        let rotation = RotationView {
            templates: self.node.rotation(),
            tz: self.slice_rules.tz.clone(),
        };
        let slicing: SlicingView = self.slicing.as_ref().map(|s| s.view()).unwrap_or_default();
        views::page_snapshot(&self.node, &rotation, &slicing, jiff::Timestamp::now())
    }

    pub(super) fn get_schedule(&self, template: &str) -> Result<String> {
        match self.node.schedule(template) {
            Some(actions) => Ok(serde_json::to_string(actions).expect("actions serialize")),
            None => Err(Error::NotFound(format!(
                "template {} has no schedule",
                crate::text::printable(template)
            ))),
        }
    }

    pub(super) fn list_slices(&self, window: Window) -> Vec<SliceRow> {
        let (from, to) = (window.from(), window.to());
        self.node
            .slices(from, to, &self.slice_rules.tz)
            .into_iter()
            .map(slice_row)
            .collect()
    }

    pub(super) fn list_next_slices(&self, count: u32) -> Vec<SliceRow> {
        let now = jiff::Timestamp::now();
        self.node
            .next_slices(now, count as usize, &self.slice_rules.tz)
            .into_iter()
            .map(slice_row)
            .collect()
    }

    pub(super) fn list_slice_notes(&self, window: Window) -> Vec<String> {
        self.node
            .slice_notes(window.from(), window.to(), &self.slice_rules.tz)
    }

    pub(super) fn list_templates(&self) -> Vec<TemplateRow> {
        let Some(s) = &self.slicing else {
            return Vec::new();
        };
        s.engine
            .templates()
            .values()
            .map(|d| TemplateRow {
                name: d.template.name.clone(),
                user: d.user(),
                domain: d.domain.clone(),
                state: s
                    .engine
                    .state()
                    .state_of(&d.template.name)
                    .as_str()
                    .to_string(),
            })
            .collect()
    }

    /// The slices of a window from the ledger, off the loop: read by their
    /// end, an old window reads every slice since (store/slicing.rs).
    pub(super) fn slice_report(
        &self,
        template: String,
        window: Window,
        reply: Reply<Result<Vec<SliceReportRow>>>,
    ) {
        let (from, to) = (window.from().as_millisecond(), window.to().as_millisecond());
        let report = move |store: &crate::store::Store| {
            // A test holds a report here, as years of slices would.
            crate::failpoint::hit("slice.report");
            let rows = store.slices(from, to)?;
            let rows = rows
                .into_iter()
                .filter(|r| template.is_empty() || r.template == template)
                .map(slice_report_row)
                .collect();
            Ok((rows, ()))
        };
        self.read_off_the_loop("slice report", report, reply);
    }

    fn describe_indexes(&self) -> String {
        let idx: Vec<String> = self
            .node
            .machine()
            .gpus
            .iter()
            .map(|g| g.index.to_string())
            .collect();
        if idx.is_empty() {
            "none".into()
        } else {
            idx.join(", ")
        }
    }
}

fn slice_report_row(r: crate::store::SliceRecord) -> SliceReportRow {
    let n = |v: Option<f64>| v.unwrap_or(-1.0);
    let m = &r.measures;
    SliceReportRow {
        template: r.template,
        user: r.user,
        start_ms: r.start_ms,
        end_ms: r.end_ms.unwrap_or(0),
        dead_time_ms: r.dead_time_ms.unwrap_or(-1),
        start_to_ready_ms: r.start_to_ready_ms.unwrap_or(-1),
        cpu_avg_pct: n(m.cpu_avg_pct),
        cpu_peak_pct: n(m.cpu_peak_pct),
        gpu_avg_pct: n(m.gpu_avg_pct),
        gpu_peak_pct: n(m.gpu_peak_pct),
        gpu_memory_peak_gb: m
            .gpu_memory_peak_bytes
            .map_or(-1.0, |b| b as f64 / crate::quantity::GB_BYTES as f64),
        gpu_energy_mj: m.energy_j.map_or(-1, |j| (j * 1000.0).round() as i64),
        error: r.error.unwrap_or_default(),
    }
}

fn ended_row(w: crate::store::EndedWorker) -> EndedRow {
    EndedRow {
        gpus: crate::placement::gpus_column(&w.grants),
        gpu_indices: w.grants.iter().map(|g| g.gpu_index).collect(),
        gpu_shared_gb: w
            .grants
            .first()
            .and_then(|g| g.share)
            .map_or(0.0, crate::quantity::Amount::as_f64),
        name: w.name,
        owner_uid: w.owner_uid,
        submitted_ms: w.submitted_ms,
        started_ms: w.started_ms.unwrap_or(0),
        ended_ms: w.ended_ms,
        exit_status: w.exit_status.unwrap_or(-1),
        end_reason: w.end_reason,
    }
}
