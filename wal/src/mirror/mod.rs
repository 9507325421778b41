//! Synchronous replication of a log directory as a stream of file operations (issue 27).
//!
//! **Owns:** the vocabulary of the stream ([`FileOp`], [`OpBatch`], [`BaseBackup`]), their wire
//! encodings ([`codec`]), the [`Mirror`] contract, and [`MirroredStorage`], the [`Storage`]
//! wrapper that records every change to one log directory and ships it at every sync point. Like
//! PostgreSQL's physical replication it knows bytes and file names, never records or
//! transactions: the log's writer runs on it unchanged, and group commit batches replication
//! exactly as it batches fsyncs.
//!
//! **Must never:** acknowledge a sync (return `Ok` from it) that the mirror did not confirm;
//! ship ops out of order or with a gap; let a base backup see a change without its op number
//! (or the other way round); record a change outside its directory (such changes are refused);
//! or sync again after a failed sync (it refuses every later change instead, as the log
//! poisons itself).
//!
//! [`Storage`]: crate::Storage

mod codec;
mod storage;

use std::fmt::Debug;
use std::io;

pub use codec::MirrorError;
pub use storage::MirroredStorage;

/// One change to a file of the log directory. Names are plain file names in that directory
/// (the log has no subdirectories): 1 to 255 bytes, no `/`, `\` or NUL, not `.` or `..`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileOp {
    /// A new, empty file (it did not exist).
    Create { name: String },
    /// Bytes written at the end of an existing file.
    Append { name: String, bytes: Vec<u8> },
    /// The file cut (or, never by the log, extended with zeros) to `len` bytes.
    Truncate { name: String, len: u64 },
    /// `from` renamed to `to`, replacing `to` if it existed.
    Rename { from: String, to: String },
    /// The file deleted.
    Remove { name: String },
}

/// The ops recorded between two sync points. Ops are numbered 1, 2, 3, ... per
/// [`MirroredStorage`] instance; `first` is the number of `ops[0]`, so a batch's ops are
/// `first ..= first + ops.len() - 1` and the next batch starts right after.
///
/// A new `MirroredStorage` (a restarted leader) starts again at 1: the transport must tell its
/// followers so, and they take a new base backup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpBatch {
    pub first: u64,
    pub ops: Vec<FileOp>,
}

/// Every file of the log directory, read at one instant under the op lock: every op numbered
/// below `next_op` is reflected in `files`, none at or above it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseBackup {
    /// The number the next recorded op gets.
    pub next_op: u64,
    /// (name, whole content), in the order the storage listed them (sorted by name).
    pub files: Vec<(String, Vec<u8>)>,
}

/// What waits for the followers to confirm a shipped batch.
pub type ShipWaiter = Box<dyn FnOnce() -> io::Result<()> + Send>;

/// Where a leader's op batches go: the followers, over whatever transport the owner uses.
///
/// The contract, as [`MirroredStorage`] uses it at every sync point (an fdatasync of a file or
/// an fsync of the directory) that has ops recorded since the previous one:
///
/// 1. `ship(batch)` is called with those ops, under the storage's op lock, so batches arrive in
///    op order with no gap (`batch.first` is one past the previous batch's last op) and never
///    empty. It must only *start* shipping (hand the bytes to the transport) and return quickly:
///    every change to the directory waits for it.
/// 2. The storage then does its local sync, outside the lock.
/// 3. Then it calls the returned waiter, which blocks until the followers that must hold the
///    batch have confirmed that they wrote and fsynced it (a [`crate::Replica::apply`] returned
///    `Ok`), and returns `Ok(())`, or an error if that cannot be confirmed (a follower refused
///    it, the connection dropped, a timeout). The waiter is always called, even when the local
///    sync failed.
/// 4. The sync returns `Ok` only if both the local sync and the waiter did; the log resolves no
///    ticket otherwise (it poisons itself, as for any failed sync), and the storage takes no
///    more changes.
///
/// A batch may also be shipped without a local sync when the ops recorded since the last sync
/// point grow past a bound (long runs of lazy appends); its waiter is called at once. Followers
/// hold at least what the leader's disk holds, never less.
pub trait Mirror: Send + Sync + Debug {
    fn ship(&self, batch: OpBatch) -> ShipWaiter;
}

/// Whether `name` is a plain file name inside the log directory.
pub(crate) fn valid_name(name: &str) -> bool {
    (1..=codec::NAME_BYTES_MAX).contains(&name.len())
        && name != "."
        && name != ".."
        && !name.contains(['/', '\\', '\0'])
}
