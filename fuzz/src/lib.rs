//! The harnesses behind the fuzz targets in `fuzz_targets/` (docs/fuzzing.md).
//!
//! **Owns:** turning a fuzzer's bytes into log directories and HTTP requests, driving the real
//! decoders, recovery paths and routers with them, and asserting what must hold for every
//! input (a decoded frame re-encodes to the same bytes; a log that opened once opens again;
//! every answer is a well-formed status with a JSON error body). Each `run` panics exactly
//! when an invariant breaks, which is what libFuzzer reports as a crash.
//!
//! **Must never:** touch the real disk for a log (logs live in `wal::sim`'s memory), talk to
//! anything but loopback, or hide a panic of the code under test.

pub mod coordinator_http;
pub mod coordinator_log;
pub mod http;
pub mod input;
pub mod participant_log;
pub mod participant_messages;
pub mod records;
pub mod wal_log;

#[cfg(test)]
mod seeds;
