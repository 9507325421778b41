//! The oracle: after a run, read every participant and the coordinator through their public
//! APIs, then check each invariant of design section 6, one file per invariant. Reading
//! (`observe`) is the only I/O; every check is a pure function of what was read, so a check can
//! be tested on a hand-made [`Observation`].
//!
//! The client's view of each order is `Committed`, `Aborted` or `Unknown` (a timeout or a
//! dropped connection): unknown is never assumed failed, it only has to be atomic.

mod agreement;
mod atomicity;
mod conservation;
mod durability;
mod liveness;
mod no_double_apply;
pub mod read;

use std::collections::BTreeMap;
use std::time::Duration;

use protocol::TransactionStatus;
use serde::{Deserialize, Serialize};

use crate::checkout::{CheckoutConfig, INVENTORY, Order, PAYMENTS, SHIPPING};

pub use read::{
    PaymentsLedger, ReadError, observe, observe_settled, read_sold, read_totals, wait_no_prepared,
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
    pub fn participant(&self, name: &str) -> &str {
        match name {
            INVENTORY => &self.inventory,
            PAYMENTS => &self.payments,
            _ => &self.shipping,
        }
    }

    pub fn participants(&self) -> [(&'static str, &str); 3] {
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

    /// The failed checks, one per line (empty when all hold).
    pub fn failures(&self) -> String {
        self.checks
            .iter()
            .filter(|c| !c.ok)
            .map(|c| format!("FAILED {}: {}", c.name, c.detail))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// What was read about one order.
#[derive(Debug, Clone)]
pub struct OrderObservation {
    pub order: Order,
    pub client: ClientOutcome,
    /// Whether the order's marker key exists at inventory, payments, shipping (in that order).
    pub present: [bool; 3],
    /// Whether inventory, payments, shipping still hold it prepared (in doubt) when read: its
    /// outcome there is open, not aborted. Only a participant that neither applied nor holds it
    /// has settled it as aborted (or never prepared it).
    pub prepared: [bool; 3],
    /// The coordinator's record of it (`None`: it has none, which means presumed abort).
    pub coordinator: Option<TransactionStatus>,
}

impl OrderObservation {
    pub fn everywhere(&self) -> bool {
        self.present.iter().all(|p| *p)
    }

    pub fn nowhere(&self) -> bool {
        self.present.iter().all(|p| !*p)
    }

    /// Still prepared at some participant.
    pub fn in_doubt(&self) -> bool {
        self.prepared.iter().any(|p| *p)
    }

    /// Some participant neither applied it nor holds it prepared: it is aborted there for good.
    pub fn settled_absent_somewhere(&self) -> bool {
        self.present
            .iter()
            .zip(&self.prepared)
            .any(|(present, prepared)| !*present && !*prepared)
    }
}

/// One product's or customer's pair of counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ledger {
    pub id: u32,
    /// `stock` or `balance`.
    pub left: i64,
    /// `sold` or `spent`.
    pub moved: i64,
}

/// Everything the checks look at, read once after the run settled.
#[derive(Debug, Clone)]
pub struct Observation {
    pub settle: Duration,
    /// Participants still holding prepared transactions after `settle`, with how many.
    pub prepared_left: BTreeMap<&'static str, usize>,
    pub orders: Vec<OrderObservation>,
    pub stock: Vec<Ledger>,
    pub money: Vec<Ledger>,
    pub before: Totals,
    pub after: Totals,
}

/// Checks every invariant on what was read.
pub fn judge(config: &CheckoutConfig, observation: &Observation) -> AuditReport {
    let mut checks = vec![
        liveness::check(observation),
        atomicity::check(observation),
        durability::check(observation),
        agreement::check(observation),
    ];
    checks.extend(conservation::check(config, observation));
    checks.push(no_double_apply::check(observation));
    let applied = observation.orders.iter().filter(|o| o.everywhere()).count();
    let absent = observation.orders.iter().filter(|o| o.nowhere()).count();
    AuditReport {
        checks,
        applied,
        absent,
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
    let observation = observe(client, urls, config, before, observed, settle).await?;
    Ok(judge(config, &observation))
}

/// A check from a list of problems: ok when there are none, else the first few.
pub(crate) fn verdict(name: &'static str, problems: &[String], ok_detail: String) -> Check {
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

#[cfg(test)]
mod tests;
