//! The PostgreSQL outbox and fence tests' participant: one `--backend postgres` participant
//! over a fresh database of its own, as a real process (the failpoints build, tokens on), or
//! as a library; and the blocking HTTP and SQL helpers those tests read it with.

use std::path::Path;
use std::time::Duration;

use crate::binary::failpoints_binary;
use cluster::node::{Node, NodeSpec, free_port};
use cluster::pg_cluster::READY_TIMEOUT;
use cluster::postgres::{PgServer, psql_url};
use participant::postgres::{PgConfig, PgParticipant, Statements};
use protocol::auth::Token;
use serde_json::Value;

/// A participant over a fresh database, as a real process.
#[derive(Debug)]
pub struct PgNode {
    pub node: Node,
    pub db: String,
    pub dir: tempfile::TempDir,
    _server: PgServer,
}

/// Who calls: the kinds of token the routes take.
#[derive(Debug, Clone, Copy)]
pub enum As {
    Client,
    Relay,
    Operator,
}

/// The runs of `sql` at `url`, as text (panics naming the statement on an error).
pub fn query(url: &str, sql: &str) -> String {
    psql_url(url, sql).unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// A participant named `name` over a fresh database seeded with `seed_sql`, serving the
/// statements file `statements`, with `env` and `extra` flags (`--fence-key-file`, say;
/// `extra` may name files in the directory `files` writes first).
pub fn start_pg_node(
    name: &str,
    statements: &str,
    seed_sql: &str,
    env: Vec<(String, String)>,
    files: impl FnOnce(&Path) -> Vec<String>,
) -> PgNode {
    let server = PgServer::get();
    let db = server.create_database(name);
    query(&db, seed_sql);
    let dir = tempfile::tempdir().unwrap();
    let statements_path = dir.path().join("statements.json");
    std::fs::write(&statements_path, statements).unwrap();
    let extra = files(dir.path());
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
    let mut args: Vec<String> = [
        "participant",
        "--backend",
        "postgres",
        "--name",
        name,
        "--listen",
        &addr.to_string(),
        "--postgres-url",
        &db,
        "--statements",
        &statements_path.display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra);
    let mut node = Node::start(NodeSpec {
        name: name.into(),
        binary: failpoints_binary(),
        args,
        env,
        addr,
        log_path: dir.path().join(format!("{name}.log")),
        tokens: cluster::auth::for_test(dir.path()),
    });
    node.wait_ready(READY_TIMEOUT).unwrap();
    PgNode {
        node,
        db,
        dir,
        _server: server,
    }
}

impl PgNode {
    fn token(&self, who: As) -> Option<&Token> {
        self.node.tokens().map(|t| match who {
            As::Client => &t.client,
            As::Relay => &t.peer,
            As::Operator => &t.operator,
        })
    }

    /// A blocking call (`method` "get" or a POST of `body`): `(status, body)`, status 0 when
    /// the participant did not answer.
    pub fn call(&self, who: As, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let url = format!("{}{path}", self.node.url());
        let token = self.token(who);
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async move {
                let client = cluster::auth::http_client_as(token)
                    .timeout(Duration::from_secs(30))
                    .build()
                    .unwrap();
                let request = match method {
                    "get" => client.get(&url),
                    _ => client.post(&url).json(&body.unwrap_or(Value::Null)),
                };
                match request.send().await {
                    Ok(response) => {
                        let status = response.status().as_u16();
                        (status, response.json().await.unwrap_or(Value::Null))
                    }
                    Err(_) => (0, Value::Null),
                }
            })
    }

    /// `POST /v1/pg/write` as a client.
    pub fn write(&self, body: Value) -> (u16, Value) {
        self.call(As::Client, "post", "/v1/pg/write", Some(body))
    }

    /// A relay's report on an intent.
    pub fn report(&self, event_id: &str, what: &str, body: Value) -> (u16, Value) {
        self.call(
            As::Relay,
            "post",
            &format!("/v1/outbox/{event_id}/{what}"),
            Some(body),
        )
    }

    /// An operator's action on an intent.
    pub fn operator(&self, event_id: &str, what: &str, body: Value) -> (u16, Value) {
        self.call(
            As::Operator,
            "post",
            &format!("/v1/outbox/{event_id}/{what}"),
            Some(body),
        )
    }

    /// `GET /v1/outbox{query}` as an operator, which must answer 200.
    pub fn list(&self, query: &str) -> Value {
        let (status, list) = self.call(As::Operator, "get", &format!("/v1/outbox{query}"), None);
        assert_eq!(status, 200, "{list}");
        list
    }
}

