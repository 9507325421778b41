//! The crash-point matrix: one scenario per named crash point (docs/recovery.md lists them),
//! each on a real cluster built with `--features failpoints` (coordinator + inventory, payments,
//! shipping, seeded for the checkout, a fault proxy in front of every participant).
//!
//! Every scenario runs a few warm-up orders, restarts the node under test with exactly one
//! crash point armed (`FAILPOINTS=<point>=return`: the process aborts there), sends one target
//! order that reaches the point, restarts the node unarmed, and asserts the exact outcome of
//! design section 6 for the target; then the oracle audits everything the scenario ran.
//!
//! Scenarios run one at a time (the machine has two cores); timeouts are generous bounds,
//! never speed assertions.

use std::time::Duration;

use chaos_tests::binary::failpoints_binary;
use chaos_tests::disk_faults;
use chaos_tests::lease_nodes::{
    acquire, blocking, coordinator, fenced_put, participant, restart_disarmed, send,
};
use chaos_tests::proxy::{Fault, Rule, Scope};
use chaos_tests::scenario::matrix::{Scenario, stalled_fsync};
use chaos_tests::scenario::{COORDINATOR, ChaosCluster, ChaosOptions, armed, disk, probe};
use cluster::audit::ClientOutcome;
use cluster::checkout::Order;
use cluster::checkout::{INVENTORY, PAYMENTS, SHIPPING, stock_key};
use cluster::saga_checkout;
use cluster::workload::WorkloadOptions;
use protocol::{Vote, VoteKind};
use serde_json::json;

#[test]
fn coordinator_before_first_record() {
    let mut s = Scenario::start("coordinator::before_first_record");
    let order = s.target("c-first");
    s.arm(COORDINATOR);
    let heard = s.send_once(&order);
    s.wait_crash(COORDINATOR);
    s.check(
        heard.outcome == ClientOutcome::Unknown,
        format!("client heard {heard:?} from a coordinator that died before logging"),
    );
    // Nothing was sent: no participant knows the transaction.
    let prepared = s.prepared_at_participants(&order);
    s.check(
        prepared == [false; 3],
        format!("prepared at {prepared:?} before any prepare"),
    );
    s.chaos.restart(COORDINATOR, Vec::new());
    let view = s.view(&order);
    s.check(
        view.coordinator.is_none(),
        format!("restarted coordinator knows {}: {view:?}", order.id),
    );
    s.assert_aborted_and_released(&order);
    s.finish();
}

#[test]
fn coordinator_during_prepare_fanout() {
    let mut s = Scenario::start("coordinator::during_prepare_fanout");
    let order = s.target("c-fanout");
    s.arm(COORDINATOR);
    let heard = s.send_once(&order);
    s.wait_crash(COORDINATOR);
    s.check(
        heard.outcome == ClientOutcome::Unknown,
        format!("client heard {heard:?} from a coordinator that died mid fan-out"),
    );
    s.chaos.restart(COORDINATOR, Vec::new());
    s.assert_aborted_and_released(&order);
    s.finish();
}

#[test]
fn coordinator_before_decision_durable() {
    let mut s = Scenario::start("coordinator::before_decision_durable");
    let order = s.target("c-before-decision");
    s.arm(COORDINATOR);
    let heard = s.send_once(&order);
    s.wait_crash(COORDINATOR);
    s.check(
        heard.outcome != ClientOutcome::Committed,
        format!("client saw committed before the decision was durable: {heard:?}"),
    );
    // Every vote was yes: all three hold it prepared while the coordinator is down.
    let prepared = s.prepared_at_participants(&order);
    s.check(
        prepared == [true; 3],
        format!("all votes were in, yet prepared only at {prepared:?}"),
    );
    s.chaos.restart(COORDINATOR, Vec::new());
    s.assert_aborted_and_released(&order);
    s.finish();
}

#[test]
fn coordinator_after_decision_durable() {
    let mut s = Scenario::start("coordinator::after_decision_durable");
    let order = s.target("c-after-decision");
    let before = s.ledgers(&order);
    s.arm(COORDINATOR);
    let heard = s.send_once(&order);
    s.wait_crash(COORDINATOR);
    s.check(
        heard.outcome != ClientOutcome::Aborted,
        format!("client heard aborted for a durable commit: {heard:?}"),
    );
    // No phase two left the process: prepared everywhere, applied nowhere.
    let prepared = s.prepared_at_participants(&order);
    s.check(
        prepared == [true; 3],
        format!("prepared at {prepared:?}, expected everywhere"),
    );
    s.chaos.restart(COORDINATOR, Vec::new());
    s.assert_committed_once(&order, before);
    s.finish();
}

#[test]
fn coordinator_after_some_phase_two() {
    let mut s = Scenario::start("coordinator::after_some_phase_two");
    let order = s.target("c-some-phase-two");
    let before = s.ledgers(&order);
    s.arm(COORDINATOR);
    let heard = s.send_once(&order);
    s.wait_crash(COORDINATOR);
    s.check(
        heard.outcome != ClientOutcome::Aborted,
        format!("client heard aborted for a durable commit: {heard:?}"),
    );
    // At least the participant whose ack hit the point has committed; the rest are committed
    // or still prepared, never aborted.
    let prepared = s.prepared_at_participants(&order);
    s.check(
        prepared.iter().any(|p| !*p),
        format!("no participant committed before the crash: prepared at {prepared:?}"),
    );
    s.chaos.restart(COORDINATOR, Vec::new());
    s.assert_committed_once(&order, before);
    s.finish();
}

#[test]
fn coordinator_before_end_record() {
    let mut s = Scenario::start("coordinator::before_end_record");
    let order = s.target("c-before-end");
    let before = s.ledgers(&order);
    s.arm(COORDINATOR);
    let heard = s.send_once(&order);
    s.wait_crash(COORDINATOR);
    s.check(
        heard.outcome != ClientOutcome::Aborted,
        format!("client heard aborted for a durable commit: {heard:?}"),
    );
    // Every participant acknowledged: nothing is prepared any more.
    let prepared = s.prepared_at_participants(&order);
    s.check(
        prepared == [false; 3],
        format!("still prepared at {prepared:?} after all acks"),
    );
    s.chaos.restart(COORDINATOR, Vec::new());
    // Resent harmlessly (applied once), then ended.
    s.assert_committed_once(&order, before);
    s.finish();
}

