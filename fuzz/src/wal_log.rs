//! `wal_log`: WAL frames, snapshot files and whole log directories from arbitrary bytes.
//!
//! The input is a directory image (see [`read_image`]): files named as segments, snapshots,
//! unfinished snapshots or anything else, each either raw bytes or frames the harness builds
//! (with correct CRCs, so the fuzzer reaches past the checksum) and then damages. Checked:
//! every frame that decodes re-encodes to the same bytes, and so does every snapshot; the
//! read-only inspection and the real recovery agree (both open, with the same records, or both
//! refuse); a log that opened takes an append with the next sequence number and opens again
//! with that record last and nothing cut.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use wal::format::{segment_name, snapshot_name};
use wal::sim::SimStorage;
use wal::{Durability, RecordType, Wal, WalError, WalOptions};

use crate::input::{Reader, Writer};

/// At most this many files per directory image, frames per segment, damaged bytes per file.
const FILES_MAX: usize = 6;
const FRAMES_MAX: usize = 16;
const FLIPS_MAX: usize = 4;

/// What a file of the image is named as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Segment,
    Snapshot,
    /// `snapshot-<seq>.snap.tmp`: an unfinished checkpoint.
    Tmp,
    /// A name the log does not own (a `.broken` copy).
    Other,
}

impl Kind {
    fn from_byte(b: u8) -> Kind {
        match b % 4 {
            0 => Kind::Segment,
            1 => Kind::Snapshot,
            2 => Kind::Tmp,
            _ => Kind::Other,
        }
    }

    pub fn byte(self) -> u8 {
        match self {
            Kind::Segment => 0,
            Kind::Snapshot => 1,
            Kind::Tmp => 2,
            Kind::Other => 3,
        }
    }

    pub fn file_name(self, seq: u64) -> String {
        match self {
            Kind::Segment => segment_name(seq),
            Kind::Snapshot => snapshot_name(seq),
            Kind::Tmp => format!("{}.tmp", snapshot_name(seq)),
            Kind::Other => format!("{}.0.broken", segment_name(seq)),
        }
    }
}

/// One file of a directory image.
#[derive(Debug, Clone)]
pub struct File {
    pub name: String,
    /// Last sequence number of a snapshot, first of a segment (from the name).
    pub seq: u64,
    pub kind: Kind,
    pub bytes: Vec<u8>,
}

/// A frame exactly as the log lays it out, built here rather than with `wal::encode_frame` so
/// that a type or sequence number the log never writes can still carry a valid CRC.
pub fn frame(record_type: u8, seq: u64, payload: &[u8]) -> Vec<u8> {
    let mut buf = Vec::with_capacity(17 + payload.len());
    let len = 9u32.saturating_add(u32::try_from(payload.len()).unwrap_or(u32::MAX));
    buf.extend_from_slice(&len.to_le_bytes());
    buf.push(record_type);
    buf.extend_from_slice(&seq.to_le_bytes());
    buf.extend_from_slice(payload);
    let crc = crc32fast::hash(&buf);
    buf.extend_from_slice(&crc.to_le_bytes());
    buf
}

/// Reads a directory image:
///
/// ```text
/// file*  := kind u8 | seq u64 | how u8 | body
/// body   := raw: bytes                                   (how even)
///         | segment: count u8 | explicit u8 | (type u8 | [seq u64 if explicit odd] | payload bytes)*
///                    | tail bytes | flips               (how odd, kind segment)
///         | snapshot: payload bytes | flips              (how odd, kind snapshot)
/// flips  := count u8 | (offset u16 | xor u8)*
/// ```
pub fn read_image(input: &[u8]) -> Vec<File> {
    let mut r = Reader::new(input);
    let mut files = Vec::new();
    while !r.is_empty() && files.len() < FILES_MAX {
        let kind = Kind::from_byte(r.u8());
        let seq = r.u64();
        let built = r.u8() % 2 == 1;
        let bytes = match (built, kind) {
            (true, Kind::Segment) => {
                let count = usize::from(r.u8()) % (FRAMES_MAX + 1);
                let explicit = r.u8() % 2 == 1;
                let mut bytes = Vec::new();
                for index in 0..count {
                    let record_type = r.u8();
                    let record_seq = if explicit {
                        r.u64()
                    } else {
                        seq.wrapping_add(index as u64)
                    };
                    bytes.extend(frame(record_type, record_seq, r.bytes()));
                }
                bytes.extend_from_slice(r.bytes());
                damage(&mut r, &mut bytes);
                bytes
            }
            (true, Kind::Snapshot) => {
                let mut bytes = wal::encode_snapshot(seq, r.bytes());
                damage(&mut r, &mut bytes);
                bytes
            }
            _ => r.bytes().to_vec(),
        };
        files.push(File {
            name: kind.file_name(seq),
            seq,
            kind,
            bytes,
        });
    }
    files
}

