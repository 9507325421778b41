//! Misbehaving HTTP servers on loopback, for tests of the outbound policy (feature
//! `test-servers`): one that runs a script on each raw connection, an endless answer, a
//! redirect, silence. Test code only; it unwraps what a test may let fail.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A raw HTTP/1.1 server: reads a request on each connection, then runs `answer` on the
/// socket. Returns its `http://` base URL.
pub async fn raw_server<F, Fut>(answer: F) -> String
where
    F: Fn(TcpStream) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let answer = Arc::new(answer);
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let answer = Arc::clone(&answer);
            tokio::spawn(async move {
                let mut request = vec![0u8; 8192];
                let _ = socket.read(&mut request).await;
                answer(socket).await;
            });
        }
    });
    url
}

/// A 200 whose chunked body never ends (64 KiB chunks of `fill`); `written` counts the bytes
/// the server managed to send, so a test can tell the caller stopped reading.
pub async fn endless_server(fill: u8, written: Arc<AtomicU64>) -> String {
    raw_server(move |mut socket| {
        let written = Arc::clone(&written);
        async move {
            let head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";
            if socket.write_all(head).await.is_err() {
                return;
            }
            let body = String::from_utf8_lossy(&vec![fill; 64 * 1024]).into_owned();
            let chunk = format!("{:x}\r\n{body}\r\n", 64 * 1024);
            while socket.write_all(chunk.as_bytes()).await.is_ok() {
                written.fetch_add(64 * 1024, Ordering::SeqCst);
            }
        }
    })
    .await
}

/// A server that answers every request with a redirect (`status_line`, e.g. `307 Temporary
/// Redirect`) to `/elsewhere` on a second server, which would answer `there`. Returns the
/// redirecting server's URL and whether anyone reached the second one (a followed redirect).
pub async fn redirecting_server(status_line: &str, there: Vec<u8>) -> (String, Arc<AtomicBool>) {
    let followed = Arc::new(AtomicBool::new(false));
    let seen = Arc::clone(&followed);
    let there = Arc::new(there);
    let target = raw_server(move |mut socket| {
        let seen = Arc::clone(&seen);
        let there = Arc::clone(&there);
        async move {
            seen.store(true, Ordering::SeqCst);
            let _ = socket.write_all(&there).await;
        }
    })
    .await;
    let head = Arc::new(format!(
        "HTTP/1.1 {status_line}\r\nlocation: {target}/elsewhere\r\ncontent-length: 0\r\n\r\n"
    ));
    let redirecting = raw_server(move |mut socket| {
        let head = Arc::clone(&head);
        async move {
            let _ = socket.write_all(head.as_bytes()).await;
        }
    })
    .await;
    (redirecting, followed)
}

/// Accepts, reads the request, and says nothing for 30 s.
pub async fn silent_server() -> String {
    raw_server(|socket| async move {
        tokio::time::sleep(Duration::from_secs(30)).await;
        drop(socket);
    })
    .await
}
