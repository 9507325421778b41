//! What the run throws in while faults last: coordinator crashes back to their logs, and
//! participant crashes back to their checkpoint (through JSON, as the file holds it) and log.

use super::{Msg, World};

impl World {
    pub(super) fn crash_coordinator(&mut self, life: usize) {
        let target = &mut self.lives[life];
        if target.retired || target.engine.take().is_none() {
            return;
        }
        target.run += 1;
        self.stats.coordinator_crashes += 1;
        let after = self.rng.u64(10..500);
        self.schedule(after, Msg::CoordinatorUp(life));
    }

    pub(super) fn crash_participant(&mut self, i: usize) {
        if self.parts[i].up {
            self.parts[i].up = false;
            self.stats.participant_crashes += 1;
            let after = self.rng.u64(10..300);
            self.schedule(after, Msg::ParticipantUp(i));
        }
    }

    /// A participant checkpoint: its snapshot, through JSON as the file holds it, replaces the
    /// records before it.
    pub(super) fn checkpoint_participant(&mut self, i: usize) {
        let part = &mut self.parts[i];
        if !part.up {
            return;
        }
        match part
            .engine
            .snapshot()
            .and_then(|s| serde_json::to_string(&s))
        {
            Ok(json) => {
                part.checkpoint = Some(json);
                part.log.clear();
                self.stats.participant_checkpoints += 1;
            }
            Err(e) => panic!("participant {i}: its snapshot does not serialize: {e}"),
        }
    }
}
