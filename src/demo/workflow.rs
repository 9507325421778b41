//! `twopc demo --workflow`: the checkout workflow of issue 29 with real processes
//! (docs/workflows.md, "twopc demo --workflow"). A coordinator (the lease service), the `shop`
//! participant (checkouts, stock and the outbox), the reference payments receiver in this
//! process, a `twopc relay` and two `twopc workflow-worker`s. Scripted on the way: the lease
//! holder is SIGSTOPped past its TTL and resumed (its delayed transition must be refused
//! `stale_token`), the relay is SIGKILLed after the receiver applied a payment and before the
//! relay could report it (the redelivery must be deduplicated), and some payments answer too
//! late (their checkouts go through `payment_unknown -> reconciliation_pending`). The audit
//! (workflow_audit.rs) decides the exit code.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use cluster::cluster::{ClusterSpec, LocalCluster};
use cluster::node::{Node, NodeSpec, free_port};
use cluster::receiver::{Behaviour, Payments, Receiver};
use cluster::workflow;
use protocol::auth::Kind;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

use super::workflow_audit::{self, Setup, Story};
use crate::workflow_store::Store;

/// The worker lease's TTL: short, so the paused holder's lease runs out quickly.
const TTL_MS: u64 = 1000;
/// The receiver answers slow events this late, past the relay's attempt timeout.
const SLOW_ANSWER: Duration = Duration::from_millis(1200);
const ATTEMPT_TIMEOUT_MS: u64 = 500;
/// For this many first attempts (about 4 s with the backoff): long enough that a worker is
/// holding the lease and sees the unknown outcome whatever the pause does.
const SLOW_ATTEMPTS: u32 = 5;
/// How long the whole run may take before the audit lists what is still pending.
const RUN_MAX: Duration = Duration::from_secs(45);
/// Most checkouts (one seed write: 64 ops at most).
pub const CHECKOUTS_MAX: u64 = 60;

/// One worker process (index 0 = A, the first holder; 1 = B).
struct Worker {
    child: Child,
}

impl Worker {
    fn pid(&self) -> Result<String> {
        Ok(self
            .child
            .id()
            .context("the worker has exited")?
            .to_string())
    }
}

async fn signal(pid: &str, signal: &str) -> Result<()> {
    let status = Command::new("kill")
        .args([signal, pid])
        .status()
        .await
        .context("cannot run kill")?;
    if !status.success() {
        bail!("kill {signal} {pid} failed: {status}");
    }
    Ok(())
}

pub async fn run(data_dir: &std::path::Path, checkouts: u64, backend: &str) -> Result<bool> {
    let n = checkouts.clamp(1, CHECKOUTS_MAX);
    let dir = data_dir.join("workflow");
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("cannot wipe {}", dir.display()))?;
    }
    let binary = std::env::current_exe().context("cannot find the twopc binary")?;
    println!("twopc demo --workflow: {n} checkouts moved by fenced workers through an outbox");
    let key = super::fencing::fence_key(&dir)?;
    let key_flags = vec!["--fence-key-file".to_string(), key.display().to_string()];
    let setup = Setup::new(n);
    // Declared before the cluster so that it outlives it (a throwaway server stops on drop).
    let mut server = None;
    let mut spec = ClusterSpec {
        binary: binary.clone(),
        data_dir: dir.clone(),
        participants: vec!["shop".to_string()],
        seeds: Vec::new(),
        coordinator_flags: key_flags.clone(),
        participant_flags: key_flags,
        env: Vec::new(),
        postgres_args: Vec::new(),
    };
    if backend == "postgres" {
        let (pg, flags) = super::workflow_pg::prepare(&dir, &setup)?;
        server = Some(pg);
        // The PostgreSQL participant checks the lease service's proofs with the same key.
        spec.postgres_args = vec![("shop".to_string(), flags)];
    }
    let mut cluster = tokio::task::block_in_place(|| LocalCluster::start(&spec))?;
    let result = with_cluster(&binary, &dir, &mut cluster, &setup, backend).await;
    tokio::task::block_in_place(|| cluster.stop());
    drop(server);
    result
}

