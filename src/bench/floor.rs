//! The HTTP floor: what this machine can do with the same processes and the same exchanges as a
//! twopc transaction when nothing else happens. A relay process stands in for the coordinator
//! and leaf processes stand in for the participants: the relay takes the client's transaction,
//! sends a prepare to every leaf in parallel, then a commit to every leaf in parallel, and
//! answers; a leaf parses what it gets and says yes. Same server (axum), same client
//! (`coordinator::http_client`), same JSON shapes, same runtime; no engine, no log, no locks.
//!
//! `twopc bench` prints twopc's throughput as a share of this floor: a figure that holds across
//! machines and across a noisy day, unlike a bare tx/s.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use coordinator::http_client::Endpoint;
use protocol::{
    AckResponse, CoordinatorId, DecisionRequest, Epoch, GlobalTxId, Incarnation, Outcome,
    ParticipantName, ParticipantResult, PrepareRequest, TransactionRequest, TransactionResponse,
    TxId, Vote, VoteKind, routes,
};

use cluster::node::{Node, NodeSpec, free_port};

/// How long one floor exchange may take before the relay gives up on it.
const EXCHANGE_WAIT_MAX: Duration = Duration::from_secs(30);

/// `twopc bench-floor-node` (hidden): one process of the floor cluster.
#[derive(Debug, clap::Args)]
pub struct NodeArgs {
    /// Address to listen on.
    #[arg(long)]
    pub listen: std::net::SocketAddr,
    /// Makes this node the relay: the leaves it fans out to, as `NAME=http://host:port`
    /// (repeat). Without any, the node is a leaf.
    #[arg(long)]
    pub leaf: Vec<String>,
}

/// The floor cluster of one run: a relay and its leaves as child processes (killed on drop).
#[derive(Debug)]
pub struct FloorCluster {
    relay: Node,
    leaves: Vec<Node>,
}

impl FloorCluster {
    /// Starts `leaves` leaves named `p0..` (the bench's participant names) and the relay.
    pub fn start(leaves: usize, dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let binary = std::env::current_exe().context("cannot find the twopc binary")?;
        let spec = |name: &str, args: Vec<String>| {
            let addr = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
            let mut args = args;
            args.splice(
                0..0,
                [
                    "bench-floor-node".to_string(),
                    "--listen".into(),
                    addr.to_string(),
                ],
            );
            NodeSpec {
                name: name.to_string(),
                binary: binary.clone(),
                args,
                env: Vec::new(),
                addr,
                log_path: dir.join(format!("{name}.log")),
                // The floor's processes are not twopc servers and check no token.
                tokens: None,
            }
        };
        let mut leaf_nodes = Vec::new();
        let mut leaf_flags = Vec::new();
        for i in 0..leaves {
            let name = format!("p{i}");
            let mut node = Node::start(spec(&format!("floor-{name}"), Vec::new()));
            node.wait_ready(Duration::from_secs(20))
                .map_err(anyhow::Error::msg)?;
            leaf_flags.extend(["--leaf".to_string(), format!("{name}={}", node.url())]);
            leaf_nodes.push(node);
        }
        let mut relay = Node::start(spec("floor-relay", leaf_flags));
        relay
            .wait_ready(Duration::from_secs(20))
            .map_err(anyhow::Error::msg)?;
        Ok(Self {
            relay,
            leaves: leaf_nodes,
        })
    }

    pub fn relay_url(&self) -> String {
        self.relay.url()
    }

    /// The processes a floor cell runs on: the bench itself (the client), the relay and the
    /// leaves; `None` if any pid is unknown.
    pub fn pids(&self) -> Option<Vec<u32>> {
        let mut pids = vec![std::process::id(), self.relay.pid()?];
        for leaf in &self.leaves {
            pids.push(leaf.pid()?);
        }
        Some(pids)
    }
}

pub fn main(args: NodeArgs) -> ExitCode {
    crate::async_main::block_on("bench-floor-node", async move {
        serve(args).await.map(|()| ExitCode::SUCCESS)
    })
}

struct Relay {
    leaves: BTreeMap<String, Endpoint>,
    coordinator_id: CoordinatorId,
    /// Positions for the attempts' global ids, so the messages are as large as twopc's.
    next_position: std::sync::atomic::AtomicU64,
}

async fn serve(args: NodeArgs) -> Result<()> {
    let ready = || async { "ready" };
    let app = if args.leaf.is_empty() {
        axum::Router::new()
            .route(routes::PREPARE, post(leaf_prepare))
            .route(routes::COMMIT, post(leaf_decision))
            .route(routes::ABORT, post(leaf_decision))
    } else {
        let mut leaves = BTreeMap::new();
        for flag in &args.leaf {
            let (name, url) = flag
                .split_once('=')
                .with_context(|| format!("--leaf {flag:?}: expected NAME=http://host:port"))?;
            leaves.insert(name.to_string(), Endpoint::new(url)?);
        }
        let relay = Relay {
            leaves,
            coordinator_id: CoordinatorId::new("c-floor")?,
            next_position: std::sync::atomic::AtomicU64::new(1),
        };
        axum::Router::new()
            .route(routes::TRANSACTIONS, post(relay_transaction))
            .with_state(Arc::new(relay))
    };
    let app = app.route(routes::READYZ, get(ready));
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, app).await?;
    Ok(())
}

