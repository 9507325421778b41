//! In-doubt resolution: a prepared transaction with no decision for `in_doubt_after_ms` asks
//! the coordinator (`GET {coordinator}/v1/transactions/{txid}/decision?gtid=..&incarnation=..
//! &epoch=..&position=..`) with capped backoff and jitter, and obeys a `commit` or `abort` from
//! the coordinator that prepared it. `pending`, `unknown` or no answer means ask again later;
//! the participant never decides alone.
//!
//! The coordinator URLs come from the participant's own configuration only; with several (a
//! coordinator group), the query goes to the leader (`decision_client::Coordinators`).

use std::time::Duration;

use protocol::{DecisionQuery, DecisionQueryResponse, TxId, routes};

use crate::resource::Resource;
use crate::service::Participant;

impl<R: Resource> Participant<R> {
    /// Starts the in-doubt scan; it runs until the task is aborted or the log fails.
    pub fn spawn_resolver(&self) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            let mut interval =
                tokio::time::interval(Duration::from_millis(this.config().tick_ms.max(1)));
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                interval.tick().await;
                if this.is_failed() {
                    return;
                }
                for (txid, query) in this.tick().await {
                    let this = this.clone();
                    tokio::spawn(async move { this.resolve(txid, query).await });
                }
            }
        })
    }

    pub(crate) async fn resolve(&self, txid: TxId, query: DecisionQuery) {
        let answer = self.ask(&txid, &query).await;
        if let Some(answer) = &answer {
            tracing::info!(%txid, gtid = %query.gtid, decision = ?answer.decision,
                reason = answer.reason.as_deref().unwrap_or(""),
                "coordinator answered a decision query");
        }
        if let Err(error) = self.decision_answer(query.gtid.clone(), answer).await {
            tracing::error!(%txid, gtid = %query.gtid, %error,
                "could not record the coordinator's decision");
        }
    }

    /// The coordinator's answer as it came; the engine decides whether to obey it (right
    /// coordinator id, no lower epoch than it holds).
    async fn ask(&self, txid: &TxId, query: &DecisionQuery) -> Option<DecisionQueryResponse> {
        self.metrics().count_decision_query();
        if self.inner.coordinators.is_empty() {
            tracing::warn!(
                %txid,
                "in doubt and no --coordinator configured; waiting for the coordinator to resend"
            );
            return None;
        }
        let path = routes::decision_query_path(txid, query);
        match self
            .inner
            .coordinators
            .ask(&path, &self.config().keys)
            .await
        {
            Ok(body) => Some(body),
            Err(error) => {
                self.metrics().count_decision_query_failure();
                tracing::warn!(%txid, %path, %error, "decision query failed; will ask again");
                None
            }
        }
    }
}
