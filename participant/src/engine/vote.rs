//! How a prepare's vote becomes binding, for a fresh prepare and a lock waiter alike: a yes
//! takes the locks and enters the prepared set, with the record to force before it leaves; a
//! no leaves a tombstone and a `Refused` record, so a duplicate prepare gets the same no.

use protocol::digest::Digest;
use protocol::limits::REASON_LEN_MAX;
use protocol::{GlobalTxId, TxId};

use super::Engine;
use super::sender::Sender;
use super::types::{Command, PreparedTx};
use crate::record::Record;
use crate::resource::Resource;
use crate::tombstones::Ended;

/// What a prepared attempt holds, handed to `Engine::hold`.
pub(super) struct Holding<S> {
    pub gtid: GlobalTxId,
    pub txid: TxId,
    pub sender: Sender,
    pub position: u64,
    pub payload: serde_json::Value,
    pub digest: Digest,
    pub staged: S,
    pub keys: Vec<String>,
    pub started_at_ms: u64,
    pub participants: Option<Vec<protocol::ParticipantName>>,
}

impl<R: Resource> Engine<R> {
    /// An attempt that passed every check takes its locks and becomes prepared; returns the
    /// record to force before it votes yes (fresh prepares and granted waiters alike).
    pub(super) fn hold(&mut self, holding: Holding<R::Staged>, now_ms: u64) -> Record {
        let Holding {
            gtid,
            txid,
            sender,
            position,
            payload,
            digest,
            staged,
            keys,
            started_at_ms,
            participants,
        } = holding;
        self.locks.take(&gtid, &keys);
        self.prepared.insert(
            gtid.clone(),
            PreparedTx {
                txid: txid.clone(),
                coordinator_id: sender.coordinator_id.clone(),
                epoch: sender.epoch,
                incarnation: sender.incarnation,
                position,
                payload: payload.clone(),
                digest,
                staged,
                keys,
                prepared_at_ms: now_ms,
                started_at_ms,
                participants: participants.clone(),
                next_ask_at_ms: now_ms.saturating_add(self.config.in_doubt_after_ms),
                asks: 0,
                asking: false,
                last_answer: None,
            },
        );
        Record::Prepared {
            gtid,
            txid,
            coordinator_id: sender.coordinator_id,
            epoch: sender.epoch,
            incarnation: sender.incarnation,
            position,
            payload,
            prepared_at_ms: now_ms,
            started_at_ms: Some(started_at_ms),
            participants,
        }
    }

    /// A prepare that votes no: a tombstone, so a duplicate prepare later gets the same no,
    /// and the `Refused` record that keeps it (forced when the prepare raised the epoch, so
    /// the raised epoch is durable before anyone hears an answer given under it). Returns the
    /// log command and the reason as told, cut to the protocol's bound.
    pub(super) fn refuse(
        &mut self,
        gtid: &GlobalTxId,
        sender: &Sender,
        digest: Digest,
        reason: String,
        forced: bool,
        now_ms: u64,
    ) -> (Command, String) {
        let reason = truncate(reason, REASON_LEN_MAX);
        self.tombstones.insert(
            gtid.clone(),
            Ended::Refused {
                reason: reason.clone(),
            },
            Some(digest),
            now_ms,
        );
        let log = Command::Log {
            record: Record::Refused {
                gtid: gtid.clone(),
                coordinator_id: sender.coordinator_id.clone(),
                epoch: sender.epoch,
                incarnation: sender.incarnation,
                reason: reason.clone(),
                at_ms: now_ms,
            },
            forced,
        };
        (log, reason)
    }
}

fn truncate(mut reason: String, max: usize) -> String {
    if reason.len() > max {
        let mut cut = max;
        while !reason.is_char_boundary(cut) {
            cut -= 1;
        }
        reason.truncate(cut);
    }
    reason
}
