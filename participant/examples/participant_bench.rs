//! Prepare+commit pairs per second against one reference participant, served in-process over
//! real loopback HTTP, at 1, 16 and 64 concurrent clients: first with fsync on (group commit),
//! then the same calls with fsync off (`SyncPolicy::Never`) as the baseline; prints the ratio.
//!
//! The machine is shared and noisy, so every cell runs `ROUNDS` times, fsync and baseline
//! alternating, and the median run (by pairs/s) of each is printed.
//!
//! `cargo run --release -p twopc-participant --example participant_bench [-- SECONDS_PER_RUN]`
//!
//! Each client waits for its commit's acknowledgement before the next prepare, so a commit
//! record never finds a prepare to share its fsync with at 1 client: it waits out the log's
//! group delay. `BENCH_COMMIT_GROUP_DELAY_US` sets that delay (default: the library's).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use participant::kv::{KvStore, routes};
use participant::{Participant, ParticipantConfig, SyncPolicy};
use protocol::{CoordinatorId, GlobalTxId, Incarnation};
use serde_json::json;

/// The coordinator the bench speaks as, and its one run.
const COORDINATOR: &str = "bench";
const RUN: Incarnation = Incarnation(1);

const CONCURRENCY: [usize; 3] = [1, 16, 64];
const ROUNDS: usize = 3;

#[derive(Debug, Clone, Copy)]
struct Figures {
    pairs_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    records_per_fsync: f64,
}

fn group_delay() -> Duration {
    std::env::var("BENCH_COMMIT_GROUP_DELAY_US")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(
            participant::WalOptions::default().group_delay,
            Duration::from_micros,
        )
}

async fn run(sync: SyncPolicy, clients: usize, seconds: f64) -> Figures {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = ParticipantConfig::new(dir.path());
    config.wal.sync = sync;
    config.wal.group_delay = group_delay();
    let participant = Participant::open(config, KvStore::new).expect("open participant");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let app = routes::app(&participant);
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let client = reqwest::Client::new();
    let stop = Arc::new(AtomicBool::new(false));
    let measuring = Arc::new(AtomicBool::new(false));
    // Shared, so positions rise in the order attempts begin, as one coordinator run's do.
    let positions = Arc::new(AtomicU64::new(1));
    let coordinator = CoordinatorId::new(COORDINATOR).expect("coordinator id");
    let mut workers = Vec::new();
    for worker in 0..clients {
        let (client, base, stop, measuring, positions, coordinator) = (
            client.clone(),
            base.clone(),
            stop.clone(),
            measuring.clone(),
            positions.clone(),
            coordinator.clone(),
        );
        workers.push(tokio::spawn(async move {
            let mut latencies_us = Vec::new();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let txid = format!("w{worker}-{n}");
                n += 1;
                let position = positions.fetch_add(1, Ordering::Relaxed);
                let gtid = GlobalTxId::compose(&coordinator, RUN, position);
                let start = Instant::now();
                let prepare = json!({"txid": txid, "gtid": gtid, "coordinator_id": COORDINATOR,
                    "epoch": 1, "incarnation": RUN.to_string(), "position": position,
                    "payload": {"ops": [{"op": "add", "key": format!("k{worker}"), "delta": 1}]}});
                let vote: serde_json::Value = client
                    .post(format!("{base}/2pc/prepare"))
                    .json(&prepare)
                    .send()
                    .await
                    .expect("prepare")
                    .json()
                    .await
                    .expect("vote");
                assert_eq!(vote, json!({"vote": "yes"}));
                let commit = json!({"txid": txid, "gtid": gtid, "coordinator_id": COORDINATOR,
                    "epoch": 1, "incarnation": RUN.to_string()});
                let status = client
                    .post(format!("{base}/2pc/commit"))
                    .json(&commit)
                    .send()
                    .await
                    .expect("commit")
                    .status();
                assert!(status.is_success());
                if measuring.load(Ordering::Relaxed) {
                    latencies_us.push(start.elapsed().as_micros() as u64);
                }
            }
            latencies_us
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await; // warm-up: connections, allocator
    measuring.store(true, Ordering::Relaxed);
    let start = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    measuring.store(false, Ordering::Relaxed);
    let elapsed = start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for worker in workers {
        all.extend(worker.await.expect("worker"));
    }
    server.abort();
    let stats = participant.wal_stats();
    participant.close();
    all.sort_unstable();
    let pct = |p: f64| {
        let i = ((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1));
        all.get(i).copied().unwrap_or(0) as f64 / 1000.0
    };
    Figures {
        pairs_per_s: all.len() as f64 / elapsed,
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
        records_per_fsync: stats.records_appended as f64 / stats.fsyncs.max(1) as f64,
    }
}

/// The disk's own append+fdatasync latency right now (p50 and p99 of 200, in ms), printed so the
/// figures can be read against the machine's state: the disk here is shared and its fsync
/// latency swings by 30x with other tenants' writes.
fn fdatasync_probe() -> (f64, f64) {
    use std::io::Write;
    let dir = tempfile::tempdir().expect("temp dir");
    let mut file = std::fs::File::create(dir.path().join("probe")).expect("probe file");
    let mut us: Vec<u64> = (0..200)
        .map(|_| {
            let start = Instant::now();
            file.write_all(&[1u8; 256]).expect("write");
            file.sync_data().expect("fdatasync");
            start.elapsed().as_micros() as u64
        })
        .collect();
    us.sort_unstable();
    (us[100] as f64 / 1000.0, us[198] as f64 / 1000.0)
}

fn median(mut runs: Vec<Figures>) -> Figures {
    runs.sort_by(|a, b| a.pairs_per_s.total_cmp(&b.pairs_per_s));
    runs[runs.len() / 2]
}

fn main() {
    let seconds: f64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2.0);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    println!(
        "prepare+commit pairs against one in-process reference participant over loopback HTTP"
    );
    println!(
        "{seconds} s per run after 0.5 s warm-up, median of {ROUNDS} alternating runs; \
         client and server share this process"
    );
    println!("commit group delay: {:?}", group_delay());
    let (p50, p99) = fdatasync_probe();
    println!("disk before: 256-byte append + fdatasync p50 {p50:.2} ms, p99 {p99:.2} ms\n");
    println!(
        "{:>11} | {:>12} {:>8} {:>8} {:>8} | {:>12} {:>8} {:>8} | {:>5}",
        "concurrent",
        "fsync pairs/s",
        "p50 ms",
        "p99 ms",
        "rec/sync",
        "nosync pairs/s",
        "p50 ms",
        "p99 ms",
        "ratio"
    );
    for clients in CONCURRENCY {
        let mut on = Vec::new();
        let mut off = Vec::new();
        for _ in 0..ROUNDS {
            on.push(runtime.block_on(run(SyncPolicy::Fsync, clients, seconds)));
            off.push(runtime.block_on(run(SyncPolicy::Never, clients, seconds)));
        }
        let (on, off) = (median(on), median(off));
        println!(
            "{:>11} | {:>13.0} {:>8.2} {:>8.2} {:>8.1} | {:>14.0} {:>8.2} {:>8.2} | {:>5.2}",
            clients,
            on.pairs_per_s,
            on.p50_ms,
            on.p99_ms,
            on.records_per_fsync,
            off.pairs_per_s,
            off.p50_ms,
            off.p99_ms,
            on.pairs_per_s / off.pairs_per_s
        );
    }
    let (p50, p99) = fdatasync_probe();
    println!("\ndisk after: 256-byte append + fdatasync p50 {p50:.2} ms, p99 {p99:.2} ms");
}
