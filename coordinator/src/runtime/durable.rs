//! Decisions waiting for their forced append: one task waits on every ticket, in log order,
//! and steps the engine once for all the decisions one fsync made durable.
//!
//! A task of their own per decision cost a spawn, a wake and an engine lock per transaction
//! (issue 28: the coordinator's CPU per transaction is what the cluster is short of); one
//! waiter in log order costs a wake per fsync. Log order loses nothing: the writer makes
//! records durable in the order they were submitted, so by the time the oldest waiting ticket
//! resolves, every later one of the same group commit has too, and nothing behind a ticket
//! that is not yet durable could have been answered sooner. Each decision is still acted on
//! only once its own ticket said durable (`DecisionDurable`), or failed (`DecisionFailed`).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Weak;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use tokio::sync::mpsc::UnboundedReceiver;
use tracing::error;

use protocol::{Decision, TxId};
use wal::{AppendTicket, WalError};

use super::Core;
use crate::engine::Event;

/// A decision record submitted to the log (`Command::AppendDecision`), not yet durable.
#[derive(Debug)]
pub(super) struct PendingDecision {
    pub(super) txid: TxId,
    pub(super) decision: Decision,
    pub(super) ticket: AppendTicket,
    pub(super) submitted: Instant,
}

/// Runs until the core is dropped (its sender with it). Holds the core weakly, as the archiver
/// does: the core owns the sender.
pub(super) async fn decision_waiter(
    core: Weak<Core>,
    mut submitted: UnboundedReceiver<PendingDecision>,
) {
    let mut waiting: VecDeque<PendingDecision> = VecDeque::new();
    loop {
        if waiting.is_empty() {
            match submitted.recv().await {
                Some(pending) => waiting.push_back(pending),
                None => return,
            }
        }
        let Some(mut oldest) = waiting.pop_front() else {
            continue;
        };
        let outcome = (&mut oldest.ticket).await;
        let mut resolved = vec![(oldest, outcome)];
        // Whatever was submitted meanwhile queues behind; those already durable (the rest of
        // this group commit) are taken now, in order, and the first still waiting stops it.
        while let Ok(pending) = submitted.try_recv() {
            waiting.push_back(pending);
        }
        while let Some(next) = waiting.front_mut() {
            let Some(outcome) = resolved_now(&mut next.ticket) else {
                break;
            };
            if let Some(next) = waiting.pop_front() {
                resolved.push((next, outcome));
            }
        }
        let Some(core) = core.upgrade() else {
            return;
        };
        let events: Vec<Event> = resolved
            .into_iter()
            .map(|(pending, outcome)| core.decision_event(pending, outcome))
            .collect();
        core.apply_with(|engine| events.into_iter().flat_map(|e| engine.step(e)).collect());
    }
}

/// The ticket's outcome if the writer has filled it already; never waits.
fn resolved_now(ticket: &mut AppendTicket) -> Option<Result<u64, WalError>> {
    let mut context = Context::from_waker(Waker::noop());
    match Pin::new(ticket).poll(&mut context) {
        Poll::Ready(outcome) => Some(outcome),
        Poll::Pending => None,
    }
}

impl Core {
    /// What the engine is told about one decision once its ticket resolved.
    fn decision_event(&self, pending: PendingDecision, outcome: Result<u64, WalError>) -> Event {
        let PendingDecision {
            txid,
            decision,
            submitted,
            ..
        } = pending;
        match outcome {
            Ok(_) => {
                self.metrics.decision_fsync.observe(submitted.elapsed());
                crash_point!("coordinator::after_decision_durable");
                let counter = match decision {
                    Decision::Commit => &self.metrics.committed,
                    Decision::Abort => &self.metrics.aborted,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(%txid, ?decision, "decision durable");
                Event::DecisionDurable { txid }
            }
            Err(WalError::Closed) => {
                tracing::info!(
                    %txid,
                    "shutting down before the decision was durable; \
                     the next start aborts this transaction"
                );
                Event::DecisionFailed {
                    txid,
                    error: "the coordinator is shutting down".to_string(),
                }
            }
            Err(e) => {
                error!(%txid, error = %e, "LOG FAILED: decision could not be made durable; \
                           this coordinator takes no more transactions until restarted");
                Event::DecisionFailed {
                    txid,
                    error: e.to_string(),
                }
            }
        }
    }
}
