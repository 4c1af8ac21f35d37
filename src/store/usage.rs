//! The ledger's usage records: the daemon's runs (its up-time), measured
//! intervals per GPU, and the inputs of the usage report.

use super::{exec, Store};
use crate::error::Result;
use crate::time::EpochMs;
use rusqlite::{params, OptionalExtension};

// What overlaps a window [?1, ?2). The loop reads a minute's worth each time
// a sampling interval closes: holds and GPU intervals are indexed by their
// end (schema migration 12; an open hold's as the largest there is, the
// index's expression, which a query must spell the same to use it), so that
// read costs what the window holds, not what the ledger has kept (see the
// test below).
const HOLDS_IN: &str = "SELECT w.name, w.owner_uid, w.spec, h.gpu_uuid, h.gpu_index,
        h.share_hundredths, h.from_ms, h.to_ms, w.id
    FROM holds h INDEXED BY holds_end JOIN workers w ON w.id = h.worker_id
    WHERE h.from_ms < ?2 AND coalesce(h.to_ms, 9223372036854775807) > ?1
    ORDER BY h.from_ms, w.id";
// Those begun before ?3 that end in [?1, ?4], by their start (migration 18):
// the holds before a report's rolled-up days that the end index would
// find only among every hold those days stand for.
const HOLDS_BEFORE: &str = "SELECT w.name, w.owner_uid, w.spec, h.gpu_uuid, h.gpu_index,
        h.share_hundredths, h.from_ms, h.to_ms, w.id
    FROM holds h INDEXED BY holds_start JOIN workers w ON w.id = h.worker_id
    WHERE h.from_ms < ?3 AND h.from_ms < ?2 AND coalesce(h.to_ms, 9223372036854775807) > ?1
      AND coalesce(h.to_ms, 9223372036854775807) <= ?4
    ORDER BY h.from_ms, w.id";
const INTERVALS_IN: &str = "SELECT gpu_uuid, from_ms, to_ms, energy_mj, utilization_pct,
        outside_bytes, total_bytes
    FROM gpu_intervals WHERE from_ms < ?2 AND to_ms > ?1 ORDER BY from_ms";
// One GPU's, by the primary key (GPU, start): what a rollup of a day reads.
// Folded days' intervals are gone, so the walk starts near the day.
const GPU_INTERVALS_IN: &str = "SELECT gpu_uuid, from_ms, to_ms, energy_mj, utilization_pct,
        outside_bytes, total_bytes
    FROM gpu_intervals WHERE gpu_uuid = ?3 AND from_ms < ?2 AND to_ms > ?1 ORDER BY from_ms";
// By the runs' last sign of life (store/schema.rs, migration 14): SQLite
// would otherwise walk the primary key, every run begun before the window.
const RUNS_IN: &str = "SELECT started_ms, alive_ms FROM daemon_runs INDEXED BY daemon_runs_alive
    WHERE started_ms < ?2 AND alive_ms > ?1 ORDER BY started_ms";

/// Whether a worker's request launches something (has a top-level `run`):
/// such a workload keeps running, and is billed, while the daemon is down.
/// A reservation named "run" is not one (the text alone said it was).
fn launches(spec: &str) -> bool {
    #[derive(serde::Deserialize)]
    struct Top {
        run: Option<serde::de::IgnoredAny>,
    }
    // Most reservations say "run" nowhere: no parse for those.
    spec.contains("\"run\"") && serde_json::from_str::<Top>(spec).is_ok_and(|t| t.run.is_some())
}

/// One worker's hold on one GPU, as the usage report needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HoldRow {
    pub worker: String,
    pub owner_uid: u32,
    /// A Kubernetes claim's namespace: its owner in the report (`k8s/NS`).
    pub claim_namespace: Option<String>,
    /// It has a `run` (its workload keeps running while the daemon is down).
    pub launched: bool,
    pub gpu_uuid: String,
    pub gpu_index: u32,
    pub share_hundredths: Option<u64>,
    pub from_ms: i64,
    pub to_ms: Option<i64>,
}

