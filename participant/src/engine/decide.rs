//! Phase two: a commit or abort, answered from the prepared set, the lock queue or the
//! tombstones; and the end of a prepared attempt (applied or released, its locks freed, its
//! outcome remembered), which an answer to a decision query comes to as well.

use protocol::{DecisionRequest, GlobalTxId, Vote};

use super::Engine;
use super::sender::{Sender, barrier, check_owner, finish};
use super::types::{Command, Reply};
use super::waits::deliver_all;
use crate::record::Record;
use crate::rejection::Rejection;
use crate::resource::Resource;
use crate::tombstones::Ended;

impl<R: Resource> Engine<R> {
    /// Checks a commit or abort's sender; the attempt and the sender, or the answer to give.
    fn decision_sender(
        &mut self,
        request: DecisionRequest,
    ) -> Result<(GlobalTxId, Sender, bool), Vec<Command>> {
        let DecisionRequest {
            txid: _,
            gtid,
            coordinator_id,
            epoch,
            incarnation,
        } = request;
        let reject = |rejection| vec![Command::Reply(Reply::Reject(rejection))];
        check_owner(&gtid, &coordinator_id).map_err(reject)?;
        let raised = self
            .fence(&coordinator_id, epoch, incarnation)
            .map_err(reject)?;
        Ok((
            gtid,
            Sender {
                coordinator_id,
                epoch,
                incarnation,
            },
            raised,
        ))
    }

    pub(super) fn commit(&mut self, request: DecisionRequest, now_ms: u64) -> Vec<Command> {
        let (gtid, sender, raised) = match self.decision_sender(request) {
            Ok(checked) => checked,
            Err(answer) => return answer,
        };
        let mut commands = Vec::new();
        let reply = if self.waits.contains(&gtid) {
            // It never voted yes here, so no coordinator can have decided commit for it; it
            // keeps waiting.
            not_prepared(
                &gtid,
                "was never prepared here (it is waiting for a lock); it cannot commit".into(),
            )
        } else if self.prepared.contains_key(&gtid) {
            commands.push(self.commit_prepared(&gtid, &sender, now_ms));
            Reply::Ack
        } else {
            match self.tombstones.get(&gtid).map(|r| &r.ended) {
                Some(Ended::Committed) => {
                    commands.push(barrier(&sender));
                    Reply::Ack
                }
                Some(Ended::Aborted) => {
                    not_prepared(&gtid, "was aborted here; it cannot commit".into())
                }
                Some(Ended::Refused { reason }) => not_prepared(
                    &gtid,
                    format!("was refused here ({reason}); it cannot commit"),
                ),
                // A commit decision means this participant voted yes, so it prepared the
                // attempt; with neither the prepared state nor a tombstone left, it ended here
                // and its tombstone was dropped, and only a commit can have ended it (the
                // coordinator's decision is commit). The ack is what the first delivery got.
                None if self.tombstones.may_have_forgotten(&gtid) => {
                    commands.push(barrier(&sender));
                    Reply::Ack
                }
                None => not_prepared(&gtid, "was never prepared here".into()),
            }
        };
        finish(commands, raised, &sender, reply)
    }

