//! `twopc bench --backend postgres`: transfers across two PostgreSQL databases through twopc
//! (a coordinator and two `--backend postgres` participants, fsync on everywhere) at several
//! concurrencies, against the same two updates run as two plain local transactions (no 2PC,
//! no coordinator) in the same run, cell by cell.
//!
//! The server is `TWOPC_POSTGRES_URL`'s or a throwaway cluster (as the tests find it). Each
//! transfer debits one of 1000 accounts in `bench_a` and credits one in `bench_b`, so row
//! conflicts are rare and the figure is the protocol's cost, not lock waits.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use serde::Serialize;

use crate::latency::quantile;
use cluster::node::{Node, free_port};
use cluster::pg_cluster::{READY_TIMEOUT, coordinator, pg_participant, seed_accounts, transfer};
use cluster::postgres::PgServer;

const ACCOUNTS: u32 = 1000;

/// One row: twopc against the plain-local baseline at one concurrency.
#[derive(Debug, Clone, Serialize)]
pub struct PgCell {
    pub concurrency: usize,
    pub committed_per_s: f64,
    pub failed: u64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub baseline_per_s: f64,
    pub baseline_p50_ms: Option<f64>,
    pub baseline_p99_ms: Option<f64>,
    /// committed_per_s / baseline_per_s.
    pub ratio: f64,
}

struct Measured {
    done: u64,
    failed: u64,
    latencies: Vec<Duration>,
    elapsed: Duration,
}

