//! PURE placement core: a snapshot of the machine, what is already promised,
//! and one request in; a placement or the reasons it waits out. No I/O, no clock.
//!
//! Rules (design.md): a GPU is free, held whole, or shared — never both.
//! Shared work goes to the fullest GPU that fits (least offered memory left
//! after placing it, ties to the lower index); only when no shared GPU fits is
//! an empty one opened, the smallest that fits, so larger GPUs stay whole.
//! A GPU kept for a whole request (draining: [`Book::kept`]) takes no new
//! shared work and serves no other whole request; the node decides when to
//! keep one ([`drain_pick`] chooses which), so whole work cannot starve.

pub use crate::machine::{beyond_lines, named, Beyond, Gpu, Machine, Mig};
use crate::quantity::Amount;
use crate::request::{GpuCount, GpuId, GpuRequest, Resources};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// One GPU given to a worker; `share` is `Some` for shared work.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Grant {
    pub gpu_uuid: String,
    pub gpu_index: u32,
    pub share: Option<Amount>,
}

/// A GPU's sharers and their shares: a persistent map, so that a copy (the
/// book's snapshot for the bus, a GPU's view) is a pointer and a change
/// copies one path of the tree (O(log n)), not a thousand names.
pub type SharerMap = rpds::RedBlackTreeMapSync<Arc<str>, Amount>;

/// How one GPU is used by Astraeus workers. Cloned on every change to it
/// while the bus's snapshot holds the old one: cheap, whatever its sharers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuUse {
    pub whole: Option<String>,
    sharers: SharerMap,
    /// The sum of the shares, kept as they come and go.
    taken: Amount,
}

impl GpuUse {
    pub fn taken(&self) -> Amount {
        self.taken
    }
    pub fn sharers(&self) -> &SharerMap {
        &self.sharers
    }
    /// Its workers: the whole holder, or the sharers in name order.
    pub fn workers(&self) -> impl Iterator<Item = &str> {
        let sharers = self.sharers.keys().map(|name| &**name);
        self.whole.as_deref().into_iter().chain(sharers)
    }
    pub fn share(&mut self, worker: &str, share: Amount) {
        if let Some(&before) = self.sharers.get(worker) {
            self.taken = self.taken.saturating_sub(before);
        }
        self.sharers.insert_mut(Arc::from(worker), share);
        self.taken = self.taken + share;
    }
    pub fn unshare(&mut self, worker: &str) {
        if let Some(&before) = self.sharers.get(worker) {
            self.sharers.remove_mut(worker);
            self.taken = self.taken.saturating_sub(before);
        }
    }
    pub fn is_free(&self) -> bool {
        self.whole.is_none() && self.sharers.is_empty()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Free,
    Whole,
    Shared,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Free => "free",
            Mode::Whole => "whole",
            Mode::Shared => "shared",
        }
    }
}

/// Everything promised to running workers: GPUs (by UUID, so a renumbered or
/// vanished GPU keeps its promises) and the host's cores and memory.
/// Each GPU's use is copied on write, so a clone of the book (the snapshot
/// the bus explains waits from) costs one pointer per GPU.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Book {
    pub gpus: HashMap<String, Arc<GpuUse>>,
    pub cpu_cores: Amount,
    pub memory_bytes: u64,
    /// GPUs (by UUID) kept for a whole request that waited too long, by
    /// worker: draining while sharers remain, then empty until it is placed.
    pub kept: BTreeMap<String, String>,
}

impl Book {
    /// The whole request a GPU is kept for, when it is.
    pub fn kept_for(&self, uuid: &str) -> Option<&str> {
        self.kept.get(uuid).map(String::as_str)
    }

    pub fn usage(&self, uuid: &str) -> Option<&GpuUse> {
        self.gpus.get(uuid).map(|u| &**u)
    }

    pub fn mode(&self, uuid: &str) -> Mode {
        match self.gpus.get(uuid) {
            None => Mode::Free,
            Some(u) if u.whole.is_some() => Mode::Whole,
            Some(u) if !u.sharers.is_empty() => Mode::Shared,
            Some(_) => Mode::Free,
        }
    }

    pub fn taken(&self, uuid: &str) -> Amount {
        self.usage(uuid).map(GpuUse::taken).unwrap_or_default()
    }

