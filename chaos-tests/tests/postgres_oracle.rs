//! The atomicity and conservation oracle on transfers across two PostgreSQL databases and a KV
//! participant, with the fault proxy dropping, withholding, duplicating and delaying messages
//! between the coordinator and every participant.
//!
//! Each transfer debits an account in `bank_a`, credits one in `bank_b` (each recording the
//! transfer id in its `transfers` table inside the same transaction) and puts `t:<id>` in the
//! KV `ledger`. After the faults are healed and everything settled: every transfer is in all
//! three or in none (atomicity), every outcome a client heard holds, the money in both
//! databases is what it was (conservation), and nothing is left prepared anywhere.
//! Ignored by `cargo test --workspace` (it needs PostgreSQL); `.ci/run` runs it with
//! `-- --ignored`.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chaos_tests::binary::plain_binary;
use chaos_tests::pg_rig::{SETTLE, eventually, get, post, prepared_gids, total_balance};
use chaos_tests::proxy::{Fault, FaultProxy, ProxyOptions, Rule, Scope};
use cluster::node::{Node, NodeSpec, free_port};
use cluster::pg_cluster::{READY_TIMEOUT, coordinator, pg_participant, seed_accounts};
use cluster::postgres::{PgServer, psql_url};
use serde_json::json;

const TRANSFERS: u64 = 80;
const CLIENTS: u64 = 8;
const ACCOUNTS: u32 = 10;

