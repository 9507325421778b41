//! Rebuilding the engine from the checkpoint snapshot and the records after it, and, once this
//! run's epoch is durable, finishing what the log left open (`RecoveryDone`).
//!
//! Replay is idempotent and total: records about a transaction the snapshot already ended, or
//! an Ack after an End, change nothing, so recovering twice (a crash during recovery) gives the
//! same table.

use protocol::{Decision, TxId, VoteKind};

use crate::engine::io::Command;
use crate::engine::rules::send_decisions;
use crate::engine::tx::{Decided, Part, Phase, Tx};
use crate::engine::{Engine, EngineConfig};
use crate::records::{BeginRecord, EpochRecord, LogRecord, Retained, Snapshot};

/// The result of replay: the table, and the identity of the last run (none on a new log).
#[derive(Debug)]
pub struct Replayed {
    pub engine: Engine,
    pub identity: Option<EpochRecord>,
}

impl Engine {
    /// Replays a snapshot and the records logged after it. Follow with `Event::RecoveryDone`
    /// once the new epoch is durable.
    pub fn replay(
        config: EngineConfig,
        snapshot: Option<Snapshot>,
        records: impl IntoIterator<Item = LogRecord>,
    ) -> Replayed {
        let mut engine = Engine::empty(config);
        let mut identity = None;
        if let Some(snapshot) = snapshot {
            for span in snapshot.runs {
                engine.runs.insert(span.incarnation, span);
            }
            engine.note_run(&snapshot.identity);
            engine.behind = snapshot.behind;
            identity = Some(snapshot.identity);
            for begun in snapshot.begun {
                engine.replay_begin(begun);
            }
            for live in snapshot.decided {
                engine.note_attempt(&live.decision.attempt);
                let mut tx = Tx::from_decision(&live.decision);
                for part in &mut tx.parts {
                    part.acked = live.acked.contains(&part.name);
                }
                engine.live.insert(tx.id.clone(), tx);
            }
            for retained in snapshot.retained {
                engine.note_attempt(&retained.decision.attempt);
                engine.retained.insert(retained);
            }
            engine.operator = super::operator::OperatorState::restore(super::OperatorSnapshot {
                resolved: snapshot.resolved,
                audit: snapshot.audit,
                next_seq: snapshot.audit_next_seq,
                hand_resolved: snapshot.hand_resolved_sagas,
            });
        }
        for record in records {
            match record {
                LogRecord::Epoch(epoch) => {
                    engine.note_run(&epoch);
                    identity = Some(epoch);
                }
                LogRecord::Begin(begin) => engine.replay_begin(begin),
                LogRecord::Decision(decision) => {
                    engine.note_attempt(&decision.attempt);
                    // A decision for an id that already ended in this log is a new transaction
                    // reusing a forgotten id (retention passed or `retained_max` dropped it):
                    // the later record wins, as it did when it was written.
                    engine.retained.remove(&decision.txid);
                    let tx = Tx::from_decision(&decision);
                    engine.live.insert(tx.id.clone(), tx);
                }
                LogRecord::Ack(ack) => {
                    if let Some(part) = engine
                        .live
                        .get_mut(&ack.txid)
                        .filter(|tx| matches!(tx.phase, Phase::Decided(_)))
                        .and_then(|tx| tx.part_mut(&ack.participant))
                    {
                        part.acked = true;
                    }
                }
                LogRecord::End(end) => engine.replay_end(&end.txid, end.ended_at_ms),
                LogRecord::Behind(behind) => {
                    engine.behind.get_or_insert(behind);
                }
                LogRecord::Audit(entry) => engine.apply_audit(entry),
                // Sagas replay into their own table (`SagaEngine::replay`).
                LogRecord::Saga(_) => {}
                // The lease service replays its own records (`runtime::start`).
                LogRecord::Lease(_) => {}
            }
        }
        engine.loads.recount(engine.live.values());
        Replayed { engine, identity }
    }

    fn replay_begin(&mut self, begin: BeginRecord) {
        self.note_attempt(&begin.attempt);
        if self.live.contains_key(&begin.txid) {
            return;
        }
        // As for decisions: a Begin after the id ended is a new transaction with that id.
        self.retained.remove(&begin.txid);
        let tx = Tx {
            id: begin.txid.clone(),
            attempt: begin.attempt,
            digest: begin.digest,
            created_at_ms: begin.created_at_ms,
            parts: begin.participants.into_iter().map(Part::new).collect(),
            phase: Phase::Preparing,
            waiters: Vec::new(),
            client: begin.client,
        };
        self.live.insert(begin.txid, tx);
    }

