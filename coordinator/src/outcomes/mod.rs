//! Ended transactions' outcomes on disk for their whole idempotency window: the index (one
//! redb file) and the task that moves outcomes into it from the engine's staging area.

mod archiver;
mod store;

pub use archiver::{ARCHIVE_BATCH_MAX, ARCHIVE_BATCH_WAIT, archiver};
pub use store::{ArchiveReport, Cursor, IndexStats, OutcomeError, OutcomeStore, Page};

/// The index's file name inside the data directory.
pub const FILE_NAME: &str = "outcomes.redb";

#[cfg(test)]
mod tests;
