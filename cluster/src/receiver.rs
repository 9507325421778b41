//! A reference receiver of relayed intents (docs/workflows.md, "The relay: what a receiver
//! must do"): a `payments` service that takes `protocol::outbox::Delivery` posts, applies each
//! `event_id`'s effect once, and answers every repeat of an id with the first answer.
//!
//! It can be told to hold its answer past the relay's attempt timeout for the first N
//! attempts of every event (the effect is applied, the answer comes too late): the relay then
//! sees an unknown outcome and must ask again under the same `event_id`, which is how the
//! `payment_unknown -> reconciliation_pending` path is exercised. It runs in the calling
//! process on a thread of its own (tests and the demo use it; it is not a twopc product).
//!
//! Started with `Payments` (`twopc demo --workflow`), it also keeps customer balances: an
//! authorization takes the delivery's `amount` from its `customer`, a balance too small answers
//! `declined`, and it can signal the caller when it has applied one chosen event and hold that
//! answer, so the caller can kill the relay between the effect and the relay's report.

use std::collections::{BTreeMap, BTreeSet};
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

/// A payments service's book and its scripted misbehaviour.
#[derive(Debug, Clone, Default)]
pub struct Payments {
    /// Customer balances at start; an authorization takes its amount, a balance too small
    /// declines.
    pub balances: BTreeMap<String, i64>,
    /// Only these events get `Behaviour`'s slow answers (empty: every event).
    pub slow_events: BTreeSet<String>,
    /// This event's first attempt, once applied, is sent on the channel and its answer held
    /// this long.
    pub hold: Option<(String, Duration, std::sync::mpsc::Sender<String>)>,
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
    balances: BTreeMap<String, i64>,
    /// Authorized amounts by event.
    captured: BTreeMap<String, i64>,
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
    payments: Option<Arc<Payments>>,
}

impl Receiver {
    /// Starts it on a free loopback port.
    pub fn start(behaviour: Behaviour) -> std::io::Result<Receiver> {
        Receiver::start_with(behaviour, None)
    }

    /// Starts a payments service with balances (see `Payments`).
    pub fn start_payments(behaviour: Behaviour, payments: Payments) -> std::io::Result<Receiver> {
        Receiver::start_with(behaviour, Some(payments))
    }

    fn start_with(behaviour: Behaviour, payments: Option<Payments>) -> std::io::Result<Receiver> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let book = Arc::new(Mutex::new(Book {
            balances: payments
                .as_ref()
                .map(|p| p.balances.clone())
                .unwrap_or_default(),
            ..Book::default()
        }));
        let shared = Shared {
            book: book.clone(),
            behaviour,
            payments: payments.map(Arc::new),
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

    /// Customer balances as they stand.
    pub fn balances(&self) -> BTreeMap<String, i64> {
        self.book().balances.clone()
    }

    /// Authorized amounts by event.
    pub fn captured(&self) -> BTreeMap<String, i64> {
        self.book().captured.clone()
    }

    /// The answer given for each event.
    pub fn answers(&self) -> BTreeMap<String, Value> {
        self.book().answers.clone()
    }

    /// Requests per event (more than one: a repeat, answered without a second effect).
    pub fn attempts(&self) -> BTreeMap<String, u32> {
        self.book().attempts.clone()
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
    let payments = shared.payments.as_deref();
    let (answer, slow, hold) = {
        let mut book = shared.book.lock().unwrap_or_else(PoisonError::into_inner);
        book.received.push(Received {
            delivery: delivery.clone(),
            key,
        });
        let attempt = book.attempts.entry(delivery.event_id.clone()).or_insert(0);
        *attempt += 1;
        let first_attempt = *attempt == 1;
        let slow = *attempt <= shared.behaviour.slow_attempts
            && payments.is_none_or(|p| {
                p.slow_events.is_empty() || p.slow_events.contains(&delivery.event_id)
            });
        let hold = payments
            .and_then(|p| p.hold.as_ref())
            .filter(|(event, _, _)| first_attempt && *event == delivery.event_id);
        let answer = match book.answers.get(&delivery.event_id) {
            Some(answer) => answer.clone(),
            None => {
                let answer = match payments {
                    Some(_) => authorize(&mut book, &delivery),
                    None => json!({
                        "event_id": delivery.event_id,
                        "authorization": format!("auth-{}", delivery.event_id),
                        "status": "authorized",
                    }),
                };
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
        (answer, slow, hold)
    };
    if let Some((event, wait, signal)) = hold {
        let _ = signal.send(event.clone());
        tokio::time::sleep(*wait).await;
    }
    if slow {
        tokio::time::sleep(shared.behaviour.delay).await;
    }
    (StatusCode::OK, Json(answer))
}

/// A payment's effect: the amount taken from the customer's balance, or a decline when the
/// balance is too small (or the delivery names no customer and amount).
fn authorize(book: &mut Book, delivery: &Delivery) -> Value {
    let customer = delivery.body["customer"].as_str().unwrap_or_default();
    let amount = delivery.body["amount"].as_i64().unwrap_or(-1);
    let balance = book.balances.get(customer).copied();
    match balance {
        Some(balance) if amount >= 0 && balance >= amount => {
            book.balances.insert(customer.to_string(), balance - amount);
            book.captured.insert(delivery.event_id.clone(), amount);
            json!({
                "event_id": delivery.event_id,
                "authorization": format!("auth-{}", delivery.event_id),
                "status": "authorized",
                "amount": amount,
            })
        }
        _ => json!({
            "event_id": delivery.event_id,
            "status": "declined",
            "reason": "insufficient funds",
        }),
    }
}
