//! File names in a log directory. Sequence numbers are zero-padded to 20 digits so that names
//! sort in log order.

use std::path::{Path, PathBuf};

const SEGMENT_SUFFIX: &str = ".wal";
const SNAPSHOT_PREFIX: &str = "snapshot-";
const SNAPSHOT_SUFFIX: &str = ".snap";
/// Suffix of a snapshot being written; such a file is an unfinished checkpoint and is deleted on open.
pub const TMP_SUFFIX: &str = ".tmp";
const SEQ_DIGITS: usize = 20;

/// What a file in the log directory is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileKind {
    /// `<first seq>.wal`
    Segment { base_seq: u64 },
    /// `snapshot-<last seq covered>.snap`
    Snapshot { seq: u64 },
    /// `*.tmp`: an unfinished snapshot.
    Tmp,
    /// Anything else (`*.broken` copies of torn tails, operator files): left alone.
    Other,
}

pub fn segment_name(base_seq: u64) -> String {
    format!("{base_seq:020}{SEGMENT_SUFFIX}")
}

pub fn snapshot_name(seq: u64) -> String {
    format!("{SNAPSHOT_PREFIX}{seq:020}{SNAPSHOT_SUFFIX}")
}

pub fn snapshot_tmp_name(seq: u64) -> String {
    format!("{}{TMP_SUFFIX}", snapshot_name(seq))
}

/// `<segment name>.<offset>.broken`: the bytes cut off a torn tail.
pub fn broken_path(segment: &Path, offset: u64) -> PathBuf {
    let mut name = segment.as_os_str().to_owned();
    name.push(format!(".{offset}.broken"));
    PathBuf::from(name)
}

fn parse_seq(digits: &str) -> Option<u64> {
    if digits.len() == SEQ_DIGITS && digits.bytes().all(|b| b.is_ascii_digit()) {
        digits.parse().ok()
    } else {
        None
    }
}

pub fn classify(name: &str) -> FileKind {
    if name.ends_with(TMP_SUFFIX) {
        return FileKind::Tmp;
    }
    if let Some(base_seq) = name.strip_suffix(SEGMENT_SUFFIX).and_then(parse_seq) {
        return FileKind::Segment { base_seq };
    }
    if let Some(seq) = name
        .strip_prefix(SNAPSHOT_PREFIX)
        .and_then(|rest| rest.strip_suffix(SNAPSHOT_SUFFIX))
        .and_then(parse_seq)
    {
        return FileKind::Snapshot { seq };
    }
    FileKind::Other
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_sort_in_log_order() {
        assert_eq!(segment_name(1), "00000000000000000001.wal");
        assert_eq!(
            classify(&segment_name(42)),
            FileKind::Segment { base_seq: 42 }
        );
        assert_eq!(classify(&snapshot_name(7)), FileKind::Snapshot { seq: 7 });
        assert_eq!(classify(&snapshot_tmp_name(7)), FileKind::Tmp);
        assert_eq!(
            classify("00000000000000000001.wal.0.broken"),
            FileKind::Other
        );
        assert_eq!(classify("1.wal"), FileKind::Other);
        assert!(segment_name(9) < segment_name(10));
    }
}
