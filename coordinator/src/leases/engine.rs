//! The lease state machine: `step(event) -> Vec<LeaseCommand>`, pure and deterministic.
//!
//! Tokens come from one counter for every name, so they rise per name for ever (and across
//! names too); the counter's high-water mark is in every grant record and every checkpoint,
//! so recovery starts above any token a holder may have heard.

use std::collections::BTreeMap;

use protocol::lease::{LEASE_TTL_MS_MAX, LEASE_TTL_MS_MIN, Lease, ReleaseResponse};

use super::record::{HeldLease, LeaseRecord, LeaseSnapshot};

/// A lease request, with the time it is handled at (the shell's clock, in Unix ms).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseEvent {
    Acquire {
        name: String,
        holder: String,
        ttl_ms: u64,
        now_ms: u64,
    },
    Renew {
        name: String,
        holder: String,
        token: u64,
        now_ms: u64,
    },
    Release {
        name: String,
        holder: String,
        token: u64,
        now_ms: u64,
    },
}

/// What the shell does, in order: appends are forced, and the reply waits for them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseCommand {
    Append(LeaseRecord),
    Reply(LeaseReply),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseReply {
    /// 200: granted or renewed.
    Granted(Lease),
    /// 409 `lease_held`.
    Held { holder: String, expires_in_ms: u64 },
    /// 409 `lease_lost`.
    Lost { reason: String },
    /// 200 to a release.
    Released(ReleaseResponse),
}

/// Who holds what. Expired leases are dropped lazily, when a step touches their name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseEngine {
    last_token: u64,
    held: BTreeMap<String, HeldLease>,
}

fn view(lease: &HeldLease, now_ms: Option<u64>) -> Lease {
    Lease {
        name: lease.name.clone(),
        holder: lease.holder.clone(),
        token: lease.token,
        ttl_ms: lease.ttl_ms,
        expires_at_ms: lease.expires_at_ms,
        expires_in_ms: now_ms.map(|now| lease.expires_at_ms.saturating_sub(now)),
        renewable: now_ms.map(|_| lease.renewable),
        // Signed by the API for the holder's own answers only (`api::leases`).
        proof: None,
    }
}

impl LeaseEngine {
    pub fn new() -> LeaseEngine {
        LeaseEngine::default()
    }

    /// The highest token ever given (0: none yet).
    pub fn last_token(&self) -> u64 {
        self.last_token
    }

    /// Rebuilds the state from a checkpoint and the lease records after it, then applies the
    /// restart rule at `now_ms`: every lease that may still be held is held until its full TTL
    /// has passed since now (no early re-grant if the clock jumped), and one whose logged
    /// expiry has passed blocks grants as long but is never revived.
    pub fn recover(
        snapshot: LeaseSnapshot,
        records: impl IntoIterator<Item = LeaseRecord>,
        now_ms: u64,
    ) -> LeaseEngine {
        let mut engine = LeaseEngine {
            last_token: snapshot.last_token,
            held: snapshot
                .held
                .into_iter()
                .map(|l| (l.name.clone(), l))
                .collect(),
        };
        for record in records {
            engine.replay(record);
        }
        for lease in engine.held.values_mut() {
            let restart_expiry = now_ms.saturating_add(lease.ttl_ms);
            if lease.expires_at_ms > now_ms && lease.renewable {
                lease.expires_at_ms = lease.expires_at_ms.max(restart_expiry);
            } else {
                lease.expires_at_ms = restart_expiry;
                lease.renewable = false;
            }
        }
        engine
    }

    /// One logged fact, in log order. Never rejects: the log is what happened.
    pub fn replay(&mut self, record: LeaseRecord) {
        match record {
            LeaseRecord::Granted(lease) | LeaseRecord::Renewed(lease) => {
                self.last_token = self.last_token.max(lease.token);
                self.held.insert(lease.name.clone(), lease);
            }
            LeaseRecord::Released { name, token } => {
                self.last_token = self.last_token.max(token);
                if self.held.get(&name).is_some_and(|l| l.token == token) {
                    self.held.remove(&name);
                }
            }
        }
    }

    /// The checkpoint's lease state (everything in memory, expired or not: dropping an expired
    /// one is only ever done by a step, whose clock is the run's).
    pub fn snapshot(&self) -> LeaseSnapshot {
        LeaseSnapshot {
            last_token: self.last_token,
            held: self.held.values().cloned().collect(),
        }
    }

    /// The lease on `name` if it holds at `now_ms`.
    pub fn get(&self, name: &str, now_ms: u64) -> Option<Lease> {
        self.held
            .get(name)
            .filter(|l| l.expires_at_ms > now_ms)
            .map(|l| view(l, Some(now_ms)))
    }

    /// Every lease that holds at `now_ms`, by name.
    pub fn list(&self, now_ms: u64) -> Vec<Lease> {
        self.held
            .values()
            .filter(|l| l.expires_at_ms > now_ms)
            .map(|l| view(l, Some(now_ms)))
            .collect()
    }

