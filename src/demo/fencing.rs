//! `twopc demo --fencing`: the seeds' 41/42 story with real processes, on a local coordinator
//! (the lease service) and one reference KV participant (the fenced resource). Two
//! `twopc lease-worker` processes play the holders: A acquires token n and writes, renews, and
//! is SIGSTOPped while its next write waits; its lease expires; B acquires n+1 and writes; A is
//! SIGCONTed and sends its delayed write with token n, which the participant refuses as
//! `stale_token`. The summary shows every step and checks each claim; the run fails if one
//! does not hold. It never asserts anything about speed.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

use cluster::cluster::{ClusterSpec, LocalCluster};

/// The lease both workers want, and the participant's fenced resource.
const LEASE: &str = "orders-partition-3";
/// The key both workers write.
const KEY: &str = "orders";
/// A's TTL: short, so its lease expires while it is stopped.
const A_TTL_MS: u64 = 1000;
/// How long A waits between its renewal and its second write: the window in which it is
/// stopped. Long enough that the demo's SIGSTOP surely lands before A writes.
const A_WRITE_DELAY_MS: u64 = 2000;
/// Longest wait for one event of a worker (B waits out A's TTL inside one).
const EVENT_WAIT_MAX: Duration = Duration::from_secs(30);

/// One claim of the story and whether it held.
struct Check {
    name: &'static str,
    ok: bool,
    detail: String,
}

/// Runs the story on a cluster under `data_dir/fencing` (wiped first when `fresh`). Returns
/// whether every claim held.
pub async fn run(data_dir: &Path, fresh: bool) -> Result<bool> {
    let dir = data_dir.join("fencing");
    if fresh && dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("cannot wipe {}", dir.display()))?;
    }
    let binary = std::env::current_exe().context("cannot find the twopc binary")?;
    println!(
        "twopc demo --fencing: a lease holder paused past its TTL, and the fence that stops it"
    );
    println!("  starting a coordinator (the lease service) and a KV participant (the resource)");
    // The lease service signs every grant and the resource checks the proofs
    // (docs/leases.md): nobody can write with a token the service did not grant.
    let key = fence_key(&dir)?;
    let key_flags = vec!["--fence-key-file".to_string(), key.display().to_string()];
    let spec = ClusterSpec {
        binary: binary.clone(),
        data_dir: dir.clone(),
        participants: vec!["kv".to_string()],
        seeds: Vec::new(),
        coordinator_flags: key_flags.clone(),
        participant_flags: key_flags,
        env: Vec::new(),
        postgres_args: Vec::new(),
    };
    let mut cluster = tokio::task::block_in_place(|| LocalCluster::start(&spec))?;
    let coordinator = cluster.coordinator_url();
    let participant = cluster
        .participant_url("kv")
        .context("the cluster has no kv participant")?;
    println!("  coordinator {coordinator}  participant {participant}");
    println!("  data and process logs in {}/", dir.display());
    let urls = Urls {
        binary,
        coordinator,
        participant,
        // The workers and this story are clients of the lease service and the fenced store.
        client: match &cluster.tokens {
            Some(tokens) => crate::client::ClientArgs::with_token_file(
                &tokens.path(protocol::auth::Kind::Client),
            ),
            None => crate::client::ClientArgs::default(),
        },
    };
    let checks = story(&urls).await;
    tokio::task::block_in_place(|| cluster.stop());
    let checks = checks?;
    println!("{}", "-".repeat(72));
    println!("checks:");
    for check in &checks {
        let mark = if check.ok { "ok  " } else { "FAIL" };
        println!("  [{mark}] {}", check.name);
        println!("         {}", check.detail);
    }
    let all_ok = checks.iter().all(|c| c.ok);
    println!(
        "{}",
        if all_ok {
            "the stale owner lost: its delayed write was refused and B's value stands"
        } else {
            "the story did not hold (see FAIL above)"
        }
    );
    Ok(all_ok)
}

/// The fence key of the demo's data directory, made on its first run (0600; kept across runs
/// so the participant's fences stay checkable).
pub(super) fn fence_key(dir: &Path) -> Result<PathBuf> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let path = dir.join("fence.key");
    if !path.exists() {
        let secret: String = (0..64)
            .map(|_| char::from(b"0123456789abcdef"[fastrand::usize(0..16)]))
            .collect();
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        writeln!(file, "{secret}").with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(path)
}

