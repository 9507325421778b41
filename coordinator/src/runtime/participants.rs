//! The HTTP calls to participants (design 3.2), and how each answer is classified. URLs come
//! only from the configuration.

use std::time::Duration;

use protocol::limits::REASON_LEN_MAX;

use crate::http_client::{Answer, CallError, Endpoint};
use protocol::{
    AckResponse, Decision, DecisionRequest, Epoch, ErrorBody, ErrorCode, PrepareRequest, Vote,
    VoteKind, routes,
};

/// Why a phase-two delivery did not produce an acknowledgement. Every one of them means "try
/// again later"; none of them counts as an ack.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeliveryError {
    #[error("no answer: {0}")]
    Transport(String),
    /// `stale_epoch` or `incarnation_conflict`: another run of this coordinator id reached
    /// further than this log knows.
    #[error("participant fenced this run out: {0}")]
    Fenced(FenceRefusal),
    #[error("participant never prepared this transaction (not_prepared): {0}")]
    NotPrepared(String),
    #[error("HTTP {status}: {body}")]
    Status { status: u16, body: String },
    #[error("answer is not an acknowledgement: {0}")]
    Malformed(String),
}

/// Cuts `text` to at most `max` bytes on a character boundary.
pub fn truncate(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// A participant's refusal of a message this run sent that fences this run out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FenceRefusal {
    pub code: ErrorCode,
    pub message: String,
    /// The highest epoch the participant holds for this coordinator id, when it says.
    pub highest: Option<Epoch>,
}

impl std::fmt::Display for FenceRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

/// A participant's answer that fences this coordinator out (`stale_epoch`,
/// `incarnation_conflict`): proof that another run of this id reached further than this log.
pub fn fenced(status: u16, body: &[u8]) -> Option<FenceRefusal> {
    if status == 200 {
        return None;
    }
    match serde_json::from_slice::<ErrorBody>(body) {
        Ok(error)
            if matches!(
                error.error,
                ErrorCode::StaleEpoch | ErrorCode::IncarnationConflict
            ) =>
        {
            Some(FenceRefusal {
                code: error.error,
                message: truncate(error.message, REASON_LEN_MAX),
                highest: error.highest_epoch,
            })
        }
        Ok(_) | Err(_) => None,
    }
}

/// What a prepare came back with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrepareOutcome {
    pub vote: VoteKind,
    pub reason: Option<String>,
    /// Set when the participant fenced this run out (see [`fenced`]).
    pub fenced: Option<FenceRefusal>,
}

/// Sends a prepare and turns whatever comes back into a vote. Only a 200 with a well-formed
/// `{"vote":"yes"}` is a yes.
pub async fn prepare(
    endpoint: &Endpoint,
    request: &PrepareRequest,
    timeout: Duration,
) -> PrepareOutcome {
    match prepare_call(endpoint, request, timeout).await {
        Ok(answer) => prepare_outcome(&answer),
        Err((vote, reason)) => PrepareOutcome {
            vote,
            reason,
            fenced: None,
        },
    }
}

/// A prepare's answer (alone, or one line of a batch) as a vote.
pub fn prepare_outcome(answer: &Answer) -> PrepareOutcome {
    let fenced = fenced(answer.status, &answer.body);
    let (vote, reason) = vote_of(answer);
    PrepareOutcome {
        vote,
        reason,
        fenced,
    }
}

async fn prepare_call(
    endpoint: &Endpoint,
    request: &PrepareRequest,
    timeout: Duration,
) -> Result<Answer, (VoteKind, Option<String>)> {
    let json = serde_json::to_vec(request).map_err(|e| {
        (
            VoteKind::Error,
            Some(format!("cannot encode the prepare: {e}")),
        )
    })?;
    match endpoint.post_json(routes::PREPARE, json, timeout).await {
        Ok(answer) => Ok(answer),
        Err(CallError::Timeout(_)) => Err((VoteKind::Timeout, None)),
        Err(e) => Err((VoteKind::Error, Some(e.to_string()))),
    }
}

