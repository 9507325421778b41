//! The saga routes' shell (issue 13): runs one op through the engine's barrier under the
//! engine mutex, submits its record forced under that mutex (log order = engine order), and
//! answers only once the record is durable. Repeats and status questions answered from the
//! barrier in memory wait behind a forced barrier record, as the 2PC duplicate paths do; so do
//! the `op_id_conflict` refusals, which rest on the first op's record too.

use protocol::saga::{OpKind, OpQuery, OpStatus, OpStatusResponse, SagaOpAnswer, SagaOpRequest};

use crate::crash::{self, crash_point};
use crate::engine::saga::{OpQueryRefused, SagaStepped};
use crate::record::Record;
use crate::resource::Resource;
use crate::service::{Participant, RequestError, now_ms};

/// Why a saga op got no `done`/`failed` answer (the coordinator treats it as unknown).
#[derive(Debug, thiserror::Error)]
pub enum SagaOpError {
    /// A key is locked by a prepared 2PC transaction; nothing was recorded.
    #[error("busy: {0}")]
    Busy(String),
    /// 409 `op_id_conflict`: the op id was recorded with another payload from the same
    /// coordinator; nothing recorded or applied.
    #[error("{0}")]
    OpIdConflict(String),
    #[error(transparent)]
    Request(#[from] RequestError),
}

/// Why `GET /saga/ops/{op_id}` got no status.
#[derive(Debug, thiserror::Error)]
pub enum OpQueryError {
    #[error(transparent)]
    Refused(#[from] OpQueryRefused),
    #[error(transparent)]
    Request(#[from] RequestError),
}

impl<R: Resource> Participant<R> {
    /// `POST /saga/action` or `/saga/compensate`.
    pub async fn saga_op(
        &self,
        kind: OpKind,
        request: SagaOpRequest,
    ) -> Result<SagaOpAnswer, SagaOpError> {
        if self.is_failed() {
            return Err(RequestError::LogFailed(wal::WalError::Poisoned {
                cause: "an earlier append failed".into(),
            })
            .into());
        }
        let (answer, ticket, fresh) = {
            let mut state = self.lock();
            match state.engine.saga_op(kind, &request, now_ms()) {
                SagaStepped::Busy(why) => return Err(SagaOpError::Busy(why)),
                SagaStepped::Conflict(why) => (
                    Err(why),
                    self.submit_counted(&mut state, &repeat_barrier(&request.op_id)),
                    false,
                ),
                SagaStepped::Answer { answer, record } => {
                    let fresh = record.is_some();
                    // A repeat is answered from the barrier in memory, whose first record may
                    // still be in flight: the answer waits behind a forced barrier record.
                    let record = record.unwrap_or_else(|| repeat_barrier(&request.op_id));
                    (Ok(answer), self.submit_counted(&mut state, &record), fresh)
                }
            }
        };
        self.wait_durable(ticket).await?;
        let answer = answer.map_err(SagaOpError::OpIdConflict)?;
        if fresh && kind == OpKind::Action && matches!(answer, SagaOpAnswer::Done { .. }) {
            crash_point(crash::SAGA_AFTER_ACTION_APPLIED);
        }
        tracing::debug!(op_id = %request.op_id, ?kind, fresh, ?answer, "saga op answered");
        Ok(answer)
    }

    /// `GET /saga/ops/{op_id}`. An op the barrier holds is told only once everything logged
    /// before the question is durable: the coordinator completes (or compensates) a saga on
    /// this answer, so it must not rest on a record a power cut can still take back.
    ///
    /// The answer comes only from the asking coordinator's records (`query`, see
    /// `protocol::saga::OpQuery`); a conflict refusal waits behind the same barrier, and a
    /// refusal for want of a coordinator id, which tells nothing about the op, does not.
    pub async fn saga_op_status(
        &self,
        op_id: &str,
        query: &OpQuery,
    ) -> Result<OpStatusResponse, OpQueryError> {
        let (status, ticket) = {
            let mut state = self.lock();
            let status = state.engine.saga_op_status(op_id, query);
            let rests_on_a_record = match &status {
                Ok(status) => status.status != OpStatus::NotFound,
                Err(OpQueryRefused::Conflict { .. }) => true,
                Err(OpQueryRefused::CoordinatorIdRequired { .. }) => false,
            };
            let ticket =
                rests_on_a_record.then(|| self.submit_counted(&mut state, &repeat_barrier(op_id)));
            (status, ticket)
        };
        if let Some(ticket) = ticket {
            self.wait_durable(ticket).await?;
        }
        Ok(status?)
    }

    async fn wait_durable(&self, ticket: wal::AppendTicket) -> Result<(), RequestError> {
        ticket.wait().await.map(drop).map_err(|e| {
            self.fail(&e);
            RequestError::LogFailed(e)
        })
    }
}

/// A forced record that carries nothing but its place in the log: once it is durable, so is
/// every record before it (the first answer's among them). Replay ignores it.
fn repeat_barrier(op_id: &str) -> Record {
    Record::FencedRepeat {
        op_id: op_id.to_string(),
    }
}
