//! # twopc-wal: the write-ahead log
//!
//! **Owns:** durability for its owner (the coordinator's decisions, a participant's prepared
//! state): record framing with CRC-32, segment files that roll at a size limit (zero-filled ahead of
//! their appends, so an fdatasync rarely changes a file's size), group commit on a
//! dedicated writer thread (one write and one fdatasync per batch), recovery (torn tail cut with a
//! `.broken` copy kept, corruption refused with file, offset and reason), checkpoints that let
//! whole old segments be deleted, and read-only inspection for `twopc wal dump|verify`; and, for
//! a coordinator group, synchronous replication of the log directory as a stream of file
//! operations ([`MirroredStorage`] on the leader, [`Replica`] on a follower; issue 27).
//!
//! **Must never:** resolve a forced append before an fdatasync covers it; retry an fsync after a
//! failure (the log is poisoned instead: every later append errors); decode zero-filled space or
//! allocate from an unchecked length; guess past corruption (a bad record with valid data after
//! it, a bad record in an older segment, or a sequence gap refuses to open); modify a directory
//! while inspecting it; lock the data directory (the owning service does that); interpret
//! payloads (they are the owner's bytes); acknowledge a sync the mirror did not confirm (on a
//! replicating leader); or apply a replicated batch past a gap, twice, or outside its
//! directory (on a follower).
//!
//! The on-disk format, from `docs/wal-format.md`, follows.
//!
#![doc = include_str!("../../docs/wal-format.md")]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod crash_points;
mod error;
mod frame;
pub mod inspect;
mod mirror;
mod names;
mod preallocated;
mod recovery;
mod replica;
mod scan;
mod shared;
#[cfg(any(test, feature = "sim"))]
pub mod sim;
mod snapshot;
mod storage;
mod ticket;
mod types;
mod wal;
mod writer;

pub use error::WalError;
pub use frame::{
    FrameError, FrameRef, RECORD_PAYLOAD_BYTES_MAX, decode as decode_frame, encode as encode_frame,
};
pub use mirror::{BaseBackup, FileOp, Mirror, MirrorError, MirroredStorage, OpBatch, ShipWaiter};
pub use preallocated::{FILL_AHEAD_BYTES, PreallocatedStorage};
pub use replica::{Replica, ReplicaError, SwapRecovery};
pub use snapshot::{SNAPSHOT_BYTES_MAX, decode as decode_snapshot, encode as encode_snapshot};
pub use storage::{FileStorage, Storage, StorageDir, StorageFile};
pub use ticket::AppendTicket;
pub use types::{Durability, Record, RecordType, Recovery, SyncPolicy, TornTail, WalOptions};
pub use wal::{Wal, WalStats};

/// Byte-level constants of the format, for tools and tests.
pub mod format {
    pub use crate::frame::{
        CRC_BYTES, FRAME_OVERHEAD_BYTES, HEADER_BYTES, LEN_BYTES, LEN_MAX, LEN_MIN,
    };
    pub use crate::names::{segment_name, snapshot_name};
    pub use crate::snapshot::{SNAPSHOT_HEADER_BYTES, SNAPSHOT_MAGIC};
}
