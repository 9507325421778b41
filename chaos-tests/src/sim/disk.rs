//! The durable-state model of one node's log: what the WAL promises and nothing more.
//!
//! Records are appended in order and numbered from 1. A sync makes every record appended so far
//! durable (one fdatasync covers the whole file, lazy records included). A crash keeps the
//! durable records plus, at the scheduler's choice, any prefix of the ones written after them
//! (a process crash keeps the page cache; a power loss does not; a torn last write is cut back
//! to a record boundary by recovery). A checkpoint first syncs everything, then replaces the
//! records with a snapshot, as `Wal::checkpoint` does.

/// One node's log: an optional checkpoint snapshot `S` plus records `R` after it.
#[derive(Debug, Clone)]
pub struct Disk<R, S> {
    snapshot: Option<S>,
    /// Records after the snapshot; `records[i]` has sequence number `first_seq + i`.
    records: Vec<R>,
    first_seq: u64,
    /// Every record with a sequence number up to this is durable.
    durable_seq: u64,
}

impl<R: Clone, S: Clone> Default for Disk<R, S> {
    fn default() -> Self {
        Self::new()
    }
}

impl<R: Clone, S: Clone> Disk<R, S> {
    pub fn new() -> Self {
        Self {
            snapshot: None,
            records: Vec::new(),
            first_seq: 1,
            durable_seq: 0,
        }
    }

    /// Appends a record (not yet durable); returns its sequence number.
    pub fn append(&mut self, record: R) -> u64 {
        self.records.push(record);
        self.last_seq()
    }

    pub fn last_seq(&self) -> u64 {
        self.first_seq + self.records.len() as u64 - 1
    }

    pub fn durable_seq(&self) -> u64 {
        self.durable_seq
    }

    /// Whether everything appended is durable.
    pub fn all_durable(&self) -> bool {
        self.durable_seq >= self.last_seq()
    }

    /// An fdatasync: everything appended so far becomes durable. Returns the records that just
    /// became durable.
    pub fn sync(&mut self) -> Vec<R> {
        let from = self.durable_seq.max(self.first_seq - 1);
        let last = self.last_seq();
        self.durable_seq = last;
        let start = (from + 1 - self.first_seq) as usize;
        self.records[start..].to_vec()
    }

    /// A checkpoint: sync, then the snapshot replaces every record before it.
    pub fn checkpoint(&mut self, snapshot: S) -> Vec<R> {
        let newly = self.sync();
        self.first_seq = self.last_seq() + 1;
        self.records.clear();
        self.snapshot = Some(snapshot);
        newly
    }

    /// A crash: keeps the durable records and the first `extra` records written after them.
    pub fn crash(&mut self, extra: usize) {
        let durable = (self.durable_seq + 1).saturating_sub(self.first_seq) as usize;
        let keep = (durable + extra).min(self.records.len());
        self.records.truncate(keep);
    }

    /// How many records a crash may lose.
    pub fn unsynced(&self) -> usize {
        self.last_seq()
            .saturating_sub(self.durable_seq.max(self.first_seq - 1)) as usize
    }

    pub fn snapshot(&self) -> Option<&S> {
        self.snapshot.as_ref()
    }

    pub fn records(&self) -> &[R] {
        &self.records
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crash_keeps_durable_records_and_a_chosen_prefix_of_the_rest() {
        let mut disk: Disk<u32, ()> = Disk::new();
        disk.append(1);
        disk.append(2);
        assert_eq!(disk.sync(), vec![1, 2]);
        disk.append(3);
        disk.append(4);
        assert_eq!(disk.unsynced(), 2);
        disk.crash(1);
        assert_eq!(disk.records(), &[1, 2, 3]);
        disk.crash(0);
        assert_eq!(disk.records(), &[1, 2]);
    }

    #[test]
    fn checkpoint_syncs_and_replaces_records() {
        let mut disk: Disk<u32, &str> = Disk::new();
        disk.append(1);
        assert_eq!(disk.checkpoint("s"), vec![1]);
        assert!(disk.records().is_empty());
        assert_eq!(disk.append(2), 2);
        disk.crash(0);
        assert_eq!(disk.snapshot(), Some(&"s"));
        assert!(disk.records().is_empty());
        assert_eq!(disk.append(3), 2);
    }
}
