//! PURE: the machine as the inventory sees it now — its GPUs (their size,
//! what is held outside, health, time-slicing and MIG mode) and who uses
//! beyond their shares — and how reasons name them. Placement
//! (placement.rs) decides on it; the inventory (inventory/) fills it.

use crate::quantity::Amount;

/// One GPU as the inventory sees it now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Gpu {
    pub index: u32,
    pub uuid: String,
    pub model: String,
    pub vendor: String,
    pub total: Amount,
    /// Memory held by something outside Astraeus (a desktop, NVML reserved…).
    pub outside: Amount,
    /// Memory shared workers use beyond their shares: theirs, but not free
    /// to promise to anyone.
    pub beyond_shares: Amount,
    /// Whose use that is: each set of workers judged together.
    pub beyond: Vec<Beyond>,
    pub healthy: bool,
    /// Owned by a time-slicing baseboard: never offered to workers.
    pub sliced: bool,
    /// Its MIG mode: a GPU in MIG mode runs no work of its own, so it is
    /// never offered either.
    pub mig: Mig,
    /// A MIG instance of this GPU (its parent's UUID): offered whole only.
    pub mig_of: Option<String>,
    /// Who holds the outside memory, and who uses beyond their share, when
    /// known (`1 GB held by pid 4242 (Xorg, user gdm)`).
    pub outside_detail: Vec<String>,
    /// Why the GPU is unhealthy, when it is.
    pub problem: Option<String>,
    pub pci_bus_id: String,
    /// Memory used now by workers' own processes (pid, bytes); `None` when the
    /// driver gives no per-process readings (WSL2).
    pub own_use: Option<Vec<(u32, u64)>>,
    /// Power draw (mW), energy counter (mJ) and utilisation (%), when readable.
    pub power_mw: Option<u32>,
    pub energy_mj: Option<u64>,
    pub utilization_pct: Option<u32>,
    /// Whether this host can hold a share of it (per-worker memory limits).
    pub share_limits: ShareLimits,
    /// The limits read back now on each worker whose share on it is held,
    /// and its group's exact use there (a reading, as `own_use`).
    pub held_use: Vec<HeldUse>,
}

/// One held worker's limits on a GPU as the driver answered them at a
/// reading: `limits` (soft, hard bytes) None when they could not be read;
/// `used`, its control group's memory on the GPU, when counted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeldUse {
    pub worker: String,
    pub limits: Option<(u64, u64)>,
    pub used: Option<u64>,
}

/// Whether a share of a GPU can be held by the driver or kernel, as its
/// inventory source found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ShareLimits {
    /// Not asked (a source without GPUs to share).
    #[default]
    Unknown,
    /// Held, and by what ("NVML memory limits").
    By(String),
    /// Only promised, and why ("driver 550.54 has no memory limits (r615+)").
    Not(String),
}

impl std::fmt::Display for ShareLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShareLimits::Unknown => f.write_str("promised: not known"),
            ShareLimits::By(how) => write!(f, "held: by {how}"),
            ShareLimits::Not(why) => write!(f, "promised: {why}"),
        }
    }
}

/// A GPU's MIG mode (NVIDIA's Multi-Instance GPU), as the driver says it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mig {
    /// No MIG, or a GPU without it.
    #[default]
    Off,
    /// On: the GPU is split into MIG instances and runs no CUDA work of
    /// its own; memory limits do not apply to MIG handles either.
    On,
    /// Off now, on after the GPU's next reset.
    Pending,
}

impl Gpu {
    /// Whether placement sees `other` as this GPU: the same identity, size,
    /// offer, health and withholding (readings aside).
    pub fn places_as(&self, o: &Gpu) -> bool {
        let figures = |g: &Gpu| (g.index, g.total, g.offered(), g.healthy, g.sliced, g.mig);
        (self.uuid == o.uuid && self.model == o.model && self.vendor == o.vendor)
            && self.mig_of == o.mig_of
            && figures(self) == figures(o)
    }

    /// Never offered to workers: time-sliced, or in MIG mode.
    pub fn withheld(&self) -> bool {
        self.sliced || self.mig == Mig::On
    }

    /// Whether shared (by memory) work may be placed on it: not withheld,
    /// and no MIG instance (memory limits do not apply to MIG handles).
    pub fn takes_shares(&self) -> bool {
        !self.withheld() && self.mig_of.is_none()
    }

    /// "GPU 0 of majin is in MIG mode: …" — why a MIG GPU takes no work.
    pub(crate) fn mig_reason(&self, m: &str) -> String {
        format!(
            "GPU {} of {m} is in MIG mode: it runs no work of its own; its MIG \
             instances are offered whole, each as a GPU of its own (turn MIG off \
             to share it: nvidia-smi -i {} -mig 0, then reset the GPU)",
            self.index, self.index
        )
    }

    /// "GPU 9 of majin is a MIG instance …" — why a shared request does not
    /// take a MIG instance.
    pub(crate) fn instance_reason(&self, m: &str) -> String {
        format!(
            "GPU {} of {m} is a MIG instance: it is offered whole only (memory \
             limits do not apply to MIG instances)",
            self.index
        )
    }

    /// What the GPU's view warns of its MIG mode, when anything.
    pub fn mig_warning(&self, m: &str) -> Option<String> {
        match self.mig {
            Mig::Off => None,
            Mig::On => Some(self.mig_reason(m)),
            Mig::Pending => Some(format!(
                "MIG mode is pending on GPU {} of {m}: after its next reset it runs \
                 no work of its own, and is no longer offered",
                self.index
            )),
        }
    }

