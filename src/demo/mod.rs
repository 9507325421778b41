//! `twopc demo`: a local cluster (a coordinator and three checkout participants as child
//! processes), a live checkout workload, a SIGKILL of the coordinator part way through, and an
//! audit of every invariant at the end. Exits 0 only if every invariant holds. With
//! `--fencing` it plays the lease story instead (see `fencing`); `--backend postgres`
//! (postgres.rs) runs the checkout with `payments` in a PostgreSQL database; `--ha` (ha.rs)
//! runs it on a coordinator group and kills the leader instead; `--workflow` (workflow.rs)
//! runs the checkout workflow through an outbox, a relay and fenced workers.

mod fencing;
mod ha;
mod ha_load;
mod postgres;
mod reasons;
mod report;
mod sagas;
mod workflow;
mod workflow_audit;
mod workflow_pg;

pub use report::print_checks;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use cluster::audit::{self, AuditReport, ClientOutcome, ClusterUrls, RunRecord};
use cluster::checkout::{CheckoutConfig, Order};
use indicatif::{ProgressBar, ProgressStyle};

use crate::client::ClientArgs;
use crate::metrics_text;
use crate::target::TargetArgs;
use cluster::cluster::{ClusterSpec, LocalCluster};
use cluster::workload::{self, OrderResult, Progress, WorkloadOptions};
use protocol::auth::Kind;
use report::{CrashNote, LockStats, Summary};

/// The coordinator's gauge of decisions not yet acknowledged by every participant.
const PENDING_ACKS_METRIC: &str = "twopc_coordinator_pending_acks";
/// The coordinator's count of transactions it found unfinished in its log at start.
const RECOVERED_METRIC: &str = "twopc_coordinator_recovered_transactions";

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Where the cluster keeps its data and logs. Reused across runs unless --fresh.
    #[arg(long, default_value = "twopc-demo-data")]
    pub data_dir: PathBuf,
    /// Wipe the data directory first.
    #[arg(long)]
    pub fresh: bool,
    /// How many checkout orders to send.
    #[arg(long, default_value_t = 2000)]
    pub orders: u64,
    /// Orders in flight at once.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Prepare-phase timeout per order, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    pub timeout_ms: u64,
    /// Kill the coordinator (SIGKILL) after this share of the orders is done.
    #[arg(long, default_value_t = 0.4)]
    pub crash_at: f64,
    /// Do not kill the coordinator.
    #[arg(long)]
    pub no_crash: bool,
    /// Seed of the order generator (default: from the clock); printed so a run can be replayed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Leave the cluster running after the summary and print curl commands to try; Ctrl-C stops it.
    #[arg(long)]
    pub keep_running: bool,
    /// Save what the run observed, for `twopc audit --record FILE` later.
    #[arg(long)]
    pub record: Option<PathBuf>,
    /// Only write the participants' seed files (inventory.json, payments.json, shipping.json)
    /// into this directory and exit: for clusters started by other means.
    #[arg(long)]
    pub write_seeds: Option<PathBuf>,
    /// Run the checkout as sagas instead of 2PC (issue 13): some payments declined, some
    /// deadlines too short, some failures after a step that cannot be undone, the same crash.
    #[arg(long)]
    pub sagas: bool,
    /// Instead of the checkout workload: the lease story with real worker processes. A holder
    /// paused (SIGSTOP) past its TTL comes back, and its delayed write is refused as
    /// `stale_token` because the next holder already wrote. Exits 0 only if every step holds.
    #[arg(long, conflicts_with_all = ["target_coordinator", "write_seeds", "record", "keep_running"])]
    pub fencing: bool,
    /// What holds `payments` (with --workflow: the shop's checkouts, stock and outbox): `kv`
    /// (the reference KV participant; needs nothing) or `postgres` (a `--backend postgres`
    /// participant over a fresh database on TWOPC_POSTGRES_URL's server or a throwaway cluster;
    /// docs/postgres.md).
    #[arg(long, value_parser = ["kv", "postgres"], default_value = "kv")]
    pub backend: String,
    /// Instead of one coordinator: a coordinator group of two elected through a local etcd
    /// (docs/ha.md). The leader is SIGKILLed a quarter of the way in, the follower takes
    /// over, and the old leader comes back as a follower. Runs for --seconds (not --orders);
    /// always on a fresh <data dir>/ha. Needs etcd (Debian: etcd-server).
    #[arg(long, conflicts_with_all = ["fencing", "target_coordinator", "write_seeds", "record", "keep_running", "sagas"])]
    pub ha: bool,
    /// Instead of the checkout workload: the checkout workflow (docs/workflows.md) moved by two
    /// fenced `twopc workflow-worker`s through the shop's outbox and a `twopc relay` to a
    /// payments receiver; a worker paused past its lease, the relay killed mid-delivery, slow
    /// payments resolved from evidence; audited. Always on a fresh <data dir>/workflow.
    #[arg(long, conflicts_with_all = ["fencing", "ha", "sagas", "target_coordinator", "write_seeds", "record", "keep_running"])]
    pub workflow: bool,
    /// With --workflow: how many checkouts (1 to 60).
    #[arg(long, default_value_t = 12)]
    pub checkouts: u64,
    /// With --ha: how long the workload runs, in seconds [default: 24].
    #[arg(long)]
    pub seconds: Option<f64>,
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(flatten)]
    pub client: crate::client::ClientArgs,
}

