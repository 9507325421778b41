//! Sagas on real processes (issue 13): the coordinator and the three reference KV participants
//! behind fault proxies. Every saga is checked by the saga oracle (`saga_checkout::check`):
//! completed with every step applied once, compensated with every succeeded step undone once,
//! or needs_attention with a reason.

use std::time::Duration;

use chaos_tests::scenario::{COORDINATOR, ChaosCluster, ChaosOptions};
use cluster::checkout::PAYMENTS;
use cluster::saga_checkout::{self, Fate};

const WAIT: Duration = Duration::from_secs(60);

fn run_and_check(chaos: &ChaosCluster, id: &str, fate: Fate, timeout_ms: u64) -> serde_json::Value {
    let urls = chaos.urls();
    let body = saga_checkout::request(id, 2, 30, fate, timeout_ms);
    chaos.runtime.block_on(async {
        let _ = saga_checkout::submit(&chaos.client, &urls, &body, WAIT).await;
        let view = saga_checkout::wait_terminal(&chaos.client, &urls, id, WAIT)
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", chaos.logs()));
        let effects = saga_checkout::effects(&chaos.client, &urls, id)
            .await
            .unwrap();
        saga_checkout::check(&view, effects, 2, 30)
            .unwrap_or_else(|e| panic!("{e}\n{}", chaos.logs()));
        view
    })
}

#[test]
fn each_fate_ends_in_its_state_with_the_invariants_and_retries_are_idempotent() {
    let chaos = ChaosCluster::start(&ChaosOptions::default());
    let done = run_and_check(&chaos, "s-ok", Fate::Complete, 30_000);
    assert_eq!(done["state"], "completed");
    let declined = run_and_check(&chaos, "s-declined", Fate::Declined, 30_000);
    assert_eq!(declined["state"], "compensated");
    assert_eq!(declined["steps"][0]["status"], "compensated");
    assert_eq!(declined["steps"][1]["status"], "failed");
    let pivot = run_and_check(&chaos, "s-pivot", Fate::FailAfterPivot, 30_000);
    assert_eq!(pivot["state"], "needs_attention");
    // The same body again is the recorded saga; another body is 409.
    let urls = chaos.urls();
    chaos.runtime.block_on(async {
        let same = saga_checkout::request("s-ok", 2, 30, Fate::Complete, 30_000);
        let (status, again) = saga_checkout::submit(&chaos.client, &urls, &same, WAIT)
            .await
            .unwrap();
        assert_eq!((status, &again["steps"]), (200, &done["steps"]));
        let other = saga_checkout::request("s-ok", 3, 30, Fate::Complete, 30_000);
        let (status, _) = saga_checkout::submit(&chaos.client, &urls, &other, WAIT)
            .await
            .unwrap();
        assert_eq!(status, 409);
        let list: serde_json::Value = chaos
            .client
            .get(format!("{}/v1/sagas", urls.coordinator))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(
            list["sagas"][0]["state"], "needs_attention",
            "stuck sagas first: {list}"
        );
    });
}

