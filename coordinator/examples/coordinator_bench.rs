//! The coordinator's share of the cost of a transaction.
//!
//! Two minimal in-process participants vote yes and acknowledge at once; an in-process
//! coordinator runs 2-participant transactions at concurrency 1, 16 and 64, once with its log
//! fsyncing (the real thing) and once with the same HTTP exchanges and the log not syncing
//! (`SyncPolicy::Never`), as the same-run baseline. Prints committed tx/s, p50 and p99, and the
//! ratio durable / baseline.
//!
//! `cargo run --release -p twopc-coordinator --example coordinator_bench` (`BENCH_SECS` per run, default 5;
//! `BENCH_ROUNDS` alternating rounds per mode and concurrency, default 3).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::post;
use serde_json::json;

use coordinator::config::Config;
use coordinator::server;
use protocol::ParticipantName;

async fn participant() -> SocketAddr {
    let app = Router::new()
        .route(
            "/2pc/prepare",
            post(|| async { axum::Json(json!({"vote": "yes"})) }),
        )
        .route(
            "/2pc/commit",
            post(|| async { axum::Json(json!({"ack": true})) }),
        )
        .route(
            "/2pc/abort",
            post(|| async { axum::Json(json!({"ack": true})) }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// CPU time this process used so far (user + system), from /proc (Linux); 0 elsewhere.
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the command name (which is in parentheses and may contain spaces).
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of the whole line, 11 and 12 after the name.
    (ticks(11) + ticks(12)) / 100.0
}

#[derive(Debug, Clone)]
struct Figures {
    cpu_us_per_tx: f64,
    tx_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    latencies: Vec<Duration>,
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    sorted
        .get(((sorted.len() as f64 * p) as usize).min(sorted.len().saturating_sub(1)))
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

/// Median throughput over rounds; latency percentiles over every transaction of every round.
fn summarize(rounds: &[Figures]) -> Figures {
    let median = |mut values: Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    let mut all: Vec<Duration> = rounds.iter().flat_map(|f| f.latencies.clone()).collect();
    all.sort();
    Figures {
        cpu_us_per_tx: median(rounds.iter().map(|f| f.cpu_us_per_tx).collect()),
        tx_per_s: median(rounds.iter().map(|f| f.tx_per_s).collect()),
        p50_ms: percentile(&all, 0.50),
        p99_ms: percentile(&all, 0.99),
        latencies: Vec::new(),
    }
}

async fn load(url: String, concurrency: usize, seconds: f64, run: &str) -> Figures {
    let client = reqwest::Client::new();
    let counter = Arc::new(AtomicU64::new(0));
    let aborted = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let cpu_started = cpu_seconds();
    let mut workers = Vec::new();
    for worker in 0..concurrency {
        let client = client.clone();
        let url = url.clone();
        let counter = Arc::clone(&counter);
        let aborted = Arc::clone(&aborted);
        let run = run.to_string();
        workers.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            while Instant::now() < deadline {
                let n = counter.fetch_add(1, Ordering::Relaxed);
                let body = json!({
                    "id": format!("{run}-{worker}-{n}"),
                    "participants": [
                        {"name": "inventory", "payload": {"ops": [{"op": "add", "key": "stock:sku-1", "delta": -1}]}},
                        {"name": "payments", "payload": {"ops": [{"op": "add", "key": "balance:alice", "delta": -10}]}}
                    ]
                });
                let sent = Instant::now();
                let response = client.post(&url).json(&body).send().await.expect("send");
                let answer: serde_json::Value = response.json().await.expect("json");
                latencies.push(sent.elapsed());
                if answer["outcome"] != "committed" {
                    aborted.fetch_add(1, Ordering::Relaxed);
                }
            }
            latencies
        }));
    }
    let mut all = Vec::new();
    for worker in workers {
        all.extend(worker.await.expect("worker"));
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu_started;
    all.sort();
    let aborted = aborted.load(Ordering::Relaxed);
    assert_eq!(aborted, 0, "a benchmark transaction aborted");
    Figures {
        cpu_us_per_tx: cpu * 1e6 / all.len().max(1) as f64,
        tx_per_s: all.len() as f64 / elapsed,
        p50_ms: percentile(&all, 0.50),
        p99_ms: percentile(&all, 0.99),
        latencies: all,
    }
}

async fn run(
    fsync: bool,
    participants: &BTreeMap<ParticipantName, String>,
) -> (server::Running, tempfile::TempDir) {
    // The system temp dir: the figures are only meaningful where it is a real disk (it is an
    // ext4 volume on the project's machines); the printout says which file system it is.
    let dir = tempfile::Builder::new()
        .prefix("twopc-bench-")
        .tempdir()
        .expect("tempdir");
    let mut config = Config::for_tests(dir.path().to_path_buf(), participants.clone());
    config.fsync = fsync;
    (server::start(config).await.expect("start coordinator"), dir)
}

#[tokio::main]
async fn main() {
    let seconds: f64 = std::env::var("BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5.0);
    let mut participants = BTreeMap::new();
    for name in ["inventory", "payments"] {
        let addr = participant().await;
        participants.insert(
            ParticipantName::new(name).expect("name"),
            format!("http://{addr}"),
        );
    }
    let (durable, _durable_dir) = run(true, &participants).await;
    let (baseline, _baseline_dir) = run(false, &participants).await;
    let durable_url = format!("http://{}/v1/transactions", durable.addr);
    let baseline_url = format!("http://{}/v1/transactions", baseline.addr);
    // Warm up connections and code paths.
    load(durable_url.clone(), 4, 0.5, "warm-d").await;
    load(baseline_url.clone(), 4, 0.5, "warm-b").await;

    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3)
        .max(1);
    println!(
        "2 participants; per concurrency {rounds} rounds of {seconds} s per mode, alternating; \
         median tx/s over rounds, p50/p99 pooled; one process (client, coordinator and \
         participants share the cores)"
    );
    println!(
        "{:>11} | {:>34} | {:>34} | {:>6}",
        "concurrency",
        "fsync on: tx/s  p50  p99  cpu/tx",
        "log off: tx/s  p50  p99  cpu/tx",
        "ratio"
    );
    for concurrency in [1, 16, 64] {
        let mut durable_rounds = Vec::new();
        let mut baseline_rounds = Vec::new();
        for round in 0..rounds {
            // Alternate which goes first so drift in the machine's load hits both alike.
            let order = if round % 2 == 0 {
                [true, false]
            } else {
                [false, true]
            };
            for fsync in order {
                let (url, into, tag) = if fsync {
                    (&durable_url, &mut durable_rounds, "d")
                } else {
                    (&baseline_url, &mut baseline_rounds, "b")
                };
                let run = format!("{tag}{concurrency}-{round}");
                into.push(load(url.clone(), concurrency, seconds, &run).await);
            }
        }
        let d = summarize(&durable_rounds);
        let b = summarize(&baseline_rounds);
        println!(
            "{concurrency:>11} | {:>8.0} {:>7.2}ms {:>7.2}ms {:>5.0}us | {:>8.0} {:>7.2}ms {:>7.2}ms {:>5.0}us | {:>6.2}",
            d.tx_per_s,
            d.p50_ms,
            d.p99_ms,
            d.cpu_us_per_tx,
            b.tx_per_s,
            b.p50_ms,
            b.p99_ms,
            b.cpu_us_per_tx,
            d.tx_per_s / b.tx_per_s
        );
    }
    let wal = durable.core.wal_stats();
    let fsync = &durable.core.metrics().decision_fsync;
    println!(
        "durable log: {} records, {} fsyncs ({:.1} records per fsync), decision fsync mean {:.3} ms, pending acks {}",
        wal.records_appended,
        wal.fsyncs,
        wal.records_appended as f64 / wal.fsyncs.max(1) as f64,
        fsync.mean_ms(),
        durable.core.gauges().pending_acks
    );
    let _ = durable.shutdown().await;
    let _ = baseline.shutdown().await;
}
