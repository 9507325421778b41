//! Seeded runs of a real `wal::Wal` on the wal crate's simulated disk (issue 5, item 4, first
//! half): the real coordinator and participant engines write their real records through it,
//! the disk crashes at a random operation (losing unsynced writes, or tearing the last write at
//! a random byte, or keeping the page cache), the log is reopened and the engine rebuilt by its
//! own replay. Each run asserts that
//! - every append that returned durable (and everything before it) is recovered, byte for
//!   byte, in order, and nothing is recovered that was not submitted;
//! - the rebuilt engine agrees with everything that was acknowledged: a coordinator decision a
//!   client heard is still that decision; a participant's acknowledged yes is still prepared
//!   (or decided), its acknowledged commits are applied once and its acknowledged aborts are
//!   not, and stock is conserved.
//!
//! Each run crashes and recovers several times on the same disk. `TWOPC_WAL_SIM_SEEDS=N` runs
//! more seeds; `TWOPC_WAL_SIM_SEED=S` replays one. Every ticket is awaited before the next
//! append, so the disk sees the same operations in the same order for a seed (the writer
//! thread's batching cannot vary).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;

use cluster::checkout::{CheckoutConfig, Order, reservation_key, sold_key, stock_key};
use coordinator::digest::Digest;
use coordinator::engine::{
    Command as CCommand, Engine as CEngine, EngineConfig as CConfig, Event as CEvent,
    Reply as CReply, WaitFor,
};
use coordinator::records::{EpochRecord, LogRecord, Snapshot as CSnapshot};
use participant::kv::KvStore;
use participant::record::Record as PRecord;
use participant::snapshot::Snapshot as PSnapshot;
use participant::{
    Command as PCommand, Engine as PEngine, EngineConfig as PConfig, Event as PEvent,
    Reply as PReply,
};
use protocol::{
    CoordinatorId, DecisionRequest, Epoch, GlobalTxId, Incarnation, Outcome, ParticipantName,
    PrepareRequest, TxId, Vote, VoteKind,
};
use wal::sim::{SimStorage, Unsynced};
use wal::{Durability, Recovery, Wal, WalOptions};

const CI_SEEDS: u64 = 150;
const CYCLES: usize = 4;

fn seeds() -> Vec<u64> {
    let var = |name: &str| std::env::var(name).ok().and_then(|v| v.trim().parse().ok());
    match var("TWOPC_WAL_SIM_SEED") {
        Some(seed) => vec![seed],
        None => (0..var("TWOPC_WAL_SIM_SEEDS").unwrap_or(CI_SEEDS)).collect(),
    }
}

fn replay_hint(test: &str, seed: u64) -> String {
    format!(
        "seed {seed}; replay with: TWOPC_WAL_SIM_SEED={seed} cargo test -p twopc-chaos-tests \
         --test wal_sim_runs {test}"
    )
}

/// What was submitted to the log and what the log acknowledged, across crashes.
#[derive(Debug, Default)]
struct Ledger {
    /// Every record submitted, by sequence number - 1 (a crash cuts the tail it lost).
    submitted: Vec<(u8, Vec<u8>)>,
    /// Checkpoint snapshots by the last sequence number they cover.
    snapshots: BTreeMap<u64, Vec<u8>>,
    /// Highest sequence number made durable by an acknowledged forced append or checkpoint.
    durable: u64,
}

impl Ledger {
    /// Checks a recovery against the ledger and cuts the ledger back to what was recovered.
    fn verify(&mut self, recovery: &Recovery, hint: &str) {
        let base = match &recovery.snapshot {
            Some(bytes) => {
                let found = self
                    .snapshots
                    .iter()
                    .rev()
                    .find(|(_, snap)| *snap == bytes)
                    .map(|(seq, _)| *seq);
                found.unwrap_or_else(|| panic!("recovered a snapshot never written ({hint})"))
            }
            None => 0,
        };
        for (i, record) in recovery.records.iter().enumerate() {
            let seq = base + 1 + i as u64;
            assert_eq!(record.seq, seq, "recovered sequence numbers ({hint})");
            let Some((record_type, payload)) = self.submitted.get(seq as usize - 1) else {
                panic!("recovered record {seq} was never submitted ({hint})");
            };
            assert_eq!(
                (record.record_type.0, &record.payload),
                (*record_type, payload),
                "record {seq} recovered with other bytes ({hint})"
            );
        }
        let last = base + recovery.records.len() as u64;
        assert!(
            last >= self.durable,
            "acknowledged-durable record {} lost: recovered up to {last} ({hint})",
            self.durable
        );
        self.submitted.truncate(last as usize);
        self.snapshots.retain(|seq, _| *seq <= last);
        self.durable = last;
    }
}

