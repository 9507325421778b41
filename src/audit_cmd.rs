//! `twopc audit --record FILE --target-...`: checks the invariants of a recorded load run
//! against a cluster again, for example after it restarted from its volumes.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use cluster::audit::{self, RunRecord};

use crate::target::TargetArgs;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The file `twopc demo --record` wrote.
    #[arg(long)]
    pub record: PathBuf,
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(flatten)]
    pub client: crate::client::ClientArgs,
    /// How long in-doubt transactions may take to resolve before liveness fails, in seconds.
    #[arg(long, default_value_t = 30)]
    pub settle_s: u64,
}

pub fn main(args: Args) -> ExitCode {
    crate::async_main::block_on("audit", async {
        Ok(crate::async_main::verdict("audit", run(args).await?))
    })
}

async fn run(args: Args) -> Result<bool> {
    let urls =
        args.target.urls(&args.client).await?.context(
            "--target-coordinator and the three --target-* participant URLs are required",
        )?;
    let bytes = std::fs::read(&args.record)
        .with_context(|| format!("cannot read {}", args.record.display()))?;
    let record: RunRecord = serde_json::from_slice(&bytes)
        .with_context(|| format!("{} is not a run record", args.record.display()))?;
    let client = crate::client::build(&args.client, Duration::from_secs(30))?;
    let report = audit::audit(
        &client,
        &urls,
        &record.config,
        record.before,
        &record.orders,
        Duration::from_secs(args.settle_s),
    )
    .await?;
    println!(
        "audit of {} recorded orders ({} applied everywhere, {} nowhere):",
        record.orders.len(),
        report.applied,
        report.absent
    );
    crate::demo::print_checks(&report);
    Ok(report.all_ok())
}
