//! `twopc bench --backend postgres`: transfers across two PostgreSQL databases through twopc
//! (a coordinator and two `--backend postgres` participants, fsync on everywhere) at several
//! concurrencies, against the same two updates run as two plain local transactions (no 2PC,
//! no coordinator) in the same run, cell by cell.
//!
//! The server is `TWOPC_POSTGRES_URL`'s or a throwaway cluster (as the tests find it). Each
//! transfer debits one of 1000 accounts in `bench_a` and credits one in `bench_b`, so row
//! conflicts are rare and the figure is the protocol's cost, not lock waits.
//!
//! `--peer bitronix` adds a third run to every cell, the same transfer through Bitronix (see
//! `bitronix`). After each 2PC run (twopc's and the peer's) the books are checked (see
//! `pg_checks`); a failed check stops the bench with an error (exit 1): the next runs could
//! only wait on the locks of what was left prepared, and figures of a run that broke the books
//! mean nothing. Every run reports CPU per committed
//! transaction: of its own processes, and of the PostgreSQL server (see `pg_server_cpu`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use serde::Serialize;

use super::bitronix::{Bitronix, PeerRun};
use super::cpu;
use super::pg_checks::{Books, Check};
use super::pg_server_cpu::PgServerCpu;
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
    /// CPU time (user + system) of the bench process (the client), the coordinator and both
    /// participants during the twopc run, warm-up included, per transaction committed in it.
    pub cpu_us_per_tx: Option<f64>,
    /// The same for every process of the PostgreSQL server; `None` when it is not local.
    pub postgres_cpu_us_per_tx: Option<f64>,
    /// CPU of the bench process (the client) during the plain run, per transaction.
    pub baseline_cpu_us_per_tx: Option<f64>,
    /// CPU of the PostgreSQL server during the plain run, per transaction.
    pub baseline_postgres_cpu_us_per_tx: Option<f64>,
    /// Money conserved and nothing prepared left after the twopc run.
    pub twopc_checks: Check,
    /// The `--peer` run of the same cell, `null` without `--peer`.
    pub peer: Option<PeerCell>,
}

/// The peer's run of one cell, against the same cell's plain baseline.
#[derive(Debug, Clone, Serialize)]
pub struct PeerCell {
    /// Which peer: `bitronix`.
    pub name: String,
    pub committed_per_s: f64,
    pub failed: u64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    /// committed_per_s / the cell's baseline_per_s.
    pub ratio: f64,
    /// CPU time of the peer's own process (the JVM: client and transaction manager in one)
    /// during the run, warm-up included, per transaction committed in it.
    pub cpu_us_per_tx: Option<f64>,
    /// The same for every process of the PostgreSQL server.
    pub postgres_cpu_us_per_tx: Option<f64>,
    /// Money conserved and nothing prepared left after the peer's run.
    pub checks: Check,
    /// The first failure the peer saw, if any failed.
    pub first_error: Option<String>,
}

struct Measured {
    done: u64,
    /// Done including the warm-up and the transfers in flight at the end (what CPU covers).
    done_all: u64,
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

/// Which transaction manager `--peer` runs beside twopc.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Peer {
    /// Bitronix 2.1 (Java, XA) with pgjdbc's XA data source: Debian's default-jdk-headless,
    /// libbtm-java, libgeronimo-jta-1.2-spec-java, libpostgresql-jdbc-java, libslf4j-java.
    Bitronix,
}

