//! Replication of the log directory (issue 27): a real `Wal` on a `MirroredStorage` whose mirror
//! applies every batch to `Replica`s; promoted, a replica opens with plain `Wal::open` and
//! recovers exactly what the leader acknowledged.

mod support;

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use support::{encode_history, full_history, payload, small_segments};
use wal::sim::{SimStorage, Unsynced};
use wal::{
    BaseBackup, Durability, FileOp, FileStorage, Mirror, MirroredStorage, OpBatch, RecordType,
    Replica, ReplicaError, ShipWaiter, Storage, Wal, WalError, WalOptions,
};

#[derive(Debug, Default)]
struct Followers {
    replicas: Vec<Replica>,
    /// Every batch shipped, for followers that join late.
    history: Vec<OpBatch>,
    /// The first op of the next batch: batches must come in op order, without a gap.
    next_op: u64,
}

/// Applies each batch to every replica in the waiter (through the wire encoding), as a follower
/// would before confirming.
#[derive(Debug, Clone, Default)]
struct ApplyMirror {
    followers: Arc<Mutex<Followers>>,
    fail: Arc<AtomicBool>,
}

impl Mirror for ApplyMirror {
    fn ship(&self, batch: OpBatch) -> ShipWaiter {
        let followers = Arc::clone(&self.followers);
        let fail = self.fail.load(Ordering::SeqCst);
        let bytes = batch.encode();
        Box::new(move || {
            if fail {
                return Err(io::Error::other("follower unreachable"));
            }
            let batch = OpBatch::decode(&bytes).map_err(io::Error::other)?;
            let mut followers = followers.lock().unwrap();
            let expected = followers.next_op.max(1);
            if batch.first != expected || batch.ops.is_empty() {
                return Err(io::Error::other(format!(
                    "batch at {} with {} ops, expected a non-empty one at {expected}",
                    batch.first,
                    batch.ops.len()
                )));
            }
            followers.next_op = batch.first + batch.ops.len() as u64;
            for replica in &mut followers.replicas {
                replica.apply(&batch).map_err(io::Error::other)?;
            }
            followers.history.push(batch);
            Ok(())
        })
    }
}

impl ApplyMirror {
    /// A follower joins: installs `backup`, catches up on the batches shipped since (a straddled
    /// one included), then takes every later batch.
    fn join(&self, dir: PathBuf, backup: &BaseBackup) {
        let mut replica = Replica::new(dir);
        replica
            .install(&BaseBackup::decode(&backup.encode()).unwrap())
            .unwrap();
        let mut followers = self.followers.lock().unwrap();
        for batch in &followers.history {
            replica.apply(batch).unwrap();
        }
        assert_eq!(replica.next_op(), Some(followers.next_op.max(1)));
        followers.replicas.push(replica);
    }

    /// The followers leave (as at a failover): later batches no longer reach them.
    fn take(&self) -> Vec<Replica> {
        std::mem::take(&mut self.followers.lock().unwrap().replicas)
    }
}

/// Name and content of every file, sorted.
fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().into_string().unwrap(),
                fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    out.sort();
    out
}

/// Appends record `history.len() + 1` with the given durability; waits for forced ones.
fn append(log: &Wal, history: &mut Vec<Vec<u8>>, durability: Durability) {
    let seq = history.len() as u64 + 1;
    let p = payload(seq, 40 + (seq % 50) as usize);
    history.push(p.clone());
    let ticket = log.submit(RecordType(1), p, durability);
    assert_eq!(ticket.wait_blocking().unwrap(), seq);
}

/// Forced and lazy appends, checkpoints of both kinds and segment rolls, with a second follower
/// joining from a base backup taken on another thread mid-run; ends with a forced append.
/// Returns the history and the last snapshot.
fn run_leader(
    log: &Wal,
    storage: &Arc<MirroredStorage>,
    mirror: &ApplyMirror,
    late: PathBuf,
) -> (Vec<Vec<u8>>, Vec<u8>) {
    let (go, ready) = mpsc::channel::<()>();
    let backup_thread = {
        let storage = Arc::clone(storage);
        let mirror = mirror.clone();
        std::thread::spawn(move || {
            ready.recv().unwrap();
            // Appends carry on meanwhile.
            let backup = storage.base_backup().unwrap();
            mirror.join(late, &backup);
            backup.next_op
        })
    };
    let mut history = Vec::new();
    let mut snapshot = Vec::new();
    for i in 1..=600u64 {
        let durability = if i % 3 == 0 {
            Durability::Forced
        } else {
            Durability::Lazy
        };
        append(log, &mut history, durability);
        if i == 150 {
            go.send(()).unwrap();
        }
        if i % 97 == 0 {
            snapshot = encode_history(&history);
            let ticket = if i % 2 == 0 {
                log.checkpoint(snapshot.clone())
            } else {
                let copy = snapshot.clone();
                log.checkpoint_with(move || Ok(copy))
            };
            assert_eq!(ticket.wait_blocking().unwrap(), i);
        }
    }
    let backup_point = backup_thread.join().unwrap();
    assert!(backup_point > 1, "the backup was taken mid-run");
    append(log, &mut history, Durability::Forced);
    (history, snapshot)
}

