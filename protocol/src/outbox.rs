//! The outbox (docs/workflows.md): a participant write that carries its next durable intents,
//! stored with the write in one local transaction, and what a relay reads and reports while it
//! delivers them at least once.
//!
//! An intent names its `target` by name, never by URL: a participant never calls, and never
//! hands anyone, a URL that a request gave it. The relay maps target names to endpoints from its
//! own configuration. The `event_id` is the intent's idempotency key everywhere: the receiver
//! deduplicates by it, and a delivery whose outcome is unknown is repeated under it, never under
//! a fresh one.

use serde::{Deserialize, Serialize};

use crate::ids::{IdError, check_id};
use crate::kv::KvOp;
use crate::lease::FenceClaim;

/// Longest `event_id`, `aggregate`, `target` and intent `type`, in bytes (they go into URL
/// paths, queries, log lines and headers).
pub const OUTBOX_ID_LEN_MAX: usize = 128;
/// Most intents one write may carry.
pub const INTENTS_PER_WRITE_MAX: usize = 16;
/// Longest error an attempt report keeps, in bytes (a longer one is cut at a char boundary).
pub const INTENT_ERROR_LEN_MAX: usize = 1024;
/// Most entries one `GET /v1/outbox` answers; `limit` defaults to it.
pub const OUTBOX_LIST_LIMIT_MAX: usize = 1000;
/// The header a delivery carries its `event_id` in, for receivers that deduplicate by header.
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";

/// A next intent as a write declares it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Intent {
    /// Stable and unique per participant: the idempotency key of every delivery.
    pub event_id: String,
    /// What the intent is about (`checkout:c-17`); intents of one aggregate are delivered in
    /// the order they were written.
    pub aggregate: String,
    /// A target name the relay is configured with (`payments`, or one that submits to the
    /// coordinator).
    pub target: String,
    /// What the receiver is asked to do (`payment.authorize.v1`).
    #[serde(rename = "type")]
    pub kind: String,
    /// Handed to the receiver unchanged.
    #[serde(default)]
    pub body: serde_json::Value,
}

impl Intent {
    /// Checks the ids (answered as 422 `invalid_id`).
    pub fn check_ids(&self) -> Result<(), IdError> {
        check_id("event_id", &self.event_id, OUTBOX_ID_LEN_MAX)?;
        check_id("aggregate", &self.aggregate, OUTBOX_ID_LEN_MAX)?;
        check_id("target", &self.target, OUTBOX_ID_LEN_MAX)?;
        check_id("intent type", &self.kind, OUTBOX_ID_LEN_MAX)
    }
}

/// `POST /v1/kv` at the reference participant: ops applied together (a `check` op that fails
/// writes nothing and records no intent: 409 `condition_failed`), under an op id, optionally
/// fenced, with the intents they lead to. A repeat of the op id answers the first answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WriteRequest {
    pub op_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<FenceClaim>,
    pub ops: Vec<KvOp>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub next: Vec<Intent>,
}

/// `POST /v1/pg/write` at a PostgreSQL participant: one named statement of its statements file,
/// run with `params` in a local transaction (outside 2PC) together with the intents it leads
/// to, under an op id. A statement that declares `guards_intent` and affects (or returns)
/// another number of rows rolls back: nothing written, no intent, 409 `condition_failed`. A
/// repeat of the op id answers the first answer. With a `fence`, the write is refused (409
/// `stale_token`, nothing written) when a higher token was accepted for the fence's resource,
/// and raises the resource's highest token in the same local transaction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PgWriteRequest {
    pub op_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<FenceClaim>,
    pub statement: String,
    #[serde(default)]
    pub params: Vec<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub next: Vec<Intent>,
}

/// 200 to a PostgreSQL write (and, unchanged, to every repeat of its `op_id`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PgWriteResponse {
    pub op_id: String,
    /// Rows the statement affected (or returned).
    pub rows: u64,
    /// The rows a `RETURNING` (or `SELECT`) statement returned, each an object by column name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub returned: Vec<serde_json::Value>,
    pub intents: Vec<IntentRef>,
}

/// A written key's new version (absent for a deleted key).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WrittenKey {
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u64>,
}

/// Where a recorded intent stands in its aggregate's order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IntentRef {
    pub event_id: String,
    pub aggregate: String,
    /// 1, 2, 3, ... per aggregate, in write order.
    pub seq: u64,
}

/// 200 to a write (and, unchanged, to every repeat of its `op_id`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteResponse {
    pub op_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    pub written: Vec<WrittenKey>,
    pub intents: Vec<IntentRef>,
}

/// Where an intent stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IntentState {
    /// Written, not yet known delivered; the relay keeps trying (attempts may have failed in
    /// ways that leave the outcome unknown: the next attempt asks again under the same id).
    Pending,
    /// The receiver answered for this `event_id` (or an operator marked it so).
    Delivered,
    /// The receiver refused it for good (a 4xx other than 408/429); it holds back the later
    /// intents of its aggregate until an operator retries or marks it.
    Failed,
    /// An operator settled it outside twopc; it stays listed, marked, and is never sent again.
    Abandoned,
}

