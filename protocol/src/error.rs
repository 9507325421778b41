//! The one error body of the contract: `{"error": "<snake_case_code>", "message": "..."}`.

use serde::{Deserialize, Serialize};

/// Every error code either service answers with. The HTTP status that goes with each is part
/// of the contract (`ErrorCode::status`), so both services and the docs agree on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The body is not JSON, or JSON of the wrong shape or types.
    MalformedJson,
    /// The request's content type is not `application/json`.
    UnsupportedMediaType,
    /// The body is larger than `BODY_BYTES_MAX`.
    BodyTooLarge,
    /// A participant payload is larger than `PAYLOAD_BYTES_MAX`.
    PayloadTooLarge,
    /// A transaction id or name breaks the id rules.
    InvalidId,
    /// The participant list is empty.
    NoParticipants,
    /// The participant list names the same participant twice.
    DuplicateParticipant,
    /// More than `PARTICIPANTS_MAX` participants.
    TooManyParticipants,
    /// A participant name the coordinator has not been configured with.
    UnknownParticipant,
    /// `timeout_ms` outside `TIMEOUT_MS_MIN..=TIMEOUT_MS_MAX`.
    InvalidTimeout,
    /// A query parameter is out of range or unknown.
    InvalidQuery,
    /// A participant payload that the participant cannot understand.
    InvalidPayload,
    /// The id is known with a different request body.
    IdConflict,
    /// No transaction or key with that id.
    NotFound,
    /// No such route.
    UnknownRoute,
    /// The route exists, but not for this method.
    MethodNotAllowed,
    /// A message from a coordinator epoch older than one already seen.
    StaleEpoch,
    /// A commit for a transaction this participant never prepared.
    NotPrepared,
    /// A message whose epoch another run (incarnation) of the same coordinator id already
    /// claimed: the sender runs on a rolled-back copy of that coordinator's log.
    IncarnationConflict,
    /// The coordinator learned that its log is behind what participants have seen (it was
    /// restored from a backup or rolled back): it takes no new work.
    LogBehind,
    /// Admission control: a participant named in the request holds as much work in this
    /// coordinator as its bounds allow (an outage, most likely). Nothing was begun; the answer
    /// carries `Retry-After`.
    Overloaded,
    /// Operator resolve: the coordinator decides this attempt itself (it is live, decided,
    /// or presumed aborted), or it was resolved already; nothing to resolve.
    NotInDoubt,
    /// Operator resolve: the decision would contradict a logged decision or a participant's
    /// state (the answer carries the evidence).
    ContradictsEvidence,
    /// Operator resolve: the evidence cannot prove the decision safe (a participant could not
    /// be asked, forgot the attempt, or the attempt's participants are not known).
    InsufficientEvidence,
    /// Operator resolve: the attempt belongs to another transaction id (in this coordinator's
    /// records, or as a participant holds it); it is only resolved under its own.
    AttemptIdMismatch,
    /// Operator resolve: this run has not given out that attempt id (a position past the
    /// last one): nothing can be in doubt under it.
    AttemptNotIssued,
    /// Operator resolve: the attempt id is not one of this coordinator's.
    ForeignAttempt,
    /// Operator retry: nothing is pending for that transaction or participant.
    NotPending,
    /// An operator action without an operator name or reason, or with one too long.
    InvalidOperator,
    /// A lease is held by another holder (the body says who and for how long).
    LeaseHeld,
    /// A renew or release for a lease that expired, was released or superseded, or that
    /// another holder holds under this token: it is never revived.
    LeaseLost,
    /// A lease TTL outside the documented bounds (zero, or over `LEASE_TTL_MS_MAX`).
    InvalidTtl,
    /// A fenced write whose token is lower than one already accepted for its resource (the
    /// body carries `highest`).
    StaleToken,
    /// A fenced write under an op id already used for another write (another key, value,
    /// resource or token): the first write's answer is not this one's.
    OpIdConflict,
    /// A fenced write to a key that a prepared transaction holds; retry after its decision.
    KeyLocked,
    /// A saga op query (`GET /saga/ops/{op_id}`) that names no coordinator id, about a step
    /// some coordinator's op is recorded for: the participant cannot tell whose it is, so it
    /// answers nothing (the asker keeps the op unknown and asks again).
    CoordinatorIdRequired,
    /// Recovery has not finished.
    NotReady,
    /// This coordinator of an HA group does not lead it now (it follows, or its etcd lease
    /// lapsed): the body's `leader` names the leader's address when one is known. Clients try
    /// the next address of the group (docs/ha.md).
    NotLeader,
    /// A coordinator group's follower refused a replication message: its copy is frozen (it
    /// campaigns or leads), needs a base backup, or the message does not decode (docs/ha.md).
    ReplicaRefused,
    /// The log failed (write or fsync error); the process takes no more writes.
    LogFailed,
    /// A bug or an unexpected failure; the message says what.
    Internal,
    /// No credentials, or credentials that are not (or no longer) valid (docs/security.md).
    Unauthorized,
    /// Valid credentials of a kind this route does not take (a client token on an operator
    /// route, say).
    Forbidden,
    /// A state-changing request whose `Origin` is another site's (docs/security.md,
    /// "Browsers").
    ForbiddenOrigin,
    /// A `Host` that is not a loopback name, at a server on a loopback address without tokens
    /// (DNS rebinding; docs/security.md, "Browsers").
    ForbiddenHost,
    /// Too many requests of this kind from this caller; try again later.
    RateLimited,
    /// An epoch more than the allowed jump above the highest this participant holds, from a
    /// caller that could not prove it is a peer.
    EpochTooHigh,
    /// A fence claim without a valid proof from the lease service, at a participant that
    /// checks proofs (docs/leases.md, "Tokens the resource can verify").
    InvalidFenceProof,
    /// A fencing token more than the allowed jump above every token the participant accepted,
    /// at a participant without a fence key.
    TokenTooHigh,
    /// An operator's fence reset whose `from` is no longer the resource's highest token.
    FenceChanged,
    /// An operator's fence reset that would not lower the highest token.
    InvalidReset,
    /// A write whose `check` op found its key at another version (a workflow transition from a
    /// state the aggregate is no longer in): nothing was written and no intent recorded.
    ConditionFailed,
    /// A relay's delivery report for an intent whose aggregate still has an earlier intent open:
    /// intents of one aggregate are delivered in order, so the claim is refused.
    IntentOutOfOrder,
}

