//! Proof that a fencing token was handed out by the lease service (docs/leases.md, "Tokens
//! the resource can verify").
//!
//! A fencing token is a plain number: without proof any client could write with 2^64-1 and
//! fence a resource off for ever. The lease service and the resources share a secret key; the
//! service answers every grant with an HMAC-SHA256 over (resource, token, holder) under it,
//! and a resource configured with the key refuses a token whose proof does not verify. The
//! check is local (no round trip to the lease service, unlike Chubby's sequencer check) and
//! costs one MAC.
//!
//! Key files hold one secret per line (the peer token file format of `crate::auth`): the first
//! signs, every one verifies, so a key is rotated by adding the new one everywhere, then
//! moving it first at the lease service, then removing the old one.
//!
//! Pure: no I/O (the shell reads the file), no clock, no randomness. `Debug` never shows a key.

use std::fmt;

use ring::hmac;

use crate::auth::{Token, TokenFileError, parse_plain};

/// Shortest fence key, in characters: the key is all that stands between a client and a
/// forged token, so it must not be guessable (32 random hex characters carry 128 bits).
pub const FENCE_KEY_CHARS_MIN: usize = 32;

/// Length of a proof on the wire: the hex of a 32-byte HMAC-SHA256.
pub const PROOF_HEX_LEN: usize = 64;

/// Domain separation: a MAC made for anything else under the same key never verifies here.
const CONTEXT: &[u8] = b"twopc-fence-proof-v1";

/// The keys that sign and verify fence proofs. The first signs; all verify.
#[derive(Clone)]
pub struct FenceKeys {
    keys: Vec<hmac::Key>,
}

impl fmt::Debug for FenceKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FenceKeys({} keys, <redacted>)", self.keys.len())
    }
}

/// Why a fence key file cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FenceKeyError {
    #[error(transparent)]
    File(#[from] TokenFileError),
    #[error(
        "{file}: key {index} is {chars} characters; a fence key needs at least \
         {FENCE_KEY_CHARS_MIN} (e.g. `openssl rand -hex 32`, or `twopc tokens`)"
    )]
    Short {
        file: String,
        index: usize,
        chars: usize,
    },
}

/// Why a claim's proof is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProofError {
    #[error("the fence carries no proof; this resource takes only tokens the lease service signed")]
    Missing,
    #[error("the fence's proof names no holder; the proof is made over resource, token and holder")]
    NoHolder,
    #[error("the fence's proof is not {PROOF_HEX_LEN} hex characters")]
    Malformed,
    #[error(
        "the fence's proof does not verify for this resource, token and holder: the token was \
         not handed out by the lease service"
    )]
    Invalid,
}

impl FenceKeys {
    /// Keys from a key file's text. `file` names it in errors.
    pub fn parse(file: &str, text: &str) -> Result<FenceKeys, FenceKeyError> {
        let secrets = parse_plain(file, text)?;
        Self::from_secrets(file, &secrets)
    }

    fn from_secrets(file: &str, secrets: &[Token]) -> Result<FenceKeys, FenceKeyError> {
        let mut keys = Vec::with_capacity(secrets.len());
        for (index, secret) in secrets.iter().enumerate() {
            let bytes = secret.expose().as_bytes();
            if bytes.len() < FENCE_KEY_CHARS_MIN {
                return Err(FenceKeyError::Short {
                    file: file.to_string(),
                    index: index + 1,
                    chars: bytes.len(),
                });
            }
            keys.push(hmac::Key::new(hmac::HMAC_SHA256, bytes));
        }
        Ok(FenceKeys { keys })
    }

    /// The proof for a grant of `token` on `resource` to `holder`, under the first key.
    pub fn sign(&self, resource: &str, token: u64, holder: &str) -> String {
        let Some(key) = self.keys.first() else {
            unreachable!("a key file holds at least one key (parse_plain refuses an empty one)")
        };
        hex(hmac::sign(key, &message(resource, token, holder)).as_ref())
    }

    /// Ok when `proof` was made by one of these keys over exactly (resource, token, holder).
    /// Compared in constant time (`ring::hmac::verify`).
    pub fn verify(
        &self,
        resource: &str,
        token: u64,
        holder: Option<&str>,
        proof: Option<&str>,
    ) -> Result<(), ProofError> {
        let proof = proof.ok_or(ProofError::Missing)?;
        let holder = holder.ok_or(ProofError::NoHolder)?;
        let tag = unhex(proof).ok_or(ProofError::Malformed)?;
        let message = message(resource, token, holder);
        if self
            .keys
            .iter()
            .any(|key| hmac::verify(key, &message, &tag).is_ok())
        {
            Ok(())
        } else {
            Err(ProofError::Invalid)
        }
    }
}

