//! Small constructors the engine's test modules share.

use protocol::{CoordinatorId, Epoch, Incarnation, ParticipantName, TxId};

use crate::records::{Attempt, EpochRecord};

pub fn id(s: &str) -> TxId {
    TxId::new(s).unwrap()
}

pub fn name(s: &str) -> ParticipantName {
    ParticipantName::new(s).unwrap()
}

pub fn coordinator() -> CoordinatorId {
    CoordinatorId::new("c-1").unwrap()
}

/// The epoch record of one run of coordinator `c-1`.
pub fn run(incarnation: Incarnation, epoch: u64) -> EpochRecord {
    EpochRecord {
        coordinator_id: coordinator(),
        epoch: Epoch(epoch),
        incarnation,
    }
}

/// The `position`th attempt of run `incarnation` of coordinator `c-1`.
pub fn attempt(incarnation: Incarnation, position: u64) -> Attempt {
    Attempt::new(&coordinator(), incarnation, position)
}

/// Splits off the outcomes staged for the index (`Command::Archive`), so a test can compare
/// the rest and check the archives on their own.
pub fn split_archives(
    commands: Vec<crate::engine::Command>,
) -> (Vec<crate::records::Retained>, Vec<crate::engine::Command>) {
    let mut archives = Vec::new();
    let mut rest = Vec::new();
    for command in commands {
        match command {
            crate::engine::Command::Archive(retained) => archives.push(retained),
            other => rest.push(other),
        }
    }
    (archives, rest)
}
