//! The seed corpus, made from the code rather than by hand.
//!
//! `write_seed_corpus` (ignored; run it after changing an input format or a wire shape)
//! sends valid requests through the two HTTP harnesses, asserting each is accepted, then
//! takes the logs those servers wrote as the seeds of the log targets, and writes everything
//! under `fuzz/corpus/<target>/`. `every_seed_passes_its_target` runs each target over the
//! checked-in corpus, as a fuzzing run starts by doing.

use std::fs;
use std::path::{Path, PathBuf};

use protocol::{CoordinatorId, DecisionRequest, Epoch, GlobalTxId, Incarnation, PrepareRequest};
use serde_json::json;

use crate::http::{Auth, FuzzRequest};
use crate::input::Writer;
use crate::records::RecordLog;
use crate::wal_log::{ImageWriter, Kind};
use crate::{coordinator_http, coordinator_log, participant_log, participant_messages, wal_log};

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target)
}

fn write_seed(target: &str, name: &str, bytes: &[u8]) {
    let dir = corpus_dir(target);
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join(name), bytes).unwrap();
}

fn requests(requests: &[FuzzRequest]) -> Vec<u8> {
    let mut w = Writer::default();
    for request in requests {
        request.write(&mut w);
    }
    w.bytes
}

/// Valid coordinator requests (expected status) and a few refused ones.
fn coordinator_seeds() -> Vec<(&'static str, FuzzRequest, u16)> {
    let tx = json!({"id": "seed-tx-1", "participants": [
        {"name": "inventory", "payload": {"ops": [{"op": "put", "key": "sku-1", "value": {"n": 3}}]}},
        {"name": "payments", "payload": {"ops": [{"op": "add", "key": "balance", "delta": 5}]}}
    ]});
    let tx_acked = json!({"id": "seed-tx-2", "timeout_ms": 5000, "participants": [
        {"name": "inventory", "payload": {"ops": [{"op": "add", "key": "stock", "delta": -1, "min": -10}]}},
        {"name": "payments", "payload": {"ops": [{"op": "check", "key": "balance", "version": 1}]}}
    ]});
    let saga = json!({"id": "seed-saga-1", "timeout_ms": 30000, "steps": [
        {"name": "reserve", "participant": "inventory",
         "action": {"ops": [{"op": "add", "key": "held", "delta": 1}]},
         "compensation": {"ops": [{"op": "add", "key": "held", "delta": -1}]}},
        {"name": "charge", "participant": "payments",
         "action": {"ops": [{"op": "put", "key": "charge-1", "value": 10}]},
         "compensation": null}
    ]});
    // Of the harness coordinator (`coordinator_http::COORDINATOR_PLACEHOLDER`), a run it never
    // had: the query issue 24 found stopping new work for good.
    let decision = "/v1/transactions/seed-tx-1/decision?gtid=c-fuzz:ffffffffffffffff:3\
                    &incarnation=ffffffffffffffff&epoch=1&position=3";
    let post = |path: &str, auth, body: serde_json::Value| {
        FuzzRequest::json("POST", path, auth, &body.to_string())
    };
    let get = |path: &str, auth| FuzzRequest::json("GET", path, auth, "");
    vec![
        ("healthz", get("/healthz", Auth::None), 200),
        ("readyz", get("/readyz", Auth::None), 200),
        ("metrics", get("/metrics", Auth::Metrics), 200),
        ("tx_create", post("/v1/transactions", Auth::Client, tx), 200),
        (
            "tx_create_acked",
            post("/v1/transactions?wait=acked", Auth::Operator, tx_acked),
            200,
        ),
        (
            "tx_status",
            get("/v1/transactions/seed-tx-1", Auth::Client),
            200,
        ),
        (
            "tx_list",
            get("/v1/transactions?limit=10", Auth::Client),
            200,
        ),
        ("tx_decision", get(decision, Auth::Peer), 200),
        (
            "tx_evidence",
            get("/v1/transactions/seed-tx-1/evidence", Auth::Operator),
            200,
        ),
        (
            "tx_resolve",
            post(
                "/v1/transactions/seed-tx-9/resolve",
                Auth::Operator,
                json!({"decision": "abort", "operator": "ops", "reason": "seed"}),
            ),
            404,
        ),
        (
            "tx_resolve_ghost",
            post(
                "/v1/transactions/ghost/resolve",
                Auth::Operator,
                json!({"decision": "abort", "gtid": "c-other:ffffffffffffffff:1",
                       "operator": "ops", "reason": "seed"}),
            ),
            409,
        ),
        (
            "participant_retry",
            post(
                "/v1/participants/inventory/retry",
                Auth::Operator,
                json!({"operator": "ops", "reason": "seed"}),
            ),
            200,
        ),
        ("audit", get("/v1/audit?limit=5", Auth::Operator), 200),
        ("cluster", get("/v1/cluster", Auth::Operator), 200),
        ("ui", get("/ui", Auth::BasicOperator), 200),
        ("saga_create", post("/v1/sagas", Auth::Client, saga), 200),
        (
            "saga_status",
            get("/v1/sagas/seed-saga-1", Auth::Client),
            200,
        ),
        ("saga_list", get("/v1/sagas?limit=5", Auth::Client), 200),
        (
            "lease_acquire",
            post(
                "/v1/leases/seed-lease",
                Auth::Client,
                json!({"holder": "worker-a", "ttl_ms": 5000}),
            ),
            200,
        ),
        (
            "lease_renew",
            post(
                "/v1/leases/seed-lease/renew",
                Auth::Client,
                // The harness's coordinator is new: its first lease gets token 1.
                json!({"holder": "worker-a", "token": 1}),
            ),
            200,
        ),
        ("lease_get", get("/v1/leases/seed-lease", Auth::Client), 200),
        ("lease_list", get("/v1/leases", Auth::Client), 200),
        (
            "lease_release",
            FuzzRequest::json(
                "DELETE",
                "/v1/leases/seed-lease?holder=worker-a&token=1",
                Auth::Client,
                "",
            ),
            200,
        ),
        (
            "bad_json",
            FuzzRequest::json("POST", "/v1/transactions", Auth::Client, "{not json"),
            400,
        ),
        ("no_token", get("/v1/transactions", Auth::None), 401),
        ("wrong_kind", get("/v1/audit", Auth::Client), 403),
        ("unknown_route", get("/v2/nothing", Auth::Client), 404),
    ]
}

