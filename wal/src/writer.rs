//! The writer thread: group commit. It takes everything queued, encodes it into one buffer, does
//! one write and (if any request needs durability) one fdatasync, then resolves the tickets. While
//! it syncs, new requests queue up and form the next batch: no artificial delay for forced
//! appends. The timers are for `Durability::Grouped` appends, which wait at most `group_delay`
//! for a forced append to share their fdatasync before taking one of their own, and for
//! `Durability::Background` ones, which wake nobody and wait at most `background_delay` for a
//! batch to ride in.

use std::mem;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::crash_points::{
    crash_point_before_checkpoint_delete, crash_point_between_write_and_fsync,
    crash_point_roll_after_trim,
};
use crate::error::WalError;
use crate::frame::{self, FRAME_OVERHEAD_BYTES};
use crate::names;
use crate::recovery::Layout;
use crate::shared::{Counters, Request, Shared, Snapshot};
use crate::snapshot;
use crate::storage::{Storage, StorageDir, StorageFile};
use crate::ticket::Completer;
use crate::types::{Durability, RecordType, SyncPolicy, WalOptions};

#[derive(Debug)]
struct Segment {
    base_seq: u64,
    path: PathBuf,
    file: Box<dyn StorageFile>,
    bytes: u64,
    /// Written bytes not yet covered by an fdatasync.
    unsynced: bool,
}

#[derive(Debug)]
pub struct Writer {
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    /// Held from open: every directory sync goes through it (see [`Storage::open_dir`]).
    dir_handle: Box<dyn StorageDir>,
    options: WalOptions,
    shared: Arc<Shared>,
    current: Segment,
    /// Full segments before `current`, as (path, bytes).
    older: Vec<(PathBuf, u64)>,
    snapshot: Option<(PathBuf, u64)>,
    next_seq: u64,
    buf: Vec<u8>,
    /// Appends encoded into `buf` (or written) whose tickets are not resolved yet.
    pending: Vec<(Completer, u64)>,
    pending_forced: bool,
    /// Grouped appends already written, waiting for the next fdatasync.
    grouped: Vec<(Completer, u64)>,
    /// When the oldest of `grouped` was submitted: it gets its fdatasync by `group_delay` after.
    grouped_since: Option<Instant>,
    /// When the writer last took a batch. For `background_delay` after it, the writer waits
    /// with that deadline rather than with none, so the background appends that follow a
    /// batch (a decision's acks) need not wake it to set one.
    last_batch_at: Instant,
    /// Records in `buf`, for the stats.
    unwritten_records: u64,
    /// A deferred checkpoint whose snapshot is being encoded on another thread.
    in_progress: Option<InProgress>,
}

/// A deferred checkpoint between its place in the log and its written snapshot file.
#[derive(Debug)]
struct InProgress {
    covered: u64,
    /// How many of `older` (the first ones) the snapshot makes obsolete; segments rolled
    /// meanwhile hold records after `covered` and stay.
    obsolete: usize,
    completer: Completer,
    /// The thread that encodes and writes the snapshot file. Joined on close, so that no
    /// temporary file appears in the directory after the log let go of it.
    encoder: Option<std::thread::JoinHandle<()>>,
}

impl Writer {
    pub fn new(
        storage: Arc<dyn Storage>,
        dir: PathBuf,
        options: WalOptions,
        shared: Arc<Shared>,
        mut layout: Layout,
    ) -> Result<Writer, WalError> {
        let (base_seq, path, bytes) = layout
            .segments
            .pop()
            .ok_or_else(|| WalError::corrupt(&dir, 0, "no segment to append to"))?;
        let file = storage
            .open_append(&path)
            .map_err(|e| WalError::io("open", &path, e))?;
        let dir_handle = storage
            .open_dir(&dir)
            .map_err(|e| WalError::io("open directory", &dir, e))?;
        let writer = Writer {
            storage,
            dir,
            dir_handle,
            options,
            shared,
            current: Segment {
                base_seq,
                path,
                file,
                bytes,
                unsynced: false,
            },
            older: layout
                .segments
                .into_iter()
                .map(|(_, path, bytes)| (path, bytes))
                .collect(),
            snapshot: layout.snapshot,
            next_seq: layout.next_seq,
            buf: Vec::new(),
            pending: Vec::new(),
            pending_forced: false,
            grouped: Vec::new(),
            grouped_since: None,
            last_batch_at: Instant::now(),
            unwritten_records: 0,
            in_progress: None,
        };
        let counters = &writer.shared.counters;
        Counters::add(&counters.last_seq, layout.next_seq - 1);
        writer.publish_bytes_on_disk();
        Ok(writer)
    }

