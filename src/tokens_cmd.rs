//! `twopc tokens --out DIR`: a fresh set of token files for a cluster (docs/security.md):
//! `peer.tokens`, `client.tokens` and `operator.tokens`, each readable by its owner only. The
//! compose cluster's init service runs it; `twopc demo` and the tests make the same set.
//!
//! It never prints a token and never overwrites a token file.

use std::path::PathBuf;
use std::process::ExitCode;

use cluster::auth::{CLIENT_FILE, OPERATOR_FILE, PEER_FILE, TokenSet};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The directory to write them into (created if absent).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// When DIR already holds a set, check it and keep it (exit 0) instead of refusing.
    #[arg(long)]
    pub keep_existing: bool,
}

pub fn main(args: Args) -> ExitCode {
    let exists = args.out.join(PEER_FILE).exists();
    let result = if exists && args.keep_existing {
        TokenSet::open(&args.out).map(|_| "kept the tokens already in")
    } else {
        TokenSet::generate(&args.out).map(|_| "wrote fresh tokens to")
    };
    match result {
        Ok(what) => {
            println!(
                "twopc tokens: {what} {}: {PEER_FILE} (--peer-token-file, every service), \
                 {CLIENT_FILE} (--client-token-file), {OPERATOR_FILE} (--operator-token-file; \
                 twopc ctl --token-file)",
                args.out.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("twopc tokens: {e}");
            ExitCode::from(1)
        }
    }
}
