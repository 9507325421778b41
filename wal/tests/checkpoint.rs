//! Segment roll and checkpoints: old segments are deleted, recovery returns the snapshot plus
//! later records, and a crash at any step of a checkpoint recovers either the old or the new state.

mod support;

use support::{dir, encode_history, full_history, names, open, payload, small_segments};
use wal::sim::{SimStorage, Unsynced};
use wal::{Durability, RecordType, Wal, WalOptions};

fn append_n(log: &Wal, history: &mut Vec<Vec<u8>>, n: usize) {
    for _ in 0..n {
        let p = payload(history.len() as u64 + 1, 40);
        history.push(p.clone());
        let seq = log
            .submit(RecordType(1), p, Durability::Forced)
            .wait_blocking()
            .unwrap();
        assert_eq!(seq, history.len() as u64);
    }
}

fn segments(sim: &SimStorage) -> Vec<String> {
    names(sim)
        .into_iter()
        .filter(|n| n.ends_with(".wal"))
        .collect()
}

#[test]
fn segments_roll_at_the_size_limit_and_checkpoint_deletes_whole_old_ones() {
    let sim = SimStorage::new();
    // 57-byte frames: 4 per 256-byte segment.
    let options = small_segments(256);
    let (log, _) = open(&sim, options.clone()).unwrap();
    let mut history = Vec::new();
    append_n(&log, &mut history, 10);
    assert_eq!(
        segments(&sim),
        vec![
            wal::format::segment_name(1),
            wal::format::segment_name(5),
            wal::format::segment_name(9)
        ]
    );
    for name in segments(&sim) {
        assert!(
            sim.contents(&dir().join(&name)).unwrap().len() <= 256,
            "{name}"
        );
    }
    let bytes_before = log.stats().log_bytes_on_disk;

    let covered = log
        .checkpoint(encode_history(&history))
        .wait_blocking()
        .unwrap();
    assert_eq!(covered, 10);
    assert_eq!(
        names(&sim),
        vec![
            wal::format::segment_name(11),
            wal::format::snapshot_name(10)
        ],
        "old segments deleted, a fresh one started after the snapshot"
    );
    assert!(log.stats().log_bytes_on_disk < bytes_before);
    append_n(&log, &mut history, 3);

    // A second checkpoint replaces the first snapshot.
    let covered = log
        .checkpoint(encode_history(&history))
        .wait_blocking()
        .unwrap();
    assert_eq!(covered, 13);
    assert_eq!(
        names(&sim),
        vec![
            wal::format::segment_name(14),
            wal::format::snapshot_name(13)
        ]
    );
    append_n(&log, &mut history, 2);
    drop(log);

    let (_log, recovery) = open(&sim, options).unwrap();
    assert_eq!(
        recovery.records.iter().map(|r| r.seq).collect::<Vec<_>>(),
        vec![14, 15]
    );
    assert_eq!(full_history(&recovery), history);
}

#[test]
fn checkpoint_with_nothing_logged_and_a_record_bigger_than_a_segment() {
    let sim = SimStorage::new();
    let options = small_segments(64);
    let (log, _) = open(&sim, options.clone()).unwrap();
    assert_eq!(
        log.checkpoint(encode_history(&[])).wait_blocking().unwrap(),
        0
    );
    let big = payload(1, 1000);
    assert_eq!(
        log.submit(RecordType(1), big.clone(), Durability::Forced)
            .wait_blocking()
            .unwrap(),
        1
    );
    let small = payload(2, 8);
    assert_eq!(
        log.submit(RecordType(1), small.clone(), Durability::Forced)
            .wait_blocking()
            .unwrap(),
        2
    );
    drop(log);
    let (_log, recovery) = open(&sim, options).unwrap();
    assert_eq!(full_history(&recovery), vec![big, small]);
}

