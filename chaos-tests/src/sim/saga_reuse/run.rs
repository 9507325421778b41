//! One seeded run: the three lives' sagas drawn from the seed, the event loop with its faults,
//! and the hand-over from `c-first` to the restored life once its sagas have ended.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use coordinator::saga::engine::SagaEngine;
use protocol::CoordinatorId;
use protocol::saga::SagaRequest;

use cluster::saga_checkout::{self, Fate};

use super::invariants::check;
use super::{
    CONFIG, END_MS, LIVES, Life, Msg, Part, RESTORED, SagaReuseConfig, SagaReuseStats, World,
    fresh_participant,
};

impl World {
    /// Every saga of a started life has ended (and is durable in its table).
    pub(super) fn settled(&self, life: usize) -> bool {
        let life = &self.lives[life];
        life.started
            && life.engine.as_ref().is_some_and(|engine| {
                life.requests
                    .iter()
                    .all(|(r, _)| engine.get(&r.id).is_some_and(|saga| saga.ended.is_some()))
            })
    }

    /// `c-first` settled: record its sagas as they ended, retire it, and start the restored
    /// life under its id on an empty log.
    pub(super) fn restore_first_from_an_empty_backup(&mut self) {
        let first = &mut self.lives[0];
        if let Some(engine) = first.engine.take() {
            for (request, _) in &first.requests {
                if let Some(saga) = engine.get(&request.id) {
                    first.ended.insert(request.id.clone(), saga.view(self.now));
                }
            }
        }
        first.retired = true;
        self.schedule(0, Msg::Start(RESTORED));
    }
}

/// A checkout saga of `id` whose steps write keys tagged with the life.
fn request(id: &str, tag: &str, fate: Fate, timeout: u64) -> Result<SagaRequest, String> {
    let mut json = saga_checkout::request(&format!("{id}.{tag}"), 2, 30, fate, timeout);
    json["id"] = serde_json::json!(id);
    serde_json::from_value(json).map_err(|e| e.to_string())
}

/// Runs one seed; `Err` names the broken invariant and the seed.
pub fn run_saga_reuse_seed(seed: u64, config: SagaReuseConfig) -> Result<SagaReuseStats, String> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let fates = [Fate::Complete, Fate::Declined, Fate::FailAfterPivot];
    let ids: Vec<String> = (0..config.sagas).map(|i| format!("r{seed}-{i}")).collect();
    let mut lives = Vec::new();
    for (coordinator_id, tag) in LIVES {
        let requests = ids
            .iter()
            .map(|id| {
                let fate = fates[rng.usize(..fates.len())];
                let timeout = if rng.bool() { 300 } else { 30_000 };
                Ok((request(id, tag, fate, timeout)?, fate))
            })
            .collect::<Result<Vec<_>, String>>()?;
        lives.push(Life {
            coordinator_id: CoordinatorId::new(coordinator_id).map_err(|e| e.to_string())?,
            tag,
            started: false,
            retired: false,
            engine: Some(SagaEngine::new(CONFIG)),
            log: Vec::new(),
            run: 1,
            requests,
            ended: BTreeMap::new(),
        });
    }
    let mut world = World {
        rng,
        now: 0,
        seq: 0,
        queue: BinaryHeap::new(),
        payloads: Vec::new(),
        lives,
        parts: (0..3)
            .map(|_| Part {
                engine: fresh_participant(),
                checkpoint: None,
                log: Vec::new(),
                up: true,
            })
            .collect(),
        calls: BTreeMap::new(),
        next_call: 0,
        mutation: config.mutation,
        stats: SagaReuseStats::default(),
    };
    world.schedule(0, Msg::Start(0));
    let second_at = world.rng.u64(0..3_000);
    world.schedule(second_at, Msg::Start(1));
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
        if !world.lives[RESTORED].started && !world.lives[0].retired && world.settled(0) {
            world.restore_first_from_an_empty_backup();
        }
        if world.faulty() {
            match world.rng.u32(0..1000) {
                0..=4 => {
                    let life = world.rng.usize(0..LIVES.len());
                    world.crash_coordinator(life);
                }
                5..=7 => {
                    let i = world.rng.usize(0..3);
                    world.crash_participant(i);
                }
                8..=12 => {
                    let i = world.rng.usize(0..3);
                    world.checkpoint_participant(i);
                }
                _ => {}
            }
        }
    }
    check(seed, &mut world)?;
    Ok(world.stats)
}
