//! `twopc bench --leases`: lease grants/s at the coordinator and fenced writes/s at a reference
//! KV participant, each against two references measured in the same run and interleaved cell by
//! cell: a read answered by the very same process (`GET /v1/leases/{name}`, `GET /v1/kv/{key}`:
//! one HTTP round trip with no log write, the floor of that route), and the same operation on a
//! second cluster with durability off (what the fsync costs). Every request goes through one
//! client, so the ratios compare like with like.
//!
//! A grant is an acquire of a name nobody holds (every one a new token and a forced log
//! record); a fenced write is `PUT /v1/kv/{key}` with the fence of a lease held for the whole
//! run, each worker on a key of its own, every write a new `op_id`. Both clusters run with a
//! fence key (docs/leases.md): grants are signed and every fenced write's proof is checked, as
//! a deployment with untrusted clients runs.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::Serialize;
use serde_json::json;

use crate::latency::quantile;
use cluster::cluster::{ClusterSpec, LocalCluster};

/// How long one request may take before it counts as failed.
const ANSWER_WAIT_MAX: Duration = Duration::from_secs(30);
/// The participant of the lease bench cluster.
const PARTICIPANT: &str = "kv";

/// One row: an operation at a concurrency, and its references.
#[derive(Debug, Clone, Serialize)]
pub struct LeaseCell {
    /// `grant` or `fenced_write`.
    pub op: &'static str,
    pub concurrency: usize,
    pub per_s: f64,
    pub failed: u64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    /// The same process answering a read of the same route family (no log write).
    pub read_per_s: f64,
    /// per_s / read_per_s.
    pub share_of_read: Option<f64>,
    /// The same operation with durability off (`--unsafe-no-fsync`), if measured.
    pub no_fsync_per_s: Option<f64>,
    /// per_s / no_fsync_per_s.
    pub share_of_no_fsync: Option<f64>,
    /// Median raw `write + fdatasync` on the logs' disk just before the cell: at concurrency 1
    /// every grant and fenced write waits for about one of these.
    pub disk_fsync_p50_us: f64,
    /// CPU time (user + system) of the bench's client and the durable cluster's servers during
    /// the operation's run, per operation answered in it (warm-up included on both sides);
    /// `None` where `/proc` is not there.
    pub cpu_us_per_op: Option<f64>,
}

/// One cluster (coordinator + KV participant) and what the bench set up on it.
struct Target {
    coordinator: String,
    participant: String,
    /// The fence token of the lease held for the whole run, and its proof.
    token: u64,
    proof: Option<String>,
    /// Sends the cluster's operator token (each cluster has its own tokens).
    client: reqwest::Client,
    cluster: LocalCluster,
}

impl Target {
    /// The CPU time of the bench's process and this cluster's servers so far (`cpu`).
    fn cpu(&self) -> Option<Duration> {
        let pids: Option<Vec<u32>> = std::iter::once(Some(std::process::id()))
            .chain(std::iter::once(self.cluster.coordinator.pid()))
            .chain(self.cluster.participants.iter().map(|(_, node)| node.pid()))
            .collect();
        super::cpu::cpu_of_all(&pids?)
    }
}

/// The holder every bench lease is granted to.
const HOLDER: &str = "bench";

fn start(dir: &std::path::Path, durable: bool) -> Result<LocalCluster> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let key = dir.join("fence.key");
    if !key.exists() {
        let secret: String = (0..64)
            .map(|_| char::from(b"0123456789abcdef"[fastrand::usize(0..16)]))
            .collect();
        std::fs::write(&key, format!("{secret}\n"))
            .with_context(|| format!("writing {}", key.display()))?;
    }
    let mut off = vec!["--fence-key-file".to_string(), key.display().to_string()];
    if !durable {
        off.push("--unsafe-no-fsync".to_string());
    }
    let spec = ClusterSpec {
        binary: std::env::current_exe().context("cannot find the twopc binary")?,
        data_dir: dir.join(if durable { "leases" } else { "leases-no-fsync" }),
        participants: vec![PARTICIPANT.to_string()],
        seeds: Vec::new(),
        coordinator_flags: off.clone(),
        participant_flags: off,
        env: Vec::new(),
        postgres_args: Vec::new(),
    };
    Ok(LocalCluster::start(&spec)?)
}

/// The resource every fenced write names, and the lease whose token they carry.
const FENCE: &str = "bench-fence";
/// A lease held for the whole run, read by the grant cells' reference.
const HELD: &str = "bench-held";
/// The key the fenced-write cells' reference reads.
const READ_KEY: &str = "bench-read";

