//! Log directories the `wal_log` fuzz target (fuzz/, docs/fuzzing.md) found, minimized and
//! inlined: each made recovery or inspection panic on arithmetic over sequence numbers. Each
//! must now be refused as corruption (or, for the last usable number, refuse the append) with
//! the log otherwise intact.

mod support;

use support::{dir, open, seg};
use wal::sim::SimStorage;
use wal::{Durability, RecordType, WalError, WalOptions, inspect};

fn frame(seq: u64, payload: &[u8]) -> Vec<u8> {
    let mut buf = Vec::new();
    wal::encode_frame(&mut buf, seq, RecordType(1), payload);
    buf
}

fn corrupt_reason(result: Result<impl std::fmt::Debug, WalError>) -> String {
    match result {
        Err(WalError::Corrupt { reason, .. }) => reason,
        other => panic!("expected a corrupt log, got {other:?}"),
    }
}

/// Fuzz input `\x5c` (a segment file named seq 0, empty): both recovery and `wal verify`
/// computed "the log ends at seq 0 - 1" and panicked on the subtraction.
#[test]
fn a_segment_named_seq_zero_is_corruption() {
    for content in [Vec::new(), frame(1, b"x")] {
        let sim = SimStorage::new();
        sim.set_contents(&seg(0), content);
        let reason = corrupt_reason(open(&sim, WalOptions::default()).map(|_| ()));
        assert_eq!(
            reason,
            "segment named seq 0, but sequence numbers start at 1"
        );
        let reason = corrupt_reason(inspect::dump_with_storage(&sim, &dir(), &mut |_| {}));
        assert_eq!(
            reason,
            "segment named seq 0, but sequence numbers start at 1"
        );
    }
}

/// A snapshot covering `u64::MAX` leaves no sequence number for the records after it; the
/// scan computed `covered + 1`.
#[test]
fn a_snapshot_at_the_last_sequence_number_is_corruption() {
    let sim = SimStorage::new();
    sim.set_contents(
        &dir().join(wal::format::snapshot_name(u64::MAX)),
        wal::encode_snapshot(u64::MAX, b"state"),
    );
    let reason = corrupt_reason(open(&sim, WalOptions::default()).map(|_| ()));
    assert!(reason.contains("the last there is"), "{reason}");
}

/// A record at `u64::MAX` (valid CRC) and a log whose next number would be `u64::MAX`: the
/// first is refused on open; the second opens, refuses the append with a typed error, and
/// still opens afterwards with its records intact.
#[test]
fn the_last_sequence_number_is_never_given_out() {
    let sim = SimStorage::new();
    sim.set_contents(
        &dir().join(wal::format::snapshot_name(u64::MAX - 1)),
        wal::encode_snapshot(u64::MAX - 1, b"state"),
    );
    sim.set_contents(&seg(u64::MAX), frame(u64::MAX, b"x"));
    let reason = corrupt_reason(open(&sim, WalOptions::default()).map(|_| ()));
    assert!(
        reason.contains("past the last the log gives out"),
        "{reason}"
    );

    sim.set_contents(&seg(u64::MAX), Vec::new());
    let (wal, recovery) = open(&sim, WalOptions::default()).unwrap();
    assert_eq!(recovery.snapshot.as_deref(), Some(&b"state"[..]));
    let appended = wal
        .submit(RecordType(1), b"y".to_vec(), Durability::Forced)
        .wait_blocking();
    assert!(
        matches!(appended, Err(WalError::SequenceExhausted)),
        "{appended:?}"
    );
    assert!(
        !wal.is_poisoned(),
        "a refused append leaves the log healthy"
    );
    wal.close();
    drop(wal);
    let (_wal, again) = open(&sim, WalOptions::default()).unwrap();
    assert!(again.records.is_empty() && again.torn_tail.is_none());
}
