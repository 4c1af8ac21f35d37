//! Where the GPU inventory comes from, behind one small trait: NVML through
//! nvml-wrapper on real hosts, the simulated machine (`--sim`) otherwise.
//! `held_outside` is the pure rule that tells workers' memory from memory
//! held outside Astraeus.

pub mod claims;
pub mod limits;
pub mod nvml;
pub mod sim;

use crate::error::Result;
use crate::placement::{Beyond, Machine};
use crate::quantity::Amount;
use std::collections::{HashMap, HashSet};

pub use crate::workload::{Claim, Group, Own, OwnOn, Share};

/// Reads the machine as it is now. Called at start and on every refresh.
pub trait GpuSource: Send {
    fn read(&mut self, own: &Own) -> Result<Machine>;
    /// Whether a re-read may find something new (cheap). A polled source
    /// such as NVML always says yes; a file says so when it changed.
    fn changed(&mut self) -> bool {
        true
    }
}

/// A host that only time-slices: no NVML, no GPUs in the memory-sharing pool.
pub struct NoGpus {
    pub machine: String,
    pub wsl: bool,
}

impl GpuSource for NoGpus {
    fn read(&mut self, _own: &Own) -> Result<Machine> {
        let (cpu_cores, memory_bytes) = host_resources();
        Ok(Machine {
            name: self.machine.clone(),
            wsl: self.wsl,
            cpu_cores,
            memory_bytes,
            gpus: Vec::new(),
            driver: String::new(),
        })
    }
    fn changed(&mut self) -> bool {
        false
    }
}

/// One process using GPU memory, as NVML reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessUse {
    pub pid: u32,
    /// None when the driver cannot tell (WDDM / WSL2).
    pub bytes: Option<u64>,
    /// `Xorg, user gdm` when known.
    pub who: String,
}

/// Whether a GPU is one `inventory.baseboard` names: by its UUID, or by
/// its PCI address however written (`41:00.0`, `0000:41:00.0`, NVML's
/// `00000000:41:00.0`).
pub fn on_baseboard(named: &[String], uuid: &str, pci_bus_id: &str) -> bool {
    let pci = crate::domain_xml::PciAddress::parse(pci_bus_id);
    named.iter().any(|id| {
        id.eq_ignore_ascii_case(uuid)
            || (pci.is_some() && crate::domain_xml::PciAddress::parse(id) == pci)
    })
}

/// What one GPU's memory is taken by, besides what its workers were
/// promised, rounded up ([`held_outside`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Held {
    /// Held outside Astraeus: other processes, used memory no process
    /// accounts for, the driver's reserve.
    pub outside: Amount,
    /// Used by shared workers beyond their shares: not outside Astraeus,
    /// but not free to promise either.
    pub beyond_shares: Amount,
    /// Whose use beyond shares that is.
    pub beyond: Vec<Beyond>,
    /// Who holds what (`1 GB held by pid 4242 (Xorg, user gdm)`, `0.5 GB
    /// beyond its 2 GB share by worker listen`).
    pub detail: Vec<String>,
}