async fn with_cluster(
    binary: &std::path::Path,
    dir: &std::path::Path,
    cluster: &mut LocalCluster,
    setup: &Setup,
    backend: &str,
) -> Result<bool> {
    let n = setup.checkouts.len();
    let coordinator = cluster.coordinator_url();
    let shop = cluster
        .participant_url("shop")
        .context("the cluster has no shop participant")?;
    let tokens = cluster.tokens.clone();
    let operator = tokens.as_ref().map(|t| t.path(Kind::Operator));
    let client_args = match &operator {
        Some(file) => crate::client::ClientArgs::with_token_file(file),
        None => crate::client::ClientArgs::default(),
    };
    let client = crate::client::build(&client_args, Duration::from_secs(10))?;
    let store = Store::new(backend, shop.clone());
    let (hold_tx, hold_rx) = std::sync::mpsc::channel();
    let receiver = Receiver::start_payments(
        Behaviour {
            slow_attempts: SLOW_ATTEMPTS,
            delay: SLOW_ANSWER,
        },
        Payments {
            balances: setup.balances.clone(),
            slow_events: setup.slow_events.clone(),
            hold: Some((
                setup.hold_event.clone(),
                Duration::from_millis(1500),
                hold_tx,
            )),
        },
    )?;
    println!(
        "  coordinator {coordinator}  shop {shop}  payments {}",
        receiver.url()
    );
    println!("  data and process logs in {}/", dir.display());
    if backend == "kv" {
        seed_kv(&client, &shop, setup).await?;
    }
    println!(
        "  seeded: {n} checkouts created, stock {:?}, balances {:?}",
        setup.stock, setup.balances
    );
    let peer = tokens.as_ref().map(|t| t.path(Kind::Peer));
    let mut relay = relay_node(binary, &cluster.log_dir, &shop, &receiver.url(), peer);
    tokio::task::block_in_place(|| relay.wait_ready(Duration::from_secs(30)))
        .map_err(anyhow::Error::msg)?;
    println!("  relay started (attempt timeout {ATTEMPT_TIMEOUT_MS} ms)");

    let (events_tx, mut events) = mpsc::unbounded_channel::<(usize, Value)>();
    let mut workers = Vec::new();
    let mut story = Story::default();
    let mut a_token = 0;
    for (i, mut extra) in [
        vec![
            "--pause-before-write".to_string(),
            // A's first non-reserving write: its second walk, with any number of checkouts.
            "2".into(),
            "--pause-ms".into(),
            "2000".into(),
        ],
        Vec::new(),
    ]
    .into_iter()
    .enumerate()
    {
        extra.extend(["--backend".to_string(), backend.to_string()]);
        let worker = start_worker(
            binary,
            &coordinator,
            &shop,
            &client_args,
            i,
            &extra,
            events_tx.clone(),
        )?;
        workers.push(worker);
        if i == 0 {
            // A starts first so that it is the holder the story pauses.
            let acquired = wait_for(&mut events, 0, "acquired").await?;
            story.note(0, &acquired);
            a_token = acquired["token"].as_u64().unwrap_or(0);
            println!(">>> A acquired {} with token {a_token}", workflow::LEASE);
        }
    }
    println!(
        "  workers A (pid {}) and B (pid {}) started; A holds {}",
        workers[0].pid()?,
        workers[1].pid()?,
        workflow::LEASE
    );
    println!("{}", "-".repeat(72));

    let started = Instant::now();
    let mut stopped_at: Option<(Instant, u64)> = None;
    let mut resumed_at: Option<Instant> = None;
    let mut a_after_resume = false;
    let mut last_poll = Instant::now();
    loop {
        while let Ok((who, event)) = events.try_recv() {
            let kind = event["event"].as_str().unwrap_or("");
            let name = ["A", "B"][who.min(1)];
            story.note(who, &event);
            if who == 0 && story.resumed && kind != "acquired" {
                a_after_resume = true;
            }
            match kind {
                "acquired" => {
                    if who == 0 {
                        a_token = event["token"].as_u64().unwrap_or(0);
                    }
                    println!(
                        ">>> {name} acquired {} with token {}",
                        workflow::LEASE,
                        event["token"]
                    );
                }
                "pausing" if who == 0 && stopped_at.is_none() => {
                    signal(&workers[0].pid()?, "-STOP").await?;
                    stopped_at = Some((Instant::now(), a_token));
                    println!(">>> A is about to write with token {a_token}: SIGSTOPped");
                }
                "stale" => println!(
                    ">>> {name}'s transition {} {} -> {} with token {} refused: {} (highest {})",
                    event["checkout"],
                    event["from"],
                    event["to"],
                    event["token"],
                    event["refused_as"].as_str().unwrap_or("stale_token"),
                    event["highest"]
                ),
                "lost" => println!(">>> {name} lost its lease (token {})", event["token"]),
                "conflict" | "error" => println!("    {name}: {event}"),
                "moved" => {
                    let to = event["to"].as_str().unwrap_or("");
                    if matches!(to, "payment_unknown" | "reconciliation_pending")
                        || event["evidence"].is_string() && to != "payment_unknown"
                    {
                        println!(
                            "    {name}: {} {} -> {} (evidence {})",
                            event["checkout"], event["from"], to, event["evidence"]
                        );
                    }
                }
                _ => {}
            }
        }
        if let Some((at, token)) = stopped_at
            && !story.resumed
            && at.elapsed() > Duration::from_millis(TTL_MS + 200)
            && (story.moved_by_b_above(token) || at.elapsed() > Duration::from_secs(10))
        {
            signal(&workers[0].pid()?, "-CONT").await?;
            story.resumed = true;
            resumed_at = Some(Instant::now());
            story.paused_ms = at.elapsed().as_millis() as u64;
            println!(
                ">>> A SIGCONTed after {} ms stopped (TTL {TTL_MS} ms); B has moved checkouts meanwhile",
                story.paused_ms
            );
        }
        if let Ok(event) = hold_rx.try_recv() {
            tokio::task::block_in_place(|| relay.kill());
            let entry = intent_state(&client, &shop, &event).await;
            println!(
                ">>> the receiver applied {event}: relay SIGKILLed before it could report (the intent stands {entry})"
            );
            story.relay_killed = Some((event, entry));
            tokio::time::sleep(Duration::from_millis(200)).await;
            tokio::task::block_in_place(|| {
                relay.restart();
                relay.wait_ready(Duration::from_secs(30))
            })
            .map_err(anyhow::Error::msg)?;
            println!(">>> relay restarted");
        }
        if last_poll.elapsed() > Duration::from_millis(300) {
            last_poll = Instant::now();
            // Done when every checkout settled and the resumed A has acted (or had 5 s to).
            let a_done = a_after_resume
                || resumed_at.is_some_and(|at| at.elapsed() > Duration::from_secs(5));
            if a_done && workflow_audit::all_terminal(&client, &store, setup).await {
                break;
            }
        }
        if started.elapsed() > RUN_MAX {
            println!(">>> {RUN_MAX:?} passed: auditing what stands");
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Let A's refusal and any last report land before the processes stop.
    tokio::time::sleep(Duration::from_millis(300)).await;
    while let Ok((who, event)) = events.try_recv() {
        story.note(who, &event);
    }
    story.elapsed = started.elapsed();
    for mut worker in workers {
        if let Some(pid) = worker.child.id() {
            // A stopped process takes no SIGKILL until continued on some kernels' views; CONT first.
            let _ = signal(&pid.to_string(), "-CONT").await;
        }
        let _ = worker.child.kill().await;
    }
    tokio::task::block_in_place(|| relay.terminate(Duration::from_secs(5)));
    println!("{}", "-".repeat(72));
    workflow_audit::audit(&client, &store, setup, &story, &receiver).await
}

async fn seed_kv(client: &reqwest::Client, shop: &str, setup: &Setup) -> Result<()> {
    let seed = workflow::seed(
        &format!("seed-{}", std::process::id()),
        &setup.stock,
        &setup.checkouts,
    );
    let response = client
        .post(format!("{shop}{}", protocol::routes::KV_WRITE))
        .json(&seed)
        .send()
        .await
        .context("seeding the shop")?;
    if !response.status().is_success() {
        bail!(
            "seeding the shop answered {}: {}",
            response.status(),
            response.text().await.unwrap_or_default()
        );
    }
    Ok(())
}

async fn intent_state(client: &reqwest::Client, shop: &str, event_id: &str) -> String {
    let url = format!("{shop}/v1/outbox/{event_id}");
    match client.get(url).send().await {
        Ok(r) => match r.json::<Value>().await {
            Ok(v) => format!("{} after {} reported attempts", v["state"], v["attempts"]),
            Err(_) => "unreadable".into(),
        },
        Err(_) => "unreadable".into(),
    }
}

async fn wait_for(
    events: &mut mpsc::UnboundedReceiver<(usize, Value)>,
    who: usize,
    kind: &str,
) -> Result<Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Ok(Some((w, event))) =
            tokio::time::timeout(Duration::from_millis(200), events.recv()).await
            && w == who
            && event["event"] == kind
        {
            return Ok(event);
        }
    }
    bail!("worker {who} did not say {kind} in 30 s")
}

