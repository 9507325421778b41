//! The leader's side of the group: a won term (`epoch_for_term`, the epoch record first),
//! clients' decisions, sync points (fsync, base backups and shipped records, wait for the
//! sync set), the time-out that removes silent sync members by a CAS guarded by the leader
//! key (`after_sync`), or poisons and exits when it fails, the add of a caught-up follower
//! (marked in sync locally before its CAS), the acknowledgement of records (participants hear
//! them) and the client answers, behind `lease_holds`.
//!
//! There is no lease watchdog: a leader leads until etcd says its lease is gone, an etcd
//! call times out, or a CAS fails. Safety must not rest on timing; only client answers do.
//! It never acknowledges a record that some member of the sync set has not confirmed, unless
//! a guarded removal took that member out first (the test-only `HaBroken` switches aside).

use std::collections::{BTreeMap, BTreeSet};

use coordinator::ha::rules::{self, AfterSync, GroupState};

use super::calls::Purpose;
use super::etcd::{Cmp, Entry, Key, LeaseId, Op, Put, Value};
use super::net::Msg;
use super::{HaBroken, MARGIN_MS, Rec, SYNC_TIMEOUT_MS, World, decisions, last_epoch, name};

/// A follower's stream: its id (a base backup starts it) and what it confirmed.
#[derive(Debug, Clone, Copy)]
pub struct Stream {
    pub id: u64,
    pub confirmed: usize,
}

/// The sync point waiting for confirmations: records `..upto`, from `required`.
#[derive(Debug, Clone)]
pub struct SyncPoint {
    pub upto: usize,
    pub required: BTreeSet<usize>,
    pub started: u64,
}

#[derive(Debug)]
pub struct Lead {
    pub term: u64,
    pub epoch: u64,
    /// The create revision of the leader key this term created (the removal's guard), and
    /// the lease that key is held by.
    pub key_rev: u64,
    pub lease: LeaseId,
    /// The state's mod revision as this leader last wrote it.
    pub state_rev: u64,
    /// The sync set as in etcd, and the followers marked in sync before their add CAS.
    pub sync: BTreeSet<usize>,
    pub marked: BTreeSet<usize>,
    pub streams: BTreeMap<usize, Stream>,
    pub pending: Option<SyncPoint>,
    /// Records `..acked` are acknowledged.
    pub acked: usize,
    pub established: bool,
    /// Attempts clients wait on.
    pub waiting: Vec<u64>,
}

#[derive(Debug, Clone, Copy)]
enum Task {
    Timeout,
    Sync,
    Add,
}

impl World {
    /// The campaign won: the epoch record goes first, the sync set starts empty.
    pub(super) fn start_term(&mut self, i: usize, term: u64, revision: u64, lease: LeaseId) {
        self.changes += 1;
        let node = &mut self.nodes[i];
        let next_after_log = last_epoch(node.log()) + 1;
        let epoch = if self.broken == HaBroken::EpochIgnoresLog {
            rules::epoch_for_term(0, term)
        } else {
            rules::epoch_for_term(next_after_log, term)
        };
        // The copy stays attached to its old stream: only the freeze keeps it still.
        node.unsynced.push(Rec::Epoch(epoch));
        node.lead = Some(Lead {
            term,
            epoch,
            key_rev: revision,
            lease,
            state_rev: revision,
            sync: BTreeSet::new(),
            marked: BTreeSet::new(),
            streams: BTreeMap::new(),
            pending: None,
            acked: 0,
            established: false,
            waiting: Vec::new(),
        });
        self.stats.terms += 1;
        self.note(|| format!("n{i} leads term {term} at epoch {epoch}"));
    }

    fn lease_holds(&self, i: usize) -> bool {
        let node = &self.nodes[i];
        node.lead
            .as_ref()
            .is_some_and(|l| node.lease == Some(l.lease))
            && rules::lease_holds(self.now, node.last_ka_sent, node.ttl, MARGIN_MS)
    }

    /// The leader's tasks, in a drawn order (a woken process runs whichever comes first).
    pub(super) fn leader_tick(&mut self, i: usize) {
        let mut tasks = [Task::Timeout, Task::Sync, Task::Add];
        self.rng.shuffle(&mut tasks);
        for task in tasks {
            if self.nodes[i].lead.is_none() {
                return;
            }
            match task {
                Task::Timeout => self.sync_timeout(i),
                Task::Sync => {
                    if self.rng.u32(0..3) == 0 {
                        self.sync_point(i);
                    }
                }
                Task::Add => self.add_next(i),
            }
        }
    }

