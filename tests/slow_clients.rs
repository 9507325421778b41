//! Issue 24, item 4, against a real `twopc coordinator` process: 300 sockets that send the
//! start of a `/healthz` head and stop (no token needed: heads are read before
//! authentication) are closed after `--header-read-timeout-ms`, and the coordinator still
//! answers `/healthz` and commits a transaction afterwards.

mod coordinator_support;

use std::time::Duration;

use coordinator_support::{AckMode, Coordinator, TestParticipant, VoteMode, two_party};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SOCKETS: usize = 300;
/// Far past the 500 ms bound, far short of "kept for ever".
const GENEROUS: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sockets_that_never_finish_their_head_are_closed_and_the_coordinator_carries_on() {
    let dir = tempfile::tempdir().unwrap();
    let a = TestParticipant::start("inventory", VoteMode::Yes, AckMode::Ack).await;
    let b = TestParticipant::start("payments", VoteMode::Yes, AckMode::Ack).await;
    let c = Coordinator::start(
        dir.path(),
        "coord",
        &[&a, &b],
        &["--header-read-timeout-ms", "500"],
    );
    let addr = c.url().trim_start_matches("http://").to_string();

    let mut sockets = Vec::with_capacity(SOCKETS);
    for _ in 0..SOCKETS {
        let mut socket = TcpStream::connect(&addr).await.unwrap();
        socket
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        sockets.push(socket);
    }
    let all_closed = async {
        for socket in &mut sockets {
            let mut chunk = [0u8; 256];
            loop {
                match socket.read(&mut chunk).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        }
    };
    assert!(
        tokio::time::timeout(GENEROUS, all_closed).await.is_ok(),
        "every socket with an unfinished head is closed by the coordinator"
    );

    let (status, body) = c.get("/healthz").await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = c
        .submit("?wait=acked", &two_party("after-slow-clients", &a, &b))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["outcome"], "committed", "{body}");
}
