//! Record framing: `len u32 | type u8 | seq u64 | payload | crc u32`, little endian.
//!
//! `len` counts `type + seq + payload` (so it is at least 9 and zero never decodes), and the CRC
//! (CRC-32/ISO-HDLC, as computed by crc32fast) covers every byte before it, `len` included.
//! See docs/wal-format.md.

use std::fmt;

use crate::types::RecordType;

/// Largest payload of one record, enforced when writing and when reading. Generous for the owners'
/// records (a transaction request body is at most `protocol::limits::BODY_BYTES_MAX`, 1 MiB).
pub const RECORD_PAYLOAD_BYTES_MAX: usize = 4 * 1024 * 1024;

/// Bytes of the `len` field.
pub const LEN_BYTES: usize = 4;
/// `len + type + seq`: everything before the payload.
pub const HEADER_BYTES: usize = LEN_BYTES + 1 + 8;
/// The trailing CRC.
pub const CRC_BYTES: usize = 4;
/// Frame size minus payload size.
pub const FRAME_OVERHEAD_BYTES: usize = HEADER_BYTES + CRC_BYTES;
/// Smallest valid `len` (type + seq, empty payload).
pub const LEN_MIN: u32 = 9;
/// Largest valid `len`.
pub const LEN_MAX: u32 = LEN_MIN + RECORD_PAYLOAD_BYTES_MAX as u32;

/// A decoded record borrowing its payload from the buffer it was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameRef<'a> {
    pub seq: u64,
    pub record_type: RecordType,
    pub payload: &'a [u8],
}

impl FrameRef<'_> {
    /// Size of the whole frame on disk.
    pub fn frame_bytes(&self) -> usize {
        FRAME_OVERHEAD_BYTES + self.payload.len()
    }
}

/// Why bytes do not decode as a record. Checked in this order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// Fewer than 4 bytes left: not even a length.
    TruncatedLength { available: usize },
    /// `len` is 0: zero-filled space.
    ZeroLength,
    /// `len` below 9 cannot hold type and sequence number.
    LengthTooSmall { len: u32 },
    /// `len` above the maximum; checked before anything is allocated.
    LengthTooLarge { len: u32, max: u32 },
    /// The frame `len` announces runs past the end of the data.
    Truncated { frame_bytes: u64, available: usize },
    /// The CRC does not match.
    BadCrc { stored: u32, computed: u32 },
    /// CRC matches but the type is 0 or reserved (128..=255): never written by this log.
    BadType { record_type: u8 },
    /// CRC matches but the sequence number is 0: never written by this log.
    ZeroSeq,
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::TruncatedLength { available } => {
                write!(f, "truncated length field ({available} bytes left)")
            }
            FrameError::ZeroLength => write!(f, "zero length (zero-filled space)"),
            FrameError::LengthTooSmall { len } => {
                write!(f, "length {len} is below the minimum of {LEN_MIN}")
            }
            FrameError::LengthTooLarge { len, max } => {
                write!(f, "length {len} exceeds the maximum of {max}")
            }
            FrameError::Truncated {
                frame_bytes,
                available,
            } => write!(
                f,
                "truncated record: frame of {frame_bytes} bytes but only {available} bytes left"
            ),
            FrameError::BadCrc { stored, computed } => write!(
                f,
                "CRC mismatch: stored {stored:#010x}, computed {computed:#010x}"
            ),
            FrameError::BadType { record_type } => {
                write!(f, "invalid record type {record_type}")
            }
            FrameError::ZeroSeq => write!(f, "sequence number 0"),
        }
    }
}

/// Appends one frame to `buf`. The caller has checked the payload size and type; they are asserted
/// here because writing an oversize or reserved record would make the log unreadable.
pub fn encode(buf: &mut Vec<u8>, seq: u64, record_type: RecordType, payload: &[u8]) {
    assert!(
        payload.len() <= RECORD_PAYLOAD_BYTES_MAX,
        "payload over maximum"
    );
    assert!(
        record_type.0 != 0 && seq != 0,
        "type and seq must be non-zero"
    );
    let start = buf.len();
    // LEN_MIN + at most RECORD_PAYLOAD_BYTES_MAX fits in u32 (asserted above).
    let len = LEN_MIN + payload.len() as u32;
    buf.extend_from_slice(&len.to_le_bytes());
    buf.push(record_type.0);
    buf.extend_from_slice(&seq.to_le_bytes());
    buf.extend_from_slice(payload);
    let crc = crc32fast::hash(&buf[start..]);
    buf.extend_from_slice(&crc.to_le_bytes());
}

