//! What the lease service writes to the coordinator's log (record types 20-29) and keeps in
//! its checkpoint.

use serde::{Deserialize, Serialize};

/// One held (or possibly still held) lease, as the log and the checkpoint carry it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldLease {
    pub name: String,
    pub holder: String,
    pub token: u64,
    pub ttl_ms: u64,
    pub expires_at_ms: u64,
    /// False for a lease carried over a restart after its logged expiry: it blocks grants
    /// until its TTL has passed since the restart but is never revived by a renewal.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub renewable: bool,
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

/// A lease fact, forced to the log before anyone hears of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LeaseRecord {
    /// A new token was given to `lease.holder` (type 20).
    Granted(HeldLease),
    /// The holder extended its lease (type 21).
    Renewed(HeldLease),
    /// The holder gave the lease up (type 22).
    Released { name: String, token: u64 },
}

/// Record type numbers (the coordinator's lease range is 20-29).
pub mod lease_record_type {
    pub const GRANTED: u8 = 20;
    pub const RENEWED: u8 = 21;
    pub const RELEASED: u8 = 22;
}

#[derive(Serialize, Deserialize)]
struct ReleasedBody {
    name: String,
    token: u64,
}

impl LeaseRecord {
    pub fn record_type(&self) -> u8 {
        match self {
            LeaseRecord::Granted(_) => lease_record_type::GRANTED,
            LeaseRecord::Renewed(_) => lease_record_type::RENEWED,
            LeaseRecord::Released { .. } => lease_record_type::RELEASED,
        }
    }

    pub fn is_lease_type(record_type: u8) -> bool {
        (lease_record_type::GRANTED..=lease_record_type::RELEASED).contains(&record_type)
    }

    pub fn encode(&self) -> Result<Vec<u8>, serde_json::Error> {
        match self {
            LeaseRecord::Granted(l) | LeaseRecord::Renewed(l) => serde_json::to_vec(l),
            LeaseRecord::Released { name, token } => serde_json::to_vec(&ReleasedBody {
                name: name.clone(),
                token: *token,
            }),
        }
    }

    /// `None` for a type outside the lease range.
    pub fn decode(
        record_type: u8,
        payload: &[u8],
    ) -> Option<Result<LeaseRecord, serde_json::Error>> {
        Some(match record_type {
            lease_record_type::GRANTED => serde_json::from_slice(payload).map(LeaseRecord::Granted),
            lease_record_type::RENEWED => serde_json::from_slice(payload).map(LeaseRecord::Renewed),
            lease_record_type::RELEASED => {
                serde_json::from_slice::<ReleasedBody>(payload).map(|b| LeaseRecord::Released {
                    name: b.name,
                    token: b.token,
                })
            }
            _ => return None,
        })
    }
}

/// The lease service's part of the checkpoint: the highest token ever given and every lease
/// that may still be held.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseSnapshot {
    pub last_token: u64,
    pub held: Vec<HeldLease>,
}

impl LeaseSnapshot {
    pub fn is_empty(&self) -> bool {
        self.last_token == 0 && self.held.is_empty()
    }
}
