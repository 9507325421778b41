//! Serving over TLS: a client that trusts the CA is answered (and the handler sees its
//! address); a client that trusts another CA, or none, is refused; plain HTTP to the TLS port
//! gets nothing; a certificate must name the host in the URL; a silent connection neither
//! blocks others nor outlives the handshake bound; shutdown is graceful; bad files are named.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::ConnectInfo;
use axum::routing::get;
use net::outbound::{Limits, read_answer, reqwest_client};
use net::test_certs::TestCa;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;

fn router() -> Router {
    Router::new().route(
        "/who",
        get(|ConnectInfo(peer): ConnectInfo<SocketAddr>| async move { peer.ip().to_string() }),
    )
}

struct Served {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

async fn serve_tls(config: Arc<rustls::ServerConfig>) -> Served {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(net::serve(listener, router(), Some(config), async {
        let _ = stopped.await;
    }));
    Served { addr, stop, task }
}

fn server_config(ca: &TestCa, names: &[&str], dir: &Path) -> Arc<rustls::ServerConfig> {
    let files = ca.server(names).unwrap().write(dir, "server").unwrap();
    net::server_config(&files.cert, &files.key).unwrap()
}

fn client(ca: Option<&TestCa>, dir: &Path) -> reqwest::Client {
    let tls = ca.map(|ca| {
        let path = dir.join(format!("trusted-{}.pem", next_number()));
        std::fs::write(&path, ca.cert_pem()).unwrap();
        net::client_config(&path).unwrap()
    });
    reqwest_client(&Limits::service(Duration::from_secs(5)), tls).unwrap()
}

fn next_number() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::SeqCst)
}

#[tokio::test]
async fn a_client_that_trusts_the_ca_is_answered_and_seen_by_its_address() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("test ca").unwrap();
    let served = serve_tls(server_config(&ca, &["127.0.0.1"], dir.path())).await;
    let client = client(Some(&ca), dir.path());
    for _ in 0..3 {
        let response = client
            .get(format!("https://127.0.0.1:{}/who", served.addr.port()))
            .send()
            .await
            .unwrap();
        let (status, body) = read_answer(response, 1024).await.unwrap();
        assert_eq!(status, 200);
        assert_eq!(
            &body[..],
            b"127.0.0.1",
            "ConnectInfo carries the caller's address"
        );
    }
    served.stop.send(()).unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(5), served.task).await;
    assert!(
        matches!(ended, Ok(Ok(Ok(())))),
        "graceful shutdown: {ended:?}"
    );
}

#[tokio::test]
async fn clients_that_do_not_trust_the_ca_are_refused_and_plain_http_gets_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("the real ca").unwrap();
    let other = TestCa::new("another ca").unwrap();
    let served = serve_tls(server_config(&ca, &["127.0.0.1"], dir.path())).await;
    let url = format!("https://127.0.0.1:{}/who", served.addr.port());
    for (who, client) in [
        ("trusts another CA", client(Some(&other), dir.path())),
        ("trusts nobody", client(None, dir.path())),
    ] {
        let error = client.get(&url).send().await.unwrap_err();
        assert!(error.is_connect(), "{who}: {error:?}");
        let chain = format!("{error:?}");
        assert!(chain.contains("UnknownIssuer"), "{who}: {chain}");
    }
    let plain = client(Some(&ca), dir.path())
        .get(format!("http://127.0.0.1:{}/who", served.addr.port()))
        .send()
        .await;
    assert!(plain.is_err(), "plain HTTP to the TLS port: {plain:?}");
    // The server is still there for a client that does it right.
    let response = client(Some(&ca), dir.path())
        .get(&url)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
}

#[tokio::test]
async fn the_certificate_must_name_the_host_in_the_url() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("test ca").unwrap();
    let served = serve_tls(server_config(&ca, &["localhost"], dir.path())).await;
    let client = client(Some(&ca), dir.path());
    let by_ip = client
        .get(format!("https://127.0.0.1:{}/who", served.addr.port()))
        .send()
        .await
        .unwrap_err();
    assert!(
        format!("{by_ip:?}").contains("NotValidForName"),
        "{by_ip:?}"
    );
    let by_name = client
        .get(format!("https://localhost:{}/who", served.addr.port()))
        .send()
        .await;
    // localhost may resolve to ::1 first, where nobody listens; reqwest then tries 127.0.0.1.
    assert_eq!(by_name.unwrap().status(), 200);
}

#[tokio::test]
async fn a_silent_connection_blocks_nobody_and_is_closed_after_the_handshake_bound() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("test ca").unwrap();
    let config = server_config(&ca, &["127.0.0.1"], dir.path());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let bound = Duration::from_millis(300);
    let limits = net::ServeLimits {
        header_read_timeout: bound,
        ..net::ServeLimits::default()
    };
    tokio::spawn(net::serve_with_limits(
        listener,
        router(),
        Some(config),
        limits,
        std::future::pending(),
    ));
    let mut silent = Vec::new();
    for _ in 0..20 {
        silent.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    let started = Instant::now();
    let response = client(Some(&ca), dir.path())
        .get(format!("https://127.0.0.1:{}/who", addr.port()))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(
        started.elapsed() < bound,
        "answered while 20 peers sat silent"
    );
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(5), silent[0].read(&mut byte)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "the server closes a silent connection after the bound: {read:?}"
    );
    assert!(started.elapsed() >= bound / 2);
    // Half a handshake and then nothing is cut off the same way.
    let mut half = tokio::net::TcpStream::connect(addr).await.unwrap();
    half.write_all(&[0x16, 0x03, 0x01, 0x00, 0x05, 0x01])
        .await
        .unwrap();
    let read = tokio::time::timeout(Duration::from_secs(5), half.read(&mut byte)).await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "{read:?}");
}

#[test]
fn unusable_files_are_named_in_the_error() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("test ca").unwrap();
    let files = ca
        .server(&["127.0.0.1"])
        .unwrap()
        .write(dir.path(), "a")
        .unwrap();
    let other = ca
        .server(&["127.0.0.1"])
        .unwrap()
        .write(dir.path(), "b")
        .unwrap();
    let missing = dir.path().join("missing.pem");
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "").unwrap();

    let error = net::server_config(&missing, &files.key).unwrap_err();
    assert!(error.to_string().contains("missing.pem"), "{error}");
    let error = net::server_config(&files.cert, &other.key).unwrap_err();
    assert!(
        error.to_string().contains("a.crt"),
        "a key of another cert: {error}"
    );
    let error = net::server_config(&files.key, &files.key).unwrap_err();
    assert!(error.to_string().contains("no certificate"), "{error}");
    let error = net::server_config(&files.cert, &files.cert).unwrap_err();
    assert!(error.to_string().contains("key file"), "{error}");
    let error = net::client_config(&empty).unwrap_err();
    assert!(error.to_string().contains("empty.pem"), "{error}");
    let key_text = std::fs::read_to_string(&files.key).unwrap();
    let secret_line = key_text.lines().nth(1).unwrap();
    for error in [
        net::server_config(&files.cert, &other.key).unwrap_err(),
        net::server_config(&files.key, &files.key).unwrap_err(),
    ] {
        assert!(
            !format!("{error} {error:?}").contains(secret_line),
            "key bytes in {error}"
        );
    }
}