    fn replay_end(&mut self, txid: &TxId, ended_at_ms: u64) {
        let Some(tx) = self.live.remove(txid) else {
            return;
        };
        match &tx.phase {
            Phase::Decided(decided) => {
                let decision = tx.decision_record(decided);
                self.retained.insert(Retained {
                    decision,
                    ended_at_ms,
                });
            }
            // An End is only logged after a durable decision; keep anything else live so
            // recovery aborts it rather than forgetting it.
            Phase::Preparing | Phase::Deciding(_) | Phase::LogFailed { .. } => {
                self.live.insert(txid.clone(), tx);
            }
        }
    }

    /// Everything recovery needs, for a checkpoint. A decision that is submitted but not yet
    /// durable goes in as decided: the checkpoint follows it in the log, so whenever the
    /// checkpoint survives a crash, the decision did too.
    pub fn snapshot(&self, identity: EpochRecord) -> Snapshot {
        let mut snapshot = self.snapshot_live(identity);
        snapshot.retained = self.retained.iter().cloned().collect();
        snapshot
    }

    fn snapshot_live(&self, identity: EpochRecord) -> Snapshot {
        let mut snapshot = Snapshot {
            identity,
            runs: self.runs.values().copied().collect(),
            begun: Vec::new(),
            decided: Vec::new(),
            behind: self.behind.clone(),
            retained: Vec::new(),
            resolved: Vec::new(),
            audit: Vec::new(),
            audit_next_seq: 0,
            hand_resolved_sagas: Vec::new(),
            // The runtime fills in the saga table's copy (taken under the same lock order).
            sagas: Vec::new(),
            // Filled in by the lease service, under its own lock (`Core::checkpoint`).
            leases: Default::default(),
        };
        let (operator, clears_behind) = self.operator_covered();
        if clears_behind {
            snapshot.behind = None;
        }
        snapshot.resolved = operator.resolved;
        snapshot.audit = operator.audit;
        snapshot.audit_next_seq = operator.next_seq;
        snapshot.hand_resolved_sagas = operator.hand_resolved;
        for tx in self.live.values() {
            match &tx.phase {
                Phase::Preparing | Phase::LogFailed { .. } => snapshot.begun.push(BeginRecord {
                    txid: tx.id.clone(),
                    attempt: tx.attempt.clone(),
                    digest: tx.digest,
                    participants: tx.parts.iter().map(|p| p.name.clone()).collect(),
                    created_at_ms: tx.created_at_ms,
                    client: tx.client.clone(),
                }),
                Phase::Deciding(decided) | Phase::Decided(decided) => {
                    snapshot.decided.push(crate::records::LiveDecided {
                        decision: tx.decision_record(decided),
                        acked: tx
                            .parts
                            .iter()
                            .filter(|p| p.acked)
                            .map(|p| p.name.clone())
                            .collect(),
                    })
                }
            }
        }
        snapshot
    }

    /// After replay: abort what was begun and never decided, resend what was decided and not
    /// acknowledged, end what was fully acknowledged.
    pub(super) fn recovery_done(&mut self, now_ms: u64) -> Vec<Command> {
        // Everything staged (from the snapshot and the End records replayed) is archived
        // again: some of it may be in the index already, and upserts make that harmless.
        let mut commands: Vec<Command> = self
            .retained
            .iter()
            .cloned()
            .map(Command::Archive)
            .collect();
        let ids: Vec<TxId> = self.live.keys().cloned().collect();
        for txid in ids {
            let Some(tx) = self.live.get_mut(&txid) else {
                continue;
            };
            match tx.phase.clone() {
                Phase::Preparing => {
                    for part in tx.parts.iter_mut().filter(|p| p.vote.is_none()) {
                        part.vote = Some(VoteKind::Timeout);
                    }
                    let decided = Decided {
                        decision: Decision::Abort,
                        reason: Some("the coordinator restarted before deciding".into()),
                        decided_at_ms: now_ms,
                    };
                    commands.push(Command::AppendDecision(tx.decision_record(&decided)));
                    tx.phase = Phase::Deciding(decided);
                }
                Phase::Decided(decided) if tx.all_acked() => {
                    commands.extend(self.end(&txid, &decided, now_ms));
                }
                Phase::Decided(decided) => {
                    commands.extend(send_decisions(tx, decided.decision));
                    // An abort nobody voted yes to is owed to nobody: it ends now.
                    if tx.all_acked() {
                        commands.extend(self.end(&txid, &decided, now_ms));
                    }
                }
                // Neither exists right after replay: replay builds only Preparing and Decided.
                Phase::Deciding(_) | Phase::LogFailed { .. } => {}
            }
        }
        commands
    }
}
