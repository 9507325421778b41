//! The coordinator group's `/metrics` families (`--ha`; docs/ha.md): exported only by a node
//! of a group, so a coordinator that runs alone shows none of them. docs/alerts.yml's
//! `TwopcLeaderChanged` and `TwopcGroupDegraded` query these names.

use net::exposition::Exposition;

/// What a node of a group reads at the scrape.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupNumbers {
    /// This node leads, with a lease that holds.
    pub leader: bool,
    /// The term this node leads, or the highest it took replication from.
    pub term: u64,
    /// On the leader: followers counted in the sync set.
    pub followers_in_sync: u64,
    /// On the leader: followers attached (streaming or joining).
    pub followers_attached: u64,
    /// On the leader: followers detached for not confirming a sync point.
    pub followers_dropped: u64,
    /// On the leader: sync points shipped.
    pub sync_points: u64,
    /// On a follower: sync points applied to its copy since it started.
    pub copy_batches_applied: u64,
}

/// The group's families, as text to follow the coordinator's own.
pub fn render(numbers: &GroupNumbers) -> String {
    let mut out = Exposition::default();
    out.gauge(
        "twopc_ha_leader",
        "1 while this node leads its coordinator group with a lease that holds",
        u64::from(numbers.leader),
    );
    out.gauge(
        "twopc_ha_term",
        "The group's term this node leads or last followed (a rise is a leader change)",
        numbers.term,
    );
    out.gauge(
        "twopc_ha_followers_in_sync",
        "On the leader: followers in the sync set (0: degraded, only the leader holds what it acknowledges)",
        numbers.followers_in_sync,
    );
    out.gauge(
        "twopc_ha_followers_attached",
        "On the leader: followers attached (joining or streaming)",
        numbers.followers_attached,
    );
    out.counter(
        "twopc_ha_followers_dropped_total",
        "On the leader: followers detached for not confirming a sync point in time",
        numbers.followers_dropped,
    );
    out.counter(
        "twopc_ha_sync_points_total",
        "On the leader: sync points (group commits) shipped to the followers",
        numbers.sync_points,
    );
    out.counter(
        "twopc_ha_copy_batches_applied_total",
        "On a follower: sync points applied to its copy of the leader's log",
        numbers.copy_batches_applied,
    );
    out.text()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_is_named_typed_and_valued() {
        let text = render(&GroupNumbers {
            leader: true,
            term: 7,
            followers_in_sync: 1,
            followers_attached: 1,
            followers_dropped: 2,
            sync_points: 40,
            copy_batches_applied: 0,
        });
        for line in [
            "# TYPE twopc_ha_leader gauge",
            "twopc_ha_leader 1",
            "twopc_ha_term 7",
            "twopc_ha_followers_in_sync 1",
            "# TYPE twopc_ha_followers_dropped_total counter",
            "twopc_ha_followers_dropped_total 2",
            "twopc_ha_sync_points_total 40",
            "twopc_ha_copy_batches_applied_total 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
    }
}
