//! Group commit under concurrency: many appenders share fsyncs, and every append that returned is
//! on disk after a power loss that drops everything unsynced.

mod support;

use std::sync::Arc;
use std::time::Duration;

use support::{full_history, open, payload};
use wal::sim::{SimStorage, Unsynced};
use wal::{Durability, RecordType, WalOptions};

const TASKS: u64 = 64;

/// Power loss (everything unsynced dropped), reboot, reopen: what the log recovers.
fn history_after_power_loss(sim: &SimStorage, log: wal::Wal) -> Vec<Vec<u8>> {
    sim.crash(Unsynced::Drop);
    drop(log);
    sim.reboot();
    let (_log, recovery) = open(sim, WalOptions::default()).unwrap();
    full_history(&recovery)
}
const APPENDS_PER_TASK: u64 = 50;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_forced_appends_share_fsyncs_and_survive_a_crash() {
    let sim = SimStorage::new();
    // A disk whose fsync takes a while, as a real one does: appends queue up meanwhile.
    sim.set_sync_delay(Duration::from_millis(1));
    let (log, _) = open(&sim, WalOptions::default()).unwrap();
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let log = log.clone();
        tasks.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            for i in 0..APPENDS_PER_TASK {
                let body = payload(task * 1_000 + i, 64);
                let seq = log
                    .append(RecordType(3), body.clone(), Durability::Forced)
                    .await
                    .unwrap();
                acked.push((seq, body));
            }
            acked
        }));
    }
    let mut acked = Vec::new();
    for task in tasks {
        acked.extend(task.await.unwrap());
    }
    let appends = TASKS * APPENDS_PER_TASK;
    let stats = log.stats();
    assert_eq!(stats.records_appended, appends);
    assert_eq!(acked.len() as u64, appends);
    assert!(
        stats.fsyncs * 10 <= appends,
        "group commit should need far fewer fsyncs than appends: {} fsyncs for {appends} appends",
        stats.fsyncs
    );
    assert_eq!(
        sim.stats().file_syncs,
        stats.fsyncs,
        "the wal counts every fsync it issues"
    );

    let history = history_after_power_loss(&sim, log);
    assert_eq!(history.len() as u64, appends);
    for (seq, body) in acked {
        assert_eq!(history[seq as usize - 1], body, "seq {seq}");
    }
}

#[test]
fn lazy_appends_ride_along_and_become_durable_with_the_next_forced_one() {
    let sim = SimStorage::new();
    let (log, _) = open(&sim, WalOptions::default()).unwrap();
    let syncs_before = log.stats().fsyncs;
    for i in 1..=5 {
        assert_eq!(
            log.submit(RecordType(1), payload(i, 8), Durability::Lazy)
                .wait_blocking()
                .unwrap(),
            i
        );
    }
    assert_eq!(
        log.stats().fsyncs,
        syncs_before,
        "lazy appends alone never fsync"
    );
    log.submit(RecordType(1), payload(6, 8), Durability::Forced)
        .wait_blocking()
        .unwrap();
    assert_eq!(log.stats().fsyncs, syncs_before + 1);
    let history = history_after_power_loss(&sim, log);
    assert_eq!(history.len(), 6);
}

#[test]
fn lazy_appends_without_a_sync_may_be_lost_but_never_leave_a_gap() {
    let sim = SimStorage::new();
    let (log, _) = open(&sim, WalOptions::default()).unwrap();
    log.submit(RecordType(1), payload(1, 8), Durability::Forced)
        .wait_blocking()
        .unwrap();
    for i in 2..=4 {
        log.submit(RecordType(1), payload(i, 8), Durability::Lazy)
            .wait_blocking()
            .unwrap();
    }
    let history = history_after_power_loss(&sim, log);
    assert_eq!(history, vec![payload(1, 8)]);
}

