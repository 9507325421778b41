//! `twopc workflow-worker` (hidden): the reference worker of the checkout workflow
//! (docs/workflows.md, "The checkout workflow"). A thin shell around the pure planner
//! `cluster::workflow`: it holds the `checkout-workers` lease, walks the checkouts listed at
//! `checkout-index`, reads each one and, when the planner needs it, its payment intent's
//! outbox entry, and writes the planned transition as one fenced `POST /v1/kv`.
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
use cluster::workflow::{self, Checkout, Evidence, Plan};
use protocol::lease::FenceClaim;
use protocol::outbox::OutboxEntry;
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
    #[command(flatten)]
    client: crate::client::ClientArgs,
}

pub fn main(args: Args) -> ExitCode {
    crate::async_main::block_on("workflow-worker", run(args))
}

fn say(event: Value) {
    println!("{event}");
}

async fn call(request: reqwest::RequestBuilder, what: &str) -> anyhow::Result<(u16, Value)> {
    let response = request.send().await.with_context(|| what.to_string())?;
    let (status, bytes) = net::outbound::read_answer(response, crate::client::ANSWER_BYTES_MAX)
        .await
        .with_context(|| what.to_string())?;
    Ok((
        status.as_u16(),
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    ))
}

/// A held lease: its fence claim and when it was last granted or renewed.
struct Held {
    fence: FenceClaim,
    renewed: Instant,
}

struct Worker {
    args: Args,
    client: reqwest::Client,
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
    let mut worker = Worker {
        args,
        client,
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

    async fn get(&self, url: String, what: &str) -> Option<(u16, Value)> {
        match call(self.client.get(url), what).await {
            Ok(answer) => Some(answer),
            Err(e) => {
                say(json!({"event": "error", "what": format!("{e:#}")}));
                None
            }
        }
    }

    /// One pass over every listed checkout, moving each one step at most.
    async fn walk(&mut self, held: &mut Held) -> Result<(), Stop> {
        let base = self.args.participant.clone();
        let index_url = format!("{base}/v1/kv/{}", workflow::INDEX_KEY);
        let Some((200, index)) = self.get(index_url, "read the index").await else {
            return Ok(());
        };
        let ids: Vec<String> = serde_json::from_value(index["value"].clone()).unwrap_or_default();
        for id in ids {
            self.keep(held).await?;
            let key_url = format!("{base}/v1/kv/{}", workflow::checkout_key(&id));
            let Some((200, entry)) = self.get(key_url, "read a checkout").await else {
                continue;
            };
            let Ok(checkout) = serde_json::from_value::<Checkout>(entry["value"].clone()) else {
                say(json!({"event": "error", "checkout": id, "what": "not a checkout"}));
                continue;
            };
            let version = entry["version"].as_u64().unwrap_or(0);
            let evidence = if workflow::needs_evidence(checkout.state) {
                self.evidence(&id).await
            } else {
                Evidence::Missing
            };
            let Plan::Move(transition) = workflow::plan(checkout.state, &evidence) else {
                continue;
            };
            let request = workflow::write(&id, &checkout, version, &transition, held.fence.clone());
            self.pause_if_asked(transition.emits_payment).await;
            let url = format!("{base}{}", protocol::routes::KV_WRITE);
            let answer = call(self.client.post(url).json(&request), "write").await;
            let (from, to, token) = (transition.from, transition.to, held.fence.token);
            match answer {
                Ok((200, _)) => {
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
                Ok((409, answer)) if answer["error"] == "stale_token" => {
                    say(
                        json!({"event": "stale", "checkout": id, "from": from, "to": to,
                               "token": token, "highest": answer["highest"]}),
                    );
                    return Err(Stop::Reacquire);
                }
                // The checkout moved on (its version), or its intent is already recorded by
                // the write that moved it: nothing changed, read again.
                Ok((409, answer))
                    if answer["error"] == "condition_failed"
                        || answer["error"] == "id_conflict" =>
                {
                    say(
                        json!({"event": "conflict", "checkout": id, "from": from, "to": to,
                               "answer": answer}),
                    );
                }
                Ok((status, answer)) => {
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

    /// The payment intent's outbox entry as evidence (an unreadable one counts as missing,
    /// which the planner never moves on).
    async fn evidence(&self, id: &str) -> Evidence {
        let url = format!(
            "{}/v1/outbox/{}",
            self.args.participant,
            workflow::payment_event_id(id)
        );
        match self.get(url, "read the outbox").await {
            Some((200, entry)) => match serde_json::from_value::<OutboxEntry>(entry) {
                Ok(entry) => Evidence::of(&entry),
                Err(_) => Evidence::Missing,
            },
            _ => Evidence::Missing,
        }
    }
}