/// The backend as a library over a fresh database seeded with `seed_sql`, serving
/// `statements`, with `configure` applied to its configuration.
pub async fn pg_library(
    name: &str,
    statements: &str,
    seed_sql: &str,
    configure: impl FnOnce(&mut PgConfig),
) -> (PgParticipant<Statements>, String, PgServer) {
    let server = PgServer::get();
    let db = server.create_database(name);
    query(&db, seed_sql);
    let mut config = PgConfig::new(&db, name);
    configure(&mut config);
    let specs = Statements::parse_file(statements.as_bytes()).unwrap();
    let (client, connection) = tokio_postgres::connect(&db, tokio_postgres::NoTls)
        .await
        .unwrap();
    let connection = tokio::spawn(connection);
    let statements = Statements::check(&client, specs).await.unwrap();
    drop(client);
    connection.abort();
    (
        PgParticipant::start(config, statements).await.unwrap(),
        db,
        server,
    )
}

/// The seed's checkout transition, guarded: the outbox row is written only when one row came
/// back. `touch` moves a checkout without a state check (for the ordering tests).
pub const CHECKOUT_STATEMENTS: &str = r#"{
  "authorize": {"sql": "UPDATE checkouts SET state = $2, version = version + 1 WHERE id = $1 AND state = 'stock_reserved' AND version = $3 RETURNING version", "guards_intent": {"rows": 1}},
  "touch": {"sql": "UPDATE checkouts SET version = version + 1 WHERE id = $1 RETURNING version", "guards_intent": {"rows": 1}}
}"#;

/// Two checkouts waiting for payment: `c-1` at version 3, `c-2` at version 1.
pub const CHECKOUTS_SQL: &str = "CREATE TABLE checkouts (id text PRIMARY KEY, \
    state text NOT NULL, version bigint NOT NULL); \
    INSERT INTO checkouts VALUES ('c-1', 'stock_reserved', 3), ('c-2', 'stock_reserved', 1)";

/// `state:version` of a checkout.
pub fn checkout(url: &str, id: &str) -> String {
    query(
        url,
        &format!("SELECT state || ':' || version FROM checkouts WHERE id = '{id}'"),
    )
}

/// `event_id#seq` of every outbox row, in write order.
pub fn outbox_rows(url: &str) -> String {
    query(
        url,
        "SELECT coalesce(string_agg(event_id || '#' || seq, ',' ORDER BY position), '') \
         FROM twopc.pg_outbox",
    )
}

/// An intent to the `payments` target.
pub fn intent(event_id: &str, aggregate: &str) -> Value {
    serde_json::json!({"event_id": event_id, "aggregate": aggregate, "target": "payments",
           "type": "payment.authorize.v1", "body": {"amount": 5, "event": event_id}})
}

/// The seed's transition of `checkout` from `version`, with its intents.
pub fn authorize(op_id: &str, checkout: &str, version: i64, next: Vec<Value>) -> Value {
    serde_json::json!({"op_id": op_id, "statement": "authorize",
           "params": [checkout, "payment_pending", version], "next": next})
}

/// `event_id#seq` of a listing's intents.
pub fn ids(list: &Value) -> Vec<String> {
    list["intents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| format!("{}#{}", e["event_id"].as_str().unwrap(), e["seq"]))
        .collect()
}
