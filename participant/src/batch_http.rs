//! The batched phase messages (`protocol::batch`, docs/participants.md "Batched phase
//! messages"): `GET /2pc/capabilities` offers them, `POST /2pc/batch/prepare` and
//! `POST /2pc/batch/decide` take many attempts' messages in one request.
//!
//! Each item runs exactly as the same message sent alone would (`Participant::prepare`,
//! `commit`, `abort`: its vote or ack only once its record is durable), all of them at once, so
//! their forced records are submitted together and share the log's fsyncs. The answer streams
//! one line per item as each becomes ready (the lines ready together in one write): a prepare
//! queued behind a lock holds back no other item's answer. Items run to their end even if the
//! sender goes away, as a lone prepare's queued wait does. The PostgreSQL backend serves the
//! same routes through [`answer_prepares`] and [`answer_decisions`].

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use protocol::batch::{BatchCapability, Capabilities, DecisionBatch, NDJSON, PrepareBatch};
use protocol::limits::{BATCH_BODY_BYTES_MAX, BATCH_ITEMS_MAX};
use protocol::{
    AckResponse, Decision, DecisionRequest, ErrorBody, ErrorCode, GlobalTxId, PrepareRequest, Vote,
};
use serde_json::value::RawValue;

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

/// One item's answer as the per-message route would have given it: its body's JSON text.
pub type ItemAnswer = Result<Box<RawValue>, ApiError>;

/// One answer line as written: a [`BatchAnswer`](protocol::batch::BatchAnswer) whose body is
/// already JSON text (encoded once, not built as a `Value` and encoded again).
#[derive(serde::Serialize)]
struct AnswerLine<'a> {
    index: usize,
    gtid: &'a GlobalTxId,
    status: u16,
    body: &'a RawValue,
}

/// Runs every item's future and streams a [`BatchAnswer`](protocol::batch::BatchAnswer) line
/// for each as it finishes. `durable_point` is the crash point between an item's durable record
/// and its line (only for an item that succeeded).
///
/// The items run inside the answer's body stream, not as tasks of their own: each poll drives
/// all of them and hands hyper every line that is ready as one chunk. Items that share a group
/// commit finish on the same wake-up, so their lines leave in one write (as tasks, each line
/// woke the connection on its own and went out in a write of its own). A body dropped before
/// its end (the sender went away) hands the items still running to a task that finishes them.
/// `items` is taken as an iterator and each future moved straight into the set: collected
/// first, a batch's futures (a few KB each) made one large allocation per batch, fresh pages
/// to fault in and a copy of every future, which showed in a participant's profile at c64.
/// A sender that stops reading does not stall them either: a whole answer (at most
/// `BATCH_ITEMS_MAX` lines of a few hundred bytes) fits in the sockets' buffers, so hyper keeps
/// polling the body until every item has its line.
pub async fn stream_answers<I, F>(items: I, durable_point: &'static str) -> Response
where
    I: IntoIterator<Item = (GlobalTxId, F)>,
    F: Future<Output = ItemAnswer> + Send + 'static,
{
    let running: FuturesUnordered<_> = items
        .into_iter()
        .enumerate()
        .map(|(index, (gtid, item))| async move {
            let answer = item.await;
            if answer.is_ok() {
                crash_point(durable_point);
            }
            answer_line(index, gtid, answer)
        })
        .collect();
    let mut lines = Lines {
        running,
        first: None,
    };
    // The head waits for the first lines, so that hyper writes both in one write (with the
    // body's end too when every item answered at once, as the items of one group commit do);
    // sent at once, the head cost a write here and a wake-up at the coordinator of its own.
    // Dropped meanwhile (the sender went away), `lines` still runs every item to its end.
    let first = std::future::poll_fn(|cx| lines.poll_lines(cx)).await;
    lines.first = first;
    ([(header::CONTENT_TYPE, NDJSON)], Body::from_stream(lines)).into_response()
}

/// One item's line, newline included (empty if it cannot be encoded, which is logged).
fn answer_line(index: usize, gtid: GlobalTxId, answer: ItemAnswer) -> Vec<u8> {
    let (status, body) = match answer {
        Ok(body) => (200, body),
        Err(error) => (error.code.status(), error_json(error)),
    };
    let line = AnswerLine {
        index,
        gtid: &gtid,
        status,
        body: &body,
    };
    let mut bytes = Vec::with_capacity(body.get().len() + gtid.as_str().len() + 48);
    match serde_json::to_writer(&mut bytes, &line) {
        Ok(()) => {
            bytes.push(b'\n');
            bytes
        }
        Err(error) => {
            tracing::error!(%error, "a batch answer line cannot be encoded");
            Vec::new()
        }
    }
}

fn error_json(error: ApiError) -> Box<RawValue> {
    let body = ErrorBody::new(error.code, error.message);
    let body = match error.highest_epoch {
        Some(epoch) => body.with_highest_epoch(epoch),
        None => body,
    };
    to_raw(&body)
}

/// `value` as JSON text; `null` if it cannot be encoded (no type answered here can fail).
fn to_raw<T: serde::Serialize>(value: &T) -> Box<RawValue> {
    serde_json::value::to_raw_value(value).unwrap_or_else(|error| {
        tracing::error!(%error, "a batch answer body cannot be encoded");
        serde_json::value::to_raw_value(&()).unwrap_or_default()
    })
}

/// The items still running, as a body stream of answer lines: each chunk every line ready at
/// that poll (the first one taken before the head, see [`stream_answers`]); it ends when every
/// item has given its line.
struct Lines<F: Future<Output = Vec<u8>> + Send + 'static> {
    running: FuturesUnordered<F>,
    first: Option<Bytes>,
}

