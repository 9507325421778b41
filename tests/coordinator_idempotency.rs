//! The real `twopc coordinator` (fsync on) and two real `twopc participant` processes: an id
//! stays recognised across far more transactions than the old in-memory cap (100,000) while the
//! coordinator's memory stays flat, because ended outcomes live in the on-disk outcome index.
//!
//! `TWOPC_IDEMPOTENCY_TXS` sets how many other transactions run between the first submit of
//! the id and its retries: 250,000 for the full check (about 3 minutes with `cargo test --release`
//! on 2 cores), 50,000 by default (a debug build manages a few hundred a second there).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use cluster::node::{Node, NodeSpec, free_port};
use serde_json::{Value, json};

const DEFAULT_TXS: usize = 50_000;
const IN_FLIGHT: usize = 64;
/// What the coordinator may hold after the load. With outcomes in memory (the old cap of
/// 100,000 at about 1 KiB each) it was well over this.
const RSS_MAX_KIB: u64 = 200 * 1024;

fn participant(dir: &Path, name: &str, coordinator: &str) -> Node {
    let port = free_port();
    let mut node = Node::start(NodeSpec {
        name: name.into(),
        binary: env!("CARGO_BIN_EXE_twopc").into(),
        args: vec![
            "participant".into(),
            "--name".into(),
            name.into(),
            "--listen".into(),
            format!("127.0.0.1:{port}"),
            "--data-dir".into(),
            dir.join(name).display().to_string(),
            "--coordinator".into(),
            coordinator.into(),
            // The participants' durability is not under test here; the coordinator's is.
            "--unsafe-no-fsync".into(),
        ],
        env: vec![("RUST_LOG".into(), "warn".into())],
        addr: format!("127.0.0.1:{port}").parse().unwrap(),
        log_path: dir.join(format!("{name}.log")),
        tokens: cluster::auth::for_test(dir),
    });
    tokio::task::block_in_place(|| node.wait_ready(Duration::from_secs(20))).unwrap();
    node
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS in /proc/{pid}/status"))
}

/// A request for `id`; with a key, inventory puts it (K's bodies), without, nobody does
/// anything (the load: no key locks, so nothing aborts on contention).
fn body(id: &str, key: Option<&str>) -> Value {
    let ops = match key {
        Some(key) => json!([{"op": "put", "key": key, "value": "1"}]),
        None => json!([]),
    };
    json!({
        "id": id,
        "participants": [
            {"name": "inventory", "payload": {"ops": ops}},
            {"name": "payments", "payload": {"ops": []}}
        ]
    })
}

async fn post(client: &reqwest::Client, url: &str, body: &Value) -> (u16, Value) {
    let response = client
        .post(format!("{url}/v1/transactions"))
        .json(body)
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_is_remembered_across_hundreds_of_thousands_of_transactions_in_flat_memory() {
    let txs: usize = std::env::var("TWOPC_IDEMPOTENCY_TXS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_TXS);
    let dir = tempfile::tempdir().unwrap();
    let coordinator_port = free_port();
    let coordinator_url = format!("http://127.0.0.1:{coordinator_port}");
    let inventory = participant(dir.path(), "inventory", &coordinator_url);
    let payments = participant(dir.path(), "payments", &coordinator_url);
    let mut coordinator = Node::start(NodeSpec {
        name: "coordinator".into(),
        binary: env!("CARGO_BIN_EXE_twopc").into(),
        args: vec![
            "coordinator".into(),
            "--listen".into(),
            format!("127.0.0.1:{coordinator_port}"),
            "--data-dir".into(),
            dir.path().join("coordinator").display().to_string(),
            "--participant".into(),
            format!("inventory={}", inventory.url()),
            "--participant".into(),
            format!("payments={}", payments.url()),
        ],
        env: vec![("RUST_LOG".into(), "warn".into())],
        addr: format!("127.0.0.1:{coordinator_port}").parse().unwrap(),
        log_path: dir.path().join("coordinator.log"),
        tokens: cluster::auth::for_test(dir.path()),
    });
    tokio::task::block_in_place(|| coordinator.wait_ready(Duration::from_secs(20))).unwrap();
    let pid = coordinator.pid().unwrap();
    let client = coordinator.http();

    let (status, first) = post(&client, &coordinator_url, &body("K", Some("k"))).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["outcome"], "committed", "{first}");
    let rss_before = rss_kib(pid);

    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for _ in 0..IN_FLIGHT {
        let next = Arc::clone(&next);
        let client = client.clone();
        let url = coordinator_url.clone();
        workers.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= txs {
                    return;
                }
                let (status, got) = post(&client, &url, &body(&format!("load-{i}"), None)).await;
                assert_eq!(status, 200, "load-{i}: {got}");
            }
        }));
    }
    // VmRSS as the load goes, to tell a plateau (caches, allocator) from growth per
    // transaction.
    let sampler = {
        let next = Arc::clone(&next);
        tokio::spawn(async move {
            let mut samples = Vec::new();
            let mut quarter = 1;
            while quarter <= 3 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                if next.load(Ordering::Relaxed) >= txs * quarter / 4 {
                    samples.push((txs * quarter / 4, rss_kib(pid)));
                    quarter += 1;
                }
            }
            samples
        })
    };
    for worker in workers {
        worker.await.unwrap();
    }
    let elapsed = started.elapsed();
    let rss_after = rss_kib(pid);
    for (done, rss) in sampler.await.unwrap() {
        println!("coordinator VmRSS after {done} transactions: {rss} KiB");
    }
    println!(
        "{txs} transactions in {elapsed:.1?} ({:.0}/s); coordinator VmRSS before {rss_before} KiB, \
         after {rss_after} KiB",
        txs as f64 / elapsed.as_secs_f64()
    );

    // K again, with another body: still known, so a conflict, not a new attempt.
    let (status, conflict) = post(&client, &coordinator_url, &body("K", Some("other"))).await;
    assert_eq!(status, 409, "{conflict}");
    assert_eq!(conflict["error"], "id_conflict", "{conflict}");
    // And with the same body: the recorded outcome of the first attempt.
    let (status, again) = post(&client, &coordinator_url, &body("K", Some("k"))).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["outcome"], "committed", "{again}");
    assert_eq!(again["gtid"], first["gtid"], "{again}");

    assert!(
        rss_after < RSS_MAX_KIB,
        "coordinator VmRSS {rss_after} KiB after {txs} transactions (bound {RSS_MAX_KIB} KiB)"
    );
    let (status, ready) = {
        let response = client
            .get(format!("{coordinator_url}/readyz"))
            .send()
            .await
            .unwrap();
        (
            response.status().as_u16(),
            response.json::<Value>().await.unwrap(),
        )
    };
    assert_eq!(status, 200, "{ready}");
    assert_eq!(
        ready["retention"]["effective_ms"], ready["retention"]["configured_ms"],
        "nothing evicted early: {ready}"
    );
    drop((inventory, payments));
}
