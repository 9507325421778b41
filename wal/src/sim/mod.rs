//! A simulated disk for crash tests (feature `sim`). A SIGKILL keeps the page cache, so it cannot
//! catch a missing fsync; this can. It models what fsync promises and nothing more:
//!
//! - file data is durable only up to the last `sync_data`/`sync_file` of that file;
//! - creates, renames and removes are durable only after `sync_dir` of their directory;
//! - a crash ([`SimStorage::crash`]) keeps, per [`Unsynced`], none, all, or a random prefix of
//!   each file's unsynced appended bytes (tearing the last write at any byte) and a random subset of
//!   the unsynced directory changes;
//! - faults: [`SimStorage::flip_bit`], failing writes or syncs, and a crash armed to fire at the
//!   n-th mutating operation ([`SimStorage::arm_crash`]);
//! - preallocated segments ([`SimStorage::set_zero_tails`]): a crash leaves the newest segment
//!   of each directory ending in zeros, as one zero-filled ahead of its appends
//!   (`crate::preallocated`) does, behind whatever the crash kept (a torn record included).
//!
//! After a crash every operation fails until [`SimStorage::reboot`]; drop the old `Wal` first.

mod ops;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// What a crash does with data and directory changes that were never synced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unsynced {
    /// Power loss with nothing written back: only synced state survives.
    Drop,
    /// Process crash: the page cache survives whole.
    Keep,
    /// Power loss mid-writeback: each file keeps a random prefix (0..=all) of its unsynced bytes,
    /// each unsynced directory change survives or not at random; reproducible from `seed`.
    Tear { seed: u64 },
}

/// Counters of the operations the log issued.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimStats {
    pub writes: u64,
    /// File fsync/fdatasync calls, failed ones included.
    pub file_syncs: u64,
    /// Directory fsync calls, failed ones included.
    pub dir_syncs: u64,
    /// Mutating operations (create, write, sync, truncate, rename, remove).
    pub ops: u64,
    pub crashes: u64,
}

/// The simulated storage; clones share one disk.
#[derive(Debug, Clone, Default)]
pub struct SimStorage {
    state: Arc<Mutex<State>>,
}

#[derive(Debug, Default)]
pub(super) struct Inode {
    pub(super) durable: Vec<u8>,
    pub(super) volatile: Vec<u8>,
}

#[derive(Debug, Default)]
pub(super) struct State {
    pub(super) dirs: BTreeSet<PathBuf>,
    /// Names as the running system sees them.
    pub(super) volatile: BTreeMap<PathBuf, u64>,
    /// Names a power loss keeps.
    pub(super) durable: BTreeMap<PathBuf, u64>,
    pub(super) inodes: HashMap<u64, Inode>,
    pub(super) next_inode: u64,
    pub(super) crashed: bool,
    pub(super) generation: u64,
    pub(super) fail_write: bool,
    pub(super) fail_sync: bool,
    pub(super) armed: Option<(u64, Unsynced)>,
    pub(super) sync_delay: Duration,
    pub(super) zero_tails: bool,
    pub(super) stats: SimStats,
}

pub(super) fn sim_error(what: &str) -> io::Error {
    io::Error::other(format!("simulated {what}"))
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl State {
    pub(super) fn alive(&self) -> io::Result<()> {
        if self.crashed {
            Err(sim_error("crash: the machine is down"))
        } else {
            Ok(())
        }
    }

    /// Counts a mutating operation; fires an armed crash when its count is reached.
    pub(super) fn op(&mut self) -> io::Result<()> {
        self.alive()?;
        self.stats.ops += 1;
        if let Some((left, mode)) = &mut self.armed {
            if *left == 0 {
                let mode = *mode;
                self.armed = None;
                self.crash(mode);
                return Err(sim_error("crash during this operation"));
            }
            *left -= 1;
        }
        Ok(())
    }

    pub(super) fn inode(&self, path: &Path) -> io::Result<u64> {
        self.volatile
            .get(path)
            .copied()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("{}", path.display())))
    }

    fn crash(&mut self, mode: Unsynced) {
        let mut rng = match mode {
            Unsynced::Tear { seed } => seed,
            Unsynced::Drop | Unsynced::Keep => 0,
        };
        let mut ids: Vec<u64> = self.inodes.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            let Some(inode) = self.inodes.get_mut(&id) else {
                continue;
            };
            let appended_only = inode.volatile.starts_with(&inode.durable);
            let kept = match mode {
                Unsynced::Keep => inode.volatile.len(),
                Unsynced::Drop => inode.durable.len(),
                Unsynced::Tear { .. } if appended_only => {
                    let unsynced = (inode.volatile.len() - inode.durable.len()) as u64;
                    inode.durable.len() + (splitmix(&mut rng) % (unsynced + 1)) as usize
                }
                Unsynced::Tear { .. } => inode.durable.len(),
            };
            let content = if appended_only || mode == Unsynced::Keep {
                inode.volatile[..kept].to_vec()
            } else {
                inode.durable.clone()
            };
            inode.durable.clone_from(&content);
            inode.volatile = content;
        }
        let names: BTreeSet<PathBuf> = self
            .volatile
            .keys()
            .chain(self.durable.keys())
            .cloned()
            .collect();
        for name in names {
            let volatile = self.volatile.get(&name).copied();
            let durable = self.durable.get(&name).copied();
            let keep_volatile = match mode {
                Unsynced::Keep => true,
                Unsynced::Drop => false,
                Unsynced::Tear { .. } => {
                    volatile != durable && splitmix(&mut rng).is_multiple_of(2)
                }
            };
            let survivor = if keep_volatile { volatile } else { durable };
            match survivor {
                Some(id) => {
                    self.volatile.insert(name.clone(), id);
                    self.durable.insert(name, id);
                }
                None => {
                    self.volatile.remove(&name);
                    self.durable.remove(&name);
                }
            }
        }
        if self.zero_tails {
            self.add_zero_tails();
        }
        self.crashed = true;
        self.generation += 1;
        self.stats.crashes += 1;
    }

    /// Zeros after the newest segment of each directory, 1 to 8 KiB of them, as many as the
    /// crash's generation picks (reproducible).
    fn add_zero_tails(&mut self) {
        let mut newest: BTreeMap<PathBuf, (PathBuf, u64)> = BTreeMap::new();
        for (path, &id) in &self.volatile {
            let is_segment = path
                .file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| {
                    matches!(
                        crate::names::classify(name),
                        crate::names::FileKind::Segment { .. }
                    )
                });
            let Some(dir) = path.parent() else { continue };
            if is_segment {
                // Names sort in log order; the map keeps the last one seen per directory.
                newest.insert(dir.to_path_buf(), (path.clone(), id));
            }
        }
        let mut rng = self.generation ^ 0x2E40_7A11;
        for (_, (_, id)) in newest {
            let zeros = 1 + (splitmix(&mut rng) % 8192) as usize;
            if let Some(inode) = self.inodes.get_mut(&id) {
                inode.durable.resize(inode.durable.len() + zeros, 0);
                inode.volatile.clone_from(&inode.durable);
            }
        }
    }
}

