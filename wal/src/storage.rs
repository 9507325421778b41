//! The storage the log sits on: a small trait so that crash tests can run the same code on a
//! simulated disk ([`crate::sim`]) that drops unsynced writes, tears writes and flips bits.

use std::fmt::Debug;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// A directory of files that are only ever appended to, read whole, truncated, renamed or deleted.
/// Paths are full paths. Nothing here syncs unless asked.
pub trait Storage: Send + Sync + Debug {
    /// Creates `dir` and missing parents.
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// Names (not paths) of the files directly in `dir`.
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// The whole content of a file, as the running system sees it.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// Creates a new, empty file (fails if it exists) open for appending.
    fn create(&self, path: &Path) -> io::Result<Box<dyn StorageFile>>;
    /// Opens an existing file for appending.
    fn open_append(&self, path: &Path) -> io::Result<Box<dyn StorageFile>>;
    /// Cuts a file to `len` bytes (not synced).
    fn truncate(&self, path: &Path, len: u64) -> io::Result<()>;
    /// fsync of an existing file's data and size.
    fn sync_file(&self, path: &Path) -> io::Result<()>;
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// fsync of the directory, making creates, renames and removes in it durable. Opens the
    /// directory each time: for one-off syncs at open; the writer syncs through [`StorageDir`].
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// The directory, opened to be held and synced later. An open log holds its directory's
    /// handle from the start, so that a later sync needs no descriptor: when the process has
    /// none left, a sync that had to open the directory would fail and poison the log.
    fn open_dir(&self, dir: &Path) -> io::Result<Box<dyn StorageDir>>;
}

/// A held directory handle.
pub trait StorageDir: Send + Debug {
    /// fsync of the directory, as [`Storage::sync_dir`], through the held handle.
    fn sync(&self) -> io::Result<()>;
}

/// A file open for appending.
pub trait StorageFile: Send + Debug {
    /// Writes all of `buf` at the end of the file.
    fn append(&mut self, buf: &[u8]) -> io::Result<()>;
    /// fdatasync: the file's data (and size) are durable when this returns Ok.
    fn sync_data(&mut self) -> io::Result<()>;
    /// Gives back, durably, any space reserved past the last append, so that the file ends
    /// where its last append did (a file that reserves none has nothing to do).
    fn trim(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The real file system.
#[derive(Debug, Clone, Copy, Default)]
pub struct FileStorage;

#[derive(Debug)]
struct RealFile {
    file: File,
}

impl StorageFile for RealFile {
    fn append(&mut self, buf: &[u8]) -> io::Result<()> {
        self.file.write_all(buf)
    }

    fn sync_data(&mut self) -> io::Result<()> {
        self.file.sync_data()
    }
}

#[derive(Debug)]
struct RealDir {
    dir: File,
}

impl StorageDir for RealDir {
    fn sync(&self) -> io::Result<()> {
        self.dir.sync_all()
    }
}

impl Storage for FileStorage {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        fs::create_dir_all(dir)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            if entry.file_type()?.is_file() {
                // Non-UTF-8 names cannot be ours; skipping them is right.
                if let Ok(name) = entry.file_name().into_string() {
                    names.push(name);
                }
            }
        }
        names.sort();
        Ok(names)
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        fs::read(path)
    }

    fn create(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        let file = OpenOptions::new()
            .append(true)
            .create_new(true)
            .open(path)?;
        Ok(Box::new(RealFile { file }))
    }

    fn open_append(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        let file = OpenOptions::new().append(true).open(path)?;
        Ok(Box::new(RealFile { file }))
    }

    fn truncate(&self, path: &Path, len: u64) -> io::Result<()> {
        OpenOptions::new().write(true).open(path)?.set_len(len)
    }

    fn sync_file(&self, path: &Path) -> io::Result<()> {
        OpenOptions::new().write(true).open(path)?.sync_all()
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }

    fn open_dir(&self, dir: &Path) -> io::Result<Box<dyn StorageDir>> {
        Ok(Box::new(RealDir {
            dir: File::open(dir)?,
        }))
    }
}

/// Parent directory of a path, for syncing after creating the directory itself.
pub(crate) fn parent_dir(path: &Path) -> Option<PathBuf> {
    path.parent()
        .filter(|parent| !parent.as_os_str().is_empty())
        .map(Path::to_path_buf)
}
