//! The cluster view: the coordinator's live transactions (the oldest first: stuck ones), what
//! every participant holds in doubt, the sagas not ended well, the leases held, and the newest
//! operator actions. Read-only; fetched from
//! the participants' own `/v1/prepared` at the moment it is asked.

use std::sync::Arc;
use std::time::Duration;

use protocol::kv::PreparedList;
use protocol::operator::{ClusterView, InDoubt, LIVE_SHOWN, ParticipantView};
use protocol::routes;

use super::{Core, now_ms};

/// How long one participant may take to list what it holds.
const LIST_TIMEOUT: Duration = Duration::from_secs(2);
/// Operator actions shown.
const AUDIT_SHOWN: usize = 20;

impl Core {
    pub async fn cluster(self: &Arc<Self>) -> ClusterView {
        let (live, live_total, audit) = {
            let engine = self.lock_engine();
            let g = engine.gauges();
            (
                engine.list_live(None, LIVE_SHOWN),
                g.preparing + g.committing + g.aborting,
                engine.audit(AUDIT_SHOWN, None),
            )
        };
        let now = now_ms();
        let mut participants = Vec::with_capacity(self.participants.len());
        for (name, endpoint) in &self.participants {
            let listed = match endpoint.get(routes::PREPARED, LIST_TIMEOUT).await {
                Ok(answer) if answer.status == 200 => {
                    serde_json::from_slice::<PreparedList>(&answer.body)
                        .map_err(|e| format!("malformed /v1/prepared: {e}"))
                }
                Ok(answer) => Err(format!("HTTP {}", answer.status)),
                Err(e) => Err(e.to_string()),
            };
            participants.push(match listed {
                Ok(list) => ParticipantView {
                    name: name.clone(),
                    reachable: true,
                    error: None,
                    in_doubt: list
                        .prepared
                        .into_iter()
                        .map(|p| InDoubt {
                            txid: p.txid,
                            gtid: p.gtid,
                            coordinator_id: p.coordinator_id,
                            epoch: p.epoch,
                            age_ms: now.saturating_sub(p.prepared_at_ms),
                            last_answer: p.last_answer,
                        })
                        .collect(),
                },
                Err(error) => ParticipantView {
                    name: name.clone(),
                    reachable: false,
                    error: Some(error),
                    in_doubt: Vec::new(),
                },
            });
        }
        let sagas = self
            .list_sagas(None, protocol::operator::SAGAS_SHOWN)
            .into_iter()
            .filter(|s| {
                !s.state.is_terminal() || s.state == protocol::saga::SagaState::NeedsAttention
            })
            .collect();
        ClusterView {
            sagas,
            leases: self.leases(),
            now_ms: now,
            coordinator_id: self.identity.coordinator_id.clone(),
            epoch: self.epoch(),
            log_behind: self.log_behind(),
            live,
            live_total,
            participants,
            audit,
        }
    }
}
