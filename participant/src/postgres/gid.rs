//! PostgreSQL global transaction identifiers (the `'<gid>'` of `PREPARE TRANSACTION`).
//!
//! A gid is `<prefix>:<gtid>`: the prefix names this participant (so recovery lists only its
//! own prepared transactions among everything in `pg_prepared_xacts`), the gtid is the
//! coordinator's `{coordinator_id}:{incarnation}:{position}`. PostgreSQL limits a gid to 199
//! bytes and takes it only as a literal (never a bind parameter), so every gid is validated
//! here (id characters only) and quoted by [`Gid::literal`].

use std::fmt;

use protocol::GlobalTxId;

/// PostgreSQL's limit on a gid: `GIDSIZE` is 200 bytes including the terminating NUL.
pub const GID_LEN_MAX: usize = 199;

/// The prefix every gid of this library starts with, before the participant's name.
pub const GID_TAG: &str = "twopc";

/// Why a gid cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GidError {
    #[error("gid {gid:?} is {len} bytes long; PostgreSQL takes at most {GID_LEN_MAX}")]
    TooLong { gid: String, len: usize },
    #[error(
        "gid prefix {prefix:?} contains {found:?}; only ASCII letters, digits and '-', '_', '.' \
         are allowed"
    )]
    BadPrefix { prefix: String, found: char },
    #[error("gid prefix is empty")]
    EmptyPrefix,
}

/// The part of every gid that names this participant: `twopc:<name>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GidPrefix(String);

impl GidPrefix {
    /// `twopc:<name>`. The name must leave room for the longest gtid under the gid limit.
    pub fn new(name: &str) -> Result<Self, GidError> {
        if name.is_empty() {
            return Err(GidError::EmptyPrefix);
        }
        if let Some(found) = name
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
        {
            return Err(GidError::BadPrefix {
                prefix: name.to_string(),
                found,
            });
        }
        let prefix = format!("{GID_TAG}:{name}");
        let longest = prefix.len() + 1 + protocol::limits::GTID_LEN_MAX;
        if longest > GID_LEN_MAX {
            return Err(GidError::TooLong {
                gid: format!("{prefix}:<gtid>"),
                len: longest,
            });
        }
        Ok(Self(prefix))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The gid of one attempt.
    pub fn gid(&self, gtid: &GlobalTxId) -> Result<Gid, GidError> {
        Gid::new(format!("{}:{gtid}", self.0))
    }

    /// A `LIKE` pattern matching every gid with this prefix (the prefix holds no `%`/`_`
    /// wildcards' escape character; `_` is escaped).
    pub fn like_pattern(&self) -> String {
        format!("{}:%", self.0.replace('_', "\\_"))
    }

    /// The gtid inside `gid` if it carries this prefix.
    pub fn gtid_of(&self, gid: &str) -> Option<GlobalTxId> {
        let rest = gid.strip_prefix(self.0.as_str())?.strip_prefix(':')?;
        GlobalTxId::new(rest).ok()
    }
}

impl fmt::Display for GidPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A validated gid: under PostgreSQL's limit, made of id characters only.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Gid(String);

impl Gid {
    pub fn new(gid: String) -> Result<Self, GidError> {
        if gid.len() > GID_LEN_MAX {
            return Err(GidError::TooLong {
                len: gid.len(),
                gid,
            });
        }
        if let Some(found) = gid
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':')))
        {
            return Err(GidError::BadPrefix { prefix: gid, found });
        }
        Ok(Self(gid))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The gid as an SQL string literal. Validation already excludes quotes; doubling them
    /// anyway keeps this safe should the character set ever widen.
    pub fn literal(&self) -> String {
        format!("'{}'", self.0.replace('\'', "''"))
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::{CoordinatorId, Incarnation};

    fn gtid() -> GlobalTxId {
        GlobalTxId::compose(&CoordinatorId::new("c-1").unwrap(), Incarnation(10), 7)
    }

    #[test]
    fn a_gid_is_prefix_and_gtid_and_round_trips() {
        let prefix = GidPrefix::new("accounts_a").unwrap();
        let gid = prefix.gid(&gtid()).unwrap();
        assert_eq!(gid.as_str(), "twopc:accounts_a:c-1:000000000000000a:7");
        assert_eq!(gid.literal(), "'twopc:accounts_a:c-1:000000000000000a:7'");
        assert_eq!(prefix.gtid_of(gid.as_str()), Some(gtid()));
        assert_eq!(
            prefix.gtid_of("twopc:accounts_b:c-1:000000000000000a:7"),
            None
        );
        assert_eq!(prefix.like_pattern(), "twopc:accounts\\_a:%");
    }

    #[test]
    fn the_longest_gtid_fits_under_the_limit() {
        let name = "n".repeat(protocol::limits::NAME_LEN_MAX);
        let coordinator = CoordinatorId::new("c".repeat(protocol::limits::NAME_LEN_MAX)).unwrap();
        let longest = GlobalTxId::compose(&coordinator, Incarnation(u64::MAX), u64::MAX);
        assert_eq!(longest.as_str().len(), protocol::limits::GTID_LEN_MAX);
        let prefix = GidPrefix::new(&name).unwrap();
        assert!(prefix.gid(&longest).unwrap().as_str().len() <= GID_LEN_MAX);
    }

    #[test]
    fn too_long_or_unsafe_gids_are_refused() {
        let error = Gid::new("g".repeat(200)).unwrap_err();
        assert!(error.to_string().contains("200 bytes"), "{error}");
        assert!(Gid::new("x'; DROP TABLE accounts; --".into()).is_err());
        assert!(GidPrefix::new("").is_err());
        assert!(GidPrefix::new("a:b").is_err());
        assert!(GidPrefix::new(&"n".repeat(100)).is_err());
    }
}
