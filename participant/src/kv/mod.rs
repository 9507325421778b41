//! The reference participant: a durable key-value store built on the library (design 3.3).
//!
//! `store` is the `Resource` (ops, validation, no votes); `routes` adds the read API; `cli` runs
//! it as a process (`twopc participant --backend kv`).

pub mod cli;
pub mod routes;
mod store;

pub use store::{KvStaged, KvStore, SeedError};
