//! The ready-made participant's work: named, parameterised statements from a file, run in the
//! order a payload names them. Clients never send SQL.
//!
//! File: `{"debit": {"sql": "UPDATE accounts SET balance = balance - $2 WHERE id = $1 AND
//! balance >= $2", "expect_rows": 1}}`. A statement may instead (or as well, with the same
//! count) declare `"guards_intent": {"rows": 1}`: run by the local write route (`super::write`),
//! another row count rolls the write back and records no intent (409 `condition_failed`); in a
//! 2PC payload it checks the count as `expect_rows` does. Payload: `{"ops": [{"statement": "debit", "params":
//! ["u1", 10]}]}`. Every statement is prepared against the database at start, which checks its
//! SQL (a missing table is found then) and learns its parameter types; a payload whose
//! parameters do not fit them is 422 `invalid_payload`. A row count other than `expect_rows`
//! or any database error while running votes no with the database's message.
//!
//! A payload's statements are sent together (one message each, with the types learnt at start,
//! so nothing is prepared per transaction), in the round trip that carries the library's
//! `BEGIN`; their row counts are checked, in order, once all have answered.

use std::collections::BTreeMap;

use protocol::kv::OPS_MAX;
use serde::Deserialize;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Statement as PreparedStatement};

use super::error::{PgError, describe};
use super::pipeline;
use super::work::{PgWork, Ran, RunError, WorkRefusal};

/// One statement as the file gives it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatementSpec {
    pub sql: String,
    /// Rows the statement must affect (or return); another count votes no.
    #[serde(default)]
    pub expect_rows: Option<u64>,
    /// The row count that lets a local write record its intents (`super::write`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guards_intent: Option<RowGuard>,
}

/// `"guards_intent": {"rows": N}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct RowGuard {
    pub rows: u64,
}

impl StatementSpec {
    /// The row count this statement must have, from either declaration.
    pub fn expected_rows(&self) -> Option<u64> {
        self.guards_intent.map(|g| g.rows).or(self.expect_rows)
    }
}

/// A statement checked against the database.
#[derive(Debug, Clone)]
struct Statement {
    spec: StatementSpec,
    params: Vec<Type>,
    /// The statement returns rows (`RETURNING`, `SELECT`): run as a query, its rows counted.
    returns_rows: bool,
}

