//! A log of owner records (the coordinator's or a participant's) from arbitrary bytes: an
//! optional checkpoint snapshot and records, framed by the harness with valid CRCs and
//! consecutive sequence numbers, so the fuzzer works on what the owner decodes (the JSON
//! payloads and the type bytes), not on the checksum.
//!
//! ```text
//! input   := snapshot? record*
//! snapshot:= present u8 (odd: there is one) | payload bytes
//! record  := type u8 (taken as 1 + type % 127, an owner type) | payload bytes
//! ```

use std::path::Path;

use wal::sim::SimStorage;

use crate::input::{Reader, Writer};
use crate::wal_log::{Kind, frame};

const RECORDS_MAX: usize = 64;

/// The decoded input.
#[derive(Debug, Clone, Default)]
pub struct RecordLog {
    pub snapshot: Option<Vec<u8>>,
    pub records: Vec<(u8, Vec<u8>)>,
}

impl RecordLog {
    pub fn read(input: &[u8]) -> RecordLog {
        let mut r = Reader::new(input);
        let snapshot = (r.u8() % 2 == 1).then(|| r.bytes().to_vec());
        let mut records = Vec::new();
        while !r.is_empty() && records.len() < RECORDS_MAX {
            let record_type = 1 + r.u8() % 127;
            records.push((record_type, r.bytes().to_vec()));
        }
        RecordLog { snapshot, records }
    }

    /// The bytes [`RecordLog::read`] reads back as `self` (seed generation).
    pub fn write(&self) -> Vec<u8> {
        let mut w = Writer::default();
        match &self.snapshot {
            Some(payload) => w.u8(1).bytes(payload),
            None => w.u8(0),
        };
        for (record_type, payload) in &self.records {
            w.u8(record_type - 1).bytes(payload);
        }
        w.bytes
    }

    /// The log directory: `snapshot-1` and a segment from seq 2 on, or a segment from seq 1.
    pub fn load(&self, dir: &Path) -> SimStorage {
        let sim = SimStorage::new();
        let first = match &self.snapshot {
            Some(payload) => {
                sim.set_contents(
                    &dir.join(Kind::Snapshot.file_name(1)),
                    wal::encode_snapshot(1, payload),
                );
                2
            }
            None => 1,
        };
        let mut segment = Vec::new();
        for (index, (record_type, payload)) in self.records.iter().enumerate() {
            segment.extend(frame(*record_type, first + index as u64, payload));
        }
        if self.snapshot.is_some() || !self.records.is_empty() {
            sim.set_contents(&dir.join(Kind::Segment.file_name(first)), segment);
        }
        sim
    }
}