/// Memory held outside Astraeus on one GPU, and used by shared workers
/// beyond their shares, with who holds it.
///
/// Outside = memory used by processes that are not workers' + used memory
/// no process accounts for + the driver's reserved memory. Without
/// per-process readings, all used memory beyond what is promised to
/// workers is outside.
pub fn held_outside(
    used: u64,
    reserved: u64,
    processes: Option<&[ProcessUse]>,
    own: &OwnOn,
) -> Held {
    let mut detail = Vec::new();
    let mut beyond = 0u64;
    let mut whose = Vec::new();
    let outside_bytes = match processes {
        Some(procs) if procs.iter().all(|p| p.bytes.is_some()) => {
            // A worker counted exactly: its group's figure, not the bytes
            // of the processes in its group.
            let own_bytes: u64 = procs
                .iter()
                .filter(|p| own.pids.contains(&p.pid) && !own.exact_pids.contains(&p.pid))
                .filter_map(|p| p.bytes)
                .sum::<u64>()
                + own.exact.values().sum::<u64>();
            let mut others: Vec<&ProcessUse> = procs
                .iter()
                .filter(|p| !own.pids.contains(&p.pid))
                .collect();
            others.sort_by_key(|p| std::cmp::Reverse(p.bytes));
            for p in others {
                let gb = Amount::gb_from_bytes_ceil(p.bytes.unwrap_or(0));
                if !gb.is_zero() {
                    detail.push(format!("{gb} GB held by pid {} ({})", p.pid, p.who));
                }
            }
            for (excess, over) in beyond_shares(procs, own) {
                beyond += excess;
                whose.push(over);
            }
            detail.extend(crate::placement::beyond_lines(&whose));
            used.saturating_sub(own_bytes)
        }
        _ => {
            // No per-process figures: what workers were promised is theirs,
            // the rest of what is used is outside.
            used.saturating_sub(own.promised.bytes().min(used))
        }
    };
    if reserved > 0 {
        detail.push(format!(
            "{} GB reserved by the driver",
            Amount::gb_from_bytes_ceil(reserved)
        ));
    }
    Held {
        outside: Amount::gb_from_bytes_ceil(outside_bytes.saturating_add(reserved)),
        beyond_shares: Amount::gb_from_bytes_ceil(beyond),
        beyond: whose,
        detail,
    }
}

/// What shared workers' processes use beyond their shares (bytes, and
/// whose). Workers that name a process in common (one holder serving two
/// workers) are judged together, against the sum of their shares: a
/// process's bytes cannot be told apart between them.
fn beyond_shares(procs: &[ProcessUse], own: &OwnOn) -> Vec<(u64, Beyond)> {
    let shares = &own.shares;
    // Workers linked by a process in common, as sets: each share points at
    // another of its set, or at itself when it stands for the set.
    let mut parent: Vec<usize> = (0..shares.len()).collect();
    fn root(parent: &mut [usize], mut i: usize) -> usize {
        while parent[i] != i {
            parent[i] = parent[parent[i]];
            i = parent[i];
        }
        i
    }
    let mut first_with: HashMap<u32, usize> = HashMap::new();
    for (i, s) in shares.iter().enumerate() {
        for pid in &s.pids {
            let j = *first_with.entry(*pid).or_insert(i);
            let (a, b) = (root(&mut parent, i), root(&mut parent, j));
            parent[a] = b;
        }
    }
    // By set: its workers, its processes, the sum of their shares.
    let mut sets: std::collections::BTreeMap<usize, (Vec<&str>, HashSet<u32>, Amount)> =
        Default::default();
    for (i, s) in shares.iter().enumerate() {
        let set = sets.entry(root(&mut parent, i)).or_default();
        set.0.push(&s.worker);
        set.1.extend(&s.pids);
        set.2 = set.2 + s.gb;
    }
    sets.into_values()
        .filter_map(|(mut names, pids, share)| {
            // Its exactly counted groups, and the bytes of its processes
            // outside them (holders, workers not counted exactly).
            let exactly: u64 = names.iter().filter_map(|n| own.exact.get(*n)).sum();
            let used: u64 = exactly
                + procs
                    .iter()
                    .filter(|p| pids.contains(&p.pid) && !own.exact_pids.contains(&p.pid))
                    .filter_map(|p| p.bytes)
                    .sum::<u64>();
            let excess = used.checked_sub(share.bytes()).filter(|e| *e > 0)?;
            names.sort_unstable();
            let beyond = Beyond {
                workers: names.into_iter().map(str::to_string).collect(),
                share,
                used: Amount::gb_from_bytes_ceil(used),
                excess: Amount::gb_from_bytes_ceil(excess),
            };
            Some((excess, beyond))
        })
        .collect()
}

