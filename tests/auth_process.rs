//! Authentication with the real binaries (issue 17, docs/security.md): token files read from
//! disk, rotated by editing them and sending SIGHUP, checked on a representative route of each
//! class of each server; forged protocol messages at a participant; the coordinator and a
//! participant authenticating each other; `twopc ctl --token-file`; the start-up rule for a
//! non-loopback address; and no token ever in a log. The per-route tables are tested in process
//! (coordinator/src/api/tests_auth.rs, participant/tests/auth.rs); this is the same contract
//! through real processes, files and signals.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use cluster::auth::{CLIENT_NAME, TokenSet};
use cluster::node::{Node, NodeSpec, free_port};
use protocol::auth::Kind;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(20);
/// The incarnation of the coordinator `c` the hand-made protocol messages claim to come from.
const INCARNATION: &str = "00000000000000c1";
const WRONG: &str = "0000000000000000000000000000000000000000000000000000000000000000";

fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_twopc"))
}

fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], free_port()))
}

/// A reference participant `inventory` (stock 10) with `tokens`, asking `coordinator`.
fn participant(dir: &Path, tokens: Option<TokenSet>, coordinator: &str) -> Node {
    let seed = dir.join("seed.json");
    std::fs::write(&seed, r#"{"stock": 10}"#).unwrap();
    let addr = loopback();
    let args = [
        "participant",
        "--name",
        "inventory",
        "--listen",
        &addr.to_string(),
        "--data-dir",
        &dir.join("inventory").display().to_string(),
        "--seed",
        &seed.display().to_string(),
        "--coordinator",
        coordinator,
    ];
    let mut node = Node::start(NodeSpec {
        name: "inventory".into(),
        binary: binary(),
        args: args.map(String::from).to_vec(),
        env: vec![("RUST_LOG".into(), "info".into())],
        addr,
        log_path: dir.join("inventory.log"),
        tokens,
    });
    blocking(|| node.wait_ready(WAIT)).unwrap();
    node
}

/// A coordinator at `addr` with one participant `inventory` at `inventory_url`.
fn coordinator(
    dir: &Path,
    addr: SocketAddr,
    tokens: Option<TokenSet>,
    inventory_url: &str,
) -> Node {
    let args = [
        "coordinator",
        "--listen",
        &addr.to_string(),
        "--data-dir",
        &dir.join("coordinator").display().to_string(),
        "--participant",
        &format!("inventory={inventory_url}"),
        "--retry-base-ms",
        "20",
        "--retry-max-ms",
        "200",
    ];
    let mut node = Node::start(NodeSpec {
        name: "coordinator".into(),
        binary: binary(),
        args: args.map(String::from).to_vec(),
        env: vec![("RUST_LOG".into(), "info".into())],
        addr,
        log_path: dir.join("coordinator.log"),
        tokens,
    });
    blocking(|| node.wait_ready(WAIT)).unwrap();
    node
}

/// What a call answered: status, JSON body, `WWW-Authenticate` values.
#[derive(Debug)]
struct Answer {
    status: u16,
    body: Value,
    challenges: Vec<String>,
}

/// `method url` (a JSON body for POST) sending `token` as a bearer token, if any.
async fn call(method: &str, url: &str, token: Option<&str>, body: Option<&Value>) -> Answer {
    let client = reqwest::Client::new();
    let mut request = match method {
        "POST" => client.post(url).json(body.unwrap_or(&json!({}))),
        _ => client.get(url),
    };
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.timeout(WAIT).send().await.unwrap();
    let status = response.status().as_u16();
    let challenges = response
        .headers()
        .get_all("www-authenticate")
        .iter()
        .filter_map(|v| v.to_str().ok().map(str::to_string))
        .collect();
    let text = response.text().await.unwrap();
    Answer {
        status,
        body: serde_json::from_str(&text).unwrap_or(Value::String(text)),
        challenges,
    }
}

fn assert_refused(what: &str, answer: &Answer, status: u16) {
    let code = if status == 401 {
        "unauthorized"
    } else {
        "forbidden"
    };
    assert_eq!(answer.status, status, "{what}: {answer:?}");
    assert_eq!(answer.body["error"], code, "{what}: {answer:?}");
    assert!(
        answer.body["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{what}: a message says why: {answer:?}"
    );
    if status == 401 {
        assert!(
            answer.challenges.iter().any(|c| c.starts_with("Bearer")),
            "{what}: a 401 names the scheme: {answer:?}"
        );
    }
}

/// One route of one server and who may call it.
struct Route {
    what: &'static str,
    method: &'static str,
    url: String,
    body: Option<Value>,
    /// The kind it takes (the right token).
    takes: Kind,
    /// A valid kind it refuses with 403.
    refuses: Kind,
}

/// A prepare of `c`'s attempt `position` that puts `key`.
fn prepare_body(txid: &str, position: u64, epoch: u64, key: &str) -> Value {
    json!({"txid": txid, "gtid": format!("c:{INCARNATION}:{position}"), "coordinator_id": "c",
           "epoch": epoch, "incarnation": INCARNATION, "position": position,
           "payload": {"ops": [{"op": "put", "key": key, "value": 1}]}})
}

fn decision_body(txid: &str, position: u64, epoch: u64) -> Value {
    json!({"txid": txid, "gtid": format!("c:{INCARNATION}:{position}"), "coordinator_id": "c",
           "epoch": epoch, "incarnation": INCARNATION})
}

fn routes(coordinator: &str, participant: &str) -> Vec<Route> {
    let route = |what, method, url: String, body, takes, refuses| Route {
        what,
        method,
        url,
        body,
        takes,
        refuses,
    };
    vec![
        route(
            "coordinator client route GET /v1/transactions",
            "GET",
            format!("{coordinator}/v1/transactions"),
            None,
            Kind::Client,
            Kind::Peer,
        ),
        route(
            "coordinator operator route GET /v1/audit",
            "GET",
            format!("{coordinator}/v1/audit"),
            None,
            Kind::Operator,
            Kind::Client,
        ),
        route(
            "coordinator peer route GET /v1/transactions/{id}/decision",
            "GET",
            format!("{coordinator}/v1/transactions/nobody/decision"),
            None,
            Kind::Peer,
            Kind::Operator,
        ),
        route(
            "participant peer route POST /2pc/prepare",
            "POST",
            format!("{participant}/2pc/prepare"),
            // Its own key: the lock it holds keeps no later transaction waiting.
            Some(prepare_body("t-route", 1, 1, "route-probe")),
            Kind::Peer,
            Kind::Operator,
        ),
        route(
            "participant peer-or-operator route GET /v1/prepared",
            "GET",
            format!("{participant}/v1/prepared"),
            None,
            Kind::Operator,
            Kind::Client,
        ),
        route(
            "participant client route GET /v1/kv/stock",
            "GET",
            format!("{participant}/v1/kv/stock"),
            None,
            Kind::Client,
            Kind::Peer,
        ),
    ]
}

/// Every route: no token, a wrong one, one of the wrong kind and `retired` (if given) are
/// refused; `current`'s token of the right kind gets through.
async fn check_routes(routes: &[Route], current: &TokenSet, retired: Option<&TokenSet>) {
    for r in routes {
        let body = r.body.as_ref();
        let answer = call(r.method, &r.url, None, body).await;
        assert_refused(&format!("{} without a token", r.what), &answer, 401);
        let answer = call(r.method, &r.url, Some(WRONG), body).await;
        assert_refused(&format!("{} with a wrong token", r.what), &answer, 401);
        let wrong_kind = current.token(r.refuses).expose();
        let answer = call(r.method, &r.url, Some(wrong_kind), body).await;
        assert_refused(
            &format!("{} with a {:?} token", r.what, r.refuses),
            &answer,
            403,
        );
        if let Some(old) = retired {
            let answer = call(r.method, &r.url, Some(old.token(r.takes).expose()), body).await;
            assert_refused(
                &format!("{} with a rotated-out token", r.what),
                &answer,
                401,
            );
        }
        let answer = call(
            r.method,
            &r.url,
            Some(current.token(r.takes).expose()),
            body,
        )
        .await;
        assert_eq!(
            answer.status, 200,
            "{} with the right token: {answer:?}",
            r.what
        );
    }
}

/// Replaces the token files of `files` with those of `fresh` (same paths, same 0600 files).
fn rotate(files: &TokenSet, fresh: &TokenSet) {
    for kind in [Kind::Peer, Kind::Client, Kind::Operator] {
        let text = std::fs::read_to_string(fresh.path(kind)).unwrap();
        std::fs::write(files.path(kind), text).unwrap();
    }
}

fn hang_up(node: &Node) {
    let pid = node.pid().expect("running").to_string();
    let status = Command::new("kill").args(["-HUP", &pid]).status().unwrap();
    assert!(status.success());
}

/// Waits (bounded) until `url` refuses `token` with 401: the reload took effect.
async fn wait_refused(url: &str, token: &str) {
    let deadline = Instant::now() + WAIT;
    while call("GET", url, Some(token), None).await.status != 401 {
        assert!(Instant::now() < deadline, "{url} still takes the old token");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn assert_no_token_in(logs: &str, sets: &[&TokenSet]) {
    for set in sets {
        for kind in [Kind::Peer, Kind::Client, Kind::Operator] {
            assert!(
                !logs.contains(set.token(kind).expose()),
                "a {kind:?} token is in a log"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_class_of_route_on_each_server_checks_tokens_read_from_files_and_rotated_by_sighup() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = TokenSet::generate(&dir.path().join("tokens")).unwrap();
    let coordinator_addr = loopback();
    let p = participant(
        dir.path(),
        Some(tokens.clone()),
        &format!("http://{coordinator_addr}"),
    );
    let c = coordinator(dir.path(), coordinator_addr, Some(tokens.clone()), &p.url());
    let routes = routes(&c.url(), &p.url());

    // The open routes stay open.
    for url in [
        format!("{}/healthz", c.url()),
        format!("{}/readyz", p.url()),
        format!("{}/metrics", c.url()),
    ] {
        assert_eq!(call("GET", &url, None, None).await.status, 200, "{url}");
    }
    check_routes(&routes, &tokens, None).await;

    // Rotation: new files in place, SIGHUP to both; the old tokens are refused at once.
    let fresh = TokenSet::generate(&dir.path().join("fresh")).unwrap();
    rotate(&tokens, &fresh);
    hang_up(&c);
    hang_up(&p);
    wait_refused(&format!("{}/v1/audit", c.url()), tokens.operator.expose()).await;
    wait_refused(
        &format!("{}/v1/prepared", p.url()),
        tokens.operator.expose(),
    )
    .await;
    check_routes(&routes, &fresh, Some(&tokens)).await;

    // The two servers authenticate each other with the rotated peer token: a client's
    // transaction commits, and the client's name from its token is on it.
    let client = reqwest::Client::new();
    let submitted: Value = client
        .post(format!("{}/v1/transactions", c.url()))
        .bearer_auth(fresh.client.expose())
        .json(
            &json!({"id": "t-auth", "participants": [{"name": "inventory",
            "payload": {"ops": [{"op": "add", "key": "stock", "delta": -2, "min": 0}]}}]}),
        )
        .timeout(WAIT)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(submitted["outcome"], "committed", "{submitted}");
    let status = call(
        "GET",
        &format!("{}/v1/transactions/t-auth", c.url()),
        Some(fresh.operator.expose()),
        None,
    )
    .await;
    assert_eq!(status.body["client"], CLIENT_NAME, "{status:?}");

    let logs = format!("{}{}", c.log(), p.log());
    assert!(logs.contains("SIGHUP"), "the reload is logged:\n{logs}");
    assert_no_token_in(&logs, &[&tokens, &fresh]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_protocol_messages_at_a_real_participant_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = TokenSet::generate(&dir.path().join("tokens")).unwrap();
    // Nothing listens at the coordinator's address: no decision query can resolve anything.
    let p = participant(
        dir.path(),
        Some(tokens.clone()),
        &format!("http://{}", loopback()),
    );
    let prepare = format!("{}/2pc/prepare", p.url());
    let commit = format!("{}/2pc/commit", p.url());
    let abort = format!("{}/2pc/abort", p.url());
    let peer = Some(tokens.peer.expose());
    let vote = call(
        "POST",
        &prepare,
        peer,
        Some(&prepare_body("t1", 1, 2, "forged-target")),
    )
    .await;
    assert_eq!(vote.body["vote"], "yes", "{vote:?}");

    let observe = || async {
        let operator = Some(tokens.operator.expose());
        let prepared = call("GET", &format!("{}/v1/prepared", p.url()), operator, None).await;
        let stock = call("GET", &format!("{}/v1/kv/stock", p.url()), operator, None).await;
        let target_url = format!("{}/v1/kv/forged-target", p.url());
        let target = call("GET", &target_url, operator, None).await;
        (prepared.body, stock.body, target.status)
    };
    let before = observe().await;
    assert_eq!(before.0["prepared"][0]["epoch"], 2, "{before:?}");
    assert_eq!(
        (&before.1["value"], before.2),
        (&json!(10), 404),
        "{before:?}"
    );

    // Forgeries: no token, a wrong one, and a client's (valid, wrong kind), each at an epoch
    // that would fence the real coordinator out for ever.
    for (who, token, status) in [
        ("no token", None, 401),
        ("a wrong token", Some(WRONG), 401),
        ("a client token", Some(tokens.client.expose()), 403),
    ] {
        for (url, body) in [
            (&prepare, prepare_body("t-forged", 5, u64::MAX, "stock")),
            (&commit, decision_body("t1", 1, u64::MAX)),
            (&abort, decision_body("t1", 1, u64::MAX)),
        ] {
            let answer = call("POST", url, token, Some(&body)).await;
            assert_refused(&format!("{url} with {who}"), &answer, status);
        }
    }
    let after = observe().await;
    assert_eq!(after, before, "a forged message changed the participant");

    // The epoch is as before: the real coordinator's commit at epoch 2 is taken and applied.
    let ack = call("POST", &commit, peer, Some(&decision_body("t1", 1, 2))).await;
    assert_eq!(ack.body, json!({"ack": true}), "{ack:?}");
    let (prepared, stock, target) = observe().await;
    assert_eq!(prepared["prepared"], json!([]), "{prepared}");
    assert_eq!((&stock["value"], target), (&json!(10), 200), "{stock}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_with_another_peer_token_cannot_prepare_and_the_transaction_aborts() {
    let dir = tempfile::tempdir().unwrap();
    let ours = TokenSet::generate(&dir.path().join("ours")).unwrap();
    let theirs = TokenSet::generate(&dir.path().join("theirs")).unwrap();
    let coordinator_addr = loopback();
    let p = participant(
        dir.path(),
        Some(theirs.clone()),
        &format!("http://{coordinator_addr}"),
    );
    let c = coordinator(dir.path(), coordinator_addr, Some(ours.clone()), &p.url());
    let answer = reqwest::Client::new()
        .post(format!("{}/v1/transactions", c.url()))
        .bearer_auth(ours.client.expose())
        .json(
            &json!({"id": "t-stranger", "participants": [{"name": "inventory",
            "payload": {"ops": [{"op": "add", "key": "stock", "delta": -1, "min": 0}]}}]}),
        )
        .timeout(WAIT)
        .send()
        .await
        .unwrap();
    let body: Value = answer.json().await.unwrap();
    assert_eq!(body["outcome"], "aborted", "{body}");
    let stock = call(
        "GET",
        &format!("{}/v1/kv/stock", p.url()),
        Some(theirs.operator.expose()),
        None,
    )
    .await;
    assert_eq!(stock.body["value"], 10, "{stock:?}");
    assert!(
        p.log().contains("401") || c.log().contains("401"),
        "the refusal is visible in a log:\ncoordinator:\n{}\nparticipant:\n{}",
        c.log(),
        p.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twopc_ctl_sends_its_token_file_and_says_unauthorized_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = TokenSet::generate(&dir.path().join("tokens")).unwrap();
    let coordinator_addr = loopback();
    let p = participant(
        dir.path(),
        Some(tokens.clone()),
        &format!("http://{coordinator_addr}"),
    );
    let c = coordinator(dir.path(), coordinator_addr, Some(tokens.clone()), &p.url());
    let ctl = |token_file: Option<PathBuf>| {
        let mut command = Command::new(binary());
        command
            .args(["ctl", "--coordinator", &c.url(), "audit"])
            .env_remove("TWOPC_TOKEN_FILE");
        if let Some(file) = token_file {
            command.env("TWOPC_TOKEN_FILE", file);
        }
        let output = command.output().unwrap();
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let (code, stderr) = blocking(|| ctl(None));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("unauthorized"), "{stderr}");
    let (code, stderr) = blocking(|| ctl(Some(tokens.path(Kind::Client))));
    assert_eq!(code, Some(1), "a client may not read the audit: {stderr}");
    assert!(stderr.contains("forbidden"), "{stderr}");
    let (code, stderr) = blocking(|| ctl(Some(tokens.path(Kind::Operator))));
    assert_eq!(code, Some(0), "{stderr}");
    // A token file that does not hold a token: bad usage, named, the text not repeated.
    let bad = dir.path().join("bad.tokens");
    std::fs::write(&bad, "ops short-secret\n").unwrap();
    let (code, stderr) = blocking(|| ctl(Some(bad.clone())));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains(&bad.display().to_string()), "{stderr}");
    assert!(!stderr.contains("short-secret"), "{stderr}");
}

/// Starts `args` on 0.0.0.0 (so not loopback) with no token, and returns the node.
fn exposed(dir: &Path, name: &str, mut args: Vec<String>, extra: &[&str]) -> Node {
    let port = free_port();
    args.extend(["--listen".to_string(), format!("0.0.0.0:{port}")]);
    args.extend(extra.iter().map(|s| s.to_string()));
    Node::start(NodeSpec {
        name: name.into(),
        binary: binary(),
        args,
        env: vec![("RUST_LOG".into(), "info".into())],
        // Only ever reached on loopback.
        addr: SocketAddr::from(([127, 0, 0, 1], port)),
        log_path: dir.join(format!("{name}.log")),
        tokens: None,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_loopback_listener_without_tokens_refuses_to_start_unless_insecure_no_auth() {
    let dir = tempfile::tempdir().unwrap();
    let servers = [
        (
            "coordinator",
            vec![
                "coordinator".to_string(),
                "--data-dir".into(),
                dir.path().join("c").display().to_string(),
                "--participant".into(),
                "inventory=http://127.0.0.1:9".into(),
            ],
        ),
        (
            "participant",
            vec![
                "participant".to_string(),
                "--name".into(),
                "inventory".into(),
                "--data-dir".into(),
                dir.path().join("p").display().to_string(),
            ],
        ),
    ];
    for (name, args) in servers {
        let mut refused = exposed(dir.path(), &format!("{name}-refused"), args.clone(), &[]);
        let port = refused.spec().addr.port();
        let status = blocking(|| refused.wait_exit(WAIT)).expect("it must refuse to start");
        assert_eq!(status.code(), Some(2), "{name}:\n{}", refused.log());
        let log = refused.log();
        assert!(
            log.contains(&format!("refusing to listen on 0.0.0.0:{port}")),
            "{name}: the error names the address:\n{log}"
        );

        let mut insecure = exposed(
            dir.path(),
            &format!("{name}-insecure"),
            args,
            &["--insecure-no-auth"],
        );
        blocking(|| insecure.wait_ready(WAIT)).unwrap();
        let log = insecure.log();
        assert!(
            log.contains("WARN") && log.contains("--insecure-no-auth"),
            "{name}: serving without tokens is warned about:\n{log}"
        );
        insecure.terminate(WAIT);
    }
}
