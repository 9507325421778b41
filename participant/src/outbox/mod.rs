//! The outbox (docs/participants.md, "The outbox"; issue 29): a write's next durable intents,
//! stored with the write in one forced record, and what relays and operators report about them.
//!
//! - here: a [`Write`] (a state change under an op id, optionally fenced, with its `next`
//!   intents), its checks and its digest, and the changes a report or an operator makes to one
//!   intent ([`IntentChange`], logged as they are);
//! - [`table`]: the intents by write order, per-aggregate sequence numbers, states, retention.
//!
//! It never decides whether an intent was delivered: it records what relays (evidence) and
//! operators (audited) say, refuses claims that break an aggregate's order, never drops a
//! pending or failed intent, and never hands out a sequence number twice for one aggregate.

pub mod table;

use std::collections::BTreeSet;

use protocol::digest::Digest;
use protocol::lease::{FenceClaim, OP_ID_LEN_MAX};
use protocol::limits::PAYLOAD_BYTES_MAX;
use protocol::outbox::{
    INTENT_ERROR_LEN_MAX, INTENTS_PER_WRITE_MAX, Intent, IntentMark, IntentState,
};
use serde::{Deserialize, Serialize};

pub use table::{Outbox, OutboxRetention, StateFilter};

/// A write outside 2PC: ops applied at once under an op id (a repeat answers the first
/// answer), guarded by a fence when it carries one, recording its `next` intents with it.
#[derive(Debug, Clone, PartialEq)]
pub struct Write {
    pub op_id: String,
    /// `None`: only op-id idempotency applies (no token check).
    pub fence: Option<FenceClaim>,
    /// A payload for the resource.
    pub payload: serde_json::Value,
    /// Intents recorded with the write, in this order (per aggregate: seq order).
    pub next: Vec<Intent>,
}

impl From<crate::fence::FencedWrite> for Write {
    fn from(write: crate::fence::FencedWrite) -> Self {
        Write {
            op_id: write.op_id,
            fence: Some(write.fence),
            payload: write.payload,
            next: Vec::new(),
        }
    }
}

/// Why a write's intents cannot be recorded (422 with the problem named).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IntentProblem {
    #[error("{0}")]
    Id(String),
    #[error("{0}")]
    Shape(String),
}

impl Write {
    /// Checks the op id, the fence's names and the intents' ids (answered as 422 `invalid_id`).
    pub fn check_ids(&self) -> Result<(), protocol::IdError> {
        protocol::ids::check_id("op_id", &self.op_id, OP_ID_LEN_MAX)?;
        if let Some(fence) = &self.fence {
            crate::fence::check_claim_ids(fence)?;
        }
        self.next.iter().try_for_each(Intent::check_ids)
    }

    /// Checks the intents: ids, how many, distinct event ids, body sizes.
    pub fn check_intents(&self) -> Result<(), IntentProblem> {
        for (i, intent) in self.next.iter().enumerate() {
            intent
                .check_ids()
                .map_err(|e| IntentProblem::Id(format!("next[{i}]: {e}")))?;
        }
        if self.next.len() > INTENTS_PER_WRITE_MAX {
            return Err(IntentProblem::Shape(format!(
                "{} intents in \"next\"; the limit is {INTENTS_PER_WRITE_MAX}",
                self.next.len()
            )));
        }
        let mut seen = BTreeSet::new();
        for intent in &self.next {
            if !seen.insert(intent.event_id.as_str()) {
                return Err(IntentProblem::Shape(format!(
                    "event_id {:?} is given twice in \"next\"",
                    intent.event_id
                )));
            }
        }
        let bytes: usize = self
            .next
            .iter()
            .map(|i| serde_json::to_vec(&i.body).map_or(0, |b| b.len()))
            .sum();
        if bytes > PAYLOAD_BYTES_MAX {
            return Err(IntentProblem::Shape(format!(
                "the intents' bodies are {bytes} bytes together; the limit is \
                 {PAYLOAD_BYTES_MAX}"
            )));
        }
        Ok(())
    }

    /// What the write is, for telling a retry of it from another write under its op id. A
    /// fenced write without intents digests as it always did (answers kept in older logs and
    /// checkpoints still match their retries).
    pub fn digest(&self) -> Digest {
        write_digest(self.fence.as_ref(), &self.payload, &self.next)
    }
}

/// The digest of a write: its fence (resource and token), payload and intents.
pub fn write_digest(
    fence: Option<&FenceClaim>,
    payload: &serde_json::Value,
    next: &[Intent],
) -> Digest {
    match fence {
        Some(fence) if next.is_empty() => {
            crate::fence::written_digest(&fence.resource, fence.token, payload)
        }
        _ => Digest::of_payload(&serde_json::json!({
            "resource": fence.map(|f| f.resource.as_str()),
            "token": fence.map(|f| f.token),
            "payload": payload,
            "next": next,
        })),
    }
}