fn vote_of(answer: &Answer) -> (VoteKind, Option<String>) {
    if answer.status != 200 {
        let text = String::from_utf8_lossy(&answer.body);
        return (
            VoteKind::Error,
            Some(truncate(
                format!("HTTP {}: {text}", answer.status),
                REASON_LEN_MAX,
            )),
        );
    }
    match serde_json::from_slice::<Vote>(&answer.body) {
        Ok(Vote::Yes) => (VoteKind::Yes, None),
        Ok(Vote::No { reason }) => (VoteKind::No, Some(truncate(reason, REASON_LEN_MAX))),
        Err(e) => (VoteKind::Error, Some(format!("malformed vote: {e}"))),
    }
}

/// Sends commit or abort; `Ok` only for a 200 `{"ack":true}`.
pub async fn deliver(
    endpoint: &Endpoint,
    decision: Decision,
    request: &DecisionRequest,
    timeout: Duration,
) -> Result<(), DeliveryError> {
    let route = match decision {
        Decision::Commit => routes::COMMIT,
        Decision::Abort => routes::ABORT,
    };
    let json = serde_json::to_vec(request)
        .map_err(|e| DeliveryError::Transport(format!("cannot encode the decision: {e}")))?;
    let answer = endpoint
        .post_json(route, json, timeout)
        .await
        .map_err(|e| DeliveryError::Transport(e.to_string()))?;
    delivery_result(answer)
}

/// A decision's answer (alone, or one line of a batch): `Ok` only for a 200 `{"ack":true}`.
pub fn delivery_result(answer: Answer) -> Result<(), DeliveryError> {
    let Answer { status, body } = answer;
    let text = || truncate(String::from_utf8_lossy(&body).into_owned(), REASON_LEN_MAX);
    if status == 200 {
        return match serde_json::from_slice::<AckResponse>(&body) {
            Ok(AckResponse { ack: true }) => Ok(()),
            Ok(AckResponse { ack: false }) => Err(DeliveryError::Malformed(text())),
            Err(e) => Err(DeliveryError::Malformed(format!("{e}: {}", text()))),
        };
    }
    if let Some(refusal) = fenced(status, &body) {
        return Err(DeliveryError::Fenced(refusal));
    }
    match serde_json::from_slice::<ErrorBody>(&body) {
        Ok(error) if error.error == ErrorCode::NotPrepared => {
            Err(DeliveryError::NotPrepared(error.message))
        }
        Ok(_) | Err(_) => Err(DeliveryError::Status {
            status,
            body: text(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_fencing_refusals_fence_and_they_carry_the_highest_epoch() {
        let body = |e: ErrorBody| serde_json::to_vec(&e).unwrap();
        let stale = body(ErrorBody::new(ErrorCode::StaleEpoch, "old").with_highest_epoch(Epoch(9)));
        assert_eq!(
            fenced(409, &stale),
            Some(FenceRefusal {
                code: ErrorCode::StaleEpoch,
                message: "old".into(),
                highest: Some(Epoch(9))
            })
        );
        let conflict = body(ErrorBody::new(ErrorCode::IncarnationConflict, "claimed"));
        assert_eq!(fenced(409, &conflict).and_then(|f| f.highest), None);
        assert!(fenced(409, &conflict).is_some());
        assert_eq!(fenced(200, &stale), None, "a 200 is never a refusal");
        let other = body(ErrorBody::new(ErrorCode::NotPrepared, "no"));
        assert_eq!(fenced(409, &other), None);
        assert_eq!(fenced(409, b"not json"), None);
    }

    #[test]
    fn truncate_respects_char_boundaries() {
        assert_eq!(truncate("héllo".into(), 2), "h");
        assert_eq!(truncate("abc".into(), 10), "abc");
    }
}