#[test]
fn coordinator_during_recovery() {
    let mut s = Scenario::start("coordinator::during_recovery");
    let order = s.target("c-recovery");
    let before = s.ledgers(&order);
    // First crash: the commit is durable and nothing was sent, so recovery has work to do.
    s.chaos
        .quiesce_and_restart(COORDINATOR, armed("coordinator::after_decision_durable"));
    s.send_once(&order);
    s.wait_crash(COORDINATOR);
    // Second crash: in the middle of that recovery, after its first resend was acknowledged.
    s.chaos.restart_no_wait(COORDINATOR, armed(s.point));
    s.wait_crash(COORDINATOR);
    let prepared = s.prepared_at_participants(&order);
    s.check(
        prepared.iter().any(|p| !*p),
        format!("recovery crashed after an ack, yet prepared at {prepared:?}"),
    );
    // The next recovery completes the same work.
    s.chaos.restart(COORDINATOR, Vec::new());
    s.assert_committed_once(&order, before);
    s.finish();
}

#[test]
fn coordinator_after_audit_durable() {
    // An operator action takes effect only once its audit record is durable: dying right
    // after, the action is in the audit trail after the restart, and it changed nothing that
    // recovery does not finish anyway.
    let mut s = Scenario::start("coordinator::after_audit_durable");
    let order = s.target("c-audit");
    let before = s.ledgers(&order);
    s.chaos
        .proxy(SHIPPING)
        .add(Rule::always(Scope::Commit, Fault::DropRequest));
    s.arm(COORDINATOR);
    let heard = s.send_once(&order);
    s.check(
        heard.outcome == ClientOutcome::Committed,
        format!("client heard {heard:?}"),
    );
    let stuck = s.wait_view(&order, |v| v.applied[0] && v.applied[1] && v.prepared[2]);
    s.check(
        stuck.prepared[2],
        format!("shipping's commit is dropped, so it holds the order prepared: {stuck:?}"),
    );
    s.chaos.proxy(SHIPPING).heal();
    let url = format!(
        "{}/v1/participants/shipping/retry",
        s.chaos.cluster.coordinator_url()
    );
    let answered = s.chaos.runtime.block_on(async {
        s.chaos
            .client
            .post(url)
            .json(&serde_json::json!({"operator": "ana", "reason": "shipping is back"}))
            .send()
            .await
            .map(|r| r.status())
    });
    s.wait_crash(COORDINATOR);
    s.check(
        answered.is_err(),
        format!("the retry was answered by a coordinator that died at the point: {answered:?}"),
    );
    s.chaos.restart(COORDINATOR, Vec::new());
    let audit_url = format!("{}/v1/audit", s.chaos.cluster.coordinator_url());
    let audit: serde_json::Value = s.chaos.runtime.block_on(async {
        s.chaos
            .client
            .get(audit_url)
            .send()
            .await
            .expect("GET /v1/audit")
            .json()
            .await
            .expect("audit JSON")
    });
    let entry = &audit["audit"][0];
    s.check(
        entry["seq"] == 1
            && entry["action"] == "retry_participant"
            && entry["participant"] == "shipping"
            && entry["operator"]
                == cluster::auth::audited_operator(s.chaos.cluster.tokens.as_ref(), "ana"),
        format!("the durable audit record survives the crash: {audit}"),
    );
    s.assert_committed_once(&order, before);
    s.finish();
}

#[test]
fn participant_before_prepared_durable() {
    let mut s = Scenario::start("participant::before_prepared_durable");
    let order = s.target("p-before-prepared");
    s.arm(INVENTORY);
    let heard = s.send_once(&order);
    s.wait_crash(INVENTORY);
    s.check(
        heard.outcome == ClientOutcome::Aborted,
        format!("inventory died before its prepared record; client heard {heard:?}"),
    );
    s.chaos.restart(INVENTORY, Vec::new());
    s.assert_aborted_and_released(&order);
    s.finish();
}

#[test]
fn participant_after_prepared_durable() {
    let mut s = Scenario::start("participant::after_prepared_durable");
    let order = s.target("p-after-prepared");
    s.arm(INVENTORY);
    let heard = s.send_once(&order);
    s.wait_crash(INVENTORY);
    s.check(
        heard.outcome == ClientOutcome::Aborted,
        format!("inventory never voted; client heard {heard:?}"),
    );
    // Only asking may resolve it: the coordinator's resends cannot reach inventory, and the
    // coordinator is down while we look.
    s.chaos.proxy(INVENTORY).partition();
    s.chaos.node(COORDINATOR).terminate(Duration::from_secs(20));
    s.chaos.restart(INVENTORY, Vec::new());
    let base = s.chaos.urls().inventory.clone();
    let prepared = s
        .chaos
        .runtime
        .block_on(probe::prepared_at(&s.chaos.client, &base));
    let entry = prepared
        .iter()
        .find(|p| p.txid.as_str() == order.id)
        .cloned();
    s.check(
        entry.is_some(),
        format!(
            "after restart inventory lost the durable prepare of {}: {prepared:?}",
            order.id
        ),
    );
    let entry = entry.expect("checked");
    let stock = stock_key(order.sku);
    s.check(
        entry.keys.contains(&stock),
        format!("{stock} not among the locked keys {:?}", entry.keys),
    );
    let vote = s.chaos.runtime.block_on(probe::probe_lock(
        &s.chaos.peer_client,
        &base,
        &entry,
        "probe-lock",
        &stock,
    ));
    s.check(
        matches!(vote, Ok(Vote::No { .. })),
        format!("a prepare on the locked key {stock} answered {vote:?}, expected a no vote"),
    );
    // The coordinator comes back; inventory asks it and learns abort (the partition stays).
    s.chaos.restart(COORDINATOR, Vec::new());
    let view = s.wait_view(&order, |v| !v.prepared[0]);
    s.check(
        !view.prepared[0],
        format!("inventory did not resolve {} by asking: {view:?}", order.id),
    );
    s.chaos.heal_all();
    s.assert_aborted_and_released(&order);
    s.finish();
}

