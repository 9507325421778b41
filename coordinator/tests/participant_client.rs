//! The coordinator's client to participants (`http_client::Endpoint`) under the outbound
//! policy: against a redirecting, an endless and a silent server, and over HTTPS with a
//! trusted CA, an untrusted one, and a certificate for another name.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use coordinator::http_client::{ANSWER_BYTES_MAX, CallError, Endpoint};
use net::test_certs::TestCa;
use net::test_servers::{endless_server, redirecting_server, silent_server};
use tokio::net::TcpListener;

#[tokio::test]
async fn a_redirect_is_an_error_and_is_not_followed() {
    let (redirecting, followed) = redirecting_server(
        "308 Permanent Redirect",
        b"HTTP/1.1 200 OK\r\ncontent-length: 14\r\n\r\n{\"vote\":\"yes\"}".to_vec(),
    )
    .await;
    let endpoint = Endpoint::new(&redirecting).unwrap();
    let error = endpoint
        .post_json("/2pc/prepare", b"{}".to_vec(), Duration::from_secs(2))
        .await
        .unwrap_err();
    assert!(
        matches!(error, CallError::Redirect { status: 308, .. }),
        "{error}"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !followed.load(Ordering::SeqCst),
        "the redirect was followed"
    );
    assert_eq!(endpoint.idle_connections(), 0);
}

#[tokio::test]
async fn an_endless_answer_is_cut_off_at_the_cap() {
    let written = Arc::new(AtomicU64::new(0));
    let endless = endless_server(b'x', Arc::clone(&written)).await;
    let endpoint = Endpoint::new(&endless).unwrap();
    let started = Instant::now();
    let error = endpoint
        .post_json("/2pc/prepare", b"{}".to_vec(), Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(matches!(error, CallError::Body { .. }), "{error}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "not cut off by the timeout"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let sent = written.load(Ordering::SeqCst);
    assert!(
        sent < 32 * ANSWER_BYTES_MAX as u64,
        "{sent} bytes sent for a {ANSWER_BYTES_MAX}-byte cap"
    );
}

#[tokio::test]
async fn a_silent_server_costs_the_call_its_timeout_and_no_more() {
    let silent = silent_server().await;
    let endpoint = Endpoint::new(&silent).unwrap();
    let started = Instant::now();
    let error = endpoint
        .post_json("/2pc/commit", b"{}".to_vec(), Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(matches!(error, CallError::Timeout(_)), "{error}");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(2),
        "{took:?}"
    );
}

#[tokio::test]
async fn a_server_silent_in_the_tls_handshake_costs_the_call_its_timeout() {
    // Accepts TCP, reads the ClientHello, never answers it.
    let silent = silent_server().await;
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("test ca").unwrap();
    let tls = net::client_config(&ca.write_cert(dir.path()).unwrap()).unwrap();
    let endpoint = Endpoint::new(&silent.replace("http://", "https://"))
        .unwrap()
        .with_tls(tls);
    let started = Instant::now();
    let error = endpoint
        .post_json("/2pc/prepare", b"{}".to_vec(), Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(matches!(error, CallError::Timeout(_)), "{error}");
    assert!(started.elapsed() < Duration::from_secs(2));
}

async fn serve_tls(ca: &TestCa, names: &[&str], dir: &std::path::Path) -> String {
    use axum::routing::post;
    let files = ca.server(names).unwrap().write(dir, "server").unwrap();
    let config = net::server_config(&files.cert, &files.key).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let app = axum::Router::new().route("/2pc/prepare", post(|| async { "{\"vote\":\"yes\"}" }));
    tokio::spawn(net::serve(
        listener,
        app,
        Some(config),
        std::future::pending(),
    ));
    format!("https://127.0.0.1:{port}")
}

#[tokio::test]
async fn https_works_with_the_ca_and_only_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("the cluster ca").unwrap();
    let url = serve_tls(&ca, &["127.0.0.1"], dir.path()).await;
    let trusted = net::client_config(&ca.write_cert(dir.path()).unwrap()).unwrap();

    let endpoint = Endpoint::new(&url).unwrap().with_tls(Arc::clone(&trusted));
    for _ in 0..3 {
        let answer = endpoint
            .post_json("/2pc/prepare", b"{}".to_vec(), Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(answer.status, 200);
        assert_eq!(&answer.body[..], b"{\"vote\":\"yes\"}");
        assert_eq!(
            endpoint.idle_connections(),
            1,
            "the TLS connection is reused"
        );
    }

    let other = TestCa::new("another ca").unwrap();
    let other_dir = tempfile::tempdir().unwrap();
    let untrusted = net::client_config(&other.write_cert(other_dir.path()).unwrap()).unwrap();
    for (who, endpoint) in [
        (
            "another CA",
            Endpoint::new(&url).unwrap().with_tls(untrusted),
        ),
        ("no CA given", Endpoint::new(&url).unwrap()),
    ] {
        let error = endpoint
            .post_json("/2pc/prepare", b"{}".to_vec(), Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(matches!(error, CallError::Tls { .. }), "{who}: {error}");
        assert!(
            format!("{error:?}").contains("UnknownIssuer"),
            "{who}: {error:?}"
        );
    }

    let plain = Endpoint::new(&url.replace("https://", "http://")).unwrap();
    assert!(
        plain
            .post_json("/2pc/prepare", b"{}".to_vec(), Duration::from_secs(5))
            .await
            .is_err(),
        "plain HTTP to a TLS port"
    );
}

#[tokio::test]
async fn the_certificate_must_name_the_host_of_the_url() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("the cluster ca").unwrap();
    let url = serve_tls(&ca, &["inventory.internal"], dir.path()).await;
    let trusted = net::client_config(&ca.write_cert(dir.path()).unwrap()).unwrap();
    let endpoint = Endpoint::new(&url).unwrap().with_tls(trusted);
    let error = endpoint
        .post_json("/2pc/prepare", b"{}".to_vec(), Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(
        format!("{error:?}").contains("NotValidForName"),
        "{error:?}"
    );
}