    /// What the GPU offers to shared work: total less what is held outside
    /// and what sharers use beyond their shares.
    pub fn offered(&self) -> Amount {
        self.total
            .saturating_sub(self.outside)
            .saturating_sub(self.beyond_shares)
    }

    /// `1 GB held outside Astraeus`, `0.5 GB used beyond shares`, or both:
    /// why it offers less than its total; None when it offers it all.
    pub fn held_text(&self) -> Option<String> {
        let parts: Vec<String> = [
            (self.outside, "held outside Astraeus"),
            (self.beyond_shares, "used beyond shares"),
        ]
        .iter()
        .filter(|(gb, _)| !gb.is_zero())
        .map(|(gb, what)| format!("{gb} GB {what}"))
        .collect();
        (!parts.is_empty()).then(|| parts.join(", "))
    }

    /// ` — 1 GB held by pid 4242 (Xorg, user gdm)` after a seed sentence, when known.
    pub(crate) fn outside_suffix(&self) -> String {
        if self.outside_detail.is_empty() {
            String::new()
        } else {
            format!(" — {}", self.outside_detail.join("; "))
        }
    }

    pub(crate) fn unhealthy_reason(&self, m: &str) -> String {
        match &self.problem {
            Some(p) => format!("GPU {} of {m} is unhealthy — {p}", self.index),
            None => format!("GPU {} of {m} is unhealthy", self.index),
        }
    }
}

/// Workers using more GPU memory than their shares, judged together (they
/// name a process in common, whose bytes cannot be told apart between them).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Beyond {
    /// Sorted; one for a worker judged alone.
    pub workers: Vec<String>,
    /// The sum of their shares, and what their processes use now.
    pub share: Amount,
    pub used: Amount,
    pub excess: Amount,
}

/// Workers a line about use beyond shares names; the rest are counted.
const NAMED: usize = 3;

impl Beyond {
    /// `0.5 GB beyond its 2.5 GB share by worker listen`, or `1 GB beyond
    /// their 5 GB of shares by workers e, f, g and 2 more`.
    pub fn line(&self) -> String {
        let (gb, share) = (self.excess, self.share);
        match self.workers.as_slice() {
            [one] => format!("{gb} GB beyond its {share} GB share by worker {one}"),
            many => format!(
                "{gb} GB beyond their {share} GB of shares by workers {}",
                named(many.iter().map(String::as_str))
            ),
        }
    }
}

/// The lines of [`Beyond::line`] for the sets using most beyond their
/// shares, up to [`NAMED`], then how many more: one user's thousand small
/// breaches make a short warning.
pub fn beyond_lines(sets: &[Beyond]) -> Vec<String> {
    let mut most: Vec<&Beyond> = sets.iter().collect();
    most.sort_by_key(|b| std::cmp::Reverse(b.excess));
    let mut lines: Vec<String> = most.iter().take(NAMED).map(|b| b.line()).collect();
    if most.len() > NAMED {
        lines.push(format!(
            "and {} more sets of workers beyond their shares",
            most.len() - NAMED
        ));
    }
    lines
}

/// Up to [`NAMED`] names, then how many more: `e, f, g and 2 more`.
pub fn named<'a>(names: impl ExactSizeIterator<Item = &'a str>) -> String {
    let more = names.len().saturating_sub(NAMED);
    let mut line = names.take(NAMED).collect::<Vec<_>>().join(", ");
    if more > 0 {
        line.push_str(&format!(" and {more} more"));
    }
    line
}

/// The machine as the placement core sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Machine {
    pub name: String,
    /// On WSL2 every container sees every GPU: shared work takes its memory on each.
    pub wsl: bool,
    pub cpu_cores: Amount,
    pub memory_bytes: u64,
    pub gpus: Vec<Gpu>,
    /// The GPU driver's version as NVML says it ("" where none is read:
    /// the simulated machine, no GPUs).
    pub driver: String,
}

impl Machine {
    /// Whether `other` differs from this at most in what is read anew at
    /// each refresh and places nothing: power, the energy counter,
    /// utilisation and each worker process's bytes (what they add up to,
    /// outside use and use beyond shares, are compared).
    pub fn same_but_readings(&self, other: &Machine) -> bool {
        // Every field named: one added later is compared, or said not to be.
        let Machine {
            name,
            wsl,
            cpu_cores,
            memory_bytes,
            gpus,
            driver,
        } = self;
        *name == other.name
            && *driver == other.driver
            && *wsl == other.wsl
            && *cpu_cores == other.cpu_cores
            && *memory_bytes == other.memory_bytes
            && gpus.len() == other.gpus.len()
            && gpus
                .iter()
                .zip(&other.gpus)
                .all(|(g, o)| g.same_but_readings(o))
    }
}

impl Gpu {
    /// Whether `other` differs from this GPU at most in what is read anew
    /// at each refresh (see [`Machine::same_but_readings`]).
    pub fn same_but_readings(&self, other: &Gpu) -> bool {
        // A copy with the readings blanked: a field added later is compared.
        let bare = |g: &Gpu| Gpu {
            power_mw: None,
            energy_mj: None,
            utilization_pct: None,
            own_use: None,
            held_use: Vec::new(),
            ..g.clone()
        };
        bare(self) == bare(other)
    }
}
