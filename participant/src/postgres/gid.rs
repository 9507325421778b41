//! PostgreSQL global transaction identifiers (the `'<gid>'` of `PREPARE TRANSACTION`).
//!
//! A gid is `<prefix>:<gtid>+<txid>`: the prefix names this participant (so recovery lists
//! only its own prepared transactions among everything in `pg_prepared_xacts`), the gtid is the
//! coordinator's `{coordinator_id}:{incarnation}:{position}`, and the client's txid is what a
//! decision query names besides, so a participant restarted with the transaction prepared reads
//! it back from the gid (no row of its own to write per prepare). Every decision message
//! carries the txid too, so commit and abort compute the same gid. PostgreSQL limits a gid to
//! 199 bytes: where the txid does not fit, the gid is `<prefix>:<gtid>` and an intent row
//! carries the txid (`super::backend`), as it did for every gid before (such gids, prepared by
//! an earlier version, are still recognised). PostgreSQL takes a gid only as a literal (never
//! a bind parameter), so every gid is validated here and quoted by [`Gid::literal`].

use std::fmt;

use protocol::{GlobalTxId, TxId};

/// PostgreSQL's limit on a gid: `GIDSIZE` is 200 bytes including the terminating NUL.
pub const GID_LEN_MAX: usize = 199;

/// The prefix every gid of this library starts with, before the participant's name.
pub const GID_TAG: &str = "twopc";

/// Between the gtid and the txid: outside the id characters, so the split is unambiguous (a
/// coordinator id and a txid may both contain `:`).
pub const TXID_MARK: char = '+';

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

    /// The gid of one attempt of `txid`: with the txid where it fits, else without.
    pub fn gid(&self, gtid: &GlobalTxId, txid: &TxId) -> Result<Gid, GidError> {
        let with_txid = format!("{}:{gtid}{TXID_MARK}{txid}", self.0);
        if with_txid.len() <= GID_LEN_MAX {
            return Gid::new(with_txid);
        }
        self.gid_without_txid(gtid)
    }

    /// The gid of an attempt without its txid: where the txid does not fit, and every gid an
    /// earlier version prepared.
    pub fn gid_without_txid(&self, gtid: &GlobalTxId) -> Result<Gid, GidError> {
        Gid::new(format!("{}:{gtid}", self.0))
    }

    /// For a gid that carries its txid, the same attempt's gid without it (what an earlier
    /// version prepared and recorded the outcome under).
    pub fn without_txid(&self, gid: &Gid) -> Option<Gid> {
        let (gtid, txid) = self.parse(gid.as_str())?;
        txid?;
        self.gid_without_txid(&gtid).ok()
    }

    /// A `LIKE` pattern matching every gid with this prefix (the prefix holds no `%`/`_`
    /// wildcards' escape character; `_` is escaped).
    pub fn like_pattern(&self) -> String {
        format!("{}:%", self.0.replace('_', "\\_"))
    }

    /// The attempt `gid` names if it carries this prefix: its gtid, and its txid if the gid
    /// carries it.
    pub fn parse(&self, gid: &str) -> Option<(GlobalTxId, Option<TxId>)> {
        let rest = gid.strip_prefix(self.0.as_str())?.strip_prefix(':')?;
        match rest.split_once(TXID_MARK) {
            Some((gtid, txid)) => Some((GlobalTxId::new(gtid).ok()?, Some(TxId::new(txid).ok()?))),
            None => Some((GlobalTxId::new(rest).ok()?, None)),
        }
    }

    /// The gtid inside `gid` if it carries this prefix.
    pub fn gtid_of(&self, gid: &str) -> Option<GlobalTxId> {
        self.parse(gid).map(|(gtid, _)| gtid)
    }
}

