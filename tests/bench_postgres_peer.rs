//! `twopc bench --backend postgres --peer bitronix` end to end at a tiny scale: twopc and
//! Bitronix both move money across two PostgreSQL databases, cell by cell, and the JSON says
//! both rows committed, failed none and passed the checks after each run. Speed is never
//! asserted. The full run needs PostgreSQL (`TWOPC_POSTGRES_URL` or initdb) and Debian's Java
//! packages (docs/benchmarks.md), so it is ignored by `cargo test --workspace` and run by
//! `.ci/run` with `-- --ignored`; the CLI errors need neither.

use std::process::Command;

fn twopc() -> Command {
    Command::new(env!("CARGO_BIN_EXE_twopc"))
}

fn number(value: &serde_json::Value, name: &str) -> f64 {
    value[name]
        .as_f64()
        .unwrap_or_else(|| panic!("{name} missing or not a number in {value}"))
}

#[test]
#[ignore = "needs PostgreSQL and Java with Bitronix; .ci/run runs it (TWOPC_POSTGRES_URL or initdb on PATH)"]
fn bitronix_runs_beside_twopc_in_every_cell_and_both_keep_the_books() {
    let output = twopc()
        .args([
            "bench",
            "--backend",
            "postgres",
            "--peer",
            "bitronix",
            "--concurrency",
            "1,4",
            "--seconds",
            "1",
            "--json",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let both = format!("--- stdout\n{stdout}\n--- stderr\n{stderr}");
    assert!(output.status.success(), "{both}");
    let cells: Vec<serde_json::Value> =
        serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {both}"));
    let concurrencies: Vec<u64> = cells
        .iter()
        .map(|c| c["concurrency"].as_u64().unwrap())
        .collect();
    assert_eq!(concurrencies, [1, 4], "{both}");
    for cell in &cells {
        let peer = &cell["peer"];
        assert_eq!(peer["name"], "bitronix", "{cell}");
        for (row, name) in [(cell, "twopc"), (peer, "bitronix")] {
            assert!(number(row, "committed_per_s") > 0.0, "{name}: {cell}");
            assert_eq!(number(row, "failed"), 0.0, "{name}: {cell}");
            assert!(number(row, "ratio") > 0.0, "{name}: {cell}");
            assert!(number(row, "cpu_us_per_tx") > 0.0, "{name}: {cell}");
        }
        for checks in [&cell["twopc_checks"], &peer["checks"]] {
            assert_eq!(checks["money_conserved"], true, "{cell}");
            assert_eq!(checks["prepared_left"], 0, "{cell}");
        }
        assert!(number(cell, "baseline_per_s") > 0.0, "{cell}");
    }
}

#[test]
fn a_peer_without_the_postgres_backend_is_a_usage_error() {
    let output = twopc()
        .args(["bench", "--peer", "bitronix", "--seconds", "0.1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--peer bitronix needs --backend postgres"),
        "{stderr}"
    );
}

#[test]
fn an_unknown_peer_is_a_usage_error_naming_the_known_ones() {
    let output = twopc()
        .args(["bench", "--backend", "postgres", "--peer", "atomikos"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("atomikos"), "{stderr}");
    assert!(stderr.contains("bitronix"), "{stderr}");
}