fn participant_seeds() -> Vec<(&'static str, FuzzRequest, u16)> {
    let gtid = GlobalTxId::compose(
        &CoordinatorId::new("c-seed").unwrap(),
        Incarnation(0xfeed),
        1,
    );
    let prepare = |txid: &str, gtid: &GlobalTxId, payload: serde_json::Value| PrepareRequest {
        txid: protocol::TxId::new(txid).unwrap(),
        gtid: gtid.clone(),
        coordinator_id: CoordinatorId::new("c-seed").unwrap(),
        epoch: Epoch(1),
        incarnation: Incarnation(0xfeed),
        position: gtid.parts().map_or(0, |(_, _, position)| position),
        payload,
        started_at_ms: None,
        lock_wait_ms: None,
        participants: None,
    };
    let decision = |txid: &str, gtid: &GlobalTxId| DecisionRequest {
        txid: protocol::TxId::new(txid).unwrap(),
        gtid: gtid.clone(),
        coordinator_id: CoordinatorId::new("c-seed").unwrap(),
        epoch: Epoch(1),
        incarnation: Incarnation(0xfeed),
    };
    let other = GlobalTxId::compose(
        &CoordinatorId::new("c-seed").unwrap(),
        Incarnation(0xfeed),
        2,
    );
    let post = |path: &str, text: String| FuzzRequest::json("POST", path, Auth::Peer, &text);
    let get = |path: &str, auth| FuzzRequest::json("GET", path, auth, "");
    let ops = json!({"ops": [
        {"op": "put", "key": "name", "value": {"first": "ada"}},
        {"op": "add", "key": "stock", "delta": 7}
    ]});
    vec![
        (
            "prepare",
            post("/2pc/prepare", serde_json::to_string(&prepare("seed-1", &gtid, ops.clone())).unwrap()),
            200,
        ),
        ("prepared", get("/v1/prepared", Auth::Operator), 200),
        (
            "attempt",
            get(&protocol::routes::attempt_path(&gtid), Auth::Peer),
            200,
        ),
        (
            "commit",
            post("/2pc/commit", serde_json::to_string(&decision("seed-1", &gtid)).unwrap()),
            200,
        ),
        ("kv_read", get("/v1/kv/stock", Auth::Client), 200),
        (
            "prepare_other",
            post(
                "/2pc/prepare",
                serde_json::to_string(&prepare(
                    "seed-2",
                    &other,
                    json!({"ops": [{"op": "delete", "key": "name"}]}),
                )).unwrap(),
            ),
            200,
        ),
        (
            "abort",
            post("/2pc/abort", serde_json::to_string(&decision("seed-2", &other)).unwrap()),
            200,
        ),
        (
            "saga_action",
            post(
                "/saga/action",
                json!({"saga_id": "seed-saga", "step": "reserve", "op_id": "seed-saga:reserve:action",
                       "coordinator_id": "c-seed", "epoch": 1,
                       "payload": {"ops": [{"op": "add", "key": "held", "delta": 1}]}})
                .to_string(),
            ),
            200,
        ),
        (
            "saga_compensate",
            post(
                "/saga/compensate",
                json!({"saga_id": "seed-saga", "step": "reserve", "op_id": "seed-saga:reserve:compensation",
                       "coordinator_id": "c-seed", "epoch": 1,
                       "payload": {"ops": [{"op": "add", "key": "held", "delta": -1}]}})
                .to_string(),
            ),
            200,
        ),
        (
            "saga_op",
            get("/saga/ops/seed-saga:reserve:action?coordinator_id=c-seed", Auth::Peer),
            200,
        ),
        (
            "fenced_put",
            FuzzRequest::json(
                "PUT",
                "/v1/kv/fenced",
                Auth::Client,
                &json!({"value": 1, "fence": {"resource": "seed-lease", "token": 3},
                        "op_id": "seed-put-1"})
                .to_string(),
            ),
            200,
        ),
        ("healthz", get("/healthz", Auth::None), 200),
        ("metrics", get("/metrics", Auth::Metrics), 200),
        ("empty_body", post("/2pc/prepare", "{}".into()), 400),
    ]
}