#[test]
fn participant_after_batch_item_durable() {
    // Orders sent together: the first one or two may go alone (a coordinator with at most two
    // live transactions waits for no company) and commit, their commits to inventory cut off by
    // the crash and resent after its restart; the rest meet in one of the coordinator's flushes
    // and go as a batch, and inventory dies after the first item's prepared record is durable,
    // before any line of that batch leaves.
    let mut s = Scenario::start("participant::after_batch_item_durable");
    let config = s.chaos.config.clone();
    let orders: Vec<Order> = (0..8)
        .map(|i| Order {
            id: format!("target-p-batch-{i}"),
            sku: config.skus - 1 - i,
            customer: config.customers - 1 - i,
            quantity: 1,
            amount: 7,
        })
        .collect();
    s.arm(INVENTORY);
    let options = WorkloadOptions {
        retry_window: Duration::ZERO,
        request_timeout: Duration::from_secs(30),
        concurrency: orders.len(),
        ..s.chaos.workload_options()
    };
    let heard = s.chaos.run_orders(orders.clone(), options);
    s.wait_crash(INVENTORY);
    let aborted = heard
        .iter()
        .filter(|r| r.outcome != ClientOutcome::Committed)
        .count();
    s.check(
        aborted > 0,
        format!("inventory died before a batch's lines left, yet every order committed: {heard:?}"),
    );
    s.chaos.restart(INVENTORY, Vec::new());
    // Every order ends as its client heard, or aborted where it heard nothing certain: an item
    // whose line never came was no yes. The audit (`finish`) checks every order's books.
    assert_eq!(heard.len(), orders.len(), "an answer per order");
    for result in &heard {
        let order = &result.order;
        let view = s.wait_view(order, |v| v.prepared_nowhere());
        let (ended, fits) = match result.outcome {
            ClientOutcome::Committed => (view.prepared_nowhere(), view.applied_everywhere()),
            ClientOutcome::Aborted => (view.prepared_nowhere(), view.applied_nowhere()),
            // No answer: either outcome, atomically (the audit checks the books).
            ClientOutcome::Unknown => (
                view.prepared_nowhere(),
                view.applied_everywhere() || view.applied_nowhere(),
            ),
        };
        s.check(
            ended && fits,
            format!("{} heard {:?}, yet: {view:?}", order.id, result.outcome),
        );
    }
    s.finish();
}

#[test]
fn participant_after_commit_logged() {
    let mut s = Scenario::start("participant::after_commit_logged");
    let order = s.target("p-after-commit");
    let before = s.ledgers(&order);
    s.arm(INVENTORY);
    let heard = s.send_once(&order);
    s.wait_crash(INVENTORY);
    s.check(
        heard.outcome == ClientOutcome::Committed,
        format!("every vote was yes and the decision durable; client heard {heard:?}"),
    );
    s.chaos.restart(INVENTORY, Vec::new());
    // Applies once on restart; acks the resend; the coordinator ends it.
    s.assert_committed_once(&order, before);
    s.finish();
}

#[test]
fn wal_between_write_and_fsync() {
    let mut s = Scenario::start("wal::between_write_and_fsync");
    let order = s.target("w-write-fsync");
    s.arm(PAYMENTS);
    let heard = s.send_once(&order);
    s.wait_crash(PAYMENTS);
    s.check(
        heard.outcome == ClientOutcome::Aborted,
        format!("payments died before its prepared record was synced; client heard {heard:?}"),
    );
    // The written, unsynced record may survive (SIGKILL keeps the page cache): the restarted
    // participant then holds it in doubt and must resolve it to abort.
    s.chaos.restart(PAYMENTS, Vec::new());
    s.assert_aborted_and_released(&order);
    s.finish();
}

#[test]
fn wal_roll_after_trim() {
    let mut s = Scenario::start("wal::roll_after_trim");
    s.arm(SHIPPING);
    // Shipping rolls at every checkpoint (every 40 records, two per order): keep orders coming
    // until it dies between trimming the segment it closes and creating the next one.
    let orders = s.chaos.orders("roll", 29, 40);
    let running = s.chaos.spawn_orders(orders, s.chaos.workload_options());
    s.wait_crash(SHIPPING);
    let wal = disk_faults::wal_dir(&s.chaos.data_dir(SHIPPING));
    let segments = disk_faults::segments(&wal).expect("list segments");
    let last = segments.last().cloned().expect("a segment");
    let size = std::fs::metadata(&last).map_or(0, |m| m.len());
    let end = disk::frames(&last).last().map_or(0, |f| f.offset + f.len);
    s.check(
        end > 0 && end == size,
        format!(
            "the closed segment {} ends at its last record ({end}), not in zeros ({size} bytes)",
            last.display()
        ),
    );
    s.chaos.restart(SHIPPING, Vec::new());
    s.chaos.finish(running);
    s.finish();
}

