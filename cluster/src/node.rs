//! One real `twopc` process: start it, wait until it is ready, SIGKILL or SIGTERM it, restart it
//! on the same address and data directory, and read what it logged.
//!
//! Plain `std` on purpose (no async runtime), so it works from any test, sync or async.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub use crate::ports::free_port;

use crate::auth::TokenSet;

/// What to start: the binary, its arguments, extra environment, and where it listens.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    pub name: String,
    pub binary: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub addr: SocketAddr,
    /// stdout and stderr of every run are appended here.
    pub log_path: PathBuf,
    /// For a coordinator or participant: the token files it is started with (their flags are
    /// added to `args`), and what [`Node::http`] sends. `None`: authentication off.
    pub tokens: Option<TokenSet>,
}

/// A running (or stopped) node. Dropping it kills the process.
#[derive(Debug)]
pub struct Node {
    spec: NodeSpec,
    child: Option<Child>,
}

impl Node {
    /// Starts the process; does not wait for readiness.
    pub fn start(spec: NodeSpec) -> Node {
        let mut node = Node { spec, child: None };
        node.spawn();
        node
    }

    /// The running process's id (for reading its `/proc` entries), if it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn spec(&self) -> &NodeSpec {
        &self.spec
    }

    /// Replaces the extra environment for the next start (for example to arm a crash point).
    pub fn set_env(&mut self, env: Vec<(String, String)>) {
        self.spec.env = env;
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.spec.addr)
    }

    /// The token files it was started with.
    pub fn tokens(&self) -> Option<&TokenSet> {
        self.spec.tokens.as_ref()
    }

    /// An HTTP client that sends this node's token of `kind` (the peer token for the protocol
    /// routes), or none when it runs without authentication.
    pub fn http_as(&self, kind: protocol::auth::Kind) -> reqwest::Client {
        crate::auth::http_client_as(self.tokens().map(|t| t.token(kind)))
            .build()
            .unwrap_or_else(|e| panic!("cannot build an HTTP client: {e}"))
    }

    /// An HTTP client that sends this node's operator token (operators may call every client
    /// route too), or none when it runs without authentication.
    pub fn http(&self) -> reqwest::Client {
        crate::auth::http_client(self.tokens())
            .build()
            .unwrap_or_else(|e| panic!("cannot build an HTTP client: {e}"))
    }

    /// The process's resident memory in KiB (`VmRSS` in /proc), if it runs and Linux says.
    pub fn rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()?)).ok()?;
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
    }

    fn spawn(&mut self) {
        assert!(
            self.child.is_none(),
            "{} is already running",
            self.spec.name
        );
        let log = File::options()
            .create(true)
            .append(true)
            .open(&self.spec.log_path)
            .unwrap_or_else(|e| panic!("cannot open {}: {e}", self.spec.log_path.display()));
        let log_err = log
            .try_clone()
            .unwrap_or_else(|e| panic!("cannot clone log handle: {e}"));
        let child = Command::new(&self.spec.binary)
            .args(&self.spec.args)
            .args(self.spec.tokens.iter().flat_map(TokenSet::server_args))
            .envs(self.spec.env.iter().cloned())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.spec.binary.display()));
        self.child = Some(child);
    }

    /// Polls `GET /readyz` until it answers 200. Fails if the process exits first or the time
    /// runs out, with the node's log in the message.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_exit_status() {
                return Err(format!(
                    "{} exited with {status} before it was ready; log:\n{}",
                    self.spec.name,
                    self.log()
                ));
            }
            if let Some((200, _)) = http_get(self.spec.addr, "/readyz") {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{} not ready after {timeout:?}; log:\n{}",
                    self.spec.name,
                    self.log()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL: no chance to flush or clean up.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then waits up to `timeout` for a graceful exit (SIGKILL after that).
    /// Returns the exit status when the process stopped by itself.
    pub fn terminate(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let status = self.wait_exit(timeout);
        if status.is_none() {
            self.kill();
        }
        status
    }

    /// Waits up to `timeout` for the process to exit by itself (a crash point, a refusal to
    /// start); returns its status, or `None` if it is still running.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_exit_status() {
                self.child = None;
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn try_exit_status(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    pub fn is_running(&mut self) -> bool {
        self.try_exit_status().is_none() && self.child.is_some()
    }

    /// Starts the process again with the same arguments, address and data directory.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Everything the node has written to stdout and stderr, across runs.
    pub fn log(&self) -> String {
        read_lossy(&self.spec.log_path)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

fn read_lossy(path: &Path) -> String {
    let mut bytes = Vec::new();
    if let Ok(mut file) = File::open(path) {
        let _ = file.read_to_end(&mut bytes);
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A minimal blocking HTTP/1.1 GET: `(status, body)`, or `None` if the node is unreachable.
pub fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).ok()?;
    let text = String::from_utf8_lossy(&response);
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Some((status, body.to_string()))
}
