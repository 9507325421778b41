//! Writes outside 2PC and the outbox: one step checks the op id, the intents, the token (when
//! the write is fenced), the locks and the write's conditions, applies it, gives its intents
//! their seqs and logs token, value, answer and intents in one forced record; relays' reports
//! and operators' actions on intents, each forced before its answer; and their replay.

use protocol::lease::FenceClaim;
use protocol::outbox::{IntentMark, IntentRef, IntentState};

use super::Engine;
use super::types::{Command, ReplayError, Reply};
use crate::fence::{FenceRefusal, FencedAnswer, OpIdReused};
use crate::locks::lock_keys;
use crate::outbox::{IntentChange, IntentRequest, RecordedIntent, Write, cut_error, state_name};
use crate::record::Record;
use crate::rejection::Rejection;
use crate::resource::{CheckFailed, Resource};

/// A forced barrier record, then `reply`: the answer leaves only once everything logged before
/// it is durable.
fn barrier(op_id: String, reply: Reply) -> Vec<Command> {
    vec![
        Command::Log {
            record: Record::FencedRepeat { op_id },
            forced: true,
        },
        Command::Reply(reply),
    ]
}

fn reject(rejection: Rejection) -> Vec<Command> {
    vec![Command::Reply(Reply::Reject(rejection))]
}

impl<R: Resource> Engine<R> {
    /// A write, fenced or not, with its intents. `full_receipt`: answer with
    /// [`Resource::write_receipt`] of every key written (`POST /v1/kv`), not the fenced
    /// write's [`Resource::receipt`] (`PUT /v1/kv/{key}`).
    pub(super) fn write(&mut self, write: Write, full_receipt: bool, now_ms: u64) -> Vec<Command> {
        let digest = write.digest();
        match self.fences.repeat(&write.op_id, digest) {
            // The first answer's record (or the state a refusal read) may still be in flight:
            // the repeat waits behind a forced barrier.
            Ok(Some(first)) => return barrier(write.op_id, Reply::Fenced(first.clone())),
            Ok(None) => {}
            Err(OpIdReused) => {
                return reject(Rejection::OpIdConflict { op_id: write.op_id });
            }
        }
        let staged = match self.resource.parse(&write.payload) {
            Ok(staged) => staged,
            Err(e) => return reject(Rejection::InvalidPayload(e.0)),
        };
        if let Err(problem) = write.check_intents() {
            return reject(Rejection::InvalidIntent(problem));
        }
        if let Some(fence) = &write.fence {
            match self.fences.check(fence, &self.config.fence) {
                Ok(()) => {}
                Err(FenceRefusal::Stale(stale)) => {
                    // Forced before the answer: it is the barrier behind which the writes that
                    // raised the highest token become durable, and it keeps the refusal itself
                    // across a crash, so even an operator's later reset of the highest token
                    // cannot let a retry of this write in.
                    let answer = FencedAnswer::Stale(stale.clone());
                    self.fences
                        .remember(&write.op_id, digest, answer.clone(), now_ms);
                    return vec![
                        Command::Log {
                            record: Record::FencedStale {
                                op_id: write.op_id,
                                refusal: stale,
                                digest,
                                at_ms: now_ms,
                            },
                            forced: true,
                        },
                        Command::Reply(Reply::Fenced(answer)),
                    ];
                }
                // A token the resource cannot trust: refused without touching the op id, so a
                // forger cannot take an honest writer's op id either.
                Err(refusal) => return reject(Rejection::FenceRefused(refusal)),
            }
        }
        // After the fence: a stale writer is told stale_token, whatever else it repeats (a
        // paused worker resending a transition another worker already made, intent included).
        if let Some((event_id, op_id)) = write.next.iter().find_map(|intent| {
            self.outbox
                .get(&intent.event_id)
                .map(|entry| (intent.event_id.clone(), entry.op_id.clone()))
        }) {
            return reject(Rejection::EventIdConflict { event_id, op_id });
        }
        let locked = self.resource.lock_keys(&staged);
        let keys = lock_keys(locked.clone(), write.fence.as_slice());
        if let Some((key, holder)) = keys
            .iter()
            .find_map(|key| self.locks.holder(key).map(|h| (key.clone(), h.clone())))
        {
            return reject(Rejection::KeyLocked { key, holder });
        }
        match self.resource.check_write(&staged) {
            Ok(()) => {}
            Err(CheckFailed::Condition(reason)) => {
                return reject(Rejection::ConditionFailed(reason));
            }
            Err(CheckFailed::Other(reason)) => return reject(Rejection::InvalidPayload(reason)),
        }
        let written = if full_receipt {
            self.resource.written_keys(&staged)
        } else {
            locked
        };
        self.resource.apply(staged);
        if let Some(fence) = &write.fence {
            self.fences.accept(fence, now_ms);
        }
        let receipt = if full_receipt {
            self.resource.write_receipt(&written)
        } else {
            self.resource.receipt(&written)
        };
        let refs = self.outbox.next_refs(&write.next);
        let recorded: Vec<RecordedIntent> = write
            .next
            .into_iter()
            .zip(&refs)
            .map(|(intent, r)| RecordedIntent {
                event_id: intent.event_id,
                aggregate: intent.aggregate,
                seq: r.seq,
                target: intent.target,
                kind: intent.kind,
                body: intent.body,
            })
            .collect();
        self.outbox.insert(&write.op_id, &recorded, now_ms);
        let (resource, token) = write
            .fence
            .map_or((String::new(), 0), |f| (f.resource, f.token));
        let answer = FencedAnswer::Applied {
            token,
            receipt: receipt.clone(),
            intents: refs,
        };
        self.fences
            .remember(&write.op_id, digest, answer.clone(), now_ms);
        vec![
            Command::Log {
                record: Record::FencedWrite {
                    op_id: write.op_id,
                    unfenced: resource.is_empty(),
                    resource,
                    token,
                    payload: write.payload,
                    receipt,
                    at_ms: now_ms,
                    next: recorded,
                },
                forced: true,
            },
            Command::Reply(Reply::Fenced(answer)),
        ]
    }

