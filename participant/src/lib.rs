//! The twopc participant library and the reference key-value participant.
//!
//! This crate owns everything a service needs to take part in two-phase commit (design 3.2,
//! 4.4): a pure protocol engine ([`engine`]) over a service's [`Resource`], the durable
//! prepared-state log on the `wal` crate, epoch fencing, tombstones, recovery with in-doubt
//! resolution, and the HTTP routes. It also ships the reference KV store ([`kv`]) and the
//! `twopc participant` command ([`command`]).
//!
//! It must never decide a prepared transaction's outcome by itself, never answer yes before the
//! prepared record is durable, never ack a decision before its record is durable, and never
//! call a URL that a request handed it (the coordinator's URL comes from configuration only).
//! It does not depend on the coordinator crate.
//!
//! The files stand in floors, each importing only from what comes before it in this list (no
//! circles; `tests/architecture.rs` checks):
//!
//! 1. the ground: [`resource`] (what a service plugs in), [`tombstones`], [`epoch_bound`],
//!    [`crash`], [`decision_client`], `metrics`, then [`fence`] (fencing tokens), [`outbox`]
//!    (a write's next intents, their table), `locks`,
//!    `rejection`, and what the log holds: `saga_barrier` (what the saga barrier remembers)
//!    and [`record`];
//! 2. the engine: [`engine`], the pure state machine (inside it, `types` and `sender`, then
//!    `vote`, `waits`, then `prepare`, `decide`, `in_doubt`, `fenced`, `saga`, `replay`), its
//!    checkpoint [`snapshot`], and [`config`];
//! 3. the shell: [`service`] (the engine behind a mutex, with the log), [`open`] (recovery),
//!    `resolver` (in-doubt queries) and `saga_service`;
//! 4. HTTP: `api_error` (the error body every route answers with), `cross_site` and [`auth`]
//!    (the guard), `fence_http` and `outbox_http` (the outbox's routes), then [`http`] (the
//!    routes);
//! 5. the process: [`cli`] (every flag, and the shutdown signal), the services that read them,
//!    [`kv`] (the reference store, its routes and its process) and [`postgres`] (the
//!    PostgreSQL backend), and last [`command`], `twopc participant`, which picks the backend.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod api_error;
pub mod auth;
pub mod batch_http;
pub mod cli;
pub mod command;
pub mod config;
pub mod crash;
mod cross_site;
pub mod decision_client;
pub mod engine;
pub mod epoch_bound;
pub mod fence;
mod fence_http;
pub mod http;
pub mod kv;
mod locks;
mod metrics;
pub mod open;
pub mod outbox;
mod outbox_http;
pub mod postgres;
pub mod record;
mod rejection;
mod resolver;
pub mod resource;
mod saga_barrier;
mod saga_service;
pub mod service;
pub mod snapshot;
pub mod tombstones;

pub use config::ParticipantConfig;
pub use engine::{Command, Engine, EngineConfig, Event, Reply};
pub use http::{ApiError, finish};
pub use open::OpenError;
pub use outbox::Write;
pub use rejection::Rejection;
pub use resource::{CheckFailed, InvalidPayload, Resource};
pub use saga_service::{OpQueryError, SagaOpError};
pub use service::{Participant, RequestError};
pub use wal::{SyncPolicy, WalOptions};
