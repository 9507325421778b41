//! The coordinator's shell: each engine step's records made durable before its other commands
//! run (the mutation replies at once), the fsyncs in log order, and the calls it makes to the
//! participants, each settled by the first of its answer and its timeout.

use coordinator::records::{LogRecord, SagaRecord};
use coordinator::saga::engine::{SagaCommand, SagaEvent, SagaReply};
use protocol::saga::{OpKind, SagaOpRequest};
use protocol::{Epoch, TxId};

use super::{Call, Msg, NAMES, SagaMutation, Unsynced, World};

impl World {
    pub(super) fn step_coordinator(&mut self, event: SagaEvent) {
        let Some(engine) = self.coordinator.as_mut() else {
            return;
        };
        let commands = engine.step(event);
        let (records, mut rest): (Vec<_>, Vec<_>) = commands
            .into_iter()
            .partition(|c| matches!(c, SagaCommand::Append(_)));
        if self.mutation == Some(SagaMutation::CoordinatorRepliesBeforeDurable) {
            let (replies, others): (Vec<_>, Vec<_>) = rest
                .into_iter()
                .partition(|c| matches!(c, SagaCommand::Reply { .. }));
            rest = others;
            for reply in replies {
                self.execute(reply);
            }
        }
        if records.is_empty() {
            for command in rest {
                self.execute(command);
            }
            return;
        }
        // The shell: the step's records durable first, then the rest.
        let records: Vec<LogRecord> = records
            .into_iter()
            .filter_map(|c| match c {
                SagaCommand::Append(record) => Some(record),
                _ => None,
            })
            .collect();
        let stamps = self.stamp(&records);
        self.unsynced.push_back(Unsynced::Step {
            records,
            commands: rest,
            stamps,
        });
        self.schedule_coordinator_sync();
    }

    pub(super) fn schedule_coordinator_sync(&mut self) {
        let (at, after) = self.sync_delay(self.synced_at);
        self.synced_at = at;
        self.schedule(after, Msg::CoordinatorSynced { run: self.run });
    }

    /// The oldest unsynced write at the coordinator is durable.
    pub(super) fn coordinator_synced(&mut self) {
        match self.unsynced.pop_front() {
            Some(Unsynced::Step {
                records,
                commands,
                stamps,
            }) => {
                let ids = records
                    .iter()
                    .filter_map(|r| match r {
                        LogRecord::Saga(record) => Some(record.saga_id().clone()),
                        _ => None,
                    })
                    .collect();
                self.stats.timeouts += records
                    .iter()
                    .filter(|r| matches!(r, LogRecord::Saga(SagaRecord::TimedOut(_))))
                    .count() as u64;
                self.log.extend(records);
                for stamp in stamps {
                    if let Some(c) = self.counted.get_mut(&stamp.id) {
                        c.durable = c.durable.max(stamp.counted);
                        c.begin_durable |= stamp.begin;
                        c.settled_durable |= stamp.settles;
                    }
                }
                let now_ms = self.coordinator_now();
                self.step_coordinator(SagaEvent::Durable { ids, now_ms });
                for command in commands {
                    self.execute(command);
                }
            }
            Some(Unsynced::Checkpoint(table, stamps)) => {
                self.checkpoint = table;
                self.log.clear();
                for (id, counted) in stamps {
                    if let Some(c) = self.counted.get_mut(&id) {
                        c.durable = c.durable.max(counted);
                    }
                }
            }
            None => {}
        }
    }

    fn execute(&mut self, command: SagaCommand) {
        match command {
            SagaCommand::Append(_) => {}
            SagaCommand::Reply { reply, .. } => match reply {
                SagaReply::Saga(view) if view.state.is_terminal() => {
                    self.heard.entry(view.id.clone()).or_insert(view);
                }
                SagaReply::Accepted(view) => {
                    self.accepted.insert(view.id);
                }
                _ => {}
            },
            SagaCommand::ArmRetry { id, after_ms } => {
                let event = SagaEvent::RetryDue { id, now_ms: 0 };
                self.schedule(
                    after_ms,
                    Msg::Timer {
                        run: self.run,
                        event,
                    },
                );
            }
            SagaCommand::ArmDeadline { id, after_ms } => {
                let event = SagaEvent::DeadlineDue { id, now_ms: 0 };
                self.schedule(
                    after_ms,
                    Msg::Timer {
                        run: self.run,
                        event,
                    },
                );
            }
            SagaCommand::Send {
                id,
                step,
                kind,
                participant,
                op_id,
                payload,
                timeout_ms,
                ..
            } => {
                let call = self.new_call(&id, step, Some(kind));
                let to = NAMES
                    .iter()
                    .position(|n| *n == participant.as_str())
                    .unwrap_or(0);
                let step_name = self
                    .requests
                    .iter()
                    .find(|(r, _)| r.id == id)
                    .map(|(r, _)| r.steps[step].name.clone())
                    .unwrap_or_default();
                let request = SagaOpRequest {
                    saga_id: id,
                    step: step_name,
                    op_id,
                    coordinator_id: self.coordinator_id.clone(),
                    epoch: Epoch(self.run),
                    payload,
                };
                self.schedule(timeout_ms, Msg::CallTimeout { call });
                self.send(Msg::Op {
                    call,
                    to,
                    kind,
                    request,
                });
            }
            SagaCommand::Probe {
                id,
                step,
                participant,
                op_id,
                timeout_ms,
            } => {
                let call = self.new_call(&id, step, None);
                let to = NAMES
                    .iter()
                    .position(|n| *n == participant.as_str())
                    .unwrap_or(0);
                self.schedule(timeout_ms, Msg::CallTimeout { call });
                self.send(Msg::Probe { call, to, op_id });
            }
        }
    }

    fn new_call(&mut self, id: &TxId, step: usize, kind: Option<OpKind>) -> u64 {
        self.next_call += 1;
        let call = Call {
            run: self.run,
            id: id.clone(),
            step,
            kind,
        };
        self.calls.insert(self.next_call, call);
        self.next_call
    }

    /// The first of answer and timeout settles a call; later ones are ignored.
    pub(super) fn settle(&mut self, call: u64) -> Option<Call> {
        let found = self.calls.remove(&call)?;
        (found.run == self.run && self.coordinator.is_some()).then_some(found)
    }
}
