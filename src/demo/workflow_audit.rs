//! The audit of `twopc demo --workflow`: what the run must leave behind, read from the shop
//! participant (checkouts, stock, outbox), the payments receiver's book and the workers'
//! events. Every check prints; any failure fails the run.
//!
//! It reads only; it never moves a checkout or touches an intent.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::Result;
use cluster::receiver::Receiver;
use cluster::workflow::{self, Checkout, Evidence, Plan, State};
use protocol::outbox::{IntentState, OutboxEntry, OutboxList};

use crate::workflow_store::Store;
use serde_json::Value;

/// What a run starts from.
pub struct Setup {
    pub checkouts: Vec<(String, Checkout)>,
    pub stock: Vec<(String, i64)>,
    pub balances: BTreeMap<String, i64>,
    pub slow_events: BTreeSet<String>,
    /// The payment after whose effect the relay is killed.
    pub hold_event: String,
}

impl Setup {
    pub fn new(n: u64) -> Setup {
        let balances = [("alice", 1000), ("bob", 1000), ("carol", 0)]
            .into_iter()
            .map(|(c, b)| (c.to_string(), b))
            .collect();
        Setup {
            checkouts: checkouts(n),
            stock: vec![("sku-1".into(), 50), ("sku-2".into(), 50)],
            balances,
            slow_events: slow_events(n),
            hold_event: workflow::payment_event_id("c-1"),
        }
    }
}

/// The checkouts of a run (so the audit can rebuild what it expects).
fn checkouts(n: u64) -> Vec<(String, Checkout)> {
    let customers = ["alice", "bob", "carol"];
    (1..=n)
        .map(|i| {
            let customer = customers[(i % 3) as usize];
            let sku = format!("sku-{}", 1 + i % 2);
            (
                format!("c-{i}"),
                Checkout::new(&sku, 10 + (i as i64 * 7) % 40, customer),
            )
        })
        .collect()
}

/// Which payments answer too late (their checkouts go through payment_unknown).
fn slow_events(n: u64) -> BTreeSet<String> {
    (1..=n)
        .filter(|i| i % 4 == 3)
        .map(|i| workflow::payment_event_id(&format!("c-{i}")))
        .collect()
}

/// What the workers said and what the script did.
#[derive(Default)]
pub struct Story {
    /// Accepted transitions per worker (A, B).
    pub moved: [u64; 2],
    /// Refused `stale_token` transitions: (checkout, from, to, token).
    pub stale: Vec<(String, String, String, u64)>,
    /// Highest token B moved a checkout with.
    b_token: u64,
    pub resumed: bool,
    pub paused_ms: u64,
    /// The event after whose effect the relay was killed, and its outbox state then.
    pub relay_killed: Option<(String, String)>,
    pub elapsed: Duration,
}

impl Story {
    pub fn note(&mut self, who: usize, event: &Value) {
        let text = |k: &str| event[k].as_str().unwrap_or("").to_string();
        let token = event["token"].as_u64().unwrap_or(0);
        match event["event"].as_str() {
            Some("moved") => {
                self.moved[who.min(1)] += 1;
                if who == 1 {
                    self.b_token = self.b_token.max(token);
                }
            }
            Some("stale") => {
                self.stale
                    .push((text("checkout"), text("from"), text("to"), token));
            }
            _ => {}
        }
    }

    pub fn moved_by_b_above(&self, token: u64) -> bool {
        self.b_token > token
    }
}

async fn get(client: &reqwest::Client, url: String) -> Option<Value> {
    let response = client.get(url).send().await.ok()?;
    if !response.status().is_success() {
        return None;
    }
    response.json().await.ok()
}

pub async fn all_terminal(client: &reqwest::Client, store: &Store, setup: &Setup) -> bool {
    store.checkouts(client).await.is_ok_and(|all| {
        all.len() == setup.checkouts.len() && all.iter().all(|(_, c, _)| c.state.is_terminal())
    })
}

struct Check {
    name: String,
    ok: bool,
    detail: String,
}

fn check(checks: &mut Vec<Check>, name: &str, ok: bool, detail: String) {
    checks.push(Check {
        name: name.into(),
        ok,
        detail,
    });
}

async fn outbox(client: &reqwest::Client, shop: &str) -> Vec<OutboxEntry> {
    let mut all = Vec::new();
    for state in ["open", "delivered", "abandoned"] {
        let url = format!("{shop}/v1/outbox?state={state}");
        if let Some(list) = get(client, url).await
            && let Ok(list) = serde_json::from_value::<OutboxList>(list)
        {
            all.extend(list.intents);
        }
    }
    all
}

