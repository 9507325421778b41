//! The scenario harness: a real checkout cluster (the failpoints build of `twopc`) with a fault
//! proxy in front of every participant, a workload that records what the client heard, crash
//! and restart helpers, disk-fault steps on stopped nodes, a seeded schedule generator, and
//! probes that read one transaction's exact state for the crash-point matrix.
//!
//! Owns: the processes, proxies and temporary directory of one scenario. Must never: assume an
//! unanswered order failed, or share a cluster between scenarios.

mod chaos_cluster;
pub mod disk;
pub mod matrix;
pub mod probe;
pub mod schedule;

pub use chaos_cluster::{COORDINATOR, ChaosCluster, ChaosOptions};

/// Arms one crash point so that the process aborts the first time it gets there.
pub fn armed(point: &str) -> Vec<(String, String)> {
    vec![("FAILPOINTS".to_string(), format!("{point}=return"))]
}