#[test]
fn a_partitioned_step_is_unknown_then_reconciled_and_the_timeout_compensates() {
    let chaos = ChaosCluster::start(&ChaosOptions::default());
    chaos.proxy(PAYMENTS).partition();
    let urls = chaos.urls();
    let body = saga_checkout::request("s-cut", 2, 30, Fate::Complete, 3000);
    let handle = {
        let client = chaos.client.clone();
        let urls = urls.clone();
        chaos
            .runtime
            .spawn(async move { saga_checkout::submit(&client, &urls, &body, WAIT).await })
    };
    // While the link is cut the charge is unknown, never declined, never compensated.
    let seen = chaos.runtime.block_on(async {
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let view: serde_json::Value = chaos
                .client
                .get(format!("{}/v1/sagas/s-cut", urls.coordinator))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            if view["steps"][1]["status"] == "unknown" {
                return view;
            }
        }
        panic!("the charge never became unknown\n{}", chaos.logs());
    });
    assert!(seen["steps"][1]["last_error"].is_string(), "{seen}");
    assert_ne!(seen["state"], "compensated");
    // Past the saga's deadline: compensation starts, but waits for evidence about the charge.
    std::thread::sleep(Duration::from_millis(3500));
    let waiting: serde_json::Value = chaos.runtime.block_on(async {
        let url = format!("{}/v1/sagas/s-cut", urls.coordinator);
        chaos
            .client
            .get(url)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    });
    assert_eq!(waiting["state"], "compensating", "{waiting}");
    assert_eq!(
        waiting["steps"][0]["status"], "succeeded",
        "reserve waits for the charge: {waiting}"
    );
    chaos.proxy(PAYMENTS).heal();
    let heard = chaos.runtime.block_on(handle).unwrap();
    let view = chaos.runtime.block_on(async {
        let view = saga_checkout::wait_terminal(&chaos.client, &urls, "s-cut", WAIT)
            .await
            .unwrap();
        let effects = saga_checkout::effects(&chaos.client, &urls, "s-cut")
            .await
            .unwrap();
        saga_checkout::check(&view, effects, 2, 30)
            .unwrap_or_else(|e| panic!("{e}\n{}", chaos.logs()));
        view
    });
    assert_eq!(
        view["state"], "compensated",
        "{view} (client heard {heard:?})"
    );
}

#[test]
fn a_coordinator_killed_under_concurrent_sagas_resumes_them_all() {
    let mut chaos = ChaosCluster::start(&ChaosOptions::default());
    let urls = chaos.urls();
    let fates = [
        Fate::Complete,
        Fate::Declined,
        Fate::Complete,
        Fate::FailAfterPivot,
    ];
    let ids: Vec<(String, Fate)> = (0..16)
        .map(|i| (format!("s-many-{i}"), fates[i % fates.len()]))
        .collect();
    let handles: Vec<_> = ids
        .iter()
        .map(|(id, fate)| {
            let (client, urls) = (chaos.client.clone(), urls.clone());
            let body = saga_checkout::request(id, 2, 30, *fate, 30_000);
            chaos
                .runtime
                .spawn(async move { saga_checkout::submit(&client, &urls, &body, WAIT).await })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(150));
    chaos.kill(COORDINATOR);
    for handle in handles {
        let _ = chaos.runtime.block_on(handle);
    }
    chaos.restart(COORDINATOR, Vec::new());
    let mut states = std::collections::BTreeMap::new();
    for (id, _) in &ids {
        let urls = chaos.urls();
        // A saga whose Begin never became durable is unknown to the restarted coordinator: its
        // client heard nothing and nothing may have been applied.
        let exists = chaos.runtime.block_on(async {
            chaos
                .client
                .get(format!("{}/v1/sagas/{id}", urls.coordinator))
                .send()
                .await
                .unwrap()
                .status()
                != 404
        });
        if !exists {
            let effects = chaos
                .runtime
                .block_on(saga_checkout::effects(&chaos.client, &urls, id))
                .unwrap();
            assert_eq!(
                effects,
                saga_checkout::Effects {
                    reserved: 0,
                    charged: 0,
                    shipped: false
                },
                "{id}"
            );
            *states.entry("never began".to_string()).or_insert(0) += 1;
            continue;
        }
        let view = chaos.runtime.block_on(async {
            let view = saga_checkout::wait_terminal(&chaos.client, &urls, id, WAIT)
                .await
                .unwrap();
            let effects = saga_checkout::effects(&chaos.client, &urls, id)
                .await
                .unwrap();
            saga_checkout::check(&view, effects, 2, 30)
                .unwrap_or_else(|e| panic!("{e}\n{}", chaos.logs()));
            view
        });
        *states
            .entry(view["state"].as_str().unwrap().to_string())
            .or_insert(0) += 1;
    }
    eprintln!("after the crash: {states:?}");
    assert_eq!(states.values().sum::<i32>(), 16);
}
