//! The invariant audit: after a run, read every participant and the coordinator through their
//! public APIs and check what the design promises (design section 6).
//!
//! The client's view of each order is `Committed`, `Aborted` or `Unknown` (a timeout or a
//! dropped connection): unknown is never assumed failed, it only has to be atomic.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use protocol::kv::{KvEntry, PreparedList};
use protocol::{Outcome, TransactionStatus};
use serde::{Deserialize, Serialize};

use crate::checkout::{
    CheckoutConfig, INVENTORY, Order, PAYMENTS, SHIPPING, balance_key, sold_key, spent_key,
    stock_key,
};

/// What the client heard for one order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientOutcome {
    Committed,
    Aborted,
    /// No answer (timeout, connection lost): either outcome is allowed, atomically.
    Unknown,
}

/// Where the cluster's services answer.
#[derive(Debug, Clone)]
pub struct ClusterUrls {
    pub coordinator: String,
    pub inventory: String,
    pub payments: String,
    pub shipping: String,
}

impl ClusterUrls {
    fn participant(&self, name: &str) -> &str {
        match name {
            INVENTORY => &self.inventory,
            PAYMENTS => &self.payments,
            _ => &self.shipping,
        }
    }

    fn participants(&self) -> [(&'static str, &str); 3] {
        [
            (INVENTORY, &self.inventory),
            (PAYMENTS, &self.payments),
            (SHIPPING, &self.shipping),
        ]
    }
}

/// The ledger counters (`sold`, `spent`) summed over all products and customers. Read before a
/// run and after it, the difference is what the run applied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    pub sold: i64,
    pub spent: i64,
}

/// One invariant's verdict.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub ok: bool,
    pub detail: String,
}

/// Every verdict, and what was found.
#[derive(Debug, Clone, Serialize)]
pub struct AuditReport {
    pub checks: Vec<Check>,
    /// Orders applied at every participant.
    pub applied: usize,
    /// Orders applied nowhere.
    pub absent: usize,
}

impl AuditReport {
    pub fn all_ok(&self) -> bool {
        self.checks.iter().all(|c| c.ok)
    }
}

/// Failure to read the cluster at all (as opposed to a broken invariant).
#[derive(Debug, thiserror::Error)]
#[error("reading {url}: {reason}")]
pub struct ReadError {
    pub url: String,
    pub reason: String,
}

async fn get_json<T: for<'de> Deserialize<'de>>(
    client: &reqwest::Client,
    url: String,
) -> Result<Option<T>, ReadError> {
    let fail = |reason: String| ReadError {
        url: url.clone(),
        reason,
    };
    let response = client
        .get(&url)
        .send()
        .await
        .map_err(|e| fail(e.to_string()))?;
    if response.status() == reqwest::StatusCode::NOT_FOUND {
        return Ok(None);
    }
    if !response.status().is_success() {
        return Err(fail(format!("status {}", response.status())));
    }
    response
        .json::<T>()
        .await
        .map(Some)
        .map_err(|e| fail(e.to_string()))
}

/// The committed value of a counter key (absent = 0).
async fn counter(client: &reqwest::Client, base: &str, key: &str) -> Result<i64, ReadError> {
    let entry: Option<KvEntry> = get_json(client, format!("{base}/v1/kv/{key}")).await?;
    Ok(entry.and_then(|e| e.value.as_i64()).unwrap_or(0))
}

async fn exists(client: &reqwest::Client, base: &str, key: &str) -> Result<bool, ReadError> {
    let entry: Option<KvEntry> = get_json(client, format!("{base}/v1/kv/{key}")).await?;
    Ok(entry.is_some())
}

/// Sums the ledger counters.
pub async fn read_totals(
    client: &reqwest::Client,
    urls: &ClusterUrls,
    config: &CheckoutConfig,
) -> Result<Totals, ReadError> {
    let mut totals = Totals::default();
    for sku in 0..config.skus {
        totals.sold += counter(client, &urls.inventory, &sold_key(sku)).await?;
    }
    for customer in 0..config.customers {
        totals.spent += counter(client, &urls.payments, &spent_key(customer)).await?;
    }
    Ok(totals)
}

