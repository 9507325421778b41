//! Framing and recovery against a table of mangled logs. Each case builds segment files byte by
//! byte on the simulated disk, opens the log, and checks the exact outcome: the records returned
//! and the truncation point, or the exact corruption error (file, offset, reason). The read-only
//! inspector must agree and must not change anything.

mod support;

use std::path::PathBuf;

use support::{dir, open, seg};
use wal::format::{FRAME_OVERHEAD_BYTES, LEN_MAX};
use wal::sim::SimStorage;
use wal::{RecordType, WalError, WalOptions, inspect};

fn frame(seq: u64, payload: &[u8]) -> Vec<u8> {
    let mut buf = Vec::new();
    wal::encode_frame(&mut buf, seq, RecordType(7), payload);
    buf
}

fn payload_of(seq: u64) -> Vec<u8> {
    format!("record-{seq}-{}", "x".repeat(seq as usize)).into_bytes()
}

/// Three frames, seq 1..=3, and where each starts.
fn three() -> (Vec<u8>, [usize; 3]) {
    let (f1, f2, f3) = (
        frame(1, &payload_of(1)),
        frame(2, &payload_of(2)),
        frame(3, &payload_of(3)),
    );
    let offsets = [0, f1.len(), f1.len() + f2.len()];
    ([f1, f2, f3].concat(), offsets)
}

#[derive(Debug, PartialEq, Eq)]
enum Expected {
    /// Records returned (by seq) and, if torn, (segment, offset, exact reason).
    Opens {
        seqs: Vec<u64>,
        torn: Option<(PathBuf, u64, String)>,
    },
    /// Refused: (file, offset, exact reason).
    Corrupt {
        file: PathBuf,
        offset: u64,
        reason: String,
    },
}

fn opens(seqs: &[u64], torn: Option<(PathBuf, usize, String)>) -> Expected {
    Expected::Opens {
        seqs: seqs.to_vec(),
        torn: torn.map(|(f, o, r)| (f, o as u64, r)),
    }
}

fn corrupt(file: PathBuf, offset: usize, reason: impl Into<String>) -> Expected {
    Expected::Corrupt {
        file,
        offset: offset as u64,
        reason: reason.into(),
    }
}

/// Lays out `files` on a fresh simulated disk and checks open and inspect against `expected`.
fn check(case: &str, files: &[(PathBuf, Vec<u8>)], expected: &Expected) {
    let sim = SimStorage::new();
    wal::Storage::create_dir_all(&sim, &dir()).unwrap();
    for (path, bytes) in files {
        sim.set_contents(path, bytes.clone());
    }
    let before: Vec<_> = files.iter().map(|(p, _)| sim.contents(p)).collect();
    let inspected = inspect::dump_with_storage(&sim, &dir(), &mut |_| {});
    let after: Vec<_> = files.iter().map(|(p, _)| sim.contents(p)).collect();
    assert_eq!(before, after, "{case}: inspect must not modify anything");

    match (open(&sim, WalOptions::default()), expected) {
        (Ok((_log, recovery)), Expected::Opens { seqs, torn }) => {
            let got: Vec<u64> = recovery.records.iter().map(|r| r.seq).collect();
            assert_eq!(&got, seqs, "{case}: records");
            for record in &recovery.records {
                assert_eq!(record.payload, payload_of(record.seq), "{case}: payload");
            }
            let got_torn = recovery
                .torn_tail
                .as_ref()
                .map(|t| (t.file.clone(), t.offset, t.reason.clone()));
            assert_eq!(&got_torn, torn, "{case}: torn tail");
            let summary = inspected.unwrap_or_else(|e| panic!("{case}: inspect failed: {e}"));
            assert_eq!(
                summary.records,
                seqs.len() as u64,
                "{case}: inspect records"
            );
            let inspected_torn = summary.torn_tail.map(|t| (t.file, t.offset, t.reason));
            assert_eq!(&inspected_torn, torn, "{case}: inspect torn tail");
            if let Some((file, offset, _)) = torn {
                let copy = recovery
                    .torn_tail
                    .as_ref()
                    .and_then(|t| t.broken_copy.clone())
                    .unwrap();
                let original = &files.iter().find(|(p, _)| p == file).unwrap().1;
                assert_eq!(
                    sim.contents(&copy).unwrap(),
                    original[*offset as usize..],
                    "{case}: .broken copy"
                );
                assert_eq!(
                    sim.contents(file).unwrap(),
                    original[..*offset as usize],
                    "{case}: truncated"
                );
            }
        }
        (
            Err(WalError::Corrupt {
                file,
                offset,
                reason,
            }),
            Expected::Corrupt { .. },
        ) => {
            let got = Expected::Corrupt {
                file,
                offset,
                reason,
            };
            assert_eq!(&got, expected, "{case}");
            match inspected {
                Err(WalError::Corrupt {
                    file,
                    offset,
                    reason,
                }) => {
                    assert_eq!(
                        &Expected::Corrupt {
                            file,
                            offset,
                            reason
                        },
                        expected,
                        "{case}: inspect"
                    )
                }
                other => panic!("{case}: inspect should refuse too, got {other:?}"),
            }
        }
        (Ok((_, recovery)), _) => panic!("{case}: expected {expected:?}, opened with {recovery:?}"),
        (Err(error), _) => panic!("{case}: expected {expected:?}, got error {error}"),
    }
    // Whatever recovery did must be stable: a second open (after a drop) sees the same and no tear.
    if let Expected::Opens { seqs, .. } = expected {
        let (_log, again) = open(&sim, WalOptions::default()).unwrap();
        assert_eq!(
            again.records.iter().map(|r| r.seq).collect::<Vec<_>>(),
            *seqs,
            "{case}: reopen"
        );
        assert_eq!(again.torn_tail, None, "{case}: reopen has no torn tail");
    }
}

