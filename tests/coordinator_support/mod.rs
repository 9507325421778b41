//! Shared by the coordinator integration tests: in-test participants (small axum servers on
//! port 0 that vote as told and record what they receive) and a handle on a real
//! `twopc coordinator` process.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use cluster::node::{Node, NodeSpec, free_port};
use protocol::auth::Kind;
use protocol::{DecisionQuery, PrepareRequest, routes};
use serde_json::{Value, json};

/// How a test participant answers a prepare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VoteMode {
    Yes,
    No,
    /// Sleeps this long, then votes yes (a prepare timeout from the coordinator's view).
    Slow(u64),
    /// 200 with a body that is not a vote.
    Malformed,
}

/// How a test participant answers commit/abort.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckMode {
    Ack,
    /// 503, as a participant that is down or restarting would.
    Down,
}

/// One message a participant received: route ("prepare", "commit", "abort"), the body.
#[derive(Debug, Clone)]
pub struct Received {
    pub route: &'static str,
    pub body: Value,
}

/// An attempt the test says this participant holds.
#[derive(Debug)]
struct Pretended {
    txid: String,
    state: &'static str,
    participants: Option<Vec<String>>,
}

#[derive(Debug)]
struct Behaviour {
    vote: VoteMode,
    ack: AckMode,
    received: Vec<Received>,
    /// What it says about attempts when an operator asks (`/v1/attempts/{gtid}`), set by the
    /// test: the attempts of a coordinator whose log lost them.
    attempts: std::collections::BTreeMap<String, Pretended>,
}

/// A participant server running in the test process.
#[derive(Debug, Clone)]
pub struct TestParticipant {
    pub name: String,
    pub addr: SocketAddr,
    state: Arc<Mutex<Behaviour>>,
}

