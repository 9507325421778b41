//! `twopc bench --sagas`: 3-step sagas through the coordinator (every step's start and outcome
//! forced in its log, the participants' barrier records forced in theirs) against the same
//! three steps sent as plain HTTP calls straight to the participants' `/saga/action` (their own
//! barrier records, no coordinator and no coordinator log), in the same run on the same cluster.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::json;

use crate::latency::quantile;
use cluster::cluster::{ClusterSpec, LocalCluster};

const STEPS: usize = 3;

/// One measured cell.
#[derive(Debug)]
struct Measured {
    per_s: f64,
    /// Completed in the whole cell, warm-up included (what the CPU reading covers).
    completed: u64,
    p50_ms: Option<f64>,
    p99_ms: Option<f64>,
    failed: u64,
    /// Why the first failed saga (or plain call) failed, so a cell that fails is never just
    /// a zero in the table.
    first_failure: Option<String>,
}

fn step(worker: usize, i: usize, delta: i64) -> serde_json::Value {
    json!({"ops": [{"op": "add", "key": format!("bench:{worker}:{i}"), "delta": delta}]})
}

/// Runs `concurrency` workers for `warmup + duration`; `one` does one saga (or its plain
/// equivalent) and says whether it completed, or why not.
async fn measure<F, Fut>(
    concurrency: usize,
    warmup: Duration,
    duration: Duration,
    one: F,
) -> Measured
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), String>> + Send,
{
    let one = Arc::new(one);
    let failed = Arc::new(AtomicU64::new(0));
    let completed = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let measure_from = start + warmup;
    let end = measure_from + duration;
    let mut workers = Vec::new();
    for worker in 0..concurrency {
        let (one, failed, completed) = (one.clone(), failed.clone(), completed.clone());
        workers.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut first_failure = None;
            let mut n = 0u64;
            while Instant::now() < end {
                n += 1;
                let began = Instant::now();
                let outcome = one(worker, n).await;
                if outcome.is_ok() {
                    completed.fetch_add(1, Ordering::Relaxed);
                }
                if began >= measure_from && Instant::now() <= end {
                    match outcome {
                        Ok(()) => latencies.push(began.elapsed()),
                        Err(why) => {
                            failed.fetch_add(1, Ordering::Relaxed);
                            first_failure.get_or_insert(why);
                        }
                    }
                }
            }
            (latencies, first_failure)
        }));
    }
    let mut all = Vec::new();
    let mut first_failure = None;
    for worker in workers {
        let (latencies, failure) = worker.await.unwrap_or_default();
        all.extend(latencies);
        first_failure = first_failure.or(failure);
    }
    all.sort();
    let ms = |q| quantile(&all, q).map(|d| d.as_secs_f64() * 1e3);
    Measured {
        per_s: all.len() as f64 / duration.as_secs_f64(),
        completed: completed.load(Ordering::Relaxed),
        p50_ms: ms(0.50),
        p99_ms: ms(0.99),
        failed: failed.load(Ordering::Relaxed),
        first_failure,
    }
}

/// Whether an answer is the one a completed saga (or a done step) gives; if not, what was
/// answered instead, for the failure line.
async fn answered(
    sent: reqwest::Result<reqwest::Response>,
    field: &str,
    expected: &str,
) -> Result<(), String> {
    let response = sent.map_err(|e| format!("request failed: {e}"))?;
    let status = response.status();
    let body: serde_json::Value = response
        .json()
        .await
        .map_err(|e| format!("{status}, not JSON: {e}"))?;
    if body[field] == expected {
        Ok(())
    } else {
        Err(format!("{status} {body}"))
    }
}

