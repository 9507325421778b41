//! The small value types of the API: options, record types, durability, records, recovery.

use std::path::PathBuf;

/// How a [`crate::Wal`] is run. `Default` is what services use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalOptions {
    /// A segment is closed and a new one started once appending would take it past this size.
    /// A record larger than this still goes into a segment of its own.
    pub segment_bytes_max: u64,
    /// Whether the writer calls fdatasync at all.
    pub sync: SyncPolicy,
    /// Longest a [`Durability::Grouped`] append waits for other records to share its fdatasync.
    pub group_delay: std::time::Duration,
    /// Longest a [`Durability::Background`] append waits in the queue for something else to
    /// wake the writer.
    pub background_delay: std::time::Duration,
}

impl Default for WalOptions {
    fn default() -> Self {
        WalOptions {
            segment_bytes_max: 64 * 1024 * 1024,
            sync: SyncPolicy::Fsync,
            group_delay: std::time::Duration::from_millis(1),
            background_delay: std::time::Duration::from_millis(10),
        }
    }
}

/// Whether durability is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncPolicy {
    /// fdatasync before a forced append resolves. The only policy services use.
    Fsync,
    /// Never fdatasync ("durability off"): for benchmark baselines only.
    Never,
}

/// The owner's tag for a record. Owners use 1..=127; 0 and 128..=255 are reserved by the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RecordType(pub u8);

impl RecordType {
    /// Highest type an owner may use.
    pub const OWNER_MAX: u8 = 127;

    pub(crate) fn is_owner_type(self) -> bool {
        (1..=Self::OWNER_MAX).contains(&self.0)
    }
}

/// When an append's ticket resolves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Resolves only after an fdatasync covers the record.
    Forced,
    /// Resolves once the record is written (in the page cache); it becomes durable with the next
    /// sync of the log (the next forced append, a segment roll, or a checkpoint).
    Lazy,
    /// Like `Lazy`, but the record does not wake the writer: it is written with the next batch
    /// something else wakes it for, or [`WalOptions::background_delay`] after it came, whichever is first.
    /// For records nobody waits on (a coordinator's `Begin`, acks and `End`): each `Lazy` one
    /// cost a wake-up of the writer thread and a write of its own. A process killed meanwhile
    /// loses them, as a power cut loses any record not yet synced.
    Background,
    /// Resolves only after an fdatasync covers the record, like `Forced`, but that fdatasync may
    /// wait up to [`WalOptions::group_delay`] for a forced append to share it. For records whose
    /// waiter is off every latency-critical path (a participant's commit before its ack): at low
    /// concurrency they stop taking an fdatasync of their own that the next forced append (the
    /// next prepare) would have to queue behind. Without fsync ([`SyncPolicy::Never`]) it
    /// resolves at once, like the others.
    Grouped,
}

/// One record as recovered or dumped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Position in the log: 1, 2, 3, ... without gaps.
    pub seq: u64,
    pub record_type: RecordType,
    pub payload: Vec<u8>,
}

/// What [`crate::Wal::open`] found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Recovery {
    /// The newest checkpoint's snapshot, if any checkpoint was ever taken.
    pub snapshot: Option<Vec<u8>>,
    /// Every record after the snapshot, in sequence order.
    pub records: Vec<Record>,
    /// Set when the last segment ended in a torn write that was cut off.
    pub torn_tail: Option<TornTail>,
}

/// A torn write found at the end of the last segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TornTail {
    /// The segment file.
    pub file: PathBuf,
    /// Where the first bad record starts: the segment is (or would be) truncated to this length.
    pub offset: u64,
    /// How many bytes follow that offset (and are, or would be, cut off).
    pub bytes: u64,
    /// Why the record at `offset` does not decode.
    pub reason: String,
    /// Where the cut-off bytes were copied (`None` when only inspected, not repaired).
    pub broken_copy: Option<PathBuf>,
}