/// The ledger's facts for one usage report.
#[derive(Clone, Debug, Default)]
pub struct UsageInputs {
    pub holds: Vec<HoldRow>,
    pub measured: Vec<crate::report::Measured>,
    pub up: Vec<crate::report::Up>,
    /// Each GPU's size as last measured, by UUID (for GPUs no longer present).
    pub totals: std::collections::HashMap<String, u64>,
}

/// The daemon's current run, for a report that reaches into it: up from
/// `started_ms` until `now_ms`, with what it measured since its last
/// interval closed. Owned: taken on the loop, used wherever the report runs.
#[derive(Clone, Debug)]
pub struct CurrentRun {
    pub started_ms: i64,
    pub now_ms: i64,
    pub open: Vec<crate::usage::Interval>,
}

impl Store {
    /// What the usage report of [from_ms, to_ms) is computed from.
    pub fn usage_inputs(&self, from_ms: i64, to_ms: i64) -> Result<UsageInputs> {
        self.usage_inputs_of(from_ms, to_ms, None, &Folded::default())
    }

    /// [`Store::usage_inputs`], of one GPU when `gpu` names it, without
    /// the holds `folded` stands for.
    fn usage_inputs_of(
        &self,
        from_ms: i64,
        to_ms: i64,
        gpu: Option<&str>,
        folded: &Folded<'_>,
    ) -> Result<UsageInputs> {
        let mut out = UsageInputs::default();
        let mut stmt = match gpu {
            Some(_) => self.conn.prepare_cached(GPU_INTERVALS_IN)?,
            None => self.conn.prepare_cached(INTERVALS_IN)?,
        };
        let args = |r: &rusqlite::Row<'_>| {
            Ok((
                crate::report::Measured {
                    gpu_uuid: r.get(0)?,
                    from_ms: r.get(1)?,
                    to_ms: r.get(2)?,
                    energy_mj: r.get::<_, i64>(3)? as u64,
                    utilization_pct: r.get(4)?,
                    outside_bytes: r.get::<_, i64>(5)? as u64,
                },
                r.get::<_, i64>(6)? as u64,
            ))
        };
        let rows = match gpu {
            Some(g) => stmt.query_map(params![from_ms, to_ms, g], args)?,
            None => stmt.query_map(params![from_ms, to_ms], args)?,
        };
        for row in rows {
            let (m, total) = row?;
            if total > 0 && out.totals.get(&m.gpu_uuid) != Some(&total) {
                out.totals.insert(m.gpu_uuid.clone(), total);
            }
            out.measured.push(m);
        }
        // Holds that end by `settled`, or begin at or after `before`, lie
        // inside their GPU's span of rolled-up days, when every GPU the
        // report may count has one (those measured here among them): the
        // days stand for them, and the indexes on holds' ends and starts
        // pass them by unread (a year at 100 workers: 36,500 holds, whose
        // read took 9 ms of a 75 ms report).
        let mut gpus: Vec<&str> = folded.counted.clone();
        gpus.extend(out.measured.iter().map(|m| m.gpu_uuid.as_str()));
        gpus.sort_unstable();
        gpus.dedup();
        let spans: Option<Vec<&(String, i64, i64)>> = gpus
            .iter()
            .map(|g| folded.spans.iter().find(|(u, _, _)| u == g))
            .collect();
        let (settled, before) = match spans {
            Some(spans) if !spans.is_empty() => (
                spans
                    .iter()
                    .map(|s| s.2)
                    .min()
                    .unwrap_or(from_ms)
                    .max(from_ms),
                spans.iter().map(|s| s.1).max().unwrap_or(from_ms),
            ),
            _ => (from_ms, from_ms),
        };
        let mut skip = String::new();
        let mut skip_args: Vec<&dyn rusqlite::ToSql> = Vec::new();
        for (uuid, from, to) in &folded.spans {
            let n = 4 + skip_args.len();
            skip.push_str(&format!(
                " AND NOT (h.gpu_uuid = ?{} AND h.from_ms >= ?{} \
                 AND coalesce(h.to_ms, 9223372036854775807) <= ?{})",
                n + 1,
                n + 2,
                n + 3
            ));
            skip_args.extend([uuid as &dyn rusqlite::ToSql, from, to]);
        }
        let hold = |r: &rusqlite::Row<'_>| {
            Ok((
                HoldRow {
                    worker: r.get(0)?,
                    owner_uid: r.get(1)?,
                    claim_namespace: crate::claim::namespace_in_spec(&r.get::<_, String>(2)?),
                    launched: launches(&r.get::<_, String>(2)?),
                    gpu_uuid: r.get(3)?,
                    gpu_index: r.get(4)?,
                    share_hundredths: r.get::<_, Option<i64>>(5)?.map(|h| h as u64),
                    from_ms: r.get(6)?,
                    to_ms: r.get(7)?,
                },
                r.get::<_, i64>(8)?,
            ))
        };
        let mut holds: Vec<(HoldRow, i64)> = Vec::new();
        let mut queries = vec![HOLDS_IN];
        if before > from_ms {
            queries.push(HOLDS_BEFORE);
        }
        for base in queries {
            // The spans' conditions go before the order; ?3 and ?4 are
            // HOLDS_BEFORE's (bound to every query: unused ones cost nothing).
            let sql = base.replacen(" ORDER BY", &format!("{skip} ORDER BY"), 1);
            let sql = if base == HOLDS_IN && skip.is_empty() {
                // As the loop reads a minute: the statement it keeps.
                HOLDS_IN.to_string()
            } else {
                sql
            };
            let mut stmt = self.conn.prepare_cached(&sql)?;
            let mut args: Vec<&dyn rusqlite::ToSql> = if base == HOLDS_IN {
                vec![&settled, &to_ms]
            } else {
                vec![&from_ms, &to_ms, &before, &settled]
            };
            if !skip.is_empty() {
                if base == HOLDS_IN {
                    // Numbered from ?5: fill ?3 and ?4, which it does not use.
                    args.extend([&before as &dyn rusqlite::ToSql, &settled]);
                }
                args.extend(skip_args.iter().copied());
            }
            let rows = stmt.query_map(args.as_slice(), hold)?;
            for row in rows {
                holds.push(row?);
            }
        }
        holds.sort_by_key(|(h, id)| (h.from_ms, *id));
        out.holds = holds.into_iter().map(|(h, _)| h).collect();
        if let Some(gpu) = gpu {
            out.holds.retain(|h| h.gpu_uuid == gpu);
        }
        let mut stmt = self.conn.prepare_cached(RUNS_IN)?;
        let rows = stmt.query_map(params![from_ms, to_ms], |r| {
            Ok(crate::report::Up {
                from_ms: r.get(0)?,
                to_ms: r.get(1)?,
            })
        })?;
        out.up = rows.collect::<rusqlite::Result<_>>()?;
        Ok(out)
    }

    /// A daemon run begins (its id is its start time).
    pub fn begin_run(&mut self, at: EpochMs) -> Result<i64> {
        let at_ms = at.as_i64();
        self.write(
            "INSERT OR REPLACE INTO daemon_runs (started_ms, alive_ms) VALUES (?1, ?1)",
            params![at_ms],
        )?;
        Ok(at_ms)
    }

    /// The run was alive at `at_ms` (a usage interval closed, or a clean stop).
    pub fn alive(&mut self, run: i64, at: EpochMs) -> Result<()> {
        let at_ms = at.as_i64();
        self.write(
            "UPDATE daemon_runs SET alive_ms = max(alive_ms, ?2) WHERE started_ms = ?1",
            params![run, at_ms],
        )?;
        Ok(())
    }

    /// The last sign of life of the run before `current`.
    pub fn previous_run_end(&self, current: Option<i64>) -> Result<Option<i64>> {
        Ok(self
            .conn
            .query_row(
                "SELECT alive_ms FROM daemon_runs WHERE started_ms < ?1 ORDER BY started_ms DESC LIMIT 1",
                params![current.unwrap_or(i64::MAX)],
                |r| r.get(0),
            )
            .optional()?)
    }

    /// Closed sampling intervals and the run's sign of life, in one transaction.
    pub fn insert_intervals(
        &mut self,
        rows: &[crate::usage::Interval],
        run: Option<i64>,
        at: EpochMs,
    ) -> Result<()> {
        let at_ms = at.as_i64();
        let tx = self.change()?;
        for r in rows {
            exec(
&tx,
                "INSERT OR REPLACE INTO gpu_intervals
                 (gpu_uuid, from_ms, to_ms, energy_mj, utilization_pct, samples, outside_bytes, total_bytes)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    r.gpu_uuid,
                    r.from_ms,
                    r.to_ms,
                    r.energy_mj as i64,
                    r.utilization_pct,
                    r.samples,
                    r.outside_bytes as i64,
                    r.total_bytes as i64
                ],
            )?;
        }
        if let Some(run) = run {
            exec(
                &tx,
                "UPDATE daemon_runs SET alive_ms = max(alive_ms, ?2) WHERE started_ms = ?1",
                params![run, at_ms],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    /// The usage report of [from_ms, to_ms), computed from the ledger (so a
    /// restart loses nothing). `current`: this run and now (it counts as up
    /// until now); `gpus`: the GPUs the machine has now. A window edge
    /// inside a rolled-up day covers that whole day (`report::covered`).
    /// With the rows come the facts they were computed from, for the caller
    /// to free once the rows are on their way: a year's facts are tens of
    /// thousands of rolled-up rows, milliseconds to free.
    pub fn usage_report(
        &self,
        from_ms: i64,
        to_ms: i64,
        by: crate::report::GroupBy,
        current: Option<CurrentRun>,
        gpus: Vec<crate::report::GpuFacts>,
        owner_name: impl Fn(u32) -> String,
    ) -> Result<(Vec<crate::report::Row>, ReportFacts)> {
        // One read transaction: every table as of the same commit.
        let read = self.conn.unchecked_transaction()?;
        let rolled = self.rolled_in(from_ms, to_ms)?;
        let (from, to) = crate::report::covered(from_ms, to_ms, &rolled.days);
        let folded = Folded {
            spans: rolled.spans(),
            counted: (gpus.iter().chain(&rolled.gpus))
                .map(|g| g.uuid.as_str())
                .collect(),
        };
        let mut facts = self.facts_in(from, to, current, gpus.clone(), None, &folded)?;
        drop(folded);
        read.commit()?;
        // GPUs gone now that a rolled-up day shows held: sized as then.
        for g in rolled.gpus {
            let held = rolled.days.iter().any(|d| {
                d.gpu_uuid == g.uuid
                    && d.sums.iter().any(|(b, _)| {
                        matches!(
                            b,
                            crate::report::Base::Worker { .. } | crate::report::Base::Slice { .. }
                        )
                    })
            });
            if held && !facts.gpus.iter().any(|f| f.uuid == g.uuid) {
                facts.gpus.push(g);
            }
        }
        facts.rolled = rolled.days;
        let rows = crate::report::report(from, to, &facts.ledger(), by)?;
        Ok((
            name_owners(rows, by, owner_name),
            ReportFacts { _facts: facts },
        ))
    }

    /// What a report over [from_ms, to_ms) reads besides the rolled-up
    /// days, owned; of the GPU `only` names alone (a rollup's), if it does. Owners are their uids, in decimal: a rolled-up day
    /// keeps them so, and names are looked up once the report is made
    /// (`name_owners`).
    pub(super) fn facts_in(
        &self,
        from_ms: i64,
        to_ms: i64,
        current: Option<CurrentRun>,
        mut gpus: Vec<crate::report::GpuFacts>,
        only: Option<&str>,
        folded: &Folded<'_>,
    ) -> Result<Facts> {
        use crate::report::{GpuFacts, Holding, Up};
        let mut inputs = self.usage_inputs_of(from_ms, to_ms, only, folded)?;
        let live = current.as_ref().map_or(&[][..], |c| &c.open[..]);
        // The report may run after the facts were taken (off the loop):
        // what the loop wrote since then is left out, so that a stretch is
        // not counted both as closed in the ledger and as open here, and
        // nothing after `now_ms` counts.
        if let Some(c) = &current {
            let open_from: std::collections::HashMap<&str, i64> = live
                .iter()
                .map(|i| (i.gpu_uuid.as_str(), i.from_ms))
                .collect();
            inputs.measured.retain(|m| {
                open_from
                    .get(m.gpu_uuid.as_str())
                    .is_none_or(|&f| m.from_ms < f)
            });
            inputs.holds.retain(|h| h.from_ms < c.now_ms);
            for h in &mut inputs.holds {
                if h.to_ms.is_some_and(|t| t > c.now_ms) {
                    h.to_ms = None;
                }
            }
        }
        // What the live daemon measured since its last interval closed.
        inputs
            .measured
            .extend(live.iter().map(|i| crate::report::Measured {
                gpu_uuid: i.gpu_uuid.clone(),
                from_ms: i.from_ms,
                to_ms: i.to_ms,
                energy_mj: i.energy_mj,
                utilization_pct: i.utilization_pct,
                outside_bytes: i.outside_bytes,
            }));
        if let Some(CurrentRun {
            started_ms: run,
            now_ms,
            ..
        }) = current
        {
            inputs.up.retain(|u| u.from_ms != run);
            inputs.up.push(Up {
                from_ms: run,
                to_ms: now_ms,
            });
        }
        // GPUs held in the window but gone now: sized as last measured.
        for h in &inputs.holds {
            if !gpus.iter().any(|g| g.uuid == h.gpu_uuid) {
                if let Some(&total) = inputs.totals.get(&h.gpu_uuid) {
                    gpus.push(GpuFacts {
                        uuid: h.gpu_uuid.clone(),
                        index: h.gpu_index,
                        total_bytes: total,
                    });
                }
            }
        }
        let holds: Vec<Holding> = inputs
            .holds
            .iter()
            .map(|h| Holding {
                worker: h.worker.clone(),
                // A claim's owner is its namespace (the plugin, root, books it).
                owner: h
                    .claim_namespace
                    .as_deref()
                    .map_or_else(|| h.owner_uid.to_string(), crate::claim::owner_label),
                gpu_uuid: h.gpu_uuid.clone(),
                share_bytes: h
                    .share_hundredths
                    .map(|s| crate::quantity::Amount::from_hundredths(s).bytes()),
                from_ms: h.from_ms,
                to_ms: h.to_ms,
                runs_while_down: h.launched,
            })
            .collect();
        // A time slice counts its whole baseboard: its devices, by PCI address.
        let mut slices = Vec::new();
        for s in self.slices(from_ms, to_ms)? {
            let devices: Vec<String> = s
                .baseboard
                .split_whitespace()
                .map(|d| format!("pci:{d}"))
                .collect();
            for d in &devices {
                if !gpus.iter().any(|g| &g.uuid == d) {
                    gpus.push(GpuFacts {
                        uuid: d.clone(),
                        index: 1000 + gpus.len() as u32,
                        total_bytes: 1,
                    });
                }
            }
            slices.push(crate::report::SliceHold {
                template: s.template,
                user: s.user,
                gpu_uuids: devices,
                from_ms: s.start_ms,
                to_ms: s.end_ms,
            });
        }
        Ok(Facts {
            records_from: self.records_from()?,
            gpus,
            holds,
            slices,
            measured: inputs.measured,
            up: inputs.up,
            rolled: Vec::new(),
        })
    }
}

/// What a report's rolled-up days stand for: per GPU, the span its days
/// cover without a gap (`Rolled::spans`), whose holds wholly inside are
/// not read; and the GPUs the report may count besides those measured in
/// its window (the machine's, and the rolled-up days').
#[derive(Default)]
pub(super) struct Folded<'a> {
    pub spans: Vec<(String, i64, i64)>,
    pub counted: Vec<&'a str>,
}

