//! One seeded run: time advances a few milliseconds a tick; each tick delivers what is due
//! (checking after each message), then draws syncs, crashes, clock steps, ticks and the
//! actors' turns, in that order (the order of draws is what a seed means).

use super::{FencingMutation, FencingStats, Payload, RETENTION, RUN_MS, WORKERS, World};

/// Runs one seed; `Err` names the broken invariant and when.
pub fn run_fencing_seed(seed: u64, mutation: FencingMutation) -> Result<FencingStats, String> {
    let mut world = World::new(seed, mutation);
    let at = |world: &World, e: String| format!("seed {seed} at {} ms: {e}", world.now);
    while world.now < RUN_MS {
        world.now += world.rng.u64(1..=5);
        world.network.sort_by_key(|(at, n, _)| (*at, *n));
        let due = world
            .network
            .iter()
            .take_while(|(at, ..)| *at <= world.now)
            .count();
        let messages: Vec<Payload> = world.network.drain(..due).map(|(_, _, p)| p).collect();
        for payload in messages {
            world.deliver(payload).map_err(|e| at(&world, e))?;
            world.check().map_err(|e| at(&world, e))?;
        }
        if world.rng.bool() {
            world.sync_leases().map_err(|e| at(&world, e))?;
        }
        // Syncs are rare enough that answers, crashes and stale writes fall between them.
        if world.rng.u32(0..6) == 0 {
            world.sync_participant();
            world.check().map_err(|e| at(&world, e))?;
        }
        if world.rng.u32(0..400) == 0 {
            world.crash_leases();
        }
        if world.rng.u32(0..200) == 0 {
            world.crash_participant()?;
            world.check().map_err(|e| at(&world, e))?;
        }
        if world.rng.u32(0..20) == 0 {
            if mutation == FencingMutation::SteppingClock && world.rng.u32(0..10) == 0 {
                // A wall clock stepped while the process runs, fed straight to the engine.
                world.step_clock(RETENTION.answers_ms);
            }
            world.tick_participant();
            world.check().map_err(|e| at(&world, e))?;
        }
        if world.rng.u32(0..60) == 0 {
            world.step_forger();
        }
        if world.rng.u32(0..50) == 0 {
            world.step_operator();
        }
        for i in 0..WORKERS {
            if world.rng.u32(0..4) == 0 {
                world.step_worker(i);
            }
        }
    }
    Ok(world.stats)
}
