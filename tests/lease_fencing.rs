//! Leases and fencing with real processes: the seeds' story (a holder paused past its TTL
//! comes back and its delayed write loses to the newer holder's), and the crash points of the
//! lease service and of fenced writes.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use chaos_tests::lease_nodes::{blocking, coordinator, participant, send};
use cluster::node::Node;
use serde_json::Value;

fn plain() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_twopc"))
}

/// A worker process with its JSON event lines arriving on a channel.
struct Worker {
    child: Child,
    events: mpsc::Receiver<Value>,
}

impl Worker {
    fn start(c: &Node, p: &Node, holder: &str, extra: &[&str]) -> Worker {
        let mut command = Command::new(plain());
        // A lease holder is a client: it sends the client token (leases, fenced writes).
        if let Some(tokens) = c.tokens() {
            command.env(
                "TWOPC_TOKEN_FILE",
                tokens.path(protocol::auth::Kind::Client),
            );
        }
        let mut child = command
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
    let (status, stored) = send(p.http().get(format!("{}/v1/kv/orders", p.url())))
        .await
        .unwrap();
    assert_eq!(
        (status, stored["value"].as_str()),
        (200, Some("worker-b-0")),
        "{stored}"
    );
}

/// Issue 25, item 4: a second write under an op id already used is 409 `op_id_conflict` and
/// writes nothing; a true retry (the same write) still gets the first answer, also after a
/// restart. On f10b795 the second write got the first one's receipt (`"key":"op-a"`) with 200
/// and `op-b` was never written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_op_id_is_refused_and_never_hands_out_another_writes_receipt() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = participant(plain(), dir.path(), None);
    let put = |p: &Node, key: &str, value: &str, token: u64| {
        let body = serde_json::json!({"value": value, "op_id": "dup-op",
            "fence": {"resource": "r", "token": token}});
        p.http().put(format!("{}/v1/kv/{key}", p.url())).json(&body)
    };
    let (status, first) = send(put(&p, "op-a", "x", 1)).await.unwrap();
    assert_eq!(status, 200, "{first}");
    assert_eq!(
        first["key"], "op-a",
        "the receipt names what was written: {first}"
    );
    for (key, value, token) in [("op-b", "x", 1), ("op-a", "y", 1), ("op-a", "x", 2)] {
        let (status, body) = send(put(&p, key, value, token)).await.unwrap();
        assert_eq!(
            (status, body["error"].as_str()),
            (409, Some("op_id_conflict")),
            "{key}={value} under token {token}: {body}"
        );
    }
    let get = |p: &Node, key: &str| p.http().get(format!("{}/v1/kv/{key}", p.url()));
    let (status, _) = send(get(&p, "op-b")).await.unwrap();
    assert_eq!(status, 404, "op-b was never written");
    // A retry of the very write is the same answer, before and after a restart.
    for restarted in [false, true] {
        if restarted {
            blocking(|| {
                p.kill();
                p.restart();
                p.wait_ready(Duration::from_secs(30))
            })
            .unwrap();
        }
        let (status, again) = send(put(&p, "op-a", "x", 1)).await.unwrap();
        assert_eq!((status, &again), (200, &first), "restarted: {restarted}");
        let (status, body) = send(put(&p, "op-b", "x", 1)).await.unwrap();
        assert_eq!(
            (status, body["error"].as_str()),
            (409, Some("op_id_conflict"))
        );
    }
}
