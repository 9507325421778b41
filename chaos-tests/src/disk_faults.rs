//! Disk faults on the real files of a *stopped* node: truncate a log segment, zero-fill its tail
//! or a range, flip one bit. Each operation fsyncs the file it changed and returns exactly what it
//! changed, so a test can assert the node's documented reaction (torn tail recovered, corruption
//! refused with an exit code and a message).
//!
//! Owns: finding segment and snapshot files by the wal crate's naming (`<20-digit seq>.wal`,
//! `snapshot-<20-digit seq>.snap`, in `<data-dir>/wal/`, see `docs/wal-format.md`) and changing
//! bytes in the one file it is given. Must never: touch a file other than the path passed in,
//! create or delete files, or run against a node that is running (the caller stops it first; a
//! live writer would race these edits). Pure `std`, blocking.

use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};

const SEGMENT_SUFFIX: &str = ".wal";
const SNAPSHOT_PREFIX: &str = "snapshot-";
const SNAPSHOT_SUFFIX: &str = ".snap";
const SEQ_DIGITS: usize = 20;

#[derive(Debug, thiserror::Error)]
pub enum DiskFaultError {
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {what} is outside the file ({file_len} bytes)")]
    OutOfRange {
        path: PathBuf,
        what: String,
        file_len: u64,
    },
}

/// A truncation: the file went from `len_before` to `len_after` bytes; `removed` are the bytes cut.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Truncation {
    pub len_before: u64,
    pub len_after: u64,
    pub removed: Vec<u8>,
}

/// A zero-fill over `range`; `before` are the bytes that were there (empty for an appended tail).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZeroFill {
    pub range: Range<u64>,
    pub before: Vec<u8>,
}

/// One flipped bit: the byte at `offset` went from `before` to `after` (`after == before ^ (1 << bit)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BitFlip {
    pub offset: u64,
    pub bit: u8,
    pub before: u8,
    pub after: u8,
}

/// Where a service keeps its log: `<data-dir>/wal`.
pub fn wal_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("wal")
}

/// The segment files directly in `dir` (a log directory, see [`wal_dir`]), in log order (their
/// zero-padded names sort by first sequence number).
pub fn segments(dir: &Path) -> Result<Vec<PathBuf>, DiskFaultError> {
    files_named(dir, |name| {
        name.strip_suffix(SEGMENT_SUFFIX).is_some_and(is_seq)
    })
}

/// The last segment in log order, the one a crash can leave torn.
pub fn last_segment(dir: &Path) -> Result<Option<PathBuf>, DiskFaultError> {
    Ok(segments(dir)?.pop())
}

/// The snapshot files directly in `dir`, oldest first.
pub fn snapshots(dir: &Path) -> Result<Vec<PathBuf>, DiskFaultError> {
    files_named(dir, |name| {
        name.strip_prefix(SNAPSHOT_PREFIX)
            .and_then(|rest| rest.strip_suffix(SNAPSHOT_SUFFIX))
            .is_some_and(is_seq)
    })
}

/// Cuts the last `bytes` bytes off the file.
pub fn truncate_by(path: &Path, bytes: u64) -> Result<Truncation, DiskFaultError> {
    let len = file_len(path)?;
    let offset = len
        .checked_sub(bytes)
        .ok_or_else(|| DiskFaultError::OutOfRange {
            path: path.to_owned(),
            what: format!("cutting {bytes} bytes"),
            file_len: len,
        })?;
    truncate_at(path, offset)
}

/// Cuts the file to `offset` bytes.
pub fn truncate_at(path: &Path, offset: u64) -> Result<Truncation, DiskFaultError> {
    let mut file = open_rw(path)?;
    let len_before = len_of(&file, path)?;
    check_range(path, offset..len_before, len_before)?;
    let removed = read_range(&mut file, path, offset..len_before)?;
    file.set_len(offset).map_err(io_err("truncate", path))?;
    sync(&file, path)?;
    Ok(Truncation {
        len_before,
        len_after: offset,
        removed,
    })
}

/// Appends `bytes` zero bytes: the tail a crash leaves when the size was extended but the data
/// never reached the disk.
pub fn append_zeros(path: &Path, bytes: u64) -> Result<ZeroFill, DiskFaultError> {
    let mut file = open_rw(path)?;
    let len = len_of(&file, path)?;
    file.seek(SeekFrom::End(0)).map_err(io_err("seek", path))?;
    write_zeros(&mut file, path, bytes)?;
    sync(&file, path)?;
    Ok(ZeroFill {
        range: len..len + bytes,
        before: Vec::new(),
    })
}

