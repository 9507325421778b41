//! The deterministic simulation of the two engines (issue 5, item 7): thousands of seeded runs
//! of one coordinator and three KV participants under message loss, duplication, delay,
//! reordering and crashes back to durable state, with every invariant checked after every step.
//! The ordinary operations that once broke atomicity are in every run's mix (issue 11): an
//! operator's stopped copy of the coordinator's disk put back later (a restore), outcomes and
//! tombstones forgotten after one to four transactions, and clients reusing ids.
//!
//! - `TWOPC_SIM_SEEDS=100000` runs that many seeds (soak); the default is 10,000 per CI run,
//!   split over `SHARDS` tests so both cores work.
//! - `TWOPC_SIM_SEED=1234` replays that one seed (a failure prints this command).
//! - `TWOPC_SIM_BATCHING=on|off` runs every seed with batched phase messages (issue 28) or
//!   without; by default the seed draws it (half the runs batch).

use std::time::Instant;

use chaos_tests::sim::run::{fingerprint, run_seed};
use chaos_tests::sim::{Batching, Mutation, RunStats, SimConfig};

/// Seeds per `cargo test` run, in all shards together.
const CI_SEEDS: u64 = 10_000;
/// The seeds are split over this many tests (`every_invariant_holds_on_shard_N`), which the
/// test harness runs in parallel.
const SHARDS: u64 = 4;
/// A mutation must be caught within this many seeds.
const MUTATION_SEEDS: u64 = 2_000;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

fn every_invariant_holds_on_shard(shard: u64) {
    let seeds: Vec<u64> = match env_u64("TWOPC_SIM_SEED") {
        Some(seed) if shard == 0 => vec![seed],
        Some(_) => Vec::new(),
        None => (0..env_u64("TWOPC_SIM_SEEDS").unwrap_or(CI_SEEDS))
            .filter(|seed| seed % SHARDS == shard)
            .collect(),
    };
    // Soak mode: run every seed and list the failures instead of stopping at the first.
    let keep_going = std::env::var_os("TWOPC_SIM_KEEP_GOING").is_some();
    let mut failures = Vec::new();
    let started = Instant::now();
    let mut total = RunStats::default();
    // `TWOPC_SIM_ORDERS=N` changes the number of client transactions per run (soak variety).
    let config = SimConfig {
        orders: env_u64("TWOPC_SIM_ORDERS").map_or(SimConfig::default().orders, |n| n as usize),
        batching: Batching::from_env().unwrap_or(SimConfig::default().batching),
        ..SimConfig::default()
    };
    for &seed in &seeds {
        match run_seed(seed, config) {
            Ok(stats) => {
                total.steps += stats.steps;
                total.messages += stats.messages;
                total.dropped += stats.dropped;
                total.duplicated += stats.duplicated;
                total.crashes += stats.crashes;
                total.committed += stats.committed;
                total.aborted += stats.aborted;
                total.attempts += stats.attempts;
                total.reattempts += stats.reattempts;
                total.restores += stats.restores;
                total.undecidable += stats.undecidable;
                total.lock_waits += stats.lock_waits;
                total.lock_grants += stats.lock_grants;
                total.resolved += stats.resolved;
                total.forged += stats.forged;
                total.batched_runs += stats.batched_runs;
                total.batches += stats.batches;
                total.batch_items += stats.batch_items;
                total.batch_splits += stats.batch_splits;
                total.batch_reorders += stats.batch_reorders;
                total.lines_cut += stats.lines_cut;
                total.forged_lines += stats.forged_lines;
                total.lines_refused += stats.lines_refused;
            }
            Err(failure) if keep_going => {
                eprintln!(
                    "seed {seed}: `{}`: {}",
                    failure.invariant,
                    failure.detail.lines().next().unwrap_or("")
                );
                failures.push(failure);
            }
            Err(failure) => panic!("{failure}"),
        }
    }
    if let Some(first) = failures.first() {
        panic!(
            "{} of {} seeds failed; the first:\n{first}",
            failures.len(),
            seeds.len()
        );
    }
    eprintln!(
        "shard {shard}: simulated {} seeds in {:.1?}: {} steps, {} messages ({} dropped, {} \
         duplicated), {} crashes, {} restores, {} attempts for {} orders ({} retries that met a \
         forgotten outcome), {} commits, {} aborts, {} attempts left in doubt (undecidable from the coordinator's log), \
         {} prepares queued for a lock ({} granted), {} attempts resolved by the operator, {} \
         forged high-epoch messages refused; {} runs batched: {} batches of {} items, {} split, \
         {} reordered, {} answer lines lost to broken streams, {} of {} forged lines refused",
        seeds.len(),
        started.elapsed(),
        total.steps,
        total.messages,
        total.dropped,
        total.duplicated,
        total.crashes,
        total.restores,
        total.attempts,
        seeds.len() * config.orders,
        total.reattempts,
        total.committed,
        total.aborted,
        total.undecidable,
        total.lock_waits,
        total.lock_grants,
        total.resolved,
        total.forged,
        total.batched_runs,
        total.batches,
        total.batch_items,
        total.batch_splits,
        total.batch_reorders,
        total.lines_cut,
        total.lines_refused,
        total.forged_lines
    );
    if seeds.len() >= 100 {
        // The runs must really exercise faults, the new operations and both outcomes, or they
        // prove nothing.
        let runs = seeds.len() as u64;
        assert!(total.crashes > runs / 2, "{total:?}");
        assert!(total.dropped > 0 && total.duplicated > 0, "{total:?}");
        assert!(
            total.lock_grants > 0,
            "lock waits must be exercised: {total:?}"
        );
        assert!(total.committed > 0 && total.aborted > 0, "{total:?}");
        assert!(total.restores > runs / 20, "restores happen: {total:?}");
        assert!(
            total.resolved > 0,
            "the operator resolves attempts a restore left in doubt: {total:?}"
        );
        assert!(
            total.reattempts > 0,
            "retries meet forgotten outcomes and become new attempts: {total:?}"
        );
        assert!(
            total.forged > runs / 2,
            "an adversary forges high-epoch messages: {total:?}"
        );
        // Both paths run (unless one was chosen), and the batches meet every batch fault.
        if config.batching == Batching::Seeded {
            assert!(
                total.batched_runs > runs / 4 && total.batched_runs < runs * 3 / 4,
                "{total:?}"
            );
        }
        if config.batching != Batching::PerMessage {
            assert!(total.batch_items > total.batches, "{total:?}");
            assert!(
                total.batch_splits > 0 && total.batch_reorders > 0,
                "{total:?}"
            );
            assert!(total.lines_cut > 0, "{total:?}");
            assert!(
                total.lines_refused > 0 && total.lines_refused <= total.forged_lines,
                "forged lines are refused: {total:?}"
            );
        }
    }
}

