//! The backend's decisions, pure: given what PostgreSQL and the bookkeeping tables said, what
//! the participant answers or does. No I/O, clock or randomness here; `backend` and `in_doubt`
//! run the statements and act on these verdicts.

use protocol::{CoordinatorId, Decision, DecisionQueryResponse, DecisionStatus, Epoch};

/// A gid's row in `twopc.pg_outcomes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    Committed,
    Aborted,
}

impl Recorded {
    pub fn parse(outcome: &str) -> Option<Recorded> {
        match outcome {
            "committed" => Some(Recorded::Committed),
            "aborted" => Some(Recorded::Aborted),
            _ => None,
        }
    }
}

/// An epoch against the highest seen for its coordinator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fence {
    /// Lower than the highest: 409 `stale_epoch`.
    Stale { highest: u64 },
    /// The highest already: nothing to record.
    Current,
    /// Higher (or the first): record it durably before acting.
    Raise,
    /// Higher by more than the bound (`crate::epoch_bound`): 409 `epoch_too_high`.
    TooHigh,
}

pub fn fence(highest: Option<u64>, epoch: u64, max_jump: Option<u64>) -> Fence {
    match highest {
        Some(highest) if epoch < highest => Fence::Stale { highest },
        Some(highest) if epoch == highest => Fence::Current,
        _ if crate::epoch_bound::jumps_too_far(highest, epoch, max_jump) => Fence::TooHigh,
        _ => Fence::Raise,
    }
}

/// What a prepare finds before doing any work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Known {
    /// Yes again: prepared already, or committed (a repeated prepare of the same attempt).
    VoteYes,
    /// No: aborted before it was prepared (a tombstone).
    VoteNo,
    /// Nothing known: run the work.
    Run,
}

pub fn known(recorded: Option<Recorded>, prepared_now: bool) -> Known {
    match (recorded, prepared_now) {
        (_, true) | (Some(Recorded::Committed), _) => Known::VoteYes,
        (Some(Recorded::Aborted), false) => Known::VoteNo,
        (None, false) => Known::Run,
    }
}

/// `COMMIT PREPARED` found no such gid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitMissing {
    /// It committed earlier: ack.
    AlreadyCommitted,
    /// It was aborted here: refuse (409), never ack.
    Contradiction,
    /// Never prepared here: 409 `not_prepared`, never ack.
    NeverPrepared,
}

pub fn commit_missing(recorded: Option<Recorded>) -> CommitMissing {
    match recorded {
        Some(Recorded::Committed) => CommitMissing::AlreadyCommitted,
        Some(Recorded::Aborted) => CommitMissing::Contradiction,
        None => CommitMissing::NeverPrepared,
    }
}

/// The SQLSTATEs with which the outcome row's insert refuses a gid known already (see
/// `prepare_sql::OUTCOME_SQL`): a unique violation (an outcome row exists) or a not-null violation
/// (prepared in this database now).
pub fn already_known(sqlstate: Option<&str>) -> bool {
    matches!(sqlstate, Some("23505" | "23502"))
}

/// Whether `COMMIT PREPARED` / `ROLLBACK PREPARED` failed because this database holds no such
/// prepared transaction: it does not exist (`42704`), or it was prepared in another database of
/// the server (`0A000`, "prepared transaction belongs to another database"; gids are unique per
/// server, so a gid of ours prepared there is not ours). Either way the outcome row decides.
pub fn gid_missing(sqlstate: Option<&str>) -> bool {
    matches!(sqlstate, Some("42704" | "0A000"))
}

/// `ROLLBACK PREPARED` found no such gid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbortMissing {
    /// A prepare of it runs here now: wait for it, then roll back.
    WaitForPrepare,
    /// Record the tombstone (a no-op if a row exists), then judge by the row.
    Tombstone,
}

pub fn abort_missing(preparing_here: bool) -> AbortMissing {
    if preparing_here {
        AbortMissing::WaitForPrepare
    } else {
        AbortMissing::Tombstone
    }
}

/// After the tombstone insert: the row decides whether the abort is acked.
pub fn abort_acked(recorded: Option<Recorded>) -> bool {
    recorded != Some(Recorded::Committed)
}

