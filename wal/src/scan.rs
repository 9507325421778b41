//! Reading a log directory without changing it: which files are live, every record in order,
//! where a torn tail starts, and corruption. Recovery acts on the result; `inspect` reports it.
//! Which bad frames count as torn is decided by `frame::judge_last_segment_tail`.

use std::path::{Path, PathBuf};

use crate::error::WalError;
use crate::frame::{self, FrameRef, TailVerdict};
use crate::names::{self, FileKind};
use crate::snapshot;
use crate::storage::Storage;
use crate::types::TornTail;

/// The newest snapshot.
#[derive(Debug, Clone)]
pub struct SnapshotFound {
    pub path: PathBuf,
    /// Last sequence number the snapshot covers.
    pub seq: u64,
    pub payload: Vec<u8>,
    pub file_bytes: u64,
}

/// A segment recovery keeps.
#[derive(Debug, Clone)]
pub struct SegmentFound {
    pub path: PathBuf,
    pub base_seq: u64,
    pub records: u64,
    /// Bytes of whole valid records: the length after truncating a torn tail or the zero-filled
    /// space after the last record.
    pub valid_bytes: u64,
    pub file_bytes: u64,
}

#[derive(Debug, Clone)]
pub struct Scan {
    pub snapshot: Option<SnapshotFound>,
    /// Older snapshots, replaced by `snapshot` (deleted on open).
    pub stale_snapshots: Vec<PathBuf>,
    /// Segments whose records are all covered by the snapshot (deleted on open, never read).
    pub superseded_segments: Vec<PathBuf>,
    /// Live segments in log order; the last one is where appends continue.
    pub segments: Vec<SegmentFound>,
    pub torn_tail: Option<TornTail>,
    /// Unfinished snapshots (deleted on open).
    pub tmp_files: Vec<PathBuf>,
    /// Sequence number the next append gets.
    pub next_seq: u64,
}

impl Scan {
    /// Number of live records after the snapshot.
    pub fn records_after_snapshot(&self) -> u64 {
        let covered = self.snapshot.as_ref().map_or(0, |s| s.seq);
        (self.next_seq - 1).saturating_sub(covered)
    }
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> WalError + 'a {
    move |source| WalError::io(op, path, source)
}

