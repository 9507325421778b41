//! Executing what the engine returns: appends are submitted to the log while the engine
//! lock is held (the log's order is the engine's order), then sends, timers, archives and
//! replies run in order, and a decision is acted on only once its forced append is durable.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tracing::warn;

use wal::{Durability, RecordType};

use super::Core;
use super::durable::PendingDecision;
use super::sends::{DecisionJob, PrepareJob};
use crate::engine::{Command, Engine, Event};
use crate::records::LogRecord;

impl Core {
    /// Steps the engine and executes its commands in order.
    pub fn apply(self: &Arc<Self>, event: Event) {
        self.apply_with(|engine| engine.step(event));
    }

    /// Runs `step` (which reads and steps the engine) under the engine lock, then executes the
    /// commands it returned in order.
    pub(super) fn apply_with(self: &Arc<Self>, step: impl FnOnce(&mut Engine) -> Vec<Command>) {
        let mut decisions = Vec::new();
        let mut epochs = Vec::new();
        let commands = {
            let mut engine = self.lock_engine();
            let commands = step(&mut engine);
            self.live_transactions
                .store(engine.live_count(), Ordering::Relaxed);
            // Submitted under the lock: the log's order is the engine's order.
            for command in &commands {
                match command {
                    Command::AppendLazy(record) => {
                        match record {
                            LogRecord::Begin(_) => crash_point!("coordinator::before_first_record"),
                            LogRecord::End(_) => crash_point!("coordinator::before_end_record"),
                            LogRecord::Epoch(_)
                            | LogRecord::Decision(_)
                            | LogRecord::Ack(_)
                            | LogRecord::Behind(_)
                            | LogRecord::Audit(_)
                            | LogRecord::Saga(_)
                            | LogRecord::Lease(_) => {}
                        }
                        // Nobody waits on these. An `End` need not wake the log's writer
                        // either: it goes out with the next batch, or 10 ms later, and a crash
                        // that loses it only has the restart end the transaction again. The
                        // others reach the page cache as soon as the writer can put them there,
                        // so that a killed process's restart still knows them: every `Begin`
                        // whose prepares went out (aborted at once, without waiting to be asked)
                        // and every ack a `?wait=acked` answer already reported.
                        let durability = match record {
                            LogRecord::End(_) => Durability::Background,
                            _ => Durability::Lazy,
                        };
                        let ticket = self.wal.submit(
                            RecordType(record.record_type()),
                            record.encode(),
                            durability,
                        );
                        // A failure poisons the log, which the housekeeping task reports and the
                        // API turns into 503s.
                        drop(ticket);
                    }
                    Command::AppendDecision(decision) => {
                        crash_point!("coordinator::before_decision_durable");
                        let record = LogRecord::Decision(decision.clone());
                        let ticket = self.wal.submit(
                            RecordType(record.record_type()),
                            record.encode(),
                            Durability::Forced,
                        );
                        decisions.push((decision.txid.clone(), decision.decision, ticket));
                    }
                    Command::AppendForced(record) => {
                        // Nobody waits on it: losing it in a crash only means learning it again.
                        drop(self.wal.submit(
                            RecordType(record.record_type()),
                            record.encode(),
                            Durability::Forced,
                        ));
                    }
                    Command::AppendEpoch(raised) => {
                        let record = LogRecord::Epoch(raised.clone());
                        let ticket = self.wal.submit(
                            RecordType(record.record_type()),
                            record.encode(),
                            Durability::Forced,
                        );
                        epochs.push((raised.clone(), ticket));
                    }
                    Command::SendPrepare { .. }
                    | Command::ArmPrepareDeadline { .. }
                    | Command::SendDecision { .. }
                    | Command::ArmRetry { .. }
                    | Command::Reply { .. }
                    | Command::Archive(_) => {}
                }
            }
            commands
        };
        for command in commands {
            self.execute(command);
        }
        for (raised, ticket) in epochs {
            tokio::spawn(Arc::clone(self).raise_when_durable(raised, ticket));
        }
        for (txid, decision, ticket) in decisions {
            let pending = PendingDecision {
                txid,
                decision,
                ticket,
                submitted: Instant::now(),
            };
            if let Err(unsent) = self.decisions.send(pending) {
                // Only once the waiter is gone (the core is being dropped): nobody acts on the
                // decision in this run; the next start finishes it from the log.
                let unsent = unsent.0;
                warn!(txid = %unsent.txid, "the decision waiter is gone; the decision stays in the log");
            }
        }
    }

    fn execute(self: &Arc<Self>, command: Command) {
        match command {
            // Submitted while the engine lock was held.
            Command::AppendLazy(_)
            | Command::AppendDecision(_)
            | Command::AppendForced(_)
            | Command::AppendEpoch(_) => {}
            Command::Archive(retained) => {
                if self.archive.send(retained).is_err() {
                    // Only when the archiver is gone (shutting down): the outcome stays staged,
                    // in the next checkpoint, and the next start archives it.
                    warn!("the outcome archiver is gone; the outcome stays staged");
                }
            }
            Command::SendPrepare {
                txid,
                attempt,
                participant,
                payload,
                timeout_ms,
                started_at_ms,
                named,
            } => {
                self.send_prepare(PrepareJob {
                    txid,
                    attempt,
                    participant,
                    payload,
                    timeout_ms,
                    started_at_ms,
                    named,
                });
            }
            Command::ArmPrepareDeadline { txid, after_ms } => {
                self.deadlines.arm(txid, after_ms);
            }
            Command::SendDecision {
                txid,
                gtid,
                participant,
                decision,
                attempt,
                tracked: true,
            } => {
                let from_recovery = self.recovering.load(Ordering::Relaxed);
                self.send_decision(DecisionJob {
                    txid,
                    gtid,
                    participant,
                    decision,
                    attempt,
                    from_recovery,
                });
            }
            Command::SendDecision {
                txid,
                gtid,
                participant,
                decision,
                tracked: false,
                ..
            } => {
                tokio::spawn(Arc::clone(self).notify_once(txid, gtid, participant, decision));
            }
            Command::ArmRetry {
                txid,
                participant,
                after_ms,
            } => {
                let core = Arc::clone(self);
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(after_ms)).await;
                    core.apply(Event::RetryDue { txid, participant });
                });
            }
            Command::Reply { waiter, reply } => {
                if let Some(sender) = self.lock_waiters().remove(&waiter) {
                    // The client may have gone away; the outcome stays queryable.
                    let _ = sender.send(reply);
                }
            }
        }
    }
}