pub async fn run(concurrencies: &[usize], seconds: f64) -> Result<()> {
    let scratch = std::env::temp_dir().join(format!("twopc-bench-sagas-{}", std::process::id()));
    let names: Vec<String> = (0..STEPS).map(|i| format!("p{i}")).collect();
    let spec = ClusterSpec {
        binary: std::env::current_exe().context("cannot find the twopc binary")?,
        data_dir: scratch.clone(),
        participants: names.clone(),
        seeds: Vec::new(),
        coordinator_flags: Vec::new(),
        participant_flags: Vec::new(),
        env: Vec::new(),
        postgres_args: Vec::new(),
    };
    let mut cluster = tokio::task::block_in_place(|| LocalCluster::start(&spec))?;
    let coordinator = cluster.coordinator_url();
    let participants: Vec<String> = names
        .iter()
        .filter_map(|n| cluster.participant_url(n))
        .collect();
    let max = concurrencies.iter().copied().max().unwrap_or(1);
    let client_with = |args: &crate::client::ClientArgs| -> Result<reqwest::Client> {
        Ok(crate::client::builder(args)?
            .timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(max)
            .build()?)
    };
    let client = client_with(&crate::client::ClientArgs::for_cluster(
        cluster.tokens.as_ref(),
    ))?;
    // The plain calls go to the participants' peer routes, which take the peer token only (the
    // one a coordinator holds), not the operator's.
    let peer_client = client_with(
        &cluster
            .tokens
            .as_ref()
            .map_or_else(crate::client::ClientArgs::default, |t| {
                crate::client::ClientArgs::with_token_file(&t.path(protocol::auth::Kind::Peer))
            }),
    )?;
    let duration = Duration::from_secs_f64(seconds.max(0.1));
    let warmup = duration / 5;
    let tag = std::process::id();
    println!(
        "3-step sagas, {seconds} s per cell (after a warm-up of a fifth), durable cluster on this machine"
    );
    println!(
        "{:>11} {:>10} {:>9} {:>9} {:>10} {:>9} {:>9} {:>8} {:>11} {:>11}",
        "concurrency",
        "sagas/s",
        "p50 ms",
        "p99 ms",
        "plain/s",
        "p50 ms",
        "p99 ms",
        "ratio",
        "CPU us/saga",
        "CPU us/plain"
    );
    // CPU of the bench's own client and every server of the cluster (`cpu`), per completed
    // saga or plain equivalent, warm-up included on both sides.
    let pids: Option<Vec<u32>> = std::iter::once(Some(std::process::id()))
        .chain(std::iter::once(cluster.coordinator.pid()))
        .chain(cluster.participants.iter().map(|(_, node)| node.pid()))
        .collect();
    let cpu_now = || pids.as_deref().and_then(super::cpu::cpu_of_all);
    for &concurrency in concurrencies {
        let (c, url, names) = (client.clone(), coordinator.clone(), names.clone());
        let cpu_before_sagas = cpu_now();
        let saga = measure(concurrency, warmup, duration, move |worker, n| {
            let (c, url, names) = (c.clone(), url.clone(), names.clone());
            async move {
                let steps: Vec<_> = (0..STEPS)
                    .map(|i| json!({"name": format!("s{i}"), "participant": names[i],
                        "action": step(worker, i, 1), "compensation": step(worker, i, -1)}))
                    .collect();
                let body = json!({"id": format!("bench-{tag}-c{concurrency}-{worker}-{n}"), "steps": steps});
                answered(c.post(format!("{url}/v1/sagas")).json(&body).send().await, "state", "completed").await
            }
        })
        .await;
        let cpu_after_sagas = cpu_now();
        let (c, parts) = (peer_client.clone(), participants.clone());
        let plain = measure(concurrency, warmup, duration, move |worker, n| {
            let (c, parts) = (c.clone(), parts.clone());
            async move {
                for (i, base) in parts.iter().enumerate() {
                    let saga_id = format!("plain-{tag}-c{concurrency}-{worker}-{n}");
                    let body = json!({"saga_id": saga_id, "step": format!("s{i}"),
                        "op_id": format!("{saga_id}:s{i}:action"), "coordinator_id": "bench",
                        "epoch": 1, "payload": step(worker, i, 1)});
                    let sent = c
                        .post(format!("{base}/saga/action"))
                        .json(&body)
                        .send()
                        .await;
                    answered(sent, "status", "done").await?;
                }
                Ok(())
            }
        })
        .await;
        let cpu_after_plain = cpu_now();
        let per = |before, after, completed| {
            super::cpu::micros_per_tx(before, after, completed)
                .map_or("-".to_string(), |us| format!("{us:.0}"))
        };
        let cpu_saga = per(cpu_before_sagas, cpu_after_sagas, saga.completed);
        let cpu_plain = per(cpu_after_sagas, cpu_after_plain, plain.completed);
        let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
        let ratio = if plain.per_s > 0.0 {
            format!("{:.2}", saga.per_s / plain.per_s)
        } else {
            "-".into()
        };
        println!(
            "{concurrency:>11} {:>10.0} {:>9} {:>9} {:>10.0} {:>9} {:>9} {:>8} {:>11} {:>11}",
            saga.per_s,
            f(saga.p50_ms),
            f(saga.p99_ms),
            plain.per_s,
            f(plain.p50_ms),
            f(plain.p99_ms),
            ratio,
            cpu_saga,
            cpu_plain
        );
        if saga.failed + plain.failed > 0 {
            println!(
                "{:>11} failed: {} sagas, {} plain",
                "", saga.failed, plain.failed
            );
        }
        for (what, measured) in [("saga", &saga), ("plain call", &plain)] {
            if let Some(why) = &measured.first_failure {
                println!("{:>11} first failed {what}: {why}", "");
            }
            if measured.per_s == 0.0 {
                tokio::task::block_in_place(|| cluster.stop());
                anyhow::bail!(
                    "no {what} completed at concurrency {concurrency}: the cell measures nothing \
                     (first failure: {})",
                    measured.first_failure.as_deref().unwrap_or("none recorded")
                );
            }
        }
    }
    tokio::task::block_in_place(|| cluster.stop());
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(())
}