    /// Runs until the queue is closed and drained.
    pub fn run(mut self) {
        let mut batch = Vec::new();
        loop {
            {
                let mut queue = self.shared.lock_queue();
                while !queue.urgent && !queue.closed {
                    let background_due = queue
                        .background_since
                        .map(|at| at + self.options.background_delay);
                    let grouped_due = self.grouped_since.map(|at| at + self.options.group_delay);
                    let due = match (background_due, grouped_due) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                    // Only a due deadline is a reason to take the queue; the end of the
                    // busy time is only the end of this wait.
                    let busy_until = self.last_batch_at + self.options.background_delay;
                    let wait_until = due.or((Instant::now() < busy_until).then_some(busy_until));
                    let Some(wait_until) = wait_until else {
                        queue.writer_parked = true;
                        queue = self
                            .shared
                            .wake
                            .wait(queue)
                            .unwrap_or_else(|poisoned| poisoned.into_inner());
                        queue.writer_parked = false;
                        continue;
                    };
                    let Some(left) = wait_until.checked_duration_since(Instant::now()) else {
                        if due.is_some() {
                            break;
                        }
                        continue;
                    };
                    queue = self
                        .shared
                        .wake
                        .wait_timeout(queue, left)
                        .map_or_else(|poisoned| poisoned.into_inner().0, |(queue, _)| queue);
                }
                if queue.requests.is_empty() && queue.closed {
                    drop(queue);
                    self.sync_on_close();
                    return;
                }
                queue.take(&mut batch);
            }
            if batch.is_empty() {
                // Nothing forced came within `group_delay`: the grouped appends sync alone,
                // unless the log failed meanwhile (never an fsync after a failure).
                if self.shared.is_poisoned() {
                    self.fail_pending(&self.shared.poisoned_error());
                } else {
                    let _ = self.flush(true);
                }
                continue;
            }
            self.last_batch_at = Instant::now();
            self.process(&mut batch);
            std::thread::yield_now();
        }
    }

    /// A clean shutdown makes lazy records durable too, and trims the segment's zero-filled
    /// space. Never after a failure (no fsync retries).
    fn sync_on_close(&mut self) {
        if let Some(mut in_progress) = self.in_progress.take() {
            if let Some(encoder) = in_progress.encoder.take() {
                // Its result is dropped with the closed queue; a panic there was its own.
                let _ = encoder.join();
            }
            // Its older segments stay, and its file stays temporary: the next start replays
            // the segments and removes the file.
            in_progress.completer.complete(Err(WalError::Closed));
        }
        if !self.shared.is_poisoned() {
            // An error poisons the log and fails whatever still waits.
            let _ = self.flush(true);
        }
        // A log stopped cleanly ends at its last record, zero-filled space given back; if that
        // fails, the next open gives it back instead.
        if !self.shared.is_poisoned()
            && let Err(error) = self.current.file.trim()
        {
            tracing::warn!(file = %self.current.path.display(), %error,
                "the zero-filled space after the log's last record could not be given back on close");
        }
    }

