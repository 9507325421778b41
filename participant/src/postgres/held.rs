//! The gids this participant may hold prepared in its database now: what lets a first prepare
//! of an attempt (nearly every prepare) skip looking at `pg_prepared_xacts`.
//!
//! That view is a function scan of every prepared transaction of the server plus two joins;
//! looked at twice per prepare it was about 14% of the server's CPU per transfer (issue 28,
//! docs/benchmarks.md). The look exists only for a repeated prepare of a gid prepared here now:
//! that transaction inserted its outcome row (and deleted its intent row, if it had one), both
//! uncommitted, and an insert meeting either waits for its decision. So a prepare of a gid in
//! this set takes the careful path (`prepare_sql::INTENT_SQL`, `prepare_sql::OUTCOME_SQL`), any
//! other the blind one. The gids held from the start also tell which attempts an earlier version
//! prepared under a gid without the txid (`PgParticipant::gid_of`).
//!
//! The set errs towards holding too much. A gid enters before its `PREPARE TRANSACTION` is sent
//! (a cancelled request or a lost answer may still have prepared it), and leaves only once it is
//! known not prepared here: PostgreSQL refused the `PREPARE TRANSACTION`, or a `COMMIT PREPARED`
//! / `ROLLBACK PREPARED` ended it or found it missing while no prepare of it runs (a running
//! repeat may be about to prepare it again). It is seeded from `pg_prepared_xacts` at start,
//! before serving. A gid held wrongly costs the careful path. A gid prepared here but not held
//! (only another process of the same name on this database, which docs/postgres.md rules out)
//! costs liveness only: the blind intent insert waits up to `lock_timeout`, and the prepare
//! answers 503 `not_ready` and is retried; it never votes on a guess.

use std::collections::HashSet;
use std::sync::Mutex;

#[derive(Debug, Default)]
pub(crate) struct Held {
    gids: Mutex<HashSet<String>>,
}

impl Held {
    /// The gids with this participant's prefix prepared in its database at start.
    pub(crate) fn seeded(gids: impl IntoIterator<Item = String>) -> Self {
        Self {
            gids: Mutex::new(gids.into_iter().collect()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.gids.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a prepare of `gid` must take the careful path.
    pub(crate) fn holds(&self, gid: &str) -> bool {
        self.lock().contains(gid)
    }

    /// Before `PREPARE TRANSACTION` of `gid` is sent.
    pub(crate) fn hold(&self, gid: &str) {
        self.lock().insert(gid.to_string());
    }

    /// PostgreSQL refused this process's own `PREPARE TRANSACTION` of `gid` (the caller is the
    /// prepare of it, the only one running).
    pub(crate) fn refused(&self, gid: &str) {
        self.lock().remove(gid);
    }

    /// A decision ended `gid` or found it missing: it is no longer prepared here, unless a
    /// prepare of it runs now (in `preparing`), which may prepare it again.
    pub(crate) fn ended(&self, gid: &str, preparing: &Mutex<HashSet<String>>) {
        // Lock order: `preparing` first, so that no prepare of the gid starts in between.
        let preparing = preparing.lock().unwrap_or_else(|p| p.into_inner());
        if !preparing.contains(gid) {
            self.lock().remove(gid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gid_is_held_from_its_prepare_until_a_decision_ends_it_with_no_prepare_running() {
        let held = Held::seeded(["twopc:a:c:1:1".to_string()]);
        let preparing = Mutex::new(HashSet::new());
        assert!(held.holds("twopc:a:c:1:1"));
        assert!(!held.holds("twopc:a:c:1:2"));

        held.hold("twopc:a:c:1:2");
        assert!(held.holds("twopc:a:c:1:2"));
        held.refused("twopc:a:c:1:2");
        assert!(!held.holds("twopc:a:c:1:2"));

        // A repeat of it is running: the decision leaves it held.
        preparing
            .lock()
            .unwrap()
            .insert("twopc:a:c:1:1".to_string());
        held.ended("twopc:a:c:1:1", &preparing);
        assert!(held.holds("twopc:a:c:1:1"));
        preparing.lock().unwrap().clear();
        held.ended("twopc:a:c:1:1", &preparing);
        assert!(!held.holds("twopc:a:c:1:1"));
    }
}