pub fn main(args: Args) -> ExitCode {
    crate::async_main::block_on("demo", async {
        tokio::select! {
            result = run(args) => Ok(crate::async_main::verdict("demo", result?)),
            _ = tokio::signal::ctrl_c() => {
                // Dropping the run future drops the cluster, which kills every child.
                eprintln!("\ntwopc demo: interrupted; stopping every process");
                Ok(ExitCode::from(130))
            }
        }
    })
}

async fn run(mut args: Args) -> Result<bool> {
    // Checked here: clap's `requires` counts a flag's implicit `false` as given.
    anyhow::ensure!(
        args.ha || args.seconds.is_none(),
        "--seconds goes with --ha (the other demos send --orders)"
    );
    if args.fencing {
        return fencing::run(&args.data_dir, args.fresh).await;
    }
    if args.workflow {
        return workflow::run(&args.data_dir, args.checkouts, &args.backend).await;
    }
    let config = CheckoutConfig::default();
    if args.ha {
        anyhow::ensure!(
            args.backend == "kv",
            "--ha runs the checkout on the reference participants only (no --backend postgres)"
        );
        return ha::run(&args, &config).await;
    }
    if args.backend == "postgres" {
        return postgres::run(&args, &config).await;
    }
    if let Some(dir) = &args.write_seeds {
        write_seeds(dir, &config)?;
        return Ok(true);
    }
    let mut own = None;
    let urls = match args.target.urls(&args.client).await? {
        Some(urls) => {
            println!(
                "twopc demo: driving the running cluster at {}",
                urls.coordinator
            );
            urls
        }
        None => {
            let cluster = start_own_cluster(&args, &config)?;
            args.client = own_client_args(&cluster);
            let urls = cluster.checkout_urls()?;
            own = Some(cluster);
            urls
        }
    };
    println!("  coordinator {}", urls.coordinator);
    println!(
        "  inventory {}  payments {}  shipping {}",
        urls.inventory, urls.payments, urls.shipping
    );
    let all_ok = if args.sagas {
        sagas::drive(&args, &urls, own.as_mut()).await?
    } else {
        drive(&args, &config, &urls, own.as_mut()).await?
    };
    if let Some(mut cluster) = own {
        if args.keep_running {
            print_try_it(&urls, args.client.token_file.as_deref());
            tokio::signal::ctrl_c().await?;
            println!("stopping the cluster");
        }
        tokio::task::block_in_place(|| cluster.stop());
    }
    Ok(all_ok)
}

fn start_own_cluster(args: &Args, config: &CheckoutConfig) -> Result<LocalCluster> {
    if args.fresh && args.data_dir.exists() {
        std::fs::remove_dir_all(&args.data_dir)
            .with_context(|| format!("cannot wipe {}", args.data_dir.display()))?;
    }
    println!(
        "twopc demo: starting a coordinator and 3 participants (inventory, payments, shipping)"
    );
    println!(
        "  data in {}/ (reused across runs; --fresh wipes it)",
        args.data_dir.display()
    );
    let binary = std::env::current_exe().context("cannot find the twopc binary")?;
    let spec = ClusterSpec::checkout(&binary, &args.data_dir, config);
    let cluster = tokio::task::block_in_place(|| LocalCluster::start(&spec))?;
    println!("  process logs in {}/", cluster.log_dir.display());
    Ok(cluster)
}

