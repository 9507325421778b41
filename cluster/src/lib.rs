//! Local twopc clusters of real processes: start a coordinator and its participants (or a
//! throwaway PostgreSQL server) on loopback ports, with a fresh token set for them; drive the
//! checkout workloads (2PC, saga, PostgreSQL payments) against them; audit the invariants
//! afterwards; and start local etcd servers and coordinator groups on them (`etcd`, `ha_cluster`); and a
//! reference receiver of relayed outbox intents (`receiver`); and the checkout workflow's pure
//! planner (`workflow`, and its PostgreSQL statements: `pg_workflow`), which
//! `twopc workflow-worker` runs. `twopc demo`,
//! `twopc bench` and `twopc audit` run on it, and so do the tests.
//!
//! It starts real processes for the product's demo and bench and for tests, and talks to them
//! only through their HTTP APIs, command lines and data directories, the way an operator would.
//! It must never be a dependency of the coordinator or the participant, and holds no test
//! assertions framework: fault injection, the simulation and the crash scenarios live in
//! chaos-tests, which builds on this crate.

pub mod audit;
pub mod auth;
pub mod checkout;
pub mod cluster;
pub mod etcd;
pub mod group;
pub mod ha_cluster;
pub mod node;
pub mod oracle;
pub mod pg_checkout;
pub mod pg_cluster;
pub mod pg_workflow;
pub mod ports;
pub mod postgres;
pub mod receiver;
pub mod saga_checkout;
pub mod workflow;
pub mod workload;
