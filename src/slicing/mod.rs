//! Time-slicing a GPU baseboard between template VMs (seed 003).
//!
//! Pure cores only, like [`crate::schedule`] and [`crate::rotation`]: no I/O,
//! no clock, no libvirt. The service loop ([`crate::service`]) feeds them facts
//! (JSON, domain XML, the filesystem type of a path, libvirt events, the
//! time) and carries out what they return.
//!
//! - [`template`]: a template definition parsed from JSON and the checks that
//!   need the domain XML, the weights path's filesystem or the other templates;
//! - [`handoff`]: the handoff interlock as a state machine
//!   (`step(state, event) -> (state, actions)`), plus recovery after downtime
//!   or a restart mid-handoff;
//! - [`meter`]: what is measured over a slice (CPU, the guest's GPU figures).

pub mod handoff;
pub mod meter;
pub mod template;