    /// A relay's report or an operator's action on one intent: checked against the intent's
    /// state and its aggregate's order, applied, logged (forced) before the answer. A report
    /// on a settled intent answers it as it stands, behind a barrier, and changes nothing.
    pub(super) fn intent_request(
        &mut self,
        event_id: String,
        request: IntentRequest,
        now_ms: u64,
    ) -> Vec<Command> {
        if let IntentRequest::Retry { operator, reason }
        | IntentRequest::Mark {
            operator, reason, ..
        } = &request
            && let Some(problem) = protocol::operator::operator_fields_problem(operator, reason)
        {
            return reject(Rejection::InvalidOperator(problem));
        }
        if let IntentRequest::Mark { state, .. } = &request
            && !matches!(state, Some(IntentState::Delivered | IntentState::Abandoned))
        {
            return reject(Rejection::InvalidMark(
                "a mark needs \"state\": \"delivered\" or \"abandoned\"".into(),
            ));
        }
        let Some(entry) = self.outbox.get(&event_id) else {
            return reject(Rejection::IntentUnknown { event_id });
        };
        let state = entry.state;
        let settled = matches!(state, IntentState::Delivered | IntentState::Abandoned);
        let unchanged = |entry: &protocol::outbox::OutboxEntry| {
            barrier(
                format!("outbox:{}", entry.event_id),
                Reply::Intent(Box::new(entry.clone())),
            )
        };
        let not_pending = |action, takes| {
            reject(Rejection::IntentNotPending {
                event_id: event_id.clone(),
                state: state_name(state),
                action,
                takes,
            })
        };
        let change = match request {
            IntentRequest::Delivered { .. } | IntentRequest::Attempt { .. } if settled => {
                return unchanged(entry);
            }
            IntentRequest::Delivered { answer } => {
                // A failed intent's delivery is evidence too (a relay that delivered before
                // it learned of the failure): taken, in order like any other.
                if let Some(earlier) = self.outbox.earlier_open(&event_id) {
                    return reject(Rejection::IntentOutOfOrder {
                        event_id: event_id.clone(),
                        aggregate: entry.aggregate.clone(),
                        seq: entry.seq,
                        earlier: earlier.event_id.clone(),
                        earlier_seq: earlier.seq,
                    });
                }
                IntentChange::Delivered { answer }
            }
            IntentRequest::Attempt { error, permanent } => IntentChange::Attempt {
                error: cut_error(&error),
                permanent,
            },
            IntentRequest::Retry { operator, reason } => {
                if state != IntentState::Failed {
                    return not_pending("retry", "failed");
                }
                IntentChange::Operator {
                    to: IntentState::Pending,
                    mark: IntentMark {
                        operator,
                        reason,
                        action: "retry".into(),
                        at_ms: now_ms,
                    },
                }
            }
            IntentRequest::Mark {
                state: to,
                operator,
                reason,
            } => {
                if settled {
                    return not_pending("mark", "pending or failed");
                }
                let to = to.unwrap_or(IntentState::Abandoned);
                IntentChange::Operator {
                    to,
                    mark: IntentMark {
                        operator,
                        reason,
                        action: state_name(to).into(),
                        at_ms: now_ms,
                    },
                }
            }
        };
        self.outbox.apply(&event_id, &change, now_ms);
        let Some(entry) = self.outbox.get(&event_id).cloned() else {
            return reject(Rejection::IntentUnknown { event_id });
        };
        vec![
            Command::Log {
                record: Record::Intent {
                    event_id,
                    change,
                    at_ms: now_ms,
                },
                forced: true,
            },
            Command::Reply(Reply::Intent(Box::new(entry))),
        ]
    }

