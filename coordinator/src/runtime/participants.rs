//! The HTTP calls to participants (design 3.2), and how each answer is classified. URLs come
//! only from the configuration.

use std::time::Duration;

use protocol::limits::REASON_LEN_MAX;

use crate::http_client::{Answer, CallError, Endpoint};
use protocol::{
    AckResponse, Decision, DecisionRequest, ErrorBody, ErrorCode, PrepareRequest, Vote, VoteKind,
    routes,
};

/// Why a phase-two delivery did not produce an acknowledgement. Every one of them means "try
/// again later"; none of them counts as an ack.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeliveryError {
    #[error("no answer: {0}")]
    Transport(String),
    #[error("participant says our epoch is stale: {0}")]
    StaleEpoch(String),
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

/// Sends a prepare and turns whatever comes back into a vote. Only a 200 with a well-formed
/// `{"vote":"yes"}` is a yes.
pub async fn prepare(
    endpoint: &Endpoint,
    request: &PrepareRequest,
    timeout: Duration,
) -> (VoteKind, Option<String>) {
    let json = match serde_json::to_vec(request) {
        Ok(json) => json,
        Err(e) => {
            return (
                VoteKind::Error,
                Some(format!("cannot encode the prepare: {e}")),
            );
        }
    };
    let answer = match endpoint.post_json(routes::PREPARE, json, timeout).await {
        Ok(answer) => answer,
        Err(CallError::Timeout(_)) => return (VoteKind::Timeout, None),
        Err(e) => return (VoteKind::Error, Some(e.to_string())),
    };
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
    let Answer { status, body } = endpoint
        .post_json(route, json, timeout)
        .await
        .map_err(|e| DeliveryError::Transport(e.to_string()))?;
    let text = || truncate(String::from_utf8_lossy(&body).into_owned(), REASON_LEN_MAX);
    if status == 200 {
        return match serde_json::from_slice::<AckResponse>(&body) {
            Ok(AckResponse { ack: true }) => Ok(()),
            Ok(AckResponse { ack: false }) => Err(DeliveryError::Malformed(text())),
            Err(e) => Err(DeliveryError::Malformed(format!("{e}: {}", text()))),
        };
    }
    match serde_json::from_slice::<ErrorBody>(&body) {
        Ok(error) if error.error == ErrorCode::StaleEpoch => {
            Err(DeliveryError::StaleEpoch(error.message))
        }
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
    fn truncate_respects_char_boundaries() {
        assert_eq!(truncate("héllo".into(), 2), "h");
        assert_eq!(truncate("abc".into(), 10), "abc");
    }
}
