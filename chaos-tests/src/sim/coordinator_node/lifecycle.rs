//! The process's life: a (re)start through replay with a fresh incarnation and the next
//! epoch, crashes that keep what the disk kept, a clean stop, the operator's copy and its
//! restore, checkpoints, and what each disk sync makes durable (the ground truth the checks
//! keep across all of it).

use coordinator::engine::{Engine, Event};
use coordinator::records::{EpochRecord, LogRecord};
use protocol::{CoordinatorId, Decision, Epoch};

use protocol::operator::{AuditAction, AuditEntry};

use super::{COORDINATOR_ID, CoordinatorNode};
use crate::sim::io::Io;

impl CoordinatorNode {
    /// (Re)starts: replay what the disk holds, log the next epoch durably, finish recovery.
    pub fn start(&mut self, io: &mut Io) {
        self.incarnation += 1;
        let replayed = Engine::replay(
            self.config,
            self.disk.snapshot().cloned(),
            self.disk.records().to_vec(),
        );
        // A fresh incarnation, never one the log holds (as `runtime::start` draws it).
        let incarnation = loop {
            let candidate = protocol::Incarnation(io.rng.u64(..));
            if !replayed.engine.runs().any(|r| r.incarnation == candidate) {
                break candidate;
            }
        };
        let identity = match replayed.identity {
            Some(last) => EpochRecord {
                coordinator_id: last.coordinator_id,
                epoch: last.epoch.next(),
                incarnation,
            },
            None => EpochRecord {
                coordinator_id: CoordinatorId::new(COORDINATOR_ID).expect("a constant, valid id"),
                epoch: Epoch(1),
                incarnation,
            },
        };
        // Opening the log fsyncs what survived; the epoch append is forced and awaited.
        self.disk.append(LogRecord::Epoch(identity.clone()));
        let newly = self.disk.sync();
        self.note_durable(&newly);
        io.note(|| {
            format!(
                "coordinator up, epoch {} incarnation {}",
                identity.epoch, identity.incarnation
            )
        });
        self.identity = Some(identity.clone());
        self.engine = Some(replayed.engine);
        // What replay rebuilt (snapshot and End records) plus the index must hold every
        // outcome that ended before the crash.
        self.check_outcomes_held();
        self.step(
            io,
            Event::RecoveryDone {
                now_ms: io.now_ms,
                identity,
            },
        );
        for index in 0..self.participants.len() {
            self.probe(io, index);
        }
    }

    /// Crashes, keeping the durable records and `extra` of the unsynced ones.
    pub fn crash(&mut self, extra: usize) {
        self.disk.crash(extra);
        self.crashes += 1;
        self.stop();
    }

    fn stop(&mut self) {
        self.engine = None;
        self.calls.clear();
        self.waiters.clear();
        self.decision_waits.clear();
        self.audit_waits.clear();
        self.epoch_waits.clear();
        self.sync_scheduled = false;
        // What waited for the batch sender, and the calls in flight, die with the process.
        self.outbox.clear();
        self.flush_armed.clear();
        self.sent_batches.clear();
        // An uncommitted archive batch dies with the process.
        self.archive_batch.clear();
    }

    /// A clean stop: the log is closed, so everything written becomes durable.
    pub fn shutdown(&mut self) {
        if self.is_up() {
            let newly = self.disk.sync();
            self.note_durable(&newly);
            self.stop();
        }
    }

    /// A clean stop, then a copy of the data directory.
    pub fn backup(&mut self) {
        self.shutdown();
        self.backup = Some(self.disk.clone());
        self.backup_index = Some(self.index.clone());
    }

    /// Stops (however it was running) and puts the operator's copy back; `false` when there is
    /// no copy yet.
    pub fn restore(&mut self) -> bool {
        let Some(backup) = self.backup.clone() else {
            return false;
        };
        self.stop();
        self.disk = backup;
        self.index = self.backup_index.clone().unwrap_or_default();
        // Outcomes after the backup are gone with the log that held them (the restore
        // procedure's known loss); the promise starts again from what was restored.
        self.must_hold.clear();
        self.restores += 1;
        true
    }

    pub fn checkpoint(&mut self, io: &mut Io) {
        let (Some(engine), Some(identity)) = (&self.engine, &self.identity) else {
            return;
        };
        let snapshot = engine.snapshot(identity.clone());
        let newly = self.disk.checkpoint(snapshot);
        self.note_durable(&newly);
        io.note(|| "coordinator checkpoint".into());
        self.resolve_durable(io);
    }

    pub fn disk_synced(&mut self, io: &mut Io) {
        self.sync_scheduled = false;
        if !self.is_up() {
            return;
        }
        let newly = self.disk.sync();
        self.note_durable(&newly);
        self.resolve_durable(io);
        self.commit_archive(io);
    }

    fn resolve_durable(&mut self, io: &mut Io) {
        let durable = self.disk.durable_seq();
        let (ready, waiting): (Vec<_>, Vec<_>) = self
            .decision_waits
            .drain(..)
            .partition(|(seq, _)| *seq <= durable);
        self.decision_waits = waiting;
        for (_, txid) in ready {
            self.step(io, Event::DecisionDurable { txid });
        }
        let (ready, waiting): (Vec<_>, Vec<_>) = self
            .audit_waits
            .drain(..)
            .partition(|(seq, _)| *seq <= durable);
        self.audit_waits = waiting;
        if let Some(engine) = &mut self.engine {
            for (_, entry) in ready {
                engine.apply_audit(entry);
            }
        }
        let (ready, waiting): (Vec<_>, Vec<_>) = self
            .epoch_waits
            .drain(..)
            .partition(|(seq, _)| *seq <= durable);
        self.epoch_waits = waiting;
        for (_, raised) in ready {
            io.note(|| format!("coordinator's raised epoch {} is durable", raised.epoch));
            self.raises += 1;
            self.identity = Some(raised.clone());
            self.step(io, Event::EpochDurable { identity: raised });
            for index in 0..self.participants.len() {
                self.probe(io, index);
            }
        }
    }

    fn note_durable(&mut self, records: &[LogRecord]) {
        for record in records {
            let (gtid, txid, decision) = match record {
                LogRecord::Decision(d) => (&d.attempt.gtid, &d.txid, d.decision),
                // An operator's resolution: the world weighs it against what was observed.
                LogRecord::Audit(AuditEntry {
                    action:
                        AuditAction::Resolve {
                            id, gtid, decision, ..
                        },
                    ..
                }) => {
                    self.resolutions.push((gtid.clone(), id.clone(), *decision));
                    continue;
                }
                _ => continue,
            };
            match self.durable_decisions.get(gtid) {
                Some(old) if *old != decision => {
                    self.flipped = Some(format!(
                        "durable decision for {gtid} ({txid}) flipped from {old:?} to {decision:?}"
                    ));
                }
                Some(_) => {}
                None => {
                    self.durable_decisions.insert(gtid.clone(), decision);
                    if decision == Decision::Commit {
                        self.commits_to_check.push(gtid.clone());
                    }
                }
            }
        }
    }
}
