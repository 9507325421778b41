//! `twopc workflow-worker` (hidden): the reference worker of the checkout workflow
//! (docs/workflows.md, "The checkout workflow"). A thin shell around the pure planner
//! `cluster::workflow`: it holds the `checkout-workers` lease, walks the checkouts listed at
//! `checkout-index` (or the `checkouts` table), reads each one and, when the planner needs it,
//! its payment intent's outbox entry, and writes the planned transition as one fenced local
//! write (`workflow_store`: `POST /v1/kv`, or `POST /v1/pg/write` whose statement checks the
//! fence itself).
//!
//! It never decides a transition itself and never emits a payment intent but the planner's
//! (under `pay-<checkout>`). A write refused `stale_token` means another worker holds a newer
//! token: it stops acting at once and goes back to acquiring. A write refused
//! `condition_failed` means the checkout moved on meanwhile: nothing changed, it reads again.
//!
//! It prints one JSON line per event (`acquired`, `moved`, `conflict`, `stale`, `lost`,
//! `pausing`, `hanging`, `error`) for the demo and the tests to follow, and runs until killed.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use cluster::workflow::{self, Evidence, Plan};
use protocol::lease::FenceClaim;

use crate::workflow_store::{Outcome, Store, call};
use serde_json::{Value, json};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The coordinator's base URL (the lease service).
    #[arg(long)]
    coordinator: String,
    /// The participant holding the checkouts, their stock and the outbox.
    #[arg(long)]
    participant: String,
    #[arg(long)]
    holder: String,
    #[arg(long, default_value = workflow::LEASE)]
    lease: String,
    #[arg(long, default_value_t = 1000)]
    ttl_ms: u64,
    /// Between two walks over the checkouts.
    #[arg(long, default_value_t = 100)]
    poll_ms: u64,
    /// Before the first write from this (1-based) one on that emits no intent, say `pausing`
    /// and wait `--pause-ms`: the window in which the demo SIGSTOPs the worker, as a GC pause or
    /// a stalled host would. (A stale write that emits an intent is refused too, but as
    /// `id_conflict` when the next holder already recorded that intent; the demo shows the
    /// fence.)
    #[arg(long)]
    pause_before_write: Option<u64>,
    #[arg(long, default_value_t = 1500)]
    pause_ms: u64,
    /// After this many accepted writes, say `hanging` and do nothing more (the crash tests
    /// SIGKILL it there: right after a transition's write was answered).
    #[arg(long)]
    hang_after_writes: Option<u64>,
    /// Where the checkouts live: `kv` (the reference participant) or `postgres` (a PostgreSQL
    /// participant serving `cluster::pg_workflow`'s statements).
    #[arg(long, value_parser = ["kv", "postgres"], default_value = "kv")]
    backend: String,
    #[command(flatten)]
    client: crate::client::ClientArgs,
}

pub fn main(args: Args) -> ExitCode {
    crate::async_main::block_on("workflow-worker", run(args))
}

fn say(event: Value) {
    println!("{event}");
}

/// A held lease: its fence claim and when it was last granted or renewed.
struct Held {
    fence: FenceClaim,
    renewed: Instant,
}

struct Worker {
    args: Args,
    client: reqwest::Client,
    store: Store,
    writes: u64,
    paused: bool,
}

/// Why a walk ended early.
enum Stop {
    /// The lease is gone or a write was refused stale_token: acquire again.
    Reacquire,
}

async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let client = crate::client::build(&args.client, Duration::from_secs(10))?;
    let store = Store::new(&args.backend, args.participant.clone());
    let mut worker = Worker {
        args,
        client,
        store,
        writes: 0,
        paused: false,
    };
    loop {
        let mut held = worker.acquire().await?;
        say(json!({"event": "acquired", "holder": worker.args.holder, "token": held.fence.token}));
        loop {
            match worker.walk(&mut held).await {
                Ok(()) => {}
                Err(Stop::Reacquire) => break,
            }
            tokio::time::sleep(Duration::from_millis(worker.args.poll_ms)).await;
        }
    }
}

impl Worker {
    fn lease_url(&self) -> String {
        format!("{}/v1/leases/{}", self.args.coordinator, self.args.lease)
    }

