//! The request digest that backs idempotency: the same id with the same body is a retry, the
//! same id with another body is a conflict.
//!
//! FNV-1a over 128 bits, written out here because it must stay byte-for-byte stable across
//! builds and Rust versions (digests are logged and compared after a restart), which std's
//! hashers do not promise. It is not a cryptographic hash: a client could only craft a collision
//! against its own transaction id, which harms nobody else.

use serde::{Deserialize, Serialize};

use protocol::ValidRequest;

/// A 128-bit digest of a transaction request, shown as 32 hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct Digest(pub u128);

const FNV_OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
const FNV_PRIME: u128 = 0x0000000001000000000000000000013B;

fn fnv1a(state: &mut u128, bytes: &[u8]) {
    for byte in bytes {
        *state ^= u128::from(*byte);
        *state = state.wrapping_mul(FNV_PRIME);
    }
}

impl Digest {
    /// Digest of everything a client chose in the request: the id, each participant's name and
    /// payload (compact JSON; `serde_json` keeps object keys sorted, so key order in the request
    /// does not matter), and the timeout as given. Fields are length-prefixed so that moving
    /// bytes from one field to the next changes the digest.
    pub fn of_request(request: &ValidRequest) -> Digest {
        let mut state = FNV_OFFSET;
        let mut field = |bytes: &[u8]| {
            fnv1a(&mut state, &(bytes.len() as u64).to_le_bytes());
            fnv1a(&mut state, bytes);
        };
        field(request.id.as_ref().map_or("", |id| id.as_str()).as_bytes());
        for (name, payload) in &request.participants {
            field(name.as_str().as_bytes());
            field(&serde_json::to_vec(payload).unwrap_or_default());
        }
        match request.timeout_ms {
            Some(timeout_ms) => field(&timeout_ms.to_le_bytes()),
            None => field(b"default"),
        }
        Digest(state)
    }
}

impl From<Digest> for String {
    fn from(digest: Digest) -> String {
        format!("{:032x}", digest.0)
    }
}

impl TryFrom<String> for Digest {
    type Error = String;
    fn try_from(value: String) -> Result<Self, String> {
        u128::from_str_radix(&value, 16)
            .map(Digest)
            .map_err(|e| format!("bad digest {value:?}: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::TransactionRequest;
    use serde_json::json;

    fn digest(value: serde_json::Value) -> Digest {
        let request: TransactionRequest = serde_json::from_value(value).unwrap();
        Digest::of_request(&request.validate().unwrap())
    }

    #[test]
    fn same_body_same_digest_regardless_of_key_order() {
        let a = digest(
            json!({"id": "t", "participants": [{"name": "a", "payload": {"x": 1, "y": 2}}]}),
        );
        let b = digest(
            json!({"participants": [{"payload": {"y": 2, "x": 1}, "name": "a"}], "id": "t"}),
        );
        assert_eq!(a, b);
    }

    #[test]
    fn any_change_changes_the_digest() {
        let base = json!({"id": "t", "participants": [{"name": "a", "payload": {"x": 1}}]});
        let variants = [
            json!({"id": "u", "participants": [{"name": "a", "payload": {"x": 1}}]}),
            json!({"id": "t", "participants": [{"name": "b", "payload": {"x": 1}}]}),
            json!({"id": "t", "participants": [{"name": "a", "payload": {"x": 2}}]}),
            json!({"id": "t", "participants": [{"name": "a", "payload": {"x": 1}}], "timeout_ms": 5}),
        ];
        for variant in variants {
            assert_ne!(digest(base.clone()), digest(variant.clone()), "{variant}");
        }
    }

    #[test]
    fn digest_is_stable_and_round_trips() {
        // Pinned: a change here breaks idempotency for transactions logged by older builds.
        let d = digest(json!({"id": "t", "participants": [{"name": "a", "payload": {}}]}));
        let text = String::from(d);
        assert_eq!(text, "d5a6860ec770f02a4cda41ed765c52de");
        assert_eq!(Digest::try_from(text).unwrap(), d);
        assert_eq!(
            String::from(Digest(0xab)),
            "000000000000000000000000000000ab"
        );
    }
}
