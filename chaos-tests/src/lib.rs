//! The crash-point harness: starts real `twopc` processes, kills and restarts them, and checks
//! what survived.
//!
//! This crate owns test plumbing only. It must never be a dependency of the coordinator or the
//! participant, and it talks to the processes it starts only through their public HTTP APIs,
//! command lines and data directories, the way an operator would.

pub mod binary;
pub mod disk_faults;
pub mod lease_nodes;
pub mod pg_rig;
pub mod proxy;
pub mod scenario;
pub mod sim;
