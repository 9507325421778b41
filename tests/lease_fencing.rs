//! Leases and fencing with real processes: the seeds' story (a holder paused past its TTL
//! comes back and its delayed write loses to the newer holder's), and the crash points of the
//! lease service and of fenced writes.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use chaos_tests::binary::failpoints_binary;
use chaos_tests::node::{Node, NodeSpec, free_port};
use serde_json::{Value, json};

fn plain() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_twopc"))
}

fn blocking<T>(f: impl FnOnce() -> T) -> T {
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
    });
    blocking(|| node.wait_ready(Duration::from_secs(60))).unwrap();
    node
}

fn coordinator(binary: PathBuf, dir: &Path, failpoint: Option<&str>) -> Node {
    // The lease service needs no participant; one is configured because the command wants one.
    let args = ["coordinator", "--participant", "kv=http://127.0.0.1:9"]
        .map(String::from)
        .to_vec();
    node(binary, dir, "coordinator", args, failpoint)
}

fn participant(binary: PathBuf, dir: &Path, failpoint: Option<&str>) -> Node {
    let args = ["participant", "--name", "kv"].map(String::from).to_vec();
    node(binary, dir, "participant", args, failpoint)
}

/// Restarts a node that aborted at its crash point, disarmed.
fn restart_disarmed(node: &mut Node) {
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

async fn send(request: reqwest::RequestBuilder) -> Result<(u16, Value), reqwest::Error> {
    let response = request.timeout(Duration::from_secs(10)).send().await?;
    let status = response.status().as_u16();
    Ok((status, response.json().await.unwrap_or(Value::Null)))
}

async fn acquire(
    c: &Node,
    name: &str,
    holder: &str,
    ttl_ms: u64,
) -> Result<(u16, Value), reqwest::Error> {
    let body = json!({"holder": holder, "ttl_ms": ttl_ms});
    send(
        reqwest::Client::new()
            .post(format!("{}/v1/leases/{name}", c.url()))
            .json(&body),
    )
    .await
}

async fn fenced_put(
    p: &Node,
    key: &str,
    value: &str,
    token: u64,
    op_id: &str,
) -> Result<(u16, Value), reqwest::Error> {
    let body = json!({"value": value, "fence": {"resource": "orders-partition-3", "token": token}, "op_id": op_id});
    send(
        reqwest::Client::new()
            .put(format!("{}/v1/kv/{key}", p.url()))
            .json(&body),
    )
    .await
}

/// A worker process with its JSON event lines arriving on a channel.
struct Worker {
    child: Child,
    events: mpsc::Receiver<Value>,
}

impl Worker {
    fn start(c: &Node, p: &Node, holder: &str, extra: &[&str]) -> Worker {
        let mut child = Command::new(plain())
            .args([
                "lease-worker",
                "--coordinator",
                &c.url(),
                "--participant",
                &p.url(),
            ])
            .args([
                "--lease",
                "orders-partition-3",
                "--key",
                "orders",
                "--holder",
                holder,
            ])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (send, events) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Ok(event) = serde_json::from_str::<Value>(&line) {
                    let _ = send.send(event);
                }
            }
        });
        Worker { child, events }
    }

    /// The next event, which must be `kind`.
    fn expect(&self, kind: &str) -> Value {
        let event = self
            .events
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("no {kind} event: {e}"));
        assert_eq!(event["event"].as_str(), Some(kind), "{event}");
        event
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    fn exit_code(mut self) -> Option<i32> {
        for _ in 0..300 {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        None
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_paused_past_its_ttl_loses_its_delayed_write_to_the_next_holder() {
    let dir = tempfile::tempdir().unwrap();
    let c = coordinator(plain(), dir.path(), None);
    let p = participant(plain(), dir.path(), None);
    // A writes at once, then renews and waits 3 s before its second write: the pause window.
    let a = Worker::start(
        &c,
        &p,
        "worker-a",
        &[
            "--ttl-ms",
            "1000",
            "--writes",
            "2",
            "--write-delay-ms",
            "3000",
        ],
    );
    let n = a.expect("acquired")["token"].as_u64().unwrap();
    a.expect("wrote");
    a.expect("renewed");
    a.signal("-STOP");
    // B waits for A's lease to expire (A cannot renew: it is stopped), then writes.
    let b = Worker::start(&c, &p, "worker-b", &["--ttl-ms", "5000", "--writes", "1"]);
    let b_token = b.expect("acquired")["token"].as_u64().unwrap();
    assert_eq!(b_token, n + 1, "the next owner gets the next token");
    b.expect("wrote");
    b.expect("released");
    assert_eq!(blocking(|| b.exit_code()), Some(0));
    a.signal("-CONT");
    let stale = a.expect("stale");
    assert_eq!(
        (stale["token"].as_u64(), stale["highest"].as_u64()),
        (Some(n), Some(n + 1)),
        "{stale}"
    );
    assert_eq!(blocking(|| a.exit_code()), Some(3));
    let (status, stored) = send(reqwest::Client::new().get(format!("{}/v1/kv/orders", p.url())))
        .await
        .unwrap();
    assert_eq!(
        (status, stored["value"].as_str()),
        (200, Some("worker-b-0")),
        "{stored}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_logged_but_never_answered_is_never_given_again() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = coordinator(
        failpoints_binary(),
        dir.path(),
        Some("coordinator::lease_logged_not_answered"),
    );
    assert!(
        acquire(&c, "orders", "worker-a", 60_000).await.is_err(),
        "the process aborted before answering"
    );
    restart_disarmed(&mut c);
    // The unanswered grant is durable: it holds (a full TTL from the restart) and its token is
    // never handed out again.
    let (status, held) = send(reqwest::Client::new().get(format!("{}/v1/leases/orders", c.url())))
        .await
        .unwrap();
    assert_eq!(
        (status, held["holder"].as_str()),
        (200, Some("worker-a")),
        "{held}"
    );
    let logged = held["token"].as_u64().unwrap();
    let (status, other) = acquire(&c, "other", "worker-b", 1000).await.unwrap();
    assert_eq!(status, 200);
    let next = other["token"].as_u64().unwrap();
    assert!(next > logged, "token {next} after {logged}");

    // Killed between two grants (SIGKILL, no crash point): the next is still higher.
    c.kill();
    c.restart();
    blocking(|| c.wait_ready(Duration::from_secs(30))).unwrap();
    let (status, third) = acquire(&c, "third", "worker-c", 1000).await.unwrap();
    assert_eq!(status, 200);
    assert!(third["token"].as_u64().unwrap() > next, "{third}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_write_logged_before_its_answer_is_applied_once_and_answered_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = participant(
        failpoints_binary(),
        dir.path(),
        Some("participant::after_fenced_write_logged"),
    );
    assert!(
        fenced_put(&p, "orders", "a", 7, "w-1").await.is_err(),
        "aborted before answering"
    );
    restart_disarmed(&mut p);
    let (status, answer) = fenced_put(&p, "orders", "a", 7, "w-1").await.unwrap();
    assert_eq!(
        (status, answer),
        (200, json!({"key": "orders", "version": 1, "token": 7}))
    );
    let (status, again) = fenced_put(&p, "orders", "a", 7, "w-1").await.unwrap();
    assert_eq!((status, again["version"].as_u64()), (200, Some(1)));
    let (_, stored) = send(reqwest::Client::new().get(format!("{}/v1/kv/orders", p.url())))
        .await
        .unwrap();
    assert_eq!(
        stored["version"].as_u64(),
        Some(1),
        "applied once: {stored}"
    );
    let (status, stale) = fenced_put(&p, "orders", "old", 6, "w-2").await.unwrap();
    assert_eq!(
        (status, stale["highest"].as_u64()),
        (409, Some(7)),
        "{stale}"
    );
}
