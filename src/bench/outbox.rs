//! `twopc bench --outbox`: writes with one next intent each (`POST /v1/kv` with `next`) at a
//! reference KV participant, relayed by a real `twopc relay` process to a deduplicating
//! receiver, against the very same writes without intents, alternated cell by cell in the same
//! run on the same participant.
//!
//! Measured per concurrency: writes/s with intents and without; intents delivered per second
//! end to end in the measured window, counted where the effect happens (the receiver) and where
//! the outbox records it (`twopc_participant_outbox_delivered_total`); the delivery lag from a
//! write's answer to its effect at the receiver; how long the backlog took to drain after the
//! window; and CPU per delivered intent and per plain write (the bench's process, which is the
//! client and the receiver, the participant and the relay). At the end it checks that every
//! intent written was applied exactly once at the receiver and that the outbox holds nothing
//! open: a run that breaks either fails (exit 1), whatever its speed.
//!
//! Each write is a step of a workflow of its own (its own aggregate), so the relay may deliver
//! them in parallel; intents of one aggregate would go one at a time, in order.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::Serialize;
use serde_json::json;

use super::outbox_check::{Counters, OutboxCheck, judge};
use super::outbox_receiver::Receiver;
use crate::latency::quantile;
use crate::metrics_text;
use cluster::cluster::{ClusterSpec, LocalCluster};
use cluster::node::{Node, NodeSpec, free_port};

/// The participant whose outbox is relayed.
const PARTICIPANT: &str = "kv";
/// The target name the intents carry and the relay maps to the receiver.
const TARGET: &str = "payments";
/// How long one write may take before it counts as failed.
const ANSWER_WAIT_MAX: Duration = Duration::from_secs(30);
/// How long the outbox may take to drain after a cell before the run fails.
const DRAIN_WAIT_MAX: Duration = Duration::from_secs(120);

const DELIVERED_METRIC: &str = "twopc_participant_outbox_delivered_total";
const WRITTEN_METRIC: &str = "twopc_participant_outbox_intents_written_total";
const PENDING_METRIC: &str = "twopc_participant_outbox_pending";
const FAILED_METRIC: &str = "twopc_participant_outbox_failed";

/// One row: a concurrency, writes with intents against the same writes without.
#[derive(Debug, Clone, Serialize)]
pub struct OutboxCell {
    pub concurrency: usize,
    /// Writes with one intent each answered 200 per second in the measured window.
    pub writes_per_s: f64,
    pub write_p50_ms: Option<f64>,
    pub write_p99_ms: Option<f64>,
    /// The same writes without `next`, measured right after (same participant).
    pub plain_per_s: f64,
    pub plain_p50_ms: Option<f64>,
    pub plain_p99_ms: Option<f64>,
    /// writes_per_s / plain_per_s.
    pub share_of_plain: Option<f64>,
    /// Effects first applied at the receiver in the measured window, per second.
    pub delivered_per_s: f64,
    /// The participant's `delivered` counter over the same window, per second.
    pub outbox_delivered_per_s: Option<f64>,
    /// From a write's answer to its intent's effect at the receiver (writes sent in the
    /// window); a delivery that beat the answer to the client counts as 0.
    pub lag_p50_ms: Option<f64>,
    pub lag_p99_ms: Option<f64>,
    /// Intents pending in the outbox when the window closed (the relay's backlog).
    pub pending_at_end: Option<u64>,
    /// From the window's end until nothing was open in the outbox.
    pub drain_ms: f64,
    /// CPU (user + system) of the client and receiver, participant and relay from the cell's
    /// start until drained, per intent written and delivered in it (warm-up included).
    pub cpu_us_per_intent: Option<f64>,
    /// The same processes during the plain writes, per plain write.
    pub cpu_us_per_plain_write: Option<f64>,
    /// Writes (with or without intents) not answered 200.
    pub failed: u64,
}

/// The participant, the relay and the receiver of the run, and what the bench sends with.
struct Setup {
    cluster: LocalCluster,
    relay: Node,
    receiver: Receiver,
    participant: String,
    client: reqwest::Client,
}

impl Setup {
    fn pids(&self) -> Option<Vec<u32>> {
        let participant = self
            .cluster
            .participants
            .iter()
            .find(|(name, _)| name == PARTICIPANT)?
            .1
            .pid()?;
        Some(vec![std::process::id(), participant, self.relay.pid()?])
    }

    fn cpu(&self) -> Option<Duration> {
        super::cpu::cpu_of_all(&self.pids()?)
    }

    /// A counter or gauge of the participant's `/metrics`.
    async fn metric(&self, name: &str) -> Option<f64> {
        let text = self
            .client
            .get(format!("{}/metrics", self.participant))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        metrics_text::value(&text, name)
    }

