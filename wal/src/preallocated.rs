//! Segments written into space zero-filled ahead of them: the storage [`crate::Wal::open`] uses.
//!
//! An `fdatasync` after an append that grows a file must also write the file's new size (its
//! inode) and, on ext4, the block allocation the append made: two or three device writes where
//! the record needed one. A segment here is extended with zeros [`FILL_AHEAD_BYTES`] at a time,
//! ahead of its appends, and records are written over the zeros, so most fdatasyncs write only
//! the record's pages (on the development machine -30% in time and CPU per fdatasync,
//! docs/benchmarks.md). PostgreSQL zero-fills its WAL segments for the same reason.
//!
//! What it changes on disk: a live segment, or one a crash left, ends in zeros after its last
//! record. The scan takes an all-zero rest of the last segment as the log's end (not a torn
//! tail: nothing was written there), recovery gives the space back, and a roll trims the segment
//! it closes, so only the last segment ever holds zeros. Files that are not segments (snapshots,
//! `.broken` copies) are written as [`FileStorage`] writes them.
//!
//! Never under a [`crate::MirroredStorage`]: a follower replays appends at the end of its copy,
//! and a base backup would carry the zeros into the middle of it.
//!
//! How far ahead is a setting ([`PreallocatedStorage::with_fill_ahead`], the services'
//! `--wal-fill-ahead-bytes`): on some storage an fdatasync over zeros is the slower one when
//! syncs come one at a time (a virtual machine's disk measured there: one client +35-60% tx/s
//! with plain appends, 64 clients -8%, docs/benchmarks.md). 0 writes plain appends, as
//! [`FileStorage`] does; the end-of-log rules above hold either way.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::names::{self, FileKind};
use crate::storage::{FileStorage, Storage, StorageDir, StorageFile};

/// How far ahead of its appends a segment is zero-filled: one size-changing fdatasync per this
/// many bytes of log instead of one per group commit. Small enough that the fdatasync that
/// writes a fill's zeros out is not a long stall.
pub const FILL_AHEAD_BYTES: u64 = 256 * 1024;

/// Zeros written per call while filling.
static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];

/// The real file system; segment files are zero-filled ahead of their appends.
#[derive(Debug, Clone, Copy)]
pub struct PreallocatedStorage {
    fill_ahead: u64,
}

impl Default for PreallocatedStorage {
    fn default() -> Self {
        Self::with_fill_ahead(FILL_AHEAD_BYTES)
    }
}

impl PreallocatedStorage {
    /// Segments zero-filled `bytes` ahead of their appends; 0 for plain appends.
    pub fn with_fill_ahead(bytes: u64) -> Self {
        Self { fill_ahead: bytes }
    }
}

#[derive(Debug)]
struct PreallocatedFile {
    file: File,
    /// How far past an append the zeros reach; 0: none, each append grows the file.
    fill_ahead: u64,
    /// Where the next append goes: the end of the last record.
    end: u64,
    /// The file's size: zeros from `end` to here.
    filled: u64,
}

impl PreallocatedFile {
    fn open(path: &Path, create: bool, fill_ahead: u64) -> io::Result<Self> {
        // Not O_APPEND: appends are written at `end`, over the zeros.
        let file = OpenOptions::new()
            .write(true)
            .create_new(create)
            .open(path)?;
        // Recovery gave back any zeros before the writer opens a segment: its size is its end.
        let end = file.metadata()?.len();
        Ok(Self {
            file,
            fill_ahead,
            end,
            filled: end,
        })
    }

    /// Zero-fills up to `to` (and past it, by `fill_ahead`).
    fn fill(&mut self, to: u64) -> io::Result<()> {
        let target = to.saturating_add(self.fill_ahead);
        while self.filled < target {
            let chunk = (target - self.filled).min(ZEROS.len() as u64) as usize;
            self.file.write_all_at(&ZEROS[..chunk], self.filled)?;
            self.filled += chunk as u64;
        }
        Ok(())
    }
}

impl StorageFile for PreallocatedFile {
    fn append(&mut self, buf: &[u8]) -> io::Result<()> {
        let end = self.end + buf.len() as u64;
        if end > self.filled && self.fill_ahead > 0 {
            // A fill that fails (a full disk) costs only speed: the record is written all the
            // same, growing the file as any append does, and fails on its own if it must.
            if let Err(error) = self.fill(end) {
                tracing::debug!(%error, "zero-filling a log segment ahead of its appends failed");
                self.filled = self.file.metadata()?.len();
            }
        }
        self.file.write_all_at(buf, self.end)?;
        self.end = end;
        self.filled = self.filled.max(end);
        Ok(())
    }

