//! Issue 25, item 5: seeded runs of saga ids used again by a second coordinator and by a
//! coordinator restored from an empty backup (`chaos_tests::sim::saga_reuse`): no saga is
//! completed on another coordinator's answers, an op id reused with another payload fails that
//! op and nothing else, and every saga ends.
//!
//! `TWOPC_SAGA_REUSE_SEEDS=N` runs more (soak); `TWOPC_SAGA_REUSE_SEED=S` replays one.

use chaos_tests::sim::{SagaReuseConfig, SagaReuseMutation, run_saga_reuse_seed};

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[test]
fn no_saga_completes_on_another_coordinators_answers() {
    let seeds: Vec<u64> = match env_u64("TWOPC_SAGA_REUSE_SEED") {
        Some(seed) => vec![seed],
        None => (0..env_u64("TWOPC_SAGA_REUSE_SEEDS").unwrap_or(300)).collect(),
    };
    let mut totals = [0u64; 7];
    for seed in seeds {
        let stats = run_saga_reuse_seed(seed, SagaReuseConfig::default()).unwrap_or_else(|e| {
            panic!("{e}\nreplay: TWOPC_SAGA_REUSE_SEED={seed} cargo test -p twopc-chaos-tests --test saga_reuse_simulation")
        });
        for (total, n) in totals.iter_mut().zip([
            stats.completed,
            stats.compensated,
            stats.needs_attention,
            stats.conflicts,
            stats.coordinator_crashes,
            stats.participant_crashes,
            stats.participant_checkpoints,
        ]) {
            *total += n;
        }
    }
    eprintln!(
        "sagas: {} completed, {} compensated, {} needs_attention; {} steps of the restored \
         coordinator failed on op_id_conflict; {} coordinator and {} participant crashes, {} \
         participant checkpoints",
        totals[0], totals[1], totals[2], totals[3], totals[4], totals[5], totals[6]
    );
    // Every outcome, the conflicts and every fault happened: the runs are not vacuous.
    assert!(totals.iter().all(|n| *n > 0), "{totals:?}");
}

/// The first of the first 2,000 seeds a broken shell fails, with its message.
fn first_catch(mutation: SagaReuseMutation) -> (u64, String) {
    let config = SagaReuseConfig {
        mutation: Some(mutation),
        ..SagaReuseConfig::default()
    };
    (0..2_000)
        .find_map(|seed| run_saga_reuse_seed(seed, config).err().map(|e| (seed, e)))
        .unwrap_or_else(|| panic!("no seed catches {mutation:?}"))
}

#[test]
fn a_probe_without_the_payload_digest_is_caught() {
    let (seed, failure) = first_catch(SagaReuseMutation::ProbeWithoutDigest);
    eprintln!("seed {seed}: {failure}");
}

#[test]
fn reading_op_id_conflict_as_unknown_is_caught() {
    let (seed, failure) = first_catch(SagaReuseMutation::ConflictIsUnknown);
    eprintln!("seed {seed}: {failure}");
    assert!(failure.contains("liveness"), "{failure}");
}

#[test]
fn a_probe_without_the_coordinator_id_is_caught() {
    // Refused, never answered wrongly: the step stays unknown, and the saga never ends.
    let (seed, failure) = first_catch(SagaReuseMutation::ProbeWithoutCoordinatorId);
    eprintln!("seed {seed}: {failure}");
    assert!(failure.contains("liveness"), "{failure}");
}