    /// Waits (forever: a standby worker is one that waits) until the lease is granted.
    async fn acquire(&self) -> anyhow::Result<Held> {
        loop {
            let body = json!({"holder": self.args.holder, "ttl_ms": self.args.ttl_ms});
            match call(self.client.post(self.lease_url()).json(&body), "acquire").await {
                Ok((200, answer)) => {
                    let token = answer["token"]
                        .as_u64()
                        .context("a grant without a token")?;
                    let fence = FenceClaim {
                        resource: self.args.lease.clone(),
                        token,
                        holder: Some(self.args.holder.clone()),
                        proof: answer["proof"].as_str().map(str::to_string),
                    };
                    return Ok(Held {
                        fence,
                        renewed: Instant::now(),
                    });
                }
                Ok((409, answer)) if answer["error"] == "lease_held" => {}
                Ok((status, answer)) => bail!("acquire answered {status}: {answer}"),
                Err(e) => say(json!({"event": "error", "what": format!("{e:#}")})),
            }
            tokio::time::sleep(Duration::from_millis(self.args.poll_ms)).await;
        }
    }

    /// Renews when a quarter of the TTL has passed since the last grant or renewal.
    async fn keep(&self, held: &mut Held) -> Result<(), Stop> {
        if held.renewed.elapsed() < Duration::from_millis(self.args.ttl_ms / 4) {
            return Ok(());
        }
        let body = json!({"holder": self.args.holder, "token": held.fence.token});
        let url = format!("{}/renew", self.lease_url());
        match call(self.client.post(url).json(&body), "renew").await {
            Ok((200, _)) => {
                held.renewed = Instant::now();
                Ok(())
            }
            Ok((_, answer)) => {
                say(json!({"event": "lost", "token": held.fence.token, "answer": answer}));
                Err(Stop::Reacquire)
            }
            Err(e) => {
                say(json!({"event": "lost", "token": held.fence.token, "error": format!("{e:#}")}));
                Err(Stop::Reacquire)
            }
        }
    }

    /// One pass over every checkout, moving each one step at most.
    async fn walk(&mut self, held: &mut Held) -> Result<(), Stop> {
        let checkouts = match self.store.checkouts(&self.client).await {
            Ok(all) => all,
            Err(e) => {
                say(json!({"event": "error", "what": format!("{e:#}")}));
                return Ok(());
            }
        };
        for (id, checkout, version) in checkouts {
            if checkout.state.is_terminal() {
                continue;
            }
            self.keep(held).await?;
            let evidence = if workflow::needs_evidence(checkout.state) {
                self.store.evidence(&self.client, &id).await
            } else {
                Evidence::Missing
            };
            let Plan::Move(transition) = workflow::plan(checkout.state, &evidence) else {
                continue;
            };
            self.pause_if_asked(transition.emits_payment).await;
            let (from, to, token) = (transition.from, transition.to, held.fence.token);
            let outcome = self
                .store
                .transition(
                    &self.client,
                    &id,
                    &checkout,
                    version,
                    &transition,
                    &held.fence,
                )
                .await;
            match outcome {
                Ok(Outcome::Moved) => {
                    self.writes += 1;
                    say(
                        json!({"event": "moved", "checkout": id, "from": from, "to": to,
                               "token": token, "evidence": transition.evidence}),
                    );
                    if self.args.hang_after_writes == Some(self.writes) {
                        say(json!({"event": "hanging", "writes": self.writes}));
                        std::future::pending::<()>().await;
                    }
                }
                Ok(Outcome::Stale(highest, refused_as)) => {
                    say(
                        json!({"event": "stale", "checkout": id, "from": from, "to": to,
                               "token": token, "highest": highest, "refused_as": refused_as}),
                    );
                    return Err(Stop::Reacquire);
                }
                // The checkout moved on (its version), or its intent is already recorded by
                // the write that moved it: nothing changed, read again.
                Ok(Outcome::Conflict(answer)) => {
                    say(
                        json!({"event": "conflict", "checkout": id, "from": from, "to": to,
                               "answer": answer}),
                    );
                }
                Ok(Outcome::Failed(status, answer)) => {
                    say(
                        json!({"event": "error", "checkout": id, "status": status, "answer": answer}),
                    );
                }
                Err(e) => say(json!({"event": "error", "checkout": id, "what": format!("{e:#}")})),
            }
        }
        Ok(())
    }

    async fn pause_if_asked(&mut self, emits: bool) {
        let due = self
            .args
            .pause_before_write
            .is_some_and(|n| self.writes + 1 >= n);
        if due && !emits && !self.paused {
            self.paused = true;
            say(json!({"event": "pausing", "writes": self.writes}));
            tokio::time::sleep(Duration::from_millis(self.args.pause_ms)).await;
        }
    }
}
