//! `twopc wal dump|verify DIR`: how an operator (and the chaos tests) look at a log. Read-only:
//! neither command changes the directory; a torn tail is reported as "would be truncated".
//!
//! `DIR` is a log directory (it holds segment or snapshot files) or a service's data directory
//! (`--data-dir`, which holds `LOCK` and the log in `wal/`); for the latter the log in `DIR/wal`
//! is checked and a note on stderr says so. Anything else is refused: scanning a directory
//! without log files finds a valid, empty log, and "ok: 0 records" about the wrong directory
//! would hide a corrupt log sitting next to it.
//!
//! Exit codes: 0 the log would open (clean, or a torn tail that opening would cut), 1 the
//! directory cannot be read, 3 no log found in `DIR` (neither it nor `DIR/wal` holds a segment or
//! snapshot file), 4 the log is corrupt (file, offset and reason on stderr). 2 is clap's bad usage.

use std::fmt;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::json;
use wal::WalError;
use wal::inspect::{self, DumpedRecord, Summary};

const EXIT_IO: u8 = 1;
const EXIT_NO_LOG: u8 = 3;
const EXIT_CORRUPT: u8 = 4;

/// Where a service keeps its log inside its data directory.
const DATA_DIR_LOG: &str = "wal";

const EXIT_CODES_HELP: &str = "\
Exit codes:
  0  the log would open: clean, or a torn tail that opening would truncate
  1  the directory cannot be read (missing, permissions)
  2  bad usage
  3  no log found in DIR: neither DIR nor DIR/wal holds a segment or snapshot file
  4  the log is corrupt: stderr names the file, the byte offset and the reason";

#[derive(Debug, clap::Subcommand)]
pub enum WalCommand {
    /// Print every live record as a JSON line (seq, type, size, segment, offset), after a line for
    /// the snapshot if there is one.
    #[command(after_help = EXIT_CODES_HELP)]
    Dump {
        /// A log directory, or a service's data directory (its log in `wal/` is used).
        dir: PathBuf,
        /// Also print each payload: as a string if it is UTF-8, else as hex in `payload_hex`.
        #[arg(long)]
        payload: bool,
    },
    /// Check every record and the snapshot; exit 0 with a summary when the log would open,
    /// 3 when there is no log, 4 naming file, offset and reason when it is corrupt.
    #[command(after_help = EXIT_CODES_HELP)]
    Verify {
        /// A log directory, or a service's data directory (its log in `wal/` is used).
        dir: PathBuf,
        /// Print the summary as one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
}

pub fn main(command: WalCommand) -> ExitCode {
    let outcome = match command {
        WalCommand::Dump { dir, payload } => dump(&dir, payload),
        WalCommand::Verify { dir, json } => verify(&dir, json),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("error: {failure}");
            match failure {
                Failure::NoLog { .. } => ExitCode::from(EXIT_NO_LOG),
                Failure::Wal(WalError::Corrupt { .. }) => ExitCode::from(EXIT_CORRUPT),
                Failure::Wal(_) => ExitCode::from(EXIT_IO),
            }
        }
    }
}

#[derive(Debug)]
enum Failure {
    /// Neither the directory given nor its `wal/` holds a log.
    NoLog {
        given: PathBuf,
    },
    Wal(WalError),
}

impl From<WalError> for Failure {
    fn from(error: WalError) -> Self {
        Failure::Wal(error)
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::NoLog { given } => write!(
                f,
                "no log found in {}: neither it nor {} holds a segment (<20-digit seq>.wal) or \
                 snapshot (snapshot-<20-digit seq>.snap) file; give a log directory or a \
                 service's --data-dir",
                given.display(),
                given.join(DATA_DIR_LOG).display()
            ),
            Failure::Wal(error) => error.fmt(f),
        }
    }
}

/// The log directory `given` names: itself if it holds a log, else the `wal/` of a service data
/// directory if that holds one.
fn log_dir(given: &Path) -> Result<PathBuf, Failure> {
    if inspect::holds_log(given)? {
        return Ok(given.to_path_buf());
    }
    let nested = given.join(DATA_DIR_LOG);
    if nested.is_dir() && inspect::holds_log(&nested)? {
        eprintln!(
            "note: {} is a service data directory; checking its log in {}",
            given.display(),
            nested.display()
        );
        return Ok(nested);
    }
    Err(Failure::NoLog {
        given: given.to_path_buf(),
    })
}