#[test]
fn wal_checkpoint_before_delete() {
    let mut s = Scenario::start("wal::checkpoint_before_delete");
    s.arm(SHIPPING);
    // Shipping checkpoints every 40 records (two per order): keep orders coming until it dies
    // between writing its snapshot and deleting the old segments.
    let orders = s.chaos.orders("cp", 23, 40);
    let running = s.chaos.spawn_orders(orders, s.chaos.workload_options());
    s.wait_crash(SHIPPING);
    let wal = disk_faults::wal_dir(&s.chaos.data_dir(SHIPPING));
    let snapshots = disk_faults::snapshots(&wal).expect("list snapshots");
    s.check(
        !snapshots.is_empty(),
        "no snapshot written before the crash".into(),
    );
    s.chaos.restart(SHIPPING, Vec::new());
    s.chaos.finish(running);
    // Recovery finished the checkpoint: one snapshot, and no segment it covers is left.
    let snapshots = disk_faults::snapshots(&wal).expect("list snapshots");
    let segments = disk_faults::segments(&wal).expect("list segments");
    let seq = |path: &std::path::Path, prefix: &str, suffix: &str| -> u64 {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        name.trim_start_matches(prefix)
            .trim_end_matches(suffix)
            .parse()
            .unwrap()
    };
    let covered = snapshots
        .iter()
        .map(|p| seq(p, "snapshot-", ".snap"))
        .max()
        .unwrap_or(0);
    let stale: Vec<_> = segments
        .iter()
        .filter(|p| seq(p, "", ".wal") <= covered)
        .collect();
    s.check(
        snapshots.len() == 1 && stale.is_empty(),
        format!("after recovery: snapshots {snapshots:?}, segments covered by it {stale:?}"),
    );
    s.finish();
}

#[test]
fn wal_stalled_fsync_participant_never_votes_before_sync() {
    let mut s = Scenario::start("wal::between_write_and_fsync");
    let order = s.target("w-stall-participant");
    // Payments writes the target's prepared record and stalls before the fsync.
    s.chaos.quiesce_and_restart(PAYMENTS, stalled_fsync(0));
    let heard = s.send_once(&order);
    s.check(
        heard.outcome == ClientOutcome::Aborted,
        format!(
            "payments' prepared record was never synced, so it cannot have voted yes; \
             the prepare must time out and the order abort, but the client heard {heard:?}"
        ),
    );
    let vote = s.view(&order).coordinator.and_then(|status| {
        status
            .participants
            .iter()
            .find(|p| p.name.as_str() == PAYMENTS)
            .and_then(|p| p.vote)
    });
    s.check(
        vote == Some(VoteKind::Timeout),
        format!("payments' vote should have timed out (its log is stalled), got {vote:?}"),
    );
    // Power fails now: the unsynced record is lost (torn), then payments restarts.
    s.chaos.kill(PAYMENTS);
    let torn = disk::tear_last_record(&s.chaos.data_dir(PAYMENTS), 5);
    s.check(torn.is_some(), "payments wrote no record to tear".into());
    s.chaos.restart(PAYMENTS, Vec::new());
    s.assert_aborted_and_released(&order);
    s.finish();
}

#[test]
fn wal_stalled_fsync_coordinator_never_sends_before_sync() {
    let mut s = Scenario::start("wal::between_write_and_fsync");
    let order = s.target("w-stall-coordinator");
    // The coordinator's first write after its start (the epoch record) goes through; its next
    // batch (the target's records) stalls before the fsync.
    s.chaos.quiesce_and_restart(COORDINATOR, stalled_fsync(1));
    let mut options = s.chaos.workload_options();
    options.retry_window = Duration::ZERO;
    options.request_timeout = Duration::from_secs(8);
    options.concurrency = 1;
    let heard = s
        .chaos
        .run_orders(vec![order.clone()], options)
        .pop()
        .expect("one result");
    s.check(
        heard.outcome == ClientOutcome::Unknown,
        format!(
            "the coordinator's log is stalled before its fsync, so the client must hear \
             nothing; it heard {heard:?}"
        ),
    );
    // No phase two may have left: nothing applied anywhere.
    let urls = s.chaos.urls();
    for (name, base) in urls.participants() {
        let marker = order
            .marker_keys()
            .into_iter()
            .find(|(p, _)| *p == name)
            .map(|(_, k)| k)
            .expect("marker");
        let applied = s.chaos.runtime.block_on(async {
            s.chaos
                .client
                .get(format!("{base}/v1/kv/{marker}"))
                .send()
                .await
                .map(|r| r.status().is_success())
                .unwrap_or(false)
        });
        s.check(
            !applied,
            format!(
                "{name} applied {} before the coordinator's decision was durable",
                order.id
            ),
        );
    }
    // Power fails now: the unsynced batch is lost (torn), then the coordinator restarts.
    s.chaos.kill(COORDINATOR);
    let torn = disk::tear_last_record(&s.chaos.data_dir(COORDINATOR), 3);
    s.check(
        torn.is_some(),
        "the coordinator wrote no record to tear".into(),
    );
    s.chaos.restart(COORDINATOR, Vec::new());
    s.assert_aborted_and_released(&order);
    s.finish();
}

// ---------------------------------------------------------------- faults that are not crashes

fn checkpoint_failures(chaos: &ChaosCluster, participant: &str) -> u64 {
    let base = chaos
        .urls()
        .participants()
        .into_iter()
        .find(|(name, _)| *name == participant)
        .map(|(_, base)| base.to_string())
        .expect("a known participant");
    let text = chaos
        .runtime
        .block_on(async {
            chaos
                .client
                .get(format!("{base}/metrics"))
                .send()
                .await?
                .text()
                .await
        })
        .expect("participant metrics");
    text.lines()
        .find(|l| l.starts_with("twopc_participant_checkpoint_failures_total "))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no checkpoint failure counter in\n{text}"))
}