async fn prepare(pool: usize, cluster: LocalCluster) -> Result<Target> {
    let client = crate::client::builder(&crate::client::ClientArgs::for_cluster(
        cluster.tokens.as_ref(),
    ))?
    .pool_max_idle_per_host(pool)
    .build()?;
    let coordinator = cluster.coordinator_url();
    let participant = cluster
        .participant_url(PARTICIPANT)
        .context("the bench cluster has no kv participant")?;
    let (mut token, mut proof) = (0, None);
    for name in [FENCE, HELD] {
        let answer = client
            .post(format!("{coordinator}/v1/leases/{name}"))
            .json(&json!({"holder": HOLDER, "ttl_ms": protocol::lease::LEASE_TTL_MS_MAX}))
            .send()
            .await?;
        if !answer.status().is_success() {
            bail!("acquiring {name} answered {}", answer.status());
        }
        let grant: serde_json::Value = answer.json().await?;
        if name == FENCE {
            token = grant["token"].as_u64().context("a grant without a token")?;
            proof = grant["proof"].as_str().map(str::to_string);
        }
    }
    let fence = json!({"resource": FENCE, "token": token, "holder": HOLDER, "proof": proof});
    let answer = client
        .put(format!("{participant}/v1/kv/{READ_KEY}"))
        .json(&json!({"value": 0, "fence": fence, "op_id": "bench-read-0"}))
        .send()
        .await?;
    if !answer.status().is_success() {
        bail!("the first fenced write answered {}", answer.status());
    }
    Ok(Target {
        coordinator,
        participant,
        token,
        proof,
        client,
        cluster,
    })
}

/// What one closed loop measured.
#[derive(Debug, Default)]
struct Measured {
    ok: u64,
    /// Answered 200 in the whole run, warm-up included (what a CPU reading covers).
    ok_all: u64,
    failed: u64,
    elapsed: Duration,
    latencies: Vec<Duration>,
}

