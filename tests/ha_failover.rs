//! A coordinator group of real processes (issue 27, docs/ha.md) failing under a checkout
//! load: etcd, two `twopc coordinator --ha etcd` nodes, and the checkout participants, whose
//! `--coordinator` lists both. Clients submit orders with ids of their own, follow
//! `not_leader`, and send the SAME id to the other node after an error; every answer is
//! recorded with its time and the node that gave it. After each fault the audit checks that
//! nothing acknowledged was lost (every answer is the new leader's record, and a retry of the
//! id gets it again), nothing is split (the participants' effects match the outcomes; money
//! and stock are conserved), and nothing stays in doubt. Each test prints the unavailability
//! it measured (`unavailability_ms=N`: the old leader's last answer to the new one's first
//! commit).
//!
//! Needs etcd (`apt-get install etcd-server`, or `TWOPC_ETCD`); run with
//! `cargo test --test ha_failover -- --nocapture --test-threads 1`.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cluster::checkout::{CheckoutConfig, Order};
use cluster::group::{GroupSpec, GroupView, LocalGroup, node_name, tail};
use cluster::oracle::{ClientOutcome, Totals, audit};
use protocol::{ErrorBody, ErrorCode, Outcome, TransactionResponse, TransactionStatus};

/// The lease TTL of the groups that are not about the default (keeps the file's run short).
const SHORT_TTL_MS: u64 = 2_000;
/// One HTTP attempt gives up after this; the client then tries the other node.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// How long an order keeps trying before it counts as unanswered.
const RETRY_WINDOW: Duration = Duration::from_secs(30);
/// How long a client avoids a node that gave no answer while another node refuses with 503.
const SILENT_FOR: Duration = Duration::from_secs(5);
const PREPARE_TIMEOUT_MS: u64 = 5_000;
const CLIENTS: usize = 4;
/// Bound of every wait for the group to reach a shape.
const WAIT: Duration = Duration::from_secs(30);
/// The generous bound on unavailability (the goal is under 5 s with the defaults).
const UNAVAILABILITY_MAX: Duration = Duration::from_secs(10);

/// One answer a client got: which node gave it, when, with what status and outcome.
#[derive(Debug, Clone)]
struct Heard {
    id: String,
    node: usize,
    at: Instant,
    status: u16,
    outcome: Option<Outcome>,
}

/// Concurrent clients submitting checkout orders to the group until stopped.
struct Load {
    started: Instant,
    stop: Arc<AtomicBool>,
    heard: Arc<Mutex<Vec<Heard>>>,
    workers: tokio::task::JoinSet<Vec<(Order, ClientOutcome)>>,
}

