//! The wire encodings of an [`OpBatch`] and a [`BaseBackup`] (tables in `docs/wal-format.md`,
//! "Replication: the file-operation stream"): `magic | version | total length | header fields |
//! body | crc`, little endian, CRC-32 over everything before it.
//!
//! **Must never:** panic or allocate on a length it has not checked against the bytes that
//! arrived; accept a name that is not a plain file name; accept trailing bytes.

use super::{BaseBackup, FileOp, OpBatch, valid_name};

/// Identifies an encoded op batch.
pub const BATCH_MAGIC: &[u8; 8] = b"TWPCOPSB";
/// Identifies an encoded base backup.
pub const BACKUP_MAGIC: &[u8; 8] = b"TWPCBASE";
/// The one format version of both encodings.
pub const VERSION: u32 = 1;
/// magic 8, version 4, total length 8, first/next op 8, count 4.
pub const HEADER_BYTES: usize = 8 + 4 + 8 + 8 + 4;
pub const CRC_BYTES: usize = 4;
/// Longest file name (Linux's NAME_MAX).
pub const NAME_BYTES_MAX: usize = 255;
/// Most bytes one `Append` op carries: the storage splits longer appends into several ops.
pub const APPEND_BYTES_MAX: usize = 8 * 1024 * 1024;
/// Once the recorded ops encode to this many bytes, the storage ships them without waiting for
/// a sync point, so no batch grows past [`BATCH_BYTES_MAX`].
pub const PENDING_BYTES_MAX: usize = 64 * 1024 * 1024;
/// Largest encoded batch accepted: the pending bound plus one op of the largest kind (and
/// slack for the header).
pub const BATCH_BYTES_MAX: usize = PENDING_BYTES_MAX + APPEND_BYTES_MAX + 64 * 1024;

const TAG_CREATE: u8 = 1;
const TAG_APPEND: u8 = 2;
const TAG_TRUNCATE: u8 = 3;
const TAG_RENAME: u8 = 4;
const TAG_REMOVE: u8 = 5;

const BATCH: &str = "op batch";
const BACKUP: &str = "base backup";

/// Why bytes do not decode as an op batch or a base backup.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MirrorError {
    #[error("{what} of {len} bytes is shorter than its header and checksum ({min} bytes)")]
    TooShort {
        what: &'static str,
        len: usize,
        min: usize,
    },
    #[error("{what} does not start with its magic")]
    BadMagic { what: &'static str },
    #[error("{what} has format version {version}; this build reads version {VERSION}")]
    UnsupportedVersion { what: &'static str, version: u32 },
    #[error("{what} says it is {stated} bytes long but {actual} bytes arrived")]
    LengthMismatch {
        what: &'static str,
        stated: u64,
        actual: usize,
    },
    #[error("{what} of {len} bytes exceeds the maximum of {max} bytes")]
    TooLarge {
        what: &'static str,
        len: u64,
        max: usize,
    },
    #[error("{what} CRC mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    CrcMismatch {
        what: &'static str,
        stored: u32,
        computed: u32,
    },
    /// The CRC matched but the content breaks a rule: only a different (or broken) encoder
    /// makes this.
    #[error("{what} is malformed at offset {offset}: {reason}")]
    Malformed {
        what: &'static str,
        offset: usize,
        reason: String,
    },
}

/// Bytes `op` adds to an encoded batch: what the storage counts against [`PENDING_BYTES_MAX`].
pub(crate) fn op_bytes(op: &FileOp) -> usize {
    let name = |n: &str| 2 + n.len();
    1 + match op {
        FileOp::Create { name: n } | FileOp::Remove { name: n } => name(n),
        FileOp::Append { name: n, bytes } => name(n) + 4 + bytes.len(),
        FileOp::Truncate { name: n, .. } => name(n) + 8,
        FileOp::Rename { from, to } => name(from) + name(to),
    }
}

impl OpBatch {
    /// The wire form. A batch made by [`super::MirroredStorage`] always decodes; one built by
    /// hand with longer names or appends than the bounds above encodes, but is refused by
    /// [`OpBatch::decode`].
    pub fn encode(&self) -> Vec<u8> {
        let body: usize = self.ops.iter().map(op_bytes).sum();
        let mut out = header(BATCH_MAGIC, body, self.first, self.ops.len());
        for op in &self.ops {
            match op {
                FileOp::Create { name } => {
                    out.push(TAG_CREATE);
                    put_name(&mut out, name);
                }
                FileOp::Append { name, bytes } => {
                    out.push(TAG_APPEND);
                    put_name(&mut out, name);
                    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
                    out.extend_from_slice(bytes);
                }
                FileOp::Truncate { name, len } => {
                    out.push(TAG_TRUNCATE);
                    put_name(&mut out, name);
                    out.extend_from_slice(&len.to_le_bytes());
                }
                FileOp::Rename { from, to } => {
                    out.push(TAG_RENAME);
                    put_name(&mut out, from);
                    put_name(&mut out, to);
                }
                FileOp::Remove { name } => {
                    out.push(TAG_REMOVE);
                    put_name(&mut out, name);
                }
            }
        }
        finish(out)
    }

