//! Shared by the relay's process tests: a fake participant outbox (an axum server in the test,
//! holding entries and keeping the outbox contract of docs/workflows.md: open listing in write
//! order, a `delivered` report behind an open intent of its aggregate refused 409
//! `intent_out_of_order`, unknown ids 404, repeats answered as the entry stands) and a handle
//! on a real `twopc relay` process.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use cluster::node::{Node, NodeSpec, free_port};
use protocol::outbox::{AttemptReport, DeliveredReport, IntentState, OutboxEntry, OutboxList};
use protocol::routes;
use serde_json::{Value, json};

#[derive(Debug, Default)]
struct Book {
    entries: Vec<OutboxEntry>,
    /// Every report as it came: (event_id, "delivered" | "attempt" | "permanent", status).
    reports: Vec<(String, String, u16)>,
    refused_out_of_order: u32,
}

#[derive(Debug, Clone)]
struct Shared {
    book: Arc<Mutex<Book>>,
    /// The bearer token reports must carry, when set (changed by a test rotating it).
    peer: Arc<Mutex<Option<String>>>,
}

/// A fake participant outbox on a loopback port; dropping it stops it.
#[derive(Debug)]
pub struct FakeOutbox {
    pub addr: SocketAddr,
    book: Arc<Mutex<Book>>,
    peer: Arc<Mutex<Option<String>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// A pending intent to `target` (event id `{aggregate}-{seq}`).
pub fn intent(aggregate: &str, seq: u64, target: &str, body: Value) -> OutboxEntry {
    OutboxEntry {
        event_id: format!("{}-{seq}", aggregate.replace(':', "-")),
        aggregate: aggregate.into(),
        seq,
        target: target.into(),
        kind: "payment.authorize.v1".into(),
        body,
        state: IntentState::Pending,
        op_id: format!("op-{aggregate}-{seq}"),
        created_at_ms: 0,
        attempts: 0,
        last_error: None,
        last_attempt_at_ms: None,
        delivered_at_ms: None,
        answer: None,
        marks: Vec::new(),
        age_ms: None,
    }
}

impl FakeOutbox {
    /// Serves `entries` (in write order); reports must carry `peer` as a bearer token if given.
    pub fn start(entries: Vec<OutboxEntry>, peer: Option<String>) -> FakeOutbox {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let book = Arc::new(Mutex::new(Book {
            entries,
            ..Book::default()
        }));
        let peer = Arc::new(Mutex::new(peer));
        let shared = Shared {
            book: book.clone(),
            peer: peer.clone(),
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let router = axum::Router::new()
                    .route(routes::OUTBOX, get(list))
                    .route(routes::OUTBOX_DELIVERED, post(delivered))
                    .route(routes::OUTBOX_ATTEMPT, post(attempt))
                    .with_state(shared);
                axum::serve(listener, router)
                    .with_graceful_shutdown(async {
                        let _ = stopped.await;
                    })
                    .await
                    .unwrap();
            });
        });
        FakeOutbox {
            addr,
            book,
            peer,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// From now on only `peer` is taken (the old token is refused, 401).
    pub fn require_peer(&self, peer: &str) {
        *self.peer.lock().unwrap_or_else(PoisonError::into_inner) = Some(peer.to_string());
    }

    /// A new intent, written after the others.
    pub fn push(&self, entry: OutboxEntry) {
        self.book().entries.push(entry);
    }

    pub fn entries(&self) -> Vec<OutboxEntry> {
        self.book().entries.clone()
    }

    pub fn reports(&self) -> Vec<(String, String, u16)> {
        self.book().reports.clone()
    }

    /// Waits until every entry is delivered (or the time is up); true when they are.
    pub fn wait_all_delivered(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self
                .entries()
                .iter()
                .all(|e| e.state == IntentState::Delivered)
            {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for FakeOutbox {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn error(status: StatusCode, code: &str, message: &str) -> (StatusCode, Json<Value>) {
    (status, Json(json!({"error": code, "message": message})))
}

fn authorized(shared: &Shared, headers: &HeaderMap) -> bool {
    let Some(peer) = shared
        .peer
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
    else {
        return true;
    };
    let sent = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    sent == format!("Bearer {peer}")
}

async fn list(State(shared): State<Shared>, headers: HeaderMap) -> (StatusCode, Json<Value>) {
    if !authorized(&shared, &headers) {
        return error(StatusCode::UNAUTHORIZED, "unauthorized", "no peer token");
    }
    let book = shared.book.lock().unwrap_or_else(PoisonError::into_inner);
    let open: Vec<OutboxEntry> = book
        .entries
        .iter()
        .filter(|e| matches!(e.state, IntentState::Pending | IntentState::Failed))
        .cloned()
        .collect();
    let list = OutboxList {
        pending: open
            .iter()
            .filter(|e| e.state == IntentState::Pending)
            .count() as u64,
        failed: open
            .iter()
            .filter(|e| e.state == IntentState::Failed)
            .count() as u64,
        intents: open,
        oldest_pending_age_ms: None,
        truncated: false,
    };
    (StatusCode::OK, Json(serde_json::to_value(list).unwrap()))
}

async fn delivered(
    State(shared): State<Shared>,
    UrlPath(event_id): UrlPath<String>,
    headers: HeaderMap,
    Json(report): Json<DeliveredReport>,
) -> (StatusCode, Json<Value>) {
    if !authorized(&shared, &headers) {
        return error(StatusCode::UNAUTHORIZED, "unauthorized", "no peer token");
    }
    let mut book = shared.book.lock().unwrap_or_else(PoisonError::into_inner);
    let Some(at) = book.entries.iter().position(|e| e.event_id == event_id) else {
        book.reports.push((event_id, "delivered".into(), 404));
        return error(StatusCode::NOT_FOUND, "not_found", "no such intent");
    };
    let (aggregate, seq) = (book.entries[at].aggregate.clone(), book.entries[at].seq);
    if book.entries[at].state != IntentState::Pending {
        book.reports.push((event_id, "delivered".into(), 200));
        return (
            StatusCode::OK,
            Json(serde_json::to_value(&book.entries[at]).unwrap()),
        );
    }
    let earlier_open = book
        .entries
        .iter()
        .any(|e| e.aggregate == aggregate && e.seq < seq && e.state != IntentState::Delivered);
    if earlier_open {
        book.refused_out_of_order += 1;
        book.reports.push((event_id, "delivered".into(), 409));
        return error(
            StatusCode::CONFLICT,
            "intent_out_of_order",
            "an earlier intent is open",
        );
    }
    let entry = &mut book.entries[at];
    entry.state = IntentState::Delivered;
    entry.attempts += 1;
    entry.answer = Some(report.answer);
    let answer = serde_json::to_value(&*entry).unwrap();
    book.reports.push((event_id, "delivered".into(), 200));
    (StatusCode::OK, Json(answer))
}

async fn attempt(
    State(shared): State<Shared>,
    UrlPath(event_id): UrlPath<String>,
    headers: HeaderMap,
    Json(report): Json<AttemptReport>,
) -> (StatusCode, Json<Value>) {
    if !authorized(&shared, &headers) {
        return error(StatusCode::UNAUTHORIZED, "unauthorized", "no peer token");
    }
    let mut book = shared.book.lock().unwrap_or_else(PoisonError::into_inner);
    let kind = if report.permanent {
        "permanent"
    } else {
        "attempt"
    };
    let Some(entry) = book.entries.iter_mut().find(|e| e.event_id == event_id) else {
        book.reports.push((event_id, kind.into(), 404));
        return error(StatusCode::NOT_FOUND, "not_found", "no such intent");
    };
    if entry.state == IntentState::Pending {
        entry.attempts += 1;
        entry.last_error = Some(report.error);
        if report.permanent {
            entry.state = IntentState::Failed;
        }
    }
    let answer = serde_json::to_value(&*entry).unwrap();
    book.reports.push((event_id, kind.into(), 200));
    (StatusCode::OK, Json(answer))
}

/// A `twopc relay` process for `outbox` (participant `orders`) and `targets` (`NAME=...`),
/// with its status listener on a free port; not waited for (a crash point may stop it first).
pub fn relay(
    binary: PathBuf,
    dir: &Path,
    outbox: &FakeOutbox,
    targets: &[String],
    extra: &[&str],
    env: Vec<(String, String)>,
) -> Node {
    let port = free_port();
    let mut args: Vec<String> = vec![
        "relay".into(),
        "--participant".into(),
        format!("orders={}", outbox.url()),
        "--listen".into(),
        format!("127.0.0.1:{port}"),
    ];
    for target in targets {
        args.extend(["--target".into(), target.clone()]);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    Node::start(NodeSpec {
        name: "relay".into(),
        binary,
        args,
        env,
        addr: format!("127.0.0.1:{port}").parse().unwrap(),
        log_path: dir.join("relay.log"),
        tokens: None,
    })
}
