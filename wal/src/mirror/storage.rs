//! [`MirroredStorage`]: a [`Storage`] that records every change to one log directory as a
//! [`FileOp`] and ships the recorded ops to a [`Mirror`] at every sync point, waiting for the
//! followers' confirmation as well as for its own sync.
//!
//! **Must never:** return `Ok` from a sync whose batch the mirror did not confirm; run a change
//! without recording it under the same lock hold (a base backup in between would then
//! disagree with its `next_op`); record a change whose inner call failed; change a file outside
//! its directory; or take changes or sync again after an append or a sync failed (the log is
//! poisoned by then anyway; a new instance, and new base backups, are the way back).

use std::collections::HashMap;
use std::io;
use std::mem;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use super::codec::{APPEND_BYTES_MAX, PENDING_BYTES_MAX, op_bytes};
use super::{BaseBackup, FileOp, Mirror, OpBatch, ShipWaiter, valid_name};
use crate::storage::{Storage, StorageDir, StorageFile};

/// The log's storage on a replicating leader. See [`Mirror`] for what a sync waits for.
#[derive(Debug)]
pub struct MirroredStorage {
    core: Arc<Core>,
}

#[derive(Debug)]
struct Core {
    inner: Arc<dyn Storage>,
    dir: PathBuf,
    mirror: Arc<dyn Mirror>,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// The number the next recorded op gets.
    next_op: u64,
    /// Recorded since the last shipment, numbered `next_op - pending.len()` on.
    pending: Vec<FileOp>,
    /// What `pending` adds to an encoded batch.
    pending_bytes: usize,
    /// Set by a failed append or sync: why every later change and sync is refused.
    failed: Option<String>,
    /// The current name of each file open through this storage (`None` once removed or
    /// replaced), so that an append is recorded under the name the file has now.
    open_files: HashMap<u64, Option<String>>,
    next_handle: u64,
}

impl State {
    fn usable(&self) -> io::Result<()> {
        match &self.failed {
            None => Ok(()),
            Some(cause) => Err(io::Error::other(format!(
                "mirrored log storage failed earlier and takes no more changes: {cause}"
            ))),
        }
    }

    fn fail(&mut self, cause: String) {
        self.failed.get_or_insert(cause);
    }

    fn record(&mut self, op: FileOp) {
        match &op {
            // Renaming a file onto itself changes nothing.
            FileOp::Rename { from, to } if from != to => {
                for name in self.open_files.values_mut() {
                    if name.as_deref() == Some(to.as_str()) {
                        *name = None;
                    } else if name.as_deref() == Some(from.as_str()) {
                        *name = Some(to.clone());
                    }
                }
            }
            FileOp::Remove { name: removed } => {
                for name in self.open_files.values_mut() {
                    if name.as_deref() == Some(removed.as_str()) {
                        *name = None;
                    }
                }
            }
            FileOp::Create { .. }
            | FileOp::Append { .. }
            | FileOp::Truncate { .. }
            | FileOp::Rename { .. } => {}
        }
        self.pending_bytes += op_bytes(&op);
        self.pending.push(op);
        self.next_op += 1;
    }

    /// Hands everything pending to the mirror; `None` when nothing is.
    fn ship(&mut self, mirror: &dyn Mirror) -> Option<(u64, u64, ShipWaiter)> {
        if self.pending.is_empty() {
            return None;
        }
        let ops = mem::take(&mut self.pending);
        self.pending_bytes = 0;
        let first = self.next_op - ops.len() as u64;
        let last = self.next_op - 1;
        Some((first, last, mirror.ship(OpBatch { first, ops })))
    }
}

impl MirroredStorage {
    /// Records the changes to the files directly in `dir` (the log directory, spelled as the
    /// log is opened with) made through it; the first op is number 1.
    pub fn new(
        inner: Arc<dyn Storage>,
        dir: PathBuf,
        mirror: Arc<dyn Mirror>,
    ) -> Arc<MirroredStorage> {
        Arc::new(MirroredStorage {
            core: Arc::new(Core {
                inner,
                dir,
                mirror,
                state: Mutex::new(State {
                    next_op: 1,
                    pending: Vec::new(),
                    pending_bytes: 0,
                    failed: None,
                    open_files: HashMap::new(),
                    next_handle: 0,
                }),
            }),
        })
    }

