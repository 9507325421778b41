//! The checkout as a saga (issue 13) and its invariant oracle, for real clusters: reserve at
//! inventory, charge at payments, ship at shipping, each with its compensation. Each saga
//! writes only its own counters (`saga-stock:{id}`, `saga-charge:{id}`, `saga-ship:{id}`), so
//! "applied once" and "undone once" are exact numbers, and the 2PC checkout's ledgers are
//! untouched.
//!
//! Invariants (checked by [`check`]): a saga ends `completed` with every step applied once, or
//! `compensated` with every succeeded step undone once and nothing else, or `needs_attention`
//! with a reason.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::checkout::{INVENTORY, PAYMENTS, SHIPPING};
use crate::oracle::ClusterUrls;

/// How one saga is made to end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Every step succeeds.
    Complete,
    /// The charge is declined (a definite failure): reserve is compensated.
    Declined,
    /// The last step has no compensation and fails after a pivot: needs a human.
    FailAfterPivot,
}

/// A saga checkout request: `quantity` units reserved, `amount` charged, one shipment.
pub fn request(id: &str, quantity: i64, amount: i64, fate: Fate, timeout_ms: u64) -> Value {
    let add = |key: String, delta: i64| json!({"ops": [{"op": "add", "key": key, "delta": delta}]});
    let mut charge = add(format!("saga-charge:{id}"), amount);
    if fate == Fate::Declined {
        // A check that cannot pass: a definite business failure, nothing applied.
        if let Some(ops) = charge["ops"].as_array_mut() {
            ops.push(json!({"op": "check", "key": format!("saga-declined:{id}"), "version": 99}));
        }
    }
    let ship_key = format!("saga-ship:{id}");
    let mut ship = json!({"name": "ship", "participant": SHIPPING,
        "action": {"ops": [{"op": "put", "key": ship_key, "value": true}]},
        "compensation": {"ops": [{"op": "delete", "key": ship_key}]}});
    let mut steps = vec![
        json!({"name": "reserve", "participant": INVENTORY,
            "action": add(format!("saga-stock:{id}"), quantity),
            "compensation": add(format!("saga-stock:{id}"), -quantity)}),
        json!({"name": "charge", "participant": PAYMENTS, "action": charge,
            "compensation": add(format!("saga-charge:{id}"), -amount)}),
    ];
    if fate == Fate::FailAfterPivot {
        // The charge cannot be undone here (a pivot), and shipping then fails.
        steps[1]["compensation"] = Value::Null;
        if let Some(ops) = ship["action"]["ops"].as_array_mut() {
            ops.push(json!({"op": "check", "key": format!("saga-declined:{id}"), "version": 99}));
        }
    }
    steps.push(ship);
    json!({"id": id, "steps": steps, "timeout_ms": timeout_ms})
}

/// What the participants hold for one saga.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Effects {
    pub reserved: i64,
    pub charged: i64,
    pub shipped: bool,
}

async fn int_at(client: &reqwest::Client, base: &str, key: &str) -> Result<Option<Value>, String> {
    let response = client
        .get(format!("{base}/v1/kv/{key}"))
        .send()
        .await
        .map_err(|e| format!("{base}: {e}"))?;
    if response.status() == 404 {
        return Ok(None);
    }
    let body: Value = response.json().await.map_err(|e| e.to_string())?;
    Ok(Some(body["value"].clone()))
}

pub async fn effects(
    client: &reqwest::Client,
    urls: &ClusterUrls,
    id: &str,
) -> Result<Effects, String> {
    let n = |v: Option<Value>| v.and_then(|v| v.as_i64()).unwrap_or(0);
    Ok(Effects {
        reserved: n(int_at(client, &urls.inventory, &format!("saga-stock:{id}")).await?),
        charged: n(int_at(client, &urls.payments, &format!("saga-charge:{id}")).await?),
        shipped: int_at(client, &urls.shipping, &format!("saga-ship:{id}"))
            .await?
            .is_some(),
    })
}

/// `POST /v1/sagas` once; `None` when no answer came (the coordinator died, a timeout).
pub async fn submit(
    client: &reqwest::Client,
    urls: &ClusterUrls,
    body: &Value,
    wait: Duration,
) -> Option<(u16, Value)> {
    let response = client
        .post(format!("{}/v1/sagas", urls.coordinator))
        .json(body)
        .timeout(wait)
        .send()
        .await
        .ok()?;
    let status = response.status().as_u16();
    Some((status, response.json().await.ok()?))
}

/// Polls `GET /v1/sagas/{id}` until the saga is terminal (or `timeout`: the last view, or an
/// error naming what was seen).
pub async fn wait_terminal(
    client: &reqwest::Client,
    urls: &ClusterUrls,
    id: &str,
    timeout: Duration,
) -> Result<Value, String> {
    let start = Instant::now();
    let mut last = String::from("no answer");
    while start.elapsed() < timeout {
        if let Ok(response) = client
            .get(format!("{}/v1/sagas/{id}", urls.coordinator))
            .send()
            .await
            && let Ok(view) = response.json::<Value>().await
        {
            if matches!(
                view["state"].as_str(),
                Some("completed" | "compensated" | "needs_attention")
            ) {
                return Ok(view);
            }
            last = view.to_string();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!("saga {id} not terminal after {timeout:?}: {last}"))
}

/// The saga invariants for one terminal view and what the participants hold.
pub fn check(view: &Value, effects: Effects, quantity: i64, amount: i64) -> Result<(), String> {
    let statuses: Vec<&str> = view["steps"]
        .as_array()
        .map(|s| s.iter().filter_map(|s| s["status"].as_str()).collect())
        .unwrap_or_default();
    let fail = |why: &str| Err(format!("{why}: {view} with {effects:?}"));
    match view["state"].as_str() {
        Some("completed") => {
            if statuses.iter().any(|s| *s != "succeeded") {
                return fail("completed with a step not succeeded");
            }
            if effects
                != (Effects {
                    reserved: quantity,
                    charged: amount,
                    shipped: true,
                })
            {
                return fail("completed, but not every step applied exactly once");
            }
        }
        Some("compensated") => {
            if statuses.iter().any(|s| {
                matches!(
                    *s,
                    "succeeded" | "running" | "unknown" | "compensating" | "compensation_failing"
                )
            }) {
                return fail("compensated with a step not undone or not settled");
            }
            if effects
                != (Effects {
                    reserved: 0,
                    charged: 0,
                    shipped: false,
                })
            {
                return fail("compensated, but an effect is left (or was undone twice)");
            }
        }
        Some("needs_attention") => {
            if view["reason"].as_str().is_none_or(str::is_empty) {
                return fail("needs_attention without a reason");
            }
            if effects.reserved != quantity || effects.charged != amount || effects.shipped {
                return fail("needs_attention, but something was compensated or applied twice");
            }
        }
        _ => return fail("not terminal"),
    }
    Ok(())
}