    /// Records a placement. The caller has checked it with [`place`].
    pub fn add(&mut self, worker: &str, res: &Resources, grants: &[Grant]) {
        self.cpu_cores = self.cpu_cores + res.cpu_cores;
        self.memory_bytes = self.memory_bytes.saturating_add(res.memory_bytes);
        for g in grants {
            let u = Arc::make_mut(self.gpus.entry(g.gpu_uuid.clone()).or_default());
            match g.share {
                Some(share) => u.share(worker, share),
                None => u.whole = Some(worker.to_string()),
            }
        }
    }

    /// Releases what a worker held.
    pub fn remove(&mut self, worker: &str, res: &Resources, grants: &[Grant]) {
        self.cpu_cores = self.cpu_cores.saturating_sub(res.cpu_cores);
        self.memory_bytes = self.memory_bytes.saturating_sub(res.memory_bytes);
        for g in grants {
            if let Some(u) = self.gpus.get_mut(&g.gpu_uuid) {
                let u = Arc::make_mut(u);
                u.unshare(worker);
                if u.whole.as_deref() == Some(worker) {
                    u.whole = None;
                }
                if u.is_free() {
                    self.gpus.remove(&g.gpu_uuid);
                }
            }
        }
    }
}

/// Counts GPU evaluations, so tests can prove re-examination is not quadratic.
#[derive(Clone, Copy, Debug, Default)]
pub struct Evaluations(pub u64);

/// Where reasons go: collected when explaining a wait, never formatted when
/// the queue only asks whether a worker fits (the hot path of a re-examination).
struct Notes(Option<Vec<String>>);

impl Notes {
    fn add(&mut self, line: impl FnOnce() -> String) {
        if let Some(v) = &mut self.0 {
            v.push(line());
        }
    }
    fn sibling(&self) -> Notes {
        Notes(self.0.as_ref().map(|_| Vec::new()))
    }
    fn append(&mut self, other: Notes) {
        if let (Some(v), Some(mut o)) = (&mut self.0, other.0) {
            v.append(&mut o);
        }
    }
}

/// Where a request goes now, or every reason it waits. GPUs kept for a
/// whole request serve no one here: see [`place_for`].
pub fn place(
    machine: &Machine,
    book: &Book,
    res: &Resources,
    evals: &mut Evaluations,
) -> Result<Vec<Grant>, Vec<String>> {
    place_for(machine, book, res, "", evals)
}

/// [`place`] for worker `who`: the GPUs kept for it serve it.
pub fn place_for(
    machine: &Machine,
    book: &Book,
    res: &Resources,
    who: &str,
    evals: &mut Evaluations,
) -> Result<Vec<Grant>, Vec<String>> {
    let mut notes = Notes(Some(Vec::new()));
    match decide(machine, book, res, who, evals, &mut notes) {
        Some(grants) => Ok(grants),
        None => Err(notes.0.unwrap_or_default()),
    }
}

/// Why worker `who` waits now, one line per GPU that could have served
/// (empty when it fits).
pub fn reasons(machine: &Machine, book: &Book, res: &Resources, who: &str) -> Vec<String> {
    place_for(machine, book, res, who, &mut Evaluations::default())
        .err()
        .unwrap_or_default()
}

/// Why a request could never be placed on this machine, even emptied of all
/// work and of memory held outside, every GPU healthy: the reasons it would
/// wait with there; None when it could fit once others leave.
pub fn never_fits(machine: &Machine, res: &Resources) -> Option<Vec<String>> {
    let mut emptied = machine.clone();
    for g in &mut emptied.gpus {
        g.outside = Amount::ZERO;
        g.beyond_shares = Amount::ZERO;
        g.beyond.clear();
        g.outside_detail.clear();
        g.healthy = true;
        g.problem = None;
    }
    place(&emptied, &Book::default(), res, &mut Evaluations::default()).err()
}

/// Where a request goes now, if it fits: [`place`] without the reasons.
pub fn fits(
    machine: &Machine,
    book: &Book,
    res: &Resources,
    evals: &mut Evaluations,
) -> Option<Vec<Grant>> {
    fits_for(machine, book, res, "", evals)
}

/// [`fits`] for worker `who`: the GPUs kept for it serve it.
pub fn fits_for(
    machine: &Machine,
    book: &Book,
    res: &Resources,
    who: &str,
    evals: &mut Evaluations,
) -> Option<Vec<Grant>> {
    decide(machine, book, res, who, evals, &mut Notes(None))
}