    /// The log directory this storage mirrors.
    pub fn dir(&self) -> &Path {
        &self.core.dir
    }

    /// The number the next recorded op gets.
    pub fn next_op(&self) -> u64 {
        self.core.lock().next_op
    }

    /// Every file of the directory, read through the inner storage under the op lock: the
    /// writer waits meanwhile, so no change interleaves, and every op below `next_op` (shipped
    /// or still pending) is reflected in the files. Refused once the storage failed.
    pub fn base_backup(&self) -> io::Result<BaseBackup> {
        let state = self.core.lock();
        state.usable()?;
        let dir = &self.core.dir;
        let mut files = Vec::new();
        for name in self.core.inner.list(dir)? {
            // Only names the op stream can carry; the log makes no others.
            if valid_name(&name) {
                let bytes = self.core.inner.read(&dir.join(&name))?;
                files.push((name, bytes));
            }
        }
        Ok(BaseBackup {
            next_op: state.next_op,
            files,
        })
    }
}

impl Core {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The file name of `path` if it is directly in the log directory.
    fn name_of(&self, path: &Path) -> Option<String> {
        if path.parent() != Some(self.dir.as_path()) {
            return None;
        }
        path.file_name()
            .and_then(|n| n.to_str())
            .filter(|n| valid_name(n))
            .map(str::to_string)
    }

    /// As [`Core::name_of`], refusing a path elsewhere.
    fn inside(&self, path: &Path) -> io::Result<String> {
        self.name_of(path).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} is not a file of the mirrored log directory {}",
                    path.display(),
                    self.dir.display()
                ),
            )
        })
    }

    /// Runs one change and records its ops under one lock hold. A change that fails is not
    /// recorded (create, truncate, rename and remove fail whole); an append that fails may
    /// have written part of its bytes, so it also fails the storage.
    fn change<T>(
        &self,
        is_append: bool,
        ops: impl FnOnce(&mut State) -> Vec<FileOp>,
        run: impl FnOnce() -> io::Result<T>,
    ) -> io::Result<T> {
        let mut shipped = Vec::new();
        let out = {
            let mut state = self.lock();
            state.usable()?;
            let out = match run() {
                Ok(out) => out,
                Err(error) => {
                    if is_append {
                        state.fail(format!("an append failed: {error}"));
                    }
                    return Err(error);
                }
            };
            for op in ops(&mut state) {
                state.record(op);
                // A long run of appends without a sync point ships early (see `Mirror`).
                if state.pending_bytes >= PENDING_BYTES_MAX
                    && let Some(batch) = state.ship(self.mirror.as_ref())
                {
                    shipped.push(batch);
                }
            }
            out
        };
        let mut outcome = Ok(out);
        for (first, last, waiter) in shipped {
            if let Err(error) = waiter() {
                let error = unconfirmed(first, last, error);
                self.lock().fail(error.to_string());
                if outcome.is_ok() {
                    outcome = Err(error);
                }
            }
        }
        outcome
    }

    /// A sync point: ships what is pending, syncs locally, waits for the mirror.
    fn sync_point(&self, local: impl FnOnce() -> io::Result<()>) -> io::Result<()> {
        let shipped = {
            let mut state = self.lock();
            state.usable()?;
            state.ship(self.mirror.as_ref())
        };
        let local = local();
        // Called whatever the local sync did: the batch is out and must be waited for.
        let remote = match shipped {
            None => Ok(()),
            Some((first, last, waiter)) => waiter().map_err(|e| unconfirmed(first, last, e)),
        };
        match (local, remote) {
            (Ok(()), Ok(())) => Ok(()),
            (Err(error), _) | (Ok(()), Err(error)) => {
                // Never a sync after a failed one, as the log itself.
                self.lock().fail(format!("a sync failed: {error}"));
                Err(error)
            }
        }
    }

    fn open_file(self: &Arc<Self>, name: String, inner: Box<dyn StorageFile>) -> MirroredFile {
        let mut state = self.lock();
        let handle = state.next_handle;
        state.next_handle += 1;
        state.open_files.insert(handle, Some(name));
        MirroredFile {
            core: Arc::clone(self),
            handle,
            inner,
        }
    }
}

