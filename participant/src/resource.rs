//! The `Resource` trait: what a service implements to become a participant.
//!
//! A resource is a deterministic in-memory state machine. It never does I/O and never decides
//! anything about the protocol: the library calls it to parse a payload, to learn which keys a
//! transaction locks, to check whether the transaction could commit against the committed state,
//! and to apply a committed transaction. Durability, locks, duplicates, epochs and recovery are
//! the library's job.

use std::fmt;

/// Why a payload cannot be understood at all (answered as 422 `invalid_payload`, not as a vote).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidPayload(pub String);

impl InvalidPayload {
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

impl fmt::Display for InvalidPayload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why a write outside 2PC cannot apply against the committed state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckFailed {
    /// A condition the write states (a `check` op: a version it expects) does not hold:
    /// 409 `condition_failed`, nothing written, no intent recorded.
    Condition(String),
    /// Anything else `check` refuses (422 `invalid_payload`).
    Other(String),
}

/// A service's state, driven by the participant library.
///
/// Every method must be deterministic: recovery replays the log through `parse` and `apply`
/// and must arrive at the state the service had before it stopped.
pub trait Resource: Send + 'static {
    /// A parsed payload, kept while the transaction is prepared.
    type Staged: Send + 'static;

    /// Decodes a payload and checks its shape (no state involved). An error is answered with
    /// 422 `invalid_payload` and leaves everything unchanged.
    fn parse(&self, payload: &serde_json::Value) -> Result<Self::Staged, InvalidPayload>;

    /// The keys this transaction locks from prepare until its decision. Another transaction
    /// that needs one of them while it is held votes no at once.
    fn lock_keys(&self, staged: &Self::Staged) -> Vec<String>;

    /// Could this transaction commit against the committed state? `Err(reason)` is a no vote.
    /// Called only when every key in `lock_keys` is free, so nothing can change the answer
    /// between this check and `apply`.
    fn check(&self, staged: &Self::Staged) -> Result<(), String>;

    /// Applies a committed transaction. Must not fail: `check` said yes and the keys have been
    /// locked since.
    fn apply(&mut self, staged: Self::Staged);

    /// Called when a prepared transaction aborts. Staging does not touch the state, so the
    /// default does nothing.
    fn release(&mut self, _staged: Self::Staged) {}

    /// Roughly how many entries a snapshot holds (0 if unknown). Checkpoints are taken no more
    /// often than every this many log records, so their cost per record stays constant.
    fn entries(&self) -> usize {
        0
    }

    /// What a fenced write ([`crate::Participant::fenced_write`]) answers about the `keys` it
    /// wrote, read just after applying it; kept with its op id, so a repeat answers the same.
    fn receipt(&self, _keys: &[String]) -> serde_json::Value {
        serde_json::Value::Null
    }

    /// [`Resource::check`] for a write outside 2PC ([`crate::Participant::write`]), telling a
    /// failed condition from other refusals. The default calls it `Other`.
    fn check_write(&self, staged: &Self::Staged) -> Result<(), CheckFailed> {
        self.check(staged).map_err(CheckFailed::Other)
    }

    /// The keys a write changes (its receipt names them); the default: its lock keys.
    fn written_keys(&self, staged: &Self::Staged) -> Vec<String> {
        self.lock_keys(staged)
    }

    /// What [`crate::Participant::write`] answers about the `keys` it changed, read just after
    /// applying it and kept with its op id; the default: [`Resource::receipt`].
    fn write_receipt(&self, keys: &[String]) -> serde_json::Value {
        self.receipt(keys)
    }

    /// The committed state, for checkpoints.
    fn snapshot(&self) -> serde_json::Value;

    /// The committed state as JSON text, for checkpoints: what [`Resource::snapshot`] gives,
    /// encoded. It is taken under the participant's lock, so a store that can encode itself
    /// straight to text should: building a `Value` of a whole large store (an allocation per
    /// entry, then freed) held every request up and cost more than the encoding itself. The
    /// default encodes `snapshot()`.
    fn snapshot_json(&self) -> Result<Box<serde_json::value::RawValue>, serde_json::Error> {
        serde_json::value::to_raw_value(&self.snapshot())
    }

    /// Rebuilds the committed state from `snapshot`.
    fn restore(snapshot: serde_json::Value) -> Result<Self, String>
    where
        Self: Sized;
}
