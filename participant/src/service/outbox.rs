//! The outbox's calls on a running participant: a write with its next intents (the library
//! call embedding services use), relays' reports, operators' actions, and the durable reads
//! relays and operators list intents with.

use protocol::outbox::{OutboxEntry, OutboxList};

use super::{Participant, RequestError, now_ms};
use crate::crash::{self, crash_point};
use crate::engine::{Engine, Event, Reply};
use crate::fence::FencedAnswer;
use crate::outbox::{IntentRequest, StateFilter, Write};
use crate::record::Record;
use crate::resource::Resource;

impl<R: Resource> Participant<R> {
    /// A write outside 2PC with the intents it leads to (docs/participants.md, "The outbox"):
    /// `payload` applied at once, guarded by `fence` when given (a stale token is answered
    /// `FencedAnswer::Stale` and writes nothing), its `next` intents recorded with it in one
    /// forced record, answered once durable with the seqs they got. A repeated `op_id`
    /// answers the first answer and applies nothing. Refused (nothing written, no intent):
    /// a failed condition (`Rejection::ConditionFailed`), bad intents, an `event_id` already
    /// recorded (`Rejection::EventIdConflict`), a key a prepared transaction holds. The op
    /// id's and the fence's names are the caller's to check ([`Write::check_ids`]).
    pub async fn write(&self, write: Write) -> Result<FencedAnswer, RequestError> {
        let reply = self
            .run(Event::Write {
                write,
                now_ms: now_ms(),
            })
            .await?;
        match reply {
            Some(Reply::Fenced(answer)) => {
                if let FencedAnswer::Applied { intents, .. } = &answer
                    && !intents.is_empty()
                {
                    crash_point(crash::AFTER_OUTBOX_WRITE_LOGGED);
                }
                Ok(answer)
            }
            Some(Reply::Reject(rejection)) => Err(RequestError::Rejected(rejection)),
            Some(_) | None => Err(RequestError::Internal("a write produced no answer")),
        }
    }

    /// A relay's report on an intent, or an operator's action on it: answered with the intent
    /// as it stands once the change is durable (a report on a settled intent: as it stood).
    pub async fn intent(
        &self,
        event_id: String,
        request: IntentRequest,
    ) -> Result<OutboxEntry, RequestError> {
        let delivered = matches!(request, IntentRequest::Delivered { .. });
        let operator = match &request {
            IntentRequest::Retry { operator, reason }
            | IntentRequest::Mark {
                operator, reason, ..
            } => Some((operator.clone(), reason.clone())),
            IntentRequest::Delivered { .. } | IntentRequest::Attempt { .. } => None,
        };
        let reply = self
            .run(Event::Intent {
                event_id,
                request,
                now_ms: now_ms(),
            })
            .await?;
        match reply {
            Some(Reply::Intent(entry)) => {
                if delivered {
                    crash_point(crash::AFTER_INTENT_DELIVERED_LOGGED);
                }
                if let Some((operator, reason)) = operator {
                    tracing::warn!(
                        event_id = %entry.event_id, state = ?entry.state, %operator, %reason,
                        "outbox intent changed by an operator"
                    );
                }
                Ok(*entry)
            }
            Some(Reply::Reject(rejection)) => Err(RequestError::Rejected(rejection)),
            Some(_) | None => Err(RequestError::Internal(
                "an intent report produced no answer",
            )),
        }
    }

    /// The outbox as `GET /v1/outbox` lists it, once everything it shows is durable.
    pub async fn outbox_list(
        &self,
        filter: StateFilter,
        aggregate: Option<&str>,
        limit: usize,
    ) -> Result<OutboxList, RequestError> {
        let now = now_ms();
        self.read_durable(|engine| engine.outbox().list(filter, aggregate, limit, now))
            .await
    }

    /// One intent, with its age, once it is durable (`None`: no such intent).
    pub async fn outbox_entry(&self, event_id: &str) -> Result<Option<OutboxEntry>, RequestError> {
        let now = now_ms();
        self.read_durable(|engine| {
            engine
                .outbox()
                .get(event_id)
                .map(|entry| crate::outbox::table::with_age(entry, now))
        })
        .await
    }

    /// Reads the engine behind a forced barrier: what a relay reads is durable before it can
    /// act on it (an intent delivered whose write a crash then lost would be a delivery of
    /// something that never happened).
    async fn read_durable<T>(&self, read: impl FnOnce(&Engine<R>) -> T) -> Result<T, RequestError> {
        if self.is_failed() {
            return Err(RequestError::LogFailed(wal::WalError::Poisoned {
                cause: "an earlier append failed".into(),
            }));
        }
        let (value, ticket) = {
            let mut state = self.lock();
            let ticket = self.submit_counted(
                &mut state,
                &Record::FencedRepeat {
                    op_id: "outbox:read".into(),
                },
            );
            (read(&state.engine), ticket)
        };
        if let Err(error) = ticket.wait().await {
            self.fail(&error);
            return Err(RequestError::LogFailed(error));
        }
        Ok(value)
    }
}
