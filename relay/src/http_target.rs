//! Delivering to an HTTP receiver: `POST` the configured URL with the JSON
//! `protocol::outbox::Delivery` and the header `Idempotency-Key: <event_id>`, and classify the
//! answer (docs/workflows.md, "The relay: answers"): 2xx delivered (the body is the answer),
//! 408/429/5xx, a timeout or no connection unknown, any other 4xx refused for good.

use protocol::outbox::{Delivery, IDEMPOTENCY_KEY_HEADER, OutboxEntry};
use reqwest::StatusCode;
use serde_json::Value;

use crate::targets::Answer;

/// Most bytes of a receiver's answer kept (it is recorded in the participant's outbox).
const ANSWER_BYTES_MAX: usize = 64 << 10;

/// One delivery attempt of `entry` (from `source`'s outbox) to `url`.
pub async fn deliver(
    client: &reqwest::Client,
    url: &str,
    source: &str,
    entry: &OutboxEntry,
) -> Answer {
    let delivery = Delivery {
        event_id: entry.event_id.clone(),
        aggregate: entry.aggregate.clone(),
        seq: entry.seq,
        kind: entry.kind.clone(),
        body: entry.body.clone(),
        source: source.to_string(),
    };
    let request = client
        .post(url)
        .header(IDEMPOTENCY_KEY_HEADER, &entry.event_id)
        .json(&delivery);
    let response = match request.send().await {
        Ok(response) => response,
        Err(error) => return Answer::Unknown(format!("no answer from {url}: {error}")),
    };
    match net::outbound::read_answer(response, ANSWER_BYTES_MAX).await {
        Ok((status, bytes)) => classify(status, &bytes),
        Err(error) => Answer::Unknown(format!("the answer of {url} could not be read: {error}")),
    }
}

/// The shared design's classification of a receiver's answer.
pub fn classify(status: StatusCode, body: &[u8]) -> Answer {
    if status.is_success() {
        return Answer::Delivered(serde_json::from_slice(body).unwrap_or(Value::Null));
    }
    let text = String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned();
    let unknown = status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS
        || status.is_server_error()
        || !status.is_client_error();
    if unknown {
        Answer::Unknown(format!("{status}: {text}"))
    } else {
        Answer::Refused(format!("{status}: {text}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn answers_are_classified_as_the_design_says() {
        assert_eq!(
            classify(StatusCode::OK, br#"{"authorized":true}"#),
            Answer::Delivered(json!({"authorized": true}))
        );
        assert_eq!(
            classify(StatusCode::NO_CONTENT, b""),
            Answer::Delivered(Value::Null)
        );
        for status in [408u16, 429, 500, 502, 503, 504] {
            let status = StatusCode::from_u16(status).unwrap();
            assert!(
                matches!(classify(status, b"x"), Answer::Unknown(_)),
                "{status}"
            );
        }
        for status in [400u16, 401, 403, 404, 409, 422] {
            let status = StatusCode::from_u16(status).unwrap();
            assert!(
                matches!(classify(status, b"x"), Answer::Refused(_)),
                "{status}"
            );
        }
    }
}
