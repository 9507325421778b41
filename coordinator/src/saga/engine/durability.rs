//! Applied is not durable: every record is applied as it is appended, but a saga is shown, and
//! a repeated submit of it answered, only once the shell reports its records durable.

use protocol::TxId;

use crate::records::{LogRecord, SagaRecord};

use super::SagaEngine;
use super::entry::HeldSubmit;
use super::io::{SagaCommand, SagaReply, SagaWait};

impl SagaEngine {
    /// Stamps `record` with its saga's elapsed time at `now_ms`, absorbs it and emits its
    /// append; the saga counts it unsynced until the shell reports it durable
    /// (`SagaEvent::Durable`).
    pub(super) fn log(&mut self, mut record: SagaRecord, now_ms: u64, out: &mut Vec<SagaCommand>) {
        if let Some(saga) = self.sagas.get(record.saga_id()) {
            record.set_elapsed_ms(saga.elapsed_at(now_ms));
        }
        self.absorb(&record);
        if let Some(saga) = self.sagas.get_mut(record.saga_id()) {
            saga.unsynced += 1;
        }
        out.push(SagaCommand::Append(LogRecord::Saga(record)));
    }

    /// Records of `ids` are durable: a saga with nothing left unsynced is shown as it stands,
    /// and the submits held for it are answered.
    pub(super) fn records_durable(
        &mut self,
        ids: Vec<TxId>,
        now_ms: u64,
        out: &mut Vec<SagaCommand>,
    ) {
        let mut settled = Vec::new();
        for id in ids {
            let Some(saga) = self.sagas.get_mut(&id) else {
                continue;
            };
            assert!(
                saga.unsynced > 0,
                "saga {id}: a durable record it never logged"
            );
            saga.unsynced -= 1;
            if saga.unsynced == 0 {
                saga.show_as_durable();
                settled.push(id);
            }
        }
        for id in settled {
            let held = self
                .sagas
                .get_mut(&id)
                .map(|saga| std::mem::take(&mut saga.held))
                .unwrap_or_default();
            for submit in held {
                self.answer_repeat(&id, submit, now_ms, out);
            }
        }
    }

    /// A submit of a saga the table holds, all of whose records are durable.
    pub(super) fn answer_repeat(
        &mut self,
        id: &TxId,
        submit: HeldSubmit,
        now_ms: u64,
        out: &mut Vec<SagaCommand>,
    ) {
        let Some(saga) = self.sagas.get_mut(id) else {
            return;
        };
        let reply = if saga.begin.digest != submit.digest {
            SagaReply::Conflict(id.clone())
        } else if submit.wait == SagaWait::Accepted {
            SagaReply::Accepted(saga.view(now_ms))
        } else if saga.ended.is_some() {
            SagaReply::Saga(saga.view(now_ms))
        } else {
            saga.waiters.push(submit.waiter);
            return;
        };
        out.push(SagaCommand::Reply {
            waiter: submit.waiter,
            reply,
        });
    }
}
