//! astraeusd: a per-host daemon that shares a machine's GPUs by memory and by time.
//!
//! Layout (see docs/architecture.md):
//! - pure cores: [`quantity`], [`request`], [`placement`], [`schedule`] — no I/O, no clock;
//! - [`inventory`]: where GPUs come from (sim machine; NVML next), behind a trait;
//! - [`store`]: the SQLite ledger, the only place that touches the database;
//! - [`node`]: the engine that joins them; one owner (the service loop) drives it.

pub mod access;
pub mod auth;
pub mod bus;
pub mod cli;
pub mod command;
pub mod config;
pub mod domain_xml;
pub mod error;
pub mod failpoint;
pub mod inventory;
pub mod journal;
pub mod json_fields;
pub mod node;
pub mod placement;
pub mod quantity;
pub mod report;
pub mod request;
pub mod rotation;
pub mod runtime;
pub mod schedule;
pub mod service;

pub mod slicing;
pub mod store;
pub mod time;
pub mod usage;
pub mod views;
pub mod web;
pub mod weights;
pub mod worker;
