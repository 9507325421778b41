//! The oracle's only I/O: reading participants and the coordinator through their public HTTP
//! APIs (`/v1/kv/{key}`, `/v1/prepared`, `/v1/transactions/{id}`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use protocol::TransactionStatus;
use protocol::kv::{KvEntry, PreparedList};
use serde::Deserialize;

use crate::checkout::{
    CheckoutConfig, Order, balance_key, payment_key, sold_key, spent_key, stock_key,
};

use super::{ClientOutcome, ClusterUrls, Ledger, Observation, OrderObservation, Totals};

/// Failure to read the cluster at all (as opposed to a broken invariant).
#[derive(Debug, thiserror::Error)]
#[error("reading {url}: {reason}")]
pub struct ReadError {
    pub url: String,
    pub reason: String,
}

/// GET and decode; `None` on 404.
pub async fn get_json<T: for<'de> Deserialize<'de>>(
    client: &reqwest::Client,
    url: String,
) -> Result<Option<T>, ReadError> {
    let fail = |reason: String| ReadError {
        url: url.clone(),
        reason,
    };
    let response = client
        .get(&url)
        .send()
        .await
        .map_err(|e| fail(e.to_string()))?;
    if response.status() == reqwest::StatusCode::NOT_FOUND {
        return Ok(None);
    }
    if !response.status().is_success() {
        return Err(fail(format!("status {}", response.status())));
    }
    response
        .json::<T>()
        .await
        .map(Some)
        .map_err(|e| fail(e.to_string()))
}

/// The committed value of a counter key (absent = 0).
pub async fn counter(client: &reqwest::Client, base: &str, key: &str) -> Result<i64, ReadError> {
    let entry: Option<KvEntry> = get_json(client, format!("{base}/v1/kv/{key}")).await?;
    Ok(entry.and_then(|e| e.value.as_i64()).unwrap_or(0))
}

/// Whether a key has a committed value.
pub async fn exists(client: &reqwest::Client, base: &str, key: &str) -> Result<bool, ReadError> {
    let entry: Option<KvEntry> = get_json(client, format!("{base}/v1/kv/{key}")).await?;
    Ok(entry.is_some())
}

/// The coordinator's record of one transaction (`None`: it has none).
pub async fn transaction(
    client: &reqwest::Client,
    coordinator: &str,
    id: &str,
) -> Result<Option<TransactionStatus>, ReadError> {
    get_json(client, format!("{coordinator}/v1/transactions/{id}")).await
}

/// Sums the ledger counters.
pub async fn read_totals(
    client: &reqwest::Client,
    urls: &ClusterUrls,
    config: &CheckoutConfig,
) -> Result<Totals, ReadError> {
    let mut spent = 0;
    for customer in 0..config.customers {
        spent += counter(client, &urls.payments, &spent_key(customer)).await?;
    }
    Ok(Totals {
        sold: read_sold(client, urls, config).await?,
        spent,
    })
}

/// The units sold over all products (inventory's half of [`Totals`]).
pub async fn read_sold(
    client: &reqwest::Client,
    urls: &ClusterUrls,
    config: &CheckoutConfig,
) -> Result<i64, ReadError> {
    let mut sold = 0;
    for sku in 0..config.skus {
        sold += counter(client, &urls.inventory, &sold_key(sku)).await?;
    }
    Ok(sold)
}

/// What payments holds, read after the run settled: every customer's balance and spent, and
/// the orders applied there. Read from its KV API here, or from its database when payments is
/// a PostgreSQL participant (`twopc demo --backend postgres`).
#[derive(Debug, Clone, Default)]
pub struct PaymentsLedger {
    pub money: Vec<Ledger>,
    /// Ids of the orders whose payment marker exists.
    pub paid: BTreeSet<String>,
}

