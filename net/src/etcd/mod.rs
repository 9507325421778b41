//! Talking to etcd through its v3 JSON gateway (HTTP/1.1 POSTs to `/v3/kv/*` and
//! `/v3/lease/*`, keys and values base64, int64 fields as JSON strings), with the reqwest
//! client every twopc process already has: no gRPC stack. Owns the wire shapes, the choice of
//! endpoint and when a call may be sent again; knows nothing about coordinators, elections or
//! transactions (the caller builds those from [`Etcd::txn`] and leases).
//!
//! # Endpoints and resending
//!
//! A call goes to the endpoint that answered last. When an endpoint cannot be reached, times
//! out, or answers 5xx, the call may move on to the next endpoint (each endpoint at most once
//! per call). Moving on is always safe when the request never left (a refused connection) and
//! for reads. For a write that may have been applied by the endpoint that failed (a timeout,
//! a lost connection or a 5xx after the request was sent) it is only safe when applying it
//! twice is the same as once, so (`retry.rs` decides):
//!
//! - `get`, `get_prefix`, `keep_alive` and `revoke` are sent again freely (a keep-alive
//!   refreshes the same TTL; a second revoke finds the lease gone, which counts as done).
//! - `grant` picks the lease ID itself, so a resent grant either creates that lease or is
//!   told it already exists, which after an uncertain first attempt means the first one did.
//! - A `txn` is sent again only when one of its compares is falsified by its own success
//!   branch (a `ModRevision` compare on a key it puts, `CreateRevision == 0` on a key it puts,
//!   a non-zero `ModRevision`/`CreateRevision` on a key it deletes): if the first attempt
//!   applied, the resent one fails its compare and changes nothing. The caller then sees
//!   `succeeded: false` with the failure reads, where a campaigner finds its own lease: it
//!   must check the holder it reads rather than trust `succeeded` alone.
//! - `put`, `delete` and any other txn never go to a second endpoint once the first may have
//!   applied them: the call fails with [`EtcdError::OutcomeUnknown`] or
//!   [`EtcdError::Timeout`], and the caller must read to learn what happened.
//!
//! Every answer passes the outbound policy of [`crate::outbound`]: redirects are errors,
//! answers are capped at [`ANSWER_BYTES_MAX`], connect and total time bounded per endpoint.

mod client;
mod error;
mod retry;
mod wire;

pub use client::{ANSWER_BYTES_MAX, Etcd};
pub use error::EtcdError;

/// An etcd lease, by the ID etcd knows it by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseId(pub i64);

/// One key as etcd stores it. A field etcd leaves out (the gateway omits defaults) is zero or
/// empty here: `lease == 0` is a key without a lease.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KeyValue {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    /// The revision that created the key (0: it does not exist).
    pub create_revision: i64,
    /// The revision of the key's last change.
    pub mod_revision: i64,
    /// The lease the key is attached to (0: none).
    pub lease: i64,
}

/// A condition of a [`Etcd::txn`]; all of them must hold for the success branch to run.
/// A key that does not exist has create and mod revision 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Compare {
    CreateRevision { key: Vec<u8>, equals: i64 },
    ModRevision { key: Vec<u8>, equals: i64 },
    Value { key: Vec<u8>, equals: Vec<u8> },
}

/// A write of a [`Etcd::txn`]'s success branch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnOp {
    Put {
        key: Vec<u8>,
        value: Vec<u8>,
        lease: Option<LeaseId>,
    },
    Delete {
        key: Vec<u8>,
    },
}

/// What a [`Etcd::txn`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnResult {
    /// Whether every compare held and the success branch ran.
    pub succeeded: bool,
    /// The store's revision after the transaction.
    pub revision: i64,
    /// When it failed: the keys asked for in `failure_reads`, in that order (`None`: absent).
    /// Empty when it succeeded.
    pub reads: Vec<Option<KeyValue>>,
}
