//! The leader's side of replication: `wal::Mirror` for the log (every sync point's file
//! operations go to every streaming follower while the local fsync runs, and the sync returns
//! only once each of them answered or was dropped), the outcome index's batches, and
//! attaching followers (a base backup of the log and the index, then the operations queued
//! meanwhile, then the sync set in etcd).
//!
//! The order that keeps acknowledged records safe (docs/ha.md): a follower is marked in sync
//! here *before* the compare-and-swap that adds it in etcd, and a failed follower that is
//! marked in sync is taken out in etcd (under the same lock, so after any add in flight)
//! *before* the sync point it failed is acknowledged. Both read and change the mark under one
//! lock, so no sync point slips between a detach and an add.
//!
//! Must never: acknowledge a sync point a member of the sync set did not confirm while it is
//! still a member; follow a follower's redirect; block the writer thread longer than the
//! replica timeout plus one etcd round trip per failed member.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use tracing::{info, warn};

use wal::{Mirror, MirroredStorage, OpBatch};

use super::etcd_group::{EtcdGroup, SyncChange};
use super::rules::Member;
use crate::http_client::Endpoint;
use crate::outcomes::OutcomeStore;
use crate::records::Retained;

/// Routes a follower serves.
pub mod routes {
    pub const BACKUP: &str = "/v1/replica/backup";
    pub const OPS: &str = "/v1/replica/ops";
    pub const OUTCOMES: &str = "/v1/replica/outcomes";
}

/// Outcomes per message of an index backup.
const INDEX_PAGE: usize = 1_000;

#[derive(Debug)]
enum Stage {
    /// Attaching: sync points are queued until the base backup is in.
    Joining {
        queue: Vec<OpBatch>,
    },
    Streaming,
}

#[derive(Debug)]
struct Follower {
    endpoint: Arc<Endpoint>,
    /// Every file-operation message to this follower goes out under it, in order: the
    /// catch-up of a join holds it from the moment the follower streams until the queued
    /// sync points are in, so the sync points after them wait behind it.
    send_lock: Arc<tokio::sync::Mutex<()>>,
    stage: Stage,
    /// Counted in the sync set (here first, then in etcd).
    in_sync: bool,
    generation: u64,
}

/// A message on its way to one follower: its name, its attach generation, the send.
type Sending = (String, u64, tokio::task::JoinHandle<Result<(), String>>);

/// Counters for `/metrics` and `/v1/group`.
#[derive(Debug, Default)]
pub struct MirrorStats {
    pub sync_points: AtomicU64,
    pub followers_dropped: AtomicU64,
    pub followers_attached: AtomicU64,
}

/// What the writer thread needs to call the followers and etcd.
#[derive(Debug)]
struct Inner {
    runtime: tokio::runtime::Handle,
    term: u64,
    group: EtcdGroup,
    claim_revision: i64,
    timeout: Duration,
    keys: protocol::auth::KeyRing,
    tls: Option<Arc<rustls::ClientConfig>>,
    followers: Mutex<BTreeMap<String, Follower>>,
    next_generation: AtomicU64,
    /// Serialises sync-set changes in etcd: a removal waits for an add in flight.
    sync_lock: tokio::sync::Mutex<()>,
    /// Held by an attach for its whole join, and by the archiver around each batch, so an
    /// index backup and the batches after it neither overlap nor leave a gap.
    archive_gate: tokio::sync::Mutex<()>,
    storage: OnceLock<Arc<MirroredStorage>>,
    /// Whose log this is (sent with every base backup: a follower holding another
    /// coordinator's log refuses it rather than lose that history).
    coordinator_id: OnceLock<String>,
    outcomes: OnceLock<(Arc<OutcomeStore>, u64)>,
    stats: MirrorStats,
}

/// The leader's replication (one per term).
#[derive(Debug, Clone)]
pub struct GroupMirror {
    inner: Arc<Inner>,
}

/// Why replication of the outcome index failed.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ReplicationError(String);

impl GroupMirror {
    pub fn new(
        group: EtcdGroup,
        term: u64,
        claim_revision: i64,
        timeout: Duration,
        keys: protocol::auth::KeyRing,
        tls: Option<Arc<rustls::ClientConfig>>,
    ) -> GroupMirror {
        GroupMirror {
            inner: Arc::new(Inner {
                runtime: tokio::runtime::Handle::current(),
                term,
                group,
                claim_revision,
                timeout,
                keys,
                tls,
                followers: Mutex::new(BTreeMap::new()),
                next_generation: AtomicU64::new(1),
                sync_lock: tokio::sync::Mutex::new(()),
                archive_gate: tokio::sync::Mutex::new(()),
                storage: OnceLock::new(),
                coordinator_id: OnceLock::new(),
                outcomes: OnceLock::new(),
                stats: MirrorStats::default(),
            }),
        }
    }

