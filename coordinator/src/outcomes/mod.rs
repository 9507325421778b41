//! Ended transactions' outcomes on disk for their whole idempotency window: the index (one
//! redb file). The task that moves outcomes into it from the engine's staging area is the
//! runtime's (`runtime::archiver`).

mod store;

pub use store::{ArchiveReport, Cursor, IndexStats, OutcomeError, OutcomeStore, Page};

/// The index's file name inside the data directory.
pub const FILE_NAME: &str = "outcomes.redb";

#[cfg(test)]
mod tests;
