//! Batched phase messages, the sender's side (`protocol::batch`, docs/participants.md): the
//! prepares (and, separately, the decisions) waiting for one participant at the moment its
//! lane is flushed go in one request, and each answer line is fed back as the same event a
//! message of its own would have produced (`sends::voted`, `sends::delivered`).
//!
//! While the coordinator holds at most [`ALONE_LIVE_MAX`] live transactions and a lane has
//! nothing queued, a message goes at once, alone, as it would without batching: there is no
//! company to wait for, so a lone client pays nothing for batches (issue 28's c1 figures).
//! Otherwise it queues, and the lane is flushed by a task spawned when its first message
//! queued; every message queued before that task runs joins it (a flush that finds one message
//! still sends it alone), so under load a lane's batch is whatever the engine produced
//! meanwhile (the prepares of one group commit, the decisions of one fsync). There is
//! no limit on requests in flight, as there is none for messages of their own: an item waiting
//! for a lock at the participant holds back only itself, its answer line comes when it comes.
//!
//! Whether a participant takes batches is asked once (`GET /2pc/capabilities`) and asked again
//! after a while when it said no; a participant that answers the batch route 404 is sent its
//! messages one by one from then on. Nothing here decides anything: an item without an answer
//! line is a message that got no answer (a prepare's error vote, a decision retried).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use protocol::batch::{BatchedDecision, Capabilities, DecisionBatch, PrepareBatch};
use protocol::limits::{BATCH_BODY_BYTES_MAX, BATCH_ITEMS_MAX};
use protocol::{GlobalTxId, ParticipantName, VoteKind, routes};

use super::Core;
use super::participants::{self, DeliveryError, PrepareOutcome};
use super::sends::{DecisionJob, PrepareJob};
use crate::http_client::{ANSWER_BYTES_MAX, Answer, CallError, Endpoint, Lines};

/// How long a participant that said it takes no batches is believed before it is asked again
/// (it may have been upgraded).
const ASK_AGAIN_AFTER: Duration = Duration::from_secs(60);

/// Longest the capabilities question may take; past it, this flush goes message by message.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// Up to this many live transactions (one client's, and its previous one still collecting
/// acknowledgements), a message with an empty lane goes alone at once instead of queueing.
/// Measured (docs/benchmarks.md): counting a lane's own messages in flight instead sent too
/// many alone at 64 clients, where batches were done before the next group commit's came.
pub(super) const ALONE_LIVE_MAX: usize = 2;

/// Every participant's lane.
#[derive(Debug, Default)]
pub(super) struct Lanes {
    lanes: Mutex<HashMap<ParticipantName, Arc<Lane>>>,
}

#[derive(Debug, Default)]
struct Lane {
    queued: Mutex<Queued>,
    /// Held while the participant is asked, so one flush asks and the others wait for its answer.
    terms: tokio::sync::Mutex<Terms>,
}

#[derive(Debug, Default)]
struct Queued {
    prepares: Vec<PrepareJob>,
    decisions: Vec<DecisionJob>,
    /// A flush task is spawned and has not yet taken the queue.
    flushing: bool,
}

/// What a participant takes.
#[derive(Debug, Clone, Copy, Default)]
enum Terms {
    #[default]
    Unknown,
    Batches {
        max_items: usize,
    },
    OneByOne {
        until: Instant,
    },
}

impl Lanes {
    fn lane(&self, participant: &ParticipantName) -> Arc<Lane> {
        let mut lanes = self.lanes.lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(lanes.entry(participant.clone()).or_default())
    }
}

impl Lane {
    fn is_empty(&self) -> bool {
        let queued = self.queued.lock().unwrap_or_else(|p| p.into_inner());
        !queued.flushing && queued.prepares.is_empty() && queued.decisions.is_empty()
    }
}