    fn process(&mut self, batch: &mut Vec<Request>) {
        Counters::add(&self.shared.counters.batches, 1);
        for request in batch.drain(..) {
            if self.shared.is_poisoned() {
                let error = self.shared.poisoned_error();
                if let Request::CheckpointEncoded { .. } = request
                    && let Some(in_progress) = self.in_progress.take()
                {
                    in_progress.completer.complete(Err(error));
                    continue;
                }
                request.fail(error);
                continue;
            }
            match request {
                Request::Append {
                    record_type,
                    payload,
                    durability,
                    completer,
                } => self.append(record_type, &payload, durability, completer),
                Request::Checkpoint { completer, .. } if self.in_progress.is_some() => {
                    completer.complete(Err(WalError::CheckpointInProgress));
                }
                Request::Checkpoint {
                    snapshot: Snapshot::Bytes(snapshot),
                    completer,
                } => {
                    let outcome = self.checkpoint(&snapshot);
                    if let Err(error) = &outcome {
                        self.shared.poison(error);
                    }
                    completer.complete(outcome);
                }
                Request::Checkpoint {
                    snapshot: Snapshot::Deferred(encode),
                    completer,
                } => self.begin_deferred(encode, completer),
                Request::CheckpointEncoded { covered, written } => {
                    self.finish_deferred(covered, written);
                }
            }
        }
        let grouped_due = self
            .grouped_since
            .is_some_and(|since| since.elapsed() >= self.options.group_delay);
        let sync = self.pending_forced || grouped_due;
        // An error here has poisoned the log and failed the pending tickets already.
        let _ = self.flush(sync);
    }

    fn append(
        &mut self,
        record_type: RecordType,
        payload: &[u8],
        durability: Durability,
        completer: Completer,
    ) {
        // The last sequence number is never given out: recovery could not name a next one.
        let Some(next_seq) = self.next_seq.checked_add(1) else {
            completer.complete(Err(WalError::SequenceExhausted));
            return;
        };
        let frame_bytes = (FRAME_OVERHEAD_BYTES + payload.len()) as u64;
        let used = self.current.bytes + self.buf.len() as u64;
        if used > 0
            && used + frame_bytes > self.options.segment_bytes_max
            && let Err(error) = self.roll()
        {
            self.fail_pending(&error);
            completer.complete(Err(error));
            return;
        }
        let seq = self.next_seq;
        self.next_seq = next_seq;
        frame::encode(&mut self.buf, seq, record_type, payload);
        self.unwritten_records += 1;
        match (durability, self.options.sync) {
            (Durability::Forced, _) => {
                self.pending.push((completer, seq));
                self.pending_forced = true;
            }
            (Durability::Grouped, SyncPolicy::Fsync) => {
                self.grouped.push((completer, seq));
                self.grouped_since.get_or_insert_with(Instant::now);
            }
            (Durability::Lazy | Durability::Background, _)
            | (Durability::Grouped, SyncPolicy::Never) => {
                self.pending.push((completer, seq));
            }
        }
    }

    /// Writes the buffer, syncs if asked, and resolves the pending tickets either way; the
    /// grouped ones only when synced (every one of them was written before this sync).
    fn flush(&mut self, sync: bool) -> Result<(), WalError> {
        let outcome = self.write_and_sync(sync);
        match &outcome {
            Ok(()) => {
                for (completer, seq) in self.pending.drain(..) {
                    completer.complete(Ok(seq));
                }
                if sync {
                    for (completer, seq) in self.grouped.drain(..) {
                        completer.complete(Ok(seq));
                    }
                    self.grouped_since = None;
                }
            }
            Err(error) => self.fail_pending(error),
        }
        self.pending_forced = false;
        outcome
    }

    fn fail_pending(&mut self, error: &WalError) {
        self.shared.poison(error);
        for (completer, _) in self.pending.drain(..).chain(self.grouped.drain(..)) {
            completer.complete(Err(error.clone()));
        }
        self.pending_forced = false;
        self.grouped_since = None;
    }

    fn write_and_sync(&mut self, sync: bool) -> Result<(), WalError> {
        if !self.buf.is_empty() {
            let path = &self.current.path;
            self.current
                .file
                .append(&self.buf)
                .map_err(|e| WalError::io("write", path, e))?;
            let written = self.buf.len() as u64;
            self.buf.clear();
            self.current.bytes += written;
            self.current.unsynced = true;
            let counters = &self.shared.counters;
            Counters::add(&counters.bytes_written, written);
            Counters::add(&counters.log_bytes_on_disk, written);
            Counters::add(
                &counters.records_appended,
                mem::take(&mut self.unwritten_records),
            );
            counters
                .last_seq
                .store(self.next_seq - 1, Ordering::Relaxed);
            crash_point_between_write_and_fsync()?;
        }
        if sync && self.current.unsynced && self.options.sync == SyncPolicy::Fsync {
            let path = &self.current.path;
            self.current
                .file
                .sync_data()
                .map_err(|e| WalError::io("fdatasync", path, e))?;
            self.current.unsynced = false;
            Counters::add(&self.shared.counters.fsyncs, 1);
        }
        Ok(())
    }

