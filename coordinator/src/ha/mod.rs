//! The coordinator group (`twopc coordinator --ha etcd`): two or more processes share one
//! coordinator id; one leads, elected through etcd, and the others follow, holding a
//! synchronous copy of its log directory and outcome index. docs/ha.md is the design.
//!
//! The map, by floor: `rules` (pure: who may campaign, the epoch of a term, whether a lease
//! still lets the leader answer, what a follower takes) is the ground; `keys` names the etcd
//! keys; `etcd_group` reads and writes the group's records in etcd; `replica_host` is a
//! follower's side (its copy, the epoch gate, the `/v1/replica/*` handlers' work); `mirror` is
//! the leader's side (every sync point of the log shipped to the followers, the outcome index
//! batches, attaching followers with a base backup, the sync set kept in etcd); `node` runs a
//! process through follow, campaign and lead.
//!
//! Must never: acknowledge a record that a member of the sync set does not hold (unless a
//! compare-and-swap guarded by this leader's key took the member out first); let a node that
//! is neither the last leader nor in its sync set lead; answer a client after the leader's
//! lease may have lapsed; move a follower's copy once it started a campaign.

pub mod etcd_group;
pub mod keys;
pub mod mirror;
pub mod node;
pub mod replica_host;
pub mod rules;

use std::time::Duration;

/// Defaults of the group's settings (docs/ha.md, "The settings that matter").
pub mod defaults {
    /// The leader's etcd lease. Failover takes about this long after a leader dies.
    pub const LEASE_TTL_MS: u64 = 3_000;
    /// How long a leader waits for a follower to confirm a sync point before it takes the
    /// follower out of the sync set (and goes on without it).
    pub const REPLICA_TIMEOUT_MS: u64 = 1_000;
    /// How often a follower looks for a missing leader, and a leader for new followers.
    pub const POLL_MS: u64 = 200;
    /// Key prefix of the group in etcd.
    pub const PREFIX: &str = "/twopc/group";
}

/// `--ha etcd` and its flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HaSettings {
    /// etcd client URLs (`--etcd`), tried in turn.
    pub etcd: Vec<String>,
    /// This process's name in the group (`--node`), unique within it.
    pub node: String,
    /// The base URL the others reach this process at (`--advertise`; default from --listen).
    pub advertise: String,
    /// The group's key prefix in etcd (`--ha-prefix`).
    pub prefix: String,
    pub lease_ttl: Duration,
    pub replica_timeout: Duration,
    pub poll: Duration,
}

impl HaSettings {
    /// The margin taken off the lease for clock rate differences between this process and
    /// etcd: a tenth of the TTL, at least 100 ms.
    pub fn lease_margin(&self) -> Duration {
        (self.lease_ttl / 10).max(Duration::from_millis(100))
    }
}
