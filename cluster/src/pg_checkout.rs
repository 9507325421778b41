//! The checkout workload with `payments` in PostgreSQL (`twopc demo --backend postgres`): the
//! payments database's schema and seed, the statements file of its `--backend postgres`
//! participant, and the payments payload of an order. Pure: no I/O here.
//!
//! The same conservation law as the KV checkout, over columns instead of keys: for every
//! customer `balance + spent` is the initial balance, and an order is applied at payments when
//! its row is in `payments`. Inventory and shipping stay KV participants.

use serde_json::json;

use crate::checkout::{CheckoutConfig, Order, PAYMENTS};

/// The payments database's tables.
pub const SCHEMA_SQL: &str = "CREATE TABLE customers (id text PRIMARY KEY, \
    balance bigint NOT NULL CHECK (balance >= 0), spent bigint NOT NULL DEFAULT 0); \
    CREATE TABLE payments (order_id text PRIMARY KEY, amount bigint NOT NULL)";

/// The statements file of the payments participant: a charge that votes no when the balance
/// is short (no row matches), and the order's payment row (its marker).
pub const STATEMENTS: &str = r#"{
  "charge": {"sql": "UPDATE customers SET balance = balance - $2, spent = spent + $2 WHERE id = $1 AND balance >= $2", "expect_rows": 1},
  "record_payment": {"sql": "INSERT INTO payments (order_id, amount) VALUES ($1, $2)", "expect_rows": 1}
}"#;

/// The customer row id of customer number `customer` (the KV checkout's key without `balance:`).
pub fn customer_id(customer: u32) -> String {
    format!("cust-{customer}")
}

/// The INSERT that seeds every customer with the initial balance.
pub fn seed_sql(config: &CheckoutConfig) -> String {
    format!(
        "INSERT INTO customers (id, balance) SELECT 'cust-' || g, {} FROM generate_series(0, {}) g",
        config.balance_per_customer,
        config.customers.saturating_sub(1)
    )
}

/// The payments participant's payload for `order`.
pub fn payments_payload(order: &Order) -> serde_json::Value {
    json!({"ops": [
        {"statement": "charge", "params": [customer_id(order.customer), order.amount]},
        {"statement": "record_payment", "params": [order.id, order.amount]},
    ]})
}

/// The `POST /v1/transactions` body for `order`: the KV checkout's inventory and shipping
/// payloads, and [`payments_payload`] for payments.
pub fn request(order: &Order, timeout_ms: u64) -> serde_json::Value {
    let participants: Vec<_> = order
        .payloads()
        .into_iter()
        .map(|(name, payload)| match name {
            PAYMENTS => json!({"name": name, "payload": payments_payload(order)}),
            _ => json!({"name": name, "payload": payload}),
        })
        .collect();
    json!({"id": order.id, "participants": participants, "timeout_ms": timeout_ms})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payments_speak_statements_and_the_others_keep_their_kv_payloads() {
        let order = Order {
            id: "o-1".into(),
            sku: 3,
            customer: 5,
            quantity: 2,
            amount: 30,
        };
        let body = request(&order, 2000);
        assert_eq!(body["id"], "o-1");
        assert_eq!(body["timeout_ms"], 2000);
        let kv = order.request(2000);
        assert_eq!(body["participants"][0], kv["participants"][0]);
        assert_eq!(body["participants"][2], kv["participants"][2]);
        assert_eq!(
            body["participants"][1]["payload"]["ops"][0],
            json!({"statement": "charge", "params": ["cust-5", 30]})
        );
        assert_eq!(
            body["participants"][1]["payload"]["ops"][1],
            json!({"statement": "record_payment", "params": ["o-1", 30]})
        );
    }

    #[test]
    fn the_statements_file_names_what_the_payload_uses() {
        let statements: serde_json::Value = serde_json::from_str(STATEMENTS).unwrap();
        for name in ["charge", "record_payment"] {
            assert_eq!(statements[name]["expect_rows"], 1, "{name}");
        }
        let seed = seed_sql(&CheckoutConfig::default());
        assert!(seed.contains("generate_series(0, 39)"), "{seed}");
    }
}
