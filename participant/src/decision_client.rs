//! The participant's client to the coordinator's decision route, shared by the key-value and
//! the PostgreSQL backends. Owns the outbound policy of that call (via `net::outbound`): no
//! redirects, the answer capped at 1 MiB, connect and total time bounded by the decision
//! timeout, `https://` trusting only `--tls-ca`. Must never decide anything from a failed call:
//! every failure is "ask again later".

use std::sync::Arc;
use std::time::Duration;

use net::outbound::{AnswerError, BuildError, Limits, read_answer};
use protocol::DecisionQueryResponse;

/// Why a decision query gave no answer to act on.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error("no answer: {0}")]
    Send(reqwest::Error),
    #[error(transparent)]
    Answer(#[from] AnswerError),
    #[error("answered HTTP {status}")]
    Status { status: u16 },
    #[error("answer malformed: {0}")]
    Malformed(serde_json::Error),
}

/// The client for decision queries: each call bounded by `timeout_ms` in all.
pub fn build(
    timeout_ms: u64,
    tls: Option<Arc<rustls::ClientConfig>>,
) -> Result<reqwest::Client, BuildError> {
    net::outbound::reqwest_client(&limits(timeout_ms), tls)
}

fn limits(timeout_ms: u64) -> Limits {
    Limits::service(Duration::from_millis(timeout_ms.max(1)))
}

/// GETs `url` (a decision query) with the peer token if there is one, and decodes the answer.
pub async fn ask(
    client: &reqwest::Client,
    url: &str,
    keys: &protocol::auth::KeyRing,
) -> Result<DecisionQueryResponse, QueryError> {
    let mut request = client.get(url);
    if let Some(authorization) = keys.peer_authorization() {
        request = request.header(reqwest::header::AUTHORIZATION, authorization);
    }
    let response = request.send().await.map_err(QueryError::Send)?;
    let (status, body) = read_answer(response, net::outbound::SERVICE_ANSWER_BYTES_MAX).await?;
    if !status.is_success() {
        return Err(QueryError::Status {
            status: status.as_u16(),
        });
    }
    serde_json::from_slice(&body).map_err(QueryError::Malformed)
}