impl ErrorCode {
    /// The HTTP status that goes with this code.
    pub fn status(self) -> u16 {
        match self {
            ErrorCode::MalformedJson => 400,
            ErrorCode::InvalidQuery => 400,
            ErrorCode::UnsupportedMediaType => 415,
            ErrorCode::BodyTooLarge => 413,
            ErrorCode::PayloadTooLarge => 413,
            ErrorCode::InvalidId => 422,
            ErrorCode::NoParticipants => 422,
            ErrorCode::DuplicateParticipant => 422,
            ErrorCode::TooManyParticipants => 422,
            ErrorCode::UnknownParticipant => 422,
            ErrorCode::InvalidTimeout => 422,
            ErrorCode::InvalidPayload => 422,
            ErrorCode::IdConflict => 409,
            ErrorCode::StaleEpoch => 409,
            ErrorCode::NotPrepared => 409,
            ErrorCode::IncarnationConflict => 409,
            ErrorCode::LogBehind => 503,
            ErrorCode::Overloaded => 503,
            ErrorCode::NotFound => 404,
            ErrorCode::UnknownRoute => 404,
            ErrorCode::MethodNotAllowed => 405,
            ErrorCode::NotInDoubt => 409,
            ErrorCode::ContradictsEvidence => 409,
            ErrorCode::InsufficientEvidence => 409,
            ErrorCode::AttemptIdMismatch => 409,
            ErrorCode::AttemptNotIssued => 409,
            ErrorCode::ForeignAttempt => 409,
            ErrorCode::NotPending => 409,
            ErrorCode::InvalidOperator => 422,
            ErrorCode::LeaseHeld => 409,
            ErrorCode::LeaseLost => 409,
            ErrorCode::InvalidTtl => 422,
            ErrorCode::StaleToken => 409,
            ErrorCode::OpIdConflict => 409,
            ErrorCode::KeyLocked => 409,
            ErrorCode::CoordinatorIdRequired => 422,
            ErrorCode::NotReady => 503,
            ErrorCode::NotLeader => 503,
            ErrorCode::ReplicaRefused => 409,
            ErrorCode::LogFailed => 503,
            ErrorCode::Internal => 500,
            ErrorCode::Unauthorized => 401,
            ErrorCode::Forbidden => 403,
            ErrorCode::ForbiddenOrigin => 403,
            ErrorCode::ForbiddenHost => 403,
            ErrorCode::RateLimited => 429,
            ErrorCode::EpochTooHigh => 409,
            ErrorCode::InvalidFenceProof => 409,
            ErrorCode::TokenTooHigh => 409,
            ErrorCode::FenceChanged => 409,
            ErrorCode::InvalidReset => 422,
            ErrorCode::ConditionFailed => 409,
            ErrorCode::IntentOutOfOrder => 409,
        }
    }