fn crc_reason(bytes: &[u8]) -> String {
    wal::decode_frame(bytes).unwrap_err().to_string()
}

#[test]
fn clean_log_and_empty_segment() {
    let (log, _) = three();
    check("clean", &[(seg(1), log)], &opens(&[1, 2, 3], None));
    check("empty segment", &[(seg(1), vec![])], &opens(&[], None));
    check("no files", &[], &opens(&[], None));
}

#[test]
fn truncated_at_every_byte_of_the_last_record_is_a_torn_tail() {
    let (log, [_, _, o3]) = three();
    let frame3 = log.len() - o3;
    for cut in 1..frame3 {
        let reason = if cut < 4 {
            format!("truncated length field ({cut} bytes left)")
        } else {
            format!("truncated record: frame of {frame3} bytes but only {cut} bytes left")
        };
        check(
            &format!("cut {cut} bytes into record 3"),
            &[(seg(1), log[..o3 + cut].to_vec())],
            &opens(&[1, 2], Some((seg(1), o3, reason))),
        );
    }
    // Cut exactly at a record boundary: nothing torn.
    check(
        "cut at boundary",
        &[(seg(1), log[..o3].to_vec())],
        &opens(&[1, 2], None),
    );
}

#[test]
fn zero_tails() {
    let (log, _) = three();
    let end = log.len();
    let zeroed = [log.clone(), vec![0; 4096]].concat();
    check(
        "zero tail after last record",
        &[(seg(1), zeroed)],
        &opens(
            &[1, 2, 3],
            Some((seg(1), end, "zero length (zero-filled space)".into())),
        ),
    );
    check(
        "segment of only zeros",
        &[(seg(1), vec![0; 100])],
        &opens(
            &[],
            Some((seg(1), 0, "zero length (zero-filled space)".into())),
        ),
    );
    let (log, [_, o2, o3]) = three();
    let mut holed = log.clone();
    holed[o2..o3].fill(0);
    check(
        "zeroed record followed by a valid one",
        &[(seg(1), holed)],
        &corrupt(
            seg(1),
            o2,
            format!("zero length (zero-filled space), and a valid record follows at offset {o3}"),
        ),
    );
}

#[test]
fn bit_flips_in_each_field() {
    let (log, [_, o2, o3]) = three();
    // (field, offset within the frame) for the type, seq, payload and crc fields.
    let frame3 = log.len() - o3;
    let fields = [
        ("type", 4),
        ("seq", 5),
        ("seq high byte", 12),
        ("payload", 13),
        ("crc", frame3 - 1),
    ];
    for (field, at) in fields {
        for bit in [0u8, 7] {
            let mut last = log.clone();
            last[o3 + at] ^= 1 << bit;
            check(
                &format!("flip bit {bit} of {field} in the last record"),
                &[(seg(1), last.clone())],
                &opens(&[1, 2], Some((seg(1), o3, crc_reason(&last[o3..])))),
            );
            let mut middle = log.clone();
            middle[o2 + at.min(o3 - o2 - 1)] ^= 1 << bit;
            check(
                &format!("flip bit {bit} of {field} in a middle record"),
                &[(seg(1), middle.clone())],
                &corrupt(
                    seg(1),
                    o2,
                    format!(
                        "{}, and a valid record follows at offset {o3}",
                        crc_reason(&middle[o2..])
                    ),
                ),
            );
        }
    }
    // Length field: a flip in the high byte makes it huge: refused before any allocation.
    let mut last = log.clone();
    last[o3 + 3] ^= 0x80;
    let len = u32::from_le_bytes(last[o3..o3 + 4].try_into().unwrap());
    check(
        "flip high bit of length in the last record",
        &[(seg(1), last)],
        &opens(
            &[1, 2],
            Some((
                seg(1),
                o3,
                format!("length {len} exceeds the maximum of {LEN_MAX}"),
            )),
        ),
    );
    let mut middle = log.clone();
    middle[o2 + 3] ^= 0x80;
    let len = u32::from_le_bytes(middle[o2..o2 + 4].try_into().unwrap());
    check(
        "flip high bit of length in a middle record",
        &[(seg(1), middle)],
        &corrupt(
            seg(1),
            o2,
            format!(
                "length {len} exceeds the maximum of {LEN_MAX}, and a valid record follows at offset {o3}"
            ),
        ),
    );
    // A flip in the low bit of a middle record's length shifts where the frame ends: bad CRC.
    let mut middle = log.clone();
    middle[o2] ^= 1;
    check(
        "flip low bit of length in a middle record",
        &[(seg(1), middle.clone())],
        &corrupt(
            seg(1),
            o2,
            format!(
                "{}, and a valid record follows at offset {o3}",
                crc_reason(&middle[o2..])
            ),
        ),
    );
}