/// Which GPU to keep next for a whole request `who` that waited too long,
/// when keeping one can help: a matching, healthy GPU no one holds whole and
/// no one keeps, the one with the least shared memory promised (an empty one
/// first: it is kept without draining), ties to the lower index. None when
/// every such GPU is held whole or kept already.
pub fn drain_pick(machine: &Machine, book: &Book, req: &GpuRequest) -> Option<String> {
    if req.shared_gb.is_some() {
        return None;
    }
    machine
        .gpus
        .iter()
        .filter(|g| !g.withheld() && matches_filters(g, req) && (g.healthy || !req.healthy_only))
        .filter(|g| book.kept_for(&g.uuid).is_none())
        .filter(|g| book.usage(&g.uuid).is_none_or(|u| u.whole.is_none()))
        .min_by_key(|g| (book.taken(&g.uuid), g.index))
        .map(|g| g.uuid.clone())
}

/// Whether a GPU kept for a whole request still may be: it is there, not
/// time-sliced, and would serve the request (filters, health).
pub fn may_keep(g: &Gpu, req: &GpuRequest) -> bool {
    req.shared_gb.is_none()
        && !g.withheld()
        && matches_filters(g, req)
        && (g.healthy || !req.healthy_only)
}

/// "GPU 0 of majin is draining for llama-70b, a whole-GPU request that
/// waited too long: no new work goes on it until llama-70b is placed".
fn kept_reason(m: &str, g: &Gpu, keeper: &str) -> String {
    format!(
        "GPU {} of {m} is draining for {keeper}, a whole-GPU request that waited too long: \
         no new work goes on it until {keeper} is placed",
        g.index
    )
}

fn decide(
    machine: &Machine,
    book: &Book,
    res: &Resources,
    who: &str,
    evals: &mut Evaluations,
    notes: &mut Notes,
) -> Option<Vec<Grant>> {
    let host_ok = host_check(machine, book, res, notes);
    let grants = match &res.gpu {
        None => Some(Vec::new()),
        Some(req) => {
            // GPU lines count only when the GPUs are what it waits for.
            let mut gpu_notes = notes.sibling();
            let g = place_gpus(machine, book, req, who, evals, &mut gpu_notes);
            if g.is_none() {
                notes.append(gpu_notes);
            }
            g
        }
    };
    grants.filter(|_| host_ok)
}

/// The least the pending workers ask of one GPU: the smallest share any of
/// them waits for, and whether any waits for a whole GPU. A re-examination
/// stops once no GPU given back could give even that (a necessary
/// condition of [`could_use`], never a sufficient one), so its cost follows
/// what can be placed, not how many wait.
#[derive(Clone, Debug, Default)]
pub struct Needs {
    shares: BTreeMap<Amount, usize>,
    whole: usize,
}

impl Needs {
    /// How many whole-GPU requests wait.
    pub fn whole(&self) -> usize {
        self.whole
    }

    pub fn add(&mut self, req: Option<&GpuRequest>) {
        match req.map(|r| r.shared_gb) {
            None => {}
            Some(None) => self.whole += 1,
            Some(Some(share)) => *self.shares.entry(share).or_insert(0) += 1,
        }
    }

    pub fn remove(&mut self, req: Option<&GpuRequest>) {
        match req.map(|r| r.shared_gb) {
            None => {}
            Some(None) => self.whole = self.whole.saturating_sub(1),
            Some(Some(share)) => {
                if let Some(n) = self.shares.get_mut(&share) {
                    *n -= 1;
                    if *n == 0 {
                        self.shares.remove(&share);
                    }
                }
            }
        }
    }

    /// Whether any pending GPU request might still be served by `g`.
    pub fn might_use(&self, g: &Gpu, book: &Book) -> bool {
        if g.withheld() {
            return false;
        }
        let usage = book.usage(&g.uuid);
        let whole = self.whole > 0 && usage.is_none_or(GpuUse::is_free);
        let share = g.takes_shares()
            && self.shares.keys().next().is_some_and(|&least| {
                let taken = usage.map(GpuUse::taken).unwrap_or_default();
                usage.is_none_or(|u| u.whole.is_none()) && taken + least <= g.offered()
            });
        whole || share
    }
}