/// An operator's hand on an intent, as recorded (forced, before the answer).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IntentMark {
    pub operator: String,
    pub reason: String,
    /// `retry`, `delivered` or `abandoned`.
    pub action: String,
    pub at_ms: u64,
}

/// One intent in the outbox, as `GET /v1/outbox` lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutboxEntry {
    pub event_id: String,
    pub aggregate: String,
    pub seq: u64,
    pub target: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub body: serde_json::Value,
    pub state: IntentState,
    /// The op id of the write that recorded it.
    pub op_id: String,
    pub created_at_ms: u64,
    /// Attempts reported by relays (delivered or not).
    pub attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_attempt_at_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivered_at_ms: Option<u64>,
    /// The receiver's answer for this `event_id`, as the relay reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<serde_json::Value>,
    /// Every operator action on it, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub marks: Vec<IntentMark>,
    /// Present in reads: milliseconds since it was written (the participant's clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub age_ms: Option<u64>,
}

/// `GET /v1/outbox?state=pending|failed|delivered|abandoned|open|heads&aggregate=&limit=`:
/// entries in write order (`open` = pending and failed; `heads` = the first open intent of each
/// aggregate: what a relay reads, so that one aggregate's blocked backlog never hides the others
/// behind the limit), with the counts and the age of the oldest pending intent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutboxList {
    pub intents: Vec<OutboxEntry>,
    pub pending: u64,
    pub failed: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_pending_age_ms: Option<u64>,
    /// True when `limit` cut the list.
    pub truncated: bool,
}

/// `POST /v1/outbox/{event_id}/delivered` (a relay): the receiver answered for this id.
/// Forced before the answer; a repeat answers the entry as it stands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeliveredReport {
    /// The receiver's answer (its body, or what the coordinator answered for the id).
    #[serde(default)]
    pub answer: serde_json::Value,
}

/// `POST /v1/outbox/{event_id}/attempt` (a relay): an attempt without a delivery. `permanent`
/// moves the intent to `failed`; otherwise it stays `pending` (outcome unknown or transient).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttemptReport {
    pub error: String,
    #[serde(default)]
    pub permanent: bool,
}

/// `POST /v1/outbox/{event_id}/retry` and `.../mark` (operators). `state` is for `mark` only:
/// `delivered` (the receiver has it, by evidence outside twopc) or `abandoned`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IntentActionRequest {
    pub operator: String,
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<IntentState>,
}

/// What a relay sends to an HTTP target (with the `Idempotency-Key` header). A receiver
/// answers 2xx with its answer for this `event_id`, the same for every repeat.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Delivery {
    pub event_id: String,
    pub aggregate: String,
    pub seq: u64,
    #[serde(rename = "type")]
    pub kind: String,
    pub body: serde_json::Value,
    /// The participant whose outbox held it.
    pub source: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_write_with_intents_round_trips_and_unknown_fields_are_refused() {
        let request: WriteRequest = serde_json::from_value(json!({
            "op_id": "op-1",
            "fence": {"resource": "checkout:c-1", "token": 7},
            "ops": [{"op": "check", "key": "checkout:c-1", "version": 3},
                    {"op": "put", "key": "checkout:c-1", "value": {"state": "stock_reserved"}}],
            "next": [{"event_id": "evt-1", "aggregate": "checkout:c-1", "target": "payments",
                      "type": "payment.authorize.v1", "body": {"amount": 5}}]
        }))
        .unwrap();
        assert_eq!(request.next[0].kind, "payment.authorize.v1");
        assert!(request.next[0].check_ids().is_ok());
        let back = serde_json::to_value(&request).unwrap();
        assert_eq!(back["next"][0]["type"], "payment.authorize.v1");
        assert!(
            serde_json::from_value::<WriteRequest>(json!({"op_id": "o", "ops": [], "extra": 1}))
                .is_err()
        );
    }

    #[test]
    fn intent_ids_follow_the_id_rules() {
        let mut intent = Intent {
            event_id: "evt-1".into(),
            aggregate: "checkout:c-1".into(),
            target: "payments".into(),
            kind: "payment.authorize.v1".into(),
            body: json!(null),
        };
        assert!(intent.check_ids().is_ok());
        intent.target = "http://evil.example/".into();
        assert!(
            intent.check_ids().is_err(),
            "a target is a name, never a URL"
        );
        intent.target = "payments".into();
        intent.event_id = "x".repeat(OUTBOX_ID_LEN_MAX + 1);
        assert!(intent.check_ids().is_err());
    }

    #[test]
    fn states_are_snake_case_on_the_wire() {
        assert_eq!(
            serde_json::to_value(IntentState::Abandoned).unwrap(),
            json!("abandoned")
        );
    }
}
