//! The checkout workload of the seeds: reserve stock, charge payment, create shipment, as one
//! transaction across `inventory`, `payments` and `shipping`.
//!
//! Pure: orders come from a seeded generator, so a run can be replayed. Every key an order
//! writes is named here, and so are the conservation laws the audit checks:
//! `stock:K + sold:K == initial stock of K` and `balance:C + spent:C == initial balance of C`.

use protocol::kv::{KvOp, KvPayload};
use serde::{Deserialize, Serialize};
use serde_json::json;

pub const INVENTORY: &str = "inventory";
pub const PAYMENTS: &str = "payments";
pub const SHIPPING: &str = "shipping";

/// The shape of the store: how many products and customers, and what they start with.
/// Stock and balances sized so a first 2,000-order run mostly commits while still producing
/// real "no" votes: lock conflicts on popular products throughout, and those products selling
/// out (and customers running out of money) towards the end and in later runs on the same data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckoutConfig {
    pub skus: u32,
    pub stock_per_sku: i64,
    pub customers: u32,
    pub balance_per_customer: i64,
    /// Most units in one order (at least 1).
    pub max_quantity: i64,
    /// Unit prices are drawn from 1..=max_unit_price.
    pub max_unit_price: i64,
}

impl Default for CheckoutConfig {
    fn default() -> Self {
        Self {
            skus: 20,
            stock_per_sku: 150,
            customers: 40,
            balance_per_customer: 2_500,
            max_quantity: 3,
            max_unit_price: 40,
        }
    }
}

/// One order: who buys how many of what, at what price.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Order {
    pub id: String,
    pub sku: u32,
    pub customer: u32,
    pub quantity: i64,
    pub amount: i64,
}

pub fn stock_key(sku: u32) -> String {
    format!("stock:sku-{sku}")
}
pub fn sold_key(sku: u32) -> String {
    format!("sold:sku-{sku}")
}
pub fn balance_key(customer: u32) -> String {
    format!("balance:cust-{customer}")
}
pub fn spent_key(customer: u32) -> String {
    format!("spent:cust-{customer}")
}
pub fn reservation_key(order: &str) -> String {
    format!("reservation:{order}")
}
pub fn payment_key(order: &str) -> String {
    format!("payment:{order}")
}
pub fn shipment_key(order: &str) -> String {
    format!("shipment:{order}")
}

impl CheckoutConfig {
    /// The seed file of each participant (`twopc participant --seed`), as JSON objects of
    /// key -> initial value. Shipping starts empty.
    pub fn seeds(&self) -> Vec<(&'static str, serde_json::Value)> {
        let stock: serde_json::Map<_, _> = (0..self.skus)
            .map(|sku| (stock_key(sku), json!(self.stock_per_sku)))
            .collect();
        let balances: serde_json::Map<_, _> = (0..self.customers)
            .map(|c| (balance_key(c), json!(self.balance_per_customer)))
            .collect();
        vec![
            (INVENTORY, serde_json::Value::Object(stock)),
            (PAYMENTS, serde_json::Value::Object(balances)),
            (SHIPPING, json!({})),
        ]
    }

    /// Order number `index` of the run whose orders are prefixed `run`. Popular products are
    /// more likely (half the orders go to the first quarter of the skus), so concurrent orders
    /// really contend for the same locks.
    pub fn order(&self, run: &str, index: u64, rng: &mut fastrand::Rng) -> Order {
        let hot = (self.skus / 4).max(1);
        let sku = if rng.bool() {
            rng.u32(0..hot)
        } else {
            rng.u32(0..self.skus.max(1))
        };
        let quantity = rng.i64(1..=self.max_quantity.max(1));
        let unit_price = rng.i64(1..=self.max_unit_price.max(1));
        Order {
            id: format!("{run}-{index}"),
            sku,
            customer: rng.u32(0..self.customers.max(1)),
            quantity,
            amount: quantity * unit_price,
        }
    }
}

