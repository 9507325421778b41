//! `twopc demo --ha`: the coordinator group's story (issue 27, docs/ha.md). A local etcd, two
//! coordinators forming a group (the first leads, the second follows in sync), the checkout
//! participants, and a checkout workload that runs throughout. A quarter of the way in, the
//! leader is SIGKILLed: the follower wins the election once the dead leader's lease expires,
//! recovers from the replicated log and takes the workload over; then the old leader is
//! started again and comes back as a follower, in sync. The usual audit ends it: exit 0 only
//! if every invariant holds.
//!
//! Owns the story and its printing; the processes are `cluster::ha_cluster`'s and the
//! workload `ha_load`'s. It always starts from a fresh `<data dir>/ha` (a group's logs must
//! not meet a new etcd), and never touches the rest of the data directory.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use cluster::audit::{self, ClientOutcome, ClusterUrls};
use cluster::checkout::{CheckoutConfig, INVENTORY, PAYMENTS, SHIPPING};
use cluster::cluster::ClusterSpec;
use cluster::ha_cluster::{HaCluster, HaSpec};
use indicatif::{ProgressBar, ProgressStyle};

use super::ha_load::{GroupLoad, LoadSpec, Sent};
use super::report::{FailoverNote, LockStats, Summary};
use super::{AUDIT_SETTLE, Args, PENDING_ACKS_METRIC, RECOVERED_METRIC, metric};
use crate::coordinator_group::Addresses;

/// The group's nodes, in start order: the first leads at the start.
const NODES: [&str; 2] = ["node-a", "node-b"];
/// How long the group may take to elect, recover, and attach a follower.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);
/// The share of the run after which the leader is killed.
const KILL_AT: f64 = 0.25;
/// How long the workload runs without --seconds.
const DEFAULT_SECONDS: f64 = 24.0;
/// The least the workload runs through the group once the old leader is back in sync.
const AFTER_REJOIN: Duration = Duration::from_secs(1);

/// Runs the story; `Ok(true)` when every invariant held.
pub async fn run(args: &Args, config: &CheckoutConfig) -> Result<bool> {
    // Before anything is printed or started: without etcd there is no group to show.
    cluster::etcd::find_binary().context("twopc demo --ha starts a local etcd")?;
    let dir = args.data_dir.join("ha");
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("cannot wipe {}", dir.display()))?;
    }
    println!(
        "twopc demo --ha: starting a local etcd, a coordinator group of 2 ({}) and 3 participants",
        NODES.join(", ")
    );
    println!("  data in {}/ (fresh on every run)", dir.display());
    let binary = std::env::current_exe().context("cannot find the twopc binary")?;
    let spec = HaSpec {
        cluster: ClusterSpec::checkout(&binary, &dir, config),
        nodes: NODES.map(String::from).to_vec(),
        etcd_members: 1,
        lease_ttl_ms: None,
    };
    let mut group = tokio::task::block_in_place(|| HaCluster::start(&spec))?;
    println!("  process logs in {}/", group.log_dir().display());
    args_note(&group);
    let client_args = super::own_client_args(&group.cluster);
    let client = super::http_client(&client_args, args.concurrency)?;
    let (leader, _) = group.wait_in_sync(&client, SETTLE_TIMEOUT).await?;
    let urls = group.coordinator_urls();
    println!(
        "  {} leads at {}; {} follows, in its sync set (every log fsync is shipped to it \
         and waited for)",
        NODES[leader],
        urls[leader],
        others(leader)
    );

    let mut checkout = group.cluster.checkout_urls()?;
    checkout.coordinator = urls[leader].clone();
    let all_ok = drive(args, config, &mut group, &client, checkout, leader).await?;
    tokio::task::block_in_place(|| group.stop());
    Ok(all_ok)
}

fn args_note(group: &HaCluster) {
    let participant = |name| group.cluster.participant_url(name).unwrap_or_default();
    println!(
        "  etcd {}  inventory {}  payments {}  shipping {}",
        group.etcd.client_urls().join(","),
        participant(INVENTORY),
        participant(PAYMENTS),
        participant(SHIPPING)
    );
}

