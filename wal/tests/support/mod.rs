//! Helpers shared by the wal's integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use wal::sim::SimStorage;
use wal::{Recovery, Wal, WalError, WalOptions};

pub const DIR: &str = "/sim/wal";

pub fn dir() -> PathBuf {
    PathBuf::from(DIR)
}

pub fn seg(base: u64) -> PathBuf {
    dir().join(wal::format::segment_name(base))
}

pub fn open(sim: &SimStorage, options: WalOptions) -> Result<(Wal, Recovery), WalError> {
    Wal::open_with_storage(Arc::new(sim.clone()), dir(), options)
}

pub fn small_segments(bytes: u64) -> WalOptions {
    WalOptions {
        segment_bytes_max: bytes,
        ..WalOptions::default()
    }
}

/// Deterministic payload for record number `i`: distinct per `i`, length `len`.
pub fn payload(i: u64, len: usize) -> Vec<u8> {
    let mut bytes = i.to_le_bytes().to_vec();
    bytes.resize(len.max(8), (i % 251) as u8);
    bytes
}

/// A snapshot that is the whole history so far: length-prefixed payloads.
pub fn encode_history(history: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in history {
        out.extend_from_slice(&(p.len() as u32).to_le_bytes());
        out.extend_from_slice(p);
    }
    out
}

pub fn decode_history(mut bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let len = u32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize;
        out.push(bytes[4..4 + len].to_vec());
        bytes = &bytes[4 + len..];
    }
    out
}

/// Snapshot history followed by the recovered records, checking the records continue it without a
/// gap.
pub fn full_history(recovery: &Recovery) -> Vec<Vec<u8>> {
    let mut history = recovery
        .snapshot
        .as_deref()
        .map(decode_history)
        .unwrap_or_default();
    for record in &recovery.records {
        assert_eq!(
            record.seq,
            history.len() as u64 + 1,
            "records continue the snapshot"
        );
        history.push(record.payload.clone());
    }
    history
}

pub fn names(sim: &SimStorage) -> Vec<String> {
    sim.file_names(Path::new(DIR))
}
