//! Identifier newtypes. Every id is checked when it is made and when it is decoded, so code that
//! holds a `TxId` knows it is safe to put in a URL, a log line and a WAL record.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::limits::{GTID_LEN_MAX, NAME_LEN_MAX, TXID_LEN_MAX};

/// Why a string is not a valid id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("{kind} is empty")]
    Empty { kind: &'static str },
    #[error("{kind} is {len} bytes long; the limit is {max}")]
    TooLong {
        kind: &'static str,
        len: usize,
        max: usize,
    },
    #[error(
        "{kind} contains {found:?}; only ASCII letters, digits and '-', '_', '.', ':' are allowed"
    )]
    BadCharacter { kind: &'static str, found: char },
    #[error("incarnation {found:?} is not 16 lowercase hex digits")]
    BadIncarnation { found: String },
}

/// The id rules (non-empty, at most `max` bytes, ASCII letters, digits and `-_.:`), for ids
/// that are plain strings on the wire.
pub fn check_id(kind: &'static str, value: &str, max: usize) -> Result<(), IdError> {
    check(kind, value, max)
}

fn check(kind: &'static str, value: &str, max: usize) -> Result<(), IdError> {
    if value.is_empty() {
        return Err(IdError::Empty { kind });
    }
    if value.len() > max {
        return Err(IdError::TooLong {
            kind,
            len: value.len(),
            max,
        });
    }
    // No '/', '?', '#', '%', whitespace or non-ASCII: ids go into URL paths and file names.
    if let Some(found) = value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':')))
    {
        return Err(IdError::BadCharacter { kind, found });
    }
    if value == "." || value == ".." {
        return Err(IdError::BadCharacter { kind, found: '.' });
    }
    Ok(())
}

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident, $kind:literal, $max:expr) => {
        $(#[$doc])*
        // Shared, not owned: an id is copied into every record, command, message and index
        // entry of its transaction, and a clone of an `Arc<str>` is a count, not an allocation
        // and a copy (issue 28: the engine's steps, mostly cloning ids into records and
        // commands, made about 45% of the coordinator's allocations).
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(Arc<str>);

        // By hand, not `try_from = "String"`: that decodes into a `String` first, an allocation
        // more than the id's own.
        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                struct Visitor;
                impl serde::de::Visitor<'_> for Visitor {
                    type Value = $name;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        write!(f, "a {}", $kind)
                    }
                    fn visit_str<E: serde::de::Error>(self, value: &str) -> Result<$name, E> {
                        check($kind, value, $max).map_err(E::custom)?;
                        Ok($name(Arc::from(value)))
                    }
                }
                deserializer.deserialize_str(Visitor)
            }
        }

        // By hand, not `into = "String"`: that clones the id for every message it is in.
        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(&self.0)
            }
        }

        impl $name {
            /// Checks `value` and wraps it.
            pub fn new(value: impl Into<String>) -> Result<Self, IdError> {
                let value = value.into();
                check($kind, &value, $max)?;
                Ok(Self(Arc::from(value)))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = IdError;
            fn try_from(value: String) -> Result<Self, IdError> {
                Self::new(value)
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0.to_string()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl std::str::FromStr for $name {
            type Err = IdError;
            fn from_str(value: &str) -> Result<Self, IdError> {
                Self::new(value)
            }
        }
    };
}

string_id!(
    /// A transaction id; also the client's idempotency key.
    TxId,
    "transaction id",
    TXID_LEN_MAX
);
string_id!(
    /// A participant's registered name (`inventory`, `payments`, ...).
    ParticipantName,
    "participant name",
    NAME_LEN_MAX
);
string_id!(
    /// A coordinator's identity, created once with its data directory. A wiped directory is a
    /// new coordinator, never a stale one.
    CoordinatorId,
    "coordinator id",
    NAME_LEN_MAX
);

string_id!(
    /// A participant-facing transaction identity: unique per attempt and never reused, made by
    /// the coordinator as `{coordinator_id}:{incarnation}:{position}` (see
    /// [`GlobalTxId::compose`]). The client's `TxId` stays the idempotency key at the API;
    /// participants key prepared state, tombstones and decision queries by this id, so a client
    /// id reused after its outcome was forgotten is a new, independent transaction there.
    /// Participants treat it as opaque.
    GlobalTxId,
    "global transaction id",
    GTID_LEN_MAX
);

impl GlobalTxId {
    /// The id of the attempt that `coordinator_id` began as the `position`th transaction of
    /// its `incarnation`. No two starts share an incarnation, and positions only rise within
    /// one, so no two attempts ever share an id.
    pub fn compose(
        coordinator_id: &CoordinatorId,
        incarnation: Incarnation,
        position: u64,
    ) -> GlobalTxId {
        // Every part is made of id characters and the lengths add up to at most GTID_LEN_MAX.
        GlobalTxId(Arc::from(format!(
            "{coordinator_id}:{incarnation}:{position}"
        )))
    }

    /// The (coordinator id, incarnation, position) this id was composed from, if it was.
    pub fn parts(&self) -> Option<(&str, Incarnation, u64)> {
        let mut it = self.0.rsplitn(3, ':');
        let position = it.next()?.parse().ok()?;
        let incarnation = it.next()?.parse().ok()?;
        let coordinator = it.next()?;
        Some((coordinator, incarnation, position))
    }
}

/// One run of a coordinator process: a random number drawn at every start and written in that
/// start's forced epoch record. Epochs can repeat after a data directory is restored from a
/// backup (the restored log bumps to the epoch the lost run already had); an incarnation
/// cannot, so it tells the runs apart. On the wire: 16 lowercase hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Incarnation(pub u64);

impl fmt::Display for Incarnation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl std::str::FromStr for Incarnation {
    type Err = IdError;
    fn from_str(value: &str) -> Result<Self, IdError> {
        let kind = "incarnation";
        if value.len() != 16 {
            return Err(IdError::BadIncarnation {
                found: value.chars().take(24).collect(),
            });
        }
        if let Some(found) = value.chars().find(|c| !matches!(c, '0'..='9' | 'a'..='f')) {
            return Err(IdError::BadCharacter { kind, found });
        }
        u64::from_str_radix(value, 16)
            .map(Incarnation)
            .map_err(|_| IdError::BadIncarnation {
                found: value.to_string(),
            })
    }
}

impl Serialize for Incarnation {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Incarnation {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// A coordinator's incarnation number: it rises at every start, and participants reject
/// messages that carry a lower epoch than the highest they have seen for that coordinator id.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Epoch(pub u64);

impl Epoch {
    /// The epoch of the next start, if there is one: a log that holds `u64::MAX` (which no
    /// real run reaches, but a damaged or forged log can hold) has none.
    pub fn checked_next(self) -> Option<Epoch> {
        self.0.checked_add(1).map(Epoch)
    }

    /// The epoch of the next start. Panics at `u64::MAX`: for tests and models only; a
    /// start uses [`Epoch::checked_next`].
    pub fn next(self) -> Epoch {
        Epoch(
            self.0
                .checked_add(1)
                .expect("epoch overflow: 2^64 restarts"),
        )
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_ids() {
        for ok in ["order-42", "a", "A.b_c:d-9", &"x".repeat(TXID_LEN_MAX)] {
            assert_eq!(TxId::new(ok).map(|id| id.to_string()), Ok(ok.to_string()));
        }
    }

    #[test]
    fn rejects_bad_ids_with_reason() {
        assert_eq!(
            TxId::new(""),
            Err(IdError::Empty {
                kind: "transaction id"
            })
        );
        assert!(matches!(
            TxId::new("x".repeat(TXID_LEN_MAX + 1)),
            Err(IdError::TooLong { len, .. }) if len == TXID_LEN_MAX + 1
        ));
        for (bad, ch) in [
            ("a/b", '/'),
            ("a b", ' '),
            ("a?b", '?'),
            ("%2F", '%'),
            ("é", 'é'),
            ("..", '.'),
        ] {
            assert_eq!(
                TxId::new(bad),
                Err(IdError::BadCharacter {
                    kind: "transaction id",
                    found: ch
                }),
                "{bad}"
            );
        }
    }

    #[test]
    fn serde_checks_ids_on_decode() {
        let id: TxId = serde_json::from_str("\"order-1\"").unwrap();
        assert_eq!(serde_json::to_string(&id).unwrap(), "\"order-1\"");
        let err = serde_json::from_str::<TxId>("\"../etc\"").unwrap_err();
        assert!(
            err.to_string().contains("transaction id contains '/'"),
            "{err}"
        );
    }

    #[test]
    fn global_ids_compose_parse_and_never_collide_across_incarnations() {
        let c = CoordinatorId::new("c-1a2b").unwrap();
        let g = GlobalTxId::compose(&c, Incarnation(0xab), 42);
        assert_eq!(g.as_str(), "c-1a2b:00000000000000ab:42");
        assert_eq!(g.parts(), Some(("c-1a2b", Incarnation(0xab), 42)));
        assert_ne!(g, GlobalTxId::compose(&c, Incarnation(0xac), 42));
        let longest = CoordinatorId::new("c".repeat(NAME_LEN_MAX)).unwrap();
        let g = GlobalTxId::compose(&longest, Incarnation(u64::MAX), u64::MAX);
        assert_eq!(
            GlobalTxId::new(g.as_str()),
            Ok(g.clone()),
            "fits GTID_LEN_MAX"
        );
        assert_eq!(GlobalTxId::new("opaque").unwrap().parts(), None);
    }

    #[test]
    fn incarnations_are_sixteen_hex_digits_on_the_wire() {
        assert_eq!(
            serde_json::to_string(&Incarnation(255)).unwrap(),
            "\"00000000000000ff\""
        );
        let back: Incarnation = serde_json::from_str("\"00000000000000ff\"").unwrap();
        assert_eq!(back, Incarnation(255));
        for bad in [
            "\"ff\"",
            "\"00000000000000FF\"",
            "\"0000000000000xff\"",
            "255",
        ] {
            assert!(serde_json::from_str::<Incarnation>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn epoch_is_a_bare_number() {
        assert_eq!(serde_json::to_string(&Epoch(7)).unwrap(), "7");
        assert_eq!(Epoch(7).next(), Epoch(8));
    }
}
