//! The group's records in etcd, read and written the one way each is allowed to change: a
//! campaign creates the leader key (only if absent) and raises the term in the same
//! transaction; the sync set changes only under a compare that this leader's key is still the
//! one it created; members register under their own leases. Every decision about *whether*
//! is `rules`'; this file only talks to etcd.

use std::collections::BTreeSet;
use std::time::Duration;

use net::etcd::{Compare, Etcd, EtcdError, LeaseId, TxnOp};

use super::keys::GroupKeys;
use super::rules::{self, GroupState, LeaderClaim, Member};

/// Why a group operation failed.
#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    #[error("etcd: {0}")]
    Etcd(#[from] EtcdError),
    #[error("the group's {what} in etcd does not decode: {detail}")]
    Undecodable { what: &'static str, detail: String },
    #[error(
        "this node no longer holds the group's leader key (a newer term exists or its lease lapsed)"
    )]
    Deposed,
    #[error("the group's state kept changing under {attempts} compare-and-swaps")]
    Contended { attempts: u32 },
}

/// A won campaign.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Term {
    pub state: GroupState,
    /// The leader key's create revision: every later write of this leader compares on it.
    pub claim_revision: i64,
}

/// How a sync set changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncChange {
    Add,
    Remove,
}

/// The group's records, for one node.
#[derive(Debug, Clone)]
pub struct EtcdGroup {
    etcd: Etcd,
    keys: GroupKeys,
}

fn decode<T: serde::de::DeserializeOwned>(
    what: &'static str,
    bytes: &[u8],
) -> Result<T, GroupError> {
    serde_json::from_slice(bytes).map_err(|e| GroupError::Undecodable {
        what,
        detail: e.to_string(),
    })
}

fn encode<T: serde::Serialize>(value: &T) -> Vec<u8> {
    // Plain structs of strings and numbers: serialising them cannot fail.
    serde_json::to_vec(value).unwrap_or_default()
}

impl EtcdGroup {
    pub fn new(etcd: Etcd, prefix: &str) -> EtcdGroup {
        EtcdGroup {
            etcd,
            keys: GroupKeys::new(prefix),
        }
    }

    pub fn etcd(&self) -> &Etcd {
        &self.etcd
    }

    /// The leader's claim and the key's create revision, if a leader holds the key.
    pub async fn leader(&self) -> Result<Option<(LeaderClaim, i64)>, GroupError> {
        match self.etcd.get(&self.keys.leader()).await? {
            Some(kv) => Ok(Some((decode("leader key", &kv.value)?, kv.create_revision))),
            None => Ok(None),
        }
    }

    /// The term and sync set, with the key's mod revision (0: the group is new).
    pub async fn state(&self) -> Result<(Option<GroupState>, i64), GroupError> {
        match self.etcd.get(&self.keys.state()).await? {
            Some(kv) => Ok((Some(decode("state key", &kv.value)?), kv.mod_revision)),
            None => Ok((None, 0)),
        }
    }

    /// Registers (or refreshes) this node as a member under `lease`.
    pub async fn register(&self, member: &Member, lease: LeaseId) -> Result<(), GroupError> {
        self.etcd
            .put(
                &self.keys.member(&member.node),
                &encode(member),
                Some(lease),
            )
            .await?;
        Ok(())
    }

    pub async fn members(&self) -> Result<Vec<Member>, GroupError> {
        let mut members = Vec::new();
        for kv in self.etcd.get_prefix(&self.keys.members()).await? {
            members.push(decode("member key", &kv.value)?);
        }
        Ok(members)
    }

    /// Campaigns once: `Ok(None)` if this node may not lead now (a leader holds the key, or
    /// the rules bar it) or lost the race.
    pub async fn campaign(
        &self,
        claim_node: &str,
        url: &str,
        lease: LeaseId,
    ) -> Result<Option<Term>, GroupError> {
        if self.leader().await?.is_some() {
            return Ok(None);
        }
        let (state, state_revision) = self.state().await?;
        if !rules::may_campaign(claim_node, state.as_ref()) {
            return Ok(None);
        }
        let next = rules::next_term(claim_node, state.as_ref());
        let claim = LeaderClaim {
            node: claim_node.to_string(),
            url: url.to_string(),
            term: next.term,
        };
        let result = self
            .etcd
            .txn(
                vec![
                    Compare::CreateRevision {
                        key: self.keys.leader(),
                        equals: 0,
                    },
                    Compare::ModRevision {
                        key: self.keys.state(),
                        equals: state_revision,
                    },
                ],
                vec![
                    TxnOp::Put {
                        key: self.keys.leader(),
                        value: encode(&claim),
                        lease: Some(lease),
                    },
                    TxnOp::Put {
                        key: self.keys.state(),
                        value: encode(&next),
                        lease: None,
                    },
                ],
                vec![self.keys.leader()],
            )
            .await?;
        if result.succeeded {
            return Ok(Some(Term {
                state: next,
                claim_revision: result.revision,
            }));
        }
        // A campaign resent after a doubtful first try comes back failed although the first
        // one won: the leader key it reads is then held by this very lease.
        match result.reads.first().cloned().flatten() {
            Some(kv) if kv.lease == lease.0 => Ok(Some(Term {
                state: next,
                claim_revision: kv.create_revision,
            })),
            _ => Ok(None),
        }
    }

    /// Adds a follower to the sync set or removes it, only while this leader's claim (its
    /// create revision) is the key's; returns the new set.
    pub async fn change_sync(
        &self,
        claim_revision: i64,
        node: &str,
        change: SyncChange,
    ) -> Result<BTreeSet<String>, GroupError> {
        const ATTEMPTS: u32 = 8;
        for _ in 0..ATTEMPTS {
            let (state, state_revision) = self.state().await?;
            let Some(mut state) = state else {
                return Err(GroupError::Deposed);
            };
            match change {
                SyncChange::Add => state.sync.insert(node.to_string()),
                SyncChange::Remove => state.sync.remove(node),
            };
            let result = self
                .etcd
                .txn(
                    vec![
                        Compare::CreateRevision {
                            key: self.keys.leader(),
                            equals: claim_revision,
                        },
                        Compare::ModRevision {
                            key: self.keys.state(),
                            equals: state_revision,
                        },
                    ],
                    vec![TxnOp::Put {
                        key: self.keys.state(),
                        value: encode(&state),
                        lease: None,
                    }],
                    vec![self.keys.leader()],
                )
                .await?;
            if result.succeeded {
                return Ok(state.sync);
            }
            let holder = result.reads.first().cloned().flatten();
            if holder.is_none_or(|kv| kv.create_revision != claim_revision) {
                return Err(GroupError::Deposed);
            }
            // Only the state moved (another change of this same leader): read it again.
        }
        Err(GroupError::Contended { attempts: ATTEMPTS })
    }

    /// Gives the key up on shutdown so a follower takes over without waiting out the lease.
    pub async fn resign(&self, claim_revision: i64) -> Result<(), GroupError> {
        self.etcd
            .txn(
                vec![Compare::CreateRevision {
                    key: self.keys.leader(),
                    equals: claim_revision,
                }],
                vec![TxnOp::Delete {
                    key: self.keys.leader(),
                }],
                Vec::new(),
            )
            .await?;
        Ok(())
    }

    pub async fn grant(&self, ttl: Duration) -> Result<LeaseId, GroupError> {
        Ok(self.etcd.grant(ttl).await?)
    }
}
