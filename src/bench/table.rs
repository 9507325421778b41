//! The rows `twopc bench` prints (and writes with `--json`): a cell per participant count and
//! concurrency, with its two references (the durability-off baseline and the HTTP floor), and
//! the hot-key cells.

use serde::Serialize;

/// One row of the table.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    pub participants: usize,
    pub concurrency: usize,
    pub committed_per_s: f64,
    pub failed: u64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub p999_ms: Option<f64>,
    pub baseline_per_s: Option<f64>,
    /// committed_per_s / baseline_per_s.
    pub ratio: Option<f64>,
    /// The same exchanges through a relay and leaves that do nothing else (see `floor`).
    pub floor_per_s: Option<f64>,
    /// committed_per_s / floor_per_s.
    pub share_of_floor: Option<f64>,
    /// CPU time (user + system) of the bench's client and every server of the durable cluster
    /// during the cell, per transaction committed in it (warm-up included on both sides).
    /// `None` against `--target-coordinator` or where `/proc` is not there.
    pub cpu_us_per_tx: Option<f64>,
    /// The same for the durability-off baseline's run of the cell (its client and servers).
    pub baseline_cpu_us_per_tx: Option<f64>,
    /// The same for the HTTP floor's run of the cell (its client, relay and leaves): what the
    /// same exchanges cost with nothing else to do.
    pub floor_cpu_us_per_tx: Option<f64>,
    /// Median raw `write + fdatasync` of one record on the logs' disk, measured just before
    /// the cell (own cluster only): what a single forced log write cannot beat.
    pub disk_fsync_p50_us: Option<f64>,
    /// The same through a log segment zero-filled ahead (`wal::PreallocatedStorage`), as the
    /// logs write: an fdatasync that does not grow the file.
    pub disk_fsync_preallocated_p50_us: Option<f64>,
    /// fsyncs by the coordinator and participants, per committed transaction.
    pub fsyncs_per_tx: Option<f64>,
}

/// A hot-key cell: every transaction writes one key at each participant.
#[derive(Debug, Clone, Serialize)]
pub struct HotCell {
    pub participants: usize,
    pub concurrency: usize,
    pub committed_per_s: f64,
    /// Answered transactions that did not commit (aborted, or no valid answer), of all answered.
    pub abort_rate: Option<f64>,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
}

pub fn print_hot_table(cells: &[HotCell]) {
    let f = |v: Option<f64>, digits: usize| v.map_or("-".to_string(), |v| format!("{v:.digits$}"));
    println!();
    println!("hot key (every transaction writes the same key at each participant):");
    println!(
        "{:>5} {:>5} {:>8} {:>8} {:>7} {:>7}",
        "parts", "conc", "tx/s", "aborts", "p50 ms", "p99 ms"
    );
    for c in cells {
        println!(
            "{:>5} {:>5} {:>8.0} {:>7}% {:>7} {:>7}",
            c.participants,
            c.concurrency,
            c.committed_per_s,
            f(c.abort_rate.map(|r| r * 100.0), 1),
            f(c.p50_ms, 2),
            f(c.p99_ms, 2)
        );
    }
}

pub fn print_table(cells: &[Cell]) {
    let f = |v: Option<f64>, digits: usize| v.map_or("-".to_string(), |v| format!("{v:.digits$}"));
    println!(
        "{:>5} {:>5} {:>8} {:>7} {:>7} {:>8} {:>9} {:>5} {:>10} {:>6} {:>9} {:>8} {:>6} {:>9} {:>8} {:>9} {:>6}",
        "parts",
        "conc",
        "tx/s",
        "p50 ms",
        "p99 ms",
        "p999 ms",
        "base tx/s",
        "ratio",
        "floor tx/s",
        "share",
        "fsyncs/tx",
        "fsync us",
        "pre us",
        "CPU us/tx",
        "base CPU",
        "floor CPU",
        "failed"
    );
    for c in cells {
        println!(
            "{:>5} {:>5} {:>8.0} {:>7} {:>7} {:>8} {:>9} {:>5} {:>10} {:>6} {:>9} {:>8} {:>6} {:>9} {:>8} {:>9} {:>6}",
            c.participants,
            c.concurrency,
            c.committed_per_s,
            f(c.p50_ms, 2),
            f(c.p99_ms, 2),
            f(c.p999_ms, 2),
            f(c.baseline_per_s, 0),
            f(c.ratio, 2),
            f(c.floor_per_s, 0),
            f(c.share_of_floor, 2),
            f(c.fsyncs_per_tx, 2),
            f(c.disk_fsync_p50_us, 0),
            f(c.disk_fsync_preallocated_p50_us, 0),
            f(c.cpu_us_per_tx, 0),
            f(c.baseline_cpu_us_per_tx, 0),
            f(c.floor_cpu_us_per_tx, 0),
            c.failed
        );
    }
}