#[test]
fn a_replica_of_a_real_log_recovers_exactly_what_the_leader_acknowledged() {
    let tmp = tempfile::tempdir().unwrap();
    let leader = tmp.path().join("leader");
    let (early, late) = (tmp.path().join("early"), tmp.path().join("late"));
    fs::create_dir_all(&leader).unwrap();
    let mirror = ApplyMirror::default();
    let storage = MirroredStorage::new(
        Arc::new(FileStorage),
        leader.clone(),
        Arc::new(mirror.clone()),
    );
    mirror.join(early.clone(), &storage.base_backup().unwrap());
    let (log, _) = Wal::open_with_storage(storage.clone(), &leader, small_segments(2048)).unwrap();

    let (history, snapshot) = run_leader(&log, &storage, &mirror, late.clone());
    let stats = log.stats();
    assert!(stats.checkpoints >= 6 && stats.dir_fsyncs > 10, "{stats:?}");

    // Failover at this instant: the followers hold what the leader acknowledged, byte for byte.
    let replicas = mirror.take();
    assert_eq!(replicas.len(), 2);
    let leader_files = files(&leader);
    assert!(leader_files.iter().any(|(n, _)| n.ends_with(".snap")));
    for dir in [&early, &late] {
        assert_eq!(files(dir), leader_files, "{}", dir.display());
    }
    log.close();
    let (_, leader_recovery) = Wal::open(&leader, WalOptions::default()).unwrap();
    for dir in [&early, &late] {
        let (promoted, recovery) = Wal::open(dir, WalOptions::default()).unwrap();
        assert_eq!(recovery.snapshot.as_deref(), Some(&snapshot[..]));
        assert_eq!(full_history(&recovery), history);
        assert_eq!(recovery, leader_recovery);
        assert!(recovery.torn_tail.is_none());
        // The promoted copy is an ordinary log: it takes the next record.
        let next = promoted
            .submit(
                RecordType(1),
                b"after failover".to_vec(),
                Durability::Forced,
            )
            .wait_blocking()
            .unwrap();
        assert_eq!(next, history.len() as u64 + 1);
    }
}

#[test]
fn on_the_simulated_disk_a_replica_holds_every_acknowledged_record_after_a_power_loss() {
    let tmp = tempfile::tempdir().unwrap();
    let sim = SimStorage::new();
    let leader = PathBuf::from(support::DIR);
    sim.create_dir_all(&leader).unwrap();
    let mirror = ApplyMirror::default();
    let storage = MirroredStorage::new(
        Arc::new(sim.clone()),
        leader.clone(),
        Arc::new(mirror.clone()),
    );
    mirror.join(tmp.path().join("early"), &storage.base_backup().unwrap());
    let (log, _) = Wal::open_with_storage(storage.clone(), &leader, small_segments(2048)).unwrap();
    let (mut history, _) = run_leader(&log, &storage, &mirror, tmp.path().join("late"));
    let acknowledged = history.len();
    // Lazy records after the last forced one: written, never synced, never shipped.
    for _ in 0..5 {
        append(&log, &mut history, Durability::Lazy);
    }
    // Failover: the followers leave and the leader loses power. (Had they stayed, the close
    // below would have shipped the lazy records to them before failing its own sync: followers
    // may hold more than the leader's disk, never less.)
    let replicas = mirror.take();
    sim.crash(Unsynced::Drop);
    drop(log);
    sim.reboot();
    let (_, leader_recovery) = support::open(&sim, WalOptions::default()).unwrap();
    // A lazy record may have been synced (and shipped) by a segment roll after the last forced
    // one; none can be lost before it.
    let survived = full_history(&leader_recovery);
    assert!(
        survived.len() >= acknowledged,
        "{} < {acknowledged}",
        survived.len()
    );
    assert!(
        survived[..] == history[..survived.len()],
        "a prefix of the history"
    );
    assert_eq!(replicas.len(), 2);
    for replica in replicas {
        let (_, recovery) = Wal::open(replica.dir(), WalOptions::default()).unwrap();
        let replicated = full_history(&recovery);
        assert_eq!(replicated.len(), survived.len());
        assert!(
            replicated == survived,
            "the replica holds what the leader's disk held"
        );
        assert_eq!(recovery.snapshot, leader_recovery.snapshot);
    }
}

