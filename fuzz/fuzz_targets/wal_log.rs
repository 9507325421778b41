//! The `wal_log` fuzz target: see `twopc_fuzz::wal_log` and docs/fuzzing.md.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| twopc_fuzz::wal_log::run(data));
