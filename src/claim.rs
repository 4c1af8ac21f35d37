//! PURE: a Kubernetes ResourceClaim as the ledger books it (#64). The
//! kubelet plugin (a thin adaptor, kubernetes/) asks the daemon to prepare
//! each device the scheduler allocated: the claim becomes a worker of the
//! same ledger, pinned to the allocated GPU by UUID, taking the memory the
//! claim consumed (none: the GPU whole). Every decision stays here and in
//! placement: a prepare that no longer fits (a local worker won the race)
//! is refused with placement's own reason, which is what the pod's events
//! show. What each GPU offers the cluster is worked out here too.

use crate::error::{Error, Result};
use crate::quantity::Amount;

/// The step of a claim's memory and of what a GPU offers the cluster:
/// 256 MiB, a quarter of a GB (2^30 bytes), so that every amount the
/// scheduler can hand out is a whole number of hundredths of a GB (the
/// ledger's unit): nothing is rounded between the cluster and the ledger.
pub const STEP_BYTES: u64 = 1 << 28;

/// Hundredths of a GB in one step.
pub const STEP_HUNDREDTHS: u64 = 25;

/// Who a claim is: what the API server names it by.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Origin {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// One allocated device of a claim, as the plugin asks it prepared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    pub origin: Origin,
    pub gpu_uuid: String,
    /// The memory it consumed, in bytes; None: the GPU whole.
    pub memory_bytes: Option<u64>,
}

impl Claim {
    /// Checks each field, naming it and what is accepted.
    pub fn new(
        uid: &str,
        namespace: &str,
        name: &str,
        gpu_uuid: &str,
        memory_bytes: u64,
    ) -> Result<Claim> {
        check_uid(uid)?;
        if !dns_label(namespace, 63) {
            return Err(Error::field(
                "namespace",
                "a namespace: 1 to 63 of a-z 0-9 -, starting and ending with a letter or digit",
            ));
        }
        if !dns_subdomain(name) {
            return Err(Error::field(
                "name",
                "a claim's name: 1 to 253 of a-z 0-9 - ., each part starting and ending with a \
                 letter or digit",
            ));
        }
        let gpu_ok = (gpu_uuid.starts_with("GPU-") || gpu_uuid.starts_with("MIG-"))
            && gpu_uuid.len() <= 96
            && gpu_uuid[4..]
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-')
            && gpu_uuid.len() > 4;
        if !gpu_ok {
            return Err(Error::field(
                "gpu_uuid",
                "a GPU's UUID as NVML names it: GPU- or MIG- then letters, digits and dashes",
            ));
        }
        if !memory_bytes.is_multiple_of(STEP_BYTES) {
            return Err(Error::field(
                "memory_bytes",
                format!(
                    "{memory_bytes} is not a multiple of {STEP_BYTES} (256 MiB, the step every \
                     GPU's capacity is published with); 0 takes the GPU whole"
                ),
            ));
        }
        Ok(Claim {
            origin: Origin {
                namespace: namespace.to_string(),
                name: name.to_string(),
                uid: uid.to_string(),
            },
            gpu_uuid: gpu_uuid.to_string(),
            memory_bytes: (memory_bytes > 0).then_some(memory_bytes),
        })
    }

    /// The worker it is booked as: `claim-<uid>` (a UID is unique in the
    /// cluster, and 42 characters fit a worker's name).
    pub fn worker_name(&self) -> String {
        worker_name(&self.origin.uid)
    }

    /// Its share of the GPU in the ledger's unit; None: the GPU whole.
    pub fn share(&self) -> Option<Amount> {
        self.memory_bytes
            .map(|b| Amount::from_hundredths(b / STEP_BYTES * STEP_HUNDREDTHS))
    }

    /// The worker's request, as the ledger keeps it: pinned to its GPU by
    /// UUID, shared with its memory or whole, and who it is.
    pub fn spec(&self) -> String {
        let gpu = match self.share() {
            Some(share) => serde_json::json!({
                "count": 1, "ids": [self.gpu_uuid], "shared": true,
                "memory_gb": serde_json::Number::from_string_unchecked(share.to_string()),
                "healthy_only": true,
            }),
            None => serde_json::json!({
                "count": 1, "ids": [self.gpu_uuid], "healthy_only": true,
            }),
        };
        serde_json::json!({
            "name": self.worker_name(),
            "requested_resources": { "gpu_requests": gpu },
            "claim": self.origin,
        })
        .to_string()
    }
}

/// A claim's UID as the API server makes them: 1 to 64 hexadecimal digits
/// and dashes (a worker's name is `claim-` and it).
/// How a claim's owner reads in `workers` and the usage report: its
/// namespace (the plugin books every claim as root).
pub fn owner_label(namespace: &str) -> String {
    format!("k8s/{namespace}")
}

/// The namespace of a claim's worker, from its request as the ledger keeps
/// it; None for any other worker (most: no `"claim"` in it, no parse).
pub fn namespace_in_spec(spec: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Top {
        claim: Option<Origin>,
    }
    if !spec.contains("\"claim\"") {
        return None;
    }
    let top: Top = serde_json::from_str(spec).ok()?;
    Some(top.claim?.namespace)
}

pub fn check_uid(uid: &str) -> Result<()> {
    let ok = !uid.is_empty()
        && uid.len() <= 58
        && uid.chars().all(|c| c.is_ascii_hexdigit() || c == '-');
    if !ok {
        return Err(Error::field(
            "claim_uid",
            "the claim's UID: 1 to 58 hexadecimal digits and dashes",
        ));
    }
    Ok(())
}

