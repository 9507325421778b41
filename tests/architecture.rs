//! The map does not lie: within each crate, the files' imports form floors, and no file
//! imports from a file on its own floor or above (no circle of imports, however long), no
//! source file outgrows one idea (`LINES_MAX` lines), and the product (`twopc`) never depends
//! on its test harness.
//!
//! An import is any `crate::a::b` or `super::x` path in a file's code (a `use` or a path in an
//! expression), resolved to the file that defines the module it names. Test files (`tests.rs`,
//! `tests_*.rs`, `*_tests.rs`, `test_support.rs`) and `#[cfg(test)]` modules are left out:
//! tests stand on top of what they test. A `mod x;` declaration is not an import.
//!
//! Run alone: `cargo test --test architecture`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The crates whose rooms are checked, by their source folder.
const CRATES: [&str; 9] = [
    "protocol/src",
    "wal/src",
    "net/src",
    "coordinator/src",
    "participant/src",
    "relay/src",
    "cluster/src",
    "chaos-tests/src",
    "src",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn is_test_file(path: &Path) -> bool {
    let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    name == "tests"
        || name.starts_with("tests_")
        || name.ends_with("_tests")
        || name == "test_support"
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") && !is_test_file(&path) {
            out.push(path);
        }
    }
}

/// A file's module path within its crate (`a/b.rs` and `a/b/mod.rs` are `a::b`; the crate
/// root is empty).
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let relative = file.strip_prefix(src).unwrap_or(file);
    let mut parts: Vec<String> = relative
        .with_extension("")
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The code of a file without comments, strings and `#[cfg(test)]` modules.
fn code_of(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut skip_depth: Option<usize> = None;
    let mut depth = 0usize;
    let mut pending_cfg_test = false;
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("//") {
            continue;
        }
        let code = match line.find("//") {
            Some(i) if !line[..i].contains('"') => &line[..i],
            _ => line,
        };
        if trimmed.starts_with("#[cfg(test)]") {
            pending_cfg_test = true;
            continue;
        }
        let opens = code.matches('{').count();
        let closes = code.matches('}').count();
        if pending_cfg_test && skip_depth.is_none() {
            pending_cfg_test = false;
            if trimmed.starts_with("mod ") && opens > 0 {
                skip_depth = Some(depth);
            } else {
                out.push_str(code);
                out.push('\n');
            }
        } else if skip_depth.is_none() {
            out.push_str(code);
            out.push('\n');
        }
        depth = (depth + opens).saturating_sub(closes);
        if skip_depth.is_some_and(|d| depth <= d) {
            skip_depth = None;
        }
    }
    strip_strings(&out)
}

fn strip_strings(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut in_string = false;
    let mut escaped = false;
    for c in code.chars() {
        if in_string {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
            continue;
        }
        if c == '"' {
            in_string = true;
            continue;
        }
        out.push(c);
    }
    out
}

fn ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Every path in `code` that starts with `crate::` or `super::`, as segments (the first being
/// `crate` or `super`), with braces expanded one level (`crate::a::{b, c::d}`).
fn paths_in(code: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let bytes: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < bytes.len() {
        let starts = |word: &str| {
            let w: Vec<char> = word.chars().collect();
            bytes.len() >= i + w.len()
                && bytes[i..i + w.len()] == w[..]
                && (i == 0 || !ident_char(bytes[i - 1]))
        };
        let head = if starts("crate::") {
            "crate"
        } else if starts("super::") {
            "super"
        } else {
            i += 1;
            continue;
        };
        let mut j = i;
        let mut segments = Vec::new();
        let mut current = String::new();
        while j < bytes.len() {
            let c = bytes[j];
            if ident_char(c) {
                current.push(c);
                j += 1;
            } else if c == ':' && bytes.get(j + 1) == Some(&':') {
                segments.push(std::mem::take(&mut current));
                j += 2;
            } else {
                break;
            }
        }
        if !current.is_empty() {
            segments.push(current);
        }
        if bytes.get(j) == Some(&'{') {
            // One level of braces: each comma-separated path continues the prefix.
            let close = (j..bytes.len())
                .find(|&k| bytes[k] == '}')
                .unwrap_or(bytes.len());
            let inner: String = bytes[j + 1..close].iter().collect();
            for item in inner.split(',') {
                let mut full = segments.clone();
                full.extend(
                    item.trim()
                        .split("::")
                        .map(|s| s.trim().to_string())
                        .filter(|s| !s.is_empty() && s.chars().all(ident_char)),
                );
                paths.push(full);
            }
            j = close;
        } else {
            paths.push(segments);
        }
        let _ = head;
        i = j.max(i + 1);
    }
    paths
}

/// The file a path resolves to: the longest prefix of it that names a module of the crate.
fn resolve(
    modules: &BTreeMap<Vec<String>, PathBuf>,
    from: &[String],
    from_is_mod_file: bool,
    path: &[String],
) -> Option<PathBuf> {
    let mut absolute: Vec<String> = Vec::new();
    let mut rest = path;
    match rest.first().map(String::as_str) {
        Some("crate") => rest = &rest[1..],
        Some("super") => {
            // `super` of a.rs (module a) is a's parent; of a/mod.rs too; chained supers climb.
            absolute = from.to_vec();
            let _ = from_is_mod_file;
            while rest.first().map(String::as_str) == Some("super") {
                absolute.pop();
                rest = &rest[1..];
            }
        }
        _ => return None,
    }
    absolute.extend(rest.iter().cloned());
    (1..=absolute.len())
        .rev()
        .find_map(|n| modules.get(&absolute[..n]).cloned())
}

/// The import graph of one crate's files.
fn graph(src: &Path) -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules: BTreeMap<Vec<String>, PathBuf> = files
        .iter()
        .map(|f| (module_of(src, f), f.clone()))
        .collect();
    let mut edges = BTreeMap::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        let module = module_of(src, file);
        let is_mod = file
            .file_stem()
            .is_some_and(|s| s == "mod" || s == "lib" || s == "main");
        let mut targets = BTreeSet::new();
        for path in paths_in(&code_of(&text)) {
            if let Some(target) = resolve(&modules, &module, is_mod, &path)
                && target != *file
                && !module_of(src, &target).is_empty()
            {
                targets.insert(target);
            }
        }
        edges.insert(file.clone(), targets);
    }
    edges
}