/// What a usage report was computed from, handed back to be freed later
/// ([`Store::usage_report`]).
pub struct ReportFacts {
    _facts: Facts,
}

/// A report's facts, owned; `report::Ledger` borrows them.
pub(super) struct Facts {
    pub gpus: Vec<crate::report::GpuFacts>,
    pub holds: Vec<crate::report::Holding>,
    pub slices: Vec<crate::report::SliceHold>,
    pub measured: Vec<crate::report::Measured>,
    pub up: Vec<crate::report::Up>,
    pub records_from: Option<i64>,
    pub rolled: Vec<crate::report::RolledDay>,
}

impl Facts {
    pub fn ledger(&self) -> crate::report::Ledger<'_> {
        crate::report::Ledger {
            gpus: &self.gpus,
            holds: &self.holds,
            slices: &self.slices,
            measured: &self.measured,
            up: &self.up,
            records_from: self.records_from,
            rolled: &self.rolled,
        }
    }
}

/// The report's owner keys (uids) as names: workers' rows under `owner`
/// and `user`. A name is looked up once per owner, not per row (a lookup
/// reads the user database); two uids of one name are one row.
fn name_owners(
    rows: Vec<crate::report::Row>,
    by: crate::report::GroupBy,
    owner_name: impl Fn(u32) -> String,
) -> Vec<crate::report::Row> {
    use crate::report::{GroupBy, RowKind};
    if !matches!(by, GroupBy::Owner | GroupBy::User) {
        return rows;
    }
    let mut names = std::collections::HashMap::new();
    let mut rows: Vec<_> = rows
        .into_iter()
        .map(|mut r| {
            if r.kind == RowKind::Worker {
                if let Ok(uid) = r.key.parse::<u32>() {
                    r.key = names.entry(uid).or_insert_with(|| owner_name(uid)).clone();
                }
            }
            r
        })
        .collect();
    // Merged rows carry no GPU: the order is kind, then key, as before.
    rows.sort_by(|a, b| (a.kind, &a.key).cmp(&(b.kind, &b.key)));
    rows.dedup_by(|later, kept| {
        let same = later.kind == kept.kind && later.key == kept.key;
        if same {
            kept.gpu_ms = kept.gpu_ms.saturating_add(later.gpu_ms);
            kept.energy_mj = kept.energy_mj.saturating_add(later.energy_mj);
            kept.busy_gpu_ms = match (kept.busy_gpu_ms, later.busy_gpu_ms) {
                (Some(a), Some(b)) => Some(a.saturating_add(b)),
                (a, b) => a.or(b),
            };
        }
        same
    });
    rows
}