/// Runs the same scenario with a crash armed at every mutating operation of the checkpoint in
/// turn, under every crash mode; recovery must give exactly the old or exactly the new state.
#[test]
fn a_crash_at_any_step_of_a_checkpoint_recovers_old_or_new_state() {
    let options = small_segments(200);
    let snapshot_of = |history: &[Vec<u8>]| {
        let mut s = b"STATE".to_vec();
        s.extend_from_slice(&encode_history(history));
        s
    };
    let modes = [
        Unsynced::Drop,
        Unsynced::Keep,
        Unsynced::Tear { seed: 1 },
        Unsynced::Tear { seed: 7 },
    ];
    let mut saw_old = false;
    let mut saw_new = false;
    for mode in modes {
        for crash_at in 0..20u64 {
            let sim = SimStorage::new();
            let (log, _) = open(&sim, options.clone()).unwrap();
            let mut history = Vec::new();
            append_n(&log, &mut history, 5);
            // A first checkpoint, so "old state" includes an old snapshot to replace.
            log.checkpoint(snapshot_of(&history))
                .wait_blocking()
                .unwrap();
            append_n(&log, &mut history, 6);
            let ops_before = sim.stats().ops;
            sim.arm_crash(crash_at, mode);
            let outcome = log.checkpoint(snapshot_of(&history)).wait_blocking();
            let ops_used = sim.stats().ops - ops_before;
            if outcome.is_ok() {
                // The checkpoint finished before the armed crash: crash right after it.
                assert!(
                    crash_at >= ops_used,
                    "crash {crash_at} fired inside ({ops_used} ops)"
                );
                sim.crash(mode);
            }
            drop(log);
            sim.reboot();
            let (_log, recovery) = open(&sim, options.clone()).unwrap();
            let snapshot = recovery.snapshot.clone().unwrap();
            let records: Vec<u64> = recovery.records.iter().map(|r| r.seq).collect();
            if snapshot == snapshot_of(&history[..5]) {
                assert_eq!(
                    records,
                    (6..=11).collect::<Vec<_>>(),
                    "old state, {mode:?} at op {crash_at}"
                );
                saw_old = true;
            } else {
                assert_eq!(
                    snapshot,
                    snapshot_of(&history),
                    "new state, {mode:?} at op {crash_at}"
                );
                assert!(records.is_empty(), "{mode:?} at op {crash_at}");
                assert!(
                    segments(&sim)
                        .iter()
                        .all(|n| *n >= wal::format::segment_name(12)),
                    "segments covered by the new snapshot deleted on recovery: {:?}",
                    names(&sim)
                );
                saw_new = true;
            }
            assert!(
                !names(&sim).iter().any(|n| n.ends_with(".tmp")),
                "tmp snapshot removed"
            );
        }
    }
    assert!(
        saw_old && saw_new,
        "the crash points covered both sides of the commit point"
    );
}

#[test]
fn on_real_files_too() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("wal");
    let options = WalOptions {
        segment_bytes_max: 300,
        ..WalOptions::default()
    };
    let (log, _) = Wal::open(&dir, options.clone()).unwrap();
    let mut history = Vec::new();
    append_n(&log, &mut history, 12);
    let listing = || {
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    };
    assert!(listing().len() > 2, "rolled: {:?}", listing());
    log.checkpoint(encode_history(&history))
        .wait_blocking()
        .unwrap();
    assert_eq!(
        listing(),
        vec![
            wal::format::segment_name(13),
            wal::format::snapshot_name(12)
        ]
    );
    append_n(&log, &mut history, 2);
    drop(log);
    let (_log, recovery) = Wal::open(&dir, options).unwrap();
    assert_eq!(full_history(&recovery), history);
}

/// A deferred checkpoint whose encoding waits for the test: appends made meanwhile go on into
/// the new segment, survive the checkpoint, and follow the snapshot on recovery.
#[test]
fn a_deferred_checkpoint_lets_appends_go_on_while_it_encodes() {
    let sim = SimStorage::new();
    let options = small_segments(256);
    let (log, _) = open(&sim, options.clone()).unwrap();
    let mut history = Vec::new();
    append_n(&log, &mut history, 6);
    let snapshot = encode_history(&history);
    let (release, released) = std::sync::mpsc::channel::<()>();
    let ticket = log.checkpoint_with(move || {
        released.recv().map_err(|e| e.to_string())?;
        Ok(snapshot)
    });
    // Nine more records (more than two segments' worth) while the snapshot is encoded.
    append_n(&log, &mut history, 9);
    let second = log.checkpoint(b"too early".to_vec()).wait_blocking();
    assert!(
        matches!(second, Err(wal::WalError::CheckpointInProgress)),
        "one checkpoint at a time: {second:?}"
    );
    assert!(
        !log.is_poisoned(),
        "a refused checkpoint leaves the log healthy"
    );
    release.send(()).unwrap();
    assert_eq!(ticket.wait_blocking().unwrap(), 6);
    let left = names(&sim);
    assert!(left.contains(&wal::format::snapshot_name(6)), "{left:?}");
    assert!(
        segments(&sim)
            .iter()
            .all(|n| *n >= wal::format::segment_name(7)),
        "only the segments before the snapshot went: {left:?}"
    );
    append_n(&log, &mut history, 1);
    drop(log);
    let (_log, recovery) = open(&sim, options).unwrap();
    assert_eq!(
        recovery.snapshot.as_deref(),
        Some(&encode_history(&history[..6])[..])
    );
    assert_eq!(full_history(&recovery), history);
}