impl Core {
    /// `Command::SendPrepare`: into the participant's lane, or alone when batching is off.
    pub(super) fn send_prepare(self: &Arc<Self>, job: PrepareJob) {
        if !self.config.phase_batching {
            tokio::spawn(Arc::clone(self).prepare(job));
            return;
        }
        let participant = job.participant.clone();
        let lane = self.lanes.lane(&participant);
        if self.goes_alone(&lane) {
            tokio::spawn(Arc::clone(self).prepare(job));
            return;
        }
        self.enqueue(&participant, lane, |queued| queued.prepares.push(job));
    }

    /// `Command::SendDecision` (tracked): as `send_prepare`.
    pub(super) fn send_decision(self: &Arc<Self>, job: DecisionJob) {
        if !self.config.phase_batching {
            tokio::spawn(Arc::clone(self).deliver(job));
            return;
        }
        let participant = job.participant.clone();
        let lane = self.lanes.lane(&participant);
        if self.goes_alone(&lane) {
            tokio::spawn(Arc::clone(self).deliver(job));
            return;
        }
        self.enqueue(&participant, lane, |queued| queued.decisions.push(job));
    }

    /// No company to wait for: few live transactions and nothing queued on the lane.
    fn goes_alone(&self, lane: &Lane) -> bool {
        self.live_transactions.load(Ordering::Relaxed) <= ALONE_LIVE_MAX && lane.is_empty()
    }

    fn enqueue(
        self: &Arc<Self>,
        participant: &ParticipantName,
        lane: Arc<Lane>,
        push: impl FnOnce(&mut Queued),
    ) {
        let start = {
            let mut queued = lane.queued.lock().unwrap_or_else(|p| p.into_inner());
            push(&mut queued);
            !std::mem::replace(&mut queued.flushing, true)
        };
        if start {
            tokio::spawn(Arc::clone(self).flush(participant.clone(), lane));
        }
    }

    async fn flush(self: Arc<Self>, participant: ParticipantName, lane: Arc<Lane>) {
        // A task spawned from a worker runs next on it (tokio's LIFO slot), ahead of the tasks
        // already woken with it (the other decisions of one fsync): let those queue first.
        tokio::task::yield_now().await;
        let endpoint = self.participants.get(&participant).cloned();
        let terms = match &endpoint {
            Some(endpoint) => self.terms(&lane, endpoint).await,
            // Sent alone, each says the participant is not configured.
            None => Terms::OneByOne {
                until: Instant::now(),
            },
        };
        let (prepares, decisions) = {
            let mut queued = lane.queued.lock().unwrap_or_else(|p| p.into_inner());
            queued.flushing = false;
            (
                std::mem::take(&mut queued.prepares),
                std::mem::take(&mut queued.decisions),
            )
        };
        match (terms, endpoint) {
            // A lone message goes on its own route, from this task: a batch of one would cost
            // a streamed answer (a write per line and the end) and one more task for nothing.
            (Terms::Batches { .. }, Some(_)) if prepares.len() + decisions.len() == 1 => {
                if let Some(job) = prepares.into_iter().next() {
                    self.prepare(job).await;
                } else if let Some(job) = decisions.into_iter().next() {
                    self.deliver(job).await;
                }
            }
            (Terms::Batches { max_items }, Some(endpoint)) => {
                for batch in into_batches(prepares, max_items) {
                    tokio::spawn(Arc::clone(&self).prepare_batch(
                        Arc::clone(&endpoint),
                        Arc::clone(&lane),
                        batch,
                    ));
                }
                for batch in into_batches(decisions, max_items) {
                    tokio::spawn(Arc::clone(&self).decide_batch(
                        Arc::clone(&endpoint),
                        Arc::clone(&lane),
                        batch,
                    ));
                }
            }
            _ => self.one_by_one(prepares, decisions),
        }
    }

    fn one_by_one(self: &Arc<Self>, prepares: Vec<PrepareJob>, decisions: Vec<DecisionJob>) {
        for job in prepares {
            tokio::spawn(Arc::clone(self).prepare(job));
        }
        for job in decisions {
            tokio::spawn(Arc::clone(self).deliver(job));
        }
    }

