//! A coordinator restored from a backup of its data directory, on a real cluster (the failpoints
//! build of `twopc`, coordinator + inventory, payments, shipping, a fault proxy on every link).
//!
//! The backup is taken while the coordinator is stopped, after one committed order. A later run
//! commits order X: inventory and payments apply it, shipping's commit is dropped, so shipping
//! holds X prepared. The coordinator is then SIGKILLed and its data directory replaced by the
//! backup, which holds neither that run nor X. Before attempts had their own ids, the restored
//! coordinator presumed abort for X when shipping asked, and shipping aborted what the others
//! had committed: one decision, split. Now the restored log cannot prove X's outcome, so it
//! answers `unknown`, learns that it is behind, and stops taking new work; shipping stays in
//! doubt for an operator (docs/operations.md, "Restores and rolled-back logs").
//!
//! Shipping's own link to the coordinator (its decision queries) goes through a proxy too, cut
//! until the restored coordinator is up: otherwise shipping would ask the run that committed X
//! (one in-doubt delay after its prepare) and commit before the restore could happen, and the
//! restored coordinator would take its first query while starting. Both are real timings; the
//! cut only makes the one under test happen every time.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use chaos_tests::binary::failpoints_binary;
use chaos_tests::proxy::{Fault, Rule, Scope};
use chaos_tests::scenario::probe::{self, TxView};
use chaos_tests::scenario::{COORDINATOR, ChaosCluster, ChaosOptions};
use cluster::audit::ClientOutcome;
use cluster::checkout::{Order, SHIPPING};
use cluster::node::http_get;
use protocol::kv::PreparedEntry;
use protocol::{DecisionStatus, Outcome};
use serde_json::Value;

/// Bound for anything the cluster does by itself (commits delivered, recovery, queries asked).
const WAIT: Duration = Duration::from_secs(60);
/// Shipping's decision queries answered by the restored coordinator before the verdict: more
/// than one, so "still prepared" is not just "has not asked yet".
const QUERIES: u64 = 3;
/// How long the oracle lets in-doubt transactions resolve: X must not, so keep it short.
const SETTLE: Duration = Duration::from_secs(3);