    /// The storage the leader's log runs on (made with this mirror).
    pub fn set_storage(&self, storage: Arc<MirroredStorage>) {
        let _ = self.inner.storage.set(storage);
    }

    /// Whose log this is, once recovery read it.
    pub fn set_coordinator_id(&self, id: &str) {
        let _ = self.inner.coordinator_id.set(id.to_string());
    }

    /// The outcome index, once recovery opened it, with the retention window.
    pub fn set_outcomes(&self, outcomes: Arc<OutcomeStore>, retention_ms: u64) {
        let _ = self.inner.outcomes.set((outcomes, retention_ms));
    }

    pub fn term(&self) -> u64 {
        self.inner.term
    }

    pub fn stats(&self) -> &MirrorStats {
        &self.inner.stats
    }

    /// Followers attached now, and which of them count in the sync set.
    pub fn followers(&self) -> Vec<(String, bool, bool)> {
        self.inner
            .lock()
            .iter()
            .map(|(node, f)| (node.clone(), matches!(f.stage, Stage::Streaming), f.in_sync))
            .collect()
    }

    /// Held by the archiver around writing and replicating one batch.
    pub async fn archive_gate(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.inner.archive_gate.lock().await
    }

    /// Sends archived outcomes to every streaming follower; a member of the sync set that
    /// does not take them is dropped from the set first. Err: the batch must not be counted
    /// as archived (the archiver keeps it and tries again).
    pub async fn replicate_outcomes(
        &self,
        batch: &[Retained],
        now_ms: u64,
    ) -> Result<(), ReplicationError> {
        let body = serde_json::to_vec(batch).map_err(|e| ReplicationError(e.to_string()))?;
        let path = format!(
            "{}?term={}&now_ms={now_ms}",
            routes::OUTCOMES,
            self.inner.term
        );
        let sends = self.inner.streaming_sends(&path, Bytes::from(body), None);
        let mut failed = Vec::new();
        for (node, generation, send) in sends {
            if let Err(why) = flatten(send.await) {
                failed.push((node, generation, why));
            }
        }
        self.inner
            .settle_failures(failed)
            .await
            .map_err(|e| ReplicationError(e.to_string()))
    }

    /// Attaches every registered member that is not attached yet (one pass; the node calls
    /// it every poll interval).
    pub async fn attach_new_members(&self, me: &str) {
        let members = match self.inner.group.members().await {
            Ok(members) => members,
            Err(e) => {
                warn!(error = %e, "cannot list the group's members in etcd");
                return;
            }
        };
        for member in members {
            if member.node == me || self.inner.lock().contains_key(&member.node) {
                continue;
            }
            if let Err(e) = self.attach(&member).await {
                warn!(follower = %member.node, error = %e, "attaching a follower failed; trying again later");
            }
        }
    }

    async fn attach(&self, member: &Member) -> Result<(), ReplicationError> {
        let inner = &self.inner;
        let fail = |e: String| ReplicationError(format!("{}: {e}", member.url));
        let mut endpoint = Endpoint::new(&member.url)
            .map_err(|e| fail(e.to_string()))?
            .with_keys(inner.keys.clone());
        if let Some(tls) = &inner.tls {
            endpoint = endpoint.with_tls(Arc::clone(tls));
        }
        let endpoint = Arc::new(endpoint);
        let _gate = inner.archive_gate.lock().await;
        let generation = inner.next_generation.fetch_add(1, Ordering::Relaxed);
        inner.lock().insert(
            member.node.clone(),
            Follower {
                endpoint: Arc::clone(&endpoint),
                send_lock: Arc::new(tokio::sync::Mutex::new(())),
                stage: Stage::Joining { queue: Vec::new() },
                in_sync: false,
                generation,
            },
        );
        let joined = self.join(&endpoint, &member.node, generation).await;
        if let Err(e) = joined {
            inner.forget(&member.node, generation);
            return Err(e);
        }
        drop(_gate);
        // Counted here first, then in etcd (see the module doc).
        {
            let mut followers = inner.lock();
            match followers.get_mut(&member.node) {
                Some(f) if f.generation == generation && matches!(f.stage, Stage::Streaming) => {
                    f.in_sync = true;
                }
                _ => return Err(fail("dropped while attaching".to_string())),
            }
        }
        let _sync = inner.sync_lock.lock().await;
        let sync = inner
            .group
            .change_sync(inner.claim_revision, &member.node, SyncChange::Add)
            .await
            .map_err(|e| fail(e.to_string()))?;
        inner
            .stats
            .followers_attached
            .fetch_add(1, Ordering::Relaxed);
        info!(follower = %member.node, url = %member.url, ?sync, term = inner.term,
              "follower attached and in the sync set");
        Ok(())
    }

