//! The crash-point harness: the scenarios and crash matrix that kill and restart real `twopc`
//! processes (started with the `cluster` crate) and check what survived, the fault proxy between
//! them, disk faults on a stopped node's log, and the deterministic simulation (`sim`) that
//! drives both services' pure engines directly.
//!
//! This crate owns test plumbing only. It must never be a dependency of the coordinator, the
//! participant or the `twopc` binary (tests may use it), and it talks to the processes it starts
//! only through their public HTTP APIs, command lines and data directories, the way an operator
//! would. What the product also needs (clusters, tokens, workloads, the audit) belongs in
//! `cluster`, not here.
//!
//! The map, floor by floor (a module uses only those below it):
//! - `binary` (finding, or building with failpoints, the `twopc` binary the tests start),
//!   `disk_faults` (byte-level faults on a stopped node's files), `proxy` (the fault proxy)
//!   and `lease_nodes` (real processes for the lease and fencing tests) stand on no other;
//! - `pg_rig` (the PostgreSQL crash tests' processes) and `pg_outbox` (one PostgreSQL
//!   participant for the outbox and fence tests, as a process or a library) stand on `binary`;
//! - `scenario` (a real cluster behind proxies, seeded schedules, the crash-point matrix)
//!   stands on `binary`, `proxy` and `disk_faults`;
//! - `sim` stands on none of them: the deterministic simulation of the pure engines (the 2PC
//!   world, the saga worlds, fencing), with its own map in its module doc.

pub mod binary;
pub mod disk_faults;
pub mod lease_nodes;
pub mod pg_outbox;
pub mod pg_rig;
pub mod proxy;
pub mod scenario;
pub mod sim;
