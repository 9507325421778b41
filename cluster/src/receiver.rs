//! A reference receiver of relayed intents (docs/workflows.md, "The relay: what a receiver
//! must do"): a `payments` service that takes `protocol::outbox::Delivery` posts, applies each
//! `event_id`'s effect once, and answers every repeat of an id with the first answer.
//!
//! It can be told to hold its answer past the relay's attempt timeout for the first N
//! attempts of every event (the effect is applied, the answer comes too late): the relay then
//! sees an unknown outcome and must ask again under the same `event_id`, which is how the
//! `payment_unknown -> reconciliation_pending` path is exercised. It runs in the calling
//! process on a thread of its own (tests and the demo use it; it is not a twopc product).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use protocol::outbox::{Delivery, IDEMPOTENCY_KEY_HEADER};
use serde_json::{Value, json};

/// The path it takes deliveries on.
pub const PATH: &str = "/v1/payments";

/// How it misbehaves.
#[derive(Debug, Clone, Copy, Default)]
pub struct Behaviour {
    /// For each event, this many first attempts apply the effect and then answer only after
    /// `delay` (past the relay's timeout when `delay` is longer).
    pub slow_attempts: u32,
    pub delay: Duration,
}

/// One request as it arrived.
#[derive(Debug, Clone, PartialEq)]
pub struct Received {
    pub delivery: Delivery,
    /// The `Idempotency-Key` header.
    pub key: Option<String>,
}

#[derive(Debug, Default)]
struct Book {
    received: Vec<Received>,
    /// The effect's count per event (a deduplicating receiver keeps it at 1).
    effects: BTreeMap<String, u32>,
    /// The answer given for each event, the same for every repeat.
    answers: BTreeMap<String, Value>,
    /// First applications, in order: (aggregate, seq, event_id).
    applied: Vec<(String, u64, String)>,
    attempts: BTreeMap<String, u32>,
}

/// A running receiver; dropping it stops it.
#[derive(Debug)]
pub struct Receiver {
    addr: SocketAddr,
    book: Arc<Mutex<Book>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Debug, Clone)]
struct Shared {
    book: Arc<Mutex<Book>>,
    behaviour: Behaviour,
}

impl Receiver {
    /// Starts it on a free loopback port.
    pub fn start(behaviour: Behaviour) -> std::io::Result<Receiver> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let book = Arc::new(Mutex::new(Book::default()));
        let shared = Shared {
            book: book.clone(),
            behaviour,
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let thread = std::thread::spawn(move || {
            runtime.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                    return;
                };
                let router = axum::Router::new()
                    .route(PATH, post(take))
                    .with_state(shared);
                let _ = axum::serve(listener, router)
                    .with_graceful_shutdown(async {
                        let _ = stopped.await;
                    })
                    .await;
            });
        });
        Ok(Receiver {
            addr,
            book,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The URL a relay's `--target payments=URL` names.
    pub fn url(&self) -> String {
        format!("http://{}{PATH}", self.addr)
    }

    /// Every request, in arrival order.
    pub fn received(&self) -> Vec<Received> {
        self.book().received.clone()
    }

    /// How often each event's effect was applied.
    pub fn effects(&self) -> BTreeMap<String, u32> {
        self.book().effects.clone()
    }

    /// First applications in order: (aggregate, seq, event_id).
    pub fn applied(&self) -> Vec<(String, u64, String)> {
        self.book().applied.clone()
    }

    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn take(
    State(shared): State<Shared>,
    headers: HeaderMap,
    body: Result<Json<Delivery>, axum::extract::rejection::JsonRejection>,
) -> (StatusCode, Json<Value>) {
    let Ok(Json(delivery)) = body else {
        let error = json!({"error": "malformed_json", "message": "not a delivery"});
        return (StatusCode::BAD_REQUEST, Json(error));
    };
    let key = headers
        .get(IDEMPOTENCY_KEY_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    if key.as_deref() != Some(delivery.event_id.as_str()) {
        let error =
            json!({"error": "invalid_id", "message": "the Idempotency-Key must be the event_id"});
        return (StatusCode::BAD_REQUEST, Json(error));
    }
    // The effect and its answer are recorded together, before any answer is given: a repeat
    // finds them and answers the same, without a second effect.
    let (answer, slow) = {
        let mut book = shared.book.lock().unwrap_or_else(PoisonError::into_inner);
        book.received.push(Received {
            delivery: delivery.clone(),
            key,
        });
        let attempt = book.attempts.entry(delivery.event_id.clone()).or_insert(0);
        *attempt += 1;
        let slow = *attempt <= shared.behaviour.slow_attempts;
        let answer = match book.answers.get(&delivery.event_id) {
            Some(answer) => answer.clone(),
            None => {
                let answer = json!({
                    "event_id": delivery.event_id,
                    "authorization": format!("auth-{}", delivery.event_id),
                    "status": "authorized",
                });
                book.answers
                    .insert(delivery.event_id.clone(), answer.clone());
                *book.effects.entry(delivery.event_id.clone()).or_insert(0) += 1;
                let applied = (
                    delivery.aggregate.clone(),
                    delivery.seq,
                    delivery.event_id.clone(),
                );
                book.applied.push(applied);
                answer
            }
        };
        (answer, slow)
    };
    if slow {
        tokio::time::sleep(shared.behaviour.delay).await;
    }
    (StatusCode::OK, Json(answer))
}
