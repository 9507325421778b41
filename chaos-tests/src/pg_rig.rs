//! The PostgreSQL crash tests' rig: two `--backend postgres` participants and a coordinator as
//! real processes (started with [`cluster::pg_cluster`]), and the blocking SQL and HTTP helpers
//! those tests poll them with.

use std::time::Duration;

use crate::binary::failpoints_binary;
use cluster::auth::TokenSet;
use cluster::node::{Node, free_port};
use cluster::pg_cluster::{READY_TIMEOUT, coordinator, pg_participant, seed_accounts, transfer};
use cluster::postgres::{PgServer, psql_url};
use serde_json::json;

/// Sum of all balances at `url`.
pub fn total_balance(url: &str) -> i64 {
    psql_url(url, "SELECT coalesce(sum(balance), 0) FROM accounts")
        .unwrap_or_else(|e| panic!("cannot sum balances at {url}: {e}"))
        .parse()
        .unwrap_or_else(|e| panic!("sum of balances at {url}: {e}"))
}

/// The gids in `pg_prepared_xacts` of the database at `url`.
pub fn prepared_gids(url: &str) -> Vec<String> {
    psql_url(
        url,
        "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() ORDER BY gid",
    )
    .unwrap_or_else(|e| panic!("cannot list prepared transactions at {url}: {e}"))
    .lines()
    .map(str::to_string)
    .collect()
}

/// A blocking JSON POST with the token `tokens` hold for `url` (the peer token on protocol
/// routes, else the operator's): `(status, body)`; status 0 when the server could not be
/// reached.
pub fn post(
    tokens: Option<&TokenSet>,
    url: &str,
    body: &serde_json::Value,
) -> (u16, serde_json::Value) {
    block_on(async {
        let client = cluster::auth::http_client_as(cluster::auth::token_for_url(tokens, url))
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap_or_default();
        match client.post(url).json(body).send().await {
            Ok(response) => {
                let status = response.status().as_u16();
                let body = response.json().await.unwrap_or(serde_json::Value::Null);
                (status, body)
            }
            Err(_) => (0, serde_json::Value::Null),
        }
    })
}

/// A blocking JSON GET, with a token as [`post`]: `(status, body)`; status 0 when the server
/// could not be reached.
pub fn get(tokens: Option<&TokenSet>, url: &str) -> (u16, serde_json::Value) {
    block_on(async {
        let client = cluster::auth::http_client_as(cluster::auth::token_for_url(tokens, url))
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap_or_default();
        match client.get(url).send().await {
            Ok(response) => {
                let status = response.status().as_u16();
                let body = response.json().await.unwrap_or(serde_json::Value::Null);
                (status, body)
            }
            Err(_) => (0, serde_json::Value::Null),
        }
    })
}

fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("cannot build a runtime: {e}"))
        .block_on(future)
}

/// Polls `check` every 50 ms for up to `timeout`; true once it held.
pub fn eventually(timeout: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if check() {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Generous bound on anything settling after a crash (never a speed assertion).
pub const SETTLE: Duration = Duration::from_secs(60);

/// Two PostgreSQL participants and a coordinator as real processes (the crash tests' cluster).
#[derive(Debug)]
pub struct PgRig {
    pub _server: PgServer,
    pub dir: tempfile::TempDir,
    pub coordinator: Node,
    pub a: Node,
    pub b: Node,
    pub db_a: String,
    pub db_b: String,
}

/// `FAILPOINTS=<point>=return`.
pub fn failpoint(point: &str) -> Vec<(String, String)> {
    vec![("FAILPOINTS".to_string(), format!("{point}=return"))]
}

/// Two PostgreSQL participants `bank_a`, `bank_b` (10 accounts of 100 each) and a coordinator;
/// `armed` is (node name, crash point) for the first start.
pub fn rig(server: PgServer, armed: Option<(&str, &str)>) -> PgRig {
    let binary = failpoints_binary();
    let dir = tempfile::tempdir().unwrap();
    let db_a = server.create_database("bank_a");
    let db_b = server.create_database("bank_b");
    seed_accounts(&db_a, 10, 100);
    seed_accounts(&db_b, 10, 100);
    let env_of = |name: &str| match armed {
        Some((node, point)) if node == name => failpoint(point),
        _ => Vec::new(),
    };
    let coordinator_addr = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
    let coordinator_url = format!("http://{coordinator_addr}");
    let mut a = pg_participant(
        &binary,
        dir.path(),
        "bank_a",
        &db_a,
        Some(&coordinator_url),
        env_of("bank_a"),
    );
    let mut b = pg_participant(
        &binary,
        dir.path(),
        "bank_b",
        &db_b,
        Some(&coordinator_url),
        env_of("bank_b"),
    );
    a.wait_ready(READY_TIMEOUT).unwrap();
    b.wait_ready(READY_TIMEOUT).unwrap();
    let participants = [
        ("bank_a".to_string(), a.url()),
        ("bank_b".to_string(), b.url()),
    ];
    let mut coordinator = coordinator(
        &binary,
        dir.path(),
        coordinator_addr,
        &participants,
        env_of("coordinator"),
    );
    coordinator.wait_ready(READY_TIMEOUT).unwrap();
    PgRig {
        _server: server,
        dir,
        coordinator,
        a,
        b,
        db_a,
        db_b,
    }
}

impl PgRig {
    pub fn submit(&self, id: &str) -> (u16, serde_json::Value) {
        post(
            self.coordinator.tokens(),
            &format!("{}/v1/transactions", self.coordinator.url()),
            &transfer(id, "bank_a", "a0", "bank_b", "a0", 10),
        )
    }

    pub fn balances(&self) -> (i64, i64) {
        let one = |url: &str| -> i64 {
            psql_url(url, "SELECT balance FROM accounts WHERE id = 'a0'")
                .unwrap()
                .parse()
                .unwrap()
        };
        (one(&self.db_a), one(&self.db_b))
    }

    pub fn conserved(&self) {
        assert_eq!(
            total_balance(&self.db_a) + total_balance(&self.db_b),
            2_000,
            "money created or lost"
        );
    }

    pub fn settled(&self) -> bool {
        prepared_gids(&self.db_a).is_empty() && prepared_gids(&self.db_b).is_empty()
    }

    pub fn all_acked(&self, id: &str) -> bool {
        let (_, status) = get(
            self.coordinator.tokens(),
            &format!("{}/v1/transactions/{id}", self.coordinator.url()),
        );
        status["participants"]
            .as_array()
            .is_some_and(|ps| ps.iter().all(|p| p["acked"] == json!(true)))
    }

    pub fn logs(&self) -> String {
        let mut text = String::new();
        for name in ["coordinator", "bank_a", "bank_b"] {
            let log = std::fs::read_to_string(self.dir.path().join(format!("{name}.log")))
                .unwrap_or_default();
            text.push_str(&format!("--- {name}\n{log}\n"));
        }
        text
    }
}

/// A counter or gauge of `node`'s `/metrics` (0 when absent).
pub fn metric(node: &Node, name: &str) -> f64 {
    let (_, text) = cluster::node::http_get(node.spec().addr, "/metrics").unwrap_or_default();
    text.lines()
        .find_map(|line| line.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}
