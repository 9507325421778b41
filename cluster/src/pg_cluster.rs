//! Real processes around PostgreSQL participants: `twopc participant --backend postgres` nodes
//! over databases of a [`crate::postgres::PgServer`] and a coordinator. The transfer workload's
//! schema and statements live here too, so the tests, the demo and the bench agree on them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::node::{Node, NodeSpec, free_port};
use crate::postgres::psql_url;

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

/// Writes the transfer statements file into `dir`; returns its path.
pub fn statements_file(dir: &Path) -> PathBuf {
    let path = dir.join("statements.json");
    std::fs::write(&path, TRANSFER_STATEMENTS)
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
    path
}

/// A `twopc participant --backend postgres` node serving the transfer statements (not yet
/// waited for).
pub fn pg_participant(
    binary: &Path,
    dir: &Path,
    name: &str,
    url: &str,
    coordinator: Option<&str>,
    env: Vec<(String, String)>,
) -> Node {
    let statements = statements_file(dir);
    pg_participant_with(binary, dir, name, url, &statements, coordinator, env)
}

/// [`pg_participant`] serving the statements file at `statements`.
pub fn pg_participant_with(
    binary: &Path,
    dir: &Path,
    name: &str,
    url: &str,
    statements: &Path,
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
        statements.display().to_string(),
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
