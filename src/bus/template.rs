//! `org.astraeus.Node1.Template`: one object per template defined or
//! scheduled; its slices are computed when read from the rotation's view.

use crate::views::{slice_triple, RotationView, Shared, SlicingView};
use crate::wire::{seconds, SliceTriple};
use zbus::interface;

#[derive(Clone)]
pub struct TemplateObject {
    pub name: String,
    pub rotation: Shared<RotationView>,
    pub slicing: Shared<SlicingView>,
}

impl TemplateObject {
    fn slices_now(&self) -> (SliceTriple, SliceTriple) {
        let r = self.rotation.read();
        let now = jiff::Timestamp::now();
        let (active, next) = crate::rotation::slices_now(&r.templates, &self.name, now, &r.tz);
        (slice_triple(active.as_ref()), slice_triple(next.as_ref()))
    }
}

#[interface(name = "org.astraeus.Node1.Template", introspection_docs = false)]
impl TemplateObject {
    #[zbus(property(emits_changed_signal = "const"))]
    async fn name(&self) -> String {
        self.name.clone()
    }
    /// The slice running now: (start, end in epoch ms, ends by), or (0, 0,
    /// "") — changes with time: read it.
    #[zbus(property(emits_changed_signal = "false"))]
    async fn active_slice_ms(&self) -> SliceTriple {
        self.slices_now().0
    }
    /// The next slice to start: (start, end in epoch ms, ends by), or (0, 0, "").
    #[zbus(property(emits_changed_signal = "false"))]
    async fn next_slice_ms(&self) -> SliceTriple {
        self.slices_now().1
    }
    /// ActiveSliceMs in epoch seconds; kept for one release (docs/operations.md).
    #[zbus(property(emits_changed_signal = "false"))]
    async fn active_slice(&self) -> seconds::SliceTriple {
        self.slices_now().0.into()
    }
    /// NextSliceMs in epoch seconds; kept for one release.
    #[zbus(property(emits_changed_signal = "false"))]
    async fn next_slice(&self) -> seconds::SliceTriple {
        self.slices_now().1.into()
    }
    /// Its VM now: off, stopping, waiting (for the release or the buffer),
    /// starting, running or failed; "undefined" for a schedule without a template.
    #[zbus(property)]
    async fn state(&self) -> String {
        match self.slicing.read().state_of(&self.name) {
            Some(state) => state.as_str().into(),
            None => "undefined".into(),
        }
    }
    /// Who its slices serve: `name (internal|external)`.
    #[zbus(property(emits_changed_signal = "false"))]
    async fn user(&self) -> String {
        self.slicing
            .read()
            .info
            .get(&self.name)
            .map(|i| i.0.clone())
            .unwrap_or_default()
    }
    /// Its persistent VM's libvirt domain.
    #[zbus(property(emits_changed_signal = "false"))]
    async fn domain(&self) -> String {
        self.slicing
            .read()
            .info
            .get(&self.name)
            .map(|i| i.1.clone())
            .unwrap_or_default()
    }
}