#[test]
fn every_single_bit_flip_is_caught_and_never_silently_accepted() {
    let (log, [_, o2, o3]) = three();
    for bit in 0..log.len() * 8 {
        let mut mangled = log.clone();
        mangled[bit / 8] ^= 1 << (bit % 8);
        let sim = SimStorage::new();
        sim.set_contents(&seg(1), mangled);
        match open(&sim, WalOptions::default()) {
            // Only damage inside the last record may be taken for a torn write.
            Ok((_, recovery)) => {
                assert!(
                    bit / 8 >= o3,
                    "bit {bit}: flip before the last record was accepted"
                );
                assert_eq!(recovery.records.len(), 2);
                assert_eq!(recovery.torn_tail.unwrap().offset, o3 as u64);
            }
            Err(WalError::Corrupt { offset, .. }) => {
                assert!(bit / 8 < o3, "bit {bit}");
                let record_start = if bit / 8 >= o2 { o2 } else { 0 };
                assert_eq!(offset, record_start as u64, "bit {bit}");
            }
            Err(other) => panic!("bit {bit}: {other}"),
        }
    }
}

#[test]
fn oversize_lengths_are_refused_on_read_and_write() {
    let (log, [_, _, o3]) = three();
    let mut huge = log[..o3].to_vec();
    huge.extend_from_slice(&(LEN_MAX + 1).to_le_bytes());
    huge.extend_from_slice(&[1; 20]);
    check(
        "length just over the maximum at the tail",
        &[(seg(1), huge)],
        &opens(
            &[1, 2],
            Some((
                seg(1),
                o3,
                format!("length {} exceeds the maximum of {LEN_MAX}", LEN_MAX + 1),
            )),
        ),
    );
    let mut past_end = log[..o3].to_vec();
    past_end.extend_from_slice(&LEN_MAX.to_le_bytes());
    past_end.extend_from_slice(&[1; 20]);
    check(
        "maximal length running past the end of the file",
        &[(seg(1), past_end)],
        &opens(
            &[1, 2],
            Some((
                seg(1),
                o3,
                format!(
                    "truncated record: frame of {} bytes but only 24 bytes left",
                    LEN_MAX as usize + 8
                ),
            )),
        ),
    );
    let mut tiny = log[..o3].to_vec();
    tiny.extend_from_slice(&5u32.to_le_bytes());
    tiny.extend_from_slice(&[1; 20]);
    check(
        "length below the minimum",
        &[(seg(1), tiny)],
        &opens(
            &[1, 2],
            Some((seg(1), o3, "length 5 is below the minimum of 9".into())),
        ),
    );

    let sim = SimStorage::new();
    let (log, _) = open(&sim, WalOptions::default()).unwrap();
    let max = wal::RECORD_PAYLOAD_BYTES_MAX;
    let err = log
        .submit(RecordType(1), vec![0; max + 1], wal::Durability::Forced)
        .wait_blocking();
    assert!(
        matches!(err, Err(WalError::RecordTooLarge { len, max: m }) if len == max + 1 && m == max)
    );
    assert_eq!(
        log.submit(RecordType(1), vec![7; max], wal::Durability::Forced)
            .wait_blocking()
            .unwrap(),
        1
    );
    assert!(matches!(
        log.submit(RecordType(0), vec![], wal::Durability::Forced)
            .wait_blocking(),
        Err(WalError::InvalidRecordType(0))
    ));
    assert!(matches!(
        log.submit(RecordType(128), vec![], wal::Durability::Forced)
            .wait_blocking(),
        Err(WalError::InvalidRecordType(128))
    ));
    drop(log);
    let (_, recovery) = open(&sim, WalOptions::default()).unwrap();
    assert_eq!(recovery.records.len(), 1);
    assert_eq!(recovery.records[0].payload.len(), max);
    assert_eq!(FRAME_OVERHEAD_BYTES, 17);
}

