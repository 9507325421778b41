//! One scenario's cluster: the coordinator, `inventory`, `payments` and `shipping` as real
//! processes, a [`FaultProxy`] between the coordinator and each participant, and the record of
//! every order the scenario ran.
//!
//! Sync on purpose: node control blocks (start, wait, kill), and the proxies and workload run
//! on the cluster's own multi-thread runtime, so they keep running while the test thread waits.

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

use tokio::runtime::Runtime;
use tokio::task::JoinHandle;

use crate::binary::failpoints_binary;
use crate::proxy::{FaultProxy, ProxyHandle, ProxyOptions};
use cluster::checkout::{CheckoutConfig, Order};
use cluster::cluster::{ClusterSpec, LocalCluster};
use cluster::node::Node;
use cluster::oracle::{self, AuditReport, ClientOutcome, ClusterUrls, Totals};
use cluster::workload::{self, OrderResult, WorkloadOptions};

/// The signal `std::process::abort()` ends a process with: what every crash point does.
const SIGABRT: i32 = 6;

/// The coordinator's node name (participants go by their own names).
pub const COORDINATOR: &str = "coordinator";

/// How long a restarted node may take to recover (generous: the machine is shared and slow).
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// What to start.
#[derive(Debug, Clone)]
pub struct ChaosOptions {
    pub config: CheckoutConfig,
    /// Seeds the proxies' probabilistic faults.
    pub seed: u64,
    pub coordinator_flags: Vec<String>,
    pub participant_flags: Vec<String>,
    /// Also put a fault proxy on each participant's own link to the coordinator (the decision
    /// queries it sends when in doubt), reachable with [`ChaosCluster::uplink`]. Off by
    /// default: participants then ask the coordinator directly.
    pub uplink_proxies: bool,
}

impl Default for ChaosOptions {
    /// Short timeouts and backoffs so that faults resolve in seconds, and frequent checkpoints
    /// so that recovery from a snapshot is part of every run.
    fn default() -> ChaosOptions {
        let flags = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .flat_map(|(k, v)| [k.to_string(), v.to_string()])
                .collect()
        };
        ChaosOptions {
            config: CheckoutConfig {
                skus: 8,
                stock_per_sku: 25,
                customers: 12,
                balance_per_customer: 300,
                max_quantity: 3,
                max_unit_price: 40,
            },
            seed: 0,
            coordinator_flags: flags(&[
                ("--prepare-timeout-ms", "3000"),
                ("--delivery-timeout-ms", "1500"),
                ("--retry-base-ms", "50"),
                ("--retry-max-ms", "500"),
                ("--checkpoint-interval-ms", "2000"),
            ]),
            participant_flags: flags(&[
                ("--in-doubt-after-ms", "1000"),
                ("--decision-backoff-base-ms", "50"),
                ("--decision-backoff-max-ms", "500"),
                ("--decision-timeout-ms", "1500"),
                ("--checkpoint-every-records", "40"),
            ]),
            uplink_proxies: false,
        }
    }
}

/// A running scenario cluster. Dropping it kills every process and proxy.
#[derive(Debug)]
pub struct ChaosCluster {
    pub cluster: LocalCluster,
    /// One proxy per participant, by name; the coordinator only knows the proxies' URLs.
    pub proxies: Vec<(String, FaultProxy)>,
    /// With `ChaosOptions::uplink_proxies`: one proxy per participant, by name, between it and
    /// the coordinator (its decision queries); the participant only knows the proxy's URL.
    pub uplinks: Vec<(String, FaultProxy)>,
    pub spec: ClusterSpec,
    pub config: CheckoutConfig,
    pub client: reqwest::Client,
    /// Sends the peer token: asks the coordinator what a participant in doubt would.
    pub peer_client: reqwest::Client,
    /// Ledger totals before the first order.
    pub before: Totals,
    /// Every order run so far with what its client heard.
    pub record: Vec<(Order, ClientOutcome)>,
    pub runtime: Runtime,
    pub dir: tempfile::TempDir,
}

