//! The fault proxy against a small in-test upstream that records what it received: each fault
//! is asserted from both sides (what upstream saw, what the caller got) and in the proxy's counts.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::Uri;
use chaos_tests::proxy::{
    Fault, FaultCounts, FaultProxy, ProxyError, ProxyOptions, Route, Rule, Schedule, Scope,
};

const PREPARE: &str = "/2pc/prepare";
const COMMIT: &str = "/2pc/commit";
/// Upstream answers this path only after SLOW_MS, so a partition can start mid-exchange.
const SLOW: &str = "/slow";
const SLOW_MS: u64 = 500;
/// How long a test caller waits for an answer that should never come.
const GIVE_UP_MS: u64 = 300;
/// Bound on waiting for something that should happen.
const WAIT_MS: u64 = 10_000;

type Seen = Arc<Mutex<Vec<(String, String)>>>;

/// Records `(path, body)` of every request, then answers `{"n": <how many seen so far>}`.
async fn record(
    State(seen): State<Seen>,
    uri: Uri,
    body: Bytes,
) -> (
    [(&'static str, &'static str); 1],
    axum::Json<serde_json::Value>,
) {
    let path = uri.path().to_owned();
    let n = {
        let mut seen = seen.lock().unwrap();
        seen.push((path.clone(), String::from_utf8_lossy(&body).into_owned()));
        seen.len()
    };
    if path == SLOW {
        tokio::time::sleep(Duration::from_millis(SLOW_MS)).await;
    }
    (
        [("x-upstream", "yes")],
        axum::Json(serde_json::json!({ "n": n })),
    )
}

struct Upstream {
    url: String,
    seen: Seen,
}