impl Order {
    /// The three participants' payloads, in the order inventory, payments, shipping.
    pub fn payloads(&self) -> Vec<(&'static str, KvPayload)> {
        let inventory = KvPayload {
            ops: vec![
                KvOp::Add {
                    key: stock_key(self.sku),
                    delta: -self.quantity,
                    min: Some(0),
                },
                KvOp::Add {
                    key: sold_key(self.sku),
                    delta: self.quantity,
                    min: None,
                },
                KvOp::Put {
                    key: reservation_key(&self.id),
                    value: json!({"sku": self.sku, "quantity": self.quantity}),
                },
            ],
        };
        let payments = KvPayload {
            ops: vec![
                KvOp::Add {
                    key: balance_key(self.customer),
                    delta: -self.amount,
                    min: Some(0),
                },
                KvOp::Add {
                    key: spent_key(self.customer),
                    delta: self.amount,
                    min: None,
                },
                KvOp::Put {
                    key: payment_key(&self.id),
                    value: json!(self.amount),
                },
            ],
        };
        let shipping = KvPayload {
            ops: vec![KvOp::Put {
                key: shipment_key(&self.id),
                value: json!({"customer": self.customer, "sku": self.sku, "quantity": self.quantity}),
            }],
        };
        vec![
            (INVENTORY, inventory),
            (PAYMENTS, payments),
            (SHIPPING, shipping),
        ]
    }

    /// The `POST /v1/transactions` body for this order.
    pub fn request(&self, timeout_ms: u64) -> serde_json::Value {
        let participants: Vec<_> = self
            .payloads()
            .into_iter()
            .map(|(name, payload)| json!({"name": name, "payload": payload}))
            .collect();
        json!({"id": self.id, "participants": participants, "timeout_ms": timeout_ms})
    }

    /// The key per participant whose presence says the order was applied there.
    pub fn marker_keys(&self) -> [(&'static str, String); 3] {
        [
            (INVENTORY, reservation_key(&self.id)),
            (PAYMENTS, payment_key(&self.id)),
            (SHIPPING, shipment_key(&self.id)),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_are_replayable_from_the_seed() {
        let config = CheckoutConfig::default();
        let a: Vec<_> = {
            let mut rng = fastrand::Rng::with_seed(7);
            (0..50).map(|i| config.order("r", i, &mut rng)).collect()
        };
        let mut rng = fastrand::Rng::with_seed(7);
        let b: Vec<_> = (0..50).map(|i| config.order("r", i, &mut rng)).collect();
        assert_eq!(a, b);
        for order in &a {
            assert!((1..=config.max_quantity).contains(&order.quantity));
            assert!(order.amount >= order.quantity && order.sku < config.skus);
        }
    }

    #[test]
    fn payloads_move_exactly_what_the_conservation_laws_count() {
        let order = Order {
            id: "o-1".into(),
            sku: 3,
            customer: 5,
            quantity: 2,
            amount: 30,
        };
        let payloads = order.payloads();
        let inventory = &payloads[0].1.ops;
        assert_eq!(
            inventory[0],
            KvOp::Add {
                key: "stock:sku-3".into(),
                delta: -2,
                min: Some(0)
            }
        );
        assert_eq!(
            inventory[1],
            KvOp::Add {
                key: "sold:sku-3".into(),
                delta: 2,
                min: None
            }
        );
        let payments = &payloads[1].1.ops;
        assert_eq!(
            payments[0],
            KvOp::Add {
                key: "balance:cust-5".into(),
                delta: -30,
                min: Some(0)
            }
        );
        let body = order.request(2000);
        assert_eq!(body["participants"].as_array().map(Vec::len), Some(3));
        assert_eq!(body["id"], "o-1");
    }

    #[test]
    fn seeds_cover_every_sku_and_customer() {
        let config = CheckoutConfig::default();
        let seeds = config.seeds();
        assert_eq!(
            seeds[0].1.as_object().map(|m| m.len()),
            Some(config.skus as usize)
        );
        assert_eq!(
            seeds[1].1.as_object().map(|m| m.len()),
            Some(config.customers as usize)
        );
        assert_eq!(seeds[0].1["stock:sku-0"], json!(config.stock_per_sku));
    }
}
