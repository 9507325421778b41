//! A follower's copy of a leader's log directory, kept by applying the leader's
//! [`OpBatch`]es (issue 27). Promoted, the follower opens that directory with
//! [`crate::Wal::open`]: ordinary recovery, nothing replica-specific.
//!
//! **Owns:** installing a [`BaseBackup`] atomically (a whole new copy swapped in by renames, a
//! half-done swap finished or undone by [`Replica::recover_dirs`]), applying batches in op order
//! and making them durable before saying so, and knowing which op it expects next.
//!
//! **Must never:** apply a batch with a gap before it, or an op twice; acknowledge (return `Ok`
//! from [`Replica::apply`]) before every touched file and the directory are fsynced; touch a
//! path outside its directory; or keep applying after a failed apply (the copy's state is then
//! unknown: it needs a new base backup, as after a restart).

use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::mirror::{BaseBackup, FileOp, OpBatch, valid_name};

/// Why a replica refused or failed a backup or a batch.
#[derive(Debug, thiserror::Error)]
pub enum ReplicaError {
    /// No base backup was installed in this process, or the last apply failed.
    #[error("the replica holds no base backup it can continue from; install a new one")]
    NeedsBackup,
    /// The batch starts after the op the replica expects: ops in between are missing.
    #[error("op batch starts at op {got} but the replica expects op {expected}: ops are missing")]
    Gap { expected: u64, got: u64 },
    /// A batch the replica cannot apply as given (its numbers overflow, or a name is not a plain
    /// file name).
    #[error("invalid op batch: {reason}")]
    InvalidBatch { reason: String },
    /// A backup the replica cannot install as given (a name is not a plain file name).
    #[error("invalid base backup: {reason}")]
    InvalidBackup { reason: String },
    /// Applying op number `op` failed on `file`.
    #[error("replica op {op}: {action} {} failed: {source}", file.display())]
    Apply {
        op: u64,
        action: &'static str,
        file: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A file-system call outside any single op failed (install, fsync after a batch, recovery
    /// of a half-done swap).
    #[error("replica: {action} {} failed: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn io_err<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> ReplicaError + 'a {
    move |source| ReplicaError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

/// What [`Replica::recover_dirs`] found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SwapRecovery {
    /// No install was interrupted.
    Clean,
    /// An install stopped while writing `<dir>.incoming`: removed, the old copy (if any) stays.
    RemovedIncoming,
    /// An install stopped between its two renames: the complete new copy was moved into place
    /// and the old one removed.
    FinishedSwap,
    /// An install stopped after the swap, before the old copy was removed: removed now.
    RemovedOld,
    /// Only the old copy was left (the new one is not there): moved back into place.
    RestoredOld,
}

/// A follower's copy of one leader log directory.
#[derive(Debug)]
pub struct Replica {
    dir: PathBuf,
    next_op: Option<u64>,
}

impl Replica {
    /// Does not touch the disk. Until [`Replica::install`] succeeds in this process,
    /// [`Replica::next_op`] is `None` and [`Replica::apply`] refuses: a restarted follower
    /// always starts from a fresh base backup (it cannot know which ops its copy already holds).
    pub fn new(dir: PathBuf) -> Replica {
        Replica { dir, next_op: None }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The number of the next op this copy needs; `None` when it needs a base backup.
    pub fn next_op(&self) -> Option<u64> {
        self.next_op
    }

    /// Replaces the copy with `backup`, durably and atomically: written whole into
    /// `<dir>.incoming` (every file and that directory fsynced), then `dir` renamed to
    /// `<dir>.old`, `<dir>.incoming` renamed to `dir`, the parent fsynced, `<dir>.old` removed.
    /// A crash at any point leaves the old complete copy or the new one, once
    /// [`Replica::recover_dirs`] ran (this calls it first).
    pub fn install(&mut self, backup: &BaseBackup) -> Result<(), ReplicaError> {
        self.next_op = None;
        if backup.next_op == 0 {
            return Err(ReplicaError::InvalidBackup {
                reason: "op numbers start at 1".to_string(),
            });
        }
        if let Some((name, _)) = backup.files.iter().find(|(n, _)| !valid_name(n)) {
            return Err(ReplicaError::InvalidBackup {
                reason: format!("{name:?} is not a plain file name"),
            });
        }
        Self::recover_dirs(&self.dir)?;
        let paths = Paths::of(&self.dir)?;
        write_incoming(&paths, backup)?;
        paths.park_old()?;
        paths.promote_incoming()?;
        paths.drop_old()?;
        self.next_op = Some(backup.next_op);
        Ok(())
    }

    /// Finishes or undoes an install a crash interrupted, so that `dir` holds one complete
    /// copy (or, if no install ever finished, nothing): run it before opening `dir` as a log.
    /// The rule: `<dir>.incoming` is known complete only once `<dir>.old` exists (the old copy
    /// is parked only after the new one was fsynced), so with both present the swap is
    /// finished; without `<dir>.old` an incoming copy may be partial and is removed.
    pub fn recover_dirs(dir: &Path) -> Result<SwapRecovery, ReplicaError> {
        let paths = Paths::of(dir)?;
        let exists = |path: &Path| path.try_exists().map_err(|e| io_err("check", path)(e));
        let (has_dir, has_incoming, has_old) = (
            exists(&paths.dir)?,
            exists(&paths.incoming)?,
            exists(&paths.old)?,
        );
        let outcome = match (has_dir, has_incoming, has_old) {
            (_, false, false) => SwapRecovery::Clean,
            (_, true, false) => {
                remove_dir(&paths.incoming)?;
                SwapRecovery::RemovedIncoming
            }
            (false, true, true) => {
                paths.promote_incoming()?;
                paths.drop_old()?;
                SwapRecovery::FinishedSwap
            }
            (true, has_incoming, true) => {
                // The swap finished (`dir` came from the incoming copy); an incoming copy
                // next to it cannot come from this install sequence, so it goes too.
                if has_incoming {
                    remove_dir(&paths.incoming)?;
                }
                paths.drop_old()?;
                SwapRecovery::RemovedOld
            }
            (false, false, true) => {
                fs::rename(&paths.old, &paths.dir).map_err(io_err("rename", &paths.old))?;
                sync_dir(&paths.parent)?;
                SwapRecovery::RestoredOld
            }
        };
        Ok(outcome)
    }

    /// Applies `batch` and makes it durable. Ops numbered below [`Replica::next_op`] are
    /// already in the copy and skipped (a batch may straddle the base backup's point); the rest
    /// run in order on plain files, then every touched file that still exists and (if a name
    /// changed) the directory are fsynced, and only then does `next_op` advance. A failure
    /// leaves the copy needing a new base backup.
    pub fn apply(&mut self, batch: &OpBatch) -> Result<(), ReplicaError> {
        let expected = self.next_op.ok_or(ReplicaError::NeedsBackup)?;
        if batch.first > expected {
            return Err(ReplicaError::Gap {
                expected,
                got: batch.first,
            });
        }
        let end = batch
            .first
            .checked_add(batch.ops.len() as u64)
            .filter(|_| batch.first > 0)
            .ok_or_else(|| ReplicaError::InvalidBatch {
                reason: format!("op numbers from {} do not fit", batch.first),
            })?;
        if end <= expected {
            return Ok(());
        }
        // Refused before anything is touched, so a refusal leaves the copy as it was.
        for (number, op) in (batch.first..).zip(&batch.ops) {
            if let Some(name) = op_names(op).into_iter().find(|n| !valid_name(n)) {
                return Err(ReplicaError::InvalidBatch {
                    reason: format!("op {number}: {name:?} is not a plain file name"),
                });
            }
        }
        self.next_op = None;
        let skip = (expected - batch.first) as usize;
        let mut touched = BTreeSet::new();
        let mut names_changed = false;
        for (number, op) in (batch.first..).zip(&batch.ops).skip(skip) {
            names_changed |= self.apply_op(number, op, &mut touched)?;
        }
        for name in &touched {
            let path = self.dir.join(name);
            match OpenOptions::new().write(true).open(&path) {
                Ok(file) => file.sync_all().map_err(io_err("fsync", &path))?,
                // Removed or renamed away later in the batch: nothing left to sync.
                Err(error) if error.kind() == io::ErrorKind::NotFound => {}
                Err(error) => return Err(io_err("open", &path)(error)),
            }
        }
        if names_changed {
            sync_dir(&self.dir)?;
        }
        self.next_op = Some(end);
        Ok(())
    }

    /// One op; returns whether it changed the directory's names.
    fn apply_op(
        &self,
        number: u64,
        op: &FileOp,
        touched: &mut BTreeSet<String>,
    ) -> Result<bool, ReplicaError> {
        // Names were checked by `apply`.
        let path = |name: &str| self.dir.join(name);
        let failed = |action: &'static str, file: &Path| {
            let file = file.to_path_buf();
            move |source| ReplicaError::Apply {
                op: number,
                action,
                file,
                source,
            }
        };
        match op {
            FileOp::Create { name } => {
                let file = path(name);
                OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&file)
                    .map_err(failed("create", &file))?;
                touched.insert(name.clone());
                Ok(true)
            }
            FileOp::Append { name, bytes } => {
                let file = path(name);
                OpenOptions::new()
                    .append(true)
                    .open(&file)
                    .and_then(|mut f| f.write_all(bytes))
                    .map_err(failed("append to", &file))?;
                touched.insert(name.clone());
                Ok(false)
            }
            FileOp::Truncate { name, len } => {
                let file = path(name);
                OpenOptions::new()
                    .write(true)
                    .open(&file)
                    .and_then(|f| f.set_len(*len))
                    .map_err(failed("truncate", &file))?;
                touched.insert(name.clone());
                Ok(false)
            }
            FileOp::Rename { from, to } => {
                let (from_path, to_path) = (path(from), path(to));
                fs::rename(&from_path, &to_path).map_err(failed("rename", &from_path))?;
                // Its bytes may be unsynced under the old name.
                touched.remove(from);
                touched.insert(to.clone());
                Ok(true)
            }
            FileOp::Remove { name } => {
                let file = path(name);
                fs::remove_file(&file).map_err(failed("remove", &file))?;
                touched.remove(name);
                Ok(true)
            }
        }
    }
}

fn op_names(op: &FileOp) -> Vec<&str> {
    match op {
        FileOp::Create { name }
        | FileOp::Append { name, .. }
        | FileOp::Truncate { name, .. }
        | FileOp::Remove { name } => vec![name],
        FileOp::Rename { from, to } => vec![from, to],
    }
}

/// The directory, its two siblings and their parent.
struct Paths {
    dir: PathBuf,
    incoming: PathBuf,
    old: PathBuf,
    parent: PathBuf,
}

impl Paths {
    fn of(dir: &Path) -> Result<Paths, ReplicaError> {
        let name = dir
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| ReplicaError::Io {
                action: "name the siblings of",
                path: dir.to_path_buf(),
                source: io::Error::new(io::ErrorKind::InvalidInput, "no UTF-8 final component"),
            })?;
        let parent = match dir.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
            _ => PathBuf::from("."),
        };
        Ok(Paths {
            dir: parent.join(name),
            incoming: parent.join(format!("{name}.incoming")),
            old: parent.join(format!("{name}.old")),
            parent,
        })
    }

    /// Swap step 1: the current copy (if any) moves aside.
    fn park_old(&self) -> Result<(), ReplicaError> {
        if self.dir.try_exists().map_err(io_err("check", &self.dir))? {
            fs::rename(&self.dir, &self.old).map_err(io_err("rename", &self.dir))?;
        }
        Ok(())
    }

    /// Swap step 2: the new copy takes its place, durably.
    fn promote_incoming(&self) -> Result<(), ReplicaError> {
        fs::rename(&self.incoming, &self.dir).map_err(io_err("rename", &self.incoming))?;
        sync_dir(&self.parent)
    }

    /// Swap step 3: the old copy goes.
    fn drop_old(&self) -> Result<(), ReplicaError> {
        if self.old.try_exists().map_err(io_err("check", &self.old))? {
            remove_dir(&self.old)?;
        }
        Ok(())
    }
}

