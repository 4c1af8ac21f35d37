//! The ledger's records the node does not mirror in memory — slices,
//! weights, events, the container engine — written
//! through the node, each call one transaction: the service never writes
//! the store itself (it reads through `Node::store`) (#52). Templates and
//! handoff steps the time-slicing engine writes itself, through its
//! `SlicingLedger` (node/time_slicing.rs), before it keeps them.

use super::Node;
use crate::error::Result;
use crate::slicing::meter::SliceMeasures;
use crate::time::EpochMs;

impl Node {
    /// A slice opens (once: a second start of the same slice is not another).
    pub fn open_slice_once(
        &mut self,
        template: &str,
        user: &str,
        baseboard: &str,
        at: EpochMs,
        dead_time_ms: Option<i64>,
    ) -> Result<()> {
        self.store
            .open_slice_once(template, user, baseboard, at, dead_time_ms)
    }

    pub fn slice_ready_of(&mut self, template: &str, start_to_ready_ms: i64) -> Result<()> {
        self.store.slice_ready_of(template, start_to_ready_ms)
    }

    pub fn close_slice_of(
        &mut self,
        template: &str,
        at: EpochMs,
        m: &SliceMeasures,
        error: Option<&str>,
    ) -> Result<()> {
        self.store.close_slice_of(template, at, m, error)
    }

    /// The checksum of a template's staged weights, and its image.
    pub fn set_weights(
        &mut self,
        template: &str,
        checksum: &str,
        image: &str,
        at: EpochMs,
    ) -> Result<()> {
        self.store.set_weights(template, checksum, image, at)
    }

    /// An event of no worker's (a scheduled action skipped…).
    pub fn record_event(&mut self, kind: &str, detail: &str, at: EpochMs) -> Result<()> {
        self.store.record_event(kind, detail, at)
    }

    /// The engine container workers are started through (`runtime.containers = "auto"` keeps it).
    pub fn set_container_engine(&mut self, engine: &str) -> Result<()> {
        self.store.set_container_engine(engine)
    }
}
