//! Crash tests of PostgreSQL participants with real processes and a real PostgreSQL
//! (docs/postgres.md, docs/recovery.md): the coordinator killed after its decision, and
//! PostgreSQL itself crashed (`pg_ctl restart -m immediate`) while transactions are prepared.
//! The participant crash points are in `crash_matrix.rs` (`pg_participant_*`). Every transfer
//! moves money between two databases, so the sum over both must never change. Ignored by
//! `cargo test --workspace` (they need PostgreSQL); `.ci/run` runs them with `-- --ignored`.

use chaos_tests::pg_rig::{SETTLE, eventually, prepared_gids, rig};
use cluster::pg_cluster::READY_TIMEOUT;
use cluster::postgres::PgServer;

#[test]
#[ignore = "needs PostgreSQL; .ci/run runs it (TWOPC_POSTGRES_URL or initdb on PATH)"]
fn coordinator_killed_after_the_decision_commits_on_recovery() {
    let mut rig = rig(
        PgServer::get(),
        Some(("coordinator", "coordinator::after_decision_durable")),
    );
    let (_, heard) = rig.submit("pg-kill-coordinator");
    assert_ne!(heard["outcome"], "aborted", "{heard}");
    assert!(
        rig.coordinator.wait_exit(SETTLE).is_some(),
        "the coordinator did not crash"
    );
    // Both prepared, nothing sent.
    assert_eq!(prepared_gids(&rig.db_a).len(), 1);
    assert_eq!(prepared_gids(&rig.db_b).len(), 1);
    assert_eq!(rig.balances(), (100, 100));
    rig.coordinator.set_env(Vec::new());
    rig.coordinator.restart();
    rig.coordinator.wait_ready(READY_TIMEOUT).unwrap();
    assert!(eventually(SETTLE, || rig.settled()), "{}", rig.logs());
    assert!(eventually(SETTLE, || rig.all_acked("pg-kill-coordinator")));
    assert_eq!(rig.balances(), (90, 110));
    rig.conserved();
}

#[test]
#[ignore = "needs PostgreSQL; .ci/run runs it (TWOPC_POSTGRES_URL or initdb on PATH)"]
fn postgres_crash_restart_keeps_prepared_transactions_and_they_resolve() {
    let server = PgServer::throwaway(&[("max_prepared_transactions", "64")])
        .unwrap_or_else(|e| panic!("{}\n({e})", cluster::postgres::INSTALL_HINT));
    let mut rig = rig(
        server,
        Some(("coordinator", "coordinator::after_decision_durable")),
    );
    let (_, heard) = rig.submit("pg-restart");
    assert_ne!(heard["outcome"], "aborted", "{heard}");
    assert!(
        rig.coordinator.wait_exit(SETTLE).is_some(),
        "the coordinator did not crash"
    );
    assert_eq!(
        prepared_gids(&rig.db_a).len() + prepared_gids(&rig.db_b).len(),
        2
    );
    // PostgreSQL crashes and recovers from its WAL: the prepared transactions survive.
    rig._server.restart_immediate().unwrap();
    assert_eq!(
        prepared_gids(&rig.db_a).len() + prepared_gids(&rig.db_b).len(),
        2
    );
    // The participants' sessions died with the server; they reconnect and commit.
    rig.coordinator.set_env(Vec::new());
    rig.coordinator.restart();
    rig.coordinator.wait_ready(READY_TIMEOUT).unwrap();
    assert!(eventually(SETTLE, || rig.settled()), "{}", rig.logs());
    assert!(eventually(SETTLE, || rig.all_acked("pg-restart")));
    assert_eq!(rig.balances(), (90, 110));
    rig.conserved();
    // And the participants keep working.
    let (_, next) = rig.submit("pg-after-restart");
    assert_eq!(next["outcome"], "committed", "{next}");
    assert_eq!(rig.balances(), (80, 120));
    rig.conserved();
}