pub fn main(
    concurrency: &[usize],
    seconds: f64,
    json: bool,
    peer: Option<Peer>,
) -> std::process::ExitCode {
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
        let peer = match peer {
            Some(Peer::Bitronix) => {
                let peer_dir = dir.path().join("bitronix");
                std::fs::create_dir_all(&peer_dir)
                    .with_context(|| format!("creating {}", peer_dir.display()))?;
                if !json {
                    eprintln!("  starting Bitronix (javac, then a JVM warm-up of 2 s)");
                }
                Some(Bitronix::start(&db_a, &db_b, &peer_dir).context("the Bitronix peer")?)
            }
            None => None,
        };
        Ok((server, dir, nodes, db_a, db_b, coordinator_url, peer))
    })();
    let (_server, dir, nodes, db_a, db_b, coordinator_url, mut peer) = match setup {
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
        let books = Books::open(&db_a, &db_b).await?;
        let server_cpu = PgServerCpu::find(&db_a).await;
        let read_server = || server_cpu.as_ref().and_then(PgServerCpu::read);
        // The client (this process), the coordinator and both participants.
        let me = vec![std::process::id()];
        let twopc_pids: Option<Vec<u32>> = std::iter::once(Some(std::process::id()))
            .chain(nodes.iter().map(Node::pid))
            .collect();
        let own_cpu = |pids: &Option<Vec<u32>>| pids.as_deref().and_then(cpu::cpu_of_all);
        for &c in concurrency {
            let before = books.total().await?;
            let (cpu_0, server_0) = (own_cpu(&twopc_pids), read_server());
            let worker = twopc_worker(coordinator_url.clone(), client.clone());
            let mut twopc = measure(c, seconds, worker).await;
            let (cpu_1, server_1) = (own_cpu(&twopc_pids), read_server());
            let twopc_checks = books.check(before).await?;
            twopc_checks.require(&format!("twopc at concurrency {c}"))?;

            let (plain_cpu_0, plain_server_0) = (cpu::cpu_of_all(&me), read_server());
            let mut plain = measure(c, seconds, plain_worker(db_a.clone(), db_b.clone())).await;
            let (plain_cpu_1, plain_server_1) = (cpu::cpu_of_all(&me), read_server());

            let peer_cell = match peer.as_mut() {
                Some(bitronix) => {
                    let before = books.total().await?;
                    let server_0 = read_server();
                    let run =
                        tokio::task::block_in_place(|| bitronix.run(c, seconds / 5.0, seconds))?;
                    let server_1 = read_server();
                    let checks = books.check(before).await?;
                    checks.require(&format!("bitronix at concurrency {c}"))?;
                    Some(peer_cell(
                        &run,
                        plain.per_second(),
                        server_0,
                        server_1,
                        checks,
                    ))
                }
                None => None,
            };
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
                cpu_us_per_tx: cpu::micros_per_tx(cpu_0, cpu_1, twopc.done_all),
                postgres_cpu_us_per_tx: cpu::micros_per_tx(server_0, server_1, twopc.done_all),
                baseline_cpu_us_per_tx: cpu::micros_per_tx(
                    plain_cpu_0,
                    plain_cpu_1,
                    plain.done_all,
                ),
                baseline_postgres_cpu_us_per_tx: cpu::micros_per_tx(
                    plain_server_0,
                    plain_server_1,
                    plain.done_all,
                ),
                twopc_checks,
                peer: peer_cell,
            };
            if !json {
                print_cell(&cell, cells.is_empty());
            }
            cells.push(cell);
        }
        if json {
            println!("{}", serde_json::to_string_pretty(&cells)?);
        } else {
            print_notes(peer.is_some(), server_cpu.is_some());
        }
        drop(peer);
        Ok(std::process::ExitCode::SUCCESS)
    })
}

fn peer_cell(
    run: &PeerRun,
    plain_per_s: f64,
    server_0: Option<Duration>,
    server_1: Option<Duration>,
    checks: Check,
) -> PeerCell {
    let per_tx = |cpu: Option<Duration>| {
        cpu.filter(|_| run.committed_all > 0)
            .map(|cpu| cpu.as_secs_f64() * 1e6 / run.committed_all as f64)
    };
    PeerCell {
        name: "bitronix".to_string(),
        committed_per_s: run.per_second(),
        failed: run.failed,
        p50_ms: run.p50_ms,
        p99_ms: run.p99_ms,
        ratio: run.per_second() / plain_per_s.max(1e-9),
        cpu_us_per_tx: per_tx(run.cpu),
        postgres_cpu_us_per_tx: cpu::micros_per_tx(server_0, server_1, run.committed_all),
        checks,
        first_error: run.first_error.clone(),
    }
}