/// The node names other than `leader`'s.
fn others(leader: usize) -> String {
    NODES
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != leader)
        .map(|(_, name)| *name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Runs the workload through the kill, the failover and the rejoin; audits; prints.
async fn drive(
    args: &Args,
    config: &CheckoutConfig,
    group: &mut HaCluster,
    client: &reqwest::Client,
    mut urls: ClusterUrls,
    leader: usize,
) -> Result<bool> {
    let before = audit::read_totals(client, &urls, config).await?;
    let locks_before = LockStats::read(client, &urls).await;
    let seed = args.seed.unwrap_or_else(|| fastrand::u64(..));
    let run = format!("ha{}", super::unix_seconds());
    let seconds = Duration::from_secs_f64(args.seconds.unwrap_or(DEFAULT_SECONDS).max(1.0));
    println!(
        "  checkout orders for {:.0} s, concurrency {}, seed {seed} (replay with --seed {seed}); \
         the leader is SIGKILLed after {:.0} s",
        seconds.as_secs_f64(),
        args.concurrency,
        seconds.as_secs_f64() * KILL_AT
    );
    let addresses =
        Addresses::parse(&group.coordinator_urls().join(",")).map_err(anyhow::Error::msg)?;
    let load = GroupLoad::start(LoadSpec {
        http: client.clone(),
        addresses,
        config: config.clone(),
        run,
        seed,
        concurrency: args.concurrency,
        prepare_timeout_ms: args.timeout_ms,
    });
    let started = Instant::now();
    let bar = spinner();
    let show = |leader: &str, pending: Option<u64>| {
        super::update_progress(&bar, &load.counters().progress, started, pending);
        bar.set_message(format!("leader {leader} | {}", bar.message()));
    };

    // Before the kill: the workload through the first leader.
    while started.elapsed() < seconds.mul_f64(KILL_AT) {
        let pending = metric(client, &urls.coordinator, PENDING_ACKS_METRIC).await;
        show(NODES[leader], pending);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let done = load.counters().progress.done();
    say(
        &bar,
        format!(
            ">>> {done} orders done: SIGKILL to the leader {} (no flush, no goodbye, its etcd \
             lease left to expire)",
            NODES[leader]
        ),
    );
    let killed = Instant::now();
    tokio::task::block_in_place(|| group.node_mut(leader).map(|node| node.kill()))?;

    // The failover: who leads now, and when the workload commits through it again.
    let (successor, term) = loop {
        if let Some((i, view)) = group.leader(client).await
            && i != leader
        {
            break (i, view.role.term);
        }
        if killed.elapsed() > SETTLE_TIMEOUT {
            anyhow::bail!(
                "no node took over within {SETTLE_TIMEOUT:?} of the kill; logs in {}",
                group.log_dir().display()
            );
        }
        show("none (electing)", None);
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let elected = killed.elapsed();
    let committed_by = |i: usize| load.counters().committed_by_node[i].load(Ordering::Relaxed);
    let through_successor = committed_by(successor);
    let unavailable = loop {
        if committed_by(successor) > through_successor {
            break killed.elapsed();
        }
        if killed.elapsed() > SETTLE_TIMEOUT {
            anyhow::bail!(
                "nothing committed through the new leader {}",
                NODES[successor]
            );
        }
        show(NODES[successor], None);
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    urls.coordinator = group.coordinator_urls()[successor].clone();
    let recovered = metric(client, &urls.coordinator, RECOVERED_METRIC).await;
    say(
        &bar,
        format!(
            ">>> failover: {} leads now (term {}), elected {:.0} ms after the kill; the \
             workload committed through it again {:.0} ms after the kill ({} unfinished \
             transactions recovered from the replicated log)",
            NODES[successor],
            term.map_or("?".to_string(), |t| t.to_string()),
            elected.as_secs_f64() * 1e3,
            unavailable.as_secs_f64() * 1e3,
            recovered.map_or("?".into(), |n| n.to_string()),
        ),
    );

    // The old leader comes back, as a follower of the new one.
    say(
        &bar,
        format!(
            ">>> starting {} again on its data directory: it follows {} and attaches with a \
             base backup",
            NODES[leader], NODES[successor]
        ),
    );
    let restarted = Instant::now();
    tokio::task::block_in_place(|| group.node_mut(leader).map(|node| node.restart()))?;
    let mut waiting = Box::pin(group.wait_in_sync(client, SETTLE_TIMEOUT));
    let settled = loop {
        tokio::select! {
            settled = &mut waiting => break settled?,
            () = tokio::time::sleep(Duration::from_millis(100)) => show(NODES[successor], None),
        }
    };
    drop(waiting);
    let rejoined = restarted.elapsed();
    say(
        &bar,
        format!(
            ">>> {} is in {}'s sync set again after {:.0} ms: the group can lose a node again",
            NODES[leader],
            NODES[settled.0],
            rejoined.as_secs_f64() * 1e3
        ),
    );

    let until = seconds.max(started.elapsed() + AFTER_REJOIN);
    while started.elapsed() < until {
        let pending = metric(client, &urls.coordinator, PENDING_ACKS_METRIC).await;
        show(NODES[successor], pending);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let resent = load.counters().progress.resent.load(Ordering::Relaxed);
    show(NODES[successor], None);
    let sent = load.stop().await?;
    let elapsed = started.elapsed();
    bar.finish();
    let locks = match (locks_before, LockStats::read(client, &urls).await) {
        (Some(before), Some(after)) => Some(after.since(&before)),
        _ => None,
    };

    // Counted from the answers rather than the live counters: orders in flight at the stop
    // finish after any reading of those.
    let by_node: Vec<(String, u64)> = (0..NODES.len())
        .map(|i| {
            let committed = sent
                .iter()
                .filter(|s| s.node == Some(i) && s.result.outcome == ClientOutcome::Committed)
                .count();
            (NODES[i].to_string(), committed as u64)
        })
        .collect();
    println!("checking invariants against the participants and the new leader...");
    let results: Vec<_> = sent.into_iter().map(|Sent { result, .. }| result).collect();
    let observed: Vec<_> = results
        .iter()
        .map(|r| (r.order.clone(), r.outcome))
        .collect();
    let audit = audit::audit(client, &urls, config, before, &observed, AUDIT_SETTLE).await?;
    Summary {
        results: &results,
        elapsed,
        concurrency: args.concurrency,
        crash: None,
        failover: Some(FailoverNote {
            killed: NODES[leader].to_string(),
            killed_after_orders: done,
            successor: NODES[successor].to_string(),
            elected,
            unavailable,
            recovered,
            rejoined,
            committed_by_node: by_node,
        }),
        resent,
        locks,
        audit: &audit,
    }
    .print();
    Ok(audit.all_ok())
}

/// An event line above the live line, shown even when stdout is not a terminal (where the
/// live line is hidden).
fn say(bar: &ProgressBar, line: String) {
    bar.suspend(|| println!("{line}"));
}

fn spinner() -> ProgressBar {
    let bar = ProgressBar::new_spinner();
    if let Ok(style) = ProgressStyle::with_template("{spinner} [{elapsed_precise}] {msg}") {
        bar.set_style(style);
    }
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}