/// What is signed: the context, then each field with its length in front, so no two
/// (resource, token, holder) triples share a message whatever bytes they hold.
fn message(resource: &str, token: u64, holder: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(CONTEXT.len() + resource.len() + holder.len() + 32);
    out.extend_from_slice(CONTEXT);
    for field in [resource.as_bytes(), holder.as_bytes()] {
        out.extend_from_slice(&(field.len() as u64).to_be_bytes());
        out.extend_from_slice(field);
    }
    out.extend_from_slice(&token.to_be_bytes());
    out
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if text.len() != PROOF_HEX_LEN {
        return None;
    }
    let digit = |c: u8| {
        char::from(c)
            .to_digit(16)
            .and_then(|d| u8::try_from(d).ok())
    };
    text.as_bytes()
        .chunks(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY_A: &str = "0123456789abcdef0123456789abcdef";
    const KEY_B: &str = "fedcba9876543210fedcba9876543210";

    fn keys(text: &str) -> FenceKeys {
        FenceKeys::parse("fence.key", text).unwrap()
    }

    #[test]
    fn a_proof_verifies_only_for_its_resource_token_and_holder() {
        let keys = keys(KEY_A);
        let proof = keys.sign("orders", 42, "worker-a");
        assert_eq!(proof.len(), PROOF_HEX_LEN);
        assert_eq!(
            keys.verify("orders", 42, Some("worker-a"), Some(&proof)),
            Ok(())
        );
        for (resource, token, holder) in [
            ("orders", 43, "worker-a"),
            ("orders", u64::MAX, "worker-a"),
            ("orders2", 42, "worker-a"),
            ("orders", 42, "worker-b"),
        ] {
            assert_eq!(
                keys.verify(resource, token, Some(holder), Some(&proof)),
                Err(ProofError::Invalid),
                "{resource} {token} {holder}"
            );
        }
    }

    #[test]
    fn missing_malformed_and_foreign_proofs_are_refused() {
        let keys = keys(KEY_A);
        let proof = keys.sign("r", 1, "h");
        assert_eq!(
            keys.verify("r", 1, Some("h"), None),
            Err(ProofError::Missing)
        );
        assert_eq!(
            keys.verify("r", 1, None, Some(&proof)),
            Err(ProofError::NoHolder)
        );
        assert_eq!(
            keys.verify("r", 1, Some("h"), Some("zz")),
            Err(ProofError::Malformed)
        );
        let not_hex = "g".repeat(PROOF_HEX_LEN);
        assert_eq!(
            keys.verify("r", 1, Some("h"), Some(&not_hex)),
            Err(ProofError::Malformed)
        );
        let other = FenceKeys::parse("other", KEY_B).unwrap();
        assert_eq!(
            keys.verify("r", 1, Some("h"), Some(&other.sign("r", 1, "h"))),
            Err(ProofError::Invalid)
        );
    }

    #[test]
    fn the_first_key_signs_and_every_key_verifies_so_keys_rotate() {
        let old = keys(KEY_A);
        let both_new_first = keys(&format!("{KEY_B}\n{KEY_A}\n"));
        let new = keys(KEY_B);
        let signed_by_old = old.sign("r", 7, "h");
        let signed_during = both_new_first.sign("r", 7, "h");
        assert_eq!(signed_during, new.sign("r", 7, "h"));
        assert!(
            both_new_first
                .verify("r", 7, Some("h"), Some(&signed_by_old))
                .is_ok()
        );
        assert!(new.verify("r", 7, Some("h"), Some(&signed_during)).is_ok());
        assert!(new.verify("r", 7, Some("h"), Some(&signed_by_old)).is_err());
    }

    #[test]
    fn short_keys_and_empty_files_are_refused_and_debug_hides_keys() {
        assert!(matches!(
            FenceKeys::parse("k", "short-but-16-chars"),
            Err(FenceKeyError::Short { chars: 18, .. })
        ));
        assert!(FenceKeys::parse("k", "# nothing\n").is_err());
        let text = format!("{:?}", keys(KEY_A));
        assert!(!text.contains(KEY_A), "{text}");
    }

    #[test]
    fn fields_cannot_be_shifted_between_resource_and_holder() {
        assert_ne!(message("ab", 1, "c"), message("a", 1, "bc"));
        assert_ne!(message("a", 1, ""), message("", 1, "a"));
    }
}
