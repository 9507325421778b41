//! Rebuilding the table from a checkpoint's sagas and the records after it, and the copy a
//! checkpoint takes: only what the log holds, never what was in flight.

use crate::records::{LogRecord, SagaRecord, SagaSnapshot};

use super::SagaEngine;
use super::entry::SagaEntry;
use super::io::SagaConfig;

impl SagaEngine {
    /// Rebuilds the table from a checkpoint's sagas and the records after it.
    pub fn replay<'a>(
        config: SagaConfig,
        snapshot: Vec<SagaSnapshot>,
        records: impl IntoIterator<Item = &'a LogRecord>,
    ) -> SagaEngine {
        let mut engine = SagaEngine::new(config);
        for saga in snapshot {
            engine
                .sagas
                .insert(saga.begin.id.clone(), SagaEntry::from_snapshot(saga));
        }
        for record in records {
            if let LogRecord::Saga(record) = record {
                engine.absorb(record);
            }
        }
        // Everything replayed is durable.
        for saga in engine.sagas.values_mut() {
            saga.show_as_durable();
        }
        engine
    }

    pub(super) fn absorb(&mut self, record: &SagaRecord) {
        if let SagaRecord::Begin(begin) = record {
            self.sagas
                .entry(begin.id.clone())
                .or_insert_with(|| SagaEntry::new(begin.clone()));
            return;
        }
        if let Some(saga) = self.sagas.get_mut(record.saga_id()) {
            saga.absorb(record);
        }
    }

    /// The checkpoint's copy at `now_ms`: only what the log holds (nothing in flight, no
    /// waiters), and each live saga's elapsed time as of now, so that a restart after it
    /// loses at most the time since (besides its downtime).
    pub fn snapshot(&self, now_ms: u64) -> Vec<SagaSnapshot> {
        self.sagas
            .values()
            .map(|saga| {
                let mut copy = saga.durable();
                if saga.ended.is_none() {
                    copy.elapsed_ms = saga.elapsed_at(now_ms);
                }
                copy
            })
            .collect()
    }
}