    async fn open(&self) -> Option<u64> {
        let pending = self.metric(PENDING_METRIC).await?;
        let failed = self.metric(FAILED_METRIC).await?;
        Some((pending + failed) as u64)
    }
}

async fn start(scratch: &std::path::Path, pool: usize, relay_flags: &[String]) -> Result<Setup> {
    let binary = std::env::current_exe().context("cannot find the twopc binary")?;
    let spec = ClusterSpec {
        binary: binary.clone(),
        data_dir: scratch.join("cluster"),
        participants: vec![PARTICIPANT.to_string()],
        seeds: Vec::new(),
        coordinator_flags: Vec::new(),
        participant_flags: Vec::new(),
        env: Vec::new(),
        postgres_args: Vec::new(),
    };
    let cluster = tokio::task::block_in_place(|| LocalCluster::start(&spec))
        .context("starting the participant")?;
    let participant = cluster
        .participant_url(PARTICIPANT)
        .context("the bench cluster has no kv participant")?;
    let receiver = Receiver::start().await.context("starting the receiver")?;
    let port = free_port();
    let mut args: Vec<String> = vec![
        "relay".into(),
        "--participant".into(),
        format!("{PARTICIPANT}={participant}"),
        "--target".into(),
        format!("{TARGET}={}", receiver.url()),
        "--listen".into(),
        format!("127.0.0.1:{port}"),
    ];
    if let Some(tokens) = &cluster.tokens {
        args.push("--peer-token-file".into());
        args.push(
            tokens
                .path(protocol::auth::Kind::Peer)
                .display()
                .to_string(),
        );
    }
    args.extend(relay_flags.iter().cloned());
    let mut relay = Node::start(NodeSpec {
        name: "relay".into(),
        binary,
        args,
        env: Vec::new(),
        addr: format!("127.0.0.1:{port}").parse()?,
        log_path: scratch.join("relay.log"),
        tokens: None,
    });
    tokio::task::block_in_place(|| relay.wait_ready(Duration::from_secs(30)))
        .map_err(anyhow::Error::msg)
        .context("starting the relay")?;
    let client = crate::client::builder(&crate::client::ClientArgs::for_cluster(
        cluster.tokens.as_ref(),
    ))?
    .pool_max_idle_per_host(pool)
    .build()?;
    Ok(Setup {
        cluster,
        relay,
        receiver,
        participant,
        client,
    })
}

/// What one closed loop of writes measured.
#[derive(Debug, Default)]
struct Measured {
    /// Answered 200 in the window.
    ok: u64,
    /// Answered 200 in the whole run, warm-up included.
    ok_all: u64,
    failed: u64,
    first_failure: Option<String>,
    latencies: Vec<Duration>,
    /// Every intent written (warm-up included): its event id, when its write was answered,
    /// and whether the write was sent in the window.
    acked: Vec<(String, Instant, bool)>,
}

/// Where a loop's window lies.
#[derive(Debug, Clone, Copy)]
struct Window {
    from: Instant,
    to: Instant,
}

impl Window {
    /// A window that opens after `warmup` from now and lasts `duration`.
    fn after(warmup: Duration, duration: Duration) -> Window {
        let from = Instant::now() + warmup;
        Window {
            from,
            to: from + duration,
        }
    }
}