#[test]
fn a_coordinator_restored_from_a_backup_answers_unknown_and_never_splits_a_decision() {
    let mut chaos = ChaosCluster::start(&ChaosOptions {
        uplink_proxies: true,
        ..ChaosOptions::default()
    });

    // a. One committed warm-up order, then a clean stop and a copy of the whole data directory.
    let warm = order(&chaos, "warm-up", 0);
    let heard = send_once(&mut chaos, &warm);
    assert_eq!(heard, ClientOutcome::Committed, "warm-up\n{}", chaos.logs());
    wait_quiescent(&chaos, "before the backup");
    let stopped = chaos.node(COORDINATOR).terminate(Duration::from_secs(20));
    assert!(
        stopped.is_some_and(|s| s.success()),
        "SIGTERM did not stop the coordinator cleanly: {stopped:?}\n{}",
        chaos.logs()
    );
    let data_dir = chaos.data_dir(COORDINATOR);
    let backup = chaos.dir.path().join("coordinator-backup");
    copy_dir(&data_dir, &backup);

    // b. A new run commits X; shipping's commit is dropped and its queries cannot get through.
    chaos.restart(COORDINATOR, Vec::new());
    chaos
        .proxy(SHIPPING)
        .add(Rule::always(Scope::Commit, Fault::DropRequest));
    chaos.uplink(SHIPPING).partition();
    let x = order(&chaos, "order-x", 1);
    let answer = chaos
        .run_orders(vec![x.clone()], once(&chaos))
        .pop()
        .expect("one result");
    let gtid = match &answer.answer {
        Some(a) if a.outcome == Outcome::Committed => a.gtid.clone(),
        _ => panic!("X was not answered committed: {answer:?}\n{}", chaos.logs()),
    };
    let view = wait_view(&chaos, &x, |v| {
        v.applied[0] && v.applied[1] && !v.prepared[0] && !v.prepared[1] && v.prepared[2]
    });
    assert!(
        view.applied[0] && view.applied[1] && !view.applied[2] && view.prepared[2],
        "expected X committed at inventory and payments and prepared at shipping: \
         {view:?}\n{}",
        chaos.logs()
    );
    let held = shipping_entry(&chaos, &x).expect("checked: prepared at shipping");
    assert_eq!(held.gtid, gtid, "shipping holds another attempt of X");

    // c. SIGKILL, the backup copied back over the data directory, a start on it, links healed.
    chaos.kill(COORDINATOR);
    std::fs::remove_dir_all(&data_dir)
        .unwrap_or_else(|e| panic!("removing {}: {e}", data_dir.display()));
    copy_dir(&backup, &data_dir);
    // Not "ready": its probe at start learns at once that participants hold the lost run.
    chaos.restart_no_wait(COORDINATOR, Vec::new());
    chaos.proxy(SHIPPING).heal();
    chaos.uplink(SHIPPING).heal();

    // d. The restored log starts at the epoch the lost run had (it bumps from what it holds),
    // under a new incarnation. Shipping asks it several times and keeps X prepared: whatever
    // this run answers, it cannot decide X (shipping also ignores answers from another run at
    // the epoch it holds, so only the coordinator's own answer is tested after the next start).
    let first = wait_asked(&chaos, &x, &gtid, |e| e.last_answer.is_some());
    // Shown to an operator: what the coordinator said, or why shipping did not take it.
    let said = first.last_answer.as_deref().unwrap_or("");
    assert!(
        said.starts_with("unknown") || said.starts_with("ignored"),
        "shipping's last answer from the restored coordinator: {said:?}"
    );
    assert_x_stays(&chaos, &x, "after the restored start");
    // It learned that its log is behind (participants refused its probe): not ready, and no
    // new transaction.
    assert_log_behind(&chaos, "after shipping's queries");
    let refused = order(&chaos, "order-after-restore", 2);
    let (status, body) = post_order(&chaos, &refused);
    assert_eq!(
        (status, body["error"].as_str()),
        (503, Some("log_behind")),
        "a new order on a coordinator whose log is behind: {body}"
    );
    // Refused before anything was sent: the client has no outcome, and none may appear.
    chaos.remember(&[cluster::workload::OrderResult {
        order: refused.clone(),
        outcome: ClientOutcome::Unknown,
        answer: None,
        error: Some(body.to_string()),
        attempts: 1,
        latency: None,
    }]);
    let view = view_of(&chaos, &refused);
    assert!(
        view.applied_nowhere() && view.prepared_nowhere() && view.coordinator.is_none(),
        "a refused order reached the participants: {view:?}"
    );

    // No restart (issue 24): a participant's refusal of this run's probe or of a message it
    // sent is evidence that another run passed this one, so the coordinator logs an epoch
    // above the highest one reported and shipping takes its answers as the coordinator's own.
    let entry = wait_asked(&chaos, &x, &gtid, |e| {
        e.last_answer
            .as_deref()
            .is_some_and(|a| a.starts_with("unknown"))
    });
    assert_x_stays(&chaos, &x, "after the raise on the restored log");
    // The coordinator's own answer to shipping's query: unknown, because the log holds neither
    // X nor the run that began it, at an epoch above the lost run's, from the same run.
    let urls = chaos.urls();
    let said = chaos.runtime.block_on(probe::decision_answer(
        &chaos.peer_client,
        &urls,
        &x.id,
        &probe::query_of(&entry),
    ));
    assert_eq!(said.decision, DecisionStatus::Unknown, "{said:?}");
    assert!(
        said.incarnation.is_some_and(|i| i != entry.incarnation)
            && said.epoch.is_some_and(|e| e > entry.epoch),
        "the answer comes from the restored run at a raised epoch: {said:?} vs {entry:?}"
    );
    let raises = http_get(chaos.cluster.coordinator.spec().addr, "/metrics")
        .map(|(_, text)| text)
        .unwrap_or_default();
    assert!(
        raises
            .lines()
            .any(|l| l.starts_with("twopc_coordinator_epoch_raises_total ") && !l.ends_with(" 0")),
        "the epoch was raised by the coordinator itself:\n{raises}"
    );
    let status = post_order(&chaos, &refused).0;
    assert_eq!(status, 503, "still refusing new work");

    // The oracle: nothing torn, lost or contradicted, and the committed warm-up agrees with the
    // restored log. Only liveness fails, for shipping's X, which is an operator's to resolve.
    let report = chaos.audit(SETTLE);
    let broken: Vec<String> = report
        .checks
        .iter()
        .filter(|c| !c.ok && !c.name.starts_with("liveness"))
        .map(|c| format!("{}: {}", c.name, c.detail))
        .collect();
    assert!(
        broken.is_empty(),
        "the oracle found broken invariants:\n{}\n{}",
        broken.join("\n"),
        chaos.logs()
    );
    let liveness = report
        .checks
        .iter()
        .find(|c| c.name.starts_with("liveness"))
        .expect("the oracle checks liveness");
    assert!(
        !liveness.ok && liveness.detail.ends_with("{\"shipping\": 1}"),
        "only X at shipping may be left in doubt: {liveness:?}"
    );
    assert_eq!(
        (report.applied, report.absent),
        (1, 1),
        "warm-up applied, the refused order nowhere, X neither"
    );

    // e. An operator resolves X from the evidence (docs/operations.md): abort is refused,
    // because inventory and payments committed it; commit is accepted and audited, and
    // shipping applies it when it next asks.
    let coordinator = chaos.cluster.coordinator_url();
    let (code, _, refused) = ctl(
        &chaos,
        &coordinator,
        &[
            "resolve",
            &x.id,
            "--decision",
            "abort",
            "--reason",
            "restore",
        ],
    );
    assert_eq!(code, Some(1), "abort contradicts the evidence: {refused}");
    assert!(
        refused.contains("contradicts_evidence") && refused.contains("committed this attempt"),
        "the refusal names the evidence: {refused}"
    );
    let (code, shown, err) = ctl(&chaos, &coordinator, &["--json", "show", &x.id]);
    assert_eq!(code, Some(0), "{err}");
    let shown: Value = serde_json::from_str(&shown).expect("show --json prints JSON");
    let states: Vec<&str> = shown["evidence"]["participants"]
        .as_array()
        .expect("participants")
        .iter()
        .map(|p| p["state"].as_str().unwrap_or("not asked"))
        .collect();
    assert_eq!(
        states,
        ["committed", "committed", "prepared"],
        "inventory, payments, shipping: {shown}"
    );
    assert!(
        shown["evidence"]["participants"][2]["prepared_at_ms"].is_u64(),
        "shipping's evidence says since when it holds X: {shown}"
    );
    assert!(
        shown["evidence"]["coordinator"]
            .as_str()
            .is_some_and(|c| c.starts_with("unknown")),
        "{shown}"
    );
    let (code, resolved, err) = ctl(
        &chaos,
        &coordinator,
        &[
            "resolve",
            &x.id,
            "--decision",
            "commit",
            "--reason",
            "restored coordinator; X committed at inventory and payments",
            "--operator",
            "ana",
        ],
    );
    assert_eq!(code, Some(0), "{resolved}{err}\n{}", chaos.logs());
    assert!(resolved.contains("as commit (audit #1)"), "{resolved}");
    // Waited on together: a view reads the in-doubt lists before the markers, so a commit
    // landing between the two reads shows shipping both prepared and applied.
    let view = wait_view(&chaos, &x, |v| {
        v.applied_everywhere() && v.prepared_nowhere()
    });
    assert!(
        view.applied_everywhere() && view.prepared_nowhere(),
        "{view:?}"
    );
    let status = view.coordinator.expect("the resolution is X's status now");
    assert_eq!(status.outcome, Some(Outcome::Committed), "{status:?}");
    let operator = cluster::auth::audited_operator(chaos.cluster.tokens.as_ref(), "ana");
    assert!(
        status
            .reason
            .as_deref()
            .is_some_and(|r| r.starts_with(&format!("resolved by operator {operator} (audit #1)"))),
        "{status:?}"
    );
    let report = chaos.audit(SETTLE);
    assert!(
        report.all_ok(),
        "after the resolution every invariant holds, liveness included:\n{}",
        report.failures()
    );
    assert_eq!((report.applied, report.absent), (2, 1));

    // The resolution and its audit record survive a restart; a second one is refused.
    chaos.restart_no_wait(COORDINATOR, Vec::new());
    let deadline = Instant::now() + WAIT;
    let audit = loop {
        let (code, out, _) = ctl(&chaos, &coordinator, &["--json", "audit"]);
        if code == Some(0) {
            break out;
        }
        assert!(Instant::now() < deadline, "ctl audit never answered");
        std::thread::sleep(Duration::from_millis(100));
    };
    let audit: Value = serde_json::from_str(&audit).expect("audit --json prints JSON");
    let entry = &audit["audit"][0];
    assert_eq!(
        (
            entry["seq"].as_u64(),
            entry["action"].as_str(),
            entry["operator"].as_str(),
            entry["decision"].as_str(),
            entry["gtid"].as_str()
        ),
        (
            Some(1),
            Some("resolve"),
            Some(cluster::auth::audited_operator(
                chaos.cluster.tokens.as_ref(),
                "ana"
            )),
            Some("commit"),
            Some(gtid.as_str())
        ),
        "{audit}"
    );
    let (code, _, again) = ctl(
        &chaos,
        &coordinator,
        &[
            "resolve",
            &x.id,
            "--decision",
            "commit",
            "--reason",
            "twice",
        ],
    );
    assert_eq!(code, Some(1), "{again}");
    assert!(again.contains("not_in_doubt"), "{again}");
}