/// A board's total as people know it, and the bytes under it that NVML does
/// not report. NVML gives a little less than the nominal size (8188 MiB on
/// an "8 GB" card, 81,559 MiB on an 80 GB one): memory the driver keeps. When
/// the report is within 2 % under a whole GB, that GB is the total shown and
/// the missing bytes count as reserved by the driver (held outside), so the
/// figures shown add up (offered + outside = total) and offered, rounded
/// down, never exceeds the bytes really there. Otherwise the total is the
/// report rounded down to hundredths, and nothing is added.
pub fn board_total(reported_bytes: u64) -> (Amount, u64) {
    let gb = crate::quantity::GB_BYTES;
    let nominal = reported_bytes.div_ceil(gb);
    let missing = nominal * gb - reported_bytes;
    if nominal > 0 && missing.saturating_mul(50) <= nominal * gb {
        (Amount::whole(nominal), missing)
    } else {
        (Amount::gb_from_bytes_floor(reported_bytes), 0)
    }
}

/// WSL2: every container sees every GPU. Detected from the kernel, /dev/dxg
/// or WSL's environment; config can force it either way.
pub fn detect_wsl() -> bool {
    std::env::var_os("WSL_DISTRO_NAME").is_some()
        || std::path::Path::new("/dev/dxg").exists()
        || std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|r| {
                let r = r.to_lowercase();
                r.contains("microsoft") || r.contains("wsl")
            })
            .unwrap_or(false)
}

