//! The checkout workflow of issue 29 as a pure planner (docs/workflows.md, "The checkout
//! workflow"): given a checkout as stored and the evidence of its payment intent, which
//! transition comes next, and the one `POST /v1/kv` write that makes it.
//!
//! ```text
//! created -> stock_reserved -> payment_authorized -> confirmed
//!                  \-> payment_declined -> stock_release_pending -> cancelled
//!                  \-> payment_unknown  -> reconciliation_pending -> (payment_authorized | payment_declined)
//! ```
//!
//! It owns the decisions only: no clock, no randomness, no I/O (the `twopc workflow-worker`
//! process reads, calls and prints). It must never plan a payment intent under any id but
//! `pay-<checkout>`: an unknown outcome is resolved from the receiver's answer for that id,
//! which the relay keeps asking for, never by asking again under a fresh one.

use protocol::kv::KvOp;
use protocol::lease::FenceClaim;
use protocol::outbox::{Intent, IntentState, OutboxEntry, WriteRequest};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The KV key of the list of checkout ids the workers walk.
pub const INDEX_KEY: &str = "checkout-index";
/// The lease the workers hold, also the fenced resource of every transition.
pub const LEASE: &str = "checkout-workers";
/// The outbox target of payment intents (a relay `--target payments=URL`).
pub const PAYMENTS_TARGET: &str = "payments";
pub const PAYMENT_INTENT: &str = "payment.authorize.v1";

/// A checkout's state, as stored in its `state` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Created,
    StockReserved,
    PaymentAuthorized,
    Confirmed,
    PaymentDeclined,
    StockReleasePending,
    Cancelled,
    PaymentUnknown,
    ReconciliationPending,
}

impl State {
    pub fn is_terminal(self) -> bool {
        matches!(self, State::Confirmed | State::Cancelled)
    }

    /// Whether a checkout in this state holds one unit of its sku (reserved, not released).
    pub fn holds_stock(self) -> bool {
        !matches!(self, State::Created | State::Cancelled)
    }

    pub fn name(self) -> &'static str {
        match self {
            State::Created => "created",
            State::StockReserved => "stock_reserved",
            State::PaymentAuthorized => "payment_authorized",
            State::Confirmed => "confirmed",
            State::PaymentDeclined => "payment_declined",
            State::StockReleasePending => "stock_release_pending",
            State::Cancelled => "cancelled",
            State::PaymentUnknown => "payment_unknown",
            State::ReconciliationPending => "reconciliation_pending",
        }
    }
}

/// One transition as the checkout's history records it: the fencing token it was written
/// under, so an audit can see that tokens never go down.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    pub from: State,
    pub to: State,
    pub token: u64,
    /// The payment evidence it rests on, when it rests on one (`authorized`, `declined`,
    /// `unknown: <last error>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence: Option<String>,
}

/// The value stored at `checkout:<id>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkout {
    pub state: State,
    pub sku: String,
    pub amount: i64,
    pub customer: String,
    #[serde(default)]
    pub history: Vec<Step>,
}

impl Checkout {
    pub fn new(sku: &str, amount: i64, customer: &str) -> Checkout {
        Checkout {
            state: State::Created,
            sku: sku.into(),
            amount,
            customer: customer.into(),
            history: Vec::new(),
        }
    }
}

pub fn checkout_key(id: &str) -> String {
    format!("checkout:{id}")
}

pub fn stock_key(sku: &str) -> String {
    format!("stock:{sku}")
}

/// The one payment intent id of a checkout, for its whole life.
pub fn payment_event_id(id: &str) -> String {
    format!("pay-{id}")
}

/// What the outbox says about a checkout's payment intent.
#[derive(Debug, Clone, PartialEq)]
pub enum Evidence {
    /// No entry (not written yet, or dropped after its retention).
    Missing,
    /// Not delivered; `attempts` reported, the last one's error if any.
    Pending {
        attempts: u32,
        last_error: Option<String>,
    },
    /// The receiver answered `status` (`authorized`, `declined`, or something else).
    Answered { status: String },
    /// Refused for good, or abandoned by an operator: a person must look.
    Stuck { why: String },
}

impl Evidence {
    /// Reads an outbox entry (`GET /v1/outbox/{event_id}`).
    pub fn of(entry: &OutboxEntry) -> Evidence {
        match entry.state {
            IntentState::Pending => Evidence::Pending {
                attempts: entry.attempts,
                last_error: entry.last_error.clone(),
            },
            IntentState::Delivered => Evidence::Answered {
                status: entry
                    .answer
                    .as_ref()
                    .and_then(|a| a.get("status"))
                    .and_then(Value::as_str)
                    .unwrap_or("none")
                    .to_string(),
            },
            IntentState::Failed => Evidence::Stuck {
                why: format!(
                    "payment intent failed: {}",
                    entry.last_error.as_deref().unwrap_or("no error recorded")
                ),
            },
            IntentState::Abandoned => Evidence::Stuck {
                why: "payment intent abandoned by an operator".into(),
            },
        }
    }
}

/// The next move of one checkout.
#[derive(Debug, Clone, PartialEq)]
pub enum Plan {
    /// Write this transition.
    Move(Transition),
    /// Nothing to do yet (why).
    Wait(String),
    /// Confirmed or cancelled.
    Done,
    /// Needs an operator (why); it stays visibly pending.
    Stuck(String),
}

/// One transition and what its write carries besides the new state.
#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    pub from: State,
    pub to: State,
    /// Added to the checkout's sku stock (-1 with min 0 on reserve, +1 on release).
    pub stock_delta: Option<i64>,
    /// Whether the write emits the payment intent (only created -> stock_reserved).
    pub emits_payment: bool,
    pub evidence: Option<String>,
}