impl SimStorage {
    pub fn new() -> Self {
        Self::default()
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Crashes now. Every operation fails until [`SimStorage::reboot`].
    pub fn crash(&self, mode: Unsynced) {
        self.lock().crash(mode);
    }

    /// Crashes at the start of the mutating operation after `ops` more of them (0 = the next
    /// one). A write it interrupts has reached the page cache, so `Unsynced::Tear` can tear it.
    pub fn arm_crash(&self, ops: u64, mode: Unsynced) {
        self.lock().armed = Some((ops, mode));
    }

    pub fn has_crashed(&self) -> bool {
        self.lock().crashed
    }

    /// Brings the machine back up after a crash (open the log again after this).
    pub fn reboot(&self) {
        let mut state = self.lock();
        state.crashed = false;
        state.armed = None;
    }

    /// Crashes leave zeros after the newest segment of each directory, as preallocated segments
    /// do (see the module doc).
    pub fn set_zero_tails(&self, on: bool) {
        self.lock().zero_tails = on;
    }

    /// Every write fails (with EIO-like errors) while set.
    pub fn set_fail_write(&self, fail: bool) {
        self.lock().fail_write = fail;
    }

    /// Every file and directory sync fails while set.
    pub fn set_fail_sync(&self, fail: bool) {
        self.lock().fail_sync = fail;
    }

    /// Every file sync takes this long (outside the disk's lock, so writes can queue up meanwhile,
    /// as with a real disk). Makes group commit visible in tests.
    pub fn set_sync_delay(&self, delay: Duration) {
        self.lock().sync_delay = delay;
    }

    pub fn stats(&self) -> SimStats {
        self.lock().stats
    }

    /// Flips one bit of a file, in the page cache and on "disk" alike. Panics (test helper) if the
    /// file or the byte does not exist.
    pub fn flip_bit(&self, path: &Path, byte: usize, bit: u8) {
        let mut state = self.lock();
        let id = state.inode(path).expect("flip_bit: no such file");
        let inode = state.inodes.get_mut(&id).expect("inode");
        inode.volatile[byte] ^= 1 << bit;
        if byte < inode.durable.len() {
            inode.durable[byte] ^= 1 << bit;
        }
    }

    /// Replaces a file's content, durably (test setup: zero tails, garbage, truncation).
    pub fn set_contents(&self, path: &Path, bytes: Vec<u8>) {
        let mut state = self.lock();
        if let Some(parent) = path.parent() {
            for ancestor in parent.ancestors() {
                state.dirs.insert(ancestor.to_path_buf());
            }
        }
        let id = match state.volatile.get(path) {
            Some(id) => *id,
            None => {
                let id = state.next_inode;
                state.next_inode += 1;
                state.volatile.insert(path.to_path_buf(), id);
                state.durable.insert(path.to_path_buf(), id);
                id
            }
        };
        state.inodes.insert(
            id,
            Inode {
                durable: bytes.clone(),
                volatile: bytes,
            },
        );
    }

    /// A file's content as the running system sees it.
    pub fn contents(&self, path: &Path) -> Option<Vec<u8>> {
        let state = self.lock();
        let id = state.volatile.get(path)?;
        state.inodes.get(id).map(|inode| inode.volatile.clone())
    }

    /// Names of the files in `dir`, sorted.
    pub fn file_names(&self, dir: &Path) -> Vec<String> {
        let state = self.lock();
        names_in(&state, dir)
    }

    /// Deletes a file durably (test setup: a lost segment).
    pub fn delete(&self, path: &Path) {
        let mut state = self.lock();
        state.volatile.remove(path);
        state.durable.remove(path);
    }
}

pub(super) fn names_in(state: &State, dir: &Path) -> Vec<String> {
    state
        .volatile
        .keys()
        .filter(|p| p.parent() == Some(dir))
        .filter_map(|p| p.file_name().and_then(|n| n.to_str()).map(str::to_string))
        .collect()
}
