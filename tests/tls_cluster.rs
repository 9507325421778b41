//! TLS everywhere, on the real binaries: a coordinator and three participants serving HTTPS
//! with certificates from a CA made at test time, tokens on (the recommended configuration),
//! every caller trusting only that CA. Transactions commit; the coordinator crashes with a
//! decision logged but not delivered (the `after_decision_durable` crash point), restarts, and
//! recovery completes over HTTPS (participants end committed, nothing half-committed). A client
//! that does not trust the CA is refused at the handshake, `http://` to a TLS port fails, the
//! `twopc ctl` client works with `--tls-ca` and is refused without it, and a server given only
//! half of its TLS flags refuses to start (exit 2).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use cluster::auth::TokenSet;
use cluster::node::free_port;
use net::test_certs::TestCa;
use protocol::auth::Kind;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);
const PARTICIPANTS: [&str; 3] = ["inventory", "payments", "shipping"];
const SEED_STOCK: i64 = 100;
const CRASH_POINT: &str = "coordinator::after_decision_durable";

/// One process of the cluster; killed when dropped.
struct Process {
    name: String,
    binary: PathBuf,
    args: Vec<String>,
    log: PathBuf,
    child: Option<Child>,
}

impl Process {
    fn start(name: &str, binary: &Path, args: Vec<String>, log_dir: &Path) -> Process {
        let mut process = Process {
            name: name.to_string(),
            binary: binary.to_path_buf(),
            args,
            log: log_dir.join(format!("{name}.log")),
            child: None,
        };
        process.spawn(&[]);
        process
    }

