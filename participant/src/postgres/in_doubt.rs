//! In-doubt transactions: this participant's gids in `pg_prepared_xacts`, listed with their age
//! and resolved through the coordinator's `/decision` (never alone: `commit` commits, only an
//! explicit `abort` rolls back; `pending`, `unknown` or no answer leaves them prepared).
//!
//! Every start treats every prepared gid with this participant's prefix as in doubt and asks at
//! once; afterwards a gid is asked about once it is older than `in_doubt_after_ms`, with a
//! doubling wait per gid (capped).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use protocol::kv::PreparedEntry;
use protocol::{
    CoordinatorId, Decision, DecisionQuery, DecisionQueryResponse, Epoch, GlobalTxId, TxId, routes,
};
use serde::{Deserialize, Serialize};

use super::backend::PgParticipant;
use super::error::PgError;
use super::gid::Gid;
use super::policy;
use super::work::PgWork;

/// One prepared transaction of this participant in `GET /v1/prepared`: the KV participant's
/// entry (empty `keys`; PostgreSQL holds the row locks) plus the gid and its age.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PgPreparedEntry {
    /// The PostgreSQL gid (`COMMIT PREPARED '<gid>'` by hand resolves it).
    pub gid: String,
    /// How long it has been prepared, by PostgreSQL's clock.
    pub age_ms: u64,
    #[serde(flatten)]
    pub entry: PreparedEntry,
}

/// `GET /v1/prepared` of a PostgreSQL participant. `unattributed` lists gids with this
/// participant's prefix that name no attempt: neither a txid in the gid nor an intent row
/// (never acted on automatically; see docs/postgres.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PgPreparedList {
    pub prepared: Vec<PgPreparedEntry>,
    pub unattributed: Vec<String>,
}

impl<W: PgWork> PgParticipant<W> {
    /// This participant's prepared transactions, oldest first. A gid that carries its txid
    /// names the attempt by itself; its `epoch` is the highest this participant has recorded
    /// for the coordinator (the one it was prepared under is no higher, and the resolver obeys
    /// no answer from a lower one). Any other gid is named by its intent row.
    pub async fn in_doubt(&self) -> Result<PgPreparedList, PgError> {
        let session = self.inner.pool.get(super::pool::Side::Decide).await?;
        let rows = session
            .client()
            .query(
                "SELECT p.gid, (extract(epoch FROM p.prepared) * 1000)::bigint, \
                        (extract(epoch FROM now() - p.prepared) * 1000)::bigint, \
                        i.txid, i.coordinator_id, i.epoch, i.incarnation, i.position \
                 FROM pg_prepared_xacts p LEFT JOIN twopc.pg_intents i ON i.gid = p.gid \
                 WHERE p.database = current_database() AND p.gid LIKE $1 \
                 ORDER BY p.prepared",
                &[&self.inner.prefix.like_pattern()],
            )
            .await
            .map_err(|e| PgError::db("listing pg_prepared_xacts", e))?;
        let answers = self
            .inner
            .answers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut list = PgPreparedList {
            prepared: Vec::new(),
            unattributed: Vec::new(),
        };
        for row in rows {
            let gid: String = row.get(0);
            let prepared_at: i64 = row.get(1);
            let age: i64 = row.get(2);
            let entry = (|| {
                let (gtid, txid_in_gid) = self.inner.prefix.parse(&gid)?;
                let (txid, coordinator_id, epoch, incarnation, position) = match txid_in_gid {
                    Some(txid) => {
                        let (coordinator, incarnation, position) = gtid.parts()?;
                        let epoch = self.highest_epoch(coordinator)?;
                        let coordinator_id = CoordinatorId::new(coordinator).ok()?;
                        (txid, coordinator_id, epoch, incarnation, position)
                    }
                    None => (
                        TxId::new(row.get::<_, Option<String>>(3)?).ok()?,
                        CoordinatorId::new(row.get::<_, Option<String>>(4)?).ok()?,
                        u64::try_from(row.get::<_, Option<i64>>(5)?).ok()?,
                        row.get::<_, Option<String>>(6)?.parse().ok()?,
                        u64::try_from(row.get::<_, Option<i64>>(7)?).ok()?,
                    ),
                };
                Some(PreparedEntry {
                    txid,
                    gtid,
                    coordinator_id,
                    epoch: Epoch(epoch),
                    incarnation,
                    position,
                    last_answer: answers.get(&gid).cloned(),
                    keys: Vec::new(),
                    prepared_at_ms: u64::try_from(prepared_at).unwrap_or(0),
                })
            })();
            match entry {
                Some(entry) => list.prepared.push(PgPreparedEntry {
                    gid,
                    age_ms: u64::try_from(age).unwrap_or(0),
                    entry,
                }),
                None => list.unattributed.push(gid),
            }
        }
        Ok(list)
    }

