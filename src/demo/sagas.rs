//! `twopc demo --sagas`: the checkout as sagas (issue 13) on the demo cluster. Most complete;
//! some payments are declined (compensated); some sagas get a deadline shorter than their
//! steps take (the timeout starts compensation); some fail after a step that cannot be undone
//! (needs_attention). The coordinator is SIGKILLed part way and restarted; then every saga is
//! checked against the saga oracle (`cluster::saga_checkout::check`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use cluster::audit::ClusterUrls;
use cluster::cluster::LocalCluster;
use cluster::saga_checkout::{self, Fate};
use tokio::sync::Semaphore;

use crate::demo::Args;

const QUANTITY: i64 = 2;
const AMOUNT: i64 = 30;

/// One saga of the run: its id, how it is made to end, and its deadline.
fn plan(run: &str, index: u64, rng: &mut fastrand::Rng) -> (String, Fate, u64) {
    let id = format!("{run}-{index}");
    match rng.u32(0..100) {
        0..=69 => (id, Fate::Complete, 30_000),
        70..=84 => (id, Fate::Declined, 30_000),
        // A deadline of a few milliseconds: it passes while the steps run.
        85..=94 => (id, Fate::Complete, rng.u64(1..8)),
        _ => (id, Fate::FailAfterPivot, 30_000),
    }
}

pub async fn drive(
    args: &Args,
    urls: &ClusterUrls,
    cluster: Option<&mut LocalCluster>,
) -> Result<bool> {
    let seed = args.seed.unwrap_or_else(|| fastrand::u64(..));
    let run = format!(
        "saga{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    );
    println!(
        "  {} sagas, concurrency {}, seed {seed} (replay with --seed {seed})",
        args.orders, args.concurrency
    );
    let client = crate::client::builder(&args.client)?
        .timeout(Duration::from_secs(60))
        .pool_max_idle_per_host(args.concurrency.max(1))
        .build()?;
    let mut rng = fastrand::Rng::with_seed(seed);
    let sagas: Vec<(String, Fate, u64)> =
        (0..args.orders).map(|i| plan(&run, i, &mut rng)).collect();
    let done = Arc::new(AtomicU64::new(0));
    let permits = Arc::new(Semaphore::new(args.concurrency.max(1)));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (id, fate, timeout_ms) in sagas.clone() {
        let (client, urls, done, permits) =
            (client.clone(), urls.clone(), done.clone(), permits.clone());
        tasks.push(tokio::spawn(async move {
            let _permit = permits.acquire_owned().await;
            let body = saga_checkout::request(&id, QUANTITY, AMOUNT, fate, timeout_ms);
            // No answer (the coordinator was killed) or 503 (recovering): send the same
            // request again, as a client should; the same id and body join the same saga.
            for _ in 0..600 {
                match saga_checkout::submit(&client, &urls, &body, Duration::from_secs(60)).await {
                    Some((status, _)) if status != 503 => break,
                    _ => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
            done.fetch_add(1, Ordering::Relaxed);
        }));
    }
    let crash_after = (!args.no_crash && cluster.is_some())
        .then(|| ((args.orders as f64) * args.crash_at.clamp(0.0, 1.0)) as u64)
        .filter(|n| *n < args.orders);
    let mut cluster = cluster;
    let mut crashed = false;
    while tasks.iter().any(|t| !t.is_finished()) {
        if !crashed
            && let Some(after) = crash_after
            && done.load(Ordering::Relaxed) >= after
            && let Some(cluster) = cluster.as_deref_mut()
        {
            println!(
                "  SIGKILL the coordinator after {} sagas answered; restarting it",
                done.load(Ordering::Relaxed)
            );
            tokio::task::block_in_place(|| cluster.kill_coordinator());
            tokio::task::block_in_place(|| cluster.restart_coordinator())?;
            crashed = true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for task in tasks {
        task.await.context("a saga client failed")?;
    }
    println!("checking every saga against the saga invariants...");
    let mut states: BTreeMap<String, u64> = BTreeMap::new();
    let mut broken = Vec::new();
    for (id, fate, _) in &sagas {
        let exists = client
            .get(format!("{}/v1/sagas/{id}", urls.coordinator))
            .send()
            .await
            .is_ok_and(|r| r.status() != 404);
        let effects = saga_checkout::effects(&client, urls, id)
            .await
            .map_err(anyhow::Error::msg)?;
        if !exists {
            // Its acceptance never became durable (the crash): nothing may have been applied.
            let none = saga_checkout::Effects {
                reserved: 0,
                charged: 0,
                shipped: false,
            };
            if effects != none {
                broken.push(format!("{id}: never accepted, yet {effects:?}"));
            }
            *states.entry("never accepted (crash)".into()).or_default() += 1;
            continue;
        }
        let view = saga_checkout::wait_terminal(&client, urls, id, Duration::from_secs(120))
            .await
            .map_err(anyhow::Error::msg)?;
        if let Err(e) = saga_checkout::check(&view, effects, QUANTITY, AMOUNT) {
            broken.push(format!("{id} ({fate:?}): {e}"));
        }
        *states
            .entry(view["state"].as_str().unwrap_or("?").to_string())
            .or_default() += 1;
    }
    let elapsed = started.elapsed();
    println!();
    println!(
        "sagas in {:.1} s{}",
        elapsed.as_secs_f64(),
        if crashed {
            ", coordinator killed and restarted once"
        } else {
            ""
        }
    );
    for (state, n) in &states {
        println!("  {state:<24} {n}");
    }
    let rows = [
        "completed: every step applied exactly once",
        "compensated: every succeeded step undone exactly once, nothing else touched",
        "needs_attention: a reason, nothing compensated, nothing applied twice",
        "never accepted: nothing applied",
    ];
    for row in rows {
        println!("  [{}] {row}", if broken.is_empty() { "ok" } else { "??" });
    }
    for b in &broken {
        println!("  BROKEN {b}");
    }
    Ok(broken.is_empty())
}
