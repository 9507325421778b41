//! Deterministic simulation of the coordinator group of issue 27, at the model level: two or
//! three coordinator processes share one coordinator id, elect a leader through a modelled
//! etcd, and the leader replicates its write-ahead log synchronously to the members of the
//! group's sync set. Every decision a node takes goes through the pure rules the real shell
//! uses (`coordinator::ha::rules`: `may_campaign`, `next_term`, `epoch_for_term`,
//! `lease_holds`, `replica_verdict`, `after_sync`).
//!
//! **Modelled:**
//! - etcd (`etcd`): one linearizable register with revisions, leases (grant, keep-alive that
//!   restarts the TTL when etcd *receives* it, expiry by simulated time, keys held by
//!   a lease go with it), range reads and transactions with compares on create and mod
//!   revisions: exactly the operations the coordinator uses (`leader` and `state` keys).
//! - the network (`net`): FIFO links between nodes, etcd and the clients, with delays, delay
//!   spikes, losses, partitions of any pair (node–node, node–etcd) and lagging nodes; the
//!   keep-alives ride their own lane, which can stall long enough for etcd to expire the
//!   lease of a leader that is otherwise fine (the case the removal guard is for).
//! - each node (`node`, `leader`): a log of `Rec`s split into durable and unsynced parts
//!   (SIGKILL drops the unsynced part), an etcd lease kept alive, follower streams (a base
//!   backup, then shipped records written at their offset, fsynced before the confirmation),
//!   the watch-and-campaign loop (freeze, then a create-if-absent txn), the leader's sync
//!   points (fsync, ship, wait for the sync set, time out, remove by a guarded CAS or poison
//!   and exit), adding a caught-up follower (marked in sync locally before the add CAS), and
//!   SIGSTOP pauses past the lease after which the node reads what its socket buffers hold
//!   and carries on (its tasks run in random order; a SIGKILL while stopped loses the
//!   buffers). A leader is tied to the lease its key was created with: if that lease goes
//!   while the campaign's reply is in flight, it exits. A leader has no lease watchdog: it leads until etcd says
//!   its lease is gone, an etcd call times out or a CAS fails, so safety rests on the sync
//!   set, the guard and the freeze, never on timing (only client answers do).
//! - clients ask a random node to decide attempt N; the leader answers from its log or picks
//!   commit/abort, and answers once the record is acknowledged. Participants "hear" every
//!   acknowledged decision at the moment the leader acknowledges it (no lease check: phase two
//!   rests on the sync set, not on timing).
//! - the group starts from one standalone coordinator's log (an epoch record, copied to every
//!   node by the operator), so epochs must rise above the history, not just follow terms.
//!
//! **Not modelled:** the real engine, participants and 2PC phases (a decision is one record);
//! member registration keys (membership is static) and url discovery (clients guess);
//! clock rate differences between a node and etcd (one clock; the margin is not exercised);
//! a pause between the lease check and the socket write (they are one step); torn or partial
//! writes; pipelined sync points (one at a time per leader); etcd itself crashing or losing
//! data (it is the linearizable oracle); liveness (only safety is checked, and the stats show
//! that the runs make progress).
//!
//! **Invariants** (`oracle`), after every delivered message and every tick that changed a
//! log, a role, an acknowledgement or etcd's revision (the others are skipped): (1) no log holds
//! two decisions for one attempt, and the durable logs of the nodes that may take over agree
//! (a deposed node may hold an unacknowledged decision the next leader took the other way:
//! that is allowed, which is why (1) looks only at the nodes `may_campaign` names);
//! (2) every acknowledged decision has one value, and the current term's leader holds them
//! all; (3) every node that may take over holds every acknowledged decision durably (so no
//! single failure loses one); (4) established epochs strictly rise and never repeat; (5) a
//! client answer comes only from the holder of the leader key whose lease is alive in etcd.
//!
//! **Must never:** read the clock, spawn anything, or draw a number outside the run's seeded
//! generator: one seed replays one run. Test-only [`HaBroken`] switches break one rule each,
//! to prove the invariants catch it.

mod calls;
mod etcd;
mod leader;
mod net;
mod node;
mod oracle;
mod run;

use std::collections::VecDeque;
use std::fmt;

use etcd::Etcd;
use net::Net;
use node::Node;

/// A record of the modelled write-ahead log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rec {
    /// A leader's first record: the epoch its term runs at.
    Epoch(u64),
    Decision {
        attempt: u64,
        commit: bool,
    },
}

