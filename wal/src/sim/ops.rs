//! The simulated disk's implementation of the storage traits.

use std::io;
use std::path::{Path, PathBuf};

use super::{Inode, SimStorage, State, names_in, sim_error};
use crate::storage::{Storage, StorageDir, StorageFile};

#[derive(Debug)]
struct SimFile {
    storage: SimStorage,
    inode: u64,
    generation: u64,
}

impl SimFile {
    fn check(&self, state: &State) -> io::Result<()> {
        state.alive()?;
        if state.generation != self.generation {
            return Err(sim_error("stale handle from before a crash"));
        }
        Ok(())
    }
}

impl StorageFile for SimFile {
    fn append(&mut self, buf: &[u8]) -> io::Result<()> {
        let mut state = self.storage.lock();
        self.check(&state)?;
        if state.fail_write {
            state.stats.ops += 1;
            return Err(sim_error("write error (EIO)"));
        }
        // The bytes reach the page cache before an armed crash fires, so it can tear them.
        if let Some(inode) = state.inodes.get_mut(&self.inode) {
            inode.volatile.extend_from_slice(buf);
        }
        state.stats.writes += 1;
        state.op()
    }

    fn sync_data(&mut self) -> io::Result<()> {
        let delay = {
            let mut state = self.storage.lock();
            self.check(&state)?;
            state.op()?;
            state.stats.file_syncs += 1;
            if state.fail_sync {
                return Err(sim_error("fsync error (EIO)"));
            }
            // What this sync covers is fixed when it starts; writes during the delay are not.
            let covered = state.inodes.get(&self.inode).map(|i| i.volatile.len());
            (state.sync_delay, covered)
        };
        let (delay, covered) = delay;
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        let mut state = self.storage.lock();
        self.check(&state)?;
        if let (Some(inode), Some(covered)) = (state.inodes.get_mut(&self.inode), covered) {
            let covered = covered.min(inode.volatile.len());
            if inode.volatile.starts_with(&inode.durable) && covered >= inode.durable.len() {
                let newly = inode.volatile[inode.durable.len()..covered].to_vec();
                inode.durable.extend_from_slice(&newly);
            } else {
                inode.durable = inode.volatile[..covered].to_vec();
            }
        }
        Ok(())
    }
}

/// A held directory: syncing it is exactly [`Storage::sync_dir`] (same faults, same operation
/// count), so holding the handle changes nothing a crash test can see.
#[derive(Debug)]
struct SimDir {
    storage: SimStorage,
    dir: PathBuf,
}

impl StorageDir for SimDir {
    fn sync(&self) -> io::Result<()> {
        self.storage.sync_dir(&self.dir)
    }
}

impl Storage for SimStorage {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut state = self.lock();
        state.alive()?;
        for ancestor in dir.ancestors() {
            state.dirs.insert(ancestor.to_path_buf());
        }
        Ok(())
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let state = self.lock();
        state.alive()?;
        if !state.dirs.contains(dir) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{}", dir.display()),
            ));
        }
        Ok(names_in(&state, dir))
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let state = self.lock();
        state.alive()?;
        let id = state.inode(path)?;
        Ok(state
            .inodes
            .get(&id)
            .map(|i| i.volatile.clone())
            .unwrap_or_default())
    }

    fn create(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        let mut state = self.lock();
        state.op()?;
        if state.volatile.contains_key(path) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{}", path.display()),
            ));
        }
        let parent_exists = path.parent().is_some_and(|p| state.dirs.contains(p));
        if !parent_exists {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "no parent directory",
            ));
        }
        let id = state.next_inode;
        state.next_inode += 1;
        state.inodes.insert(id, Inode::default());
        state.volatile.insert(path.to_path_buf(), id);
        Ok(Box::new(SimFile {
            storage: self.clone(),
            inode: id,
            generation: state.generation,
        }))
    }

    fn open_append(&self, path: &Path) -> io::Result<Box<dyn StorageFile>> {
        let state = self.lock();
        state.alive()?;
        let id = state.inode(path)?;
        Ok(Box::new(SimFile {
            storage: self.clone(),
            inode: id,
            generation: state.generation,
        }))
    }

    fn truncate(&self, path: &Path, len: u64) -> io::Result<()> {
        let mut state = self.lock();
        state.op()?;
        let id = state.inode(path)?;
        if let Some(inode) = state.inodes.get_mut(&id) {
            inode.volatile.truncate(len as usize);
        }
        Ok(())
    }

    fn sync_file(&self, path: &Path) -> io::Result<()> {
        let mut state = self.lock();
        state.op()?;
        state.stats.file_syncs += 1;
        if state.fail_sync {
            return Err(sim_error("fsync error (EIO)"));
        }
        let id = state.inode(path)?;
        if let Some(inode) = state.inodes.get_mut(&id) {
            inode.durable.clone_from(&inode.volatile);
        }
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut state = self.lock();
        state.op()?;
        let id = state.inode(from)?;
        state.volatile.remove(from);
        state.volatile.insert(to.to_path_buf(), id);
        Ok(())
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut state = self.lock();
        state.op()?;
        state.inode(path)?;
        state.volatile.remove(path);
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut state = self.lock();
        state.op()?;
        state.stats.dir_syncs += 1;
        if state.fail_sync {
            return Err(sim_error("directory fsync error (EIO)"));
        }
        let in_dir = |p: &PathBuf| p.parent() == Some(dir);
        state.durable.retain(|p, _| !in_dir(p));
        let synced: Vec<(PathBuf, u64)> = state
            .volatile
            .iter()
            .filter(|(p, _)| in_dir(p))
            .map(|(p, id)| (p.clone(), *id))
            .collect();
        state.durable.extend(synced);
        Ok(())
    }

    fn open_dir(&self, dir: &Path) -> io::Result<Box<dyn StorageDir>> {
        // Not a mutating operation: crash points keep their numbers.
        let state = self.lock();
        state.alive()?;
        if !state.dirs.contains(dir) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{}", dir.display()),
            ));
        }
        Ok(Box::new(SimDir {
            storage: self.clone(),
            dir: dir.to_path_buf(),
        }))
    }
}
