//! The coordinator group's rules, pure: who may campaign, what epoch a term runs at, whether
//! a leader's lease still lets it answer, whether a follower takes a replication message, and
//! what a leader must do when a follower did not confirm a sync. No I/O, no clock (times come
//! in as arguments, from a monotonic clock), no randomness: the shell in `ha::election` and
//! `ha::mirror` acts on these answers, and the simulation (chaos-tests, `sim::ha`) drives
//! the same functions against a modelled etcd.
//!
//! The safety argument, in short (docs/ha.md has it whole): a record is acknowledged only once
//! the leader and every member of the group's sync set (kept in etcd) hold it durably; only a
//! member of the sync set, or the leader that wrote it, may take over; a member leaves the set
//! only by a compare-and-swap that proves the remover still leads; and a follower that starts a
//! campaign freezes its copy first, so a deposed leader's late batches are refused.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

/// The group's state in etcd (`<prefix>/state`, no lease: it outlives every leader).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct GroupState {
    /// Raised by one at every won campaign; the floor of the leader's epoch.
    pub term: u64,
    /// The node that won `term`.
    pub leader: String,
    /// Followers that hold every record the leader of `term` acknowledged.
    pub sync: BTreeSet<String>,
}

/// The leader key's value (`<prefix>/leader`, held by the leader's lease).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderClaim {
    pub node: String,
    /// Base URL clients and followers reach it at.
    pub url: String,
    pub term: u64,
}

/// A member's registration (`<prefix>/members/<node>`, held by its own lease).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub node: String,
    pub url: String,
}

/// Whether `node` may campaign when no leader holds the key: on a fresh group anyone; after
/// that only the last leader (its log holds all it acknowledged) or a member of its sync set
/// (which holds the same). Anyone else could lose acknowledged decisions by winning.
pub fn may_campaign(node: &str, state: Option<&GroupState>) -> bool {
    match state {
        None => true,
        Some(state) => state.leader == node || state.sync.contains(node),
    }
}

/// The state a won campaign writes: the next term, led by `node`, with no follower in sync
/// yet (each must catch up with the new leader before it counts).
pub fn next_term(node: &str, state: Option<&GroupState>) -> GroupState {
    GroupState {
        term: state.map_or(1, |s| s.term.saturating_add(1)),
        leader: node.to_string(),
        sync: BTreeSet::new(),
    }
}

/// The epoch a term runs at: above every epoch the replicated log holds (so above every epoch
/// a participant saw from this coordinator id), and at least the term etcd gave out, so two
/// terms never share an epoch even if a log were copied by hand.
pub fn epoch_for_term(next_after_log: u64, term: u64) -> u64 {
    next_after_log.max(term)
}

/// A leader may answer clients only while its lease surely still holds in etcd: the lease
/// runs `ttl_ms` from the moment the last successful keep-alive was *sent* (etcd restarts the
/// TTL when it receives it, which is later), less a margin for clock rate differences. All
/// times are from one monotonic clock of this process.
pub fn lease_holds(now_ms: u64, last_keepalive_sent_ms: u64, ttl_ms: u64, margin_ms: u64) -> bool {
    let deadline = last_keepalive_sent_ms.saturating_add(ttl_ms.saturating_sub(margin_ms));
    now_ms < deadline
}

/// What a follower does with a replication message from the leader of `epoch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaVerdict {
    /// Take it (and remember `epoch` as the highest seen).
    Accept,
    /// A newer leader was seen: this sender is deposed.
    StaleEpoch { highest: u64 },
    /// This node is campaigning or leads: its copy is frozen and must not move.
    Frozen,
}

pub fn replica_verdict(highest_seen: u64, frozen: bool, epoch: u64) -> ReplicaVerdict {
    if frozen {
        ReplicaVerdict::Frozen
    } else if epoch < highest_seen {
        ReplicaVerdict::StaleEpoch {
            highest: highest_seen,
        }
    } else {
        ReplicaVerdict::Accept
    }
}

/// What a leader does after a sync point, given which followers confirmed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AfterSync {
    /// Every member of the sync set confirmed: the records are acknowledged.
    Durable,
    /// These sync members did not confirm: the records are acknowledged only once a
    /// compare-and-swap (guarded by this leader's key) took them out of the sync set.
    /// Followers outside the set that failed are simply detached.
    DropFromSync(BTreeSet<String>),
}

pub fn after_sync(sync: &BTreeSet<String>, confirmed: &BTreeSet<String>) -> AfterSync {
    let missing: BTreeSet<String> = sync.difference(confirmed).cloned().collect();
    if missing.is_empty() {
        AfterSync::Durable
    } else {
        AfterSync::DropFromSync(missing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(leader: &str, sync: &[&str]) -> GroupState {
        GroupState {
            term: 4,
            leader: leader.to_string(),
            sync: sync.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn only_the_last_leader_or_a_sync_member_may_campaign() {
        assert!(may_campaign("a", None));
        let s = state("a", &["b"]);
        assert!(may_campaign("a", Some(&s)));
        assert!(may_campaign("b", Some(&s)));
        assert!(!may_campaign("c", Some(&s)));
        let degraded = state("a", &[]);
        assert!(!may_campaign("b", Some(&degraded)));
    }

    #[test]
    fn a_new_term_starts_with_an_empty_sync_set_and_a_higher_term() {
        let next = next_term("b", Some(&state("a", &["b"])));
        assert_eq!(next.term, 5);
        assert_eq!(next.leader, "b");
        assert!(next.sync.is_empty());
        assert_eq!(next_term("a", None).term, 1);
    }

    #[test]
    fn the_epoch_is_above_the_log_and_at_least_the_term() {
        assert_eq!(epoch_for_term(8, 3), 8);
        assert_eq!(epoch_for_term(2, 9), 9);
    }

    #[test]
    fn the_lease_holds_until_ttl_less_margin_after_the_keepalive_was_sent() {
        assert!(lease_holds(1_000, 1_000, 3_000, 500));
        assert!(lease_holds(3_499, 1_000, 3_000, 500));
        assert!(!lease_holds(3_500, 1_000, 3_000, 500));
        // A margin above the TTL never lets it hold.
        assert!(!lease_holds(1_000, 1_000, 300, 500));
    }

    #[test]
    fn a_follower_refuses_deposed_leaders_and_moves_nothing_while_frozen() {
        assert_eq!(replica_verdict(5, false, 5), ReplicaVerdict::Accept);
        assert_eq!(replica_verdict(5, false, 6), ReplicaVerdict::Accept);
        assert_eq!(
            replica_verdict(5, false, 4),
            ReplicaVerdict::StaleEpoch { highest: 5 }
        );
        assert_eq!(replica_verdict(5, true, 9), ReplicaVerdict::Frozen);
    }

    #[test]
    fn a_missing_sync_member_must_be_dropped_before_the_ack() {
        let sync: BTreeSet<String> = ["b".to_string()].into();
        assert_eq!(after_sync(&sync, &sync), AfterSync::Durable);
        assert_eq!(
            after_sync(&sync, &BTreeSet::new()),
            AfterSync::DropFromSync(sync.clone())
        );
        assert_eq!(after_sync(&BTreeSet::new(), &BTreeSet::new()), AfterSync::Durable);
    }
}
