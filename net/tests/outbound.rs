//! The outbound policy against misbehaving servers: a redirect is an error and is not
//! followed, an endless or oversized answer is an error without being read to its end, a
//! silent server costs the caller its time bound and no more.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use net::outbound::{AnswerError, Limits, read_answer, reqwest_client};
use net::test_servers::{endless_server, raw_server, redirecting_server, silent_server};
use tokio::io::AsyncWriteExt;

fn limits() -> Limits {
    Limits {
        connect: Duration::from_secs(2),
        total: Duration::from_secs(2),
        answer_bytes_max: 1 << 20,
    }
}

#[tokio::test]
async fn a_redirect_is_an_error_and_is_not_followed() {
    let (redirecting, followed) = redirecting_server(
        "307 Temporary Redirect",
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".to_vec(),
    )
    .await;
    let client = reqwest_client(&limits(), None).unwrap();
    let response = client.get(format!("{redirecting}/x")).send().await.unwrap();
    let error = read_answer(response, limits().answer_bytes_max)
        .await
        .unwrap_err();
    assert!(
        matches!(&error, AnswerError::Redirect { status: 307, location: Some(l) } if l.ends_with("/elsewhere")),
        "{error}"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !followed.load(Ordering::SeqCst),
        "the redirect was followed"
    );
}

#[tokio::test]
async fn an_endless_answer_is_cut_off_at_the_cap() {
    let written = Arc::new(AtomicU64::new(0));
    let endless = endless_server(b'x', Arc::clone(&written)).await;
    let client = reqwest_client(&limits(), None).unwrap();
    let started = Instant::now();
    let response = client.get(format!("{endless}/x")).send().await.unwrap();
    let error = read_answer(response, limits().answer_bytes_max)
        .await
        .unwrap_err();
    assert!(
        matches!(error, AnswerError::TooLarge { max } if max == 1 << 20),
        "{error}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "not cut off by the timeout"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let sent = written.load(Ordering::SeqCst);
    assert!(
        sent < 32 << 20,
        "the client read {sent} bytes for a 1 MiB cap"
    );
}

#[tokio::test]
async fn an_announced_oversized_answer_is_refused_before_reading() {
    let big = raw_server(|mut socket| async move {
        let _ = socket
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 10000000\r\n\r\nxx")
            .await;
        // Then nothing: a client that tried to read it would wait for its timeout.
        tokio::time::sleep(Duration::from_secs(10)).await;
    })
    .await;
    let client = reqwest_client(&limits(), None).unwrap();
    let started = Instant::now();
    let response = client.get(format!("{big}/x")).send().await.unwrap();
    let error = read_answer(response, limits().answer_bytes_max)
        .await
        .unwrap_err();
    assert!(matches!(error, AnswerError::TooLarge { .. }), "{error}");
    assert!(started.elapsed() < Duration::from_secs(1));
}

#[tokio::test]
async fn a_silent_server_costs_the_total_bound() {
    let silent = silent_server().await;
    let mut bounds = limits();
    bounds.total = Duration::from_millis(500);
    let client = reqwest_client(&bounds, None).unwrap();
    let started = Instant::now();
    let error = client.get(format!("{silent}/x")).send().await.unwrap_err();
    assert!(error.is_timeout(), "{error:?}");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(450) && took < Duration::from_secs(3),
        "{took:?}"
    );
}

#[tokio::test]
async fn a_server_that_sends_headers_then_nothing_costs_the_total_bound() {
    let stalling = raw_server(|mut socket| async move {
        let _ = socket
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nabc")
            .await;
        tokio::time::sleep(Duration::from_secs(30)).await;
    })
    .await;
    let mut bounds = limits();
    bounds.total = Duration::from_millis(500);
    let client = reqwest_client(&bounds, None).unwrap();
    let started = Instant::now();
    let response = client.get(format!("{stalling}/x")).send().await.unwrap();
    let error = read_answer(response, bounds.answer_bytes_max)
        .await
        .unwrap_err();
    assert!(
        matches!(&error, AnswerError::Read(e) if e.is_timeout()),
        "{error:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(3));
}
