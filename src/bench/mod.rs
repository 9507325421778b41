//! `twopc bench`: committed transactions per second and latency for 1, 2 and 4 participants at
//! several concurrencies, fsync on, against two references run in the same process and
//! interleaved cell by cell so drift hits all of them: the very same cluster with durability
//! off (the baseline), and the same HTTP exchanges through processes that do nothing else (the
//! floor, see `floor`). Each cell also records the disk's raw fsync latency (`disk`).
//! `--leases` measures lease grants and fenced writes instead (see `leases`); `--ha` a
//! coordinator group against a single coordinator (see `ha`); `--outbox` writes with intents
//! relayed end to end against the same writes without (see `outbox`).

mod bitronix;
mod cpu;
mod disk;
pub mod floor;
mod ha;
mod leases;
mod load;
mod outbox;
mod outbox_check;
mod outbox_receiver;
mod pg_checks;
mod pg_server_cpu;
mod postgres;
mod sagas;
mod table;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};

use coordinator::http_client::Endpoint;

use crate::latency::quantile;
use crate::metrics_text;
use cluster::cluster::{ClusterSpec, LocalCluster};
use table::{Cell, HotCell, print_hot_table, print_table};

/// The WAL fsync counter every service exposes on `/metrics`.
const FSYNCS_METRIC: &str = "twopc_wal_fsyncs_total";

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Participant counts to measure (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    pub participants: Vec<usize>,
    /// Concurrencies to measure (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,16,64,256")]
    pub concurrency: Vec<usize>,
    /// Measured seconds per cell (after a warm-up of a fifth of it).
    #[arg(long, default_value_t = 3.0)]
    pub seconds: f64,
    /// Skip the durability-off baseline (no ratio).
    #[arg(long)]
    pub no_baseline: bool,
    /// Skip the HTTP floor (the same exchanges through processes that do nothing else).
    #[arg(long)]
    pub no_floor: bool,
    /// Start the measured coordinator with `--no-phase-batching`: every prepare and decision
    /// a message of its own, as before batched phase messages (for before/after figures).
    #[arg(long)]
    pub per_message: bool,
    /// Also measure hot-key cells: every transaction writes the same single key at each
    /// participant (lock contention), for each participant count and concurrency; printed
    /// after the normal table with committed tx/s, abort rate and p99.
    #[arg(long)]
    pub hot_key: bool,
    /// Measure lease grants/s and fenced writes/s instead of transactions, each against a
    /// read answered by the same process and against durability off (skipped by
    /// --no-baseline), at the --lease-concurrency levels.
    #[arg(long, conflicts_with_all = ["target_coordinator", "hot_key"])]
    pub leases: bool,
    /// Concurrencies of the --leases cells (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    pub lease_concurrency: Vec<usize>,
    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
    /// `postgres`: 2-database transfers through PostgreSQL participants against two plain
    /// local transactions (docs/benchmarks.md); uses TWOPC_POSTGRES_URL or a throwaway cluster.
    /// Reads --concurrency (default here 1,16,64), --seconds, --json and --peer only.
    #[arg(long, value_parser = ["kv", "postgres"], default_value = "kv")]
    pub backend: String,
    /// With `--backend postgres`: also run the same transfer through another transaction
    /// manager on the same PostgreSQL, cell by cell, and print its row and ratio beside
    /// twopc's (docs/benchmarks.md). `bitronix` needs Java and Debian's Bitronix packages.
    #[arg(long, value_enum)]
    pub peer: Option<postgres::Peer>,
    /// Measure an already running cluster: its coordinator URL, or every coordinator of its
    /// group comma-separated (the one leading at the start is measured), participants named by
    /// --target-participant; no baseline, since its durability cannot be switched off.
    #[arg(long, value_name = "URL[,URL...]", requires = "target_participant")]
    pub target_coordinator: Option<String>,
    /// Participant names registered at --target-coordinator (repeat; reference KV participants).
    #[arg(long)]
    pub target_participant: Vec<String>,
    /// Measure 3-step sagas instead (issue 13), at each --concurrency, against the same steps
    /// sent as plain HTTP calls to the participants (no coordinator log), in the same run.
    #[arg(long)]
    pub sagas: bool,
    /// Measure a coordinator group (a local etcd, a leader and one synchronous follower, 2
    /// participants) against a single coordinator in the same run, at c1 and c64 unless
    /// --concurrency is given; reads --seconds and --json only. Needs etcd (docs/ha.md).
    #[arg(long, conflicts_with_all = ["target_coordinator", "leases", "sagas", "hot_key"])]
    pub ha: bool,
    /// Measure writes with one next intent each, relayed by a `twopc relay` process to a
    /// receiver (intents delivered per second end to end, the delivery lag), against the same
    /// writes without intents in the same run, at the --outbox-concurrency levels; then check
    /// every intent was applied once and nothing is left open (exit 1 if not). Reads
    /// --seconds and --json.
    #[arg(long, conflicts_with_all = ["target_coordinator", "leases", "sagas", "ha", "hot_key"])]
    pub outbox: bool,
    /// Concurrencies of the --outbox cells (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    pub outbox_concurrency: Vec<usize>,
    /// Extra flags for the --outbox cell's `twopc relay`, as one string split on spaces
    /// (`--outbox-relay-flags "--max-in-flight 64"`).
    #[arg(long, value_name = "FLAGS", allow_hyphen_values = true)]
    pub outbox_relay_flags: Option<String>,
    #[command(flatten)]
    pub client: crate::client::ClientArgs,
}

