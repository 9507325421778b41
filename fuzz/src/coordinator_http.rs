//! `coordinator_http`: arbitrary requests through the coordinator's real router, in process.
//!
//! One coordinator per process (recovered on a memory file system, authentication on, every
//! kind of token configured), with two real key-value participants served on loopback so
//! that transactions and sagas run to their end. Each input is a few requests
//! ([`crate::http`]); every answer is checked by [`crate::http::send_and_check`].

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use axum::Router;
use coordinator::api::{AppState, router};
use coordinator::config::Config;
use coordinator::metrics::Metrics;
use participant::kv::{KvStore, routes};
use participant::{Participant, ParticipantConfig, SyncPolicy};
use protocol::ParticipantName;
use protocol::auth::{KeyRing, Keys, parse_named, parse_plain};
use tokio::runtime::Runtime;

use crate::http::{FuzzRequest, send_and_check, tokens};

/// Everything the target keeps for the life of the process.
struct Harness {
    runtime: Runtime,
    app: Router,
    /// The coordinator's real id: inputs name it as [`COORDINATOR_PLACEHOLDER`], so that
    /// decision queries and resolves reach the logic that looks at the attempt, not only the
    /// "another coordinator's attempt" refusal.
    coordinator_id: String,
    _participants: Vec<Participant<KvStore>>,
    _dir: tempfile::TempDir,
}

/// A scratch directory for this process's servers: under `TWOPC_FUZZ_SCRATCH` (run.sh sets it
/// and removes it after the run: statics are never dropped, so the process cannot), else on a
/// memory file system where there is one.
pub fn scratch_dir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    let made = if let Some(dir) = std::env::var_os("TWOPC_FUZZ_SCRATCH") {
        tempfile::Builder::new()
            .prefix("twopc-fuzz-")
            .tempdir_in(dir)
    } else if shm.is_dir() {
        tempfile::Builder::new()
            .prefix("twopc-fuzz-")
            .tempdir_in(shm)
    } else {
        tempfile::tempdir()
    };
    made.unwrap_or_else(|e| panic!("harness setup: a temporary directory: {e}"))
}

/// The tokens of [`tokens`] as a server's key ring.
pub fn keys() -> KeyRing {
    let setup = |e: protocol::auth::TokenFileError| -> Keys { panic!("harness setup: {e}") };
    let named = |file: &str, line: String| parse_named(file, &line);
    let plain = |file: &str, line: &str| parse_plain(file, line);
    let keys = (|| {
        Ok(Keys {
            client: Some(named("client", format!("fuzz-client {}", tokens::CLIENT))?),
            operator: Some(named("operator", format!("ops {}", tokens::OPERATOR))?),
            peer: Some(plain("peer", tokens::PEER)?),
            metrics: Some(plain("metrics", tokens::METRICS)?),
        })
    })()
    .unwrap_or_else(setup);
    KeyRing::new(keys)
}

/// A key-value participant on loopback that takes the peer token; returns it and its URL.
pub async fn serve_participant(dir: &Path, name: &str) -> (Participant<KvStore>, String) {
    let mut config = ParticipantConfig::new(dir.join(name));
    config.keys = keys();
    config.wal.sync = SyncPolicy::Never;
    // A conflicting prepare waits this long, then votes no: inputs must not wait for long.
    config.engine.lock_wait_max_ms = 20;
    let participant = Participant::open(config, KvStore::new)
        .unwrap_or_else(|e| panic!("harness setup: participant {name}: {e}"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("harness setup: bind: {e}"));
    let url = format!(
        "http://{}",
        listener
            .local_addr()
            .unwrap_or_else(|e| panic!("harness setup: address: {e}"))
    );
    let app = routes::app(&participant);
    tokio::spawn(async move { axum::serve(listener, app).await });
    (participant, url)
}

fn harness() -> &'static Harness {
    static HARNESS: OnceLock<Harness> = OnceLock::new();
    HARNESS.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("harness setup: a runtime: {e}"));
        let dir = scratch_dir();
        let (app, participants, coordinator_id) = runtime.block_on(async {
            let mut urls = BTreeMap::new();
            let mut participants = Vec::new();
            for name in ["inventory", "payments"] {
                let (participant, url) = serve_participant(dir.path(), name).await;
                let name = ParticipantName::new(name)
                    .unwrap_or_else(|e| panic!("harness setup: a name: {e}"));
                urls.insert(name, url);
                participants.push(participant);
            }
            let mut config = Config::for_tests(dir.path().join("coordinator"), urls);
            config.fsync = false;
            config.retained_max = 256;
            // Retries (and so a saga's compensation) come quickly: an input runs in seconds.
            config.retry_base_ms = 10;
            config.retry_max_ms = 100;
            config.keys = keys();
            let metrics = Arc::new(Metrics::default());
            let state = AppState::new(Arc::clone(&metrics)).with_keys(config.keys.clone());
            let core = coordinator::runtime::recover(&config, metrics)
                .await
                .unwrap_or_else(|e| panic!("harness setup: the coordinator: {e}"));
            state.set_ready(Arc::clone(&core));
            let coordinator_id = core.identity().coordinator_id.to_string();
            tokio::spawn(coordinator::runtime::housekeeping(core));
            (router(state), participants, coordinator_id)
        });
        Harness {
            runtime,
            app,
            coordinator_id,
            _participants: participants,
            _dir: dir,
        }
    })
}