/// Runs `twopc ctl --coordinator URL ARGS...` with the cluster's operator token: exit code,
/// stdout, stderr.
fn ctl(chaos: &ChaosCluster, coordinator: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let mut command = Command::new(failpoints_binary());
    if let Some(tokens) = &chaos.cluster.tokens {
        command.env(
            "TWOPC_TOKEN_FILE",
            tokens.path(protocol::auth::Kind::Operator),
        );
    }
    let output = command
        .args(["ctl", "--coordinator", coordinator])
        .args(args)
        .output()
        .expect("running twopc ctl");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Waits until shipping has had at least [`QUERIES`] decision queries about X answered since
/// now and its entry for X satisfies `done`; returns that entry. Fails at once, with the
/// oracle's verdict, if shipping no longer holds X: nothing may resolve it after the restore.
fn wait_asked(
    chaos: &ChaosCluster,
    x: &Order,
    gtid: &protocol::GlobalTxId,
    done: impl Fn(&PreparedEntry) -> bool,
) -> PreparedEntry {
    let base = chaos.uplink(SHIPPING).counts().answered;
    let deadline = Instant::now() + WAIT;
    loop {
        let entry = shipping_entry(chaos, x);
        let answered = chaos.uplink(SHIPPING).counts().answered - base;
        match entry {
            None => panic!(
                "shipping resolved X ({gtid}) after the restore (applied at shipping: {}); the \
                 restored log holds neither X nor the run that began it, so it cannot know X's \
                 outcome, and X was committed at inventory and payments.\noracle:\n{}\n{}",
                view_of(chaos, x).applied[2],
                chaos.audit(SETTLE).failures(),
                chaos.logs()
            ),
            Some(e) if answered >= QUERIES && done(&e) => {
                assert_eq!(&e.gtid, gtid, "shipping holds another attempt of X");
                return e;
            }
            Some(e) => assert!(
                Instant::now() < deadline,
                "after {WAIT:?} shipping had {answered} decision queries answered and last \
                 heard {:?}\n{}",
                e.last_answer,
                chaos.logs()
            ),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// X committed at inventory and payments, in doubt at shipping, unknown to the restored log.
fn assert_x_stays(chaos: &ChaosCluster, x: &Order, when: &str) {
    let view = view_of(chaos, x);
    assert!(
        view.applied[0] && view.applied[1] && !view.applied[2] && view.prepared[2],
        "{when}: X must stay committed at inventory and payments and in doubt at shipping: \
         {view:?}"
    );
    assert!(
        view.coordinator.is_none(),
        "{when}: the restored log holds no record of X: {view:?}"
    );
}

/// A cold product and customer per order (no lock conflicts), one unit each, so every
/// participant votes yes.
fn order(chaos: &ChaosCluster, id: &str, slot: u32) -> Order {
    let config = &chaos.config;
    Order {
        id: id.to_string(),
        sku: config.skus - 1 - slot,
        customer: config.customers - 1 - slot,
        quantity: 1,
        amount: 7,
    }
}

/// One attempt, no resend: the scenario wants what that attempt heard.
fn once(chaos: &ChaosCluster) -> cluster::workload::WorkloadOptions {
    cluster::workload::WorkloadOptions {
        retry_window: Duration::ZERO,
        request_timeout: Duration::from_secs(30),
        concurrency: 1,
        ..chaos.workload_options()
    }
}

fn send_once(chaos: &mut ChaosCluster, order: &Order) -> ClientOutcome {
    let options = once(chaos);
    chaos
        .run_orders(vec![order.clone()], options)
        .pop()
        .expect("one result")
        .outcome
}

fn wait_quiescent(chaos: &ChaosCluster, when: &str) {
    let urls = chaos.urls();
    if let Err(left) = chaos
        .runtime
        .block_on(probe::wait_quiescent(&chaos.client, &urls, WAIT))
    {
        panic!("{when}: still in flight: {left}\n{}", chaos.logs());
    }
}

fn view_of(chaos: &ChaosCluster, order: &Order) -> TxView {
    let urls = chaos.urls();
    chaos
        .runtime
        .block_on(probe::view(&chaos.client, &urls, order))
}

fn wait_view(chaos: &ChaosCluster, order: &Order, done: impl Fn(&TxView) -> bool) -> TxView {
    let urls = chaos.urls();
    chaos
        .runtime
        .block_on(probe::wait_view(&chaos.client, &urls, order, WAIT, done))
}

/// Shipping's in-doubt entry for `order`, if it still holds one.
fn shipping_entry(chaos: &ChaosCluster, order: &Order) -> Option<PreparedEntry> {
    let base = chaos.urls().shipping;
    chaos
        .runtime
        .block_on(probe::prepared_at(&chaos.client, &base))
        .into_iter()
        .find(|p| p.txid.as_str() == order.id)
}

/// `POST /v1/transactions` of `order` straight to the coordinator: status and JSON body.
fn post_order(chaos: &ChaosCluster, order: &Order) -> (u16, Value) {
    let url = format!("{}/v1/transactions", chaos.cluster.coordinator_url());
    chaos.runtime.block_on(async {
        let response = chaos
            .client
            .post(url)
            .json(&order.request(3_000))
            .send()
            .await
            .unwrap_or_else(|e| panic!("POST {}: {e}", order.id));
        let status = response.status().as_u16();
        let text = response.text().await.unwrap_or_default();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    })
}

/// Waits (bounded) for `/readyz` to answer at all, then asserts it is 503 `log_behind`.
fn assert_log_behind(chaos: &ChaosCluster, when: &str) {
    let addr = chaos.cluster.coordinator.spec().addr;
    let deadline = Instant::now() + WAIT;
    loop {
        // 503 `not_ready` while recovering, then the verdict.
        match http_get(addr, "/readyz") {
            Some((status, body)) if status == 200 || body.contains("log_behind") => {
                let body: Value = serde_json::from_str(&body).unwrap_or(Value::String(body));
                assert_eq!(
                    (status, body["error"].as_str()),
                    (503, Some("log_behind")),
                    "{when}: /readyz answered {body}\n{}",
                    chaos.logs()
                );
                return;
            }
            _ => assert!(
                Instant::now() < deadline,
                "{when}: /readyz gave no verdict within {WAIT:?}\n{}",
                chaos.logs()
            ),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Copies a directory tree, as an operator's `cp -a` of a stopped service's data would.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap_or_else(|e| panic!("creating {}: {e}", to.display()));
    let entries =
        std::fs::read_dir(from).unwrap_or_else(|e| panic!("reading {}: {e}", from.display()));
    for entry in entries {
        let entry = entry.unwrap_or_else(|e| panic!("reading {}: {e}", from.display()));
        let (source, target) = (entry.path(), to.join(entry.file_name()));
        let kind = entry
            .file_type()
            .unwrap_or_else(|e| panic!("{}: {e}", source.display()));
        if kind.is_dir() {
            copy_dir(&source, &target);
        } else if kind.is_file() {
            std::fs::copy(&source, &target)
                .unwrap_or_else(|e| panic!("copying {}: {e}", source.display()));
        } else {
            panic!("{} is neither a file nor a directory", source.display());
        }
    }
}
