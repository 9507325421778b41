//! A write or fsync failure poisons the log: that request and every later one fail, and fsync is
//! never called again (after a failed fsync the kernel may have dropped the dirty pages, so a retry
//! that "succeeds" would lie).

mod support;

use support::{open, payload};
use wal::sim::SimStorage;
use wal::{Durability, RecordType, WalError, WalOptions};

#[test]
fn an_fsync_error_fails_every_later_append_and_fsync_is_never_retried() {
    let sim = SimStorage::new();
    let (log, _) = open(&sim, WalOptions::default()).unwrap();
    assert_eq!(
        log.submit(RecordType(1), payload(1, 8), Durability::Forced)
            .wait_blocking()
            .unwrap(),
        1
    );

    sim.set_fail_sync(true);
    let failed = log
        .submit(RecordType(1), payload(2, 8), Durability::Forced)
        .wait_blocking();
    assert!(
        matches!(
            &failed,
            Err(WalError::Io {
                op: "fdatasync",
                ..
            })
        ),
        "{failed:?}"
    );
    assert!(log.is_poisoned());
    assert!(log.stats().poisoned);
    let syncs_at_failure = sim.stats().file_syncs;
    let writes_at_failure = sim.stats().writes;

    // The disk "recovers"; the log must not.
    sim.set_fail_sync(false);
    for durability in [Durability::Forced, Durability::Lazy] {
        let later = log
            .submit(RecordType(1), payload(3, 8), durability)
            .wait_blocking();
        assert!(matches!(later, Err(WalError::Poisoned { .. })), "{later:?}");
    }
    let checkpoint = log.checkpoint(b"state".to_vec()).wait_blocking();
    assert!(
        matches!(checkpoint, Err(WalError::Poisoned { .. })),
        "{checkpoint:?}"
    );
    assert_eq!(
        sim.stats().file_syncs,
        syncs_at_failure,
        "fsync was retried"
    );
    assert_eq!(
        sim.stats().writes,
        writes_at_failure,
        "a poisoned log wrote again"
    );
    let cause = match log
        .submit(RecordType(1), vec![], Durability::Forced)
        .wait_blocking()
    {
        Err(WalError::Poisoned { cause }) => cause,
        other => panic!("{other:?}"),
    };
    assert!(cause.contains("fdatasync"), "{cause}");
}

#[test]
fn a_write_error_poisons_the_log_and_fails_the_whole_batch() {
    let sim = SimStorage::new();
    let (log, _) = open(&sim, WalOptions::default()).unwrap();
    sim.set_fail_write(true);
    let tickets: Vec<_> = (1..=3)
        .map(|i| log.submit(RecordType(1), payload(i, 8), Durability::Lazy))
        .collect();
    let forced = log.submit(RecordType(1), payload(4, 8), Durability::Forced);
    for ticket in tickets.into_iter().chain([forced]) {
        assert!(ticket.wait_blocking().is_err());
    }
    assert!(log.is_poisoned());
    let syncs = sim.stats().file_syncs;
    sim.set_fail_write(false);
    assert!(matches!(
        log.submit(RecordType(1), vec![1], Durability::Forced)
            .wait_blocking(),
        Err(WalError::Poisoned { .. })
    ));
    assert_eq!(sim.stats().file_syncs, syncs);

    // A restart (a new open) is the only way back; it recovers what was durable.
    drop(log);
    let (log, recovery) = open(&sim, WalOptions::default()).unwrap();
    assert!(recovery.records.is_empty());
    assert!(!log.is_poisoned());
    assert_eq!(
        log.submit(RecordType(1), vec![1], Durability::Forced)
            .wait_blocking()
            .unwrap(),
        1
    );
}

#[tokio::test]
async fn async_appenders_see_the_poison_too() {
    let sim = SimStorage::new();
    let (log, _) = open(&sim, WalOptions::default()).unwrap();
    sim.set_fail_sync(true);
    assert!(
        log.append(RecordType(1), vec![1], Durability::Forced)
            .await
            .is_err()
    );
    assert!(matches!(
        log.append(RecordType(1), vec![2], Durability::Forced).await,
        Err(WalError::Poisoned { .. })
    ));
}

#[test]
fn close_drains_then_refuses() {
    let sim = SimStorage::new();
    let (log, _) = open(&sim, WalOptions::default()).unwrap();
    let pending: Vec<_> = (1..=20)
        .map(|i| log.submit(RecordType(1), payload(i, 8), Durability::Forced))
        .collect();
    log.close();
    for (i, ticket) in pending.into_iter().enumerate() {
        assert_eq!(ticket.wait_blocking().unwrap(), i as u64 + 1);
    }
    assert!(matches!(
        log.submit(RecordType(1), vec![], Durability::Forced)
            .wait_blocking(),
        Err(WalError::Closed)
    ));
}
