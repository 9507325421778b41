//! The one error type of the log. Cloneable, because one failure (a poisoned log) is reported to
//! every waiting appender.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

/// Everything that can go wrong opening, appending to, checkpointing or inspecting a log.
#[derive(Debug, Clone, thiserror::Error)]
pub enum WalError {
    /// A record, snapshot or sequence number is wrong somewhere a torn write cannot explain.
    /// The log refuses to open: presumed abort is only safe on a log that is known complete.
    #[error("corrupt write-ahead log: {} at offset {offset}: {reason}", file.display())]
    Corrupt {
        file: PathBuf,
        offset: u64,
        reason: String,
    },
    /// An earlier write or fsync failed; the log accepts nothing more (fsync is never retried,
    /// because after a failed fsync the kernel may have dropped the dirty pages).
    #[error("write-ahead log is poisoned and accepts no more appends: {cause}")]
    Poisoned { cause: String },
    /// An operating-system call failed. When the writer sees this the log is poisoned.
    #[error("write-ahead log I/O failed: {op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: Arc<io::Error>,
    },
    /// The payload is larger than [`crate::RECORD_PAYLOAD_BYTES_MAX`]; nothing was written.
    #[error("record payload of {len} bytes exceeds the maximum of {max} bytes")]
    RecordTooLarge { len: usize, max: usize },
    /// The snapshot is larger than [`crate::SNAPSHOT_BYTES_MAX`]; nothing was written.
    #[error("snapshot of {len} bytes exceeds the maximum of {max} bytes")]
    SnapshotTooLarge { len: usize, max: usize },
    /// The owner could not encode its snapshot; nothing was written and the log is healthy.
    #[error("the snapshot could not be encoded: {0}")]
    SnapshotEncode(String),
    /// Another checkpoint is still being written; nothing was done (try again later).
    #[error("a checkpoint is already in progress")]
    CheckpointInProgress,
    /// Record types 0 and 128..=255 belong to the log itself.
    #[error("record type {0} is not available to owners (use 1..=127)")]
    InvalidRecordType(u8),
    /// Every sequence number but the last is used: the log takes no more records (nothing was
    /// written; no real log gets here, only a damaged or forged one).
    #[error("write-ahead log has used every sequence number; it takes no more records")]
    SequenceExhausted,
    /// The log was shut down (or its writer thread stopped) before this request was written.
    #[error("write-ahead log is closed")]
    Closed,
}

impl WalError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        WalError::Io {
            op,
            path: path.into(),
            source: Arc::new(source),
        }
    }

    pub(crate) fn corrupt(
        file: impl Into<PathBuf>,
        offset: u64,
        reason: impl Into<String>,
    ) -> Self {
        WalError::Corrupt {
            file: file.into(),
            offset,
            reason: reason.into(),
        }
    }
}