fn recorded(url: &str) -> BTreeSet<String> {
    psql_url(url, "SELECT id FROM transfers")
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
#[ignore = "needs PostgreSQL; .ci/run runs it (TWOPC_POSTGRES_URL or initdb on PATH)"]
fn transfers_across_two_databases_and_a_kv_store_are_atomic_and_conserve_money() {
    let server = PgServer::get();
    let binary = plain_binary();
    let dir = tempfile::tempdir().unwrap();
    let db_a = server.create_database("oracle_a");
    let db_b = server.create_database("oracle_b");
    seed_accounts(&db_a, ACCOUNTS, 100);
    seed_accounts(&db_b, ACCOUNTS, 100);
    let before = total_balance(&db_a) + total_balance(&db_b);

    let coordinator_addr = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
    let coordinator_url = format!("http://{coordinator_addr}");
    let mut a = pg_participant(
        &binary,
        dir.path(),
        "bank_a",
        &db_a,
        Some(&coordinator_url),
        Vec::new(),
    );
    let mut b = pg_participant(
        &binary,
        dir.path(),
        "bank_b",
        &db_b,
        Some(&coordinator_url),
        Vec::new(),
    );
    let ledger_addr = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
    let mut ledger = Node::start(NodeSpec {
        name: "ledger".into(),
        binary: binary.clone(),
        args: [
            "participant",
            "--name",
            "ledger",
            "--listen",
            &ledger_addr.to_string(),
            "--data-dir",
            &dir.path().join("ledger").display().to_string(),
            "--coordinator",
            &coordinator_url,
            "--in-doubt-after-ms",
            "500",
        ]
        .map(String::from)
        .to_vec(),
        env: Vec::new(),
        addr: ledger_addr,
        log_path: dir.path().join("ledger.log"),
        tokens: cluster::auth::for_test(dir.path()),
    });
    for node in [&mut a, &mut b, &mut ledger] {
        node.wait_ready(READY_TIMEOUT).unwrap();
    }

    // A proxy in front of every participant, with faults on every route.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let proxies: Vec<FaultProxy> = [&a, &b, &ledger]
        .iter()
        .enumerate()
        .map(|(i, node)| {
            let options = ProxyOptions {
                seed: 15 + i as u64,
                hold_ms_max: 3_000,
                ..ProxyOptions::default()
            };
            runtime
                .block_on(FaultProxy::start(&node.url(), options))
                .unwrap()
        })
        .collect();
    for proxy in &proxies {
        let handle = proxy.handle();
        handle.add(Rule::percent(Scope::Any, Fault::DropRequest, 5));
        handle.add(Rule::percent(Scope::Any, Fault::DropResponse, 5));
        handle.add(Rule::percent(Scope::Any, Fault::Duplicate, 5));
        handle.add(Rule::percent(
            Scope::Any,
            Fault::Delay {
                min_ms: 1,
                max_ms: 80,
            },
            20,
        ));
    }
    let participants = [
        ("bank_a".to_string(), proxies[0].url()),
        ("bank_b".to_string(), proxies[1].url()),
        ("ledger".to_string(), proxies[2].url()),
    ];
    let mut coordinator = coordinator(
        &binary,
        dir.path(),
        coordinator_addr,
        &participants,
        Vec::new(),
    );
    coordinator.wait_ready(READY_TIMEOUT).unwrap();

    // The workload: CLIENTS threads, each sending its share of transfers once.
    let heard: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let threads: Vec<_> = (0..CLIENTS)
        .map(|client| {
            let heard = Arc::clone(&heard);
            let tokens = coordinator.tokens().cloned();
            let url = format!("{coordinator_url}/v1/transactions");
            std::thread::spawn(move || {
                let mut rng = fastrand::Rng::with_seed(client);
                for n in (client..TRANSFERS).step_by(CLIENTS as usize) {
                    let id = format!("x{n}");
                    let amount = rng.i64(1..=40);
                    let from = format!("a{}", rng.u32(0..ACCOUNTS));
                    let to = format!("a{}", rng.u32(0..ACCOUNTS));
                    let body = json!({"id": id, "timeout_ms": 2000, "participants": [
                        {"name": "bank_a", "payload": {"ops": [
                            {"statement": "debit", "params": [from, amount]},
                            {"statement": "record", "params": [id]}]}},
                        {"name": "bank_b", "payload": {"ops": [
                            {"statement": "credit", "params": [to, amount]},
                            {"statement": "record", "params": [id]}]}},
                        {"name": "ledger", "payload": {"ops": [
                            {"op": "put", "key": format!("t:{id}"), "value": amount}]}}]});
                    let (status, answer) = post(tokens.as_ref(), &url, &body);
                    let outcome = match (status, answer["outcome"].as_str()) {
                        (200, Some(outcome)) => outcome.to_string(),
                        _ => "unknown".to_string(),
                    };
                    heard.lock().unwrap().push((id, outcome));
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    // Heal, then let phase two and the in-doubt queries finish.
    for proxy in &proxies {
        let handle = proxy.handle();
        for (id, _) in handle.rules() {
            handle.remove(id);
        }
    }
    let faults: u64 = proxies
        .iter()
        .map(|p| {
            let c = p.handle().counts();
            c.dropped_requests + c.dropped_responses + c.duplicated + c.delayed
        })
        .sum();
    let settled = eventually(SETTLE * 2, || {
        let (_, kv) = get(ledger.tokens(), &format!("{}/v1/prepared", ledger.url()));
        prepared_gids(&db_a).is_empty()
            && prepared_gids(&db_b).is_empty()
            && kv["prepared"].as_array().is_some_and(Vec::is_empty)
    });
    let logs = || {
        ["coordinator", "bank_a", "bank_b", "ledger"]
            .iter()
            .map(|n| {
                format!(
                    "--- {n}\n{}",
                    std::fs::read_to_string(dir.path().join(format!("{n}.log")))
                        .unwrap_or_default()
                )
            })
            .collect::<String>()
    };
    assert!(settled, "still prepared after healing:\n{}", logs());

    // The oracle.
    let in_a = recorded(&db_a);
    let in_b = recorded(&db_b);
    let heard = heard.lock().unwrap().clone();
    let mut committed = 0;
    let mut problems = Vec::new();
    for (id, outcome) in &heard {
        let (status, _) = get(ledger.tokens(), &format!("{}/v1/kv/t:{id}", ledger.url()));
        let places = [in_a.contains(id), in_b.contains(id), status == 200];
        if places != [true; 3] && places != [false; 3] {
            problems.push(format!(
                "{id}: applied at {places:?} (bank_a, bank_b, ledger)"
            ));
        }
        match outcome.as_str() {
            "committed" if places != [true; 3] => {
                problems.push(format!("{id}: heard committed, applied at {places:?}"))
            }
            "aborted" if places != [false; 3] => {
                problems.push(format!("{id}: heard aborted, applied at {places:?}"))
            }
            _ => {}
        }
        committed += u32::from(places == [true; 3]);
    }
    let after = total_balance(&db_a) + total_balance(&db_b);
    if after != before {
        problems.push(format!("money: {before} before, {after} after"));
    }
    assert!(problems.is_empty(), "{}\n{}", problems.join("\n"), logs());
    assert_eq!(heard.len() as u64, TRANSFERS);
    // The run exercised something: some committed, and the proxies injected faults.
    assert!(committed > 0, "nothing committed:\n{}", logs());
    assert!(faults > 0, "the proxies injected no fault");
    println!("{committed} of {TRANSFERS} transfers committed, {faults} faults injected");
    coordinator.terminate(Duration::from_secs(10));
}