#[test]
fn sequence_gaps() {
    let log = [
        frame(1, &payload_of(1)),
        frame(2, &payload_of(2)),
        frame(4, &payload_of(4)),
    ]
    .concat();
    let o3 = log.len() - frame(4, &payload_of(4)).len();
    check(
        "gap inside a segment",
        &[(seg(1), log)],
        &corrupt(seg(1), o3, "sequence gap: expected seq 3, found 4"),
    );
    let dup = [frame(1, &payload_of(1)), frame(1, &payload_of(1))].concat();
    check(
        "repeated seq",
        &[(seg(1), dup)],
        &corrupt(
            seg(1),
            frame(1, &payload_of(1)).len(),
            "sequence gap: expected seq 2, found 1",
        ),
    );

    let first = [frame(1, &payload_of(1)), frame(2, &payload_of(2))].concat();
    check(
        "missing segment",
        &[(seg(1), first.clone()), (seg(4), frame(4, &payload_of(4)))],
        &corrupt(
            seg(4),
            0,
            "sequence gap: segment starts at seq 4, expected 3",
        ),
    );
    check(
        "segment name disagrees with its first record",
        &[(seg(1), first), (seg(3), frame(4, &payload_of(4)))],
        &corrupt(seg(3), 0, "sequence gap: expected seq 3, found 4"),
    );
    check(
        "first segment missing",
        &[(seg(3), frame(3, &payload_of(3)))],
        &corrupt(
            seg(3),
            0,
            "sequence gap: there is no snapshot but the first segment starts at seq 3",
        ),
    );
}

#[test]
fn corruption_in_an_older_segment_is_refused_even_at_its_end() {
    let (log, [_, o2, o3]) = three();
    let older = log[..o3].to_vec();
    let newer = frame(3, &payload_of(3));
    let mut flipped = older.clone();
    flipped[o3 - 1] ^= 1;
    check(
        "flip in the last record of an older segment",
        &[(seg(1), flipped.clone()), (seg(3), newer.clone())],
        &corrupt(
            seg(1),
            o2,
            format!(
                "{} (in a segment that is not the last)",
                crc_reason(&flipped[o2..])
            ),
        ),
    );
    let cut = older[..o3 - 3].to_vec();
    check(
        "torn-looking end of an older segment",
        &[(seg(1), cut), (seg(3), newer.clone())],
        &corrupt(
            seg(1),
            o2,
            format!(
                "truncated record: frame of {} bytes but only {} bytes left (in a segment that is not the last)",
                o3 - o2,
                o3 - o2 - 3
            ),
        ),
    );
    check(
        "two clean segments",
        &[(seg(1), older), (seg(3), newer)],
        &opens(&[1, 2, 3], None),
    );
}

#[test]
fn garbage_after_the_last_record_that_holds_no_valid_record_is_torn() {
    let (log, _) = three();
    let end = log.len();
    let garbage: Vec<u8> = (0..300u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8 | 1)
        .collect();
    let expected_reason = crc_or_length_reason(&garbage);
    check(
        "random garbage tail",
        &[(seg(1), [log, garbage].concat())],
        &opens(&[1, 2, 3], Some((seg(1), end, expected_reason))),
    );
}

fn crc_or_length_reason(bytes: &[u8]) -> String {
    wal::decode_frame(bytes).unwrap_err().to_string()
}

#[test]
fn a_damaged_snapshot_is_refused() {
    let sim = SimStorage::new();
    let (log, _) = open(&sim, WalOptions::default()).unwrap();
    log.submit(RecordType(1), b"a".to_vec(), wal::Durability::Forced)
        .wait_blocking()
        .unwrap();
    assert_eq!(
        log.checkpoint(b"state".to_vec()).wait_blocking().unwrap(),
        1
    );
    drop(log);
    let snap = dir().join(wal::format::snapshot_name(1));
    sim.flip_bit(&snap, 30, 2);
    match open(&sim, WalOptions::default()) {
        Err(WalError::Corrupt {
            file,
            offset: 0,
            reason,
        }) => {
            assert_eq!(file, snap);
            assert!(reason.starts_with("snapshot CRC mismatch"), "{reason}");
        }
        other => panic!("expected corrupt snapshot, got {other:?}"),
    }
}
