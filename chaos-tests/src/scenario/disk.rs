//! Disk-fault steps on a stopped node's real log files, on top of [`crate::disk_faults`]: find
//! the record frames of a segment (the layout of docs/wal-format.md: `len u32 | type u8 |
//! seq u64 | payload | crc u32`, little-endian), tear the last record, add a zero tail, or flip
//! a bit inside a record that has valid records after it.

use std::path::{Path, PathBuf};

use crate::disk_faults::{self, BitFlip, Truncation, ZeroFill};

/// Bytes of a frame around its payload: `len` (4) + `type` (1) + `seq` (8) + `crc` (4).
const FRAME_OVERHEAD: u64 = 17;
/// Where the payload starts in a frame.
const PAYLOAD_OFFSET: u64 = 13;

/// One record frame: where it starts in its segment and how long it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    pub offset: u64,
    pub len: u64,
    /// The owner's record type (byte 4 of the frame).
    pub record_type: u8,
}

/// The frames of a segment, front to back, up to the first zero length or the end of the file
/// (CRCs are not checked: this only finds where records are).
pub fn frames(segment: &Path) -> Vec<Frame> {
    let bytes = std::fs::read(segment).unwrap_or_else(|e| panic!("{}: {e}", segment.display()));
    let mut out = Vec::new();
    let mut offset = 0usize;
    while offset + 4 <= bytes.len() {
        let len = u32::from_le_bytes([
            bytes[offset],
            bytes[offset + 1],
            bytes[offset + 2],
            bytes[offset + 3],
        ]) as usize;
        let frame_len = len + 8;
        if len < 9 || offset + frame_len > bytes.len() {
            break;
        }
        out.push(Frame {
            offset: offset as u64,
            len: frame_len as u64,
            record_type: bytes[offset + 4],
        });
        offset += frame_len;
    }
    out
}

/// The last segment of node data directory `data_dir`.
pub fn last_segment(data_dir: &Path) -> PathBuf {
    let wal = disk_faults::wal_dir(data_dir);
    disk_faults::last_segment(&wal)
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("no segment in {}", wal.display()))
}

/// Tears the last record of the last segment: cuts `1 + cut % (frame length - 1)` bytes off its
/// end, leaving a partial record, as a crash between write and fsync can. Only safe on a node
/// that died between that record's write and its fsync (nothing in it was acknowledged).
pub fn tear_last_record(data_dir: &Path, cut: u64) -> Option<(PathBuf, Truncation)> {
    let segment = last_segment(data_dir);
    let last = *frames(&segment).last()?;
    let bytes = 1 + cut % (last.len - 1);
    let end = last.offset + last.len;
    let truncation =
        disk_faults::truncate_at(&segment, end - bytes).unwrap_or_else(|e| panic!("{e}"));
    Some((segment, truncation))
}

/// Appends `bytes` zeros to the last segment: space that was allocated but never written.
pub fn zero_tail(data_dir: &Path, bytes: u64) -> (PathBuf, ZeroFill) {
    let segment = last_segment(data_dir);
    let fill = disk_faults::append_zeros(&segment, bytes).unwrap_or_else(|e| panic!("{e}"));
    (segment, fill)
}

/// Flips one bit in the payload (or, for an empty payload, the sequence number) of a record in
/// the middle of the segment with the most records, so valid records follow it: corruption,
/// never a torn tail. Returns the segment, the record's frame and the flip.
pub fn flip_mid_log(data_dir: &Path) -> (PathBuf, Frame, BitFlip) {
    let wal = disk_faults::wal_dir(data_dir);
    let segments = disk_faults::segments(&wal).unwrap_or_else(|e| panic!("{e}"));
    let (segment, frames) = segments
        .into_iter()
        .map(|s| {
            let f = frames(&s);
            (s, f)
        })
        .max_by_key(|(_, f)| f.len())
        .unwrap_or_else(|| panic!("no segment in {}", wal.display()));
    assert!(
        frames.len() >= 2,
        "{} holds {} records; a mid-log flip needs two",
        segment.display(),
        frames.len()
    );
    let frame = frames[(frames.len() - 1) / 2];
    let payload_len = frame.len - FRAME_OVERHEAD;
    let at = if payload_len > 0 {
        frame.offset + PAYLOAD_OFFSET + payload_len / 2
    } else {
        frame.offset + 5
    };
    let flip = disk_faults::flip_bit(&segment, at, 3).unwrap_or_else(|e| panic!("{e}"));
    (segment, frame, flip)
}

/// The `.broken` copies of torn tails in a node's log directory.
pub fn broken_copies(data_dir: &Path) -> Vec<PathBuf> {
    let wal = disk_faults::wal_dir(data_dir);
    let mut found: Vec<PathBuf> = std::fs::read_dir(&wal)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "broken"))
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found
}
