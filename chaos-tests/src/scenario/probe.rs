//! Exact reads about one transaction, for the crash-point matrix: is its marker present at each
//! participant, what does the coordinator say, is it still prepared and with which keys locked,
//! and did the ledgers move by exactly its amount.

use std::time::{Duration, Instant};

use protocol::kv::{PreparedEntry, PreparedList};
use protocol::{
    DecisionQuery, DecisionQueryResponse, DecisionStatus, GlobalTxId, PrepareRequest,
    TransactionList, TransactionStatus, TxId, Vote, routes,
};

use cluster::checkout::{INVENTORY, Order, PAYMENTS, sold_key, spent_key};
use cluster::oracle::ClusterUrls;
use cluster::oracle::read::{counter, exists, get_json, transaction};

/// Where one order stands.
#[derive(Debug, Clone, PartialEq)]
pub struct TxView {
    /// Marker present at inventory, payments, shipping.
    pub applied: [bool; 3],
    /// Prepared (in doubt) at inventory, payments, shipping.
    pub prepared: [bool; 3],
    pub coordinator: Option<TransactionStatus>,
}

impl TxView {
    pub fn applied_everywhere(&self) -> bool {
        self.applied.iter().all(|a| *a)
    }
    pub fn applied_nowhere(&self) -> bool {
        self.applied.iter().all(|a| !*a)
    }
    pub fn prepared_nowhere(&self) -> bool {
        self.prepared.iter().all(|p| !*p)
    }
}

