//! `twopc wal dump|verify DIR`. (Being built: see issue 2.)

use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, clap::Subcommand)]
pub enum WalCommand {
    /// Print every record as a JSON line.
    Dump { dir: PathBuf },
    /// Check a log; exit non-zero on corruption.
    Verify { dir: PathBuf },
}

pub fn main(_command: WalCommand) -> ExitCode {
    eprintln!("not built yet");
    ExitCode::FAILURE
}
