//! The crash-point matrix's scenario helper (used by `chaos-tests/tests/crash_matrix.rs`): a
//! fresh cluster with warm-up orders, arming one crash point on one node so that only new work
//! reaches it, the target order, probes of its state, and the two end states the matrix
//! asserts: "aborted and released" and "committed once" (defined in docs/recovery.md).
//! Panics are the failure mode: this is test code.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use protocol::{DecisionStatus, Outcome, TransactionState};

use crate::scenario::probe::{self, TxView};
use crate::scenario::{ChaosCluster, ChaosOptions, armed};
use cluster::checkout::Order;
use cluster::oracle::ClientOutcome;
use cluster::workload::{OrderResult, WorkloadOptions};

static SERIAL: Mutex<()> = Mutex::new(());

/// Bound for a node to reach its armed crash point.
pub const CRASH_WAIT: Duration = Duration::from_secs(30);
/// Bound for recovery to reach the expected end state after the restart.
pub const RESOLVE_WAIT: Duration = Duration::from_secs(60);

/// One crash-point scenario: its cluster, the point under test, and the lock that keeps
/// scenarios of one test binary from running at the same time.
#[derive(Debug)]
pub struct Scenario {
    pub chaos: ChaosCluster,
    pub point: &'static str,
    _serial: MutexGuard<'static, ()>,
}

impl Scenario {
    /// A fresh cluster that has committed and aborted a few warm-up orders.
    pub fn start(point: &'static str) -> Scenario {
        let serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let mut chaos = ChaosCluster::start(&ChaosOptions::default());
        let warm_up = chaos.orders("warm", 11, 6);
        let mut options = chaos.workload_options();
        options.concurrency = 3;
        chaos.run_orders(warm_up.clone(), options);
        let scenario = Scenario {
            chaos,
            point,
            _serial: serial,
        };
        // A client hears the outcome before phase two is done: wait until every warm-up order
        // is ended at the coordinator and held nowhere, or a scenario's "before" ledgers could
        // miss a warm-up commit still on its way (warm-0 buys the target's product).
        for order in &warm_up {
            scenario.wait_view(order, |v| {
                v.prepared_nowhere()
                    && v.coordinator.as_ref().is_some_and(|s| {
                        matches!(
                            s.state,
                            TransactionState::Committed | TransactionState::Aborted
                        )
                    })
            });
        }
        scenario
    }

    /// The order that hits the crash point: a cold product and customer, one unit, so it votes
    /// yes everywhere unless a crash says otherwise.
    pub fn target(&self, tag: &str) -> Order {
        let config = &self.chaos.config;
        Order {
            id: format!("target-{tag}"),
            sku: config.skus - 1,
            customer: config.customers - 1,
            quantity: 1,
            amount: 7,
        }
    }

    /// Sends `order` once (no resend: the scenario wants what this one attempt heard).
    pub fn send_once(&mut self, order: &Order) -> OrderResult {
        let options = WorkloadOptions {
            retry_window: Duration::ZERO,
            request_timeout: Duration::from_secs(30),
            concurrency: 1,
            ..self.chaos.workload_options()
        };
        self.chaos
            .run_orders(vec![order.clone()], options)
            .pop()
            .expect("one result")
    }

    pub fn arm(&mut self, node: &str) {
        self.chaos.quiesce_and_restart(node, armed(self.point));
    }

    pub fn wait_crash(&mut self, node: &str) {
        self.chaos.wait_crash(node, CRASH_WAIT);
    }

    pub fn view(&self, order: &Order) -> TxView {
        let urls = self.chaos.urls();
        self.chaos
            .runtime
            .block_on(probe::view(&self.chaos.client, &urls, order))
    }

    /// Which of inventory, payments, shipping hold `order` prepared (read while the coordinator
    /// may be down).
    pub fn prepared_at_participants(&self, order: &Order) -> [bool; 3] {
        let urls = self.chaos.urls();
        let mut out = [false; 3];
        for (slot, (_, base)) in out.iter_mut().zip(urls.participants()) {
            let list = self
                .chaos
                .runtime
                .block_on(probe::prepared_at(&self.chaos.client, base));
            *slot = list.iter().any(|p| p.txid.as_str() == order.id);
        }
        out
    }

    pub fn wait_view(&self, order: &Order, done: impl Fn(&TxView) -> bool) -> TxView {
        let urls = self.chaos.urls();
        self.chaos.runtime.block_on(probe::wait_view(
            &self.chaos.client,
            &urls,
            order,
            RESOLVE_WAIT,
            done,
        ))
    }

    /// The coordinator's answer to a decision query for `order`'s attempt; `None` when no
    /// attempt of it is known anywhere (see [`probe::attempt`]).
    pub fn decision(&self, order: &Order) -> Option<DecisionStatus> {
        let urls = self.chaos.urls();
        self.chaos.runtime.block_on(probe::decision(
            &self.chaos.client,
            &self.chaos.peer_client,
            &urls,
            &order.id,
        ))
    }

