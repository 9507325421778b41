//! The invariants (design section 6), checked after every step of a run, and the end-of-run
//! checks after the faults healed and the run went quiet.
//!
//! Sources of truth: each participant's log as it stands (what its restart would rebuild, and
//! what its in-memory state reflects), each participant's committed KV state, the set of
//! coordinator decisions that ever became durable (durable records are never lost), every
//! Prepared record that ever became durable at each participant (a commit decision must rest on
//! one at every participant of the attempt: "yes durable"), and what each client was told.

use protocol::{Decision, DecisionStatus, GlobalTxId, Outcome};

use super::participant_node::Ended;
use super::world::{Client, World};
use cluster::checkout::Order;

type Violation = (&'static str, String);

impl World {
    pub(super) fn check(&self) -> Result<(), Violation> {
        if let Some(problem) = &self.problem {
            return Err(problem.clone());
        }
        if let Some(flip) = &self.coordinator.flipped {
            return Err(("agreement", flip.clone()));
        }
        if let Some(broken) = &self.coordinator.outcome_violation {
            return Err(("outcomes", broken.clone()));
        }
        if let Some(broken) = &self.coordinator.answer_violation {
            return Err(("answers", broken.clone()));
        }
        if let Some(accepted) = &self.hostile_accepted {
            return Err(("resolution", accepted.clone()));
        }
        for p in &self.participants {
            if let Some(conflict) = &p.conflict {
                return Err(("atomicity", conflict.clone()));
            }
        }
        for gtid in self.coordinator.attempts.keys() {
            self.check_attempt(gtid)?;
        }
        for client in &self.clients {
            self.check_client(client)?;
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

    /// A commit decision rests on every participant's yes, and a yes on a durable Prepared
    /// record: when a commit decision becomes durable, every participant of the attempt's
    /// order has had its Prepared record durable (whatever carried the vote, and whatever
    /// answer it was paired with).
    pub(super) fn check_commits_rest_on_yes(&mut self) -> Result<(), Violation> {
        for gtid in std::mem::take(&mut self.coordinator.commits_to_check) {
            let Some((_, digest)) = self.coordinator.attempts.get(&gtid) else {
                continue;
            };
            let Some(client) = self.clients.iter().find(|c| c.tx.digest == *digest) else {
                continue;
            };
            for (name, _) in &client.tx.participants {
                let Some(p) = self.coordinator.participants.iter().position(|n| n == name) else {
                    continue;
                };
                if !self.participants[p].durably_prepared.contains(&gtid) {
                    let how = self.participants[p].ended.get(&gtid);
                    return Err((
                        "yes durable",
                        format!(
                            "the coordinator durably committed {gtid} ({}), but participant {p} \
                             never had its Prepared record durable (it ended {how:?})",
                            client.order.id
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    fn ended_at<'a>(&'a self, gtid: &'a GlobalTxId) -> impl Iterator<Item = (usize, Ended)> + 'a {
        self.participants
            .iter()
            .filter_map(move |p| p.ended.get(gtid).map(|e| (p.index, *e)))
    }

    /// One attempt, across the participants: atomicity, and agreement with the coordinator's
    /// durable decisions (the ground truth, kept across crashes and restores of its disk).
    fn check_attempt(&self, gtid: &GlobalTxId) -> Result<(), Violation> {
        let (mut committed, mut not_committed, mut aborted) = (None, None, None);
        for (p, ended) in self.ended_at(gtid) {
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
                format!("{gtid} committed at participant {c} but {how:?} at participant {a}"),
            ));
        }
        let decision = self.coordinator.durable_decisions.get(gtid).copied();
        // Agreement: a participant commits only a durable commit decision; aborts only what the
        // coordinator did not durably commit (no record at all is presumed abort).
        if let Some(p) = committed
            && decision != Some(Decision::Commit)
        {
            return Err((
                "agreement",
                format!(
                    "{gtid} committed at participant {p} while the coordinator's durable \
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
                    "{gtid} {how:?} at participant {p} but the coordinator durably committed it"
                ),
            ));
        }
        Ok(())
    }

    /// Durability of what a client saw: each answer is its attempt's durable decision, and no
    /// participant ends that attempt the other way.
    fn check_client(&self, client: &Client) -> Result<(), Violation> {
        for (gtid, seen) in &client.observed {
            let want = match seen {
                Outcome::Committed => Decision::Commit,
                Outcome::Aborted => Decision::Abort,
            };
            let decision = self.coordinator.durable_decisions.get(gtid).copied();
            if decision != Some(want) {
                return Err((
                    "durability",
                    format!(
                        "client {} saw {seen:?} for {gtid} but the coordinator's durable \
                         decision is {decision:?}",
                        client.order.id
                    ),
                ));
            }
            let contradicts = self.ended_at(gtid).find(|(_, ended)| match seen {
                Outcome::Committed => *ended != Ended::Committed,
                Outcome::Aborted => *ended == Ended::Committed,
            });
            if let Some((p, how)) = contradicts {
                return Err((
                    "durability",
                    format!(
                        "client {} saw {seen:?} for {gtid} but participant {p} has it {how:?}",
                        client.order.id
                    ),
                ));
            }
        }
        Ok(())
    }

    /// How many attempts of `client`'s order participant `index` committed: a client retry
    /// after its outcome was forgotten (a tiny `retained_max`) is a new attempt and may commit
    /// again; each attempt applies at most once.
    fn committed_attempts(&self, index: usize, client: &Client) -> i64 {
        let ended = &self.participants[index].ended;
        self.coordinator
            .attempts
            .iter()
            .filter(|(gtid, (_, digest))| {
                *digest == client.tx.digest && ended.get(*gtid) == Some(&Ended::Committed)
            })
            .count() as i64
    }

    /// No double apply, the store agrees with the log, and conservation, at one participant.
    fn check_store(&self, index: usize) -> Result<(), Violation> {
        let p = &self.participants[index];
        let Some(engine) = &p.engine else {
            return Ok(());
        };
        let store = engine.resource();
        let mut applied: Vec<(&Order, i64)> = Vec::new();
        for client in &self.clients {
            let order = &client.order;
            let marker = &client.markers[index];
            // The marker's version counts the times the order was applied here; each committed
            // attempt applies it exactly once.
            let times = store.get(marker).map_or(0, |e| e.version as i64);
            let committed = self.committed_attempts(index, client);
            if times != committed {
                return Err((
                    "no double apply",
                    format!(
                        "{} applied {times} times at participant {index} ({marker}) but \
                         {committed} of its attempts are logged committed there",
                        order.id
                    ),
                ));
            }
            if times > 0 {
                applied.push((order, times));
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
                        .filter(|(o, _)| o.sku == sku)
                        .map(|(o, times)| o.quantity * times)
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
                        .filter(|(o, _)| o.customer == customer)
                        .map(|(o, times)| o.amount * times)
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

    /// After healing and quiescence: every attempt resolved the same way everywhere, except
    /// attempts a participant holds in doubt because the coordinator's log cannot prove their
    /// outcome (`unknown`, or an answer from a run it must ignore). Those must really be
    /// undecidable from the coordinator's log as it now stands, and only a restore of its disk
    /// can make one (a crash that lost a Begin leaves an earlier run the log holds whole).
    pub(super) fn check_final(&self) -> Result<(), Violation> {
        self.check()?;
        for p in 0..self.participants.len() {
            self.check_store(p)?;
        }
        let mut undecidable: Vec<(usize, GlobalTxId)> = Vec::new();
        for (index, node) in self.participants.iter().enumerate() {
            for (txid, coordinator_id, query) in node.undecidable() {
                let (Some(engine), Some(fence)) = (
                    &self.coordinator.engine,
                    node.engine
                        .as_ref()
                        .and_then(|e| e.highest_epoch(&coordinator_id)),
                ) else {
                    continue;
                };
                let answer = engine.decision_for(&txid, Some(&query));
                // The participant obeys a later epoch, or the run it holds the epoch of.
                let obeys = engine.identity().is_some_and(|run| {
                    run.epoch > fence.epoch
                        || (run.epoch == fence.epoch && run.incarnation == fence.incarnation)
                });
                let obeyable = matches!(
                    answer.decision,
                    DecisionStatus::Commit | DecisionStatus::Abort
                ) && obeys;
                if obeyable {
                    return Err((
                        "liveness",
                        format!(
                            "participant {index} holds {} in doubt, but the coordinator can \
                             answer it ({:?}) at an epoch it obeys",
                            query.gtid, answer.decision
                        ),
                    ));
                }
                undecidable.push((index, query.gtid));
            }
        }
        if self.coordinator.is_behind() && self.coordinator.restores == 0 {
            return Err((
                "liveness",
                "the coordinator refuses new work as behind, but its disk was never put back \
                 from a copy: no participant can hold a run this log does not"
                    .to_string(),
            ));
        }
        if !undecidable.is_empty() && self.coordinator.restores == 0 {
            return Err((
                "liveness",
                format!(
                    "attempts in doubt for ever {undecidable:?}, but the coordinator's disk was \
                     never put back from a copy: a log that only crashed can answer every \
                     attempt it began"
                ),
            ));
        }
        for gtid in self.coordinator.attempts.keys() {
            let decision = self.coordinator.durable_decisions.get(gtid).copied();
            let committed = self
                .ended_at(gtid)
                .filter(|(_, e)| *e == Ended::Committed)
                .count();
            let in_doubt = undecidable.iter().filter(|(_, g)| g == gtid).count();
            let resolved = match decision {
                Some(Decision::Commit) => committed + in_doubt == self.participants.len(),
                Some(Decision::Abort) | None => committed == 0,
            };
            if !resolved {
                return Err((
                    "liveness",
                    format!(
                        "{gtid}: durable decision {decision:?} but {committed} of {} participants \
                         committed ({in_doubt} in doubt for ever) after the run went quiet",
                        self.participants.len()
                    ),
                ));
            }
        }
        Ok(())
    }
}
