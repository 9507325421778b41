//! `twopc ctl`: the exit codes an operator's script relies on, mostly without a coordinator;
//! and a `--coordinator` list whose first address is dead, against a real coordinator.

use std::process::Command;

fn ctl(args: &[&str]) -> (Option<i32>, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_twopc"))
        .arg("ctl")
        .args(args)
        .env_remove("TWOPC_COORDINATOR")
        .output()
        .expect("running twopc ctl");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn an_unreachable_coordinator_is_exit_code_3_naming_the_url() {
    // Port 9 (discard) on loopback: nothing listens there in the test environment.
    let (code, stderr) = ctl(&["--coordinator", "http://127.0.0.1:9", "audit"]);
    assert_eq!(code, Some(3), "{stderr}");
    assert!(
        stderr.contains("cannot reach the coordinator at http://127.0.0.1:9"),
        "{stderr}"
    );
}

#[test]
fn bad_usage_is_exit_code_2() {
    let (code, stderr) = ctl(&["resolve", "order-1", "--decision", "maybe", "--reason", "x"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("maybe"), "{stderr}");
    let (code, stderr) = ctl(&[
        "--coordinator",
        "http://127.0.0.1:9,http://127.0.0.1:9/",
        "audit",
    ]);
    assert_eq!(code, Some(2), "an address named twice: {stderr}");
    assert!(stderr.contains("named twice"), "{stderr}");
    let (code, stderr) = ctl(&["retry"]);
    assert_eq!(
        code,
        Some(2),
        "a retry names a transaction or a participant: {stderr}"
    );
}

/// A server answering one request with `answer` (a whole HTTP response); it hands back whether
/// a request came.
fn one_answer_server(answer: String) -> (String, std::thread::JoinHandle<bool>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let served = std::thread::spawn(move || {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut stream = loop {
            match listener.accept() {
                Ok((stream, _)) => break stream,
                Err(_) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(10))
                }
                Err(_) => return false,
            }
        };
        stream.set_nonblocking(false).unwrap();
        let mut received = Vec::new();
        let mut buffer = [0u8; 4096];
        while !received.ends_with(b"\r\n\r\n") {
            match stream.read(&mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(n) => received.extend_from_slice(&buffer[..n]),
            }
        }
        let _ = stream.write_all(answer.as_bytes());
        true
    });
    (url, served)
}

#[test]
fn ctl_ignores_proxy_variables_and_escapes_what_the_server_says() {
    // ESC [2J (clear the screen), CSI as one C1 byte, and a right-to-left override.
    let body = r#"{"error":"not_found","message":"gone\u001b[2J\u009b31m\u202eevil"}"#;
    let answer = format!(
        "HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{body}",
        body.len()
    );
    let (coordinator, target) = one_answer_server(answer.clone());
    let (proxy, proxied) = one_answer_server(answer);
    let output = Command::new(env!("CARGO_BIN_EXE_twopc"))
        .args(["ctl", "--coordinator", &coordinator, "audit"])
        .env_remove("TWOPC_COORDINATOR")
        .env("HTTP_PROXY", &proxy)
        .env("http_proxy", &proxy)
        .env("ALL_PROXY", &proxy)
        .env_remove("NO_PROXY")
        .env_remove("no_proxy")
        .output()
        .expect("running twopc ctl");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        target.join().unwrap(),
        "the coordinator was not asked: {stderr}"
    );
    assert!(!proxied.join().unwrap(), "the request went to the proxy");
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("not_found: gone\\u{1b}[2J\\u{9b}31m\\u{202e}evil"),
        "{stderr}"
    );
    assert!(
        !stderr.contains(['\u{1b}', '\u{9b}', '\u{202e}']),
        "raw control characters reached the terminal: {stderr:?}"
    );
}

#[test]
fn a_dead_address_first_in_the_list_moves_on_to_the_coordinator() {
    use cluster::node::{Node, NodeSpec, free_port};
    let dir = tempfile::tempdir().unwrap();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
    let args = [
        "coordinator",
        "--listen",
        &addr.to_string(),
        "--data-dir",
        &dir.path().join("coordinator").display().to_string(),
        "--participant",
        "inventory=http://127.0.0.1:9",
    ];
    let mut coordinator = Node::start(NodeSpec {
        name: "coordinator".into(),
        binary: env!("CARGO_BIN_EXE_twopc").into(),
        args: args.map(String::from).to_vec(),
        env: Vec::new(),
        addr,
        log_path: dir.path().join("coordinator.log"),
        tokens: None,
    });
    coordinator
        .wait_ready(std::time::Duration::from_secs(20))
        .unwrap();
    // Port 9 (discard) on loopback: nothing listens there.
    let list = format!("http://127.0.0.1:9,{}", coordinator.url());
    let (code, stderr) = ctl(&["--coordinator", &list, "--json", "audit"]);
    assert_eq!(code, Some(0), "{stderr}");
    // Nobody of the list answering is exit code 3, every address named.
    let (code, stderr) = ctl(&[
        "--coordinator",
        "http://127.0.0.1:9,http://127.0.0.1:19",
        "audit",
    ]);
    assert_eq!(code, Some(3), "{stderr}");
    for dead in ["http://127.0.0.1:9:", "http://127.0.0.1:19:"] {
        assert!(stderr.contains(dead), "{stderr}");
    }
}