impl ChaosCluster {
    /// Starts the cluster; panics (failing the test) with the nodes' logs if it cannot.
    pub fn start(options: &ChaosOptions) -> ChaosCluster {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime");
        let dir = tempfile::Builder::new()
            .prefix("twopc-chaos-")
            .tempdir()
            .expect("temp dir");
        let mut spec = ClusterSpec::checkout(&failpoints_binary(), dir.path(), &options.config);
        spec.coordinator_flags = options.coordinator_flags.clone();
        spec.participant_flags = options.participant_flags.clone();
        let coordinator_addr = LocalCluster::coordinator_addr();
        let mut uplinks = Vec::new();
        if options.uplink_proxies {
            // Started before the coordinator listens: until it does, the proxy closes each
            // connection at once, which is what a coordinator that is down looks like.
            for name in &spec.participants {
                let proxy = runtime
                    .block_on(FaultProxy::start(
                        &format!("http://{coordinator_addr}"),
                        ProxyOptions {
                            seed: options.seed ^ 0x75_70 ^ name.len() as u64,
                            hold_ms_max: 5_000,
                            upstream_timeout_ms: 10_000,
                            ..ProxyOptions::default()
                        },
                    ))
                    .unwrap_or_else(|e| panic!("uplink proxy for {name}: {e}"));
                uplinks.push((name.clone(), proxy));
            }
        }
        let uplink_url = |name: &str| {
            uplinks
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, proxy)| proxy.url())
        };
        let participants =
            LocalCluster::start_participants_at(&spec, coordinator_addr, &uplink_url)
                .unwrap_or_else(|e| panic!("participants did not start: {e}"));
        let mut proxies = Vec::new();
        let mut urls = Vec::new();
        for (name, url) in participants.urls() {
            let proxy_options = ProxyOptions {
                seed: options.seed ^ name.len() as u64,
                hold_ms_max: 5_000,
                upstream_timeout_ms: 10_000,
                ..ProxyOptions::default()
            };
            let proxy = runtime
                .block_on(FaultProxy::start(&url, proxy_options))
                .unwrap_or_else(|e| panic!("proxy for {name}: {e}"));
            urls.push((name.clone(), proxy.url()));
            proxies.push((name, proxy));
        }
        let cluster = LocalCluster::start_coordinator(&spec, participants, &urls)
            .unwrap_or_else(|e| panic!("coordinator did not start: {e}"));
        let client = cluster
            .http()
            .no_proxy()
            .timeout(Duration::from_secs(20))
            .build()
            .expect("http client");
        let peer_client = cluster::auth::http_client_as(cluster.tokens.as_ref().map(|t| &t.peer))
            .no_proxy()
            .timeout(Duration::from_secs(20))
            .build()
            .expect("http client");
        let mut chaos = ChaosCluster {
            cluster,
            proxies,
            uplinks,
            spec,
            config: options.config.clone(),
            client,
            peer_client,
            before: Totals::default(),
            record: Vec::new(),
            runtime,
            dir,
        };
        chaos.before = chaos
            .runtime
            .block_on(oracle::read_totals(
                &chaos.client,
                &chaos.urls(),
                &chaos.config,
            ))
            .unwrap_or_else(|e| panic!("reading the seeded totals: {e}"));
        chaos
    }

    /// The services' own URLs (not the proxies'): what the oracle and probes read.
    pub fn urls(&self) -> ClusterUrls {
        self.cluster
            .checkout_urls()
            .expect("a checkout cluster has all three participants")
    }

    pub fn proxy(&self, participant: &str) -> ProxyHandle {
        self.proxies
            .iter()
            .find(|(name, _)| name == participant)
            .map(|(_, proxy)| proxy.handle())
            .unwrap_or_else(|| panic!("no proxy for {participant}"))
    }

    /// The proxy on `participant`'s own link to the coordinator (needs
    /// `ChaosOptions::uplink_proxies`).
    pub fn uplink(&self, participant: &str) -> ProxyHandle {
        self.uplinks
            .iter()
            .find(|(name, _)| name == participant)
            .map(|(_, proxy)| proxy.handle())
            .unwrap_or_else(|| panic!("no uplink proxy for {participant}"))
    }

    /// Ends every partition and network fault.
    pub fn heal_all(&self) {
        for (_, proxy) in self.proxies.iter().chain(&self.uplinks) {
            proxy.handle().heal();
        }
    }

    /// The node called `name` (`coordinator` or a participant).
    pub fn node(&mut self, name: &str) -> &mut Node {
        if name == COORDINATOR {
            return &mut self.cluster.coordinator;
        }
        self.cluster
            .participant(name)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// The data directory of node `name`.
    pub fn data_dir(&self, name: &str) -> PathBuf {
        self.spec.data_dir.join(name)
    }

    pub fn workload_options(&self) -> WorkloadOptions {
        WorkloadOptions::new(&self.cluster.coordinator_url())
    }

    /// `count` fresh orders named `run-<i>`, from `seed`.
    pub fn orders(&self, run: &str, seed: u64, count: u64) -> Vec<Order> {
        workload::orders(&self.config, run, seed, count)
    }

    /// Runs `orders` to completion and records them.
    pub fn run_orders(&mut self, orders: Vec<Order>, options: WorkloadOptions) -> Vec<OrderResult> {
        let results =
            self.runtime
                .block_on(workload::run_orders(self.client.clone(), options, orders));
        self.remember(&results);
        results
    }

    /// Starts `orders` in the background; [`ChaosCluster::finish`] waits for them and records.
    pub fn spawn_orders(
        &self,
        orders: Vec<Order>,
        options: WorkloadOptions,
    ) -> JoinHandle<Vec<OrderResult>> {
        self.runtime
            .spawn(workload::run_orders(self.client.clone(), options, orders))
    }

    pub fn finish(&mut self, running: JoinHandle<Vec<OrderResult>>) -> Vec<OrderResult> {
        let results = self
            .runtime
            .block_on(running)
            .unwrap_or_else(|e| panic!("workload task failed: {e}"));
        self.remember(&results);
        results
    }

    pub fn remember(&mut self, results: &[OrderResult]) {
        self.record
            .extend(results.iter().map(|r| (r.order.clone(), r.outcome)));
    }

    /// SIGKILL.
    pub fn kill(&mut self, name: &str) {
        self.node(name).kill();
    }

    /// Starts `name` again (SIGKILL first if it still runs) with `env` (empty: no crash point
    /// armed) and waits until it is ready.
    pub fn restart(&mut self, name: &str, env: Vec<(String, String)>) {
        let node = self.node(name);
        node.set_env(env);
        node.restart();
        if let Err(e) = node.wait_ready(READY_TIMEOUT) {
            panic!("{name} did not come back: {e}");
        }
    }

    /// Waits until nothing is in flight, stops `name` gracefully (SIGTERM), and starts it
    /// again with `env`: the way to arm a crash point so that only new work can reach it.
    pub fn quiesce_and_restart(&mut self, name: &str, env: Vec<(String, String)>) {
        let urls = self.urls();
        if let Err(left) = self
            .runtime
            .block_on(crate::scenario::probe::wait_quiescent(
                &self.client,
                &urls,
                READY_TIMEOUT,
            ))
        {
            panic!(
                "the cluster did not settle before restarting {name}: {left}\n{}",
                self.logs()
            );
        }
        self.node(name).terminate(Duration::from_secs(20));
        self.restart(name, env);
    }

    /// Starts `name` again with `env` without waiting for readiness (a crash point armed for
    /// startup or recovery may end it first).
    pub fn restart_no_wait(&mut self, name: &str, env: Vec<(String, String)>) {
        let node = self.node(name);
        node.set_env(env);
        node.restart();
    }

    /// Waits for `name` to die at its armed crash point; panics unless it ended abnormally
    /// (`abort()` = SIGABRT) within `timeout`.
    pub fn wait_crash(&mut self, name: &str, timeout: Duration) -> ExitStatus {
        let node = self.node(name);
        match node.wait_exit(timeout) {
            Some(status) if status.signal() == Some(SIGABRT) => status,
            Some(status) => panic!(
                "{name} exited with {status}, not at a crash point (abort); log:\n{}",
                tail(&node.log(), 40)
            ),
            None => panic!(
                "{name} never reached its crash point within {timeout:?}; log:\n{}",
                tail(&node.log(), 40)
            ),
        }
    }

    /// Heals the network, then runs the oracle over every recorded order.
    pub fn audit(&self, settle: Duration) -> AuditReport {
        self.heal_all();
        self.runtime
            .block_on(oracle::audit(
                &self.client,
                &self.urls(),
                &self.config,
                self.before,
                &self.record,
                settle,
            ))
            .unwrap_or_else(|e| panic!("oracle could not read the cluster: {e}\n{}", self.logs()))
    }

    /// Runs the oracle and panics with every failed check and the nodes' log tails.
    pub fn assert_audit(&self, what: &str) -> AuditReport {
        let report = self.audit(Duration::from_secs(60));
        assert!(
            report.all_ok(),
            "{what}: the oracle found broken invariants:\n{}\n{}",
            report.failures(),
            self.logs()
        );
        report
    }

    /// The last lines each node logged.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        let nodes = std::iter::once((COORDINATOR, &self.cluster.coordinator)).chain(
            self.cluster
                .participants
                .iter()
                .map(|(name, node)| (name.as_str(), node)),
        );
        for (name, node) in nodes {
            out.push_str(&format!(
                "--- {name} (last lines) ---\n{}\n",
                tail(&node.log(), 15)
            ));
        }
        out
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