/// Whether GPU `g` could take part in placing `req` now. A cheap necessary
/// condition, no strings: after a change that gave capacity back only on some
/// GPUs, a pending worker none of them could serve still cannot be placed.
pub fn could_use(machine: &Machine, g: &Gpu, book: &Book, req: &GpuRequest) -> bool {
    if g.withheld() {
        return false;
    }
    let usage = book.usage(&g.uuid);
    match req.shared_gb {
        None => {
            matches_filters(g, req)
                && (g.healthy || !req.healthy_only)
                && usage.is_none_or(GpuUse::is_free)
        }
        Some(need) => {
            // On WSL2 a sharer takes its share on every GPU, whatever the filters.
            let eligible = g.takes_shares()
                && (machine.wsl || (matches_filters(g, req) && (g.healthy || !req.healthy_only)));
            let taken = usage.map(GpuUse::taken).unwrap_or_default();
            eligible && usage.is_none_or(|u| u.whole.is_none()) && taken + need <= g.offered()
        }
    }
}

fn host_check(machine: &Machine, book: &Book, res: &Resources, notes: &mut Notes) -> bool {
    let mut ok = true;
    let m = &machine.name;
    let cores = book.cpu_cores + res.cpu_cores;
    if !res.cpu_cores.is_zero() && cores > machine.cpu_cores {
        ok = false;
        notes.add(|| {
            format!(
                "host {m}: {} of {} CPU cores promised to workers; it needs {}",
                book.cpu_cores, machine.cpu_cores, res.cpu_cores
            )
        });
    }
    let mem = book.memory_bytes.saturating_add(res.memory_bytes);
    if res.memory_bytes > 0 && mem > machine.memory_bytes {
        ok = false;
        notes.add(|| {
            format!(
                "host {m}: {} of {} GB of memory promised to workers; it needs {}",
                Amount::gb_from_bytes_ceil(book.memory_bytes),
                Amount::gb_from_bytes_floor(machine.memory_bytes),
                Amount::gb_from_bytes_ceil(res.memory_bytes)
            )
        });
    }
    ok
}

/// `haystack` contains `needle`, ignoring ASCII case, without allocating.
fn contains_ignore_case(haystack: &str, needle: &str) -> bool {
    let (h, n) = (haystack.as_bytes(), needle.as_bytes());
    n.is_empty() || h.windows(n.len()).any(|w| w.eq_ignore_ascii_case(n))
}

fn matches_filters(gpu: &Gpu, req: &GpuRequest) -> bool {
    let vendor_ok = req
        .vendor
        .as_ref()
        .is_none_or(|v| v.eq_ignore_ascii_case(&gpu.vendor));
    let model_ok = req.models.is_empty()
        || req
            .models
            .iter()
            .any(|m| contains_ignore_case(&gpu.model, m));
    let id_ok = req.ids.is_empty()
        || req.ids.iter().any(|id| match id {
            GpuId::Index(i) => *i == gpu.index,
            GpuId::Uuid(u) => u.eq_ignore_ascii_case(&gpu.uuid),
        });
    vendor_ok && model_ok && id_ok
}

/// "no GPU of majin is an A100" — the one line when nothing matches at all.
fn no_match_reason(machine: &Machine, req: &GpuRequest) -> String {
    let mut parts = Vec::new();
    if !req.models.is_empty() {
        let models: Vec<String> = req.models.iter().map(|m| format!("an {m}")).collect();
        parts.push(models.join(" or "));
    }
    if let Some(v) = &req.vendor {
        parts.push(format!("made by {v}"));
    }
    if !req.ids.is_empty() {
        let ids: Vec<String> = req
            .ids
            .iter()
            .map(|id| match id {
                GpuId::Index(i) => i.to_string(),
                GpuId::Uuid(u) => u.clone(),
            })
            .collect();
        parts.push(format!("one of {}", ids.join(", ")));
    }
    if parts.is_empty() {
        format!(
            "no GPU of {} is offered to workers (it has none, all are time-sliced or in MIG mode, or the system's astraeusd manages them)",
            machine.name
        )
    } else {
        format!("no GPU of {} is {}", machine.name, parts.join(" and "))
    }
}

