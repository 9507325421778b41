//! Delivering to the coordinator: the intent's body is a transaction request (or a saga
//! request) without an `id`; it is submitted with `id = event_id`, so a repeat is the same
//! transaction, answered from the coordinator's index. A final outcome (committed or aborted;
//! a saga's terminal state) is the answer. An outcome not known yet is asked for with
//! `GET /v1/transactions/{id}` (or `/v1/sagas/{id}`), under the same id, until the attempt's
//! time is up; 409 `id_conflict` is a refusal for good.
//!
//! The group: the addresses of `--coordinator` are tried in turn when one cannot be reached or
//! answers 503 `not_leader` / `not_ready` (a submission under a chosen id is safe to send to
//! another node: the same id gets the same answer). Only listed addresses are ever called; a
//! `leader` named in an answer is not followed unless it is in the list (it is tried anyway in
//! its turn).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use protocol::saga::SagaState;
use protocol::{ErrorBody, ErrorCode, routes};
use reqwest::{Method, StatusCode};
use serde_json::Value;

use crate::credentials::Authed;
use crate::targets::Answer;

/// What an intent submits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Transaction,
    Saga,
}

/// A coordinator group as the relay calls it.
#[derive(Debug)]
pub struct Coordinators {
    client: Authed,
    urls: Vec<String>,
    last: AtomicUsize,
    /// Between two status reads while an outcome is not final.
    pub poll: Duration,
}

/// Most bytes of a coordinator's answer read.
const ANSWER_BYTES_MAX: usize = net::outbound::SERVICE_ANSWER_BYTES_MAX;

impl Coordinators {
    pub fn new(client: Authed, urls: Vec<String>) -> Coordinators {
        Coordinators {
            client,
            urls,
            last: AtomicUsize::new(0),
            poll: Duration::from_millis(200),
        }
    }

    /// One delivery attempt: submit under `event_id`, and wait for a final outcome until
    /// `time` is up (the attempt's time).
    pub async fn deliver(
        &self,
        kind: Kind,
        event_id: &str,
        body: &Value,
        time: Duration,
    ) -> Answer {
        let request = match with_id(body, event_id) {
            Ok(request) => request,
            Err(problem) => return Answer::Refused(problem),
        };
        match tokio::time::timeout(time, self.submit_and_wait(kind, event_id, &request)).await {
            Ok(answer) => answer,
            Err(_) => Answer::Unknown(format!(
                "no final outcome for {event_id} within {} ms; it is asked again under the same id",
                time.as_millis()
            )),
        }
    }

    async fn submit_and_wait(&self, kind: Kind, event_id: &str, request: &Value) -> Answer {
        let (path, status_path) = match kind {
            Kind::Transaction => (
                routes::TRANSACTIONS,
                format!("{}/{event_id}", routes::TRANSACTIONS),
            ),
            Kind::Saga => (routes::SAGAS, format!("{}/{event_id}", routes::SAGAS)),
        };
        let mut last = match self.send(Method::POST, path, Some(request)).await {
            Ok((status, body)) => match classify(kind, status, &body) {
                Some(answer) => return answer,
                None => format!("{status}: {}", text(&body)),
            },
            Err(error) => error,
        };
        // Not final, or no answer: the same id's status until it is final.
        loop {
            tokio::time::sleep(self.poll).await;
            match self.send(Method::GET, &status_path, None).await {
                Ok((StatusCode::OK, body)) => {
                    if let Some(answer) = final_status(kind, &body) {
                        return answer;
                    }
                    last = format!("{event_id} is not final yet");
                }
                // Never arrived (or not yet visible): submitting again is the way on, under
                // the same id, at the next attempt.
                Ok((StatusCode::NOT_FOUND, _)) => {
                    return Answer::Unknown(format!(
                        "{last}; the coordinator does not know {event_id}"
                    ));
                }
                Ok((status, body)) => last = format!("status read: {status}: {}", text(&body)),
                Err(error) => last = error,
            }
        }
    }

    /// Sends to the address that answered last, then to the others in turn while they cannot
    /// be reached or decline (503 `not_leader` / `not_ready`).
    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(StatusCode, Vec<u8>), String> {
        let count = self.urls.len();
        let first = self.last.load(Ordering::Relaxed) % count.max(1);
        let mut said = Vec::new();
        for k in 0..count {
            let i = (first + k) % count;
            let base = &self.urls[i];
            let mut builder = self.client.request(method.clone(), format!("{base}{path}"));
            if let Some(body) = body {
                builder = builder.json(body);
            }
            let response = match builder.send().await {
                Ok(response) => response,
                Err(error) => {
                    said.push(format!("{base}: {error}"));
                    continue;
                }
            };
            let (status, bytes) = match net::outbound::read_answer(response, ANSWER_BYTES_MAX).await
            {
                Ok(answer) => answer,
                Err(error) => {
                    said.push(format!("{base}: {error}"));
                    continue;
                }
            };
            if status == StatusCode::SERVICE_UNAVAILABLE
                && let Ok(error) = serde_json::from_slice::<ErrorBody>(&bytes)
                && matches!(error.error, ErrorCode::NotLeader | ErrorCode::NotReady)
            {
                said.push(format!("{base}: {}", error.error));
                continue;
            }
            self.last.store(i, Ordering::Relaxed);
            return Ok((status, bytes.to_vec()));
        }
        Err(format!("no coordinator took it: {}", said.join("; ")))
    }
}

/// The intent's body with `id` = `event_id`; a body that names another id is refused (it
/// would deliver under an id that is not the event's).
fn with_id(body: &Value, event_id: &str) -> Result<Value, String> {
    let Value::Object(fields) = body else {
        return Err(
            "the intent's body is not a JSON object (a transaction or saga request)".into(),
        );
    };
    match fields.get("id") {
        None | Some(Value::Null) => {}
        Some(Value::String(id)) if id == event_id => {}
        Some(other) => {
            return Err(format!(
                "the intent's body names the id {other}; a relay submits under the event_id {event_id} only"
            ));
        }
    }
    let mut fields = fields.clone();
    fields.insert("id".into(), Value::String(event_id.to_string()));
    Ok(Value::Object(fields))
}

/// A submission's answer: `Some` when it settles the attempt, `None` when the outcome is to be
/// read again (not final yet, or the answer said nothing final).
fn classify(kind: Kind, status: StatusCode, body: &[u8]) -> Option<Answer> {
    if status == StatusCode::OK || status == StatusCode::ACCEPTED {
        return final_status(kind, body);
    }
    let error = serde_json::from_slice::<ErrorBody>(body).ok();
    if error
        .as_ref()
        .is_some_and(|e| e.error == ErrorCode::IdConflict)
    {
        return Some(Answer::Refused(format!("id_conflict: {}", text(body))));
    }
    let unknown = status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS
        || !status.is_client_error();
    if unknown {
        None
    } else {
        Some(Answer::Refused(format!("{status}: {}", text(body))))
    }
}

/// The answer when `body` (a transaction's or saga's answer or status) is final.
fn final_status(kind: Kind, body: &[u8]) -> Option<Answer> {
    let value: Value = serde_json::from_slice(body).ok()?;
    let is_final = match kind {
        Kind::Transaction => matches!(value["outcome"].as_str(), Some("committed" | "aborted")),
        Kind::Saga => value["state"]
            .as_str()
            .and_then(SagaState::parse)
            .is_some_and(SagaState::is_terminal),
    };
    is_final.then_some(Answer::Delivered(value))
}

fn text(body: &[u8]) -> String {
    String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned()
}

#[cfg(test)]
#[path = "coordinator_target_tests.rs"]
mod tests;
