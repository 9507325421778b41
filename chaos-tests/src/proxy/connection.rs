//! One caller connection: read requests, apply the faults planned for each, forward to the
//! upstream, answer or stay silent. Every wait here is bounded by the proxy's options.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::net::tcp::OwnedReadHalf;

use super::counts::Counter;
use super::handle::ProxyHandle;
use super::http1::{self, Request};
use super::schedule::Route;

/// What a connection task needs; shared by every connection of one proxy.
#[derive(Debug)]
pub(crate) struct Context {
    pub handle: ProxyHandle,
    pub client: reqwest::Client,
    /// Upstream base URL without a trailing `/`.
    pub upstream: String,
    pub hold: Duration,
    pub idle: Duration,
    pub body_bytes_max: usize,
}

/// An upstream answer, buffered whole so it can be withheld or written later.
#[derive(Debug)]
struct Answer {
    status: u16,
    reason: String,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
}

enum Outcome {
    Answer(Answer),
    /// No answer, connection held open until the caller gives up (or `hold` passes), then closed.
    Silence,
    /// No answer, connection closed at once (what a caller sees when the node is down).
    Close,
}

pub(crate) async fn serve(stream: TcpStream, ctx: Arc<Context>) {
    let (mut reader, mut writer) = stream.into_split();
    let mut buf = Vec::new();
    loop {
        let next = tokio::time::timeout(
            ctx.idle,
            http1::read_request(&mut reader, &mut buf, ctx.body_bytes_max),
        );
        let request = match next.await {
            Ok(Ok(Some(request))) => request,
            // Idle too long, clean close, or a request the proxy cannot frame: close without an
            // answer. The coordinator only sends Content-Length bodies, so the last is a test bug.
            Err(_) | Ok(Ok(None)) | Ok(Err(_)) => return,
        };
        let close = request.close;
        let route = Route::of_target(&request.target);
        match exchange(request, route, &ctx).await {
            Outcome::Answer(answer) => {
                let written = http1::write_response(
                    &mut writer,
                    answer.status,
                    &answer.reason,
                    &answer.headers,
                    &answer.body,
                    close,
                )
                .await;
                if written.is_err() {
                    return;
                }
                ctx.handle.bump(route, Counter::Answered);
                if close {
                    return;
                }
            }
            Outcome::Silence => {
                hold_until_caller_leaves(&mut reader, ctx.hold).await;
                return;
            }
            Outcome::Close => return,
        }
    }
}

/// One request through the faults: partition, drop, delay, reorder, forward (maybe twice),
/// then partition and drop again on the way back.
async fn exchange(request: Request, route: Route, ctx: &Context) -> Outcome {
    let handle = &ctx.handle;
    handle.bump(route, Counter::Requests);
    if handle.is_partitioned() {
        handle.bump(route, Counter::Partitioned);
        return Outcome::Silence;
    }
    let plan = handle.decide(route);
    if plan.drop_request {
        handle.bump(route, Counter::DroppedRequests);
        return Outcome::Silence;
    }
    if plan.delay_ms > 0 {
        handle.bump(route, Counter::Delayed);
        tokio::time::sleep(Duration::from_millis(plan.delay_ms).min(ctx.hold)).await;
    }
    let release = handle.take_held(route);
    if release.is_none()
        && let Some(hold_ms) = plan.reorder_hold_ms
    {
        let swapped = handle
            .hold_for_reorder(route, Duration::from_millis(hold_ms).min(ctx.hold))
            .await;
        handle.bump(
            route,
            if swapped {
                Counter::Reordered
            } else {
                Counter::ReorderUnpaired
            },
        );
    }
    // A partition may have started while the request was held.
    let first = if handle.is_partitioned() {
        handle.bump(route, Counter::Partitioned);
        None
    } else {
        Some(forward(&request, route, ctx).await)
    };
    if plan.duplicate && first.is_some() {
        handle.bump(route, Counter::Duplicated);
        // The second answer is discarded; the caller sees the first.
        let _second = forward(&request, route, ctx).await;
    }
    // Only now may the held request go, so upstream sees this one first.
    if let Some(release) = release {
        let _ = release.send(());
    }
    let answer = match first {
        None => return Outcome::Silence,
        Some(Err(())) => {
            handle.bump(route, Counter::UpstreamErrors);
            return Outcome::Close;
        }
        Some(Ok(answer)) => answer,
    };
    if handle.is_partitioned() {
        handle.bump(route, Counter::Partitioned);
        return Outcome::Silence;
    }
    if plan.drop_response {
        handle.bump(route, Counter::DroppedResponses);
        return Outcome::Silence;
    }
    Outcome::Answer(answer)
}

async fn forward(request: &Request, route: Route, ctx: &Context) -> Result<Answer, ()> {
    let method = reqwest::Method::from_bytes(request.method.as_bytes()).map_err(|_| ())?;
    let mut builder = ctx
        .client
        .request(method, format!("{}{}", ctx.upstream, request.target))
        .body(request.body.clone());
    for (name, value) in &request.headers {
        builder = builder.header(name.as_str(), value.as_slice());
    }
    ctx.handle.bump(route, Counter::Forwarded);
    let response = builder.send().await.map_err(|_| ())?;
    let status = response.status();
    let headers = response
        .headers()
        .iter()
        .map(|(name, value)| (name.as_str().to_owned(), value.as_bytes().to_vec()))
        .collect();
    let body = response.bytes().await.map_err(|_| ())?.to_vec();
    Ok(Answer {
        status: status.as_u16(),
        reason: status.canonical_reason().unwrap_or("").to_owned(),
        headers,
        body,
    })
}

/// Keeps the connection open without answering until the caller closes it or `hold` passes,
/// so the caller's own timeout is what ends the exchange, as with a lost packet.
async fn hold_until_caller_leaves(reader: &mut OwnedReadHalf, hold: Duration) {
    let drain = async {
        let mut scratch = [0u8; 1024];
        // Anything the caller still sends is ignored; EOF or an error means it gave up.
        while let Ok(n) = reader.read(&mut scratch).await {
            if n == 0 {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(hold, drain).await;
}