impl Measured {
    fn per_second(&self) -> f64 {
        self.done as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
    fn ms(&mut self, q: f64) -> Option<f64> {
        self.latencies.sort();
        quantile(&self.latencies, q).map(|d| d.as_secs_f64() * 1000.0)
    }
}

pub fn main(concurrency: &[usize], seconds: f64, json: bool) -> std::process::ExitCode {
    // Processes and databases first (blocking), then the load on a runtime.
    let setup = (|| -> Result<_> {
        let server =
            PgServer::find().map_err(|e| anyhow!("{}\n({e})", cluster::postgres::INSTALL_HINT))?;
        let dir = tempfile::tempdir().context("temporary directory")?;
        let binary = std::env::current_exe().context("cannot find the twopc binary")?;
        let db_a = server.create_database("bench_a");
        let db_b = server.create_database("bench_b");
        seed_accounts(&db_a, ACCOUNTS, 1_000_000_000);
        seed_accounts(&db_b, ACCOUNTS, 1_000_000_000);
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
        let coordinator_url = format!("http://{addr}");
        let mut nodes: Vec<Node> = ["bench_a", "bench_b"]
            .iter()
            .zip([&db_a, &db_b])
            .map(|(name, db)| {
                pg_participant(
                    &binary,
                    dir.path(),
                    name,
                    db,
                    Some(&coordinator_url),
                    Vec::new(),
                )
            })
            .collect();
        for node in &mut nodes {
            node.wait_ready(READY_TIMEOUT).map_err(|e| anyhow!(e))?;
        }
        let participants = [
            ("bench_a".to_string(), nodes[0].url()),
            ("bench_b".to_string(), nodes[1].url()),
        ];
        let mut coordinator = coordinator(&binary, dir.path(), addr, &participants, Vec::new());
        coordinator
            .wait_ready(READY_TIMEOUT)
            .map_err(|e| anyhow!(e))?;
        nodes.push(coordinator);
        Ok((server, dir, nodes, db_a, db_b, coordinator_url))
    })();
    let (_server, dir, _nodes, db_a, db_b, coordinator_url) = match setup {
        Ok(parts) => parts,
        Err(e) => {
            eprintln!("twopc bench: {e:#}");
            return std::process::ExitCode::FAILURE;
        }
    };
    crate::async_main::block_on("bench", async move {
        let mut cells = Vec::new();
        // The nodes' tokens (made when they started, in the same directory).
        let tokens = cluster::auth::TokenSet::for_harness(dir.path())?;
        let client =
            crate::client::builder(&crate::client::ClientArgs::for_cluster(tokens.as_ref()))?
                .build()?;
        for &c in concurrency {
            let worker = twopc_worker(coordinator_url.clone(), client.clone());
            let mut twopc = measure(c, seconds, worker).await;
            let mut plain = measure(c, seconds, plain_worker(db_a.clone(), db_b.clone())).await;
            let cell = PgCell {
                concurrency: c,
                committed_per_s: twopc.per_second(),
                failed: twopc.failed,
                p50_ms: twopc.ms(0.5),
                p99_ms: twopc.ms(0.99),
                baseline_per_s: plain.per_second(),
                baseline_p50_ms: plain.ms(0.5),
                baseline_p99_ms: plain.ms(0.99),
                ratio: twopc.per_second() / plain.per_second().max(1e-9),
            };
            if !json {
                print_cell(&cell, cells.is_empty());
            }
            cells.push(cell);
        }
        if json {
            println!("{}", serde_json::to_string_pretty(&cells)?);
        }
        Ok(std::process::ExitCode::SUCCESS)
    })
}

fn print_cell(cell: &PgCell, header: bool) {
    let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
    if header {
        println!(
            "2-database transfers: twopc (coordinator + 2 PostgreSQL participants) vs two plain local transactions"
        );
        println!(
            "{:>11} {:>10} {:>7} {:>8} {:>8} | {:>10} {:>8} {:>8} | {:>6}",
            "concurrency",
            "2pc tx/s",
            "failed",
            "p50 ms",
            "p99 ms",
            "plain tx/s",
            "p50 ms",
            "p99 ms",
            "ratio"
        );
    }
    println!(
        "{:>11} {:>10.0} {:>7} {:>8} {:>8} | {:>10.0} {:>8} {:>8} | {:>6.2}",
        cell.concurrency,
        cell.committed_per_s,
        cell.failed,
        ms(cell.p50_ms),
        ms(cell.p99_ms),
        cell.baseline_per_s,
        ms(cell.baseline_p50_ms),
        ms(cell.baseline_p99_ms),
        cell.ratio
    );
}

/// One unit of work: `Ok(true)` done, `Ok(false)` failed (counted, not timed).
type Work = Arc<
    dyn Fn(u64) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send>> + Send + Sync,
>;

/// Runs `concurrency` workers for a fifth of `seconds` (warm-up), then `seconds` measured.
async fn measure(concurrency: usize, seconds: f64, work: Work) -> Measured {
    let stop = Arc::new(AtomicBool::new(false));
    let measuring = Arc::new(AtomicBool::new(false));
    let counter = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (stop, measuring, counter, work) = (
                stop.clone(),
                measuring.clone(),
                counter.clone(),
                work.clone(),
            );
            tokio::spawn(async move {
                let (mut done, mut failed, mut latencies) = (0u64, 0u64, Vec::new());
                while !stop.load(Ordering::Relaxed) {
                    let n = counter.fetch_add(1, Ordering::Relaxed);
                    let started = Instant::now();
                    let ok = work(n).await;
                    if measuring.load(Ordering::Relaxed) {
                        if ok {
                            done += 1;
                            latencies.push(started.elapsed());
                        } else {
                            failed += 1;
                        }
                    }
                }
                (done, failed, latencies)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs_f64(seconds / 5.0)).await;
    measuring.store(true, Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    measuring.store(false, Ordering::Relaxed);
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let mut total = Measured {
        done: 0,
        failed: 0,
        latencies: Vec::new(),
        elapsed,
    };
    for task in tasks {
        if let Ok((done, failed, latencies)) = task.await {
            total.done += done;
            total.failed += failed;
            total.latencies.extend(latencies);
        }
    }
    total
}

fn accounts(n: u64) -> (String, String) {
    let mut rng = fastrand::Rng::with_seed(n);
    (
        format!("a{}", rng.u32(0..ACCOUNTS)),
        format!("a{}", rng.u32(0..ACCOUNTS)),
    )
}

fn twopc_worker(coordinator: String, client: reqwest::Client) -> Work {
    let run = format!("{:x}", fastrand::u64(..));
    Arc::new(move |n| {
        let (client, url) = (client.clone(), format!("{coordinator}/v1/transactions"));
        let (from, to) = accounts(n);
        let body = transfer(&format!("b{run}-{n}"), "bench_a", &from, "bench_b", &to, 1);
        Box::pin(async move {
            match client.post(url).json(&body).send().await {
                Ok(r) if r.status().is_success() => r
                    .json::<serde_json::Value>()
                    .await
                    .is_ok_and(|v| v["outcome"] == "committed"),
                _ => false,
            }
        })
    })
}

/// The same two updates as two plain autocommit transactions, one per database, each worker
/// on its own pair of sessions (connected lazily, kept in a small pool).
fn plain_worker(db_a: String, db_b: String) -> Work {
    type Pair = (tokio_postgres::Client, tokio_postgres::Client);
    let pool: Arc<std::sync::Mutex<Vec<Pair>>> = Arc::default();
    Arc::new(move |n| {
        let (pool, db_a, db_b) = (pool.clone(), db_a.clone(), db_b.clone());
        let (from, to) = accounts(n);
        Box::pin(async move {
            let pair = pool.lock().unwrap_or_else(|p| p.into_inner()).pop();
            let pair = match pair {
                Some(pair) => pair,
                None => match (connect(&db_a).await, connect(&db_b).await) {
                    (Some(a), Some(b)) => (a, b),
                    _ => return false,
                },
            };
            let debit = pair
                .0
                .execute(
                    "UPDATE accounts SET balance = balance - 1 WHERE id = $1 AND balance >= 1",
                    &[&from],
                )
                .await;
            let credit = pair
                .1
                .execute(
                    "UPDATE accounts SET balance = balance + 1 WHERE id = $1",
                    &[&to],
                )
                .await;
            let ok = matches!((debit, credit), (Ok(1), Ok(1)));
            pool.lock().unwrap_or_else(|p| p.into_inner()).push(pair);
            ok
        })
    })
}

async fn connect(url: &str) -> Option<tokio_postgres::Client> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .ok()?;
    tokio::spawn(connection);
    Some(client)
}
