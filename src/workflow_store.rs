//! Where the checkout workflow's state lives, for `twopc workflow-worker` and the demo's audit:
//! the reference KV participant (`checkout:<id>` keys, `POST /v1/kv`) or a PostgreSQL
//! participant (the `cluster::pg_workflow` statements, `POST /v1/pg/write`). Both serve the
//! same outbox routes, so the payment evidence is read the same way.
//!
//! It reads and sends what the planner decided; it never decides a transition itself.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, bail};
use cluster::pg_workflow;
use cluster::workflow::{self, Checkout, Evidence, Transition};
use protocol::lease::FenceClaim;
use protocol::outbox::OutboxEntry;
use serde_json::{Value, json};

/// How a transition's write ended.
pub enum Outcome {
    Moved,
    /// A newer token holds the resource (`highest`, when known), and how the participant
    /// said so (`stale_token`).
    Stale(Value, &'static str),
    /// The checkout moved on (or its intent is already recorded): nothing changed.
    Conflict(Value),
    Failed(u16, Value),
}

#[derive(Debug, Clone)]
pub enum Store {
    Kv(String),
    Pg(String),
}

pub(crate) async fn call(
    request: reqwest::RequestBuilder,
    what: &str,
) -> anyhow::Result<(u16, Value)> {
    let response = request.send().await.with_context(|| what.to_string())?;
    let (status, bytes) = net::outbound::read_answer(response, crate::client::ANSWER_BYTES_MAX)
        .await
        .with_context(|| what.to_string())?;
    Ok((
        status.as_u16(),
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    ))
}

/// PostgreSQL reads go through the local write route (a SELECT statement, no intent): each
/// needs an op id of its own.
fn read_op_id(what: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "read-{what}-{}-{nanos}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

impl Store {
    pub fn new(backend: &str, base: String) -> Store {
        if backend == "postgres" {
            Store::Pg(base)
        } else {
            Store::Kv(base)
        }
    }

    /// The participant's base URL.
    pub fn url(&self) -> &str {
        self.base()
    }

    fn base(&self) -> &str {
        match self {
            Store::Kv(base) | Store::Pg(base) => base,
        }
    }

    async fn select(
        &self,
        client: &reqwest::Client,
        statement: &str,
        params: Vec<Value>,
    ) -> anyhow::Result<Vec<Value>> {
        let body =
            json!({"op_id": read_op_id(statement), "statement": statement, "params": params});
        let url = format!("{}{}", self.base(), protocol::routes::PG_WRITE);
        let (status, answer) = call(client.post(url).json(&body), statement).await?;
        if status != 200 {
            bail!("{statement} answered {status}: {answer}");
        }
        Ok(answer["returned"].as_array().cloned().unwrap_or_default())
    }

    /// Every checkout with its version, in index order.
    pub async fn checkouts(
        &self,
        client: &reqwest::Client,
    ) -> anyhow::Result<Vec<(String, Checkout, u64)>> {
        match self {
            Store::Pg(_) => Ok(self
                .select(client, "checkouts", Vec::new())
                .await?
                .iter()
                .filter_map(pg_workflow::checkout_of)
                .collect()),
            Store::Kv(base) => {
                let url = format!("{base}/v1/kv/{}", workflow::INDEX_KEY);
                let (status, index) = call(client.get(url), "read the index").await?;
                if status != 200 {
                    bail!("the index answered {status}: {index}");
                }
                let ids: Vec<String> = serde_json::from_value(index["value"].clone())
                    .context("the index is not a list of ids")?;
                let mut all = Vec::new();
                for id in ids {
                    let url = format!("{base}/v1/kv/{}", workflow::checkout_key(&id));
                    let (status, entry) = call(client.get(url), "read a checkout").await?;
                    if status != 200 {
                        bail!("checkout {id} answered {status}: {entry}");
                    }
                    let checkout = serde_json::from_value(entry["value"].clone())
                        .with_context(|| format!("checkout {id} is not a checkout"))?;
                    all.push((id, checkout, entry["version"].as_u64().unwrap_or(0)));
                }
                Ok(all)
            }
        }
    }

    /// Units left per sku.
    pub async fn stock(
        &self,
        client: &reqwest::Client,
        skus: &[String],
    ) -> anyhow::Result<BTreeMap<String, i64>> {
        let mut left = BTreeMap::new();
        match self {
            Store::Pg(_) => {
                for row in self.select(client, "stock", Vec::new()).await? {
                    if let (Some(sku), Some(n)) = (row["sku"].as_str(), row["n"].as_i64()) {
                        left.insert(sku.to_string(), n);
                    }
                }
            }
            Store::Kv(base) => {
                for sku in skus {
                    let url = format!("{base}/v1/kv/{}", workflow::stock_key(sku));
                    let (_, entry) = call(client.get(url), "read stock").await?;
                    if let Some(n) = entry["value"].as_i64() {
                        left.insert(sku.clone(), n);
                    }
                }
            }
        }
        Ok(left)
    }

    /// The payment intent's outbox entry as evidence (unreadable counts as missing, which the
    /// planner never moves on).
    pub async fn evidence(&self, client: &reqwest::Client, id: &str) -> Evidence {
        let url = format!(
            "{}/v1/outbox/{}",
            self.base(),
            workflow::payment_event_id(id)
        );
        match call(client.get(url), "read the outbox").await {
            Ok((200, entry)) => serde_json::from_value::<OutboxEntry>(entry)
                .map_or(Evidence::Missing, |e| Evidence::of(&e)),
            _ => Evidence::Missing,
        }
    }

    /// Writes one planned transition under `fence`.
    pub async fn transition(
        &self,
        client: &reqwest::Client,
        id: &str,
        checkout: &Checkout,
        version: u64,
        transition: &Transition,
        fence: &FenceClaim,
    ) -> anyhow::Result<Outcome> {
        let (status, answer) = match self {
            Store::Kv(base) => {
                let request = workflow::write(id, checkout, version, transition, fence.clone());
                let url = format!("{base}{}", protocol::routes::KV_WRITE);
                call(client.post(url).json(&request), "write").await?
            }
            Store::Pg(base) => {
                let request = pg_workflow::write(id, checkout, version, transition, fence.clone());
                let url = format!("{base}{}", protocol::routes::PG_WRITE);
                call(client.post(url).json(&request), "write").await?
            }
        };
        let error = answer["error"].as_str().unwrap_or("");
        Ok(match (status, error) {
            (200, _) => Outcome::Moved,
            (409, "stale_token") => Outcome::Stale(answer["highest"].clone(), "stale_token"),
            (409, "condition_failed" | "id_conflict") => Outcome::Conflict(answer),
            _ => Outcome::Failed(status, answer),
        })
    }
}
