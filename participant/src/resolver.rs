//! In-doubt resolution: a prepared transaction with no decision for `in_doubt_after_ms` asks
//! the coordinator (`GET {coordinator}/v1/transactions/{txid}/decision`) with capped backoff and
//! jitter, and obeys a `commit` or `abort`. `pending` or no answer means ask again later; the
//! participant never decides alone.
//!
//! The coordinator URL comes from the participant's own configuration only.

use std::time::Duration;

use protocol::{DecisionQueryResponse, DecisionStatus, TxId, routes};

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
                for txid in this.tick() {
                    let this = this.clone();
                    tokio::spawn(async move { this.resolve(txid).await });
                }
            }
        })
    }

    async fn resolve(&self, txid: TxId) {
        let answer = self.ask(&txid).await;
        if let Some(decision) = answer {
            tracing::info!(%txid, ?decision, "coordinator answered a decision query");
        }
        if let Err(error) = self.decision_answer(txid.clone(), answer).await {
            tracing::error!(%txid, %error, "could not record the coordinator's decision");
        }
    }

    async fn ask(&self, txid: &TxId) -> Option<DecisionStatus> {
        self.metrics().count_decision_query();
        let Some(base) = &self.config().coordinator_url else {
            tracing::warn!(
                %txid,
                "in doubt and no --coordinator configured; waiting for the coordinator to resend"
            );
            return None;
        };
        let url = format!(
            "{}{}",
            base.trim_end_matches('/'),
            routes::decision_path(txid)
        );
        let response = match self.inner.client.get(&url).send().await {
            Ok(response) => response,
            Err(error) => {
                self.metrics().count_decision_query_failure();
                tracing::warn!(%txid, %url, %error, "decision query failed; will ask again");
                return None;
            }
        };
        let status = response.status();
        if !status.is_success() {
            self.metrics().count_decision_query_failure();
            tracing::warn!(%txid, %url, %status, "decision query answered non-200; will ask again");
            return None;
        }
        match response.json::<DecisionQueryResponse>().await {
            Ok(body) => {
                let prepared_by = self
                    .prepared_list()
                    .into_iter()
                    .find(|entry| &entry.txid == txid)
                    .map(|entry| entry.coordinator_id);
                match (&body.coordinator_id, prepared_by) {
                    (Some(answered_by), Some(prepared_by)) if *answered_by != prepared_by => {
                        self.metrics().count_decision_query_failure();
                        tracing::error!(%txid, %url, %answered_by, %prepared_by,
                            "the coordinator at --coordinator is not the one that prepared this \
                             transaction; ignoring its answer and staying in doubt (an operator \
                             must point --coordinator at the right coordinator)");
                        None
                    }
                    _ => Some(body.decision),
                }
            }
            Err(error) => {
                self.metrics().count_decision_query_failure();
                tracing::warn!(%txid, %url, %error, "decision query answer malformed; will ask again");
                None
            }
        }
    }
}