/// The statements a transaction may run.
#[derive(Debug, Clone)]
pub struct Statements {
    statements: BTreeMap<String, Statement>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Payload {
    ops: Vec<Op>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Op {
    statement: String,
    #[serde(default)]
    params: Vec<serde_json::Value>,
}

/// Parameter types a payload can fill from JSON.
fn supported(ty: &Type) -> bool {
    [
        Type::BOOL,
        Type::INT2,
        Type::INT4,
        Type::INT8,
        Type::FLOAT4,
        Type::FLOAT8,
        Type::TEXT,
        Type::VARCHAR,
        Type::BPCHAR,
        Type::NAME,
    ]
    .contains(ty)
}

impl Statements {
    /// Parses the file's JSON text (no database involved).
    pub fn parse_file(text: &[u8]) -> Result<BTreeMap<String, StatementSpec>, String> {
        let specs: BTreeMap<String, StatementSpec> = serde_json::from_slice(text)
            .map_err(|e| format!("not a statements file ({{\"name\": {{\"sql\": ...}}}}): {e}"))?;
        if specs.is_empty() {
            return Err("the statements file names no statement".into());
        }
        for (name, spec) in &specs {
            if let (Some(expect), Some(guard)) = (spec.expect_rows, spec.guards_intent)
                && expect != guard.rows
            {
                return Err(format!(
                    "statement {name:?} expects {expect} rows but its guards_intent says {}; \
                     give one count",
                    guard.rows
                ));
            }
        }
        Ok(specs)
    }

    /// Prepares every statement on `client`: its SQL must be valid against this database and
    /// its parameters of a type a JSON value can fill.
    pub async fn check(
        client: &Client,
        specs: BTreeMap<String, StatementSpec>,
    ) -> Result<Self, PgError> {
        let mut statements = BTreeMap::new();
        for (name, spec) in specs {
            let prepared = client.prepare(&spec.sql).await.map_err(|e| PgError::Db {
                context: format!("statement {name:?} ({})", spec.sql),
                message: describe(&e),
            })?;
            let params = prepared.params().to_vec();
            let returns_rows = !prepared.columns().is_empty();
            if let Some((n, ty)) = params.iter().enumerate().find(|(_, ty)| !supported(ty)) {
                return Err(PgError::Db {
                    context: format!("statement {name:?}"),
                    message: format!(
                        "parameter ${} has type {ty}, which a JSON parameter cannot fill; cast it \
                         in the SQL (e.g. ${}::text::{ty})",
                        n + 1,
                        n + 1
                    ),
                });
            }
            statements.insert(
                name,
                Statement {
                    spec,
                    params,
                    returns_rows,
                },
            );
        }
        Ok(Self { statements })
    }

    /// The statement names, for logs.
    pub fn names(&self) -> Vec<&str> {
        self.statements.keys().map(String::as_str).collect()
    }

    /// Checks a payload against the statements without running anything.
    fn bind(&self, payload: &serde_json::Value) -> Result<Vec<Bound<'_>>, String> {
        let payload = Payload::deserialize(payload).map_err(|e| {
            format!("expected {{\"ops\": [{{\"statement\": name, \"params\": [...]}}]}}: {e}")
        })?;
        if payload.ops.is_empty() {
            return Err("ops is empty".into());
        }
        if payload.ops.len() > OPS_MAX {
            return Err(format!("{} ops; the limit is {OPS_MAX}", payload.ops.len()));
        }
        payload
            .ops
            .into_iter()
            .map(|op| self.bind_one(&op.statement, &op.params))
            .collect()
    }
}

impl Statements {
    /// One statement with its parameters, checked and converted.
    fn bind_one(&self, statement: &str, params: &[serde_json::Value]) -> Result<Bound<'_>, String> {
        let (name, statement) = self.statements.get_key_value(statement).ok_or_else(|| {
            format!(
                "unknown statement {statement:?}; this participant runs {}",
                self.names().join(", ")
            )
        })?;
        if params.len() != statement.params.len() {
            return Err(format!(
                "statement {name:?} takes {} parameters, got {}",
                statement.params.len(),
                params.len()
            ));
        }
        let params = params
            .iter()
            .zip(&statement.params)
            .enumerate()
            .map(|(n, (value, ty))| {
                to_sql(value, ty).ok_or_else(|| {
                    format!(
                        "statement {name:?} parameter ${} must be a {ty}, got {value}",
                        n + 1
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Bound {
            name,
            statement,
            params,
        })
    }
}

/// A statement with its parameters converted.
struct Bound<'a> {
    name: &'a str,
    statement: &'a Statement,
    params: Vec<Box<dyn ToSql + Sync + Send>>,
}

/// SQL NULL for a parameter of type `ty` (every supported type): `None` of a Rust type that
/// binds to it, since a `None::<String>` is refused for a number or a boolean.
fn null_of(ty: &Type) -> Option<Box<dyn ToSql + Sync + Send>> {
    Some(match *ty {
        Type::BOOL => Box::new(None::<bool>) as Box<dyn ToSql + Sync + Send>,
        Type::INT2 => Box::new(None::<i16>),
        Type::INT4 => Box::new(None::<i32>),
        Type::INT8 => Box::new(None::<i64>),
        Type::FLOAT4 => Box::new(None::<f32>),
        Type::FLOAT8 => Box::new(None::<f64>),
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME => Box::new(None::<String>),
        _ => return None,
    })
}

fn to_sql(value: &serde_json::Value, ty: &Type) -> Option<Box<dyn ToSql + Sync + Send>> {
    use serde_json::Value;
    Some(match (ty, value) {
        (_, Value::Null) => return null_of(ty),
        (&Type::BOOL, Value::Bool(b)) => Box::new(*b),
        (&Type::INT2, Value::Number(n)) => Box::new(i16::try_from(n.as_i64()?).ok()?),
        (&Type::INT4, Value::Number(n)) => Box::new(i32::try_from(n.as_i64()?).ok()?),
        (&Type::INT8, Value::Number(n)) => Box::new(n.as_i64()?),
        (&Type::FLOAT4, Value::Number(n)) => Box::new(n.as_f64()? as f32),
        (&Type::FLOAT8, Value::Number(n)) => Box::new(n.as_f64()?),
        (_, Value::String(s))
            if [Type::TEXT, Type::VARCHAR, Type::BPCHAR, Type::NAME].contains(ty) =>
        {
            Box::new(s.clone())
        }
        _ => return None,
    })
}

impl PgWork for Statements {
    async fn run_statement(
        &self,
        client: &Client,
        statement: &str,
        params: &[serde_json::Value],
    ) -> Result<Ran, RunError> {
        let bound = self
            .bind_one(statement, params)
            .map_err(RunError::Invalid)?;
        let typed: Vec<(&(dyn ToSql + Sync), Type)> = bound
            .params
            .iter()
            .zip(&bound.statement.params)
            .map(|(p, ty)| (p.as_ref() as &(dyn ToSql + Sync), ty.clone()))
            .collect();
        let sql = bound.statement.spec.sql.as_str();
        let (rows, returned) = if bound.statement.returns_rows {
            let rows = client
                .query_typed(sql, &typed)
                .await
                .map_err(RunError::Db)?;
            (
                rows.len() as u64,
                rows.iter().map(super::returned::row_json).collect(),
            )
        } else {
            let count = client
                .execute_typed(sql, &typed)
                .await
                .map_err(RunError::Db)?;
            (count, Vec::new())
        };
        Ok(Ran {
            rows,
            returned,
            expected: bound.statement.spec.expected_rows(),
        })
    }

    async fn work(&self, client: &Client, payload: &serde_json::Value) -> Result<(), WorkRefusal> {
        self.run_ops(client, &[], payload).await
    }

    /// Every statement of the file, in name order: the library keeps them prepared per session.
    fn prepared_sql(&self) -> Vec<(String, Vec<Type>)> {
        self.statements
            .values()
            .map(|statement| (statement.spec.sql.clone(), statement.params.clone()))
            .collect()
    }

    async fn work_prepared(
        &self,
        client: &Client,
        prepared: &[PreparedStatement],
        payload: &serde_json::Value,
    ) -> Result<(), WorkRefusal> {
        self.run_ops(client, prepared, payload).await
    }
}

impl Statements {
    /// The payload's ops, sent together; each on its statement prepared on this session when
    /// `prepared` holds them (one per statement, in name order), else as SQL text.
    async fn run_ops(
        &self,
        client: &Client,
        prepared: &[PreparedStatement],
        payload: &serde_json::Value,
    ) -> Result<(), WorkRefusal> {
        let bound = self.bind(payload).map_err(WorkRefusal::Invalid)?;
        let on_session = |name: &str| {
            let position = self.statements.keys().position(|known| known == name)?;
            (prepared.len() == self.statements.len()).then(|| &prepared[position])
        };
        let sent = bound
            .iter()
            .map(|op| async move {
                match on_session(op.name) {
                    Some(statement) => {
                        let params: Vec<&(dyn ToSql + Sync)> = op
                            .params
                            .iter()
                            .map(|p| p.as_ref() as &(dyn ToSql + Sync))
                            .collect();
                        client.execute(statement, &params).await
                    }
                    None => {
                        let params: Vec<(&(dyn ToSql + Sync), Type)> = op
                            .params
                            .iter()
                            .zip(&op.statement.params)
                            .map(|(p, ty)| (p.as_ref() as &(dyn ToSql + Sync), ty.clone()))
                            .collect();
                        client
                            .execute_typed(op.statement.spec.sql.as_str(), &params)
                            .await
                    }
                }
            })
            .collect();
        // After a failed statement the rest fail too (the transaction is aborted): the first
        // failure in order is the reason.
        for (op, answer) in bound.iter().zip(pipeline::all(sent).await) {
            let rows = answer.map_err(|e| {
                WorkRefusal::No(format!("statement {:?}: {}", op.name, describe(&e)))
            })?;
            if let Some(expected) = op.statement.spec.expected_rows()
                && rows != expected
            {
                return Err(WorkRefusal::No(format!(
                    "statement {:?} affected {rows} rows, expected {expected}",
                    op.name
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn statements() -> Statements {
        let mut statements = BTreeMap::new();
        statements.insert(
            "debit".to_string(),
            Statement {
                spec: StatementSpec {
                    sql: "UPDATE accounts SET balance = balance - $2 WHERE id = $1".into(),
                    expect_rows: Some(1),
                    guards_intent: None,
                },
                params: vec![Type::TEXT, Type::INT8],
                returns_rows: false,
            },
        );
        Statements { statements }
    }

    #[test]
    fn a_payload_binds_to_typed_parameters() {
        let s = statements();
        let bound = s
            .bind(&json!({"ops": [{"statement": "debit", "params": ["u1", 10]}]}))
            .unwrap();
        assert_eq!(bound.len(), 1);
        assert_eq!(bound[0].name, "debit");
        assert_eq!(bound[0].params.len(), 2);
    }

    #[test]
    fn bad_payloads_name_the_problem() {
        let s = statements();
        let cases = [
            (
                json!({"ops": [{"statement": "drop", "params": []}]}),
                "unknown statement \"drop\"",
            ),
            (
                json!({"ops": [{"statement": "debit", "params": ["u1"]}]}),
                "takes 2 parameters, got 1",
            ),
            (
                json!({"ops": [{"statement": "debit", "params": ["u1", "ten"]}]}),
                "parameter $2 must be a int8",
            ),
            (
                json!({"ops": [{"statement": "debit", "params": [1, 10]}]}),
                "parameter $1 must be a text",
            ),
            (
                json!({"ops": [{"statement": "debit", "params": ["u1", 1.5]}]}),
                "parameter $2",
            ),
            (json!({"ops": []}), "ops is empty"),
            (json!({"sql": "DROP TABLE accounts"}), "expected {\"ops\""),
        ];
        for (payload, expected) in cases {
            let error = s.bind(&payload).err().unwrap();
            assert!(error.contains(expected), "{payload}: {error}");
        }
    }

    #[test]
    fn null_binds_as_sql_null_for_every_supported_type() {
        // Test-only use of the buffer type ToSql writes into.
        use tokio_postgres::types::private::BytesMut;
        let types = [
            Type::BOOL,
            Type::INT2,
            Type::INT4,
            Type::INT8,
            Type::FLOAT4,
            Type::FLOAT8,
            Type::TEXT,
            Type::VARCHAR,
            Type::BPCHAR,
            Type::NAME,
        ];
        for ty in &types {
            assert!(supported(ty), "{ty}");
            let null = to_sql(&json!(null), ty).unwrap_or_else(|| panic!("no null for {ty}"));
            let written = null.to_sql_checked(ty, &mut BytesMut::new());
            assert!(
                matches!(written, Ok(tokio_postgres::types::IsNull::Yes)),
                "{ty}: {:?}",
                written.err()
            );
        }
        // An unsupported type gets no value at all, null or not.
        assert!(to_sql(&json!(null), &Type::UUID).is_none());
        // A payload with nulls binds for an int8 parameter too.
        let s = statements();
        let bound = s
            .bind(&json!({"ops": [{"statement": "debit", "params": [null, null]}]}))
            .unwrap();
        assert_eq!(bound[0].params.len(), 2);
    }

    #[test]
    fn the_file_shape_is_checked() {
        let specs = Statements::parse_file(
            br#"{"debit": {"sql": "UPDATE a SET b = b - $2 WHERE id = $1", "expect_rows": 1}}"#,
        )
        .unwrap();
        assert_eq!(specs["debit"].expect_rows, Some(1));
        assert!(Statements::parse_file(b"{}").is_err());
        let guarded = Statements::parse_file(
            br#"{"move": {"sql": "UPDATE c SET v = v + 1 WHERE id = $1 RETURNING v",
                 "guards_intent": {"rows": 1}}}"#,
        )
        .unwrap();
        assert_eq!(guarded["move"].expected_rows(), Some(1));
        let both = br#"{"m": {"sql": "S", "expect_rows": 2, "guards_intent": {"rows": 1}}}"#;
        assert!(
            Statements::parse_file(both)
                .unwrap_err()
                .contains("give one count")
        );
        assert!(
            Statements::parse_file(br#"{"m": {"sql": "S", "guards_intent": {"count": 1}}}"#)
                .is_err()
        );
        assert!(Statements::parse_file(br#"{"x": {"sql": "S", "rows": 1}}"#).is_err());
    }
}