/// Longest wait a transaction or saga body may ask for here: `POST` waits for the outcome, up
/// to the body's `timeout_ms` (up to 5 minutes), and an input must run in seconds. A longer
/// one is cut to this (a missing one is set to it); the bound itself is the unit tests' job.
const TIMEOUT_MS_CAP: u64 = 2_000;

/// Cuts the wait a `POST` of a transaction or saga asks for to [`TIMEOUT_MS_CAP`].
fn cap_wait(request: &mut FuzzRequest) {
    let waits = request.method == "POST"
        && (request.path.starts_with(b"/v1/transactions")
            || request.path.starts_with(b"/v1/sagas"));
    if !waits {
        return;
    }
    let Ok(serde_json::Value::Object(mut body)) =
        serde_json::from_slice::<serde_json::Value>(&request.body)
    else {
        return;
    };
    let timeout = body.get("timeout_ms").and_then(serde_json::Value::as_u64);
    if timeout.is_none_or(|ms| ms > TIMEOUT_MS_CAP)
        && body.get("timeout_ms").is_none_or(|v| v.is_u64())
    {
        body.insert("timeout_ms".to_string(), TIMEOUT_MS_CAP.into());
        request.body = serde_json::Value::Object(body).to_string().into_bytes();
    }
}

/// A saga whose compensation keeps failing is retried for ever (docs/sagas.md), and `POST
/// /v1/sagas` waits for a terminal state by default: such an input would never be answered
/// (found by this target; reported, see docs/fuzzing.md). Sagas are created with `wait=none`.
fn saga_wait_none(request: &mut FuzzRequest) {
    let path = &request.path;
    let collection = path == b"/v1/sagas" || path.starts_with(b"/v1/sagas?");
    if request.method != "POST" || !collection {
        return;
    }
    let text = String::from_utf8_lossy(path).replace("wait=terminal", "wait=none");
    let text = if text.contains("wait=") {
        text
    } else if text.contains('?') {
        format!("{text}&wait=none")
    } else {
        format!("{text}?wait=none")
    };
    request.path = text.into_bytes();
}

/// What inputs write for the harness coordinator's id (its real one is random per data
/// directory): seeds name it so, and [`name_the_coordinator`] puts the real one in.
pub const COORDINATOR_PLACEHOLDER: &str = "c-fuzz";

/// Replaces [`COORDINATOR_PLACEHOLDER`] in the path and the body with the real id.
fn name_the_coordinator(request: &mut FuzzRequest, id: &str) {
    let replace = |bytes: &[u8]| -> Option<Vec<u8>> {
        let text = std::str::from_utf8(bytes).ok()?;
        text.contains(COORDINATOR_PLACEHOLDER)
            .then(|| text.replace(COORDINATOR_PLACEHOLDER, id).into_bytes())
    };
    if let Some(path) = replace(&request.path) {
        request.path = path;
    }
    if let Some(body) = replace(&request.body) {
        request.body = body;
    }
}

pub fn run(input: &[u8]) {
    let harness = harness();
    for mut request in FuzzRequest::read_all(input) {
        name_the_coordinator(&mut request, &harness.coordinator_id);
        cap_wait(&mut request);
        saga_wait_none(&mut request);
        if let Some(request) = request.build() {
            harness
                .runtime
                .block_on(send_and_check(&harness.app, request));
        }
    }
}

/// Sends one request and returns its status (seed generation checks its seeds are valid).
pub fn status_of(request: &FuzzRequest) -> Option<u16> {
    let harness = harness();
    let mut request = request.clone();
    name_the_coordinator(&mut request, &harness.coordinator_id);
    let built = request.build()?;
    Some(
        harness
            .runtime
            .block_on(send_and_check(&harness.app, built)),
    )
}

/// The data directory of the harness's servers (seed generation reads their logs).
pub fn data_dir() -> &'static std::path::Path {
    harness()._dir.path()
}