/// A leaf reads the prepare as a participant would (the envelope, then the payload as JSON).
async fn leaf_prepare(body: Bytes) -> Result<Json<Vote>, StatusCode> {
    let request: PrepareRequest =
        serde_json::from_slice(&body).map_err(|_| StatusCode::UNPROCESSABLE_ENTITY)?;
    std::hint::black_box(request);
    Ok(Json(Vote::Yes))
}

async fn leaf_decision(body: Bytes) -> Result<Json<AckResponse>, StatusCode> {
    let request: DecisionRequest =
        serde_json::from_slice(&body).map_err(|_| StatusCode::UNPROCESSABLE_ENTITY)?;
    std::hint::black_box(request);
    Ok(Json(AckResponse { ack: true }))
}

/// Prepare everywhere in parallel, then commit everywhere in parallel (a task per call, as the
/// coordinator does), then answer.
async fn relay_transaction(
    State(relay): State<Arc<Relay>>,
    body: Bytes,
) -> Result<Json<TransactionResponse>, (StatusCode, String)> {
    let bad = |e: String| (StatusCode::UNPROCESSABLE_ENTITY, e);
    let request: TransactionRequest =
        serde_json::from_slice(&body).map_err(|e| bad(e.to_string()))?;
    let txid = TxId::new(request.id.unwrap_or_default()).map_err(|e| bad(e.to_string()))?;
    let mut legs = Vec::new();
    for participant in request.participants {
        if !relay.leaves.contains_key(&participant.name) {
            return Err(bad(format!("no leaf named {}", participant.name)));
        }
        legs.push((participant.name, participant.payload));
    }
    let epoch = Epoch(1);
    let incarnation = Incarnation(1);
    let position = relay
        .next_position
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let gtid = GlobalTxId::compose(&relay.coordinator_id, incarnation, position);
    let named: Vec<ParticipantName> = legs
        .iter()
        .filter_map(|(name, _)| ParticipantName::new(name.clone()).ok())
        .collect();
    let mut prepares = tokio::task::JoinSet::new();
    for (name, payload) in &legs {
        let request = PrepareRequest {
            txid: txid.clone(),
            gtid: gtid.clone(),
            coordinator_id: relay.coordinator_id.clone(),
            epoch,
            incarnation,
            position,
            payload: payload.clone(),
            // The floor has no coordinator clock: participants order by arrival.
            started_at_ms: None,
            lock_wait_ms: None,
            // The same bytes a coordinator sends, so the floor stays a fair reference.
            participants: Some(named.clone()),
        };
        prepares.spawn(exchange(
            Arc::clone(&relay),
            name.clone(),
            routes::PREPARE,
            serde_json::to_vec(&request),
        ));
    }
    check_all(prepares.join_all().await)?;
    let decision = DecisionRequest {
        txid: txid.clone(),
        gtid: gtid.clone(),
        coordinator_id: relay.coordinator_id.clone(),
        epoch,
        incarnation,
    };
    let mut commits = tokio::task::JoinSet::new();
    for (name, _) in &legs {
        commits.spawn(exchange(
            Arc::clone(&relay),
            name.clone(),
            routes::COMMIT,
            serde_json::to_vec(&decision),
        ));
    }
    check_all(commits.join_all().await)?;
    let participants = legs
        .into_iter()
        .map(|(name, _)| {
            Ok(ParticipantResult {
                name: ParticipantName::new(name).map_err(|e| bad(e.to_string()))?,
                vote: VoteKind::Yes,
                acked: true,
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(Json(TransactionResponse {
        id: txid,
        gtid,
        outcome: Outcome::Committed,
        reason: None,
        participants,
    }))
}

async fn exchange(
    relay: Arc<Relay>,
    leaf: String,
    route: &'static str,
    json: serde_json::Result<Vec<u8>>,
) -> Result<(), String> {
    let endpoint = relay
        .leaves
        .get(&leaf)
        .ok_or_else(|| format!("no leaf named {leaf}"))?;
    let json = json.map_err(|e| e.to_string())?;
    let answer = endpoint
        .post_json(route, json, EXCHANGE_WAIT_MAX)
        .await
        .map_err(|e| e.to_string())?;
    if answer.status == 200 {
        Ok(())
    } else {
        Err(format!(
            "{} answered HTTP {}",
            endpoint.base_url(),
            answer.status
        ))
    }
}

fn check_all(results: Vec<Result<(), String>>) -> Result<(), (StatusCode, String)> {
    results
        .into_iter()
        .collect::<Result<Vec<()>, String>>()
        .map(|_| ())
        .map_err(|e| (StatusCode::BAD_GATEWAY, e))
}