    /// Checks length, magic, version and CRC before reading any field, then every name, length
    /// and count against the bytes that are there.
    pub fn decode(bytes: &[u8]) -> Result<OpBatch, MirrorError> {
        let (mut reader, first, count) = open(bytes, BATCH, BATCH_MAGIC, Some(BATCH_BYTES_MAX))?;
        if first == 0 {
            return Err(reader.malformed(HEADER_BYTES - 12, "op numbers start at 1"));
        }
        if first.checked_add(u64::from(count)).is_none() {
            return Err(reader.malformed(HEADER_BYTES - 12, "op numbers overflow"));
        }
        // No capacity from `count`: each op is pushed once its bytes were read.
        let mut ops = Vec::new();
        for _ in 0..count {
            let at = reader.pos;
            let op = match reader.u8()? {
                TAG_CREATE => FileOp::Create {
                    name: reader.name()?,
                },
                TAG_APPEND => {
                    let name = reader.name()?;
                    let len = reader.u32()? as usize;
                    if len > APPEND_BYTES_MAX {
                        return Err(reader.malformed(
                            reader.pos - 4,
                            format!("append of {len} bytes exceeds {APPEND_BYTES_MAX}"),
                        ));
                    }
                    let bytes = reader.take(len)?.to_vec();
                    FileOp::Append { name, bytes }
                }
                TAG_TRUNCATE => FileOp::Truncate {
                    name: reader.name()?,
                    len: reader.u64()?,
                },
                TAG_RENAME => FileOp::Rename {
                    from: reader.name()?,
                    to: reader.name()?,
                },
                TAG_REMOVE => FileOp::Remove {
                    name: reader.name()?,
                },
                tag => return Err(reader.malformed(at, format!("unknown op tag {tag}"))),
            };
            ops.push(op);
        }
        reader.end()?;
        Ok(OpBatch { first, ops })
    }
}

impl BaseBackup {
    /// The wire form (no size limit: a backup is as large as the log directory).
    pub fn encode(&self) -> Vec<u8> {
        let body: usize = self
            .files
            .iter()
            .map(|(name, bytes)| 2 + name.len() + 8 + bytes.len())
            .sum();
        let mut out = header(BACKUP_MAGIC, body, self.next_op, self.files.len());
        for (name, bytes) in &self.files {
            put_name(&mut out, name);
            out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
            out.extend_from_slice(bytes);
        }
        finish(out)
    }

    /// As [`OpBatch::decode`].
    pub fn decode(bytes: &[u8]) -> Result<BaseBackup, MirrorError> {
        let (mut reader, next_op, count) = open(bytes, BACKUP, BACKUP_MAGIC, None)?;
        if next_op == 0 {
            return Err(reader.malformed(HEADER_BYTES - 12, "op numbers start at 1"));
        }
        let mut files = Vec::new();
        for _ in 0..count {
            let name = reader.name()?;
            let at = reader.pos;
            let len = usize::try_from(reader.u64()?)
                .map_err(|_| reader.malformed(at, "file length does not fit in memory"))?;
            files.push((name, reader.take(len)?.to_vec()));
        }
        reader.end()?;
        Ok(BaseBackup { next_op, files })
    }
}

fn header(magic: &[u8; 8], body: usize, number: u64, count: usize) -> Vec<u8> {
    let total = HEADER_BYTES + body + CRC_BYTES;
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(magic);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(total as u64).to_le_bytes());
    out.extend_from_slice(&number.to_le_bytes());
    out.extend_from_slice(&(count as u32).to_le_bytes());
    out
}

fn put_name(out: &mut Vec<u8>, name: &str) {
    out.extend_from_slice(&(name.len() as u16).to_le_bytes());
    out.extend_from_slice(name.as_bytes());
}

fn finish(mut out: Vec<u8>) -> Vec<u8> {
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Checks the frame (length, magic, version, total length, CRC) and returns a reader over the
/// body with the header's number and count.
fn open<'a>(
    bytes: &'a [u8],
    what: &'static str,
    magic: &[u8; 8],
    max: Option<usize>,
) -> Result<(Reader<'a>, u64, u32), MirrorError> {
    let min = HEADER_BYTES + CRC_BYTES;
    if bytes.len() < min {
        return Err(MirrorError::TooShort {
            what,
            len: bytes.len(),
            min,
        });
    }
    let mut reader = Reader {
        bytes: &bytes[..bytes.len() - CRC_BYTES],
        pos: 0,
        what,
    };
    if reader.take(8)? != magic {
        return Err(MirrorError::BadMagic { what });
    }
    let version = reader.u32()?;
    if version != VERSION {
        return Err(MirrorError::UnsupportedVersion { what, version });
    }
    let stated = reader.u64()?;
    if let Some(max) = max
        && stated > max as u64
    {
        return Err(MirrorError::TooLarge {
            what,
            len: stated,
            max,
        });
    }
    if stated != bytes.len() as u64 {
        return Err(MirrorError::LengthMismatch {
            what,
            stated,
            actual: bytes.len(),
        });
    }
    let body_end = bytes.len() - CRC_BYTES;
    let mut stored = [0u8; 4];
    stored.copy_from_slice(&bytes[body_end..]);
    let stored = u32::from_le_bytes(stored);
    let computed = crc32fast::hash(&bytes[..body_end]);
    if stored != computed {
        return Err(MirrorError::CrcMismatch {
            what,
            stored,
            computed,
        });
    }
    let number = reader.u64()?;
    let count = reader.u32()?;
    Ok((reader, number, count))
}

