//! When a call may be sent to another endpoint after one that may have applied it failed (see
//! the module doc of `etcd`). Owns only that decision; never sends anything.

use super::{Compare, TxnOp};

/// Whether a call may go to the next endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Resend {
    /// After any failure: a read, or a write that is the same applied twice.
    Always,
    /// Only when the request certainly did not leave (the connection was refused).
    OnlyUnsent,
}

/// A txn may be sent again when applying it once falsifies one of its own compares, so that a
/// second copy after an applied first one fails its compare and writes nothing:
///
/// - `ModRevision{k, r}` with a put of `k`: the put gives `k` a new, higher mod revision.
/// - `ModRevision{k, r > 0}` or `CreateRevision{k, c > 0}` with a delete of `k`: `k` is gone
///   (revision 0), or re-created later with a higher revision.
/// - `CreateRevision{k, 0}` with a put of `k`: `k` exists afterwards. A resent copy applies
///   only when `k` was deleted again in between, which is the same as a new attempt made then.
///
/// A txn without writes is a read, sent again freely. A `Value` compare fences nothing (the value may come back), nor does a compare on a key the
/// success branch does not write.
pub(super) fn txn_resend(compares: &[Compare], success: &[TxnOp]) -> Resend {
    let fenced = success.is_empty()
        || compares.iter().any(|compare| {
            success.iter().any(|op| match (compare, op) {
                (Compare::ModRevision { key, .. }, TxnOp::Put { key: put, .. }) => key == put,
                (Compare::CreateRevision { key, equals: 0 }, TxnOp::Put { key: put, .. }) => {
                    key == put
                }
                (Compare::ModRevision { key, equals }, TxnOp::Delete { key: deleted })
                | (Compare::CreateRevision { key, equals }, TxnOp::Delete { key: deleted }) => {
                    *equals > 0 && key == deleted
                }
                _ => false,
            })
        });
    if fenced {
        Resend::Always
    } else {
        Resend::OnlyUnsent
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcd::LeaseId;

    fn put(key: &[u8]) -> TxnOp {
        TxnOp::Put {
            key: key.to_vec(),
            value: b"v".to_vec(),
            lease: Some(LeaseId(1)),
        }
    }

    fn delete(key: &[u8]) -> TxnOp {
        TxnOp::Delete { key: key.to_vec() }
    }

    fn create(key: &[u8], equals: i64) -> Compare {
        Compare::CreateRevision {
            key: key.to_vec(),
            equals,
        }
    }

    fn modified(key: &[u8], equals: i64) -> Compare {
        Compare::ModRevision {
            key: key.to_vec(),
            equals,
        }
    }

    #[test]
    fn a_campaign_and_a_compare_and_swap_fence_themselves() {
        assert_eq!(txn_resend(&[create(b"k", 0)], &[put(b"k")]), Resend::Always);
        assert_eq!(
            txn_resend(&[modified(b"k", 7)], &[put(b"k")]),
            Resend::Always
        );
        assert_eq!(
            txn_resend(&[modified(b"k", 0)], &[put(b"k")]),
            Resend::Always
        );
        assert_eq!(
            txn_resend(&[modified(b"k", 7)], &[delete(b"k")]),
            Resend::Always
        );
        assert_eq!(
            txn_resend(&[create(b"k", 7)], &[delete(b"k")]),
            Resend::Always
        );
        assert_eq!(txn_resend(&[create(b"k", 0)], &[]), Resend::Always);
        let value = Compare::Value {
            key: b"j".to_vec(),
            equals: b"x".to_vec(),
        };
        assert_eq!(
            txn_resend(&[value, create(b"k", 0)], &[put(b"j"), put(b"k")]),
            Resend::Always
        );
    }

    #[test]
    fn a_txn_whose_compares_survive_its_writes_is_not_sent_twice() {
        assert_eq!(txn_resend(&[], &[put(b"k")]), Resend::OnlyUnsent);
        // Put keeps the create revision: a second copy would apply again.
        assert_eq!(
            txn_resend(&[create(b"k", 7)], &[put(b"k")]),
            Resend::OnlyUnsent
        );
        // Deleting an absent key leaves it absent.
        assert_eq!(
            txn_resend(&[create(b"k", 0)], &[delete(b"k")]),
            Resend::OnlyUnsent
        );
        assert_eq!(
            txn_resend(&[modified(b"k", 0)], &[delete(b"k")]),
            Resend::OnlyUnsent
        );
        // A compare on another key than the ones written.
        assert_eq!(
            txn_resend(&[modified(b"j", 7)], &[put(b"k")]),
            Resend::OnlyUnsent
        );
        let value = Compare::Value {
            key: b"k".to_vec(),
            equals: b"x".to_vec(),
        };
        assert_eq!(txn_resend(&[value], &[put(b"k")]), Resend::OnlyUnsent);
    }
}