fn damage(r: &mut Reader<'_>, bytes: &mut [u8]) {
    let flips = usize::from(r.u8()) % (FLIPS_MAX + 1);
    for _ in 0..flips {
        let offset = usize::from(r.u16());
        let xor = r.u8();
        if !bytes.is_empty() {
            let at = offset % bytes.len();
            bytes[at] ^= xor;
        }
    }
}

/// Writes an image of frames-built segments and snapshots (seed generation).
#[derive(Debug, Default)]
pub struct ImageWriter {
    pub w: Writer,
}

impl ImageWriter {
    /// A segment named `base` holding `records` (type, payload) at consecutive seqs.
    pub fn segment(&mut self, base: u64, records: &[(u8, Vec<u8>)]) -> &mut Self {
        self.w.u8(Kind::Segment.byte()).u64(base).u8(1);
        self.w
            .u8(u8::try_from(records.len()).expect("few records"))
            .u8(0);
        for (record_type, payload) in records {
            self.w.u8(*record_type).bytes(payload);
        }
        self.w.bytes(&[]).u8(0);
        self
    }

    /// A snapshot covering `seq`.
    pub fn snapshot(&mut self, seq: u64, payload: &[u8]) -> &mut Self {
        self.w
            .u8(Kind::Snapshot.byte())
            .u64(seq)
            .u8(1)
            .bytes(payload)
            .u8(0);
        self
    }

    /// A file of raw bytes.
    pub fn raw(&mut self, kind: Kind, seq: u64, bytes: &[u8]) -> &mut Self {
        self.w.u8(kind.byte()).u64(seq).u8(0).bytes(bytes);
        self
    }
}

/// Puts the image into a fresh simulated disk under `dir`.
pub fn load(files: &[File], dir: &Path) -> SimStorage {
    let sim = SimStorage::new();
    // The directory exists even when empty, as a log directory a service made does.
    if let Err(e) = wal::Storage::create_dir_all(&sim, dir) {
        panic!("harness setup: the log directory: {e}");
    }
    for file in files {
        sim.set_contents(&dir.join(&file.name), file.bytes.clone());
    }
    sim
}

/// The directory every image is loaded into.
pub fn log_dir() -> PathBuf {
    PathBuf::from("/fuzz/wal")
}

pub fn run(input: &[u8]) {
    let files = read_image(input);
    for file in &files {
        check_codecs(file);
    }
    let dir = log_dir();
    let sim = load(&files, &dir);
    check_recovery(&sim, &dir);
}

/// Every frame that decodes, and every snapshot, is exactly what the encoder writes.
fn check_codecs(file: &File) {
    let mut offset = 0;
    while let Ok(decoded) = wal::decode_frame(&file.bytes[offset..]) {
        let size = decoded.frame_bytes();
        let mut again = Vec::new();
        wal::encode_frame(
            &mut again,
            decoded.seq,
            decoded.record_type,
            decoded.payload,
        );
        assert_eq!(
            again,
            file.bytes[offset..offset + size],
            "a decoded frame re-encodes to other bytes"
        );
        offset += size;
    }
    if let Ok(payload) = wal::decode_snapshot(&file.bytes, file.seq) {
        assert_eq!(
            wal::encode_snapshot(file.seq, payload),
            file.bytes,
            "a decoded snapshot re-encodes to other bytes"
        );
    }
}

