//! `twopc lease-worker` (hidden): a small client that does what a real lease holder does. It
//! acquires a lease, then writes through the participant's fence, renewing before each later
//! write, and releases at the end. Between its renewal and its write it waits `--write-delay-ms`:
//! that is the window in which a real process pauses (GC, SIGSTOP, a stalled kernel) and comes
//! back with a token that is no longer current. The seeds' 41/42 story runs it for real.
//!
//! It prints one JSON line per event (`acquired`, `wrote`, `renewed`, `lost`, `stale`,
//! `released`) and exits 0 when every write was accepted, 2 when a renewal found the lease
//! lost, 3 when the participant refused a write as `stale_token`.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The coordinator's base URL (the lease service).
    #[arg(long)]
    coordinator: String,
    /// The participant's base URL (the fenced resource).
    #[arg(long)]
    participant: String,
    /// The lease name, also the fenced resource.
    #[arg(long)]
    lease: String,
    #[arg(long)]
    holder: String,
    #[arg(long, default_value_t = 1000)]
    ttl_ms: u64,
    /// The key it writes.
    #[arg(long)]
    key: String,
    #[arg(long, default_value_t = 1)]
    writes: u32,
    /// Wait between a renewal and the write it allows.
    #[arg(long, default_value_t = 0)]
    write_delay_ms: u64,
    /// Give up acquiring after this long (the lease stays held by someone else).
    #[arg(long, default_value_t = 30_000)]
    acquire_timeout_ms: u64,
    #[command(flatten)]
    client: crate::client::ClientArgs,
}

pub fn main(args: Args) -> ExitCode {
    crate::async_main::block_on("lease-worker", run(args))
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

async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let client = crate::client::build(&args.client, Duration::from_secs(10))?;
    let lease_url = format!("{}/v1/leases/{}", args.coordinator, args.lease);
    let started = Instant::now();
    // The grant's proof (when the lease service signs) goes with every write, so a
    // participant that checks proofs can tell the token was granted to this holder.
    let (token, proof) = loop {
        let body = json!({"holder": args.holder, "ttl_ms": args.ttl_ms});
        let (status, answer) = call(client.post(&lease_url).json(&body), "acquire").await?;
        match (status, answer["error"].as_str()) {
            (200, _) => {
                let token = answer["token"]
                    .as_u64()
                    .context("a grant without a token")?;
                break (token, answer["proof"].as_str().map(str::to_string));
            }
            (409, Some("lease_held"))
                if started.elapsed().as_millis() < u128::from(args.acquire_timeout_ms) =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            _ => bail!("acquire answered {status}: {answer}"),
        }
    };
    say(json!({"event": "acquired", "holder": args.holder, "token": token}));
    let key_url = format!("{}/v1/kv/{}", args.participant, args.key);
    for write in 0..args.writes {
        if write > 0 {
            let body = json!({"holder": args.holder, "token": token});
            let (status, answer) = call(
                client.post(format!("{lease_url}/renew")).json(&body),
                "renew",
            )
            .await?;
            if status != 200 {
                say(json!({"event": "lost", "token": token, "answer": answer}));
                return Ok(ExitCode::from(2));
            }
            say(json!({"event": "renewed", "token": token}));
            tokio::time::sleep(Duration::from_millis(args.write_delay_ms)).await;
        }
        let body = json!({
            "value": format!("{}-{write}", args.holder),
            "fence": {"resource": args.lease, "token": token, "holder": args.holder, "proof": proof},
            "op_id": format!("{}-{token}-{write}", args.holder),
        });
        let (status, answer) = call(client.put(&key_url).json(&body), "write").await?;
        match (status, answer["error"].as_str()) {
            (200, _) => say(json!({"event": "wrote", "token": token, "answer": answer})),
            (409, Some("stale_token")) => {
                say(json!({"event": "stale", "token": token, "highest": answer["highest"]}));
                return Ok(ExitCode::from(3));
            }
            _ => bail!("write answered {status}: {answer}"),
        }
    }
    let (status, answer) = call(
        client.delete(format!("{lease_url}?holder={}&token={token}", args.holder)),
        "release",
    )
    .await?;
    say(json!({"event": "released", "status": status, "answer": answer}));
    Ok(ExitCode::SUCCESS)
}