/// Checks every invariant, prints the summary; whether all held.
pub async fn audit(
    client: &reqwest::Client,
    store: &Store,
    setup: &Setup,
    story: &Story,
    receiver: &Receiver,
) -> Result<bool> {
    let stored: BTreeMap<String, Checkout> = store
        .checkouts(client)
        .await?
        .into_iter()
        .map(|(id, c, _)| (id, c))
        .collect();
    let shop = store.url();
    let intents = outbox(client, shop).await;
    let effects = receiver.effects();
    let attempts = receiver.attempts();
    let captured = receiver.captured();
    let balances = receiver.balances();
    let mut checks = Vec::new();

    // 1. Every checkout in one terminal state, or listed with why.
    let mut by_state: BTreeMap<&str, u64> = BTreeMap::new();
    let mut pending = Vec::new();
    for (id, c) in &stored {
        *by_state.entry(c.state.name()).or_insert(0) += 1;
        if !c.state.is_terminal() {
            let entry = intents
                .iter()
                .find(|e| e.event_id == workflow::payment_event_id(id));
            let evidence = entry.map_or(Evidence::Missing, Evidence::of);
            let why = match workflow::plan(c.state, &evidence) {
                Plan::Wait(why) | Plan::Stuck(why) => why,
                Plan::Move(t) => format!("next: {} (no worker moved it in time)", t.to.name()),
                Plan::Done => String::new(),
            };
            pending.push(format!("{id} {}: {why}", c.state.name()));
        }
    }
    let terminal = stored.values().filter(|c| c.state.is_terminal()).count();
    check(
        &mut checks,
        "every checkout is confirmed or cancelled, or listed pending with why",
        stored.len() == setup.checkouts.len() && terminal + pending.len() == stored.len(),
        format!(
            "{terminal} of {} terminal {by_state:?}{}",
            setup.checkouts.len(),
            if pending.is_empty() {
                String::new()
            } else {
                format!("; pending: {}", pending.join("; "))
            }
        ),
    );

    // 2. Histories: each a path of the planner's transitions, the reservation once, tokens
    //    never going down, no refused transition among them.
    let mut bad_paths = Vec::new();
    let mut token_drops = Vec::new();
    for (id, c) in &stored {
        let mut at = State::Created;
        let mut token = 0;
        for step in &c.history {
            if step.from != at {
                bad_paths.push(format!("{id}: {:?} after {:?}", step.from, at));
            }
            if step.token < token {
                token_drops.push(format!("{id}: {} after {token}", step.token));
            }
            at = step.to;
            token = step.token;
        }
        if at != c.state {
            bad_paths.push(format!("{id}: history ends at {at:?}, state {:?}", c.state));
        }
        let reserves = c
            .history
            .iter()
            .filter(|s| s.to == State::StockReserved)
            .count();
        if reserves > 1 {
            bad_paths.push(format!("{id}: reserved {reserves} times"));
        }
    }
    check(
        &mut checks,
        "each history is one path through the workflow (no transition repeated)",
        bad_paths.is_empty(),
        if bad_paths.is_empty() {
            format!(
                "{} transitions",
                stored.values().map(|c| c.history.len()).sum::<usize>()
            )
        } else {
            bad_paths.join("; ")
        },
    );
    let refused_applied: Vec<String> = story
        .stale
        .iter()
        .filter(|(id, from, to, token)| {
            stored.get(id).is_some_and(|c| {
                c.history
                    .iter()
                    .any(|s| s.token == *token && s.from.name() == from && s.to.name() == to)
            })
        })
        .map(|(id, ..)| id.clone())
        .collect();
    check(
        &mut checks,
        "no transition by a stale worker: refused stale_token, tokens never go down",
        !story.stale.is_empty() && refused_applied.is_empty() && token_drops.is_empty(),
        format!(
            "{} refused ({}), paused {} ms; applied anyway: {refused_applied:?}; token drops: {token_drops:?}",
            story.stale.len(),
            story
                .stale
                .iter()
                .map(|(id, f, t, tok)| format!("{id} {f}->{t} token {tok}"))
                .collect::<Vec<_>>()
                .join(", "),
            story.paused_ms,
        ),
    );

    // 3. No intent lost, none twice: every checkout that reserved has exactly one intent, and
    //    it is delivered or visibly open.
    let mut lost = Vec::new();
    let mut open = 0;
    for (id, c) in &stored {
        let aggregate = workflow::checkout_key(id);
        let of: Vec<&OutboxEntry> = intents
            .iter()
            .filter(|e| e.aggregate == aggregate)
            .collect();
        let reserved = c.history.iter().any(|s| s.to == State::StockReserved);
        let expected = usize::from(reserved);
        if of.len() != expected
            || of
                .iter()
                .any(|e| e.event_id != workflow::payment_event_id(id))
        {
            lost.push(format!("{id}: {} intents", of.len()));
        }
        open += of
            .iter()
            .filter(|e| matches!(e.state, IntentState::Pending | IntentState::Failed))
            .count();
    }
    let delivered = intents
        .iter()
        .filter(|e| e.state == IntentState::Delivered)
        .count();
    check(
        &mut checks,
        "no intent lost: one payment intent per reserved checkout, delivered or listed open",
        lost.is_empty(),
        format!(
            "{delivered} delivered, {open} open{}",
            if lost.is_empty() {
                String::new()
            } else {
                format!("; wrong: {}", lost.join(", "))
            }
        ),
    );
    let twice: Vec<&String> = effects
        .iter()
        .filter(|(_, n)| **n != 1)
        .map(|(e, _)| e)
        .collect();
    let repeats: u32 = attempts.values().map(|n| n.saturating_sub(1)).sum();
    let strangers: Vec<&String> = effects
        .keys()
        .filter(|e| !intents.iter().any(|i| &i.event_id == *e))
        .collect();
    check(
        &mut checks,
        "none applied twice: one effect per event_id at the receiver",
        twice.is_empty() && strangers.is_empty() && effects.len() == delivered.max(effects.len()),
        format!(
            "{} events applied once; {repeats} repeated deliveries answered without a second effect; twice {twice:?}; unknown ids {strangers:?}",
            effects.len()
        ),
    );
    let relay_ok = story.relay_killed.as_ref().is_some_and(|(event, _)| {
        effects.get(event) == Some(&1) && attempts.get(event).copied().unwrap_or(0) >= 2
    });
    check(
        &mut checks,
        "the relay killed between the effect and its report redelivered under the same id, deduplicated",
        relay_ok,
        match &story.relay_killed {
            Some((event, then)) => format!(
                "{event}: intent {then} at the kill; {} deliveries, {} effect",
                attempts.get(event).copied().unwrap_or(0),
                effects.get(event).copied().unwrap_or(0)
            ),
            None => "the relay was never killed".into(),
        },
    );

    // 4. Unknown resolved from evidence.
    let mut reconciled = Vec::new();
    let mut wrong = Vec::new();
    for (id, c) in &stored {
        let path: Vec<State> = c.history.iter().map(|s| s.to).collect();
        if let Some(at) = path.iter().position(|s| *s == State::ReconciliationPending) {
            let answer = receiver
                .answers()
                .get(&workflow::payment_event_id(id))
                .and_then(|a| a["status"].as_str().map(str::to_string));
            if let Some(next) = c.history.get(at + 1) {
                let expected = match answer.as_deref() {
                    Some("authorized") => Some(State::PaymentAuthorized),
                    Some("declined") => Some(State::PaymentDeclined),
                    _ => None,
                };
                if Some(next.to) == expected {
                    reconciled.push(format!("{id} -> {}", next.to.name()));
                } else {
                    wrong.push(format!(
                        "{id}: {:?} but the receiver said {answer:?}",
                        next.to
                    ));
                }
            }
        }
    }
    check(
        &mut checks,
        "unknown outcomes went payment_unknown -> reconciliation_pending -> the receiver's answer for the original event_id",
        (!reconciled.is_empty() || setup.slow_events.is_empty()) && wrong.is_empty(),
        format!(
            "{} ({}); wrong: {wrong:?}",
            reconciled.len(),
            reconciled.join(", ")
        ),
    );

    // 5. Stock and money.
    let mut stock_ok = true;
    let mut stock_detail = Vec::new();
    let skus: Vec<String> = setup.stock.iter().map(|(sku, _)| sku.clone()).collect();
    let remaining = store.stock(client, &skus).await?;
    for (sku, initial) in &setup.stock {
        let left = remaining.get(sku).copied();
        let held = stored
            .values()
            .filter(|c| &c.sku == sku && c.state.holds_stock())
            .count() as i64;
        stock_ok &= left == Some(initial - held);
        stock_detail.push(format!("{sku}: {initial} = {left:?} left + {held} held"));
    }
    check(
        &mut checks,
        "stock conserved (initial = remaining + held by checkouts)",
        stock_ok,
        stock_detail.join("; "),
    );
    let initial: i64 = setup.balances.values().sum();
    let now: i64 = balances.values().sum();
    let taken: i64 = captured.values().sum();
    let owed: i64 = stored
        .iter()
        .filter(|(_, c)| matches!(c.state, State::Confirmed | State::PaymentAuthorized))
        .map(|(_, c)| c.amount)
        .sum();
    let captured_of_cancelled: Vec<&String> = stored
        .iter()
        .filter(|(id, c)| {
            c.state == State::Cancelled && captured.contains_key(&workflow::payment_event_id(id))
        })
        .map(|(id, _)| id)
        .collect();
    check(
        &mut checks,
        "money conserved (balances + captured = initial; captured = confirmed amounts)",
        now + taken == initial
            && (owed == taken || !pending.is_empty())
            && captured_of_cancelled.is_empty(),
        format!(
            "{now} + {taken} = {initial}; confirmed amounts {owed}; captured for cancelled {captured_of_cancelled:?}"
        ),
    );

    println!(
        "workflow run: {:.1} s; transitions by A {} and B {}",
        story.elapsed.as_secs_f64(),
        story.moved[0],
        story.moved[1]
    );
    println!("checks:");
    for c in &checks {
        println!("  [{}] {}", if c.ok { "ok  " } else { "FAIL" }, c.name);
        println!("         {}", c.detail);
    }
    let all_ok = checks.iter().all(|c| c.ok);
    println!(
        "{}",
        if all_ok {
            "every checkout settled by evidence, every intent delivered once in effect, no stale worker moved anything"
        } else {
            "the workflow did not hold (see FAIL above)"
        }
    );
    Ok(all_ok)
}