/// Overwrites `range` (which must lie inside the file) with zeros.
pub fn zero_range(path: &Path, range: Range<u64>) -> Result<ZeroFill, DiskFaultError> {
    let mut file = open_rw(path)?;
    let len = len_of(&file, path)?;
    check_range(path, range.clone(), len)?;
    let before = read_range(&mut file, path, range.clone())?;
    file.seek(SeekFrom::Start(range.start))
        .map_err(io_err("seek", path))?;
    write_zeros(&mut file, path, range.end - range.start)?;
    sync(&file, path)?;
    Ok(ZeroFill { range, before })
}

/// Flips bit `bit` (0 = least significant, at most 7) of the byte at `offset`.
pub fn flip_bit(path: &Path, offset: u64, bit: u8) -> Result<BitFlip, DiskFaultError> {
    let mut file = open_rw(path)?;
    let len = len_of(&file, path)?;
    if bit > 7 {
        return Err(DiskFaultError::OutOfRange {
            path: path.to_owned(),
            what: format!("bit {bit} of a byte"),
            file_len: len,
        });
    }
    check_range(path, offset..offset.saturating_add(1), len)?;
    let before = read_range(&mut file, path, offset..offset + 1)?[0];
    let after = before ^ (1 << bit);
    file.seek(SeekFrom::Start(offset))
        .map_err(io_err("seek", path))?;
    file.write_all(&[after]).map_err(io_err("write", path))?;
    sync(&file, path)?;
    Ok(BitFlip {
        offset,
        bit,
        before,
        after,
    })
}

fn is_seq(digits: &str) -> bool {
    digits.len() == SEQ_DIGITS && digits.bytes().all(|b| b.is_ascii_digit())
}

fn files_named(dir: &Path, wanted: impl Fn(&str) -> bool) -> Result<Vec<PathBuf>, DiskFaultError> {
    let mut found = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_err("list", dir))? {
        let entry = entry.map_err(io_err("list", dir))?;
        let is_file = entry
            .file_type()
            .map_err(io_err("stat", &entry.path()))?
            .is_file();
        if is_file && entry.file_name().to_str().is_some_and(&wanted) {
            found.push(entry.path());
        }
    }
    found.sort();
    Ok(found)
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> DiskFaultError {
    let path = path.to_owned();
    move |source| DiskFaultError::Io { op, path, source }
}

fn open_rw(path: &Path) -> Result<File, DiskFaultError> {
    // Never create: a fault on a file that is not there is a bug in the caller.
    File::options()
        .read(true)
        .write(true)
        .open(path)
        .map_err(io_err("open", path))
}

fn file_len(path: &Path) -> Result<u64, DiskFaultError> {
    Ok(fs::metadata(path).map_err(io_err("stat", path))?.len())
}

fn len_of(file: &File, path: &Path) -> Result<u64, DiskFaultError> {
    Ok(file.metadata().map_err(io_err("stat", path))?.len())
}

fn check_range(path: &Path, range: Range<u64>, file_len: u64) -> Result<(), DiskFaultError> {
    if range.start <= range.end && range.end <= file_len {
        Ok(())
    } else {
        Err(DiskFaultError::OutOfRange {
            path: path.to_owned(),
            what: format!("range {}..{}", range.start, range.end),
            file_len,
        })
    }
}

fn read_range(file: &mut File, path: &Path, range: Range<u64>) -> Result<Vec<u8>, DiskFaultError> {
    file.seek(SeekFrom::Start(range.start))
        .map_err(io_err("seek", path))?;
    let mut bytes = Vec::new();
    file.take(range.end - range.start)
        .read_to_end(&mut bytes)
        .map_err(io_err("read", path))?;
    Ok(bytes)
}

fn write_zeros(file: &mut File, path: &Path, bytes: u64) -> Result<(), DiskFaultError> {
    let chunk = [0u8; 8192];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        file.write_all(&chunk[..n]).map_err(io_err("write", path))?;
        left -= n as u64;
    }
    Ok(())
}

fn sync(file: &File, path: &Path) -> Result<(), DiskFaultError> {
    file.sync_all().map_err(io_err("fsync", path))
}