pub fn main(args: Args) -> ExitCode {
    if let Some(peer) = args.peer
        && args.backend != "postgres"
    {
        // A usage error, worded and numbered as clap's own.
        eprintln!(
            "error: --peer {} needs --backend postgres (it runs the PostgreSQL transfer), not --backend {}",
            clap::ValueEnum::to_possible_value(&peer)
                .map_or_else(String::new, |v| v.get_name().to_string()),
            args.backend
        );
        return ExitCode::from(2);
    }
    if args.backend == "postgres" {
        let default = args.concurrency == [1, 16, 64, 256];
        let concurrency = if default {
            vec![1, 16, 64]
        } else {
            args.concurrency.clone()
        };
        return postgres::main(&concurrency, args.seconds, args.json, args.peer);
    }
    crate::async_main::block_on("bench", async {
        run(args).await.map(|()| ExitCode::SUCCESS)
    })
}

/// The token `--token-file` names, if any.
fn token_of(client: &crate::client::ClientArgs) -> Result<Option<protocol::auth::Token>> {
    client
        .token_file
        .as_deref()
        .map(crate::client::read_token)
        .transpose()
}

/// A cluster to measure: either ours (owned, stopped at the end) or the user's.
struct Target {
    coordinator: Arc<Endpoint>,
    /// Every URL whose `/metrics` counts fsyncs.
    metric_urls: Vec<String>,
    participants: Vec<String>,
    cluster: Option<LocalCluster>,
}

impl Target {
    /// The processes a cell of this target runs on: the bench itself (the client) and every
    /// server of its cluster; `None` for a cluster the bench did not start (their CPU is not
    /// ours to read).
    fn pids(&self) -> Option<Vec<u32>> {
        let cluster = self.cluster.as_ref()?;
        let mut pids = vec![std::process::id()];
        pids.push(cluster.coordinator.pid()?);
        for (_, node) in &cluster.participants {
            pids.push(node.pid()?);
        }
        Some(pids)
    }
}

fn start_own(
    durable: bool,
    per_message: bool,
    max_participants: usize,
    dir: &std::path::Path,
) -> Result<Target> {
    let names: Vec<String> = (0..max_participants).map(|i| format!("p{i}")).collect();
    let off = if durable {
        Vec::new()
    } else {
        vec!["--unsafe-no-fsync".to_string()]
    };
    let mut coordinator_flags = off.clone();
    if per_message {
        coordinator_flags.push("--no-phase-batching".to_string());
    }
    let spec = ClusterSpec {
        binary: std::env::current_exe().context("cannot find the twopc binary")?,
        data_dir: dir.join(if durable { "durable" } else { "baseline" }),
        participants: names.clone(),
        postgres_args: Vec::new(),
        seeds: Vec::new(),
        coordinator_flags,
        participant_flags: off,
        env: Vec::new(),
    };
    let cluster = LocalCluster::start(&spec)?;
    let mut metric_urls = vec![cluster.coordinator_url()];
    metric_urls.extend(names.iter().filter_map(|n| cluster.participant_url(n)));
    let token = cluster.tokens.as_ref().map(|t| t.operator.clone());
    Ok(Target {
        coordinator: Arc::new(endpoint(&cluster.coordinator_url(), token)?),
        metric_urls,
        participants: names,
        cluster: Some(cluster),
    })
}

/// The load's client of `url`, sending `token` on every call. `Endpoint` sends the first peer
/// token of its key ring, so the caller's token rides there (it is the only one it holds).
fn endpoint(
    url: &str,
    token: Option<protocol::auth::Token>,
) -> Result<Endpoint, coordinator::http_client::BadBaseUrl> {
    let endpoint = Endpoint::new(url)?;
    Ok(match token {
        Some(token) => endpoint.with_keys(protocol::auth::KeyRing::new(protocol::auth::Keys {
            peer: Some(vec![token]),
            ..protocol::auth::Keys::default()
        })),
        None => endpoint,
    })
}

