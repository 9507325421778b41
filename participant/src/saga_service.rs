//! The saga routes' shell (issue 13): runs one op through the engine's barrier under the
//! engine mutex, submits its record forced under that mutex (log order = engine order), and
//! answers only once the record is durable.

use protocol::saga::{OpKind, OpStatusResponse, SagaOpAnswer, SagaOpRequest};

use crate::crash::{self, crash_point};
use crate::engine::saga::SagaStepped;
use crate::resource::Resource;
use crate::service::{Participant, RequestError, now_ms};

/// Why a saga op got no `done`/`failed` answer (the coordinator treats it as unknown).
#[derive(Debug, thiserror::Error)]
pub enum SagaOpError {
    /// A key is locked by a prepared 2PC transaction; nothing was recorded.
    #[error("busy: {0}")]
    Busy(String),
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
        let (answer, ticket) = {
            let mut state = self.lock();
            match state.engine.saga_op(kind, &request, now_ms()) {
                SagaStepped::Busy(why) => return Err(SagaOpError::Busy(why)),
                SagaStepped::Answer { answer, record } => {
                    let ticket = record.map(|record| self.submit_counted(&mut state, &record));
                    (answer, ticket)
                }
            }
        };
        let fresh = ticket.is_some();
        if let Some(ticket) = ticket {
            ticket.wait().await.map_err(|e| {
                self.fail(&e);
                RequestError::LogFailed(e)
            })?;
        }
        if fresh && kind == OpKind::Action && matches!(answer, SagaOpAnswer::Done { .. }) {
            crash_point(crash::SAGA_AFTER_ACTION_APPLIED);
        }
        tracing::debug!(op_id = %request.op_id, ?kind, fresh, ?answer, "saga op answered");
        Ok(answer)
    }

    /// `GET /saga/ops/{op_id}`.
    pub fn saga_op_status(&self, op_id: &str) -> OpStatusResponse {
        self.lock().engine.saga_op_status(op_id)
    }
}