fn file_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn record_line(record: &DumpedRecord<'_>, with_payload: bool) -> serde_json::Value {
    let mut line = json!({
        "kind": "record",
        "seq": record.seq,
        "type": record.record_type.0,
        "size": record.payload.len(),
        "segment": file_name(record.segment),
        "offset": record.offset,
    });
    if with_payload {
        match std::str::from_utf8(record.payload) {
            Ok(text) => line["payload"] = json!(text),
            Err(_) => line["payload_hex"] = json!(hex(record.payload)),
        }
    }
    line
}

fn dump(given: &Path, with_payload: bool) -> Result<(), Failure> {
    let dir = &log_dir(given)?;
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    // Records are printed as the scan meets them; the snapshot line needs the scan's result, so
    // a cheap verify first finds it (and any corruption, reported after the records before it).
    let snapshot = inspect::verify(dir).ok().and_then(|s| s.snapshot);
    if let Some(snapshot) = snapshot {
        let line = json!({
            "kind": "snapshot",
            "seq": snapshot.seq,
            "size": snapshot.payload_bytes,
            "file": file_name(&snapshot.path),
        });
        let _ = writeln!(out, "{line}");
    }
    let mut broken_pipe = false;
    let summary = inspect::dump(dir, |record| {
        if !broken_pipe && writeln!(out, "{}", record_line(&record, with_payload)).is_err() {
            broken_pipe = true;
        }
    });
    let _ = out.flush();
    let summary = summary?;
    if let Some(torn) = &summary.torn_tail {
        eprintln!("{}", torn_line(torn));
    }
    Ok(())
}

fn torn_line(torn: &wal::TornTail) -> String {
    format!(
        "torn tail: {} at offset {}: {}; {} bytes would be truncated when the log is opened",
        torn.file.display(),
        torn.offset,
        torn.reason,
        torn.bytes
    )
}

fn verify(given: &Path, as_json: bool) -> Result<(), Failure> {
    let summary = inspect::verify(log_dir(given)?)?;
    if as_json {
        println!("{}", summary_json(&summary));
    } else {
        print!("{}", summary_text(&summary));
    }
    Ok(())
}

fn summary_text(summary: &Summary) -> String {
    // The records' bytes, not the files': a live segment's file runs on into the zeros filled
    // ahead of its appends (docs/wal-format.md), which are not log.
    let bytes: u64 = summary.segments.iter().map(|s| s.record_bytes).sum();
    let on_disk: u64 = summary.segments.iter().map(|s| s.bytes).sum();
    let beyond = if on_disk > bytes {
        format!(" ({on_disk} bytes on disk)")
    } else {
        String::new()
    };
    let range = match (summary.first_seq, summary.last_seq) {
        (Some(first), Some(last)) => format!(" (seq {first}..={last})"),
        _ => String::new(),
    };
    let mut text = format!(
        "ok: {}: {} records{range} in {} segments, {bytes} bytes{beyond}\n",
        summary.dir.display(),
        summary.records,
        summary.segments.len(),
    );
    match &summary.snapshot {
        Some(s) => text.push_str(&format!(
            "snapshot: {} covers seq 1..={} ({} bytes)\n",
            file_name(&s.path),
            s.seq,
            s.payload_bytes
        )),
        None => text.push_str("snapshot: none\n"),
    }
    if let Some(torn) = &summary.torn_tail {
        text.push_str(&torn_line(torn));
        text.push('\n');
    }
    for path in &summary.obsolete_files {
        text.push_str(&format!(
            "leftover of an interrupted checkpoint: {} would be deleted when the log is opened\n",
            file_name(path)
        ));
    }
    text
}

fn summary_json(summary: &Summary) -> serde_json::Value {
    json!({
        "status": if summary.torn_tail.is_some() { "torn_tail" } else { "ok" },
        "dir": summary.dir.display().to_string(),
        "records": summary.records,
        "first_seq": summary.first_seq,
        "last_seq": summary.last_seq,
        "segments": summary.segments.iter().map(|s| json!({
            "file": file_name(&s.path), "base_seq": s.base_seq, "records": s.records, "bytes": s.bytes,
            "record_bytes": s.record_bytes,
        })).collect::<Vec<_>>(),
        "snapshot": summary.snapshot.as_ref().map(|s| json!({
            "file": file_name(&s.path), "seq": s.seq, "size": s.payload_bytes,
        })),
        "torn_tail": summary.torn_tail.as_ref().map(|t| json!({
            "file": t.file.display().to_string(), "offset": t.offset, "bytes": t.bytes,
            "reason": t.reason, "would_truncate": true,
        })),
        "obsolete_files": summary.obsolete_files.iter().map(|p| file_name(p)).collect::<Vec<_>>(),
    })
}
