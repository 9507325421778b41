//! What the run throws in between messages while faults last: crashes of the coordinator and
//! of participants (back to their durable logs), partitions, checkpoints, steps and slews of
//! the coordinator's wall clock, and an operator's "retry now".

use coordinator::saga::engine::SagaEvent;

use super::{HEAL_AT_MS, Msg, Unsynced, World};

impl World {
    pub(super) fn crash_coordinator(&mut self) {
        if self.coordinator.take().is_some() {
            self.stats.coordinator_crashes += 1;
            // What was not yet durable is gone, and the oracle's counts resume from the
            // durable ones.
            self.counted.retain(|_, c| c.begin_durable);
            for c in self.counted.values_mut() {
                c.at_since = c.durable;
                c.settled = c.settled_durable;
            }
            self.unsynced.clear();
            self.run += 1;
            let after = self.rng.u64(10..500);
            self.schedule(after, Msg::CoordinatorUp);
        }
    }

    pub(super) fn crash_participant(&mut self, i: usize) {
        if self.parts[i].up {
            self.parts[i].up = false;
            self.parts[i].life += 1;
            self.parts[i].unsynced.clear();
            self.stats.participant_crashes += 1;
            let after = self.rng.u64(10..300);
            self.schedule(after, Msg::ParticipantUp(i));
        }
    }

    /// A participant cut off for seconds: its steps stay unknown, sagas wait on it past
    /// restarts of the coordinator.
    pub(super) fn partition(&mut self, i: usize) {
        let until = self.now + self.rng.u64(1_000..6_000);
        self.parts[i].cut_until = until.min(HEAL_AT_MS);
    }

    /// A checkpoint: the table (as every record appended so far left it) replaces the
    /// records before it once it is durable, in log order with them.
    pub(super) fn checkpoint(&mut self) {
        if let Some(engine) = &self.coordinator {
            let table = engine.snapshot(self.coordinator_now());
            let stamps = self
                .counted
                .keys()
                .filter_map(|id| Some((id.clone(), self.counted_now(id)?)))
                .collect();
            self.unsynced.push_back(Unsynced::Checkpoint(table, stamps));
            self.schedule_coordinator_sync();
        }
    }

    /// While faults last, the coordinator's wall clock is stepped or its rate changed.
    pub(super) fn clock_fault(&mut self) {
        self.stats.clock_jumps += 1;
        if self.rng.u32(0..4) == 0 {
            let rate = self.rng.u64(800..=1200);
            self.wall.slew(self.now, rate);
        } else {
            let delta = self.rng.i64(-60_000..=60_000);
            self.wall.step(self.now, delta);
        }
    }

    /// An operator asks for a random saga to be tried now, as `Core::retry_saga` does: the
    /// same `RetryDue` the timer would send, early, to the running coordinator.
    pub(super) fn operator_retry(&mut self) {
        if self.requests.is_empty() {
            return;
        }
        let i = self.rng.usize(0..self.requests.len());
        let id = self.requests[i].0.id.clone();
        self.stats.operator_retries += 1;
        self.schedule(
            0,
            Msg::Timer {
                run: self.run,
                event: SagaEvent::RetryDue { id, now_ms: 0 },
            },
        );
    }
}