#[test]
fn every_invariant_holds_on_shard_0() {
    every_invariant_holds_on_shard(0);
}

#[test]
fn every_invariant_holds_on_shard_1() {
    every_invariant_holds_on_shard(1);
}

#[test]
fn every_invariant_holds_on_shard_2() {
    every_invariant_holds_on_shard(2);
}

#[test]
fn every_invariant_holds_on_shard_3() {
    every_invariant_holds_on_shard(3);
}

#[test]
fn without_faults_every_order_resolves_and_some_commit() {
    for batching in [Batching::PerMessage, Batching::Batched] {
        without_faults_every_order_resolves(batching);
    }
}

fn without_faults_every_order_resolves(batching: Batching) {
    let config = SimConfig {
        faults: false,
        batching,
        ..SimConfig::default()
    };
    let mut committed = 0;
    let (mut waits, mut grants) = (0, 0);
    let mut batches = 0;
    for seed in 0..50 {
        let stats = run_seed(seed, config).unwrap_or_else(|f| panic!("{f}"));
        assert_eq!(
            stats.committed + stats.aborted,
            stats.attempts,
            "seed {seed}: every attempt is decided when nothing fails"
        );
        assert!(stats.attempts >= 1, "seed {seed}: {stats:?}");
        assert_eq!(
            stats.undecidable, 0,
            "seed {seed}: nothing is lost without faults"
        );
        committed += stats.committed;
        waits += stats.lock_waits;
        grants += stats.lock_grants;
        batches += stats.batches;
    }
    assert_eq!(batches > 0, batching == Batching::Batched, "{batching:?}");
    assert!(committed > 0);
    // The orders share three skus and three customers: prepares meet held keys and queue, and
    // some of them are granted when the holder is decided (the deferred yes is exercised).
    assert!(waits > 0 && grants > 0, "waits {waits}, grants {grants}");
}

#[test]
fn a_seed_replays_exactly() {
    for seed in [0, 7, 4242] {
        for batching in [Batching::Seeded, Batching::Batched] {
            let config = SimConfig {
                batching,
                ..SimConfig::default()
            };
            assert_eq!(
                fingerprint(seed, config),
                fingerprint(seed, config),
                "seed {seed} {batching:?}"
            );
        }
    }
    assert_ne!(
        fingerprint(1, SimConfig::default()),
        fingerprint(2, SimConfig::default())
    );
}