struct Disk {
    sim: SimStorage,
    dir: PathBuf,
    options: WalOptions,
}

impl Disk {
    fn new(rng: &mut fastrand::Rng, name: &str) -> Disk {
        Disk {
            sim: SimStorage::new(),
            dir: PathBuf::from(format!("/sim/{name}/wal")),
            options: WalOptions {
                segment_bytes_max: rng.u64(300..=4096),
                ..WalOptions::default()
            },
        }
    }

    fn open(&self) -> (Wal, Recovery) {
        Wal::open_with_storage(Arc::new(self.sim.clone()), &self.dir, self.options.clone())
            .unwrap_or_else(|e| panic!("reopening after a crash must succeed: {e}"))
    }

    fn arm(&self, rng: &mut fastrand::Rng) {
        let mode = match rng.u32(0..3) {
            0 => Unsynced::Drop,
            1 => Unsynced::Keep,
            _ => Unsynced::Tear { seed: rng.u64(..) },
        };
        self.sim.arm_crash(rng.u64(0..120), mode);
    }
}

/// Appends and waits; `None` once the disk crashed under it.
fn append(wal: &Wal, ledger: &mut Ledger, ty: u8, payload: Vec<u8>, forced: bool) -> Option<u64> {
    let durability = if forced {
        Durability::Forced
    } else {
        Durability::Lazy
    };
    ledger.submitted.push((ty, payload.clone()));
    let seq = wal
        .submit(wal::RecordType(ty), payload, durability)
        .wait_blocking()
        .ok()?;
    assert_eq!(
        seq as usize,
        ledger.submitted.len(),
        "sequence = submit order"
    );
    if forced {
        ledger.durable = ledger.durable.max(seq);
    }
    Some(seq)
}

fn checkpoint(wal: &Wal, ledger: &mut Ledger, snapshot: Vec<u8>) -> Option<()> {
    let covered = ledger.submitted.len() as u64;
    ledger.snapshots.insert(covered, snapshot.clone());
    // Both kinds of checkpoint, picked by something the run already decided: the owners use
    // the deferred one (encoded off their lock), tools and tests the plain one.
    let ticket = if snapshot.len().is_multiple_of(2) {
        wal.checkpoint_with(move || Ok(snapshot))
    } else {
        wal.checkpoint(snapshot)
    };
    let seq = ticket.wait_blocking().ok()?;
    assert_eq!(seq, covered);
    ledger.durable = ledger.durable.max(seq);
    Some(())
}

// ---------------------------------------------------------------- coordinator

fn names() -> Vec<ParticipantName> {
    ["inventory", "payments", "shipping"]
        .iter()
        .map(|n| ParticipantName::new(*n).unwrap())
        .collect()
}

struct Coordinator {
    engine: CEngine,
    identity: EpochRecord,
    /// What clients heard, across every crash.
    told: BTreeMap<TxId, Outcome>,
}