fn step(from: State, to: State) -> Transition {
    Transition {
        from,
        to,
        stock_delta: None,
        emits_payment: false,
        evidence: None,
    }
}

/// What a receiver's answer means for the checkout.
fn resolved(from: State, status: &str) -> Plan {
    let mut t = match status {
        "authorized" => step(from, State::PaymentAuthorized),
        "declined" => step(from, State::PaymentDeclined),
        other => return Plan::Stuck(format!("the receiver answered status {other:?}")),
    };
    t.evidence = Some(status.to_string());
    Plan::Move(t)
}

/// The next move of a checkout in `state` given its payment intent's `evidence`.
pub fn plan(state: State, evidence: &Evidence) -> Plan {
    match state {
        State::Created => Plan::Move(Transition {
            stock_delta: Some(-1),
            emits_payment: true,
            ..step(State::Created, State::StockReserved)
        }),
        State::StockReserved => match evidence {
            Evidence::Answered { status } => resolved(state, status),
            Evidence::Pending {
                attempts,
                last_error,
            } if *attempts > 0 => Plan::Move(Transition {
                evidence: Some(format!(
                    "unknown: {}",
                    last_error.as_deref().unwrap_or("no answer")
                )),
                ..step(state, State::PaymentUnknown)
            }),
            Evidence::Pending { .. } => Plan::Wait("payment intent not yet attempted".into()),
            Evidence::Missing => Plan::Stuck("its payment intent is missing".into()),
            Evidence::Stuck { why } => Plan::Stuck(why.clone()),
        },
        // Unknown is a state: it is recorded, then reconciliation waits for the answer to the
        // original event_id (the relay keeps asking under it), whatever the evidence says now.
        State::PaymentUnknown => Plan::Move(step(state, State::ReconciliationPending)),
        State::ReconciliationPending => match evidence {
            Evidence::Answered { status } => resolved(state, status),
            Evidence::Pending { attempts, .. } => Plan::Wait(format!(
                "awaiting the receiver's answer for the original event_id ({attempts} attempts)"
            )),
            Evidence::Missing => Plan::Stuck("its payment intent is missing".into()),
            Evidence::Stuck { why } => Plan::Stuck(why.clone()),
        },
        State::PaymentAuthorized => Plan::Move(step(state, State::Confirmed)),
        State::PaymentDeclined => Plan::Move(step(state, State::StockReleasePending)),
        State::StockReleasePending => Plan::Move(Transition {
            stock_delta: Some(1),
            ..step(state, State::Cancelled)
        }),
        State::Confirmed | State::Cancelled => Plan::Done,
    }
}

/// Whether the planner needs the payment evidence for `state` (the worker reads the outbox
/// only then).
pub fn needs_evidence(state: State) -> bool {
    matches!(
        state,
        State::StockReserved | State::ReconciliationPending | State::PaymentUnknown
    )
}

/// The one write of `transition` for checkout `id` stored at `version`, under `fence`: a
/// check of the version (a checkout that moved on meanwhile answers 409 condition_failed and
/// nothing changes), the new value with the step appended to its history, the stock op, and
/// the payment intent when the transition emits it. The op id names the version and the
/// token, so a repeat of this very write answers its first answer.
pub fn write(
    id: &str,
    checkout: &Checkout,
    version: u64,
    transition: &Transition,
    fence: FenceClaim,
) -> WriteRequest {
    let key = checkout_key(id);
    let mut next_value = checkout.clone();
    next_value.state = transition.to;
    next_value.history.push(Step {
        from: transition.from,
        to: transition.to,
        token: fence.token,
        evidence: transition.evidence.clone(),
    });
    let mut ops = vec![
        KvOp::Check {
            key: key.clone(),
            version,
        },
        KvOp::Put {
            key: key.clone(),
            value: serde_json::to_value(&next_value).unwrap_or(Value::Null),
        },
    ];
    if let Some(delta) = transition.stock_delta {
        ops.push(KvOp::Add {
            key: stock_key(&checkout.sku),
            delta,
            min: (delta < 0).then_some(0),
        });
    }
    let next = if transition.emits_payment {
        vec![Intent {
            event_id: payment_event_id(id),
            aggregate: key,
            target: PAYMENTS_TARGET.into(),
            kind: PAYMENT_INTENT.into(),
            body: json!({
                "checkout": id,
                "customer": checkout.customer,
                "amount": checkout.amount,
            }),
        }]
    } else {
        Vec::new()
    };
    WriteRequest {
        op_id: format!("wf-{id}-v{version}-t{}", fence.token),
        fence: Some(fence),
        ops,
        next,
    }
}

/// The write that sets up a run: stock per sku, each checkout `created`, and the index the
/// workers walk (the demo and the tests send it once, before any worker starts).
pub fn seed(
    op_id: &str,
    stock: &[(String, i64)],
    checkouts: &[(String, Checkout)],
) -> WriteRequest {
    let mut ops: Vec<KvOp> = stock
        .iter()
        .map(|(sku, n)| KvOp::Put {
            key: stock_key(sku),
            value: json!(n),
        })
        .collect();
    for (id, checkout) in checkouts {
        ops.push(KvOp::Put {
            key: checkout_key(id),
            value: serde_json::to_value(checkout).unwrap_or(Value::Null),
        });
    }
    let ids: Vec<&String> = checkouts.iter().map(|(id, _)| id).collect();
    ops.push(KvOp::Put {
        key: INDEX_KEY.into(),
        value: json!(ids),
    });
    WriteRequest {
        op_id: op_id.into(),
        fence: None,
        ops,
        next: Vec::new(),
    }
}

#[cfg(test)]
#[path = "workflow_tests.rs"]
mod tests;
