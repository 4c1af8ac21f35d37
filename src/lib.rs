//! astraeusd: a per-host daemon that shares a machine's GPUs by memory and by time.
//!
//! The house, in the order a newcomer reads it (docs/architecture.md has the
//! map and the rules, which tests/architecture.rs checks):
//! - pure cores, no I/O and no clock: [`quantity`], [`json_fields`], [`request`],
//!   [`placement`], [`schedule`], [`rotation`], [`usage`], [`report`], [`slicing`],
//!   [`domain_xml`], [`access`], [`claim`], [`time`], [`error`];
//! - state: [`worker`], [`node`] (the engine, one owner) and [`store`] (the SQLite
//!   ledger, the only place that touches the database);
//! - the loop: [`service`] owns the node and runs [`command`]s one at a time;
//!   [`views`] is what it shows;
//! - adaptors that only translate: [`bus`] (D-Bus), [`web`] (the machine page);
//! - backends behind traits: [`inventory`] (NVML through nvml-wrapper, or a
//!   simulated machine), [`runtime`] (podman, systemd units, libvirt), [`weights`];
//! - edges: [`cli`], [`journal`], [`failpoint`], [`auth`].

pub mod access;
pub mod auth;
pub mod bus;
pub mod claim;
pub mod cli;
pub mod command;
pub mod config;
pub mod config_doc;
pub mod deadline;
pub mod domain_xml;
pub mod error;
pub mod failpoint;
pub mod inventory;
pub mod journal;
pub mod json_fields;
pub mod machine;
pub mod memory_limits;
pub mod node;
pub mod notify;
pub mod placement;
pub mod quantity;
pub mod report;
pub mod request;
pub mod rotation;
pub mod runtime;
pub mod schedule;
pub mod schedule_form;
pub mod schedule_one;
pub mod service;

pub mod slicing;
pub mod store;
pub mod text;
pub mod time;
pub mod usage;
pub mod views;
pub mod web;
pub mod weights;
pub mod wire;
pub mod worker;
pub mod workload;