async fn read_kv_payments(
    client: &reqwest::Client,
    urls: &ClusterUrls,
    config: &CheckoutConfig,
    observed: &[(Order, ClientOutcome)],
) -> Result<PaymentsLedger, ReadError> {
    let mut ledger = PaymentsLedger::default();
    for (order, _) in observed {
        if exists(client, &urls.payments, &payment_key(&order.id)).await? {
            ledger.paid.insert(order.id.clone());
        }
    }
    for customer in 0..config.customers {
        ledger.money.push(Ledger {
            id: customer,
            left: counter(client, &urls.payments, &balance_key(customer)).await?,
            moved: counter(client, &urls.payments, &spent_key(customer)).await?,
        });
    }
    Ok(ledger)
}

/// Waits until no participant holds a prepared transaction, or `timeout` passes. Returns what is
/// still prepared, by participant.
pub async fn wait_no_prepared(
    client: &reqwest::Client,
    urls: &ClusterUrls,
    timeout: Duration,
) -> Result<BTreeMap<&'static str, usize>, ReadError> {
    let deadline = Instant::now() + timeout;
    loop {
        let mut left = BTreeMap::new();
        for (name, base) in urls.participants() {
            let list: Option<PreparedList> =
                get_json(client, format!("{base}/v1/prepared")).await?;
            let count = list.map_or(0, |l| l.prepared.len());
            if count > 0 {
                left.insert(name, count);
            }
        }
        if left.is_empty() || Instant::now() >= deadline {
            return Ok(left);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits up to `settle` for prepared transactions to resolve, then reads everything the checks
/// need.
pub async fn observe(
    client: &reqwest::Client,
    urls: &ClusterUrls,
    config: &CheckoutConfig,
    before: Totals,
    observed: &[(Order, ClientOutcome)],
    settle: Duration,
) -> Result<Observation, ReadError> {
    let prepared_left = wait_no_prepared(client, urls, settle).await?;
    let payments = read_kv_payments(client, urls, config, observed).await?;
    observe_settled(
        client,
        urls,
        config,
        before,
        observed,
        settle,
        prepared_left,
        payments,
    )
    .await
}

/// [`observe`] after [`wait_no_prepared`] gave `prepared_left`, with payments' data already
/// read as `payments`; inventory, shipping and the coordinator are read through their APIs.
#[allow(clippy::too_many_arguments)]
pub async fn observe_settled(
    client: &reqwest::Client,
    urls: &ClusterUrls,
    config: &CheckoutConfig,
    before: Totals,
    observed: &[(Order, ClientOutcome)],
    settle: Duration,
    prepared_left: BTreeMap<&'static str, usize>,
    payments: PaymentsLedger,
) -> Result<Observation, ReadError> {
    // What each participant still holds in doubt, by client id, read once after the settle.
    let mut in_doubt: [BTreeSet<String>; 3] = Default::default();
    for (held, (_, base)) in in_doubt.iter_mut().zip(urls.participants()) {
        let list: Option<PreparedList> = get_json(client, format!("{base}/v1/prepared")).await?;
        held.extend(
            list.into_iter()
                .flat_map(|l| l.prepared)
                .map(|p| p.txid.to_string()),
        );
    }
    let mut orders = Vec::with_capacity(observed.len());
    for (order, client_outcome) in observed {
        let [inventory, _, shipping] = order.marker_keys();
        let present = [
            exists(client, urls.participant(inventory.0), &inventory.1).await?,
            payments.paid.contains(&order.id),
            exists(client, urls.participant(shipping.0), &shipping.1).await?,
        ];
        let prepared = [0, 1, 2].map(|i| in_doubt[i].contains(&order.id));
        orders.push(OrderObservation {
            order: order.clone(),
            client: *client_outcome,
            present,
            prepared,
            coordinator: transaction(client, &urls.coordinator, &order.id).await?,
        });
    }
    let mut stock = Vec::new();
    for sku in 0..config.skus {
        stock.push(Ledger {
            id: sku,
            left: counter(client, &urls.inventory, &stock_key(sku)).await?,
            moved: counter(client, &urls.inventory, &sold_key(sku)).await?,
        });
    }
    let money = payments.money;
    let after = Totals {
        sold: stock.iter().map(|l| l.moved).sum(),
        spent: money.iter().map(|l| l.moved).sum(),
    };
    Ok(Observation {
        settle,
        prepared_left,
        orders,
        stock,
        money,
        before,
        after,
    })
}
