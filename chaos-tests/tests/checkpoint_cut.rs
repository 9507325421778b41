//! Issue 25, item 1, against real processes: a checkpoint is one cut across the 2PC table,
//! sagas, leases and operator state. The coordinator checkpoints every 10 ms while it holds
//! thousands of leases (so each copy takes a while) and takes sagas (`?wait=none`), 2PC
//! transactions, lease grants and audited operator retries at once; it is SIGKILLed
//! mid-load, several times. After each restart every item it had answered is there.
//!
//! Before the fix the checkpoint copied the saga table and let go of its lock before it
//! took the covered sequence number, so a saga record logged in between was in neither the
//! snapshot nor a kept segment: sagas answered 202 were 404 after the restart.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chaos_tests::binary::plain_binary;
use chaos_tests::lease_nodes::{self, blocking, send};
use cluster::node::Node;
use serde_json::json;
use tokio::task::JoinSet;

const LEASES_HELD: usize = 3_000;
const ROUNDS: usize = 3;
const LOAD: Duration = Duration::from_secs(3);

/// What the coordinator answered as done, by kind.
#[derive(Debug, Default)]
struct Answered {
    sagas: BTreeSet<String>,
    transactions: BTreeSet<String>,
    leases: Vec<(String, u64)>,
    audit: BTreeSet<u64>,
}

async fn hold_leases(c: &Node, client: &reqwest::Client) {
    let url = c.url();
    let mut set = JoinSet::new();
    for worker in 0..8 {
        let (client, url) = (client.clone(), url.clone());
        set.spawn(async move {
            for i in (worker..LEASES_HELD).step_by(8) {
                let body = json!({"holder": "holder", "ttl_ms": 600_000});
                let (status, answer) =
                    send(client.post(format!("{url}/v1/leases/held-{i}")).json(&body))
                        .await
                        .expect("the coordinator answers");
                assert_eq!(status, 200, "{answer}");
            }
        });
    }
    while let Some(done) = set.join_next().await {
        done.unwrap();
    }
}

/// One kind of work in a loop until `stop`; returns the ids whose answers promised them.
async fn load(
    kind: &'static str,
    round: usize,
    client: reqwest::Client,
    url: String,
    stop: Arc<AtomicBool>,
) -> Vec<(String, u64)> {
    let mut answered = Vec::new();
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let id = format!("{kind}-{round}-{n}");
        let request = match kind {
            "saga" => client
                .post(format!("{url}/v1/sagas?wait=none"))
                .json(&json!({
                "id": id, "timeout_ms": 30_000, "steps": [{"name": "put", "participant": "kv",
                "action": {"ops": [{"op": "put", "key": id, "value": n}]},
                "compensation": {"ops": [{"op": "delete", "key": id}]}}]})),
            "tx" => client.post(format!("{url}/v1/transactions")).json(&json!({
                "id": id, "participants": [{"name": "kv",
                "payload": {"ops": [{"op": "put", "key": id, "value": n}]}}]})),
            "lease" => client
                .post(format!("{url}/v1/leases/{id}"))
                .json(&json!({"holder": "h", "ttl_ms": 600_000})),
            _ => client
                .post(format!("{url}/v1/participants/kv/retry"))
                .json(&json!({"operator": "test", "reason": "checkpoint cut"})),
        };
        let Ok((status, body)) = send(request).await else {
            break; // killed
        };
        let promised = match kind {
            "saga" => matches!(status, 200 | 202).then_some(0),
            "tx" => (status == 200 && body["outcome"] == "committed").then_some(0),
            "lease" => (status == 200).then(|| body["token"].as_u64().unwrap_or(0)),
            _ => (status == 200).then(|| body["audit_seq"].as_u64().unwrap_or(0)),
        };
        if let Some(extra) = promised {
            answered.push((id, extra));
        }
    }
    answered
}

