//! How long forced appends wait while a deferred checkpoint of a large snapshot is taken: one
//! appender appends 256-byte records back to back; a checkpoint of `STALL_SNAPSHOT_MB` (64) is
//! started after 200 ms; the longest append latency inside and outside the checkpoint is printed.
//!
//! `cargo run --release -p twopc-wal --example checkpoint_stall`
//! Env: `WAL_BENCH_DIR` (default: the system temp dir; must be a real disk, not tmpfs),
//! `STALL_SNAPSHOT_MB`, `STALL_ROUNDS` (default 5).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use wal::{Durability, RecordType, Wal, WalOptions};

fn round(dir: &std::path::Path, snapshot_bytes: usize) -> (Duration, Duration, Duration, usize) {
    let _ = std::fs::remove_dir_all(dir);
    let (log, _) = Wal::open(dir, WalOptions::default()).expect("open the log");
    let record = vec![0x5Au8; 256];
    let mut checkpoint = None;
    let mut outside = Vec::new();
    let mut inside = Vec::new();
    let started = Instant::now();
    let mut took = Duration::ZERO;
    loop {
        if checkpoint.is_none() && started.elapsed() > Duration::from_millis(200) {
            // Not zeros: the encoder's work stands in for a real snapshot's.
            let snapshot: Vec<u8> = (0..snapshot_bytes).map(|i| (i % 251) as u8).collect();
            let ticket = log.checkpoint_with(move || Ok(snapshot));
            let done = Arc::new(AtomicBool::new(false));
            let flag = Arc::clone(&done);
            std::thread::spawn(move || {
                ticket.wait_blocking().expect("checkpoint");
                flag.store(true, Ordering::SeqCst);
            });
            checkpoint = Some((Instant::now(), done));
        }
        let t = Instant::now();
        log.submit(RecordType(1), record.clone(), Durability::Forced)
            .wait_blocking()
            .expect("append");
        let latency = t.elapsed();
        match &checkpoint {
            Some((since, done)) if took.is_zero() => {
                inside.push(latency);
                if done.load(Ordering::SeqCst) {
                    took = since.elapsed();
                }
            }
            Some(_) => {
                outside.push(latency);
                if outside.len() > 2_000 {
                    break;
                }
            }
            None => outside.push(latency),
        }
    }
    outside.sort_unstable();
    let max_inside = inside.iter().max().copied().unwrap_or_default();
    (max_inside, outside[outside.len() / 2], took, inside.len())
}

fn main() {
    let base = std::env::var_os("WAL_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
        .join("wal-checkpoint-stall");
    let mb: usize = std::env::var("STALL_SNAPSHOT_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    let rounds: usize = std::env::var("STALL_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    println!(
        "snapshot {mb} MB: longest append during the checkpoint, median append outside it, checkpoint time, appends during it"
    );
    for _ in 0..rounds {
        let (max_inside, p50_outside, took, n) = round(&base, mb << 20);
        println!(
            "  longest {:>8.1} ms   median outside {:>6.3} ms   checkpoint {:>7.1} ms   {n} appends",
            max_inside.as_secs_f64() * 1e3,
            p50_outside.as_secs_f64() * 1e3,
            took.as_secs_f64() * 1e3
        );
    }
    let _ = std::fs::remove_dir_all(&base);
}