    pub(super) fn on_decide(&mut self, i: usize, attempt: u64) {
        // A leader takes decisions whatever its lease (the sync set makes them safe); only
        // the answer waits for `lease_holds`.
        if self.nodes[i].lead.is_none() {
            return;
        }
        let found = self.nodes[i]
            .log()
            .enumerate()
            .find_map(|(idx, r)| match r {
                Rec::Decision { attempt: a, commit } if *a == attempt => Some((idx, *commit)),
                _ => None,
            });
        let acked = self.nodes[i].lead.as_ref().map_or(0, |l| l.acked);
        match found {
            Some((idx, commit)) if idx < acked => self.answer(i, attempt, commit),
            Some(_) => {}
            None => {
                let commit = self.rng.bool();
                self.changes += 1;
                self.nodes[i]
                    .unsynced
                    .push(Rec::Decision { attempt, commit });
            }
        }
        if let Some(lead) = &mut self.nodes[i].lead
            && found.is_none_or(|(idx, _)| idx >= acked)
        {
            lead.waiting.push(attempt);
        }
    }

    /// fsync, then ship to every follower (a base backup to those without a stream), then
    /// wait for the sync set (and the followers marked in sync).
    fn sync_point(&mut self, i: usize) {
        self.changes += 1;
        let node = &mut self.nodes[i];
        let Some(lead) = &node.lead else {
            return;
        };
        if lead.pending.is_some() {
            return;
        }
        let unsynced = std::mem::take(&mut node.unsynced);
        node.durable.extend(unsynced);
        let upto = node.durable.len();
        let epoch = lead.epoch;
        for f in 0..self.nodes.len() {
            if f == i {
                continue;
            }
            let stream = self.nodes[i]
                .lead
                .as_ref()
                .and_then(|l| l.streams.get(&f).copied());
            let len = self.nodes[i].durable.len();
            let msg = match stream {
                None => {
                    let id = self.rid();
                    if let Some(lead) = &mut self.nodes[i].lead {
                        lead.streams.insert(f, Stream { id, confirmed: 0 });
                    }
                    Msg::Backup {
                        from: i,
                        to: f,
                        epoch,
                        stream: id,
                        log: self.nodes[i].durable.clone(),
                    }
                }
                Some(s) if s.confirmed < len => Msg::Ship {
                    from: i,
                    to: f,
                    epoch,
                    stream: s.id,
                    at: s.confirmed,
                    recs: self.nodes[i].durable[s.confirmed..].to_vec(),
                },
                Some(_) => continue,
            };
            self.send(msg);
        }
        let Some(lead) = &mut self.nodes[i].lead else {
            return;
        };
        let required: BTreeSet<usize> = lead.sync.union(&lead.marked).copied().collect();
        lead.pending = Some(SyncPoint {
            upto,
            required,
            started: self.now,
        });
        if self.broken == HaBroken::AckWithoutSync {
            lead.pending = None;
            self.ack(i, upto);
        }
        self.try_complete(i);
    }

    fn try_complete(&mut self, i: usize) {
        let Some(lead) = &mut self.nodes[i].lead else {
            return;
        };
        let Some(point) = &lead.pending else {
            return;
        };
        let all = point.required.iter().all(|f| {
            lead.streams
                .get(f)
                .is_some_and(|s| s.confirmed >= point.upto)
        });
        if all {
            let upto = point.upto;
            lead.pending = None;
            self.ack(i, upto);
        }
    }

    pub(super) fn on_confirm(&mut self, i: usize, f: usize, stream: u64, len: usize) {
        let durable = self.nodes[i].durable.len();
        let Some(lead) = &mut self.nodes[i].lead else {
            return;
        };
        let Some(s) = lead.streams.get_mut(&f) else {
            return;
        };
        if s.id != stream {
            return;
        }
        s.confirmed = s.confirmed.max(len.min(durable));
        self.try_mark(i, f);
        self.try_complete(i);
    }

    pub(super) fn on_need_backup(&mut self, i: usize, f: usize, stream: u64) {
        if let Some(lead) = &mut self.nodes[i].lead
            && lead.streams.get(&f).is_some_and(|s| s.id == stream)
        {
            lead.streams.remove(&f);
        }
    }

