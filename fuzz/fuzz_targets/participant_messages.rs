//! The `participant_messages` fuzz target: see `twopc_fuzz::participant_messages` and docs/fuzzing.md.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| twopc_fuzz::participant_messages::run(data));