    pub(super) fn abort(&mut self, request: DecisionRequest, now_ms: u64) -> Vec<Command> {
        let (gtid, sender, raised) = match self.decision_sender(request) {
            Ok(checked) => checked,
            Err(answer) => return answer,
        };
        let mut commands = Vec::new();
        let reply = if let Some((_, waiter)) = self.waits.remove(&gtid) {
            // The coordinator gave up on it (its deadline, another participant's no): it leaves
            // the queue, and a tombstone makes a late duplicate prepare vote no, as an abort
            // that overtook its prepare does.
            commands.push(self.remember_unprepared_abort(&gtid, &sender, now_ms));
            deliver_all(
                &mut commands,
                waiter.requests,
                &Reply::Vote(Vote::No {
                    reason: format!("attempt {gtid} was aborted while waiting for a lock"),
                }),
            );
            Reply::Ack
        } else if self.prepared.contains_key(&gtid) {
            commands.push(self.abort_prepared(&gtid, &sender, now_ms));
            Reply::Ack
        } else {
            match self.tombstones.get(&gtid).map(|r| &r.ended) {
                Some(Ended::Aborted) => {
                    commands.push(barrier(&sender));
                    Reply::Ack
                }
                // It voted no and holds nothing: the abort is what it expected.
                Some(Ended::Refused { .. }) => Reply::Ack,
                Some(Ended::Committed) => {
                    not_prepared(&gtid, "was committed here; it cannot abort".into())
                }
                // Ended here and forgotten since; a late prepare for it already votes no.
                None if self.tombstones.may_have_forgotten(&gtid) => {
                    commands.push(barrier(&sender));
                    Reply::Ack
                }
                None => {
                    // The abort overtook its prepare: a tombstone makes the late prepare vote no.
                    commands.push(self.remember_unprepared_abort(&gtid, &sender, now_ms));
                    Reply::Ack
                }
            }
        };
        finish(commands, raised, &sender, reply)
    }

    /// An abort for an attempt that is not prepared here (it waited for a lock, or the abort
    /// overtook its prepare): a tombstone makes a late prepare vote no; returns the forced log
    /// command that keeps it across a restart.
    fn remember_unprepared_abort(
        &mut self,
        gtid: &GlobalTxId,
        sender: &Sender,
        now_ms: u64,
    ) -> Command {
        self.tombstones
            .insert(gtid.clone(), Ended::Aborted, None, now_ms);
        Command::Log {
            record: Record::Aborted {
                gtid: gtid.clone(),
                coordinator_id: sender.coordinator_id.clone(),
                epoch: sender.epoch,
                incarnation: sender.incarnation,
                at_ms: now_ms,
            },
            forced: true,
        }
    }

    /// Applies a prepared attempt's commit; returns the forced log command.
    pub(super) fn commit_prepared(
        &mut self,
        gtid: &GlobalTxId,
        sender: &Sender,
        now_ms: u64,
    ) -> Command {
        self.end_prepared(gtid, now_ms, Ended::Committed);
        Command::Log {
            record: Record::Committed {
                gtid: gtid.clone(),
                coordinator_id: sender.coordinator_id.clone(),
                epoch: sender.epoch,
                incarnation: sender.incarnation,
                at_ms: now_ms,
            },
            forced: true,
        }
    }

    pub(super) fn abort_prepared(
        &mut self,
        gtid: &GlobalTxId,
        sender: &Sender,
        now_ms: u64,
    ) -> Command {
        self.end_prepared(gtid, now_ms, Ended::Aborted);
        Command::Log {
            record: Record::Aborted {
                gtid: gtid.clone(),
                coordinator_id: sender.coordinator_id.clone(),
                epoch: sender.epoch,
                incarnation: sender.incarnation,
                at_ms: now_ms,
            },
            forced: true,
        }
    }

    /// Takes `gtid` out of the prepared set, applies or releases it, unlocks its keys and
    /// remembers the outcome with the payload's digest. An attempt not prepared is left alone.
    pub(super) fn end_prepared(&mut self, gtid: &GlobalTxId, at_ms: u64, ended: Ended) {
        let Some(prepared) = self.prepared.remove(gtid) else {
            return;
        };
        self.locks.release(gtid, &prepared.keys);
        // Its keys are free: a waiter may be granted at the end of this step.
        self.waits.changed = true;
        match &ended {
            Ended::Committed => {
                self.resource.apply(prepared.staged);
                // Parsed when it prepared, so it parses now.
                for claim in crate::fence::claims_in(&prepared.payload).unwrap_or_default() {
                    self.fences.accept(&claim, at_ms);
                }
            }
            Ended::Aborted | Ended::Refused { .. } => self.resource.release(prepared.staged),
        }
        self.tombstones
            .insert(gtid.clone(), ended, Some(prepared.digest), at_ms);
    }
}

fn not_prepared(gtid: &GlobalTxId, why: String) -> Reply {
    Reply::Reject(Rejection::NotPrepared {
        gtid: gtid.clone(),
        why,
    })
}
