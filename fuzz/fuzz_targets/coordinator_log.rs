//! The `coordinator_log` fuzz target: see `twopc_fuzz::coordinator_log` and docs/fuzzing.md.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| twopc_fuzz::coordinator_log::run(data));