    /// Closes the current segment and starts one at `next_seq`. The old segment is synced first:
    /// a record in the new segment must never survive a crash that loses one before it. It is
    /// closed before the new one is created, so a roll needs no descriptor beyond those the log
    /// holds: it goes through when the process has none left. (If the create fails anyway the
    /// log is poisoned, and the closed segment is never written again.)
    fn roll(&mut self) -> Result<(), WalError> {
        self.write_and_sync(true)?;
        // Only the last segment may end in zeros (the scan refuses them anywhere else).
        self.current
            .file
            .trim()
            .map_err(|e| WalError::io("trim", &self.current.path, e))?;
        crash_point_roll_after_trim()?;
        drop(mem::replace(&mut self.current.file, Box::new(Closed)));
        let path = self.dir.join(names::segment_name(self.next_seq));
        let file = self
            .storage
            .create(&path)
            .map_err(|e| WalError::io("create", &path, e))?;
        self.sync_dir()?;
        let old = mem::replace(
            &mut self.current,
            Segment {
                base_seq: self.next_seq,
                path,
                file,
                bytes: 0,
                unsynced: false,
            },
        );
        self.older.push((old.path, old.bytes));
        Ok(())
    }

    fn sync_dir(&self) -> Result<(), WalError> {
        self.dir_handle
            .sync()
            .map_err(|e| WalError::io("fsync directory", &self.dir, e))?;
        Counters::add(&self.shared.counters.dir_fsyncs, 1);
        Ok(())
    }

    /// The checkpoint, in four steps:
    /// 1. everything submitted so far is made durable;
    /// 2. roll, so that no segment holds records on both sides of the snapshot;
    /// 3. snapshot to a tmp file, fsync, rename, fsync dir (the commit point);
    /// 4. delete older segments and the previous snapshot, fsync dir.
    ///
    /// A crash before step 3 completes recovers the old state, after it the new one (recovery
    /// finishes step 4).
    fn checkpoint(&mut self, snapshot: &[u8]) -> Result<u64, WalError> {
        let covered = self.checkpoint_point()?;
        let obsolete = self.older.len();
        self.write_snapshot(covered, obsolete, snapshot)
    }

    /// Steps 1 and 2: the last sequence number the snapshot will cover.
    fn checkpoint_point(&mut self) -> Result<u64, WalError> {
        self.flush(true)?;
        let covered = self.next_seq - 1;
        if self.current.base_seq != self.next_seq {
            self.roll()?;
        }
        Ok(covered)
    }

    /// A deferred checkpoint: steps 1 and 2 now; the encoding and the temporary file (written
    /// and synced) on a thread of their own, so that appends carry on into the new segment
    /// meanwhile; steps 3 and 4 when it comes back as `CheckpointEncoded`.
    fn begin_deferred(
        &mut self,
        encode: Box<dyn FnOnce() -> Result<Vec<u8>, String> + Send>,
        completer: Completer,
    ) {
        let covered = match self.checkpoint_point() {
            Ok(covered) => covered,
            Err(error) => {
                self.shared.poison(&error);
                completer.complete(Err(error));
                return;
            }
        };
        self.in_progress = Some(InProgress {
            covered,
            obsolete: self.older.len(),
            completer,
            encoder: None,
        });
        let shared = Arc::clone(&self.shared);
        let storage = Arc::clone(&self.storage);
        let tmp = self.dir.join(names::snapshot_tmp_name(covered));
        let spawned = std::thread::Builder::new()
            .name("wal-snapshot".into())
            .spawn(move || {
                let written = encode()
                    .map_err(WalError::SnapshotEncode)
                    .and_then(|payload| {
                        if payload.len() > snapshot::SNAPSHOT_BYTES_MAX {
                            return Err(WalError::SnapshotTooLarge {
                                len: payload.len(),
                                max: snapshot::SNAPSHOT_BYTES_MAX,
                            });
                        }
                        let len = snapshot::write_synced(&*storage, &tmp, covered, &payload)?;
                        Counters::add(&shared.counters.fsyncs, 1);
                        Ok(len)
                    });
                shared.push_internal(Request::CheckpointEncoded { covered, written });
            });
        match spawned {
            Ok(encoder) => {
                if let Some(in_progress) = &mut self.in_progress {
                    in_progress.encoder = Some(encoder);
                }
            }
            Err(error) => self.finish_deferred(
                covered,
                Err(WalError::SnapshotEncode(format!(
                    "cannot start the encoding thread: {error}"
                ))),
            ),
        }
    }

