//! The wire encodings of the replication stream: any batch or backup round-trips, and damage to
//! one (a flipped bit, a cut) is refused with an error, never a panic or a different value.

use proptest::prelude::*;
use wal::{BaseBackup, FileOp, OpBatch};

fn name() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop::sample::select(vec!['a', 'z', '0', '9', '.', '-', '_', 'é']),
        1..24,
    )
    .prop_map(|chars| chars.into_iter().collect::<String>())
    .prop_filter("a plain file name", |n| n != "." && n != "..")
}

fn op() -> impl Strategy<Value = FileOp> {
    prop_oneof![
        name().prop_map(|name| FileOp::Create { name }),
        (name(), prop::collection::vec(any::<u8>(), 0..200))
            .prop_map(|(name, bytes)| FileOp::Append { name, bytes }),
        (name(), any::<u64>()).prop_map(|(name, len)| FileOp::Truncate { name, len }),
        (name(), name()).prop_map(|(from, to)| FileOp::Rename { from, to }),
        name().prop_map(|name| FileOp::Remove { name }),
    ]
}

fn batch() -> impl Strategy<Value = OpBatch> {
    (1..u64::MAX / 2, prop::collection::vec(op(), 0..12))
        .prop_map(|(first, ops)| OpBatch { first, ops })
}

fn backup() -> impl Strategy<Value = BaseBackup> {
    (
        1..u64::MAX,
        prop::collection::vec((name(), prop::collection::vec(any::<u8>(), 0..300)), 0..6),
    )
        .prop_map(|(next_op, files)| BaseBackup { next_op, files })
}

proptest! {
    #[test]
    fn batches_round_trip(batch in batch()) {
        prop_assert_eq!(OpBatch::decode(&batch.encode()), Ok(batch));
    }

    #[test]
    fn backups_round_trip(backup in backup()) {
        prop_assert_eq!(BaseBackup::decode(&backup.encode()), Ok(backup));
    }

    #[test]
    fn a_damaged_batch_is_refused(batch in batch(), at in any::<prop::sample::Index>(), bit in 0..8u8, cut in any::<prop::sample::Index>()) {
        let bytes = batch.encode();
        let mut flipped = bytes.clone();
        flipped[at.index(bytes.len())] ^= 1 << bit;
        prop_assert!(OpBatch::decode(&flipped).is_err());
        prop_assert!(OpBatch::decode(&bytes[..cut.index(bytes.len())]).is_err());
    }

    #[test]
    fn a_damaged_backup_is_refused(backup in backup(), at in any::<prop::sample::Index>(), bit in 0..8u8, cut in any::<prop::sample::Index>()) {
        let bytes = backup.encode();
        let mut flipped = bytes.clone();
        flipped[at.index(bytes.len())] ^= 1 << bit;
        prop_assert!(BaseBackup::decode(&flipped).is_err());
        prop_assert!(BaseBackup::decode(&bytes[..cut.index(bytes.len())]).is_err());
    }

    /// Arbitrary bytes never panic the decoders (and never decode by accident).
    #[test]
    fn garbage_is_refused(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        prop_assert!(OpBatch::decode(&bytes).is_err());
        prop_assert!(BaseBackup::decode(&bytes).is_err());
    }
}

/// Every single-bit flip and every truncation of a batch with one op of each kind, and of a
/// backup, exhaustively (the checks behind a valid CRC are unit tests in `mirror/codec.rs`).
#[test]
fn every_bit_flip_and_every_cut_is_refused() {
    let batch = OpBatch {
        first: 1,
        ops: vec![
            FileOp::Create {
                name: "00000000000000000001.wal".into(),
            },
            FileOp::Append {
                name: "00000000000000000001.wal".into(),
                bytes: (0..=255).collect(),
            },
            FileOp::Truncate {
                name: "00000000000000000001.wal".into(),
                len: 17,
            },
            FileOp::Rename {
                from: "snapshot-00000000000000000001.snap.tmp".into(),
                to: "snapshot-00000000000000000001.snap".into(),
            },
            FileOp::Remove {
                name: "00000000000000000001.wal".into(),
            },
        ],
    };
    let backup = BaseBackup {
        next_op: 6,
        files: vec![("00000000000000000002.wal".into(), vec![9; 100])],
    };
    type Refused = fn(&[u8]) -> bool;
    let encodings: [(Vec<u8>, Refused); 2] = [
        (batch.encode(), |b| OpBatch::decode(b).is_err()),
        (backup.encode(), |b| BaseBackup::decode(b).is_err()),
    ];
    for (bytes, refused) in encodings {
        assert!(!refused(&bytes));
        for bit in 0..bytes.len() * 8 {
            let mut flipped = bytes.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert!(refused(&flipped), "bit {bit}");
        }
        for cut in 0..bytes.len() {
            assert!(refused(&bytes[..cut]), "cut {cut}");
        }
    }
}
