//! Conservation for the checkout: `stock + sold` is the initial stock of every product and
//! `balance + spent` the initial balance of every customer, and neither goes below zero.

use crate::checkout::CheckoutConfig;

use super::{Check, Ledger, Observation, verdict};

pub fn check(config: &CheckoutConfig, observation: &Observation) -> [Check; 2] {
    let unbalanced = |ledgers: &[Ledger], initial: i64, what: &str| -> Vec<String> {
        ledgers
            .iter()
            .filter(|l| l.left < 0 || l.left + l.moved != initial)
            .map(|l| format!("{what}-{}: {} + {} != {initial}", l.id, l.left, l.moved))
            .collect()
    };
    [
        verdict(
            "conservation: stock + sold = initial stock",
            &unbalanced(&observation.stock, config.stock_per_sku, "sku"),
            format!("{} products balance", observation.stock.len()),
        ),
        verdict(
            "conservation: balance + spent = initial balance",
            &unbalanced(&observation.money, config.balance_per_customer, "cust"),
            format!("{} customers balance", observation.money.len()),
        ),
    ]
}
