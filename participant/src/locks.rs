//! Key locks held by prepared transactions, from prepare until the decision.

use std::collections::HashMap;

use protocol::TxId;

/// Which prepared transaction holds each key.
#[derive(Debug, Default)]
pub(crate) struct Locks {
    holders: HashMap<String, TxId>,
}

impl Locks {
    /// The first key in `keys` held by a transaction other than `txid`, with its holder.
    pub fn conflict<'a>(&'a self, txid: &TxId, keys: &'a [String]) -> Option<(&'a str, &'a TxId)> {
        keys.iter().find_map(|key| match self.holders.get(key) {
            Some(holder) if holder != txid => Some((key.as_str(), holder)),
            Some(_) | None => None,
        })
    }

    pub fn take(&mut self, txid: &TxId, keys: &[String]) {
        for key in keys {
            self.holders.insert(key.clone(), txid.clone());
        }
    }

    /// Releases the keys `txid` holds (a key since taken by another transaction stays).
    pub fn release(&mut self, txid: &TxId, keys: &[String]) {
        for key in keys {
            if self.holders.get(key) == Some(txid) {
                self.holders.remove(key);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.holders.len()
    }
}
