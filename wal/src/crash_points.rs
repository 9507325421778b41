//! The log's crash points (`fail` crate, armed with `FAILPOINTS=<name>=return`): each aborts
//! the process where a crash leaves the disk in a state recovery must handle. The crash matrix
//! (`chaos-tests/tests/crash_matrix.rs`, docs/recovery.md) arms each one.

use crate::error::WalError;

/// `wal::between_write_and_fsync`: the batch is in the page cache, not yet durable.
pub(crate) fn crash_point_between_write_and_fsync() -> Result<(), WalError> {
    fail::fail_point!("wal::between_write_and_fsync", |_| std::process::abort());
    Ok(())
}

/// `wal::roll_after_trim`: the segment a roll closes is synced and trimmed to its last record,
/// the next one not yet created.
pub(crate) fn crash_point_roll_after_trim() -> Result<(), WalError> {
    fail::fail_point!("wal::roll_after_trim", |_| std::process::abort());
    Ok(())
}

/// `wal::checkpoint_before_delete`: the new snapshot is durable, old segments not yet deleted.
pub(crate) fn crash_point_before_checkpoint_delete() -> Result<(), WalError> {
    fail::fail_point!("wal::checkpoint_before_delete", |_| std::process::abort());
    Ok(())
}
