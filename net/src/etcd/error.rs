//! Everything that can go wrong talking to etcd, as values: whatever an endpoint sends (or
//! fails to send) ends here, never in a panic. Owns the error type and how much of a bad
//! answer it keeps; never decides whether to send a call again (that is `retry`'s).

use std::time::Duration;

/// How much of a refused or malformed answer an error keeps (etcd's errors are one line).
const BODY_KEPT_BYTES: usize = 512;

/// Why an etcd call failed.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// The endpoints given to [`super::Etcd::new`] are unusable (none, not http(s), ...).
    #[error("etcd endpoints: {what}")]
    Config { what: String },
    /// No endpoint gave an answer (each was tried once): refused connections, timeouts or
    /// 5xx answers of calls that may be sent again.
    #[error("no etcd endpoint answered (tried {}): {last}", .tried.join(", "))]
    Unreachable { tried: Vec<String>, last: String },
    /// A write that may not be sent twice timed out after it was sent: it may or may not have
    /// been applied. Read to find out.
    #[error("etcd at {endpoint} did not answer within {after:?}; the write may have been applied")]
    Timeout { endpoint: String, after: Duration },
    /// A write that may not be sent twice failed after it was sent (connection lost, 5xx):
    /// it may or may not have been applied. Read to find out.
    #[error("etcd at {endpoint}: {cause}; the write may have been applied")]
    OutcomeUnknown { endpoint: String, cause: String },
    /// etcd refused the request (4xx); it was not applied.
    #[error("etcd at {endpoint} refused the request ({status}): {body}")]
    Refused {
        endpoint: String,
        status: u16,
        body: String,
    },
    /// The lease named in the request does not exist (any more): it expired or was revoked.
    #[error("etcd lease {lease:#x} not found (expired or revoked)")]
    LeaseNotFound { lease: i64 },
    /// A 2xx answer that is not what the gateway sends.
    #[error("etcd at {endpoint} sent a malformed answer: {what}")]
    Malformed { endpoint: String, what: String },
    /// A redirect, or an answer over the size cap.
    #[error("etcd at {endpoint}: {source}")]
    Answer {
        endpoint: String,
        #[source]
        source: crate::outbound::AnswerError,
    },
}

impl EtcdError {
    /// Whether a write that failed with this error may nevertheless have been applied.
    pub fn may_have_applied(&self) -> bool {
        matches!(
            self,
            EtcdError::Unreachable { .. }
                | EtcdError::Timeout { .. }
                | EtcdError::OutcomeUnknown { .. }
                | EtcdError::Malformed { .. }
                | EtcdError::Answer { .. }
        )
    }
}

/// At most [`BODY_KEPT_BYTES`] of an answer, as text.
pub(super) fn body_text(body: &[u8]) -> String {
    let kept = &body[..body.len().min(BODY_KEPT_BYTES)];
    let mut text = String::from_utf8_lossy(kept).trim().to_string();
    if body.len() > BODY_KEPT_BYTES {
        text.push_str(" (cut)");
    }
    text
}
