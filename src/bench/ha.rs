//! `twopc bench --ha`: the coordinator group's price (issue 27). A group (a 1-member local
//! etcd, a leader and one synchronous follower) and a single coordinator, each with the same
//! 2 reference participants, measured in the same run and interleaved cell by cell, at c1 and
//! c64 (or `--concurrency`): committed tx/s, p50, p99, and CPU per transaction of every
//! process of the setup (the follower and etcd included for the group). Measuring starts only
//! once the leader lists the follower in its sync set, and each group row says which
//! followers were still in it after the cell, so a row never silently measures a degraded
//! leader.
//!
//! It prints the goals (group >= 0.7x the single coordinator's tx/s at c64; group p50
//! at c1 within the single p50 plus one loopback round trip plus one fsync) with the figures
//! measured here, and never fails on them: speed is read, not asserted.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Serialize;

use cluster::cluster::{ClusterSpec, LocalCluster};
use cluster::ha_cluster::{HaCluster, HaSpec};

use super::{cpu, disk, endpoint, load};
use crate::latency::quantile;

/// The participants of both setups.
const PARTICIPANTS: usize = 2;
/// The group's nodes: the first leads, the second follows.
const NODES: [&str; 2] = ["node-a", "node-b"];
/// The throughput goal of issue 27, as a share of the single coordinator's.
const THROUGHPUT_GOAL: f64 = 0.7;
/// How long the group may take to elect, start and attach its follower.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);

/// One row: one setup at one concurrency.
#[derive(Debug, Clone, Serialize)]
pub struct HaCell {
    /// `single` or `group`.
    pub setup: &'static str,
    pub concurrency: usize,
    pub committed_per_s: f64,
    pub failed: u64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    /// CPU (user + system) of the bench's client and every process of the setup, per
    /// committed transaction (warm-up included on both sides).
    pub cpu_us_per_tx: Option<f64>,
    /// The group's followers in the leader's sync set after the cell (group rows only).
    pub followers_in_sync: Option<Vec<String>>,
}

/// The goals, with the figures they are read against.
#[derive(Debug, Clone, Serialize)]
pub struct Goals {
    /// group tx/s / single tx/s at c64 (if c64 was measured).
    pub c64_throughput_ratio: Option<f64>,
    pub throughput_goal: f64,
    /// group p50 - single p50 at c1 (if c1 was measured).
    pub c1_p50_extra_ms: Option<f64>,
    /// Median HTTP round trip to the follower over loopback (GET /healthz, keep-alive).
    pub round_trip_p50_ms: f64,
    /// Median raw fdatasync of one record on the logs' disk.
    pub fsync_p50_ms: f64,
}

impl Goals {
    fn p50_budget_ms(&self) -> f64 {
        self.round_trip_p50_ms + self.fsync_p50_ms
    }
}