/// One rule broken on purpose (tests only), to prove the invariants catch it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HaBroken {
    None,
    /// Any node campaigns when the key is free (`may_campaign` ignored).
    AnyCampaign,
    /// The leader acknowledges once it fsynced, without waiting for the sync set.
    AckWithoutSync,
    /// A campaigning (and then leading) node never freezes its copy.
    NoFreeze,
    /// The removal from the sync set compares the state's revision but not the leader key.
    UnguardedRemoval,
    /// The leader answers clients (and keeps leading) without `lease_holds`.
    NoLeaseCheck,
    /// The new leader's epoch follows the term only, not the log.
    EpochIgnoresLog,
    /// Not a rule but a setup mistake the rules allow: the group is formed with the
    /// standalone coordinator's log on one node only (on a fresh group anyone may campaign).
    HistoryOnOneNode,
}

/// What one run did (to show the runs exercise what they claim to).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HaStats {
    pub ticks: u64,
    pub messages: u64,
    /// Decisions acknowledged (heard by participants) and answers clients heard.
    pub acked: u64,
    pub answers: u64,
    /// Campaigns started, and won (terms).
    pub campaigns: u64,
    pub terms: u64,
    pub removals: u64,
    pub adds: u64,
    /// Processes that exited: a failed CAS, a lost lease, an etcd call timed out.
    pub exits: u64,
    pub crashes: u64,
    pub pauses: u64,
    pub partitions: u64,
    /// Replication refused because the receiver was frozen, or the sender deposed.
    pub refused_frozen: u64,
    pub refused_stale: u64,
    pub backups: u64,
}

impl HaStats {
    pub fn add(&mut self, o: &HaStats) {
        self.ticks += o.ticks;
        self.messages += o.messages;
        self.acked += o.acked;
        self.answers += o.answers;
        self.campaigns += o.campaigns;
        self.terms += o.terms;
        self.removals += o.removals;
        self.adds += o.adds;
        self.exits += o.exits;
        self.crashes += o.crashes;
        self.pauses += o.pauses;
        self.partitions += o.partitions;
        self.refused_frozen += o.refused_frozen;
        self.refused_stale += o.refused_stale;
        self.backups += o.backups;
    }
}

/// A run that broke an invariant: the seed, what broke, and the last steps before it.
#[derive(Debug, Clone)]
pub struct HaFailure {
    pub seed: u64,
    pub broken: HaBroken,
    pub invariant: &'static str,
    pub detail: String,
    pub now_ms: u64,
    pub trace: Vec<String>,
}

impl fmt::Display for HaFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "ha simulation seed {} (broken {:?}) broke invariant `{}` at t={}ms: {}",
            self.seed, self.broken, self.invariant, self.now_ms, self.detail
        )?;
        writeln!(f, "last {} steps:", self.trace.len())?;
        for line in &self.trace {
            writeln!(f, "  {line}")?;
        }
        write!(
            f,
            "replay: TWOPC_HA_SEED={} cargo test -p twopc-chaos-tests --test ha_simulation",
            self.seed
        )
    }
}

/// Runs one seed. A failing seed runs again with the trace on (the run is deterministic).
pub fn run_ha_seed(seed: u64, broken: HaBroken) -> Result<HaStats, HaFailure> {
    let quick = match World::new(seed, broken, false).run() {
        Ok(stats) => return Ok(stats),
        Err(failure) => failure,
    };
    match World::new(seed, broken, true).run() {
        Err(failure) => Err(failure),
        Ok(_) => Err(HaFailure {
            detail: format!("{} (NOT REPRODUCED with the trace on)", quick.detail),
            ..quick
        }),
    }
}

/// Simulated milliseconds of faults, then of calm (no new faults) before the end.
const RUN_MS: u64 = 2_400;
const CALM_MS: u64 = 600;
/// The etcd lease: TTL, the margin `lease_holds` keeps, and the keep-alive period.
const TTL_MS: u64 = 150;
const MARGIN_MS: u64 = 30;
const KEEPALIVE_MS: u64 = 40;
/// A sync point's confirmation timeout, an etcd call's timeout.
const SYNC_TIMEOUT_MS: u64 = 60;
const ETCD_TIMEOUT_MS: u64 = 80;
/// How often a follower reads the leader key (plus up to the same again, drawn).
const WATCH_MS: u64 = 25;
/// Attempts clients ask about (small, so that retries and conflicts are frequent).
const ATTEMPTS: u64 = 40;
const TRACE_KEEP: usize = 60;

pub(crate) fn name(i: usize) -> String {
    format!("n{i}")
}

