//! Issue 25, item 3, with real processes: a fencing token is only worth what the resource can
//! check. On 6d985fd one `PUT /v1/kv/k` with token 2^64-1 was 200 and every later write of the
//! real lease holder was 409 `stale_token` for ever, restarts included, with no way back.
//!
//! - without a fence key, a token past the jump bound is refused (`token_too_high`) and the
//!   real holder keeps writing;
//! - with a key, only tokens the lease service granted (with its proof) write, in fenced
//!   writes and in 2PC `fence` ops alike; the proof goes to the holder only;
//! - an operator resets a fence that a forged token raised, audited and compare-and-set, and a
//!   write told `stale_token` before the reset stays refused after it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use chaos_tests::lease_nodes::{acquire, blocking, coordinator_of, participant_with, send};
use cluster::node::Node;
use protocol::auth::Kind;
use serde_json::{Value, json};

const KEY: &str = "test-fence-key-0123456789abcdef0123456789abcdef";

fn plain() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_twopc"))
}

fn key_file(dir: &Path) -> String {
    let path = dir.join("fence.key");
    std::fs::write(&path, format!("# the lease service's fence key\n{KEY}\n")).unwrap();
    path.display().to_string()
}

async fn put(p: &Node, key: &str, fence: Value, op_id: &str) -> (u16, Value) {
    let body = json!({"value": format!("{key}-{op_id}"), "fence": fence, "op_id": op_id});
    send(
        p.http_as(Kind::Client)
            .put(format!("{}/v1/kv/{key}", p.url()))
            .json(&body),
    )
    .await
    .unwrap()
}

