//! Keeps docs/recovery.md and the crash-point matrix true to the code: every crash point named
//! in `coordinator/src`, `participant/src` or `wal/src` must have a scenario in
//! `chaos-tests/tests/crash_matrix.rs` and a row in the crash-point table of docs/recovery.md;
//! every row must name a real crash point, and every scenario a row names must exist.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use chaos_tests::binary::workspace_root;

const SOURCE_TREES: [&str; 3] = ["coordinator/src", "participant/src", "wal/src"];
const PREFIXES: [&str; 3] = ["coordinator::", "participant::", "wal::"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// The string literals of `line` (outside `//` comments).
fn literals(line: &str) -> Vec<String> {
    let code = line.split("//").next().unwrap_or("");
    code.split('"')
        .enumerate()
        .filter(|(i, _)| i % 2 == 1)
        .map(|(_, s)| s.to_string())
        .collect()
}

fn is_point_name(text: &str) -> bool {
    PREFIXES.iter().any(|prefix| {
        text.strip_prefix(prefix).is_some_and(|rest| {
            !rest.is_empty()
                && rest
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        })
    })
}

/// Every crash point name in the services' sources: the `crate::snake_name` string literals
/// (the names given to `fail_point!`, `crash_point!`, or constants passed to them).
fn crash_points_in_code() -> BTreeSet<String> {
    let root = workspace_root();
    let mut files = Vec::new();
    for tree in SOURCE_TREES {
        rust_files(&root.join(tree), &mut files);
    }
    let mut names = BTreeSet::new();
    let mut files_with_points = 0;
    for file in files {
        let text = fs::read_to_string(&file).unwrap();
        if text.contains("fail_point!(") || text.contains("crash_point") {
            files_with_points += 1;
        }
        for line in text.lines() {
            names.extend(literals(line).into_iter().filter(|l| is_point_name(l)));
        }
    }
    assert!(files_with_points > 0, "no crash point call found at all");
    names
}

/// The crash-point table of docs/recovery.md: `(point, scenario cell)` per row.
fn doc_rows() -> Vec<(String, String)> {
    let doc = fs::read_to_string(workspace_root().join("docs/recovery.md")).unwrap();
    let section = doc
        .split("## Crash points")
        .nth(1)
        .expect("docs/recovery.md has a `## Crash points` section");
    let section = section.split("\n## ").next().unwrap_or(section);
    section
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            (
                cells[1].trim_matches('`').to_string(),
                cells.get(4).copied().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// `file::function` references in backticks, e.g. `crash_matrix::coordinator_during_recovery`.
fn scenario_refs(cell: &str) -> Vec<(String, String)> {
    cell.split('`')
        .enumerate()
        .filter(|(i, _)| i % 2 == 1)
        .filter_map(|(_, r)| {
            r.split_once("::")
                .map(|(file, function)| (file.to_string(), function.to_string()))
        })
        .collect()
}

fn test_file(name: &str) -> String {
    let path = workspace_root()
        .join("chaos-tests/tests")
        .join(format!("{name}.rs"));
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_extractor_finds_the_known_crash_points() {
    let points = crash_points_in_code();
    for known in [
        "coordinator::before_decision_durable",
        "participant::after_prepared_durable",
        "wal::between_write_and_fsync",
    ] {
        assert!(points.contains(known), "{known} not found in {points:?}");
    }
    assert!(literals(r#"fail_point!("wal::x", |_| ()) // "wal::y""#) == vec!["wal::x"]);
    assert!(!is_point_name("wal::"));
    assert!(!is_point_name("coordinator::Runtime"));
}

#[test]
fn every_crash_point_has_a_scenario_and_a_documented_row() {
    let points = crash_points_in_code();
    let matrix = test_file("crash_matrix");
    let rows = doc_rows();
    let documented: BTreeSet<&str> = rows.iter().map(|(p, _)| p.as_str()).collect();
    let mut problems = Vec::new();
    for point in &points {
        if !matrix.contains(&format!("\"{point}\"")) {
            problems.push(format!(
                "{point}: no scenario in chaos-tests/tests/crash_matrix.rs"
            ));
        }
        if !documented.contains(point.as_str()) {
            problems.push(format!(
                "{point}: no row in the crash-point table of docs/recovery.md"
            ));
        }
    }
    for (point, scenario) in &rows {
        if !points.contains(point) {
            problems.push(format!(
                "docs/recovery.md documents {point}, which no code names"
            ));
        }
        let refs = scenario_refs(scenario);
        if refs.is_empty() {
            problems.push(format!(
                "docs/recovery.md: the row of {point} names no scenario"
            ));
        }
        for (file, function) in refs {
            if !test_file(&file).contains(&format!("fn {function}()")) {
                problems.push(format!(
                    "docs/recovery.md: {point} names {file}::{function}, which does not exist"
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_scenario_named_in_the_doc_exists() {
    let doc = fs::read_to_string(workspace_root().join("docs/recovery.md")).unwrap();
    let mut missing = Vec::new();
    for line in doc.lines().filter(|l| l.starts_with('|')) {
        for (file, function) in scenario_refs(line) {
            let path = workspace_root()
                .join("chaos-tests/tests")
                .join(format!("{file}.rs"));
            if !path.exists() {
                // `oracle/atomicity.rs` and the like are paths, not scenarios.
                continue;
            }
            if !test_file(&file).contains(&format!("fn {function}()")) {
                missing.push(format!("{file}::{function}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/recovery.md names missing tests: {missing:?}"
    );
}