impl Measured {
    fn per_second(&self) -> f64 {
        self.ok as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// `concurrency` workers each send `op(worker, seq)` and wait for it, for `warmup` (not
/// counted) then `duration`.
async fn closed_loop<F, Fut>(
    concurrency: usize,
    warmup: Duration,
    duration: Duration,
    op: F,
) -> Measured
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = bool> + Send,
{
    let op = Arc::new(op);
    let start = Instant::now();
    let measure_from = start + warmup;
    let stop_at = measure_from + duration;
    let mut workers = tokio::task::JoinSet::new();
    for worker in 0..concurrency.max(1) {
        let op = Arc::clone(&op);
        workers.spawn(async move {
            let mut part = Measured::default();
            let mut seq = 0u64;
            while Instant::now() < stop_at {
                seq += 1;
                let sent = Instant::now();
                let ok = op(worker, seq).await;
                part.ok_all += u64::from(ok);
                if sent < measure_from {
                    continue;
                }
                if ok {
                    part.ok += 1;
                    part.latencies.push(sent.elapsed());
                } else {
                    part.failed += 1;
                }
            }
            part
        });
    }
    let mut total = Measured::default();
    while let Some(joined) = workers.join_next().await {
        if let Ok(part) = joined {
            total.ok += part.ok;
            total.ok_all += part.ok_all;
            total.failed += part.failed;
            total.latencies.extend(part.latencies);
        }
    }
    total.elapsed = start.elapsed().saturating_sub(warmup);
    total.latencies.sort();
    total
}

async fn answered_200(request: reqwest::RequestBuilder) -> bool {
    request
        .timeout(ANSWER_WAIT_MAX)
        .send()
        .await
        .is_ok_and(|answer| answer.status() == 200)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// Acquire a name nobody holds.
    Grant,
    /// Read the lease held for the run (the grant's reference).
    LeaseRead,
    /// A fenced write of the worker's own key.
    FencedWrite,
    /// Read one key (the fenced write's reference).
    KvRead,
}

/// Measures `op` against `target`; `cell` makes names and op ids unique to the run and cell.
async fn measure(
    target: &Target,
    op: Op,
    cell: String,
    concurrency: usize,
    warmup: Duration,
    duration: Duration,
) -> Measured {
    let client = target.client.clone();
    let (coordinator, participant, token, proof) = (
        target.coordinator.clone(),
        target.participant.clone(),
        target.token,
        target.proof.clone(),
    );
    closed_loop(concurrency, warmup, duration, move |worker, seq| {
        let request = match op {
            Op::Grant => client
                .post(format!("{coordinator}/v1/leases/{cell}-{worker}-{seq}"))
                .json(&json!({"holder": format!("w{worker}"), "ttl_ms": protocol::lease::LEASE_TTL_MS_MIN})),
            Op::LeaseRead => client.get(format!("{coordinator}/v1/leases/{HELD}")),
            Op::FencedWrite => client
                .put(format!("{participant}/v1/kv/{cell}-{worker}"))
                .json(&json!({
                    "value": seq,
                    "fence": {"resource": FENCE, "token": token, "holder": HOLDER, "proof": proof},
                    "op_id": format!("{cell}-{worker}-{seq}"),
                })),
            Op::KvRead => client.get(format!("{participant}/v1/kv/{READ_KEY}")),
        };
        answered_200(request)
    })
    .await
}

/// Runs every lease cell and prints the table (or JSON).
pub async fn run(
    concurrencies: &[usize],
    seconds: f64,
    no_baseline: bool,
    as_json: bool,
) -> Result<()> {
    let scratch = std::env::temp_dir().join(format!("twopc-bench-leases-{}", std::process::id()));
    let pool = concurrencies.iter().copied().max().unwrap_or(1);
    let durable = tokio::task::block_in_place(|| start(&scratch, true))
        .context("starting the lease bench cluster")?;
    let durable = prepare(pool, durable).await?;
    let no_fsync = if no_baseline {
        None
    } else {
        let cluster = tokio::task::block_in_place(|| start(&scratch, false))
            .context("starting the durability-off lease cluster")?;
        Some(prepare(pool, cluster).await?)
    };
    let duration = Duration::from_secs_f64(seconds.max(0.1));
    let warmup = duration / 5;
    let run_id = format!("b{}", std::process::id());

    let mut cells = Vec::new();
    for (op, read, name) in [
        (Op::Grant, Op::LeaseRead, "grant"),
        (Op::FencedWrite, Op::KvRead, "fenced_write"),
    ] {
        for &concurrency in concurrencies {
            let cell = format!("{run_id}-{name}-c{concurrency}");
            let disk = tokio::task::block_in_place(|| super::disk::fsync_p50(&scratch, 100))
                .with_context(|| format!("probing fsync latency in {}", scratch.display()))?;
            let cpu_before = durable.cpu();
            let result = measure(
                &durable,
                op,
                format!("{cell}d"),
                concurrency,
                warmup,
                duration,
            )
            .await;
            let cpu_us_per_op = super::cpu::micros_per_tx(cpu_before, durable.cpu(), result.ok_all);
            let reference = measure(
                &durable,
                read,
                format!("{cell}r"),
                concurrency,
                warmup,
                duration,
            )
            .await;
            let off = match &no_fsync {
                Some(target) => Some(
                    measure(
                        target,
                        op,
                        format!("{cell}n"),
                        concurrency,
                        warmup,
                        duration,
                    )
                    .await
                    .per_second(),
                ),
                None => None,
            };
            let per_s = result.per_second();
            let read_per_s = reference.per_second();
            let ms = |q| quantile(&result.latencies, q).map(|d| d.as_secs_f64() * 1e3);
            if !as_json {
                eprintln!("  measured {name} at concurrency {concurrency}: {per_s:.0}/s");
            }
            cells.push(LeaseCell {
                op: name,
                concurrency,
                per_s,
                failed: result.failed + reference.failed,
                p50_ms: ms(0.50),
                p99_ms: ms(0.99),
                read_per_s,
                share_of_read: (read_per_s > 0.0).then(|| per_s / read_per_s),
                no_fsync_per_s: off,
                share_of_no_fsync: off.filter(|o| *o > 0.0).map(|o| per_s / o),
                disk_fsync_p50_us: disk.as_secs_f64() * 1e6,
                cpu_us_per_op,
            });
        }
    }
    if as_json {
        println!("{}", serde_json::to_string_pretty(&cells)?);
    } else {
        print_table(&cells);
    }
    drop(durable);
    drop(no_fsync);
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(())
}

fn print_table(cells: &[LeaseCell]) {
    let f = |v: Option<f64>, digits: usize| v.map_or("-".to_string(), |v| format!("{v:.digits$}"));
    println!(
        "{:>12} {:>5} {:>8} {:>7} {:>7} {:>8} {:>7} {:>10} {:>9} {:>8} {:>9} {:>6}",
        "op",
        "conc",
        "per s",
        "p50 ms",
        "p99 ms",
        "read/s",
        "/read",
        "no-fsync/s",
        "/no-fsync",
        "fsync us",
        "CPU us/op",
        "failed"
    );
    for c in cells {
        println!(
            "{:>12} {:>5} {:>8.0} {:>7} {:>7} {:>8.0} {:>7} {:>10} {:>9} {:>8.0} {:>9} {:>6}",
            c.op,
            c.concurrency,
            c.per_s,
            f(c.p50_ms, 2),
            f(c.p99_ms, 2),
            c.read_per_s,
            f(c.share_of_read, 2),
            f(c.no_fsync_per_s, 0),
            f(c.share_of_no_fsync, 2),
            c.disk_fsync_p50_us,
            f(c.cpu_us_per_op, 0),
            c.failed
        );
    }
}