/// `participant::checkpoint_unencodable`: a participant whose checkpoints cannot be written
/// keeps serving; the failure is logged and counted, checkpoints are tried again later, nothing
/// acknowledged is lost, and after a restart (the fault gone) it recovers from its longer log.
#[test]
fn participant_checkpoint_unencodable() {
    let mut chaos = ChaosCluster::start(&ChaosOptions::default());
    chaos.restart(
        "inventory",
        vec![(
            "FAILPOINTS".to_string(),
            format!("{}=return", "participant::checkpoint_unencodable"),
        )],
    );
    // Forty records per checkpoint (ChaosOptions): 150 orders ask for several.
    let orders = chaos.orders("unencodable", 11, 150);
    let results = chaos.run_orders(orders, chaos.workload_options());
    assert!(
        results.iter().any(|r| r.answer.is_some()),
        "no order was answered"
    );
    assert!(
        chaos.node("inventory").is_running(),
        "inventory stopped over a failed checkpoint:\n{}",
        chaos.logs()
    );
    let failures = checkpoint_failures(&chaos, "inventory");
    assert!(
        failures > 0,
        "the fault point never fired:\n{}",
        chaos.node("inventory").log()
    );
    assert!(
        chaos
            .node("inventory")
            .log()
            .contains("checkpoint not written"),
        "the failure is not in the log"
    );
    // Restarted without the fault: it replays the whole log and checkpoints again.
    chaos.restart("inventory", Vec::new());
    let more = chaos.orders("after", 12, 60);
    chaos.run_orders(more, chaos.workload_options());
    assert_eq!(
        checkpoint_failures(&chaos, "inventory"),
        0,
        "counted from the restart"
    );
    let report = chaos.audit(Duration::from_secs(60));
    assert!(
        report.all_ok(),
        "invariants broken after failed checkpoints:\n{}\n{}",
        report.failures(),
        chaos.logs()
    );
}

/// A saga crash scenario (issue 13): arm `point` on `node`, run one saga of `fate` that reaches
/// it, restart `node` unarmed, and check that the saga resumes to `expected` with the saga
/// invariants (every step applied once, or every succeeded step undone once).
fn saga_scenario(
    point: &'static str,
    node: &str,
    id: &str,
    fate: saga_checkout::Fate,
    expected: &str,
) {
    let mut s = Scenario::start(point);
    s.arm(node);
    let urls = s.chaos.urls();
    let body = saga_checkout::request(id, 2, 30, fate, 60_000);
    let running = {
        let (client, urls) = (s.chaos.client.clone(), urls.clone());
        s.chaos.runtime.spawn(async move {
            saga_checkout::submit(&client, &urls, &body, Duration::from_secs(60)).await
        })
    };
    s.wait_crash(node);
    s.chaos.restart(node, Vec::new());
    let heard = s.chaos.runtime.block_on(running).ok().flatten();
    let (view, effects) = s.chaos.runtime.block_on(async {
        let view =
            saga_checkout::wait_terminal(&s.chaos.client, &urls, id, Duration::from_secs(60)).await;
        let effects = saga_checkout::effects(&s.chaos.client, &urls, id).await;
        (view, effects)
    });
    let view = view.unwrap_or_else(|e| panic!("[{point}] {e}\n{}", s.chaos.logs()));
    s.check(
        view["state"] == expected,
        format!("saga ended {view}, expected {expected} (client heard {heard:?})"),
    );
    let effects = effects.unwrap_or_else(|e| panic!("[{point}] {e}"));
    let verdict = saga_checkout::check(&view, effects, 2, 30);
    s.check(verdict.is_ok(), format!("saga invariant: {verdict:?}"));
    s.finish();
}

#[test]
fn coordinator_saga_before_outcome_logged() {
    // Reserve was applied at inventory; its outcome never reached the log. After the restart
    // the step is unknown, asked about under its op id (done), and the saga goes on.
    saga_scenario(
        "coordinator::saga_before_outcome_logged",
        COORDINATOR,
        "saga-before-outcome",
        saga_checkout::Fate::Complete,
        "completed",
    );
}

#[test]
fn coordinator_saga_after_outcome_logged() {
    saga_scenario(
        "coordinator::saga_after_outcome_logged",
        COORDINATOR,
        "saga-after-outcome",
        saga_checkout::Fate::Complete,
        "completed",
    );
}

#[test]
fn coordinator_saga_during_compensation() {
    // The charge is declined; reserve's compensation was applied but not logged. The restart
    // sends it again under the same op id: the barrier answers the first answer, no double undo.
    saga_scenario(
        "coordinator::saga_during_compensation",
        COORDINATOR,
        "saga-during-compensation",
        saga_checkout::Fate::Declined,
        "compensated",
    );
}

#[test]
fn participant_saga_after_action_applied() {
    saga_scenario(
        "participant::saga_after_action_applied",
        INVENTORY,
        "saga-participant-applied",
        saga_checkout::Fate::Complete,
        "completed",
    );
}

// Leases and fenced writes (docs/leases.md): a coordinator and a participant on their own, no
// checkout cluster.

/// An unanswered grant is held after the restart and its token never given again; killed
/// between two grants, the next token is still higher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_lease_logged_not_answered() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = coordinator(
        failpoints_binary(),
        dir.path(),
        Some("coordinator::lease_logged_not_answered"),
    );
    assert!(
        acquire(&c, "orders", "worker-a", 60_000).await.is_err(),
        "the process aborted before answering"
    );
    restart_disarmed(&mut c);
    // The unanswered grant is durable: it holds (a full TTL from the restart) and its token is
    // never handed out again.
    let (status, held) = send(c.http().get(format!("{}/v1/leases/orders", c.url())))
        .await
        .unwrap();
    assert_eq!(
        (status, held["holder"].as_str()),
        (200, Some("worker-a")),
        "{held}"
    );
    let logged = held["token"].as_u64().unwrap();
    let (status, other) = acquire(&c, "other", "worker-b", 1000).await.unwrap();
    assert_eq!(status, 200);
    let next = other["token"].as_u64().unwrap();
    assert!(next > logged, "token {next} after {logged}");

    // Killed between two grants (SIGKILL, no crash point): the next is still higher.
    c.kill();
    c.restart();
    blocking(|| c.wait_ready(Duration::from_secs(30))).unwrap();
    let (status, third) = acquire(&c, "third", "worker-c", 1000).await.unwrap();
    assert_eq!(status, 200);
    assert!(third["token"].as_u64().unwrap() > next, "{third}");
}