fn unconfirmed(first: u64, last: u64, error: io::Error) -> io::Error {
    io::Error::new(
        error.kind(),
        format!("the mirror did not confirm ops {first}..={last}: {error}"),
    )
}

impl Storage for MirroredStorage {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        self.core.inner.create_dir_all(dir)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.core.inner.list(dir)
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        self.core.inner.read(path)
    }

    fn create(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        let name = self.core.inside(path)?;
        let inner = self.core.change(
            false,
            |_| vec![FileOp::Create { name: name.clone() }],
            || self.core.inner.create(path),
        )?;
        Ok(Box::new(self.core.open_file(name, inner)))
    }

    fn open_append(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        let name = self.core.inside(path)?;
        let inner = self.core.inner.open_append(path)?;
        Ok(Box::new(self.core.open_file(name, inner)))
    }

    fn truncate(&self, path: &Path, len: u64) -> io::Result<()> {
        let name = self.core.inside(path)?;
        self.core.change(
            false,
            |_| vec![FileOp::Truncate { name, len }],
            || self.core.inner.truncate(path, len),
        )
    }

    fn sync_file(&self, path: &Path) -> io::Result<()> {
        if self.core.name_of(path).is_none() {
            return self.core.inner.sync_file(path);
        }
        self.core.sync_point(|| self.core.inner.sync_file(path))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let from_name = self.core.inside(from)?;
        let to_name = self.core.inside(to)?;
        self.core.change(
            false,
            |_| {
                vec![FileOp::Rename {
                    from: from_name,
                    to: to_name,
                }]
            },
            || self.core.inner.rename(from, to),
        )
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let name = self.core.inside(path)?;
        self.core.change(
            false,
            |_| vec![FileOp::Remove { name }],
            || self.core.inner.remove(path),
        )
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        if dir != self.core.dir {
            // The parent, synced at open after creating the directory: not a log file change.
            return self.core.inner.sync_dir(dir);
        }
        self.core.sync_point(|| self.core.inner.sync_dir(dir))
    }

    fn open_dir(&self, dir: &Path) -> io::Result<Box<dyn StorageDir>> {
        let inner = self.core.inner.open_dir(dir)?;
        if dir != self.core.dir {
            return Ok(inner);
        }
        Ok(Box::new(MirroredDir {
            core: Arc::clone(&self.core),
            inner,
        }))
    }
}

/// A file open through the storage: appends are recorded, `sync_data` is a sync point.
#[derive(Debug)]
struct MirroredFile {
    core: Arc<Core>,
    handle: u64,
    inner: Box<dyn StorageFile>,
}

impl StorageFile for MirroredFile {
    fn append(&mut self, buf: &[u8]) -> io::Result<()> {
        let handle = self.handle;
        let inner = &mut self.inner;
        self.core.change(
            true,
            |state| {
                // A file removed (or replaced by a rename) while open is no longer in the
                // directory: its bytes are not part of the log.
                let Some(Some(name)) = state.open_files.get(&handle) else {
                    return Vec::new();
                };
                buf.chunks(APPEND_BYTES_MAX)
                    .map(|chunk| FileOp::Append {
                        name: name.clone(),
                        bytes: chunk.to_vec(),
                    })
                    .collect()
            },
            || inner.append(buf),
        )
    }

    fn sync_data(&mut self) -> io::Result<()> {
        let inner = &mut self.inner;
        self.core.sync_point(|| inner.sync_data())
    }
}

impl Drop for MirroredFile {
    fn drop(&mut self) {
        self.core.lock().open_files.remove(&self.handle);
    }
}

/// The held log directory: its `sync` is a sync point.
#[derive(Debug)]
struct MirroredDir {
    core: Arc<Core>,
    inner: Box<dyn StorageDir>,
}

impl StorageDir for MirroredDir {
    fn sync(&self) -> io::Result<()> {
        self.core.sync_point(|| self.inner.sync())
    }
}