pub async fn run(concurrency: &[usize], seconds: f64, json: bool) -> Result<()> {
    let scratch = std::env::temp_dir().join(format!("twopc-bench-ha-{}", std::process::id()));
    let result = measure(concurrency, seconds, json, &scratch).await;
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

fn spec(dir: &std::path::Path) -> Result<ClusterSpec> {
    Ok(ClusterSpec {
        binary: std::env::current_exe().context("cannot find the twopc binary")?,
        data_dir: dir.to_path_buf(),
        participants: (0..PARTICIPANTS).map(|i| format!("p{i}")).collect(),
        postgres_args: Vec::new(),
        seeds: Vec::new(),
        coordinator_flags: Vec::new(),
        participant_flags: Vec::new(),
        env: Vec::new(),
    })
}

async fn measure(
    concurrency: &[usize],
    seconds: f64,
    json: bool,
    scratch: &std::path::Path,
) -> Result<()> {
    let group_spec = HaSpec {
        cluster: spec(&scratch.join("group"))?,
        nodes: NODES.map(String::from).to_vec(),
        etcd_members: 1,
        lease_ttl_ms: None,
    };
    let mut group = tokio::task::block_in_place(|| HaCluster::start(&group_spec))
        .context("starting the coordinator group")?;
    let operator = group.cluster.http().build()?;
    let (leader, _) = group
        .wait_in_sync(&operator, SETTLE_TIMEOUT)
        .await
        .context("waiting for the follower to be in sync")?;
    let urls = group.coordinator_urls();
    let follower = urls
        .iter()
        .enumerate()
        .find(|(i, _)| *i != leader)
        .map(|(_, url)| url.clone())
        .context("the group has no follower")?;
    let single_spec = spec(&scratch.join("single"))?;
    let single = tokio::task::block_in_place(|| LocalCluster::start(&single_spec))
        .context("starting the single coordinator")?;

    let token = group.cluster.tokens.as_ref().map(|t| t.operator.clone());
    let group_target = Arc::new(endpoint(&urls[leader], token.clone())?);
    let single_target = Arc::new(endpoint(&single.coordinator_url(), token_of(&single))?);
    let names: Vec<String> = (0..PARTICIPANTS).map(|i| format!("p{i}")).collect();
    let measured = Duration::from_secs_f64(seconds.max(0.1));
    let shape = |concurrency| load::Shape {
        concurrency,
        warmup: measured / 5,
        duration: measured,
        hot: false,
    };

    let mut cells = Vec::new();
    for &c in concurrency {
        let cell_id = format!("h{}-c{c}", std::process::id());
        // The group first, then the single coordinator: interleaved, so drift hits both.
        let pids = group.pids().map(with_bench);
        let before = pids.as_deref().and_then(cpu::cpu_of_all);
        let result = load::run(&group_target, &format!("{cell_id}g"), &names, shape(c)).await;
        let after = pids.as_deref().and_then(cpu::cpu_of_all);
        let in_sync = group
            .view(&operator, &urls[leader])
            .await
            .map(|view| view.in_sync());
        cells.push(cell("group", c, &result, before, after, in_sync));
        if !json {
            eprintln!(
                "  measured the group at concurrency {c}: {:.0} tx/s",
                result.per_second()
            );
        }

        let pids = single_pids(&single).map(with_bench);
        let before = pids.as_deref().and_then(cpu::cpu_of_all);
        let result = load::run(&single_target, &format!("{cell_id}s"), &names, shape(c)).await;
        let after = pids.as_deref().and_then(cpu::cpu_of_all);
        cells.push(cell("single", c, &result, before, after, None));
        if !json {
            eprintln!(
                "  measured the single coordinator at concurrency {c}: {:.0} tx/s",
                result.per_second()
            );
        }
    }

    let round_trip = round_trip_p50(&operator, &follower).await;
    let fsync = tokio::task::block_in_place(|| disk::fsync_p50(scratch, 100))
        .with_context(|| format!("probing fsync latency in {}", scratch.display()))?;
    let pair = |c: usize| {
        let find = |setup| {
            cells
                .iter()
                .find(|x: &&HaCell| x.setup == setup && x.concurrency == c)
        };
        find("group").zip(find("single"))
    };
    let goals = Goals {
        c64_throughput_ratio: pair(64)
            .filter(|(_, s)| s.committed_per_s > 0.0)
            .map(|(g, s)| g.committed_per_s / s.committed_per_s),
        throughput_goal: THROUGHPUT_GOAL,
        c1_p50_extra_ms: pair(1).and_then(|(g, s)| Some(g.p50_ms? - s.p50_ms?)),
        round_trip_p50_ms: round_trip.as_secs_f64() * 1e3,
        fsync_p50_ms: fsync.as_secs_f64() * 1e3,
    };

    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({"cells": cells, "goals": goals}))?
        );
    } else {
        print_table(&cells, concurrency);
        print_goals(&goals);
    }
    tokio::task::block_in_place(|| {
        group.stop();
        drop(single);
    });
    Ok(())
}

fn token_of(cluster: &LocalCluster) -> Option<protocol::auth::Token> {
    cluster.tokens.as_ref().map(|t| t.operator.clone())
}

/// The bench's own process (the client) and `pids`.
fn with_bench(mut pids: Vec<u32>) -> Vec<u32> {
    pids.push(std::process::id());
    pids
}

fn single_pids(cluster: &LocalCluster) -> Option<Vec<u32>> {
    let mut pids = vec![cluster.coordinator.pid()?];
    for (_, node) in &cluster.participants {
        pids.push(node.pid()?);
    }
    Some(pids)
}