    /// What the participant takes, asking it if it has not said (or said no long enough ago).
    async fn terms(&self, lane: &Lane, endpoint: &Endpoint) -> Terms {
        let mut terms = lane.terms.lock().await;
        match *terms {
            Terms::Batches { .. } => return *terms,
            Terms::OneByOne { until } if Instant::now() < until => return *terms,
            Terms::Unknown | Terms::OneByOne { .. } => {}
        }
        let asked = match endpoint.get(routes::CAPABILITIES, ASK_TIMEOUT).await {
            Ok(Answer { status: 200, body }) => {
                match serde_json::from_slice::<Capabilities>(&body) {
                    Ok(Capabilities { batch: Some(batch) }) if batch.max_items > 1 => {
                        Some(Terms::Batches {
                            max_items: batch.max_items.min(BATCH_ITEMS_MAX),
                        })
                    }
                    Ok(_) | Err(_) => None,
                }
            }
            // It answered, and not with batches (404: an older participant).
            Ok(_) => None,
            // No answer: this flush goes one by one, and the next asks again.
            Err(error) => {
                tracing::debug!(participant = endpoint.base_url(), %error,
                    "capabilities not known; sending one by one");
                return Terms::OneByOne {
                    until: Instant::now(),
                };
            }
        };
        *terms = asked.unwrap_or(Terms::OneByOne {
            until: Instant::now() + ASK_AGAIN_AFTER,
        });
        tracing::info!(participant = endpoint.base_url(), terms = ?*terms, "phase messages");
        *terms
    }

    /// The participant refused the batch route itself (404): one by one from now on.
    async fn batches_refused(&self, lane: &Lane) {
        *lane.terms.lock().await = Terms::OneByOne {
            until: Instant::now() + ASK_AGAIN_AFTER,
        };
    }

    async fn prepare_batch(
        self: Arc<Self>,
        endpoint: Arc<Endpoint>,
        lane: Arc<Lane>,
        jobs: Vec<PrepareJob>,
    ) {
        let started = Instant::now();
        let mut jobs = jobs;
        let requests: Vec<_> = jobs.iter_mut().map(|job| job.request(&self)).collect();
        let gtids: Vec<GlobalTxId> = requests.iter().map(|r| r.gtid.clone()).collect();
        let epochs: Vec<_> = requests.iter().map(|r| r.epoch).collect();
        let timeout_ms = jobs.iter().map(|j| j.timeout_ms).max().unwrap_or(0);
        let batch = PrepareBatch { prepares: requests };
        let body = serde_json::to_vec(&batch);
        // The payloads back in their jobs (moved, not copied): a job may yet go alone, when
        // the batch is too large or the participant refuses the batch route.
        for (job, request) in jobs.iter_mut().zip(batch.prepares) {
            job.payload = request.payload;
        }
        let body = match body {
            Ok(body) if body.len() <= BATCH_BODY_BYTES_MAX => body,
            // Large payloads: as messages of their own, each within the single-body limit.
            Ok(_) | Err(_) => return self.one_by_one(jobs, Vec::new()),
        };
        self.metrics.count_batch(jobs.len());
        let mut slots: Vec<Option<PrepareJob>> = jobs.into_iter().map(Some).collect();
        let called = endpoint
            .post_json_lines(
                routes::BATCH_PREPARE,
                body,
                Duration::from_millis(timeout_ms),
                slots.len().saturating_mul(ANSWER_BYTES_MAX),
                |line| {
                    if let Some((index, answer)) = answer_line(line, &gtids, endpoint.base_url())
                        && let Some(job) = slots[index].take()
                    {
                        let outcome = participants::prepare_outcome(&answer);
                        self.voted(job, epochs[index], outcome, started);
                    }
                },
            )
            .await;
        let unanswered = unanswered(slots);
        if unanswered.is_empty() {
            return;
        }
        if refused_route(&called) {
            self.batches_refused(&lane).await;
            return self.one_by_one(
                unanswered.into_iter().map(|(_, job)| job).collect(),
                Vec::new(),
            );
        }
        for (index, job) in unanswered {
            let outcome = match &called {
                Ok(Lines::Refused(answer)) => participants::prepare_outcome(answer),
                Ok(Lines::Read(_)) => PrepareOutcome {
                    vote: VoteKind::Error,
                    reason: Some("the batch's answer ended without this attempt's line".into()),
                    fenced: None,
                },
                Err(CallError::Timeout(_)) => PrepareOutcome {
                    vote: VoteKind::Timeout,
                    reason: None,
                    fenced: None,
                },
                Err(error) => PrepareOutcome {
                    vote: VoteKind::Error,
                    reason: Some(error.to_string()),
                    fenced: None,
                },
            };
            self.voted(job, epochs[index], outcome, started);
        }
    }