/// One run's state: etcd, the network, the nodes, and the oracle's records.
pub(crate) struct World {
    seed: u64,
    broken: HaBroken,
    rng: fastrand::Rng,
    now: u64,
    etcd: Etcd,
    net: Net,
    nodes: Vec<Node>,
    next_rid: u64,
    /// Every acknowledged decision (participants heard it), attempt -> commit.
    acked: Decided,
    /// Established epochs, in the order they were established: (term, epoch).
    established: Vec<(u64, u64)>,
    /// A violation seen while handling a step, reported by the next check.
    problem: Option<(&'static str, String)>,
    /// Bumped by every change the invariants read (logs, roles, acknowledgements); with
    /// etcd's revision, it lets the checks skip steps that changed none of it.
    changes: u64,
    checked: (u64, u64),
    stats: HaStats,
    trace: Option<VecDeque<String>>,
}

impl World {
    fn new(seed: u64, broken: HaBroken, tracing: bool) -> World {
        let mut rng = fastrand::Rng::with_seed(seed);
        let count = 2 + (seed % 2) as usize;
        // The standalone coordinator's history, copied to every node when the group formed.
        let first_epoch = rng.u64(1..30);
        let nodes = (0..count)
            .map(|i| {
                let history = if i == 0 || broken != HaBroken::HistoryOnOneNode {
                    vec![Rec::Epoch(first_epoch)]
                } else {
                    Vec::new()
                };
                Node::new(history, rng.u64(0..WATCH_MS))
            })
            .collect();
        World {
            seed,
            broken,
            rng,
            now: 0,
            etcd: Etcd::default(),
            net: Net::new(count),
            nodes,
            next_rid: 0,
            acked: Decided::default(),
            established: vec![(0, first_epoch)],
            problem: None,
            changes: 1,
            checked: (0, 0),
            stats: HaStats::default(),
            trace: tracing.then(VecDeque::new),
        }
    }

    fn note(&mut self, what: impl FnOnce() -> String) {
        if let Some(trace) = &mut self.trace {
            trace.push_back(format!("t={} {}", self.now, what()));
            while trace.len() > TRACE_KEEP {
                trace.pop_front();
            }
        }
    }

    fn flag(&mut self, invariant: &'static str, detail: String) {
        self.changes += 1;
        if self.problem.is_none() {
            self.problem = Some((invariant, detail));
        }
    }

    fn rid(&mut self) -> u64 {
        self.next_rid += 1;
        self.next_rid
    }

    fn failure(&self, invariant: &'static str, detail: String) -> HaFailure {
        HaFailure {
            seed: self.seed,
            broken: self.broken,
            invariant,
            detail,
            now_ms: self.now,
            trace: self
                .trace
                .as_ref()
                .map(|t| t.iter().cloned().collect())
                .unwrap_or_default(),
        }
    }
}

/// Decisions by attempt (attempts are below `ATTEMPTS`): a flat table, since the oracle
/// builds several after every step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Decided(Vec<Option<bool>>);

impl Default for Decided {
    fn default() -> Self {
        Decided(vec![None; ATTEMPTS as usize])
    }
}

impl Decided {
    fn get(&self, attempt: u64) -> Option<bool> {
        self.0.get(attempt as usize).copied().flatten()
    }

    fn set(&mut self, attempt: u64, commit: bool) {
        if let Some(slot) = self.0.get_mut(attempt as usize) {
            *slot = Some(commit);
        }
    }

    fn iter(&self) -> impl Iterator<Item = (u64, bool)> + '_ {
        (0..)
            .zip(self.0.iter())
            .filter_map(|(a, c)| c.map(|c| (a, c)))
    }
}

/// The decisions a log holds, or the first attempt it holds two different decisions for.
fn decisions<'a>(log: impl IntoIterator<Item = &'a Rec>) -> Result<Decided, u64> {
    let mut out = Decided::default();
    for rec in log {
        if let Rec::Decision { attempt, commit } = *rec {
            match out.get(attempt) {
                Some(before) if before != commit => return Err(attempt),
                _ => out.set(attempt, commit),
            }
        }
    }
    Ok(out)
}

/// The highest epoch a log holds (0 for none).
fn last_epoch<'a>(log: impl IntoIterator<Item = &'a Rec>) -> u64 {
    log.into_iter()
        .filter_map(|r| match r {
            Rec::Epoch(e) => Some(*e),
            Rec::Decision { .. } => None,
        })
        .max()
        .unwrap_or(0)
}