async fn one_round(c: &mut Node, client: &reqwest::Client, round: usize, answered: &mut Answered) {
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = JoinSet::new();
    for kind in ["saga", "saga", "tx", "lease", "operator"] {
        workers.spawn(load(
            kind,
            round,
            client.clone(),
            c.url(),
            Arc::clone(&stop),
        ));
    }
    tokio::time::sleep(LOAD).await;
    // The power goes while every kind of work is in flight.
    blocking(|| c.kill());
    stop.store(true, Ordering::Relaxed);
    while let Some(done) = workers.join_next().await {
        for (id, extra) in done.unwrap() {
            match id.split('-').next() {
                Some("saga") => drop(answered.sagas.insert(id)),
                Some("tx") => drop(answered.transactions.insert(id)),
                Some("lease") => answered.leases.push((id, extra)),
                _ => drop(answered.audit.insert(extra)),
            }
        }
    }
    blocking(|| {
        c.restart();
        c.wait_ready(Duration::from_secs(60))
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", c.log()));
}

async fn check(c: &Node, client: &reqwest::Client, answered: &Answered, round: usize) {
    let url = c.url();
    let get = |path: String| send(client.get(format!("{url}{path}")));
    let mut lost = Vec::new();
    for id in &answered.sagas {
        let (status, body) = get(format!("/v1/sagas/{id}")).await.unwrap();
        if status != 200 {
            lost.push(format!("saga {id}: {status} {body}"));
        }
    }
    for id in &answered.transactions {
        let (status, body) = get(format!("/v1/transactions/{id}")).await.unwrap();
        if status != 200 || body["outcome"] != "committed" {
            lost.push(format!("transaction {id}: {status} {body}"));
        }
    }
    for (name, token) in &answered.leases {
        let (status, body) = get(format!("/v1/leases/{name}")).await.unwrap();
        if status != 200 || body["token"].as_u64() != Some(*token) {
            lost.push(format!("lease {name} (token {token}): {status} {body}"));
        }
    }
    let (_, held) = get("/v1/leases".into()).await.unwrap();
    let held_before = held["leases"].as_array().map(|l| {
        l.iter()
            .filter(|l| l["name"].as_str().is_some_and(|n| n.starts_with("held-")))
            .count()
    });
    if held_before != Some(LEASES_HELD) {
        lost.push(format!(
            "{held_before:?} of the {LEASES_HELD} leases held before the load"
        ));
    }
    let mut seen = BTreeSet::new();
    let mut before: Option<u64> = None;
    loop {
        let query = before.map(|b| format!("&before={b}")).unwrap_or_default();
        let (status, page) = get(format!("/v1/audit?limit=1000{query}")).await.unwrap();
        assert_eq!(status, 200, "{page}");
        let seqs: Vec<u64> = page["audit"]
            .as_array()
            .map(|a| a.iter().filter_map(|e| e["seq"].as_u64()).collect())
            .unwrap_or_default();
        let Some(&oldest) = seqs.iter().min() else {
            break;
        };
        seen.extend(seqs);
        before = Some(oldest);
    }
    for seq in &answered.audit {
        if !seen.contains(seq) {
            lost.push(format!("audit record #{seq}"));
        }
    }
    assert!(
        lost.is_empty(),
        "after restart {round}, {} answered items are gone: {lost:?}\n{}",
        lost.len(),
        c.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answered_item_survives_sigkills_during_10ms_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let p = lease_nodes::participant(plain_binary(), dir.path(), None);
    let mut c = lease_nodes::coordinator_of(
        plain_binary(),
        dir.path(),
        &p.url(),
        &["--checkpoint-interval-ms", "10"],
    );
    let client = c.http();
    hold_leases(&c, &client).await;
    let mut answered = Answered::default();
    for round in 1..=ROUNDS {
        one_round(&mut c, &client, round, &mut answered).await;
        check(&c, &client, &answered, round).await;
    }
    let counts = (
        answered.sagas.len(),
        answered.transactions.len(),
        answered.leases.len(),
        answered.audit.len(),
    );
    eprintln!(
        "answered and found after {ROUNDS} kills (sagas, transactions, leases, audit): {counts:?}"
    );
    assert!(
        counts.0 > 0 && counts.1 > 0 && counts.2 > 0 && counts.3 > 0,
        "every kind of work was answered at least once: {counts:?}"
    );
}