/// A fenced write logged but unanswered: the retry with its op id gets the same answer and
/// the write applies once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn participant_after_fenced_write_logged() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = participant(
        failpoints_binary(),
        dir.path(),
        Some("participant::after_fenced_write_logged"),
    );
    assert!(
        fenced_put(&p, "orders", "a", 7, "w-1").await.is_err(),
        "aborted before answering"
    );
    restart_disarmed(&mut p);
    let (status, answer) = fenced_put(&p, "orders", "a", 7, "w-1").await.unwrap();
    assert_eq!(
        (status, answer),
        (200, json!({"key": "orders", "version": 1, "token": 7}))
    );
    let (status, again) = fenced_put(&p, "orders", "a", 7, "w-1").await.unwrap();
    assert_eq!((status, again["version"].as_u64()), (200, Some(1)));
    let (_, stored) = send(p.http().get(format!("{}/v1/kv/orders", p.url())))
        .await
        .unwrap();
    assert_eq!(
        stored["version"].as_u64(),
        Some(1),
        "applied once: {stored}"
    );
    let (status, stale) = fenced_put(&p, "orders", "old", 6, "w-2").await.unwrap();
    assert_eq!(
        (status, stale["highest"].as_u64()),
        (409, Some(7)),
        "{stale}"
    );
}

/// An operator's fence reset logged but unanswered: after the restart the reset holds (the
/// fence reads as reset, with who and why), a repeat of the same reset is `fence_changed`
/// (the operator reads again and sees it done), and a write told `stale_token` before the
/// reset stays refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn participant_after_fence_reset_logged() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = participant(
        failpoints_binary(),
        dir.path(),
        Some("participant::after_fence_reset_logged"),
    );
    assert_eq!(
        fenced_put(&p, "orders", "x", 900, "forged")
            .await
            .unwrap()
            .0,
        200
    );
    let (status, stale) = fenced_put(&p, "orders", "y", 7, "w-1").await.unwrap();
    assert_eq!((status, stale["highest"].as_u64()), (409, Some(900)));
    let operator = p.http_as(protocol::auth::Kind::Operator);
    let url = format!("{}/v1/fences/orders-partition-3", p.url());
    let reset = json!({"from": 900, "to": 7, "operator": "alice", "reason": "never granted"});
    assert!(
        send(operator.post(format!("{url}/reset")).json(&reset))
            .await
            .is_err(),
        "aborted before answering"
    );
    restart_disarmed(&mut p);
    let (status, seen) = send(operator.get(&url)).await.unwrap();
    assert_eq!((status, seen["highest"].as_u64()), (200, Some(7)), "{seen}");
    assert_eq!(seen["resets"][0]["reason"], "never granted", "{seen}");
    let (status, again) = send(operator.post(format!("{url}/reset")).json(&reset))
        .await
        .unwrap();
    assert_eq!(
        (status, again["error"].as_str()),
        (409, Some("fence_changed"))
    );
    let (status, still) = fenced_put(&p, "orders", "y", 7, "w-1").await.unwrap();
    assert_eq!(
        (status, still["error"].as_str()),
        (409, Some("stale_token")),
        "told stale before the reset: {still}"
    );
    let (status, fresh) = fenced_put(&p, "orders", "z", 7, "w-2").await.unwrap();
    assert_eq!(status, 200, "{fresh}");
}

// The outbox (issue 29; docs/participants.md, "The outbox"): a participant on its own.

/// A checkout step with its next intents (`POST /v1/kv`), as the workflow worker sends it.
async fn outbox_write(
    p: &cluster::node::Node,
    op_id: &str,
    version: u64,
    event_ids: &[&str],
) -> Result<(u16, serde_json::Value), reqwest::Error> {
    let next: Vec<_> = event_ids
        .iter()
        .map(|id| {
            json!({"event_id": id, "aggregate": "checkout:c-1", "target": "payments",
                         "type": "payment.authorize.v1", "body": {"for": id}})
        })
        .collect();
    let body = json!({"op_id": op_id,
                      "ops": [{"op": "check", "key": "checkout:c-1", "version": version},
                              {"op": "put", "key": "checkout:c-1", "value": "stock_reserved"}],
                      "next": next});
    send(p.http().post(format!("{}/v1/kv", p.url())).json(&body)).await
}

async fn outbox_get(p: &cluster::node::Node, path: &str) -> (u16, serde_json::Value) {
    let relay = p.http_as(protocol::auth::Kind::Peer);
    send(relay.get(format!("{}{path}", p.url()))).await.unwrap()
}

/// A write with intents logged but unanswered: after the restart the write is applied once,
/// its intents pending in order, and the retry of its op id answers the same seqs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn participant_after_outbox_write_logged() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = participant(
        failpoints_binary(),
        dir.path(),
        Some("participant::after_outbox_write_logged"),
    );
    assert!(
        outbox_write(&p, "w-1", 0, &["e-1", "e-2"]).await.is_err(),
        "aborted before answering"
    );
    restart_disarmed(&mut p);
    let (status, open) = outbox_get(&p, "/v1/outbox?state=open").await;
    assert_eq!(status, 200, "{open}");
    let listed: Vec<_> = open["intents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["event_id"].clone(),
                e["seq"].clone(),
                e["state"].clone(),
                e["op_id"].clone(),
            )
        })
        .collect();
    assert_eq!(
        listed,
        [
            (json!("e-1"), json!(1), json!("pending"), json!("w-1")),
            (json!("e-2"), json!(2), json!("pending"), json!("w-1")),
        ],
        "{open}"
    );
    let (status, answer) = outbox_write(&p, "w-1", 0, &["e-1", "e-2"]).await.unwrap();
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer["intents"],
        json!([{"event_id": "e-1", "aggregate": "checkout:c-1", "seq": 1},
               {"event_id": "e-2", "aggregate": "checkout:c-1", "seq": 2}])
    );
    assert_eq!(
        answer["written"],
        json!([{"key": "checkout:c-1", "version": 1}])
    );
    let (_, stored) = send(p.http().get(format!("{}/v1/kv/checkout:c-1", p.url())))
        .await
        .unwrap();
    assert_eq!(
        stored["version"].as_u64(),
        Some(1),
        "applied once: {stored}"
    );
    let (_, open) = outbox_get(&p, "/v1/outbox").await;
    assert_eq!(
        open["intents"].as_array().map(Vec::len),
        Some(2),
        "recorded once: {open}"
    );
    let (status, later) = outbox_write(&p, "w-2", 1, &["e-3"]).await.unwrap();
    assert_eq!(
        (status, later["intents"][0]["seq"].as_u64()),
        (200, Some(3)),
        "{later}"
    );
}

