//! Runs checkout orders against a coordinator with bounded concurrency and records what the
//! client heard for each: `Committed`, `Aborted`, or `Unknown` when no answer came within the
//! retry window. An order whose answer was lost (the coordinator crashed, the connection broke)
//! is sent again with the same id, its idempotency key, so it learns its real outcome instead
//! of being guessed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use protocol::{Outcome, TransactionResponse};

use crate::checkout::{CheckoutConfig, Order};
use crate::oracle::ClientOutcome;

/// How to reach the coordinator and how patient to be.
#[derive(Debug, Clone)]
pub struct WorkloadOptions {
    pub coordinator_url: String,
    /// The transaction's prepare-phase timeout (`timeout_ms` in the request).
    pub prepare_timeout_ms: u64,
    /// One HTTP attempt gives up after this.
    pub request_timeout: Duration,
    /// How long an order keeps resending through coordinator downtime before it is `Unknown`.
    /// Zero: one attempt only.
    pub retry_window: Duration,
    /// Orders in flight at once.
    pub concurrency: usize,
    /// The `POST /v1/transactions` body of an order with a prepare timeout (ms): the KV
    /// checkout's [`Order::request`] unless a participant speaks another payload (PostgreSQL).
    pub body_of: fn(&Order, u64) -> serde_json::Value,
}

impl WorkloadOptions {
    pub fn new(coordinator_url: &str) -> WorkloadOptions {
        WorkloadOptions {
            coordinator_url: coordinator_url.to_string(),
            prepare_timeout_ms: 3_000,
            request_timeout: Duration::from_secs(20),
            retry_window: Duration::from_secs(60),
            concurrency: 4,
            body_of: Order::request,
        }
    }
}

/// What one order came to.
#[derive(Debug, Clone)]
pub struct OrderResult {
    pub order: Order,
    pub outcome: ClientOutcome,
    /// The coordinator's answer, when one came.
    pub answer: Option<TransactionResponse>,
    /// The last error for an order that never got an answer.
    pub error: Option<String>,
    pub attempts: u32,
    /// Time to the answer, for orders answered on their first attempt (a resend's time
    /// includes the outage it waited through, which is not the protocol's latency).
    pub latency: Option<Duration>,
}

/// Live counters of a run, for a progress display while it goes on.
#[derive(Debug, Default)]
pub struct Progress {
    pub committed: AtomicU64,
    pub aborted: AtomicU64,
    pub unknown: AtomicU64,
    pub in_flight: AtomicU64,
    /// Orders sent again because no answer came.
    pub resent: AtomicU64,
}

impl Progress {
    /// Orders finished, whatever their outcome.
    pub fn done(&self) -> u64 {
        self.committed.load(Ordering::Relaxed)
            + self.aborted.load(Ordering::Relaxed)
            + self.unknown.load(Ordering::Relaxed)
    }

