//! Drives checkout orders at a coordinator with bounded concurrency, retrying an order with the
//! same id (the idempotency key) when the coordinator is unreachable, so an order whose answer
//! was lost in a crash learns its real outcome instead of being guessed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use chaos_tests::audit::ClientOutcome;
use chaos_tests::checkout::Order;
use protocol::{Outcome, TransactionResponse, VoteKind};

/// Live counters for the progress bar.
#[derive(Debug, Default)]
pub struct Counters {
    pub committed: AtomicU64,
    pub aborted: AtomicU64,
    pub unknown: AtomicU64,
    pub in_flight: AtomicU64,
    /// Orders that had to be sent again because the coordinator did not answer.
    pub resent: AtomicU64,
}

impl Counters {
    pub fn done(&self) -> u64 {
        self.committed.load(Ordering::Relaxed)
            + self.aborted.load(Ordering::Relaxed)
            + self.unknown.load(Ordering::Relaxed)
    }
}

/// What one order came to.
#[derive(Debug, Clone)]
pub struct OrderResult {
    pub order: Order,
    pub outcome: ClientOutcome,
    /// Time to the answer, for orders answered on their first try.
    pub latency: Option<Duration>,
    /// Why it aborted, as a short category (`inventory: no (out of stock)`).
    pub abort_reason: Option<String>,
    /// The last error for an order that never got an answer.
    pub error: Option<String>,
}

/// How to reach the coordinator and how patient to be.
#[derive(Debug, Clone)]
pub struct DriverConfig {
    pub coordinator_url: String,
    pub prepare_timeout_ms: u64,
    /// How long an order keeps retrying through coordinator downtime before it is `Unknown`.
    pub retry_window: Duration,
}

/// Sends one order until it has an answer or the retry window closes.
pub async fn run_order(
    client: &reqwest::Client,
    config: &DriverConfig,
    counters: &Counters,
    order: Order,
) -> OrderResult {
    let url = format!("{}/v1/transactions", config.coordinator_url);
    let body = order.request(config.prepare_timeout_ms);
    let started = Instant::now();
    let deadline = started + config.retry_window;
    let mut tries = 0u32;
    let mut last_error: String;
    counters.in_flight.fetch_add(1, Ordering::Relaxed);
    let result = loop {
        tries += 1;
        if tries == 2 {
            counters.resent.fetch_add(1, Ordering::Relaxed);
        }
        match client.post(&url).json(&body).send().await {
            Ok(response) if response.status().is_success() => {
                match response.json::<TransactionResponse>().await {
                    Ok(answer) => {
                        let latency = (tries == 1).then(|| started.elapsed());
                        break answered(order, &answer, latency);
                    }
                    Err(e) => last_error = format!("unreadable answer: {e}"),
                }
            }
            Ok(response) => {
                let status = response.status();
                let text = response.text().await.unwrap_or_default();
                last_error = format!("{status}: {text}");
                // 503 is "recovering" or "log failed": worth waiting for. Anything else is a
                // bug in the request, and retrying will not help.
                if status != reqwest::StatusCode::SERVICE_UNAVAILABLE {
                    break unknown(order, last_error);
                }
            }
            Err(e) => last_error = e.to_string(),
        }
        if Instant::now() >= deadline {
            break unknown(order, last_error);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    counters.in_flight.fetch_sub(1, Ordering::Relaxed);
    let counter = match result.outcome {
        ClientOutcome::Committed => &counters.committed,
        ClientOutcome::Aborted => &counters.aborted,
        ClientOutcome::Unknown => &counters.unknown,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    result
}

fn answered(order: Order, answer: &TransactionResponse, latency: Option<Duration>) -> OrderResult {
    let outcome = match answer.outcome {
        Outcome::Committed => ClientOutcome::Committed,
        Outcome::Aborted => ClientOutcome::Aborted,
    };
    let abort_reason = (outcome == ClientOutcome::Aborted).then(|| abort_category(answer));
    OrderResult {
        order,
        outcome,
        latency,
        abort_reason,
        error: None,
    }
}

fn unknown(order: Order, error: String) -> OrderResult {
    OrderResult {
        order,
        outcome: ClientOutcome::Unknown,
        latency: None,
        abort_reason: None,
        error: Some(error),
    }
}

/// The first participant that did not vote yes, and a short reason: a few categories rather
/// than one line per distinct message, so the summary reads like a histogram.
pub fn abort_category(answer: &TransactionResponse) -> String {
    let Some(part) = answer.participants.iter().find(|p| p.vote != VoteKind::Yes) else {
        return format!(
            "aborted: {}",
            answer.reason.as_deref().unwrap_or("no reason given")
        );
    };
    let reason = answer.reason.as_deref().unwrap_or("").to_ascii_lowercase();
    let why = match part.vote {
        VoteKind::Timeout => "prepare timed out",
        VoteKind::Error => "no valid vote (error)",
        VoteKind::Yes | VoteKind::No if reason.contains("lock") => "lock conflict",
        VoteKind::Yes | VoteKind::No
            if reason.contains("min") || reason.contains("insufficient") =>
        {
            "would go below minimum"
        }
        VoteKind::Yes | VoteKind::No if reason.contains("version") => "version check failed",
        VoteKind::Yes | VoteKind::No => "voted no",
    };
    format!("{}: {why}", part.name)
}

/// Runs every order with at most `concurrency` in flight.
pub async fn run_all(
    client: reqwest::Client,
    config: DriverConfig,
    counters: Arc<Counters>,
    orders: Vec<Order>,
    concurrency: usize,
) -> Vec<OrderResult> {
    let config = Arc::new(config);
    let queue = Arc::new(std::sync::Mutex::new(orders.into_iter()));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..concurrency.max(1) {
        let (client, config, counters, queue) = (
            client.clone(),
            config.clone(),
            counters.clone(),
            queue.clone(),
        );
        workers.spawn(async move {
            let mut results = Vec::new();
            loop {
                let next = queue.lock().ok().and_then(|mut q| q.next());
                let Some(order) = next else { break };
                results.push(run_order(&client, &config, &counters, order).await);
            }
            results
        });
    }
    let mut all = Vec::new();
    while let Some(joined) = workers.join_next().await {
        match joined {
            Ok(results) => all.extend(results),
            Err(e) => tracing::error!("a load worker failed: {e}"),
        }
    }
    all.sort_by(|a, b| a.order.id.cmp(&b.order.id));
    all
}
