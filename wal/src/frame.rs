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

/// First offset after `from` at which a whole valid frame starts, if any.
pub fn next_valid_frame(bytes: &[u8], from: usize) -> Option<usize> {
    (from..bytes.len()).find(|&offset| decode(&bytes[offset..]).is_ok())
}

/// What a frame that does not decode, found in the last segment, is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TailVerdict {
    /// What a crash mid-write leaves; opening cuts the segment at the frame.
    Torn,
    /// Damage no torn write explains; the log must refuse to open.
    Corrupt {
        /// The full reason: the decode error and why it is not a torn write.
        reason: String,
    },
}

/// Judges the frame at `offset` of the last segment, which failed to decode with `error`.
///
/// A crash mid-write leaves a prefix of what was written, possibly followed by zeros (the file
/// grew but the data never reached the disk). So the frame is torn only if it is incomplete
/// (fewer bytes left than a header, or a length within `LEN_MIN..=LEN_MAX` running past the end),
/// if it is zero-filled space up to the end, or if it is complete with a failing CRC and nothing
/// but zeros after it; and, in every case, no valid frame starts at a later byte. Everything else
/// (an impossible length, a record whose CRC matches but whose type or seq no writer of this log
/// produces, a bad frame with non-zero bytes after it) is corruption: truncating it could drop a
/// record that was fsynced and acknowledged, such as a commit decision, and presumed abort would
/// then contradict what the client was told.
pub fn judge_last_segment_tail(bytes: &[u8], offset: usize, error: &FrameError) -> TailVerdict {
    let rest = bytes.get(offset..).unwrap_or_default();
    let explained_by_a_tear = match error {
        // No record, however damaged, is shorter than a header: cutting these bytes cannot drop
        // one that was ever complete, and a crash inside the header write leaves exactly this.
        _ if rest.len() < HEADER_BYTES => true,
        FrameError::TruncatedLength { .. } | FrameError::Truncated { .. } => true,
        FrameError::ZeroLength => first_non_zero(rest, 0).is_none(),
        FrameError::BadCrc { .. } => first_non_zero(rest, declared_frame_bytes(rest)).is_none(),
        FrameError::LengthTooSmall { .. }
        | FrameError::LengthTooLarge { .. }
        | FrameError::BadType { .. }
        | FrameError::ZeroSeq => false,
    };
    // Still checked for a frame a tear could explain: a flipped length in a record before the
    // last one can make it run past the end of the file, and the intact records after it are
    // the only sign that they were written and must not be cut. A frame's length has a non-zero
    // byte, so no frame starts more than 3 bytes before the first non-zero byte: a long zero tail
    // is not searched byte by byte.
    let valid_after = first_non_zero(rest, 0).and_then(|at| {
        let from = at.saturating_sub(LEN_BYTES - 1).max(1);
        next_valid_frame(bytes, offset + from)
    });
    if explained_by_a_tear && valid_after.is_none() {
        return TailVerdict::Torn;
    }
    let why = if let Some(valid) = valid_after {
        format!(", and a valid record follows at offset {valid}")
    } else {
        match error {
            FrameError::ZeroLength => first_non_zero(rest, 0).map_or_else(String::new, |at| {
                format!(", and non-zero bytes follow at offset {}", offset + at)
            }),
            FrameError::BadCrc { .. } => first_non_zero(rest, declared_frame_bytes(rest))
                .map_or_else(String::new, |at| {
                    format!(
                        ", and non-zero bytes follow the frame at offset {}",
                        offset + at
                    )
                }),
            FrameError::BadType { .. } | FrameError::ZeroSeq => {
                " under a matching CRC, which a torn write cannot leave".to_owned()
            }
            _ => ", which a torn write cannot leave".to_owned(),
        }
    };
    TailVerdict::Corrupt {
        reason: format!("{error}{why}"),
    }
}

/// Frame size announced by the `len` at the start of `bytes` (0 if there is no `len`).
fn declared_frame_bytes(bytes: &[u8]) -> usize {
    bytes.first_chunk::<LEN_BYTES>().map_or(0, |len| {
        (u32::from_le_bytes(*len) as usize).saturating_add(LEN_BYTES + CRC_BYTES)
    })
}

/// Whether `bytes` hold nothing but zeros (the space a preallocated segment holds past its last
/// record; see `crate::preallocated`).
pub(crate) fn is_zero_filled(bytes: &[u8]) -> bool {
    first_non_zero(bytes, 0).is_none()
}

/// Index of the first non-zero byte of `bytes` at or after `from`.
fn first_non_zero(bytes: &[u8], from: usize) -> Option<usize> {
    let tail = bytes.get(from..)?;
    tail.iter().position(|&b| b != 0).map(|at| from + at)
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

    #[test]
    fn tail_verdicts_at_the_edges_of_the_rule() {
        let judge = |bytes: &[u8]| {
            let error = decode(bytes).unwrap_err();
            judge_last_segment_tail(bytes, 0, &error)
        };
        // Fewer bytes than a header: whatever the length says, no complete record was there.
        assert_eq!(judge(&[0xff; HEADER_BYTES - 1]), TailVerdict::Torn);
        assert_eq!(judge(&[0, 0, 0, 0, 7]), TailVerdict::Torn);
        // From a whole header on, an impossible length is corruption even with zeros after it.
        let mut small = 5u32.to_le_bytes().to_vec();
        small.resize(64, 0);
        assert_eq!(
            judge(&small),
            TailVerdict::Corrupt {
                reason: "length 5 is below the minimum of 9, which a torn write cannot leave"
                    .into()
            }
        );
        // A matching CRC over a reserved type was written that way: never torn.
        let mut reserved = Vec::new();
        encode(&mut reserved, 5, RecordType(1), b"x");
        reserved[4] = 200;
        let end = reserved.len() - CRC_BYTES;
        let crc = crc32fast::hash(&reserved[..end]);
        reserved[end..].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(
            judge(&reserved),
            TailVerdict::Corrupt {
                reason:
                    "invalid record type 200 under a matching CRC, which a torn write cannot leave"
                        .into()
            }
        );
        // Complete frame, bad CRC: torn with zeros or nothing after, corrupt with data after.
        let mut flipped = Vec::new();
        encode(&mut flipped, 5, RecordType(1), b"xyz");
        flipped[14] ^= 1;
        assert_eq!(judge(&flipped), TailVerdict::Torn);
        let zeros = [flipped.clone(), vec![0; 100]].concat();
        assert_eq!(judge(&zeros), TailVerdict::Torn);
        let mut trailing = zeros.clone();
        trailing[flipped.len() + 50] = 1;
        match judge(&trailing) {
            TailVerdict::Corrupt { reason } => assert!(
                reason.ends_with(&format!(
                    ", and non-zero bytes follow the frame at offset {}",
                    flipped.len() + 50
                )),
                "{reason}"
            ),
            TailVerdict::Torn => panic!("non-zero bytes after a bad frame must be corruption"),
        }
    }
}
