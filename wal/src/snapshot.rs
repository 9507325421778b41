//! The snapshot file a checkpoint writes: `magic | seq u64 | len u64 | payload | crc u32`.
//!
//! Written as `snapshot-<seq>.snap.tmp`, fsynced, renamed to `snapshot-<seq>.snap`, then the
//! directory is fsynced; so after a crash the snapshot is either wholly there or not at all.
//! The temporary file may be written off the writer thread ([`write_synced`]); the rename, which
//! makes it the log's start, is always the writer's.

use std::path::Path;

use crate::error::WalError;
use crate::storage::Storage;

/// Identifies a snapshot file (and its format version).
pub const SNAPSHOT_MAGIC: &[u8; 8] = b"TWPCSNP1";
/// Bytes before the payload.
pub const SNAPSHOT_HEADER_BYTES: usize = 8 + 8 + 8;
/// Largest snapshot accepted when writing and reading; a snapshot is the owner's live state, which
/// is bounded by its live transactions, far below this.
pub const SNAPSHOT_BYTES_MAX: usize = 1024 * 1024 * 1024;

fn header(seq: u64, payload_len: usize) -> [u8; SNAPSHOT_HEADER_BYTES] {
    let mut header = [0u8; SNAPSHOT_HEADER_BYTES];
    header[..8].copy_from_slice(SNAPSHOT_MAGIC);
    header[8..16].copy_from_slice(&seq.to_le_bytes());
    header[16..].copy_from_slice(&(payload_len as u64).to_le_bytes());
    header
}

fn crc(header: &[u8], payload: &[u8]) -> [u8; 4] {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(header);
    hasher.update(payload);
    hasher.finalize().to_le_bytes()
}

/// Creates the snapshot file `tmp` (it must not exist), writes it and fdatasyncs it; its length.
/// The payload, often megabytes, is written where it is rather than copied behind a header.
pub fn write_synced(
    storage: &dyn Storage,
    tmp: &Path,
    seq: u64,
    payload: &[u8],
) -> Result<u64, WalError> {
    let header = header(seq, payload.len());
    let crc = crc(&header, payload);
    let mut file = storage
        .create(tmp)
        .map_err(|e| WalError::io("create", tmp, e))?;
    for part in [&header[..], payload, &crc[..]] {
        file.append(part)
            .map_err(|e| WalError::io("write", tmp, e))?;
    }
    file.sync_data()
        .map_err(|e| WalError::io("fsync", tmp, e))?;
    Ok((header.len() + payload.len() + crc.len()) as u64)
}

/// The bytes [`write_synced`] writes, in one buffer (for tools and tests that build files).
pub fn encode(seq: u64, payload: &[u8]) -> Vec<u8> {
    let header = header(seq, payload.len());
    let crc = crc(&header, payload);
    [&header[..], payload, &crc[..]].concat()
}

/// Decodes a whole snapshot file; `expected_seq` comes from its name. Errors are reasons for a
/// `WalError::Corrupt` at offset 0.
pub fn decode(bytes: &[u8], expected_seq: u64) -> Result<&[u8], String> {
    if bytes.len() < SNAPSHOT_HEADER_BYTES + 4 {
        return Err(format!(
            "snapshot file of {} bytes is too short",
            bytes.len()
        ));
    }
    if &bytes[..8] != SNAPSHOT_MAGIC {
        return Err("not a snapshot file (bad magic)".to_string());
    }
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[8..16]);
    let seq = u64::from_le_bytes(word);
    word.copy_from_slice(&bytes[16..24]);
    let len = u64::from_le_bytes(word);
    if len > SNAPSHOT_BYTES_MAX as u64 {
        return Err(format!(
            "snapshot length {len} exceeds the maximum of {SNAPSHOT_BYTES_MAX}"
        ));
    }
    let expected_bytes = SNAPSHOT_HEADER_BYTES as u64 + len + 4;
    if expected_bytes != bytes.len() as u64 {
        return Err(format!(
            "snapshot length {len} does not match the file size of {} bytes",
            bytes.len()
        ));
    }
    let body_end = bytes.len() - 4;
    let mut stored = [0u8; 4];
    stored.copy_from_slice(&bytes[body_end..]);
    let stored = u32::from_le_bytes(stored);
    let computed = crc32fast::hash(&bytes[..body_end]);
    if stored != computed {
        return Err(format!(
            "snapshot CRC mismatch: stored {stored:#010x}, computed {computed:#010x}"
        ));
    }
    if seq != expected_seq {
        return Err(format!(
            "snapshot holds seq {seq} but its name says {expected_seq}"
        ));
    }
    Ok(&bytes[SNAPSHOT_HEADER_BYTES..body_end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_every_bit_flip_is_caught() {
        let bytes = encode(12, b"state");
        assert_eq!(decode(&bytes, 12), Ok(&b"state"[..]));
        assert!(decode(&bytes, 13).is_err());
        for bit in 0..bytes.len() * 8 {
            let mut mangled = bytes.clone();
            mangled[bit / 8] ^= 1 << (bit % 8);
            assert!(decode(&mangled, 12).is_err(), "bit {bit}");
        }
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut], 12).is_err(), "cut {cut}");
        }
    }
}