#[test]
fn a_batch_the_mirror_does_not_confirm_fails_the_forced_append_and_poisons_the_log() {
    let sim = SimStorage::new();
    let leader = PathBuf::from(support::DIR);
    let mirror = ApplyMirror::default();
    let storage = MirroredStorage::new(
        Arc::new(sim.clone()),
        leader.clone(),
        Arc::new(mirror.clone()),
    );
    let (log, _) = Wal::open_with_storage(storage.clone(), &leader, WalOptions::default()).unwrap();
    let mut history = Vec::new();
    append(&log, &mut history, Durability::Forced);

    mirror.fail.store(true, Ordering::SeqCst);
    let failed = log
        .submit(RecordType(1), b"unconfirmed".to_vec(), Durability::Forced)
        .wait_blocking();
    let Err(WalError::Io { source, .. }) = &failed else {
        panic!("{failed:?}")
    };
    assert!(
        source.to_string().contains("follower unreachable"),
        "{source}"
    );
    assert!(log.is_poisoned());
    mirror.fail.store(false, Ordering::SeqCst);
    assert!(matches!(
        log.submit(RecordType(1), b"later".to_vec(), Durability::Forced)
            .wait_blocking(),
        Err(WalError::Poisoned { .. })
    ));
    // The storage takes nothing more either: no sync after a failed one, no backup of a
    // directory the stream may no longer describe.
    assert!(storage.base_backup().is_err());
    assert!(storage.create(&leader.join("x")).is_err());
}