/// Decodes the frame at the start of `bytes`.
pub fn decode(bytes: &[u8]) -> Result<FrameRef<'_>, FrameError> {
    let Some(len_bytes) = bytes.first_chunk::<LEN_BYTES>() else {
        return Err(FrameError::TruncatedLength {
            available: bytes.len(),
        });
    };
    let len = u32::from_le_bytes(*len_bytes);
    if len == 0 {
        return Err(FrameError::ZeroLength);
    }
    if len < LEN_MIN {
        return Err(FrameError::LengthTooSmall { len });
    }
    if len > LEN_MAX {
        return Err(FrameError::LengthTooLarge { len, max: LEN_MAX });
    }
    let frame_bytes = LEN_BYTES + len as usize + CRC_BYTES;
    if frame_bytes > bytes.len() {
        return Err(FrameError::Truncated {
            frame_bytes: frame_bytes as u64,
            available: bytes.len(),
        });
    }
    let body_end = LEN_BYTES + len as usize;
    let mut stored = [0u8; CRC_BYTES];
    stored.copy_from_slice(&bytes[body_end..frame_bytes]);
    let stored = u32::from_le_bytes(stored);
    let computed = crc32fast::hash(&bytes[..body_end]);
    if stored != computed {
        return Err(FrameError::BadCrc { stored, computed });
    }
    let record_type = RecordType(bytes[LEN_BYTES]);
    let mut seq = [0u8; 8];
    seq.copy_from_slice(&bytes[LEN_BYTES + 1..HEADER_BYTES]);
    let seq = u64::from_le_bytes(seq);
    if !record_type.is_owner_type() {
        return Err(FrameError::BadType {
            record_type: record_type.0,
        });
    }
    if seq == 0 {
        return Err(FrameError::ZeroSeq);
    }
    Ok(FrameRef {
        seq,
        record_type,
        payload: &bytes[HEADER_BYTES..body_end],
    })
}

/// First offset after `from` at which a whole valid frame starts, if any. Used to tell a torn tail
/// (nothing valid follows) from corruption (valid data follows the bad record).
pub fn next_valid_frame(bytes: &[u8], from: usize) -> Option<usize> {
    (from..bytes.len()).find(|&offset| decode(&bytes[offset..]).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc_is_crc32_iso_hdlc() {
        // The standard check value of CRC-32/ISO-HDLC (zlib, PNG, Ethernet), as docs/wal-format.md says.
        assert_eq!(crc32fast::hash(b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn layout_matches_the_documented_table() {
        let mut buf = Vec::new();
        encode(&mut buf, 0x0102_0304_0506_0708, RecordType(9), b"abc");
        assert_eq!(&buf[0..4], &12u32.to_le_bytes(), "len = 1 + 8 + payload");
        assert_eq!(buf[4], 9, "type");
        assert_eq!(&buf[5..13], &0x0102_0304_0506_0708u64.to_le_bytes(), "seq");
        assert_eq!(&buf[13..16], b"abc", "payload");
        assert_eq!(
            &buf[16..20],
            &crc32fast::hash(&buf[..16]).to_le_bytes(),
            "crc over 0..16"
        );
        assert_eq!(buf.len(), FRAME_OVERHEAD_BYTES + 3);
        let frame = decode(&buf).unwrap();
        assert_eq!(
            (frame.seq, frame.record_type, frame.payload),
            (0x0102_0304_0506_0708, RecordType(9), &b"abc"[..])
        );
        assert_eq!(
            decode(&[0u8; 64]),
            Err(FrameError::ZeroLength),
            "zero space never decodes"
        );
    }

    #[test]
    fn valid_crc_but_reserved_type_or_zero_seq_is_refused() {
        let mut buf = Vec::new();
        encode(&mut buf, 5, RecordType(1), b"x");
        let reseal = |mut b: Vec<u8>| {
            let end = b.len() - CRC_BYTES;
            let crc = crc32fast::hash(&b[..end]);
            b[end..].copy_from_slice(&crc.to_le_bytes());
            b
        };
        let mut reserved = buf.clone();
        reserved[4] = 200;
        assert_eq!(
            decode(&reseal(reserved)),
            Err(FrameError::BadType { record_type: 200 })
        );
        let mut zero_seq = buf.clone();
        zero_seq[5..13].fill(0);
        assert_eq!(decode(&reseal(zero_seq)), Err(FrameError::ZeroSeq));
    }
}
