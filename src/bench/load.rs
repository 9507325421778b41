//! Closed-loop load: `concurrency` workers each send a transaction, wait for its answer, and
//! send the next, for a fixed time. Every transaction writes a key of its own: the client hears
//! the outcome once the decision is durable, before phase two has released the participants'
//! locks, so a worker reusing one key would meet its own previous transaction's lock. The bench
//! measures the protocol's cost, not lock contention. The hot-key cells (`--hot-key`) measure
//! contention on purpose: every transaction of the cell writes one and the same key at each
//! participant, so prepares queue for that key's lock (lock waits, docs/protocol.md).

use std::sync::Arc;
use std::time::{Duration, Instant};

use coordinator::http_client::Endpoint;
use protocol::routes;
use serde_json::json;

/// How long one transaction may take before the bench counts it as failed.
const ANSWER_WAIT_MAX: Duration = Duration::from_secs(60);

/// What one cell of the table measured.
#[derive(Debug, Clone, Default)]
pub struct LoadResult {
    /// Committed in the measured window.
    pub committed: u64,
    /// Committed including the warm-up (what the fsync counters saw).
    pub committed_all: u64,
    pub failed: u64,
    pub elapsed: Duration,
    /// Latency of every committed transaction, sorted.
    pub latencies: Vec<Duration>,
}

impl LoadResult {
    pub fn per_second(&self) -> f64 {
        self.committed as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// The request body of one bench transaction.
fn body(
    cell: &str,
    worker: usize,
    seq: u64,
    participants: &[String],
    hot: bool,
) -> serde_json::Value {
    let key = if hot {
        format!("bench:{cell}:hot")
    } else {
        format!("bench:{cell}:{worker}:{seq}")
    };
    let parts: Vec<_> = participants
        .iter()
        .map(|name| {
            json!({"name": name, "payload": {"ops": [
                {"op": "put", "key": key, "value": seq}
            ]}})
        })
        .collect();
    json!({"id": format!("{cell}-{worker}-{seq}"), "participants": parts})
}

/// The shape of one cell's load.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub concurrency: usize,
    pub warmup: Duration,
    pub duration: Duration,
    /// Every transaction writes the same key (contention) instead of a key of its own.
    pub hot: bool,
}

/// Runs the closed loop: `warmup` first (not counted), then `duration` measured.
pub async fn run(
    coordinator: &Arc<Endpoint>,
    cell: &str,
    participants: &[String],
    shape: Shape,
) -> LoadResult {
    let Shape {
        concurrency,
        warmup,
        duration,
        hot,
    } = shape;
    let participants = Arc::new(participants.to_vec());
    let start = Instant::now();
    let measure_from = start + warmup;
    let stop_at = measure_from + duration;
    let mut workers = tokio::task::JoinSet::new();
    for worker in 0..concurrency.max(1) {
        let (coordinator, participants, cell) = (
            Arc::clone(coordinator),
            participants.clone(),
            cell.to_string(),
        );
        workers.spawn(async move {
            let mut result = LoadResult::default();
            let mut seq = 0u64;
            while Instant::now() < stop_at {
                seq += 1;
                let sent = Instant::now();
                let json = body(&cell, worker, seq, &participants, hot)
                    .to_string()
                    .into_bytes();
                let ok = match coordinator
                    .post_json(routes::TRANSACTIONS, json, ANSWER_WAIT_MAX)
                    .await
                {
                    Ok(answer) if answer.status == 200 => {
                        serde_json::from_slice::<protocol::TransactionResponse>(&answer.body)
                            .is_ok_and(|r| r.outcome == protocol::Outcome::Committed)
                    }
                    _ => false,
                };
                result.committed_all += u64::from(ok);
                if sent < measure_from {
                    continue;
                }
                if ok {
                    result.committed += 1;
                    result.latencies.push(sent.elapsed());
                } else {
                    result.failed += 1;
                }
            }
            result
        });
    }
    let mut total = LoadResult::default();
    while let Some(joined) = workers.join_next().await {
        if let Ok(part) = joined {
            total.committed += part.committed;
            total.committed_all += part.committed_all;
            total.failed += part.failed;
            total.latencies.extend(part.latencies);
        }
    }
    total.elapsed = start.elapsed().saturating_sub(warmup);
    total.latencies.sort();
    total
}