/// A relay's delivered report logged but unanswered: after the restart the intent is
/// delivered with the answer reported, a repeat report answers it unchanged, and the next
/// intent of the aggregate may be delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn participant_after_intent_delivered_logged() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = participant(
        failpoints_binary(),
        dir.path(),
        Some("participant::after_intent_delivered_logged"),
    );
    let (status, written) = outbox_write(&p, "w-1", 0, &["e-1", "e-2"]).await.unwrap();
    assert_eq!(status, 200, "{written}");
    let relay = p.http_as(protocol::auth::Kind::Peer);
    let report = |answer: serde_json::Value| json!({ "answer": answer });
    let base = p.url();
    let url = |id: &str| format!("{base}/v1/outbox/{id}/delivered");
    assert!(
        send(
            relay
                .post(url("e-1"))
                .json(&report(json!({"authorization": "a-1"})))
        )
        .await
        .is_err(),
        "aborted before answering"
    );
    restart_disarmed(&mut p);
    let relay = p.http_as(protocol::auth::Kind::Peer);
    let (status, entry) = outbox_get(&p, "/v1/outbox/e-1").await;
    assert_eq!(
        (status, entry["state"].as_str(), &entry["answer"]),
        (200, Some("delivered"), &json!({"authorization": "a-1"})),
        "{entry}"
    );
    let (status, repeat) = send(relay.post(url("e-1")).json(&report(json!("other"))))
        .await
        .unwrap();
    let mut unchanged = entry.clone();
    unchanged.as_object_mut().unwrap().remove("age_ms");
    let mut repeat_entry = repeat.clone();
    repeat_entry.as_object_mut().unwrap().remove("age_ms");
    assert_eq!((status, repeat_entry), (200, unchanged), "the mark holds");
    let (status, next) = send(relay.post(url("e-2")).json(&report(json!(null))))
        .await
        .unwrap();
    assert_eq!(
        (status, next["state"].as_str()),
        (200, Some("delivered")),
        "{next}"
    );
}

// PostgreSQL participants (docs/postgres.md): the same crash points' meaning on a participant
// whose prepared state is PostgreSQL's. Two databases and a coordinator, real processes.
// Ignored by `cargo test --workspace` (they need PostgreSQL); `.ci/run` runs them with
// `cargo test -p twopc-chaos-tests --test crash_matrix pg_ -- --ignored`.
use chaos_tests::pg_rig as pg;
use cluster::pg_cluster::READY_TIMEOUT;

#[test]
#[ignore = "needs PostgreSQL; .ci/run runs it (TWOPC_POSTGRES_URL or initdb on PATH)"]
fn pg_participant_after_prepare_transaction() {
    let mut rig = pg::rig(
        cluster::postgres::PgServer::get(),
        Some(("bank_a", "participant::pg_after_prepare_transaction")),
    );
    let (status, heard) = rig.submit("pg-kill-prepared");
    assert_eq!(status, 200, "{heard}");
    assert_eq!(heard["outcome"], "aborted", "{heard}");
    assert!(
        rig.a.wait_exit(pg::SETTLE).is_some(),
        "bank_a did not reach its crash point"
    );
    // In doubt in PostgreSQL, its row lock held, while nobody resolves it.
    rig.coordinator.kill();
    assert_eq!(pg::prepared_gids(&rig.db_a).len(), 1, "{}", rig.logs());
    let locked = cluster::postgres::psql_url(
        &rig.db_a,
        "SELECT 1 FROM accounts WHERE id = 'a0' FOR UPDATE NOWAIT",
    );
    assert!(locked.is_err_and(|e| e.contains("could not obtain lock")));
    // Restarted with the coordinator down: it asks, gets no answer, and decides nothing alone.
    rig.a.set_env(Vec::new());
    rig.a.restart();
    rig.a.wait_ready(READY_TIMEOUT).unwrap();
    assert!(pg::eventually(pg::SETTLE, || pg::metric(
        &rig.a,
        "twopc_pg_decision_queries_total"
    ) >= 2.0));
    assert_eq!(
        pg::prepared_gids(&rig.db_a).len(),
        1,
        "resolved without the coordinator"
    );
    let (_, listed) = pg::get(rig.a.tokens(), &format!("{}/v1/prepared", rig.a.url()));
    assert_eq!(
        listed["prepared"][0]["txid"], "pg-kill-prepared",
        "{listed}"
    );
    // The coordinator comes back: the answer is abort, the prepared transaction rolls back.
    rig.coordinator.restart();
    rig.coordinator.wait_ready(READY_TIMEOUT).unwrap();
    assert!(
        pg::eventually(pg::SETTLE, || rig.settled()),
        "{}",
        rig.logs()
    );
    assert_eq!(rig.balances(), (100, 100));
    rig.conserved();
}

#[test]
#[ignore = "needs PostgreSQL; .ci/run runs it (TWOPC_POSTGRES_URL or initdb on PATH)"]
fn pg_participant_after_commit_prepared() {
    let mut rig = pg::rig(
        cluster::postgres::PgServer::get(),
        Some(("bank_a", "participant::pg_after_commit_prepared")),
    );
    let (status, heard) = rig.submit("pg-kill-committed");
    assert_eq!(status, 200, "{heard}");
    assert_eq!(heard["outcome"], "committed", "{heard}");
    assert!(
        rig.a.wait_exit(pg::SETTLE).is_some(),
        "bank_a did not reach its crash point"
    );
    assert!(!rig.all_acked("pg-kill-committed"));
    // Committed in PostgreSQL although never acked; the resend after the restart is acked
    // from the outcome row and applies nothing again.
    assert!(pg::prepared_gids(&rig.db_a).is_empty());
    rig.a.set_env(Vec::new());
    rig.a.restart();
    rig.a.wait_ready(READY_TIMEOUT).unwrap();
    assert!(
        pg::eventually(pg::SETTLE, || rig.all_acked("pg-kill-committed")),
        "{}",
        rig.logs()
    );
    assert!(pg::eventually(pg::SETTLE, || rig.settled()));
    assert_eq!(rig.balances(), (90, 110));
    rig.conserved();
}