impl Coordinator {
    /// Executes commands like the runtime: appends in order, a decision acted on only once its
    /// forced append returned. Phase-two sends are answered at once (ack or failure).
    fn execute(
        &mut self,
        wal: &Wal,
        ledger: &mut Ledger,
        rng: &mut fastrand::Rng,
        commands: Vec<CCommand>,
    ) -> Option<()> {
        let mut follow = Vec::new();
        for command in commands {
            match command {
                CCommand::AppendLazy(record) => {
                    append(wal, ledger, record.record_type(), record.encode(), false)?;
                }
                CCommand::AppendDecision(decision) => {
                    let txid = decision.txid.clone();
                    let record = LogRecord::Decision(decision);
                    append(wal, ledger, record.record_type(), record.encode(), true)?;
                    follow.push(CEvent::DecisionDurable { txid });
                }
                CCommand::SendDecision {
                    txid, participant, ..
                } => {
                    follow.push(if rng.u32(0..4) > 0 {
                        CEvent::Acked {
                            txid,
                            participant,
                            now_ms: 2,
                        }
                    } else {
                        CEvent::DeliveryFailed {
                            txid,
                            participant,
                            error: "down".into(),
                            jitter: 0,
                        }
                    });
                }
                CCommand::ArmRetry {
                    txid, participant, ..
                } => follow.push(CEvent::RetryDue { txid, participant }),
                CCommand::Reply { reply, .. } => match reply {
                    CReply::Outcome(response) => {
                        let seen = self.told.insert(response.id.clone(), response.outcome);
                        assert!(seen.is_none_or(|s| s == response.outcome));
                    }
                    CReply::Conflict { .. }
                    | CReply::LogFailed { .. }
                    | CReply::Overloaded { .. }
                    | CReply::LookAgain
                    | CReply::Busy { .. }
                    | CReply::IndexUnavailable { .. } => {
                        panic!("unexpected reply {reply:?}")
                    }
                },
                // This model has no outcome index: ended outcomes stay staged.
                CCommand::SendPrepare { .. }
                | CCommand::ArmPrepareDeadline { .. }
                | CCommand::Archive(_) => {}
                // Nothing here refuses a message: no mark, no raise.
                CCommand::AppendForced(_) | CCommand::AppendEpoch(_) => {
                    panic!("a mark or a raise without a refusal")
                }
            }
        }
        for event in follow {
            let commands = self.engine.step(event);
            self.execute(wal, ledger, rng, commands)?;
        }
        Some(())
    }

    /// One transaction: submit, votes (some missing: the deadline aborts), decision, phase two.
    fn transaction(
        &mut self,
        wal: &Wal,
        ledger: &mut Ledger,
        rng: &mut fastrand::Rng,
        id: u64,
    ) -> Option<()> {
        let txid = TxId::new(format!("t-{id}")).unwrap();
        let parts = names();
        let commands = self.engine.step(CEvent::Submit {
            waiter: id,
            wait: WaitFor::Decision,
            txid: txid.clone(),
            digest: Digest(u128::from(id)),
            participants: parts
                .iter()
                .map(|n| (n.clone(), serde_json::json!({"ops": []})))
                .collect(),
            timeout_ms: 100,
            now_ms: 1,
            archived: None,
            archive_generation: 0,
            client: None,
        });
        self.execute(wal, ledger, rng, commands)?;
        for name in parts {
            let vote = match rng.u32(0..10) {
                0 => continue,
                1 => VoteKind::No,
                _ => VoteKind::Yes,
            };
            let commands = self.engine.step(CEvent::VoteReceived {
                txid: txid.clone(),
                participant: name,
                vote,
                reason: None,
                now_ms: 1,
            });
            self.execute(wal, ledger, rng, commands)?;
        }
        let commands = self
            .engine
            .step(CEvent::PrepareDeadline { txid, now_ms: 2 });
        self.execute(wal, ledger, rng, commands)
    }

    /// Rebuilds from a recovery as `runtime::recover_on` does.
    fn recover(
        recovery: &Recovery,
        told: BTreeMap<TxId, Outcome>,
        wal: &Wal,
        ledger: &mut Ledger,
    ) -> Option<Coordinator> {
        let snapshot = recovery
            .snapshot
            .as_deref()
            .map(|bytes| CSnapshot::decode(bytes).unwrap());
        let records: Vec<LogRecord> = recovery
            .records
            .iter()
            .map(|r| LogRecord::decode(r.seq, r.record_type.0, &r.payload).unwrap())
            .collect();
        let config = CConfig {
            retry_base_ms: 10,
            retry_max_ms: 100,
            retained_max: 100_000,
            bounds: coordinator::engine::Bounds::UNBOUNDED,
        };
        let replayed = CEngine::replay(config, snapshot, records);
        // Epochs are unique in this log (never restored), so they serve as incarnations.
        let identity = match replayed.identity {
            Some(last) => EpochRecord {
                coordinator_id: last.coordinator_id,
                epoch: last.epoch.next(),
                incarnation: Incarnation(last.epoch.next().0),
            },
            None => EpochRecord {
                coordinator_id: CoordinatorId::new("c-wal-sim").unwrap(),
                epoch: Epoch(1),
                incarnation: Incarnation(1),
            },
        };
        let coordinator = Coordinator {
            engine: replayed.engine,
            identity: identity.clone(),
            told,
        };
        // The check that matters: what a client heard survived.
        for (txid, outcome) in &coordinator.told {
            assert_eq!(
                coordinator.engine.status(txid).and_then(|s| s.outcome),
                Some(*outcome),
                "{txid}: a client heard {outcome:?}, the recovered log says otherwise"
            );
        }
        let record = LogRecord::Epoch(identity);
        append(wal, ledger, record.record_type(), record.encode(), true)?;
        Some(coordinator)
    }
}

