//! The `--ha` demo's workload: checkout orders sent to a coordinator group until stopped,
//! each through [`Group::send`], which moves on from a dead leader or a follower's 503
//! `not_leader` to the next address. An order with no answer from any node (the group is
//! electing) is sent again under the same id, its idempotency key, until it has one or its
//! retry window closes; a client must never guess an outcome.
//!
//! It records which node answered each order, so the demo can show the workload moving to
//! the new leader; it never kills or starts anything (that is `ha`'s).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cluster::audit::ClientOutcome;
use cluster::checkout::{CheckoutConfig, Order};
use cluster::workload::{OrderResult, Progress};
use protocol::TransactionResponse;

use crate::coordinator_group::{Addresses, Group, Request, Resend};

/// How long an order keeps trying before the client calls it unknown.
const RETRY_WINDOW: Duration = Duration::from_secs(60);
/// The pause between two tries of an order that no node took.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// One order as the client saw it, and which node answered.
#[derive(Debug)]
pub struct Sent {
    pub result: OrderResult,
    /// Index (in the address list) of the node that answered; `None` without an answer.
    pub node: Option<usize>,
}

/// Live counts of a running load.
#[derive(Debug)]
pub struct Counters {
    pub progress: Progress,
    /// Orders committed through each node, by address index.
    pub committed_by_node: Vec<AtomicU64>,
}

/// What the workers share.
struct Shared {
    group: Group,
    addresses: Addresses,
    config: CheckoutConfig,
    run: String,
    prepare_timeout_ms: u64,
    /// The order generator and the next order's index.
    source: Mutex<(fastrand::Rng, u64)>,
    stop: AtomicBool,
    counters: Arc<Counters>,
}

/// A running load; [`GroupLoad::stop`] ends it.
pub struct GroupLoad {
    shared: Arc<Shared>,
    workers: tokio::task::JoinSet<Vec<Sent>>,
}

/// What to send, and how.
pub struct LoadSpec {
    pub http: reqwest::Client,
    pub addresses: Addresses,
    pub config: CheckoutConfig,
    pub run: String,
    pub seed: u64,
    pub concurrency: usize,
    pub prepare_timeout_ms: u64,
}

impl GroupLoad {
    /// Starts `spec.concurrency` workers, each sending one order at a time.
    pub fn start(spec: LoadSpec) -> GroupLoad {
        let counters = Arc::new(Counters {
            progress: Progress::default(),
            committed_by_node: spec
                .addresses
                .urls()
                .iter()
                .map(|_| AtomicU64::new(0))
                .collect(),
        });
        let shared = Arc::new(Shared {
            group: Group::new(spec.http, spec.addresses.clone()),
            addresses: spec.addresses,
            config: spec.config,
            run: spec.run,
            prepare_timeout_ms: spec.prepare_timeout_ms,
            source: Mutex::new((fastrand::Rng::with_seed(spec.seed), 0)),
            stop: AtomicBool::new(false),
            counters,
        });
        let mut workers = tokio::task::JoinSet::new();
        for _ in 0..spec.concurrency.max(1) {
            let shared = shared.clone();
            workers.spawn(async move {
                let mut sent = Vec::new();
                while !shared.stop.load(Ordering::SeqCst) {
                    let Some(order) = shared.next_order() else {
                        break;
                    };
                    sent.push(shared.send(order).await);
                }
                sent
            });
        }
        GroupLoad { shared, workers }
    }

    pub fn counters(&self) -> &Counters {
        &self.shared.counters
    }

    /// Lets every order in flight finish, then returns all of them in order id order. A
    /// worker that panicked would let its orders escape the audit: that fails the run.
    pub async fn stop(mut self) -> anyhow::Result<Vec<Sent>> {
        self.shared.stop.store(true, Ordering::SeqCst);
        let mut all = Vec::new();
        while let Some(joined) = self.workers.join_next().await {
            all.extend(joined.map_err(|e| anyhow::anyhow!("a workload worker failed: {e}"))?);
        }
        all.sort_by(|a, b| a.result.order.id.cmp(&b.result.order.id));
        Ok(all)
    }
}

impl Shared {
    fn next_order(&self) -> Option<Order> {
        let mut source = self.source.lock().ok()?;
        let (rng, index) = &mut *source;
        let order = self.config.order(&self.run, *index, rng);
        *index += 1;
        Some(order)
    }

    async fn send(&self, order: Order) -> Sent {
        let progress = &self.counters.progress;
        progress.in_flight.fetch_add(1, Ordering::Relaxed);
        let sent = self.send_until_answered(order).await;
        let counter = match sent.result.outcome {
            ClientOutcome::Committed => &progress.committed,
            ClientOutcome::Aborted => &progress.aborted,
            ClientOutcome::Unknown => &progress.unknown,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        progress.in_flight.fetch_sub(1, Ordering::Relaxed);
        if sent.result.outcome == ClientOutcome::Committed
            && let Some(count) = sent
                .node
                .and_then(|i| self.counters.committed_by_node.get(i))
        {
            count.fetch_add(1, Ordering::Relaxed);
        }
        sent
    }

    async fn send_until_answered(&self, order: Order) -> Sent {
        let request = Request::post(
            protocol::routes::TRANSACTIONS,
            order.request(self.prepare_timeout_ms),
            // A submission under a client-chosen id: any node of the group answers it once.
            Resend::Safe,
        );
        let started = Instant::now();
        let mut attempts = 0;
        loop {
            attempts += 1;
            if attempts == 2 {
                self.counters
                    .progress
                    .resent
                    .fetch_add(1, Ordering::Relaxed);
            }
            let error = match self.group.send(&request).await {
                Ok(answer) if answer.status.is_success() => {
                    match serde_json::from_slice::<TransactionResponse>(&answer.body) {
                        Ok(response) => {
                            let outcome = match response.outcome {
                                protocol::Outcome::Committed => ClientOutcome::Committed,
                                protocol::Outcome::Aborted => ClientOutcome::Aborted,
                            };
                            let node = self.addresses.urls().iter().position(|u| *u == answer.base);
                            return Sent {
                                result: OrderResult {
                                    order,
                                    outcome,
                                    answer: Some(response),
                                    error: None,
                                    attempts,
                                    latency: (attempts == 1).then(|| started.elapsed()),
                                },
                                node,
                            };
                        }
                        Err(e) => format!("unreadable answer: {e}"),
                    }
                }
                // Overloaded, log failed, recovering: worth waiting for. Anything else says
                // the request itself is wrong, and resending will not help.
                Ok(answer) if answer.status == reqwest::StatusCode::SERVICE_UNAVAILABLE => {
                    format!("{} from {}", answer.status, answer.base)
                }
                Ok(answer) => {
                    let text = String::from_utf8_lossy(&answer.body).into_owned();
                    return unknown(order, format!("{}: {text}", answer.status), attempts);
                }
                Err(e) => e.to_string(),
            };
            if started.elapsed() >= RETRY_WINDOW {
                return unknown(order, error, attempts);
            }
            tokio::time::sleep(RETRY_PAUSE).await;
        }
    }
}

fn unknown(order: Order, error: String, attempts: u32) -> Sent {
    Sent {
        result: OrderResult {
            order,
            outcome: ClientOutcome::Unknown,
            answer: None,
            error: Some(error),
            attempts,
            latency: None,
        },
        node: None,
    }
}