/// What the demo's own calls to the cluster it started send: its operator token (operators
/// may do what clients do). Says where the token files are.
pub(crate) fn own_client_args(cluster: &LocalCluster) -> ClientArgs {
    match &cluster.tokens {
        Some(tokens) => {
            let operator = tokens.path(Kind::Operator);
            println!(
                "  tokens in {}/ (fresh for this data directory; {} for twopc ctl --token-file, \
                 {} for applications, {} between the services)",
                tokens.dir.display(),
                file_name(&operator),
                file_name(&tokens.path(Kind::Client)),
                file_name(&tokens.path(Kind::Peer)),
            );
            ClientArgs::with_token_file(&operator)
        }
        None => {
            println!("  no tokens: authentication is off (TWOPC_HARNESS_AUTH=off)");
            ClientArgs::default()
        }
    }
}

fn file_name(path: &std::path::Path) -> String {
    path.file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
}

/// Writes every seed file, then names them on stdout. A reader that went away (`| head -1`)
/// must not cost a file: the names are only a report, and writing them fails quietly.
fn write_seeds(dir: &std::path::Path, config: &CheckoutConfig) -> Result<()> {
    use std::io::Write;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut written = Vec::new();
    for (name, seed) in config.seeds() {
        let path = dir.join(format!("{name}.json"));
        std::fs::write(&path, serde_json::to_vec_pretty(&seed)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
        written.push(path);
    }
    let mut out = std::io::stdout().lock();
    for path in written {
        if writeln!(out, "wrote {}", path.display()).is_err() {
            break;
        }
    }
    Ok(())
}

/// Runs the workload (crashing our own coordinator part way), then audits and prints the
/// summary. Returns whether every invariant holds.
async fn drive(
    args: &Args,
    config: &CheckoutConfig,
    urls: &ClusterUrls,
    cluster: Option<&mut LocalCluster>,
) -> Result<bool> {
    let client = http_client(&args.client, args.concurrency)?;
    let before = audit::read_totals(&client, urls, config).await?;
    let ran = run_load(args, config, urls, cluster, &client, Order::request).await?;
    if let Some(path) = &args.record {
        let record = RunRecord {
            config: config.clone(),
            before,
            orders: ran.observed(),
        };
        std::fs::write(path, serde_json::to_vec(&record)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    println!("checking invariants against the participants and the coordinator...");
    let audit = audit::audit(&client, urls, config, before, &ran.observed(), AUDIT_SETTLE).await?;
    ran.summary(args, &audit).print();
    Ok(audit.all_ok())
}

/// How long the audit lets in-doubt transactions resolve before it calls them stuck.
const AUDIT_SETTLE: Duration = Duration::from_secs(30);

fn http_client(client: &ClientArgs, concurrency: usize) -> Result<reqwest::Client> {
    Ok(crate::client::builder(client)?
        .timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(concurrency.max(1))
        .build()?)
}

/// What a load run produced, for the audit and the summary.
struct Ran {
    results: Vec<OrderResult>,
    elapsed: Duration,
    crash: Option<CrashNote>,
    resent: u64,
    locks: Option<LockStats>,
}

impl Ran {
    /// What the client heard for each order.
    fn observed(&self) -> Vec<(Order, ClientOutcome)> {
        self.results
            .iter()
            .map(|r| (r.order.clone(), r.outcome))
            .collect()
    }

    fn summary<'a>(&'a self, args: &Args, audit: &'a AuditReport) -> Summary<'a> {
        Summary {
            results: &self.results,
            elapsed: self.elapsed,
            concurrency: args.concurrency,
            crash: self.crash.clone(),
            failover: None,
            resent: self.resent,
            locks: self.locks.clone(),
            audit,
        }
    }
}

/// Sends the checkout orders (each order's request body from `body_of`) with a live progress
/// bar, killing and restarting our own coordinator part way unless `--no-crash`.
async fn run_load(
    args: &Args,
    config: &CheckoutConfig,
    urls: &ClusterUrls,
    mut cluster: Option<&mut LocalCluster>,
    client: &reqwest::Client,
    body_of: fn(&Order, u64) -> serde_json::Value,
) -> Result<Ran> {
    let seed = args.seed.unwrap_or_else(|| fastrand::u64(..));
    let run_id = format!("o{}", unix_seconds());
    println!(
        "  {} orders, concurrency {}, seed {seed} (replay with --seed {seed})",
        args.orders, args.concurrency
    );
    let locks_before = LockStats::read(client, urls).await;

    let orders = workload::orders(config, &run_id, seed, args.orders);
    let counters = Arc::new(Progress::default());
    let progress = progress_bar(args.orders);
    let started = Instant::now();
    let options = WorkloadOptions {
        prepare_timeout_ms: args.timeout_ms,
        concurrency: args.concurrency,
        body_of,
        ..WorkloadOptions::new(&urls.coordinator)
    };
    let load = tokio::spawn(workload::run_orders_with_progress(
        client.clone(),
        options,
        orders,
        counters.clone(),
    ));

    let crash_after = (!args.no_crash && cluster.is_some())
        .then(|| ((args.orders as f64) * args.crash_at.clamp(0.0, 1.0)) as u64)
        .filter(|n| *n < args.orders);
    let mut crash = None;
    while !load.is_finished() {
        let done = counters.done();
        if crash.is_none()
            && let Some(after) = crash_after
            && done >= after
            && let Some(cluster) = cluster.as_deref_mut()
        {
            crash = Some(crash_coordinator(cluster, client, urls, &progress, done).await?);
        }
        let pending = metric(client, &urls.coordinator, PENDING_ACKS_METRIC).await;
        update_progress(&progress, &counters, started, pending);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let results = load.await.context("the load driver failed")?;
    let elapsed = started.elapsed();
    // Participants that run elsewhere (or predate lock waits, or keep their locks in
    // PostgreSQL) may expose none: the row then says so.
    let locks = match (locks_before, LockStats::read(client, urls).await) {
        (Some(before), Some(after)) => Some(after.since(&before)),
        _ => None,
    };
    update_progress(&progress, &counters, started, None);
    progress.finish();
    Ok(Ran {
        results,
        elapsed,
        crash,
        resent: counters.resent.load(Ordering::Relaxed),
        locks,
    })
}

async fn crash_coordinator(
    cluster: &mut LocalCluster,
    client: &reqwest::Client,
    urls: &ClusterUrls,
    progress: &ProgressBar,
    done: u64,
) -> Result<CrashNote> {
    progress.println(format!(
        ">>> {done} orders done: killing the coordinator with SIGKILL (no flush, no goodbye)"
    ));
    let killed = Instant::now();
    tokio::task::block_in_place(|| cluster.kill_coordinator());
    // Let clients see the outage (their retries keep the same ids) before it comes back.
    tokio::time::sleep(Duration::from_millis(300)).await;
    progress.println(">>> restarting it on the same data directory; recovery replays its log");
    tokio::task::block_in_place(|| cluster.restart_coordinator())?;
    let downtime = killed.elapsed();
    let recovered = metric(client, &urls.coordinator, RECOVERED_METRIC).await;
    let pending = metric(client, &urls.coordinator, PENDING_ACKS_METRIC).await;
    progress.println(format!(
        ">>> coordinator ready after {:.0} ms: {} unfinished transactions recovered, {} decisions being resent",
        downtime.as_secs_f64() * 1e3,
        recovered.map_or("?".into(), |n| n.to_string()),
        pending.map_or("?".into(), |n| n.to_string()),
    ));
    Ok(CrashNote {
        killed_after_orders: done,
        downtime,
        recovered,
    })
}

async fn metrics_of(client: &reqwest::Client, base: &str) -> Option<String> {
    client
        .get(format!("{base}/metrics"))
        .timeout(Duration::from_millis(500))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()
}

impl LockStats {
    /// The lock-wait counters and histogram summed over the three participants; `None` if
    /// any of them does not expose them.
    async fn read(client: &reqwest::Client, urls: &ClusterUrls) -> Option<LockStats> {
        let mut total = LockStats::default();
        for base in [&urls.inventory, &urls.payments, &urls.shipping] {
            let text = metrics_of(client, base).await?;
            let count = |name| metrics_text::value(&text, name).map(|v| v as u64);
            total.waits += count("twopc_participant_lock_waits_total")?;
            total.timeouts += count("twopc_participant_lock_timeouts_total")?;
            total.conflicts += count("twopc_participant_lock_conflicts_total")?;
            let buckets = metrics_text::buckets(&text, "twopc_participant_lock_wait_seconds");
            if total.buckets.is_empty() {
                total.buckets = buckets;
            } else {
                for ((_, sum), (_, n)) in total.buckets.iter_mut().zip(buckets) {
                    *sum += n;
                }
            }
        }
        Some(total)
    }

    /// What happened between `before` and `self` (the cluster may be reused across runs).
    fn since(&self, before: &LockStats) -> LockStats {
        LockStats {
            waits: self.waits.saturating_sub(before.waits),
            timeouts: self.timeouts.saturating_sub(before.timeouts),
            conflicts: self.conflicts.saturating_sub(before.conflicts),
            buckets: self
                .buckets
                .iter()
                .zip(
                    before
                        .buckets
                        .iter()
                        .map(|(_, n)| *n)
                        .chain(std::iter::repeat(0.0)),
                )
                .map(|((le, n), was)| (*le, (n - was).max(0.0)))
                .collect(),
        }
    }
}

async fn metric(client: &reqwest::Client, base: &str, name: &str) -> Option<u64> {
    let text = client
        .get(format!("{base}/metrics"))
        .timeout(Duration::from_millis(500))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    metrics_text::value(&text, name).map(|v| v as u64)
}

fn progress_bar(len: u64) -> ProgressBar {
    let bar = ProgressBar::new(len);
    if let Ok(style) =
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] [{bar:30}] {pos}/{len} {msg}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

fn update_progress(bar: &ProgressBar, c: &Progress, started: Instant, pending: Option<u64>) {
    let done = c.done();
    let rate = done as f64 / started.elapsed().as_secs_f64().max(1e-9);
    bar.set_position(done);
    bar.set_message(format!(
        "committed {} | aborted {} | in flight {} | {rate:.0}/s{}",
        c.committed.load(Ordering::Relaxed),
        c.aborted.load(Ordering::Relaxed),
        c.in_flight.load(Ordering::Relaxed),
        pending.map_or(String::new(), |p| format!(" | pending acks {p}")),
    ));
}

fn print_try_it(urls: &ClusterUrls, token_file: Option<&std::path::Path>) {
    let c = &urls.coordinator;
    println!("\nThe cluster is still running. Try it (Ctrl-C stops everything):\n");
    let curl = match token_file {
        Some(file) => {
            // The token goes through a variable, never onto the printed command line.
            println!(
                "  T=$(awk '!/^#/ && NF {{print $NF; exit}}' {})",
                file.display()
            );
            "curl -s -H \"authorization: Bearer $T\""
        }
        None => "curl -s",
    };
    println!(
        "  {curl} {c}/v1/transactions -H 'content-type: application/json' -d \
         '{{\"id\":\"try-1\",\"participants\":[\
         {{\"name\":\"inventory\",\"payload\":{{\"ops\":[{{\"op\":\"add\",\"key\":\"stock:sku-1\",\"delta\":-1,\"min\":0}}]}}}},\
         {{\"name\":\"payments\",\"payload\":{{\"ops\":[{{\"op\":\"add\",\"key\":\"balance:cust-1\",\"delta\":-10,\"min\":0}}]}}}}]}}'"
    );
    println!("  {curl} {c}/v1/transactions/try-1");
    println!("  {curl} '{c}/v1/transactions?state=committed&limit=5'");
    println!("  {curl} {}/v1/kv/stock:sku-1", urls.inventory);
    println!("  {curl} {}/v1/prepared", urls.payments);
    println!("  curl -s {c}/metrics");
    if let Some(file) = token_file {
        println!(
            "  TWOPC_TOKEN_FILE={} twopc ctl --coordinator {c} list",
            file.display()
        );
    }
}

fn unix_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
