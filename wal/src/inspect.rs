//! Read-only inspection for `twopc wal dump` and `twopc wal verify`: the same checks as
//! [`crate::Wal::open`] without changing anything (a torn tail is reported as "would be
//! truncated", never truncated; nothing is created, synced or deleted).

use std::path::{Path, PathBuf};

use crate::error::WalError;
use crate::names::{self, FileKind};
use crate::scan;
use crate::storage::{FileStorage, Storage};
use crate::types::{RecordType, TornTail};

/// One live segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentSummary {
    pub path: PathBuf,
    pub base_seq: u64,
    pub records: u64,
    /// The file's size: its records, and after them any zero-filled space or torn tail.
    pub bytes: u64,
    /// Bytes of its whole valid records: what the file holds once the log is opened.
    pub record_bytes: u64,
}

/// The snapshot recovery would use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotSummary {
    pub path: PathBuf,
    /// Last sequence number it covers.
    pub seq: u64,
    pub payload_bytes: u64,
}

/// What a log directory holds and what opening it would do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub dir: PathBuf,
    pub snapshot: Option<SnapshotSummary>,
    pub segments: Vec<SegmentSummary>,
    /// Records after the snapshot that recovery would return.
    pub records: u64,
    /// Sequence number of the first and last of those records.
    pub first_seq: Option<u64>,
    pub last_seq: Option<u64>,
    /// A torn tail that opening the log would truncate (`broken_copy` is `None`: nothing was done).
    pub torn_tail: Option<TornTail>,
    /// Files an interrupted checkpoint left that opening the log would delete.
    pub obsolete_files: Vec<PathBuf>,
}

/// One record as `dump` sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DumpedRecord<'a> {
    pub segment: &'a Path,
    /// Byte offset of the frame in its segment.
    pub offset: u64,
    pub seq: u64,
    pub record_type: RecordType,
    pub payload: &'a [u8],
}

/// Whether `dir` holds a log: at least one segment or snapshot file (a log that was opened once has
/// a segment, if only an empty one). A scan of a directory without them finds a valid, empty log,
/// so a tool pointed at the wrong directory must ask this first rather than report "ok".
pub fn holds_log(dir: impl AsRef<Path>) -> Result<bool, WalError> {
    holds_log_with_storage(&FileStorage, dir.as_ref())
}

/// [`holds_log`] on any storage.
pub fn holds_log_with_storage(storage: &dyn Storage, dir: &Path) -> Result<bool, WalError> {
    let names = storage
        .list(dir)
        .map_err(|source| WalError::io("list", dir, source))?;
    Ok(names.iter().any(|name| {
        matches!(
            names::classify(name),
            FileKind::Segment { .. } | FileKind::Snapshot { .. }
        )
    }))
}

/// Checks every live record and the snapshot; `Err(WalError::Corrupt)` names file, offset, reason.
pub fn verify(dir: impl AsRef<Path>) -> Result<Summary, WalError> {
    dump_with_storage(&FileStorage, dir.as_ref(), &mut |_| {})
}

/// [`verify`], calling `each` for every live record in order. Records before a corruption are
/// passed to `each` before the error is returned.
pub fn dump(
    dir: impl AsRef<Path>,
    mut each: impl FnMut(DumpedRecord<'_>),
) -> Result<Summary, WalError> {
    dump_with_storage(&FileStorage, dir.as_ref(), &mut each)
}

/// [`dump`] on any storage.
pub fn dump_with_storage(
    storage: &dyn Storage,
    dir: &Path,
    each: &mut dyn FnMut(DumpedRecord<'_>),
) -> Result<Summary, WalError> {
    let mut first_seq = None;
    let mut last_seq = None;
    let scan = scan::scan(storage, dir, &mut |segment, offset, frame| {
        first_seq.get_or_insert(frame.seq);
        last_seq = Some(frame.seq);
        each(DumpedRecord {
            segment,
            offset,
            seq: frame.seq,
            record_type: frame.record_type,
            payload: frame.payload,
        });
    })?;
    let records = scan.records_after_snapshot();
    Ok(Summary {
        dir: dir.to_path_buf(),
        snapshot: scan.snapshot.map(|s| SnapshotSummary {
            path: s.path,
            seq: s.seq,
            payload_bytes: s.payload.len() as u64,
        }),
        segments: scan
            .segments
            .into_iter()
            .map(|s| SegmentSummary {
                path: s.path,
                base_seq: s.base_seq,
                records: s.records,
                bytes: s.file_bytes,
                record_bytes: s.valid_bytes,
            })
            .collect(),
        records,
        first_seq,
        last_seq,
        torn_tail: scan.torn_tail,
        obsolete_files: scan
            .superseded_segments
            .into_iter()
            .chain(scan.stale_snapshots)
            .chain(scan.tmp_files)
            .collect(),
    })
}
