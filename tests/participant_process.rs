//! `twopc participant` as a process (the plain binary): seeding once, graceful SIGTERM, the
//! data directory lock (exit 3) and a corrupt log (exit 4).

mod wal_support;

use std::path::Path;
use std::time::Duration;

use cluster::node::{Node, NodeSpec, free_port};
use serde_json::{Value, json};

fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

fn spec(dir: &Path, name: &str, seed: &str) -> NodeSpec {
    let seed_path = dir.join(format!("{name}-seed.json"));
    std::fs::write(&seed_path, seed).unwrap();
    let port = free_port();
    NodeSpec {
        name: name.into(),
        binary: env!("CARGO_BIN_EXE_twopc").into(),
        args: vec![
            "participant".into(),
            "--name".into(),
            name.into(),
            "--listen".into(),
            format!("127.0.0.1:{port}"),
            "--data-dir".into(),
            dir.join("data").display().to_string(),
            "--seed".into(),
            seed_path.display().to_string(),
        ],
        env: Vec::new(),
        addr: format!("127.0.0.1:{port}").parse().unwrap(),
        log_path: dir.join(format!("{name}.log")),
        tokens: cluster::auth::for_test(dir),
    }
}

/// The incarnation of the (absent) coordinator `c` that these messages claim to come from.
const INCARNATION: &str = "00000000000000c1";

/// The attempt `c` began as `position` of that run.
fn gtid(position: u64) -> String {
    format!("c:{INCARNATION}:{position}")
}

/// The prepare of attempt 1, `t1`: four out of stock.
fn take_four_t1() -> Value {
    json!({"txid": "t1", "gtid": gtid(1), "coordinator_id": "c", "epoch": 1,
           "incarnation": INCARNATION, "position": 1,
           "payload": {"ops": [{"op": "add", "key": "stock", "delta": -4}]}})
}

/// The commit of `t1`.
fn commit_t1() -> Value {
    json!({"txid": "t1", "gtid": gtid(1), "coordinator_id": "c", "epoch": 1,
           "incarnation": INCARNATION})
}

async fn post(node: &Node, path: &str, body: Value) -> Value {
    node.http_as(protocol::auth::Kind::Peer)
        .post(format!("{}{path}", node.url()))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn stock(node: &Node) -> Value {
    node.http()
        .get(format!("{}/v1/kv/stock", node.url()))
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap()["value"]
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_applies_once_and_sigterm_exits_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = Node::start(spec(dir.path(), "inventory", r#"{"stock": 10}"#));
    blocking(|| node.wait_ready(Duration::from_secs(30))).unwrap();
    assert_eq!(stock(&node).await, 10);
    assert_eq!(
        post(&node, "/2pc/prepare", take_four_t1()).await,
        json!({"vote": "yes"})
    );
    assert_eq!(
        post(&node, "/2pc/commit", commit_t1()).await,
        json!({"ack": true})
    );
    let status = blocking(|| node.terminate(Duration::from_secs(10)));
    assert!(status.is_some_and(|s| s.success()), "log:\n{}", node.log());

    // A different seed on a later start is ignored: the store is not empty any more.
    std::fs::write(dir.path().join("inventory-seed.json"), r#"{"stock": 100}"#).unwrap();
    node.restart();
    blocking(|| node.wait_ready(Duration::from_secs(30))).unwrap();
    assert_eq!(stock(&node).await, 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_data_directory_exits_3() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = Node::start(spec(dir.path(), "first", "{}"));
    blocking(|| first.wait_ready(Duration::from_secs(30))).unwrap();
    let mut second = Node::start(spec(dir.path(), "second", "{}"));
    let status = blocking(|| second.wait_exit(Duration::from_secs(30)));
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(3),
        "log:\n{}",
        second.log()
    );
    assert!(second.log().contains("locked"), "{}", second.log());
    assert!(first.is_running());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_log_refuses_to_start_with_exit_4() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = Node::start(spec(dir.path(), "inventory", r#"{"stock": 10}"#));
    blocking(|| node.wait_ready(Duration::from_secs(30))).unwrap();
    for i in 0..5 {
        let txid = format!("t{i}");
        let prepare = json!({"txid": txid, "gtid": gtid(i + 1), "coordinator_id": "c",
                             "epoch": 1, "incarnation": INCARNATION, "position": i + 1,
                             "payload": {"ops": [{"op": "put", "key": format!("k{i}"), "value": i}]}});
        assert_eq!(
            post(&node, "/2pc/prepare", prepare).await,
            json!({"vote": "yes"})
        );
    }
    node.kill();
    // Flip a byte inside the first record of the newest segment; valid records follow it, so
    // this is corruption, not a torn tail.
    let wal_dir = dir.path().join("data").join("wal");
    let mut segments: Vec<_> = std::fs::read_dir(&wal_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| std::fs::metadata(p).unwrap().len() > 200)
        .filter(|p| p.extension().is_some_and(|e| e == "wal"))
        .collect();
    segments.sort();
    let segment = segments
        .pop()
        .unwrap_or_else(|| panic!("no segment in {}", wal_dir.display()));
    let mut bytes = std::fs::read(&segment).unwrap();
    bytes[40] ^= 0xff;
    std::fs::write(&segment, bytes).unwrap();
    node.restart();
    let status = blocking(|| node.wait_exit(Duration::from_secs(30)));
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(4),
        "log:\n{}",
        node.log()
    );
    assert!(node.log().contains("corrupt"), "{}", node.log());
}

/// `--wal-fill-ahead-bytes 0`: a killed participant's segment ends at its last record (no
/// zeros filled ahead), and the prepared attempt is still prepared after the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_fill_ahead_a_killed_log_ends_at_its_last_record_and_keeps_its_promise() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec(dir.path(), "inventory", r#"{"stock": 10}"#);
    spec.args
        .extend(["--wal-fill-ahead-bytes".to_string(), "0".to_string()]);
    let mut node = Node::start(spec);
    blocking(|| node.wait_ready(Duration::from_secs(30))).unwrap();
    assert_eq!(
        post(&node, "/2pc/prepare", take_four_t1()).await,
        json!({"vote": "yes"})
    );
    node.kill();
    let (file, records) = wal_support::last_segment_sizes(&dir.path().join("data"));
    assert!(records > 0, "the segment holds the records");
    assert_eq!(file, records, "no zeros after the last record");

    node.restart();
    blocking(|| node.wait_ready(Duration::from_secs(30))).unwrap();
    assert_eq!(
        post(&node, "/2pc/commit", commit_t1()).await,
        json!({"ack": true})
    );
    assert_eq!(stock(&node).await, 6);
}