struct Urls {
    binary: PathBuf,
    coordinator: String,
    participant: String,
    /// What the workers and this story send (the cluster's client token).
    client: crate::client::ClientArgs,
}

/// A `twopc lease-worker` child with its JSON event lines (killed if dropped while running).
struct Worker {
    label: &'static str,
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Worker {
    fn start(urls: &Urls, label: &'static str, holder: &str, extra: &[String]) -> Result<Worker> {
        let mut child = Command::new(&urls.binary)
            .arg("lease-worker")
            .args(["--coordinator", &urls.coordinator])
            .args(["--participant", &urls.participant])
            .args(
                urls.client
                    .token_file
                    .iter()
                    .flat_map(|file| [std::ffi::OsStr::new("--token-file"), file.as_os_str()]),
            )
            .args(["--lease", LEASE, "--key", KEY, "--holder", holder])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start worker {label}"))?;
        let stdout = child.stdout.take().context("worker stdout not piped")?;
        Ok(Worker {
            label,
            child,
            lines: BufReader::new(stdout).lines(),
        })
    }

    fn pid(&self) -> Result<u32> {
        self.child
            .id()
            .with_context(|| format!("worker {} has exited", self.label))
    }

    /// The next event, which must be `kind`.
    async fn expect(&mut self, kind: &str) -> Result<Value> {
        loop {
            let line = tokio::time::timeout(EVENT_WAIT_MAX, self.lines.next_line())
                .await
                .with_context(|| {
                    format!("worker {} said nothing for {EVENT_WAIT_MAX:?}", self.label)
                })?
                .with_context(|| format!("reading worker {}", self.label))?
                .with_context(|| format!("worker {} ended before its {kind} event", self.label))?;
            // Anything not a JSON event (none is expected) is skipped, not fatal.
            let Ok(event) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            if event["event"].as_str() != Some(kind) {
                bail!("worker {}: expected {kind}, got {event}", self.label);
            }
            return Ok(event);
        }
    }

    /// Sends `signal` (`-STOP`, `-CONT`) with kill(1), as an operator would.
    async fn signal(&self, signal: &str) -> Result<()> {
        let pid = self.pid()?.to_string();
        let status = Command::new("kill")
            .args([signal, &pid])
            .status()
            .await
            .context("cannot run kill")?;
        if !status.success() {
            bail!("kill {signal} {pid} failed: {status}");
        }
        Ok(())
    }

    async fn exit_code(mut self) -> Result<Option<i32>> {
        let status = tokio::time::timeout(EVENT_WAIT_MAX, self.child.wait())
            .await
            .with_context(|| format!("worker {} did not exit", self.label))??;
        Ok(status.code())
    }
}

fn row(label: &str, value: String) {
    println!("  {label:<44} {value}");
}

fn token_of(event: &Value) -> Result<u64> {
    event["token"]
        .as_u64()
        .with_context(|| format!("an event without a token: {event}"))
}

async fn story(urls: &Urls) -> Result<Vec<Check>> {
    println!("{}", "-".repeat(72));
    let mut a = Worker::start(
        urls,
        "A",
        "worker-a",
        &[
            "--ttl-ms".into(),
            A_TTL_MS.to_string(),
            "--writes".into(),
            "2".into(),
            "--write-delay-ms".into(),
            A_WRITE_DELAY_MS.to_string(),
        ],
    )?;
    let n = token_of(&a.expect("acquired").await?)?;
    row(
        &format!("A (pid {}) acquired {LEASE}", a.pid()?),
        format!("token {n}, ttl {A_TTL_MS} ms"),
    );
    let first = a.expect("wrote").await?;
    let a_version = first["answer"]["version"].as_u64();
    row(
        &format!("A wrote {KEY} = \"worker-a-0\""),
        format!(
            "accepted, token {}, version {}",
            first["answer"]["token"], first["answer"]["version"]
        ),
    );
    a.expect("renewed").await?;
    a.signal("-STOP").await?;
    let stopped = Instant::now();
    row(
        "A renewed, then was SIGSTOPped",
        format!("its next write (token {n}) waits inside the stopped process"),
    );

    let mut b = Worker::start(
        urls,
        "B",
        "worker-b",
        &[
            "--ttl-ms".into(),
            "5000".into(),
            "--writes".into(),
            "1".into(),
        ],
    )?;
    let b_token = token_of(&b.expect("acquired").await?)?;
    row(
        &format!("B (pid {}) acquired {LEASE}", b.pid()?),
        format!(
            "token {b_token}, {:.1} s after A stopped (A's lease expired)",
            stopped.elapsed().as_secs_f64()
        ),
    );
    let b_wrote = b.expect("wrote").await?;
    let b_version = b_wrote["answer"]["version"].as_u64();
    row(
        &format!("B wrote {KEY} = \"worker-b-0\""),
        format!(
            "accepted, token {}, version {}",
            b_wrote["answer"]["token"], b_wrote["answer"]["version"]
        ),
    );
    b.expect("released").await?;
    let b_exit = b.exit_code().await?;

    // A stays stopped past its whole TTL even when B was quick: the lease expired counting
    // from A's renewal, which came before the stop.
    let hold = Duration::from_millis(A_TTL_MS + 100);
    if let Some(left) = hold.checked_sub(stopped.elapsed()) {
        tokio::time::sleep(left).await;
    }
    let paused = stopped.elapsed();
    a.signal("-CONT").await?;
    row(
        "A SIGCONTed",
        format!(
            "after {:.1} s stopped (its TTL: {:.1} s)",
            paused.as_secs_f64(),
            A_TTL_MS as f64 / 1e3
        ),
    );
    let stale = a.expect("stale").await?;
    let highest = stale["highest"].as_u64();
    row(
        &format!("A's delayed write (token {n})"),
        format!("refused: 409 stale_token, highest {}", stale["highest"]),
    );
    let a_exit = a.exit_code().await?;

    let client = crate::client::build(&urls.client, Duration::from_secs(10))?;
    let forged = client
        .put(format!("{}/v1/kv/{KEY}", urls.participant))
        .json(&serde_json::json!({
            "value": "forged",
            "fence": {"resource": LEASE, "token": u64::MAX, "holder": "mallory"},
            "op_id": format!("forged-{}", std::process::id()),
        }))
        .send()
        .await
        .context("sending the forged write")?;
    let forged_status = forged.status().as_u16();
    let forged_body: Value = forged.json().await.unwrap_or(Value::Null);
    row(
        "a forged write with token 2^64-1, no proof",
        format!("refused: {forged_status} {}", forged_body["error"]),
    );
    let stored = client
        .get(format!("{}/v1/kv/{KEY}", urls.participant))
        .send()
        .await
        .context("reading the stored value")?
        .json::<Value>()
        .await
        .context("the stored value is not JSON")?;
    row(
        &format!("stored {KEY}"),
        format!("{} (version {})", stored["value"], stored["version"]),
    );

    Ok(vec![
        Check {
            name: "B's token is the next one after A's",
            ok: b_token == n + 1,
            detail: format!("A {n}, B {b_token}"),
        },
        Check {
            name: "A was stopped longer than its TTL",
            ok: paused > Duration::from_millis(A_TTL_MS),
            detail: format!("{} ms stopped, TTL {A_TTL_MS} ms", paused.as_millis()),
        },
        Check {
            name: "both holders' own writes were accepted in turn",
            ok: a_version.is_some() && b_version.is_some() && b_version > a_version,
            detail: format!("A version {a_version:?}, B version {b_version:?}"),
        },
        Check {
            name: "A's delayed write was refused stale_token, naming B's token as highest",
            ok: highest == Some(b_token) && a_exit == Some(3),
            detail: format!("highest {highest:?}, A exited {a_exit:?} (3 = stale_token)"),
        },
        Check {
            name: "B finished cleanly",
            ok: b_exit == Some(0),
            detail: format!("B exited {b_exit:?}"),
        },
        Check {
            name: "a token the lease service never granted was refused invalid_fence_proof",
            ok: forged_status == 409 && forged_body["error"] == "invalid_fence_proof",
            detail: format!("{forged_status} {forged_body}"),
        },
        Check {
            name: "the stored value is B's",
            ok: stored["value"].as_str() == Some("worker-b-0")
                && stored["version"].as_u64() == b_version,
            detail: format!("value {} version {}", stored["value"], stored["version"]),
        },
    ])
}
