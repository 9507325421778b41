//! Leases with fencing tokens (docs/leases.md): a pure engine ([`LeaseEngine`]), its log
//! records and checkpoint state, and the thin shell that logs and answers.
//!
//! This module owns who holds which lease, until when, and the highest token ever given. It
//! must never answer a grant or renewal before its record is durable, never give a token twice
//! (tokens rise for ever, across expiry, release, restarts and crashes), never revive an
//! expired or superseded lease, and never re-grant a lease that may still be held after a
//! restart before its full TTL has passed since the restart. It does no I/O and reads no clock:
//! time comes in as event fields.

mod engine;
mod record;
mod shell;

#[cfg(test)]
mod tests;

pub use engine::{LeaseCommand, LeaseEngine, LeaseEvent, LeaseReply};
pub use record::{HeldLease, LeaseRecord, LeaseSnapshot};
pub use shell::{LeaseClock, Leases};