impl fmt::Display for GidPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A validated gid: under PostgreSQL's limit, made of id characters and at most one
/// [`TXID_MARK`].
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
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':' | '+')))
        {
            return Err(GidError::BadPrefix { prefix: gid, found });
        }
        if gid.matches(TXID_MARK).count() > 1 {
            return Err(GidError::BadPrefix {
                prefix: gid,
                found: TXID_MARK,
            });
        }
        Ok(Self(gid))
    }

    /// Whether the gid carries its txid (else an intent row does).
    pub fn carries_txid(&self) -> bool {
        self.0.contains(TXID_MARK)
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
    fn a_gid_is_prefix_gtid_and_txid_and_round_trips() {
        let prefix = GidPrefix::new("accounts_a").unwrap();
        let txid = TxId::new("order:17").unwrap();
        let gid = prefix.gid(&gtid(), &txid).unwrap();
        assert_eq!(
            gid.as_str(),
            "twopc:accounts_a:c-1:000000000000000a:7+order:17"
        );
        assert!(gid.carries_txid());
        assert_eq!(
            gid.literal(),
            "'twopc:accounts_a:c-1:000000000000000a:7+order:17'"
        );
        assert_eq!(
            prefix.parse(gid.as_str()),
            Some((gtid(), Some(txid.clone())))
        );
        assert_eq!(prefix.gtid_of(gid.as_str()), Some(gtid()));
        let without = prefix.without_txid(&gid).unwrap();
        assert_eq!(without.as_str(), "twopc:accounts_a:c-1:000000000000000a:7");
        assert!(!without.carries_txid());
        assert_eq!(prefix.parse(without.as_str()), Some((gtid(), None)));
        assert_eq!(prefix.without_txid(&without), None);
        assert_eq!(
            prefix.gtid_of("twopc:accounts_b:c-1:000000000000000a:7+t"),
            None
        );
        assert_eq!(prefix.like_pattern(), "twopc:accounts\\_a:%");
    }

    #[test]
    fn a_txid_that_does_not_fit_leaves_the_gid_without_it() {
        let name = "n".repeat(protocol::limits::NAME_LEN_MAX);
        let prefix = GidPrefix::new(&name).unwrap();
        let long = TxId::new("t".repeat(protocol::limits::TXID_LEN_MAX)).unwrap();
        let gid = prefix.gid(&gtid(), &long).unwrap();
        assert!(!gid.carries_txid());
        assert_eq!(gid, prefix.gid_without_txid(&gtid()).unwrap());
        // The longest that fits is used whole.
        let room = GID_LEN_MAX - prefix.as_str().len() - 1 - gtid().as_str().len() - 1;
        let fits = TxId::new("t".repeat(room)).unwrap();
        let gid = prefix.gid(&gtid(), &fits).unwrap();
        assert!(gid.carries_txid());
        assert_eq!(gid.as_str().len(), GID_LEN_MAX);
        assert_eq!(prefix.parse(gid.as_str()), Some((gtid(), Some(fits))));
    }

    #[test]
    fn the_longest_gtid_fits_under_the_limit() {
        let name = "n".repeat(protocol::limits::NAME_LEN_MAX);
        let coordinator = CoordinatorId::new("c".repeat(protocol::limits::NAME_LEN_MAX)).unwrap();
        let longest = GlobalTxId::compose(&coordinator, Incarnation(u64::MAX), u64::MAX);
        assert_eq!(longest.as_str().len(), protocol::limits::GTID_LEN_MAX);
        let prefix = GidPrefix::new(&name).unwrap();
        assert!(prefix.gid_without_txid(&longest).unwrap().as_str().len() <= GID_LEN_MAX);
    }

    #[test]
    fn too_long_or_unsafe_gids_are_refused() {
        let error = Gid::new("g".repeat(200)).unwrap_err();
        assert!(error.to_string().contains("200 bytes"), "{error}");
        assert!(Gid::new("x'; DROP TABLE accounts; --".into()).is_err());
        assert!(Gid::new("twopc:a:c:1:2+t+u".into()).is_err());
        assert!(GidPrefix::new("").is_err());
        assert!(GidPrefix::new("a:b").is_err());
        assert!(GidPrefix::new(&"n".repeat(100)).is_err());
    }
}
