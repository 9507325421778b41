//! Digests that are logged and compared after a restart: the coordinator's request digest (the
//! same id with the same body is a retry, with another body a conflict) and a participant's
//! payload digest (a prepare for a remembered attempt with another payload votes no).
//!
//! FNV-1a over 128 bits, written out here because it must stay byte-for-byte stable across
//! builds and Rust versions, which std's hashers do not promise. It is not a cryptographic hash:
//! a client could only craft a collision against its own transaction id, which harms nobody
//! else.

use serde::{Deserialize, Serialize};

use crate::transaction::ValidRequest;

const FNV_OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
const FNV_PRIME: u128 = 0x0000000001000000000000000000013B;

/// FNV-1a over length-prefixed fields, so that moving bytes from one field to the next changes
/// the result.
#[derive(Debug, Clone, Copy)]
pub struct Fnv128(u128);

impl Default for Fnv128 {
    fn default() -> Self {
        Fnv128(FNV_OFFSET)
    }
}

impl Fnv128 {
    pub fn field(&mut self, bytes: &[u8]) -> &mut Self {
        self.bytes(&(bytes.len() as u64).to_le_bytes());
        self.bytes(bytes)
    }

    fn bytes(&mut self, bytes: &[u8]) -> &mut Self {
        for byte in bytes {
            self.0 ^= u128::from(*byte);
            self.0 = self.0.wrapping_mul(FNV_PRIME);
        }
        self
    }

    pub fn finish(&self) -> u128 {
        self.0
    }
}

/// A 128-bit digest, shown as 32 hex digits. Payloads and requests are digested as compact
/// JSON: `serde_json` keeps object keys sorted, so key order does not matter.
///
/// Written and read without a `String` in between: a digest is in every prepare, tombstone and
/// record, and `format!` made each one an allocation and a pass through the formatter
/// (issue 28's participant profile).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Digest(pub u128);

impl Digest {
    /// The digest of one participant payload.
    pub fn of_payload(payload: &serde_json::Value) -> Digest {
        Digest::of_encoded_payload(&serde_json::to_vec(payload).unwrap_or_default())
    }

    /// [`Digest::of_payload`] from the payload's compact JSON, for a caller that has it already.
    pub fn of_encoded_payload(encoded: &[u8]) -> Digest {
        Digest(Fnv128::default().field(encoded).finish())
    }

    /// Digest of everything a client chose in the request: the id, each participant's name and
    /// payload, and the timeout as given.
    pub fn of_request(request: &ValidRequest) -> Digest {
        let mut state = Fnv128::default();
        state.field(request.id.as_ref().map_or("", |id| id.as_str()).as_bytes());
        for (name, payload) in &request.participants {
            state.field(name.as_str().as_bytes());
            state.field(&serde_json::to_vec(payload).unwrap_or_default());
        }
        match request.timeout_ms {
            Some(timeout_ms) => state.field(&timeout_ms.to_le_bytes()),
            None => state.field(b"default"),
        };
        Digest(state.finish())
    }
}

impl Digest {
    /// The 32 lowercase hex digits, most significant first.
    fn hex(self) -> [u8; 32] {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 32];
        for (i, digit) in out.iter_mut().enumerate() {
            *digit = DIGITS[((self.0 >> (124 - 4 * i)) & 0xf) as usize];
        }
        out
    }

    fn parse(text: &str) -> Result<Self, String> {
        u128::from_str_radix(text, 16)
            .map(Digest)
            .map_err(|e| format!("bad digest {text:?}: {e}"))
    }
}

impl From<Digest> for String {
    fn from(digest: Digest) -> String {
        digest.hex().iter().map(|&b| char::from(b)).collect()
    }
}

impl TryFrom<String> for Digest {
    type Error = String;
    fn try_from(value: String) -> Result<Self, String> {
        Digest::parse(&value)
    }
}

impl Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let hex = self.hex();
        let text = std::str::from_utf8(&hex).map_err(serde::ser::Error::custom)?;
        serializer.serialize_str(text)
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Digest;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Digest, E> {
                Digest::parse(text).map_err(E::custom)
            }
        }
        deserializer.deserialize_str(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn payload_digest_ignores_key_order_and_sees_every_value() {
        let a = Digest::of_payload(&json!({"x": 1, "y": [1, 2]}));
        assert_eq!(a, Digest::of_payload(&json!({"y": [1, 2], "x": 1})));
        assert_ne!(a, Digest::of_payload(&json!({"x": 1, "y": [2, 1]})));
        let text = String::from(a);
        assert_eq!(text.len(), 32);
        assert_eq!(text, format!("{:032x}", a.0), "the hex digits as before");
        assert_eq!(Digest::try_from(text.clone()).unwrap(), a);
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(json, format!("\"{text}\""), "on the wire, the same string");
        assert_eq!(serde_json::from_str::<Digest>(&json).unwrap(), a);
        assert_eq!(
            serde_json::from_str::<Digest>("\"00ff\"").unwrap(),
            Digest(0xff),
            "fewer digits read as before"
        );
        let bad = serde_json::from_str::<Digest>("\"xyz\"")
            .unwrap_err()
            .to_string();
        assert!(bad.contains("bad digest \"xyz\""), "{bad}");
        assert!(
            serde_json::from_str::<Digest>("17").is_err(),
            "a number is not a digest"
        );
    }

    use crate::TransactionRequest;

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