#[test]
fn coordinator_log_survives_crashes_with_every_acknowledged_decision() {
    let (mut crashes, mut torn, mut told) = (0, 0, 0);
    for seed in seeds() {
        let hint = replay_hint("coordinator", seed);
        let mut rng = fastrand::Rng::with_seed(seed);
        let disk = Disk::new(&mut rng, "coordinator");
        let mut ledger = Ledger::default();
        let mut heard = BTreeMap::new();
        let mut next_tx = 0;
        for _ in 0..CYCLES {
            let (wal, recovery) = disk.open();
            ledger.verify(&recovery, &hint);
            torn += u32::from(recovery.torn_tail.is_some());
            disk.arm(&mut rng);
            let ran = (|| {
                let mut c = Coordinator::recover(&recovery, heard.clone(), &wal, &mut ledger)?;
                let commands = c.engine.step(CEvent::RecoveryDone {
                    now_ms: 3,
                    identity: c.identity.clone(),
                });
                let result = c.execute(&wal, &mut ledger, &mut rng, commands);
                heard = c.told.clone();
                result?;
                for _ in 0..rng.usize(1..25) {
                    next_tx += 1;
                    let result = c.transaction(&wal, &mut ledger, &mut rng, next_tx);
                    heard = c.told.clone();
                    result?;
                    if rng.u32(0..12) == 0 {
                        let snapshot = c.engine.snapshot(c.identity.clone()).encode();
                        checkpoint(&wal, &mut ledger, snapshot)?;
                    }
                }
                Some(())
            })();
            if ran.is_none() {
                assert!(
                    disk.sim.has_crashed(),
                    "an append failed without a crash ({hint})"
                );
                crashes += 1;
            }
            drop(wal);
            disk.sim.crash(Unsynced::Drop);
            disk.sim.reboot();
        }
        let (_wal, recovery) = disk.open();
        ledger.verify(&recovery, &hint);
        Coordinator::recover(&recovery, heard.clone(), &_wal, &mut ledger);
        told += heard.len();
    }
    eprintln!(
        "coordinator log: {crashes} crashes mid-run, {torn} torn tails cut, {told} decisions heard and kept"
    );
    assert!(crashes > 0 && told > 0);
}

// ---------------------------------------------------------------- participant

const SKUS: u32 = 3;
const STOCK: i64 = 8;

fn shop() -> CheckoutConfig {
    CheckoutConfig {
        skus: SKUS,
        stock_per_sku: STOCK,
        customers: 3,
        balance_per_customer: 100,
        max_quantity: 3,
        max_unit_price: 10,
    }
}

fn inventory_seed() -> KvStore {
    let (_, seed) = shop().seeds().remove(0);
    KvStore::from_seed(&serde_json::to_vec(&seed).unwrap()).unwrap()
}

fn p_config() -> PConfig {
    // This run is about the log under crashes, not lock waits: a conflicting prepare votes no
    // at once, so every prepare is answered in its own step.
    PConfig {
        lock_wait_max_ms: 0,
        ..PConfig::default()
    }
}

/// What the participant acknowledged, across crashes.
#[derive(Debug, Default)]
struct Acked {
    yes: BTreeSet<GlobalTxId>,
    committed: BTreeMap<GlobalTxId, Order>,
    aborted: BTreeSet<GlobalTxId>,
}

/// One engine step with the shell's contract: records appended in order, the reply given only
/// once every forced record of the step is durable. `None` once the disk crashed.
fn p_step(
    engine: &mut PEngine<KvStore>,
    wal: &Wal,
    ledger: &mut Ledger,
    event: PEvent,
) -> Option<Option<PReply>> {
    let mut reply = None;
    for command in engine.step(event) {
        match command {
            PCommand::Log { record, forced } => {
                append(wal, ledger, record.record_type().0, record.encode(), forced)?;
            }
            PCommand::Reply(r) => reply = Some(r),
            // Never produced: no prepare waits here (`p_config`).
            PCommand::Deliver { .. } | PCommand::AskDecision { .. } => {}
        }
    }
    Some(reply)
}

