//! Batched phase messages (issue 28): one HTTP request from the coordinator to a participant
//! carries the prepares of many attempts (`POST /2pc/batch/prepare`), or their decisions
//! (`POST /2pc/batch/decide`), and the answers come back one line per attempt as each becomes
//! ready (`application/x-ndjson`), so an attempt that waits for a lock holds back no other.
//!
//! Every item means exactly what the same message sent alone means, and its answer line carries
//! exactly the status and body the per-message route would have answered: a batch is a way to
//! carry messages, never a unit of meaning. Nothing is all-or-nothing; an item whose line never
//! arrives counts as a message that got no answer (a prepare times out, a decision is retried).
//!
//! A participant offers batching by answering `GET /2pc/capabilities` with a `batch` member;
//! one that does not (404, or no member) gets the per-message protocol, unchanged.

use serde::{Deserialize, Serialize};

use crate::ids::GlobalTxId;
use crate::messages::{Decision, DecisionRequest, PrepareRequest};

/// Media type of a batch's answer: one JSON object ([`BatchAnswer`]) per line.
pub const NDJSON: &str = "application/x-ndjson";

/// `GET {base}/2pc/capabilities`: what this participant offers beyond the per-message protocol.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    /// Present when the batch routes are served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<BatchCapability>,
}

/// The batch routes' terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchCapability {
    /// Most items the participant takes in one batch (at most
    /// [`crate::limits::BATCH_ITEMS_MAX`]); a sender splits larger batches.
    pub max_items: usize,
}

/// `POST {base}/2pc/batch/prepare`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrepareBatch {
    pub prepares: Vec<PrepareRequest>,
}

/// `POST {base}/2pc/batch/decide`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecisionBatch {
    pub decisions: Vec<BatchedDecision>,
}

/// One decision of a [`DecisionBatch`]: what `POST /2pc/commit` or `/2pc/abort` would carry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchedDecision {
    pub decision: Decision,
    pub request: DecisionRequest,
}

/// One line of a batch's answer: the answer to the item at `index` (its position in the
/// request), naming its attempt so a sender can check the pairing. Lines come in the order the
/// answers became ready, not the order of the items.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchAnswer {
    pub index: usize,
    pub gtid: GlobalTxId,
    /// The HTTP status the per-message route would have answered.
    pub status: u16,
    /// The body it would have answered (a vote, an ack, or an error body).
    pub body: serde_json::Value,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_participant_without_batching_says_nothing_of_it() {
        assert_eq!(
            serde_json::to_string(&Capabilities::default()).unwrap(),
            "{}"
        );
        let parsed: Capabilities = serde_json::from_str("{}").unwrap();
        assert_eq!(parsed.batch, None);
        // Members added later must not break an older sender.
        let newer: Capabilities =
            serde_json::from_str(r#"{"batch":{"max_items":8},"streams":true}"#).unwrap();
        assert_eq!(newer.batch, Some(BatchCapability { max_items: 8 }));
    }

    #[test]
    fn an_answer_line_round_trips() {
        let line = BatchAnswer {
            index: 3,
            gtid: GlobalTxId::new("c1:0000000000000001:7").unwrap(),
            status: 200,
            body: serde_json::json!({"vote": "yes"}),
        };
        let text = serde_json::to_string(&line).unwrap();
        assert!(!text.contains('\n'), "one answer is one line");
        assert_eq!(serde_json::from_str::<BatchAnswer>(&text).unwrap(), line);
    }
}