#[test]
fn many_threads_submitting_under_a_mutex_keep_enqueue_order() {
    // Owners hold a std Mutex around "update state + submit": the log order must equal the order in
    // which they took the lock.
    let sim = SimStorage::new();
    let (log, _) = open(&sim, WalOptions::default()).unwrap();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let log = log.clone();
            let order = order.clone();
            std::thread::spawn(move || {
                for i in 0..100u64 {
                    let body = payload(t * 1000 + i, 16);
                    let ticket = {
                        let mut order = order.lock().unwrap();
                        order.push(body.clone());
                        log.submit(RecordType(1), body, Durability::Forced)
                    };
                    ticket.wait_blocking().unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    drop(log);
    let (_log, recovery) = open(&sim, WalOptions::default()).unwrap();
    assert_eq!(full_history(&recovery), *order.lock().unwrap());
}

#[test]
fn close_makes_lazy_appends_durable() {
    let sim = SimStorage::new();
    let (log, _) = open(&sim, WalOptions::default()).unwrap();
    for i in 1..=3 {
        log.submit(RecordType(1), payload(i, 8), Durability::Lazy)
            .wait_blocking()
            .unwrap();
    }
    log.close();
    let history = history_after_power_loss(&sim, log);
    assert_eq!(history.len(), 3);
}

#[test]
fn a_crash_in_the_middle_of_concurrent_appends_loses_nothing_acknowledged() {
    for (round, crash_at) in [3u64, 11, 29, 57, 120, 240].into_iter().enumerate() {
        let sim = SimStorage::new();
        sim.set_sync_delay(Duration::from_micros(200));
        let (log, _) = open(&sim, support::small_segments(2048)).unwrap();
        sim.arm_crash(crash_at, Unsynced::Tear { seed: round as u64 });
        let threads: Vec<_> = (0..16u64)
            .map(|t| {
                let log = log.clone();
                std::thread::spawn(move || {
                    let mut acked = Vec::new();
                    for i in 0..100u64 {
                        let body = payload(t * 1_000 + i, 32);
                        let durability = if i % 3 == 0 {
                            Durability::Lazy
                        } else {
                            Durability::Forced
                        };
                        match log
                            .submit(RecordType(1), body.clone(), durability)
                            .wait_blocking()
                        {
                            Ok(seq) if durability == Durability::Forced => acked.push((seq, body)),
                            Ok(_) => {}
                            Err(_) => break,
                        }
                    }
                    acked
                })
            })
            .collect();
        let acked: Vec<(u64, Vec<u8>)> = threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        if !sim.has_crashed() {
            sim.crash(Unsynced::Tear { seed: round as u64 });
        }
        drop(log);
        sim.reboot();
        let (_log, recovery) = open(&sim, support::small_segments(2048)).unwrap();
        let history = full_history(&recovery);
        for (seq, body) in &acked {
            assert_eq!(
                history.get(*seq as usize - 1),
                Some(body),
                "crash at op {crash_at}: seq {seq} lost"
            );
        }
    }
}

#[test]
fn a_grouped_append_alone_is_synced_by_itself_within_the_group_delay() {
    let sim = SimStorage::new();
    let options = WalOptions {
        group_delay: std::time::Duration::from_millis(20),
        ..WalOptions::default()
    };
    let (log, _) = open(&sim, options).unwrap();
    let syncs_before = log.stats().fsyncs;
    let started = std::time::Instant::now();
    let seq = log
        .submit(RecordType(1), payload(1, 8), Durability::Grouped)
        .wait_blocking()
        .unwrap();
    let waited = started.elapsed();
    assert_eq!(seq, 1);
    assert_eq!(
        log.stats().fsyncs,
        syncs_before + 1,
        "it got an fsync of its own"
    );
    assert!(
        waited >= std::time::Duration::from_millis(15),
        "resolved after {waited:?}: before its group delay, so it took no chance to share"
    );
    // Resolved means durable: a crash that drops everything unsynced keeps it.
    let history = history_after_power_loss(&sim, log);
    assert_eq!(history, vec![payload(1, 8)]);
}

#[test]
fn grouped_appends_share_the_next_forced_fsync_and_resolve_only_after_it() {
    let sim = SimStorage::new();
    let options = WalOptions {
        // Long enough that only the forced append can be what syncs them.
        group_delay: std::time::Duration::from_secs(30),
        ..WalOptions::default()
    };
    let (log, _) = open(&sim, options).unwrap();
    let syncs_before = log.stats().fsyncs;
    let grouped: Vec<_> = (1..=3)
        .map(|i| log.submit(RecordType(1), payload(i, 8), Durability::Grouped))
        .collect();
    // Give the writer time to write them; none may resolve without an fsync.
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert_eq!(log.stats().fsyncs, syncs_before);
    assert_eq!(log.stats().records_appended, 3, "written, not yet synced");
    log.submit(RecordType(1), payload(4, 8), Durability::Forced)
        .wait_blocking()
        .unwrap();
    let seqs: Vec<u64> = grouped
        .into_iter()
        .map(|ticket| ticket.wait_blocking().unwrap())
        .collect();
    assert_eq!(seqs, [1, 2, 3]);
    assert_eq!(
        log.stats().fsyncs,
        syncs_before + 1,
        "one fsync for all four"
    );
    let history = history_after_power_loss(&sim, log);
    assert_eq!(history.len(), 4);
}

#[test]
fn closing_the_log_syncs_and_resolves_waiting_grouped_appends() {
    let sim = SimStorage::new();
    let options = WalOptions {
        group_delay: std::time::Duration::from_secs(30),
        ..WalOptions::default()
    };
    let (log, _) = open(&sim, options).unwrap();
    let ticket = log.submit(RecordType(1), payload(1, 8), Durability::Grouped);
    std::thread::sleep(std::time::Duration::from_millis(20));
    log.close();
    assert_eq!(ticket.wait_blocking().unwrap(), 1);
    let history = history_after_power_loss(&sim, log);
    assert_eq!(history.len(), 1);
}

#[test]
fn without_fsync_a_grouped_append_resolves_at_once() {
    let sim = SimStorage::new();
    let options = WalOptions {
        sync: wal::SyncPolicy::Never,
        group_delay: std::time::Duration::from_secs(30),
        ..WalOptions::default()
    };
    let (log, _) = open(&sim, options).unwrap();
    let started = std::time::Instant::now();
    log.submit(RecordType(1), payload(1, 8), Durability::Grouped)
        .wait_blocking()
        .unwrap();
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    assert_eq!(log.stats().fsyncs, 0);
}

/// Background appends wake nobody: they wait in the queue and go out in the batch of the next
/// append that does, one write and one fsync for all of them.
#[test]
fn background_appends_ride_with_the_next_forced_one() {
    let sim = SimStorage::new();
    let options = WalOptions {
        // Long enough that only the forced append can be what takes them.
        background_delay: std::time::Duration::from_secs(30),
        ..WalOptions::default()
    };
    let (log, _) = open(&sim, options).unwrap();
    let batches_before = log.stats().batches;
    let background: Vec<_> = (1..=3)
        .map(|i| log.submit(RecordType(1), payload(i, 8), Durability::Background))
        .collect();
    // Time for a writer that was woken to have written them.
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert_eq!(log.stats().records_appended, 0, "nothing woke the writer");
    assert_eq!(log.stats().batches, batches_before);
    log.submit(RecordType(1), payload(4, 8), Durability::Forced)
        .wait_blocking()
        .unwrap();
    let seqs: Vec<u64> = background
        .into_iter()
        .map(|ticket| ticket.wait_blocking().unwrap())
        .collect();
    assert_eq!(seqs, [1, 2, 3]);
    assert_eq!(
        log.stats().batches,
        batches_before + 1,
        "one batch for all four"
    );
    let history = history_after_power_loss(&sim, log);
    assert_eq!(history.len(), 4);
}

/// With nothing else coming, a background append is still written, by its delay: a writer
/// asleep with no deadline is woken once to set one.
#[test]
fn a_lone_background_append_is_written_by_its_delay() {
    let sim = SimStorage::new();
    let options = WalOptions {
        background_delay: std::time::Duration::from_millis(20),
        ..WalOptions::default()
    };
    let (log, _) = open(&sim, options).unwrap();
    // Let the writer fall asleep with no deadline first.
    std::thread::sleep(std::time::Duration::from_millis(20));
    let (done, written) = std::sync::mpsc::channel();
    let ticket = log.submit(RecordType(1), payload(1, 8), Durability::Background);
    std::thread::spawn(move || done.send(ticket.wait_blocking()));
    let outcome = written
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("a background append nobody else follows was never written");
    assert_eq!(outcome.unwrap(), 1);
    assert_eq!(log.stats().records_appended, 1);
    // Written, not synced: a power cut may take it, as it may take a lazy append.
    log.submit(RecordType(1), payload(2, 8), Durability::Forced)
        .wait_blocking()
        .unwrap();
    let history = history_after_power_loss(&sim, log);
    assert_eq!(history.len(), 2);
}
