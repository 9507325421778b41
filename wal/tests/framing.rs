//! Framing and recovery against a table of mangled logs. Each case builds segment files byte by
//! byte on the simulated disk, opens the log, and checks the exact outcome: the records returned
//! and the truncation point, or the exact corruption error (file, offset, reason). The read-only
//! inspector must agree and must not change anything.

mod support;

use std::path::PathBuf;

use support::{dir, open, seg};
use wal::format::{FRAME_OVERHEAD_BYTES, HEADER_BYTES, LEN_BYTES, LEN_MAX, LEN_MIN};
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
    // The space a preallocated segment holds past its last record (and what a crash leaves of
    // it): the log's end, not a torn tail. Recovery gives it back without a `.broken` copy.
    let (log, _) = three();
    for zeros in [1, 3, 4, 4096] {
        let case = format!("{zeros} zero bytes after the last record");
        check(
            &case,
            &[(seg(1), [log.clone(), vec![0; zeros]].concat())],
            &opens(&[1, 2, 3], None),
        );
        let sim = SimStorage::new();
        wal::Storage::create_dir_all(&sim, &dir()).unwrap();
        sim.set_contents(&seg(1), [log.clone(), vec![0; zeros]].concat());
        let (_log, _) = open(&sim, WalOptions::default()).unwrap();
        assert_eq!(
            sim.contents(&seg(1)).unwrap(),
            log,
            "{case}: zeros given back"
        );
        assert_eq!(
            sim.file_names(&dir()),
            vec![wal::format::segment_name(1)],
            "{case}: no copy"
        );
    }
    check(
        "segment of only zeros",
        &[(seg(1), vec![0; 100])],
        &opens(&[], None),
    );
    // Zeros are the end only in the last segment: a roll trims the segment it closes.
    let next = frame(4, &payload_of(4));
    check(
        "zero tail in a segment that is not the last",
        &[
            (seg(1), [log.clone(), vec![0; 64]].concat()),
            (seg(4), next),
        ],
        &corrupt(
            seg(1),
            log.len(),
            "zero length (zero-filled space) (in a segment that is not the last)",
        ),
    );
    // A frame after a zero tail is found even when its length starts with a zero byte.
    let end = log.len();
    let late = frame(4, &[b'z'; 256 - 9]);
    assert_eq!(&late[..2], &[0, 1], "len 256");
    check(
        "zero tail, then a valid frame",
        &[(seg(1), [log.clone(), vec![0; 64], late].concat())],
        &corrupt(
            seg(1),
            end,
            format!(
                "zero length (zero-filled space), and a valid record follows at offset {}",
                end + 64
            ),
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
    // Length field: a flip in the high byte makes it huge: refused before any allocation. In the
    // last record too: no torn write leaves a length over the maximum, so it is corruption.
    let mut last = log.clone();
    last[o3 + 3] ^= 0x80;
    let len = u32::from_le_bytes(last[o3..o3 + 4].try_into().unwrap());
    check(
        "flip high bit of length in the last record",
        &[(seg(1), last)],
        &corrupt(
            seg(1),
            o3,
            format!(
                "length {len} exceeds the maximum of {LEN_MAX}, which a torn write cannot leave"
            ),
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
        sim.set_contents(&seg(1), mangled.clone());
        // Inside the last record, only a flip that a torn write could also explain may be cut as
        // torn: anywhere but the length (a complete frame, bad CRC, nothing after it), or a length
        // made larger but still valid (the frame now runs past the end of the file). A length out
        // of range, or made smaller so that the rest of the record follows a complete bad frame,
        // is corruption.
        let (byte, flipped) = (bit / 8, 1u32 << (bit % 8));
        let may_be_torn = byte >= o3 && {
            if byte >= o3 + LEN_BYTES {
                true
            } else {
                let len = u32::from_le_bytes(log[o3..o3 + LEN_BYTES].try_into().unwrap());
                let new_len = len ^ (flipped << (8 * (byte - o3)));
                (LEN_MIN..=LEN_MAX).contains(&new_len)
                    && (new_len > len
                        || mangled[o3 + new_len as usize + 8..].iter().all(|&b| b == 0))
            }
        };
        match open(&sim, WalOptions::default()) {
            Ok((_, recovery)) => {
                assert!(may_be_torn, "bit {bit}: flip taken for a torn write");
                assert_eq!(recovery.records.len(), 2);
                assert_eq!(recovery.torn_tail.unwrap().offset, o3 as u64);
            }
            Err(WalError::Corrupt { offset, .. }) => {
                assert!(!may_be_torn, "bit {bit}: torn write refused as corruption");
                let record_start = if byte >= o3 {
                    o3
                } else if byte >= o2 {
                    o2
                } else {
                    0
                };
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
        &corrupt(
            seg(1),
            o3,
            format!(
                "length {} exceeds the maximum of {LEN_MAX}, which a torn write cannot leave",
                LEN_MAX + 1
            ),
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
        &corrupt(
            seg(1),
            o3,
            "length 5 is below the minimum of 9, which a torn write cannot leave",
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

/// Non-zero bytes that hold no valid frame at any offset.
fn garbage(n: u32) -> Vec<u8> {
    (0..n)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8 | 1)
        .collect()
}

#[test]
fn garbage_after_the_last_record_is_corruption() {
    // A torn write leaves a prefix of what was written, then zeros or nothing: never bytes that
    // decode to no frame at all. (The first four happen to be a length over the maximum.)
    let (log, _) = three();
    let end = log.len();
    let garbage = garbage(300);
    let reason = format!("{}, which a torn write cannot leave", crc_reason(&garbage));
    check(
        "random garbage tail",
        &[(seg(1), [log, garbage].concat())],
        &corrupt(seg(1), end, reason),
    );
}

/// The rule for a bad frame at the end of the last segment: torn only if it is incomplete (fewer
/// bytes left than a header, or a valid length running past the end of the file) or complete with
/// a bad CRC and only zeros or the end of the file after it; everything else is corruption.
#[test]
fn the_last_record_is_torn_only_if_a_torn_write_explains_it() {
    let (log, [_, _, o3]) = three();
    let end = log.len();
    let len3 = u32::from_le_bytes(log[o3..o3 + LEN_BYTES].try_into().unwrap());
    let zeros = vec![0u8; 4096];

    // The length of the fsynced last record flipped over the maximum: with the rest of the record
    // after it, and with the zero tail of a preallocated file after that too.
    let mut over = log.clone();
    over[o3 + 3] ^= 0x01;
    let over_len = len3 ^ 0x0100_0000;
    assert!(over_len > LEN_MAX);
    let over_reason = format!(
        "length {over_len} exceeds the maximum of {LEN_MAX}, which a torn write cannot leave"
    );
    check(
        "length flipped over LEN_MAX in the last record, record bytes after it",
        &[(seg(1), over.clone())],
        &corrupt(seg(1), o3, over_reason.clone()),
    );
    check(
        "length flipped over LEN_MAX in the last record, then a zero tail",
        &[(seg(1), [over, zeros.clone()].concat())],
        &corrupt(seg(1), o3, over_reason),
    );

    // The length flipped below the minimum (21 = 0b10101, bit 4 off: 5).
    assert_eq!(len3, 21, "payload_of(3) is 12 bytes");
    let mut under = log.clone();
    under[o3] ^= 0x10;
    check(
        "length flipped below LEN_MIN in the last record, record bytes after it",
        &[(seg(1), under)],
        &corrupt(
            seg(1),
            o3,
            format!("length 5 is below the minimum of {LEN_MIN}, which a torn write cannot leave"),
        ),
    );

    // A complete last frame whose CRC fails: torn with nothing or zeros after it.
    let mut crc_flip = log.clone();
    crc_flip[end - 1] ^= 0x04;
    let bad_crc = crc_reason(&crc_flip[o3..]);
    check(
        "complete last frame with a CRC flip and nothing after",
        &[(seg(1), crc_flip.clone())],
        &opens(&[1, 2], Some((seg(1), o3, bad_crc.clone()))),
    );
    check(
        "complete last frame with a CRC flip and zeros after",
        &[(seg(1), [crc_flip.clone(), zeros.clone()].concat())],
        &opens(&[1, 2], Some((seg(1), o3, bad_crc.clone()))),
    );

    // ...but corrupt with non-zero bytes after it that hold no valid frame, right after it or
    // after some zeros.
    check(
        "bad last frame followed by non-zero garbage",
        &[(seg(1), [crc_flip.clone(), garbage(64)].concat())],
        &corrupt(
            seg(1),
            o3,
            format!("{bad_crc}, and non-zero bytes follow the frame at offset {end}"),
        ),
    );
    check(
        "bad last frame followed by zeros, then non-zero garbage",
        &[(seg(1), [crc_flip, zeros.clone(), garbage(8)].concat())],
        &corrupt(
            seg(1),
            o3,
            format!(
                "{bad_crc}, and non-zero bytes follow the frame at offset {}",
                end + zeros.len()
            ),
        ),
    );

    // Zero-filled space is the end of the log only if it is zero up to the end of the file.
    check(
        "zero tail, then non-zero garbage",
        &[(seg(1), [log.clone(), zeros.clone(), garbage(32)].concat())],
        &corrupt(
            seg(1),
            end,
            format!(
                "zero length (zero-filled space), and non-zero bytes follow at offset {}",
                end + zeros.len()
            ),
        ),
    );

    // A matching CRC over a reserved type: written that way by something else, never torn.
    let mut reserved = log.clone();
    reserved[o3 + 4] = 200;
    let crc = crc32fast::hash(&reserved[o3..end - 4]);
    reserved[end - 4..].copy_from_slice(&crc.to_le_bytes());
    check(
        "last record with a reserved type under a matching CRC",
        &[(seg(1), reserved)],
        &corrupt(
            seg(1),
            o3,
            "invalid record type 200 under a matching CRC, which a torn write cannot leave",
        ),
    );

    // Incomplete last frames: cut mid-payload, and a header cut short (inside the length, and
    // after a whole length but before the end of the header).
    let frame3 = end - o3;
    let mid_payload = HEADER_BYTES + 5;
    check(
        "incomplete last frame, cut mid-payload",
        &[(seg(1), log[..o3 + mid_payload].to_vec())],
        &opens(
            &[1, 2],
            Some((
                seg(1),
                o3,
                format!(
                    "truncated record: frame of {frame3} bytes but only {mid_payload} bytes left"
                ),
            )),
        ),
    );
    check(
        "header cut short inside the length",
        &[(seg(1), log[..o3 + 2].to_vec())],
        &opens(
            &[1, 2],
            Some((seg(1), o3, "truncated length field (2 bytes left)".into())),
        ),
    );
    check(
        "header cut short after the length",
        &[(seg(1), log[..o3 + 8].to_vec())],
        &opens(
            &[1, 2],
            Some((
                seg(1),
                o3,
                format!("truncated record: frame of {frame3} bytes but only 8 bytes left"),
            )),
        ),
    );

    // An incomplete frame is torn only at the end: a flipped length that makes a record before
    // the last run past the end of the file must not cut the intact records after it.
    let (log, [_, o2, o3]) = three();
    let mut longer = log.clone();
    longer[o2] ^= 0x20;
    let len2 = u32::from_le_bytes(longer[o2..o2 + LEN_BYTES].try_into().unwrap()) as usize;
    assert!(
        o2 + len2 + 8 > end,
        "the flipped length must run past the end"
    );
    check(
        "length of a middle record flipped to run past the end of the file",
        &[(seg(1), longer)],
        &corrupt(
            seg(1),
            o2,
            format!(
                "truncated record: frame of {} bytes but only {} bytes left, and a valid record follows at offset {o3}",
                len2 + 8,
                end - o2
            ),
        ),
    );
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