impl TestParticipant {
    pub async fn start(name: &str, vote: VoteMode, ack: AckMode) -> TestParticipant {
        let state = Arc::new(Mutex::new(Behaviour {
            vote,
            ack,
            received: Vec::new(),
            attempts: std::collections::BTreeMap::new(),
        }));
        let app = Router::new()
            .route("/2pc/prepare", post(prepare))
            .route("/2pc/commit", post(commit))
            .route("/2pc/abort", post(abort))
            .route(routes::ATTEMPT, get(attempt))
            .route(routes::PREPARED, get(prepared))
            .with_state(Arc::clone(&state));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        TestParticipant {
            name: name.to_string(),
            addr,
            state,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn flag(&self) -> String {
        format!("{}={}", self.name, self.url())
    }

    pub fn set_ack(&self, ack: AckMode) {
        self.state.lock().unwrap().ack = ack;
    }

    /// From now on it says it holds attempt `gtid` of `txid` in `state` (`prepared`,
    /// `committed`, `aborted`, `refused`, `forgotten`), whatever it received.
    pub fn pretend(&self, txid: &str, gtid: &str, state: &'static str) {
        self.pretend_with(txid, gtid, state, None);
    }

    /// As `pretend`, and it also vouches for the attempt's participants (`participants` in
    /// `/v1/attempts/{gtid}`), as a real participant does with the list its prepare named.
    pub fn pretend_vouching(&self, txid: &str, gtid: &str, state: &'static str, names: &[&str]) {
        let names = names.iter().map(|n| n.to_string()).collect();
        self.pretend_with(txid, gtid, state, Some(names));
    }

    fn pretend_with(
        &self,
        txid: &str,
        gtid: &str,
        state: &'static str,
        participants: Option<Vec<String>>,
    ) {
        let pretended = Pretended {
            txid: txid.to_string(),
            state,
            participants,
        };
        self.state
            .lock()
            .unwrap()
            .attempts
            .insert(gtid.to_string(), pretended);
    }

    /// Every message received about clients' transactions, in order; the coordinator's
    /// start-time epoch probe (see [`TestParticipant::probes`]) is left out.
    pub fn received(&self) -> Vec<Received> {
        let all = self.state.lock().unwrap().received.clone();
        all.into_iter()
            .filter(|r| r.body["txid"] != coordinator::runtime::PROBE_TXID)
            .collect()
    }

    /// The epoch probes received: the abort a starting coordinator sends each participant
    /// for position 0 of its run, to learn the highest epoch the participant holds.
    pub fn probes(&self) -> Vec<Received> {
        let all = self.state.lock().unwrap().received.clone();
        all.into_iter()
            .filter(|r| r.body["txid"] == coordinator::runtime::PROBE_TXID)
            .collect()
    }

    /// Messages on `route` for `txid`.
    pub fn count(&self, route: &str, txid: &str) -> usize {
        self.received()
            .iter()
            .filter(|r| r.route == route && r.body["txid"] == txid)
            .count()
    }

    /// The first prepare this participant received for `txid`: it names the attempt (gtid,
    /// incarnation, epoch, position) that a decision query about `txid` must give.
    pub fn prepare_of(&self, txid: &str) -> Value {
        self.received()
            .into_iter()
            .find(|r| r.route == "prepare" && r.body["txid"] == txid)
            .map(|r| r.body)
            .unwrap_or_else(|| panic!("{} received no prepare for {txid}", self.name))
    }

    /// Waits (bounded) until at least `n` messages on `route` for `txid` arrived.
    pub async fn wait_for(&self, route: &str, txid: &str, n: usize, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while self.count(route, txid) < n {
            assert!(
                Instant::now() < deadline,
                "{}: fewer than {n} {route} for {txid} after {timeout:?}; got {:?}",
                self.name,
                self.received()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

type Shared = State<Arc<Mutex<Behaviour>>>;

fn record(state: &Arc<Mutex<Behaviour>>, route: &'static str, body: &Value) -> Behaviour {
    let mut guard = state.lock().unwrap();
    guard.received.push(Received {
        route,
        body: body.clone(),
    });
    Behaviour {
        vote: guard.vote,
        ack: guard.ack,
        received: Vec::new(),
        attempts: std::collections::BTreeMap::new(),
    }
}

/// What it holds of an attempt: a pretended state, else what the messages it received imply
/// (a yes-voted prepare is prepared until a commit or abort for that gtid came). Down (503)
/// while its acks are down, like the rest of a participant that is down.
async fn attempt(
    State(state): Shared,
    axum::extract::Path(gtid): axum::extract::Path<String>,
) -> Response {
    let guard = state.lock().unwrap();
    if guard.ack == AckMode::Down {
        return (StatusCode::SERVICE_UNAVAILABLE, "down").into_response();
    }
    if let Some(pretended) = guard.attempts.get(&gtid) {
        let mut said = json!({"gtid": gtid, "state": pretended.state, "txid": pretended.txid});
        if let Some(names) = &pretended.participants {
            said["participants"] = json!(names);
        }
        return axum::Json(said).into_response();
    }
    let said = {
        let about = |route: &str| {
            guard
                .received
                .iter()
                .any(|r| r.route == route && r.body["gtid"] == gtid.as_str())
        };
        if about("commit") {
            "committed"
        } else if about("abort") {
            "aborted"
        } else if about("prepare") {
            match guard.vote {
                VoteMode::No => "refused",
                VoteMode::Yes | VoteMode::Slow(_) | VoteMode::Malformed => "prepared",
            }
        } else {
            "unknown"
        }
    };
    axum::Json(json!({"gtid": gtid, "state": said})).into_response()
}

/// The pretended attempts that are prepared, as `/v1/prepared` lists them (503 while down).
async fn prepared(State(state): Shared) -> Response {
    let guard = state.lock().unwrap();
    if guard.ack == AckMode::Down {
        return (StatusCode::SERVICE_UNAVAILABLE, "down").into_response();
    }
    let prepared: Vec<Value> = guard
        .attempts
        .iter()
        .filter(|(_, pretended)| pretended.state == "prepared")
        .map(|(gtid, Pretended { txid, .. })| {
            // Prepared a minute ago by the coordinator its gtid names.
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as u64;
            let coordinator = gtid.split(':').next().unwrap_or("c-lost");
            json!({"txid": txid, "gtid": gtid, "coordinator_id": coordinator, "epoch": 1,
                   "incarnation": "00000000000000aa", "position": 1, "keys": [],
                   "prepared_at_ms": now_ms - 60_000,
                   "last_answer": "unknown: this coordinator's log holds no run 00000000000000aa"})
        })
        .collect();
    axum::Json(json!({ "prepared": prepared })).into_response()
}

async fn prepare(State(state): Shared, axum::Json(body): axum::Json<Value>) -> Response {
    let behaviour = record(&state, "prepare", &body);
    match behaviour.vote {
        VoteMode::Yes => axum::Json(json!({"vote": "yes"})).into_response(),
        VoteMode::No => axum::Json(json!({"vote": "no", "reason": "out of stock"})).into_response(),
        VoteMode::Slow(ms) => {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            axum::Json(json!({"vote": "yes"})).into_response()
        }
        VoteMode::Malformed => (StatusCode::OK, "{\"vote\": \"maybe\"}").into_response(),
    }
}

fn decision(state: &Arc<Mutex<Behaviour>>, route: &'static str, body: &Value) -> Response {
    match record(state, route, body).ack {
        AckMode::Ack => axum::Json(json!({"ack": true})).into_response(),
        AckMode::Down => (StatusCode::SERVICE_UNAVAILABLE, "down").into_response(),
    }
}

async fn commit(State(state): Shared, axum::Json(body): axum::Json<Value>) -> Response {
    decision(&state, "commit", &body)
}

async fn abort(State(state): Shared, axum::Json(body): axum::Json<Value>) -> Response {
    decision(&state, "abort", &body)
}

/// A real `twopc coordinator` process.
pub struct Coordinator {
    pub node: Node,
    pub data_dir: PathBuf,
}

impl Coordinator {
    /// Starts `twopc coordinator` on a free port with these participants; waits until ready.
    pub fn start(
        dir: &Path,
        name: &str,
        participants: &[&TestParticipant],
        extra: &[&str],
    ) -> Coordinator {
        let coordinator = Coordinator::spawn(dir, name, participants, extra);
        let mut coordinator = coordinator;
        tokio::task::block_in_place(|| coordinator.node.wait_ready(Duration::from_secs(20)))
            .unwrap();
        coordinator
    }

    /// Starts it without waiting for readiness.
    pub fn spawn(
        dir: &Path,
        name: &str,
        participants: &[&TestParticipant],
        extra: &[&str],
    ) -> Coordinator {
        Coordinator::spawn_with(
            PathBuf::from(env!("CARGO_BIN_EXE_twopc")),
            Vec::new(),
            dir,
            name,
            participants,
            extra,
        )
    }

    /// Starts `binary` (for example the failpoints build) with extra environment.
    pub fn spawn_with(
        binary: PathBuf,
        env: Vec<(String, String)>,
        dir: &Path,
        name: &str,
        participants: &[&TestParticipant],
        extra: &[&str],
    ) -> Coordinator {
        let data_dir = dir.join("coordinator-data");
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let mut args = vec![
            "coordinator".to_string(),
            "--listen".to_string(),
            addr.to_string(),
            "--data-dir".to_string(),
            data_dir.display().to_string(),
        ];
        // Fast retries keep the tests short, unless the test sets its own.
        if !extra.contains(&"--retry-base-ms") {
            args.extend(["--retry-base-ms", "20", "--retry-max-ms", "200"].map(String::from));
        }
        for p in participants {
            args.push("--participant".to_string());
            args.push(p.flag());
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let node = Node::start(NodeSpec {
            name: name.to_string(),
            binary,
            args,
            env: [("RUST_LOG".to_string(), "info".to_string())]
                .into_iter()
                .chain(env)
                .collect(),
            addr,
            log_path: dir.join(format!("{name}.log")),
            // The in-test participants check no token; the coordinator still sends its own.
            tokens: cluster::auth::for_test(dir),
        });
        Coordinator { node, data_dir }
    }

    pub fn url(&self) -> String {
        self.node.url()
    }

    pub fn restart(&mut self) {
        self.node.restart();
        tokio::task::block_in_place(|| self.node.wait_ready(Duration::from_secs(20))).unwrap();
    }

    /// POST /v1/transactions with `body` (as an operator, who may do what clients do);
    /// returns status and JSON.
    pub async fn submit(&self, query: &str, body: &Value) -> (u16, Value) {
        let response = self
            .node
            .http()
            .post(format!("{}/v1/transactions{query}", self.url()))
            .json(body)
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap())
    }

    /// GET `path` as an operator.
    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.get_as(Kind::Operator, path).await
    }

    /// GET `path` with the token of `kind` (a decision query is a peer's).
    pub async fn get_as(&self, kind: Kind, path: &str) -> (u16, Value) {
        let response = self
            .node
            .http_as(kind)
            .get(format!("{}{path}", self.url()))
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap())
    }

    /// The decision query a participant prepared with `prepare` (a body this process
    /// received) would send: the attempt's gtid, incarnation, epoch and position, from the
    /// prepare itself, as the reference participant takes them.
    pub async fn decision_for(&self, prepare: &Value) -> Value {
        let prepare: PrepareRequest = serde_json::from_value(prepare.clone())
            .unwrap_or_else(|e| panic!("not a prepare of the current protocol ({e}): {prepare}"));
        let query = DecisionQuery {
            gtid: prepare.gtid,
            incarnation: prepare.incarnation,
            epoch: prepare.epoch,
            position: prepare.position,
        };
        let (status, body) = self
            .get_as(
                Kind::Peer,
                &routes::decision_query_path(&prepare.txid, &query),
            )
            .await;
        assert_eq!(status, 200, "decision query: {body}");
        body
    }

    /// `decision_for`, asked again (bounded by `timeout`) while the answer is `pending`: right
    /// after a restart, the aborts recovery decides are `pending` until their record is durable.
    pub async fn settled_decision_for(&self, prepare: &Value, timeout: Duration) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let decision = self.decision_for(prepare).await;
            if decision["decision"] != "pending" || Instant::now() >= deadline {
                return decision;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Polls GET /v1/transactions/{id} until its state is `state` (bounded).
    pub async fn wait_state(&self, txid: &str, state: &str, timeout: Duration) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let (status, body) = self.get(&format!("/v1/transactions/{txid}")).await;
            if status == 200 && body["state"] == state {
                return body;
            }
            assert!(
                Instant::now() < deadline,
                "{txid} not {state} after {timeout:?}: {status} {body}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A two-participant request body.
pub fn two_party(id: &str, a: &TestParticipant, b: &TestParticipant) -> Value {
    json!({
        "id": id,
        "participants": [
            {"name": a.name, "payload": {"ops": [{"op": "add", "key": "stock:sku-1", "delta": -1, "min": 0}]}},
            {"name": b.name, "payload": {"ops": [{"op": "add", "key": "balance:alice", "delta": -10, "min": 0}]}}
        ]
    })
}
