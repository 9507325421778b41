//! Random histories, random crash points, through the simulated disk: every record whose forced
//! or grouped append (or checkpoint) returned success is recovered, in order; what is recovered is exactly a
//! prefix of what was submitted (nothing after a gap); a crash during recovery is survivable.

mod support;

use proptest::prelude::*;
use support::{encode_history, full_history, open, payload, small_segments};
use wal::sim::{SimStorage, Unsynced};
use wal::{AppendTicket, Durability, RecordType};

#[derive(Debug, Clone)]
enum Op {
    /// Submit these appends (payload length, durability) together, then wait for all of them.
    Batch(Vec<(usize, Durability)>),
    Checkpoint,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => prop::collection::vec((0usize..200, durability()), 1..12).prop_map(Op::Batch),
        1 => Just(Op::Checkpoint),
    ]
}

fn durability() -> impl Strategy<Value = Durability> {
    prop_oneof![
        Just(Durability::Lazy),
        Just(Durability::Forced),
        Just(Durability::Grouped),
    ]
}

fn mode() -> impl Strategy<Value = Unsynced> {
    prop_oneof![
        Just(Unsynced::Drop),
        Just(Unsynced::Keep),
        any::<u64>().prop_map(|seed| Unsynced::Tear { seed }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn acknowledged_records_survive_any_crash(
        ops in prop::collection::vec(op(), 1..25),
        segment_bytes_max in prop_oneof![Just(128u64), Just(600), Just(64 * 1024)],
        crash_after_ops in 0u64..120,
        crash_mode in mode(),
        recovery_crash in prop::option::of((0u64..12, mode())),
        zero_tails in any::<bool>(),
    ) {
        let sim = SimStorage::new();
        sim.set_zero_tails(zero_tails);
        let options = small_segments(segment_bytes_max);
        let (log, _) = open(&sim, options.clone()).unwrap();
        sim.arm_crash(crash_after_ops, crash_mode);

        // Everything submitted, in seq order, and the longest history acknowledged as durable.
        let mut submitted: Vec<Vec<u8>> = Vec::new();
        let mut durable_len = 0usize;
        'run: for op in &ops {
            match op {
                Op::Batch(appends) => {
                    let mut tickets: Vec<(AppendTicket, bool, usize)> = Vec::new();
                    for &(len, durability) in appends {
                        let p = payload(submitted.len() as u64 + 1, len);
                        submitted.push(p.clone());
                        let durable = durability != Durability::Lazy;
                        tickets.push((log.submit(RecordType(1), p, durability), durable, submitted.len()));
                    }
                    for (ticket, forced, position) in tickets {
                        match ticket.wait_blocking() {
                            Ok(seq) => {
                                prop_assert_eq!(seq, position as u64);
                                if forced {
                                    durable_len = durable_len.max(position);
                                }
                            }
                            Err(_) => {
                                prop_assert!(sim.has_crashed() || log.is_poisoned());
                                break 'run;
                            }
                        }
                    }
                }
                Op::Checkpoint => {
                    let snapshot = encode_history(&submitted);
                    match log.checkpoint(snapshot).wait_blocking() {
                        Ok(covered) => {
                            prop_assert_eq!(covered, submitted.len() as u64);
                            durable_len = durable_len.max(submitted.len());
                        }
                        Err(_) => break 'run,
                    }
                }
            }
        }
        if !sim.has_crashed() {
            sim.crash(crash_mode);
        }
        drop(log);
        sim.reboot();

        if let Some((ops, mode)) = recovery_crash {
            sim.arm_crash(ops, mode);
            if let Ok((log, _)) = open(&sim, options.clone()) {
                drop(log);
            }
            if !sim.has_crashed() {
                sim.crash(mode);
            }
            sim.reboot();
        }

        let (log, recovery) = open(&sim, options.clone()).unwrap();
        let history = full_history(&recovery);
        prop_assert!(history.len() >= durable_len,
            "lost acknowledged records: recovered {} < durable {}", history.len(), durable_len);
        prop_assert!(history.len() <= submitted.len());
        prop_assert!(history[..] == submitted[..history.len()], "recovered history is not a prefix");

        // The log goes on from there, and a clean reopen returns the same plus the new record.
        let next = payload(history.len() as u64 + 1, 10);
        let seq = log.submit(RecordType(2), next.clone(), Durability::Forced).wait_blocking().unwrap();
        prop_assert_eq!(seq, history.len() as u64 + 1);
        drop(log);
        let (_log, again) = open(&sim, options).unwrap();
        let mut expected = history.clone();
        expected.push(next);
        prop_assert_eq!(full_history(&again), expected);
        prop_assert!(again.torn_tail.is_none());
    }
}