#[test]
#[ignore = "needs PostgreSQL; .ci/run runs it (TWOPC_POSTGRES_URL or initdb on PATH)"]
fn pg_participant_after_rollback_prepared() {
    let mut rig = pg::rig(
        cluster::postgres::PgServer::get(),
        Some(("bank_a", "participant::pg_after_rollback_prepared")),
    );
    // bank_b's credit finds no account and votes no: bank_a's prepared debit is rolled back.
    let (status, heard) = pg::post(
        rig.coordinator.tokens(),
        &format!("{}/v1/transactions", rig.coordinator.url()),
        &cluster::pg_cluster::transfer("pg-kill-rolled-back", "bank_a", "a0", "bank_b", "zz", 10),
    );
    assert_eq!(status, 200, "{heard}");
    assert_eq!(heard["outcome"], "aborted", "{heard}");
    assert!(
        rig.a.wait_exit(pg::SETTLE).is_some(),
        "bank_a did not reach its crash point"
    );
    // Rolled back, no tombstone yet: nothing prepared, no outcome row (keyed by the gid
    // without its txid), and no intent row (the gid carries the txid).
    assert!(pg::prepared_gids(&rig.db_a).is_empty());
    let sql = |query: &str| cluster::postgres::psql_url(&rig.db_a, query).unwrap();
    let gtid = heard["gtid"]
        .as_str()
        .expect("the status names the attempt");
    let mut parts = gtid.rsplitn(3, ':');
    let (position, incarnation, coordinator) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
    );
    let epoch = sql(&format!(
        "SELECT epoch FROM twopc.pg_epochs WHERE coordinator_id = '{coordinator}'"
    ));
    let outcome =
        format!("SELECT outcome FROM twopc.pg_outcomes WHERE gid = 'twopc:bank_a:{gtid}'");
    assert_eq!(sql(&outcome), "");
    assert_eq!(sql("SELECT count(*) FROM twopc.pg_intents"), "0");
    let late_prepare = json!({"txid": "pg-kill-rolled-back", "gtid": gtid,
        "coordinator_id": coordinator, "epoch": epoch.parse::<u64>().unwrap(),
        "incarnation": incarnation, "position": position.parse::<u64>().unwrap(),
        "payload": {"ops": [{"statement": "debit", "params": ["a0", 10]}]}});
    // Restarted, the abort's resend finds nothing prepared and leaves the tombstone; a late
    // prepare of the attempt then votes no instead of preparing it again.
    rig.a.set_env(Vec::new());
    rig.a.restart();
    rig.a.wait_ready(READY_TIMEOUT).unwrap();
    assert!(
        pg::eventually(pg::SETTLE, || rig.all_acked("pg-kill-rolled-back")),
        "{}",
        rig.logs()
    );
    assert_eq!(sql(&outcome), "aborted");
    assert_eq!(sql("SELECT count(*) FROM twopc.pg_intents"), "0");
    let (status, late) = pg::post(
        rig.a.tokens(),
        &format!("{}/2pc/prepare", rig.a.url()),
        &late_prepare,
    );
    assert_eq!(status, 200, "{late}");
    assert_eq!(late["vote"], "no", "{late}");
    assert!(pg::prepared_gids(&rig.db_a).is_empty());
    assert_eq!(rig.balances(), (100, 100));
    rig.conserved();
}

#[test]
#[ignore = "needs PostgreSQL; .ci/run runs it (TWOPC_POSTGRES_URL or initdb on PATH)"]
fn pg_participant_after_outbox_write_committed() {
    use chaos_tests::pg_outbox::{
        CHECKOUT_STATEMENTS, CHECKOUTS_SQL, authorize, checkout, ids, intent, outbox_rows,
        start_pg_node,
    };
    // A local write (its statement and its intent) committed, the participant killed before
    // its answer: the retried op id answers the same, with one intent (docs/postgres.md).
    let mut o = start_pg_node(
        "outbox_crash",
        CHECKOUT_STATEMENTS,
        CHECKOUTS_SQL,
        pg::failpoint("participant::pg_after_outbox_write_committed"),
        |_| Vec::new(),
    );
    let request = authorize("op-1", "c-1", 3, vec![intent("evt-1", "checkout:c-1")]);
    let (status, _) = o.write(request.clone());
    assert_eq!(status, 0, "the participant answered instead of crashing");
    assert!(
        o.node
            .wait_exit(std::time::Duration::from_secs(60))
            .is_some(),
        "{}",
        o.node.log()
    );
    // Committed before the crash: the state and its intent, together.
    assert_eq!(checkout(&o.db, "c-1"), "payment_pending:4");
    assert_eq!(outbox_rows(&o.db), "evt-1#1");
    o.node.set_env(Vec::new());
    o.node.restart();
    o.node.wait_ready(READY_TIMEOUT).unwrap();
    let (status, answer) = o.write(request);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer,
        serde_json::json!({"op_id": "op-1", "rows": 1, "returned": [{"version": 4}],
               "intents": [{"event_id": "evt-1", "aggregate": "checkout:c-1", "seq": 1}]})
    );
    assert_eq!(checkout(&o.db, "c-1"), "payment_pending:4");
    assert_eq!(outbox_rows(&o.db), "evt-1#1", "one intent, not two");
    assert_eq!(ids(&o.list("?state=open")), ["evt-1#1"]);
}
