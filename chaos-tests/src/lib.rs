//! The crash-point harness: starts real `twopc` processes, kills and restarts them, and checks
//! what survived.
//!
//! This crate owns test plumbing only. It must never be a dependency of the coordinator or the
//! participant, and it talks to the processes it starts only through their public HTTP APIs,
//! command lines and data directories, the way an operator would.

pub mod audit;
pub mod auth;
pub mod binary;
pub mod checkout;
pub mod cluster;
pub mod disk_faults;
pub mod lease_nodes;
pub mod node;
pub mod oracle;
pub mod pg_checkout;
pub mod pg_cluster;
pub mod pg_rig;
pub mod ports;
pub mod postgres;
pub mod proxy;
pub mod saga_checkout;
pub mod scenario;
pub mod sim;
pub mod workload;