impl<F: Future<Output = Vec<u8>> + Send + 'static> Lines<F> {
    /// Every line ready now, as one chunk; `None` once every item has given its line.
    fn poll_lines(&mut self, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        let mut chunk = Vec::new();
        loop {
            match futures_core::Stream::poll_next(Pin::new(&mut self.running), cx) {
                Poll::Ready(Some(line)) => chunk.extend_from_slice(&line),
                // Nothing more ready now (or every item has answered): what is ready goes.
                Poll::Ready(None) | Poll::Pending if !chunk.is_empty() => {
                    return Poll::Ready(Some(Bytes::from(chunk)));
                }
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl<F: Future<Output = Vec<u8>> + Send + 'static> futures_core::Stream for Lines<F> {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(first) = self.first.take() {
            return Poll::Ready(Some(Ok(first)));
        }
        self.poll_lines(cx).map(|chunk| chunk.map(Ok))
    }
}

impl<F: Future<Output = Vec<u8>> + Send + 'static> Drop for Lines<F> {
    fn drop(&mut self) {
        if self.running.is_empty() {
            return;
        }
        // The sender went away: the items' effects stand all the same, so they run to their
        // end (a queued prepare until granted or past its deadline), their lines unread.
        let mut running = std::mem::take(&mut self.running);
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move { while running.next().await.is_some() {} });
        }
    }
}

pub(crate) async fn capabilities() -> axum::Json<Capabilities> {
    axum::Json(offered())
}

/// Answers a batch of prepares: `prepare` runs one as `/2pc/prepare` alone would.
pub async fn answer_prepares<P, F, E>(batch: PrepareBatch, prepare: P) -> Response
where
    P: Fn(PrepareRequest) -> F,
    F: Future<Output = Result<Vote, E>> + Send + 'static,
    ApiError: From<E>,
{
    let items = batch.prepares.into_iter().map(|request| {
        let gtid = request.gtid.clone();
        let vote = prepare(request);
        let answer = async move {
            serde_json::value::to_raw_value(&vote.await?)
                .map_err(|e| ApiError::new(ErrorCode::Internal, e.to_string()))
        };
        (gtid, answer)
    });
    stream_answers(items, crash::AFTER_BATCH_ITEM_DURABLE).await
}

/// Answers a batch of decisions: `decide` runs one as `/2pc/commit` or `/2pc/abort` alone would.
pub async fn answer_decisions<D, F, E>(batch: DecisionBatch, decide: D) -> Response
where
    D: Fn(Decision, DecisionRequest) -> F,
    F: Future<Output = Result<(), E>> + Send + 'static,
    ApiError: From<E>,
{
    let items = batch.decisions.into_iter().map(|item| {
        let gtid = item.request.gtid.clone();
        let decided = decide(item.decision, item.request);
        let answer = async move {
            decided.await?;
            Ok(to_raw(&AckResponse { ack: true }))
        };
        (gtid, answer)
    });
    stream_answers(items, crash::AFTER_BATCH_ITEM_DURABLE).await
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
    })
    .await)
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
    })
    .await)
}