fn p_recover(
    recovery: &Recovery,
    acked: &Acked,
    orders: &BTreeMap<GlobalTxId, Order>,
) -> PEngine<KvStore> {
    let mut engine = match &recovery.snapshot {
        Some(bytes) => {
            let snapshot: PSnapshot = serde_json::from_slice(bytes).unwrap();
            PEngine::restore(p_config(), snapshot).unwrap()
        }
        None => PEngine::new(p_config(), inventory_seed()),
    };
    for r in &recovery.records {
        let record = PRecord::decode(r.seq, r.record_type, &r.payload).unwrap();
        engine.replay(record).unwrap();
    }
    let prepared: BTreeSet<GlobalTxId> =
        engine.prepared_list().into_iter().map(|p| p.gtid).collect();
    let tombstones = engine.snapshot().unwrap().tombstones;
    let decided = |gtid: &GlobalTxId| tombstones.iter().any(|t| &t.gtid == gtid);
    let store = engine.resource();
    for txid in &acked.yes {
        assert!(
            prepared.contains(txid) || decided(txid),
            "{txid}: voted yes, then forgotten by recovery"
        );
    }
    for (txid, order) in &acked.committed {
        assert!(
            !prepared.contains(txid),
            "{txid}: acked commit, prepared again"
        );
        let marker = store.get(&reservation_key(&order.id));
        assert_eq!(
            marker.map(|m| m.version),
            Some(1),
            "{txid}: acked commit applied once"
        );
    }
    for txid in &acked.aborted {
        assert!(
            !prepared.contains(txid),
            "{txid}: acked abort, prepared again"
        );
        let order = &orders[txid];
        assert!(
            store.get(&reservation_key(&order.id)).is_none(),
            "{txid}: acked abort applied"
        );
    }
    for sku in 0..SKUS {
        let int = |k: String| store.get(&k).and_then(|e| e.value.as_i64()).unwrap_or(0);
        let (stock, sold) = (int(stock_key(sku)), int(sold_key(sku)));
        assert!(
            stock >= 0 && stock + sold == STOCK,
            "sku {sku}: stock {stock} + sold {sold}"
        );
    }
    engine
}

#[test]
fn participant_log_survives_crashes_with_every_acknowledged_vote_and_ack() {
    let (mut crashes, mut torn, mut yes) = (0, 0, 0);
    let coordinator_id = CoordinatorId::new("c-1").unwrap();
    for seed in seeds() {
        let hint = replay_hint("participant", seed);
        let mut rng = fastrand::Rng::with_seed(seed);
        let disk = Disk::new(&mut rng, "inventory");
        let mut ledger = Ledger::default();
        let mut acked = Acked::default();
        let mut orders: BTreeMap<GlobalTxId, Order> = BTreeMap::new();
        let mut next = 0;
        for cycle in 0..CYCLES {
            let (wal, recovery) = disk.open();
            ledger.verify(&recovery, &hint);
            torn += u32::from(recovery.torn_tail.is_some());
            let mut engine = p_recover(&recovery, &acked, &orders);
            disk.arm(&mut rng);
            let epoch = Epoch(cycle as u64 + 1);
            // One coordinator run per epoch, as a coordinator that is never restored has.
            let incarnation = Incarnation(epoch.0);
            let ran = (|| {
                if recovery.snapshot.is_none() && recovery.records.is_empty() {
                    // First start: the seed becomes durable first, as `Participant::open` does.
                    checkpoint(
                        &wal,
                        &mut ledger,
                        serde_json::to_vec(&engine.snapshot().unwrap()).unwrap(),
                    )?;
                }
                for _ in 0..rng.usize(1..30) {
                    let prepared: Vec<(TxId, GlobalTxId)> = engine
                        .prepared_list()
                        .into_iter()
                        .map(|p| (p.txid, p.gtid))
                        .collect();
                    if !prepared.is_empty() && rng.bool() {
                        let (txid, gtid) = prepared[rng.usize(0..prepared.len())].clone();
                        let request = DecisionRequest {
                            txid,
                            gtid: gtid.clone(),
                            coordinator_id: coordinator_id.clone(),
                            epoch,
                            incarnation,
                        };
                        let commit = rng.u32(0..3) > 0;
                        let event = if commit {
                            PEvent::Commit { request, now_ms: 2 }
                        } else {
                            PEvent::Abort { request, now_ms: 2 }
                        };
                        if let Some(PReply::Ack) = p_step(&mut engine, &wal, &mut ledger, event)? {
                            if commit {
                                acked.committed.insert(gtid.clone(), orders[&gtid].clone());
                            } else {
                                acked.aborted.insert(gtid.clone());
                            }
                        }
                        continue;
                    }
                    next += 1;
                    let order = shop().order("o", next, &mut rng);
                    let txid = TxId::new(order.id.clone()).unwrap();
                    let gtid = GlobalTxId::compose(&coordinator_id, incarnation, next);
                    let payload = serde_json::to_value(&order.payloads()[0].1).unwrap();
                    orders.insert(gtid.clone(), order);
                    let event = PEvent::Prepare {
                        request: PrepareRequest {
                            txid,
                            gtid: gtid.clone(),
                            coordinator_id: coordinator_id.clone(),
                            epoch,
                            incarnation,
                            position: next,
                            payload,
                            started_at_ms: None,
                            lock_wait_ms: None,
                            participants: None,
                        },
                        now_ms: 1,
                        waiter: next,
                    };
                    if let Some(PReply::Vote(Vote::Yes)) =
                        p_step(&mut engine, &wal, &mut ledger, event)?
                    {
                        acked.yes.insert(gtid);
                    }
                    if rng.u32(0..15) == 0 {
                        checkpoint(
                            &wal,
                            &mut ledger,
                            serde_json::to_vec(&engine.snapshot().unwrap()).unwrap(),
                        )?;
                    }
                }
                Some(())
            })();
            if ran.is_none() {
                assert!(
                    disk.sim.has_crashed(),
                    "an append failed without a crash ({hint})"
                );
                crashes += 1;
            }
            drop(wal);
            disk.sim.crash(Unsynced::Drop);
            disk.sim.reboot();
        }
        let (_wal, recovery) = disk.open();
        ledger.verify(&recovery, &hint);
        p_recover(&recovery, &acked, &orders);
        yes += acked.yes.len();
    }
    eprintln!(
        "participant log: {crashes} crashes mid-run, {torn} torn tails cut, {yes} yes votes kept"
    );
    assert!(crashes > 0 && yes > 0);
}