    fn finish_deferred(&mut self, covered: u64, written: Result<u64, WalError>) {
        let Some(in_progress) = self.in_progress.take() else {
            return;
        };
        assert_eq!(
            in_progress.covered, covered,
            "one deferred checkpoint at a time: the written one is the one in progress"
        );
        // Records after `covered` are in segments that stay: nothing to flush first.
        let outcome =
            written.and_then(|len| self.install_snapshot(covered, in_progress.obsolete, len));
        // The owner's failures (nothing was written) leave the log healthy; the disk's do not.
        if let Err(error) = &outcome
            && !matches!(
                error,
                WalError::SnapshotEncode(_) | WalError::SnapshotTooLarge { .. }
            )
        {
            self.shared.poison(error);
        }
        in_progress.completer.complete(outcome);
    }

    /// Steps 3 and 4 on this thread, the snapshot's bytes in hand.
    fn write_snapshot(
        &mut self,
        covered: u64,
        obsolete: usize,
        snapshot: &[u8],
    ) -> Result<u64, WalError> {
        let tmp = self.dir.join(names::snapshot_tmp_name(covered));
        let len = snapshot::write_synced(&*self.storage, &tmp, covered, snapshot)?;
        Counters::add(&self.shared.counters.fsyncs, 1);
        self.install_snapshot(covered, obsolete, len)
    }

    /// Steps 3 and 4: the synced temporary snapshot file covering up to `covered` becomes the
    /// log's start, and the first `obsolete` older segments (all at or before `covered`) go.
    fn install_snapshot(
        &mut self,
        covered: u64,
        obsolete: usize,
        len: u64,
    ) -> Result<u64, WalError> {
        let tmp = self.dir.join(names::snapshot_tmp_name(covered));
        let path = self.dir.join(names::snapshot_name(covered));
        self.storage
            .rename(&tmp, &path)
            .map_err(|e| WalError::io("rename", &tmp, e))?;
        self.sync_dir()?;
        crash_point_before_checkpoint_delete()?;
        let mut obsolete: Vec<PathBuf> = self.older.drain(..obsolete).map(|(p, _)| p).collect();
        let previous = self.snapshot.replace((path.clone(), len));
        if let Some((previous, _)) = previous.filter(|(p, _)| *p != path) {
            obsolete.push(previous);
        }
        for old in &obsolete {
            self.storage
                .remove(old)
                .map_err(|e| WalError::io("remove", old, e))?;
        }
        self.sync_dir()?;
        Counters::add(&self.shared.counters.checkpoints, 1);
        self.publish_bytes_on_disk();
        Ok(covered)
    }

    fn publish_bytes_on_disk(&self) {
        let total = self.current.bytes
            + self.older.iter().map(|(_, b)| b).sum::<u64>()
            + self.snapshot.as_ref().map_or(0, |(_, b)| *b);
        self.shared
            .counters
            .log_bytes_on_disk
            .store(total, Ordering::Relaxed);
    }
}

/// The file of a segment closed by a roll whose create then failed: the log is poisoned by
/// then, so nothing reaches it; if something did, it fails rather than writes.
#[derive(Debug)]
struct Closed;

impl StorageFile for Closed {
    fn append(&mut self, _: &[u8]) -> std::io::Result<()> {
        Err(std::io::Error::other("segment closed by a failed roll"))
    }

    fn sync_data(&mut self) -> std::io::Result<()> {
        Err(std::io::Error::other("segment closed by a failed roll"))
    }
}
