//! Opening a log: make what is on disk durable, scan it, cut a torn tail (keeping a copy) or give
//! back the zero-filled space after the last record, finish an interrupted checkpoint, and hand
//! the writer its starting point.

use std::path::{Path, PathBuf};

use crate::error::WalError;
use crate::names;
use crate::scan::{self, Scan};
use crate::storage::{self, Storage};
use crate::types::{Record, Recovery};

/// Where the writer starts.
#[derive(Debug)]
pub struct Layout {
    /// Live segments in order as (base seq, path, bytes); the last is appended to.
    pub segments: Vec<(u64, PathBuf, u64)>,
    /// The newest snapshot as (path, bytes).
    pub snapshot: Option<(PathBuf, u64)>,
    pub next_seq: u64,
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> WalError + 'a {
    move |source| WalError::io(op, path, source)
}

pub fn recover(storage: &dyn Storage, dir: &Path) -> Result<(Recovery, Layout), WalError> {
    storage
        .create_dir_all(dir)
        .map_err(io_err("create directory", dir))?;
    if let Some(parent) = storage::parent_dir(dir) {
        storage
            .sync_dir(&parent)
            .map_err(io_err("fsync directory", &parent))?;
    }
    // A previous run may have written without syncing: what we read (and act on) must be durable
    // before we act on it, or a second crash could take back what recovery already reported.
    for name in storage.list(dir).map_err(io_err("list", dir))? {
        let path = dir.join(&name);
        match names::classify(&name) {
            names::FileKind::Segment { .. } | names::FileKind::Snapshot { .. } => {
                storage.sync_file(&path).map_err(io_err("fsync", &path))?;
            }
            names::FileKind::Tmp => {
                storage.remove(&path).map_err(io_err("remove", &path))?;
            }
            names::FileKind::Other => {}
        }
    }
    storage
        .sync_dir(dir)
        .map_err(io_err("fsync directory", dir))?;

    let mut records = Vec::new();
    let mut scan = scan::scan(storage, dir, &mut |_, _, frame| {
        records.push(Record {
            seq: frame.seq,
            record_type: frame.record_type,
            payload: frame.payload.to_vec(),
        });
    })?;

    if let Some(torn) = &mut scan.torn_tail {
        let bytes = storage
            .read(&torn.file)
            .map_err(io_err("read", &torn.file))?;
        let copy = names::broken_path(&torn.file, torn.offset);
        // A leftover copy from an earlier attempt at this same repair is replaced.
        if storage.list(dir).is_ok_and(|names| {
            copy.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| names.iter().any(|have| have == n))
        }) {
            storage.remove(&copy).map_err(io_err("remove", &copy))?;
        }
        let mut file = storage.create(&copy).map_err(io_err("create", &copy))?;
        let tail = bytes.get(torn.offset as usize..).unwrap_or_default();
        file.append(tail).map_err(io_err("write", &copy))?;
        file.sync_data().map_err(io_err("fsync", &copy))?;
        storage
            .sync_dir(dir)
            .map_err(io_err("fsync directory", dir))?;
        cut_durably(storage, &torn.file, torn.offset)?;
        torn.broken_copy = Some(copy);
        tracing::warn!(
            file = %torn.file.display(),
            offset = torn.offset,
            bytes = torn.bytes,
            reason = %torn.reason,
            "torn tail of the log truncated; the cut bytes are kept in a .broken copy"
        );
    }

    // Space zero-filled ahead of the appends holds no record: give it back, so that appends
    // continue right after the last record (no copy: there is nothing in it to look at).
    if let Some(last) = scan.segments.last_mut()
        && scan.torn_tail.is_none()
        && last.valid_bytes < last.file_bytes
    {
        cut_durably(storage, &last.path, last.valid_bytes)?;
        tracing::debug!(
            file = %last.path.display(),
            offset = last.valid_bytes,
            bytes = last.file_bytes - last.valid_bytes,
            "the zero-filled space after the last record given back"
        );
        last.file_bytes = last.valid_bytes;
    }

    finish_checkpoint(storage, dir, &scan)?;

    let mut segments: Vec<(u64, PathBuf, u64)> = scan
        .segments
        .iter()
        .map(|s| (s.base_seq, s.path.clone(), s.valid_bytes))
        .collect();
    if segments.is_empty() {
        let path = dir.join(names::segment_name(scan.next_seq));
        storage.create(&path).map_err(io_err("create", &path))?;
        storage
            .sync_dir(dir)
            .map_err(io_err("fsync directory", dir))?;
        segments.push((scan.next_seq, path, 0));
    }
    let layout = Layout {
        segments,
        snapshot: scan
            .snapshot
            .as_ref()
            .map(|s| (s.path.clone(), s.file_bytes)),
        next_seq: scan.next_seq,
    };
    let recovery = Recovery {
        snapshot: scan.snapshot.map(|s| s.payload),
        records,
        torn_tail: scan.torn_tail,
    };
    Ok((recovery, layout))
}

/// Truncates `path` to `len` bytes and fsyncs it.
fn cut_durably(storage: &dyn Storage, path: &Path, len: u64) -> Result<(), WalError> {
    storage
        .truncate(path, len)
        .map_err(io_err("truncate", path))?;
    storage.sync_file(path).map_err(io_err("fsync", path))
}

/// Deletes what a completed checkpoint made obsolete but a crash left behind.
fn finish_checkpoint(storage: &dyn Storage, dir: &Path, scan: &Scan) -> Result<(), WalError> {
    let obsolete: Vec<&PathBuf> = scan
        .superseded_segments
        .iter()
        .chain(&scan.stale_snapshots)
        .collect();
    for path in &obsolete {
        storage.remove(path).map_err(io_err("remove", path))?;
    }
    if !obsolete.is_empty() {
        storage
            .sync_dir(dir)
            .map_err(io_err("fsync directory", dir))?;
    }
    Ok(())
}