    async fn decide_batch(
        self: Arc<Self>,
        endpoint: Arc<Endpoint>,
        lane: Arc<Lane>,
        jobs: Vec<DecisionJob>,
    ) {
        let requests: Vec<BatchedDecision> = jobs
            .iter()
            .map(|job| BatchedDecision {
                decision: job.decision,
                request: self.decision_request(&job.txid, job.gtid.clone()),
            })
            .collect();
        let gtids: Vec<GlobalTxId> = jobs.iter().map(|j| j.gtid.clone()).collect();
        let epochs: Vec<_> = requests.iter().map(|r| r.request.epoch).collect();
        let body = match serde_json::to_vec(&DecisionBatch {
            decisions: requests,
        }) {
            Ok(body) => body,
            Err(_) => return self.one_by_one(Vec::new(), jobs),
        };
        self.metrics.count_batch(jobs.len());
        let mut slots: Vec<Option<DecisionJob>> = jobs.into_iter().map(Some).collect();
        let called = endpoint
            .post_json_lines(
                routes::BATCH_DECIDE,
                body,
                Duration::from_millis(self.config.delivery_timeout_ms),
                slots.len().saturating_mul(ANSWER_BYTES_MAX),
                |line| {
                    if let Some((index, answer)) = answer_line(line, &gtids, endpoint.base_url())
                        && let Some(job) = slots[index].take()
                    {
                        self.delivered(job, epochs[index], participants::delivery_result(answer));
                    }
                },
            )
            .await;
        let unanswered = unanswered(slots);
        if unanswered.is_empty() {
            return;
        }
        if refused_route(&called) {
            self.batches_refused(&lane).await;
            return self.one_by_one(
                Vec::new(),
                unanswered.into_iter().map(|(_, job)| job).collect(),
            );
        }
        for (index, job) in unanswered {
            let result = match &called {
                Ok(Lines::Refused(answer)) => participants::delivery_result(answer.clone()),
                Ok(Lines::Read(_)) => Err(DeliveryError::Transport(
                    "the batch's answer ended without this attempt's line".into(),
                )),
                Err(error) => Err(DeliveryError::Transport(error.to_string())),
            };
            self.delivered(job, epochs[index], result);
        }
    }
}

/// The jobs whose answer line never came, with their index in the batch.
fn unanswered<T>(slots: Vec<Option<T>>) -> Vec<(usize, T)> {
    slots
        .into_iter()
        .enumerate()
        .filter_map(|(index, job)| job.map(|job| (index, job)))
        .collect()
}

/// Splits `jobs` into batches of at most `max_items`, in order.
fn into_batches<T>(jobs: Vec<T>, max_items: usize) -> Vec<Vec<T>> {
    let mut batches = Vec::new();
    let mut jobs = jobs.into_iter().peekable();
    while jobs.peek().is_some() {
        batches.push(jobs.by_ref().take(max_items.max(1)).collect());
    }
    batches
}