    /// A follower that holds the whole durable log counts from the next sync point on; its
    /// add CAS follows (`add_next`), so a failure racing the add leads to a removal.
    fn try_mark(&mut self, i: usize, f: usize) {
        let durable = self.nodes[i].durable.len();
        let Some(lead) = &mut self.nodes[i].lead else {
            return;
        };
        let caught_up = lead.streams.get(&f).is_some_and(|s| s.confirmed >= durable);
        if lead.established && caught_up && !lead.sync.contains(&f) && lead.marked.insert(f) {
            self.note(|| format!("n{i} marks n{f} in sync"));
        }
    }

    fn add_next(&mut self, i: usize) {
        if self.nodes[i].wait.is_some() {
            return;
        }
        let Some(lead) = &self.nodes[i].lead else {
            return;
        };
        let Some(member) = lead.marked.iter().find(|m| !lead.sync.contains(m)).copied() else {
            return;
        };
        let mut sync = lead.sync.clone();
        sync.insert(member);
        let state = GroupState {
            term: lead.term,
            leader: name(i),
            sync: sync.iter().map(|m| name(*m)).collect(),
        };
        let op = Op::Txn {
            cmps: vec![
                Cmp::CreateRev(Key::Leader, lead.key_rev),
                Cmp::ModRev(Key::State, lead.state_rev),
            ],
            puts: vec![Put {
                key: Key::State,
                value: Value::State(state),
                lease: None,
            }],
        };
        self.call(i, op, Purpose::Add(member));
    }

    pub(super) fn on_added(&mut self, i: usize, ok: bool, revision: u64, member: usize) {
        if self.nodes[i].lead.is_none() {
            return;
        }
        if !ok {
            self.exit(i, "the add CAS failed");
            return;
        }
        let Some(lead) = &mut self.nodes[i].lead else {
            return;
        };
        lead.sync.insert(member);
        lead.state_rev = revision;
        self.stats.adds += 1;
        self.note(|| format!("n{i} added n{member} to the sync set"));
    }

    /// A sync point not confirmed in time: drop the silent members (read, then CAS).
    fn sync_timeout(&mut self, i: usize) {
        if self.nodes[i].wait.is_some() {
            return;
        }
        let Some(lead) = &self.nodes[i].lead else {
            return;
        };
        let Some(point) = &lead.pending else {
            return;
        };
        if self.now < point.started + SYNC_TIMEOUT_MS {
            return;
        }
        let names = |set: &BTreeSet<usize>| set.iter().map(|m| name(*m)).collect();
        let confirmed: BTreeSet<usize> = point
            .required
            .iter()
            .filter(|f| {
                lead.streams
                    .get(f)
                    .is_some_and(|s| s.confirmed >= point.upto)
            })
            .copied()
            .collect();
        match rules::after_sync(&names(&point.required), &names(&confirmed)) {
            AfterSync::Durable => self.try_complete(i),
            AfterSync::DropFromSync(_) => {
                let missing = point.required.difference(&confirmed).copied().collect();
                self.call(i, Op::Get, Purpose::RemoveRead(missing));
            }
        }
    }

    pub(super) fn on_remove_read(
        &mut self,
        i: usize,
        missing: BTreeSet<usize>,
        state: Option<Entry>,
    ) {
        let Some(lead) = &self.nodes[i].lead else {
            return;
        };
        let Some(Entry {
            value: Value::State(mut group),
            mod_rev,
            ..
        }) = state
        else {
            self.exit(i, "no group state to remove from");
            return;
        };
        for m in &missing {
            group.sync.remove(&name(*m));
        }
        let mut cmps = vec![Cmp::ModRev(Key::State, mod_rev)];
        if self.broken != HaBroken::UnguardedRemoval {
            // The guard: only while the key this leader created is still there.
            cmps.push(Cmp::CreateRev(Key::Leader, lead.key_rev));
        }
        let op = Op::Txn {
            cmps,
            puts: vec![Put {
                key: Key::State,
                value: Value::State(group),
                lease: None,
            }],
        };
        self.call(i, op, Purpose::Remove(missing));
    }

