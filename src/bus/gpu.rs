//! `org.astraeus.Node1.Gpu`: one object per GPU, read from its view.

use super::Delta;
use crate::views::{GpuView, Shared};
use zbus::interface;

#[derive(Clone)]
pub struct GpuObject {
    pub view: Shared<GpuView>,
}

#[interface(name = "org.astraeus.Node1.Gpu", introspection_docs = false)]
impl GpuObject {
    #[zbus(property)]
    async fn index(&self) -> u32 {
        self.view.read().index
    }
    #[zbus(property)]
    async fn uuid(&self) -> String {
        self.view.read().uuid.clone()
    }
    #[zbus(property)]
    async fn model(&self) -> String {
        self.view.read().model.clone()
    }
    #[zbus(property)]
    async fn vendor(&self) -> String {
        self.view.read().vendor.clone()
    }
    /// Whether it is fit for work (an unhealthy GPU takes none).
    #[zbus(property)]
    async fn healthy(&self) -> bool {
        self.view.read().healthy
    }
    /// "ok", or why it is not healthy (e.g. its NVML queries keep failing).
    #[zbus(property)]
    async fn health(&self) -> String {
        self.view.read().health.clone()
    }
    /// free, whole, shared, unhealthy, time-sliced or mig
    #[zbus(property)]
    async fn mode(&self) -> String {
        self.view.read().mode.clone()
    }
    #[zbus(property)]
    async fn total_gb(&self) -> f64 {
        self.view.read().total_gb
    }
    #[zbus(property)]
    async fn offered_gb(&self) -> f64 {
        self.view.read().offered_gb
    }
    #[zbus(property)]
    async fn held_outside_gb(&self) -> f64 {
        self.view.read().held_outside_gb
    }
    /// What its sharers' processes use beyond their shares: not free to
    /// offer, not outside Astraeus either (Warning says whose).
    #[zbus(property)]
    async fn beyond_shares_gb(&self) -> f64 {
        self.view.read().beyond_shares_gb
    }
    #[zbus(property)]
    async fn taken_gb(&self) -> f64 {
        self.view.read().taken_gb
    }
    /// Every sharer and its share (GB). PropertiesChanged only invalidates
    /// it: with a thousand sharers, sending the list on every change to the
    /// GPU made each submit cost the whole list (docs/benchmarks.md).
    #[zbus(property(emits_changed_signal = "invalidates"))]
    async fn sharers(&self) -> Vec<(String, f64)> {
        let v = self.view.read();
        v.sharers
            .iter()
            .map(|(n, gb)| (n.to_string(), gb.as_f64()))
            .collect()
    }
    /// The whole request this GPU drains for (no new work goes on it until
    /// that request is placed); empty when none.
    #[zbus(property)]
    async fn draining_for(&self) -> String {
        self.view.read().draining_for.clone()
    }
    #[zbus(property)]
    async fn summary(&self) -> String {
        self.view.read().summary.clone()
    }
    /// Set when the sharers placed no longer fit what it offers, or it is unhealthy in use.
    #[zbus(property)]
    async fn over_promised(&self) -> bool {
        self.view.read().warning.starts_with("over-promised")
    }
    #[zbus(property)]
    async fn warning(&self) -> String {
        self.view.read().warning.clone()
    }
    #[zbus(property)]
    async fn pci_bus_id(&self) -> String {
        self.view.read().pci_bus_id.clone()
    }
    /// Whether a shared worker's memory on it can be held by the driver or
    /// kernel: `held: by NVML memory limits`, or `promised: ` and why not.
    #[zbus(property)]
    async fn share_limits(&self) -> String {
        self.view.read().share_limits.clone()
    }
    /// Changes at every refresh: read it, no signal (clients poll).
    #[zbus(property(emits_changed_signal = "false"))]
    async fn power_w(&self) -> f64 {
        self.view.read().power_w
    }
    #[zbus(property(emits_changed_signal = "false"))]
    async fn utilization_percent(&self) -> i32 {
        self.view.read().utilization_pct
    }
}

impl GpuObject {
    /// What changed since `old`, as one PropertiesChanged to send.
    pub fn delta(&self, old: &GpuView) -> Delta {
        let n = self.view.read().clone();
        let mut d = Delta::new("org.astraeus.Node1.Gpu");
        d.set(old.index != n.index, "Index", n.index);
        d.set(old.uuid != n.uuid, "Uuid", n.uuid);
        d.set(old.model != n.model, "Model", n.model);
        d.set(old.vendor != n.vendor, "Vendor", n.vendor);
        d.set(old.mode != n.mode, "Mode", n.mode);
        d.set(old.healthy != n.healthy, "Healthy", n.healthy);
        d.set(old.health != n.health, "Health", n.health);
        d.set(old.total_gb != n.total_gb, "TotalGb", n.total_gb);
        d.set(old.offered_gb != n.offered_gb, "OfferedGb", n.offered_gb);
        d.set(
            old.held_outside_gb != n.held_outside_gb,
            "HeldOutsideGb",
            n.held_outside_gb,
        );
        d.set(
            old.beyond_shares_gb != n.beyond_shares_gb,
            "BeyondSharesGb",
            n.beyond_shares_gb,
        );
        d.set(old.taken_gb != n.taken_gb, "TakenGb", n.taken_gb);
        // A changed map is a new tree: comparing pointers is exact for
        // "unchanged", and costs nothing however many share the GPU.
        d.invalidate(!old.sharers.ptr_eq(&n.sharers), "Sharers");
        d.set(old.summary != n.summary, "Summary", n.summary);
        d.set(
            old.draining_for != n.draining_for,
            "DrainingFor",
            n.draining_for,
        );
        let warned = old.warning != n.warning;
        d.set(
            warned,
            "OverPromised",
            n.warning.starts_with("over-promised"),
        );
        d.set(warned, "Warning", n.warning);
        d.set(old.pci_bus_id != n.pci_bus_id, "PciBusId", n.pci_bus_id);
        d.set(
            old.share_limits != n.share_limits,
            "ShareLimits",
            n.share_limits,
        );
        d
    }
}