/// A 404 `unknown_route` for the batch route: the participant does not take batches (any more).
fn refused_route(called: &Result<Lines, CallError>) -> bool {
    matches!(called, Ok(Lines::Refused(Answer { status: 404, body }))
        if serde_json::from_slice::<protocol::ErrorBody>(body)
            .is_ok_and(|e| e.error == protocol::ErrorCode::UnknownRoute))
}

/// One answer line as read: a [`BatchAnswer`](protocol::batch::BatchAnswer) whose body is kept
/// as the JSON text it came as (parsed once, as a message of its own's answer would be).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct AnswerLine<'a> {
    index: usize,
    #[serde(borrow)]
    gtid: std::borrow::Cow<'a, str>,
    status: u16,
    #[serde(borrow)]
    body: &'a serde_json::value::RawValue,
}

/// One answer line, checked: its index names an item of the batch and its gtid is that item's.
/// A line that fails either check is no answer (a peer's claim that does not hold), and is
/// logged; its item is then treated as unanswered.
fn answer_line(line: &[u8], gtids: &[GlobalTxId], participant: &str) -> Option<(usize, Answer)> {
    let answer = match serde_json::from_slice::<AnswerLine<'_>>(line) {
        Ok(answer) => answer,
        Err(error) => {
            tracing::warn!(participant, %error, "a batch answer line is not an answer; ignored");
            return None;
        }
    };
    if gtids.get(answer.index).map(GlobalTxId::as_str) != Some(answer.gtid.as_ref()) {
        tracing::warn!(participant, index = answer.index, gtid = %answer.gtid,
            "a batch answer line names no item of its batch; ignored");
        return None;
    }
    Some((
        answer.index,
        Answer {
            status: answer.status,
            body: bytes::Bytes::copy_from_slice(answer.body.get().as_bytes()),
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::batch::BatchAnswer;

    fn gtid(n: u32) -> GlobalTxId {
        GlobalTxId::new(format!("c:0000000000000001:{n}")).unwrap()
    }

    #[test]
    fn batches_keep_order_and_size() {
        let batches = into_batches((0..7).collect(), 3);
        assert_eq!(batches, vec![vec![0, 1, 2], vec![3, 4, 5], vec![6]]);
        assert!(into_batches(Vec::<u8>::new(), 3).is_empty());
        assert_eq!(into_batches(vec![1, 2], 0), vec![vec![1], vec![2]]);
    }

    #[test]
    fn an_answer_line_counts_only_for_the_item_it_names() {
        let gtids = [gtid(1), gtid(2)];
        let line = |index: usize, g: &GlobalTxId| {
            serde_json::to_vec(&BatchAnswer {
                index,
                gtid: g.clone(),
                status: 200,
                body: serde_json::json!({"vote": "yes"}),
            })
            .unwrap()
        };
        let (index, answer) = answer_line(&line(1, &gtid(2)), &gtids, "p").unwrap();
        assert_eq!(index, 1);
        assert_eq!(answer.status, 200);
        assert_eq!(participants::prepare_outcome(&answer).vote, VoteKind::Yes);
        // A yes that names another attempt than the item at its index is no answer at all.
        assert!(answer_line(&line(0, &gtid(2)), &gtids, "p").is_none());
        assert!(answer_line(&line(2, &gtid(2)), &gtids, "p").is_none());
        assert!(answer_line(b"{not json", &gtids, "p").is_none());
    }

    #[test]
    fn only_an_unknown_route_404_turns_batching_off() {
        let refused = |status, body: &str| {
            Ok(Lines::Refused(Answer {
                status,
                body: body.to_owned().into(),
            }))
        };
        assert!(refused_route(&refused(
            404,
            r#"{"error":"unknown_route","message":"no"}"#
        )));
        assert!(!refused_route(&refused(404, "not json")));
        assert!(!refused_route(&refused(
            401,
            r#"{"error":"unauthorized","message":"no"}"#
        )));
        assert!(!refused_route(&Ok(Lines::Read(3))));
        assert!(!refused_route(&Err(CallError::Timeout(
            Duration::from_secs(1)
        ))));
    }
}