fn relay_node(
    binary: &std::path::Path,
    log_dir: &std::path::Path,
    shop: &str,
    payments: &str,
    peer: Option<PathBuf>,
) -> Node {
    let port = free_port();
    let mut args: Vec<String> = vec![
        "relay".into(),
        "--participant".into(),
        format!("shop={shop}"),
        "--target".into(),
        format!("{}={payments}", workflow::PAYMENTS_TARGET),
        "--listen".into(),
        format!("127.0.0.1:{port}"),
        "--poll-ms".into(),
        "100".into(),
        "--attempt-timeout-ms".into(),
        ATTEMPT_TIMEOUT_MS.to_string(),
        "--backoff-base-ms".into(),
        "100".into(),
        "--backoff-max-ms".into(),
        "300".into(),
    ];
    if let Some(peer) = peer {
        args.extend(["--peer-token-file".into(), peer.display().to_string()]);
    }
    Node::start(NodeSpec {
        name: "relay".into(),
        binary: binary.to_path_buf(),
        args,
        env: Vec::new(),
        addr: format!("127.0.0.1:{port}")
            .parse()
            .unwrap_or_else(|_| std::net::SocketAddr::from(([127, 0, 0, 1], port))),
        log_path: log_dir.join("relay.log"),
        tokens: None,
    })
}

fn start_worker(
    binary: &std::path::Path,
    coordinator: &str,
    shop: &str,
    client: &crate::client::ClientArgs,
    i: usize,
    extra: &[String],
    events: mpsc::UnboundedSender<(usize, Value)>,
) -> Result<Worker> {
    let holder = format!("worker-{}", ["a", "b"][i.min(1)]);
    let mut child = Command::new(binary)
        .arg("workflow-worker")
        .args([
            "--coordinator",
            coordinator,
            "--participant",
            shop,
            "--holder",
            &holder,
        ])
        .args(["--ttl-ms", &TTL_MS.to_string()])
        .args(
            client
                .token_file
                .iter()
                .flat_map(|file| [std::ffi::OsStr::new("--token-file"), file.as_os_str()]),
        )
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot start {holder}"))?;
    let stdout = child.stdout.take().context("worker stdout not piped")?;
    tokio::spawn(async move {
        let mut lines = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if let Ok(event) = serde_json::from_str::<Value>(&line) {
                let _ = events.send((i, event));
            }
        }
    });
    Ok(Worker { child })
}