fn first_catch(mutation: Mutation) -> chaos_tests::sim::Failure {
    first_catch_in(SimConfig {
        mutation,
        ..SimConfig::default()
    })
}

fn first_catch_in(config: SimConfig) -> chaos_tests::sim::Failure {
    for seed in 0..MUTATION_SEEDS {
        if let Err(failure) = run_seed(seed, config) {
            return failure;
        }
    }
    panic!(
        "mutation {:?} ({:?}) was not caught by any of {MUTATION_SEEDS} seeds",
        config.mutation, config.batching
    );
}

#[test]
fn sending_phase_two_before_the_decision_is_durable_is_caught() {
    let failure = first_catch(Mutation::PhaseTwoBeforeDurable);
    eprintln!("{failure}");
    assert!(
        ["agreement", "durability"].contains(&failure.invariant.as_str()),
        "{failure}"
    );
}

#[test]
fn voting_yes_before_the_prepared_record_is_durable_is_caught() {
    let failure = first_catch(Mutation::VoteBeforePreparedDurable);
    eprintln!("{failure}");
}

#[test]
fn a_batch_item_voting_yes_before_its_record_is_durable_is_caught() {
    // Issue 28: an item of a batch is answered on the lone message's path, so the early yes of
    // `VoteBeforePreparedDurable` leaves on its line too; with every prepare batched (the epoch
    // probe is a decision), any catch is of a batch item's line.
    let failure = first_catch_in(SimConfig {
        mutation: Mutation::VoteBeforePreparedDurable,
        batching: Batching::Batched,
        ..SimConfig::default()
    });
    eprintln!("{failure}");
}

#[test]
fn pairing_batch_answers_by_position_is_caught() {
    // Issue 28: lines come in the order answers are ready (a prepare that waits for a lock
    // answers after the items behind it, the network reorders lines and items), so a yes
    // paired with the k-th item instead of its `index` is credited to another attempt, which
    // commits where a participant voted no or never prepared.
    let failure = first_catch_in(SimConfig {
        mutation: Mutation::BatchAnswerByPosition,
        batching: Batching::Batched,
        ..SimConfig::default()
    });
    eprintln!("{failure}");
    assert!(
        ["yes durable", "atomicity", "agreement", "durability"]
            .contains(&failure.invariant.as_str()),
        "{failure}"
    );
}

#[test]
fn presuming_abort_where_the_log_cannot_prove_it_is_caught() {
    // The old rule (abort for any attempt with no record) splits a decision once the
    // coordinator's disk is put back from a copy, or its Begin was lost.
    let failure = first_catch(Mutation::AbortWhenUnknown);
    eprintln!("{failure}");
    assert!(
        ["agreement", "atomicity", "durability"].contains(&failure.invariant.as_str()),
        "{failure}"
    );
}

#[test]
fn an_operator_resolving_without_the_evidence_is_caught() {
    // Resolving by guess splits an attempt that one participant already ended the other way;
    // the operator's resolve that the log contradicts is usually caught first (`resolution`).
    let failure = first_catch(Mutation::ResolveWithoutEvidence);
    eprintln!("{failure}");
    assert!(
        ["agreement", "atomicity", "durability", "resolution"]
            .contains(&failure.invariant.as_str()),
        "{failure}"
    );
}

#[test]
fn taking_any_epoch_from_an_unauthenticated_sender_is_caught() {
    // Issue 17: without the bound, one forged message with a huge epoch fences the real
    // coordinator out (its in-doubt attempts never resolve) or commits what it aborted.
    let failure = first_catch(Mutation::NoEpochBound);
    eprintln!("{failure}");
    assert!(
        ["agreement", "atomicity", "liveness"].contains(&failure.invariant.as_str()),
        "{failure}"
    );
}

#[test]
fn believing_a_decision_query_about_an_unknown_run_is_caught() {
    // Issue 24, item 2: a hostile peer's made-up run stopped new work for good.
    let failure = first_catch(Mutation::BehindFromQuery);
    eprintln!("{failure}");
    assert_eq!(failure.invariant, "liveness", "{failure}");
}

#[test]
fn a_resolution_not_bound_to_the_attempts_identity_is_caught() {
    // Issue 24, item 1: a resolve under another id, or of a gtid not yet given out, was
    // accepted, and its answer outranked the log.
    let failure = first_catch(Mutation::UncheckedClaim);
    eprintln!("{failure}");
    assert!(
        ["resolution", "answers", "agreement", "atomicity"].contains(&failure.invariant.as_str()),
        "{failure}"
    );
}