fn cell(
    setup: &'static str,
    concurrency: usize,
    result: &load::LoadResult,
    cpu_before: Option<Duration>,
    cpu_after: Option<Duration>,
    followers_in_sync: Option<Vec<String>>,
) -> HaCell {
    let ms = |q| quantile(&result.latencies, q).map(|d| d.as_secs_f64() * 1e3);
    HaCell {
        setup,
        concurrency,
        committed_per_s: result.per_second(),
        failed: result.failed,
        p50_ms: ms(0.50),
        p99_ms: ms(0.99),
        cpu_us_per_tx: cpu::micros_per_tx(cpu_before, cpu_after, result.committed_all),
        followers_in_sync: match setup {
            "group" => Some(followers_in_sync.unwrap_or_default()),
            _ => None,
        },
    }
}

/// Median of 100 `GET /healthz` round trips to the follower on one kept-alive connection:
/// the network part of what a sync point adds (the follower's fsync is the other).
async fn round_trip_p50(client: &reqwest::Client, url: &str) -> Duration {
    let mut latencies = Vec::with_capacity(100);
    for _ in 0..100 {
        let started = Instant::now();
        let answered = client
            .get(format!("{url}/healthz"))
            .timeout(Duration::from_secs(2))
            .send()
            .await;
        if let Ok(response) = answered {
            let _ = response.bytes().await;
            latencies.push(started.elapsed());
        }
    }
    latencies.sort();
    quantile(&latencies, 0.5).unwrap_or_default()
}

fn print_table(cells: &[HaCell], concurrency: &[usize]) {
    let f = |v: Option<f64>, digits: usize| v.map_or("-".to_string(), |v| format!("{v:.digits$}"));
    println!(
        "{:<12} {:>5} {:>8} {:>7} {:>7} {:>9} {:>6}  followers in sync",
        "setup", "conc", "tx/s", "p50 ms", "p99 ms", "CPU us/tx", "failed"
    );
    for &c in concurrency {
        let row = |setup| {
            cells
                .iter()
                .find(|x| x.setup == setup && x.concurrency == c)
        };
        let (Some(group), Some(single)) = (row("group"), row("single")) else {
            continue;
        };
        for x in [single, group] {
            println!(
                "{:<12} {:>5} {:>8.0} {:>7} {:>7} {:>9} {:>6}  {}",
                x.setup,
                x.concurrency,
                x.committed_per_s,
                f(x.p50_ms, 2),
                f(x.p99_ms, 2),
                f(x.cpu_us_per_tx, 0),
                x.failed,
                match &x.followers_in_sync {
                    Some(names) if names.is_empty() => "none (degraded)".to_string(),
                    Some(names) => names.join(","),
                    None => String::new(),
                }
            );
        }
        let ratio = |g: Option<f64>, s: Option<f64>| match (g, s) {
            (Some(g), Some(s)) if s > 0.0 => format!("{:.2}x", g / s),
            _ => "-".to_string(),
        };
        println!(
            "{:<12} {:>5} {:>8} {:>7} {:>7} {:>9}",
            "group/single",
            c,
            ratio(Some(group.committed_per_s), Some(single.committed_per_s)),
            ratio(group.p50_ms, single.p50_ms),
            ratio(group.p99_ms, single.p99_ms),
            ratio(group.cpu_us_per_tx, single.cpu_us_per_tx),
        );
    }
}

fn print_goals(goals: &Goals) {
    let verdict = |met: bool| if met { "met" } else { "NOT met" };
    println!();
    match goals.c64_throughput_ratio {
        Some(ratio) => println!(
            "goal: group tx/s at c64 >= {:.1}x the single coordinator's: {ratio:.2}x ({})",
            goals.throughput_goal,
            verdict(ratio >= goals.throughput_goal)
        ),
        None => println!("goal: group tx/s at c64: not measured (add 64 to --concurrency)"),
    }
    match goals.c1_p50_extra_ms {
        Some(extra) => println!(
            "goal: group p50 at c1 within one round trip + one fsync of the single's: \
             +{extra:.2} ms against {:.2} ms ({:.2} ms round trip + {:.2} ms fsync) ({})",
            goals.p50_budget_ms(),
            goals.round_trip_p50_ms,
            goals.fsync_p50_ms,
            verdict(extra <= goals.p50_budget_ms())
        ),
        None => println!("goal: group p50 at c1: not measured (add 1 to --concurrency)"),
    }
}