    /// The snake_case spelling used on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::MalformedJson => "malformed_json",
            ErrorCode::UnsupportedMediaType => "unsupported_media_type",
            ErrorCode::BodyTooLarge => "body_too_large",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::InvalidId => "invalid_id",
            ErrorCode::NoParticipants => "no_participants",
            ErrorCode::DuplicateParticipant => "duplicate_participant",
            ErrorCode::TooManyParticipants => "too_many_participants",
            ErrorCode::UnknownParticipant => "unknown_participant",
            ErrorCode::InvalidTimeout => "invalid_timeout",
            ErrorCode::InvalidQuery => "invalid_query",
            ErrorCode::InvalidPayload => "invalid_payload",
            ErrorCode::IdConflict => "id_conflict",
            ErrorCode::NotFound => "not_found",
            ErrorCode::UnknownRoute => "unknown_route",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::StaleEpoch => "stale_epoch",
            ErrorCode::NotPrepared => "not_prepared",
            ErrorCode::IncarnationConflict => "incarnation_conflict",
            ErrorCode::LogBehind => "log_behind",
            ErrorCode::Overloaded => "overloaded",
            ErrorCode::NotInDoubt => "not_in_doubt",
            ErrorCode::ContradictsEvidence => "contradicts_evidence",
            ErrorCode::InsufficientEvidence => "insufficient_evidence",
            ErrorCode::AttemptIdMismatch => "attempt_id_mismatch",
            ErrorCode::AttemptNotIssued => "attempt_not_issued",
            ErrorCode::ForeignAttempt => "foreign_attempt",
            ErrorCode::NotPending => "not_pending",
            ErrorCode::InvalidOperator => "invalid_operator",
            ErrorCode::LeaseHeld => "lease_held",
            ErrorCode::LeaseLost => "lease_lost",
            ErrorCode::InvalidTtl => "invalid_ttl",
            ErrorCode::StaleToken => "stale_token",
            ErrorCode::OpIdConflict => "op_id_conflict",
            ErrorCode::KeyLocked => "key_locked",
            ErrorCode::CoordinatorIdRequired => "coordinator_id_required",
            ErrorCode::NotReady => "not_ready",
            ErrorCode::NotLeader => "not_leader",
            ErrorCode::ReplicaRefused => "replica_refused",
            ErrorCode::LogFailed => "log_failed",
            ErrorCode::Internal => "internal",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::ForbiddenOrigin => "forbidden_origin",
            ErrorCode::ForbiddenHost => "forbidden_host",
            ErrorCode::RateLimited => "rate_limited",
            ErrorCode::EpochTooHigh => "epoch_too_high",
            ErrorCode::InvalidFenceProof => "invalid_fence_proof",
            ErrorCode::TokenTooHigh => "token_too_high",
            ErrorCode::FenceChanged => "fence_changed",
            ErrorCode::InvalidReset => "invalid_reset",
            ErrorCode::ConditionFailed => "condition_failed",
            ErrorCode::IntentOutOfOrder => "intent_out_of_order",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The JSON body of every error answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorCode,
    pub message: String,
    /// With `stale_epoch`, `incarnation_conflict` and `epoch_too_high` from a participant: the
    /// highest epoch it holds for the sender's coordinator id. A coordinator that learns its
    /// epoch was passed or claimed by another run logs an epoch above it (docs/protocol.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub highest_epoch: Option<crate::ids::Epoch>,
    /// With `not_leader`: the base URL of the group's leader, when this node knows one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<String>,
}

