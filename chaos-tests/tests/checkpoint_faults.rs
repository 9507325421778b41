//! A participant whose checkpoints cannot be written keeps serving: the failure is logged and
//! counted, checkpoints are tried again later, nothing acknowledged is lost, and after a
//! restart (with the fault gone) it recovers everything from its longer log.

use std::time::Duration;

use chaos_tests::scenario::{ChaosCluster, ChaosOptions};

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

#[test]
fn a_participant_whose_checkpoints_fail_keeps_serving_and_loses_nothing() {
    let mut chaos = ChaosCluster::start(&ChaosOptions::default());
    chaos.restart(
        "inventory",
        vec![(
            "FAILPOINTS".to_string(),
            "participant::checkpoint_unencodable=return".to_string(),
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
    assert!(failures > 0, "the fault point never fired");
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
