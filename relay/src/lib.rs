//! The outbox relay (`twopc relay`, docs/workflows.md, "The relay"): it reads participants'
//! outboxes and delivers their intents, at least once, in order per aggregate, under each
//! intent's `event_id`, to an HTTP endpoint or as a transaction or saga submitted to the
//! coordinator under that id; then it reports each delivery back to the participant.
//!
//! It owns delivering and reporting, nothing else: the outbox (what is pending, in what order,
//! what was delivered) is the participant's, which checks every report as a claim.
//!
//! It must never deliver under a fresh id (an unknown outcome is asked again under the same
//! `event_id`), never deliver an aggregate's intent before the earlier one is marked delivered,
//! never report `delivered` without the receiver's answer, and never call a URL that is not in
//! its own configuration (an intent names its target; the relay maps names to URLs).
//!
//! The files stand in floors, each importing only from what comes before it in this list (no
//! circles; `tests/architecture.rs` checks):
//!
//! 1. the ground: `events` and `backoff` (the planner's vocabulary and waits), then [`plan`]
//!    (the pure planner), [`crash`] (the named crash point), [`metrics`];
//! 2. the wire: [`targets`] (what `--participant`, `--target` and `--coordinator` name) and
//!    `credentials` (the tokens sent and taken, reread on SIGHUP), then `outbox_client`
//!    (listings and reports), `http_target` (an HTTP receiver) and `coordinator_target` (a
//!    transaction or saga under the event's id);
//! 3. the process: `shell` (the planner driven by real I/O and a clock) and `status` (the
//!    /healthz, /readyz and /metrics routes, and who may read /metrics), then [`cli`]
//!    (`twopc relay`: flags, tokens, the listener).
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod backoff;
pub mod cli;
mod coordinator_target;
pub mod crash;
mod credentials;
mod events;
mod http_target;
pub mod metrics;
mod outbox_client;
pub mod plan;
mod shell;
mod status;
pub mod targets;