    pub fn step(&mut self, event: LeaseEvent) -> Vec<LeaseCommand> {
        match event {
            LeaseEvent::Acquire {
                name,
                holder,
                ttl_ms,
                now_ms,
            } => self.acquire(name, holder, ttl_ms, now_ms),
            LeaseEvent::Renew {
                name,
                holder,
                token,
                now_ms,
            } => self.renew(&name, &holder, token, now_ms),
            LeaseEvent::Release {
                name,
                holder,
                token,
                now_ms,
            } => self.release(name, &holder, token, now_ms),
        }
    }

    /// The lease on `name` if it holds at `now_ms`; an expired one is dropped here.
    fn live(&mut self, name: &str, now_ms: u64) -> Option<&mut HeldLease> {
        if self
            .held
            .get(name)
            .is_some_and(|l| l.expires_at_ms <= now_ms)
        {
            self.held.remove(name);
        }
        self.held.get_mut(name)
    }

    fn acquire(
        &mut self,
        name: String,
        holder: String,
        ttl_ms: u64,
        now_ms: u64,
    ) -> Vec<LeaseCommand> {
        let ttl_ms = ttl_ms.clamp(LEASE_TTL_MS_MIN, LEASE_TTL_MS_MAX);
        if let Some(current) = self.live(&name, now_ms) {
            if current.holder == holder && current.renewable {
                current.ttl_ms = ttl_ms;
                current.expires_at_ms = now_ms.saturating_add(ttl_ms);
                let lease = current.clone();
                return vec![
                    LeaseCommand::Append(LeaseRecord::Renewed(lease.clone())),
                    LeaseCommand::Reply(LeaseReply::Granted(view(&lease, None))),
                ];
            }
            return vec![LeaseCommand::Reply(LeaseReply::Held {
                holder: current.holder.clone(),
                expires_in_ms: current.expires_at_ms.saturating_sub(now_ms),
            })];
        }
        self.last_token += 1;
        let lease = HeldLease {
            name: name.clone(),
            holder,
            token: self.last_token,
            ttl_ms,
            expires_at_ms: now_ms.saturating_add(ttl_ms),
            renewable: true,
        };
        self.held.insert(name, lease.clone());
        vec![
            LeaseCommand::Append(LeaseRecord::Granted(lease.clone())),
            LeaseCommand::Reply(LeaseReply::Granted(view(&lease, None))),
        ]
    }

    fn lost(&self, name: &str, holder: &str, token: u64, now_ms: u64) -> LeaseReply {
        let current = self.held.get(name).filter(|l| l.expires_at_ms > now_ms);
        let reason = match current {
            _ if token > self.last_token => format!("token {token} was never granted"),
            Some(l) if l.token == token && l.holder != holder => format!(
                "lease {name:?} under token {token} is held by {:?}, not {holder:?}",
                l.holder
            ),
            Some(l) if l.token == token => format!(
                "lease {name:?} under token {token} expired before a restart; it is never \
                 revived"
            ),
            Some(l) => format!(
                "lease {name:?} under token {token} expired or was released; it is now held \
                 under token {} by {:?}",
                l.token, l.holder
            ),
            None => format!("lease {name:?} under token {token} expired or was released"),
        };
        LeaseReply::Lost { reason }
    }

    fn renew(&mut self, name: &str, holder: &str, token: u64, now_ms: u64) -> Vec<LeaseCommand> {
        if let Some(current) = self.live(name, now_ms)
            && current.token == token
            && current.holder == holder
            && current.renewable
        {
            current.expires_at_ms = now_ms.saturating_add(current.ttl_ms);
            let lease = current.clone();
            return vec![
                LeaseCommand::Append(LeaseRecord::Renewed(lease.clone())),
                LeaseCommand::Reply(LeaseReply::Granted(view(&lease, None))),
            ];
        }
        vec![LeaseCommand::Reply(self.lost(name, holder, token, now_ms))]
    }

    fn release(
        &mut self,
        name: String,
        holder: &str,
        token: u64,
        now_ms: u64,
    ) -> Vec<LeaseCommand> {
        let Some(current) = self.held.get(&name).filter(|l| l.token == token) else {
            // Already ended (or never this token's): nothing to do, same answer every time.
            return vec![LeaseCommand::Reply(LeaseReply::Released(ReleaseResponse {
                name,
                token,
                released: false,
            }))];
        };
        if current.holder != holder {
            return vec![LeaseCommand::Reply(self.lost(&name, holder, token, now_ms))];
        }
        let was_live = current.expires_at_ms > now_ms && current.renewable;
        self.held.remove(&name);
        vec![
            LeaseCommand::Append(LeaseRecord::Released {
                name: name.clone(),
                token,
            }),
            LeaseCommand::Reply(LeaseReply::Released(ReleaseResponse {
                name,
                token,
                released: was_live,
            })),
        ]
    }
}