    fn finished(&self, outcome: ClientOutcome) {
        let counter = match outcome {
            ClientOutcome::Committed => &self.committed,
            ClientOutcome::Aborted => &self.aborted,
            ClientOutcome::Unknown => &self.unknown,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// `count` orders of run `run`, replayable from `seed`.
pub fn orders(config: &CheckoutConfig, run: &str, seed: u64, count: u64) -> Vec<Order> {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..count).map(|i| config.order(run, i, &mut rng)).collect()
}

/// Sends one order until it has an answer or the retry window closes.
pub async fn run_order(
    client: &reqwest::Client,
    options: &WorkloadOptions,
    progress: &Progress,
    order: Order,
) -> OrderResult {
    progress.in_flight.fetch_add(1, Ordering::Relaxed);
    let result = send_until_answered(client, options, progress, order).await;
    progress.finished(result.outcome);
    result
}

async fn send_until_answered(
    client: &reqwest::Client,
    options: &WorkloadOptions,
    progress: &Progress,
    order: Order,
) -> OrderResult {
    let url = format!("{}/v1/transactions", options.coordinator_url);
    let body = (options.body_of)(&order, options.prepare_timeout_ms);
    let started = Instant::now();
    let deadline = started + options.retry_window;
    let mut attempts = 0;
    loop {
        attempts += 1;
        if attempts == 2 {
            progress.resent.fetch_add(1, Ordering::Relaxed);
        }
        let sent = client
            .post(&url)
            .timeout(options.request_timeout)
            .json(&body)
            .send()
            .await;
        let error = match sent {
            Ok(response) if response.status().is_success() => {
                match response.json::<TransactionResponse>().await {
                    Ok(answer) => {
                        let outcome = match answer.outcome {
                            Outcome::Committed => ClientOutcome::Committed,
                            Outcome::Aborted => ClientOutcome::Aborted,
                        };
                        return OrderResult {
                            order,
                            outcome,
                            answer: Some(answer),
                            error: None,
                            attempts,
                            latency: (attempts == 1).then(|| started.elapsed()),
                        };
                    }
                    Err(e) => format!("unreadable answer: {e}"),
                }
            }
            Ok(response) => {
                let status = response.status();
                let text = response.text().await.unwrap_or_default();
                // 503 is "recovering" or "log failed": worth waiting for. Anything else says
                // the request itself is wrong, and resending will not help.
                if status != reqwest::StatusCode::SERVICE_UNAVAILABLE {
                    return unknown(order, format!("{status}: {text}"), attempts);
                }
                format!("{status}: {text}")
            }
            Err(e) => e.to_string(),
        };
        if Instant::now() >= deadline {
            return unknown(order, error, attempts);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn unknown(order: Order, error: String, attempts: u32) -> OrderResult {
    OrderResult {
        order,
        outcome: ClientOutcome::Unknown,
        answer: None,
        error: Some(error),
        attempts,
        latency: None,
    }
}

/// Runs every order with at most `options.concurrency` in flight; results in order id order.
pub async fn run_orders(
    client: reqwest::Client,
    options: WorkloadOptions,
    orders: Vec<Order>,
) -> Vec<OrderResult> {
    run_orders_with_progress(client, options, orders, Arc::default()).await
}

/// [`run_orders`], counting into `progress` as orders finish.
pub async fn run_orders_with_progress(
    client: reqwest::Client,
    options: WorkloadOptions,
    orders: Vec<Order>,
    progress: Arc<Progress>,
) -> Vec<OrderResult> {
    let options = Arc::new(options);
    let queue = Arc::new(Mutex::new(orders.into_iter()));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..options.concurrency.max(1) {
        let (client, options, queue, progress) = (
            client.clone(),
            options.clone(),
            queue.clone(),
            progress.clone(),
        );
        workers.spawn(async move {
            let mut results = Vec::new();
            loop {
                let next = queue.lock().ok().and_then(|mut q| q.next());
                let Some(order) = next else { break };
                results.push(run_order(&client, &options, &progress, order).await);
            }
            results
        });
    }
    collect(workers).await
}

/// Every worker's results, in order id order. A worker that panicked is a bug in this
/// harness: its orders would silently escape the audit, so it fails the run.
async fn collect(mut workers: tokio::task::JoinSet<Vec<OrderResult>>) -> Vec<OrderResult> {
    let mut all = Vec::new();
    while let Some(joined) = workers.join_next().await {
        match joined {
            Ok(results) => all.extend(results),
            Err(e) => panic!("a workload worker failed: {e}"),
        }
    }
    all.sort_by(|a, b| a.order.id.cmp(&b.order.id));
    all
}

/// Runs orders of run `run` (the same sequence as [`orders`] with `seed`) with
/// `options.concurrency` in flight until `stop` is set; every order started is finished.
pub async fn run_until_stopped(
    client: reqwest::Client,
    options: WorkloadOptions,
    config: CheckoutConfig,
    run: String,
    seed: u64,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> Vec<OrderResult> {
    let options = Arc::new(options);
    let progress = Arc::new(Progress::default());
    let source = Arc::new(Mutex::new((fastrand::Rng::with_seed(seed), 0u64)));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..options.concurrency.max(1) {
        let (client, options, source, stop, config, run, progress) = (
            client.clone(),
            options.clone(),
            source.clone(),
            stop.clone(),
            config.clone(),
            run.clone(),
            progress.clone(),
        );
        workers.spawn(async move {
            let mut results = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let next = source.lock().ok().map(|mut s| {
                    let (rng, index) = &mut *s;
                    let order = config.order(&run, *index, rng);
                    *index += 1;
                    order
                });
                let Some(order) = next else { break };
                results.push(run_order(&client, &options, &progress, order).await);
            }
            results
        });
    }
    collect(workers).await
}
