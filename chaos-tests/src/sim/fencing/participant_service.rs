//! The participant as its runtime runs the pure engine: an answer leaves once the forced
//! records of its step are durable (the mutations answer early), syncs feed the fence's
//! durable history, a crash restores from the snapshot and log (its clock read anew, so
//! stepped), and ticks let the retention prune.

use participant::fence::{FencedAnswer, FencedWrite};
use participant::kv::KvStore;
use participant::record::Record;
use participant::{Command, Engine, Event, Rejection, Reply, Write};
use protocol::outbox::Intent;

use crate::sim::fencing_adversary::Forged;

use super::{Applied, FencingMutation, Payload, RESTART_STEP_MS, World, config};

/// The intent worker `worker`'s write `op_id` records: one per write, in the worker's
/// aggregate, so the aggregate's seqs follow the order its writes were applied in.
pub(super) fn intent_of(op_id: &str, worker: usize) -> Intent {
    Intent {
        event_id: format!("evt-{op_id}"),
        aggregate: format!("agg-w{worker}"),
        target: "next-step".into(),
        kind: "step.v1".into(),
        body: serde_json::json!({ "after": op_id }),
    }
}

impl World {
    /// One participant step for a request; its answer leaves once the forced records of the
    /// step are durable (or at once when none was logged).
    pub(super) fn participant_request(
        &mut self,
        event: Event,
        answer_of: impl FnOnce(Reply) -> Payload,
    ) {
        let commands = self.part.step(event);
        let mut logged = false;
        let mut answer = None;
        for command in commands {
            match command {
                Command::Log { record, forced } => {
                    logged |= forced;
                    self.part_log.pending.push(record);
                }
                Command::Reply(reply) => answer = Some(reply),
                Command::Deliver { .. } | Command::AskDecision { .. } => {}
            }
        }
        let Some(reply) = answer else {
            return;
        };
        let early = matches!(
            (self.mutation, &reply),
            (
                FencingMutation::WriteAnswerBeforeDurable,
                Reply::Fenced(FencedAnswer::Applied { .. })
            ) | (
                FencingMutation::StaleAnswerBeforeDurable,
                Reply::Fenced(FencedAnswer::Stale(_))
            )
        );
        let payload = answer_of(reply);
        if logged && !early {
            self.part_waiting.push(payload);
        } else {
            self.send(payload);
        }
    }

    pub(super) fn fenced_request(
        &mut self,
        worker: Option<usize>,
        write: FencedWrite,
        forged: Option<Forged>,
    ) {
        let op_id = write.op_id.clone();
        let now_ms = self.part_now();
        // A worker's write is a workflow step: it records its next intent with it (the
        // outbox); the forger's carry none.
        let event = match worker {
            Some(worker) => Event::Write {
                write: Write {
                    next: vec![intent_of(&op_id, worker)],
                    ..Write::from(write)
                },
                now_ms,
            },
            None => Event::FencedWrite { write, now_ms },
        };
        self.participant_request(event, |reply| match (reply, worker) {
            (Reply::Fenced(answer), Some(worker)) => Payload::Written {
                worker,
                op_id,
                answer,
            },
            (Reply::Fenced(answer), None) => match forged {
                Some(forged) => Payload::ForgedAnswered {
                    op_id,
                    forged,
                    answer,
                },
                None => Payload::Refused {
                    op_id,
                    forged,
                    rejection: Rejection::InvalidPayload("an answer for nobody".into()),
                },
            },
            (Reply::Reject(rejection), _) => Payload::Refused {
                op_id,
                forged,
                rejection,
            },
            (other, _) => Payload::Refused {
                op_id,
                forged,
                rejection: Rejection::InvalidPayload(format!("unexpected answer {other:?}")),
            },
        });
    }

    fn note_durable(&mut self, records: &[Record]) {
        for record in records {
            match record {
                Record::FencedWrite {
                    op_id, token, next, ..
                } => self.history.push(Applied::Write {
                    token: *token,
                    op_id: op_id.clone(),
                    at: self.now,
                    intents: next.iter().map(|i| i.event_id.clone()).collect(),
                }),
                Record::FenceReset(reset) => self.history.push(Applied::Reset { to: reset.to }),
                _ => {}
            }
        }
    }

    pub(super) fn sync_participant(&mut self) {
        let pending = std::mem::take(&mut self.part_log.pending);
        self.note_durable(&pending);
        self.part_log.durable.extend(pending);
        for answer in std::mem::take(&mut self.part_waiting) {
            self.send(answer);
        }
        if self.rng.u32(0..20) == 0 {
            self.part_snapshot = Some(self.part.snapshot().expect("a sim store always encodes"));
            self.part_log.durable.clear();
        }
    }

    pub(super) fn crash_participant(&mut self) -> Result<(), String> {
        let pending = std::mem::take(&mut self.part_log.pending);
        let kept = self.rng.usize(0..=pending.len());
        let kept: Vec<Record> = pending.into_iter().take(kept).collect();
        self.note_durable(&kept);
        self.part_log.durable.extend(kept);
        self.part_waiting.clear();
        self.reset_waiting = false;
        let config = config(&self.keys);
        let mut engine = match &self.part_snapshot {
            Some(snapshot) => {
                Engine::restore(config, snapshot.clone()).map_err(|e| e.to_string())?
            }
            None => Engine::new(config, KvStore::new()),
        };
        for record in self.part_log.durable.clone() {
            engine.replay(record).map_err(|e| e.to_string())?;
        }
        self.part = engine;
        // The restarted process reads the wall clock anew: it may have stepped either way.
        self.step_clock(RESTART_STEP_MS);
        self.stats.crashes += 1;
        Ok(())
    }

    pub(super) fn step_clock(&mut self, max_ms: u64) {
        let step = self.rng.i64(-(max_ms as i64)..=max_ms as i64);
        self.clock_offset = self.clock_offset.saturating_add(step);
    }

    pub(super) fn tick_participant(&mut self) {
        let before = self.part.fences().pruned();
        self.part.step(Event::Tick {
            now_ms: self.part_now(),
        });
        let after = self.part.fences().pruned();
        self.stats.pruned += (after.highest + after.answers) - (before.highest + before.answers);
    }
}