/// Records what the simulated disk had synced when the mirror was called and when it was waited.
#[derive(Debug)]
struct Timing {
    sim: SimStorage,
    seen: Arc<Mutex<Vec<(&'static str, u64)>>>,
}

impl Mirror for Timing {
    fn ship(&self, _: OpBatch) -> ShipWaiter {
        let syncs = |sim: &SimStorage| sim.stats().file_syncs + sim.stats().dir_syncs;
        self.seen.lock().unwrap().push(("ship", syncs(&self.sim)));
        let (sim, seen) = (self.sim.clone(), Arc::clone(&self.seen));
        Box::new(move || {
            seen.lock().unwrap().push(("wait", syncs(&sim)));
            Ok(())
        })
    }
}

#[test]
fn a_sync_ships_before_its_local_sync_and_waits_after_it() {
    let sim = SimStorage::new();
    let dir = PathBuf::from(support::DIR);
    sim.create_dir_all(&dir).unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mirror = Timing {
        sim: sim.clone(),
        seen: Arc::clone(&seen),
    };
    let storage = MirroredStorage::new(Arc::new(sim.clone()), dir.clone(), Arc::new(mirror));
    let mut file = storage.create(&dir.join("a")).unwrap();
    file.append(b"x").unwrap();
    file.sync_data().unwrap();
    // A sync point with nothing recorded since the last one ships nothing.
    file.sync_data().unwrap();
    storage.sync_dir(&dir).unwrap();
    assert_eq!(*seen.lock().unwrap(), vec![("ship", 0), ("wait", 1)]);
}

/// A storage whose mirror keeps the batches, for driving ops by hand.
fn recording(dir: &Path) -> (Arc<MirroredStorage>, ApplyMirror) {
    fs::create_dir_all(dir).unwrap();
    let mirror = ApplyMirror::default();
    let storage = MirroredStorage::new(
        Arc::new(FileStorage),
        dir.to_path_buf(),
        Arc::new(mirror.clone()),
    );
    (storage, mirror)
}

#[test]
fn a_batch_straddling_the_backup_point_applies_only_the_ops_after_it() {
    let tmp = tempfile::tempdir().unwrap();
    let leader = tmp.path().join("leader");
    let (storage, mirror) = recording(&leader);
    let mut file = storage.create(&leader.join("a")).unwrap();
    file.append(b"x").unwrap();
    // Ops 1 (create) and 2 (append x) are in the backup but not shipped yet.
    let backup = storage.base_backup().unwrap();
    assert_eq!(backup.next_op, 3);
    assert_eq!(backup.files, vec![("a".to_string(), b"x".to_vec())]);
    file.append(b"y").unwrap();
    file.sync_data().unwrap();
    let batch = mirror.followers.lock().unwrap().history[0].clone();
    assert_eq!(batch.first, 1);
    assert_eq!(batch.ops.len(), 3);

    let mut replica = Replica::new(tmp.path().join("replica"));
    replica.install(&backup).unwrap();
    replica.apply(&batch).unwrap();
    assert_eq!(replica.next_op(), Some(4));
    assert_eq!(fs::read(replica.dir().join("a")).unwrap(), b"xy");
    // Seen again (a resend): every op is below next_op, nothing changes.
    replica.apply(&batch).unwrap();
    assert_eq!(fs::read(replica.dir().join("a")).unwrap(), b"xy");
}

#[test]
fn a_gap_is_refused_and_a_failed_apply_needs_a_new_backup() {
    let tmp = tempfile::tempdir().unwrap();
    let mut replica = Replica::new(tmp.path().join("replica"));
    let create = |first, name: &str| OpBatch {
        first,
        ops: vec![FileOp::Create { name: name.into() }],
    };
    assert!(matches!(
        replica.apply(&create(1, "a")),
        Err(ReplicaError::NeedsBackup)
    ));
    replica
        .install(&BaseBackup {
            next_op: 5,
            files: vec![],
        })
        .unwrap();
    assert!(matches!(
        replica.apply(&create(7, "a")),
        Err(ReplicaError::Gap {
            expected: 5,
            got: 7
        })
    ));
    assert_eq!(replica.next_op(), Some(5), "a refused gap changes nothing");
    let escape = OpBatch {
        first: 5,
        ops: vec![FileOp::Create {
            name: "../escape".into(),
        }],
    };
    assert!(matches!(
        replica.apply(&escape),
        Err(ReplicaError::InvalidBatch { .. })
    ));
    assert!(!tmp.path().join("escape").exists());
    assert_eq!(
        replica.next_op(),
        Some(5),
        "a refused batch changes nothing"
    );
    let missing = OpBatch {
        first: 5,
        ops: vec![FileOp::Append {
            name: "missing".into(),
            bytes: b"x".to_vec(),
        }],
    };
    let failed = replica.apply(&missing).unwrap_err();
    assert!(
        matches!(failed, ReplicaError::Apply { op: 5, .. }),
        "{failed}"
    );
    assert!(matches!(
        replica.apply(&create(5, "a")),
        Err(ReplicaError::NeedsBackup)
    ));
}

#[test]
fn ops_follow_renames_and_removes_of_open_files_and_refuse_other_directories() {
    let tmp = tempfile::tempdir().unwrap();
    let leader = tmp.path().join("leader");
    let (storage, mirror) = recording(&leader);
    let mut replica = Replica::new(tmp.path().join("replica"));
    replica.install(&storage.base_backup().unwrap()).unwrap();
    mirror.followers.lock().unwrap().replicas.push(replica);

    let mut tmp_file = storage.create(&leader.join("s.tmp")).unwrap();
    tmp_file.append(b"snap").unwrap();
    storage
        .rename(&leader.join("s.tmp"), &leader.join("s.snap"))
        .unwrap();
    // Still open: the append lands in the renamed file, and is recorded under its new name.
    tmp_file.append(b"!").unwrap();
    let mut gone = storage.create(&leader.join("gone")).unwrap();
    storage.remove(&leader.join("gone")).unwrap();
    // A removed file is no longer in the directory: nothing to record.
    gone.append(b"lost").unwrap();
    storage.truncate(&leader.join("s.snap"), 4).unwrap();
    storage.sync_dir(&leader).unwrap();

    let outside = tmp.path().join("elsewhere");
    let before = storage.next_op();
    let refused = storage.create(&outside).unwrap_err();
    assert_eq!(refused.kind(), io::ErrorKind::InvalidInput);
    assert!(storage.rename(&leader.join("s.snap"), &outside).is_err());
    assert_eq!(storage.next_op(), before, "nothing recorded");
    assert!(!outside.exists());

    let replica = mirror.take().pop().unwrap();
    assert_eq!(files(replica.dir()), files(&leader));
    assert_eq!(
        files(replica.dir()),
        vec![("s.snap".to_string(), b"snap".to_vec())]
    );
}

#[test]
fn a_long_run_of_unsynced_appends_ships_early_in_bounded_batches() {
    let sim = SimStorage::new();
    let dir = PathBuf::from(support::DIR);
    sim.create_dir_all(&dir).unwrap();
    let mirror = ApplyMirror::default();
    let storage =
        MirroredStorage::new(Arc::new(sim.clone()), dir.clone(), Arc::new(mirror.clone()));
    let mut file = storage.create(&dir.join("big")).unwrap();
    let chunk = vec![7u8; 9 * 1024 * 1024];
    for _ in 0..8 {
        file.append(&chunk).unwrap();
    }
    let followers = mirror.followers.lock().unwrap();
    assert_eq!(sim.stats().file_syncs, 0);
    assert_eq!(followers.history.len(), 1, "shipped without a sync point");
    let encoded = followers.history[0].encode();
    assert!(
        OpBatch::decode(&encoded).is_ok(),
        "within the decoder's bound"
    );
    for op in &followers.history[0].ops {
        if let FileOp::Append { bytes, .. } = op {
            assert!(bytes.len() <= 8 * 1024 * 1024);
        }
    }
}