/// The decision to carry out for an in-doubt transaction, from the coordinator's answer: only
/// from the coordinator that prepared it, at no lower epoch than it was prepared under, and
/// only `commit` or an explicit `abort`. Anything else: stay prepared, ask again later.
pub fn obey(
    answer: &DecisionQueryResponse,
    prepared_by: &CoordinatorId,
    prepared_at: Epoch,
) -> Option<Decision> {
    if answer.coordinator_id.as_ref() != Some(prepared_by)
        || answer.epoch.is_none_or(|epoch| epoch < prepared_at)
    {
        return None;
    }
    match answer.decision {
        DecisionStatus::Commit => Some(Decision::Commit),
        DecisionStatus::Abort => Some(Decision::Abort),
        DecisionStatus::Pending | DecisionStatus::Unknown => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(
        decision: DecisionStatus,
        coordinator: Option<&str>,
        epoch: Option<u64>,
    ) -> DecisionQueryResponse {
        DecisionQueryResponse {
            decision,
            epoch: epoch.map(Epoch),
            incarnation: None,
            reason: None,
            coordinator_id: coordinator.map(|c| CoordinatorId::new(c).unwrap()),
        }
    }

    #[test]
    fn only_the_preparing_coordinator_at_its_epoch_is_obeyed_and_only_for_commit_or_abort() {
        let c1 = CoordinatorId::new("c1").unwrap();
        let at = Epoch(3);
        use DecisionStatus::*;
        assert_eq!(
            obey(&answer(Commit, Some("c1"), Some(3)), &c1, at),
            Some(Decision::Commit)
        );
        assert_eq!(
            obey(&answer(Abort, Some("c1"), Some(4)), &c1, at),
            Some(Decision::Abort)
        );
        for (status, coordinator, epoch) in [
            (Pending, Some("c1"), Some(3)),
            (Unknown, Some("c1"), Some(3)),
            (Abort, Some("c2"), Some(3)),
            (Commit, Some("c2"), Some(9)),
            (Abort, None, Some(3)),
            (Abort, Some("c1"), Some(2)),
            (Abort, Some("c1"), None),
        ] {
            assert_eq!(
                obey(&answer(status, coordinator, epoch), &c1, at),
                None,
                "{status:?} {coordinator:?} {epoch:?}"
            );
        }
    }

    #[test]
    fn a_missing_gid_is_acked_only_when_its_row_proves_the_outcome() {
        assert_eq!(
            commit_missing(Some(Recorded::Committed)),
            CommitMissing::AlreadyCommitted
        );
        assert_eq!(commit_missing(None), CommitMissing::NeverPrepared);
        assert_eq!(
            commit_missing(Some(Recorded::Aborted)),
            CommitMissing::Contradiction
        );
        assert!(abort_acked(None));
        assert!(abort_acked(Some(Recorded::Aborted)));
        assert!(!abort_acked(Some(Recorded::Committed)));
        assert_eq!(abort_missing(true), AbortMissing::WaitForPrepare);
        assert_eq!(abort_missing(false), AbortMissing::Tombstone);
    }

    #[test]
    fn sqlstates_are_read_as_documented() {
        use tokio_postgres::error::SqlState;
        assert!(already_known(Some(SqlState::UNIQUE_VIOLATION.code())));
        assert!(already_known(Some(SqlState::NOT_NULL_VIOLATION.code())));
        assert!(!already_known(Some(SqlState::LOCK_NOT_AVAILABLE.code())));
        assert!(!already_known(None));
        assert!(gid_missing(Some(SqlState::UNDEFINED_OBJECT.code())));
        assert!(gid_missing(Some(SqlState::FEATURE_NOT_SUPPORTED.code())));
        // Busy (another session is finishing it) or a lost connection: not missing.
        assert!(!gid_missing(Some(
            SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE.code()
        )));
        assert!(!gid_missing(None));
    }

    #[test]
    fn prepares_and_epochs() {
        assert_eq!(known(None, false), Known::Run);
        assert_eq!(known(None, true), Known::VoteYes);
        assert_eq!(known(Some(Recorded::Committed), false), Known::VoteYes);
        assert_eq!(known(Some(Recorded::Aborted), false), Known::VoteNo);
        assert_eq!(fence(None, 1, Some(10)), Fence::Raise);
        assert_eq!(fence(Some(2), 3, Some(10)), Fence::Raise);
        assert_eq!(fence(Some(3), 3, Some(10)), Fence::Current);
        assert_eq!(fence(Some(3), 2, Some(10)), Fence::Stale { highest: 3 });
        assert_eq!(fence(Some(3), u64::MAX, Some(10)), Fence::TooHigh);
        assert_eq!(fence(None, 11, Some(10)), Fence::TooHigh);
        assert_eq!(fence(Some(3), u64::MAX, None), Fence::Raise);
        assert_eq!(Recorded::parse("committed"), Some(Recorded::Committed));
        assert_eq!(Recorded::parse("x"), None);
    }
}