    fn sync_data(&mut self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn trim(&mut self) -> io::Result<()> {
        // Nothing filled past the last append: nothing to give back, and the caller synced.
        if self.filled > self.end {
            self.file.set_len(self.end)?;
            self.filled = self.end;
            self.file.sync_data()?;
        }
        Ok(())
    }
}

fn is_segment(path: &Path) -> bool {
    path.file_name()
        .and_then(|name| name.to_str())
        .is_some_and(|name| matches!(names::classify(name), FileKind::Segment { .. }))
}

impl Storage for PreallocatedStorage {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        FileStorage.create_dir_all(dir)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        FileStorage.list(dir)
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        FileStorage.read(path)
    }

    fn create(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        if is_segment(path) {
            Ok(Box::new(PreallocatedFile::open(
                path,
                true,
                self.fill_ahead,
            )?))
        } else {
            FileStorage.create(path)
        }
    }

    fn open_append(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        if is_segment(path) {
            Ok(Box::new(PreallocatedFile::open(
                path,
                false,
                self.fill_ahead,
            )?))
        } else {
            FileStorage.open_append(path)
        }
    }

    fn truncate(&self, path: &Path, len: u64) -> io::Result<()> {
        FileStorage.truncate(path, len)
    }

    fn sync_file(&self, path: &Path) -> io::Result<()> {
        FileStorage.sync_file(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        FileStorage.rename(from, to)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        FileStorage.remove(path)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        FileStorage.sync_dir(dir)
    }

    fn open_dir(&self, dir: &Path) -> io::Result<Box<dyn StorageDir>> {
        FileStorage.open_dir(dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment_in(dir: &Path) -> std::path::PathBuf {
        dir.join(names::segment_name(1))
    }

    #[test]
    fn appends_go_over_zeros_filled_ahead_and_trim_gives_them_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = segment_in(dir.path());
        let mut file = PreallocatedStorage::default().create(&path).unwrap();
        file.append(b"first").unwrap();
        file.append(b"second").unwrap();
        file.sync_data().unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(
            bytes.len() as u64,
            5 + FILL_AHEAD_BYTES,
            "filled ahead at the first append"
        );
        assert_eq!(&bytes[..11], b"firstsecond");
        assert!(
            bytes[11..].iter().all(|&b| b == 0),
            "zeros after the appends"
        );
        file.trim().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"firstsecond");
    }

    #[test]
    fn a_reopened_segment_continues_at_its_end_and_fills_again_when_appends_pass_the_zeros() {
        let dir = tempfile::tempdir().unwrap();
        let path = segment_in(dir.path());
        std::fs::write(&path, b"abc").unwrap();
        let mut file = PreallocatedStorage::default().open_append(&path).unwrap();
        let big = vec![7u8; FILL_AHEAD_BYTES as usize + 10];
        file.append(&big).unwrap();
        file.append(b"z").unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let end = 3 + big.len() + 1;
        assert_eq!(&bytes[..3], b"abc");
        assert!(bytes[3..end - 1].iter().all(|&b| b == 7));
        assert_eq!(bytes[end - 1], b'z');
        assert!(bytes.len() > end, "filled past the appends again");
        assert!(bytes[end..].iter().all(|&b| b == 0));
    }

    #[test]
    fn with_no_fill_ahead_each_append_grows_the_file_and_no_zeros_follow() {
        let dir = tempfile::tempdir().unwrap();
        let path = segment_in(dir.path());
        let mut file = PreallocatedStorage::with_fill_ahead(0)
            .create(&path)
            .unwrap();
        file.append(b"first").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"first");
        file.append(b"second").unwrap();
        file.sync_data().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"firstsecond");
        file.trim().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"firstsecond");
    }

    #[test]
    fn files_that_are_not_segments_are_written_as_they_are() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("snapshot-00000000000000000001.snap.tmp");
        let mut file = PreallocatedStorage::default().create(&path).unwrap();
        file.append(b"snap").unwrap();
        file.sync_data().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"snap");
    }
}