fn restart(node: &mut Node) {
    blocking(|| {
        node.kill();
        node.restart();
        node.wait_ready(Duration::from_secs(30))
    })
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_of_two_to_the_64_is_refused_and_the_real_holder_keeps_writing() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = participant_with(plain(), dir.path(), &[]).start();
    let forged = json!({"resource": "r", "token": u64::MAX});
    let (status, body) = put(&p, "k", forged, "e1").await;
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("token_too_high")),
        "{body}"
    );
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("--fence-key-file"),
        "the refusal says how to check proofs instead: {body}"
    );
    for restarted in [false, true] {
        if restarted {
            restart(&mut p);
        }
        let op = format!("real-{restarted}");
        let (status, body) = put(&p, "k", json!({"resource": "r", "token": 1}), &op).await;
        assert_eq!(
            status, 200,
            "the real holder's write (restarted: {restarted}): {body}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_fence_key_only_granted_tokens_write() {
    let dir = tempfile::tempdir().unwrap();
    let key = key_file(dir.path());
    let mut p = participant_with(plain(), dir.path(), &["--fence-key-file", &key]).start();
    let c = coordinator_of(plain(), dir.path(), &p.url(), &["--fence-key-file", &key]);
    let (status, grant) = acquire(&c, "r", "worker-a", 5_000).await.unwrap();
    assert_eq!(status, 200, "{grant}");
    let token = grant["token"].as_u64().unwrap();
    let proof = grant["proof"]
        .as_str()
        .expect("a grant carries its proof")
        .to_string();
    let (_, read) = send(c.http().get(format!("{}/v1/leases/r", c.url())))
        .await
        .unwrap();
    assert!(
        read.get("proof").is_none(),
        "reads never carry the proof: {read}"
    );

    let proven = json!({"resource": "r", "token": token, "holder": "worker-a", "proof": proof});
    let (status, body) = put(&p, "k", proven.clone(), "a-1").await;
    assert_eq!(status, 200, "{body}");
    for (what, fence) in [
        ("no proof", json!({"resource": "r", "token": u64::MAX})),
        (
            "the proof of another token",
            json!({"resource": "r", "token": token + 1, "holder": "worker-a", "proof": proof}),
        ),
        (
            "the proof of another holder",
            json!({"resource": "r", "token": token, "holder": "worker-b", "proof": proof}),
        ),
        (
            "the proof of another resource",
            json!({"resource": "r2", "token": token, "holder": "worker-a", "proof": proof}),
        ),
        (
            "a made-up proof",
            json!({"resource": "r", "token": token, "holder": "worker-a", "proof": "ab".repeat(32)}),
        ),
    ] {
        let (status, body) = put(&p, "k", fence, &format!("forged-{}", what.len())).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (409, Some("invalid_fence_proof")),
            "{what}: {body}"
        );
    }
    // The same check inside 2PC: a fence op without a valid proof votes no.
    let tx = |id: &str, fence: Value| {
        let mut op = fence;
        op["op"] = json!("fence");
        json!({"id": id, "participants": [{"name": "kv", "payload": {"ops": [
            op, {"op": "put", "key": "k2", "value": id}
        ]}}]})
    };
    let post = |body: Value| {
        c.http_as(Kind::Client)
            .post(format!("{}/v1/transactions?wait=acked", c.url()))
            .json(&body)
    };
    let (_, forged) = send(post(tx(
        "t-forged",
        json!({"resource": "r", "token": u64::MAX}),
    )))
    .await
    .unwrap();
    assert_eq!(forged["outcome"], "aborted", "{forged}");
    assert!(
        forged["reason"]
            .as_str()
            .unwrap()
            .contains("invalid_fence_proof"),
        "{forged}"
    );
    let (_, granted) = send(post(tx("t-granted", proven.clone()))).await.unwrap();
    assert_eq!(granted["outcome"], "committed", "{granted}");
    restart(&mut p);
    let (status, body) = put(&p, "k", proven, "a-2").await;
    assert_eq!(status, 200, "after a restart: {body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_resets_a_fence_a_forged_token_raised() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = participant_with(plain(), dir.path(), &[]).start();
    let fence = |token: u64| json!({"resource": "r", "token": token});
    // A token within the jump bound but never granted: without a key, nothing can tell.
    assert_eq!(put(&p, "k", fence(500), "forged").await.0, 200);
    let (status, told_stale) = put(&p, "k", fence(1), "honest-1").await;
    assert_eq!(
        (status, told_stale["error"].as_str()),
        (409, Some("stale_token"))
    );
    let operator = p.http_as(Kind::Operator);
    let url = format!("{}/v1/fences/r", p.url());
    let (status, seen) = send(operator.get(&url)).await.unwrap();
    assert_eq!((status, &seen["highest"]), (200, &json!(500)), "{seen}");
    let reset = |body: Value| operator.post(format!("{url}/reset")).json(&body);
    let named = |from: u64, to: u64| json!({"from": from, "to": to, "operator": "alice", "reason": "token 500 was never granted"});
    for (body, status, code) in [
        (named(499, 0), 409, "fence_changed"),
        (named(500, 500), 422, "invalid_reset"),
        (
            json!({"from": 500, "to": 0, "reason": " "}),
            422,
            "invalid_operator",
        ),
    ] {
        let (got, answer) = send(reset(body.clone())).await.unwrap();
        assert_eq!(
            (got, answer["error"].as_str()),
            (status, Some(code)),
            "{body}: {answer}"
        );
    }
    let (status, answer) = send(
        p.http_as(Kind::Client)
            .post(format!("{url}/reset"))
            .json(&named(500, 0)),
    )
    .await
    .unwrap();
    assert_eq!(status, 403, "a client may not reset a fence: {answer}");
    let (status, done) = send(reset(named(500, 0))).await.unwrap();
    assert_eq!(status, 200, "{done}");
    assert_eq!(
        (done["from"].as_u64(), done["to"].as_u64()),
        (Some(500), Some(0))
    );
    let audited = cluster::auth::audited_operator(p.tokens(), "alice");
    assert_eq!(done["operator"], audited, "{done}");

    let (status, body) = put(&p, "k", fence(1), "honest-2").await;
    assert_eq!(status, 200, "the real holder writes again: {body}");
    for restarted in [false, true] {
        if restarted {
            restart(&mut p);
        }
        // Told stale before the reset: a retry of that write is never applied after it.
        let (status, again) = put(&p, "k", fence(1), "honest-1").await;
        assert_eq!(
            (status, again["error"].as_str(), &again["highest"]),
            (409, Some("stale_token"), &json!(500)),
            "restarted: {restarted}: {again}"
        );
        let (_, seen) = send(operator.get(&url)).await.unwrap();
        assert_eq!(seen["highest"], 1, "{seen}");
        assert_eq!(
            seen["resets"][0]["reason"], "token 500 was never granted",
            "{seen}"
        );
    }
    let (_, value) = send(p.http_as(Kind::Client).get(format!("{}/v1/kv/k", p.url())))
        .await
        .unwrap();
    assert_eq!(value["value"], "k-honest-2", "{value}");
}