/// A cursor over the bytes before the CRC; every read is checked against what is left.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    fn malformed(&self, offset: usize, reason: impl Into<String>) -> MirrorError {
        MirrorError::Malformed {
            what: self.what,
            offset,
            reason: reason.into(),
        }
    }

    fn take(&mut self, len: usize) -> Result<&'a [u8], MirrorError> {
        let left = self.bytes.len() - self.pos;
        if len > left {
            return Err(
                self.malformed(self.pos, format!("{len} bytes needed but only {left} left"))
            );
        }
        let bytes = &self.bytes[self.pos..self.pos + len];
        self.pos += len;
        Ok(bytes)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], MirrorError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, MirrorError> {
        Ok(self.array::<1>()?[0])
    }

    fn u32(&mut self) -> Result<u32, MirrorError> {
        self.array().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, MirrorError> {
        self.array().map(u64::from_le_bytes)
    }

    fn name(&mut self) -> Result<String, MirrorError> {
        let at = self.pos;
        let len = usize::from(u16::from_le_bytes(self.array()?));
        if len > NAME_BYTES_MAX {
            return Err(self.malformed(at, format!("file name of {len} bytes")));
        }
        let bytes = self.take(len)?;
        match std::str::from_utf8(bytes) {
            Ok(name) if valid_name(name) => Ok(name.to_string()),
            _ => Err(self.malformed(at, format!("not a plain file name: {bytes:?}"))),
        }
    }

    fn end(&self) -> Result<(), MirrorError> {
        if self.pos == self.bytes.len() {
            Ok(())
        } else {
            Err(self.malformed(self.pos, "trailing bytes after the last entry"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> OpBatch {
        OpBatch {
            first: 7,
            ops: vec![
                FileOp::Create {
                    name: "a.wal".into(),
                },
                FileOp::Append {
                    name: "a.wal".into(),
                    bytes: b"hello".to_vec(),
                },
                FileOp::Truncate {
                    name: "a.wal".into(),
                    len: 3,
                },
                FileOp::Rename {
                    from: "a.wal".into(),
                    to: "b.wal".into(),
                },
                FileOp::Remove {
                    name: "b.wal".into(),
                },
            ],
        }
    }

    #[test]
    fn encoded_length_is_what_the_storage_counts() {
        let batch = sample();
        let body: usize = batch.ops.iter().map(op_bytes).sum();
        assert_eq!(batch.encode().len(), HEADER_BYTES + body + CRC_BYTES);
    }

    /// Re-signs `bytes` after editing them, so the checks behind the CRC are reached.
    fn resign(mut bytes: Vec<u8>) -> Vec<u8> {
        let end = bytes.len() - CRC_BYTES;
        let crc = crc32fast::hash(&bytes[..end]);
        bytes[end..].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    #[test]
    fn content_checks_behind_a_valid_crc() {
        let valid = sample().encode();
        // A name of `..`: the first op's name starts after the header and its tag.
        let mut bad_name = valid.clone();
        let at = HEADER_BYTES + 1;
        bad_name[at..at + 2].copy_from_slice(&2u16.to_le_bytes());
        bad_name[at + 2..at + 4].copy_from_slice(b"..");
        let refused = OpBatch::decode(&resign(bad_name));
        assert!(
            matches!(refused, Err(MirrorError::Malformed { .. })),
            "{refused:?}"
        );
        // An absurd op count is refused by the bytes left, not by an allocation.
        let mut many = valid.clone();
        many[HEADER_BYTES - 4..HEADER_BYTES].copy_from_slice(&u32::MAX.to_le_bytes());
        let refused = OpBatch::decode(&resign(many));
        assert!(
            matches!(refused, Err(MirrorError::Malformed { .. })),
            "{refused:?}"
        );
        // An unknown tag.
        let mut tag = valid.clone();
        tag[HEADER_BYTES] = 9;
        let refused = OpBatch::decode(&resign(tag)).unwrap_err();
        assert!(
            refused.to_string().contains("unknown op tag 9"),
            "{refused}"
        );
        // First op number 0.
        let mut zero = valid;
        zero[20..28].copy_from_slice(&0u64.to_le_bytes());
        assert!(OpBatch::decode(&resign(zero)).is_err());
        // A total length above the batch maximum is refused as such.
        let mut huge = sample().encode();
        huge[12..20].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            OpBatch::decode(&huge),
            Err(MirrorError::TooLarge { .. })
        ));
    }
}
