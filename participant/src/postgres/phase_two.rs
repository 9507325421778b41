//! Phase two, batched: decisions waiting at the same moment go out together on one phase-two
//! session, several `COMMIT PREPARED` / `ROLLBACK PREPARED` per round trip, each answered as
//! soon as its own statement is done.
//!
//! A decision queues its statement, then a task of its own waits for a phase-two session
//! ([`Side::Decide`]); whichever task gets one sends everything queued by then (up to
//! [`BATCH_MAX`]). A task that finds the queue empty had its statement sent in another's batch
//! and ends. So a lone decision goes out at once on a free session, and while every phase-two
//! session is busy, the decisions arriving meanwhile gather for the next one to come free.
//!
//! Each statement is a query of its own (pipelined, not one query string of several):
//! PostgreSQL runs `COMMIT PREPARED` only outside a transaction block, which a string of
//! several statements would be; separate queries are separate transactions, so one failing
//! (an unknown gid) leaves the others' outcomes as they are, and each is judged alone.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use super::error::PgError;
use super::gid::Gid;
use super::metrics::PgMetrics;
use super::pipeline;
use super::pool::{Pool, Side};

/// Most statements sent in one round trip.
pub(crate) const BATCH_MAX: usize = 32;

/// How a prepared transaction ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Finish {
    Commit,
    Rollback,
}

impl Finish {
    fn sql(self, gid: &Gid) -> String {
        match self {
            Finish::Commit => format!("COMMIT PREPARED {}", gid.literal()),
            Finish::Rollback => format!("ROLLBACK PREPARED {}", gid.literal()),
        }
    }
}

/// What PostgreSQL answered to one statement (`Err(PgError)` from [`PhaseTwo::finish`]: it was
/// never sent, or its answer was lost with the session).
pub(crate) type Answer = Result<(), tokio_postgres::Error>;

struct Job {
    id: u64,
    sql: String,
    answer: oneshot::Sender<Result<Answer, PgError>>,
}

/// The queue of decisions waiting for a phase-two session.
pub(crate) struct PhaseTwo {
    pool: Arc<Pool>,
    queue: Mutex<VecDeque<Job>>,
    next_id: AtomicU64,
    metrics: Arc<PgMetrics>,
}

impl PhaseTwo {
    pub(crate) fn new(pool: Arc<Pool>, metrics: Arc<PgMetrics>) -> Arc<Self> {
        Arc::new(Self {
            pool,
            queue: Mutex::new(VecDeque::new()),
            next_id: AtomicU64::new(0),
            metrics,
        })
    }

    /// Sends `COMMIT PREPARED` or `ROLLBACK PREPARED` of `gid` (with whatever else is waiting)
    /// and returns PostgreSQL's answer to it.
    pub(crate) async fn finish(
        self: &Arc<Self>,
        finish: Finish,
        gid: &Gid,
    ) -> Result<Answer, PgError> {
        let (answer, answered) = oneshot::channel();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.lock().push_back(Job {
            id,
            sql: finish.sql(gid),
            answer,
        });
        // On a task of its own: a request cancelled while it waits must not cancel the batch it
        // may be sending for others.
        tokio::spawn(Arc::clone(self).send_queued(id));
        answered.await.unwrap_or_else(|_| {
            Err(PgError::Db {
                context: format!("{finish:?} of {gid}"),
                message: "the phase-two task ended without an answer".into(),
            })
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Job>> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for a phase-two session, then sends what is queued (job `id` among it, unless
    /// another task's batch took it).
    async fn send_queued(self: Arc<Self>, id: u64) {
        let session = match self.pool.get(Side::Decide).await {
            Ok(session) => session,
            Err(error) => {
                let mine = {
                    let mut queue = self.lock();
                    let at = queue.iter().position(|job| job.id == id);
                    at.and_then(|at| queue.remove(at))
                };
                if let Some(job) = mine {
                    let _ = job.answer.send(Err(error));
                }
                return;
            }
        };
        let batch: Vec<Job> = {
            let mut queue = self.lock();
            let n = queue.len().min(BATCH_MAX);
            queue.drain(..n).collect()
        };
        if batch.is_empty() {
            return;
        }
        self.metrics
            .phase_two_round_trips
            .fetch_add(1, Ordering::Relaxed);
        self.metrics
            .phase_two_statements
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        let client = session.client();
        let sent = batch
            .into_iter()
            .map(|job| async move {
                let done = client.batch_execute(&job.sql).await;
                // A database's error leaves the session usable; a lost connection does not.
                let lost = done.as_ref().is_err_and(|e| e.as_db_error().is_none());
                let _ = job.answer.send(Ok(done));
                lost
            })
            .collect();
        let lost = pipeline::all(sent).await.into_iter().any(|lost| lost);
        if lost {
            session.discard();
        }
    }
}