#[test]
fn counting_a_timed_out_vote_as_yes_is_caught() {
    let failure = first_catch(Mutation::TimeoutCountsAsYes);
    eprintln!("{failure}");
}

/// Sagas (issue 13): seeded runs of the saga engine and the participants' barrier under drops,
/// duplicates, delays and crashes; every saga must end in a state the saga oracle accepts.
/// `TWOPC_SAGA_SIM_SEEDS=N` runs more (soak); `TWOPC_SAGA_SIM_SEED=S` replays one.
#[test]
fn saga_invariants_hold_on_every_seed() {
    use chaos_tests::sim::{SagaSimConfig, run_saga_seed};
    let seeds: Vec<u64> = match env_u64("TWOPC_SAGA_SIM_SEED") {
        Some(seed) => vec![seed],
        None => (0..env_u64("TWOPC_SAGA_SIM_SEEDS").unwrap_or(1_000)).collect(),
    };
    let mut totals = [0u64; 9];
    for seed in seeds {
        let stats = run_saga_seed(seed, SagaSimConfig::default()).unwrap_or_else(|e| {
            panic!("{e}\nreplay: TWOPC_SAGA_SIM_SEED={seed} cargo test -p twopc-chaos-tests --test simulation saga")
        });
        for (total, n) in totals.iter_mut().zip([
            stats.completed,
            stats.compensated,
            stats.needs_attention,
            stats.coordinator_crashes,
            stats.participant_crashes,
            stats.operator_retries,
            stats.clock_jumps,
            stats.timeouts,
            stats.fences_refused,
        ]) {
            *total += n;
        }
    }
    eprintln!(
        "sagas: {} completed, {} compensated, {} needs_attention; {} coordinator and {} participant crashes; {} operator retries; {} wall clock steps and slews; {} timeouts; {} fences refused",
        totals[0],
        totals[1],
        totals[2],
        totals[3],
        totals[4],
        totals[5],
        totals[6],
        totals[7],
        totals[8]
    );
    // Every fate, both kinds of crash, clock jumps, timeouts and refused fences happened: the
    // runs are not vacuous.
    assert!(totals.iter().all(|n| *n > 0), "{totals:?}");
}

/// The first of the first 5,000 saga seeds a broken shell fails, with its message.
fn first_saga_catch(mutation: chaos_tests::sim::SagaMutation) -> (u64, String) {
    use chaos_tests::sim::{SagaSimConfig, run_saga_seed};
    let config = SagaSimConfig {
        mutation: Some(mutation),
        ..SagaSimConfig::default()
    };
    (0..5_000)
        .find_map(|seed| run_saga_seed(seed, config).err().map(|e| (seed, e)))
        .unwrap_or_else(|| panic!("no saga seed catches {mutation:?}"))
}

#[test]
fn a_saga_reply_sent_before_its_records_are_durable_is_caught() {
    // Issue 25, item 1: a 202 (or a terminal answer) resting on records a crash takes back.
    let (seed, failure) =
        first_saga_catch(chaos_tests::sim::SagaMutation::CoordinatorRepliesBeforeDurable);
    eprintln!("seed {seed}: {failure}");
}

#[test]
fn a_saga_deadline_timed_on_the_wall_clock_is_caught() {
    // Issue 25, item 5: the engine fed the stepping, slewing wall clock loses deadlines (or
    // brings them early after a restart).
    let (seed, failure) = first_saga_catch(chaos_tests::sim::SagaMutation::DeadlineOnWallClock);
    eprintln!("seed {seed}: {failure}");
    assert!(
        failure.contains("compensating") || failure.contains("early"),
        "{failure}"
    );
}

#[test]
fn a_participant_answering_a_saga_repeat_from_memory_is_caught() {
    // Issue 25, item 2: `done` for a step whose record a crash takes back.
    let (seed, failure) =
        first_saga_catch(chaos_tests::sim::SagaMutation::ParticipantAnswersFromMemory);
    eprintln!("seed {seed}: {failure}");
}

#[test]
fn a_fenced_run_that_never_raises_its_epoch_is_caught() {
    // Issue 24, item 3: after a restore, participants holding the restored run's epoch under
    // the lost run ignored its answers; in doubt for ever without a restart.
    let failure = first_catch(Mutation::NoEpochRaise);
    eprintln!("{failure}");
    assert_eq!(failure.invariant, "liveness", "{failure}");
}