#[cfg(test)]
mod tests {
    use super::{HOLDS_IN, INTERVALS_IN, RUNS_IN};
    use crate::store::slicing::{OPEN_SLICE, SLICES_IN};
    use crate::store::workers::{LIVE_HOLDS, LIVE_WORKERS};
    use crate::store::Store;
    use rusqlite::{params, StatementStatus};

    const MINUTE: i64 = 60_000;

    #[test]
    fn a_worker_launches_when_its_request_has_a_run() {
        use super::launches;
        assert!(launches(
            r#"{"name":"w","run":{"container":{"image":"i"}}}"#
        ));
        assert!(!launches(r#"{"name":"w"}"#));
        assert!(!launches(r#"{"name":"run"}"#), "a reservation named run");
        assert!(!launches(
            r#"{"name":"w","requested_resources":{"gpu_requests":{"models":["run"]}}}"#
        ));
        assert!(!launches("not json \"run\""));
    }

    /// A Kubernetes claim is billed to its namespace (`k8s/NS`), its
    /// local neighbour to its owner's name, by memory fraction alike.
    #[test]
    fn a_claim_is_billed_to_its_namespace() {
        let store = Store::open_in_memory().unwrap();
        let tx = store.conn.unchecked_transaction().unwrap();
        let claim = r#"{"name":"claim-1","claim":{"namespace":"team-a","name":"voice","uid":"1"}}"#;
        for (id, name, spec, owner) in [(1, "claim-1", claim, 0), (2, "local", "{}", 1000)] {
            tx.execute(
                "INSERT INTO workers (id, name, spec, owner_uid, state, submitted_ms, started_ms)
                 VALUES (?1, ?2, ?3, ?4, 'running', 0, 0)",
                params![id, name, spec, owner],
            )
            .unwrap();
            tx.execute(
                "INSERT INTO holds (worker_id, gpu_uuid, gpu_index, share_hundredths, from_ms, to_ms)
                 VALUES (?1, 'GPU-0', 0, 200, 0, NULL)",
                params![id],
            )
            .unwrap();
        }
        tx.execute(
            "INSERT INTO gpu_intervals (gpu_uuid, from_ms, to_ms, energy_mj, samples)
             VALUES ('GPU-0', 0, ?1, 8, 1)",
            params![MINUTE],
        )
        .unwrap();
        tx.execute(
            "INSERT INTO daemon_runs (started_ms, alive_ms) VALUES (0, ?1)",
            params![MINUTE],
        )
        .unwrap();
        tx.commit().unwrap();
        let gpus = vec![crate::report::GpuFacts {
            uuid: "GPU-0".into(),
            index: 0,
            total_bytes: 8 << 30,
        }];
        let current = super::CurrentRun {
            started_ms: 0,
            now_ms: MINUTE,
            open: Vec::new(),
        };
        let (rows, _) = store
            .usage_report(
                0,
                MINUTE,
                crate::report::GroupBy::Owner,
                Some(current),
                gpus,
                |uid| format!("user{uid}"),
            )
            .unwrap();
        let of = |key: &str| rows.iter().find(|r| r.key == key).map(|r| r.gpu_ms);
        // 2 of 8 GB for a minute: a quarter of the GPU's minute each.
        assert_eq!(of("k8s/team-a"), Some(MINUTE as u64 / 4), "{rows:?}");
        assert_eq!(of("user1000"), Some(MINUTE as u64 / 4), "{rows:?}");
        assert_eq!(
            of("user0"),
            None,
            "the plugin (root) is not the claim's owner: {rows:?}"
        );
    }

    /// A ledger with `history` ended workers (a hold, a GPU interval, a
    /// time slice and a daemon run each, long before the window) and, in the last minute,
    /// two live holds, two closed intervals and an open slice.
    fn ledger(history: i64, now: i64) -> Store {
        let store = Store::open_in_memory().unwrap();
        let tx = store.conn.unchecked_transaction().unwrap();
        for i in 0..history + 2 {
            let live = i >= history;
            let (from, to) = if live {
                (now - MINUTE / 2, None)
            } else {
                (i * MINUTE, Some((i + 1) * MINUTE))
            };
            tx.execute(
                "INSERT INTO workers (id, name, spec, owner_uid, state, submitted_ms, started_ms, ended_ms)
                 VALUES (?1, ?2, '{}', 0, ?3, ?4, ?4, ?5)",
                params![i + 1, format!("w{i}"), if live { "running" } else { "stopped" }, from, to],
            )
            .unwrap();
            tx.execute(
                "INSERT INTO holds (worker_id, gpu_uuid, gpu_index, share_hundredths, from_ms, to_ms)
                 VALUES (?1, 'GPU-0', 0, 10, ?2, ?3)",
                params![i + 1, from, to],
            )
            .unwrap();
            let interval = if live {
                now - MINUTE + (i - history)
            } else {
                i * MINUTE
            };
            tx.execute(
                "INSERT INTO gpu_intervals (gpu_uuid, from_ms, to_ms, energy_mj, samples)
                 VALUES (?1, ?2, ?3, 1, 1)",
                params![format!("GPU-{i}"), interval, interval + MINUTE / 2],
            )
            .unwrap();
            // A slice per ended worker, over its hold's time, and one open.
            if i <= history {
                tx.execute(
                    "INSERT INTO slices (template, user, baseboard, start_ms, end_ms)
                     VALUES ('t', 'u', '0000:01:00.0', ?1, ?2)",
                    params![from, to],
                )
                .unwrap();
            }
        }
        // A daemon run per ended worker, and the one still on.
        for i in 0..history {
            tx.execute(
                "INSERT INTO daemon_runs (started_ms, alive_ms) VALUES (?1, ?2)",
                params![i * MINUTE + 1, (i + 1) * MINUTE - 1],
            )
            .unwrap();
        }
        tx.execute(
            "INSERT INTO daemon_runs (started_ms, alive_ms) VALUES (?1, ?2)",
            params![history * MINUTE + 1, now],
        )
        .unwrap();
        tx.commit().unwrap();
        store
    }

    /// SQLite's own count of the steps each window query took.
    fn steps(store: &Store) -> Vec<i32> {
        [
            HOLDS_IN,
            INTERVALS_IN,
            RUNS_IN,
            SLICES_IN,
            OPEN_SLICE,
            LIVE_WORKERS,
            LIVE_HOLDS,
        ]
        .iter()
        .map(|sql| {
            let stmt = store.conn.prepare_cached(sql).unwrap();
            stmt.get_status(StatementStatus::VmStep)
        })
        .collect()
    }

    /// The loop's read of the minute just closed, of a template's open
    /// slice, and a start's read of the live workers cost the same with ten
    /// times the history behind them (they read every hold, slice and
    /// daemon run begun before the window, every GPU interval ever
    /// recorded, every slice, every worker and hold).
    #[test]
    fn reading_the_last_minute_and_the_live_workers_does_not_grow_with_the_history_kept() {
        let now = 100_000 * MINUTE;
        let mut costs = Vec::new();
        for history in [1_000, 10_000] {
            let store = ledger(history, now);
            let inputs = store.usage_inputs(now - MINUTE, now).unwrap();
            assert_eq!(inputs.holds.len(), 2, "the two live holds");
            assert_eq!(inputs.measured.len(), 2, "the two intervals of the minute");
            assert_eq!(inputs.up.len(), 1);
            assert_eq!(
                store.slices(now - MINUTE, now).unwrap().len(),
                1,
                "the open slice"
            );
            assert_eq!(store.open_slice_of("t").unwrap(), Some(history + 1));
            // The usual case at a slice's start: none open for the template.
            assert_eq!(store.open_slice_of("other").unwrap(), None);
            // What a start reads.
            let live = store.live_workers().unwrap();
            assert_eq!(live.len(), 2);
            assert!(live.iter().all(|w| w.grants.len() == 1));
            costs.push(steps(&store));
        }
        for (q, (small, large)) in costs[0].iter().zip(&costs[1]).enumerate() {
            // Counted at all (a statement prepared anew would read 0).
            assert!(*small > 0, "query {q}: no steps counted");
            assert!(
                *large <= small + 20,
                "query {q}: {small} steps with 1,000 ended workers, {large} with 10,000"
            );
        }
    }
}
