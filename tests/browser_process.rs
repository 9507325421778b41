//! The loopback no-auth default against what a browser can be made to do, with the real
//! binaries (issue 24 item 5, docs/security.md "Browsers"): a cross-site form POST, a
//! DNS-rebound `Host`, and a stray SIGHUP. The rules themselves are tested in
//! protocol/src/cross_site.rs and through the routers in coordinator/src/api/tests_cross_site.rs.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use cluster::node::{Node, NodeSpec, free_port};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(20);

fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_twopc"))
}

/// A coordinator on loopback without token files (its one participant is never reached).
fn coordinator(dir: &std::path::Path) -> Node {
    let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let args = [
        "coordinator",
        "--listen",
        &addr.to_string(),
        "--data-dir",
        &dir.join("coordinator").display().to_string(),
        "--participant",
        "inventory=http://127.0.0.1:9",
    ];
    let mut node = Node::start(NodeSpec {
        name: "coordinator".into(),
        binary: binary(),
        args: args.map(String::from).to_vec(),
        env: vec![("RUST_LOG".into(), "info".into())],
        addr,
        log_path: dir.join("coordinator.log"),
        tokens: None,
    });
    tokio::task::block_in_place(|| node.wait_ready(WAIT)).unwrap();
    node
}

async fn answer(request: reqwest::RequestBuilder) -> (u16, Value) {
    let response = request.send().await.expect("the coordinator answers");
    let status = response.status().as_u16();
    let body = response.json().await.unwrap_or(Value::Null);
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cross_site_form_and_a_rebound_host_are_refused_and_sighup_is_harmless() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = coordinator(dir.path());
    let base = node.url();
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let retry = format!("{base}/v1/participants/inventory/retry");

    // What a form on evil.example submits: empty, form-encoded, with the page's Origin.
    let (status, body) = answer(
        client
            .post(&retry)
            .header("origin", "https://evil.example")
            .header("content-type", "application/x-www-form-urlencoded"),
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (403, Some("forbidden_origin"))
    );
    let (status, body) = answer(client.post(&retry).header("content-type", "text/plain")).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (415, Some("unsupported_media_type"))
    );
    let (_, audit) = answer(client.get(format!("{base}/v1/audit"))).await;
    assert_eq!(
        audit["audit"],
        serde_json::json!([]),
        "nothing refused is audited"
    );

    // The UI's own call: same origin, JSON.
    let (status, body) = answer(
        client
            .post(&retry)
            .header("origin", base.as_str())
            .json(&serde_json::json!({})),
    )
    .await;
    assert_eq!(status, 200, "{body}");

    // A page whose name was rebound to 127.0.0.1 sends its own name as Host.
    let (status, body) = answer(
        client
            .get(format!("{base}/v1/cluster"))
            .header("host", "evil.example"),
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (403, Some("forbidden_host"))
    );
    let (status, _) = answer(
        client
            .get(format!("{base}/v1/cluster"))
            .header("host", format!("localhost:{}", node.spec().addr.port())),
    )
    .await;
    assert_eq!(status, 200);

    // SIGHUP with no token files: the default action would end the process.
    let pid = node.pid().expect("running").to_string();
    for _ in 0..2 {
        let status = Command::new("kill").args(["-HUP", &pid]).status().unwrap();
        assert!(status.success());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(node.is_running(), "SIGHUP ended the coordinator");
    let (status, _) = answer(client.get(format!("{base}/healthz"))).await;
    assert_eq!(status, 200);
    assert!(
        node.log().contains("nothing to reload"),
        "the SIGHUP was not logged: {}",
        node.log()
    );
}
