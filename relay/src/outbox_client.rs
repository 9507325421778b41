//! A participant's outbox as the relay calls it: the open listing and the two reports, each
//! turned into the planner's event. Calls carry the relay's peer token (the reports are Peer
//! routes); answers are read under the outbound policy (no redirects, capped).

use protocol::outbox::{AttemptReport, DeliveredReport, OUTBOX_LIST_LIMIT_MAX, OutboxList};
use protocol::routes;
use reqwest::StatusCode;
use serde_json::Value;

use crate::credentials::Authed;
use crate::plan::{Event, ReportResult};

/// The participant's listing of open intents, as the planner's event.
pub async fn list(client: &Authed, participant: &str, base: &str, generation: u64) -> Event {
    let url = format!(
        "{base}{}?state=heads&limit={OUTBOX_LIST_LIMIT_MAX}",
        routes::OUTBOX
    );
    let failed = Event::ListFailed {
        participant: participant.to_string(),
        generation,
    };
    let answer = match client.get(&url).send().await {
        Ok(response) => {
            net::outbound::read_answer(response, net::outbound::SERVICE_ANSWER_BYTES_MAX * 16).await
        }
        Err(error) => {
            tracing::warn!(participant, %error, "the outbox listing failed");
            return failed;
        }
    };
    match answer {
        Ok((StatusCode::OK, bytes)) => match serde_json::from_slice::<OutboxList>(&bytes) {
            Ok(list) => Event::Listed {
                participant: participant.to_string(),
                generation,
                list,
            },
            Err(error) => {
                tracing::warn!(participant, %error, "the outbox listing is not a listing");
                failed
            }
        },
        Ok((status, bytes)) => {
            tracing::warn!(participant, %status, answer = %String::from_utf8_lossy(&bytes), "the outbox listing was refused");
            failed
        }
        Err(error) => {
            tracing::warn!(participant, %error, "the outbox listing could not be read");
            failed
        }
    }
}

/// `POST .../delivered` with the receiver's answer.
pub async fn report_delivered(
    client: &Authed,
    base: &str,
    event_id: &str,
    answer: Value,
) -> ReportResult {
    let url = format!(
        "{base}{}",
        routes::OUTBOX_DELIVERED.replace("{event_id}", event_id)
    );
    post(client, &url, &DeliveredReport { answer }).await
}

/// `POST .../attempt`: an attempt that delivered nothing known (or, `permanent`, a refusal).
pub async fn report_attempt(
    client: &Authed,
    base: &str,
    event_id: &str,
    error: String,
    permanent: bool,
) -> ReportResult {
    let url = format!(
        "{base}{}",
        routes::OUTBOX_ATTEMPT.replace("{event_id}", event_id)
    );
    post(client, &url, &AttemptReport { error, permanent }).await
}

async fn post(client: &Authed, url: &str, body: &impl serde::Serialize) -> ReportResult {
    let response = match client.post(url).json(body).send().await {
        Ok(response) => response,
        Err(error) => {
            tracing::warn!(url, %error, "a report got no answer");
            return ReportResult::Failed;
        }
    };
    match net::outbound::read_answer(response, net::outbound::SERVICE_ANSWER_BYTES_MAX).await {
        Ok((status, _)) if status.is_success() => ReportResult::Accepted,
        // The participant disagrees (out of order, settled otherwise, unknown id): the relay
        // lists again and follows what the participant says.
        Ok((status, bytes)) if matches!(status, StatusCode::CONFLICT | StatusCode::NOT_FOUND) => {
            tracing::info!(url, %status, answer = %String::from_utf8_lossy(&bytes), "a report was refused");
            ReportResult::Refused
        }
        Ok((status, bytes)) => {
            tracing::warn!(url, %status, answer = %String::from_utf8_lossy(&bytes), "a report failed");
            ReportResult::Failed
        }
        Err(error) => {
            tracing::warn!(url, %error, "a report's answer could not be read");
            ReportResult::Failed
        }
    }
}
