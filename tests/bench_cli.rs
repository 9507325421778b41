//! `twopc bench` end to end, at a tiny scale: it starts its three clusters (durable, the
//! durability-off baseline and the HTTP floor), measures every cell and prints JSON whose
//! figures hang together. Speed itself is never asserted here.

use std::process::Command;

fn twopc() -> Command {
    Command::new(env!("CARGO_BIN_EXE_twopc"))
}

fn field(cell: &serde_json::Value, name: &str) -> f64 {
    cell[name]
        .as_f64()
        .unwrap_or_else(|| panic!("{name} missing or not a number in {cell}"))
}

#[test]
fn bench_measures_every_cell_against_baseline_and_floor() {
    let output = twopc()
        .args([
            "bench",
            "--participants",
            "1,2",
            "--concurrency",
            "1,4",
            "--seconds",
            "0.5",
            "--json",
        ])
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "bench failed: {stderr}");
    let cells: Vec<serde_json::Value> =
        serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
            panic!(
                "not JSON ({e}): {}",
                String::from_utf8_lossy(&output.stdout)
            )
        });
    let shape: Vec<(u64, u64)> = cells
        .iter()
        .map(|c| {
            (
                c["participants"].as_u64().unwrap(),
                c["concurrency"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(shape, [(1, 1), (1, 4), (2, 1), (2, 4)]);
    for cell in &cells {
        assert_eq!(cell["failed"], 0, "{cell}");
        let committed = field(cell, "committed_per_s");
        let baseline = field(cell, "baseline_per_s");
        let floor = field(cell, "floor_per_s");
        assert!(committed > 0.0 && baseline > 0.0 && floor > 0.0, "{cell}");
        assert!(
            (field(cell, "ratio") - committed / baseline).abs() < 1e-9,
            "{cell}"
        );
        assert!(
            (field(cell, "share_of_floor") - committed / floor).abs() < 1e-9,
            "{cell}"
        );
        // Every committed transaction needs at least the coordinator's decision fsync, unless
        // group commit shared it: so some fsyncs happened, and never more than 2 per
        // participant + 1 per transaction.
        let fsyncs = field(cell, "fsyncs_per_tx");
        let participants = field(cell, "participants");
        assert!(fsyncs > 0.0 && fsyncs <= 2.0 * participants + 1.0, "{cell}");
        assert!(field(cell, "p50_ms") <= field(cell, "p99_ms"), "{cell}");
        assert!(field(cell, "disk_fsync_p50_us") > 0.0, "{cell}");
        assert!(
            field(cell, "disk_fsync_preallocated_p50_us") > 0.0,
            "{cell}"
        );
        // The client and servers spent some CPU on every cell, and far less than a second of
        // it per transaction.
        let cpu = field(cell, "cpu_us_per_tx");
        assert!(cpu > 0.0 && cpu < 1e6, "{cell}");
    }
}

#[test]
fn a_target_that_is_not_an_http_base_url_is_refused_by_name() {
    let output = twopc()
        .args([
            "bench",
            "--target-coordinator",
            "localhost:7100",
            "--target-participant",
            "inventory",
            "--seconds",
            "0.1",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("--target-coordinator") && stderr.contains("http://host:port"),
        "{stderr}"
    );
}

#[test]
fn bench_leases_measures_grants_and_fenced_writes_against_both_references() {
    let output = twopc()
        .args([
            "bench",
            "--leases",
            "--lease-concurrency",
            "1,2",
            "--seconds",
            "0.3",
            "--json",
        ])
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "bench --leases failed: {stderr}");
    let cells: Vec<serde_json::Value> =
        serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
            panic!(
                "not JSON ({e}): {}",
                String::from_utf8_lossy(&output.stdout)
            )
        });
    let shape: Vec<(&str, u64)> = cells
        .iter()
        .map(|c| {
            (
                c["op"].as_str().unwrap(),
                c["concurrency"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        shape,
        [
            ("grant", 1),
            ("grant", 2),
            ("fenced_write", 1),
            ("fenced_write", 2)
        ]
    );
    for cell in &cells {
        // Every grant is a fresh name and every fenced write carries the current token: none
        // may fail.
        assert_eq!(cell["failed"], 0, "{cell}");
        let per_s = field(cell, "per_s");
        let read = field(cell, "read_per_s");
        let off = field(cell, "no_fsync_per_s");
        assert!(per_s > 0.0 && read > 0.0 && off > 0.0, "{cell}");
        assert!(
            (field(cell, "share_of_read") - per_s / read).abs() < 1e-9,
            "{cell}"
        );
        assert!(
            (field(cell, "share_of_no_fsync") - per_s / off).abs() < 1e-9,
            "{cell}"
        );
        assert!(field(cell, "p50_ms") <= field(cell, "p99_ms"), "{cell}");
        assert!(field(cell, "disk_fsync_p50_us") > 0.0, "{cell}");
        assert!(
            field(cell, "cpu_us_per_op") > 0.0,
            "CPU per operation: {cell}"
        );
    }
}

#[test]
fn bench_sagas_measures_sagas_against_plain_calls_that_succeed() {
    // The plain calls go to the participants' peer routes: with the operator's token they were
    // all refused and the table printed 0 plain/s and no ratio, silently.
    let output = twopc()
        .args(["bench", "--sagas", "--concurrency", "1,2", "--seconds", "1"])
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "bench --sagas failed: {stdout}\n{stderr}"
    );
    assert!(
        !stdout.contains("failed"),
        "a saga or plain call failed:\n{stdout}"
    );
    let rows: Vec<Vec<&str>> = stdout
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|w| w.len() == 10 && w[0].parse::<usize>().is_ok())
        .collect();
    assert_eq!(rows.len(), 2, "one row per concurrency:\n{stdout}");
    for row in rows {
        let number = |i: usize| {
            row[i]
                .parse::<f64>()
                .unwrap_or_else(|_| panic!("column {i} is not a number in {row:?}"))
        };
        let (sagas, plain, ratio) = (number(1), number(4), number(7));
        assert!(sagas > 0.0 && plain > 0.0, "{row:?}");
        assert!(
            number(8) > 0.0 && number(9) > 0.0,
            "CPU per saga and per plain: {row:?}"
        );
        // The table rounds its columns; the ratio is taken before rounding.
        assert!((ratio - sagas / plain).abs() < 0.05, "{row:?}");
    }
}

/// `--ha` at a tiny scale: both setups measured at each concurrency, each with transactions
/// committed, and the group's rows measured with its follower in the sync set. Needs etcd
/// (fails, never skips, without it: CI installs etcd-server).
#[test]
fn bench_ha_measures_the_group_against_a_single_coordinator() {
    let output = twopc()
        .args(["bench", "--ha", "--concurrency", "1,4", "--seconds", "0.3"])
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "bench --ha failed:\n{stdout}\n{stderr}"
    );
    for concurrency in ["1", "4"] {
        for setup in ["single", "group"] {
            let row: Vec<&str> = stdout
                .lines()
                .map(|line| line.split_whitespace().collect::<Vec<_>>())
                .find(|cols| cols.first() == Some(&setup) && cols.get(1) == Some(&concurrency))
                .unwrap_or_else(|| panic!("no {setup} row at c{concurrency} in:\n{stdout}"));
            let per_s: f64 = row[2].parse().unwrap_or_else(|e| panic!("{row:?}: {e}"));
            assert!(
                per_s > 0.0,
                "{setup} at c{concurrency} committed nothing:\n{stdout}"
            );
            // The follower (the second node started) stayed in the leader's sync set.
            assert_eq!(
                row.last() == Some(&"node-b"),
                setup == "group",
                "{setup} at c{concurrency}:\n{stdout}"
            );
        }
    }
    assert!(
        stdout.contains("goal: group tx/s at c64: not measured"),
        "{stdout}"
    );
    assert!(stdout.contains("goal: group p50 at c1 within"), "{stdout}");
}

/// `--outbox` at a tiny scale: writes with intents and without measured at each concurrency,
/// intents delivered end to end through a real relay, and the end check (every intent applied
/// once, nothing open) passed.
#[test]
fn bench_outbox_delivers_every_intent_once_and_measures_both_writes() {
    let output = twopc()
        .args([
            "bench",
            "--outbox",
            "--outbox-concurrency",
            "1,4",
            "--seconds",
            "0.5",
            "--json",
        ])
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "bench --outbox failed:\n{stdout}\n{stderr}"
    );
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}",
            String::from_utf8_lossy(&output.stdout)
        )
    });
    let cells = report["cells"].as_array().expect("cells");
    let shape: Vec<u64> = cells
        .iter()
        .map(|c| c["concurrency"].as_u64().unwrap())
        .collect();
    assert_eq!(shape, [1, 4]);
    for cell in cells {
        assert_eq!(cell["failed"], 0, "{cell}");
        let writes = field(cell, "writes_per_s");
        let plain = field(cell, "plain_per_s");
        assert!(writes > 0.0 && plain > 0.0, "{cell}");
        assert!(
            (field(cell, "share_of_plain") - writes / plain).abs() < 1e-9,
            "{cell}"
        );
        // Delivery in the window is counted at the receiver and in the outbox (how much
        // falls in a half-second window depends on the relay's poll and the machine's load:
        // that every intent arrives is the check's business, below).
        assert!(field(cell, "delivered_per_s") >= 0.0, "{cell}");
        assert!(field(cell, "outbox_delivered_per_s") >= 0.0, "{cell}");
        assert!(
            field(cell, "lag_p50_ms") <= field(cell, "lag_p99_ms"),
            "{cell}"
        );
        assert!(
            field(cell, "write_p50_ms") <= field(cell, "write_p99_ms"),
            "{cell}"
        );
        assert!(field(cell, "drain_ms") >= 0.0, "{cell}");
        assert!(cell["pending_at_end"].as_u64().is_some(), "{cell}");
        for cpu in ["cpu_us_per_intent", "cpu_us_per_plain_write"] {
            let us = field(cell, cpu);
            assert!(us > 0.0 && us < 1e6, "{cpu}: {cell}");
        }
    }
    let check = &report["check"];
    assert_eq!(check["ok"], true, "{check}");
    let written = check["intents_written"].as_u64().unwrap();
    assert!(written > 0, "{check}");
    assert_eq!(check["delivered_once"].as_u64(), Some(written), "{check}");
    assert_eq!(check["missing"], 0, "{check}");
    assert_eq!(check["applied_twice"], 0, "{check}");
    assert_eq!(check["outbox_pending"], 0, "{check}");
    assert_eq!(check["outbox_failed"], 0, "{check}");
    assert_eq!(
        check["outbox_delivered"], check["outbox_written"],
        "{check}"
    );
}
