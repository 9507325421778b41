//! `participant_messages`: arbitrary requests through the reference participant's real
//! router (the protocol, saga, fenced-write and read routes), in process.
//!
//! One key-value participant per process (log on a memory file system, authentication on);
//! each input is a few requests ([`crate::http`]), every answer checked by
//! [`crate::http::send_and_check`].

use std::sync::OnceLock;

use axum::Router;
use participant::kv::{KvStore, routes};
use participant::{Participant, ParticipantConfig, SyncPolicy};
use tokio::runtime::Runtime;

use crate::coordinator_http::{keys, scratch_dir};
use crate::http::{FuzzRequest, send_and_check};

struct Harness {
    runtime: Runtime,
    app: Router,
    _participant: Participant<KvStore>,
    _dir: tempfile::TempDir,
}

fn harness() -> &'static Harness {
    static HARNESS: OnceLock<Harness> = OnceLock::new();
    HARNESS.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("harness setup: a runtime: {e}"));
        let dir = scratch_dir();
        let mut config = ParticipantConfig::new(dir.path().join("participant"));
        config.keys = keys();
        config.wal.sync = SyncPolicy::Never;
        config.engine.lock_wait_max_ms = 20;
        let participant = runtime
            .block_on(async { Participant::open(config, KvStore::new) })
            .unwrap_or_else(|e| panic!("harness setup: the participant: {e}"));
        Harness {
            runtime,
            app: routes::app(&participant),
            _participant: participant,
            _dir: dir,
        }
    })
}

pub fn run(input: &[u8]) {
    let harness = harness();
    for request in FuzzRequest::read_all(input) {
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
