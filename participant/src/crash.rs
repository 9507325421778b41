//! Named crash points (design section 6). Compiled in only with the `failpoints` feature; armed
//! with `FAILPOINTS=<name>=return`, the process aborts there (like a SIGKILL: no cleanup).

/// Prepare: validated and locked, the prepared record not yet submitted.
pub const BEFORE_PREPARED_DURABLE: &str = "participant::before_prepared_durable";
/// Prepare: the prepared record is durable, the yes vote not yet sent.
pub const AFTER_PREPARED_DURABLE: &str = "participant::after_prepared_durable";
/// Commit: the commit record is durable, the ack not yet sent.
pub const AFTER_COMMIT_LOGGED: &str = "participant::after_commit_logged";
/// Batch: one item's record (prepared, committed or aborted) is durable, its answer line not
/// yet sent; the batch's other items may be durable too, none of their lines sent.
pub const AFTER_BATCH_ITEM_DURABLE: &str = "participant::after_batch_item_durable";
/// Fenced write: its record (token, value, answer) is durable, the answer not yet sent.
pub const AFTER_FENCED_WRITE_LOGGED: &str = "participant::after_fenced_write_logged";
/// Outbox write: the write and its intents are durable in one record, the answer not yet sent.
pub const AFTER_OUTBOX_WRITE_LOGGED: &str = "participant::after_outbox_write_logged";
/// Outbox: a relay's delivered report is durable, the answer not yet sent.
pub const AFTER_INTENT_DELIVERED_LOGGED: &str = "participant::after_intent_delivered_logged";
/// Fence reset: the operator's reset is durable, the answer not yet sent.
pub const AFTER_FENCE_RESET_LOGGED: &str = "participant::after_fence_reset_logged";

/// Saga action: applied and its record durable, the answer not yet sent (issue 13).
pub const SAGA_AFTER_ACTION_APPLIED: &str = "participant::saga_after_action_applied";

pub(crate) fn crash_point(name: &'static str) {
    #[cfg(not(feature = "failpoints"))]
    let _ = name;
    fail::fail_point!(name, |_| std::process::abort());
}

/// Checkpoint: the snapshot cannot be encoded. A fault, not a crash: armed with
/// `FAILPOINTS=participant::checkpoint_unencodable=return`, every checkpoint fails alone and the
/// participant must keep serving (and recover everything from its longer log after a restart).
pub const CHECKPOINT_UNENCODABLE: &str = "participant::checkpoint_unencodable";

/// Whether the checkpoint fault point is armed.
pub(crate) fn checkpoint_unencodable() -> bool {
    fail::fail_point!(CHECKPOINT_UNENCODABLE, |_| true);
    false
}