/// Reads everything in `dir`. `visit` sees every live record after the snapshot, in order, with
/// its segment and offset, before any later corruption is reported.
pub fn scan(
    storage: &dyn Storage,
    dir: &Path,
    visit: &mut dyn FnMut(&Path, u64, FrameRef<'_>),
) -> Result<Scan, WalError> {
    let mut segments: Vec<(u64, PathBuf)> = Vec::new();
    let mut snapshots: Vec<(u64, PathBuf)> = Vec::new();
    let mut tmp_files = Vec::new();
    for name in storage.list(dir).map_err(io_err("list", dir))? {
        let path = dir.join(&name);
        match names::classify(&name) {
            FileKind::Segment { base_seq } => segments.push((base_seq, path)),
            FileKind::Snapshot { seq } => snapshots.push((seq, path)),
            FileKind::Tmp => tmp_files.push(path),
            FileKind::Other => {}
        }
    }
    segments.sort();
    snapshots.sort();

    let snapshot = match snapshots.pop() {
        Some((seq, path)) => {
            let bytes = storage.read(&path).map_err(io_err("read", &path))?;
            let payload = snapshot::decode(&bytes, seq)
                .map_err(|reason| WalError::corrupt(&path, 0, reason))?
                .to_vec();
            Some(SnapshotFound {
                path,
                seq,
                payload,
                file_bytes: bytes.len() as u64,
            })
        }
        None => None,
    };
    let stale_snapshots = snapshots.into_iter().map(|(_, path)| path).collect();
    let covered = snapshot.as_ref().map_or(0, |s| s.seq);
    // Sequence numbers are 1..u64::MAX: a snapshot that covers the last one leaves no number
    // for a record after it, and no writer of this log takes it there.
    let Some(after_covered) = covered.checked_add(1) else {
        let path = snapshot
            .as_ref()
            .map(|s| s.path.clone())
            .unwrap_or_default();
        return Err(WalError::corrupt(
            path,
            0,
            format!("snapshot covers seq {covered}, the last there is, so no record can follow it"),
        ));
    };

    // Every segment before the last one starting at or below covered+1 holds only covered records.
    let first_live = segments
        .iter()
        .rposition(|(base, _)| *base <= after_covered)
        .unwrap_or(0);
    let live: Vec<(u64, PathBuf)> = segments.split_off(first_live);
    let superseded_segments = segments.into_iter().map(|(_, path)| path).collect();

    let mut scan = Scan {
        snapshot,
        stale_snapshots,
        superseded_segments,
        segments: Vec::new(),
        torn_tail: None,
        tmp_files,
        next_seq: after_covered,
    };
    let Some((first_base, first_path)) = live.first() else {
        if let Some(snapshot) = &scan.snapshot {
            return Err(WalError::corrupt(
                &snapshot.path,
                0,
                format!("snapshot covers seq {covered} but no segment follows it"),
            ));
        }
        return Ok(scan);
    };
    if *first_base == 0 {
        // Names come from sequence numbers, which start at 1: no writer of this log made it.
        return Err(WalError::corrupt(
            first_path,
            0,
            "segment named seq 0, but sequence numbers start at 1",
        ));
    }
    if *first_base > after_covered {
        let reason = match scan.snapshot {
            Some(_) => format!(
                "sequence gap: the snapshot covers seq {covered} but the first segment starts at seq {first_base}"
            ),
            None => format!(
                "sequence gap: there is no snapshot but the first segment starts at seq {first_base}"
            ),
        };
        return Err(WalError::corrupt(first_path, 0, reason));
    }

    let mut expected = *first_base;
    let last_index = live.len() - 1;
    for (index, (base_seq, path)) in live.into_iter().enumerate() {
        if base_seq != expected {
            return Err(WalError::corrupt(
                &path,
                0,
                format!("sequence gap: segment starts at seq {base_seq}, expected {expected}"),
            ));
        }
        let bytes = storage.read(&path).map_err(io_err("read", &path))?;
        let mut offset = 0usize;
        let mut records = 0u64;
        while offset < bytes.len() {
            match frame::decode(&bytes[offset..]) {
                Ok(record) => {
                    if record.seq != expected {
                        return Err(WalError::corrupt(
                            &path,
                            offset as u64,
                            format!(
                                "sequence gap: expected seq {expected}, found {}",
                                record.seq
                            ),
                        ));
                    }
                    // The writer never gives out the last sequence number (no next one would
                    // be left for the record after it), so a record that holds it is not ours.
                    let Some(next) = expected.checked_add(1) else {
                        return Err(WalError::corrupt(
                            &path,
                            offset as u64,
                            format!("record at seq {expected}, past the last the log gives out"),
                        ));
                    };
                    if record.seq > covered {
                        visit(&path, offset as u64, record);
                    }
                    expected = next;
                    records += 1;
                    offset += record.frame_bytes();
                }
                // Space zero-filled ahead of the appends (`crate::preallocated`): the log ends
                // here, cleanly. Nothing was ever written there, so nothing is torn or cut but
                // zeros; a record only partly written over it still fails its CRC and is torn.
                Err(_) if index == last_index && frame::is_zero_filled(&bytes[offset..]) => {
                    break;
                }
                Err(error) => {
                    if index != last_index {
                        return Err(WalError::corrupt(
                            &path,
                            offset as u64,
                            format!("{error} (in a segment that is not the last)"),
                        ));
                    }
                    if let TailVerdict::Corrupt { reason } =
                        frame::judge_last_segment_tail(&bytes, offset, &error)
                    {
                        return Err(WalError::corrupt(&path, offset as u64, reason));
                    }
                    scan.torn_tail = Some(TornTail {
                        file: path.clone(),
                        offset: offset as u64,
                        bytes: (bytes.len() - offset) as u64,
                        reason: error.to_string(),
                        broken_copy: None,
                    });
                    break;
                }
            }
        }
        scan.segments.push(SegmentFound {
            path,
            base_seq,
            records,
            valid_bytes: offset.min(bytes.len()) as u64,
            file_bytes: bytes.len() as u64,
        });
    }
    if expected <= covered {
        let last = scan
            .segments
            .last()
            .map(|s| (s.path.clone(), s.valid_bytes));
        let (path, offset) = last.unwrap_or_else(|| (dir.to_path_buf(), 0));
        return Err(WalError::corrupt(
            path,
            offset,
            format!(
                "log ends at seq {}, before the snapshot's seq {covered}",
                expected - 1
            ),
        ));
    }
    scan.next_seq = expected;
    Ok(scan)
}