#[test]
fn a_decision_record_is_only_acknowledged_once_synced() {
    // The premise of the runs above, on the simulated disk directly: a forced append that
    // returned survives a power loss; a lazy one that returned may not.
    let sim = SimStorage::new();
    let dir = PathBuf::from("/sim/premise/wal");
    let open =
        || Wal::open_with_storage(Arc::new(sim.clone()), &dir, WalOptions::default()).unwrap();
    let (wal, _) = open();
    let decision = LogRecord::Epoch(EpochRecord {
        coordinator_id: CoordinatorId::new("c").unwrap(),
        epoch: Epoch(1),
        incarnation: Incarnation(1),
    });
    let ty = wal::RecordType(decision.record_type());
    wal.submit(ty, decision.encode(), Durability::Forced)
        .wait_blocking()
        .unwrap();
    wal.submit(ty, decision.encode(), Durability::Lazy)
        .wait_blocking()
        .unwrap();
    sim.crash(Unsynced::Drop);
    drop(wal);
    sim.reboot();
    let (_wal, recovery) = open();
    assert_eq!(recovery.records.len(), 1);
}

#[test]
fn the_ledger_check_fails_when_an_acknowledged_record_is_missing_or_altered() {
    let record = |seq: u64, payload: &[u8]| wal::Record {
        seq,
        record_type: wal::RecordType(1),
        payload: payload.to_vec(),
    };
    let ledger = || Ledger {
        submitted: vec![(1, b"a".to_vec()), (1, b"b".to_vec()), (1, b"c".to_vec())],
        snapshots: BTreeMap::new(),
        durable: 2,
    };
    let recovered = |records: Vec<wal::Record>| Recovery {
        records,
        ..Recovery::default()
    };
    // Losing the unsynced third record is allowed, and the ledger forgets it.
    let mut ok = ledger();
    ok.verify(&recovered(vec![record(1, b"a"), record(2, b"b")]), "ok");
    assert_eq!(ok.submitted.len(), 2);
    for bad in [
        vec![record(1, b"a")],
        vec![record(1, b"a"), record(2, b"x")],
        vec![
            record(1, b"a"),
            record(2, b"b"),
            record(3, b"c"),
            record(4, b"d"),
        ],
    ] {
        let result = std::panic::catch_unwind(|| ledger().verify(&recovered(bad.clone()), "bad"));
        assert!(result.is_err(), "{bad:?} must fail the check");
    }
}