async fn fsyncs(client: &reqwest::Client, target: &Target) -> Option<f64> {
    let mut total = 0.0;
    for url in &target.metric_urls {
        let text = client
            .get(format!("{url}/metrics"))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        total += metrics_text::value(&text, FSYNCS_METRIC)?;
    }
    Some(total)
}

async fn run(args: Args) -> Result<()> {
    if args.sagas {
        return sagas::run(&args.concurrency, args.seconds).await;
    }
    if args.outbox {
        let relay_flags: Vec<String> = args
            .outbox_relay_flags
            .as_deref()
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_string)
            .collect();
        return outbox::run(
            &args.outbox_concurrency,
            args.seconds,
            args.json,
            &relay_flags,
        )
        .await;
    }
    if args.ha {
        let concurrency = if args.concurrency == [1, 16, 64, 256] {
            vec![1, 64]
        } else {
            args.concurrency.clone()
        };
        return ha::run(&concurrency, args.seconds, args.json).await;
    }
    if args.leases {
        return leases::run(
            &args.lease_concurrency,
            args.seconds,
            args.no_baseline,
            args.json,
        )
        .await;
    }
    let max_participants = args.participants.iter().copied().max().unwrap_or(1);
    let scratch = std::env::temp_dir().join(format!("twopc-bench-{}", std::process::id()));
    let own = args.target_coordinator.is_none();
    let durable = match &args.target_coordinator {
        Some(list) => {
            // Checked here rather than by clap: a bad address is exit 1, named, as it was.
            let coordinators = crate::coordinator_group::Addresses::parse(list)
                .map_err(anyhow::Error::msg)
                .with_context(|| format!("--target-coordinator {list:?}"))?;
            let url = crate::target::leader(&coordinators, &args.client).await?;
            Target {
                coordinator: Arc::new({
                    let target = endpoint(&url, token_of(&args.client)?)
                        .with_context(|| format!("--target-coordinator {url:?}"))?;
                    match args.client.tls()? {
                        Some(tls) => target.with_tls(tls),
                        None => target,
                    }
                }),
                metric_urls: vec![url.trim_end_matches('/').to_string()],
                participants: args.target_participant.clone(),
                cluster: None,
            }
        }
        None => tokio::task::block_in_place(|| {
            start_own(true, args.per_message, max_participants, &scratch)
        })
        .context("starting the durable cluster")?,
    };
    let baseline = if own && !args.no_baseline {
        Some(
            tokio::task::block_in_place(|| {
                start_own(false, args.per_message, max_participants, &scratch)
            })
            .context("starting the durability-off baseline cluster")?,
        )
    } else {
        None
    };
    let floor = if own && !args.no_floor {
        let cluster = tokio::task::block_in_place(|| {
            floor::FloorCluster::start(max_participants, &scratch.join("floor"))
        })
        .context("starting the HTTP floor cluster")?;
        let relay = Arc::new(Endpoint::new(&cluster.relay_url())?);
        Some((cluster, relay))
    } else {
        None
    };
    let client = crate::client::build(&args.client, Duration::from_secs(30))?;
    let measured = Duration::from_secs_f64(args.seconds.max(0.1));
    let warmup = measured / 5;

    let mut cells = Vec::new();
    for &participants in &args.participants {
        let names = durable.participants.get(..participants).with_context(|| {
            format!("only {} participants available", durable.participants.len())
        })?;
        for &concurrency in &args.concurrency {
            let cell_id = format!("b{}-n{participants}-c{concurrency}", std::process::id());
            let (disk_fsync_p50_us, disk_fsync_preallocated_p50_us) = if own {
                let probe = |preallocated: bool| {
                    tokio::task::block_in_place(|| {
                        if preallocated {
                            disk::preallocated_fsync_p50(&scratch, 100)
                        } else {
                            disk::fsync_p50(&scratch, 100)
                        }
                    })
                    .map(|p50| p50.as_secs_f64() * 1e6)
                    .with_context(|| format!("probing fsync latency in {}", scratch.display()))
                };
                (Some(probe(false)?), Some(probe(true)?))
            } else {
                (None, None)
            };
            let fsyncs_before = fsyncs(&client, &durable).await;
            let shape = load::Shape {
                concurrency,
                warmup,
                duration: measured,
                hot: false,
            };
            let (result, cpu_us_per_tx) = with_cpu(
                durable.pids(),
                load::run(&durable.coordinator, &format!("{cell_id}d"), names, shape),
            )
            .await;
            let fsyncs_after = fsyncs(&client, &durable).await;
            let (base, baseline_cpu_us_per_tx) = match &baseline {
                Some(b) => {
                    let id = format!("{cell_id}b");
                    let run =
                        load::run(&b.coordinator, &id, &b.participants[..participants], shape);
                    let (run, cpu) = with_cpu(b.pids(), run).await;
                    (Some(run), cpu)
                }
                None => (None, None),
            };
            let (floor_result, floor_cpu_us_per_tx) = match &floor {
                Some((cluster, relay)) => {
                    let id = format!("{cell_id}f");
                    let run = load::run(relay, &id, &durable.participants[..participants], shape);
                    let (run, cpu) = with_cpu(cluster.pids(), run).await;
                    (Some(run), cpu)
                }
                None => (None, None),
            };
            let ms = |q| quantile(&result.latencies, q).map(|d| d.as_secs_f64() * 1e3);
            let per_s = result.per_second();
            let baseline_per_s = base.as_ref().map(|b| b.per_second());
            let floor_per_s = floor_result.as_ref().map(|f| f.per_second());
            let cell = Cell {
                participants,
                concurrency,
                committed_per_s: per_s,
                failed: result.failed,
                p50_ms: ms(0.50),
                p99_ms: ms(0.99),
                p999_ms: ms(0.999),
                baseline_per_s,
                ratio: baseline_per_s.filter(|b| *b > 0.0).map(|b| per_s / b),
                floor_per_s,
                share_of_floor: floor_per_s.filter(|f| *f > 0.0).map(|f| per_s / f),
                disk_fsync_p50_us,
                disk_fsync_preallocated_p50_us,
                fsyncs_per_tx: match (fsyncs_before, fsyncs_after) {
                    (Some(a), Some(b)) if result.committed_all > 0 => {
                        Some((b - a) / result.committed_all as f64)
                    }
                    _ => None,
                },
                cpu_us_per_tx,
                baseline_cpu_us_per_tx,
                floor_cpu_us_per_tx,
            };
            if !args.json {
                eprintln!(
                    "  measured {participants} participant(s) at concurrency {concurrency}: {per_s:.0} tx/s"
                );
            }
            cells.push(cell);
        }
    }
    let mut hot_cells = Vec::new();
    if args.hot_key {
        for &participants in &args.participants {
            let names = durable.participants.get(..participants).with_context(|| {
                format!("only {} participants available", durable.participants.len())
            })?;
            for &concurrency in &args.concurrency {
                let cell_id = format!("b{}-n{participants}-c{concurrency}h", std::process::id());
                let shape = load::Shape {
                    concurrency,
                    warmup,
                    duration: measured,
                    hot: true,
                };
                let result = load::run(&durable.coordinator, &cell_id, names, shape).await;
                let answered = result.committed + result.failed;
                let cell = HotCell {
                    participants,
                    concurrency,
                    committed_per_s: result.per_second(),
                    abort_rate: (answered > 0).then(|| result.failed as f64 / answered as f64),
                    p50_ms: quantile(&result.latencies, 0.50).map(|d| d.as_secs_f64() * 1e3),
                    p99_ms: quantile(&result.latencies, 0.99).map(|d| d.as_secs_f64() * 1e3),
                };
                if !args.json {
                    eprintln!(
                        "  measured the hot key with {participants} participant(s) at concurrency {concurrency}: {:.0} tx/s",
                        cell.committed_per_s
                    );
                }
                hot_cells.push(cell);
            }
        }
    }
    if args.json {
        if args.hot_key {
            println!(
                "{}",
                serde_json::to_string_pretty(
                    &serde_json::json!({"cells": cells, "hot_key": hot_cells})
                )?
            );
        } else {
            println!("{}", serde_json::to_string_pretty(&cells)?);
        }
    } else {
        print_table(&cells);
        if args.hot_key {
            print_hot_table(&hot_cells);
        }
    }
    drop(durable);
    drop(baseline);
    drop(floor);
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(())
}

/// Runs one cell's load and reads the CPU time of `pids` around it: the result and the CPU
/// microseconds per committed transaction (`None` where `/proc` cannot say).
async fn with_cpu(
    pids: Option<Vec<u32>>,
    run: impl std::future::Future<Output = load::LoadResult>,
) -> (load::LoadResult, Option<f64>) {
    let before = pids.as_deref().and_then(cpu::cpu_of_all);
    let result = run.await;
    let after = pids.as_deref().and_then(cpu::cpu_of_all);
    let per_tx = cpu::micros_per_tx(before, after, result.committed_all);
    (result, per_tx)
}