/// The host's name, for reasons and listings.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// The host's CPU cores and memory, promised to workers alongside GPUs.
pub fn host_resources() -> (Amount, u64) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let mem_kib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .unwrap_or(0);
    (Amount::whole(cores), mem_kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quantity::GB_BYTES;

    fn p(pid: u32, gb: u64, who: &str) -> ProcessUse {
        ProcessUse {
            pid,
            bytes: Some(gb * GB_BYTES),
            who: who.into(),
        }
    }

    fn mine(pids: &HashSet<u32>, shares: &[Share], promised: Amount) -> OwnOn {
        OwnOn {
            pids: pids.clone(),
            shares: shares.to_vec(),
            promised,
            exact: HashMap::new(),
            exact_pids: HashSet::new(),
        }
    }

    fn share(worker: &str, gb: u64, pids: &[u32]) -> Share {
        Share {
            worker: worker.into(),
            gb: Amount::whole(gb),
            pids: pids.to_vec(),
        }
    }

    #[test]
    fn what_a_shared_worker_uses_beyond_its_share_is_not_free() {
        // Worker a (share 2) uses 5 through pids 1 and 2; worker b (share 4)
        // uses 1 through pid 3: b's unused 3 GB are still promised to b, so
        // they do not cover a's excess. 3 GB beyond a's share, 1 by pid 9.
        let own: HashSet<u32> = [1, 2, 3].into();
        let shares = [share("a", 2, &[1, 2]), share("b", 4, &[3])];
        let procs = [p(1, 3, "x"), p(2, 2, "x"), p(3, 1, "x"), p(9, 1, "y")];
        let held = held_outside(
            7 * GB_BYTES,
            0,
            Some(&procs),
            &mine(&own, &shares, Amount::whole(6)),
        );
        assert_eq!(
            (held.outside, held.beyond_shares),
            (Amount::whole(1), Amount::whole(3))
        );
        assert_eq!(
            held.detail,
            vec![
                "1 GB held by pid 9 (y)",
                "3 GB beyond its 2 GB share by worker a"
            ]
        );
        // Within their shares, nothing of theirs is outside.
        let procs = [p(1, 1, "x"), p(3, 4, "x")];
        let held = held_outside(
            5 * GB_BYTES,
            0,
            Some(&procs),
            &mine(&own, &shares, Amount::whole(6)),
        );
        assert_eq!(held, Held::default());
    }

    /// A held worker's use is its group's exact count (NVML's currentUsed),
    /// not its processes' bytes: 5 GB of a 4 GB share, though NVML lists
    /// only 1 GB for its pid; the rest of the GPU's use is outside.
    #[test]
    fn a_held_workers_use_is_its_groups_exact_count() {
        let own: HashSet<u32> = [10].into();
        let shares = [share("a", 4, &[10])];
        let procs = [p(10, 1, "x"), p(20, 2, "y")];
        let mut on = mine(&own, &shares, Amount::whole(4));
        let by_pids = held_outside(8 * GB_BYTES, 0, Some(&procs), &on);
        assert_eq!(
            (by_pids.outside, by_pids.beyond_shares),
            (Amount::whole(7), Amount::ZERO)
        );
        on.exact.insert("a".into(), 5 * GB_BYTES);
        on.exact_pids.insert(10);
        let exact = held_outside(8 * GB_BYTES, 0, Some(&procs), &on);
        assert_eq!(
            (exact.outside, exact.beyond_shares),
            (Amount::whole(3), Amount::whole(1))
        );
        assert_eq!(exact.beyond[0].used, Amount::whole(5));
        // A holder of its own outside the group (pid 11, 1 GB) is still its
        // use, by its own bytes: 6 GB in all, none of it outside.
        let own: HashSet<u32> = [10, 11].into();
        let mut on = mine(&own, &[share("a", 4, &[10, 11])], Amount::whole(4));
        on.exact.insert("a".into(), 5 * GB_BYTES);
        on.exact_pids.insert(10);
        let procs = [p(10, 1, "x"), p(11, 1, "x"), p(20, 2, "y")];
        let held = held_outside(9 * GB_BYTES, 0, Some(&procs), &on);
        assert_eq!(
            (held.outside, held.beyond_shares),
            (Amount::whole(3), Amount::whole(2))
        );
        assert_eq!(held.beyond[0].used, Amount::whole(6));
    }

    /// Sharers with no process known on a GPU are left out of what is
    /// judged there (a refresh of many allocates nothing for them), and
    /// judging with them in gives the same answer.
    #[test]
    fn sharers_with_no_process_change_nothing_judged() {
        let claim = |worker: &str, gb: u64, holders: &[u32]| Claim {
            worker: worker.into(),
            share: Some(Amount::whole(gb)),
            holders: holders.to_vec(),
        };
        let own = Own {
            on_gpu: [(
                "GPU-a".to_string(),
                std::sync::Arc::from(vec![
                    claim("a", 1, &[1]),
                    claim("idle", 3, &[]),
                    claim("b", 1, &[]),
                ]),
            )]
            .into(),
            in_cgroups: [("b".to_string(), (7, vec![2]))].into(),
            promised: [("GPU-a".to_string(), Amount::whole(5))].into(),
            ..Own::default()
        };
        let on = own.on("GPU-a");
        assert_eq!(on.pids, [1, 2].into());
        assert_eq!(on.shares, vec![share("a", 1, &[1]), share("b", 1, &[2])]);
        let procs = [p(1, 3, "x"), p(2, 1, "x"), p(9, 1, "y")];
        let mut with_idle = on.clone();
        with_idle.shares.insert(1, share("idle", 3, &[]));
        let judged = held_outside(5 * GB_BYTES, 0, Some(&procs), &on);
        assert_eq!(
            judged,
            held_outside(5 * GB_BYTES, 0, Some(&procs), &with_idle)
        );
        assert_eq!(judged.beyond_shares, Amount::whole(2), "{judged:?}");
    }

    #[test]
    fn workers_with_a_process_in_common_are_judged_on_their_shares_together() {
        // One holder (pid 5) serves c (share 1) and d (share 2), and d has
        // pid 6 of its own: 4 GB between them against 3 GB of shares.
        let own: HashSet<u32> = [5, 6].into();
        let shares = [share("d", 2, &[5, 6]), share("c", 1, &[5])];
        let procs = [p(5, 3, "x"), p(6, 1, "x")];
        let held = held_outside(
            4 * GB_BYTES,
            0,
            Some(&procs),
            &mine(&own, &shares, Amount::whole(3)),
        );
        assert_eq!(
            (held.outside, held.beyond_shares),
            (Amount::ZERO, Amount::whole(1))
        );
        assert_eq!(
            held.detail,
            vec!["1 GB beyond their 3 GB of shares by workers c, d"]
        );
        // A set linked through several processes, named up to three.
        let names = ["e", "f", "g", "h", "i"];
        let shares: Vec<Share> = names
            .iter()
            .enumerate()
            .map(|(i, n)| share(n, 1, &[10 + i as u32, 11 + i as u32]))
            .collect();
        let procs = [p(10, 4, "x"), p(15, 2, "x"), p(20, 9, "y")];
        let own: HashSet<u32> = (10..16).collect();
        let held = held_outside(
            15 * GB_BYTES,
            0,
            Some(&procs),
            &mine(&own, &shares, Amount::whole(5)),
        );
        assert_eq!(
            (held.outside, held.beyond_shares),
            (Amount::whole(9), Amount::whole(1))
        );
        assert_eq!(
            held.detail,
            vec![
                "9 GB held by pid 20 (y)",
                "1 GB beyond their 5 GB of shares by workers e, f, g and 2 more"
            ]
        );
    }

    #[test]
    fn board_totals_read_as_sold_and_the_missing_bytes_are_the_drivers() {
        const MIB: u64 = 1 << 20;
        // An "8 GB" RTX 4060, an 80 GB H100, a 24 GB RTX 4090, exact 8 GiB.
        assert_eq!(board_total(8188 * MIB), (Amount::whole(8), 4 * MIB));
        assert_eq!(board_total(81_559 * MIB), (Amount::whole(80), 361 * MIB));
        assert_eq!(board_total(24_564 * MIB), (Amount::whole(24), 12 * MIB));
        assert_eq!(board_total(8 * GB_BYTES), (Amount::whole(8), 0));
        // Far from a whole GB (a MIG slice of 9.75 GB): rounded down, nothing added.
        assert_eq!(board_total(9984 * MIB), (Amount::from_hundredths(975), 0));
        assert_eq!(board_total(0), (Amount::ZERO, 0));
        // Never more offered than there: shown total less the missing bytes
        // (rounded up, as outside is) fits in what NVML reported.
        for mib in [8188, 81_559, 24_564, 8192, 9984, 40_536, 1023, 15_360] {
            let (total, missing) = board_total(mib * MIB);
            let offered = total.saturating_sub(Amount::gb_from_bytes_ceil(missing));
            assert!(offered.bytes() <= mib * MIB, "{mib} MiB");
        }
    }

    #[test]
    fn outside_is_other_processes_plus_unaccounted_plus_reserved() {
        let own: HashSet<u32> = [7].into();
        let procs = [p(4242, 1, "Xorg, user gdm"), p(7, 2, "listen, user ann")];
        // 3.5 GB used: 1 by Xorg, 2 by a worker's holder, 0.5 by nobody we can see.
        let used = 3 * GB_BYTES + GB_BYTES / 2;
        let held = held_outside(used, 0, Some(&procs), &mine(&own, &[], Amount::ZERO));
        assert_eq!(held.outside.to_string(), "1.5");
        assert_eq!(held.detail, vec!["1 GB held by pid 4242 (Xorg, user gdm)"]);
        let held = held_outside(
            used,
            GB_BYTES / 4,
            Some(&procs),
            &mine(&own, &[], Amount::ZERO),
        );
        assert_eq!(held.outside.to_string(), "1.75");
        assert_eq!(held.detail[1], "0.25 GB reserved by the driver");
    }

    #[test]
    fn without_per_process_readings_what_is_not_promised_is_outside() {
        let procs = [ProcessUse {
            pid: 9,
            bytes: None,
            who: "x".into(),
        }];
        let none = HashSet::new();
        let held = held_outside(
            5 * GB_BYTES,
            0,
            Some(&procs),
            &mine(&none, &[], Amount::whole(2)),
        );
        assert_eq!(held.outside, Amount::whole(3));
        let held = held_outside(GB_BYTES, 0, None, &mine(&none, &[], Amount::whole(2)));
        assert_eq!(held.outside, Amount::ZERO);
    }

    #[test]
    fn outside_rounds_up() {
        let held = held_outside(1, 0, Some(&[]), &mine(&HashSet::new(), &[], Amount::ZERO));
        assert_eq!(held.outside.to_string(), "0.01");
    }
}
