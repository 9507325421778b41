//! `/metrics` of a real coordinator and a real participant, after a transaction, read by
//! Prometheus's own linter (`promtool check metrics`), and every metric docs/alerts.yml queries
//! found in them. Needs promtool (Debian: `apt-get install prometheus`); `.ci/run` installs it
//! and runs this with `--ignored`.
//!
//! The names of the series are tested in each crate (coordinator/src/metrics/tests.rs,
//! participant/src/metrics/tests.rs); this is the text as a scraper receives it.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use cluster::node::{Node, NodeSpec, free_port};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(20);

/// promtool's complaints about names that keep a unit abbreviation (`_ms`): they were exported
/// before this test existed, and docs/alerts.yml and dashboards query them, so they stay.
const KEPT_NAMES: [&str; 3] = [
    "twopc_coordinator_oldest_pending_ack_age_ms",
    "twopc_coordinator_retained_effective_window_ms",
    "twopc_participant_oldest_prepared_age_ms",
];

fn start(dir: &Path, name: &str, args: Vec<String>, port: u16) -> Node {
    let mut node = Node::start(NodeSpec {
        name: name.into(),
        binary: env!("CARGO_BIN_EXE_twopc").into(),
        args,
        env: vec![("RUST_LOG".into(), "warn".into())],
        addr: format!("127.0.0.1:{port}").parse().unwrap(),
        log_path: dir.join(format!("{name}.log")),
        tokens: cluster::auth::for_test(dir),
    });
    tokio::task::block_in_place(|| node.wait_ready(WAIT)).unwrap();
    node
}

/// The body and content type of `GET /metrics`.
async fn scrape(node: &Node) -> (String, String) {
    let response = node
        .http()
        .get(format!("{}/metrics", node.url()))
        .timeout(WAIT)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    (content_type, response.text().await.unwrap())
}

/// What `promtool check metrics` says of `text`: its exit code and its complaints.
fn promtool_check(text: &str) -> (Option<i32>, Vec<String>) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("this test needs promtool (Debian: apt-get install prometheus): {e}")
        });
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    let complaints = said
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(String::from)
        .collect();
    (output.status.code(), complaints)
}

/// promtool parsed the text, and its only complaints (exit 3: lint) are the kept names'.
fn assert_promtool_accepts(what: &str, text: &str) {
    let (code, complaints) = promtool_check(text);
    let only_kept_names = complaints
        .iter()
        .all(|c| KEPT_NAMES.iter().any(|n| c.starts_with(&format!("{n} "))));
    assert!(
        code == Some(0) || (code == Some(3) && only_kept_names),
        "promtool check metrics on {what}'s /metrics: exit {code:?}\n{}\n\n{text}",
        complaints.join("\n")
    );
}

/// The metric names docs/alerts.yml mentions (in expressions and descriptions).
fn alerted_names() -> Vec<String> {
    let rules =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/alerts.yml")).unwrap();
    let mut names: Vec<String> = rules
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|word| word.starts_with("twopc_"))
        .map(String::from)
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Whether `text` has a sample of the series `name` (with or without labels).
fn has_series(text: &str, name: &str) -> bool {
    text.lines().any(|line| {
        line.strip_prefix(name)
            .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs promtool; .ci/run runs it with --ignored"]
async fn live_metrics_pass_promtool_and_hold_every_alerted_series() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let (coordinator_port, participant_port) = (free_port(), free_port());
    let participant = start(
        dir,
        "inventory",
        [
            "participant",
            "--name",
            "inventory",
            "--listen",
            &format!("127.0.0.1:{participant_port}"),
            "--data-dir",
            &dir.join("inventory").display().to_string(),
            "--coordinator",
            &format!("http://127.0.0.1:{coordinator_port}"),
        ]
        .map(String::from)
        .to_vec(),
        participant_port,
    );
    let coordinator = start(
        dir,
        "coordinator",
        [
            "coordinator",
            "--listen",
            &format!("127.0.0.1:{coordinator_port}"),
            "--data-dir",
            &dir.join("coordinator").display().to_string(),
            "--participant",
            &format!("inventory={}", participant.url()),
        ]
        .map(String::from)
        .to_vec(),
        coordinator_port,
    );

    let answer: serde_json::Value = coordinator
        .http()
        .post(format!("{}/v1/transactions?wait=acked", coordinator.url()))
        .json(&json!({
            "id": "order-1",
            "participants": [{"name": "inventory",
                "payload": {"ops": [{"op": "put", "key": "k", "value": "1"}]}}]
        }))
        .timeout(WAIT)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["outcome"], "committed", "{answer}");

    let (coordinator_type, coordinator_text) = scrape(&coordinator).await;
    let (participant_type, participant_text) = scrape(&participant).await;
    for content_type in [&coordinator_type, &participant_type] {
        assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
    }
    // The transaction is in both: these are scrapes of working processes, not empty ones.
    assert!(
        coordinator_text
            .contains("twopc_coordinator_transactions_total{outcome=\"committed\"} 1\n"),
        "{coordinator_text}"
    );
    assert!(
        participant_text.contains("twopc_participant_votes_total{vote=\"yes\"} 1\n"),
        "{participant_text}"
    );

    assert_promtool_accepts("the coordinator", &coordinator_text);
    assert_promtool_accepts("the participant", &participant_text);

    // A coordinator group's families (`twopc_ha_*`) are exported only by a node of a group
    // (tests/ha_failover.rs runs those): their text, as such a node renders it, must pass
    // promtool too and hold what the alerts query.
    let group_text =
        coordinator::metrics::group::render(&coordinator::metrics::group::GroupNumbers::default());
    assert_promtool_accepts("a node of a coordinator group", &group_text);

    // The relay's families, as a relay that has delivered, failed to reach and been refused
    // renders them (tests/relay_process.rs scrapes a live one).
    let relay_metrics = relay::metrics::Metrics::default();
    for outcome in [
        relay::metrics::Outcome::Delivered,
        relay::metrics::Outcome::Unknown,
        relay::metrics::Outcome::Failed,
    ] {
        relay_metrics.delivery("payments", outcome);
    }
    let relay_text = relay_metrics.text(&["payments".to_string()]);
    assert_promtool_accepts("a relay", &relay_text);

    let names = alerted_names();
    assert!(names.len() >= 10, "{names:?}");
    for name in &names {
        let exported = if name.starts_with("twopc_ha_") {
            has_series(&group_text, name)
        } else if name.starts_with("twopc_relay_") {
            has_series(&relay_text, name)
        } else {
            has_series(&coordinator_text, name) || has_series(&participant_text, name)
        };
        assert!(
            exported,
            "docs/alerts.yml queries {name}, which no process exports"
        );
    }
}