impl Upstream {
    async fn start() -> Upstream {
        let seen = Seen::default();
        let app = Router::new().fallback(record).with_state(seen.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Upstream { url, seen }
    }

    fn seen(&self) -> Vec<(String, String)> {
        self.seen.lock().unwrap().clone()
    }

    fn bodies(&self) -> Vec<String> {
        self.seen().into_iter().map(|(_, body)| body).collect()
    }

    /// Bounded poll until upstream has seen at least `n` requests.
    async fn wait_seen(&self, n: usize) -> Vec<(String, String)> {
        let deadline = Instant::now() + Duration::from_millis(WAIT_MS);
        loop {
            let seen = self.seen();
            if seen.len() >= n || Instant::now() > deadline {
                return seen;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

async fn setup(seed: u64) -> (Upstream, FaultProxy) {
    let upstream = Upstream::start().await;
    let options = ProxyOptions {
        seed,
        hold_ms_max: 10_000,
        ..ProxyOptions::default()
    };
    let proxy = FaultProxy::start(&upstream.url, options).await.unwrap();
    (upstream, proxy)
}

fn client(timeout_ms: u64) -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_millis(timeout_ms))
        .build()
        .unwrap()
}

async fn post(
    client: &reqwest::Client,
    proxy: &FaultProxy,
    path: &str,
    body: &str,
) -> Result<(u16, u64), reqwest::Error> {
    let response = client
        .post(format!("{}{path}", proxy.url()))
        .body(body.to_owned())
        .send()
        .await?;
    let status = response.status().as_u16();
    let json: serde_json::Value = response.json().await?;
    Ok((status, json["n"].as_u64().unwrap()))
}

/// Posts and expects no answer: the caller's own timeout must be what ends it.
async fn post_unanswered(proxy: &FaultProxy, path: &str, body: &str) {
    let err = post(&client(GIVE_UP_MS), proxy, path, body)
        .await
        .unwrap_err();
    assert!(
        err.is_timeout(),
        "expected the caller to time out, got {err:?}"
    );
}

async fn counts_reach(proxy: &FaultProxy, done: impl Fn(&FaultCounts) -> bool) -> FaultCounts {
    match proxy.handle().wait_for_counts(WAIT_MS, done).await {
        Ok(counts) => counts,
        Err(counts) => panic!("counts never reached the expected state: {counts:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_faults_requests_and_answers_pass_unchanged_on_one_connection() {
    let (upstream, proxy) = setup(1).await;
    let client = client(WAIT_MS);
    for i in 1..=3u64 {
        let response = client
            .post(format!("{}{PREPARE}?x=1", proxy.url()))
            .header("content-type", "application/json")
            .body(format!("{{\"i\":{i}}}"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["x-upstream"], "yes");
        let json: serde_json::Value = response.json().await.unwrap();
        assert_eq!(json["n"], i);
    }
    assert_eq!(
        upstream.bodies(),
        vec!["{\"i\":1}", "{\"i\":2}", "{\"i\":3}"]
    );
    // The count follows the write, so the caller may see the answer a moment before it.
    let counts = counts_reach(&proxy, |c| c.answered == 3).await;
    assert_eq!((counts.requests, counts.forwarded), (3, 3));
    assert_eq!(proxy.handle().counts_for(Route::Prepare).answered, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_request_is_never_forwarded_and_never_answered() {
    let (upstream, proxy) = setup(2).await;
    proxy
        .handle()
        .add(Rule::always(Scope::Prepare, Fault::DropRequest));
    post_unanswered(&proxy, PREPARE, "lost").await;
    // Scoped: another route still passes, and it reached upstream after the drop decision.
    assert_eq!(
        post(&client(WAIT_MS), &proxy, COMMIT, "c").await.unwrap().0,
        200
    );
    assert_eq!(upstream.seen(), vec![(COMMIT.to_owned(), "c".to_owned())]);
    let counts = proxy.handle().counts_for(Route::Prepare);
    assert_eq!((counts.dropped_requests, counts.forwarded), (1, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_response_is_applied_upstream_but_never_answered() {
    let (upstream, proxy) = setup(3).await;
    proxy
        .handle()
        .add(Rule::always(Scope::Prepare, Fault::DropResponse));
    post_unanswered(&proxy, PREPARE, "applied").await;
    assert_eq!(
        upstream.wait_seen(1).await,
        vec![(PREPARE.to_owned(), "applied".to_owned())]
    );
    let counts = counts_reach(&proxy, |c| c.dropped_responses == 1).await;
    assert_eq!((counts.forwarded, counts.answered), (1, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_reaches_upstream_twice_and_answers_once() {
    let (upstream, proxy) = setup(4).await;
    proxy
        .handle()
        .add(Rule::always(Scope::Commit, Fault::Duplicate));
    let (status, n) = post(&client(WAIT_MS), &proxy, COMMIT, "twice")
        .await
        .unwrap();
    // The answer is upstream's first one.
    assert_eq!((status, n), (200, 1));
    assert_eq!(upstream.wait_seen(2).await.len(), 2);
    assert_eq!(upstream.bodies(), vec!["twice", "twice"]);
    let counts = counts_reach(&proxy, |c| c.duplicated == 1 && c.answered == 1).await;
    assert_eq!(
        (counts.requests, counts.forwarded, counts.answered),
        (1, 2, 1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delay_holds_the_request_at_least_the_delay() {
    let (upstream, proxy) = setup(5).await;
    let fixed = proxy.handle().add(Rule::always(
        Scope::Any,
        Fault::Delay {
            min_ms: 300,
            max_ms: 300,
        },
    ));
    let started = Instant::now();
    assert_eq!(
        post(&client(WAIT_MS), &proxy, PREPARE, "a")
            .await
            .unwrap()
            .0,
        200
    );
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "answered after {:?}",
        started.elapsed()
    );

    assert!(proxy.handle().remove(fixed));
    proxy.handle().add(Rule::always(
        Scope::Any,
        Fault::Delay {
            min_ms: 200,
            max_ms: 400,
        },
    ));
    let started = Instant::now();
    assert_eq!(
        post(&client(WAIT_MS), &proxy, PREPARE, "b")
            .await
            .unwrap()
            .0,
        200
    );
    assert!(
        started.elapsed() >= Duration::from_millis(200),
        "answered after {:?}",
        started.elapsed()
    );
    assert_eq!(upstream.bodies(), vec!["a", "b"]);
    assert_eq!(proxy.handle().counts().delayed, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reorder_forwards_the_second_request_before_the_first() {
    let (upstream, proxy) = setup(6).await;
    proxy.handle().add(Rule::always(
        Scope::Prepare,
        Fault::Reorder { hold_ms: 5_000 },
    ));
    let first_proxy_url = proxy.url();
    let first = tokio::spawn(async move {
        client(WAIT_MS)
            .post(format!("{first_proxy_url}{PREPARE}"))
            .body("first")
            .send()
            .await
    });
    counts_reach(&proxy, |c| c.held_for_reorder == 1).await;
    assert!(
        upstream.seen().is_empty(),
        "the held request must not reach upstream yet"
    );

    let (status, n) = post(&client(WAIT_MS), &proxy, PREPARE, "second")
        .await
        .unwrap();
    assert_eq!((status, n), (200, 1));
    let first = first.await.unwrap().unwrap();
    assert_eq!(first.status(), 200);
    let json: serde_json::Value = first.json().await.unwrap();
    assert_eq!(json["n"], 2);
    assert_eq!(upstream.bodies(), vec!["second", "first"]);
    let counts = counts_reach(&proxy, |c| c.answered == 2).await;
    assert_eq!(
        (counts.reordered, counts.reorder_unpaired, counts.answered),
        (1, 0, 2)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reorder_hold_is_bounded_and_heal_releases_held_requests() {
    let (upstream, proxy) = setup(7).await;
    let rule = proxy.handle().add(Rule::always(
        Scope::Prepare,
        Fault::Reorder { hold_ms: 200 },
    ));
    let started = Instant::now();
    assert_eq!(
        post(&client(WAIT_MS), &proxy, PREPARE, "alone")
            .await
            .unwrap()
            .0,
        200
    );
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert_eq!(proxy.handle().counts().reorder_unpaired, 1);

    proxy.handle().remove(rule);
    proxy.handle().add(Rule::always(
        Scope::Prepare,
        Fault::Reorder { hold_ms: 60_000 },
    ));
    let url = proxy.url();
    let held = tokio::spawn(async move {
        client(WAIT_MS)
            .post(format!("{url}{PREPARE}"))
            .body("held")
            .send()
            .await
    });
    counts_reach(&proxy, |c| c.held_for_reorder == 2).await;
    proxy.handle().heal();
    assert_eq!(held.await.unwrap().unwrap().status(), 200);
    assert_eq!(upstream.bodies(), vec!["alone", "held"]);
    assert_eq!(proxy.handle().counts().reorder_unpaired, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_drops_both_ways_until_healed() {
    let (upstream, proxy) = setup(8).await;
    let handle = proxy.handle();
    handle.add(Rule::always(Scope::Commit, Fault::DropRequest));

    // Way back: the request got through before the partition, its answer does not.
    let url = proxy.url();
    // Long enough for upstream's answer, so only the partition can keep it from the caller.
    let in_flight_timeout_ms = SLOW_MS * 3;
    let in_flight = tokio::spawn(async move {
        client(in_flight_timeout_ms)
            .post(format!("{url}{SLOW}"))
            .body("slow")
            .send()
            .await
    });
    upstream.wait_seen(1).await;
    handle.partition();
    assert!(handle.is_partitioned());
    // Way there: nothing new gets through.
    post_unanswered(&proxy, PREPARE, "p1").await;
    post_unanswered(&proxy, "/healthz", "h1").await;
    let err = in_flight.await.unwrap().unwrap_err();
    assert!(err.is_timeout(), "{err:?}");
    assert_eq!(upstream.bodies(), vec!["slow"]);
    let counts = counts_reach(&proxy, |c| c.partitioned == 3).await;
    assert_eq!(counts.answered, 0);

    // Heal ends the partition and removes every rule, the commit drop included.
    handle.heal();
    assert!(!handle.is_partitioned() && handle.rules().is_empty());
    let client = client(WAIT_MS);
    assert_eq!(post(&client, &proxy, PREPARE, "p2").await.unwrap().0, 200);
    assert_eq!(post(&client, &proxy, COMMIT, "c2").await.unwrap().0, 200);
    assert_eq!(upstream.bodies(), vec!["slow", "p2", "c2"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_down_closes_the_connection_at_once() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let proxy = FaultProxy::start(
        &format!("http://127.0.0.1:{port}/"),
        ProxyOptions::default(),
    )
    .await
    .unwrap();
    let err = post(&client(WAIT_MS), &proxy, PREPARE, "x")
        .await
        .unwrap_err();
    assert!(
        !err.is_timeout(),
        "a dead node must not look like a lost message: {err:?}"
    );
    assert_eq!(proxy.handle().counts().upstream_errors, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuses_an_upstream_off_loopback() {
    for url in [
        "http://10.1.2.3:80",
        "https://127.0.0.1:1",
        "http://example.com",
        "not a url",
    ] {
        let result = FaultProxy::start(url, ProxyOptions::default()).await;
        assert!(
            matches!(result, Err(ProxyError::NotLoopback { .. })),
            "{url}: {result:?}"
        );
    }
    assert!(
        FaultProxy::start("http://[::1]:1", ProxyOptions::default())
            .await
            .is_ok()
    );
    assert!(
        FaultProxy::start("http://localhost:1", ProxyOptions::default())
            .await
            .is_ok()
    );
}

fn prepare_drops(seed: u64, interleave_commits: bool) -> Vec<bool> {
    let mut schedule = Schedule::new(seed);
    schedule.add(Rule::percent(Scope::Prepare, Fault::DropRequest, 10));
    schedule.add(Rule::percent(Scope::Commit, Fault::DropRequest, 50));
    (0..200)
        .map(|_| {
            if interleave_commits {
                schedule.decide(Route::Commit);
            }
            schedule.decide(Route::Prepare).drop_request
        })
        .collect()
}

#[test]
fn seeded_schedule_replays_its_decisions() {
    let run = prepare_drops(42, false);
    assert_eq!(run, prepare_drops(42, false));
    // Each rule draws from its own stream: traffic on other routes does not shift the decisions.
    assert_eq!(run, prepare_drops(42, true));
    assert_ne!(run, prepare_drops(43, false));
    let dropped = run.iter().filter(|d| **d).count();
    assert!((5..=40).contains(&dropped), "10% of 200 dropped {dropped}");
}

#[test]
fn a_rule_applies_only_in_its_scope() {
    let mut schedule = Schedule::new(1);
    schedule.add(Rule::always(Scope::Abort, Fault::Duplicate));
    schedule.add(Rule::always(
        Scope::Any,
        Fault::Delay {
            min_ms: 7,
            max_ms: 7,
        },
    ));
    let abort = schedule.decide(Route::Abort);
    assert!(abort.duplicate && abort.delay_ms == 7);
    let other = schedule.decide(Route::Other);
    assert!(!other.duplicate && other.delay_ms == 7);
    assert_eq!(Route::of_target("/2pc/abort?x=1"), Route::Abort);
    assert_eq!(Route::of_target("/2pc/abortx"), Route::Other);
}

/// Sends 16 prepares one after another through a proxy that drops 30% of them; returns the
/// bodies that were answered.
async fn seeded_run(seed: u64) -> Vec<String> {
    let (upstream, proxy) = setup(seed).await;
    proxy
        .handle()
        .add(Rule::percent(Scope::Prepare, Fault::DropRequest, 30));
    let client = client(GIVE_UP_MS);
    let mut answered = Vec::new();
    for i in 0..16 {
        let body = i.to_string();
        if post(&client, &proxy, PREPARE, &body).await.is_ok() {
            answered.push(body);
        }
    }
    assert_eq!(
        upstream.bodies(),
        answered,
        "upstream saw exactly the answered requests"
    );
    let counts = proxy.handle().counts();
    assert_eq!(counts.dropped_requests as usize + answered.len(), 16);
    answered
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_probabilistic_drop_replays_end_to_end() {
    let first = seeded_run(7).await;
    assert!(
        !first.is_empty() && first.len() < 16,
        "seed 7 should drop some, not all: {first:?}"
    );
    assert_eq!(first, seeded_run(7).await);
}