impl Load {
    fn start(group: &LocalGroup, config: &CheckoutConfig, run: &str) -> Load {
        let client = cluster::auth::http_client(group.tokens.as_ref())
            .build()
            .unwrap();
        let urls = Arc::new(group.coordinator_urls());
        let preferred = Arc::new(AtomicUsize::new(0));
        let next = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let heard = Arc::new(Mutex::new(Vec::new()));
        let mut workers = tokio::task::JoinSet::new();
        for worker in 0..CLIENTS {
            let (client, urls, preferred, next, stop, heard, config) = (
                client.clone(),
                urls.clone(),
                preferred.clone(),
                next.clone(),
                stop.clone(),
                heard.clone(),
                config.clone(),
            );
            let run = run.to_string();
            workers.spawn(async move {
                let mut rng = fastrand::Rng::with_seed(worker as u64);
                let mut done = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    let order = config.order(&run, next.fetch_add(1, Ordering::SeqCst), &mut rng);
                    let outcome = submit(&client, &urls, &preferred, &heard, &order).await;
                    done.push((order, outcome));
                }
                done
            });
        }
        Load {
            started: Instant::now(),
            stop,
            heard,
            workers,
        }
    }

    fn heard(&self) -> Vec<Heard> {
        self.heard.lock().unwrap().clone()
    }

    /// Commits answered by `node`.
    fn commits_by(&self, node: usize) -> Vec<Instant> {
        self.heard()
            .into_iter()
            .filter(|h| h.node == node && h.outcome == Some(Outcome::Committed))
            .map(|h| h.at)
            .collect()
    }

    /// Waits until `node` has answered `count` commits after `after`; returns when the last
    /// of them was heard.
    async fn wait_commits(
        &self,
        node: usize,
        after: Instant,
        count: usize,
        group: &LocalGroup,
    ) -> Instant {
        let deadline = Instant::now() + WAIT;
        loop {
            let mut since: Vec<_> = self
                .commits_by(node)
                .into_iter()
                .filter(|at| *at > after)
                .collect();
            since.sort();
            if let Some(at) = since.get(count - 1) {
                return *at;
            }
            assert!(
                Instant::now() < deadline,
                "{} answered {} of {count} commits in {WAIT:?}; log tail:\n{}",
                node_name(node),
                since.len(),
                tail(&group.coordinators[node].log(), 40)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops starting orders, finishes those in flight, and returns every order's outcome
    /// with every answer heard.
    async fn finish(mut self) -> (Vec<(Order, ClientOutcome)>, Vec<Heard>) {
        self.stop.store(true, Ordering::SeqCst);
        let mut orders = Vec::new();
        while let Some(done) = self.workers.join_next().await {
            orders.extend(done.expect("a load client panicked"));
        }
        let heard = self.heard();
        (orders, heard)
    }
}

/// Sends one order until some node answers it with 200 or the retry window closes: tries the
/// next node after a failure, always with the same id, and follows a `not_leader` naming a
/// node of the group, unless that node has just failed to answer at all (a leader that died
/// or stopped is still named by its followers until its lease expires; going back to it
/// would only wait out another request timeout). A status other than 200 and 503 is a bug
/// here: `Unknown`.
async fn submit(
    client: &reqwest::Client,
    urls: &[String],
    preferred: &AtomicUsize,
    heard: &Mutex<Vec<Heard>>,
    order: &Order,
) -> ClientOutcome {
    let body = order.request(PREPARE_TIMEOUT_MS);
    let deadline = Instant::now() + RETRY_WINDOW;
    let mut target = preferred.load(Ordering::SeqCst);
    // The node that last gave no answer, and when.
    let mut silent: Option<(usize, Instant)> = None;
    loop {
        let sent = client
            .post(format!("{}/v1/transactions", urls[target]))
            .timeout(REQUEST_TIMEOUT)
            .json(&body)
            .send()
            .await;
        let other = (target + 1) % urls.len();
        let just_silent =
            |node: usize| silent.is_some_and(|(n, at)| n == node && at.elapsed() < SILENT_FOR);
        let mut next = other;
        if let Ok(response) = sent {
            let status = response.status().as_u16();
            let text = response.text().await.unwrap_or_default();
            let outcome = (status == 200)
                .then(|| serde_json::from_str::<TransactionResponse>(&text).ok())
                .flatten()
                .map(|answer| answer.outcome);
            heard.lock().unwrap().push(Heard {
                id: order.id.clone(),
                node: target,
                at: Instant::now(),
                status,
                outcome,
            });
            match (status, outcome) {
                (200, Some(Outcome::Committed)) => {
                    preferred.store(target, Ordering::SeqCst);
                    return ClientOutcome::Committed;
                }
                (200, Some(Outcome::Aborted)) => {
                    preferred.store(target, Ordering::SeqCst);
                    return ClientOutcome::Aborted;
                }
                (503, _) => {
                    let named = serde_json::from_str::<ErrorBody>(&text)
                        .ok()
                        .filter(|r| r.error == ErrorCode::NotLeader)
                        .and_then(|r| r.leader)
                        .and_then(|leader| urls.iter().position(|u| *u == leader));
                    next = match named {
                        Some(leader) if !just_silent(leader) => leader,
                        _ if just_silent(other) => target,
                        _ => other,
                    };
                }
                _ => return ClientOutcome::Unknown,
            }
        } else {
            silent = Some((target, Instant::now()));
        }
        if Instant::now() >= deadline {
            return ClientOutcome::Unknown;
        }
        target = next;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn start_group(dir: &std::path::Path, lease_ttl_ms: Option<u64>) -> LocalGroup {
    let mut spec = GroupSpec::checkout(env!("CARGO_BIN_EXE_twopc").as_ref(), dir);
    spec.lease_ttl_ms = lease_ttl_ms;
    // The participants' own durability is not under test (none of them crashes here).
    spec.participant_flags = vec!["--unsafe-no-fsync".into()];
    spec.env = vec![("RUST_LOG".into(), "info".into())];
    LocalGroup::start(&spec)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The old leader's last 200 to the new leader's first commit after `fault`.
fn unavailability(heard: &[Heard], old: usize, new: usize, fault: Instant) -> Duration {
    let last_old = heard
        .iter()
        .filter(|h| h.node == old && h.status == 200)
        .map(|h| h.at)
        .max()
        .expect("the old leader answered before the fault");
    let first_new = heard
        .iter()
        .filter(|h| h.node == new && h.outcome == Some(Outcome::Committed) && h.at > fault)
        .map(|h| h.at)
        .min()
        .expect("the new leader committed after the fault");
    first_new.saturating_duration_since(last_old)
}

/// What the clients heard after `fault`, by 500 ms slot: per node, 200s committed/aborted and
/// 503s (printed, for reading a slow failover).
fn print_timeline(heard: &[Heard], fault: Instant) {
    let mut slots = std::collections::BTreeMap::<(u128, usize), [usize; 3]>::new();
    for h in heard.iter().filter(|h| h.at >= fault) {
        let slot = h.at.duration_since(fault).as_millis() / 500;
        let counts = slots.entry((slot, h.node)).or_default();
        match (h.status, h.outcome) {
            (200, Some(Outcome::Committed)) => counts[0] += 1,
            (200, _) => counts[1] += 1,
            _ => counts[2] += 1,
        }
    }
    for ((slot, node), [c, a, r]) in slots {
        let node = node_name(node);
        println!(
            "  +{:>5}ms {node}: committed={c} aborted={a} refused={r}",
            slot * 500
        );
    }
}

/// Restarts coordinator `node` and waits until `leader` counts it in its sync set again.
async fn rejoin(group: &mut LocalGroup, node: usize, leader: usize) {
    group.coordinators[node].restart();
    group
        .wait_in_sync(leader, node, WAIT)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let view = group.view(node).await.expect("the restarted node answers");
    assert_eq!(view.role.role, "following", "{view:?}");
}

/// The whole audit, with `leader` as the coordinator whose records count. `refused` are
/// orders sent that no node took (they must be applied nowhere, or atomically).
async fn audit_after_failover(
    group: &LocalGroup,
    leader: usize,
    config: &CheckoutConfig,
    orders: &[(Order, ClientOutcome)],
    heard: &[Heard],
    refused: &[Order],
) {
    let client = group.http();
    let urls = group.checkout_urls(leader).unwrap();
    let leader_url = &urls.coordinator;

    // Every order got an answer, and every answer was a 200 or a 503.
    let unanswered: Vec<_> = orders
        .iter()
        .filter(|(_, outcome)| *outcome == ClientOutcome::Unknown)
        .map(|(order, _)| &order.id)
        .collect();
    assert!(
        unanswered.is_empty(),
        "orders never answered: {unanswered:?}"
    );
    let odd: Vec<_> = heard
        .iter()
        .filter(|h| h.status != 200 && h.status != 503)
        .map(|h| (&h.id, node_name(h.node), h.status))
        .collect();
    assert!(odd.is_empty(), "answers neither 200 nor 503: {odd:?}");
    let committed = orders
        .iter()
        .filter(|(_, o)| *o == ClientOutcome::Committed)
        .count();
    assert!(committed > 0, "the load committed nothing");

    // 0 acknowledged lost: the new leader's record of every answered id is the answer, and a
    // retry of the id there gets it again without running it twice.
    for (order, outcome) in orders {
        let expected = match outcome {
            ClientOutcome::Committed => Outcome::Committed,
            ClientOutcome::Aborted => Outcome::Aborted,
            ClientOutcome::Unknown => continue,
        };
        let status: TransactionStatus = client
            .get(format!("{leader_url}/v1/transactions/{}", order.id))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap_or_else(|e| panic!("{}: no record on the new leader: {e}", order.id));
        assert_eq!(status.outcome, Some(expected), "{}: {status:?}", order.id);
        let retry = client
            .post(format!("{leader_url}/v1/transactions"))
            .json(&order.request(PREPARE_TIMEOUT_MS))
            .send()
            .await
            .unwrap();
        assert_eq!(retry.status().as_u16(), 200, "retry of {}", order.id);
        let again: TransactionResponse = retry.json().await.unwrap();
        assert_eq!(again.outcome, expected, "retry of {}", order.id);
        assert_eq!(again.gtid, status.gtid, "a retry is the same attempt");
    }

    // 0 split, 0 in doubt: the oracle's invariants (conservation, atomicity, durability,
    // agreement with the new leader's log, nothing prepared left after a bounded wait).
    let mut audited = orders.to_vec();
    audited.extend(refused.iter().map(|o| (o.clone(), ClientOutcome::Unknown)));
    let report = audit(
        &client,
        &urls,
        config,
        Totals::default(), // a fresh store: every test starts on its own seeds
        &audited,
        Duration::from_secs(20),
    )
    .await
    .unwrap();
    for check in &report.checks {
        println!("audit: {} ok={} ({})", check.name, check.ok, check.detail);
    }
    assert!(report.all_ok(), "{}", report.failures());
    assert_eq!(
        report.applied, committed,
        "every committed order is applied at every participant"
    );
    println!(
        "orders={} committed={committed} applied={} absent={}",
        orders.len(),
        report.applied,
        report.absent
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_the_leader_mid_load_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // The default lease (3 s): this test measures the failover an operator gets.
    let mut group = start_group(dir.path(), None).await;
    let config = CheckoutConfig::default();
    let old = group.view(0).await.expect("c0 answers");
    assert!(old.leading() && old.in_sync("c1"), "{old:?}");

    let load = Load::start(&group, &config, "kill");
    load.wait_commits(0, load.started, 20, &group).await;
    let fault = Instant::now();
    group.coordinators[0].kill();

    let new = group
        .wait_leading(1, WAIT)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    println!("sigkill: leading_after_ms={}", fault.elapsed().as_millis());
    assert!(new.role.term > old.role.term, "{new:?} after {old:?}");
    assert!(new.epoch > old.epoch, "epochs rise: {new:?} after {old:?}");
    // A real load through the new leader too, before the audit.
    load.wait_commits(1, fault, 20, &group).await;
    let (orders, heard) = load.finish().await;
    let down = unavailability(&heard, 0, 1, fault);
    println!("sigkill: unavailability_ms={}", down.as_millis());
    print_timeline(&heard, fault);

    rejoin(&mut group, 0, 1).await;
    audit_after_failover(&group, 1, &config, &orders, &heard, &[]).await;
    assert!(down < UNAVAILABILITY_MAX, "unavailable for {down:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigstop_of_the_leader_past_its_lease() {
    let dir = tempfile::tempdir().unwrap();
    let mut group = start_group(dir.path(), Some(SHORT_TTL_MS)).await;
    let config = CheckoutConfig::default();
    let old = group.view(0).await.expect("c0 answers");
    let load = Load::start(&group, &config, "stop");
    load.wait_commits(0, load.started, 20, &group).await;

    let fault = Instant::now();
    group.stop(0).unwrap();
    let new = group
        .wait_leading(1, WAIT)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    println!("sigstop: leading_after_ms={}", fault.elapsed().as_millis());
    assert!(new.role.term > old.role.term, "{new:?} after {old:?}");
    let first_new = load.wait_commits(1, fault, 1, &group).await;
    // Paused for the lease TTL and 2 s more, whatever the failover took.
    let paused = Duration::from_millis(SHORT_TTL_MS) + Duration::from_secs(2);
    tokio::time::sleep(paused.saturating_sub(fault.elapsed())).await;
    group.cont(0).unwrap();

    // A probe asks the old leader for new transactions until it is gone: 503 or no answer.
    let probe_client = group.http();
    let probe_url = group.coordinators[0].url();
    let probing = Arc::new(AtomicBool::new(true));
    let probe = tokio::spawn({
        let probing = probing.clone();
        let config = config.clone();
        async move {
            let mut rng = fastrand::Rng::with_seed(99);
            let mut sent = Vec::new();
            for i in 0.. {
                if !probing.load(Ordering::SeqCst) {
                    break;
                }
                let order = config.order("probe", i, &mut rng);
                let answer = probe_client
                    .post(format!("{probe_url}/v1/transactions"))
                    .timeout(REQUEST_TIMEOUT)
                    .json(&order.request(PREPARE_TIMEOUT_MS))
                    .send()
                    .await
                    .map(|r| r.status().as_u16());
                sent.push((order, answer.ok()));
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            sent
        }
    });
    let resumed = Instant::now();
    // It must step down within a few seconds of running again.
    let exit =
        tokio::task::block_in_place(|| group.coordinators[0].wait_exit(Duration::from_secs(10)));
    let exited = Instant::now();
    println!(
        "sigstop: exited_after_sigcont_ms={}",
        exited.duration_since(resumed).as_millis()
    );
    probing.store(false, Ordering::SeqCst);
    let probes = probe.await.unwrap();
    let log = group.coordinators[0].log();
    let exit = exit.unwrap_or_else(|| panic!("c0 kept running; log tail:\n{}", tail(&log, 40)));
    assert_eq!(exit.code(), Some(5), "log tail:\n{}", tail(&log, 40));
    assert!(
        log.contains("STEPPING DOWN"),
        "log tail:\n{}",
        tail(&log, 40)
    );
    let answered: Vec<_> = probes
        .iter()
        .filter(|(_, status)| status.is_some_and(|s| s != 503))
        .map(|(order, status)| (&order.id, status))
        .collect();
    assert!(answered.is_empty(), "the old leader answered: {answered:?}");

    load.wait_commits(1, exited, 1, &group).await;
    let (orders, heard) = load.finish().await;
    let late: Vec<_> = heard
        .iter()
        .filter(|h| h.node == 0 && h.status != 503 && h.at >= first_new && h.at <= exited)
        .map(|h| (&h.id, h.status, h.outcome))
        .collect();
    assert!(late.is_empty(), "answers from the deposed leader: {late:?}");
    let down = unavailability(&heard, 0, 1, fault);
    let refused_503 = probes.iter().filter(|(_, s)| *s == Some(503)).count();
    println!(
        "sigstop: unavailability_ms={} probes_after_sigcont={} (503: {refused_503}, no answer: {})",
        down.as_millis(),
        probes.len(),
        probes.len() - refused_503
    );
    print_timeline(&heard, fault);

    // The probes were refused: audited as unanswered (applied nowhere, or atomically).
    let refused: Vec<Order> = probes.into_iter().map(|(order, _)| order).collect();
    rejoin(&mut group, 0, 1).await;
    audit_after_failover(&group, 1, &config, &orders, &heard, &refused).await;
    assert!(down < UNAVAILABILITY_MAX, "unavailable for {down:?}");
}

/// Takes follower c1 away under load (by `fault`): leader c0 must run degraded (sync set
/// empty in etcd, c1 not counted in sync) and keep committing, its commits held up at most
/// about the replica timeout. Returns the degraded view.
async fn lose_follower(
    group: &mut LocalGroup,
    load: &Load,
    how: &str,
    fault: impl FnOnce(&mut LocalGroup),
) -> GroupView {
    let lost = Instant::now();
    fault(group);
    let degraded = group
        .wait_degraded(0, WAIT)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        degraded.followers.iter().all(|f| !f.in_sync),
        "{degraded:?}"
    );
    load.wait_commits(0, Instant::now(), 1, group).await;
    // The longest gap between the leader's commits since the loss.
    let mut commits = load.commits_by(0);
    commits.sort();
    let stall = commits
        .windows(2)
        .filter(|w| w[1] > lost)
        .map(|w| w[1].saturating_duration_since(w[0]))
        .max()
        .unwrap_or_default();
    println!(
        "follower {how}: degraded_after_ms={} leader_stall_ms={}",
        lost.elapsed().as_millis(),
        stall.as_millis()
    );
    assert!(stall < Duration::from_secs(5), "commits stalled {stall:?}");
    degraded
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loss_of_a_follower_keeps_the_leader_going() {
    let dir = tempfile::tempdir().unwrap();
    let mut group = start_group(dir.path(), Some(SHORT_TTL_MS)).await;
    let config = CheckoutConfig::default();
    let load = Load::start(&group, &config, "degrade");
    load.wait_commits(0, load.started, 20, &group).await;

    // A follower that hangs (SIGSTOP) holds commits up for the replica timeout, then is
    // dropped from the sync set; once it runs again it is attached afresh.
    lose_follower(&mut group, &load, "hangs", |g| g.stop(1).unwrap()).await;
    group.cont(1).unwrap();
    group
        .wait_in_sync(0, 1, WAIT)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    load.wait_commits(0, Instant::now(), 1, &group).await;

    // A follower that dies (SIGKILL) is dropped at once; restarted, it rejoins in sync.
    let degraded = lose_follower(&mut group, &load, "dies", |g| g.coordinators[1].kill()).await;
    rejoin(&mut group, 1, 0).await;
    load.wait_commits(0, Instant::now(), 2, &group).await;

    let fault = Instant::now();
    group.coordinators[0].kill();
    let new = group
        .wait_leading(1, WAIT)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(new.role.term > degraded.role.term, "{new:?}");
    load.wait_commits(1, fault, 2, &group).await;
    let (orders, heard) = load.finish().await;
    let down = unavailability(&heard, 0, 1, fault);
    println!(
        "after rejoin, sigkill: unavailability_ms={}",
        down.as_millis()
    );
    print_timeline(&heard, fault);
    audit_after_failover(&group, 1, &config, &orders, &heard, &[]).await;
    assert!(down < UNAVAILABILITY_MAX, "unavailable for {down:?}");
}