fn options() -> WalOptions {
    WalOptions {
        // Small, so an append after recovery can roll into a new segment.
        segment_bytes_max: 4096,
        ..WalOptions::default()
    }
}

/// Inspection and recovery agree; what opened takes an append and opens again.
pub fn check_recovery(sim: &SimStorage, dir: &Path) {
    let mut dumped = Vec::new();
    let summary = wal::inspect::dump_with_storage(sim, dir, &mut |record| {
        dumped.push(record.seq);
    });
    let opened = Wal::open_with_storage(Arc::new(sim.clone()), dir, options());
    let (wal, recovery) = match (summary, opened) {
        (Ok(summary), Ok((wal, recovery))) => {
            let seqs: Vec<u64> = recovery.records.iter().map(|r| r.seq).collect();
            assert_eq!(seqs, dumped, "recovery and inspection return other records");
            assert_eq!(
                seqs.len() as u64,
                summary.records,
                "summary miscounts records"
            );
            assert!(
                seqs.windows(2).all(|w| w[0].checked_add(1) == Some(w[1])),
                "recovered records are not consecutive: {seqs:?}"
            );
            assert_eq!(
                recovery.snapshot.is_some(),
                summary.snapshot.is_some(),
                "recovery and inspection disagree about the snapshot"
            );
            assert_eq!(
                recovery.torn_tail.is_some(),
                summary.torn_tail.is_some(),
                "recovery and inspection disagree about a torn tail"
            );
            (wal, recovery)
        }
        (Err(refused), Err(also)) => {
            assert_eq!(
                matches!(refused, WalError::Corrupt { .. }),
                matches!(also, WalError::Corrupt { .. }),
                "inspection said {refused}, recovery said {also}"
            );
            return;
        }
        (Ok(_), Err(e)) => panic!("inspection accepts a log that recovery refuses: {e}"),
        (Err(e), Ok(_)) => panic!("recovery accepts a log that inspection refuses: {e}"),
    };
    let covered = summary_last_seq(&recovery, sim, dir);
    let appended = wal
        .submit(
            RecordType(1),
            b"after recovery".to_vec(),
            Durability::Forced,
        )
        .wait_blocking();
    wal.close();
    drop(wal);
    let seq = match appended {
        Ok(seq) => seq,
        // The last sequence number is never given out; the log must say so, and stay whole.
        Err(WalError::SequenceExhausted) if covered == u64::MAX - 1 => return,
        Err(e) => panic!("append after recovery failed: {e}"),
    };
    assert_eq!(
        Some(seq),
        covered.checked_add(1),
        "append got the wrong seq"
    );
    let (wal, again) = match Wal::open_with_storage(Arc::new(sim.clone()), dir, options()) {
        Ok(reopened) => reopened,
        Err(e) => panic!("a log that opened and took an append does not open again: {e}"),
    };
    wal.close();
    assert!(again.torn_tail.is_none(), "a clean close left a torn tail");
    let last = again.records.last().map(|r| (r.seq, r.payload.as_slice()));
    assert_eq!(
        last,
        Some((seq, &b"after recovery"[..])),
        "the appended record is not last after reopening"
    );
}

/// The last sequence number the recovered log holds (records, else the snapshot's, else 0).
fn summary_last_seq(recovery: &wal::Recovery, sim: &SimStorage, dir: &Path) -> u64 {
    if let Some(last) = recovery.records.last() {
        return last.seq;
    }
    let names = sim.file_names(dir);
    names
        .iter()
        .filter_map(|name| {
            name.strip_prefix("snapshot-")
                .and_then(|rest| rest.strip_suffix(".snap"))
                .and_then(|digits| digits.parse::<u64>().ok())
        })
        .max()
        .unwrap_or(0)
}