/// Writes every file of `backup` into a fresh `<dir>.incoming` and makes it all durable.
fn write_incoming(paths: &Paths, backup: &BaseBackup) -> Result<(), ReplicaError> {
    let incoming = &paths.incoming;
    fs::create_dir_all(&paths.parent).map_err(io_err("create directory", &paths.parent))?;
    fs::create_dir(incoming).map_err(io_err("create directory", incoming))?;
    for (name, bytes) in &backup.files {
        let path = incoming.join(name);
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(io_err("create", &path))?;
        file.write_all(bytes).map_err(io_err("write", &path))?;
        file.sync_all().map_err(io_err("fsync", &path))?;
    }
    sync_dir(incoming)?;
    // The incoming directory's own entry, before anything depends on it.
    sync_dir(&paths.parent)
}

fn remove_dir(path: &Path) -> Result<(), ReplicaError> {
    fs::remove_dir_all(path).map_err(io_err("remove", path))?;
    let parent = path.parent().unwrap_or(Path::new("."));
    sync_dir(parent)
}

fn sync_dir(dir: &Path) -> Result<(), ReplicaError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("fsync directory", dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backup(next_op: u64, files: &[(&str, &[u8])]) -> BaseBackup {
        BaseBackup {
            next_op,
            files: files
                .iter()
                .map(|(n, b)| (n.to_string(), b.to_vec()))
                .collect(),
        }
    }

    fn contents(dir: &Path) -> Vec<(String, Vec<u8>)> {
        let mut out: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.file_name().into_string().unwrap(),
                    fs::read(e.path()).unwrap(),
                )
            })
            .collect();
        out.sort();
        out
    }

    /// A crash after each step of the swap: recovery leaves exactly one complete copy.
    #[test]
    fn a_swap_interrupted_after_any_step_recovers_to_one_complete_copy() {
        let old = backup(5, &[("a", b"old")]);
        let new = backup(9, &[("a", b"new"), ("b", b"more")]);
        for steps in 0..=3 {
            let tmp = tempfile::tempdir().unwrap();
            let dir = tmp.path().join("replica");
            let mut replica = Replica::new(dir.clone());
            replica.install(&old).unwrap();
            let paths = Paths::of(&dir).unwrap();
            write_incoming(&paths, &new).unwrap();
            if steps >= 1 {
                paths.park_old().unwrap();
            }
            if steps >= 2 {
                paths.promote_incoming().unwrap();
            }
            if steps >= 3 {
                // Old copy half removed: one of its files gone.
                fs::remove_file(paths.old.join("a")).unwrap();
            }
            let expected = [
                SwapRecovery::RemovedIncoming,
                SwapRecovery::FinishedSwap,
                SwapRecovery::RemovedOld,
                SwapRecovery::RemovedOld,
            ][steps];
            assert_eq!(
                Replica::recover_dirs(&dir).unwrap(),
                expected,
                "step {steps}"
            );
            let want = if steps == 0 { &old } else { &new };
            assert_eq!(contents(&dir), want.files, "step {steps}");
            assert!(
                !paths.incoming.exists() && !paths.old.exists(),
                "step {steps}"
            );
            assert_eq!(Replica::recover_dirs(&dir).unwrap(), SwapRecovery::Clean);
        }
    }

    #[test]
    fn only_the_parked_old_copy_left_is_restored() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("replica");
        Replica::new(dir.clone())
            .install(&backup(3, &[("x", b"1")]))
            .unwrap();
        Paths::of(&dir).unwrap().park_old().unwrap();
        assert!(!dir.exists());
        assert_eq!(
            Replica::recover_dirs(&dir).unwrap(),
            SwapRecovery::RestoredOld
        );
        assert_eq!(contents(&dir), vec![("x".to_string(), b"1".to_vec())]);
    }

    #[test]
    fn a_first_install_cut_short_leaves_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("replica");
        let paths = Paths::of(&dir).unwrap();
        fs::create_dir(&paths.incoming).unwrap();
        fs::write(paths.incoming.join("half"), b"x").unwrap();
        assert_eq!(
            Replica::recover_dirs(&dir).unwrap(),
            SwapRecovery::RemovedIncoming
        );
        assert!(!dir.exists() && !paths.incoming.exists());
    }
}