    pub fn ledgers(&self, order: &Order) -> (i64, i64) {
        let urls = self.chaos.urls();
        self.chaos
            .runtime
            .block_on(probe::ledgers(&self.chaos.client, &urls, order))
    }

    /// Fails with the nodes' logs unless `ok`.
    pub fn check(&self, ok: bool, what: String) {
        assert!(ok, "[{}] {what}\n{}", self.point, self.chaos.logs());
    }

    /// Aborted everywhere with its locks released: nothing applied or prepared, the coordinator
    /// has no commit, the decision query for its attempt says abort (or, when no attempt of it
    /// exists anywhere, the coordinator has no record and invents no outcome), and a new order on
    /// the same product and customer commits.
    pub fn assert_aborted_and_released(&mut self, order: &Order) {
        let view = self.wait_view(order, |v| v.prepared_nowhere());
        self.check(
            view.applied_nowhere() && view.prepared_nowhere(),
            format!(
                "expected {} aborted everywhere, locks released: {view:?}",
                order.id
            ),
        );
        let logged = view.coordinator.as_ref().and_then(|s| s.outcome);
        self.check(
            logged != Some(Outcome::Committed),
            format!("coordinator logged commit for {}: {view:?}", order.id),
        );
        match self.decision(order) {
            Some(decision) => self.check(
                decision == DecisionStatus::Abort,
                format!(
                    "decision query for {}'s attempt answered {decision:?}, expected abort",
                    order.id
                ),
            ),
            None => {
                // No attempt to ask about: the coordinator has no record and no participant
                // holds it, so no participant can be in doubt about it. A query naming no
                // attempt must not invent an outcome (the coordinator used to presume abort
                // for any id it had not seen; an id is no attempt).
                let urls = self.chaos.urls();
                let bare = self.chaos.runtime.block_on(probe::bare_decision(
                    &self.chaos.peer_client,
                    &urls,
                    &order.id,
                ));
                self.check(
                    view.coordinator.is_none() && bare.decision == DecisionStatus::Unknown,
                    format!(
                        "{} has no attempt anywhere, yet the coordinator has {:?} and a bare \
                         decision query answered {bare:?}",
                        order.id, view.coordinator
                    ),
                );
            }
        }
        let follow_up = Order {
            id: format!("{}-after", order.id),
            ..order.clone()
        };
        let result = self.send_once(&follow_up);
        self.check(
            result.outcome == ClientOutcome::Committed,
            format!(
                "an order on the same keys after recovery did not commit (locks still held?): {result:?}"
            ),
        );
    }

    /// Committed at every participant exactly once and ended at the coordinator.
    pub fn assert_committed_once(&self, order: &Order, ledgers_before: (i64, i64)) {
        let view = self.wait_view(order, |v| {
            v.applied_everywhere()
                && v.prepared_nowhere()
                && v.coordinator.as_ref().map(|s| s.state) == Some(TransactionState::Committed)
        });
        self.check(
            view.applied_everywhere() && view.prepared_nowhere(),
            format!(
                "expected {} committed at every participant: {view:?}",
                order.id
            ),
        );
        self.check(
            view.coordinator.as_ref().map(|s| s.state) == Some(TransactionState::Committed),
            format!(
                "expected the coordinator to end {} committed: {view:?}",
                order.id
            ),
        );
        let (sold, spent) = self.ledgers(order);
        let expected = (
            ledgers_before.0 + order.quantity,
            ledgers_before.1 + order.amount,
        );
        self.check(
            (sold, spent) == expected,
            format!(
                "{} applied other than once: sold/spent {:?} -> {:?}, expected {expected:?}",
                order.id,
                ledgers_before,
                (sold, spent)
            ),
        );
        let decision = self.decision(order);
        self.check(
            decision == Some(DecisionStatus::Commit),
            format!(
                "decision query for {}'s attempt answered {decision:?}, expected commit",
                order.id
            ),
        );
    }

    pub fn finish(self) {
        let report = self.chaos.assert_audit(self.point);
        assert!(
            report.applied + report.absent == self.chaos.record.len(),
            "[{}] audit covered {} of {} orders",
            self.point,
            report.applied + report.absent,
            self.chaos.record.len()
        );
    }
}

/// `wal::between_write_and_fsync` armed to stall instead of crash: the log writer stops after
/// writing a batch, before its fsync, for as long as the process lives (a disk that never
/// finishes the fsync). Nothing may leave the process on the strength of that batch.
pub fn stalled_fsync(skip: u32) -> Vec<(String, String)> {
    let actions = if skip == 0 {
        "pause".to_string()
    } else {
        format!("{skip}*off->pause")
    };
    vec![(
        "FAILPOINTS".to_string(),
        format!("wal::between_write_and_fsync={actions}"),
    )]
}
