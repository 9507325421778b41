//! The coordinator's wall clock as its machine shows it: true time, stepped and slewed while
//! faults last. The shell reads it once per run for the saga clock (`World::coordinator_now`);
//! only the `DeadlineOnWallClock` mutation feeds it to the engine as it is.

/// The coordinator's wall clock: true time, stepped and slewed.
#[derive(Debug, Clone, Copy)]
pub struct WallClock {
    /// Its reading at true time `at`, and its rate from then (per mille of true time).
    pub reading: u64,
    pub at: u64,
    pub rate_per_mille: u64,
}

impl WallClock {
    pub fn read(&self, now: u64) -> u64 {
        self.reading + (now - self.at) * self.rate_per_mille / 1000
    }

    /// Stepped by `delta_ms` (never below a day after the epoch) at `now`.
    pub fn step(&mut self, now: u64, delta_ms: i64) {
        let reading = self.read(now).saturating_add_signed(delta_ms);
        *self = WallClock {
            reading: reading.max(86_400_000),
            at: now,
            rate_per_mille: self.rate_per_mille,
        };
    }

    pub fn slew(&mut self, now: u64, rate_per_mille: u64) {
        *self = WallClock {
            reading: self.read(now),
            at: now,
            rate_per_mille,
        };
    }
}
