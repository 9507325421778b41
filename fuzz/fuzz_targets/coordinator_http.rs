//! The `coordinator_http` fuzz target: see `twopc_fuzz::coordinator_http` and docs/fuzzing.md.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| twopc_fuzz::coordinator_http::run(data));
