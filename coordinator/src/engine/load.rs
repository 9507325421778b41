//! Admission control: how much work each participant holds in this coordinator, kept up to
//! date on every step, so that a participant in an outage cannot make the coordinator take on
//! unbounded work while transactions on healthy participants carry on.
//!
//! Two counts per participant: transactions *live* on it (phase one, or deciding), and *pending*
//! acknowledgements (a durable decision it has not acknowledged yet). Under presumed abort only
//! a participant that voted yes is owed an abort (see `rules::send_decisions`), so pending work
//! follows what can actually be in doubt, not the number of attempts that met the outage.

use std::collections::BTreeMap;

use protocol::ParticipantName;

use crate::engine::tx::{Phase, Tx};

/// What a participant holds here.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Load {
    pub live: u64,
    pub pending_acks: u64,
}

/// The bounds; `u64::MAX` turns one off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub live_per_participant: u64,
    pub pending_acks_per_participant: u64,
    pub waiters_per_transaction: usize,
}

impl Bounds {
    /// No bound at all (tests, and engines that only replay).
    pub const UNBOUNDED: Bounds = Bounds {
        live_per_participant: u64::MAX,
        pending_acks_per_participant: u64::MAX,
        waiters_per_transaction: usize::MAX,
    };
}

/// Why a new transaction is refused for now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overload {
    pub participant: ParticipantName,
    pub message: String,
}

/// Per participant loads; zero entries are removed so the map follows the participants in use.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Loads {
    by_participant: BTreeMap<ParticipantName, Load>,
}

impl Loads {
    pub fn get(&self, name: &ParticipantName) -> Load {
        self.by_participant.get(name).copied().unwrap_or_default()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&ParticipantName, &Load)> {
        self.by_participant.iter()
    }

    /// Adds (`add` true) or removes what `tx` holds.
    pub fn account(&mut self, tx: &Tx, add: bool) {
        for part in &tx.parts {
            let (live, pending) = match tx.phase {
                Phase::Preparing | Phase::Deciding(_) | Phase::LogFailed { .. } => (1, 0),
                Phase::Decided(_) if !part.acked => (0, 1),
                Phase::Decided(_) => (0, 0),
            };
            if live == 0 && pending == 0 {
                continue;
            }
            let load = self.by_participant.entry(part.name.clone()).or_default();
            if add {
                load.live += live;
                load.pending_acks += pending;
            } else {
                assert!(
                    load.live >= live && load.pending_acks >= pending,
                    "load accounting went negative for {}: it must mirror the table",
                    part.name
                );
                load.live -= live;
                load.pending_acks -= pending;
                if *load == Load::default() {
                    self.by_participant.remove(&part.name);
                }
            }
        }
    }

    /// Counts every live transaction again (after replay and recovery).
    pub fn recount<'a>(&mut self, live: impl Iterator<Item = &'a Tx>) {
        self.by_participant.clear();
        for tx in live {
            self.account(tx, true);
        }
    }

    /// The first participant among `names` at a bound, with what the client should hear.
    pub fn refusal<'a>(
        &self,
        bounds: &Bounds,
        mut names: impl Iterator<Item = &'a ParticipantName>,
    ) -> Option<Overload> {
        names.find_map(|name| {
            let load = self.get(name);
            let message = if load.live >= bounds.live_per_participant {
                format!(
                    "participant \"{name}\" has {} transactions in progress here (the bound is \
                     {}); retry later",
                    load.live, bounds.live_per_participant
                )
            } else if load.pending_acks >= bounds.pending_acks_per_participant {
                format!(
                    "participant \"{name}\" has not acknowledged {} decisions (the bound is {}); \
                     is it down or partitioned? retry later",
                    load.pending_acks, bounds.pending_acks_per_participant
                )
            } else {
                return None;
            };
            Some(Overload {
                participant: name.clone(),
                message,
            })
        })
    }
}
