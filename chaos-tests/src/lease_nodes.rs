//! Real coordinator and participant processes for the lease and fencing tests (the seeds'
//! story in `tests/lease_fencing.rs`, the crash points in `tests/crash_matrix.rs`): start one
//! on its own data directory, optionally with a crash point armed, and talk to it.
//!
//! The helpers block (waiting for readiness or exit) inside `tokio::task::block_in_place`, so
//! call them from a multi-threaded runtime.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use cluster::node::{Node, NodeSpec, free_port};

pub fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

fn node(
    binary: PathBuf,
    dir: &Path,
    name: &str,
    mut args: Vec<String>,
    failpoint: Option<&str>,
) -> Node {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    args.extend([
        "--listen".into(),
        addr.clone(),
        "--data-dir".into(),
        dir.join(name).display().to_string(),
    ]);
    let mut env = vec![("RUST_LOG".to_string(), "info".to_string())];
    if let Some(point) = failpoint {
        env.push(("FAILPOINTS".into(), format!("{point}=return")));
    }
    let mut node = Node::start(NodeSpec {
        name: name.into(),
        binary,
        args,
        env,
        addr: addr.parse().unwrap(),
        log_path: dir.join(format!("{name}.log")),
        tokens: cluster::auth::for_test(dir),
    });
    blocking(|| node.wait_ready(Duration::from_secs(60))).unwrap();
    node
}

pub fn coordinator(binary: PathBuf, dir: &Path, failpoint: Option<&str>) -> Node {
    // The lease service needs no participant; one is configured because the command wants one.
    let args = ["coordinator", "--participant", "kv=http://127.0.0.1:9"]
        .map(String::from)
        .to_vec();
    node(binary, dir, "coordinator", args, failpoint)
}

/// A coordinator of the participant at `participant_url` (named `kv`), with `extra` flags.
pub fn coordinator_of(binary: PathBuf, dir: &Path, participant_url: &str, extra: &[&str]) -> Node {
    let mut args = vec![
        "coordinator".to_string(),
        "--participant".to_string(),
        format!("kv={participant_url}"),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    node(binary, dir, "coordinator", args, None)
}

pub fn participant(binary: PathBuf, dir: &Path, failpoint: Option<&str>) -> Node {
    participant_with(binary, dir, &[]).pipe_failpoint(failpoint)
}

/// A participant (named `kv`) with `extra` flags (`--fence-key-file`, say).
pub fn participant_with(binary: PathBuf, dir: &Path, extra: &[&str]) -> PendingNode {
    let mut args = ["participant", "--name", "kv"].map(String::from).to_vec();
    args.extend(extra.iter().map(|a| a.to_string()));
    PendingNode {
        binary,
        dir: dir.to_path_buf(),
        name: "participant",
        args,
    }
}

/// A lease service (a coordinator) with `extra` flags (`--fence-key-file`, say).
pub fn coordinator_with(binary: PathBuf, dir: &Path, extra: &[&str]) -> Node {
    let mut args = ["coordinator", "--participant", "kv=http://127.0.0.1:9"]
        .map(String::from)
        .to_vec();
    args.extend(extra.iter().map(|a| a.to_string()));
    node(binary, dir, "coordinator", args, None)
}

/// A node described but not started yet: `start()` it, or arm a crash point first.
#[derive(Debug)]
pub struct PendingNode {
    binary: PathBuf,
    dir: PathBuf,
    name: &'static str,
    args: Vec<String>,
}

impl PendingNode {
    pub fn start(self) -> Node {
        self.pipe_failpoint(None)
    }

    fn pipe_failpoint(self, failpoint: Option<&str>) -> Node {
        node(self.binary, &self.dir, self.name, self.args, failpoint)
    }
}

/// Restarts a node that aborted at its crash point, disarmed.
pub fn restart_disarmed(node: &mut Node) {
    let status = blocking(|| node.wait_exit(Duration::from_secs(10)));
    assert!(
        status.is_some_and(|s| !s.success()),
        "expected an abort; log:\n{}",
        node.log()
    );
    node.set_env(vec![("RUST_LOG".into(), "info".into())]);
    node.restart();
    blocking(|| node.wait_ready(Duration::from_secs(30))).unwrap();
}

pub async fn send(request: reqwest::RequestBuilder) -> Result<(u16, Value), reqwest::Error> {
    let response = request.timeout(Duration::from_secs(10)).send().await?;
    let status = response.status().as_u16();
    Ok((status, response.json().await.unwrap_or(Value::Null)))
}

pub async fn acquire(
    c: &Node,
    name: &str,
    holder: &str,
    ttl_ms: u64,
) -> Result<(u16, Value), reqwest::Error> {
    let body = json!({"holder": holder, "ttl_ms": ttl_ms});
    send(
        c.http()
            .post(format!("{}/v1/leases/{name}", c.url()))
            .json(&body),
    )
    .await
}

pub async fn fenced_put(
    p: &Node,
    key: &str,
    value: &str,
    token: u64,
    op_id: &str,
) -> Result<(u16, Value), reqwest::Error> {
    let body = json!({"value": value, "fence": {"resource": "orders-partition-3", "token": token}, "op_id": op_id});
    send(p.http().put(format!("{}/v1/kv/{key}", p.url())).json(&body)).await
}
