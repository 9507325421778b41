//! The checkout workflow on a PostgreSQL participant (docs/workflows.md, "twopc demo
//! --workflow"): its tables, its statements file, its seed, and the `POST /v1/pg/write` of a
//! transition, built from the planner's `Transition` as `workflow::write` builds the KV one.
//!
//! The transition statement is the seed's version-conditional `UPDATE ... RETURNING version`,
//! declared `guards_intent {rows: 1}`: when it returns no row the participant rolls the write
//! back and records no intent. The write carries the worker's fence claim, which the PostgreSQL
//! participant judges in the same local transaction (docs/postgres.md, "Fences"): a stale
//! worker's transition is refused 409 `stale_token` and changes nothing, as at the KV
//! participant. Pure: strings and requests, no I/O.

use protocol::outbox::{Intent, PgWriteRequest};
use serde_json::{Value, json};

use crate::workflow::{self, Checkout, Step, Transition};

/// The tables (run once on a fresh database).
pub const SCHEMA_SQL: &str = "CREATE TABLE checkouts (id text PRIMARY KEY, ord int NOT NULL, \
    state text NOT NULL, sku text NOT NULL, amount bigint NOT NULL, customer text NOT NULL, \
    history jsonb NOT NULL DEFAULT '[]', version bigint NOT NULL DEFAULT 1); \
    CREATE TABLE stock (sku text PRIMARY KEY, n bigint NOT NULL CHECK (n >= 0))";

/// The statements file.
pub const STATEMENTS: &str = r#"{
  "transition": {"sql": "WITH moved AS (UPDATE checkouts SET state = $3, version = version + 1, history = history || $5::text::jsonb WHERE id = $1 AND state = $2 AND version = $4 RETURNING version, sku), taken AS (UPDATE stock SET n = stock.n + $6 FROM moved WHERE stock.sku = moved.sku AND $6 <> 0 RETURNING stock.n) SELECT moved.version FROM moved",
                 "guards_intent": {"rows": 1}},
  "checkouts": {"sql": "SELECT id, state, sku, amount, customer, history::text AS history, version FROM checkouts ORDER BY ord"},
  "stock": {"sql": "SELECT sku, n FROM stock ORDER BY sku"}
}"#;

/// The seed: stock per sku and each checkout `created`.
pub fn seed_sql(stock: &[(String, i64)], checkouts: &[(String, Checkout)]) -> String {
    let mut sql = String::new();
    for (sku, n) in stock {
        sql.push_str(&format!("INSERT INTO stock VALUES ('{sku}', {n});"));
    }
    for (ord, (id, c)) in checkouts.iter().enumerate() {
        sql.push_str(&format!(
            "INSERT INTO checkouts (id, ord, state, sku, amount, customer) VALUES ('{id}', {ord}, 'created', '{}', {}, '{}');",
            c.sku, c.amount, c.customer
        ));
    }
    sql
}

/// A row of the `checkouts` statement as a checkout and its version.
pub fn checkout_of(row: &Value) -> Option<(String, Checkout, u64)> {
    let history: Vec<Step> = serde_json::from_str(row["history"].as_str()?).ok()?;
    let checkout = Checkout {
        state: serde_json::from_value(row["state"].clone()).ok()?,
        sku: row["sku"].as_str()?.to_string(),
        amount: row["amount"].as_i64()?,
        customer: row["customer"].as_str()?.to_string(),
        history,
    };
    Some((
        row["id"].as_str()?.to_string(),
        checkout,
        row["version"].as_u64()?,
    ))
}

/// The one local write of `transition`, under the worker's `fence`.
pub fn write(
    id: &str,
    checkout: &Checkout,
    version: u64,
    transition: &Transition,
    fence: protocol::lease::FenceClaim,
) -> PgWriteRequest {
    let token = fence.token;
    let step = Step {
        from: transition.from,
        to: transition.to,
        token,
        evidence: transition.evidence.clone(),
    };
    let next: Vec<Intent> = if transition.emits_payment {
        workflow::write(id, checkout, version, transition, fence.clone()).next
    } else {
        Vec::new()
    };
    PgWriteRequest {
        op_id: format!("wf-{id}-v{version}-t{token}"),
        fence: Some(fence),
        statement: "transition".into(),
        params: vec![
            json!(id),
            json!(transition.from.name()),
            json!(transition.to.name()),
            json!(version),
            json!(serde_json::to_string(&[step]).unwrap_or_default()),
            json!(transition.stock_delta.unwrap_or(0)),
        ],
        next,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workflow::{Evidence, Plan, State, plan};

    #[test]
    fn the_pg_write_of_a_reservation_carries_the_guard_params_and_the_one_intent() {
        let c = Checkout::new("sku-1", 40, "alice");
        let Plan::Move(t) = plan(State::Created, &Evidence::Missing) else {
            panic!()
        };
        let fence = protocol::lease::FenceClaim::unproven(workflow::LEASE, 7);
        let w = write("c-2", &c, 1, &t, fence.clone());
        assert_eq!(w.statement, "transition");
        assert_eq!(w.fence, Some(fence));
        assert_eq!(w.params[1], "created");
        assert_eq!(w.params[2], "stock_reserved");
        assert_eq!(w.params[3], 1);
        assert_eq!(w.params[5], -1);
        assert_eq!(w.next.len(), 1);
        assert_eq!(w.next[0].event_id, "pay-c-2");
        let steps: Vec<Step> = serde_json::from_str(w.params[4].as_str().unwrap()).unwrap();
        assert_eq!(steps[0].token, 7);
        let statements: Value = serde_json::from_str(STATEMENTS).unwrap();
        assert_eq!(statements["transition"]["guards_intent"]["rows"], 1);
    }

    #[test]
    fn a_checkouts_row_reads_back() {
        let row = json!({"id": "c-1", "state": "payment_unknown", "sku": "sku-2", "amount": 17,
                         "customer": "bob", "version": 4,
                         "history": "[{\"from\":\"created\",\"to\":\"stock_reserved\",\"token\":1}]"});
        let (id, c, v) = checkout_of(&row).unwrap();
        assert_eq!((id.as_str(), v, c.state), ("c-1", 4, State::PaymentUnknown));
        assert_eq!(c.history.len(), 1);
    }
}