/// An intent as its write's record holds it: the intent and the seq it got.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedIntent {
    pub event_id: String,
    pub aggregate: String,
    pub seq: u64,
    pub target: String,
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub body: serde_json::Value,
}

impl RecordedIntent {
    /// The intent as the write declared it.
    pub fn intent(&self) -> Intent {
        Intent {
            event_id: self.event_id.clone(),
            aggregate: self.aggregate.clone(),
            target: self.target.clone(),
            kind: self.kind.clone(),
            body: self.body.clone(),
        }
    }
}

/// What a relay or an operator asks of one intent.
#[derive(Debug, Clone, PartialEq)]
pub enum IntentRequest {
    /// The receiver answered for this event id.
    Delivered { answer: serde_json::Value },
    /// An attempt without a delivery; `permanent`: the receiver refused it for good.
    Attempt { error: String, permanent: bool },
    /// An operator puts a failed intent back to pending.
    Retry { operator: String, reason: String },
    /// An operator settles a pending or failed intent (`delivered` or `abandoned`).
    Mark {
        state: Option<IntentState>,
        operator: String,
        reason: String,
    },
}

/// A change to one intent, as logged (forced before its answer) and replayed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "change", rename_all = "snake_case")]
pub enum IntentChange {
    Delivered {
        #[serde(default)]
        answer: serde_json::Value,
    },
    Attempt {
        error: String,
        #[serde(default)]
        permanent: bool,
    },
    /// An operator's retry (`to: pending`) or mark (`delivered`, `abandoned`).
    Operator { to: IntentState, mark: IntentMark },
}

/// `error` cut to [`INTENT_ERROR_LEN_MAX`] bytes at a char boundary.
pub fn cut_error(error: &str) -> String {
    if error.len() <= INTENT_ERROR_LEN_MAX {
        return error.to_string();
    }
    let mut end = INTENT_ERROR_LEN_MAX;
    while !error.is_char_boundary(end) {
        end -= 1;
    }
    error[..end].to_string()
}

/// The snake-case name of a state (what a mark's `action` says).
pub fn state_name(state: IntentState) -> &'static str {
    match state {
        IntentState::Pending => "pending",
        IntentState::Delivered => "delivered",
        IntentState::Failed => "failed",
        IntentState::Abandoned => "abandoned",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn intent(event_id: &str) -> Intent {
        Intent {
            event_id: event_id.into(),
            aggregate: "checkout:c-1".into(),
            target: "payments".into(),
            kind: "payment.authorize.v1".into(),
            body: json!({"amount": 5}),
        }
    }

    fn write(next: Vec<Intent>) -> Write {
        Write {
            op_id: "op-1".into(),
            fence: None,
            payload: json!({"ops": []}),
            next,
        }
    }

    #[test]
    fn intents_are_checked_for_ids_count_duplicates_and_size() {
        assert!(
            write(vec![intent("e-1"), intent("e-2")])
                .check_intents()
                .is_ok()
        );
        let mut bad = intent("e 1");
        assert!(matches!(
            write(vec![bad.clone()]).check_intents(),
            Err(IntentProblem::Id(_))
        ));
        bad.event_id = "e-1".into();
        assert!(matches!(
            write(vec![intent("e-1"), bad]).check_intents(),
            Err(IntentProblem::Shape(m)) if m.contains("twice")
        ));
        let many = (0..=INTENTS_PER_WRITE_MAX)
            .map(|i| intent(&format!("e-{i}")))
            .collect();
        assert!(write(many).check_intents().is_err());
        let mut big = intent("e-1");
        big.body = json!("x".repeat(PAYLOAD_BYTES_MAX));
        assert!(write(vec![big]).check_intents().is_err());
    }

    #[test]
    fn a_fenced_write_without_intents_keeps_its_old_digest_and_intents_change_it() {
        let fenced = crate::fence::FencedWrite {
            op_id: "op-1".into(),
            fence: FenceClaim::unproven("r", 3),
            payload: json!({"ops": []}),
        };
        let old = fenced.digest();
        let mut new: Write = fenced.into();
        assert_eq!(new.digest(), old);
        new.next.push(intent("e-1"));
        assert_ne!(new.digest(), old);
        let unfenced = write(vec![intent("e-1")]);
        assert_ne!(unfenced.digest(), new.digest());
    }

    #[test]
    fn errors_are_cut_at_a_char_boundary() {
        let long = "é".repeat(INTENT_ERROR_LEN_MAX);
        let cut = cut_error(&long);
        assert!(cut.len() <= INTENT_ERROR_LEN_MAX && cut.len() >= INTENT_ERROR_LEN_MAX - 1);
        assert_eq!(cut_error("short"), "short");
    }
}
