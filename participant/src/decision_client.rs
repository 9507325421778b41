//! The participant's client to the coordinator's decision route, shared by the key-value and
//! the PostgreSQL backends. Owns the outbound policy of that call (via `net::outbound`): no
//! redirects, the answer capped at 1 MiB, connect and total time bounded by the decision
//! timeout, `https://` trusting only `--tls-ca`. Must never decide anything from a failed call:
//! every failure is "ask again later".
//!
//! The coordinator may be a group (issue 27): [`Coordinators`] asks the address that answered
//! last, and on no answer or a 503 `not_leader`/`not_ready` the leader that answer names (if it
//! is one of the configured addresses) and then the others in turn, once each per query; the
//! resolver's backoff is the pause between rounds.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use net::outbound::{AnswerError, BuildError, Limits, read_answer};
use protocol::{DecisionQueryResponse, ErrorBody, ErrorCode};

/// Why a decision query gave no answer to act on.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error("no answer: {0}")]
    Send(reqwest::Error),
    #[error(transparent)]
    Answer(#[from] AnswerError),
    #[error("answered HTTP {status}")]
    Status { status: u16 },
    /// 503 `not_leader` or `not_ready`: this coordinator of the group cannot answer now.
    #[error("{}: {}{}", .0.error, .0.message, .0.leader.as_deref().map(|l| format!(" (leader: {l})")).unwrap_or_default())]
    Declined(ErrorBody),
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
    if status == reqwest::StatusCode::SERVICE_UNAVAILABLE
        && let Ok(error) = serde_json::from_slice::<ErrorBody>(&body)
        && matches!(error.error, ErrorCode::NotLeader | ErrorCode::NotReady)
    {
        return Err(QueryError::Declined(error));
    }
    if !status.is_success() {
        return Err(QueryError::Status {
            status: status.as_u16(),
        });
    }
    serde_json::from_slice(&body).map_err(QueryError::Malformed)
}

/// The coordinators asked about in-doubt transactions: the base URLs configured (one, or
/// every coordinator of a group), the client, and which one answered last.
#[derive(Debug)]
pub struct Coordinators {
    client: reqwest::Client,
    urls: Vec<String>,
    last: AtomicUsize,
}

/// No coordinator of the list answered the query: what each said, in the order asked.
#[derive(Debug, thiserror::Error)]
#[error("{}", describe(.0))]
pub struct GroupError(pub Vec<(String, QueryError)>);

fn describe(attempts: &[(String, QueryError)]) -> String {
    let said: Vec<String> = attempts
        .iter()
        .map(|(url, error)| format!("{url}: {error}"))
        .collect();
    said.join("; ")
}

impl Coordinators {
    /// `urls`: base URLs (`http://host:port`), a trailing `/` ignored; checked by the caller.
    pub fn new(client: reqwest::Client, urls: &[String]) -> Coordinators {
        Coordinators {
            client,
            urls: urls
                .iter()
                .map(|u| u.trim_end_matches('/').to_string())
                .collect(),
            last: AtomicUsize::new(0),
        }
    }

    /// Whether any coordinator is configured.
    pub fn is_empty(&self) -> bool {
        self.urls.is_empty()
    }

    /// GETs `path` (a decision query's path and query) from the coordinator that answered
    /// last; on no answer or a 503 `not_leader`/`not_ready`, from the leader it names when
    /// that is in the list, then from the others in turn, each at most once. Any other
    /// answer or failure (a 404, a malformed body) is that coordinator's word and ends it.
    pub async fn ask(
        &self,
        path: &str,
        keys: &protocol::auth::KeyRing,
    ) -> Result<DecisionQueryResponse, GroupError> {
        let count = self.urls.len();
        let mut tried = vec![false; count];
        let mut attempts = Vec::new();
        let mut next = (count > 0).then(|| self.last.load(Ordering::Relaxed).min(count - 1));
        while let Some(i) = next {
            tried[i] = true;
            let url = format!("{}{path}", self.urls[i]);
            let error = match ask(&self.client, &url, keys).await {
                Ok(answer) => {
                    self.last.store(i, Ordering::Relaxed);
                    return Ok(answer);
                }
                Err(error) => error,
            };
            let named = match &error {
                // A `leader` in a body is a claim, not evidence: only a configured address is
                // ever asked, so a wrong or forged answer cannot send the peer token elsewhere.
                QueryError::Declined(body) => body
                    .leader
                    .as_deref()
                    .and_then(|l| self.index_of(l))
                    .filter(|&j| !tried[j]),
                QueryError::Send(_) => None,
                _ => {
                    attempts.push((self.urls[i].clone(), error));
                    break;
                }
            };
            attempts.push((self.urls[i].clone(), error));
            next = named.or_else(|| (1..count).map(|k| (i + k) % count).find(|&j| !tried[j]));
        }
        Err(GroupError(attempts))
    }

    fn index_of(&self, url: &str) -> Option<usize> {
        let url = url.trim_end_matches('/');
        self.urls.iter().position(|u| u.eq_ignore_ascii_case(url))
    }
}
