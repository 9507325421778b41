//! The `participant_log` fuzz target: see `twopc_fuzz::participant_log` and docs/fuzzing.md.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| twopc_fuzz::participant_log::run(data));