/// Waits until no participant holds a prepared transaction, or `timeout` passes. Returns what is
/// still prepared, by participant.
pub async fn wait_no_prepared(
    client: &reqwest::Client,
    urls: &ClusterUrls,
    timeout: Duration,
) -> Result<BTreeMap<&'static str, usize>, ReadError> {
    let deadline = Instant::now() + timeout;
    loop {
        let mut left = BTreeMap::new();
        for (name, base) in urls.participants() {
            let list: Option<PreparedList> =
                get_json(client, format!("{base}/v1/prepared")).await?;
            let count = list.map_or(0, |l| l.prepared.len());
            if count > 0 {
                left.insert(name, count);
            }
        }
        if left.is_empty() || Instant::now() >= deadline {
            return Ok(left);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Checks every invariant for `observed` orders. `before` is what `read_totals` gave before the
/// run; `settle` bounds how long in-doubt transactions may take to resolve (liveness).
pub async fn audit(
    client: &reqwest::Client,
    urls: &ClusterUrls,
    config: &CheckoutConfig,
    before: Totals,
    observed: &[(Order, ClientOutcome)],
    settle: Duration,
) -> Result<AuditReport, ReadError> {
    let mut checks = Vec::new();

    let left = wait_no_prepared(client, urls, settle).await?;
    checks.push(Check {
        name: "liveness: no prepared transaction left",
        ok: left.is_empty(),
        detail: if left.is_empty() {
            format!("every participant resolved everything within {settle:?}")
        } else {
            format!("still prepared after {settle:?}: {left:?}")
        },
    });

    let mut torn = Vec::new();
    let mut broken_promises = Vec::new();
    let mut disagreements = Vec::new();
    let (mut applied, mut absent) = (0, 0);
    let mut applied_quantity = 0;
    let mut applied_amount = 0;
    for (order, outcome) in observed {
        let mut present = Vec::with_capacity(3);
        for (participant, key) in order.marker_keys() {
            present.push(exists(client, urls.participant(participant), &key).await?);
        }
        let everywhere = present.iter().all(|p| *p);
        let nowhere = present.iter().all(|p| !*p);
        if !everywhere && !nowhere {
            torn.push(format!("{} applied at {present:?}", order.id));
            continue;
        }
        if everywhere {
            applied += 1;
            applied_quantity += order.quantity;
            applied_amount += order.amount;
        } else {
            absent += 1;
        }
        match (outcome, everywhere) {
            (ClientOutcome::Committed, false) => {
                broken_promises.push(format!("{}: client saw committed, not applied", order.id))
            }
            (ClientOutcome::Aborted, true) => {
                broken_promises.push(format!("{}: client saw aborted, but applied", order.id))
            }
            _ => {}
        }
        let status: Option<TransactionStatus> = get_json(
            client,
            format!("{}/v1/transactions/{}", urls.coordinator, order.id),
        )
        .await?;
        let logged_commit = status.and_then(|s| s.outcome) == Some(Outcome::Committed);
        if logged_commit != everywhere {
            disagreements.push(format!(
                "{}: coordinator says committed={logged_commit}, participants applied={everywhere}",
                order.id
            ));
        }
    }
    checks.push(verdict(
        "atomicity: every order applied everywhere or nowhere",
        &torn,
        format!("{applied} applied everywhere, {absent} nowhere"),
    ));
    checks.push(verdict(
        "durability: every outcome a client saw holds at every participant",
        &broken_promises,
        "every committed answer is applied, every aborted answer is absent".into(),
    ));
    checks.push(verdict(
        "agreement: participants match the coordinator's log",
        &disagreements,
        "every order's coordinator outcome matches the participants".into(),
    ));

    let mut stock_errors = Vec::new();
    for sku in 0..config.skus {
        let stock = counter(client, &urls.inventory, &stock_key(sku)).await?;
        let sold = counter(client, &urls.inventory, &sold_key(sku)).await?;
        if stock < 0 || stock + sold != config.stock_per_sku {
            stock_errors.push(format!(
                "sku-{sku}: stock {stock} + sold {sold} != {}",
                config.stock_per_sku
            ));
        }
    }
    checks.push(verdict(
        "conservation: stock + sold = initial stock",
        &stock_errors,
        format!("{} products balance", config.skus),
    ));
    let mut money_errors = Vec::new();
    for customer in 0..config.customers {
        let balance = counter(client, &urls.payments, &balance_key(customer)).await?;
        let spent = counter(client, &urls.payments, &spent_key(customer)).await?;
        if balance < 0 || balance + spent != config.balance_per_customer {
            money_errors.push(format!(
                "cust-{customer}: balance {balance} + spent {spent} != {}",
                config.balance_per_customer
            ));
        }
    }
    checks.push(verdict(
        "conservation: balance + spent = initial balance",
        &money_errors,
        format!("{} customers balance", config.customers),
    ));

    let after = read_totals(client, urls, config).await?;
    let mut doubles = Vec::new();
    if after.sold - before.sold != applied_quantity {
        doubles.push(format!(
            "units sold rose by {} but applied orders hold {applied_quantity}",
            after.sold - before.sold
        ));
    }
    if after.spent - before.spent != applied_amount {
        doubles.push(format!(
            "money spent rose by {} but applied orders hold {applied_amount}",
            after.spent - before.spent
        ));
    }
    checks.push(verdict(
        "no double apply: ledgers moved by exactly the applied orders",
        &doubles,
        format!("{applied_quantity} units and {applied_amount} money, each once"),
    ));

    Ok(AuditReport {
        checks,
        applied,
        absent,
    })
}

fn verdict(name: &'static str, problems: &[String], ok_detail: String) -> Check {
    const SHOWN: usize = 5;
    if problems.is_empty() {
        return Check {
            name,
            ok: true,
            detail: ok_detail,
        };
    }
    let mut detail = problems[..problems.len().min(SHOWN)].join("; ");
    if problems.len() > SHOWN {
        detail.push_str(&format!("; and {} more", problems.len() - SHOWN));
    }
    Check {
        name,
        ok: false,
        detail,
    }
}

/// What a load run observed, saved so the same invariants can be checked again later (for
/// example after the whole cluster restarted from its volumes).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunRecord {
    pub config: CheckoutConfig,
    pub before: Totals,
    pub orders: Vec<(Order, ClientOutcome)>,
}