/// Where `order` stands. In-doubt lists are read before the markers: a participant that holds
/// the order prepared nowhere has applied its decision already, so markers read after that show
/// its final state (read the other way round, a commit landing between the two reads showed
/// "neither prepared nor applied" for a committed order).
pub async fn view(client: &reqwest::Client, urls: &ClusterUrls, order: &Order) -> TxView {
    let mut prepared = [false; 3];
    for (slot, (_, base)) in prepared.iter_mut().zip(urls.participants()) {
        *slot = prepared_at(client, base)
            .await
            .iter()
            .any(|p| p.txid.as_str() == order.id);
    }
    let mut applied = [false; 3];
    for (slot, (participant, key)) in applied.iter_mut().zip(order.marker_keys()) {
        *slot = exists(client, urls.participant(participant), &key)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let coordinator = transaction(client, &urls.coordinator, &order.id)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    TxView {
        applied,
        prepared,
        coordinator,
    }
}

/// Polls [`view`] until `done` holds or `timeout` passes; returns the last view either way.
pub async fn wait_view(
    client: &reqwest::Client,
    urls: &ClusterUrls,
    order: &Order,
    timeout: Duration,
    done: impl Fn(&TxView) -> bool,
) -> TxView {
    let deadline = Instant::now() + timeout;
    loop {
        let current = view(client, urls, order).await;
        if done(&current) || Instant::now() >= deadline {
            return current;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The in-doubt transactions of one participant.
pub async fn prepared_at(client: &reqwest::Client, base: &str) -> Vec<PreparedEntry> {
    get_json::<PreparedList>(client, format!("{base}/v1/prepared"))
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .map(|l| l.prepared)
        .unwrap_or_default()
}

/// The attempt of client id `id` as a decision query names it, if anyone knows it: first a
/// participant that holds it in doubt (its entry has all four fields exactly as prepared), else
/// the coordinator's record (its gtid gives the incarnation and position). The epoch the attempt
/// was prepared under is not in the coordinator's record; the coordinator answers from the gtid,
/// incarnation and position (the epoch only names the run in its reasons), so the epoch of the
/// coordinator's current run stands in for it then. `None`: neither the coordinator nor any
/// participant has an attempt of `id`, so no participant can ask about one.
/// `peer` asks the coordinator as a participant would (it sends the peer token).
pub async fn attempt(
    client: &reqwest::Client,
    peer: &reqwest::Client,
    urls: &ClusterUrls,
    id: &str,
) -> Option<DecisionQuery> {
    for (_, base) in urls.participants() {
        if let Some(entry) = prepared_at(client, base)
            .await
            .into_iter()
            .find(|p| p.txid.as_str() == id)
        {
            return Some(query_of(&entry));
        }
    }
    let status = transaction(client, &urls.coordinator, id)
        .await
        .unwrap_or_else(|e| panic!("{e}"))?;
    let (_, incarnation, position) = status
        .gtid
        .parts()
        .unwrap_or_else(|| panic!("the coordinator's gtid {} is not composed", status.gtid));
    let epoch = bare_decision(peer, urls, id)
        .await
        .epoch
        .unwrap_or_else(|| panic!("the coordinator's decision answer carries no epoch"));
    Some(DecisionQuery {
        gtid: status.gtid,
        incarnation,
        epoch,
        position,
    })
}

/// The decision query a participant holding `entry` in doubt sends.
pub fn query_of(entry: &PreparedEntry) -> DecisionQuery {
    DecisionQuery {
        gtid: entry.gtid.clone(),
        incarnation: entry.incarnation,
        epoch: entry.epoch,
        position: entry.position,
    }
}

/// What the coordinator tells a participant in doubt about attempt `query` of client id `id`
/// (`peer` sends the peer token, as a participant does).
pub async fn decision_answer(
    peer: &reqwest::Client,
    urls: &ClusterUrls,
    id: &str,
    query: &DecisionQuery,
) -> DecisionQueryResponse {
    let txid = TxId::new(id).unwrap_or_else(|e| panic!("{id}: {e}"));
    get_json::<DecisionQueryResponse>(
        peer,
        format!(
            "{}{}",
            urls.coordinator,
            routes::decision_query_path(&txid, query)
        ),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"))
    .unwrap_or_else(|| panic!("decision query for {id} answered 404"))
}

/// What the coordinator tells a participant in doubt about `id`'s attempt ([`attempt`]);
/// `None` when no attempt of `id` is known anywhere.
pub async fn decision(
    client: &reqwest::Client,
    peer: &reqwest::Client,
    urls: &ClusterUrls,
    id: &str,
) -> Option<DecisionStatus> {
    let query = attempt(client, peer, urls, id).await?;
    Some(decision_answer(peer, urls, id, &query).await.decision)
}

/// A decision query that names no attempt (as a participant of an older protocol would send):
/// the coordinator can only answer `unknown`, with its own id, epoch and incarnation. `peer`
/// sends the peer token.
pub async fn bare_decision(
    peer: &reqwest::Client,
    urls: &ClusterUrls,
    id: &str,
) -> DecisionQueryResponse {
    get_json::<DecisionQueryResponse>(
        peer,
        format!("{}/v1/transactions/{id}/decision", urls.coordinator),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"))
    .unwrap_or_else(|| panic!("decision query for {id} answered 404"))
}

/// The order's product's `sold` and customer's `spent` counters.
pub async fn ledgers(client: &reqwest::Client, urls: &ClusterUrls, order: &Order) -> (i64, i64) {
    let sold = counter(client, urls.participant(INVENTORY), &sold_key(order.sku))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let spent = counter(
        client,
        urls.participant(PAYMENTS),
        &spent_key(order.customer),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    (sold, spent)
}

/// Sends a prepare that touches `key` straight to a participant, as the coordinator of `entry`
/// would: a participant holding `key` locked must vote no. Returns the vote. `peer` sends the
/// peer token, as the coordinator does.
pub async fn probe_lock(
    peer: &reqwest::Client,
    base: &str,
    entry: &PreparedEntry,
    probe_txid: &str,
    key: &str,
) -> Result<Vote, String> {
    let payload = serde_json::json!({"ops": [{"op": "put", "key": key, "value": "probe"}]});
    // An attempt of the same run at a position that run never reaches: a new attempt from the
    // participant's point of view, under the epoch and incarnation it already holds (so neither
    // a fence raise nor an incarnation conflict decides the vote, only the lock).
    let gtid = GlobalTxId::compose(&entry.coordinator_id, entry.incarnation, u64::MAX);
    let request = serde_json::json!({
        "txid": probe_txid,
        "gtid": gtid,
        "coordinator_id": entry.coordinator_id,
        "epoch": entry.epoch,
        "incarnation": entry.incarnation,
        "position": u64::MAX,
        "payload": payload,
    });
    // Type-check the body against the wire type before sending.
    let _: PrepareRequest =
        serde_json::from_value(request.clone()).map_err(|e| format!("probe body: {e}"))?;
    let response = peer
        .post(format!("{base}/2pc/prepare"))
        .json(&request)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status();
    let text = response.text().await.map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!("{status}: {text}"));
    }
    serde_json::from_str(&text).map_err(|e| format!("{e}: {text}"))
}

/// Waits until nothing is in flight: no participant holds a prepared transaction and the
/// coordinator lists nothing preparing, committing or aborting. `Err` says what was left.
pub async fn wait_quiescent(
    client: &reqwest::Client,
    urls: &ClusterUrls,
    timeout: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    loop {
        let mut left = Vec::new();
        for (name, base) in urls.participants() {
            let prepared = prepared_at(client, base).await;
            if !prepared.is_empty() {
                left.push(format!("{name}: {} prepared", prepared.len()));
            }
        }
        for state in ["preparing", "committing", "aborting"] {
            let list: Option<TransactionList> = get_json(
                client,
                format!("{}/v1/transactions?state={state}", urls.coordinator),
            )
            .await
            .map_err(|e| e.to_string())?;
            let count = list.map_or(0, |l| l.transactions.len());
            if count > 0 {
                left.push(format!("coordinator: {count} {state}"));
            }
        }
        if left.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(left.join(", "));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
