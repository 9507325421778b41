//! The deadline oracle (docs/sagas.md, "Deadlines"), kept on the simulation's true time apart
//! from the engine: what each saga has counted, stamped on every record logged, so that no
//! saga times out early and none runs past its timeout plus the slack.

use coordinator::records::{LogRecord, SagaRecord};
use protocol::TxId;

use super::{Counted, DEADLINE_SLACK_MS, Stamp, World};

impl World {
    /// What the oracle counts for `id` now.
    pub(super) fn counted_now(&self, id: &TxId) -> Option<u64> {
        let c = self.counted.get(id)?;
        Some(if self.coordinator.is_some() {
            c.at_since + (self.now - c.since)
        } else {
            c.at_since
        })
    }

    /// The oracle's view of records just logged; a `TimedOut` before the counted time
    /// reached the timeout is a violation.
    pub(super) fn stamp(&mut self, records: &[LogRecord]) -> Vec<Stamp> {
        let mut stamps = Vec::new();
        for record in records {
            let LogRecord::Saga(record) = record else {
                continue;
            };
            let id = record.saga_id().clone();
            if let SagaRecord::Begin(begin) = record {
                self.counted.insert(
                    id.clone(),
                    Counted {
                        timeout: begin.request.timeout_ms(),
                        at_since: 0,
                        since: self.now,
                        durable: 0,
                        begin_durable: false,
                        settled: false,
                        settled_durable: false,
                    },
                );
            }
            let Some(counted) = self.counted_now(&id) else {
                self.violated(format!("saga {id} logged a record without a begin"));
                continue;
            };
            let settles = matches!(record, SagaRecord::TimedOut(_) | SagaRecord::End(_));
            if let (SagaRecord::TimedOut(_), Some(c)) = (record, self.counted.get(&id))
                && counted < c.timeout
            {
                let timeout = c.timeout;
                self.violated(format!(
                    "saga {id} timed out after {counted} ms of its {timeout} ms (counted on \
                     true time, downtime excluded): early"
                ));
            }
            if settles && let Some(c) = self.counted.get_mut(&id) {
                c.settled = true;
            }
            stamps.push(Stamp {
                id,
                counted,
                begin: matches!(record, SagaRecord::Begin(_)),
                settles,
            });
        }
        stamps
    }

    /// Every saga not ended has timed out by its counted timeout plus the slack.
    pub(super) fn check_deadlines(&mut self) {
        if self.coordinator.is_none() {
            return;
        }
        let late = self.counted.iter().find_map(|(id, c)| {
            let counted = c.at_since + (self.now - c.since);
            (!c.settled && counted > c.timeout + DEADLINE_SLACK_MS)
                .then(|| (id.clone(), counted, c.timeout))
        });
        if let Some((id, counted, timeout)) = late {
            self.violated(format!(
                "saga {id} has run {counted} ms (counted on true time, downtime excluded) of \
                 its {timeout} ms and has not started compensating"
            ));
        }
    }
}
