//! Running the two-phase-commit world: one seed to its end (and again with the trace on when
//! it fails), and a run's fingerprint. It stands on top of the world it runs, apart from the
//! configuration in `super`, which the world itself reads.

use super::{Failure, RunStats, SimConfig, world};

/// Runs one seed to the end; `Err` names the broken invariant.
/// A failing seed runs a second time with the step trace on (the run is deterministic, so it
/// fails the same way), which keeps the passing seeds fast.
pub fn run_seed(seed: u64, config: SimConfig) -> Result<RunStats, Failure> {
    let mut world = world::World::new(seed, config, false);
    let mut stats = match world.run() {
        Ok(stats) => stats,
        Err(quick) => {
            let mut traced = world::World::new(seed, config, true);
            return Err(match traced.run() {
                Err(failure) => failure,
                // Not deterministic after all: report that, with the first failure.
                Ok(_) => Failure {
                    detail: format!(
                        "{} (NOT REPRODUCED with tracing on: the run is not deterministic)",
                        quick.detail
                    ),
                    ..quick
                },
            });
        }
    };
    let mut bodies = std::collections::BTreeSet::new();
    for (gtid, (_, digest)) in &world.coordinator.attempts {
        stats.attempts += 1;
        if !bodies.insert(digest.0) {
            stats.reattempts += 1;
        }
        match world.coordinator.durable_decisions.get(gtid) {
            Some(protocol::Decision::Commit) => stats.committed += 1,
            Some(protocol::Decision::Abort) => stats.aborted += 1,
            None => {}
        }
    }
    stats.undecidable = world
        .participants
        .iter()
        .map(|p| p.undecidable().len() as u64)
        .sum();
    stats.lock_waits = world.participants.iter().map(|p| p.lock_waits).sum();
    stats.lock_grants = world.participants.iter().map(|p| p.lock_grants).sum();
    stats.batched_runs = u64::from(world.coordinator.batching.is_some());
    stats.lines_refused = world.coordinator.lines_refused;
    Ok(stats)
}

/// A fingerprint of a whole run (its trace and final state), to check that a seed replays
/// exactly.
pub fn fingerprint(seed: u64, config: SimConfig) -> String {
    let mut world = world::World::new(seed, config, true);
    let result = world.run();
    format!(
        "{:?} {:?} {:?}",
        result.map_err(|f| f.to_string()),
        world.trace,
        world.coordinator.durable_decisions
    )
}