impl ErrorBody {
    pub fn new(error: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            error,
            message: message.into(),
            highest_epoch: None,
            leader: None,
        }
    }

    /// Names the group's leader (see `leader`).
    pub fn with_leader(mut self, leader: impl Into<String>) -> Self {
        self.leader = Some(leader.into());
        self
    }

    /// Names the highest epoch the answering participant holds (see `highest_epoch`).
    pub fn with_highest_epoch(mut self, epoch: crate::ids::Epoch) -> Self {
        self.highest_epoch = Some(epoch);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_spelling_matches_as_str() {
        let all = [
            ErrorCode::MalformedJson,
            ErrorCode::UnsupportedMediaType,
            ErrorCode::BodyTooLarge,
            ErrorCode::PayloadTooLarge,
            ErrorCode::InvalidId,
            ErrorCode::NoParticipants,
            ErrorCode::DuplicateParticipant,
            ErrorCode::TooManyParticipants,
            ErrorCode::UnknownParticipant,
            ErrorCode::InvalidTimeout,
            ErrorCode::InvalidQuery,
            ErrorCode::InvalidPayload,
            ErrorCode::IdConflict,
            ErrorCode::NotFound,
            ErrorCode::UnknownRoute,
            ErrorCode::MethodNotAllowed,
            ErrorCode::StaleEpoch,
            ErrorCode::NotPrepared,
            ErrorCode::IncarnationConflict,
            ErrorCode::LogBehind,
            ErrorCode::Overloaded,
            ErrorCode::NotInDoubt,
            ErrorCode::ContradictsEvidence,
            ErrorCode::InsufficientEvidence,
            ErrorCode::AttemptIdMismatch,
            ErrorCode::AttemptNotIssued,
            ErrorCode::ForeignAttempt,
            ErrorCode::NotPending,
            ErrorCode::InvalidOperator,
            ErrorCode::LeaseHeld,
            ErrorCode::LeaseLost,
            ErrorCode::InvalidTtl,
            ErrorCode::StaleToken,
            ErrorCode::OpIdConflict,
            ErrorCode::KeyLocked,
            ErrorCode::CoordinatorIdRequired,
            ErrorCode::NotReady,
            ErrorCode::NotLeader,
            ErrorCode::ReplicaRefused,
            ErrorCode::LogFailed,
            ErrorCode::Internal,
            ErrorCode::Unauthorized,
            ErrorCode::Forbidden,
            ErrorCode::ForbiddenOrigin,
            ErrorCode::ForbiddenHost,
            ErrorCode::RateLimited,
            ErrorCode::EpochTooHigh,
            ErrorCode::InvalidFenceProof,
            ErrorCode::TokenTooHigh,
            ErrorCode::FenceChanged,
            ErrorCode::InvalidReset,
            ErrorCode::ConditionFailed,
            ErrorCode::IntentOutOfOrder,
        ];
        for code in all {
            let json = serde_json::to_string(&code).unwrap();
            assert_eq!(json, format!("\"{}\"", code.as_str()));
            assert_eq!(serde_json::from_str::<ErrorCode>(&json).unwrap(), code);
            assert!((400..600).contains(&code.status()));
        }
    }

    #[test]
    fn error_body_round_trips() {
        let body = ErrorBody::new(ErrorCode::StaleEpoch, "epoch 3 < 4");
        let json = serde_json::to_string(&body).unwrap();
        assert_eq!(json, r#"{"error":"stale_epoch","message":"epoch 3 < 4"}"#);
        assert_eq!(serde_json::from_str::<ErrorBody>(&json).unwrap(), body);
    }
}
