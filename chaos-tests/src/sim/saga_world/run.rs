//! One seeded run: the sagas and the fence refusals drawn from the seed, the clients' submits,
//! the event loop (a fault drawn after each message while they last, the deadline and fence
//! checks after every event), and the invariants once every saga settled.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use coordinator::saga::engine::{SagaEngine, SagaWait};
use protocol::CoordinatorId;
use protocol::saga::{SagaRequest, SagaState};

use cluster::saga_checkout::{self, Effects, Fate};

use super::clock::WallClock;
use super::{
    CONFIG, END_MS, FENCE_HOLD_MS, HEAL_AT_MS, Msg, Part, SagaRunStats, SagaSimConfig,
    WALL_START_MS, World, fresh_participant,
};

/// Runs one seed; `Err` names the broken invariant and the seed.
pub fn run_saga_seed(seed: u64, config: SagaSimConfig) -> Result<SagaRunStats, String> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let fates = [Fate::Complete, Fate::Declined, Fate::FailAfterPivot];
    let requests: Vec<(SagaRequest, Fate)> = (0..config.sagas)
        .map(|i| {
            let fate = fates[rng.usize(..fates.len())];
            // Some deadlines are shorter than a few lost messages take, some last through a
            // partition and a coordinator restart or two: timeouts happen.
            let timeout = match rng.u32(0..3) {
                0 => 300,
                1 => rng.u64(2_000..8_000),
                _ => 30_000,
            };
            let json = saga_checkout::request(&format!("s{seed}-{i}"), 2, 30, fate, timeout);
            let request: SagaRequest = serde_json::from_value(json).map_err(|e| e.to_string())?;
            Ok((request, fate))
        })
        .collect::<Result<_, String>>()?;
    // Some participants refuse fences for a while, some until well after the other faults.
    let fences_refused_until = (0..3)
        .map(|_| match rng.u32(0..3) {
            0 => 0,
            1 => rng.u64(0..HEAL_AT_MS),
            _ => HEAL_AT_MS + rng.u64(2 * FENCE_HOLD_MS..40_000),
        })
        .collect();
    let mut world = World {
        rng,
        now: 0,
        seq: 0,
        queue: BinaryHeap::new(),
        payloads: Vec::new(),
        coordinator: Some(SagaEngine::new(CONFIG)),
        checkpoint: Vec::new(),
        log: Vec::new(),
        unsynced: std::collections::VecDeque::new(),
        synced_at: 0,
        run: 1,
        calls: BTreeMap::new(),
        next_call: 0,
        parts: (0..3)
            .map(|_| Part {
                engine: fresh_participant(),
                log: Vec::new(),
                up: true,
                cut_until: 0,
                life: 0,
                unsynced: std::collections::VecDeque::new(),
                synced_at: 0,
            })
            .collect(),
        requests,
        heard: BTreeMap::new(),
        accepted: std::collections::BTreeSet::new(),
        mutation: config.mutation,
        stats: SagaRunStats::default(),
        coordinator_id: CoordinatorId::new("c-sim").map_err(|e| e.to_string())?,
        wall: WallClock {
            reading: WALL_START_MS,
            at: 0,
            rate_per_mille: 1000,
        },
        run_base: WALL_START_MS,
        run_started: 0,
        counted: BTreeMap::new(),
        fences_refused_until,
        fence_refusals: BTreeMap::new(),
        violation: None,
    };
    for i in 0..config.sagas {
        // Each client sends once (waiting for the end, or only for the 202), and some send
        // the same request again: later, or at once (while the first's begin is unsynced).
        let wait = |rng: &mut fastrand::Rng| {
            if rng.bool() {
                SagaWait::Terminal
            } else {
                SagaWait::Accepted
            }
        };
        let at = world.rng.u64(0..2_000);
        let first = wait(&mut world.rng);
        world.schedule(at, Msg::Submit(i, first));
        if world.rng.u32(0..100) < 30 {
            let again = world.rng.u64(0..10_000);
            let second = wait(&mut world.rng);
            world.schedule(again, Msg::Submit(i, second));
        }
        if world.rng.u32(0..100) < 30 {
            let soon = at + world.rng.u64(0..4);
            let second = wait(&mut world.rng);
            world.schedule(soon, Msg::Submit(i, second));
        }
    }
    while let Some(Reverse((at, _, slot))) = world.queue.pop() {
        if at > END_MS {
            break;
        }
        world.now = at;
        world.stats.events += 1;
        let Some(msg) = world.payloads[slot].take() else {
            continue;
        };
        world.deliver(msg);
        if world.faulty() {
            match world.rng.u32(0..1000) {
                0..=4 => world.crash_coordinator(),
                5..=7 => {
                    let i = world.rng.usize(0..3);
                    world.crash_participant(i);
                }
                8..=12 => world.checkpoint(),
                13..=22 => world.operator_retry(),
                23..=30 => world.clock_fault(),
                31 => {
                    let i = world.rng.usize(0..3);
                    world.partition(i);
                }
                _ => {}
            }
        }
        world.check_deadlines();
        if !world.faulty() {
            world.check_fences();
        }
        if let Some(why) = world.violation.take() {
            return Err(format!("seed {seed} at {} ms: {why}", world.now));
        }
    }
    let engine = world
        .coordinator
        .as_ref()
        .ok_or_else(|| format!("seed {seed}: the coordinator never came back"))?;
    for ((id, step), first) in &world.fence_refusals {
        if engine
            .get(id)
            .is_some_and(|saga| saga.state() == SagaState::Compensated)
        {
            return Err(format!(
                "seed {seed}: saga {id} is compensated, but its fence of {step} was refused at \
                 {first} ms and never taken"
            ));
        }
    }
    for (request, fate) in &world.requests {
        let Some(saga) = engine.get(&request.id) else {
            if world.accepted.contains(&request.id) {
                return Err(format!(
                    "seed {seed}: a client was told 202 for saga {} and the coordinator lost it",
                    request.id
                ));
            }
            // Never began: its submits were all lost to crashes; nothing may have been applied.
            let effects = effects_of(&world, request.id.as_str());
            if effects
                != (Effects {
                    reserved: 0,
                    charged: 0,
                    shipped: false,
                })
            {
                return Err(format!(
                    "seed {seed}: saga {} never began but {effects:?}",
                    request.id
                ));
            }
            continue;
        };
        let view = saga.view(world.coordinator_now());
        let json = serde_json::to_value(&view).map_err(|e| e.to_string())?;
        let effects = effects_of(&world, request.id.as_str());
        saga_checkout::check(&json, effects, 2, 30)
            .map_err(|e| format!("seed {seed} ({fate:?}): {e}"))?;
        if let Some(heard) = world.heard.get(&request.id)
            && heard.state != view.state
        {
            return Err(format!(
                "seed {seed}: client heard {:?}, saga ended {:?}",
                heard.state, view.state
            ));
        }
        match view.state {
            SagaState::Completed => world.stats.completed += 1,
            SagaState::Compensated => world.stats.compensated += 1,
            SagaState::NeedsAttention => world.stats.needs_attention += 1,
            SagaState::Running | SagaState::Compensating => unreachable!("checked terminal"),
        }
    }
    Ok(world.stats)
}

fn effects_of(world: &World, id: &str) -> Effects {
    let int = |i: usize, key: String| {
        world.parts[i]
            .engine
            .resource()
            .get(&key)
            .and_then(|e| e.value.as_i64())
            .unwrap_or(0)
    };
    Effects {
        reserved: int(0, format!("saga-stock:{id}")),
        charged: int(1, format!("saga-charge:{id}")),
        shipped: world.parts[2]
            .engine
            .resource()
            .get(&format!("saga-ship:{id}"))
            .is_some(),
    }
}
