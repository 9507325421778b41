//! The bounds on slow and idle clients, over plain HTTP and TLS alike: a connection that stops
//! in the middle of its head is closed after the header bound; a kept-alive connection is
//! closed after the idle bound (and not after the shorter header bound); at the connection
//! cap a newcomer is not served while the others are held and is served once they go; at
//! shutdown a request in flight finishes and idle connections close.
//!
//! Timing: every bound here is a few hundred ms, every wait for something that must happen is
//! seconds, and nothing is asserted to happen at an exact time.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use net::ServeLimits;
use net::test_certs::TestCa;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

/// Long enough for anything that must happen to happen on a loaded machine.
const GENEROUS: Duration = Duration::from_secs(10);
const PARTIAL_HEAD: &[u8] = b"GET /ok HTTP/1.1\r\nHost: x\r\n";

trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

fn router() -> Router {
    Router::new().route("/ok", get(|| async { "ok" })).route(
        "/slow",
        get(|| async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            "slow"
        }),
    )
}

/// A server and how to reach it, plain or TLS.
struct Server {
    addr: SocketAddr,
    tls: Option<(Arc<rustls::ClientConfig>, tempfile::TempDir)>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Server {
    async fn start(tls: bool, limits: ServeLimits) -> Server {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (server_tls, client_tls) = if tls {
            let dir = tempfile::tempdir().unwrap();
            let ca = TestCa::new("test ca").unwrap();
            let files = ca
                .server(&["127.0.0.1"])
                .unwrap()
                .write(dir.path(), "server")
                .unwrap();
            let server = net::server_config(&files.cert, &files.key).unwrap();
            let client = net::client_config(&ca.write_cert(dir.path()).unwrap()).unwrap();
            (Some(server), Some((client, dir)))
        } else {
            (None, None)
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(net::serve_with_limits(
            listener,
            router(),
            server_tls,
            limits,
            async {
                let _ = stopped.await;
            },
        ));
        Server {
            addr,
            tls: client_tls,
            stop: Some(stop),
            task,
        }
    }

    /// A raw connection, TLS handshake done if the server speaks TLS.
    async fn connect(&self) -> Box<dyn Stream> {
        let tcp = TcpStream::connect(self.addr).await.unwrap();
        match &self.tls {
            None => Box::new(tcp),
            Some((config, _)) => Box::new(
                net::tls_connect::connect(
                    tcp,
                    net::tls_connect::server_name("127.0.0.1").unwrap(),
                    Arc::clone(config),
                    GENEROUS,
                )
                .await
                .unwrap(),
            ),
        }
    }
}

fn limits(header_ms: u64, idle_ms: u64, connections_max: usize) -> ServeLimits {
    ServeLimits {
        header_read_timeout: Duration::from_millis(header_ms),
        idle_timeout: Duration::from_millis(idle_ms),
        connections_max,
    }
}

/// Reads until the bytes so far end with `body`; false if the connection closes first.
async fn answered(stream: &mut Box<dyn Stream>, body: &str) -> bool {
    let mut seen = Vec::new();
    let mut chunk = [0u8; 1024];
    while !seen.ends_with(body.as_bytes()) {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => seen.extend_from_slice(&chunk[..n]),
        }
    }
    true
}

async fn ask(stream: &mut Box<dyn Stream>, path: &str) -> bool {
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let body = path.trim_start_matches('/').to_string();
    tokio::time::timeout(GENEROUS, answered(stream, &body))
        .await
        .unwrap_or(false)
}

/// True when the server closes the connection within `bound` (anything it sends is skipped).
async fn closed_within(stream: &mut Box<dyn Stream>, bound: Duration) -> bool {
    let mut chunk = [0u8; 1024];
    let read_to_end = async {
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(bound, read_to_end).await.is_ok()
}

async fn a_partial_head_is_cut_off_after_the_header_bound(tls: bool) {
    let server = Server::start(tls, limits(200, 60_000, 16)).await;
    let mut partial = server.connect().await;
    partial.write_all(PARTIAL_HEAD).await.unwrap();
    let mut silent = server.connect().await;
    let mut prompt = server.connect().await;
    assert!(ask(&mut prompt, "/ok").await, "a prompt client is answered");
    assert!(
        closed_within(&mut partial, GENEROUS).await,
        "a head that stops half way is cut off"
    );
    assert!(
        closed_within(&mut silent, GENEROUS).await,
        "a connection that never starts its head too"
    );
}

#[tokio::test]
async fn a_partial_head_is_cut_off_after_the_header_bound_http() {
    a_partial_head_is_cut_off_after_the_header_bound(false).await;
}

#[tokio::test]
async fn a_partial_head_is_cut_off_after_the_header_bound_tls() {
    a_partial_head_is_cut_off_after_the_header_bound(true).await;
}

async fn an_idle_connection_is_closed_after_the_idle_bound_not_the_header_bound(tls: bool) {
    let server = Server::start(tls, limits(100, 1_500, 16)).await;
    let mut kept = server.connect().await;
    assert!(ask(&mut kept, "/ok").await);
    // Many header bounds later, well inside the idle bound, the connection still serves.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(ask(&mut kept, "/ok").await, "idle is not a slow head");
    assert!(
        closed_within(&mut kept, GENEROUS).await,
        "closed once idle past the idle bound"
    );
}

#[tokio::test]
async fn an_idle_connection_is_closed_after_the_idle_bound_http() {
    an_idle_connection_is_closed_after_the_idle_bound_not_the_header_bound(false).await;
}

#[tokio::test]
async fn an_idle_connection_is_closed_after_the_idle_bound_tls() {
    an_idle_connection_is_closed_after_the_idle_bound_not_the_header_bound(true).await;
}

async fn a_later_head_that_stops_is_cut_off_after_the_header_bound(tls: bool) {
    // The idle bound is far past GENEROUS: only the header bound can close this in time.
    let server = Server::start(tls, limits(200, 600_000, 16)).await;
    let mut kept = server.connect().await;
    assert!(ask(&mut kept, "/ok").await);
    // Idle past a header bound first, so the connection's deadline is the idle one when the
    // head starts.
    tokio::time::sleep(Duration::from_millis(500)).await;
    kept.write_all(PARTIAL_HEAD).await.unwrap();
    assert!(
        closed_within(&mut kept, GENEROUS).await,
        "a second head that stops half way is cut off, not left to the idle bound"
    );
}

#[tokio::test]
async fn a_later_head_that_stops_is_cut_off_after_the_header_bound_http() {
    a_later_head_that_stops_is_cut_off_after_the_header_bound(false).await;
}

#[tokio::test]
async fn a_later_head_that_stops_is_cut_off_after_the_header_bound_tls() {
    a_later_head_that_stops_is_cut_off_after_the_header_bound(true).await;
}

async fn at_the_cap_a_newcomer_waits_until_a_place_frees(tls: bool) {
    let server = Arc::new(Server::start(tls, limits(10_000, 60_000, 2)).await);
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut connection = server.connect().await;
        assert!(ask(&mut connection, "/ok").await);
        held.push(connection);
    }
    let (served, mut answer) = oneshot::channel();
    let newcomer = Arc::clone(&server);
    tokio::spawn(async move {
        // The TCP connect completes in the kernel's backlog; nothing more until accepted.
        let mut connection = newcomer.connect().await;
        let _ = served.send(ask(&mut connection, "/ok").await);
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        answer.try_recv().is_err(),
        "not served while two connections hold the cap"
    );
    drop(held);
    let outcome = tokio::time::timeout(GENEROUS, answer).await;
    assert!(
        matches!(outcome, Ok(Ok(true))),
        "served once a place freed: {outcome:?}"
    );
}

#[tokio::test]
async fn at_the_cap_a_newcomer_waits_until_a_place_frees_http() {
    at_the_cap_a_newcomer_waits_until_a_place_frees(false).await;
}

#[tokio::test]
async fn at_the_cap_a_newcomer_waits_until_a_place_frees_tls() {
    at_the_cap_a_newcomer_waits_until_a_place_frees(true).await;
}

async fn shutdown_finishes_requests_in_flight_and_closes_the_rest(tls: bool) {
    let mut server = Server::start(tls, limits(10_000, 60_000, 16)).await;
    let mut idle = server.connect().await;
    assert!(ask(&mut idle, "/ok").await);
    let mut partial = server.connect().await;
    partial.write_all(PARTIAL_HEAD).await.unwrap();
    let mut busy = server.connect().await;
    busy.write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    if let Some(stop) = server.stop.take() {
        stop.send(()).unwrap();
    }
    let finished = tokio::time::timeout(GENEROUS, answered(&mut busy, "slow")).await;
    assert!(
        matches!(finished, Ok(true)),
        "the request in flight is answered"
    );
    for (what, connection) in [("idle", &mut idle), ("partial", &mut partial)] {
        assert!(
            closed_within(connection, GENEROUS).await,
            "{what} closed at shutdown"
        );
    }
    let ended = tokio::time::timeout(GENEROUS, &mut server.task).await;
    assert!(matches!(ended, Ok(Ok(Ok(())))), "serve returns: {ended:?}");
    assert!(
        TcpStream::connect(server.addr).await.is_err(),
        "the listener is closed"
    );
}

#[tokio::test]
async fn shutdown_finishes_requests_in_flight_and_closes_the_rest_http() {
    shutdown_finishes_requests_in_flight_and_closes_the_rest(false).await;
}

#[tokio::test]
async fn shutdown_finishes_requests_in_flight_and_closes_the_rest_tls() {
    shutdown_finishes_requests_in_flight_and_closes_the_rest(true).await;
}