    /// The base backup of the log and the index, then the sync points queued meanwhile.
    async fn join(
        &self,
        endpoint: &Arc<Endpoint>,
        node: &str,
        generation: u64,
    ) -> Result<(), ReplicationError> {
        let inner = &self.inner;
        let fail = |e: String| ReplicationError(format!("{}: {e}", endpoint.base_url()));
        let storage = inner
            .storage
            .get()
            .cloned()
            .ok_or_else(|| fail("the log is not open yet".to_string()))?;
        let backup = tokio::task::spawn_blocking(move || storage.base_backup())
            .await
            .map_err(|e| fail(e.to_string()))?
            .map_err(|e| fail(format!("base backup: {e}")))?;
        let mut path = format!("{}?term={}", routes::BACKUP, inner.term);
        if let Some(id) = inner.coordinator_id.get() {
            path.push_str(&format!("&coordinator_id={id}"));
        }
        let body = Bytes::from(backup.encode());
        post(Arc::clone(endpoint), path, body, inner.timeout * 10)
            .await
            .map_err(fail)?;
        if let Some((outcomes, retention_ms)) = inner.outcomes.get() {
            let mut after = None;
            let mut first = true;
            loop {
                let now = crate::clock::now_ms();
                let page = outcomes
                    .list(None, INDEX_PAGE, after, now, *retention_ms)
                    .map_err(|e| fail(e.to_string()))?;
                let body = serde_json::to_vec(&page.outcomes).map_err(|e| fail(e.to_string()))?;
                let path = format!(
                    "{}?term={}&now_ms={now}&reset={first}",
                    routes::OUTCOMES,
                    inner.term
                );
                post(
                    Arc::clone(endpoint),
                    path,
                    Bytes::from(body),
                    inner.timeout * 10,
                )
                .await
                .map_err(fail)?;
                first = false;
                match page.next {
                    Some(next) => after = Some(next),
                    None => break,
                }
            }
        }
        // One switch, however busy the log: under the send lock, the follower streams from
        // now on and the sync points queued meanwhile go first; every later one waits for the
        // lock, so nothing overtakes them (a catch-up in rounds might never empty the queue
        // under load).
        let send_lock = inner
            .lock()
            .get(node)
            .filter(|f| f.generation == generation)
            .map(|f| Arc::clone(&f.send_lock))
            .ok_or_else(|| fail("dropped while attaching".to_string()))?;
        let _sending = send_lock.lock().await;
        let queued = {
            let mut followers = inner.lock();
            let Some(f) = followers
                .get_mut(node)
                .filter(|f| f.generation == generation)
            else {
                return Err(fail("dropped while attaching".to_string()));
            };
            match std::mem::replace(&mut f.stage, Stage::Streaming) {
                Stage::Joining { queue } => queue,
                Stage::Streaming => Vec::new(),
            }
        };
        for batch in merge_contiguous(queued) {
            let path = format!("{}?term={}", routes::OPS, inner.term);
            let body = Bytes::from(batch.encode());
            post(Arc::clone(endpoint), path, body, inner.timeout * 10)
                .await
                .map_err(fail)?;
        }
        Ok(())
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Follower>> {
        self.followers.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn forget(&self, node: &str, generation: u64) {
        let mut followers = self.lock();
        if followers
            .get(node)
            .is_some_and(|f| f.generation == generation)
        {
            followers.remove(node);
        }
    }

    /// Starts a POST to every streaming follower, each under that follower's send lock;
    /// `batch` (a sync point's operations) is queued for joining ones.
    fn streaming_sends(&self, path: &str, body: Bytes, batch: Option<&OpBatch>) -> Vec<Sending> {
        let mut sends = Vec::new();
        let mut followers = self.lock();
        for (node, f) in followers.iter_mut() {
            match &mut f.stage {
                Stage::Joining { queue } => {
                    if let Some(batch) = batch {
                        queue.push(batch.clone());
                    }
                }
                Stage::Streaming => {
                    let endpoint = Arc::clone(&f.endpoint);
                    let send_lock = Arc::clone(&f.send_lock);
                    let (path, body, timeout) = (path.to_string(), body.clone(), self.timeout);
                    let send = self.runtime.spawn(async move {
                        let _sending = send_lock.lock().await;
                        post(endpoint, path, body, timeout).await
                    });
                    sends.push((node.clone(), f.generation, send));
                }
            }
        }
        sends
    }

    /// Detaches the followers that failed; those counted in sync are first taken out of the
    /// sync set in etcd. Err: one could not be, so the sync point must not be acknowledged.
    async fn settle_failures(&self, failed: Vec<(String, u64, String)>) -> Result<(), String> {
        if failed.is_empty() {
            return Ok(());
        }
        // Taken before the table is looked at: a follower another settle (the archiver's, or
        // an earlier sync point's) already detached may still be on its way out of the sync
        // set in etcd; waiting for its lock means that removal is done before this ack.
        let _sync = self.sync_lock.lock().await;
        let mut must_drop = Vec::new();
        for (node, generation, why) in failed {
            let removed = {
                let mut followers = self.lock();
                match followers.get(&node) {
                    Some(f) if f.generation == generation => followers.remove(&node),
                    _ => None,
                }
            };
            self.stats.followers_dropped.fetch_add(1, Ordering::Relaxed);
            warn!(follower = %node, reason = %why, term = self.term,
                  "a follower did not confirm a sync point; detached (it attaches again with a fresh base backup)");
            if removed.is_some_and(|f| f.in_sync) {
                must_drop.push(node);
            }
        }
        for node in must_drop {
            let sync = self
                .group
                .change_sync(self.claim_revision, &node, SyncChange::Remove)
                .await
                .map_err(|e| format!("cannot take follower {node} out of the sync set: {e}"))?;
            warn!(follower = %node, ?sync, "follower taken out of the sync set: until it is back, \
                  only this leader holds what it acknowledges (docs/ha.md, \"Degraded\")");
        }
        Ok(())
    }
}

impl Mirror for GroupMirror {
    fn ship(&self, batch: OpBatch) -> Box<dyn FnOnce() -> std::io::Result<()> + Send> {
        let inner = Arc::clone(&self.inner);
        inner.stats.sync_points.fetch_add(1, Ordering::Relaxed);
        let path = format!("{}?term={}", routes::OPS, inner.term);
        let sends = inner.streaming_sends(&path, Bytes::from(batch.encode()), Some(&batch));
        if sends.is_empty() {
            return Box::new(|| Ok(()));
        }
        Box::new(move || {
            let runtime = inner.runtime.clone();
            runtime.block_on(async {
                let mut failed = Vec::new();
                for (node, generation, send) in sends {
                    if let Err(why) = flatten(send.await) {
                        failed.push((node, generation, why));
                    }
                }
                inner
                    .settle_failures(failed)
                    .await
                    .map_err(std::io::Error::other)
            })
        })
    }
}

/// Consecutive sync points as one message per run of contiguous operation numbers (the
/// follower applies a message with one fsync).
fn merge_contiguous(batches: Vec<OpBatch>) -> Vec<OpBatch> {
    // Well under the largest batch a follower decodes (wal's bound), whatever was queued.
    const MERGED_BYTES_MAX: usize = 16 << 20;
    let bytes = |batch: &OpBatch| -> usize {
        batch
            .ops
            .iter()
            .map(|op| match op {
                wal::FileOp::Append { bytes, .. } => bytes.len() + 64,
                _ => 64,
            })
            .sum()
    };
    let mut merged: Vec<(OpBatch, usize)> = Vec::new();
    for batch in batches {
        let size = bytes(&batch);
        match merged.last_mut() {
            Some((last, last_size))
                if last.first + last.ops.len() as u64 == batch.first
                    && *last_size + size <= MERGED_BYTES_MAX =>
            {
                last.ops.extend(batch.ops);
                *last_size += size;
            }
            _ => merged.push((batch, size)),
        }
    }
    merged.into_iter().map(|(batch, _)| batch).collect()
}

fn flatten(joined: Result<Result<(), String>, tokio::task::JoinError>) -> Result<(), String> {
    match joined {
        Ok(result) => result,
        Err(e) => Err(format!("the send task failed: {e}")),
    }
}

/// One replication message; Ok only on 200.
async fn post(
    endpoint: Arc<Endpoint>,
    path: String,
    body: Bytes,
    timeout: Duration,
) -> Result<(), String> {
    match endpoint.post_bytes(&path, body, timeout).await {
        Ok(answer) if answer.status == 200 => Ok(()),
        Ok(answer) => Err(format!(
            "HTTP {}: {}",
            answer.status,
            String::from_utf8_lossy(&answer.body)
        )),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wal::FileOp;

    fn batch(first: u64, n: usize, bytes: usize) -> OpBatch {
        OpBatch {
            first,
            ops: (0..n)
                .map(|_| FileOp::Append {
                    name: "s".to_string(),
                    bytes: vec![0; bytes],
                })
                .collect(),
        }
    }

    #[test]
    fn contiguous_sync_points_merge_and_a_gap_or_the_size_bound_splits_them() {
        let merged = merge_contiguous(vec![batch(1, 2, 10), batch(3, 1, 10), batch(9, 1, 10)]);
        assert_eq!(merged.len(), 2);
        assert_eq!((merged[0].first, merged[0].ops.len()), (1, 3));
        assert_eq!((merged[1].first, merged[1].ops.len()), (9, 1));
        let big = merge_contiguous(vec![batch(1, 1, 10 << 20), batch(2, 1, 10 << 20)]);
        assert_eq!(big.len(), 2, "two 10 MiB sync points stay apart");
    }
}
