//! Real processes around PostgreSQL participants: `twopc participant --backend postgres` nodes
//! over databases of a [`crate::postgres::PgServer`], a coordinator, and blocking HTTP helpers.
//! The transfer workload's schema and statements live here too, so the tests, the demo and the
//! bench agree on them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::auth::TokenSet;
use crate::binary::failpoints_binary;
use crate::node::{Node, NodeSpec, free_port};
use crate::postgres::{PgServer, psql_url};
use serde_json::json;

/// The accounts table every transfer test and bench uses.
pub const ACCOUNTS_SQL: &str = "CREATE TABLE accounts (id text PRIMARY KEY, \
    balance bigint NOT NULL CHECK (balance >= 0)); \
    CREATE TABLE transfers (id text PRIMARY KEY)";

/// The statements file of the transfer workload.
pub const TRANSFER_STATEMENTS: &str = r#"{
  "debit": {"sql": "UPDATE accounts SET balance = balance - $2 WHERE id = $1 AND balance >= $2", "expect_rows": 1},
  "credit": {"sql": "UPDATE accounts SET balance = balance + $2 WHERE id = $1", "expect_rows": 1},
  "set_balance": {"sql": "UPDATE accounts SET balance = $2 WHERE id = $1", "expect_rows": 1},
  "record": {"sql": "INSERT INTO transfers (id) VALUES ($1)", "expect_rows": 1}
}"#;

/// How long a started process may take to become ready.
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Creates the accounts table in the database at `url` with `accounts` rows of `balance`.
pub fn seed_accounts(url: &str, accounts: u32, balance: i64) {
    psql_url(
        url,
        &format!(
            "{ACCOUNTS_SQL}; INSERT INTO accounts SELECT 'a' || g, {balance} \
             FROM generate_series(0, {}) g",
            accounts.saturating_sub(1)
        ),
    )
    .unwrap_or_else(|e| panic!("cannot seed accounts at {url}: {e}"));
}

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

/// Writes the transfer statements file into `dir`; returns its path.
pub fn statements_file(dir: &Path) -> PathBuf {
    let path = dir.join("statements.json");
    std::fs::write(&path, TRANSFER_STATEMENTS)
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
    path
}

/// A `twopc participant --backend postgres` node (not yet waited for).
pub fn pg_participant(
    binary: &Path,
    dir: &Path,
    name: &str,
    url: &str,
    coordinator: Option<&str>,
    env: Vec<(String, String)>,
) -> Node {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
    let mut args = vec![
        "participant".to_string(),
        "--backend".into(),
        "postgres".into(),
        "--name".into(),
        name.into(),
        "--listen".into(),
        addr.to_string(),
        "--postgres-url".into(),
        url.into(),
        "--statements".into(),
        statements_file(dir).display().to_string(),
        "--in-doubt-after-ms".into(),
        "500".into(),
        "--decision-backoff-max-ms".into(),
        "500".into(),
    ];
    if let Some(coordinator) = coordinator {
        args.extend(["--coordinator".to_string(), coordinator.to_string()]);
    }
    Node::start(NodeSpec {
        name: name.into(),
        binary: binary.to_path_buf(),
        args,
        env,
        addr,
        log_path: dir.join(format!("{name}.log")),
        tokens: crate::auth::for_test(dir),
    })
}

/// A coordinator node with `participants` (name, url), fast retries (not yet waited for).
pub fn coordinator(
    binary: &Path,
    dir: &Path,
    addr: std::net::SocketAddr,
    participants: &[(String, String)],
    env: Vec<(String, String)>,
) -> Node {
    let mut args = vec![
        "coordinator".to_string(),
        "--listen".into(),
        addr.to_string(),
        "--data-dir".into(),
        dir.join("coordinator").display().to_string(),
        "--retry-base-ms".into(),
        "50".into(),
        "--retry-max-ms".into(),
        "500".into(),
    ];
    for (name, url) in participants {
        args.extend(["--participant".to_string(), format!("{name}={url}")]);
    }
    Node::start(NodeSpec {
        name: "coordinator".into(),
        binary: binary.to_path_buf(),
        args,
        env,
        addr,
        log_path: dir.join("coordinator.log"),
        tokens: crate::auth::for_test(dir),
    })
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
        let client = crate::auth::http_client_as(crate::auth::token_for_url(tokens, url))
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
        let client = crate::auth::http_client_as(crate::auth::token_for_url(tokens, url))
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

/// A transfer of `amount` from `from` at participant `debit_at` to `to` at `credit_at`.
pub fn transfer(
    id: &str,
    debit_at: &str,
    from: &str,
    credit_at: &str,
    to: &str,
    amount: i64,
) -> serde_json::Value {
    serde_json::json!({
        "id": id,
        "participants": [
            {"name": debit_at, "payload": {"ops": [{"statement": "debit", "params": [from, amount]}]}},
            {"name": credit_at, "payload": {"ops": [{"statement": "credit", "params": [to, amount]}]}}
        ],
        "timeout_ms": 5000
    })
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
    let (_, text) = crate::node::http_get(node.spec().addr, "/metrics").unwrap_or_default();
    text.lines()
        .find_map(|line| line.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}
