//! Disk faults on the real log files of a stopped node in a running checkout cluster, and the
//! documented reaction of the restarted process (docs/recovery.md, disk rows):
//! - a torn last record (the node died between the write and its fsync, then the tail was cut
//!   mid-record): it starts, truncates the tail, keeps a `.broken` copy, and every outcome a
//!   client heard still holds;
//! - a zero-filled tail: it starts as if the log ended before the zeros;
//! - one flipped bit in a record with valid records after it: it refuses to start, exit code 4,
//!   naming the file and the offset; `twopc wal verify` says the same.

use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use chaos_tests::binary::failpoints_binary;
use chaos_tests::disk_faults::{self, flip_bit};
use chaos_tests::scenario::disk::{self, frames};
use chaos_tests::scenario::{COORDINATOR, ChaosCluster, ChaosOptions, armed};
use cluster::audit::ClientOutcome;
use cluster::checkout::{INVENTORY, Order, PAYMENTS};
use cluster::workload::WorkloadOptions;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn warmed_up(seed: u64) -> ChaosCluster {
    let mut chaos = ChaosCluster::start(&ChaosOptions {
        // No checkpoints during these tests: the records stay in the segments we fault.
        coordinator_flags: vec![
            "--checkpoint-interval-ms".into(),
            "3600000".into(),
            "--retry-base-ms".into(),
            "50".into(),
            "--retry-max-ms".into(),
            "500".into(),
        ],
        ..ChaosOptions::default()
    });
    let orders = chaos.orders("warm", seed, 10);
    let mut options = chaos.workload_options();
    options.concurrency = 3;
    chaos.run_orders(orders, options);
    chaos
}

/// `twopc wal verify DIR`: exit code and stderr.
fn wal_verify(dir: &std::path::Path) -> (Option<i32>, String) {
    let output = Command::new(failpoints_binary())
        .args(["wal", "verify"])
        .arg(dir)
        .output()
        .expect("run twopc wal verify");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn send_once(chaos: &mut ChaosCluster, order: &Order) -> ClientOutcome {
    let options = WorkloadOptions {
        retry_window: Duration::ZERO,
        concurrency: 1,
        ..chaos.workload_options()
    };
    chaos.run_orders(vec![order.clone()], options)[0].outcome
}

#[test]
fn a_torn_last_record_is_truncated_kept_as_broken_and_nothing_acknowledged_is_lost() {
    let _serial = serial();
    let mut chaos = warmed_up(31);
    // Inventory dies after writing the target's prepared record, before its fsync: that record
    // was never acknowledged, so cutting it short is a torn write the log must survive.
    chaos.quiesce_and_restart(INVENTORY, armed("wal::between_write_and_fsync"));
    let target = Order {
        id: "torn-target".into(),
        sku: 1,
        customer: 1,
        quantity: 1,
        amount: 5,
    };
    let heard = send_once(&mut chaos, &target);
    chaos.wait_crash(INVENTORY, Duration::from_secs(30));
    assert_eq!(heard, ClientOutcome::Aborted, "inventory never voted");

    let data_dir = chaos.data_dir(INVENTORY);
    let segment = disk::last_segment(&data_dir);
    let last = *frames(&segment).last().expect("a record to tear");
    let (torn_segment, truncation) = disk::tear_last_record(&data_dir, 7).expect("torn");
    assert_eq!(torn_segment, segment);
    assert!(truncation.len_after > last.offset && truncation.len_after < last.offset + last.len);

    let wal = disk_faults::wal_dir(&data_dir);
    let (code, stderr) = wal_verify(&wal);
    assert_eq!(
        code,
        Some(0),
        "a torn tail would open; wal verify said: {stderr}"
    );

    chaos.restart(INVENTORY, Vec::new());
    let broken = disk::broken_copies(&data_dir);
    let segment_name = segment.file_name().unwrap().to_string_lossy().into_owned();
    let expected = format!("{segment_name}.{}.broken", last.offset);
    assert!(
        broken
            .iter()
            .any(|p| p.file_name().unwrap().to_string_lossy() == expected),
        "expected {expected} among {broken:?}"
    );
    let kept = broken
        .iter()
        .find(|p| p.file_name().unwrap().to_string_lossy() == expected)
        .map(|p| std::fs::metadata(p).unwrap().len());
    assert_eq!(
        kept,
        Some(truncation.len_after - last.offset),
        "the .broken copy holds the partial record"
    );

    // The cluster goes on: more orders, then every outcome a client heard still holds.
    let more = chaos.orders("after-tear", 32, 6);
    chaos.run_orders(more, chaos.workload_options());
    chaos.assert_audit("torn tail");
}

#[test]
fn a_zero_filled_tail_is_the_end_of_the_log() {
    let _serial = serial();
    let mut chaos = warmed_up(41);
    for node in [PAYMENTS, COORDINATOR] {
        chaos.quiesce_and_restart(node, Vec::new());
        chaos.kill(node);
        let data_dir = chaos.data_dir(node);
        let (segment, fill) = disk::zero_tail(&data_dir, 4096);
        assert_eq!(fill.range.end - fill.range.start, 4096);
        let (code, stderr) = wal_verify(&disk_faults::wal_dir(&data_dir));
        assert_eq!(
            code,
            Some(0),
            "{node}: zero tail on {}: {stderr}",
            segment.display()
        );
        chaos.restart(node, Vec::new());
        let more = chaos.orders(&format!("after-zeros-{node}"), 42, 5);
        chaos.run_orders(more, chaos.workload_options());
    }
    chaos.assert_audit("zero tail");
}

#[test]
fn a_flipped_bit_mid_log_is_refused_with_exit_code_4_naming_file_and_offset() {
    let _serial = serial();
    let mut chaos = warmed_up(51);
    for node in [COORDINATOR, INVENTORY] {
        chaos.quiesce_and_restart(node, Vec::new());
        chaos.node(node).terminate(Duration::from_secs(20));
        let data_dir = chaos.data_dir(node);
        let (segment, frame, flip) = disk::flip_mid_log(&data_dir);
        let file = segment.file_name().unwrap().to_string_lossy().into_owned();

        chaos.restart_no_wait(node, Vec::new());
        let status = chaos
            .node(node)
            .wait_exit(Duration::from_secs(60))
            .unwrap_or_else(|| panic!("{node} started on a corrupt log"));
        assert_eq!(
            status.code(),
            Some(4),
            "{node}: exit {status}\n{}",
            chaos.logs()
        );
        let log = chaos.node(node).log();
        let refusal = log
            .lines()
            .rev()
            .find(|l| l.contains("corrupt"))
            .unwrap_or_else(|| panic!("{node} logged no refusal:\n{log}"))
            .to_string();
        assert!(
            refusal.contains(&file) && refusal.contains(&format!("offset {}", frame.offset)),
            "{node}: refusal {refusal:?} should name {file} and offset {}",
            frame.offset
        );

        let wal = disk_faults::wal_dir(&data_dir);
        let (code, stderr) = wal_verify(&wal);
        assert_eq!(
            code,
            Some(4),
            "wal verify on {node}'s corrupt log: {stderr}"
        );
        assert!(
            stderr.contains(&file) && stderr.contains(&format!("offset {}", frame.offset)),
            "wal verify should name {file} and offset {}: {stderr}",
            frame.offset
        );

        // Put the bit back: the same log opens again and nothing was lost.
        flip_bit(&segment, flip.offset, flip.bit).expect("flip back");
        chaos.restart(node, Vec::new());
    }
    chaos.assert_audit("bit flip, repaired");
}
