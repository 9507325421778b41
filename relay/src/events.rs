//! The planner's vocabulary: the events the shell hands it and the commands it answers with
//! (`plan` holds the rules).

use protocol::outbox::{OutboxEntry, OutboxList};
use serde_json::Value;

/// What happened, as the shell saw it.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Time passed (a timer the planner set fired, or any other wake-up).
    Tick,
    /// A listing of a participant's open intents, asked for with `List { generation }`.
    Listed {
        participant: String,
        generation: u64,
        list: OutboxList,
    },
    /// A listing could not be had.
    ListFailed {
        participant: String,
        generation: u64,
    },
    /// The receiver answered for this `event_id`.
    Delivered {
        participant: String,
        event_id: String,
        answer: Value,
    },
    /// No answer known: a timeout, a connection error, a 408/429/5xx. The receiver may have it.
    /// `jitter_permille` (0..=1000) spreads the backoff; the shell draws it.
    Unknown {
        participant: String,
        event_id: String,
        error: String,
        jitter_permille: u16,
    },
    /// The receiver refused it for good (a 4xx other than 408/429, an id conflict).
    Refused {
        participant: String,
        event_id: String,
        error: String,
    },
    /// The participant's answer to a report.
    Reported {
        participant: String,
        event_id: String,
        report: Report,
        result: ReportResult,
        jitter_permille: u16,
    },
}

/// Which report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Report {
    Delivered,
    Attempt,
    Permanent,
}

/// How a participant took a report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReportResult {
    /// 2xx: recorded (or, for a repeat, answered as it stands).
    Accepted,
    /// 409 or 404: the participant disagrees with what the relay believes; list again.
    Refused,
    /// No answer, or one that says nothing (5xx, timeout): send it again.
    Failed,
}

/// What the shell must do.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// One attempt at the entry as listed (boxed: it is by far the largest command).
    Deliver {
        participant: String,
        entry: Box<OutboxEntry>,
    },
    ReportDelivered {
        participant: String,
        event_id: String,
        answer: Value,
    },
    ReportAttempt {
        participant: String,
        event_id: String,
        error: String,
        permanent: bool,
    },
    /// `GET /v1/outbox?state=heads` (each aggregate's first open intent); answer with `Listed` or `ListFailed` of this generation.
    List {
        participant: String,
        generation: u64,
    },
    /// Send a `Tick` at this time (replaces any earlier timer).
    SetTimer { at_ms: u64 },
}
