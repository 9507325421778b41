//! `twopc wal dump|verify DIR`: how an operator (and the chaos tests) look at a log. Read-only:
//! neither command changes the directory; a torn tail is reported as "would be truncated".
//!
//! Exit codes: 0 the log would open (clean, or a torn tail that opening would cut), 1 the
//! directory cannot be read, 4 the log is corrupt (file, offset and reason on stderr).

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::json;
use wal::WalError;
use wal::inspect::{self, DumpedRecord, Summary};

const EXIT_IO: u8 = 1;
const EXIT_CORRUPT: u8 = 4;

#[derive(Debug, clap::Subcommand)]
pub enum WalCommand {
    /// Print every live record as a JSON line (seq, type, size, segment, offset), after a line for
    /// the snapshot if there is one.
    Dump {
        /// The log directory (a service keeps it in `<data-dir>/wal`).
        dir: PathBuf,
        /// Also print each payload: as a string if it is UTF-8, else as hex in `payload_hex`.
        #[arg(long)]
        payload: bool,
    },
    /// Check every record and the snapshot; exit 0 with a summary when the log would open,
    /// 4 naming file, offset and reason when it is corrupt.
    Verify {
        /// The log directory (a service keeps it in `<data-dir>/wal`).
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
        Err(error) => {
            eprintln!("error: {error}");
            match error {
                WalError::Corrupt { .. } => ExitCode::from(EXIT_CORRUPT),
                _ => ExitCode::from(EXIT_IO),
            }
        }
    }
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

fn dump(dir: &Path, with_payload: bool) -> Result<(), WalError> {
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

fn verify(dir: &Path, as_json: bool) -> Result<(), WalError> {
    let summary = inspect::verify(dir)?;
    if as_json {
        println!("{}", summary_json(&summary));
    } else {
        print!("{}", summary_text(&summary));
    }
    Ok(())
}

fn summary_text(summary: &Summary) -> String {
    let bytes: u64 = summary.segments.iter().map(|s| s.bytes).sum();
    let range = match (summary.first_seq, summary.last_seq) {
        (Some(first), Some(last)) => format!(" (seq {first}..={last})"),
        _ => String::new(),
    };
    let mut text = format!(
        "ok: {}: {} records{range} in {} segments, {bytes} bytes\n",
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
