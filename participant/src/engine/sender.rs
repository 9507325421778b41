//! Who sent a 2PC message, and the fence its answer waits behind: prepare and the decisions
//! both check the sender the same way and end the same way, with a `Fence` record when the
//! message raised the epoch and nothing else forced carries it.

use protocol::{CoordinatorId, Epoch, GlobalTxId, Incarnation};

use super::types::{Command, Reply};
use crate::record::Record;
use crate::rejection::Rejection;

/// Who sent a message: the coordinator id and the run (epoch, incarnation) it fences with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sender {
    pub coordinator_id: CoordinatorId,
    pub epoch: Epoch,
    pub incarnation: Incarnation,
}

/// An attempt's global id must name its own coordinator: the id is what this participant
/// keys by, so two coordinators can never share one.
pub(super) fn check_owner(
    gtid: &GlobalTxId,
    coordinator_id: &CoordinatorId,
) -> Result<(), Rejection> {
    match gtid.parts() {
        Some((owner, _, _)) if owner == coordinator_id.as_str() => Ok(()),
        Some(_) | None => Err(Rejection::ForeignAttempt {
            gtid: gtid.clone(),
            coordinator_id: coordinator_id.clone(),
        }),
    }
}

/// A forced `Fence` record: an answer given from state whose own record may still be in
/// flight (a duplicate, say) leaves only once that record is durable.
pub(super) fn barrier(sender: &Sender) -> Command {
    Command::Log {
        record: Record::Fence {
            coordinator_id: sender.coordinator_id.clone(),
            epoch: sender.epoch,
            incarnation: sender.incarnation,
        },
        forced: true,
    }
}

/// Adds a fence record when the epoch rose and nothing forced carries it, then the reply.
pub(super) fn finish(
    mut commands: Vec<Command>,
    raised: bool,
    sender: &Sender,
    reply: Reply,
) -> Vec<Command> {
    let forced = commands
        .iter()
        .any(|c| matches!(c, Command::Log { forced: true, .. }));
    if raised && !forced {
        commands.push(barrier(sender));
    }
    commands.push(Command::Reply(reply));
    commands
}