/// Every circle in `edges` (strongly connected components of more than one file).
fn circles(edges: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<Vec<PathBuf>> {
    // Tarjan's algorithm, iteratively small enough to be recursive here.
    struct State<'a> {
        edges: &'a BTreeMap<PathBuf, BTreeSet<PathBuf>>,
        index: BTreeMap<&'a PathBuf, usize>,
        low: BTreeMap<&'a PathBuf, usize>,
        stack: Vec<&'a PathBuf>,
        on_stack: BTreeSet<&'a PathBuf>,
        next: usize,
        found: Vec<Vec<PathBuf>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a PathBuf) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on_stack.insert(v);
        if let Some(targets) = s.edges.get(v) {
            for w in targets {
                let Some((w, _)) = s.edges.get_key_value(w) else {
                    continue;
                };
                if !s.index.contains_key(w) {
                    visit(s, w);
                    let low = s.low[v].min(s.low[w]);
                    s.low.insert(v, low);
                } else if s.on_stack.contains(w) {
                    let low = s.low[v].min(s.index[w]);
                    s.low.insert(v, low);
                }
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.clone());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.found.push(component);
            }
        }
    }
    let mut state = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        found: Vec::new(),
    };
    for v in edges.keys() {
        if !state.index.contains_key(v) {
            visit(&mut state, v);
        }
    }
    state.found
}

#[test]
fn no_file_imports_from_its_own_floor_or_above() {
    let root = root();
    let mut report = String::new();
    for krate in CRATES {
        let src = root.join(krate);
        let edges = graph(&src);
        for circle in circles(&edges) {
            report.push_str(&format!("{krate}: a circle of imports:\n"));
            for file in &circle {
                let inside: Vec<String> = edges[file]
                    .iter()
                    .filter(|t| circle.contains(t))
                    .map(|t| t.strip_prefix(&root).unwrap_or(t).display().to_string())
                    .collect();
                report.push_str(&format!(
                    "  {} -> {}\n",
                    file.strip_prefix(&root).unwrap_or(file).display(),
                    inside.join(", ")
                ));
            }
        }
    }
    assert!(report.is_empty(), "\n{report}");
}

/// The most lines a non-test source file may hold (issue 26): a file past it holds more than
/// one idea. The whole file counts, inline `#[cfg(test)]` modules included; test files (see
/// `is_test_file`) do not.
const LINES_MAX: usize = 600;

#[test]
fn no_source_file_is_over_the_line_bound() {
    let root = root();
    let mut report = String::new();
    for krate in CRATES {
        let mut files = Vec::new();
        rust_files(&root.join(krate), &mut files);
        files.sort();
        for file in files {
            let name = file
                .strip_prefix(&root)
                .unwrap_or(&file)
                .display()
                .to_string();
            let lines = std::fs::read_to_string(&file)
                .unwrap_or_default()
                .lines()
                .count();
            if lines > LINES_MAX {
                report.push_str(&format!(
                    "{name} has {lines} lines, over {LINES_MAX}: split it along its seams\n"
                ));
            }
        }
    }
    assert!(report.is_empty(), "\n{report}");
}

#[test]
fn the_checker_finds_paths_and_circles() {
    let code = code_of(
        "use crate::a::{b, c::d};\n// crate::commented::out\nfn f() { super::x::y(); \
         let s = \"crate::in_string\"; }\n#[cfg(test)]\nmod tests {\n    use crate::z;\n}\n",
    );
    let paths = paths_in(&code);
    assert!(paths.contains(&vec!["crate".into(), "a".into(), "b".into()]));
    assert!(paths.contains(&vec!["crate".into(), "a".into(), "c".into(), "d".into()]));
    assert!(paths.contains(&vec!["super".into(), "x".into(), "y".into()]));
    assert!(!code.contains("commented") && !code.contains("in_string") && !code.contains("z"));
    let p = |s: &str| PathBuf::from(s);
    let edges = BTreeMap::from([
        (p("a"), BTreeSet::from([p("b")])),
        (p("b"), BTreeSet::from([p("c")])),
        (p("c"), BTreeSet::from([p("a")])),
        (p("d"), BTreeSet::from([p("a")])),
    ]);
    assert_eq!(circles(&edges), vec![vec![p("a"), p("b"), p("c")]]);
}

#[test]
fn the_product_does_not_depend_on_its_test_harness() {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap_or_default();
    let dependencies = manifest
        .split("[dependencies]")
        .nth(1)
        .and_then(|rest| rest.split("\n[").next())
        .unwrap_or("");
    assert!(
        !dependencies.contains("chaos-tests"),
        "the twopc command's [dependencies] name chaos-tests:\n{dependencies}"
    );
}
