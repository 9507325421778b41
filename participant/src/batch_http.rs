//! The batched phase messages (`protocol::batch`, docs/participants.md "Batched phase
//! messages"): `GET /2pc/capabilities` offers them, `POST /2pc/batch/prepare` and
//! `POST /2pc/batch/decide` take many attempts' messages in one request.
//!
//! Each item runs exactly as the same message sent alone would (`Participant::prepare`,
//! `commit`, `abort`: its vote or ack only once its record is durable), all of them at once, so
//! their forced records are submitted together and share the log's fsyncs. The answer streams
//! one line per item as each becomes ready: a prepare queued behind a lock holds back no other
//! item's answer. Items run to their end even if the sender goes away, as a lone prepare's
//! queued wait does. The PostgreSQL backend serves the same routes through [`answer_prepares`] and
//! [`answer_decisions`].

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use protocol::batch::{
    BatchAnswer, BatchCapability, Capabilities, DecisionBatch, NDJSON, PrepareBatch,
};
use protocol::limits::{BATCH_BODY_BYTES_MAX, BATCH_ITEMS_MAX};
use protocol::{
    AckResponse, Decision, DecisionRequest, ErrorBody, ErrorCode, GlobalTxId, PrepareRequest, Vote,
};

use crate::api_error::{ApiError, json_body};
use crate::crash::{self, crash_point};
use crate::resource::Resource;
use crate::service::Participant;

/// What this participant offers: batches of up to [`BATCH_ITEMS_MAX`] items.
pub fn offered() -> Capabilities {
    Capabilities {
        batch: Some(BatchCapability {
            max_items: BATCH_ITEMS_MAX,
        }),
    }
}

/// A batch's body: JSON as any other, within [`BATCH_BODY_BYTES_MAX`] (the route's own body
/// limit; over it, 413 `body_too_large` naming that limit).
pub fn batch_body<T: serde::de::DeserializeOwned>(
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    if let Err(rejection) = &body
        && rejection.status() == StatusCode::PAYLOAD_TOO_LARGE
    {
        return Err(ApiError::new(
            ErrorCode::BodyTooLarge,
            format!("a batch's body is larger than {BATCH_BODY_BYTES_MAX} bytes"),
        ));
    }
    json_body(headers, body)
}

/// 413 `body_too_large` for a batch of more items than offered, 400 for an empty one.
pub fn check_items(items: usize) -> Result<(), ApiError> {
    if items > BATCH_ITEMS_MAX {
        return Err(ApiError::new(
            ErrorCode::BodyTooLarge,
            format!("a batch of {items} items; this participant takes at most {BATCH_ITEMS_MAX}"),
        ));
    }
    if items == 0 {
        return Err(ApiError::new(
            ErrorCode::MalformedJson,
            "a batch must hold at least one item",
        ));
    }
    Ok(())
}

/// One item's answer as the per-message route would have given it.
pub type ItemAnswer = Result<serde_json::Value, ApiError>;

/// Runs every item's future as a task of its own and streams a [`BatchAnswer`] line for each
/// as it finishes. `durable_point` is the crash point between an item's durable record and its
/// line (only for an item that succeeded).
pub fn stream_answers<F>(items: Vec<(GlobalTxId, F)>, durable_point: &'static str) -> Response
where
    F: Future<Output = ItemAnswer> + Send + 'static,
{
    let (lines, receiver) = tokio::sync::mpsc::channel(items.len().max(1));
    for (index, (gtid, item)) in items.into_iter().enumerate() {
        let lines = lines.clone();
        tokio::spawn(async move {
            let answer = item.await;
            if answer.is_ok() {
                crash_point(durable_point);
            }
            let (status, body) = match answer {
                Ok(body) => (200, body),
                Err(error) => (error.code.status(), error_json(error)),
            };
            let line = BatchAnswer {
                index,
                gtid,
                status,
                body,
            };
            match serde_json::to_vec(&line) {
                Ok(mut bytes) => {
                    bytes.push(b'\n');
                    // The sender may have gone; the item's effect stands all the same.
                    let _ = lines.send(Bytes::from(bytes)).await;
                }
                Err(error) => tracing::error!(%error, "a batch answer line cannot be encoded"),
            }
        });
    }
    (
        [(header::CONTENT_TYPE, NDJSON)],
        Body::from_stream(Lines(receiver)),
    )
        .into_response()
}

fn error_json(error: ApiError) -> serde_json::Value {
    let body = ErrorBody::new(error.code, error.message);
    let body = match error.highest_epoch {
        Some(epoch) => body.with_highest_epoch(epoch),
        None => body,
    };
    serde_json::to_value(body).unwrap_or(serde_json::Value::Null)
}

/// The answer lines as a body stream: it ends when every item's task has sent its line.
struct Lines(tokio::sync::mpsc::Receiver<Bytes>);

impl futures_core::Stream for Lines {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_recv(cx).map(|line| line.map(Ok))
    }
}

pub(crate) async fn capabilities() -> axum::Json<Capabilities> {
    axum::Json(offered())
}

/// Answers a batch of prepares: `prepare` runs one as `/2pc/prepare` alone would.
pub fn answer_prepares<P, F, E>(batch: PrepareBatch, prepare: P) -> Response
where
    P: Fn(PrepareRequest) -> F,
    F: Future<Output = Result<Vote, E>> + Send + 'static,
    ApiError: From<E>,
{
    let items = batch
        .prepares
        .into_iter()
        .map(|request| {
            let gtid = request.gtid.clone();
            let vote = prepare(request);
            let answer = async move {
                serde_json::to_value(vote.await?)
                    .map_err(|e| ApiError::new(ErrorCode::Internal, e.to_string()))
            };
            (gtid, answer)
        })
        .collect();
    stream_answers(items, crash::AFTER_BATCH_ITEM_DURABLE)
}

/// Answers a batch of decisions: `decide` runs one as `/2pc/commit` or `/2pc/abort` alone would.
pub fn answer_decisions<D, F, E>(batch: DecisionBatch, decide: D) -> Response
where
    D: Fn(Decision, DecisionRequest) -> F,
    F: Future<Output = Result<(), E>> + Send + 'static,
    ApiError: From<E>,
{
    let items = batch
        .decisions
        .into_iter()
        .map(|item| {
            let gtid = item.request.gtid.clone();
            let decided = decide(item.decision, item.request);
            let answer = async move {
                decided.await?;
                Ok(serde_json::json!(AckResponse { ack: true }))
            };
            (gtid, answer)
        })
        .collect();
    stream_answers(items, crash::AFTER_BATCH_ITEM_DURABLE)
}

pub(crate) async fn batch_prepare<R: Resource>(
    State(participant): State<Participant<R>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let batch: PrepareBatch = batch_body(&headers, body)?;
    check_items(batch.prepares.len())?;
    participant.metrics().count_batch(batch.prepares.len());
    Ok(answer_prepares(batch, move |request| {
        let participant = participant.clone();
        async move { participant.prepare(request).await }
    }))
}

pub(crate) async fn batch_decide<R: Resource>(
    State(participant): State<Participant<R>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let batch: DecisionBatch = batch_body(&headers, body)?;
    check_items(batch.decisions.len())?;
    participant.metrics().count_batch(batch.decisions.len());
    Ok(answer_decisions(batch, move |decision, request| {
        let participant = participant.clone();
        async move {
            match decision {
                Decision::Commit => participant.commit(request).await,
                Decision::Abort => participant.abort(request).await,
            }
        }
    }))
}