#[test]
fn a_deferred_checkpoint_that_cannot_encode_fails_alone() {
    let sim = SimStorage::new();
    let (log, _) = open(&sim, small_segments(256)).unwrap();
    let mut history = Vec::new();
    append_n(&log, &mut history, 3);
    let outcome = log
        .checkpoint_with(|| Err("the owner gave up".to_string()))
        .wait_blocking();
    assert!(
        matches!(&outcome, Err(wal::WalError::SnapshotEncode(m)) if m.contains("gave up")),
        "{outcome:?}"
    );
    assert!(!log.is_poisoned(), "the owner's failure is not the log's");
    append_n(&log, &mut history, 2);
    let snapshot = encode_history(&history);
    assert_eq!(
        log.checkpoint_with(move || Ok(snapshot))
            .wait_blocking()
            .unwrap(),
        5
    );
    drop(log);
    let (_log, recovery) = open(&sim, small_segments(256)).unwrap();
    assert_eq!(full_history(&recovery), history);
}

/// A crash at every storage operation of a deferred checkpoint, with appends between its start
/// and its snapshot: recovery always gives back every durable record, from the old snapshot or
/// the new one.
#[test]
fn a_crash_at_any_step_of_a_deferred_checkpoint_loses_nothing_durable() {
    let options = small_segments(200);
    let mut saw_new = false;
    for mode in [Unsynced::Drop, Unsynced::Keep, Unsynced::Tear { seed: 3 }] {
        for crash_at in 0..24u64 {
            let sim = SimStorage::new();
            let (log, _) = open(&sim, options.clone()).unwrap();
            let mut history = Vec::new();
            append_n(&log, &mut history, 5);
            log.checkpoint(encode_history(&history))
                .wait_blocking()
                .unwrap();
            append_n(&log, &mut history, 4);
            sim.arm_crash(crash_at, mode);
            let snapshot = encode_history(&history);
            let (release, released) = std::sync::mpsc::channel::<()>();
            let ticket = log.checkpoint_with(move || {
                released.recv().map_err(|e| e.to_string())?;
                Ok(snapshot)
            });
            // Appends after the checkpoint's point; each is durable once acknowledged.
            let mut durable = history.len();
            for _ in 0..4 {
                let p = payload(history.len() as u64 + 1, 40);
                history.push(p.clone());
                if log
                    .submit(RecordType(1), p, Durability::Forced)
                    .wait_blocking()
                    .is_ok()
                {
                    durable = history.len();
                }
            }
            let _ = release.send(());
            let finished = ticket.wait_blocking().is_ok();
            if finished {
                sim.crash(mode);
            }
            drop(log);
            sim.reboot();
            let (_log, recovery) = open(&sim, options.clone()).unwrap();
            let recovered = full_history(&recovery);
            assert!(
                recovered.len() >= durable,
                "{mode:?} at op {crash_at}: {} recovered, {durable} acknowledged",
                recovered.len()
            );
            assert_eq!(
                recovered[..],
                history[..recovered.len()],
                "{mode:?} at op {crash_at}"
            );
            if recovery.snapshot.as_deref() == Some(&encode_history(&history[..9])[..]) {
                saw_new = true;
            }
        }
    }
    assert!(
        saw_new,
        "some crashes came after the new snapshot's commit point"
    );
}

/// Closing the log while a deferred checkpoint is still being encoded waits for its thread, so
/// no temporary snapshot file is written into a directory the log has let go of (the next
/// process to open it, perhaps this one, would find a file it did not make). The next open
/// replays the segments and removes the temporary file.
#[test]
fn closing_during_a_deferred_checkpoint_waits_for_its_file() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, mpsc};

    let sim = SimStorage::new();
    let (log, _) = open(&sim, small_segments(256)).unwrap();
    let mut history = Vec::new();
    append_n(&log, &mut history, 5);
    let snapshot = encode_history(&history);
    let (release, released) = mpsc::channel::<()>();
    let encoded = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&encoded);
    let ticket = log.checkpoint_with(move || {
        released.recv().map_err(|e| e.to_string())?;
        flag.store(true, Ordering::SeqCst);
        Ok(snapshot)
    });
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(100));
        release.send(()).unwrap();
    });
    drop(log);
    assert!(
        encoded.load(Ordering::SeqCst),
        "the log was closed before its checkpoint's thread finished"
    );
    releaser.join().unwrap();
    assert!(
        matches!(ticket.wait_blocking(), Err(wal::WalError::Closed)),
        "a checkpoint cut short by a close is not reported as taken"
    );
    let (_log, recovery) = open(&sim, small_segments(256)).unwrap();
    assert_eq!(full_history(&recovery), history);
    assert!(
        names(&sim).iter().all(|n| !n.ends_with(".tmp")),
        "the next open removes the unfinished snapshot: {:?}",
        names(&sim)
    );
}
