//! Key locks held by prepared transactions, from prepare until the decision, and which keys a
//! transaction locks: its resource's, plus one per fenced resource it claims.

use std::collections::HashMap;

use protocol::GlobalTxId;
use protocol::lease::FenceClaim;

use crate::fence::lock_key;

/// Which prepared attempt (by global id) holds each key.
#[derive(Debug, Default)]
pub(crate) struct Locks {
    holders: HashMap<String, GlobalTxId>,
}

impl Locks {
    /// Who holds `key`, if anyone.
    pub fn holder(&self, key: &str) -> Option<&GlobalTxId> {
        self.holders.get(key)
    }

    pub fn take(&mut self, gtid: &GlobalTxId, keys: &[String]) {
        for key in keys {
            self.holders.insert(key.clone(), gtid.clone());
        }
    }

    /// Releases the keys `gtid` holds (a key since taken by another transaction stays).
    pub fn release(&mut self, gtid: &GlobalTxId, keys: &[String]) {
        for key in keys {
            if self.holders.get(key) == Some(gtid) {
                self.holders.remove(key);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.holders.len()
    }
}

/// A transaction's lock keys: the resource's, plus one per fenced resource it claims, each
/// once and sorted.
pub(crate) fn lock_keys(mut keys: Vec<String>, claims: &[FenceClaim]) -> Vec<String> {
    keys.extend(claims.iter().map(|c| lock_key(&c.resource)));
    keys.sort();
    keys.dedup();
    keys
}