/// A real log directory as a `wal_log` image of raw files.
fn image_of(dir: &Path) -> Vec<u8> {
    let mut image = ImageWriter::default();
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    for name in names {
        let bytes = fs::read(dir.join(&name)).unwrap();
        let (kind, seq) = if let Some(seq) = name.strip_suffix(".wal") {
            (Kind::Segment, seq.parse().unwrap())
        } else if let Some(seq) = name
            .strip_prefix("snapshot-")
            .and_then(|n| n.strip_suffix(".snap"))
        {
            (Kind::Snapshot, seq.parse().unwrap())
        } else {
            continue;
        };
        image.raw(kind, seq, &bytes);
    }
    image.w.bytes
}

/// A real log directory as the records of a `RecordLog` (the snapshot's payload and the
/// records after it).
fn records_of(dir: &Path) -> RecordLog {
    let mut records = Vec::new();
    let summary = wal::inspect::dump(dir, |record| {
        records.push((record.record_type.0, record.payload.to_vec()));
    })
    .unwrap();
    let snapshot = summary.snapshot.map(|s| {
        let bytes = fs::read(&s.path).unwrap();
        wal::decode_snapshot(&bytes, s.seq).unwrap().to_vec()
    });
    RecordLog { snapshot, records }
}

#[test]
#[ignore = "rewrites fuzz/corpus from the code; run by hand (docs/fuzzing.md)"]
fn write_seed_corpus() {
    for (name, request, expected) in coordinator_seeds() {
        let status = coordinator_http::status_of(&request).unwrap();
        assert_eq!(status, expected, "coordinator seed {name}");
        write_seed("coordinator_http", name, &requests(&[request]));
    }
    for (name, request, expected) in participant_seeds() {
        let status = participant_messages::status_of(&request).unwrap();
        assert_eq!(status, expected, "participant seed {name}");
        write_seed("participant_messages", name, &requests(&[request]));
    }
    // The logs those requests left behind, as the log targets' seeds.
    let coordinator_wal = coordinator_http::data_dir().join("coordinator/wal");
    let participant_wal = participant_messages::data_dir().join("participant/wal");
    let inventory_wal = coordinator_http::data_dir().join("inventory/wal");
    for (name, dir) in [
        ("coordinator", &coordinator_wal),
        ("participant", &participant_wal),
        ("inventory", &inventory_wal),
    ] {
        write_seed("wal_log", name, &image_of(dir));
    }
    write_seed(
        "coordinator_log",
        "served",
        &records_of(&coordinator_wal).write(),
    );
    write_seed(
        "participant_log",
        "served",
        &records_of(&participant_wal).write(),
    );
    write_seed(
        "participant_log",
        "inventory",
        &records_of(&inventory_wal).write(),
    );
    // A checkpoint, then records: the shape every long-running log has.
    let mut image = ImageWriter::default();
    image
        .snapshot(2, b"{\"state\":1}")
        .segment(3, &[(1, b"{}".to_vec()), (2, b"[1,2]".to_vec())])
        .raw(Kind::Tmp, 5, b"unfinished");
    write_seed("wal_log", "checkpointed", &image.w.bytes);
    write_seed("coordinator_log", "empty", &RecordLog::default().write());
    write_seed("participant_log", "empty", &RecordLog::default().write());
}

#[test]
fn every_seed_passes_its_target() {
    type Target = (&'static str, fn(&[u8]));
    let targets: [Target; 5] = [
        ("wal_log", wal_log::run),
        ("coordinator_log", coordinator_log::run),
        ("participant_log", participant_log::run),
        ("coordinator_http", coordinator_http::run),
        ("participant_messages", participant_messages::run),
    ];
    for (target, run) in targets {
        let mut seeds = 0;
        for entry in fs::read_dir(corpus_dir(target)).unwrap() {
            run(&fs::read(entry.unwrap().path()).unwrap());
            seeds += 1;
        }
        assert!(seeds > 0, "{target} has no seeds");
    }
}