    fn spawn(&mut self, env: &[(&str, &str)]) {
        let log = File::options()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(&self.binary)
            .args(&self.args)
            .envs(env.iter().copied())
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self.child.as_mut()?.try_wait().unwrap() {
                self.child = None;
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The files of one TLS cluster: the CA, a certificate per server, the tokens.
struct Pki {
    ca: TestCa,
    ca_file: PathBuf,
    tokens: TokenSet,
}

impl Pki {
    fn new(dir: &Path) -> Pki {
        let ca = TestCa::new("twopc test cluster ca").unwrap();
        let ca_file = ca.write_cert(dir).unwrap();
        let tokens = TokenSet::generate(&dir.join("tokens")).unwrap();
        Pki {
            ca,
            ca_file,
            tokens,
        }
    }

    /// `--tls-cert F --tls-key F --tls-ca F` for a server named `name` at 127.0.0.1.
    fn server_flags(&self, dir: &Path, name: &str) -> Vec<String> {
        let files = self
            .ca
            .server(&["127.0.0.1", "localhost"])
            .unwrap()
            .write(dir, name)
            .unwrap();
        let mut flags = vec![
            "--tls-cert".to_string(),
            files.cert.display().to_string(),
            "--tls-key".to_string(),
            files.key.display().to_string(),
            "--tls-ca".to_string(),
            self.ca_file.display().to_string(),
        ];
        flags.extend(self.tokens.server_args());
        flags
    }

    /// A client trusting only our CA, sending the token of `kind`.
    fn client(&self, kind: Kind) -> reqwest::Client {
        let tls = net::client_config(&self.ca_file).unwrap();
        let builder = cluster::auth::http_client_as(Some(self.tokens.token(kind)))
            .timeout(Duration::from_secs(10));
        net::outbound::with_tls(builder, Some(tls))
            .unwrap()
            .build()
            .unwrap()
    }
}

struct Cluster {
    coordinator: Process,
    coordinator_url: String,
    participants: Vec<(String, String, Process)>,
    operator: reqwest::Client,
}

fn start_cluster(binary: &Path, dir: &Path, pki: &Pki) -> Cluster {
    let coordinator_port = free_port();
    let coordinator_url = format!("https://127.0.0.1:{coordinator_port}");
    let mut participants = Vec::new();
    for name in PARTICIPANTS {
        let port = free_port();
        let seed = dir.join(format!("{name}-seed.json"));
        std::fs::write(&seed, json!({ "stock": SEED_STOCK }).to_string()).unwrap();
        let mut args: Vec<String> = [
            "participant",
            "--name",
            name,
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--data-dir",
            &dir.join(name).display().to_string(),
            "--seed",
            &seed.display().to_string(),
            "--coordinator",
            &coordinator_url,
            "--in-doubt-after-ms",
            "300",
            "--decision-backoff-max-ms",
            "1000",
        ]
        .map(String::from)
        .to_vec();
        args.extend(pki.server_flags(dir, name));
        let process = Process::start(name, binary, args, dir);
        participants.push((
            name.to_string(),
            format!("https://127.0.0.1:{port}"),
            process,
        ));
    }
    let mut args: Vec<String> = [
        "coordinator",
        "--listen",
        &format!("127.0.0.1:{coordinator_port}"),
        "--data-dir",
        &dir.join("coordinator").display().to_string(),
        "--retry-base-ms",
        "50",
        "--retry-max-ms",
        "500",
    ]
    .map(String::from)
    .to_vec();
    for (name, url, _) in &participants {
        args.push("--participant".into());
        args.push(format!("{name}={url}"));
    }
    args.extend(pki.server_flags(dir, "coordinator"));
    let coordinator = Process::start("coordinator", binary, args, dir);
    Cluster {
        coordinator,
        coordinator_url,
        participants,
        operator: pki.client(Kind::Operator),
    }
}

impl Cluster {
    async fn wait_ready(&self, url: &str, process: &Process) {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Ok(response) = self.operator.get(format!("{url}/readyz")).send().await
                && response.status() == 200
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{} not ready over HTTPS; log:\n{}",
                process.name,
                process.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn wait_all_ready(&self) {
        for (_, url, process) in &self.participants {
            self.wait_ready(url, process).await;
        }
        self.wait_ready(&self.coordinator_url, &self.coordinator)
            .await;
    }

    fn order(id: &str) -> Value {
        let participants: Vec<Value> = PARTICIPANTS
            .iter()
            .map(|name| {
                json!({"name": name,
                       "payload": {"ops": [{"op": "add", "key": "stock", "delta": -1, "min": 0}]}})
            })
            .collect();
        json!({"id": id, "participants": participants})
    }

    async fn submit(&self, id: &str) -> reqwest::Result<Value> {
        self.operator
            .post(format!("{}/v1/transactions", self.coordinator_url))
            .json(&Cluster::order(id))
            .timeout(Duration::from_secs(20))
            .send()
            .await?
            .json()
            .await
    }

    async fn get(&self, url: &str) -> (u16, Value) {
        let response = self.operator.get(url).send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn stock_at(&self, url: &str) -> i64 {
        let (status, body) = self.get(&format!("{url}/v1/kv/stock")).await;
        assert_eq!(status, 200, "{body}");
        body["value"].as_i64().unwrap()
    }

    /// Waits (bounded) until `stock` at `url` is `expected`.
    async fn wait_stock(&self, name: &str, url: &str, expected: i64) {
        let deadline = Instant::now() + WAIT;
        loop {
            let stock = self.stock_at(url).await;
            if stock == expected {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{name}: stock {stock}, expected {expected}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn prepared_at(&self, url: &str) -> Vec<Value> {
        let (status, body) = self.get(&format!("{url}/v1/prepared")).await;
        assert_eq!(status, 200, "{body}");
        body["prepared"].as_array().cloned().unwrap_or_default()
    }

    async fn wait_state(&self, id: &str, state: &str) {
        let deadline = Instant::now() + WAIT;
        loop {
            let (status, body) = self
                .get(&format!("{}/v1/transactions/{id}", self.coordinator_url))
                .await;
            if status == 200 && body["state"] == state {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{id} not {state}: {status} {body}; coordinator log:\n{}",
                self.coordinator.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_commits_and_recovers_from_a_coordinator_crash_over_https() {
    let binary = tokio::task::spawn_blocking(chaos_tests::binary::failpoints_binary)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let mut cluster = start_cluster(&binary, dir.path(), &pki);
    cluster.wait_all_ready().await;

    // Transactions commit with TLS on every hop.
    let committed_before = 5;
    for i in 0..committed_before {
        let id = format!("order-{i}");
        let answer = cluster.submit(&id).await.unwrap();
        assert_eq!(answer["outcome"], "committed", "{id}: {answer}");
    }
    // The answer comes once the decision is durable; deliveries may still be in flight.
    for (name, url, _) in &cluster.participants {
        cluster
            .wait_stock(name, url, SEED_STOCK - committed_before)
            .await;
    }

    // The coordinator dies right after its commit decision is durable, before any delivery.
    cluster.coordinator.kill();
    cluster
        .coordinator
        .spawn(&[("FAILPOINTS", &format!("{CRASH_POINT}=return"))]);
    cluster
        .wait_ready(&cluster.coordinator_url, &cluster.coordinator)
        .await;
    let crashed_id = "order-crash";
    let answer = cluster.submit(crashed_id).await;
    assert!(answer.is_err(), "the client got an answer: {answer:?}");
    let status = tokio::task::block_in_place(|| cluster.coordinator.wait_exit(WAIT))
        .expect("the crash point did not stop the coordinator");
    assert!(!status.success(), "{status}");
    for (name, url, _) in &cluster.participants {
        let prepared = cluster.prepared_at(url).await;
        assert!(
            prepared.iter().any(|p| p["txid"] == crashed_id),
            "{name} does not hold {crashed_id} prepared: {prepared:?}"
        );
        assert_eq!(
            cluster.stock_at(url).await,
            SEED_STOCK - committed_before,
            "{name}: the undelivered commit is not applied yet"
        );
    }

    // Restarted without the crash point, recovery finishes the commit over HTTPS.
    cluster.coordinator.spawn(&[]);
    cluster
        .wait_ready(&cluster.coordinator_url, &cluster.coordinator)
        .await;
    cluster.wait_state(crashed_id, "committed").await;
    let deadline = Instant::now() + WAIT;
    for (name, url, _) in &cluster.participants {
        loop {
            let prepared = cluster.prepared_at(url).await;
            let stock = cluster.stock_at(url).await;
            if prepared.is_empty() && stock == SEED_STOCK - committed_before - 1 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{name}: prepared {prepared:?}, stock {stock}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // And it keeps committing.
    let answer = cluster.submit("order-after").await.unwrap();
    assert_eq!(answer["outcome"], "committed", "{answer}");
    // Every transaction applied exactly once everywhere, none half.
    for (name, url, _) in &cluster.participants {
        cluster
            .wait_stock(name, url, SEED_STOCK - committed_before - 2)
            .await;
        assert!(cluster.prepared_at(url).await.is_empty(), "{name}");
    }

    // Nobody else gets in: another CA, no CA, plain HTTP.
    let other_dir = tempfile::tempdir().unwrap();
    let other = TestCa::new("someone else's ca").unwrap();
    let other_tls = net::client_config(&other.write_cert(other_dir.path()).unwrap()).unwrap();
    let untrusting = [
        (
            "trusts another CA",
            net::outbound::with_tls(reqwest::Client::builder(), Some(other_tls)).unwrap(),
        ),
        ("trusts no CA", reqwest::Client::builder()),
    ];
    for (who, builder) in untrusting {
        let client = builder.build().unwrap();
        for url in [&cluster.coordinator_url, &cluster.participants[0].1] {
            let error = client
                .get(format!("{url}/healthz"))
                .send()
                .await
                .unwrap_err();
            assert!(
                format!("{error:?}").contains("UnknownIssuer"),
                "{who} at {url}: {error:?}"
            );
        }
    }
    let plain_url = cluster.coordinator_url.replace("https://", "http://");
    let plain = cluster
        .operator
        .get(format!("{plain_url}/healthz"))
        .send()
        .await;
    assert!(plain.is_err(), "plain HTTP to the TLS port: {plain:?}");

    // The twopc command's clients: with --tls-ca it reads over HTTPS, without it it fails.
    let ctl = |with_ca: bool| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_twopc"));
        command
            .args(["ctl", "--json", "--coordinator", &cluster.coordinator_url])
            .arg("--token-file")
            .arg(pki.tokens.path(Kind::Operator))
            .args(["show", crashed_id])
            .env_remove("TWOPC_TLS_CA");
        if with_ca {
            command.arg("--tls-ca").arg(&pki.ca_file);
        }
        command.output().unwrap()
    };
    let shown = tokio::task::block_in_place(|| ctl(true));
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&shown.stderr)
    );
    assert!(text.contains("committed"), "{text}");
    let refused = tokio::task::block_in_place(|| ctl(false));
    assert!(!refused.status.success());
}

#[test]
fn half_of_the_tls_flags_is_a_configuration_error() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("ca").unwrap();
    let files = ca
        .server(&["127.0.0.1"])
        .unwrap()
        .write(dir.path(), "s")
        .unwrap();
    let data = dir.path().join("data").display().to_string();
    let port = free_port().to_string();
    let listen = format!("127.0.0.1:{port}");
    let cases: [(&str, Vec<&str>); 4] = [
        (
            "coordinator, cert only",
            vec![
                "coordinator",
                "--listen",
                &listen,
                "--data-dir",
                &data,
                "--participant",
                "a=http://127.0.0.1:1",
                "--tls-cert",
                files.cert.to_str().unwrap(),
            ],
        ),
        (
            "participant, key only",
            vec![
                "participant",
                "--name",
                "a",
                "--listen",
                &listen,
                "--data-dir",
                &data,
                "--tls-key",
                files.key.to_str().unwrap(),
            ],
        ),
        (
            "coordinator, https participant without a CA",
            vec![
                "coordinator",
                "--listen",
                &listen,
                "--data-dir",
                &data,
                "--participant",
                "a=https://127.0.0.1:1",
            ],
        ),
        (
            "participant, https coordinator without a CA",
            vec![
                "participant",
                "--name",
                "a",
                "--listen",
                &listen,
                "--data-dir",
                &data,
                "--coordinator",
                "https://127.0.0.1:1",
            ],
        ),
    ];
    for (what, args) in cases {
        let output = Command::new(env!("CARGO_BIN_EXE_twopc"))
            .args(&args)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert_eq!(output.status.code(), Some(2), "{what}: {text}");
        assert!(
            text.contains("both or neither") || text.contains("--tls-ca"),
            "{what}: {text}"
        );
    }
}