    /// A logged write, at replay: applied in log order, whatever the highest token is now (the
    /// check passed when it was written), its intents recorded with the seqs they got. Records
    /// after the checkpoint are replayed once each; an op id met twice was reused after
    /// retention took its first answer, and the live engine applied both, so replay does too.
    pub(super) fn replay_write(&mut self, logged: LoggedWrite) -> Result<(), ReplayError> {
        let LoggedWrite {
            op_id,
            fence,
            payload,
            receipt,
            at_ms,
            next,
        } = logged;
        let staged = self
            .resource
            .parse(&payload)
            .map_err(|e| ReplayError::FencedWrite {
                op_id: op_id.clone(),
                reason: e.0,
            })?;
        self.resource.apply(staged);
        let intents: Vec<_> = next.iter().map(RecordedIntent::intent).collect();
        let digest = crate::outbox::write_digest(fence.as_ref(), &payload, &intents);
        if let Some(fence) = &fence {
            self.fences.accept(fence, at_ms);
        }
        self.outbox.insert(&op_id, &next, at_ms);
        let refs = next
            .iter()
            .map(|i| IntentRef {
                event_id: i.event_id.clone(),
                aggregate: i.aggregate.clone(),
                seq: i.seq,
            })
            .collect();
        self.fences.remember_replayed(
            &op_id,
            digest,
            FencedAnswer::Applied {
                token: fence.map_or(0, |f| f.token),
                receipt,
                intents: refs,
            },
            at_ms,
        );
        Ok(())
    }

    /// A logged change to an intent, at replay.
    pub(super) fn replay_intent(&mut self, event_id: &str, change: &IntentChange, at_ms: u64) {
        self.outbox.apply(event_id, change, at_ms);
    }
}

/// A `FencedWrite` record's parts, at replay.
pub(super) struct LoggedWrite {
    pub op_id: String,
    pub fence: Option<FenceClaim>,
    pub payload: serde_json::Value,
    pub receipt: serde_json::Value,
    pub at_ms: u64,
    pub next: Vec<RecordedIntent>,
}