fn place_gpus(
    machine: &Machine,
    book: &Book,
    req: &GpuRequest,
    who: &str,
    evals: &mut Evaluations,
    notes: &mut Notes,
) -> Option<Vec<Grant>> {
    let m = &machine.name;
    let shared = req.shared_gb.is_some();
    let candidates: Vec<&Gpu> = machine
        .gpus
        .iter()
        .filter(|g| !g.withheld() && matches_filters(g, req))
        .filter(|g| !shared || g.takes_shares())
        .collect();
    // A MIG GPU the request names or would take is said, whatever else
    // keeps the request waiting; so is a MIG instance a shared one would.
    for g in (machine.gpus.iter()).filter(|g| g.mig == Mig::On && matches_filters(g, req)) {
        notes.add(|| g.mig_reason(m));
    }
    let instances = machine
        .gpus
        .iter()
        .filter(|g| g.mig_of.is_some() && !g.withheld());
    for g in instances.filter(|g| shared && matches_filters(g, req)) {
        notes.add(|| g.instance_reason(m));
    }
    if candidates.is_empty() {
        notes.add(|| no_match_reason(machine, req));
        return None;
    }
    let unhealthy = |g: &Gpu| req.healthy_only && !g.healthy;
    let kept_for_other = |g: &Gpu| book.kept_for(&g.uuid).filter(|&k| k != who);

    match req.shared_gb {
        None => {
            // Whole GPUs: free ones, lowest index first.
            let mut fit = Vec::new();
            for g in &candidates {
                evals.0 += 1;
                let usage = book.usage(&g.uuid);
                if unhealthy(g) {
                    notes.add(|| g.unhealthy_reason(m));
                } else if let Some(holder) = usage.and_then(|u| u.whole.as_ref()) {
                    notes.add(|| format!("GPU {} of {m} is held whole by {holder}", g.index));
                } else if let Some(keeper) = kept_for_other(g) {
                    notes.add(|| kept_reason(m, g, keeper));
                } else if let Some(u) = usage.filter(|u| !u.sharers.is_empty()) {
                    let n = u.sharers.size();
                    let workers = if n == 1 { "worker" } else { "workers" };
                    notes.add(|| {
                        format!(
                            "GPU {} of {m} is shared by {n} {workers}; it needs it whole",
                            g.index
                        )
                    });
                } else {
                    fit.push(*g);
                }
            }
            let want = match req.count {
                GpuCount::All => candidates.len(),
                GpuCount::Exactly(n) => n as usize,
            };
            if fit.len() >= want {
                return Some(fit[..want].iter().map(|g| grant(g, None)).collect());
            }
            if candidates.len() < want {
                notes.add(|| too_few(m, "", candidates.len(), want));
            } else if !fit.is_empty() && req.count != GpuCount::All {
                notes.add(|| too_few(m, "free ", fit.len(), want));
            }
            None
        }
        Some(need) => {
            // On WSL2 the worker takes its share on every GPU of the pool.
            let pool: Vec<&Gpu> = if machine.wsl {
                machine.gpus.iter().filter(|g| g.takes_shares()).collect()
            } else {
                candidates.clone()
            };
            let mut shared_fit = Vec::new();
            let mut free_fit = Vec::new();
            let mut blocked = 0;
            for g in &pool {
                evals.0 += 1;
                let usage = book.usage(&g.uuid);
                let taken = usage.map(GpuUse::taken).unwrap_or_default();
                let offered = g.offered();
                let keeper = book.kept_for(&g.uuid);
                let fits_here = (machine.wsl || !unhealthy(g))
                    && usage.is_none_or(|u| u.whole.is_none())
                    && keeper.is_none()
                    && taken + need <= offered;
                if fits_here {
                    if taken.is_zero() {
                        free_fit.push(*g);
                    } else {
                        shared_fit.push(*g);
                    }
                    continue;
                }
                blocked += 1;
                if unhealthy(g) && !machine.wsl {
                    notes.add(|| g.unhealthy_reason(m));
                } else if let Some(holder) = usage.and_then(|u| u.whole.as_ref()) {
                    notes.add(|| format!("GPU {} of {m} is held whole by {holder}", g.index));
                } else if let Some(keeper) = keeper.filter(|_| need <= offered) {
                    notes.add(|| kept_reason(m, g, keeper));
                } else if need > offered {
                    notes.add(|| offers_reason(m, g, need));
                } else {
                    notes.add(|| format!(
                        "GPU {} of {m}: {taken} of {offered} GB taken by shared work; it needs {need}{}",
                        g.index,
                        g.outside_suffix()
                    ));
                }
            }
            if machine.wsl {
                let matching_ok = candidates.iter().filter(|g| !unhealthy(g)).count();
                let want = match req.count {
                    GpuCount::Exactly(n) => n as usize,
                    GpuCount::All => 1,
                };
                if matching_ok < want {
                    blocked += 1;
                    notes.add(|| too_few(m, "healthy ", matching_ok, want));
                }
                if blocked > 0 {
                    return None;
                }
                return Some(pool.iter().map(|g| grant(g, Some(need))).collect());
            }
            // Fullest first: least offered memory left after placing it.
            shared_fit.sort_by_key(|g| {
                (
                    g.offered().saturating_sub(book.taken(&g.uuid) + need),
                    g.index,
                )
            });
            // Then empty GPUs: the smallest that fits.
            free_fit.sort_by_key(|g| (g.offered(), g.index));
            let want = match req.count {
                GpuCount::Exactly(n) => n as usize,
                GpuCount::All => unreachable!("validation refuses shared with policy All"),
            };
            let chosen: Vec<&Gpu> = shared_fit
                .iter()
                .chain(free_fit.iter())
                .take(want)
                .copied()
                .collect();
            if chosen.len() == want {
                return Some(chosen.iter().map(|g| grant(g, Some(need))).collect());
            }
            if candidates.len() < want {
                notes.add(|| too_few(m, "", candidates.len(), want));
            } else if !chosen.is_empty() {
                notes.add(|| {
                    format!(
                        "it fits on {} GPU{} of {m}; it needs {want}",
                        chosen.len(),
                        if chosen.len() == 1 { "" } else { "s" }
                    )
                });
            }
            None
        }
    }
}

