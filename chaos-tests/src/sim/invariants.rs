//! The invariants (design section 6), checked after every step of a run, and the end-of-run
//! checks after the faults healed and the run went quiet.
//!
//! Sources of truth: each participant's log as it stands (what its restart would rebuild, and
//! what its in-memory state reflects), each participant's committed KV state, the set of
//! coordinator decisions that ever became durable (durable records are never lost), and what
//! each client was told.

use protocol::{Decision, Outcome, TxId};

use super::participant_node::Ended;
use super::world::World;
use crate::checkout::Order;

type Violation = (&'static str, String);

impl World {
    pub(super) fn check(&self) -> Result<(), Violation> {
        if let Some(problem) = &self.problem {
            return Err(problem.clone());
        }
        if let Some(flip) = &self.coordinator.flipped {
            return Err(("agreement", flip.clone()));
        }
        for p in &self.participants {
            if let Some(conflict) = &p.conflict {
                return Err(("atomicity", conflict.clone()));
            }
        }
        for client in &self.clients {
            self.check_tx(client)?;
        }
        for (p, node) in self.participants.iter().enumerate() {
            // The store changes only with the participant's log (a Committed record applies,
            // a crash and a restart rebuild it): recheck it whenever that moved.
            if node.changes.get() != node.checked.get() {
                self.check_store(p)?;
                node.checked.set(node.changes.get());
            }
        }
        Ok(())
    }

    fn ended_at<'a>(&'a self, txid: &'a TxId) -> impl Iterator<Item = (usize, Ended)> + 'a {
        self.participants
            .iter()
            .filter_map(move |p| p.ended.get(txid).map(|e| (p.index, *e)))
    }

    fn check_tx(&self, client: &super::world::Client) -> Result<(), Violation> {
        let txid = &client.tx.txid;
        // One lookup per participant; the checks below reuse it.
        let (mut committed, mut not_committed, mut aborted) = (None, None, None);
        for (p, ended) in self.ended_at(txid) {
            match ended {
                Ended::Committed => committed = committed.or(Some(p)),
                Ended::Aborted => {
                    aborted = aborted.or(Some((p, ended)));
                    not_committed = not_committed.or(Some((p, ended)));
                }
                Ended::Refused => not_committed = not_committed.or(Some((p, ended))),
            }
        }
        // Atomicity: nobody committed what another aborted or refused.
        if let (Some(c), Some((a, how))) = (committed, not_committed) {
            return Err((
                "atomicity",
                format!("{txid} committed at participant {c} but {how:?} at participant {a}"),
            ));
        }
        let decision = self.coordinator.durable_decisions.get(txid).copied();
        // Agreement: a participant commits only a durable commit decision; aborts only what the
        // coordinator did not durably commit (no record at all is presumed abort).
        if let Some(p) = committed
            && decision != Some(Decision::Commit)
        {
            return Err((
                "agreement",
                format!(
                    "{txid} committed at participant {p} while the coordinator's durable \
                     decision is {decision:?}"
                ),
            ));
        }
        if let Some((p, how)) = aborted
            && decision == Some(Decision::Commit)
        {
            return Err((
                "agreement",
                format!(
                    "{txid} {how:?} at participant {p} but the coordinator durably committed it"
                ),
            ));
        }
        // Durability of what a client saw: it is the durable decision, and no participant
        // ends the other way.
        if let Some(seen) = client.observed {
            let want = match seen {
                Outcome::Committed => Decision::Commit,
                Outcome::Aborted => Decision::Abort,
            };
            if decision != Some(want) {
                return Err((
                    "durability",
                    format!(
                        "client saw {seen:?} for {txid} but the coordinator's durable decision \
                         is {decision:?}"
                    ),
                ));
            }
            let contradicts = match seen {
                Outcome::Committed => not_committed,
                Outcome::Aborted => committed.map(|p| (p, Ended::Committed)),
            };
            if let Some((p, how)) = contradicts {
                return Err((
                    "durability",
                    format!("client saw {seen:?} for {txid} but participant {p} has it {how:?}"),
                ));
            }
        }
        Ok(())
    }

    /// No double apply, the store agrees with the log, and conservation, at one participant.
    fn check_store(&self, index: usize) -> Result<(), Violation> {
        let p = &self.participants[index];
        let Some(engine) = &p.engine else {
            return Ok(());
        };
        let store = engine.resource();
        let mut applied: Vec<&Order> = Vec::new();
        for client in &self.clients {
            let order = &client.order;
            let marker = &client.markers[index];
            let entry = store.get(marker);
            let logged = p.ended.get(&client.tx.txid) == Some(&Ended::Committed);
            match &entry {
                Some(e) if e.version > 1 => {
                    return Err((
                        "no double apply",
                        format!(
                            "{} applied {} times at participant {index} ({marker} is at version {})",
                            order.id, e.version, e.version
                        ),
                    ));
                }
                Some(_) if !logged => {
                    return Err((
                        "no double apply",
                        format!(
                            "{} is applied at participant {index} without a Committed record",
                            order.id
                        ),
                    ));
                }
                None if logged => {
                    return Err((
                        "no double apply",
                        format!(
                            "{} has a Committed record at participant {index} but was never applied",
                            order.id
                        ),
                    ));
                }
                Some(_) => applied.push(order),
                None => {}
            }
        }
        let int = |key: &str| {
            store
                .get(key)
                .and_then(|e| e.value.as_i64())
                .unwrap_or_default()
        };
        match index {
            0 => {
                for (sku, (stock, sold)) in (0u32..).zip(&self.keys.stock) {
                    let (stock, sold) = (int(stock), int(sold));
                    let expected_sold: i64 = applied
                        .iter()
                        .filter(|o| o.sku == sku)
                        .map(|o| o.quantity)
                        .sum();
                    if stock < 0 || stock + sold != self.shop.stock_per_sku || sold != expected_sold
                    {
                        return Err((
                            "conservation",
                            format!(
                                "sku {sku}: stock {stock} + sold {sold} != {} or sold != {expected_sold} \
                                 (the committed orders' quantities)",
                                self.shop.stock_per_sku
                            ),
                        ));
                    }
                }
            }
            1 => {
                for (customer, (balance, spent)) in (0u32..).zip(&self.keys.money) {
                    let (balance, spent) = (int(balance), int(spent));
                    let expected_spent: i64 = applied
                        .iter()
                        .filter(|o| o.customer == customer)
                        .map(|o| o.amount)
                        .sum();
                    if balance < 0
                        || balance + spent != self.shop.balance_per_customer
                        || spent != expected_spent
                    {
                        return Err((
                            "conservation",
                            format!(
                                "customer {customer}: balance {balance} + spent {spent} != {} or \
                                 spent != {expected_spent} (the committed orders' amounts)",
                                self.shop.balance_per_customer
                            ),
                        ));
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// After healing and quiescence: every transaction resolved the same way everywhere.
    pub(super) fn check_final(&self) -> Result<(), Violation> {
        self.check()?;
        for p in 0..self.participants.len() {
            self.check_store(p)?;
        }
        for client in &self.clients {
            let txid = &client.tx.txid;
            let decision = self.coordinator.durable_decisions.get(txid).copied();
            let committed = self
                .ended_at(txid)
                .filter(|(_, e)| *e == Ended::Committed)
                .count();
            let want = match decision {
                Some(Decision::Commit) => self.participants.len(),
                Some(Decision::Abort) | None => 0,
            };
            if committed != want {
                return Err((
                    "liveness",
                    format!(
                        "{txid}: durable decision {decision:?} but {committed} of {} participants \
                         committed after the run went quiet",
                        self.participants.len()
                    ),
                ));
            }
        }
        Ok(())
    }
}
