//! The receiver of `twopc bench --outbox`: a deduplicating HTTP endpoint in the bench's own
//! process (its CPU is counted with the client's) that applies each `event_id`'s effect once,
//! answers every repeat with the first answer, and remembers when each effect was applied, so
//! the bench can measure delivery end to end (write answered -> effect applied here) and check
//! exactly-once in effect at the end.
//!
//! It keeps what the reference receiver (cluster::receiver) keeps, minus the request log and
//! the misbehaviours: a bench must not slow the thing it measures.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use protocol::outbox::{Delivery, IDEMPOTENCY_KEY_HEADER};
use serde_json::{Value, json};

/// The path deliveries are posted to.
const PATH: &str = "/v1/bench-payments";

/// One event as the receiver saw it.
#[derive(Debug, Clone, Copy)]
pub struct Applied {
    /// How often its effect was applied (a deduplicating receiver keeps it at 1).
    pub effects: u32,
    /// Requests that carried it (repeats included).
    pub requests: u32,
    /// When its effect was first applied.
    pub at: Instant,
}

type Book = Arc<Mutex<HashMap<String, Applied>>>;

/// A running receiver; dropping it stops it.
#[derive(Debug)]
pub struct Receiver {
    url: String,
    book: Book,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Receiver {
    /// Serves on a free loopback port, on the calling runtime.
    pub async fn start() -> std::io::Result<Receiver> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}{PATH}", listener.local_addr()?);
        let book: Book = Arc::default();
        let router = axum::Router::new()
            .route(PATH, post(take))
            .with_state(book.clone());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = axum::serve(listener, router)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await;
        });
        Ok(Receiver {
            url,
            book,
            stop: Some(stop),
        })
    }

    /// What the relay's `--target NAME=URL` names.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A copy of what it saw, by event id.
    pub fn applied(&self) -> HashMap<String, Applied> {
        self.book
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

async fn take(
    State(book): State<Book>,
    headers: HeaderMap,
    body: Result<Json<Delivery>, axum::extract::rejection::JsonRejection>,
) -> (StatusCode, Json<Value>) {
    let Ok(Json(delivery)) = body else {
        let error = json!({"error": "malformed_json", "message": "not a delivery"});
        return (StatusCode::BAD_REQUEST, Json(error));
    };
    let key = headers
        .get(IDEMPOTENCY_KEY_HEADER)
        .and_then(|v| v.to_str().ok());
    if key != Some(delivery.event_id.as_str()) {
        let error =
            json!({"error": "invalid_id", "message": "the Idempotency-Key must be the event_id"});
        return (StatusCode::BAD_REQUEST, Json(error));
    }
    {
        let mut book = book.lock().unwrap_or_else(PoisonError::into_inner);
        let seen = book.entry(delivery.event_id.clone()).or_insert(Applied {
            effects: 0,
            requests: 0,
            at: Instant::now(),
        });
        seen.requests += 1;
        // The effect is applied with the first request only: a repeat finds it.
        if seen.effects == 0 {
            seen.effects = 1;
        }
    }
    // The answer depends on the event id alone, so every repeat gets the same one.
    let answer = json!({"event_id": delivery.event_id, "status": "authorized"});
    (StatusCode::OK, Json(answer))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivery(event_id: &str) -> Delivery {
        Delivery {
            event_id: event_id.into(),
            aggregate: "a".into(),
            seq: 1,
            kind: "payment.authorize.v1".into(),
            body: json!({}),
            source: "kv".into(),
        }
    }

    #[tokio::test]
    async fn a_repeat_is_answered_the_same_without_a_second_effect() {
        let receiver = Receiver::start().await.unwrap();
        let client = reqwest::Client::new();
        let mut answers = Vec::new();
        for _ in 0..2 {
            let answer = client
                .post(receiver.url())
                .header(IDEMPOTENCY_KEY_HEADER, "e1")
                .json(&delivery("e1"))
                .send()
                .await
                .unwrap();
            assert_eq!(answer.status(), 200);
            answers.push(answer.json::<Value>().await.unwrap());
        }
        assert_eq!(answers[0], answers[1]);
        let applied = receiver.applied();
        assert_eq!(applied["e1"].effects, 1);
        assert_eq!(applied["e1"].requests, 2);
        // A delivery whose key is not its event id is refused and applies nothing.
        let refused = client
            .post(receiver.url())
            .header(IDEMPOTENCY_KEY_HEADER, "other")
            .json(&delivery("e2"))
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), 400);
        assert_eq!(receiver.applied().len(), 1);
    }
}