/// "majin has 1 free GPU that matches; it needs 2".
fn too_few(m: &str, kind: &str, have: usize, want: usize) -> String {
    let (gpus, verb) = if have == 1 {
        ("GPU", "matches")
    } else {
        ("GPUs", "match")
    };
    format!("{m} has {have} {kind}{gpus} that {verb}; it needs {want}")
}

/// The seed's sentence for a need larger than what the GPU offers at all.
fn offers_reason(m: &str, g: &Gpu, need: Amount) -> String {
    match g.held_text() {
        None => format!(
            "GPU {} of {m} has {} GB in all; it needs {need}",
            g.index, g.total
        ),
        Some(held) => format!(
            "GPU {} of {m} offers {} of its {} GB ({held}); it needs {need}{}",
            g.index,
            g.offered(),
            g.total,
            g.outside_suffix()
        ),
    }
}

fn grant(g: &Gpu, share: Option<Amount>) -> Grant {
    Grant {
        gpu_uuid: g.uuid.clone(),
        gpu_index: g.index,
        share,
    }
}

/// The seed's GPUs column: `1 · shared 2.2 GB` or `2 · whole`.
pub fn gpus_column(grants: &[Grant]) -> String {
    match grants.first() {
        None => "—".to_string(),
        Some(Grant {
            share: Some(share), ..
        }) => format!("{} · shared {share} GB", grants.len()),
        Some(_) => format!("{} · whole", grants.len()),
    }
}

/// Both figures of a GPU: `offers 7 of its 8 GB (1 GB held outside Astraeus)`.
pub fn offers_line(g: &Gpu) -> String {
    match g.held_text() {
        None => format!("offers all its {} GB", g.total),
        Some(held) => format!("offers {} of its {} GB ({held})", g.offered(), g.total),
    }
}

/// Sharers a GPU's summary names; the rest are counted. A line naming a
/// thousand sharers helps no reader (the list is the Sharers property), and
/// rebuilding it on every change made a submit cost linear in them
/// (docs/benchmarks.md, costs with size).
pub const SUMMARY_NAMES: usize = 8;

/// The seed's sharers line: `shared: listen 2.2 GB, voice 4.2 GB — 6.4 GB taken`.
pub fn sharers_line(usage: Option<&GpuUse>) -> String {
    match usage {
        Some(u) if u.whole.is_some() => format!("whole: {}", u.whole.as_ref().unwrap()),
        Some(u) if !u.sharers.is_empty() => {
            let mut list: Vec<String> = u
                .sharers
                .iter()
                .take(SUMMARY_NAMES)
                .map(|(n, gb)| format!("{n} {gb} GB"))
                .collect();
            if u.sharers.size() > SUMMARY_NAMES {
                list.push(format!("and {} more", u.sharers.size() - SUMMARY_NAMES));
            }
            format!("shared: {} — {} GB taken", list.join(", "), u.taken())
        }
        _ => "free".to_string(),
    }
}
