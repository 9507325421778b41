//! The invariants once the run is over: every saga of every life ended, on its own steps'
//! answers (each life's keys are tagged, so its effects are exact), and only the restored
//! life met `op_id_conflict`.

use protocol::TxId;
use protocol::saga::{SagaResponse, SagaState};

use cluster::saga_checkout::{self, Effects};

use super::{LIVES, RESTORED, World};

impl World {
    pub(super) fn effects(&self, id: &str, tag: &str) -> Effects {
        let int = |i: usize, key: String| {
            self.parts[i]
                .engine
                .resource()
                .get(&key)
                .and_then(|e| e.value.as_i64())
                .unwrap_or(0)
        };
        Effects {
            reserved: int(0, format!("saga-stock:{id}.{tag}")),
            charged: int(1, format!("saga-charge:{id}.{tag}")),
            shipped: self.parts[2]
                .engine
                .resource()
                .get(&format!("saga-ship:{id}.{tag}"))
                .is_some(),
        }
    }
}

/// The invariants, once the run is over.
pub(super) fn check(seed: u64, world: &mut World) -> Result<(), String> {
    if !world.lives[0].retired {
        return Err(format!(
            "seed {seed}: liveness: coordinator c-first's sagas never all ended"
        ));
    }
    for life in 1..LIVES.len() {
        if !world.settled(life) {
            return Err(format!(
                "seed {seed}: liveness: a saga of life {} (coordinator {}) never ended",
                world.lives[life].tag, world.lives[life].coordinator_id
            ));
        }
        if let Some(engine) = &world.lives[life].engine {
            let views: Vec<(TxId, SagaResponse)> = world.lives[life]
                .requests
                .iter()
                .filter_map(|(r, _)| engine.get(&r.id).map(|s| (r.id.clone(), s.view(world.now))))
                .collect();
            world.lives[life].ended.extend(views);
        }
    }
    for life in &world.lives {
        for (request, fate) in &life.requests {
            let Some(view) = life.ended.get(&request.id) else {
                return Err(format!(
                    "seed {seed}: saga {} of life {} never began",
                    request.id, life.tag
                ));
            };
            let json = serde_json::to_value(view).map_err(|e| e.to_string())?;
            let effects = world.effects(request.id.as_str(), life.tag);
            saga_checkout::check(&json, effects, 2, 30).map_err(|e| {
                format!(
                    "seed {seed}: saga {} of coordinator {} (life {}, {fate:?}) did not end on \
                     its own steps' answers: {e}",
                    request.id, life.coordinator_id, life.tag
                )
            })?;
            let conflicts = view
                .steps
                .iter()
                .filter(|s| {
                    s.last_error
                        .as_deref()
                        .is_some_and(|e| e.starts_with("op_id_conflict"))
                })
                .count() as u64;
            if conflicts > 0 && life.tag != LIVES[RESTORED].1 {
                return Err(format!(
                    "seed {seed}: saga {} of coordinator {} (life {}) was refused op_id_conflict: \
                     its op ids were never used by this coordinator id before, so the refusal \
                     came from another coordinator's op: {view:?}",
                    request.id, life.coordinator_id, life.tag
                ));
            }
            if life.tag == LIVES[RESTORED].1 {
                world.stats.conflicts += conflicts;
            }
            match view.state {
                SagaState::Completed => world.stats.completed += 1,
                SagaState::Compensated => world.stats.compensated += 1,
                SagaState::NeedsAttention => world.stats.needs_attention += 1,
                SagaState::Running | SagaState::Compensating => {
                    return Err(format!(
                        "seed {seed}: saga {} of life {} is {:?} at the end",
                        request.id, life.tag, view.state
                    ));
                }
            }
        }
    }
    Ok(())
}
