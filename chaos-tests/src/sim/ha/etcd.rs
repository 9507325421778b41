//! The modelled etcd: one linearizable register (every request applies atomically when it
//! arrives) with a global revision, leases that expire by simulated time, and exactly the
//! operations the coordinator group uses: grant, keep-alive, a read of the `leader`
//! and `state` keys, and a transaction of compares (create or mod revision equal to a value;
//! 0 for an absent key) guarding puts. It is the oracle's source of truth for who holds the
//! leader key and which lease is alive; it never fails or loses data (not modelled).

use std::collections::BTreeMap;

use coordinator::ha::rules::{GroupState, LeaderClaim};

pub type LeaseId = u64;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Key {
    /// `<prefix>/leader`, held by the leader's lease.
    Leader,
    /// `<prefix>/state`, no lease.
    State,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Leader(LeaderClaim),
    State(GroupState),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub value: Value,
    pub create_rev: u64,
    pub mod_rev: u64,
    pub lease: Option<LeaseId>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cmp {
    CreateRev(Key, u64),
    ModRev(Key, u64),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Put {
    pub key: Key,
    pub value: Value,
    pub lease: Option<LeaseId>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Grant {
        ttl: u64,
    },
    KeepAlive {
        lease: LeaseId,
    },
    /// A read of both keys at one revision.
    Get,
    Txn {
        cmps: Vec<Cmp>,
        puts: Vec<Put>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Granted {
        lease: LeaseId,
        ttl: u64,
    },
    /// `alive: false` is etcd's "lease not found": it expired or was revoked.
    KeptAlive {
        lease: LeaseId,
        alive: bool,
    },
    Got {
        leader: Option<Entry>,
        state: Option<Entry>,
    },
    Txn {
        ok: bool,
        revision: u64,
    },
}

#[derive(Debug, Clone, Copy)]
struct Lease {
    ttl: u64,
    expires_at: u64,
}

#[derive(Debug, Default)]
pub struct Etcd {
    revision: u64,
    next_lease: LeaseId,
    leases: BTreeMap<LeaseId, Lease>,
    kv: BTreeMap<Key, Entry>,
}

impl Etcd {
    /// Applies one request at `now` (its arrival): linearizable by construction.
    pub fn apply(&mut self, now: u64, op: Op) -> Reply {
        self.expire(now);
        match op {
            Op::Grant { ttl } => {
                self.next_lease += 1;
                let lease = self.next_lease;
                self.leases.insert(
                    lease,
                    Lease {
                        ttl,
                        expires_at: now + ttl,
                    },
                );
                Reply::Granted { lease, ttl }
            }
            Op::KeepAlive { lease } => {
                let alive = match self.leases.get_mut(&lease) {
                    Some(l) => {
                        // The TTL restarts when etcd receives the keep-alive.
                        l.expires_at = now + l.ttl;
                        true
                    }
                    None => false,
                };
                Reply::KeptAlive { lease, alive }
            }
            Op::Get => Reply::Got {
                leader: self.kv.get(&Key::Leader).cloned(),
                state: self.kv.get(&Key::State).cloned(),
            },
            Op::Txn { cmps, puts } => {
                let holds = cmps.iter().all(|c| self.compare(c));
                let leases_alive = puts
                    .iter()
                    .all(|p| p.lease.is_none_or(|l| self.leases.contains_key(&l)));
                if !holds || !leases_alive {
                    return Reply::Txn {
                        ok: false,
                        revision: self.revision,
                    };
                }
                self.revision += 1;
                for put in puts {
                    let create_rev = match self.kv.get(&put.key) {
                        Some(old) => old.create_rev,
                        None => self.revision,
                    };
                    self.kv.insert(
                        put.key,
                        Entry {
                            value: put.value,
                            create_rev,
                            mod_rev: self.revision,
                            lease: put.lease,
                        },
                    );
                }
                Reply::Txn {
                    ok: true,
                    revision: self.revision,
                }
            }
        }
    }

    fn compare(&self, cmp: &Cmp) -> bool {
        match cmp {
            Cmp::CreateRev(key, want) => self.kv.get(key).map_or(0, |e| e.create_rev) == *want,
            Cmp::ModRev(key, want) => self.kv.get(key).map_or(0, |e| e.mod_rev) == *want,
        }
    }

    /// Leases whose TTL ran out by `now` go, with the keys they hold.
    pub fn expire(&mut self, now: u64) {
        let gone: Vec<LeaseId> = self
            .leases
            .iter()
            .filter(|(_, l)| l.expires_at <= now)
            .map(|(id, _)| *id)
            .collect();
        for lease in gone {
            self.drop_lease(lease);
        }
    }

    fn drop_lease(&mut self, lease: LeaseId) {
        if self.leases.remove(&lease).is_some() {
            self.revision += 1;
            self.kv.retain(|_, e| e.lease != Some(lease));
        }
    }

    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// Whether `lease` is surely alive at `now` by etcd's clock.
    pub fn lease_alive(&self, lease: LeaseId, now: u64) -> bool {
        self.leases.get(&lease).is_some_and(|l| l.expires_at > now)
    }

    pub fn state(&self) -> Option<&GroupState> {
        match self.kv.get(&Key::State).map(|e| &e.value) {
            Some(Value::State(state)) => Some(state),
            _ => None,
        }
    }

    /// The leader key's claim and the lease holding it.
    pub fn leader(&self) -> Option<(&LeaderClaim, Option<LeaseId>)> {
        match self.kv.get(&Key::Leader) {
            Some(Entry {
                value: Value::Leader(claim),
                lease,
                ..
            }) => Some((claim, *lease)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(node: &str) -> Value {
        Value::Leader(LeaderClaim {
            node: node.into(),
            url: String::new(),
            term: 1,
        })
    }

    #[test]
    fn create_if_absent_wins_once_and_the_key_goes_with_its_lease() {
        let mut etcd = Etcd::default();
        let Reply::Granted { lease, .. } = etcd.apply(0, Op::Grant { ttl: 100 }) else {
            panic!("no grant")
        };
        let campaign = |lease| Op::Txn {
            cmps: vec![Cmp::CreateRev(Key::Leader, 0)],
            puts: vec![Put {
                key: Key::Leader,
                value: claim("a"),
                lease: Some(lease),
            }],
        };
        assert!(matches!(
            etcd.apply(1, campaign(lease)),
            Reply::Txn { ok: true, .. }
        ));
        assert!(matches!(
            etcd.apply(2, campaign(lease)),
            Reply::Txn { ok: false, .. }
        ));
        assert!(etcd.lease_alive(lease, 99));
        assert_eq!(
            etcd.apply(50, Op::KeepAlive { lease }),
            Reply::KeptAlive { lease, alive: true }
        );
        assert!(etcd.lease_alive(lease, 149));
        etcd.expire(150);
        assert!(etcd.leader().is_none());
        assert_eq!(
            etcd.apply(151, Op::KeepAlive { lease }),
            Reply::KeptAlive {
                lease,
                alive: false
            }
        );
        // A put on a dead lease fails the whole transaction.
        assert!(matches!(
            etcd.apply(152, campaign(lease)),
            Reply::Txn { ok: false, .. }
        ));
    }
}