/// The worker a claim UID is booked as.
pub fn worker_name(uid: &str) -> String {
    format!("claim-{uid}")
}

/// What a GPU offers the cluster now: what it offers shared work less what
/// the host's own workers take on it, in whole steps (bytes). Nothing when
/// it takes no shares (time-sliced, MIG), is unhealthy, is held whole or
/// kept for a whole request waiting.
pub fn offered_to_cluster(
    takes_shares: bool,
    healthy: bool,
    held_whole: bool,
    kept: bool,
    offered: Amount,
    taken_locally: Amount,
) -> u64 {
    if !takes_shares || !healthy || held_whole || kept {
        return 0;
    }
    let left = offered.saturating_sub(taken_locally).hundredths();
    left / STEP_HUNDREDTHS * STEP_BYTES
}

fn dns_label(s: &str, max: usize) -> bool {
    let edge = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    !s.is_empty()
        && s.len() <= max
        && s.starts_with(edge)
        && s.ends_with(edge)
        && s.chars().all(|c| edge(c) || c == '-')
}

fn dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(|part| dns_label(part, 63))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const UID: &str = "5f0c1e2a-8b3d-4c6e-9f10-1a2b3c4d5e6f";
    const GPU: &str = "GPU-5c0a7d3e-4060-4b1e-9f00-000000000000";

    #[test]
    fn a_claim_is_a_worker_pinned_to_its_gpu() {
        let c = Claim::new(UID, "team-a", "whisper-gpu", GPU, 3 * STEP_BYTES * 2).unwrap();
        assert_eq!(c.worker_name(), format!("claim-{UID}"));
        assert_eq!(c.share().unwrap().to_string(), "1.5");
        let spec: serde_json::Value = serde_json::from_str(&c.spec()).unwrap();
        assert_eq!(spec["name"], c.worker_name());
        let gpu = &spec["requested_resources"]["gpu_requests"];
        assert_eq!(gpu["ids"][0], GPU);
        assert_eq!(gpu["shared"], true);
        assert_eq!(gpu["memory_gb"].to_string(), "1.5");
        assert_eq!(spec["claim"]["namespace"], "team-a");
        assert_eq!(spec["claim"]["uid"], UID);
        let whole = Claim::new(UID, "team-a", "train", GPU, 0).unwrap();
        let spec: serde_json::Value = serde_json::from_str(&whole.spec()).unwrap();
        assert!(spec["requested_resources"]["gpu_requests"]
            .get("shared")
            .is_none());
    }

    #[test]
    fn each_field_is_checked_by_name() {
        let e = |r: Result<Claim>| r.unwrap_err().to_string();
        assert!(e(Claim::new("", "a", "b", GPU, 0)).contains("claim_uid:"));
        assert!(e(Claim::new(UID, "Team", "b", GPU, 0)).contains("namespace:"));
        assert!(e(Claim::new(UID, "a", "b_c", GPU, 0)).contains("name:"));
        assert!(e(Claim::new(UID, "a", "b", "0", 0)).contains("gpu_uuid:"));
        assert!(e(Claim::new(UID, "a", "b", "GPU-", 0)).contains("gpu_uuid:"));
        let odd = e(Claim::new(UID, "a", "b", GPU, STEP_BYTES + 1));
        assert!(
            odd.contains("memory_bytes: 268435457 is not a multiple"),
            "{odd}"
        );
        assert!(Claim::new(UID, "a", "b.c-d", GPU, STEP_BYTES).is_ok());
    }

    #[test]
    fn a_gpu_offers_the_cluster_what_local_work_leaves_in_whole_steps() {
        let gb = |s: &str| Amount::parse(s).unwrap();
        // 7 GB offered, 2.1 taken by a local sharer: 4.9 left, 4.75 in steps.
        let bytes = offered_to_cluster(true, true, false, false, gb("7"), gb("2.1"));
        assert_eq!(bytes, 19 * STEP_BYTES);
        assert_eq!(
            offered_to_cluster(true, true, true, false, gb("7"), gb("0")),
            0
        );
        assert_eq!(
            offered_to_cluster(true, false, false, false, gb("7"), gb("0")),
            0
        );
        assert_eq!(
            offered_to_cluster(false, true, false, false, gb("7"), gb("0")),
            0
        );
        assert_eq!(
            offered_to_cluster(true, true, false, true, gb("7"), gb("0")),
            0
        );
        assert_eq!(
            offered_to_cluster(true, true, false, false, gb("1"), gb("2")),
            0
        );
    }

    proptest! {
        /// Whatever the cluster is offered and a claim takes in steps is a
        /// whole number of the ledger's hundredths, never more than left.
        #[test]
        fn what_is_offered_books_exactly(offered in 0u64..100_000, taken in 0u64..100_000, steps in 1u64..400) {
            let o = Amount::from_hundredths(offered);
            let t = Amount::from_hundredths(taken);
            let bytes = offered_to_cluster(true, true, false, false, o, t);
            prop_assert_eq!(bytes % STEP_BYTES, 0);
            // An independent oracle: bytes back to GB (2^30) as a fraction.
            prop_assert!(bytes as u128 * 100 <= (offered.saturating_sub(taken)) as u128 * (1u128 << 30));
            let c = Claim::new(UID, "a", "b", GPU, steps * STEP_BYTES).unwrap();
            let share = c.share().unwrap().hundredths() as u128;
            prop_assert_eq!(share * (1u128 << 30), (steps * STEP_BYTES) as u128 * 100);
        }
    }
}
