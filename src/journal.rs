//! Stable journal message ids, one per kind of event, so that
//! `journalctl MESSAGE_ID=<id>` finds every event of that kind. Events about
//! one thing also carry WORKER= and/or GPU= fields (README, "Logs").
//! Ids are fixed forever once shipped: add new ones, never reuse.

/// A worker was placed on its GPUs (at submit, or later from the queue).
pub const PLACED: &str = "289c420c04474b6894f80da2da49d6c0";
/// A worker's workload started: through which engine, and how it was given
/// its GPUs (a CDI device, or the engine's GPU request).
pub const STARTED: &str = "8620da6343b04c059ca389c8918b28a0";
/// A worker waits; the message carries its reasons.
pub const PENDING: &str = "c333d8604cae4623bc6d1d18f2136927";
/// A worker ended (stopped, or its process exited) and its share was freed.
pub const EXITED: &str = "3f42d4092f59400783976b9f3a69e65d";
/// A GPU's sharers no longer fit what it offers (outside use grew).
pub const OVER_PROMISED: &str = "4a1865c810c44f068ad2733be5769b90";
/// A worker needs attention: its GPU is unhealthy or gone, or it uses more than its share.
pub const WORKER_WARNING: &str = "17583ccc74d7438ab6bb45c9550a4eaa";
/// A step of a time-slicing handoff (power-off, release, buffer, resume).
pub const HANDOFF_STEP: &str = "eecdf24d752a41ea87b048282b74d465";
/// The daemon is ready (READY=1 sent) or stopping.
pub const LIFECYCLE: &str = "c5b1cceda2054a4e9ca28d2406f9753b";
/// Time-slicing paused (the ledger refused a handoff step, or could not say
/// the last one), or resumed after such a pause.
pub const SLICING_PAUSED: &str = "dd0305d237e842b7a75928c04f524508";

/// Every id with its name, for the README table and a uniqueness test.
pub const ALL: &[(&str, &str)] = &[
    ("placed", PLACED),
    ("started", STARTED),
    ("pending", PENDING),
    ("exited", EXITED),
    ("over-promised", OVER_PROMISED),
    ("worker-warning", WORKER_WARNING),
    ("handoff-step", HANDOFF_STEP),
    ("lifecycle", LIFECYCLE),
    ("slicing-paused", SLICING_PAUSED),
];

#[cfg(test)]
mod tests {
    #[test]
    fn ids_are_distinct_128_bit_hex() {
        let mut seen = std::collections::HashSet::new();
        for (name, id) in super::ALL {
            assert_eq!(id.len(), 32, "{name}");
            assert!(
                id.bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()),
                "{name}"
            );
            assert!(seen.insert(*id), "{name} reuses an id");
        }
    }
}

#[cfg(test)]
mod catalog {
    /// Every MESSAGE_ID has an entry in the shipped catalog, and nothing else does.
    #[test]
    fn the_catalog_explains_every_message_id() {
        let text = include_str!("../packaging/catalog/astraeusd.catalog");
        let ids: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("-- ")).collect();
        let mut want: Vec<&str> = super::ALL.iter().map(|(_, id)| *id).collect();
        let mut got = ids.clone();
        want.sort();
        got.sort();
        assert_eq!(got, want);
    }
}
