//! Group-commit benchmark: durable appends of 256-byte records at 1, 16 and 64 concurrent
//! appenders, against a raw `write + fdatasync` loop measured in the same run on the same disk.
//!
//! `cargo run --release -p twopc-wal --example wal_bench`
//! Env: `WAL_BENCH_DIR` (default: the system temp dir; must be a real disk, not tmpfs),
//! `WAL_BENCH_SECS` (seconds per measurement round, default 0.5), `WAL_BENCH_ROUNDS` (default 7;
//! the median round is reported). Short alternating rounds keep a shared, noisy disk fair to both.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use wal::format::FRAME_OVERHEAD_BYTES;
use wal::{Durability, RecordType, SyncPolicy, Wal, WalOptions};

const RECORD_BYTES: usize = 256;

#[derive(Debug, Clone, Copy)]
struct Figures {
    per_sec: f64,
    p50_us: f64,
    p99_us: f64,
    fsyncs: u64,
    records: u64,
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index].as_secs_f64() * 1e6
}

fn figures(mut latencies: Vec<Duration>, elapsed: Duration, fsyncs: u64) -> Figures {
    latencies.sort_unstable();
    Figures {
        per_sec: latencies.len() as f64 / elapsed.as_secs_f64(),
        p50_us: percentile(&latencies, 0.50),
        p99_us: percentile(&latencies, 0.99),
        fsyncs,
        records: latencies.len() as u64,
    }
}

/// The floor: one record-sized write and one fdatasync at a time, no framing, no threads.
fn raw_loop(dir: &Path, run_for: Duration) -> Figures {
    let path = dir.join("raw.bin");
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .expect("raw file");
    let record = vec![0xA5u8; RECORD_BYTES + FRAME_OVERHEAD_BYTES];
    let mut latencies = Vec::new();
    let start = Instant::now();
    while start.elapsed() < run_for {
        let t = Instant::now();
        file.write_all(&record).expect("write");
        file.sync_data().expect("fdatasync");
        latencies.push(t.elapsed());
    }
    let elapsed = start.elapsed();
    let fsyncs = latencies.len() as u64;
    drop(file);
    let _ = std::fs::remove_file(&path);
    figures(latencies, elapsed, fsyncs)
}

fn wal_run(dir: &Path, appenders: usize, sync: SyncPolicy, run_for: Duration) -> Figures {
    let log_dir = dir.join(format!("wal-{appenders}-{sync:?}"));
    let _ = std::fs::remove_dir_all(&log_dir);
    let (log, _) = Wal::open(
        &log_dir,
        WalOptions {
            sync,
            ..WalOptions::default()
        },
    )
    .expect("open");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let fsyncs_before = log.stats().fsyncs;
    let (latencies, elapsed) = runtime.block_on(async {
        let start = Instant::now();
        let tasks: Vec<_> = (0..appenders)
            .map(|_| {
                let log = log.clone();
                tokio::spawn(async move {
                    let payload = vec![0x5Au8; RECORD_BYTES];
                    let mut latencies = Vec::new();
                    while start.elapsed() < run_for {
                        let t = Instant::now();
                        log.append(RecordType(1), payload.clone(), Durability::Forced)
                            .await
                            .expect("append");
                        latencies.push(t.elapsed());
                    }
                    latencies
                })
            })
            .collect();
        let mut all = Vec::new();
        for task in tasks {
            all.extend(task.await.expect("task"));
        }
        (all, start.elapsed())
    });
    let fsyncs = log.stats().fsyncs - fsyncs_before;
    drop(log);
    let _ = std::fs::remove_dir_all(&log_dir);
    figures(latencies, elapsed, fsyncs)
}

fn median(mut rounds: Vec<Figures>) -> Figures {
    rounds.sort_by(|a, b| a.per_sec.total_cmp(&b.per_sec));
    rounds[rounds.len() / 2]
}

/// `ratio`: appends/s relative to the raw loop of the same round (median over rounds).
fn print(label: &str, f: &Figures, ratio: f64) {
    println!(
        "{label:<34} {:>10.0} rec/s  p50 {:>8.1} us  p99 {:>8.1} us  fsyncs {:>7}  rec/fsync {:>6.1}  x raw {:>6.2}",
        f.per_sec,
        f.p50_us,
        f.p99_us,
        f.fsyncs,
        f.records as f64 / f.fsyncs.max(1) as f64,
        ratio,
    );
}

fn main() {
    let secs: f64 = std::env::var("WAL_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0.5);
    let rounds: usize = std::env::var("WAL_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(7)
        .max(1);
    let run_for = Duration::from_secs_f64(secs);
    let base: PathBuf = std::env::var_os("WAL_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let dir = base.join(format!("twopc-wal-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("bench dir");
    println!(
        "wal bench: {RECORD_BYTES} B records ({} B framed), durable (Forced) appends, dir {}, {rounds} rounds x {secs} s, medians shown",
        RECORD_BYTES + FRAME_OVERHEAD_BYTES,
        dir.display()
    );

    // Every configuration runs once per round, in turn, so all of them see the same disk weather
    // (the disk is shared with other work); per-round ratios to the raw loop are taken before the
    // medians.
    let configs: [(&str, usize, SyncPolicy); 4] = [
        ("wal, 1 appender", 1, SyncPolicy::Fsync),
        ("wal, 16 appenders", 16, SyncPolicy::Fsync),
        ("wal, 64 appenders", 64, SyncPolicy::Fsync),
        ("wal, 64 appenders, durability off", 64, SyncPolicy::Never),
    ];
    let mut raw_rounds = Vec::new();
    let mut results: Vec<Vec<(Figures, f64)>> = vec![Vec::new(); configs.len()];
    for _ in 0..rounds {
        let raw = raw_loop(&dir, run_for);
        for (i, (_, appenders, sync)) in configs.iter().enumerate() {
            let f = wal_run(&dir, *appenders, *sync, run_for);
            results[i].push((f, f.per_sec / raw.per_sec));
        }
        raw_rounds.push(raw);
    }
    let raw = median(raw_rounds);
    print("raw write+fdatasync loop (baseline)", &raw, 1.0);
    let mut one_ratio = 0.0;
    for (i, (label, _, _)) in configs.iter().enumerate() {
        let mut ratios: Vec<f64> = results[i].iter().map(|(_, r)| *r).collect();
        ratios.sort_by(f64::total_cmp);
        let ratio = ratios[ratios.len() / 2];
        if i == 0 {
            one_ratio = ratio;
        }
        let figures = median(results[i].iter().map(|(f, _)| *f).collect());
        print(label, &figures, ratio);
    }
    println!(
        "1 appender: the raw loop does {:.2}x the wal's appends/s (median of per-round ratios; target <= 1.5); load average {}",
        1.0 / one_ratio,
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