    /// Starts the in-doubt scan; it runs until the task is aborted.
    pub fn spawn_resolver(&self) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            // gid -> (next time to ask, current wait)
            let mut next: HashMap<String, (Instant, u64)> = HashMap::new();
            let mut first = true;
            let every = Duration::from_millis(this.config().scan_every_ms.max(10));
            loop {
                match this.in_doubt().await {
                    Ok(list) => {
                        let now = Instant::now();
                        next.retain(|gid, _| list.prepared.iter().any(|p| &p.gid == gid));
                        for prepared in list.prepared {
                            let due = first || prepared.age_ms >= this.config().in_doubt_after_ms;
                            let running = this
                                .inner
                                .preparing
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .contains(&prepared.gid);
                            let waiting = next.get(&prepared.gid).is_some_and(|(at, _)| *at > now);
                            if !due || running || waiting {
                                continue;
                            }
                            let wait = next
                                .get(&prepared.gid)
                                .map_or(every.as_millis() as u64, |(_, w)| {
                                    (w * 2).min(this.config().decision_backoff_max_ms)
                                });
                            next.insert(
                                prepared.gid.clone(),
                                (now + Duration::from_millis(wait), wait),
                            );
                            this.resolve(prepared).await;
                        }
                        for gid in list.unattributed {
                            tracing::warn!(%gid, "prepared transaction with this participant's \
                                prefix that names no attempt (no txid in it, no intent row); \
                                resolve it by hand (docs/postgres.md)");
                        }
                        first = false;
                    }
                    Err(error) => tracing::warn!(%error, "cannot scan pg_prepared_xacts"),
                }
                tokio::time::sleep(every).await;
            }
        })
    }

    async fn resolve(&self, prepared: PgPreparedEntry) {
        let entry = &prepared.entry;
        let query = DecisionQuery {
            gtid: entry.gtid.clone(),
            incarnation: entry.incarnation,
            epoch: entry.epoch,
            position: entry.position,
        };
        let Some(answer) = self.ask(&entry.txid, &query).await else {
            return;
        };
        let gid = match Gid::new(prepared.gid.clone()) {
            Ok(gid) => gid,
            Err(error) => {
                tracing::error!(gid = %prepared.gid, %error, "unusable gid");
                return;
            }
        };
        let described = match &answer.reason {
            Some(reason) => format!("{:?}: {reason}", answer.decision),
            None => format!("{:?}", answer.decision),
        }
        .to_lowercase();
        self.inner
            .answers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(prepared.gid.clone(), described);
        // Obey only the coordinator that prepared it, at no lower epoch than it held then.
        let done = match policy::obey(&answer, &entry.coordinator_id, entry.epoch) {
            Some(Decision::Commit) => self.commit_gid(&gid).await,
            Some(Decision::Abort) => self.abort_gid(&gid).await,
            None => {
                tracing::debug!(%gid, ?answer, "no decision to carry out; staying prepared");
                return;
            }
        };
        match done {
            Ok(()) => {
                self.inner
                    .metrics
                    .resolved_by_query
                    .fetch_add(1, Ordering::Relaxed);
                tracing::info!(%gid, decision = ?answer.decision, "resolved an in-doubt transaction");
            }
            Err(error) => tracing::warn!(%gid, %error, "could not apply the decision"),
        }
    }

    async fn ask(&self, txid: &TxId, query: &DecisionQuery) -> Option<DecisionQueryResponse> {
        if self.inner.coordinators.is_empty() {
            return None;
        }
        self.inner
            .metrics
            .decision_queries
            .fetch_add(1, Ordering::Relaxed);
        let path = routes::decision_query_path(txid, query);
        match self
            .inner
            .coordinators
            .ask(&path, &self.inner.config.keys)
            .await
        {
            Ok(answer) => Some(answer),
            Err(error) => {
                tracing::warn!(%path, %error, "decision query failed; will ask again");
                None
            }
        }
    }
}

/// For tests and operators: the gtid of an entry.
impl PgPreparedEntry {
    pub fn gtid(&self) -> &GlobalTxId {
        &self.entry.gtid
    }
}