/// `concurrency` workers each write their own fresh key with (or without) one intent, from
/// now until the window closes; only writes sent in the window are counted.
async fn writes(
    setup: &Setup,
    cell: &str,
    intents: bool,
    concurrency: usize,
    window: Window,
) -> Measured {
    let mut workers = tokio::task::JoinSet::new();
    for worker in 0..concurrency.max(1) {
        let client = setup.client.clone();
        let url = format!("{}{}", setup.participant, protocol::routes::KV_WRITE);
        let cell = cell.to_string();
        workers.spawn(async move {
            let mut part = Measured::default();
            let mut seq = 0u64;
            while Instant::now() < window.to {
                seq += 1;
                let id = format!("{cell}-{worker}-{seq}");
                let mut body = json!({
                    "op_id": id,
                    "ops": [{"op": "put", "key": format!("bench:{id}"), "value": {"step": "stock_reserved"}}],
                });
                if intents {
                    body["next"] = json!([{"event_id": id, "aggregate": format!("checkout:{id}"),
                        "target": TARGET, "type": "payment.authorize.v1", "body": {"amount": seq}}]);
                }
                let sent = Instant::now();
                let answer = client
                    .post(&url)
                    .json(&body)
                    .timeout(ANSWER_WAIT_MAX)
                    .send()
                    .await;
                let answered = Instant::now();
                let outcome = match answer {
                    Ok(a) if a.status() == 200 => Ok(()),
                    Ok(a) => Err(format!("{} {}", a.status(), a.text().await.unwrap_or_default())),
                    Err(e) => Err(format!("no answer: {e}")),
                };
                let in_window = sent >= window.from;
                match outcome {
                    Ok(()) => {
                        part.ok_all += 1;
                        if intents {
                            part.acked.push((id, answered, in_window));
                        }
                        if in_window {
                            part.ok += 1;
                            part.latencies.push(answered - sent);
                        }
                    }
                    Err(why) => {
                        part.failed += 1;
                        part.first_failure.get_or_insert(why);
                    }
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
            total.first_failure = total.first_failure.or(part.first_failure);
            total.latencies.extend(part.latencies);
            total.acked.extend(part.acked);
        }
    }
    total.latencies.sort();
    total
}

/// Samples the participant's `delivered` counter when the window opens and when it closes,
/// and the pending intents at its close.
async fn sample_window(
    setup: Arc<Setup>,
    window: Window,
) -> (Option<f64>, Option<f64>, Option<u64>) {
    tokio::time::sleep_until(window.from.into()).await;
    let first = setup.metric(DELIVERED_METRIC).await;
    tokio::time::sleep_until(window.to.into()).await;
    let last = setup.metric(DELIVERED_METRIC).await;
    let pending = setup.metric(PENDING_METRIC).await.map(|p| p as u64);
    (first, last, pending)
}

/// Waits until nothing is open in the outbox; how long after `since` that was.
async fn drain(setup: &Setup, since: Instant) -> Result<Duration> {
    let deadline = Instant::now() + DRAIN_WAIT_MAX;
    loop {
        if setup.open().await == Some(0) {
            return Ok(since.elapsed());
        }
        if Instant::now() >= deadline {
            bail!(
                "the outbox still holds {:?} open intents {DRAIN_WAIT_MAX:?} after the cell; relay log:\n{}",
                setup.open().await,
                setup.relay.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn ms(latencies: &[Duration], q: f64) -> Option<f64> {
    quantile(latencies, q).map(|d| d.as_secs_f64() * 1e3)
}

/// Runs every outbox cell, prints the table (or JSON), then the check; fails if it does not
/// hold. `relay_flags` go to `twopc relay` as given (for example `--max-in-flight 64`).
pub async fn run(
    concurrencies: &[usize],
    seconds: f64,
    as_json: bool,
    relay_flags: &[String],
) -> Result<()> {
    let scratch = std::env::temp_dir().join(format!("twopc-bench-outbox-{}", std::process::id()));
    let pool = concurrencies.iter().copied().max().unwrap_or(1);
    let setup = Arc::new(start(&scratch, pool, relay_flags).await?);
    let duration = Duration::from_secs_f64(seconds.max(0.1));
    let warmup = duration / 5;
    let run_id = format!("ob{}", std::process::id());
    let mut cells = Vec::new();
    let mut acked: Vec<(String, Instant, bool)> = Vec::new();
    for &concurrency in concurrencies {
        let cell = format!("{run_id}-c{concurrency}");
        let cpu_before = setup.cpu();
        let window = Window::after(warmup, duration);
        let sampler = tokio::spawn(sample_window(setup.clone(), window));
        let with = writes(&setup, &format!("{cell}i"), true, concurrency, window).await;
        let (first, last, pending_at_end) = sampler.await.unwrap_or((None, None, None));
        let drained = drain(&setup, window.to).await?;
        let cpu_drained = setup.cpu();
        let plain_window = Window::after(warmup, duration);
        let plain = writes(
            &setup,
            &format!("{cell}p"),
            false,
            concurrency,
            plain_window,
        )
        .await;
        let cpu_plain = setup.cpu();
        for (what, measured) in [("write with an intent", &with), ("plain write", &plain)] {
            if measured.ok == 0 {
                bail!(
                    "no {what} succeeded at concurrency {concurrency}: the cell measures nothing (first failure: {})",
                    measured.first_failure.as_deref().unwrap_or("none recorded")
                );
            }
        }
        let applied = setup.receiver.applied();
        let window_s = duration.as_secs_f64();
        let delivered_in_window = applied
            .values()
            .filter(|a| a.at >= window.from && a.at < window.to)
            .count();
        let mut lags: Vec<Duration> = with
            .acked
            .iter()
            .filter(|(_, _, in_window)| *in_window)
            .filter_map(|(id, answered, _)| {
                applied
                    .get(id)
                    .map(|a| a.at.saturating_duration_since(*answered))
            })
            .collect();
        lags.sort();
        let writes_per_s = with.ok as f64 / window_s;
        let plain_per_s = plain.ok as f64 / window_s;
        let row = OutboxCell {
            concurrency,
            writes_per_s,
            write_p50_ms: ms(&with.latencies, 0.50),
            write_p99_ms: ms(&with.latencies, 0.99),
            plain_per_s,
            plain_p50_ms: ms(&plain.latencies, 0.50),
            plain_p99_ms: ms(&plain.latencies, 0.99),
            share_of_plain: (plain_per_s > 0.0).then(|| writes_per_s / plain_per_s),
            delivered_per_s: delivered_in_window as f64 / window_s,
            outbox_delivered_per_s: match (first, last) {
                (Some(a), Some(b)) if b >= a => Some((b - a) / window_s),
                _ => None,
            },
            lag_p50_ms: ms(&lags, 0.50),
            lag_p99_ms: ms(&lags, 0.99),
            pending_at_end,
            drain_ms: drained.as_secs_f64() * 1e3,
            cpu_us_per_intent: super::cpu::micros_per_tx(cpu_before, cpu_drained, with.ok_all),
            cpu_us_per_plain_write: super::cpu::micros_per_tx(cpu_drained, cpu_plain, plain.ok_all),
            failed: with.failed + plain.failed,
        };
        if !as_json {
            eprintln!(
                "  measured concurrency {concurrency}: {writes_per_s:.0} writes/s with intents, {:.0} delivered/s",
                row.delivered_per_s
            );
        }
        cells.push(row);
        acked.extend(with.acked);
    }
    let check = check(&setup, &acked).await;
    if as_json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({"cells": cells, "check": check}))?
        );
    } else {
        print_table(&cells, &check);
    }
    let ok = check.ok;
    drop(setup);
    if ok {
        let _ = std::fs::remove_dir_all(&scratch);
        Ok(())
    } else {
        bail!(
            "the outbox check failed (see above); the run's files are kept in {}",
            scratch.display()
        )
    }
}

/// Every intent written applied exactly once, and nothing open in the outbox.
async fn check(setup: &Setup, acked: &[(String, Instant, bool)]) -> OutboxCheck {
    let counter = |v: Option<f64>| v.map(|v| v as u64);
    let counters = Counters {
        written: counter(setup.metric(WRITTEN_METRIC).await),
        delivered: counter(setup.metric(DELIVERED_METRIC).await),
        pending: counter(setup.metric(PENDING_METRIC).await),
        failed: counter(setup.metric(FAILED_METRIC).await),
    };
    let acked: Vec<&str> = acked.iter().map(|(id, _, _)| id.as_str()).collect();
    judge(&acked, &setup.receiver.applied(), counters)
}

fn print_table(cells: &[OutboxCell], check: &OutboxCheck) {
    let f = |v: Option<f64>, digits: usize| v.map_or("-".to_string(), |v| format!("{v:.digits$}"));
    println!(
        "{:>5} {:>8} {:>7} {:>7} {:>8} {:>7} {:>6} {:>8} {:>9} {:>7} {:>7} {:>7} {:>8} {:>9} {:>9} {:>6}",
        "conc",
        "writes/s",
        "p50 ms",
        "p99 ms",
        "plain/s",
        "p50 ms",
        "/plain",
        "deliv/s",
        "outbox/s",
        "lag p50",
        "lag p99",
        "backlog",
        "drain ms",
        "CPU us/in",
        "CPU us/pw",
        "failed"
    );
    for c in cells {
        println!(
            "{:>5} {:>8.0} {:>7} {:>7} {:>8.0} {:>7} {:>6} {:>8.0} {:>9} {:>7} {:>7} {:>7} {:>8.0} {:>9} {:>9} {:>6}",
            c.concurrency,
            c.writes_per_s,
            f(c.write_p50_ms, 2),
            f(c.write_p99_ms, 2),
            c.plain_per_s,
            f(c.plain_p50_ms, 2),
            f(c.share_of_plain, 2),
            c.delivered_per_s,
            f(c.outbox_delivered_per_s, 0),
            f(c.lag_p50_ms, 1),
            f(c.lag_p99_ms, 1),
            c.pending_at_end.map_or("-".to_string(), |p| p.to_string()),
            c.drain_ms,
            f(c.cpu_us_per_intent, 0),
            f(c.cpu_us_per_plain_write, 0),
            c.failed
        );
    }
    let n = |v: Option<u64>| v.map_or("?".to_string(), |v| v.to_string());
    println!(
        "check: {} intents written, {} applied exactly once, {} missing, {} applied twice, {} redeliveries; outbox written {}, delivered {}, pending {}, failed {}: {}",
        check.intents_written,
        check.delivered_once,
        check.missing,
        check.applied_twice,
        check.redeliveries,
        n(check.outbox_written),
        n(check.outbox_delivered),
        n(check.outbox_pending),
        n(check.outbox_failed),
        if check.ok { "ok" } else { "FAILED" }
    );
}