    pub(super) fn on_removed(
        &mut self,
        i: usize,
        ok: bool,
        revision: u64,
        missing: BTreeSet<usize>,
    ) {
        if self.nodes[i].lead.is_none() {
            return;
        }
        if !ok {
            // The pending records are never acknowledged; the log is poisoned.
            self.exit(i, "the removal CAS failed: poisoned");
            return;
        }
        let Some(lead) = &mut self.nodes[i].lead else {
            return;
        };
        for m in &missing {
            lead.sync.remove(m);
            lead.marked.remove(m);
            lead.streams.remove(m);
        }
        lead.state_rev = revision;
        // The sync point waits for the others only; it may be a later one than the time-out
        // saw (that one completed meanwhile), so it still needs their confirmations.
        if let Some(point) = &mut lead.pending {
            for m in &missing {
                point.required.remove(m);
            }
        }
        self.stats.removals += 1;
        self.note(|| format!("n{i} removed {missing:?} from the sync set"));
        self.try_complete(i);
    }

    /// Records `..upto` are acknowledged: participants hear the decisions, waiting clients
    /// get their answers, the epoch record establishes the term.
    fn ack(&mut self, i: usize, upto: usize) {
        let node = &self.nodes[i];
        let Some(lead) = &node.lead else {
            return;
        };
        let from = lead.acked.min(node.durable.len());
        let upto = upto.min(node.durable.len());
        if upto <= from {
            return;
        }
        let (term, epoch) = (lead.term, lead.epoch);
        let recs: Vec<Rec> = node.durable[from..upto].to_vec();
        for rec in recs {
            match rec {
                Rec::Decision { attempt, commit } => self.record_ack(i, attempt, commit),
                Rec::Epoch(e) if e == epoch => self.establish(i, term, e),
                Rec::Epoch(_) => {}
            }
        }
        let Some(lead) = &mut self.nodes[i].lead else {
            return;
        };
        lead.acked = upto;
        let waiting = std::mem::take(&mut lead.waiting);
        let Ok(held) = decisions(self.nodes[i].durable[..upto].iter()) else {
            return; // the oracle reports the double decision
        };
        let mut still = Vec::new();
        for attempt in waiting {
            match held.get(attempt) {
                Some(commit) => self.answer(i, attempt, commit),
                None => still.push(attempt),
            }
        }
        if let Some(lead) = &mut self.nodes[i].lead {
            lead.waiting.extend(still);
        }
        let followers: Vec<usize> = (0..self.nodes.len()).filter(|f| *f != i).collect();
        for f in followers {
            self.try_mark(i, f);
        }
    }

    fn record_ack(&mut self, i: usize, attempt: u64, commit: bool) {
        self.changes += 1;
        self.stats.acked += 1;
        match self.acked.get(attempt) {
            Some(before) if before != commit => self.flag(
                "(2) acknowledged decisions agree",
                format!(
                    "n{i} acknowledged attempt {attempt} as commit={commit}, but commit={before} \
                     was acknowledged before"
                ),
            ),
            Some(_) => {}
            None => {
                self.acked.set(attempt, commit);
            }
        }
    }

    fn establish(&mut self, i: usize, term: u64, epoch: u64) {
        if let Some((t, e)) = self.established.iter().find(|(_, e)| *e >= epoch) {
            self.flag(
                "(4) epochs strictly rise",
                format!(
                    "n{i} established epoch {epoch} for term {term}, after epoch {e} of term {t}"
                ),
            );
        }
        self.established.push((term, epoch));
        if let Some(lead) = &mut self.nodes[i].lead {
            lead.established = true;
        }
        self.note(|| format!("n{i} established epoch {epoch} (term {term})"));
    }

    /// A client hears the outcome: only while the lease surely holds.
    fn answer(&mut self, i: usize, attempt: u64, commit: bool) {
        if self.broken != HaBroken::NoLeaseCheck && !self.lease_holds(i) {
            return;
        }
        self.stats.answers += 1;
        let lease = self.nodes[i].lease;
        let holds_key = lease.is_some_and(|l| {
            self.etcd.lease_alive(l, self.now)
                && self.etcd.leader().is_some_and(|(_, held)| held == Some(l))
        });
        if !holds_key {
            self.flag(
                "(5) answers only under a live lease",
                format!(
                    "n{i} told a client attempt {attempt} commit={commit}, but its lease {lease:?} \
                     is not alive holding the leader key in etcd"
                ),
            );
        }
        self.note(|| format!("n{i} tells a client: attempt {attempt} commit={commit}"));
    }
}