fn print_cell(cell: &PgCell, header: bool) {
    let f = |v: Option<f64>, digits: usize| v.map_or("-".to_string(), |v| format!("{v:.digits$}"));
    if header {
        println!(
            "2-database transfers: twopc (coordinator + 2 PostgreSQL participants) vs two plain local transactions"
        );
        println!(
            "{:>11} {:>9} {:>8} {:>6} {:>8} {:>8} {:>9} {:>8} | {:>10} {:>8} {:>8} {:>9} {:>8} | {:>5} | checks",
            "concurrency",
            "system",
            "tx/s",
            "failed",
            "p50 ms",
            "p99 ms",
            "CPU us/tx",
            "PG us/tx",
            "plain tx/s",
            "p50 ms",
            "p99 ms",
            "CPU us/tx",
            "PG us/tx",
            "ratio"
        );
    }
    println!(
        "{:>11} {:>9} {:>8.0} {:>6} {:>8} {:>8} {:>9} {:>8} | {:>10.0} {:>8} {:>8} {:>9} {:>8} | {:>5.2} | {}",
        cell.concurrency,
        "twopc",
        cell.committed_per_s,
        cell.failed,
        f(cell.p50_ms, 2),
        f(cell.p99_ms, 2),
        f(cell.cpu_us_per_tx, 0),
        f(cell.postgres_cpu_us_per_tx, 0),
        cell.baseline_per_s,
        f(cell.baseline_p50_ms, 2),
        f(cell.baseline_p99_ms, 2),
        f(cell.baseline_cpu_us_per_tx, 0),
        f(cell.baseline_postgres_cpu_us_per_tx, 0),
        cell.ratio,
        cell.twopc_checks.describe()
    );
    if let Some(peer) = &cell.peer {
        // The peer's ratio is to the same plain run as twopc's, printed once on the row above.
        println!(
            "{:>11} {:>9} {:>8.0} {:>6} {:>8} {:>8} {:>9} {:>8} | {:>10} {:>8} {:>8} {:>9} {:>8} | {:>5.2} | {}",
            cell.concurrency,
            peer.name,
            peer.committed_per_s,
            peer.failed,
            f(peer.p50_ms, 2),
            f(peer.p99_ms, 2),
            f(peer.cpu_us_per_tx, 0),
            f(peer.postgres_cpu_us_per_tx, 0),
            "",
            "",
            "",
            "",
            "",
            peer.ratio,
            peer.checks.describe()
        );
        if let Some(error) = peer.first_error.as_deref().filter(|_| peer.failed > 0) {
            println!("{:>11} first failure: {error}", "");
        }
    }
}

/// What the columns count.
fn print_notes(peer: bool, server_cpu: bool) {
    println!();
    println!(
        "CPU us/tx: user + system time per committed transfer, warm-up included; twopc: this bench \
         process (the client), the coordinator and both participants; plain: this bench process"
    );
    if peer {
        println!(
            "  bitronix: its JVM (client and transaction manager in one process), JVM start-up \
             and its 2 s warm-up excluded"
        );
    }
    if server_cpu {
        println!(
            "PG us/tx: every process of the PostgreSQL server (the postmaster, its live children \
             and those it reaped) during the same run"
        );
    } else {
        println!("PG us/tx: not measured (the PostgreSQL server is not on this machine)");
    }
    println!(
        "checks: after each 2PC run, money conserved (both databases' balances sum as before) \
         and no transaction left in pg_prepared_xacts"
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
                let (mut done, mut done_all, mut failed) = (0u64, 0u64, 0u64);
                let mut latencies = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let n = counter.fetch_add(1, Ordering::Relaxed);
                    let started = Instant::now();
                    let ok = work(n).await;
                    done_all += u64::from(ok);
                    if measuring.load(Ordering::Relaxed) {
                        if ok {
                            done += 1;
                            latencies.push(started.elapsed());
                        } else {
                            failed += 1;
                        }
                    }
                }
                (done, done_all, failed, latencies)
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
        done_all: 0,
        failed: 0,
        latencies: Vec::new(),
        elapsed,
    };
    for task in tasks {
        if let Ok((done, done_all, failed, latencies)) = task.await {
            total.done += done;
            total.done_all += done_all;
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
